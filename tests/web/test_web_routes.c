/* The web page's HTTP routes against an in-process daemon and a real producer: the page's
 * files are served as embedded; /history, /spark, /map, /block and /tail answer in shape
 * and agree with /state; bad parameters get 400 naming what is wrong, unknown pids 404. */
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

#include "daemon/harness.h"
#include "daemon/web.h"
#include "tests/common/test_main.h"

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

static void want_status(int port, const char *path, int want, const char *body_has)
{
    char *resp = NULL;
    int status = th_http_get(port, path, &resp);
    if (status != want || (body_has && !strstr(th_http_body(resp), body_has)))
        fail_msg("%s: HTTP %d (want %d, body with '%s'): %s", path, status, want,
                 body_has ? body_has : "", resp);
    free(resp);
}

static void test_files_served(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    for (size_t i = 0; i < mt__d_web_nassets; i++) {
        const mt_d_asset_t *a = &mt__d_web_assets[i];
        char *resp = NULL;
        assert_int_equal(th_http_get(t.port, a->path, &resp), 200);
        const char *body = th_http_body(resp);
        assert_non_null(strstr(resp, a->ctype));
        assert_memory_equal(body, a->data, a->len);
        assert_null(strstr(resp, "Access-Control-Allow-Origin"));
        free(resp);
    }
    char *resp = NULL;
    assert_int_equal(th_http_get(t.port, "/", &resp), 200);
    assert_non_null(strstr(resp, "text/html"));
    assert_non_null(strstr(resp, "vendor/uPlot.iife.min.js"));
    free(resp);
    want_status(t.port, "/nosuch.js", 404, NULL);
    th_daemon_stop(&t);
}

static void test_routes_agree_with_state(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    enum { N = 6000 };
    pid_t pid = th_producer(t.sock, N, 8192, 500, -1);
    assert_int_equal(th_wait(pid), 0);
    char path[256];
    json_t *st = NULL, *p = NULL;
    for (int tries = 0; tries < 200 && !p; tries++) { /* the last events drain on EOF */
        json_decref(st);
        st = get_json(t.port, "/state");
        size_t i;
        json_t *q;
        json_array_foreach(json_object_get(st, "processes"), i, q)
        {
            if (json_integer_value(json_object_get(q, "pid")) == pid &&
                json_integer_value(json_object_get(q, "events")) == N)
                p = q;
        }
    }
    assert_non_null(p);
    json_int_t allocated = json_integer_value(json_object_get(p, "allocated_bytes"));

    snprintf(path, sizeof path, "/history?pid=%d&buckets=10", (int)pid);
    json_t *h = get_json(t.port, path);
    json_t *amin = json_object_get(h, "amin"), *amax = json_object_get(h, "amax"),
           *alast = json_object_get(h, "alast");
    assert_int_equal(json_array_size(json_object_get(h, "t")), 10);
    assert_int_equal(json_array_size(amax), 10);
    for (size_t i = 0; i < 10; i++)
        if (!json_is_null(json_array_get(amin, i)))
            assert_true(json_integer_value(json_array_get(amin, i)) <=
                        json_integer_value(json_array_get(amax, i)));
    assert_int_equal(json_integer_value(json_array_get(alast, 9)), allocated);
    const char *tag;
    json_t *series;
    json_object_foreach(json_object_get(h, "tags"), tag, series)
    {
        for (size_t i = 0; i < 10; i++) /* a tag's bytes never above the bucket's max */
            assert_true(json_integer_value(json_array_get(series, i)) <=
                        json_integer_value(json_array_get(amax, i)));
    }
    json_decref(h);

    json_t *sp = get_json(t.port, "/spark?buckets=7&span=60");
    assert_int_equal(json_array_size(json_object_get(sp, "procs")), 1);
    assert_int_equal(
        json_array_size(json_object_get(json_array_get(json_object_get(sp, "procs"), 0), "v")), 7);
    json_decref(sp);

    snprintf(path, sizeof path, "/map?pid=%d", (int)pid);
    json_t *m = get_json(t.port, path);
    assert_true(json_is_true(json_object_get(m, "live")));
    assert_int_equal(json_integer_value(json_object_get(m, "allocated")), allocated);
    assert_int_equal(json_integer_value(json_object_get(m, "nblocks")),
                     json_integer_value(json_object_get(p, "blocks")));
    json_int_t last = json_integer_value(json_object_get(json_object_get(m, "window"), "last_seq"));
    assert_int_equal(last, N - 1);
    snprintf(path, sizeof path, "/map?pid=%d&seq=%lld", (int)pid, (long long)last);
    json_t *past = get_json(t.port, path);
    assert_true(json_is_false(json_object_get(past, "live")));
    assert_int_equal(json_integer_value(json_object_get(past, "nblocks")),
                     json_integer_value(json_object_get(m, "nblocks")));
    assert_int_equal(json_integer_value(json_object_get(past, "allocated")), allocated);
    json_decref(past);
    /* A block of the map: its alloc event is in the window. */
    json_t *blocks = json_object_get(m, "blocks");
    if (json_array_size(blocks) > 0) {
        const char *addr = json_string_value(json_array_get(json_array_get(blocks, 0), 0));
        snprintf(path, sizeof path, "/block?pid=%d&addr=%s", (int)pid, addr);
        json_t *b = get_json(t.port, path);
        assert_int_equal(json_integer_value(json_object_get(b, "size")),
                         json_integer_value(json_array_get(json_array_get(blocks, 0), 1)));
        assert_non_null(json_object_get(b, "age_s"));
        assert_true(json_is_true(json_object_get(b, "live")));
        json_decref(b);
    }
    /* An address whose last block was freed: not live, and named by its free. */
    snprintf(path, sizeof path, "/tail?pid=%d&n=1000&kind=free_completed", (int)pid);
    json_t *ftail = get_json(t.port, path), *frees = json_object_get(ftail, "events"), *fe;
    size_t fi, checked = 0;
    json_array_foreach(frees, fi, fe)
    {
        const char *fa = json_string_value(json_object_get(fe, "addr"));
        bool live = false;
        for (size_t k = 0; k < json_array_size(blocks) && !live; k++)
            live = strcmp(json_string_value(json_array_get(json_array_get(blocks, k), 0)), fa) == 0;
        if (live || checked++ >= 5)
            continue;
        snprintf(path, sizeof path, "/block?pid=%d&addr=%s", (int)pid, fa);
        json_t *b = get_json(t.port, path);
        if (!json_is_false(json_object_get(b, "live")) || json_object_get(b, "before_window"))
            fail_msg("/block of %s, freed and not live, is not said to be free", fa);
        assert_int_equal(json_integer_value(json_object_get(b, "freed_seq")),
                         json_integer_value(json_object_get(fe, "seq")));
        assert_int_equal(json_integer_value(json_object_get(b, "size")),
                         json_integer_value(json_object_get(fe, "size")));
        json_decref(b);
    }
    assert_true(checked > 0);
    json_decref(ftail);
    /* An address no event names, with the whole history kept: no block, not "before". */
    json_t *win = json_object_get(m, "window");
    assert_int_equal(json_integer_value(json_object_get(win, "first_seq")), 0);
    assert_int_equal(json_integer_value(json_object_get(win, "count")), N);
    snprintf(path, sizeof path, "/block?pid=%d&addr=0x10", (int)pid);
    want_status(t.port, path, 404, "no block has started at 0x10 in this process\n");
    snprintf(path, sizeof path, "/block?pid=%d&addr=0x10&seq=%lld", (int)pid,
             (long long)json_integer_value(json_object_get(win, "last_seq")));
    want_status(t.port, path, 404, "no block has started at 0x10 in this process by then");
    json_decref(m);

    snprintf(path, sizeof path, "/tail?pid=%d&n=5&kind=alloc", (int)pid);
    json_t *tl = get_json(t.port, path);
    json_t *evs = json_object_get(tl, "events");
    assert_int_equal(json_array_size(evs), 5);
    size_t i;
    json_t *e;
    json_array_foreach(evs, i, e)
    {
        assert_string_equal(json_string_value(json_object_get(e, "kind")), "alloc");
    }
    json_decref(tl);

    want_status(t.port, "/history", 400, "pid=N is required");
    want_status(t.port, "/history?pid=999999999", 404, "no such process");
    snprintf(path, sizeof path, "/history?pid=%d&buckets=0", (int)pid);
    want_status(t.port, path, 400, "buckets");
    snprintf(path, sizeof path, "/history?pid=%d&from=10&to=5", (int)pid);
    want_status(t.port, path, 400, "from < to");
    /* A far bound is answered as given, clamped, never wrapped below from. */
    snprintf(path, sizeof path, "/history?pid=%d&to=1e300&buckets=4", (int)pid);
    json_t *far = get_json(t.port, path);
    double far_from = json_number_value(json_object_get(far, "from")),
           far_to = json_number_value(json_object_get(far, "to"));
    if (!(far_to > far_from))
        fail_msg("/history?to=1e300 answered from %.6f to %.6f", far_from, far_to);
    json_decref(far);
    snprintf(path, sizeof path, "/block?pid=%d&addr=zz", (int)pid);
    want_status(t.port, path, 400, "addr: not a valid number");
    snprintf(path, sizeof path, "/tail?pid=%d&n=100000", (int)pid);
    want_status(t.port, path, 400, "n <= 1000");
    want_status(t.port, "/spark?buckets=100000", 400, "buckets");
    want_status(t.port, "/spark?buckets=abc", 400, "buckets: not a valid number");
    snprintf(path, sizeof path, "/history?pid=%d&from=nan", (int)pid);
    want_status(t.port, path, 400, "from: not a valid number");
    snprintf(path, sizeof path, "/map?pid=%d&t=-1e300", (int)pid); /* before everything */
    want_status(t.port, path, 200, "\"live\":false");
    want_status(t.port, "/tail?pid=-3", 400, "pid: not a valid number");
    json_decref(st);
    th_daemon_stop(&t);
}

/* One buffer of recent events per process: a snapshot's trace is the newest events of the
 * web page's window, not a second copy. With the window cut to 2048 events and 5000 sent,
 * the snapshot holds exactly the window's 2048, the same seqs /map and /tail report. */
static void test_snapshot_reads_the_window(void **state)
{
    (void)state;
    enum { N = 5000, WINDOW = 2048 };
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    mt__d_set_event_window(t.d, WINDOW); /* before any producer: trackers take it */
    pid_t pid = th_producer(t.sock, N, 8192, 500, -1);
    assert_int_equal(th_wait(pid), 0);
    json_t *p = th_wait_exited(t.sock, pid, 10000);
    assert_non_null(p);
    assert_int_equal(json_integer_value(json_object_get(p, "events")), N);
    json_decref(p);

    char path[128], req[64];
    snprintf(path, sizeof path, "/map?pid=%d", (int)pid);
    json_t *m = get_json(t.port, path);
    json_t *w = json_object_get(m, "window");
    assert_int_equal(json_integer_value(json_object_get(w, "count")), WINDOW);
    json_int_t first = json_integer_value(json_object_get(w, "first_seq"));
    json_int_t last = json_integer_value(json_object_get(w, "last_seq"));
    assert_int_equal(last, N - 1);
    json_decref(m);

    int fd = -1;
    assert_int_equal(mt__d_client_connect(t.sock, &fd), 0);
    int n = snprintf(req, sizeof req, "{\"type\":\"snapshot\",\"pid\":%d}\n", (int)pid);
    assert_int_equal(mt__d_client_send(fd, req, (size_t)n), 0);
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(mt__d_client_read_all(fd, 64u << 20, 10000, &out, &len), 0);
    close(fd);
    json_error_t e;
    json_t *snap = json_loadb(out, len, 0, &e);
    free(out);
    assert_non_null(snap);
    json_t *evs = json_object_get(snap, "events");
    assert_int_equal(json_array_size(evs), WINDOW);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(evs, 0), "seq")), first);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(evs, WINDOW - 1), "seq")),
                     last);
    json_decref(snap);

    snprintf(path, sizeof path, "/tail?pid=%d&n=1", (int)pid);
    json_t *tl = get_json(t.port, path);
    assert_int_equal(json_integer_value(
                         json_object_get(json_array_get(json_object_get(tl, "events"), 0), "seq")),
                     last);
    json_decref(tl);
    th_daemon_stop(&t);
}

int main(int argc, char **argv)
{
    th_producer_dispatch(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_files_served),
        cmocka_unit_test(test_routes_agree_with_state),
        cmocka_unit_test(test_snapshot_reads_the_window),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
