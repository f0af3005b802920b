/* The recorder: owns the ring, implements the allocator's event sink, registers with
 * the daemon, or else runs the local drainer thread that writes the NDJSON log. */
#include "util/log.h"
#include "util/safefile.h"
#include "profiler/internal.h"
#include "profiler/stack.h"

#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#define REGISTER_TIMEOUT_MS 2000
#define DRAIN_BATCH         4096
#define OUTBUF_SIZE         (64 * 1024)
/* An event line is at most this long with the stream's labels (24 bytes); a drain takes
 * only as many records as surely fit the buffer's room, so that none is taken from the
 * ring that the buffer cannot hold while the disk is full. */
#define LINE_MAX_BYTES 512
#define OUT_LINES      (OUTBUF_SIZE / 32) /* lines the buffer may hold (their seqs) */
#define NO_SEQ         UINT64_MAX         /* a line of no event: hello, exit */

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
    unsigned drain_ms;
    pthread_t drainer;
    pthread_mutex_t drain_lock; /* one consumer at a time: drainer thread or flush */
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
    uint64_t *out_seq; /* OUT_LINES entries */
    size_t out_nlines;
    bool held;             /* the last write failed (disk full): out is kept and retried */
    bool half_line;        /* a cut line could not be truncated away: a '\n' ends it first */
    uint64_t written;      /* event and gap lines in the file, under drain_lock */
    uint64_t unlogged;     /* events taken from the ring that no buffer could hold (lost) */
    uint64_t unlogged_seq; /* the first of them */
    int write_err;         /* the last write error while held, under drain_lock */
    char name[MT_RING_COMM_MAX];
    char oom_dir[256];      /* mt_prof_oom_dir() at create, "" = none: for the OOM note */
    mt__oomsnap_t *oomsnap; /* local mode with an OOM directory: writes OOM snapshots */
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

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

mt_prof_cfg_t mt_prof_cfg_default(void)
{
    mt_prof_cfg_t c;
    memset(&c, 0, sizeof(c));
    c.mode = MT_PROF_AUTO;
    c.slots = MT_RING_DEFAULT_SLOTS;
    c.drain_ms = 20;
    c.stacks = MT_STACKS_SAMPLED;
    return c;
}

int mt_prof_stacks_parse(const char *s, int *mode)
{
    static const char *const names[] = {"off", "sampled", "all"};
    for (int i = 0; s && i < 3; i++) {
        if (strcmp(s, names[i]) == 0) {
            *mode = i;
            return 0;
        }
    }
    return MT_EINVAL;
}

int mt_prof_stacks_from_env(mt_prof_cfg_t *cfg, char *err, size_t errlen)
{
    const char *e = getenv("MEMTRACE_STACKS");
    if (!cfg)
        return MT_EINVAL;
    if (!e)
        return 0;
    int mode;
    if (mt_prof_stacks_parse(e, &mode) != 0) {
        if (err && errlen)
            snprintf(err, errlen, "MEMTRACE_STACKS='%.64s': want off, sampled or all", e);
        return MT_EINVAL;
    }
    cfg->stacks = mode;
    return 0;
}

int mt_prof_cfg_from_env(mt_prof_cfg_t *cfg)
{
    const char *e = getenv("MEMTRACE_PROF");
    if (!cfg)
        return MT_EINVAL;
    if (!e || !*e)
        return 0;
    static const char *const names[] = {"auto", "daemon", "log", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(e, names[i]) == 0) {
            cfg->mode = i;
            return 0;
        }
    }
    return MT_EINVAL;
}

const char *mt_prof_mode_name(int mode)
{
    switch (mode) {
    case MT_PROF_AUTO:
        return "auto";
    case MT_PROF_DAEMON:
        return "daemon";
    case MT_PROF_LOG:
        return "log";
    case MT_PROF_OFF:
        return "off";
    default:
        return "unknown";
    }
}

/* ---- the sink (hot path) ---- */

/* The live mode; acquire pairs with the takeover's release, so the log fields it set up
 * are seen with it. */
static int mode_of(const mt_prof_t *p)
{
    return atomic_load_explicit(&((mt_prof_t *)p)->mode, memory_order_acquire);
}

int mt_prof_record(mt_prof_t *p, const mt_event_rec_t *ev)
{
    /* OFF is decided at create and never entered later: a relaxed read suffices. */
    if (atomic_load_explicit(&p->mode, memory_order_relaxed) == MT_PROF_OFF) {
        atomic_fetch_add_explicit(&p->off_count, 1, memory_order_relaxed);
        return 0;
    }
    if (ev->kind == MT_EV_OOM)
        mt__ring_set_flags(p->ring, MT_RING_F_OOM);
    if (ev->time_ns == 0) {
        /* Events must carry a time; stamp those emitted without one. */
        mt_event_rec_t copy = *ev;
        copy.time_ns = mono_ns();
        return mt__ring_push(p->ring, &copy);
    }
    return mt__ring_push(p->ring, ev);
}

/* The allocating thread's stack, before the allocator's lock (event.h). */
static uint32_t sink_stack(void *ud, uint64_t bytes, int pool, int mode)
{
    (void)pool;
    mt_prof_t *p = ud;
    if (mode == MT_STACKS_DEFAULT)
        mode = atomic_load_explicit(&p->stacks, memory_order_relaxed);
    return mt__stab_capture(p->stab, mode, bytes);
}

int mt_prof_stacks(mt_prof_t *p)
{
    return p && p->stab ? atomic_load_explicit(&p->stacks, memory_order_relaxed) : MT_STACKS_OFF;
}

int mt_prof_set_stacks(mt_prof_t *p, int mode)
{
    if (!p || mode < MT_STACKS_OFF || mode > MT_STACKS_ALL)
        return MT_EINVAL;
    if (!p->stab && mode != MT_STACKS_OFF)
        return MT_ENOTSUP;
    atomic_store_explicit(&p->stacks, mode, memory_order_relaxed);
    return 0;
}

void mt_prof_stack_stats(mt_prof_t *p, mt_prof_stack_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (!p || !p->stab)
        return;
    mt__stab_stats_t st;
    mt__stab_stats(p->stab, &st);
    *out = (mt_prof_stack_stats_t){st.captures, st.overflow,    st.stacks,     st.modules,
                                   st.frames,   st.table_bytes, st.bound_bytes};
}

static void sink_emit(void *ud, const mt_event_rec_t *ev)
{
    mt_prof_record(ud, ev);
}

/* One operation's events (the allocator's free_requested + free_completed): one claim. */
static void sink_emit_n(void *ud, const mt_event_rec_t *ev, size_t n)
{
    mt_prof_t *p = ud;
    bool plain = atomic_load_explicit(&p->mode, memory_order_relaxed) != MT_PROF_OFF;
    for (size_t i = 0; i < n && plain; i++)
        plain = ev[i].kind != MT_EV_OOM && ev[i].time_ns != 0;
    if (plain) {
        mt__ring_push_n(p->ring, ev, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        mt_prof_record(p, &ev[i]);
}

/* Names where this OOM's snapshot is (the allocator's message quotes it): the daemon's
 * file, or in local mode the log and how to make a snapshot of it. */
static void sink_oom_note(void *ud, unsigned device, uint64_t n, char *buf, size_t len)
{
    mt_prof_t *p = ud;
    int mode = atomic_load_explicit(&p->mode, memory_order_acquire);
    if (mode == MT_PROF_DAEMON && p->oom_dir[0] != '\0')
        snprintf(buf, len, "Snapshot of this OOM (by the daemon): %s/oom-%d-dev%u-%llu.pickle",
                 p->oom_dir, p->pid, device, (unsigned long long)n);
    else if (mode == MT_PROF_LOG && p->oomsnap != NULL)
        snprintf(buf, len, "Snapshot of this OOM (by the recorder): %s/oom-%d-dev%u-%llu.pickle",
                 p->oom_dir, p->pid, device, (unsigned long long)n);
    else if (mode == MT_PROF_LOG && p->log_path != NULL)
        snprintf(buf, len,
                 "Events up to this OOM: %s (memtrace export --format torch-snapshot "
                 "%s -o oom.pickle)",
                 p->log_path, p->log_path);
    else
        buf[0] = '\0';
}

int mt_prof_oom_dir(char *buf, size_t len)
{
    const char *env = getenv("MEMTRACE_OOM_DIR");
    const char *xdg = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (env != NULL && strcmp(env, "off") == 0)
        return MT_ENOENT;
    if (env != NULL && env[0] != '\0')
        n = snprintf(buf, len, "%s", env);
    else if (xdg != NULL && xdg[0] == '/')
        n = snprintf(buf, len, "%s/memtrace/oom", xdg);
    else if (home != NULL && home[0] == '/')
        n = snprintf(buf, len, "%s/.local/state/memtrace/oom", home);
    else
        return MT_ENOENT;
    return n > 0 && (size_t)n < len ? 0 : MT_EINVAL;
}

const mt_event_sink_t *mt_prof_sink(mt_prof_t *p)
{
    return &p->sink;
}

/* ---- local log ---- */

/* Event and gap lines among the first n lines of the buffer. */
static uint64_t event_lines(const mt_prof_t *p, size_t n)
{
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += p->out_seq[i] != NO_SEQ;
    return k;
}

/* Drops the first `bytes` (n whole lines) of the buffer: they are in the file. */
static void out_consume(mt_prof_t *p, size_t bytes, size_t n)
{
    p->written += event_lines(p, n);
    memmove(p->out, p->out + bytes, p->out_len - bytes);
    memmove(p->out_seq, p->out_seq + n, (p->out_nlines - n) * sizeof *p->out_seq);
    p->out_len -= bytes;
    p->out_nlines -= n;
}

/* Writes the buffer to the log, whole lines only. A failed or short write (disk full, a
 * file size limit, EIO) cuts the file back to its last whole line, keeps the unwritten
 * lines in the buffer and holds: drains stop, so later events stay in the ring, and the
 * next flush (the drainer's next round) tries again. The failure is said once, when it
 * begins; what is never written is counted at the end (finish). */
static int out_flush(mt_prof_t *p)
{
    if (p->out_len == 0)
        return 0;
    if (p->half_line && write(p->log_fd, "\n", 1) == 1)
        p->half_line = false;                    /* the reader skips the cut line as malformed */
    off_t start = lseek(p->log_fd, 0, SEEK_END); /* O_APPEND: where this write begins */
    size_t off = 0;
    int err = 0;
    while (off < p->out_len && !p->half_line) {
        ssize_t w = write(p->log_fd, p->out + off, p->out_len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            err = w < 0 ? errno : ENOSPC;
            break;
        }
        off += (size_t)w;
    }
    if (off == p->out_len) {
        out_consume(p, off, p->out_nlines);
        if (p->held)
            logf_(p, MT_LOG_WARN, "memtrace: writing %s again", p->log_path);
        p->held = false;
        p->write_err = 0;
        return 0;
    }
    /* Cut back to the last whole line written; the rest stays for the next try. */
    size_t whole = off, lines = 0;
    while (whole > 0 && p->out[whole - 1] != '\n')
        whole--;
    if (whole < off && (start < 0 || ftruncate(p->log_fd, start + (off_t)whole) != 0))
        p->half_line = true;
    for (size_t i = 0; i < whole; i++)
        lines += p->out[i] == '\n';
    out_consume(p, whole, lines);
    if (!p->held) {
        uint64_t first = NO_SEQ;
        for (size_t i = 0; i < p->out_nlines && first == NO_SEQ; i++)
            first = p->out_seq[i];
        logf_(p, MT_LOG_ERROR,
              "memtrace: writing %s: %s; from seq %llu on, events are kept in memory (the "
              "ring, then dropped and counted when it is full) and written when it works again",
              p->log_path, strerror(err ? err : EIO), (unsigned long long)first);
    }
    p->held = true;
    p->write_err = -(err ? err : EIO);
    return p->write_err;
}

/* Room for `bytes` more bytes and 8 more lines, flushing if needed; false if the buffer
 * is held that full. */
static bool out_room(mt_prof_t *p, size_t bytes)
{
    if (OUTBUF_SIZE - p->out_len > bytes && p->out_nlines + 8 <= OUT_LINES)
        return true;
    out_flush(p);
    return OUTBUF_SIZE - p->out_len > bytes && p->out_nlines + 8 <= OUT_LINES;
}

/* Appends one JSON document as a line (hello, exit); whole lines only reach the file (O_APPEND
 * keeps lines of processes sharing one log file from interleaving). */
static void out_line(mt_prof_t *p, json_t *j)
{
    if (!j)
        return;
    if (!out_room(p, 1024)) {
        json_decref(j); /* held full: the log goes without this hello or exit line */
        return;
    }
    size_t room = OUTBUF_SIZE - p->out_len - 1;
    size_t n = json_dumpb(j, p->out + p->out_len, room, JSON_COMPACT);
    json_decref(j);
    if (n == 0 || n > room)
        return; /* these documents are < 1 KiB */
    p->out_len += n;
    p->out[p->out_len++] = '\n';
    p->out_seq[p->out_nlines++] = NO_SEQ;
}

/* A tag's name in the log: the configured tag_name's when it gives one (an override),
 * else the label the stream announced, else NULL (built-in name or "tag<n>"). Called by
 * the line writer with drain_lock held. */
static const char *drain_tag_name(void *ud, int tag)
{
    mt_prof_t *p = ud;
    const char *s = p->tag_name ? p->tag_name(p->tag_ud, tag) : NULL;
    if (s && *s)
        return s;
    return tag >= 0 && tag < MT_TAG_MAX && p->labels[tag][0] ? p->labels[tag] : NULL;
}

/* Appends one event's line, written in place by the line writer. */
/* A table line (stack, module) into the log, before the lines that use it. Caller holds
 * drain_lock. */
static void drain_table_line(void *ud, const char *line, size_t len)
{
    mt_prof_t *p = ud;
    if (!out_room(p, len))
        return; /* held full: the stack's frames read "unknown" */
    memcpy(p->out + p->out_len, line, len);
    p->out_len += len;
    p->out_seq[p->out_nlines++] = NO_SEQ;
}

static void drain_cb(void *ud, const mt_event_rec_t *ev)
{
    mt_prof_t *p = ud;
    if (ev->kind == MT_EV_TAG_LABEL && ev->tag < MT_TAG_MAX)
        mt_event_label_unpack(ev, p->labels[ev->tag]);
    uint32_t stack = 0;
    if (ev->kind == MT_EV_STACK_REF) {
        /* the stack's line (and modules found since) before the first line using it */
        (void)mt__stab_emit_for(&p->view, &p->seen, (uint32_t)ev->size, p->pid, drain_table_line,
                                p);
        p->pending_stack = (uint32_t)ev->size;
        p->pending_addr = ev->addr;
    } else {
        if (ev->kind == MT_EV_ALLOC && p->pending_stack && ev->addr == p->pending_addr)
            stack = p->pending_stack;
        p->pending_stack = 0;
    }
    size_t room = p->out_nlines < OUT_LINES ? OUTBUF_SIZE - p->out_len : 0;
    size_t n =
        room ? mt_prof_alloc_write(p->out + p->out_len, room, ev, p->pid, stack, drain_tag_name, p)
             : 0;
    if (n == 0 || n >= room) {
        /* Only a tag name of over 10 KiB (a tag_name override), or a flush mid-drain that
         * failed, leaves no room: the event is lost, and counted. */
        n = out_room(p, LINE_MAX_BYTES)
                ? mt_prof_alloc_write(p->out + p->out_len, OUTBUF_SIZE - p->out_len, ev, p->pid,
                                      stack, drain_tag_name, p)
                : 0;
        if (n == 0 || n >= OUTBUF_SIZE - p->out_len) {
            if (p->unlogged++ == 0)
                p->unlogged_seq = ev->seq;
            return;
        }
    }
    p->out_len += n;
    p->out_seq[p->out_nlines++] = ev->seq;
    if (p->oomsnap != NULL) {
        char path[512];
        int rc =
            mt__oomsnap_record(p->oomsnap, ev, (const char(*)[MT_EVENT_LABEL_MAX + 1]) p->labels,
                               drain_tag_name, p, path, sizeof path);
        if (rc > 0)
            logf_(p, MT_LOG_ERROR, "memtrace: out of memory: wrote %s", path);
        else if (rc < 0)
            logf_(p, MT_LOG_WARN, "memtrace: OOM snapshot %s: %s", path, mt_strerror(rc));
    }
}

/* Drains everything published so far into the log. Caller holds drain_lock. */
static int drain_locked(mt_prof_t *p)
{
    int total = 0, n;
    do {
        /* Room for the records taken, each perhaps after a gap line, and a last gap. */
        if (!out_room(p, 8 * LINE_MAX_BYTES))
            break; /* held: the rest stays in the ring */
        size_t fit = (OUTBUF_SIZE - p->out_len) / LINE_MAX_BYTES - 2,
               lines = OUT_LINES - p->out_nlines - 2;
        n = mt__ring_drain(p->ring, drain_cb, p, (fit < lines ? fit : lines) / 2);
        total += n > 0 ? n : 0;
    } while (n > 0);
    out_flush(p);
    return total;
}

/* The drainer comes back after drain_ms while the ring is quiet, but after BUSY_DRAIN_MS
 * once a drain found at least 1/BUSY_FRACTION of the ring: a tight allocation loop fills
 * the default ring in a few ms, long before a 20 ms period ends, and what arrives in a
 * full ring is dropped however fast the lines are written. */
#define BUSY_DRAIN_MS 1
#define BUSY_FRACTION 16

static void *drainer_main(void *arg)
{
    mt_prof_t *p = arg;
    const int busy = (int)(mt__ring_header(p->ring)->slots / BUSY_FRACTION);
    unsigned wait_ms = p->drain_ms;
    pthread_mutex_lock(&p->stop_lock);
    while (!p->stop) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        uint64_t ns = (uint64_t)dl.tv_nsec + (uint64_t)wait_ms * 1000000u;
        dl.tv_sec += (time_t)(ns / 1000000000u);
        dl.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&p->stop_cond, &p->stop_lock, &dl);
        if (p->stop)
            break;
        pthread_mutex_unlock(&p->stop_lock);
        pthread_mutex_lock(&p->drain_lock);
        int n = drain_locked(p);
        pthread_mutex_unlock(&p->drain_lock);
        wait_ms = n >= busy && p->drain_ms > BUSY_DRAIN_MS ? BUSY_DRAIN_MS : p->drain_ms;
        pthread_mutex_lock(&p->stop_lock);
    }
    pthread_mutex_unlock(&p->stop_lock);
    return NULL;
}

static int start_local(mt_prof_t *p, const char *path)
{
    char def[64];
    if (!path || !*path)
        path = getenv("MEMTRACE_LOG");
    if (!path || !*path) {
        snprintf(def, sizeof(def), "./memtrace-%d.ndjson", p->pid);
        path = def;
    }
    p->log_path = strdup(path);
    p->out = malloc(OUTBUF_SIZE);
    p->out_seq = malloc(OUT_LINES * sizeof *p->out_seq);
    if (!p->log_path || !p->out || !p->out_seq)
        return MT_ENOMEM;
    /* Created 0600 and exclusively; an existing log must be a plain file of ours: never a
     * symlink or a file another user planted in a shared directory. */
    int rc = mt__sf_open_append(path, &p->log_fd);
    if (rc == -EPERM && path == def) {
        /* Another user planted our default name (a shared working directory): a name
         * they cannot guess instead. */
        char rnd[9];
        if (mt__sf_random_hex(rnd, 8) == 0) {
            snprintf(def, sizeof(def), "./memtrace-%d.%s.ndjson", p->pid, rnd);
            free(p->log_path);
            p->log_path = strdup(def);
            rc = p->log_path ? mt__sf_open_append(def, &p->log_fd) : MT_ENOMEM;
        }
    }
    if (rc) {
        logf_(p, MT_LOG_ERROR, "memtrace: cannot open log %s: %s%s", path, mt_strerror(rc),
              rc == -EPERM ? " (a symlink, or a file of another user: not written)" : "");
        return rc;
    }
    const mt__ring_hdr_t *h = mt__ring_header(p->ring);
    out_line(p, mt_prof_hello_to_json(p->pid, p->name, h->start_realtime_ns, h->start_mono_ns));
    /* the module map at start; after a takeover from the daemon, the table again (this log
     * needs it before its first stack) */
    mt__stab_seen_free(&p->seen);
    p->pending_stack = 0;
    (void)mt__stab_emit_for(&p->view, &p->seen, 0, p->pid, drain_table_line, p);
    out_flush(p);
    p->written = 0; /* counts events and gaps only */
    /* No daemon to write OOM snapshots: the drainer does (the takeover from a daemon too). */
    if (p->oom_dir[0] != '\0' && p->oomsnap == NULL &&
        mt__oomsnap_create(&p->oomsnap, p->pid, p->oom_dir) != 0)
        logf_(p, MT_LOG_WARN, "memtrace: no memory for OOM snapshots");
    rc = -pthread_create(&p->drainer, NULL, drainer_main, p);
    if (rc) {
        close(p->log_fd);
        p->log_fd = -1;
    }
    return rc;
}

/* The daemon closes our connection only once it has stopped reading the ring (it exited,
 * was killed, or let go of a corrupt ring): from then on this process is the ring's only
 * consumer, and what the daemon had not read yet goes to the local log with the rest.
 * A daemon killed in the middle of a drain may have sent up to 63 records it had not yet
 * acknowledged in read_idx: those reach the log again (same seq), none is lost. */
static void *watcher_main(void *arg)
{
    mt_prof_t *p = arg;
    char buf[256];
    for (;;) {
        ssize_t n = read(p->fd, buf, sizeof buf); /* the daemon sends nothing after hello */
        if (n > 0 || (n < 0 && errno == EINTR))
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
            (void)poll(&pfd, 1, -1);
            continue;
        }
        break;
    }
    pthread_mutex_lock(&p->stop_lock);
    if (!p->stop) {
        int rc = start_local(p, p->cfg_log_path);
        if (rc == 0) {
            atomic_store_explicit(&p->mode, MT_PROF_LOG, memory_order_release);
            logf_(p, MT_LOG_WARN,
                  "memtrace: the daemon went away; recording continues in the local log %s",
                  p->log_path);
        } else {
            logf_(p, MT_LOG_ERROR,
                  "memtrace: the daemon went away and the local log cannot be opened (%s): "
                  "further events are dropped and counted",
                  mt_strerror(rc));
        }
    }
    pthread_mutex_unlock(&p->stop_lock);
    return NULL;
}

/* ---- lifecycle ---- */

static void read_comm(char *buf, size_t len)
{
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/self/comm", "r");
    if (!f)
        return;
    if (fgets(buf, (int)len, f))
        buf[strcspn(buf, "\n")] = '\0';
    fclose(f);
}

int mt_prof_create(mt_prof_t **out, const mt_prof_cfg_t *cfg)
{
    if (!out || !cfg || cfg->mode < MT_PROF_AUTO || cfg->mode > MT_PROF_OFF)
        return MT_EINVAL;
    *out = NULL;
    mt_prof_t *p = calloc(1, sizeof(*p));
    if (!p)
        return MT_ENOMEM;
    p->sink.emit = sink_emit;
    p->sink.emit_n = sink_emit_n;
    p->sink.oom_note = sink_oom_note;
    p->sink.stack = sink_stack;
    p->sink.ud = p;
    p->stacks = cfg->stacks >= MT_STACKS_OFF && cfg->stacks <= MT_STACKS_ALL ? cfg->stacks
                                                                             : MT_STACKS_SAMPLED;
    if (mt_prof_oom_dir(p->oom_dir, sizeof p->oom_dir) != 0)
        p->oom_dir[0] = '\0';
    p->pid = (int)getpid();
    p->fd = -1;
    p->log_fd = -1;
    p->log = cfg->log;
    p->log_ud = cfg->log_ud;
    p->tag_name = cfg->tag_name;
    p->tag_ud = cfg->tag_ud;
    p->drain_ms = cfg->drain_ms ? cfg->drain_ms : 20;
    pthread_mutex_init(&p->drain_lock, NULL);
    pthread_mutex_init(&p->stop_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->stop_cond, &ca);
    pthread_condattr_destroy(&ca);
    if (cfg->name)
        snprintf(p->name, sizeof(p->name), "%s", cfg->name);
    else
        read_comm(p->name, sizeof(p->name));

    int rc = 0;
    if (cfg->mode == MT_PROF_OFF) {
        p->mode = MT_PROF_OFF;
        logf_(p, MT_LOG_INFO, "memtrace: profiler off");
        *out = p;
        return 0;
    }
    uint32_t slots = cfg->slots ? cfg->slots : MT_RING_DEFAULT_SLOTS;
    size_t area = mt__stab_area_size();
    rc = mt__ring_create_ex(&p->ring, slots, p->name, false, area);
    bool shared = rc == 0;
    if (rc && cfg->mode != MT_PROF_DAEMON) {
        /* No shared ring (names taken by another user, /dev/shm full or absent): a private
         * one still feeds the local log; only a daemon could not read it. */
        logf_(p, MT_LOG_WARN,
              "memtrace: cannot create a shared event ring (%s): recording to the local log",
              mt_strerror(rc));
        rc = mt__ring_create_ex(&p->ring, slots, p->name, true, area);
    }
    if (rc == 0) {
        /* The stack table lives in the ring's area, where the daemon reads it. */
        size_t asz;
        void *a = mt__ring_area(p->ring, &asz);
        if (mt__stab_create(&p->stab, a, asz) != 0 || mt__stab_view(&p->view, a, asz) != 0)
            logf_(p, MT_LOG_WARN, "memtrace: no call-stack table: stacks are off");
    }
    if (rc) {
        logf_(p, MT_LOG_ERROR, "memtrace: cannot create the event ring: %s", mt_strerror(rc));
        goto fail;
    }
    if (shared && (cfg->mode == MT_PROF_AUTO || cfg->mode == MT_PROF_DAEMON)) {
        char path[108];
        char err[256] = "";
        if (cfg->socket)
            snprintf(path, sizeof(path), "%s", cfg->socket);
        else if ((rc = mt_prof_socket_path(path, sizeof(path))) != 0)
            snprintf(err, sizeof(err), "socket path too long");
        if (rc == 0)
            rc = mt__prof_client_register(path, p->ring, REGISTER_TIMEOUT_MS, &p->fd, err,
                                          sizeof(err));
        if (rc == 0) {
            /* The daemon has mapped the ring and removed its name. */
            mt__ring_unlink(p->ring);
            p->mode = MT_PROF_DAEMON;
            logf_(p, MT_LOG_INFO, "memtrace: recording to the daemon at %s (ring %s)", path,
                  mt__ring_name(p->ring));
            if (cfg->log_path != NULL && (p->cfg_log_path = strdup(cfg->log_path)) == NULL)
                logf_(p, MT_LOG_WARN, "memtrace: out of memory: the fallback log is the default");
            p->watching = pthread_create(&p->watcher, NULL, watcher_main, p) == 0;
            if (!p->watching)
                logf_(p, MT_LOG_WARN,
                      "memtrace: no watcher thread: if the daemon goes away, "
                      "events are dropped and counted");
            *out = p;
            return 0;
        }
        if (cfg->mode == MT_PROF_DAEMON) {
            logf_(p, MT_LOG_ERROR, "memtrace: %s", err);
            rc = rc == MT_EPROTO ? MT_EPROTO : MT_ENOENT;
            goto fail;
        }
        /* An impostor (another user's daemon) is worth a warning; no daemon is not. */
        logf_(p, rc == -EPERM ? MT_LOG_WARN : MT_LOG_INFO,
              "memtrace: %s; falling back to the local log", err);
    }
    /* Local mode: the drainer thread in this process is the ring's only consumer, so
     * no other process needs the name. */
    mt__ring_unlink(p->ring);
    rc = start_local(p, cfg->log_path);
    if (rc && cfg->mode == MT_PROF_AUTO) {
        /* Auto mode must never stop the program: with no daemon and no writable log,
         * recording is off (and counted), and the log callback says so. */
        logf_(p, MT_LOG_WARN, "memtrace: no daemon and no usable log (%s); profiler off",
              mt_strerror(rc));
        if (p->log_fd >= 0)
            close(p->log_fd);
        p->log_fd = -1;
        mt__ring_close(&p->ring);
        p->mode = MT_PROF_OFF;
        *out = p;
        return 0;
    }
    if (rc)
        goto fail;
    p->mode = MT_PROF_LOG;
    logf_(p, MT_LOG_INFO, "memtrace: recording to the local log %s", p->log_path);
    *out = p;
    return 0;

fail:
    if (p->log_fd >= 0)
        close(p->log_fd);
    mt__ring_close(&p->ring);
    free(p->log_path);
    free(p->out);
    free(p->out_seq);
    mt__oomsnap_destroy(&p->oomsnap);
    mt__stab_destroy(&p->stab);
    mt__stab_seen_free(&p->seen);
    pthread_mutex_destroy(&p->drain_lock);
    pthread_mutex_destroy(&p->stop_lock);
    pthread_cond_destroy(&p->stop_cond);
    free(p);
    return rc;
}

int mt_prof_flush(mt_prof_t *p)
{
    if (!p)
        return MT_EINVAL;
    int mode = mode_of(p);
    if (mode == MT_PROF_DAEMON)
        return mt__prof_client_poke(p->fd) == 0 ? 0 : MT_EIO;
    if (mode != MT_PROF_LOG)
        return 0;
    pthread_mutex_lock(&p->drain_lock);
    drain_locked(p);
    int rc = p->write_err;
    pthread_mutex_unlock(&p->drain_lock);
    return rc;
}

void mt_prof_stats(mt_prof_t *p, mt_prof_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    out->mode = mode_of(p);
    if (out->mode == MT_PROF_OFF) {
        out->emitted = atomic_load_explicit(&p->off_count, memory_order_relaxed);
        return;
    }
    mt__ring_stats_t st;
    mt__ring_stats(p->ring, &st);
    out->emitted = st.emitted;
    out->dropped = st.dropped;
    out->lost = st.lost;
    out->delivered = st.delivered;
    if (out->mode == MT_PROF_LOG) {
        pthread_mutex_lock(&p->drain_lock);
        out->written = p->written;
        pthread_mutex_unlock(&p->drain_lock);
    }
}

const char *mt_prof_log_path(const mt_prof_t *p)
{
    return p && mode_of(p) == MT_PROF_LOG ? p->log_path : NULL;
}

/* At the end, with the log still failing: says once how many events never reached it
 * (held in the buffer, left in the ring, or taken with no room) and the first one. */
static void lost_report(mt_prof_t *p)
{
    if (!p->held && p->unlogged == 0)
        return;
    mt__ring_stats_t st;
    mt__ring_stats(p->ring, &st);
    uint64_t first = p->unlogged ? p->unlogged_seq : NO_SEQ;
    for (size_t i = 0; i < p->out_nlines; i++)
        if (p->out_seq[i] < first)
            first = p->out_seq[i];
    uint64_t n = event_lines(p, p->out_nlines) + (st.claimed - st.read) + p->unlogged;
    logf_(p, MT_LOG_ERROR,
          "memtrace: %llu events were not written to %s (%s), the first of them seq %llu; "
          "the file ends with whole lines",
          (unsigned long long)n, p->log_path, p->write_err ? strerror(-p->write_err) : "no room",
          (unsigned long long)first);
}

/* The end of this process's recording: exit flag, threads stopped, the local log's final
 * drain and exit line. */
static void finish(mt_prof_t *p)
{
    /* Set before the final drain and before the daemon sees EOF: no writer is left, and
     * consumers can tell a clean exit from a crash. */
    if (p->ring)
        mt__ring_set_flags(p->ring, MT_RING_F_EXITED);
    /* stop first: a watcher woken by the shutdown below then leaves without taking over,
     * and mode cannot change after the join. */
    pthread_mutex_lock(&p->stop_lock);
    p->stop = true;
    pthread_cond_signal(&p->stop_cond);
    pthread_mutex_unlock(&p->stop_lock);
    if (p->watching) {
        shutdown(p->fd, SHUT_RDWR); /* the daemon sees EOF: its final drain */
        pthread_join(p->watcher, NULL);
    }
    if (mode_of(p) == MT_PROF_LOG) {
        pthread_join(p->drainer, NULL);
        pthread_mutex_lock(&p->drain_lock);
        drain_locked(p);
        mt__ring_stats_t st;
        mt__ring_stats(p->ring, &st);
        out_line(p,
                 mt__prof_exit_to_json(p->pid, true, st.emitted, st.dropped, st.lost, mono_ns()));
        out_flush(p);
        lost_report(p);
        pthread_mutex_unlock(&p->drain_lock);
    }
}

void mt_prof_destroy(mt_prof_t **pp)
{
    if (!pp || !*pp)
        return;
    mt_prof_t *p = *pp;
    /* A forked child's copy (its atexit, say): the ring, the daemon connection and the
     * threads are the parent's, which goes on recording. The child lets go of its own
     * references only: no exit flag, no shutdown of the shared socket, no join. */
    bool ours = p->pid == (int)getpid();
    if (ours)
        finish(p);
    if (p->log_fd >= 0)
        close(p->log_fd);
    if (p->fd >= 0)
        close(p->fd);
    mt__ring_close(&p->ring);
    mt__oomsnap_destroy(&p->oomsnap);
    mt__stab_destroy(&p->stab);
    mt__stab_seen_free(&p->seen);
    free(p->log_path);
    free(p->cfg_log_path);
    free(p->out);
    free(p->out_seq);
    if (ours) {
        pthread_mutex_destroy(&p->drain_lock);
        pthread_mutex_destroy(&p->stop_lock);
        pthread_cond_destroy(&p->stop_cond);
    }
    free(p);
    *pp = NULL;
}
