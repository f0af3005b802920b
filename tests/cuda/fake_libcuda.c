/* A fake CUDA driver on host memory, loaded by the cuda backend through
 * MEMTRACE_LIBCUDA=<path of this library>. It implements the entry points the backend
 * and the drop-in resolve, records every call (name and two arguments), fails on demand,
 * and can hold stream work back so that events stay pending until released.
 *
 * It is as strict as the real driver where a forgiving fake would hide bugs:
 * - contexts: a per-thread context stack; calls that need one return
 *   CUDA_ERROR_INVALID_CONTEXT when none is current; streams and events belong to the
 *   context current at their creation, and using them under another one is refused;
 *   cuCtxCreate makes contexts of their own, whose cuMemAlloc memory a memset (a kernel)
 *   of another context may not touch, nor theirs another's (CUDA_ERROR_ILLEGAL_ADDRESS);
 * - streams: one queue per stream, each run by its own worker thread, so work on
 *   different streams runs concurrently and completes after the call returns;
 *   cuStreamWaitEvent really holds a queue until the event's work has run;
 * - cuLaunchHostFunc runs the function later on the stream's worker thread, where every
 *   CUDA call returns CUDA_ERROR_NOT_PERMITTED;
 * - VMM: a granularity that varies by device (2 MiB even, 4 MiB odd), its alignment, cuMemMap only
 * inside a reservation and over unmapped addresses, cuMemSetAccess only over mapped ranges (several
 * descriptors accepted), cuMemUnmap of whole mappings, cuMemAddressFree of whole, unmapped
 * reservations.
 * - device memory is not host-addressable: device addresses come from a PROT_NONE range,
 *   so a host dereference faults as on a GPU; the bytes live in a separate shadow mapping
 *   that copies and memsets go through, and that tests (and the fake cuDNN) reach with
 *   fake_cuda_shadow(dptr).
 * - cuGetProcAddress (both versions) hands out entry points by base name, the per-thread
 *   (_ptsz) variants under CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM only;
 *   CU_STREAM_PER_THREAD (and NULL in a _ptsz call) is one stream per thread and context;
 * - sticky errors: once a context faults (fake_cuda_fault), every call needing it returns
 *   the fault until cuDevicePrimaryCtxReset or cuCtxDestroy, which destroy the context's
 *   allocations, streams and events (its handles are refused afterwards);
 * - after fork, every call of the child returns CUDA_ERROR_NOT_INITIALIZED;
 * - stream capture: work on a capturing stream is recorded, not run; an unsafe call
 *   (cuMemAlloc, cuMemFree, cuMemCreate, cuMemMap, synchronisation) fails with
 *   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture when the driver's
 *   rules forbid it: the calling thread's own non-relaxed capture, or another thread's
 *   global one unless the calling thread is in relaxed or thread-local mode
 *   (cuThreadExchangeStreamCaptureMode); an event last recorded in a capture is refused by
 *   cuEventQuery/cuEventSynchronize (CUDA_ERROR_CAPTURED_EVENT); cuMemFreeAsync on a
 *   capturing stream takes only graph allocations, anything else is
 *   CUDA_ERROR_INVALID_VALUE and invalidates the capture; graphs and their executables
 *   hold no work (nothing replays);
 * - cuMemCreate records the shareable handle types asked for; exporting another fails.
 * - a copy or memset touching device bytes that no live allocation or mapping holds
 *   faults with CUDA_ERROR_ILLEGAL_ADDRESS, sticky as above;
 * Not modelled (yet): the legacy default stream's implicit synchronisation with blocking
 * streams, VMM objects across a reset.
 *
 * fake_cuda_hold(true) keeps every queue from running; a synchronising call (stream,
 * event or context synchronize, cuMemFree) lets the queues run while it waits. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <cuda.h>

#include "fake_internal.h"

fake_state_t fake = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv = PTHREAD_COND_INITIALIZER,
    .capacity = (size_t)64 << 20,
    .devices = 1,
};

__thread fake_ctx_t *stack[MAXSTACK];
__thread int depth;
__thread bool in_hostfn;
__thread CUstreamCaptureMode tls_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
/* The calling thread's per-thread default stream of each context, and the context epoch
 * it was made in. */
__thread struct fake_stream_s *ptds[MAXDEV + MAXUCTX];
__thread unsigned ptds_epoch[MAXDEV + MAXUCTX];

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Maps the device range (PROT_NONE) and its shadow once. */
static void dev_init(void)
{
    void *d = mmap(NULL, DEVSPAN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void *h = mmap(NULL, DEVSPAN, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (d == MAP_FAILED || h == MAP_FAILED)
        abort(); /* a test double without its address space cannot run */
    fake.dev_base = (uintptr_t)d;
    fake.shadow_base = (uintptr_t)h;
}

/* size bytes of fresh device addresses aligned to align, or 0. Caller holds mu. */
static CUdeviceptr dev_take(size_t size, size_t align)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, dev_init);
    size_t off = (fake.dev_base + fake.dev_next + align - 1) / align * align - fake.dev_base;
    if (off > DEVSPAN || size > DEVSPAN - off)
        return 0;
    fake.dev_next = off + size;
    return fake.dev_base + off;
}

bool is_dev(uintptr_t p)
{
    return fake.dev_base != 0 && p - fake.dev_base < DEVSPAN;
}

/* The host address holding device byte p; host pointers map to themselves. */
static void *shadow(uintptr_t p)
{
    return (void *)(is_dev(p) ? p - fake.dev_base + fake.shadow_base : p);
}

/* Drops the bytes of a device range (its shadow reads as zeros again). */
void dev_drop(uintptr_t p, size_t size)
{
    madvise(shadow(p), size, MADV_DONTNEED);
}

fake_ctx_t *cur(void)
{
    return depth > 0 ? stack[depth - 1] : NULL;
}

/* Logs the call and returns the injected failure for it, or CUDA_SUCCESS. */
CUresult enter(const char *name, uint64_t a, uint64_t b)
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
    if (r == CUDA_SUCCESS && fake.forked)
        r = CUDA_ERROR_NOT_INITIALIZED; /* the driver's state does not survive fork */
    if (r == CUDA_SUCCESS && in_hostfn)
        r = CUDA_ERROR_NOT_PERMITTED;
    return r;
}

/* Whether an unsafe call (allocation, free, synchronisation) is forbidden now, by
 * cuda.h's rules for the calling thread's mode (cuThreadExchangeStreamCaptureMode):
 * relaxed, never; thread-local, while this thread has a non-relaxed capture under way
 * (active or invalidated, until it is ended); global (the default), that or another
 * thread's global capture. Such a call invalidates those captures, as the driver does.
 * Caller holds mu. */
bool capture_forbids(void)
{
    bool no = false;
    if (tls_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return false;
    for (fake_stream_t *s = fake.streams; s != NULL; s = s->next) {
        if (s->capture == 0 || s->dead || s->mode == CU_STREAM_CAPTURE_MODE_RELAXED)
            continue;
        bool mine = pthread_equal(s->capturer, pthread_self());
        if (mine || (tls_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                     s->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            s->capture = 2;
            no = true;
        }
    }
    return no;
}

CUresult unsafe_call(void)
{
    pthread_mutex_lock(&fake.mu);
    bool no = capture_forbids();
    pthread_mutex_unlock(&fake.mu);
    return no ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* ---- stream queues ---- */

/* Whether a memset (a kernel) running in ctx may write device byte p: cuMemAlloc memory
 * belongs to the context that allocated it, and a kernel of a context made with
 * cuCtxCreate faults on another context's memory (or another's on its own). Primary
 * contexts of different devices are not told apart here (peer access). Caller holds mu. */
static bool ctx_may_set(const fake_ctx_t *ctx, uintptr_t p)
{
    for (const fake_blk_t *b = fake.blks; b != NULL; b = b->next)
        if (!b->host && p >= (uintptr_t)b->p && p - (uintptr_t)b->p < b->size)
            return b->ctx == NULL || b->ctx == ctx || (!b->ctx->created && !ctx->created);
    return true;
}

/* Whether [p, p + n) is host memory (trusted) or device bytes inside one live
 * allocation or mapped range. Caller holds mu. */
static bool dev_live(uintptr_t p, size_t n)
{
    if (!is_dev(p))
        return true;
    for (const fake_blk_t *b = fake.blks; b != NULL; b = b->next)
        if (!b->host && p >= (uintptr_t)b->p && p - (uintptr_t)b->p <= b->size &&
            n <= b->size - (p - (uintptr_t)b->p))
            return true;
    for (const fake_resv_t *v = fake.resvs; v != NULL; v = v->next)
        if (p >= v->base && p - v->base <= v->size && n <= v->size - (p - v->base))
            return mapped_bytes(v, p, n) == n;
    return false;
}

static bool event_done(const fake_event_t *e, uint64_t gen)
{
    return e->done_gen >= gen;
}

void event_unref(fake_event_t *e)
{
    if (--e->refs == 0 && e->dead) {
        fake_event_t **pp = &fake.events;
        while (*pp != e)
            pp = &(*pp)->next;
        *pp = e->next;
        free(e);
    }
}

static bool stream_runnable(const fake_stream_t *s)
{
    if (s->head == NULL || (fake.hold && fake.drain == 0))
        return false;
    return s->head->kind != OP_WAIT || event_done(s->head->ev, s->head->gen);
}

/* The worker: runs the head of the queue, outside the lock for copies and host
 * functions, and removes it only when it is done (a synchronize waits for both). */
static void *worker(void *arg)
{
    fake_stream_t *s = arg;
    pthread_mutex_lock(&fake.mu);
    for (;;) {
        while (!stream_runnable(s) && !(s->dead && s->head == NULL))
            pthread_cond_wait(&fake.cv, &fake.mu);
        if (s->head == NULL)
            break; /* dead and drained */
        fake_op_t *op = s->head;
        s->busy = true;
        /* A copy or memset touching device bytes no allocation holds faults, as a kernel
         * would: the context's sticky error from now on. */
        if ((op->kind == OP_COPY || op->kind == OP_SET) &&
            (!dev_live((uintptr_t)op->dst, op->n) ||
             (op->kind == OP_COPY && !dev_live((uintptr_t)op->src, op->n)) ||
             (op->kind == OP_SET && !ctx_may_set(s->ctx, (uintptr_t)op->dst)))) {
            s->ctx->sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
        } else if (op->kind == OP_COPY || op->kind == OP_SET || op->kind == OP_HOSTFN ||
                   op->kind == OP_FREE) {
            pthread_mutex_unlock(&fake.mu);
            if (op->kind == OP_FREE)
                blk_free(op->dst, false);
            else if (op->kind == OP_COPY)
                memmove(shadow((uintptr_t)op->dst), shadow((uintptr_t)op->src), op->n);
            else if (op->kind == OP_SET)
                memset(shadow((uintptr_t)op->dst), op->value, op->n);
            else {
                in_hostfn = true;
                op->fn(op->ud);
                in_hostfn = false;
            }
            pthread_mutex_lock(&fake.mu);
        } else if (op->kind == OP_RECORD) {
            op->ev->t_ns = now_ns();
            if (op->ev->done_gen < op->gen)
                op->ev->done_gen = op->gen;
        }
        if (op->ev != NULL)
            event_unref(op->ev);
        s->head = op->next;
        if (s->head == NULL)
            s->tail = NULL;
        s->busy = false;
        free(op);
        pthread_cond_broadcast(&fake.cv);
    }
    fake_stream_t **pp = &fake.streams;
    while (*pp != NULL && *pp != s)
        pp = &(*pp)->next;
    if (*pp != NULL)
        *pp = s->next;
    pthread_mutex_unlock(&fake.mu);
    free(s);
    return NULL;
}

/* A new stream of ctx with its worker, or NULL. Caller holds mu. */
static fake_stream_t *stream_new(fake_ctx_t *ctx)
{
    fake_stream_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->ctx = ctx;
    if (pthread_create(&s->thread, NULL, worker, s) != 0) {
        free(s);
        return NULL;
    }
    pthread_detach(s->thread);
    s->next = fake.streams;
    fake.streams = s;
    return s;
}

/* The stream a handle names under the current context, or NULL with *r set: NULL (and
 * the legacy and per-thread handles) name the context's default stream. Caller holds mu. */
fake_stream_t *stream_of(CUstream h, CUresult *r)
{
    fake_ctx_t *ctx = cur();
    if (ctx == NULL) {
        *r = CUDA_ERROR_INVALID_CONTEXT;
        return NULL;
    }
    if (h == CU_STREAM_PER_THREAD) {
        size_t i = (size_t)(ctx - fake.ctxs);
        if (ptds[i] == NULL || ptds_epoch[i] != ctx->epoch) {
            ptds[i] = stream_new(ctx);
            ptds_epoch[i] = ctx->epoch;
            if (ptds[i] != NULL)
                ptds[i]->blocking = true;
        }
        *r = ptds[i] ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        return ptds[i];
    }
    if (h == NULL || h == CU_STREAM_LEGACY) {
        if (ctx->null_stream == NULL)
            ctx->null_stream = stream_new(ctx);
        *r = ctx->null_stream ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        return ctx->null_stream;
    }
    fake_stream_t *s = fake.streams;
    while (s != NULL && (s != (fake_stream_t *)h || s->dead))
        s = s->next;
    *r = s == NULL || s->ctx != ctx ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
    return *r == CUDA_SUCCESS ? s : NULL;
}

/* As stream_of, but a created stream of any context: what calls that work on another
 * device's stream accept (stream-ordered allocation, cuStreamGetCtx). Caller holds mu. */
fake_stream_t *stream_any(CUstream h, CUresult *r)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return stream_of(h, r);
    fake_stream_t *s = fake.streams;
    while (s != NULL && (s != (fake_stream_t *)h || s->dead))
        s = s->next;
    *r = s == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
    return s;
}

/* The live event a handle names, or NULL. Caller holds mu. */
fake_event_t *event_of(CUevent h)
{
    fake_event_t *e = fake.events;
    while (e != NULL && (e != (fake_event_t *)h || e->dead))
        e = e->next;
    return e;
}

/* Appends op to s's queue. Caller holds mu. */
static void enqueue(fake_stream_t *s, fake_op_t *o)
{
    o->next = NULL;
    if (o->ev != NULL)
        o->ev->refs++;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
}

/* The legacy stream's implicit synchronisation, one way: work queued on it waits for the
 * work queued so far on every blocking stream of its context (the per-thread streams of
 * every thread among them), through a hidden event each. Not modelled: later work on the
 * blocking streams waiting for the legacy stream's. Caller holds mu; false on no memory. */
static bool legacy_fence(fake_stream_t *legacy)
{
    for (fake_stream_t *x = fake.streams; x != NULL; x = x->next) {
        if (x == legacy || x->ctx != legacy->ctx || !x->blocking || x->dead || x->head == NULL)
            continue;
        fake_event_t *e = calloc(1, sizeof *e);
        fake_op_t *rec = malloc(sizeof *rec), *wait = malloc(sizeof *wait);
        if (e == NULL || rec == NULL || wait == NULL) {
            free(e);
            free(rec);
            free(wait);
            return false;
        }
        e->ctx = legacy->ctx;
        e->rec_gen = 1;
        e->dead = true; /* no handle names it: it goes with its last operation */
        e->next = fake.events;
        fake.events = e;
        *rec = (fake_op_t){.kind = OP_RECORD, .ev = e, .gen = 1};
        *wait = (fake_op_t){.kind = OP_WAIT, .ev = e, .gen = 1};
        enqueue(x, rec);
        enqueue(legacy, wait);
    }
    return true;
}

CUresult submit(CUstream h, fake_op_t op)
{
    CUresult r;
    pthread_mutex_lock(&fake.mu);
    fake_stream_t *s = stream_of(h, &r);
    if (s != NULL && s->capture != 0) { /* recorded into the graph, not run */
        r = s->capture == 1 ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        if (s->capture == 1)
            s->graph->nodes++;
        /* A node of the graph: the event is not recorded now, and until it is recorded
         * outside a capture, queries of it conflict with the capture. */
        if (op.kind == OP_RECORD && s->capture == 1) {
            op.ev->rec_gen--;
            op.ev->captured = true;
        }
        pthread_mutex_unlock(&fake.mu);
        return r;
    }
    fake_op_t *o = s ? malloc(sizeof *o) : NULL;
    if (s != NULL && o == NULL)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (o != NULL && s == s->ctx->null_stream && !legacy_fence(s)) {
        free(o);
        o = NULL;
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (o != NULL) {
        *o = op;
        if (op.kind == OP_RECORD)
            op.ev->captured = false;
        enqueue(s, o);
        pthread_cond_broadcast(&fake.cv);
    }
    pthread_mutex_unlock(&fake.mu);
    return r;
}

static bool all_idle(fake_ctx_t *ctx)
{
    for (fake_stream_t *s = fake.streams; s != NULL; s = s->next)
        if ((ctx == NULL || s->ctx == ctx) && s->head != NULL)
            return false;
    return true;
}

/* Waits, with the queues allowed to run, until done(arg) holds. Caller holds mu. */
void drain_until(bool (*done)(void *), void *arg)
{
    fake.drain++;
    pthread_cond_broadcast(&fake.cv);
    while (!done(arg))
        pthread_cond_wait(&fake.cv, &fake.mu);
    fake.drain--;
}

bool ctx_idle(void *ctx)
{
    return all_idle(ctx);
}

bool stream_idle(void *s)
{
    return ((fake_stream_t *)s)->head == NULL;
}

static bool event_idle(void *e)
{
    return event_done(e, ((fake_event_t *)e)->rec_gen);
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
FAKE_API void fake_cuda_idle(void);
FAKE_API void *fake_cuda_shadow(const void *dptr);
FAKE_API void fake_cuda_age_events(uint64_t ns);
FAKE_API bool fake_cuda_can_access(int dev, const void *dptr);

/* Whether a kernel on device dev could touch device byte dptr: cuMemAlloc memory of its
 * own device or of one it enabled peer access to; a VMM mapping opened to dev. */
bool fake_cuda_can_access(int dev, const void *dptr)
{
    uintptr_t p = (uintptr_t)dptr;
    bool ok = false;
    pthread_mutex_lock(&fake.mu);
    for (fake_blk_t *b = fake.blks; b != NULL && !ok; b = b->next)
        if (!b->host && p >= (uintptr_t)b->p && p - (uintptr_t)b->p < b->size)
            ok = b->ctx != NULL && (b->ctx->dev == dev || (fake.peer[dev] >> b->ctx->dev & 1));
    for (fake_resv_t *v = fake.resvs; v != NULL && !ok; v = v->next)
        for (fake_map_t *x = v->maps; x != NULL && !ok; x = x->next)
            if (p >= x->p && p - x->p < x->size)
                ok = x->access >> dev & 1;
    pthread_mutex_unlock(&fake.mu);
    return ok;
}

FAKE_API void fake_cuda_peer_unseen(int dev, int peer);

/* What another copy of the driver API (a static cudart inside NCCL, say) enabling peer
 * access does, out of reach of any interposer: dev may access peer's cuMemAlloc memory;
 * VMM mappings stay as they are. */
void fake_cuda_peer_unseen(int dev, int peer)
{
    pthread_mutex_lock(&fake.mu);
    if (dev >= 0 && dev < MAXDEV && peer >= 0 && peer < MAXDEV)
        fake.peer[dev] |= (uint64_t)1 << peer;
    pthread_mutex_unlock(&fake.mu);
}

/* Moves every event recorded so far ns into the past, as if the process had run that
 * long since (for event-time precision over long runs). */
void fake_cuda_age_events(uint64_t ns)
{
    pthread_mutex_lock(&fake.mu);
    for (fake_event_t *e = fake.events; e != NULL; e = e->next)
        if (e->rec_gen > 0)
            e->t_ns -= ns;
    pthread_mutex_unlock(&fake.mu);
}

/* The host address of device byte dptr (dptr itself for host memory): the backdoor by
 * which tests and the fake cuDNN read and write device memory. */
void *fake_cuda_shadow(const void *dptr)
{
    return shadow((uintptr_t)dptr);
}

/* Waits until every queue of every context is empty (held work is let run). */
void fake_cuda_idle(void)
{
    pthread_mutex_lock(&fake.mu);
    drain_until(ctx_idle, NULL);
    pthread_mutex_unlock(&fake.mu);
}

/* Forgets the call log, failure plan and injected faults; live memory stays (tests
 * destroy backends). */
void fake_cuda_reset(size_t capacity, int devices)
{
    pthread_mutex_lock(&fake.mu);
    fake.hold = false;
    drain_until(ctx_idle, NULL);
    fake.capacity = capacity;
    fake.devices = devices < MAXDEV ? devices : MAXDEV;
    fake.nlog = 0;
    memset(fake.peer, 0, sizeof fake.peer);
    fake.fail_name = NULL;
    fake.fail_count = 0;
    for (int i = 0; i < MAXDEV; i++)
        fake.ctxs[i].sticky = CUDA_SUCCESS; /* faults injected by earlier tests */
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
    pthread_cond_broadcast(&fake.cv);
    pthread_mutex_unlock(&fake.mu);
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
    fake.inited = true;
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

/* The bus id NVML knows the device by (tests/cuda/fake_nvml.c reads the same form). */
FAKE_API CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice dev)
{
    ENTER("cuDeviceGetPCIBusId", dev, 0);
    if (dev < 0 || dev >= fake.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    if (bus == NULL || len < 13)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(bus, (size_t)len, "00000000:%02x:00.0", (unsigned)dev + 1u);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    ENTER("cuDevicePrimaryCtxRetain", dev, 0);
    if (dev < 0 || dev >= fake.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    fake.ctxs[dev].dev = dev;
    *ctx = (CUcontext)&fake.ctxs[dev];
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    ENTER("cuDevicePrimaryCtxRelease", dev, 0);
    return dev < 0 || dev >= fake.devices ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

fake_ctx_t *ctx_of(CUcontext c)
{
    fake_ctx_t *x = (fake_ctx_t *)c;
    if (x >= fake.ctxs && x < fake.ctxs + fake.devices)
        return x;
    return x >= fake.ctxs + MAXDEV && x < fake.ctxs + MAXDEV + MAXUCTX && x->created ? x : NULL;
}

FAKE_API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    /* Not logged: every backend entry does it, the logs stay readable. */
    if (in_hostfn)
        return CUDA_ERROR_NOT_PERMITTED;
    if (ctx_of(ctx) == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (depth == MAXSTACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    stack[depth++] = ctx_of(ctx);
    __atomic_add_fetch(&fake.ctx_depth, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
    if (in_hostfn)
        return CUDA_ERROR_NOT_PERMITTED;
    if (depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = (CUcontext)stack[--depth];
    if (ctx != NULL)
        *ctx = c;
    __atomic_sub_fetch(&fake.ctx_depth, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxSetCurrent(CUcontext ctx)
{
    ENTER("cuCtxSetCurrent", (uintptr_t)ctx, 0);
    if (ctx == NULL) {
        if (depth > 0)
            depth--;
        return CUDA_SUCCESS;
    }
    if (ctx_of(ctx) == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (depth == 0)
        depth = 1;
    stack[depth - 1] = ctx_of(ctx);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    ENTER("cuCtxGetCurrent", 0, 0);
    *ctx = (CUcontext)cur();
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxGetDevice(CUdevice *dev)
{
    ENTER_CTX("cuCtxGetDevice", 0, 0);
    *dev = cur()->dev;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxSynchronize(void)
{
    ENTER_CTX("cuCtxSynchronize", 0, 0);
    UNSAFE();
    pthread_mutex_lock(&fake.mu);
    drain_until(ctx_idle, cur());
    CUresult r = cur()->sticky; /* a fault of the work waited for */
    pthread_mutex_unlock(&fake.mu);
    return r;
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

void give(size_t size)
{
    pthread_mutex_lock(&fake.mu);
    fake.used -= size;
    pthread_mutex_unlock(&fake.mu);
}

CUresult blk_new(void **out, size_t size, bool host)
{
    size_t rounded = (size + 511) & ~(size_t)511;
    if (!host && take(rounded) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fake_blk_t *b = calloc(1, sizeof *b);
    void *p = NULL;
    if (host)
        p = aligned_alloc(512, rounded);
    else {
        pthread_mutex_lock(&fake.mu);
        p = (void *)(uintptr_t)dev_take(rounded, 512);
        pthread_mutex_unlock(&fake.mu);
    }
    if (b == NULL || p == NULL) {
        free(b);
        if (host)
            free(p);
        if (!host)
            give(rounded);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    b->p = p;
    b->size = host ? 0 : rounded;
    b->host = host;
    b->ctx = cur();
    b->dev = b->ctx != NULL ? b->ctx->dev : 0;
    pthread_mutex_lock(&fake.mu);
    b->next = fake.blks;
    fake.blks = b;
    pthread_mutex_unlock(&fake.mu);
    *out = p;
    return CUDA_SUCCESS;
}

CUresult blk_free(void *p, bool host)
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
    if (!host) {
        give(b->size);
        dev_drop((uintptr_t)b->p, b->size);
    } else
        free(b->p);
    free(b);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
    ENTER_CTX("cuMemAlloc_v2", 0, size);
    UNSAFE();
    void *q = NULL;
    CUresult r = blk_new(&q, size, false);
    *p = (CUdeviceptr)(uintptr_t)q;
    return r;
}

FAKE_API CUresult cuMemFree_v2(CUdeviceptr p)
{
    ENTER_CTX("cuMemFree_v2", p, 0);
    UNSAFE();
    pthread_mutex_lock(&fake.mu); /* cuMemFree synchronises */
    drain_until(ctx_idle, cur());
    pthread_mutex_unlock(&fake.mu);
    return blk_free((void *)(uintptr_t)p, false);
}

FAKE_API CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    ENTER_CTX("cuMemGetInfo_v2", 0, 0);
    pthread_mutex_lock(&fake.mu);
    *free_b = fake.capacity - fake.used;
    *total_b = fake.capacity;
    pthread_mutex_unlock(&fake.mu);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemHostAlloc(void **p, size_t size, unsigned int flags)
{
    ENTER_CTX("cuMemHostAlloc", size, flags);
    return blk_new(p, size, true);
}

FAKE_API CUresult cuMemFreeHost(void *p)
{
    ENTER_CTX("cuMemFreeHost", (uintptr_t)p, 0);
    return blk_free(p, true);
}

/* ---- streams and events ---- */

FAKE_API CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    ENTER_CTX("cuStreamCreate", flags, 0);
    pthread_mutex_lock(&fake.mu);
    fake_stream_t *st = stream_new(cur());
    if (st != NULL)
        st->blocking = !(flags & CU_STREAM_NON_BLOCKING);
    pthread_mutex_unlock(&fake.mu);
    *s = (CUstream)st;
    return st ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* As the driver: returns at once; queued work still runs, then the stream goes. */
FAKE_API CUresult cuStreamDestroy_v2(CUstream h)
{
    ENTER_CTX("cuStreamDestroy", (uintptr_t)h, 0);
    CUresult r;
    pthread_mutex_lock(&fake.mu);
    fake_stream_t *s = h == NULL ? NULL : stream_of(h, &r);
    if (s == NULL || s == cur()->null_stream)
        r = CUDA_ERROR_INVALID_HANDLE;
    else {
        s->dead = true;
        pthread_cond_broadcast(&fake.cv);
    }
    pthread_mutex_unlock(&fake.mu);
    return r;
}

FAKE_API CUresult cuStreamGetCtx(CUstream h, CUcontext *pctx)
{
    ENTER_CTX("cuStreamGetCtx", (uintptr_t)h, 0);
    CUresult r;
    pthread_mutex_lock(&fake.mu);
    fake_stream_t *s = stream_any(h, &r);
    if (s != NULL)
        *pctx = (CUcontext)s->ctx;
    pthread_mutex_unlock(&fake.mu);
    return r;
}

FAKE_API CUresult cuStreamSynchronize(CUstream h)
{
    ENTER_CTX("cuStreamSynchronize", (uintptr_t)h, 0);
    CUresult r;
    pthread_mutex_lock(&fake.mu);
    fake_stream_t *s = stream_of(h, &r);
    if (s != NULL && s->capture != 0) { /* synchronising a capturing stream breaks it */
        s->capture = 2;
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else if (s != NULL) {
        drain_until(stream_idle, s);
        r = cur()->sticky; /* a fault of the work waited for */
    }
    pthread_mutex_unlock(&fake.mu);
    return r;
}

/* The stream's later work waits for the event's latest record; an event never recorded
 * (or already complete) makes it a no-op. The event may belong to another context. */
FAKE_API CUresult cuStreamWaitEvent(CUstream h, CUevent ev, unsigned int flags)
{
    ENTER_CTX("cuStreamWaitEvent", (uintptr_t)h, (uintptr_t)ev);
    pthread_mutex_lock(&fake.mu);
    fake_event_t *e = event_of(ev);
    uint64_t gen = e ? e->rec_gen : 0;
    pthread_mutex_unlock(&fake.mu);
    if (e == NULL || flags != 0)
        return CUDA_ERROR_INVALID_HANDLE;
    return submit(h, (fake_op_t){.kind = OP_WAIT, .ev = e, .gen = gen});
}

FAKE_API CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *ud)
{
    ENTER_CTX("cuLaunchHostFunc", (uintptr_t)s, 0);
    if (fn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return submit(s, (fake_op_t){.kind = OP_HOSTFN, .fn = fn, .ud = ud});
}

FAKE_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    ENTER_CTX("cuMemcpyAsync", dst, n);
    return submit(s, (fake_op_t){.kind = OP_COPY,
                                 .dst = (void *)(uintptr_t)dst,
                                 .src = (const void *)(uintptr_t)src,
                                 .n = n});
}

/* Any two contexts (the driver stages the copy when peer access is off); the stream
 * belongs to the current context. */
FAKE_API CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                                    CUcontext src_ctx, size_t n, CUstream s)
{
    ENTER_CTX("cuMemcpyPeerAsync", dst, n);
    if (ctx_of(dst_ctx) == NULL || ctx_of(src_ctx) == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    return submit(s, (fake_op_t){.kind = OP_COPY,
                                 .dst = (void *)(uintptr_t)dst,
                                 .src = (const void *)(uintptr_t)src,
                                 .n = n});
}

/* The current context's device may access peer's memory allocated with cuMemAlloc; VMM
 * mappings stay as cuMemSetAccess left them, as on the real driver. */
FAKE_API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    ENTER_CTX("cuCtxEnablePeerAccess", (uintptr_t)peer, flags);
    fake_ctx_t *p = ctx_of(peer);
    if (p == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (flags != 0 || p->dev == cur()->dev)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake.mu);
    uint64_t bit = (uint64_t)1 << p->dev;
    CUresult r =
        fake.peer[cur()->dev] & bit ? CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED : CUDA_SUCCESS;
    fake.peer[cur()->dev] |= bit;
    pthread_mutex_unlock(&fake.mu);
    return r;
}

FAKE_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s)
{
    ENTER_CTX("cuMemsetD8Async", dst, n);
    return submit(s,
                  (fake_op_t){.kind = OP_SET, .dst = (void *)(uintptr_t)dst, .value = v, .n = n});
}

FAKE_API CUresult cuEventCreate(CUevent *ev, unsigned int flags)
{
    ENTER_CTX("cuEventCreate", flags, 0);
    fake_event_t *e = calloc(1, sizeof *e);
    if (e == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->ctx = cur();
    e->flags = flags;
    pthread_mutex_lock(&fake.mu);
    e->next = fake.events;
    fake.events = e;
    pthread_mutex_unlock(&fake.mu);
    *ev = (CUevent)e;
    return CUDA_SUCCESS;
}

/* As the driver: allowed while the event is pending; it goes when its work ran. */
FAKE_API CUresult cuEventDestroy_v2(CUevent ev)
{
    ENTER_CTX("cuEventDestroy", (uintptr_t)ev, 0);
    pthread_mutex_lock(&fake.mu);
    fake_event_t *e = event_of(ev);
    if (e != NULL) {
        e->dead = true;
        e->refs++;
        event_unref(e);
    }
    pthread_mutex_unlock(&fake.mu);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FAKE_API CUresult cuEventRecord(CUevent ev, CUstream s)
{
    ENTER_CTX("cuEventRecord", (uintptr_t)ev, (uintptr_t)s);
    pthread_mutex_lock(&fake.mu);
    fake_event_t *e = event_of(ev);
    CUresult r = e == NULL || e->ctx != cur() ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
    uint64_t gen = r == CUDA_SUCCESS ? ++e->rec_gen : 0;
    pthread_mutex_unlock(&fake.mu);
    if (r != CUDA_SUCCESS)
        return r;
    r = submit(s, (fake_op_t){.kind = OP_RECORD, .ev = e, .gen = gen});
    if (r != CUDA_SUCCESS) {
        pthread_mutex_lock(&fake.mu);
        e->rec_gen--;
        pthread_mutex_unlock(&fake.mu);
    }
    return r;
}

FAKE_API CUresult cuEventQuery(CUevent ev)
{
    ENTER_CTX("cuEventQuery", (uintptr_t)ev, 0);
    pthread_mutex_lock(&fake.mu);
    fake_event_t *e = event_of(ev);
    CUresult r = e == NULL                   ? CUDA_ERROR_INVALID_HANDLE
                 : e->captured               ? CUDA_ERROR_CAPTURED_EVENT
                 : event_done(e, e->rec_gen) ? CUDA_SUCCESS
                                             : CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&fake.mu);
    return r;
}

FAKE_API CUresult cuEventSynchronize(CUevent ev)
{
    ENTER_CTX("cuEventSynchronize", (uintptr_t)ev, 0);
    pthread_mutex_lock(&fake.mu);
    fake_event_t *e = event_of(ev);
    CUresult r = e == NULL     ? CUDA_ERROR_INVALID_HANDLE
                 : e->captured ? CUDA_ERROR_CAPTURED_EVENT
                               : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) {
        drain_until(event_idle, e);
        r = cur()->sticky; /* a fault of the work waited for */
    }
    pthread_mutex_unlock(&fake.mu);
    return r;
}

/* As the driver: both events recorded and complete, both with timing enabled. */
FAKE_API CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end)
{
    ENTER_CTX("cuEventElapsedTime", (uintptr_t)start, (uintptr_t)end);
    pthread_mutex_lock(&fake.mu);
    fake_event_t *a = event_of(start), *b = event_of(end);
    CUresult r = CUDA_SUCCESS;
    if (a == NULL || b == NULL || a->rec_gen == 0 || b->rec_gen == 0 ||
        ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!event_done(a, a->rec_gen) || !event_done(b, b->rec_gen))
        r = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)((double)((int64_t)(b->t_ns - a->t_ns)) / 1e6);
    pthread_mutex_unlock(&fake.mu);
    return r;
}

/* ---- virtual memory ---- */

/* Granularity varies by device, as on mixed machines: 2 MiB on even devices, 4 MiB on
 * odd ones (GRAN is the smallest). */
static size_t gran_of(int dev)
{
    return dev % 2 ? 2 * GRAN : GRAN;
}

FAKE_API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                                CUmemAllocationGranularity_flags opt)
{
    ENTER("cuMemGetAllocationGranularity", prop->location.id, opt);
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 ||
        prop->location.id >= fake.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *g = gran_of(prop->location.id);
    return CUDA_SUCCESS;
}

/* The reservation holding [p, p + size), or NULL. Caller holds mu. */
static fake_resv_t *resv_find(CUdeviceptr p, size_t size)
{
    for (fake_resv_t *v = fake.resvs; v != NULL; v = v->next)
        if (p >= v->base && p - v->base <= v->size && size <= v->size - (p - v->base))
            return v;
    return NULL;
}

FAKE_API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                      unsigned long long flags)
{
    ENTER_CTX("cuMemAddressReserve", align, size);
    if (size == 0 || size % GRAN != 0 || (align != 0 && align % GRAN != 0))
        return CUDA_ERROR_INVALID_VALUE;
    fake_resv_t *v = calloc(1, sizeof *v);
    if (v == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fake.mu);
    CUdeviceptr base = dev_take(size, align > GRAN ? align : GRAN);
    if (base == 0) {
        pthread_mutex_unlock(&fake.mu);
        free(v);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    v->base = base;
    v->size = size;
    v->next = fake.resvs;
    fake.resvs = v;
    pthread_mutex_unlock(&fake.mu);
    *p = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

/* Only a whole reservation, with nothing mapped in it. */
FAKE_API CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
    ENTER_CTX("cuMemAddressFree", p, size);
    pthread_mutex_lock(&fake.mu);
    fake_resv_t **pp = &fake.resvs;
    while (*pp != NULL && ((*pp)->base != p || (*pp)->size != size))
        pp = &(*pp)->next;
    fake_resv_t *v = *pp;
    CUresult r = v == NULL || v->maps != NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS)
        *pp = v->next;
    pthread_mutex_unlock(&fake.mu);
    if (r != CUDA_SUCCESS)
        return r;
    free(v);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                              const CUmemAllocationProp *prop, unsigned long long flags)
{
    ENTER_CTX("cuMemCreate", prop->type, size);
    UNSAFE();
    if (size == 0 || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 ||
        prop->location.id >= fake.devices)
        return CUDA_ERROR_INVALID_VALUE;
    if (size % gran_of(prop->location.id) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (take(size) != CUDA_SUCCESS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fake_handle_t *fh = calloc(1, sizeof *fh);
    fh->size = size;
    fh->gran = gran_of(prop->location.id);
    fh->ht = prop->requestedHandleTypes;
    fh->dev = prop->location.id;
    pthread_mutex_lock(&fake.mu);
    fake.handle_types |= prop->requestedHandleTypes;
    pthread_mutex_unlock(&fake.mu);
    *h = (CUmemGenericAllocationHandle)(uintptr_t)fh;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    fake_handle_t *fh = (fake_handle_t *)(uintptr_t)h;
    ENTER_CTX("cuMemRelease", 0, fh->size);
    give(fh->size);
    free(fh);
    return CUDA_SUCCESS;
}

/* Inside one reservation, aligned, over addresses nothing maps yet. */
FAKE_API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
                           unsigned long long flags)
{
    ENTER_CTX("cuMemMap", p, size);
    UNSAFE();
    fake_handle_t *fh = (fake_handle_t *)(uintptr_t)h;
    if (off != 0 || size != fh->size || p % fh->gran != 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fake_map_t *m = calloc(1, sizeof *m);
    if (m == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fake.mu);
    fake_resv_t *v = resv_find(p, size);
    CUresult r = v == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    for (fake_map_t *x = v ? v->maps : NULL; x != NULL && r == CUDA_SUCCESS; x = x->next)
        if (p < x->p + x->size && x->p < p + size)
            r = CUDA_ERROR_ALREADY_MAPPED;
    if (r == CUDA_SUCCESS) {
        m->p = p;
        m->size = size;
        m->dev = fh->dev;
        m->next = v->maps;
        v->maps = m;
    }
    pthread_mutex_unlock(&fake.mu);
    if (r != CUDA_SUCCESS)
        free(m);
    return r;
}

/* Bytes of [p, p + size) that mappings of v cover. Caller holds mu. */
size_t mapped_bytes(const struct fake_resv_s *v, CUdeviceptr p, size_t size)
{
    size_t n = 0;
    for (const fake_map_t *x = v->maps; x != NULL; x = x->next) {
        CUdeviceptr lo = x->p > p ? x->p : p;
        CUdeviceptr hi = x->p + x->size < p + size ? x->p + x->size : p + size;
        if (lo < hi)
            n += hi - lo;
    }
    return n;
}

/* Every byte of the range mapped; each descriptor names an existing device. The host
 * never gains access: device memory stays reachable only through the API. */
FAKE_API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc,
                                 size_t count)
{
    ENTER_CTX("cuMemSetAccess", p, size);
    if (count == 0 || desc == NULL || size == 0 || p % GRAN != 0 || size % GRAN != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= fake.devices)
            return CUDA_ERROR_INVALID_DEVICE;
        if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&fake.mu);
    fake_resv_t *v = resv_find(p, size);
    CUresult r =
        v == NULL || mapped_bytes(v, p, size) != size ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    for (fake_map_t *x = v ? v->maps : NULL; r == CUDA_SUCCESS && x != NULL; x = x->next)
        if (x->p < p + size && p < x->p + x->size)
            for (size_t i = 0; i < count; i++) {
                uint64_t bit = (uint64_t)1 << desc[i].location.id;
                if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE)
                    x->access &= ~bit;
                else
                    x->access |= bit;
            }
    pthread_mutex_unlock(&fake.mu);
    return r;
}

/* Whole mappings only. */
FAKE_API CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
    ENTER_CTX("cuMemUnmap", p, size);
    pthread_mutex_lock(&fake.mu);
    fake_resv_t *v = resv_find(p, size);
    CUresult r = v == NULL || size == 0 || mapped_bytes(v, p, size) != size
                     ? CUDA_ERROR_INVALID_VALUE
                     : CUDA_SUCCESS;
    for (fake_map_t *x = v ? v->maps : NULL; x != NULL && r == CUDA_SUCCESS; x = x->next)
        if (x->p < p + size && p < x->p + x->size && (x->p < p || x->p + x->size > p + size))
            r = CUDA_ERROR_INVALID_VALUE; /* cuts a mapping */
    for (fake_map_t **pp = v ? &v->maps : NULL; r == CUDA_SUCCESS && pp && *pp != NULL;) {
        fake_map_t *x = *pp;
        if (x->p >= p && x->p + x->size <= p + size) {
            *pp = x->next;
            free(x);
        } else
            pp = &x->next;
    }
    pthread_mutex_unlock(&fake.mu);
    if (r == CUDA_SUCCESS)
        dev_drop(p, size);
    return r;
}
