/* The cuda backend: the backend seam over the CUDA driver API, loaded with dlopen.
 *
 * Honest status: this file has been exercised only against the fake driver in
 * tests/cuda (host memory behind the same entry points), never on a GPU. The calls and
 * their order follow the driver documentation; what a real device adds (asynchronous
 * completion, real capacity, context rules) is covered by the driver's contracts, not by
 * a run here.
 *
 * The driver API rather than the runtime: the preload library replaces the runtime's
 * memory calls, so the backend under it must sit one level lower, and the driver gives
 * the virtual-memory calls expandable segments need. Every entry pushes the device's
 * primary context and pops it on the way out, so the calling thread's own context (the
 * program may use several devices) is left as it was.
 *
 * This file: context scoping, opening and closing devices, the devices of the process and
 * the ops table; memory is in cuda_mem.c, streams, copies and events in cuda_stream.c. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend_cuda.h"
#include "backend/cuda_internal.h"

static const mt_backend_ops_t cuda_ops;
static void cuda_destroy(mt_backend_t *b);

static cuda_t *C(const mt_backend_t *b)
{
    return (cuda_t *)b;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- context scoping ---- */

int mt__cuda_enter(cuda_t *c)
{
    return mt__cuda_note(c->drv.CtxPushCurrent(c->ctx));
}

void mt__cuda_leave(cuda_t *c)
{
    CUcontext popped;
    c->drv.CtxPopCurrent(&popped);
}

/* The calling thread's latest failing CUresult (0 after mt__cuda_last_result): MT_E*
 * codes are coarser than the driver's, and the drop-in must return the driver's own. */
static __thread int last_result;

int mt__cuda_note(int res)
{
    if (res != CUDA_SUCCESS && res != CUDA_ERROR_NOT_READY)
        last_result = res;
    return mt__cuda_result_to_mt(res);
}

int mt__cuda_last_result(void)
{
    int r = last_result;
    last_result = 0;
    return r;
}

/* ---- lifecycle ---- */

static void device_close(mt_backend_t *b)
{
    cuda_t *c = C(b);
    if (mt__cuda_enter(c) == 0) {
        c->drv.CtxSynchronize();
        while (c->streams != NULL) {
            cuda_stream_t *s = c->streams;
            c->streams = s->next;
            if (s->owned)
                c->drv.StreamDestroy(s->h);
            free(s);
        }
        for (size_t i = 0; i < c->nsegs; i++)
            c->drv.MemFree(c->segs[i].ptr);
        for (size_t i = 0; i < c->nhosts; i++)
            c->drv.MemFreeHost(c->hosts[i]);
        while (c->vms != NULL) {
            cuda_vm_t *v = c->vms;
            c->vms = v->next;
            for (size_t i = 0; i < v->npages; i++)
                if (v->pages[i] != 0) {
                    c->drv.MemUnmap(v->base + i * c->granularity, c->granularity);
                    c->drv.MemRelease(v->pages[i]);
                }
            c->drv.MemAddressFree(v->base, v->size);
            free(v->pages);
            free(v);
        }
        if (c->origin_ev != NULL)
            c->drv.EventDestroy(c->origin_ev);
        if (c->spare_ev != NULL)
            c->drv.EventDestroy(c->spare_ev);
        if (c->anchor_stream != NULL)
            c->drv.StreamDestroy(c->anchor_stream);
        mt__cuda_leave(c);
    }
    c->drv.DevicePrimaryCtxRelease(c->dev);
    mt__cuda_pool_fini(c);
    mt__cuda_driver_close(&c->drv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->anchor_mu);
    free(c->segs);
    free(c->hosts);
    free(c->peer_access);
    free(c);
}

bool mt__cuda_is_cuda(const mt_backend_t *b)
{
    return b != NULL && b->ops == &cuda_ops;
}

/* Opens device cfg->device as one backend object (its group not yet set). */
static int device_open(mt_backend_t **out, const mt_backend_cfg_t *cfg)
{
    cuda_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return MT_ENOMEM;
    c->base.ops = &cuda_ops;
    c->base.device = cfg->device;
    c->base.log = cfg->log;
    c->base.log_ud = cfg->log_ud;
    c->next_stream_id = 1;
    /* Expandable segments export their pages only if created shareable (PyTorch's IPC of
     * expandable segments asks for POSIX file descriptors). */
    if (cfg->cuda_handle_type == MT_CUDA_HANDLE_NONE)
        c->handle_types = CU_MEM_HANDLE_TYPE_NONE;
    else if (cfg->cuda_handle_type == MT_CUDA_HANDLE_POSIX_FD)
        c->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    else if (cfg->cuda_handle_type == MT_CUDA_HANDLE_FABRIC)
        c->handle_types = CU_MEM_HANDLE_TYPE_FABRIC;
    else {
        mt__backend_log(&c->base, MT_LOG_ERROR,
                        "memtrace: cuda_handle_type %d: want MT_CUDA_HANDLE_NONE, _POSIX_FD or "
                        "_FABRIC",
                        cfg->cuda_handle_type);
        free(c);
        return MT_EINVAL;
    }
    if (cfg->cuda_peer_access < MT_CUDA_PEER_AUTO || cfg->cuda_peer_access > MT_CUDA_PEER_CAPABLE) {
        mt__backend_log(&c->base, MT_LOG_ERROR,
                        "memtrace: cuda_peer_access %d: want MT_CUDA_PEER_AUTO, _ENABLED or "
                        "_CAPABLE",
                        cfg->cuda_peer_access);
        free(c);
        return MT_EINVAL;
    }
    char err[256];
    int rc = mt__cuda_driver_open(&c->drv, err, sizeof err);
    if (rc != 0) {
        mt__backend_log(&c->base, MT_LOG_DEBUG, "memtrace: cuda backend: %s", err);
        goto fail_open;
    }
    /* Any failure before a context exists means no usable device: ENODEV, so that auto
     * falls back to sim. */
    int count = 0;
    if (mt__cuda_note(c->drv.Init(0)) != 0 || c->drv.DeviceGetCount(&count) != CUDA_SUCCESS ||
        cfg->device >= count || c->drv.DeviceGet(&c->dev, cfg->device) != CUDA_SUCCESS) {
        mt__backend_log(&c->base, MT_LOG_DEBUG, "memtrace: cuda backend: no device %d",
                        cfg->device);
        rc = MT_ENODEV;
        goto fail_device;
    }
    if (c->drv.DevicePrimaryCtxRetain(&c->ctx, c->dev) != CUDA_SUCCESS) {
        rc = MT_ENODEV;
        goto fail_device;
    }
    CUmemAllocationProp prop = mt__cuda_pinned_prop(c);
    c->granularity = 0;
    rc = CALL(
        c, MemGetAllocationGranularity(&c->granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    /* The seam promises 2 MiB pages; a device with a larger minimum uses its own (a
     * multiple of 2 MiB on every known device). */
    if (rc != 0 || c->granularity < ((size_t)2 << 20))
        c->granularity = (size_t)2 << 20;
    rc = CALL(c, EventCreate(&c->origin_ev, CU_EVENT_DEFAULT));
    if (rc == 0)
        rc = CALL(c, EventRecord(c->origin_ev, NULL));
    if (rc == 0)
        rc = CALL(c, EventSynchronize(c->origin_ev));
    if (rc != 0)
        goto fail_ctx;
    c->origin_ns = now_ns();
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->anchor_mu, NULL);
    *out = &c->base;
    return 0;

fail_ctx:
    if (c->origin_ev != NULL)
        CALL(c, EventDestroy(c->origin_ev));
    c->drv.DevicePrimaryCtxRelease(c->dev);
fail_device:
    mt__cuda_driver_close(&c->drv);
fail_open:
    free(c);
    return rc;
}

/* ---- devices of the process ---- */

static void group_free(cuda_group_t *g)
{
    for (int i = 0; i < g->n; i++)
        if (g->dev[i] != NULL)
            device_close(&g->dev[i]->base);
    pthread_mutex_destroy(&g->mu);
    free(g->dev);
    free(g);
}

static void cuda_destroy(mt_backend_t *b)
{
    if (C(b)->owner)
        group_free(C(b)->group);
}

static int cuda_device_count(const mt_backend_t *b)
{
    return C(b)->group->n;
}

/* cuda_peer_access capable: every device of n that the driver says can reach c's memory is
 * named in its mappings from the start, as if it had enabled peer access. For when
 * memtrace cannot see the program enable it (torch's pluggable allocator calls the real
 * cudaDeviceEnablePeerAccess). Before c has mappings. */
static void capable_peers(cuda_t *c, int n, const mt_backend_cfg_t *cfg)
{
    if (cfg->cuda_peer_access != MT_CUDA_PEER_CAPABLE || c->drv.DeviceCanAccessPeer == NULL)
        return;
    for (int i = 0; i < n; i++) {
        CUdevice d;
        int can = 0;
        if (i != c->base.device && c->drv.DeviceGet(&d, i) == CUDA_SUCCESS &&
            c->drv.DeviceCanAccessPeer(&can, d, c->dev) == CUDA_SUCCESS && can)
            c->peer_access[i] = true;
    }
}

/* Opens device i of g, or returns it. Caller holds g->mu. */
static cuda_t *group_device(cuda_group_t *g, int i)
{
    if (g->dev[i] != NULL)
        return g->dev[i];
    mt_backend_cfg_t cfg = g->cfg;
    cfg.device = i;
    mt_backend_t *b = NULL;
    bool *peers = calloc((size_t)g->n, sizeof *peers);
    if (peers == NULL || device_open(&b, &cfg) != 0) {
        free(peers);
        return NULL;
    }
    C(b)->peer_access = peers;
    C(b)->group = g;
    capable_peers(C(b), g->n, &cfg);
    g->dev[i] = C(b);
    return g->dev[i];
}

/* NULL (backend.c returns MT_ENODEV) when the device's context cannot be had. */
mt_backend_t *mt__cuda_get_device(mt_backend_t *b, int ordinal)
{
    cuda_group_t *g = C(b)->group;
    pthread_mutex_lock(&g->mu);
    cuda_t *c = group_device(g, ordinal);
    pthread_mutex_unlock(&g->mu);
    return c ? &c->base : NULL;
}

/* Device b may now read and write device peer's memory: cuCtxEnablePeerAccess (already
 * enabled is fine: the program's runtime may have done it), then every page peer has
 * mapped for expandable segments is granted to b's device, and later maps are too. */
static int cuda_enable_peer_access(mt_backend_t *b, int peer)
{
    cuda_t *c = C(b);
    mt_backend_t *pb = mt__cuda_get_device(b, peer);
    if (pb == NULL)
        return MT_ENODEV;
    cuda_t *p = C(pb);
    int rc = mt__cuda_enter(c);
    if (rc == 0) {
        int res = c->drv.CtxEnablePeerAccess(p->ctx, 0);
        rc = res == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED ? 0 : mt__cuda_note(res);
        mt__cuda_leave(c);
    }
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&p->mu);
    bool was = p->peer_access[c->dev];
    p->peer_access[c->dev] = true;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = c->dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (cuda_vm_t *v = p->vms; v != NULL && !was && rc == 0; v = v->next)
        for (size_t i = 0; i < v->npages && rc == 0;) {
            size_t j = i;
            while (j < v->npages && v->pages[j] != 0)
                j++;
            if (j > i)
                rc = CALL(p, MemSetAccess(v->base + i * p->granularity, (j - i) * p->granularity,
                                          &acc, 1));
            i = j + 1;
        }
    if (rc != 0)
        p->peer_access[c->dev] = false;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int mt__backend_cuda_create(mt_backend_t **out, const mt_backend_cfg_t *cfg)
{
    mt_backend_t *b = NULL;
    int rc = device_open(&b, cfg);
    if (rc != 0)
        return rc;
    cuda_t *c = C(b);
    int count = 0;
    rc = MT_ENOMEM;
    cuda_group_t *g = calloc(1, sizeof *g);
    if (g == NULL)
        goto fail_group;
    if (c->drv.DeviceGetCount(&count) != CUDA_SUCCESS || count < 1) {
        rc = MT_ENODEV;
        goto fail_count;
    }
    g->n = count;
    g->cfg = *cfg;
    g->dev = calloc((size_t)count, sizeof *g->dev);
    c->peer_access = calloc((size_t)count, sizeof *c->peer_access);
    if (g->dev == NULL || c->peer_access == NULL)
        goto fail_count;
    if (pthread_mutex_init(&g->mu, NULL) != 0)
        goto fail_count;
    c->group = g;
    c->owner = true;
    capable_peers(c, count, cfg);
    g->dev[cfg->device] = c;
    *out = b;
    return 0;

fail_count:
    free(g->dev);
    free(g);
fail_group:
    device_close(b);
    return rc;
}

static const mt_backend_ops_t cuda_ops = {
    .name = "cuda",
    .kind = MT_BACKEND_CUDA,
    .destroy = cuda_destroy,
    .malloc = mt__cuda_malloc,
    .free = mt__cuda_free,
    .mem_get_info = mt__cuda_mem_get_info,
    .process_used = mt__cuda_process_used,
    .is_device_ptr = mt__cuda_is_device_ptr,
    .vm_granularity = mt__cuda_vm_granularity,
    .vm_reserve = mt__cuda_vm_reserve,
    .vm_release = mt__cuda_vm_release,
    .vm_map = mt__cuda_vm_map,
    .vm_unmap = mt__cuda_vm_unmap,
    .stream_create = mt__cuda_stream_create,
    .stream_destroy = mt__cuda_stream_destroy,
    .stream_synchronize = mt__cuda_stream_synchronize,
    .stream_wait_event = mt__cuda_stream_wait_event,
    .launch_host_func = mt__cuda_launch_host_func,
    .memcpy_async = mt__cuda_memcpy_async,
    .memset_async = mt__cuda_memset_async,
    .device_synchronize = mt__cuda_device_synchronize,
    .event_create = mt__cuda_event_create,
    .event_destroy = mt__cuda_event_destroy,
    .event_record = mt__cuda_event_record,
    .event_query = mt__cuda_event_query,
    .event_synchronize = mt__cuda_event_synchronize,
    .event_time_ns = mt__cuda_event_time_ns,
    .host_malloc = mt__cuda_host_malloc,
    .host_free = mt__cuda_host_free,
    .device_count = cuda_device_count,
    .get_device = mt__cuda_get_device,
    .memcpy_peer_async = mt__cuda_memcpy_peer_async,
    .enable_peer_access = cuda_enable_peer_access,
    .event_create_timed = mt__cuda_event_create_timed,
    .host_malloc_flags = mt__cuda_host_malloc_flags,
    .malloc_async = mt__cuda_malloc_async,
    .free_async = mt__cuda_free_async,
    .pool_set_release_threshold = mt__cuda_pool_set_release_threshold,
    .pool_trim_to = mt__cuda_pool_trim_to,
    .pool_usage = mt__cuda_pool_usage,
    .pool_reset_high = mt__cuda_pool_reset_high,
    .managed_malloc = mt__cuda_managed_malloc,
    .managed_free = mt__cuda_managed_free,
    .managed_prefetch = mt__cuda_managed_prefetch,
    .managed_advise = mt__cuda_managed_advise,
    .managed_stats = mt__cuda_managed_stats,
    .is_managed = mt__cuda_is_managed,
};
