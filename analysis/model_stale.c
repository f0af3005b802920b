/* The uncertain blocks by address (the stale index, c->stale): what a gap leaves uncertain,
 * and what later events prove gone (model.c's header says which).
 *
 * The index holds exactly the uncertain blocks, one (addr, size) record each, in an ordered
 * map (util/btree.h): a gap adds only the blocks certain until then, and a block settled or
 * deleted leaves it at once, each in O(log n). It was a sorted array, into which each gap
 * merged its new blocks and in which freed blocks stayed as dead entries until compacted: a
 * memmove of the whole index per gap, quadratic on a log that loses events often over many
 * live blocks. */
#include "analysis/model_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "memtrace/common.h"
#include "util/assert.h"

static uint64_t end_of(uint64_t addr, uint64_t size)
{
    return size > UINT64_MAX - addr ? UINT64_MAX : addr + size;
}

/* Erases the first n of recs[] from the index (all were inserted). */
static void erase_added(mt__mclass_t *c, const mt__range_t *recs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        mt__bt_cur_t at = mt__bt_lower(&c->stale, recs[i].addr);
        mt_assert(!mt__bt_end(at) && mt__bt_key(mt__bt_get(at)) == recs[i].addr);
        (void)mt__bt_erase(&c->stale, at);
    }
}

int mt__model_stale_add(mt__mclass_t *c, size_t from, size_t to)
{
    mt_assert(from <= to && to <= c->live);
    size_t k = to - from;
    if (k == 0)
        return 0;
    if (c->stale.rsize == 0)
        mt__bt_init(&c->stale, sizeof(mt__range_t));
    /* Many in address order (when there is room to sort them): the inserts then walk the
     * leaves in turn, and a new run of addresses fills whole leaves. */
    mt__range_t *v = k >= 32 ? malloc(2 * k * sizeof(*v)) : NULL;
    mt__range_t one;
    for (size_t i = 0; i < k; i++) {
        const mt__mblock_t *b = &c->blocks[from + i];
        mt_assert(!b->uncertain);
        one = (mt__range_t){b->addr, b->size};
        if (v != NULL) {
            v[i] = one;
            continue;
        }
        /* few, or no room to sort: in table order, undone from the table on failure */
        int rc = mt__bt_insert(&c->stale, &one, NULL);
        mt_assert(rc != MT_EINVAL); /* a certain block has no record, addresses are distinct */
        if (rc != 0) {
            for (size_t j = 0; j < i; j++)
                mt__model_stale_del(c, c->blocks[from + j].addr);
            return MT_ENOMEM;
        }
    }
    if (v == NULL)
        return 0;
    mt__model_sort_ranges(v, k, v + k);
    for (size_t i = 0; i < k; i++) {
        int rc = mt__bt_insert(&c->stale, &v[i], NULL);
        mt_assert(rc != MT_EINVAL); /* a certain block has no record, addresses are distinct */
        if (rc != 0) {
            erase_added(c, v, i);
            free(v);
            return MT_ENOMEM;
        }
    }
    free(v);
    return 0;
}

void mt__model_stale_del(mt__mclass_t *c, uint64_t addr)
{
    mt__bt_cur_t at = mt__bt_lower(&c->stale, addr);
    mt_assert(!mt__bt_end(at) && mt__bt_key(mt__bt_get(at)) == addr);
    (void)mt__bt_erase(&c->stale, at);
}

void mt__model_drop_uncertain_in(mt__mclass_t *c, uint64_t addr, uint64_t size)
{
    if (c->nuncertain == 0)
        return;
    uint64_t end = end_of(addr, size);
    /* From the last record below addr, which may reach into the range (those before it
     * are not looked at: blocks an allocator hands out are disjoint). */
    mt__bt_cur_t it = mt__bt_lower(&c->stale, addr), prev = it;
    mt__bt_prev(&c->stale, &prev);
    if (!mt__bt_end(prev))
        it = prev;
    const mt__range_t *g;
    while ((g = mt__bt_get(it)) != NULL && g->addr < end) {
        mt__range_t r = *g;
        if (end_of(r.addr, r.size) <= addr) {
            mt__bt_next(&it);
            continue;
        }
        mt__mblock_t *b = mt__model_block_find(c, r.addr);
        mt_assert(b != NULL && b->uncertain && b->size == r.size);
        mt__model_block_delete(c, b); /* erases r: the cursor goes with it */
        it = mt__bt_lower(&c->stale, r.addr);
    }
}

/* ---- the largest first (c->big, model_big.c) ---- */

/* Whether r is the record of a live, !pending, uncertain block (not one since gone). */
static bool big_current(const mt__mclass_t *c, mt__range_t r)
{
    const mt__mblock_t *b = mt__model_block_find(c, r.addr);
    return b != NULL && b->uncertain && !b->pending && b->size == r.size;
}

static size_t big_bound(const mt__mclass_t *c)
{
    return c->stale.n;
}

static size_t big_fill(const mt__mclass_t *c, mt__range_t *out)
{
    size_t n = 0;
    for (mt__bt_cur_t it = mt__bt_first(&c->stale); !mt__bt_end(it); mt__bt_next(&it)) {
        const mt__range_t *r = mt__bt_get(it);
        if (big_current(c, *r))
            out[n++] = *r;
    }
    return n;
}

static const mt__mbig_kind_t blocks_kind = {big_current, big_bound, big_fill};

void mt__model_stale_big_add(mt__mclass_t *c, uint64_t addr, uint64_t size)
{
    mt__model_big_push(c, &c->big, &blocks_kind, (mt__range_t){addr, size});
}

/* Every uncertain block, the old way: when big cannot be used. */
static void prune_walk(mt__mclass_t *c, mt__u128 room)
{
    uint64_t max = 0;
    mt__bt_cur_t it = mt__bt_first(&c->stale);
    const mt__range_t *g;
    while ((g = mt__bt_get(it)) != NULL) {
        mt__range_t r = *g;
        mt__mblock_t *b = mt__model_block_find(c, r.addr);
        mt_assert(b != NULL && b->uncertain && b->size == r.size);
        if (!b->pending && (mt__u128)b->size > room) {
            mt__model_block_delete(c, b);
            it = mt__bt_lower(&c->stale, r.addr);
            continue;
        }
        if (!b->pending && b->size > max)
            max = b->size;
        mt__bt_next(&it);
    }
    c->unc_max = max;
}

void mt__model_prune_by_totals(mt__mclass_t *c)
{
    if (c->nuncertain == 0) {
        mt_assert(c->stale.n == 0);
        c->unc_max = 0;
        c->big.n = 0;
        return;
    }
    mt__u128 room = c->asum > c->known ? c->asum - c->known : 0;
    if ((mt__u128)c->unc_max <= room)
        return;
    /* From the largest down: a walk of every uncertain block here, at each event that
     * lowered the room, was quadratic on a log whose uncertain blocks go a few at a time. */
    mt__range_t *v = NULL;
    size_t n = 0;
    if (mt__model_big_take(c, &c->big, &blocks_kind, room, &v, &n) != 0) {
        prune_walk(c, room);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        mt__mblock_t *b =
            i > 0 && v[i].addr == v[i - 1].addr ? NULL : mt__model_block_find(c, v[i].addr);
        if (b != NULL)
            mt__model_block_delete(c, b);
    }
    free(v);
    c->unc_max = c->big.n > 0 ? c->big.h[0].size : 0;
}

int mt__model_stale_check(const mt__mclass_t *c, char *why, size_t whylen)
{
    int rc = mt__bt_check(&c->stale, why, whylen);
    if (rc != 0)
        return rc;
    const char *bad = NULL;
    if (c->stale.n != c->nuncertain)
        bad = "the stale index does not hold one record per uncertain block";
    else if (c->stale.n > 0 && c->stale.rsize != sizeof(mt__range_t))
        bad = "the stale index's records are not ranges";
    for (mt__bt_cur_t it = mt__bt_first(&c->stale); bad == NULL && !mt__bt_end(it);
         mt__bt_next(&it)) {
        const mt__range_t *r = mt__bt_get(it);
        const mt__mblock_t *b = mt__model_block_find(c, r->addr);
        if (b == NULL || !b->uncertain || b->size != r->size)
            bad = "a stale record names no uncertain block of its size";
    }
    if (bad != NULL && why != NULL)
        snprintf(why, whylen, "%s", bad);
    return bad != NULL ? MT_EPROTO : mt__model_big_check(c, &c->big, &blocks_kind, why, whylen);
}
