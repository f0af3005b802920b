/* The preload library's process-wide context (see preload.h): one-time set-up, the
 * per-device allocators, the event sink (symbol resolution: resolve.c; what runs at exit:
 * summary.c). */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mt_config.h"
#include "preload/hooks_graph.h"
#include "preload/outside.h"
#include "preload/preload.h"
#include "util/addrmap.h"
#include "util/evbatch.h"
#if MT_HAVE_CUDA_BACKEND
#include "backend/backend_cuda.h"
#endif

_Thread_local int mt__preload_guard;

/* The singleton the C ABI forces (see preload.h). */
static mt_preload_t mt_preload_ctx = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .oom_mu = PTHREAD_MUTEX_INITIALIZER,
};
static pthread_once_t mt_preload_once = PTHREAD_ONCE_INIT;

/* The current device is per thread in CUDA (cudaSetDevice). */
static _Thread_local int tls_device;

/* ---- messages ---- */

void mt__preload_say(mt_log_level_e level, const char *fmt, ...)
{
    if ((int)level > mt_preload_ctx.log_level)
        return;
    char msg[2400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* One write, so lines of concurrent threads do not interleave. */
    char line[2500];
    int n =
        snprintf(line, sizeof line, "%s%s\n", strncmp(msg, "memtrace", 8) ? "memtrace: " : "", msg);
    if (n > 0) {
        ssize_t w = write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)w;
    }
}

static void log_cb(void *ud, mt_log_level_e level, const char *msg)
{
    (void)ud;
    mt__preload_say(level, "%s", msg);
}

static int parse_level(const char *s)
{
    if (s == NULL)
        return MT_LOG_INFO;
    if (strcmp(s, "error") == 0)
        return MT_LOG_ERROR;
    if (strcmp(s, "warn") == 0)
        return MT_LOG_WARN;
    if (strcmp(s, "debug") == 0)
        return MT_LOG_DEBUG;
    if (strcmp(s, "quiet") == 0)
        return -1;
    return MT_LOG_INFO;
}

/* ---- event sink ---- */

/* Counts ev[0..n) by kind: one add per kind present, on counters every thread shares. */
static void count_kinds(mt_preload_t *P, const mt_event_rec_t *ev, size_t n)
{
    uint64_t kinds[MT_EV_KIND_COUNT] = {0};
    for (size_t i = 0; i < n; i++)
        kinds[ev[i].kind < MT_EV_KIND_COUNT ? ev[i].kind : 0]++;
    for (int k = 0; k < MT_EV_KIND_COUNT; k++)
        if (kinds[k] != 0)
            atomic_fetch_add_explicit(&P->ev_count[k], kinds[k], memory_order_relaxed);
}

static void sink_emit(void *ud, const mt_event_rec_t *ev)
{
    mt_preload_t *P = ud;
    count_kinds(P, ev, 1);
    if (atomic_load(&P->prof_live))
        mt_prof_sink(P->prof)->emit(mt_prof_sink(P->prof)->ud, ev);
}

/* An operation's events together (a stack ref and its alloc: one claim in the ring). */
static void sink_emit_n(void *ud, const mt_event_rec_t *ev, size_t n)
{
    mt_preload_t *P = ud;
    count_kinds(P, ev, n);
    if (atomic_load(&P->prof_live))
        mt_prof_sink(P->prof)->emit_n(mt_prof_sink(P->prof)->ud, ev, n);
}

/* A thread cache's batch in two steps (event.h), forwarded while the profiler lives. */
static bool sink_claim(void *ud, size_t n, uint64_t tok[2])
{
    mt_preload_t *P = ud;
    if (!atomic_load(&P->prof_live))
        return false; /* emit_n counts them, and records nothing */
    const mt_event_sink_t *s = mt_prof_sink(P->prof);
    return s->claim(s->ud, n, tok);
}

static void sink_write(void *ud, const uint64_t tok[2], const mt_event_rec_t *ev, size_t n)
{
    mt_preload_t *P = ud;
    count_kinds(P, ev, n);
    const mt_event_sink_t *s = mt_prof_sink(P->prof);
    s->write(s->ud, tok, ev, n); /* claimed while it lived: its ring outlives the claim */
}

/* The same in compact form (util/evbatch.h): its events counted by kind from its entries. */
static void sink_write_batch(void *ud, const uint64_t tok[2], const void *hdr, const void *ents)
{
    mt_preload_t *P = ud;
    const mt__evb_hdr_t *h = hdr;
    const mt__evb_ent_t *e = ents;
    uint64_t stack = 0, alloc = 0, freed = 0;
    for (uint32_t i = 0; i < h->nent; i++) {
        uint64_t times = 1u + e[i].rep; /* a POP_FREE's repeats */
        unsigned op = mt__evb_op(&e[i]);
        stack += op == MT__EVB_STACK;
        alloc += (op == MT__EVB_POP || op == MT__EVB_POP_FREE) * times;
        freed += (op == MT__EVB_FREE || op == MT__EVB_POP_FREE) * times;
    }
    atomic_fetch_add_explicit(&P->ev_count[MT_EV_STACK_REF], stack, memory_order_relaxed);
    atomic_fetch_add_explicit(&P->ev_count[MT_EV_ALLOC], alloc, memory_order_relaxed);
    atomic_fetch_add_explicit(&P->ev_count[MT_EV_FREE_REQUESTED], freed, memory_order_relaxed);
    atomic_fetch_add_explicit(&P->ev_count[MT_EV_FREE_COMPLETED], freed, memory_order_relaxed);
    const mt_event_sink_t *s = mt_prof_sink(P->prof);
    s->write_batch(s->ud, tok, hdr, ents); /* claimed while it lived: its ring outlives it */
}

/* An allocator's events kept back: the profiler's own thread asks for them (event.h,
 * source), while it lives. */
static void sink_source(void *ud, void (*push)(void *arg), void *arg, bool on)
{
    mt_preload_t *P = ud;
    if (!atomic_load(&P->prof_live))
        return;
    const mt_event_sink_t *s = mt_prof_sink(P->prof);
    if (s->source != NULL)
        s->source(s->ud, push, arg, on);
}

/* The allocating thread's call stack (MEMTRACE_STACKS), before the allocator's lock. */
static uint32_t sink_stack(void *ud, uint64_t bytes, int pool, int mode)
{
    mt_preload_t *P = ud;
    if (!atomic_load(&P->prof_live))
        return 0;
    const mt_event_sink_t *s = mt_prof_sink(P->prof);
    return s->stack(s->ud, bytes, pool, mode);
}

/* ---- devices ---- */

int mt__preload_current_device(void)
{
    return tls_device;
}

void mt__preload_set_current_device(int device)
{
    tls_device = device;
}

static bool driver_is_us(void)
{
    const char *path = getenv("MEMTRACE_LIBCUDA");
    void *h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (h == NULL)
        return false;
    bool us = mt__preload_real_dlsym(h, "mt__preload_guard") != NULL ||
              mt__preload_real_dlsym(h, "memtrace_alloc") != NULL;
    dlclose(h);
    return us;
}

/* Whether the program's runtime calls reach our hooks: the first definition of a hooked
 * name in the global scope is ours (LD_PRELOAD, or linked ahead of the runtime). Not so
 * for torch's pluggable allocator alone: libtorch loads the runtime globally, and our
 * library is opened later. */
static bool hooks_interposed(void)
{
    void *f = mt__preload_real_dlsym(RTLD_DEFAULT, "cudaDeviceEnablePeerAccess");
    Dl_info ours, first;
    return f != NULL && dladdr((const void *)hooks_interposed, &ours) != 0 &&
           dladdr(f, &first) != 0 && ours.dli_fbase == first.dli_fbase;
}

int mt__preload_register_tag(mt_preload_t *P, int id, int device)
{
    int rc = 0;
    for (int d = device < 0 ? 0 : device; d < (device < 0 ? P->ndevices : device + 1); d++) {
        for (int k = 0; k < 2 && rc == 0; k++) { /* the device's allocator, its managed one */
            mt_alloc_t *a = k == 0 ? P->dev[d].alloc : P->managed[d];
            int got = -1;
            if (a == NULL)
                continue;
            mt__guard_enter();
            rc = mt_alloc_tag_register(a, P->tag_names[id], &got);
            mt__guard_leave();
            if (rc == 0 && got != id) /* only we register tags on these allocators */
                rc = MT_EPROTO;
        }
        if (rc != 0)
            break;
    }
    return rc;
}

/* Bit p of peer_mask[d]: device d enabled peer access to device p (devices < 64). */
static _Atomic uint64_t peer_mask[64];

static int grant_peer(mt_preload_t *P, int dev, int peer);

static int create_device(mt_preload_t *P, int d)
{
    mt_backend_cfg_t bcfg = P->bcfg;
    bcfg.device = d;
    /* On sim every device is one of device 0's group (one address space, peer copies
     * between them), kept across device resets; mt_backend_destroy on a borrowed handle
     * does nothing. On cuda each device is its own backend, dropped at a reset. */
    int rc = 0;
    if (P->dev[d].backend == NULL)
        rc = d > 0 && P->sim ? mt_backend_get_device(P->dev[0].backend, d, &P->dev[d].backend)
                             : mt_backend_create(&P->dev[d].backend, &bcfg);
    if (rc != 0)
        return rc;
    mt_alloc_cfg_t acfg = P->acfg;
    acfg.backend = P->dev[d].backend;
    acfg.sink = &P->sink;
    rc = mt_alloc_create(&P->dev[d].alloc, &acfg);
    if (rc != 0) {
        mt_backend_destroy(&P->dev[d].backend);
        return rc;
    }
    rc = mt_alloc_add_oom_observer(P->dev[d].alloc, mt__preload_oom_observer, NULL);
    /* The user tags registered so far, in id order, so every device agrees on ids. */
    for (int i = 0; i < atomic_load(&P->ntags_user) && rc == 0; i++)
        rc = mt__preload_register_tag(P, MT_TAG_USER_FIRST + i, d);
    if (rc != 0) {
        mt_alloc_destroy(&P->dev[d].alloc);
        mt_backend_destroy(&P->dev[d].backend);
        return rc;
    }
    atomic_store_explicit(&P->ready[d], P->dev[d].alloc, memory_order_release);
    for (int i = 0; i < 64 && d < 64 && !P->sim; i++) /* peer access enabled before */
        if (atomic_load(&peer_mask[i]) >> d & 1)
            grant_peer(P, i, d);
    return 0;
}

/* dev may access peer: grant peer's backend's mappings to dev (cuda mode; nothing to do
 * on sim). Caller holds mu or peer's allocator is published. */
static int grant_peer(mt_preload_t *P, int dev, int peer)
{
    mt_backend_t *pb = P->dev[peer].backend, *db = NULL;
    if (P->sim || pb == NULL)
        return 0;
    int rc = mt_backend_get_device(pb, dev, &db);
    return rc == 0 ? mt_backend_enable_peer_access(db, peer) : rc;
}

int mt__preload_peer_access(int dev, int peer)
{
    mt_preload_t *P = mt__preload();
    if (dev < 0 || peer < 0 || dev >= P->ndevices || peer >= P->ndevices || dev == peer)
        return MT_EINVAL;
    if (dev < 64 && peer < 64)
        atomic_fetch_or(&peer_mask[dev], (uint64_t)1 << peer);
    pthread_mutex_lock(&P->mu);
    mt__guard_enter();
    int rc = P->dev[peer].alloc != NULL ? grant_peer(P, dev, peer) : 0;
    mt__guard_leave();
    pthread_mutex_unlock(&P->mu);
    return rc;
}

int mt__preload_alloc(int device, mt_alloc_t **out)
{
    mt_preload_t *P = mt__preload();
    if (P->init_rc != 0)
        return P->init_rc;
    if (device < 0 || device >= P->ndevices)
        return MT_ENODEV;
    mt_alloc_t *a = atomic_load_explicit(&P->ready[device], memory_order_acquire);
    if (a == NULL) {
        pthread_mutex_lock(&P->mu);
        int rc = 0;
        bool made = false;
        if (P->dev[device].alloc == NULL) {
            mt__guard_enter();
            rc = create_device(P, device);
            mt__guard_leave();
            made = rc == 0;
        }
        a = P->dev[device].alloc;
        pthread_mutex_unlock(&P->mu);
        if (rc != 0)
            return rc;
        if (made && a != NULL)
            mt__preload_marks_flush(a); /* the marks made before any allocator */
    }
    *out = a;
    return 0;
}

/* Device d's managed allocator over its backend (made), with the drop-in's config and
 * managed segments: plain ones, since expandable segments cannot be managed. Caller
 * holds mu. */
static int create_managed(mt_preload_t *P, int d)
{
    mt_alloc_cfg_t acfg = P->acfg;
    acfg.backend = P->dev[d].backend;
    acfg.sink = &P->sink;
    acfg.managed_memory = true;
    acfg.expandable_segments = false;
    int rc = mt_alloc_create(&P->managed[d], &acfg);
    if (rc != 0) {
        mt__preload_say(MT_LOG_ERROR,
                        "no managed allocator on device %d (%s): managed memory "
                        "goes to the driver",
                        d, mt_strerror(rc));
        return rc;
    }
    rc = mt_alloc_add_oom_observer(P->managed[d], mt__preload_oom_observer, NULL);
    for (int i = 0; i < atomic_load(&P->ntags_user) && rc == 0; i++) {
        int got = -1;
        rc = mt_alloc_tag_register(P->managed[d], P->tag_names[MT_TAG_USER_FIRST + i], &got);
        if (rc == 0 && got != MT_TAG_USER_FIRST + i)
            rc = MT_EPROTO;
    }
    if (rc != 0) {
        mt_alloc_destroy(&P->managed[d]);
        return rc;
    }
    atomic_store_explicit(&P->mready[d], P->managed[d], memory_order_release);
    return 0;
}

int mt__preload_managed_alloc(int device, mt_alloc_t **out)
{
    mt_preload_t *P = mt__preload();
    mt_alloc_t *own = NULL;
    int rc = mt__preload_alloc(device, &own); /* the backend first */
    if (rc != 0 || P->acfg.managed_memory) {
        *out = own;
        return rc;
    }
    mt_alloc_t *a = atomic_load_explicit(&P->mready[device], memory_order_acquire);
    if (a == NULL) {
        pthread_mutex_lock(&P->mu);
        if (P->managed[device] == NULL && P->dev[device].backend != NULL) {
            mt__guard_enter();
            rc = create_managed(P, device);
            mt__guard_leave();
        }
        a = P->managed[device];
        pthread_mutex_unlock(&P->mu);
        if (rc == 0 && a == NULL)
            rc = MT_ENODEV; /* the device was dropped meanwhile */
        if (rc != 0)
            return rc;
    }
    *out = a;
    return 0;
}

/* Forgets device d's allocator and backend, freeing what they hold while the device's
 * context still exists; the next request makes new ones. CUDA requires that no other
 * thread use the device during a reset, and the drop-in relies on it. */
void mt__preload_drop_device(int d)
{
    mt_preload_t *P = mt__preload();
    if (d < 0 || d >= P->ndevices)
        return;
    pthread_mutex_lock(&P->mu);
    mt_alloc_t *a = P->dev[d].alloc;
    mt_alloc_t *m = P->managed[d];
    mt_backend_t *b = P->dev[d].backend;
    atomic_store_explicit(&P->ready[d], NULL, memory_order_release);
    atomic_store_explicit(&P->mready[d], NULL, memory_order_release);
    P->dev[d].alloc = NULL;
    P->managed[d] = NULL;
    if (P->sim)
        b = NULL; /* the group's: kept (see create_device) */
    else
        P->dev[d].backend = NULL;
    pthread_mutex_unlock(&P->mu);
    if (m != NULL) { /* before the backend it allocates from */
        mt__guard_enter();
        mt_alloc_emit(m, MT_EV_STATS, 0, 0, MT_TAG_OTHER);
        mt_alloc_destroy(&m);
        mt__guard_leave();
    }
    if (a == NULL)
        return;
    /* What libraries took outside the allocator dies with the device too (on sim the
     * backend stays, so it is freed there as the driver's reset would). */
    mt__preload_outside_drop(d, a, P->sim ? P->dev[d].backend : NULL);
    mt__preload_graph_forget(a); /* blocks kept for captured graphs die with the device */
    mt__guard_enter();
    mt_alloc_stats_t st;
    if (mt_alloc_stats(a, &st) == 0) {
        pthread_mutex_lock(&P->mu);
        P->gone.allocation[0].allocated += st.allocation[0].allocated;
        P->gone.allocation[0].freed += st.allocation[0].freed;
        P->gone.num_device_alloc += st.num_device_alloc;
        P->gone.num_device_free += st.num_device_free;
        P->gone.num_ooms += st.num_ooms;
        P->gone.num_alloc_retries += st.num_alloc_retries;
        pthread_mutex_unlock(&P->mu);
    }
    mt_alloc_emit(a, MT_EV_STATS, 0, 0, MT_TAG_OTHER);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    mt__guard_leave();
}

static bool release(int from, int to)
{
    mt_preload_t *P = mt__preload();
    bool any = false;
    for (int d = from; d < to; d++) {
        mt_alloc_t *a = mt__preload_nth(P, d);
        mt_alloc_stats_t before, after;
        if (a == NULL || mt_alloc_stats(a, &before) != 0)
            continue;
        mt__guard_enter();
        mt_alloc_empty_cache(a);
        mt__guard_leave();
        if (mt_alloc_stats(a, &after) == 0 &&
            after.reserved_bytes[0].current < before.reserved_bytes[0].current)
            any = true;
    }
    return any;
}

bool mt__preload_release_cached(void)
{
    return release(0, 2 * mt__preload()->ndevices);
}

bool mt__preload_release_managed(void)
{
    return release(mt__preload()->ndevices, 2 * mt__preload()->ndevices);
}

/* ---- stream capture (see preload.h) ---- */

typedef int CUresult_t; /* the driver's result, without its headers here */

int mt__preload_capture_graph(void *handle, void **graph)
{
    *graph = NULL;
    mt_preload_t *P = mt__preload();
    if (P->sim || handle == NULL || (uintptr_t)handle == 1) /* the legacy stream: never */
        return 0;
    /* cuStreamGetCaptureInfo_v3 (12.3+), else _v2 (11.3+): both give the graph. */
    typedef CUresult_t (*info3_fn)(void *, int *, unsigned long long *, void **, const void **,
                                   const void **, size_t *);
    typedef CUresult_t (*info2_fn)(void *, int *, unsigned long long *, void **, const void **,
                                   size_t *);
    static _Atomic(void *) info3, info2;
    static _Atomic bool looked;
    if (!atomic_load_explicit(&looked, memory_order_acquire)) {
        atomic_store(&info3, mt__preload_real_drv("cuStreamGetCaptureInfo_v3"));
        atomic_store(&info2, mt__preload_real_drv("cuStreamGetCaptureInfo_v2"));
        atomic_store_explicit(&looked, true, memory_order_release);
    }
    info3_fn f3 = (info3_fn)atomic_load(&info3);
    info2_fn f2 = (info2_fn)atomic_load(&info2);
    int st = 0;
    unsigned long long id = 0;
    CUresult_t r = f3   ? f3(handle, &st, &id, graph, NULL, NULL, NULL)
                   : f2 ? f2(handle, &st, &id, graph, NULL, NULL)
                        : -1;
    if (r != 0) /* no capture API, or no answer: nothing is being captured we know of */
        st = 0;
    if (st == 0)
        *graph = NULL;
    return st != 0;
}

int mt__preload_alloc_of(const void *ptr, mt_alloc_t **out)
{
    mt_preload_t *P = mt__preload();
    for (int d = 0; d < 2 * P->ndevices; d++) {
        mt_alloc_t *a = mt__preload_nth(P, d);
        if (a != NULL && mt_alloc_block_info(a, ptr, NULL, NULL, NULL) == 0) {
            *out = a;
            return 0;
        }
    }
    return MT_ENOENT;
}

bool mt__preload_held(const void *ptr)
{
    mt_preload_t *P = mt__preload();
    uintptr_t x = (uintptr_t)ptr;
    bool held = false;
    for (int d = 0; d < 2 * P->ndevices && !held; d++) {
        mt_alloc_t *a = mt__preload_nth(P, d);
        mt_alloc_snapshot_t *snap = NULL;
        if (a == NULL || mt_alloc_snapshot(a, &snap) != 0)
            continue;
        for (size_t i = 0; i < snap->nsegments && !held; i++)
            held =
                x >= snap->segments[i].addr && x - snap->segments[i].addr < snap->segments[i].size;
        mt_alloc_snapshot_free(&snap);
    }
    return held;
}

int mt__preload_host_free(void *ptr)
{
    mt_preload_t *P = mt__preload();
    int rc = P->init_rc != 0 ? P->init_rc : MT_ENOENT;
    for (int d = 0; d < P->ndevices && rc == MT_ENOENT; d++) {
        mt_alloc_t *a = atomic_load_explicit(&P->ready[d], memory_order_acquire);
        if (a != NULL)
            rc = mt_backend_host_free(mt_alloc_backend(a), ptr);
    }
    return rc;
}

int mt__preload_stream(mt_backend_t *b, void *handle, mt_stream_t **out)
{
    mt_preload_t *P = mt__preload();
    if (P->sim) {
        /* cudaStreamLegacy (1) and cudaStreamPerThread (2) are the default stream too. */
        *out = (uintptr_t)handle <= 2 ? NULL : (mt_stream_t *)handle;
        return 0;
    }
#if MT_HAVE_CUDA_BACKEND
    if ((uintptr_t)handle == 1) { /* CU_STREAM_LEGACY: the NULL stream by another name */
        *out = NULL;
        return 0;
    }
    return mt__cuda_stream_wrap(b, (uintptr_t)handle, out);
#else
    (void)b;
    *out = NULL;
    return MT_ENODEV;
#endif
}

void mt__preload_stream_forget(void *handle)
{
#if MT_HAVE_CUDA_BACKEND
    mt_preload_t *P = mt__preload();
    for (int d = 0; d < P->ndevices; d++) {
        mt_alloc_t *a = atomic_load_explicit(&P->ready[d], memory_order_acquire);
        if (a != NULL)
            mt__cuda_stream_forget(mt_alloc_backend(a), (uintptr_t)handle);
    }
#else
    (void)handle;
#endif
}

int mt__preload_driver_result(void)
{
#if MT_HAVE_CUDA_BACKEND
    return mt__cuda_last_result();
#else
    return 0;
#endif
}

void mt__preload_note_oom(mt_alloc_t *a, size_t size)
{
    mt_preload_t *P = mt__preload();
    atomic_fetch_add(&P->ooms, 1);
    pthread_mutex_lock(&P->oom_mu);
    const char *m = a ? mt_alloc_last_error(a) : "";
    if (m == NULL || *m == '\0')
        snprintf(P->oom_msg, sizeof P->oom_msg, "out of memory allocating %zu bytes", size);
    else
        snprintf(P->oom_msg, sizeof P->oom_msg, "%s", m);
    if (m == NULL || *m == '\0') /* otherwise the allocator logged it already */
        mt__preload_say(MT_LOG_ERROR, "%s", P->oom_msg);
    pthread_mutex_unlock(&P->oom_mu);
}

/* ---- stream-ordered blocks ---- */

/* The blocks handed out by cudaMallocAsync/cuMemAllocAsync and not yet freed: a set of
 * addresses in util's address table (the value is unused). Their cudaFree/cuMemFree
 * synchronises nothing, as CUDA documents. ordered_n mirrors ordered.n so a free of any
 * other block need not take the lock. */
static pthread_mutex_t ordered_mu = PTHREAD_MUTEX_INITIALIZER;
static mt__amap_t ordered;       /* under ordered_mu */
static _Atomic size_t ordered_n; /* entries in use */

void mt__preload_ordered_add(const void *ptr)
{
    pthread_mutex_lock(&ordered_mu);
    /* if the set cannot grow, its free synchronises */
    (void)mt__amap_put(&ordered, (uint64_t)(uintptr_t)ptr, 1);
    atomic_store(&ordered_n, ordered.n);
    pthread_mutex_unlock(&ordered_mu);
}

bool mt__preload_ordered_take(const void *ptr)
{
    if (atomic_load(&ordered_n) == 0)
        return false;
    pthread_mutex_lock(&ordered_mu);
    bool was = mt__amap_del(&ordered, (uint64_t)(uintptr_t)ptr) == 0;
    atomic_store(&ordered_n, ordered.n);
    pthread_mutex_unlock(&ordered_mu);
    return was;
}

/* ---- fork ---- */

/* The child of a fork inherits the allocators but not the device state behind them (the
 * driver refuses a fork child's calls): it drops them without a call, so its first
 * request makes a new allocator, which gets the driver's own answer (on sim, a new
 * device). Nothing of the parent's is handed out or written (summary, telemetry). */
static void fork_prepare(void)
{
    pthread_mutex_lock(&mt_preload_ctx.mu);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&mt_preload_ctx.mu);
}

static void fork_child(void)
{
    mt_preload_t *P = &mt_preload_ctx;
    pthread_mutex_init(&P->mu, NULL);
    pthread_mutex_init(&P->oom_mu, NULL);
    pthread_mutex_init(&ordered_mu, NULL);
    mt__preload_marks_fork_child();
    mt__preload_outside_fork_child();
    ordered = (mt__amap_t){0}; /* the parent's addresses mean nothing here */
    atomic_store(&ordered_n, 0);
    for (int d = 0; d < P->ndevices; d++) {
        atomic_store(&P->ready[d], NULL);
        atomic_store(&P->mready[d], NULL);
        P->dev[d].alloc = NULL; /* the parent's: unusable here, so left as they are */
        P->managed[d] = NULL;
        P->dev[d].backend = NULL;
    }
    atomic_store(&P->prof_live, false);
    P->prof = NULL;
    P->summary_path = NULL;
}

/* ---- one-time set-up ---- */

static void init_once(void)
{
    mt_preload_t *P = &mt_preload_ctx;
    mt__guard_enter();
    P->log_level = parse_level(getenv("MEMTRACE_LOG_LEVEL"));
    P->summary_path = getenv("MEMTRACE_SUMMARY_FILE");
    P->sink = (mt_event_sink_t){.emit = sink_emit,
                                .emit_n = sink_emit_n,
                                .stack = sink_stack,
                                .claim = sink_claim,
                                .write = sink_write,
                                .write_batch = sink_write_batch,
                                .source = sink_source,
                                .ud = P};

    P->bcfg = mt_backend_cfg_default();
    P->bcfg.log = log_cb;
    char err[256] = "";
    if (mt_backend_cfg_from_env(&P->bcfg, err, sizeof err) != 0)
        mt__preload_say(MT_LOG_ERROR, "%s: ignored", err);
    P->acfg = mt_alloc_cfg_default();
    P->acfg.log = log_cb;
    if (mt_alloc_cfg_from_env(&P->acfg, err, sizeof err) != 0)
        mt__preload_say(MT_LOG_ERROR, "MEMTRACE_ALLOC_CONF ignored: %s", err);

    /* The profiler first, so the allocators' first events (config) reach it. */
    mt_prof_cfg_t pcfg = mt_prof_cfg_default();
    pcfg.log = log_cb;
    if (mt_prof_cfg_from_env(&pcfg) != 0)
        mt__preload_say(MT_LOG_WARN, "MEMTRACE_PROF (auto|daemon|log|off), MEMTRACE_PROF_LOSSLESS "
                                     "(1|on|0|off) or MEMTRACE_LOG_FORMAT (ndjson|binary) ignored");
    char serr[128];
    if (mt_prof_stacks_from_env(&pcfg, serr, sizeof serr) != 0)
        mt__preload_say(MT_LOG_WARN, "%s; call stacks stay sampled", serr);
    if (mt_prof_create(&P->prof, &pcfg) == 0)
        atomic_store(&P->prof_live, true);
    else
        mt__preload_say(MT_LOG_WARN, "profiler not started: events are only counted");

    /* The libcuda.so.1 that memtrace run provides on driverless machines is this very
     * library (see cmd_run.c): it is no driver, so auto means sim here. */
    if (P->bcfg.kind != MT_BACKEND_SIM && driver_is_us()) {
        if (P->bcfg.kind == MT_BACKEND_CUDA) {
            P->init_rc = MT_ENODEV;
            mt__preload_say(MT_LOG_ERROR, "MEMTRACE_BACKEND=cuda but no CUDA driver exists");
            goto done;
        }
        P->bcfg.kind = MT_BACKEND_SIM;
        mt__preload_say(MT_LOG_INFO, "no CUDA driver on this machine; running on the sim "
                                     "backend");
    }
    /* cuda mode when a driver answers with devices. No device is touched here: a context
     * is made on a device only when memory is first asked of it, never
     * because a symbol was looked up. */
    if (P->bcfg.kind != MT_BACKEND_SIM) {
        const char *path = getenv("MEMTRACE_LIBCUDA");
        P->libcuda = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        int (*init)(unsigned) = (int (*)(unsigned))mt__preload_real_dlsym(P->libcuda, "cuInit");
        int (*count)(int *) =
            (int (*)(int *))mt__preload_real_dlsym(P->libcuda, "cuDeviceGetCount");
        int n = 0;
        if (P->libcuda != NULL && init != NULL && count != NULL && init(0) == 0 && count(&n) == 0 &&
            n > 0) {
            if (n > MT_PRELOAD_MAX_DEVICES)
                mt__preload_say(MT_LOG_ERROR, "%d CUDA devices; memtrace serves the first %d", n,
                                MT_PRELOAD_MAX_DEVICES);
            P->ndevices = n < MT_PRELOAD_MAX_DEVICES ? n : MT_PRELOAD_MAX_DEVICES;
            P->bcfg.kind = MT_BACKEND_CUDA;
            /* Peer access the program enables goes to the real runtime unseen: open
             * every mapping to the devices that can reach it instead. */
            P->interposed = hooks_interposed();
            if (P->bcfg.cuda_peer_access == MT_CUDA_PEER_AUTO && !P->interposed) {
                P->bcfg.cuda_peer_access = MT_CUDA_PEER_CAPABLE;
                mt__preload_say(MT_LOG_INFO,
                                "the runtime's peer calls do not reach memtrace (no drop-in): "
                                "memory is opened to every peer-capable device "
                                "(MEMTRACE_CUDA_PEER_ACCESS=enabled declines)");
            }
            goto done;
        }
        if (P->libcuda != NULL)
            dlclose(P->libcuda);
        P->libcuda = NULL;
        if (P->bcfg.kind == MT_BACKEND_CUDA) {
            P->init_rc = MT_ENODEV;
            mt__preload_say(MT_LOG_ERROR, "MEMTRACE_BACKEND=cuda but no CUDA device answers");
            goto done;
        }
        P->bcfg.kind = MT_BACKEND_SIM;
    }
    P->ndevices = 1;
    P->sim = true;
    P->init_rc = create_device(P, 0);
    if (P->init_rc != 0) {
        mt__preload_say(MT_LOG_ERROR, "cannot create device 0: %s", mt_strerror(P->init_rc));
        P->ndevices = 0;
    } else { /* MEMTRACE_SIM_DEVICES */
        int n = mt_backend_device_count(P->dev[0].backend);
        if (n > MT_PRELOAD_MAX_DEVICES)
            mt__preload_say(MT_LOG_ERROR, "%d sim devices; memtrace serves the first %d", n,
                            MT_PRELOAD_MAX_DEVICES);
        P->ndevices = n < MT_PRELOAD_MAX_DEVICES ? n : MT_PRELOAD_MAX_DEVICES;
    }

done:
    atexit(mt__preload_at_exit);
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    mt__guard_leave();
}

mt_preload_t *mt__preload(void)
{
    pthread_once(&mt_preload_once, init_once);
    return &mt_preload_ctx;
}
