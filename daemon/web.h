/* memtraced: what the web page reads, kept per process beside the state model.
 *
 * For each process the daemon (or `memtrace view`) keeps:
 * - a downsampled history: buckets of min/max/last figures (device allocated, reserved,
 *   peak; host allocated, reserved; allocated per tag; OOMs). Two levels: a fine ring of
 *   the last MT_D_WEB_FINE buckets of MT_D_WEB_FINE_NS each (a snapshot read by `memtrace
 *   view`: of a width fitted to its span, mt__d_web_set_span), and a coarse array of at most
 *   MT_D_WEB_COARSE buckets whose width doubles (pairs merged) when it is full, so that
 *   hours of events fit in a fixed size;
 * - a window of the latest events (a ring of `window` records, MT_D_WEB_WINDOW in the live
 *   daemon) and the state before the window's first event. In memory, that state is a
 *   checkpoint of the process's own model (its segment map, taken every window/2 events,
 *   so that no event is applied to a second model) and the events from the checkpoint to
 *   the window, kept in the ring's window/2 more slots; spooled (or once a process's map is
 *   too large to copy that often), a base model that the evicted events are applied to.
 *   The allocator state at any event of the window is a fresh model given the checkpoint's
 *   or base's segments and blocks (as synthesized events), then the events from there up
 *   to it. The window is the daemon's ONE buffer of a process's recent events, written
 *   once per event: the page's scrubbing, /tail and /block read it, and so do snapshots
 *   (snapshot.c: its newest MT_D_SNAPSHOT_EVENTS events, and an OOM's count per device).
 * Memory per process: about 0.6 MiB of history plus 64 bytes x 1.5 window (6 MiB live) and
 * up to MT_D_WEB_CKS checkpoints' maps (at most MT_D_WEB_CK_MAX blocks and segments each). A
 * daemon given a spool directory (`memtrace view`, mt__d_web_set_spool) keeps the windows of
 * the processes it tracks from then on in a spool instead (analysis/event_spool.h: one
 * unlinked temporary file, a chunk of 1024 events per process in memory), so that a loaded
 * log's windows take disk, not memory; evicted chunks are punched out of the file.
 *
 * Routes (GET, JSON unless said; rows of routes.c's table, behind http.c's checks):
 *   /, /app.js, /app.css, /vendor/...   the page (embedded at build time; no token needed)
 *   /history?pid=&from=&to=&buckets=    figures per bucket over [from, to] (seconds)
 *   /spark?span=&buckets=               allocated per bucket of every process, last span s
 *   /map?pid=[&seq=|&t=]                segment map and blocks now, or at an event
 *   /block?pid=&addr=[&seq=]            one block: size, requested, tag, stream, age, stack
 *   /callsites?pid=[&seq=|&t=]          live bytes by call stack now, or at an event
 *   /tail?pid=&n=[&kind=&tag=&pool=]    the latest events of the window, filtered
 * and in web_analysis.c, each built from the analysis code `memtrace report` / `diff` run:
 *   /sites?pid=                         a snapshot's live bytes by site over its trace
 *   /gap?pid=[&seq=|&t=]                why reserved exceeds allocated (analysis/gap.h)
 *   /analysis?pid=                      scopes, temporary sites, settings changed
 *   /diff                               `memtrace view BEFORE AFTER`: analysis/diff.h's */
#ifndef MT_DAEMON_WEB_H
#define MT_DAEMON_WEB_H

#include <stdbool.h>
#include <stdint.h>

#include "analysis/event_spool.h"
#include "analysis/model.h"
#include "memtrace/alloc.h"
#include "memtrace/event.h"

#define MT_D_WEB_FINE       600           /* fine buckets kept */
#define MT_D_WEB_FINE_NS    250000000ull  /* 250 ms each: the last 150 s */
#define MT_D_WEB_COARSE     1024          /* coarse buckets at most */
#define MT_D_WEB_COARSE0_NS 1000000000ull /* first coarse width: 1 s, doubled when full */
#define MT_D_WEB_WINDOW     (1u << 16)    /* events kept per process (live daemon) */
#define MT_D_WEB_CALLSITES  20            /* call sites in a /callsites answer */
#define MT_D_WEB_CKS        4             /* checkpoints kept at most (window/2 apart) */
/* Blocks and segments a checkpoint copies at most: a larger map costs more per event (its
 * copy and sort every window/2 events) than applying each event to a base model. */
#define MT_D_WEB_CK_MAX 8192

/* One bucket of history. Invariants: amin <= alast <= amax; t0 is a multiple of the
 * bucket width; tag[t] = the tag's allocated bytes after the bucket's last event. */
typedef struct mt_d_web_bkt_s {
    uint64_t t0;                /* monotonic ns at its start; 0 = empty */
    uint64_t amin, amax, alast; /* device allocated */
    uint64_t rmax, rlast;       /* device reserved */
    uint64_t peak;              /* device peak allocated, at its end */
    uint64_t hmax, hres;        /* host allocated (max), host reserved (last) */
    uint64_t tag[MT_TAG_MAX];   /* device allocated by tag, at its end */
    uint32_t ooms, events;
} mt_d_web_bkt_t;

struct mt_d_proc_s;
struct mt_d_s;
struct mt_d_conn_s;

/* The process's state after its first `at` events recorded: its maps and totals. */
typedef struct mt_d_web_ck_s {
    uint64_t at;
    mt_model_map_t map[MT_MODEL_CLASSES];
    mt_model_figures_t f[MT_MODEL_CLASSES];
} mt_d_web_ck_t;

/* A process's history and event window.
 * Invariants: ncoarse <= MT_D_WEB_COARSE; coarse[i].t0 increasing; the buckets and pend
 * together hold every event's figures, the buckets as if each event had been folded into
 * them in turn once pend is flushed; wcount <= wcap;
 * wready <= pcap;
 * in memory (win != NULL): the ring's pcap = wcap + wcap/2 slots hold, in arrival order,
 * npre events and then the window's wcount, the newest at whead - 1 (mod pcap);
 * npre + wcount <= pcap; with checkpoints (nck > 0): ck[0..nck) by at increasing,
 * ck[0].at = nrec - wcount - npre (the state before the ring's oldest event), a checkpoint
 * every ckstep events recorded, base unused; without (nck = 0): npre = 0 and base has had
 * every evicted event applied, in order;
 * spooled (win == NULL): the window is the spool's last wcount events, sp.n - wcount the
 * oldest, base as without checkpoints. */
typedef struct mt_d_web_proc_s {
    struct mt_d_web_proc_s *next;
    const struct mt_d_proc_s *proc; /* the live model this one follows (not owned) */
    int64_t off_ns;                 /* realtime - monotonic: shown times are epoch seconds */
    mt_d_web_bkt_t fine[MT_D_WEB_FINE];
    mt_d_web_bkt_t *coarse;
    size_t ncoarse;
    uint64_t coarse_ns; /* width of a coarse bucket, a multiple of fine_ns */
    uint64_t fine_ns;   /* width of a fine bucket: MT_D_WEB_FINE_NS, or a recording's own
                         * (mt__d_web_set_span) */
    mt_d_web_bkt_t cur; /* the figures now (updated per event) */
    /* The figures of the events not yet folded into the buckets (pend.events of them; t0
     * unused): all in the fine bucket starting at pend_f0 (mt__d_web_history_flush). */
    mt_d_web_bkt_t pend;
    uint64_t pend_f0;
    uint64_t last_ns;       /* monotonic time of the last event */
    mt_event_rec_t *win;    /* the ring in memory, or NULL: spooled */
    mt__spool_t sp;         /* spooled: every event recorded (the evicted ones punched out) */
    struct mt_d_web_s *web; /* whose spool file and read buffer a spooled window uses */
    size_t wcap, wcount, whead;
    size_t pcap, npre; /* in memory: the ring's slots; events kept before the window */
    uint64_t nrec;     /* events recorded */
    size_t ckstep;     /* events between two checkpoints */
    size_t ck_due;     /* events until the next checkpoint */
    mt_d_web_ck_t ck[MT_D_WEB_CKS];
    size_t nck;              /* 0: the base model instead (spooled, or a map too large) */
    size_t wready;           /* win[..wready) was faulted in ahead of the stores (advice only) */
    uint64_t wseq;           /* the seq of the newest window event (when wcount > 0): read
                                without reading back the line just streamed to memory */
    struct mt_model_s *base; /* the state before the window's first event */
    uint32_t ooms[256];      /* OOM events seen per device (names of OOM snapshots) */
} mt_d_web_proc_t;

/* Invariants: file.fd >= 0 once opened for a spool_dir (kept open for the windows spooled
 * so far); rd_t != NULL: rd holds chunk rd_c of rd_t's spool (chunks never change once
 * written). */
typedef struct mt_d_web_s {
    mt_d_web_proc_t *procs;
    mt_d_web_proc_t *last; /* cache: the tracker of the last recorded event */
    size_t window;         /* events per process window */
    char *spool_dir;       /* NULL: windows in memory */
    mt__spool_file_t file; /* the spooled windows' chunks, opened with the first of them */
    bool file_tried;       /* file was opened (or could not be: windows in memory then) */
    /* The spooled chunk read last (readers go through one process's window at a time, on the
     * loop's thread): what mt__d_web_window_at's pointer points into. */
    const mt_d_web_proc_t *rd_t;
    size_t rd_c;
    mt_event_rec_t *rd; /* MT__SPOOL_CHUNK events, lazily */
} mt_d_web_t;

/* Follows one record of p (after the state model applied it). Lazily creates p's tracker.
 * MT_ENOMEM when the record is not tracked, or a past state is no longer right for want of
 * memory (a live daemon goes on: counted nowhere else; a loaded file fails), else 0. */
int mt__d_web_record(struct mt_d_s *d, const struct mt_d_proc_s *p, const mt_event_rec_t *ev);
/* Folds t's pending events into its buckets: before the buckets are read. */
void mt__d_web_history_flush(mt_d_web_proc_t *t);
/* Forgets p's tracker (p is being destroyed). */
void mt__d_web_forget(struct mt_d_s *d, const struct mt_d_proc_s *p);
/* Frees every tracker. */
void mt__d_web_free(struct mt_d_s *d);
/* Sets the events kept per process for trackers created from now on (>= 1024). */
void mt__d_web_set_window(struct mt_d_s *d, size_t events);
/* Trackers created from now on keep their windows in a spool in dir (copied; NULL: in
 * memory, the default). Where no file can be made there, in memory. 0 or MT_ENOMEM. */
int mt__d_web_set_spool(struct mt_d_s *d, const char *dir);
mt_d_web_proc_t *mt__d_web_find(struct mt_d_s *d, const struct mt_d_proc_s *p);
/* Before any event of p is recorded: its events span span_ns (a recording read whole), so
 * its history's buckets are as fine as a short recording needs (about MT_D_WEB_FINE / 2 of
 * them over the span, at least 1 us, at most MT_D_WEB_FINE_NS). 0 or MT_ENOMEM. */
int mt__d_web_set_span(struct mt_d_s *d, const struct mt_d_proc_s *p, uint64_t span_ns);
/* Event i of t's window (i < wcount; 0 = the oldest). Borrowed: of a spooled window, valid
 * until the next call for any process or the next record (copy one to keep it meanwhile).
 * An event the spool's file cannot give back reads as a gap. */
const mt_event_rec_t *mt__d_web_window_at(const mt_d_web_proc_t *t, size_t i);
/* Event i of the events kept before the window (i < npre; in memory only). */
const mt_event_rec_t *mt__d_web_pre_at(const mt_d_web_proc_t *t, size_t i);

/* The allocator state after the window's events before index upto (<= wcount): a fresh
 * model given the checkpoint's (or base's) segments and blocks, then the events from it
 * up to there. *out is new. */
int mt__d_web_state_at(const mt_d_web_proc_t *t, size_t upto, struct mt_model_s **out);

/* The first parameter of query present but malformed (not a finite number for from, to,
 * buckets, span, n, t; not an unsigned integer for pid, seq, addr), or NULL: the routes
 * marked so in routes.c answer 400 naming it before their handler runs. */
const char *mt__d_web_bad_param(const char *query);

/* ---- shared by web.c and web_analysis.c ---- */

struct mt_d_buf_s;
/* Sends b (freed) as the JSON answer, or a 500 when building it failed (b->err). */
void mt__d_web_send(struct mt_d_conn_s *c, struct mt_d_buf_s *b, bool head);
/* A plain-text error answer (400 or 404). */
void mt__d_web_bad(struct mt_d_conn_s *c, int status, const char *msg);
/* The newest registration of the query's pid= with its tracker; false (answered 400 or
 * 404) when there is none. */
bool mt__d_web_find_proc(struct mt_d_conn_s *c, const char *query, const struct mt_d_proc_s **p,
                         mt_d_web_proc_t **t);
/* Appends s as a JSON string. 0 or o's first error (sticky, daemon/internal.h). */
int mt__d_web_json_str(struct mt_d_buf_s *o, const char *s);
/* Monotonic ns of t's process as the page's epoch seconds. */
double mt__d_web_secs(const mt_d_web_proc_t *t, uint64_t ns);
/* Where the query asks for a past state (seq= or t=): the window index, else false. */
bool mt__d_web_past_upto(const mt_d_web_proc_t *t, const char *query, size_t *upto);

/* web.c's routes (query already checked for malformed numbers). */
void mt__d_web_serve_history(struct mt_d_conn_s *c, const char *query, bool head);
void mt__d_web_serve_spark(struct mt_d_conn_s *c, const char *query, bool head);
void mt__d_web_serve_map(struct mt_d_conn_s *c, const char *query, bool head);
void mt__d_web_serve_block(struct mt_d_conn_s *c, const char *query, bool head);
void mt__d_web_serve_tail(struct mt_d_conn_s *c, const char *query, bool head);
/* web_analysis.c's routes (query already checked for malformed numbers). */
void mt__d_web_serve_sites(struct mt_d_conn_s *c, const char *query, bool head);
void mt__d_web_serve_gap(struct mt_d_conn_s *c, const char *query, bool head);
void mt__d_web_serve_callsites(struct mt_d_conn_s *c, const char *query, bool head);
void mt__d_web_serve_analysis(struct mt_d_conn_s *c, const char *query, bool head);
void mt__d_web_serve_diff(struct mt_d_conn_s *c, const char *query, bool head);
/* /jobs: the job view's document (mt__d_view_set_jobs), 404 without one. */
void mt__d_web_serve_jobs(struct mt_d_conn_s *c, const char *query, bool head);

/* The page's files (generated by daemon/web/embed.py into web_assets.c). */
typedef struct mt_d_asset_s {
    const char *path; /* "/app.js" */
    const char *ctype;
    const unsigned char *data;
    size_t len;
} mt_d_asset_t;
extern const mt_d_asset_t mt__d_web_assets[];
extern const size_t mt__d_web_nassets;

#endif
