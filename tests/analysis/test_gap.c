/* Why reserved exceeds allocated (analysis/gap.h) on a hand-written stream where each cause
 * has one known value, and the report's peak_gap / end_gap from the same stream. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <limits.h>
#include <string.h>

#include "analysis/gap.h"
#include "analysis/report.h"
#include "model_gen.h"
#include "tests/common/test_main.h"

#define MIB   (UINT64_C(1) << 20)
#define BASE  UINT64_C(0x7f0000000000)
#define SEG_A (BASE)             /* 20 MiB segment: live blocks and a pending one */
#define SEG_B (BASE + 32 * MIB)  /* 2 MiB segment, empty: cached */
#define SEG_C (BASE + 64 * MIB)  /* 2 MiB segment: one pending block only */
#define MAP_D (BASE + 128 * MIB) /* 4 MiB of expandable pages, one live block */

typedef struct feed_s {
    mgen_t g;
    mt__report_t *r;
} feed_t;

static void put_req(feed_t *f, int kind, uint64_t addr, uint64_t size, uint64_t requested,
                    uint32_t stack)
{
    char why[256] = "";
    if (stack != 0) {
        mt_event_rec_t ref = mgen_rec(&f->g, MT_EV_STACK_REF, addr, stack, 0);
        assert_int_equal(mt__model_apply(f->g.m, &ref), 0);
        assert_int_equal(mt__report_add_event(f->r, 1, &ref, NULL), 0);
    }
    mt_event_rec_t ev = mgen_rec(&f->g, kind, addr, size, 0);
    ev.requested = requested;
    assert_int_equal(mt__model_apply(f->g.m, &ev), 0);
    if (mt__model_check(f->g.m, why, sizeof why) != 0)
        fail_msg("mt__model_check: %s", why);
    assert_int_equal(mt__report_add_event(f->r, 1, &ev, NULL), 0);
}

static void put(feed_t *f, int kind, uint64_t addr, uint64_t size)
{
    put_req(f, kind, addr, size, size, 0);
}

/* Every cause once: the stream of the file's comment. Allocated peaks at the last alloc. */
static void feed_all_causes(feed_t *f)
{
    put(f, MT_EV_SEGMENT_ALLOC, SEG_A, 20 * MIB);
    put_req(f, MT_EV_ALLOC, SEG_A, 4 * MIB, 4 * MIB - 100, 7); /* pins A: the largest */
    put_req(f, MT_EV_ALLOC, SEG_A + 4 * MIB, 2 * MIB, 2 * MIB, 8);
    put(f, MT_EV_ALLOC, SEG_A + 6 * MIB, 1 * MIB);
    put(f, MT_EV_SEGMENT_ALLOC, SEG_B, 2 * MIB);
    put(f, MT_EV_SEGMENT_ALLOC, SEG_C, 2 * MIB);
    put(f, MT_EV_ALLOC, SEG_C, 1 * MIB);
    f->g.pool = MT_POOL_LARGE;
    put(f, MT_EV_SEGMENT_MAP, MAP_D, 2 * MIB);
    put(f, MT_EV_SEGMENT_MAP, MAP_D + 2 * MIB, 2 * MIB); /* joins: one 4 MiB range */
    put_req(f, MT_EV_ALLOC, MAP_D, 1 * MIB, 1 * MIB - 512, 9);
    /* The peak: 4 + 2 + 1 + 1 + 1 = 9 MiB allocated, 28 MiB reserved. Then two frees whose
     * stream events are still pending. */
    put(f, MT_EV_FREE_REQUESTED, SEG_A + 6 * MIB, 1 * MIB);
    put(f, MT_EV_FREE_REQUESTED, SEG_C, 1 * MIB);
}

static int64_t cause_json(json_t *gap, const char *name)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(gap, "causes"), i, c)
    {
        if (strcmp(json_string_value(json_object_get(c, "cause")), name) == 0)
            return json_integer_value(json_object_get(c, "bytes"));
    }
    fail_msg("cause %s missing", name);
    return -1;
}

static int64_t sum_causes(json_t *gap)
{
    int64_t sum = 0;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(gap, "causes"), i, c) sum +=
        json_integer_value(json_object_get(c, "bytes"));
    return sum;
}

static void test_each_cause_at_the_end(void **state)
{
    (void)state;
    feed_t f = {0};
    assert_int_equal(mt__model_create(&f.g.m, NULL), 0);
    assert_int_equal(mt__report_create(&f.r, NULL), 0);
    feed_all_causes(&f);
    mt_gap_t g;
    assert_int_equal(mt__gap_of_model(f.g.m, MT_MODEL_DEVICE, &g), 0);
    assert_int_equal(g.reserved, 28 * MIB);
    assert_int_equal(g.allocated, 7 * MIB);
    /* A: 20 - 4 - 2 - 1 (pending) = 13 MiB free, pinned by its largest live block (stack 7). */
    assert_int_equal(g.cause[MT_GAP_PINNED_FREE], 13 * MIB);
    assert_int_equal(g.cause[MT_GAP_CACHED_SEGMENTS], 2 * MIB); /* B */
    /* A's pending MiB, C's pending MiB and C's free MiB that only the pending block holds. */
    assert_int_equal(g.cause[MT_GAP_STREAM_PENDING], 3 * MIB);
    assert_int_equal(g.cause[MT_GAP_EXPANDABLE_SLACK], 3 * MIB); /* D: 4 - 1 */
    assert_int_equal(g.cause[MT_GAP_UNTRACKED], 0);
    int64_t sum = 0;
    for (int c = 0; c < MT_GAP_CAUSES; c++)
        sum += g.cause[c];
    assert_int_equal(sum, (int64_t)(g.reserved - g.allocated));
    assert_int_equal(g.rounding, 100 + 512);
    assert_int_equal(g.blocks_unknown, 0);
    assert_int_equal(g.npins, 1);
    assert_int_equal(g.pins[0].stack, 7);
    assert_int_equal(g.pins[0].bytes, 13 * MIB);
    assert_int_equal(g.pins[0].block, 4 * MIB);
    mt__gap_free(&g);

    /* The report's end_gap and peak_gap: the same figures; at the peak nothing is pending
     * yet, so A's free is 13 MiB pinned still and C is pinned by its live block. */
    json_t *res = mt__report_result(f.r);
    assert_non_null(res);
    json_t *p = json_array_get(json_object_get(res, "processes"), 0);
    json_t *end = json_object_get(p, "end_gap"), *peak = json_object_get(p, "peak_gap");
    assert_int_equal(cause_json(end, "pinned_free"), 13 * MIB);
    assert_int_equal(cause_json(end, "stream_pending"), 3 * MIB);
    assert_int_equal(sum_causes(end), json_integer_value(json_object_get(end, "gap_bytes")));
    assert_int_equal(json_integer_value(json_object_get(peak, "allocated_bytes")), 9 * MIB);
    assert_int_equal(json_integer_value(json_object_get(peak, "reserved_bytes")), 28 * MIB);
    assert_int_equal(cause_json(peak, "pinned_free"), 13 * MIB + 1 * MIB);
    assert_int_equal(cause_json(peak, "cached_segments"), 2 * MIB);
    assert_int_equal(cause_json(peak, "stream_pending"), 0);
    assert_int_equal(cause_json(peak, "expandable_slack"), 3 * MIB);
    assert_int_equal(cause_json(peak, "untracked"), 0);
    assert_int_equal(sum_causes(peak), 19 * MIB);
    assert_int_equal(json_integer_value(json_object_get(peak, "rounding_bytes")), 100 + 512);
    json_t *pins = json_object_get(peak, "pins");
    assert_int_equal(json_array_size(pins), 2); /* stack 7 (A), and C's block (no stack) */
    assert_int_equal(json_integer_value(json_object_get(json_array_get(pins, 0), "stack")), 7);
    assert_non_null(json_object_get(json_array_get(pins, 0), "site"));
    json_decref(res);
    mt__report_destroy(&f.r);
    mt__model_destroy(&f.g.m);
}

/* Reserved the map never saw (segments from before the log) is untracked; the causes still
 * add up to the gap. */
static void test_untracked_reserved(void **state)
{
    (void)state;
    feed_t f = {0};
    assert_int_equal(mt__model_create(&f.g.m, NULL), 0);
    assert_int_equal(mt__report_create(&f.r, NULL), 0);
    f.g.reserved = 6 * MIB; /* a segment allocated before the log began */
    put(&f, MT_EV_SEGMENT_ALLOC, SEG_A, 2 * MIB);
    put(&f, MT_EV_ALLOC, SEG_A, 1 * MIB);
    mt_gap_t g;
    assert_int_equal(mt__gap_of_model(f.g.m, MT_MODEL_DEVICE, &g), 0);
    assert_int_equal(g.cause[MT_GAP_PINNED_FREE], 1 * MIB);
    assert_int_equal(g.cause[MT_GAP_UNTRACKED], 6 * MIB);
    assert_int_equal(g.reserved - g.allocated, 7 * MIB);
    mt__gap_free(&g);
    mt__report_destroy(&f.r);
    mt__model_destroy(&f.g.m);
}

/* A request the model does not know (0, or above the block) counts apart, not as 0
 * rounding. */
static void test_unknown_requests(void **state)
{
    (void)state;
    feed_t f = {0};
    assert_int_equal(mt__model_create(&f.g.m, NULL), 0);
    assert_int_equal(mt__report_create(&f.r, NULL), 0);
    put(&f, MT_EV_SEGMENT_ALLOC, SEG_A, 2 * MIB);
    put_req(&f, MT_EV_ALLOC, SEG_A, 1024, 0, 0);
    put_req(&f, MT_EV_ALLOC, SEG_A + 1024, 1024, 4096, 0);
    put_req(&f, MT_EV_ALLOC, SEG_A + 2048, 1024, 1000, 0);
    mt_gap_t g;
    assert_int_equal(mt__gap_of_model(f.g.m, MT_MODEL_DEVICE, &g), 0);
    assert_int_equal(g.blocks_unknown, 2);
    assert_int_equal(g.rounding, 24);
    assert_int_equal(g.requested_known, 1000);
    mt__gap_free(&g);
    mt__report_destroy(&f.r);
    mt__model_destroy(&f.g.m);
}

/* One event of process pid into r, from its generator g (no reference model: many). */
static void put_pid(mt__report_t *r, mgen_t *g, int pid, int kind, uint64_t addr, uint64_t size)
{
    mt_event_rec_t ev = mgen_rec(g, kind, addr, size, 0);
    assert_int_equal(mt__report_add_event(r, pid, &ev, NULL), 0);
}

/* A run that grows, as process pid of r: an early 8 MiB peak, `below` pairs under it, then a
 * leak (each step maps a segment, allocates 1 MiB and a 512 KiB block it frees again but the
 * last time), then a segment mapped after the peak and the last block freed. */
static void feed_growth(mt__report_t *r, int pid, unsigned below, uint64_t steps)
{
    mgen_t g = {0};
    put_pid(r, &g, pid, MT_EV_SEGMENT_ALLOC, SEG_A, 64 * MIB);
    put_pid(r, &g, pid, MT_EV_ALLOC, SEG_A, 8 * MIB);
    put_pid(r, &g, pid, MT_EV_FREE_REQUESTED, SEG_A, 8 * MIB);
    put_pid(r, &g, pid, MT_EV_FREE_COMPLETED, SEG_A, 8 * MIB);
    for (unsigned i = 0; i < below; i++) {
        put_pid(r, &g, pid, MT_EV_ALLOC, SEG_A, 4096);
        put_pid(r, &g, pid, MT_EV_FREE_REQUESTED, SEG_A, 4096);
        put_pid(r, &g, pid, MT_EV_FREE_COMPLETED, SEG_A, 4096);
    }
    for (uint64_t i = 0; i < steps; i++) {
        uint64_t seg = BASE + 256 * MIB + i * 2 * MIB;
        put_pid(r, &g, pid, MT_EV_SEGMENT_ALLOC, seg, 2 * MIB);
        put_pid(r, &g, pid, MT_EV_ALLOC, seg, 1 * MIB);
        put_pid(r, &g, pid, MT_EV_ALLOC, seg + 1 * MIB, 512 * 1024);
        if (i + 1 < steps) {
            put_pid(r, &g, pid, MT_EV_FREE_REQUESTED, seg + 1 * MIB, 512 * 1024);
            put_pid(r, &g, pid, MT_EV_FREE_COMPLETED, seg + 1 * MIB, 512 * 1024);
        }
    }
    put_pid(r, &g, pid, MT_EV_SEGMENT_ALLOC, BASE + ((uint64_t)1 << 40),
            8 * MIB); /* past every step's */
    put_pid(r, &g, pid, MT_EV_FREE_REQUESTED, BASE + 256 * MIB + (steps - 1) * 2 * MIB + 1 * MIB,
            512 * 1024);
}

/* peak_gap of a process feed_growth made: the state right after the event that set the last
 * peak (not the segment mapped after it). */
static void check_growth(json_t *proc, uint64_t steps)
{
    json_t *peak = json_object_get(proc, "peak_gap");
    assert_int_equal(json_integer_value(json_object_get(peak, "allocated_bytes")),
                     steps * MIB + 512 * 1024);
    assert_int_equal(json_integer_value(json_object_get(peak, "reserved_bytes")),
                     64 * MIB + steps * 2 * MIB);
    assert_int_equal(cause_json(peak, "cached_segments"), 64 * MIB);
    assert_int_equal(cause_json(peak, "pinned_free"), (steps - 1) * MIB + 512 * 1024);
    assert_int_equal(sum_causes(peak), json_integer_value(json_object_get(peak, "gap_bytes")));
    json_t *end = json_object_get(proc, "end_gap");
    assert_int_equal(json_integer_value(json_object_get(end, "reserved_bytes")),
                     72 * MIB + steps * 2 * MIB);
}

/* The report follows the peak's state with a lagging model while few events wait below the
 * peak, and copies it as before past its bound: the same peak_gap either way. */
static void test_peak_gap_of_growth(void **state)
{
    (void)state;
    static const unsigned below[] = {10, 30000}; /* 90 000 events: past one lag's bound */
    for (int k = 0; k < 2; k++) {
        mt__report_t *r = NULL;
        assert_int_equal(mt__report_create(&r, NULL), 0);
        feed_growth(r, 1, below[k], 50);
        json_t *res = mt__report_result(r);
        assert_non_null(res);
        check_growth(json_array_get(json_object_get(res, "processes"), 0), 50);
        json_decref(res);
        mt__report_destroy(&r);
    }
}

/* A leak of 20 000 steps (100 000 events, a new peak at each step): the list of events
 * fills and the lagging model catches up to the peak on the way, several times. */
static void test_peak_gap_long_leak(void **state)
{
    (void)state;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    feed_growth(r, 1, 10, 20000);
    json_t *res = mt__report_result(r);
    assert_non_null(res);
    check_growth(json_array_get(json_object_get(res, "processes"), 0), 20000);
    json_decref(res);
    mt__report_destroy(&r);
}

/* Seventeen processes whose lags each reach 65 536 entries: the report's bound for all of
 * them (16 such) drops the last one's lagging model; every peak_gap is still right. */
static void test_peak_gap_many_processes(void **state)
{
    (void)state;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    enum { PROCS = 17 };
    for (int pid = 1; pid <= PROCS; pid++)
        feed_growth(r, pid, 12000, 50); /* 36 000 events below the peak: a lag of 65 536 */
    json_t *res = mt__report_result(r);
    assert_non_null(res);
    json_t *procs = json_object_get(res, "processes");
    assert_int_equal(json_array_size(procs), PROCS);
    for (size_t i = 0; i < PROCS; i++)
        check_growth(json_array_get(procs, i), 50);
    json_decref(res);
    mt__report_destroy(&r);
}

/* Pins whose stacks differ below the user's frame read as one site: one row, the sums, the
 * first row's stack; largest first. */
static void test_pins_by_site(void **state)
{
    (void)state;
    json_t *pins = json_pack(
        "[{s:i,s:s,s:i,s:i,s:i}, {s:i,s:s,s:i,s:i,s:i}, {s:i,s:s,s:i,s:i,s:i},"
        " {s:i,s:s,s:i,s:i,s:i}]",
        "stack", 7, "site", "a.py:21 <module>", "bytes", 100, "segments", 2, "largest_block_bytes",
        10, "stack", 8, "site", "b.py:3 f", "bytes", 90, "segments", 1, "largest_block_bytes", 50,
        "stack", 9, "site", "a.py:21 <module>", "bytes", 60, "segments", 3, "largest_block_bytes",
        30, "stack", 11, "site", "b.py:3 f", "bytes", 5, "segments", 1, "largest_block_bytes", 5);
    assert_non_null(pins);
    mt__gap_pins_by_site(pins, SIZE_MAX);
    assert_int_equal(json_array_size(pins), 2);
    json_t *a = json_array_get(pins, 0), *b = json_array_get(pins, 1);
    assert_string_equal(json_string_value(json_object_get(a, "site")), "a.py:21 <module>");
    assert_int_equal(json_integer_value(json_object_get(a, "bytes")), 160);
    assert_int_equal(json_integer_value(json_object_get(a, "segments")), 5);
    assert_int_equal(json_integer_value(json_object_get(a, "largest_block_bytes")), 30);
    assert_int_equal(json_integer_value(json_object_get(a, "stack")), 7);
    assert_int_equal(json_integer_value(json_object_get(b, "bytes")), 95);
    assert_int_equal(json_integer_value(json_object_get(b, "segments")), 2);
    json_decref(pins);
    /* largest first after merging: two small rows of one site pass a larger one */
    pins = json_pack("[{s:s,s:i,s:i}, {s:s,s:i,s:i}, {s:s,s:i,s:i}]", "site", "x", "bytes", 50,
                     "segments", 1, "site", "y", "bytes", 40, "segments", 1, "site", "y", "bytes",
                     30, "segments", 1);
    mt__gap_pins_by_site(pins, SIZE_MAX);
    assert_int_equal(json_array_size(pins), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(pins, 0), "site")), "y");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(pins, 0), "bytes")), 70);
    json_decref(pins);
    /* the cut comes after the join: a site's rows beyond the first top still count */
    pins = json_pack("[{s:s,s:i,s:i}, {s:s,s:i,s:i}, {s:s,s:i,s:i}]", "site", "x", "bytes", 50,
                     "segments", 1, "site", "z", "bytes", 40, "segments", 1, "site", "x", "bytes",
                     30, "segments", 1);
    mt__gap_pins_by_site(pins, 1);
    assert_int_equal(json_array_size(pins), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(pins, 0), "bytes")), 80);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(pins, 0), "segments")), 2);
    json_decref(pins);
    /* sums saturate */
    pins = json_pack("[{s:s,s:I}, {s:s,s:I}]", "site", "x", "bytes", (json_int_t)LLONG_MAX - 5,
                     "site", "x", "bytes", (json_int_t)100);
    mt__gap_pins_by_site(pins, 10);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(pins, 0), "bytes")),
                     LLONG_MAX);
    json_decref(pins);
}

/* The join as first written (pairwise, then an insertion by bytes): what the sorts must
 * give on any rows. */
static json_int_t ref_int(json_t *r, const char *k)
{
    json_int_t v = json_integer_value(json_object_get(r, k));
    return v > 0 ? v : 0;
}

static void ref_by_site(json_t *pins, size_t top)
{
    for (size_t i = 0; i < json_array_size(pins); i++) {
        json_t *a = json_array_get(pins, i);
        const char *site = json_string_value(json_object_get(a, "site"));
        for (size_t j = i + 1; site != NULL && j < json_array_size(pins);) {
            json_t *b = json_array_get(pins, j);
            const char *other = json_string_value(json_object_get(b, "site"));
            if (other == NULL || strcmp(site, other) != 0) {
                j++;
                continue;
            }
            json_int_t big = ref_int(a, "largest_block_bytes"),
                       bb = ref_int(b, "largest_block_bytes");
            json_object_set_new(a, "bytes",
                                json_integer(ref_int(a, "bytes") + ref_int(b, "bytes")));
            json_object_set_new(a, "segments",
                                json_integer(ref_int(a, "segments") + ref_int(b, "segments")));
            json_object_set_new(a, "largest_block_bytes", json_integer(big > bb ? big : bb));
            json_array_remove(pins, j);
        }
    }
    for (size_t i = 1; i < json_array_size(pins); i++) {
        size_t k = i;
        json_t *x = json_incref(json_array_get(pins, i));
        while (k > 0 && ref_int(json_array_get(pins, k - 1), "bytes") < ref_int(x, "bytes"))
            k--;
        if (k != i) {
            json_array_remove(pins, i);
            json_array_insert(pins, k, x);
        }
        json_decref(x);
    }
    while (json_array_size(pins) > top)
        json_array_remove(pins, json_array_size(pins) - 1);
}

/* Random rows (few sites, some rows without one, many ties in bytes) joined by the sorts and
 * by the pairwise reference: the same rows in the same order. */
static void test_pins_by_site_random(void **state)
{
    (void)state;
    static const char *const names[] = {"a.py:1 f", "a.py:2 g", "b.py:9 h", "c.py:4 k", "d.py:7 m"};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int round = 0; round < 300; round++) {
        json_t *pins = json_array();
        assert_non_null(pins);
        size_t n = (size_t)(round % 40);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            json_t *r = json_pack("{s:i,s:I,s:I,s:I}", "stack", (int)i + 1, "bytes",
                                  (json_int_t)(x % 7) * 100, "segments", (json_int_t)(x >> 8) % 3,
                                  "largest_block_bytes", (json_int_t)(x >> 16) % 50);
            assert_non_null(r);
            if ((x >> 24) % 6 != 0)
                assert_int_equal(json_object_set_new(r, "site", json_string(names[(x >> 32) % 5])),
                                 0);
            assert_int_equal(json_array_append_new(pins, r), 0);
        }
        json_t *want = json_deep_copy(pins);
        assert_non_null(want);
        size_t top = round % 3 == 0 ? SIZE_MAX : (size_t)(round % 7);
        assert_int_equal(mt__gap_pins_by_site(pins, top), 0);
        ref_by_site(want, top);
        assert_true(json_equal(pins, want));
        json_decref(pins);
        json_decref(want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_cause_at_the_end),   cmocka_unit_test(test_untracked_reserved),
        cmocka_unit_test(test_unknown_requests),        cmocka_unit_test(test_pins_by_site),
        cmocka_unit_test(test_pins_by_site_random),     cmocka_unit_test(test_peak_gap_of_growth),
        cmocka_unit_test(test_peak_gap_many_processes), cmocka_unit_test(test_peak_gap_long_leak),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
