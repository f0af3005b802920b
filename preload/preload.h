/* libmemtrace-preload.so: the process-wide state of the LD_PRELOAD drop-in.
 *
 * The C ABI of the CUDA runtime and driver forces a singleton here: cudaMalloc has no
 * context argument, so the hooks find their allocator through one process-wide object,
 * mt_preload_t (context.c), created once with pthread_once on the first hooked call.
 *
 * Two modes, fixed at that first call:
 * - cuda: a driver answered. Device allocations come from one caching allocator per
 *   device over the cuda backend; every other hooked call is forwarded to the real
 *   runtime or driver. Honest note: this mode has only run against tests/cuda's fake
 *   driver, never on a GPU.
 * - sim: no driver (or MEMTRACE_BACKEND=sim). The memory-API subset (allocation, copies,
 *   memsets, streams, events, device selection, errors) is served on the sim backend, so
 *   a program that only moves memory runs to completion with correct data. Handles given
 *   to the program are the sim's own objects: cudaStream_t = mt_stream_t *, cudaEvent_t =
 *   mt_event_t *, device pointers = sim device addresses.
 *
 * Recursion: our own code (backend creation, the cuda backend's driver calls, dlsym
 * inside dlopen'ed libraries) may land in our exported hooks. A thread-local depth,
 * mt__preload_guard, is raised around everything the hooks call into; while it is up,
 * dlsym and cuGetProcAddress answer with the real symbols. */
#ifndef MT_PRELOAD_PRELOAD_H
#define MT_PRELOAD_PRELOAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "memtrace/alloc.h"
#include "memtrace/prof.h"

#define MT_HOOK __attribute__((visibility("default")))

#define MT_PRELOAD_MAX_DEVICES 1024 /* more than any node has; more are refused, loudly */
#define MEMTRACE_TAG_DEPTH     256  /* memtrace_tag_push nesting per thread */

/* Per device: a backend and its caching allocator, created on first use. */
typedef struct mt_preload_dev_s {
    mt_backend_t *backend; /* owned */
    mt_alloc_t *alloc;     /* owned */
} mt_preload_dev_t;

/* The process-wide context.
 * Invariants: after init, sim == (dev[0].backend is a sim backend) when init_rc == 0;
 * dev[i] is either both NULL or both set, and never changes again once set (hooks read
 * it without the lock after seeing alloc != NULL through an acquire load);
 * ev_count[k] counts events of kind k seen by the sink, forwarded or not. */
typedef struct mt_preload_s {
    int init_rc;     /* 0, or why no device can be served (MT_ENODEV, ...) */
    bool sim;        /* serve the memory API ourselves (see above) */
    bool interposed; /* cuda mode: the program's runtime calls reach our hooks (LD_PRELOAD),
                      * so every capture begins through one; false for torch's pluggable
                      * allocator alone */
    int ndevices;    /* devices we may serve (on sim: MEMTRACE_SIM_DEVICES) */
    mt_backend_cfg_t bcfg;
    mt_alloc_cfg_t acfg; /* template: backend and sink filled per device */

    pthread_mutex_t mu; /* guards device creation */
    mt_preload_dev_t dev[MT_PRELOAD_MAX_DEVICES];
    _Atomic(mt_alloc_t *) ready[MT_PRELOAD_MAX_DEVICES]; /* dev[i].alloc once published */
    /* The program's own managed memory (cudaMallocManaged, cuMemAllocManaged attached
     * globally): one allocator per device with managed_memory on, over dev[i].backend,
     * made on first use under mu (hooks_managed.c). NULL until then, and always NULL when
     * the drop-in's allocators are managed themselves (those serve it). Published and
     * read as dev[i].alloc is; dropped with its device, before the backend. */
    mt_alloc_t *managed[MT_PRELOAD_MAX_DEVICES];
    _Atomic(mt_alloc_t *) mready[MT_PRELOAD_MAX_DEVICES];
    /* User tags (api.c): tag_names[MT_TAG_USER_FIRST + i] for i < ntags_user, registered
     * with these ids on every device's allocator; written under mu before ntags_user
     * grows, read without it. */
    char tag_names[MT_TAG_MAX][32];
    _Atomic int ntags_user;

    mt_prof_t *prof;        /* owned; NULL when the profiler could not start */
    _Atomic bool prof_live; /* the sink forwards to prof while true */
    mt_event_sink_t sink;   /* counts, then forwards to prof */
    /* events by kind; [0] counts kinds this build does not know */
    _Atomic uint64_t ev_count[MT_EV_KIND_COUNT];

    _Atomic uint64_t host_allocs;   /* pinned host allocations served */
    _Atomic uint64_t host_bytes;    /* bytes, current */
    _Atomic uint64_t unknown_frees; /* frees of pointers we never handed out */
    _Atomic uint64_t ooms;          /* allocation requests that failed for lack of memory */
    /* The counters of device allocators dropped by a reset or a context destroy, so the
     * summary still counts what they served (under mu). */
    mt_alloc_stats_t gone;
    pthread_mutex_t oom_mu; /* guards oom_msg */
    char oom_msg[2048];     /* the allocator's report of the last OOM */

    const char *summary_path; /* $MEMTRACE_SUMMARY_FILE, or NULL */
    int log_level;            /* messages up to this mt_log_level_e reach stderr */

    void *libcuda; /* the real driver (cuda mode), for forwarding; NULL on sim */
} mt_preload_t;

/* PyTorch's CUDAPluggableAllocator entry points (exact signatures of design.md section 3;
 * cudaStream_t is struct CUstream_st *). memtrace_alloc returns NULL on failure. */
#include <sys/types.h>
struct CUstream_st;
MT_HOOK void *memtrace_alloc(ssize_t size, int device, struct CUstream_st *stream);
MT_HOOK void memtrace_free(void *ptr, ssize_t size, int device, struct CUstream_st *stream);

/* The calling thread's current tag (api.c): what its allocations are tagged with. */
int mt__preload_tag(void);
/* Registers user tag id's name on device's allocator, or on every ready one (device -1);
 * the allocator must give it that id. Caller holds P->mu (or is the one-time set-up). */
int mt__preload_register_tag(mt_preload_t *P, int id, int device);

/* The allocators' OOM observer (api.c): forwards to the observers the program added. */
void mt__preload_oom_observer(void *ud, const mt_alloc_oom_info_t *info);

/* Raised around everything the hooks call into (see above). */
extern _Thread_local int mt__preload_guard;

/* The context, initialised on first call. Never NULL. */
mt_preload_t *mt__preload(void);
/* The allocator of device d, created on first use. MT_ENODEV if d cannot be served. */
int mt__preload_alloc(int device, mt_alloc_t **out);
/* The allocator that serves device's managed memory (cudaMallocManaged attached
 * globally), created on first use: a managed allocator beside the device's own, or the
 * device's own when the drop-in's config makes it managed. */
int mt__preload_managed_alloc(int device, mt_alloc_t **out);
/* Allocator i of 2 * ndevices: the devices' own, then their managed ones; NULL when not
 * made. For walks over every allocator that may hold the program's blocks. */
static inline mt_alloc_t *mt__preload_nth(mt_preload_t *P, int i)
{
    return i < P->ndevices
               ? atomic_load_explicit(&P->ready[i], memory_order_acquire)
               : atomic_load_explicit(&P->mready[i - P->ndevices], memory_order_acquire);
}
/* Our hook for a managed-memory entry point's exported name (hooks_managed.c: both modes),
 * or NULL; and for a cuGetProcAddress base name at cudaVersion. */
void *mt__preload_managed_hook(const char *name);
void *mt__preload_managed_proc(const char *base, int cuda_version, bool per_thread);
/* A prefetch (to location, on the program's stream handle) or an advice (advice, with
 * location) of [ptr, ptr+n) in a block memtrace handed out: mt_alloc_prefetch or
 * mt_alloc_advise, so it is recorded. MT_ENOENT when ptr is in no block of memtrace's. */
int mt__preload_managed_op(bool prefetch, const void *ptr, size_t n, int advice, int location,
                           void *stream);

/* The allocator (of any device in use, managed ones included) that handed out ptr; MT_ENOENT if
 * none. CUDA frees any device's pointer whatever the current device is, so frees look it up. */
int mt__preload_alloc_of(const void *ptr, mt_alloc_t **out);
/* Whether ptr lies inside a segment some device's allocator holds (a free or cached
 * block, or the inside of a live one). Such a pointer is never the real runtime's to
 * free: freeing it there would release the whole segment under its live blocks. Takes
 * a snapshot, so it is for the unknown-pointer path only. */
bool mt__preload_held(const void *ptr);
/* Emits into a, the first allocator made, the marks made before it existed (api.c). */
void mt__preload_marks_flush(mt_alloc_t *a);
/* In a fork child: forgets the parent's queued marks and the state of their lock. */
void mt__preload_marks_fork_child(void);
/* Stream-ordered blocks (cudaMallocAsync, cuMemAllocAsync): add records one handed out;
 * take removes ptr and says whether it was one. Every other allocation takes its
 * pointer too, so an address reused after a device reset is not mistaken for one. */
void mt__preload_ordered_add(const void *ptr);
bool mt__preload_ordered_take(const void *ptr);
/* Device reset or primary-context teardown: drops device d's cache and
 * state first, while the context can still free them. */
void mt__preload_drop_device(int device);
/* Device dev enabled peer access to device peer (both in range, distinct): peer's
 * expandable segments are granted to dev now if its allocator exists, else when it is
 * made (pairs of devices < 64 are remembered). */
int mt__preload_peer_access(int dev, int peer);
/* Empties every device's cache (the driver ran out for an allocation memtrace does not
 * serve). True if any memory went back to the driver. */
bool mt__preload_release_cached(void);
/* Empties the managed allocators' caches: a device allocator that ran out retries after
 * it, since their cached segments take the same device memory. True if any went back. */
bool mt__preload_release_managed(void);
/* Stream capture: 1 and the graph being captured into if the program's stream handle is
 * capturing (cuda mode; the legacy stream never is), else 0. Blocks a capture uses are
 * kept by hooks_graph.c (mt__preload_graph_keep). */
int mt__preload_capture_graph(void *handle, void **graph);
/* Frees pinned host memory from whichever device's backend gave it. Caller guarded. */
int mt__preload_host_free(void *ptr);
/* Records an OOM (the allocator's message) for the summary. */
void mt__preload_note_oom(mt_alloc_t *a, size_t size);
/* The atexit handler (summary.c): the summary file, the final totals, the profiler's end. */
void mt__preload_at_exit(void);
/* printf-style message to stderr, "memtrace: " prefixed, if level is enabled. */
void mt__preload_say(mt_log_level_e level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Whether the calling thread's current context is a primary one (or none is current, or
 * sim): memtrace serves allocations only there (hooks_driver.c). */
bool mt__preload_current_is_primary(void);
/* The device whose pool a stream-ordered allocation on stream comes from: the stream's
 * device for a created stream, cur for the legacy and per-thread handles (and when the
 * driver cannot say); -1 when the stream belongs to a context that is not a primary one
 * (the driver's, as that context's other allocations). */
int mt__preload_stream_device(void *stream, int cur);
/* Whether the program set a pool of its own on dev (cuDeviceSetMemPool, or the access of
 * dev's default pool): its stream-ordered allocations there are the driver's. */
bool mt__preload_own_pool(int dev);
void mt__preload_own_pool_set(int dev);
void mt__preload_pool_access_set(void *pool);

/* The real definition of name, after ours in the lookup order (the runtime's or the
 * driver's). NULL when absent. */
void *mt__preload_real_rt(const char *name);
void *mt__preload_real_drv(const char *name);
/* mt__preload_real_rt(#name), looked up once per call site (a void *). */
#define MT__PRELOAD_REAL_RT_ONCE(name)                                                             \
    ({                                                                                             \
        static _Atomic(void *) r_;                                                                 \
        void *f_ = atomic_load_explicit(&r_, memory_order_relaxed);                                \
        if (f_ == NULL) {                                                                          \
            f_ = mt__preload_real_rt(#name);                                                       \
            atomic_store_explicit(&r_, f_, memory_order_relaxed);                                  \
        }                                                                                          \
        f_;                                                                                        \
    })
/* The real dlsym, never ours. */
void *mt__preload_real_dlsym(void *handle, const char *name);

/* Our hook for an exported name (runtime or driver), or NULL (dlsym interposition).
 * Only memory entry points in cuda mode; every served one on sim. */
void *mt__preload_hook_by_name(const char *name);
void *mt__preload_rt_hook(const char *name, bool sim);  /* hooks_runtime.c */
void *mt__preload_drv_hook(const char *name, bool sim); /* hooks_driver.c */
/* Our driver hook for a cuGetProcAddress base name ("cuMemAlloc"), or NULL. mem_only:
 * only the memory entry points (cuda mode); else every sim-served one. per_thread: the
 * _ptsz variant where there is one (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM). */
void *mt__preload_driver_proc(const char *base, bool mem_only, bool per_thread);

/* Current device of the calling thread. */
int mt__preload_current_device(void);
void mt__preload_set_current_device(int device);

/* The program's stream handle as an mt_stream_t of backend b. */
int mt__preload_stream(mt_backend_t *b, void *handle, mt_stream_t **out);
/* cuda mode: the program destroys handle; the backends stop taking it for that stream. */
void mt__preload_stream_forget(void *handle);
/* cuda mode: the driver's own code behind the calling thread's latest backend failure,
 * cleared by the read; 0 if none. */
int mt__preload_driver_result(void);

/* Guard helpers: hooks bracket calls into memtrace with these. */
static inline void mt__guard_enter(void)
{
    mt__preload_guard++;
}
static inline void mt__guard_leave(void)
{
    mt__preload_guard--;
}

/* In cuda mode a hook hands the call to the real function, looked up once by resolve(#name)
 * and cached (the cache holds a constant, so racing stores are harmless); missing is what
 * the hook returns when there is none. In sim mode the hook goes on and serves the call. */
#define MT_PRELOAD_FORWARD(resolve, missing, name, ...)                                            \
    do {                                                                                           \
        if (!mt__preload()->sim) {                                                                 \
            static _Atomic(void *) real_;                                                          \
            void *f_ = atomic_load_explicit(&real_, memory_order_relaxed);                         \
            if (f_ == NULL) {                                                                      \
                f_ = resolve(#name);                                                               \
                atomic_store_explicit(&real_, f_, memory_order_relaxed);                           \
            }                                                                                      \
            if (f_ == NULL)                                                                        \
                return missing;                                                                    \
            return ((__typeof__(&name))f_)(__VA_ARGS__);                                           \
        }                                                                                          \
    } while (0)

#endif
