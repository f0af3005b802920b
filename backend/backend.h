/* The backend seam: one small vtable that backend.c dispatches through (counting every
 * call), implemented by backend_sim.c and backend_cuda.c. Public entry points and their
 * contracts are in include/memtrace/backend.h; ops here have the same contracts minus
 * argument checking and counting, which backend.c does once for all backends. */
#ifndef MT_ALLOCATOR_BACKEND_H
#define MT_ALLOCATOR_BACKEND_H

#include <stdatomic.h>
#include "memtrace/backend.h"

typedef struct mt_backend_ops_s {
    const char *name;
    mt_backend_kind_e kind;
    void (*destroy)(mt_backend_t *b);

    int (*malloc)(mt_backend_t *b, size_t size, void **out);
    int (*free)(mt_backend_t *b, void *ptr);
    int (*mem_get_info)(mt_backend_t *b, size_t *free_bytes, size_t *total_bytes);
    bool (*is_device_ptr)(const mt_backend_t *b, const void *ptr);

    size_t (*vm_granularity)(const mt_backend_t *b);
    int (*vm_reserve)(mt_backend_t *b, size_t size, void **out);
    int (*vm_release)(mt_backend_t *b, void *base, size_t size);
    int (*vm_map)(mt_backend_t *b, void *addr, size_t size);
    int (*vm_unmap)(mt_backend_t *b, void *addr, size_t size);

    int (*stream_create)(mt_backend_t *b, mt_stream_t **out);
    void (*stream_destroy)(mt_backend_t *b, mt_stream_t *s);
    int (*stream_synchronize)(mt_backend_t *b, mt_stream_t *s);
    int (*stream_wait_event)(mt_backend_t *b, mt_stream_t *s, mt_event_t *ev);
    int (*launch_host_func)(mt_backend_t *b, mt_stream_t *s, void (*fn)(void *), void *ud);
    int (*memcpy_async)(mt_backend_t *b, void *dst, const void *src, size_t n,
                        mt_memcpy_kind_e kind, mt_stream_t *s);
    int (*memset_async)(mt_backend_t *b, void *dst, int value, size_t n, mt_stream_t *s);
    int (*device_synchronize)(mt_backend_t *b);

    int (*event_create)(mt_backend_t *b, mt_event_t **out);
    void (*event_destroy)(mt_backend_t *b, mt_event_t *ev);
    int (*event_record)(mt_backend_t *b, mt_event_t *ev, mt_stream_t *s);
    int (*event_query)(mt_backend_t *b, mt_event_t *ev);
    int (*event_synchronize)(mt_backend_t *b, mt_event_t *ev);
    uint64_t (*event_time_ns)(mt_backend_t *b, mt_event_t *ev);

    int (*host_malloc)(mt_backend_t *b, size_t size, void **out);
    int (*host_free)(mt_backend_t *b, void *ptr);
    /* Optional (NULL: one device, b itself). Ordinals are checked by backend.c. */
    int (*device_count)(const mt_backend_t *b);
    mt_backend_t *(*get_device)(mt_backend_t *b, int ordinal);
    /* Optional (NULL: MT_ENOTSUP). Counts peer_copies/peer_bytes/peer_ns itself. */
    int (*memcpy_peer_async)(mt_backend_t *b, void *dst, int dst_device, const void *src,
                             int src_device, size_t n, mt_stream_t *s);
    /* Optional (NULL: nothing to do, as on sim). peer is a checked ordinal != b's. */
    int (*enable_peer_access)(mt_backend_t *b, int peer);
    /* Optional (NULL: event_create, whose events already carry a time). */
    int (*event_create_timed)(mt_backend_t *b, mt_event_t **out);
    /* Optional (NULL: host_malloc, flags ignored). */
    int (*host_malloc_flags)(mt_backend_t *b, size_t size, unsigned flags, void **out);
    /* Optional (NULL: nothing is held across a fork). See mt__backend_fork. */
    void (*fork)(mt_backend_t *b, int phase);
    /* Optional, all or none (NULL: MT_ENOTSUP): the device's stream-ordered pool
     * (pool.c checks the arguments; s is NULL or a stream of b). */
    int (*malloc_async)(mt_backend_t *b, size_t size, mt_stream_t *s, void **out);
    int (*free_async)(mt_backend_t *b, void *ptr, mt_stream_t *s);
    int (*pool_set_release_threshold)(mt_backend_t *b, uint64_t bytes);
    int (*pool_trim_to)(mt_backend_t *b, size_t keep);
    int (*pool_usage)(mt_backend_t *b, mt_pool_usage_t *out);
    int (*pool_reset_high)(mt_backend_t *b);
    /* Managed memory, optional (NULL: MT_ENOTSUP). Ranges and locations are checked by
     * backend.c (n > 0, location MT_MANAGED_HOST or an ordinal of the group); each op checks
     * the range lies in one managed allocation. */
    int (*managed_malloc)(mt_backend_t *b, size_t size, void **out);
    int (*managed_free)(mt_backend_t *b, void *ptr);
    int (*managed_prefetch)(mt_backend_t *b, const void *ptr, size_t n, int location,
                            mt_stream_t *s);
    int (*managed_advise)(mt_backend_t *b, const void *ptr, size_t n, int advice, int location);
    int (*managed_stats)(mt_backend_t *b, mt_managed_stats_t *out);
    bool (*is_managed)(const mt_backend_t *b, const void *ptr, size_t n);
    /* Optional (NULL: MT_ENOTSUP): this process's bytes on the device, per process. */
    int (*process_used)(mt_backend_t *b, uint64_t *bytes);
} mt_backend_ops_t;

/* Common header of every backend object; each implementation embeds it first.
 * counters are updated by backend.c with relaxed atomics (they are statistics). */
struct mt_backend_s {
    const mt_backend_ops_t *ops;
    int device;    /* ordinal, >= 0 */
    mt_log_cb log; /* optional */
    void *log_ud;
    _Atomic uint64_t counters[sizeof(mt_backend_counters_t) / sizeof(uint64_t)];
};

/* Every stream object starts with this, so mt_stream_id() works on any backend. */
struct mt_stream_s {
    uint32_t id; /* 1, 2, ... in creation order per backend; the default stream is NULL (0) */
};

/* Constructors of the implementations. *out is new. */
int mt__backend_sim_create(mt_backend_t **out, const mt_backend_cfg_t *cfg);
int mt__backend_cuda_create(mt_backend_t **out, const mt_backend_cfg_t *cfg);

/* Phases of a fork, as pthread_atfork names them. */
enum { MT__FORK_PREPARE = 0, MT__FORK_PARENT = 1, MT__FORK_CHILD = 2 };
/* Around a fork (the allocator's handlers, allocator/fork.c): PREPARE takes every lock of
 * b's backend object that the allocator's calls take, so that none is held by a thread
 * that will not exist in the child; PARENT releases them; CHILD makes them anew. Calls
 * nest per object (several allocators may share one backend); only the forking thread
 * makes them, all of one phase before the next. Work queued on streams belongs to threads
 * the child does not have: the child may allocate and free, not wait for a stream. */
void mt__backend_fork(mt_backend_t *b, int phase);

/* Adds d to the modelled-time counter (sim's segment cost). */
void mt__backend_add_modelled_ns(mt_backend_t *b, uint64_t d);
/* Counts one peer copy of n bytes costing d modelled ns on b's stream. */
void mt__backend_add_peer(mt_backend_t *b, uint64_t n, uint64_t d);
/* printf-style logging through the backend's callback (no-op without one). */
void mt__backend_log(const mt_backend_t *b, mt_log_level_e level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
