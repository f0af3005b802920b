/* Driver entry points memtrace watches and then forwards (see preload/README.md): other
 * allocators' allocations (the cache is given back when they run out), queries and IPC of
 * sub-allocated blocks, device reset and context teardown, graph destruction. */
#include "mt_config.h"
#include "preload/core.h"
#include "preload/hooks_cuda.h"
#include "preload/hooks_graph.h"
#include "preload/outside.h"
#include "preload/preload.h"

/* ---- allocations memtrace does not serve: the driver's, with the cache given back when
 * the driver runs out, reported by calling library (outside.c) ---- */

/* The driver's name(...), made once more after the caches went back if it ran out. */
#define CALL_RETRY_OOM(name, ...)                                                                  \
    ({                                                                                             \
        __typeof__(&name) f_ = REAL(name);                                                         \
        CUresult r_ = f_ != NULL ? f_(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND;                         \
        if (r_ == CUDA_ERROR_OUT_OF_MEMORY && mt__preload_release_cached())                        \
            r_ = f_(__VA_ARGS__);                                                                  \
        r_;                                                                                        \
    })

/* On sim the pitched allocation is the backend's, outside the allocator, as the driver's
 * would be; rows are MT_PRELOAD_PITCH_ALIGN-aligned. */
static CUresult sim_pitch(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                          unsigned elem, const void *ra)
{
    if (dptr == NULL || pitch == NULL || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    void *q = NULL;
    int rc = mt__preload_outside_sim_pitch(width, height, 1, ra, &q, pitch);
    if (rc == 0)
        *dptr = (CUdeviceptr)(uintptr_t)q;
    return mt__preload_drv_code(rc);
}

MT_HOOK CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                    unsigned int elem)
{
    const void *ra = MT__PRELOAD_RA();
    if (mt__preload()->sim)
        return sim_pitch(dptr, pitch, width, height, elem, ra);
    CUresult r = CALL_RETRY_OOM(cuMemAllocPitch_v2, dptr, pitch, width, height, elem);
    if (r == CUDA_SUCCESS)
        mt__preload_outside_alloc(mt__preload_ptr_device(*dptr, mt__preload_drv_device()), false,
                                  *dptr, *pitch * height, ra);
    return r;
}

/* Physical memory: taken at create, whether or not it is ever mapped, and given back at
 * release (the driver keeps it while a mapping remains; memtrace cannot see that). Only
 * memory located on a device counts. */
MT_HOOK CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags)
{
    const void *ra = MT__PRELOAD_RA();
    if (mt__preload()->sim)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = CALL_RETRY_OOM(cuMemCreate, handle, size, prop, flags);
    if (r == CUDA_SUCCESS && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        mt__preload_outside_alloc(prop->location.id, true, *handle, size, ra);
    return r;
}

MT_HOOK CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    if (mt__preload()->sim)
        return CUDA_ERROR_NOT_SUPPORTED;
    __typeof__(&cuMemRelease) real = REAL(cuMemRelease);
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    mt__preload_fwd_t fr;
    bool fwd = mt__preload_outside_take(true, handle, &fr);
    CUresult r = real(handle);
    if (fwd && r == CUDA_SUCCESS)
        mt__preload_outside_freed(handle, &fr);
    else if (fwd)
        mt__preload_outside_untake(true, handle, &fr);
    return r;
}

/* A pool's allocation, reported at its size (the pool may hold more than its live
 * allocations; that excess is the "not seen" part). On a capturing stream it is a graph
 * node, whose memory is the graph's. */
static void from_pool(CUresult r, CUdeviceptr *dptr, size_t size, CUstream s, const void *ra)
{
    void *graph = NULL;
    if (r == CUDA_SUCCESS && !mt__preload_capture_graph(s, &graph))
        mt__preload_outside_alloc(mt__preload_ptr_device(*dptr, mt__preload_drv_device()), false,
                                  *dptr, size, ra);
}

MT_HOOK CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                         CUstream hStream)
{
    const void *ra = MT__PRELOAD_RA();
    if (mt__preload()->sim)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = CALL_RETRY_OOM(cuMemAllocFromPoolAsync, dptr, bytesize, pool, hStream);
    from_pool(r, dptr, bytesize, hStream, ra);
    return r;
}

MT_HOOK CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream)
{
    const void *ra = MT__PRELOAD_RA();
    if (mt__preload()->sim)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = CALL_RETRY_OOM(cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, pool, hStream);
    from_pool(r, dptr, bytesize, hStream == NULL ? CU_STREAM_PER_THREAD : hStream, ra);
    return r;
}

/* ---- sub-allocated blocks as the program sees them ---- */

/* The block ptr lies in, if memtrace handed it out: [*base, *base + *size). */
static bool our_block(CUdeviceptr p, CUdeviceptr *base, size_t *size)
{
    mt_alloc_t *a = NULL;
    void *b = NULL;
    size_t n = 0;
    if (mt__preload()->init_rc != 0)
        return false;
    mt__guard_enter();
    bool ok = mt__preload_alloc_of((void *)(uintptr_t)p, &a) == 0 &&
              mt_alloc_block_info(a, (void *)(uintptr_t)p, &b, &n, NULL) == 0;
    mt__guard_leave();
    if (ok) {
        *base = (CUdeviceptr)(uintptr_t)b;
        *size = n;
    }
    return ok;
}

MT_HOOK CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    CUdeviceptr b;
    size_t n;
    if (our_block(dptr, &b, &n)) {
        if (pbase)
            *pbase = b;
        if (psize)
            *psize = n;
        return CUDA_SUCCESS;
    }
    FORWARD(cuMemGetAddressRange_v2, pbase, psize, dptr);
    return CUDA_ERROR_NOT_FOUND;
}

MT_HOOK CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    CUdeviceptr b;
    size_t n;
    if ((attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR ||
         attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE) &&
        data != NULL && our_block(ptr, &b, &n)) {
        if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
            *(CUdeviceptr *)data = b;
        else
            *(size_t *)data = n;
        return CUDA_SUCCESS;
    }
    FORWARD(cuPointerGetAttribute, data, attribute, ptr);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* The driver's handle names the whole device allocation, and whoever opens it maps that
 * allocation's start. For a block that is not at the start of its cached segment that
 * would be other bytes, so the export is refused, loudly. A block at its segment's start
 * opens at the same address the program's own allocation would. */
MT_HOOK CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    CUdeviceptr b, seg = 0;
    size_t n, segn = 0;
    if (!mt__preload()->sim && our_block(dptr, &b, &n)) {
        __typeof__(&cuMemGetAddressRange_v2) range = REAL(cuMemGetAddressRange_v2);
        if (range == NULL || range(&seg, &segn, dptr) != CUDA_SUCCESS || seg != b) {
            mt__preload_say(MT_LOG_ERROR,
                            "cuIpcGetMemHandle/cudaIpcGetMemHandle of 0x%llx refused: the block "
                            "lies at offset %llu of a cached segment, and the handle would "
                            "open at the segment's start. Share the segment base plus offset, "
                            "or allocate it alone (MEMTRACE_ALLOC_CONF=max_split_size_mb:...)",
                            (unsigned long long)dptr, (unsigned long long)(b - seg));
            return CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    FORWARD(cuIpcGetMemHandle, pHandle, dptr);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- device reset and context teardown ---- */

/* The device whose primary context ctx is, or -1 (another context, or none). */
int mt__preload_primary_device_of(CUcontext ctx)
{
    if (mt__preload()->sim)
        return mt__preload_sim_ctx_device(ctx);
    __typeof__(&cuCtxPushCurrent_v2) push = REAL(cuCtxPushCurrent_v2);
    __typeof__(&cuCtxPopCurrent_v2) pop = REAL(cuCtxPopCurrent_v2);
    __typeof__(&cuCtxGetDevice) getdev = REAL(cuCtxGetDevice);
    __typeof__(&cuDevicePrimaryCtxRetain) retain = REAL(cuDevicePrimaryCtxRetain);
    __typeof__(&cuDevicePrimaryCtxRelease_v2) release = REAL(cuDevicePrimaryCtxRelease_v2);
    if (!push || !pop || !getdev || !retain || !release || push(ctx) != CUDA_SUCCESS)
        return -1;
    CUdevice d = -1;
    CUcontext popped;
    if (getdev(&d) != CUDA_SUCCESS)
        d = -1;
    pop(&popped);
    CUcontext pc = NULL;
    if (d >= 0 && retain(&pc, d) == CUDA_SUCCESS)
        release(d);
    return pc == ctx ? d : -1;
}

/* The sim's answer to a primary context's reset (cuda mode: the driver's). */
static CUresult sim_reset(CUdevice dev)
{
    return dev >= 0 && dev < mt__preload()->ndevices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

MT_HOOK CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    mt__preload_op_reset(dev);
    FORWARD(cuDevicePrimaryCtxReset_v2, dev);
    return sim_reset(dev);
}

MT_HOOK CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    mt__preload_op_reset(dev);
    FORWARD(cuDevicePrimaryCtxReset, dev);
    return sim_reset(dev);
}

/* memtrace's memory lives in the primary contexts, so only destroying one of those takes
 * it along. The driver decides first: a destroy it refuses leaves memtrace's blocks (and
 * the program's) as they were; one it performs has freed them, and memtrace forgets the
 * device. */
MT_HOOK CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    int d = mt__preload_primary_device_of(ctx);
    if (mt__preload()->sim) {
        if (d >= 0)
            mt__preload_op_reset(d);
        return d >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
    __typeof__(&cuCtxDestroy_v2) real = REAL(cuCtxDestroy_v2);
    CUresult r = real != NULL ? real(ctx) : CUDA_ERROR_NOT_FOUND;
    if (r == CUDA_SUCCESS && d >= 0)
        mt__preload_op_reset(d);
    return r;
}

/* ---- graphs: blocks freed while capturing them ---- */

MT_HOOK CUresult cuGraphDestroy(CUgraph hGraph)
{
    mt__preload_graph_destroyed(hGraph);
    FORWARD(cuGraphDestroy, hGraph);
    return CUDA_ERROR_NOT_SUPPORTED;
}
