/* Check 6, the driver's entry points: a per-thread-stream lookup of cuMemAllocAsync with
 * cuGetProcAddress must give the same function as dlsym of cuMemAllocAsync_ptsz, so a
 * program (or a static cudart) that looks entry points up reaches memtrace's hook. */
#include <dlfcn.h>
#include <stdio.h>

#include <cuda.h>

int main(void)
{
    void *f = NULL;
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUdevice dev = 0;
    CUcontext c = NULL;
    CUresult i = cuInit(0);
    if (i == CUDA_SUCCESS)
        i = cuDeviceGet(&dev, 0);
    if (i == CUDA_SUCCESS)
        i = cuDevicePrimaryCtxRetain(&c, dev);
    if (i == CUDA_SUCCESS)
        i = cuCtxSetCurrent(c);
    CUresult r = cuGetProcAddress("cuMemAllocAsync", &f, CUDA_VERSION,
                                  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q);
    void *d = dlsym(RTLD_DEFAULT, "cuMemAllocAsync_ptsz");
    int same = f != NULL && f == d;
    printf("init=%d cuGetProcAddress=%d found=%d dlsym=%s same=%s\n", i, r,
           q == CU_GET_PROC_ADDRESS_SUCCESS, d ? "found" : "NULL", same ? "yes" : "no");
    CUdeviceptr p = 0;
    CUresult a = f ? ((CUresult(*)(CUdeviceptr *, size_t, CUstream))f)(&p, 1 << 20, NULL)
                   : CUDA_ERROR_NOT_FOUND;
    CUresult s = cuStreamSynchronize(NULL);
    CUresult x = cuMemFreeAsync(p, NULL);
    CUresult s2 = cuStreamSynchronize(NULL);
    printf("through it: cuMemAllocAsync=%d sync=%d cuMemFreeAsync=%d sync=%d\n", a, s, x, s2);
    int bad = i || r || !same || a || s || x || s2;
    printf("%s\n", bad ? "FAIL" : "ok");
    return bad;
}
