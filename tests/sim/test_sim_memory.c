/* Sim backend device memory: capacity, alignment, accounting, errors, costs, pinned host
 * memory, and that free synchronises the device. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sim_fixture.h"
#include "tests/common/test_main.h"

static void test_create_and_info(void **state)
{
    mt_backend_t *b = sim_new(64 * MIB);
    assert_string_equal(mt_backend_name(b), "sim");
    assert_int_equal(mt_backend_kind(b), MT_BACKEND_SIM);
    assert_int_equal(mt_backend_device(b), 0);
    size_t fr = 0, tot = 0;
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(tot, 64 * MIB);
    assert_int_equal(fr, 64 * MIB);
    assert_int_equal(mt__sim_used_bytes(b), 0);
    assert_int_equal(mt_backend_vm_granularity(b), 2 * MIB);
    assert_int_equal(mt__sim_check(b), 0);
    mt_backend_destroy(&b);
    assert_null(b);
}

/* MEMTRACE_SIM_CAPACITY reaches the backend through mt_backend_cfg_from_env only: neither
 * the defaults nor create read it (docs/process-state.md). */
static void test_capacity_from_env_and_default(void **state)
{
    setenv("MEMTRACE_SIM_CAPACITY", "32M", 1);
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    cfg.kind = MT_BACKEND_SIM;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    size_t fr, tot;
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(tot, (size_t)8 << 30);
    mt_backend_destroy(&b);
    assert_int_equal(mt_backend_cfg_from_env(&cfg, NULL, 0), 0);
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(tot, 32 * MIB);
    mt_backend_destroy(&b);

    unsetenv("MEMTRACE_SIM_CAPACITY");
    cfg = mt_backend_cfg_default();
    cfg.kind = MT_BACKEND_SIM;
    assert_int_equal(cfg.sim_capacity, 0);
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(tot, (size_t)8 << 30);
    assert_int_equal(fr, (size_t)8 << 30);
    mt_backend_destroy(&b);
}

/* Malformed environment: from_env names the first bad variable and its value, still
 * applies the good ones; cfg_default reads none. */
static void test_env_errors_named(void **state)
{
    char err[256];
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    setenv("MEMTRACE_SIM_CAPACITY", "2 G", 1);
    setenv("MEMTRACE_SIM_FREE_COST_NS", "500", 1);
    assert_int_equal(mt_backend_cfg_from_env(&cfg, err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "MEMTRACE_SIM_CAPACITY"));
    assert_non_null(strstr(err, "'2 G'"));
    assert_int_equal(cfg.sim_free_cost_ns, 500);
    assert_int_equal(cfg.sim_capacity, 0); /* untouched: the 8 GiB default */
    assert_int_equal(mt_backend_cfg_default().sim_capacity, 0);

    setenv("MEMTRACE_SIM_CAPACITY", "0", 1); /* a device of no bytes is refused too */
    assert_int_equal(mt_backend_cfg_from_env(&cfg, err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "MEMTRACE_SIM_CAPACITY"));

    setenv("MEMTRACE_SIM_CAPACITY", "3GiB", 1);
    setenv("MEMTRACE_BACKEND", "gpu", 1);
    setenv("MEMTRACE_SIM_MALLOC_COST_NS", "x", 1);
    assert_int_equal(mt_backend_cfg_from_env(&cfg, err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "MEMTRACE_BACKEND")); /* the first of two problems */
    assert_null(strstr(err, "MALLOC_COST"));
    assert_int_equal(cfg.sim_capacity, (size_t)3 << 30);

    setenv("MEMTRACE_BACKEND", "sim", 1);
    unsetenv("MEMTRACE_SIM_MALLOC_COST_NS");
    assert_int_equal(mt_backend_cfg_from_env(&cfg, err, sizeof err), 0);
    assert_int_equal(cfg.kind, MT_BACKEND_SIM);
    assert_string_equal(err, "");
    unsetenv("MEMTRACE_BACKEND");
    unsetenv("MEMTRACE_SIM_CAPACITY");
    unsetenv("MEMTRACE_SIM_FREE_COST_NS");
}

static void test_alignment_and_accounting(void **state)
{
    mt_backend_t *b = sim_new(256 * MIB);
    static const size_t sizes[] = {1,           511,     512,         513,     1000,    4096,
                                   2 * MIB - 1, 2 * MIB, 2 * MIB + 1, 3 * MIB, 20 * MIB};
    enum { N = sizeof sizes / sizeof sizes[0] };
    void *p[N];
    size_t expect = 0;
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(mt_backend_malloc(b, sizes[i], &p[i]), 0);
        size_t align = sizes[i] >= 2 * MIB ? 2 * MIB : 512;
        assert_int_equal((uintptr_t)p[i] % align, 0);
        expect += (sizes[i] + align - 1) / align * align;
        assert_int_equal(mt__sim_used_bytes(b), expect);
        assert_true(mt_backend_is_device_ptr(b, p[i]));
        assert_true(mt_backend_is_device_ptr(b, (char *)p[i] + sizes[i] - 1));
        /* Device memory is host-addressable: every byte can be written. */
        memset(p[i], (int)i, sizes[i]);
        assert_int_equal(mt__sim_check(b), 0);
    }
    /* No two segments overlap. */
    for (size_t i = 0; i < N; i++)
        for (size_t j = i + 1; j < N; j++) {
            uintptr_t a = (uintptr_t)p[i], c = (uintptr_t)p[j];
            assert_true(a + sizes[i] <= c || c + sizes[j] <= a);
        }
    for (size_t i = 0; i < N; i++)
        assert_int_equal(((unsigned char *)p[i])[sizes[i] - 1], (unsigned char)i);
    size_t fr, tot;
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(fr, tot - expect);
    assert_int_equal(mt__sim_segment_count(b), N);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(mt_backend_free(b, p[i]), 0);
    assert_int_equal(mt__sim_used_bytes(b), 0);
    assert_int_equal(mt__sim_segment_count(b), 0);
    assert_int_equal(mt__sim_check(b), 0);
    int x;
    assert_false(mt_backend_is_device_ptr(b, &x));
    assert_false(mt_backend_is_device_ptr(b, NULL));
    mt_backend_destroy(&b);
}

static void test_capacity_and_oom(void **state)
{
    mt_backend_t *b = sim_new(64 * MIB);
    void *p = NULL, *q = NULL;
    assert_int_equal(mt_backend_malloc(b, 64 * MIB + 1, &p), MT_ENOMEM);
    assert_int_equal(mt_backend_malloc(b, SIZE_MAX / 2, &p), MT_ENOMEM);
    assert_int_equal(mt_backend_malloc(b, 64 * MIB, &p), 0);
    size_t fr, tot;
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(fr, 0);
    assert_int_equal(mt_backend_malloc(b, 512, &q), MT_ENOMEM);
    assert_int_equal(mt_backend_free(b, p), 0);
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(fr, 64 * MIB);

    /* 40 MiB in use: a 30 MiB request fails, 24 MiB fits exactly. */
    assert_int_equal(mt_backend_malloc(b, 40 * MIB, &p), 0);
    assert_int_equal(mt_backend_malloc(b, 30 * MIB, &q), MT_ENOMEM);
    assert_int_equal(mt_backend_malloc(b, 24 * MIB, &q), 0);
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(fr, 0);
    assert_int_equal(mt_backend_free(b, p), 0);
    assert_int_equal(mt_backend_free(b, q), 0);

    mt_backend_counters_t c = counters_of(b);
    assert_int_equal(c.malloc_calls, 7);
    assert_int_equal(c.malloc_failures, 4);
    assert_int_equal(c.free_calls, 3);
    assert_int_equal(c.mem_get_info_calls, 3);
    assert_int_equal(mt__sim_check(b), 0);
    mt_backend_destroy(&b);
}

/* Capacity is counted in bytes, not in contiguous holes, as on a GPU: with 30 MiB free in
 * two holes (16 + 14 MiB), a 24 MiB malloc succeeds. */
static void test_free_bytes_not_holes(void **state)
{
    mt_backend_t *b = sim_new(64 * MIB);
    void *a = NULL, *h1 = NULL, *c = NULL, *h2 = NULL, *big = NULL;
    assert_int_equal(mt_backend_malloc(b, 16 * MIB, &a), 0);
    assert_int_equal(mt_backend_malloc(b, 16 * MIB, &h1), 0);
    assert_int_equal(mt_backend_malloc(b, 18 * MIB, &c), 0);
    assert_int_equal(mt_backend_malloc(b, 14 * MIB, &h2), 0);
    assert_int_equal(mt_backend_free(b, h1), 0);
    assert_int_equal(mt_backend_free(b, h2), 0);
    size_t fr, tot;
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(fr, 30 * MIB);
    assert_int_equal(mt_backend_malloc(b, 24 * MIB, &big), 0);
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(fr, 6 * MIB);
    assert_int_equal(mt_backend_malloc(b, 8 * MIB, &h1), MT_ENOMEM); /* bytes are gone */
    assert_int_equal(mt__sim_check(b), 0);
    assert_int_equal(mt_backend_free(b, big), 0);
    assert_int_equal(mt_backend_free(b, c), 0);
    assert_int_equal(mt_backend_free(b, a), 0);
    assert_int_equal(mt__sim_check(b), 0);
    mt_backend_destroy(&b);
}

static void test_capacity_not_multiple_of_page(void **state)
{
    /* total is reported as configured; rounding of a segment counts against it. */
    mt_backend_t *b = sim_new(3 * MIB + 1000);
    size_t fr, tot;
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(tot, 3 * MIB + 1000);
    void *p, *q;
    assert_int_equal(mt_backend_malloc(b, 2 * MIB + 1, &p), MT_ENOMEM); /* rounds to 4 MiB */
    assert_int_equal(mt_backend_malloc(b, 2 * MIB, &p), 0);
    assert_int_equal(mt_backend_malloc(b, MIB + 512, &q), 0);
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(fr, 1000 - 512);
    assert_int_equal(mt_backend_free(b, q), 0);
    assert_int_equal(mt_backend_free(b, p), 0);
    mt_backend_destroy(&b);
}

static void test_free_errors(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    void *p;
    int local;
    assert_int_equal(mt_backend_free(b, NULL), 0);
    assert_int_equal(mt_backend_free(b, &local), MT_ENOENT);
    assert_int_equal(mt_backend_malloc(b, 4096, &p), 0);
    assert_int_equal(mt_backend_free(b, (char *)p + 512), MT_ENOENT); /* interior */
    assert_int_equal(mt_backend_free(b, p), 0);
    assert_int_equal(mt_backend_free(b, p), MT_ENOENT); /* double free */
    assert_int_equal(mt_backend_malloc(b, 0, &p), MT_EINVAL);
    assert_int_equal(mt_backend_malloc(b, 16, NULL), MT_EINVAL);
    assert_int_equal(mt__sim_check(b), 0);
    mt_backend_destroy(&b);
}

static void test_best_fit_and_merge(void **state)
{
    mt_backend_t *b = sim_new(8 * MIB);
    void *a, *c, *d, *e, *x;
    assert_int_equal(mt_backend_malloc(b, MIB, &a), 0);
    assert_int_equal(mt_backend_malloc(b, 2 * MIB - 512, &c), 0);
    assert_int_equal(mt_backend_malloc(b, MIB, &d), 0);
    assert_int_equal(mt_backend_malloc(b, 4096, &e), 0);
    /* Holes: a (1 MiB) and d (1 MiB) and the tail; a 1 MiB request fills a hole exactly. */
    assert_int_equal(mt_backend_free(b, a), 0);
    assert_int_equal(mt_backend_free(b, d), 0);
    assert_int_equal(mt_backend_malloc(b, MIB, &x), 0);
    assert_true(x == a || x == d);
    assert_int_equal(mt__sim_check(b), 0);
    assert_int_equal(mt_backend_free(b, x), 0);
    assert_int_equal(mt_backend_free(b, c), 0);
    assert_int_equal(mt_backend_free(b, e), 0);
    /* Everything merged back: the whole capacity is one range again. */
    assert_int_equal(mt_backend_malloc(b, 8 * MIB, &x), 0);
    assert_int_equal(mt_backend_free(b, x), 0);
    assert_int_equal(mt__sim_check(b), 0);
    mt_backend_destroy(&b);
}

static void test_failure_injection(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    void *p = NULL;
    assert_int_equal(mt__sim_inject_malloc_failures(b, 2), 0);
    assert_int_equal(mt_backend_malloc(b, 512, &p), MT_ENOMEM);
    assert_int_equal(mt_backend_malloc(b, 512, &p), MT_ENOMEM);
    assert_int_equal(mt_backend_malloc(b, 512, &p), 0);
    assert_int_equal(mt_backend_free(b, p), 0);
    mt_backend_counters_t c = counters_of(b);
    assert_int_equal(c.malloc_calls, 3);
    assert_int_equal(c.malloc_failures, 2);
    assert_int_equal(mt__sim_used_bytes(b), 0);
    assert_int_equal(mt__sim_inject_malloc_failures(NULL, 1), MT_EINVAL);
    mt_backend_destroy(&b);
}

static void test_modelled_cost(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    void *p;
    assert_int_equal(mt_backend_malloc(b, 512, &p), 0);
    assert_int_equal(mt_backend_free(b, p), 0);
    assert_int_equal(counters_of(b).modelled_ns, 0);
    mt__sim_set_costs(b, 300000, 100000);
    assert_int_equal(mt_backend_malloc(b, 512, &p), 0);
    assert_int_equal(mt_backend_free(b, p), 0);
    assert_int_equal(mt_backend_malloc(b, 512, &p), 0);
    assert_int_equal(counters_of(b).modelled_ns, 700000);
    assert_int_equal(mt_backend_free(b, p), 0);
    assert_int_equal(counters_of(b).modelled_ns, 800000);
    mt_backend_destroy(&b);
}

static atomic_int g_flag;

static void slow_host_fn(void *ud)
{
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    atomic_store(&g_flag, *(int *)ud);
}

static void test_free_synchronises_device(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    void *p;
    assert_int_equal(mt_backend_malloc(b, 4096, &p), 0);
    static int v1 = 1, v2 = 2;
    atomic_store(&g_flag, 0);
    assert_int_equal(mt_stream_launch_host_func(b, s, slow_host_fn, &v1), 0);
    assert_int_equal(mt_backend_free(b, p), 0);
    assert_int_equal(atomic_load(&g_flag), 1); /* ran before free returned */
    assert_int_equal(mt_stream_launch_host_func(b, NULL, slow_host_fn, &v2), 0);
    mt_backend_destroy(&b); /* destroy drains too, including s, which was never destroyed */
    assert_int_equal(atomic_load(&g_flag), 2);
}

static void test_pinned_host_memory(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    void *h = NULL, *h2 = NULL;
    long pg = sysconf(_SC_PAGESIZE);
    assert_int_equal(mt_backend_host_malloc(b, 10000, &h), 0);
    assert_int_equal((uintptr_t)h % (uintptr_t)pg, 0);
    memset(h, 0x5a, 10000);
    assert_false(mt_backend_is_device_ptr(b, h));
    assert_int_equal(mt_backend_host_malloc(b, 1, &h2), 0);
    assert_int_equal(mt__sim_used_bytes(b), 0); /* not device memory */
    int local;
    assert_int_equal(mt_backend_host_free(b, &local), MT_ENOENT);
    assert_int_equal(mt_backend_host_free(b, (char *)h + 64), MT_ENOENT);
    assert_int_equal(mt_backend_host_free(b, h), 0);
    assert_int_equal(mt_backend_host_free(b, h), MT_ENOENT);
    assert_int_equal(mt_backend_host_free(b, NULL), 0);
    assert_int_equal(mt_backend_host_malloc(b, 0, &h), MT_EINVAL);
    mt_backend_destroy(&b); /* h2 is released by destroy (ASan/valgrind would see a leak) */
}

/* Seeded random malloc/free against a model of the bytes in use, invariants checked at
 * every step. */
static void test_randomized(void **state)
{
    enum { SLOTS = 64, STEPS = 4000 };
    mt_backend_t *b = sim_new(128 * MIB);
    void *p[SLOTS] = {0};
    size_t sz[SLOTS] = {0};
    size_t model = 0;
    unsigned seed = 12345;
    for (int step = 0; step < STEPS; step++) {
        unsigned i = (unsigned)rand_r(&seed) % SLOTS;
        if (p[i] != NULL) {
            assert_int_equal(mt_backend_free(b, p[i]), 0);
            model -= sz[i];
            p[i] = NULL;
        } else {
            size_t req = (rand_r(&seed) % 4 == 0) ? (size_t)(rand_r(&seed) % (8 * MIB)) + 1
                                                  : (size_t)(rand_r(&seed) % 65536) + 1;
            size_t align = req >= 2 * MIB ? 2 * MIB : 512;
            size_t rounded = (req + align - 1) / align * align;
            int rc = mt_backend_malloc(b, req, &p[i]);
            if (rc == 0) {
                assert_int_equal((uintptr_t)p[i] % align, 0);
                ((char *)p[i])[0] = 1;
                ((char *)p[i])[req - 1] = 1;
                sz[i] = rounded;
                model += rounded;
            } else {
                assert_int_equal(rc, MT_ENOMEM);
                p[i] = NULL;
            }
        }
        assert_int_equal(mt__sim_used_bytes(b), model);
        assert_int_equal(mt__sim_check(b), 0);
    }
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_and_info),
        cmocka_unit_test(test_capacity_from_env_and_default),
        cmocka_unit_test(test_env_errors_named),
        cmocka_unit_test(test_alignment_and_accounting),
        cmocka_unit_test(test_capacity_and_oom),
        cmocka_unit_test(test_free_bytes_not_holes),
        cmocka_unit_test(test_capacity_not_multiple_of_page),
        cmocka_unit_test(test_free_errors),
        cmocka_unit_test(test_best_fit_and_merge),
        cmocka_unit_test(test_failure_injection),
        cmocka_unit_test(test_modelled_cost),
        cmocka_unit_test(test_free_synchronises_device),
        cmocka_unit_test(test_pinned_host_memory),
        cmocka_unit_test(test_randomized),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
