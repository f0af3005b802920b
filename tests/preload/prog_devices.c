/* A plain CUDA runtime program on two devices, never modified for memtrace: device 0
 * holds 3 MiB, a second thread selects device 1 and holds 5 MiB, a peer copy moves 1 MiB
 * from device 0 to device 1, and each device's cudaMemGetInfo is printed while both
 * allocations live. Exit 0 iff every call succeeds and the bytes read back are right. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#define MiB ((size_t)1 << 20)

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));                     \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static unsigned char *on1; /* 5 MiB on device 1, made by the thread */

/* The current device is per thread: this one's cudaSetDevice leaves main's alone. */
static void *second(void *arg)
{
    (void)arg;
    if (cudaSetDevice(1) != cudaSuccess || cudaMalloc((void **)&on1, 5 * MiB) != cudaSuccess ||
        cudaMemset(on1, 0, 5 * MiB) != cudaSuccess)
        on1 = NULL;
    return NULL;
}

static int meminfo(int dev)
{
    size_t fr = 0, tot = 0;
    CHECK(cudaSetDevice(dev));
    CHECK(cudaMemGetInfo(&fr, &tot));
    printf("dev%d: free=%zu total=%zu\n", dev, fr, tot);
    return 0;
}

int main(void)
{
    int ndev = 0, cur = -1;
    CHECK(cudaGetDeviceCount(&ndev));
    printf("devices: %d\n", ndev);
    if (ndev < 2)
        return 1;
    CHECK(cudaSetDevice(0));
    unsigned char *on0 = NULL;
    CHECK(cudaMalloc((void **)&on0, 3 * MiB));
    pthread_t t;
    if (pthread_create(&t, NULL, second, NULL) != 0 || pthread_join(t, NULL) != 0 || on1 == NULL)
        return 1;
    CHECK(cudaGetDevice(&cur));
    if (cur != 0) {
        fprintf(stderr, "main thread's device is %d, want 0\n", cur);
        return 1;
    }
    unsigned char *h = malloc(MiB), *back = malloc(MiB);
    for (size_t i = 0; i < MiB; i++)
        h[i] = (unsigned char)(i * 29 + 3);
    CHECK(cudaMemcpy(on0, h, MiB, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyPeer(on1 + MiB, 1, on0, 0, MiB));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMemcpy(back, on1 + MiB, MiB, cudaMemcpyDeviceToHost));
    if (memcmp(back, h, MiB) != 0) {
        fprintf(stderr, "peer copy: bytes differ\n");
        return 1;
    }
    if (meminfo(0) || meminfo(1))
        return 1;
    if (cudaSetDevice(2) != cudaErrorInvalidDevice) {
        fprintf(stderr, "cudaSetDevice(2) accepted with 2 devices\n");
        return 1;
    }
    CHECK(cudaFree(on1)); /* device 1 is current */
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(on0));
    free(h);
    free(back);
    printf("ok\n");
    return 0;
}
