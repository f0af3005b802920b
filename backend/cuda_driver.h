/* The CUDA driver entry points the cuda backend uses, resolved at run time.
 *
 * libcuda.so.1 is never linked: it is dlopen'ed, as the CUDA runtime does, so memtrace
 * binaries start on machines without a driver (this one has none). The path can be
 * overridden with MEMTRACE_LIBCUDA so tests point it at a fake driver built on host
 * memory. Honest note: on this project's build machines the table has only ever been
 * filled from that fake; nothing here has run against a real GPU driver. */
#ifndef MT_ALLOCATOR_CUDA_DRIVER_H
#define MT_ALLOCATOR_CUDA_DRIVER_H

#include <cuda.h>

/* One function pointer per driver entry point, named after the base name. Every field
 * but the optional ones at the end is non-NULL after a successful mt__cuda_driver_open. */
typedef struct mt_cuda_driver_s {
    void *lib; /* dlopen handle, closed by mt__cuda_driver_close */
    CUresult (*Init)(unsigned int flags);
    CUresult (*DeviceGetCount)(int *count);
    CUresult (*DeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice dev);
    CUresult (*CtxPushCurrent)(CUcontext ctx);
    CUresult (*CtxPopCurrent)(CUcontext *ctx);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemAlloc)(CUdeviceptr *p, size_t size);
    CUresult (*MemFree)(CUdeviceptr p);
    CUresult (*MemGetInfo)(size_t *free_b, size_t *total_b);
    CUresult (*MemHostAlloc)(void **p, size_t size, unsigned int flags);
    CUresult (*MemFreeHost)(void *p);
    CUresult (*StreamCreate)(CUstream *s, unsigned int flags);
    CUresult (*StreamDestroy)(CUstream s);
    CUresult (*StreamSynchronize)(CUstream s);
    CUresult (*StreamWaitEvent)(CUstream s, CUevent ev, unsigned int flags);
    CUresult (*LaunchHostFunc)(CUstream s, CUhostFn fn, void *ud);
    CUresult (*MemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
    CUresult (*MemcpyPeerAsync)(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                                CUcontext src_ctx, size_t n, CUstream s);
    CUresult (*CtxEnablePeerAccess)(CUcontext peer, unsigned int flags);
    CUresult (*MemsetD8Async)(CUdeviceptr dst, unsigned char v, size_t n, CUstream s);
    CUresult (*EventCreate)(CUevent *ev, unsigned int flags);
    CUresult (*EventDestroy)(CUevent ev);
    CUresult (*EventRecord)(CUevent ev, CUstream s);
    CUresult (*EventQuery)(CUevent ev);
    CUresult (*EventSynchronize)(CUevent ev);
    CUresult (*EventElapsedTime)(float *ms, CUevent start, CUevent end);
    CUresult (*MemAddressReserve)(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                  unsigned long long flags);
    CUresult (*MemAddressFree)(CUdeviceptr p, size_t size);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *h, size_t size,
                          const CUmemAllocationProp *prop, unsigned long long flags);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle h);
    CUresult (*MemMap)(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
                       unsigned long long flags);
    CUresult (*MemUnmap)(CUdeviceptr p, size_t size);
    CUresult (*MemSetAccess)(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count);
    CUresult (*MemGetAllocationGranularity)(size_t *g, const CUmemAllocationProp *prop,
                                            CUmemAllocationGranularity_flags opt);
    /* Optional: NULL when the driver lacks them (managed memory is then MT_ENOTSUP). The
     * location forms are the CUDA 12.2+ _v2 entry points, the only ones CUDA 13 declares. */
    CUresult (*MemAllocManaged)(CUdeviceptr *p, size_t size, unsigned int flags);
    CUresult (*MemPrefetchAsync)(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags,
                                 CUstream s);
    CUresult (*MemAdvise)(CUdeviceptr p, size_t n, CUmem_advise advice, CUmemLocation loc);
    /* Optional: the device's PCI bus id, which names it to NVML (cuda_nvml.c). */
    CUresult (*DeviceGetPCIBusId)(char *bus, int len, CUdevice dev);
    /* Optional: whether one device can reach another's memory (cuda_peer_access capable). */
    CUresult (*DeviceCanAccessPeer)(int *can, CUdevice dev, CUdevice peer);
    /* Optional (CUDA 10.1+): the calling thread's capture mode, switched to relaxed around
     * the device allocations made for a capture (cuda_mem.c). */
    CUresult (*ThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *mode);
} mt_cuda_driver_t;

/* Opens the driver library (MEMTRACE_LIBCUDA, else "libcuda.so.1") and resolves every
 * entry point. Returns MT_ENODEV when the library or a symbol is missing; err receives a
 * one-line reason. On failure nothing stays open. */
int mt__cuda_driver_open(mt_cuda_driver_t *d, char *err, size_t errlen);
void mt__cuda_driver_close(mt_cuda_driver_t *d);

/* Maps a CUresult to an MT_E* code (0 for CUDA_SUCCESS). */
int mt__cuda_result_to_mt(int res);

#endif
