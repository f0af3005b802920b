/* Stream capture and graphs (cuda mode): each capture's allocations come from a private
 * pool of the device's allocator (mt_pool_*, docs/allocator-pools.md).
 *
 * A captured graph replays into the addresses its capture used, including those of blocks
 * the capture freed before it ended. So from the start of a capture (cudaStreamBeginCapture,
 * its _ptsz and ToGraph forms, the driver's) to its end the capturing stream is routed to a
 * pool made for that capture (the hooks are in hooks_capture.c): what the capture allocates through
 * memtrace (PyTorch's pluggable allocator, memtrace_alloc) and frees goes back to that pool only,
 * never to eager requests. The pool lives as long as the graph or any executable graph instantiated
 * from it: PyTorch destroys its cudaGraph_t right after instantiating and keeps only the
 * exec. When the last of them is destroyed the pool is released; while the program still
 * holds blocks of it (a graph's static outputs) it is kept, retired, and released at a
 * later graph event once they are freed.
 *
 * Eager blocks the capture uses (memtrace_record_stream on the capturing stream) are the
 * capture's too once freed: an event recorded on the capturing stream would be a node of
 * the graph, which no host query may wait for, and would say nothing about the replays.
 * So no event is recorded; a free of such a block, during the capture or after it, keeps
 * the block with the capture, and it goes back to the cache when the pool goes, after a
 * device synchronisation (no capture may be under way then).
 *
 * Stream-ordered allocations on a capturing stream (cudaMallocAsync) still go to the
 * driver as graph allocation nodes (hooks_runtime.c); these hooks do not change them.
 * On sim there is no capture: the calls report cudaErrorNotSupported.
 *
 * Without the hooks (torch's pluggable allocator alone, no LD_PRELOAD) no capture call
 * reaches memtrace. Two things stand in for them. torch calls the pool entry points
 * (memtrace_begin_allocate_to_pool, _end_, memtrace_release_pool: api.c) around each
 * capture and when the graph is reset: begin makes (or, for a shared pool, reuses) a pool
 * under torch's id, which the next capture on that device takes; release drops torch's
 * use of it. And a request or a stream use on a stream the driver says is capturing
 * (cuStreamGetCaptureInfo) binds that capture to the pool torch armed, or to a new pool of
 * its own, which is then kept for good (nothing says when its graph goes); its end is
 * found the same way, at the stream's next request or the next graph event. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/backend_cuda.h"
#include "preload/hooks_graph.h"
#include "util/assert.h"
#include "util/grow.h"
#include "preload/hooks_cuda.h"
#undef FORWARD
#include "preload/hooks_rt.h"
#undef FORWARD

/* ---- captures and their pools ---- */

/* A block of the general cache the capture used (memtrace_record_stream on its stream). */
typedef struct use_s {
    void *ptr;
    bool freed; /* the program freed it: kept here until the capture is released */
} use_t;

/* One capture's pool (torch's pool, for a pool torch named: each capture into it).
 * Invariants: capturing => handle != NULL and the stream is routed to pool;
 * refs = (graph != NULL) + number of execs naming it; torch_uses > 0 or armed => torch;
 * pinned => detected && !torch; retired <=> !capturing && refs = 0 && torch_uses = 0 &&
 * !armed && !pinned: at the next graph event with no capture under way its kept blocks go
 * back to the cache, and its pool is released if no block of it is live;
 * uses[0..nuses) name distinct blocks of alloc; a block freed by the program is freed in
 * the uses of every capture naming it, and the last of them released returns it. */
typedef struct capture_s {
    struct capture_s *next;
    mt_alloc_t *alloc;   /* borrowed: the device's allocator (forgotten when it goes) */
    mt_stream_t *stream; /* the capturing stream's wrapper */
    void *handle;        /* the program's stream while capturing, else NULL */
    void *graph;         /* the captured graph until destroyed, else NULL */
    use_t *uses;         /* owned */
    size_t nuses, cap_uses;
    void *seen_graph;     /* the graph the driver said the stream captures into, or NULL */
    uint64_t torch_id[2]; /* torch: its MempoolId_t */
    uint32_t pool;        /* mt_pool_create's id */
    unsigned refs;
    unsigned torch_uses; /* torch: beginAllocateToPool calls not yet released (releasePool) */
    bool capturing;
    bool torch;    /* made by memtrace_begin_allocate_to_pool */
    bool armed;    /* torch: between begin and end of allocate-to-pool; the next capture on
                      its allocator that no hook saw otherwise routed binds to it */
    bool detected; /* the capture under way was found by asking the driver, not by a hook */
    bool pinned;   /* its graph's end cannot be seen: kept until the allocator goes */
} capture_t;

/* An executable graph instantiated from a capture's graph. */
typedef struct exec_s {
    struct exec_s *next;
    void *exec;
    capture_t *cap;
} exec_t;

static pthread_mutex_t graph_mu = PTHREAD_MUTEX_INITIALIZER;
static capture_t *captures; /* under graph_mu */
static exec_t *execs;       /* under graph_mu */
/* Captures under way, and uses recorded in all captures: lets the hot paths skip graph_mu
 * when both are 0 (written under graph_mu). */
static _Atomic unsigned n_capturing;
static _Atomic size_t n_uses;

static void capture_free(capture_t *c)
{
    atomic_fetch_sub(&n_uses, c->nuses);
    free(c->uses);
    free(c);
}

static bool has_kept(const capture_t *c)
{
    for (size_t i = 0; i < c->nuses; i++)
        if (c->uses[i].freed)
            return true;
    return false;
}

/* Whether a capture other than c keeps or uses ptr (graph_mu held). */
static bool used_elsewhere(const capture_t *c, const void *ptr)
{
    for (const capture_t *o = captures; o != NULL; o = o->next)
        for (size_t i = 0; o != c && o->alloc == c->alloc && i < o->nuses; i++)
            if (o->uses[i].ptr == ptr)
                return true;
    return false;
}

/* Gives c's kept blocks back to the cache, once the device has finished every replay
 * (graph_mu held, no capture under way: the synchronisation would break it). A block
 * another capture's graph also uses stays, that capture's to return. */
static void return_kept(capture_t *c)
{
    bool any = has_kept(c);
    mt__guard_enter();
    if (any)
        (void)mt_device_synchronize(mt_alloc_backend(c->alloc));
    for (size_t i = 0; i < c->nuses; i++)
        if (c->uses[i].freed && !used_elsewhere(c, c->uses[i].ptr))
            (void)mt_alloc_free(c->alloc, c->uses[i].ptr);
    mt__guard_leave();
    atomic_fetch_sub(&n_uses, c->nuses);
    c->nuses = 0;
}

/* The capture under way on handle whose stream wrapper (the calling thread's, for the
 * per-thread stream) is that capture's, or NULL (graph_mu held). */
static capture_t *capturing_on(void *handle)
{
    for (capture_t *c = captures; c != NULL; c = c->next) {
        if (!c->capturing || c->handle != handle)
            continue;
        if ((uintptr_t)handle != (uintptr_t)CU_STREAM_PER_THREAD)
            return c;
        mt_stream_t *w = NULL;
        mt__guard_enter();
        int rc = mt__preload_stream(mt_alloc_backend(c->alloc), handle, &w);
        mt__guard_leave();
        if (rc == 0 && w == c->stream)
            return c;
    }
    return NULL;
}

static void refresh_detected(void);

/* Returns the kept blocks of retired captures and releases the pools whose blocks are all
 * free (graph_mu held). Never while a capture is under way: cuMemFree and the device
 * synchronisation would break a global one; the next graph event after it does it. */
static void release_retired(void)
{
    refresh_detected();
    if (atomic_load(&n_capturing) > 0)
        return;
    for (capture_t **pp = &captures; *pp != NULL;) {
        capture_t *c = *pp;
        if (c->capturing || c->refs > 0 || c->torch_uses > 0 || c->armed || c->pinned) {
            pp = &c->next;
            continue;
        }
        if (c->nuses > 0)
            return_kept(c);
        mt__guard_enter();
        int rc = mt_pool_release(c->alloc, c->pool);
        mt__guard_leave();
        if (rc == MT_EBUSY) { /* the program still holds some of its blocks */
            mt__preload_say(MT_LOG_DEBUG, "graph pool %u kept: blocks of it are live", c->pool);
            pp = &c->next;
            continue;
        }
        mt__preload_say(MT_LOG_DEBUG, "graph pool %u released (%s)", c->pool, mt_strerror(rc));
        *pp = c->next;
        capture_free(c);
    }
}

/* Whether the driver says handle is capturing now; *graph: the graph it captures into. The
 * legacy stream never captures. */
static bool capturing_now(void *handle, void **graph)
{
    *graph = NULL;
    if (handle == NULL || (uintptr_t)handle == (uintptr_t)CU_STREAM_LEGACY)
        return false;
    return mt__preload_capture_graph(handle, graph) != 0;
}

/* Routes s (the program's handle) to c's pool: c's capture is under way (graph_mu held). */
static int bind(capture_t *c, mt_stream_t *s, void *handle)
{
    mt__guard_enter();
    int rc = mt_pool_begin(c->alloc, c->pool, s);
    mt__guard_leave();
    if (rc != 0)
        return rc;
    c->stream = s;
    c->handle = handle;
    c->capturing = true;
    atomic_fetch_add(&n_capturing, 1);
    mt__preload_say(MT_LOG_DEBUG, "stream capture on %p: allocations go to pool %u", handle,
                    c->pool);
    return 0;
}

/* Ends the routing of c's stream: its capture is over (graph_mu held). */
static void unbind(capture_t *c)
{
    mt__guard_enter();
    (void)mt_pool_end(c->alloc, c->pool, c->stream);
    mt__guard_leave();
    c->capturing = false;
    c->handle = NULL;
    atomic_fetch_sub(&n_capturing, 1);
}

/* A capture on s (handle) of allocator a is under way: the capture routing s, else a pool
 * torch armed on a, else a new pool. NULL when none could be had: the capture then takes
 * eager blocks, as before (graph_mu held). */
static capture_t *begin_on(mt_alloc_t *a, mt_stream_t *s, void *handle)
{
    capture_t *c = captures;
    while (c != NULL && !(c->capturing && c->alloc == a && c->stream == s))
        c = c->next;
    if (c != NULL)
        return c;
    for (c = captures; c != NULL; c = c->next)
        if (c->alloc == a && c->armed && !c->capturing)
            return bind(c, s, handle) == 0 ? c : NULL;
    c = calloc(1, sizeof *c);
    uint32_t id = 0;
    mt__guard_enter();
    int rc = c == NULL ? MT_ENOMEM : mt_pool_create(a, &id);
    mt__guard_leave();
    if (rc == 0) {
        *c = (capture_t){.alloc = a, .pool = id};
        if ((rc = bind(c, s, handle)) != 0) {
            mt__guard_enter();
            (void)mt_pool_release(a, id);
            mt__guard_leave();
        }
    }
    if (rc != 0) {
        mt__preload_say(MT_LOG_WARN, "stream capture without a private pool: %s", mt_strerror(rc));
        free(c);
        return NULL;
    }
    c->next = captures;
    captures = c;
    return c;
}

/* A capture began on handle (the runtime or driver said so). */
void mt__preload_graph_begun(void *handle, int device)
{
    mt_alloc_t *a = NULL;
    mt_stream_t *s = NULL;
    if (device < 0 || mt__preload_alloc(device, &a) != 0)
        return; /* served as before: the capture then takes eager blocks */
    mt__guard_enter();
    int rc = mt__preload_stream(mt_alloc_backend(a), handle, &s);
    mt__guard_leave();
    if (rc != 0) {
        mt__preload_say(MT_LOG_WARN, "stream capture without a private pool: %s", mt_strerror(rc));
        return;
    }
    pthread_mutex_lock(&graph_mu);
    capture_t *c = begin_on(a, s, handle);
    if (c != NULL) {
        c->detected = false; /* the end hook will say when it ends */
        (void)capturing_now(handle, &c->seen_graph);
    }
    release_retired();
    pthread_mutex_unlock(&graph_mu);
}

/* ---- captures no hook saw (pluggable allocator without LD_PRELOAD) ---- */

/* Ends the detected captures the driver says are over (graph_mu held). The per-thread
 * handle names the calling thread's stream, so such a capture is asked about only by
 * its stream's next request. */
static void refresh_detected(void)
{
    for (capture_t *c = captures; c != NULL; c = c->next) {
        void *g = NULL;
        if (!c->capturing || !c->detected ||
            (uintptr_t)c->handle == (uintptr_t)CU_STREAM_PER_THREAD)
            continue;
        if (!capturing_now(c->handle, &g) || g != c->seen_graph)
            unbind(c);
    }
}

/* The capture s (the program's handle, a stream of allocator a) serves now, found by
 * asking the driver when no hook told (graph_mu held); NULL when s is not capturing. A
 * routing whose capture the driver says is over ends here. */
static capture_t *current(mt_alloc_t *a, mt_stream_t *s, void *handle)
{
    capture_t *c = captures;
    while (c != NULL && !(c->capturing && c->alloc == a && c->stream == s))
        c = c->next;
    if (c != NULL && !c->detected)
        return c;
    void *g = NULL;
    bool now = capturing_now(handle, &g);
    if (c != NULL && now && g == c->seen_graph)
        return c;
    if (c != NULL)
        unbind(c);
    if (!now)
        return NULL;
    /* Another stream joined into a capture under way (fork and join through events): its
     * requests are served as before, eager; a pool of its own would outlive the graph. */
    for (capture_t *o = captures; o != NULL; o = o->next)
        if (o->capturing && g != NULL && o->seen_graph == g)
            return NULL;
    c = begin_on(a, s, handle);
    if (c == NULL)
        return NULL;
    c->detected = true;
    c->seen_graph = g;
    c->pinned = !c->torch;
    return c;
}

/* The capture on handle ended with graph (NULL when it failed). */
void mt__preload_graph_ended(void *handle, void *graph)
{
    pthread_mutex_lock(&graph_mu);
    capture_t *c = capturing_on(handle);
    if (c != NULL) {
        unbind(c);
        c->graph = graph; /* a pool torch shares: the graph before it was destroyed */
        c->refs += graph != NULL;
    }
    release_retired();
    pthread_mutex_unlock(&graph_mu);
}

void mt__preload_graph_instantiated(void *graph, void *exec)
{
    exec_t *e = malloc(sizeof *e);
    pthread_mutex_lock(&graph_mu);
    capture_t *c = captures;
    while (c != NULL && (graph == NULL || c->graph != graph))
        c = c->next;
    if (c != NULL && e != NULL) {
        *e = (exec_t){.next = execs, .exec = exec, .cap = c};
        execs = e;
        c->refs++;
        e = NULL;
    }
    pthread_mutex_unlock(&graph_mu);
    free(e);
}

void mt__preload_graph_exec_gone(void *exec)
{
    pthread_mutex_lock(&graph_mu);
    for (exec_t **pp = &execs; *pp != NULL; pp = &(*pp)->next) {
        exec_t *e = *pp;
        if (e->exec != exec)
            continue;
        *pp = e->next;
        mt_assert(e->cap->refs > 0);
        e->cap->refs--;
        free(e);
        break;
    }
    release_retired();
    pthread_mutex_unlock(&graph_mu);
}

void mt__preload_graph_destroyed(void *graph)
{
    if (graph == NULL)
        return;
    pthread_mutex_lock(&graph_mu);
    for (capture_t *c = captures; c != NULL; c = c->next) {
        if (c->graph != graph)
            continue;
        mt_assert(c->refs > 0);
        c->graph = NULL;
        c->refs--;
        break;
    }
    release_retired();
    pthread_mutex_unlock(&graph_mu);
}

void mt__preload_graph_forget(mt_alloc_t *a)
{
    pthread_mutex_lock(&graph_mu);
    for (capture_t **pp = &captures; *pp != NULL;) {
        capture_t *c = *pp;
        if (c->alloc != a) {
            pp = &c->next;
            continue;
        }
        for (exec_t **ep = &execs; *ep != NULL;) {
            exec_t *e = *ep;
            if (e->cap == c) {
                *ep = e->next;
                free(e);
            } else {
                ep = &e->next;
            }
        }
        if (c->capturing)
            atomic_fetch_sub(&n_capturing, 1);
        *pp = c->next;
        capture_free(c); /* its kept blocks go with the allocator */
    }
    pthread_mutex_unlock(&graph_mu);
}

bool mt__preload_graph_use(mt_alloc_t *a, void *ptr, void *handle)
{
    void *g = NULL;
    if (handle == NULL || mt__preload()->sim ||
        (atomic_load(&n_capturing) == 0 &&
         (mt__preload()->interposed || !capturing_now(handle, &g))))
        return false;
    mt_stream_t *s = NULL;
    mt__guard_enter();
    int rc = mt__preload_stream(mt_alloc_backend(a), handle, &s);
    mt__guard_leave();
    if (rc != 0 || s == NULL)
        return false;
    pthread_mutex_lock(&graph_mu);
    capture_t *c = current(a, s, handle);
    bool mine = c != NULL;
    for (size_t i = 0; mine && i < c->nuses; i++)
        if (c->uses[i].ptr == ptr) {
            pthread_mutex_unlock(&graph_mu);
            return true;
        }
    if (mine) {
        use_t *nu = mt__grow(c->uses, &c->cap_uses, c->nuses + 1, sizeof *nu, 8);
        if (nu == NULL)
            mine = false; /* served as before: an event on the capturing stream */
        else {
            c->uses = nu;
            c->uses[c->nuses++] = (use_t){.ptr = ptr};
            atomic_fetch_add(&n_uses, 1);
        }
    }
    pthread_mutex_unlock(&graph_mu);
    return mine;
}

int mt__preload_graph_keep(mt_alloc_t *a, void *ptr)
{
    if (atomic_load(&n_uses) == 0)
        return 0;
    /* Every capture using the block keeps it: the last one released returns it. */
    bool found = false, fresh = false;
    pthread_mutex_lock(&graph_mu);
    for (capture_t *c = captures; c != NULL; c = c->next) {
        for (size_t i = 0; c->alloc == a && i < c->nuses; i++) {
            if (c->uses[i].ptr != ptr)
                continue;
            found = true;
            fresh = fresh || !c->uses[i].freed;
            c->uses[i].freed = true;
        }
    }
    pthread_mutex_unlock(&graph_mu);
    return !found ? 0 : fresh ? 1 : MT_ENOENT;
}

/* The allocator whose backend s is a stream of, or NULL. */
static mt_alloc_t *alloc_of_stream(const mt_stream_t *s)
{
    mt_preload_t *P = mt__preload();
    for (int d = 0; d < P->ndevices; d++) {
        mt_alloc_t *a = atomic_load_explicit(&P->ready[d], memory_order_acquire);
        if (a != NULL && mt__cuda_stream_is_of(mt_alloc_backend(a), s))
            return a;
    }
    return NULL;
}

bool mt__preload_graph_routed(const mt_stream_t *s)
{
    if (s == NULL || mt__preload()->sim) /* the legacy stream never captures; sim never */
        return false;
    void *handle = (void *)mt__cuda_stream_handle(s), *g = NULL;
    /* Under the drop-in every capture began through a hook; only the pluggable allocator
     * alone must ask the driver, once per request on a stream other than the legacy one. */
    if (atomic_load(&n_capturing) == 0 && (mt__preload()->interposed || !capturing_now(handle, &g)))
        return false;
    mt_alloc_t *a = alloc_of_stream(s);
    if (a == NULL)
        return false;
    pthread_mutex_lock(&graph_mu);
    bool r = current(a, (mt_stream_t *)s, handle) != NULL;
    pthread_mutex_unlock(&graph_mu);
    return r;
}

/* ---- torch's pool entry points (api.c) ---- */

/* The pool torch named id on a, or NULL (graph_mu held). */
static capture_t *torch_pool(mt_alloc_t *a, uint64_t id0, uint64_t id1)
{
    for (capture_t *c = captures; c != NULL; c = c->next)
        if (c->torch && c->alloc == a && c->torch_id[0] == id0 && c->torch_id[1] == id1)
            return c;
    return NULL;
}

void mt__preload_graph_pool_begin(int device, uint64_t id0, uint64_t id1)
{
    mt_alloc_t *a = NULL;
    if (mt__preload()->sim || mt__preload_alloc(device, &a) != 0)
        return; /* the capture then takes eager blocks, as before */
    pthread_mutex_lock(&graph_mu);
    capture_t *c = torch_pool(a, id0, id1);
    if (c == NULL && (c = calloc(1, sizeof *c)) != NULL) {
        uint32_t id = 0;
        mt__guard_enter();
        int rc = mt_pool_create(a, &id);
        mt__guard_leave();
        if (rc != 0) {
            mt__preload_say(MT_LOG_WARN, "graph pool (%llu, %llu) not made: %s",
                            (unsigned long long)id0, (unsigned long long)id1, mt_strerror(rc));
            free(c);
            c = NULL;
        } else {
            *c = (capture_t){
                .next = captures, .alloc = a, .pool = id, .torch = true, .torch_id = {id0, id1}};
            captures = c;
        }
    }
    if (c != NULL) {
        c->torch_uses++;
        c->armed = true;
    }
    release_retired(); /* a graph event with no capture under way: torch begins one next */
    pthread_mutex_unlock(&graph_mu);
}

void mt__preload_graph_pool_end(int device, uint64_t id0, uint64_t id1)
{
    mt_alloc_t *a = NULL;
    if (mt__preload()->sim || mt__preload_alloc(device, &a) != 0)
        return;
    pthread_mutex_lock(&graph_mu);
    capture_t *c = torch_pool(a, id0, id1);
    if (c != NULL) {
        c->armed = false;
        if (c->capturing) /* the end of capture no hook saw: torch calls this right after */
            unbind(c);
    }
    release_retired();
    pthread_mutex_unlock(&graph_mu);
}

void mt__preload_graph_pool_release(int device, uint64_t id0, uint64_t id1)
{
    mt_alloc_t *a = NULL;
    if (mt__preload()->sim || mt__preload_alloc(device, &a) != 0)
        return;
    pthread_mutex_lock(&graph_mu);
    capture_t *c = torch_pool(a, id0, id1);
    if (c != NULL && c->torch_uses > 0)
        c->torch_uses--;
    release_retired();
    pthread_mutex_unlock(&graph_mu);
}
