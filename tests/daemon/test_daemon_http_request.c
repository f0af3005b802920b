/* The daemon's request path in its three steps (daemon/http.h): the pure parser with
 * malformed heads (each refused with its named error), the authorization rules on their
 * own, and the route table (every row reachable by look-up and over a live daemon,
 * unknown paths 404, other methods 405). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/http.h"
#include "daemon/web.h"
#include "tests/common/test_main.h"
#include "tests/daemon/harness.h"

static mt_d_str_t S(const char *s)
{
    return (mt_d_str_t){s, strlen(s)};
}

static void assert_str(mt_d_str_t got, const char *want)
{
    if (!want) {
        assert_null(got.p);
        return;
    }
    assert_non_null(got.p);
    char buf[256];
    assert_true(got.n < sizeof buf);
    memcpy(buf, got.p, got.n);
    buf[got.n] = '\0';
    assert_string_equal(buf, want);
}

/* ---- parse_request ---- */

typedef struct req_case_s {
    const char *what;
    const char *bytes;
    size_t len; /* 0: strlen(bytes) */
    mt_d_req_e want;
} req_case_t;

static void parse_malformed(void **state)
{
    (void)state;
    static const req_case_t cases[] = {
        {"empty", "", 0, MT_D_REQ_INCOMPLETE},
        {"no blank line yet", "GET / HTTP/1.1\r\nHost: localhost\r\n", 0, MT_D_REQ_INCOMPLETE},
        {"a lone CR is no blank line", "GET / HTTP/1.1\r\n\r", 0, MT_D_REQ_INCOMPLETE},
        {"NUL before the end", "GET /\0 HTTP/1.1\r\n\r\n", 20, MT_D_REQ_BINARY},
        {"NUL first", "\0\0\0", 3, MT_D_REQ_BINARY},
        {"two Host headers", "GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", 0, MT_D_REQ_DUP_HOST},
        {"two Host headers beat a bad line", "BAD\nHost: a\nHost: a\n\n", 0, MT_D_REQ_DUP_HOST},
        {"blank line only", "\r\n\r\n", 0, MT_D_REQ_BAD_LINE},
        {"one word", "GET\r\n\r\n", 0, MT_D_REQ_BAD_LINE},
        {"two words", "GET /\r\n\r\n", 0, MT_D_REQ_BAD_LINE},
        {"four words", "GET / HTTP/1.1 x\r\n\r\n", 0, MT_D_REQ_BAD_LINE},
        {"trailing space", "GET / HTTP/1.1 \r\n\r\n", 0, MT_D_REQ_BAD_LINE},
        {"HTTP/2", "GET / HTTP/2\r\n\r\n", 0, MT_D_REQ_BAD_VERSION},
        {"lower-case version", "GET / http/1.1\r\n\r\n", 0, MT_D_REQ_BAD_VERSION},
        {"two CRs", "GET / HTTP/1.1\r\r\n\r\n", 0, MT_D_REQ_BAD_VERSION},
        {"empty target", "GET  HTTP/1.1\r\n\r\n", 0, MT_D_REQ_BAD_TARGET},
        {"relative target", "GET state HTTP/1.1\r\n\r\n", 0, MT_D_REQ_BAD_TARGET},
        {"absolute URI", "GET http://x/ HTTP/1.1\r\n\r\n", 0, MT_D_REQ_BAD_TARGET},
        {"control byte", "GET /\x01 HTTP/1.1\r\n\r\n", 0, MT_D_REQ_BAD_TARGET},
        {"byte above ASCII", "GET /\xc3\xa9 HTTP/1.1\r\n\r\n", 0, MT_D_REQ_BAD_TARGET},
        {"DEL", "GET /\x7f HTTP/1.1\r\n\r\n", 0, MT_D_REQ_BAD_TARGET},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const req_case_t *k = &cases[i];
        size_t len = k->len ? k->len : strlen(k->bytes);
        mt_d_req_t r;
        mt_d_req_e got = mt__d_http_parse_request(k->bytes, len, &r);
        if (got != k->want)
            fail_msg("%s: %s, want %s", k->what, mt__d_http_req_name(got),
                     mt__d_http_req_name(k->want));
        /* Every refusal has its own line for the 400 answer. */
        const char *msg = mt__d_http_req_message(got);
        assert_true(strlen(msg) > 1 && msg[strlen(msg) - 1] == '\n');
        if (got != MT_D_REQ_INCOMPLETE)
            assert_null(r.method.p);
    }
    /* The messages are those the daemon always sent (tests/security checks some). */
    assert_string_equal(mt__d_http_req_message(MT_D_REQ_DUP_HOST), "more than one Host header\n");
    assert_string_equal(mt__d_http_req_message(MT_D_REQ_BAD_LINE), "malformed request line\n");
    assert_string_equal(mt__d_http_req_message(MT_D_REQ_BAD_VERSION), "unsupported HTTP version\n");
    assert_string_equal(mt__d_http_req_message(MT_D_REQ_BAD_TARGET), "bad request target\n");
    assert_string_equal(mt__d_http_req_message(MT_D_REQ_BINARY), "bad request\n");
    for (int e = MT_D_REQ_BINARY; e < MT_D_REQ_NCODES; e++)
        for (int f = e + 1; f < MT_D_REQ_NCODES; f++)
            assert_string_not_equal(mt__d_http_req_message(e), mt__d_http_req_message(f));
}

static void parse_pieces(void **state)
{
    (void)state;
    static const char h[] = "GET /map?pid=7&token=abc&seq=3 HTTP/1.1\r\n"
                            "host:  localhost:9477\r\n"
                            "X-Other: y\r\n"
                            "Authorization: Bearer one\r\n"
                            "authorization: Bearer two\r\n"
                            "\r\n"
                            "body bytes\0 after the head";
    mt_d_req_t r;
    assert_int_equal(mt__d_http_parse_request(h, sizeof h - 1, &r), MT_D_REQ_OK);
    assert_str(r.method, "GET");
    assert_str(r.path, "/map");
    assert_str(r.query, "pid=7&token=abc&seq=3");
    assert_str(r.token, "abc");
    assert_str(r.host, "localhost:9477");
    assert_str(r.auth, "Bearer two");
    assert_true(r.http11);
    assert_int_equal(r.head_len, (size_t)(strstr(h, "body") - h));

    /* Bare LF, HTTP/1.0, no Host, "?" with nothing after it, token= only as a key. */
    static const char h2[] = "HEAD /state? HTTP/1.0\nX: token=1\n\n";
    assert_int_equal(mt__d_http_parse_request(h2, sizeof h2 - 1, &r), MT_D_REQ_OK);
    assert_str(r.method, "HEAD");
    assert_str(r.path, "/state");
    assert_str(r.query, "");
    assert_str(r.token, NULL);
    assert_str(r.host, NULL);
    assert_false(r.http11);
    assert_int_equal(r.head_len, sizeof h2 - 1);

    /* The first token= counts; "xtoken=" is another key. */
    static const char h3[] = "GET /?xtoken=1&token=2&token=3 HTTP/1.1\n\n";
    assert_int_equal(mt__d_http_parse_request(h3, sizeof h3 - 1, &r), MT_D_REQ_OK);
    assert_str(r.token, "2");
    assert_str(r.path, "/");
    /* The method is not judged here: the route table does. */
    static const char h4[] = "BREW /pot HTTP/1.1\r\n\r\n";
    assert_int_equal(mt__d_http_parse_request(h4, sizeof h4 - 1, &r), MT_D_REQ_OK);
    assert_str(r.method, "BREW");
}

/* ---- authorize ---- */

static int authorize(const mt_d_http_policy_t *pol, const char *head, const char *path)
{
    mt_d_req_t r;
    assert_int_equal(mt__d_http_parse_request(head, strlen(head), &r), MT_D_REQ_OK);
    mt_d_route_match_t m = mt__d_route_find(r.method, r.path);
    assert_true(path == NULL || m.route != NULL);
    return mt__d_http_authorize(pol, &r, m.route);
}

static void authorize_rules(void **state)
{
    (void)state;
    mt_d_http_policy_t pol = {.names = {"box.lan", NULL}, .auth = true, .token = "s3cret"};
    /* Host names this host, with any port, or else 403, before anything else. */
    assert_int_equal(authorize(&pol, "GET /healthz HTTP/1.1\nHost: localhost\n\n", "/"), 0);
    assert_int_equal(authorize(&pol, "GET /healthz HTTP/1.1\nHost: LOCALHOST:80\n\n", "/"), 0);
    assert_int_equal(authorize(&pol, "GET /healthz HTTP/1.1\nHost: [::1]:1\n\n", "/"), 0);
    assert_int_equal(authorize(&pol, "GET /healthz HTTP/1.1\nHost: box.lan\n\n", "/"), 0);
    assert_int_equal(authorize(&pol, "GET /healthz HTTP/1.1\nHost: evil.com\n\n", "/"), 403);
    assert_int_equal(authorize(&pol, "GET /healthz HTTP/1.1\nHost: localhost:8x\n\n", "/"), 403);
    assert_int_equal(authorize(&pol, "GET /healthz HTTP/1.1\nHost: [::1\n\n", "/"), 403);
    assert_int_equal(authorize(&pol, "GET /healthz HTTP/1.1\nHost: localhostx\n\n", "/"), 403);
    assert_int_equal(authorize(&pol, "GET /healthz HTTP/1.1\n\n", "/"), 403);
    assert_int_equal(authorize(&pol, "GET /healthz HTTP/1.0\n\n", "/"), 0);
    assert_int_equal(authorize(&pol, "GET /state?token=s3cret HTTP/1.1\nHost: x\n\n", "/"), 403);
    /* The token: header or query, exact; open routes need none. */
    assert_int_equal(authorize(&pol, "GET /state HTTP/1.0\n\n", "/"), 401);
    assert_int_equal(authorize(&pol, "GET /state HTTP/1.0\nAuthorization: Bearer s3cret\n\n", "/"),
                     0);
    assert_int_equal(authorize(&pol, "GET /state HTTP/1.0\nAuthorization: bearer s3cret\n\n", "/"),
                     0);
    assert_int_equal(authorize(&pol, "GET /state HTTP/1.0\nAuthorization: Bearer s3cret \n\n", "/"),
                     401);
    assert_int_equal(authorize(&pol, "GET /state HTTP/1.0\nAuthorization: Bearer s3cre\n\n", "/"),
                     401);
    assert_int_equal(authorize(&pol, "GET /state HTTP/1.0\nAuthorization: s3cret\n\n", "/"), 401);
    assert_int_equal(authorize(&pol, "GET /state?token=s3cret HTTP/1.0\n\n", "/"), 0);
    assert_int_equal(authorize(&pol, "GET /state?token=s3cretx HTTP/1.0\n\n", "/"), 401);
    assert_int_equal(authorize(&pol, "GET /state?token=&token=s3cret HTTP/1.0\n\n", "/"), 401);
    assert_int_equal(authorize(&pol, "GET /nothing HTTP/1.0\n\n", NULL), 401);
    assert_int_equal(authorize(&pol, "POST /nothing HTTP/1.0\n\n", NULL), 401);
    assert_int_equal(authorize(&pol, "GET /metrics HTTP/1.0\n\n", "/"), 401);
    assert_int_equal(authorize(&pol, "GET / HTTP/1.0\n\n", "/"), 0);
    assert_int_equal(authorize(&pol, "GET /app.js HTTP/1.0\n\n", "/"), 0);
    assert_int_equal(authorize(&pol, "POST /healthz HTTP/1.0\n\n", "/"), 0); /* then 405 */
    pol.metrics_open = true;
    assert_int_equal(authorize(&pol, "GET /metrics HTTP/1.0\n\n", "/"), 0);
    assert_int_equal(authorize(&pol, "GET /state HTTP/1.0\n\n", "/"), 401);
    /* An empty token never matches, even an empty presented one. */
    pol.token = "";
    assert_int_equal(authorize(&pol, "GET /state?token= HTTP/1.0\n\n", "/"), 401);
    /* Without auth only the Host check is left. */
    pol.auth = false;
    assert_int_equal(authorize(&pol, "GET /state HTTP/1.0\n\n", "/"), 0);
    assert_int_equal(authorize(&pol, "GET /state HTTP/1.1\nHost: evil.com\n\n", "/"), 403);
}

/* ---- the route table ---- */

static void route_lookup(void **state)
{
    (void)state;
    assert_true(mt__d_nroutes > 4);
    const mt_d_route_t *page = &mt__d_routes[mt__d_nroutes - 1];
    assert_null(page->fn);
    for (size_t i = 0; i < mt__d_nroutes; i++) {
        const mt_d_route_t *r = &mt__d_routes[i];
        assert_true(r == page || r->fn != NULL);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(r->path, mt__d_routes[j].path);
        mt_d_route_match_t m = mt__d_route_find(S("GET"), S(r->path));
        assert_int_equal(m.status, 0);
        assert_ptr_equal(m.route, r);
        m = mt__d_route_find(S("HEAD"), S(r->path));
        assert_int_equal(m.status, 0);
        m = mt__d_route_find(S("POST"), S(r->path));
        assert_int_equal(m.status, 405);
        assert_ptr_equal(m.route, r); /* who may call it is still known (401 before 405) */
    }
    /* Every embedded file is the page row's, with its own bytes. */
    assert_true(mt__d_web_nassets > 0);
    for (size_t i = 0; i < mt__d_web_nassets; i++) {
        mt_d_route_match_t m = mt__d_route_find(S("GET"), S(mt__d_web_assets[i].path));
        assert_int_equal(m.status, 0);
        assert_ptr_equal(m.route, page);
        assert_ptr_equal(m.asset, &mt__d_web_assets[i]);
    }
    mt_d_route_match_t m = mt__d_route_find(S("GET"), S("/"));
    assert_non_null(m.asset);
    assert_string_equal(m.asset->path, "/index.html");
    /* Unknown paths: 404; a method no route answers: 405 whatever the path. */
    static const char *const unknown[] = {"/nothing",    "/state/", "/State",    "/statex",
                                          "/app.js.map", "//",      "/history/1"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        m = mt__d_route_find(S("GET"), S(unknown[i]));
        assert_int_equal(m.status, 404);
        assert_null(m.route);
        m = mt__d_route_find(S("DELETE"), S(unknown[i]));
        assert_int_equal(m.status, 405);
    }
    assert_int_equal(mt__d_route_find(S("get"), S("/state")).status, 405);
    assert_int_equal(mt__d_route_find(S(""), S("/state")).status, 405);
}

/* Every row answers over a live daemon: none gives the generic 404 or a 405. */
static void route_reachable(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    for (size_t i = 0; i < mt__d_nroutes; i++) {
        const char *path = mt__d_routes[i].path;
        char req[256], *resp = NULL;
        /* HEAD: /events answers its head and closes instead of streaming. */
        int n = snprintf(req, sizeof req, "HEAD %s HTTP/1.1\r\n" TH_HDRS "\r\n", path);
        int status = th_http_raw(t.port, req, (size_t)n, &resp);
        if (status == 0 || status == 405)
            fail_msg("HEAD %s: %d", path, status);
        free(resp);
        if (strcmp(path, "/events") == 0)
            continue; /* a GET of it streams: the HEAD above was its check */
        status = th_http_get(t.port, path, &resp);
        if (status == 0 || status == 405 || strcmp(th_http_body(resp), "not found\n") == 0)
            fail_msg("GET %s: %d %s", path, status, th_http_body(resp));
        free(resp);
    }
    char *resp = NULL;
    assert_int_equal(th_http_get(t.port, "/nothing", &resp), 404);
    assert_string_equal(th_http_body(resp), "not found\n");
    free(resp);
    static const char post[] = "POST /state HTTP/1.1\r\n" TH_HDRS "\r\n";
    assert_int_equal(th_http_raw(t.port, post, sizeof post - 1, &resp), 405);
    assert_non_null(strstr(resp, "Allow: GET, HEAD\r\n"));
    free(resp);
    th_daemon_stop(&t);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parse_malformed), cmocka_unit_test(parse_pieces),
        cmocka_unit_test(authorize_rules), cmocka_unit_test(route_lookup),
        cmocka_unit_test(route_reachable),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
