/* What a snapshot's trace began in the middle of (torch_snapshot_walk.h): the segments and
 * blocks made before its first event, read as memory_viz reads them. */
#include <string.h>

#include "analysis/torch_snapshot_walk.h"

void mt__ts_pre_fini(mt_ts_pre_t *p)
{
    free(p->recs);
    free(p->stacks);
    free(p->streams);
    mt__amap_fini(&p->end_size);
    *p = (mt_ts_pre_t){0};
}

/* A record and its stack, gathered before they are put in order. */
typedef struct item_s {
    mt_event_rec_t r;
    uint32_t stack;
    int64_t stream;
} item_t;

/* Invariants: v[0..n), n <= cap. A zeroed list is empty. */
typedef struct items_s {
    item_t *v;
    size_t n, cap;
} items_t;

/* One more item, zeroed but for its stack and stream, or NULL (no memory). */
static mt_event_rec_t *item_add(items_t *l, uint32_t stack, int64_t stream)
{
    item_t *v = mt__grow(l->v, &l->cap, l->n + 1, sizeof *v, 64);
    if (v == NULL)
        return NULL;
    l->v = v;
    l->v[l->n] = (item_t){.stack = stack, .stream = stream};
    return &l->v[l->n++].r;
}

static int cmp_addr(const void *a, const void *b)
{
    const item_t *x = a, *y = b;
    return x->r.addr < y->r.addr ? -1 : x->r.addr > y->r.addr;
}

/* The page ranges the trace maps or unmaps, by start, with the furthest end so far
 * (maxend[i] = max end of v[0..i]): whether one meets a range is a binary search. */
typedef struct ranges_s {
    uint64_t (*v)[2]; /* {start, end} */
    uint64_t *maxend;
    size_t n;
} ranges_t;

static int cmp_range(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static int ranges_make(ranges_t *r, const mt_ts_event_t *ev, size_t n)
{
    *r = (ranges_t){0};
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ev[i].action == MT_TS_SEGMENT_MAP || ev[i].action == MT_TS_SEGMENT_UNMAP;
    if (k == 0)
        return 0;
    r->v = malloc(k * sizeof *r->v);
    r->maxend = malloc(k * sizeof *r->maxend);
    if (r->v == NULL || r->maxend == NULL)
        return MT_ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (ev[i].action == MT_TS_SEGMENT_MAP || ev[i].action == MT_TS_SEGMENT_UNMAP) {
            uint64_t end = ev[i].addr + ev[i].size;
            r->v[r->n][0] = ev[i].addr;
            r->v[r->n++][1] = end < ev[i].addr ? UINT64_MAX : end;
        }
    qsort(r->v, r->n, sizeof *r->v, cmp_range); /* (n >= 1 here) */
    for (size_t i = 0; i < r->n; i++)
        r->maxend[i] = i > 0 && r->maxend[i - 1] > r->v[i][1] ? r->maxend[i - 1] : r->v[i][1];
    return 0;
}

/* Keeps the first item of each address of l (sorted by address); returns how many stay. */
static size_t unique(items_t *l)
{
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++)
        if (k == 0 || l->v[i].r.addr != l->v[k - 1].r.addr)
            l->v[k++] = l->v[i];
    l->n = k;
    return k;
}

/* Whether the trace maps or unmaps pages in [addr, addr + size). */
static bool ranges_meet(const ranges_t *r, uint64_t addr, uint64_t size)
{
    uint64_t end = addr + size < addr ? UINT64_MAX : addr + size;
    size_t lo = 0, hi = r->n; /* the ranges starting before end: [0, lo) */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->v[mid][0] < end)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && r->maxend[lo - 1] > addr;
}

/* Whether stack was taken in the allocator's free (PyTorch records the free's own stack
 * with context='all'): it names where a block was dropped, not where it was made. */
static bool free_stack(const mt_ts_t *ts, uint32_t stack)
{
    if (stack == 0 || stack >= ts->nstacks)
        return false;
    const mt_ts_stack_t *s = &ts->stacks[stack];
    for (uint32_t i = 0; i < s->n; i++)
        if (strstr(ts->frames[s->first + i].name, "CachingAllocator::free(") != NULL)
            return true;
    return false;
}

/* The segments and blocks device's trace frees without having made them; *segs the
 * addresses of the segments it made and did not free, w its blocks live at its end. */
static int orphans(const mt_ts_t *ts, const mt_ts_event_t *ev, size_t n, mt__amap_t *segs,
                   walk_t *w, items_t *sl, items_t *bl)
{
    for (size_t i = 0; i < n; i++) {
        const mt_ts_event_t *e = &ev[i];
        mt_event_rec_t *r;
        live_t *l;
        bool orphan;
        int k;
        switch (e->action) {
        case MT_TS_SEGMENT_ALLOC:
            if (e->addr != 0 && mt__amap_put(segs, e->addr, 1) != 0)
                return MT_ENOMEM;
            break;
        case MT_TS_SEGMENT_FREE:
            if (e->addr == 0 || mt__amap_del(segs, e->addr) == 0)
                break;
            if ((r = item_add(sl, 0, e->stream)) == NULL)
                return MT_ENOMEM;
            *r = (mt_event_rec_t){.kind = MT_EV_SEGMENT_ALLOC,
                                  .addr = e->addr,
                                  .size = e->size,
                                  .stream = (uint32_t)e->stream,
                                  .pool = e->size <= ((uint64_t)2 << 20) ? MT_POOL_SMALL
                                                                         : MT_POOL_LARGE};
            break;
        case MT_TS_ALLOC:
        case MT_TS_FREE_REQUESTED:
        case MT_TS_FREE_COMPLETED:
            if ((k = walk_step(w, e, &l, &orphan)) < 0)
                return k;
            if (k == W_CLOSE && !l->freed)
                lm_erase(&w->live, l);
            /* (a block's first free only: its second finds the first's mark) */
            if (!orphan || e->addr <= 1)
                break;
            /* its stack, unless the free's own: then none (it was made before the trace) */
            if ((r = item_add(bl, free_stack(ts, e->stack) ? 0 : e->stack, e->stream)) == NULL)
                return MT_ENOMEM;
            *r = (mt_event_rec_t){.kind = MT_EV_ALLOC,
                                  .addr = e->addr,
                                  .size = round_block(e->size),
                                  .requested = e->size,
                                  .stream = (uint32_t)e->stream,
                                  .tag = e->tag};
            break;
        default:
            break;
        }
    }
    return 0;
}

/* The segments at the end that the trace did not make, and the blocks allocated at the end
 * that it did not allocate; the bytes of those it did, by their walk slot + 1. */
static int survivors(const mt_ts_t *ts, unsigned device, const ranges_t *mapped,
                     const mt__amap_t *segs, walk_t *w, items_t *sl, items_t *bl,
                     mt__amap_t *end_size)
{
    for (size_t i = 0; i < ts->nsegments; i++) {
        const mt_ts_segment_t *sg = &ts->segments[i];
        uint64_t one;
        if ((unsigned)sg->device != device)
            continue;
        if (mt__amap_get(segs, sg->addr, &one) != 0 &&
            !(sg->expandable && ranges_meet(mapped, sg->addr, sg->total_size))) {
            mt_event_rec_t *r = item_add(sl, sg->stack, sg->stream);
            if (r == NULL)
                return MT_ENOMEM;
            *r = (mt_event_rec_t){.kind = MT_EV_SEGMENT_ALLOC,
                                  .addr = sg->addr,
                                  .size = sg->total_size,
                                  .stream = (uint32_t)sg->stream,
                                  .pool = sg->large ? MT_POOL_LARGE : MT_POOL_SMALL};
        }
        for (uint32_t k = 0; k < sg->nblocks; k++) {
            const mt_ts_block_t *b = &ts->blocks[sg->first_block + k];
            if (b->state != MT_TS_ACTIVE_ALLOCATED || b->addr <= 1)
                continue;
            const live_t *l = lm_find(&w->live, b->addr);
            if (l != NULL && !l->freed) { /* the trace's own: its bytes are known now */
                if (mt__amap_put(end_size, (uint64_t)l->slot + 1, b->size) != 0)
                    return MT_ENOMEM;
                continue;
            }
            mt_event_rec_t *r = item_add(bl, b->stack, sg->stream);
            if (r == NULL)
                return MT_ENOMEM;
            *r = (mt_event_rec_t){.kind = MT_EV_ALLOC,
                                  .addr = b->addr,
                                  .size = b->size,
                                  .requested = b->requested ? b->requested : b->size,
                                  .stream = (uint32_t)sg->stream,
                                  .tag = b->tag};
        }
    }
    return 0;
}

int mt__ts_pre_state(const mt_ts_t *ts, unsigned device, mt_ts_pre_t *out)
{
    *out = (mt_ts_pre_t){0};
    size_t n;
    const mt_ts_event_t *ev = dev_events(ts, device, &n);
    walk_t w = {0};
    mt__amap_t segs = {0};
    items_t sl = {0}, bl = {0};
    ranges_t mapped;
    int rc = ranges_make(&mapped, ev, n);
    if (rc == 0)
        rc = orphans(ts, ev, n, &segs, &w, &sl, &bl);
    size_t norphans = bl.n;
    if (rc == 0)
        rc = survivors(ts, device, &mapped, &segs, &w, &sl, &bl, &out->end_size);
    size_t total = sl.n + bl.n;
    if (rc == 0 && total > 0) {
        out->recs = malloc(total * sizeof *out->recs);
        out->stacks = malloc(total * sizeof *out->stacks);
        out->streams = malloc(total * sizeof *out->streams);
        if (out->recs == NULL || out->stacks == NULL || out->streams == NULL)
            rc = MT_ENOMEM;
    }
    if (rc == 0) {
        if (sl.n > 1) /* (qsort of NULL, 0 is undefined) */
            qsort(sl.v, sl.n, sizeof *sl.v, cmp_addr);
        if (bl.n > 1)
            qsort(bl.v, bl.n, sizeof *bl.v, cmp_addr);
        /* One of each address (a file whose trace lost events could name one twice). */
        total = unique(&sl) + unique(&bl);
        for (size_t i = 0; i < total; i++) {
            const item_t *it = i < sl.n ? &sl.v[i] : &bl.v[i - sl.n];
            mt_event_rec_t *r = &out->recs[i];
            *r = it->r;
            out->stacks[i] = it->stack;
            out->streams[i] = it->stream;
            r->device = (uint8_t)device;
            if (r->kind == MT_EV_SEGMENT_ALLOC) {
                out->reserved += r->size;
            } else {
                out->allocated += r->size;
                r->pool = r->size <= ((uint64_t)1 << 20) ? MT_POOL_SMALL : MT_POOL_LARGE;
            }
            r->allocated = out->allocated;
            r->reserved = out->reserved;
        }
        out->n = total;
        out->nsegs = sl.n;
        out->norphans = norphans;
    }
    free(sl.v);
    free(bl.v);
    free(mapped.v);
    free(mapped.maxend);
    lm_fini(&w.live);
    mt__amap_fini(&segs);
    if (rc != 0)
        mt__ts_pre_fini(out);
    return rc;
}

int mt__ts_pre_open(const mt_ts_pre_t *p, walk_t *w, bool requested)
{
    for (size_t i = p->nsegs; i < p->n; i++) {
        const mt_event_rec_t *r = &p->recs[i];
        if (lm_find(&w->live, r->addr) != NULL)
            continue;
        live_t *l = lm_insert(&w->live, r->addr);
        if (l == NULL)
            return MT_ENOMEM;
        l->size = requested ? r->requested : r->size;
        l->slot = UINT32_MAX;
        l->stack = p->stacks[i];
    }
    return 0;
}
