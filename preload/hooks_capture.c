/* The runtime's and the driver's stream-capture and graph entry points, as seen by the
 * drop-in: each calls the real one, then tells the capture bookkeeping (hooks_graph.c)
 * what began, ended, was instantiated or destroyed. Only the outermost hook of a nested
 * chain does (a runtime may implement one graph call with another). */
#include <stdbool.h>

#include "backend/backend_cuda.h"
#include "preload/hooks_graph.h"
#include "preload/hooks_cuda.h"
#undef FORWARD
#include "preload/hooks_rt.h"
#undef FORWARD

/* The real runtime entry point `name`, looked up once per call site, typed. */
#define REAL_RT(name) ((__typeof__(&name))MT__PRELOAD_REAL_RT_ONCE(name))

/* Hooks under way on this thread: a runtime may implement one graph call with another
 * (its cudaGraphInstantiate calling cudaGraphInstantiateWithFlags, its capture calls the
 * driver's), which reach these hooks again; only the outermost keeps the books. */
static _Thread_local int tls_depth;

/* Calls `call` (an expression of the real entry point) as the outermost hook or a nested
 * one; *outer tells which. */
#define CALL_REAL(outer, call)                                                                     \
    ({                                                                                             \
        *(outer) = tls_depth++ == 0;                                                               \
        __typeof__(call) r_ = (call);                                                              \
        tls_depth--;                                                                               \
        r_;                                                                                        \
    })

/* ---- runtime hooks ---- */

/* The stream a _ptsz entry point means: NULL is the calling thread's per-thread stream. */
static void *ptsz_stream(void *handle)
{
    return handle == NULL ? (void *)CU_STREAM_PER_THREAD : handle;
}

/* cudaStreamBeginCapture and its _ptsz form; handle: the stream the bookkeeping names. */
typedef cudaError_t (*begin_fn)(cudaStream_t, enum cudaStreamCaptureMode);

static cudaError_t rt_begin(begin_fn real, void *handle, cudaStream_t stream,
                            enum cudaStreamCaptureMode mode)
{
    if (mt__preload()->sim)
        return mt__preload_rt_ret(cudaErrorNotSupported);
    if (real == NULL)
        return mt__preload_rt_ret(cudaErrorInsufficientDriver);
    bool outer;
    cudaError_t r = CALL_REAL(&outer, real(stream, mode));
    if (outer && r == cudaSuccess)
        mt__preload_graph_begun(handle, mt__preload_rt_device());
    return r;
}

MT_HOOK cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    return rt_begin(REAL_RT(cudaStreamBeginCapture), stream, stream, mode);
}

MT_HOOK cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                                enum cudaStreamCaptureMode mode)
{
    return rt_begin((begin_fn)REAL_RT(cudaStreamBeginCapture_ptsz), ptsz_stream(stream), stream,
                    mode);
}

/* cudaStreamEndCapture and its _ptsz form. */
typedef cudaError_t (*end_fn)(cudaStream_t, cudaGraph_t *);

static cudaError_t rt_end(end_fn real, void *handle, cudaStream_t stream, cudaGraph_t *pGraph)
{
    if (mt__preload()->sim)
        return mt__preload_rt_ret(cudaErrorNotSupported);
    if (real == NULL)
        return mt__preload_rt_ret(cudaErrorInsufficientDriver);
    bool outer;
    cudaError_t r = CALL_REAL(&outer, real(stream, pGraph));
    if (outer)
        mt__preload_graph_ended(handle,
                                r == cudaSuccess && pGraph != NULL ? (void *)*pGraph : NULL);
    return r;
}

MT_HOOK cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    return rt_end(REAL_RT(cudaStreamEndCapture), stream, stream, pGraph);
}

MT_HOOK cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph)
{
    return rt_end((end_fn)REAL_RT(cudaStreamEndCapture_ptsz), ptsz_stream(stream), stream, pGraph);
}

/* cudaStreamBeginCaptureToGraph and its _ptsz form: a capture into the program's graph,
 * ended by cudaStreamEndCapture as any. */
typedef cudaError_t (*to_graph_fn)(cudaStream_t, cudaGraph_t, const cudaGraphNode_t *,
                                   const cudaGraphEdgeData *, size_t, enum cudaStreamCaptureMode);

static cudaError_t begin_to_graph(to_graph_fn real, void *handle, cudaStream_t stream,
                                  cudaGraph_t graph, const cudaGraphNode_t *deps,
                                  const cudaGraphEdgeData *edges, size_t n,
                                  enum cudaStreamCaptureMode mode)
{
    if (mt__preload()->sim)
        return mt__preload_rt_ret(cudaErrorNotSupported);
    if (real == NULL)
        return mt__preload_rt_ret(cudaErrorInsufficientDriver);
    bool outer;
    cudaError_t r = CALL_REAL(&outer, real(stream, graph, deps, edges, n, mode));
    if (outer && r == cudaSuccess)
        mt__preload_graph_begun(handle, mt__preload_rt_device());
    return r;
}

MT_HOOK cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                                  const cudaGraphNode_t *deps,
                                                  const cudaGraphEdgeData *edges, size_t n,
                                                  enum cudaStreamCaptureMode mode)
{
    return begin_to_graph((to_graph_fn)REAL_RT(cudaStreamBeginCaptureToGraph), stream, stream,
                          graph, deps, edges, n, mode);
}

MT_HOOK cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                                       const cudaGraphNode_t *deps,
                                                       const cudaGraphEdgeData *edges, size_t n,
                                                       enum cudaStreamCaptureMode mode)
{
    return begin_to_graph((to_graph_fn)REAL_RT(cudaStreamBeginCaptureToGraph_ptsz),
                          ptsz_stream(stream), stream, graph, deps, edges, n, mode);
}

/* cudaGraphInstantiate and its WithFlags twin: the same signature and the same watch. */
typedef cudaError_t (*instantiate_fn)(cudaGraphExec_t *, cudaGraph_t, unsigned long long);

static cudaError_t instantiate(instantiate_fn real, cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                               unsigned long long flags)
{
    if (mt__preload()->sim)
        return mt__preload_rt_ret(cudaErrorNotSupported);
    if (real == NULL)
        return mt__preload_rt_ret(cudaErrorInsufficientDriver);
    bool outer;
    cudaError_t r = CALL_REAL(&outer, real(pGraphExec, graph, flags));
    if (outer && r == cudaSuccess && pGraphExec != NULL)
        mt__preload_graph_instantiated(graph, *pGraphExec);
    return r;
}

MT_HOOK cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                         unsigned long long flags)
{
    return instantiate(REAL_RT(cudaGraphInstantiate), pGraphExec, graph, flags);
}

MT_HOOK cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                  unsigned long long flags)
{
    return instantiate(REAL_RT(cudaGraphInstantiateWithFlags), pGraphExec, graph, flags);
}

typedef cudaError_t (*with_params_fn)(cudaGraphExec_t *, cudaGraph_t, cudaGraphInstantiateParams *);

static cudaError_t instantiate_params(with_params_fn real, cudaGraphExec_t *pGraphExec,
                                      cudaGraph_t graph, cudaGraphInstantiateParams *params)
{
    if (mt__preload()->sim)
        return mt__preload_rt_ret(cudaErrorNotSupported);
    if (real == NULL)
        return mt__preload_rt_ret(cudaErrorInsufficientDriver);
    bool outer;
    cudaError_t r = CALL_REAL(&outer, real(pGraphExec, graph, params));
    if (outer && r == cudaSuccess && pGraphExec != NULL)
        mt__preload_graph_instantiated(graph, *pGraphExec);
    return r;
}

MT_HOOK cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                   cudaGraphInstantiateParams *params)
{
    return instantiate_params((with_params_fn)REAL_RT(cudaGraphInstantiateWithParams), pGraphExec,
                              graph, params);
}

MT_HOOK cudaError_t cudaGraphInstantiateWithParams_ptsz(cudaGraphExec_t *pGraphExec,
                                                        cudaGraph_t graph,
                                                        cudaGraphInstantiateParams *params)
{
    return instantiate_params((with_params_fn)REAL_RT(cudaGraphInstantiateWithParams_ptsz),
                              pGraphExec, graph, params);
}

MT_HOOK cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
    if (mt__preload()->sim)
        return mt__preload_rt_ret(cudaErrorNotSupported);
    cudaError_t (*real)(cudaGraphExec_t) = REAL_RT(cudaGraphExecDestroy);
    if (real == NULL)
        return mt__preload_rt_ret(cudaErrorInsufficientDriver);
    bool outer;
    cudaError_t r = CALL_REAL(&outer, real(graphExec));
    if (outer && r == cudaSuccess)
        mt__preload_graph_exec_gone(graphExec);
    return r;
}

/* ---- driver hooks (programs that call the driver themselves) ---- */

static CUresult drv_begin(CUresult (*real)(CUstream, CUstreamCaptureMode), void *handle,
                          CUstream hStream, CUstreamCaptureMode mode)
{
    if (mt__preload()->sim)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    bool outer;
    CUresult r = CALL_REAL(&outer, real(hStream, mode));
    if (outer && r == CUDA_SUCCESS)
        mt__preload_graph_begun(handle, mt__preload_drv_device());
    return r;
}

MT_HOOK CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    return drv_begin(REAL(cuStreamBeginCapture_v2), hStream, hStream, mode);
}

MT_HOOK CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    return drv_begin(REAL(cuStreamBeginCapture_v2_ptsz), ptsz_stream(hStream), hStream, mode);
}

static CUresult drv_end(CUresult (*real)(CUstream, CUgraph *), void *handle, CUstream hStream,
                        CUgraph *phGraph)
{
    if (mt__preload()->sim)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    bool outer;
    CUresult r = CALL_REAL(&outer, real(hStream, phGraph));
    if (outer)
        mt__preload_graph_ended(handle,
                                r == CUDA_SUCCESS && phGraph != NULL ? (void *)*phGraph : NULL);
    return r;
}

MT_HOOK CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    return drv_end(REAL(cuStreamEndCapture), hStream, hStream, phGraph);
}

MT_HOOK CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    return drv_end(REAL(cuStreamEndCapture_ptsz), ptsz_stream(hStream), hStream, phGraph);
}

typedef CUresult (*drv_to_graph_fn)(CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *,
                                    size_t, CUstreamCaptureMode);

static CUresult drv_begin_to_graph(drv_to_graph_fn real, void *handle, CUstream hStream,
                                   CUgraph hGraph, const CUgraphNode *deps,
                                   const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode)
{
    if (mt__preload()->sim)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    bool outer;
    CUresult r = CALL_REAL(&outer, real(hStream, hGraph, deps, edges, n, mode));
    if (outer && r == CUDA_SUCCESS)
        mt__preload_graph_begun(handle, mt__preload_drv_device());
    return r;
}

MT_HOOK CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                             const CUgraphNode *deps, const CUgraphEdgeData *edges,
                                             size_t n, CUstreamCaptureMode mode)
{
    return drv_begin_to_graph(REAL(cuStreamBeginCaptureToGraph), hStream, hStream, hGraph, deps,
                              edges, n, mode);
}

MT_HOOK CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                  const CUgraphNode *deps,
                                                  const CUgraphEdgeData *edges, size_t n,
                                                  CUstreamCaptureMode mode)
{
    return drv_begin_to_graph(REAL(cuStreamBeginCaptureToGraph_ptsz), ptsz_stream(hStream), hStream,
                              hGraph, deps, edges, n, mode);
}

MT_HOOK CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                             unsigned long long flags)
{
    if (mt__preload()->sim)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult (*real)(CUgraphExec *, CUgraph, unsigned long long) =
        REAL(cuGraphInstantiateWithFlags);
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    bool outer;
    CUresult r = CALL_REAL(&outer, real(phGraphExec, hGraph, flags));
    if (outer && r == CUDA_SUCCESS && phGraphExec != NULL)
        mt__preload_graph_instantiated(hGraph, *phGraphExec);
    return r;
}

static CUresult
drv_with_params(CUresult (*real)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *),
                CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    if (mt__preload()->sim)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    bool outer;
    CUresult r = CALL_REAL(&outer, real(phGraphExec, hGraph, params));
    if (outer && r == CUDA_SUCCESS && phGraphExec != NULL)
        mt__preload_graph_instantiated(hGraph, *phGraphExec);
    return r;
}

MT_HOOK CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                              CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    return drv_with_params(REAL(cuGraphInstantiateWithParams), phGraphExec, hGraph, params);
}

MT_HOOK CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                   CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    return drv_with_params(REAL(cuGraphInstantiateWithParams_ptsz), phGraphExec, hGraph, params);
}

MT_HOOK CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    if (mt__preload()->sim)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult (*real)(CUgraphExec) = REAL(cuGraphExecDestroy);
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    bool outer;
    CUresult r = CALL_REAL(&outer, real(hGraphExec));
    if (outer && r == CUDA_SUCCESS)
        mt__preload_graph_exec_gone(hGraphExec);
    return r;
}
