/* The fake driver's graphs beyond stream capture itself (fake_libcuda_more.c): empty graphs
 * made by cuGraphCreate and captured into with cuStreamBeginCaptureToGraph, executable
 * graphs, and the calling thread's capture interaction mode. An executable graph holds no
 * work: nothing is ever replayed, tests write what a replay would write themselves. */
#include <pthread.h>
#include <stdlib.h>

#include <cuda.h>

#include "fake_internal.h"

/* An executable graph: independent of its graph once made, as the driver's. */
typedef struct fake_exec_s {
    size_t nodes;
} fake_exec_t;

FAKE_API CUresult cuGraphCreate(CUgraph *g, unsigned int flags)
{
    ENTER("cuGraphCreate", flags, 0);
    if (g == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fake_graph_t *fg = calloc(1, sizeof *fg);
    if (fg == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fg->created = true;
    *g = (CUgraph)fg;
    return CUDA_SUCCESS;
}

/* Dependencies are accepted and ignored: the fake's graphs have no edges. */
FAKE_API CUresult cuStreamBeginCaptureToGraph(CUstream h, CUgraph g, const CUgraphNode *deps,
                                              const CUgraphEdgeData *edges, size_t n,
                                              CUstreamCaptureMode mode)
{
    (void)deps;
    (void)edges;
    (void)n;
    ENTER_CTX("cuStreamBeginCaptureToGraph", (uintptr_t)h, (uintptr_t)g);
    if (g == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return capture_begin(h, mode, (fake_graph_t *)g);
}

FAKE_API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream h, CUgraph g, const CUgraphNode *deps,
                                                   const CUgraphEdgeData *edges, size_t n,
                                                   CUstreamCaptureMode mode)
{
    (void)deps;
    (void)edges;
    (void)n;
    ENTER_CTX("cuStreamBeginCaptureToGraph", (uintptr_t)h, (uintptr_t)g);
    if (g == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return capture_begin(h == NULL ? CU_STREAM_PER_THREAD : h, mode, (fake_graph_t *)g);
}

static CUresult instantiate(CUgraphExec *e, CUgraph g)
{
    if (e == NULL || g == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fake_exec_t *x = calloc(1, sizeof *x);
    if (x == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    x->nodes = ((fake_graph_t *)g)->nodes;
    *e = (CUgraphExec)(void *)x;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
    ENTER_CTX("cuGraphInstantiateWithFlags", (uintptr_t)g, flags);
    return instantiate(e, g);
}

static CUresult with_params(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    if (params == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = instantiate(e, g);
    params->hErrNode_out = NULL;
    params->result_out =
        r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    return r;
}

FAKE_API CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g,
                                               CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    ENTER_CTX("cuGraphInstantiateWithParams", (uintptr_t)g, 0);
    return with_params(e, g, params);
}

FAKE_API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g,
                                                    CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    ENTER_CTX("cuGraphInstantiateWithParams", (uintptr_t)g, 0);
    return with_params(e, g, params);
}

FAKE_API CUresult cuGraphExecDestroy(CUgraphExec e)
{
    ENTER("cuGraphExecDestroy", (uintptr_t)e, 0);
    if (e == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    free((void *)e);
    return CUDA_SUCCESS;
}

/* Swaps the calling thread's mode with *mode (capture_forbids reads it). */
FAKE_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    ENTER("cuThreadExchangeStreamCaptureMode", mode ? *mode : 0, 0);
    if (mode == NULL ||
        (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
         *mode != CU_STREAM_CAPTURE_MODE_RELAXED))
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = tls_capture_mode;
    tls_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}
