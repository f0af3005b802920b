/* A CUDA program linked against a runtime and a driver (the fakes: fake_libcudart.c and
 * tests/cuda/fake_libcuda.c), run under LD_PRELOAD of the drop-in in cuda mode by
 * test_preload_cuda.c. argv[1] names one scenario; exit 0 iff it holds, else
 * the failed check is printed. Never built against memtrace: it only calls CUDA and the
 * fake driver's test controls. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

/* The fake driver's controls. */
size_t fake_cuda_count(const char *name);
size_t fake_cuda_ncalls(void);
const char *fake_cuda_call(size_t i, uint64_t *a, uint64_t *b);
void fake_cuda_hold(bool on);
void fake_cuda_fail(const char *name, unsigned count, CUresult res);
void fake_cuda_fault(int dev, CUresult res);
unsigned long long fake_cuda_handle_types(void);
void *fake_cuda_proc(const char *base, bool per_thread); /* the driver's own, never ours */
bool fake_cuda_can_access(int dev, const void *dptr);
void fake_cuda_peer_unseen(int dev, int peer); /* another driver user's enable */
/* The fake runtime's own allocation calls: what a static libcudart runs, out of reach of
 * LD_PRELOAD. */
cudaError_t fakert_static_malloc(void **p, size_t n);
cudaError_t fakert_static_free(void *p);
size_t fakert_dlsym_count(void); /* glibc dlsym calls, the drop-in's included */

#include "fakenccl.h" /* libfakenccl.so: device memory from the driver, as NCCL takes it */

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#define MiB   ((size_t)1 << 20)
#define DP(p) ((CUdeviceptr)(uintptr_t)(p))

/* The primary context of device 0 current on the calling thread (driver-API programs). */
static int bind_ctx(CUcontext *out)
{
    CUcontext c;
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS);
    CHECK(cuCtxSetCurrent(c) == CUDA_SUCCESS);
    if (out)
        *out = c;
    return 0;
}

/* Item 11: looking symbols up makes no context on any device. */
static int lookup(void)
{
    CHECK(dlsym(RTLD_DEFAULT, "cudaMalloc") != NULL);
    void *f = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK(cuGetProcAddress("cuMemAlloc", &f, CUDA_VERSION, 0, &st) == CUDA_SUCCESS && f);
    CHECK(fake_cuda_count("cuDevicePrimaryCtxRetain") == 0);
    CHECK(fake_cuda_count("cuCtxSetCurrent") == 0);
    return 0;
}

/* Item 3: the flags pick the entry points, and the per-thread stream is per thread. */
typedef CUresult (*alloc_async_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_t)(CUdeviceptr, CUstream);
static alloc_async_t pt_alloc;
static free_async_t pt_free;
static CUdeviceptr thread_ptr[3];
static atomic_bool pt_freed, pt_release;

/* Thread 0 stays alive, its block freed, until thread 1 is done. */
static void pt_linger(int i)
{
    if (i != 0)
        return;
    atomic_store(&pt_freed, true);
    while (!atomic_load(&pt_release))
        usleep(1000);
}

static void *pt_thread(void *arg)
{
    int i = (int)(intptr_t)arg;
    if (bind_ctx(NULL) != 0 || pt_alloc(&thread_ptr[i], MiB, NULL) != CUDA_SUCCESS)
        return (void *)1;
    if (i < 2 && pt_free(thread_ptr[i], NULL) != CUDA_SUCCESS) /* back to its own pool */
        return (void *)1;
    pt_linger(i);
    return NULL;
}

static void *rt_ptr[3];

static void *rt_pt_thread(void *arg)
{
    int i = (int)(intptr_t)arg;
    if (cudaMallocAsync(&rt_ptr[i], MiB, cudaStreamPerThread) != cudaSuccess)
        return (void *)1;
    if (i < 2 && cudaFreeAsync(rt_ptr[i], cudaStreamPerThread) != cudaSuccess)
        return (void *)1;
    pt_linger(i);
    return NULL;
}

/* fn(0) frees its block on its own default stream and stays alive while fn(1), on its own,
 * allocates: thread 1 must not get it, the two streams are not ordered. Then, both gone,
 * fn(2) takes over one of their streams, after waiting for its work, and a cached block
 * with it (N11: no memory stranded with exited threads). */
static int pt_pair(void *(*fn)(void *))
{
    atomic_store(&pt_freed, false);
    atomic_store(&pt_release, false);
    pthread_t t0, t;
    void *res = NULL;
    CHECK(pthread_create(&t0, NULL, fn, (void *)(intptr_t)0) == 0);
    while (!atomic_load(&pt_freed))
        usleep(1000);
    CHECK(pthread_create(&t, NULL, fn, (void *)(intptr_t)1) == 0);
    CHECK(pthread_join(t, &res) == 0 && res == NULL);
    atomic_store(&pt_release, true);
    CHECK(pthread_join(t0, &res) == 0 && res == NULL);
    CHECK(pthread_create(&t, NULL, fn, (void *)(intptr_t)2) == 0);
    CHECK(pthread_join(t, &res) == 0 && res == NULL);
    return 0;
}

static int procaddr(void)
{
    void *f = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK(cuGetProcAddress("cuMemAllocAsync", &f, CUDA_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                           &st) == CUDA_SUCCESS);
    CHECK(f != NULL && f == dlsym(RTLD_DEFAULT, "cuMemAllocAsync"));
    CHECK(cuGetProcAddress("cuMemAllocAsync", &f, CUDA_VERSION,
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st) == CUDA_SUCCESS);
    CHECK(f != NULL && f == dlsym(RTLD_DEFAULT, "cuMemAllocAsync_ptsz"));
    pt_alloc = (alloc_async_t)f;
    CHECK(cuGetProcAddress("cuMemFreeAsync", &f, CUDA_VERSION,
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st) == CUDA_SUCCESS);
    CHECK(f != NULL && f == dlsym(RTLD_DEFAULT, "cuMemFreeAsync_ptsz"));
    pt_free = (free_async_t)f;
    CHECK(cuGetProcAddress("cuMemAlloc", &f, CUDA_VERSION, 3, &st) == CUDA_ERROR_INVALID_VALUE);
    CHECK(pt_pair(pt_thread) == 0);
    CHECK(thread_ptr[1] != thread_ptr[0]);
    CHECK(thread_ptr[2] == thread_ptr[0] || thread_ptr[2] == thread_ptr[1]);
    /* the runtime's per-thread stream too */
    CHECK(pt_pair(rt_pt_thread) == 0);
    CHECK(rt_ptr[1] != rt_ptr[0]);
    CHECK(rt_ptr[2] == rt_ptr[0] || rt_ptr[2] == rt_ptr[1]);
    return 0;
}

/* Item 1: reset and teardown drop the cache first; sticky errors until the reset. */
static int reset(void)
{
    void *p = NULL, *q = NULL, *r = NULL;
    CHECK(cudaMalloc(&p, MiB) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess); /* cached */
    size_t n0 = fake_cuda_count("cuMemAlloc_v2");
    CHECK(cudaDeviceReset() == cudaSuccess);
    CHECK(cudaMalloc(&q, MiB) == cudaSuccess);
    CHECK(q != p && fake_cuda_count("cuMemAlloc_v2") == n0 + 1); /* a new segment */
    CHECK(cudaFree(q) == cudaSuccess);

    fake_cuda_fault(0, CUDA_ERROR_ILLEGAL_ADDRESS); /* a kernel faulted */
    CHECK(cudaMalloc(&r, 8 * MiB) == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress); /* sticky */
    CHECK(cudaDeviceReset() == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaMalloc(&r, 8 * MiB) == cudaSuccess);
    CHECK(cudaFree(r) == cudaSuccess);

    /* The driver's calls: the primary context reset, and its destruction. */
    CUcontext c;
    CHECK(bind_ctx(&c) == 0);
    CUdeviceptr d = 0, e = 0;
    CHECK(cuMemAlloc(&d, MiB) == CUDA_SUCCESS);
    CHECK(cuMemFree(d) == CUDA_SUCCESS);
    n0 = fake_cuda_count("cuMemAlloc_v2");
    CHECK(cuDevicePrimaryCtxReset(0) == CUDA_SUCCESS);
    CHECK(cuMemAlloc(&e, MiB) == CUDA_SUCCESS);
    CHECK(e != d && fake_cuda_count("cuMemAlloc_v2") == n0 + 1);
    CHECK(cuMemFree(e) == CUDA_SUCCESS);
    n0 = fake_cuda_count("cuMemAlloc_v2");
    CHECK(cuCtxDestroy(c) == CUDA_SUCCESS);
    CHECK(bind_ctx(&c) == 0);
    CHECK(cuMemAlloc(&d, MiB) == CUDA_SUCCESS);
    CHECK(d != e && fake_cuda_count("cuMemAlloc_v2") == n0 + 1);
    return 0;
}

/* Item 2: memory memtrace did not allocate is freed by the driver, not refused. */
static int foreign(void)
{
    void *m = NULL, *pp = NULL;
    size_t pitch = 0;
    CHECK(cudaMallocManaged(&m, 4096, cudaMemAttachGlobal) == cudaSuccess);
    CHECK(cudaFree(m) == cudaSuccess);
    CHECK(cudaMallocPitch(&pp, &pitch, 100, 10) == cudaSuccess && pitch >= 100);
    CHECK(cudaFree(pp) == cudaSuccess);
    CHECK(bind_ctx(NULL) == 0);
    CUdeviceptr d = 0, a = 0;
    CHECK(cuMemAllocManaged(&d, 4096, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
    CHECK(cuMemFree(d) == CUDA_SUCCESS);
    /* stream-ordered memory from the driver itself (a pool's, a graph's) */
    CUresult (*real_async)(CUdeviceptr *, size_t, CUstream) =
        (CUresult(*)(CUdeviceptr *, size_t, CUstream))fake_cuda_proc("cuMemAllocAsync", false);
    CHECK(real_async != NULL);
    CHECK(real_async(&a, 4096, NULL) == CUDA_SUCCESS);
    CHECK(cuMemFreeAsync(a, NULL) == CUDA_SUCCESS);
    CHECK(cudaFree((void *)0x10) == cudaErrorInvalidValue); /* nobody's: the runtime says so */
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    return 0;
}

/* Item 4, runtime side: cudaFreeAsync(p, 0) is ordered after the legacy stream. */
static int freeasync0(void)
{
    cudaStream_t s;
    void *pa = NULL, *pb = NULL;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaMallocAsync(&pa, MiB, s) == cudaSuccess);
    fake_cuda_hold(true); /* the legacy stream's work (a kernel using pa) stays pending */
    CHECK(cudaFreeAsync(pa, 0) == cudaSuccess);
    CHECK(cudaMallocAsync(&pb, MiB, s) == cudaSuccess);
    CHECK(pb != pa);
    fake_cuda_hold(false);
    CHECK(cudaFreeAsync(pb, s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    return 0;
}

/* Item 7: no device malloc inside a capture; a stream-ordered free during capture takes
 * only the capture's own (graph) allocations, as the runtime's: a free of any other
 * pointer fails and invalidates the capture, and the block stays allocated. */
static int capture(void)
{
    cudaStream_t s;
    void *q = NULL, *g1 = NULL, *r = NULL;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaMalloc(&q, MiB) == cudaSuccess);
    CHECK(cuMemsetD8Async((CUdeviceptr)(uintptr_t)q, 5, MiB, (CUstream)s) == CUDA_SUCCESS);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    size_t n0 = fake_cuda_count("cuMemAlloc_v2");
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaMallocAsync(&g1, 4 * MiB, s) == cudaSuccess); /* the graph's allocation */
    CHECK(fake_cuda_count("cuMemAlloc_v2") == n0);
    CHECK(cudaFreeAsync(g1, s) == cudaSuccess); /* the graph's free */
    enum cudaStreamCaptureStatus st;
    CHECK(cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusActive);
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && g != NULL);
    CHECK(cudaGraphDestroy(g) == cudaSuccess);
    /* Not a graph allocation: refused, and the capture is invalidated. */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaFreeAsync(q, s) == cudaErrorInvalidValue);
    CHECK(cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusInvalidated);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
    (void)cudaGetLastError();
    /* The same through the driver. */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cuMemFreeAsync((CUdeviceptr)(uintptr_t)q, (CUstream)s) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
    (void)cudaGetLastError();
    /* q is still the program's, with its bytes, and its cache block is not handed out. */
    unsigned char b = 0;
    CHECK(cuMemcpyDtoH(&b, (CUdeviceptr)(uintptr_t)q + MiB - 1, 1) == CUDA_SUCCESS && b == 5);
    CHECK(cudaMalloc(&r, MiB) == cudaSuccess);
    CHECK(r != q);
    CHECK(cudaFree(r) == cudaSuccess);
    CHECK(cudaFree(q) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemAlloc_v2") == n0);
    /* A cudaMalloc needing a new segment during a global capture fails as the runtime's
     * own would, with the capture's code, not as an out-of-memory. */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    void *x = NULL;
    CHECK(cudaMalloc(&x, 8 * MiB) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);
    return 0;
}

/* Item 8: the runtime's last error is the latest error, reset when read (unless sticky). */
static int lasterror(void)
{
    void *p = NULL;
    cudaStream_t bogus = (cudaStream_t)(uintptr_t)0x1234;
    CHECK(cudaMalloc(&p, (size_t)1 << 40) == cudaErrorMemoryAllocation); /* memtrace's */
    CHECK(cudaStreamDestroy(bogus) == cudaErrorInvalidResourceHandle);   /* the runtime's */
    CHECK(cudaPeekAtLastError() == cudaErrorInvalidResourceHandle);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaStreamDestroy(bogus) == cudaErrorInvalidResourceHandle);
    CHECK(cudaMalloc(&p, (size_t)1 << 40) == cudaErrorMemoryAllocation);
    CHECK(cudaPeekAtLastError() == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaSuccess);
    return 0;
}

/* Item 9: a fork child never gets a parent's pointer from the inherited cache. */
static int forked(void)
{
    void *p = NULL;
    CHECK(cudaMalloc(&p, MiB) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess); /* cached in the parent */
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        void *q = NULL;
        cudaError_t e = cudaMalloc(&q, MiB);
        if (q == p && p != NULL)
            _exit(1);
        _exit(e == cudaErrorInitializationError ? 0 : 2); /* as the real runtime answers */
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fprintf(stderr, "child exit %d\n", WEXITSTATUS(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(cudaMalloc(&p, MiB) == cudaSuccess); /* the parent goes on */
    return 0;
}

/* Item 9 on sim: the child's first call finds no inherited allocator and makes its own. */
static int forked_sim(void)
{
    long (*stats)(char *, size_t) =
        (long (*)(char *, size_t))dlsym(RTLD_DEFAULT, "memtrace_stats_json");
    CHECK(stats != NULL);
    void *p = NULL;
    CHECK(cudaMalloc(&p, MiB) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        static char js[1 << 16];
        if (stats(js, sizeof js) <= 0 || strstr(js, "\"devices\":[]") == NULL)
            _exit(1); /* the parent's allocator is still there */
        void *q = NULL;
        if (cudaMalloc(&q, MiB) != cudaSuccess || stats(js, sizeof js) <= 0 ||
            strstr(js, "\"num_device_alloc\":1") == NULL)
            _exit(2);
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fprintf(stderr, "child exit %d\n", WEXITSTATUS(status));
    CHECK(WEXITSTATUS(status) == 0);
    return 0;
}

/* Item 12: what memtrace caches is given back when another allocator runs out. */
static int oom(void)
{
    void *p = NULL;
    CHECK(cudaMalloc(&p, 40 * MiB) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess); /* 40 of the fake's 64 MiB cached */
    CHECK(bind_ctx(NULL) == 0);
    CUdeviceptr m = 0;
    CHECK(cuMemAllocManaged(&m, 40 * MiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
    CHECK(cuMemFree(m) == CUDA_SUCCESS);
    /* NCCL's way: cuMemCreate fetched through cuGetProcAddress */
    CHECK(cudaMalloc(&p, 40 * MiB) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long) = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK(cuGetProcAddress("cuMemCreate", (void **)&create, CUDA_VERSION, 0, &st) == CUDA_SUCCESS &&
          create != NULL);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h = 0;
    CHECK(create(&h, 40 * MiB, &prop, 0) == CUDA_SUCCESS);
    CHECK(cuMemRelease(h) == CUDA_SUCCESS);
    return 0;
}

/* Managed memory: attached globally it is memtrace's (two blocks of one managed segment
 * from the driver), and prefetches and advice of its blocks reach the driver through the
 * managed allocator; attached to the host it is the driver's own allocation. */
static int managed(void)
{
    size_t n0 = fake_cuda_count("cuMemAllocManaged");
    size_t p0 = fake_cuda_count("cuMemPrefetchAsync_v2"), a0 = fake_cuda_count("cuMemAdvise_v2");
    void *m = NULL, *m2 = NULL, *h = NULL;
    CHECK(cudaMallocManaged(&m, 4096, cudaMemAttachGlobal) == cudaSuccess);
    CHECK(cudaMallocManaged(&m2, 4096, cudaMemAttachGlobal) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemAllocManaged") == n0 + 1);
    struct cudaMemLocation dev = {.type = cudaMemLocationTypeDevice, .id = 0};
    CHECK(cudaMemPrefetchAsync(m, 4096, dev, 0, NULL) == cudaSuccess);
    CHECK(cudaMemAdvise(m2, 4096, cudaMemAdviseSetReadMostly, dev) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemPrefetchAsync_v2") == p0 + 1);
    CHECK(fake_cuda_count("cuMemAdvise_v2") == a0 + 1);
    CHECK(cudaMemPrefetchAsync((char *)m + 4096 * 1024, 4096, dev, 0, NULL) != cudaSuccess);
    (void)cudaGetLastError();
    CHECK(cudaMallocManaged(&h, 4096, cudaMemAttachHost) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemAllocManaged") == n0 + 2);
    uint64_t flags = 0, size = 0;
    for (size_t i = fake_cuda_ncalls(); i-- > 0;)
        if (strcmp(fake_cuda_call(i, &flags, &size), "cuMemAllocManaged") == 0)
            break;
    CHECK(flags == CU_MEM_ATTACH_HOST && size == 4096);
    CHECK(cudaFree(h) == cudaSuccess);
    CHECK(cudaFree(m) == cudaSuccess && cudaFree(m2) == cudaSuccess);
    /* the driver's entry points, a program's own */
    CHECK(bind_ctx(NULL) == 0);
    CUdeviceptr d = 0;
    CHECK(cuMemAllocManaged(&d, 4096, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
    CHECK(fake_cuda_count("cuMemAllocManaged") == n0 + 2); /* from the cached segment */
    CUmemLocation host = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    CHECK(cuMemPrefetchAsync(d, 4096, host, 0, NULL) == CUDA_SUCCESS);
    CHECK(fake_cuda_count("cuMemPrefetchAsync_v2") == p0 + 2);
    CHECK(cuMemFree(d) == CUDA_SUCCESS);
    return 0;
}

/* Under a CUDA 12 runtime (FAKERT_VERSION=12080) the unsuffixed prefetch and advice are
 * the device-ordinal forms: memtrace reads them so (a misread location or stream would
 * be refused by the strict fake driver). */
static int managed_old(void)
{
    typedef cudaError_t (*old_prefetch)(const void *, size_t, int, cudaStream_t);
    typedef cudaError_t (*old_advise)(const void *, size_t, enum cudaMemoryAdvise, int);
    void *m = NULL;
    cudaStream_t s;
    /* what a program built against CUDA 12's headers calls under these names */
    void *volatile pf = (void *)cudaMemPrefetchAsync, *volatile ad = (void *)cudaMemAdvise;
    old_prefetch prefetch = (old_prefetch)pf;
    old_advise advise = (old_advise)ad;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaMallocManaged(&m, 4096, cudaMemAttachGlobal) == cudaSuccess);
    size_t p0 = fake_cuda_count("cuMemPrefetchAsync_v2"), a0 = fake_cuda_count("cuMemAdvise_v2");
    CHECK(prefetch(m, 4096, 0, s) == cudaSuccess);
    CHECK(prefetch(m, 4096, cudaCpuDeviceId, NULL) == cudaSuccess);
    CHECK(advise(m, 4096, cudaMemAdviseSetPreferredLocation, 0) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemPrefetchAsync_v2") == p0 + 2);
    CHECK(fake_cuda_count("cuMemAdvise_v2") == a0 + 1);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(cudaFree(m) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    return 0;
}

/* Item 6: queries on a sub-allocated block describe the block; IPC refuses loudly. */
static int range(void)
{
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, 1000) == cudaSuccess);
    CHECK(cudaMalloc(&b, 1000) == cudaSuccess);
    CHECK(bind_ctx(NULL) == 0);
    CUdeviceptr base = 0, start = 0;
    size_t size = 0;
    CHECK(cuMemGetAddressRange(&base, &size, DP(b) + 16) == CUDA_SUCCESS);
    CHECK(base == DP(b) && size >= 1000 && size < MiB);
    CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, DP(b) + 16) ==
          CUDA_SUCCESS);
    CHECK(start == DP(b));
    CUipcMemHandle ipc;
    CHECK(cuIpcGetMemHandle(&ipc, DP(a)) == CUDA_SUCCESS); /* a starts its segment */
    CUdeviceptr opens_at = 0; /* the fake's handle holds where it opens */
    memcpy(&opens_at, ipc.reserved, sizeof opens_at);
    CHECK(opens_at == DP(a));
    CHECK(cuIpcGetMemHandle(&ipc, DP(b)) == CUDA_ERROR_NOT_SUPPORTED);
    return 0;
}

/* Item 6: expandable segments ask for the shareable handle type they are told to. */
static int handles(void)
{
    void *a = NULL;
    CHECK(cudaMalloc(&a, 4 * MiB) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemCreate") > 0);
    CHECK(fake_cuda_handle_types() & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    return 0;
}

/* Item 16: a static libcudart's cudaMalloc reaches memtrace through the driver's entry
 * points it fetched with cuGetProcAddress. */
static int staticrt(void)
{
    void *p = NULL, *q = NULL;
    CHECK(fakert_static_malloc(&p, 3000) == cudaSuccess);
    CHECK(fakert_static_free(p) == cudaSuccess);
    size_t n0 = fake_cuda_count("cuMemAlloc_v2");
    CHECK(fakert_static_malloc(&q, 3000) == cudaSuccess);
    CHECK(q == p && fake_cuda_count("cuMemAlloc_v2") == n0); /* memtrace's cache served it */
    CHECK(cudaFree(q) == cudaSuccess);                       /* and memtrace knows the block */
    return 0;
}

/* A double free, or the free of a cached block that starts its segment, is the program's
 * error: answered as the runtime (driver) would, never passed on, since the real free
 * would release memtrace's whole segment under the blocks still live in it. */
static int doublefree(void)
{
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, MiB) == cudaSuccess); /* starts its segment */
    CHECK(cudaMalloc(&b, MiB) == cudaSuccess); /* the same segment */
    CHECK(cudaFree(a) == cudaSuccess);
    size_t n0 = fake_cuda_count("cuMemFree_v2");
    CHECK(cudaFree(a) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaFree((char *)b + 16) == cudaErrorInvalidValue); /* inside a live block */
    CHECK(fake_cuda_count("cuMemFree_v2") == n0);
    CHECK(bind_ctx(NULL) == 0);
    CHECK(cuMemsetD8Async(DP(b), 1, MiB, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS); /* the segment is still there */
    CUdeviceptr d = 0;
    CHECK(cuMemAlloc(&d, 3 * MiB) == CUDA_SUCCESS);
    CHECK(cuMemFree(d) == CUDA_SUCCESS);
    CHECK(cuMemFree(d) == CUDA_ERROR_INVALID_VALUE);
    CHECK(fake_cuda_count("cuMemFree_v2") == n0);
    CHECK(cuMemsetD8Async(DP(b), 2, MiB, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(cudaFree(b) == cudaSuccess);
    return 0;
}

/* cudaFree(0) is how programs make the runtime create and bind the context (PyTorch
 * before NVRTC): it must reach the runtime. */
static int free0(void)
{
    CUcontext c = NULL;
    CHECK(cudaFree(NULL) == cudaSuccess);
    CHECK(cuCtxGetCurrent(&c) == CUDA_SUCCESS);
    CHECK(c != NULL);
    return 0;
}

/* The runtime binds a context on every thread that makes a runtime call (the first
 * cudaMalloc of a new thread included), so driver calls after it work there. */
static void *thread_ctx_body(void *arg)
{
    (void)arg;
    void *p = NULL;
    CUcontext c = NULL;
    if (cudaMalloc(&p, MiB) != cudaSuccess || p == NULL)
        return "cudaMalloc failed";
    if (cuCtxGetCurrent(&c) != CUDA_SUCCESS || c == NULL)
        return "no current context after cudaMalloc";
    if (cuMemsetD8Async(DP(p), 1, MiB, NULL) != CUDA_SUCCESS)
        return "cuMemsetD8Async failed";
    if (cuStreamSynchronize(NULL) != CUDA_SUCCESS)
        return "cuStreamSynchronize failed";
    if (cudaFree(p) != cudaSuccess)
        return "cudaFree failed";
    return NULL;
}

static int threadctx(void)
{
    CHECK(cudaFree(NULL) == cudaSuccess);
    pthread_t t;
    void *why = NULL;
    CHECK(pthread_create(&t, NULL, thread_ctx_body, NULL) == 0);
    CHECK(pthread_join(t, &why) == 0);
    if (why != NULL)
        fprintf(stderr, "thread: %s\n", (const char *)why);
    CHECK(why == NULL);
    return 0;
}

/* Memory of a context made with cuCtxCreate is that context's own: a kernel (here a
 * memset) of the context works on what cuMemAlloc gave it there. */
static int ctxcreate(void)
{
    CUcontext x = NULL;
    CUdeviceptr d = 0;
    unsigned char out[256];
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuCtxCreate(&x, NULL, 0, 0) == CUDA_SUCCESS);
    CHECK(cuMemAlloc(&d, MiB) == CUDA_SUCCESS);
    CHECK(cuMemsetD8Async(d, 0x5a, MiB, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoH(out, d + MiB - sizeof out, sizeof out) == CUDA_SUCCESS);
    for (size_t i = 0; i < sizeof out; i++)
        CHECK(out[i] == 0x5a);
    CHECK(cuMemFree(d) == CUDA_SUCCESS);
    /* The runtime allocates in the current context too. */
    void *p = NULL;
    CHECK(cudaMalloc(&p, MiB) == cudaSuccess);
    CHECK(cuMemsetD8Async(DP(p), 0x6b, MiB, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoH(out, DP(p), sizeof out) == CUDA_SUCCESS);
    for (size_t i = 0; i < sizeof out; i++)
        CHECK(out[i] == 0x6b);
    CHECK(cudaFree(p) == cudaSuccess);
    CHECK(cuCtxDestroy(x) == CUDA_SUCCESS);
    return 0;
}

/* A cuCtxDestroy of the primary context that the driver refuses changes nothing: the
 * program's live block stays usable and its free succeeds. */
static int destroyrefused(void)
{
    CUcontext pc = NULL;
    CUdeviceptr d = 0;
    unsigned char out[256];
    CHECK(bind_ctx(&pc) == 0);
    CHECK(cuMemAlloc(&d, MiB) == CUDA_SUCCESS);
    fake_cuda_fail("cuCtxDestroy", 1, CUDA_ERROR_INVALID_CONTEXT);
    CHECK(cuCtxDestroy(pc) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(cuMemsetD8Async(d, 3, MiB, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoH(out, d, sizeof out) == CUDA_SUCCESS);
    for (size_t i = 0; i < sizeof out; i++)
        CHECK(out[i] == 3);
    CHECK(cuMemFree(d) == CUDA_SUCCESS);
    return 0;
}

/* PyTorch's pluggable allocator: a block used on the default stream (record_stream with
 * stream 0, torch's default stream) is not reused before that stream's work is done. */
static int recstream0(void)
{
    void *(*alloc)(ssize_t, int, cudaStream_t) =
        (void *(*)(ssize_t, int, cudaStream_t))dlsym(RTLD_DEFAULT, "memtrace_alloc");
    void (*release)(void *, ssize_t, int, cudaStream_t) =
        (void (*)(void *, ssize_t, int, cudaStream_t))dlsym(RTLD_DEFAULT, "memtrace_free");
    void (*record)(void *, cudaStream_t) =
        (void (*)(void *, cudaStream_t))dlsym(RTLD_DEFAULT, "memtrace_record_stream");
    CHECK(alloc != NULL && release != NULL && record != NULL);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    void *pa = alloc((ssize_t)MiB, 0, s);
    CHECK(pa != NULL);
    record(pa, NULL);
    fake_cuda_hold(true); /* the default stream's work (a kernel reading pa) stays pending */
    release(pa, (ssize_t)MiB, 0, s);
    void *pb = alloc((ssize_t)MiB, 0, s);
    CHECK(pb != NULL);
    CHECK(pb != pa);
    fake_cuda_hold(false);
    release(pb, (ssize_t)MiB, 0, s);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    return 0;
}

/* memtrace_record_stream with the per-thread stream names the recording thread's own
 * stream: a free on another thread must wait for that stream's work, not the freeing
 * thread's. The user thread's stream is kept busy by a host function until the gate. */
static atomic_int pt_gate;
static void *pt_block;

static void CUDA_CB wait_gate(void *ud)
{
    (void)ud;
    while (!atomic_load(&pt_gate))
        usleep(1000);
}

static void *pt_user(void *arg)
{
    void (*record)(void *, cudaStream_t) = (void (*)(void *, cudaStream_t))arg;
    if (bind_ctx(NULL) != 0)
        return (void *)1;
    record(pt_block, cudaStreamPerThread);
    /* The kernel that reads the block, still running when the owner frees it. */
    if (cuLaunchHostFunc(CU_STREAM_PER_THREAD, wait_gate, NULL) != CUDA_SUCCESS)
        return (void *)1;
    return NULL;
}

static int recstreampt(void)
{
    void *(*alloc)(ssize_t, int, cudaStream_t) =
        (void *(*)(ssize_t, int, cudaStream_t))dlsym(RTLD_DEFAULT, "memtrace_alloc");
    void (*release)(void *, ssize_t, int, cudaStream_t) =
        (void (*)(void *, ssize_t, int, cudaStream_t))dlsym(RTLD_DEFAULT, "memtrace_free");
    void (*record)(void *, cudaStream_t) =
        (void (*)(void *, cudaStream_t))dlsym(RTLD_DEFAULT, "memtrace_record_stream");
    CHECK(alloc != NULL && release != NULL && record != NULL);
    CHECK(bind_ctx(NULL) == 0);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    pt_block = alloc((ssize_t)MiB, 0, s);
    CHECK(pt_block != NULL);
    pthread_t t;
    void *ret = (void *)1;
    CHECK(pthread_create(&t, NULL, pt_user, (void *)record) == 0);
    CHECK(pthread_join(t, &ret) == 0 && ret == NULL);
    release(pt_block, (ssize_t)MiB, 0, s);
    usleep(100 * 1000); /* time for any event that can complete to do so */
    void *pb = alloc((ssize_t)MiB, 0, s);
    CHECK(pb != NULL);
    if (pb == pt_block)
        fprintf(stderr, "the block came back while the user thread's stream still ran\n");
    int reused = pb == pt_block;
    atomic_store(&pt_gate, 1);
    release(pb, (ssize_t)MiB, 0, s);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(!reused);
    return 0;
}

/* Freeing stream-ordered memory with cudaFree/cuMemFree synchronises nothing (CUDA
 * documents no implicit sync there; a stream waiting on the host would hang); a
 * cudaMalloc pointer's free still synchronises the device. */
static int orderedfree(void)
{
    cudaStream_t s;
    void *p = NULL, *q = NULL;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaMalloc(&q, MiB) == cudaSuccess);
    size_t n0 = fake_cuda_count("cuCtxSynchronize");
    CHECK(cudaFree(q) == cudaSuccess);
    CHECK(fake_cuda_count("cuCtxSynchronize") == n0 + 1); /* the counter sees a sync */
    CHECK(cudaMallocAsync(&p, MiB, s) == cudaSuccess);
    n0 = fake_cuda_count("cuCtxSynchronize");
    CHECK(cudaFree(p) == cudaSuccess);
    CHECK(fake_cuda_count("cuCtxSynchronize") == n0);
    CHECK(bind_ctx(NULL) == 0);
    CUdeviceptr d = 0;
    CHECK(cuMemAllocAsync(&d, MiB, (CUstream)s) == CUDA_SUCCESS);
    n0 = fake_cuda_count("cuCtxSynchronize");
    CHECK(cuMemFree(d) == CUDA_SUCCESS);
    CHECK(fake_cuda_count("cuCtxSynchronize") == n0);
    CHECK(cuMemAlloc(&d, MiB) == CUDA_SUCCESS); /* a plain one still synchronises */
    n0 = fake_cuda_count("cuCtxSynchronize");
    CHECK(cuMemFree(d) == CUDA_SUCCESS);
    CHECK(fake_cuda_count("cuCtxSynchronize") == n0 + 1);
    /* Many at once, freed out of order: each is still known as stream-ordered. */
    enum { N = 600 };
    static void *many[N];
    for (int i = 0; i < N; i++)
        CHECK(cudaMallocAsync(&many[i], 4096, s) == cudaSuccess);
    n0 = fake_cuda_count("cuCtxSynchronize");
    for (int i = 0; i < N; i++)
        CHECK(cudaFree(many[(i * 7) % N]) == cudaSuccess); /* 7 is prime to N */
    CHECK(fake_cuda_count("cuCtxSynchronize") == n0);
    CHECK(cudaMalloc(&q, MiB) == cudaSuccess); /* and the fake still counts */
    n0 = fake_cuda_count("cuCtxSynchronize");
    CHECK(cudaFree(q) == cudaSuccess);
    CHECK(fake_cuda_count("cuCtxSynchronize") == n0 + 1);
    return 0;
}

/* The runtime's error and device queries run after every kernel launch (torch's
 * C10_CUDA_KERNEL_LAUNCH_CHECK) and every cudaMalloc: the drop-in finds the real ones once,
 * not with a dlsym per call. */
static int dlsymcache(void)
{
    void *p = NULL;
    CHECK(cudaMalloc(&p, 4096) == cudaSuccess); /* lookups made once */
    CHECK(cudaFree(p) == cudaSuccess);
    (void)cudaGetLastError();
    (void)cudaPeekAtLastError();
    size_t n0 = fakert_dlsym_count();
    for (int i = 0; i < 100; i++) {
        CHECK(cudaGetLastError() == cudaSuccess);
        CHECK(cudaPeekAtLastError() == cudaSuccess);
        CHECK(cudaMalloc(&p, 4096) == cudaSuccess);
        CHECK(cudaFree(p) == cudaSuccess);
    }
    size_t n = fakert_dlsym_count() - n0;
    if (n > 0)
        fprintf(stderr, "%zu dlsym calls for 400 runtime calls\n", n);
    CHECK(n == 0);
    return 0;
}

/* The device whose memory p is, as the driver says; -1 if it cannot. */
static int ptr_device(const void *p)
{
    int dev = -1;
    if (cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, DP(p)) != CUDA_SUCCESS)
        return -1;
    return dev;
}

/* Stream-ordered allocation comes from the pool of the stream's device, not the current
 * device's (run with FAKE_CUDA_DEVICES=2). */
static int streamdev(void)
{
    int n = 0;
    CHECK(cuInit(0) == CUDA_SUCCESS && cuDeviceGetCount(&n) == CUDA_SUCCESS && n == 2);
    cudaStream_t s1;
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    void *p = NULL, *q = NULL;
    CHECK(cudaMalloc(&q, 4096) == cudaSuccess); /* the current device's, as a control */
    CHECK(ptr_device(q) == 0);
    CHECK(cudaMallocAsync(&p, MiB, s1) == cudaSuccess);
    int dev = ptr_device(p);
    if (dev != 1)
        fprintf(stderr, "cudaMallocAsync on device 1's stream gave device %d's memory\n", dev);
    CHECK(dev == 1);
    CUdeviceptr d = 0;
    CHECK(cuMemAllocAsync(&d, MiB, (CUstream)s1) == CUDA_SUCCESS);
    dev = ptr_device((void *)(uintptr_t)d);
    if (dev != 1)
        fprintf(stderr, "cuMemAllocAsync on device 1's stream gave device %d's memory\n", dev);
    CHECK(dev == 1);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaFreeAsync(p, s1) == cudaSuccess);
    CHECK(cuMemFreeAsync(d, (CUstream)s1) == CUDA_SUCCESS);
    CHECK(cudaStreamSynchronize(s1) == cudaSuccess);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaFree(q) == cudaSuccess);
    return 0;
}

/* A pool the program set (its access, or a pool made current to a device) keeps that
 * device's stream-ordered allocations with the driver and the runtime, which honour it;
 * memtrace's memory would not (run with FAKE_CUDA_DEVICES=2). */
static int ownpool(void)
{
    CHECK(bind_ctx(NULL) == 0);
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CUdeviceptr d = 0;
    size_t n0 = fake_cuda_count("cuMemAllocAsync");
    CHECK(cuMemAllocAsync(&d, MiB, s) == CUDA_SUCCESS);
    CHECK(cuMemFreeAsync(d, s) == CUDA_SUCCESS);
    CHECK(fake_cuda_count("cuMemAllocAsync") == n0); /* memtrace's, before any pool is set */
    CUmemoryPool pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, 0) == CUDA_SUCCESS);
    CUmemAccessDesc desc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1},
                            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(cuMemPoolSetAccess(pool, &desc, 1) == CUDA_SUCCESS);
    CHECK(cuMemAllocAsync(&d, MiB, s) == CUDA_SUCCESS);
    CHECK(fake_cuda_count("cuMemAllocAsync") == n0 + 1);
    void *p = NULL;
    CHECK(cudaMallocAsync(&p, MiB, (cudaStream_t)s) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemAllocAsync") == n0 + 2);
    CHECK(cuMemFreeAsync(d, s) == CUDA_SUCCESS);
    CHECK(cudaFreeAsync(p, (cudaStream_t)s) == cudaSuccess);
    CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
    /* A pool made current to device 1: its streams' allocations are the driver's too. */
    CHECK(cudaSetDevice(1) == cudaSuccess);
    cudaStream_t s1;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaMallocAsync(&p, MiB, s1) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemAllocAsync") == n0 + 2); /* memtrace's still */
    CHECK(cudaFreeAsync(p, s1) == cudaSuccess);
    CUmemoryPool pool1;
    CHECK(cuDeviceGetDefaultMemPool(&pool1, 1) == CUDA_SUCCESS);
    CHECK(cuDeviceSetMemPool(1, pool1) == CUDA_SUCCESS);
    CHECK(cudaMallocAsync(&p, MiB, s1) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemAllocAsync") == n0 + 3);
    CHECK(cudaFreeAsync(p, s1) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s1) == cudaSuccess);
    return 0;
}

/* Peer access enabled behind memtrace's back (NCCL's static cudart does so) makes the
 * program's own enable answer AlreadyEnabled: memtrace's expandable segments must still be
 * opened to the peer (cuMemSetAccess), or the peer's kernels fault on them (run with
 * FAKE_CUDA_DEVICES=2). Runtime: device 0 reaches device 1's block; driver: 1 reaches 0's. */
static int peerseen(void)
{
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CUcontext c0, c1;
    CHECK(cuDevicePrimaryCtxRetain(&c0, 0) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRetain(&c1, 1) == CUDA_SUCCESS);
    void *p0 = NULL, *p1 = NULL;
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaMalloc(&p1, MiB) == cudaSuccess);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaMalloc(&p0, MiB) == cudaSuccess);
    CHECK(cuCtxSetCurrent(c0) == CUDA_SUCCESS);
    fake_cuda_peer_unseen(0, 1);         /* unseen by memtrace */
    CHECK(!fake_cuda_can_access(0, p1)); /* VMM memory needs cuMemSetAccess too */
    CHECK(cudaDeviceEnablePeerAccess(1, 0) == cudaErrorPeerAccessAlreadyEnabled);
    CHECK(cudaGetLastError() == cudaErrorPeerAccessAlreadyEnabled);
    if (!fake_cuda_can_access(0, p1))
        fprintf(stderr, "runtime: device 0 cannot reach device 1's block\n");
    CHECK(fake_cuda_can_access(0, p1));
    CHECK(cuCtxSetCurrent(c1) == CUDA_SUCCESS);
    fake_cuda_peer_unseen(1, 0);
    CHECK(!fake_cuda_can_access(1, p0));
    CHECK(cuCtxEnablePeerAccess(c0, 0) == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    if (!fake_cuda_can_access(1, p0))
        fprintf(stderr, "driver: device 1 cannot reach device 0's block\n");
    CHECK(fake_cuda_can_access(1, p0));
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaFree(p1) == cudaSuccess);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaFree(p0) == cudaSuccess);
    return 0;
}

/* A mark before any allocation makes no allocator, hence no context on any device
 * (each DDP rank would hold one on GPU 0): it is kept until the first allocator. */
static int earlymark(void)
{
    int (*mark)(int, uint64_t) = (int (*)(int, uint64_t))dlsym(RTLD_DEFAULT, "memtrace_mark");
    int (*named)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "memtrace_mark_named");
    long (*stats)(char *, size_t) =
        (long (*)(char *, size_t))dlsym(RTLD_DEFAULT, "memtrace_stats_json");
    CHECK(mark != NULL && named != NULL && stats != NULL);
    CHECK(mark(1, 7) == 0); /* MT_MARK_ITERATION */
    CHECK(named("before") == 0);
    CHECK(fake_cuda_count("cuDevicePrimaryCtxRetain") == 0);
    CHECK(fake_cuda_count("cuCtxCreate_v2") == 0);
    static char js[1 << 16];
    CHECK(stats(js, sizeof js) > 0 && strstr(js, "\"devices\":[]") != NULL);
    void *p = NULL;
    CHECK(cudaMalloc(&p, 4096) == cudaSuccess); /* the program's own first use */
    CHECK(mark(1, 8) == 0);
    CHECK(cudaFree(p) == cudaSuccess);
    return 0;
}

/* Device memory taken outside memtrace's allocator, each piece by a caller the drop-in must
 * name (test_preload_cuda.c reads the log): libfakenccl.so's pitched buffer (8 MiB) and
 * physical memory (2 MiB) from the driver, its pitched buffer through a runtime entry point
 * memtrace does not hook (1 MiB), and the program's cudaMallocPitch (512 KiB) and its
 * allocations under a context it made. */
static int outside(void)
{
    void *mine = NULL, *buf = NULL, *viart = NULL, *pp = NULL;
    size_t pitch = 0;
    unsigned long long h = 0;
    CHECK(cudaMalloc(&mine, MiB) == cudaSuccess);
    CHECK(fakenccl_alloc(4096, 2048, &buf) == CUDA_SUCCESS);
    CHECK(fakenccl_create(0, 2 * MiB, &h) == CUDA_SUCCESS);
    CHECK(fakenccl_runtime_pitch(4096, 256, &viart) == 0);
    CHECK(cudaMallocPitch(&pp, &pitch, 1000, 512) == cudaSuccess && pitch == 1024);
    CHECK(fakenccl_release(h) == CUDA_SUCCESS);
    CHECK(fakenccl_free(buf) == CUDA_SUCCESS);
    CHECK(cudaFree(viart) == cudaSuccess);
    CHECK(cudaFree(pp) == cudaSuccess);
    CHECK(cudaFree(mine) == cudaSuccess);
    CHECK(fake_cuda_count("cuMemAllocPitch_v2") == 3 && fake_cuda_count("cuMemRelease") == 1);
    /* Under a context of the program's own, its cuMemAlloc (3 MiB) and cudaMalloc (4 MiB,
     * through the runtime) are the driver's: the program's outside memory too. */
    CUcontext x = NULL;
    CUdeviceptr d = 0;
    CHECK(cuCtxCreate(&x, NULL, 0, 0) == CUDA_SUCCESS);
    CHECK(cuMemAlloc(&d, 3 * MiB) == CUDA_SUCCESS);
    CHECK(cudaMalloc(&mine, 4 * MiB) == cudaSuccess);
    CHECK(cudaFree(mine) == cudaSuccess);
    CHECK(cuMemFree(d) == CUDA_SUCCESS);
    CHECK(cuCtxDestroy(x) == CUDA_SUCCESS);
    return 0;
}

static void *sticky_thread(void *arg)
{
    (void)arg;
    void *p = NULL;
    return (void *)(intptr_t)cudaMalloc(&p, MiB);
}

/* Section-1 #10: after a sticky error the runtime's cudaMalloc fails with it, every call
 * on every thread, until a reset; so does the drop-in's, on a cache hit too (no driver
 * call). The error reaches memtrace from the runtime (a synchronize saw it) or from a call
 * memtrace served (a cache miss's cuMemAlloc). */
static int stickyhit(void)
{
    void *p = NULL;
    CHECK(cudaMalloc(&p, MiB) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess); /* cached */
    size_t n0 = fake_cuda_count("cuMemAlloc_v2");
    fake_cuda_fault(0, CUDA_ERROR_ILLEGAL_ADDRESS); /* a kernel faulted */
    CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
    CHECK(cudaMalloc(&p, MiB) == cudaErrorIllegalAddress);
    CHECK(cudaMallocAsync(&p, MiB, NULL) == cudaErrorIllegalAddress);
    pthread_t t;
    void *res = NULL;
    CHECK(pthread_create(&t, NULL, sticky_thread, NULL) == 0);
    CHECK(pthread_join(t, &res) == 0);
    CHECK((cudaError_t)(intptr_t)res == cudaErrorIllegalAddress);
    CHECK(fake_cuda_count("cuMemAlloc_v2") == n0); /* hits: no driver call */
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    CHECK(cudaDeviceReset() == cudaSuccess);
    CHECK(cudaMalloc(&p, MiB) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess); /* cached again */

    fake_cuda_fault(0, CUDA_ERROR_ILLEGAL_ADDRESS);
    void *big = NULL;
    CHECK(cudaMalloc(&big, 8 * MiB) == cudaErrorIllegalAddress); /* a miss sees it */
    CHECK(cudaMalloc(&p, MiB) == cudaErrorIllegalAddress);
    CHECK(cudaDeviceReset() == cudaSuccess);
    CHECK(cudaMalloc(&p, MiB) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess);
    return 0;
}

/* The same through the driver's entry points, which a static runtime's cudaMalloc reaches:
 * a hit after a fault the context holds fails with the fault, not with "no context" nor
 * success, and makes no driver allocation; the primary context's reset clears it. */
static int stickyhit_drv(void)
{
    CUcontext c;
    CHECK(bind_ctx(&c) == 0);
    CUdeviceptr d = 0;
    CHECK(cuMemAlloc(&d, MiB) == CUDA_SUCCESS);
    CHECK(cuMemFree(d) == CUDA_SUCCESS); /* cached */
    size_t n0 = fake_cuda_count("cuMemAlloc_v2");
    fake_cuda_fault(0, CUDA_ERROR_ILLEGAL_ADDRESS); /* a kernel faulted */
    CHECK(cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(cuMemAlloc(&d, MiB) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(cuMemAllocAsync(&d, MiB, NULL) == CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK(fake_cuda_count("cuMemAlloc_v2") == n0); /* hits: no driver allocation */
    CHECK(cuDevicePrimaryCtxReset(0) == CUDA_SUCCESS);
    CHECK(bind_ctx(&c) == 0);
    CHECK(cuMemAlloc(&d, MiB) == CUDA_SUCCESS);
    CHECK(cuMemFree(d) == CUDA_SUCCESS); /* cached again */

    /* A fault the runtime's cudaMalloc saw is gone after the driver's reset too: one
     * reset, whichever API made it. */
    fake_cuda_fault(0, CUDA_ERROR_ILLEGAL_ADDRESS);
    void *big = NULL, *p = NULL;
    CHECK(cudaMalloc(&big, 8 * MiB) == cudaErrorIllegalAddress); /* a miss sees it */
    CHECK(cudaMalloc(&p, MiB) == cudaErrorIllegalAddress);       /* a hit too */
    CHECK(cuDevicePrimaryCtxReset(0) == CUDA_SUCCESS);
    CHECK(bind_ctx(&c) == 0);
    CHECK(cudaMalloc(&p, MiB) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*fn)(void);
    } scen[] = {
        {"lookup", lookup},
        {"procaddr", procaddr},
        {"reset", reset},
        {"foreign", foreign},
        {"freeasync0", freeasync0},
        {"capture", capture},
        {"lasterror", lasterror},
        {"fork", forked},
        {"fork_sim", forked_sim},
        {"oom", oom},
        {"managed", managed},
        {"managed_old", managed_old},
        {"range", range},
        {"handles", handles},
        {"static", staticrt},
        {"doublefree", doublefree},
        {"free0", free0},
        {"threadctx", threadctx},
        {"ctxcreate", ctxcreate},
        {"destroyrefused", destroyrefused},
        {"recstream0", recstream0},
        {"orderedfree", orderedfree},
        {"dlsymcache", dlsymcache},
        {"earlymark", earlymark},
        {"streamdev", streamdev},
        {"ownpool", ownpool},
        {"peerseen", peerseen},
        {"recstreampt", recstreampt},
        {"outside", outside},
        {"stickyhit", stickyhit},
        {"stickyhit_drv", stickyhit_drv},
    };
    for (size_t i = 0; argc > 1 && i < sizeof scen / sizeof scen[0]; i++)
        if (strcmp(argv[1], scen[i].name) == 0)
            return scen[i].fn();
    fprintf(stderr, "usage: prog_gpurt SCENARIO\n");
    return 2;
}
