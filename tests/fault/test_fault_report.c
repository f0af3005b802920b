/* Host-allocation failures in the readers of the event stream: the event model (apply,
 * figures, segment map, growth; mt__model_check after every record), the daemon's
 * per-process state (/state's JSON), the report (lines parsed by jansson, the result
 * document), its replay and segment map for plots, and the SVG plot. The stream is a real
 * one: an allocator run (expandable segments, tags, iterations, a gap) encoded by the
 * profiler's line writer. Every call returns 0 or MT_ENOMEM (a document: NULL), and
 * nothing leaks. */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "analysis/diff.h"
#include "analysis/gap.h"
#include "analysis/model.h"
#include "analysis/plot.h"
#include "analysis/report.h"
#include "analysis/trace_csv.h"
#include "daemon/internal.h"
#include "inject.h"
#include "tests/analysis/model_gen.h"
#include "tests/common/test_main.h"

#define MIB       ((size_t)1 << 20)
#define MAX_LINES 512

#define OK_OR_ENOMEM(call)                                                                         \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0 && rc_ != MT_ENOMEM)                                                          \
            fail_msg("%s returned %d (%s) with host allocation %ld failed", #call, rc_,            \
                     mt_strerror(rc_), fault_target());                                            \
    } while (0)

/* The log, written once before the loop. */
static char lines[MAX_LINES][1024];
static size_t line_len[MAX_LINES];
static size_t nlines;
static mt_event_rec_t recs[MAX_LINES]; /* the same records, for the model and the daemon */
static size_t nrecs;
static uint64_t seq;

static void add_line(const char *s, size_t n)
{
    assert_true(nlines < MAX_LINES && n < sizeof lines[0]);
    memcpy(lines[nlines], s, n);
    line_len[nlines++] = n;
}

static void log_emit(void *ud, const mt_event_rec_t *ev)
{
    (void)ud;
    mt_event_rec_t e = *ev;
    e.seq = seq++;
    assert_true(nrecs < MAX_LINES);
    recs[nrecs++] = e;
    char buf[1024];
    size_t n = mt_prof_event_write(buf, sizeof buf, &e, 4242, NULL, NULL);
    add_line(buf, n);
}

static void make_log(void)
{
    json_t *hello = mt_prof_hello_to_json(4242, "fault", 1000, 2000);
    char *s = json_dumps(hello, JSON_COMPACT);
    add_line(s, strlen(s));
    free(s);
    json_decref(hello);

    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 512 * MIB;
    bc.sim_malloc_cost_ns = bc.sim_free_cost_ns = 0;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    mt_event_sink_t sink = {.emit = log_emit};
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.sink = &sink;
    char err[128];
    assert_int_equal(mt_alloc_cfg_parse(&ac, "expandable_segments:True", err, sizeof err), 0);
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &ac), 0);
    int tag = 0;
    assert_int_equal(mt_alloc_tag_register(a, "activations", &tag), 0);
    void *keep[6] = {0};
    for (int it = 0; it < 6; it++) {
        mt_alloc_emit(a, MT_EV_MARK, MT_MARK_ITERATION, (uint64_t)it, 0);
        void *p[2];
        for (int i = 0; i < 2; i++)
            assert_int_equal(mt_alloc_malloc(a, (size_t)(i + 1) * 700 * 1024, NULL, tag, &p[i]), 0);
        assert_int_equal(mt_alloc_malloc(a, 1 * MIB, NULL, 0, &keep[it]), 0); /* grows */
        for (int i = 0; i < 2; i++)
            assert_int_equal(mt_alloc_free(a, p[i]), 0);
        if (it == 3)
            seq += 3; /* three events lost: the report sees a hole */
    }
    mt_alloc_emit(a, MT_EV_STATS, 0, 0, 0);
    for (int it = 0; it < 3; it++)
        assert_int_equal(mt_alloc_free(a, keep[it]), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static int count_points(void *ctx, const mt__report_point_t *pt)
{
    (void)pt;
    (*(size_t *)ctx)++;
    return 0;
}

/* Lines in, the result document out. */
/* The document of a clean run (fault_loop's first, unarmed) and of one that read every
 * line must be the same: a failure may refuse the document, never change it. */
static void same_or_first(json_t **clean, json_t *doc, const char *what)
{
    if (*clean == NULL) {
        *clean = json_incref(doc);
        return;
    }
    if (!json_equal(*clean, doc))
        fail_msg("%s differs from a clean run's with host allocation %ld failed", what,
                 fault_target());
}

static void report_scenario(void *ud)
{
    json_t **clean = ud;
    mt__report_t *r = NULL;
    OK_OR_ENOMEM(mt__report_create(&r, NULL));
    if (r == NULL)
        return;
    char err[256];
    bool all = true;
    for (size_t i = 0; i < nlines; i++) {
        int rc = mt__report_add_line(r, lines[i], line_len[i], err, sizeof err);
        OK_OR_ENOMEM(rc);
        all &= rc == 0;
    }
    json_t *doc = mt__report_result(r);
    if (doc != NULL && all)
        same_or_first(clean, doc, "the report");
    json_decref(doc);
    mt__report_destroy(&r);
}

/* A report read before the loop: its replay, a segment map, the plot. */
static void plot_scenario(void *ud)
{
    const mt__report_t *r = ud;
    size_t points = 0;
    OK_OR_ENOMEM(mt__report_replay(r, 0, count_points, &points));
    mt__report_map_t map;
    memset(&map, 0, sizeof map);
    int rc = mt__report_map_at(r, 0, nlines / 2, false, &map);
    OK_OR_ENOMEM(rc);
    if (rc == 0)
        mt__report_map_free(&map);
    char *svg = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&svg, &len);
    if (f != NULL) {
        mt__plot_cfg_t pc = mt__plot_cfg_default();
        pc.max_buckets = 50;
        char err[256];
        rc = mt__plot_svg(r, &pc, f, err, sizeof err);
        /* The memory stream's own growth failing shows as a write error. */
        if (rc == MT_EIO)
            rc = 0;
        OK_OR_ENOMEM(rc);
        fclose(f);
    }
    free(svg);
}

static void model_scenario(void *ud)
{
    (void)ud;
    mt_model_cfg_t cfg = mt__model_cfg_default();
    cfg.keep_iterations = true;
    mt_model_t *m = NULL;
    OK_OR_ENOMEM(mt__model_create(&m, &cfg));
    if (m == NULL)
        return;
    char why[256];
    for (size_t i = 0; i < nrecs; i++) {
        int rc = mt__model_apply(m, &recs[i]);
        OK_OR_ENOMEM(rc);
        if (rc != 0 && mt__model_check(m, why, sizeof why) != 0)
            fail_msg("model inconsistent after a failed apply (allocation %ld): %s", fault_target(),
                     why);
    }
    if (mt__model_check(m, why, sizeof why) != 0)
        fail_msg("model inconsistent (allocation %ld failed): %s", fault_target(), why);
    mt_model_figures_t f;
    OK_OR_ENOMEM(mt__model_figures(m, MT_MODEL_DEVICE, &f));
    assert_true(f.total_free <= f.reserved && f.largest_free <= f.total_free);
    mt_model_map_t map;
    memset(&map, 0, sizeof map);
    int rc = mt__model_map(m, MT_MODEL_DEVICE, &map);
    OK_OR_ENOMEM(rc);
    if (rc == 0)
        mt__model_map_free(&map);
    mt_model_growth_cfg_t gc = {.min_growth_bytes = 1 << 20, .min_r2 = 0.8};
    mt_model_growth_t g;
    mt__model_growth(m, &gc, &g);
    mt__model_destroy(&m);
}

/* Uncertain segments proved gone one at a time (model_segs.c, model_big.c): 56 segments, the
 * frees of the 32 larger ones lost in a gap, the 24 others freed one by one. Without memory
 * for the heap of the largest, the model walks every segment: a run whose every apply
 * returned 0 holds the clean run's segments. */
typedef struct {
    mt_model_seg_t segs[64];
    size_t n;
    bool have;
} segs_clean_t;

static void segs_prune_scenario(void *ud)
{
    segs_clean_t *clean = ud;
    mt_model_t *m = NULL;
    OK_OR_ENOMEM(mt__model_create(&m, NULL));
    if (m == NULL)
        return;
    mgen_t g = {.m = m};
    const uint64_t unit = 2 * MIB, base = UINT64_C(0x7f0000000000);
    bool all = true; /* every apply returned 0 */
    for (uint64_t i = 0; i < 56; i++) {
        uint64_t size = i < 32 ? (i + 1) * unit : unit;
        mt_event_rec_t ev = mgen_rec(&g, MT_EV_SEGMENT_ALLOC, base + i * 64 * unit, size, 0);
        if (i < 32) /* (its free is lost) */
            g.reserved -= size;
        int rc = mt__model_apply(m, &ev);
        OK_OR_ENOMEM(rc);
        all = all && rc == 0;
    }
    g.seq += 32;
    for (uint64_t i = 32; i < 56; i++) {
        mt_event_rec_t ev = mgen_rec(&g, MT_EV_SEGMENT_FREE, base + i * 64 * unit, unit, 0);
        int rc = mt__model_apply(m, &ev);
        OK_OR_ENOMEM(rc);
        all = all && rc == 0;
    }
    char why[256];
    if (mt__model_check(m, why, sizeof why) != 0)
        fail_msg("model inconsistent (allocation %ld failed): %s", fault_target(), why);
    mt_model_map_t map;
    memset(&map, 0, sizeof map);
    int rc = mt__model_map(m, MT_MODEL_DEVICE, &map);
    OK_OR_ENOMEM(rc);
    if (rc == 0 && all && !clean->have) {
        assert_true(map.nsegs <= 64);
        memcpy(clean->segs, map.segs, map.nsegs * sizeof(*map.segs));
        clean->n = map.nsegs;
        clean->have = true;
    } else if (rc == 0 && all) {
        assert_int_equal(map.nsegs, clean->n);
        for (size_t i = 0; i < map.nsegs; i++)
            if (map.segs[i].addr != clean->segs[i].addr ||
                map.segs[i].size != clean->segs[i].size ||
                map.segs[i].uncertain != clean->segs[i].uncertain)
                fail_msg("segment %zu differs from the clean run's (allocation %ld failed)", i,
                         fault_target());
    }
    if (rc == 0)
        mt__model_map_free(&map);
    mt__model_destroy(&m);
}

static void daemon_state_scenario(void *ud)
{
    json_t **clean = ud;
    mt_d_proc_t *p = NULL;
    OK_OR_ENOMEM(mt__d_proc_create(&p, 4242, "fault"));
    if (p == NULL)
        return;
    bool all = true;
    for (size_t i = 0; i < nrecs; i++) {
        int rc = mt__d_proc_apply(p, &recs[i]);
        OK_OR_ENOMEM(rc);
        all &= rc == 0;
    }
    json_t *doc = mt__d_proc_json(p, true);
    if (doc != NULL && all)
        same_or_first(clean, doc, "the daemon's process state");
    json_decref(doc);
    char why[256];
    if (mt__model_check(p->model, why, sizeof why) != 0)
        fail_msg("daemon's model inconsistent (allocation %ld failed): %s", fault_target(), why);
    mt__d_proc_destroy(&p);
}

static void test_model(void **state)
{
    (void)state;
    assert_true(fault_loop("model", model_scenario, NULL) > 10);
}

static void test_segs_prune(void **state)
{
    (void)state;
    segs_clean_t clean = {.have = false};
    assert_true(fault_loop("uncertain segments pruned", segs_prune_scenario, &clean) > 5);
    assert_true(clean.have);
    assert_int_equal(clean.n, 0); /* (all gone: the lost ones proved so, the rest freed) */
}

static void test_daemon_state(void **state)
{
    (void)state;
    json_t *clean = NULL;
    assert_true(fault_loop("daemon state", daemon_state_scenario, &clean) > 10);
    assert_non_null(clean);
    json_decref(clean);
}

static void test_report(void **state)
{
    (void)state;
    json_t *clean = NULL;
    assert_true(fault_loop("report", report_scenario, &clean) > 50);
    assert_non_null(clean);
    json_decref(clean);
}

static void test_plot(void **state)
{
    (void)state;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    char err[256];
    for (size_t i = 0; i < nlines; i++)
        assert_int_equal(mt__report_add_line(r, lines[i], line_len[i], err, sizeof err), 0);
    assert_int_equal(mt__report_process_count(r), 1);
    assert_true(fault_loop("report replay+plot", plot_scenario, r) > 10);
    mt__report_destroy(&r);
}

/* A report read before the loop and its document: the gap of its model, its allocations as
 * a replay trace, and the diff of the document with itself. */
typedef struct gap_diff_s {
    const mt__report_t *r;
    const json_t *doc;
} gap_diff_t;

static void gap_diff_scenario(void *ud)
{
    const gap_diff_t *gd = ud;
    mt_model_t *m = NULL;
    int rc = mt__report_model(gd->r, 0, &m);
    OK_OR_ENOMEM(rc);
    if (rc == 0) {
        mt_gap_t g;
        rc = mt__gap_of_model(m, MT_MODEL_DEVICE, &g);
        OK_OR_ENOMEM(rc);
        if (rc == 0) {
            json_decref(mt__gap_json(&g, 10));
            mt__gap_free(&g);
        }
        mt__model_destroy(&m);
    }
    mt_trace_t *t = NULL;
    OK_OR_ENOMEM(mt__report_trace(gd->r, 0, &t));
    mt__trace_free(&t);
    json_t *d = NULL;
    mt_diff_cfg_t dc = mt__diff_cfg_default();
    dc.max_peak_growth_pct = 0;
    dc.max_site_growth = 0;
    int crossed = -1;
    rc = mt__diff_reports(gd->doc, gd->doc, &dc, &d, &crossed);
    OK_OR_ENOMEM(rc);
    if (rc == 0)
        assert_int_equal(crossed, 0); /* a run against itself crosses no gate */
    json_decref(d);
}

static void test_gap_diff(void **state)
{
    (void)state;
    mt__report_cfg_t cfg = mt__report_cfg_default();
    cfg.by_callsite = true;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, &cfg), 0);
    char err[256];
    for (size_t i = 0; i < nlines; i++)
        assert_int_equal(mt__report_add_line(r, lines[i], line_len[i], err, sizeof err), 0);
    gap_diff_t gd = {.r = r, .doc = mt__report_result(r)};
    assert_non_null(gd.doc);
    assert_non_null(
        json_object_get(json_array_get(json_object_get(gd.doc, "processes"), 0), "peak_gap"));
    assert_true(fault_loop("gap, replay trace, diff", gap_diff_scenario, &gd) > 10);
    json_decref((json_t *)gd.doc);
    mt__report_destroy(&r);
}

static int setup(void **state)
{
    (void)state;
    make_log();
    return nlines > 50 && nrecs + 1 == nlines ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model),        cmocka_unit_test(test_segs_prune),
        cmocka_unit_test(test_daemon_state), cmocka_unit_test(test_report),
        cmocka_unit_test(test_plot),         cmocka_unit_test(test_gap_diff),
    };
    return MT_TEST_RUN(tests, setup, NULL);
}
