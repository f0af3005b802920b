/* The recorder's state, shared by prof.c (the sink and the lifecycle) and prof_log.c (the
 * local log and the daemon watcher). */
#ifndef MT_PROFILER_PROF_INTERNAL_H
#define MT_PROFILER_PROF_INTERNAL_H

#include "util/fileahead.h"
#include "util/log.h"
#include "profiler/binlog.h"
#include "profiler/internal.h"
#include "profiler/stack.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* Invariants: mode is the live mode (DAEMON, LOG or OFF), set at create; it changes
 * once at most, DAEMON -> LOG, when the daemon goes away (the watcher's takeover), and
 * only under stop_lock. fd >= 0 from a daemon registration until destroy, and the watcher
 * thread runs while watching; log_fd >= 0 and the drainer thread runs iff mode == LOG;
 * ring != NULL iff mode != OFF. The ring has one consumer at a time: the daemon until it
 * closes our connection, then the holder of drain_lock. */
struct mt_prof_s {
    mt_event_sink_t sink; /* what the allocator calls; ud = this */
    mt__ring_t *ring;     /* the shared ring (producer mapping) */
    _Atomic int mode;     /* mt_prof_mode_e, live; release-stored after the fields it covers */
    int pid;
    _Atomic uint64_t off_count; /* events seen in OFF mode */
    /* Lossless mode (cfg.lossless_stall_ms > 0): the producer waits while the ring is full.
     * lossless_ns: the longest wait for a consumer that reads nothing, 0 = off (also after
     * a stall turned it off); waits, wait_ns, stalls: the counters of mt_prof_stats. */
    _Atomic uint64_t lossless_ns;
    _Atomic uint64_t waits, wait_ns, stalls;
    mt_log_cb log;
    void *log_ud;
    const char *(*tag_name)(void *ud, int tag);
    void *tag_ud;
    /* daemon mode */
    int fd;            /* connection kept open for the process lifetime */
    pthread_t watcher; /* blocks reading fd; takes over if the daemon goes away */
    bool watching;
    char *cfg_log_path; /* owned copy of mt_prof_cfg_t.log_path (NULL = default), for it */
    /* local mode */
    char *log_path; /* owned */
    int log_fd;
    mt__fa_t log_fa; /* its blocks reserved ahead of the writes (the drain's, under drain_lock) */
    unsigned drain_ms;
    pthread_t drainer;
    pthread_mutex_t drain_lock; /* one consumer at a time: drainer thread or flush */
    /* Allocators that keep events back (event.h, source), asked to hand them over at a
     * flush: src[0..nsrc), cap_src allocated, under src_lock (taken before an allocator's
     * lock). One that could not be added (no host memory) is not asked. */
    pthread_mutex_t src_lock;
    struct mt__prof_src_s {
        void (*push)(void *arg);
        void *arg;
    } * src;
    size_t nsrc, cap_src;
    pthread_mutex_t stop_lock;
    pthread_cond_t stop_cond;
    bool stop; /* under stop_lock; destroy has begun */
    /* user tags' labels as announced in the stream (MT_EV_TAG_LABEL); "" = none yet;
     * under drain_lock */
    char labels[MT_TAG_MAX][MT_EVENT_LABEL_MAX + 1];
    /* The log's pending lines, under drain_lock. Invariants: out[0..out_len) is whole
     * lines, out_nlines of them, line i the event of seq out_seq[i] (NO_SEQ: hello, exit);
     * held => out_len > 0 and drains stop (the rest stays in the ring). */
    char *out; /* OUTBUF_SIZE bytes */
    size_t out_len;
    uint64_t *out_seq;   /* OUT_LINES entries */
    mt__prof_enc_t *enc; /* the log's line writer (encode.c), with the tag_name override unused */
    size_t out_nlines;
    /* The binary log (binlog.h) instead of NDJSON: out is then one block, its header's
     * MT__BLOG_HDR bytes first (filled at the flush), bst its delta state; a line above
     * is a record. out_len == 0 <=> no block begun. */
    int log_format; /* the cfg's */
    bool bin;
    mt__blog_state_t bst;
    char *bname[MT_TAG_MAX]; /* with a tag_name override: the names written in the block */
    bool held;               /* the last write failed (disk full): out is kept and retried */
    bool half_line;          /* a cut line could not be truncated away: a '\n' ends it first */
    uint64_t written;        /* event and gap lines in the file, under drain_lock */
    uint64_t unlogged;       /* events taken from the ring that no buffer could hold (lost) */
    uint64_t unlogged_seq;   /* the first of them */
    int write_err;           /* the last write error while held, under drain_lock */
    char name[MT_RING_COMM_MAX];
    mt_prof_job_t job;        /* the cfg's, checked: in the hello and the log's header */
    char oom_dir[256];        /* the cfg's, "" = none: for the OOM note and snapshots */
    unsigned oom_interval_ms; /* the cfg's; 0 = every OOM */
    mt__oomsnap_t *oomsnap;   /* local mode with an OOM directory: writes OOM snapshots */
    /* call stacks: the table in the ring's area (NULL: none could be made), the mode, and
     * what the local log has written of the table (under drain_lock) */
    mt__stab_t *stab;
    _Atomic int stacks;
    mt__stab_view_t view;
    mt__stab_seen_t seen;
    uint32_t pending_stack; /* a stack_ref's id, for the alloc line after it */
    uint64_t pending_addr;
};

#define logf_(p, lvl, ...) mt__logf((p)->log, (p)->log_ud, lvl, __VA_ARGS__)

/* ---- the local log (prof_log.c); callers hold drain_lock unless said otherwise ---- */

/* Opens the log at path (NULL or "": ./memtrace-<pid>.ndjson), writes
 * its hello and the stack table, and starts the drainer thread. Caller holds stop_lock
 * (the takeover) or is create. 0 or a negative MT_E* code. */
int mt__prof_log_start(mt_prof_t *p, const char *path);
/* Drains everything published so far into the log; returns the records taken. */
int mt__prof_log_drain(mt_prof_t *p);
/* Appends one JSON document as a line (hello, exit). Takes ownership of j (may be NULL). */
void mt__prof_log_line(mt_prof_t *p, json_t *j);
/* Writes the buffer's whole lines to the log; 0, or the write error while held. */
int mt__prof_log_flush(mt_prof_t *p);
/* At the end, with the log still failing: says how many events never reached it. */
void mt__prof_log_lost_report(mt_prof_t *p);
/* The daemon watcher thread (arg: the mt_prof_t): at the daemon's EOF, takes over into the
 * local log; meanwhile asks for what the sources keep back while the ring is quiet. */
void *mt__prof_watcher_main(void *arg);
/* Asks every registered source for the events it keeps back (event.h, source): all of
 * them, or (quiet) only when nothing reached the ring since the last such call, whose
 * count *last keeps. Not with drain_lock held in lossless mode (a push may wait for it). */
void mt__prof_push_sources(mt_prof_t *p, bool quiet, uint64_t *last);

#endif
