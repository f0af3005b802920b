/* End to end without a daemon: a program on the real caching allocator (sim backend)
 * records through the profiler into the local log; the log holds every event the
 * allocator emitted, in order, and `memtrace report`'s analysis finds the history kept
 * alive across iterations (and finds none when the program frees it). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "memtrace/alloc.h"
#include "memtrace/prof.h"
#include "analysis/report.h"
#include "tests/common/test_main.h"

#define ITERS 12
#define MiB   ((size_t)1 << 20)

/* Runs a small training-like loop; with keep, one 2 MiB buffer per iteration stays
 * alive (a history list). Returns the number of events the profiler was offered. */
static uint64_t program(const char *log, bool keep)
{
    mt_prof_cfg_t pc = mt_prof_cfg_default();
    pc.mode = MT_PROF_LOG;
    pc.log_path = log;
    pc.name = keep ? "leaky" : "steady";
    mt_prof_t *prof = NULL;
    assert_int_equal(mt_prof_create(&prof, &pc), 0);

    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 1024 * MiB;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    /* The report's segment figures below are those of plain segments. */
    assert_int_equal(mt_alloc_cfg_parse(&ac, "rules:reference", NULL, 0), 0);
    ac.backend = b;
    ac.sink = mt_prof_sink(prof);
    /* Every leaked block exactly 2 MiB wherever it lands: the growth measured is the
     * program's, not a large-pool tail left unsplit (< 1 MiB over) on some iteration. */
    ac.split_large_tails = true;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &ac), 0);

    void *w, *hist[ITERS];
    assert_int_equal(mt_alloc_malloc(a, 16 * MiB, NULL, MT_TAG_WEIGHTS, &w), 0);
    for (int it = 0; it < ITERS; it++) {
        mt_alloc_emit(a, MT_EV_MARK, MT_MARK_ITERATION, (uint64_t)it, 0);
        void *act[4];
        for (int i = 0; i < 4; i++)
            assert_int_equal(
                mt_alloc_malloc(a, (size_t)(i + 1) * MiB, NULL, MT_TAG_ACTIVATIONS, &act[i]), 0);
        assert_int_equal(mt_alloc_malloc(a, 2 * MiB, NULL, MT_TAG_ACTIVATIONS, &hist[it]), 0);
        for (int i = 0; i < 4; i++)
            assert_int_equal(mt_alloc_free(a, act[i]), 0);
        if (!keep)
            assert_int_equal(mt_alloc_free(a, hist[it]), 0);
    }
    if (keep)
        for (int it = 0; it < ITERS; it++)
            assert_int_equal(mt_alloc_free(a, hist[it]), 0);
    assert_int_equal(mt_alloc_free(a, w), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);

    mt_prof_stats_t st;
    mt_prof_stats(prof, &st);
    assert_int_equal(st.dropped, 0);
    mt_prof_destroy(&prof);
    return st.emitted;
}

/* Reads the log: checks it line by line and returns the report. */
static json_t *analyse(const char *log, uint64_t emitted)
{
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    uint64_t events = 0, next_seq = 0;
    int kinds[MT_EV_KIND_COUNT] = {0};
    while ((len = getline(&line, &cap, f)) > 0) {
        char err[256] = "";
        assert_int_equal(mt__report_add_line(r, line, (size_t)len, err, sizeof(err)), 0);
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        const char *type = json_string_value(json_object_get(j, "type"));
        if (type && strcmp(type, "event") == 0) { /* stack table lines have none */
            mt_event_rec_t ev;
            assert_int_equal(mt_prof_event_from_json(j, &ev, NULL, NULL, 0), 0);
            assert_int_equal(ev.seq, next_seq); /* nothing lost, in order */
            next_seq++;
            kinds[ev.kind]++;
            events++;
        }
        json_decref(j);
    }
    free(line);
    fclose(f);
    assert_int_equal(events, emitted);
    assert_int_equal(kinds[MT_EV_CONFIG], 1);
    assert_int_equal(kinds[MT_EV_MARK], ITERS);
    assert_true(kinds[MT_EV_ALLOC] >= 1 + 5 * ITERS);
    assert_true(kinds[MT_EV_SEGMENT_ALLOC] >= 1);
    json_t *res = mt__report_result(r);
    mt__report_destroy(&r);
    return res;
}

static void test_e2e(bool keep)
{
    char log[128];
    snprintf(log, sizeof(log), "/tmp/mt_prof_e2e_%d_%d.ndjson", (int)getpid(), keep);
    unlink(log);
    uint64_t emitted = program(log, keep);
    json_t *res = analyse(log, emitted);
    json_t *p = json_array_get(json_object_get(res, "processes"), 0);
    assert_string_equal(json_string_value(json_object_get(p, "name")), keep ? "leaky" : "steady");
    assert_string_equal(json_string_value(json_object_get(p, "exit")), "clean");
    json_t *g = json_object_get(p, "growth");
    assert_int_equal(json_integer_value(json_object_get(g, "iterations")), ITERS);
    assert_int_equal(json_is_true(json_object_get(g, "detected")), keep);
    if (keep) {
        double slope = json_real_value(json_object_get(g, "slope_bytes_per_iteration"));
        assert_true(slope >= 1.9 * MiB && slope <= 2.1 * MiB);
        json_t *t0 = json_array_get(json_object_get(g, "tags"), 0);
        assert_string_equal(json_string_value(json_object_get(t0, "tag")), "activations");
    }
    /* Everything was freed before the end. */
    json_t *nf = json_object_get(p, "never_freed");
    assert_int_equal(json_integer_value(json_object_get(nf, "count")), 0);
    assert_true(json_integer_value(json_object_get(p, "peak_allocated")) >= (json_int_t)(26 * MiB));
    json_decref(res);
    unlink(log);
}

static void test_e2e_leaky(void **state)
{
    (void)state;
    test_e2e(true);
}

static void test_e2e_steady(void **state)
{
    (void)state;
    test_e2e(false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e2e_leaky),
        cmocka_unit_test(test_e2e_steady),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
