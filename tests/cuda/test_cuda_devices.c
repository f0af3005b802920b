/* The cuda backend's devices against the fake driver (
 * and 13): a retained primary context per device, reached lazily; memory of device i
 * allocated in device i's context; cuMemcpyPeerAsync between contexts; peer access that
 * reaches expandable segments' mappings; allocator events without timing; host-allocation
 * flags passed to the driver. MEMTRACE_LIBCUDA points at the fake. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "tests/cuda/fake_ctl.h"
#include "tests/common/test_main.h"

#define MiB ((size_t)1 << 20)

static char last_log[512]; /* the latest line the backend logged */

static void log_cb(void *ud, mt_log_level_e level, const char *msg)
{
    (void)ud;
    (void)level;
    snprintf(last_log, sizeof last_log, "%s", msg);
}

static mt_backend_t *make(int devices)
{
    fk.reset(256 * MiB, devices);
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    cfg.kind = MT_BACKEND_CUDA;
    cfg.log = log_cb;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    fk.reset(256 * MiB, devices); /* logs start after creation */
    return b;
}

/* Device 1's context is retained when device 1 is first reached, once; its memory is
 * allocated in its own context; an ordinal past the driver's count is MT_EINVAL. */
static void test_context_per_device(void **state)
{
    (void)state;
    mt_backend_t *b = make(3);
    assert_int_equal(mt_backend_device_count(b), 3);
    assert_int_equal(fk.count("cuDevicePrimaryCtxRetain"), 0); /* not before it is used */
    mt_backend_t *d1 = NULL, *again = NULL;
    assert_int_equal(mt_backend_get_device(b, 1, &d1), 0);
    assert_int_equal(mt_backend_get_device(b, 1, &again), 0);
    assert_ptr_equal(d1, again);
    assert_int_equal(mt_backend_device(d1), 1);
    uint64_t dev = 99;
    assert_int_not_equal(find_call("cuDevicePrimaryCtxRetain", 0, &dev, NULL), SIZE_MAX);
    assert_int_equal(dev, 1);
    assert_int_equal(fk.count("cuDevicePrimaryCtxRetain"), 1);

    void *p0 = NULL, *p1 = NULL;
    assert_int_equal(mt_backend_malloc(b, MiB, &p0), 0);
    assert_int_equal(mt_backend_malloc(d1, MiB, &p1), 0);
    assert_true(fk.can_access(0, p0) && !fk.can_access(1, p0));
    assert_true(fk.can_access(1, p1) && !fk.can_access(0, p1));
    assert_true(mt_backend_is_device_ptr(d1, p1));
    assert_false(mt_backend_is_device_ptr(d1, p0));

    mt_backend_t *bad = NULL;
    assert_int_equal(mt_backend_get_device(b, 3, &bad), MT_EINVAL);
    assert_null(bad);
    assert_non_null(strstr(last_log, "device ordinal 3 out of range"));
    assert_non_null(strstr(last_log, "has 3 devices"));
    assert_int_equal(mt_backend_get_device(b, -1, &bad), MT_EINVAL);
    assert_int_equal(mt_backend_free(d1, p1), 0);
    assert_int_equal(mt_backend_free(b, p0), 0);
    mt_backend_destroy(&d1); /* borrowed: a no-op */
    mt_backend_destroy(&b);
    assert_int_equal(fk.count("cuDevicePrimaryCtxRelease"), 2);
    assert_int_equal(fk.ctx_depth(), 0);
}

static void nap_20ms(void *ud)
{
    (void)ud;
    struct timespec t = {0, 20 * 1000 * 1000};
    nanosleep(&t, NULL);
}

/* A peer copy is one cuMemcpyPeerAsync naming both primary contexts, ordered on the
 * stream it was queued on, counted on the device that queued it. */
static void test_peer_copy(void **state)
{
    (void)state;
    mt_backend_t *b = make(2), *d1 = NULL;
    assert_int_equal(mt_backend_get_device(b, 1, &d1), 0);
    mt_stream_t *s1 = NULL;
    assert_int_equal(mt_stream_create(d1, &s1), 0);
    uint8_t *p0 = NULL, *p1 = NULL;
    assert_int_equal(mt_backend_malloc(b, MiB, (void **)&p0), 0);
    assert_int_equal(mt_backend_malloc(d1, MiB, (void **)&p1), 0);
    uint8_t src[8192], dst[8192];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (uint8_t)(i * 13 + 1);
    assert_int_equal(mt_memcpy(b, p0, src, sizeof src, MT_MEMCPY_HOST_TO_DEVICE), 0);

    fk.hold(true);
    assert_int_equal(mt_stream_launch_host_func(d1, s1, nap_20ms, NULL), 0); /* copy runs late */
    assert_int_equal(mt_memcpy_peer_async(d1, p1, 1, p0, 0, sizeof src, s1), 0);
    mt_event_t *done = NULL;
    assert_int_equal(mt_event_create(d1, &done), 0);
    assert_int_equal(mt_event_record(d1, done, s1), 0);
    assert_int_equal(mt_event_query(d1, done), MT_EAGAIN); /* queued, not run */
    /* Device 0's stream waits on device 1's event (across contexts, as CUDA allows), then
     * reads the copy's destination: it sees the copied bytes, whichever worker runs first. */
    mt_stream_t *s0 = NULL;
    assert_int_equal(mt_stream_create(b, &s0), 0);
    assert_int_equal(mt_stream_wait_event(b, s0, done), 0);
    uint8_t early[8192];
    memset(early, 0, sizeof early);
    assert_int_equal(mt_memcpy_async(b, early, p1, sizeof early, MT_MEMCPY_DEVICE_TO_HOST, s0), 0);
    fk.hold(false);
    assert_int_equal(mt_stream_synchronize(b, s0), 0);
    assert_memory_equal(early, src, sizeof src);
    mt_stream_destroy(b, &s0);
    assert_int_equal(mt_stream_synchronize(d1, s1), 0);
    assert_int_equal(mt_memcpy(d1, dst, p1, sizeof dst, MT_MEMCPY_DEVICE_TO_HOST), 0);
    assert_memory_equal(dst, src, sizeof src);

    uint64_t a = 0, n = 0;
    assert_int_not_equal(find_call("cuMemcpyPeerAsync", 0, &a, &n), SIZE_MAX);
    assert_int_equal(a, (uintptr_t)p1);
    assert_int_equal(n, sizeof src);
    mt_backend_counters_t c;
    mt_backend_counters(d1, &c);
    assert_int_equal(c.peer_copies, 1);
    assert_int_equal(c.peer_bytes, sizeof src);
    assert_int_equal(mt_memcpy_peer_async(d1, p1, 2, p0, 0, 16, s1), MT_EINVAL);

    mt_event_destroy(d1, &done);
    mt_stream_destroy(d1, &s1);
    assert_int_equal(mt_backend_free(d1, p1), 0);
    assert_int_equal(mt_backend_free(b, p0), 0);
    mt_backend_destroy(&b);
}

/* Issue 16 item 10: device 1 enables peer access to device 0. Pages device 0's expandable
 * segments mapped before, and pages mapped after, are reachable from device 1; the runtime
 * call alone (cuCtxEnablePeerAccess) leaves VMM mappings closed. */
static void test_peer_access_reaches_vmm(void **state)
{
    (void)state;
    mt_backend_t *b = make(2), *d1 = NULL;
    assert_int_equal(mt_backend_get_device(b, 1, &d1), 0);
    mt_alloc_cfg_t acfg = mt_alloc_cfg_default();
    acfg.backend = b;
    acfg.expandable_segments = true;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &acfg), 0);
    void *before = NULL, *after = NULL;
    assert_int_equal(mt_alloc_malloc(a, 3 * MiB, NULL, MT_TAG_OTHER, &before), 0);
    assert_true(fk.can_access(0, before));
    assert_false(fk.can_access(1, before));

    assert_int_equal(mt_backend_enable_peer_access(d1, 0), 0);
    assert_int_equal(fk.count("cuCtxEnablePeerAccess"), 1);
    assert_true(fk.can_access(1, before));
    assert_true(fk.can_access(1, (char *)before + 3 * MiB - 1));
    assert_int_equal(mt_alloc_malloc(a, 40 * MiB, NULL, MT_TAG_OTHER, &after), 0);
    assert_true(fk.can_access(1, after));
    assert_true(fk.can_access(1, (char *)after + 40 * MiB - 1));
    assert_true(fk.can_access(0, after));
    /* again (the program's runtime already enabled it): no error */
    assert_int_equal(mt_backend_enable_peer_access(d1, 0), 0);
    assert_int_equal(mt_backend_enable_peer_access(d1, 2), MT_EINVAL);
    assert_int_equal(mt_backend_enable_peer_access(d1, 1), 0); /* itself: nothing to do */

    assert_int_equal(mt_alloc_free(a, before), 0);
    assert_int_equal(mt_alloc_free(a, after), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static bool every_event_untimed(size_t from)
{
    size_t n = 0;
    uint64_t flags = 0;
    for (size_t i = find_call("cuEventCreate", from, &flags, NULL); i != SIZE_MAX;
         i = find_call("cuEventCreate", i + 1, &flags, NULL), n++)
        if (!(flags & CU_EVENT_DISABLE_TIMING))
            return false;
    return n > 0;
}

/* Issue 16 item 13: the allocator's events only order streams; they are created with
 * timing disabled. Events asked for with a time still have one. */
static void test_allocator_events_untimed(void **state)
{
    (void)state;
    mt_backend_t *b = make(1);
    mt_alloc_cfg_t acfg = mt_alloc_cfg_default();
    acfg.backend = b;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &acfg), 0);
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s2), 0);
    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(a, MiB, NULL, MT_TAG_OTHER, &p), 0);
    assert_int_equal(mt_alloc_record_stream(a, p, s2), 0);
    assert_int_equal(mt_alloc_free(a, p), 0); /* an event on s2 guards the block */
    assert_true(every_event_untimed(0));

    mt_event_t *t0 = NULL, *t1 = NULL;
    size_t from = fk.ncalls();
    assert_int_equal(mt_event_create_timed(b, &t0), 0);
    assert_int_equal(mt_event_create_timed(b, &t1), 0);
    assert_false(every_event_untimed(from));
    assert_int_equal(mt_event_record(b, t0, s2), 0);
    assert_int_equal(mt_event_record(b, t1, s2), 0);
    assert_int_equal(mt_event_synchronize(b, t1), 0);
    assert_true(mt_event_time_ns(b, t0) > 0);
    assert_true(mt_event_time_ns(b, t1) >= mt_event_time_ns(b, t0));
    mt_event_t *plain = NULL;
    assert_int_equal(mt_event_create(b, &plain), 0);
    assert_int_equal(mt_event_record(b, plain, s2), 0);
    assert_int_equal(mt_event_synchronize(b, plain), 0);
    assert_int_equal(mt_event_time_ns(b, plain), 0); /* no time: never asked the driver */

    mt_event_destroy(b, &plain);
    mt_event_destroy(b, &t0);
    mt_event_destroy(b, &t1);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

/* Issue 16 item 13: cudaHostAlloc's flags reach cuMemHostAlloc (portable added). */
static void test_host_alloc_flags_passed(void **state)
{
    (void)state;
    mt_backend_t *b = make(1);
    void *p = NULL;
    assert_int_equal(mt_backend_host_malloc_flags(
                         b, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED, &p),
                     0);
    uint64_t size = 0, flags = 0;
    assert_int_not_equal(find_call("cuMemHostAlloc", 0, &size, &flags), SIZE_MAX);
    assert_int_equal(size, 4096);
    assert_int_equal(flags, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                                CU_MEMHOSTALLOC_WRITECOMBINED);
    assert_int_equal(mt_backend_host_free(b, p), 0);
    void *q = NULL;
    assert_int_equal(mt_backend_host_malloc_flags(b, 4096, 8, &q), MT_EINVAL);
    assert_null(q);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_context_per_device),
        cmocka_unit_test(test_peer_copy),
        cmocka_unit_test(test_peer_access_reaches_vmm),
        cmocka_unit_test(test_allocator_events_untimed),
        cmocka_unit_test(test_host_alloc_flags_passed),
    };
    return MT_TEST_RUN(tests, fake_ctl_open, fake_ctl_close);
}
