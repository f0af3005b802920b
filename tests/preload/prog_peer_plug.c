/* torch's pluggable allocator without the drop-in (no LD_PRELOAD): the program opens
 * libmemtrace.so in a local scope, as Python's memtrace package does, allocates through
 * memtrace_alloc on device 0, and enables peer access from device 1 through the runtime it
 * links, which memtrace never sees. Device 1 must still reach the block, an expandable
 * segment (a VMM mapping, opened to a peer only by cuMemSetAccess), or its kernels fault.
 * Run with FAKE_CUDA_DEVICES=2 against the fake runtime and driver.
 *   prog_peer_plug LIBMEMTRACE reach     device 1 reaches blocks made before and after
 *   prog_peer_plug LIBMEMTRACE noreach   it does not (MEMTRACE_CUDA_PEER_ACCESS=enabled,
 *                                        or a pair the driver says cannot reach)
 * Exit 0 iff every check holds. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include <cuda_runtime_api.h>

bool fake_cuda_can_access(int dev, const void *dptr);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#define MiB ((ssize_t)1 << 20)

typedef void *(*alloc_fn)(ssize_t, int, cudaStream_t);
typedef void (*free_fn)(void *, ssize_t, int, cudaStream_t);

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[2], "reach") != 0 && strcmp(argv[2], "noreach") != 0)) {
        fprintf(stderr, "usage: prog_peer_plug LIBMEMTRACE reach|noreach\n");
        return 2;
    }
    bool reach = strcmp(argv[2], "reach") == 0;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    alloc_fn alloc = (alloc_fn)dlsym(h, "memtrace_alloc");
    free_fn fr = (free_fn)dlsym(h, "memtrace_free");
    CHECK(alloc != NULL && fr != NULL);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    void *before = alloc(4 * MiB, 0, NULL);
    CHECK(before != NULL);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaDeviceEnablePeerAccess(0, 0) == cudaSuccess); /* the real runtime's */
    CHECK(cudaSetDevice(0) == cudaSuccess);
    void *after = alloc(16 * MiB, 0, NULL); /* pages mapped after the enable */
    CHECK(after != NULL);
    bool b = fake_cuda_can_access(1, before), a = fake_cuda_can_access(1, after);
    printf("device 1 reaches the block made before the enable: %s, after: %s\n", b ? "yes" : "no",
           a ? "yes" : "no");
    CHECK(b == reach);
    CHECK(a == reach);
    CHECK(fake_cuda_can_access(0, before) && fake_cuda_can_access(0, after));
    fr(after, 16 * MiB, 0, NULL);
    fr(before, 4 * MiB, 0, NULL);
    return 0;
}
