/* A runtime program whose device memory is partly taken outside memtrace's allocator: by
 * a library (libfakenccl.so, from the driver, as NCCL does) and by itself (pitched
 * memory), and a last piece of the library's that a device reset frees. Never modified for
 * memtrace. Exit 0 iff every call answers as CUDA would. */
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "fakenccl.h"

#define MIB ((size_t)1 << 20)

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int e_ = (int)(call);                                                                      \
        if (e_ != 0) {                                                                             \
            fprintf(stderr, "%s failed: %d\n", #call, e_);                                         \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(void)
{
    void *mine = NULL, *big = NULL, *part = NULL, *pitched = NULL;
    size_t pitch = 0;
    CHECK(cudaMalloc(&mine, 8 * MIB));                    /* served by memtrace */
    CHECK(fakenccl_alloc(4096, 8192, &big));              /* 32 MiB, the library's */
    CHECK(fakenccl_alloc(4096, 4096, &part));             /* 16 MiB more: 48 MiB */
    CHECK(cudaMallocPitch(&pitched, &pitch, 1000, 2048)); /* the program's own: 2 MiB */
    if (pitch != 1024) {
        fprintf(stderr, "pitch %zu, not 1024\n", pitch);
        return 1;
    }
    CHECK(cudaMemset(big, 0x5a, 4096));
    unsigned char back[16] = {0};
    CHECK(cudaMemcpy(back, big, sizeof back, cudaMemcpyDeviceToHost));
    if (back[0] != 0x5a || back[15] != 0x5a) {
        fprintf(stderr, "the library's memory does not hold what was written\n");
        return 1;
    }
    CHECK(fakenccl_free(part)); /* the library gives part back */
    CHECK(cudaFree(big));       /* the program frees the rest through the runtime */
    CHECK(cudaFree(pitched));
    CHECK(cudaFree(mine));
    if (cudaFree(big) == cudaSuccess) { /* already freed: the driver's error */
        fprintf(stderr, "a second cudaFree of the library's memory succeeded\n");
        return 1;
    }
    /* A device reset frees what the library still holds, as the driver's reset does. */
    void *left = NULL;
    CHECK(fakenccl_alloc(4096, 1024, &left)); /* 4 MiB */
    CHECK(cudaDeviceReset());
    printf("ok: outside 48 MiB by the library, 2 MiB by the program\n");
    return 0;
}
