/* CUDA runtime hooks served on sim: copies, memsets, streams and events. In cuda mode
 * each goes to the real runtime (FORWARD); the memory entry points and the dlsym table
 * are in hooks_runtime.c. */
#include <stdint.h>

#include "preload/hooks_rt.h"

/* ---- copies and memsets (sim-served) ---- */

/* On sim, work the program puts on the default stream (0, cudaStreamLegacy,
 * cudaStreamPerThread) is done synchronously after draining the device. That is
 * stricter than CUDA's legacy-stream barrier, never weaker, so programs stay correct. */
static int sim_default_begin(mt_backend_t *b, mt_stream_t *s)
{
    return s == NULL ? mt_device_synchronize(b) : 0;
}

static int sim_default_end(mt_backend_t *b, mt_stream_t *s, int rc)
{
    return rc == 0 && s == NULL ? mt_stream_synchronize(b, NULL) : rc;
}

static cudaError_t sim_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t stream, bool sync)
{
    if ((int)kind < 0 || kind > cudaMemcpyDefault)
        return mt__preload_rt_ret(cudaErrorInvalidMemcpyDirection);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    mt_stream_t *s = NULL;
    mt__guard_enter();
    int rc = mt__preload_stream(b, stream, &s);
    if (rc == 0)
        rc = sim_default_begin(b, s);
    if (rc == 0)
        rc = mt_memcpy_async(b, dst, src, n, (mt_memcpy_kind_e)kind, s);
    rc = sim_default_end(b, s, rc);
    if (rc == 0 && sync && s != NULL)
        rc = mt_stream_synchronize(b, s);
    mt__guard_leave();
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
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
    mt_stream_t *s = NULL;
    mt__guard_enter();
    int rc = mt__preload_stream(b, stream, &s);
    if (rc == 0)
        rc = sim_default_begin(b, s);
    if (rc == 0)
        rc = mt_memcpy_peer_async(b, dst, dst_dev, src, src_dev, n, s);
    rc = sim_default_end(b, s, rc);
    if (rc == 0 && sync && s != NULL)
        rc = mt_stream_synchronize(b, s);
    mt__guard_leave();
    return mt__preload_rt_ret(rc == MT_EINVAL ? cudaErrorInvalidDevice : mt__preload_rt_code(rc));
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
    mt_stream_t *s = NULL;
    mt__guard_enter();
    int rc = mt__preload_stream(b, stream, &s);
    if (rc == 0)
        rc = sim_default_begin(b, s);
    if (rc == 0)
        rc = mt_memset_async(b, dst, value, n, s);
    rc = sim_default_end(b, s, rc);
    mt__guard_leave();
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
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
    mt_stream_t *s = NULL;
    mt__guard_enter();
    int rc = mt_stream_create(b, &s);
    mt__guard_leave();
    if (rc == 0)
        *pStream = (cudaStream_t)s;
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
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
    mt_stream_t *s = (mt_stream_t *)stream;
    mt__guard_enter();
    mt_stream_destroy(b, &s);
    mt__guard_leave();
    return cudaSuccess;
}

MT_HOOK cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    FORWARD(cudaStreamSynchronize, stream);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    mt_stream_t *s = NULL;
    mt__guard_enter();
    int rc = mt__preload_stream(b, stream, &s);
    /* The legacy default stream waits for every blocking stream. */
    if (rc == 0)
        rc = s == NULL ? mt_device_synchronize(b) : mt_stream_synchronize(b, s);
    mt__guard_leave();
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
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
    mt__guard_enter();
    int rc = mt_device_synchronize(b);
    mt__guard_leave();
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
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
    mt_event_t *ev = NULL;
    mt__guard_enter();
    int rc = mt_event_create(b, &ev);
    mt__guard_leave();
    if (rc == 0)
        *event = (cudaEvent_t)ev;
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
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
    mt_stream_t *s = NULL;
    mt__guard_enter();
    int rc = mt__preload_stream(b, stream, &s);
    if (rc == 0)
        rc = sim_default_begin(b, s);
    if (rc == 0)
        rc = mt_event_record(b, (mt_event_t *)event, s);
    mt__guard_leave();
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
}

MT_HOOK cudaError_t cudaEventQuery(cudaEvent_t event)
{
    FORWARD(cudaEventQuery, event);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    if (event == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidResourceHandle);
    mt__guard_enter();
    int rc = mt_event_query(b, (mt_event_t *)event);
    mt__guard_leave();
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
}

MT_HOOK cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    FORWARD(cudaEventSynchronize, event);
    mt_backend_t *b = mt__preload_rt_backend();
    if (b == NULL)
        return mt__preload_rt_ret(cudaErrorNoDevice);
    if (event == NULL)
        return mt__preload_rt_ret(cudaErrorInvalidResourceHandle);
    mt__guard_enter();
    int rc = mt_event_synchronize(b, (mt_event_t *)event);
    mt__guard_leave();
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
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
    mt_event_t *ev = (mt_event_t *)event;
    mt__guard_enter();
    mt_event_destroy(b, &ev);
    mt__guard_leave();
    return cudaSuccess;
}
