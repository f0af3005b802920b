/* A plain CUDA runtime program, never modified for memtrace: device memory, copies both
 * ways, a memset, a stream and an event. Exit 0 iff every call succeeds and the data
 * read back is right. Prints how many device allocations it made. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));                     \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(void)
{
    enum { N = 1 << 20, ROUNDS = 8 };
    int ndev = 0;
    CHECK(cudaGetDeviceCount(&ndev));
    CHECK(cudaSetDevice(0));
    unsigned char *h = malloc(N), *back = malloc(N);
    for (int i = 0; i < N; i++)
        h[i] = (unsigned char)(i * 31 + 7);
    cudaStream_t s;
    cudaEvent_t ev;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaEventCreate(&ev));
    int allocs = 0;
    for (int r = 0; r < ROUNDS; r++) {
        unsigned char *d = NULL, *d2 = NULL;
        CHECK(cudaMalloc((void **)&d, N));
        CHECK(cudaMalloc((void **)&d2, N / 2 + r * 1000));
        allocs += 2;
        CHECK(cudaMemcpy(d, h, N, cudaMemcpyHostToDevice));
        CHECK(cudaMemset(d + 100, 0xEE, 50));
        CHECK(cudaMemcpyAsync(d2, d, N / 2, cudaMemcpyDeviceToDevice, s));
        CHECK(cudaEventRecord(ev, s));
        CHECK(cudaEventSynchronize(ev));
        CHECK(cudaMemsetAsync(d2, r, 10, s));
        CHECK(cudaStreamSynchronize(s));
        memset(back, 0, N);
        CHECK(cudaMemcpy(back, d2, N / 2, cudaMemcpyDeviceToHost));
        for (int i = 0; i < N / 2; i++) {
            unsigned char want = i < 10 ? (unsigned char)r : (i >= 100 && i < 150) ? 0xEE : h[i];
            if (back[i] != want) {
                fprintf(stderr, "round %d: byte %d is %u, want %u\n", r, i, back[i], want);
                return 1;
            }
        }
        CHECK(cudaFree(d2));
        CHECK(cudaFree(d));
    }
    /* stream-ordered allocation, and a pinned staging buffer */
    unsigned char *da = NULL, *pinned = NULL;
    CHECK(cudaMallocAsync((void **)&da, 4096, s));
    allocs++;
    CHECK(cudaMallocHost((void **)&pinned, 4096));
    CHECK(cudaMemsetAsync(da, 0x5C, 4096, s));
    CHECK(cudaMemcpyAsync(pinned, da, 4096, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < 4096; i++)
        if (pinned[i] != 0x5C) {
            fprintf(stderr, "pinned byte %d is %u\n", i, pinned[i]);
            return 1;
        }
    CHECK(cudaFreeAsync(da, s));
    CHECK(cudaFreeHost(pinned));
    size_t fr = 0, tot = 0;
    CHECK(cudaMemGetInfo(&fr, &tot));
    printf("meminfo: free=%zu total=%zu\n", fr, tot);
    CHECK(cudaEventQuery(ev));
    cudaEvent_t ev2;
    float ms = -1;
    CHECK(cudaEventCreate(&ev2));
    CHECK(cudaEventRecord(ev2, s));
    CHECK(cudaEventSynchronize(ev2));
    CHECK(cudaEventElapsedTime(&ms, ev, ev2));
    if (ms < 0) {
        fprintf(stderr, "negative elapsed time %f ms\n", ms);
        return 1;
    }
    CHECK(cudaEventDestroy(ev2));
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaGetLastError());
    free(h);
    free(back);
    printf("ok: %d device allocations on %d device(s)\n", allocs, ndev);
    return 0;
}
