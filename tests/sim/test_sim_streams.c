/* Sim backend streams and events: FIFO order, cross-stream ordering through events,
 * CUDA event semantics (pending/complete, re-record, capture at wait time), timestamps,
 * copy validation, counters. A host function blocking on a semaphore the test releases
 * holds a stream at a known point, so every ordering claim is checked deterministically. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <semaphore.h>
#include <stdatomic.h>
#include <string.h>

#include "sim_fixture.h"
#include "tests/common/test_main.h"

static void block_on_sem(void *ud)
{
    sem_wait((sem_t *)ud);
}

typedef struct {
    atomic_uint n;
    unsigned order[2048];
} seq_log_t;

typedef struct {
    seq_log_t *log;
    unsigned value;
} seq_item_t;

static void append_value(void *ud)
{
    seq_item_t *it = ud;
    unsigned i = atomic_fetch_add(&it->log->n, 1);
    it->log->order[i] = it->value;
}

static void test_stream_ids(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    mt_stream_t *s[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(mt_stream_create(b, &s[i]), 0);
        assert_int_equal(mt_stream_id(s[i]), (uint32_t)i + 1);
    }
    assert_int_equal(mt_stream_id(NULL), 0);
    mt_stream_destroy(b, &s[1]);
    assert_null(s[1]);
    mt_stream_t *t;
    assert_int_equal(mt_stream_create(b, &t), 0);
    assert_int_equal(mt_stream_id(t), 4); /* ids are never reused */
    assert_int_equal(counters_of(b).stream_creates, 4);
    mt_stream_destroy(b, &t);
    mt_stream_destroy(b, &s[0]);
    mt_stream_destroy(b, &s[2]);
    mt_backend_destroy(&b);
}

static void test_fifo_host_funcs(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    mt_stream_t *s;
    assert_int_equal(mt_stream_create(b, &s), 0);
    static seq_log_t log;
    static seq_item_t items[2048];
    atomic_store(&log.n, 0);
    for (unsigned i = 0; i < 2048; i++) {
        items[i] = (seq_item_t){&log, i};
        assert_int_equal(mt_stream_launch_host_func(b, i % 2 ? s : NULL, append_value, &items[i]),
                         0);
        if (i % 2 == 0) /* keep the default stream's half in order with s's half */
            assert_int_equal(mt_stream_synchronize(b, NULL), 0);
    }
    assert_int_equal(mt_stream_synchronize(b, s), 0);
    assert_int_equal(atomic_load(&log.n), 2048);
    /* Odd entries ran on s in FIFO order; compare the subsequence. */
    unsigned last = 0;
    bool first = true;
    for (unsigned i = 0; i < 2048; i++) {
        if (log.order[i] % 2 == 0)
            continue;
        if (!first)
            assert_true(log.order[i] > last);
        last = log.order[i];
        first = false;
    }
    mt_stream_destroy(b, &s);
    mt_backend_destroy(&b);
}

/* memset(value i) then copy to host slot i, many times on one stream: each slot sees its
 * own value only if the ops ran in order. */
static void test_fifo_copies(void **state)
{
    enum { N = 200, SZ = 4096 };
    mt_backend_t *b = sim_new(16 * MIB);
    mt_stream_t *s;
    assert_int_equal(mt_stream_create(b, &s), 0);
    void *d;
    assert_int_equal(mt_backend_malloc(b, SZ, &d), 0);
    static unsigned char host[N][SZ];
    memset(host, 0xff, sizeof host);
    for (int i = 0; i < N; i++) {
        assert_int_equal(mt_memset_async(b, d, i, SZ, s), 0);
        assert_int_equal(mt_memcpy_async(b, host[i], d, SZ, MT_MEMCPY_DEVICE_TO_HOST, s), 0);
    }
    assert_int_equal(mt_stream_synchronize(b, s), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(host[i][0], (unsigned char)i);
        assert_int_equal(host[i][SZ - 1], (unsigned char)i);
    }
    /* H2D, D2D, then the synchronous copy back. */
    void *d2;
    assert_int_equal(mt_backend_malloc(b, SZ, &d2), 0);
    unsigned char src[SZ], dst[SZ];
    for (int i = 0; i < SZ; i++)
        src[i] = (unsigned char)(i * 7);
    assert_int_equal(mt_memcpy_async(b, d, src, SZ, MT_MEMCPY_HOST_TO_DEVICE, s), 0);
    assert_int_equal(mt_memcpy_async(b, d2, d, SZ, MT_MEMCPY_DEVICE_TO_DEVICE, s), 0);
    assert_int_equal(mt_stream_synchronize(b, s), 0);
    assert_int_equal(mt_memcpy(b, dst, d2, SZ, MT_MEMCPY_DEVICE_TO_HOST), 0);
    assert_memory_equal(src, dst, SZ);

    mt_backend_counters_t c = counters_of(b);
    assert_int_equal(c.memset_calls, N);
    assert_int_equal(c.memcpy_calls, N + 3);
    assert_int_equal(c.stream_syncs, 3);
    assert_int_equal(mt_backend_free(b, d), 0);
    assert_int_equal(mt_backend_free(b, d2), 0);
    mt_stream_destroy(b, &s);
    mt_backend_destroy(&b);
}

static void test_copy_validation(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    void *d;
    assert_int_equal(mt_backend_malloc(b, 8192, &d), 0);
    char h[16384];
    void *pinned;
    assert_int_equal(mt_backend_host_malloc(b, 8192, &pinned), 0);
    assert_int_equal(mt_memcpy_async(b, h, h + 8192, 100, MT_MEMCPY_HOST_TO_DEVICE, NULL),
                     MT_EINVAL);
    assert_int_equal(mt_memcpy_async(b, h, h + 8192, 100, MT_MEMCPY_DEVICE_TO_HOST, NULL),
                     MT_EINVAL);
    assert_int_equal(mt_memcpy_async(b, d, pinned, 8192, MT_MEMCPY_DEVICE_TO_DEVICE, NULL),
                     MT_EINVAL);
    /* Running past the end of the segment is a bug too. */
    assert_int_equal(mt_memcpy_async(b, (char *)d + 4096, h, 8192, MT_MEMCPY_HOST_TO_DEVICE, NULL),
                     MT_EINVAL);
    assert_int_equal(mt_memset_async(b, h, 0, 16, NULL), MT_EINVAL);
    assert_int_equal(mt_memset_async(b, (char *)d + 8000, 0, 193, NULL), MT_EINVAL);
    assert_int_equal(mt_memcpy_async(b, d, h, 10, (mt_memcpy_kind_e)9, NULL), MT_EINVAL);
    /* Legal ones. */
    memset(h, 3, sizeof h);
    assert_int_equal(mt_memcpy_async(b, pinned, h, 8192, MT_MEMCPY_HOST_TO_HOST, NULL), 0);
    assert_int_equal(mt_memcpy_async(b, d, pinned, 8192, MT_MEMCPY_HOST_TO_DEVICE, NULL), 0);
    assert_int_equal(mt_memset_async(b, (char *)d + 8000, 9, 192, NULL), 0);
    assert_int_equal(mt_memcpy_async(b, h, d, 8192, MT_MEMCPY_DEFAULT, NULL), 0);
    assert_int_equal(mt_memcpy_async(b, h, d, 0, MT_MEMCPY_DEVICE_TO_HOST, NULL), 0);
    assert_int_equal(mt_stream_synchronize(b, NULL), 0);
    assert_int_equal(h[0], 3);
    assert_int_equal(h[7999], 3);
    assert_int_equal(h[8000], 9);
    assert_int_equal(h[8191], 9);
    /* A freed segment is not device memory any more. */
    assert_int_equal(mt_backend_free(b, d), 0);
    assert_int_equal(mt_memset_async(b, d, 0, 16, NULL), MT_EINVAL);
    assert_int_equal(mt_backend_host_free(b, pinned), 0);
    mt_backend_destroy(&b);
}

static void test_event_pending_then_complete(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    mt_stream_t *s;
    mt_event_t *ev;
    assert_int_equal(mt_stream_create(b, &s), 0);
    assert_int_equal(mt_event_create(b, &ev), 0);
    assert_int_equal(mt_event_query(b, ev), 0); /* never recorded: complete */
    assert_int_equal(mt_event_synchronize(b, ev), 0);
    assert_int_equal(mt_event_time_ns(b, ev), 0);

    sem_t sem;
    sem_init(&sem, 0, 0);
    assert_int_equal(mt_stream_launch_host_func(b, s, block_on_sem, &sem), 0);
    assert_int_equal(mt_event_record(b, ev, s), 0);
    assert_int_equal(mt_event_query(b, ev), MT_EAGAIN);
    assert_int_equal(mt_event_time_ns(b, ev), 0);
    sem_post(&sem);
    assert_int_equal(mt_event_synchronize(b, ev), 0);
    assert_int_equal(mt_event_query(b, ev), 0);
    assert_true(mt_event_time_ns(b, ev) > 0);

    mt_backend_counters_t c = counters_of(b);
    assert_int_equal(c.event_records, 1);
    assert_int_equal(c.event_queries, 3);
    assert_int_equal(c.event_syncs, 2);
    mt_event_destroy(b, &ev);
    assert_null(ev);
    mt_stream_destroy(b, &s);
    sem_destroy(&sem);
    mt_backend_destroy(&b);
}

/* Stream B copies a buffer that stream A fills after a host function blocked on a
 * semaphore. Joined by an event, B's copy must not run before A released. */
static void test_cross_stream_wait(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    mt_stream_t *sa, *sb;
    mt_event_t *filled, *copied;
    assert_int_equal(mt_stream_create(b, &sa), 0);
    assert_int_equal(mt_stream_create(b, &sb), 0);
    assert_int_equal(mt_event_create(b, &filled), 0);
    assert_int_equal(mt_event_create(b, &copied), 0);
    void *d;
    assert_int_equal(mt_backend_malloc(b, 65536, &d), 0);
    static unsigned char host[65536];
    memset(host, 0x11, sizeof host);
    assert_int_equal(mt_memset_async(b, d, 0x00, 65536, sa), 0);
    assert_int_equal(mt_stream_synchronize(b, sa), 0);

    sem_t sem;
    sem_init(&sem, 0, 0);
    assert_int_equal(mt_stream_launch_host_func(b, sa, block_on_sem, &sem), 0);
    assert_int_equal(mt_memset_async(b, d, 0xab, 65536, sa), 0);
    assert_int_equal(mt_event_record(b, filled, sa), 0);
    assert_int_equal(mt_stream_wait_event(b, sb, filled), 0);
    assert_int_equal(mt_memcpy_async(b, host, d, 65536, MT_MEMCPY_DEVICE_TO_HOST, sb), 0);
    assert_int_equal(mt_event_record(b, copied, sb), 0);

    /* Other streams, the default one included, keep running meanwhile: the default stream
     * has no implicit barrier with the others (like cudaStreamPerThread). */
    mt_stream_t *sc;
    assert_int_equal(mt_stream_create(b, &sc), 0);
    assert_int_equal(mt_stream_synchronize(b, sc), 0);
    static seq_log_t log;
    static seq_item_t item = {&log, 7};
    atomic_store(&log.n, 0);
    assert_int_equal(mt_stream_launch_host_func(b, NULL, append_value, &item), 0);
    assert_int_equal(mt_stream_synchronize(b, NULL), 0);
    assert_int_equal(atomic_load(&log.n), 1);

    /* A is held, so B cannot have copied. */
    assert_int_equal(mt_event_query(b, filled), MT_EAGAIN);
    assert_int_equal(mt_event_query(b, copied), MT_EAGAIN);
    assert_int_equal(host[0], 0x11);
    assert_int_equal(host[65535], 0x11);

    sem_post(&sem);
    assert_int_equal(mt_stream_synchronize(b, sb), 0);
    assert_int_equal(mt_event_query(b, filled), 0);
    assert_int_equal(mt_event_query(b, copied), 0);
    assert_int_equal(host[0], 0xab);
    assert_int_equal(host[65535], 0xab);
    assert_true(mt_event_time_ns(b, filled) <= mt_event_time_ns(b, copied));

    mt_event_destroy(b, &filled);
    mt_event_destroy(b, &copied);
    mt_stream_destroy(b, &sa);
    mt_stream_destroy(b, &sb);
    mt_stream_destroy(b, &sc);
    sem_destroy(&sem);
    assert_int_equal(mt_backend_free(b, d), 0);
    mt_backend_destroy(&b);
}

/* A re-record replaces the capture; a wait made earlier keeps the capture it saw. */
static void test_rerecord_semantics(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    mt_stream_t *sa, *sb, *sc;
    mt_event_t *ev, *after_wait;
    assert_int_equal(mt_stream_create(b, &sa), 0);
    assert_int_equal(mt_stream_create(b, &sb), 0);
    assert_int_equal(mt_stream_create(b, &sc), 0);
    assert_int_equal(mt_event_create(b, &ev), 0);
    assert_int_equal(mt_event_create(b, &after_wait), 0);
    sem_t sem;
    sem_init(&sem, 0, 0);

    assert_int_equal(mt_stream_launch_host_func(b, sa, block_on_sem, &sem), 0);
    assert_int_equal(mt_event_record(b, ev, sa), 0);      /* capture 1: held */
    assert_int_equal(mt_stream_wait_event(b, sb, ev), 0); /* sb waits on capture 1 */
    assert_int_equal(mt_event_record(b, after_wait, sb), 0);
    assert_int_equal(mt_event_record(b, ev, sc), 0);  /* capture 2: free to run */
    assert_int_equal(mt_event_synchronize(b, ev), 0); /* returns: sc is idle */
    assert_int_equal(mt_event_query(b, ev), 0);
    assert_true(mt_event_time_ns(b, ev) > 0);
    assert_int_equal(mt_stream_synchronize(b, sc), 0);
    assert_int_equal(mt_event_query(b, after_wait), MT_EAGAIN); /* still on capture 1 */

    /* Destroying the event while sb still waits on its old capture is legal. */
    mt_event_destroy(b, &ev);
    assert_int_equal(mt_event_query(b, after_wait), MT_EAGAIN);
    sem_post(&sem);
    assert_int_equal(mt_event_synchronize(b, after_wait), 0);

    /* Waiting on a completed or never-recorded event does not hold the stream. */
    mt_event_t *fresh;
    assert_int_equal(mt_event_create(b, &fresh), 0);
    assert_int_equal(mt_stream_wait_event(b, sb, fresh), 0);
    assert_int_equal(mt_stream_wait_event(b, sb, after_wait), 0);
    assert_int_equal(mt_stream_synchronize(b, sb), 0);
    mt_event_destroy(b, &fresh);
    mt_event_destroy(b, &after_wait);
    mt_stream_destroy(b, &sa);
    mt_stream_destroy(b, &sb);
    mt_stream_destroy(b, &sc);
    sem_destroy(&sem);
    mt_backend_destroy(&b);
}

static void test_event_times_monotone(void **state)
{
    enum { N = 32 };
    mt_backend_t *b = sim_new(16 * MIB);
    mt_stream_t *s;
    assert_int_equal(mt_stream_create(b, &s), 0);
    void *d;
    assert_int_equal(mt_backend_malloc(b, MIB, &d), 0);
    mt_event_t *ev[N];
    for (int i = 0; i < N; i++) {
        assert_int_equal(mt_event_create(b, &ev[i]), 0);
        assert_int_equal(mt_memset_async(b, d, i, MIB, s), 0);
        assert_int_equal(mt_event_record(b, ev[i], s), 0);
    }
    assert_int_equal(mt_stream_synchronize(b, s), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(mt_event_query(b, ev[i]), 0);
        assert_true(mt_event_time_ns(b, ev[i]) > 0);
        if (i > 0)
            assert_true(mt_event_time_ns(b, ev[i - 1]) <= mt_event_time_ns(b, ev[i]));
    }
    for (int i = 0; i < N; i++)
        mt_event_destroy(b, &ev[i]);
    assert_int_equal(mt_backend_free(b, d), 0);
    mt_stream_destroy(b, &s);
    mt_backend_destroy(&b);
}

/* stream_destroy and device_synchronize wait for queued work. */
static void test_sync_waits_for_work(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    static seq_log_t log;
    static seq_item_t items[3];
    atomic_store(&log.n, 0);
    mt_stream_t *s1, *s2;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    assert_int_equal(mt_stream_create(b, &s2), 0);
    sem_t sem;
    sem_init(&sem, 0, 0);
    for (unsigned i = 0; i < 3; i++)
        items[i] = (seq_item_t){&log, i};
    assert_int_equal(mt_stream_launch_host_func(b, s1, block_on_sem, &sem), 0);
    assert_int_equal(mt_stream_launch_host_func(b, s1, append_value, &items[0]), 0);
    assert_int_equal(mt_stream_launch_host_func(b, s2, append_value, &items[1]), 0);
    assert_int_equal(mt_stream_launch_host_func(b, NULL, append_value, &items[2]), 0);
    sem_post(&sem);
    assert_int_equal(mt_device_synchronize(b), 0);
    assert_int_equal(atomic_load(&log.n), 3);
    assert_int_equal(counters_of(b).device_syncs, 1);

    assert_int_equal(mt_stream_launch_host_func(b, s1, block_on_sem, &sem), 0);
    assert_int_equal(mt_stream_launch_host_func(b, s1, append_value, &items[0]), 0);
    sem_post(&sem);
    mt_stream_destroy(b, &s1);
    assert_int_equal(atomic_load(&log.n), 4);
    mt_stream_destroy(b, &s2);
    sem_destroy(&sem);
    mt_backend_destroy(&b);
}

static void test_argument_errors(void **state)
{
    mt_backend_t *b = sim_new(16 * MIB);
    mt_event_t *ev;
    assert_int_equal(mt_event_create(b, &ev), 0);
    assert_int_equal(mt_stream_create(b, NULL), MT_EINVAL);
    assert_int_equal(mt_stream_create(NULL, NULL), MT_EINVAL);
    assert_int_equal(mt_event_create(b, NULL), MT_EINVAL);
    assert_int_equal(mt_event_record(b, NULL, NULL), MT_EINVAL);
    assert_int_equal(mt_stream_wait_event(b, NULL, NULL), MT_EINVAL);
    assert_int_equal(mt_stream_launch_host_func(b, NULL, NULL, NULL), MT_EINVAL);
    assert_int_equal(mt_memcpy_async(b, NULL, ev, 4, MT_MEMCPY_HOST_TO_HOST, NULL), MT_EINVAL);
    assert_int_equal(mt_memset_async(b, NULL, 0, 4, NULL), MT_EINVAL);
    mt_stream_t *null_stream = NULL;
    mt_stream_destroy(b, &null_stream); /* no-op */
    /* An event left alive and a stream left alive are released by destroy (ASan checks). */
    mt_stream_t *s;
    assert_int_equal(mt_stream_create(b, &s), 0);
    assert_int_equal(mt_event_record(b, ev, s), 0);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_ids),
        cmocka_unit_test(test_fifo_host_funcs),
        cmocka_unit_test(test_fifo_copies),
        cmocka_unit_test(test_copy_validation),
        cmocka_unit_test(test_event_pending_then_complete),
        cmocka_unit_test(test_cross_stream_wait),
        cmocka_unit_test(test_rerecord_semantics),
        cmocka_unit_test(test_event_times_monotone),
        cmocka_unit_test(test_sync_waits_for_work),
        cmocka_unit_test(test_argument_errors),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
