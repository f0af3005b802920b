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

static const char *check_one(mt_alloc_t *a, mt__tcache_t *c)
{
    tc_counts_t want;
    memset(&want, 0, sizeof want);
    size_t held = 0, div = 0, plan = 0;
    for (size_t i = 0; i < c->live.cap; i++) {
        if (c->live.keys[i] == 0)
            continue;
        const mt__tc_ent_t *e = (const mt__tc_ent_t *)(uintptr_t)c->live.vals[i];
        const mt_block_t *b = e->b;
        if (b == NULL || e->c != c || b->tce != e || e->addr != c->live.keys[i])
            return "tcache: live entry names a block of another owner";
        if (e->addr != b->addr || e->size != b->size || e->greq != b->requested ||
            e->gtag != b->tag || e->used != (b->nuses != 0))
            return "tcache: entry's copy of its block's fields differs from the block";
        if (b->state != MT_BLOCK_ACTIVE_ALLOCATED || mt__addrmap_get(&a->map, b->addr) != b)
            return "tcache: owned block not allocated in the address map";
        if (e->sp != mt__stat_pool(b->seg->pool) || e->sr != b->seg->bins->sr)
            return "tcache: owned block's stream or pool disagrees with its segment";
        if (e->pver != 0 && e->pver == a->plan_ver && !b->planned)
            return "tcache: block with the plan's current version not planned";
        if (e->pver > a->plan_ver)
            return "tcache: block's plan version ahead of the plan's";
        if (e->slot != mt__tc_slot_of(e->sr->stream, b->size))
            return "tcache: owned block's LIFO slot is not its (stream, size)'s";
        mt__tc_counts_add(&want, e->sp, b->tag, (int64_t)b->size, (int64_t)b->requested, 1);
        plan += e->pver != 0;
        if (e->held) {
            held++;
            if (e->div)
                return "tcache: held block on the diverged list";
            continue;
        }
        mt__tc_counts_add(&want, e->sp, e->tag, (int64_t)b->size, (int64_t)e->req, -1);
        div += e->div;
        if (e->div != (e->req != b->requested || e->tag != b->tag))
            return "tcache: diverged flag disagrees with the block's values";
        if (e->req == 0 || e->req > b->size)
            return "tcache: live block's requested size outside (0, size]";
    }
    if (c->last != NULL && (c->last->c != c || c->last->b == NULL || c->last->b->tce != c->last))
        return "tcache: the last block handed out is not owned";
    size_t nlist = 0;
    for (const mt__tc_ent_t *e = c->div; e != NULL; e = e->next)
        if (++nlist > div || e->c != c || !e->div)
            return "tcache: diverged list disagrees with its blocks";
    if (plan != c->nplan)
        return "tcache: count of owned planned blocks wrong";
    if (div != c->ndiv || nlist != div)
        return "tcache: diverged count wrong";
    size_t nlifo = 0;
    for (int i = 0; i < TC_SLOTS; i++) {
        const tc_lifo_t *l = &c->lifo[i];
        if (l->n > TC_DEPTH)
            return "tcache: LIFO over its depth";
        size_t k = 0;
        for (const mt__tc_ent_t *e = l->head; e != NULL; e = e->next, k++)
            if (k >= l->n || e->c != c || !e->held || e->size != l->size || e->sr != l->sr ||
                e->sp != l->sp || e->slot != (unsigned)i)
                return "tcache: LIFO block out of place";
        if (k != l->n || (l->head == NULL) != (l->n == 0))
            return "tcache: LIFO count wrong";
        nlifo += k;
    }
    if (nlifo != held || held != c->nheld)
        return "tcache: held blocks and LIFOs disagree";
    if (memcmp(&want, &c->allow, sizeof want) != 0)
        return "tcache: allowances differ from the owned blocks' counters minus the program's";
    const int64_t *w = (const int64_t *)&c->allow;
    for (size_t i = 0; i < sizeof want / sizeof *w; i++)
        if (w[i] < 0)
            return "tcache: negative allowance";
    return NULL;
}

/* Counters minus every allowance must stay within [0, peak]. */
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
            return "tcache: a counter minus the allowances is negative";
    }
    for (int t = 0; t < MT_TAG_MAX; t++)
        if (st->tag_allocated_bytes[t].current < sum->tag_bytes[t] ||
            st->tag_requested_bytes[t].current < sum->tag_req[t])
            return "tcache: a tag counter minus the allowances is negative";
    return NULL;
}

const char *mt__tc_check(mt_alloc_t *a)
{
    tc_counts_t sum;
    memset(&sum, 0, sizeof sum);
    const char *why = NULL;
    bool on = a->tc_on;
    for (mt__tcache_t *c = a->caches; c != NULL && why == NULL; c = c->next) {
        if (c->a != a || (c->next != NULL && c->next->prev != c))
            return "tcache: cache list broken";
        mt__tc_claim(c);
        why = check_one(a, c);
        if (why == NULL && !on && (c->nheld > 0 || c->ndiv > 0))
            why = "tcache: blocks held while the fast paths are off";
        int64_t *s = (int64_t *)&sum;
        const int64_t *k = (const int64_t *)&c->allow;
        for (size_t i = 0; i < sizeof sum / sizeof *s; i++)
            s[i] += k[i];
        mt__tc_unclaim(c);
    }
    if (why != NULL)
        return why;
    if (a->rec) {
        /* every cache at once: rec_held changes with the owners' fast operations */
        mt__tc_claim_all(a);
        int64_t held = 0;
        for (mt__tcache_t *c = a->caches; c != NULL; c = c->next)
            held += c->allow.bytes[MT_STAT_SMALL] + c->allow.bytes[MT_STAT_LARGE];
        bool ok = held == a->rec_held && a->rec_held <= a->rec_g;
        mt__tc_unclaim_all(a);
        if (!ok)
            return "tcache: the bytes held as recorded (rec_held) are not the caches' held bytes";
    }
    return check_truth(a, &sum);
}
