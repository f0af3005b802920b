/* memtrace host side: pinned host cache, batch prefetcher, parameter pager.
 *
 * Pinned host cache (mt_host_*): a caching allocator for page-locked host memory
 * (cudaHostAlloc on the cuda backend; page-aligned host pages on sim). It IS the caching
 * allocator of alloc.h, run over a "host view" of the device backend, so it has the same
 * policies, statistics and snapshot, and its events carry pool MT_POOL_HOST. Discipline:
 * the CPU owns every pinned block; each stream that reads or writes a block must be
 * declared with mt_host_record_stream. When such a block is freed it is not handed out
 * again until the work queued on those streams up to the free has run, so a block the CPU
 * receives from mt_host_malloc may be written at once.
 *
 * Prefetcher (mt_prefetch_*): a loader with `depth` (>= 2) device batch buffers. Batch
 * k+1 is copied host -> device on a side stream while batch k is in use on the compute
 * stream; the compute stream waits on the copy's event before using a batch, and a buffer
 * is overwritten only after the compute stream's "done with it" event. Nothing waits for
 * the whole device.
 *
 * Parameter pager (mt_param_pager_*): T per-task parameter sets (float32, equal sizes) live
 * in pinned host memory; activating task t brings its set to the device from a small
 * device-resident LRU cache; gradients produced on the device are accumulated into the
 * task's host gradient copy on deactivate, asynchronously.
 *
 * Activation offload is an option of the RNN engine (memtrace/rnn.h: mt_rnn_cfg_t
 * offload_window / offload_host, mt_rnn_set_offload): older chunks of a training pass's
 * reserve go to this cache's pinned memory on a side stream and come back ahead of need.
 *
 * Thread-safety: the host cache is safe from any thread (one allocator mutex). A prefetcher
 * or a pager is used by one thread at a time. */
#ifndef MEMTRACE_HOST_H
#define MEMTRACE_HOST_H

#include <stdbool.h>
#include "memtrace/alloc.h"
#include "memtrace/rnn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- pinned host cache ---- */

typedef struct mt_host_cache_s mt_host_cache_t;

typedef struct mt_host_cfg_s {
    mt_backend_t *backend;       /* borrowed, required: the device whose streams copy */
    size_t capacity;             /* bytes the cache may pin; 0 = half the physical memory */
    size_t max_split_size;       /* as in mt_alloc_cfg_t; SIZE_MAX = unlimited */
    const mt_event_sink_t *sink; /* borrowed, optional; events say pool MT_POOL_HOST */
    mt_log_cb log;               /* optional */
    void *log_ud;
} mt_host_cfg_t;

MT_API mt_host_cfg_t mt_host_cfg_default(void);
/* *out is new. */
MT_API int mt_host_cache_create(mt_host_cache_t **out, const mt_host_cfg_t *cfg);
/* Waits for pending copies, releases every pinned page. Sets *p = NULL. */
MT_API void mt_host_cache_destroy(mt_host_cache_t **p);

/* Allocates size bytes of pinned host memory tagged tag. The CPU may write it at once. */
MT_API int mt_host_malloc(mt_host_cache_t *h, size_t size, int tag, void **out);
/* Frees a pinned block; it is reused only after the work queued so far on every stream
 * recorded for it has run. MT_ENOENT for a pointer the cache did not hand out. */
MT_API int mt_host_free(mt_host_cache_t *h, void *ptr);
/* Declares that work queued on stream (NULL = default stream) reads or writes ptr. */
MT_API int mt_host_record_stream(mt_host_cache_t *h, void *ptr, mt_stream_t *stream);
/* The caching allocator behind the cache (borrowed): stats, snapshot, check, tags. Do not
 * call mt_alloc_malloc on it directly (use mt_host_malloc: blocks belong to the CPU). */
MT_API mt_alloc_t *mt_host_cache_alloc(mt_host_cache_t *h);
/* The device backend the cache was created over (borrowed). */
MT_API mt_backend_t *mt_host_cache_device(const mt_host_cache_t *h);
/* Bytes of pinned memory held from the backend (segments), now. */
MT_API size_t mt_host_cache_pinned_bytes(mt_host_cache_t *h);

/* ---- prefetcher (U3) ---- */

typedef struct mt_prefetch_s mt_prefetch_t;

/* Writes the batch for `index` into the pinned staging buffer dst (bytes long).
 * Returns 0 or a negative code, which the submit call returns. */
typedef int (*mt_prefetch_fill_fn)(void *ud, uint64_t index, void *dst, size_t bytes);

typedef struct mt_prefetch_cfg_s {
    mt_alloc_t *alloc;     /* borrowed, required: device allocator (batch buffers) */
    mt_host_cache_t *host; /* borrowed, required: pinned staging */
    mt_stream_t *compute;  /* borrowed: the stream that consumes batches (NULL = default) */
    size_t batch_bytes;    /* capacity of one device batch buffer, > 0 */
    unsigned depth;        /* device buffers, >= 2 (2 = double buffering); 2 */
    bool overlap;          /* true: copies on a side stream (default); false: copies are
                            * queued on the compute stream (the serial baseline) */
} mt_prefetch_cfg_t;

/* One device batch handed to the consumer. data points into the prefetcher's device
 * buffer; it is valid for work queued on the compute stream until mt_prefetch_release. */
typedef struct mt_prefetch_batch_s {
    uint64_t index; /* submission order, 0, 1, ... */
    void *data;     /* device memory */
    size_t bytes;   /* bytes copied for this batch */
    unsigned slot;  /* buffer it lives in, < depth */
} mt_prefetch_batch_t;

typedef struct mt_prefetch_stats_s {
    uint64_t submitted;
    uint64_t consumed; /* batches released */
    uint64_t bytes_copied;
} mt_prefetch_stats_t;

MT_API mt_prefetch_cfg_t mt_prefetch_cfg_default(void);
/* Allocates the device buffers (tag MT_TAG_BATCH) and, with overlap, the side stream. */
MT_API int mt_prefetch_create(mt_prefetch_t **out, const mt_prefetch_cfg_t *cfg);
/* Waits for the prefetcher's queued copies, frees its buffers. Sets *p = NULL. */
MT_API void mt_prefetch_destroy(mt_prefetch_t **p);

/* Queues the next batch from bytes of host memory at src (any host memory: it is copied
 * into a pinned staging block first; src may be reused on return). MT_EBUSY when all
 * `depth` buffers hold batches not yet released; MT_EINVAL if bytes > batch_bytes. */
MT_API int mt_prefetch_submit(mt_prefetch_t *p, const void *src, size_t bytes);
/* The same, with fill writing the batch straight into the pinned staging block. */
MT_API int mt_prefetch_submit_fill(mt_prefetch_t *p, size_t bytes, mt_prefetch_fill_fn fill,
                                   void *ud);
/* Hands out the oldest submitted batch: work queued on the compute stream after this call
 * sees its copy completed. Never blocks the host. MT_ENOENT if nothing was submitted. */
MT_API int mt_prefetch_next(mt_prefetch_t *p, mt_prefetch_batch_t *out);
/* For consumers that compute on the calling thread (the engine's CPU path on sim): blocks
 * the host until batch b's copy has completed (that one copy's event, nothing else). */
MT_API int mt_prefetch_wait(mt_prefetch_t *p, const mt_prefetch_batch_t *b);
/* Says the compute stream's work queued so far is the last use of batch b. A host consumer
 * calls it once it has finished reading b. */
MT_API int mt_prefetch_release(mt_prefetch_t *p, const mt_prefetch_batch_t *b);
/* A view of [offset, offset + bytes) of a batch (no copy). MT_EINVAL if out of range. */
MT_API int mt_prefetch_slice(const mt_prefetch_batch_t *b, size_t offset, size_t bytes, void **out);
/* Stream timestamps (mt_event_time_ns) of the copy of batch `index`, start and end.
 * MT_EAGAIN if it has not run yet, MT_ENOENT once its buffer was reused. */
MT_API int mt_prefetch_copy_times(mt_prefetch_t *p, uint64_t index, uint64_t *start_ns,
                                  uint64_t *end_ns);
/* The stream the copies run on (the compute stream without overlap). Borrowed. */
MT_API mt_stream_t *mt_prefetch_copy_stream(const mt_prefetch_t *p);
MT_API void mt_prefetch_stats(const mt_prefetch_t *p, mt_prefetch_stats_t *out);

/* ---- parameter pager (U5) ---- */

typedef struct mt_param_pager_s mt_param_pager_t;

typedef struct mt_param_pager_cfg_s {
    mt_alloc_t *alloc;     /* borrowed, required: device allocator */
    mt_host_cache_t *host; /* borrowed, required: pinned host copies and staging */
    mt_stream_t *compute;  /* borrowed: stream that computes on the active set */
    unsigned ntasks;       /* T >= 1 */
    size_t nparams;        /* floats per task set, >= 1 */
    unsigned cache_sets;   /* task sets the device may hold at once, >= 1; 2 */
    /* Registers a free-memory callback with alloc (mt_alloc_add_free_callback): when a
     * request of the program finds no cached block and the device has not enough free
     * memory for it, resident sets that are not in use (neither active nor being
     * activated) are evicted, least recently used first, rather than the request failing.
     * The callback runs on the allocating thread: with this on, allocate from alloc only on
     * the thread that uses the pager. false. */
    bool release_under_pressure;
} mt_param_pager_cfg_t;

typedef struct mt_param_pager_stats_s {
    uint64_t activations;
    uint64_t hits;               /* activations that found the set resident */
    uint64_t uploads;            /* host -> device set copies */
    uint64_t evictions;          /* all evictions, pressure_evictions included */
    uint64_t pressure_evictions; /* sets given back to a request that did not fit */
    uint64_t writebacks;         /* gradient copies accumulated into host copies */
    unsigned resident;           /* sets on the device now */
    unsigned max_resident;       /* highest resident since creation */
} mt_param_pager_stats_t;

MT_API mt_param_pager_cfg_t mt_param_pager_cfg_default(void);
/* Allocates T pinned parameter and gradient copies (zeroed) and the side stream. */
MT_API int mt_param_pager_create(mt_param_pager_t **out, const mt_param_pager_cfg_t *cfg);
/* Waits for the pager's queued copies and write-backs, frees everything. Sets *p = NULL. */
MT_API void mt_param_pager_destroy(mt_param_pager_t **p);

/* Pinned host copies of task t (nparams floats each), borrowed. Before the CPU touches
 * them, call mt_param_pager_host_wait; after changing params, mt_param_pager_host_modified. */
MT_API int mt_param_pager_host(mt_param_pager_t *p, unsigned task, float **params, float **grads);
/* Waits (host side, on this task's events only) until no queued copy reads the task's
 * host params and every queued gradient write-back of the task has landed. */
MT_API int mt_param_pager_host_wait(mt_param_pager_t *p, unsigned task);
/* The host params of t changed: a device-resident copy is dropped (uploaded again later). */
MT_API int mt_param_pager_host_modified(mt_param_pager_t *p, unsigned task);
/* Starts bringing t's set to the device on the side stream (evicting the least recently
 * used set that is not active), so a later activate finds it resident. */
MT_API int mt_param_pager_prefetch(mt_param_pager_t *p, unsigned task);
/* Makes t the active task: *params (device, nparams floats) holds its set for work queued
 * on the compute stream from now on, *grads (device) is zeroed for it. One task is active
 * at a time: MT_EBUSY if another is. */
MT_API int mt_param_pager_activate(mt_param_pager_t *p, unsigned task, float **params,
                                   float **grads);
/* Ends t's activation: after the compute stream's work queued so far, its device gradients
 * are copied back and added into its host gradient copy (on the side stream). */
MT_API int mt_param_pager_deactivate(mt_param_pager_t *p, unsigned task);
MT_API void mt_param_pager_stats(const mt_param_pager_t *p, mt_param_pager_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif
