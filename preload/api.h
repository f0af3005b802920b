/* Entry points of libmemtrace-preload.so for the program itself (Python's memtrace package
 * calls them through ctypes; see preload/README.md). All are thread-safe; none blocks on
 * another thread's allocations for long. Negative returns are MT_E* codes
 * (memtrace_strerror). */
#ifndef MT_PRELOAD_API_H
#define MT_PRELOAD_API_H

#include <stddef.h>
#include <stdint.h>

#define MT_API_HOOK __attribute__((visibility("default")))
struct CUstream_st;

/* ---- the calling thread's tag: what its allocations are tagged with (0 = "other") ---- */

/* Id of name: a built-in tag ("weights", ...) or a registered user tag; MT_ENOENT. */
MT_API_HOOK int memtrace_tag_lookup(const char *name);
/* Id of name, registering it on every device's allocator if new (1..31 bytes, no control
 * characters, not "tag<N>": else MT_EINVAL). MT_ENOMEM when the 25 user ids are taken. */
MT_API_HOOK int memtrace_tag_register(const char *name);
/* Name of a known id (static or held for the process's life), NULL otherwise. */
MT_API_HOOK const char *memtrace_tag_name(int id);
MT_API_HOOK int memtrace_tag_current(void);
/* Makes id current; returns the previous tag, or MT_EINVAL for an unknown id. */
MT_API_HOOK int memtrace_tag_set(int id);
/* Makes id current, remembering the previous one (at most 256 deep: MT_EOVERFLOW). */
MT_API_HOOK int memtrace_tag_push(int id);
/* Restores the tag current before the last push; MT_EINVAL when nothing was pushed. */
MT_API_HOOK int memtrace_tag_pop(void);
MT_API_HOOK int memtrace_tag_depth(void);

/* ---- marks (through device 0's allocator, with the calling thread's tag) ---- */

/* MT_EV_MARK: mark is an mt_mark_e (MT_MARK_ITERATION: payload = iteration number). */
MT_API_HOOK int memtrace_mark(int mark, uint64_t payload);
/* MT_EV_MARK_NAMED: name cut to 16 bytes at a UTF-8 boundary; MT_EINVAL if empty. */
MT_API_HOOK int memtrace_mark_named(const char *name);

/* ---- statistics and snapshots ---- */

/* Writes {"devices":[<process record per device in use>],"ooms":N,"unknown_frees":N,
 * "host_bytes":N} (docs/telemetry.md) NUL-terminated into buf when it fits. Returns the
 * length it needs without the NUL (>= cap: call again with more room), or MT_E*. */
MT_API_HOOK long memtrace_stats_json(char *buf, size_t cap);
/* Same protocol: a JSON array of snapshot records, one per device in use. */
MT_API_HOOK long memtrace_snapshot_json(char *buf, size_t cap);
MT_API_HOOK int memtrace_reset_peak(void);
/* Zeroes the cumulative statistics (torch.cuda.reset_accumulated_memory_stats). */
MT_API_HOOK int memtrace_reset_accumulated(void);
/* Applies an allocator config string at run time to every device's allocator
 * (torch.cuda.memory._set_allocator_settings); a refusal's reason goes into err. */
MT_API_HOOK int memtrace_set_allocator_settings(const char *conf, char *err, size_t errlen);
/* Returns every unused cached segment of every device to the backend. */
MT_API_HOOK int memtrace_empty_cache(void);
/* Path this library was loaded from (for CUDAPluggableAllocator), or NULL. */
MT_API_HOOK const char *memtrace_library_path(void);
MT_API_HOOK const char *memtrace_strerror(int rc);

/* ---- OOM observers (torch._C._cuda_attach_out_of_memory_observer) ---- */

/* Called once per failed request, on the failing thread, after the allocator has given up
 * and without its lock (an observer may call memtrace_stats_json), before the failing call
 * returns. Bytes: requested, allocated and reserved now, the memory limit and the device's
 * free bytes; message (borrowed for the call) is the OOM report. */
typedef void (*memtrace_oom_cb)(void *ud, int device, uint64_t requested, uint64_t allocated,
                                uint64_t reserved, uint64_t limit, uint64_t free,
                                const char *message);
/* Adds cb (with ud, borrowed until removed) for every device; MT_EBUSY when 8 are. */
MT_API_HOOK int memtrace_add_oom_observer(memtrace_oom_cb cb, void *ud);
/* Removes the (cb, ud) registration; MT_ENOENT if there is none. */
MT_API_HOOK int memtrace_remove_oom_observer(memtrace_oom_cb cb, void *ud);

/* ---- scoped statistics (RMM's push_statistics / pop_statistics) ---- */

/* mt_alloc_scope_stats_t (memtrace/alloc.h), field for field. */
struct memtrace_scope_stats {
    int64_t start_bytes, peak_bytes, current_bytes;
    uint64_t allocated_bytes, freed_bytes, allocations, frees;
};
/* Opens a statistics scope on device's allocator (mt_alloc_stats_push): name (optional) is
 * recorded as a named mark. MT_EOVERFLOW beyond 64 open scopes. */
MT_API_HOOK int memtrace_stats_push(int device, const char *name);
/* Closes device's innermost scope, its figures into *out (may be NULL); MT_EINVAL if none. */
MT_API_HOOK int memtrace_stats_pop(int device, struct memtrace_scope_stats *out);

/* ---- managed memory the drop-in served (cudaMallocManaged, docs/managed-memory.md) ---- */

/* Prefetches [ptr, ptr+size) of a managed block memtrace handed out to location (a device
 * ordinal, or -1: the host) on stream (NULL: the default stream), as cudaMemPrefetchAsync;
 * recorded as a managed event. MT_ENOENT when ptr is in no block of memtrace's, MT_ENOTSUP
 * when the block is not managed, MT_EINVAL for a range beyond the block or a bad location. */
MT_API_HOOK int memtrace_prefetch(void *ptr, size_t size, int location, struct CUstream_st *stream);
/* Applies advice (cudaMemoryAdvise's numbers: 1 set read-mostly ... 6 unset accessed-by)
 * with location to [ptr, ptr+size), as cudaMemAdvise. Errors as memtrace_prefetch's. */
MT_API_HOOK int memtrace_advise(void *ptr, size_t size, int advice, int location);

/* ---- PyTorch's optional CUDAPluggableAllocator entry points ---- */

MT_API_HOOK void memtrace_init(int device_count); /* set_init_fn */
MT_API_HOOK void memtrace_reset(void);            /* set_reset_fn: empty_cache */
MT_API_HOOK void memtrace_memory_fraction(double fraction, int device); /* set_memory_fraction_fn */
MT_API_HOOK void *memtrace_base_alloc(void *ptr, size_t *size);         /* set_base_alloc_fn */
MT_API_HOOK void memtrace_record_stream(void *ptr, struct CUstream_st *stream);
/* torch's MempoolId_t, a std::pair<unsigned long long, unsigned long long> passed by value
 * (two integer registers, as this struct). */
typedef struct memtrace_mempool_id {
    unsigned long long first, second;
} memtrace_mempool_id_t;
/* set_begin_allocate_to_pool: the next capture on device allocates from pool (made on
 * first use; a pool torch shares between graphs is reused). filter is torch's
 * std::function (passed by reference), which C cannot call: memtrace asks the driver which
 * stream is capturing instead (preload/hooks_graph.c). */
MT_API_HOOK void memtrace_begin_allocate_to_pool(int device, memtrace_mempool_id_t pool,
                                                 void *filter);
/* set_end_allocate_to_pool_fn: the capture into pool ended (torch calls it right after
 * cudaStreamEndCapture). */
MT_API_HOOK void memtrace_end_allocate_to_pool(int device, memtrace_mempool_id_t pool);
/* set_release_pool: a graph using pool was reset; the pool goes back to the device once
 * no graph uses it and its blocks are free. */
MT_API_HOOK void memtrace_release_pool(int device, memtrace_mempool_id_t pool);

#endif
