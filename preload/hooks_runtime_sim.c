/* CUDA runtime hooks served on sim: copies, memsets, streams and events. In cuda mode
 * each goes to the real runtime (FORWARD); the memory entry points and the dlsym table
 * are in hooks_runtime.c. */
#include <stdint.h>

#include "preload/core.h"
#include "preload/hooks_rt.h"

/* ---- copies and memsets (sim-served) ---- */

/* The work is the core's (core.c); b: the current device's backend. */
static cudaError_t rt_work(int rc)
{
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
}

static cudaError_t sim_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t stream, bool sync)
{
    if ((int)kind < 0 || kind > cudaMemcpyDefault)
        return mt__preload_rt_ret(cudaErrorInvalidMemcpyDirection);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    return rt_work(mt__preload_op_copy(b, dst, src, n, (mt_memcpy_kind_e)kind, stream, sync));
}

MT_HOOK cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    FORWARD(cudaMemcpy, dst, src, count, kind);
    return sim_copy(dst, src, count, kind, NULL, true);
}

MT_HOOK cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                    enum cudaMemcpyKind kind, cudaStream_t stream)
{
    FORWARD(cudaMemcpyAsync, dst, src, count, kind, stream);
    return sim_copy(dst, src, count, kind, stream, false);
}

/* A peer copy on the current device's stream (sim mode). */
static cudaError_t sim_copy_peer(void *dst, int dst_dev, const void *src, int src_dev, size_t n,
                                 cudaStream_t stream, bool sync)
{
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    int rc = mt__preload_op_copy_peer(b, dst, dst_dev, src, src_dev, n, stream, sync);
    return rc == MT_EINVAL ? mt__preload_rt_ret(cudaErrorInvalidDevice) : rt_work(rc);
}

MT_HOOK cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice,
                                   size_t count)
{
    FORWARD(cudaMemcpyPeer, dst, dstDevice, src, srcDevice, count);
    return sim_copy_peer(dst, dstDevice, src, srcDevice, count, NULL, true);
}

MT_HOOK cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice,
                                        size_t count, cudaStream_t stream)
{
    FORWARD(cudaMemcpyPeerAsync, dst, dstDevice, src, srcDevice, count, stream);
    return sim_copy_peer(dst, dstDevice, src, srcDevice, count, stream, false);
}

static cudaError_t sim_set(void *dst, int value, size_t n, cudaStream_t stream)
{
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    return rt_work(mt__preload_op_set(b, dst, value, n, stream, false));
}

MT_HOOK cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    FORWARD(cudaMemset, devPtr, value, count);
    return sim_set(devPtr, value, count, NULL);
}

MT_HOOK cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    FORWARD(cudaMemsetAsync, devPtr, value, count, stream);
    return sim_set(devPtr, value, count, stream);
}

/* ---- streams (sim-served) ---- */

MT_HOOK cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    FORWARD(cudaStreamCreateWithFlags, pStream, flags);
    if (pStream == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidValue);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    return rt_work(mt__preload_op_sim(b, MT_PRELOAD_STREAM_CREATE, NULL, (void **)pStream));
}

MT_HOOK cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    FORWARD(cudaStreamCreate, pStream);
    return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

MT_HOOK cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    if (!mt__preload()->sim)
        mt__preload_stream_forget(stream); /* the runtime may hand the handle out again */
    FORWARD(cudaStreamDestroy, stream);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    if ((uintptr_t)stream <= 2)
        return mt__preload_rt_ret(cudaErrorInvalidResourceHandle);
    return rt_work(mt__preload_op_sim(b, MT_PRELOAD_STREAM_DESTROY, stream, NULL));
}

MT_HOOK cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    FORWARD(cudaStreamSynchronize, stream);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    return rt_work(mt__preload_op_stream_sync(b, stream));
}

MT_HOOK cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    FORWARD(cudaStreamWaitEvent, stream, event, flags);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    if (event == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidResourceHandle);
    mt_stream_t *s = NULL;
    mt__guard_enter();
    int rc = mt__preload_stream(b, stream, &s);
    if (rc == 0)
        rc = s == NULL ? mt_event_synchronize(b, (mt_event_t *)event)
                       : mt_stream_wait_event(b, s, (mt_event_t *)event);
    mt__guard_leave();
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
}

MT_HOOK cudaError_t cudaDeviceSynchronize(void)
{
    FORWARD(cudaDeviceSynchronize);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    return rt_work(mt__preload_op_sim(b, MT_PRELOAD_DEVICE_SYNC, NULL, NULL));
}

/* ---- events (sim-served) ---- */

MT_HOOK cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    FORWARD(cudaEventCreateWithFlags, event, flags);
    if (event == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidValue);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    return rt_work(mt__preload_op_sim(b, MT_PRELOAD_EVENT_CREATE, NULL, (void **)event));
}

MT_HOOK cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    FORWARD(cudaEventCreate, event);
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

MT_HOOK cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    FORWARD(cudaEventRecord, event, stream);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    if (event == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidResourceHandle);
    return rt_work(mt__preload_op_event_record(b, event, stream));
}

MT_HOOK cudaError_t cudaEventQuery(cudaEvent_t event)
{
    FORWARD(cudaEventQuery, event);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    if (event == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidResourceHandle);
    return rt_work(mt__preload_op_sim(b, MT_PRELOAD_EVENT_QUERY, event, NULL));
}

MT_HOOK cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    FORWARD(cudaEventSynchronize, event);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    if (event == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidResourceHandle);
    return rt_work(mt__preload_op_sim(b, MT_PRELOAD_EVENT_SYNC, event, NULL));
}

MT_HOOK cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    FORWARD(cudaEventElapsedTime, ms, start, end);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    if (ms == NULL || start == NULL || end == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidValue);
    mt__guard_enter();
    uint64_t t0 = mt_event_time_ns(b, (mt_event_t *)start);
    uint64_t t1 = mt_event_time_ns(b, (mt_event_t *)end);
    mt__guard_leave();
    if (t0 == 0 || t1 == 0)
        return mt__preload_rt_ret(cudaErrorNotReady);
    *ms = (float)((double)(int64_t)(t1 - t0) / 1e6);
    return cudaSuccess;
}

MT_HOOK cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    FORWARD(cudaEventDestroy, event);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    if (event == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidResourceHandle);
    return rt_work(mt__preload_op_sim(b, MT_PRELOAD_EVENT_DESTROY, event, NULL));
}
