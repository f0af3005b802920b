/* Host-allocation failures in the caching allocator and its sim backend: every
 * allocation site reached by create, malloc/free (streams, pending events, record_stream),
 * tags, stats, snapshot, configuration parsing, warm-up and reservations fails once in
 * turn. Each public call must then return 0 (it degraded: a block handed out whole, a
 * stream synchronised instead of an event) or MT_ENOMEM, the allocator must pass
 * mt_alloc_check after it, and nothing may leak. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "inject.h"
#include "tests/common/test_main.h"

#define MIB ((size_t)1 << 20)

/* An event sink with a fixed array: it allocates nothing itself. */
typedef struct {
    mt_event_sink_t sink;
    size_t n;
} count_sink_t;

static void count_emit(void *ud, const mt_event_rec_t *ev)
{
    (void)ev;
    ((count_sink_t *)ud)->n++;
}

static void quiet_log(void *ud, mt_log_level_e level, const char *msg)
{
    (void)ud;
    (void)level;
    (void)msg;
}

/* The call may fail only for want of host memory, and leaves the allocator whole. */
#define STEP(a, call)                                                                              \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0 && rc_ != MT_ENOMEM)                                                          \
            fail_msg("%s returned %d (%s) with host allocation %ld failed", #call, rc_,            \
                     mt_strerror(rc_), fault_target());                                            \
        if ((a) != NULL)                                                                           \
            assert_int_equal(mt_alloc_check(a), 0);                                                \
    } while (0)

typedef struct {
    const char *conf;
} alloc_case_t;

static void run_ops(mt_alloc_t *a, mt_backend_t *b, mt_stream_t *s1)
{
    void *p[8] = {0};
    const size_t sizes[8] = {1000, 3 * MIB, 700 << 10, 12 * MIB, 100, 2 * MIB, 40 << 10, 512};
    int tag = 0;
    STEP(a, mt_alloc_tag_register(a, "fault-tag", &tag));
    for (int i = 0; i < 8; i++)
        STEP(a, mt_alloc_malloc(a, sizes[i], i % 2 ? s1 : NULL, tag, &p[i]));
    /* Pending frees: blocks used by another stream wait for an event at free. */
    if (s1 != NULL) {
        for (int i = 0; i < 8; i += 2)
            if (p[i] != NULL)
                STEP(a, mt_alloc_record_stream(a, p[i], s1));
    }
    for (int i = 0; i < 8; i += 2)
        STEP(a, mt_alloc_free(a, p[i]));
    mt_alloc_stats_t st;
    STEP(a, mt_alloc_stats(a, &st));
    mt_alloc_snapshot_t *snap = NULL;
    STEP(a, mt_alloc_snapshot(a, &snap));
    mt_alloc_snapshot_free(&snap);
    /* A warm-up: record, plan, reserve. */
    STEP(a, mt_alloc_warmup_begin(a));
    void *w[4] = {0};
    for (int i = 0; i < 4; i++)
        STEP(a, mt_alloc_malloc(a, (size_t)(i + 1) * 5 * MIB, NULL, 0, &w[i]));
    for (int i = 0; i < 4; i++)
        STEP(a, mt_alloc_free(a, w[i]));
    STEP(a, mt_alloc_warmup_end(a, NULL));
    STEP(a, mt_alloc_reserve(a, 8 * MIB, s1));
    /* A device OOM: garbage collection, release of the cache, the OOM report. */
    void *big = NULL;
    STEP(a, mt_alloc_malloc(a, 1024 * MIB, NULL, 0, &big));
    assert_null(big);
    for (int i = 1; i < 8; i += 2)
        STEP(a, mt_alloc_free(a, p[i]));
    STEP(a, mt_alloc_empty_cache(a));
    (void)b;
}

static void alloc_scenario(void *ud)
{
    const alloc_case_t *c = ud;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 512 * MIB;
    bc.sim_malloc_cost_ns = bc.sim_free_cost_ns = 0;
    mt_backend_t *b = NULL;
    int rc = mt_backend_create(&b, &bc);
    if (rc != 0) {
        assert_int_equal(rc, MT_ENOMEM);
        return;
    }
    count_sink_t sink = {.sink = {.emit = count_emit}};
    sink.sink.ud = &sink;
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    cfg.backend = b;
    cfg.sink = &sink.sink;
    cfg.log = quiet_log;
    char err[256];
    mt_alloc_t *a = NULL;
    mt_stream_t *s1 = NULL;
    STEP(a, mt_alloc_cfg_from_env(&cfg, err, sizeof err));
    STEP(a, mt_alloc_cfg_parse(&cfg, c->conf, err, sizeof err));
    STEP(a, mt_alloc_create(&a, &cfg));
    if (a == NULL)
        goto out;
    STEP(a, mt_stream_create(b, &s1));
    run_ops(a, b, s1);
    mt_alloc_destroy(&a);
out:
    mt_stream_destroy(b, &s1);
    mt_backend_destroy(&b);
}

static void test_alloc_default(void **state)
{
    (void)state;
    alloc_case_t c = {"roundup_power2_divisions:4"};
    assert_true(fault_loop("alloc default", alloc_scenario, &c) > 20);
}

static void test_alloc_expandable(void **state)
{
    (void)state;
    alloc_case_t c = {"expandable_segments:True,garbage_collection_threshold:0.5"};
    assert_true(fault_loop("alloc expandable", alloc_scenario, &c) > 20);
}

static void test_alloc_max_split(void **state)
{
    (void)state;
    /* Read from the environment too (mt_alloc_cfg_from_env). */
    assert_int_equal(setenv("MEMTRACE_ALLOC_CONF", "release_on_oom:True,memory_fraction:0.9", 1),
                     0);
    /* Oversize blocks, periodic statistics events. */
    alloc_case_t c = {"max_split_size_mb:24,release_smaller_segments:False,stats_period_ms:1"};
    assert_true(fault_loop("alloc max_split", alloc_scenario, &c) > 20);
    assert_int_equal(unsetenv("MEMTRACE_ALLOC_CONF"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_default),
        cmocka_unit_test(test_alloc_expandable),
        cmocka_unit_test(test_alloc_max_split),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
