/* Managed memory of the cuda backend against the fake driver: the driver calls made
 * (cuMemAllocManaged attached globally, cuMemPrefetchAsync_v2 and cuMemAdvise_v2 with the
 * right location), what is refused before the driver sees it, error mapping, and the
 * allocator's managed segments on cuda. MEMTRACE_LIBCUDA points at the fake. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "backend/backend_cuda.h"
#include "tests/common/test_main.h"

#define MiB ((size_t)1 << 20)

#include "tests/cuda/fake_ctl.h"

static size_t (*mops)(void);
static int (*mop)(size_t i, uint64_t *p, uint64_t *n, int *loc_type, int *loc_id, int *advice,
                  void **stream);

static int setup(void **state)
{
    if (fake_ctl_open(state) != 0)
        return -1;
    *(void **)&mops = dlsym(fk.lib, "fake_cuda_managed_ops");
    *(void **)&mop = dlsym(fk.lib, "fake_cuda_managed_op");
    return mops && mop ? 0 : -1;
}

static mt_backend_t *make(void)
{
    fk.reset(64 * MiB, 2);
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    cfg.kind = MT_BACKEND_CUDA;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &cfg), 0);
    assert_true(mt__cuda_is_cuda(b));
    fk.reset(64 * MiB, 2); /* logs start after creation */
    return b;
}

typedef struct op_s {
    int kind;
    uint64_t p, n;
    int loc_type, loc_id, advice;
    void *stream;
} op_t;

static op_t op_at(size_t i)
{
    op_t o;
    o.kind = mop(i, &o.p, &o.n, &o.loc_type, &o.loc_id, &o.advice, &o.stream);
    return o;
}

static void test_alloc_free_calls(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    void *p = NULL;
    assert_int_equal(mt_backend_managed_malloc(b, 3 * MiB, &p), 0);
    uint64_t flags = 0, size = 0;
    assert_int_not_equal(find_call("cuMemAllocManaged", 0, &flags, &size), SIZE_MAX);
    assert_int_equal(flags, CU_MEM_ATTACH_GLOBAL);
    assert_int_equal(size, 3 * MiB);
    assert_int_equal(fk.count("cuMemAlloc_v2"), 0);
    assert_true(mt_backend_is_managed(b, p, 3 * MiB));
    assert_false(mt_backend_is_managed(b, p, 3 * MiB + 1));
    assert_true(mt_backend_is_device_ptr(b, p));
    mt_managed_stats_t st;
    assert_int_equal(mt_backend_managed_stats(b, &st), 0);
    assert_int_equal(st.managed_bytes, 3 * MiB);
    /* Managed memory is freed as such, not by the plain free. */
    assert_int_equal(mt_backend_free(b, p), MT_ENOENT);
    assert_int_equal(fk.count("cuMemFree_v2"), 0);
    assert_int_equal(mt_backend_managed_free(b, p), 0);
    uint64_t freed = 0;
    assert_int_not_equal(find_call("cuMemFree_v2", 0, &freed, NULL), SIZE_MAX);
    assert_int_equal(freed, (uint64_t)(uintptr_t)p);
    assert_int_equal(mt_backend_managed_free(b, p), MT_ENOENT);
    assert_int_equal(mt_backend_managed_stats(b, &st), 0);
    assert_int_equal(st.managed_bytes, 0);
    /* The driver's out of memory is the backend's. */
    fk.fail_next("cuMemAllocManaged", 1, CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(mt_backend_managed_malloc(b, MiB, &p), MT_ENOMEM);
    mt_backend_destroy(&b);
}

static void test_prefetch_locations(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    void *p = NULL;
    assert_int_equal(mt_backend_managed_malloc(b, 4 * MiB, &p), 0);
    size_t n0 = mops();
    assert_int_equal(mt_backend_managed_prefetch(b, (char *)p + MiB, 2 * MiB, 0, s), 0);
    assert_int_equal(mt_backend_managed_prefetch(b, p, 4 * MiB, MT_MANAGED_HOST, NULL), 0);
    assert_int_equal(mt_backend_managed_prefetch(b, p, MiB, 1, s), 0); /* the other device */
    assert_int_equal(mops(), n0 + 3);
    op_t o = op_at(n0);
    assert_int_equal(o.kind, 'p');
    assert_int_equal(o.p, (uint64_t)(uintptr_t)p + MiB);
    assert_int_equal(o.n, 2 * MiB);
    assert_int_equal(o.loc_type, CU_MEM_LOCATION_TYPE_DEVICE);
    assert_int_equal(o.loc_id, 0);
    assert_non_null(o.stream);
    o = op_at(n0 + 1);
    assert_int_equal(o.loc_type, CU_MEM_LOCATION_TYPE_HOST);
    assert_null(o.stream);
    o = op_at(n0 + 2);
    assert_int_equal(o.loc_type, CU_MEM_LOCATION_TYPE_DEVICE);
    assert_int_equal(o.loc_id, 1);
    /* Refused before the driver: a range past the allocation, plain device memory, a
     * location outside the process's devices. */
    size_t calls = fk.count("cuMemPrefetchAsync_v2");
    void *plain = NULL;
    assert_int_equal(mt_backend_malloc(b, MiB, &plain), 0);
    assert_int_equal(mt_backend_managed_prefetch(b, p, 4 * MiB + 1, 0, s), MT_EINVAL);
    assert_int_equal(mt_backend_managed_prefetch(b, plain, MiB, 0, s), MT_EINVAL);
    assert_int_equal(mt_backend_managed_prefetch(b, p, MiB, 2, s), MT_EINVAL);
    assert_int_equal(mt_backend_managed_prefetch(b, p, MiB, -2, s), MT_EINVAL);
    assert_int_equal(fk.count("cuMemPrefetchAsync_v2"), calls);
    /* The driver's refusal maps too. */
    fk.fail_next("cuMemPrefetchAsync_v2", 1, CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(mt_backend_managed_prefetch(b, p, MiB, 0, s), MT_EINVAL);
    mt_managed_stats_t st;
    assert_int_equal(mt_backend_managed_stats(b, &st), 0);
    assert_int_equal(st.prefetches, 4);
    assert_int_equal(st.prefetch_bytes, 2 * MiB + 4 * MiB + MiB + MiB);
    assert_int_equal(mt_backend_free(b, plain), 0);
    assert_int_equal(mt_backend_managed_free(b, p), 0);
    mt_stream_destroy(b, &s);
    mt_backend_destroy(&b);
}

static void test_advise(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    void *p = NULL;
    assert_int_equal(mt_backend_managed_malloc(b, 4 * MiB, &p), 0);
    size_t n0 = mops();
    assert_int_equal(mt_backend_managed_advise(b, p, MiB, MT_ADVISE_SET_READ_MOSTLY, 0), 0);
    assert_int_equal(
        mt_backend_managed_advise(b, p, 2 * MiB, MT_ADVISE_SET_PREFERRED_LOCATION, MT_MANAGED_HOST),
        0);
    assert_int_equal(
        mt_backend_managed_advise(b, (char *)p + MiB, MiB, MT_ADVISE_SET_ACCESSED_BY, 1), 0);
    assert_int_equal(mops(), n0 + 3);
    op_t o = op_at(n0);
    assert_int_equal(o.kind, 'a');
    assert_int_equal(o.advice, CU_MEM_ADVISE_SET_READ_MOSTLY);
    o = op_at(n0 + 1);
    assert_int_equal(o.advice, CU_MEM_ADVISE_SET_PREFERRED_LOCATION);
    assert_int_equal(o.loc_type, CU_MEM_LOCATION_TYPE_HOST);
    assert_int_equal(o.n, 2 * MiB);
    o = op_at(n0 + 2);
    assert_int_equal(o.advice, CU_MEM_ADVISE_SET_ACCESSED_BY);
    assert_int_equal(o.loc_type, CU_MEM_LOCATION_TYPE_DEVICE);
    assert_int_equal(o.loc_id, 1);
    assert_int_equal(o.p, (uint64_t)(uintptr_t)p + MiB);
    size_t calls = fk.count("cuMemAdvise_v2");
    assert_int_equal(mt_backend_managed_advise(b, p, MiB, 9, 0), MT_EINVAL);
    assert_int_equal(mt_backend_managed_advise(b, p, 5 * MiB, MT_ADVISE_SET_READ_MOSTLY, 0),
                     MT_EINVAL);
    assert_int_equal(fk.count("cuMemAdvise_v2"), calls);
    mt_managed_stats_t st;
    assert_int_equal(mt_backend_managed_stats(b, &st), 0);
    assert_int_equal(st.advises, 3);
    assert_int_equal(mt_backend_managed_free(b, p), 0);
    mt_backend_destroy(&b);
}

static void test_allocator_managed_segments(void **state)
{
    (void)state;
    mt_backend_t *b = make();
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    cfg.backend = b;
    char err[256];
    assert_int_equal(mt_alloc_cfg_parse(&cfg, "managed_memory:True", err, sizeof err), 0);
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &cfg), 0);
    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(a, 3 * MiB, NULL, 0, &p), 0);
    assert_int_not_equal(find_call("cuMemAllocManaged", 0, NULL, NULL), SIZE_MAX);
    assert_int_equal(fk.count("cuMemAlloc_v2"), 0);
    assert_int_equal(fk.count("cuMemCreate"), 0);
    size_t n0 = mops();
    assert_int_equal(mt_alloc_prefetch(a, p, 3 * MiB, 0, NULL), 0);
    assert_int_equal(mt_alloc_advise(a, p, MiB, MT_ADVISE_SET_PREFERRED_LOCATION, 0), 0);
    assert_int_equal(mops(), n0 + 2);
    assert_int_equal(op_at(n0).kind, 'p');
    assert_int_equal(op_at(n0 + 1).kind, 'a');
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_not_equal(find_call("cuMemFree_v2", 0, NULL, NULL), SIZE_MAX);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_free_calls),
        cmocka_unit_test(test_prefetch_locations),
        cmocka_unit_test(test_advise),
        cmocka_unit_test(test_allocator_managed_segments),
    };
    return MT_TEST_RUN(tests, setup, fake_ctl_close);
}
