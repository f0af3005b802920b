/* A plain CUDA runtime program using managed memory, never modified for memtrace:
 * cudaMallocManaged (attached globally), prefetches to the device and back, advice, the
 * host reading what it wrote, cudaFree; and cudaMallocManaged attached to the host, whose
 * result it prints (memtrace passes it to the driver; on sim there is none). Exit 0 iff
 * every call but that last one succeeds and the data is right. */
#include <stdio.h>
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
    enum { N = 6 << 20 };
    CHECK(cudaSetDevice(0));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    unsigned char *m = NULL;
    CHECK(cudaMallocManaged((void **)&m, N, cudaMemAttachGlobal));
    for (int i = 0; i < N; i++) /* managed memory is host-addressable */
        m[i] = (unsigned char)(i * 13 + 1);
    struct cudaMemLocation dev = {.type = cudaMemLocationTypeDevice, .id = 0};
    struct cudaMemLocation host = {.type = cudaMemLocationTypeHost, .id = 0};
    CHECK(cudaMemAdvise(m, N, cudaMemAdviseSetPreferredLocation, dev));
    CHECK(cudaMemPrefetchAsync(m, N, dev, 0, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemPrefetchAsync(m, N / 2, host, 0, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < N; i++)
        if (m[i] != (unsigned char)(i * 13 + 1)) {
            fprintf(stderr, "byte %d is %u\n", i, m[i]);
            return 1;
        }
    /* A range beyond the block is the program's error, as the driver says. */
    if (cudaMemPrefetchAsync(m, 2 * (size_t)N, dev, 0, s) == cudaSuccess) {
        fprintf(stderr, "a prefetch beyond the allocation succeeded\n");
        return 1;
    }
    (void)cudaGetLastError();
    CHECK(cudaFree(m));
    void *h = NULL;
    cudaError_t e = cudaMallocManaged(&h, 4096, cudaMemAttachHost);
    printf("attach-host: %s\n", cudaGetErrorName(e));
    (void)cudaGetLastError();
    if (e == cudaSuccess)
        CHECK(cudaFree(h));
    CHECK(cudaStreamDestroy(s));
    printf("ok: managed %d bytes\n", N);
    return 0;
}
