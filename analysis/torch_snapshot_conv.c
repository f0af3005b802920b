/* Snapshot conversions (torch_snapshot.h): PyTorch's own figures, the allocation trace for
 * the replay, memtrace event records for the report, call sites at the peak. */
#include <stdlib.h>
#include <string.h>

#include "analysis/frames.h"
#include "analysis/torch_snapshot.h"
#include "memtrace/alloc.h"
#include "memtrace/common.h"
#include "util/addrmap.h"
#include "util/grow.h"
#include "analysis/torch_snapshot_walk.h"

/* v in [0, UINT64_MAX]: a figure too large for its field reads as the largest it holds. */
static uint64_t sat_u64(__int128 v)
{
    return v < 0 ? 0 : v > (__int128)UINT64_MAX ? UINT64_MAX : (uint64_t)v;
}

int mt__ts_figures(const mt_ts_t *ts, unsigned device, mt_ts_figures_t *out)
{
    memset(out, 0, sizeof *out);
    size_t n;
    const mt_ts_event_t *ev = dev_events(ts, device, &n);
    /* Sums of a hostile file's sizes (each up to 2^64 - 1) can pass 2^63: they are kept in
     * 128 bits, which no count of events this reader accepts can overflow, and saturated
     * into the uint64 figures at the end. */
    __int128 res = 0, res_min = 0, res_max = 0, alloc = 0, alloc_max = 0;
    walk_t w = {0};
    /* The blocks live before the trace began are live from its start. */
    mt_ts_pre_t pre;
    int rc = mt__ts_pre_state(ts, device, &pre);
    if (rc == 0)
        rc = mt__ts_pre_open(&pre, &w, true);
    for (size_t i = pre.nsegs + pre.npending; rc == 0 && i < pre.n; i++)
        alloc += pre.recs[i].requested;
    alloc_max = alloc;
    out->pre_blocks = rc == 0 ? pre.n - pre.nsegs : 0;
    out->orphan_frees = rc == 0 ? pre.norphans : 0;
    mt__ts_pre_fini(&pre);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const mt_ts_event_t *e = &ev[i];
        switch (e->action) {
        case MT_TS_SEGMENT_ALLOC:
        case MT_TS_SEGMENT_MAP:
            res += e->size;
            out->segment_events++;
            break;
        case MT_TS_SEGMENT_FREE:
        case MT_TS_SEGMENT_UNMAP:
            res -= e->size;
            out->segment_events++;
            break;
        case MT_TS_OOM:
            out->ooms++;
            break;
        default:
            break;
        }
        res_min = res < res_min ? res : res_min;
        res_max = res > res_max ? res : res_max;
        live_t *l;
        bool orphan;
        int k = walk_step(&w, e, &l, &orphan);
        if (k < 0) {
            rc = k;
            break;
        }
        (void)orphan; /* (the state before the trace holds them: pre.norphans) */
        if (k == W_OPEN) {
            out->allocs++;
            alloc += l->size;
            alloc_max = alloc > alloc_max ? alloc : alloc_max;
        } else if (k == W_CLOSE) {
            out->frees++;
            alloc -= l->size;
            if (!l->freed)
                lm_erase(&w.live, l);
        }
    }
    lm_fini(&w.live);
    /* What was reserved before the trace: enough that it never went below zero, and what
     * the segments at the end imply (they are the state after the last event). */
    __int128 end_segments = 0;
    for (size_t i = 0; i < ts->nsegments; i++)
        if (ts->segments[i].device == (int)device)
            end_segments += ts->segments[i].total_size;
    __int128 start = -res_min;
    if (end_segments > 0 && end_segments - res > start)
        start = end_segments - res;
    out->reserved_start = sat_u64(start);
    out->peak_reserved = sat_u64(start + res_max);
    out->end_reserved = sat_u64(start + res);
    out->peak_allocated = sat_u64(alloc_max);
    return rc;
}

int mt__ts_to_trace(const mt_ts_t *ts, unsigned device, mt_trace_t **out, char *err, size_t errlen)
{
    *out = NULL;
    size_t n;
    const mt_ts_event_t *ev = dev_events(ts, device, &n);
    mt_trace_t *t = calloc(1, sizeof *t);
    walk_t w = {0};
    mt_ts_pre_t pre = {0};
    size_t cap_streams = 0;
    uint64_t live_bytes = 0;
    size_t live_count = 0;
    int rc = 0;
    if (t == NULL || mt__ts_pre_state(ts, device, &pre) != 0)
        goto fail_nomem;
    size_t npre = pre.n - pre.nsegs;
    if (n + npre > 0 && (t->ops = malloc((n + npre) * sizeof *t->ops)) == NULL)
        goto fail_nomem;
    /* The blocks live before the trace began are allocated first, in address order; the
     * trace's frees of them then close their slots. (Those already asked free are not.) */
    for (size_t i = pre.nsegs + pre.npending; i < pre.n; i++) {
        const mt_event_rec_t *r = &pre.recs[i];
        uint16_t s;
        live_t *l;
        if ((rc = mt__trace_stream_index(t, &cap_streams, (uint64_t)pre.streams[i], &s)) != 0)
            goto fail_rc;
        if (lm_find(&w.live, r->addr) != NULL)
            continue; /* (one block per address) */
        if ((l = lm_insert(&w.live, r->addr)) == NULL)
            goto fail_nomem;
        l->size = r->requested;
        l->slot = w.nslots++;
        l->stack = s; /* the stream of the free is the block's: remembered here */
        t->ops[t->nops++] = (mt_trace_op_t){
            .size = l->size, .slot = l->slot, .stream = s, .action = MT_TRACE_ALLOCATE};
        t->nallocs++;
        live_bytes += l->size;
        live_count++;
    }
    t->peak_live_bytes = live_bytes;
    t->peak_live_count = live_count;
    for (size_t i = 0; i < n; i++) {
        const mt_ts_event_t *e = &ev[i];
        if (e->action == MT_TS_OOM)
            t->nfailures++;
        live_t *l;
        bool orphan;
        int k = walk_step(&w, e, &l, &orphan);
        if (k < 0)
            goto fail_nomem;
        if (k == W_SKIP)
            continue;
        mt_trace_op_t *op = &t->ops[t->nops++];
        op->size = l->size;
        op->slot = l->slot;
        op->pad = 0;
        if (k == W_OPEN) {
            uint16_t s;
            if ((rc = mt__trace_stream_index(t, &cap_streams, (uint64_t)e->stream, &s)) != 0)
                goto fail_rc;
            op->stream = s;
            op->action = MT_TRACE_ALLOCATE;
            /* The stream of the free is the block's: remembered in the slot's op. */
            l->stack = (uint32_t)s;
            t->nallocs++;
            live_bytes += l->size;
            live_count++;
            if (live_bytes > t->peak_live_bytes)
                t->peak_live_bytes = live_bytes;
            if (live_count > t->peak_live_count)
                t->peak_live_count = live_count;
        } else {
            op->stream = (uint16_t)l->stack;
            op->action = MT_TRACE_FREE;
            t->nfrees++;
            live_bytes -= l->size;
            live_count--;
            if (!l->freed)
                lm_erase(&w.live, l);
        }
    }
    t->nslots = t->nallocs;
    t->nrows = t->nallocs + t->nfrees + t->nfailures;
    t->leaked = live_count;
    lm_fini(&w.live);
    mt__ts_pre_fini(&pre);
    *out = t;
    return 0;
fail_rc:
    if (rc == MT_EOVERFLOW) { /* (MT_ENOMEM all the same, as before: err says which) */
        snprintf(err, errlen, "device %u: more than %d streams", device, UINT16_MAX);
        goto fail;
    }
fail_nomem:
    snprintf(err, errlen, "out of memory");
fail:
    lm_fini(&w.live);
    mt__ts_pre_fini(&pre);
    mt__trace_free(&t);
    return MT_ENOMEM;
}

/* ---- records ---- */

static uint8_t pool_of(uint64_t size, bool segment)
{
    return size <= (segment ? (uint64_t)2 << 20 : (uint64_t)1 << 20) ? MT_POOL_SMALL
                                                                     : MT_POOL_LARGE;
}

/* An annotation as a memtrace marker, when its name says which: forward, backward,
 * warm-up stages, and the start of an iteration or step. 0: none. */
static int annotation_mark(const mt_ts_annotation_t *a)
{
    const char *n = a->name;
    if (strstr(n, "forward") != NULL)
        return a->start ? MT_MARK_FORWARD_BEGIN : MT_MARK_FORWARD_END;
    if (strstr(n, "backward") != NULL)
        return a->start ? MT_MARK_BACKWARD_BEGIN : MT_MARK_BACKWARD_END;
    if (strstr(n, "warmup") != NULL || strstr(n, "warm-up") != NULL)
        return a->start ? MT_MARK_WARMUP_BEGIN : MT_MARK_WARMUP_END;
    if (a->start && (strncmp(n, "iteration", 9) == 0 || strncmp(n, "step", 4) == 0))
        return MT_MARK_ITERATION;
    return 0;
}

/* One device's cursor through its trace while records are made. */
typedef struct cursor_s {
    const mt_ts_event_t *ev;
    size_t i, n;
    uint64_t allocated, reserved;
    walk_t w;
    /* the device's expandable segments at the end, so that a map's pool is the pool of the
     * segment it ends up in: the trace's events carry no pool, and the model joins mapped
     * pages into one segment only within a pool */
    mt_ts_xsegs_t xs;
    mt__amap_t end_size; /* mt_ts_pre_t's: the bytes at the end of the trace's blocks */
} cursor_t;

/* The pool of a map or unmap of size bytes at addr: that of the final expandable segment
 * holding addr, else (pages unmapped before the end) the pool its size implies. */
static uint8_t map_pool(const cursor_t *c, uint64_t addr, uint64_t size)
{
    const mt_ts_segment_t *sg = mt__ts_xseg_holding(&c->xs, addr);
    if (sg != NULL)
        return sg->large ? MT_POOL_LARGE : MT_POOL_SMALL;
    return pool_of(size, true);
}

static int64_t ev_time(const cursor_t *c)
{
    return c->ev[c->i].time_us;
}

/* Event e of c as a record; *emit false for what memtrace does not model. */
static int make_record(cursor_t *c, const mt_ts_event_t *e, mt_event_rec_t *r, bool *emit)
{
    static const uint8_t kind[MT_TS_ACTION_COUNT] = {
        [MT_TS_ALLOC] = MT_EV_ALLOC,
        [MT_TS_FREE_REQUESTED] = MT_EV_FREE_REQUESTED,
        [MT_TS_FREE_COMPLETED] = MT_EV_FREE_COMPLETED,
        [MT_TS_SEGMENT_ALLOC] = MT_EV_SEGMENT_ALLOC,
        [MT_TS_SEGMENT_FREE] = MT_EV_SEGMENT_FREE,
        [MT_TS_SEGMENT_MAP] = MT_EV_SEGMENT_MAP,
        [MT_TS_SEGMENT_UNMAP] = MT_EV_SEGMENT_UNMAP,
        [MT_TS_OOM] = MT_EV_OOM,
    };
    *emit = true;
    *r = (mt_event_rec_t){
        .time_ns = e->time_us > 0 ? (uint64_t)e->time_us * 1000u : 0,
        .addr = e->addr,
        .size = e->size,
        .requested = e->size,
        .stream = (uint32_t)e->stream,
        .kind = kind[e->action],
        .device = e->device,
        .tag = e->tag,
    };
    live_t *l;
    bool orphan;
    int k = walk_step(&c->w, e, &l, &orphan);
    if (k < 0)
        return k;
    switch (e->action) {
    case MT_TS_ALLOC:
        r->size = e->block_size ? e->block_size : round_block(e->size);
        uint64_t end;
        if (k == W_OPEN && mt__amap_get(&c->end_size, (uint64_t)l->slot + 1, &end) == 0)
            r->size = end; /* still allocated at the end: its block's bytes there */
        r->pool = pool_of(r->size, false);
        if (k == W_OPEN) {
            c->allocated += r->size;
            l->size = r->size; /* the block's bytes leave at its free */
        }
        break;
    case MT_TS_FREE_REQUESTED:
    case MT_TS_FREE_COMPLETED:
        /* An orphan or the second half of a free keeps its own size: the report pairs
         * free_requested with free_completed itself. */
        r->size = l != NULL && l->size ? l->size : round_block(e->size);
        r->pool = pool_of(r->size, false);
        if (k == W_CLOSE) {
            c->allocated -= l->size;
            if (!l->freed)
                lm_erase(&c->w.live, l);
        }
        break;
    case MT_TS_SEGMENT_ALLOC:
    case MT_TS_SEGMENT_MAP:
        c->reserved += e->size;
        r->pool =
            e->action == MT_TS_SEGMENT_MAP ? map_pool(c, e->addr, e->size) : pool_of(e->size, true);
        break;
    case MT_TS_SEGMENT_FREE:
    case MT_TS_SEGMENT_UNMAP:
        c->reserved -= e->size < c->reserved ? e->size : c->reserved;
        r->pool = e->action == MT_TS_SEGMENT_UNMAP ? map_pool(c, e->addr, e->size)
                                                   : pool_of(e->size, true);
        break;
    case MT_TS_OOM:
        r->size = e->addr; /* memtrace: size = free device bytes, requested = the request */
        r->addr = 0;
        break;
    default:
        *emit = false; /* snapshot markers carry nothing memtrace models */
        break;
    }
    r->allocated = c->allocated;
    r->reserved = c->reserved;
    return 0;
}

static int cmp_annotation(const void *a, const void *b)
{
    const mt_ts_annotation_t *x = *(const mt_ts_annotation_t *const *)a;
    const mt_ts_annotation_t *y = *(const mt_ts_annotation_t *const *)b;
    return x->time_us < y->time_us ? -1 : x->time_us > y->time_us ? 1 : (x < y ? -1 : x > y);
}

/* A snapshot without a trace: its state as the events that would have made it. Its one
 * moment is its end, so nothing may peak before it: every segment first (reserved is the
 * state's from the start), then the blocks freed and waiting for their streams (each
 * allocated and freed at once), then the live blocks (allocated climbs to the state's). */
static int state_records(const mt_ts_t *ts, mt_ts_record_fn fn, void *ctx)
{
    uint64_t allocated[256] = {0}, reserved[256] = {0}, seq = 0;
    int rc = 0;
    for (size_t i = 0; i < ts->nsegments && rc == 0; i++) {
        const mt_ts_segment_t *s = &ts->segments[i];
        uint8_t d = (uint8_t)s->device;
        reserved[d] += s->total_size;
        seq++; /* not in the initializer: its expressions are not sequenced */
        mt_event_rec_t r = {
            .seq = seq,
            .time_ns = seq,
            .kind = s->expandable ? MT_EV_SEGMENT_MAP : MT_EV_SEGMENT_ALLOC,
            .addr = s->addr,
            .size = s->total_size,
            .stream = (uint32_t)s->stream,
            .pool = s->large ? MT_POOL_LARGE : MT_POOL_SMALL,
            .device = d,
            .allocated = allocated[d],
            .reserved = reserved[d],
        };
        rc = fn(ctx, &r, s->stack, 0);
    }
    for (int pass = 0; pass < 2; pass++) {
        uint8_t want = pass == 0 ? MT_TS_ACTIVE_PENDING_FREE : MT_TS_ACTIVE_ALLOCATED;
        for (size_t i = 0; i < ts->nsegments && rc == 0; i++) {
            const mt_ts_segment_t *s = &ts->segments[i];
            uint8_t d = (uint8_t)s->device;
            for (uint32_t k = 0; k < s->nblocks && rc == 0; k++) {
                const mt_ts_block_t *b = &ts->blocks[s->first_block + k];
                if (b->state != want)
                    continue;
                uint64_t req = b->requested;
                for (uint32_t h = 0; req == 0 && h < b->nhistory; h++)
                    req = ts->history[b->first_history + h].real_size;
                allocated[d] += b->size;
                seq++;
                mt_event_rec_t r = {
                    .seq = seq,
                    .time_ns = seq,
                    .kind = MT_EV_ALLOC,
                    .addr = b->addr,
                    .size = b->size,
                    .requested = req ? req : b->size,
                    .stream = (uint32_t)s->stream,
                    .pool = pool_of(b->size, false),
                    .device = d,
                    .tag = b->tag,
                    .allocated = allocated[d],
                    .reserved = reserved[d],
                };
                rc = fn(ctx, &r, mt__ts_block_stack(ts, b), 0);
                if (rc == 0 && pass == 0) {
                    allocated[d] -= b->size; /* freed by the program, its stream not done */
                    r.allocated = allocated[d];
                    r.kind = MT_EV_FREE_REQUESTED;
                    r.seq = ++seq;
                    r.time_ns = seq;
                    rc = fn(ctx, &r, mt__ts_block_stack(ts, b), 0);
                }
            }
        }
    }
    return rc;
}

int mt__ts_records(const mt_ts_t *ts, mt_ts_record_fn fn, void *ctx)
{
    if (ts->nevents == 0)
        return state_records(ts, fn, ctx);
    int rc = 0;
    cursor_t *cur = calloc(ts->ndevices ? ts->ndevices : 1, sizeof *cur);
    const mt_ts_annotation_t **ann = calloc(ts->nannotations + 1, sizeof *ann);
    size_t seq = 0;
    if (cur == NULL || ann == NULL) {
        rc = MT_ENOMEM;
        goto done;
    }
    /* What each device's trace began in the middle of comes first, just before the first
     * event, and its blocks are open for the trace's frees of them. */
    int64_t t0 = mt__ts_trace_start_us(ts);
    for (unsigned d = 0; d < ts->ndevices && rc == 0; d++) {
        mt_ts_figures_t fig;
        mt_ts_pre_t pre;
        rc = mt__ts_figures(ts, d, &fig);
        if (rc == 0)
            rc = mt__ts_pre_state(ts, d, &pre);
        if (rc != 0)
            break;
        cur[d].ev = dev_events(ts, d, &cur[d].n);
        /* (what the segment events imply beyond the segments found: reserved, unmapped) */
        uint64_t more = fig.reserved_start > pre.reserved ? fig.reserved_start - pre.reserved : 0;
        for (size_t i = 0; i < pre.n && rc == 0; i++) {
            mt_event_rec_t r = pre.recs[i];
            r.reserved += more;
            r.seq = ++seq;
            r.time_ns = t0 > 0 ? (uint64_t)t0 * 1000u - 1 : 1; /* (untimed: with event 1) */
            rc = fn(ctx, &r, pre.stacks[i], MT_TS_REC_BEFORE);
            if (rc == 0 && i >= pre.nsegs && i < pre.nsegs + pre.npending) {
                /* asked free before the trace: its free_completed is the trace's */
                r.kind = MT_EV_FREE_REQUESTED;
                r.seq = ++seq;
                r.allocated -= r.size;
                rc = fn(ctx, &r, 0, MT_TS_REC_BEFORE);
            }
        }
        cur[d].allocated = pre.allocated;
        cur[d].reserved = pre.reserved + more;
        if (rc == 0)
            rc = mt__ts_pre_open(&pre, &cur[d].w, false);
        cur[d].end_size = pre.end_size; /* moved */
        pre.end_size = (mt__amap_t){0};
        mt__ts_pre_fini(&pre);
        if (rc == 0)
            rc = mt__ts_xsegs(ts, d, &cur[d].xs);
    }
    for (size_t i = 0; i < ts->nannotations; i++)
        ann[i] = &ts->annotations[i];
    qsort(ann, ts->nannotations, sizeof *ann, cmp_annotation);
    size_t ai = 0, iterations = 0, ord = 0; /* ord: the trace's records and marks so far */
    /* Devices merged by time (PyTorch's clock is one per process); ties and untimed
     * traces keep device order. Annotations come before events of the same time. */
    while (rc == 0) {
        int best = -1;
        for (unsigned d = 0; d < ts->ndevices; d++)
            if (cur[d].i < cur[d].n && (best < 0 || ev_time(&cur[d]) < ev_time(&cur[best])))
                best = (int)d;
        mt_event_rec_t r;
        bool emit = true;
        if (ai < ts->nannotations && (best < 0 || ann[ai]->time_us <= ev_time(&cur[best]))) {
            const mt_ts_annotation_t *a = ann[ai++];
            int mark = annotation_mark(a);
            unsigned dev =
                a->device >= 0 && (unsigned)a->device < ts->ndevices ? (unsigned)a->device : 0;
            r = (mt_event_rec_t){
                .time_ns = a->time_us > 0 ? (uint64_t)a->time_us * 1000u : 0,
                .kind = MT_EV_MARK,
                .addr = (uint64_t)mark,
                .device = (uint8_t)dev,
                .allocated = ts->ndevices ? cur[dev].allocated : 0,
                .reserved = ts->ndevices ? cur[dev].reserved : 0,
            };
            /* Any other stage marks the timeline by its name where it starts. */
            emit = mark != 0 || (a->start && a->name[0] != '\0');
            if (mark == 0 && emit) {
                r.kind = MT_EV_MARK_NAMED;
                mt_event_mark_name_pack(&r, a->name);
            }
            if (mark == MT_MARK_ITERATION) {
                /* "iteration 12" (what memtrace writes) keeps its number; else a count. */
                const char *num = strpbrk(a->name, "0123456789");
                r.size = num != NULL ? strtoull(num, NULL, 10) : iterations;
                iterations++;
            }
        } else if (best >= 0) {
            cursor_t *c = &cur[best];
            rc = make_record(c, &c->ev[c->i], &r, &emit);
            c->i++;
        } else
            break;
        if (rc == 0 && emit) {
            r.seq = ++seq;
            if (r.time_ns == 0)
                r.time_ns = ord + 1; /* no clock in the file: event order */
            ord++;
            bool mark = r.kind == MT_EV_MARK || r.kind == MT_EV_MARK_NAMED;
            rc = fn(ctx, &r, mark ? 0 : cur[best].ev[cur[best].i - 1].stack, 0);
        }
    }
done:
    for (unsigned d = 0; cur != NULL && d < ts->ndevices; d++) {
        lm_fini(&cur[d].w.live);
        mt__amap_fini(&cur[d].end_size);
        mt__ts_xsegs_fini(&cur[d].xs);
    }
    free(cur);
    free(ann);
    return rc;
}

bool mt__ts_timed(const mt_ts_t *ts)
{
    for (size_t i = 0; i < ts->nevents; i++)
        if (ts->events[i].time_us > 0)
            return true;
    for (size_t i = 0; i < ts->nannotations; i++)
        if (ts->annotations[i].time_us > 0)
            return true;
    return false;
}

int64_t mt__ts_trace_start_us(const mt_ts_t *ts)
{
    int64_t t0 = 0;
    for (unsigned d = 0; d < ts->ndevices; d++) {
        size_t n;
        const mt_ts_event_t *ev = dev_events(ts, d, &n);
        if (n > 0 && ev[0].time_us > 0 && (t0 == 0 || ev[0].time_us < t0))
            t0 = ev[0].time_us;
    }
    return t0;
}

bool mt__ts_state_only(const mt_ts_t *ts)
{
    return ts->nevents == 0;
}

unsigned mt__ts_device_count(const mt_ts_t *ts)
{
    unsigned n = ts->ndevices;
    for (size_t i = 0; i < ts->nsegments; i++)
        if (ts->segments[i].device >= 0 && (unsigned)ts->segments[i].device >= n)
            n = (unsigned)ts->segments[i].device + 1;
    return n;
}

bool mt__ts_device_used(const mt_ts_t *ts, unsigned d)
{
    size_t n;
    (void)dev_events(ts, d, &n);
    for (size_t i = 0; n == 0 && i < ts->nsegments; i++)
        n = (unsigned)ts->segments[i].device == d;
    return n != 0;
}

/* ---- call sites at the peak ---- */

static int cmp_site(const void *a, const void *b)
{
    const mt_ts_site_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    return x->stack < y->stack ? -1 : x->stack > y->stack;
}

int mt__ts_sites_at_peak(const mt_ts_t *ts, unsigned device, mt_ts_site_t *sites, size_t nsites,
                         size_t *nout, uint64_t *peak)
{
    *nout = 0;
    *peak = 0;
    size_t n;
    const mt_ts_event_t *ev = dev_events(ts, device, &n);
    /* What the trace began in the middle of is live from its start (without a trace: the
     * snapshot's one moment, its live blocks). */
    mt_ts_pre_t pre;
    int rc = mt__ts_pre_state(ts, device, &pre);
    if (rc != 0)
        return rc;
    /* Pass 1 finds the event at which allocated bytes peak (or the start), by the blocks'
     * bytes as the report's model counts them (make_record's MT_TS_ALLOC); pass 2 stops there
     * and sums the live blocks' requests by stack. */
    uint64_t pre_bytes[2] = {0, 0}; /* blocks' bytes, requests */
    for (size_t i = pre.nsegs + pre.npending; i < pre.n; i++) {
        pre_bytes[0] += pre.recs[i].size;
        pre_bytes[1] += pre.recs[i].requested;
    }
    size_t at = 0;
    bool at_start = true;
    uint64_t top = pre_bytes[0];
    for (int pass = 0; pass < 2; pass++) {
        walk_t w = {0};
        uint64_t alloc = pre_bytes[pass];
        if ((rc = mt__ts_pre_open(&pre, &w, pass == 1)) != 0) {
            lm_fini(&w.live);
            break;
        }
        size_t end = pass == 0 ? n : at_start ? 0 : at + 1;
        for (size_t i = 0; i < end; i++) {
            live_t *l;
            bool orphan;
            int k = walk_step(&w, &ev[i], &l, &orphan);
            if (k < 0) {
                lm_fini(&w.live);
                mt__ts_pre_fini(&pre);
                return k;
            }
            if (k == W_OPEN) {
                uint64_t bytes;
                if (pass == 0 && mt__amap_get(&pre.end_size, (uint64_t)l->slot + 1, &bytes) != 0)
                    bytes = ev[i].block_size ? ev[i].block_size : round_block(ev[i].size);
                if (pass == 0)
                    l->size = bytes; /* what its close takes away */
                alloc += l->size;
                if (pass == 0 && alloc > top) {
                    top = alloc;
                    at = i;
                    at_start = false;
                }
            } else if (k == W_CLOSE) {
                alloc -= l->size;
                if (!l->freed)
                    lm_erase(&w.live, l);
                else
                    l->size = 0; /* freed: kept only to absorb its free_completed */
            }
        }
        if (pass == 1)
            *peak = alloc;
        if (pass == 1) {
            mt_ts_site_t *acc = calloc(ts->nstacks, sizeof *acc);
            if (acc == NULL) {
                lm_fini(&w.live);
                mt__ts_pre_fini(&pre);
                return MT_ENOMEM;
            }
            for (size_t i = 0; i < w.live.n; i++) {
                const live_t *l = &w.live.v[i];
                if (!l->freed && l->stack < ts->nstacks) {
                    acc[l->stack].stack = l->stack;
                    acc[l->stack].bytes += l->size;
                    acc[l->stack].count++;
                }
            }
            qsort(acc, ts->nstacks, sizeof *acc, cmp_site);
            for (size_t i = 0; i < ts->nstacks && *nout < nsites && acc[i].bytes > 0; i++)
                sites[(*nout)++] = acc[i];
            free(acc);
        }
        lm_fini(&w.live);
    }
    mt__ts_pre_fini(&pre);
    return rc;
}
