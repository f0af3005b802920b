/* The cuda backend against the fake driver (fake_libcuda.c): call order and sizes of the
 * driver calls, error mapping, pending events, expandable-segment mapping, and ENODEV
 * when the driver is absent or has no device. MEMTRACE_LIBCUDA points at the fake. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "backend/backend_cuda.h"
#include "backend/cuda_driver.h"
#include "tests/common/test_main.h"

#define MiB ((size_t)1 << 20)

#include "tests/cuda/fake_ctl.h"

static mt_backend_t *make(void)
{
    fk.reset(64 * MiB, 1);
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    cfg.kind = MT_BACKEND_CUDA;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    assert_string_equal(mt_backend_name(b), "cuda");
    assert_true(mt__cuda_is_cuda(b));
    fk.reset(64 * MiB, 1); /* logs start after creation */
    return b;
}

static void test_enodev_without_library(void **state)
{
    (void)state;
    char *saved = strdup(getenv("MEMTRACE_LIBCUDA"));
    setenv("MEMTRACE_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    cfg.kind = MT_BACKEND_CUDA;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &cfg), MT_ENODEV);
    assert_null(b);
    /* auto falls back to sim */
    cfg.kind = MT_BACKEND_AUTO;
    cfg.sim_capacity = 64 * MiB;
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    assert_string_equal(mt_backend_name(b), "sim");
    mt_backend_destroy(&b);
    setenv("MEMTRACE_LIBCUDA", saved, 1);
    free(saved);
}

static void test_enodev_without_device(void **state)
{
    (void)state;
    fk.reset(64 * MiB, 0);
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    cfg.kind = MT_BACKEND_CUDA;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &cfg), MT_ENODEV);
    fk.reset(64 * MiB, 1);
    cfg.device = 3; /* only device 0 exists */
    assert_int_equal(mt_backend_create(&b, &cfg), MT_ENODEV);
    cfg.device = 0;
    cfg.kind = MT_BACKEND_AUTO;
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    assert_string_equal(mt_backend_name(b), "cuda"); /* auto picks the answering device */
    mt_backend_destroy(&b);
}

static void test_malloc_free_info(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    void *p = NULL;
    assert_int_equal(mt_backend_malloc(b, 3 * MiB, &p), 0);
    uint64_t sz = 0;
    assert_int_not_equal(find_call("cuMemAlloc_v2", 0, NULL, &sz), SIZE_MAX);
    assert_int_equal(sz, 3 * MiB);
    assert_true(mt_backend_is_device_ptr(b, p));
    assert_true(mt_backend_is_device_ptr(b, (char *)p + 3 * MiB - 1));
    assert_false(mt_backend_is_device_ptr(b, (char *)p + 3 * MiB));
    size_t fr = 0, tot = 0;
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(tot, 64 * MiB);
    assert_int_equal(fr, 61 * MiB);
    int x = 0;
    assert_int_equal(mt_backend_free(b, &x), MT_ENOENT); /* not ours: no driver call */
    assert_int_equal(fk.count("cuMemFree_v2"), 0);
    assert_int_equal(mt_backend_free(b, p), 0);
    assert_int_equal(fk.count("cuMemFree_v2"), 1);
    assert_int_equal(mt_backend_free(b, p), MT_ENOENT);
    assert_int_equal(fk.used(), 0);
    assert_int_equal(fk.ctx_depth(), 0); /* every push popped */
    mt_backend_destroy(&b);
}

/* This process's bytes as NVML lists them, found by the device's bus id, also when more
 * processes run than the first answer has room for; a pid NVML does not list is not known. */
static void test_process_used_from_nvml(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    setenv("FAKE_NVML_SELF", "12345678", 1);
    setenv("FAKE_NVML_OTHERS", "100", 1); /* past the first answer's 64 */
    uint64_t self = 0;
    assert_int_equal(mt_backend_process_used(b, &self), 0);
    assert_int_equal(self, 12345678);
    assert_int_not_equal(find_call("cuDeviceGetPCIBusId", 0, NULL, NULL), SIZE_MAX);
    setenv("FAKE_NVML_HIDE_SELF", "1", 1);
    assert_int_equal(mt_backend_process_used(b, &self), MT_ENOTSUP);
    unsetenv("FAKE_NVML_HIDE_SELF");
    unsetenv("FAKE_NVML_OTHERS");
    unsetenv("FAKE_NVML_SELF");
    mt_backend_destroy(&b);
}

static void test_error_mapping(void **state)
{
    (void)state;
    assert_int_equal(mt__cuda_result_to_mt(CUDA_SUCCESS), 0);
    assert_int_equal(mt__cuda_result_to_mt(CUDA_ERROR_OUT_OF_MEMORY), MT_ENOMEM);
    assert_int_equal(mt__cuda_result_to_mt(CUDA_ERROR_INVALID_VALUE), MT_EINVAL);
    assert_int_equal(mt__cuda_result_to_mt(CUDA_ERROR_NOT_READY), MT_EAGAIN);
    assert_int_equal(mt__cuda_result_to_mt(CUDA_ERROR_NO_DEVICE), MT_ENODEV);
    assert_int_equal(mt__cuda_result_to_mt(CUDA_ERROR_NOT_SUPPORTED), MT_ENOTSUP);
    assert_int_equal(mt__cuda_result_to_mt(CUDA_ERROR_LAUNCH_FAILED), MT_EIO);

    mt_backend_t *b = make();
    void *p = NULL;
    fk.fail_next("cuMemAlloc_v2", 1, CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(mt_backend_malloc(b, MiB, &p), MT_ENOMEM);
    mt_backend_counters_t c;
    mt_backend_counters(b, &c);
    assert_int_equal(c.malloc_failures, 1);
    fk.fail_next("cuMemAlloc_v2", 1, CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(mt_backend_malloc(b, MiB, &p), MT_EIO);
    /* real exhaustion of the fake device */
    assert_int_equal(mt_backend_malloc(b, 65 * MiB, &p), MT_ENOMEM);
    assert_int_equal(mt_backend_malloc(b, MiB, &p), 0);
    assert_int_equal(mt_backend_free(b, p), 0);
    fk.fail_next("cuStreamCreate", 1, CUDA_ERROR_INVALID_CONTEXT);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), MT_EINVAL);
    assert_int_equal(fk.ctx_depth(), 0);
    mt_backend_destroy(&b);
}

static void test_streams_events_pending(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    mt_stream_t *s = NULL;
    mt_event_t *ev = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    assert_int_equal(mt_stream_id(s), 1);
    assert_int_equal(mt_event_create_timed(b, &ev), 0);
    assert_int_equal(mt_event_query(b, ev), 0); /* never recorded = complete */
    uint8_t *d = NULL;
    assert_int_equal(mt_backend_malloc(b, MiB, (void **)&d), 0);
    uint8_t src[4096], dst[4096];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (uint8_t)(i * 7);

    fk.hold(true);
    assert_int_equal(mt_memcpy_async(b, d, src, sizeof src, MT_MEMCPY_HOST_TO_DEVICE, s), 0);
    assert_int_equal(mt_memset_async(b, d + 100, 0xAB, 10, s), 0);
    assert_int_equal(mt_event_record(b, ev, s), 0);
    assert_int_equal(mt_event_query(b, ev), MT_EAGAIN);
    assert_int_equal(mt_event_time_ns(b, ev), 0);
    fk.hold(false); /* the work runs on the stream's own thread, after this returns */
    assert_int_equal(mt_event_synchronize(b, ev), 0);
    assert_int_equal(mt_event_query(b, ev), 0);
    assert_true(mt_event_time_ns(b, ev) > 0);

    assert_int_equal(mt_memcpy(b, dst, d, sizeof dst, MT_MEMCPY_DEVICE_TO_HOST), 0);
    for (size_t i = 0; i < sizeof src; i++)
        assert_int_equal(dst[i], (i >= 100 && i < 110) ? 0xAB : src[i]);

    /* stream_wait_event reaches the driver with the right handles */
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s2), 0);
    assert_int_equal(mt_stream_wait_event(b, s2, ev), 0);
    uint64_t hs = 0;
    assert_int_not_equal(find_call("cuStreamWaitEvent", 0, &hs, NULL), SIZE_MAX);
    assert_int_equal(hs, mt__cuda_stream_handle(s2));

    /* a program's own stream is wrapped once, and never destroyed by us */
    mt_stream_t *w1 = NULL, *w2 = NULL;
    assert_int_equal(mt__cuda_stream_wrap(b, 0x1234, &w1), 0);
    assert_int_equal(mt__cuda_stream_wrap(b, 0x1234, &w2), 0);
    assert_ptr_equal(w1, w2);
    assert_int_equal(mt__cuda_stream_handle(w1), 0x1234);
    size_t destroys = fk.count("cuStreamDestroy");
    mt_stream_destroy(b, &w1);
    assert_int_equal(fk.count("cuStreamDestroy"), destroys);

    mt_stream_destroy(b, &s2);
    mt_event_destroy(b, &ev);
    mt_stream_destroy(b, &s);
    assert_int_equal(mt_backend_free(b, d), 0);
    assert_int_equal(fk.ctx_depth(), 0);
    mt_backend_destroy(&b);
}

/* Expandable segments: reserve, then one cuMemCreate + cuMemMap per 2 MiB page and one
 * cuMemSetAccess for the range; unmap page ranges independently; release last. */
static void test_vm_mapping_order(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    assert_int_equal(mt_backend_vm_granularity(b), 2 * MiB);
    uint8_t *base = NULL;
    assert_int_equal(mt_backend_vm_reserve(b, 8 * MiB, (void **)&base), 0);
    assert_int_equal((uintptr_t)base % (2 * MiB), 0);
    assert_false(mt_backend_is_device_ptr(b, base));
    assert_int_equal(mt_backend_vm_map(b, base + 2 * MiB, 4 * MiB), 0);

    const char *want[] = {"cuMemAddressReserve", "cuMemCreate", "cuMemMap",
                          "cuMemCreate",         "cuMemMap",    "cuMemSetAccess"};
    uint64_t want_a[] = {2 * MiB,
                         CU_MEM_ALLOCATION_TYPE_PINNED,
                         (uintptr_t)base + 2 * MiB,
                         CU_MEM_ALLOCATION_TYPE_PINNED,
                         (uintptr_t)base + 4 * MiB,
                         (uintptr_t)base + 2 * MiB};
    uint64_t want_b[] = {8 * MiB, 2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB, 4 * MiB};
    assert_int_equal(fk.ncalls(), 6);
    for (size_t i = 0; i < 6; i++) {
        uint64_t a, bb;
        assert_string_equal(fk.call(i, &a, &bb), want[i]);
        assert_int_equal(a, want_a[i]);
        assert_int_equal(bb, want_b[i]);
    }
    assert_true(mt_backend_is_device_ptr(b, base + 2 * MiB));
    assert_false(mt_backend_is_device_ptr(b, base + 6 * MiB));
    memset(fk.shadow(base + 2 * MiB), 0x5A, 4 * MiB); /* really backed */
    assert_int_equal(fk.used(), 4 * MiB);

    /* mapping a mapped page again is refused without driver calls */
    size_t n = fk.ncalls();
    assert_int_equal(mt_backend_vm_map(b, base + 4 * MiB, 2 * MiB), MT_EBUSY);
    assert_int_equal(fk.ncalls(), n);

    /* unmap the upper page only */
    assert_int_equal(mt_backend_vm_unmap(b, base + 4 * MiB, 2 * MiB), 0);
    uint64_t a = 0, sz = 0;
    size_t iu = find_call("cuMemUnmap", n, &a, &sz);
    assert_int_not_equal(iu, SIZE_MAX);
    assert_int_equal(a, (uintptr_t)base + 4 * MiB);
    assert_int_equal(sz, 2 * MiB);
    assert_int_not_equal(find_call("cuMemRelease", iu, NULL, &sz), SIZE_MAX);
    assert_int_equal(fk.used(), 2 * MiB);
    assert_true(mt_backend_is_device_ptr(b, base + 2 * MiB));
    assert_false(mt_backend_is_device_ptr(b, base + 4 * MiB));

    /* release refuses while a page is mapped */
    assert_int_equal(mt_backend_vm_release(b, base, 8 * MiB), MT_EBUSY);
    assert_int_equal(fk.count("cuMemAddressFree"), 0);
    assert_int_equal(mt_backend_vm_unmap(b, base + 2 * MiB, 2 * MiB), 0);
    assert_int_equal(mt_backend_vm_unmap(b, base + 2 * MiB, 2 * MiB), MT_EINVAL);
    assert_int_equal(mt_backend_vm_release(b, base, 8 * MiB), 0);
    assert_int_not_equal(find_call("cuMemAddressFree", 0, &a, &sz), SIZE_MAX);
    assert_int_equal(a, (uintptr_t)base);
    assert_int_equal(sz, 8 * MiB);
    assert_int_equal(fk.count("cuMemCreate"), fk.count("cuMemRelease"));
    assert_int_equal(fk.used(), 0);

    mt_backend_counters_t c;
    mt_backend_counters(b, &c);
    assert_int_equal(c.vm_reserve_calls, 1);
    assert_int_equal(c.vm_map_calls, 2);
    assert_int_equal(c.vm_unmap_calls, 3);
    assert_int_equal(c.vm_release_calls, 2);
    assert_int_equal(fk.ctx_depth(), 0);
    mt_backend_destroy(&b);
}

/* A failure in the middle of a multi-page map leaves nothing mapped. */
static void test_vm_map_all_or_nothing(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    uint8_t *base = NULL;
    assert_int_equal(mt_backend_vm_reserve(b, 8 * MiB, (void **)&base), 0);
    fk.reset(5 * MiB, 1); /* room for two pages only */
    assert_int_equal(mt_backend_vm_map(b, base, 6 * MiB), MT_ENOMEM);
    assert_int_equal(fk.count("cuMemCreate"), 3);
    assert_int_equal(fk.count("cuMemRelease"), 2);
    assert_int_equal(fk.count("cuMemUnmap"), 2);
    assert_int_equal(fk.used(), 0);
    assert_false(mt_backend_is_device_ptr(b, base));
    /* and map failures are reported as they come from the driver */
    fk.reset(64 * MiB, 1);
    fk.fail_next("cuMemMap", 1, CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(mt_backend_vm_map(b, base, 2 * MiB), MT_EINVAL);
    assert_int_equal(fk.used(), 0);
    assert_int_equal(mt_backend_vm_map(b, base, 2 * MiB), 0);
    /* destroy unmaps, releases and frees the range itself */
    mt_backend_destroy(&b);
    assert_int_equal(fk.used(), 0);
    assert_int_equal(fk.count("cuMemAddressFree"), 1);
}

static void nap_3ms(void *ud)
{
    (void)ud;
    struct timespec t = {0, 3 * 1000 * 1000};
    nanosleep(&t, NULL);
}

/* Item 13: five hours after the backend started, two events 3 ms apart are still 3 ms
 * apart to the ns (a float of ms since the start has 2 ms steps by then). */
static void test_event_time_precise_over_long_runs(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    fk.age_events((uint64_t)5 * 3600 * 1000000000u); /* the origin is 5 hours old */
    mt_event_t *e1 = NULL, *e2 = NULL;
    assert_int_equal(mt_event_create_timed(b, &e1), 0);
    assert_int_equal(mt_event_create_timed(b, &e2), 0);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(mt_event_record(b, e1, NULL), 0);
        assert_int_equal(mt_stream_launch_host_func(b, NULL, nap_3ms, NULL), 0);
        assert_int_equal(mt_event_record(b, e2, NULL), 0);
        assert_int_equal(mt_event_synchronize(b, e2), 0);
        uint64_t t1 = mt_event_time_ns(b, e1), t2 = mt_event_time_ns(b, e2);
        assert_true(t1 > 0 && t2 > t1);
        /* the truth, from a short elapsed time (float ms: sub-ns steps at 3 ms) */
        CUevent h1 = *(CUevent *)e1, h2 = *(CUevent *)e2;
        float ms = 0;
        CUresult (*elapsed)(float *, CUevent, CUevent) =
            (CUresult(*)(float *, CUevent, CUevent))dlsym(fk.lib, "cuEventElapsedTime_v2");
        CUresult (*push)(CUcontext) = (CUresult(*)(CUcontext))dlsym(fk.lib, "cuCtxPushCurrent_v2");
        CUresult (*pop)(CUcontext *) =
            (CUresult(*)(CUcontext *))dlsym(fk.lib, "cuCtxPopCurrent_v2");
        CUresult (*retain)(CUcontext *, CUdevice) =
            (CUresult(*)(CUcontext *, CUdevice))dlsym(fk.lib, "cuDevicePrimaryCtxRetain");
        CUcontext ctx;
        assert_int_equal(retain(&ctx, 0), CUDA_SUCCESS);
        assert_int_equal(push(ctx), CUDA_SUCCESS);
        assert_int_equal(elapsed(&ms, h1, h2), CUDA_SUCCESS);
        assert_int_equal(pop(&ctx), CUDA_SUCCESS);
        int64_t want = (int64_t)((double)ms * 1e6), got = (int64_t)(t2 - t1);
        assert_true(want >= 3000000);
        assert_true(got - want < 1000 && want - got < 1000); /* within 1 us */
    }
    mt_event_destroy(b, &e2);
    mt_event_destroy(b, &e1);
    mt_backend_destroy(&b);
}

/* The granularity is the device's own: 4 MiB on the fake's device 1. */
static void test_granularity_per_device(void **state)
{
    (void)state;
    fk.reset(64 * MiB, 2);
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    cfg.kind = MT_BACKEND_CUDA;
    cfg.device = 1;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    assert_int_equal(mt_backend_vm_granularity(b), 4 * MiB);
    uint8_t *base = NULL;
    assert_int_equal(mt_backend_vm_reserve(b, 16 * MiB, (void **)&base), 0);
    assert_int_equal(mt_backend_vm_map(b, base + 4 * MiB, 8 * MiB), 0);
    assert_int_equal(mt_backend_vm_unmap(b, base + 8 * MiB, 4 * MiB), 0);
    assert_int_equal(mt_backend_vm_unmap(b, base + 4 * MiB, 4 * MiB), 0);
    assert_int_equal(mt_backend_vm_release(b, base, 16 * MiB), 0);
    mt_backend_destroy(&b);
    fk.reset(64 * MiB, 1);
}

/* Item 8: the driver's own code survives the MT_E* mapping, for the drop-in to return. */
static void test_driver_codes_kept(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    const CUresult codes[] = {CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED,
                              CUDA_ERROR_NOT_INITIALIZED};
    for (size_t i = 0; i < 3; i++) {
        void *p = NULL;
        fk.fail_next("cuMemAlloc_v2", 1, codes[i]);
        assert_int_not_equal(mt_backend_malloc(b, MiB, &p), 0);
        assert_int_equal(mt__cuda_last_result(), codes[i]);
        assert_int_equal(mt__cuda_last_result(), 0); /* read once */
    }
    mt_backend_destroy(&b);
}

/* Item 5: a handle the program destroyed (and the driver may hand out again) is a new
 * stream to the backend, not the old one. */
static void test_destroyed_stream_forgotten(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    mt_stream_t *w1 = NULL, *w2 = NULL;
    assert_int_equal(mt__cuda_stream_wrap(b, 0x4321, &w1), 0);
    uint32_t id1 = mt_stream_id(w1);
    assert_int_equal(mt__cuda_stream_forget(b, 0x4321), 0);
    assert_int_equal(mt__cuda_stream_forget(b, 0x4321), MT_ENOENT);
    assert_int_equal(mt__cuda_stream_wrap(b, 0x4321, &w2), 0);
    assert_ptr_not_equal(w1, w2);
    assert_int_not_equal(mt_stream_id(w2), id1);
    assert_int_equal(mt__cuda_stream_handle(w1), 0x4321); /* the old wrapper stays valid */
    mt_backend_destroy(&b);
}

static void test_host_memory(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    void *h = NULL;
    assert_int_equal(mt_backend_host_malloc(b, 10000, &h), 0);
    memset(h, 1, 10000);
    int x;
    assert_int_equal(mt_backend_host_free(b, &x), MT_ENOENT);
    assert_int_equal(mt_backend_host_free(b, h), 0);
    assert_int_equal(fk.count("cuMemFreeHost"), 1);
    mt_backend_destroy(&b);
}

/* ---- per-thread default streams of other and of exited threads ---- */

static void nap_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000 * 1000};
    nanosleep(&t, NULL);
}

/* A gate a host function waits at on a stream's worker; done once it passed. */
typedef struct gate_s {
    atomic_bool open, done;
} gate_t;

static void gate_wait(void *ud)
{
    gate_t *g = ud;
    while (!atomic_load(&g->open))
        nap_ms(1);
    atomic_store(&g->done, true);
}

static void *open_later(void *ud)
{
    nap_ms(100);
    atomic_store(&((gate_t *)ud)->open, true);
    return NULL;
}

/* What one thread does on its per-thread stream: allocate a MiB (and keep a second one live
 * when keep), memset the first to value behind the gate (if any), free it. */
typedef struct ptds_job_s {
    mt_backend_t *b;
    mt_alloc_t *a;
    gate_t *gate;
    int value;
    bool keep;
    mt_stream_t *s;
    void *p, *live;
} ptds_job_t;

static void *ptds_worker(void *arg)
{
    ptds_job_t *j = arg;
    if (mt__cuda_stream_wrap(j->b, (uintptr_t)CU_STREAM_PER_THREAD, &j->s) != 0 ||
        mt_alloc_malloc(j->a, MiB, j->s, MT_TAG_OTHER, &j->p) != 0)
        return (void *)1;
    if (j->keep && mt_alloc_malloc(j->a, MiB, j->s, MT_TAG_OTHER, &j->live) != 0)
        return (void *)2;
    if (j->gate && mt_stream_launch_host_func(j->b, j->s, gate_wait, j->gate) != 0)
        return (void *)3;
    if (mt_memset_async(j->b, j->p, j->value, MiB, j->s) != 0 || mt_alloc_free(j->a, j->p) != 0)
        return (void *)4;
    return NULL;
}

static void run_ptds(ptds_job_t *j)
{
    pthread_t t;
    void *res = (void *)-1;
    assert_int_equal(pthread_create(&t, NULL, ptds_worker, j), 0);
    assert_int_equal(pthread_join(t, &res), 0);
    assert_null(res);
}

static mt_alloc_t *plain_alloc(mt_backend_t *b)
{
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    assert_int_equal(mt_alloc_cfg_parse(&cfg, "rules:reference", NULL, 0), 0);
    cfg.backend = b;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &cfg), 0);
    return a;
}

/* N11: a thread that allocated and freed on its per-thread stream exits. The next thread to
 * use its own per-thread stream takes over the wrapper, so the cached MiB is reused (no new
 * cuMemAlloc), its stream first waits for the work the dead thread queued (a memset behind
 * a gate: the new thread's memset lands after it), and the block the dead thread left live
 * stays valid and frees into the same bins. */
static void test_exited_thread_stream_reused(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    mt_alloc_t *a = plain_alloc(b);
    static gate_t gate;
    atomic_store(&gate.open, false);
    atomic_store(&gate.done, false);
    ptds_job_t j1 = {.b = b, .a = a, .gate = &gate, .value = 1, .keep = true};
    run_ptds(&j1);
    size_t allocs = fk.count("cuMemAlloc_v2");
    ptds_job_t j2 = {.b = b, .a = a, .value = 2};
    run_ptds(&j2);
    size_t allocs2 = fk.count("cuMemAlloc_v2");
    nap_ms(100);
    bool early = atomic_load(&gate.done);
    atomic_store(&gate.open, true); /* before any check: a failed one leaves no work behind */
    fk.idle();
    assert_false(early);
    assert_ptr_equal(j2.s, j1.s);
    assert_ptr_equal(j2.p, j1.p);
    assert_int_equal(allocs2, allocs);
    uint8_t byte = 0;
    assert_int_equal(mt_memcpy(b, &byte, (char *)j1.p + MiB - 1, 1, MT_MEMCPY_DEVICE_TO_HOST), 0);
    assert_int_equal(byte, 2);
    /* the dead thread's live block */
    assert_int_equal(mt_memset_async(b, j1.live, 3, MiB, NULL), 0);
    assert_int_equal(mt_stream_synchronize(b, NULL), 0);
    assert_int_equal(mt_alloc_free(a, j1.live), 0);
    ptds_job_t j3 = {.b = b, .a = a, .value = 4};
    run_ptds(&j3);
    assert_ptr_equal(j3.s, j1.s);
    assert_int_equal(fk.count("cuMemAlloc_v2"), allocs);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* A live thread that queued work behind gate on its own per-thread stream, and waits for
 * release before it exits. */
typedef struct holder_s {
    mt_backend_t *b;
    gate_t *gate, *release;
    mt_stream_t *s;
    void *p; /* when not NULL: memset to value behind the gate */
    int value;
    atomic_bool ready;
} holder_t;

static void *hold_wrapper(void *arg)
{
    holder_t *h = arg;
    if (mt__cuda_stream_wrap(h->b, (uintptr_t)CU_STREAM_PER_THREAD, &h->s) != 0 ||
        mt_stream_launch_host_func(h->b, h->s, gate_wait, h->gate) != 0)
        return (void *)1;
    if (h->p != NULL && mt_memset_async(h->b, h->p, h->value, MiB, h->s) != 0)
        return (void *)2;
    atomic_store(&h->ready, true);
    while (!atomic_load(&h->release->open))
        nap_ms(1);
    return NULL;
}

/* N11: a stream synchronize or wait on another (live) thread's per-thread stream reaches
 * that stream, not the caller's: the synchronize returns only once the work behind that
 * thread's gate ran, and the wait goes to the legacy stream, which every per-thread stream
 * waits for. A live thread's wrapper is never taken over. */
static void test_other_thread_stream_sync(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    gate_t gate = {false, false}, release = {false, false};
    holder_t h = {.b = b, .gate = &gate, .release = &release};
    pthread_t t1, opener;
    assert_int_equal(pthread_create(&t1, NULL, hold_wrapper, &h), 0);
    while (!atomic_load(&h.ready))
        nap_ms(1);
    mt_stream_t *mine = NULL;
    assert_int_equal(mt__cuda_stream_wrap(b, (uintptr_t)CU_STREAM_PER_THREAD, &mine), 0);
    assert_ptr_not_equal(mine, h.s);
    assert_int_equal(pthread_create(&opener, NULL, open_later, &gate), 0);
    assert_int_equal(mt_stream_synchronize(b, h.s), 0);
    assert_true(atomic_load(&gate.done));
    assert_int_equal(pthread_join(opener, NULL), 0);

    mt_event_t *ev = NULL;
    assert_int_equal(mt_event_create(b, &ev), 0);
    assert_int_equal(mt_event_record(b, ev, mine), 0);
    size_t from = fk.ncalls();
    assert_int_equal(mt_stream_wait_event(b, h.s, ev), 0);
    uint64_t hs = 0;
    assert_int_not_equal(find_call("cuStreamWaitEvent", from, &hs, NULL), SIZE_MAX);
    assert_int_equal(hs, (uint64_t)(uintptr_t)CU_STREAM_LEGACY);
    from = fk.ncalls();
    assert_int_equal(mt_stream_wait_event(b, mine, ev), 0); /* one's own: its handle */
    assert_int_not_equal(find_call("cuStreamWaitEvent", from, &hs, NULL), SIZE_MAX);
    assert_int_equal(hs, (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD);
    mt_event_destroy(b, &ev);
    atomic_store(&release.open, true);
    void *res = (void *)-1;
    assert_int_equal(pthread_join(t1, &res), 0);
    assert_null(res);
    mt_backend_destroy(&b);
}

/* What a host function saw of a gate when it ran: 1 closed, 2 passed. */
typedef struct seen_s {
    gate_t *gate;
    atomic_int seen;
} seen_t;

static void note_gate(void *ud)
{
    seen_t *n = ud;
    atomic_store(&n->seen, atomic_load(&n->gate->done) ? 2 : 1);
}

/* N11: a host function, a copy and a memset queued on another (live) thread's per-thread
 * wrapper run after the work that thread queued (a memset of p to 1 behind a gate), not
 * at once on the caller's idle per-thread stream: the host function sees the gate passed,
 * the copy reads the 1, and the memset lands after it. */
static void test_other_thread_stream_work(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    void *p = NULL, *r = NULL;
    assert_int_equal(mt_backend_malloc(b, MiB, &p), 0);
    assert_int_equal(mt_backend_malloc(b, MiB, &r), 0);
    assert_int_equal(mt_memset_async(b, p, 0, MiB, NULL), 0);
    assert_int_equal(mt_memset_async(b, r, 0, MiB, NULL), 0);
    assert_int_equal(mt_stream_synchronize(b, NULL), 0);
    gate_t gate = {false, false}, release = {false, false};
    holder_t h = {.b = b, .gate = &gate, .release = &release, .p = p, .value = 1};
    pthread_t t1;
    assert_int_equal(pthread_create(&t1, NULL, hold_wrapper, &h), 0);
    while (!atomic_load(&h.ready))
        nap_ms(1);
    mt_stream_t *mine = NULL;
    assert_int_equal(mt__cuda_stream_wrap(b, (uintptr_t)CU_STREAM_PER_THREAD, &mine), 0);
    assert_ptr_not_equal(mine, h.s);
    seen_t n = {.gate = &gate};
    assert_int_equal(mt_stream_launch_host_func(b, h.s, note_gate, &n), 0);
    assert_int_equal(mt_memcpy_async(b, r, p, MiB, MT_MEMCPY_DEVICE_TO_DEVICE, h.s), 0);
    assert_int_equal(mt_memset_async(b, p, 2, MiB, h.s), 0);
    nap_ms(100); /* work wrongly queued on the caller's idle stream has run by now */
    atomic_store(&gate.open, true);
    fk.idle();
    uint8_t rb = 0, pb = 0;
    assert_int_equal(mt_memcpy(b, &rb, (char *)r + MiB - 1, 1, MT_MEMCPY_DEVICE_TO_HOST), 0);
    assert_int_equal(mt_memcpy(b, &pb, (char *)p + MiB - 1, 1, MT_MEMCPY_DEVICE_TO_HOST), 0);
    atomic_store(&release.open, true);
    void *res = (void *)-1;
    assert_int_equal(pthread_join(t1, &res), 0);
    assert_null(res);
    assert_int_equal(atomic_load(&n.seen), 2);
    assert_int_equal(rb, 1);
    assert_int_equal(pb, 2);
    assert_int_equal(mt_backend_free(b, p), 0);
    assert_int_equal(mt_backend_free(b, r), 0);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_enodev_without_library),
        cmocka_unit_test(test_enodev_without_device),
        cmocka_unit_test(test_malloc_free_info),
        cmocka_unit_test(test_process_used_from_nvml),
        cmocka_unit_test(test_error_mapping),
        cmocka_unit_test(test_streams_events_pending),
        cmocka_unit_test(test_vm_mapping_order),
        cmocka_unit_test(test_vm_map_all_or_nothing),
        cmocka_unit_test(test_host_memory),
        cmocka_unit_test(test_driver_codes_kept),
        cmocka_unit_test(test_destroyed_stream_forgotten),
        cmocka_unit_test(test_event_time_precise_over_long_runs),
        cmocka_unit_test(test_granularity_per_device),
        cmocka_unit_test(test_exited_thread_stream_reused),
        cmocka_unit_test(test_other_thread_stream_sync),
        cmocka_unit_test(test_other_thread_stream_work),
    };
    return MT_TEST_RUN(tests, fake_ctl_open, fake_ctl_close);
}
