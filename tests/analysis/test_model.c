/* The event model on hand-written streams: three cases (an unmap covering
 * several maps, phantom tag bytes after a gap, sums near 2^63), gap rules, and the report
 * and plot reading the same figures. The checker runs after every event. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>

#include "analysis/report.h"
#include "model_gen.h"
#include "tests/common/test_main.h"

#define MIB  (UINT64_C(1) << 20)
#define BASE UINT64_C(0x7f0000000000)

static void check(const mt_model_t *m)
{
    char why[256] = "";
    int rc = mt__model_check(m, why, sizeof why);
    if (rc != 0)
        fail_msg("mt__model_check: %s", why);
}

/* Applies ev to the model and, when r is set, adds it to the report as process pid 1. */
static void put(mgen_t *g, mt__report_t *r, int kind, uint64_t addr, uint64_t size, int tag)
{
    mt_event_rec_t ev = mgen_rec(g, kind, addr, size, tag);
    if (g->m) {
        assert_int_equal(mt__model_apply(g->m, &ev), 0);
        check(g->m);
    }
    if (r)
        assert_int_equal(mt__report_add_event(r, 1, &ev, NULL), 0);
}

static void assert_bounded(const mt_model_figures_t *f)
{
    assert_true(f->utilization >= 0.0 && f->utilization <= 1.0);
    assert_true(f->fragmentation >= 0.0 && f->fragmentation <= 1.0);
    assert_true(f->total_free <= f->reserved);
    assert_true(f->largest_free <= f->total_free);
    assert_true(f->uncertain_bytes <= f->allocated);
    assert_true(f->untracked_bytes <= f->allocated);
}

static json_t *report_process(mt__report_t *r)
{
    json_t *res = mt__report_result(r);
    assert_non_null(res);
    return res;
}

/* ---- case 1: one unmap covers several maps ---- */

static void test_unmap_covers_several_maps(void **state)
{
    (void)state;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    mgen_t g = {0};
    assert_int_equal(mt__model_create(&g.m, NULL), 0);
    /* An expandable segment mapped 20 MiB at a time up to 80 MiB, a block in each piece. */
    for (int i = 0; i < 4; i++) {
        put(&g, r, MT_EV_SEGMENT_MAP, BASE + i * 20 * MIB, 20 * MIB, 0);
        put(&g, r, MT_EV_ALLOC, BASE + i * 20 * MIB, 10 * MIB, MT_TAG_ACTIVATIONS);
    }
    mt_model_figures_t f;
    assert_int_equal(mt__model_figures(g.m, MT_MODEL_DEVICE, &f), 0);
    assert_int_equal(f.reserved, 80 * MIB);
    assert_int_equal(f.segments, 1); /* adjacent mapped pages: one range */
    /* The upper two blocks go, then one unmap releases the upper 40 MiB (two maps). */
    for (int i = 2; i < 4; i++) {
        put(&g, r, MT_EV_FREE_REQUESTED, BASE + i * 20 * MIB, 10 * MIB, MT_TAG_ACTIVATIONS);
        put(&g, r, MT_EV_FREE_COMPLETED, BASE + i * 20 * MIB, 10 * MIB, MT_TAG_ACTIVATIONS);
    }
    put(&g, r, MT_EV_SEGMENT_UNMAP, BASE + 40 * MIB, 40 * MIB, 0);
    assert_int_equal(mt__model_figures(g.m, MT_MODEL_DEVICE, &f), 0);
    assert_int_equal(f.reserved, 40 * MIB);
    assert_int_equal(f.total_free, 20 * MIB); /* [10,20) and [30,40) */
    assert_int_equal(f.largest_free, 10 * MIB);
    assert_true(f.fragmentation > 0.499 && f.fragmentation < 0.501);
    mt_model_map_t map;
    assert_int_equal(mt__model_map(g.m, MT_MODEL_DEVICE, &map), 0);
    assert_int_equal(map.nsegs, 1);
    assert_int_equal(map.segs[0].size, 40 * MIB);
    assert_int_equal(map.segs[0].used, 20 * MIB);
    mt__model_map_free(&map);

    /* The plot's map and the report's figures: 40 MiB mapped, not 80. */
    mt__report_map_t pm;
    int pid;
    const char *name;
    size_t events;
    assert_int_equal(mt__report_process(r, 0, &pid, &name, &events), 0);
    assert_int_equal(mt__report_map_at(r, 0, events - 1, false, &pm), 0);
    uint64_t mapped = 0;
    for (size_t i = 0; i < pm.nsegs; i++)
        mapped += pm.segs[i].size;
    assert_int_equal(mapped, 40 * MIB);
    mt__report_map_free(&pm);
    json_t *res = report_process(r);
    json_t *p = json_array_get(json_object_get(res, "processes"), 0);
    assert_int_equal(json_integer_value(json_object_get(p, "final_reserved")), 40 * MIB);
    json_t *tl = json_object_get(p, "timeline");
    json_t *last = json_array_get(tl, json_array_size(tl) - 1);
    double frag = json_real_value(json_object_get(last, "fragmentation"));
    assert_true(frag > 0.499 && frag < 0.501);
    json_decref(res);
    mt__report_destroy(&r);
    mt__model_destroy(&g.m);
}

/* An unmap in the middle of mapped pages splits them; a later map does not join a range
 * across the hole. */
static void test_unmap_middle_splits(void **state)
{
    (void)state;
    mgen_t g = {0};
    assert_int_equal(mt__model_create(&g.m, NULL), 0);
    put(&g, NULL, MT_EV_SEGMENT_MAP, BASE, 60 * MIB, 0);
    put(&g, NULL, MT_EV_SEGMENT_UNMAP, BASE + 20 * MIB, 20 * MIB, 0);
    mt_model_map_t map;
    assert_int_equal(mt__model_map(g.m, MT_MODEL_DEVICE, &map), 0);
    assert_int_equal(map.nsegs, 2);
    assert_int_equal(map.segs[0].size, 20 * MIB);
    assert_int_equal(map.segs[1].addr, BASE + 40 * MIB);
    assert_int_equal(map.total_free, 40 * MIB);
    mt__model_map_free(&map);
    mt__model_destroy(&g.m);
}

/* ---- case 2: phantom tag bytes after a gap ---- */

static void test_gap_no_phantom_tags(void **state)
{
    (void)state;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    mgen_t g = {0};
    assert_int_equal(mt__model_create(&g.m, NULL), 0);
    put(&g, r, MT_EV_SEGMENT_ALLOC, BASE, 64 * MIB, 0);
    for (int i = 0; i < 8; i++)
        put(&g, r, MT_EV_ALLOC, BASE + i * 4 * MIB, 4 * MIB, MT_TAG_ACTIVATIONS);
    put(&g, r, MT_EV_ALLOC, BASE + 40 * MIB, 8 * MIB, MT_TAG_WEIGHTS);
    /* Six frees are lost: their events never reach the model (a seq jump). */
    for (int i = 0; i < 6; i++) {
        (void)mgen_rec(&g, MT_EV_FREE_REQUESTED, BASE + i * 4 * MIB, 4 * MIB, MT_TAG_ACTIVATIONS);
        (void)mgen_rec(&g, MT_EV_FREE_COMPLETED, BASE + i * 4 * MIB, 4 * MIB, MT_TAG_ACTIVATIONS);
    }
    /* The next event: a new allocation over the first lost block's place. */
    put(&g, r, MT_EV_ALLOC, BASE, 2 * MIB, MT_TAG_GRADS);
    assert_int_equal(mt__model_lost(g.m), 12);
    mt_model_figures_t f;
    mt_model_tag_t act, w, gr;
    assert_int_equal(mt__model_figures(g.m, MT_MODEL_DEVICE, &f), 0);
    assert_bounded(&f);
    mt__model_tag(g.m, MT_MODEL_DEVICE, MT_TAG_ACTIVATIONS, &act);
    mt__model_tag(g.m, MT_MODEL_DEVICE, MT_TAG_WEIGHTS, &w);
    mt__model_tag(g.m, MT_MODEL_DEVICE, MT_TAG_GRADS, &gr);
    assert_int_equal(gr.bytes, 2 * MIB);  /* seen after the gap: certain */
    assert_int_equal(act.bytes, 0);       /* no longer counted as allocated ... */
    assert_true(act.uncertain_bytes > 0); /* ... but marked uncertain */
    assert_true(f.uncertain);
    /* allocated = 2 + 8 + 8 MiB: the known 2 MiB leave room for 16 MiB of the 36 MiB of
     * uncertain blocks (the one the new block overlaps is gone); none is larger than
     * that, so none is proven gone yet. The uncertain figures are bounded by the room. */
    assert_int_equal(f.allocated, 18 * MIB);
    assert_int_equal(f.uncertain_bytes, 16 * MIB);
    assert_int_equal(act.uncertain_bytes, 16 * MIB);
    assert_int_equal(w.uncertain_bytes, 8 * MIB);
    assert_int_equal(act.uncertain_blocks, 7);

    /* The program frees everything it still holds and exits cleanly. */
    for (int i = 6; i < 8; i++) {
        put(&g, r, MT_EV_FREE_REQUESTED, BASE + i * 4 * MIB, 4 * MIB, MT_TAG_ACTIVATIONS);
        put(&g, r, MT_EV_FREE_COMPLETED, BASE + i * 4 * MIB, 4 * MIB, MT_TAG_ACTIVATIONS);
    }
    put(&g, r, MT_EV_FREE_REQUESTED, BASE + 40 * MIB, 8 * MIB, MT_TAG_WEIGHTS);
    put(&g, r, MT_EV_FREE_COMPLETED, BASE + 40 * MIB, 8 * MIB, MT_TAG_WEIGHTS);
    put(&g, r, MT_EV_FREE_REQUESTED, BASE, 2 * MIB, MT_TAG_GRADS);
    put(&g, r, MT_EV_FREE_COMPLETED, BASE, 2 * MIB, MT_TAG_GRADS);
    assert_int_equal(g.allocated, 0);
    assert_int_equal(mt__model_figures(g.m, MT_MODEL_DEVICE, &f), 0);
    assert_int_equal(f.allocated, 0);
    assert_int_equal(f.uncertain_bytes, 0);
    assert_false(f.uncertain);
    for (int t = 0; t < MT_TAG_MAX; t++) {
        mt_model_tag_t tg;
        mt__model_tag(g.m, MT_MODEL_DEVICE, t, &tg);
        assert_int_equal(tg.bytes, 0);
        assert_int_equal(tg.uncertain_bytes, 0);
    }
    assert_int_equal(f.blocks, 0);
    assert_int_equal(f.total_free, 64 * MIB);

    /* The report: never-freed agrees with the final allocated total (0). */
    assert_int_equal(mt__report_set_process(r, 1, "trainer", 1), 0);
    json_t *res = report_process(r);
    json_t *p = json_array_get(json_object_get(res, "processes"), 0);
    assert_string_equal(json_string_value(json_object_get(p, "name")), "trainer");
    assert_string_equal(json_string_value(json_object_get(p, "exit")), "clean");
    assert_int_equal(json_integer_value(json_object_get(p, "final_allocated")), 0);
    json_t *nf = json_object_get(p, "never_freed");
    assert_int_equal(json_integer_value(json_object_get(nf, "bytes")), 0);
    assert_int_equal(json_integer_value(json_object_get(nf, "count")), 0);
    assert_int_equal(json_integer_value(json_object_get(p, "lost")), 12);
    json_decref(res);
    mt__report_destroy(&r);
    mt__model_destroy(&g.m);
}

/* Gaps in a row with blocks between them: each gap makes only the blocks seen since
 * uncertain (the uncertain ones kept first in the block table, their index merged), while
 * frees settle or remove uncertain blocks from the middle and an address is reused with
 * another size. mt__model_check (after each event) holds the table's order, the index and
 * the sums; the figures count every block still live. */
static void test_gaps_in_a_row(void **state)
{
    (void)state;
    mgen_t g = {0};
    assert_int_equal(mt__model_create(&g.m, NULL), 0);
    put(&g, NULL, MT_EV_SEGMENT_ALLOC, BASE, 1024 * MIB, 0);
    enum { ROUNDS = 40, NEW = 3 };
    uint64_t live = 0;
    for (uint64_t r = 0; r < ROUNDS; r++) {
        for (uint64_t i = 0; i < NEW; i++) /* certain until the next gap */
            put(&g, NULL, MT_EV_ALLOC, BASE + (r * NEW + i) * MIB, 4096 * (i + 1), 0);
        live += NEW;
        if (r > 0) { /* an uncertain block from the round before, freed: settled, then gone */
            uint64_t a = BASE + ((r - 1) * NEW + 1) * MIB;
            put(&g, NULL, MT_EV_FREE_REQUESTED, a, 4096 * 2, 0);
            put(&g, NULL, MT_EV_FREE_COMPLETED, a, 4096 * 2, 0);
            live--;
        }
        /* one of this round's, freed while certain, and its address reused larger */
        uint64_t b = BASE + (r * NEW + 2) * MIB;
        put(&g, NULL, MT_EV_FREE_REQUESTED, b, 4096 * 3, 0);
        put(&g, NULL, MT_EV_FREE_COMPLETED, b, 4096 * 3, 0);
        put(&g, NULL, MT_EV_ALLOC, b, 8192 * 3, 0);
        (void)mgen_rec(&g, MT_EV_ALLOC, BASE + 900 * MIB, 4096, 0); /* lost: a gap next */
        put(&g, NULL, MT_EV_SEGMENT_ALLOC, BASE + (2048 + r) * MIB, MIB, 0);
    }
    mt_model_figures_t f;
    assert_int_equal(mt__model_figures(g.m, MT_MODEL_DEVICE, &f), 0);
    assert_true(f.uncertain);
    /* every block is uncertain now: the last event came after the last gap */
    mt_model_tag_t t;
    mt__model_tag(g.m, MT_MODEL_DEVICE, 0, &t);
    assert_int_equal(t.bytes, 0);
    assert_int_equal(t.uncertain_blocks, live);
    /* The segment they were in is freed: every one goes, from anywhere in the table. */
    put(&g, NULL, MT_EV_SEGMENT_FREE, BASE, 1024 * MIB, 0);
    mt__model_tag(g.m, MT_MODEL_DEVICE, 0, &t);
    assert_int_equal(t.uncertain_blocks, 0);
    mt__model_destroy(&g.m);
}

/* A gap record (the daemon's) makes blocks uncertain too; a segment free proves the
 * uncertain blocks in it gone, and the totals bound them. */
static void test_gap_record_and_segment_free(void **state)
{
    (void)state;
    mgen_t g = {0};
    assert_int_equal(mt__model_create(&g.m, NULL), 0);
    put(&g, NULL, MT_EV_SEGMENT_ALLOC, BASE, 2 * MIB, 0);
    put(&g, NULL, MT_EV_SEGMENT_ALLOC, BASE + 2 * MIB, 2 * MIB, 0);
    put(&g, NULL, MT_EV_ALLOC, BASE, MIB, MT_TAG_BATCH);
    put(&g, NULL, MT_EV_ALLOC, BASE + 2 * MIB, MIB, MT_TAG_BATCH);
    mt_event_rec_t gap = {.kind = MT_EV_GAP, .size = 3};
    assert_int_equal(mt__model_apply(g.m, &gap), 0);
    check(g.m);
    mt_model_tag_t tg;
    mt__model_tag(g.m, MT_MODEL_DEVICE, MT_TAG_BATCH, &tg);
    assert_int_equal(tg.bytes, 0);
    assert_int_equal(tg.uncertain_bytes, 2 * MIB);
    /* Lost: the free of the first block. Seen: the free of its segment (the allocator
     * frees only empty segments), which proves it gone. */
    g.allocated -= MIB;
    put(&g, NULL, MT_EV_SEGMENT_FREE, BASE, 2 * MIB, 0);
    mt__model_tag(g.m, MT_MODEL_DEVICE, MT_TAG_BATCH, &tg);
    assert_int_equal(tg.uncertain_bytes, MIB);
    /* The second block's free is seen: it was live, and now nothing is uncertain. */
    put(&g, NULL, MT_EV_FREE_REQUESTED, BASE + 2 * MIB, MIB, MT_TAG_BATCH);
    mt_model_figures_t f;
    assert_int_equal(mt__model_figures(g.m, MT_MODEL_DEVICE, &f), 0);
    assert_false(f.uncertain);
    assert_int_equal(f.segments, 1);
    mt__model_destroy(&g.m);
}

/* ---- case 3: sums near 2^63 ---- */

static void test_overflow_saturates(void **state)
{
    (void)state;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    mt_model_t *m = NULL;
    assert_int_equal(mt__model_create(&m, NULL), 0);
    const uint64_t huge = (UINT64_C(1) << 63) + 4096;
    /* Two devices each claiming more than 2^63 bytes (a forged ring): the sums exceed
     * 2^64, blocks and segments run past the top of the address space. */
    for (int dev = 0; dev < 2; dev++) {
        mt_event_rec_t seg = {.seq = (uint64_t)dev * 4,
                              .kind = MT_EV_SEGMENT_ALLOC,
                              .addr = UINT64_MAX - 8192 * (uint64_t)(dev + 1),
                              .size = huge,
                              .allocated = huge,
                              .reserved = huge,
                              .pool = MT_POOL_LARGE,
                              .device = (uint8_t)dev};
        mt_event_rec_t a1 = seg, a2 = seg, a3 = seg;
        a1.seq++, a2.seq += 2, a3.seq += 3;
        a1.kind = a2.kind = a3.kind = MT_EV_ALLOC;
        a1.addr = UINT64_C(1) << 40;
        a1.size = huge;
        a2.addr = (UINT64_C(1) << 40) + 512;
        a2.size = UINT64_MAX;
        a3.addr = 4096 * (uint64_t)(dev + 1);
        a3.size = huge;
        a3.tag = MT_TAG_WEIGHTS;
        const mt_event_rec_t *evs[] = {&seg, &a1, &a2, &a3};
        for (int i = 0; i < 4; i++) {
            assert_int_equal(mt__model_apply(m, evs[i]), 0);
            check(m);
            assert_int_equal(mt__report_add_event(r, 7, evs[i], NULL), 0);
        }
    }
    mt_model_figures_t f;
    assert_int_equal(mt__model_figures(m, MT_MODEL_DEVICE, &f), 0);
    assert_int_equal(f.allocated, UINT64_MAX); /* saturated, not wrapped */
    assert_int_equal(f.reserved, UINT64_MAX);
    assert_bounded(&f);
    mt_model_tag_t tg;
    mt__model_tag(m, MT_MODEL_DEVICE, MT_TAG_WEIGHTS, &tg);
    assert_int_equal(tg.bytes, UINT64_MAX);
    assert_true(tg.peak <= f.peak_allocated);

    /* The report writes no negative figure and keeps fractions in [0, 1]. */
    json_t *res = report_process(r);
    json_t *p = json_array_get(json_object_get(res, "processes"), 0);
    const char *keys[] = {"peak_allocated", "peak_reserved", "final_allocated", "final_reserved"};
    for (size_t i = 0; i < 4; i++)
        assert_true(json_integer_value(json_object_get(p, keys[i])) > 0);
    json_t *tl = json_object_get(p, "timeline"), *pt;
    size_t i;
    json_array_foreach(tl, i, pt)
    {
        double fr = json_real_value(json_object_get(pt, "fragmentation"));
        double ut = json_real_value(json_object_get(pt, "utilization"));
        assert_true(fr >= 0 && fr <= 1 && ut >= 0 && ut <= 1);
        assert_true(json_integer_value(json_object_get(pt, "allocated")) >= 0);
    }
    json_t *nf = json_object_get(p, "never_freed");
    assert_true(json_integer_value(json_object_get(nf, "bytes")) > 0);
    json_decref(res);
    mt__report_destroy(&r);
    mt__model_destroy(&m);
}

static void test_ratios_defined_once(void **state)
{
    (void)state;
    assert_true(mt__model_fragmentation(0, 0) == 0.0);
    assert_true(mt__model_fragmentation(UINT64_MAX, 1) == 0.0);
    assert_true(mt__model_fragmentation(1, 4) == 0.75);
    assert_true(mt__model_utilization(5, 0) == 1.0);
    assert_true(mt__model_utilization(UINT64_MAX, 1) == 1.0);
    assert_true(mt__model_utilization(1, 4) == 0.25);
    assert_int_equal(mt_model_sat_add(UINT64_MAX - 1, 2), UINT64_MAX);
    assert_int_equal(mt_model_sat_mul(UINT64_C(1) << 40, UINT64_C(1) << 40), UINT64_MAX);
}

/* Host memory is a class of its own; sources sum within a class. */
/* A setting changed at run time is kept in the model, in order, and the report lists it
 * with its config key; a log without one has no such member. */
static void test_settings_changes(void **state)
{
    (void)state;
    mgen_t g = {0};
    assert_int_equal(mt__model_create(&g.m, NULL), 0);
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    put(&g, r, MT_EV_SEGMENT_ALLOC, BASE, 20 * MIB, 0);
    put(&g, r, MT_EV_ALLOC, BASE, 4 * MIB, MT_TAG_WEIGHTS);
    mt_event_rec_t ev = mgen_rec(&g, MT_EV_SETTING, MT_SETTING_MAX_SPLIT_SIZE, 64 * MIB, 0);
    ev.requested = UINT64_MAX;
    assert_int_equal(mt__model_apply(g.m, &ev), 0);
    assert_int_equal(mt__report_add_event(r, 1, &ev, NULL), 0);
    ev = mgen_rec(&g, MT_EV_SETTING, MT_SETTING_ROUNDUP_0 + 2, 4, 0);
    assert_int_equal(mt__model_apply(g.m, &ev), 0);
    assert_int_equal(mt__report_add_event(r, 1, &ev, NULL), 0);
    check(g.m);
    const mt_model_setting_t *v;
    size_t n;
    uint64_t dropped;
    mt__model_settings(g.m, &v, &n, &dropped);
    assert_int_equal(n, 2);
    assert_int_equal(dropped, 0);
    assert_int_equal(v[0].id, MT_SETTING_MAX_SPLIT_SIZE);
    assert_int_equal(v[0].value, 64 * MIB);
    assert_true(v[0].before == UINT64_MAX);
    assert_int_equal(v[1].id, MT_SETTING_ROUNDUP_0 + 2);
    mt_model_figures_t f;
    assert_int_equal(mt__model_figures(g.m, MT_MODEL_DEVICE, &f), 0);
    assert_int_equal(f.allocated, 4 * MIB); /* no operation on memory */
    json_t *res = report_process(r);
    json_t *p = json_array_get(json_object_get(res, "processes"), 0);
    json_t *sc = json_object_get(p, "settings_changes");
    assert_int_equal(json_array_size(sc), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(sc, 0), "key")),
                        "max_split_size_mb");
    assert_string_equal(json_string_value(json_object_get(json_array_get(sc, 1), "key")),
                        "roundup_power2_divisions[2]");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(sc, 1), "value")), 4);
    json_decref(res);
    mt__report_destroy(&r);
    mt__model_destroy(&g.m);
}

static void test_classes_and_sources(void **state)
{
    (void)state;
    mgen_t d0 = {0}, d1 = {.device = 1}, h = {.pool = MT_POOL_HOST};
    mt_model_t *m = NULL;
    assert_int_equal(mt__model_create(&m, NULL), 0);
    d0.m = d1.m = h.m = m;
    put(&d0, NULL, MT_EV_SEGMENT_ALLOC, BASE, 2 * MIB, 0);
    put(&d1, NULL, MT_EV_SEGMENT_ALLOC, BASE + 4 * MIB, 2 * MIB, 0);
    d1.seq = d0.seq;
    h.seq = d1.seq;
    put(&h, NULL, MT_EV_SEGMENT_ALLOC, 0x1000000, 8 * MIB, 0);
    d0.seq = h.seq;
    put(&d0, NULL, MT_EV_ALLOC, BASE, MIB, MT_TAG_WEIGHTS);
    mt_model_figures_t f;
    assert_int_equal(mt__model_figures(m, MT_MODEL_DEVICE, &f), 0);
    assert_int_equal(f.reserved, 4 * MIB);
    assert_int_equal(f.allocated, MIB);
    assert_int_equal(mt__model_lost(m), 0);
    assert_int_equal(mt__model_figures(m, MT_MODEL_HOST, &f), 0);
    assert_int_equal(f.reserved, 8 * MIB);
    uint64_t a, res;
    mt__model_device(m, 1, false, &a, &res);
    assert_int_equal(res, 2 * MIB);
    assert_int_equal(mt__model_pool_bytes(m, MT_POOL_LARGE), MIB);
    mt__model_destroy(&m);
}

/* ---- temporary allocations ---- */

static bool check_each = true; /* the checker after every temporary test event */

/* One record of device 0 at t_ns, totals alloc (reserved 1 GiB), checked after. */
static void tput(mt_model_t *m, uint64_t *seq, int kind, uint64_t addr, uint64_t size, int tag,
                 uint64_t t_ns, uint64_t alloc)
{
    mt_event_rec_t ev = {.seq = (*seq)++,
                         .time_ns = t_ns,
                         .addr = addr,
                         .size = size,
                         .requested = size,
                         .allocated = alloc,
                         .reserved = 1024 * MIB,
                         .kind = (uint8_t)kind,
                         .pool = MT_POOL_LARGE,
                         .tag = (uint8_t)tag};
    assert_int_equal(mt__model_apply(m, &ev), 0);
    if (check_each)
        check(m);
}

/* Allocates size at addr with stack id (0: none) at t us, frees it life us later. */
static void tblock(mt_model_t *m, uint64_t *seq, uint32_t stack, uint64_t addr, uint64_t size,
                   int tag, uint64_t t, uint64_t life)
{
    if (stack != 0)
        tput(m, seq, MT_EV_STACK_REF, addr, stack, tag, t * 1000, 0);
    tput(m, seq, MT_EV_ALLOC, addr, size, tag, t * 1000, size);
    tput(m, seq, MT_EV_FREE_REQUESTED, addr, size, tag, (t + life) * 1000, 0);
    tput(m, seq, MT_EV_FREE_COMPLETED, addr, size, tag, (t + life) * 1000 + 1, 0);
}

static void test_temporary_buckets(void **state)
{
    (void)state;
    for (uint64_t v = 0; v < 32; v++)
        assert_int_equal(mt__model_temp_bucket_low(mt__model_temp_bucket(v)), v);
    size_t last = 0;
    for (uint64_t v = 1; v < (UINT64_C(1) << 40); v = v * 5 / 4 + 1) {
        size_t b = mt__model_temp_bucket(v);
        uint64_t lo = mt__model_temp_bucket_low(b);
        assert_true(b >= last);                   /* monotonic */
        assert_true(lo <= v && v - lo <= v / 32); /* within 1/32 below */
        assert_int_equal(mt__model_temp_bucket(lo), b);
        last = b;
    }
    uint64_t h[40] = {0};
    assert_int_equal(mt__model_temp_median_us(h, 40), 0);
    h[3] = 2, h[9] = 2; /* {3, 3, 9, 9}: the lower median is 3 */
    assert_int_equal(mt__model_temp_median_us(h, 40), 3);
    h[9] = 3;
    assert_int_equal(mt__model_temp_median_us(h, 40), 9);
}

static void test_temporary_by_stack_and_tag(void **state)
{
    (void)state;
    mt_model_t *m = NULL;
    mt_model_cfg_t cfg = mt__model_cfg_default();
    assert_int_equal(cfg.temporary_window_us, MT_MODEL_TEMP_WINDOW_US);
    cfg.temporary_window_us = 1000;
    assert_int_equal(mt__model_create(&m, &cfg), 0);
    assert_int_equal(mt__model_temp_buckets(m), mt__model_temp_bucket(1000) + 1);
    uint64_t seq = 0, t = 10;
    const uint64_t lives[] = {100, 3, 40, 7, 5}; /* stack 7: median 7 */
    for (size_t i = 0; i < 5; i++, t += 5000)
        tblock(m, &seq, 7, BASE, MIB, MT_TAG_ACTIVATIONS, t, lives[i]);
    tblock(m, &seq, 7, BASE, MIB, MT_TAG_ACTIVATIONS, t, 1001), t += 5000;   /* past the window */
    tblock(m, &seq, 9, BASE, 2 * MIB, MT_TAG_WORKSPACE, t, 1000), t += 5000; /* at it */
    tblock(m, &seq, 0, BASE, 512, MT_TAG_WORKSPACE, t, 2), t += 5000;        /* no stack */
    /* no clock: never temporary */
    tput(m, &seq, MT_EV_ALLOC, BASE, MIB, MT_TAG_ACTIVATIONS, 0, MIB);
    tput(m, &seq, MT_EV_FREE_REQUESTED, BASE, MIB, MT_TAG_ACTIVATIONS, 0, 0);
    tput(m, &seq, MT_EV_FREE_COMPLETED, BASE, MIB, MT_TAG_ACTIVATIONS, 0, 0);
    /* allocated before lost events: its lifetime is not known to be the block's */
    tput(m, &seq, MT_EV_ALLOC, BASE, MIB, MT_TAG_ACTIVATIONS, t * 1000, MIB);
    seq += 3;
    tput(m, &seq, MT_EV_FREE_REQUESTED, BASE, MIB, MT_TAG_ACTIVATIONS, (t + 1) * 1000, 0);

    mt_model_temp_t *rows = NULL;
    size_t n = 0, nb = mt__model_temp_buckets(m);
    assert_int_equal(mt__model_temporary(m, MT_MODEL_DEVICE, false, &rows, &n), 0);
    assert_int_equal(n, 3); /* id order */
    assert_int_equal(rows[0].key, 0);
    assert_int_equal(rows[0].count, 1);
    assert_int_equal(rows[0].bytes, 512);
    assert_int_equal(mt__model_temp_median_us(rows[0].hist, nb), 2);
    assert_int_equal(rows[1].key, 7);
    assert_int_equal(rows[1].count, 5);
    assert_int_equal(rows[1].bytes, 5 * MIB);
    assert_int_equal(mt__model_temp_median_us(rows[1].hist, nb), 7);
    assert_int_equal(rows[2].key, 9);
    assert_int_equal(rows[2].count, 1);
    assert_int_equal(mt__model_temp_median_us(rows[2].hist, nb),
                     mt__model_temp_bucket_low(mt__model_temp_bucket(1000)));
    free(rows);
    assert_int_equal(mt__model_temporary(m, MT_MODEL_DEVICE, true, &rows, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(rows[0].key, MT_TAG_ACTIVATIONS);
    assert_int_equal(rows[0].count, 5);
    assert_int_equal(rows[1].key, MT_TAG_WORKSPACE);
    assert_int_equal(rows[1].count, 2);
    assert_int_equal(rows[1].bytes, 2 * MIB + 512);
    free(rows);
    assert_int_equal(mt__model_temporary(m, MT_MODEL_HOST, false, &rows, &n), 0);
    assert_int_equal(n, 0);
    free(rows);
    mt__model_destroy(&m);

    /* window 0: nothing tracked */
    cfg.temporary_window_us = 0;
    assert_int_equal(mt__model_create(&m, &cfg), 0);
    seq = 0;
    tblock(m, &seq, 7, BASE, MIB, MT_TAG_ACTIVATIONS, 10, 1);
    assert_int_equal(mt__model_temporary(m, MT_MODEL_DEVICE, true, &rows, &n), 0);
    assert_int_equal(n, 0);
    free(rows);
    mt__model_destroy(&m);
}

/* Histogram memory is bounded: with the widest window (1184 buckets), about 1770 rows get
 * one; the rest still count, and the checker holds. */
static void test_temporary_hist_bound(void **state)
{
    (void)state;
    mt_model_t *m = NULL;
    mt_model_cfg_t cfg = {.temporary_window_us = MT_MODEL_TEMP_WINDOW_MAX};
    assert_int_equal(mt__model_create(&m, &cfg), 0);
    uint64_t seq = 0;
    check_each = false; /* each walk reads every histogram: once at the end */
    for (uint32_t id = 1; id <= 2500; id++)
        tblock(m, &seq, id, BASE, 512, MT_TAG_WORKSPACE, 10 * id, 1);
    check_each = true;
    check(m);
    mt_model_temp_t *rows = NULL;
    size_t n = 0, with = 0, nb = mt__model_temp_buckets(m);
    assert_int_equal(nb, mt__model_temp_bucket(MT_MODEL_TEMP_WINDOW_MAX) + 1);
    assert_int_equal(mt__model_temporary(m, MT_MODEL_DEVICE, false, &rows, &n), 0);
    assert_int_equal(n, 2500);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(rows[i].count, 1);
        with += rows[i].hist != NULL;
    }
    assert_true(with > 1000 && with < 2500);
    assert_true((with + 1) * nb * sizeof(uint64_t) <= (UINT64_C(16) << 20));
    free(rows);
    assert_int_equal(mt__model_temporary(m, MT_MODEL_DEVICE, true, &rows, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].count, 2500);
    assert_int_equal(mt__model_temp_median_us(rows[0].hist, nb), 1);
    free(rows);
    mt__model_destroy(&m);
}

/* Spans between iteration marks: each span's peak, the iteration holding the device's peak,
 * and the report's "spans" member (what aligns the ranks of a job). */
static void test_spans_between_marks(void **state)
{
    (void)state;
    mgen_t g = {0};
    mt_model_cfg_t mc = {.keep_iterations = true};
    assert_int_equal(mt__model_create(&g.m, &mc), 0);
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    size_t k = 99;
    put(&g, r, MT_EV_SEGMENT_ALLOC, BASE, 64 * MIB, 0);
    put(&g, r, MT_EV_ALLOC, BASE, 4 * MIB, MT_TAG_WEIGHTS);
    assert_int_equal(mt__model_peak_span(g.m, &k), MT_ENOENT); /* before the first mark */
    static const struct {
        uint64_t size; /* allocated and freed in the span */
    } it[] = {{8 * MIB}, {2 * MIB}, {20 * MIB}, {1 * MIB}};
    for (unsigned i = 0; i < 4; i++) {
        put(&g, r, MT_EV_MARK, MT_MARK_ITERATION, 10 + i, 0);
        put(&g, r, MT_EV_ALLOC, BASE + 4 * MIB, it[i].size, MT_TAG_ACTIVATIONS);
        put(&g, r, MT_EV_FREE_REQUESTED, BASE + 4 * MIB, it[i].size, MT_TAG_ACTIVATIONS);
        put(&g, r, MT_EV_FREE_COMPLETED, BASE + 4 * MIB, it[i].size, MT_TAG_ACTIVATIONS);
    }
    assert_int_equal(mt__model_spans(g.m), 4);
    mt_model_span_t sp;
    for (unsigned i = 0; i < 4; i++) {
        assert_int_equal(mt__model_span(g.m, i, &sp), 0);
        assert_int_equal(sp.iteration, 10 + i);
        assert_int_equal(sp.allocated_at_mark, 4 * MIB);
        assert_int_equal(sp.peak, 4 * MIB + it[i].size);
    }
    assert_int_equal(mt__model_span(g.m, 4, &sp), MT_ENOENT);
    assert_int_equal(mt__model_peak_span(g.m, &k), 0);
    assert_int_equal(k, 2); /* iteration 12: the 20 MiB */
    json_t *res = report_process(r);
    json_t *spans = json_object_get(json_array_get(json_object_get(res, "processes"), 0), "spans");
    assert_int_equal(json_integer_value(json_object_get(spans, "count")), 4);
    assert_int_equal(json_integer_value(json_object_get(spans, "peak_iteration")), 12);
    json_t *last = json_object_get(spans, "last");
    assert_int_equal(json_array_size(last), 4);
    assert_int_equal(json_integer_value(json_array_get(json_array_get(last, 3), 0)), 13);
    assert_int_equal(json_integer_value(json_array_get(json_array_get(last, 3), 1)), 5 * MIB);
    json_decref(res);
    mt__report_destroy(&r);
    mt__model_destroy(&g.m);
}

/* A block at address 0 (a malformed log's) is a block like any other: found, freed, moved
 * when another block's removal fills its place, counted in the figures. */
static void test_block_at_address_zero(void **state)
{
    (void)state;
    mt_model_t *m = NULL;
    assert_int_equal(mt__model_create(&m, NULL), 0);
    uint64_t seq = 0, t = 1;
    tput(m, &seq, MT_EV_ALLOC, 0, MIB, MT_TAG_WEIGHTS, t++, MIB);
    tput(m, &seq, MT_EV_ALLOC, BASE, 2 * MIB, MT_TAG_WEIGHTS, t++, 3 * MIB);
    tput(m, &seq, MT_EV_ALLOC, BASE + 2 * MIB, 4 * MIB, MT_TAG_WEIGHTS, t++, 7 * MIB);
    /* the first block's removal moves the last one (address 0 is not last: BASE + 2 MiB) */
    tput(m, &seq, MT_EV_FREE_REQUESTED, BASE, 2 * MIB, MT_TAG_WEIGHTS, t++, 5 * MIB);
    tput(m, &seq, MT_EV_FREE_COMPLETED, BASE, 2 * MIB, MT_TAG_WEIGHTS, t++, 5 * MIB);
    mt_model_tag_t tg;
    mt__model_tag(m, MT_MODEL_DEVICE, MT_TAG_WEIGHTS, &tg);
    assert_int_equal(tg.bytes, 5 * MIB);
    tput(m, &seq, MT_EV_FREE_REQUESTED, 0, MIB, MT_TAG_WEIGHTS, t++, 4 * MIB);
    tput(m, &seq, MT_EV_FREE_COMPLETED, 0, MIB, MT_TAG_WEIGHTS, t++, 4 * MIB);
    mt__model_tag(m, MT_MODEL_DEVICE, MT_TAG_WEIGHTS, &tg);
    assert_int_equal(tg.bytes, 4 * MIB);
    /* allocated again at 0, then the other block goes: 0 moves into its place */
    tput(m, &seq, MT_EV_ALLOC, 0, MIB, MT_TAG_ACTIVATIONS, t++, 5 * MIB);
    tput(m, &seq, MT_EV_FREE_COMPLETED, BASE + 2 * MIB, 4 * MIB, MT_TAG_WEIGHTS, t++, MIB);
    mt__model_tag(m, MT_MODEL_DEVICE, MT_TAG_ACTIVATIONS, &tg);
    assert_int_equal(tg.bytes, MIB);
    tput(m, &seq, MT_EV_FREE_COMPLETED, 0, MIB, MT_TAG_ACTIVATIONS, t++, 0);
    mt__model_tag(m, MT_MODEL_DEVICE, MT_TAG_ACTIVATIONS, &tg);
    assert_int_equal(tg.bytes, 0);
    mt__model_destroy(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unmap_covers_several_maps),
        cmocka_unit_test(test_settings_changes),
        cmocka_unit_test(test_unmap_middle_splits),
        cmocka_unit_test(test_gap_no_phantom_tags),
        cmocka_unit_test(test_gaps_in_a_row),
        cmocka_unit_test(test_gap_record_and_segment_free),
        cmocka_unit_test(test_overflow_saturates),
        cmocka_unit_test(test_ratios_defined_once),
        cmocka_unit_test(test_classes_and_sources),
        cmocka_unit_test(test_temporary_buckets),
        cmocka_unit_test(test_temporary_by_stack_and_tag),
        cmocka_unit_test(test_temporary_hist_bound),
        cmocka_unit_test(test_spans_between_marks),
        cmocka_unit_test(test_block_at_address_zero),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
