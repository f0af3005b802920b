/* Managed memory of the cuda backend: cuMemAllocManaged (attached globally, as
 * cudaMallocManaged does by default), cuMemPrefetchAsync and cuMemAdvise with a location,
 * each inside the device's primary context (CALL).
 *
 * Managed allocations are kept in the segment table with their flag, so the device's
 * teardown frees them and mt_backend_free refuses them. The driver says nothing about
 * where pages are or how often they faulted (only the profiler's UVM counters do), so the
 * statistics here are the bytes allocated and the calls made. Honest note: this has only
 * run against the fake driver of tests/cuda. */
#include <stdlib.h>

#include "backend/cuda_internal.h"
#include "util/grow.h"

_Static_assert((int)MT_ADVISE_SET_READ_MOSTLY == (int)CU_MEM_ADVISE_SET_READ_MOSTLY &&
                   (int)MT_ADVISE_SET_PREFERRED_LOCATION ==
                       (int)CU_MEM_ADVISE_SET_PREFERRED_LOCATION &&
                   (int)MT_ADVISE_UNSET_ACCESSED_BY == (int)CU_MEM_ADVISE_UNSET_ACCESSED_BY,
               "advice is passed to the driver as is");

static cuda_t *C(const mt_backend_t *b)
{
    return (cuda_t *)b;
}

static CUstream SH(const mt_stream_t *s)
{
    return s ? ((const cuda_stream_t *)s)->h : NULL;
}

/* The driver's form of a location: the host (its id is ignored) or a device ordinal. */
static CUmemLocation location_of(int location)
{
    CUmemLocation loc = {0};
    loc.type =
        location == MT_MANAGED_HOST ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = location == MT_MANAGED_HOST ? 0 : location;
    return loc;
}

/* Caller holds mu. Index of the managed allocation holding all of [p, p+n), or SIZE_MAX. */
static size_t find_managed(const cuda_t *c, CUdeviceptr p, size_t n)
{
    for (size_t i = 0; i < c->nsegs; i++) {
        const cuda_seg_t *s = &c->segs[i];
        if (s->managed && p >= s->ptr && p - s->ptr < s->size)
            return n <= s->size - (p - s->ptr) ? i : SIZE_MAX;
    }
    return SIZE_MAX;
}

bool mt__cuda_is_managed(const mt_backend_t *b, const void *ptr, size_t n)
{
    cuda_t *c = C(b);
    pthread_mutex_lock(&c->mu);
    bool r = find_managed(c, (CUdeviceptr)(uintptr_t)ptr, n) != SIZE_MAX;
    pthread_mutex_unlock(&c->mu);
    return r;
}

int mt__cuda_managed_malloc(mt_backend_t *b, size_t size, void **out)
{
    cuda_t *c = C(b);
    if (c->drv.MemAllocManaged == NULL)
        return MT_ENOTSUP;
    pthread_mutex_lock(&c->mu);
    void *v = mt__grow(c->segs, &c->segs_cap, c->nsegs + 1, sizeof *c->segs, 16);
    if (v != NULL)
        c->segs = v;
    pthread_mutex_unlock(&c->mu);
    if (v == NULL)
        return MT_ENOMEM;
    CUdeviceptr p = 0;
    int rc = CALL(c, MemAllocManaged(&p, size, CU_MEM_ATTACH_GLOBAL));
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&c->mu);
    v = mt__grow(c->segs, &c->segs_cap, c->nsegs + 1, sizeof *c->segs, 16);
    if (v != NULL) {
        c->segs = v;
        c->segs[c->nsegs++] = (cuda_seg_t){p, size, true};
        c->mstats.managed_bytes += size;
    }
    pthread_mutex_unlock(&c->mu);
    if (v == NULL) {
        CALL(c, MemFree(p));
        return MT_ENOMEM;
    }
    *out = (void *)(uintptr_t)p;
    return 0;
}

int mt__cuda_managed_free(mt_backend_t *b, void *ptr)
{
    cuda_t *c = C(b);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
    pthread_mutex_lock(&c->mu);
    size_t i = find_managed(c, p, 1);
    bool known = i != SIZE_MAX && c->segs[i].ptr == p;
    if (known) {
        c->mstats.managed_bytes -= c->segs[i].size;
        c->segs[i] = c->segs[--c->nsegs];
    }
    pthread_mutex_unlock(&c->mu);
    if (!known)
        return MT_ENOENT;
    return CALL(c, MemFree(p)); /* cuMemFree synchronises, as for any device memory */
}

/* MT_EINVAL (logged) unless [ptr, ptr+n) is managed memory of c; counts the call. */
static int check_range(cuda_t *c, const void *ptr, size_t n, const char *what, bool prefetch)
{
    pthread_mutex_lock(&c->mu);
    bool ok = find_managed(c, (CUdeviceptr)(uintptr_t)ptr, n) != SIZE_MAX;
    if (ok && prefetch) {
        c->mstats.prefetches++;
        c->mstats.prefetch_bytes += n;
    } else if (ok) {
        c->mstats.advises++;
    }
    pthread_mutex_unlock(&c->mu);
    if (!ok)
        mt__backend_log(&c->base, MT_LOG_ERROR,
                        "memtrace: %s of %zu bytes at %p: not inside one managed allocation", what,
                        n, ptr);
    return ok ? 0 : MT_EINVAL;
}

int mt__cuda_managed_prefetch(mt_backend_t *b, const void *ptr, size_t n, int location,
                              mt_stream_t *s)
{
    cuda_t *c = C(b);
    if (c->drv.MemPrefetchAsync == NULL)
        return MT_ENOTSUP;
    int rc = check_range(c, ptr, n, "prefetch", true);
    if (rc != 0)
        return rc;
    return CALL(c,
                MemPrefetchAsync((CUdeviceptr)(uintptr_t)ptr, n, location_of(location), 0, SH(s)));
}

int mt__cuda_managed_advise(mt_backend_t *b, const void *ptr, size_t n, int advice, int location)
{
    cuda_t *c = C(b);
    if (c->drv.MemAdvise == NULL)
        return MT_ENOTSUP;
    int rc = check_range(c, ptr, n, "advise", false);
    if (rc != 0)
        return rc;
    /* mt_managed_advice_e has the driver's numbers. */
    return CALL(
        c, MemAdvise((CUdeviceptr)(uintptr_t)ptr, n, (CUmem_advise)advice, location_of(location)));
}

int mt__cuda_managed_stats(mt_backend_t *b, mt_managed_stats_t *out)
{
    cuda_t *c = C(b);
    if (c->drv.MemAllocManaged == NULL)
        return MT_ENOTSUP;
    pthread_mutex_lock(&c->mu);
    *out = c->mstats;
    pthread_mutex_unlock(&c->mu);
    return 0;
}
