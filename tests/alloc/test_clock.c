/* The allocator's event clock: CLOCK_MONOTONIC nanoseconds, from the TSC when it is
 * invariant, from clock_gettime otherwise; and the stamps the allocator puts on events. */
#include "helpers.h"

#include <time.h>
#include "tests/common/test_main.h"

static uint64_t mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Every read lies between CLOCK_MONOTONIC read just before and just after it, within the
 * clock's error bound (a span's worth of rate error, under 2 us; 10 us is far above it and far
 * below any confusion with another event), and reads never go backwards. Runs past several
 * re-anchoring spans (1 ms each), including a sleep longer than a span. */
static void check_clock(bool allow_tsc)
{
    mt__clock_t c;
    mt__clock_init(&c, allow_tsc);
    const uint64_t tol = 10000;
    uint64_t prev = 0, start = mono();
    int n = 0;
    while (mono() - start < 20u * 1000u * 1000u || n < 1000) {
        uint64_t before = mono();
        uint64_t t = mt__clock_now(&c);
        uint64_t after = mono();
        assert_true(t + tol >= before);
        assert_true(t <= after + tol);
        assert_true(t >= prev);
        prev = t;
        if (++n % 5000 == 0) {
            struct timespec ts = {0, 3 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

static void test_clock_tsc(void **state)
{
    (void)state;
    check_clock(true);
}

static void test_clock_gettime(void **state)
{
    (void)state;
    mt__clock_t c;
    mt__clock_init(&c, false);
    assert_false(c.tsc);
    check_clock(false);
}

static size_t nbatches;

static void rec_emit_n(void *ud, const mt_event_rec_t *ev, size_t n)
{
    assert_int_equal(n, 2); /* only a free completing at once batches its events */
    assert_int_equal(ev[0].kind, MT_EV_FREE_REQUESTED);
    assert_int_equal(ev[1].kind, MT_EV_FREE_COMPLETED);
    nbatches++;
    for (size_t i = 0; i < n; i++)
        rec_emit(ud, &ev[i]);
}

/* A free that completes at once stamps free_requested and free_completed with one clock
 * read and emits them as one batch (to a sink that takes batches); events of successive
 * operations carry non-decreasing times close to now. */
static void test_event_stamps(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    rec_sink_t rec;
    rec_init(&rec);
    rec.sink.emit_n = rec_emit_n;
    nbatches = 0;
    mt_alloc_t *a = make_alloc(b, NULL, &rec.sink);
    uint64_t t0 = mono();
    for (int i = 0; i < 100; i++) {
        void *p = xmalloc_dev(a, 1000 + (size_t)i * 512, NULL, MT_TAG_OTHER);
        assert_int_equal(mt_alloc_free(a, p), 0);
    }
    /* the last free's events wait in the thread's cache until a marker (or the next global
     * operation) hands them over, stamped then */
    mt_alloc_emit(a, MT_EV_MARK, MT_MARK_ITERATION, 1, 0);
    uint64_t t1 = mono();
    uint64_t prev = 0;
    size_t pairs = 0;
    for (size_t i = 0; i < rec.n; i++) {
        const mt_event_rec_t *ev = &rec.ev[i];
        assert_true(ev->time_ns >= prev);
        prev = ev->time_ns;
        if (ev->kind != MT_EV_ALLOC && ev->kind != MT_EV_FREE_REQUESTED &&
            ev->kind != MT_EV_FREE_COMPLETED)
            continue;
        assert_true(ev->time_ns + 20000 >= t0 && ev->time_ns <= t1 + 20000);
        if (ev->kind == MT_EV_FREE_REQUESTED) {
            assert_true(i + 1 < rec.n);
            assert_int_equal(rec.ev[i + 1].kind, MT_EV_FREE_COMPLETED);
            assert_int_equal(rec.ev[i + 1].time_ns, ev->time_ns);
            pairs++;
        }
    }
    assert_int_equal(pairs, 100);
    assert_int_equal(nbatches, 100);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    rec_fini(&rec);
}

/* Periodic MT_EV_STATS: emitted from the events' own stamps, never closer than the period,
 * at least one once the events span two periods, carrying the totals of the event before
 * it, the peak allocated bytes and the bytes requested by live allocations; none with a
 * period of 0 (and a bad period refused). */
static void test_periodic_stats(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    rec_sink_t rec;
    rec_init(&rec);
    mt_alloc_t *a = make_alloc(b, "stats_period_ms:2", &rec.sink);
    void *keep = xmalloc_dev(a, 3000, NULL, MT_TAG_WEIGHTS);
    for (int i = 0; i < 40; i++) {
        void *p = xmalloc_dev(a, 1000 + (size_t)i * 4096, NULL, MT_TAG_OTHER);
        struct timespec ts = {0, 500 * 1000};
        nanosleep(&ts, NULL);
        assert_int_equal(mt_alloc_free(a, p), 0);
    }
    int64_t requested = 0, peak = 0;
    uint64_t last_stats = 0, first = 0, last = 0;
    size_t nstats = 0;
    for (size_t i = 0; i < rec.n; i++) {
        const mt_event_rec_t *ev = &rec.ev[i];
        if (ev->kind == MT_EV_STATS) {
            assert_true(i > 0);
            const mt_event_rec_t *prev = &rec.ev[i - 1];
            assert_int_equal(ev->allocated, prev->allocated);
            assert_int_equal(ev->reserved, prev->reserved);
            assert_int_equal(ev->time_ns, prev->time_ns);
            assert_int_equal(ev->size, peak);
            assert_int_equal(ev->requested, requested);
            assert_true(nstats == 0 || ev->time_ns - last_stats >= 2000000u);
            last_stats = ev->time_ns;
            nstats++;
            continue;
        }
        if (ev->kind == MT_EV_ALLOC)
            requested += (int64_t)ev->requested;
        if (ev->kind == MT_EV_FREE_REQUESTED)
            requested -= (int64_t)ev->requested;
        if ((int64_t)ev->allocated > peak)
            peak = (int64_t)ev->allocated;
        if (first == 0)
            first = ev->time_ns;
        last = ev->time_ns;
    }
    /* Events spanning over two periods past the first one due (creation + one period)
     * leave at least one stats event behind: the allocator checks at every event. */
    if (last - first >= 3 * 2000000u)
        assert_true(nstats >= 1);
    assert_int_equal(mt_alloc_free(a, keep), 0);
    mt_alloc_destroy(&a);
    rec_fini(&rec);

    rec_init(&rec);
    a = make_alloc(b, "stats_period_ms:0", &rec.sink);
    for (int i = 0; i < 10; i++) {
        void *p = xmalloc_dev(a, 4096, NULL, MT_TAG_OTHER);
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
        assert_int_equal(mt_alloc_free(a, p), 0);
    }
    assert_int_equal(rec_count(&rec, MT_EV_STATS), 0);
    mt_alloc_destroy(&a);
    rec_fini(&rec);
    mt_alloc_cfg_t c = mt_alloc_cfg_default();
    assert_int_equal(c.stats_period_ms, 1000);
    assert_int_equal(mt_alloc_cfg_parse(&c, "stats_period_ms:soon", NULL, 0), MT_EINVAL);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clock_tsc),
        cmocka_unit_test(test_clock_gettime),
        cmocka_unit_test(test_event_stamps),
        cmocka_unit_test(test_periodic_stats),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
