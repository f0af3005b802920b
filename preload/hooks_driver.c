/* CUDA driver API hooks (cuMemAlloc_v2, ...), both cuGetProcAddress versions, and the
 * name lookup behind our dlsym; the sim-served copies, memsets, streams and events are in
 * hooks_driver_sim.c. See preload.h for the two modes.
 *
 * Since CUDA 11.3 the runtime fetches driver entry points with cuGetProcAddress by
 * *base name* ("cuMemAlloc") and a CUDA version, so exporting cuMemAlloc_v2 alone is
 * bypassed; answering cuGetProcAddress with our functions closes that path.
 *
 * On a machine with no driver, `memtrace run` puts a directory first on LD_LIBRARY_PATH
 * whose libcuda.so.1 is a link to this library (cmd_run.c): dlopen("libcuda.so.1") then
 * returns this library, and dlsym(handle, "cuGetProcAddress_v2") our resolver, which
 * hands out the sim-served driver functions (here and in hooks_driver_sim.c). No
 * dlopen interposition is needed, and dlopen keeps its caller-relative semantics
 * (RUNPATH, $ORIGIN) for every other library. Without memtrace run, the same directory
 * can be put on LD_LIBRARY_PATH by hand (README). */
#include <string.h>

#include "mt_config.h"
#include "preload/core.h"
#include "preload/hooks_cuda.h"
#include "preload/hooks_graph.h"
#include "preload/outside.h"
#include "preload/preload.h"

/* drv: the driver's code behind rc (mt__preload_driver_result), or 0. */
static CUresult to_cu_drv(int rc, int drv)
{
    /* The driver's own code, not a flattened one: always for the fatal codes (the
     * allocator reports any failed device malloc as out of memory), else when memtrace's
     * code would be a guess (I/O, no device). */
    if (drv != 0 && (mt__preload_fatal_code(drv) || rc == MT_EIO || rc == MT_ENODEV))
        return (CUresult)drv;
    switch (rc) {
    case 0:
        return CUDA_SUCCESS;
    case MT_ENOMEM:
        return CUDA_ERROR_OUT_OF_MEMORY;
    case MT_EINVAL:
    case MT_ENOENT:
        return CUDA_ERROR_INVALID_VALUE;
    case MT_EAGAIN:
        return CUDA_ERROR_NOT_READY;
    case MT_ENODEV:
        return CUDA_ERROR_NO_DEVICE;
    case MT_ENOTSUP:
        return CUDA_ERROR_NOT_SUPPORTED;
    default:
        return CUDA_ERROR_UNKNOWN;
    }
}

CUresult mt__preload_drv_code(int rc)
{
    return to_cu_drv(rc, rc != 0 ? mt__preload_driver_result() : 0);
}

/* Primary-context handles on sim: one constant address per device. */
static const char sim_ctx[MT_PRELOAD_MAX_DEVICES];

int mt__preload_sim_ctx_device(const void *ctx)
{
    const char *c = ctx;
    return c >= sim_ctx && c < sim_ctx + mt__preload()->ndevices ? (int)(c - sim_ctx) : -1;
}

/* Why the calling thread's latest drv_device found no device: the driver's answer. */
static _Thread_local CUresult tls_ctx_err;

/* The device of the calling thread's current context; -1 when the driver names none (cuda
 * mode): with no context current it answers CUDA_ERROR_INVALID_CONTEXT, and so do we,
 * rather than inventing device 0 (and a context on it); with a context that holds a fault,
 * that fault, as every call needing the context does. */
static int drv_device(void)
{
    if (mt__preload()->sim)
        return mt__preload_current_device();
    CUresult (*get)(CUdevice *) = (CUresult(*)(CUdevice *))mt__preload_real_drv("cuCtxGetDevice");
    CUdevice d = 0;
    tls_ctx_err = get == NULL ? CUDA_ERROR_INVALID_CONTEXT : get(&d);
    return tls_ctx_err != CUDA_SUCCESS ? -1 : d;
}

int mt__preload_drv_device(void)
{
    return drv_device();
}

/* The error of a hook that found no backend. */
CUresult mt__preload_drv_no_backend(void)
{
    return tls_ctx_err != CUDA_SUCCESS ? tls_ctx_err : CUDA_ERROR_NO_DEVICE;
}

mt_backend_t *mt__preload_drv_backend(void)
{
    mt_alloc_t *a = NULL;
    return mt__preload_alloc(drv_device(), &a) == 0 ? mt_alloc_backend(a) : NULL;
}

/* ---- contexts made with cuCtxCreate ---- */

/* Each device's primary-context handle as last seen (cuda mode); NULL until asked. */
static _Atomic(CUcontext) primary_seen[MT_PRELOAD_MAX_DEVICES];

/* Whether ctx, a context of device dev, is dev's primary context. Asked without creating
 * the primary context: an inactive one cannot be current. When the driver cannot say,
 * yes (served as before). */
static bool is_primary(CUcontext ctx, CUdevice dev)
{
    if (dev < 0 || dev >= MT_PRELOAD_MAX_DEVICES)
        return true;
    if (atomic_load_explicit(&primary_seen[dev], memory_order_relaxed) == ctx)
        return true;
    __typeof__(&cuDevicePrimaryCtxGetState) state = REAL(cuDevicePrimaryCtxGetState);
    unsigned flags = 0;
    int active = 1;
    if (state != NULL && state(dev, &flags, &active) == CUDA_SUCCESS && !active)
        return false;
    __typeof__(&cuDevicePrimaryCtxRetain) retain = REAL(cuDevicePrimaryCtxRetain);
    __typeof__(&cuDevicePrimaryCtxRelease_v2) release = REAL(cuDevicePrimaryCtxRelease_v2);
    CUcontext pc = NULL;
    if (retain == NULL || release == NULL || retain(&pc, dev) != CUDA_SUCCESS)
        return true;
    release(dev);
    atomic_store_explicit(&primary_seen[dev], pc, memory_order_relaxed);
    return pc == ctx;
}

/* memtrace's memory lives in the primary contexts. A context made with cuCtxCreate owns
 * what is allocated in it: its kernels fault on another context's cuMemAlloc memory, and
 * its destroy frees that memory. So allocations there are the driver's, not ours. */
bool mt__preload_current_is_primary(void)
{
    if (mt__preload()->sim)
        return true;
    __typeof__(&cuCtxGetCurrent) get = REAL(cuCtxGetCurrent);
    __typeof__(&cuCtxGetDevice) getdev = REAL(cuCtxGetDevice);
    CUcontext ctx = NULL;
    CUdevice dev = -1;
    if (get == NULL || getdev == NULL || get(&ctx) != CUDA_SUCCESS || ctx == NULL ||
        getdev(&dev) != CUDA_SUCCESS)
        return true; /* no context: the callers answer that themselves */
    return is_primary(ctx, dev);
}

/* cudaMallocAsync and cuMemAllocAsync allocate from the pool current to the stream's
 * device, whichever device is current: a stream of device 1 with device 0 current gets
 * device 1's memory. */
int mt__preload_stream_device(void *stream, int cur)
{
    CUstream h = stream;
    if (mt__preload()->sim || h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return cur;
    __typeof__(&cuStreamGetCtx) getctx = REAL(cuStreamGetCtx);
    CUcontext ctx = NULL;
    if (getctx == NULL || getctx(h, &ctx) != CUDA_SUCCESS || ctx == NULL)
        return cur;
    int n = mt__preload()->ndevices;
    for (int d = 0; d < n && d < MT_PRELOAD_MAX_DEVICES; d++)
        if (atomic_load_explicit(&primary_seen[d], memory_order_relaxed) == ctx)
            return d;
    __typeof__(&cuCtxPushCurrent_v2) push = REAL(cuCtxPushCurrent_v2);
    __typeof__(&cuCtxPopCurrent_v2) pop = REAL(cuCtxPopCurrent_v2);
    __typeof__(&cuCtxGetDevice) getdev = REAL(cuCtxGetDevice);
    CUdevice dev = -1;
    if (push == NULL || pop == NULL || getdev == NULL || push(ctx) != CUDA_SUCCESS)
        return cur;
    CUresult r = getdev(&dev);
    CUcontext popped = NULL;
    pop(&popped);
    if (r != CUDA_SUCCESS || dev < 0)
        return cur;
    return is_primary(ctx, dev) ? dev : -1;
}

/* ---- pools the program set ---- */

/* Bit d: the program made a pool of its own current to device d, or set the access of d's
 * default pool. Its stream-ordered allocations on d then go to the driver, whose pool
 * keeps the attributes and peer access the program asked for (memtrace's memory would
 * not). Never cleared. */
static _Atomic uint64_t own_pool;

bool mt__preload_own_pool(int dev)
{
    return dev >= 0 && dev < 64 && (atomic_load(&own_pool) >> dev & 1);
}

void mt__preload_own_pool_set(int dev)
{
    if (dev >= 0 && dev < 64)
        atomic_fetch_or(&own_pool, (uint64_t)1 << dev);
}

/* pool's access was set: the device whose default pool it is now answers through the
 * driver (a pool the program created reaches allocations only once made current). */
void mt__preload_pool_access_set(void *pool)
{
    __typeof__(&cuDeviceGetDefaultMemPool) get = REAL(cuDeviceGetDefaultMemPool);
    int n = mt__preload()->ndevices;
    for (int d = 0; get != NULL && d < n; d++) {
        CUmemoryPool def = NULL;
        if (get(&def, d) == CUDA_SUCCESS && (void *)def == pool)
            mt__preload_own_pool_set(d);
    }
}

MT_HOOK CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    __typeof__(&cuDeviceSetMemPool) real = REAL(cuDeviceSetMemPool);
    CUresult r = real != NULL ? real(dev, pool) : CUDA_ERROR_NOT_FOUND;
    if (r == CUDA_SUCCESS)
        mt__preload_own_pool_set(dev);
    return r;
}

MT_HOOK CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
    __typeof__(&cuMemPoolSetAccess) real = REAL(cuMemPoolSetAccess);
    CUresult r = real != NULL ? real(pool, map, count) : CUDA_ERROR_NOT_FOUND;
    if (r == CUDA_SUCCESS)
        mt__preload_pool_access_set(pool);
    return r;
}

/* ---- device memory (both modes) ---- */

/* The stream a call names: NULL in a _ptsz entry point is the per-thread stream. */
static CUstream pt_stream(CUstream s, bool pt)
{
    return pt && s == NULL ? CU_STREAM_PER_THREAD : s;
}

static int drv_malloc_device(int *dev, int *drv)
{
    *dev = drv_device();
    *drv = *dev < 0 ? (int)tls_ctx_err : 0;
    return *dev < 0 ? MT_ENODEV : 0;
}

static const mt__preload_api_t drv_api = {drv_malloc_device, NULL};

/* real_async: the driver's own entry point for a stream-ordered call (NULL for
 * cuMemAlloc). What goes to the driver is reported for ra's module (outside.c), but for
 * the allocation node a capture makes, whose memory is the graph's, made at launch. */
static CUresult drv_malloc(CUdeviceptr *p, size_t size, CUstream stream,
                           CUresult (*real_async)(CUdeviceptr *, size_t, CUstream), const void *ra)
{
    if (p == NULL || size == 0) /* cuMemAlloc refuses 0 bytes, unlike cudaMalloc */
        return CUDA_ERROR_INVALID_VALUE;
    mt__preload_op_t op;
    void *q = NULL;
    int rc = mt__preload_op_malloc(&drv_api, size, stream, real_async != NULL, &q, &op);
    if (rc == MT_PRELOAD_CAPTURE)
        return real_async(p, size, stream);
    if (rc == MT_PRELOAD_REAL) {
        __typeof__(&cuMemAlloc_v2) real = REAL(cuMemAlloc_v2);
        CUresult r = real_async != NULL ? real_async(p, size, stream)
                     : real != NULL     ? real(p, size)
                                        : CUDA_ERROR_NOT_FOUND;
        if (r == CUDA_SUCCESS)
            mt__preload_outside_alloc(mt__preload_ptr_device(*p, op.dev), false, *p, size, ra);
        return r;
    }
    if (rc == 0)
        *p = (CUdeviceptr)(uintptr_t)q;
    return to_cu_drv(rc, op.drv);
}

/* real_free: the driver's own free for what memtrace did not hand out (managed, pitch,
 * pool, graph allocations), cuMemFree's form when sync, else the async one; NULL on sim,
 * where such a pointer is an error. */
static CUresult drv_free(CUdeviceptr p, CUstream stream, bool sync, CUresult (*real_free)(void))
{
    if (p == 0)
        return CUDA_ERROR_INVALID_VALUE; /* as cuMemFree(0) answers */
    mt__preload_op_t op;
    void *q = (void *)(uintptr_t)p;
    int rc = mt__preload_op_free(q, stream, sync, real_free != NULL, &op);
    if (rc == MT_PRELOAD_REAL || rc == MT_PRELOAD_CAPTURE) {
        CUresult r = sync ? ((CUresult(*)(CUdeviceptr))(void *)real_free)(p)
                          : ((CUresult(*)(CUdeviceptr, CUstream))(void *)real_free)(p, stream);
        mt__preload_op_forwarded(q, &op, r == CUDA_SUCCESS);
        return r;
    }
    return to_cu_drv(rc, op.drv);
}

#define FN(f) ((CUresult(*)(void))(void *)(f))

MT_HOOK CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return drv_malloc(dptr, bytesize, NULL, NULL, MT__PRELOAD_RA());
}

MT_HOOK CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    return drv_free(dptr, NULL, true, FN(REAL(cuMemFree_v2)));
}

MT_HOOK CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return drv_malloc(dptr, bytesize, hStream, REAL(cuMemAllocAsync), MT__PRELOAD_RA());
}

MT_HOOK CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return drv_free(dptr, hStream, false, FN(REAL(cuMemFreeAsync)));
}

/* The per-thread-default-stream variants (what cuGetProcAddress hands out under
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, and what programs built with
 * --default-stream per-thread call): stream NULL is the calling thread's own stream. */
MT_HOOK CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return drv_malloc(dptr, bytesize, pt_stream(hStream, true), REAL(cuMemAllocAsync_ptsz),
                      MT__PRELOAD_RA());
}

MT_HOOK CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return drv_free(dptr, pt_stream(hStream, true), false, FN(REAL(cuMemFreeAsync_ptsz)));
}

MT_HOOK CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    if (free_b == NULL || total_b == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = drv_device();
    if (dev < 0)
        return tls_ctx_err;
    return mt__preload_drv_code(mt__preload_op_mem_info(dev, free_b, total_b));
}

MT_HOOK CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    if (pp == NULL || bytesize == 0 || (Flags & ~MT_HOST_ALLOC_FLAGS) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    mt_backend_t *b = mt__preload_drv_backend();
    if (b == NULL)
        return mt__preload_drv_no_backend();
    return mt__preload_drv_code(mt__preload_op_host_alloc(b, bytesize, Flags, pp));
}

MT_HOOK CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return cuMemHostAlloc(pp, bytesize, 0);
}

MT_HOOK CUresult cuMemFreeHost(void *p)
{
    int rc = mt__preload_op_host_free(p);
    if (rc == MT_PRELOAD_REAL && REAL(cuMemFreeHost) != NULL)
        return REAL(cuMemFreeHost)(p); /* not ours: the driver's */
    return mt__preload_drv_code(rc == MT_PRELOAD_REAL ? MT_ENOENT : rc);
}

/* ---- initialisation, devices, contexts (sim-served) ---- */

MT_HOOK CUresult cuInit(unsigned int Flags)
{
    FORWARD(cuInit, Flags);
    return mt__preload()->init_rc == 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

MT_HOOK CUresult cuDriverGetVersion(int *driverVersion)
{
    FORWARD(cuDriverGetVersion, driverVersion);
    if (driverVersion == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = CUDA_VERSION; /* the API level the sim subset follows */
    return CUDA_SUCCESS;
}

MT_HOOK CUresult cuDeviceGetCount(int *count)
{
    FORWARD(cuDeviceGetCount, count);
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = mt__preload()->init_rc == 0 ? mt__preload()->ndevices : 0;
    return CUDA_SUCCESS;
}

MT_HOOK CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    FORWARD(cuDeviceGet, device, ordinal);
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= mt__preload()->ndevices)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

MT_HOOK CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    FORWARD(cuDevicePrimaryCtxRetain, pctx, dev);
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= mt__preload()->ndevices)
        return CUDA_ERROR_INVALID_DEVICE;
    *pctx = (CUcontext)&sim_ctx[dev];
    return CUDA_SUCCESS;
}

MT_HOOK CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    FORWARD(cuDevicePrimaryCtxRelease_v2, dev);
    return dev >= 0 && dev < mt__preload()->ndevices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

MT_HOOK CUresult cuCtxSetCurrent(CUcontext ctx)
{
    FORWARD(cuCtxSetCurrent, ctx);
    if (ctx == NULL)
        return CUDA_SUCCESS;
    const char *c = (const char *)ctx;
    if (c < sim_ctx || c >= sim_ctx + mt__preload()->ndevices)
        return CUDA_ERROR_INVALID_CONTEXT;
    mt__preload_set_current_device((int)(c - sim_ctx));
    return CUDA_SUCCESS;
}

/* The sim contexts pushed by each thread under its current one (cuCtxPushCurrent). */
#define SIM_CTX_STACK 32
static _Thread_local int tls_ctx_stack[SIM_CTX_STACK];
static _Thread_local int tls_ctx_depth;

MT_HOOK CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    FORWARD(cuCtxPushCurrent_v2, ctx);
    const char *c = (const char *)ctx;
    if (c < sim_ctx || c >= sim_ctx + mt__preload()->ndevices)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (tls_ctx_depth == SIM_CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    tls_ctx_stack[tls_ctx_depth++] = mt__preload_current_device();
    mt__preload_set_current_device((int)(c - sim_ctx));
    return CUDA_SUCCESS;
}

MT_HOOK CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    FORWARD(cuCtxPopCurrent_v2, pctx);
    if (tls_ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx != NULL)
        *pctx = (CUcontext)&sim_ctx[mt__preload_current_device()];
    mt__preload_set_current_device(tls_ctx_stack[--tls_ctx_depth]);
    return CUDA_SUCCESS;
}

/* The current context's device may use peer's memory; its expandable segments too. */
MT_HOOK CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int Flags)
{
    int pd = mt__preload_primary_device_of(peer);
    CUresult r = CUDA_SUCCESS;
    if (!mt__preload()->sim) {
        __typeof__(&cuCtxEnablePeerAccess) real = REAL(cuCtxEnablePeerAccess);
        /* Already enabled by a caller memtrace does not see (NCCL's static cudart): its
         * segments were not granted then, so they are now. */
        r = real ? real(peer, Flags) : CUDA_ERROR_NOT_FOUND;
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
            return r;
    } else if (Flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    int d = drv_device();
    if (d < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pd < 0 || pd == d) /* not a primary context: not one memtrace allocates in */
        return mt__preload()->sim ? CUDA_ERROR_INVALID_CONTEXT : r;
    CUresult g = mt__preload_drv_code(mt__preload_peer_access(d, pd));
    return g != CUDA_SUCCESS ? g : r;
}

MT_HOOK CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    FORWARD(cuCtxGetCurrent, pctx);
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)&sim_ctx[mt__preload_current_device()];
    return CUDA_SUCCESS;
}

MT_HOOK CUresult cuCtxGetDevice(CUdevice *device)
{
    FORWARD(cuCtxGetDevice, device);
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *device = mt__preload_current_device();
    return CUDA_SUCCESS;
}

MT_HOOK CUresult cuCtxSynchronize(void)
{
    FORWARD(cuCtxSynchronize);
    mt_backend_t *b = mt__preload_drv_backend();
    if (b == NULL)
        return mt__preload_drv_no_backend();
    return mt__preload_drv_code(mt__preload_op_sim(b, MT_PRELOAD_DEVICE_SYNC, NULL, NULL));
}

/* ---- errors (sim-served) ---- */

static const struct {
    CUresult code;
    const char *name;
    const char *text;
} cu_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

MT_HOOK CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    FORWARD(cuGetErrorString, error, pStr);
    for (size_t i = 0; i < sizeof cu_errors / sizeof cu_errors[0]; i++)
        if (cu_errors[i].code == error) {
            *pStr = cu_errors[i].text;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

MT_HOOK CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    FORWARD(cuGetErrorName, error, pStr);
    for (size_t i = 0; i < sizeof cu_errors / sizeof cu_errors[0]; i++)
        if (cu_errors[i].code == error) {
            *pStr = cu_errors[i].name;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- cuGetProcAddress ---- */

/* Base name (what cuGetProcAddress is asked for) -> exported name -> our function. */
#define D(base, fn, mem)                                                                           \
    {                                                                                              \
        base, #fn, (void *)fn, NULL, mem                                                           \
    }
/* With a per-thread-default-stream variant, handed out under
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM. */
#define D2(base, fn, mem)                                                                          \
    {base, #fn, (void *)fn, (void *)fn##_ptsz, mem},                                               \
    {                                                                                              \
        NULL, #fn "_ptsz", (void *)fn##_ptsz, NULL, mem                                            \
    }
static const struct {
    const char *base; /* NULL: reached only through its legacy entry's ptsz */
    const char *exported;
    void *fn;
    void *ptsz;
    bool mem; /* a memory entry point (or one memtrace must see): ours in both modes */
} drv_hooks[] = {
    D("cuMemAlloc", cuMemAlloc_v2, true),
    D("cuMemFree", cuMemFree_v2, true),
    D2("cuMemAllocAsync", cuMemAllocAsync, true),
    D2("cuMemFreeAsync", cuMemFreeAsync, true),
    D("cuMemAllocPitch", cuMemAllocPitch_v2, true),
    D("cuMemCreate", cuMemCreate, true),
    D("cuMemRelease", cuMemRelease, true),
    D2("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync, true),
    D("cuDeviceSetMemPool", cuDeviceSetMemPool, true),
    D("cuMemPoolSetAccess", cuMemPoolSetAccess, true),
    D("cuMemGetAddressRange", cuMemGetAddressRange_v2, true),
    D("cuPointerGetAttribute", cuPointerGetAttribute, true),
    D("cuIpcGetMemHandle", cuIpcGetMemHandle, true),
    D("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2, true),
    D("cuCtxDestroy", cuCtxDestroy_v2, true),
    D("cuGraphDestroy", cuGraphDestroy, true),
    /* Watched so that captures begun by a runtime that fetches the driver this way (a
     * static libcudart) get their private pool too (hooks_graph.c). */
    D2("cuStreamBeginCapture", cuStreamBeginCapture_v2, true),
    D2("cuStreamEndCapture", cuStreamEndCapture, true),
    D2("cuStreamBeginCaptureToGraph", cuStreamBeginCaptureToGraph, true),
    D("cuGraphInstantiate", cuGraphInstantiateWithFlags, true), /* 12.0+: see get_proc */
    D("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags, true),
    D2("cuGraphInstantiateWithParams", cuGraphInstantiateWithParams, true),
    D("cuGraphExecDestroy", cuGraphExecDestroy, true),
    D("cuMemGetInfo", cuMemGetInfo_v2, true),
    D("cuMemAllocHost", cuMemAllocHost_v2, true),
    D("cuMemHostAlloc", cuMemHostAlloc, true),
    D("cuMemFreeHost", cuMemFreeHost, true),
    D("cuGetProcAddress", cuGetProcAddress_v2, true), /* v1 is picked by version below */
    D("cuInit", cuInit, false),
    D("cuDriverGetVersion", cuDriverGetVersion, false),
    D("cuDeviceGetCount", cuDeviceGetCount, false),
    D("cuDeviceGet", cuDeviceGet, false),
    D("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain, false),
    D("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, false),
    D("cuCtxSetCurrent", cuCtxSetCurrent, false),
    D("cuCtxPushCurrent", cuCtxPushCurrent_v2, false),
    D("cuCtxPopCurrent", cuCtxPopCurrent_v2, false),
    D("cuCtxEnablePeerAccess", cuCtxEnablePeerAccess, false),
    D("cuCtxGetCurrent", cuCtxGetCurrent, false),
    D("cuCtxGetDevice", cuCtxGetDevice, false),
    D("cuCtxSynchronize", cuCtxSynchronize, false),
    D("cuMemcpyHtoD", cuMemcpyHtoD_v2, false),
    D("cuMemcpyDtoH", cuMemcpyDtoH_v2, false),
    D("cuMemcpyDtoD", cuMemcpyDtoD_v2, false),
    D("cuMemcpy", cuMemcpy, false),
    D("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2, false),
    D("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2, false),
    D("cuMemcpyAsync", cuMemcpyAsync, false),
    D("cuMemsetD8", cuMemsetD8_v2, false),
    D("cuMemsetD8Async", cuMemsetD8Async, false),
    D("cuStreamCreate", cuStreamCreate, false),
    D("cuStreamDestroy", cuStreamDestroy_v2, false),
    D("cuStreamSynchronize", cuStreamSynchronize, false),
    D("cuEventCreate", cuEventCreate, false),
    D("cuEventRecord", cuEventRecord, false),
    D("cuEventQuery", cuEventQuery, false),
    D("cuEventSynchronize", cuEventSynchronize, false),
    D("cuEventDestroy", cuEventDestroy_v2, false),
    D("cuGetErrorString", cuGetErrorString, false),
    D("cuGetErrorName", cuGetErrorName, false),
};

void *mt__preload_driver_proc(const char *base, bool mem_only, bool per_thread)
{
    for (size_t i = 0; i < sizeof drv_hooks / sizeof drv_hooks[0]; i++)
        if (drv_hooks[i].base != NULL && strcmp(drv_hooks[i].base, base) == 0) {
            if (mem_only && !drv_hooks[i].mem)
                return NULL;
            return per_thread && drv_hooks[i].ptsz ? drv_hooks[i].ptsz : drv_hooks[i].fn;
        }
    return NULL;
}

void *mt__preload_drv_hook(const char *name, bool sim)
{
    if (strcmp(name, "cuGetProcAddress") == 0)
        return (void *)cuGetProcAddress;
    for (size_t i = 0; i < sizeof drv_hooks / sizeof drv_hooks[0]; i++)
        if (strcmp(drv_hooks[i].exported, name) == 0)
            return sim || drv_hooks[i].mem ? drv_hooks[i].fn : NULL;
    return NULL;
}

void *mt__preload_hook_by_name(const char *name)
{
    if (name[0] != 'c' || name[1] != 'u')
        return NULL;
    void *m = mt__preload_managed_hook(name); /* ours in both modes */
    if (m != NULL)
        return m;
    /* Only names we serve in some mode initialise us (the mode decides the answer). */
    if (mt__preload_rt_hook(name, true) == NULL && mt__preload_drv_hook(name, true) == NULL)
        return NULL;
    bool sim = mt__preload()->sim;
    void *f = mt__preload_rt_hook(name, sim);
    return f ? f : mt__preload_drv_hook(name, sim);
}

/* Our answer for symbol: in cuda mode the real one, replaced for memory entry points
 * (unless we are asking from inside memtrace); on sim, ours or not found. */
static CUresult get_proc(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status, bool v2)
{
    const cuuint64_t known =
        CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    if (symbol == NULL || pfn == NULL || (flags & ~known) != 0 || (flags & known) == known)
        return CUDA_ERROR_INVALID_VALUE;
    /* DEFAULT means the legacy stream to the driver: a program built for per-thread
     * streams gets the flag added by cuda.h's inline cuGetProcAddress_v2_ptsz. */
    bool pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    mt_preload_t *P = mt__preload();
    if (!P->sim) {
        void *real = mt__preload_real_drv(v2 ? "cuGetProcAddress_v2" : "cuGetProcAddress");
        if (real == NULL)
            return CUDA_ERROR_NOT_FOUND;
        CUresult r =
            v2 ? ((__typeof__(&cuGetProcAddress_v2))real)(symbol, pfn, cudaVersion, flags, status)
               : ((__typeof__(&cuGetProcAddress))real)(symbol, pfn, cudaVersion, flags);
        if (r != CUDA_SUCCESS || *pfn == NULL || mt__preload_guard > 0)
            return r;
    }
    void *ours = mt__preload_managed_proc(symbol, cudaVersion, pt);
    if (ours == NULL)
        ours = mt__preload_driver_proc(symbol, !P->sim, pt);
    if (ours == (void *)cuGetProcAddress_v2 && cudaVersion < 12000)
        ours = (void *)cuGetProcAddress;
    /* Older signatures behind the same base name are not ours to hand out. */
    if ((cudaVersion < 10010 && strcmp(symbol, "cuStreamBeginCapture") == 0) ||
        (cudaVersion < 12000 && strcmp(symbol, "cuGraphInstantiate") == 0))
        ours = NULL;
    if (ours != NULL)
        *pfn = ours;
    else if (P->sim)
        *pfn = NULL;
    if (status != NULL)
        *status = *pfn != NULL ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS; /* as documented: a missing symbol is a NULL pfn, not an error */
}

MT_HOOK CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    return get_proc(symbol, pfn, cudaVersion, flags, symbolStatus, true);
}

MT_HOOK CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return get_proc(symbol, pfn, cudaVersion, flags, NULL, false);
}
