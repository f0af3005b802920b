/* Segments over the backend: expandable segments, garbage collection, oversize release,
 * release-and-retry, and the out-of-memory path with its report. */
#include "helpers.h"
#include "tests/common/test_main.h"

static void test_expandable_segments(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(512 * MIB);
    rec_sink_t rec;
    rec_init(&rec);
    mt_alloc_t *a = make_alloc(b, "expandable_segments:True", &rec.sink);
    mt_backend_counters_t c;

    char *p1 = xmalloc_dev(a, 3 * MIB, NULL, MT_TAG_WEIGHTS);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_LARGE].current, 4 * MIB); /* 2 MiB pages */
    mt_backend_counters(b, &c);
    assert_int_equal(c.malloc_calls, 0);
    assert_int_equal(c.vm_reserve_calls, 1);
    assert_int_equal(c.vm_map_calls, 1);
    assert_int_equal(rec_count(&rec, MT_EV_SEGMENT_MAP), 1);

    /* 30 MiB more: the free 1 MiB tail is extended by 30 MiB of pages (one call), so the
     * new block follows the first one in the same run. */
    char *p2 = xmalloc_dev(a, 30 * MIB, NULL, MT_TAG_WEIGHTS);
    assert_ptr_equal(p2, p1 + 3 * MIB);
    s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_LARGE].current, 34 * MIB);
    assert_int_equal(s.segment[MT_STAT_LARGE].current, 1);
    assert_int_equal(s.num_device_alloc, 2);
    /* Mapped memory is usable. */
    assert_int_equal(mt_memset_async(b, p2, 7, 30 * MIB, NULL), 0);
    assert_int_equal(mt_stream_synchronize(b, NULL), 0);

    /* Small requests get their own range, mapped in 2 MiB pages. */
    void *p3 = xmalloc_dev(a, 1000, NULL, 0);
    s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_SMALL].current, 2 * MIB);
    assert_int_equal(mt_alloc_check(a), 0);

    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    assert_int_equal(snap->nsegments, 2);
    for (size_t i = 0; i < snap->nsegments; i++)
        assert_true(snap->segments[i].expandable);
    mt_alloc_snapshot_free(&snap);

    /* Freeing p2 and emptying the cache unmaps the trailing free pages only. */
    mt_alloc_free(a, p2);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_LARGE].current, 4 * MIB);
    assert_int_equal(rec_count(&rec, MT_EV_SEGMENT_UNMAP), 1);
    assert_int_equal(mt_alloc_check(a), 0);
    /* Regrowth maps again at the end. */
    p2 = xmalloc_dev(a, 30 * MIB, NULL, 0);
    assert_ptr_equal(p2, p1 + 3 * MIB);
    mt_alloc_free(a, p2);
    mt_alloc_free(a, p1);
    mt_alloc_free(a, p3);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(s.segment[MT_STAT_ALL].current, 0);
    mt_backend_counters(b, &c);
    assert_true(c.vm_unmap_calls > 0);
    assert_int_equal(c.vm_release_calls, c.vm_reserve_calls);
    assert_int_equal(mt__sim_used_bytes(b), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    rec_fini(&rec);
}

/* Each (stream, pool) reserves its own expandable range of twice the device. When the
 * device's address space runs short (many streams; the sim bounds it like the driver's
 * cuMemAddressReserve), a range is once the device, then the request alone, then no range:
 * a plain segment. Every request is served while memory is free. */
/* Until a small-pool segment exists the pool-indexed stats keep [ALL] alone (st_one);
 * [LARGE] is made equal on read, and the first small segment splits them for good: every
 * figure, peaks and cumulative ones included, is then what separate counting gives. */
static void assert_pooled(const mt_stat_t *arr, int64_t cur, int64_t peak, uint64_t allocd)
{
    assert_int_equal(arr[MT_STAT_LARGE].current, cur);
    assert_int_equal(arr[MT_STAT_LARGE].peak, peak);
    assert_int_equal(arr[MT_STAT_LARGE].allocated, allocd);
}

static void test_stat_pools_split_late(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, "tcache:0", NULL);
    assert_true(a->st_one);
    void *p1 = xmalloc_dev(a, 4 * MIB, NULL, 0);
    void *p2 = xmalloc_dev(a, 2 * MIB, NULL, 0);
    mt_alloc_free(a, p2);
    assert_true(a->st_one);
    mt_alloc_stats_t s = stats_of(a);
    mt_stat_t *pooled[] = {
        s.allocated_bytes, s.reserved_bytes, s.active_bytes, s.inactive_split_bytes,
        s.requested_bytes, s.allocation,     s.segment,      s.active,
        s.inactive_split};
    for (size_t i = 0; i < sizeof pooled / sizeof pooled[0]; i++) {
        assert_memory_equal(&pooled[i][MT_STAT_LARGE], &pooled[i][MT_STAT_ALL], sizeof(mt_stat_t));
        assert_int_equal(pooled[i][MT_STAT_SMALL].current, 0);
        assert_int_equal(pooled[i][MT_STAT_SMALL].peak, 0);
        assert_int_equal(pooled[i][MT_STAT_SMALL].allocated, 0);
    }
    assert_int_equal(s.allocated_bytes[MT_STAT_LARGE].peak, 6 * MIB);
    assert_int_equal(s.inactive_split_bytes[MT_STAT_LARGE].current, 20 * MIB - 4 * MIB);
    assert_int_equal(mt_alloc_check(a), 0);

    void *q = xmalloc_dev(a, 1000, NULL, 0); /* the first small segment */
    assert_false(a->st_one);
    assert_int_equal(mt_alloc_check(a), 0);
    s = stats_of(a);
    assert_pooled(s.allocated_bytes, 4 * MIB, 6 * MIB, 6 * MIB);
    assert_int_equal(s.allocated_bytes[MT_STAT_SMALL].current, 1024);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 4 * MIB + 1024);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].peak, 6 * MIB);
    assert_int_equal(s.reserved_bytes[MT_STAT_SMALL].current, 2 * MIB);
    assert_int_equal(s.segment[MT_STAT_SMALL].current, 1);
    assert_int_equal(s.allocation[MT_STAT_SMALL].allocated, 1);
    assert_pooled(s.allocation, 1, 2, 2);
    mt_alloc_free(a, q);
    mt_alloc_free(a, p1);
    s = stats_of(a);
    assert_pooled(s.allocated_bytes, 0, 6 * MIB, 6 * MIB);
    assert_int_equal(s.allocated_bytes[MT_STAT_SMALL].peak, 1024);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(s.requested_bytes[MT_STAT_SMALL].allocated, 1000);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_expandable_address_space_short(void **state)
{
    (void)state;
    enum { STREAMS = 6 };
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 1024 * MIB;
    bc.sim_malloc_cost_ns = bc.sim_free_cost_ns = 0;
    bc.sim_va_space = 4096 * MIB + 1024 * MIB + 64 * MIB; /* 2x, 2x, 1x, 64 MiB */
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    mt_alloc_t *a = make_alloc_default(b, "expandable_segments:True,place_high_mb:16", NULL);
    mt_stream_t *st[STREAMS];
    void *p[STREAMS];
    for (int i = 0; i < STREAMS; i++) {
        assert_int_equal(mt_stream_create(b, &st[i]), 0);
        assert_int_equal(mt_alloc_malloc(a, 48 * MIB, st[i], 0, &p[i]), 0);
        assert_int_equal(mt_alloc_check(a), 0);
    }
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    size_t expandable = 0, plain = 0;
    for (size_t i = 0; i < snap->nsegments; i++)
        snap->segments[i].expandable ? expandable++ : plain++;
    mt_alloc_snapshot_free(&snap);
    assert_int_equal(expandable, 4); /* 2x, 2x, 1x and the request's 64 MiB */
    assert_int_equal(plain, 2);
    /* The memory is usable, and it all goes back. */
    for (int i = 0; i < STREAMS; i++) {
        assert_int_equal(mt_memset_async(b, p[i], 1, 48 * MIB, st[i]), 0);
        assert_int_equal(mt_stream_synchronize(b, st[i]), 0);
        assert_int_equal(mt_alloc_free(a, p[i]), 0);
    }
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    for (int i = 0; i < STREAMS; i++)
        mt_stream_destroy(b, &st[i]);
    mt_backend_destroy(&b);
}

/* release_to_fit with expandable segments: a request that no free block fits takes its
 * pages from a free hole inside a run (unmapped there, mapped where the request goes), so
 * reserved grows by the difference only and the run splits in two. */
static void test_expandable_release_to_fit(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(512 * MIB);
    rec_sink_t rec;
    rec_init(&rec);
    mt_alloc_t *a = make_alloc(b, "expandable_segments:True,release_to_fit:True", &rec.sink);
    char *pa = xmalloc_dev(a, 8 * MIB, NULL, 0);
    char *pb = xmalloc_dev(a, 8 * MIB, NULL, 0);
    char *pc = xmalloc_dev(a, 8 * MIB, NULL, 0);
    assert_ptr_equal(pb, pa + 8 * MIB);
    assert_ptr_equal(pc, pa + 16 * MIB);
    assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_LARGE].current, 24 * MIB);
    assert_int_equal(mt_alloc_free(a, pb), 0);
    rec.n = 0;
    char *pd = xmalloc_dev(a, 12 * MIB, NULL, 0);
    assert_ptr_equal(pd, pc + 8 * MIB);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_LARGE].current, 28 * MIB);
    assert_int_equal(s.reserved_bytes[MT_STAT_LARGE].peak, 28 * MIB);
    assert_int_equal(s.segment[MT_STAT_LARGE].current, 2);
    assert_int_equal(rec_count(&rec, MT_EV_SEGMENT_UNMAP), 1);
    assert_int_equal(rec_count(&rec, MT_EV_SEGMENT_MAP), 1);
    for (size_t i = 0; i < rec.n; i++)
        if (rec.ev[i].kind == MT_EV_SEGMENT_UNMAP) {
            assert_int_equal(rec.ev[i].addr, (uintptr_t)pb);
            assert_int_equal(rec.ev[i].size, 8 * MIB);
            assert_int_equal(rec.ev[i].reserved, 16 * MIB); /* totals after the unmap */
        }
    assert_int_equal(mt_alloc_check(a), 0);
    /* The hole maps again when a request needs exactly it: the runs join into one. */
    pb = xmalloc_dev(a, 8 * MIB, NULL, 0);
    assert_int_equal(stats_of(a).segment[MT_STAT_LARGE].current, 1);
    assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_LARGE].current, 36 * MIB);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, pa);
    mt_alloc_free(a, pb);
    mt_alloc_free(a, pc);
    mt_alloc_free(a, pd);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(mt__sim_used_bytes(b), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    rec_fini(&rec);
}

/* one_pool: small requests share the large pool's pages with large blocks. */
static void test_expandable_one_pool(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, "expandable_segments:True,one_pool:True", NULL);
    char *big = xmalloc_dev(a, 3 * MIB, NULL, 0);
    char *small = xmalloc_dev(a, 1000, NULL, 0);
    assert_ptr_equal(small, big + 3 * MIB); /* in the free rest of the big block's pages */
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_SMALL].current, 0);
    assert_int_equal(s.reserved_bytes[MT_STAT_LARGE].current, 4 * MIB);
    assert_int_equal(s.segment[MT_STAT_ALL].current, 1);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, small);
    mt_alloc_free(a, big);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* place_high: requests of at least place_high bytes get pages from the top half of the
 * range, the others from the bottom half, so large short-lived blocks do not cut holes
 * among small long-lived ones. Without it the large block extends the small one's run. */
static void test_expandable_place_high(void **state)
{
    (void)state;
    for (int on = 0; on < 2; on++) {
        mt_backend_t *b = sim_backend(256 * MIB);
        mt_alloc_t *a = make_alloc(b,
                                   on ? "expandable_segments:True,one_pool:True,place_high_mb:32"
                                      : "expandable_segments:True,one_pool:True,place_high_mb:0",
                                   NULL);
        char *small = xmalloc_dev(a, 3 * MIB, NULL, 0);
        char *big = xmalloc_dev(a, 40 * MIB, NULL, 0);
        char *mid = xmalloc_dev(a, 30 * MIB, NULL, 0); /* below the threshold: low half */
        if (on) {
            /* The range is twice the device: its halves are 256 MiB each. */
            assert_true(big >= small + 256 * MIB);
            assert_true(mid < small + 256 * MIB);
            assert_int_equal(stats_of(a).segment[MT_STAT_ALL].current, 2);
        } else {
            assert_ptr_equal(big, small + 3 * MIB);
        }
        assert_ptr_equal(mid, on ? small + 3 * MIB : big + 40 * MIB);
        assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_ALL].current, 74 * MIB);
        assert_int_equal(mt_alloc_check(a), 0);
        mt_alloc_free(a, big);
        /* A second large request reuses the top pages. */
        char *big2 = xmalloc_dev(a, 40 * MIB, NULL, 0);
        assert_ptr_equal(big2, big);
        assert_int_equal(mt_alloc_check(a), 0);
        mt_alloc_free(a, big2);
        mt_alloc_free(a, mid);
        mt_alloc_free(a, small);
        assert_int_equal(mt_alloc_empty_cache(a), 0);
        assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_ALL].current, 0);
        mt_alloc_destroy(&a);
        mt_backend_destroy(&b);
    }
}

/* The default (mt_alloc_cfg_default: expandable segments, release_to_fit, one_pool,
 * place_high) maps pages of one range; a backend without virtual memory gets plain
 * segments with the same config, and both pass the checker and give everything back. */
static void test_default_policy_and_fallback(void **state)
{
    (void)state;
    for (int vm = 1; vm >= 0; vm--) {
        mt_backend_t *b = sim_backend(256 * MIB);
        mt_backend_ops_t novm;
        if (!vm) {
            novm = *b->ops;
            novm.vm_reserve = NULL; /* the seam answers MT_ENOTSUP */
            b->ops = &novm;
        }
        rec_sink_t rec;
        rec_init(&rec);
        mt_alloc_t *a = make_alloc_default(b, NULL, &rec.sink);
        char *big = xmalloc_dev(a, 3 * MIB, NULL, 0);
        char *small = xmalloc_dev(a, 1000, NULL, 0);
        char *huge = xmalloc_dev(a, 40 * MIB, NULL, 0);
        assert_int_equal(mt_alloc_check(a), 0);
        mt_alloc_stats_t s = stats_of(a);
        if (vm) {
            /* 4 + 40 MiB of pages, the small block in the big one's last page */
            assert_int_equal(rec_count(&rec, MT_EV_SEGMENT_MAP), 2);
            assert_int_equal(rec_count(&rec, MT_EV_SEGMENT_ALLOC), 0);
            assert_ptr_equal(small, big + 3 * MIB);
            assert_int_equal(s.reserved_bytes[MT_STAT_SMALL].current, 0);
            assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 44 * MIB);
        } else {
            /* the reference's segments: 20 MiB large, 2 MiB small, 40 MiB exact */
            assert_int_equal(rec_count(&rec, MT_EV_SEGMENT_MAP), 0);
            assert_int_equal(rec_count(&rec, MT_EV_SEGMENT_ALLOC), 3);
            assert_int_equal(s.reserved_bytes[MT_STAT_SMALL].current, 2 * MIB);
            assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 62 * MIB);
        }
        mt_alloc_free(a, huge);
        mt_alloc_free(a, small);
        mt_alloc_free(a, big);
        assert_int_equal(mt_alloc_empty_cache(a), 0);
        assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_ALL].current, 0);
        assert_int_equal(mt_alloc_check(a), 0);
        mt_alloc_destroy(&a);
        mt_backend_destroy(&b);
        rec_fini(&rec);
    }
}

/* Variable shapes: expandable segments keep reserved close to allocated where plain
 * segments strand memory between segments. */
static void test_expandable_less_reserved(void **state)
{
    (void)state;
    size_t peak[2];
    for (int e = 0; e < 2; e++) {
        mt_backend_t *b = sim_backend(2048 * MIB);
        mt_alloc_t *a =
            make_alloc(b, e ? "expandable_segments:True" : "release_smaller_segments:False", NULL);
        /* Growing shapes (a batch getting longer): each request is larger than any
         * cached plain segment, but fits the merged free space of an expandable range. */
        void *prev = NULL;
        for (int round = 0; round < 12; round++) {
            void *cur = xmalloc_dev(a, (size_t)(10 + 3 * round) * MIB, NULL, 0);
            mt_alloc_free(a, prev);
            prev = cur;
            assert_int_equal(mt_alloc_check(a), 0);
        }
        peak[e] = (size_t)stats_of(a).reserved_bytes[MT_STAT_ALL].peak;
        mt_alloc_free(a, prev);
        mt_alloc_destroy(&a);
        mt_backend_destroy(&b);
    }
    /* Plain: every round a new segment (sum of all shapes, 324 MiB); expandable: the two
     * largest shapes rounded to 20 MiB pages. */
    assert_true(peak[0] > 250 * MIB);
    assert_true(peak[1] <= 120 * MIB);
    assert_true(peak[1] < peak[0] / 2);
}

static void test_garbage_collection(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(100 * MIB);
    /* Reference behaviour, so that only GC releases anything here. */
    mt_alloc_t *a =
        make_alloc(b, "garbage_collection_threshold:0.5,release_smaller_segments:False", NULL);
    void *pa = xmalloc_dev(a, 20 * MIB, NULL, 0);
    void *pb = xmalloc_dev(a, 22 * MIB, NULL, 0);
    mt_alloc_free(a, pa); /* oldest */
    mt_alloc_free(a, pb);
    /* 42 MiB cached is below the 50 MiB GC limit: nothing collected. */
    void *pc = xmalloc_dev(a, 30 * MIB, NULL, 0);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.num_device_free, 0);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 72 * MIB);
    mt_alloc_free(a, pc); /* newest */
    /* 72 MiB > 50 MiB: the two oldest segments are collected, the newest survives. */
    void *pd = xmalloc_dev(a, 40 * MIB, NULL, 0);
    s = stats_of(a);
    assert_int_equal(s.num_device_free, 2);
    assert_int_equal(s.num_alloc_retries, 0);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 70 * MIB);
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    bool have_c = false;
    for (size_t i = 0; i < snap->nsegments; i++)
        have_c |= snap->segments[i].addr == (uint64_t)(uintptr_t)pc;
    assert_true(have_c);
    mt_alloc_snapshot_free(&snap);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, pd);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* PyTorch's rule: every cached segment at least as old as the mean goes, even past the
 * target, so the next miss does not collect again at once. */
static void test_garbage_collection_by_mean_age(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(200 * MIB);
    mt_alloc_t *a =
        make_alloc(b, "garbage_collection_threshold:0.35,release_smaller_segments:False", NULL);
    void *p[4];
    for (int i = 0; i < 4; i++)
        p[i] = xmalloc_dev(a, 20 * MIB, NULL, 0);
    for (int i = 0; i < 4; i++)
        mt_alloc_free(a, p[i]); /* ages 3, 2, 1, 0: the mean is 1.5 */
    /* 80 MiB reserved, limit 70 MiB: the excess is 10 MiB, one segment would cover it, but
     * both segments older than the mean go. */
    void *q = xmalloc_dev(a, 30 * MIB, NULL, 0);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.num_device_free, 2);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 70 * MIB);
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    int kept = 0;
    for (size_t i = 0; i < snap->nsegments; i++)
        kept += (snap->segments[i].addr == (uint64_t)(uintptr_t)p[2]) +
                (snap->segments[i].addr == (uint64_t)(uintptr_t)p[3]);
    assert_int_equal(kept, 2);
    mt_alloc_snapshot_free(&snap);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, q);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_release_cache_and_retry(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, "release_smaller_segments:False", NULL);
    void *p = xmalloc_dev(a, 40 * MIB, NULL, 0);
    mt_alloc_free(a, p);
    /* 50 MiB does not fit the cached 40 MiB nor next to it: release the cache, retry. */
    void *q = xmalloc_dev(a, 50 * MIB, NULL, 0);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.num_alloc_retries, 1);
    assert_int_equal(s.num_ooms, 0);
    assert_int_equal(s.num_device_free, 1);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 50 * MIB);
    mt_alloc_free(a, q);
    assert_int_equal(mt_alloc_empty_cache(a), 0);

    /* An injected backend failure is recovered by the retry too... */
    assert_int_equal(mt__sim_inject_malloc_failures(b, 1), 0);
    void *r = xmalloc_dev(a, 60 * MIB, NULL, 0);
    s = stats_of(a);
    assert_int_equal(s.num_alloc_retries, 2);
    mt_alloc_free(a, r);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);

    /* ...but not when release_on_oom is off. */
    a = make_alloc(b, "release_on_oom:false", NULL);
    assert_int_equal(mt__sim_inject_malloc_failures(b, 1), 0);
    void *t = NULL;
    assert_int_equal(mt_alloc_malloc(a, 4096, NULL, 0, &t), MT_ENOMEM);
    s = stats_of(a);
    assert_int_equal(s.num_alloc_retries, 0);
    assert_int_equal(s.num_ooms, 1);
    t = xmalloc_dev(a, 4096, NULL, 0);
    mt_alloc_free(a, t);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* A device malloc that fails for a reason other than memory is not an OOM: the cache is
 * kept, nothing is counted as a retry or an OOM, and the caller gets the device's code. */
static void test_non_memory_failure_is_not_oom(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, "release_smaller_segments:False", NULL);
    void *p = xmalloc_dev(a, 4 * MIB, NULL, 0);
    mt_alloc_free(a, p);
    mt_alloc_stats_t before = stats_of(a);
    assert_int_equal(mt__sim_inject_malloc_errors(b, 1, MT_EIO), 0);
    void *q = NULL;
    assert_int_equal(mt_alloc_malloc(a, 40 * MIB, NULL, 0, &q), MT_EIO);
    assert_null(q);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.num_ooms, 0);
    assert_int_equal(s.num_alloc_retries, before.num_alloc_retries);
    assert_int_equal(s.num_device_free, before.num_device_free);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current,
                     before.reserved_bytes[MT_STAT_ALL].current);
    assert_int_equal(mt__sim_inject_malloc_errors(b, 1, 0), MT_EINVAL);
    q = xmalloc_dev(a, 40 * MIB, NULL, 0);
    mt_alloc_free(a, q);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_oversize_release(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(128 * MIB);
    mt_alloc_t *a = make_alloc(b, "max_split_size_mb:32,release_smaller_segments:False", NULL);
    void *p = xmalloc_dev(a, 60 * MIB, NULL, 0);
    mt_alloc_free(a, p);
    void *q = xmalloc_dev(a, 70 * MIB, NULL, 0);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.num_device_free, 1);   /* the cached oversize block went back */
    assert_int_equal(s.num_alloc_retries, 0); /* before the full release-and-retry */
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, q);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_oom_report(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    rec_sink_t rec;
    rec_init(&rec);
    log_capture_t cap = {{0}, 0};
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    assert_int_equal(mt_alloc_cfg_parse(&cfg, "rules:reference", NULL, 0), 0); /* 20 MiB segs */
    cfg.backend = b;
    cfg.sink = &rec.sink;
    cfg.log = capture_log;
    cfg.log_ud = &cap;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &cfg), 0);
    assert_string_equal(mt_alloc_last_error(a), "");

    /* 8 MiB in a 20 MiB segment: 12 MiB reserved but unallocated. */
    void *p = xmalloc_dev(a, 8 * MIB, NULL, 0);
    void *q = NULL;
    assert_int_equal(mt_alloc_malloc(a, 50 * MIB, NULL, 0, &q), MT_ENOMEM);
    assert_null(q);
    const char *msg = mt_alloc_last_error(a);
    assert_non_null(strstr(msg, "out of memory"));
    assert_non_null(strstr(msg, "tried to allocate 50.00 MiB"));
    assert_non_null(strstr(msg, "total capacity of 64.00 MiB"));
    assert_non_null(strstr(msg, "44.00 MiB is free"));
    assert_non_null(strstr(msg, "8.00 MiB is allocated by memtrace"));
    assert_non_null(strstr(msg, "12.00 MiB is reserved by memtrace but unallocated"));
    assert_non_null(strstr(msg, "largest free block 12.00 MiB"));
    assert_non_null(strstr(msg, "expandable_segments:True"));
    assert_non_null(strstr(msg, "max_split_size_mb"));
    assert_int_equal(cap.nerrors, 1);
    assert_non_null(strstr(cap.last_error, msg));
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.num_ooms, 1);
    assert_int_equal(s.num_alloc_retries, 1);
    assert_int_equal(rec_count(&rec, MT_EV_OOM), 1);
    for (size_t i = 0; i < rec.n; i++) {
        if (rec.ev[i].kind == MT_EV_OOM) {
            assert_int_equal(rec.ev[i].requested, 50 * MIB);
            assert_int_equal(rec.ev[i].size, 44 * MIB);
            assert_int_equal(rec.ev[i].allocated, 8 * MIB);
            assert_int_equal(rec.ev[i].reserved, 20 * MIB);
        }
    }
    /* The allocator is intact after the failure. */
    assert_int_equal(mt_alloc_check(a), 0);
    void *r = xmalloc_dev(a, 4 * MIB, NULL, 0);
    mt_alloc_free(a, r);
    mt_alloc_free(a, p);
    /* Absurd sizes fail cleanly too. */
    assert_int_equal(mt_alloc_malloc(a, SIZE_MAX - 100, NULL, 0, &q), MT_ENOMEM);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    rec_fini(&rec);
}

/* Beyond the reference: cached segments too small for a large miss go back first. */
static void test_release_smaller_segments(void **state)
{
    (void)state;
    for (int on = 0; on < 2; on++) {
        mt_backend_t *b = sim_backend(1024 * MIB);
        mt_alloc_t *a = make_alloc(b, on ? NULL : "release_smaller_segments:False", NULL);
        void *p30 = xmalloc_dev(a, 30 * MIB, NULL, 0);
        void *p40 = xmalloc_dev(a, 40 * MIB, NULL, 0);
        void *p60 = xmalloc_dev(a, 60 * MIB, NULL, 0);
        void *p8 = xmalloc_dev(a, 8 * MIB, NULL, 0); /* a split 20 MiB segment */
        mt_alloc_free(a, p30);
        mt_alloc_free(a, p40);
        mt_alloc_free(a, p8);
        /* 50 MiB fits nothing cached (the 60 MiB segment is in use). */
        void *p50 = xmalloc_dev(a, 50 * MIB, NULL, 0);
        mt_alloc_stats_t s = stats_of(a);
        if (on) {
            /* 30, 40 and the whole free 20 MiB segment are smaller: released. */
            assert_int_equal(s.num_device_free, 3);
            assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 110 * MIB);
        } else {
            assert_int_equal(s.num_device_free, 0);
            assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 200 * MIB);
        }
        /* Smaller requests are still served from cache without a backend call. */
        uint64_t m = backend_mallocs(b);
        mt_alloc_free(a, p50);
        void *q = xmalloc_dev(a, 35 * MIB, NULL, 0);
        assert_int_equal(backend_mallocs(b), m);
        assert_int_equal(mt_alloc_check(a), 0);
        mt_alloc_free(a, q);
        mt_alloc_free(a, p60);
        mt_alloc_destroy(&a);
        mt_backend_destroy(&b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expandable_segments),
        cmocka_unit_test(test_expandable_less_reserved),
        cmocka_unit_test(test_garbage_collection),
        cmocka_unit_test(test_garbage_collection_by_mean_age),
        cmocka_unit_test(test_release_cache_and_retry),
        cmocka_unit_test(test_non_memory_failure_is_not_oom),
        cmocka_unit_test(test_oversize_release),
        cmocka_unit_test(test_oom_report),
        cmocka_unit_test(test_release_smaller_segments),
        cmocka_unit_test(test_expandable_address_space_short),
        cmocka_unit_test(test_stat_pools_split_late),
        cmocka_unit_test(test_expandable_release_to_fit),
        cmocka_unit_test(test_expandable_one_pool),
        cmocka_unit_test(test_expandable_place_high),
        cmocka_unit_test(test_default_policy_and_fallback),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
