/* Private layout of the cuda backend, shared by backend_cuda.c (context scoping,
 * lifecycle, devices of the process, ops table), cuda_mem.c (device, virtual and pinned
 * host memory) and cuda_stream.c (streams, copies, events). Nothing outside those files
 * includes this; the preload library and tests use backend_cuda.h. */
#ifndef MT_BACKEND_CUDA_INTERNAL_H
#define MT_BACKEND_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cuda_driver.h"

/* A device allocation handed out by malloc: [ptr, ptr + size). */
typedef struct cuda_seg_s {
    CUdeviceptr ptr;
    size_t size;
    bool managed; /* cuMemAllocManaged (cuda_managed.c): freed only as managed memory */
} cuda_seg_t;

/* One reserved virtual range. Invariant: pages[i] != 0 iff page i (granularity bytes at
 * base + i * granularity) has physical memory created, mapped and made accessible. */
typedef struct cuda_vm_s {
    struct cuda_vm_s *next;
    CUdeviceptr base;
    size_t size;                         /* bytes, multiple of the granularity */
    size_t npages;                       /* size / granularity */
    CUmemGenericAllocationHandle *pages; /* npages handles, 0 = unmapped */
} cuda_vm_t;

/* Streams this backend created (owned) or wraps for the program (borrowed handle). */
typedef struct cuda_stream_s {
    mt_stream_t base; /* must be first: mt_stream_id reads it */
    struct cuda_stream_s *next;
    CUstream h;
    uintptr_t thread; /* CU_STREAM_PER_THREAD: the thread whose stream it is; else 0 */
    bool owned;       /* created by stream_create: destroyed with the wrapper */
    bool retired;     /* the program destroyed h: never matched again, freed with the backend */
} cuda_stream_t;

struct mt_event_s {
    CUevent h;
    bool recorded; /* an unrecorded event counts as complete, as in CUDA */
    bool timed;    /* created with timing (mt_event_create_timed): has a time */
};

/* Invariants (under mu): segs[0..nsegs) are live cuMemAlloc results, pairwise disjoint;
 * hosts[0..nhosts) are live cuMemHostAlloc results; every cuda_vm_t in vms is a live
 * reservation. origin_ev was recorded on the default stream at creation and its host
 * time origin_ns, so event times are origin_ns + elapsed(origin_ev, ev). The elapsed
 * time is a float of milliseconds (24-bit mantissa: 2 ms steps after 5 hours), so the
 * origin moves forward (under anchor_mu) once an event is more than ANCHOR_MS past it. */
typedef struct cuda_s {
    mt_backend_t base; /* must be first: backend.c sees this */
    mt_cuda_driver_t drv;
    CUdevice dev;
    CUcontext ctx;                          /* the device's primary context, retained */
    size_t granularity;                     /* cuMemGetAllocationGranularity, minimum; >= 2 MiB */
    CUmemAllocationHandleType handle_types; /* asked of cuMemCreate (cfg.cuda_handle_type) */
    CUevent origin_ev;                      /* time origin of event_time_ns */
    void *nvml_dev;                         /* NVML's handle of dev (under mu), NULL unknown */
    bool nvml_tried;                        /* nvml_dev was looked up (under mu) */
    uint64_t origin_ns;                     /* CLOCK_MONOTONIC when origin_ev was recorded */
    pthread_mutex_t anchor_mu; /* guards origin_ev, origin_ns, spare_ev, anchor_stream */
    CUevent spare_ev;          /* the next origin, made on first use */
    CUstream anchor_stream;    /* where new origins are recorded: no program work */

    pthread_mutex_t mu; /* guards everything below */
    cuda_seg_t *segs;
    size_t nsegs, segs_cap;
    void **hosts;
    size_t nhosts, hosts_cap;
    cuda_vm_t *vms;
    cuda_stream_t *streams;
    uint32_t next_stream_id;   /* 1, 2, ... */
    bool *peer_access;         /* [group->n]: device i enabled access to this one (VMM grants) */
    mt_managed_stats_t mstats; /* managed_bytes and the calls made; the driver tells no more */

    struct cuda_pool_s *pool;   /* the default pool's entry points (cuda_async.c), made on
                                 * first use under mu */
    struct cuda_group_s *group; /* every device of the process; set at creation */
    bool owner;                 /* the handle mt_backend_create returned: frees the group */
} cuda_t;

/* The devices of one process. Invariants (under mu): 0 < n; dev[i] is NULL until device i
 * is first reached (mt_backend_get_device retains its primary context then, never before:
 * a context costs device memory), else dev[i]->base.device == i and dev[i]->group == this;
 * exactly one dev[i] has owner set. */
typedef struct cuda_group_s {
    pthread_mutex_t mu;
    int n;
    cuda_t **dev;
    mt_backend_cfg_t cfg; /* the creating config; device is rewritten per ordinal */
} cuda_group_t;

/* ---- backend_cuda.c: context scoping, used by every file ---- */

/* Pushes c's primary context on the calling thread; 0 or the mapped driver error. */
int mt__cuda_enter(cuda_t *c);
/* Pops what mt__cuda_enter pushed. */
void mt__cuda_leave(cuda_t *c);
/* Maps a CUresult to an MT_E* code, keeping a failure for mt__cuda_last_result. */
int mt__cuda_note(int res);

/* Runs a driver call inside the context and maps its result. */
#define CALL(c, expr)                                                                              \
    ({                                                                                             \
        int rc_ = mt__cuda_enter(c);                                                               \
        if (rc_ == 0) {                                                                            \
            rc_ = mt__cuda_note((c)->drv.expr);                                                    \
            mt__cuda_leave(c);                                                                     \
        }                                                                                          \
        rc_;                                                                                       \
    })

/* ---- backend_cuda.c, used by cuda_stream.c ---- */

/* Device `ordinal` of b's process, opened on first use; NULL if its context cannot be had. */
mt_backend_t *mt__cuda_get_device(mt_backend_t *b, int ordinal);

/* ---- cuda_mem.c, used by backend_cuda.c ---- */

/* The properties of c's physical pages (pinned device memory, c's handle types). */
CUmemAllocationProp mt__cuda_pinned_prop(const cuda_t *c);

int mt__cuda_malloc(mt_backend_t *b, size_t size, void **out);
int mt__cuda_free(mt_backend_t *b, void *ptr);
int mt__cuda_mem_get_info(mt_backend_t *b, size_t *free_bytes, size_t *total_bytes);
/* cuda_nvml.c */
int mt__cuda_process_used(mt_backend_t *b, uint64_t *bytes);
bool mt__cuda_is_device_ptr(const mt_backend_t *b, const void *ptr);
size_t mt__cuda_vm_granularity(const mt_backend_t *b);
int mt__cuda_vm_reserve(mt_backend_t *b, size_t size, void **out);
int mt__cuda_vm_release(mt_backend_t *b, void *base, size_t size);
int mt__cuda_vm_map(mt_backend_t *b, void *addr, size_t size);
int mt__cuda_vm_unmap(mt_backend_t *b, void *addr, size_t size);
int mt__cuda_host_malloc_flags(mt_backend_t *b, size_t size, unsigned flags, void **out);
int mt__cuda_host_malloc(mt_backend_t *b, size_t size, void **out);
int mt__cuda_host_free(mt_backend_t *b, void *ptr);

/* ---- cuda_async.c, used by backend_cuda.c ---- */

/* Forgets the pool's entry points (the driver's pool itself is the device's). */
void mt__cuda_pool_fini(cuda_t *c);
int mt__cuda_malloc_async(mt_backend_t *b, size_t size, mt_stream_t *s, void **out);
int mt__cuda_free_async(mt_backend_t *b, void *ptr, mt_stream_t *s);
int mt__cuda_pool_set_release_threshold(mt_backend_t *b, uint64_t bytes);
int mt__cuda_pool_trim_to(mt_backend_t *b, size_t keep);
int mt__cuda_pool_usage(mt_backend_t *b, mt_pool_usage_t *out);
int mt__cuda_pool_reset_high(mt_backend_t *b);
/* ---- cuda_managed.c, used by backend_cuda.c ---- */

int mt__cuda_managed_malloc(mt_backend_t *b, size_t size, void **out);
int mt__cuda_managed_free(mt_backend_t *b, void *ptr);
int mt__cuda_managed_prefetch(mt_backend_t *b, const void *ptr, size_t n, int location,
                              mt_stream_t *s);
int mt__cuda_managed_advise(mt_backend_t *b, const void *ptr, size_t n, int advice, int location);
int mt__cuda_managed_stats(mt_backend_t *b, mt_managed_stats_t *out);
bool mt__cuda_is_managed(const mt_backend_t *b, const void *ptr, size_t n);

/* ---- cuda_stream.c, used by backend_cuda.c ---- */

int mt__cuda_stream_create(mt_backend_t *b, mt_stream_t **out);
void mt__cuda_stream_destroy(mt_backend_t *b, mt_stream_t *st);
int mt__cuda_stream_synchronize(mt_backend_t *b, mt_stream_t *s);
int mt__cuda_stream_wait_event(mt_backend_t *b, mt_stream_t *s, mt_event_t *ev);
int mt__cuda_launch_host_func(mt_backend_t *b, mt_stream_t *s, void (*fn)(void *), void *ud);
int mt__cuda_memcpy_async(mt_backend_t *b, void *dst, const void *src, size_t n,
                          mt_memcpy_kind_e kind, mt_stream_t *s);
int mt__cuda_memset_async(mt_backend_t *b, void *dst, int value, size_t n, mt_stream_t *s);
int mt__cuda_memcpy_peer_async(mt_backend_t *b, void *dst, int dst_device, const void *src,
                               int src_device, size_t n, mt_stream_t *s);
int mt__cuda_device_synchronize(mt_backend_t *b);
int mt__cuda_event_create(mt_backend_t *b, mt_event_t **out);
int mt__cuda_event_create_timed(mt_backend_t *b, mt_event_t **out);
void mt__cuda_event_destroy(mt_backend_t *b, mt_event_t *ev);
int mt__cuda_event_record(mt_backend_t *b, mt_event_t *ev, mt_stream_t *s);
int mt__cuda_event_query(mt_backend_t *b, mt_event_t *ev);
int mt__cuda_event_synchronize(mt_backend_t *b, mt_event_t *ev);
uint64_t mt__cuda_event_time_ns(mt_backend_t *b, mt_event_t *ev);

#endif
