/* JSON documents and decoding: process state and snapshots carry their figures; bad event
 * lines are refused naming the field; a consumer queue's gap decodes without a pid.
 * (Event lines round-trip in test_encode.c; schema validation of every encoder's output
 * runs in the prof_schema test, with ajv.) */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/prof.h"
#include "tests/common/test_main.h"

static mt_event_rec_t sample(int kind)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof(ev));
    ev.seq = 1000 + (uint64_t)kind;
    ev.time_ns = UINT64_C(123456789012345) + (uint64_t)kind;
    ev.addr = UINT64_C(0x7f0000000000) + (uint64_t)kind * 512;
    ev.size = (uint64_t)kind << 20;
    ev.requested = ((uint64_t)kind << 20) - 7;
    ev.allocated = UINT64_C(1) << 33;
    ev.reserved = UINT64_C(3) << 32;
    ev.stream = 0xfffffff0u + (uint32_t)kind % 8;
    ev.kind = (uint8_t)kind;
    ev.pool = (uint8_t)(kind % 4);
    ev.tag = (uint8_t)(kind % MT_TAG_MAX);
    ev.device = (uint8_t)(kind % 3);
    if (kind == MT_EV_MARK)
        ev.addr = MT_MARK_ITERATION;
    return ev;
}

static json_t *reparse(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    assert_non_null(s);
    json_error_t e;
    json_t *back = json_loads(s, 0, &e);
    assert_non_null(back);
    free(s);
    json_decref(j);
    return back;
}

/* A consumer queue's gap names no process: decoded with pid -1. (Gaps of a process
 * round-trip through the line writer in test_encode.c.) */
static void test_gap_without_pid(void **state)
{
    (void)state;
    json_error_t e;
    json_t *j = json_loads("{\"v\":1,\"type\":\"gap\",\"lost\":17,\"source\":\"daemon\"}", 0, &e);
    assert_non_null(j);
    mt_event_rec_t back;
    int pid = 0;
    assert_int_equal(mt_prof_event_from_json(j, &back, &pid, NULL, 0), 0);
    assert_int_equal(pid, -1);
    assert_int_equal(back.kind, MT_EV_GAP);
    assert_int_equal(back.size, 17);
    json_decref(j);
}

static void expect_bad(const char *line, const char *field)
{
    json_error_t e;
    json_t *j = json_loads(line, 0, &e);
    assert_non_null(j);
    mt_event_rec_t ev;
    char err[128] = "";
    assert_int_equal(mt_prof_event_from_json(j, &ev, NULL, err, sizeof(err)), MT_EPROTO);
    assert_non_null(strstr(err, field));
    json_decref(j);
}

static void test_decode_rejects(void **state)
{
    (void)state;
    mt_event_rec_t ev = sample(MT_EV_ALLOC);
    char good[1024];
    size_t n = mt_prof_event_write(good, sizeof(good), &ev, 1, NULL, NULL);
    assert_true(n > 0 && n < sizeof(good));
    /* Each line breaks one member of a good event. */
    const struct {
        const char *key, *value, *field;
    } cases[] = {
        {"v", "2", "\"v\""},          {"kind", "\"allocx\"", "kind"}, {"addr", "\"12\"", "addr"},
        {"addr", "\"0xzz\"", "addr"}, {"size", "-1", "size"},         {"pool", "\"deep\"", "pool"},
        {"tag_id", "99", "tag_id"},   {"seq", "\"1\"", "seq"},        {"type", "\"evnt\"", "type"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_error_t e;
        json_t *o = json_loads(good, 0, &e);
        json_t *v = json_loads(cases[i].value, JSON_DECODE_ANY, &e);
        assert_non_null(v);
        json_object_set_new(o, cases[i].key, v);
        char *line = json_dumps(o, JSON_COMPACT);
        expect_bad(line, cases[i].field);
        free(line);
        json_decref(o);
    }
    expect_bad("[1,2]", "object");
    expect_bad("{\"v\":1,\"type\":\"gap\",\"pid\":1,\"seq\":1,\"t_ns\":1}", "lost");
}

static void test_stats_and_snapshot(void **state)
{
    (void)state;
    mt_alloc_snapshot_t snap;
    memset(&snap, 0, sizeof(snap));
    mt_snapshot_block_t blocks[2] = {
        {.addr = 0x1000,
         .size = 512,
         .requested = 500,
         .state = MT_BLOCK_ACTIVE_ALLOCATED,
         .tag = MT_TAG_WEIGHTS},
        {.addr = 0x1200, .size = (2 << 20) - 512, .state = MT_BLOCK_INACTIVE},
    };
    mt_snapshot_segment_t seg = {
        .addr = 0x1000, .size = 2 << 20, .pool = MT_POOL_SMALL, .nblocks = 2, .blocks = blocks};
    snap.nsegments = 1;
    snap.segments = &seg;
    snap.stats.allocated_bytes[MT_STAT_ALL].current = 512;
    snap.stats.allocated_bytes[MT_STAT_ALL].peak = 4096;
    snap.stats.reserved_bytes[MT_STAT_ALL].current = 2 << 20;
    snap.stats.tag_allocated_bytes[MT_TAG_WEIGHTS].current = 512;
    snap.stats.utilization = 512.0 / (2 << 20);
    snap.stats.fragmentation = 0.0;

    json_t *p = reparse(mt_prof_stats_to_json(&snap.stats, 7, 0, NULL, NULL));
    assert_string_equal(json_string_value(json_object_get(p, "type")), "process");
    json_t *ab = json_object_get(json_object_get(p, "allocated_bytes"), "all");
    assert_int_equal(json_integer_value(json_object_get(ab, "peak")), 4096);
    json_t *tags = json_object_get(p, "tags");
    assert_int_equal(json_object_size(tags), 1); /* only tags that held memory */
    json_t *w = json_object_get(tags, "weights");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(w, "allocated_bytes"), "current")), 512);
    json_decref(p);

    json_t *s = reparse(mt_prof_snapshot_to_json(&snap, 7, 1, NULL, NULL));
    assert_string_equal(json_string_value(json_object_get(s, "type")), "snapshot");
    json_t *segs = json_object_get(s, "segments");
    assert_int_equal(json_array_size(segs), 1);
    json_t *bl = json_object_get(json_array_get(segs, 0), "blocks");
    assert_int_equal(json_array_size(bl), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(bl, 0), "state")),
                        "allocated");
    assert_string_equal(json_string_value(json_object_get(json_array_get(bl, 1), "addr")),
                        "0x1200");
    assert_non_null(json_object_get(json_object_get(s, "stats"), "reserved_bytes"));
    json_decref(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gap_without_pid),
        cmocka_unit_test(test_decode_rejects),
        cmocka_unit_test(test_stats_and_snapshot),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
