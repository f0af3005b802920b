/* Managed memory on the sim backend: pages that migrate on access, prefetches on streams,
 * eviction when the device is oversubscribed, and what advice changes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <string.h>

#include <cmocka.h>

#include "sim_fixture.h"
#include "tests/common/test_main.h"

#define PAGE (2 * MIB)

static void wait_go(void *ud)
{
    while (atomic_load((atomic_int *)ud) == 0) {
    }
}

static mt_managed_stats_t mstats(mt_backend_t *b)
{
    mt_managed_stats_t st;
    assert_int_equal(mt_backend_managed_stats(b, &st), 0);
    assert_int_equal(mt__sim_check(b), 0);
    return st;
}

static void test_alloc_is_device_reachable(void **state)
{
    (void)state;
    mt_backend_t *b = sim_new(64 * MIB);
    void *p = NULL;
    assert_int_equal(mt_backend_managed_malloc(b, 3 * MIB, &p), 0);
    assert_int_equal((uintptr_t)p % PAGE, 0);
    assert_true(mt_backend_is_managed(b, p, 3 * MIB));
    assert_true(mt_backend_is_managed(b, (char *)p + MIB, 3 * MIB)); /* whole pages accounted */
    assert_false(mt_backend_is_managed(b, p, 4 * MIB + 1));
    assert_true(mt_backend_is_device_ptr(b, p));
    mt_managed_stats_t st = mstats(b);
    assert_int_equal(st.managed_bytes, 2 * PAGE);
    assert_int_equal(st.device_bytes, 0); /* nothing touched: nothing resident */
    /* Host memory is readable and writable from the host, and memset takes it as device
     * memory (cudaMemsetAsync on managed memory is legal). */
    memset(p, 7, 3 * MIB);
    assert_int_equal(mt_memset_async(b, p, 1, MIB, NULL), 0);
    assert_int_equal(mt_stream_synchronize(b, NULL), 0);
    assert_int_equal(((unsigned char *)p)[0], 1);
    assert_int_equal(((unsigned char *)p)[MIB], 7);
    void *q = NULL;
    assert_int_equal(mt_backend_managed_free(b, (char *)p + 512), MT_ENOENT);
    assert_int_equal(mt_backend_managed_free(b, p), 0);
    assert_int_equal(mt_backend_managed_free(b, p), MT_ENOENT);
    assert_false(mt_backend_is_managed(b, p, 1));
    assert_int_equal(mt_backend_managed_malloc(b, 0, &q), MT_EINVAL);
    st = mstats(b);
    assert_int_equal(st.managed_bytes, 0);
    assert_int_equal(st.device_bytes, 0);
    assert_int_equal(st.host_bytes, 0);
    mt_backend_destroy(&b);
}

static void test_migration_on_access(void **state)
{
    (void)state;
    mt_backend_t *b = sim_new(64 * MIB);
    void *p = NULL;
    assert_int_equal(mt_backend_managed_malloc(b, 4 * PAGE, &p), 0);
    /* The host writes everything: first touch places the pages on the host. */
    assert_int_equal(mt__sim_managed_access(b, p, 4 * PAGE, MT_MANAGED_HOST, true), 0);
    mt_managed_stats_t st = mstats(b);
    assert_int_equal(st.host_bytes, 4 * PAGE);
    assert_int_equal(st.bytes_to_device, 0);
    uint64_t faults0 = st.faults;
    /* A kernel reads two pages: two faults, two pages migrate. */
    assert_int_equal(mt__sim_managed_access(b, p, 2 * PAGE, 0, false), 0);
    st = mstats(b);
    assert_int_equal(st.faults, faults0 + 2);
    assert_int_equal(st.bytes_to_device, 2 * PAGE);
    assert_int_equal(st.device_bytes, 2 * PAGE);
    assert_int_equal(st.host_bytes, 2 * PAGE);
    /* Again: resident, no fault. */
    assert_int_equal(mt__sim_managed_access(b, p, 2 * PAGE, 0, false), 0);
    assert_int_equal(mstats(b).faults, faults0 + 2);
    /* The device residency is taken from the device's free memory. */
    size_t fr, tot;
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(fr, tot - 2 * PAGE);
    /* The host reads one back: it migrates home. */
    assert_int_equal(mt__sim_managed_access(b, p, 1, MT_MANAGED_HOST, false), 0);
    st = mstats(b);
    assert_int_equal(st.bytes_to_host, PAGE);
    assert_int_equal(st.faults, faults0 + 3);
    assert_int_equal(st.device_bytes, PAGE);
    assert_int_equal(st.peak_device_bytes, 2 * PAGE);
    assert_true(st.migrate_ns > 0);
    /* A copy on a stream is a device access too, taken when the stream runs it. */
    char buf[64];
    assert_int_equal(
        mt_memcpy_async(b, buf, (char *)p + 3 * PAGE, sizeof buf, MT_MEMCPY_DEVICE_TO_HOST, NULL),
        0);
    assert_int_equal(mt_stream_synchronize(b, NULL), 0);
    st = mstats(b);
    assert_int_equal(st.device_bytes, 2 * PAGE);
    assert_int_equal(st.faults, faults0 + 4); /* 2 to the device, 1 home, 1 by the copy */
    assert_int_equal(mt__sim_managed_access(b, buf, 1, MT_MANAGED_HOST, false), MT_EINVAL);
    assert_int_equal(mt_backend_managed_free(b, p), 0);
    mt_backend_destroy(&b);
}

static void test_prefetch_on_stream(void **state)
{
    (void)state;
    mt_backend_t *b = sim_new(64 * MIB);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    void *p = NULL;
    assert_int_equal(mt_backend_managed_malloc(b, 4 * PAGE, &p), 0);
    assert_int_equal(mt__sim_managed_access(b, p, 4 * PAGE, MT_MANAGED_HOST, true), 0);
    uint64_t faults0 = mstats(b).faults;
    /* Nothing moves until the stream gets there: hold it in a host function. */
    atomic_int go = 0;
    assert_int_equal(mt_stream_launch_host_func(b, s, wait_go, &go), 0);
    assert_int_equal(mt_backend_managed_prefetch(b, p, 4 * PAGE, 0, s), 0);
    assert_int_equal(mstats(b).device_bytes, 0);
    atomic_store(&go, 1);
    assert_int_equal(mt_stream_synchronize(b, s), 0);
    mt_managed_stats_t st = mstats(b);
    assert_int_equal(st.prefetches, 1);
    assert_int_equal(st.prefetch_bytes, 4 * PAGE);
    assert_int_equal(st.device_bytes, 4 * PAGE);
    assert_int_equal(st.bytes_to_device, 4 * PAGE);
    assert_int_equal(st.faults, faults0); /* a prefetch is not a fault */
    /* The kernel after it finds everything resident. */
    assert_int_equal(mt_memset_async(b, p, 0, 4 * PAGE, s), 0);
    assert_int_equal(mt_stream_synchronize(b, s), 0);
    assert_int_equal(mstats(b).faults, faults0);
    /* And back to the host. */
    assert_int_equal(mt_backend_managed_prefetch(b, p, 4 * PAGE, MT_MANAGED_HOST, s), 0);
    assert_int_equal(mt_stream_synchronize(b, s), 0);
    st = mstats(b);
    assert_int_equal(st.device_bytes, 0);
    assert_int_equal(st.bytes_to_host, 4 * PAGE);
    /* Ranges outside managed memory and locations outside the group are refused. */
    void *seg = NULL;
    assert_int_equal(mt_backend_malloc(b, PAGE, &seg), 0);
    assert_int_equal(mt_backend_managed_prefetch(b, seg, PAGE, 0, s), MT_EINVAL);
    assert_int_equal(mt_backend_managed_prefetch(b, p, 4 * PAGE + 1, 0, s), MT_EINVAL);
    assert_int_equal(mt_backend_managed_prefetch(b, p, PAGE, 3, s), MT_EINVAL);
    assert_int_equal(mt_backend_managed_prefetch(b, p, 0, 0, s), MT_EINVAL);
    assert_int_equal(mt_backend_free(b, seg), 0);
    mt_stream_destroy(b, &s);
    assert_int_equal(mt_backend_managed_free(b, p), 0);
    mt_backend_destroy(&b);
}

static void test_oversubscription_evicts_lru(void **state)
{
    (void)state;
    mt_backend_t *b = sim_new(4 * PAGE); /* room for four pages */
    void *p = NULL;
    assert_int_equal(mt_backend_managed_malloc(b, 6 * PAGE, &p), 0); /* more than fits */
    char *c = p;
    assert_int_equal(mt__sim_managed_access(b, c, 6 * PAGE, MT_MANAGED_HOST, true), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(mt__sim_managed_access(b, c + (size_t)i * PAGE, 1, 0, false), 0);
    mt_managed_stats_t st = mstats(b);
    assert_int_equal(st.device_bytes, 4 * PAGE);
    assert_int_equal(st.evicted_bytes, 0);
    /* Page 0 is used again, so page 1 is now the least recently used. */
    assert_int_equal(mt__sim_managed_access(b, c, 1, 0, false), 0);
    assert_int_equal(mt__sim_managed_access(b, c + 4 * PAGE, 1, 0, false), 0);
    st = mstats(b);
    assert_int_equal(st.device_bytes, 4 * PAGE);
    assert_int_equal(st.evicted_bytes, PAGE);
    uint64_t f = st.faults;
    assert_int_equal(mt__sim_managed_access(b, c, 1, 0, false), 0); /* page 0 stayed */
    assert_int_equal(mstats(b).faults, f);
    assert_int_equal(mt__sim_managed_access(b, c + PAGE, 1, 0, false), 0); /* page 1 went */
    assert_int_equal(mstats(b).faults, f + 1);
    /* A device malloc pushes managed pages out rather than failing. */
    void *seg = NULL;
    assert_int_equal(mt_backend_malloc(b, 2 * PAGE, &seg), 0);
    st = mstats(b);
    assert_int_equal(st.device_bytes, 2 * PAGE);
    assert_int_equal(st.evicted_bytes, 4 * PAGE);
    /* With the device all segments, an access is served remotely. */
    void *seg2 = NULL;
    assert_int_equal(mt_backend_malloc(b, 2 * PAGE, &seg2), 0);
    assert_int_equal(mstats(b).device_bytes, 0);
    uint64_t remote = mstats(b).remote_accesses;
    assert_int_equal(mt__sim_managed_access(b, c + 5 * PAGE, 1, 0, false), 0);
    st = mstats(b);
    assert_int_equal(st.device_bytes, 0);
    assert_int_equal(st.remote_accesses, remote + 1);
    assert_int_equal(mt_backend_free(b, seg), 0);
    assert_int_equal(mt_backend_free(b, seg2), 0);
    assert_int_equal(mt_backend_managed_free(b, p), 0);
    mt_backend_destroy(&b);
}

static void test_advice(void **state)
{
    (void)state;
    mt_backend_t *b = sim_new(64 * MIB);
    void *p = NULL;
    assert_int_equal(mt_backend_managed_malloc(b, 3 * PAGE, &p), 0);
    char *c = p;
    assert_int_equal(mt__sim_managed_access(b, c, 3 * PAGE, MT_MANAGED_HOST, true), 0);
    /* Preferred on the host: the device maps page 0 instead of migrating it. */
    assert_int_equal(
        mt_backend_managed_advise(b, c, PAGE, MT_ADVISE_SET_PREFERRED_LOCATION, MT_MANAGED_HOST),
        0);
    mt_managed_stats_t st0 = mstats(b);
    assert_int_equal(mt__sim_managed_access(b, c, PAGE, 0, false), 0);
    mt_managed_stats_t st = mstats(b);
    assert_int_equal(st.faults, st0.faults);
    assert_int_equal(st.device_bytes, 0);
    assert_int_equal(st.remote_accesses, st0.remote_accesses + 1);
    /* Unset, it migrates. */
    assert_int_equal(
        mt_backend_managed_advise(b, c, PAGE, MT_ADVISE_UNSET_PREFERRED_LOCATION, MT_MANAGED_HOST),
        0);
    assert_int_equal(mt__sim_managed_access(b, c, PAGE, 0, false), 0);
    assert_int_equal(mstats(b).device_bytes, PAGE);
    /* Read-mostly: a device read makes a copy, the host keeps its own; reads from either
     * side then fault no more; a write collapses the copies to the writer's side. */
    assert_int_equal(
        mt_backend_managed_advise(b, c + PAGE, PAGE, MT_ADVISE_SET_READ_MOSTLY, MT_MANAGED_HOST),
        0);
    st0 = mstats(b);
    assert_int_equal(mt__sim_managed_access(b, c + PAGE, PAGE, 0, false), 0);
    st = mstats(b);
    assert_int_equal(st.faults, st0.faults + 1);
    assert_int_equal(st.device_bytes, 2 * PAGE);
    assert_int_equal(st.host_bytes, st0.host_bytes); /* the host copy stayed */
    assert_int_equal(mt__sim_managed_access(b, c + PAGE, PAGE, MT_MANAGED_HOST, false), 0);
    assert_int_equal(mt__sim_managed_access(b, c + PAGE, PAGE, 0, false), 0);
    assert_int_equal(mstats(b).faults, st0.faults + 1);
    assert_int_equal(mt__sim_managed_access(b, c + PAGE, 8, MT_MANAGED_HOST, true), 0);
    st = mstats(b);
    assert_int_equal(st.device_bytes, PAGE); /* the device copy is gone */
    /* Accessed-by the device: its accesses of host pages map them. */
    assert_int_equal(mt_backend_managed_advise(b, c + 2 * PAGE, PAGE, MT_ADVISE_SET_ACCESSED_BY, 0),
                     0);
    st0 = mstats(b);
    assert_int_equal(mt__sim_managed_access(b, c + 2 * PAGE, 4, 0, true), 0);
    st = mstats(b);
    assert_int_equal(st.faults, st0.faults);
    assert_int_equal(st.remote_accesses, st0.remote_accesses + 1);
    assert_int_equal(st.advises, 4);
    /* Bad advice, bad location, bad range. */
    assert_int_equal(mt_backend_managed_advise(b, c, PAGE, 0, 0), MT_EINVAL);
    assert_int_equal(mt_backend_managed_advise(b, c, PAGE, 7, 0), MT_EINVAL);
    assert_int_equal(mt_backend_managed_advise(b, c, PAGE, MT_ADVISE_SET_ACCESSED_BY, 5),
                     MT_EINVAL);
    assert_int_equal(mt_backend_managed_advise(b, c, 4 * PAGE, MT_ADVISE_SET_READ_MOSTLY, 0),
                     MT_EINVAL);
    assert_int_equal(mt_backend_managed_free(b, p), 0);
    mt_backend_destroy(&b);
}

static void test_prefetch_cost_on_stream(void **state)
{
    (void)state;
    /* Prefetching 8 pages holds the stream for their transfer time at the modelled
     * bandwidth: an event recorded after it completes that much later. */
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    cfg.kind = MT_BACKEND_SIM;
    cfg.sim_capacity = 64 * MIB;
    cfg.sim_peer_bandwidth = (uint64_t)1 << 30; /* 1 GiB/s: 2 ms per page */
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    void *p = NULL;
    assert_int_equal(mt_backend_managed_malloc(b, 4 * PAGE, &p), 0);
    assert_int_equal(mt__sim_managed_access(b, p, 4 * PAGE, MT_MANAGED_HOST, true), 0);
    mt_event_t *e0 = NULL, *e1 = NULL;
    assert_int_equal(mt_event_create(b, &e0), 0);
    assert_int_equal(mt_event_create(b, &e1), 0);
    assert_int_equal(mt_event_record(b, e0, NULL), 0);
    assert_int_equal(mt_backend_managed_prefetch(b, p, 4 * PAGE, 0, NULL), 0);
    assert_int_equal(mt_event_record(b, e1, NULL), 0);
    assert_int_equal(mt_event_synchronize(b, e1), 0);
    uint64_t dt = mt_event_time_ns(b, e1) - mt_event_time_ns(b, e0);
    assert_true(dt >= 4 * 1900000u);
    assert_true(mstats(b).migrate_ns >= 4 * 1900000u);
    mt_event_destroy(b, &e0);
    mt_event_destroy(b, &e1);
    assert_int_equal(mt_backend_managed_free(b, p), 0);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_is_device_reachable),
        cmocka_unit_test(test_migration_on_access),
        cmocka_unit_test(test_prefetch_on_stream),
        cmocka_unit_test(test_oversubscription_evicts_lru),
        cmocka_unit_test(test_advice),
        cmocka_unit_test(test_prefetch_cost_on_stream),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
