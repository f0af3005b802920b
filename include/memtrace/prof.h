/* memtrace profiler: records the allocator's events without slowing it down.
 *
 * An mt_prof_t owns one event ring in POSIX shared memory (see docs/telemetry.md) and
 * hands the allocator an mt_event_sink_t that writes into it: lock-free, never
 * blocking, never allocating; when the ring is full the event is dropped and counted.
 * The ring is read by the memtraced daemon when one is reachable (the producer
 * registers over a Unix socket), otherwise (mode auto or log) by a background drainer
 * thread of the profiler that appends NDJSON to a local log file, so an instrumented
 * program works with no set-up at all. If the daemon goes away later (its connection
 * closes), the profiler takes over the ring and continues in the local log from the first
 * event the daemon had not read: the live mode turns from daemon to log, once.
 *
 * Thread-safety: the sink may be called from any number of threads at once; create,
 * destroy and flush are not concurrent with each other. */
#ifndef MEMTRACE_PROF_H
#define MEMTRACE_PROF_H

#include <stdbool.h>
#include "memtrace/alloc.h"
#include "memtrace/event.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_prof_s mt_prof_t;

typedef enum mt_prof_mode_e {
    MT_PROF_AUTO = 0,   /* the daemon if its socket answers, else the local log */
    MT_PROF_DAEMON = 1, /* the daemon or fail (MT_ENOENT from create) */
    MT_PROF_LOG = 2,    /* the local NDJSON log only */
    MT_PROF_OFF = 3,    /* the sink counts events and records nothing */
} mt_prof_mode_e;

/* The local log's form (docs/telemetry.md, "The binary log"). */
typedef enum mt_prof_log_format_e {
    MT_PROF_LOG_AUTO = 0,   /* by the path: a name ending in ".mtlog" is binary, else NDJSON */
    MT_PROF_LOG_NDJSON = 1, /* one JSON line per event (docs/telemetry.md) */
    MT_PROF_LOG_BINARY = 2, /* compact blocks, read by every reader, `memtrace convert` */
} mt_prof_log_format_e;

/* Where a process sits in a distributed job (docs/fleet.md "Ranks and jobs"): carried in its
 * hello to the daemon and in its local log's header. Invariant: each field is either unknown
 * (-1, "") or valid: 0 <= rank, 0 <= local_rank, 1 <= world_size, all <= MT_PROF_RANK_MAX;
 * id holds only [A-Za-z0-9._:@+-] (safe as a Prometheus label value and in a file name). */
#define MT_PROF_JOB_MAX  64       /* bytes of a job id, NUL included */
#define MT_PROF_RANK_MAX 16777215 /* the largest rank or world size taken */
typedef struct mt_prof_job_s {
    int rank;                 /* global rank; -1 = unknown */
    int local_rank;           /* rank on this host; -1 = unknown */
    int world_size;           /* ranks in the job; -1 = unknown */
    char id[MT_PROF_JOB_MAX]; /* job id; "" = unknown */
} mt_prof_job_t;

typedef struct mt_prof_cfg_s {
    int mode;             /* mt_prof_mode_e; MT_PROF_AUTO */
    uint32_t slots;       /* ring capacity in events, rounded up to a power of two; 65536 */
    const char *log_path; /* borrowed; NULL = ./memtrace-<pid>.ndjson (see log_format) */
    const char *socket;   /* borrowed; NULL = default_socket */
    const char *name;     /* borrowed; process name; NULL = /proc/self/comm */
    unsigned drain_ms;    /* local drainer period, ms; 20 (1 ms while the ring is busy) */
    /* optional override of user tags' names in the local log; called from the drainer
     * thread. NULL, or a NULL or "" answer: the label the allocator announced in the
     * stream (MT_EV_TAG_LABEL), else the built-in name or "tag<n>". */
    const char *(*tag_name)(void *ud, int tag);
    void *tag_ud;
    mt_log_cb log; /* optional; says which mode is live, and errors */
    void *log_ud;
    /* Call stacks of allocations (mt_stacks_e: off, sampled, all; docs/telemetry.md "Call
     * stacks"); MT_STACKS_SAMPLED. An allocator's "stacks" config key overrides it for
     * that allocator; mt_prof_set_stacks changes it at run time. */
    int stacks;
    /* This process's rank and job; all unknown by default, read from the launcher's
     * variables by mt_prof_cfg_from_env. */
    mt_prof_job_t job;
    /* Lossless recording (docs/telemetry.md "Lossless mode"): 0 (the default) drops an
     * event that finds the ring full, counted; > 0 makes the allocating thread wait for the
     * consumer instead, as long as the consumer reads, and at most this many ms while it
     * reads nothing (a consumer gone), after which that event is dropped and the process is
     * back in the default mode. mt_prof_cfg_from_env: MEMTRACE_PROF_LOSSLESS=1 (or on) sets
     * MT_PROF_LOSSLESS_STALL_MS, 0 (or off) clears it. */
    unsigned lossless_stall_ms;
    /* The daemon's socket when socket is NULL; "" (the default) =
     * /tmp/memtrace-<euid>/memtrace.sock. mt_prof_cfg_from_env: mt_prof_socket_path(). */
    char default_socket[108];
    /* Where the recorder writes OOM snapshots in local mode, and which directory an OOM
     * message names (docs/torch-snapshot.md); "" (the default) = none.
     * mt_prof_cfg_from_env: mt_prof_oom_dir(). */
    char oom_dir[256];
    /* The least ms between two of its OOM snapshots (the first OOM always gets one); 0 =
     * every OOM; MT_PROF_OOM_INTERVAL_MS. mt_prof_cfg_from_env: $MEMTRACE_OOM_INTERVAL_MS. */
    unsigned oom_interval_ms;
    /* The local log's form (mt_prof_log_format_e); MT_PROF_LOG_AUTO. The default path is
     * ./memtrace-<pid>.mtlog when binary. mt_prof_cfg_from_env: $MEMTRACE_LOG_FORMAT
     * ("ndjson", "binary"). */
    int log_format;
} mt_prof_cfg_t;
#define MT_PROF_LOSSLESS_STALL_MS 2000u

typedef struct mt_prof_stats_s {
    uint64_t emitted;       /* events offered to the sink */
    uint64_t dropped;       /* events dropped because the ring was full */
    uint64_t lost;          /* slots the consumer had to skip (producer died mid-write) */
    uint64_t delivered;     /* events read by the consumer so far (daemon or local drainer) */
    uint64_t written;       /* JSON lines written to the local log (local mode) */
    uint64_t oom_snapshots; /* OOM snapshots the recorder wrote (local mode) */
    uint64_t oom_snapshots_suppressed; /* OOMs it gave none: at most one per interval */
    int mode; /* the live mode: MT_PROF_DAEMON, MT_PROF_LOG or MT_PROF_OFF */
    /* lossless mode: times a producer found the ring full and waited, the ns it waited in
     * all, and waits that ended with a consumer reading nothing (the mode then ended) */
    uint64_t lossless_waits, lossless_wait_ns, lossless_stalls;
    bool lossless; /* lossless mode is on now */
} mt_prof_stats_t;

/* Defaults (no environment read: mt_prof_create reads none either). */
MT_API mt_prof_cfg_t mt_prof_cfg_default(void);
/* The profiler's environment, for a program that honours it (the tools and the drop-in
 * do; docs/process-state.md). Applies $MEMTRACE_PROF ("auto", "daemon", "log", "off") to
 * cfg->mode and $MEMTRACE_PROF_LOSSLESS to cfg->lossless_stall_ms if set; $MEMTRACE_LOG to
 * cfg->log_path if set (borrowed from the environment: create before changing it);
 * $MEMTRACE_LOG_FORMAT ("ndjson", "binary") to cfg->log_format;
 * mt_prof_socket_path() to cfg->default_socket; mt_prof_oom_dir() to cfg->oom_dir ("" when
 * it names none); $MEMTRACE_OOM_INTERVAL_MS to cfg->oom_interval_ms if set (a malformed one
 * is warned about to cfg->log and left); and the launcher's variables to cfg->job, each
 * field from the first of these that holds a valid value (docs/fleet.md "Ranks and jobs"):
 *   rank        MEMTRACE_RANK, RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID
 *   local_rank  MEMTRACE_LOCAL_RANK, LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID
 *   world_size  MEMTRACE_WORLD_SIZE, WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS
 *   id          MEMTRACE_JOB, TORCHELASTIC_RUN_ID (not "none"), SLURM_JOB_ID
 * A malformed value is skipped with a warning to cfg->log; a job id is cut to
 * MT_PROF_JOB_MAX - 1 bytes and its other characters become '_' (warned too).
 * MT_EINVAL for another MEMTRACE_PROF or MEMTRACE_PROF_LOSSLESS (that field unchanged; the
 * others are still read). */
MT_API int mt_prof_cfg_from_env(mt_prof_cfg_t *cfg);

/* Applies $MEMTRACE_STACKS ("off", "sampled", "all") to cfg->stacks if set. MT_EINVAL for
 * another value, with a message naming the variable in err (cfg unchanged). */
MT_API int mt_prof_stacks_from_env(mt_prof_cfg_t *cfg, char *err, size_t errlen);
/* Parses "off", "sampled" or "all" into *mode. MT_EINVAL otherwise. */
MT_API int mt_prof_stacks_parse(const char *s, int *mode);

/* Creates the ring and connects (see mode). *out is new. In MT_PROF_AUTO mode it never
 * fails for want of a daemon or a log: with neither, the live mode is MT_PROF_OFF (logged).
 * In MT_PROF_DAEMON mode, no daemon gives MT_ENOENT (or the daemon's refusal: MT_EPROTO). */
MT_API int mt_prof_create(mt_prof_t **out, const mt_prof_cfg_t *cfg);
/* Final drain (local mode), marks a clean exit in the ring header, closes the
 * connection to the daemon, frees *p. Sets *p = NULL. */
MT_API void mt_prof_destroy(mt_prof_t **p);

/* The sink to put in mt_alloc_cfg_t.sink. Borrowed; valid until destroy. */
MT_API const mt_event_sink_t *mt_prof_sink(mt_prof_t *p);
/* Records one event directly (what the sink does). Returns 0 or MT_EAGAIN (dropped). */
MT_API int mt_prof_record(mt_prof_t *p, const mt_event_rec_t *ev);
/* Local mode: drains the ring into the log now, flushes the file and waits for the OOM
 * snapshot being written, if any. Daemon mode: asks the daemon to drain now. */
MT_API int mt_prof_flush(mt_prof_t *p);
MT_API void mt_prof_stats(mt_prof_t *p, mt_prof_stats_t *out);
/* The local log path (borrowed), or NULL when not in local mode (yet: see the takeover
 * above). */
MT_API const char *mt_prof_log_path(const mt_prof_t *p);
/* Call stacks: the mode now (mt_stacks_e), and switching it (MT_STACKS_OFF, _SAMPLED or
 * _ALL; MT_EINVAL otherwise, MT_ENOTSUP when the table could not be made at create). */
MT_API int mt_prof_stacks(mt_prof_t *p);
MT_API int mt_prof_set_stacks(mt_prof_t *p, int mode);

typedef struct mt_prof_stack_stats_s {
    uint64_t captures;    /* stacks captured (sampled in) */
    uint64_t overflow;    /* captured after the table was full: counted, not stored */
    uint32_t stacks;      /* distinct stacks stored, <= MT_STACK_ID_MAX */
    uint32_t modules;     /* modules in the module map */
    uint64_t frames;      /* frames stored */
    uint64_t table_bytes; /* memory the table uses now (shared area + private index) */
    uint64_t bound_bytes; /* the most it can use */
} mt_prof_stack_stats_t;
MT_API void mt_prof_stack_stats(mt_prof_t *p, mt_prof_stack_stats_t *out);

/* The live mode name: "daemon", "log" or "off". Static. */
MT_API const char *mt_prof_mode_name(int mode);

/* The resolvers of the environment's defaults, shared by mt_prof_cfg_from_env, the daemon
 * and the CLI (each reads the environment).
 * The daemon's socket path: $MEMTRACE_SOCKET, else $XDG_RUNTIME_DIR/memtrace.sock, else
 * /tmp/memtrace-<uid>.sock. Writes it into buf. MT_EOVERFLOW if it does not fit
 * (a Unix socket path is at most 107 bytes). */
MT_API int mt_prof_socket_path(char *buf, size_t len);
/* Where OOM snapshots go (docs/torch-snapshot.md): $MEMTRACE_OOM_DIR ("off": none), else
 * $XDG_STATE_HOME/memtrace/oom, else $HOME/.local/state/memtrace/oom. The daemon writes
 * oom-<pid>-dev<d>-<n>.{json,pickle} there and the allocator's OOM message names it.
 * MT_ENOENT when none can be named (or "off"), MT_EINVAL when it does not fit. */
MT_API int mt_prof_oom_dir(char *buf, size_t len);
/* The least time between two OOM snapshots of one process, in ms (docs/torch-snapshot.md):
 * $MEMTRACE_OOM_INTERVAL_MS (decimal; 0 = a snapshot at every OOM), else
 * MT_PROF_OOM_INTERVAL_MS. The first OOM always gets one. MT_EINVAL for a malformed value
 * (*ms is then the default). */
#define MT_PROF_OOM_INTERVAL_MS 10000u
MT_API int mt_prof_oom_interval_ms(unsigned *ms);

/* ---- JSON encoding (schema: docs/telemetry.schema.json, "v": 1) ---- */

/* Writes one event as its JSON line, '\n' included, then a NUL, into buf:
 * {"v":1,"type":"event","seq":..,"kind":"alloc",...} or, for MT_EV_GAP,
 * {"v":1,"type":"gap","lost":N,...}. The one encoder of event lines: the daemon and the
 * local log both write events with it. tag_name may be NULL (built-in names, "tag<n>").
 * A label announcement (MT_EV_TAG_LABEL) is written as
 * {"v":1,"type":"event",...,"kind":"tag_label","tag_id":N,"label":"..."}, the label taken
 * from the event (tag_name is not asked).
 * Byte counts above INT64_MAX (never real) are written as INT64_MAX, what the decoder
 * can read back; invalid UTF-8 in a tag name is written as U+FFFD.
 * Returns the line's length (without the NUL; < cap) when it fits, else a capacity that
 * is enough (>= cap; buf is left unspecified): call again with that much room. A
 * capacity of 1 KiB is enough for every line whose tag name is shorter than 64 bytes.
 * Allocates nothing; thread-safe (tag_name permitting). */
MT_API size_t mt_prof_event_write(char *buf, size_t cap, const mt_event_rec_t *ev, int pid,
                                  const char *(*tag_name)(void *ud, int tag), void *ud);

/* The same, for an alloc with a call stack: its line carries "stack": stack (0: none). An
 * MT_EV_STACK_REF record is written as {"v":1,"type":"event",...,"kind":"stack_ref",
 * "addr":..,"pool":..,"stack":N} (by either function). */
MT_API size_t mt_prof_alloc_write(char *buf, size_t cap, const mt_event_rec_t *ev, int pid,
                                  uint32_t stack, const char *(*tag_name)(void *ud, int tag),
                                  void *ud);

/* Decodes an event or gap line parsed by jansson (json: a json_t *; the inverse of
 * mt_prof_event_write; the tag by "tag_id"). A gap without "pid" (a consumer queue's)
 * gives *pid = -1. MT_EPROTO naming the bad field in err. pid may be NULL. */
MT_API int mt_prof_event_from_json(const void *json, mt_event_rec_t *ev, int *pid, char *err,
                                   size_t errlen);

/* These return a new jansson json_t * (declared as void * so this header does not
 * require jansson.h; cast to json_t *), or NULL on allocation failure. */

/* Process state from allocator statistics: {"v":1,"type":"process","pid":..,...}. */
MT_API void *mt_prof_stats_to_json(const mt_alloc_stats_t *st, int pid, int device,
                                   const char *(*tag_name)(void *ud, int tag), void *ud);
/* Snapshot: {"v":1,"type":"snapshot","pid":..,"segments":[...],"stats":{...}}. */
MT_API void *mt_prof_snapshot_to_json(const mt_alloc_snapshot_t *snap, int pid, int device,
                                      const char *(*tag_name)(void *ud, int tag), void *ud);
/* The job with every field unknown. */
MT_API mt_prof_job_t mt_prof_job_unknown(void);
/* Copies src into dst (cap bytes, NUL included; cap >= 1) as a job id: cut to fit, each
 * byte outside [A-Za-z0-9._:@+-] replaced by '_'. Returns how many bytes were changed or
 * cut (0: copied as is). */
MT_API size_t mt_prof_job_id_sanitize(char *dst, size_t cap, const char *src);
/* Adds the known fields of job to a JSON object (a json_t *): "rank", "local_rank",
 * "world_size" (integers), "job" (string). Unknown ones are left out. 0 or MT_ENOMEM. */
MT_API int mt_prof_job_to_json(void *obj, const mt_prof_job_t *job);
/* Reads those fields from a hello (a json_t *) into *job; a missing or invalid one is
 * unknown, a job id is sanitized as above. Returns whether any field is known. */
MT_API bool mt_prof_job_from_json(const void *obj, mt_prof_job_t *job);

/* {"v":1,"type":"hello",...} header line written first in a local log. */
MT_API void *mt_prof_hello_to_json(int pid, const char *name, uint64_t start_realtime_ns,
                                   uint64_t start_mono_ns);

#ifdef __cplusplus
}
#endif
#endif
