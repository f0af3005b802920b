/* The cuda backend's stream-ordered pool: the device's default memory pool through
 * cuMemAllocFromPoolAsync / cuMemFreeAsync, its release threshold and statistics through
 * cuMemPoolSetAttribute / cuMemPoolGetAttribute, and cuMemPoolTrimTo.
 *
 * These entry points came with CUDA 11.2; a driver without them still runs every other
 * operation, so they are not in the table that mt__cuda_driver_open must fill whole:
 * they are looked up in the same loaded library on the first pool call, and their
 * absence gives MT_ENOTSUP. Honest note: as the rest of this backend, this has only run
 * against the fake driver of tests/cuda. */
#include <dlfcn.h>
#include <stdlib.h>

#include "backend/backend_cuda.h"
#include "backend/cuda_internal.h"

typedef struct cuda_pool_s {
    bool missing;      /* an entry point is absent: every pool call is MT_ENOTSUP */
    CUmemoryPool pool; /* the device's default pool */
    CUresult (*DeviceGetDefaultMemPool)(CUmemoryPool *pool, CUdevice dev);
    CUresult (*MemPoolSetAttribute)(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
    CUresult (*MemPoolGetAttribute)(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
    CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s);
    CUresult (*MemFreeAsync)(CUdeviceptr p, CUstream s);
    CUresult (*MemPoolTrimTo)(CUmemoryPool pool, size_t keep);
} cuda_pool_t;

static cuda_t *C(mt_backend_t *b)
{
    return (cuda_t *)b;
}

/* Runs a pool call inside the device's context and maps its result. */
#define PCALL(c, expr)                                                                             \
    ({                                                                                             \
        int rc_ = mt__cuda_enter(c);                                                               \
        if (rc_ == 0) {                                                                            \
            rc_ = mt__cuda_note((c)->pool->expr);                                                  \
            mt__cuda_leave(c);                                                                     \
        }                                                                                          \
        rc_;                                                                                       \
    })

static void *sym(cuda_t *c, const char *name)
{
    return dlsym(c->drv.lib, name);
}

/* Resolves the entry points and the default pool, once; 0 or MT_ENOTSUP / the driver's
 * error. A failure to reach the pool is not remembered (the next call tries again). */
static int pool_get(cuda_t *c)
{
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    if (c->pool == NULL) {
        cuda_pool_t *p = calloc(1, sizeof *p);
        if (p == NULL) {
            pthread_mutex_unlock(&c->mu);
            return MT_ENOMEM;
        }
        *(void **)&p->DeviceGetDefaultMemPool = sym(c, "cuDeviceGetDefaultMemPool");
        *(void **)&p->MemPoolSetAttribute = sym(c, "cuMemPoolSetAttribute");
        *(void **)&p->MemPoolGetAttribute = sym(c, "cuMemPoolGetAttribute");
        *(void **)&p->MemAllocFromPoolAsync = sym(c, "cuMemAllocFromPoolAsync");
        *(void **)&p->MemFreeAsync = sym(c, "cuMemFreeAsync");
        *(void **)&p->MemPoolTrimTo = sym(c, "cuMemPoolTrimTo");
        p->missing = p->DeviceGetDefaultMemPool == NULL || p->MemPoolSetAttribute == NULL ||
                     p->MemPoolGetAttribute == NULL || p->MemAllocFromPoolAsync == NULL ||
                     p->MemFreeAsync == NULL || p->MemPoolTrimTo == NULL;
        c->pool = p;
        if (p->missing)
            mt__backend_log(&c->base, MT_LOG_ERROR,
                            "memtrace: the CUDA driver lacks the stream-ordered pool "
                            "(cuMemAllocFromPoolAsync and its kin, CUDA 11.2)");
    }
    if (c->pool->missing)
        rc = MT_ENOTSUP;
    else if (c->pool->pool == NULL)
        rc = PCALL(c, DeviceGetDefaultMemPool(&c->pool->pool, c->dev));
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void mt__cuda_pool_fini(cuda_t *c)
{
    free(c->pool);
    c->pool = NULL;
}

int mt__cuda_malloc_async(mt_backend_t *b, size_t size, mt_stream_t *s, void **out)
{
    cuda_t *c = C(b);
    int rc = pool_get(c);
    if (rc != 0)
        return rc;
    CUdeviceptr p = 0;
    CUstream h = (CUstream)mt__cuda_stream_handle(s);
    rc = PCALL(c, MemAllocFromPoolAsync(&p, size, c->pool->pool, h));
    if (rc == 0)
        *out = (void *)(uintptr_t)p;
    return rc;
}

int mt__cuda_free_async(mt_backend_t *b, void *ptr, mt_stream_t *s)
{
    cuda_t *c = C(b);
    int rc = pool_get(c);
    if (rc != 0)
        return rc;
    CUstream h = (CUstream)mt__cuda_stream_handle(s);
    return PCALL(c, MemFreeAsync((CUdeviceptr)(uintptr_t)ptr, h));
}

int mt__cuda_pool_set_release_threshold(mt_backend_t *b, uint64_t bytes)
{
    cuda_t *c = C(b);
    int rc = pool_get(c);
    if (rc != 0)
        return rc;
    cuuint64_t v = bytes;
    return PCALL(c, MemPoolSetAttribute(c->pool->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
}

int mt__cuda_pool_trim_to(mt_backend_t *b, size_t keep)
{
    cuda_t *c = C(b);
    int rc = pool_get(c);
    if (rc != 0)
        return rc;
    return PCALL(c, MemPoolTrimTo(c->pool->pool, keep));
}

int mt__cuda_pool_usage(mt_backend_t *b, mt_pool_usage_t *out)
{
    cuda_t *c = C(b);
    int rc = pool_get(c);
    static const CUmemPool_attribute attrs[4] = {
        CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, CU_MEMPOOL_ATTR_USED_MEM_HIGH};
    cuuint64_t v[4] = {0};
    for (int i = 0; i < 4 && rc == 0; i++)
        rc = PCALL(c, MemPoolGetAttribute(c->pool->pool, attrs[i], &v[i]));
    if (rc == 0)
        *out = (mt_pool_usage_t){
            .reserved = v[0], .used = v[1], .reserved_high = v[2], .used_high = v[3]};
    return rc;
}

int mt__cuda_pool_reset_high(mt_backend_t *b)
{
    cuda_t *c = C(b);
    int rc = pool_get(c);
    /* Zero is the only value these take: it restarts them from the current values. */
    cuuint64_t zero = 0;
    if (rc == 0)
        rc = PCALL(c, MemPoolSetAttribute(c->pool->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero));
    if (rc == 0)
        rc = PCALL(c, MemPoolSetAttribute(c->pool->pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
    return rc;
}
