/* Check 6: one runtime program built twice, against the shared and the static libcudart
 * (nvcc's default). Both must show 17 requests in memtrace's summary. */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

int main(void)
{
    enum { SYNC = 12, ASYNC = 5, N = 1000 };
    void *p[SYNC + ASYNC] = {0};
    int bad = 0, allocs = 0;
    cudaStream_t s = NULL;
    bad |= cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess;
    for (int i = 0; i < SYNC; i++)
        if (cudaMalloc(&p[i], (size_t)(i + 1) << 12) == cudaSuccess)
            allocs++;
    for (int i = SYNC; i < SYNC + ASYNC; i++)
        if (cudaMallocAsync(&p[i], (size_t)(i + 1) << 10, s) == cudaSuccess)
            allocs++;
    bad |= cudaStreamSynchronize(s) != cudaSuccess;
    unsigned char out[N];
    memset(out, 0, N);
    bad |= cudaMemset(p[3], 0x5a, N) != cudaSuccess;
    bad |= cudaMemcpy(out, p[3], N, cudaMemcpyDeviceToHost) != cudaSuccess;
    for (int i = 0; i < N; i++)
        bad |= out[i] != 0x5a;
    for (int i = SYNC; i < SYNC + ASYNC; i++)
        bad |= cudaFreeAsync(p[i], s) != cudaSuccess;
    bad |= cudaStreamSynchronize(s) != cudaSuccess;
    for (int i = 0; i < SYNC; i++)
        bad |= cudaFree(p[i]) != cudaSuccess;
    bad |= cudaStreamDestroy(s) != cudaSuccess;
    bad |= allocs != SYNC + ASYNC;
    printf("%s: %d device allocations\n", bad ? "FAIL" : "ok", allocs);
    return bad;
}
