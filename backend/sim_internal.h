/* Private layout of the sim backend, shared by backend_sim.c (lifecycle, ops table, test
 * hooks), sim_mem.c (device memory, virtual memory, pinned host memory) and sim_stream.c
 * (streams, events, copies). Nothing outside those files includes this; tests use
 * backend_sim.h. */
#ifndef MT_ALLOCATOR_SIM_INTERNAL_H
#define MT_ALLOCATOR_SIM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "backend/backend.h"

#define SIM_VM_GRANULARITY ((size_t)2 << 20) /* 2 MiB, like cuMemGetAllocationGranularity */
#define SIM_MIN_ALIGN      ((size_t)512)     /* cudaMalloc hands out >= 512 B alignment */

/* A free or used piece of the device range, by offset from the device base. */
typedef struct sim_range_s {
    size_t off;  /* bytes from dev_base, multiple of SIM_MIN_ALIGN */
    size_t size; /* bytes, multiple of SIM_MIN_ALIGN, > 0 */
} sim_range_t;

/* A growable array of ranges kept sorted by offset. */
typedef struct sim_ranges_s {
    sim_range_t *v;
    size_t n;
    size_t cap;
} sim_ranges_t;

/* One vm_reserve'd address range.
 * Invariants: base and size are multiples of SIM_VM_GRANULARITY; bit i of mapped is set
 * iff page i is readable/writable (mprotect RW) and counted in sim_t.mapped_bytes;
 * nmapped = popcount(mapped). */
typedef struct sim_vm_s {
    struct sim_vm_s *next;
    uintptr_t base;   /* page-aligned to SIM_VM_GRANULARITY */
    size_t size;      /* bytes */
    size_t npages;    /* size / SIM_VM_GRANULARITY */
    size_t nmapped;   /* pages mapped now */
    uint64_t *mapped; /* bitmap, npages bits */
} sim_vm_t;

/* One pinned host allocation (mmap'ed, page-aligned). */
typedef struct sim_host_s {
    struct sim_host_s *next;
    void *ptr;
    size_t size; /* bytes actually mapped (page multiple) */
} sim_host_t;

typedef struct sim_stream_s sim_stream_t;
typedef struct sim_managed_s sim_managed_t;
typedef struct sim_mark_s sim_mark_t;
typedef struct sim_s sim_t;

/* The devices made by one mt_backend_create. Events and marks of every device are
 * guarded by the group's ev_mu, so a stream of one device can wait on a mark recorded by
 * another (cross-device cudaStreamWaitEvent).
 * Invariants: 1 <= n <= MT_SIM_MAX_DEVICES; dev[i]->base.device == i and
 * dev[i]->group == this group; exactly one dev[i] has owner set. */
typedef struct sim_group_s {
    int n;
    sim_t **dev;
    pthread_mutex_t ev_mu;           /* guards every event and mark of the group */
    pthread_cond_t ev_cv;            /* broadcast whenever a mark completes */
    _Atomic uint64_t peer_cost_ns;   /* fixed part of a peer copy's modelled cost */
    _Atomic uint64_t peer_bandwidth; /* bytes/s of a peer copy, > 0 */
    unsigned fork_held;              /* nesting of MT__FORK_PREPARE calls (forking thread) */
} sim_group_t;

/* The sim device.
 * Invariants (under mu): free and used ranges are disjoint, sorted, and together cover
 * [0, dev_size); no two free ranges touch (they are merged on free);
 * seg_bytes = sum of used sizes;
 * context + others + seg_bytes + mapped_bytes + mstats.device_bytes <= capacity;
 * mapped_bytes = SIM_VM_GRANULARITY * sum of nmapped over vms.
 * Lock order: streams_mu before a stream's mu; mu, cost_mu and ev_mu are leaves (no
 * other lock is taken while one of them is held). */
typedef struct sim_s {
    mt_backend_t base;  /* must be first: backend.c sees this */
    sim_group_t *group; /* shared by every device of the group */
    bool owner;         /* the handle mt_backend_create returned: destroys the group */

    pthread_mutex_t mu;  /* guards the memory state below */
    uint8_t *dev_base;   /* start of the device range, 2 MiB aligned */
    size_t dev_size;     /* bytes of the device address range: SIM_VA_FACTOR x capacity */
    size_t capacity;     /* bytes reported as total by mem_get_info */
    size_t context;      /* bytes the modelled context holds from creation, < capacity */
    size_t others;       /* bytes other processes hold from creation (cfg.sim_other_processes) */
    size_t map_len;      /* bytes of the whole mmap behind dev_base (for munmap) */
    void *map_base;      /* what mmap returned (dev_base is aligned inside it) */
    sim_ranges_t free_r; /* free pieces of the device range */
    sim_ranges_t used_r; /* live segments, sizes as accounted (rounded) */
    size_t seg_bytes;    /* bytes in live segments */
    size_t mapped_bytes; /* bytes of mapped VM pages */
    sim_vm_t *vms;       /* reservations, unordered list */
    size_t va_space;     /* cfg.sim_va_space: bound on va_used; 0 = none */
    size_t va_used;      /* bytes of the reservations in vms */
    sim_host_t *hosts;   /* pinned host allocations, unordered list */
    unsigned fail_next;  /* the next fail_next segment mallocs / vm_maps fail (test hook) */
    int fail_rc;         /* ... with this code (MT_ENOMEM unless a test sets another) */
    void (*call_cb)(void *ud, const char *call); /* test hook: each blocking call (sync, vm_*) */
    void *call_ud;                               /* its argument */
    unsigned ev_fail_next;     /* the next ev_fail_next event creations fail (test hook) */
    sim_managed_t *managed;    /* managed allocations, unordered list (sim_managed.c) */
    uint64_t managed_tick;     /* device-side uses of managed pages so far (their LRU clock) */
    mt_managed_stats_t mstats; /* device_bytes, host_bytes: pages resident now, bytes */

    pthread_mutex_t cost_mu;         /* held while a cost is spent: like the driver, the
                                      * sim runs one allocation call at a time */
    _Atomic uint64_t malloc_cost_ns; /* busy-waited per segment malloc / vm_map */
    _Atomic uint64_t free_cost_ns;   /* busy-waited per segment free / vm_unmap */

    pthread_mutex_t streams_mu; /* guards the stream list and next_stream_id */
    sim_stream_t *streams;      /* every live stream, default stream included */
    sim_stream_t *default_s;    /* the NULL-handle stream */
    uint32_t next_stream_id;    /* 1, 2, ... */

    struct mt_event_s *events; /* every live event of this device, under group->ev_mu
                                * (freed at destroy if leaked) */

    struct sim_pool_s *pool; /* the stream-ordered pool (sim_async.c), made with the device */
} sim_t;

/* ---- sim_stream.c, used by backend_sim.c around a fork ---- */
/* PREPARE: streams_mu, then each stream's mu; PARENT: released; CHILD: made anew (the
 * workers are gone: what is queued stays queued). */
void mt__sim_streams_fork(sim_t *s, int phase);

/* ---- backend_sim.c, used by sim_mem.c ---- */

/* Calls the test hook of mt__sim_set_call_hook, if any, for one blocking call. */
void mt__sim_call_hook(sim_t *s, const char *call);

/* ---- sim_mem.c, used by backend_sim.c and sim_stream.c ---- */

/* Maps the device range (dev_size from capacity) and makes it one free range. MT_ENOMEM
 * when the mapping or the range array cannot be had; then nothing stays mapped. */
int mt__sim_mem_init(sim_t *s);
/* Unmaps every VM reservation, pinned host allocation and the device range. */
void mt__sim_mem_fini(sim_t *s);
/* True if [p, p+n) lies inside one live segment, or inside one VM reservation with every
 * page it touches mapped. */
bool mt__sim_span_is_device(sim_t *s, const void *p, size_t n);

int mt__sim_malloc(mt_backend_t *b, size_t size, void **out);
int mt__sim_free(mt_backend_t *b, void *ptr);
int mt__sim_mem_get_info(mt_backend_t *b, size_t *free_bytes, size_t *total_bytes);
int mt__sim_process_used(mt_backend_t *b, uint64_t *bytes);
bool mt__sim_is_device_ptr(const mt_backend_t *b, const void *ptr);
size_t mt__sim_vm_granularity(const mt_backend_t *b);
int mt__sim_vm_reserve(mt_backend_t *b, size_t size, void **out);
int mt__sim_vm_release(mt_backend_t *b, void *base, size_t size);
int mt__sim_vm_map(mt_backend_t *b, void *addr, size_t size);
int mt__sim_vm_unmap(mt_backend_t *b, void *addr, size_t size);
int mt__sim_host_malloc(mt_backend_t *b, size_t size, void **out);
int mt__sim_host_free(mt_backend_t *b, void *ptr);

/* ---- sim_stream.c, used by sim_async.c ---- */

/* Ops queued (enq) and finished (done) so far on stream id of s; MT_ENOENT once it is
 * destroyed (it drained first: everything queued on it has finished). */
int mt__sim_stream_progress(sim_t *s, uint32_t id, uint64_t *enq, uint64_t *done);

/* ---- sim_async.c: the stream-ordered pool ---- */

int mt__sim_pool_init(sim_t *s);
/* Gives every chunk back to the device (the streams drained first). */
void mt__sim_pool_fini(sim_t *s);
/* Stream waiter_id of s now waits on a record made on stream sid of s after seq ops:
 * frees queued there before the record become reusable on waiter_id. No lock held. */
void mt__sim_pool_note_wait(sim_t *s, uint32_t waiter_id, uint32_t sid, uint64_t seq);
/* After a stream, event or device synchronize: the pool gives back what it holds unused
 * above its release threshold. No lock held. */
void mt__sim_pool_on_sync(sim_t *s);
/* PREPARE takes the pool's lock (before any other lock of the device), PARENT releases
 * it, CHILD makes it anew. */
void mt__sim_pool_fork(sim_t *s, int phase);
int mt__sim_malloc_async(mt_backend_t *b, size_t size, mt_stream_t *st, void **out);
int mt__sim_free_async(mt_backend_t *b, void *ptr, mt_stream_t *st);
int mt__sim_pool_set_release_threshold(mt_backend_t *b, uint64_t bytes);
int mt__sim_pool_trim_to(mt_backend_t *b, size_t keep);
int mt__sim_pool_usage(mt_backend_t *b, mt_pool_usage_t *out);
int mt__sim_pool_reset_high(mt_backend_t *b);
/* ---- sim_managed.c: managed memory, used by backend_sim.c, sim_mem.c, sim_stream.c ---- */

/* Caller holds mu. True if [p, p+n) lies inside one managed allocation. */
bool mt__sim_managed_span_locked(const sim_t *s, const void *p, size_t n);
/* Caller holds mu. Pushes least recently used managed pages off the device until need
 * bytes are free there (or none is left): a device malloc makes room as the driver does. */
void mt__sim_managed_evict_locked(sim_t *s, size_t need);
/* Caller holds mu. The invariants of the managed pages (sim_managed.c); 0 or MT_EIO. */
int mt__sim_managed_check_locked(const sim_t *s);
/* Unmaps every managed allocation (teardown, streams already drained). */
void mt__sim_managed_fini(sim_t *s);
/* A device-side access of [p, p+n) queued on st, before the copy or memset that makes it;
 * nothing when the span is not managed memory. */
int mt__sim_managed_touch_async(sim_t *s, mt_stream_t *st, const void *p, size_t n, bool write);
int mt__sim_managed_malloc(mt_backend_t *b, size_t size, void **out);
int mt__sim_managed_free(mt_backend_t *b, void *ptr);
int mt__sim_managed_prefetch(mt_backend_t *b, const void *ptr, size_t n, int location,
                             mt_stream_t *st);
int mt__sim_managed_advise(mt_backend_t *b, const void *ptr, size_t n, int advice, int location);
int mt__sim_managed_stats(mt_backend_t *b, mt_managed_stats_t *out);
bool mt__sim_is_managed(const mt_backend_t *b, const void *ptr, size_t n);

/* ---- sim_stream.c, used by backend_sim.c ---- */

int mt__sim_streams_init(sim_t *s);
/* Drains and joins every stream, frees every event. */
void mt__sim_streams_fini(sim_t *s);
int mt__sim_device_synchronize(mt_backend_t *b);

int mt__sim_stream_create(mt_backend_t *b, mt_stream_t **out);
void mt__sim_stream_destroy(mt_backend_t *b, mt_stream_t *st);
int mt__sim_stream_synchronize(mt_backend_t *b, mt_stream_t *st);
int mt__sim_memcpy_peer_async(mt_backend_t *b, void *dst, int dst_device, const void *src,
                              int src_device, size_t n, mt_stream_t *st);
int mt__sim_stream_wait_event(mt_backend_t *b, mt_stream_t *st, mt_event_t *ev);
int mt__sim_launch_host_func(mt_backend_t *b, mt_stream_t *st, void (*fn)(void *), void *ud);
int mt__sim_memcpy_async(mt_backend_t *b, void *dst, const void *src, size_t n,
                         mt_memcpy_kind_e kind, mt_stream_t *st);
int mt__sim_memset_async(mt_backend_t *b, void *dst, int value, size_t n, mt_stream_t *st);

int mt__sim_event_create(mt_backend_t *b, mt_event_t **out);
void mt__sim_event_destroy(mt_backend_t *b, mt_event_t *ev);
int mt__sim_event_record(mt_backend_t *b, mt_event_t *ev, mt_stream_t *st);
int mt__sim_event_query(mt_backend_t *b, mt_event_t *ev);
int mt__sim_event_synchronize(mt_backend_t *b, mt_event_t *ev);
uint64_t mt__sim_event_time_ns(mt_backend_t *b, mt_event_t *ev);

#endif
