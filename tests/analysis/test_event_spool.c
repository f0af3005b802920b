/* The events kept for replays (analysis/event_spool.h): with a file, without one, and with a
 * file that cannot be written (a full disk), every event comes back in order, by chunk and by
 * index, byte for byte, and is found by its seq; with a file, memory holds one chunk. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis/event_spool.h"
#include "memtrace/common.h"
#include "tests/common/test_main.h"

#define N (5 * MT__SPOOL_CHUNK + 37) /* five chunks and a tail */

static mt_event_rec_t event(size_t i)
{
    mt_event_rec_t e;
    memset(&e, 0, sizeof e);
    e.seq = i;
    e.time_ns = 1000 * (uint64_t)i + 7;
    e.addr = 0x7f0000000000u + 512 * (uint64_t)i;
    e.size = (uint64_t)i * 3 + 1;
    e.kind = (uint8_t)(i % 5);
    return e;
}

/* Pushes N events into a spool on f, then reads them back both ways. */
static void round_trip(mt__spool_file_t *f, size_t want_chunks)
{
    mt__spool_t s = {0};
    for (size_t i = 0; i < N; i++) {
        mt_event_rec_t e = event(i);
        assert_int_equal(mt__spool_push(&s, f, &e), 0);
    }
    assert_int_equal(s.n, N);
    assert_int_equal(s.nchunks, want_chunks);
    if (want_chunks)
        assert_true(s.tail_cap <= MT__SPOOL_CHUNK);
    mt_event_rec_t *buf = malloc(MT__SPOOL_CHUNK * sizeof *buf);
    assert_non_null(buf);
    size_t k = 0;
    for (size_t c = 0; c <= s.nchunks; c++) {
        const mt_event_rec_t *evs;
        size_t n;
        assert_int_equal(mt__spool_chunk(&s, f, c, buf, &evs, &n), 0);
        for (size_t j = 0; j < n; j++, k++) {
            mt_event_rec_t e = event(k);
            assert_memory_equal(&evs[j], &e, sizeof e);
        }
    }
    assert_int_equal(k, N);
    for (size_t i = 0; i < N; i += 97) {
        mt_event_rec_t got, e = event(i);
        assert_int_equal(mt__spool_get(&s, f, i, &got), 0);
        assert_memory_equal(&got, &e, sizeof e);
    }
    /* Each event is found by its seq, a record that differs is not, before, between and
     * after the chunks. */
    for (size_t i = 0; i < N; i += 61) {
        mt_event_rec_t e = event(i);
        bool found = false;
        assert_int_equal(mt__spool_find(&s, f, &e, &found), 0);
        assert_true(found);
        e.size++;
        assert_int_equal(mt__spool_find(&s, f, &e, &found), 0);
        assert_false(found);
    }
    mt_event_rec_t past = event(N);
    bool found = true;
    assert_int_equal(mt__spool_find(&s, f, &past, &found), 0);
    assert_false(found);
    free(buf);
    mt__spool_free(&s);
}

static void test_spool_file(void **state)
{
    (void)state;
    mt__spool_file_t f;
    mt__spool_file_open(&f, "/tmp");
    assert_true(f.fd >= 0);
    round_trip(&f, N / MT__SPOOL_CHUNK);
    assert_int_equal(f.end, (uint64_t)(N / MT__SPOOL_CHUNK) * MT__SPOOL_CHUNK * 64);
    mt__spool_file_close(&f);
    assert_int_equal(f.fd, -1);
}

static void test_spool_memory(void **state)
{
    (void)state;
    mt__spool_file_t f;
    mt__spool_file_open(&f, NULL); /* no file asked for */
    assert_int_equal(f.fd, -1);
    round_trip(&f, 0);
    mt__spool_file_open(&f, "/nonexistent-dir-of-memtrace"); /* none could be made */
    assert_int_equal(f.fd, -1);
    round_trip(&f, 0);
}

/* A file every write to fails (ENOSPC): the chunks stay in memory, nothing is lost. */
static void test_spool_full_disk(void **state)
{
    (void)state;
    mt__spool_file_t f = {.fd = open("/dev/full", O_RDWR)};
    assert_true(f.fd >= 0);
    round_trip(&f, 0);
    assert_int_equal(f.end, 0);
    mt__spool_file_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spool_file),
        cmocka_unit_test(test_spool_memory),
        cmocka_unit_test(test_spool_full_disk),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
