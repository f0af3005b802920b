/* Seeded randomized runs with mt_alloc_check() after every step, and a multi-threaded
 * stress run. */
#include <pthread.h>

#include "helpers.h"
#include "mt_config.h"
#include "tests/common/test_main.h"

/* A run's operations: a quarter where each costs 10-50x (MT_TEST_LIGHT: the sanitizers'
 * build, with every whole-allocator check on; qemu). */
#define OPS(n) (MT_TEST_LIGHT ? (n) / 4 : (n))

typedef struct live_s {
    void *p;
    size_t size;
    int tag;
} live_t;

static uint64_t rng(uint64_t *s)
{
    /* xorshift64*: deterministic across platforms. */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static size_t random_size(uint64_t *seed)
{
    uint64_t r = rng(seed) % 100;
    if (r < 70)
        return 1 + rng(seed) % (64 * KIB);
    if (r < 95)
        return 1 + rng(seed) % (4 * MIB);
    return 1 + rng(seed) % (40 * MIB);
}

enum { MAXLIVE = 256 };

/* nops operations on an allocator configured by conf; returns how many mallocs failed. */
static size_t random_run(const char *conf, size_t capacity, size_t nops, uint64_t seed)
{
    mt_backend_t *b = sim_backend(capacity);
    mt_alloc_t *a = make_alloc(b, conf, NULL);
    mt_stream_t *streams[3] = {NULL, NULL, NULL};
    assert_int_equal(mt_stream_create(b, &streams[1]), 0);
    assert_int_equal(mt_stream_create(b, &streams[2]), 0);
    live_t live[MAXLIVE];
    size_t nlive = 0, nfail = 0;
    int64_t want_alloc = 0;
    for (size_t op = 0; op < nops; op++) {
        uint64_t r = rng(&seed) % 1000;
        if ((r < 520 && nlive < MAXLIVE) || nlive == 0) {
            size_t n = random_size(&seed);
            int tag = (int)(rng(&seed) % MT_TAG_USER_FIRST);
            mt_stream_t *s = streams[rng(&seed) % 3];
            void *p = NULL;
            int rc = mt_alloc_malloc(a, n, s, tag, &p);
            if (rc == MT_ENOMEM) {
                nfail++;
            } else {
                assert_int_equal(rc, 0);
                size_t sz = 0;
                assert_int_equal(mt_alloc_block_info(a, p, NULL, &sz, NULL), 0);
                assert_true(sz >= n);
                live[nlive++] = (live_t){p, sz, tag};
                want_alloc += (int64_t)sz;
            }
        } else if (r < 990) {
            size_t i = rng(&seed) % nlive;
            if (r % 7 == 0)
                assert_int_equal(mt_alloc_record_stream(a, live[i].p, streams[rng(&seed) % 3]), 0);
            assert_int_equal(mt_alloc_free(a, live[i].p), 0);
            want_alloc -= (int64_t)live[i].size;
            live[i] = live[--nlive];
        } else if (r < 995) {
            assert_int_equal(mt_alloc_empty_cache(a), 0);
        } else {
            mt_alloc_stats_t st = stats_of(a);
            assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, want_alloc);
            assert_int_equal(st.allocation[MT_STAT_ALL].current, (int64_t)nlive);
            assert_true(st.fragmentation >= 0.0 && st.fragmentation <= 1.0);
            assert_true(st.largest_free_block <= st.total_free);
        }
        if (mt_alloc_check(a) != 0)
            fail_msg("op %zu: %s", op, mt_alloc_last_error(a));
    }
    for (size_t i = 0; i < nlive; i++)
        assert_int_equal(mt_alloc_free(a, live[i].p), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_stats_t st = stats_of(a);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(st.active_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(st.reserved_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(mt__sim_used_bytes(b), 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &streams[1]);
    mt_stream_destroy(b, &streams[2]);
    assert_int_equal(mt__sim_check(b), 0);
    mt_backend_destroy(&b);
    return nfail;
}

static void test_random_100k(void **state)
{
    (void)state;
    random_run(NULL, 2048 * MIB, OPS(100000), 0x9e3779b97f4a7c15ull);
}

static void test_random_configs(void **state)
{
    (void)state;
    random_run("expandable_segments:True", 2048 * MIB, OPS(20000), 7);
    random_run("expandable_segments:True,release_to_fit:True", 2048 * MIB, OPS(20000), 13);
    random_run("expandable_segments:True,release_to_fit:True,one_pool:True", 2048 * MIB, OPS(20000),
               23);
    random_run("release_to_fit:True,fit_large_segments:True,split_large_tails:True", 1024 * MIB,
               20000, 17);
    random_run("max_split_size_mb:24,roundup_power2_divisions:4,"
               "garbage_collection_threshold:0.3,release_smaller_segments:False",
               1024 * MIB, OPS(20000), 11);
}

static void test_random_under_pressure(void **state)
{
    (void)state;
    /* A device too small for the live set: the OOM and recovery paths run often. */
    size_t fails = random_run(NULL, 160 * MIB, OPS(20000), 3);
    assert_true(fails > 0);
    fails = random_run("expandable_segments:True", 160 * MIB, OPS(20000), 5);
    assert_true(fails > 0);
    fails = random_run("expandable_segments:True,release_to_fit:True", 160 * MIB, OPS(20000), 19);
    assert_true(fails > 0);
}

/* ---- the stats against the snapshot ---- */

/* The stats the snapshot carries against its blocks: largest free block, total free and
 * inactive_split (free blocks of segments with other blocks); no two free blocks touch. */
static void stats_agree_with_snapshot(mt_alloc_t *a, int op)
{
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    uint64_t largest = 0, total = 0, nsplit = 0, split_bytes = 0;
    for (size_t i = 0; i < snap->nsegments; i++) {
        const mt_snapshot_segment_t *s = &snap->segments[i];
        for (size_t j = 0; j < s->nblocks; j++) {
            const mt_snapshot_block_t *b = &s->blocks[j];
            if (j > 0 && b->state == MT_BLOCK_INACTIVE &&
                s->blocks[j - 1].state == MT_BLOCK_INACTIVE)
                fail_msg("op %d: two touching free blocks at %#llx", op,
                         (unsigned long long)b->addr);
            if (b->state != MT_BLOCK_INACTIVE)
                continue;
            total += b->size;
            largest = b->size > largest ? b->size : largest;
            if (s->nblocks > 1) {
                nsplit++;
                split_bytes += b->size;
            }
        }
    }
    const mt_alloc_stats_t *st = &snap->stats;
    if (st->largest_free_block != largest || st->total_free != total ||
        (uint64_t)st->inactive_split[MT_STAT_ALL].current != nsplit ||
        (uint64_t)st->inactive_split_bytes[MT_STAT_ALL].current != split_bytes)
        fail_msg("op %d: stats (largest %llu, free %llu, split %lld / %lld B) against the "
                 "snapshot (%llu, %llu, %llu / %llu B)",
                 op, (unsigned long long)st->largest_free_block, (unsigned long long)st->total_free,
                 (long long)st->inactive_split[MT_STAT_ALL].current,
                 (long long)st->inactive_split_bytes[MT_STAT_ALL].current,
                 (unsigned long long)largest, (unsigned long long)total, (unsigned long long)nsplit,
                 (unsigned long long)split_bytes);
    mt_alloc_snapshot_free(&snap);
}

/* Few sizes (so that blocks are reused and split), random frees, two streams: the checker
 * and the snapshot agree with the stats after every operation. */
static void against_snapshot(const char *conf, uint64_t seed)
{
    static const size_t sizes[] = {512, 3 * KIB, 64 * KIB, 700 * KIB, 1 * MIB, 3 * MIB, 12 * MIB};
    mt_backend_t *b = sim_backend(512 * MIB);
    mt_alloc_t *a = make_alloc(b, conf, NULL);
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s2), 0);
    void *live[64] = {0};
    for (int op = 0; op < 3000; op++) {
        int i = (int)(rng(&seed) % 64);
        if (live[i] == NULL) {
            size_t n = sizes[rng(&seed) % 7];
            mt_stream_t *s = rng(&seed) % 4 == 0 ? s2 : NULL;
            assert_int_equal(mt_alloc_malloc(a, n, s, 0, &live[i]), 0);
        } else {
            assert_int_equal(mt_alloc_free(a, live[i]), 0);
            live[i] = NULL;
        }
        if (mt_alloc_check(a) != 0)
            fail_msg("op %d: %s", op, mt_alloc_last_error(a));
        stats_agree_with_snapshot(a, op);
    }
    for (int i = 0; i < 64; i++)
        if (live[i] != NULL)
            assert_int_equal(mt_alloc_free(a, live[i]), 0);
    stats_agree_with_snapshot(a, -1);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_ALL].current, 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

static void test_random_against_snapshot(void **state)
{
    (void)state;
    against_snapshot("tcache:0", 12345);
    against_snapshot("", 777);
    against_snapshot("expandable_segments:True", 4242);
}

/* ---- multi-threaded stress ---- */

typedef struct worker_s {
    mt_alloc_t *a;
    mt_stream_t *stream;
    uint64_t seed;
    int nops;
    int failures;
} worker_t;

static void *worker(void *arg)
{
    worker_t *w = arg;
    void *live[64];
    int nlive = 0;
    for (int i = 0; i < w->nops; i++) {
        if (nlive < 64 && (nlive == 0 || rng(&w->seed) % 2 == 0)) {
            size_t n = 1 + rng(&w->seed) % (rng(&w->seed) % 10 == 0 ? 8 * MIB : 32 * KIB);
            void *p = NULL;
            if (mt_alloc_malloc(w->a, n, w->stream, MT_TAG_OTHER, &p) != 0)
                w->failures++;
            else
                live[nlive++] = p;
        } else {
            int k = (int)(rng(&w->seed) % (uint64_t)nlive);
            if (mt_alloc_free(w->a, live[k]) != 0)
                w->failures++;
            live[k] = live[--nlive];
        }
    }
    for (int i = 0; i < nlive; i++)
        if (mt_alloc_free(w->a, live[i]) != 0)
            w->failures++;
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(4096 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s1 = NULL;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    pthread_t th[4];
    worker_t w[4];
    for (int i = 0; i < 4; i++) {
        /* Two threads share the default stream, two share s1. */
        w[i] = (worker_t){a, i % 2 ? s1 : NULL, 1234u + (uint64_t)i * 77, 40000, 0};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_stats_t st = stats_of(a);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(st.allocation[MT_STAT_ALL].allocated, st.allocation[MT_STAT_ALL].freed);
    assert_true(st.allocation[MT_STAT_ALL].allocated >= 4 * 20000 / 2);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s1);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_100k),
        cmocka_unit_test(test_random_configs),
        cmocka_unit_test(test_random_under_pressure),
        cmocka_unit_test(test_random_against_snapshot),
        cmocka_unit_test(test_threads),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
