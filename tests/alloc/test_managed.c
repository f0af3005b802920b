/* The allocator over managed memory (managed_memory:True) on the sim backend: segments come
 * from managed memory, blocks are prefetched and advised, an oversubscribed device evicts,
 * every step is an event, and the report's managed totals come out of those events. */
#include "helpers.h"

#include <jansson.h>

#include "analysis/report.h"
#include "tests/common/test_main.h"

#define PAGE (2 * MIB)

static mt_backend_t *sim(size_t capacity)
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = capacity;
    bc.sim_malloc_cost_ns = 0;
    bc.sim_free_cost_ns = 0;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    return b;
}

static mt_alloc_t *managed_alloc(mt_backend_t *b, rec_sink_t *rec)
{
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    cfg.backend = b;
    cfg.sink = rec ? &rec->sink : NULL;
    cfg.stats_period_ms = 0;
    char err[256];
    assert_int_equal(mt_alloc_cfg_parse(&cfg, "managed_memory:True", err, sizeof err), 0);
    assert_true(cfg.managed_memory);
    assert_false(cfg.expandable_segments); /* given way to managed memory */
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &cfg), 0);
    return a;
}

static void test_config(void **state)
{
    (void)state;
    mt_backend_t *b = sim(64 * MIB);
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    cfg.backend = b;
    char err[256];
    /* Both asked for in one string: refused, named, cfg untouched. */
    assert_int_equal(
        mt_alloc_cfg_parse(&cfg, "expandable_segments:True,managed_memory:True", err, sizeof err),
        MT_EINVAL);
    assert_non_null(strstr(err, "managed_memory"));
    assert_non_null(strstr(err, "expandable_segments"));
    assert_false(cfg.managed_memory);
    assert_int_equal(mt_alloc_cfg_parse(&cfg, "managed_memory:yes", err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "managed_memory"));
    /* Off and explicit expandable segments: fine. */
    assert_int_equal(
        mt_alloc_cfg_parse(&cfg, "managed_memory:False,expandable_segments:True", err, sizeof err),
        0);
    assert_false(cfg.managed_memory);
    /* The struct with both: create refuses. */
    cfg.managed_memory = true;
    cfg.expandable_segments = true;
    log_capture_t cap = {0};
    cfg.log = capture_log;
    cfg.log_ud = &cap;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &cfg), MT_EINVAL);
    assert_null(a);
    assert_non_null(strstr(cap.last_error, "managed_memory needs expandable_segments off"));
    /* Nor over the driver's stream-ordered pool, which serves device memory only. */
    cfg.expandable_segments = false;
    cfg.alloc_backend = MT_ALLOC_BACKEND_ASYNC;
    assert_int_equal(mt_alloc_create(&a, &cfg), MT_EINVAL);
    assert_null(a);
    assert_non_null(strstr(cap.last_error, "managed_memory needs backend:native"));
    cfg.alloc_backend = MT_ALLOC_BACKEND_NATIVE;
    /* Not a setting that changes at run time. */
    a = managed_alloc(b, NULL);
    assert_int_equal(mt_alloc_set_settings(a, "managed_memory:False", err, sizeof err), MT_ENOTSUP);
    assert_non_null(strstr(err, "managed_memory"));
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_segments_are_managed(void **state)
{
    (void)state;
    mt_backend_t *b = sim(64 * MIB);
    mt_alloc_t *a = managed_alloc(b, NULL);
    void *p = NULL, *q = NULL;
    assert_int_equal(mt_alloc_malloc(a, 5 * MIB, NULL, MT_TAG_OTHER, &p), 0);
    assert_int_equal(mt_alloc_malloc(a, 1000, NULL, MT_TAG_OTHER, &q), 0);
    assert_true(mt_backend_is_managed(b, p, 5 * MIB));
    assert_true(mt_backend_is_managed(b, q, 1000));
    assert_int_equal(mt__sim_segment_count(b), 0); /* no plain segment */
    mt_managed_stats_t st;
    assert_int_equal(mt_alloc_managed_stats(a, &st), 0);
    mt_alloc_stats_t as;
    assert_int_equal(mt_alloc_stats(a, &as), 0);
    assert_int_equal(st.managed_bytes, (uint64_t)as.reserved_bytes[MT_STAT_ALL].current);
    assert_int_equal(st.device_bytes, 0); /* allocating touches nothing */
    assert_int_equal(mt_alloc_check(a), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(mt_alloc_free(a, q), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(mt_alloc_managed_stats(a, &st), 0);
    assert_int_equal(st.managed_bytes, 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_prefetch_advise_checked(void **state)
{
    (void)state;
    mt_backend_t *b = sim(64 * MIB);
    rec_sink_t rec;
    rec_init(&rec);
    mt_alloc_t *a = managed_alloc(b, &rec);
    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(a, 4 * MIB, NULL, MT_TAG_OTHER, &p), 0);
    assert_int_equal(mt_alloc_prefetch(a, p, 4 * MIB, 0, NULL), 0);
    assert_int_equal(mt_device_synchronize(b), 0);
    mt_managed_stats_t st;
    assert_int_equal(mt_alloc_managed_stats(a, &st), 0);
    assert_int_equal(st.device_bytes, 4 * MIB);
    assert_int_equal(st.prefetches, 1);
    assert_int_equal(mt_alloc_advise(a, p, 2 * MIB, MT_ADVISE_SET_READ_MOSTLY, 0), 0);
    assert_int_equal(mt_alloc_advise(a, p, MIB, MT_ADVISE_SET_PREFERRED_LOCATION, MT_MANAGED_HOST),
                     0);
    /* The event stream: one prefetch, two advice, residency samples. */
    size_t pf = 0, adv = 0, res = 0;
    for (size_t i = 0; i < rec.n; i++) {
        const mt_event_rec_t *e = &rec.ev[i];
        if (e->kind != MT_EV_MANAGED)
            continue;
        if (e->tag == MT_MANAGED_PREFETCH) {
            pf++;
            assert_int_equal(e->addr, (uintptr_t)p);
            assert_int_equal(e->size, 4 * MIB);
            assert_int_equal(e->requested, 0); /* device 0 */
        } else if (e->tag == MT_MANAGED_ADVISE) {
            adv++;
            if (adv == 2)
                assert_int_equal(e->requested,
                                 MT_ADVISE_SET_PREFERRED_LOCATION | (uint64_t)0xffffffffu << 32);
        } else if (e->tag == MT_MANAGED_RESIDENCY) {
            res++;
        }
    }
    assert_int_equal(pf, 1);
    assert_int_equal(adv, 2);
    assert_true(res >= 2); /* the segment, then the pages on the device */
    const mt_event_rec_t *last = NULL;
    for (size_t i = 0; i < rec.n; i++)
        if (rec.ev[i].kind == MT_EV_MANAGED && rec.ev[i].tag == MT_MANAGED_RESIDENCY)
            last = &rec.ev[i];
    assert_int_equal(last->size, 4 * MIB);
    /* Named errors: a range past the block, a pointer of no block. */
    assert_int_equal(mt_alloc_prefetch(a, p, 4 * MIB + 1, 0, NULL), MT_ENOENT);
    assert_non_null(strstr(mt_alloc_last_error(a), "not inside one allocated block"));
    int x;
    assert_int_equal(mt_alloc_advise(a, &x, 4, MT_ADVISE_SET_READ_MOSTLY, 0), MT_ENOENT);
    assert_int_equal(mt_alloc_prefetch(a, p, MIB, 5, NULL), MT_EINVAL); /* no device 5 */
    assert_int_equal(mt_alloc_free(a, p), 0);
    mt_alloc_destroy(&a);
    rec_fini(&rec);
    /* An allocator that is not managed refuses, named. */
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    cfg.backend = b;
    assert_int_equal(mt_alloc_create(&a, &cfg), 0);
    assert_int_equal(mt_alloc_malloc(a, MIB, NULL, MT_TAG_OTHER, &p), 0);
    assert_int_equal(mt_alloc_prefetch(a, p, MIB, 0, NULL), MT_ENOTSUP);
    assert_non_null(strstr(mt_alloc_last_error(a), "managed_memory:True"));
    assert_int_equal(mt_alloc_managed_stats(a, &st), MT_ENOTSUP);
    assert_int_equal(mt_alloc_free(a, p), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* Feeds the recorded events to the report and returns its "managed" member (new). */
static json_t *report_managed(const rec_sink_t *rec)
{
    mt__report_cfg_t rc = mt__report_cfg_default();
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, &rc), 0);
    for (size_t i = 0; i < rec->n; i++)
        assert_int_equal(mt__report_add_event(r, 42, &rec->ev[i], NULL), 0);
    json_t *res = mt__report_result(r);
    assert_non_null(res);
    json_t *procs = json_object_get(res, "processes");
    assert_true(json_array_size(procs) == 1);
    json_t *m = json_object_get(json_array_get(procs, 0), "managed");
    json_incref(m);
    json_decref(res);
    mt__report_destroy(&r);
    return m;
}

static uint64_t jn(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    assert_true(json_is_integer(v));
    return (uint64_t)json_integer_value(v);
}

static void test_oversubscribed_and_report(void **state)
{
    (void)state;
    /* A device of 8 MiB under a pool of 12 MiB: the kernel's pass over the whole pool
     * pushes the first pages out again. */
    mt_backend_t *b = sim(8 * MIB);
    rec_sink_t rec;
    rec_init(&rec);
    mt_alloc_t *a = managed_alloc(b, &rec);
    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(a, 12 * MIB, NULL, MT_TAG_OTHER, &p), 0);
    assert_int_equal(mt__sim_managed_access(b, p, 12 * MIB, MT_MANAGED_HOST, true), 0);
    assert_int_equal(mt__sim_managed_access(b, p, 12 * MIB, 0, false), 0); /* a kernel */
    mt_managed_stats_t st;
    assert_int_equal(mt_alloc_managed_stats(a, &st), 0);
    assert_int_equal(st.device_bytes, 8 * MIB);
    assert_int_equal(st.evicted_bytes, 4 * MIB);
    assert_int_equal(st.bytes_to_device, 12 * MIB);
    assert_int_equal(st.faults, 6 + 6); /* first touches on the host, then the kernel's */
    assert_int_equal(mt_alloc_prefetch(a, p, 2 * MIB, MT_MANAGED_HOST, NULL), 0);
    assert_int_equal(mt_device_synchronize(b), 0);
    assert_int_equal(mt_alloc_managed_stats(a, &st), 0);
    /* Plain device memory is still there to be had: a cudaMalloc evicts managed pages. */
    void *seg = NULL;
    assert_int_equal(mt_backend_malloc(b, 6 * MIB, &seg), 0);
    assert_int_equal(mt_alloc_managed_stats(a, &st), 0);
    assert_true(st.device_bytes <= 2 * MIB);
    assert_int_equal(mt_backend_free(b, seg), 0);
    json_t *m = report_managed(&rec);
    assert_non_null(m);
    assert_int_equal(jn(m, "managed_peak_bytes"), 12 * MIB);
    assert_int_equal(jn(m, "device_peak_bytes"), 8 * MIB);
    assert_int_equal(jn(m, "faults"), st.faults);
    assert_int_equal(jn(m, "migrated_bytes"), st.bytes_to_device + st.bytes_to_host);
    assert_int_equal(jn(m, "prefetches"), 1);
    assert_int_equal(jn(m, "prefetch_bytes"), 2 * MIB);
    assert_int_equal(jn(m, "advises"), 0);
    json_decref(m);
    assert_int_equal(mt_alloc_free(a, p), 0);
    mt_alloc_destroy(&a);
    rec_fini(&rec);
    mt_backend_destroy(&b);
}

static void test_report_without_managed(void **state)
{
    (void)state;
    mt_backend_t *b = sim(64 * MIB);
    rec_sink_t rec;
    rec_init(&rec);
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    cfg.backend = b;
    cfg.sink = &rec.sink;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &cfg), 0);
    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(a, MIB, NULL, MT_TAG_OTHER, &p), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(rec_count(&rec, MT_EV_MANAGED), 0);
    assert_null(report_managed(&rec));
    mt_alloc_destroy(&a);
    rec_fini(&rec);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_segments_are_managed),
        cmocka_unit_test(test_prefetch_advise_checked),
        cmocka_unit_test(test_oversubscribed_and_report),
        cmocka_unit_test(test_report_without_managed),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
