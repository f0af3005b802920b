/* The per-thread caches' invariants (mt__tcache_t, tcache_impl.h), for mt_alloc_check. */
#include <string.h>

#include "allocator/tcache_impl.h"

bool mt__tc_in_owner(const mt_block_t *b)
{
    /* The live table changes only under mu, which the checker holds. */
    uint64_t v;
    return b->tce->b == b && mt__amap_get(&b->tce->c->live, b->addr, &v) == 0 &&
           v == (uint64_t)(uintptr_t)b->tce;
}

size_t mt__tc_count(const mt_alloc_t *a)
{
    size_t n = 0;
    for (const mt__tcache_t *c = a->caches; c != NULL; c = c->next)
        n++;
    return n;
}

/* Adds the counters' values of c's held blocks to sum, and their bytes to *bytes. */
static const char *check_one(mt_alloc_t *a, mt__tcache_t *c, tc_counts_t *sum, int64_t *bytes)
{
    size_t held = 0, plan = 0;
    for (size_t i = 0; i < c->live.cap; i++) {
        if (c->live.keys[i] == 0)
            continue;
        const mt__tc_ent_t *e = (const mt__tc_ent_t *)(uintptr_t)c->live.vals[i];
        const mt_block_t *b = e->b;
        if (b == NULL || e->c != c || b->tce != e || e->addr != c->live.keys[i])
            return "tcache: live entry names a block of another owner";
        if (e->addr != b->addr || e->size != b->size || e->req != b->requested ||
            e->tag != b->tag || e->used != (b->nuses != 0))
            return "tcache: entry's copy of its block's fields differs from the block";
        if (b->state != MT_BLOCK_ACTIVE_ALLOCATED || mt__addrmap_get(&a->map, b->addr) != b)
            return "tcache: owned block not allocated in the address map";
        if (e->sp != mt__stat_pool(b->seg->pool) || e->sr != b->seg->bins->sr)
            return "tcache: owned block's stream or pool disagrees with its segment";
        if (e->pver != 0 && e->pver == a->plan_ver && !b->planned)
            return "tcache: block with the plan's current version not planned";
        if (e->pver > a->plan_ver)
            return "tcache: block's plan version ahead of the plan's";
        if (e->req == 0 || e->req > b->size)
            return "tcache: owned block's requested size outside (0, size]";
        plan += e->pver != 0;
        if (e->held) {
            held++;
            mt__tc_counts_add(sum, e->sp, e->tag, (int64_t)e->size, (int64_t)e->req, 1);
            *bytes += (int64_t)e->size;
        }
    }
    if (c->last != NULL && (c->last->c != c || c->last->b == NULL || c->last->b->tce != c->last))
        return "tcache: the last block handed out is not owned";
    if (c->last != NULL && c->last_addr != c->last->addr)
        return "tcache: the last block's address copy is not its address";
    if (plan != c->nplan)
        return "tcache: count of owned planned blocks wrong";
    size_t nlist = 0;
    uint64_t newer = UINT64_MAX;
    for (const mt__tc_ent_t *e = c->held; e != NULL; e = e->next, nlist++) {
        if (nlist >= held || e->c != c || !e->held)
            return "tcache: held list names a block not held in this cache";
        if (e->seq >= newer)
            return "tcache: held list not newest first";
        newer = e->seq;
    }
    if (nlist != held || held != c->nheld || held > TC_HELD)
        return "tcache: held blocks and the held list disagree";
    return NULL;
}

/* The truth, the counters minus the held blocks' values, must stay within [0, peak]. */
static const char *check_truth(const mt_alloc_t *a, const tc_counts_t *sum)
{
    const mt_alloc_stats_t *st = &a->st;
    for (int sp = MT_STAT_ALL; sp < MT_STAT_N; sp++) {
        int64_t z = sp == MT_STAT_ALL ? sum->bytes[1] + sum->bytes[2] : sum->bytes[sp];
        int64_t n = sp == MT_STAT_ALL ? sum->count[1] + sum->count[2] : sum->count[sp];
        int64_t r = sp == MT_STAT_ALL ? sum->req[1] + sum->req[2] : sum->req[sp];
        if (st->allocated_bytes[sp].current - z < 0 || st->allocation[sp].current - n < 0 ||
            st->requested_bytes[sp].current - r < 0 || st->active_bytes[sp].current - z < 0 ||
            st->active[sp].current - n < 0)
            return "tcache: a counter minus the held blocks' is negative";
    }
    for (int t = 0; t < MT_TAG_MAX; t++)
        if (st->tag_allocated_bytes[t].current < sum->tag_bytes[t] ||
            st->tag_requested_bytes[t].current < sum->tag_req[t])
            return "tcache: a tag counter minus the held blocks' is negative";
    return NULL;
}

const char *mt__tc_check(mt_alloc_t *a)
{
    const char *why = NULL;
    bool on = a->tc_on;
    for (mt__tcache_t *c = a->caches; c != NULL; c = c->next)
        if (c->a != a || (c->next != NULL && c->next->prev != c))
            return "tcache: cache list broken";
    /* every cache at once: the held blocks change with the owners' fast operations, and
     * rec_held with them */
    mt__tc_claim_all(a);
    tc_counts_t sum;
    memset(&sum, 0, sizeof sum);
    int64_t bytes = 0;
    for (mt__tcache_t *c = a->caches; c != NULL && why == NULL; c = c->next) {
        why = check_one(a, c, &sum, &bytes);
        if (why == NULL && !on && c->nheld > 0)
            why = "tcache: blocks held while the fast paths are off";
    }
    if (why == NULL && a->rec && (bytes != a->rec_held || a->rec_held > a->rec_g))
        why = "tcache: the bytes held as recorded (rec_held) are not the caches' held bytes";
    if (why == NULL)
        why = check_truth(a, &sum);
    mt__tc_unclaim_all(a);
    return why;
}
