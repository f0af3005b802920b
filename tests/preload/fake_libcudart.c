/* A fake CUDA runtime over the (fake) driver, for the drop-in's cuda-mode tests: the few
 * runtime calls those tests make, with the real runtime's behaviour where the drop-in
 * depends on it.
 * - It reaches the driver as libcudart does (shared or static): dlopen of the driver
 *   (MEMTRACE_LIBCUDA, else libcuda.so.1), dlsym "cuGetProcAddress_v2", then every entry
 *   point by base name; the _ptsz entry points ask with
 *   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM. Its own allocation calls therefore
 *   model a static libcudart, whose cudaMalloc no LD_PRELOAD can interpose.
 * - The current device is per thread; the first call needing a context uses the
 *   context current on the calling thread, or makes the device's primary context
 *   current there.
 * - Last error: each failing call records its code for the calling thread;
 *   cudaGetLastError returns the latest and resets it, cudaPeekAtLastError leaves it;
 *   a sticky error (illegal address, launch failure, ...) is never reset, and every call
 *   returns it, until cudaDeviceReset.
 * - cudaDeviceReset resets the current device's primary context.
 * - cudaMemcpy: host to host, host to device and device to host; an unknown kind is
 *   cudaErrorInvalidMemcpyDirection, recorded as the thread's last error.
 * - dlsym: glibc's, counted (fakert_dlsym_count). It is exported under glibc's version
 *   node (fake_libcudart.map) and this library comes before libc, so the drop-in's own
 *   lookups of the real runtime, which go through glibc's dlsym, are counted too. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#define RT_API __attribute__((visibility("default")))

/* Declared by cuda_runtime_api.h only to programs built for per-thread default streams. */
RT_API cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s);
RT_API cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s);
RT_API cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t s, enum cudaStreamCaptureStatus *st);
RT_API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, enum cudaStreamCaptureMode mode);
RT_API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *g);
RT_API cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t s, cudaGraph_t g,
                                                      const cudaGraphNode_t *deps,
                                                      const cudaGraphEdgeData *edges, size_t n,
                                                      enum cudaStreamCaptureMode mode);
RT_API cudaError_t cudaGraphInstantiateWithParams_ptsz(cudaGraphExec_t *e, cudaGraph_t g,
                                                       cudaGraphInstantiateParams *params);
/* The runtime's own cudaMalloc/cudaFree as a static libcudart runs them: no LD_PRELOAD
 * can interpose them, so they reach memtrace only through the driver. */
RT_API cudaError_t fakert_static_malloc(void **p, size_t n);
RT_API cudaError_t fakert_static_free(void *p);
/* A runtime entry point the drop-in does not hook (cudaMalloc3D, an array, ...) reaching a
 * driver allocation it forwards: the driver hook sees the runtime as its caller. */
RT_API cudaError_t fakert_static_malloc_pitch(void **p, size_t *pitch, size_t width, size_t height);
RT_API size_t fakert_dlsym_count(void);
RT_API void *dlsym(void *handle, const char *name);

typedef CUresult (*getproc_t)(const char *, void **, int, cuuint64_t,
                              CUdriverProcAddressQueryResult *);

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*PrimaryCtxReset)(CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxEnablePeerAccess)(CUcontext, unsigned);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned);
    CUresult (*MemPrefetch)(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream);
    CUresult (*MemAdvise)(CUdeviceptr, size_t, CUmem_advise, CUmemLocation);
    CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*MemAllocAsync[2])(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemFreeAsync[2])(CUdeviceptr, CUstream);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize[2])(CUstream);
    CUresult (*BeginCapture[2])(CUstream, CUstreamCaptureMode);
    CUresult (*EndCapture[2])(CUstream, CUgraph *);
    CUresult (*IsCapturing[2])(CUstream, CUstreamCaptureStatus *);
    CUresult (*GraphDestroy)(CUgraph);
    CUresult (*GraphCreate)(CUgraph *, unsigned);                              /* optional */
    CUresult (*BeginCaptureToGraph[2])(CUstream, CUgraph, const CUgraphNode *, /* optional */
                                       const CUgraphEdgeData *, size_t, CUstreamCaptureMode);
    CUresult (*ThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *); /* optional */
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);          /* optional */
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);                /* optional */
} drv;

static _Atomic size_t dlsym_calls;

void *dlsym(void *handle, const char *name)
{
    static void *(*_Atomic real)(void *, const char *);
    void *(*f)(void *, const char *) = real;
    if (f == NULL) {
        *(void **)&f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (f == NULL)
            *(void **)&f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        real = f;
    }
    dlsym_calls++;
    if (handle == RTLD_NEXT) {
        /* glibc takes "next" from the caller's object, which is now this one (unless the
         * compiler made a tail call): search from here, as the drop-in's callers mean
         * (only this library sits between the drop-in and the rest). A handle search
         * covers the object and then its dependencies. */
        static void *_Atomic self;
        void *h = self;
        if (h == NULL) {
            Dl_info info;
            if (dladdr((void *)&fakert_dlsym_count, &info) != 0 && info.dli_fname != NULL)
                h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
            self = h;
        }
        if (h != NULL)
            handle = h;
    }
    return f(handle, name);
}

size_t fakert_dlsym_count(void)
{
    return dlsym_calls;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool loaded;
static _Atomic cudaError_t sticky; /* the context's sticky error, until a reset */
static _Thread_local int tls_dev;
static _Thread_local bool tls_bound; /* the device's primary context is current here */
static _Thread_local cudaError_t tls_err;

static void *proc(getproc_t gp, const char *name, bool pt)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    cuuint64_t flags =
        pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    if (gp(name, &fn, CUDA_VERSION, flags, &st) != CUDA_SUCCESS)
        return NULL;
    return fn;
}

static void load(void)
{
    const char *path = getenv("MEMTRACE_LIBCUDA");
    void *h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    getproc_t gp = h ? (getproc_t)dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (gp == NULL)
        return;
#define GET(field, name) *(void **)&drv.field = proc(gp, name, false)
#define GET2(field, name)                                                                          \
    do {                                                                                           \
        *(void **)&drv.field[0] = proc(gp, name, false);                                           \
        *(void **)&drv.field[1] = proc(gp, name, true);                                            \
    } while (0)
    GET(Init, "cuInit");
    GET(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    GET(PrimaryCtxReset, "cuDevicePrimaryCtxReset");
    GET(CtxSetCurrent, "cuCtxSetCurrent");
    GET(CtxGetCurrent, "cuCtxGetCurrent");
    GET(CtxEnablePeerAccess, "cuCtxEnablePeerAccess");
    GET(CtxSynchronize, "cuCtxSynchronize");
    GET(MemAlloc, "cuMemAlloc");
    GET(MemFree, "cuMemFree");
    GET(MemAllocManaged, "cuMemAllocManaged");
    GET(MemPrefetch, "cuMemPrefetchAsync"); /* the location forms: CUDA_VERSION >= 12.2 */
    GET(MemAdvise, "cuMemAdvise");
    GET(MemAllocPitch, "cuMemAllocPitch");
    GET2(MemAllocAsync, "cuMemAllocAsync");
    GET2(MemFreeAsync, "cuMemFreeAsync");
    GET(StreamCreate, "cuStreamCreate");
    GET(StreamDestroy, "cuStreamDestroy");
    GET2(StreamSynchronize, "cuStreamSynchronize");
    GET2(BeginCapture, "cuStreamBeginCapture");
    GET2(EndCapture, "cuStreamEndCapture");
    GET2(IsCapturing, "cuStreamIsCapturing");
    GET(GraphDestroy, "cuGraphDestroy");
    GET(GraphCreate, "cuGraphCreate");
    GET2(BeginCaptureToGraph, "cuStreamBeginCaptureToGraph");
    GET(ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
    GET(MemcpyHtoD, "cuMemcpyHtoD");
    GET(MemcpyDtoH, "cuMemcpyDtoH");
    loaded = drv.Init && drv.PrimaryCtxRetain && drv.PrimaryCtxReset && drv.CtxSetCurrent &&
             drv.MemAlloc && drv.MemFree && drv.MemAllocAsync[1] && drv.MemFreeAsync[1] &&
             drv.StreamCreate && drv.BeginCapture[1] && drv.EndCapture[1] && drv.IsCapturing[1] &&
             drv.GraphDestroy && drv.MemAllocManaged && drv.MemAllocPitch &&
             drv.StreamSynchronize[1] && drv.StreamDestroy && drv.CtxSynchronize &&
             drv.Init(0) == CUDA_SUCCESS;
}

static bool is_sticky(cudaError_t e)
{
    return e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure ||
           e == cudaErrorHardwareStackError || e == cudaErrorIllegalInstruction ||
           e == cudaErrorMisalignedAddress || e == cudaErrorInvalidPc;
}

static cudaError_t from_cu(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS:
        return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE:
        return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY:
        return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED:
        return cudaErrorInitializationError;
    case CUDA_ERROR_INVALID_CONTEXT:
        return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_INVALID_HANDLE:
        return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_READY:
        return cudaErrorNotReady;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
        return cudaErrorIllegalAddress;
    case CUDA_ERROR_LAUNCH_FAILED:
        return cudaErrorLaunchFailure;
    case CUDA_ERROR_ILLEGAL_STATE:
        return cudaErrorIllegalState;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
        return cudaErrorStreamCaptureUnsupported;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
        return cudaErrorStreamCaptureInvalidated;
    case CUDA_ERROR_CAPTURED_EVENT:
        return cudaErrorCapturedEvent;
    case CUDA_ERROR_NOT_SUPPORTED:
        return cudaErrorNotSupported;
    case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
        return cudaErrorPeerAccessAlreadyEnabled;
    default:
        return cudaErrorUnknown;
    }
}

static cudaError_t ret(cudaError_t e)
{
    if (is_sticky(e))
        sticky = e;
    if (e != cudaSuccess && e != cudaErrorNotReady)
        tls_err = e;
    return e;
}

/* The driver loaded and the current device's primary context current on this thread. */
static cudaError_t ready(void)
{
    pthread_once(&once, load);
    if (!loaded)
        return cudaErrorInsufficientDriver;
    if (sticky != cudaSuccess)
        return sticky;
    if (!tls_bound) {
        CUcontext c = NULL;
        /* A context the program made current (cuCtxCreate's, say) is the one used. */
        if (drv.CtxGetCurrent != NULL && drv.CtxGetCurrent(&c) == CUDA_SUCCESS && c != NULL)
            return cudaSuccess;
        CUresult r = drv.PrimaryCtxRetain(&c, tls_dev);
        if (r == CUDA_SUCCESS)
            r = drv.CtxSetCurrent(c);
        if (r != CUDA_SUCCESS)
            return from_cu(r);
        tls_bound = true;
    }
    return cudaSuccess;
}

#define READY()                                                                                    \
    do {                                                                                           \
        cudaError_t e_ = ready();                                                                  \
        if (e_ != cudaSuccess)                                                                     \
            return ret(e_);                                                                        \
    } while (0)

#define DP(p) ((CUdeviceptr)(uintptr_t)(p))

RT_API cudaError_t cudaGetDevice(int *d)
{
    *d = tls_dev;
    return cudaSuccess;
}

/* As CUDA 12's: a change of device makes that device's primary context current at once,
 * whatever context was current before. */
RT_API cudaError_t cudaSetDevice(int d)
{
    if (d < 0)
        return ret(cudaErrorInvalidDevice);
    if (d == tls_dev)
        return cudaSuccess;
    tls_bound = false;
    tls_dev = d;
    pthread_once(&once, load);
    CUcontext c = NULL;
    if (loaded && drv.PrimaryCtxRetain(&c, d) == CUDA_SUCCESS &&
        drv.CtxSetCurrent(c) == CUDA_SUCCESS)
        tls_bound = true;
    return cudaSuccess;
}

RT_API cudaError_t cudaGetLastError(void)
{
    cudaError_t e = sticky != cudaSuccess ? sticky : tls_err;
    if (sticky == cudaSuccess)
        tls_err = cudaSuccess;
    return e;
}

RT_API cudaError_t cudaPeekAtLastError(void)
{
    return sticky != cudaSuccess ? sticky : tls_err;
}

RT_API cudaError_t cudaDeviceReset(void)
{
    pthread_once(&once, load);
    if (!loaded)
        return ret(cudaErrorInsufficientDriver);
    cudaError_t e = from_cu(drv.PrimaryCtxReset(tls_dev));
    if (e == cudaSuccess) {
        sticky = cudaSuccess;
        tls_err = cudaSuccess;
        tls_bound = false;
    }
    return ret(e);
}

RT_API cudaError_t cudaDeviceSynchronize(void)
{
    READY();
    return ret(from_cu(drv.CtxSynchronize()));
}

static cudaError_t rt_malloc(void **p, size_t n)
{
    READY();
    if (n == 0) {
        *p = NULL;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    cudaError_t e = from_cu(drv.MemAlloc(&d, n));
    *p = (void *)(uintptr_t)d;
    return ret(e);
}

static cudaError_t rt_free(void *p)
{
    READY();
    return p == NULL ? cudaSuccess : ret(from_cu(drv.MemFree(DP(p))));
}

RT_API cudaError_t cudaMalloc(void **p, size_t n)
{
    return rt_malloc(p, n);
}

RT_API cudaError_t cudaFree(void *p)
{
    return rt_free(p);
}

cudaError_t fakert_static_malloc(void **p, size_t n)
{
    return rt_malloc(p, n);
}

cudaError_t fakert_static_free(void *p)
{
    return rt_free(p);
}

cudaError_t fakert_static_malloc_pitch(void **p, size_t *pitch, size_t width, size_t height)
{
    READY();
    CUdeviceptr d = 0;
    cudaError_t e = from_cu(drv.MemAllocPitch(&d, pitch, width, height, 16));
    *p = (void *)(uintptr_t)d;
    return ret(e);
}

RT_API cudaError_t cudaMallocManaged(void **p, size_t n, unsigned flags)
{
    READY();
    CUdeviceptr d = 0;
    cudaError_t e = from_cu(drv.MemAllocManaged(&d, n, flags));
    *p = (void *)(uintptr_t)d;
    return ret(e);
}

/* $FAKERT_VERSION (default 13000): a CUDA 12 runtime's number makes the drop-in take
 * the unsuffixed prefetch and advice in their old device-ordinal forms. */
RT_API cudaError_t cudaRuntimeGetVersion(int *v)
{
    const char *e = getenv("FAKERT_VERSION");
    *v = e != NULL ? atoi(e) : 13000;
    return cudaSuccess;
}

/* As the runtime does: the driver's location forms, fetched by cuGetProcAddress. */
RT_API cudaError_t cudaMemPrefetchAsync(const void *p, size_t n, struct cudaMemLocation loc,
                                        unsigned flags, cudaStream_t s)
{
    READY();
    if (drv.MemPrefetch == NULL)
        return ret(cudaErrorNotSupported);
    CUmemLocation l = {.type = (CUmemLocationType)loc.type, .id = loc.id};
    return ret(from_cu(drv.MemPrefetch((CUdeviceptr)(uintptr_t)p, n, l, flags, (CUstream)s)));
}

RT_API cudaError_t cudaMemAdvise(const void *p, size_t n, enum cudaMemoryAdvise advice,
                                 struct cudaMemLocation loc)
{
    READY();
    if (drv.MemAdvise == NULL)
        return ret(cudaErrorNotSupported);
    CUmemLocation l = {.type = (CUmemLocationType)loc.type, .id = loc.id};
    return ret(from_cu(drv.MemAdvise((CUdeviceptr)(uintptr_t)p, n, (CUmem_advise)advice, l)));
}

RT_API cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height)
{
    READY();
    CUdeviceptr d = 0;
    cudaError_t e = from_cu(drv.MemAllocPitch(&d, pitch, width, height, 16));
    *p = (void *)(uintptr_t)d;
    return ret(e);
}

static cudaError_t malloc_async(void **p, size_t n, cudaStream_t s, int pt)
{
    READY();
    CUdeviceptr d = 0;
    cudaError_t e = from_cu(drv.MemAllocAsync[pt](&d, n, (CUstream)s));
    *p = (void *)(uintptr_t)d;
    return ret(e);
}

static cudaError_t free_async(void *p, cudaStream_t s, int pt)
{
    READY();
    return ret(from_cu(drv.MemFreeAsync[pt](DP(p), (CUstream)s)));
}

RT_API cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s)
{
    return malloc_async(p, n, s, 0);
}
RT_API cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s)
{
    return malloc_async(p, n, s, 1);
}
RT_API cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    return free_async(p, s, 0);
}
RT_API cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s)
{
    return free_async(p, s, 1);
}

/* Through the driver, as the runtime: the current device's context may access the peer's
 * cuMemAlloc memory; a second call answers cudaErrorPeerAccessAlreadyEnabled. */
RT_API cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags)
{
    READY();
    CUcontext c = NULL;
    if (drv.CtxEnablePeerAccess == NULL)
        return ret(cudaErrorNotSupported);
    CUresult r = drv.PrimaryCtxRetain(&c, peer);
    if (r == CUDA_SUCCESS)
        r = drv.CtxEnablePeerAccess(c, flags);
    return ret(from_cu(r));
}

RT_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    READY();
    return ret(from_cu(drv.StreamCreate((CUstream *)s, flags)));
}

RT_API cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    READY();
    return ret(from_cu(drv.StreamDestroy((CUstream)s)));
}

RT_API cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    READY();
    return ret(from_cu(drv.StreamSynchronize[0]((CUstream)s)));
}

RT_API cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    READY();
    return ret(from_cu(drv.BeginCapture[0]((CUstream)s, (CUstreamCaptureMode)mode)));
}

RT_API cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    READY();
    return ret(from_cu(drv.EndCapture[0]((CUstream)s, (CUgraph *)g)));
}

/* The _ptsz forms: stream 0 is the calling thread's per-thread stream. */
RT_API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    READY();
    return ret(from_cu(drv.BeginCapture[1]((CUstream)s, (CUstreamCaptureMode)mode)));
}

RT_API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *g)
{
    READY();
    return ret(from_cu(drv.EndCapture[1]((CUstream)s, (CUgraph *)g)));
}

RT_API cudaError_t cudaGraphCreate(cudaGraph_t *g, unsigned flags)
{
    READY();
    if (drv.GraphCreate == NULL)
        return ret(cudaErrorNotSupported);
    return ret(from_cu(drv.GraphCreate((CUgraph *)g, flags)));
}

static cudaError_t begin_to_graph(cudaStream_t s, cudaGraph_t g, const cudaGraphNode_t *deps,
                                  const cudaGraphEdgeData *edges, size_t n,
                                  enum cudaStreamCaptureMode mode, int pt)
{
    READY();
    if (drv.BeginCaptureToGraph[pt] == NULL)
        return ret(cudaErrorNotSupported);
    return ret(from_cu(
        drv.BeginCaptureToGraph[pt]((CUstream)s, (CUgraph)g, (const CUgraphNode *)deps,
                                    (const CUgraphEdgeData *)edges, n, (CUstreamCaptureMode)mode)));
}

RT_API cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t s, cudaGraph_t g,
                                                 const cudaGraphNode_t *deps,
                                                 const cudaGraphEdgeData *edges, size_t n,
                                                 enum cudaStreamCaptureMode mode)
{
    return begin_to_graph(s, g, deps, edges, n, mode, 0);
}

RT_API cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t s, cudaGraph_t g,
                                                      const cudaGraphNode_t *deps,
                                                      const cudaGraphEdgeData *edges, size_t n,
                                                      enum cudaStreamCaptureMode mode)
{
    return begin_to_graph(s, g, deps, edges, n, mode, 1);
}

RT_API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    READY();
    if (drv.ThreadExchangeStreamCaptureMode == NULL)
        return ret(cudaErrorNotSupported);
    return ret(from_cu(drv.ThreadExchangeStreamCaptureMode((CUstreamCaptureMode *)mode)));
}

RT_API cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st)
{
    READY();
    return ret(from_cu(drv.IsCapturing[0]((CUstream)s, (CUstreamCaptureStatus *)st)));
}

RT_API cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t s, enum cudaStreamCaptureStatus *st)
{
    READY();
    return ret(from_cu(drv.IsCapturing[1]((CUstream)s, (CUstreamCaptureStatus *)st)));
}

RT_API cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    READY();
    return ret(from_cu(drv.GraphDestroy((CUgraph)g)));
}

RT_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    READY();
    switch (kind) {
    case cudaMemcpyHostToHost:
        memmove(dst, src, n);
        return cudaSuccess;
    case cudaMemcpyHostToDevice:
        return ret(drv.MemcpyHtoD ? from_cu(drv.MemcpyHtoD(DP(dst), src, n))
                                  : cudaErrorNotSupported);
    case cudaMemcpyDeviceToHost:
        return ret(drv.MemcpyDtoH ? from_cu(drv.MemcpyDtoH(dst, DP(src), n))
                                  : cudaErrorNotSupported);
    case cudaMemcpyDeviceToDevice:
    case cudaMemcpyDefault:
        return ret(cudaErrorNotSupported); /* not needed by the tests */
    default:
        return ret(cudaErrorInvalidMemcpyDirection);
    }
}

/* ---- executable graphs (hooks_graph.c's pools live as long as these) ----
 * An exec is independent of its graph, as the runtime's: PyTorch destroys the graph right
 * after instantiating it and replays the exec. The fake's execs record no work. */
typedef struct fakert_exec_s {
    cudaGraph_t graph; /* the graph it was made from; not used after */
} fakert_exec_t;

RT_API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *e, cudaGraph_t g,
                                                 unsigned long long flags)
{
    (void)flags;
    READY();
    if (e == NULL || g == NULL)
        return ret(cudaErrorInvalidValue);
    fakert_exec_t *x = calloc(1, sizeof *x);
    if (x == NULL)
        return ret(cudaErrorMemoryAllocation);
    x->graph = g;
    *e = (cudaGraphExec_t)(void *)x;
    return cudaSuccess;
}

RT_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags)
{
    return cudaGraphInstantiateWithFlags(e, g, flags);
}

RT_API cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t *e, cudaGraph_t g,
                                                  cudaGraphInstantiateParams *params)
{
    if (params == NULL)
        return ret(cudaErrorInvalidValue);
    cudaError_t r = cudaGraphInstantiateWithFlags(e, g, params->flags);
    params->errNode_out = NULL;
    params->result_out = r == cudaSuccess ? cudaGraphInstantiateSuccess : cudaGraphInstantiateError;
    return r;
}

RT_API cudaError_t cudaGraphInstantiateWithParams_ptsz(cudaGraphExec_t *e, cudaGraph_t g,
                                                       cudaGraphInstantiateParams *params)
{
    return cudaGraphInstantiateWithParams(e, g, params);
}

RT_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    READY();
    if (e == NULL)
        return ret(cudaErrorInvalidValue);
    free((void *)e);
    return cudaSuccess;
}
