/* Stream-aware reuse: blocks are reused only on their own stream, and a block used on
 * another stream (record_stream) is not handed out again before that stream's queued
 * work on it has run. Uses the sim backend's real asynchronous streams. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "helpers.h"
#include "tests/common/test_main.h"

static void *open_later(void *arg)
{
    usleep(50 * 1000);
    gate_open(arg);
    return NULL;
}

static int state_of(mt_alloc_t *a, void *p)
{
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    int st = -1;
    for (size_t i = 0; i < snap->nsegments; i++)
        for (size_t j = 0; j < snap->segments[i].nblocks; j++)
            if (snap->segments[i].blocks[j].addr == (uint64_t)(uintptr_t)p)
                st = snap->segments[i].blocks[j].state;
    mt_alloc_snapshot_free(&snap);
    return st;
}

static void test_deferred_reuse_poisoning(void **state)
{
    (void)state;
    const size_t n = 1 * MIB;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s1 = NULL, *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    assert_int_equal(mt_stream_create(b, &s2), 0);
    unsigned char *host = malloc(n);
    memset(host, 0, n);

    void *p = xmalloc_dev(a, n, s1, MT_TAG_ACTIVATIONS);
    assert_int_equal(mt_memset_async(b, p, 0xAB, n, s1), 0);
    assert_int_equal(mt_stream_synchronize(b, s1), 0);
    /* s2 will read p, but only after the gate opens. */
    assert_int_equal(mt_alloc_record_stream(a, p, s2), 0);
    gate_t g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
    assert_int_equal(mt_stream_launch_host_func(b, s2, gate_wait, &g), 0);
    assert_int_equal(mt_memcpy_async(b, host, p, n, MT_MEMCPY_DEVICE_TO_HOST, s2), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(state_of(a, p), MT_BLOCK_ACTIVE_PENDING_FREE);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(s.active_bytes[MT_STAT_ALL].current, (int64_t)n);

    /* A new block of the same size on s1 must not be p: poison it and make sure the
     * pending copy still sees the original bytes. */
    void *q = xmalloc_dev(a, n, s1, MT_TAG_ACTIVATIONS);
    assert_true(q != p);
    assert_int_equal(mt_memset_async(b, q, 0xCD, n, s1), 0);
    assert_int_equal(mt_stream_synchronize(b, s1), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    assert_int_equal(state_of(a, p), MT_BLOCK_ACTIVE_PENDING_FREE);

    gate_open(&g);
    assert_int_equal(mt_stream_synchronize(b, s2), 0);
    for (size_t i = 0; i < n; i++)
        if (host[i] != 0xAB)
            fail_msg("byte %zu was overwritten before the other stream read it", i);

    /* Now the event has completed: the next malloc on s1 gets p back. */
    void *r = xmalloc_dev(a, n, s1, MT_TAG_ACTIVATIONS);
    assert_ptr_equal(r, p);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, q);
    mt_alloc_free(a, r);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s1);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
    free(host);
}

static void test_reuse_only_on_own_stream(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s1 = NULL;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    void *p = xmalloc_dev(a, 4096, NULL, 0);
    mt_alloc_free(a, p);
    void *q = xmalloc_dev(a, 4096, s1, 0);
    assert_true(q != p);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.segment[MT_STAT_SMALL].current, 2);
    void *r = xmalloc_dev(a, 4096, NULL, 0);
    assert_ptr_equal(r, p);
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    assert_int_equal(snap->nsegments, 2);
    uint32_t ids[2] = {snap->segments[0].stream, snap->segments[1].stream};
    assert_true((ids[0] == 0 && ids[1] == mt_stream_id(s1)) ||
                (ids[1] == 0 && ids[0] == mt_stream_id(s1)));
    mt_alloc_snapshot_free(&snap);
    mt_alloc_free(a, q);
    mt_alloc_free(a, r);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s1);
    mt_backend_destroy(&b);
}

static void test_events_pooled_and_no_queries_when_idle(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s1 = NULL;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    mt_backend_counters_t c0, c1;
    mt_backend_counters(b, &c0);
    for (int i = 0; i < 200; i++) {
        void *p = xmalloc_dev(a, 8192, NULL, 0);
        assert_int_equal(mt_alloc_free(a, p), 0);
    }
    mt_backend_counters(b, &c1);
    assert_int_equal(c1.event_queries, c0.event_queries);
    assert_int_equal(c1.event_records, c0.event_records);
    assert_int_equal(c1.malloc_calls, c0.malloc_calls + 1);

    for (int i = 0; i < 100; i++) {
        void *p = xmalloc_dev(a, 8192, NULL, 0);
        assert_int_equal(mt_alloc_record_stream(a, p, s1), 0);
        assert_int_equal(mt_alloc_record_stream(a, p, s1), 0);   /* duplicates are one use */
        assert_int_equal(mt_alloc_record_stream(a, p, NULL), 0); /* own stream: no use */
        assert_int_equal(mt_alloc_free(a, p), 0);
        assert_int_equal(mt_stream_synchronize(b, s1), 0);
    }
    mt_backend_counters(b, &c0);
    assert_int_equal(c0.event_records, c1.event_records + 100);
    /* Every event ever created is pooled or pending: reused, not one per free. */
    assert_true(a->nevpool + a->npending <= 2);
    assert_int_equal(mt_alloc_check(a), 0);
    assert_int_equal(mt_alloc_record_stream(a, (void *)(uintptr_t)0x1000, s1), MT_ENOENT);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s1);
    mt_backend_destroy(&b);
}

/* Out of memory while a block waits for another stream: recovery synchronises the
 * pending events, and the block is reused instead of failing. */
static void test_pending_block_recovered_on_oom(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(40 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s1 = NULL;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    gate_t g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
    void *p = xmalloc_dev(a, 30 * MIB, NULL, 0);
    assert_int_equal(mt_alloc_record_stream(a, p, s1), 0);
    assert_int_equal(mt_stream_launch_host_func(b, s1, gate_wait, &g), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    /* The gate opens a little later from another thread, so the malloc below usually
     * finds the event still pending and the recovery path has to wait for it; either
     * way the block must come back rather than the allocation failing. */
    pthread_t opener;
    assert_int_equal(pthread_create(&opener, NULL, open_later, &g), 0);
    void *q = xmalloc_dev(a, 30 * MIB, NULL, 0);
    pthread_join(opener, NULL);
    assert_ptr_equal(q, p);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.num_ooms, 0);
    mt_alloc_free(a, q);
    /* Destroy with a pending free waits for it. */
    void *r = xmalloc_dev(a, 4096, NULL, 0);
    assert_int_equal(mt_alloc_record_stream(a, r, s1), 0);
    assert_int_equal(mt_alloc_free(a, r), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s1);
    mt_backend_destroy(&b);
}

/* Cached segments may outlive the stream they served: releasing them later must not
 * touch the destroyed stream (run under ASan to see it). */
static void test_segments_outlive_their_stream(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    rec_sink_t rec;
    rec_init(&rec);
    for (int e = 0; e < 2; e++) {
        mt_alloc_t *a = make_alloc(b, e ? "expandable_segments:True" : NULL, &rec.sink);
        mt_stream_t *s1 = NULL;
        assert_int_equal(mt_stream_create(b, &s1), 0);
        uint32_t id = mt_stream_id(s1);
        void *p = xmalloc_dev(a, 3 * MIB, s1, 0);
        assert_int_equal(mt_alloc_free(a, p), 0);
        mt_stream_destroy(b, &s1);
        rec.n = 0;
        assert_int_equal(mt_alloc_empty_cache(a), 0);
        assert_int_equal(rec_count(&rec, e ? MT_EV_SEGMENT_UNMAP : MT_EV_SEGMENT_FREE), 1);
        assert_int_equal(rec.ev[0].stream, id);
        assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_ALL].current, 0);
        assert_int_equal(mt_alloc_check(a), 0);
        mt_alloc_destroy(&a);
    }
    mt_backend_destroy(&b);
    rec_fini(&rec);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deferred_reuse_poisoning),
        cmocka_unit_test(test_reuse_only_on_own_stream),
        cmocka_unit_test(test_events_pooled_and_no_queries_when_idle),
        cmocka_unit_test(test_pending_block_recovered_on_oom),
        cmocka_unit_test(test_segments_outlive_their_stream),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
