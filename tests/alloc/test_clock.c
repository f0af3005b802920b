/* The allocator's event clock: CLOCK_MONOTONIC nanoseconds, from the TSC when it is
 * invariant, from clock_gettime otherwise; and the stamps the allocator puts on events. */
#include "helpers.h"

#include <time.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clock_tsc),
        cmocka_unit_test(test_clock_gettime),
        cmocka_unit_test(test_event_stamps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
