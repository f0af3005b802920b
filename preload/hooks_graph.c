/* Stream capture and graphs (cuda mode): each capture's allocations come from a private
 * pool of the device's allocator (mt_pool_*, docs/allocator-pools.md).
 *
 * A captured graph replays into the addresses its capture used, including those of blocks
 * the capture freed before it ended. So from cudaStreamBeginCapture to EndCapture the
 * capturing stream is routed to a pool made for that capture: what the capture allocates
 * through memtrace (PyTorch's pluggable allocator, memtrace_alloc) and frees goes back to
 * that pool only, never to eager requests. The pool lives as long as the graph or any
 * executable graph instantiated from it: PyTorch destroys its cudaGraph_t right after
 * instantiating and keeps only the exec. When the last of them is destroyed the pool is
 * released; while the program still holds blocks of it (a graph's static outputs) it is
 * kept, retired, and released at a later graph event once they are freed.
 *
 * Stream-ordered allocations on a capturing stream (cudaMallocAsync) still go to the
 * driver as graph allocation nodes (hooks_runtime.c); these hooks do not change them.
 * On sim there is no capture: the calls report cudaErrorNotSupported. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "preload/hooks_graph.h"
#include "util/assert.h"
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

/* ---- captures and their pools ---- */

/* One capture's pool.
 * Invariants: capturing => handle != NULL and the stream is routed to pool;
 * refs = (graph != NULL) + number of execs naming it; refs = 0 and !capturing => retired:
 * its pool is released at the next graph event that finds no block of it live. */
typedef struct capture_s {
    struct capture_s *next;
    mt_alloc_t *alloc;   /* borrowed: the device's allocator (forgotten when it goes) */
    mt_stream_t *stream; /* the capturing stream's wrapper */
    void *handle;        /* the program's stream while capturing, else NULL */
    void *graph;         /* the captured graph until destroyed, else NULL */
    uint32_t pool;       /* mt_pool_create's id */
    unsigned refs;
    bool capturing;
} capture_t;

/* An executable graph instantiated from a capture's graph. */
typedef struct exec_s {
    struct exec_s *next;
    void *exec;
    capture_t *cap;
} exec_t;

static pthread_mutex_t graph_mu = PTHREAD_MUTEX_INITIALIZER;
static capture_t *captures; /* under graph_mu */
static exec_t *execs;       /* under graph_mu */

/* Releases the pools of retired captures whose blocks are all free (graph_mu held). */
static void release_retired(void)
{
    for (capture_t **pp = &captures; *pp != NULL;) {
        capture_t *c = *pp;
        if (c->capturing || c->refs > 0) {
            pp = &c->next;
            continue;
        }
        mt__guard_enter();
        int rc = mt_pool_release(c->alloc, c->pool);
        mt__guard_leave();
        if (rc == MT_EBUSY) { /* the program still holds some of its blocks */
            mt__preload_say(MT_LOG_DEBUG, "graph pool %u kept: blocks of it are live", c->pool);
            pp = &c->next;
            continue;
        }
        mt__preload_say(MT_LOG_DEBUG, "graph pool %u released (%s)", c->pool, mt_strerror(rc));
        *pp = c->next;
        free(c);
    }
}

/* A capture began on handle (the runtime or driver said so). */
static void capture_begun(void *handle, int device)
{
    mt_alloc_t *a = NULL;
    mt_stream_t *s = NULL;
    uint32_t id = 0;
    capture_t *c = calloc(1, sizeof *c);
    if (c == NULL || device < 0 || mt__preload_alloc(device, &a) != 0) {
        free(c);
        return; /* served as before: the capture then takes eager blocks */
    }
    mt__guard_enter();
    int rc = mt__preload_stream(mt_alloc_backend(a), handle, &s);
    if (rc == 0)
        rc = mt_pool_create(a, &id);
    if (rc == 0 && (rc = mt_pool_begin(a, id, s)) != 0)
        (void)mt_pool_release(a, id);
    mt__guard_leave();
    if (rc != 0) {
        mt__preload_say(MT_LOG_WARN, "stream capture without a private pool: %s", mt_strerror(rc));
        free(c);
        return;
    }
    *c = (capture_t){.alloc = a, .stream = s, .handle = handle, .pool = id, .capturing = true};
    mt__preload_say(MT_LOG_DEBUG, "stream capture on %p: allocations go to pool %u", handle, id);
    pthread_mutex_lock(&graph_mu);
    c->next = captures;
    captures = c;
    release_retired();
    pthread_mutex_unlock(&graph_mu);
}

/* The capture on handle ended with graph (NULL when it failed). */
static void capture_ended(void *handle, void *graph)
{
    pthread_mutex_lock(&graph_mu);
    for (capture_t *c = captures; c != NULL; c = c->next) {
        if (!c->capturing || c->handle != handle)
            continue;
        mt__guard_enter();
        (void)mt_pool_end(c->alloc, c->pool, c->stream);
        mt__guard_leave();
        c->capturing = false;
        c->handle = NULL;
        c->graph = graph;
        c->refs = graph != NULL;
        break;
    }
    release_retired();
    pthread_mutex_unlock(&graph_mu);
}

static void instantiated(void *graph, void *exec)
{
    exec_t *e = malloc(sizeof *e);
    pthread_mutex_lock(&graph_mu);
    capture_t *c = captures;
    while (c != NULL && (graph == NULL || c->graph != graph))
        c = c->next;
    if (c != NULL && e != NULL) {
        *e = (exec_t){.next = execs, .exec = exec, .cap = c};
        execs = e;
        c->refs++;
        e = NULL;
    }
    pthread_mutex_unlock(&graph_mu);
    free(e);
}

static void exec_destroyed(void *exec)
{
    pthread_mutex_lock(&graph_mu);
    for (exec_t **pp = &execs; *pp != NULL; pp = &(*pp)->next) {
        exec_t *e = *pp;
        if (e->exec != exec)
            continue;
        *pp = e->next;
        mt_assert(e->cap->refs > 0);
        e->cap->refs--;
        free(e);
        break;
    }
    release_retired();
    pthread_mutex_unlock(&graph_mu);
}

void mt__preload_graph_destroyed(void *graph)
{
    if (graph == NULL)
        return;
    pthread_mutex_lock(&graph_mu);
    for (capture_t *c = captures; c != NULL; c = c->next) {
        if (c->graph != graph)
            continue;
        mt_assert(c->refs > 0);
        c->graph = NULL;
        c->refs--;
        break;
    }
    release_retired();
    pthread_mutex_unlock(&graph_mu);
}

void mt__preload_graph_forget(mt_alloc_t *a)
{
    pthread_mutex_lock(&graph_mu);
    for (capture_t **pp = &captures; *pp != NULL;) {
        capture_t *c = *pp;
        if (c->alloc != a) {
            pp = &c->next;
            continue;
        }
        for (exec_t **ep = &execs; *ep != NULL;) {
            exec_t *e = *ep;
            if (e->cap == c) {
                *ep = e->next;
                free(e);
            } else {
                ep = &e->next;
            }
        }
        *pp = c->next;
        free(c);
    }
    pthread_mutex_unlock(&graph_mu);
}

/* ---- runtime hooks ---- */

MT_HOOK cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    if (mt__preload()->sim)
        return mt__preload_rt_ret(cudaErrorNotSupported);
    cudaError_t (*real)(cudaStream_t, enum cudaStreamCaptureMode) = REAL_RT(cudaStreamBeginCapture);
    if (real == NULL)
        return mt__preload_rt_ret(cudaErrorInsufficientDriver);
    bool outer;
    cudaError_t r = CALL_REAL(&outer, real(stream, mode));
    if (outer && r == cudaSuccess)
        capture_begun(stream, mt__preload_rt_device());
    return r;
}

MT_HOOK cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    if (mt__preload()->sim)
        return mt__preload_rt_ret(cudaErrorNotSupported);
    cudaError_t (*real)(cudaStream_t, cudaGraph_t *) = REAL_RT(cudaStreamEndCapture);
    if (real == NULL)
        return mt__preload_rt_ret(cudaErrorInsufficientDriver);
    bool outer;
    cudaError_t r = CALL_REAL(&outer, real(stream, pGraph));
    if (outer)
        capture_ended(stream, r == cudaSuccess && pGraph != NULL ? (void *)*pGraph : NULL);
    return r;
}

/* cudaGraphInstantiate and its WithFlags twin: the same signature and the same watch. */
typedef cudaError_t (*instantiate_fn)(cudaGraphExec_t *, cudaGraph_t, unsigned long long);

static cudaError_t instantiate(instantiate_fn real, cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                               unsigned long long flags)
{
    if (real == NULL)
        return mt__preload_rt_ret(cudaErrorInsufficientDriver);
    bool outer;
    cudaError_t r = CALL_REAL(&outer, real(pGraphExec, graph, flags));
    if (outer && r == cudaSuccess && pGraphExec != NULL)
        instantiated(graph, *pGraphExec);
    return r;
}

MT_HOOK cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                         unsigned long long flags)
{
    if (mt__preload()->sim)
        return mt__preload_rt_ret(cudaErrorNotSupported);
    return instantiate(REAL_RT(cudaGraphInstantiate), pGraphExec, graph, flags);
}

MT_HOOK cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                  unsigned long long flags)
{
    if (mt__preload()->sim)
        return mt__preload_rt_ret(cudaErrorNotSupported);
    return instantiate(REAL_RT(cudaGraphInstantiateWithFlags), pGraphExec, graph, flags);
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
        exec_destroyed(graphExec);
    return r;
}

/* ---- driver hooks (programs that call the driver themselves) ---- */

MT_HOOK CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    if (mt__preload()->sim)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult (*real)(CUstream, CUstreamCaptureMode) = REAL(cuStreamBeginCapture_v2);
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    bool outer;
    CUresult r = CALL_REAL(&outer, real(hStream, mode));
    if (outer && r == CUDA_SUCCESS)
        capture_begun(hStream, mt__preload_drv_device());
    return r;
}

MT_HOOK CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    if (mt__preload()->sim)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult (*real)(CUstream, CUgraph *) = REAL(cuStreamEndCapture);
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    bool outer;
    CUresult r = CALL_REAL(&outer, real(hStream, phGraph));
    if (outer)
        capture_ended(hStream, r == CUDA_SUCCESS && phGraph != NULL ? (void *)*phGraph : NULL);
    return r;
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
        instantiated(hGraph, *phGraphExec);
    return r;
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
        exec_destroyed(hGraphExec);
    return r;
}
