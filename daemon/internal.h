/* memtraced internals shared by the daemon's files (never installed).
 *
 * Objects and who owns them:
 * - mt_d_t owns the loop (or borrows it), the listeners, the timers, every connection
 *   (d->conns) and every known process (d->procs).
 * - A connection (mt_d_conn_t) is a producer, a Unix consumer, or an HTTP client (one-shot
 *   response or SSE consumer). Its memory is freed only in its close callback.
 * - A process (mt_d_proc_t) outlives its producer connection: it is kept, marked exited,
 *   until more than cfg.max_exited processes have exited and it is the oldest of them.
 *
 * Data path per drain tick: rings -> state model and a batch of records -> the encoder
 * thread (lines.c): JSON lines, log file -> one chunk per consumer holding the lines that
 * pass its filters. */
#ifndef MT_DAEMON_INTERNAL_H
#define MT_DAEMON_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include <jansson.h>

#include "analysis/model.h"
#include "analysis/symbolize.h"
#include "daemon/daemon.h"
#include "memtrace/alloc.h"
#include "memtrace/event.h"
#include "memtrace/prof.h"
#include "profiler/ring.h"
#include "profiler/stack.h"
#include "util/fileahead.h"

#define MT_D_MAX_PIDS       16   /* pids in one subscription filter */
#define MT_D_MAX_TAG_LABELS 8    /* user tag labels in one subscription filter */
#define MT_D_BATCH          1024 /* events per batch (one consumer chunk per batch) */
#define MT_D_LINES_DEPTH    4    /* batches: the one being filled, the rest the encoder's */
/* records a batch holds: a batch's events plus the table lines (stacks.c) of its last one */
#define MT_D_BATCH_CAP         (MT_D_BATCH + MT__STAB_MODULES + 2)
#define MT_D_PRODUCER_LINE_MAX 4096  /* bytes of a line a registered producer may send */
#define MT_D_CALLSITES_TOP     5     /* call sites per process in /state */
#define MT_D_READ_BUF_SIZE     65536 /* bytes of d->readbuf, every connection's reads */

/* ---- growable text buffer ---- */

/* A writer of many pieces appends them all and reads err once, at the end: the first
 * failure is kept as it was (never merged with a later one), and every append after it
 * does nothing and returns it. */
typedef struct mt_d_buf_s {
    char *p;    /* malloc'ed, NUL-terminated when len > 0 */
    size_t len; /* bytes used, len < cap */
    size_t cap; /* bytes allocated */
    int err;    /* 0, or the first failure (negative MT_E*): sticky until clear or free */
} mt_d_buf_t;

/* Each returns b->err after the call: 0, or the first failure. */
int mt__d_buf_reserve(mt_d_buf_t *b, size_t extra);
int mt__d_buf_append(mt_d_buf_t *b, const void *s, size_t n);
int mt__d_buf_printf(mt_d_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records rc (negative) as b's failure unless one is recorded already; returns b->err. For
 * a writer whose own step (not an append) failed, so its output is known incomplete. */
int mt__d_buf_fail(mt_d_buf_t *b, int rc);
/* Empties b for reuse, failure included; keeps its memory. */
void mt__d_buf_clear(mt_d_buf_t *b);
void mt__d_buf_free(mt_d_buf_t *b);

/* ---- per-process state model (state.c) ---- */

typedef struct mt_d_proc_s {
    struct mt_d_proc_s *next; /* d->procs, in registration order */
    int pid;                  /* its hello's, which is its connection's SO_PEERCRED pid */
    uint32_t uid;             /* its connection's SO_PEERCRED uid (the ring caps' key) */
    char name[MT_RING_COMM_MAX];
    char backend[32];             /* from the hello, "" if not given */
    mt_prof_job_t job;            /* rank and job from the hello; unknown if not given */
    uint64_t registered_realtime; /* ns since the epoch */
    /* Its own clocks' realtime - monotonic, when clock_known (a recorded log's hello says
     * both at its start): its times shown from it, not from this machine's clock. */
    int64_t clock_off_ns;
    bool clock_known;
    /* A recording with no clock (a snapshot whose trace has no times): its events stand
     * event_ns apart, from event_ns on, on the page's time axis, and its times count events.
     * 0: a clock. */
    uint64_t event_ns;
    uint64_t exited_realtime; /* ns since the epoch, 0 while live */
    bool exited;
    const char *exit_reason; /* static: "clean", "oom", "killed", "corrupt" */
    /* static: a PyTorch snapshot `memtrace view` loaded, "trace" (its history) or "state"
     * (segments only, no history: its records lay its blocks out in address order); or NULL */
    const char *snapshot;
    size_t snap_skipped;  /* its trace entries of actions not modelled ("skipped_entries") */
    uint64_t snap_before; /* seq + 1 of its last record made up from before its trace, or 0 */
    bool corrupt;         /* its ring broke the layout's invariants: no longer read */
    mt__ring_t *ring;     /* owned while live */
    struct mt_d_conn_s *conn;
    /* counters */
    uint64_t events;                       /* records drained */
    uint64_t dropped;                      /* events lost before reaching us (gap records) */
    uint64_t kind_count[MT_EV_KIND_COUNT]; /* by mt_event_kind_e */
    uint64_t ooms;
    uint64_t last_oom_requested, last_oom_free;
    uint8_t last_kind;
    /* OOM snapshots (snapshot.c): one per d->oom_interval_ms at most */
    bool oom_snapped;     /* one was queued */
    uint64_t oom_snap_ms; /* when, uv_now */
    uint64_t oom_since;   /* OOMs that got none since then */
    mt_model_t *model;    /* owned: totals, blocks, tags, segments of both memory classes */
    mt_sym_t *sym;        /* owned: names the frames of its call stacks (/state, /block) */
    /* User tags' labels, as the process announced them (MT_EV_TAG_LABEL); "" = none.
     * Kept for the process's lifetime, so a consumer that comes after the announcement
     * still gets the names. names[t] is what /state, /metrics and tail call tag t: its
     * label when that is unique in the process and cannot be mistaken for another tag
     * (not a built-in name, not "tag<n>"), else "" (the default name). At most
     * MT_TAG_MAX names per process: the metrics' tag label stays bounded. */
    char labels[MT_TAG_MAX][MT_EVENT_LABEL_MAX + 1];
    char names[MT_TAG_MAX][MT_EVENT_LABEL_MAX + 1];
    /* call stacks (stacks.c): the producer's table (its ring's area; base NULL = none or
     * gone with the ring), what the daemon has read of it into the model and its stream,
     * and a stack ref waiting for its alloc */
    mt__stab_view_t stab;
    mt__stab_seen_t stab_seen;
    uint32_t pending_stack;
    uint64_t pending_addr;
    /* its ring's drained position at the end of the tick whose last batch is k (in the
     * slot of k), acknowledged when that batch is back (ack_at = k + 1; 0 = none) */
    uint64_t ack_pos[MT_D_LINES_DEPTH];
    uint64_t ack_at[MT_D_LINES_DEPTH];
    /* A PyTorch snapshot loaded by `memtrace view` (NULL otherwise), kept for its stacks'
     * frames (its blocks' stack ids are the snapshot's), and its live bytes by site. */
    struct mt_ts_s *snap;
    struct mt_ts_timeline_s *sites;
    /* Named scopes (analysis/scopes.h) fed as the report feeds them: NULL until the first
     * named mark (no scope is open before it). first_ns is the earliest event time applied
     * (valid once events > 0 or any_time), the report's t0 of settings changes. */
    struct mt_scopes_s *scopes;
    uint64_t first_ns;
    bool any_time;
} mt_d_proc_t;

int mt__d_proc_create(mt_d_proc_t **out, int pid, const char *name);
void mt__d_proc_destroy(mt_d_proc_t **p);
/* Applies one record to the counters and the model. Returns MT_ENOMEM only if the model's
 * tables cannot grow (the counters and totals are updated anyway). */
int mt__d_proc_apply(mt_d_proc_t *p, const mt_event_rec_t *ev);
/* Device memory: allocated / reserved, clamped to [0, 1]. */
double mt__d_proc_utilization(const mt_d_proc_t *p);
/* JSON object of one process (counters, per-tag breakdown, segment map). *new*. */
json_t *mt__d_proc_json(const mt_d_proc_t *p, bool with_segments);
/* The name of tag in p's figures (p may be NULL): its label (see names), the built-in
 * name, or "tag<n>" written into buf. Borrowed. */
const char *mt__d_tag_name(const mt_d_proc_t *p, int tag, char *buf, size_t n);
/* p's label of tag, or NULL: the tag_name callback of the line writer (ud = p). */
const char *mt__d_proc_label(void *p, int tag);

/* ---- connections ---- */

typedef enum mt_d_conn_kind_e {
    MT_D_CONN_UNIX_NEW = 0, /* Unix socket, no request line yet */
    MT_D_CONN_PRODUCER = 1,
    MT_D_CONN_CONSUMER = 2, /* Unix JSON Lines subscriber */
    MT_D_CONN_HTTP_NEW = 3, /* TCP, request head incomplete */
    MT_D_CONN_SSE = 4,      /* GET /events */
    MT_D_CONN_DONE = 5,     /* answered; closes once the reply is written */
} mt_d_conn_kind_e;

#define MT_D_LINGER_MS 2000 /* at most this long after an answer with close, see lingering */

/* A piece of a consumer's output. Chunks are queued (droppable) then written (owned by
 * libuv until the write callback, where they are freed). */
typedef struct mt_d_chunk_s {
    struct mt_d_chunk_s *next;
    uv_write_t req;
    struct mt_d_conn_s *conn;
    size_t len;       /* bytes in data */
    uint32_t nevents; /* events in data (what dropping it loses) */
    char data[];
} mt_d_chunk_t;

/* A subscription: filters and a bounded queue.
 * Invariants: queued_bytes = sum of len over the queue; queued_bytes <= queue_limit <=
 * cfg.consumer_queue_bytes after every enqueue; sum of (queue_limit + write_high_water) over
 * admitted consumers = d->consumer_reserved <= cfg.consumer_budget_bytes; lost counts events
 * dropped since the last gap event was queued for writing. */
typedef struct mt_d_sub_s {
    int pids[MT_D_MAX_PIDS]; /* npids = 0: every process */
    unsigned npids;
    uint32_t kinds; /* bit k = kind k; 0 = all */
    uint32_t tags;  /* bit t = tag t; 0 (and no tag_labels) = all */
    /* tags given by a user label: matched through each process's labels */
    char tag_labels[MT_D_MAX_TAG_LABELS][MT_EVENT_LABEL_MAX + 1];
    unsigned ntag_labels;
    bool sse;    /* SSE framing ("id:", "data:", blank line) instead of JSON Lines */
    bool binary; /* binary blocks (profiler/binlog.h) instead of JSON Lines */
    mt_d_chunk_t *head, *tail;
    size_t queued_bytes;
    size_t queue_limit;  /* bytes; its share of cfg.consumer_budget_bytes, 0 = not admitted */
    uint64_t lost;       /* pending gap */
    uint64_t lost_total; /* for the consumer's own counters */
    uint64_t sent_events;
} mt_d_sub_t;

typedef struct mt_d_conn_s {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_pipe_t pipe;
        uv_tcp_t tcp;
    } u;
    struct mt_d_s *d;
    struct mt_d_conn_s *prev, *next; /* d->conns */
    mt_d_conn_kind_e kind;
    bool closing;
    bool is_tcp;
    /* Answered and shut for writing; its input is read and discarded until the peer
     * hangs up or MT_D_LINGER_MS pass. Closing at once with input unread would make the
     * kernel reset the peer (ECONNRESET), which can lose the answer it has not read. */
    bool lingering;
    uv_shutdown_t shut;      /* lingering */
    uint64_t linger_ms;      /* uv_now when it began lingering */
    uint64_t last_active_ms; /* uv_now when it last sent something */
    uint64_t accepted_ms;    /* uv_now at accept: the HTTP head deadline counts from here */
    char peer_addr[48];      /* TCP peers: the address, "" if unknown */
    /* The peer's user: SO_PEERCRED (Unix, always known), or for TCP the uid of the peer's
     * socket in the kernel's table (peer.c; unknown for a peer on another host or one
     * that closed its end). The HTTP caps are keyed on it, else on peer_addr. */
    bool peer_uid_known;
    uint32_t peer_uid;
    int peer_pid;      /* Unix peers: SO_PEERCRED at accept */
    size_t line_len;   /* producers: bytes of the current line so far */
    mt_d_buf_t in;     /* partial request, bounded by the line/head limits */
    mt_d_proc_t *proc; /* producers */
    mt_d_sub_t sub;    /* consumers (Unix and SSE) */
    /* Not NULL: a request answered without a socket (mt__d_http_get); what is written
     * goes here, and a close only marks the connection closing. */
    mt_d_buf_t *capture;
} mt_d_conn_t;

/* ---- snapshots, OOM snapshots (snapshot.c) ---- */

/* A snapshot's trace: at most the newest MT_D_SNAPSHOT_EVENTS events of the process's one
 * recent-event buffer, the web tracker's window (web.h), gaps and stats left out. */
#define MT_D_SNAPSHOT_EVENTS 16384
/* OOM snapshots queued or being written at once, all processes together; an OOM that finds
 * the queue full gets none (counted). Each holds a copy of a process's window and map. */
#define MT_D_OOM_JOBS 8
typedef struct mt_d_oom_job_s mt_d_oom_job_t;

/* ---- the daemon ---- */

#define MT_D_WARN_INTERVAL_MS 10000 /* at most one line per this of each repeated warning */

/* A repeated warning's state (mt__d_warn). Invariant: suppressed > 0 => logged. */
typedef struct mt_d_warn_s {
    const char *what;    /* static: what is counted, for the count's line ("HTTP
                            connections refused") */
    bool logged;         /* a line was logged (last_ms is valid) */
    uint64_t last_ms;    /* uv_now of the last line */
    uint64_t suppressed; /* warnings since then, not logged */
} mt_d_warn_t;

typedef struct mt_d_batch_rec_s {
    mt_event_rec_t ev;              /* kind 0: a table line (stacks.c), its text in pre */
    const struct mt_d_proc_s *proc; /* its producer (batches are sent before one goes) */
    int pid;
    uint32_t stack;    /* the stack id its line carries (0: none) */
    uint32_t off, len; /* its line: in the batch's pre until encoded, then in its text,
                          '\n' included; len 0: none (out of memory) */
} mt_d_batch_rec_t;

/* A consumer's part of a batch: the chunk of its lines, built by the encoder. */
typedef struct mt_d_batch_out_s {
    struct mt_d_conn_s *conn;
    mt_d_chunk_t *ch; /* NULL: no line for it, or out of memory (n > 0) */
    uint32_t n;       /* its lines in the batch */
} mt_d_batch_out_t;

/* A batch of drained records and their lines (lines.c). The loop fills it (rec, n, pre)
 * and names its consumers (outs); the encoder then writes text (every line in order), the
 * log and each consumer's chunk. */
typedef struct mt_d_batch_s {
    mt_d_batch_rec_t *rec; /* MT_D_BATCH_CAP */
    size_t n;
    mt_d_buf_t pre;  /* table lines, as read from the producers */
    mt_d_buf_t text; /* the lines, written by the encoder */
    FILE *logf;      /* where the encoder writes them too, or NULL */
    bool bin;        /* ... as binary blocks (profiler/binlog.h), made into binbuf */
    mt_d_buf_t binbuf;
    bool enc_stale;    /* names may have changed: the encoder prepares its pieces again */
    bool write_failed; /* the encoder's write to logf failed */
    /* outs_ok: the consumers' chunks are built by the encoder, else by the loop from text */
    mt_d_batch_out_t *outs;
    size_t nouts, outs_cap;
    bool outs_ok;
    /* ack: the last batch of a drain tick whose rings are acknowledged when it comes back
     * (mt__d_procs_ack); the encoder flushes the log after writing it */
    bool ack;
} mt_d_batch_t;

/* The encoder (lines.c): a queue of batches, in order. Batch k (k counted from 0) is
 * b[k % MT_D_LINES_DEPTH]; the loop fills batch handed, hands it off (handed + 1), and
 * takes batches back in order (taken) once the encoder has done them (encoded).
 * Invariants: taken <= encoded <= handed <= taken + MT_D_LINES_DEPTH - 1; fill is
 * b[handed % MT_D_LINES_DEPTH]; the batches from encoded to handed are the encoder's,
 * the others the loop's. A batch handed off is taken back before the loop reads or
 * writes the log file, changes a process's names, lets a process go or frees a
 * connection, so the encoder reads the processes (pid, names) and consumers of its batch
 * while they stay as they were at the records. */
typedef struct mt_d_lines_s {
    mt_d_batch_t b[MT_D_LINES_DEPTH];
    mt_d_batch_t *fill;
    uint64_t handed; /* written by the loop under mu */
    uint64_t taken;  /* the loop's */
    bool stale;      /* a name changed or a process went since the last hand-off */
    bool inited;
    bool on; /* the thread runs; else the loop encodes at each hand-off */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t encoded;        /* under mu */
    bool quit;               /* under mu */
    _Atomic uint64_t cpu_ns; /* the encoder's CPU time after its last batch */
    /* the encoder's own */
    struct mt__prof_enc_s *enc; /* NULL (out of memory): the general writer */
    const struct mt_d_proc_s *enc_proc;
    mt__fa_t fa; /* the log's blocks reserved ahead of its writes */
} mt_d_lines_t;

#define MT_D_BIN_BLOCK_BYTES (1u << 20) /* payload after which a binary block ends */
int mt__d_lines_init(struct mt_d_s *d);
/* b's records (those sel passes; sel NULL: all) as binary blocks appended to o, a block
 * per run of one process's records; *nlines: the records (lines) encoded. Table lines are
 * read from b->pre, so before the encoder writes b->text. 0 or MT_ENOMEM. */
int mt__d_encode_bin(const mt_d_batch_t *b, mt_d_buf_t *o, const mt_d_sub_t *sel, uint32_t *nlines);
/* Hands the batch being filled to the encoder, after taking back the batches it has done
 * (waiting for the oldest when no batch is free to fill next). */
void mt__d_lines_handoff(struct mt_d_s *d);
/* The end of a drain tick that another follows at once: the batch being filled handed off
 * with every live ring's drained position, which are acknowledged when it comes back
 * (mt__d_procs_ack) rather than now, so that the encoder goes on while the loop polls.
 * False (nothing done) when that batch is empty: the caller syncs and acknowledges. */
bool mt__d_lines_handoff_acked(struct mt_d_s *d);
/* Hands off the batch being filled and takes it back: every line drained so far is
 * written (the log not flushed) and queued for the consumers. */
void mt__d_lines_sync(struct mt_d_s *d);
/* Joins the encoder (after a sync) and frees the batches. */
void mt__d_lines_close(struct mt_d_s *d);
/* The encoder thread's CPU time so far (0 without the thread). */
uint64_t mt__d_lines_cpu_ns(const struct mt_d_s *d);

struct mt_d_s {
    mt_d_cfg_t cfg;
    char *socket_path; /* owned copy */
    char *host;        /* owned copy */
    char *log_path;    /* owned copy */
    uv_loop_t own_loop;
    uv_loop_t *loop; /* &own_loop or cfg.loop */
    bool owns_loop;
    bool stopping;
    bool socket_bound; /* the socket file is ours: removed at stop */
    uv_pipe_t unix_listener;
    uv_tcp_t http_listener;
    bool http_on;
    int http_port;
    uv_timer_t drain_timer;
    uv_idle_t drain_idle; /* active while the last tick ran out of budget */
    uv_timer_t sweep_timer;
    uv_async_t stop_async;
    uv_signal_t sigint, sigterm;
    mt_d_conn_t *conns;
    mt_d_proc_t *procs;
    unsigned nconsumers;      /* admitted consumers */
    size_t consumer_reserved; /* sum of admitted consumers' queue_limit + write_high_water */
    unsigned fd_limit;        /* RLIMIT_NOFILE at create */
    char token[40];           /* HTTP token, "" when http_auth is off */
    FILE *logf;
    bool log_bin; /* the log is the binary log (its name ends in ".mtlog") */
    bool log_dirty;
    bool recorded; /* serves recorded files (`memtrace view`), not live producers */
    char *diff;    /* owned: /diff's JSON document (`memtrace view BEFORE AFTER`), or NULL */
    char *jobs;    /* owned: /jobs's JSON document (`memtrace view` of ranks' logs), or NULL */
    mt_d_counters_t ctr;
    unsigned open_handles; /* initialised and not yet through their close callback */
    char *readbuf;         /* one read buffer for every connection: reads are handled at once */
    uint64_t last_keepalive_ms;
    uint64_t start_realtime;
    /* the batch being processed (lines.c) */
    mt_d_lines_t lines;
    mt_d_proc_t *batch_proc;
    /* a log file or a consumer reads the lines of this drain: else none is written */
    bool batch_lines;
    mt_d_buf_t scratch;
    mt_d_warn_t warn_http;       /* HTTP connections refused (connections.c) */
    mt_d_warn_t warn_unix;       /* Unix connections of other users refused */
    mt_d_warn_t warn_rings;      /* registrations refused by the ring caps (producers.c) */
    char oom_dir[512];           /* where OOM snapshots go; "" = off */
    unsigned oom_interval_ms;    /* least time between two OOM snapshots of a process; 0 = none */
    mt_d_oom_job_t *oom_queue;   /* OOM snapshots waiting for the writer, oldest first */
    mt_d_oom_job_t *oom_running; /* the one given to the writer, or NULL */
    unsigned oom_jobs;           /* queued + running, <= MT_D_OOM_JOBS; the loop runs until 0 */
    /* The OOM snapshot writer: a thread of the daemon's own, started at the first snapshot
     * and joined by mt__d_destroy (libuv's pool would leave threads nobody joins).
     * Invariants: oom_handoff != NULL or oom_finished => oom_running != NULL (the writer
     * has it, or its result waits for oom_async); oom_async is open iff oom_writer_on and
     * not (stopping and oom_jobs == 0). oom_handoff, oom_finished, oom_quit: under oom_mu. */
    pthread_t oom_writer;
    bool oom_writer_on;
    pthread_mutex_t oom_mu;
    pthread_cond_t oom_cv;
    mt_d_oom_job_t *oom_handoff; /* the job the writer takes next, or NULL */
    bool oom_finished;           /* the writer finished oom_running */
    bool oom_quit;               /* mt__d_destroy: the writer returns */
    uv_async_t oom_async;        /* the writer's "finished" to the loop */
    bool oom_async_open;
    struct mt_d_web_s *web; /* the web page's history and event windows (web.h), lazily */
};

void mt__d_log(mt_d_t *d, mt_log_level_e level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A warning that a client can make repeat at will (refused connections and
 * registrations): the first is logged, then at most one per MT_D_WARN_INTERVAL_MS; the
 * others are counted and told in one line when the interval is over (mt__d_warn_flush,
 * from the sweep timer, and at shutdown). */
void mt__d_warn(mt_d_t *d, mt_d_warn_t *w, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Tells w's count of warnings not logged, once the interval is over (or now, if force). */
void mt__d_warn_flush(mt_d_t *d, mt_d_warn_t *w, bool force);

/* server.c */
void mt__d_on_drain_timer(uv_timer_t *t);
void mt__d_on_drain_idle(uv_idle_t *h);

/* connections.c */
/* The listeners' callback: accepts, admits or refuses, starts reading. */
void mt__d_on_connection(uv_stream_t *server, int status);
void mt__d_conn_close(mt_d_conn_t *c);
/* Writes a copy of data; closes the connection after it if close_after. */
int mt__d_conn_write(mt_d_conn_t *c, const char *data, size_t len, bool close_after);
bool mt__d_peer_allowed(mt_d_conn_t *c);

/* peer.c: the uid of the socket at the other end of a TCP connection whose ends are self
 * (ours) and peer, from the kernel's socket table. MT_ENOENT when no process of this host
 * holds that socket (a remote peer, or one that closed it); another negative code when
 * the table cannot be asked. */
int mt__d_tcp_peer_uid(const struct sockaddr *self, const struct sockaddr *peer, uint32_t *uid);

/* producers.c */
int mt__d_producer_hello(mt_d_conn_t *c, json_t *msg, char *err, size_t errlen);
void mt__d_producer_eof(mt_d_conn_t *c);
void mt__d_producer_input(mt_d_conn_t *c, const char *data, size_t n);
void mt__d_drain_all(mt_d_t *d);
/* Batch k, the last of a tick, is back (its lines written and the log flushed): the
 * rings' positions recorded with it are acknowledged. */
void mt__d_procs_ack(mt_d_t *d, uint64_t k);
void mt__d_procs_free(mt_d_t *d);
unsigned mt__d_live_count(const mt_d_t *d);

/* stacks.c */
void mt__d_stacks_attach(mt_d_proc_t *p);
void mt__d_stacks_detach(mt_d_proc_t *p);
void mt__d_stacks_free(mt_d_proc_t *p);
/* Before ev's line: for a stack ref, the table lines it needs go into the batch (and the
 * model). Returns the stack id an alloc line carries (0: none). */
uint32_t mt__d_stacks_record(mt_d_t *d, mt_d_proc_t *p, const mt_event_rec_t *ev);
/* p's module and stack lines (SSE-framed when sse), appended to out. 0 or MT_ENOMEM. */
int mt__d_stacks_tables(const mt_d_proc_t *p, bool sse, mt_d_buf_t *out);

/* consumers.c */
int mt__d_sub_parse_json(mt_d_sub_t *s, json_t *msg, char *err, size_t errlen);
int mt__d_sub_parse_query(mt_d_sub_t *s, const char *query, char *err, size_t errlen);
/* Admits a new consumer under cfg.max_consumers and cfg.consumer_budget_bytes: sets its
 * queue_limit. MT_EBUSY when there is no room (the caller refuses it). */
int mt__d_consumer_admit(mt_d_conn_t *c);
/* Gives back an admitted consumer's share (its close). */
void mt__d_consumer_release(mt_d_conn_t *c);
void mt__d_consumer_start(mt_d_conn_t *c);
void mt__d_consumers_fanout(mt_d_t *d, const mt_d_batch_t *b);
/* A batch's consumers, at its hand-off (b->outs): 0, or MT_ENOMEM (then none are named, and
 * the loop fans the batch out itself when it comes back). */
int mt__d_consumers_prepare(mt_d_t *d, mt_d_batch_t *b);
/* The encoder's part: each named consumer's chunk of b's lines (reads the consumers'
 * filters and the processes' labels, which stay as they are while b is handed off). The
 * binary consumers' first, while table lines are still in b->pre (b->binbuf made when
 * shared); the others' once b->text is written. */
void mt__d_consumers_build_binary(mt_d_batch_t *b);
void mt__d_consumers_build(mt_d_batch_t *b);
/* Whether record r passes s's filters. */
bool mt__d_sub_matches(const mt_d_sub_t *s, const mt_d_batch_rec_t *r);
/* Whether s takes every record (no filter). */
bool mt__d_sub_all(const mt_d_sub_t *s);
/* The loop's, when b comes back: the chunks queued (those of consumers closed meanwhile
 * freed). */
void mt__d_consumers_deliver(mt_d_t *d, mt_d_batch_t *b);
void mt__d_consumers_keepalive(mt_d_t *d);
void mt__d_sub_free(mt_d_sub_t *s);

/* http.c */
void mt__d_http_input(mt_d_conn_t *c);
/* Answers GET target ("/map?pid=7") as the server would, without a socket (memtrace view
 * --get): the whole answer appended to out, *status its status. 0; MT_EINVAL for a target
 * that is no path, holds a space or a control character, or is the event stream (which
 * never ends); MT_ENOMEM when the answer could not be made or kept (*status 0: none). */
int mt__d_http_get(mt_d_t *d, const char *target, mt_d_buf_t *out, int *status);
/* A complete answer (status line, the usual headers, body); closes after it. */
void mt__d_http_respond(mt_d_conn_t *c, int status, const char *reason, const char *ctype,
                        const char *body, size_t blen, bool head_only);
/* metrics.c */
int mt__d_metrics_text(mt_d_t *d, mt_d_buf_t *out);
json_t *mt__d_state_json(mt_d_t *d);
/* The newest registration of its pid? (Older ones are shadowed in /metrics.) */
bool mt__d_proc_newest(const mt_d_proc_t *p);
/* Appends s as a Prometheus label value (backslash, quote, line feed escaped). */
int mt__d_label_value(mt_d_buf_t *o, const char *s);
/* A process's series labels: pid="N", then rank="R" and job="J" when its hello gave them
 * (docs/fleet.md "Ranks and jobs"). Returns o->err. */
int mt__d_proc_labels(mt_d_buf_t *o, const mt_d_proc_t *p);
/* metrics_info.c: process_info, per-device and per-pool families, appended to out. */
int mt__d_metrics_info(mt_d_t *d, mt_d_buf_t *out);
/* outside.c: the device's used and total bytes and the model's split of them
 * (docs/outside.md), as /metrics families appended to out, and as a process's /state
 * "outside" array (new; NULL when out of memory). */
int mt__d_metrics_outside(mt_d_t *d, mt_d_buf_t *out);
json_t *mt__d_outside_json(const mt_d_proc_t *p);

/* snapshot.c */
void mt__d_snapshot_init(mt_d_t *d);
/* Shutdown has begun (d->stopping): closes the writer's handle once no snapshot is left. */
void mt__d_snapshot_shutdown(mt_d_t *d);
/* After the loop: joins the writer thread. */
void mt__d_snapshot_close(mt_d_t *d);
/* After ev (p's) was applied and recorded in p's window: an OOM queues p's snapshot files
 * (the first, then one per interval), or counts that it got none. */
void mt__d_snapshot_event(mt_d_t *d, mt_d_proc_t *p, const mt_event_rec_t *ev);
/* {"type":"snapshot","pid":N}: answers p's recent events and segment map, one line. */
void mt__d_snapshot_request(mt_d_conn_t *c, json_t *msg);

/* logfile.c */
int mt__d_logfile_open(mt_d_t *d);
void mt__d_logfile_record(mt_d_t *d, const char *line, size_t len);
void mt__d_logfile_flush(mt_d_t *d);
void mt__d_logfile_close(mt_d_t *d);
/* Closes the log at once (no batch in the encoder's hands writes to it). */
void mt__d_logfile_end(mt_d_t *d);

#endif
