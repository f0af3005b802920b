/* Offline placement of a recorded warm-up: dynamic storage allocation with every lifetime
 * known. Each item (a transient allocation of the warm-up) gets a strip and an offset so
 * that two items whose lifetimes overlap never overlap in space. Strips are the free
 * extents a reservation can use: bounded ones (free room of segments that hold long-lived
 * blocks, earlier reservations) and one unbounded strip, the new segment, whose used
 * extent the caller minimises. The lower bound of that extent is the peak of live bytes
 * that the bounded strips cannot hold.
 *
 * Two strategies; the placement with the smaller extent is kept (the greedy one on a tie),
 * so a plan is never worse than the greedy one alone, which was the planner before.
 * Both choose a place by the same rule: the smallest free gap between placed items that
 * fits ("best fit in space"), else the lowest free tail of a bounded strip, and only then
 * the tail of the unbounded strip. Keeping tails last makes the plan of a sequence
 * reproduce itself when its own reservation is offered back as a bounded strip (a second
 * warm-up of the same shape), so it fits there again.
 *
 * - Greedy by size (the planners of TFLite and MindSpore's SOMAS do the same): items in
 *   decreasing size (or size weighed by lifetime: two orders are tried), each placed among
 *   the items already placed that overlap it in time. The best on the bundled traces
 *   (within 0.3 % of the peak). Scanning every placed item per item made it O(n^2); the
 *   placed items are indexed by time in levels of blocks (grid_t), so each item visits
 *   about those overlapping it, the live set of a training trace. Its work is counted, and
 *   past mt__plan_budget(n) = O(n log n) it gives up (a sequence whose blocks mostly live
 *   at the same time), leaving the sweep's placement.
 * - The sweep: items in time order, each placed among the free intervals left by the items
 *   live at its start (later ones are placed after it and avoid it in turn), which are kept
 *   in ordered sets (pset.c): by (length, place) for the best-fitting gap, by place with
 *   the longest length of a subtree for the lowest bounded tail that fits, by place for
 *   merging a freed item with its free neighbours. O(n log n) time, O(n) memory. */
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "allocator/internal.h"

typedef struct key_s {
    double prim; /* the order's key: larger first */
    size_t size;
    uint32_t life, t0, idx;
} order_t;

/* The orders tried; the placement with the smallest extent is kept. By size alone is the
 * best on the bundled traces (within 0.3 % of the peak); weighing size by the square root
 * of the lifetime places long-lived blocks first, which wins where many large blocks
 * live long (random lifetimes: 1.008 against 1.053 of the peak in test_warmup.c). */
enum { ORDER_SIZE, ORDER_SIZE_SQRT_LIFE, ORDER_N };

/* prim, then larger; then longer-lived; then earlier: a total order, so the plan is the
 * same on every platform's qsort. */
static int key_cmp(const void *x, const void *y)
{
    const order_t *a = x, *b = y;
    if (a->prim != b->prim)
        return a->prim > b->prim ? -1 : 1;
    if (a->size != b->size)
        return a->size > b->size ? -1 : 1;
    if (a->life != b->life)
        return a->life > b->life ? -1 : 1;
    if (a->t0 != b->t0)
        return a->t0 < b->t0 ? -1 : 1;
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* The items placed so far, indexed by time in levels: level l cuts the time axis (op
 * indices) into blocks of 2^(BLK_SHIFT + l) ops and holds the items whose lifetime is at
 * most 2^LVL_SPAN of its blocks (above level 0, more than half that), each filed in every
 * block of the level its lifetime meets (2^LVL_SPAN + 1 at most); a block keeps its items
 * sorted by (strip, offset) in one key. The placed items overlapping [t0, t1) in time are
 * in the row of blocks that interval meets at each level; one met in several blocks of a
 * row is taken in the first. Each block gives those it holds as a run in place order, and
 * the runs are merged pairwise. Most lifetimes fit level 0 (16 k ops), so most of what
 * overlaps an item comes in one or two long runs; a long item meets each placed one in a
 * bounded number of blocks, never once per block of its own lifetime. The work of an item
 * is about the entries of its rows plus the items overlapping it times the log of the
 * number of runs: work counts the blocks and entries visited and the entries moved; past
 * budget the greedy pass gives up (the sweep's placement is kept), so the whole stays
 * O(n log n). */
#define BLK_SHIFT    10
#define LVL_SPAN     4
#define LVL_SHIFT(l) (BLK_SHIFT + (l))
#define LVL_MAX      (33 - BLK_SHIFT - LVL_SPAN) /* levels for any lifetime < 2^32 */

typedef struct ient_s {
    uint64_t key;    /* strip << 40 | off / MT__MIN_BLOCK */
    uint64_t end;    /* off + size */
    uint32_t t0, t1; /* lifetime (a query reads no item) */
} ient_t;

typedef struct blist_s {
    ient_t *e; /* ascending key */
    uint32_t n, cap;
} blist_t;

typedef struct level_s {
    blist_t *blk; /* nblk blocks of 2^LVL_SHIFT(level) ops */
    size_t nblk;
    size_t n; /* items filed at this level */
} level_t;

/* Invariants: every placed item is filed at level level_of(its lifetime) < nlvl, in each
 * block of that level its lifetime meets and nowhere else, and counted in that level's n;
 * during a query, run[0..nrun] are the ascending starts of its runs in mk/me, then m;
 * cap >= m, and run holds cap + 1. */
typedef struct grid_s {
    const mt__plan_item_t *items;
    level_t lvl[LVL_MAX];
    uint32_t nlvl;
    uint64_t *mk, *me; /* keys and ends of a query's overlapping items, in place order */
    uint64_t *tk, *te; /* scratch for merging them */
    uint32_t *run;
    size_t m, cap;
    uint64_t work, budget;
} grid_t;

#define KEY_OFF_BITS 40
static uint64_t place_key(uint32_t strip, size_t off)
{
    return (uint64_t)strip << KEY_OFF_BITS | (uint64_t)(off / MT__MIN_BLOCK);
}

static uint32_t level_of(uint32_t life)
{
    uint32_t l = 0;
    while (((uint64_t)1 << (LVL_SHIFT(l) + LVL_SPAN)) < life)
        l++;
    return l;
}

static int grid_init(grid_t *g, const mt__plan_item_t *items, size_t n)
{
    uint32_t span = 0, life = 1;
    for (size_t i = 0; i < n; i++) {
        span = items[i].t1 > span ? items[i].t1 : span;
        life = items[i].t1 - items[i].t0 > life ? items[i].t1 - items[i].t0 : life;
    }
    *g = (grid_t){.items = items, .nlvl = level_of(life) + 1, .cap = 64};
    for (uint32_t l = 0; l < g->nlvl; l++) {
        level_t *v = &g->lvl[l];
        v->nblk = ((size_t)span >> LVL_SHIFT(l)) + 1;
        if ((v->blk = calloc(v->nblk, sizeof *v->blk)) == NULL)
            return MT_ENOMEM;
    }
    g->mk = malloc(g->cap * sizeof *g->mk);
    g->tk = malloc(g->cap * sizeof *g->tk);
    g->me = malloc(g->cap * sizeof *g->me);
    g->te = malloc(g->cap * sizeof *g->te);
    g->run = malloc((g->cap + 1) * sizeof *g->run);
    return g->mk && g->tk && g->me && g->te && g->run ? 0 : MT_ENOMEM;
}

static void grid_reset(grid_t *g)
{
    for (uint32_t l = 0; l < g->nlvl; l++) {
        for (size_t b = 0; b < g->lvl[l].nblk; b++)
            g->lvl[l].blk[b].n = 0;
        g->lvl[l].n = 0;
    }
}

static void grid_fini(grid_t *g)
{
    for (uint32_t l = 0; l < g->nlvl; l++) {
        for (size_t b = 0; g->lvl[l].blk != NULL && b < g->lvl[l].nblk; b++)
            free(g->lvl[l].blk[b].e);
        free(g->lvl[l].blk);
    }
    free(g->mk);
    free(g->tk);
    free(g->me);
    free(g->te);
    free(g->run);
}

static int grid_room(grid_t *g, size_t need)
{
    if (need <= g->cap)
        return 0;
    size_t cap = g->cap;
    while (cap < need)
        cap *= 2;
    uint64_t *mk = realloc(g->mk, cap * sizeof *mk);
    if (mk != NULL)
        g->mk = mk;
    uint64_t *tk = realloc(g->tk, cap * sizeof *tk);
    if (tk != NULL)
        g->tk = tk;
    uint64_t *me = realloc(g->me, cap * sizeof *me);
    if (me != NULL)
        g->me = me;
    uint64_t *te = realloc(g->te, cap * sizeof *te);
    if (te != NULL)
        g->te = te;
    uint32_t *run = realloc(g->run, (cap + 1) * sizeof *run);
    if (run != NULL)
        g->run = run;
    if (mk == NULL || tk == NULL || me == NULL || te == NULL || run == NULL)
        return MT_ENOMEM;
    g->cap = cap;
    return 0;
}

/* Merges the nrun runs of mk/me (run[0..nrun]) pairwise into one. */
static void grid_merge(grid_t *g, size_t nrun)
{
    uint64_t *mk = g->mk, *tk = g->tk;
    uint64_t *me = g->me, *te = g->te;
    uint32_t *run = g->run;
    while (nrun > 1) {
        size_t k = 0;
        for (size_t r = 0; r < nrun; r += 2) {
            uint32_t lo = run[r], mid = run[r + 1], hi = r + 2 <= nrun ? run[r + 2] : mid;
            uint32_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) {
                if (mk[i] < mk[j]) {
                    tk[o] = mk[i];
                    te[o++] = me[i++];
                } else {
                    tk[o] = mk[j];
                    te[o++] = me[j++];
                }
            }
            for (; i < mid; i++, o++) {
                tk[o] = mk[i];
                te[o] = me[i];
            }
            for (; j < hi; j++, o++) {
                tk[o] = mk[j];
                te[o] = me[j];
            }
            run[k++] = lo; /* k <= r: the starts still to read are not overwritten */
        }
        run[k] = (uint32_t)g->m;
        nrun = k;
        g->work += g->m;
        uint64_t *key = mk;
        uint64_t *end = me;
        mk = tk;
        me = te;
        tk = key;
        te = end;
    }
    g->mk = mk;
    g->me = me;
    g->tk = tk;
    g->te = te;
}

/* g->mk/me[0..m) = the keys and ends of the placed items overlapping [t0, t1) in time, in place
 * order. */
static int grid_query(grid_t *g, uint32_t t0, uint32_t t1)
{
    size_t nrun = 0;
    g->m = 0;
    for (uint32_t l = 0; l < g->nlvl; l++) {
        const level_t *v = &g->lvl[l];
        if (v->n == 0)
            continue;
        unsigned sh = LVL_SHIFT(l);
        size_t b0 = t0 >> sh, b1 = (size_t)(t1 - 1) >> sh;
        for (size_t b = b0; b <= b1; b++) {
            const blist_t *bl = &v->blk[b];
            g->work += 1 + bl->n;
            if (bl->n == 0)
                continue;
            if (grid_room(g, g->m + bl->n) != 0)
                return MT_ENOMEM;
            /* One starting before this block is in the one before too: taken there. So
             * those taken start in [from, t1) (from < t1, so that one compare tells) and
             * end after t0. */
            uint32_t from = b > b0 ? (uint32_t)(b << sh) : 0, len = t1 - from;
            uint64_t *mk = g->mk, *me = g->me;
            size_t m = g->m;
            for (uint32_t j = 0; j < bl->n; j++) {
                const ient_t *e = &bl->e[j];
                if (e->t0 - from < len && t0 < e->t1) {
                    mk[m] = e->key;
                    me[m++] = e->end;
                }
            }
            if (m > g->m)
                g->run[nrun++] = (uint32_t)g->m;
            g->m = m;
        }
    }
    g->run[nrun] = (uint32_t)g->m;
    grid_merge(g, nrun);
    return 0;
}

/* Files placed item x in the blocks its lifetime meets at its level. */
static int grid_insert(grid_t *g, uint32_t x)
{
    const mt__plan_item_t *it = &g->items[x];
    ient_t e = {place_key(it->strip, it->off), it->off + it->size, it->t0, it->t1};
    uint32_t l = level_of(it->t1 - it->t0);
    mt_assert(l < g->nlvl);
    level_t *v = &g->lvl[l];
    unsigned sh = LVL_SHIFT(l);
    v->n++;
    for (size_t b = it->t0 >> sh; b <= (size_t)(it->t1 - 1) >> sh; b++) {
        blist_t *bl = &v->blk[b];
        if (bl->n == bl->cap) {
            uint32_t cap = bl->cap ? 2 * bl->cap : 8;
            ient_t *ne = realloc(bl->e, cap * sizeof *ne);
            if (ne == NULL)
                return MT_ENOMEM;
            bl->e = ne;
            bl->cap = cap;
        }
        uint32_t lo = 0, hi = bl->n;
        while (lo < hi) {
            uint32_t mid = (lo + hi) / 2;
            if (bl->e[mid].key < e.key)
                lo = mid + 1;
            else
                hi = mid;
        }
        memmove(&bl->e[lo + 1], &bl->e[lo], (bl->n - lo) * sizeof *bl->e);
        bl->e[lo] = e;
        bl->n++;
        g->work += bl->n - lo;
    }
    return 0;
}

/* The end of a strip's scan: offers its tail (bounded strips) or notes it (the last). */
typedef struct pick_s {
    size_t gap, gap_off, tail, tail_off, utail;
    uint32_t gap_strip, tail_strip;
} pick_t;

static void strip_done(pick_t *k, uint32_t s, size_t cur, const size_t *cap, size_t nstrips,
                       size_t size)
{
    if (s + 1 == nstrips)
        k->utail = cur;
    else if (cap[s] >= cur && cap[s] - cur >= size && cur < k->tail) {
        k->tail = cur;
        k->tail_strip = s;
    }
}

/* Where item it goes, given the placed items overlapping it in time (g->mk/me, in place
 * order). */
static void choose(const grid_t *g, mt__plan_item_t *it, const size_t *cap, size_t nstrips)
{
    pick_t k = {.gap = SIZE_MAX, .tail = SIZE_MAX};
    uint32_t s = 0;
    size_t cur = 0; /* end of the space taken below, in strip s, by items overlapping it */
    for (size_t h = 0; h < g->m; h++) {
        uint32_t strip = (uint32_t)(g->mk[h] >> KEY_OFF_BITS);
        size_t off = (size_t)(g->mk[h] & (((uint64_t)1 << KEY_OFF_BITS) - 1)) * MT__MIN_BLOCK;
        while (s < strip) {
            strip_done(&k, s++, cur, cap, nstrips, it->size);
            cur = 0;
        }
        if (off > cur && off - cur >= it->size && off - cur < k.gap) {
            k.gap = off - cur;
            k.gap_strip = s;
            k.gap_off = cur;
        }
        if (g->me[h] > cur)
            cur = g->me[h];
    }
    for (; s < nstrips; s++, cur = 0)
        strip_done(&k, s, cur, cap, nstrips, it->size);
    if (k.gap != SIZE_MAX) {
        it->strip = k.gap_strip;
        it->off = k.gap_off;
    } else if (k.tail != SIZE_MAX) {
        it->strip = k.tail_strip;
        it->off = k.tail;
    } else {
        it->strip = (uint32_t)(nstrips - 1);
        it->off = k.utail;
    }
}

/* One greedy pass in the order of keys; *extent = the unbounded strip's. MT_EAGAIN when
 * the work passed the budget. */
static int place_in_order(mt__plan_item_t *items, const order_t *keys, size_t n, grid_t *g,
                          const size_t *cap, size_t nstrips, size_t *extent)
{
    grid_reset(g);
    *extent = 0;
    for (size_t k = 0; k < n; k++) {
        mt__plan_item_t *it = &items[keys[k].idx];
        int rc = grid_query(g, it->t0, it->t1);
        if (rc != 0)
            return rc;
        choose(g, it, cap, nstrips);
        if (it->strip + 1u == nstrips && it->off + it->size > *extent)
            *extent = it->off + it->size;
        if ((rc = grid_insert(g, keys[k].idx)) != 0)
            return rc;
        if (g->work > g->budget)
            return MT_EAGAIN;
    }
    return 0;
}

int mt__plan_place_greedy(mt__plan_item_t *items, size_t n, const size_t *cap, size_t nstrips,
                          size_t *extent, uint64_t budget, uint64_t *work)
{
    if (work != NULL)
        *work = 0;
    mt_assert(nstrips >= 1 && nstrips < ((size_t)1 << (64 - KEY_OFF_BITS)) && n <= UINT32_MAX);
    *extent = 0;
    if (n == 0)
        return 0;
    order_t *keys = malloc(n * sizeof *keys);
    mt__plan_item_t *best = malloc(n * sizeof *best);
    grid_t g;
    int rc = grid_init(&g, items, n);
    if (rc != 0 || keys == NULL || best == NULL) {
        rc = MT_ENOMEM;
        goto out;
    }
    g.budget = budget;
    *extent = SIZE_MAX;
    for (int order = 0; order < ORDER_N; order++) {
        for (size_t i = 0; i < n; i++) {
            const mt__plan_item_t *it = &items[i];
            mt_assert(it->t0 < it->t1 && it->size > 0);
            uint32_t life = it->t1 - it->t0;
            double prim = (double)it->size;
            if (order == ORDER_SIZE_SQRT_LIFE)
                prim *= sqrt((double)life);
            keys[i] = (order_t){prim, it->size, life, it->t0, (uint32_t)i};
        }
        qsort(keys, n, sizeof *keys, key_cmp);
        size_t e = 0;
        if ((rc = place_in_order(items, keys, n, &g, cap, nstrips, &e)) != 0)
            goto out;
        if (e < *extent) {
            *extent = e;
            memcpy(best, items, n * sizeof *best);
        }
    }
    memcpy(items, best, n * sizeof *items);
out:
    if (work != NULL)
        *work = g.work;
    grid_fini(&g);
    free(keys);
    free(best);
    return rc;
}

/* ---- the sweep ---- */

/* The free intervals of the sweep. Each is [off, end) of a strip, end = SIZE_MAX for the
 * unbounded strip's tail (always there), cap[s] for a bounded strip's tail. Every free
 * interval is in addr, keyed (strip, off), val = end; the other tails and gaps are also in
 * exactly one of tails, keyed (off, strip), val = length, and gaps, keyed (length, strip
 * and off / MT__MIN_BLOCK in one word), val = end. No two free intervals of a strip touch. */
typedef struct sweep_s {
    mt__pset_t addr, tails, gaps;
    const size_t *cap;
    uint32_t last; /* the unbounded strip */
    size_t utail;  /* start of the unbounded strip's tail */
} sweep_t;

#define GAP_OFF_BITS 40
static uint64_t gap_k2(uint32_t s, size_t off)
{
    return (uint64_t)s << GAP_OFF_BITS | (uint64_t)(off / MT__MIN_BLOCK);
}

/* Files [off, end) of strip s (not empty) in addr and in its class. */
static int free_add(sweep_t *w, uint32_t s, size_t off, size_t end)
{
    mt_assert(off < end && off % MT__MIN_BLOCK == 0 && (end < SIZE_MAX || s == w->last));
    int rc = mt__pset_insert(&w->addr, s, off, end);
    if (rc != 0)
        return rc;
    if (end == SIZE_MAX) {
        w->utail = off;
        return 0;
    }
    if (s != w->last && end == w->cap[s])
        return mt__pset_insert(&w->tails, off, s, end - off);
    return mt__pset_insert(&w->gaps, end - off, gap_k2(s, off), end);
}

static void free_del(sweep_t *w, uint32_t s, size_t off, size_t end)
{
    bool ok = mt__pset_erase(&w->addr, s, off);
    if (end == SIZE_MAX)
        ok = ok && s == w->last;
    else if (s != w->last && end == w->cap[s])
        ok = ok && mt__pset_erase(&w->tails, off, s);
    else
        ok = ok && mt__pset_erase(&w->gaps, end - off, gap_k2(s, off));
    mt_assert(ok);
    (void)ok;
}

/* Places it at the start of a free interval chosen by the rule at the top of the file. */
static int sweep_alloc(sweep_t *w, mt__plan_item_t *it)
{
    uint32_t s = w->last;
    size_t off = w->utail, end = SIZE_MAX;
    const mt__pset_node_t *x = mt__pset_ceil(&w->gaps, it->size, 0);
    if (x != NULL) {
        s = (uint32_t)(x->k2 >> GAP_OFF_BITS);
        off = (size_t)(x->k2 & (((uint64_t)1 << GAP_OFF_BITS) - 1)) * MT__MIN_BLOCK;
        end = x->val;
    } else if ((x = mt__pset_first_val(&w->tails, it->size)) != NULL) {
        s = (uint32_t)x->k2;
        off = x->k1;
        end = off + x->val;
    }
    free_del(w, s, off, end);
    it->strip = s;
    it->off = off;
    return end - off > it->size ? free_add(w, s, off + it->size, end) : 0;
}

/* Gives it's place back, merged with the free intervals beside it. */
static int sweep_free(sweep_t *w, const mt__plan_item_t *it)
{
    uint32_t s = it->strip;
    size_t lo = it->off, hi = it->off + it->size;
    const mt__pset_node_t *x = mt__pset_below(&w->addr, s, lo);
    if (x != NULL && x->k1 == s && x->val == lo) {
        lo = x->k2;
        free_del(w, s, lo, it->off);
    }
    x = mt__pset_ceil(&w->addr, s, hi);
    if (x != NULL && x->k1 == s && x->k2 == hi) {
        size_t end = x->val;
        free_del(w, s, hi, end);
        hi = end;
    }
    return free_add(w, s, lo, hi);
}

int mt__plan_place_sweep(mt__plan_item_t *items, size_t n, const size_t *cap, size_t nstrips,
                         size_t *extent)
{
    mt_assert(nstrips >= 1 && nstrips < ((size_t)1 << (64 - GAP_OFF_BITS)) && n <= UINT32_MAX / 2);
    *extent = 0;
    if (n == 0)
        return 0;
    /* The items' starts and ends in time order, ends first at equal times (an item ending
     * at t and one starting at t do not overlap): a counting sort by time, O(n + span);
     * the recorded ops make every time distinct, but the contract does not ask it. */
    size_t span = 0;
    for (size_t i = 0; i < n; i++) {
        mt_assert(items[i].t0 < items[i].t1 && items[i].size % MT__MIN_BLOCK == 0);
        if ((size_t)items[i].t1 + 1 > span)
            span = (size_t)items[i].t1 + 1;
    }
    uint32_t *first = calloc(span + 1, sizeof *first); /* first event of each time */
    uint32_t *ev = malloc(2 * n * sizeof *ev);         /* 2i = start of i; 2i + 1 = end */
    sweep_t w = {.cap = cap, .last = (uint32_t)(nstrips - 1)};
    int rc = MT_ENOMEM;
    if (first == NULL || ev == NULL)
        goto fail_ev;
    if (mt__pset_init(&w.addr, nstrips + n / 4) != 0)
        goto fail_addr;
    if (mt__pset_init(&w.tails, nstrips) != 0)
        goto fail_tails;
    if (mt__pset_init(&w.gaps, n / 4) != 0)
        goto fail_gaps;
    for (size_t i = 0; i < n; i++) {
        first[items[i].t0 + 1]++;
        first[items[i].t1 + 1]++;
    }
    for (size_t t = 0; t < span; t++)
        first[t + 1] += first[t];
    for (size_t i = 0; i < n; i++) /* the ends first, */
        ev[first[items[i].t1]++] = (uint32_t)(2 * i + 1);
    for (size_t i = 0; i < n; i++) /* then the starts */
        ev[first[items[i].t0]++] = (uint32_t)(2 * i);
    rc = 0;
    for (uint32_t s = 0; s < w.last && rc == 0; s++)
        if (cap[s] > 0)
            rc = free_add(&w, s, 0, cap[s]);
    if (rc == 0)
        rc = free_add(&w, w.last, 0, SIZE_MAX); /* whatever cap[last] says */
    for (size_t e = 0; e < 2 * n && rc == 0; e++) {
        mt__plan_item_t *it = &items[ev[e] / 2];
        if (ev[e] % 2 == 1) {
            rc = sweep_free(&w, it);
            continue;
        }
        rc = sweep_alloc(&w, it);
        if (it->strip == w.last && it->off + it->size > *extent)
            *extent = it->off + it->size;
    }
    mt__pset_fini(&w.gaps);
fail_gaps:
    mt__pset_fini(&w.tails);
fail_tails:
    mt__pset_fini(&w.addr);
fail_addr:
fail_ev:
    free(first);
    free(ev);
    return rc;
}

int mt__plan_place(mt__plan_item_t *items, size_t n, const size_t *cap, size_t nstrips,
                   size_t *extent)
{
    *extent = 0;
    if (n == 0)
        return 0;
    mt__plan_item_t *sw = malloc(n * sizeof *sw);
    if (sw == NULL)
        return MT_ENOMEM;
    memcpy(sw, items, n * sizeof *sw);
    size_t e = 0;
    int rc = mt__plan_place_sweep(sw, n, cap, nstrips, &e);
    if (rc == 0) {
        rc = mt__plan_place_greedy(items, n, cap, nstrips, extent, mt__plan_budget(n), NULL);
        if (rc == 0 && *extent <= e)
            goto out;
        if (rc == MT_EAGAIN)
            rc = 0; /* too costly for this sequence: the sweep's */
    }
    if (rc == 0) {
        memcpy(items, sw, n * sizeof *items);
        *extent = e;
    }
out:
    free(sw);
    return rc;
}
