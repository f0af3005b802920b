/* The fake runtime (tests/preload/fake_libcudart.c) with the two calls the gpu-check
 * programs need beyond it, cudaMemcpy and cudaMemset, for gpu_check.sh --fake only. It is
 * one object with the fake runtime, because the drop-in reaches the runtime with
 * dlsym(RTLD_NEXT), which the fake answers from its own object. The calls reach the
 * driver as the fake runtime does (MEMTRACE_LIBCUDA), record their errors for
 * cudaGetLastError, and answer cudaErrorInvalidMemcpyDirection for an unknown kind. */
#include "../preload/fake_libcudart.c"

#include <string.h>

static struct {
    CUresult (*HtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*DtoH)(void *, CUdeviceptr, size_t);
    CUresult (*SetD8)(CUdeviceptr, unsigned char, size_t);
} ex;

static pthread_once_t ex_once = PTHREAD_ONCE_INIT;

static void ex_load(void)
{
    const char *path = getenv("MEMTRACE_LIBCUDA");
    void *h = dlopen(path ? path : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL)
        return;
    *(void **)&ex.HtoD = dlsym(h, "cuMemcpyHtoD_v2");
    *(void **)&ex.DtoH = dlsym(h, "cuMemcpyDtoH_v2");
    *(void **)&ex.SetD8 = dlsym(h, "cuMemsetD8_v2");
}

RT_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    READY();
    pthread_once(&ex_once, ex_load);
    switch (kind) {
    case cudaMemcpyHostToHost:
        memmove(dst, src, n);
        return cudaSuccess;
    case cudaMemcpyHostToDevice:
        return ret(ex.HtoD ? from_cu(ex.HtoD(DP(dst), src, n)) : cudaErrorNotSupported);
    case cudaMemcpyDeviceToHost:
        return ret(ex.DtoH ? from_cu(ex.DtoH(dst, DP(src), n)) : cudaErrorNotSupported);
    default:
        return ret(cudaErrorInvalidMemcpyDirection);
    }
}

RT_API cudaError_t cudaMemset(void *p, int v, size_t n)
{
    READY();
    pthread_once(&ex_once, ex_load);
    return ret(ex.SetD8 ? from_cu(ex.SetD8(DP(p), (unsigned char)v, n)) : cudaErrorNotSupported);
}
