/* The fake runtime (tests/preload/fake_libcudart.c) with the call the gpu-check programs
 * need beyond it, cudaMemset, for gpu_check.sh --fake only. It is one object with the fake
 * runtime, because the drop-in reaches the runtime with dlsym(RTLD_NEXT), which the fake
 * answers from its own object. The call reaches the driver as the fake runtime does
 * (MEMTRACE_LIBCUDA) and records its error for cudaGetLastError. */
#include "../preload/fake_libcudart.c"

static struct {
    CUresult (*SetD8)(CUdeviceptr, unsigned char, size_t);
} ex;

static pthread_once_t ex_once = PTHREAD_ONCE_INIT;

static void ex_load(void)
{
    const char *path = getenv("MEMTRACE_LIBCUDA");
    void *h = dlopen(path ? path : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL)
        return;
    *(void **)&ex.SetD8 = dlsym(h, "cuMemsetD8_v2");
}

RT_API cudaError_t cudaMemset(void *p, int v, size_t n)
{
    READY();
    pthread_once(&ex_once, ex_load);
    return ret(ex.SetD8 ? from_cu(ex.SetD8(DP(p), (unsigned char)v, n)) : cudaErrorNotSupported);
}
