/* Warm-up reservations: one cached segment per stream, sized by the user (reserve) or by
 * a measured run (warmup_begin/end), that serves requests of any size on its stream
 * before the pools are searched. A later run whose live transient bytes stay within it
 * therefore never calls the backend's malloc. */
#include <stdlib.h>

#include "allocator/internal.h"

/* Slack added to a measured warm-up peak: the peak is measured in rounded block sizes,
 * so rounding is already in it; the slack covers fragmentation inside the reservation
 * when a later run allocates the same shapes at other lengths or in another order. One
 * thirty-second of the peak (then rounded up to 2 MiB) keeps utilization at peak above
 * 0.95; the RNN-like test pattern needs none beyond the 2 MiB rounding. */
#define WARMUP_SLACK_DIV 32
#define RESERVE_ROUND    ((size_t)2 << 20)

static int reserve_locked(mt_alloc_t *a, size_t bytes, mt_stream_t *stream)
{
    size_t size = (bytes + RESERVE_ROUND - 1) / RESERVE_ROUND * RESERVE_ROUND;
    mt_streamrec_t *sr = mt__alloc_streamrec(a, stream);
    if (sr == NULL)
        return MT_ENOMEM;
    /* Already reserved enough as one segment? Smaller unused reservations of this stream
     * are replaced by the new one. */
    mt_segment_t *next;
    for (mt_segment_t *s = a->segs; s != NULL; s = next) {
        next = s->next;
        if (!s->reserved || s->stream != stream)
            continue;
        if (s->size >= size) {
            mt__alloc_emit(a, MT_EV_RESERVE, s->addr, s->size, bytes, mt_stream_id(stream),
                           mt__public_pool(s->pool), 0);
            return 0;
        }
        mt__seg_release(a, s);
    }
    mt_segment_t *seg = NULL;
    int rc = mt__seg_new(a, sr, MT__BP_RESERVED, size, &seg);
    if (rc != 0 && a->cfg.release_on_oom) {
        if (a->npending > 0)
            mt__alloc_sync_pending(a);
        mt__seg_release_all(a, false, NULL, false);
        a->st.num_alloc_retries++;
        rc = mt__seg_new(a, sr, MT__BP_RESERVED, size, &seg);
    }
    if (rc != 0) {
        a->st.num_ooms++;
        size_t free_b = 0, total_b = 0;
        (void)mt_backend_mem_get_info(a->backend, &free_b, &total_b);
        mt__alloc_emit(a, MT_EV_OOM, 0, free_b, bytes, mt_stream_id(stream), MT_POOL_LARGE, 0);
        mt__alloc_oom_report(a, bytes, size, "warm-up reservation");
        return MT_ENOMEM;
    }
    mt__alloc_emit(a, MT_EV_RESERVE, seg->addr, seg->size, bytes, mt_stream_id(stream),
                   MT_POOL_LARGE, 0);
    return 0;
}

int mt_alloc_reserve(mt_alloc_t *a, size_t bytes, mt_stream_t *stream)
{
    if (a == NULL)
        return MT_EINVAL;
    if (bytes == 0)
        return 0;
    if (bytes > ((size_t)1 << 60))
        return MT_ENOMEM;
    pthread_mutex_lock(&a->mu);
    if (a->npending > 0)
        mt__alloc_process_events(a);
    int rc = reserve_locked(a, bytes, stream);
    pthread_mutex_unlock(&a->mu);
    return rc;
}

int mt_alloc_warmup_begin(mt_alloc_t *a)
{
    if (a == NULL)
        return MT_EINVAL;
    pthread_mutex_lock(&a->mu);
    a->warming = true;
    a->gen++;
    a->warm_peak = a->st.allocated_bytes[MT_STAT_ALL].current;
    pthread_mutex_unlock(&a->mu);
    return 0;
}

/* Bytes of blocks allocated before warmup_begin and still allocated: they were live for
 * the whole warm-up, so they are part of its peak but need no room in the reservation. */
static size_t persistent_bytes(const mt_alloc_t *a)
{
    size_t n = 0;
    for (const mt_segment_t *s = a->segs; s != NULL; s = s->next)
        for (const mt_block_t *b = s->first; b != NULL; b = b->next)
            if (b->state == MT_BLOCK_ACTIVE_ALLOCATED && b->gen < a->gen)
                n += b->size;
    return n;
}

int mt_alloc_warmup_end(mt_alloc_t *a, mt_stream_t *stream)
{
    if (a == NULL)
        return MT_EINVAL;
    pthread_mutex_lock(&a->mu);
    int rc = 0;
    if (!a->warming) {
        rc = MT_EINVAL;
        goto out;
    }
    a->warming = false;
    size_t persist = persistent_bytes(a);
    size_t peak = (size_t)a->warm_peak;
    size_t transient = peak > persist ? peak - persist : 0;
    if (a->npending > 0)
        mt__alloc_sync_pending(a);
    size_t released = mt__seg_release_all(a, false, NULL, false);
    mt__alloc_emit(a, MT_EV_EMPTY_CACHE, 0, released, 0, 0, MT_POOL_NONE, 0);
    if (transient > 0)
        rc = reserve_locked(a, transient + transient / WARMUP_SLACK_DIV, stream);
out:
    pthread_mutex_unlock(&a->mu);
    return rc;
}
