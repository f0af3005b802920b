/* The path a block takes back: free (its counters and events, pending events for the
 * streams that used it, then the bins), record_stream, and the lookup of a block by
 * address. */
#include <stdlib.h>

#include "allocator/tcache_impl.h"

/* A free is told to the sink: there is one, and no flush is giving back blocks whose frees
 * a thread cache told already (a->rec_mute). */
static inline bool tells(const mt_alloc_t *a)
{
    return a->cfg.sink != NULL && !a->rec_mute;
}

/* mt__alloc_free_complete, inline into the free that completes at once. */
static inline __attribute__((always_inline)) void complete(mt_alloc_t *a, mt_block_t *b, uint64_t t,
                                                           size_t req, size_t slot)
{
    mt__alloc_assert_owner(a);
    /* Freed, and every event recorded at its free seen complete. */
    mt_assert(b->state == MT_BLOCK_ACTIVE_PENDING_FREE && b->npending == 0);
    mt_assert(a->st.active_bytes[MT_STAT_ALL].current >= (int64_t)b->size);
    mt_segment_t *seg = b->seg;
    uintptr_t addr = b->addr;
    size_t size = b->size;
    int tag = b->tag;
    mt__addrmap_del_at(&a->map, b->addr, slot);
    int sp = seg->slot;
    mt__stat_sub2(a->st.active_bytes, sp, (int64_t)b->size);
    mt__stat_sub2(a->st.active, sp, 1);
    b->state = MT_BLOCK_INACTIVE;
    b->requested = 0;
    b->nuses = 0;
    b->npending = 0;
    mt__seg_merge_in(a, b);
    seg->last_used = ++a->clock;
    if (__builtin_expect(tells(a), 0))
        mt__alloc_emit_free(a, addr, size, req, seg->sid, mt__public_pool(seg->pool), tag, t);
}

void mt__alloc_free_complete(mt_alloc_t *a, mt_block_t *b)
{
    complete(a, b, 0, 0, SIZE_MAX);
}

/* mt__alloc_free_block, inline into the program's free. */
static inline __attribute__((always_inline)) void free_block(mt_alloc_t *a, mt_block_t *b,
                                                             size_t slot)
{
    mt__alloc_assert_owner(a);
    mt_assert(b->state == MT_BLOCK_ACTIVE_ALLOCATED && b->tce == NULL);
    mt_assert(b->requested > 0 && b->requested <= b->size);
    mt_assert(b->npending == 0);
    mt_segment_t *seg = b->seg;
    int sp = seg->pool, st = seg->slot;
    mt_assert(a->st.allocated_bytes[MT_STAT_ALL].current >= (int64_t)b->size);
    mt__stat_sub2(a->st.allocated_bytes, st, (int64_t)b->size);
    mt__stat_sub2(a->st.requested_bytes, st, (int64_t)b->requested);
    mt__stat_sub2(a->st.allocation, st, 1);
    mt__stat_sub1(&a->st.tag_allocated_bytes[b->tag], (int64_t)b->size);
    mt__stat_sub1(&a->st.tag_requested_bytes[b->tag], (int64_t)b->requested);
    if (__builtin_expect(b->size >= a->cfg.max_split_size, 0))
        mt__stat_sub1(&a->st.oversize_allocations, 1);
    /* free_requested; when the free completes at once (no other stream used the block),
     * it goes out together with free_completed, one clock read and one batch for both. */
    uint64_t t = 0;
    size_t req_held = 0; /* the request, when free_requested waits for free_completed */
    if (__builtin_expect(tells(a), 0)) {
        t = mt__clock_now(&a->clk);
        if (b->nuses == 0) {
            req_held = b->requested;
        } else {
            mt_event_rec_t req;
            mt__alloc_fill_rec(a, &req, MT_EV_FREE_REQUESTED, b->addr, b->size, b->requested,
                               seg->sid, mt__public_pool(sp), b->tag, t);
            mt__alloc_emit_recs(a, &req, 1);
        }
    }
    if (a->warming && b->gen == a->gen)
        mt__warm_record_free(a, b);
    if (b->planned)
        mt__plan_freed(a, b);
    b->state = MT_BLOCK_ACTIVE_PENDING_FREE;
    uint32_t nwait = 0; /* streams without an event, moved to the front of b->uses */
    for (uint32_t i = 0; i < b->nuses; i++) {
        mt_event_t *ev = mt__alloc_event_get(a);
        int erc = ev ? mt_event_record(a->backend, ev, b->uses[i]) : MT_ENOMEM;
        if (erc == 0)
            erc = mt__alloc_pending_push(a, ev, b);
        if (erc != 0) {
            if (ev != NULL)
                mt__alloc_event_put(a, ev);
            b->uses[nwait++] = b->uses[i];
            continue;
        }
        b->npending++;
        mt_assert(a->npending >= b->npending);
    }
    b->nuses = 0;
    if (nwait > 0) {
        mt__alloc_wait_streams(a, b, nwait);
    } else if (b->npending == 0) {
        complete(a, b, t, req_held, slot);
    }
}

void mt__alloc_free_block(mt_alloc_t *a, mt_block_t *b)
{
    free_block(a, b, SIZE_MAX);
}

int mt__alloc_free_global(mt_alloc_t *a, void *ptr, mt__tcache_t *mine)
{
    mt__alloc_lock_by(a, mine != NULL ? &mine->gate : NULL);
    /* Earlier frees this thread cached go back first: segment ages keep the frees' order. */
    if (!mt__tc_clean(mine))
        mt__tc_flush_mine(a, mine);
    int rc = 0;
    size_t slot = SIZE_MAX; /* b's slot in the table: its delete at completion probes no more */
    mt_block_t *b = mt__addrmap_find(&a->map, (uintptr_t)ptr, &slot);
    if (b == NULL || b->state != MT_BLOCK_ACTIVE_ALLOCATED) {
        rc = MT_ENOENT;
        goto out;
    }
    mt_assert(b->addr == (uintptr_t)ptr);
    /* A block a thread cache owns leaves it first, its counters made the program's; one
     * that cache holds was freed already. */
    if (b->tce != NULL && (rc = mt__tc_disown(a, b)) != 0)
        goto out;
    free_block(a, b, slot);
out:
    mt__alloc_unlock(a);
    return rc;
}

int mt_alloc_free(mt_alloc_t *a, void *ptr)
{
    if (a == NULL)
        return MT_EINVAL;
    if (ptr == NULL)
        return 0;
    if (__builtin_expect(a->async != NULL, 0))
        return mt__async_free(a, ptr);
    return mt__tc_free(a, ptr); /* this thread's cache, else (a tail call) the global path */
}

/* Adds stream to the streams that used allocated block b (none if it is b's own). */
static int add_use(mt_block_t *b, mt_stream_t *stream)
{
    if (stream == b->seg->stream)
        return 0;
    for (uint32_t i = 0; i < b->nuses; i++)
        if (b->uses[i] == stream)
            return 0;
    if (b->nuses == b->cap_uses) {
        uint32_t cap = b->cap_uses ? b->cap_uses * 2 : 4;
        mt_stream_t **nu = realloc(b->uses, cap * sizeof *nu);
        if (nu == NULL)
            return MT_ENOMEM;
        b->uses = nu;
        b->cap_uses = cap;
    }
    b->uses[b->nuses++] = stream;
    return 0;
}

int mt_alloc_record_stream(mt_alloc_t *a, void *ptr, mt_stream_t *stream)
{
    if (a == NULL || ptr == NULL)
        return MT_EINVAL;
    if (a->async != NULL)
        return mt__async_record_stream(a, ptr, stream);
    mt__alloc_lock(a);
    int rc = 0;
    mt_block_t *b = mt__addrmap_get(&a->map, (uintptr_t)ptr);
    if (b == NULL || b->state != MT_BLOCK_ACTIVE_ALLOCATED) {
        rc = MT_ENOENT;
        goto out;
    }
    /* The owner's fast free reads nuses: its cache is claimed meanwhile. */
    bool owned = b->tce != NULL;
    if (owned)
        mt__tc_lock_owner(b);
    if (owned && mt__tc_held(b))
        rc = MT_ENOENT;
    else
        rc = add_use(b, stream);
    if (owned) {
        mt__tc_used(b);
        mt__tc_unlock_owner(b);
    }
out:
    mt__alloc_unlock(a);
    return rc;
}

int mt_alloc_block_info(mt_alloc_t *a, const void *ptr, void **base, size_t *size, int *tag)
{
    if (a == NULL || ptr == NULL)
        return MT_EINVAL;
    if (a->async != NULL)
        return mt__async_block_info(a, ptr, base, size, tag);
    mt__alloc_lock(a);
    mt_block_t *b = mt__addrmap_get(&a->map, (uintptr_t)ptr);
    if (b == NULL) {
        /* An interior pointer: find its segment, then walk that segment's blocks. */
        mt_segment_t *seg = mt__seg_find(a, (uintptr_t)ptr);
        for (mt_block_t *x = seg ? seg->first : NULL; x != NULL; x = x->next) {
            if ((uintptr_t)ptr >= x->addr && (uintptr_t)ptr < x->addr + x->size) {
                b = x;
                break;
            }
        }
    }
    int rc = 0;
    bool owned = b != NULL && b->state == MT_BLOCK_ACTIVE_ALLOCATED && b->tce != NULL;
    if (owned)
        mt__tc_lock_owner(b);
    if (b == NULL || b->state != MT_BLOCK_ACTIVE_ALLOCATED || (owned && mt__tc_held(b))) {
        rc = MT_ENOENT;
    } else {
        if (base != NULL)
            *base = (void *)b->addr;
        if (size != NULL)
            *size = b->size;
        if (tag != NULL)
            *tag = b->tag;
    }
    if (owned)
        mt__tc_unlock_owner(b);
    mt__alloc_unlock(a);
    return rc;
}
