/* CUDA runtime API hooks: device and pinned host memory (both modes), devices, peer
 * access and errors, PyTorch's pluggable-allocator entry points, and the dlsym table.
 * The sim-served copies, memsets, streams and events are in hooks_runtime_sim.c. See
 * preload.h for the two modes. Runtime symbols are interposable only when the program
 * links libcudart dynamically (PyTorch does; nvcc's default is static). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "mt_config.h"
#include "backend/backend_cuda.h"
#include "preload/core.h"
#include "preload/hooks_graph.h"
#include "preload/hooks_rt.h"
#include "preload/outside.h"

/* The calling thread's last error (cudaGetLastError), per thread as in CUDA. */
static _Thread_local cudaError_t tls_last_error;
/* The number of context resets (mt__preload_op_resets) when this thread's last error was
 * set: a sticky error of ours counts for allocations only until a reset on any thread,
 * through either API. */
static _Thread_local unsigned tls_error_resets;

/* The runtime's code for the driver failures whose numbers differ or matter most. */
static cudaError_t from_driver(int drv)
{
    switch (drv) {
    case CUDA_ERROR_NOT_INITIALIZED:
        return cudaErrorInitializationError;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
        return cudaErrorIllegalAddress;
    case CUDA_ERROR_LAUNCH_FAILED:
        return cudaErrorLaunchFailure;
    case CUDA_ERROR_INVALID_CONTEXT:
        return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
        return cudaErrorStreamCaptureUnsupported;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
        return cudaErrorStreamCaptureInvalidated;
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
        return cudaErrorStreamCaptureImplicit;
    case CUDA_ERROR_MISALIGNED_ADDRESS:
        return cudaErrorMisalignedAddress;
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
        return cudaErrorIllegalInstruction;
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
        return cudaErrorHardwareStackError;
    case CUDA_ERROR_ECC_UNCORRECTABLE:
        return cudaErrorECCUncorrectable;
    default:
        return cudaErrorUnknown;
    }
}

/* drv: the driver's code behind rc (mt__preload_driver_result), or 0. */
static cudaError_t to_cuda_drv(int rc, int drv)
{
    if (drv != 0 && from_driver(drv) != cudaErrorUnknown)
        return from_driver(drv);
    switch (rc) {
    case 0:
        return cudaSuccess;
    case MT_ENOMEM:
        return cudaErrorMemoryAllocation;
    case MT_EINVAL:
    case MT_ENOENT:
        return cudaErrorInvalidValue;
    case MT_EAGAIN:
        return cudaErrorNotReady;
    case MT_ENODEV:
        return cudaErrorNoDevice;
    case MT_ENOTSUP:
        return cudaErrorNotSupported;
    default:
        return cudaErrorUnknown;
    }
}

cudaError_t mt__preload_rt_code(int rc)
{
    return to_cuda_drv(rc, rc != 0 ? mt__preload_driver_result() : 0);
}

/* Errors that corrupt the context: the runtime returns them from every later call and
 * cudaGetLastError never resets them (until cudaDeviceReset). */
static bool sticky(cudaError_t e)
{
    return e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure ||
           e == cudaErrorMisalignedAddress || e == cudaErrorIllegalInstruction ||
           e == cudaErrorHardwareStackError || e == cudaErrorECCUncorrectable;
}

/* The real runtime's entry point `name` (cuda mode), looked up once per call site. */
#define REAL(name) MT__PRELOAD_REAL_RT_ONCE(name)
/* The real runtime's last-error calls (cuda mode), or NULL. Torch checks the last error
 * after every kernel launch: found once, not per call. */
static cudaError_t (*real_get_err(void))(void)
{
    return mt__preload()->sim ? NULL : (cudaError_t(*)(void))REAL(cudaGetLastError);
}

static cudaError_t (*real_peek_err(void))(void)
{
    return mt__preload()->sim ? NULL : (cudaError_t(*)(void))REAL(cudaPeekAtLastError);
}

/* Records err as the thread's last error when it is one (cudaErrorNotReady is a status,
 * not an error, as in CUDA) and returns it. The runtime keeps one last error per thread,
 * the latest: an older one the real runtime holds is dropped now, so that whatever it
 * holds at cudaGetLastError time is newer than ours. */
cudaError_t mt__preload_rt_ret(cudaError_t err)
{
    if (err != cudaSuccess && err != cudaErrorNotReady) {
        cudaError_t (*clear)(void) = real_get_err();
        if (clear != NULL)
            clear();
        if (!sticky(tls_last_error)) {
            tls_last_error = err;
            tls_error_resets = mt__preload_op_resets();
        }
    }
    return err;
}

/* The device the runtime considers current for this thread. */
static int rt_device(void)
{
    if (mt__preload()->sim)
        return mt__preload_current_device();
    int (*get)(int *) = (int (*)(int *))REAL(cudaGetDevice);
    int d = 0;
    if (get != NULL && get(&d) != 0)
        d = 0;
    return d;
}

int mt__preload_rt_device(void)
{
    return rt_device();
}

static int cur_alloc(mt_alloc_t **a)
{
    return mt__preload_alloc(rt_device(), a);
}

mt_backend_t *mt__preload_rt_backend(void)
{
    mt_alloc_t *a = NULL;
    return cur_alloc(&a) == 0 ? mt_alloc_backend(a) : NULL;
}

/* ---- device memory (both modes) ---- */

/* Device + 1 whose context this thread was seen to have current after a runtime
 * allocation call, 0 for none yet. Not rechecked while the device stays the same: a
 * program that pops the context itself afterwards is on its own, as with the runtime. */
static _Thread_local int tls_bound_device;

/* The real runtime makes its current device's primary context current on a thread at
 * that thread's first call needing it (a fresh thread's first cudaMalloc, say); the driver
 * calls the program makes next rely on it. Ours are served without the runtime, so when
 * no context is current, the primary context is made current here, through the driver as
 * the runtime does (the device's backend holds a reference to it already). */
static CUresult bind_thread_context(void)
{
    if (mt__preload()->sim)
        return CUDA_SUCCESS;
    int d = rt_device();
    if (tls_bound_device == d + 1)
        return CUDA_SUCCESS;
    __typeof__(&cuCtxGetCurrent) get =
        (__typeof__(&cuCtxGetCurrent))mt__preload_real_drv("cuCtxGetCurrent");
    __typeof__(&cuDevicePrimaryCtxRetain) retain =
        (__typeof__(&cuDevicePrimaryCtxRetain))mt__preload_real_drv("cuDevicePrimaryCtxRetain");
    __typeof__(&cuDevicePrimaryCtxRelease_v2) release =
        (__typeof__(&cuDevicePrimaryCtxRelease_v2))mt__preload_real_drv(
            "cuDevicePrimaryCtxRelease_v2");
    __typeof__(&cuCtxSetCurrent) set =
        (__typeof__(&cuCtxSetCurrent))mt__preload_real_drv("cuCtxSetCurrent");
    if (get == NULL || retain == NULL || release == NULL || set == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUcontext c = NULL;
    CUresult r = get(&c);
    if (r == CUDA_SUCCESS && c == NULL) {
        r = retain(&c, d);
        if (r == CUDA_SUCCESS) {
            r = set(c);
            release(d);
        }
    }
    if (r == CUDA_SUCCESS)
        tls_bound_device = d + 1;
    return r;
}

/* The sticky error the context holds, as far as it is known without a driver call: ours
 * (a call of this thread that memtrace served failed with one) or the runtime's (any call
 * the program made saw one; cudaPeekAtLastError reports it on every thread until a reset).
 * A cache hit makes no driver call, so without this it would succeed where the runtime's
 * cudaMalloc fails. A fault no call has seen yet is not known, as with the runtime, whose
 * calls see it only once the device has reported it. */
static cudaError_t sticky_error(void)
{
    if (sticky(tls_last_error) && tls_error_resets == mt__preload_op_resets())
        return tls_last_error;
    cudaError_t (*peek)(void) = real_peek_err();
    cudaError_t e = peek != NULL ? peek() : cudaSuccess;
    return sticky(e) ? e : cudaSuccess;
}

/* sticky_error() as a driver code, for the core: the sticky driver code the runtime's
 * code comes from (the core's list, so that it is written once). */
static int rt_held(void)
{
    cudaError_t e = sticky_error();
    for (int d = 1; e != cudaSuccess && d < 1000; d++)
        if (mt__preload_sticky_code(d) && from_driver(d) == e)
            return d;
    return 0;
}

/* The runtime's current device, with its primary context bound to the thread. */
static int rt_malloc_device(int *dev, int *drv)
{
    mt_alloc_t *a = NULL;
    int rc = cur_alloc(&a);
    if (rc != 0) {
        *drv = mt__preload_driver_result();
        return rc;
    }
    CUresult r = bind_thread_context();
    if (r != CUDA_SUCCESS) {
        *drv = r;
        return MT_EIO;
    }
    *dev = rt_device();
    return 0;
}

static const mt__preload_api_t rt_api = {rt_malloc_device, rt_held};

/* real_async: the runtime's own stream-ordered allocation (NULL for cudaMalloc). ra: the
 * caller, whom the driver hooks the runtime reaches report forwarded memory for
 * (outside.c); the graph node a capture makes is the graph's, reported by nobody. */
static cudaError_t rt_malloc(void **p, size_t size, cudaStream_t stream,
                             cudaError_t (*real_async)(void **, size_t, cudaStream_t),
                             const void *ra)
{
    if (p == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidValue);
    mt__preload_op_t op;
    int rc = mt__preload_op_malloc(&rt_api, size, stream, real_async != NULL, p, &op);
    if (rc == MT_PRELOAD_CAPTURE)
        return real_async(p, size, stream);
    if (rc == MT_PRELOAD_REAL) {
        cudaError_t (*real)(void **, size_t) = (cudaError_t(*)(void **, size_t))REAL(cudaMalloc);
        if (real_async == NULL && real == NULL)
            return mt__preload_rt_ret(cudaErrorInsufficientDriver);
        const void *prev = mt__preload_outer_push(ra);
        cudaError_t e = real_async != NULL ? real_async(p, size, stream) : real(p, size);
        mt__preload_outer_pop(prev);
        return e;
    }
    return mt__preload_rt_ret(to_cuda_drv(rc, op.drv));
}

/* real_free: the runtime's own free for pointers memtrace did not hand out (managed,
 * pitch, 3D, pool and graph allocations); cudaFree's form when sync, else the async one.
 * On sim there is none: nothing else could have allocated device memory there. */
static cudaError_t rt_free(void *p, cudaStream_t stream, bool sync, void (*real_free)(void))
{
    bool can_forward = real_free != NULL && !mt__preload()->sim;
    /* cudaFree(0) is the idiom that makes the runtime create and bind the context: the
     * real runtime must see it. */
    if (p == NULL && sync && can_forward)
        return ((cudaError_t(*)(void *))(void *)real_free)(NULL);
    if (p == NULL)
        return cudaSuccess;
    mt__preload_op_t op;
    int rc = mt__preload_op_free(p, stream, sync, can_forward, &op);
    if (rc == MT_PRELOAD_REAL || rc == MT_PRELOAD_CAPTURE) {
        cudaError_t e = sync ? ((cudaError_t(*)(void *))(void *)real_free)(p)
                             : ((cudaError_t(*)(void *, cudaStream_t))(void *)real_free)(p, stream);
        mt__preload_op_forwarded(p, &op, e == cudaSuccess);
        return e;
    }
    return mt__preload_rt_ret(to_cuda_drv(rc, op.drv));
}

#define FN(f) ((void (*)(void))(f))

cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);

MT_HOOK cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    return rt_malloc(devPtr, size, NULL, NULL, MT__PRELOAD_RA());
}

MT_HOOK cudaError_t cudaFree(void *devPtr)
{
    return rt_free(devPtr, NULL, true, FN(REAL(cudaFree)));
}

MT_HOOK cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    return rt_malloc(devPtr, size, hStream, REAL(cudaMallocAsync), MT__PRELOAD_RA());
}

MT_HOOK cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    return rt_free(devPtr, hStream, false, FN(REAL(cudaFreeAsync)));
}

/* Programs built with --default-stream per-thread: stream 0 is the thread's own stream. */
MT_HOOK cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
    cudaStream_t s = hStream == NULL ? cudaStreamPerThread : hStream;
    return rt_malloc(devPtr, size, s, REAL(cudaMallocAsync_ptsz), MT__PRELOAD_RA());
}

MT_HOOK cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
    cudaStream_t s = hStream == NULL ? cudaStreamPerThread : hStream;
    return rt_free(devPtr, s, false, FN(REAL(cudaFreeAsync_ptsz)));
}

/* Pitched memory is the driver's (cuda mode: the runtime's call, reported for the caller
 * by the driver hook it reaches); on sim the backend's, outside the allocator, as the
 * driver's would be (rows aligned to MT_PRELOAD_PITCH_ALIGN). */
MT_HOOK cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    const void *ra = MT__PRELOAD_RA();
    if (!mt__preload()->sim) {
        cudaError_t (*real)(void **, size_t *, size_t, size_t) =
            (cudaError_t(*)(void **, size_t *, size_t, size_t))REAL(cudaMallocPitch);
        if (real == NULL)
            return mt__preload_rt_ret(cudaErrorInsufficientDriver);
        const void *prev = mt__preload_outer_push(ra);
        cudaError_t e = real(devPtr, pitch, width, height);
        mt__preload_outer_pop(prev);
        return e;
    }
    int rc = mt__preload_outside_sim_pitch(width, height, 1, ra, devPtr, pitch);
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
}

MT_HOOK cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent)
{
    const void *ra = MT__PRELOAD_RA();
    if (!mt__preload()->sim) {
        cudaError_t (*real)(struct cudaPitchedPtr *, struct cudaExtent) =
            (cudaError_t(*)(struct cudaPitchedPtr *, struct cudaExtent))REAL(cudaMalloc3D);
        if (real == NULL)
            return mt__preload_rt_ret(cudaErrorInsufficientDriver);
        const void *prev = mt__preload_outer_push(ra);
        cudaError_t e = real(pitchedDevPtr, extent);
        mt__preload_outer_pop(prev);
        return e;
    }
    if (pitchedDevPtr == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidValue);
    void *q = NULL;
    size_t pt = 0;
    int rc = mt__preload_outside_sim_pitch(extent.width, extent.height, extent.depth, ra, &q, &pt);
    if (rc == 0)
        *pitchedDevPtr = (struct cudaPitchedPtr){
            .ptr = q, .pitch = pt, .xsize = extent.width, .ysize = extent.height};
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
}

/* A pool the program sets, or whose access it sets, keeps its stream-ordered
 * allocations on that device with the runtime (the pool honours what was asked). */
MT_HOOK cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool)
{
    cudaError_t (*real)(int, cudaMemPool_t) =
        (cudaError_t(*)(int, cudaMemPool_t))REAL(cudaDeviceSetMemPool);
    cudaError_t e = real != NULL ? real(device, memPool) : cudaErrorInsufficientDriver;
    if (e == cudaSuccess)
        mt__preload_own_pool_set(device);
    return mt__preload_rt_ret(e);
}

MT_HOOK cudaError_t cudaMemPoolSetAccess(cudaMemPool_t memPool,
                                         const struct cudaMemAccessDesc *descList, size_t count)
{
    cudaError_t (*real)(cudaMemPool_t, const struct cudaMemAccessDesc *, size_t) = (cudaError_t(*)(
        cudaMemPool_t, const struct cudaMemAccessDesc *, size_t))REAL(cudaMemPoolSetAccess);
    cudaError_t e = real != NULL ? real(memPool, descList, count) : cudaErrorInsufficientDriver;
    if (e == cudaSuccess && !mt__preload()->sim)
        mt__preload_pool_access_set(memPool);
    return mt__preload_rt_ret(e);
}

/* Drops the current device's cache and state first, then resets. */
MT_HOOK cudaError_t cudaDeviceReset(void)
{
    mt__preload_op_reset(rt_device());
    tls_last_error = cudaSuccess; /* a reset clears sticky errors too */
    FORWARD(cudaDeviceReset);
    return cudaSuccess;
}

/* The capture's pool and kept blocks go once its execs are gone too (hooks_graph.c). */
MT_HOOK cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    mt__preload_graph_destroyed(graph);
    FORWARD(cudaGraphDestroy, graph);
    return mt__preload_rt_ret(cudaErrorNotSupported);
}

/* What the program may still get: free device memory plus what our cache holds unused. */
MT_HOOK cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    if (free_b == NULL || total_b == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidValue);
    return mt__preload_rt_ret(
        mt__preload_rt_code(mt__preload_op_mem_info(rt_device(), free_b, total_b)));
}

/* ---- pinned host memory (both modes) ---- */

MT_HOOK cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    if (pHost == NULL || (flags & ~MT_HOST_ALLOC_FLAGS) != 0)
        return mt__preload_rt_ret(cudaErrorInvalidValue);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    if (size == 0) {
        *pHost = NULL;
        return cudaSuccess;
    }
    return mt__preload_rt_ret(
        mt__preload_rt_code(mt__preload_op_host_alloc(b, size, flags, pHost)));
}

MT_HOOK cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return cudaHostAlloc(ptr, size, 0);
}

MT_HOOK cudaError_t cudaFreeHost(void *ptr)
{
    if (ptr == NULL)
        return cudaSuccess;
    int rc = mt__preload_op_host_free(ptr);
    if (rc == MT_PRELOAD_REAL && REAL(cudaFreeHost) != NULL)
        return ((cudaError_t(*)(void *))REAL(cudaFreeHost))(ptr); /* not ours */
    return mt__preload_rt_ret(mt__preload_rt_code(rc == MT_PRELOAD_REAL ? MT_ENOENT : rc));
}

/* ---- devices, peer access and errors (sim-served) ---- */

/* Peer access: the runtime's call covers cuMemAlloc memory only, so
 * the peer's expandable segments are granted to the current device too. */
MT_HOOK cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
    mt_preload_t *P = mt__preload();
    cudaError_t e = cudaSuccess;
    if (!P->sim) {
        cudaError_t (*real)(int, unsigned) =
            (cudaError_t(*)(int, unsigned))mt__preload_real_rt("cudaDeviceEnablePeerAccess");
        if (real == NULL)
            return mt__preload_rt_ret(cudaErrorInsufficientDriver);
        /* Already enabled: by a copy of the runtime or driver API memtrace does not see
         * (NCCL's static cudart). memtrace's segments were not granted then: grant now. */
        e = real(peerDevice, flags);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
            return e;
    } else if (flags != 0) {
        return mt__preload_rt_ret(cudaErrorInvalidValue);
    }
    if (peerDevice < 0 || peerDevice >= P->ndevices || peerDevice == rt_device())
        return mt__preload_rt_ret(cudaErrorInvalidDevice);
    cudaError_t g = mt__preload_rt_code(mt__preload_peer_access(rt_device(), peerDevice));
    return mt__preload_rt_ret(g != cudaSuccess ? g : e);
}

MT_HOOK cudaError_t cudaDeviceCanAccessPeer(int *canAccess, int device, int peerDevice)
{
    FORWARD(cudaDeviceCanAccessPeer, canAccess, device, peerDevice);
    int n = mt__preload()->ndevices;
    if (canAccess == NULL || device < 0 || device >= n || peerDevice < 0 || peerDevice >= n)
        return mt__preload_rt_ret(cudaErrorInvalidDevice);
    *canAccess = device != peerDevice;
    return cudaSuccess;
}

MT_HOOK cudaError_t cudaGetDeviceCount(int *count)
{
    FORWARD(cudaGetDeviceCount, count);
    if (count == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidValue);
    mt_preload_t *P = mt__preload();
    if (P->init_rc != 0 || P->ndevices == 0) {
        *count = 0;
        return mt__preload_rt_ret(cudaErrorNoDevice);
    }
    *count = P->ndevices;
    return cudaSuccess;
}

MT_HOOK cudaError_t cudaSetDevice(int device)
{
    FORWARD(cudaSetDevice, device);
    if (device < 0 || device >= mt__preload()->ndevices)
        return mt__preload_rt_ret(cudaErrorInvalidDevice);
    mt__preload_set_current_device(device);
    return cudaSuccess;
}

MT_HOOK cudaError_t cudaGetDevice(int *device)
{
    FORWARD(cudaGetDevice, device);
    if (device == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidValue);
    *device = mt__preload_current_device();
    return cudaSuccess;
}

/* The latest error of the thread, ours or the real runtime's: mt__preload_rt_ret() cleared the real
 * runtime's when it recorded ours, so an error the runtime holds now is newer. A sticky
 * error stays (the runtime's own do the same). */
MT_HOOK cudaError_t cudaGetLastError(void)
{
    cudaError_t (*real)(void) = real_get_err();
    cudaError_t r = real ? real() : cudaSuccess;
    cudaError_t e = r != cudaSuccess ? r : tls_last_error;
    if (!sticky(tls_last_error))
        tls_last_error = cudaSuccess;
    return sticky(tls_last_error) ? tls_last_error : e;
}

MT_HOOK cudaError_t cudaPeekAtLastError(void)
{
    cudaError_t (*real)(void) = real_peek_err();
    cudaError_t r = real ? real() : cudaSuccess;
    if (sticky(tls_last_error))
        return tls_last_error;
    return r != cudaSuccess ? r : tls_last_error;
}

/* Names and strings of the codes our served calls return; others go to the runtime. */
static const struct {
    cudaError_t code;
    const char *name;
    const char *text;
} errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

MT_HOOK const char *cudaGetErrorString(cudaError_t error)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error)
            return errors[i].text;
    const char *(*real)(cudaError_t) =
        (const char *(*)(cudaError_t))mt__preload_real_rt("cudaGetErrorString");
    return real ? real(error) : "unrecognized error code";
}

MT_HOOK const char *cudaGetErrorName(cudaError_t error)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error)
            return errors[i].name;
    const char *(*real)(cudaError_t) =
        (const char *(*)(cudaError_t))mt__preload_real_rt("cudaGetErrorName");
    return real ? real(error) : "cudaErrorUnknown";
}

/* ---- PyTorch's CUDAPluggableAllocator entry points ---- */

/* torch's CUDAPluggableAllocator stores whatever alloc_fn returns as the tensor's data,
 * unchecked, and nothing in its interface lets a C function raise OutOfMemoryError; a
 * NULL would surface later as an illegal address far from the cause. So a refused
 * request stops the process here with memtrace's report (the allocator's message, with
 * the per-tag bytes and the OOM snapshot's path). MEMTRACE_PLUGGABLE_OOM=null returns
 * NULL instead, for callers that check it. */
static void *pluggable_refused(int rc, ssize_t size, int device)
{
    const char *mode = getenv("MEMTRACE_PLUGGABLE_OOM");
    if (size == 0 || rc == MT_ENODEV || rc == MT_EINVAL || /* the caller's error, not ours */
        (mode != NULL && strcmp(mode, "null") == 0))
        return NULL;
    mt_preload_t *P = mt__preload();
    pthread_mutex_lock(&P->oom_mu);
    if (rc == MT_ENOMEM)
        fprintf(stderr, "memtrace: memtrace_alloc(%zd bytes, device %d): %s\n", size, device,
                P->oom_msg[0] != '\0' ? P->oom_msg : "out of memory");
    else
        fprintf(stderr, "memtrace: memtrace_alloc(%zd bytes, device %d) failed (%d)\n", size,
                device, rc);
    pthread_mutex_unlock(&P->oom_mu);
    fprintf(stderr, "memtrace: torch's pluggable allocator cannot be told of the failure and "
                    "would use a NULL pointer: stopping\n");
    abort();
}

MT_HOOK void *memtrace_alloc(ssize_t size, int device, cudaStream_t stream)
{
    mt_alloc_t *a = NULL;
    void *p = NULL;
    if (size < 0)
        return NULL;
    int rc = mt__preload_alloc(device, &a);
    mt_stream_t *s = NULL;
    mt__guard_enter();
    if (rc == 0)
        rc = mt__preload_stream(mt_alloc_backend(a), stream, &s);
    /* A capture's request: a new segment for its pool must not break the capture. */
    bool capture = rc == 0 && mt__preload_graph_routed(s);
    if (capture)
        mt__cuda_capture_enter();
    if (rc == 0)
        rc = mt_alloc_malloc(a, (size_t)size, s, mt__preload_tag(), &p);
    if (capture)
        mt__cuda_capture_leave();
    mt__guard_leave();
    if (rc == MT_ENOMEM)
        mt__preload_note_oom(a, (size_t)size);
    return rc == 0 ? p : pluggable_refused(rc, size, device);
}

MT_HOOK void memtrace_free(void *ptr, ssize_t size, int device, cudaStream_t stream)
{
    (void)size;
    (void)stream; /* torch frees on the allocation stream and records other uses itself */
    mt_alloc_t *a = NULL;
    if (ptr == NULL || mt__preload_alloc(device, &a) != 0)
        return;
    int rc = mt__preload_graph_keep(a, ptr); /* a captured graph uses it: kept for it */
    if (rc == 0) {
        mt__guard_enter();
        rc = mt_alloc_free(a, ptr);
        mt__guard_leave();
    }
    if (rc == MT_ENOENT)
        atomic_fetch_add(&mt__preload()->unknown_frees, 1);
}

/* ---- lookup for dlsym ---- */

#define H(name, mem)                                                                               \
    {                                                                                              \
#name, (void *)name, mem                                                                   \
    }
static const struct {
    const char *name;
    void *fn;
    bool mem; /* a memory entry point: ours in both modes */
} rt_hooks[] = {
    H(cudaMalloc, true),
    H(cudaFree, true),
    H(cudaMallocAsync, true),
    H(cudaMallocPitch, true),
    H(cudaMalloc3D, true),
    H(cudaDeviceSetMemPool, true),
    H(cudaMemPoolSetAccess, true),
    H(cudaFreeAsync, true),
    H(cudaMallocAsync_ptsz, true),
    H(cudaFreeAsync_ptsz, true),
    H(cudaDeviceReset, true),
    H(cudaGraphDestroy, true),
    H(cudaMemGetInfo, true),
    H(cudaMallocHost, true),
    H(cudaHostAlloc, true),
    H(cudaFreeHost, true),
    H(cudaMemcpy, false),
    H(cudaMemcpyAsync, false),
    H(cudaMemset, false),
    H(cudaMemsetAsync, false),
    H(cudaStreamCreate, false),
    H(cudaStreamCreateWithFlags, false),
    H(cudaStreamDestroy, false),
    H(cudaStreamSynchronize, false),
    H(cudaStreamWaitEvent, false),
    H(cudaDeviceSynchronize, false),
    H(cudaEventCreate, false),
    H(cudaEventCreateWithFlags, false),
    H(cudaEventRecord, false),
    H(cudaEventQuery, false),
    H(cudaEventSynchronize, false),
    H(cudaEventElapsedTime, false),
    H(cudaEventDestroy, false),
    H(cudaGetDeviceCount, false),
    H(cudaSetDevice, false),
    H(cudaMemcpyPeer, true),
    H(cudaMemcpyPeerAsync, true),
    H(cudaDeviceEnablePeerAccess, false),
    H(cudaDeviceCanAccessPeer, false),
    H(cudaGetDevice, false),
    H(cudaGetLastError, true),
    H(cudaPeekAtLastError, true),
    H(cudaGetErrorString, true),
    H(cudaGetErrorName, true),
};

void *mt__preload_rt_hook(const char *name, bool sim)
{
    if (name[0] != 'c' || name[1] != 'u' || name[2] != 'd' || name[3] != 'a')
        return NULL;
    for (size_t i = 0; i < sizeof rt_hooks / sizeof rt_hooks[0]; i++)
        if (strcmp(rt_hooks[i].name, name) == 0)
            return sim || rt_hooks[i].mem ? rt_hooks[i].fn : NULL;
    return NULL;
}
