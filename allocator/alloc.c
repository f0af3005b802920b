/* The caching allocator's front door: create/destroy, malloc (the global path), tags,
 * empty_cache (free and block lookup: free.c; events: emit.c).
 *
 * Hot path: a cached malloc/free pair on one stream is served by the thread's cache
 * (tcache.c) without the mutex. The global path: one mutex, a one-entry stream cache, an
 * O(1) bin lookup, an O(1) hash insert/remove, counter updates. No backend call unless a
 * free recorded events (then queries, only while events are pending), and no heap
 * allocation once the block-struct pool and the hash table are warm. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/entry.h"
#include "util/log.h"
#include "util/grow.h"
#include "allocator/tcache_impl.h"

/* ---- logging ---- */

void mt__alloc_log(mt_alloc_t *a, mt_log_level_e level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mt__vlogf(a->cfg.log, a->cfg.log_ud, level, fmt, ap);
    va_end(ap);
}

void mt_alloc_emit(mt_alloc_t *a, int kind, uint64_t addr, uint64_t size, int tag)
{
    if (a == NULL || a->cfg.sink == NULL)
        return;
    mt__alloc_lock(a);
    mt__tc_push_all(a);      /* the threads' cached operations before the program's marker */
    if (kind == MT_EV_STATS) /* one meaning for its fields, whoever asks for it */
        mt__alloc_emit_stats(a, mt__clock_now(&a->clk));
    else
        mt__alloc_emit(a, kind, addr, size, 0, 0, MT_POOL_NONE, tag);
    mt__alloc_unlock(a);
}

/* ---- rounding ---- */

/* The reference's rounding, as its round_size: at least 512 B, multiples of 512 B; with
 * N > 1 divisions for the size's interval and a size above N x 512 B, up to the next of N
 * equal steps between two powers of two (5 MiB + 1, N = 4: steps of 1 MiB -> 6 MiB). A
 * step is then at least 512 B, so every block stays 512-byte aligned. */
size_t mt__alloc_round_size(size_t size, unsigned divisions)
{
    if (size <= MT__MIN_BLOCK)
        return MT__MIN_BLOCK;
    if (divisions <= 1 || size <= (size_t)MT__MIN_BLOCK * divisions)
        return (size + MT__MIN_BLOCK - 1) & ~(MT__MIN_BLOCK - 1);
    if ((size & (size - 1)) == 0)
        return size;
    size_t floor2 = (size_t)1 << (63 - __builtin_clzll((unsigned long long)size));
    size_t step = floor2 / divisions;
    return (size + step - 1) & ~(step - 1);
}

unsigned mt__alloc_divisions(const mt_alloc_cfg_t *c, size_t size)
{
    int i = (63 - __builtin_clzll((unsigned long long)size | 1)) - 20; /* 2^20: 1 MiB */
    if (i < 0)
        i = 0;
    if (i >= MT_ALLOC_ROUNDUP_INTERVALS)
        i = MT_ALLOC_ROUNDUP_INTERVALS - 1;
    return __atomic_load_n(&c->roundup_power2_divisions[i], __ATOMIC_RELAXED);
}

/* ---- streams and bins ---- */

mt_streamrec_t *mt__alloc_streamrec(mt_alloc_t *a, mt_stream_t *s)
{
    mt__alloc_assert_owner(a);
    if (a->last_sr != NULL && a->last_sr->stream == s)
        return a->last_sr;
    for (size_t i = 0; i < a->nstreams; i++) {
        if (a->streams[i]->stream == s && a->streams[i]->pool == NULL) {
            a->last_sr = a->streams[i];
            return a->last_sr;
        }
    }
    mt_streamrec_t *sr = mt__alloc_streamrec_add(a, s, NULL);
    if (sr != NULL)
        a->last_sr = sr;
    return sr;
}

mt_streamrec_t *mt__alloc_streamrec_add(mt_alloc_t *a, mt_stream_t *s, mt__pool_t *pool)
{
    mt_streamrec_t **ns = mt__grow(a->streams, &a->cap_streams, a->nstreams + 1, sizeof *ns, 4);
    if (ns == NULL)
        return NULL;
    a->streams = ns;
    mt_streamrec_t *sr = calloc(1, sizeof *sr);
    if (sr == NULL)
        return NULL;
    sr->stream = s;
    sr->sid = mt_stream_id(s);
    sr->pool = pool;
    a->streams[a->nstreams++] = sr;
    return sr;
}

mt_binset_t *mt__alloc_binset(mt_alloc_t *a, mt_streamrec_t *sr, int bp)
{
    (void)a;
    if (sr->bins[bp] == NULL) {
        sr->bins[bp] = mt__bins_create(bp, sr->stream);
        if (sr->bins[bp] != NULL)
            sr->bins[bp]->sr = sr;
    }
    return sr->bins[bp];
}

/* ---- pending frees (the events and waits: pending.c) ---- */

/* ---- lifecycle ---- */

/* An adaptive mutex where the C library has one: a thread that finds the lock taken spins
 * a little before it sleeps, and the allocator's critical sections are short (a cached
 * pair holds it ~50 ns), so two threads mostly meet a lock about to be released instead
 * of paying a futex sleep and wake-up each (2 threads on 2 streams: 0.3x -> see
 * bench_alloc). */
static int mutex_init(pthread_mutex_t *mu)
{
#if defined(PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP)
    pthread_mutexattr_t at;
    if (pthread_mutexattr_init(&at) != 0)
        return -1;
    int rc = pthread_mutexattr_settype(&at, PTHREAD_MUTEX_ADAPTIVE_NP);
    if (rc == 0)
        rc = pthread_mutex_init(mu, &at);
    pthread_mutexattr_destroy(&at);
    return rc;
#else
    return pthread_mutex_init(mu, NULL);
#endif
}

/* The sink's flush asks for the events the thread caches keep back (event.h, source). */
static void push_events(void *arg)
{
    mt_alloc_t *a = arg;
    mt__alloc_lock(a);
    mt__tc_push_all(a);
    mt__alloc_unlock(a);
}

int mt_alloc_create(mt_alloc_t **out, const mt_alloc_cfg_t *cfg)
{
    if (out == NULL || cfg == NULL)
        return MT_EINVAL;
    *out = NULL;
    char err[256];
    int rc = mt__alloc_cfg_validate(cfg, err, sizeof err);
    if (rc != 0) {
        if (cfg->log != NULL)
            cfg->log(cfg->log_ud, MT_LOG_ERROR, err);
        return rc;
    }
    mt_alloc_t *a = calloc(1, sizeof *a);
    if (a == NULL)
        return MT_ENOMEM;
    a->cfg = *cfg;
    if (!mt_event_sink_records(cfg->sink))
        a->cfg.sink = NULL; /* a profiler that is off costs nothing: no sink at all */
    a->backend = cfg->backend;
    a->device = mt_backend_device(a->backend);
    size_t free_b = 0, total_b = 0;
    rc = mt_backend_mem_get_info(a->backend, &free_b, &total_b);
    if (rc != 0)
        goto fail_info;
    a->capacity = total_b;
    a->used_at_create = total_b - free_b;
    a->limit =
        cfg->memory_fraction >= 1.0 ? total_b : (size_t)((double)total_b * cfg->memory_fraction);
    if (cfg->managed_memory && cfg->memory_fraction >= 1.0)
        a->limit = SIZE_MAX; /* managed memory may oversubscribe the device */
    a->gc_limit = cfg->garbage_collection_threshold > 0.0
                      ? (size_t)((double)a->limit * cfg->garbage_collection_threshold)
                      : 0;
    a->vm_gran = mt_backend_vm_granularity(a->backend);
    for (size_t i = 0; i < MT_ALLOC_ROUNDUP_INTERVALS; i++)
        a->round_pow2 |= cfg->roundup_power2_divisions[i] > 1;
    a->st_one = true; /* no segment yet */
    a->small_max = a->cfg.expandable_segments && a->cfg.one_pool ? 0 : MT__SMALL_SIZE;
    rc = mt__addrmap_init(&a->map);
    if (rc != 0)
        goto fail_map;
    if (mutex_init(&a->mu) != 0) {
        rc = MT_ENOMEM;
        goto fail_mutex;
    }
    if (pthread_cond_init(&a->cv, NULL) != 0) {
        rc = MT_ENOMEM;
        goto fail_cond;
    }
    if (cfg->atfork && (rc = mt__alloc_fork_register()) != 0)
        goto fail_fork;
    mt__clock_init(&a->clk, a->cfg.sink != NULL); /* calibrating costs 50 us */
    a->stats_period_ns = (uint64_t)cfg->stats_period_ms * 1000000u;
    a->stats_next_ns = a->clk.last_ns + a->stats_period_ns; /* not at once: config says it */
    a->st.capacity = a->capacity;
    a->st.limit = a->limit;
    a->plan_ver = 1; /* a cached block's 0 means "not planned" */
    if (cfg->alloc_backend == MT_ALLOC_BACKEND_ASYNC && (rc = mt__async_init(a)) != 0)
        goto fail_async;
    if (mt__tc_register(a) != 0)
        a->id = 0; /* no registry entry: no thread caches, the rest works */
    *out = a;
    mt__alloc_lock(a);
    /* With a sink the thread caches' fast operations record too (emit.c). */
    a->rec = a->cfg.sink != NULL && a->cfg.tcache;
    /* The global path's events held back, when the sink can ask for them (none: at once). */
    if (a->rec && a->cfg.sink->source != NULL) {
        a->gb = malloc(MT__GB_CAP * sizeof(mt__evb_ent_t));
        a->gb_out = malloc(2 * MT__GB_CAP * sizeof(mt_event_rec_t));
        if (a->gb_out == NULL) {
            free(a->gb);
            a->gb = NULL;
        }
    }
    mt__tc_resume(a);
    mt__alloc_emit(a, MT_EV_CONFIG, 0, a->capacity, 0, 0, MT_POOL_NONE, 0);
    mt__alloc_emit_device(a); /* before any segment: what the context and others hold */
    mt__alloc_unlock(a);
    if (a->rec && a->cfg.sink->source != NULL)
        a->cfg.sink->source(a->cfg.sink->ud, push_events, a, true);
    return 0;

fail_async:
fail_fork:
    pthread_cond_destroy(&a->cv);
fail_cond:
    pthread_mutex_destroy(&a->mu);
fail_mutex:
    mt__addrmap_fini(&a->map);
fail_map:
fail_info:
    free(a);
    return rc;
}

void mt_alloc_destroy(mt_alloc_t **p)
{
    if (p == NULL || *p == NULL)
        return;
    mt_alloc_t *a = *p;
    if (a->rec && a->cfg.sink->source != NULL) /* before mu: a flush holds the sink's, then mu */
        a->cfg.sink->source(a->cfg.sink->ud, push_events, a, false);
    mt__tc_unregister(a); /* before mu: an exiting thread holds the registry, then mu */
    mt__alloc_lock_unbiased(a);
    mt__tc_free_all(a); /* what they hold is free, not a leak */
    if (a->async != NULL)
        mt__async_fini(a);
    /* The program's threads are done with a: nothing is in flight, and the waits below
     * leave nothing pending. */
    mt_assert(!mt__alloc_inflight(a));
    if (a->npending > 0)
        mt__alloc_sync_pending(a);
    mt__alloc_pending_drop(a); /* blocks of events inside a captured graph */
    mt_assert(a->npending == 0);
    int64_t leaks = a->st.allocation[MT_STAT_ALL].current;
    if (leaks > 0)
        mt__alloc_log(a, MT_LOG_WARN,
                      "memtrace: allocator destroyed with %lld live allocations (%lld bytes); "
                      "released with it",
                      (long long)leaks, (long long)a->st.allocated_bytes[MT_STAT_ALL].current);
    mt__plan_fini(a);
    mt__seg_destroy_all(a);
    for (size_t i = 0; i < a->nstreams; i++) {
        for (int bp = 0; bp < MT__BP_N; bp++)
            free(a->streams[i]->bins[bp]);
        free(a->streams[i]);
    }
    free(a->streams);
    mt__pool_fini(a);
    for (size_t i = 0; i < a->nevpool; i++)
        mt_event_destroy(a->backend, &a->evpool[i]);
    free(a->evpool);
    free(a->pending);
    free(a->wops);
    mt__addrmap_fini(&a->map);
    mt__blocks_fini(a);
    mt__alloc_gb_flush(a);
    free(a->gb);
    free(a->gb_out);
    a->gb = NULL;
    mt__alloc_unlock_raw(a); /* nothing left to check */
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a);
    *p = NULL;
}

mt_backend_t *mt_alloc_backend(const mt_alloc_t *a)
{
    return a ? a->backend : NULL;
}

/* ---- malloc ---- */

static size_t oversize_upper(const mt_alloc_t *a, size_t rsize)
{
    size_t ms = a->cfg.max_split_size;
    if (ms == SIZE_MAX)
        return SIZE_MAX;
    if (rsize < ms)
        return ms; /* never take an oversize block for a small request */
    size_t r = a->cfg.max_non_split_rounding;
    return rsize > SIZE_MAX - r ? SIZE_MAX : rsize + r;
}

/* A cached block for (sr, bp): the stream's warm-up reservation first, then the pool. */
static mt_block_t *find_cached(mt_alloc_t *a, mt_streamrec_t *sr, int bp, size_t rsize)
{
    mt_block_t *b = NULL;
    if (sr->bins[MT__BP_RESERVED] != NULL)
        b = mt__bins_find(sr->bins[MT__BP_RESERVED], rsize, SIZE_MAX);
    if (b == NULL)
        b = mt__bins_find(sr->bins[bp], rsize, oversize_upper(a, rsize));
    return b;
}

/* The reference's first step when no cached block fits: the free-memory callbacks, run
 * without the lock since they may free into this allocator (sr and its bins stay valid:
 * stream records are never freed before the allocator). Returns true when one of them freed
 * something; the caller then searches the cache again. One run at a time: a callback that
 * allocates, or another thread missing meanwhile, goes on without them. */
static bool run_free_callbacks(mt_alloc_t *a, size_t size, mt_stream_t *stream)
{
    if (a->nfree_cbs == 0 || a->in_free_cbs)
        return false;
    mt__free_cb_t cbs[MT__FREE_CB_MAX];
    unsigned n = a->nfree_cbs;
    memcpy(cbs, a->free_cbs, n * sizeof cbs[0]);
    a->in_free_cbs = true;
    mt__alloc_unlock(a);
    bool freed = false;
    for (unsigned i = 0; i < n; i++)
        freed |= cbs[i].cb(cbs[i].ud, a, size, stream);
    mt__alloc_lock(a);
    a->in_free_cbs = false;
    if (freed && a->npending > 0)
        mt__alloc_process_events(a);
    return freed;
}

int mt_alloc_add_free_callback(mt_alloc_t *a, mt_alloc_free_cb cb, void *ud)
{
    if (a == NULL || cb == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    int rc = a->nfree_cbs < MT__FREE_CB_MAX ? 0 : MT_EBUSY;
    if (rc == 0)
        a->free_cbs[a->nfree_cbs++] = (mt__free_cb_t){cb, ud};
    mt__alloc_unlock(a);
    return rc;
}

int mt_alloc_remove_free_callback(mt_alloc_t *a, mt_alloc_free_cb cb, void *ud)
{
    if (a == NULL || cb == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    int rc = MT_ENOENT;
    for (unsigned i = 0; i < a->nfree_cbs; i++) {
        if (a->free_cbs[i].cb == cb && a->free_cbs[i].ud == ud) {
            memmove(&a->free_cbs[i], &a->free_cbs[i + 1],
                    (a->nfree_cbs - i - 1) * sizeof a->free_cbs[0]);
            a->nfree_cbs--;
            rc = 0;
            break;
        }
    }
    mt__alloc_unlock(a);
    return rc;
}

/* The reference's recovery sequence when no cached block fits. */
static int get_new_block(mt_alloc_t *a, mt_streamrec_t *sr, int bp, size_t size, size_t rsize,
                         mt_block_t **out)
{
    mt__alloc_assert_owner(a);
    if (a->gc_limit > 0)
        mt__seg_gc(a);
    /* Small-pool segments (2 MiB) always fit a small request, so this is a large-pool
     * matter; see mt_alloc_cfg_t.release_smaller_segments. */
    if (a->cfg.release_smaller_segments && bp == MT__BP_LARGE && !a->cfg.expandable_segments)
        mt__seg_release_smaller(a, sr->bins[bp], rsize);
    if (a->cfg.release_to_fit && !a->cfg.expandable_segments)
        mt__seg_release_to_fit(a, mt__seg_over_peak(a, mt__seg_alloc_size(a, bp, rsize)));
    int rc = mt__seg_grow(a, sr, bp, rsize, out);
    if (rc == 0)
        return 0;
    /* The recovery steps below are for memory only: a device that refuses for another
     * reason (a stream capture, a sticky fault) keeps its cache, and its code is returned. */
    if (rc != MT_ENOMEM)
        return rc;
    if (a->cfg.max_split_size != SIZE_MAX && mt__seg_release_oversize(a, sr->bins[bp], rsize)) {
        rc = mt__seg_grow(a, sr, bp, rsize, out);
        if (rc != MT_ENOMEM)
            return rc;
    }
    if (a->cfg.release_on_oom) {
        if (a->npending > 0) {
            mt__alloc_sync_pending(a);
            *out = find_cached(a, sr, bp, rsize);
            if (*out != NULL)
                return 0;
        }
        mt__seg_release_all(a, false, NULL, false);
        a->st.num_alloc_retries++;
        rc = mt__seg_grow(a, sr, bp, rsize, out);
        if (rc != MT_ENOMEM)
            return rc;
    }
    /* Memory other threads are giving back with the lock released (unmaps, waited frees)
     * may be all this request lacks: wait for their work, then look again. */
    while (mt__alloc_inflight(a)) {
        mt__alloc_wait(a);
        if (a->npending > 0)
            mt__alloc_process_events(a);
        if ((*out = find_cached(a, sr, bp, rsize)) != NULL)
            return 0;
        rc = mt__seg_grow(a, sr, bp, rsize, out);
        if (rc != MT_ENOMEM)
            return rc;
    }
    a->st.num_ooms++;
    size_t free_b = 0, total_b = 0;
    (void)mt_backend_mem_get_info(a->backend, &free_b, &total_b);
    mt__alloc_emit_device(a);
    mt__alloc_emit(a, MT_EV_OOM, 0, free_b, size, sr->sid, mt__public_pool(bp), 0);
    bool over_limit = a->limit < a->capacity &&
                      (size_t)a->st.reserved_bytes[MT_STAT_ALL].current + rsize > a->limit;
    mt__alloc_oom_report(a, size, rsize, over_limit ? "memory_fraction limit" : "device");
    return MT_ENOMEM;
}

/* The allocation's call stack, asked of the sink before the lock (event.h); 0 = none. */
static uint32_t alloc_stack(mt_alloc_t *a, size_t size)
{
    const mt_event_sink_t *s = a->cfg.sink;
    if (__builtin_expect(s == NULL || s->stack == NULL || a->cfg.stacks == MT_STACKS_OFF, 1))
        return 0;
    return s->stack(s->ud, size, MT_POOL_NONE, a->cfg.stacks);
}

/* An OOM's end: the observers, called without the lock and outside the program's entry
 * (mu held on entry, released on return). Out of line, to keep its buffer off the hot
 * path's stack. */
static __attribute__((noinline, cold)) int oom_observe(mt_alloc_t *a, size_t size, int rc,
                                                       uintptr_t entry)
{
    mt__oom_call_t call;
    mt__oom_prepare(a, size, &call);
    mt__alloc_unlock(a);
    mt__entry_leave(entry);
    mt__oom_run(&call);
    return rc;
}

/* mt__stat_inc1/inc2, true when a peak moved. */
static inline bool inc1_up(mt_stat_t *x, int64_t d)
{
    x->current += d;
    x->allocated += (uint64_t)d;
    if (__builtin_expect(x->current <= x->peak, 1))
        return false;
    x->peak = x->current;
    return true;
}

static inline bool inc2_up(mt_stat_t *arr, int slot, int64_t d)
{
    bool up = inc1_up(&arr[MT_STAT_ALL], d);
    return (slot != MT_STAT_ALL && inc1_up(&arr[slot], d)) || up;
}

static __attribute__((noinline, cold)) void active_peaks(mt_alloc_stats_t *c)
{
    for (int i = 0; i < MT_STAT_N; i++) {
        if (c->active_bytes[i].current > c->active_bytes[i].peak)
            c->active_bytes[i].peak = c->active_bytes[i].current;
        if (c->active[i].current > c->active[i].peak)
            c->active[i].peak = c->active[i].current;
    }
}

/* active_bytes and active after an allocation of bytes in stat slot sp, allocated_bytes and
 * allocation counted (up: one of their peaks moved). Their .allocated is allocated_bytes'
 * and allocation's, made on read (stats.c). Their peaks can move only where up, or where
 * freed blocks wait for events (active_bytes[ALL] > allocated_bytes[ALL]): otherwise each
 * active = its allocated <= that one's peak <= its own peak (mt_alloc_check). */
static inline void active_inc(mt_alloc_stats_t *c, int sp, int64_t bytes, bool up)
{
    c->active_bytes[MT_STAT_ALL].current += bytes;
    c->active[MT_STAT_ALL].current++;
    if (sp != MT_STAT_ALL) {
        c->active_bytes[sp].current += bytes;
        c->active[sp].current++;
    }
    if (__builtin_expect(up || c->active_bytes[MT_STAT_ALL].current !=
                                   c->allocated_bytes[MT_STAT_ALL].current,
                         0))
        active_peaks(c);
}

int mt__alloc_malloc_global(mt_alloc_t *a, size_t size, mt_stream_t *stream, int tag, void **out,
                            uintptr_t ra, mt__tcache_t *mine)
{
    /* the program's call into memtrace, where its stack is cut (util/entry.h) */
    uintptr_t entry = mt__entry_enter(ra);
    uint32_t stack = alloc_stack(a, size);
    mt__tc_prepare(a, mine);
    mt__alloc_lock_by(a, mine != NULL ? &mine->gate : NULL);
    int rc = 0;
    bool oom = false; /* the device's memory, not the host's, ran out */
    /* The search sees this thread's cached blocks merged, as the bins alone would. */
    if (!mt__tc_clean(mine))
        mt__tc_flush_mine(a, mine);
    if (a->npending > 0)
        mt__alloc_process_events(a);
    if (size > ((size_t)1 << 60)) {
        a->st.num_ooms++;
        mt__alloc_emit(a, MT_EV_OOM, 0, 0, size, mt_stream_id(stream), MT_POOL_LARGE, tag);
        mt__alloc_oom_report(a, size, size, "size beyond any device");
        rc = MT_ENOMEM;
        oom = true;
        goto out;
    }
    size_t rsize = mt__alloc_round(a, size);
    int bp = rsize <= a->small_max ? MT__BP_SMALL : MT__BP_LARGE;
    mt_streamrec_t *sr = a->last_sr; /* the one-entry cache, inline */
    if (__builtin_expect(a->nroutes != 0, 0)) {
        /* A stream routed to a private pool takes the pool's record. Pool segments are
         * plain, so small requests keep to the small pool there. */
        sr = mt__pool_route(a, stream);
        if (sr != NULL && sr->pool != NULL)
            bp = rsize <= MT__SMALL_SIZE ? MT__BP_SMALL : MT__BP_LARGE;
    } else if (sr == NULL || sr->stream != stream) {
        sr = mt__alloc_streamrec(a, stream);
    }
    if (sr == NULL || (sr->bins[bp] == NULL && mt__alloc_binset(a, sr, bp) == NULL)) {
        rc = MT_ENOMEM;
        goto out;
    }
    mt_block_t *front = NULL;
    size_t pk = 0; /* the plan's entry, when planned */
    /* After a warm-up, its plan places the request first (plan_follow.c), seeing the planned
     * blocks other threads' caches hold freed, as the global path alone would. */
    if (a->plan.n != 0 && sr == a->plan.sr)
        mt__tc_flush_others(a);
    mt_block_t *b = a->plan.n != 0 ? mt__plan_take(a, sr, rsize, &front, &pk) : NULL;
    bool planned = b != NULL;
    if (b == NULL)
        b = find_cached(a, sr, bp, rsize);
    if (b == NULL && run_free_callbacks(a, size, stream))
        b = find_cached(a, sr, bp, rsize);
    if (b == NULL && mt__tc_flush_all(a)) /* other threads' caches, before the device */
        b = find_cached(a, sr, bp, rsize);
    if (b == NULL) {
        rc = get_new_block(a, sr, bp, size, rsize, &b);
        if (rc != 0) {
            oom = rc == MT_ENOMEM; /* get_new_block's only MT_ENOMEM is an OOM */
            goto out;
        }
    }
    mt_assert(b->state == MT_BLOCK_INACTIVE && b->size >= rsize);
    mt__seg_take(a, b, rsize);
    b->state = MT_BLOCK_ACTIVE_ALLOCATED;
    if (front != NULL)
        mt__seg_bin_in(a, front);
    b->requested = size;
    b->tag = (uint8_t)tag;
    b->gen = a->gen;
    b->nuses = 0;
    b->npending = 0;
    if ((rc = mt__addrmap_put(&a->map, b)) != 0) {
        /* Host memory for the hash table ran out: give the block back untouched. */
        b->state = MT_BLOCK_INACTIVE;
        b->requested = 0;
        mt__seg_merge_in(a, b);
        goto out;
    }
    if (planned) {
        b->planned = true;
        a->plan.live++;
    }
    mt_segment_t *seg = b->seg;
    int sp = seg->pool, st = seg->slot;
    /* The cache hooks' no-op case inline; mu is not released before mt__tc_own. */
    bool idle = mt__tc_idle(a, mine);
    if (!idle) /* a new peak is set with truth = counters */
        mt__tc_peak_guard(a, mine, st, b->size, size, tag);
    /* (the sizes in locals: a counter's store may alias a size_t, which would be read
     * again after each) */
    int64_t bytes = (int64_t)b->size, req = (int64_t)size;
    mt_alloc_stats_t *c = &a->st;
    bool up = inc2_up(c->allocated_bytes, st, bytes);
    mt__scope_track(a);
    mt__stat_inc2(c->requested_bytes, st, req);
    up |= inc2_up(c->allocation, st, 1);
    active_inc(c, st, bytes, up);
    mt__stat_inc1(&c->tag_allocated_bytes[tag], bytes);
    mt__stat_inc1(&c->tag_requested_bytes[tag], req);
    if (__builtin_expect((size_t)bytes >= a->cfg.max_split_size, 0))
        mt__stat_inc1(&c->oversize_allocations, 1);
    mt_assert(a->st.allocated_bytes[MT_STAT_ALL].current <=
                  a->st.active_bytes[MT_STAT_ALL].current &&
              a->st.active_bytes[MT_STAT_ALL].current <= a->st.reserved_bytes[MT_STAT_ALL].current);
    seg->last_used = ++a->clock;
    /* The thread's cache may repeat b's pair if the plan plays no part in it (another
     * stream), or b is planned and its pair leaves the plan as it is. */
    if (idle)
        mt__tc_idle_own(mine);
    else if (a->tc_on)
        mt__tc_own(a, mine, b, mt__stat_pool(sp),
                   a->plan.n == 0 || sr != a->plan.sr ||
                       (planned && mt__plan_repeats(a, pk, b->size)));
    if (a->warming) {
        if (a->st.allocated_bytes[MT_STAT_ALL].current > a->warm_peak)
            a->warm_peak = a->st.allocated_bytes[MT_STAT_ALL].current;
        mt__warm_record_alloc(a, b, rsize);
    }
    if (__builtin_expect(a->cfg.sink != NULL, 0))
        mt__alloc_emit_alloc(a, b->addr, b->size, size, seg->sid, mt__public_pool(sp), tag, stack,
                             b->tce != NULL);
    *out = (void *)b->addr;
out:
    if (__builtin_expect(oom, 0) && a->noom_obs > 0)
        return oom_observe(a, size, rc, entry);
    mt__alloc_unlock(a);
    mt__entry_leave(entry);
    return rc;
}

int mt_alloc_malloc(mt_alloc_t *a, size_t size, mt_stream_t *stream, int tag, void **out)
{
    if (a == NULL || out == NULL || tag < 0 || tag >= MT_TAG_MAX)
        return MT_EINVAL;
    *out = NULL;
    if (size == 0)
        return 0;
    if (__builtin_expect(a->async != NULL, 0))
        return mt__async_malloc(a, size, stream, tag, out);
    /* this thread's cache without mu, else (a tail call) the global path */
    return mt__tc_malloc(a, size, stream, tag, out, (uintptr_t)__builtin_return_address(0));
}

int mt_alloc_empty_cache(mt_alloc_t *a)
{
    if (a == NULL)
        return MT_EINVAL;
    if (a->async != NULL)
        return mt__async_empty_cache(a);
    mt__alloc_lock(a);
    mt__tc_flush_all(a);
    if (a->npending > 0)
        mt__alloc_sync_pending(a);
    size_t released = mt__seg_release_all(a, false, NULL, false);
    mt__alloc_emit(a, MT_EV_EMPTY_CACHE, 0, released, 0, 0, MT_POOL_NONE, 0);
    mt__alloc_unlock(a);
    return 0;
}

/* ---- tags ---- */

int mt_alloc_tag_register(mt_alloc_t *a, const char *label, int *out_tag)
{
    if (a == NULL || label == NULL || out_tag == NULL || label[0] == '\0')
        return MT_EINVAL;
    for (int t = 0; t < MT_TAG_USER_FIRST; t++) {
        if (strcmp(label, mt_tag_builtin_name(t)) == 0) {
            *out_tag = t;
            return 0;
        }
    }
    mt__alloc_lock(a);
    int rc = MT_ENOMEM, free_id = -1;
    for (int t = MT_TAG_USER_FIRST; t < MT_TAG_MAX; t++) {
        if (a->tag_names[t][0] == '\0') {
            if (free_id < 0)
                free_id = t;
        } else if (strncmp(a->tag_names[t], label, sizeof a->tag_names[t] - 1) == 0) {
            free_id = t;
            rc = 0;
            break;
        }
    }
    if (rc != 0 && free_id >= 0) {
        snprintf(a->tag_names[free_id], sizeof a->tag_names[free_id], "%s", label);
        rc = 0;
    }
    if (rc == 0) {
        *out_tag = free_id;
        /* Events carry only the id: announce the label to the stream (again on each
         * call, so a program can re-announce its tags). */
        mt_event_rec_t lab;
        mt_event_label_pack(&lab, a->tag_names[free_id]);
        mt__alloc_emit(a, MT_EV_TAG_LABEL, lab.addr, lab.size, lab.requested, 0, MT_POOL_NONE,
                       free_id);
    }
    mt__alloc_unlock(a);
    return rc;
}

const char *mt_alloc_tag_name(const mt_alloc_t *a, int tag)
{
    if (tag < 0 || tag >= MT_TAG_MAX)
        return "other";
    if (tag < MT_TAG_USER_FIRST || a == NULL)
        return mt_tag_builtin_name(tag);
    /* Labels are written once and never change, so reading without the lock is safe. */
    return a->tag_names[tag][0] != '\0' ? a->tag_names[tag] : "other";
}
