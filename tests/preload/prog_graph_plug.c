/* torch.cuda.graph through the pluggable allocator without the drop-in (no LD_PRELOAD):
 * the program opens libmemtrace in a local scope, as Python's memtrace package does, so
 * memtrace sees none of the capture calls the program makes to the runtime it links (the
 * fake runtime and driver). Global-mode captures, as torch makes them:
 *   prog_graph_plug LIBMEMTRACE torch     torch's sequence: memtrace_begin_allocate_to_pool
 *                                         before the capture, _end_ after it,
 *                                         memtrace_release_pool at the graph's reset
 *   prog_graph_plug LIBMEMTRACE nohooks   a torch that installs none of them
 * Checked: a miss during the capture makes its segment without breaking the capture; a
 * block the capture freed (its own, or an eager one it used and the program freed during
 * the capture) never goes to an eager request while the graph lives; with the pool entry
 * points the pool goes back to the device once released and its blocks are free.
 * Exit 0 iff every check holds. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
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

typedef struct {
    unsigned long long first, second; /* torch's MempoolId_t */
} pool_id_t;

typedef void *(*alloc_fn)(ssize_t, int, cudaStream_t);
typedef void (*free_fn)(void *, ssize_t, int, cudaStream_t);
typedef void (*record_fn)(void *, cudaStream_t);
typedef void (*begin_fn)(int, pool_id_t, void *);
typedef void (*pool_fn)(int, pool_id_t);

static alloc_fn alloc;
static free_fn fr;
static record_fn record;
static begin_fn begin_pool;
static pool_fn end_pool, release_pool;

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

static int run(bool hooks)
{
    const pool_id_t id = {1, 0}; /* torch's first graph pool */
    cudaStream_t s, s2;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
    void *a = alloc(N, 0, s);
    CHECK(a != NULL);
    CHECK(cuMemsetD8Async(DP(a), 3, N, (CUstream)s) == CUDA_SUCCESS);
    void *w = alloc(N, 0, s); /* warm-up: a block of tmp's size waits in the cache */
    CHECK(w != NULL);
    fr(w, N, 0, s);
    void *x = alloc(N, 0, s2); /* an eager block the graph reads */
    CHECK(x != NULL);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess && cudaStreamSynchronize(s2) == cudaSuccess);

    if (hooks)
        begin_pool(0, id, NULL); /* before cudaStreamBeginCapture, as torch does */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    void *tmp = alloc(N, 0, s);
    void *out = alloc(N, 0, s);
    if (tmp == NULL || out == NULL) {
        fprintf(stderr, "a request during the global capture failed: tmp %p, out %p\n", tmp, out);
        return 1;
    }
    record(x, s);
    fr(x, N, 0, s2);  /* freed during the capture, which reads it at every replay */
    fr(tmp, N, 0, s); /* del tmp */
    cudaGraph_t g = NULL;
    cudaError_t e_end = cudaStreamEndCapture(s, &g);
    if (e_end != cudaSuccess || g == NULL) {
        fprintf(stderr, "the capture broke: cudaStreamEndCapture gave %d\n", (int)e_end);
        return 1;
    }
    if (hooks)
        end_pool(0, id);
    cudaGraphExec_t ge = NULL;
    CHECK(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
    CHECK(cudaGraphDestroy(g) == cudaSuccess); /* as torch's capture_end does */

    void *e = alloc(N, 0, s); /* torch.full_like(a, 7.) */
    void *y = alloc(N, 0, s2);
    CHECK(e != NULL && y != NULL);
    if (overlaps(e, N, tmp, N) || overlaps(e, N, out, N) || overlaps(y, N, tmp, N) ||
        overlaps(y, N, out, N) || overlaps(e, N, x, N) || overlaps(y, N, x, N)) {
        fprintf(stderr, "an eager request got a block the graph replays into\n");
        return 1;
    }
    CHECK(cuMemsetD8Async(DP(e), 7, N, (CUstream)s) == CUDA_SUCCESS);
    for (int r = 0; r < 3; r++) {
        CHECK(replay(tmp, out, s) == 0);
        void *z = alloc(N, 0, s); /* eager work between replays */
        CHECK(z != NULL);
        CHECK(cuMemsetD8Async(DP(z), 9, N, (CUstream)s) == CUDA_SUCCESS);
        fr(z, N, 0, s);
    }
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(expect(e, 7, "eager tensor after 3 replays") == 0);
    CHECK(expect(out, 7, "captured output") == 0);

    /* A capture of a size never seen, with no pool entry point called: found by asking
     * the driver, and its segment must not break it either. */
    const size_t big = 9 * MiB + 512; /* the fake device has 64 MiB */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    void *b = alloc((ssize_t)big, 0, s);
    CHECK(b != NULL);
    cudaGraph_t g2 = NULL;
    CHECK(cudaStreamEndCapture(s, &g2) == cudaSuccess && g2 != NULL);
    CHECK(!overlaps(b, big, e, N) && !overlaps(b, big, a, N) && !overlaps(b, big, tmp, N));
    fr(b, (ssize_t)big, 0, s);
    void *e2 = alloc(N, 0, s); /* eager again (the routing ended): not in b's pool */
    CHECK(e2 != NULL && !overlaps(e2, N, b, big));
    CHECK(cudaGraphDestroy(g2) == cudaSuccess);

    if (hooks) {
        /* torch's graph reset: the exec goes, then releasePool; the pool goes back once
         * its output is freed too, and the eager block the graph read is the cache's. */
        size_t f0 = fake_cuda_count("cuMemFree_v2");
        CHECK(cudaGraphExecDestroy(ge) == cudaSuccess);
        release_pool(0, id);
        CHECK(fake_cuda_count("cuMemFree_v2") == f0); /* out is still the program's */
        fr(out, N, 0, s);
        begin_pool(0, (pool_id_t){2, 0}, NULL); /* the next graph event */
        CHECK(fake_cuda_count("cuMemFree_v2") > f0);
        end_pool(0, (pool_id_t){2, 0});
        release_pool(0, (pool_id_t){2, 0});
        void *x2 = alloc(N, 0, s2);
        CHECK(x2 == x);
        fr(x2, N, 0, s2);
    } else {
        CHECK(cudaGraphExecDestroy(ge) == cudaSuccess);
        fr(out, N, 0, s);
    }
    fr(e2, N, 0, s);
    fr(y, N, 0, s2);
    fr(e, N, 0, s);
    fr(a, N, 0, s);
    CHECK(cudaStreamDestroy(s) == cudaSuccess && cudaStreamDestroy(s2) == cudaSuccess);
    printf("ok: global captures through the pluggable allocator (%s)\n",
           hooks ? "pool entry points" : "no pool entry points");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[2], "torch") != 0 && strcmp(argv[2], "nohooks") != 0)) {
        fprintf(stderr, "usage: prog_graph_plug LIBMEMTRACE torch|nohooks\n");
        return 2;
    }
    bool hooks = strcmp(argv[2], "torch") == 0;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    alloc = (alloc_fn)dlsym(h, "memtrace_alloc");
    fr = (free_fn)dlsym(h, "memtrace_free");
    record = (record_fn)dlsym(h, "memtrace_record_stream");
    begin_pool = (begin_fn)dlsym(h, "memtrace_begin_allocate_to_pool");
    end_pool = (pool_fn)dlsym(h, "memtrace_end_allocate_to_pool");
    release_pool = (pool_fn)dlsym(h, "memtrace_release_pool");
    CHECK(alloc != NULL && fr != NULL && record != NULL);
    CHECK(!hooks || (begin_pool != NULL && end_pool != NULL && release_pool != NULL));
    CHECK(cudaSetDevice(0) == cudaSuccess);
    return run(hooks);
}
