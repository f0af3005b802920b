/* Shared by the runtime hooks (hooks_runtime.c: memory entry points, devices, errors, the
 * dlsym table; hooks_runtime_sim.c: copies, memsets, streams and events served on sim).
 * Kept apart from preload.h, which stays free of the CUDA headers. */
#ifndef MT_PRELOAD_HOOKS_RT_H
#define MT_PRELOAD_HOOKS_RT_H

#include <cuda_runtime_api.h>

#include "preload/preload.h"

/* Records err as the calling thread's last error when it is one (cudaErrorNotReady is a
 * status) and returns it. */
cudaError_t mt__preload_rt_ret(cudaError_t err);
/* The runtime's code for rc (0 or MT_E*), the driver's own failure first when known. */
cudaError_t mt__preload_rt_code(int rc);
/* The runtime's current device of the calling thread. */
int mt__preload_rt_device(void);
/* The backend of the runtime's current device, or NULL if it cannot be served. */
mt_backend_t *mt__preload_rt_backend(void);

/* Capture and graph hooks (hooks_graph.c), per-thread forms, which cuda_runtime_api.h
 * declares only to programs built for per-thread default streams. */
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph);
cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                               const cudaGraphNode_t *deps,
                                               const cudaGraphEdgeData *edges, size_t n,
                                               enum cudaStreamCaptureMode mode);
cudaError_t cudaGraphInstantiateWithParams_ptsz(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                cudaGraphInstantiateParams *params);

/* In cuda mode, every call but the memory ones goes to the real runtime. */
#define FORWARD(name, ...)                                                                         \
    MT_PRELOAD_FORWARD(mt__preload_real_rt, mt__preload_rt_ret(cudaErrorInsufficientDriver), name, \
                       __VA_ARGS__)

#endif
