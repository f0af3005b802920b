/* Driver entry points memtrace watches and then forwards (see preload/README.md): other
 * allocators' allocations (the cache is given back when they run out), queries and IPC of
 * sub-allocated blocks, device reset and context teardown, graph destruction. */
#include "mt_config.h"
#include "preload/hooks_cuda.h"
#include "preload/hooks_graph.h"
#include "preload/preload.h"

/* ---- allocations memtrace does not serve: the driver's, with the cache given back when
 * the driver runs out (issue 16 item 12) ---- */

#define RETRY_OOM(name, ...)                                                                       \
    do {                                                                                           \
        if (mt__preload()->sim)                                                                    \
            return CUDA_ERROR_NOT_SUPPORTED;                                                       \
        __typeof__(&name) f_ = REAL(name);                                                         \
        if (f_ == NULL)                                                                            \
            return CUDA_ERROR_NOT_FOUND;                                                           \
        CUresult r_ = f_(__VA_ARGS__);                                                             \
        if (r_ == CUDA_ERROR_OUT_OF_MEMORY && mt__preload_release_cached())                        \
            r_ = f_(__VA_ARGS__);                                                                  \
        return r_;                                                                                 \
    } while (0)

MT_HOOK CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                    unsigned int elem)
{
    RETRY_OOM(cuMemAllocPitch_v2, dptr, pitch, width, height, elem);
}

MT_HOOK CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags)
{
    RETRY_OOM(cuMemCreate, handle, size, prop, flags);
}

MT_HOOK CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                         CUstream hStream)
{
    RETRY_OOM(cuMemAllocFromPoolAsync, dptr, bytesize, pool, hStream);
}

MT_HOOK CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream)
{
    RETRY_OOM(cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, pool, hStream);
}

/* ---- sub-allocated blocks as the program sees them (issue 16 item 6) ---- */

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

/* ---- device reset and context teardown (issue 16 item 1) ---- */

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

MT_HOOK CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    mt__preload_drop_device(dev);
    FORWARD(cuDevicePrimaryCtxReset_v2, dev);
    return dev >= 0 && dev < mt__preload()->ndevices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

MT_HOOK CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    mt__preload_drop_device(dev);
    FORWARD(cuDevicePrimaryCtxReset, dev);
    return dev >= 0 && dev < mt__preload()->ndevices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
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
            mt__preload_drop_device(d);
        return d >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
    __typeof__(&cuCtxDestroy_v2) real = REAL(cuCtxDestroy_v2);
    CUresult r = real != NULL ? real(ctx) : CUDA_ERROR_NOT_FOUND;
    if (r == CUDA_SUCCESS && d >= 0)
        mt__preload_drop_device(d);
    return r;
}

/* ---- graphs: blocks freed while capturing them (issue 16 item 7) ---- */

MT_HOOK CUresult cuGraphDestroy(CUgraph hGraph)
{
    if (hGraph != NULL)
        mt__preload_unpark(NULL, hGraph);
    mt__preload_graph_destroyed(hGraph);
    FORWARD(cuGraphDestroy, hGraph);
    return CUDA_ERROR_NOT_SUPPORTED;
}
