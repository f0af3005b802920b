/* Run-time loading of the CUDA driver (see cuda_driver.h for why it is never linked). */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "backend/cuda_driver.h"

/* Exported names, newest ABI first: the driver keeps the old unversioned symbols for
 * binaries built against old headers, and those have different semantics (32-bit sizes
 * for cuMemAlloc), so the _v2 names must win. */
typedef struct sym_s {
    size_t off;
    const char *names[2];
    bool optional; /* missing: the field stays NULL and the driver still opens */
} sym_t;

#define SYM(field, a, b)                                                                           \
    {                                                                                              \
        offsetof(mt_cuda_driver_t, field), {a, b}, false                                           \
    }

static const sym_t syms[] = {
    SYM(Init, "cuInit", NULL),
    SYM(DeviceGetCount, "cuDeviceGetCount", NULL),
    SYM(DeviceGet, "cuDeviceGet", NULL),
    SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL),
    SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
    SYM(CtxPushCurrent, "cuCtxPushCurrent_v2", "cuCtxPushCurrent"),
    SYM(CtxPopCurrent, "cuCtxPopCurrent_v2", "cuCtxPopCurrent"),
    SYM(CtxSynchronize, "cuCtxSynchronize", NULL),
    SYM(MemAlloc, "cuMemAlloc_v2", NULL),
    SYM(MemFree, "cuMemFree_v2", NULL),
    SYM(MemGetInfo, "cuMemGetInfo_v2", NULL),
    SYM(MemHostAlloc, "cuMemHostAlloc", NULL),
    SYM(MemFreeHost, "cuMemFreeHost", NULL),
    SYM(StreamCreate, "cuStreamCreate", NULL),
    SYM(StreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy"),
    SYM(StreamSynchronize, "cuStreamSynchronize", NULL),
    SYM(StreamWaitEvent, "cuStreamWaitEvent", NULL),
    SYM(LaunchHostFunc, "cuLaunchHostFunc", NULL),
    SYM(MemcpyAsync, "cuMemcpyAsync", NULL),
    SYM(MemcpyPeerAsync, "cuMemcpyPeerAsync", NULL),
    SYM(CtxEnablePeerAccess, "cuCtxEnablePeerAccess", NULL),
    SYM(MemsetD8Async, "cuMemsetD8Async", NULL),
    SYM(EventCreate, "cuEventCreate", NULL),
    SYM(EventDestroy, "cuEventDestroy_v2", "cuEventDestroy"),
    SYM(EventRecord, "cuEventRecord", NULL),
    SYM(EventQuery, "cuEventQuery", NULL),
    SYM(EventSynchronize, "cuEventSynchronize", NULL),
    SYM(EventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
    SYM(MemAddressReserve, "cuMemAddressReserve", NULL),
    SYM(MemAddressFree, "cuMemAddressFree", NULL),
    SYM(MemCreate, "cuMemCreate", NULL),
    SYM(MemRelease, "cuMemRelease", NULL),
    SYM(MemMap, "cuMemMap", NULL),
    SYM(MemUnmap, "cuMemUnmap", NULL),
    SYM(MemSetAccess, "cuMemSetAccess", NULL),
    SYM(MemGetAllocationGranularity, "cuMemGetAllocationGranularity", NULL),
    {offsetof(mt_cuda_driver_t, MemAllocManaged), {"cuMemAllocManaged", NULL}, true},
    {offsetof(mt_cuda_driver_t, MemPrefetchAsync), {"cuMemPrefetchAsync_v2", NULL}, true},
    {offsetof(mt_cuda_driver_t, MemAdvise), {"cuMemAdvise_v2", NULL}, true},
    {offsetof(mt_cuda_driver_t, DeviceGetPCIBusId), {"cuDeviceGetPCIBusId", NULL}, true},
    {offsetof(mt_cuda_driver_t, DeviceCanAccessPeer), {"cuDeviceCanAccessPeer", NULL}, true},
    {offsetof(mt_cuda_driver_t, ThreadExchangeStreamCaptureMode),
     {"cuThreadExchangeStreamCaptureMode", NULL},
     true},
};

int mt__cuda_driver_open(mt_cuda_driver_t *d, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    const char *path = getenv("MEMTRACE_LIBCUDA");
    if (path == NULL || *path == '\0')
        path = "libcuda.so.1";
    /* RTLD_LOCAL: the driver's symbols must not become candidates for the program's own
     * lookups (the preload library defines the same names). */
    d->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (d->lib == NULL) {
        snprintf(err, errlen, "cannot load the CUDA driver %s: %s", path, dlerror());
        return MT_ENODEV;
    }
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *fn = NULL;
        for (int k = 0; k < 2 && fn == NULL && syms[i].names[k] != NULL; k++)
            fn = dlsym(d->lib, syms[i].names[k]);
        if (fn == NULL && syms[i].optional)
            continue;
        if (fn == NULL) {
            snprintf(err, errlen, "the CUDA driver %s lacks %s", path, syms[i].names[0]);
            mt__cuda_driver_close(d);
            return MT_ENODEV;
        }
        memcpy((char *)d + syms[i].off, &fn, sizeof fn);
    }
    return 0;
}

void mt__cuda_driver_close(mt_cuda_driver_t *d)
{
    if (d->lib != NULL)
        dlclose(d->lib);
    memset(d, 0, sizeof *d);
}

int mt__cuda_result_to_mt(int res)
{
    switch (res) {
    case CUDA_SUCCESS:
        return 0;
    case CUDA_ERROR_OUT_OF_MEMORY:
        return MT_ENOMEM;
    case CUDA_ERROR_NOT_READY:
        return MT_EAGAIN;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_CONTEXT:
    case CUDA_ERROR_ILLEGAL_STATE:
        return MT_EINVAL;
    case CUDA_ERROR_NOT_FOUND:
        return MT_ENOENT;
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NOT_PERMITTED:
        return MT_ENOTSUP;
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
        return MT_ENODEV;
    case CUDA_ERROR_ALREADY_MAPPED:
    case CUDA_ERROR_CONTEXT_ALREADY_IN_USE:
    case CUDA_ERROR_CAPTURED_EVENT: /* the event is a node of a graph being captured */
        return MT_EBUSY;
    default:
        return MT_EIO;
    }
}
