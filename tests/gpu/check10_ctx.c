/* Check 10 (finding N10): memory of a context made with cuCtxCreate must work in that
 * context; then a cuCtxDestroy of the primary context while a block is live must not free
 * the block behind the program's back. Driver only. Prints every CUresult. */
#include <stdio.h>
#include <string.h>

#include <cuda.h>

enum { N = 4096 };

static int bytes_are(CUdeviceptr d, unsigned char v, CUresult *r)
{
    static unsigned char out[N];
    memset(out, 0, N);
    *r = cuMemcpyDtoH(out, d, N);
    for (int i = 0; i < N; i++)
        if (out[i] != v)
            return 0;
    return 1;
}

int main(void)
{
    CUdevice dev = 0;
    CUresult i0 = cuInit(0), i1 = cuDeviceGet(&dev, 0);
    printf("cuInit=%d cuDeviceGet=%d\n", i0, i1);
    int bad = i0 || i1, partA = 1;

    CUcontext ctx = NULL;
    CUresult c = cuCtxCreate(&ctx, NULL, 0, dev);
    if (c == CUDA_ERROR_NOT_SUPPORTED) {
        printf("A: cuCtxCreate=%d (not supported here)\n", c);
        partA = 0;
    } else {
        CUdeviceptr d = 0;
        CUresult a = cuMemAlloc(&d, N), m = cuMemsetD8(d, 0x5a, N), s = cuCtxSynchronize(), cp;
        int ok = bytes_are(d, 0x5a, &cp);
        CUresult f = cuMemFree(d), x = cuCtxDestroy(ctx);
        printf("A: cuCtxCreate=%d cuMemAlloc=%d cuMemsetD8=%d cuCtxSynchronize=%d "
               "cuMemcpyDtoH=%d bytes=%s cuMemFree=%d cuCtxDestroy=%d\n",
               c, a, m, s, cp, ok ? "ok" : "wrong", f, x);
        bad |= c || a || m || s || cp || !ok || f || x;
    }

    CUcontext pc = NULL;
    CUdeviceptr live = 0;
    CUresult r = cuDevicePrimaryCtxRetain(&pc, dev), sc = cuCtxSetCurrent(pc);
    CUresult a = cuMemAlloc(&live, N), m = cuMemsetD8(live, 1, N);
    CUresult x = cuCtxDestroy(pc);
    CUresult m2 = cuMemsetD8(live, 2, N), s = cuCtxSynchronize(), cp;
    int ok = bytes_are(live, 2, &cp);
    printf("B: cuDevicePrimaryCtxRetain=%d cuCtxSetCurrent=%d cuMemAlloc=%d cuMemsetD8=%d "
           "cuCtxDestroy(primary)=%d then cuMemsetD8=%d cuCtxSynchronize=%d cuMemcpyDtoH=%d "
           "bytes=%s\n",
           r, sc, a, m, x, m2, s, cp, ok ? "ok" : "wrong");
    bad |= r || sc || a || m;
    if (x != CUDA_SUCCESS) /* refused: the live block must still work */
        bad |= m2 || s || cp || !ok;
    if (bad) {
        printf("FAIL\n");
        return 1;
    }
    if (!partA) {
        printf("skip: the driver has no cuCtxCreate (part A not run)\n");
        return 77;
    }
    printf("ok\n");
    return 0;
}
