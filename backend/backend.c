/* Backend dispatch: argument checks and call counting, once for every backend. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

#include "mt_config.h"
#include "backend/backend.h"
#include "util/log.h"

#define COUNTER(field) (offsetof(mt_backend_counters_t, field) / sizeof(uint64_t))
#define BUMP(b, field)                                                                             \
    atomic_fetch_add_explicit(&(b)->counters[COUNTER(field)], 1, memory_order_relaxed)

_Static_assert(sizeof(mt_backend_counters_t) % sizeof(uint64_t) == 0,
               "counters are an array of uint64_t");

void mt__backend_add_modelled_ns(mt_backend_t *b, uint64_t d)
{
    atomic_fetch_add_explicit(&b->counters[COUNTER(modelled_ns)], d, memory_order_relaxed);
}

void mt__backend_add_peer(mt_backend_t *b, uint64_t n, uint64_t d)
{
    BUMP(b, peer_copies);
    atomic_fetch_add_explicit(&b->counters[COUNTER(peer_bytes)], n, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->counters[COUNTER(peer_ns)], d, memory_order_relaxed);
}

void mt__backend_fork(mt_backend_t *b, int phase)
{
    if (b != NULL && b->ops->fork != NULL)
        b->ops->fork(b, phase);
}

void mt__backend_log(const mt_backend_t *b, mt_log_level_e level, const char *fmt, ...)
{
    if (b == NULL)
        return;
    va_list ap;
    va_start(ap, fmt);
    mt__vlogf(b->log, b->log_ud, level, fmt, ap);
    va_end(ap);
}

mt_backend_cfg_t mt_backend_cfg_default(void)
{
    mt_backend_cfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.kind = MT_BACKEND_AUTO;
    cfg.sim_malloc_cost_ns = 20000;
    cfg.sim_free_cost_ns = 20000;
    cfg.sim_devices = 1;
    cfg.sim_peer_cost_ns = 10000;
    cfg.sim_peer_bandwidth = (uint64_t)12 << 30;
    return cfg;
}

int mt_backend_create(mt_backend_t **out, const mt_backend_cfg_t *cfg)
{
    if (out == NULL)
        return MT_EINVAL;
    *out = NULL;
    mt_backend_cfg_t def;
    if (cfg == NULL) {
        def = mt_backend_cfg_default();
        cfg = &def;
    }
    if (cfg->device < 0)
        return MT_EINVAL;
    int rc = MT_ENODEV;
    switch (cfg->kind) {
    case MT_BACKEND_SIM:
        return mt__backend_sim_create(out, cfg);
    case MT_BACKEND_CUDA:
#if MT_HAVE_CUDA_BACKEND
        return mt__backend_cuda_create(out, cfg);
#else
        return MT_ENODEV;
#endif
    case MT_BACKEND_AUTO:
#if MT_HAVE_CUDA_BACKEND
        rc = mt__backend_cuda_create(out, cfg);
        if (rc == 0)
            return 0;
#endif
        rc = mt__backend_sim_create(out, cfg);
        if (rc == 0) {
            size_t free_b = 0, total_b = 0;
            (*out)->ops->mem_get_info(*out, &free_b, &total_b);
            mt__backend_log(*out, MT_LOG_INFO,
                            "memtrace: no CUDA device answered; running on the sim backend "
                            "(%zu MiB simulated device)",
                            total_b >> 20);
        }
        return rc;
    }
    return MT_EINVAL;
}

void mt_backend_destroy(mt_backend_t **p)
{
    if (p == NULL || *p == NULL)
        return;
    (*p)->ops->destroy(*p);
    *p = NULL;
}

const char *mt_backend_name(const mt_backend_t *b)
{
    return b ? b->ops->name : "none";
}

mt_backend_kind_e mt_backend_kind(const mt_backend_t *b)
{
    return b->ops->kind;
}

int mt_backend_device(const mt_backend_t *b)
{
    return b->device;
}

int mt_backend_device_count(const mt_backend_t *b)
{
    if (b == NULL)
        return 0;
    return b->ops->device_count ? b->ops->device_count(b) : 1;
}

/* 0 if ordinal names a device reachable from b; else logs it and returns MT_EINVAL. */
static int check_ordinal(const mt_backend_t *b, int ordinal)
{
    int n = mt_backend_device_count(b);
    bool ok = b->ops->get_device ? ordinal >= 0 && ordinal < n : ordinal == b->device;
    if (ok)
        return 0;
    mt__backend_log(b, MT_LOG_ERROR,
                    "memtrace: device ordinal %d out of range: the %s backend has %d device%s",
                    ordinal, b->ops->name, n, n == 1 ? "" : "s");
    return MT_EINVAL;
}

int mt_backend_get_device(mt_backend_t *b, int ordinal, mt_backend_t **out)
{
    if (b == NULL || out == NULL)
        return MT_EINVAL;
    *out = NULL;
    int rc = check_ordinal(b, ordinal);
    if (rc != 0)
        return rc;
    *out = b->ops->get_device ? b->ops->get_device(b, ordinal) : b;
    return *out != NULL ? 0 : MT_ENODEV;
}

int mt_backend_enable_peer_access(mt_backend_t *b, int peer)
{
    if (b == NULL)
        return MT_EINVAL;
    int rc = check_ordinal(b, peer);
    if (rc != 0 || peer == b->device || b->ops->enable_peer_access == NULL)
        return rc;
    return b->ops->enable_peer_access(b, peer);
}

void mt_backend_counters(const mt_backend_t *b, mt_backend_counters_t *out)
{
    uint64_t *dst = (uint64_t *)out;
    for (size_t i = 0; i < sizeof(mt_backend_counters_t) / sizeof(uint64_t); i++)
        dst[i] = atomic_load_explicit(&((mt_backend_t *)b)->counters[i], memory_order_relaxed);
}

/* ---- device memory ---- */

int mt_backend_malloc(mt_backend_t *b, size_t size, void **out)
{
    if (b == NULL || out == NULL || size == 0)
        return MT_EINVAL;
    BUMP(b, malloc_calls);
    int rc = b->ops->malloc(b, size, out);
    if (rc != 0)
        BUMP(b, malloc_failures);
    return rc;
}

int mt_backend_free(mt_backend_t *b, void *ptr)
{
    if (b == NULL)
        return MT_EINVAL;
    if (ptr == NULL)
        return 0;
    BUMP(b, free_calls);
    return b->ops->free(b, ptr);
}

int mt_backend_mem_get_info(mt_backend_t *b, size_t *free_bytes, size_t *total_bytes)
{
    if (b == NULL || free_bytes == NULL || total_bytes == NULL)
        return MT_EINVAL;
    BUMP(b, mem_get_info_calls);
    return b->ops->mem_get_info(b, free_bytes, total_bytes);
}

bool mt_backend_is_device_ptr(const mt_backend_t *b, const void *ptr)
{
    return b != NULL && ptr != NULL && b->ops->is_device_ptr(b, ptr);
}

/* ---- virtual memory ---- */

size_t mt_backend_vm_granularity(const mt_backend_t *b)
{
    return b->ops->vm_granularity(b);
}

static int vm_args_ok(const mt_backend_t *b, const void *addr, size_t size)
{
    size_t g = b->ops->vm_granularity(b);
    return size != 0 && size % g == 0 && (uintptr_t)addr % g == 0;
}

int mt_backend_vm_reserve(mt_backend_t *b, size_t size, void **out)
{
    if (b == NULL || out == NULL || !vm_args_ok(b, NULL, size))
        return MT_EINVAL;
    if (b->ops->vm_reserve == NULL)
        return MT_ENOTSUP;
    BUMP(b, vm_reserve_calls);
    return b->ops->vm_reserve(b, size, out);
}

int mt_backend_vm_release(mt_backend_t *b, void *base, size_t size)
{
    if (b == NULL || base == NULL || !vm_args_ok(b, base, size))
        return MT_EINVAL;
    if (b->ops->vm_release == NULL)
        return MT_ENOTSUP;
    BUMP(b, vm_release_calls);
    return b->ops->vm_release(b, base, size);
}

int mt_backend_vm_map(mt_backend_t *b, void *addr, size_t size)
{
    if (b == NULL || addr == NULL || !vm_args_ok(b, addr, size))
        return MT_EINVAL;
    if (b->ops->vm_map == NULL)
        return MT_ENOTSUP;
    BUMP(b, vm_map_calls);
    return b->ops->vm_map(b, addr, size);
}

int mt_backend_vm_unmap(mt_backend_t *b, void *addr, size_t size)
{
    if (b == NULL || addr == NULL || !vm_args_ok(b, addr, size))
        return MT_EINVAL;
    if (b->ops->vm_unmap == NULL)
        return MT_ENOTSUP;
    BUMP(b, vm_unmap_calls);
    return b->ops->vm_unmap(b, addr, size);
}

/* ---- streams ---- */

int mt_stream_create(mt_backend_t *b, mt_stream_t **out)
{
    if (b == NULL || out == NULL)
        return MT_EINVAL;
    BUMP(b, stream_creates);
    return b->ops->stream_create(b, out);
}

void mt_stream_destroy(mt_backend_t *b, mt_stream_t **s)
{
    if (b == NULL || s == NULL || *s == NULL)
        return;
    b->ops->stream_destroy(b, *s);
    *s = NULL;
}

int mt_stream_synchronize(mt_backend_t *b, mt_stream_t *s)
{
    if (b == NULL)
        return MT_EINVAL;
    BUMP(b, stream_syncs);
    return b->ops->stream_synchronize(b, s);
}

int mt_stream_wait_event(mt_backend_t *b, mt_stream_t *s, mt_event_t *ev)
{
    if (b == NULL || ev == NULL)
        return MT_EINVAL;
    return b->ops->stream_wait_event(b, s, ev);
}

uint32_t mt_stream_id(const mt_stream_t *s)
{
    return s ? s->id : 0;
}

int mt_stream_launch_host_func(mt_backend_t *b, mt_stream_t *s, void (*fn)(void *ud), void *ud)
{
    if (b == NULL || fn == NULL)
        return MT_EINVAL;
    return b->ops->launch_host_func(b, s, fn, ud);
}

int mt_memcpy_async(mt_backend_t *b, void *dst, const void *src, size_t n, mt_memcpy_kind_e kind,
                    mt_stream_t *s)
{
    if (b == NULL || (n != 0 && (dst == NULL || src == NULL)) || kind > MT_MEMCPY_DEFAULT)
        return MT_EINVAL;
    if (n == 0)
        return 0;
    BUMP(b, memcpy_calls);
    return b->ops->memcpy_async(b, dst, src, n, kind, s);
}

int mt_memcpy_peer_async(mt_backend_t *b, void *dst, int dst_device, const void *src,
                         int src_device, size_t n, mt_stream_t *s)
{
    if (b == NULL || (n != 0 && (dst == NULL || src == NULL)))
        return MT_EINVAL;
    int rc = check_ordinal(b, dst_device);
    if (rc == 0)
        rc = check_ordinal(b, src_device);
    if (rc != 0 || n == 0)
        return rc;
    if (b->ops->memcpy_peer_async == NULL)
        return MT_ENOTSUP;
    BUMP(b, memcpy_calls);
    return b->ops->memcpy_peer_async(b, dst, dst_device, src, src_device, n, s);
}

int mt_memset_async(mt_backend_t *b, void *dst, int value, size_t n, mt_stream_t *s)
{
    if (b == NULL || (n != 0 && dst == NULL))
        return MT_EINVAL;
    if (n == 0)
        return 0;
    BUMP(b, memset_calls);
    return b->ops->memset_async(b, dst, value, n, s);
}

int mt_memcpy(mt_backend_t *b, void *dst, const void *src, size_t n, mt_memcpy_kind_e kind)
{
    int rc = mt_memcpy_async(b, dst, src, n, kind, NULL);
    if (rc != 0)
        return rc;
    return mt_stream_synchronize(b, NULL);
}

int mt_device_synchronize(mt_backend_t *b)
{
    if (b == NULL)
        return MT_EINVAL;
    BUMP(b, device_syncs);
    return b->ops->device_synchronize(b);
}

/* ---- events ---- */

int mt_event_create(mt_backend_t *b, mt_event_t **out)
{
    if (b == NULL || out == NULL)
        return MT_EINVAL;
    return b->ops->event_create(b, out);
}

void mt_event_destroy(mt_backend_t *b, mt_event_t **ev)
{
    if (b == NULL || ev == NULL || *ev == NULL)
        return;
    b->ops->event_destroy(b, *ev);
    *ev = NULL;
}

int mt_event_record(mt_backend_t *b, mt_event_t *ev, mt_stream_t *s)
{
    if (b == NULL || ev == NULL)
        return MT_EINVAL;
    BUMP(b, event_records);
    return b->ops->event_record(b, ev, s);
}

int mt_event_query(mt_backend_t *b, mt_event_t *ev)
{
    if (b == NULL || ev == NULL)
        return MT_EINVAL;
    BUMP(b, event_queries);
    return b->ops->event_query(b, ev);
}

int mt_event_synchronize(mt_backend_t *b, mt_event_t *ev)
{
    if (b == NULL || ev == NULL)
        return MT_EINVAL;
    BUMP(b, event_syncs);
    return b->ops->event_synchronize(b, ev);
}

int mt_event_create_timed(mt_backend_t *b, mt_event_t **out)
{
    if (b == NULL || out == NULL)
        return MT_EINVAL;
    if (b->ops->event_create_timed == NULL)
        return mt_event_create(b, out);
    return b->ops->event_create_timed(b, out);
}

uint64_t mt_event_time_ns(mt_backend_t *b, mt_event_t *ev)
{
    if (b == NULL || ev == NULL)
        return 0;
    return b->ops->event_time_ns(b, ev);
}

/* ---- pinned host memory ---- */

int mt_backend_host_malloc(mt_backend_t *b, size_t size, void **out)
{
    if (b == NULL || out == NULL || size == 0)
        return MT_EINVAL;
    return b->ops->host_malloc(b, size, out);
}

int mt_backend_host_malloc_flags(mt_backend_t *b, size_t size, unsigned flags, void **out)
{
    if (b == NULL || out == NULL || size == 0 || (flags & ~MT_HOST_ALLOC_FLAGS) != 0)
        return MT_EINVAL;
    if (b->ops->host_malloc_flags == NULL)
        return b->ops->host_malloc(b, size, out);
    return b->ops->host_malloc_flags(b, size, flags, out);
}

int mt_backend_host_free(mt_backend_t *b, void *ptr)
{
    if (b == NULL)
        return MT_EINVAL;
    if (ptr == NULL)
        return 0;
    return b->ops->host_free(b, ptr);
}

/* ---- managed memory ---- */

int mt_backend_managed_malloc(mt_backend_t *b, size_t size, void **out)
{
    if (b == NULL || out == NULL || size == 0)
        return MT_EINVAL;
    if (b->ops->managed_malloc == NULL)
        return MT_ENOTSUP;
    BUMP(b, malloc_calls);
    int rc = b->ops->managed_malloc(b, size, out);
    if (rc != 0)
        BUMP(b, malloc_failures);
    return rc;
}

int mt_backend_managed_free(mt_backend_t *b, void *ptr)
{
    if (b == NULL)
        return MT_EINVAL;
    if (ptr == NULL)
        return 0;
    if (b->ops->managed_free == NULL)
        return MT_ENOTSUP;
    BUMP(b, free_calls);
    return b->ops->managed_free(b, ptr);
}

/* A location is the host or a device of b's group. */
static int check_location(const mt_backend_t *b, int location)
{
    return location == MT_MANAGED_HOST ? 0 : check_ordinal(b, location);
}

int mt_backend_managed_prefetch(mt_backend_t *b, const void *ptr, size_t n, int location,
                                mt_stream_t *s)
{
    if (b == NULL || ptr == NULL || n == 0 || (uintptr_t)ptr + n < (uintptr_t)ptr)
        return MT_EINVAL;
    int rc = check_location(b, location);
    if (rc != 0)
        return rc;
    if (b->ops->managed_prefetch == NULL)
        return MT_ENOTSUP;
    return b->ops->managed_prefetch(b, ptr, n, location, s);
}

int mt_backend_managed_advise(mt_backend_t *b, const void *ptr, size_t n, int advice, int location)
{
    if (b == NULL || ptr == NULL || n == 0 || (uintptr_t)ptr + n < (uintptr_t)ptr ||
        advice < MT_ADVISE_SET_READ_MOSTLY || advice > MT_ADVISE_UNSET_ACCESSED_BY)
        return MT_EINVAL;
    bool uses_location = advice > MT_ADVISE_UNSET_READ_MOSTLY;
    int rc = uses_location ? check_location(b, location) : 0;
    if (rc != 0)
        return rc;
    if (b->ops->managed_advise == NULL)
        return MT_ENOTSUP;
    return b->ops->managed_advise(b, ptr, n, advice, uses_location ? location : MT_MANAGED_HOST);
}

int mt_backend_process_used(mt_backend_t *b, uint64_t *bytes)
{
    if (b == NULL || bytes == NULL)
        return MT_EINVAL;
    if (b->ops->process_used == NULL)
        return MT_ENOTSUP;
    return b->ops->process_used(b, bytes);
}

int mt_backend_managed_stats(mt_backend_t *b, mt_managed_stats_t *out)
{
    if (b == NULL || out == NULL)
        return MT_EINVAL;
    memset(out, 0, sizeof *out);
    if (b->ops->managed_stats == NULL)
        return MT_ENOTSUP;
    return b->ops->managed_stats(b, out);
}

bool mt_backend_is_managed(const mt_backend_t *b, const void *ptr, size_t n)
{
    return b != NULL && ptr != NULL && n != 0 && b->ops->is_managed != NULL &&
           b->ops->is_managed(b, ptr, n);
}
