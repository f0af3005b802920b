/* The pinned host cache: pinned memory through the caching allocator, the stream
 * discipline for blocks the CPU writes, the pinning limit, and events labelled pool host. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "host_fixture.h"
#include "tests/common/test_main.h"

static void test_malloc_free_caches(void **state)
{
    (void)state;
    fx_t f;
    fx_init(&f, 64 * MIB, 64 * MIB);
    void *p = NULL, *q = NULL;
    assert_int_equal(mt_host_malloc(f.h, 100000, MT_TAG_BATCH, &p), 0);
    assert_non_null(p);
    /* Pinned host memory is not device memory, and the CPU may write it at once. */
    assert_false(mt_backend_is_device_ptr(f.b, p));
    memset(p, 0x5a, 100000);
    size_t pinned = mt_host_cache_pinned_bytes(f.h);
    assert_true(pinned >= 100000);
    assert_int_equal(mt_host_free(f.h, p), 0);
    /* No stream used it: the block is reused at once, without a new pinned segment. */
    assert_int_equal(mt_host_malloc(f.h, 100000, MT_TAG_BATCH, &q), 0);
    assert_ptr_equal(p, q);
    assert_int_equal(mt_host_cache_pinned_bytes(f.h), pinned);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(mt_host_cache_alloc(f.h), &st), 0);
    assert_int_equal(st.tag_allocated_bytes[MT_TAG_BATCH].current, 100352); /* 512-rounded */
    assert_int_equal(st.num_device_alloc, 1);
    assert_int_equal(mt_host_free(f.h, q), 0);
    assert_int_equal(mt_host_free(f.h, (char *)q + 512), MT_ENOENT);
    fx_fini(&f);
}

/* A pinned block freed while a copy reading it is still queued must not be handed out
 * again until that copy ran: otherwise the CPU would overwrite the data in flight. */
static void test_block_not_reused_before_copy(void **state)
{
    (void)state;
    fx_t f;
    fx_init(&f, 64 * MIB, 64 * MIB);
    const size_t n = 256 * 1024;
    void *dev = NULL;
    assert_int_equal(mt_alloc_malloc(f.a, n, f.compute, MT_TAG_BATCH, &dev), 0);
    unsigned char *p = NULL;
    assert_int_equal(mt_host_malloc(f.h, n, MT_TAG_BATCH, (void **)&p), 0);
    memset(p, 0x11, n);

    gate_t g = {0};
    assert_int_equal(mt_stream_launch_host_func(f.b, f.compute, gate_fn, &g), 0);
    assert_int_equal(mt_memcpy_async(f.b, dev, p, n, MT_MEMCPY_HOST_TO_DEVICE, f.compute), 0);
    assert_int_equal(mt_host_record_stream(f.h, p, f.compute), 0);
    assert_int_equal(mt_host_free(f.h, p), 0);

    /* The copy is still held behind the gate: the same size must get another block. */
    unsigned char *q = NULL;
    assert_int_equal(mt_host_malloc(f.h, n, MT_TAG_BATCH, (void **)&q), 0);
    assert_ptr_not_equal(p, q);
    memset(q, 0x22, n);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(mt_host_cache_alloc(f.h), &st), 0);
    assert_true(st.active_bytes[MT_STAT_ALL].current > st.allocated_bytes[MT_STAT_ALL].current);

    atomic_store(&g.open, true);
    assert_int_equal(mt_stream_synchronize(f.b, f.compute), 0);
    assert_false(atomic_load(&g.timed_out));
    /* The copy saw the data of the time it was queued. */
    for (size_t i = 0; i < n; i++)
        if (((unsigned char *)dev)[i] != 0x11)
            fail_msg("device byte %zu is %#x, copy read overwritten staging", i,
                     ((unsigned char *)dev)[i]);
    /* Once the copy has run, the block comes back. */
    unsigned char *r = NULL;
    assert_int_equal(mt_host_malloc(f.h, n, MT_TAG_BATCH, (void **)&r), 0);
    assert_ptr_equal(r, p);
    assert_int_equal(mt_host_free(f.h, r), 0);
    assert_int_equal(mt_host_free(f.h, q), 0);
    assert_int_equal(mt_alloc_free(f.a, dev), 0);
    fx_fini(&f);
}

static void test_capacity_limit(void **state)
{
    (void)state;
    fx_t f;
    fx_init(&f, 64 * MIB, 4 * MIB);
    void *p = NULL;
    assert_int_equal(mt_host_malloc(f.h, 8 * MIB, MT_TAG_OTHER, &p), MT_ENOMEM);
    assert_null(p);
    assert_int_equal(mt_host_malloc(f.h, MIB, MT_TAG_OTHER, &p), 0);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(mt_host_cache_alloc(f.h), &st), 0);
    assert_int_equal(st.capacity, 4 * MIB);
    assert_int_equal(st.num_ooms, 1);
    assert_int_equal(mt_host_free(f.h, p), 0);
    fx_fini(&f);
}

typedef struct capture_s {
    mt_event_rec_t ev[64];
    unsigned n;
} capture_t;

static void capture_emit(void *ud, const mt_event_rec_t *ev)
{
    capture_t *c = ud;
    if (c->n < 64)
        c->ev[c->n++] = *ev;
}

static void test_events_say_pool_host(void **state)
{
    (void)state;
    fx_t f;
    fx_init(&f, 64 * MIB, 64 * MIB);
    capture_t cap = {.n = 0};
    mt_event_sink_t sink = {.emit = capture_emit, .ud = &cap};
    mt_host_cfg_t hc = mt_host_cfg_default();
    hc.backend = f.b;
    hc.capacity = 16 * MIB;
    hc.sink = &sink;
    mt_host_cache_t *h = NULL;
    assert_int_equal(mt_host_cache_create(&h, &hc), 0);
    void *p = NULL;
    assert_int_equal(mt_host_malloc(h, 3000, MT_TAG_BATCH, &p), 0);
    assert_int_equal(mt_host_free(h, p), 0);
    mt_host_cache_destroy(&h);
    assert_null(h);
    bool seen_alloc = false, seen_seg = false;
    assert_true(cap.n >= 4);
    for (unsigned i = 0; i < cap.n; i++) {
        assert_int_equal(cap.ev[i].pool, MT_POOL_HOST);
        if (cap.ev[i].kind == MT_EV_ALLOC) {
            seen_alloc = true;
            assert_int_equal(cap.ev[i].addr, (uint64_t)(uintptr_t)p);
            assert_int_equal(cap.ev[i].requested, 3000);
            assert_int_equal(cap.ev[i].tag, MT_TAG_BATCH);
        }
        seen_seg |= cap.ev[i].kind == MT_EV_SEGMENT_ALLOC;
    }
    assert_true(seen_alloc);
    assert_true(seen_seg);
    fx_fini(&f);
}

static void test_bad_args(void **state)
{
    (void)state;
    mt_host_cache_t *h = NULL;
    mt_host_cfg_t hc = mt_host_cfg_default();
    assert_int_equal(mt_host_cache_create(&h, &hc), MT_EINVAL); /* no backend */
    assert_int_equal(mt_host_cache_create(NULL, &hc), MT_EINVAL);
    void *p = NULL;
    assert_int_equal(mt_host_malloc(NULL, 10, 0, &p), MT_EINVAL);
    mt_host_cache_destroy(&h);
    mt_host_cache_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malloc_free_caches),
        cmocka_unit_test(test_block_not_reused_before_copy),
        cmocka_unit_test(test_capacity_limit),
        cmocka_unit_test(test_events_say_pool_host),
        cmocka_unit_test(test_bad_args),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
