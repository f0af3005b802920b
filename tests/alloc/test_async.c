/* backend:cudaMallocAsync: the sim's model of the driver's stream-ordered pool (reuse on
 * the freeing stream, across streams only once ordered, release at synchronize above the
 * threshold, trim, OOM after release), and the allocator's passthrough to it (config,
 * statistics, events, memory fraction, record_stream, empty_cache). */
#include "helpers.h"

#define GATE_INIT                                                                                  \
    {                                                                                              \
        PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false                                 \
    }

static mt_pool_usage_t usage(mt_backend_t *b)
{
    mt_pool_usage_t u;
    assert_int_equal(mt_backend_pool_usage(b, &u), 0);
    return u;
}

static void *amalloc(mt_backend_t *b, size_t n, mt_stream_t *s)
{
    void *p = NULL;
    assert_int_equal(mt_backend_malloc_async(b, n, s, &p), 0);
    assert_non_null(p);
    assert_int_equal(mt__sim_pool_check(b), 0);
    return p;
}

static void afree(mt_backend_t *b, void *p, mt_stream_t *s)
{
    assert_int_equal(mt_backend_free_async(b, p, s), 0);
    assert_int_equal(mt__sim_pool_check(b), 0);
}

/* ---- the pool model ---- */

/* A free is reusable at once on its own stream, even while the stream has not reached it. */
static void test_same_stream_reuse(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_stream_t *s1 = NULL;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    gate_t g = GATE_INIT;
    assert_int_equal(mt_stream_launch_host_func(b, s1, gate_wait, &g), 0);
    void *p = amalloc(b, MIB, s1);
    afree(b, p, s1);
    void *q = amalloc(b, MIB, s1);
    assert_ptr_equal(q, p);
    assert_int_equal(mt__sim_pool_chunk_count(b), 1);
    assert_int_equal(usage(b).used, MIB);
    gate_open(&g);
    afree(b, q, s1);
    mt_stream_destroy(b, &s1);
    mt_backend_destroy(&b);
}

/* Another stream gets the block only once the free is ordered before it: the freeing
 * stream completed it, or the other stream waits on an event recorded after the free. */
static void test_cross_stream_after_ordering(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_stream_t *s1 = NULL, *s2 = NULL, *s3 = NULL;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    assert_int_equal(mt_stream_create(b, &s2), 0);
    assert_int_equal(mt_stream_create(b, &s3), 0);
    mt_event_t *before = NULL, *after = NULL;
    assert_int_equal(mt_event_create(b, &before), 0);
    assert_int_equal(mt_event_create(b, &after), 0);
    gate_t g = GATE_INIT;
    assert_int_equal(mt_stream_launch_host_func(b, s1, gate_wait, &g), 0);
    void *p = amalloc(b, 2 * MIB, s1);
    assert_int_equal(mt_event_record(b, before, s1), 0);
    afree(b, p, s1);
    assert_int_equal(mt_event_record(b, after, s1), 0);

    /* Not ordered: s2 knows nothing of s1; s3 waits on a record made before the free. */
    void *q2 = amalloc(b, 2 * MIB, s2);
    assert_ptr_not_equal(q2, p);
    assert_int_equal(mt_stream_wait_event(b, s3, before), 0);
    void *q3 = amalloc(b, 2 * MIB, s3);
    assert_ptr_not_equal(q3, p);
    afree(b, q3, s3);
    /* Ordered by a wait on the record after the free, though s1 is still held. */
    assert_int_equal(mt_stream_wait_event(b, s3, after), 0);
    void *r3 = amalloc(b, 2 * MIB, s3);
    assert_true(r3 == p || r3 == q3); /* q3 is s3's own free: both are allowed */
    void *r3b = amalloc(b, 2 * MIB, s3);
    assert_true((r3 == p && r3b == q3) || (r3 == q3 && r3b == p));
    afree(b, r3, s3);
    afree(b, r3b, s3);
    size_t chunks = mt__sim_pool_chunk_count(b);
    assert_int_equal(chunks, 3);

    /* Completed: once s1 ran past the free, any stream may take it. */
    gate_open(&g);
    afree(b, q2, s2);
    assert_int_equal(mt_device_synchronize(b), 0); /* threshold 0: releases too */
    assert_int_equal(usage(b).reserved, 0);
    assert_int_equal(mt_backend_pool_set_release_threshold(b, UINT64_MAX), 0);
    gate_t g2 = GATE_INIT;
    assert_int_equal(mt_stream_launch_host_func(b, s1, gate_wait, &g2), 0);
    void *x = amalloc(b, 2 * MIB, s1);
    afree(b, x, s1); /* s1 is held: not completed */
    void *y = amalloc(b, 2 * MIB, s2);
    assert_ptr_not_equal(y, x);
    gate_open(&g2);
    assert_int_equal(mt_stream_synchronize(b, s1), 0);
    void *z = amalloc(b, 2 * MIB, s2);
    assert_ptr_equal(z, x);
    afree(b, y, s2);
    afree(b, z, s2);

    mt_event_destroy(b, &before);
    mt_event_destroy(b, &after);
    mt_stream_destroy(b, &s1);
    mt_stream_destroy(b, &s2);
    mt_stream_destroy(b, &s3);
    mt_backend_destroy(&b);
}

/* At a synchronize the pool keeps at most its release threshold of unused memory. */
static void test_release_threshold_at_sync(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    /* The driver's default threshold is 0: everything unused goes at a synchronize. */
    void *p = amalloc(b, 4 * MIB, NULL);
    afree(b, p, NULL);
    assert_int_equal(usage(b).reserved, 4 * MIB); /* no synchronize yet */
    assert_int_equal(mt__sim_used_bytes(b), 4 * MIB);
    assert_int_equal(mt_stream_synchronize(b, NULL), 0);
    assert_int_equal(usage(b).reserved, 0);
    assert_int_equal(mt__sim_used_bytes(b), 0);

    /* The threshold bounds what the pool holds in all, live memory included. */
    assert_int_equal(mt_backend_pool_set_release_threshold(b, 8 * MIB), 0);
    void *a1 = amalloc(b, 4 * MIB, NULL), *a2 = amalloc(b, 4 * MIB, NULL);
    void *a3 = amalloc(b, 4 * MIB, NULL);
    afree(b, a1, NULL);
    afree(b, a2, NULL);
    assert_int_equal(usage(b).reserved, 12 * MIB);
    assert_int_equal(mt_device_synchronize(b), 0);
    assert_int_equal(usage(b).reserved, 8 * MIB); /* one unused chunk went, one stayed */
    afree(b, a3, NULL);
    mt_event_t *ev = NULL;
    assert_int_equal(mt_event_create(b, &ev), 0);
    assert_int_equal(mt_event_record(b, ev, NULL), 0);
    assert_int_equal(mt_event_synchronize(b, ev), 0);
    assert_int_equal(usage(b).reserved, 8 * MIB); /* at the threshold: nothing to give back */
    assert_int_equal(mt_backend_pool_set_release_threshold(b, 4 * MIB), 0);
    assert_int_equal(mt_event_synchronize(b, ev), 0);
    assert_int_equal(usage(b).reserved, 4 * MIB);
    mt_event_destroy(b, &ev);

    assert_int_equal(mt_backend_pool_set_release_threshold(b, UINT64_MAX), 0);
    void *c = amalloc(b, 20 * MIB, NULL);
    afree(b, c, NULL);
    assert_int_equal(mt_device_synchronize(b), 0);
    assert_int_equal(usage(b).reserved, 24 * MIB); /* 4 MiB kept before, 20 new */
    assert_int_equal(mt_backend_pool_set_release_threshold(b, 0), 0);
    mt_backend_destroy(&b);
}

/* Trim gives back unused chunks down to what it is asked to keep, never a live one. */
static void test_trim(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    assert_int_equal(mt_backend_pool_set_release_threshold(b, UINT64_MAX), 0);
    void *p[3];
    for (int i = 0; i < 3; i++)
        p[i] = amalloc(b, 2 * MIB, NULL);
    void *live = amalloc(b, 2 * MIB, NULL);
    for (int i = 0; i < 3; i++)
        afree(b, p[i], NULL);
    assert_int_equal(mt_stream_synchronize(b, NULL), 0);
    assert_int_equal(usage(b).reserved, 8 * MIB);
    assert_int_equal(mt_backend_pool_trim_to(b, 5 * MIB), 0);
    assert_int_equal(usage(b).reserved, 4 * MIB);
    assert_int_equal(mt_backend_pool_trim_to(b, 0), 0);
    assert_int_equal(usage(b).reserved, 2 * MIB); /* the live chunk stays */
    assert_int_equal(usage(b).used, 2 * MIB);
    assert_int_equal(mt__sim_pool_check(b), 0);
    afree(b, live, NULL);
    /* A free the stream has not reached is not given back. */
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    gate_t g = GATE_INIT;
    assert_int_equal(mt_stream_launch_host_func(b, s, gate_wait, &g), 0);
    void *q = amalloc(b, 2 * MIB, s);
    afree(b, q, s);
    assert_int_equal(mt_backend_pool_trim_to(b, 0), 0);
    assert_int_equal(usage(b).reserved, 2 * MIB);
    gate_open(&g);
    mt_stream_destroy(b, &s);
    assert_int_equal(mt_backend_pool_trim_to(b, 0), 0);
    assert_int_equal(usage(b).reserved, 0);
    mt_backend_destroy(&b);
}

/* A growth the device refuses first gets back the pool's unused memory, then fails. */
static void test_oom_after_release(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(8 * MIB);
    assert_int_equal(mt_backend_pool_set_release_threshold(b, UINT64_MAX), 0);
    void *p = amalloc(b, 6 * MIB, NULL);
    afree(b, p, NULL);
    assert_int_equal(mt_stream_synchronize(b, NULL), 0);
    assert_int_equal(usage(b).reserved, 6 * MIB);
    void *q = amalloc(b, 7 * MIB, NULL); /* 8 MiB chunk: only after the 6 MiB one went */
    mt_pool_usage_t u = usage(b);
    assert_int_equal(u.reserved, 8 * MIB);
    assert_int_equal(u.used, 7 * MIB);
    void *r = NULL;
    assert_int_equal(mt_backend_malloc_async(b, 2 * MIB, NULL, &r), MT_ENOMEM);
    assert_null(r);
    assert_int_equal(mt__sim_pool_check(b), 0);
    afree(b, q, NULL);
    mt_backend_destroy(&b);
}

/* High-water marks and their reset; a foreign pointer is refused. */
static void test_highs_and_bad_free(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    void *p = amalloc(b, 3 * MIB, NULL);
    afree(b, p, NULL);
    assert_int_equal(mt_stream_synchronize(b, NULL), 0);
    mt_pool_usage_t u = usage(b);
    assert_int_equal(u.reserved, 0);
    assert_int_equal(u.reserved_high, 4 * MIB);
    assert_int_equal(u.used_high, 3 * MIB);
    assert_int_equal(mt_backend_pool_reset_high(b), 0);
    u = usage(b);
    assert_int_equal(u.reserved_high, 0);
    assert_int_equal(u.used_high, 0);
    int x;
    assert_int_equal(mt_backend_free_async(b, &x, NULL), MT_EINVAL);
    void *q = amalloc(b, MIB, NULL);
    afree(b, q, NULL);
    assert_int_equal(mt_backend_free_async(b, q, NULL), MT_EINVAL); /* twice */
    mt_backend_destroy(&b);
}

/* Random requests and frees on three streams with the pool's invariants after each. */
static void test_random_invariants(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_stream_t *s[3] = {NULL, NULL, NULL};
    for (int i = 1; i < 3; i++)
        assert_int_equal(mt_stream_create(b, &s[i]), 0);
    void *live[64] = {0};
    int on[64] = {0};
    unsigned seed = 12345;
    for (int step = 0; step < 4000; step++) {
        seed = seed * 1103515245u + 12345u;
        unsigned k = (seed >> 8) % 64, si = (seed >> 16) % 3;
        if (live[k] != NULL) {
            afree(b, live[k], s[on[k]]);
            live[k] = NULL;
        } else {
            size_t n = 1 + (size_t)((seed >> 4) % (3 * MIB));
            live[k] = amalloc(b, n, s[si]);
            on[k] = (int)si;
        }
        if (step % 500 == 499)
            assert_int_equal(mt_device_synchronize(b), 0);
    }
    for (int k = 0; k < 64; k++)
        if (live[k] != NULL)
            afree(b, live[k], s[on[k]]);
    assert_int_equal(mt_device_synchronize(b), 0);
    assert_int_equal(usage(b).reserved, 0);
    for (int i = 1; i < 3; i++)
        mt_stream_destroy(b, &s[i]);
    mt_backend_destroy(&b);
}

/* ---- the allocator under backend:cudaMallocAsync ---- */

static void test_config_key(void **state)
{
    (void)state;
    mt_alloc_cfg_t c = mt_alloc_cfg_default();
    char err[256];
    assert_int_equal(c.alloc_backend, MT_ALLOC_BACKEND_NATIVE);
    assert_int_equal(mt_alloc_cfg_parse(&c, "backend:cudaMallocAsync", err, sizeof err), 0);
    assert_int_equal(c.alloc_backend, MT_ALLOC_BACKEND_ASYNC);
    assert_int_equal(mt_alloc_cfg_parse(&c, "backend:native", err, sizeof err), 0);
    assert_int_equal(c.alloc_backend, MT_ALLOC_BACKEND_NATIVE);
    assert_int_equal(mt_alloc_cfg_parse(&c, "backend : hipMallocAsync", err, sizeof err), 0);
    assert_int_equal(c.alloc_backend, MT_ALLOC_BACKEND_ASYNC);
    assert_int_equal(mt_alloc_cfg_parse(&c, "backend:cudamallocasync", err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "'backend'"));
    assert_int_equal(c.alloc_backend, MT_ALLOC_BACKEND_ASYNC); /* left unchanged */

    /* It cannot change at run time, as PyTorch asserts. */
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc_default(b, "backend:cudaMallocAsync", NULL);
    assert_int_equal(mt_alloc_set_settings(a, "backend:native", err, sizeof err), MT_ENOTSUP);
    assert_non_null(strstr(err, "'backend'"));
    assert_int_equal(mt_alloc_set_settings(a, "memory_fraction:0.5", err, sizeof err), 0);
    mt_alloc_destroy(&a);
    mt_alloc_t *n = make_alloc_default(b, NULL, NULL);
    assert_int_equal(mt_alloc_set_settings(n, "backend:cudaMallocAsync", err, sizeof err),
                     MT_ENOTSUP);
    mt_alloc_destroy(&n);
    mt_backend_destroy(&b);
}

typedef struct warn_log_s {
    char text[4096];
    int nwarn;
} warn_log_t;

static void warn_cb(void *ud, mt_log_level_e level, const char *msg)
{
    warn_log_t *w = ud;
    if (level != MT_LOG_WARN)
        return;
    w->nwarn++;
    strncat(w->text, msg, sizeof w->text - strlen(w->text) - 1);
}

/* The caching allocator's keys are ignored with a warning naming each, as PyTorch does. */
static void test_native_keys_ignored(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    cfg.backend = b;
    warn_log_t w = {0};
    cfg.log = warn_cb;
    cfg.log_ud = &w;
    char err[256];
    assert_int_equal(mt_alloc_cfg_parse(&cfg,
                                        "max_split_size_mb:40,backend:cudaMallocAsync,"
                                        "expandable_segments:False",
                                        err, sizeof err),
                     0);
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &cfg), 0);
    assert_int_equal(w.nwarn, 2);
    assert_non_null(strstr(w.text, "max_split_size_mb"));
    assert_non_null(strstr(w.text, "expandable_segments"));
    /* Ignored indeed: a 50 MiB block is not an oversize one, and no segment is made. */
    void *p = xmalloc_dev(a, 50 * MIB, NULL, MT_TAG_OTHER);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.oversize_allocations.current, 0);
    assert_int_equal(s.segment[MT_STAT_ALL].current, 0);
    assert_int_equal(backend_mallocs(b), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* Requests go to the pool; the statistics, peaks and events follow each one. */
static void test_stats_and_events(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    rec_sink_t r;
    rec_init(&r);
    mt_alloc_t *a = make_alloc_default(b, "backend:cudaMallocAsync", &r.sink);
    void *p = xmalloc_dev(a, 1000, NULL, MT_TAG_WEIGHTS);
    void *q = xmalloc_dev(a, 3 * MIB, NULL, MT_TAG_ACTIVATIONS);
    assert_int_equal(usage(b).used, 1024 + 3 * MIB);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 1024 + 3 * MIB);
    assert_int_equal(s.active_bytes[MT_STAT_ALL].current, 1024 + 3 * MIB);
    assert_int_equal(s.requested_bytes[MT_STAT_ALL].current, 1000 + 3 * MIB);
    assert_int_equal(s.allocation[MT_STAT_ALL].current, 2);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, (int64_t)usage(b).reserved);
    assert_true(s.reserved_bytes[MT_STAT_ALL].current >= 4 * (int64_t)MIB);
    assert_int_equal(s.tag_allocated_bytes[MT_TAG_WEIGHTS].current, 1024);
    assert_int_equal(s.allocated_bytes[MT_STAT_SMALL].current, 0);
    assert_int_equal(rec_count(&r, MT_EV_ALLOC), 2);
    assert_int_equal(mt_alloc_check(a), 0);
    void *base = NULL;
    size_t size = 0;
    int tag = -1;
    assert_int_equal(mt_alloc_block_info(a, (char *)q + 100, &base, &size, &tag), 0);
    assert_ptr_equal(base, q);
    assert_int_equal(size, 3 * MIB);
    assert_int_equal(tag, MT_TAG_ACTIVATIONS);

    assert_int_equal(mt_alloc_free(a, q), 0);
    assert_int_equal(mt_alloc_free(a, q), MT_ENOENT);
    s = stats_of(a);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 1024);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].peak, 1024 + 3 * MIB);
    assert_int_equal(s.allocation[MT_STAT_ALL].allocated, 2);
    assert_int_equal(s.allocation[MT_STAT_ALL].freed, 1);
    assert_int_equal(rec_count(&r, MT_EV_FREE_REQUESTED), 1);
    assert_int_equal(rec_count(&r, MT_EV_FREE_COMPLETED), 1);
    const mt_event_rec_t *last = &r.ev[r.n - 1];
    assert_int_equal(last->kind, MT_EV_FREE_COMPLETED);
    assert_int_equal(last->addr, (uint64_t)(uintptr_t)q);
    assert_int_equal(last->allocated, 1024);

    /* PyTorch's threshold: the pool keeps its memory across a synchronize. */
    int64_t held = s.reserved_bytes[MT_STAT_ALL].current;
    assert_int_equal(mt_device_synchronize(b), 0);
    s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, held);
    /* empty_cache: synchronize and trim to nothing; what is live stays. */
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 2 * MIB);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].peak, held);
    assert_int_equal(rec_count(&r, MT_EV_EMPTY_CACHE), 1);
    assert_int_equal(r.ev[r.n - 1].size, (uint64_t)(held - 2 * (int64_t)MIB));
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(s.num_alloc_retries, 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    assert_int_equal(snap->nsegments, 0);
    mt_alloc_snapshot_free(&snap);
    assert_int_equal(mt_alloc_reserve(a, 4 * MIB, NULL), MT_ENOTSUP);
    assert_int_equal(mt_alloc_warmup_begin(a), MT_ENOTSUP);
    assert_int_equal(mt_alloc_warmup_end(a, NULL), MT_ENOTSUP);
    mt_alloc_destroy(&a);
    rec_fini(&r);
    mt_backend_destroy(&b);
}

/* memory_fraction caps the allocator's own bytes before the pool is asked; a pool that
 * cannot grow is an OOM too, counted and reported, not retried. */
static void test_fraction_and_oom(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    rec_sink_t r;
    rec_init(&r);
    mt_alloc_t *a = make_alloc_default(b, "backend:cudaMallocAsync,memory_fraction:0.25", &r.sink);
    void *p = xmalloc_dev(a, 10 * MIB, NULL, MT_TAG_OTHER);
    void *q = NULL;
    assert_int_equal(mt_alloc_malloc(a, 8 * MIB, NULL, MT_TAG_OTHER, &q), MT_ENOMEM);
    assert_null(q);
    assert_int_equal(usage(b).used, 10 * MIB); /* the pool was not asked */
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.num_ooms, 1);
    assert_int_equal(s.limit, 16 * MIB);
    assert_int_equal(rec_count(&r, MT_EV_OOM), 1);
    assert_int_equal(mt_alloc_set_memory_fraction(a, 1.0), 0);
    q = xmalloc_dev(a, 8 * MIB, NULL, MT_TAG_OTHER);
    /* The device runs out: another user holds 20 MiB, the pool 18, and 30 more fit the
     * limit but not the device. */
    void *other = NULL;
    assert_int_equal(mt_backend_malloc(b, 20 * MIB, &other), 0);
    void *big = NULL;
    assert_int_equal(mt_alloc_malloc(a, 30 * MIB, NULL, MT_TAG_OTHER, &big), MT_ENOMEM);
    s = stats_of(a);
    assert_int_equal(s.num_ooms, 2);
    assert_int_equal(s.num_alloc_retries, 0);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 18 * MIB);
    assert_non_null(strstr(mt_alloc_last_error(a), "stream-ordered pool"));
    assert_int_equal(mt_backend_free(b, other), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(mt_alloc_free(a, q), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    rec_fini(&r);
    mt_backend_destroy(&b);
}

/* A block used on another stream (record_stream) is freed after that stream's work, as
 * PyTorch does through a unifying stream: while the other stream is held, its memory is
 * not handed out again, even on the stream it was allocated on. */
static void test_record_stream(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_stream_t *s1 = NULL, *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    assert_int_equal(mt_stream_create(b, &s2), 0);
    mt_alloc_t *a = make_alloc_default(b, "backend:cudaMallocAsync", NULL);
    void *p = xmalloc_dev(a, 2 * MIB, s1, MT_TAG_OTHER);
    assert_int_equal(mt_alloc_record_stream(a, p, s2), 0);
    assert_int_equal(mt_alloc_record_stream(a, p, s1), 0); /* its own: no effect */
    gate_t g = GATE_INIT;
    assert_int_equal(mt_stream_launch_host_func(b, s2, gate_wait, &g), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    void *q = xmalloc_dev(a, 2 * MIB, s1, MT_TAG_OTHER);
    assert_ptr_not_equal(q, p);
    gate_open(&g);
    assert_int_equal(mt_device_synchronize(b), 0);
    void *r2 = xmalloc_dev(a, 2 * MIB, s1, MT_TAG_OTHER);
    assert_ptr_equal(r2, p);
    /* Without record_stream the free is s1's and reusable there at once. */
    assert_int_equal(mt_alloc_free(a, r2), 0);
    void *r3 = xmalloc_dev(a, 2 * MIB, s1, MT_TAG_OTHER);
    assert_ptr_equal(r3, p);
    assert_int_equal(mt_alloc_free(a, r3), 0);
    assert_int_equal(mt_alloc_free(a, q), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s1);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

/* Hundreds of live allocations, freed in random order (the table grows and moves records
 * into freed places): the checker after every step, and every live block found by its
 * address and by an interior pointer. */
static void test_table_random(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(1024 * MIB);
    mt_alloc_t *a = make_alloc_default(b, "backend:cudaMallocAsync", NULL);
    enum { N = 600 };
    static void *live[N];
    static size_t size[N];
    memset(live, 0, sizeof live);
    unsigned seed = 4242;
    for (int step = 0; step < 6000; step++) {
        seed = seed * 1103515245u + 12345u;
        unsigned k = (seed >> 8) % N;
        if (live[k] != NULL) {
            assert_int_equal(mt_alloc_free(a, live[k]), 0);
            live[k] = NULL;
        } else {
            size[k] = 512 + (size_t)((seed >> 4) % (64 << 10));
            live[k] = xmalloc_dev(a, size[k], NULL, (int)(k % 4));
        }
        assert_int_equal(mt_alloc_check(a), 0);
        unsigned j = (seed >> 20) % N;
        if (live[j] != NULL) {
            void *base = NULL;
            size_t bs = 0;
            int tag = -1;
            assert_int_equal(
                mt_alloc_block_info(a, (char *)live[j] + size[j] / 2, &base, &bs, &tag), 0);
            assert_ptr_equal(base, live[j]);
            assert_int_equal(tag, (int)(j % 4));
        }
    }
    for (int k = 0; k < N; k++)
        if (live[k] != NULL)
            assert_int_equal(mt_alloc_free(a, live[k]), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_stream_reuse),
        cmocka_unit_test(test_cross_stream_after_ordering),
        cmocka_unit_test(test_release_threshold_at_sync),
        cmocka_unit_test(test_trim),
        cmocka_unit_test(test_oom_after_release),
        cmocka_unit_test(test_highs_and_bad_free),
        cmocka_unit_test(test_random_invariants),
        cmocka_unit_test(test_config_key),
        cmocka_unit_test(test_native_keys_ignored),
        cmocka_unit_test(test_stats_and_events),
        cmocka_unit_test(test_fraction_and_oom),
        cmocka_unit_test(test_record_stream),
        cmocka_unit_test(test_table_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
