/* The recorder: owns the ring, implements the allocator's event sink, registers with
 * the daemon, or else starts the local log (prof_log.c). */
#include "profiler/prof_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/grow.h"

#define REGISTER_TIMEOUT_MS 2000

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
    c.job = mt_prof_job_unknown();
    c.oom_interval_ms = MT_PROF_OOM_INTERVAL_MS;
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

/* Lossless mode, the ring full: waits for the consumer, nudging the local drainer, while
 * it reads; a consumer that reads nothing for limit_ns ends the mode (its event is
 * dropped, counted, and so are later ones that find the ring full). */
static __attribute__((noinline, cold)) size_t push_wait(mt_prof_t *p, const mt_event_rec_t *ev,
                                                        size_t n, uint64_t limit_ns)
{
    uint64_t t0 = mono_ns(), moved = t0, seen = mt__ring_read_idx(p->ring), now = t0;
    atomic_fetch_add_explicit(&p->waits, 1, memory_order_relaxed);
    size_t dropped = 0;
    for (;;) {
        pthread_cond_signal(&p->stop_cond); /* the local drainer drains at once */
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
        if (mt__ring_try_push_n(p->ring, ev, n))
            break;
        now = mono_ns();
        uint64_t rd = mt__ring_read_idx(p->ring);
        if (rd != seen) {
            seen = rd;
            moved = now;
        } else if (now - moved > limit_ns) {
            atomic_store_explicit(&p->lossless_ns, 0, memory_order_relaxed);
            atomic_fetch_add_explicit(&p->stalls, 1, memory_order_relaxed);
            dropped = mt__ring_push_n(p->ring, ev, n);
            break;
        }
    }
    atomic_fetch_add_explicit(&p->wait_ns, mono_ns() - t0, memory_order_relaxed);
    return dropped;
}

/* Records ev[0..n): dropped when the ring is full, or in lossless mode waited for. */
static inline size_t push(mt_prof_t *p, const mt_event_rec_t *ev, size_t n)
{
    uint64_t limit = atomic_load_explicit(&p->lossless_ns, memory_order_relaxed);
    if (__builtin_expect(limit == 0, 1))
        return mt__ring_push_n(p->ring, ev, n);
    if (mt__ring_try_push_n(p->ring, ev, n))
        return 0;
    return push_wait(p, ev, n, limit);
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
        return push(p, &copy, 1) == 0 ? 0 : MT_EAGAIN;
    }
    return push(p, ev, 1) == 0 ? 0 : MT_EAGAIN;
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
        push(p, ev, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        mt_prof_record(p, &ev[i]);
}

/* Names where this OOM's snapshot is (the allocator's message quotes it): the daemon's
 * file, or in local mode the log and how to make a snapshot of it. An OOM soon after
 * another gets no snapshot (one per interval): the note says so, since which ones do is
 * decided later, by the drainer or the daemon. */
static void sink_oom_note(void *ud, unsigned device, uint64_t n, char *buf, size_t len)
{
    mt_prof_t *p = ud;
    int mode = atomic_load_explicit(&p->mode, memory_order_acquire);
    char limit[64] = "";
    if (n > 1 && p->oom_interval_ms > 0)
        snprintf(limit, sizeof limit, ", if no OOM of the previous %u ms got one",
                 p->oom_interval_ms);
    if (mode == MT_PROF_DAEMON && p->oom_dir[0] != '\0')
        snprintf(buf, len, "Snapshot of this OOM (by the daemon%s): %s/oom-%d-dev%u-%llu.pickle",
                 limit, p->oom_dir, p->pid, device, (unsigned long long)n);
    else if (mode == MT_PROF_LOG && p->oomsnap != NULL)
        snprintf(buf, len, "Snapshot of this OOM (by the recorder%s): %s/oom-%d-dev%u-%llu.pickle",
                 limit, p->oom_dir, p->pid, device, (unsigned long long)n);
    else if (mode == MT_PROF_LOG && p->log_path != NULL)
        snprintf(buf, len,
                 "Events up to this OOM: %s (memtrace export --format torch-snapshot "
                 "%s -o oom.pickle)",
                 p->log_path, p->log_path);
    else
        buf[0] = '\0';
}

static void sink_source(void *ud, void (*push)(void *arg), void *arg, bool on);

/* A batch in two steps (event.h): not in lossless mode, whose waits push_n makes, nor for a
 * batch longer than the ring, which a claim would always drop whole (push_n keeps what
 * fits). A claim on a ring momentarily full drops the batch. */
static bool sink_claim(void *ud, size_t n, uint64_t tok[2])
{
    mt_prof_t *p = ud;
    if (atomic_load_explicit(&p->lossless_ns, memory_order_relaxed) != 0 ||
        atomic_load_explicit(&p->mode, memory_order_relaxed) == MT_PROF_OFF ||
        n > mt__ring_slots(p->ring))
        return false;
    mt__ring_claim(p->ring, n, tok);
    return true;
}

static void sink_write(void *ud, const uint64_t tok[2], const mt_event_rec_t *ev, size_t n)
{
    mt__ring_write(((mt_prof_t *)ud)->ring, tok, ev, n);
}

/* A thread cache's batch in compact form (util/evbatch.h): the ring keeps it so, and its
 * readers make the events. */
static void sink_write_batch(void *ud, const uint64_t tok[2], const void *hdr, const void *ents)
{
    mt__ring_write_batch(((mt_prof_t *)ud)->ring, tok, hdr, ents);
}

/* OFF is decided at create (mt_prof_create) and final. */
static bool sink_recording(void *ud)
{
    return mode_of(ud) != MT_PROF_OFF;
}

const mt_event_sink_t *mt_prof_sink(mt_prof_t *p)
{
    return &p->sink;
}

/* ---- lifecycle ---- */

/* The cfg's job, kept to its invariant (the program may have filled it by hand): an
 * out-of-range count is unknown, the id sanitized. */
static void set_job(mt_prof_t *p, const mt_prof_job_t *j)
{
    p->job = mt_prof_job_unknown();
    if (j->rank >= 0 && j->rank <= MT_PROF_RANK_MAX)
        p->job.rank = j->rank;
    if (j->local_rank >= 0 && j->local_rank <= MT_PROF_RANK_MAX)
        p->job.local_rank = j->local_rank;
    if (j->world_size >= 1 && j->world_size <= MT_PROF_RANK_MAX)
        p->job.world_size = j->world_size;
    char id[MT_PROF_JOB_MAX];
    memcpy(id, j->id, sizeof id);
    id[sizeof id - 1] = '\0';
    mt_prof_job_id_sanitize(p->job.id, sizeof p->job.id, id);
}

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
    if (!out || !cfg || cfg->mode < MT_PROF_AUTO || cfg->mode > MT_PROF_OFF ||
        cfg->log_format < MT_PROF_LOG_AUTO || cfg->log_format > MT_PROF_LOG_BINARY)
        return MT_EINVAL;
    *out = NULL;
    mt_prof_t *p = calloc(1, sizeof(*p));
    if (!p)
        return MT_ENOMEM;
    p->sink.emit = sink_emit;
    p->sink.emit_n = sink_emit_n;
    p->sink.oom_note = sink_oom_note;
    p->sink.stack = sink_stack;
    p->sink.recording = sink_recording;
    p->sink.source = sink_source;
    p->sink.claim = sink_claim;
    p->sink.write = sink_write;
    p->sink.write_batch = sink_write_batch;
    p->sink.ud = p;
    p->stacks = cfg->stacks >= MT_STACKS_OFF && cfg->stacks <= MT_STACKS_ALL ? cfg->stacks
                                                                             : MT_STACKS_SAMPLED;
    snprintf(p->oom_dir, sizeof p->oom_dir, "%.*s", (int)sizeof cfg->oom_dir, cfg->oom_dir);
    p->pid = (int)getpid();
    p->fd = -1;
    p->log_fd = -1;
    p->log = cfg->log;
    p->log_ud = cfg->log_ud;
    p->oom_interval_ms = cfg->oom_interval_ms;
    p->tag_name = cfg->tag_name;
    p->tag_ud = cfg->tag_ud;
    atomic_init(&p->lossless_ns, (uint64_t)cfg->lossless_stall_ms * 1000000u);
    p->drain_ms = cfg->drain_ms ? cfg->drain_ms : 20;
    p->log_format = cfg->log_format;
    pthread_mutex_init(&p->drain_lock, NULL);
    pthread_mutex_init(&p->src_lock, NULL);
    pthread_mutex_init(&p->stop_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->stop_cond, &ca);
    pthread_condattr_destroy(&ca);
    set_job(p, &cfg->job);
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
    if (rc == MT_EFBIG) {
        /* A file size limit (ulimit -f) below the ring: a smaller ring that fits, said. */
        uint64_t limit = mt__ring_fsize_limit();
        size_t want = mt__ring_file_size(slots, area);
        if (mt__ring_fit(limit, &slots, &area) == 0) {
            logf_(p, MT_LOG_WARN,
                  "memtrace: the file size limit (ulimit -f, %llu bytes) is below the event "
                  "ring's %zu bytes: using a ring of %u events%s",
                  (unsigned long long)limit, want, slots,
                  area ? "" : " without the call-stack table");
            rc = mt__ring_create_ex(&p->ring, slots, p->name, false, area);
        }
    }
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
        if (asz != 0 &&
            (mt__stab_create(&p->stab, a, asz) != 0 || mt__stab_view(&p->view, a, asz) != 0))
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
        else if (cfg->default_socket[0] != '\0')
            snprintf(path, sizeof(path), "%.*s", (int)sizeof cfg->default_socket,
                     cfg->default_socket);
        else if ((rc = mt__prof_socket_default(path, sizeof(path))) != 0)
            snprintf(err, sizeof(err), "socket path too long");
        if (rc == 0)
            rc = mt__prof_client_register(path, p->ring, &p->job, REGISTER_TIMEOUT_MS, &p->fd, err,
                                          sizeof(err));
        if (rc == 0) {
            /* The daemon has mapped the ring and removed its name. */
            mt__ring_unlink(p->ring);
            p->mode = MT_PROF_DAEMON;
            logf_(p, MT_LOG_INFO, "memtrace: recording to the daemon at %s (ring %s)", path,
                  mt__ring_name(p->ring));
            if (cfg->log_path != NULL && (p->cfg_log_path = strdup(cfg->log_path)) == NULL)
                logf_(p, MT_LOG_WARN, "memtrace: out of memory: the fallback log is the default");
            p->watching = pthread_create(&p->watcher, NULL, mt__prof_watcher_main, p) == 0;
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
        /* An impostor (another user's daemon) or a refusal (a limit of the daemon's) is
         * worth a warning; no daemon is not. */
        logf_(p, rc == -EPERM || rc == MT_EPROTO ? MT_LOG_WARN : MT_LOG_INFO,
              "memtrace: %s; falling back to the local log", err);
    }
    /* Local mode: the drainer thread in this process is the ring's only consumer, so
     * no other process needs the name. */
    mt__ring_unlink(p->ring);
    rc = mt__prof_log_start(p, cfg->log_path);
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
    free(p->enc);
    mt__oomsnap_destroy(&p->oomsnap);
    mt__stab_destroy(&p->stab);
    mt__stab_seen_free(&p->seen);
    pthread_mutex_destroy(&p->drain_lock);
    pthread_mutex_destroy(&p->src_lock);
    free(p->src);
    pthread_mutex_destroy(&p->stop_lock);
    pthread_cond_destroy(&p->stop_cond);
    free(p);
    return rc;
}

/* An allocator keeping events back registers (event.h, source). */
static void sink_source(void *ud, void (*push)(void *arg), void *arg, bool on)
{
    mt_prof_t *p = ud;
    pthread_mutex_lock(&p->src_lock);
    struct mt__prof_src_s *v = on ? mt__grow(p->src, &p->cap_src, p->nsrc + 1, sizeof *v, 4) : NULL;
    if (v != NULL) {
        p->src = v;
        p->src[p->nsrc++] = (struct mt__prof_src_s){push, arg};
    }
    for (size_t i = 0; !on && i < p->nsrc; i++)
        if (p->src[i].push == push && p->src[i].arg == arg) {
            p->src[i] = p->src[--p->nsrc];
            break;
        }
    pthread_mutex_unlock(&p->src_lock);
}

void mt__prof_push_sources(mt_prof_t *p, bool quiet, uint64_t *last)
{
    if (quiet) {
        mt__ring_stats_t st;
        mt__ring_stats(p->ring, &st);
        bool moved = st.emitted != *last;
        *last = st.emitted;
        if (moved)
            return; /* busy: the sources hand over on their own */
    }
    pthread_mutex_lock(&p->src_lock);
    for (size_t i = 0; i < p->nsrc; i++)
        p->src[i].push(p->src[i].arg);
    pthread_mutex_unlock(&p->src_lock);
    if (last != NULL) {
        mt__ring_stats_t st;
        mt__ring_stats(p->ring, &st);
        *last = st.emitted; /* what they handed over is not the program's activity */
    }
}

int mt_prof_flush(mt_prof_t *p)
{
    if (!p)
        return MT_EINVAL;
    mt__prof_push_sources(p, false, NULL); /* what the allocators keep back first */
    int mode = mode_of(p);
    if (mode == MT_PROF_DAEMON)
        return mt__prof_client_poke(p->fd) == 0 ? 0 : MT_EIO;
    if (mode != MT_PROF_LOG)
        return 0;
    pthread_mutex_lock(&p->drain_lock);
    mt__prof_log_drain(p);
    if (p->oomsnap != NULL)
        mt__oomsnap_flush(p->oomsnap); /* the OOM snapshots of what was drained */
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
    out->lossless_waits = atomic_load_explicit(&p->waits, memory_order_relaxed);
    out->lossless_wait_ns = atomic_load_explicit(&p->wait_ns, memory_order_relaxed);
    out->lossless_stalls = atomic_load_explicit(&p->stalls, memory_order_relaxed);
    out->lossless = atomic_load_explicit(&p->lossless_ns, memory_order_relaxed) != 0;
    if (out->mode == MT_PROF_LOG) {
        pthread_mutex_lock(&p->drain_lock);
        out->written = p->written;
        if (p->oomsnap != NULL)
            mt__oomsnap_stats(p->oomsnap, &out->oom_snapshots, &out->oom_snapshots_suppressed);
        pthread_mutex_unlock(&p->drain_lock);
    }
}

const char *mt_prof_log_path(const mt_prof_t *p)
{
    return p && mode_of(p) == MT_PROF_LOG ? p->log_path : NULL;
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
        mt__prof_log_drain(p);
        mt__ring_stats_t st;
        mt__ring_stats(p->ring, &st);
        mt__prof_log_line(
            p, mt__prof_exit_to_json(p->pid, true, st.emitted, st.dropped, st.lost, mono_ns()));
        mt__prof_log_flush(p);
        mt__prof_log_lost_report(p);
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
    for (int t = 0; t < MT_TAG_MAX; t++)
        free(p->bname[t]);
    free(p->out);
    free(p->out_seq);
    free(p->enc);
    free(p->src);
    if (ours) {
        pthread_mutex_destroy(&p->drain_lock);
        pthread_mutex_destroy(&p->src_lock);
        pthread_mutex_destroy(&p->stop_lock);
        pthread_cond_destroy(&p->stop_cond);
    }
    free(p);
    *pp = NULL;
}
