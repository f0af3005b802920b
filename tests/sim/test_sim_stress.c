/* Concurrency: several threads at once create streams and events, malloc/free segments,
 * map/unmap virtual memory and chain copies across streams with events; every byte that
 * comes back is verified, then the counters and invariants are checked. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "sim_fixture.h"
#include "tests/common/test_main.h"

enum { THREADS = 4, ITERS = 600, MAX_BYTES = 64 * 1024 };

typedef struct {
    mt_backend_t *b;
    mt_stream_t *shared[2]; /* streams every thread uses too */
    atomic_uint host_calls;
    atomic_int errors; /* first failing check, as a line number */
} ctx_t;

typedef struct {
    ctx_t *ctx;
    unsigned id;
} worker_t;

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            int zero = 0;                                                                          \
            atomic_compare_exchange_strong(&ctx->errors, &zero, __LINE__);                         \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static void count_call(void *ud)
{
    atomic_fetch_add(&((ctx_t *)ud)->host_calls, 1);
}

static void *copy_worker(void *arg)
{
    worker_t *w = arg;
    ctx_t *ctx = w->ctx;
    mt_backend_t *b = ctx->b;
    unsigned seed = 1000 + w->id;
    unsigned char *src = malloc(MAX_BYTES), *dst = malloc(MAX_BYTES);
    mt_stream_t *own = NULL;
    mt_event_t *e1 = NULL, *e2 = NULL;
    CHECK(src != NULL && dst != NULL);
    CHECK(mt_stream_create(b, &own) == 0);
    CHECK(mt_event_create(b, &e1) == 0 && mt_event_create(b, &e2) == 0);
    for (unsigned it = 0; it < ITERS; it++) {
        size_t n = (size_t)(rand_r(&seed) % MAX_BYTES) + 1;
        for (size_t i = 0; i < n; i++)
            src[i] = (unsigned char)(i * 31 + it * 7 + w->id);
        memset(dst, 0, n);
        void *d1 = NULL, *d2 = NULL;
        CHECK(mt_backend_malloc(b, n, &d1) == 0);
        CHECK(mt_backend_malloc(b, n, &d2) == 0);
        mt_stream_t *other = ctx->shared[it % 2];
        /* own: H2D -> e1; other: wait e1, D2D -> e2; own: wait e2, D2H. */
        CHECK(mt_memcpy_async(b, d1, src, n, MT_MEMCPY_HOST_TO_DEVICE, own) == 0);
        CHECK(mt_event_record(b, e1, own) == 0);
        CHECK(mt_stream_wait_event(b, other, e1) == 0);
        CHECK(mt_memcpy_async(b, d2, d1, n, MT_MEMCPY_DEVICE_TO_DEVICE, other) == 0);
        CHECK(mt_event_record(b, e2, other) == 0);
        CHECK(mt_stream_wait_event(b, own, e2) == 0);
        CHECK(mt_memcpy_async(b, dst, d2, n, MT_MEMCPY_DEVICE_TO_HOST, own) == 0);
        CHECK(mt_stream_launch_host_func(b, own, count_call, ctx) == 0);
        CHECK(mt_stream_synchronize(b, own) == 0);
        CHECK(memcmp(src, dst, n) == 0);
        CHECK(mt_event_query(b, e1) == 0);
        CHECK(mt_backend_free(b, d1) == 0);
        CHECK(mt_backend_free(b, d2) == 0);
        if (it % 16 == 0) {
            size_t fr, tot;
            CHECK(mt_backend_mem_get_info(b, &fr, &tot) == 0 && fr <= tot);
            CHECK(mt__sim_check(b) == 0);
        }
    }
out:
    mt_event_destroy(b, &e1);
    mt_event_destroy(b, &e2);
    mt_stream_destroy(b, &own);
    free(src);
    free(dst);
    return NULL;
}

/* Maps and unmaps pages of its own reservation and copies through them. */
static void *vm_worker(void *arg)
{
    worker_t *w = arg;
    ctx_t *ctx = w->ctx;
    mt_backend_t *b = ctx->b;
    char *r = NULL;
    char buf[256], back[256];
    CHECK(mt_backend_vm_reserve(b, 16 * MIB, (void **)&r) == 0);
    for (unsigned it = 0; it < ITERS; it++) {
        char *page = r + (it % 8) * 2 * MIB;
        CHECK(mt_backend_vm_map(b, page, 2 * MIB) == 0);
        memset(buf, (int)it, sizeof buf);
        CHECK(mt_memcpy_async(b, page + 1000, buf, sizeof buf, MT_MEMCPY_HOST_TO_DEVICE,
                              ctx->shared[0]) == 0);
        CHECK(mt_memcpy_async(b, back, page + 1000, sizeof back, MT_MEMCPY_DEVICE_TO_HOST,
                              ctx->shared[0]) == 0);
        CHECK(mt_stream_synchronize(b, ctx->shared[0]) == 0);
        CHECK(memcmp(buf, back, sizeof buf) == 0);
        CHECK(mt_backend_vm_unmap(b, page, 2 * MIB) == 0);
    }
    CHECK(mt_backend_vm_release(b, r, 16 * MIB) == 0);
out:
    return NULL;
}

static void test_concurrent_streams_copies_and_memory(void **state)
{
    static ctx_t ctx;
    ctx.b = sim_new(256 * MIB);
    atomic_store(&ctx.host_calls, 0);
    atomic_store(&ctx.errors, 0);
    assert_int_equal(mt_stream_create(ctx.b, &ctx.shared[0]), 0);
    assert_int_equal(mt_stream_create(ctx.b, &ctx.shared[1]), 0);
    pthread_t th[THREADS + 1];
    worker_t w[THREADS + 1];
    for (unsigned i = 0; i <= THREADS; i++) {
        w[i] = (worker_t){&ctx, i};
        assert_int_equal(pthread_create(&th[i], NULL, i < THREADS ? copy_worker : vm_worker, &w[i]),
                         0);
    }
    for (unsigned i = 0; i <= THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&ctx.errors), 0);
    assert_int_equal(atomic_load(&ctx.host_calls), THREADS * ITERS);

    mt_backend_counters_t c = counters_of(ctx.b);
    assert_int_equal(c.malloc_calls, 2 * THREADS * ITERS);
    assert_int_equal(c.malloc_failures, 0);
    assert_int_equal(c.free_calls, 2 * THREADS * ITERS);
    assert_int_equal(c.memcpy_calls, 3 * THREADS * ITERS + 2 * ITERS);
    assert_int_equal(c.event_records, 2 * THREADS * ITERS);
    assert_int_equal(c.vm_map_calls, ITERS);
    assert_int_equal(c.vm_unmap_calls, ITERS);
    assert_int_equal(c.stream_creates, THREADS + 2);
    assert_int_equal(mt__sim_used_bytes(ctx.b), 0);
    assert_int_equal(mt__sim_segment_count(ctx.b), 0);
    assert_int_equal(mt__sim_check(ctx.b), 0);
    mt_stream_destroy(ctx.b, &ctx.shared[0]);
    mt_stream_destroy(ctx.b, &ctx.shared[1]);
    mt_backend_destroy(&ctx.b);
}

/* Many threads allocating at once never get overlapping segments, and the capacity is
 * respected exactly under contention. */
static void *fill_worker(void *arg)
{
    worker_t *w = arg;
    ctx_t *ctx = w->ctx;
    void **mine = calloc(64, sizeof *mine);
    unsigned got = 0;
    CHECK(mine != NULL);
    for (; got < 64; got++) {
        int rc = mt_backend_malloc(ctx->b, MIB, &mine[got]);
        if (rc == MT_ENOMEM)
            break;
        CHECK(rc == 0);
        memset(mine[got], (int)w->id + 1, MIB);
    }
    for (unsigned i = 0; i < got; i++) {
        unsigned char *p = mine[i];
        CHECK(p[0] == w->id + 1 && p[MIB - 1] == w->id + 1);
    }
    atomic_fetch_add(&ctx->host_calls, got);
out:
    free(mine);
    return NULL;
}

static void test_concurrent_fill_to_capacity(void **state)
{
    static ctx_t ctx;
    ctx.b = sim_new(40 * MIB);
    atomic_store(&ctx.host_calls, 0);
    atomic_store(&ctx.errors, 0);
    pthread_t th[THREADS];
    worker_t w[THREADS];
    for (unsigned i = 0; i < THREADS; i++) {
        w[i] = (worker_t){&ctx, i};
        assert_int_equal(pthread_create(&th[i], NULL, fill_worker, &w[i]), 0);
    }
    for (unsigned i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&ctx.errors), 0);
    assert_int_equal(atomic_load(&ctx.host_calls), 40); /* exactly the capacity, in MiB */
    assert_int_equal(mt__sim_used_bytes(ctx.b), 40 * MIB);
    assert_int_equal(mt__sim_check(ctx.b), 0);
    mt_backend_destroy(&ctx.b); /* frees the live segments */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_streams_copies_and_memory),
        cmocka_unit_test(test_concurrent_fill_to_capacity),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
