/* memtrace device backends: the raw device the caching allocator sits on.
 *
 * Two implementations behind one seam: "cuda" (CUDA runtime + driver, loaded at run
 * time) and "sim" (host memory posing as a device of fixed capacity, with real
 * asynchronous streams on worker threads). Every call here is a *backend call*: slow,
 * possibly synchronising, and counted in mt_backend_counters_t. The caching allocator
 * exists so that mt_backend_malloc/free are called almost never.
 *
 * Thread-safety: every function may be called from any thread. A stream is a FIFO:
 * work queued on one stream runs in order; work on different streams is unordered
 * unless joined with events. */
#ifndef MEMTRACE_BACKEND_H
#define MEMTRACE_BACKEND_H

#include <stdbool.h>
#include "memtrace/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_backend_s mt_backend_t;
/* Streams and events are opaque handles owned by the backend that created them.
 * A NULL stream is the device's default stream. On sim it is a plain FIFO stream with
 * no implicit barrier against other streams (the semantics of cudaStreamPerThread);
 * order work across streams with events. */
typedef struct mt_stream_s mt_stream_t;
typedef struct mt_event_s mt_event_t;

typedef enum mt_backend_kind_e {
    MT_BACKEND_AUTO = 0, /* cuda when a device answers, otherwise sim (and say so once) */
    MT_BACKEND_SIM = 1,
    MT_BACKEND_CUDA = 2,
} mt_backend_kind_e;

typedef enum mt_memcpy_kind_e {
    MT_MEMCPY_HOST_TO_HOST = 0,
    MT_MEMCPY_HOST_TO_DEVICE = 1,
    MT_MEMCPY_DEVICE_TO_HOST = 2,
    MT_MEMCPY_DEVICE_TO_DEVICE = 3,
    MT_MEMCPY_DEFAULT = 4, /* inferred from the pointers (unified addressing) */
} mt_memcpy_kind_e;

typedef struct mt_backend_cfg_s {
    mt_backend_kind_e kind;      /* auto; mt_backend_cfg_from_env: MEMTRACE_BACKEND */
    int device;                  /* device ordinal, >= 0 */
    size_t sim_capacity;         /* bytes; 0 = 8 GiB (MEMTRACE_SIM_CAPACITY) */
    uint64_t sim_malloc_cost_ns; /* modelled cost of one segment malloc on sim, ns;
                                  * UINT64_MAX = 20000 (MEMTRACE_SIM_MALLOC_COST_NS) */
    uint64_t sim_free_cost_ns;   /* the same for free (a device free synchronises), ns */
    mt_log_cb log;               /* optional diagnostics sink */
    void *log_ud;                /* passed to log */
    /* Several sim devices (one group sharing events; each with sim_capacity bytes). */
    int sim_devices;             /* 0 = 1 (MEMTRACE_SIM_DEVICES); at most 64 */
    uint64_t sim_peer_cost_ns;   /* fixed cost of one peer copy on its stream, ns;
                                  * UINT64_MAX = 10000 (MEMTRACE_SIM_PEER_COST_NS) */
    uint64_t sim_peer_bandwidth; /* peer copy bytes per second; 0 = 12 GiB/s
                                  * (MEMTRACE_SIM_PEER_BANDWIDTH) */
    size_t sim_context;          /* bytes each sim device's modelled CUDA context holds from the
                                  * start (used, never free; < capacity); 0
                                  * (MEMTRACE_SIM_CONTEXT) */
    int cuda_handle_type;        /* mt_cuda_handle_e: what expandable segments' pages are made
                                  * shareable as (PyTorch's IPC of expandable segments asks for
                                  * POSIX fds); none (MEMTRACE_CUDA_HANDLE_TYPE:
                                  * none|posix_fd|fabric) */
    size_t sim_other_processes;  /* bytes other processes hold on each sim device from the
                                  * start (used, not this process's; context + this <
                                  * capacity); 0 (MEMTRACE_SIM_OTHER_PROCESSES) */
    size_t sim_va_space;         /* bytes of device address space each sim device's
                                  * reservations (mt_backend_vm_reserve) may hold at once;
                                  * 0 = unbounded. A real GPU has 2^47-2^49 bytes of it. */
    int cuda_peer_access;        /* mt_cuda_peer_e: which other devices an expandable
                                  * segment's pages are opened to; auto
                                  * (MEMTRACE_CUDA_PEER_ACCESS: enabled|capable) */
} mt_backend_cfg_t;

#define MT_SIM_MAX_DEVICES 64

typedef enum mt_cuda_handle_e {
    MT_CUDA_HANDLE_NONE = 0,
    MT_CUDA_HANDLE_POSIX_FD = 1,
    MT_CUDA_HANDLE_FABRIC = 2,
} mt_cuda_handle_e;

/* Expandable segments are VMM mappings, which a peer device reaches only when named in
 * cuMemSetAccess, whatever cuCtxEnablePeerAccess said. */
typedef enum mt_cuda_peer_e {
    MT_CUDA_PEER_AUTO = 0,    /* enabled; the drop-in picks capable when it cannot see the
                               * program's peer calls (the pluggable allocator alone) */
    MT_CUDA_PEER_ENABLED = 1, /* the devices given mt_backend_enable_peer_access */
    MT_CUDA_PEER_CAPABLE = 2, /* also every device cuDeviceCanAccessPeer says can reach it */
} mt_cuda_peer_e;

/* Calls made to the backend since creation. Monotonic counters. */
typedef struct mt_backend_counters_s {
    uint64_t malloc_calls;    /* mt_backend_malloc, successful or not */
    uint64_t malloc_failures; /* of which failed (out of memory) */
    uint64_t free_calls;
    uint64_t vm_reserve_calls; /* virtual address range reservations */
    uint64_t vm_release_calls;
    uint64_t vm_map_calls; /* physical pages created and mapped */
    uint64_t vm_unmap_calls;
    uint64_t memcpy_calls;
    uint64_t memset_calls;
    uint64_t stream_creates;
    uint64_t event_records;
    uint64_t event_queries;
    uint64_t event_syncs;
    uint64_t stream_syncs;
    uint64_t device_syncs;
    uint64_t mem_get_info_calls;
    uint64_t modelled_ns; /* modelled time spent in malloc/free (sim), ns */
    uint64_t peer_copies; /* mt_memcpy_peer_async calls queued on this device's streams */
    uint64_t peer_bytes;  /* bytes they moved */
    uint64_t peer_ns;     /* modelled time their streams spent on them (sim), ns */
} mt_backend_counters_t;

/* Defaults (no environment read). The variable named at a field is what
 * mt_backend_cfg_from_env applies to it. */
MT_API mt_backend_cfg_t mt_backend_cfg_default(void);

/* Applies MEMTRACE_BACKEND (auto|sim|cuda), MEMTRACE_SIM_CAPACITY (bytes, K/M/G/T
 * suffixes, > 0), MEMTRACE_SIM_MALLOC_COST_NS, MEMTRACE_SIM_FREE_COST_NS,
 * MEMTRACE_SIM_DEVICES (decimal, 1..MT_SIM_MAX_DEVICES), MEMTRACE_SIM_PEER_COST_NS and
 * MEMTRACE_SIM_PEER_BANDWIDTH (bytes/s, K/M/G/T suffixes, > 0), MEMTRACE_SIM_CONTEXT,
 * MEMTRACE_SIM_OTHER_PROCESSES and MEMTRACE_CUDA_HANDLE_TYPE to cfg.
 * Returns 0, or MT_EINVAL with err naming the first malformed variable and its value
 * (the well-formed ones are still applied). Unset or empty variables change nothing. */
MT_API int mt_backend_cfg_from_env(mt_backend_cfg_t *cfg, char *err, size_t errlen);

/* Creates a backend. *out is new. With MT_BACKEND_AUTO this falls back to sim when no
 * CUDA device answers and logs one MT_LOG_INFO line naming the backend in use.
 * Returns MT_ENODEV if MT_BACKEND_CUDA is asked for and no device answers. On sim, all
 * sim_devices devices are created and *out is device cfg->device (MT_EINVAL, logged, if
 * out of range); the others are reached with mt_backend_get_device. Reads no environment
 * of its own: cfg says what is made (a field left 0 takes mt_backend_cfg_default's value). */
MT_API int mt_backend_create(mt_backend_t **out, const mt_backend_cfg_t *cfg);
/* Synchronises every stream, then releases everything. Sets *p = NULL. */
MT_API void mt_backend_destroy(mt_backend_t **p);

/* Devices reachable from b with mt_backend_get_device (cuda: the driver's device count;
 * a device's primary context is retained when it is first reached, not before). */
MT_API int mt_backend_device_count(const mt_backend_t *b);
/* *out = the handle of device `ordinal` of b's group (b itself for b's own ordinal).
 * Borrowed: valid until the handle returned by mt_backend_create is destroyed, which
 * destroys every device of the group; mt_backend_destroy on a borrowed handle does
 * nothing. MT_EINVAL (logged with the ordinal and the device count) when out of range. */
MT_API int mt_backend_get_device(mt_backend_t *b, int ordinal, mt_backend_t **out);
/* Device b may read and write the memory of device `peer` (cudaDeviceEnablePeerAccess
 * from b's device). On cuda this also grants b's device access to every page peer's
 * expandable segments map, now and later, which the runtime call does not cover. No-op
 * for peer == b's own ordinal and on sim. MT_EINVAL (logged) when peer is out of range. */
MT_API int mt_backend_enable_peer_access(mt_backend_t *b, int peer);

/* "sim" or "cuda". Static string. */
MT_API const char *mt_backend_name(const mt_backend_t *b);
MT_API mt_backend_kind_e mt_backend_kind(const mt_backend_t *b);
MT_API int mt_backend_device(const mt_backend_t *b);
MT_API void mt_backend_counters(const mt_backend_t *b, mt_backend_counters_t *out);

/* ---- device memory ---- */

/* Allocates size bytes of device memory, aligned to at least 512 bytes. Synchronous.
 * Returns MT_ENOMEM when the device cannot hold it. */
MT_API int mt_backend_malloc(mt_backend_t *b, size_t size, void **out);
/* Frees memory from mt_backend_malloc. Synchronises the device first (as cudaFree does).
 * Returns MT_ENOENT for a pointer the backend did not hand out. */
MT_API int mt_backend_free(mt_backend_t *b, void *ptr);
/* Free and total device bytes, as cudaMemGetInfo reports them. */
MT_API int mt_backend_mem_get_info(mt_backend_t *b, size_t *free_bytes, size_t *total_bytes);
/* The device bytes this process holds, as the driver counts them per process (NVML's
 * compute-process figure on cuda, where libnvidia-ml.so.1 loads and lists this pid; the
 * model's on sim: everything but other processes'), in *bytes. MT_ENOTSUP when it cannot be
 * known (no NVML, a pid namespace NVML does not see into). docs/outside.md. */
MT_API int mt_backend_process_used(mt_backend_t *b, uint64_t *bytes);
/* True if ptr lies inside memory this backend manages as device memory. */
MT_API bool mt_backend_is_device_ptr(const mt_backend_t *b, const void *ptr);

/* ---- virtual memory (expandable segments) ---- */

/* Granularity of vm_reserve/vm_map sizes and addresses, bytes (2 MiB on both backends). */
MT_API size_t mt_backend_vm_granularity(const mt_backend_t *b);
/* Reserves an address range with no physical memory behind it. */
MT_API int mt_backend_vm_reserve(mt_backend_t *b, size_t size, void **out);
/* Releases a reserved range; every page in it must be unmapped first. */
MT_API int mt_backend_vm_release(mt_backend_t *b, void *base, size_t size);
/* Creates physical memory for [addr, addr+size) inside a reserved range and maps it
 * read/write (cuMemCreate + cuMemMap + cuMemSetAccess). MT_ENOMEM at capacity. */
MT_API int mt_backend_vm_map(mt_backend_t *b, void *addr, size_t size);
/* Unmaps and frees the physical memory of [addr, addr+size). Caller synchronised first. */
MT_API int mt_backend_vm_unmap(mt_backend_t *b, void *addr, size_t size);

/* ---- streams ---- */

MT_API int mt_stream_create(mt_backend_t *b, mt_stream_t **out);
/* Waits for the stream's queued work, then destroys it. Sets *s = NULL. */
MT_API void mt_stream_destroy(mt_backend_t *b, mt_stream_t **s);
MT_API int mt_stream_synchronize(mt_backend_t *b, mt_stream_t *s);
/* Work queued on s after this call starts only after ev has completed. ev may belong to
 * another device of b's group (as cudaStreamWaitEvent allows). */
MT_API int mt_stream_wait_event(mt_backend_t *b, mt_stream_t *s, mt_event_t *ev);
/* A small stable id for telemetry: 0 for the default stream, 1, 2, ... in creation order. */
MT_API uint32_t mt_stream_id(const mt_stream_t *s);
/* Queues fn(ud) on the stream; it runs after all earlier work on s (cudaLaunchHostFunc).
 * fn must not call back into the backend's stream functions. */
MT_API int mt_stream_launch_host_func(mt_backend_t *b, mt_stream_t *s, void (*fn)(void *ud),
                                      void *ud);

MT_API int mt_memcpy_async(mt_backend_t *b, void *dst, const void *src, size_t n,
                           mt_memcpy_kind_e kind, mt_stream_t *s);
MT_API int mt_memset_async(mt_backend_t *b, void *dst, int value, size_t n, mt_stream_t *s);
/* Copies n bytes from device memory of src_device to device memory of dst_device
 * (cudaMemcpyPeerAsync), queued on s, a stream of b (NULL: b's default stream); b is any
 * device of the group. Later work on s runs after the copy; other streams order against
 * it with events, across devices too. On sim the stream spends sim_peer_cost_ns +
 * n / sim_peer_bandwidth on it. MT_EINVAL (logged) for an ordinal out of range or a
 * span that is not live memory of the device named. */
MT_API int mt_memcpy_peer_async(mt_backend_t *b, void *dst, int dst_device, const void *src,
                                int src_device, size_t n, mt_stream_t *s);
/* Synchronous copy: queues on the default stream and waits for it. */
MT_API int mt_memcpy(mt_backend_t *b, void *dst, const void *src, size_t n, mt_memcpy_kind_e kind);
MT_API int mt_device_synchronize(mt_backend_t *b);

/* ---- events ---- */

/* An event for ordering streams. On cuda its timing is disabled (mt_event_time_ns gives
 * 0); mt_event_create_timed makes one that carries a time. */
MT_API int mt_event_create(mt_backend_t *b, mt_event_t **out);
MT_API int mt_event_create_timed(mt_backend_t *b, mt_event_t **out);
MT_API void mt_event_destroy(mt_backend_t *b, mt_event_t **ev);
/* Captures the work queued on s so far; the event completes when s reaches it. ev and s
 * must be b's (MT_EINVAL otherwise, as CUDA refuses a stream of another device). */
MT_API int mt_event_record(mt_backend_t *b, mt_event_t *ev, mt_stream_t *s);
/* 0 if complete (or never recorded), MT_EAGAIN if still pending. Never blocks. */
MT_API int mt_event_query(mt_backend_t *b, mt_event_t *ev);
MT_API int mt_event_synchronize(mt_backend_t *b, mt_event_t *ev);
/* Monotonic time (ns) at which the stream reached the event; 0 if not yet complete or
 * made by mt_event_create on cuda.
 * Used by tests and benchmarks to prove overlap between streams. */
MT_API uint64_t mt_event_time_ns(mt_backend_t *b, mt_event_t *ev);

/* ---- pinned host memory (page-locked; cudaHostAlloc on cuda) ---- */

MT_API int mt_backend_host_malloc(mt_backend_t *b, size_t size, void **out);
/* The same with cudaHostAlloc's flags (portable 1, mapped 2, write-combined 4; others are
 * MT_EINVAL), passed to the driver on cuda (portable is always added), ignored on sim. */
#define MT_HOST_ALLOC_FLAGS 7u
MT_API int mt_backend_host_malloc_flags(mt_backend_t *b, size_t size, unsigned flags, void **out);
MT_API int mt_backend_host_free(mt_backend_t *b, void *ptr);

/* ---- the device's stream-ordered pool (cudaMallocAsync) ----
 * Each device has one pool (the driver's default pool on cuda; a model of it on sim,
 * docs/allocator-async.md). A block freed on stream s is reused at once on s, and on
 * another stream once the free is ordered before it (s reached the free, or the other
 * stream waits on an event recorded on s after the free). At a stream, event or device
 * synchronize the pool gives back to the device what it holds unused above its release
 * threshold (0 by default, as the driver's). MT_ENOTSUP from a backend without a pool. */

typedef struct mt_pool_usage_s {
    uint64_t reserved;      /* bytes the pool holds from the device (RESERVED_MEM_CURRENT) */
    uint64_t used;          /* bytes of its live allocations (USED_MEM_CURRENT) */
    uint64_t reserved_high; /* highest reserved since creation or mt_backend_pool_reset_high */
    uint64_t used_high;     /* highest used likewise */
} mt_pool_usage_t;

/* cudaMallocAsync on s (NULL: the default stream). MT_ENOMEM when the device cannot give
 * the pool more, after the pool gave back what it could. */
MT_API int mt_backend_malloc_async(mt_backend_t *b, size_t size, mt_stream_t *s, void **out);
/* cudaFreeAsync: the block returns to the pool when s reaches this point. NULL is a no-op. */
MT_API int mt_backend_free_async(mt_backend_t *b, void *ptr, mt_stream_t *s);
/* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, bytes; UINT64_MAX keeps everything (PyTorch's). */
MT_API int mt_backend_pool_set_release_threshold(mt_backend_t *b, uint64_t bytes);
/* cuMemPoolTrimTo: gives back unused memory whose frees completed until the pool holds
 * at most keep bytes (or nothing more can go). */
MT_API int mt_backend_pool_trim_to(mt_backend_t *b, size_t keep);
MT_API int mt_backend_pool_usage(mt_backend_t *b, mt_pool_usage_t *out);
/* The high-water marks restart from the current values (PyTorch's resetPeakStats). */
MT_API int mt_backend_pool_reset_high(mt_backend_t *b);
/* ---- managed (unified) memory: cudaMallocManaged, docs/managed-memory.md ---- */

/* The location of a prefetch or of an advice: a device ordinal, or the host (the value
 * of cudaCpuDeviceId). */
#define MT_MANAGED_HOST (-1)

/* cudaMemAdvise's advice, with the driver's numbers (CUmem_advise). */
typedef enum mt_managed_advice_e {
    MT_ADVISE_SET_READ_MOSTLY = 1, /* reads make copies where they run; a write collapses them */
    MT_ADVISE_UNSET_READ_MOSTLY = 2,
    MT_ADVISE_SET_PREFERRED_LOCATION = 3, /* pages stay at location; others map them */
    MT_ADVISE_UNSET_PREFERRED_LOCATION = 4,
    MT_ADVISE_SET_ACCESSED_BY = 5, /* location keeps a mapping: its accesses do not migrate */
    MT_ADVISE_UNSET_ACCESSED_BY = 6,
} mt_managed_advice_e;

/* Managed memory of one device as its backend sees it. On sim every figure is modelled;
 * on cuda the driver does not report residency or faults, so device_bytes, host_bytes,
 * faults and the migration figures stay 0 and only the calls made are counted. */
typedef struct mt_managed_stats_s {
    uint64_t managed_bytes;     /* live managed allocations, bytes as accounted */
    uint64_t device_bytes;      /* resident on the device now (read-mostly copies too) */
    uint64_t host_bytes;        /* resident on the host now (read-mostly copies too) */
    uint64_t peak_device_bytes; /* highest device_bytes since creation */
    uint64_t faults;            /* page faults that migrated or copied a page */
    uint64_t bytes_to_device;   /* migrated or copied host -> device, faults and prefetches */
    uint64_t bytes_to_host;     /* migrated device -> host, evictions included */
    uint64_t evicted_bytes;     /* of bytes_to_host: pushed out to make room on the device */
    uint64_t remote_accesses;   /* accesses served through a mapping, without migration */
    uint64_t prefetches;        /* prefetch calls */
    uint64_t prefetch_bytes;    /* bytes they asked for */
    uint64_t advises;           /* advise calls */
    uint64_t migrate_ns;        /* modelled time spent migrating (sim), ns */
} mt_managed_stats_t;

/* Allocates size bytes of managed memory (cudaMallocManaged, attached globally), reachable
 * from the host and every device. Its pages start on the host and move on access (sim:
 * 2 MiB pages; docs/managed-memory.md). MT_ENOTSUP when the backend has no managed memory
 * (a driver without the entry points), MT_ENOMEM when it cannot be had. */
MT_API int mt_backend_managed_malloc(mt_backend_t *b, size_t size, void **out);
/* Frees memory from mt_backend_managed_malloc (synchronises the device first, as cudaFree
 * does). MT_ENOENT for a pointer that is not the start of a live managed allocation. */
MT_API int mt_backend_managed_free(mt_backend_t *b, void *ptr);
/* Migrates the pages of [ptr, ptr+n) to location (a device ordinal of b's group, or
 * MT_MANAGED_HOST) when stream s (NULL: default) reaches this point: later work on s finds
 * them there (cudaMemPrefetchAsync). The range must lie inside one managed allocation
 * (MT_EINVAL otherwise). */
MT_API int mt_backend_managed_prefetch(mt_backend_t *b, const void *ptr, size_t n, int location,
                                       mt_stream_t *s);
/* Applies advice (mt_managed_advice_e) with location to the pages of [ptr, ptr+n)
 * (cudaMemAdvise). The range must lie inside one managed allocation (MT_EINVAL otherwise);
 * location is ignored by the read-mostly advice. */
MT_API int mt_backend_managed_advise(mt_backend_t *b, const void *ptr, size_t n, int advice,
                                     int location);
/* The managed memory figures of b's device. */
MT_API int mt_backend_managed_stats(mt_backend_t *b, mt_managed_stats_t *out);
/* True if [ptr, ptr+n) lies inside one live managed allocation of b. */
MT_API bool mt_backend_is_managed(const mt_backend_t *b, const void *ptr, size_t n);

#ifdef __cplusplus
}
#endif
#endif
