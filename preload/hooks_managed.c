/* The program's own managed (unified) memory, served and recorded by memtrace: the
 * runtime's cudaMallocManaged and the driver's cuMemAllocManaged attached globally come
 * from a managed allocator of the current device (mt__preload_managed_alloc), and
 * prefetches and advice on ranges in memtrace's blocks go to mt_alloc_prefetch and
 * mt_alloc_advise, so each is an event. Everything else passes through unchanged: an
 * allocation attached to the host or a stream (memtrace has no counterpart of those
 * attachments), and prefetches and advice on memory memtrace did not hand out. On sim
 * there is nothing to pass through to: those calls fail (cudaErrorNotSupported or
 * cudaErrorInvalidValue, as the driver would for memory it does not know).
 *
 * The hooks take the location forms of CUDA 12.2+ (the only ones CUDA 13's runtime
 * declares, under the unsuffixed names) and the driver's old device-ordinal forms under
 * their own symbols (cuMemPrefetchAsync, cuMemAdvise). The runtime's unsuffixed names
 * are the old device-ordinal forms before CUDA 13: which one the program called is told
 * by the version of the runtime in the process (cudaRuntimeGetVersion). */
#include <stdint.h>
#include <string.h>

#include "mt_config.h"
#include "preload/hooks_cuda.h"
#undef FORWARD
#undef REAL
#include "preload/hooks_rt.h"
#undef FORWARD

/* cuda.h maps these names to the location forms; the driver still exports the old ones. */
#undef cuMemPrefetchAsync
#undef cuMemAdvise
CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream);
CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                 CUstream hStream);
CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                    unsigned int flags, CUstream hStream);
CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device);
cudaError_t cudaMemPrefetchAsync_ptsz(const void *devPtr, size_t count,
                                      struct cudaMemLocation location, unsigned int flags,
                                      cudaStream_t stream);
cudaError_t cudaMemPrefetchAsync_v2(const void *devPtr, size_t count,
                                    struct cudaMemLocation location, unsigned int flags,
                                    cudaStream_t stream);
cudaError_t cudaMemAdvise_v2(const void *devPtr, size_t count, enum cudaMemoryAdvise advice,
                             struct cudaMemLocation location);

/* The real entry point `name` (the runtime's, rt, or the driver's), looked up once. */
#define REAL_OF(lookup, name)                                                                      \
    ({                                                                                             \
        static _Atomic(void *) r_;                                                                 \
        void *f_ = atomic_load_explicit(&r_, memory_order_relaxed);                                \
        if (f_ == NULL) {                                                                          \
            f_ = lookup(#name);                                                                    \
            atomic_store_explicit(&r_, f_, memory_order_relaxed);                                  \
        }                                                                                          \
        (__typeof__(&name))f_;                                                                     \
    })
#define REAL_RT(name)  REAL_OF(mt__preload_real_rt, name)
#define REAL_DRV(name) REAL_OF(mt__preload_real_drv, name)

/* ---- allocation ---- */

/* Serves size bytes of managed memory on device from its managed allocator. */
static int managed_malloc(int device, size_t size, void **p)
{
    mt_alloc_t *a = NULL;
    int rc = mt__preload_managed_alloc(device, &a);
    mt__guard_enter();
    if (rc == 0)
        rc = mt_alloc_malloc(a, size, NULL, mt__preload_tag(), p);
    mt__guard_leave();
    /* Managed memory competes with the devices' caches for the driver's memory (the
     * managed allocator emptied only its own): as for the driver's other allocations,
     * the caches go back and the request is made once more. */
    if (rc == MT_ENOMEM && mt__preload_release_cached()) {
        mt__guard_enter();
        rc = mt_alloc_malloc(a, size, NULL, mt__preload_tag(), p);
        mt__guard_leave();
    }
    if (rc == 0)
        (void)mt__preload_ordered_take(*p); /* an old stream-ordered address reused */
    if (rc == MT_ENOMEM)
        mt__preload_note_oom(a, size);
    return rc;
}

MT_HOOK cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    if (flags != cudaMemAttachGlobal) {
        if (flags != cudaMemAttachHost)
            return mt__preload_rt_ret(cudaErrorInvalidValue);
        if (mt__preload()->sim)
            return mt__preload_rt_ret(cudaErrorNotSupported); /* no driver to serve it */
        __typeof__(&cudaMallocManaged) real = REAL_RT(cudaMallocManaged);
        if (real == NULL)
            return mt__preload_rt_ret(cudaErrorInsufficientDriver);
        return real(devPtr, size, flags);
    }
    if (devPtr == NULL || size == 0) /* cudaMallocManaged refuses 0 bytes */
        return mt__preload_rt_ret(cudaErrorInvalidValue);
    return mt__preload_rt_ret(
        mt__preload_rt_code(managed_malloc(mt__preload_rt_device(), size, devPtr)));
}

MT_HOOK CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL) {
        /* The driver's, with the cache given back when the driver runs out. */
        if (mt__preload()->sim)
            return CUDA_ERROR_NOT_SUPPORTED;
        __typeof__(&cuMemAllocManaged) f = REAL_DRV(cuMemAllocManaged);
        if (f == NULL)
            return CUDA_ERROR_NOT_FOUND;
        CUresult r = f(dptr, bytesize, flags);
        if (r == CUDA_ERROR_OUT_OF_MEMORY && mt__preload_release_cached())
            r = f(dptr, bytesize, flags);
        return r;
    }
    if (dptr == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = mt__preload_drv_device();
    if (dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    void *q = NULL;
    int rc = managed_malloc(dev, bytesize, &q);
    if (rc == 0)
        *dptr = (CUdeviceptr)(uintptr_t)q;
    return mt__preload_drv_code(rc);
}

/* ---- prefetch and advice ---- */

/* The allocator that handed out the block ptr lies in, or NULL: not memtrace's. */
static mt_alloc_t *owner(const void *ptr)
{
    mt_alloc_t *a = NULL;
    if (ptr == NULL || mt__preload()->init_rc != 0)
        return NULL;
    mt__guard_enter();
    int rc = mt__preload_alloc_of(ptr, &a);
    mt__guard_leave();
    return rc == 0 ? a : NULL;
}

int mt__preload_managed_op(bool prefetch, const void *ptr, size_t n, int advice, int location,
                           void *stream)
{
    mt_alloc_t *a = owner(ptr);
    if (a == NULL)
        return MT_ENOENT;
    mt_stream_t *s = NULL;
    int rc = 0;
    mt__guard_enter();
    if (prefetch) {
        rc = mt__preload_stream(mt_alloc_backend(a), stream, &s);
        if (rc == 0)
            rc = mt_alloc_prefetch(a, ptr, n, location, s);
    } else {
        rc = mt_alloc_advise(a, ptr, n, advice, location);
    }
    mt__guard_leave();
    return rc;
}

/* A location as mt_alloc_* takes it (a device ordinal or MT_MANAGED_HOST); host NUMA
 * nodes are the host to memtrace. MT_EINVAL for anything else. */
static int loc_of(int type, int id, int *out)
{
    switch (type) {
    case CU_MEM_LOCATION_TYPE_DEVICE: /* the runtime's numbers are the driver's */
        *out = id;
        return id < 0 ? MT_EINVAL : 0;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        *out = MT_MANAGED_HOST;
        return 0;
    default:
        return MT_EINVAL;
    }
}

/* The old forms' device ordinal: CU_DEVICE_CPU (cudaCpuDeviceId) is the host. */
static int loc_of_device(int dev)
{
    return dev == CU_DEVICE_CPU ? MT_MANAGED_HOST : dev;
}

/* Whether the runtime in the process is older than CUDA 13, whose unsuffixed
 * cudaMemPrefetchAsync and cudaMemAdvise take a device ordinal where 13's take a
 * cudaMemLocation. Without a runtime to ask (none, or one without the call), 13's. */
static bool rt_old_forms(void)
{
    static _Atomic int known; /* 0 not asked, 1 old, 2 new: a constant, safe to race on */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k == 0) {
        cudaError_t (*ver)(int *) =
            (cudaError_t(*)(int *))mt__preload_real_rt("cudaRuntimeGetVersion");
        int v = 0;
        mt__guard_enter();
        k = ver != NULL && ver(&v) == cudaSuccess && v > 0 && v < 13000 ? 1 : 2;
        mt__guard_leave();
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k == 1;
}

/* Runtime: memtrace's range, or the real runtime's (rt_forward NULL on sim). */
static cudaError_t rt_prefetch(const void *p, size_t n, struct cudaMemLocation loc, unsigned flags,
                               cudaStream_t s, __typeof__(&cudaMemPrefetchAsync) real)
{
    if (owner(p) == NULL) {
        if (mt__preload()->sim)
            return mt__preload_rt_ret(cudaErrorInvalidValue);
        if (real == NULL)
            return mt__preload_rt_ret(cudaErrorInsufficientDriver);
        return real(p, n, loc, flags, s);
    }
    int where = 0;
    int rc = flags != 0 ? MT_EINVAL : loc_of((int)loc.type, loc.id, &where);
    if (rc == 0)
        rc = mt__preload_managed_op(true, p, n, 0, where, s);
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
}

/* The runtime's unsuffixed prefetch in both of its forms (x86-64 and aarch64 pass both
 * in the same registers): CUDA 13's (ptr, n, struct cudaMemLocation, unsigned flags,
 * stream) and the older (ptr, n, int device, stream). The old form's device arrives as
 * the location's first member and its stream as the fourth argument's register, so that
 * argument is taken whole. */
typedef cudaError_t (*rt_prefetch_old_fn)(const void *, size_t, int, cudaStream_t);

static cudaError_t rt_prefetch_any(const void *p, size_t n, struct cudaMemLocation loc,
                                   unsigned long long arg4, cudaStream_t stream, bool pt,
                                   void *real)
{
    if (rt_old_forms()) {
        int dev = (int)loc.type;
        cudaStream_t s = (cudaStream_t)(uintptr_t)arg4;
        if (owner(p) == NULL) {
            if (mt__preload()->sim)
                return mt__preload_rt_ret(cudaErrorInvalidValue);
            if (real == NULL)
                return mt__preload_rt_ret(cudaErrorInsufficientDriver);
            return ((rt_prefetch_old_fn)real)(p, n, dev, s);
        }
        if (pt && s == NULL)
            s = cudaStreamPerThread;
        int where = dev == cudaCpuDeviceId ? MT_MANAGED_HOST : dev;
        return mt__preload_rt_ret(
            mt__preload_rt_code(mt__preload_managed_op(true, p, n, 0, where, s)));
    }
    if (pt && stream == NULL)
        stream = cudaStreamPerThread;
    return rt_prefetch(p, n, loc, (unsigned)arg4, stream, (__typeof__(&cudaMemPrefetchAsync))real);
}

cudaError_t mt__rt_prefetch_hook(const void *devPtr, size_t count, struct cudaMemLocation location,
                                 unsigned long long arg4,
                                 cudaStream_t stream) __asm__("cudaMemPrefetchAsync");
cudaError_t mt__rt_prefetch_pt_hook(const void *devPtr, size_t count,
                                    struct cudaMemLocation location, unsigned long long arg4,
                                    cudaStream_t stream) __asm__("cudaMemPrefetchAsync_ptsz");

MT_HOOK cudaError_t mt__rt_prefetch_hook(const void *devPtr, size_t count,
                                         struct cudaMemLocation location, unsigned long long arg4,
                                         cudaStream_t stream)
{
    return rt_prefetch_any(devPtr, count, location, arg4, stream, false,
                           mt__preload_real_rt("cudaMemPrefetchAsync"));
}

MT_HOOK cudaError_t mt__rt_prefetch_pt_hook(const void *devPtr, size_t count,
                                            struct cudaMemLocation location,
                                            unsigned long long arg4, cudaStream_t stream)
{
    return rt_prefetch_any(devPtr, count, location, arg4, stream, true,
                           mt__preload_real_rt("cudaMemPrefetchAsync_ptsz"));
}

/* CUDA 12.2-12.9's name of the location form. */
MT_HOOK cudaError_t cudaMemPrefetchAsync_v2(const void *devPtr, size_t count,
                                            struct cudaMemLocation location, unsigned int flags,
                                            cudaStream_t stream)
{
    return rt_prefetch(devPtr, count, location, flags, stream, REAL_RT(cudaMemPrefetchAsync_v2));
}

static cudaError_t rt_advise(const void *p, size_t n, enum cudaMemoryAdvise advice,
                             struct cudaMemLocation loc, __typeof__(&cudaMemAdvise) real, bool any)
{
    /* Before CUDA 13 the unsuffixed advise took (ptr, n, advice, int device): the device
     * arrives as the location's first member. */
    bool old = any && rt_old_forms();
    if (owner(p) == NULL) {
        if (old && !mt__preload()->sim && real != NULL)
            return ((cudaError_t(*)(const void *, size_t, enum cudaMemoryAdvise, int))(void *)real)(
                p, n, advice, (int)loc.type);
        if (mt__preload()->sim)
            return mt__preload_rt_ret(cudaErrorInvalidValue);
        if (real == NULL)
            return mt__preload_rt_ret(cudaErrorInsufficientDriver);
        return real(p, n, advice, loc);
    }
    int where = 0;
    int rc = old ? 0 : loc_of((int)loc.type, loc.id, &where);
    if (old)
        where = (int)loc.type == cudaCpuDeviceId ? MT_MANAGED_HOST : (int)loc.type;
    /* Unsetting a preference names no location: any the driver would take is accepted. */
    if (rc != 0 &&
        (advice == cudaMemAdviseSetReadMostly || advice == cudaMemAdviseUnsetReadMostly ||
         advice == cudaMemAdviseUnsetPreferredLocation))
        rc = 0, where = MT_MANAGED_HOST;
    if (rc == 0)
        rc = mt__preload_managed_op(false, p, n, (int)advice, where, NULL);
    return mt__preload_rt_ret(mt__preload_rt_code(rc));
}

MT_HOOK cudaError_t cudaMemAdvise(const void *devPtr, size_t count, enum cudaMemoryAdvise advice,
                                  struct cudaMemLocation location)
{
    return rt_advise(devPtr, count, advice, location, REAL_RT(cudaMemAdvise), true);
}

MT_HOOK cudaError_t cudaMemAdvise_v2(const void *devPtr, size_t count, enum cudaMemoryAdvise advice,
                                     struct cudaMemLocation location)
{
    return rt_advise(devPtr, count, advice, location, REAL_RT(cudaMemAdvise_v2), false);
}

/* Driver: memtrace's range (where already resolved from the call's location form), or
 * the real driver's (NOT_FOUND without one; INVALID_VALUE on sim). */
#define DRV_PASS(name, ...)                                                                        \
    do {                                                                                           \
        if (owner((const void *)(uintptr_t)devPtr) == NULL) {                                      \
            if (mt__preload()->sim)                                                                \
                return CUDA_ERROR_INVALID_VALUE;                                                   \
            __typeof__(&name) f_ = REAL_DRV(name);                                                 \
            return f_ != NULL ? f_(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND;                            \
        }                                                                                          \
    } while (0)

static CUresult drv_prefetch(CUdeviceptr devPtr, size_t count, int rc, int where, CUstream s)
{
    if (rc == 0)
        rc = mt__preload_managed_op(true, (const void *)(uintptr_t)devPtr, count, 0, where, s);
    return mt__preload_drv_code(rc);
}

MT_HOOK CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                    CUstream hStream)
{
    DRV_PASS(cuMemPrefetchAsync, devPtr, count, dstDevice, hStream);
    return drv_prefetch(devPtr, count, 0, loc_of_device(dstDevice), hStream);
}

MT_HOOK CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                         CUstream hStream)
{
    DRV_PASS(cuMemPrefetchAsync_ptsz, devPtr, count, dstDevice, hStream);
    CUstream s = hStream == NULL ? CU_STREAM_PER_THREAD : hStream;
    return drv_prefetch(devPtr, count, 0, loc_of_device(dstDevice), s);
}

MT_HOOK CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                       unsigned int flags, CUstream hStream)
{
    DRV_PASS(cuMemPrefetchAsync_v2, devPtr, count, location, flags, hStream);
    int where = 0;
    int rc = flags != 0 ? MT_EINVAL : loc_of((int)location.type, location.id, &where);
    return drv_prefetch(devPtr, count, rc, where, hStream);
}

MT_HOOK CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count,
                                            CUmemLocation location, unsigned int flags,
                                            CUstream hStream)
{
    DRV_PASS(cuMemPrefetchAsync_v2_ptsz, devPtr, count, location, flags, hStream);
    int where = 0;
    int rc = flags != 0 ? MT_EINVAL : loc_of((int)location.type, location.id, &where);
    CUstream s = hStream == NULL ? CU_STREAM_PER_THREAD : hStream;
    return drv_prefetch(devPtr, count, rc, where, s);
}

MT_HOOK CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device)
{
    DRV_PASS(cuMemAdvise, devPtr, count, advice, device);
    return mt__preload_drv_code(mt__preload_managed_op(
        false, (const void *)(uintptr_t)devPtr, count, (int)advice, loc_of_device(device), NULL));
}

MT_HOOK CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                CUmemLocation location)
{
    DRV_PASS(cuMemAdvise_v2, devPtr, count, advice, location);
    int where = 0;
    int rc = loc_of((int)location.type, location.id, &where);
    if (rc != 0 &&
        (advice == CU_MEM_ADVISE_SET_READ_MOSTLY || advice == CU_MEM_ADVISE_UNSET_READ_MOSTLY ||
         advice == CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION))
        rc = 0, where = MT_MANAGED_HOST;
    if (rc == 0)
        rc = mt__preload_managed_op(false, (const void *)(uintptr_t)devPtr, count, (int)advice,
                                    where, NULL);
    return mt__preload_drv_code(rc);
}

/* ---- lookup (dlsym and cuGetProcAddress) ---- */

static const struct {
    const char *name;
    void *fn;
} managed_hooks[] = {
    {"cudaMallocManaged", (void *)cudaMallocManaged},
    {"cudaMemPrefetchAsync", (void *)cudaMemPrefetchAsync},
    {"cudaMemPrefetchAsync_ptsz", (void *)cudaMemPrefetchAsync_ptsz},
    {"cudaMemPrefetchAsync_v2", (void *)cudaMemPrefetchAsync_v2},
    {"cudaMemAdvise", (void *)cudaMemAdvise},
    {"cudaMemAdvise_v2", (void *)cudaMemAdvise_v2},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged},
    {"cuMemPrefetchAsync", (void *)cuMemPrefetchAsync},
    {"cuMemPrefetchAsync_ptsz", (void *)cuMemPrefetchAsync_ptsz},
    {"cuMemPrefetchAsync_v2", (void *)cuMemPrefetchAsync_v2},
    {"cuMemPrefetchAsync_v2_ptsz", (void *)cuMemPrefetchAsync_v2_ptsz},
    {"cuMemAdvise", (void *)cuMemAdvise},
    {"cuMemAdvise_v2", (void *)cuMemAdvise_v2},
};

void *mt__preload_managed_hook(const char *name)
{
    if (strncmp(name, "cu", 2) != 0)
        return NULL;
    for (size_t i = 0; i < sizeof managed_hooks / sizeof managed_hooks[0]; i++)
        if (strcmp(managed_hooks[i].name, name) == 0)
            return managed_hooks[i].fn;
    return NULL;
}

/* cuGetProcAddress's base names: the location forms from CUDA 12.2 (12020) on. */
void *mt__preload_managed_proc(const char *base, int cuda_version, bool per_thread)
{
    bool v2 = cuda_version >= 12020;
    if (strcmp(base, "cuMemAllocManaged") == 0)
        return (void *)cuMemAllocManaged;
    if (strcmp(base, "cuMemPrefetchAsync") == 0)
        return v2 ? (per_thread ? (void *)cuMemPrefetchAsync_v2_ptsz
                                : (void *)cuMemPrefetchAsync_v2)
                  : (per_thread ? (void *)cuMemPrefetchAsync_ptsz : (void *)cuMemPrefetchAsync);
    if (strcmp(base, "cuMemAdvise") == 0)
        return v2 ? (void *)cuMemAdvise_v2 : (void *)cuMemAdvise;
    return NULL;
}
