/* The daemon's direct event encoder writes exactly what the profiler's jansson encoder
 * (the schema's reference) writes, for every kind and the edge values. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/internal.h"
#include "memtrace/prof.h"

static void check(const mt_event_rec_t *ev, int pid)
{
    json_t *o = mt_prof_event_to_json(ev, pid, NULL, NULL);
    assert_non_null(o);
    char *want = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    assert_non_null(want);
    mt_d_buf_t b = {0};
    assert_int_equal(mt__d_encode_event(&b, pid, ev), 0);
    assert_true(b.len > 0 && b.p[b.len - 1] == '\n');
    b.p[--b.len] = '\0';
    assert_string_equal(b.p, want);
    free(want);
    mt__d_buf_free(&b);
}

static void test_every_kind(void **state)
{
    for (int kind = 0; kind <= 40; kind++) {
        for (int tag = 0; tag < MT_TAG_MAX + 3; tag += 3) {
            mt_event_rec_t ev = {
                .seq = (uint64_t)kind * 1000 + (uint64_t)tag,
                .time_ns = 1234567890123ull,
                .addr = kind == MT_EV_MARK ? (uint64_t)(tag % 9) : 0x7f12345678c0ull,
                .size = 4096ull << (tag % 20),
                .requested = 4000,
                .allocated = 1ull << 33,
                .reserved = 3ull << 33,
                .stream = (uint32_t)tag * 77,
                .kind = (uint8_t)kind,
                .pool = (uint8_t)(tag % 5),
                .tag = (uint8_t)tag,
                .device = (uint8_t)(tag % 3),
            };
            check(&ev, 4242 + tag);
        }
    }
}

static void test_edge_values(void **state)
{
    mt_event_rec_t ev = {.kind = MT_EV_ALLOC};
    check(&ev, 0); /* all zero: "0x0", 0s */
    ev = (mt_event_rec_t){
        .seq = UINT64_MAX,
        .time_ns = (uint64_t)INT64_MAX + 1,
        .addr = UINT64_MAX,
        .size = UINT64_MAX,
        .requested = (uint64_t)INT64_MAX,
        .allocated = UINT64_MAX,
        .reserved = UINT64_MAX - 1,
        .stream = UINT32_MAX,
        .kind = MT_EV_OOM,
        .pool = 255,
        .tag = 255,
        .device = 255,
    };
    check(&ev, INT32_MAX);
    check(&ev, -1);
    ev.kind = MT_EV_GAP;
    check(&ev, 7);
    ev.kind = MT_EV_MARK;
    ev.addr = MT_MARK_BACKWARD_END;
    check(&ev, 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind),
        cmocka_unit_test(test_edge_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
