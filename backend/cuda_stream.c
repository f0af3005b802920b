/* Streams, copies and events of the cuda backend: the program's own streams wrapped
 * (mt__cuda_stream_wrap), the backend's own created non-blocking, and event times taken
 * from an origin event that moves forward (cuda_t, at origin_ev). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "backend/backend_cuda.h"
#include "backend/cuda_internal.h"

static cuda_t *C(const mt_backend_t *b)
{
    return (cuda_t *)b;
}

static CUstream SH(const mt_stream_t *s)
{
    return s ? ((const cuda_stream_t *)s)->h : NULL;
}

/* ---- streams ---- */

int mt__cuda_stream_create(mt_backend_t *b, mt_stream_t **out)
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

void mt__cuda_stream_destroy(mt_backend_t *b, mt_stream_t *st)
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

/* ---- the threads that own per-thread stream wrappers ----
 *
 * A wrapper of the per-thread handle serves one thread, and the allocator keeps the blocks
 * freed on it in that wrapper's bins. Once its thread has exited nothing allocates on it
 * again, so they would stay cached for good. The next thread whose per-thread stream gets
 * a wrapper takes over such a wrapper instead, bins and all, after its stream has been
 * made to wait for the work the dead thread queued (see adopt). Live blocks of the dead
 * thread are untouched: they stay valid and go back to the same bins when freed.
 *
 * Invariant (under live_mu): live[0 .. nlive) are the ids of the threads that own a
 * wrapper and have not exited; each such thread has live_key set to its id, whose
 * destructor takes it out. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t live_once = PTHREAD_ONCE_INIT;
static pthread_key_t live_key;
static bool live_key_ok;
static uintptr_t *live;
static size_t nlive, live_cap;

static void thread_gone(void *v)
{
    pthread_mutex_lock(&live_mu);
    for (size_t i = 0; i < nlive; i++)
        if (live[i] == (uintptr_t)v) {
            live[i] = live[--nlive];
            break;
        }
    pthread_mutex_unlock(&live_mu);
}

static void live_init(void)
{
    live_key_ok = pthread_key_create(&live_key, thread_gone) == 0;
}

/* The key's destructor lives in this library: it must not run once the library is gone. */
__attribute__((destructor)) static void live_fini(void)
{
    if (live_key_ok)
        pthread_key_delete(live_key);
    live_key_ok = false;
}

/* Lists the calling thread as the live owner of a wrapper (once): 0, or MT_ENOMEM. Without
 * a key (live_key_ok false) no wrapper is ever taken over, and nothing is listed. */
static int live_add(uintptr_t id)
{
    pthread_once(&live_once, live_init);
    if (!live_key_ok || pthread_getspecific(live_key) != NULL)
        return 0;
    pthread_mutex_lock(&live_mu);
    bool ok = nlive < live_cap;
    if (!ok) {
        size_t cap = live_cap ? 2 * live_cap : 16;
        uintptr_t *n = realloc(live, cap * sizeof *n);
        if (n != NULL) {
            live = n;
            live_cap = cap;
            ok = true;
        }
    }
    if (ok)
        live[nlive++] = id;
    pthread_mutex_unlock(&live_mu);
    if (ok && pthread_setspecific(live_key, (void *)id) != 0) {
        thread_gone((void *)id);
        ok = false;
    }
    return ok ? 0 : MT_ENOMEM;
}

static bool is_live(uintptr_t id)
{
    pthread_mutex_lock(&live_mu);
    bool found = false;
    for (size_t i = 0; i < nlive && !found; i++)
        found = live[i] == id;
    pthread_mutex_unlock(&live_mu);
    return found;
}

/* An event recorded on the legacy stream of c's context, which completes only after the
 * work queued so far on every blocking stream (every thread's per-thread stream among
 * them, those of exited threads too); the caller waits for it and destroys it. */
static int legacy_event(cuda_t *c, CUevent *out)
{
    int rc = CALL(c, EventCreate(out, CU_EVENT_DISABLE_TIMING));
    if (rc != 0)
        return rc;
    rc = CALL(c, EventRecord(*out, CU_STREAM_LEGACY));
    if (rc != 0) {
        CALL(c, EventDestroy(*out));
        *out = NULL;
    }
    return rc;
}

/* Makes the calling thread's per-thread stream wait for everything queued so far on the
 * per-thread streams of c's context, those of exited threads among them. */
static int wait_for_dead(cuda_t *c)
{
    CUevent ev = NULL;
    int rc = legacy_event(c, &ev);
    if (rc != 0)
        return rc;
    rc = CALL(c, StreamWaitEvent(CU_STREAM_PER_THREAD, ev, 0));
    CALL(c, EventDestroy(ev)); /* released once the wait is done */
    return rc;
}

/* A per-thread wrapper whose thread has exited, taken over by the calling thread, or NULL.
 * Caller holds c->mu. */
static cuda_stream_t *adopt(cuda_t *c, uintptr_t thread)
{
    if (!live_key_ok)
        return NULL;
    for (cuda_stream_t *s = c->streams; s != NULL; s = s->next) {
        if ((uintptr_t)s->h != (uintptr_t)CU_STREAM_PER_THREAD || s->retired || is_live(s->thread))
            continue;
        if (live_add(thread) != 0 || wait_for_dead(c) != 0)
            return NULL; /* a new wrapper then; this one waits for another thread */
        s->thread = thread;
        return s;
    }
    return NULL;
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
    bool per_thread = handle == (uintptr_t)CU_STREAM_PER_THREAD;
    uintptr_t thread = per_thread ? thread_id() : 0;
    pthread_mutex_lock(&c->mu);
    cuda_stream_t *s = c->streams;
    while (s != NULL && ((uintptr_t)s->h != handle || s->thread != thread || s->retired))
        s = s->next;
    if (s == NULL && per_thread)
        s = adopt(c, thread);
    /* A thread not listed live would have its wrapper taken over while it runs. */
    if (s == NULL && (!per_thread || live_add(thread) == 0) && (s = calloc(1, sizeof *s)) != NULL) {
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

bool mt__cuda_stream_is_of(mt_backend_t *b, const mt_stream_t *s)
{
    if (s == NULL || !mt__cuda_is_cuda(b))
        return false;
    cuda_t *c = C(b);
    bool found = false;
    pthread_mutex_lock(&c->mu);
    for (const cuda_stream_t *w = c->streams; w != NULL && !found; w = w->next)
        found = &w->base == s;
    pthread_mutex_unlock(&c->mu);
    return found;
}

/* True when s is another thread's per-thread stream, which its handle cannot name here:
 * the per-thread handle names the calling thread's own. */
static bool foreign(const mt_stream_t *s)
{
    const cuda_stream_t *cs = (const cuda_stream_t *)s;
    return cs != NULL && cs->thread != 0 && cs->thread != thread_id();
}

/* Another thread's per-thread stream: an event recorded on the legacy stream completes
 * after the work queued so far on every blocking stream, that one included. */
int mt__cuda_stream_synchronize(mt_backend_t *b, mt_stream_t *s)
{
    cuda_t *c = C(b);
    if (!foreign(s))
        return CALL(c, StreamSynchronize(SH(s)));
    CUevent ev = NULL;
    int rc = legacy_event(c, &ev);
    if (rc != 0)
        return rc;
    rc = CALL(c, EventSynchronize(ev));
    CALL(c, EventDestroy(ev));
    return rc;
}

/* The stream work for s is queued on (events, waits, host functions, copies, memsets).
 * The per-thread handle names the calling thread's stream, so for another thread's
 * per-thread stream it is the legacy stream: per-thread streams are blocking, so legacy
 * work runs only after the work queued so far on every one of them, that thread's
 * included. Conservative: it also waits for the other blocking streams. */
static CUstream record_target(const mt_stream_t *s)
{
    return foreign(s) ? CU_STREAM_LEGACY : SH(s);
}

/* Another thread's per-thread stream: the legacy stream waits, and every blocking stream,
 * that one included, waits for the legacy stream's work before its later work (CUDA's
 * legacy default stream semantics: cuStreamWaitEvent on it counts as its work). */
int mt__cuda_stream_wait_event(mt_backend_t *b, mt_stream_t *s, mt_event_t *ev)
{
    if (!ev->recorded)
        return 0;
    return CALL(C(b), StreamWaitEvent(record_target(s), ev->h, 0));
}

int mt__cuda_launch_host_func(mt_backend_t *b, mt_stream_t *s, void (*fn)(void *), void *ud)
{
    return CALL(C(b), LaunchHostFunc(record_target(s), fn, ud));
}

/* With unified addressing (every 64-bit platform CUDA supports), cuMemcpyAsync infers
 * the direction from the pointers, so the kind only matters for argument checks. */
int mt__cuda_memcpy_async(mt_backend_t *b, void *dst, const void *src, size_t n,
                          mt_memcpy_kind_e kind, mt_stream_t *s)
{
    (void)kind;
    return CALL(C(b), MemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n,
                                  record_target(s)));
}

int mt__cuda_memset_async(mt_backend_t *b, void *dst, int value, size_t n, mt_stream_t *s)
{
    return CALL(C(b), MemsetD8Async((CUdeviceptr)(uintptr_t)dst, (unsigned char)value, n,
                                    record_target(s)));
}

int mt__cuda_device_synchronize(mt_backend_t *b)
{
    return CALL(C(b), CtxSynchronize());
}

/* cuMemcpyPeerAsync on b's stream s, between the two devices' primary contexts. The
 * copy's time is the driver's, not modelled: peer_ns stays 0 on cuda. */
int mt__cuda_memcpy_peer_async(mt_backend_t *b, void *dst, int dst_device, const void *src,
                               int src_device, size_t n, mt_stream_t *s)
{
    cuda_t *c = C(b);
    mt_backend_t *db = mt__cuda_get_device(b, dst_device), *sb = mt__cuda_get_device(b, src_device);
    if (db == NULL || sb == NULL)
        return MT_ENODEV;
    int rc = CALL(c, MemcpyPeerAsync((CUdeviceptr)(uintptr_t)dst, C(db)->ctx,
                                     (CUdeviceptr)(uintptr_t)src, C(sb)->ctx, n, record_target(s)));
    if (rc == 0)
        mt__backend_add_peer(b, n, 0);
    return rc;
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

int mt__cuda_event_create(mt_backend_t *b, mt_event_t **out)
{
    return event_new(b, false, out);
}

int mt__cuda_event_create_timed(mt_backend_t *b, mt_event_t **out)
{
    return event_new(b, true, out);
}

void mt__cuda_event_destroy(mt_backend_t *b, mt_event_t *ev)
{
    CALL(C(b), EventDestroy(ev->h));
    free(ev);
}

int mt__cuda_event_record(mt_backend_t *b, mt_event_t *ev, mt_stream_t *s)
{
    int rc = CALL(C(b), EventRecord(ev->h, record_target(s)));
    if (rc == 0)
        ev->recorded = true;
    return rc;
}

int mt__cuda_event_query(mt_backend_t *b, mt_event_t *ev)
{
    return ev->recorded ? CALL(C(b), EventQuery(ev->h)) : 0;
}

int mt__cuda_event_synchronize(mt_backend_t *b, mt_event_t *ev)
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

uint64_t mt__cuda_event_time_ns(mt_backend_t *b, mt_event_t *ev)
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
