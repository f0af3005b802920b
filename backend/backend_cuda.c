/* The cuda backend: the backend seam over the CUDA driver API, loaded with dlopen.
 *
 * Honest status: this file has been exercised only against the fake driver in
 * tests/cuda (host memory behind the same entry points), never on a GPU. The calls and
 * their order follow the driver documentation; what a real device adds (asynchronous
 * completion, real capacity, context rules) is covered by the driver's contracts, not by
 * a run here.
 *
 * The driver API rather than the runtime: the preload library replaces the runtime's
 * memory calls, so the backend under it must sit one level lower, and the driver gives
 * the virtual-memory calls expandable segments need. Every entry pushes the device's
 * primary context and pops it on the way out, so the calling thread's own context (the
 * program may use several devices) is left as it was. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/backend_cuda.h"
#include "backend/cuda_driver.h"
#include "util/grow.h"

/* A device allocation handed out by malloc: [ptr, ptr + size). */
typedef struct cuda_seg_s {
    CUdeviceptr ptr;
    size_t size;
} cuda_seg_t;

/* One reserved virtual range. Invariant: pages[i] != 0 iff page i (granularity bytes at
 * base + i * granularity) has physical memory created, mapped and made accessible. */
typedef struct cuda_vm_s {
    struct cuda_vm_s *next;
    CUdeviceptr base;
    size_t size;                         /* bytes, multiple of the granularity */
    size_t npages;                       /* size / granularity */
    CUmemGenericAllocationHandle *pages; /* npages handles, 0 = unmapped */
} cuda_vm_t;

/* Streams this backend created (owned) or wraps for the program (borrowed handle). */
typedef struct cuda_stream_s {
    mt_stream_t base; /* must be first: mt_stream_id reads it */
    struct cuda_stream_s *next;
    CUstream h;
    uintptr_t thread; /* CU_STREAM_PER_THREAD: the thread whose stream it is; else 0 */
    bool owned;       /* created by stream_create: destroyed with the wrapper */
    bool retired;     /* the program destroyed h: never matched again, freed with the backend */
} cuda_stream_t;

struct mt_event_s {
    CUevent h;
    bool recorded; /* an unrecorded event counts as complete, as in CUDA */
    bool timed;    /* created with timing (mt_event_create_timed): has a time */
};

/* Invariants (under mu): segs[0..nsegs) are live cuMemAlloc results, pairwise disjoint;
 * hosts[0..nhosts) are live cuMemHostAlloc results; every cuda_vm_t in vms is a live
 * reservation. origin_ev was recorded on the default stream at creation and its host
 * time origin_ns, so event times are origin_ns + elapsed(origin_ev, ev). The elapsed
 * time is a float of milliseconds (24-bit mantissa: 2 ms steps after 5 hours), so the
 * origin moves forward (under anchor_mu) once an event is more than ANCHOR_MS past it. */
typedef struct cuda_s {
    mt_backend_t base; /* must be first: backend.c sees this */
    mt_cuda_driver_t drv;
    CUdevice dev;
    CUcontext ctx;                          /* the device's primary context, retained */
    size_t granularity;                     /* cuMemGetAllocationGranularity, minimum; >= 2 MiB */
    CUmemAllocationHandleType handle_types; /* asked of cuMemCreate (MEMTRACE_CUDA_HANDLE_TYPE) */
    CUevent origin_ev;                      /* time origin of event_time_ns */
    uint64_t origin_ns;                     /* CLOCK_MONOTONIC when origin_ev was recorded */
    pthread_mutex_t anchor_mu; /* guards origin_ev, origin_ns, spare_ev, anchor_stream */
    CUevent spare_ev;          /* the next origin, made on first use */
    CUstream anchor_stream;    /* where new origins are recorded: no program work */

    pthread_mutex_t mu; /* guards everything below */
    cuda_seg_t *segs;
    size_t nsegs, segs_cap;
    void **hosts;
    size_t nhosts, hosts_cap;
    cuda_vm_t *vms;
    cuda_stream_t *streams;
    uint32_t next_stream_id; /* 1, 2, ... */
    bool *peer_access;       /* [group->n]: device i enabled access to this one (VMM grants) */

    struct cuda_group_s *group; /* every device of the process; set at creation */
    bool owner;                 /* the handle mt_backend_create returned: frees the group */
} cuda_t;

/* The devices of one process. Invariants (under mu): 0 < n; dev[i] is NULL until device i
 * is first reached (mt_backend_get_device retains its primary context then, never before:
 * a context costs device memory), else dev[i]->base.device == i and dev[i]->group == this;
 * exactly one dev[i] has owner set. */
typedef struct cuda_group_s {
    pthread_mutex_t mu;
    int n;
    cuda_t **dev;
    mt_backend_cfg_t cfg; /* the creating config; device is rewritten per ordinal */
} cuda_group_t;

static const mt_backend_ops_t cuda_ops;
static void cuda_destroy(mt_backend_t *b);

static cuda_t *C(const mt_backend_t *b)
{
    return (cuda_t *)b;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- context scoping ---- */

static int note(int res);

static int enter(cuda_t *c)
{
    return note(c->drv.CtxPushCurrent(c->ctx));
}

static void leave(cuda_t *c)
{
    CUcontext popped;
    c->drv.CtxPopCurrent(&popped);
}

/* The calling thread's latest failing CUresult (0 after mt__cuda_last_result): MT_E*
 * codes are coarser than the driver's, and the drop-in must return the driver's own. */
static __thread int last_result;

static int note(int res)
{
    if (res != CUDA_SUCCESS && res != CUDA_ERROR_NOT_READY)
        last_result = res;
    return mt__cuda_result_to_mt(res);
}

int mt__cuda_last_result(void)
{
    int r = last_result;
    last_result = 0;
    return r;
}

/* Runs a driver call inside the context and maps its result. */
#define CALL(c, expr)                                                                              \
    ({                                                                                             \
        int rc_ = enter(c);                                                                        \
        if (rc_ == 0) {                                                                            \
            rc_ = note((c)->drv.expr);                                                             \
            leave(c);                                                                              \
        }                                                                                          \
        rc_;                                                                                       \
    })

static CUstream SH(const mt_stream_t *s)
{
    return s ? ((const cuda_stream_t *)s)->h : NULL;
}

static int grow(void **v, size_t *cap, size_t n, size_t elem)
{
    void *nv = mt__grow(*v, cap, n + 1, elem, 16);
    if (nv == NULL)
        return MT_ENOMEM;
    *v = nv;
    return 0;
}

/* ---- device memory ---- */

static int cuda_malloc(mt_backend_t *b, size_t size, void **out)
{
    cuda_t *c = C(b);
    pthread_mutex_lock(&c->mu);
    int rc = grow((void **)&c->segs, &c->segs_cap, c->nsegs, sizeof *c->segs);
    pthread_mutex_unlock(&c->mu);
    if (rc != 0)
        return rc;
    CUdeviceptr p = 0;
    rc = CALL(c, MemAlloc(&p, size));
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&c->mu);
    rc = grow((void **)&c->segs, &c->segs_cap, c->nsegs, sizeof *c->segs);
    if (rc == 0)
        c->segs[c->nsegs++] = (cuda_seg_t){p, size};
    pthread_mutex_unlock(&c->mu);
    if (rc != 0) {
        CALL(c, MemFree(p));
        return rc;
    }
    *out = (void *)(uintptr_t)p;
    return 0;
}

static int cuda_free(mt_backend_t *b, void *ptr)
{
    cuda_t *c = C(b);
    pthread_mutex_lock(&c->mu);
    size_t i = 0;
    while (i < c->nsegs && c->segs[i].ptr != (CUdeviceptr)(uintptr_t)ptr)
        i++;
    if (i == c->nsegs) {
        pthread_mutex_unlock(&c->mu);
        return MT_ENOENT;
    }
    c->segs[i] = c->segs[--c->nsegs];
    pthread_mutex_unlock(&c->mu);
    /* cuMemFree synchronises the device itself, which is the documented contract. */
    return CALL(c, MemFree((CUdeviceptr)(uintptr_t)ptr));
}

static int cuda_mem_get_info(mt_backend_t *b, size_t *free_bytes, size_t *total_bytes)
{
    return CALL(C(b), MemGetInfo(free_bytes, total_bytes));
}

static bool cuda_is_device_ptr(const mt_backend_t *b, const void *ptr)
{
    cuda_t *c = C(b);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
    bool found = false;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->nsegs && !found; i++)
        found = p >= c->segs[i].ptr && p - c->segs[i].ptr < c->segs[i].size;
    for (cuda_vm_t *v = c->vms; v != NULL && !found; v = v->next)
        if (p >= v->base && p - v->base < v->size)
            found = v->pages[(p - v->base) / c->granularity] != 0;
    pthread_mutex_unlock(&c->mu);
    return found;
}

/* ---- virtual memory (expandable segments) ---- */

static CUmemAllocationProp pinned_prop(const cuda_t *c)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = c->dev;
    prop.requestedHandleTypes = c->handle_types;
    return prop;
}

/* Read-write access to [p, p + size), all mapped, for c's own device and every device
 * that enabled peer access to it: cudaDeviceEnablePeerAccess covers cuMemAlloc memory
 * only, VMM mappings need each accessor named. Caller holds mu. */
static int grant_access(cuda_t *c, CUdeviceptr p, size_t size)
{
    int n = c->group ? c->group->n : 1;
    CUmemAccessDesc *acc = calloc((size_t)n + 1, sizeof *acc);
    if (acc == NULL)
        return MT_ENOMEM;
    size_t k = 0;
    acc[k].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc[k++].location.id = c->dev;
    for (int i = 0; c->peer_access != NULL && i < n; i++)
        if (c->peer_access[i] && i != c->dev) {
            acc[k].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            acc[k++].location.id = i;
        }
    for (size_t i = 0; i < k; i++)
        acc[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    int rc = CALL(c, MemSetAccess(p, size, acc, k));
    free(acc);
    return rc;
}

static size_t cuda_vm_granularity(const mt_backend_t *b)
{
    return C(b)->granularity;
}

static int cuda_vm_reserve(mt_backend_t *b, size_t size, void **out)
{
    cuda_t *c = C(b);
    cuda_vm_t *v = calloc(1, sizeof *v);
    if (v == NULL)
        return MT_ENOMEM;
    v->size = size;
    v->npages = size / c->granularity;
    v->pages = calloc(v->npages, sizeof *v->pages);
    if (v->pages == NULL) {
        free(v);
        return MT_ENOMEM;
    }
    int rc = CALL(c, MemAddressReserve(&v->base, size, c->granularity, 0, 0));
    if (rc != 0) {
        free(v->pages);
        free(v);
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    v->next = c->vms;
    c->vms = v;
    pthread_mutex_unlock(&c->mu);
    *out = (void *)(uintptr_t)v->base;
    return 0;
}

/* The reservation holding [p, p + size), or NULL. Caller holds mu. */
static cuda_vm_t *vm_find(cuda_t *c, CUdeviceptr p, size_t size)
{
    for (cuda_vm_t *v = c->vms; v != NULL; v = v->next)
        if (p >= v->base && p - v->base <= v->size && size <= v->size - (p - v->base))
            return v;
    return NULL;
}

static int cuda_vm_release(mt_backend_t *b, void *base, size_t size)
{
    cuda_t *c = C(b);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)base;
    pthread_mutex_lock(&c->mu);
    cuda_vm_t **pp = &c->vms;
    while (*pp != NULL && ((*pp)->base != p || (*pp)->size != size))
        pp = &(*pp)->next;
    cuda_vm_t *v = *pp;
    int rc = v == NULL ? MT_ENOENT : 0;
    for (size_t i = 0; rc == 0 && i < v->npages; i++)
        if (v->pages[i] != 0)
            rc = MT_EBUSY; /* the contract: unmap every page first */
    if (rc == 0)
        *pp = v->next;
    pthread_mutex_unlock(&c->mu);
    if (rc != 0)
        return rc;
    rc = CALL(c, MemAddressFree(v->base, v->size));
    free(v->pages);
    free(v);
    return rc;
}

/* Unmaps and releases pages [first, first + n) of v, all mapped. One cuMemUnmap per
 * page: the driver only unmaps whole mappings, and each page is its own. Caller holds
 * mu. Returns the first failure but carries on, so no page is left half-accounted. */
static int unmap_pages(cuda_t *c, cuda_vm_t *v, size_t first, size_t n)
{
    int rc = 0;
    for (size_t i = first; i < first + n; i++) {
        int r = CALL(c, MemUnmap(v->base + i * c->granularity, c->granularity));
        if (r == 0)
            r = CALL(c, MemRelease(v->pages[i]));
        if (r != 0 && rc == 0)
            rc = r;
        v->pages[i] = 0;
    }
    return rc;
}

/* One physical allocation per page, so that any page-aligned sub-range can be unmapped
 * later: cuMemUnmap must cover whole mappings, and the allocator shrinks expandable
 * segments page by page. Access is granted once for the whole range. */
static int cuda_vm_map(mt_backend_t *b, void *addr, size_t size)
{
    cuda_t *c = C(b);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr;
    CUmemAllocationProp prop = pinned_prop(c);
    pthread_mutex_lock(&c->mu);
    cuda_vm_t *v = vm_find(c, p, size);
    size_t first = v ? (p - v->base) / c->granularity : 0;
    size_t n = size / c->granularity;
    int rc = v == NULL ? MT_ENOENT : 0;
    for (size_t i = first; rc == 0 && i < first + n; i++)
        if (v->pages[i] != 0)
            rc = MT_EBUSY;
    size_t done = 0;
    while (rc == 0 && done < n) {
        CUmemGenericAllocationHandle h = 0;
        rc = CALL(c, MemCreate(&h, c->granularity, &prop, 0));
        if (rc != 0)
            break;
        rc = CALL(c, MemMap(p + done * c->granularity, c->granularity, 0, h, 0));
        if (rc != 0) {
            CALL(c, MemRelease(h));
            break;
        }
        v->pages[first + done++] = h;
    }
    if (rc == 0)
        rc = grant_access(c, p, size);
    if (rc != 0 && v != NULL && done > 0)
        unmap_pages(c, v, first, done); /* all or nothing */
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int cuda_vm_unmap(mt_backend_t *b, void *addr, size_t size)
{
    cuda_t *c = C(b);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr;
    pthread_mutex_lock(&c->mu);
    cuda_vm_t *v = vm_find(c, p, size);
    size_t first = v ? (p - v->base) / c->granularity : 0;
    size_t n = size / c->granularity;
    int rc = v == NULL ? MT_ENOENT : 0;
    for (size_t i = first; rc == 0 && i < first + n; i++)
        if (v->pages[i] == 0)
            rc = MT_EINVAL;
    if (rc == 0)
        rc = unmap_pages(c, v, first, n);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- streams ---- */

static int cuda_stream_create(mt_backend_t *b, mt_stream_t **out)
{
    cuda_t *c = C(b);
    cuda_stream_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return MT_ENOMEM;
    /* Non-blocking: the allocator's streams must not serialise with the legacy default
     * stream of the program, as PyTorch's streams do not. */
    int rc = CALL(c, StreamCreate(&s->h, CU_STREAM_NON_BLOCKING));
    if (rc != 0) {
        free(s);
        return rc;
    }
    s->owned = true;
    pthread_mutex_lock(&c->mu);
    s->base.id = c->next_stream_id++;
    s->next = c->streams;
    c->streams = s;
    pthread_mutex_unlock(&c->mu);
    *out = &s->base;
    return 0;
}

static void cuda_stream_destroy(mt_backend_t *b, mt_stream_t *st)
{
    cuda_t *c = C(b);
    cuda_stream_t *s = (cuda_stream_t *)st;
    pthread_mutex_lock(&c->mu);
    cuda_stream_t **pp = &c->streams;
    while (*pp != NULL && *pp != s)
        pp = &(*pp)->next;
    if (*pp != NULL)
        *pp = s->next;
    pthread_mutex_unlock(&c->mu);
    if (s->owned) {
        CALL(c, StreamSynchronize(s->h));
        CALL(c, StreamDestroy(s->h));
    }
    free(s);
}

/* A number for the calling thread, never reused in the process (pthread_self values are,
 * and a new thread's per-thread stream is a new stream). */
static uintptr_t thread_id(void)
{
    static _Atomic uintptr_t next = 1;
    static __thread uintptr_t id;
    if (id == 0)
        id = atomic_fetch_add(&next, 1);
    return id;
}

int mt__cuda_stream_wrap(mt_backend_t *b, uintptr_t handle, mt_stream_t **out)
{
    if (!mt__cuda_is_cuda(b) || out == NULL)
        return MT_EINVAL;
    *out = NULL;
    if (handle == 0)
        return 0;
    cuda_t *c = C(b);
    /* The per-thread default stream is one stream per thread under one handle value. */
    uintptr_t thread = handle == (uintptr_t)CU_STREAM_PER_THREAD ? thread_id() : 0;
    pthread_mutex_lock(&c->mu);
    cuda_stream_t *s = c->streams;
    while (s != NULL && ((uintptr_t)s->h != handle || s->thread != thread || s->retired))
        s = s->next;
    if (s == NULL && (s = calloc(1, sizeof *s)) != NULL) {
        s->h = (CUstream)handle;
        s->thread = thread;
        s->base.id = c->next_stream_id++;
        s->next = c->streams;
        c->streams = s;
    }
    pthread_mutex_unlock(&c->mu);
    if (s == NULL)
        return MT_ENOMEM;
    *out = &s->base;
    return 0;
}

int mt__cuda_stream_forget(mt_backend_t *b, uintptr_t handle)
{
    if (!mt__cuda_is_cuda(b))
        return MT_EINVAL;
    cuda_t *c = C(b);
    int rc = MT_ENOENT;
    pthread_mutex_lock(&c->mu);
    for (cuda_stream_t *s = c->streams; s != NULL; s = s->next)
        if ((uintptr_t)s->h == handle && !s->owned && !s->retired) {
            s->retired = true; /* the allocator may still hold the wrapper: keep it */
            rc = 0;
        }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

uintptr_t mt__cuda_stream_handle(const mt_stream_t *s)
{
    return (uintptr_t)SH(s);
}

static int cuda_stream_synchronize(mt_backend_t *b, mt_stream_t *s)
{
    return CALL(C(b), StreamSynchronize(SH(s)));
}

static int cuda_stream_wait_event(mt_backend_t *b, mt_stream_t *s, mt_event_t *ev)
{
    if (!ev->recorded)
        return 0;
    return CALL(C(b), StreamWaitEvent(SH(s), ev->h, 0));
}

static int cuda_launch_host_func(mt_backend_t *b, mt_stream_t *s, void (*fn)(void *), void *ud)
{
    return CALL(C(b), LaunchHostFunc(SH(s), fn, ud));
}

/* With unified addressing (every 64-bit platform CUDA supports), cuMemcpyAsync infers
 * the direction from the pointers, so the kind only matters for argument checks. */
static int cuda_memcpy_async(mt_backend_t *b, void *dst, const void *src, size_t n,
                             mt_memcpy_kind_e kind, mt_stream_t *s)
{
    (void)kind;
    return CALL(C(b),
                MemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n, SH(s)));
}

static int cuda_memset_async(mt_backend_t *b, void *dst, int value, size_t n, mt_stream_t *s)
{
    return CALL(C(b), MemsetD8Async((CUdeviceptr)(uintptr_t)dst, (unsigned char)value, n, SH(s)));
}

static int cuda_device_synchronize(mt_backend_t *b)
{
    return CALL(C(b), CtxSynchronize());
}

/* ---- events ---- */

/* Timing disabled unless asked for: the allocator's events only order streams, and a
 * timing event costs a timestamp write at every record (CUDA's guide). */
static int event_new(mt_backend_t *b, bool timed, mt_event_t **out)
{
    mt_event_t *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return MT_ENOMEM;
    ev->timed = timed;
    int rc = CALL(C(b), EventCreate(&ev->h, timed ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING));
    if (rc != 0) {
        free(ev);
        return rc;
    }
    *out = ev;
    return 0;
}

static int cuda_event_create(mt_backend_t *b, mt_event_t **out)
{
    return event_new(b, false, out);
}

static int cuda_event_create_timed(mt_backend_t *b, mt_event_t **out)
{
    return event_new(b, true, out);
}

static void cuda_event_destroy(mt_backend_t *b, mt_event_t *ev)
{
    CALL(C(b), EventDestroy(ev->h));
    free(ev);
}

static int cuda_event_record(mt_backend_t *b, mt_event_t *ev, mt_stream_t *s)
{
    int rc = CALL(C(b), EventRecord(ev->h, SH(s)));
    if (rc == 0)
        ev->recorded = true;
    return rc;
}

static int cuda_event_query(mt_backend_t *b, mt_event_t *ev)
{
    return ev->recorded ? CALL(C(b), EventQuery(ev->h)) : 0;
}

static int cuda_event_synchronize(mt_backend_t *b, mt_event_t *ev)
{
    return ev->recorded ? CALL(C(b), EventSynchronize(ev->h)) : 0;
}

#define ANCHOR_MS 1000.0f /* float ms steps are 61 ns at 1 s */

/* Moves the origin to now: a new origin event on the backend's own stream, its time
 * taken from the old origin while the gap is still short. Caller holds anchor_mu. */
static int move_origin(cuda_t *c)
{
    int rc = 0;
    if (c->anchor_stream == NULL)
        rc = CALL(c, StreamCreate(&c->anchor_stream, CU_STREAM_NON_BLOCKING));
    if (rc == 0 && c->spare_ev == NULL)
        rc = CALL(c, EventCreate(&c->spare_ev, CU_EVENT_DEFAULT));
    if (rc == 0)
        rc = CALL(c, EventRecord(c->spare_ev, c->anchor_stream));
    if (rc == 0)
        rc = CALL(c, EventSynchronize(c->spare_ev));
    float ms = 0;
    if (rc == 0)
        rc = CALL(c, EventElapsedTime(&ms, c->origin_ev, c->spare_ev));
    if (rc != 0 || ms < 0)
        return rc != 0 ? rc : MT_EIO;
    c->origin_ns += (uint64_t)llround((double)ms * 1e6);
    CUevent old = c->origin_ev;
    c->origin_ev = c->spare_ev;
    c->spare_ev = old;
    return 0;
}

static uint64_t cuda_event_time_ns(mt_backend_t *b, mt_event_t *ev)
{
    cuda_t *c = C(b);
    if (!ev->timed || !ev->recorded || CALL(c, EventQuery(ev->h)) != 0)
        return 0;
    pthread_mutex_lock(&c->anchor_mu);
    float ms = 0;
    int rc = CALL(c, EventElapsedTime(&ms, c->origin_ev, ev->h));
    if (rc == 0 && ms > ANCHOR_MS && move_origin(c) == 0)
        rc = CALL(c, EventElapsedTime(&ms, c->origin_ev, ev->h));
    int64_t t = rc == 0 ? (int64_t)c->origin_ns + llround((double)ms * 1e6) : 0;
    pthread_mutex_unlock(&c->anchor_mu);
    return t > 0 ? (uint64_t)t : 0;
}

/* ---- pinned host memory ---- */

/* flags are cuMemHostAlloc's (the runtime's cudaHostAlloc flags have the same values);
 * portable is always added, since the backend serves every context of the process. */
static int cuda_host_malloc_flags(mt_backend_t *b, size_t size, unsigned flags, void **out)
{
    cuda_t *c = C(b);
    pthread_mutex_lock(&c->mu);
    int rc = grow((void **)&c->hosts, &c->hosts_cap, c->nhosts, sizeof *c->hosts);
    pthread_mutex_unlock(&c->mu);
    if (rc != 0)
        return rc;
    void *p = NULL;
    rc = CALL(c, MemHostAlloc(&p, size, flags | CU_MEMHOSTALLOC_PORTABLE));
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&c->mu);
    rc = grow((void **)&c->hosts, &c->hosts_cap, c->nhosts, sizeof *c->hosts);
    if (rc == 0)
        c->hosts[c->nhosts++] = p;
    pthread_mutex_unlock(&c->mu);
    if (rc != 0) {
        CALL(c, MemFreeHost(p));
        return rc;
    }
    *out = p;
    return 0;
}

static int cuda_host_malloc(mt_backend_t *b, size_t size, void **out)
{
    return cuda_host_malloc_flags(b, size, 0, out);
}

static int cuda_host_free(mt_backend_t *b, void *ptr)
{
    cuda_t *c = C(b);
    pthread_mutex_lock(&c->mu);
    size_t i = 0;
    while (i < c->nhosts && c->hosts[i] != ptr)
        i++;
    bool found = i < c->nhosts;
    if (found)
        c->hosts[i] = c->hosts[--c->nhosts];
    pthread_mutex_unlock(&c->mu);
    if (!found)
        return MT_ENOENT;
    return CALL(c, MemFreeHost(ptr));
}

/* ---- lifecycle ---- */

static void device_close(mt_backend_t *b)
{
    cuda_t *c = C(b);
    if (enter(c) == 0) {
        c->drv.CtxSynchronize();
        while (c->streams != NULL) {
            cuda_stream_t *s = c->streams;
            c->streams = s->next;
            if (s->owned)
                c->drv.StreamDestroy(s->h);
            free(s);
        }
        for (size_t i = 0; i < c->nsegs; i++)
            c->drv.MemFree(c->segs[i].ptr);
        for (size_t i = 0; i < c->nhosts; i++)
            c->drv.MemFreeHost(c->hosts[i]);
        while (c->vms != NULL) {
            cuda_vm_t *v = c->vms;
            c->vms = v->next;
            for (size_t i = 0; i < v->npages; i++)
                if (v->pages[i] != 0) {
                    c->drv.MemUnmap(v->base + i * c->granularity, c->granularity);
                    c->drv.MemRelease(v->pages[i]);
                }
            c->drv.MemAddressFree(v->base, v->size);
            free(v->pages);
            free(v);
        }
        if (c->origin_ev != NULL)
            c->drv.EventDestroy(c->origin_ev);
        if (c->spare_ev != NULL)
            c->drv.EventDestroy(c->spare_ev);
        if (c->anchor_stream != NULL)
            c->drv.StreamDestroy(c->anchor_stream);
        leave(c);
    }
    c->drv.DevicePrimaryCtxRelease(c->dev);
    mt__cuda_driver_close(&c->drv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->anchor_mu);
    free(c->segs);
    free(c->hosts);
    free(c->peer_access);
    free(c);
}

bool mt__cuda_is_cuda(const mt_backend_t *b)
{
    return b != NULL && b->ops == &cuda_ops;
}

/* Opens device cfg->device as one backend object (its group not yet set). */
static int device_open(mt_backend_t **out, const mt_backend_cfg_t *cfg)
{
    cuda_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return MT_ENOMEM;
    c->base.ops = &cuda_ops;
    c->base.device = cfg->device;
    c->base.log = cfg->log;
    c->base.log_ud = cfg->log_ud;
    c->next_stream_id = 1;
    /* Expandable segments export their pages only if created shareable (PyTorch's IPC of
     * expandable segments asks for POSIX file descriptors). */
    const char *ht = getenv("MEMTRACE_CUDA_HANDLE_TYPE");
    if (ht == NULL || *ht == '\0' || strcmp(ht, "none") == 0)
        c->handle_types = CU_MEM_HANDLE_TYPE_NONE;
    else if (strcmp(ht, "posix_fd") == 0)
        c->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    else if (strcmp(ht, "fabric") == 0)
        c->handle_types = CU_MEM_HANDLE_TYPE_FABRIC;
    else {
        mt__backend_log(&c->base, MT_LOG_ERROR,
                        "memtrace: MEMTRACE_CUDA_HANDLE_TYPE=%s: want none, posix_fd or fabric",
                        ht);
        free(c);
        return MT_EINVAL;
    }
    char err[256];
    int rc = mt__cuda_driver_open(&c->drv, err, sizeof err);
    if (rc != 0) {
        mt__backend_log(&c->base, MT_LOG_DEBUG, "memtrace: cuda backend: %s", err);
        goto fail_open;
    }
    /* Any failure before a context exists means no usable device: ENODEV, so that auto
     * falls back to sim. */
    int count = 0;
    if (note(c->drv.Init(0)) != 0 || c->drv.DeviceGetCount(&count) != CUDA_SUCCESS ||
        cfg->device >= count || c->drv.DeviceGet(&c->dev, cfg->device) != CUDA_SUCCESS) {
        mt__backend_log(&c->base, MT_LOG_DEBUG, "memtrace: cuda backend: no device %d",
                        cfg->device);
        rc = MT_ENODEV;
        goto fail_device;
    }
    if (c->drv.DevicePrimaryCtxRetain(&c->ctx, c->dev) != CUDA_SUCCESS) {
        rc = MT_ENODEV;
        goto fail_device;
    }
    CUmemAllocationProp prop = pinned_prop(c);
    c->granularity = 0;
    rc = CALL(
        c, MemGetAllocationGranularity(&c->granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    /* The seam promises 2 MiB pages; a device with a larger minimum uses its own (a
     * multiple of 2 MiB on every known device). */
    if (rc != 0 || c->granularity < ((size_t)2 << 20))
        c->granularity = (size_t)2 << 20;
    rc = CALL(c, EventCreate(&c->origin_ev, CU_EVENT_DEFAULT));
    if (rc == 0)
        rc = CALL(c, EventRecord(c->origin_ev, NULL));
    if (rc == 0)
        rc = CALL(c, EventSynchronize(c->origin_ev));
    if (rc != 0)
        goto fail_ctx;
    c->origin_ns = now_ns();
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->anchor_mu, NULL);
    *out = &c->base;
    return 0;

fail_ctx:
    if (c->origin_ev != NULL)
        CALL(c, EventDestroy(c->origin_ev));
    c->drv.DevicePrimaryCtxRelease(c->dev);
fail_device:
    mt__cuda_driver_close(&c->drv);
fail_open:
    free(c);
    return rc;
}

/* ---- devices of the process ---- */

static void group_free(cuda_group_t *g)
{
    for (int i = 0; i < g->n; i++)
        if (g->dev[i] != NULL)
            device_close(&g->dev[i]->base);
    pthread_mutex_destroy(&g->mu);
    free(g->dev);
    free(g);
}

static void cuda_destroy(mt_backend_t *b)
{
    if (C(b)->owner)
        group_free(C(b)->group);
}

static int cuda_device_count(const mt_backend_t *b)
{
    return C(b)->group->n;
}

/* Opens device i of g, or returns it. Caller holds g->mu. */
static cuda_t *group_device(cuda_group_t *g, int i)
{
    if (g->dev[i] != NULL)
        return g->dev[i];
    mt_backend_cfg_t cfg = g->cfg;
    cfg.device = i;
    mt_backend_t *b = NULL;
    bool *peers = calloc((size_t)g->n, sizeof *peers);
    if (peers == NULL || device_open(&b, &cfg) != 0) {
        free(peers);
        return NULL;
    }
    C(b)->peer_access = peers;
    C(b)->group = g;
    g->dev[i] = C(b);
    return g->dev[i];
}

/* NULL (backend.c returns MT_ENODEV) when the device's context cannot be had. */
static mt_backend_t *cuda_get_device(mt_backend_t *b, int ordinal)
{
    cuda_group_t *g = C(b)->group;
    pthread_mutex_lock(&g->mu);
    cuda_t *c = group_device(g, ordinal);
    pthread_mutex_unlock(&g->mu);
    return c ? &c->base : NULL;
}

/* cuMemcpyPeerAsync on b's stream s, between the two devices' primary contexts. The
 * copy's time is the driver's, not modelled: peer_ns stays 0 on cuda. */
static int cuda_memcpy_peer_async(mt_backend_t *b, void *dst, int dst_device, const void *src,
                                  int src_device, size_t n, mt_stream_t *s)
{
    cuda_t *c = C(b);
    mt_backend_t *db = cuda_get_device(b, dst_device), *sb = cuda_get_device(b, src_device);
    if (db == NULL || sb == NULL)
        return MT_ENODEV;
    int rc = CALL(c, MemcpyPeerAsync((CUdeviceptr)(uintptr_t)dst, C(db)->ctx,
                                     (CUdeviceptr)(uintptr_t)src, C(sb)->ctx, n, SH(s)));
    if (rc == 0)
        mt__backend_add_peer(b, n, 0);
    return rc;
}

/* Device b may now read and write device peer's memory: cuCtxEnablePeerAccess (already
 * enabled is fine: the program's runtime may have done it), then every page peer has
 * mapped for expandable segments is granted to b's device, and later maps are too. */
static int cuda_enable_peer_access(mt_backend_t *b, int peer)
{
    cuda_t *c = C(b);
    mt_backend_t *pb = cuda_get_device(b, peer);
    if (pb == NULL)
        return MT_ENODEV;
    cuda_t *p = C(pb);
    int rc = enter(c);
    if (rc == 0) {
        int res = c->drv.CtxEnablePeerAccess(p->ctx, 0);
        rc = res == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED ? 0 : note(res);
        leave(c);
    }
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&p->mu);
    bool was = p->peer_access[c->dev];
    p->peer_access[c->dev] = true;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = c->dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (cuda_vm_t *v = p->vms; v != NULL && !was && rc == 0; v = v->next)
        for (size_t i = 0; i < v->npages && rc == 0;) {
            size_t j = i;
            while (j < v->npages && v->pages[j] != 0)
                j++;
            if (j > i)
                rc = CALL(p, MemSetAccess(v->base + i * p->granularity, (j - i) * p->granularity,
                                          &acc, 1));
            i = j + 1;
        }
    if (rc != 0)
        p->peer_access[c->dev] = false;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int mt__backend_cuda_create(mt_backend_t **out, const mt_backend_cfg_t *cfg)
{
    mt_backend_t *b = NULL;
    int rc = device_open(&b, cfg);
    if (rc != 0)
        return rc;
    cuda_t *c = C(b);
    int count = 0;
    rc = MT_ENOMEM;
    cuda_group_t *g = calloc(1, sizeof *g);
    if (g == NULL)
        goto fail_group;
    if (c->drv.DeviceGetCount(&count) != CUDA_SUCCESS || count < 1) {
        rc = MT_ENODEV;
        goto fail_count;
    }
    g->n = count;
    g->cfg = *cfg;
    g->dev = calloc((size_t)count, sizeof *g->dev);
    c->peer_access = calloc((size_t)count, sizeof *c->peer_access);
    if (g->dev == NULL || c->peer_access == NULL)
        goto fail_count;
    if (pthread_mutex_init(&g->mu, NULL) != 0)
        goto fail_count;
    c->group = g;
    c->owner = true;
    g->dev[cfg->device] = c;
    *out = b;
    return 0;

fail_count:
    free(g->dev);
    free(g);
fail_group:
    device_close(b);
    return rc;
}

static const mt_backend_ops_t cuda_ops = {
    .name = "cuda",
    .kind = MT_BACKEND_CUDA,
    .destroy = cuda_destroy,
    .malloc = cuda_malloc,
    .free = cuda_free,
    .mem_get_info = cuda_mem_get_info,
    .is_device_ptr = cuda_is_device_ptr,
    .vm_granularity = cuda_vm_granularity,
    .vm_reserve = cuda_vm_reserve,
    .vm_release = cuda_vm_release,
    .vm_map = cuda_vm_map,
    .vm_unmap = cuda_vm_unmap,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_synchronize = cuda_stream_synchronize,
    .stream_wait_event = cuda_stream_wait_event,
    .launch_host_func = cuda_launch_host_func,
    .memcpy_async = cuda_memcpy_async,
    .memset_async = cuda_memset_async,
    .device_synchronize = cuda_device_synchronize,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .event_time_ns = cuda_event_time_ns,
    .host_malloc = cuda_host_malloc,
    .host_free = cuda_host_free,
    .device_count = cuda_device_count,
    .get_device = cuda_get_device,
    .memcpy_peer_async = cuda_memcpy_peer_async,
    .enable_peer_access = cuda_enable_peer_access,
    .event_create_timed = cuda_event_create_timed,
    .host_malloc_flags = cuda_host_malloc_flags,
};
