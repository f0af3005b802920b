/* OOM snapshots (docs/torch-snapshot.md): the files' rules, shared with the daemon, and the
 * recorder's own snapshot when there is no daemon. In local mode the drainer follows the
 * events (segments through util/segmap, the analysis model's reading of them; live blocks;
 * the last OOMSNAP_RECENT events) and at each OOM writes
 * oom-<pid>-dev<d>-<n>.pickle, a PyTorch 2.x snapshot, and .json, the same as memtrace
 * JSON, into the OOM directory: the name the allocator's message already gave. A program
 * that catches OOMs and retries makes thousands a second: the first gets a snapshot, then
 * one per interval, and the files are written by a thread of their own: the drainer (and
 * the ring behind it) waits for the disk only when a snapshot is due while the previous one
 * is still being written, at most once per interval. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "memtrace/alloc.h"
#include "memtrace/prof.h"
#include "profiler/internal.h"
#include "profiler/pickle_write.h"
#include "util/addrmap.h"
#include "util/assert.h"
#include "util/grow.h"
#include "util/log.h"
#include "util/segmap.h"

/* ---- the recorder's follower ---- */

#define OOMSNAP_RECENT 4096 /* events kept for the trace */

typedef mt__oomsnap_block_t blk_t;

/* A snapshot on its way to the disk: both files, serialised. */
typedef struct job_s {
    char base[64]; /* oom-<pid>-dev<d>-<n> */
    char *json, *pickle;
    size_t json_len, pickle_len;
    uint64_t suppressed; /* OOMs without a snapshot since the previous one */
} job_t;

/* Invariants: segs reads the segment events as the analysis model does (util/segmap.h);
 * blocks[0..nblocks) are the live blocks, distinct addresses, and at maps each one's addr
 * to its index (at.n = nblocks); recent holds the last n events, head the next slot. The
 * follower's fields belong to the drainer (drain_lock), the writer's to mu. A job is pending or
 * being written iff busy; at most one is, so a storm holds one job's memory at most. */
struct mt__oomsnap_s {
    int pid;
    char dir[256];
    unsigned keep;        /* pairs kept in dir, >= 1 */
    uint64_t interval_ns; /* between two snapshots, by the events' clock; 0 = every OOM */
    mt_log_cb log;
    void *log_ud;
    mt__segmap_t segs;
    blk_t *blocks;
    size_t nblocks, cap_blocks;
    mt__amap_t at; /* addr -> index in blocks */
    mt_event_rec_t recent[OOMSNAP_RECENT];
    size_t head, n;
    uint32_t ooms[256];
    bool have_last;      /* a snapshot was handed to the writer */
    uint64_t last_ns;    /* its OOM's time_ns */
    uint64_t since_last; /* OOMs suppressed since then (said with the next one) */
    uint64_t suppressed; /* OOMs that got no snapshot: within the interval */
    /* The writer thread, started at the first snapshot (most programs never run out of
     * memory: they get no idle thread), joined in destroy. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t writer;
    bool writer_on, busy, quit; /* under mu */
    job_t *job;                 /* under mu: the pending one, taken by the writer */
    uint64_t written, failed;   /* under mu: snapshots written, and that could not be */
};

#define logf_(s, lvl, ...) mt__logf((s)->log, (s)->log_ud, lvl, __VA_ARGS__)

static void job_free(job_t *j)
{
    if (j != NULL) {
        free(j->json);
        free(j->pickle);
        free(j);
    }
}

static void *writer_main(void *arg)
{
    mt__oomsnap_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->job == NULL && !s->quit)
            pthread_cond_wait(&s->cv, &s->mu);
        job_t *j = s->job;
        if (j == NULL)
            break; /* quit, and nothing pending */
        s->job = NULL;
        pthread_mutex_unlock(&s->mu);
        int rc = mt__oomsnap_write_pair(s->dir, s->keep, j->base, j->json, j->json_len, j->pickle,
                                        j->pickle_len);
        if (rc == 0 && j->suppressed > 0)
            logf_(s, MT_LOG_ERROR,
                  "memtrace: out of memory: wrote %s/%s.pickle (%llu OOMs since the previous "
                  "snapshot got none: at most one per %llu ms)",
                  s->dir, j->base, (unsigned long long)j->suppressed,
                  (unsigned long long)(s->interval_ns / 1000000u));
        else if (rc == 0)
            logf_(s, MT_LOG_ERROR, "memtrace: out of memory: wrote %s/%s.pickle", s->dir, j->base);
        else
            logf_(s, MT_LOG_WARN, "memtrace: OOM snapshot %s/%s: %s", s->dir, j->base,
                  rc == MT_EIO ? "not a private directory of ours" : mt_strerror(rc));
        job_free(j);
        pthread_mutex_lock(&s->mu);
        s->written += rc == 0;
        s->failed += rc != 0;
        s->busy = false;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int mt__oomsnap_create(mt__oomsnap_t **out, const mt__oomsnap_cfg_t *cfg)
{
    *out = NULL;
    mt__oomsnap_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return MT_ENOMEM;
    s->pid = cfg->pid;
    snprintf(s->dir, sizeof s->dir, "%s", cfg->dir);
    s->keep = cfg->keep ? cfg->keep : 1;
    s->interval_ns = (uint64_t)cfg->interval_ms * 1000000u;
    s->log = cfg->log;
    s->log_ud = cfg->log_ud;
    if (pthread_mutex_init(&s->mu, NULL) != 0)
        goto fail_mutex;
    if (pthread_cond_init(&s->cv, NULL) != 0)
        goto fail_cond;
    *out = s;
    return 0;

fail_cond:
    pthread_mutex_destroy(&s->mu);
fail_mutex:
    free(s);
    return MT_ENOMEM;
}

void mt__oomsnap_destroy(mt__oomsnap_t **p)
{
    mt__oomsnap_t *s = *p;
    if (s == NULL)
        return;
    /* A forked child's copy: the writer thread is the parent's, and mu may have been held
     * at the fork; only the memory is the child's own. */
    bool ours = s->pid == (int)getpid();
    if (ours && s->writer_on) {
        pthread_mutex_lock(&s->mu);
        s->quit = true; /* the pending job is written first */
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->writer, NULL);
    }
    if (ours && s->suppressed > 0)
        logf_(s, MT_LOG_WARN,
              "memtrace: %llu of %llu OOMs got no snapshot (at most one per %llu ms: "
              "MEMTRACE_OOM_INTERVAL_MS)",
              (unsigned long long)s->suppressed,
              (unsigned long long)(s->suppressed + s->written + s->failed),
              (unsigned long long)(s->interval_ns / 1000000u));
    if (ours) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
    }
    job_free(s->job);
    mt__segmap_fini(&s->segs);
    mt__amap_fini(&s->at);
    free(s->blocks);
    free(s);
    *p = NULL;
}

void mt__oomsnap_stats(mt__oomsnap_t *s, uint64_t *written, uint64_t *suppressed)
{
    pthread_mutex_lock(&s->mu);
    *written = s->written;
    pthread_mutex_unlock(&s->mu);
    *suppressed = s->suppressed;
}

/* The live block at addr, or NULL. */
static blk_t *blk_find(mt__oomsnap_t *s, uint64_t addr)
{
    uint64_t i;
    return mt__amap_get(&s->at, addr, &i) == 0 ? &s->blocks[i] : NULL;
}

static void blk_alloc(mt__oomsnap_t *s, const mt_event_rec_t *ev)
{
    blk_t b = {ev->addr, ev->size, ev->requested, ev->tag, 0, ev->device}, *old;
    if ((old = blk_find(s, ev->addr)) != NULL) {
        *old = b; /* its free was not seen */
        return;
    }
    blk_t *v = mt__grow(s->blocks, &s->cap_blocks, s->nblocks + 1, sizeof *v, 1024);
    if (v == NULL)
        return; /* the snapshot then misses this block */
    s->blocks = v;
    if (mt__amap_put(&s->at, ev->addr, s->nblocks) == 0)
        s->blocks[s->nblocks++] = b;
}

/* The last block moves into the freed one's place. */
static void blk_free(mt__oomsnap_t *s, uint64_t addr)
{
    uint64_t i;
    if (mt__amap_get(&s->at, addr, &i) != 0)
        return;
    mt__amap_del(&s->at, addr);
    blk_t last = s->blocks[--s->nblocks];
    if (i < s->nblocks) {
        s->blocks[i] = last;
        mt__amap_put(&s->at, last.addr, i); /* replaces: no allocation */
    }
}

static void seg_add(mt__oomsnap_t *s, const mt_event_rec_t *ev)
{
    mt__seg_t g = {.addr = ev->addr,
                   .size = ev->size,
                   .stream = ev->stream,
                   .device = ev->device,
                   .pool = ev->pool,
                   .mapped = ev->kind == MT_EV_SEGMENT_MAP};
    (void)mt__segmap_add(&s->segs, &g); /* MT_ENOMEM: the snapshot then misses it */
}

static void follow(mt__oomsnap_t *s, const mt_event_rec_t *ev)
{
    blk_t *b;
    switch (ev->kind) {
    case MT_EV_ALLOC:
        blk_alloc(s, ev);
        break;
    case MT_EV_FREE_REQUESTED:
        if ((b = blk_find(s, ev->addr)) != NULL)
            b->pending = 1;
        break;
    case MT_EV_FREE_COMPLETED:
        blk_free(s, ev->addr);
        break;
    case MT_EV_SEGMENT_ALLOC:
    case MT_EV_SEGMENT_MAP:
        seg_add(s, ev);
        break;
    case MT_EV_SEGMENT_FREE:
    case MT_EV_SEGMENT_UNMAP:
        (void)mt__segmap_cut(&s->segs, ev->addr, ev->size);
        break;
    default:
        break;
    }
    mt_assert_expensive(mt__oomsnap_check(s, NULL, 0) == 0);
}

void mt__oomsnap_view(const mt__oomsnap_t *s, const mt__segmap_t **segs,
                      const mt__oomsnap_block_t **blocks, size_t *nblocks)
{
    *segs = &s->segs;
    *blocks = s->blocks;
    *nblocks = s->nblocks;
}

int mt__oomsnap_check(const mt__oomsnap_t *s, char *why, size_t whylen)
{
    int rc = mt__segmap_check(&s->segs, why, whylen);
    if (rc == 0)
        rc = mt__amap_check(&s->at, why, whylen);
    if (rc == 0 && s->at.n != s->nblocks) {
        if (why)
            snprintf(why, whylen, "oomsnap: %zu blocks, %zu in the address table", s->nblocks,
                     s->at.n);
        return MT_EPROTO;
    }
    for (size_t i = 0; rc == 0 && i < s->nblocks; i++) {
        uint64_t k;
        if (mt__amap_get(&s->at, s->blocks[i].addr, &k) != 0 || k != i) {
            if (why)
                snprintf(why, whylen, "oomsnap: block %zu at %#llx not indexed", i,
                         (unsigned long long)s->blocks[i].addr);
            return MT_EPROTO;
        }
    }
    return rc;
}

/* ---- writing the snapshot ---- */

static int cmp_blk(const void *a, const void *b)
{
    const blk_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

typedef struct snapw_s {
    mt__pkw_t w;
    uint32_t tag_memo[MT_TAG_MAX]; /* memo index + 1 of the tag's frames list */
    const char (*labels)[MT_EVENT_LABEL_MAX + 1];
} snapw_t;

static void kv_int(mt__pkw_t *w, const char *k, int64_t v)
{
    mt__pkw_str(w, k);
    mt__pkw_int(w, v);
}

/* The tag as a frame list, written once and then referred to through the memo. */
static void tag_frames(snapw_t *o, int tag)
{
    mt__pkw_str(&o->w, "frames");
    if (tag < 0 || tag >= MT_TAG_MAX)
        tag = MT_TAG_OTHER;
    if (o->tag_memo[tag] != 0) {
        mt__pkw_get(&o->w, o->tag_memo[tag] - 1);
        return;
    }
    o->tag_memo[tag] = mt__pkw_put_next(&o->w) + 1;
    char name[64];
    snprintf(name, sizeof name, "tag %s",
             o->labels[tag][0]         ? o->labels[tag]
             : tag < MT_TAG_USER_FIRST ? mt_tag_builtin_name(tag)
                                       : "other");
    mt__pkw_list_begin(&o->w);
    mt__pkw_dict_begin(&o->w);
    mt__pkw_str(&o->w, "name");
    mt__pkw_str(&o->w, name);
    mt__pkw_str(&o->w, "filename");
    mt__pkw_str(&o->w, "memtrace");
    kv_int(&o->w, "line", tag);
    mt__pkw_dict_end(&o->w);
    mt__pkw_list_end(&o->w);
}

static void block(snapw_t *o, uint64_t addr, uint64_t size, uint64_t requested, const char *state,
                  int tag)
{
    mt__pkw_dict_begin(&o->w);
    kv_int(&o->w, "address", (int64_t)addr);
    kv_int(&o->w, "size", (int64_t)size);
    kv_int(&o->w, "requested_size", (int64_t)requested);
    mt__pkw_str(&o->w, "state");
    mt__pkw_str(&o->w, state);
    if (tag < 0) {
        mt__pkw_str(&o->w, "frames");
        mt__pkw_list_begin(&o->w);
        mt__pkw_list_end(&o->w);
    } else
        tag_frames(o, tag);
    mt__pkw_dict_end(&o->w);
}

static void segments(snapw_t *o, const mt__segmap_t *segs, const blk_t *blks, size_t nblks)
{
    mt__pkw_str(&o->w, "segments");
    mt__pkw_list_begin(&o->w);
    size_t b = 0;
    for (mt__segmap_it_t it = mt__segmap_first(segs); !mt__segmap_end(it); mt__segmap_next(&it)) {
        const mt__seg_t *g = mt__segmap_get(it);
        uint64_t end = g->addr + g->size, at = g->addr, alloc = 0, active = 0, req = 0;
        size_t first = b;
        while (first < nblks && blks[first].addr < g->addr)
            first++; /* a block outside every segment (recording began late) */
        for (b = first; b < nblks && blks[b].addr < end; b++) {
            active += blks[b].size;
            if (!blks[b].pending) {
                alloc += blks[b].size;
                req += blks[b].requested;
            }
        }
        mt__pkw_dict_begin(&o->w);
        kv_int(&o->w, "device", g->device);
        kv_int(&o->w, "address", (int64_t)g->addr);
        kv_int(&o->w, "total_size", (int64_t)g->size);
        kv_int(&o->w, "allocated_size", (int64_t)alloc);
        kv_int(&o->w, "active_size", (int64_t)active);
        kv_int(&o->w, "requested_size", (int64_t)req);
        kv_int(&o->w, "stream", g->stream);
        mt__pkw_str(&o->w, "segment_type");
        mt__pkw_str(&o->w, g->pool == MT_POOL_SMALL ? "small" : "large");
        mt__pkw_str(&o->w, "segment_pool_id");
        mt__pkw_tuple_begin(&o->w);
        mt__pkw_int(&o->w, 0);
        mt__pkw_int(&o->w, 0);
        mt__pkw_tuple_end(&o->w);
        mt__pkw_str(&o->w, "is_expandable");
        mt__pkw_bool(&o->w, g->mapped);
        mt__pkw_str(&o->w, "frames");
        mt__pkw_list_begin(&o->w);
        mt__pkw_list_end(&o->w);
        mt__pkw_str(&o->w, "blocks");
        mt__pkw_list_begin(&o->w);
        for (size_t k = first; k < b; k++) {
            uint64_t size = blks[k].size < end - blks[k].addr ? blks[k].size : end - blks[k].addr;
            if (blks[k].addr > at)
                block(o, at, blks[k].addr - at, 0, "inactive", -1);
            block(o, blks[k].addr, size, blks[k].requested ? blks[k].requested : size,
                  blks[k].pending ? "active_pending_free" : "active_allocated", blks[k].tag);
            at = blks[k].addr + size;
        }
        if (at < end)
            block(o, at, end - at, 0, "inactive", -1);
        mt__pkw_list_end(&o->w);
        mt__pkw_dict_end(&o->w);
    }
    mt__pkw_list_end(&o->w);
}

static void trace(snapw_t *o, const mt__oomsnap_t *s, unsigned ndev)
{
    mt__pkw_str(&o->w, "device_traces");
    mt__pkw_list_begin(&o->w);
    for (unsigned d = 0; d < ndev; d++) {
        mt__pkw_list_begin(&o->w);
        for (size_t i = 0; i < s->n; i++) {
            const mt_event_rec_t *ev =
                &s->recent[(s->head + OOMSNAP_RECENT - s->n + i) % OOMSNAP_RECENT];
            /* memtrace's kind names are PyTorch's actions, from alloc to oom. */
            if (ev->device != d || ev->pool == MT_POOL_HOST || ev->kind < MT_EV_ALLOC ||
                ev->kind > MT_EV_OOM)
                continue;
            bool blockish = ev->kind <= MT_EV_FREE_COMPLETED;
            mt__pkw_dict_begin(&o->w);
            mt__pkw_str(&o->w, "action");
            mt__pkw_str(&o->w, mt_event_kind_name(ev->kind));
            if (ev->kind == MT_EV_OOM) {
                kv_int(&o->w, "device_free", (int64_t)ev->size);
                kv_int(&o->w, "size", (int64_t)ev->requested);
            } else {
                kv_int(&o->w, "addr", (int64_t)ev->addr);
                kv_int(&o->w, "size",
                       (int64_t)(blockish && ev->requested ? ev->requested : ev->size));
            }
            kv_int(&o->w, "stream", ev->stream);
            kv_int(&o->w, "time_us", (int64_t)(ev->time_ns / 1000));
            if (ev->kind == MT_EV_ALLOC)
                kv_int(&o->w, "memtrace_size", (int64_t)ev->size);
            if (blockish)
                tag_frames(o, ev->tag);
            else {
                mt__pkw_str(&o->w, "frames");
                mt__pkw_list_begin(&o->w);
                mt__pkw_list_end(&o->w);
            }
            mt__pkw_dict_end(&o->w);
        }
        mt__pkw_list_end(&o->w);
    }
    mt__pkw_list_end(&o->w);
}

/* Writes the PyTorch snapshot into f. 0 or MT_E*. */
static int write_pickle(mt__oomsnap_t *s, FILE *f, const char (*labels)[MT_EVENT_LABEL_MAX + 1])
{
    blk_t *blks = malloc((s->nblocks + 1) * sizeof *blks);
    if (blks == NULL)
        return MT_ENOMEM;
    if (s->nblocks > 0) /* memcpy from NULL is undefined even for 0 bytes */
        memcpy(blks, s->blocks, s->nblocks * sizeof *blks);
    size_t nb = s->nblocks;
    unsigned ndev = 1;
    qsort(blks, nb, sizeof *blks, cmp_blk);
    for (size_t i = 0; i < s->n; i++) {
        unsigned d = s->recent[i].device;
        ndev = d + 1u > ndev ? d + 1u : ndev;
    }
    snapw_t o = {.labels = labels};
    mt__pkw_init(&o.w, f);
    mt__pkw_dict_begin(&o.w);
    segments(&o, &s->segs, blks, nb);
    trace(&o, s, ndev);
    mt__pkw_str(&o.w, "allocator_settings");
    mt__pkw_dict_begin(&o.w);
    mt__pkw_str(&o.w, "PYTORCH_CUDA_ALLOC_CONF");
    mt__pkw_str(&o.w, "");
    mt__pkw_dict_end(&o.w);
    mt__pkw_str(&o.w, "external_annotations");
    mt__pkw_list_begin(&o.w);
    mt__pkw_list_end(&o.w);
    mt__pkw_dict_end(&o.w);
    free(blks);
    return mt__pkw_finish(&o.w);
}

/* The memtrace JSON: the recent events as the log writes them. */
static int write_json(mt__oomsnap_t *s, FILE *f, const char *(*tag_name)(void *, int), void *ud)
{
    fprintf(f, "{\"v\":1,\"type\":\"snapshot\",\"pid\":%d,\"source\":\"recorder\",\"events\":[",
            s->pid);
    char line[2048];
    for (size_t i = 0; i < s->n; i++) {
        const mt_event_rec_t *ev =
            &s->recent[(s->head + OOMSNAP_RECENT - s->n + i) % OOMSNAP_RECENT];
        size_t len = mt_prof_event_write(line, sizeof line, ev, s->pid, tag_name, ud);
        if (len < sizeof line && len > 0)
            fprintf(f, "%s%.*s", i ? "," : "", (int)(len - 1), line); /* without its '\n' */
    }
    fprintf(f, "]}\n");
    return ferror(f) ? MT_EIO : 0;
}

/* Serialises one file of the snapshot into *buf (new). */
static int serialise(mt__oomsnap_t *s, bool pickle, const char (*labels)[MT_EVENT_LABEL_MAX + 1],
                     const char *(*tag_name)(void *, int), void *ud, char **buf, size_t *len)
{
    FILE *f = open_memstream(buf, len);
    if (f == NULL)
        return MT_ENOMEM;
    int rc = pickle ? write_pickle(s, f, labels) : write_json(s, f, tag_name, ud);
    if (fclose(f) != 0 && rc == 0)
        rc = MT_ENOMEM;
    return rc;
}

/* Whether the OOM at time t gets a snapshot: the first does, then one per interval by the
 * events' own clock, so the choice depends neither on how late the drainer runs nor on the
 * disk. A due one waits for the writer to finish the previous: at most one write per
 * interval of the program's time. Takes the writer's slot (busy) when it answers true. */
static bool due(mt__oomsnap_t *s, uint64_t t)
{
    if (s->interval_ns > 0 && s->have_last && (t < s->last_ns || t - s->last_ns < s->interval_ns))
        return false;
    pthread_mutex_lock(&s->mu);
    while (s->busy)
        pthread_cond_wait(&s->cv, &s->mu);
    s->busy = true;
    pthread_mutex_unlock(&s->mu);
    return true;
}

void mt__oomsnap_flush(mt__oomsnap_t *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->busy)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* Gives j (NULL: it could not be made) to the writer, started on first use. */
static void hand_over(mt__oomsnap_t *s, job_t *j)
{
    pthread_mutex_lock(&s->mu);
    if (j != NULL && !s->writer_on)
        s->writer_on = pthread_create(&s->writer, NULL, writer_main, s) == 0;
    if (j != NULL && s->writer_on) {
        s->job = j;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->failed++;
    s->busy = false;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    job_free(j);
    logf_(s, MT_LOG_WARN, "memtrace: OOM snapshot: %s", mt_strerror(MT_ENOMEM));
}

void mt__oomsnap_record(mt__oomsnap_t *s, const mt_event_rec_t *ev,
                        const char (*labels)[MT_EVENT_LABEL_MAX + 1],
                        const char *(*tag_name)(void *, int), void *ud)
{
    if (ev->kind == MT_EV_GAP || ev->kind == MT_EV_STATS || ev->pool == MT_POOL_HOST)
        return;
    follow(s, ev);
    s->recent[s->head] = *ev;
    s->head = (s->head + 1) % OOMSNAP_RECENT;
    if (s->n < OOMSNAP_RECENT)
        s->n++;
    if (ev->kind != MT_EV_OOM)
        return;
    s->ooms[ev->device]++;
    if (!due(s, ev->time_ns)) {
        s->suppressed++;
        s->since_last++;
        return;
    }
    s->have_last = true;
    s->last_ns = ev->time_ns;
    job_t *j = calloc(1, sizeof *j);
    if (j != NULL) {
        snprintf(j->base, sizeof j->base, "oom-%d-dev%u-%u", s->pid, ev->device,
                 s->ooms[ev->device]);
        j->suppressed = s->since_last;
        if (serialise(s, false, labels, tag_name, ud, &j->json, &j->json_len) != 0 ||
            serialise(s, true, labels, tag_name, ud, &j->pickle, &j->pickle_len) != 0) {
            job_free(j);
            j = NULL;
        }
    }
    s->since_last = 0;
    hand_over(s, j);
}
