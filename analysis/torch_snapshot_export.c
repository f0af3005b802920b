/* A snapshot from a memtrace log (torch_snapshot.h, mt__ts_from_report): the process's
 * events become device_traces, the report's segment map at the last event becomes the
 * segments and blocks, tags become frames and markers become external annotations. */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/torch_snapshot.h"
#include "memtrace/alloc.h"
#include "memtrace/common.h"
#include "util/addrmap.h"
#include "util/grow.h"

/* What the segment map does not say, remembered from the events by address: the bytes
 * asked for of the last allocation at each address, the device of the last segment. An
 * address table cannot hold 0, so address 0 has its own entries. */
typedef struct seen_s {
    mt__amap_t req, dev; /* block addr -> requested; segment addr -> device */
    uint64_t req0, dev0; /* address 0's */
    bool has_req0, has_dev0;
} seen_t;

/* A conversion under way. Memory grows with the trace written (ts's events) and with the
 * addresses in use, not with the log: while every event so far is of one device, events go
 * straight into ts (their order there is log order); from an event of a second device on,
 * they are kept in evs and grouped by device at the end. Invariant: evs == NULL or ts has no
 * events. */
typedef struct ex_s {
    mt_ts_t *ts;
    const mt_ts_source_t *src;
    mt_ts_event_t *evs; /* NULL while one device: then events are in ts */
    size_t nevs, cap;
    seen_t seen;
    uint32_t tag_stack[MT_TAG_MAX]; /* 0: not made yet */
    uint64_t iteration;
    bool in_iteration;
    int rc;
} ex_t;

static uint32_t tag_stack(ex_t *x, int tag)
{
    if (tag < 0 || tag >= MT_TAG_MAX)
        tag = MT_TAG_OTHER;
    if (x->tag_stack[tag] == 0) {
        char name[96];
        const char *label = x->src->tag_name ? x->src->tag_name(x->src->ud, tag) : NULL;
        if (label != NULL && label[0] != '\0')
            snprintf(name, sizeof name, "tag %s", label);
        else if (tag < MT_TAG_USER_FIRST)
            snprintf(name, sizeof name, "tag %s", mt_tag_builtin_name(tag));
        else
            snprintf(name, sizeof name, "tag tag%d", tag);
        mt_ts_frame_t f = {.name = name, .filename = "memtrace", .line = tag};
        if (mt__ts_add_stack(x->ts, &f, 1, &x->tag_stack[tag]) < 0)
            x->rc = MT_ENOMEM;
    }
    return x->tag_stack[tag];
}

static void annotate(ex_t *x, const mt_event_rec_t *ev, bool start, const char *name)
{
    mt_ts_annotation_t a = {.start = start,
                            .device = ev->device,
                            .time_us = (int64_t)(ev->time_ns / 1000),
                            .name = name};
    if (x->rc == 0)
        x->rc = mt__ts_add_annotation(x->ts, &a);
}

static void mark(ex_t *x, const mt_event_rec_t *ev)
{
    static const struct {
        int mark;
        bool start;
        const char *name;
    } marks[] = {
        {MT_MARK_FORWARD_BEGIN, true, "forward"},   {MT_MARK_FORWARD_END, false, "forward"},
        {MT_MARK_BACKWARD_BEGIN, true, "backward"}, {MT_MARK_BACKWARD_END, false, "backward"},
        {MT_MARK_WARMUP_BEGIN, true, "warmup"},     {MT_MARK_WARMUP_END, false, "warmup"},
    };
    for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++)
        if (ev->addr == (uint64_t)marks[i].mark) {
            annotate(x, ev, marks[i].start, marks[i].name);
            return;
        }
    if (ev->addr == MT_MARK_ITERATION) {
        char name[48];
        if (x->in_iteration) {
            snprintf(name, sizeof name, "iteration %llu", (unsigned long long)x->iteration);
            annotate(x, ev, false, name);
        }
        x->iteration = ev->size;
        x->in_iteration = true;
        snprintf(name, sizeof name, "iteration %llu", (unsigned long long)x->iteration);
        annotate(x, ev, true, name);
    }
}

/* One trace entry: into ts while the log has shown one device, else into evs. */
static int keep_event(ex_t *x, const mt_ts_event_t *e)
{
    mt_ts_t *ts = x->ts;
    if (x->evs == NULL && (ts->ndevices == 0 || e->device + 1u == ts->ndevices))
        return mt__ts_add_event(ts, e);
    if (x->evs == NULL) {
        /* A second device: what ts has so far moves to evs, to be grouped at the end. */
        x->cap = ts->nevents + 1024;
        if ((x->evs = malloc(x->cap * sizeof *x->evs)) == NULL)
            return MT_ENOMEM;
        if (ts->nevents > 0)
            memcpy(x->evs, ts->events, ts->nevents * sizeof *x->evs);
        x->nevs = ts->nevents;
        ts->nevents = 0;
        ts->ndevices = 0;
        ts->dev_first[0] = 0;
    }
    mt_ts_event_t *n = mt__grow(x->evs, &x->cap, x->nevs + 1, sizeof *n, 1024);
    if (n == NULL)
        return MT_ENOMEM;
    x->evs = n;
    x->evs[x->nevs++] = *e;
    return 0;
}

/* Remembers what lookup() answers for ev's address: a later event there replaces it. */
static int remember(ex_t *x, const mt_event_rec_t *ev)
{
    seen_t *sn = &x->seen;
    bool block = ev->kind == MT_EV_ALLOC;
    uint64_t v = block ? ev->requested : ev->device;
    if (ev->addr == 0) {
        *(block ? &sn->req0 : &sn->dev0) = v;
        *(block ? &sn->has_req0 : &sn->has_dev0) = true;
        return 0;
    }
    return mt__amap_put(block ? &sn->req : &sn->dev, ev->addr, v);
}

static int on_event(ex_t *x, const mt_event_rec_t *ev)
{
    if (ev->pool == MT_POOL_HOST)
        return 0; /* pinned host memory is not device memory */
    mt_ts_event_t e = {
        .addr = ev->addr,
        .size = ev->size,
        .stream = ev->stream,
        .time_us = (int64_t)(ev->time_ns / 1000),
        .device = ev->device,
        .tag = ev->tag,
    };
    switch (ev->kind) {
    case MT_EV_ALLOC:
        e.action = MT_TS_ALLOC;
        e.size = ev->requested ? ev->requested : ev->size; /* PyTorch's alloc: orig_size */
        e.block_size = ev->size;
        e.stack = tag_stack(x, ev->tag);
        break;
    case MT_EV_FREE_REQUESTED:
    case MT_EV_FREE_COMPLETED:
        e.action = ev->kind == MT_EV_FREE_REQUESTED ? MT_TS_FREE_REQUESTED : MT_TS_FREE_COMPLETED;
        e.size = ev->requested ? ev->requested : ev->size;
        e.stack = tag_stack(x, ev->tag);
        break;
    case MT_EV_SEGMENT_ALLOC:
        e.action = MT_TS_SEGMENT_ALLOC;
        break;
    case MT_EV_SEGMENT_FREE:
        e.action = MT_TS_SEGMENT_FREE;
        break;
    case MT_EV_SEGMENT_MAP:
        e.action = MT_TS_SEGMENT_MAP;
        break;
    case MT_EV_SEGMENT_UNMAP:
        e.action = MT_TS_SEGMENT_UNMAP;
        break;
    case MT_EV_OOM:
        e.action = MT_TS_OOM;
        e.size = ev->requested;
        e.addr = ev->size; /* device_free */
        break;
    case MT_EV_MARK:
        mark(x, ev);
        return x->rc;
    default:
        return 0;
    }
    int rc = keep_event(x, &e);
    if (rc)
        return rc;
    if ((ev->kind == MT_EV_ALLOC || ev->kind == MT_EV_SEGMENT_ALLOC ||
         ev->kind == MT_EV_SEGMENT_MAP) &&
        remember(x, ev) != 0)
        return MT_ENOMEM;
    return x->rc;
}

/* What the last event that named addr as a block (want_block: its requested bytes) or a
 * segment (its device) left: 0, or MT_ENOENT when none did. */
static int lookup(const ex_t *x, uint64_t addr, bool want_block, uint64_t *v)
{
    const seen_t *sn = &x->seen;
    if (addr == 0) {
        if (!(want_block ? sn->has_req0 : sn->has_dev0))
            return MT_ENOENT;
        *v = want_block ? sn->req0 : sn->dev0;
        return 0;
    }
    return mt__amap_get(want_block ? &sn->req : &sn->dev, addr, v);
}

static int cmp_dev_ptr(const void *a, const void *b)
{
    const mt_ts_event_t *x = *(const mt_ts_event_t *const *)a;
    const mt_ts_event_t *y = *(const mt_ts_event_t *const *)b;
    if (x->device != y->device)
        return x->device < y->device ? -1 : 1;
    return x < y ? -1 : x > y; /* log order within a device */
}

/* Segments and blocks of the map; gaps become inactive blocks. */
static int add_segments(ex_t *x, const mt_model_map_t *mp)
{
    mt_model_map_t map = *mp;
    int rc = 0;
    mt_ts_block_t *blocks = malloc((2 * map.nblocks + 1) * sizeof *blocks);
    size_t b = 0; /* next live block of the map (sorted by address, as segments are) */
    uint64_t *dev_end = calloc(256, sizeof *dev_end); /* per device: the last kept's end */
    for (size_t s = 0; s < map.nsegs && rc == 0 && blocks != NULL && dev_end != NULL; s++) {
        const mt_model_seg_t *sg = &map.segs[s];
        uint64_t dev = 0;
        lookup(x, sg->addr, false, &dev);
        /* Segments lie apart (the viewers search them by address): one overlapping the last
         * kept, from a log that lost events, is left out with its blocks. */
        if (sg->addr < dev_end[(uint8_t)dev])
            continue;
        dev_end[(uint8_t)dev] = mt_model_sat_add(sg->addr, sg->size);
        mt_ts_segment_t seg = {
            .device = (uint8_t)dev,
            .addr = sg->addr,
            .total_size = sg->size,
            .stream = sg->stream,
            .large = sg->pool != MT_POOL_SMALL,
            .expandable = sg->mapped,
            .stack = 0,
        };
        size_t n = 0;
        uint64_t at = sg->addr, end = sg->addr + sg->size;
        while (b < map.nblocks && map.blocks[b].addr < sg->addr)
            b++; /* a block outside every segment (a log that began late): not drawn */
        for (; b < map.nblocks && map.blocks[b].addr < end; b++) {
            const mt__report_block_t *lb = &map.blocks[b];
            /* Blocks tile their segment (PyTorch's viewers place each after the one before
             * it): one overlapping the last placed, from a log that lost events, is left out. */
            if (lb->addr < at)
                continue;
            if (lb->addr > at)
                blocks[n++] =
                    (mt_ts_block_t){.addr = at, .size = lb->addr - at, .state = MT_TS_INACTIVE};
            uint64_t req = 0;
            lookup(x, lb->addr, true, &req);
            uint64_t size = lb->size < end - lb->addr ? lb->size : end - lb->addr;
            blocks[n++] = (mt_ts_block_t){
                .addr = lb->addr,
                .size = size,
                .requested = req ? req : size,
                .state = lb->pending ? MT_TS_ACTIVE_PENDING_FREE : MT_TS_ACTIVE_ALLOCATED,
                .stack = tag_stack(x, lb->tag),
            };
            seg.active_size += size;
            if (!lb->pending) {
                seg.allocated_size += size;
                seg.requested_size += blocks[n - 1].requested;
            }
            at = lb->addr + size;
        }
        if (at < end)
            blocks[n++] = (mt_ts_block_t){.addr = at, .size = end - at, .state = MT_TS_INACTIVE};
        rc = mt__ts_add_segment(x->ts, &seg, blocks, n);
    }
    if (blocks == NULL || dev_end == NULL)
        rc = MT_ENOMEM;
    free(blocks);
    free(dev_end);
    return rc;
}

/* The end of a conversion: the segments of map (NULL: none), the trace grouped by device.
 * Frees what x holds but ts; on failure ts too, with err set. */
static int ex_finish(ex_t *x, int rc, const mt_model_map_t *map, char *err, size_t errlen)
{
    if (rc == 0 && x->rc)
        rc = x->rc;
    if (rc == 0 && map != NULL)
        rc = add_segments(x, map);
    if (rc == 0 && x->evs != NULL) {
        /* device_traces are per device: group the events, each device in their order. */
        mt_ts_event_t **order = malloc((x->nevs + 1) * sizeof *order);
        if (order == NULL)
            rc = MT_ENOMEM;
        for (size_t i = 0; order != NULL && i < x->nevs; i++)
            order[i] = &x->evs[i];
        if (order != NULL) {
            qsort(order, x->nevs, sizeof *order, cmp_dev_ptr);
            for (size_t i = 0; i < x->nevs && rc == 0; i++)
                rc = mt__ts_add_event(x->ts, order[i]);
        }
        free(order);
    }
    if (rc == 0)
        rc = mt__ts_viz_safe(x->ts, &x->ts->viz_dropped);
    free(x->evs);
    mt__amap_fini(&x->seen.req);
    mt__amap_fini(&x->seen.dev);
    if (rc < 0) {
        snprintf(err, errlen, "%s", rc == MT_ENOMEM ? "out of memory" : mt_strerror(rc));
        mt__ts_destroy(&x->ts);
    }
    return rc;
}

int mt__ts_from_events(mt_ts_t **out, const mt_ts_source_t *src, char *err, size_t errlen)
{
    *out = NULL;
    ex_t x = {.src = src};
    int rc = mt__ts_create(&x.ts);
    for (size_t i = 0; i < src->nevs && rc == 0; i++)
        rc = on_event(&x, &src->evs[i]);
    if (x.ts == NULL) {
        snprintf(err, errlen, "out of memory");
        return rc;
    }
    rc = ex_finish(&x, rc, src->map, err, errlen);
    *out = x.ts;
    return rc;
}

/* ---- from a report (memtrace export) ---- */

/* The report's replay feeds the conversion directly: no copy of the events is made. */
static int feed(void *ctx, const mt_event_rec_t *ev, size_t index)
{
    (void)index;
    return on_event(ctx, ev);
}

typedef struct rtag_s {
    const mt__report_t *r;
    size_t proc;
    char buf[64];
} rtag_t;

static const char *report_tag(void *ud, int tag)
{
    rtag_t *t = ud;
    return mt__report_tag_name(t->r, t->proc, tag, t->buf, sizeof t->buf);
}

/* Two threads: the conversion on the caller's, fed the events alone (mt__report_each), and
 * the model's replay to the map at the end on one of its own (mt__report_map_end); each
 * reads the events back with its own buffer, and neither writes what the other reads. The
 * one replay of mt__report_replay_map would apply each event to the model, then convert it,
 * and stop at the first refusal of either: each side says where it stopped, and the first
 * stop in that order gives the result, as it would on one thread. */
typedef struct conv_s {
    ex_t *x;
    size_t next;    /* events converted */
    bool fn_failed; /* the conversion of event next failed */
} conv_t;

static int feed_counted(void *ctx, const mt_event_rec_t *ev, size_t index)
{
    conv_t *c = ctx;
    int rc = on_event(c->x, ev);
    c->fn_failed = rc != 0;
    c->next = rc != 0 ? index : index + 1;
    return rc;
}

typedef struct mapper_s {
    const mt__report_t *r;
    size_t proc;
    mt__report_map_t map;
    size_t stopped;
    bool refused;
    int rc;
} mapper_t;

static void *map_thread(void *arg)
{
    mapper_t *m = arg;
    m->rc = mt__report_map_end(m->r, m->proc, &m->map, &m->stopped, &m->refused);
    return NULL;
}

/* The replay on two threads; returns as mt__report_replay_map, with *out the map when 0.
 * *started false: the thread could not be started, nothing was done. */
static int replay_split(const mt__report_t *r, size_t proc, ex_t *x, mt__report_map_t *out,
                        bool *started)
{
    mapper_t m = {.r = r, .proc = proc};
    pthread_t th;
    *started = pthread_create(&th, NULL, map_thread, &m) == 0;
    if (!*started)
        return 0;
    conv_t c = {.x = x};
    int rc = mt__report_each(r, proc, feed_counted, &c);
    pthread_join(th, NULL);
    /* Where each stopped, in the one-thread order of an event: read back, applied, converted. */
    uint64_t at_c = rc == 0 ? UINT64_MAX : 3 * (uint64_t)c.next + (c.fn_failed ? 2 : 0);
    uint64_t at_m = m.rc == 0 ? UINT64_MAX : 3 * (uint64_t)m.stopped + (m.refused ? 1 : 0);
    if (m.rc != 0 && at_m <= at_c)
        rc = m.rc;
    if (rc == 0)
        *out = m.map;
    else
        mt__report_map_free(&m.map);
    return rc;
}

int mt__ts_from_report(mt_ts_t **out, const mt__report_t *r, size_t proc, int threads, char *err,
                       size_t errlen)
{
    *out = NULL;
    int pid;
    const char *name;
    size_t nev;
    if (mt__report_process(r, proc, &pid, &name, &nev) < 0 || nev == 0) {
        snprintf(err, errlen, "no such process, or it has no events");
        return MT_ENOENT;
    }
    rtag_t rt = {.r = r, .proc = proc};
    mt_ts_source_t src = {.tag_name = report_tag, .ud = &rt};
    ex_t x = {.src = &src};
    mt__report_map_t map;
    bool have_map;
    bool split = false;
    int rc = mt__ts_create(&x.ts);
    if (rc == 0 && threads > 1)
        rc = replay_split(r, proc, &x, &map, &split);
    if (rc == 0 && !split)
        rc = mt__report_replay_map(r, proc, feed, &x, &map);
    have_map = rc == 0;
    if (x.ts == NULL) {
        snprintf(err, errlen, "out of memory");
        return rc;
    }
    rc = ex_finish(&x, rc, have_map ? &map : NULL, err, errlen);
    if (have_map)
        mt__report_map_free(&map);
    *out = x.ts;
    return rc;
}
