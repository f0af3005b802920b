/* memtrace caching allocator: one per device, over a backend (cuda or sim).
 *
 * Policies follow the reference caching allocator (PyTorch's CUDACachingAllocator) so
 * users' knowledge carries over: 512-byte rounding, small/large pools, split/merge
 * rules, max_split_size, garbage collection threshold, expandable segments, stream-
 * aware reuse through events, release-cache-and-retry before failing. Free blocks live
 * in size-class bins with bitmaps (O(1) lookup); all metadata lives on the host.
 *
 * Thread-safety: an mt_alloc_t is safe to use from any number of threads; one mutex
 * per allocator serialises its operations. An allocator's sink calls never overlap but
 * write: they are made under that mutex, or by a thread cache's fast operation under the
 * allocator's short recording lock; two threads' writes of what their claims took may run
 * at once (event.h). */
#ifndef MEMTRACE_ALLOC_H
#define MEMTRACE_ALLOC_H

#include <stdbool.h>
#include "memtrace/backend.h"
#include "memtrace/event.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_alloc_s mt_alloc_t;

/* Tags say what an allocation is for. User labels get ids from MT_TAG_USER_FIRST. */
typedef enum mt_tag_e {
    MT_TAG_OTHER = 0,
    MT_TAG_WEIGHTS = 1,
    MT_TAG_GRADS = 2,
    MT_TAG_OPTIMIZER = 3,
    MT_TAG_ACTIVATIONS = 4,
    MT_TAG_WORKSPACE = 5,
    MT_TAG_BATCH = 6,
    MT_TAG_USER_FIRST = 7,
    MT_TAG_MAX = 32, /* tags are < MT_TAG_MAX */
} mt_tag_e;

#define MT_ALLOC_ROUNDUP_INTERVALS 16 /* 1 MiB .. 32 GiB, as PyTorch's */

/* Where an allocator's memory comes from (PyTorch's "backend" key). */
typedef enum mt_alloc_backend_e {
    MT_ALLOC_BACKEND_NATIVE = 0, /* the caching allocator (segments, bins, caches) */
    MT_ALLOC_BACKEND_ASYNC = 1,  /* each request to the backend's stream-ordered pool
                                  * (cudaMallocAsync; docs/allocator-async.md) */
} mt_alloc_backend_e;

typedef struct mt_alloc_cfg_s {
    mt_backend_t *backend; /* borrowed, required; outlives the allocator */
    size_t max_split_size; /* bytes; SIZE_MAX = unlimited (default) */
    /* A request of at least max_split_size may take a cached unsplit block at most this many
     * bytes larger than itself (PyTorch's max_non_split_rounding_mb); 20 MiB. */
    size_t max_non_split_rounding;
    /* Divisions per size interval (PyTorch's roundup_power2_divisions): interval i holds the
     * sizes in [2^i, 2^(i+1)) MiB, interval 0 also those below 1 MiB, the last also those
     * above. 0 or 1: 512-byte steps; else a power of two. All 0 by default. */
    unsigned roundup_power2_divisions[MT_ALLOC_ROUNDUP_INTERVALS];
    double garbage_collection_threshold; /* 0 = off, else in (0, 1) of the memory limit */
    double memory_fraction;              /* limit = fraction x capacity, in (0, 1]; 1 */
    bool expandable_segments;            /* virtual ranges + pages mapped on demand; true */
    bool release_on_oom;                 /* release cache and retry before failing; true */
    const mt_event_sink_t *sink;         /* borrowed, optional */
    mt_log_cb log;                       /* optional */
    void *log_ud;
    /* Beyond the reference: when a large request finds no cached block, cached whole
     * segments of its pool and stream that are smaller than the request go back to the
     * backend before a new segment is made (they cannot serve it, and keeping them only
     * strands memory until an OOM). Lifts utilization at peak on variable shapes (RNN
     * trace 0.64 -> 0.98) for a few backend frees. true; false = reference behaviour. */
    bool release_smaller_segments;
    /* With a sink: a MT_EV_STATS event (the totals; size = peak allocated bytes, requested =
     * bytes requested by the live allocations) at most this often while the allocator is in
     * use, checked against the stamps of the events it emits anyway (an idle allocator sends
     * none). 1000; 0 = none. */
    unsigned stats_period_ms;
    /* Cold-start policies beyond the reference (docs/allocator-policy.md has the table that
     * chose the defaults; "rules:reference" turns them all off). release_to_fit (true): on a
     * miss that would raise reserved above its peak, cached whole segments (expandable: whole
     * free pages) go back first until they cover the excess. */
    bool release_to_fit;
    /* Large requests under 10 MiB get a segment of their size rounded up to 2 MiB rather
     * than the reference's 20 MiB. */
    bool fit_large_segments;
    /* Large blocks split whenever the rest is at least 512 B (the reference: only when the
     * rest exceeds 1 MiB), so a block is never handed out bigger than asked. */
    bool split_large_tails;
    /* With expandable segments: small requests share the large pool's range (one pool,
     * segregated fits), so small blocks fill the pages around large ones instead of pages
     * of their own. Their statistics then count in the large pool. true. */
    bool one_pool;
    /* With expandable segments: requests of at least this many bytes get new pages from the
     * top half of their range, smaller ones from the bottom half, so that large short-lived
     * blocks reuse the same pages and do not cut holes among long-lived small ones. 32 MiB;
     * 0 = off; config key place_high_mb. */
    size_t place_high;
    /* Call stacks of this allocator's allocations (mt_stacks_e, event.h): taken through the
     * sink's stack callback; MT_STACKS_DEFAULT = the sink's own setting (the profiler's
     * MEMTRACE_STACKS). Config key "stacks": off, sampled, all. */
    int stacks;
    /* Per-thread caches (docs/allocator-tcache.md): a freed block kept whole by its thread
     * for a reuse of its size on its stream without the allocator's lock; with a sink its
     * fast operations are recorded too. Off while warming up. true; config key tcache
     * (0/1). */
    bool tcache;
    /* Fork handling (docs/allocator-policy.md, "Fork"): the first allocator created with it
     * registers pthread_atfork handlers, once per process, and a fork child may then use
     * every allocator that asked for it (the fork waits for their locks and for work they
     * have in flight; the child takes back the caches of the threads it does not have).
     * Without it the library registers nothing, and a child must not touch the allocator.
     * true; config key atfork (0/1). */
    bool atfork;
    /* The lock biased to the thread that takes it in a run (docs/allocator-locking.md): that
     * thread's global operations take no atomic instruction, and another thread's first take
     * costs a membarrier call. Used only where membarrier works. true; config key lock_bias
     * (0/1). */
    bool lock_bias;
    /* mt_alloc_backend_e; config key backend: native | cudaMallocAsync (hipMallocAsync
     * too). Under cudaMallocAsync the caching allocator's keys (max_split_size_mb,
     * roundup_power2_divisions, garbage_collection_threshold, expandable_segments, ...)
     * are ignored, with a warning through log, as PyTorch ignores them; it cannot change
     * at run time. MT_ALLOC_BACKEND_NATIVE. */
    int alloc_backend;
    /* Segments of managed (unified) memory, cudaMallocManaged's, as RMM's pool over its
     * managed_memory_resource (rmm.reinitialize(managed_memory=True)): pages migrate between
     * host and device on access and the device may be oversubscribed. Plain segments only:
     * expandable segments map cuMemCreate memory, which cannot be managed, so create refuses
     * both (MT_EINVAL) and the config string's managed_memory:True turns expandable segments
     * off unless the same string asks for them. A backend without managed memory is
     * MT_ENOTSUP. false; config key managed_memory. docs/managed-memory.md. */
    bool managed_memory;
} mt_alloc_cfg_t;

/* Defaults (no environment read). */
MT_API mt_alloc_cfg_t mt_alloc_cfg_default(void);
/* Applies a PyTorch-style config string "key:value,key:value" to cfg. Keys:
 * max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions (N, or per interval
 * "[256:1,512:2,>:8]": MiB keys, powers of two, read as PyTorch's code reads them),
 * garbage_collection_threshold,
 * memory_fraction, expandable_segments (True/False/true/false/1/0),
 * release_on_oom, release_smaller_segments, stats_period_ms, release_to_fit,
 * fit_large_segments, split_large_tails, one_pool, place_high_mb, stacks (off/sampled/all), tcache,
 * atfork, lock_bias, backend (native, cudaMallocAsync), managed_memory,
 * and rules:reference (the reference allocator's plain-segment rules: no expandable segments,
 * release_to_fit, one_pool or place_high). An unknown key or a
 * bad value returns MT_EINVAL and writes a message naming it into err (if err != NULL); cfg is then
 * left unchanged.
 */
MT_API int mt_alloc_cfg_parse(mt_alloc_cfg_t *cfg, const char *conf, char *err, size_t errlen);
/* mt_alloc_cfg_parse of the MEMTRACE_ALLOC_CONF environment variable, if set. */
MT_API int mt_alloc_cfg_from_env(mt_alloc_cfg_t *cfg, char *err, size_t errlen);

/* Creates an allocator. *out is new. Emits MT_EV_CONFIG. */
MT_API int mt_alloc_create(mt_alloc_t **out, const mt_alloc_cfg_t *cfg);
/* Waits for pending frees, returns every segment to the backend, frees *p. Live
 * allocations are released too (and counted in the log as leaks). Sets *p = NULL. */
MT_API void mt_alloc_destroy(mt_alloc_t **p);

MT_API mt_backend_t *mt_alloc_backend(const mt_alloc_t *a);

/* Allocates size bytes (size 0 returns a NULL pointer and 0) for use on stream (NULL =
 * default stream), tagged tag. The block is reused only on that stream unless
 * mt_alloc_record_stream() says otherwise. Returns MT_ENOMEM after the full recovery
 * sequence; the message is then in mt_alloc_last_error() and the log. MT_EINVAL for a
 * tag outside [0, MT_TAG_MAX). Cached blocks may outlive their stream: the allocator
 * never calls into a stream after the call that passed it, except that a stream given
 * to mt_alloc_record_stream must be alive when that block is freed (an event is
 * recorded on it then). */
MT_API int mt_alloc_malloc(mt_alloc_t *a, size_t size, mt_stream_t *stream, int tag, void **out);
/* Frees a pointer from mt_alloc_malloc (NULL is a no-op). If the block was used on other
 * streams, it returns to the pool only once events recorded now have completed.
 * MT_ENOENT for a pointer this allocator did not hand out (nothing is changed). */
MT_API int mt_alloc_free(mt_alloc_t *a, void *ptr);
/* Marks that ptr is used on stream too (torch's record_stream). */
MT_API int mt_alloc_record_stream(mt_alloc_t *a, void *ptr, mt_stream_t *stream);
/* Size of the block behind ptr (rounded), or MT_ENOENT. ptr may point inside it;
 * *base receives the start of the block if base != NULL. */
MT_API int mt_alloc_block_info(mt_alloc_t *a, const void *ptr, void **base, size_t *size, int *tag);

/* Warm-up reservation: ensures at least bytes are reserved as one cached segment on
 * stream, usable by requests of any size, so that a later run whose live bytes stay
 * within it makes no backend malloc. Emits MT_EV_RESERVE. */
MT_API int mt_alloc_reserve(mt_alloc_t *a, size_t bytes, mt_stream_t *stream);
/* Record/replay warm-up: between begin and end, the allocator records the sequence of
 * requests (rounded sizes and order). end releases the cache and plans the reservation
 * on stream offline: each allocation freed within the warm-up gets an address so that
 * allocations live at the same time never overlap, in the free room of the stream's large
 * segments that still hold blocks (weights, optimizer state, ...) and of its earlier
 * reservations, then in one new segment as large as the placement needs (2 MiB steps).
 * Segments the plan uses become reservations (never released by empty_cache or GC);
 * earlier reservations it does not use are released. Later requests on stream that
 * repeat the sequence (or a smaller shape of it) are placed where the plan put them, the
 * rest by best fit in the reservations. Blocks allocated during the warm-up and still
 * live at end are not transient. If the sequence could not be recorded (host memory), the
 * whole measured transient peak plus 1/32 is reserved as one segment. warmup_end without
 * begin returns MT_EINVAL. See docs/allocator-policy.md. */
MT_API int mt_alloc_warmup_begin(mt_alloc_t *a);
MT_API int mt_alloc_warmup_end(mt_alloc_t *a, mt_stream_t *stream);

/* Returns every unused cached segment to the backend (after pending events). */
MT_API int mt_alloc_empty_cache(mt_alloc_t *a);
/* Sets the memory limit to fraction x capacity, fraction in (0, 1] (else MT_EINVAL), as
 * cfg.memory_fraction does at creation. Memory already reserved stays; later requests over
 * the limit free cached blocks first and fail if that is not enough. */
MT_API int mt_alloc_set_memory_fraction(mt_alloc_t *a, double fraction);
/* Applies a config string at run time (torch.cuda.memory._set_allocator_settings):
 * max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions,
 * garbage_collection_threshold, memory_fraction, release_on_oom, release_smaller_segments,
 * release_to_fit, place_high_mb. A key that shapes existing segments or caches
 * (expandable_segments, one_pool, tcache, stacks, ...) is MT_ENOTSUP, a bad string
 * MT_EINVAL, each naming it in err; nothing changes then. Every changed value is an
 * MT_EV_SETTING event. Blocks already handed out keep their sizes. */
MT_API int mt_alloc_set_settings(mt_alloc_t *a, const char *conf, char *err, size_t errlen);

/* Free-memory callbacks (the reference allocator's first step when a request finds no
 * cached block): before asking the device for a new segment, the allocator calls each
 * registered callback, in registration order, with the request's size and stream. A
 * callback may give memory back to this allocator (mt_alloc_free, mt_alloc_empty_cache)
 * and returns true if it did; the cache is then searched again. Callbacks run on the
 * allocating thread WITHOUT the allocator's lock; while they run, other requests of this
 * allocator (the callbacks' own, or other threads') go on without calling them. A cache
 * miss is not yet a shortage: a callback that holds memory worth keeping checks the device
 * (mt_backend_mem_get_info) before giving it up. */
typedef bool (*mt_alloc_free_cb)(void *ud, mt_alloc_t *a, size_t size, mt_stream_t *stream);
/* Adds cb (with ud, borrowed until removed). MT_EBUSY when 8 are registered already. */
MT_API int mt_alloc_add_free_callback(mt_alloc_t *a, mt_alloc_free_cb cb, void *ud);
/* Removes the (cb, ud) registration; MT_ENOENT if there is none. Do not remove one while
 * another thread may be allocating from a: it may be running a copy of the list. */
MT_API int mt_alloc_remove_free_callback(mt_alloc_t *a, mt_alloc_free_cb cb, void *ud);

/* OOM observers (PyTorch's torch._C._cuda_attach_out_of_memory_observer): called once per
 * failed request, after the allocator has given up (free callbacks, cache release and
 * retry all done), before mt_alloc_malloc returns MT_ENOMEM. Called on the failing thread
 * with the allocator's lock RELEASED: an observer may call mt_alloc_stats, mt_alloc_snapshot
 * or mt_alloc_free on a; it should not allocate from a. info and its message are borrowed
 * for the call only. Host-memory failures of the allocator's own tables call none. */
typedef struct mt_alloc_oom_info_s {
    int device;          /* backend device ordinal */
    uint64_t requested;  /* bytes asked for */
    uint64_t allocated;  /* allocated bytes now (all pools) */
    uint64_t reserved;   /* reserved bytes now */
    uint64_t limit;      /* memory_fraction x capacity, bytes */
    uint64_t free;       /* the device's free bytes (mt_backend_mem_get_info) */
    const char *message; /* the OOM report, as mt_alloc_last_error */
} mt_alloc_oom_info_t;
typedef void (*mt_alloc_oom_cb)(void *ud, const mt_alloc_oom_info_t *info);
/* Adds cb (with ud, borrowed until removed). MT_EBUSY when 8 are registered already. */
MT_API int mt_alloc_add_oom_observer(mt_alloc_t *a, mt_alloc_oom_cb cb, void *ud);
/* Removes the (cb, ud) registration; MT_ENOENT if there is none. An OOM on another thread
 * that began before may still call it: keep ud alive until such requests have returned. */
MT_API int mt_alloc_remove_oom_observer(mt_alloc_t *a, mt_alloc_oom_cb cb, void *ud);

/* ---- managed memory (cfg.managed_memory) ---- */
/* Prefetches [ptr, ptr+size) of an allocated block to location (a device ordinal, or
 * MT_MANAGED_HOST) on stream (NULL: default), as cudaMemPrefetchAsync (RMM's
 * prefetch(..)). MT_ENOTSUP when a is not managed, MT_ENOENT when the range is not inside
 * one allocated block, each with the reason in mt_alloc_last_error; else the backend's
 * code. Emits MT_EV_MANAGED (MT_MANAGED_PREFETCH). */
MT_API int mt_alloc_prefetch(mt_alloc_t *a, const void *ptr, size_t size, int location,
                             mt_stream_t *stream);
/* Applies advice (mt_managed_advice_e, backend.h) with location to [ptr, ptr+size) of an
 * allocated block, as cudaMemAdvise. Errors as mt_alloc_prefetch's. Emits MT_EV_MANAGED
 * (MT_MANAGED_ADVISE). */
MT_API int mt_alloc_advise(mt_alloc_t *a, const void *ptr, size_t size, int advice, int location);
/* The backend's managed memory figures of a's device (mt_backend_managed_stats); emits an
 * MT_EV_MANAGED residency sample when they changed since the last one. MT_ENOTSUP when a is
 * not managed. */
MT_API int mt_alloc_managed_stats(mt_alloc_t *a, mt_managed_stats_t *out);
/* Registers a user label as a tag; *out_tag receives its id (the same id if the label
 * exists). MT_ENOMEM when all MT_TAG_MAX ids are taken. label is copied. */
MT_API int mt_alloc_tag_register(mt_alloc_t *a, const char *label, int *out_tag);
/* Name of a tag ("weights", ..., or the user label); "other" for unknown ids. */
MT_API const char *mt_alloc_tag_name(const mt_alloc_t *a, int tag);
/* Static built-in names, usable without an allocator. */
MT_API const char *mt_tag_builtin_name(int tag);

/* Forwards a program/engine event (MT_EV_MARK, MT_EV_COMPACTION, MT_EV_STATS) to the
 * sink with the allocator's current totals. For MT_EV_STATS, addr and size are ignored:
 * the event is the periodic one's (size = peak allocated, requested = requested bytes). */
MT_API void mt_alloc_emit(mt_alloc_t *a, int kind, uint64_t addr, uint64_t size, int tag);

/* ---- device memory outside the allocator (docs/outside.md) ---- */

/* Reports that library took (freed = false) or gave back (true) size bytes at addr on a's
 * device without the allocator (the drop-in calls it for what it forwards to the driver).
 * library: a short name, the calling module's file name ("libnccl.so.2"); NULL or "" for
 * none. Library names get ids shared by the process. Emits MT_EV_LIBRARY_LABEL (once per
 * id and allocator), MT_EV_OUTSIDE_ALLOC or _FREE (tag = id) and MT_EV_DEVICE; the OOM
 * message names the largest. MT_EINVAL for a NULL a or size 0. Takes a's lock. */
MT_API int mt_alloc_note_outside(mt_alloc_t *a, bool freed, uint64_t addr, uint64_t size,
                                 const char *library);
/* Bytes that library holds outside the allocators of a's device (library NULL: every
 * library, named or not; "": those with no name), as mt_alloc_note_outside was told. */
MT_API uint64_t mt_alloc_outside_bytes(const mt_alloc_t *a, const char *library);

/* ---- statistics (the reference vocabulary) ---- */

typedef struct mt_stat_s {
    int64_t current;    /* now */
    int64_t peak;       /* highest current since creation or mt_alloc_reset_peak */
    uint64_t allocated; /* cumulative increments */
    uint64_t freed;     /* cumulative decrements */
} mt_stat_t;

enum { MT_STAT_ALL = 0, MT_STAT_SMALL = 1, MT_STAT_LARGE = 2, MT_STAT_N = 3 };

typedef struct mt_alloc_stats_s {
    /* bytes, indexed by MT_STAT_ALL/SMALL/LARGE */
    mt_stat_t allocated_bytes[MT_STAT_N];      /* handed out, rounded */
    mt_stat_t reserved_bytes[MT_STAT_N];       /* held from the backend (mapped, if expandable) */
    mt_stat_t active_bytes[MT_STAT_N];         /* allocated + freed but awaiting events */
    mt_stat_t inactive_split_bytes[MT_STAT_N]; /* free pieces of split segments */
    mt_stat_t requested_bytes[MT_STAT_N];      /* as asked for, before rounding */
    /* counts */
    mt_stat_t allocation[MT_STAT_N];
    mt_stat_t segment[MT_STAT_N];
    mt_stat_t active[MT_STAT_N];
    mt_stat_t inactive_split[MT_STAT_N];
    /* per tag, bytes */
    mt_stat_t tag_allocated_bytes[MT_TAG_MAX];
    mt_stat_t tag_requested_bytes[MT_TAG_MAX];
    uint64_t num_alloc_retries; /* mallocs that needed a cache release and retry */
    uint64_t num_ooms;          /* mallocs that failed */
    uint64_t num_device_alloc;  /* backend malloc (or vm map) calls */
    uint64_t num_device_free;   /* backend free (or vm unmap) calls */
    uint64_t num_sync_all_streams;
    /* PyTorch's oversize counters: allocated blocks, and plain segments, of at least
     * max_split_size bytes (never any while it is unlimited). */
    mt_stat_t oversize_allocations;
    mt_stat_t oversize_segments;
    uint64_t max_split_size;     /* the config's; SIZE_MAX = unlimited */
    uint64_t largest_free_block; /* bytes, largest inactive block */
    uint64_t total_free;         /* bytes, reserved - allocated - pending */
    double utilization;          /* allocated / reserved, current; 1 when reserved = 0 */
    double fragmentation;        /* 1 - largest_free_block / total_free; 0 when none free */
    uint64_t capacity;           /* device total bytes */
    uint64_t limit;              /* memory_fraction x capacity */
} mt_alloc_stats_t;

MT_API int mt_alloc_stats(mt_alloc_t *a, mt_alloc_stats_t *out);
MT_API void mt_alloc_reset_peak(mt_alloc_t *a);
/* Zeroes the cumulative figures: every stat's allocated and freed, and the num_* counters
 * (torch.cuda.reset_accumulated_memory_stats). Current values and peaks stay. */
MT_API void mt_alloc_reset_accumulated(mt_alloc_t *a);

/* Scoped statistics (RMM's push_statistics / pop_statistics): a stack of at most
 * MT_ALLOC_SCOPE_MAX open scopes per allocator; each sees the allocations and frees made
 * while it is open (by every thread) and the peak of allocated bytes meanwhile, exact with
 * thread caches on. name (optional, NULL = none) is recorded in the event stream as a named
 * mark (MT_EV_MARK_NAMED, cut to 16 bytes) at push, and "/" + name at pop. */
#define MT_ALLOC_SCOPE_MAX 64
typedef struct mt_alloc_scope_stats_s {
    int64_t start_bytes;      /* allocated bytes at push */
    int64_t peak_bytes;       /* highest allocated bytes while open minus start_bytes, >= 0 */
    int64_t current_bytes;    /* allocated bytes at pop minus start_bytes (< 0 if net freed) */
    uint64_t allocated_bytes; /* bytes allocated while open (rounded) */
    uint64_t freed_bytes;     /* bytes freed while open, of any block */
    uint64_t allocations;     /* allocations made while open */
    uint64_t frees;           /* frees made while open, of any block */
} mt_alloc_scope_stats_t;
/* Opens a scope; MT_EOVERFLOW when MT_ALLOC_SCOPE_MAX are open. */
MT_API int mt_alloc_stats_push(mt_alloc_t *a, const char *name);
/* Closes the innermost scope and writes its figures to *out (out may be NULL). Its peak
 * counts in the enclosing scopes' peaks. MT_EINVAL when none is open. */
MT_API int mt_alloc_stats_pop(mt_alloc_t *a, mt_alloc_scope_stats_t *out);
/* Number of open scopes. */
MT_API int mt_alloc_stats_depth(mt_alloc_t *a);

/* ---- snapshot ---- */

typedef enum mt_block_state_e {
    MT_BLOCK_ACTIVE_ALLOCATED = 0,
    MT_BLOCK_ACTIVE_PENDING_FREE = 1,
    MT_BLOCK_INACTIVE = 2,
} mt_block_state_e;

typedef struct mt_snapshot_block_s {
    uint64_t addr;      /* device address */
    uint64_t size;      /* bytes */
    uint64_t requested; /* bytes asked for (0 if inactive) */
    int state;          /* mt_block_state_e */
    int tag;
} mt_snapshot_block_t;

typedef struct mt_snapshot_segment_s {
    uint64_t addr;   /* device address of the first byte */
    uint64_t size;   /* bytes (for expandable segments: mapped bytes) */
    int pool;        /* mt_pool_e */
    uint32_t stream; /* mt_stream_id */
    bool expandable;
    bool reserved;      /* a warm-up reservation */
    uint32_t priv_pool; /* id of the private pool holding it (mt_pool_create), 0 = none;
                         * sits in what was padding, so the layout is unchanged */
    size_t nblocks;
    mt_snapshot_block_t *blocks; /* nblocks, address order */
} mt_snapshot_segment_t;

typedef struct mt_alloc_snapshot_s {
    size_t nsegments;
    mt_snapshot_segment_t *segments; /* address order */
    mt_alloc_stats_t stats;
} mt_alloc_snapshot_t;

/* *out is new; free it with mt_alloc_snapshot_free. */
MT_API int mt_alloc_snapshot(mt_alloc_t *a, mt_alloc_snapshot_t **out);
MT_API void mt_alloc_snapshot_free(mt_alloc_snapshot_t **p);

/* ---- private pools (CUDA graph capture; docs/allocator-pools.md) ----
 * A private pool holds the memory of the allocations routed to it, as PyTorch's graph
 * pools do: a block freed there is reused only by later allocations routed to the same
 * pool (on the same stream), never by other requests, and its segments go back to the
 * device only through mt_pool_release. A captured graph's addresses thus stay valid across
 * its replays while eager work goes on. Pool memory counts in every statistic and event as
 * any segment's; snapshots name the pool (priv_pool). Not under backend:cudaMallocAsync
 * (MT_ENOTSUP). */
/* Creates an empty pool; *out_id receives its id (>= 1). MT_ENOMEM. */
MT_API int mt_pool_create(mt_alloc_t *a, uint32_t *out_id);
/* Routes the allocations on stream (NULL = default stream) to pool id until mt_pool_end
 * (PyTorch's beginAllocateToPool). Per-thread caches stay off meanwhile. MT_ENOENT: no such
 * pool; MT_EBUSY: stream is routed already, or a warm-up is recording. */
MT_API int mt_pool_begin(mt_alloc_t *a, uint32_t id, mt_stream_t *stream);
/* Ends the routing of stream to pool id (endAllocateToPool); blocks already allocated
 * stay in the pool. MT_ENOENT when stream is not routed to id. */
MT_API int mt_pool_end(mt_alloc_t *a, uint32_t id, mt_stream_t *stream);
/* Returns the pool's segments to the device and forgets id. MT_EBUSY, and nothing
 * changes, while a stream is routed to it or one of its blocks is allocated or waits for
 * events (free them first), or while a request of another thread (or a free callback's)
 * is under way with the allocator's lock released (try again); MT_ENOENT: no such pool. */
MT_API int mt_pool_release(mt_alloc_t *a, uint32_t id);
/* The pool's reserved (segment) and allocated bytes; either pointer may be NULL. */
MT_API int mt_pool_usage(mt_alloc_t *a, uint32_t id, uint64_t *reserved, uint64_t *allocated);

/* Walks every invariant (segments, blocks, bins, bitmaps, stats). Returns 0 when all hold,
 * otherwise a negative code, after logging the first violation. */
MT_API int mt_alloc_check(mt_alloc_t *a);

/* The last error message (OOM report, config error) of this allocator. Borrowed; valid
 * until the next call that fails. Empty string if none. */
MT_API const char *mt_alloc_last_error(mt_alloc_t *a);

#ifdef __cplusplus
}
#endif
#endif
