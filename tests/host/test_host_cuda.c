/* The pinned host cache and the prefetcher on the cuda backend, against the fake driver
 * (tests/cuda/fake_libcuda.c): pinned segments come from cuMemHostAlloc, a block read by a
 * queued copy is reused only after the driver reports the copy's event complete, and the
 * prefetcher orders its streams with events only (no context or stream synchronisation). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "memtrace/host.h"
#include "tests/cuda/fake_ctl.h"
#include "tests/common/test_main.h"

#define MiB ((size_t)1 << 20)

typedef struct cfx_s {
    mt_backend_t *b;
    mt_alloc_t *a;
    mt_host_cache_t *h;
} cfx_t;

static void make(cfx_t *f)
{
    fk.reset(256 * MiB, 1);
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_CUDA;
    assert_int_equal(mt_backend_create(&f->b, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = f->b;
    assert_int_equal(mt_alloc_create(&f->a, &ac), 0);
    mt_host_cfg_t hc = mt_host_cfg_default();
    hc.backend = f->b;
    hc.capacity = 64 * MiB;
    assert_int_equal(mt_host_cache_create(&f->h, &hc), 0);
    fk.reset(256 * MiB, 1); /* logs start here */
}

static void unmake(cfx_t *f)
{
    mt_host_cache_destroy(&f->h);
    mt_alloc_destroy(&f->a);
    mt_backend_destroy(&f->b);
    assert_int_equal(fk.used(), 0);
    assert_int_equal(fk.count("cuMemHostAlloc"), fk.count("cuMemFreeHost"));
}

static void test_pinned_reuse_waits_for_driver_event(void **state)
{
    (void)state;
    cfx_t f;
    make(&f);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(f.b, &s), 0);
    void *dev = NULL, *p = NULL, *q = NULL, *r = NULL;
    assert_int_equal(mt_alloc_malloc(f.a, 4096, s, MT_TAG_BATCH, &dev), 0);
    assert_int_equal(mt_host_malloc(f.h, 4096, MT_TAG_BATCH, &p), 0);
    assert_int_equal(fk.count("cuMemHostAlloc"), 1);

    fk.hold(true); /* the driver queues work without running it */
    assert_int_equal(mt_memcpy_async(f.b, dev, p, 4096, MT_MEMCPY_HOST_TO_DEVICE, s), 0);
    assert_int_equal(mt_host_record_stream(f.h, p, s), 0);
    assert_int_equal(mt_host_free(f.h, p), 0);
    assert_int_equal(fk.count("cuEventRecord"), 1);
    assert_int_equal(mt_host_malloc(f.h, 4096, MT_TAG_BATCH, &q), 0);
    assert_ptr_not_equal(p, q);                      /* the copy may still read p */
    assert_int_equal(fk.count("cuMemHostAlloc"), 1); /* carved from the cached segment */
    fk.hold(false);
    assert_int_equal(mt_host_free(f.h, q), 0);
    assert_int_equal(mt_host_malloc(f.h, 4096, MT_TAG_BATCH, &r), 0);
    assert_true(r == p || r == q);
    assert_true(fk.count("cuEventQuery") >= 2);
    assert_int_equal(fk.count("cuCtxSynchronize"), 0);
    assert_int_equal(mt_host_free(f.h, r), 0);
    assert_int_equal(mt_alloc_free(f.a, dev), 0);
    mt_stream_destroy(f.b, &s);
    unmake(&f);
}

static int fill_byte(void *ud, uint64_t index, void *dst, size_t bytes)
{
    (void)ud;
    memset(dst, (int)(index & 0x7f) + 1, bytes);
    return 0;
}

static void test_prefetch_orders_with_events_only(void **state)
{
    (void)state;
    cfx_t f;
    make(&f);
    mt_stream_t *compute = NULL;
    assert_int_equal(mt_stream_create(f.b, &compute), 0);
    mt_prefetch_cfg_t pc = mt_prefetch_cfg_default();
    pc.alloc = f.a;
    pc.host = f.h;
    pc.compute = compute;
    pc.batch_bytes = 64 * 1024;
    mt_prefetch_t *p = NULL;
    assert_int_equal(mt_prefetch_create(&p, &pc), 0);
    fk.reset(256 * MiB, 1);
    for (int k = 0; k < 2; k++)
        assert_int_equal(mt_prefetch_submit_fill(p, pc.batch_bytes, fill_byte, NULL), 0);
    for (int k = 0; k < 6; k++) {
        mt_prefetch_batch_t b;
        assert_int_equal(mt_prefetch_next(p, &b), 0);
        assert_int_equal(mt_prefetch_release(p, &b), 0);
        assert_int_equal(mt_prefetch_submit_fill(p, pc.batch_bytes, fill_byte, NULL), 0);
    }
    /* Every stream wait is on an event recorded earlier; nothing synchronised the host. */
    size_t waits = 0;
    for (size_t i = 0; i < fk.ncalls(); i++) {
        uint64_t s, ev;
        if (strcmp(fk.call(i, &s, &ev), "cuStreamWaitEvent") != 0)
            continue;
        waits++;
        bool recorded = false;
        for (size_t j = 0; j < i && !recorded; j++) {
            uint64_t e2, s2;
            recorded = strcmp(fk.call(j, &e2, &s2), "cuEventRecord") == 0 && e2 == ev;
        }
        assert_true(recorded);
    }
    assert_int_equal(waits, 6 + 6); /* compute waits each copy; copies wait each release */
    assert_int_equal(fk.count("cuMemcpyAsync"), 8);
    assert_int_equal(fk.count("cuCtxSynchronize"), 0);
    assert_int_equal(fk.count("cuStreamSynchronize"), 0);
    assert_int_equal(fk.count("cuEventSynchronize"), 0);
    mt_prefetch_destroy(&p);
    mt_stream_destroy(f.b, &compute);
    unmake(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pinned_reuse_waits_for_driver_event),
        cmocka_unit_test(test_prefetch_orders_with_events_only),
    };
    return MT_TEST_RUN(tests, fake_ctl_open, fake_ctl_close);
}
