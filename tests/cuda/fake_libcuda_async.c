/* The fake driver's default memory pools: cuDeviceGetDefaultMemPool, the pool attributes,
 * cuMemAllocFromPoolAsync and cuMemPoolTrimTo (cuMemFreeAsync is fake_libcuda_more.c's,
 * which frees when the stream gets to it).
 *
 * Enough of a pool for the backend's calls to be checked: allocations are plain fake
 * blocks (no context owns them, as cuMemAllocAsync's); a freed one's bytes stay reserved
 * ("kept") until cuMemPoolTrimTo lets them go, whatever the release threshold (the fake
 * stores it but never releases at a synchronize: that behaviour is the sim's model, not
 * the fake's). USED_MEM_CURRENT is the bytes of the pool's blocks still live, RESERVED
 * that plus kept; the HIGH attributes follow both and restart at a set of 0. */
#include "fake_internal.h"

#define MAXPOOLBLK 4096

typedef struct fake_pool_s {
    uint64_t threshold; /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, bytes */
    int reuse[3];       /* the three REUSE_* attributes, 1 = on (the driver's default) */
    size_t kept;        /* bytes of freed blocks still reserved */
    size_t reserved_high, used_high;
    struct {
        void *p;
        size_t size;
    } blk[MAXPOOLBLK]; /* the pool's blocks not yet seen freed */
    size_t nblk;
} fake_pool_t;

static fake_pool_t pools[MAXDEV];
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;

FAKE_API void fake_cuda_pool_reset(void);
void fake_cuda_pool_reset(void)
{
    pthread_mutex_lock(&pool_mu);
    memset(pools, 0, sizeof pools);
    for (int d = 0; d < MAXDEV; d++)
        pools[d].reuse[0] = pools[d].reuse[1] = pools[d].reuse[2] = 1;
    pthread_mutex_unlock(&pool_mu);
}

static fake_pool_t *pool_of(CUmemoryPool h)
{
    fake_pool_t *p = (fake_pool_t *)h;
    return p >= pools && p < pools + MAXDEV ? p : NULL;
}

static bool blk_live(void *q)
{
    bool live = false;
    pthread_mutex_lock(&fake.mu);
    for (fake_blk_t *b = fake.blks; b != NULL && !live; b = b->next)
        live = b->p == q && !b->host;
    pthread_mutex_unlock(&fake.mu);
    return live;
}

/* Moves the blocks the streams have freed since to kept; returns the live bytes.
 * Caller holds pool_mu. */
static size_t settle(fake_pool_t *p)
{
    size_t used = 0;
    for (size_t i = 0; i < p->nblk;) {
        if (blk_live(p->blk[i].p)) {
            used += p->blk[i++].size;
            continue;
        }
        p->kept += p->blk[i].size;
        p->blk[i] = p->blk[--p->nblk];
    }
    if (used > p->used_high)
        p->used_high = used;
    if (used + p->kept > p->reserved_high)
        p->reserved_high = used + p->kept;
    return used;
}

FAKE_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    ENTER("cuDeviceGetDefaultMemPool", dev, 0);
    if (pool == NULL || dev < 0 || dev >= fake.devices)
        return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)&pools[dev];
    return CUDA_SUCCESS;
}

static bool attr_is_u64(CUmemPool_attribute attr)
{
    return attr >= CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && attr <= CU_MEMPOOL_ATTR_USED_MEM_HIGH;
}

FAKE_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    uint64_t v = value == NULL       ? 0
                 : attr_is_u64(attr) ? *(cuuint64_t *)value
                                     : (uint64_t) * (int *)value;
    ENTER("cuMemPoolSetAttribute", attr, v);
    fake_pool_t *p = pool_of(pool);
    if (p == NULL || value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&pool_mu);
    size_t used = settle(p);
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        p->threshold = v;
        break;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = v != 0;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: /* 0 is the only value it takes */
        if (v != 0)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            p->reserved_high = used + p->kept;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (v != 0)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            p->used_high = used;
        break;
    default: /* the CURRENT ones are read-only */
        r = CUDA_ERROR_INVALID_VALUE;
        break;
    }
    pthread_mutex_unlock(&pool_mu);
    return r;
}

FAKE_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    ENTER("cuMemPoolGetAttribute", attr, 0);
    fake_pool_t *p = pool_of(pool);
    if (p == NULL || value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    size_t used = settle(p);
    uint64_t v = 0;
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        v = p->threshold;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        v = used + p->kept;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        v = p->reserved_high;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        v = used;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        v = p->used_high;
        break;
    default:
        *(int *)value = p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
        pthread_mutex_unlock(&pool_mu);
        return CUDA_SUCCESS;
    }
    *(cuuint64_t *)value = v;
    pthread_mutex_unlock(&pool_mu);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                          CUstream h)
{
    ENTER_CTX("cuMemAllocFromPoolAsync", size, (uintptr_t)h);
    fake_pool_t *p = pool_of(pool);
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fake.mu);
    bool ok = stream_of(h, &r) != NULL;
    pthread_mutex_unlock(&fake.mu);
    if (!ok)
        return r;
    if (p == NULL || size == 0 || dptr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    void *q = NULL;
    pthread_mutex_lock(&pool_mu);
    /* The kept bytes are this pool's to reuse: a growth beyond them is the device's. */
    size_t reuse = size <= p->kept ? size : p->kept;
    p->kept -= reuse;
    r = p->nblk < MAXPOOLBLK ? blk_new(&q, size, false) : CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&fake.mu);
        for (fake_blk_t *b = fake.blks; b != NULL; b = b->next)
            if (b->p == q)
                b->ctx = NULL;
        pthread_mutex_unlock(&fake.mu);
        p->blk[p->nblk].p = q;
        p->blk[p->nblk++].size = size;
        *dptr = (CUdeviceptr)(uintptr_t)q;
    } else {
        p->kept += reuse;
    }
    (void)settle(p);
    pthread_mutex_unlock(&pool_mu);
    return r;
}

FAKE_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    ENTER("cuMemPoolTrimTo", 0, keep);
    fake_pool_t *p = pool_of(pool);
    if (p == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mu);
    size_t used = settle(p);
    size_t room = keep > used ? keep - used : 0;
    if (p->kept > room)
        p->kept = room;
    pthread_mutex_unlock(&pool_mu);
    return CUDA_SUCCESS;
}

/* ---- the pool current to a device, and pool access ---- */

static CUmemoryPool current_pool[MAXDEV]; /* NULL: the device's default pool */

FAKE_API CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    ENTER("cuDeviceSetMemPool", dev, 0);
    if (dev < 0 || dev >= fake.devices || pool_of(pool) == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    current_pool[dev] = pool;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    ENTER("cuDeviceGetMemPool", dev, 0);
    if (pool == NULL || dev < 0 || dev >= fake.devices)
        return CUDA_ERROR_INVALID_VALUE;
    *pool = current_pool[dev] != NULL ? current_pool[dev] : (CUmemoryPool)&pools[dev];
    return CUDA_SUCCESS;
}

/* Only checked, not modelled: a pool's blocks are reachable from every device here. */
FAKE_API CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
    ENTER("cuMemPoolSetAccess", count, 0);
    if (pool_of(pool) == NULL || (count > 0 && map == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++)
        if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || map[i].location.id < 0 ||
            map[i].location.id >= fake.devices)
            return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}
