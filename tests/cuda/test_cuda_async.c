/* The stream-ordered pool on the cuda backend, against the fake driver: the driver calls
 * the backend makes (the default pool, its attributes, cuMemAllocFromPoolAsync,
 * cuMemFreeAsync, cuMemPoolTrimTo), and the ones the allocator under
 * backend:cudaMallocAsync turns into. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "memtrace/alloc.h"
#include "backend/backend_cuda.h"
#include "tests/cuda/fake_ctl.h"
#include "tests/common/test_main.h"

#define MiB ((size_t)1 << 20)

static void (*pool_reset)(void);

static int open_all(void **state)
{
    if (fake_ctl_open(state) != 0)
        return -1;
    *(void **)&pool_reset = dlsym(fk.lib, "fake_cuda_pool_reset");
    return pool_reset != NULL ? 0 : -1;
}

static mt_backend_t *make_backend(void)
{
    fk.reset(64 * MiB, 1);
    pool_reset();
    mt_backend_cfg_t bcfg = mt_backend_cfg_default();
    bcfg.kind = MT_BACKEND_CUDA;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bcfg), 0);
    fk.reset(64 * MiB, 1); /* logs start here */
    return b;
}

static void done(mt_backend_t **b)
{
    mt_backend_destroy(b);
    assert_int_equal(fk.used(), 0);
    assert_int_equal(fk.ctx_depth(), 0);
}

/* Allocation and free: the device's default pool, the request's stream on each call. */
static void test_alloc_free_calls(void **state)
{
    (void)state;
    mt_backend_t *b = make_backend();
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    uint64_t h = mt__cuda_stream_handle(s);
    assert_int_not_equal(h, 0);
    void *p = NULL;
    assert_int_equal(mt_backend_malloc_async(b, 3 * MiB, s, &p), 0);
    assert_non_null(p);
    uint64_t x = 0, y = 0;
    size_t i0 = find_call("cuDeviceGetDefaultMemPool", 0, &x, NULL);
    assert_int_not_equal(i0, SIZE_MAX);
    assert_int_equal(x, 0); /* device 0 */
    size_t i1 = find_call("cuMemAllocFromPoolAsync", i0 + 1, &x, &y);
    assert_int_not_equal(i1, SIZE_MAX);
    assert_int_equal(x, 3 * MiB);
    assert_int_equal(y, h);
    assert_int_equal(fk.count("cuMemAlloc_v2"), 0);
    assert_int_equal(mt_backend_free_async(b, p, s), 0);
    size_t i2 = find_call("cuMemFreeAsync", i1 + 1, &x, &y);
    assert_int_not_equal(i2, SIZE_MAX);
    assert_int_equal(x, (uintptr_t)p);
    assert_int_equal(y, h);
    /* The pool is looked up once per device. */
    assert_int_equal(mt_backend_malloc_async(b, MiB, NULL, &p), 0);
    assert_int_equal(fk.count("cuDeviceGetDefaultMemPool"), 1);
    assert_int_equal(find_call("cuMemAllocFromPoolAsync", i2 + 1, NULL, &y) != SIZE_MAX, 1);
    assert_int_equal(y, 0); /* the default stream */
    assert_int_equal(mt_backend_free_async(b, p, NULL), 0);
    mt_stream_destroy(b, &s);
    done(&b);
}

/* Threshold, trim, usage and the high-water reset, as attributes of the pool. */
static void test_attributes_and_trim(void **state)
{
    (void)state;
    mt_backend_t *b = make_backend();
    assert_int_equal(mt_backend_pool_set_release_threshold(b, UINT64_MAX), 0);
    uint64_t attr = 0, v = 0;
    assert_int_not_equal(find_call("cuMemPoolSetAttribute", 0, &attr, &v), SIZE_MAX);
    assert_int_equal(attr, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
    assert_int_equal(v, UINT64_MAX);

    void *p = NULL, *q = NULL;
    assert_int_equal(mt_backend_malloc_async(b, 4 * MiB, NULL, &p), 0);
    assert_int_equal(mt_backend_malloc_async(b, 2 * MiB, NULL, &q), 0);
    assert_int_equal(mt_backend_free_async(b, p, NULL), 0);
    assert_int_equal(mt_stream_synchronize(b, NULL), 0);
    mt_pool_usage_t u;
    assert_int_equal(mt_backend_pool_usage(b, &u), 0);
    assert_int_equal(u.used, 2 * MiB);
    assert_int_equal(u.reserved, 6 * MiB);
    assert_int_equal(u.used_high, 6 * MiB);
    assert_int_equal(u.reserved_high, 6 * MiB);
    assert_int_equal(fk.count("cuMemPoolGetAttribute"), 4);

    size_t n0 = fk.ncalls();
    assert_int_equal(mt_backend_pool_trim_to(b, 3 * MiB), 0);
    assert_int_not_equal(find_call("cuMemPoolTrimTo", n0, NULL, &v), SIZE_MAX);
    assert_int_equal(v, 3 * MiB);
    assert_int_equal(mt_backend_pool_usage(b, &u), 0);
    assert_int_equal(u.reserved, 3 * MiB);

    n0 = fk.ncalls();
    assert_int_equal(mt_backend_pool_reset_high(b), 0);
    size_t i = find_call("cuMemPoolSetAttribute", n0, &attr, &v);
    assert_int_equal(attr, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
    assert_int_equal(v, 0);
    assert_int_not_equal(find_call("cuMemPoolSetAttribute", i + 1, &attr, &v), SIZE_MAX);
    assert_int_equal(attr, CU_MEMPOOL_ATTR_USED_MEM_HIGH);
    assert_int_equal(mt_backend_pool_usage(b, &u), 0);
    assert_int_equal(u.used_high, 2 * MiB);
    assert_int_equal(u.reserved_high, 3 * MiB);
    assert_int_equal(mt_backend_free_async(b, q, NULL), 0);
    assert_int_equal(mt_stream_synchronize(b, NULL), 0);
    done(&b);
}

static mt_alloc_t *make_async_alloc(mt_backend_t *b)
{
    mt_alloc_cfg_t acfg = mt_alloc_cfg_default();
    acfg.backend = b;
    assert_int_equal(mt_alloc_cfg_parse(&acfg, "backend:cudaMallocAsync", NULL, 0), 0);
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &acfg), 0);
    return a;
}

/* The allocator under backend:cudaMallocAsync: PyTorch's threshold at creation, every
 * request to the pool, empty_cache as a context synchronize then a trim to 0. */
static void test_allocator_calls(void **state)
{
    (void)state;
    mt_backend_t *b = make_backend();
    mt_alloc_t *a = make_async_alloc(b);
    uint64_t attr = 0, v = 0;
    assert_int_not_equal(find_call("cuMemPoolSetAttribute", 0, &attr, &v), SIZE_MAX);
    assert_int_equal(attr, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
    assert_int_equal(v, UINT64_MAX);

    void *p = NULL, *q = NULL;
    assert_int_equal(mt_alloc_malloc(a, 5 * MiB, NULL, MT_TAG_OTHER, &p), 0);
    assert_int_equal(mt_alloc_malloc(a, 1000, NULL, MT_TAG_OTHER, &q), 0);
    assert_int_equal(fk.count("cuMemAllocFromPoolAsync"), 2);
    assert_int_equal(fk.count("cuMemAlloc_v2"), 0);
    assert_int_equal(fk.count("cuMemCreate"), 0);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(a, &st), 0);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 5 * MiB + 1024);
    assert_int_equal(st.reserved_bytes[MT_STAT_ALL].current, 5 * MiB + 1000); /* the pool's */
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(fk.count("cuMemFreeAsync"), 1);

    size_t n0 = fk.ncalls();
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    size_t i1 = find_call("cuCtxSynchronize", n0, NULL, NULL);
    assert_int_not_equal(i1, SIZE_MAX);
    size_t i2 = find_call("cuMemPoolTrimTo", i1 + 1, NULL, &v);
    assert_int_not_equal(i2, SIZE_MAX);
    assert_int_equal(v, 0);
    assert_int_equal(mt_alloc_stats(a, &st), 0);
    assert_int_equal(st.reserved_bytes[MT_STAT_ALL].current, 1000);
    assert_int_equal(st.reserved_bytes[MT_STAT_ALL].peak, 5 * MiB + 1000);

    /* A pool that cannot grow: an OOM, counted, not retried. */
    fk.fail_next("cuMemAllocFromPoolAsync", 1, CUDA_ERROR_OUT_OF_MEMORY);
    void *r = NULL;
    assert_int_equal(mt_alloc_malloc(a, MiB, NULL, MT_TAG_OTHER, &r), MT_ENOMEM);
    assert_int_equal(mt_alloc_stats(a, &st), 0);
    assert_int_equal(st.num_ooms, 1);
    assert_int_equal(st.num_alloc_retries, 0);
    assert_int_equal(mt_alloc_free(a, q), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    assert_int_equal(mt_device_synchronize(b), 0);
    done(&b);
}

/* record_stream: the free goes to a unifying stream that waits on an event of each stream
 * that used the block, as PyTorch's allocator does. */
static void test_record_stream_unifies(void **state)
{
    (void)state;
    mt_backend_t *b = make_backend();
    mt_alloc_t *a = make_async_alloc(b);
    mt_stream_t *s1 = NULL, *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    assert_int_equal(mt_stream_create(b, &s2), 0);
    uint64_t h1 = mt__cuda_stream_handle(s1), h2 = mt__cuda_stream_handle(s2);
    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(a, MiB, s1, MT_TAG_OTHER, &p), 0);
    assert_int_equal(mt_alloc_record_stream(a, p, s2), 0);
    size_t n0 = fk.ncalls();
    assert_int_equal(mt_alloc_free(a, p), 0);
    uint64_t x = 0, y = 0;
    size_t c = find_call("cuStreamCreate", n0, NULL, NULL);
    assert_int_not_equal(c, SIZE_MAX);
    /* cuEventRecord(ev, s) logs the stream second, cuStreamWaitEvent the stream first. */
    size_t r1 = find_call("cuEventRecord", n0, NULL, &y);
    assert_int_not_equal(r1, SIZE_MAX);
    assert_int_equal(y, h1);
    size_t r2 = find_call("cuEventRecord", r1 + 1, NULL, &y);
    assert_int_not_equal(r2, SIZE_MAX);
    assert_int_equal(y, h2);
    size_t w = find_call("cuStreamWaitEvent", r1 + 1, &x, NULL);
    assert_int_not_equal(w, SIZE_MAX);
    uint64_t unify = x;
    assert_true(unify != h1 && unify != h2 && unify != 0);
    size_t f = find_call("cuMemFreeAsync", r2 + 1, &x, &y);
    assert_int_not_equal(f, SIZE_MAX);
    assert_int_equal(x, (uintptr_t)p);
    assert_int_equal(y, unify);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s1);
    mt_stream_destroy(b, &s2);
    assert_int_equal(mt_device_synchronize(b), 0);
    done(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_free_calls),
        cmocka_unit_test(test_attributes_and_trim),
        cmocka_unit_test(test_allocator_calls),
        cmocka_unit_test(test_record_stream_unifies),
    };
    return MT_TEST_RUN(tests, open_all, fake_ctl_close);
}
