/* memtraced: an HTTP request head parsed (pure: bytes in, pieces out) and authorized
 * (http.h). The rules are those of http.c's header comment and docs/telemetry.md,
 * "Security model". */
#include <string.h>
#include <strings.h>

#include "daemon/http.h"

/* ---- parsing ---- */

static const struct {
    const char *name;
    const char *message; /* the 400 answer's body */
} req_codes[MT_D_REQ_NCODES] = {
    [MT_D_REQ_OK] = {"MT_D_REQ_OK", "ok\n"},
    [MT_D_REQ_INCOMPLETE] = {"MT_D_REQ_INCOMPLETE", "incomplete request head\n"},
    [MT_D_REQ_BINARY] = {"MT_D_REQ_BINARY", "bad request\n"},
    [MT_D_REQ_DUP_HOST] = {"MT_D_REQ_DUP_HOST", "more than one Host header\n"},
    [MT_D_REQ_BAD_LINE] = {"MT_D_REQ_BAD_LINE", "malformed request line\n"},
    [MT_D_REQ_BAD_VERSION] = {"MT_D_REQ_BAD_VERSION", "unsupported HTTP version\n"},
    [MT_D_REQ_BAD_TARGET] = {"MT_D_REQ_BAD_TARGET", "bad request target\n"},
};

const char *mt__d_http_req_message(mt_d_req_e e)
{
    return (unsigned)e < MT_D_REQ_NCODES ? req_codes[e].message : "bad request\n";
}

const char *mt__d_http_req_name(mt_d_req_e e)
{
    return (unsigned)e < MT_D_REQ_NCODES ? req_codes[e].name : "MT_D_REQ_?";
}

static bool str_is(mt_d_str_t s, const char *lit)
{
    size_t n = strlen(lit);
    return s.p && s.n == n && memcmp(s.p, lit, n) == 0;
}

static bool str_is_nocase(mt_d_str_t s, const char *lit)
{
    size_t n = strlen(lit);
    return s.p && s.n == n && strncasecmp(s.p, lit, n) == 0;
}

/* The '\n' that ends the head's last line (the blank line follows it, CRLF or bare LF)
 * within text[0, n), or NULL while there is none. */
static const char *head_end(const char *text, size_t n)
{
    for (const char *p = text; (p = memchr(p, '\n', n - (size_t)(p - text))) != NULL; p++) {
        size_t rest = n - (size_t)(p - text) - 1; /* bytes after this '\n' */
        if (rest >= 1 && p[1] == '\n')
            return p;
        if (rest >= 2 && p[1] == '\r' && p[2] == '\n')
            return p;
    }
    return NULL;
}

/* The line at p (it ends in a '\n' before end): its bytes without "\r\n" or "\n". */
static mt_d_str_t line_at(const char *p, const char *end, const char **next)
{
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    *next = nl + 1;
    size_t n = (size_t)(nl - p);
    if (n > 0 && p[n - 1] == '\r')
        n--;
    return (mt_d_str_t){p, n};
}

/* The header fields this server reads: Host (once) and Authorization (the last). */
static mt_d_req_e parse_headers(const char *p, const char *end, mt_d_req_t *r)
{
    while (p < end) {
        mt_d_str_t line = line_at(p, end, &p);
        const char *colon = memchr(line.p, ':', line.n);
        if (!colon)
            continue;
        mt_d_str_t name = {line.p, (size_t)(colon - line.p)};
        const char *v = colon + 1, *vend = line.p + line.n;
        while (v < vend && (*v == ' ' || *v == '\t'))
            v++;
        mt_d_str_t value = {v, (size_t)(vend - v)};
        if (str_is_nocase(name, "Host")) {
            if (r->host.p)
                return MT_D_REQ_DUP_HOST;
            r->host = value;
        } else if (str_is_nocase(name, "Authorization")) {
            r->auth = value;
        }
    }
    return MT_D_REQ_OK;
}

static bool valid_target(mt_d_str_t t)
{
    if (t.n == 0 || t.p[0] != '/')
        return false;
    for (size_t i = 0; i < t.n; i++)
        if ((unsigned char)t.p[i] <= 0x20 || (unsigned char)t.p[i] >= 0x7f)
            return false;
    return true;
}

/* The value of the query's first "token=" parameter, or absent. */
static mt_d_str_t query_token(mt_d_str_t q)
{
    const char *p = q.p, *end = q.p + q.n;
    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        size_t len = (size_t)((amp ? amp : end) - p);
        if (len >= 6 && memcmp(p, "token=", 6) == 0)
            return (mt_d_str_t){p + 6, len - 6};
        p = amp ? amp + 1 : end;
    }
    return (mt_d_str_t){NULL, 0};
}

/* Request line: METHOD SP TARGET SP HTTP/1.x, nothing else. */
static mt_d_req_e parse_request_line(mt_d_str_t line, mt_d_req_t *r)
{
    const char *end = line.p + line.n;
    const char *sp1 = memchr(line.p, ' ', line.n);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(end - sp1 - 1)) : NULL;
    if (!sp1 || !sp2 || memchr(sp2 + 1, ' ', (size_t)(end - sp2 - 1)))
        return MT_D_REQ_BAD_LINE;
    mt_d_str_t version = {sp2 + 1, (size_t)(end - sp2 - 1)};
    mt_d_str_t target = {sp1 + 1, (size_t)(sp2 - sp1 - 1)};
    r->method = (mt_d_str_t){line.p, (size_t)(sp1 - line.p)};
    r->http11 = str_is(version, "HTTP/1.1");
    if (!r->http11 && !str_is(version, "HTTP/1.0"))
        return MT_D_REQ_BAD_VERSION;
    if (!valid_target(target))
        return MT_D_REQ_BAD_TARGET;
    const char *q = memchr(target.p, '?', target.n);
    r->path = (mt_d_str_t){target.p, q ? (size_t)(q - target.p) : target.n};
    if (q) {
        r->query = (mt_d_str_t){q + 1, (size_t)(sp2 - q - 1)};
        r->token = query_token(r->query);
    }
    return MT_D_REQ_OK;
}

mt_d_req_e mt__d_http_parse_request(const char *buf, size_t len, mt_d_req_t *out)
{
    memset(out, 0, sizeof *out);
    /* The head is text: a NUL before its end is binary garbage, not a request. */
    const char *nul = len ? memchr(buf, '\0', len) : NULL;
    size_t text = nul ? (size_t)(nul - buf) : len;
    const char *end = text ? head_end(buf, text) : NULL;
    if (!end)
        return nul ? MT_D_REQ_BINARY : MT_D_REQ_INCOMPLETE;
    out->head_len = (size_t)(end - buf) + (end[1] == '\n' ? 2 : 3);
    end++; /* past the last line's '\n' */
    const char *rest;
    mt_d_str_t line = line_at(buf, end, &rest);
    /* The headers are read first: a second Host is refused whatever the request line. */
    mt_d_req_e e = parse_headers(rest, end, out);
    if (e == MT_D_REQ_OK)
        e = parse_request_line(line, out);
    if (e != MT_D_REQ_OK) {
        size_t head_len = out->head_len;
        memset(out, 0, sizeof *out);
        out->head_len = head_len;
    }
    return e;
}

/* ---- authorization ---- */

/* Host's name without its port, compared with the names of this host. */
static bool host_allowed(const mt_d_http_policy_t *pol, mt_d_str_t host)
{
    const char *h = host.p, *end = host.p + host.n;
    size_t n;
    if (host.n > 0 && h[0] == '[') {
        const char *rb = memchr(h, ']', host.n);
        if (!rb)
            return false;
        n = (size_t)(rb - h) + 1;
    } else {
        const char *colon = memchr(h, ':', host.n);
        n = colon ? (size_t)(colon - h) : host.n;
    }
    const char *port = h + n;
    if (port < end && *port == ':')
        port++;
    else if (port < end)
        return false;
    for (; port < end; port++)
        if (*port < '0' || *port > '9')
            return false;
    const char *names[] = {"localhost", "127.0.0.1", "[::1]", pol->names[0], pol->names[1]};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (names[i] && strlen(names[i]) == n && strncasecmp(names[i], h, n) == 0)
            return true;
    return false;
}

/* Constant-time comparison of a presented token with ours. */
static bool token_equal(const char *ours, mt_d_str_t given)
{
    size_t len = strlen(ours);
    unsigned char diff = (unsigned char)(given.n != len);
    for (size_t i = 0; i < len; i++)
        diff |= (unsigned char)(ours[i] ^ (i < given.n ? given.p[i] : 0));
    return diff == 0 && len > 0;
}

int mt__d_http_authorize(const mt_d_http_policy_t *pol, const mt_d_req_t *req,
                         const mt_d_route_t *route)
{
    /* HTTP/1.1 requires Host; a 1.0 client without one is no browser (no rebinding). */
    if (req->host.p ? !host_allowed(pol, req->host) : req->http11)
        return 403;
    if (!pol->auth)
        return 0;
    /* Open: the health check, the metrics when configured so, and the page's static
     * files (the same bytes as in the source; a browser's navigation to the page cannot
     * carry the token, which the page sends with each request for data). */
    mt_d_access_e access = route ? route->access : MT_D_ACCESS_TOKEN;
    if (access == MT_D_ACCESS_OPEN || (access == MT_D_ACCESS_METRICS && pol->metrics_open))
        return 0;
    const mt_d_str_t auth = req->auth;
    if (auth.p && auth.n >= 7 && strncasecmp(auth.p, "Bearer ", 7) == 0 &&
        token_equal(pol->token, (mt_d_str_t){auth.p + 7, auth.n - 7}))
        return 0;
    if (req->token.p && token_equal(pol->token, req->token))
        return 0;
    return 401;
}
