/* Shared by the driver hooks (hooks_driver.c: the memory, device and context entry
 * points and the lookup tables; hooks_driver_sim.c: the sim-served copies, memsets,
 * streams and events; hooks_watch.c: the entry points memtrace watches and forwards). */
#ifndef MT_PRELOAD_HOOKS_CUDA_H
#define MT_PRELOAD_HOOKS_CUDA_H

#include <cuda.h>

#include "preload/preload.h"

/* cuda.h maps cuGetProcAddress to _v2; the runtime also asks for the 11.x version by
 * its own name, so both are defined. */
#undef cuGetProcAddress
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
/* The unversioned reset (old binaries) and the per-thread variants, which cuda.h
 * declares only to programs built for per-thread default streams. */
#undef cuDevicePrimaryCtxReset
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream);
/* Capture and graph hooks (hooks_graph.c), per-thread forms. */
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph, const CUgraphNode *deps,
                                          const CUgraphEdgeData *edges, size_t n,
                                          CUstreamCaptureMode mode);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *params);

/* In cuda mode, the sim-served calls go to the real driver (see hooks_rt.h). */
#define FORWARD(name, ...)                                                                         \
    MT_PRELOAD_FORWARD(mt__preload_real_drv, CUDA_ERROR_NOT_FOUND, name, __VA_ARGS__)

/* The real entry point `name` of the driver (cuda mode), looked up once per call site. */
#define REAL(name)                                                                                 \
    ({                                                                                             \
        static _Atomic(void *) r_;                                                                 \
        void *f_ = atomic_load_explicit(&r_, memory_order_relaxed);                                \
        if (f_ == NULL) {                                                                          \
            f_ = mt__preload_real_drv(#name);                                                      \
            atomic_store_explicit(&r_, f_, memory_order_relaxed);                                  \
        }                                                                                          \
        (__typeof__(&name))f_;                                                                     \
    })

/* The driver's code for rc (0 or MT_E*), the driver's own failure first when known
 * (hooks_driver.c, as the two below). */
CUresult mt__preload_drv_code(int rc);
/* The backend of the device of the calling thread's current context, or NULL. */
mt_backend_t *mt__preload_drv_backend(void);
/* The device of the calling thread's current context, or -1 (none current, cuda mode). */
int mt__preload_drv_device(void);
/* The error of a hook that found no backend: no current context, or no device. */
CUresult mt__preload_drv_no_backend(void);
/* The device whose sim primary-context handle ctx is, or -1 (hooks_driver.c). */
int mt__preload_sim_ctx_device(const void *ctx);
/* The device whose primary context ctx is (either mode), or -1: another context, or none
 * (hooks_watch.c). */
int mt__preload_primary_device_of(CUcontext ctx);

#endif
