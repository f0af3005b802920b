/* Several sim devices (MEMTRACE_SIM_DEVICES): per-device capacity and OOM, peer copies
 * (bytes, ordering on their stream, modelled cost), cross-device event waits, device
 * ordinals out of range, the environment's parsing, and one caching allocator per device
 * whose events carry the device's ordinal. A host function blocking on a semaphore holds a
 * stream at a known point, so ordering claims are deterministic. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "memtrace/alloc.h"
#include "memtrace/event.h"
#include "sim_fixture.h"
#include "tests/common/test_main.h"

static char last_log[512];

static void keep_log(void *ud, mt_log_level_e level, const char *msg)
{
    (void)ud;
    (void)level;
    snprintf(last_log, sizeof last_log, "%s", msg);
}

static mt_backend_t *group_new(int n, size_t capacity, uint64_t peer_ns, uint64_t bw)
{
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    cfg.kind = MT_BACKEND_SIM;
    cfg.sim_capacity = capacity;
    cfg.sim_malloc_cost_ns = 0;
    cfg.sim_free_cost_ns = 0;
    cfg.sim_devices = n;
    cfg.sim_peer_cost_ns = peer_ns;
    cfg.sim_peer_bandwidth = bw;
    cfg.log = keep_log;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    assert_int_equal(mt_backend_device_count(b), n);
    return b;
}

static mt_backend_t *dev(mt_backend_t *b, int i)
{
    mt_backend_t *d = NULL;
    assert_int_equal(mt_backend_get_device(b, i, &d), 0);
    assert_non_null(d);
    assert_int_equal(mt_backend_device(d), i);
    return d;
}

static void test_capacity_and_oom_per_device(void **state)
{
    (void)state;
    mt_backend_t *b = group_new(2, 8 * MIB, 0, 0);
    mt_backend_t *d0 = dev(b, 0), *d1 = dev(b, 1);
    assert_ptr_equal(d0, b);
    void *p0 = NULL, *q = NULL, *p1 = NULL;
    assert_int_equal(mt_backend_malloc(d0, 8 * MIB, &p0), 0);
    assert_int_equal(mt_backend_malloc(d0, MIB, &q), MT_ENOMEM);
    /* Device 0 is full; device 1 has its own 8 MiB. */
    size_t f = 0, t = 0;
    assert_int_equal(mt_backend_mem_get_info(d1, &f, &t), 0);
    assert_int_equal(f, 8 * MIB);
    assert_int_equal(t, 8 * MIB);
    assert_int_equal(mt_backend_malloc(d1, 8 * MIB, &p1), 0);
    assert_true(mt_backend_is_device_ptr(d1, p1));
    assert_false(mt_backend_is_device_ptr(d1, p0));
    assert_false(mt_backend_is_device_ptr(d0, p1));
    assert_int_equal(mt_backend_free(d1, p0), MT_ENOENT); /* not device 1's */
    assert_int_equal(mt_backend_mem_get_info(d0, &f, &t), 0);
    assert_int_equal(f, 0);
    assert_int_equal(counters_of(d0).malloc_failures, 1);
    assert_int_equal(counters_of(d1).malloc_failures, 0);
    assert_int_equal(mt_backend_free(d0, p0), 0);
    assert_int_equal(mt_backend_free(d1, p1), 0);
    assert_int_equal(mt__sim_check(d0), 0);
    assert_int_equal(mt__sim_check(d1), 0);
    mt_backend_destroy(&d1); /* borrowed: does nothing */
    assert_int_equal(mt_backend_mem_get_info(dev(b, 1), &f, &t), 0);
    mt_backend_destroy(&b);
}

static void test_peer_copy_bytes_and_order(void **state)
{
    (void)state;
    const uint64_t cost = 5000000; /* 5 ms per copy, infinite-ish bandwidth */
    mt_backend_t *b = group_new(2, 8 * MIB, cost, (uint64_t)1 << 50);
    mt_backend_t *d0 = dev(b, 0), *d1 = dev(b, 1);
    const size_t n = MIB + 123;
    uint8_t *host = malloc(n), *back = calloc(1, n);
    for (size_t i = 0; i < n; i++)
        host[i] = (uint8_t)(i * 7 + 3);
    void *src = NULL, *dst = NULL;
    assert_int_equal(mt_backend_malloc(d0, n, &src), 0);
    assert_int_equal(mt_backend_malloc(d1, n, &dst), 0);
    assert_int_equal(mt_memcpy(d0, src, host, n, MT_MEMCPY_HOST_TO_DEVICE), 0);

    mt_stream_t *s1 = NULL;
    mt_event_t *before = NULL, *after = NULL;
    assert_int_equal(mt_stream_create(d1, &s1), 0);
    assert_int_equal(mt_event_create(d1, &before), 0);
    assert_int_equal(mt_event_create(d1, &after), 0);
    assert_int_equal(mt_event_record(d1, before, s1), 0);
    assert_int_equal(mt_memcpy_peer_async(d1, dst, 1, src, 0, n, s1), 0);
    assert_int_equal(mt_event_record(d1, after, s1), 0);
    /* Queued behind the peer copy on the same stream: sees its bytes. */
    assert_int_equal(mt_memcpy_async(d1, back, dst, n, MT_MEMCPY_DEVICE_TO_HOST, s1), 0);
    assert_int_equal(mt_stream_synchronize(d1, s1), 0);
    assert_memory_equal(back, host, n);
    uint64_t spent = mt_event_time_ns(d1, after) - mt_event_time_ns(d1, before);
    assert_true(spent >= cost);

    mt_backend_counters_t c = counters_of(d1);
    assert_int_equal(c.peer_copies, 1);
    assert_int_equal(c.peer_bytes, n);
    assert_true(c.peer_ns >= cost && c.peer_ns <= cost + 1);
    assert_int_equal(counters_of(d0).peer_copies, 0);

    /* The wrong device named for a span, and a stream of another device, are refused. */
    assert_int_equal(mt_memcpy_peer_async(d1, dst, 0, src, 0, n, s1), MT_EINVAL);
    assert_int_equal(mt_memcpy_peer_async(d0, dst, 1, src, 0, n, s1), MT_EINVAL);
    assert_int_equal(mt_memcpy_peer_async(d1, dst, 1, src, 0, 0, s1), 0);

    mt_event_destroy(d1, &before);
    mt_event_destroy(d1, &after);
    mt_stream_destroy(d1, &s1);
    assert_int_equal(mt_backend_free(d0, src), 0);
    assert_int_equal(mt_backend_free(d1, dst), 0);
    free(host);
    free(back);
    mt_backend_destroy(&b);
}

static void block_on_sem(void *ud)
{
    sem_wait((sem_t *)ud);
}

static void set_flag(void *ud)
{
    atomic_store((atomic_int *)ud, 1);
}

static void test_cross_device_event_wait(void **state)
{
    (void)state;
    mt_backend_t *b = group_new(2, 8 * MIB, 0, 0);
    mt_backend_t *d0 = dev(b, 0), *d1 = dev(b, 1);
    sem_t gate;
    sem_init(&gate, 0, 0);
    atomic_int flag = 0;
    mt_stream_t *s0 = NULL, *s1 = NULL;
    mt_event_t *e0 = NULL, *e1 = NULL;
    assert_int_equal(mt_stream_create(d0, &s0), 0);
    assert_int_equal(mt_stream_create(d1, &s1), 0);
    assert_int_equal(mt_event_create(d0, &e0), 0);
    assert_int_equal(mt_event_create(d1, &e1), 0);
    /* Hold device 0's stream, capture it, and make device 1's stream wait on that. */
    assert_int_equal(mt_stream_launch_host_func(d0, s0, block_on_sem, &gate), 0);
    assert_int_equal(mt_event_record(d0, e0, s0), 0);
    assert_int_equal(mt_stream_wait_event(d1, s1, e0), 0);
    assert_int_equal(mt_stream_launch_host_func(d1, s1, set_flag, &flag), 0);
    assert_int_equal(mt_event_record(d1, e1, s1), 0);
    usleep(20000);
    assert_int_equal(atomic_load(&flag), 0);
    assert_int_equal(mt_event_query(d1, e1), MT_EAGAIN);
    sem_post(&gate);
    assert_int_equal(mt_event_synchronize(d1, e1), 0);
    assert_int_equal(atomic_load(&flag), 1);
    assert_true(mt_event_time_ns(d1, e1) >= mt_event_time_ns(d0, e0));
    /* An event is recorded on a stream of its own device only. */
    assert_int_equal(mt_event_record(d1, e0, s1), MT_EINVAL);
    assert_int_equal(mt_event_record(d0, e0, s1), MT_EINVAL);
    /* Destroying an event through another device's handle takes it off its own list. */
    mt_event_destroy(d1, &e0);
    mt_event_destroy(d1, &e1);
    mt_stream_destroy(d0, &s0);
    mt_stream_destroy(d1, &s1);
    sem_destroy(&gate);
    mt_backend_destroy(&b);
}

static void test_bad_ordinals(void **state)
{
    (void)state;
    mt_backend_t *b = group_new(2, 8 * MIB, 0, 0);
    mt_backend_t *d = (mt_backend_t *)&d;
    last_log[0] = '\0';
    assert_int_equal(mt_backend_get_device(b, 2, &d), MT_EINVAL);
    assert_null(d);
    assert_non_null(strstr(last_log, "device ordinal 2 out of range"));
    assert_non_null(strstr(last_log, "has 2 devices"));
    assert_int_equal(mt_backend_get_device(b, -1, &d), MT_EINVAL);
    assert_non_null(strstr(last_log, "ordinal -1"));
    void *p = NULL;
    assert_int_equal(mt_backend_malloc(b, 4096, &p), 0);
    last_log[0] = '\0';
    assert_int_equal(mt_memcpy_peer_async(b, p, 7, p, 0, 16, NULL), MT_EINVAL);
    assert_non_null(strstr(last_log, "ordinal 7"));
    assert_int_equal(mt_backend_free(b, p), 0);
    mt_backend_destroy(&b);

    /* Creating on a device the group does not have. */
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    cfg.kind = MT_BACKEND_SIM;
    cfg.sim_capacity = 8 * MIB;
    cfg.sim_devices = 2;
    cfg.device = 3;
    cfg.log = keep_log;
    last_log[0] = '\0';
    assert_int_equal(mt_backend_create(&b, &cfg), MT_EINVAL);
    assert_null(b);
    assert_non_null(strstr(last_log, "device ordinal 3 out of range"));
    assert_non_null(strstr(last_log, "has 2 devices"));
    cfg.device = 0;
    cfg.sim_devices = MT_SIM_MAX_DEVICES + 1;
    assert_int_equal(mt_backend_create(&b, &cfg), MT_EINVAL);
    /* One device, as before: ordinal 1 is out of range. */
    cfg.sim_devices = 1;
    cfg.device = 1;
    assert_int_equal(mt_backend_create(&b, &cfg), MT_EINVAL);
    assert_non_null(strstr(last_log, "has 1 device"));
}

static void test_env_parsing(void **state)
{
    (void)state;
    char err[256];
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    assert_int_equal(cfg.sim_devices, 1);
    setenv("MEMTRACE_SIM_DEVICES", "3", 1);
    setenv("MEMTRACE_SIM_PEER_COST_NS", "2500", 1);
    setenv("MEMTRACE_SIM_PEER_BANDWIDTH", "4G", 1);
    assert_int_equal(mt_backend_cfg_from_env(&cfg, err, sizeof err), 0);
    assert_int_equal(cfg.sim_devices, 3);
    assert_int_equal(cfg.sim_peer_cost_ns, 2500);
    assert_int_equal(cfg.sim_peer_bandwidth, (uint64_t)4 << 30);
    /* sim_devices = 0 takes the default, one device: create reads no environment. */
    cfg.kind = MT_BACKEND_SIM;
    cfg.sim_capacity = 4 * MIB;
    cfg.sim_devices = 0;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    assert_int_equal(mt_backend_device_count(b), 1);
    mt_backend_destroy(&b);
    cfg.sim_devices = 3; /* as from_env set it */
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    assert_int_equal(mt_backend_device_count(b), 3);
    mt_backend_destroy(&b);

    static const char *bad[] = {
        "0", "-1", "+2", "2x", "0x2", " 2", "2 ", "1.5", "65", "99999999999999999999999", "2K"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("MEMTRACE_SIM_DEVICES", bad[i], 1);
        mt_backend_cfg_t c = mt_backend_cfg_default();
        assert_int_equal(c.sim_devices, 1); /* the defaults read no environment */
        c.sim_devices = 5;
        assert_int_equal(mt_backend_cfg_from_env(&c, err, sizeof err), MT_EINVAL);
        assert_int_equal(c.sim_devices, 5); /* left alone */
        assert_non_null(strstr(err, "MEMTRACE_SIM_DEVICES"));
        char quoted[64];
        snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
        assert_non_null(strstr(err, quoted));
    }
    setenv("MEMTRACE_SIM_DEVICES", "64", 1);
    assert_int_equal(mt_backend_cfg_from_env(&cfg, err, sizeof err), 0);
    assert_int_equal(cfg.sim_devices, 64);
    unsetenv("MEMTRACE_SIM_DEVICES");
    setenv("MEMTRACE_SIM_PEER_BANDWIDTH", "0", 1);
    assert_int_equal(mt_backend_cfg_from_env(&cfg, err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "MEMTRACE_SIM_PEER_BANDWIDTH"));
    setenv("MEMTRACE_SIM_PEER_BANDWIDTH", "fast", 1);
    assert_int_equal(mt_backend_cfg_from_env(&cfg, err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "'fast'"));
    unsetenv("MEMTRACE_SIM_PEER_BANDWIDTH");
    setenv("MEMTRACE_SIM_PEER_COST_NS", "10us", 1);
    assert_int_equal(mt_backend_cfg_from_env(&cfg, err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "MEMTRACE_SIM_PEER_COST_NS"));
    unsetenv("MEMTRACE_SIM_PEER_COST_NS");
    /* The cuda backend's shareable handles and the sim's context and other processes come
     * from the environment here, never at create nor in the defaults. */
    setenv("MEMTRACE_CUDA_HANDLE_TYPE", "posix_fd", 1);
    setenv("MEMTRACE_SIM_CONTEXT", "300M", 1);
    setenv("MEMTRACE_SIM_OTHER_PROCESSES", "1G", 1);
    mt_backend_cfg_t e = mt_backend_cfg_default();
    assert_int_equal(e.cuda_handle_type, MT_CUDA_HANDLE_NONE);
    assert_int_equal(e.sim_context, 0);
    assert_int_equal(e.sim_other_processes, 0);
    assert_int_equal(mt_backend_cfg_from_env(&e, err, sizeof err), 0);
    assert_int_equal(e.cuda_handle_type, MT_CUDA_HANDLE_POSIX_FD);
    assert_int_equal(e.sim_context, 300 * MIB);
    assert_int_equal(e.sim_other_processes, 1024 * MIB);
    setenv("MEMTRACE_CUDA_HANDLE_TYPE", "posix", 1);
    assert_int_equal(mt_backend_cfg_from_env(&e, err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "MEMTRACE_CUDA_HANDLE_TYPE: must be none, posix_fd or fabric, not "
                                "'posix'"));
    unsetenv("MEMTRACE_CUDA_HANDLE_TYPE");
    assert_int_equal(e.cuda_peer_access, MT_CUDA_PEER_AUTO);
    setenv("MEMTRACE_CUDA_PEER_ACCESS", "capable", 1);
    assert_int_equal(mt_backend_cfg_from_env(&e, err, sizeof err), 0);
    assert_int_equal(e.cuda_peer_access, MT_CUDA_PEER_CAPABLE);
    setenv("MEMTRACE_CUDA_PEER_ACCESS", "all", 1);
    assert_int_equal(mt_backend_cfg_from_env(&e, err, sizeof err), MT_EINVAL);
    assert_non_null(
        strstr(err, "MEMTRACE_CUDA_PEER_ACCESS: must be enabled or capable, not 'all'"));
    unsetenv("MEMTRACE_CUDA_PEER_ACCESS");
    setenv("MEMTRACE_SIM_CONTEXT", "lots", 1);
    assert_int_equal(mt_backend_cfg_from_env(&e, err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "MEMTRACE_SIM_CONTEXT"));
    unsetenv("MEMTRACE_SIM_CONTEXT");
    unsetenv("MEMTRACE_SIM_OTHER_PROCESSES");
}

/* A configuration is what mt_backend_create follows: a malformed MEMTRACE_BACKEND in the
 * environment is mt_backend_cfg_from_env's to report, not a reason to refuse a cfg that
 * names its kind. */
static void test_cfg_over_env(void **state)
{
    (void)state;
    setenv("MEMTRACE_BACKEND", "bogus", 1);
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    cfg.kind = MT_BACKEND_SIM;
    cfg.sim_capacity = 4 * MIB;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    mt_backend_destroy(&b);
    char err[128];
    assert_int_equal(mt_backend_cfg_from_env(&cfg, err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "MEMTRACE_BACKEND"));
    unsetenv("MEMTRACE_BACKEND");
}

typedef struct {
    unsigned n, not_dev1;
} dev_count_t;

static void count_emit(void *ud, const mt_event_rec_t *ev)
{
    dev_count_t *c = ud;
    c->n++;
    if (ev->device != 1)
        c->not_dev1++;
}

static void test_allocator_on_device_1(void **state)
{
    (void)state;
    mt_backend_t *b = group_new(2, 64 * MIB, 0, 0);
    mt_backend_t *d1 = dev(b, 1);
    dev_count_t c = {0, 0};
    mt_event_sink_t sink = {.emit = count_emit, .ud = &c};
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = d1;
    ac.sink = &sink;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &ac), 0);
    void *p = NULL, *q = NULL;
    assert_int_equal(mt_alloc_malloc(a, 3 * MIB, NULL, 0, &p), 0);
    assert_int_equal(mt_alloc_malloc(a, 1000, NULL, 0, &q), 0);
    assert_true(mt_backend_is_device_ptr(d1, p));
    assert_false(mt_backend_is_device_ptr(b, p));
    assert_true(mt__sim_used_bytes(d1) >= 3 * MIB);
    assert_int_equal(mt__sim_used_bytes(b), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(mt_alloc_free(a, q), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    assert_true(c.n >= 4); /* segment + alloc + free + release at least */
    assert_int_equal(c.not_dev1, 0);
    mt_backend_destroy(&b);
}

int main(void)
{
    unsetenv("MEMTRACE_SIM_DEVICES");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capacity_and_oom_per_device),
        cmocka_unit_test(test_peer_copy_bytes_and_order),
        cmocka_unit_test(test_cross_device_event_wait),
        cmocka_unit_test(test_bad_ordinals),
        cmocka_unit_test(test_env_parsing),
        cmocka_unit_test(test_cfg_over_env),
        cmocka_unit_test(test_allocator_on_device_1),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
