/* Snapshots of a process from the daemon (docs/torch-snapshot.md):
 * - a snapshot's trace is the newest events (at most MT_D_SNAPSHOT_EVENTS) of the process's
 *   one recent-event buffer, the web tracker's window (web.h, MT_D_WEB_WINDOW events),
 *   which the page's history scrubbing reads too;
 * - {"type":"snapshot","pid":N} on the Unix socket answers one JSON line with the
 *   process's recent events and device segment map (what `memtrace snapshot PID` turns
 *   into a PyTorch snapshot);
 * - an OOM event makes the daemon write that snapshot into the OOM directory, as memtrace
 *   JSON and as a PyTorch snapshot: oom-<pid>-dev<d>-<n>.{json,pickle}, n counting the
 *   OOMs of that process on that device from 1, the name the allocator's OOM message gives;
 *   at most cfg.oom_max_snapshots pairs are kept (the oldest go, before the new one is
 *   written). A process gets its first OOM's snapshot, then at most one per
 *   d->oom_interval_ms; the snapshot is copied on the loop and made and written on the
 *   daemon's writer thread (created at the first, joined by mt__d_destroy), one at a time, at most
 * MT_D_OOM_JOBS waiting: an OOM storm never stalls the loop (the drain, HTTP, signals). What is not
 * written is counted. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "analysis/torch_snapshot.h"
#include "daemon/internal.h"
#include "daemon/web.h"
#include "memtrace/prof.h"
#include "profiler/internal.h"
#include "util/assert.h"
#include "util/json.h"

/* The newest events of t's window in order, gaps and stats left out, at most
 * MT_D_SNAPSHOT_EVENTS (malloc'ed, *n of them; t NULL: none). */
static mt_event_rec_t *events_of(const mt_d_web_proc_t *t, size_t *n)
{
    size_t have = t ? t->wcount : 0, take = 0, from = have;
    while (from > 0 && take < MT_D_SNAPSHOT_EVENTS) {
        const mt_event_rec_t *ev = mt__d_web_window_at(t, --from);
        take += ev->kind != MT_EV_GAP && ev->kind != MT_EV_STATS;
    }
    mt_event_rec_t *evs = malloc((take ? take : 1) * sizeof *evs);
    *n = 0;
    for (size_t i = from; evs != NULL && i < have; i++) {
        const mt_event_rec_t *ev = mt__d_web_window_at(t, i);
        if (ev->kind != MT_EV_GAP && ev->kind != MT_EV_STATS)
            evs[(*n)++] = *ev;
    }
    mt_assert(evs == NULL || *n == take);
    return evs;
}

/* ---- the reply: memtrace JSON of a process's snapshot ---- */

/* What a snapshot is made of: a live process's own state (the request, on the loop) or a
 * job's copy of it (an OOM snapshot, on the pool). */
typedef struct snap_src_s {
    int pid;
    const char *name;
    json_t *process; /* taken by snapshot_json */
    const mt_event_rec_t *evs;
    size_t n;
    const mt_model_map_t *map; /* NULL: no segments, no blocks */
    const char (*labels)[MT_EVENT_LABEL_MAX + 1];
    const char *(*label)(void *ud, int tag); /* the line writer's tag names */
    void *ud;
} snap_src_t;

static json_t *hex(uint64_t v)
{
    char b[24];
    snprintf(b, sizeof b, "0x%llx", (unsigned long long)v);
    return json_string(b);
}

/* {"v":1,"type":"snapshot","pid",..,"process":{..},"events":[..],"segments":[..],
 *  "blocks":[..],"tags":{"7":"kv cache"}} of src. Takes src->process (even on failure).
 * New, or NULL. */
static json_t *snapshot_json(const snap_src_t *src)
{
    json_t *o = json_pack("{s:i, s:s, s:i, s:s, s:o}", "v", 1, "type", "snapshot", "pid", src->pid,
                          "name", src->name, "process", src->process);
    json_t *events = json_array(), *segs = json_array(), *blocks = json_array(),
           *tags = json_object();
    if (o == NULL || events == NULL || segs == NULL || blocks == NULL || tags == NULL)
        goto fail;
    /* Each part steals its value, also when it fails: a document short of one is none. */
    int bad = 0;
    char line[1024];
    for (size_t i = 0; i < src->n && !bad; i++) {
        size_t len =
            mt_prof_event_write(line, sizeof line, &src->evs[i], src->pid, src->label, src->ud);
        if (len >= sizeof line)
            continue; /* (an event line never fills a KiB) */
        json_error_t jerr;
        json_t *e = json_loadb(line, len, 0, &jerr);
        /* The writer's lines are JSON: only memory makes one fail to load. */
        bad |= e == NULL || json_array_append_new(events, e) != 0;
    }
    const mt_model_map_t *map = src->map;
    for (size_t i = 0; map != NULL && i < map->nsegs && !bad; i++) {
        const mt_model_seg_t *s = &map->segs[i];
        bad |= json_array_append_new(
            segs, json_pack("{s:o, s:I, s:I, s:s, s:b}", "addr", hex(s->addr), "size",
                            (json_int_t)s->size, "stream", (json_int_t)s->stream, "pool",
                            mt_pool_name(s->pool), "expandable", s->mapped));
    }
    for (size_t i = 0; map != NULL && i < map->nblocks && !bad; i++) {
        const mt_model_block_t *b = &map->blocks[i];
        bad |= json_array_append_new(blocks, json_pack("{s:o, s:I, s:i, s:b}", "addr", hex(b->addr),
                                                       "size", (json_int_t)b->size, "tag_id",
                                                       b->tag, "pending", b->pending));
    }
    for (int t = MT_TAG_USER_FIRST; t < MT_TAG_MAX; t++)
        if (src->labels[t][0] != '\0') {
            char k[8];
            snprintf(k, sizeof k, "%d", t);
            bad |= json_object_set_new(tags, k, json_string(src->labels[t]));
        }
    bad |= json_object_set_new(o, "events", events);
    bad |= json_object_set_new(o, "segments", segs);
    bad |= json_object_set_new(o, "blocks", blocks);
    bad |= json_object_set_new(o, "tags", tags);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
fail:
    if (o == NULL)
        json_decref(src->process); /* "o" steals it only when the pack succeeds */
    json_decref(o);
    json_decref(events);
    json_decref(segs);
    json_decref(blocks);
    json_decref(tags);
    return NULL;
}

/* The snapshot of live process p with events evs[0..n). New, or NULL. */
static json_t *proc_snapshot_json(const mt_d_proc_t *p, const mt_event_rec_t *evs, size_t n)
{
    mt_model_map_t map;
    bool have_map = mt__model_map(p->model, MT_MODEL_DEVICE, &map) == 0;
    snap_src_t src = {.pid = p->pid,
                      .name = p->name,
                      .process = mt__d_proc_json(p, false),
                      .evs = evs,
                      .n = n,
                      .map = have_map ? &map : NULL,
                      .labels = (const char(*)[MT_EVENT_LABEL_MAX + 1]) p->labels,
                      .label = mt__d_proc_label,
                      .ud = (void *)p};
    json_t *o = snapshot_json(&src);
    if (have_map)
        mt__model_map_free(&map);
    return o;
}

void mt__d_snapshot_request(mt_d_conn_t *c, json_t *msg)
{
    mt_d_t *d = c->d;
    json_t *jp = json_object_get(msg, "pid");
    const mt_d_proc_t *p = NULL;
    for (const mt_d_proc_t *q = d->procs; q != NULL && json_is_integer(jp); q = q->next)
        if (q->pid == json_integer_value(jp))
            p = q;
    json_t *reply;
    if (!json_is_integer(jp))
        reply = json_pack("{s:s}", "error", "snapshot: \"pid\" must be an integer");
    else if (p == NULL)
        reply = json_pack("{s:s, s:I}", "error", "snapshot: no such process", "pid",
                          json_integer_value(jp));
    else {
        size_t n;
        mt_event_rec_t *evs = events_of(mt__d_web_find(d, p), &n);
        reply = evs ? proc_snapshot_json(p, evs, n) : NULL;
        free(evs);
    }
    char *s = NULL;
    size_t len = 0;
    int rc = reply ? mt__json_dumps(reply, JSON_COMPACT, &s, &len) : MT_ENOMEM;
    json_decref(reply);
    c->kind = MT_D_CONN_DONE;
    if (rc) {
        static const char oom[] = "{\"error\":\"out of memory\"}\n";
        mt__d_conn_write(c, oom, sizeof oom - 1, true);
        return;
    }
    s[len] = '\n'; /* the text's NUL becomes the line's end */
    mt__d_conn_write(c, s, len + 1, true);
    free(s);
}

/* ---- OOM snapshots ---- */

int mt__d_oom_dir(char *buf, size_t len)
{
    return mt_prof_oom_dir(buf, len); /* one rule for the daemon and the recorder */
}

#define OOM_NICE 10 /* the pool thread's niceness while it makes a snapshot */

/* An OOM snapshot in the making: copies of what it needs, taken on the loop. */
struct mt_d_oom_job_s {
    struct mt_d_oom_job_s *next; /* d->oom_queue */
    mt_d_t *d;
    int pid;
    unsigned device;
    uint64_t since; /* OOMs of the process that got no snapshot since its previous one */
    unsigned keep;  /* cfg.oom_max_snapshots */
    int rc;         /* the writer's result */
    char dir[512], name[MT_RING_COMM_MAX], base[64];
    char labels[MT_TAG_MAX][MT_EVENT_LABEL_MAX + 1];
    char names[MT_TAG_MAX][MT_EVENT_LABEL_MAX + 1];
    json_t *process; /* new: mt__d_proc_json */
    mt_event_rec_t *evs;
    size_t nevs;
    mt_model_map_t map;
    bool have_map;
};

/* A tag's label in a job's copy of its process's names (the line writer's callback). */
static const char *job_label(void *ud, int tag)
{
    const mt_d_oom_job_t *j = ud;
    return tag >= 0 && tag < MT_TAG_MAX && j->names[tag][0] ? j->names[tag] : NULL;
}

/* On the writer thread: everything here is the job's own copy, nothing of the loop's.
 * At a lower priority for its duration: a snapshot is background work, and on a busy
 * machine it must not take the CPU from the loop (the drain, HTTP, signals). */
static void oom_work(mt_d_oom_job_t *j)
{
    pid_t tid = (pid_t)syscall(SYS_gettid); /* Linux: the priority of this thread alone */
    errno = 0;
    int prio = getpriority(PRIO_PROCESS, (id_t)tid);
    bool reniced = errno == 0 && setpriority(PRIO_PROCESS, (id_t)tid, OOM_NICE) == 0;
    snap_src_t src = {.pid = j->pid,
                      .name = j->name,
                      .process = j->process,
                      .evs = j->evs,
                      .n = j->nevs,
                      .map = j->have_map ? &j->map : NULL,
                      .labels = (const char(*)[MT_EVENT_LABEL_MAX + 1]) j->labels,
                      .label = job_label,
                      .ud = j};
    j->process = NULL; /* snapshot_json took it */
    json_t *doc = snapshot_json(&src);
    char *text = NULL;
    int rc = doc ? mt__json_dumps(doc, JSON_COMPACT, &text, NULL) : MT_ENOMEM;
    json_decref(doc);
    /* The PyTorch snapshot: the recent events as the trace, the model's map as segments. */
    mt_ts_t *ts = NULL;
    char err[256], *pk = NULL;
    size_t pklen = 0;
    if (rc == 0 && !j->have_map)
        rc = MT_ENOMEM;
    if (rc == 0) {
        mt_ts_source_t ts_src = {
            .evs = j->evs, .nevs = j->nevs, .map = &j->map, .tag_name = job_label, .ud = j};
        rc = mt__ts_from_events(&ts, &ts_src, err, sizeof err);
    }
    FILE *mem = rc == 0 ? open_memstream(&pk, &pklen) : NULL;
    if (rc == 0 && mem == NULL)
        rc = MT_ENOMEM;
    if (mem != NULL) {
        rc = mt__ts_write(ts, mem, 2);
        if (fclose(mem) != 0 && rc == 0)
            rc = MT_EIO;
    }
    if (rc == 0)
        rc = mt__oomsnap_write_pair(j->dir, j->keep, j->base, text, strlen(text), pk, pklen);
    j->rc = rc;
    mt__ts_destroy(&ts);
    free(pk);
    free(text);
    /* Back, where we may (RLIMIT_NICE); else the thread stays lower: it does nothing else. */
    if (reniced)
        (void)setpriority(PRIO_PROCESS, (id_t)tid, prio);
}

static void oom_job_free(mt_d_oom_job_t *j)
{
    json_decref(j->process);
    free(j->evs);
    if (j->have_map)
        mt__model_map_free(&j->map);
    free(j);
}

static void oom_start_next(mt_d_t *d);

/* Back on the loop: the result counted and said, the next job started. */
static void oom_done(mt_d_t *d, mt_d_oom_job_t *j)
{
    int rc = j->rc;
    if (rc == 0) {
        d->ctr.oom_snapshots++;
        mt__d_log(d, MT_LOG_INFO,
                  "process %d ran out of memory on device %u: wrote %s/%s.json and .pickle (%llu "
                  "OOMs of it since its previous snapshot got none)",
                  j->pid, j->device, j->dir, j->base, (unsigned long long)j->since);
    } else {
        d->ctr.oom_snapshots_failed++;
        mt__d_log(d, MT_LOG_WARN, "OOM snapshot %s/%s: %s", j->dir, j->base,
                  rc == MT_EIO ? "not a private directory of ours, or it cannot be written"
                               : mt_strerror(rc));
    }
    d->oom_running = NULL;
    d->oom_jobs--;
    oom_job_free(j);
    oom_start_next(d);
    if (d->stopping)
        mt__d_snapshot_shutdown(d);
}

static void *oom_writer_main(void *arg)
{
    mt_d_t *d = arg;
    pthread_mutex_lock(&d->oom_mu);
    for (;;) {
        while (d->oom_handoff == NULL && !d->oom_quit)
            pthread_cond_wait(&d->oom_cv, &d->oom_mu);
        if (d->oom_handoff == NULL)
            break;
        mt_d_oom_job_t *j = d->oom_handoff;
        d->oom_handoff = NULL;
        pthread_mutex_unlock(&d->oom_mu);
        oom_work(j);
        pthread_mutex_lock(&d->oom_mu);
        d->oom_finished = true;
        uv_async_send(&d->oom_async); /* safe from any thread */
    }
    pthread_mutex_unlock(&d->oom_mu);
    return NULL;
}

static void on_oom_async(uv_async_t *h)
{
    mt_d_t *d = h->data;
    pthread_mutex_lock(&d->oom_mu);
    bool finished = d->oom_finished;
    d->oom_finished = false;
    pthread_mutex_unlock(&d->oom_mu);
    if (finished && d->oom_running != NULL)
        oom_done(d, d->oom_running);
}

static void on_oom_async_closed(uv_handle_t *h)
{
    mt_d_t *d = h->data;
    d->open_handles--;
}

/* The writer thread and its handle on the loop, at the first snapshot. MT_EIO. */
static int oom_writer_start(mt_d_t *d)
{
    if (d->oom_writer_on)
        return 0;
    if (uv_async_init(d->loop, &d->oom_async, on_oom_async) != 0)
        return MT_EIO;
    d->oom_async.data = d;
    d->open_handles++;
    d->oom_async_open = true;
    pthread_mutex_init(&d->oom_mu, NULL);
    pthread_cond_init(&d->oom_cv, NULL);
    d->oom_handoff = NULL;
    d->oom_finished = d->oom_quit = false;
    if (pthread_create(&d->oom_writer, NULL, oom_writer_main, d) != 0) {
        pthread_cond_destroy(&d->oom_cv);
        pthread_mutex_destroy(&d->oom_mu);
        d->oom_async_open = false;
        uv_close((uv_handle_t *)&d->oom_async, on_oom_async_closed);
        return MT_EIO;
    }
    d->oom_writer_on = true;
    return 0;
}

static void oom_start_next(mt_d_t *d)
{
    mt_d_oom_job_t *j = d->oom_queue;
    if (d->oom_running != NULL || j == NULL)
        return;
    d->oom_queue = j->next;
    j->next = NULL;
    if (oom_writer_start(d) != 0) {
        d->oom_jobs--;
        d->ctr.oom_snapshots_failed++;
        mt__d_log(d, MT_LOG_WARN, "OOM snapshot %s/%s: no writer thread", j->dir, j->base);
        oom_job_free(j);
        oom_start_next(d);
        return;
    }
    d->oom_running = j;
    pthread_mutex_lock(&d->oom_mu);
    d->oom_handoff = j;
    pthread_cond_signal(&d->oom_cv);
    pthread_mutex_unlock(&d->oom_mu);
}

void mt__d_snapshot_shutdown(mt_d_t *d)
{
    if (d->oom_async_open && d->oom_jobs == 0) {
        d->oom_async_open = false;
        uv_close((uv_handle_t *)&d->oom_async, on_oom_async_closed);
    }
}

void mt__d_snapshot_close(mt_d_t *d)
{
    if (!d->oom_writer_on)
        return;
    pthread_mutex_lock(&d->oom_mu);
    d->oom_quit = true;
    pthread_cond_signal(&d->oom_cv);
    pthread_mutex_unlock(&d->oom_mu);
    pthread_join(d->oom_writer, NULL);
    pthread_cond_destroy(&d->oom_cv);
    pthread_mutex_destroy(&d->oom_mu);
    d->oom_writer_on = false;
}

/* A copy of what p's snapshot needs, queued for the pool (copies: the loop goes on changing
 * p's model and window meanwhile). MT_ENOMEM. */
static int oom_enqueue(mt_d_t *d, const mt_d_proc_t *p, const mt_d_web_proc_t *t,
                       const mt_event_rec_t *ev, uint64_t since)
{
    mt_d_oom_job_t *j = calloc(1, sizeof *j);
    if (j == NULL)
        return MT_ENOMEM;
    j->d = d;
    j->pid = p->pid;
    j->device = ev->device;
    j->since = since;
    j->keep = d->cfg.oom_max_snapshots;
    snprintf(j->dir, sizeof j->dir, "%s", d->oom_dir);
    snprintf(j->name, sizeof j->name, "%s", p->name);
    snprintf(j->base, sizeof j->base, "oom-%d-dev%u-%u", p->pid, ev->device, t->ooms[ev->device]);
    memcpy(j->labels, p->labels, sizeof j->labels);
    memcpy(j->names, p->names, sizeof j->names);
    j->evs = events_of(t, &j->nevs);
    j->process = mt__d_proc_json(p, false);
    j->have_map = mt__model_map(p->model, MT_MODEL_DEVICE, &j->map) == 0;
    if (j->evs == NULL || j->process == NULL || !j->have_map) {
        oom_job_free(j);
        return MT_ENOMEM;
    }
    mt_d_oom_job_t **tail = &d->oom_queue;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = j;
    d->oom_jobs++;
    oom_start_next(d);
    return 0;
}

/* Whether p's OOM now gets a snapshot: p's first does, then one per interval by the
 * daemon's clock (not the producer's: a producer's time stamps are its own to forge), and
 * only while fewer than MT_D_OOM_JOBS are waiting for the disk, whatever the processes. */
static bool oom_due(mt_d_t *d, mt_d_proc_t *p)
{
    uint64_t now = uv_now(d->loop);
    if (d->oom_interval_ms > 0 && p->oom_snapped && now - p->oom_snap_ms < d->oom_interval_ms)
        return false;
    return d->oom_jobs < MT_D_OOM_JOBS;
}

void mt__d_snapshot_event(mt_d_t *d, mt_d_proc_t *p, const mt_event_rec_t *ev)
{
    if (ev->kind != MT_EV_OOM || ev->pool == MT_POOL_HOST)
        return;
    mt_d_web_proc_t *t = mt__d_web_find(d, p);
    if (t == NULL)
        return; /* not tracked (out of memory): no events to write */
    t->ooms[ev->device]++;
    if (d->oom_dir[0] == '\0')
        return;
    if (d->stopping || !oom_due(d, p)) {
        d->ctr.oom_snapshots_suppressed++;
        p->oom_since++;
        return;
    }
    if (oom_enqueue(d, p, t, ev, p->oom_since) != 0) {
        d->ctr.oom_snapshots_failed++;
        mt__d_log(d, MT_LOG_WARN, "OOM snapshot of %d: %s", p->pid, mt_strerror(MT_ENOMEM));
        return;
    }
    p->oom_snapped = true;
    p->oom_snap_ms = uv_now(d->loop);
    p->oom_since = 0;
}

void mt__d_snapshot_init(mt_d_t *d)
{
    d->oom_dir[0] = '\0';
    if (d->cfg.oom_dir != NULL)
        snprintf(d->oom_dir, sizeof d->oom_dir, "%s", d->cfg.oom_dir);
    else
        snprintf(d->oom_dir, sizeof d->oom_dir, "%.*s", (int)sizeof d->cfg.default_oom_dir,
                 d->cfg.default_oom_dir);
    if (strcmp(d->oom_dir, "off") == 0)
        d->oom_dir[0] = '\0';
    d->oom_interval_ms = MT_PROF_OOM_INTERVAL_MS;
    if (d->cfg.oom_interval_ms >= 0)
        d->oom_interval_ms = (unsigned)d->cfg.oom_interval_ms;
}
