/* A fake CUDA driver on host memory, loaded by the cuda backend through
 * MEMTRACE_LIBCUDA=<path of this library>. It implements exactly the entry points the
 * backend resolves, records every call (name and two arguments), fails on demand, and
 * can hold stream work back so that events stay pending until released.
 *
 * It is a test double: one process-wide state (fake_t, below) is the whole device. Work
 * "on streams" runs at once unless held; held work runs in FIFO order (across streams,
 * which is one legal schedule) when released or when a synchronising call waits on it. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <cuda.h>

#define FAKE_API __attribute__((visibility("default")))
#define GRAN     ((size_t)2 << 20)
#define MAXLOG   8192
#define MAXQ     1024

typedef struct fake_call_s {
    const char *name;
    uint64_t a, b;
} fake_call_t;

typedef struct fake_event_s {
    bool pending;
    uint64_t t_ns; /* host time the event completed */
} fake_event_t;

/* Held stream work. */
typedef struct fake_op_s {
    int kind; /* 0 copy, 1 set, 2 host func, 3 event */
    void *dst;
    const void *src;
    size_t n;
    int value;
    CUhostFn fn;
    void *ud;
    fake_event_t *ev;
} fake_op_t;

typedef struct fake_blk_s {
    struct fake_blk_s *next;
    void *p;
    size_t size;
    bool host;
} fake_blk_t;

typedef struct fake_handle_s {
    size_t size;
} fake_handle_t;

/* The whole fake device. used = bytes of live cuMemAlloc blocks + cuMemCreate handles;
 * used <= capacity at all times. */
static struct {
    pthread_mutex_t mu;
    size_t capacity;
    size_t used;
    int devices;
    fake_blk_t *blks;
    fake_call_t log[MAXLOG];
    size_t nlog;
    const char *fail_name; /* the next fail_count calls of fail_name return fail_res */
    unsigned fail_count;
    CUresult fail_res;
    bool hold;
    fake_op_t q[MAXQ];
    size_t nq;
    long ctx_depth; /* pushes minus pops, all threads */
} fake = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .capacity = (size_t)64 << 20,
    .devices = 1,
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Logs the call and returns the injected failure for it, or CUDA_SUCCESS. */
static CUresult enter(const char *name, uint64_t a, uint64_t b)
{
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fake.mu);
    if (fake.nlog < MAXLOG)
        fake.log[fake.nlog++] = (fake_call_t){name, a, b};
    if (fake.fail_count > 0 && fake.fail_name != NULL && strcmp(fake.fail_name, name) == 0) {
        fake.fail_count--;
        r = fake.fail_res;
    }
    pthread_mutex_unlock(&fake.mu);
    return r;
}

#define ENTER(name, a, b)                                                                          \
    do {                                                                                           \
        CUresult r_ = enter(name, (uint64_t)(a), (uint64_t)(b));                                   \
        if (r_ != CUDA_SUCCESS)                                                                    \
            return r_;                                                                             \
    } while (0)

static void run_op(fake_op_t *op)
{
    switch (op->kind) {
    case 0:
        memmove(op->dst, op->src, op->n);
        break;
    case 1:
        memset(op->dst, op->value, op->n);
        break;
    case 2:
        op->fn(op->ud);
        break;
    default:
        op->ev->t_ns = now_ns();
        op->ev->pending = false;
        break;
    }
}

/* Runs all held work. Host functions run without the lock (they may call back). */
static void flush(void)
{
    for (;;) {
        pthread_mutex_lock(&fake.mu);
        if (fake.nq == 0) {
            pthread_mutex_unlock(&fake.mu);
            return;
        }
        fake_op_t op = fake.q[0];
        memmove(fake.q, fake.q + 1, (fake.nq - 1) * sizeof op);
        fake.nq--;
        if (op.kind != 2)
            run_op(&op);
        pthread_mutex_unlock(&fake.mu);
        if (op.kind == 2)
            run_op(&op);
    }
}

static CUresult submit(fake_op_t op)
{
    pthread_mutex_lock(&fake.mu);
    if (fake.hold && fake.nq < MAXQ) {
        if (op.kind == 3)
            op.ev->pending = true;
        fake.q[fake.nq++] = op;
        pthread_mutex_unlock(&fake.mu);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&fake.mu);
    flush(); /* keep FIFO order with anything held before */
    run_op(&op);
    return CUDA_SUCCESS;
}

/* ---- control, for tests ---- */

FAKE_API void fake_cuda_reset(size_t capacity, int devices);
FAKE_API void fake_cuda_fail(const char *name, unsigned count, CUresult res);
FAKE_API void fake_cuda_hold(bool on);
FAKE_API size_t fake_cuda_ncalls(void);
FAKE_API const char *fake_cuda_call(size_t i, uint64_t *a, uint64_t *b);
FAKE_API size_t fake_cuda_count(const char *name);
FAKE_API size_t fake_cuda_used(void);
FAKE_API long fake_cuda_ctx_depth(void);

/* Forgets the call log and failure plan; live memory stays (tests destroy backends). */
void fake_cuda_reset(size_t capacity, int devices)
{
    flush();
    pthread_mutex_lock(&fake.mu);
    fake.capacity = capacity;
    fake.devices = devices;
    fake.nlog = 0;
    fake.fail_name = NULL;
    fake.fail_count = 0;
    fake.hold = false;
    pthread_mutex_unlock(&fake.mu);
}

void fake_cuda_fail(const char *name, unsigned count, CUresult res)
{
    pthread_mutex_lock(&fake.mu);
    fake.fail_name = name;
    fake.fail_count = count;
    fake.fail_res = res;
    pthread_mutex_unlock(&fake.mu);
}

void fake_cuda_hold(bool on)
{
    pthread_mutex_lock(&fake.mu);
    fake.hold = on;
    pthread_mutex_unlock(&fake.mu);
    if (!on)
        flush();
}

size_t fake_cuda_ncalls(void)
{
    return fake.nlog;
}

const char *fake_cuda_call(size_t i, uint64_t *a, uint64_t *b)
{
    if (i >= fake.nlog)
        return NULL;
    *a = fake.log[i].a;
    *b = fake.log[i].b;
    return fake.log[i].name;
}

size_t fake_cuda_count(const char *name)
{
    size_t n = 0;
    for (size_t i = 0; i < fake.nlog; i++)
        n += strcmp(fake.log[i].name, name) == 0;
    return n;
}

size_t fake_cuda_used(void)
{
    return fake.used;
}

long fake_cuda_ctx_depth(void)
{
    return fake.ctx_depth;
}

/* ---- device, context ---- */

FAKE_API CUresult cuInit(unsigned int flags)
{
    ENTER("cuInit", flags, 0);
    return fake.devices > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

FAKE_API CUresult cuDeviceGetCount(int *count)
{
    ENTER("cuDeviceGetCount", 0, 0);
    *count = fake.devices;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    ENTER("cuDeviceGet", ordinal, 0);
    if (ordinal < 0 || ordinal >= fake.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

static int ctx_token;

FAKE_API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    ENTER("cuDevicePrimaryCtxRetain", dev, 0);
    *ctx = (CUcontext)&ctx_token;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    ENTER("cuDevicePrimaryCtxRelease", dev, 0);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    /* Not logged: every backend entry does it, the logs stay readable. */
    if (ctx != (CUcontext)&ctx_token)
        return CUDA_ERROR_INVALID_CONTEXT;
    __atomic_add_fetch(&fake.ctx_depth, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
    *ctx = (CUcontext)&ctx_token;
    __atomic_sub_fetch(&fake.ctx_depth, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxSynchronize(void)
{
    ENTER("cuCtxSynchronize", 0, 0);
    flush();
    return CUDA_SUCCESS;
}

/* ---- memory ---- */

static CUresult take(size_t size)
{
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fake.mu);
    if (size > fake.capacity - fake.used)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else
        fake.used += size;
    pthread_mutex_unlock(&fake.mu);
    return r;
}

static void give(size_t size)
{
    pthread_mutex_lock(&fake.mu);
    fake.used -= size;
    pthread_mutex_unlock(&fake.mu);
}

static CUresult blk_new(void **out, size_t size, bool host)
{
    size_t rounded = (size + 511) & ~(size_t)511;
    if (!host && take(rounded) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fake_blk_t *b = calloc(1, sizeof *b);
    void *p = aligned_alloc(512, rounded);
    if (b == NULL || p == NULL) {
        free(b);
        free(p);
        if (!host)
            give(rounded);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    b->p = p;
    b->size = host ? 0 : rounded;
    b->host = host;
    pthread_mutex_lock(&fake.mu);
    b->next = fake.blks;
    fake.blks = b;
    pthread_mutex_unlock(&fake.mu);
    *out = p;
    return CUDA_SUCCESS;
}

static CUresult blk_free(void *p, bool host)
{
    pthread_mutex_lock(&fake.mu);
    fake_blk_t **pp = &fake.blks;
    while (*pp != NULL && ((*pp)->p != p || (*pp)->host != host))
        pp = &(*pp)->next;
    fake_blk_t *b = *pp;
    if (b != NULL)
        *pp = b->next;
    pthread_mutex_unlock(&fake.mu);
    if (b == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!host)
        give(b->size);
    free(b->p);
    free(b);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
    ENTER("cuMemAlloc_v2", 0, size);
    void *q = NULL;
    CUresult r = blk_new(&q, size, false);
    *p = (CUdeviceptr)(uintptr_t)q;
    return r;
}

FAKE_API CUresult cuMemFree_v2(CUdeviceptr p)
{
    ENTER("cuMemFree_v2", p, 0);
    flush(); /* cuMemFree synchronises */
    return blk_free((void *)(uintptr_t)p, false);
}

FAKE_API CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    ENTER("cuMemGetInfo_v2", 0, 0);
    pthread_mutex_lock(&fake.mu);
    *free_b = fake.capacity - fake.used;
    *total_b = fake.capacity;
    pthread_mutex_unlock(&fake.mu);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemHostAlloc(void **p, size_t size, unsigned int flags)
{
    ENTER("cuMemHostAlloc", size, flags);
    return blk_new(p, size, true);
}

FAKE_API CUresult cuMemFreeHost(void *p)
{
    ENTER("cuMemFreeHost", (uintptr_t)p, 0);
    return blk_free(p, true);
}

/* ---- streams and events ---- */

FAKE_API CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    ENTER("cuStreamCreate", flags, 0);
    *s = malloc(1);
    return *s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

FAKE_API CUresult cuStreamDestroy_v2(CUstream s)
{
    ENTER("cuStreamDestroy", (uintptr_t)s, 0);
    free(s);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamSynchronize(CUstream s)
{
    ENTER("cuStreamSynchronize", (uintptr_t)s, 0);
    flush();
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamWaitEvent(CUstream s, CUevent ev, unsigned int flags)
{
    ENTER("cuStreamWaitEvent", (uintptr_t)s, (uintptr_t)ev);
    return CUDA_SUCCESS; /* one global FIFO: everything queued earlier runs first */
}

FAKE_API CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *ud)
{
    ENTER("cuLaunchHostFunc", (uintptr_t)s, 0);
    return submit((fake_op_t){.kind = 2, .fn = fn, .ud = ud});
}

FAKE_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    ENTER("cuMemcpyAsync", dst, n);
    return submit((fake_op_t){
        .kind = 0, .dst = (void *)(uintptr_t)dst, .src = (const void *)(uintptr_t)src, .n = n});
}

FAKE_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s)
{
    ENTER("cuMemsetD8Async", dst, n);
    return submit((fake_op_t){.kind = 1, .dst = (void *)(uintptr_t)dst, .value = v, .n = n});
}

FAKE_API CUresult cuEventCreate(CUevent *ev, unsigned int flags)
{
    ENTER("cuEventCreate", flags, 0);
    fake_event_t *e = calloc(1, sizeof *e);
    *ev = (CUevent)e;
    return e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

FAKE_API CUresult cuEventDestroy_v2(CUevent ev)
{
    ENTER("cuEventDestroy", (uintptr_t)ev, 0);
    free(ev);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuEventRecord(CUevent ev, CUstream s)
{
    ENTER("cuEventRecord", (uintptr_t)ev, (uintptr_t)s);
    return submit((fake_op_t){.kind = 3, .ev = (fake_event_t *)ev});
}

FAKE_API CUresult cuEventQuery(CUevent ev)
{
    ENTER("cuEventQuery", (uintptr_t)ev, 0);
    pthread_mutex_lock(&fake.mu);
    bool pending = ((fake_event_t *)ev)->pending;
    pthread_mutex_unlock(&fake.mu);
    return pending ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

FAKE_API CUresult cuEventSynchronize(CUevent ev)
{
    ENTER("cuEventSynchronize", (uintptr_t)ev, 0);
    flush();
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end)
{
    ENTER("cuEventElapsedTime", (uintptr_t)start, (uintptr_t)end);
    fake_event_t *a = (fake_event_t *)start, *b = (fake_event_t *)end;
    if (a->pending || b->pending)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)((int64_t)(b->t_ns - a->t_ns)) / 1e6);
    return CUDA_SUCCESS;
}

/* ---- virtual memory ---- */

FAKE_API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                                CUmemAllocationGranularity_flags opt)
{
    ENTER("cuMemGetAllocationGranularity", prop->location.id, opt);
    *g = GRAN;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                      unsigned long long flags)
{
    ENTER("cuMemAddressReserve", align, size);
    if (size == 0 || size % GRAN != 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* Over-reserve, then trim to a GRAN-aligned range. */
    uint8_t *m =
        mmap(NULL, size + GRAN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base = ((uintptr_t)m + GRAN - 1) & ~(uintptr_t)(GRAN - 1);
    if (base > (uintptr_t)m)
        munmap(m, base - (uintptr_t)m);
    munmap((void *)(base + size), (uintptr_t)m + size + GRAN - (base + size));
    *p = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
    ENTER("cuMemAddressFree", p, size);
    munmap((void *)(uintptr_t)p, size);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                              const CUmemAllocationProp *prop, unsigned long long flags)
{
    ENTER("cuMemCreate", prop->type, size);
    if (size == 0 || size % GRAN != 0 || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (take(size) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fake_handle_t *fh = calloc(1, sizeof *fh);
    fh->size = size;
    *h = (CUmemGenericAllocationHandle)(uintptr_t)fh;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    fake_handle_t *fh = (fake_handle_t *)(uintptr_t)h;
    ENTER("cuMemRelease", 0, fh->size);
    give(fh->size);
    free(fh);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
                           unsigned long long flags)
{
    ENTER("cuMemMap", p, size);
    fake_handle_t *fh = (fake_handle_t *)(uintptr_t)h;
    if (off != 0 || size != fh->size)
        return CUDA_ERROR_INVALID_VALUE;
    /* Mapped but not yet accessible: cuMemSetAccess opens it. */
    if (mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
             0) == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc,
                                 size_t count)
{
    ENTER("cuMemSetAccess", p, size);
    if (count != 1 || desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return CUDA_ERROR_INVALID_VALUE;
    mprotect((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
    ENTER("cuMemUnmap", p, size);
    mmap((void *)(uintptr_t)p, size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return CUDA_SUCCESS;
}
