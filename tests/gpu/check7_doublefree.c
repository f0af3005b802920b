/* Check 7 (finding N4): a double cudaFree must answer cudaErrorInvalidValue and leave
 * every other block alone; a block allocated afterwards must hold what is written to it. */
#include <stdio.h>

#include <cuda_runtime_api.h>

int main(void)
{
    enum { N = 1000 };
    void *a = NULL, *b = NULL, *keep = NULL;
    cudaError_t k = cudaMalloc(&keep, 1 << 16);
    cudaError_t m = cudaMalloc(&a, 1 << 16);
    cudaError_t f1 = cudaFree(a);
    cudaError_t f2 = cudaFree(a);
    cudaError_t last = cudaGetLastError();
    printf("cudaMalloc=%d,%d first cudaFree=%d second cudaFree=%d cudaGetLastError=%d\n", k, m, f1,
           f2, last);
    cudaError_t mb = cudaMalloc(&b, N);
    cudaError_t ms = cudaMemset(b, 1, N);
    cudaError_t sy = cudaDeviceSynchronize();
    unsigned char out[N] = {0};
    cudaError_t cp = cudaMemcpy(out, b, N, cudaMemcpyDeviceToHost);
    int same = 1;
    for (int i = 0; i < N; i++)
        same &= out[i] == 1;
    cudaError_t ks = cudaMemset(keep, 2, 1 << 16);
    cudaError_t ksy = cudaDeviceSynchronize();
    printf("after: cudaMalloc=%d cudaMemset=%d sync=%d D2H=%d bytes=%s keep memset=%d sync=%d\n",
           mb, ms, sy, cp, same ? "ok" : "wrong", ks, ksy);
    cudaFree(b);
    cudaFree(keep);
    int bad =
        k || m || f1 || f2 != cudaErrorInvalidValue || mb || ms || sy || cp || !same || ks || ksy;
    printf("%s\n", bad ? "FAIL: the double free was not refused or hurt other blocks" : "ok");
    return bad;
}
