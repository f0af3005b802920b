/* Managed memory under the caching allocator (cfg.managed_memory): the pools' segments come
 * from the backend's managed memory, as RMM's pool_memory_resource over its
 * managed_memory_resource, and blocks can be prefetched and advised.
 *
 * Segments stay plain: expandable segments map physical pages made by cuMemCreate, which
 * the driver cannot migrate, so the two settings exclude each other (config.c turns
 * expandable segments off for managed_memory:True unless the string asks for both).
 *
 * Every prefetch and advice is an MT_EV_MANAGED event; so is every change of the device's
 * managed figures (faults, migrations, residency) seen at a segment change, a prefetch, an
 * advice or a stats call: migrations happen on access, where the allocator is not called,
 * so these samples are as fresh as the allocator's own calls. */
#include <stdio.h>
#include <string.h>

#include "allocator/internal.h"

/* ---- segments ---- */

/* Caller holds mu. Sends a residency sample when the device's figures changed. */
static void sample(mt_alloc_t *a)
{
    if (a->cfg.sink == NULL)
        return;
    mt_managed_stats_t st;
    if (mt_backend_managed_stats(a->backend, &st) != 0)
        return;
    uint64_t moved = st.bytes_to_device + st.bytes_to_host;
    if (st.faults == a->mlast.faults && st.device_bytes == a->mlast.device_bytes &&
        moved == a->mlast.bytes_to_device + a->mlast.bytes_to_host &&
        st.managed_bytes == a->mlast.managed_bytes)
        return;
    a->mlast = st;
    mt__alloc_emit(a, MT_EV_MANAGED, st.faults, st.device_bytes, moved, 0, MT_POOL_NONE,
                   MT_MANAGED_RESIDENCY);
}

int mt__managed_seg_malloc(mt_alloc_t *a, size_t size, void **out)
{
    if (!a->cfg.managed_memory)
        return mt_backend_malloc(a->backend, size, out);
    int rc = mt_backend_managed_malloc(a->backend, size, out);
    if (rc == 0)
        sample(a);
    return rc;
}

int mt__managed_seg_free(mt_alloc_t *a, void *ptr)
{
    if (!a->cfg.managed_memory)
        return mt_backend_free(a->backend, ptr);
    int rc = mt_backend_managed_free(a->backend, ptr);
    if (rc == 0)
        sample(a);
    return rc;
}

int mt__managed_cfg_validate(const mt_alloc_cfg_t *c, char *err, size_t errlen)
{
    if (!c->managed_memory)
        return 0;
    if (c->alloc_backend == MT_ALLOC_BACKEND_ASYNC) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen,
                     "allocator config: managed_memory needs backend:native (the driver's "
                     "stream-ordered pool serves device memory only)");
        return MT_EINVAL;
    }
    if (c->expandable_segments) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen,
                     "allocator config: managed_memory needs expandable_segments off (expandable "
                     "segments map cuMemCreate memory, which cannot be managed)");
        return MT_EINVAL;
    }
    mt_managed_stats_t st;
    if (mt_backend_managed_stats(c->backend, &st) == MT_ENOTSUP) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen,
                     "allocator config: managed_memory: the %s backend has no managed memory "
                     "(a driver without cuMemAllocManaged / cuMemPrefetchAsync_v2 / "
                     "cuMemAdvise_v2)",
                     mt_backend_name(c->backend));
        return MT_ENOTSUP;
    }
    return 0;
}

/* ---- prefetch and advice on blocks ---- */

/* 0 if [ptr, ptr+size) is inside one allocated block of a managed allocator; else the
 * named error, also in last_error. */
static int check_range(mt_alloc_t *a, const void *ptr, size_t size, const char *what)
{
    if (!a->cfg.managed_memory) {
        mt__alloc_lock(a);
        snprintf(a->last_error, sizeof a->last_error,
                 "%s: the allocator is not managed (config key managed_memory:True)", what);
        mt__alloc_unlock(a);
        return MT_ENOTSUP;
    }
    void *base = NULL;
    size_t bsize = 0;
    int rc = mt_alloc_block_info(a, ptr, &base, &bsize, NULL);
    if (rc == 0 && size > bsize - (size_t)((const char *)ptr - (const char *)base))
        rc = MT_ENOENT;
    if (rc != 0) {
        mt__alloc_lock(a);
        snprintf(a->last_error, sizeof a->last_error,
                 "%s: %zu bytes at %p are not inside one allocated block of managed memory", what,
                 size, ptr);
        mt__alloc_unlock(a);
    }
    return rc;
}

int mt_alloc_prefetch(mt_alloc_t *a, const void *ptr, size_t size, int location,
                      mt_stream_t *stream)
{
    if (a == NULL || ptr == NULL || size == 0)
        return MT_EINVAL;
    int rc = check_range(a, ptr, size, "mt_alloc_prefetch");
    if (rc != 0)
        return rc;
    mt__alloc_lock(a);
    /* Residency is sampled on both sides: the moves run on the stream, so the sample after
     * may see them only begun, and the one before a prefetch sees what the program
     * synchronised on since (the peak between two prefetches). */
    sample(a);
    rc = mt_backend_managed_prefetch(a->backend, ptr, size, location, stream);
    if (rc == 0) {
        uint64_t where = location == MT_MANAGED_HOST ? UINT64_MAX : (uint64_t)location;
        mt__alloc_emit(a, MT_EV_MANAGED, (uintptr_t)ptr, size, where, mt_stream_id(stream),
                       MT_POOL_NONE, MT_MANAGED_PREFETCH);
        sample(a);
    }
    mt__alloc_unlock(a);
    return rc;
}

int mt_alloc_advise(mt_alloc_t *a, const void *ptr, size_t size, int advice, int location)
{
    if (a == NULL || ptr == NULL || size == 0)
        return MT_EINVAL;
    int rc = check_range(a, ptr, size, "mt_alloc_advise");
    if (rc != 0)
        return rc;
    mt__alloc_lock(a);
    rc = mt_backend_managed_advise(a->backend, ptr, size, advice, location);
    if (rc == 0) {
        uint64_t arg = (uint64_t)(uint32_t)advice | (uint64_t)(uint32_t)location << 32;
        mt__alloc_emit(a, MT_EV_MANAGED, (uintptr_t)ptr, size, arg, 0, MT_POOL_NONE,
                       MT_MANAGED_ADVISE);
        sample(a);
    }
    mt__alloc_unlock(a);
    return rc;
}

int mt_alloc_managed_stats(mt_alloc_t *a, mt_managed_stats_t *out)
{
    if (a == NULL || out == NULL)
        return MT_EINVAL;
    if (!a->cfg.managed_memory)
        return MT_ENOTSUP;
    mt__alloc_lock(a);
    int rc = mt_backend_managed_stats(a->backend, out);
    if (rc == 0)
        sample(a);
    mt__alloc_unlock(a);
    return rc;
}
