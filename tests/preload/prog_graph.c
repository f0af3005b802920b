/* A PyTorch-style graph capture through the pluggable allocator's entry points
 * (memtrace_alloc/memtrace_free, as torch.cuda.graph calls them), against the fake runtime
 * and driver, run under LD_PRELOAD of the drop-in in cuda mode (suite preload). Checks that
 * the capture's memory is a private pool: a block the capture freed is never handed to an
 * eager request, so replays that write it leave eager tensors alone; the pool outlives the
 * graph (torch destroys it right after instantiating) and goes back to the device when the
 * executable graph is destroyed. Exit 0 iff every check holds. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

size_t fake_cuda_count(const char *name); /* the fake driver's call counter */

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#define MiB   ((size_t)1 << 20)
#define N     (4 * MiB)
#define DP(p) ((CUdeviceptr)(uintptr_t)(p))

typedef void *(*alloc_fn)(ssize_t, int, cudaStream_t);
typedef void (*free_fn)(void *, ssize_t, int, cudaStream_t);

static bool overlaps(const void *p, size_t n, const void *q, size_t m)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return a < b + m && b < a + n;
}

/* Every byte of [p, p + N) is v. */
static int expect(const void *p, int v, const char *what)
{
    static unsigned char host[N];
    CHECK(cuMemcpyDtoH(host, DP(p), N) == CUDA_SUCCESS);
    for (size_t i = 0; i < N; i++) {
        if (host[i] != v) {
            fprintf(stderr, "%s: byte %zu is %d, not %d\n", what, i, host[i], v);
            return 1;
        }
    }
    return 0;
}

/* A replay of the captured graph: tmp = a * 2; out = tmp + 1 (bytes stand for values). */
static int replay(void *tmp, void *out, cudaStream_t s)
{
    CHECK(cuMemsetD8Async(DP(tmp), 6, N, (CUstream)s) == CUDA_SUCCESS);
    CHECK(cuMemsetD8Async(DP(out), 7, N, (CUstream)s) == CUDA_SUCCESS);
    return 0;
}

int main(void)
{
    alloc_fn alloc = (alloc_fn)dlsym(RTLD_DEFAULT, "memtrace_alloc");
    free_fn fr = (free_fn)dlsym(RTLD_DEFAULT, "memtrace_free");
    CHECK(alloc != NULL && fr != NULL);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    void *a = alloc(N, 0, s);
    CHECK(a != NULL);
    CHECK(cuMemsetD8Async(DP(a), 3, N, (CUstream)s) == CUDA_SUCCESS);
    void *w = alloc(N, 0, s); /* warm-up: a block of tmp's size waits in the cache */
    CHECK(w != NULL);
    fr(w, N, 0, s);

    /* Relaxed: a miss in the pool makes a segment, which a global capture forbids. */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    void *tmp = alloc(N, 0, s);
    void *out = alloc(N, 0, s);
    CHECK(tmp != NULL && out != NULL);
    fr(tmp, N, 0, s); /* del tmp */
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && g != NULL);
    cudaGraphExec_t ge = NULL;
    CHECK(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
    CHECK(cudaGraphDestroy(g) == cudaSuccess); /* as torch's capture_end does */

    void *e = alloc(N, 0, s); /* torch.full_like(a, 7.) */
    CHECK(e != NULL);
    CHECK(cuMemsetD8Async(DP(e), 7, N, (CUstream)s) == CUDA_SUCCESS);
    for (int r = 0; r < 3; r++) {
        CHECK(replay(tmp, out, s) == 0);
        void *x = alloc(N, 0, s); /* eager work between replays */
        CHECK(x != NULL);
        CHECK(cuMemsetD8Async(DP(x), 9, N, (CUstream)s) == CUDA_SUCCESS);
        fr(x, N, 0, s);
    }
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(expect(e, 7, "eager tensor after 3 replays") == 0);
    CHECK(replay(tmp, out, s) == 0);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(expect(out, 7, "captured output") == 0);
    CHECK(!overlaps(e, N, tmp, N) && !overlaps(e, N, out, N));

    /* A capture of a size never seen: a new segment of its own pool. */
    const size_t big = 9 * MiB + 512; /* the fake device has 64 MiB */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    void *b = alloc((ssize_t)big, 0, s);
    CHECK(b != NULL);
    cudaGraph_t g2 = NULL;
    CHECK(cudaStreamEndCapture(s, &g2) == cudaSuccess && g2 != NULL);
    CHECK(!overlaps(b, big, e, N) && !overlaps(b, big, a, N) && !overlaps(b, big, tmp, N));

    /* The first graph's pool goes when its exec does, once its output is freed. */
    size_t f0 = fake_cuda_count("cuMemFree_v2");
    fr(out, N, 0, s);
    CHECK(fake_cuda_count("cuMemFree_v2") == f0); /* the exec still holds the pool */
    CHECK(cudaGraphExecDestroy(ge) == cudaSuccess);
    size_t f1 = fake_cuda_count("cuMemFree_v2");
    CHECK(f1 > f0);
    /* The second graph's block is still live when the graph goes: its pool waits. */
    CHECK(cudaGraphDestroy(g2) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemFree_v2") == f1);
    fr(b, (ssize_t)big, 0, s);
    /* The next graph event releases it. */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemFree_v2") > f1);
    cudaGraph_t g3 = NULL;
    CHECK(cudaStreamEndCapture(s, &g3) == cudaSuccess);
    CHECK(cudaGraphDestroy(g3) == cudaSuccess);
    fr(e, N, 0, s);
    fr(a, N, 0, s);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    printf("ok: graph pools\n");
    return 0;
}
