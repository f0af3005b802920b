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
    bool pending; /* its free was asked before the trace: active, not allocated, at its start */
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
    if (x->pending != y->pending)
        return x->pending ? -1 : 1; /* (the blocks awaiting their free first: mt_ts_pre_t) */
    return x->r.addr < y->r.addr ? -1 : x->r.addr > y->r.addr;
}

/* Keeps the first item of each address of l (sorted by cmp_addr); returns how many stay. */
static size_t unique(items_t *l)
{
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++)
        if (k == 0 || l->v[i].r.addr != l->v[k - 1].r.addr ||
            l->v[i].pending != l->v[k - 1].pending)
            l->v[k++] = l->v[i];
    l->n = k;
    return k;
}

/* ---- expandable pages before the trace ----
 * The trace's maps and unmaps and the expandable segments at the end cut the addresses into
 * pieces none of them splits. Before the trace, a piece was the opposite of what the first
 * event touching it did (unmapped if it was mapped, mapped if unmapped); a piece no event
 * touches was as at the end. The mapped pieces, joined where they touch within one stream
 * and pool, were the expandable segments then. */

enum { P_UNSEEN = 0, P_MAPPED = 1, P_UNMAPPED = 2 };

typedef struct piece_s {
    int64_t stream;
    uint32_t stack;
    uint8_t state; /* P_* */
    uint8_t large;
} piece_t;

/* Invariants: cut[0..ncut) sorted and distinct, piece i = [cut[i], cut[i + 1]) for
 * i < n = ncut - 1 (0 when ncut < 2); next[i] in [i, n] and every piece in [i, next[i]) is
 * seen (next[n] = n); x the device's expandable segments at the end. */
typedef struct pieces_s {
    uint64_t *cut;
    size_t ncut, n;
    piece_t *p;
    size_t *next;
    mt_ts_xsegs_t x;
} pieces_t;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_seg_addr(const void *a, const void *b)
{
    return cmp_u64(&(*(const mt_ts_segment_t *const *)a)->addr,
                   &(*(const mt_ts_segment_t *const *)b)->addr);
}

int mt__ts_xsegs(const mt_ts_t *ts, unsigned device, mt_ts_xsegs_t *out)
{
    *out = (mt_ts_xsegs_t){0};
    size_t n = 0;
    for (size_t i = 0; i < ts->nsegments; i++)
        n += ts->segments[i].expandable && (unsigned)ts->segments[i].device == device &&
             ts->segments[i].total_size > 0;
    if (n == 0)
        return 0;
    if ((out->v = malloc(n * sizeof *out->v)) == NULL)
        return MT_ENOMEM;
    for (size_t i = 0; i < ts->nsegments; i++) {
        const mt_ts_segment_t *sg = &ts->segments[i];
        if (sg->expandable && (unsigned)sg->device == device && sg->total_size > 0)
            out->v[out->n++] = sg;
    }
    if (out->n > 1)
        qsort(out->v, out->n, sizeof *out->v, cmp_seg_addr);
    return 0;
}

void mt__ts_xsegs_fini(mt_ts_xsegs_t *x)
{
    free(x->v);
    *x = (mt_ts_xsegs_t){0};
}

const mt_ts_segment_t *mt__ts_xseg_holding(const mt_ts_xsegs_t *x, uint64_t addr)
{
    size_t lo = 0, hi = x->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (x->v[mid]->addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    const mt_ts_segment_t *sg = x->v[lo - 1];
    return addr < mt_model_sat_add(sg->addr, sg->total_size) ? sg : NULL;
}

/* The first cut >= v (ncut when none). */
static size_t cut_at(const pieces_t *ps, uint64_t v)
{
    size_t lo = 0, hi = ps->ncut;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ps->cut[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The first piece >= i not seen yet, or n (path halving). */
static size_t unseen(pieces_t *ps, size_t i)
{
    while (ps->next[i] != i) {
        ps->next[i] = ps->next[ps->next[i]];
        i = ps->next[i];
    }
    return i;
}

static bool is_map(const mt_ts_event_t *e)
{
    return (e->action == MT_TS_SEGMENT_MAP || e->action == MT_TS_SEGMENT_UNMAP) && e->size > 0;
}

/* The cuts and the end's expandable segments of device. 0 or MT_ENOMEM. */
static int pieces_make(pieces_t *ps, const mt_ts_t *ts, unsigned device, const mt_ts_event_t *ev,
                       size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += is_map(&ev[i]);
    int rc = mt__ts_xsegs(ts, device, &ps->x);
    if (rc != 0 || (k == 0 && ps->x.n == 0))
        return rc;
    if ((ps->cut = malloc(2 * (k + ps->x.n) * sizeof *ps->cut)) == NULL)
        return MT_ENOMEM;
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (is_map(&ev[i])) {
            ps->cut[c++] = ev[i].addr;
            ps->cut[c++] = mt_model_sat_add(ev[i].addr, ev[i].size);
        }
    for (size_t i = 0; i < ps->x.n; i++) {
        ps->cut[c++] = ps->x.v[i]->addr;
        ps->cut[c++] = mt_model_sat_add(ps->x.v[i]->addr, ps->x.v[i]->total_size);
    }
    qsort(ps->cut, c, sizeof *ps->cut, cmp_u64); /* (c >= 2 here) */
    ps->ncut = 0;
    for (size_t i = 0; i < c; i++)
        if (ps->ncut == 0 || ps->cut[i] != ps->cut[ps->ncut - 1])
            ps->cut[ps->ncut++] = ps->cut[i];
    ps->n = ps->ncut - 1;
    ps->p = calloc(ps->n + 1, sizeof *ps->p);
    ps->next = malloc((ps->n + 1) * sizeof *ps->next);
    if (ps->p == NULL || ps->next == NULL)
        return MT_ENOMEM;
    for (size_t i = 0; i <= ps->n; i++)
        ps->next[i] = i;
    return 0;
}

static void pieces_fini(pieces_t *ps)
{
    free(ps->cut);
    free(ps->p);
    free(ps->next);
    mt__ts_xsegs_fini(&ps->x);
    *ps = (pieces_t){0};
}

/* Each piece's state before the trace; its stream, pool and stack from the expandable
 * segment holding it at the end, else from the first event touching it. */
static void pieces_settle(pieces_t *ps, const mt_ts_event_t *ev, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        const mt_ts_event_t *e = &ev[j];
        if (!is_map(e))
            continue;
        size_t hi = cut_at(ps, mt_model_sat_add(e->addr, e->size));
        for (size_t i = unseen(ps, cut_at(ps, e->addr)); i < hi && i < ps->n;
             i = unseen(ps, i + 1)) {
            ps->p[i] = (piece_t){.stream = e->stream,
                                 .state = e->action == MT_TS_SEGMENT_MAP ? P_UNMAPPED : P_MAPPED,
                                 .large = e->size > ((uint64_t)2 << 20)};
            ps->next[i] = i + 1;
        }
    }
    for (size_t i = 0; i < ps->n; i++) {
        const mt_ts_segment_t *h = mt__ts_xseg_holding(&ps->x, ps->cut[i]);
        piece_t *p = &ps->p[i];
        if (p->state == P_UNSEEN)
            p->state = h != NULL ? P_MAPPED : P_UNMAPPED;
        if (h != NULL) {
            p->stream = h->stream;
            p->large = h->large;
            p->stack = h->stack;
        }
    }
}

/* The expandable segments before the trace, as maps of their runs, into sl. */
static int pieces_runs(const pieces_t *ps, items_t *sl)
{
    mt_event_rec_t *run = NULL;
    for (size_t i = 0; i < ps->n; i++) {
        const piece_t *p = &ps->p[i];
        uint8_t pool = p->large ? MT_POOL_LARGE : MT_POOL_SMALL;
        if (p->state != P_MAPPED) {
            run = NULL;
            continue;
        }
        uint64_t len = ps->cut[i + 1] - ps->cut[i];
        if (run != NULL && run->stream == (uint32_t)p->stream && run->pool == pool) {
            run->size += len;
            continue;
        }
        if ((run = item_add(sl, p->stack, p->stream)) == NULL)
            return MT_ENOMEM;
        *run = (mt_event_rec_t){.kind = MT_EV_SEGMENT_MAP,
                                .addr = ps->cut[i],
                                .size = len,
                                .stream = (uint32_t)p->stream,
                                .pool = pool};
    }
    return 0;
}

bool mt__ts_free_stack(const mt_ts_t *ts, uint32_t stack)
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
            /* its stack: the free's own where PyTorch took one there (mt__ts_free_stack: named
             * as such), not where the block was made */
            if ((r = item_add(bl, e->stack, e->stream)) == NULL)
                return MT_ENOMEM;
            *r = (mt_event_rec_t){.kind = MT_EV_ALLOC,
                                  .addr = e->addr,
                                  .size = round_block(e->size),
                                  .requested = e->size,
                                  .stream = (uint32_t)e->stream,
                                  .tag = e->tag};
            /* a free completed whose request the trace does not hold: asked before it */
            bl->v[bl->n - 1].pending = e->action == MT_TS_FREE_COMPLETED;
            break;
        default:
            break;
        }
    }
    return 0;
}

/* The segments at the end that the trace did not make (expandable ones: pieces_runs), and
 * the blocks allocated at the end that it did not allocate; the bytes of those it did, by
 * their walk slot + 1. */
static int survivors(const mt_ts_t *ts, unsigned device, const mt__amap_t *segs, walk_t *w,
                     items_t *sl, items_t *bl, mt__amap_t *end_size)
{
    for (size_t i = 0; i < ts->nsegments; i++) {
        const mt_ts_segment_t *sg = &ts->segments[i];
        uint64_t one;
        if ((unsigned)sg->device != device)
            continue;
        if (!sg->expandable && mt__amap_get(segs, sg->addr, &one) != 0) {
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
            uint32_t st = mt__ts_block_stack(ts, b); /* (without frames: made before it) */
            mt_event_rec_t *r = item_add(bl, st != 0 ? st : ts->before_stack, sg->stream);
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
    pieces_t ps = {0};
    int rc = pieces_make(&ps, ts, device, ev, n);
    if (rc == 0) {
        pieces_settle(&ps, ev, n);
        rc = pieces_runs(&ps, &sl);
    }
    if (rc == 0)
        rc = orphans(ts, ev, n, &segs, &w, &sl, &bl);
    size_t norphans = bl.n;
    if (rc == 0)
        rc = survivors(ts, device, &segs, &w, &sl, &bl, &out->end_size);
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
            if (r->kind != MT_EV_ALLOC) {
                out->reserved += r->size;
            } else {
                out->npending += it->pending;
                out->allocated += it->pending ? 0 : r->size;
                r->pool = r->size <= ((uint64_t)1 << 20) ? MT_POOL_SMALL : MT_POOL_LARGE;
            }
            r->allocated = out->allocated + (it->pending ? r->size : 0);
            r->reserved = out->reserved;
        }
        out->n = total;
        out->nsegs = sl.n;
        out->norphans = norphans;
    }
    free(sl.v);
    free(bl.v);
    pieces_fini(&ps);
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
        l->freed = i < p->nsegs + p->npending; /* (its free_completed finds the mark) */
    }
    return 0;
}
