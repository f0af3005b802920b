/* The prefetcher: batch k+1 is copied while batch k is held on the compute stream (proved
 * with a gate and stream timestamps), no batch is read before its copy completed (poisoned
 * buffers, slowed copies), slices are views, and nothing synchronises the device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "host_fixture.h"
#include "tests/common/test_main.h"

#define POISON 0xA5

static unsigned char pattern(uint64_t index, size_t i)
{
    unsigned char v = (unsigned char)(index * 131u + i * 7u + 1u);
    return v == POISON ? (unsigned char)(v + 1) : v;
}

static int fill_pattern(void *ud, uint64_t index, void *dst, size_t bytes)
{
    (void)ud;
    unsigned char *d = dst;
    for (size_t i = 0; i < bytes; i++)
        d[i] = pattern(index, i);
    return 0;
}

/* What the consumer (a host function on the compute stream) checks of one batch. */
typedef struct consume_s {
    const unsigned char *data;
    size_t bytes;
    uint64_t index;
    gate_t *hold;      /* optional: hold the batch until opened */
    unsigned sleep_us; /* a slow consumer: sleeps before reading */
    atomic_uint *bad;  /* batches that did not hold their own data */
    atomic_uint *consumed;
} consume_t;

static void consume_fn(void *ud)
{
    consume_t *c = ud;
    if (c->hold != NULL)
        gate_fn(c->hold);
    if (c->sleep_us != 0)
        fx_sleep_us(c->sleep_us);
    for (size_t i = 0; i < c->bytes; i++) {
        if (c->data[i] != pattern(c->index, i)) {
            atomic_fetch_add(c->bad, 1);
            break;
        }
    }
    atomic_fetch_add(c->consumed, 1);
}

static void sleep_fn(void *ud)
{
    fx_sleep_us((unsigned)(uintptr_t)ud);
}

static mt_prefetch_t *make(fx_t *f, size_t bytes, unsigned depth, bool overlap)
{
    mt_prefetch_cfg_t pc = mt_prefetch_cfg_default();
    pc.alloc = f->a;
    pc.host = f->h;
    pc.compute = f->compute;
    pc.batch_bytes = bytes;
    pc.depth = depth;
    pc.overlap = overlap;
    mt_prefetch_t *p = NULL;
    assert_int_equal(mt_prefetch_create(&p, &pc), 0);
    /* Poison the device buffers so an early read cannot pass for data. */
    for (unsigned i = 0; i < depth; i++) {
        mt_prefetch_batch_t b;
        assert_int_equal(mt_prefetch_submit_fill(p, bytes, fill_pattern, NULL), 0);
        assert_int_equal(mt_prefetch_next(p, &b), 0);
        assert_int_equal(mt_memset_async(f->b, b.data, POISON, bytes, f->compute), 0);
        assert_int_equal(mt_prefetch_release(p, &b), 0);
    }
    assert_int_equal(mt_stream_synchronize(f->b, f->compute), 0);
    return p;
}

/* Steady state with depth 2: copy k+1 is queued behind "released(k-1)", and compute k is
 * held until a marker queued on the copy stream after copy k+1 has run. If copies waited
 * for compute (no overlap), the gate would time out. Timestamps then show copy k+1 inside
 * the time batch k was held. */
static void test_overlap_while_batch_held(void **state)
{
    (void)state;
    fx_t f;
    fx_init(&f, 128 * MIB, 64 * MIB);
    const size_t bytes = 2 * MIB;
    const unsigned N = 6;
    mt_prefetch_t *p = make(&f, bytes, 2, true);
    mt_stream_t *cs = mt_prefetch_copy_stream(p);
    assert_non_null(cs);
    assert_ptr_not_equal(cs, f.compute);
    mt_backend_counters_t c0;
    mt_backend_counters(f.b, &c0);

    gate_t gates[8] = {0};
    consume_t cons[8];
    mt_event_t *held_begin[8], *held_end[8];
    atomic_uint bad = 0, consumed = 0;
    uint64_t base = 2; /* the two batches make() used */
    mt_prefetch_batch_t b;
    for (unsigned k = 0; k < 2; k++)
        assert_int_equal(mt_prefetch_submit_fill(p, bytes, fill_pattern, NULL), 0);
    /* Opens the gate of batch 0 once copy 1 has run. */
    assert_int_equal(mt_stream_launch_host_func(f.b, cs, gate_open_fn, &gates[0]), 0);
    for (unsigned k = 0; k < N; k++) {
        assert_int_equal(mt_event_create(f.b, &held_begin[k]), 0);
        assert_int_equal(mt_event_create(f.b, &held_end[k]), 0);
        assert_int_equal(mt_prefetch_next(p, &b), 0);
        assert_int_equal(b.index, base + k);
        cons[k] = (consume_t){b.data, bytes, b.index, &gates[k], 0, &bad, &consumed};
        assert_int_equal(mt_event_record(f.b, held_begin[k], f.compute), 0);
        assert_int_equal(mt_stream_launch_host_func(f.b, f.compute, consume_fn, &cons[k]), 0);
        assert_int_equal(mt_event_record(f.b, held_end[k], f.compute), 0);
        assert_int_equal(mt_prefetch_release(p, &b), 0);
        if (k + 2 < N + 1) {
            /* Copy k+2 goes into batch k's buffer: it must wait for the release above. */
            assert_int_equal(mt_prefetch_submit_fill(p, bytes, fill_pattern, NULL), 0);
            assert_int_equal(mt_stream_launch_host_func(f.b, cs, gate_open_fn, &gates[k + 1]), 0);
        } else {
            atomic_store(&gates[k + 1].open, true);
        }
    }
    assert_int_equal(mt_stream_synchronize(f.b, f.compute), 0);
    assert_int_equal(atomic_load(&consumed), N);
    assert_int_equal(atomic_load(&bad), 0);
    for (unsigned k = 0; k < N; k++)
        assert_false(atomic_load(&gates[k].timed_out));

    /* Copy k+1 ran inside [end of batch k-1, end of batch k]: while batch k was held. */
    unsigned proved = 0;
    for (unsigned k = 1; k + 1 < N; k++) {
        uint64_t s = 0, e = 0;
        int rc = mt_prefetch_copy_times(p, base + k + 1, &s, &e);
        if (rc == MT_ENOENT)
            continue; /* buffer already reused by a later batch */
        assert_int_equal(rc, 0);
        uint64_t prev_end = mt_event_time_ns(f.b, held_end[k - 1]);
        uint64_t hb = mt_event_time_ns(f.b, held_begin[k]);
        uint64_t he = mt_event_time_ns(f.b, held_end[k]);
        assert_true(prev_end > 0 && hb > 0 && he > 0 && s > 0 && e > 0);
        assert_true(s >= prev_end);
        assert_true(s <= e);
        assert_true(e <= he);
        proved++;
    }
    assert_true(proved >= 1);
    /* The host never synchronised the device or a stream to get there. */
    mt_backend_counters_t c1;
    mt_backend_counters(f.b, &c1);
    assert_int_equal(c1.device_syncs, c0.device_syncs);
    assert_int_equal(c1.stream_syncs, c0.stream_syncs + 1); /* the test's own, above */
    assert_int_equal(c1.event_syncs, c0.event_syncs);
    for (unsigned k = 0; k < N; k++) {
        mt_event_destroy(f.b, &held_begin[k]);
        mt_event_destroy(f.b, &held_end[k]);
    }
    mt_prefetch_destroy(&p);
    assert_null(p);
    fx_fini(&f);
}

/* Every copy is slowed by a sleep queued before it on the copy stream; after each batch the
 * consumer poisons its buffer. A batch read before its copy completed shows poison or the
 * previous batch's bytes. */
static void run_poisoned(unsigned depth, bool overlap, unsigned N, bool slow_consumer)
{
    fx_t f;
    fx_init(&f, 128 * MIB, 64 * MIB);
    const size_t bytes = 256 * 1024;
    mt_prefetch_t *p = make(&f, bytes, depth, overlap);
    mt_stream_t *cs = mt_prefetch_copy_stream(p);
    consume_t *cons = calloc(N, sizeof *cons);
    assert_non_null(cons);
    atomic_uint bad = 0, consumed = 0;
    unsigned submitted = 0;
    mt_prefetch_batch_t b;
    while (submitted < depth) {
        if (!slow_consumer)
            assert_int_equal(mt_stream_launch_host_func(f.b, cs, sleep_fn, (void *)(uintptr_t)2000),
                             0);
        assert_int_equal(mt_prefetch_submit_fill(p, bytes, fill_pattern, NULL), 0);
        submitted++;
    }
    /* All buffers hold unreleased batches: one more submission is refused. */
    assert_int_equal(mt_prefetch_submit_fill(p, bytes, fill_pattern, NULL), MT_EBUSY);
    for (unsigned k = 0; k < N; k++) {
        assert_int_equal(mt_prefetch_next(p, &b), 0);
        cons[k] =
            (consume_t){b.data, bytes, b.index, NULL, slow_consumer ? 2000 : 0, &bad, &consumed};
        assert_int_equal(mt_stream_launch_host_func(f.b, f.compute, consume_fn, &cons[k]), 0);
        assert_int_equal(mt_memset_async(f.b, b.data, POISON, bytes, f.compute), 0);
        assert_int_equal(mt_prefetch_release(p, &b), 0);
        if (submitted < N) {
            if (!slow_consumer)
                assert_int_equal(
                    mt_stream_launch_host_func(f.b, cs, sleep_fn, (void *)(uintptr_t)2000), 0);
            assert_int_equal(mt_prefetch_submit_fill(p, bytes, fill_pattern, NULL), 0);
            submitted++;
        }
    }
    assert_int_equal(mt_prefetch_next(p, &b), MT_ENOENT);
    assert_int_equal(mt_stream_synchronize(f.b, f.compute), 0);
    assert_int_equal(atomic_load(&consumed), N);
    assert_int_equal(atomic_load(&bad), 0);
    mt_prefetch_stats_t st;
    mt_prefetch_stats(p, &st);
    assert_int_equal(st.submitted, N + depth);
    assert_int_equal(st.consumed, N + depth);
    assert_int_equal(st.bytes_copied, (uint64_t)(N + depth) * bytes);
    mt_prefetch_destroy(&p);
    free(cons);
    fx_fini(&f);
}

static void test_poisoned_slow_copies_depth2(void **state)
{
    (void)state;
    run_poisoned(2, true, 12, false);
}

static void test_poisoned_slow_copies_depth3(void **state)
{
    (void)state;
    run_poisoned(3, true, 12, false);
}

/* A slow consumer and fast copies: a copy into a buffer whose batch is still being read
 * (the release event not waited for) would show the later batch's bytes. */
static void test_poisoned_slow_consumer(void **state)
{
    (void)state;
    run_poisoned(2, true, 10, true);
}

static void test_poisoned_serial_baseline(void **state)
{
    (void)state;
    run_poisoned(2, false, 6, false);
}

/* The host copy of a batch is staged: the caller's buffer may change right after submit. */
static void test_submit_copies_caller_buffer(void **state)
{
    (void)state;
    fx_t f;
    fx_init(&f, 64 * MIB, 64 * MIB);
    mt_prefetch_t *p = make(&f, 4096, 2, true);
    unsigned char src[4096];
    memset(src, 7, sizeof src);
    gate_t g = {0};
    assert_int_equal(mt_stream_launch_host_func(f.b, mt_prefetch_copy_stream(p), gate_fn, &g), 0);
    assert_int_equal(mt_prefetch_submit(p, src, 1000), 0);
    memset(src, 9, sizeof src); /* before the copy has run */
    atomic_store(&g.open, true);
    mt_prefetch_batch_t b;
    assert_int_equal(mt_prefetch_next(p, &b), 0);
    assert_int_equal(b.bytes, 1000);
    assert_int_equal(mt_stream_synchronize(f.b, f.compute), 0);
    for (size_t i = 0; i < 1000; i++)
        assert_int_equal(((unsigned char *)b.data)[i], 7);
    assert_int_equal(mt_prefetch_release(p, &b), 0);
    assert_int_equal(mt_prefetch_release(p, &b), MT_ENOENT);       /* twice */
    assert_int_equal(mt_prefetch_submit(p, src, 5000), MT_EINVAL); /* > batch_bytes */
    mt_prefetch_destroy(&p);
    fx_fini(&f);
}

/* A consumer on the calling thread (like the CPU path) waits for its batch's copy only. */
static void test_host_consumer_waits(void **state)
{
    (void)state;
    fx_t f;
    fx_init(&f, 64 * MIB, 64 * MIB);
    const size_t bytes = 64 * 1024;
    mt_prefetch_t *p = make(&f, bytes, 2, true);
    mt_stream_t *cs = mt_prefetch_copy_stream(p);
    unsigned bad = 0;
    for (unsigned k = 0; k < 6; k++) {
        assert_int_equal(mt_stream_launch_host_func(f.b, cs, sleep_fn, (void *)(uintptr_t)3000), 0);
        assert_int_equal(mt_prefetch_submit_fill(p, bytes, fill_pattern, NULL), 0);
        mt_prefetch_batch_t b;
        assert_int_equal(mt_prefetch_next(p, &b), 0);
        assert_int_equal(mt_prefetch_wait(p, &b), 0);
        const unsigned char *d = b.data;
        for (size_t i = 0; i < bytes; i++)
            bad += d[i] != pattern(b.index, i);
        memset(b.data, POISON, bytes); /* the host is the compute here */
        assert_int_equal(mt_prefetch_release(p, &b), 0);
        assert_int_equal(mt_prefetch_wait(p, &b), MT_ENOENT); /* released */
    }
    assert_int_equal(bad, 0);
    mt_prefetch_destroy(&p);
    fx_fini(&f);
}

/* Input and target of one batch are views into the same device buffer. */
static void test_slices_are_views(void **state)
{
    (void)state;
    fx_t f;
    fx_init(&f, 64 * MIB, 64 * MIB);
    mt_prefetch_t *p = make(&f, 8192, 2, true);
    mt_alloc_stats_t before, after;
    assert_int_equal(mt_alloc_stats(f.a, &before), 0);
    assert_int_equal(mt_prefetch_submit_fill(p, 8192, fill_pattern, NULL), 0);
    mt_prefetch_batch_t b;
    assert_int_equal(mt_prefetch_next(p, &b), 0);
    void *x = NULL, *y = NULL, *bad = NULL;
    assert_int_equal(mt_prefetch_slice(&b, 0, 4096, &x), 0);
    assert_int_equal(mt_prefetch_slice(&b, 4096, 4096, &y), 0);
    assert_ptr_equal(x, b.data);
    assert_ptr_equal(y, (char *)b.data + 4096);
    assert_int_equal(mt_prefetch_slice(&b, 4097, 4096, &bad), MT_EINVAL);
    assert_int_equal(mt_prefetch_slice(&b, SIZE_MAX, 2, &bad), MT_EINVAL);
    assert_null(bad);
    assert_int_equal(mt_alloc_stats(f.a, &after), 0);
    /* No device allocation per batch or per slice: only the buffers made at creation. */
    assert_int_equal(after.allocation[MT_STAT_ALL].allocated,
                     before.allocation[MT_STAT_ALL].allocated);
    assert_int_equal(after.tag_allocated_bytes[MT_TAG_BATCH].current, 2 * 8192);
    assert_int_equal(mt_prefetch_release(p, &b), 0);
    mt_prefetch_destroy(&p);
    fx_fini(&f);
}

static int fill_fails(void *ud, uint64_t index, void *dst, size_t bytes)
{
    (void)ud;
    (void)index;
    (void)dst;
    (void)bytes;
    return MT_EIO;
}

/* A failing fill queues nothing and gives the staging block back. */
static void test_fill_failure(void **state)
{
    (void)state;
    fx_t f;
    fx_init(&f, 64 * MIB, 64 * MIB);
    mt_prefetch_t *p = make(&f, 4096, 2, true);
    mt_prefetch_stats_t before, after;
    mt_prefetch_stats(p, &before);
    assert_int_equal(mt_prefetch_submit_fill(p, 4096, fill_fails, NULL), MT_EIO);
    mt_prefetch_stats(p, &after);
    assert_int_equal(after.submitted, before.submitted);
    mt_prefetch_batch_t b;
    assert_int_equal(mt_prefetch_next(p, &b), MT_ENOENT);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(mt_host_cache_alloc(f.h), &st), 0);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 0);
    /* The slot is still free for the next good submission. */
    assert_int_equal(mt_prefetch_submit_fill(p, 4096, fill_pattern, NULL), 0);
    assert_int_equal(mt_prefetch_next(p, &b), 0);
    assert_int_equal(b.index, before.submitted);
    assert_int_equal(mt_prefetch_release(p, &b), 0);
    mt_prefetch_destroy(&p);
    fx_fini(&f);
}

static void test_bad_config(void **state)
{
    (void)state;
    fx_t f;
    fx_init(&f, 64 * MIB, 64 * MIB);
    mt_prefetch_cfg_t pc = mt_prefetch_cfg_default();
    pc.alloc = f.a;
    pc.host = f.h;
    pc.batch_bytes = 100;
    pc.depth = 1;
    mt_prefetch_t *p = NULL;
    assert_int_equal(mt_prefetch_create(&p, &pc), MT_EINVAL);
    pc.depth = 2;
    pc.batch_bytes = 0;
    assert_int_equal(mt_prefetch_create(&p, &pc), MT_EINVAL);
    assert_null(p);
    fx_fini(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overlap_while_batch_held),
        cmocka_unit_test(test_poisoned_slow_copies_depth2),
        cmocka_unit_test(test_poisoned_slow_copies_depth3),
        cmocka_unit_test(test_poisoned_slow_consumer),
        cmocka_unit_test(test_poisoned_serial_baseline),
        cmocka_unit_test(test_submit_copies_caller_buffer),
        cmocka_unit_test(test_host_consumer_waits),
        cmocka_unit_test(test_slices_are_views),
        cmocka_unit_test(test_fill_failure),
        cmocka_unit_test(test_bad_config),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
