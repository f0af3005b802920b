/* A PyTorch-style graph capture through the pluggable allocator's entry points
 * (memtrace_alloc/memtrace_free, as torch.cuda.graph calls them), against the fake runtime
 * and driver, run under LD_PRELOAD of the drop-in in cuda mode (suite preload). Scenarios
 * (argv[1], default "pools"):
 * - pools, global: the capture's memory is a private pool: a block the capture freed is
 *   never handed to an eager request, so replays that write it leave eager tensors alone;
 *   the pool outlives the graph (torch destroys it right after instantiating) and goes back
 *   to the device when the executable graph is destroyed. "global" captures in global
 *   mode, where a new segment for the pool must not break the capture.
 * - keep: eager blocks the capture used (record_stream on the capturing stream) and the
 *   program freed, during or after the capture, stay out of the cache until the graph and
 *   every executable made from it are gone.
 * - entry: captures begun and instantiated through the per-thread (_ptsz), ToGraph and
 *   WithParams entry points, runtime and driver, get a private pool too.
 * Exit 0 iff every check holds. */
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

static alloc_fn alloc;
static free_fn fr;

static int pools(enum cudaStreamCaptureMode mode)
{
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    void *a = alloc(N, 0, s);
    CHECK(a != NULL);
    CHECK(cuMemsetD8Async(DP(a), 3, N, (CUstream)s) == CUDA_SUCCESS);
    void *w = alloc(N, 0, s); /* warm-up: a block of tmp's size waits in the cache */
    CHECK(w != NULL);
    fr(w, N, 0, s);
    /* Under the drop-in every capture begins through a hook: eager requests on a stream
     * ask the driver nothing about capture. */
    CHECK(fake_cuda_count("cuStreamGetCaptureInfo") == 0);

    /* In global mode a miss in the pool still makes a segment: the drop-in allocates it in
     * relaxed mode, as PyTorch does. */
    CHECK(cudaStreamBeginCapture(s, mode) == cudaSuccess);
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
    CHECK(cudaStreamBeginCapture(s, mode) == cudaSuccess);
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
    /* The next graph event outside a capture releases it: here the end of the next one. */
    CHECK(cudaStreamBeginCapture(s, mode) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemFree_v2") == f1);
    cudaGraph_t g3 = NULL;
    CHECK(cudaStreamEndCapture(s, &g3) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemFree_v2") > f1);
    CHECK(cudaGraphDestroy(g3) == cudaSuccess);
    fr(e, N, 0, s);
    fr(a, N, 0, s);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    printf("ok: graph pools\n");
    return 0;
}

/* N6 (b), (d): eager blocks a graph uses are kept until the graph and its execs are gone. */
static int keep(void)
{
    typedef void (*record_fn)(void *, cudaStream_t);
    record_fn record = (record_fn)dlsym(RTLD_DEFAULT, "memtrace_record_stream");
    CHECK(record != NULL);
    cudaStream_t s, s2;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
    void *x1 = alloc(N, 0, s2), *x2 = alloc(N, 0, s2);
    CHECK(x1 != NULL && x2 != NULL);
    CHECK(cuMemsetD8Async(DP(x1), 1, N, (CUstream)s2) == CUDA_SUCCESS);
    CHECK(cuMemsetD8Async(DP(x2), 2, N, (CUstream)s2) == CUDA_SUCCESS);
    CHECK(cudaStreamSynchronize(s2) == cudaSuccess);

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    record(x1, s); /* the graph reads x1 and x2 at every replay */
    record(x2, s);
    fr(x1, N, 0, s2); /* freed during the capture */
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && g != NULL);
    cudaGraphExec_t ge = NULL;
    CHECK(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
    CHECK(cudaGraphDestroy(g) == cudaSuccess); /* as torch's capture_end does */
    fr(x2, N, 0, s2); /* freed after the capture, while the exec still replays it */

    void *y1 = alloc(N, 0, s2), *y2 = alloc(N, 0, s2);
    CHECK(y1 != NULL && y2 != NULL);
    if (overlaps(y1, N, x1, N) || overlaps(y2, N, x1, N) || overlaps(y1, N, x2, N) ||
        overlaps(y2, N, x2, N)) {
        fprintf(stderr, "an eager request got a block the executable graph still uses\n");
        return 1;
    }
    CHECK(cudaGraphExecDestroy(ge) == cudaSuccess);
    /* Now they are the cache's again. */
    void *z1 = alloc(N, 0, s2), *z2 = alloc(N, 0, s2);
    CHECK(z1 != NULL && z2 != NULL);
    CHECK((z1 == x1 && z2 == x2) || (z1 == x2 && z2 == x1));
    fr(y1, N, 0, s2);
    fr(y2, N, 0, s2);
    fr(z1, N, 0, s2);
    fr(z2, N, 0, s2);

    /* A block two graphs use comes back only when both are gone; freeing it twice is the
     * program's error, as for any block. */
    void *x3 = alloc(N, 0, s2);
    CHECK(x3 != NULL);
    cudaGraphExec_t ex[2];
    for (int k = 0; k < 2; k++) {
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
        record(x3, s);
        CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && g != NULL);
        CHECK(cudaGraphInstantiate(&ex[k], g, 0) == cudaSuccess);
        CHECK(cudaGraphDestroy(g) == cudaSuccess);
    }
    CHECK(cudaFree(x3) == cudaSuccess);
    CHECK(cudaFree(x3) == cudaErrorInvalidValue);
    CHECK(cudaGraphExecDestroy(ex[0]) == cudaSuccess);
    void *w1 = alloc(N, 0, s2);
    CHECK(w1 != NULL && !overlaps(w1, N, x3, N));
    CHECK(cudaGraphExecDestroy(ex[1]) == cudaSuccess);
    void *w2 = alloc(N, 0, s2);
    CHECK(w2 == x3);
    fr(w1, N, 0, s2);
    fr(w2, N, 0, s2);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    CHECK(cudaStreamDestroy(s2) == cudaSuccess);
    printf("ok: blocks kept for the graph\n");
    return 0;
}

cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t *g);

/* One capture begun by `how`; tmp is freed inside it, and an eager request of its size
 * after the graph went must not get tmp while the exec lives. */
static int entry_one(int how)
{
    cudaStream_t s = NULL;
    if (how != 0)
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    cudaStream_t as = how == 0 ? cudaStreamPerThread : s; /* what torch passes */
    cudaGraph_t g = NULL;
    switch (how) {
    case 0: /* per-thread default stream: NULL in a _ptsz call */
        CHECK(cudaStreamBeginCapture_ptsz(NULL, cudaStreamCaptureModeRelaxed) == cudaSuccess);
        break;
    case 1:
        CHECK(cudaGraphCreate(&g, 0) == cudaSuccess);
        CHECK(cudaStreamBeginCaptureToGraph(s, g, NULL, NULL, 0, cudaStreamCaptureModeRelaxed) ==
              cudaSuccess);
        break;
    case 2:
        CHECK(cuGraphCreate((CUgraph *)&g, 0) == CUDA_SUCCESS);
        CHECK(cuStreamBeginCaptureToGraph((CUstream)s, (CUgraph)g, NULL, NULL, 0,
                                          CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
        break;
    default:
        CHECK(cuStreamBeginCapture_v2((CUstream)s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
        break;
    }
    void *tmp = alloc(N, 0, as);
    void *out = alloc(N, 0, as);
    CHECK(tmp != NULL && out != NULL);
    fr(tmp, N, 0, as);
    cudaGraph_t cg = NULL;
    if (how == 0)
        CHECK(cudaStreamEndCapture_ptsz(NULL, &cg) == cudaSuccess);
    else if (how == 1)
        CHECK(cudaStreamEndCapture(s, &cg) == cudaSuccess);
    else
        CHECK(cuStreamEndCapture((CUstream)s, (CUgraph *)&cg) == CUDA_SUCCESS);
    CHECK(cg != NULL && (g == NULL || cg == g));
    cudaGraphExec_t ge = NULL;
    if (how < 2) {
        cudaGraphInstantiateParams ip = {0};
        CHECK(cudaGraphInstantiateWithParams(&ge, cg, &ip) == cudaSuccess);
        CHECK(cudaGraphDestroy(cg) == cudaSuccess);
    } else {
        CUDA_GRAPH_INSTANTIATE_PARAMS ip = {0};
        CHECK(cuGraphInstantiateWithParams((CUgraphExec *)&ge, (CUgraph)cg, &ip) == CUDA_SUCCESS);
        CHECK(cuGraphDestroy((CUgraph)cg) == CUDA_SUCCESS);
    }
    fr(out, N, 0, as);
    void *e = alloc(N, 0, as);
    CHECK(e != NULL);
    if (overlaps(e, N, tmp, N) || overlaps(e, N, out, N)) {
        fprintf(stderr, "capture begun by way %d: an eager request got the capture's freed block\n",
                how);
        return 1;
    }
    /* Another graph event (an empty capture elsewhere) must not release the pool: the
     * exec still replays into it. */
    size_t f0 = fake_cuda_count("cuMemFree_v2");
    cudaStream_t s3;
    cudaGraph_t g3 = NULL;
    CHECK(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s3, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(cudaStreamEndCapture(s3, &g3) == cudaSuccess);
    CHECK(cudaGraphDestroy(g3) == cudaSuccess);
    CHECK(cudaStreamDestroy(s3) == cudaSuccess);
    if (fake_cuda_count("cuMemFree_v2") != f0) {
        fprintf(stderr, "capture begun by way %d: its pool went back while the exec lives\n", how);
        return 1;
    }
    if (how < 2)
        CHECK(cudaGraphExecDestroy(ge) == cudaSuccess);
    else
        CHECK(cuGraphExecDestroy((CUgraphExec)ge) == CUDA_SUCCESS);
    CHECK(fake_cuda_count("cuMemFree_v2") > f0); /* and then it does */
    fr(e, N, 0, as);
    if (s != NULL)
        CHECK(cudaStreamDestroy(s) == cudaSuccess);
    return 0;
}

/* N6 (f); only way `only` when >= 0. */
static int entry(int only)
{
    for (int how = 0; how < 4; how++)
        if ((only < 0 || how == only) && entry_one(how) != 0)
            return 1;
    printf("ok: captures through every entry point\n");
    return 0;
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "pools";
    alloc = (alloc_fn)dlsym(RTLD_DEFAULT, "memtrace_alloc");
    fr = (free_fn)dlsym(RTLD_DEFAULT, "memtrace_free");
    CHECK(alloc != NULL && fr != NULL);
    if (strcmp(what, "pools") == 0)
        return pools(cudaStreamCaptureModeRelaxed);
    if (strcmp(what, "global") == 0)
        return pools(cudaStreamCaptureModeGlobal);
    if (strcmp(what, "keep") == 0)
        return keep();
    if (strcmp(what, "entry") == 0)
        return entry(argc > 2 ? atoi(argv[2]) : -1);
    fprintf(stderr, "unknown scenario %s\n", what);
    return 2;
}
