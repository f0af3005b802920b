/* Pending frees: the events recorded when a block used on other streams is freed, their
 * pool, and the waits for them. Completion itself (merge, bins, stats, the event) is
 * mt__alloc_free_complete in alloc.c.
 *
 * The waits (an event synchronize, a stream synchronize) run with the allocator's lock
 * released; docs/allocator-locking.md describes the in-flight states that keep other
 * threads off what is being waited for. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "allocator/internal.h"
#include "util/grow.h"

static atomic_bool captured_warned; /* the warning below, once per process */

mt_event_t *mt__alloc_event_get(mt_alloc_t *a)
{
    if (a->nevpool > 0)
        return a->evpool[--a->nevpool];
    mt_event_t *ev = NULL;
    if (mt_event_create(a->backend, &ev) != 0)
        return NULL;
    return ev;
}

void mt__alloc_event_put(mt_alloc_t *a, mt_event_t *ev)
{
    mt_event_t **np = mt__grow(a->evpool, &a->cap_evpool, a->nevpool + 1, sizeof *np, 16);
    if (np == NULL) {
        mt_event_destroy(a->backend, &ev);
        return;
    }
    a->evpool = np;
    a->evpool[a->nevpool++] = ev;
}

int mt__alloc_pending_push(mt_alloc_t *a, mt_event_t *ev, mt_block_t *b)
{
    mt_assert(b->state == MT_BLOCK_ACTIVE_PENDING_FREE && a->npending <= a->cap_pending);
    mt_pending_t *np = mt__grow(a->pending, &a->cap_pending, a->npending + 1, sizeof *np, 16);
    if (np == NULL)
        return MT_ENOMEM;
    a->pending = np;
    a->pending[a->npending++] = (mt_pending_t){ev, b, false};
    __atomic_store_n(&a->tc_pend, 1, __ATOMIC_RELAXED); /* mallocs poll: no fast path */
    return 0;
}

void mt__alloc_process_events(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    size_t i = 0;
    while (i < a->npending) {
        mt_pending_t p = a->pending[i];
        mt_assert(p.blk->state == MT_BLOCK_ACTIVE_PENDING_FREE && p.blk->npending > 0);
        if (p.waited) {
            i++; /* the waiting thread completes it once its wait ends */
            continue;
        }
        int rc = mt_event_query(a->backend, p.ev);
        if (rc == MT_EAGAIN) {
            i++;
            continue;
        }
        if (rc == MT_EBUSY) {
            /* Recorded into a stream capture: a node of the graph, which every replay
             * passes, not work the device will finish. The allocator cannot see the
             * graph's lifetime, so the block stays pending for good (the drop-in keeps
             * such blocks with the capture instead and records no event). */
            if (!atomic_exchange(&captured_warned, true))
                mt__alloc_log(a, MT_LOG_WARN,
                              "memtrace: a block was freed after a use on a capturing stream "
                              "(its event is inside the graph): it is never reused");
            i++;
            continue;
        }
        if (rc != 0)
            mt__alloc_log(a, MT_LOG_WARN,
                          "memtrace: event query failed (%s); treating the "
                          "event as complete",
                          mt_strerror(rc));
        a->pending[i] = a->pending[--a->npending];
        if (a->npending == 0)
            __atomic_store_n(&a->tc_pend, 0, __ATOMIC_RELAXED);
        mt__alloc_event_put(a, p.ev);
        if (--p.blk->npending == 0)
            mt__alloc_free_complete(a, p.blk);
    }
}

void mt__alloc_pending_drop(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    while (a->npending > 0) {
        mt_pending_t p = a->pending[--a->npending];
        mt_assert(!p.waited && p.blk->npending > 0);
        mt__alloc_event_put(a, p.ev);
        if (--p.blk->npending == 0)
            mt__alloc_free_complete(a, p.blk);
    }
    __atomic_store_n(&a->tc_pend, 0, __ATOMIC_RELAXED);
}

void mt__alloc_sync_pending(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    while (a->syncing)
        mt__alloc_wait(a); /* one waiter at a time: the waited marks are its own */
    a->st.num_sync_all_streams++;
    size_t n = a->npending;
    if (n > 0) {
        /* The waited entries stay in a->pending (their blocks stay pending), but nobody
         * else queries or recycles their events until the waits end. Without host memory
         * for the list, one device synchronize waits for them all. */
        mt_event_t **evs = malloc(n * sizeof *evs);
        for (size_t i = 0; i < n; i++) {
            a->pending[i].waited = true;
            if (evs != NULL)
                evs[i] = a->pending[i].ev;
        }
        a->syncing = true;
        mt__alloc_unlock(a);
        if (evs != NULL)
            for (size_t i = 0; i < n; i++)
                (void)mt_event_synchronize(a->backend, evs[i]);
        else
            (void)mt_device_synchronize(a->backend);
        free(evs);
        mt__alloc_lock(a);
        mt_assert(a->syncing);
        for (size_t i = 0; i < a->npending; i++)
            a->pending[i].waited = false;
        a->syncing = false;
        pthread_cond_broadcast(&a->cv);
    }
    mt__alloc_process_events(a);
}

/* Without an event the only safe fallback is to wait for the streams that used b
 * (b->uses[0..n)) before b can be reused: with the lock released, b held pending by one
 * count of npending (a->nholds) meanwhile. Completes b when nothing else is pending. */
void mt__alloc_wait_streams(mt_alloc_t *a, mt_block_t *b, uint32_t n)
{
    mt_assert(b->state == MT_BLOCK_ACTIVE_PENDING_FREE && b->nuses == 0);
    b->npending++;
    a->nholds++;
    mt__alloc_unlock(a);
    /* b->uses stays b's: a pending block takes no record_stream and is never reused. */
    for (uint32_t i = 0; i < n; i++)
        (void)mt_stream_synchronize(a->backend, b->uses[i]);
    mt__alloc_lock(a);
    mt_assert(b->state == MT_BLOCK_ACTIVE_PENDING_FREE && b->npending > 0 && a->nholds > 0);
    a->nholds--;
    pthread_cond_broadcast(&a->cv);
    if (--b->npending == 0)
        mt__alloc_free_complete(a, b);
}
