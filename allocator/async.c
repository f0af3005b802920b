/* backend:cudaMallocAsync: every request goes to the backend's stream-ordered pool (the
 * driver's default pool on cuda, its model on sim) instead of the caching allocator's
 * segments, as PyTorch's CUDAMallocAsyncAllocator does. docs/allocator-async.md.
 *
 * What follows PyTorch: the pool's release threshold is set to UINT64_MAX at creation (the
 * pool keeps what it got); a free goes to the stream the block was allocated on, or, when
 * record_stream named other streams, to a unifying stream of the allocator made to wait
 * on every one of them; memory_fraction is a cap on the allocator's own allocated bytes,
 * checked before asking the pool; empty_cache synchronizes the device and trims the pool
 * to nothing; an OOM is not retried (the pool itself gave back what it could first).
 * What memtrace adds: the counters are the caching allocator's vocabulary, kept per
 * allocation (allocated, requested, counts, tags, peaks) with reserved read from the pool
 * after every operation that can change it, and every allocation and free goes to the
 * event sink. The pool's chunks have no addresses the driver tells, so no segment events
 * are sent: pool growth and shrink show in the reserved total every event carries. */
#include <stdlib.h>
#include <string.h>

#include "allocator/internal.h"
#include "util/addrmap.h"
#include "util/grow.h"

#define ASYNC_ALIGN ((size_t)512) /* the pool's alignment: allocated bytes are counted so */

/* One live allocation. uses: streams other than stream that used it (record_stream). */
typedef struct async_rec_s {
    uintptr_t addr; /* != 0 */
    size_t size;    /* bytes counted as allocated: requested rounded up to ASYNC_ALIGN */
    size_t requested;
    mt_stream_t *stream; /* the stream it was allocated on (its free goes there) */
    mt_stream_t **uses;
    uint32_t nuses, cap_uses;
    uint8_t tag;
} async_rec_t;

/* Invariants (under the allocator's mu): recs[0..n) are the live allocations, in no order,
 * distinct addresses; at maps each one's addr to its index (at.n = n); n <= cap;
 * allocated_bytes[ALL] = sum of sizes, requested_bytes[ALL] = sum of requested,
 * allocation[ALL] = active[ALL] = n, active_bytes = allocated_bytes; SMALL and LARGE stay 0
 * (the pool has no size classes: PyTorch reports only the aggregate). */
struct mt__async_s {
    async_rec_t *recs; /* n live allocations; cap allocated */
    size_t cap, n;
    mt__amap_t at;      /* addr -> index in recs */
    mt_stream_t *unify; /* made on the first free of a block used on several streams */
    uintptr_t lo, hi;   /* every allocation ever made lies in [lo, hi): lookups of other
                         * devices' pointers end at once (0, 0 before the first) */
};

/* ---- the table ---- */

static async_rec_t *find(const mt__async_t *as, uintptr_t addr)
{
    uint64_t i;
    return mt__amap_get(&as->at, addr, &i) == 0 ? &as->recs[i] : NULL;
}

static int insert(mt__async_t *as, const async_rec_t *r)
{
    async_rec_t *v = mt__grow(as->recs, &as->cap, as->n + 1, sizeof *v, 64);
    if (v == NULL)
        return MT_ENOMEM;
    as->recs = v;
    int rc = mt__amap_put(&as->at, r->addr, as->n);
    if (rc == 0)
        as->recs[as->n++] = *r;
    return rc;
}

/* The last record moves into r's place. */
static void erase(mt__async_t *as, async_rec_t *r)
{
    size_t i = (size_t)(r - as->recs);
    free(r->uses);
    (void)mt__amap_del(&as->at, r->addr);
    if (i < --as->n) {
        as->recs[i] = as->recs[as->n];
        (void)mt__amap_put(&as->at, as->recs[i].addr, i); /* replaces: no allocation */
    }
}

/* ---- reserved, from the pool ---- */

/* Brings reserved_bytes[ALL] to what the pool holds, counting growth and shrink as device
 * allocations and frees; returns the bytes the pool gave back since the last call. */
static size_t refresh(mt_alloc_t *a)
{
    mt_pool_usage_t u;
    if (mt_backend_pool_usage(a->backend, &u) != 0)
        return 0;
    int64_t d = (int64_t)u.reserved - a->st.reserved_bytes[MT_STAT_ALL].current;
    mt__stat_add1(&a->st.reserved_bytes[MT_STAT_ALL], d);
    if (d > 0)
        a->st.num_device_alloc++;
    else if (d < 0)
        a->st.num_device_free++;
    return d < 0 ? (size_t)-d : 0;
}

/* ---- lifecycle ---- */

/* The caching allocator's keys PyTorch ignores under backend:cudaMallocAsync (with a
 * warning), when set to other than memtrace's default. */
static void warn_native_keys(mt_alloc_t *a)
{
    mt_alloc_cfg_t d = mt_alloc_cfg_default();
    const mt_alloc_cfg_t *c = &a->cfg;
    const char *keys[5];
    int n = 0;
    if (c->max_split_size != d.max_split_size)
        keys[n++] = "max_split_size_mb";
    if (c->max_non_split_rounding != d.max_non_split_rounding)
        keys[n++] = "max_non_split_rounding_mb";
    if (memcmp(c->roundup_power2_divisions, d.roundup_power2_divisions,
               sizeof d.roundup_power2_divisions) != 0)
        keys[n++] = "roundup_power2_divisions";
    if (c->garbage_collection_threshold != d.garbage_collection_threshold)
        keys[n++] = "garbage_collection_threshold";
    if (c->expandable_segments != d.expandable_segments)
        keys[n++] = "expandable_segments";
    for (int i = 0; i < n; i++)
        mt__alloc_log(a, MT_LOG_WARN,
                      "memtrace: backend:cudaMallocAsync ignores %s (a caching-allocator key, "
                      "as PyTorch ignores it)",
                      keys[i]);
}

int mt__async_init(mt_alloc_t *a)
{
    mt__async_t *as = calloc(1, sizeof *as);
    if (as == NULL)
        return MT_ENOMEM;
    /* PyTorch's: the pool keeps what it got; only empty_cache gives memory back. */
    int rc = mt_backend_pool_set_release_threshold(a->backend, UINT64_MAX);
    if (rc != 0) {
        mt__alloc_log(a, MT_LOG_ERROR,
                      "memtrace: backend:cudaMallocAsync: the %s backend has no stream-ordered "
                      "pool (%s)",
                      mt_backend_name(a->backend), mt_strerror(rc));
        free(as);
        return rc;
    }
    a->async = as;
    a->st_one = false;     /* the pool's counters keep [ALL] alone, [LARGE] staying 0 */
    a->cfg.tcache = false; /* every request goes to the pool */
    warn_native_keys(a);
    (void)refresh(a);
    return 0;
}

void mt__async_fini(mt_alloc_t *a)
{
    mt__async_t *as = a->async;
    /* Live allocations go back with the allocator, as the caching allocator's do. */
    for (size_t i = 0; i < as->n; i++) {
        async_rec_t *r = &as->recs[i];
        (void)mt_backend_free_async(a->backend, (void *)r->addr, r->stream);
        free(r->uses);
    }
    mt_stream_destroy(a->backend, &as->unify);
    mt__amap_fini(&as->at);
    free(as->recs);
    free(as);
    a->async = NULL;
}

/* ---- malloc and free ---- */

static int fail(mt_alloc_t *a, size_t size, mt_stream_t *stream, int tag, const char *why)
{
    a->st.num_ooms++;
    size_t free_b = 0, total_b = 0;
    (void)mt_backend_mem_get_info(a->backend, &free_b, &total_b);
    mt__alloc_emit_device(a);
    mt__alloc_emit(a, MT_EV_OOM, 0, free_b, size, mt_stream_id(stream), MT_POOL_LARGE, tag);
    mt__alloc_oom_report(a, size, size, why);
    mt__oom_call_t call;
    mt__oom_prepare(a, size, &call);
    mt__alloc_unlock(a);
    mt__oom_run(&call);
    return MT_ENOMEM;
}

int mt__async_malloc(mt_alloc_t *a, size_t size, mt_stream_t *stream, int tag, void **out)
{
    mt__async_t *as = a->async;
    mt__alloc_lock(a);
    if (size > ((size_t)1 << 60))
        return fail(a, size, stream, tag, "size beyond any device");
    size_t rsize = (size + ASYNC_ALIGN - 1) / ASYNC_ALIGN * ASYNC_ALIGN;
    if ((size_t)a->st.allocated_bytes[MT_STAT_ALL].current + rsize > a->limit)
        return fail(a, size, stream, tag, "memory fraction limit");
    void *p = NULL;
    int rc = mt_backend_malloc_async(a->backend, size, stream, &p);
    (void)refresh(a);
    if (rc == MT_ENOMEM)
        return fail(a, size, stream, tag, "the stream-ordered pool could not grow");
    if (rc != 0)
        goto out;
    async_rec_t r = {.addr = (uintptr_t)p,
                     .size = rsize,
                     .requested = size,
                     .stream = stream,
                     .tag = (uint8_t)tag};
    rc = insert(as, &r);
    if (rc == 0) {
        as->lo = as->lo == 0 || r.addr < as->lo ? r.addr : as->lo;
        as->hi = r.addr + rsize > as->hi ? r.addr + rsize : as->hi;
    }
    if (rc != 0) {
        (void)mt_backend_free_async(a->backend, p, stream);
        goto out;
    }
    mt__stat_inc1(&a->st.allocated_bytes[MT_STAT_ALL], (int64_t)rsize);
    mt__scope_track(a);
    mt__stat_inc1(&a->st.requested_bytes[MT_STAT_ALL], (int64_t)size);
    mt__stat_inc1(&a->st.allocation[MT_STAT_ALL], 1);
    mt__stat_inc1(&a->st.active_bytes[MT_STAT_ALL], (int64_t)rsize);
    mt__stat_inc1(&a->st.active[MT_STAT_ALL], 1);
    mt__stat_inc1(&a->st.tag_allocated_bytes[tag], (int64_t)rsize);
    mt__stat_inc1(&a->st.tag_requested_bytes[tag], (int64_t)size);
    mt__alloc_emit(a, MT_EV_ALLOC, r.addr, rsize, size, mt_stream_id(stream), MT_POOL_LARGE, tag);
    *out = p;
out:
    mt__alloc_unlock(a);
    return rc;
}

/* Makes the unifying stream wait for the work queued so far on s. */
static int join(mt_alloc_t *a, mt_stream_t *s)
{
    mt_event_t *ev = NULL;
    int rc = mt_event_create(a->backend, &ev);
    if (rc == 0)
        rc = mt_event_record(a->backend, ev, s);
    if (rc == 0)
        rc = mt_stream_wait_event(a->backend, a->async->unify, ev);
    mt_event_destroy(a->backend, &ev);
    return rc;
}

/* The stream r's free goes to: its own, or, used on others too, the unifying stream after
 * all of them (PyTorch's free_impl); NULL-safe on failure (*out untouched). */
static int free_stream(mt_alloc_t *a, const async_rec_t *r, mt_stream_t **out)
{
    mt__async_t *as = a->async;
    if (r->nuses == 0) {
        *out = r->stream;
        return 0;
    }
    int rc = as->unify != NULL ? 0 : mt_stream_create(a->backend, &as->unify);
    if (rc == 0)
        rc = join(a, r->stream);
    for (uint32_t i = 0; i < r->nuses && rc == 0; i++)
        rc = join(a, r->uses[i]);
    if (rc == 0)
        *out = as->unify;
    return rc;
}

int mt__async_free(mt_alloc_t *a, void *ptr)
{
    mt__alloc_lock(a);
    async_rec_t *r = find(a->async, (uintptr_t)ptr);
    int rc = MT_ENOENT;
    if (r == NULL)
        goto out;
    mt_stream_t *s = NULL;
    rc = free_stream(a, r, &s);
    if (rc == 0)
        rc = mt_backend_free_async(a->backend, ptr, s);
    if (rc != 0) {
        /* Still the program's: a failed free leaves the block and its counters as they were. */
        mt__alloc_log(a, MT_LOG_ERROR, "memtrace: cudaFreeAsync of %p failed: %s", ptr,
                      mt_strerror(rc));
        goto out;
    }
    mt__stat_sub1(&a->st.allocated_bytes[MT_STAT_ALL], (int64_t)r->size);
    mt__stat_sub1(&a->st.requested_bytes[MT_STAT_ALL], (int64_t)r->requested);
    mt__stat_sub1(&a->st.allocation[MT_STAT_ALL], 1);
    mt__stat_sub1(&a->st.active_bytes[MT_STAT_ALL], (int64_t)r->size);
    mt__stat_sub1(&a->st.active[MT_STAT_ALL], 1);
    mt__stat_sub1(&a->st.tag_allocated_bytes[r->tag], (int64_t)r->size);
    mt__stat_sub1(&a->st.tag_requested_bytes[r->tag], (int64_t)r->requested);
    if (__builtin_expect(a->cfg.sink != NULL, 0)) {
        /* Back in the pool as far as the allocator can tell: requested and completed at
         * once, one stamp for both, as a caching-allocator free without other streams. */
        uint64_t t = mt__clock_now(&a->clk);
        mt_event_rec_t ev[2];
        uint32_t sid = mt_stream_id(r->stream);
        mt__alloc_fill_rec(a, &ev[0], MT_EV_FREE_REQUESTED, r->addr, r->size, r->requested, sid,
                           MT_POOL_LARGE, r->tag, t);
        mt__alloc_fill_rec(a, &ev[1], MT_EV_FREE_COMPLETED, r->addr, r->size, 0, sid, MT_POOL_LARGE,
                           r->tag, t);
        mt__alloc_emit_recs(a, ev, 2);
        mt__alloc_stats_due(a, t);
    }
    erase(a->async, r);
    (void)refresh(a);
out:
    mt__alloc_unlock(a);
    return rc;
}

int mt__async_record_stream(mt_alloc_t *a, void *ptr, mt_stream_t *stream)
{
    mt__alloc_lock(a);
    async_rec_t *r = find(a->async, (uintptr_t)ptr);
    int rc = r == NULL ? MT_ENOENT : 0;
    bool known = r == NULL || stream == r->stream;
    for (uint32_t i = 0; !known && i < r->nuses; i++)
        known = r->uses[i] == stream;
    if (!known && r->nuses == r->cap_uses) {
        uint32_t cap = r->cap_uses ? 2 * r->cap_uses : 4;
        mt_stream_t **v = realloc(r->uses, cap * sizeof *v);
        if (v == NULL)
            rc = MT_ENOMEM;
        else {
            r->uses = v;
            r->cap_uses = cap;
        }
    }
    if (!known && rc == 0)
        r->uses[r->nuses++] = stream;
    mt__alloc_unlock(a);
    return rc;
}

int mt__async_block_info(mt_alloc_t *a, const void *ptr, void **base, size_t *size, int *tag)
{
    mt__alloc_lock(a);
    mt__async_t *as = a->async;
    const async_rec_t *r = find(as, (uintptr_t)ptr);
    bool inside = (uintptr_t)ptr >= as->lo && (uintptr_t)ptr < as->hi;
    for (size_t i = 0; r == NULL && inside && i < as->n; i++) {
        /* An interior pointer: the pool tells no block boundaries, so every one is looked at. */
        const async_rec_t *x = &as->recs[i];
        if ((uintptr_t)ptr > x->addr && (uintptr_t)ptr < x->addr + x->requested)
            r = x;
    }
    if (r != NULL) {
        if (base != NULL)
            *base = (void *)r->addr;
        if (size != NULL)
            *size = r->size;
        if (tag != NULL)
            *tag = r->tag;
    }
    mt__alloc_unlock(a);
    return r != NULL ? 0 : MT_ENOENT;
}

int mt__async_empty_cache(mt_alloc_t *a)
{
    mt__alloc_lock(a);
    (void)refresh(a);
    /* PyTorch's order: the device synchronized, then the pool trimmed to nothing. Both
     * are made with the lock held: nothing of the allocator is in flight under this
     * backend, and the pool's own lock orders them against other threads' requests. */
    int rc = mt_device_synchronize(a->backend);
    if (rc == 0)
        rc = mt_backend_pool_trim_to(a->backend, 0);
    size_t released = refresh(a);
    mt__alloc_emit(a, MT_EV_EMPTY_CACHE, 0, released, 0, 0, MT_POOL_NONE, 0);
    mt__alloc_unlock(a);
    return rc;
}

void mt__async_refresh(mt_alloc_t *a)
{
    (void)refresh(a);
}

const char *mt__async_is_valid(mt_alloc_t *a)
{
    const mt__async_t *as = a->async;
    int64_t bytes = 0, req = 0, n = 0, tags[MT_TAG_MAX] = {0};
    if (mt__amap_check(&as->at, NULL, 0) != 0)
        return "async: the address table breaks its invariants";
    for (size_t i = 0; i < as->n; i++) {
        const async_rec_t *r = &as->recs[i];
        if (r->addr == 0 || find(as, r->addr) != r)
            return "async: an allocation is not indexed by its address";
        if (r->requested == 0 || r->size < r->requested || r->size % ASYNC_ALIGN != 0)
            return "async: an allocation's size is not its request rounded to 512 B";
        if (r->addr < as->lo || r->addr + r->size > as->hi)
            return "async: an allocation lies outside [lo, hi)";
        bytes += (int64_t)r->size;
        req += (int64_t)r->requested;
        tags[r->tag] += (int64_t)r->size;
        n++;
    }
    const mt_alloc_stats_t *st = &a->st;
    if (as->at.n != as->n || as->n > as->cap)
        return "async: table count";
    if (st->allocated_bytes[MT_STAT_ALL].current != bytes ||
        st->active_bytes[MT_STAT_ALL].current != bytes)
        return "async: allocated/active bytes are not the sum of the live allocations";
    if (st->requested_bytes[MT_STAT_ALL].current != req)
        return "async: requested bytes are not the sum of the live requests";
    if (st->allocation[MT_STAT_ALL].current != n || st->active[MT_STAT_ALL].current != n)
        return "async: allocation counts are not the number of live allocations";
    for (int t = 0; t < MT_TAG_MAX; t++)
        if (st->tag_allocated_bytes[t].current != tags[t])
            return "async: a tag's bytes are not the sum of its live allocations";
    for (int p = MT_STAT_SMALL; p <= MT_STAT_LARGE; p++)
        if (st->allocated_bytes[p].current != 0 || st->reserved_bytes[p].current != 0)
            return "async: the small and large pools are not empty";
    if (a->nsegs != 0)
        return "async: the caching allocator holds segments";
    return NULL;
}
