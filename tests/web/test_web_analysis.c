/* The page's /analysis and /diff routes against an in-process daemon and a real producer
 * (live, not a recording): a named scope's peak, a temporary allocation by tag (no stacks)
 * and a setting changed at run time come out as `memtrace report` computes them; a live
 * daemon has no comparison (404); a bad or unknown pid is refused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/harness.h"
#include "memtrace/prof.h"
#include "tests/common/test_main.h"

#define MIB (UINT64_C(1) << 20)

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The producer: a scope "step" in which allocated rises 3 MiB above its start, a block freed
 * 50 µs after its alloc (temporary) and one freed 5 ms after (not), and max_split_size
 * changed from 0 to 64 MiB; then exits cleanly. */
static void scoper(const char *sock)
{
    mt_prof_t *p = NULL;
    if (th_prof_open(sock, "scoper", &p) != 0)
        _exit(10);
    uint64_t t = mono_ns(), allocated = 0, reserved = 64 * MIB;
    mt_event_rec_t ev = {.kind = MT_EV_SEGMENT_ALLOC,
                         .addr = 0x10000000,
                         .size = 64 * MIB,
                         .pool = MT_POOL_LARGE,
                         .reserved = reserved,
                         .time_ns = t};
    int rc = mt_prof_record(p, &ev);
    /* (kind, offset in the segment, size, µs after the start) */
    static const struct {
        int kind;
        uint64_t off, size, us;
    } ops[] = {
        {MT_EV_ALLOC, 0, 1 * MIB, 10},
        {MT_EV_MARK_NAMED, 0, 0, 20},
        {MT_EV_ALLOC, 1 * MIB, 2 * MIB, 30},
        {MT_EV_ALLOC, 4 * MIB, 1 * MIB, 40},
        {MT_EV_FREE_REQUESTED, 4 * MIB, 1 * MIB, 90},
        {MT_EV_FREE_COMPLETED, 4 * MIB, 1 * MIB, 91},
        {MT_EV_FREE_REQUESTED, 1 * MIB, 2 * MIB, 5030},
        {MT_EV_FREE_COMPLETED, 1 * MIB, 2 * MIB, 5031},
        {MT_EV_MARK_NAMED, 1, 0, 6000},
        {MT_EV_SETTING, 0, 0, 7000},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        mt_event_rec_t e = {
            .kind = (uint8_t)ops[i].kind, .pool = MT_POOL_LARGE, .time_ns = t + ops[i].us * 1000};
        if (ops[i].kind == MT_EV_MARK_NAMED) {
            mt_event_mark_name_pack(&e, ops[i].off ? "/step" : "step");
        } else if (ops[i].kind == MT_EV_SETTING) {
            e.addr = MT_SETTING_MAX_SPLIT_SIZE;
            e.size = 64 * MIB;
            e.requested = 0;
        } else {
            e.addr = 0x10000000 + ops[i].off;
            e.size = e.requested = ops[i].size;
            allocated += ops[i].kind == MT_EV_ALLOC ? ops[i].size : 0;
            allocated -= ops[i].kind == MT_EV_FREE_REQUESTED ? ops[i].size : 0;
        }
        e.allocated = allocated;
        e.reserved = reserved;
        rc |= mt_prof_record(p, &e);
    }
    mt_prof_destroy(&p);
    _exit(rc == 0 ? 0 : 11);
}

static json_t *get_json(int port, const char *path)
{
    char *resp = NULL;
    int status = th_http_get(port, path, &resp);
    if (status != 200)
        fail_msg("%s: HTTP %d: %s", path, status, resp ? resp : "");
    json_error_t e;
    json_t *j = json_loads(th_http_body(resp), 0, &e);
    if (!j)
        fail_msg("%s: not JSON: %s", path, e.text);
    free(resp);
    return j;
}

static int status_of(int port, const char *path)
{
    char *resp = NULL;
    int status = th_http_get(port, path, &resp);
    free(resp);
    return status;
}

static json_int_t num(const json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

static void test_analysis_live(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    const char *const args[5] = {t.sock, NULL};
    pid_t pid = th_spawn("scoper", args);
    assert_int_equal(th_wait_within(pid, 20000, "the scoper"), 0);
    json_t *p = th_wait_exited(t.sock, pid, 10000);
    assert_non_null(p);
    json_decref(p);
    char path[96];
    snprintf(path, sizeof path, "/analysis?pid=%d", (int)pid);
    json_t *a = get_json(t.port, path);
    assert_int_equal(num(a, "pid"), pid);

    json_t *sc = json_object_get(a, "scopes");
    assert_int_equal(json_array_size(sc), 1);
    json_t *s = json_array_get(sc, 0);
    assert_string_equal(json_string_value(json_object_get(s, "name")), "step");
    assert_int_equal(num(s, "count"), 1);
    assert_int_equal(num(s, "peak_bytes"), 3 * MIB); /* 1 MiB held before: not counted */
    double secs = json_real_value(json_object_get(s, "mean_seconds"));
    assert_true(secs > 0.00597 && secs < 0.00599);

    /* no stacks: by tag, the one temporary block (50 µs, within the 1 ms window) */
    assert_string_equal(json_string_value(json_object_get(a, "temporary_by")), "tag");
    assert_int_equal(num(a, "temporary_window_us"), 1000);
    json_t *tm = json_object_get(a, "temporary");
    assert_int_equal(json_array_size(tm), 1);
    json_t *r = json_array_get(tm, 0);
    assert_string_equal(json_string_value(json_object_get(r, "site")), "other");
    assert_int_equal(num(r, "count"), 1);
    assert_int_equal(num(r, "bytes"), 1 * MIB);
    assert_int_equal(num(r, "median_lifetime_us"), 50);

    json_t *st = json_object_get(a, "settings_changes");
    assert_int_equal(json_array_size(st), 1);
    json_t *c = json_array_get(st, 0);
    assert_string_equal(json_string_value(json_object_get(c, "key")), "max_split_size_mb");
    assert_int_equal(num(c, "value"), 64 * MIB);
    assert_int_equal(num(c, "before"), 0);
    double ct = json_real_value(json_object_get(c, "t"));
    assert_true(ct > 0.00699 && ct < 0.00701); /* from the process's first event */
    assert_true(json_real_value(json_object_get(c, "at")) > 1.6e9); /* the page's epoch s */
    json_decref(a);

    assert_int_equal(status_of(t.port, "/diff"), 404); /* a live daemon compares nothing */
    assert_int_equal(status_of(t.port, "/analysis?pid=999999999"), 404);
    assert_int_equal(status_of(t.port, "/analysis"), 400);
    assert_int_equal(status_of(t.port, "/analysis?pid=-3"), 400);
    th_daemon_stop(&t);
}

int main(int argc, char **argv)
{
    char **args;
    const char *role = th_role(argc, argv, &args);
    if (role != NULL && strcmp(role, "scoper") == 0)
        scoper(args[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_analysis_live),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
