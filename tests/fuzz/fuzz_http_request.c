/* libFuzzer harness: the daemon's HTTP request path without a daemon (daemon/http.h).
 * The input is the bytes a client sent; mt__d_http_parse_request reads them, and a
 * request it accepts is looked up in the route table and authorized under a fixed
 * policy (token on, one extra host name). No loop, no socket: thousands of runs a second,
 * where fuzz_daemon sends each input through the whole server.
 *
 * Checked: the parse is a function of its bytes (the same result twice, and the same for
 * the head alone); an accepted request's pieces lie inside the input and hold the
 * invariants written at mt_d_req_t; a refused one has its name and its line for the 400;
 * "incomplete" only while there is no blank line and no NUL; the look-up answers 0, 404
 * or 405, and 405 only for a method no route has; authorization answers 0, 401 or 403. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/http.h"
#include "tests/fuzz/fuzz.h"

static bool inside(mt_d_str_t s, const uint8_t *data, size_t size)
{
    const char *b = (const char *)data;
    return !s.p || (s.p >= b && s.n <= size && (size_t)(s.p - b) <= size - s.n);
}

static bool has(mt_d_str_t s, int c)
{
    return s.p && s.n && memchr(s.p, c, s.n) != NULL;
}

static bool same(const mt_d_req_t *a, const mt_d_req_t *b)
{
    return a->method.p == b->method.p && a->method.n == b->method.n && a->path.p == b->path.p &&
           a->path.n == b->path.n && a->query.p == b->query.p && a->query.n == b->query.n &&
           a->token.p == b->token.p && a->token.n == b->token.n && a->host.p == b->host.p &&
           a->host.n == b->host.n && a->auth.p == b->auth.p && a->auth.n == b->auth.n &&
           a->http11 == b->http11 && a->head_len == b->head_len;
}

static void check_request(const mt_d_req_t *r, const uint8_t *data, size_t size)
{
    FUZZ_CHECK(r->head_len >= 2 && r->head_len <= size, "the head lies in the input");
    const mt_d_str_t *all[] = {&r->method, &r->path, &r->query, &r->token, &r->host, &r->auth};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        FUZZ_CHECK(inside(*all[i], data, r->head_len), "every piece lies in the head");
        FUZZ_CHECK(!has(*all[i], '\n') && !has(*all[i], '\0'), "no piece spans lines");
    }
    FUZZ_CHECK(!has(r->method, ' '), "the method is one word");
    FUZZ_CHECK(r->path.p && r->path.n >= 1 && r->path.p[0] == '/', "the path starts with /");
    for (size_t i = 0; i < r->path.n; i++)
        FUZZ_CHECK(r->path.p[i] > 0x20 && r->path.p[i] < 0x7f && r->path.p[i] != '?',
                   "the path is printable ASCII");
    for (size_t i = 0; i < r->query.n; i++)
        FUZZ_CHECK(r->query.p[i] > 0x20 && r->query.p[i] < 0x7f, "the query is printable ASCII");
    FUZZ_CHECK(r->query.p || !r->token.p, "a token only from a query");
    if (r->token.p) {
        FUZZ_CHECK(r->token.p >= r->query.p + 6 &&
                       r->token.p + r->token.n <= r->query.p + r->query.n &&
                       memcmp(r->token.p - 6, "token=", 6) == 0,
                   "the token is a token= value of the query");
        FUZZ_CHECK(r->token.p - 6 == r->query.p || r->token.p[-7] == '&',
                   "token= starts a parameter");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A copy of exactly size bytes: reading past them is ASan's to catch. */
    char *buf = malloc(size ? size : 1);
    FUZZ_CHECK(buf != NULL, "out of memory");
    if (size)
        memcpy(buf, data, size);
    const uint8_t *in = (const uint8_t *)buf;
    mt_d_req_t r, again;
    mt_d_req_e e = mt__d_http_parse_request(buf, size, &r);
    FUZZ_CHECK(e >= MT_D_REQ_OK && e < MT_D_REQ_NCODES, "a known result");
    FUZZ_CHECK(mt__d_http_parse_request(buf, size, &again) == e && same(&r, &again),
               "the parse is a function of the bytes");
    if (e == MT_D_REQ_INCOMPLETE) {
        FUZZ_CHECK(!memchr(buf, '\0', size), "a NUL is refused, not waited on");
        FUZZ_CHECK(!memmem(buf, size, "\n\n", 2) && !memmem(buf, size, "\n\r\n", 3),
                   "a blank line ends the head");
        free(buf);
        return 0;
    }
    if (e != MT_D_REQ_OK) {
        const char *msg = mt__d_http_req_message(e);
        FUZZ_CHECK(msg[0] && msg[strlen(msg) - 1] == '\n', "a refusal says what is wrong");
        FUZZ_CHECK(strncmp(mt__d_http_req_name(e), "MT_D_REQ_", 9) == 0, "a refusal has a name");
        FUZZ_CHECK(r.method.p == NULL && r.head_len <= size, "a refusal leaves no pieces");
        free(buf);
        return 0;
    }
    check_request(&r, in, size);
    FUZZ_CHECK(mt__d_http_parse_request(buf, r.head_len, &again) == MT_D_REQ_OK &&
                   again.head_len == r.head_len,
               "the head alone parses the same");

    mt_d_route_match_t m = mt__d_route_find(r.method, r.path);
    bool get_head = (r.method.n == 3 && memcmp(r.method.p, "GET", 3) == 0) ||
                    (r.method.n == 4 && memcmp(r.method.p, "HEAD", 4) == 0);
    FUZZ_CHECK(m.status == 0 || m.status == 404 || m.status == 405, "a known look-up status");
    FUZZ_CHECK((m.status == 405) == !get_head, "405 for exactly the methods no route has");
    FUZZ_CHECK(m.status != 0 || m.route != NULL, "a route for a match");
    FUZZ_CHECK(m.status != 404 || m.route == NULL, "no route for a 404");
    FUZZ_CHECK(!m.asset || (m.route && m.route->fn == NULL), "a file only for the page row");
    FUZZ_CHECK(!m.route || m.route->fn || m.asset, "the page row always with its file");

    static const mt_d_http_policy_t pol = {.names = {"fuzz.local", NULL},
                                           .auth = true,
                                           .metrics_open = false,
                                           .token = "fuzz0123456789abcdef0123456789ab"};
    int a = mt__d_http_authorize(&pol, &r, m.route);
    FUZZ_CHECK(a == 0 || a == 401 || a == 403, "a known authorization status");
    FUZZ_CHECK(a != 0 || (r.host.p ? true : !r.http11), "no HTTP/1.1 request without Host");
    if (a == 0 && m.route && m.route->access == MT_D_ACCESS_TOKEN)
        FUZZ_CHECK(r.auth.p || r.token.p, "a token route only with a token");
    free(buf);
    return 0;
}
