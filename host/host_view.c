/* The pinned host cache: the caching allocator run over a "host view" of a device backend.
 *
 * Rather than a second allocator, the view is a backend (mt_backend_ops_t) whose malloc and
 * free are the wrapped device backend's pinned host_malloc/host_free, whose mem_get_info
 * reports the pinning limit, and whose streams, events and copies are the device's own
 * (same handles). An mt_alloc_t created over the view therefore caches pinned memory with
 * the device allocator's policies and its stream discipline.
 *
 * Who owns a pinned block: the CPU, not a stream. The CPU writes a staging block directly,
 * so reuse must wait for every stream that reads it, including the one the copy ran on.
 * Blocks are therefore allocated on a private "owner" stream on which no work is ever
 * queued; every real stream that touches a block is a recorded use, and the allocator's
 * free records an event on each and reuses the block only when they completed.
 *
 * Events: the allocator reports pools small/large; a sink wrapper relabels every event of
 * this cache as pool MT_POOL_HOST before it reaches the program's sink. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "memtrace/host.h"
#include "util/entry.h"
#include "util/grow.h"

/* One pinned allocation made through the view. */
typedef struct hv_chunk_s {
    void *ptr;
    size_t size;
} hv_chunk_t;

/* The view backend.
 * Invariants (under mu): used = sum of chunk sizes; used <= capacity; chunks holds exactly
 * the live host_malloc results of this view. */
typedef struct host_view_s {
    mt_backend_t base;    /* must be first: backend.c sees this */
    mt_backend_ops_t ops; /* host_view_ops with the wrapped backend's kind */
    mt_backend_t *dev;    /* borrowed: the wrapped device backend */
    size_t capacity;      /* pinning limit, bytes */
    pthread_mutex_t mu;
    size_t used;
    hv_chunk_t *chunks;
    size_t nchunks, cap_chunks;
} host_view_t;

struct mt_host_cache_s {
    host_view_t *view;           /* owned */
    mt_alloc_t *alloc;           /* owned, over view */
    mt_stream_t *owner;          /* owned (on dev): the CPU's pseudo-stream, never used */
    mt_event_sink_t relabel;     /* what the allocator emits to */
    const mt_event_sink_t *sink; /* the program's sink, borrowed, may be NULL */
};

static host_view_t *hv(const mt_backend_t *b)
{
    return (host_view_t *)b;
}

static mt_backend_t *dev_of(const mt_backend_t *b)
{
    return hv(b)->dev;
}

/* ---- memory: pinned host pages ---- */

static int hv_malloc(mt_backend_t *b, size_t size, void **out)
{
    host_view_t *v = hv(b);
    pthread_mutex_lock(&v->mu);
    int rc = 0;
    if (size > v->capacity - v->used) {
        rc = MT_ENOMEM;
        goto out;
    }
    hv_chunk_t *nc = mt__grow(v->chunks, &v->cap_chunks, v->nchunks + 1, sizeof *nc, 16);
    if (nc == NULL) {
        rc = MT_ENOMEM;
        goto out;
    }
    v->chunks = nc;
    void *p = NULL;
    rc = v->dev->ops->host_malloc(v->dev, size, &p);
    if (rc != 0)
        goto out;
    v->chunks[v->nchunks++] = (hv_chunk_t){p, size};
    v->used += size;
    *out = p;
out:
    pthread_mutex_unlock(&v->mu);
    return rc;
}

static int hv_free(mt_backend_t *b, void *ptr)
{
    host_view_t *v = hv(b);
    pthread_mutex_lock(&v->mu);
    int rc = MT_ENOENT;
    for (size_t i = 0; i < v->nchunks; i++) {
        if (v->chunks[i].ptr != ptr)
            continue;
        rc = v->dev->ops->host_free(v->dev, ptr);
        if (rc == 0) {
            v->used -= v->chunks[i].size;
            v->chunks[i] = v->chunks[--v->nchunks];
        }
        break;
    }
    pthread_mutex_unlock(&v->mu);
    return rc;
}

static int hv_mem_get_info(mt_backend_t *b, size_t *free_bytes, size_t *total_bytes)
{
    host_view_t *v = hv(b);
    pthread_mutex_lock(&v->mu);
    *free_bytes = v->capacity - v->used;
    *total_bytes = v->capacity;
    pthread_mutex_unlock(&v->mu);
    return 0;
}

static bool hv_is_device_ptr(const mt_backend_t *b, const void *ptr)
{
    host_view_t *v = hv(b);
    bool found = false;
    pthread_mutex_lock(&v->mu);
    for (size_t i = 0; i < v->nchunks && !found; i++)
        found = (uintptr_t)ptr - (uintptr_t)v->chunks[i].ptr < v->chunks[i].size;
    pthread_mutex_unlock(&v->mu);
    return found;
}

/* Pinned memory has no virtual-memory API: the granularity is reported (backend.c divides
 * by it) but the vm ops are absent, so expandable segments are refused with MT_ENOTSUP. */
static size_t hv_vm_granularity(const mt_backend_t *b)
{
    const mt_backend_t *d = dev_of(b);
    return d->ops->vm_granularity(d);
}

static void hv_destroy(mt_backend_t *b)
{
    host_view_t *v = hv(b);
    for (size_t i = 0; i < v->nchunks; i++)
        (void)v->dev->ops->host_free(v->dev, v->chunks[i].ptr);
    free(v->chunks);
    pthread_mutex_destroy(&v->mu);
    free(v);
}

/* ---- streams, events, copies: the device's own ---- */

static int hv_stream_create(mt_backend_t *b, mt_stream_t **out)
{
    return dev_of(b)->ops->stream_create(dev_of(b), out);
}

static void hv_stream_destroy(mt_backend_t *b, mt_stream_t *s)
{
    dev_of(b)->ops->stream_destroy(dev_of(b), s);
}

static int hv_stream_synchronize(mt_backend_t *b, mt_stream_t *s)
{
    return dev_of(b)->ops->stream_synchronize(dev_of(b), s);
}

static int hv_stream_wait_event(mt_backend_t *b, mt_stream_t *s, mt_event_t *ev)
{
    return dev_of(b)->ops->stream_wait_event(dev_of(b), s, ev);
}

static int hv_launch_host_func(mt_backend_t *b, mt_stream_t *s, void (*fn)(void *), void *ud)
{
    return dev_of(b)->ops->launch_host_func(dev_of(b), s, fn, ud);
}

static int hv_memcpy_async(mt_backend_t *b, void *dst, const void *src, size_t n,
                           mt_memcpy_kind_e kind, mt_stream_t *s)
{
    return dev_of(b)->ops->memcpy_async(dev_of(b), dst, src, n, kind, s);
}

static int hv_memset_async(mt_backend_t *b, void *dst, int value, size_t n, mt_stream_t *s)
{
    return dev_of(b)->ops->memset_async(dev_of(b), dst, value, n, s);
}

static int hv_device_synchronize(mt_backend_t *b)
{
    return dev_of(b)->ops->device_synchronize(dev_of(b));
}

static int hv_event_create(mt_backend_t *b, mt_event_t **out)
{
    return dev_of(b)->ops->event_create(dev_of(b), out);
}

static void hv_event_destroy(mt_backend_t *b, mt_event_t *ev)
{
    dev_of(b)->ops->event_destroy(dev_of(b), ev);
}

static int hv_event_record(mt_backend_t *b, mt_event_t *ev, mt_stream_t *s)
{
    return dev_of(b)->ops->event_record(dev_of(b), ev, s);
}

static int hv_event_query(mt_backend_t *b, mt_event_t *ev)
{
    return dev_of(b)->ops->event_query(dev_of(b), ev);
}

static int hv_event_synchronize(mt_backend_t *b, mt_event_t *ev)
{
    return dev_of(b)->ops->event_synchronize(dev_of(b), ev);
}

static uint64_t hv_event_time_ns(mt_backend_t *b, mt_event_t *ev)
{
    return dev_of(b)->ops->event_time_ns(dev_of(b), ev);
}

static int hv_host_malloc(mt_backend_t *b, size_t size, void **out)
{
    return dev_of(b)->ops->host_malloc(dev_of(b), size, out);
}

static int hv_host_free(mt_backend_t *b, void *ptr)
{
    return dev_of(b)->ops->host_free(dev_of(b), ptr);
}

static const mt_backend_ops_t host_view_ops = {
    .name = "host",
    .kind = MT_BACKEND_AUTO, /* replaced per view by the wrapped backend's kind */
    .destroy = hv_destroy,
    .malloc = hv_malloc,
    .free = hv_free,
    .mem_get_info = hv_mem_get_info,
    .is_device_ptr = hv_is_device_ptr,
    .vm_granularity = hv_vm_granularity,
    .stream_create = hv_stream_create,
    .stream_destroy = hv_stream_destroy,
    .stream_synchronize = hv_stream_synchronize,
    .stream_wait_event = hv_stream_wait_event,
    .launch_host_func = hv_launch_host_func,
    .memcpy_async = hv_memcpy_async,
    .memset_async = hv_memset_async,
    .device_synchronize = hv_device_synchronize,
    .event_create = hv_event_create,
    .event_destroy = hv_event_destroy,
    .event_record = hv_event_record,
    .event_query = hv_event_query,
    .event_synchronize = hv_event_synchronize,
    .event_time_ns = hv_event_time_ns,
    .host_malloc = hv_host_malloc,
    .host_free = hv_host_free,
};

static int view_create(mt_backend_t *dev, size_t capacity, host_view_t **out)
{
    host_view_t *v = calloc(1, sizeof *v);
    if (v == NULL)
        return MT_ENOMEM;
    if (pthread_mutex_init(&v->mu, NULL) != 0) {
        free(v);
        return MT_ENOMEM;
    }
    v->ops = host_view_ops;
    v->ops.kind = dev->ops->kind;
    v->base.ops = &v->ops;
    v->base.device = dev->device;
    v->base.log = dev->log;
    v->base.log_ud = dev->log_ud;
    v->dev = dev;
    v->capacity = capacity;
    *out = v;
    return 0;
}

/* ---- the cache ---- */

static void relabel_emit(void *ud, const mt_event_rec_t *ev)
{
    const mt_host_cache_t *h = ud;
    mt_event_rec_t e = *ev;
    e.pool = MT_POOL_HOST;
    h->sink->emit(h->sink->ud, &e);
}

static void relabel_emit_n(void *ud, const mt_event_rec_t *ev, size_t n)
{
    const mt_host_cache_t *h = ud;
    mt_event_rec_t e[4];
    if (h->sink->emit_n == NULL || n > 4) {
        for (size_t i = 0; i < n; i++)
            relabel_emit(ud, &ev[i]);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        e[i] = ev[i];
        e[i].pool = MT_POOL_HOST;
    }
    h->sink->emit_n(h->sink->ud, e, n);
}

/* Pinned allocations' stacks: the program's sink is asked, for pool host. */
static uint32_t relabel_stack(void *ud, uint64_t bytes, int pool, int mode)
{
    (void)pool;
    const mt_host_cache_t *h = ud;
    return h->sink->stack ? h->sink->stack(h->sink->ud, bytes, MT_POOL_HOST, mode) : 0;
}

static size_t default_capacity(void)
{
    long pages = sysconf(_SC_PHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return (size_t)1 << 30;
    return (size_t)pages * (size_t)page / 2;
}

mt_host_cfg_t mt_host_cfg_default(void)
{
    mt_host_cfg_t c;
    memset(&c, 0, sizeof c);
    c.max_split_size = SIZE_MAX;
    return c;
}

int mt_host_cache_create(mt_host_cache_t **out, const mt_host_cfg_t *cfg)
{
    if (out == NULL || cfg == NULL || cfg->backend == NULL)
        return MT_EINVAL;
    *out = NULL;
    mt_host_cache_t *h = calloc(1, sizeof *h);
    if (h == NULL)
        return MT_ENOMEM;
    size_t cap = cfg->capacity ? cfg->capacity : default_capacity();
    int rc = view_create(cfg->backend, cap, &h->view);
    if (rc != 0)
        goto fail;
    rc = mt_stream_create(cfg->backend, &h->owner);
    if (rc != 0)
        goto fail;
    h->sink = mt_event_sink_records(cfg->sink) ? cfg->sink : NULL;
    h->relabel = (mt_event_sink_t){
        .emit = relabel_emit, .emit_n = relabel_emit_n, .stack = relabel_stack, .ud = h};

    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = &h->view->base;
    ac.max_split_size = cfg->max_split_size;
    ac.expandable_segments = false; /* pinned memory cannot be mapped page by page */
    ac.sink = h->sink ? &h->relabel : NULL;
    ac.log = cfg->log;
    ac.log_ud = cfg->log_ud;
    rc = mt_alloc_create(&h->alloc, &ac);
    if (rc != 0)
        goto fail;
    *out = h;
    return 0;
fail:
    mt_stream_destroy(cfg->backend, &h->owner);
    if (h->view != NULL)
        hv_destroy(&h->view->base);
    free(h);
    return rc;
}

void mt_host_cache_destroy(mt_host_cache_t **p)
{
    if (p == NULL || *p == NULL)
        return;
    mt_host_cache_t *h = *p;
    mt_backend_t *dev = h->view->dev;
    mt_alloc_destroy(&h->alloc); /* waits for the pending copies' events */
    mt_stream_destroy(dev, &h->owner);
    hv_destroy(&h->view->base);
    free(h);
    *p = NULL;
}

int mt_host_malloc(mt_host_cache_t *h, size_t size, int tag, void **out)
{
    if (h == NULL)
        return MT_EINVAL;
    uintptr_t entry = mt__entry_enter((uintptr_t)__builtin_return_address(0));
    int rc = mt_alloc_malloc(h->alloc, size, h->owner, tag, out);
    mt__entry_leave(entry);
    return rc;
}

int mt_host_free(mt_host_cache_t *h, void *ptr)
{
    if (h == NULL)
        return MT_EINVAL;
    return mt_alloc_free(h->alloc, ptr);
}

int mt_host_record_stream(mt_host_cache_t *h, void *ptr, mt_stream_t *stream)
{
    if (h == NULL)
        return MT_EINVAL;
    return mt_alloc_record_stream(h->alloc, ptr, stream);
}

mt_alloc_t *mt_host_cache_alloc(mt_host_cache_t *h)
{
    return h ? h->alloc : NULL;
}

mt_backend_t *mt_host_cache_device(const mt_host_cache_t *h)
{
    return h ? h->view->dev : NULL;
}

size_t mt_host_cache_pinned_bytes(mt_host_cache_t *h)
{
    mt_alloc_stats_t st;
    if (h == NULL || mt_alloc_stats(h->alloc, &st) != 0)
        return 0;
    return (size_t)st.reserved_bytes[MT_STAT_ALL].current;
}
