/* The fake driver, managed memory (see fake_libcuda.c for the whole contract):
 * cuMemPrefetchAsync_v2 and cuMemAdvise_v2 as CUDA 12.2+ declare them, as strict as the
 * real ones about what they take: a range inside one live cuMemAllocManaged allocation, a
 * host or device location (a device that exists), a known advice, flags 0, a stream of the
 * current context. Each accepted call is kept, with its arguments, for
 * fake_cuda_managed_op. Pages are not modelled: the fake keeps no residency. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "fake_internal.h"

#define MAXMANAGED 4096
#define MAXMOPS    1024

/* One accepted prefetch ('p') or advice ('a'). */
typedef struct fake_mop_s {
    char kind;
    uint64_t p, n;
    int loc_type, loc_id;
    int advice;
    CUstream stream;
} fake_mop_t;

/* Guarded by fake.mu. Ranges noted are never forgotten: device addresses are not reused,
 * so a freed one no longer matches a live block. */
static struct {
    uintptr_t p[MAXMANAGED];
    size_t size[MAXMANAGED];
    size_t n;
    fake_mop_t ops[MAXMOPS];
    size_t nops;
} mg;

FAKE_API size_t fake_cuda_managed_ops(void);
FAKE_API int fake_cuda_managed_op(size_t i, uint64_t *p, uint64_t *n, int *loc_type, int *loc_id,
                                  int *advice, void **stream);

void fake_managed_note(uintptr_t p, size_t size)
{
    pthread_mutex_lock(&fake.mu);
    if (mg.n < MAXMANAGED) {
        mg.p[mg.n] = p;
        mg.size[mg.n] = size;
        mg.n++;
    }
    pthread_mutex_unlock(&fake.mu);
}

/* Caller holds mu. [p, p+n) lies inside one live managed allocation. */
static bool managed_range(uintptr_t p, size_t n)
{
    for (size_t i = 0; i < mg.n; i++) {
        if (p < mg.p[i] || p - mg.p[i] >= mg.size[i] || n > mg.size[i] - (p - mg.p[i]))
            continue;
        for (fake_blk_t *b = fake.blks; b != NULL; b = b->next)
            if ((uintptr_t)b->p == mg.p[i])
                return true;
    }
    return false;
}

static bool location_ok(CUmemLocation loc)
{
    if (loc.type == CU_MEM_LOCATION_TYPE_HOST)
        return true;
    return loc.type == CU_MEM_LOCATION_TYPE_DEVICE && loc.id >= 0 && loc.id < fake.devices;
}

/* Caller holds mu. */
static void keep(fake_mop_t op)
{
    if (mg.nops < MAXMOPS)
        mg.ops[mg.nops++] = op;
}

FAKE_API CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc,
                                        unsigned int flags, CUstream h)
{
    ENTER_CTX("cuMemPrefetchAsync_v2", p, n);
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fake.mu);
    if (n == 0 || flags != 0 || !location_ok(loc) || !managed_range((uintptr_t)p, n))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (stream_of(h, &r) != NULL)
        keep((fake_mop_t){'p', p, n, (int)loc.type, loc.id, 0, h});
    pthread_mutex_unlock(&fake.mu);
    return r;
}

FAKE_API CUresult cuMemAdvise_v2(CUdeviceptr p, size_t n, CUmem_advise advice, CUmemLocation loc)
{
    ENTER_CTX("cuMemAdvise_v2", p, n);
    bool needs_loc =
        advice != CU_MEM_ADVISE_SET_READ_MOSTLY && advice != CU_MEM_ADVISE_UNSET_READ_MOSTLY;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fake.mu);
    if (n == 0 || advice < CU_MEM_ADVISE_SET_READ_MOSTLY ||
        advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY || (needs_loc && !location_ok(loc)) ||
        !managed_range((uintptr_t)p, n))
        r = CUDA_ERROR_INVALID_VALUE;
    else
        keep((fake_mop_t){'a', p, n, (int)loc.type, loc.id, (int)advice, NULL});
    pthread_mutex_unlock(&fake.mu);
    return r;
}

/* Accepted prefetches and advice so far (the count is not cleared by fake_cuda_reset:
 * tests read the ones after a count they took). */
size_t fake_cuda_managed_ops(void)
{
    pthread_mutex_lock(&fake.mu);
    size_t n = mg.nops;
    pthread_mutex_unlock(&fake.mu);
    return n;
}

/* Operation i: 'p' or 'a', or 0 past the end. */
int fake_cuda_managed_op(size_t i, uint64_t *p, uint64_t *n, int *loc_type, int *loc_id,
                         int *advice, void **stream)
{
    pthread_mutex_lock(&fake.mu);
    int kind = 0;
    if (i < mg.nops) {
        const fake_mop_t *o = &mg.ops[i];
        kind = o->kind;
        *p = o->p;
        *n = o->n;
        *loc_type = o->loc_type;
        *loc_id = o->loc_id;
        *advice = o->advice;
        *stream = (void *)o->stream;
    }
    pthread_mutex_unlock(&fake.mu);
    return kind;
}
