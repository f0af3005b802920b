/* Offline placement of a recorded warm-up: dynamic storage allocation with every lifetime
 * known. Each item (a transient allocation of the warm-up) gets a strip and an offset so
 * that two items whose lifetimes overlap never overlap in space. Strips are the free
 * extents a reservation can use: bounded ones (free room of segments that hold long-lived
 * blocks, earlier reservations) and one unbounded strip, the new segment, whose used
 * extent the caller minimises. The lower bound of that extent is the peak of live bytes
 * that the bounded strips cannot hold.
 *
 * Two strategies; the placement with the smaller extent is kept (the greedy one on a tie).
 * Both choose a place by the same rule: the smallest free gap between placed items that
 * fits ("best fit in space"), else the lowest free tail of a bounded strip, and only then
 * the tail of the unbounded strip. Keeping tails last makes the plan of a sequence
 * reproduce itself when its own reservation is offered back as a bounded strip (a second
 * warm-up of the same shape), so it fits there again.
 *
 * - Greedy by size (the planners of TFLite and MindSpore's SOMAS do the same): items in
 *   decreasing size (or size weighed by lifetime: two orders are tried), each placed among
 *   the items already placed that overlap it in time. The best on the bundled traces
 *   (within 0.3 % of the peak), but O(n^2): each item scans the placed ones. It runs only
 *   up to MT__PLAN_GREEDY_MAX items (about a second per order there).
 * - The sweep: items in time order, each placed among the free intervals left by the items
 *   live at its start (later ones are placed after it and avoid it in turn), which are kept
 *   in ordered sets (pset.c): by (length, place) for the best-fitting gap, by place with
 *   the longest length of a subtree for the lowest bounded tail that fits, by place for
 *   merging a freed item with its free neighbours. O(n log n) time, O(n) memory. */
#include <stdlib.h>
#include <math.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

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

/* The items placed so far, sorted by (strip, offset), one array per field so that the
 * scan for items overlapping in time reads only the lifetimes until one overlaps. */
typedef struct placed_s {
    uint32_t *t0, *t1, *strip;
    size_t *off, *end;
    size_t n;
} placed_t;

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

/* Where item it goes, given the placed items. hit: scratch of pl->n entries. */
static void choose(const placed_t *pl, uint32_t *hit, mt__plan_item_t *it, const size_t *cap,
                   size_t nstrips)
{
    /* First the items overlapping it in time: most do not (on the bundled traces, 7 % of
     * them), so with SSE2 four lifetimes are tested at once and skipped together. */
    const uint32_t t0 = it->t0, t1 = it->t1;
    size_t m = 0, p = 0;
#ifdef __SSE2__
    /* Unsigned compares as signed ones on values with the top bit flipped. */
    const __m128i flip = _mm_set1_epi32((int)0x80000000u);
    const __m128i vt0 = _mm_xor_si128(_mm_set1_epi32((int)t0), flip);
    const __m128i vt1 = _mm_xor_si128(_mm_set1_epi32((int)t1), flip);
    for (; p + 4 <= pl->n; p += 4) {
        __m128i a = _mm_xor_si128(_mm_loadu_si128((const __m128i *)&pl->t0[p]), flip);
        __m128i b = _mm_xor_si128(_mm_loadu_si128((const __m128i *)&pl->t1[p]), flip);
        __m128i ov = _mm_and_si128(_mm_cmplt_epi32(a, vt1), _mm_cmplt_epi32(vt0, b));
        unsigned bits = (unsigned)_mm_movemask_ps(_mm_castsi128_ps(ov));
        while (bits != 0) {
            hit[m++] = (uint32_t)(p + (unsigned)__builtin_ctz(bits));
            bits &= bits - 1;
        }
    }
#endif
    for (; p < pl->n; p++) {
        hit[m] = (uint32_t)p;
        m += (pl->t0[p] < t1) & (t0 < pl->t1[p]);
    }
    pick_t k = {.gap = SIZE_MAX, .tail = SIZE_MAX};
    uint32_t s = 0;
    size_t cur = 0; /* end of the space taken below, in strip s, by items overlapping it */
    for (size_t h = 0; h < m; h++) {
        size_t p = hit[h];
        while (s < pl->strip[p]) {
            strip_done(&k, s++, cur, cap, nstrips, it->size);
            cur = 0;
        }
        size_t off = pl->off[p];
        if (off > cur && off - cur >= it->size && off - cur < k.gap) {
            k.gap = off - cur;
            k.gap_strip = s;
            k.gap_off = cur;
        }
        if (pl->end[p] > cur)
            cur = pl->end[p];
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

static void placed_insert(placed_t *pl, const mt__plan_item_t *it)
{
    size_t lo = 0, hi = pl->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (pl->strip[mid] < it->strip || (pl->strip[mid] == it->strip && pl->off[mid] < it->off))
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t m = pl->n - lo;
    memmove(&pl->t0[lo + 1], &pl->t0[lo], m * sizeof *pl->t0);
    memmove(&pl->t1[lo + 1], &pl->t1[lo], m * sizeof *pl->t1);
    memmove(&pl->strip[lo + 1], &pl->strip[lo], m * sizeof *pl->strip);
    memmove(&pl->off[lo + 1], &pl->off[lo], m * sizeof *pl->off);
    memmove(&pl->end[lo + 1], &pl->end[lo], m * sizeof *pl->end);
    pl->t0[lo] = it->t0;
    pl->t1[lo] = it->t1;
    pl->strip[lo] = it->strip;
    pl->off[lo] = it->off;
    pl->end[lo] = it->off + it->size;
    pl->n++;
}

/* One greedy pass in the order of keys; *extent = the unbounded strip's. */
static void place_in_order(mt__plan_item_t *items, const order_t *keys, size_t n, placed_t *pl,
                           uint32_t *hit, const size_t *cap, size_t nstrips, size_t *extent)
{
    pl->n = 0;
    *extent = 0;
    for (size_t k = 0; k < n; k++) {
        mt__plan_item_t *it = &items[keys[k].idx];
        choose(pl, hit, it, cap, nstrips);
        if (it->strip + 1u == nstrips && it->off + it->size > *extent)
            *extent = it->off + it->size;
        placed_insert(pl, it);
    }
}

int mt__plan_place_greedy(mt__plan_item_t *items, size_t n, const size_t *cap, size_t nstrips,
                          size_t *extent)
{
    mt_assert(nstrips >= 1 && n <= UINT32_MAX);
    *extent = 0;
    if (n == 0)
        return 0;
    order_t *keys = malloc(n * sizeof *keys);
    uint32_t *hit = malloc(n * sizeof *hit);
    mt__plan_item_t *best = malloc(n * sizeof *best);
    placed_t pl = {
        .t0 = malloc(n * sizeof *pl.t0),
        .t1 = malloc(n * sizeof *pl.t1),
        .strip = malloc(n * sizeof *pl.strip),
        .off = malloc(n * sizeof *pl.off),
        .end = malloc(n * sizeof *pl.end),
    };
    int rc = MT_ENOMEM;
    if (!keys || !hit || !best || !pl.t0 || !pl.t1 || !pl.strip || !pl.off || !pl.end)
        goto out;
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
        place_in_order(items, keys, n, &pl, hit, cap, nstrips, &e);
        if (e < *extent) {
            *extent = e;
            memcpy(best, items, n * sizeof *best);
        }
    }
    memcpy(items, best, n * sizeof *items);
    rc = 0;
out:
    free(keys);
    free(hit);
    free(best);
    free(pl.t0);
    free(pl.t1);
    free(pl.strip);
    free(pl.off);
    free(pl.end);
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
    if (rc == 0 && n <= MT__PLAN_GREEDY_MAX &&
        (rc = mt__plan_place_greedy(items, n, cap, nstrips, extent)) == 0 && *extent <= e)
        goto out;
    if (rc == 0) {
        memcpy(items, sw, n * sizeof *items);
        *extent = e;
    }
out:
    free(sw);
    return rc;
}
