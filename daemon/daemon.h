/* memtraced: the daemon core as a library, so that `memtraced`, `memtrace daemon` and the
 * tests run the same code (tests run it in-process, on a loop and thread of their own).
 *
 * One libuv loop does everything: it accepts producers (processes that record events into
 * a shared-memory ring) and consumers on a Unix socket, drains the rings on a timer, keeps
 * a state model per process, and fans the events out as JSON Lines or binary blocks (Unix
 * subscribers; docs/telemetry.md, "Consumers") and Server-Sent Events (HTTP), next to
 * /metrics, /state and /healthz.
 *
 * Threads: every function runs on the thread that runs mt__d_run(), except mt__d_stop(),
 * which may be called from any thread (and from a signal-free context only). */
#ifndef MT_DAEMON_DAEMON_H
#define MT_DAEMON_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <uv.h>

#include "memtrace/common.h"

typedef struct mt_d_s mt_d_t;

#define MT_D_DEFAULT_PORT 9477 /* HTTP port of `memtrace daemon` unless --port says otherwise */

typedef struct mt_d_cfg_s {
    const char *socket_path;      /* borrowed; NULL = default_socket */
    const char *http_host;        /* borrowed; "127.0.0.1" by default */
    int http_port;                /* 0 = ephemeral (see mt__d_http_port), -1 = no HTTP */
    const char *log_path;         /* borrowed; NDJSON log of everything received, or NULL */
    unsigned max_exited;          /* exited processes kept before the oldest is evicted; 16 */
    size_t consumer_queue_bytes;  /* per consumer, queued and not yet written; 4 MiB: more
                                     than one tick's events (drain_budget x ~300 bytes) */
    size_t write_high_water;      /* per consumer, bytes handed to libuv at most; 256 KiB */
    size_t max_line_bytes;        /* Unix socket request line limit; 64 KiB */
    size_t max_request_bytes;     /* HTTP request head limit; 8 KiB */
    unsigned drain_interval_ms;   /* ring drain period; 5 */
    unsigned drain_budget;        /* events drained per tick, all producers together; 4096 */
    unsigned keepalive_ms;        /* SSE ": keep-alive" comment period; 15000 */
    unsigned idle_timeout_ms;     /* a connection that has not said what it is is closed; 10000 */
    unsigned head_timeout_ms;     /* an HTTP request head must be complete within this of the
                                     accept, however slowly it trickles in; 5000 */
    unsigned max_http_conns;      /* HTTP connections open at once of every peer but our own
                                     user and root (their connections are not counted); 64 */
    unsigned max_http_per_peer;   /* HTTP connections open at once of one peer: one uid (the
                                     peer's socket's, when it is on this host), else one
                                     address; 16 */
    unsigned fd_reserve;          /* fds kept free of HTTP for producers and the socket; 64 */
    unsigned max_consumers;       /* subscribers (Unix and SSE) at once; 64 */
    unsigned max_rings_per_proc;  /* live rings of one process (the SO_PEERCRED pid of its
                                     hello); more are refused; 16 */
    unsigned max_rings_per_uid;   /* live rings of one user (SO_PEERCRED uid), all its
                                     processes together: each costs a connection and about
                                     0.2 MB of state here; 256 */
    size_t consumer_budget_bytes; /* queue + write limit of every consumer together; a new
                                     consumer gets what is left (>= 64 KiB) or is refused;
                                     64 MiB */
    bool http_auth;               /* every route but /healthz needs the token; true */
    const char *http_token;       /* borrowed; NULL = the token file (mt__d_token_path) */
    bool metrics_open;            /* /metrics needs no token (for Prometheus); false */
    const char *http_name;        /* borrowed; a Host name accepted besides localhost,
                                     127.0.0.1, [::1] and http_host; NULL = none */
    bool handle_signals;          /* SIGINT/SIGTERM stop the daemon (the executables); false */
    const char *oom_dir;          /* borrowed; where OOM snapshots go; NULL = default_oom_dir,
                                     "off" = none (docs/torch-snapshot.md) */
    unsigned oom_max_snapshots;   /* OOM snapshots kept (a .json and a .pickle each); 8 */
    int oom_interval_ms;          /* least ms between two OOM snapshots of one process (the
                                     first always gets one); 0 = every OOM; -1 (default) =
                                     MT_PROF_OOM_INTERVAL_MS */
    bool view_general_reader;     /* mt__d_view_load: every log line through jansson, none
                                     through the event-line decoder (docs/readers.md; for
                                     comparing the two); false */
    uv_loop_t *loop;              /* borrowed, optional: run on this loop instead of our own */
    mt_log_cb log;                /* optional diagnostics sink */
    void *log_ud;
    /* What mt__d_cfg_from_env resolves; "" (the default): the socket
     * /tmp/memtrace-<euid>/memtrace.sock, and no OOM snapshots. */
    char default_socket[108];  /* the socket when socket_path is NULL */
    char default_oom_dir[512]; /* the OOM directory when oom_dir is NULL */
} mt_d_cfg_t;

/* Counters of the whole daemon, for tests and the CLI. */
typedef struct mt_d_counters_s {
    uint64_t events;                   /* events drained from every ring */
    uint64_t producer_drops;           /* events the producers' rings lost (sequence gaps) */
    uint64_t consumer_drops;           /* events dropped from slow consumers' queues */
    uint64_t producers;                /* registrations accepted */
    uint64_t consumers;                /* subscriptions accepted (Unix and SSE) */
    uint64_t rejected;                 /* connections refused: bad input, wrong uid, limits */
    uint64_t oom_snapshots;            /* OOM snapshots written */
    uint64_t oom_snapshots_suppressed; /* OOMs that got none: the interval, a full queue */
    uint64_t oom_snapshots_failed;     /* OOM snapshots that could not be written */
    uint64_t encoder_cpu_ns;           /* CPU time of the line encoder thread so far */
    unsigned live_processes;           /* producers connected now */
    unsigned known_processes;          /* live + exited still kept */
} mt_d_counters_t;

/* Defaults (no environment read: mt__d_create reads none either). */
mt_d_cfg_t mt__d_cfg_default(void);
/* The daemon's environment, for the executables (docs/process-state.md):
 * mt_prof_socket_path() into cfg->default_socket, mt__d_oom_dir() into cfg->default_oom_dir
 * ("" when it names none) and, with cfg->oom_interval_ms still -1, $MEMTRACE_OOM_INTERVAL_MS
 * into it (a malformed one is warned about to cfg->log: the default). MT_EOVERFLOW when the
 * socket path does not fit (default_socket is then ""). */
int mt__d_cfg_from_env(mt_d_cfg_t *cfg);
/* The default OOM snapshot directory: $MEMTRACE_OOM_DIR, else $XDG_STATE_HOME/memtrace/oom,
 * else $HOME/.local/state/memtrace/oom. MT_ENOENT when none can be named. */
int mt__d_oom_dir(char *buf, size_t len);

/* Creates the daemon: binds the Unix socket (a stale socket file is removed, but if another
 * daemon answers on it, MT_EBUSY) and the HTTP port (taken: -EADDRINUSE), makes or reads
 * the HTTP token, and opens the log (0600, never through a symlink). Nothing runs until
 * mt__d_run(). *out is new. */
int mt__d_create(mt_d_t **out, const mt_d_cfg_t *cfg);
/* Runs the loop until mt__d_stop() (or a signal, if handle_signals); then every handle of the
 * daemon is closed and the socket file removed. Returns 0, or a negative MT_E* code.
 * SIGPIPE is blocked in the calling thread while it runs (a write to a vanished peer fails
 * with EPIPE); the process's disposition is never changed. */
int mt__d_run(mt_d_t *d);
/* Asks the daemon to stop; safe from any thread. */
void mt__d_stop(mt_d_t *d);
/* Frees the daemon. If it owns its loop, the loop is closed: that must succeed (the return
 * of uv_loop_close is logged otherwise). Call after mt__d_run() has returned, or instead of
 * running it. Sets *p = NULL. */
void mt__d_destroy(mt_d_t **p);

/* The HTTP port actually bound (useful with http_port = 0), or -1 when HTTP is off. */
int mt__d_http_port(const mt_d_t *d);
/* The HTTP token ("" when http_auth is off); borrowed, valid until mt__d_destroy(). */
const char *mt__d_http_token(const mt_d_t *d);
/* The Unix socket path; borrowed, valid until mt__d_destroy(). */
const char *mt__d_socket_path(const mt_d_t *d);
/* A copy of the counters. Only meaningful on the loop thread or after mt__d_run() returns. */
void mt__d_counters(const mt_d_t *d, mt_d_counters_t *out);

/* Loads a recorded telemetry log (NDJSON; "-" = standard input) into d's state, for
 * `memtrace view`: its processes appear as exited (reason from their exit line, else
 * "unknown"), with their figures, history and event window. A PyTorch snapshot (a pickle,
 * docs/torch-snapshot.md) is one exited process named after the file, with a pid no
 * loaded process has; a malformed one is MT_EPROTO (err says where). Call before mt__d_run().
 * Events are added to *events; malformed lines are counted in *bad (the first named in
 * err). An event seen twice (two logs of one run) counts once. Returns 0, MT_EIO (cannot
 * open or read; err says why) or MT_ENOMEM. */
int mt__d_view_load(mt_d_t *d, const char *path, unsigned long *events, unsigned long *bad,
                    char *err, size_t errlen);
/* The same for a file that is a run of its own (`memtrace view BEFORE AFTER`): a pid that
 * a process of an earlier file has is given a new one (the smallest above every pid), so
 * two runs are two processes. */
int mt__d_view_load_run(mt_d_t *d, const char *path, unsigned long *events, unsigned long *bad,
                        char *err, size_t errlen);
/* Gives the page's compare view its document (`memtrace view BEFORE AFTER`): the JSON text
 * served as is at /diff (copied; a second call replaces the first). 0 or MT_ENOMEM. */
int mt__d_view_set_diff(mt_d_t *d, const char *json);
/* Gives the page's job view its document: the report's "jobs" of the loaded logs (the
 * ranks of a training job), served as is at /jobs (copied; replaces). 0 or MT_ENOMEM. */
int mt__d_view_set_jobs(mt_d_t *d, const char *json);
/* Whether a loaded process's hello named a rank. */
bool mt__d_view_has_ranks(const mt_d_t *d);
/* Writes what the page of the loaded files starts from to f, as one JSON line:
 * {"processes": /state's processes, "windows": the events each keeps for past states (in
 * the same order), "diff": /diff's document or null, "jobs": /jobs's or null} (`memtrace
 * view --print-state`). 0, MT_ENOMEM, or MT_EIO (f could not be written). */
int mt__d_view_print(mt_d_t *d, FILE *f);
/* Answers GET target ("/map?pid=7", a route of the page's data or the API's, the event
 * stream excepted) as the server would, without serving (`memtrace view --get`): the body
 * to f, newline-ended, when the status is 200; else its first line into msg (NUL-ended).
 * *status: the answer's status (0: none). 0, MT_EINVAL (no such target: see
 * mt__d_http_get), MT_ENOMEM, or MT_EIO (f could not be written). */
int mt__d_view_get(mt_d_t *d, const char *target, FILE *f, int *status, char *msg, size_t msglen);
/* Sets how many events per process are kept for past states (default 65536; >= 1024). */
void mt__d_set_event_window(mt_d_t *d, size_t events);
/* Keeps those events in an unlinked temporary file in dir instead of memory, a chunk per
 * process in memory (`memtrace view`). 0 or MT_ENOMEM. */
int mt__d_set_event_spool(mt_d_t *d, const char *dir);

/* The daemon's command line (options, --help, detaching unless --foreground), shared by
 * `memtraced` and `memtrace daemon`. prog names the program in messages. Returns the exit
 * status. */
int mt__d_cli_main(int argc, char **argv, const char *prog);

/* ---- client side (daemon/client.c): blocking sockets, usable from any program ---- */

/* Connects to the daemon's socket (NULL = mt_prof_socket_path()). -EPERM when the daemon
 * there runs as another user than us or root (SO_PEERCRED). *out_fd is new. */
int mt__d_client_connect(const char *socket_path, int *out_fd);
/* The HTTP token file of the daemon at socket_path (NULL = mt_prof_socket_path()): the
 * socket path with ".token" appended. */
int mt__d_token_path(const char *socket_path, char *buf, size_t len);
/* Reads that daemon's token (32 hex characters and a NUL; len >= 33). -EPERM if the file is
 * not ours (or root's) and private. */
int mt__d_client_token(const char *socket_path, char *buf, size_t len);
/* Sends all of s, without SIGPIPE. */
int mt__d_client_send(int fd, const char *s, size_t n);
/* Reads until EOF (at most max bytes, within timeout_ms). *out is new, NUL-terminated. */
int mt__d_client_read_all(int fd, size_t max, int timeout_ms, char **out, size_t *out_len);
/* Asks for the state JSON ({"type":"state"} request). *out is new, one line. */
int mt__d_client_state(const char *socket_path, int timeout_ms, char **out);

#endif
