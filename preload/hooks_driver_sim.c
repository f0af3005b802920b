/* CUDA driver hooks served on sim: copies, memsets, streams and events. In cuda mode each
 * goes to the real driver (FORWARD); hooks_driver.c hands them out through dlsym and
 * cuGetProcAddress. */
#include <stdint.h>

#include "preload/core.h"
#include "preload/hooks_cuda.h"

/* ---- copies, memsets, streams, events (sim-served) ---- */

/* The work is the core's (core.c); synchronous copies and memsets drain the device
 * first, as on the legacy stream. */
static CUresult sim_copy(void *dst, const void *src, size_t n, mt_memcpy_kind_e kind,
                         CUstream stream, bool sync)
{
    mt_backend_t *b = mt__preload_drv_backend();
    if (b == NULL)
        return mt__preload_drv_no_backend();
    return mt__preload_drv_code(mt__preload_op_copy(b, dst, src, n, kind, stream, sync));
}

static CUresult sim_set(CUdeviceptr dst, unsigned char v, size_t n, CUstream stream, bool sync)
{
    mt_backend_t *b = mt__preload_drv_backend();
    if (b == NULL)
        return mt__preload_drv_no_backend();
    return mt__preload_drv_code(mt__preload_op_set(b, (void *)(uintptr_t)dst, v, n, stream, sync));
}

/* One of the single-call operations of core.c on the current context's backend. */
static CUresult sim_op(mt__preload_sim_e what, void *obj, void **out)
{
    mt_backend_t *b = mt__preload_drv_backend();
    if (b == NULL)
        return mt__preload_drv_no_backend();
    return mt__preload_drv_code(mt__preload_op_sim(b, what, obj, out));
}

#define DP(x) ((void *)(uintptr_t)(x))

MT_HOOK CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    FORWARD(cuMemcpyHtoD_v2, dst, src, n);
    return sim_copy(DP(dst), src, n, MT_MEMCPY_HOST_TO_DEVICE, NULL, true);
}

MT_HOOK CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    FORWARD(cuMemcpyDtoH_v2, dst, src, n);
    return sim_copy(dst, DP(src), n, MT_MEMCPY_DEVICE_TO_HOST, NULL, true);
}

MT_HOOK CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    FORWARD(cuMemcpyDtoD_v2, dst, src, n);
    return sim_copy(DP(dst), DP(src), n, MT_MEMCPY_DEVICE_TO_DEVICE, NULL, false);
}

MT_HOOK CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    FORWARD(cuMemcpy, dst, src, n);
    return sim_copy(DP(dst), DP(src), n, MT_MEMCPY_DEFAULT, NULL, true);
}

MT_HOOK CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    FORWARD(cuMemcpyHtoDAsync_v2, dst, src, n, s);
    return sim_copy(DP(dst), src, n, MT_MEMCPY_HOST_TO_DEVICE, s, false);
}

MT_HOOK CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    FORWARD(cuMemcpyDtoHAsync_v2, dst, src, n, s);
    return sim_copy(dst, DP(src), n, MT_MEMCPY_DEVICE_TO_HOST, s, false);
}

MT_HOOK CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    FORWARD(cuMemcpyAsync, dst, src, n, s);
    return sim_copy(DP(dst), DP(src), n, MT_MEMCPY_DEFAULT, s, false);
}

MT_HOOK CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char uc, size_t n)
{
    FORWARD(cuMemsetD8_v2, dst, uc, n);
    return sim_set(dst, uc, n, NULL, true);
}

MT_HOOK CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n, CUstream s)
{
    FORWARD(cuMemsetD8Async, dst, uc, n, s);
    return sim_set(dst, uc, n, s, false);
}

MT_HOOK CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    FORWARD(cuStreamCreate, phStream, Flags);
    if (phStream == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_op(MT_PRELOAD_STREAM_CREATE, NULL, (void **)phStream);
}

MT_HOOK CUresult cuStreamDestroy_v2(CUstream hStream)
{
    if (!mt__preload()->sim)
        mt__preload_stream_forget(hStream); /* the driver may hand the handle out again */
    FORWARD(cuStreamDestroy_v2, hStream);
    mt_backend_t *b = mt__preload_drv_backend();
    if (b == NULL)
        return mt__preload_drv_no_backend();
    if ((uintptr_t)hStream <= 2)
        return CUDA_ERROR_INVALID_HANDLE;
    return mt__preload_drv_code(mt__preload_op_sim(b, MT_PRELOAD_STREAM_DESTROY, hStream, NULL));
}

MT_HOOK CUresult cuStreamSynchronize(CUstream hStream)
{
    FORWARD(cuStreamSynchronize, hStream);
    mt_backend_t *b = mt__preload_drv_backend();
    if (b == NULL)
        return mt__preload_drv_no_backend();
    return mt__preload_drv_code(mt__preload_op_stream_sync(b, hStream));
}

MT_HOOK CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    FORWARD(cuEventCreate, phEvent, Flags);
    if (phEvent == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_op(MT_PRELOAD_EVENT_CREATE, NULL, (void **)phEvent);
}

MT_HOOK CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    FORWARD(cuEventRecord, hEvent, hStream);
    mt_backend_t *b = mt__preload_drv_backend();
    if (b == NULL)
        return mt__preload_drv_no_backend();
    if (hEvent == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    return mt__preload_drv_code(mt__preload_op_event_record(b, hEvent, hStream));
}

MT_HOOK CUresult cuEventQuery(CUevent hEvent)
{
    FORWARD(cuEventQuery, hEvent);
    mt_backend_t *b = mt__preload_drv_backend();
    if (b == NULL)
        return mt__preload_drv_no_backend();
    if (hEvent == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    return mt__preload_drv_code(mt__preload_op_sim(b, MT_PRELOAD_EVENT_QUERY, hEvent, NULL));
}

MT_HOOK CUresult cuEventSynchronize(CUevent hEvent)
{
    FORWARD(cuEventSynchronize, hEvent);
    mt_backend_t *b = mt__preload_drv_backend();
    if (b == NULL)
        return mt__preload_drv_no_backend();
    if (hEvent == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    return mt__preload_drv_code(mt__preload_op_sim(b, MT_PRELOAD_EVENT_SYNC, hEvent, NULL));
}

MT_HOOK CUresult cuEventDestroy_v2(CUevent hEvent)
{
    FORWARD(cuEventDestroy_v2, hEvent);
    mt_backend_t *b = mt__preload_drv_backend();
    if (b == NULL)
        return mt__preload_drv_no_backend();
    if (hEvent == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    return mt__preload_drv_code(mt__preload_op_sim(b, MT_PRELOAD_EVENT_DESTROY, hEvent, NULL));
}
