/* Following the warm-up plan (reserve.c makes it): a later request on the reservation's
 * stream is matched with the warm-up's allocations around a cursor and put exactly where
 * its entry was planned when that place is free; the plan's checker. */
#include <string.h>

#include "allocator/internal.h"

/* Blocks walked from a known block to the one holding a planned address. */
#define PLAN_WALK 32
/* Entries around the cursor searched for a request that is not the next one planned. */
#define PLAN_WINDOW 32

/* The free block holding [e->addr, e->addr + rsize), found from the block of e's left
 * neighbour (in a run that follows the plan, the next block) or the segment's first. */
static mt_block_t *free_block_at(mt_alloc_t *a, const mt__plan_t *p, const mt__plan_ent_t *e,
                                 size_t rsize)
{
    mt_segment_t *seg = p->segs[e->seg];
    mt_block_t *x = NULL;
    if (e->left != MT__PLAN_NONE) {
        x = mt__addrmap_get(&a->map, p->ent[e->left].addr);
        if (x != NULL && (x->seg != seg || x->addr >= e->addr))
            x = NULL;
    }
    if (x == NULL)
        x = seg->first;
    for (unsigned k = 0; x->addr + x->size <= e->addr; k++) {
        if (k == PLAN_WALK || x->next == NULL)
            return NULL;
        x = x->next;
    }
    if (x->state != MT_BLOCK_INACTIVE || x->addr + x->size < e->addr + rsize)
        return NULL;
    return x;
}

static bool ent_taken(const mt__plan_t *p, size_t k)
{
    return (p->taken[k / 64] >> (k % 64)) & 1;
}

/* A new pass over the sequence: every entry may be taken again. */
static void plan_restart(mt__plan_t *p)
{
    if (p->ntaken > 0)
        memset(p->taken, 0, (p->n + 63) / 64 * sizeof *p->taken);
    p->ntaken = 0;
    p->cursor = p->first;
}

/* The entry for a request of rsize bytes, among the untaken ones within PLAN_WINDOW
 * around cursor: one planned for exactly this size, the cursor's first (a run that
 * repeats the sequence, or a block whose size does not depend on the shape); otherwise
 * the cursor's if it fits without being four times as large (the same sequence at a
 * smaller shape); otherwise the smallest that fits (the same requests in another order,
 * or a subset, or a shape so small that room is plenty). SIZE_MAX if none. fresh: as if
 * no entry were taken (a pass about to restart). */
static size_t plan_pick(const mt__plan_t *p, size_t cursor, bool fresh, size_t rsize)
{
    size_t want = (rsize + MT__MIN_BLOCK - 1) / MT__MIN_BLOCK * MT__MIN_BLOCK;
    const mt__plan_ent_t *c = &p->ent[cursor];
    bool at_cursor = (fresh || !ent_taken(p, cursor)) && rsize <= c->size && c->size / 4 < want;
    if (at_cursor && c->size == want)
        return cursor;
    size_t lo = cursor > PLAN_WINDOW / 2 ? cursor - PLAN_WINDOW / 2 : 0;
    size_t hi = cursor + PLAN_WINDOW / 2 < p->n ? cursor + PLAN_WINDOW / 2 : p->n;
    size_t k = SIZE_MAX;
    for (size_t j = lo; j < hi; j++) {
        const mt__plan_ent_t *e = &p->ent[j];
        if ((!fresh && ent_taken(p, j)) || e->addr == 0 || e->size < rsize)
            continue;
        if (e->size == want)
            return j;
        if (k == SIZE_MAX || e->size < p->ent[k].size)
            k = j;
    }
    return at_cursor ? cursor : k;
}

/* Nothing of the plan is live: a new pass (the next iteration of a training loop), unless
 * the cursor is at a place, not the first, where the sequence itself had nothing live and
 * the request fits there (the next phase of the same pass). The entries the last pass took,
 * all free now, are offered again: kept taken, they would steer an iteration that begins
 * with another request than the warm-up's first, or that skipped the first entry, away
 * from the places planned for it. */
static bool plan_restarts(const mt__plan_t *p, size_t live, size_t rsize)
{
    const mt__plan_ent_t *c = &p->ent[p->cursor];
    return live == 0 &&
           (p->cursor == p->first || !(c->anchor && !ent_taken(p, p->cursor) && rsize <= c->size));
}

mt_block_t *mt__plan_take(mt_alloc_t *a, mt_streamrec_t *sr, size_t rsize, mt_block_t **front,
                          size_t *entry)
{
    mt__alloc_assert_owner(a);
    mt__plan_t *p = &a->plan;
    *front = NULL;
    if (sr != p->sr)
        return NULL;
    mt__plan_bump(a);
    if (plan_restarts(p, p->live, rsize))
        plan_restart(p);
    size_t k = plan_pick(p, p->cursor, false, rsize);
    if (k == SIZE_MAX)
        return NULL;
    *entry = k;
    const mt__plan_ent_t *e = &p->ent[k];
    mt_block_t *f = free_block_at(a, p, e, rsize);
    if (f == NULL)
        return NULL;
    p->taken[k / 64] |= (uint64_t)1 << (k % 64);
    p->ntaken++;
    p->cursor = k + 1;
    while (p->cursor < p->n && p->ent[p->cursor].addr == 0)
        p->cursor++; /* kept past the warm-up: a later run does not allocate it again */
    if (p->cursor == p->n)
        p->cursor = p->first; /* entries stay taken until their blocks are freed */
    if (e->addr - f->addr < MT__MIN_BLOCK)
        return f; /* at its place, or a sliver below it that cannot be a block */
    /* Split off the free room below the planned address. It goes back to the bins once
     * the block above is no longer free (two free neighbours never sit in the bins). */
    mt__seg_bin_out(a, f);
    mt__seg_split(a, f, e->addr - f->addr);
    if (f->next == NULL || f->next->addr != e->addr) {
        mt__seg_bin_in(a, f); /* no host memory to split: the block as it is */
        return f;
    }
    *front = f;
    return f->next;
}

bool mt__plan_repeats(const mt_alloc_t *a, size_t k, size_t rsize)
{
    mt__alloc_assert_owner(a);
    const mt__plan_t *p = &a->plan;
    mt_assert(k < p->n && ent_taken(p, k));
    /* The free leaves nothing of the plan live (live 1 -> 0). The request must restart the
     * pass, since entry k stays taken otherwise; after the restart k must be the only
     * entry taken, as now, and the one picked. The cursor then moves past k, where the
     * take of k left it; the free block at k's place is the one the take found (the
     * caller's free space is unchanged), so the same block comes back. */
    return p->live == 1 && p->ntaken == 1 && plan_restarts(p, 0, rsize) &&
           plan_pick(p, p->first, true, rsize) == k;
}

const char *mt__plan_check(const mt_alloc_t *a)
{
    const mt__plan_t *p = &a->plan;
    if ((p->n == 0) != (p->sr == NULL) || (p->n == 0) != (p->nsegs == 0))
        return "plan: entries, stream and segments disagree";
    if (p->n > 0 && (p->cursor >= p->n || p->ent[p->cursor].addr == 0 || p->first >= p->n ||
                     p->ent[p->first].addr == 0))
        return "plan: cursor or first entry not at a planned one";
    size_t taken = 0;
    for (size_t k = 0; k < p->n; k++) {
        if (k < p->first && p->ent[k].addr != 0)
            return "plan: a planned entry before the first";
        if (ent_taken(p, k)) {
            taken++;
            if (p->ent[k].addr == 0)
                return "plan: an entry without a place is taken";
        }
    }
    if (taken != p->ntaken)
        return "plan: count of taken entries is wrong";
    for (size_t i = 0; i < p->nsegs; i++) {
        const mt_segment_t *s = a->segs;
        while (s != NULL && s != p->segs[i])
            s = s->next;
        if (s == NULL || !s->reserved || s->stream != p->sr->stream)
            return "plan: a segment is not a reservation of its stream";
    }
    for (size_t k = 0; k < p->n; k++) {
        const mt__plan_ent_t *e = &p->ent[k];
        if (e->addr == 0)
            continue;
        if (e->seg >= p->nsegs || e->size < MT__MIN_BLOCK || e->size % MT__ALIGN != 0)
            return "plan: entry with a bad segment or size";
        const mt_segment_t *s = p->segs[e->seg];
        if (e->addr < s->addr || e->addr + e->size > s->addr + s->size)
            return "plan: entry outside its segment";
        if (e->left != MT__PLAN_NONE &&
            (e->left >= p->n || p->ent[e->left].addr == 0 || p->ent[e->left].seg != e->seg ||
             p->ent[e->left].addr + p->ent[e->left].size > e->addr))
            return "plan: entry's left neighbour is not below it";
    }
    size_t live = 0;
    for (const mt_segment_t *s = a->segs; s != NULL; s = s->next)
        for (const mt_block_t *b = s->first; b != NULL; b = b->next) {
            if (!b->planned)
                continue;
            live++;
            if (b->state != MT_BLOCK_ACTIVE_ALLOCATED || !mt__plan_uses(a, s))
                return "plan: a planned block is not allocated in a plan segment";
        }
    if (live != p->live)
        return "plan: live count disagrees with the planned blocks";
    return NULL;
}
