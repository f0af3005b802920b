/* analysis/diff.c on hand-written report documents: each status, the lists, the gates and
 * their edges (growth from nothing, a limit met exactly), snapshots' sites taken from the
 * snapshot and not twice. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/diff.h"
#include "tests/common/test_main.h"

/* A report of one process: peak allocated, sites at the peak and never freed as
 * "site=bytes,..." lists. */
static json_t *report(int64_t peak, const char *at_peak, const char *never_freed)
{
    json_t *cs = json_pack("{s:[], s:[]}", "at_peak", "never_freed");
    const char *lists[2] = {at_peak, never_freed}, *names[2] = {"at_peak", "never_freed"};
    for (int k = 0; k < 2; k++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", lists[k]);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(tok, '=');
            *eq = '\0';
            json_array_append_new(json_object_get(cs, names[k]),
                                  json_pack("{s:s, s:I}", "site", tok, "bytes",
                                            (json_int_t)strtoll(eq + 1, NULL, 10)));
        }
    }
    return json_pack("{s:s, s:[{s:i, s:I, s:I, s:I, s:I, s:{s:I}, s:o}]}", "type", "report",
                     "processes", "pid", 7, "peak_allocated", (json_int_t)peak, "peak_reserved",
                     (json_int_t)(2 * peak), "final_allocated", (json_int_t)0, "final_reserved",
                     (json_int_t)peak, "peak_by_tag", "weights", (json_int_t)peak, "callsites", cs);
}

static json_t *row(json_t *d, const char *key)
{
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(d, "sites"), i, r)
    {
        if (strcmp(json_string_value(json_object_get(r, "key")), key) == 0)
            return r;
    }
    fail_msg("no site %s", key);
    return NULL;
}

static const char *status(json_t *d, const char *key)
{
    return json_string_value(json_object_get(row(d, key), "status"));
}

static bool listed(json_t *d, const char *list, const char *key)
{
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(d, list), i, s)
    {
        if (strcmp(json_string_value(s), key) == 0)
            return true;
    }
    return false;
}

static void test_statuses_and_lists(void **state)
{
    (void)state;
    json_t *a = report(100, "a=50,b=30,c=20,d=10", "c=20,d=10");
    json_t *b = report(150, "a=80,c=20,d=10,e=40", "c=0,d=10,e=40,a=5");
    json_t *d = NULL;
    int crossed = -1;
    assert_int_equal(mt__diff_reports(a, b, NULL, &d, &crossed), 0);
    assert_int_equal(crossed, 0);
    assert_string_equal(status(d, "a"), "grew");
    assert_string_equal(status(d, "b"), "gone");
    assert_string_equal(status(d, "c"), "shrank"); /* its never-freed bytes went */
    assert_string_equal(status(d, "d"), "same");
    assert_string_equal(status(d, "e"), "new");
    assert_true(listed(d, "new", "e") && !listed(d, "new", "a"));
    assert_true(listed(d, "grew", "a") && !listed(d, "grew", "e"));
    assert_true(listed(d, "gone", "b"));
    assert_true(listed(d, "freed_now", "c"));
    assert_true(listed(d, "never_freed_now", "a") && !listed(d, "never_freed_now", "e"));
    /* Largest change first: a (+30) and e (+40), e first. */
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(d, "sites"), 0), "key")),
        "e");
    json_t *pa = json_object_get(d, "peak_allocated");
    assert_int_equal(json_integer_value(json_object_get(pa, "delta")), 50);
    assert_true(json_real_value(json_object_get(pa, "growth_pct")) == 50.0);
    assert_false(json_is_true(json_object_get(d, "crossed")));
    json_decref(d);
    json_decref(a);
    json_decref(b);
}

static void test_gates(void **state)
{
    (void)state;
    json_t *a = report(100, "a=50", ""), *b = report(150, "a=80,e=40", "");
    mt_diff_cfg_t c = mt__diff_cfg_default();
    json_t *d = NULL;
    int crossed = 0;
    /* Limits met exactly are not crossed. */
    c.max_peak_growth_pct = 50;
    c.max_site_growth = 40;
    assert_int_equal(mt__diff_reports(a, b, &c, &d, &crossed), 0);
    assert_int_equal(crossed, 0);
    json_t *g = json_object_get(d, "gates");
    assert_int_equal(json_array_size(g), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(g, 1), "what")), "e");
    json_decref(d);
    c.max_peak_growth_pct = 49.9;
    c.max_site_growth = 39;
    assert_int_equal(mt__diff_reports(a, b, &c, &d, &crossed), 0);
    assert_int_equal(crossed, 2);
    assert_true(json_is_true(json_object_get(d, "crossed")));
    json_decref(d);
    json_decref(a);
    json_decref(b);

    /* Growth from nothing: no percentage (null), and any limit is crossed. */
    a = report(0, "", "");
    b = report(10, "x=10", "");
    c = mt__diff_cfg_default();
    c.max_peak_growth_pct = 1000;
    assert_int_equal(mt__diff_reports(a, b, &c, &d, &crossed), 0);
    assert_int_equal(crossed, 1);
    assert_true(json_is_null(json_object_get(json_object_get(d, "peak_allocated"), "growth_pct")));
    assert_true(
        json_is_null(json_object_get(json_array_get(json_object_get(d, "gates"), 0), "value")));
    json_decref(d);
    json_decref(a);
    json_decref(b);
}

/* A snapshot's process (pid = its "process" number) is counted by its snapshot's sites, not
 * also by the process's own call sites. */
static void test_snapshot_sites_once(void **state)
{
    (void)state;
    json_t *a = report(10, "no stack recorded=10", "");
    json_object_set_new(json_array_get(json_object_get(a, "processes"), 0), "pid", json_integer(1));
    json_object_set_new(a, "snapshots",
                        json_pack("[{s:i, s:[{s:[{s:s, s:I}]}]}]", "process", 1, "devices",
                                  "call_sites_at_peak", "site", "transformer.py:54 forward",
                                  "bytes", (json_int_t)10));
    json_t *b = report(0, "", "");
    json_t *d = NULL;
    assert_int_equal(mt__diff_reports(a, b, NULL, &d, NULL), 0);
    assert_int_equal(json_array_size(json_object_get(d, "sites")), 1);
    assert_string_equal(status(d, "transformer.py:54 forward"), "gone");
    json_decref(d);
    json_decref(a);
    json_decref(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_statuses_and_lists),
        cmocka_unit_test(test_gates),
        cmocka_unit_test(test_snapshot_sites_once),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
