/* The model's segment map: segments (segment_alloc/free) and mapped pages of expandable
 * segments (segment_map/unmap), read by util/segmap.h (the reading the recorder's OOM
 * snapshot shares), with what only the model knows: segments left uncertain by a gap, and
 * the free extents the segments leave around the blocks. */
#include "analysis/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "util/assert.h"

static uint64_t end_of(uint64_t addr, uint64_t size)
{
    return size > UINT64_MAX - addr ? UINT64_MAX : addr + size;
}

/* ---- the largest first (c->seg_big, model_big.c) ---- */

/* Whether r is the record of an uncertain segment below 2^64 - 1 (not one since gone,
 * settled or cut). */
static bool big_current(const mt__mclass_t *c, mt__range_t r)
{
    if (r.addr == UINT64_MAX)
        return false;
    const mt__seg_t *g = mt__segmap_get(mt__segmap_lower(&c->segs, r.addr));
    return g != NULL && g->addr == r.addr && g->size == r.size && g->uncertain;
}

static size_t big_bound(const mt__mclass_t *c)
{
    return c->segs.unc != 0 ? c->segs.t.n : 0; /* (none uncertain: the usual case) */
}

static size_t big_fill(const mt__mclass_t *c, mt__range_t *out)
{
    size_t n = 0;
    if (c->segs.unc == 0)
        return 0;
    for (mt__bt_cur_t it = mt__bt_first(&c->segs.t); !mt__bt_end(it); mt__bt_next(&it)) {
        const mt__seg_t *g = mt__bt_get(it);
        if (g->uncertain)
            out[n++] = (mt__range_t){g->addr, g->size};
    }
    return n;
}

static const mt__mbig_kind_t segs_kind = {big_current, big_bound, big_fill};

static void big_add(mt__mclass_t *c, const mt__seg_t *g)
{
    if (g->addr != UINT64_MAX) /* those at 2^64 - 1: walked (segs_prune) */
        mt__model_big_push(c, &c->seg_big, &segs_kind, (mt__range_t){g->addr, g->size});
}

/* A cut of [addr, end) leaves at most two parts of the segments it met, which keep their
 * flag: an uncertain one's record, with its new extent (one that only touches the range is
 * added again, harmlessly). */
static void big_add_parts(mt__mclass_t *c, uint64_t addr, uint64_t end)
{
    if (c->segs.unc == 0)
        return;
    const mt__seg_t *g = addr > 0 ? mt__segmap_get(mt__segmap_find(&c->segs, addr - 1)) : NULL;
    if (g != NULL && g->uncertain && end_of(g->addr, g->size) == addr)
        big_add(c, g);
    g = mt__segmap_get(mt__segmap_lower(&c->segs, end));
    if (g != NULL && g->uncertain && g->addr == end)
        big_add(c, g);
}

/* ---- segments made certain since the last gap ---- */

/* Notes addr (below 2^64 - 1) as the start of a segment that may be certain. Past their
 * bound (4 per segment, plus 64) the notes are dropped, and the next gap walks every
 * segment: a walk that costs no more than the events that noted them since the gap before. */
static void note_new(mt__mclass_t *c, uint64_t addr)
{
    if (!c->seg_new_ok || addr == UINT64_MAX)
        return;
    size_t bound = 4 * mt__segmap_count(&c->segs) + 64;
    if (c->nseg_new == c->seg_new_cap) {
        size_t cap = c->seg_new_cap ? 2 * c->seg_new_cap : 64;
        uint64_t *v = c->nseg_new < bound ? realloc(c->seg_new, cap * sizeof(*v)) : NULL;
        if (v == NULL) { /* past the bound, or no memory: the full walk then */
            free(c->seg_new);
            c->seg_new = NULL;
            c->nseg_new = c->seg_new_cap = 0;
            c->seg_new_ok = false;
            return;
        }
        c->seg_new = v;
        c->seg_new_cap = cap;
    }
    c->seg_new[c->nseg_new++] = addr;
}

static void mark_one(mt__mclass_t *c, mt__segmap_it_t it)
{
    const mt__seg_t *g = mt__segmap_get(it);
    if (g->uncertain) /* seg_unc_max bounds it already */
        return;
    mt__segmap_set_uncertain(&c->segs, it, true);
    if (g->size > c->seg_unc_max)
        c->seg_unc_max = g->size;
    big_add(c, g);
}

void mt__model_segs_mark_uncertain(mt__mclass_t *c)
{
    if (c->segs.unc != c->segs.bytes && !c->seg_new_ok) { /* every segment */
        for (mt__segmap_it_t it = mt__segmap_first(&c->segs); !mt__segmap_end(it);
             mt__segmap_next(&it))
            mark_one(c, it);
    } else if (c->segs.unc != c->segs.bytes) { /* those noted, and the top's certain prefix */
        for (size_t i = 0; i < c->nseg_new; i++) {
            mt__segmap_it_t it = mt__segmap_find(&c->segs, c->seg_new[i]);
            if (!mt__segmap_end(it))
                mark_one(c, it);
        }
        for (size_t i = 0; i < c->segs.ntop && !c->segs.top[i].uncertain; i++)
            mark_one(c, (mt__segmap_it_t){.i = i, .m = &c->segs});
    }
    mt_assert(c->segs.unc == c->segs.bytes);
    c->nseg_new = 0;
    c->seg_new_ok = true;
}

void mt__model_segs_free(mt__mclass_t *c)
{
    free(c->seg_new);
    c->seg_new = NULL;
    c->nseg_new = c->seg_new_cap = 0;
    c->seg_new_ok = false;
}

int mt__model_seg_cut(mt__mclass_t *c, uint64_t addr, uint64_t size)
{
    /* The blocks first (the two are independent): the kept free extents then see only the
     * blocks the cut really leaves outside every segment. */
    mt__model_drop_uncertain_in(c, addr, size);
    mt__model_free_note_cut(c, addr, size);
    int rc = mt__segmap_cut(&c->segs, addr, size);
    mt__model_free_note_added(c, addr, 0, rc);
    big_add_parts(c, addr, end_of(addr, size));
    note_new(c, end_of(addr, size)); /* what stays of a segment cut in two starts there */
    return rc;
}

int mt__model_seg_add(mt__mclass_t *c, const mt_event_rec_t *ev, bool mapped)
{
    if (ev->size == 0)
        return 0;
    mt__seg_t s = {.addr = ev->addr,
                   .size = ev->size,
                   .stream = ev->stream,
                   .device = ev->device,
                   .pool = ev->pool,
                   .mapped = mapped ? 1 : 0};
    /* What the new range overlapped is gone, uncertain blocks in it too. */
    mt__model_drop_uncertain_in(c, ev->addr, ev->size);
    mt__model_free_note_cut(c, ev->addr, ev->size);
    int rc = mt__segmap_add(&c->segs, &s);
    mt__model_free_note_added(c, ev->addr, ev->size, rc);
    big_add_parts(c, ev->addr, end_of(ev->addr, ev->size)); /* (what it overlapped was cut) */
    /* It starts at addr, or joined a run whose start is noted (a certain one); what it cut
     * in two has a part that starts at its end. */
    note_new(c, ev->addr);
    note_new(c, end_of(ev->addr, ev->size));
    return rc;
}

void mt__model_seg_touch(mt__mclass_t *c, uint64_t addr)
{
    if (c->segs.unc == 0)
        return;
    mt__segmap_it_t it = mt__segmap_find(&c->segs, addr);
    if (!mt__segmap_end(it) && mt__segmap_get(it)->uncertain) {
        mt__segmap_set_uncertain(&c->segs, it, false);
        note_new(c, mt__segmap_get(it)->addr); /* (addr may be within it) */
    }
}

/* Removes the uncertain segment at it: the position of the one after it. */
static mt__segmap_it_t prune_one(mt__mclass_t *c, mt__segmap_it_t it)
{
    mt__seg_t s = *mt__segmap_get(it);
    /* the blocks first, as a cut does; neither changes the map (it stays valid) */
    mt__model_drop_uncertain_in(c, s.addr, s.size);
    mt__model_free_note_cut(c, s.addr, s.size);
    return mt__segmap_remove(&c->segs, it);
}

/* The uncertain segments above room from it on, in address order: the largest of those
 * left. */
static uint64_t prune_walk(mt__mclass_t *c, mt__segmap_it_t it, mt__u128 room)
{
    uint64_t max = 0;
    for (const mt__seg_t *g; (g = mt__segmap_get(it)) != NULL;) {
        if (g->uncertain && (mt__u128)g->size > room) {
            it = prune_one(c, it);
            continue;
        }
        if (g->uncertain && g->size > max)
            max = g->size;
        mt__segmap_next(&it);
    }
    return max;
}

void mt__model_segs_prune(mt__mclass_t *c)
{
    if (c->segs.unc == 0) {
        c->seg_unc_max = 0;
        c->seg_big.n = 0;
        return;
    }
    mt__u128 certain = c->segs.bytes - c->segs.unc;
    mt__u128 room = c->rsum > certain ? c->rsum - certain : 0;
    if ((mt__u128)c->seg_unc_max <= room)
        return;
    /* From the largest down (a walk of every segment here, at each event that lowered the
     * room, was quadratic when the uncertain ones go a few at a time), in address order as
     * that walk went, then those at 2^64 - 1 (kept out of the heap: several may share the
     * address) by a walk. */
    mt__range_t *v = NULL;
    size_t n = 0;
    if (mt__model_big_take(c, &c->seg_big, &segs_kind, room, &v, &n) != 0) {
        c->seg_unc_max = prune_walk(c, mt__segmap_first(&c->segs), room);
        return;
    }
    for (size_t i = 0; i < n; i++) /* (the second record of one: no longer current) */
        if (big_current(c, v[i]))
            (void)prune_one(c, mt__segmap_lower(&c->segs, v[i].addr));
    free(v);
    uint64_t top = prune_walk(c, (mt__segmap_it_t){.i = 0, .m = &c->segs}, room);
    uint64_t big = c->seg_big.n > 0 ? c->seg_big.h[0].size : 0;
    c->seg_unc_max = top > big ? top : big;
}

/* ---- free extents ---- */

void mt__model_sort_ranges(mt__range_t *v, size_t n, mt__range_t *tmp)
{
    if (n < 32) { /* insertion: fewer steps than the passes below */
        for (size_t i = 1; i < n; i++) {
            mt__range_t t = v[i];
            size_t j = i;
            for (; j > 0 && v[j - 1].addr > t.addr; j--)
                v[j] = v[j - 1];
            v[j] = t;
        }
        return;
    }
    uint64_t diff = 0;
    for (size_t i = 1; i < n; i++)
        diff |= v[i].addr ^ v[0].addr;
    mt__range_t *src = v, *dst = tmp;
    for (unsigned shift = 0; shift < 64 && (diff >> shift) != 0; shift += 8) {
        if (((diff >> shift) & 0xff) == 0)
            continue; /* every address has the same byte here */
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++)
            count[((src[i].addr >> shift) & 0xff) + 1]++;
        for (size_t d = 1; d < 257; d++)
            count[d] += count[d - 1];
        for (size_t i = 0; i < n; i++)
            dst[count[(src[i].addr >> shift) & 0xff]++] = src[i];
        mt__range_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != v)
        memcpy(v, src, n * sizeof(*v));
}

/* The blocks as sorted (addr, size) ranges: from map when given, else from the table. */
static mt__range_t *sorted_blocks(const mt__mclass_t *c, const mt_model_map_t *map, size_t *n)
{
    *n = 0;
    size_t want = map ? map->nblocks : c->live;
    mt__range_t *v = malloc((want ? 2 * want : 1) * sizeof(*v));
    if (!v)
        return NULL;
    if (map) {
        for (size_t i = 0; i < map->nblocks; i++)
            v[(*n)++] = (mt__range_t){map->blocks[i].addr, map->blocks[i].size};
        return v;
    }
    for (size_t i = 0; i < c->live; i++)
        v[(*n)++] = (mt__range_t){c->blocks[i].addr, c->blocks[i].size};
    mt__model_sort_ranges(v, *n, v + *n);
    return v;
}

mt__range_t *mt__model_sorted_blocks(const mt__mclass_t *c, size_t *n)
{
    return sorted_blocks(c, NULL, n);
}

void mt__model_sweep(const mt__mclass_t *c, const mt__range_t *blk, size_t nb, uint64_t *total,
                     uint64_t *largest, mt_model_map_t *map)
{
    *total = *largest = 0;
    size_t k = 0, i = 0;
    mt__u128 sum = 0;
    for (mt__segmap_it_t it = mt__segmap_first(&c->segs); !mt__segmap_end(it);
         mt__segmap_next(&it), i++) {
        const mt__seg_t *g = mt__segmap_get(it);
        uint64_t a = g->addr, e = end_of(a, g->size), cur = a, used = 0;
        while (k < nb && end_of(blk[k].addr, blk[k].size) <= a)
            k++;
        for (size_t j = k; j < nb && blk[j].addr < e; j++) {
            uint64_t ba = blk[j].addr > a ? blk[j].addr : a;
            uint64_t be = end_of(blk[j].addr, blk[j].size);
            be = be < e ? be : e;
            if (ba > cur) {
                sum += ba - cur;
                *largest = ba - cur > *largest ? ba - cur : *largest;
            }
            if (be > cur) {
                used += be - (ba > cur ? ba : cur);
                cur = be;
            }
        }
        if (e > cur) {
            sum += e - cur;
            *largest = e - cur > *largest ? e - cur : *largest;
        }
        if (map)
            map->segs[i] = (mt_model_seg_t){.addr = g->addr,
                                            .size = g->size,
                                            .used = used,
                                            .stream = g->stream,
                                            .pool = g->pool,
                                            .mapped = g->mapped,
                                            .uncertain = g->uncertain};
    }
    *total = mt__model_sat(sum);
}

int mt__model_free_extents(const mt__mclass_t *c, uint64_t *total, uint64_t *largest,
                           mt_model_map_t *map)
{
    *total = *largest = 0;
    size_t nb = 0;
    mt__range_t *blk = sorted_blocks(c, map, &nb);
    if (!blk)
        return MT_ENOMEM;
    if (map) {
        size_t ns = mt__segmap_count(&c->segs);
        map->segs = malloc((ns ? ns : 1) * sizeof(*map->segs));
        if (!map->segs) {
            free(blk);
            return MT_ENOMEM;
        }
        map->nsegs = ns;
    }
    mt__model_sweep(c, blk, nb, total, largest, map);
    free(blk);
    return 0;
}

/* ---- checker ---- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The notes' invariants (model_internal.h): each certain segment below 2^64 - 1 starts at a
 * noted address, checked against a sorted copy (skipped when there is no memory for it). */
static const char *notes_check(const mt__mclass_t *c)
{
    if (c->nseg_new > c->seg_new_cap || (!c->seg_new_ok && c->nseg_new != 0))
        return "segment notes: more than their room, or kept while off";
    for (size_t i = 0; i < c->segs.ntop; i++)
        if (i > 0 && !c->segs.top[i].uncertain && c->segs.top[i - 1].uncertain)
            return "a certain segment at 2^64 - 1 after an uncertain one";
    if (!c->seg_new_ok)
        return NULL;
    uint64_t *v = malloc((c->nseg_new ? c->nseg_new : 1) * sizeof(*v));
    if (v == NULL)
        return NULL;
    if (c->nseg_new > 0)
        memcpy(v, c->seg_new, c->nseg_new * sizeof(*v));
    qsort(v, c->nseg_new, sizeof(*v), cmp_u64);
    const char *bad = NULL;
    if (c->nseg_new > 0 && v[c->nseg_new - 1] == UINT64_MAX)
        bad = "segment notes: 2^64 - 1 noted";
    for (mt__bt_cur_t it = mt__bt_first(&c->segs.t); bad == NULL && !mt__bt_end(it);
         mt__bt_next(&it)) {
        const mt__seg_t *g = mt__bt_get(it);
        if (g->uncertain)
            continue;
        size_t lo = 0, hi = c->nseg_new; /* the first note >= g->addr */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (v[mid] < g->addr)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == c->nseg_new || v[lo] != g->addr)
            bad = "a certain segment starts at no noted address (the next gap would miss it)";
    }
    free(v);
    return bad;
}

int mt__model_segs_check(const mt__mclass_t *c, char *why, size_t whylen)
{
    int rc = mt__segmap_check(&c->segs, why, whylen);
    for (mt__segmap_it_t it = mt__segmap_first(&c->segs); rc == 0 && !mt__segmap_end(it);
         mt__segmap_next(&it))
        if (mt__segmap_get(it)->uncertain && mt__segmap_get(it)->size > c->seg_unc_max) {
            if (why)
                snprintf(why, whylen, "uncertain segment above seg_unc_max");
            rc = MT_EPROTO;
        }
    rc = rc ? rc : mt__model_big_check(c, &c->seg_big, &segs_kind, why, whylen);
    const char *bad = rc == 0 ? notes_check(c) : NULL;
    if (bad != NULL) {
        if (why)
            snprintf(why, whylen, "%s", bad);
        rc = MT_EPROTO;
    }
    return rc;
}
