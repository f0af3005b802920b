/* The fake driver, continued (see fake_libcuda.c for the whole contract): what a real
 * driver does beyond the cuda backend's needs, which the drop-in meets in programs. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "fake_internal.h"

/* ---- what the driver does beyond the backend's needs ---- */

FAKE_API void fake_cuda_fault(int dev, CUresult res);
FAKE_API unsigned long long fake_cuda_handle_types(void);

/* A kernel on device dev faulted with res: the context's sticky error from now on. */
void fake_cuda_fault(int dev, CUresult res)
{
    pthread_mutex_lock(&fake.mu);
    if (dev >= 0 && dev < MAXDEV)
        fake.ctxs[dev].sticky = res;
    pthread_mutex_unlock(&fake.mu);
}

/* Every shareable handle type a cuMemCreate has asked for so far. */
unsigned long long fake_cuda_handle_types(void)
{
    return fake.handle_types;
}

/* A fork child inherits none of the driver's state: every later call fails as the real
 * driver's do. The lock may have been held by a thread that does not exist in the child. */
static void fake_child(void)
{
    pthread_mutex_init(&fake.mu, NULL);
    pthread_cond_init(&fake.cv, NULL);
    if (fake.inited)
        fake.forked = true;
}

/* FAKE_CUDA_DEVICES=n: a process that cannot call fake_cuda_reset before the first
 * cuDeviceGetCount (a program under the drop-in, which counts devices as it loads) starts
 * with n devices. */
__attribute__((constructor)) static void fake_init(void)
{
    pthread_atfork(NULL, NULL, fake_child);
    const char *n = getenv("FAKE_CUDA_DEVICES");
    if (n != NULL && atoi(n) > 0)
        fake.devices = atoi(n) < MAXDEV ? atoi(n) : MAXDEV;
}

/* Destroys everything ctx owns (allocations, streams, events) and clears its fault, after
 * its queued work ran. Its old handles are refused from then on. */
static void ctx_teardown(fake_ctx_t *x)
{
    pthread_mutex_lock(&fake.mu);
    drain_until(ctx_idle, x);
    for (fake_stream_t *s = fake.streams; s != NULL; s = s->next)
        if (s->ctx == x)
            s->dead = true;
    x->null_stream = NULL;
    x->epoch++;
    for (fake_event_t *e = fake.events, *n; e != NULL; e = n) {
        n = e->next;
        if (e->ctx == x && !e->dead) {
            e->dead = true;
            e->refs++;
            event_unref(e);
        }
    }
    fake_blk_t *gone = NULL;
    for (fake_blk_t **pp = &fake.blks; *pp != NULL;) {
        fake_blk_t *b = *pp;
        if (b->ctx == x) {
            *pp = b->next;
            b->next = gone;
            gone = b;
        } else
            pp = &b->next;
    }
    x->sticky = CUDA_SUCCESS;
    pthread_cond_broadcast(&fake.cv);
    pthread_mutex_unlock(&fake.mu);
    while (gone != NULL) {
        fake_blk_t *b = gone;
        gone = b->next;
        if (b->host)
            free(b->p);
        else {
            give(b->size);
            dev_drop((uintptr_t)b->p, b->size);
        }
        free(b);
    }
}

FAKE_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    ENTER("cuDevicePrimaryCtxReset", dev, 0);
    if (dev < 0 || dev >= fake.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    ctx_teardown(&fake.ctxs[dev]);
    return CUDA_SUCCESS;
}

/* A context of its own on dev (CUDA 13's signature; params and flags are not modelled),
 * pushed on the calling thread's stack. Its cuMemAlloc memory is its own: a memset of it
 * from another context faults, as a kernel would (fake_libcuda.c:ctx_may_set). */
FAKE_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned flags,
                                 CUdevice dev)
{
    ENTER("cuCtxCreate", dev, flags);
    (void)params;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= fake.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    if (depth == MAXSTACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fake.mu);
    fake_ctx_t *x = NULL;
    for (int i = MAXDEV; i < MAXDEV + MAXUCTX && x == NULL; i++)
        if (!fake.ctxs[i].created)
            x = &fake.ctxs[i];
    if (x != NULL) {
        x->dev = dev;
        x->null_stream = NULL;
        x->sticky = CUDA_SUCCESS;
        x->epoch++; /* per-thread streams of an earlier context in this slot go */
        x->created = true;
    }
    pthread_mutex_unlock(&fake.mu);
    if (x == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    stack[depth++] = x;
    __atomic_add_fetch(&fake.ctx_depth, 1, __ATOMIC_RELAXED);
    *pctx = (CUcontext)x;
    return CUDA_SUCCESS;
}

/* Destroying a context tears it down as a reset does (a primary one too; its handle stays
 * valid, as after a reset), and pops it if it is current. A context made with cuCtxCreate
 * is gone: its handle is refused afterwards. */
FAKE_API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    ENTER("cuCtxDestroy", (uintptr_t)ctx, 0);
    fake_ctx_t *x = ctx_of(ctx);
    if (x == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    ctx_teardown(x);
    pthread_mutex_lock(&fake.mu);
    x->created = false;
    pthread_mutex_unlock(&fake.mu);
    if (cur() == x) {
        depth--;
        __atomic_sub_fetch(&fake.ctx_depth, 1, __ATOMIC_RELAXED);
    }
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned int flags)
{
    ENTER_CTX("cuMemAllocManaged", flags, size);
    UNSAFE();
    if (size == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    void *q = NULL;
    CUresult r = blk_new(&q, size, false);
    *p = (CUdeviceptr)(uintptr_t)q;
    if (r == CUDA_SUCCESS)
        fake_managed_note((uintptr_t)q, size);
    return r;
}

FAKE_API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height,
                                     unsigned int elem)
{
    ENTER_CTX("cuMemAllocPitch_v2", width, height);
    UNSAFE();
    if (width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pt = (width + 511) & ~(size_t)511;
    void *q = NULL;
    CUresult r = blk_new(&q, pt * height, false);
    *p = (CUdeviceptr)(uintptr_t)q;
    if (r == CUDA_SUCCESS)
        *pitch = pt;
    return r;
}

/* Stream-ordered: the memory is no context's but the stream's device's (the pool current
 * to that device, whatever context is current), and a free happens when the stream gets
 * to it. On a capturing stream both become graph nodes (the allocation is made now). */
FAKE_API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream h)
{
    ENTER_CTX("cuMemAllocAsync", (uintptr_t)h, size);
    CUresult r;
    pthread_mutex_lock(&fake.mu);
    fake_stream_t *s = stream_any(h, &r);
    bool in_graph = s != NULL && s->capture == 1;
    if (in_graph)
        s->graph->nodes++;
    int dev = s != NULL ? s->ctx->dev : 0;
    pthread_mutex_unlock(&fake.mu);
    if (s == NULL)
        return r;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *q = NULL;
    r = blk_new(&q, size, false);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&fake.mu);
        for (fake_blk_t *b = fake.blks; b != NULL; b = b->next)
            if (b->p == q) {
                b->ctx = NULL;
                b->dev = dev;
                b->graph = in_graph;
            }
        pthread_mutex_unlock(&fake.mu);
        *p = (CUdeviceptr)(uintptr_t)q;
    }
    return r;
}

FAKE_API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream h)
{
    ENTER_CTX("cuMemFreeAsync", p, (uintptr_t)h);
    bool found = false, graph = false;
    CUresult r;
    pthread_mutex_lock(&fake.mu);
    for (fake_blk_t *b = fake.blks; b != NULL && !found; b = b->next)
        if (b->p == (void *)(uintptr_t)p && !b->host) {
            found = true;
            graph = b->graph;
        }
    /* During capture the free becomes a graph node, which needs a graph allocation
     * (cuda_runtime_api.h, cudaFreeAsync); anything else fails the capture. */
    fake_stream_t *s = stream_of(h, &r);
    if (s != NULL && s->capture == 1 && !graph) {
        s->capture = 2;
        found = false;
    }
    pthread_mutex_unlock(&fake.mu);
    if (!found)
        return CUDA_ERROR_INVALID_VALUE;
    return submit(h, (fake_op_t){.kind = OP_FREE, .dst = (void *)(uintptr_t)p});
}

/* The allocation holding p: a cuMemAlloc-family block or a VMM mapping. */
FAKE_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    ENTER_CTX("cuMemGetAddressRange_v2", p, 0);
    CUresult r = CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&fake.mu);
    for (fake_blk_t *b = fake.blks; b != NULL && r != CUDA_SUCCESS; b = b->next)
        if (!b->host && p >= (uintptr_t)b->p && p - (uintptr_t)b->p < b->size) {
            if (base)
                *base = (uintptr_t)b->p;
            if (size)
                *size = b->size;
            r = CUDA_SUCCESS;
        }
    for (fake_resv_t *v = fake.resvs; v != NULL && r != CUDA_SUCCESS; v = v->next)
        for (fake_map_t *m = v->maps; m != NULL && r != CUDA_SUCCESS; m = m->next)
            if (p >= m->p && p - m->p < m->size) {
                if (base)
                    *base = m->p;
                if (size)
                    *size = m->size;
                r = CUDA_SUCCESS;
            }
    pthread_mutex_unlock(&fake.mu);
    return r;
}

/* The device whose memory p is: a block's, or the handle's mapped at p. */
static CUresult device_of(CUdeviceptr p, int *dev)
{
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake.mu);
    for (fake_blk_t *b = fake.blks; b != NULL && r != CUDA_SUCCESS; b = b->next)
        if (!b->host && p >= (uintptr_t)b->p && p - (uintptr_t)b->p < b->size) {
            *dev = b->dev;
            r = CUDA_SUCCESS;
        }
    for (fake_resv_t *v = fake.resvs; v != NULL && r != CUDA_SUCCESS; v = v->next)
        for (fake_map_t *m = v->maps; m != NULL && r != CUDA_SUCCESS; m = m->next)
            if (p >= m->p && p - m->p < m->size) {
                *dev = m->dev;
                r = CUDA_SUCCESS;
            }
    pthread_mutex_unlock(&fake.mu);
    return r;
}

/* The range attributes and the device ordinal (what a caching allocator changes). */
FAKE_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p)
{
    if (attr == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
        int dev = 0;
        CUresult r = device_of(p, &dev);
        if (r == CUDA_SUCCESS)
            *(int *)data = dev;
        return r;
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = cuMemGetAddressRange_v2(&base, &size, p);
    if (r != CUDA_SUCCESS)
        return r == CUDA_ERROR_NOT_FOUND ? CUDA_ERROR_INVALID_VALUE : r;
    if (attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
        *(CUdeviceptr *)data = base;
    else if (attr == CU_POINTER_ATTRIBUTE_RANGE_SIZE)
        *(size_t *)data = size;
    else
        return CUDA_ERROR_NOT_SUPPORTED;
    return CUDA_SUCCESS;
}

/* As the driver: the handle names the whole allocation p lies in, whatever p's offset;
 * whoever opens it maps that allocation's start. Only cuMemAlloc memory. */
FAKE_API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
    ENTER_CTX("cuIpcGetMemHandle", p, 0);
    CUdeviceptr base = 0;
    pthread_mutex_lock(&fake.mu);
    for (fake_blk_t *b = fake.blks; b != NULL && base == 0; b = b->next)
        if (!b->host && b->ctx != NULL && p >= (uintptr_t)b->p && p - (uintptr_t)b->p < b->size)
            base = (uintptr_t)b->p;
    pthread_mutex_unlock(&fake.mu);
    if (base == 0)
        return CUDA_ERROR_INVALID_VALUE;
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &base, sizeof base);
    return CUDA_SUCCESS;
}

/* ---- stream capture ---- */

/* Starts a capture on h into `into` (cuGraphCreate's, kept by its owner whatever
 * happens), or into a new graph when NULL. */
CUresult capture_begin(CUstream h, CUstreamCaptureMode mode, fake_graph_t *into)
{
    if (h == NULL || h == CU_STREAM_LEGACY)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream is not capturable */
    CUresult r;
    pthread_mutex_lock(&fake.mu);
    fake_stream_t *s = stream_of(h, &r);
    fake_graph_t *g = s && s->capture == 0 ? (into ? into : calloc(1, sizeof *g)) : NULL;
    if (s != NULL && s->capture != 0)
        r = CUDA_ERROR_ILLEGAL_STATE;
    else if (s != NULL && g == NULL)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else if (s != NULL) {
        s->capture = 1;
        s->mode = mode;
        s->capture_id = ++fake.next_capture_id;
        s->graph = g;
        s->capturer = pthread_self();
    }
    pthread_mutex_unlock(&fake.mu);
    return r;
}

FAKE_API CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode)
{
    ENTER_CTX("cuStreamBeginCapture", (uintptr_t)h, mode);
    return capture_begin(h, mode, NULL);
}

static CUstreamCaptureStatus capture_status(const fake_stream_t *s)
{
    return s->capture == 0   ? CU_STREAM_CAPTURE_STATUS_NONE
           : s->capture == 1 ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                             : CU_STREAM_CAPTURE_STATUS_INVALIDATED;
}

static CUresult capture_end(CUstream h, CUgraph *graph)
{
    CUresult r;
    pthread_mutex_lock(&fake.mu);
    fake_stream_t *s = stream_of(h, &r);
    fake_graph_t *g = NULL;
    if (s != NULL && s->capture == 0)
        r = CUDA_ERROR_ILLEGAL_STATE;
    else if (s != NULL) {
        g = s->graph;
        r = s->capture == 1 ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        s->capture = 0;
        s->graph = NULL;
    }
    pthread_mutex_unlock(&fake.mu);
    if (r != CUDA_SUCCESS) {
        if (g != NULL && !g->created)
            free(g);
        g = NULL;
    }
    *graph = (CUgraph)g;
    return r;
}

FAKE_API CUresult cuStreamEndCapture(CUstream h, CUgraph *graph)
{
    ENTER_CTX("cuStreamEndCapture", (uintptr_t)h, 0);
    return capture_end(h, graph);
}

FAKE_API CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *st)
{
    ENTER_CTX("cuStreamIsCapturing", (uintptr_t)h, 0);
    CUresult r;
    pthread_mutex_lock(&fake.mu);
    fake_stream_t *s = stream_of(h, &r);
    if (s != NULL)
        *st = capture_status(s);
    pthread_mutex_unlock(&fake.mu);
    return r;
}

FAKE_API CUresult cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id,
                                            CUgraph *graph, const CUgraphNode **deps,
                                            const CUgraphEdgeData **edges, size_t *ndeps)
{
    ENTER_CTX("cuStreamGetCaptureInfo", (uintptr_t)h, 0);
    if (st == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r;
    pthread_mutex_lock(&fake.mu);
    fake_stream_t *s = stream_of(h, &r);
    if (s != NULL) {
        *st = capture_status(s);
        if (id)
            *id = s->capture ? s->capture_id : 0;
        if (graph)
            *graph = s->capture == 1 ? (CUgraph)s->graph : NULL;
        if (deps)
            *deps = NULL;
        if (edges)
            *edges = NULL;
        if (ndeps)
            *ndeps = 0;
    }
    pthread_mutex_unlock(&fake.mu);
    return r;
}

FAKE_API CUresult cuGraphDestroy(CUgraph g)
{
    ENTER("cuGraphDestroy", (uintptr_t)g, 0);
    if (g == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    free(g);
    return CUDA_SUCCESS;
}

/* ---- synchronous copies: on the legacy stream, or (_ptds) the thread's own ---- */

static CUresult copy_sync(void *dst, const void *src, size_t n, CUstream h)
{
    CUresult r = submit(h, (fake_op_t){.kind = OP_COPY, .dst = dst, .src = src, .n = n});
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&fake.mu);
    fake_stream_t *s = stream_of(h, &r);
    if (s != NULL) {
        drain_until(stream_idle, s);
        r = cur()->sticky;
    }
    pthread_mutex_unlock(&fake.mu);
    return r;
}

FAKE_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    ENTER_CTX("cuMemcpyHtoD", dst, n);
    return copy_sync((void *)(uintptr_t)dst, src, n, NULL);
}

FAKE_API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    ENTER_CTX("cuMemcpyDtoH", src, n);
    return copy_sync(dst, (const void *)(uintptr_t)src, n, NULL);
}

FAKE_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n);
FAKE_API CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n);

FAKE_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
    ENTER_CTX("cuMemcpyHtoD", dst, n);
    return copy_sync((void *)(uintptr_t)dst, src, n, CU_STREAM_PER_THREAD);
}

FAKE_API CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n)
{
    ENTER_CTX("cuMemcpyDtoH", src, n);
    return copy_sync(dst, (const void *)(uintptr_t)src, n, CU_STREAM_PER_THREAD);
}

/* ---- per-thread default stream variants: NULL is the thread's own stream ---- */

#define PT(h) ((h) == NULL ? CU_STREAM_PER_THREAD : (h))

FAKE_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream h);
FAKE_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream h);
FAKE_API CUresult cuStreamSynchronize_ptsz(CUstream h);
FAKE_API CUresult cuStreamWaitEvent_ptsz(CUstream h, CUevent ev, unsigned int flags);
FAKE_API CUresult cuLaunchHostFunc_ptsz(CUstream h, CUhostFn fn, void *ud);
FAKE_API CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h);
FAKE_API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char v, size_t n, CUstream h);
FAKE_API CUresult cuEventRecord_ptsz(CUevent ev, CUstream h);
FAKE_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode);
FAKE_API CUresult cuStreamEndCapture_ptsz(CUstream h, CUgraph *g);
FAKE_API CUresult cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus *st);
FAKE_API CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus *st,
                                                 cuuint64_t *id, CUgraph *graph,
                                                 const CUgraphNode **deps,
                                                 const CUgraphEdgeData **edges, size_t *ndeps);

FAKE_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream h)
{
    return cuMemAllocAsync(p, size, PT(h));
}
FAKE_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream h)
{
    return cuMemFreeAsync(p, PT(h));
}
FAKE_API CUresult cuStreamSynchronize_ptsz(CUstream h)
{
    return cuStreamSynchronize(PT(h));
}
FAKE_API CUresult cuStreamWaitEvent_ptsz(CUstream h, CUevent ev, unsigned int flags)
{
    return cuStreamWaitEvent(PT(h), ev, flags);
}
FAKE_API CUresult cuLaunchHostFunc_ptsz(CUstream h, CUhostFn fn, void *ud)
{
    return cuLaunchHostFunc(PT(h), fn, ud);
}
FAKE_API CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h)
{
    return cuMemcpyAsync(dst, src, n, PT(h));
}
FAKE_API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char v, size_t n, CUstream h)
{
    return cuMemsetD8Async(dst, v, n, PT(h));
}
FAKE_API CUresult cuEventRecord_ptsz(CUevent ev, CUstream h)
{
    return cuEventRecord(ev, PT(h));
}
/* The capture pair calls no exported entry point, as the driver's own: an interposer of
 * cuStreamBeginCapture_v2 must hook the _ptsz forms too to see these. */
FAKE_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode)
{
    ENTER_CTX("cuStreamBeginCapture", (uintptr_t)h, mode);
    return capture_begin(PT(h), mode, NULL);
}
FAKE_API CUresult cuStreamEndCapture_ptsz(CUstream h, CUgraph *g)
{
    ENTER_CTX("cuStreamEndCapture", (uintptr_t)h, 0);
    return capture_end(PT(h), g);
}
FAKE_API CUresult cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus *st)
{
    return cuStreamIsCapturing(PT(h), st);
}
FAKE_API CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus *st,
                                                 cuuint64_t *id, CUgraph *graph,
                                                 const CUgraphNode **deps,
                                                 const CUgraphEdgeData **edges, size_t *ndeps)
{
    return cuStreamGetCaptureInfo_v3(PT(h), st, id, graph, deps, edges, ndeps);
}

/* ---- cuGetProcAddress ---- */

#undef cuGetProcAddress
FAKE_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                   cuuint64_t flags);

/* Base name -> the legacy entry point, its per-thread variant (or NULL), and the oldest
 * CUDA version it answers for. */
#define P(base, fn, ptsz, ver)                                                                     \
    {                                                                                              \
        base, (void *)fn, (void *)ptsz, ver                                                        \
    }
static const struct {
    const char *base;
    void *fn, *ptsz;
    int min_version;
} procs[] = {
    P("cuInit", cuInit, NULL, 2000),
    P("cuDeviceGetCount", cuDeviceGetCount, NULL, 2000),
    P("cuDeviceGet", cuDeviceGet, NULL, 2000),
    P("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain, NULL, 7000),
    P("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, NULL, 11000),
    P("cuCtxEnablePeerAccess", cuCtxEnablePeerAccess, NULL, 4000),
    P("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2, NULL, 11000),
    P("cuCtxPushCurrent", cuCtxPushCurrent_v2, NULL, 4000),
    P("cuCtxPopCurrent", cuCtxPopCurrent_v2, NULL, 4000),
    P("cuCtxSetCurrent", cuCtxSetCurrent, NULL, 4000),
    P("cuCtxGetCurrent", cuCtxGetCurrent, NULL, 4000),
    P("cuCtxGetDevice", cuCtxGetDevice, NULL, 2000),
    P("cuCtxSynchronize", cuCtxSynchronize, NULL, 2000),
    P("cuCtxDestroy", cuCtxDestroy_v2, NULL, 4000),
    P("cuCtxCreate", cuCtxCreate_v4, NULL, 13000),
    P("cuMemAlloc", cuMemAlloc_v2, NULL, 3020),
    P("cuMemFree", cuMemFree_v2, NULL, 3020),
    P("cuMemGetInfo", cuMemGetInfo_v2, NULL, 3020),
    P("cuMemHostAlloc", cuMemHostAlloc, NULL, 2020),
    P("cuMemFreeHost", cuMemFreeHost, NULL, 2000),
    P("cuMemAllocManaged", cuMemAllocManaged, NULL, 6000),
    P("cuMemAllocPitch", cuMemAllocPitch_v2, NULL, 3020),
    P("cuMemGetAddressRange", cuMemGetAddressRange_v2, NULL, 3020),
    P("cuMemAllocAsync", cuMemAllocAsync, cuMemAllocAsync_ptsz, 11020),
    P("cuMemFreeAsync", cuMemFreeAsync, cuMemFreeAsync_ptsz, 11020),
    P("cuIpcGetMemHandle", cuIpcGetMemHandle, NULL, 4010),
    P("cuPointerGetAttribute", cuPointerGetAttribute, NULL, 4000),
    P("cuStreamCreate", cuStreamCreate, NULL, 2000),
    P("cuStreamGetCtx", cuStreamGetCtx, NULL, 9020),
    P("cuStreamDestroy", cuStreamDestroy_v2, NULL, 4000),
    P("cuStreamSynchronize", cuStreamSynchronize, cuStreamSynchronize_ptsz, 2000),
    P("cuStreamWaitEvent", cuStreamWaitEvent, cuStreamWaitEvent_ptsz, 3020),
    P("cuLaunchHostFunc", cuLaunchHostFunc, cuLaunchHostFunc_ptsz, 10000),
    P("cuMemcpyAsync", cuMemcpyAsync, cuMemcpyAsync_ptsz, 4000),
    P("cuMemcpyHtoD", cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds, 3020),
    P("cuMemcpyDtoH", cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds, 3020),
    P("cuMemsetD8Async", cuMemsetD8Async, cuMemsetD8Async_ptsz, 3020),
    P("cuEventCreate", cuEventCreate, NULL, 2000),
    P("cuEventDestroy", cuEventDestroy_v2, NULL, 4000),
    P("cuEventRecord", cuEventRecord, cuEventRecord_ptsz, 2000),
    P("cuEventQuery", cuEventQuery, NULL, 2000),
    P("cuEventSynchronize", cuEventSynchronize, NULL, 2000),
    P("cuEventElapsedTime", cuEventElapsedTime_v2, NULL, 12080),
    P("cuMemGetAllocationGranularity", cuMemGetAllocationGranularity, NULL, 10020),
    P("cuMemAddressReserve", cuMemAddressReserve, NULL, 10020),
    P("cuMemAddressFree", cuMemAddressFree, NULL, 10020),
    P("cuMemCreate", cuMemCreate, NULL, 10020),
    P("cuMemRelease", cuMemRelease, NULL, 10020),
    P("cuMemMap", cuMemMap, NULL, 10020),
    P("cuMemUnmap", cuMemUnmap, NULL, 10020),
    P("cuMemSetAccess", cuMemSetAccess, NULL, 10020),
    P("cuStreamBeginCapture", cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz, 10010),
    P("cuStreamEndCapture", cuStreamEndCapture, cuStreamEndCapture_ptsz, 10000),
    P("cuStreamIsCapturing", cuStreamIsCapturing, cuStreamIsCapturing_ptsz, 10000),
    P("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz, 12030),
    P("cuGraphDestroy", cuGraphDestroy, NULL, 10000),
    P("cuGraphCreate", cuGraphCreate, NULL, 10000),
    P("cuStreamBeginCaptureToGraph", cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph_ptsz,
      12030),
    P("cuGraphInstantiate", cuGraphInstantiateWithFlags, NULL, 11040),
    P("cuGraphInstantiateWithParams", cuGraphInstantiateWithParams,
      cuGraphInstantiateWithParams_ptsz, 12000),
    P("cuGraphExecDestroy", cuGraphExecDestroy, NULL, 10000),
    P("cuThreadExchangeStreamCaptureMode", cuThreadExchangeStreamCaptureMode, NULL, 10010),
    P("cuGetProcAddress", cuGetProcAddress_v2, NULL, 12000),
};

static CUresult get_proc(const char *symbol, void **pfn, int version, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status)
{
    const cuuint64_t known =
        CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    if (symbol == NULL || pfn == NULL || (flags & ~known) != 0 || (flags & known) == known)
        return CUDA_ERROR_INVALID_VALUE;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *pfn = NULL;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        if (strcmp(procs[i].base, symbol) != 0)
            continue;
        if (strcmp(symbol, "cuGetProcAddress") == 0 && version < 12000) {
            *pfn = (void *)cuGetProcAddress; /* the 11.x signature */
            st = CU_GET_PROC_ADDRESS_SUCCESS;
        } else if (version < procs[i].min_version)
            st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        else {
            /* DEFAULT is the legacy stream here: the per-thread choice of a program built
             * for it is made in cuda.h, which adds the flag. */
            bool pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
            *pfn = pt && procs[i].ptsz ? procs[i].ptsz : procs[i].fn;
            st = CU_GET_PROC_ADDRESS_SUCCESS;
        }
        break;
    }
    if (status)
        *status = st;
    return CUDA_SUCCESS; /* as documented: a missing symbol is a NULL pfn, not an error */
}

FAKE_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                      cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    ENTER("cuGetProcAddress", cudaVersion, flags);
    return get_proc(symbol, pfn, cudaVersion, flags, status);
}

FAKE_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                   cuuint64_t flags)
{
    ENTER("cuGetProcAddress", cudaVersion, flags);
    return get_proc(symbol, pfn, cudaVersion, flags, NULL);
}

FAKE_API void *fake_cuda_proc(const char *base, bool per_thread);

/* The driver's own entry point for a base name, as cuGetProcAddress would give it, out
 * of reach of any interposer (tests get the real function behind a hook). */
void *fake_cuda_proc(const char *base, bool per_thread)
{
    void *f = NULL;
    get_proc(base, &f, CUDA_VERSION, per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0,
             NULL);
    return f;
}

/* Every two distinct devices can reach each other's memory (NVLink or a PCIe switch),
 * unless FAKE_CUDA_NO_P2P is set. */
FAKE_API CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    ENTER("cuDeviceCanAccessPeer", dev, peer);
    if (can == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= fake.devices || peer < 0 || peer >= fake.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    const char *off = getenv("FAKE_CUDA_NO_P2P");
    *can = dev != peer && (off == NULL || *off == '\0');
    return CUDA_SUCCESS;
}
