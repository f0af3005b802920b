/* The caching allocator on the cuda backend, against the fake driver: the driver calls
 * the allocator's policies turn into. Out of memory -> release the cache -> retry;
 * stream-ordered reuse through driver events; expandable segments as reserve + per-page
 * create/map + access, and unmap/release on empty_cache. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>

#include <cuda.h>

#include "backend/backend_cuda.h"
#include "memtrace/alloc.h"
#include "tests/cuda/fake_ctl.h"
#include "tests/common/test_main.h"

#define MiB ((size_t)1 << 20)

typedef struct fixture_s {
    mt_backend_t *b;
    mt_alloc_t *a;
} fixture_t;

static void make(fixture_t *f, bool expandable)
{
    fk.reset(64 * MiB, 1);
    mt_backend_cfg_t bcfg = mt_backend_cfg_default();
    bcfg.kind = MT_BACKEND_CUDA;
    assert_int_equal(mt_backend_create(&f->b, &bcfg), 0);
    mt_alloc_cfg_t acfg = mt_alloc_cfg_default();
    /* These tests follow the driver calls of the reference's rules, with or without
     * expandable segments; test_default_policy runs the default. */
    assert_int_equal(mt_alloc_cfg_parse(&acfg, "rules:reference", NULL, 0), 0);
    acfg.backend = f->b;
    acfg.expandable_segments = expandable;
    assert_int_equal(mt_alloc_create(&f->a, &acfg), 0);
    fk.reset(64 * MiB, 1); /* logs start here */
}

static void unmake(fixture_t *f)
{
    assert_int_equal(mt_alloc_check(f->a), 0);
    mt_alloc_destroy(&f->a);
    mt_backend_destroy(&f->b);
    assert_int_equal(fk.used(), 0); /* every driver allocation given back */
    assert_int_equal(fk.ctx_depth(), 0);
}

/* The device has less room than the allocator's limit says (another process holds
 * some): the driver answers out of memory, the allocator frees its cache and retries. */
static void test_driver_oom_release_cache_retry(void **state)
{
    (void)state;
    fixture_t f;
    make(&f, false);
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(f.b, &s2), 0);
    void *p = NULL, *q = NULL;
    assert_int_equal(mt_alloc_malloc(f.a, 40 * MiB, NULL, MT_TAG_OTHER, &p), 0);
    assert_int_equal(mt_alloc_free(f.a, p), 0);
    assert_int_equal(fk.count("cuMemFree_v2"), 0); /* cached, not returned */

    /* another stream cannot use the cached block: a new segment is needed */
    fk.fail_next("cuMemAlloc_v2", 1, CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(mt_alloc_malloc(f.a, 8 * MiB, s2, MT_TAG_OTHER, &q), 0);

    /* cuMemAlloc(40 MiB), cuMemAlloc -> OOM, cuMemFree(the cached segment), cuMemAlloc */
    uint64_t a = 0, sz = 0, sz2 = 0;
    size_t i1 = find_call("cuMemAlloc_v2", 0, NULL, &sz);
    assert_int_not_equal(i1, SIZE_MAX);
    assert_int_equal(sz, 40 * MiB);
    size_t i2 = find_call("cuMemAlloc_v2", i1 + 1, NULL, &sz);
    assert_int_not_equal(i2, SIZE_MAX);
    size_t i3 = find_call("cuMemFree_v2", i2 + 1, &a, NULL);
    assert_int_not_equal(i3, SIZE_MAX);
    assert_int_equal(a, (uintptr_t)p);
    size_t i4 = find_call("cuMemAlloc_v2", i3 + 1, NULL, &sz2);
    assert_int_not_equal(i4, SIZE_MAX);
    assert_int_equal(sz2, sz); /* the same segment size, retried */
    assert_true(sz2 >= 8 * MiB);

    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(f.a, &st), 0);
    assert_int_equal(st.num_alloc_retries, 1);
    assert_int_equal(st.num_ooms, 0);
    assert_int_equal(mt_alloc_free(f.a, q), 0);
    mt_stream_destroy(f.b, &s2);
    unmake(&f);
}

/* At the allocator's own limit, the cache is released before the device is asked, and
 * beyond the device even after that, the result is MT_ENOMEM with a report. */
static void test_limit_release_cache_then_oom(void **state)
{
    (void)state;
    fixture_t f;
    make(&f, false);
    void *p = NULL, *q = NULL;
    assert_int_equal(mt_alloc_malloc(f.a, 40 * MiB, NULL, MT_TAG_OTHER, &p), 0);
    assert_int_equal(mt_alloc_free(f.a, p), 0);
    assert_int_equal(mt_alloc_malloc(f.a, 50 * MiB, NULL, MT_TAG_OTHER, &q), 0);
    uint64_t a = 0, sz = 0;
    size_t i1 = find_call("cuMemFree_v2", 0, &a, NULL);
    assert_int_not_equal(i1, SIZE_MAX);
    assert_int_equal(a, (uintptr_t)p);
    assert_int_not_equal(find_call("cuMemAlloc_v2", i1 + 1, NULL, &sz), SIZE_MAX);
    assert_int_equal(sz, 50 * MiB);
    assert_true(fk.used() <= 64 * MiB);

    void *r = NULL;
    assert_int_equal(mt_alloc_malloc(f.a, 30 * MiB, NULL, MT_TAG_OTHER, &r), MT_ENOMEM);
    assert_non_null(strstr(mt_alloc_last_error(f.a), "30.00 MiB"));
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(f.a, &st), 0);
    assert_int_equal(st.num_ooms, 1);
    assert_int_equal(mt_alloc_free(f.a, q), 0);
    unmake(&f);
}

/* A driver failure other than memory is reported as itself, not as an OOM, and the
 * allocator stays usable afterwards. */
static void test_driver_error_reported(void **state)
{
    (void)state;
    fixture_t f;
    make(&f, false);
    void *p = NULL;
    fk.fail_next("cuMemAlloc_v2", 1, CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_not_equal(mt_alloc_malloc(f.a, 4 * MiB, NULL, MT_TAG_OTHER, &p), 0);
    assert_null(p);
    /* Not memory: no out-of-memory steps (no retry, no OOM counted). */
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(f.a, &st), 0);
    assert_int_equal(st.num_ooms, 0);
    assert_int_equal(st.num_alloc_retries, 0);
    assert_int_equal(mt_alloc_malloc(f.a, 4 * MiB, NULL, MT_TAG_OTHER, &p), 0);
    assert_non_null(p);
    assert_int_equal(mt_alloc_free(f.a, p), 0);
    unmake(&f);
}

/* A block used on a second stream returns to the pool only when the driver says the
 * event recorded at free has completed. */
static void test_stream_events_gate_reuse(void **state)
{
    (void)state;
    fixture_t f;
    make(&f, false);
    mt_stream_t *s1 = NULL, *s2 = NULL;
    assert_int_equal(mt_stream_create(f.b, &s1), 0);
    assert_int_equal(mt_stream_create(f.b, &s2), 0);
    void *p = NULL, *q = NULL;
    assert_int_equal(mt_alloc_malloc(f.a, MiB, s1, MT_TAG_OTHER, &p), 0);
    assert_int_equal(mt_alloc_record_stream(f.a, p, s2), 0);

    fk.hold(true); /* s2's work (and the event after it) stays pending */
    assert_int_equal(mt_alloc_free(f.a, p), 0);
    assert_true(fk.count("cuEventRecord") >= 1);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(f.a, &st), 0);
    assert_true(st.active_bytes[MT_STAT_ALL].current > st.allocated_bytes[MT_STAT_ALL].current);
    assert_int_equal(mt_alloc_malloc(f.a, MiB, s1, MT_TAG_OTHER, &q), 0);
    assert_ptr_not_equal(q, p); /* pending: not reusable yet */
    assert_true(fk.count("cuEventQuery") >= 1);
    assert_int_equal(mt_alloc_free(f.a, q), 0);

    fk.hold(false); /* the event completes, on s2's own thread */
    fk.idle();
    void *r = NULL;
    assert_int_equal(mt_alloc_malloc(f.a, MiB, s1, MT_TAG_OTHER, &r), 0);
    assert_int_equal(mt_alloc_stats(f.a, &st), 0);
    assert_int_equal(st.active_bytes[MT_STAT_ALL].current, st.allocated_bytes[MT_STAT_ALL].current);
    assert_int_equal(mt_alloc_free(f.a, r), 0);
    assert_int_equal(fk.count("cuMemAlloc_v2"), 1); /* all of it from one segment */
    mt_stream_destroy(f.b, &s2);
    mt_stream_destroy(f.b, &s1);
    unmake(&f);
}

/* Expandable segments: one reservation, then per-page cuMemCreate + cuMemMap and a
 * cuMemSetAccess for each mapped range; empty_cache unmaps and releases every page. */
static void test_expandable_segments_mapping(void **state)
{
    (void)state;
    fixture_t f;
    make(&f, true);
    void *p = NULL, *q = NULL;
    assert_int_equal(mt_alloc_malloc(f.a, 3 * MiB, NULL, MT_TAG_OTHER, &p), 0);
    memset(fk.shadow(p), 0x11, 3 * MiB); /* mapped: its bytes exist */
    assert_int_equal(fk.count("cuMemAlloc_v2"), 0);
    assert_int_equal(fk.count("cuMemAddressReserve"), 1);
    uint64_t base = 0, vsize = 0;
    size_t ir = find_call("cuMemAddressReserve", 0, NULL, &vsize);
    assert_true(vsize >= 3 * MiB);
    size_t creates = fk.count("cuMemCreate");
    assert_true(creates >= 2);
    assert_int_equal(fk.count("cuMemMap"), creates);
    /* the pages are mapped in address order from the start of the range */
    uint64_t a = 0, sz = 0;
    size_t im = find_call("cuMemMap", ir, &base, &sz);
    assert_int_equal(sz, 2 * MiB);
    assert_int_equal((uintptr_t)p, base);
    for (size_t k = 1, i = im; k < creates; k++) {
        i = find_call("cuMemMap", i + 1, &a, &sz);
        assert_int_equal(a, base + k * 2 * MiB);
        assert_int_equal(sz, 2 * MiB);
    }
    assert_int_not_equal(find_call("cuMemSetAccess", im, &a, &sz), SIZE_MAX);
    assert_int_equal(a, base);

    /* growing: more pages at the end of the same range, no new reservation */
    assert_int_equal(mt_alloc_malloc(f.a, 30 * MiB, NULL, MT_TAG_OTHER, &q), 0);
    memset(fk.shadow(q), 0x22, 30 * MiB);
    assert_int_equal(fk.count("cuMemAddressReserve"), 1);
    assert_true(fk.count("cuMemCreate") > creates);
    assert_int_equal(fk.used() % (2 * MiB), 0);

    assert_int_equal(mt_alloc_free(f.a, q), 0);
    assert_int_equal(mt_alloc_free(f.a, p), 0);
    assert_int_equal(mt_alloc_empty_cache(f.a), 0);
    assert_int_equal(fk.count("cuMemUnmap"), fk.count("cuMemCreate"));
    assert_int_equal(fk.count("cuMemRelease"), fk.count("cuMemCreate"));
    assert_int_equal(fk.used(), 0);
    unmake(&f);
    assert_int_equal(fk.count("cuMemAddressFree"), 1);
}

/* Expandable segments under pressure: a map that fails for lack of memory is undone. */
static void test_expandable_oom(void **state)
{
    (void)state;
    fixture_t f;
    make(&f, true);
    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(f.a, 80 * MiB, NULL, MT_TAG_OTHER, &p), MT_ENOMEM);
    assert_int_equal(fk.used(), 0);
    assert_int_equal(fk.count("cuMemCreate"), fk.count("cuMemRelease"));
    assert_int_equal(mt_alloc_malloc(f.a, 8 * MiB, NULL, MT_TAG_OTHER, &p), 0);
    assert_int_equal(mt_alloc_free(f.a, p), 0);
    unmake(&f);
}

/* The default config (expandable segments, release_to_fit, one_pool, place_high) under
 * the fake's strict VMM: pages are created, mapped and made accessible before use, small
 * and large blocks share the range, a block freed on a second stream waits for its event,
 * and empty_cache and destroy give every page and the range back. */
static void test_default_policy(void **state)
{
    (void)state;
    fk.reset(128 * MiB, 1);
    mt_backend_cfg_t bcfg = mt_backend_cfg_default();
    bcfg.kind = MT_BACKEND_CUDA;
    fixture_t f;
    assert_int_equal(mt_backend_create(&f.b, &bcfg), 0);
    mt_alloc_cfg_t acfg = mt_alloc_cfg_default();
    acfg.backend = f.b;
    assert_int_equal(mt_alloc_create(&f.a, &acfg), 0);
    fk.reset(128 * MiB, 1);
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(f.b, &s2), 0);
    void *big = NULL, *small = NULL, *huge = NULL, *again = NULL;
    assert_int_equal(mt_alloc_malloc(f.a, 3 * MiB, NULL, MT_TAG_OTHER, &big), 0);
    assert_int_equal(mt_alloc_malloc(f.a, 1000, NULL, MT_TAG_OTHER, &small), 0);
    assert_int_equal(mt_alloc_malloc(f.a, 40 * MiB, NULL, MT_TAG_OTHER, &huge), 0);
    memset(fk.shadow(big), 0x11, 3 * MiB); /* the fake faults on unmapped pages */
    memset(fk.shadow(small), 0x22, 1000);
    memset(fk.shadow(huge), 0x33, 40 * MiB);
    assert_int_equal(fk.count("cuMemAlloc_v2"), 0);
    assert_int_equal(fk.count("cuMemAddressReserve"), 1); /* one range: one_pool */
    assert_true(fk.count("cuMemCreate") > 0);
    assert_int_equal((char *)small, (char *)big + 3 * MiB);
    assert_int_equal(fk.used(), 44 * MiB);
    assert_int_equal(mt_alloc_check(f.a), 0);

    /* stream-ordered reuse: used on s2, the block waits for s2's event */
    assert_int_equal(mt_alloc_record_stream(f.a, huge, s2), 0);
    fk.hold(true);
    assert_int_equal(mt_alloc_free(f.a, huge), 0);
    assert_int_equal(mt_alloc_malloc(f.a, 40 * MiB, NULL, MT_TAG_OTHER, &again), 0);
    assert_true(again != huge);
    fk.hold(false);
    assert_int_equal(mt_alloc_free(f.a, again), 0);
    assert_int_equal(mt_alloc_free(f.a, small), 0);
    assert_int_equal(mt_alloc_free(f.a, big), 0);
    assert_int_equal(mt_alloc_empty_cache(f.a), 0);
    assert_int_equal(fk.used(), 0);
    assert_int_equal(fk.count("cuMemUnmap"), fk.count("cuMemCreate"));
    assert_int_equal(fk.count("cuMemRelease"), fk.count("cuMemCreate"));
    mt_stream_destroy(f.b, &s2);
    unmake(&f);
    assert_int_equal(fk.count("cuMemAddressFree"), 1);
}

/* A block used on a stream being captured, then freed: the event recorded for that use is
 * a node of the graph, which the driver refuses to query and which every replay passes.
 * The allocator cannot see the graph's lifetime, so the block must never be reused. */
static void test_event_in_capture_keeps_block(void **state)
{
    (void)state;
    fixture_t f;
    make(&f, false);
    CUresult (*retain)(CUcontext *, CUdevice) = dlsym(fk.lib, "cuDevicePrimaryCtxRetain");
    CUresult (*push)(CUcontext) = dlsym(fk.lib, "cuCtxPushCurrent_v2");
    CUresult (*pop)(CUcontext *) = dlsym(fk.lib, "cuCtxPopCurrent_v2");
    CUresult (*begin)(CUstream, CUstreamCaptureMode) = dlsym(fk.lib, "cuStreamBeginCapture_v2");
    CUresult (*end)(CUstream, CUgraph *) = dlsym(fk.lib, "cuStreamEndCapture");
    CUresult (*gdestroy)(CUgraph) = dlsym(fk.lib, "cuGraphDestroy");
    assert_true(retain && push && pop && begin && end && gdestroy);
    mt_stream_t *s1 = NULL, *s2 = NULL;
    assert_int_equal(mt_stream_create(f.b, &s1), 0);
    assert_int_equal(mt_stream_create(f.b, &s2), 0);
    CUstream h2 = (CUstream)mt__cuda_stream_handle(s2);
    void *p = NULL, *q = NULL;
    assert_int_equal(mt_alloc_malloc(f.a, 4 * MiB, s1, MT_TAG_OTHER, &p), 0);
    CUcontext c = NULL, popped = NULL;
    assert_int_equal(retain(&c, 0), CUDA_SUCCESS);
    assert_int_equal(push(c), CUDA_SUCCESS);
    assert_int_equal(begin(h2, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    assert_int_equal(mt_alloc_record_stream(f.a, p, s2), 0);
    assert_int_equal(mt_alloc_free(f.a, p), 0); /* its event goes into the graph */
    CUgraph g = NULL;
    assert_int_equal(end(h2, &g), CUDA_SUCCESS);
    assert_int_equal(gdestroy(g), CUDA_SUCCESS);
    assert_int_equal(pop(&popped), CUDA_SUCCESS);
    assert_int_equal(mt_alloc_malloc(f.a, 4 * MiB, s1, MT_TAG_OTHER, &q), 0);
    assert_ptr_not_equal(q, p);
    assert_int_equal(mt_alloc_free(f.a, q), 0);
    mt_stream_destroy(f.b, &s1);
    mt_stream_destroy(f.b, &s2);
    unmake(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_driver_oom_release_cache_retry),
        cmocka_unit_test(test_limit_release_cache_then_oom),
        cmocka_unit_test(test_driver_error_reported),
        cmocka_unit_test(test_stream_events_gate_reuse),
        cmocka_unit_test(test_expandable_segments_mapping),
        cmocka_unit_test(test_expandable_oom),
        cmocka_unit_test(test_default_policy),
        cmocka_unit_test(test_event_in_capture_keeps_block),
    };
    return MT_TEST_RUN(tests, fake_ctl_open, fake_ctl_close);
}
