/* memtraced: a deliberately small HTTP/1.1 server on 127.0.0.1.
 *
 * One request per connection (every answer says "Connection: close"), GET (and HEAD)
 * only, a bounded request head (cfg.max_request_bytes; larger gets 431), a deadline for
 * the whole head to arrive (cfg.head_timeout_ms from the accept; the sweep timer closes
 * late ones). Lines may end in CRLF or a bare LF.
 *
 * Every request, whatever its route (web.c's too), passes two checks first
 * (docs/telemetry.md, "Security model"):
 *   Host     must name this host: localhost, 127.0.0.1, [::1], cfg.http_host or
 *            cfg.http_name, with any port (a browser tricked by DNS rebinding sends the
 *            attacker's name): else 403;
 *   token    with cfg.http_auth, every route but /healthz (and /metrics with
 *            cfg.metrics_open) and the page's own static files needs the token:
 *            "Authorization: Bearer T" or "?token=T", else 401. No answer sets a cookie: a
 *            cookie for localhost goes to every port of it, another user's server too. The
 *            page takes the token from its URL's fragment (#token=T, never sent) and keeps
 *            it in sessionStorage, which is per origin, port included.
 * Routes:
 *   GET /events   Server-Sent Events of the event stream (filters: ?pid=&kind=&tag=)
 *   GET /metrics  Prometheus text exposition (version 0.0.4)
 *   GET /state    JSON of every known process
 *   GET /healthz  "ok"
 * Anything else: 404; another method: 405; a malformed head: 400. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "daemon/internal.h"
#include "daemon/web.h"

static void respond(mt_d_conn_t *c, int status, const char *reason, const char *ctype,
                    const char *extra_headers, const char *body, size_t blen, bool head_only)
{
    mt_d_t *d = c->d;
    mt_d_buf_t *b = &d->scratch;
    mt__d_buf_clear(b);
    int rc = mt__d_buf_printf(b,
                              "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                              "Cache-Control: no-store\r\nConnection: close\r\n%s",
                              status, reason, ctype, blen, extra_headers ? extra_headers : "");
    if (!rc)
        rc = mt__d_buf_append(b, "\r\n", 2);
    if (!rc && !head_only && blen)
        rc = mt__d_buf_append(b, body, blen);
    c->kind = MT_D_CONN_DONE;
    if (status >= 400)
        d->ctr.rejected++;
    if (rc)
        mt__d_conn_close(c);
    else
        mt__d_conn_write(c, b->p, b->len, true);
    if (b->cap > (1u << 20))
        mt__d_buf_free(b); /* a big /state answer need not stay allocated */
}

void mt__d_http_respond(mt_d_conn_t *c, int status, const char *reason, const char *ctype,
                        const char *body, size_t blen, bool head_only)
{
    respond(c, status, reason, ctype, NULL, body, blen, head_only);
}

static void respond_text(mt_d_conn_t *c, int status, const char *reason, const char *text)
{
    respond(c, status, reason, "text/plain; charset=utf-8", NULL, text, strlen(text), false);
}

static void start_sse(mt_d_conn_t *c, const char *query, bool head_only)
{
    char err[128];
    if (query && mt__d_sub_parse_query(&c->sub, query, err, sizeof err) != 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s\n", err);
        respond_text(c, 400, "Bad Request", msg);
        return;
    }
    if (!head_only && mt__d_consumer_admit(c) != 0) {
        respond(c, 503, "Service Unavailable", "text/plain; charset=utf-8", "Retry-After: 5\r\n",
                "too many consumers\n", 19, false);
        return;
    }
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Cache-Control: no-store\r\nConnection: close\r\n"
                               "X-Accel-Buffering: no\r\n\r\n";
    if (head_only) {
        c->kind = MT_D_CONN_DONE;
        mt__d_conn_write(c, head, sizeof head - 1, true);
        return;
    }
    /* The comment line flushes proxies and tells the client the stream is live. */
    static const char hello[] = ": memtrace event stream\nretry: 2000\n\n";
    mt_d_buf_t *b = &c->d->scratch;
    mt__d_buf_clear(b);
    if (mt__d_buf_append(b, head, sizeof head - 1) ||
        mt__d_buf_append(b, hello, sizeof hello - 1) ||
        mt__d_conn_write(c, b->p, b->len, false) != 0) {
        mt__d_conn_close(c);
        return;
    }
    c->kind = MT_D_CONN_SSE;
    c->sub.sse = true;
    c->d->ctr.consumers++;
    mt__d_consumer_start(c);
}

static void serve_metrics(mt_d_conn_t *c, bool head_only)
{
    mt_d_buf_t text = {0};
    if (mt__d_metrics_text(c->d, &text) != 0) {
        mt__d_buf_free(&text);
        respond_text(c, 500, "Internal Server Error", "out of memory\n");
        return;
    }
    respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", NULL, text.p, text.len,
            head_only);
    mt__d_buf_free(&text);
}

static void serve_state(mt_d_conn_t *c, bool head_only)
{
    json_t *st = mt__d_state_json(c->d);
    char *s = st ? json_dumps(st, JSON_COMPACT) : NULL;
    json_decref(st);
    if (!s) {
        respond_text(c, 500, "Internal Server Error", "out of memory\n");
        return;
    }
    size_t n = strlen(s);
    s[n] = '\n'; /* the NUL is not sent: Content-Length covers n + 1 bytes */
    respond(c, 200, "OK", "application/json", NULL, s, n + 1, head_only);
    free(s);
}

static bool valid_target(const char *t)
{
    if (t[0] != '/')
        return false;
    for (const unsigned char *p = (const unsigned char *)t; *p; p++)
        if (*p <= 0x20 || *p >= 0x7f)
            return false;
    return true;
}

/* Host's name without its port, compared with the names of this host. */
static bool host_allowed(const mt_d_t *d, const char *host)
{
    size_t n;
    if (host[0] == '[') {
        const char *rb = strchr(host, ']');
        if (!rb)
            return false;
        n = (size_t)(rb - host) + 1;
    } else {
        n = strcspn(host, ":");
    }
    const char *port = host + n;
    if (*port == ':')
        port++;
    else if (*port)
        return false;
    if (strspn(port, "0123456789") != strlen(port))
        return false;
    const char *names[] = {"localhost", "127.0.0.1", "[::1]", d->cfg.http_host, d->cfg.http_name};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (names[i] && strlen(names[i]) == n && strncasecmp(names[i], host, n) == 0)
            return true;
    return false;
}

/* Constant-time comparison of a presented token (length n) with ours. */
static bool token_equal(const char *ours, const char *given, size_t n)
{
    size_t len = strlen(ours);
    unsigned char diff = (unsigned char)(n != len);
    for (size_t i = 0; i < len; i++)
        diff |= (unsigned char)(ours[i] ^ (i < n ? given[i] : 0));
    return diff == 0 && len > 0;
}

/* Removes "token=..." from the query (in place) and copies its value into tok (cut to
 * 63 bytes); returns the value's length, or -1 if there is none. */
static long take_query_token(char *query, char tok[64])
{
    for (char *kv = query; kv && *kv;) {
        char *amp = strchr(kv, '&');
        size_t len = amp ? (size_t)(amp - kv) : strlen(kv);
        if (len >= 6 && strncmp(kv, "token=", 6) == 0) {
            size_t vlen = len - 6 < 63 ? len - 6 : 63;
            memcpy(tok, kv + 6, vlen);
            tok[vlen] = '\0';
            memmove(kv, amp ? amp + 1 : kv + len, strlen(amp ? amp + 1 : kv + len) + 1);
            if (kv > query && !*kv)
                kv[-1] = '\0'; /* a trailing '&' left behind */
            return (long)(len - 6);
        }
        kv = amp ? amp + 1 : NULL;
    }
    return -1;
}

/* The end of the head: the '\n' before its blank line (CRLF or bare LF), NULL while
 * incomplete. */
static char *head_end(char *s)
{
    char *lf = strstr(s, "\n\n"), *crlf = strstr(s, "\n\r\n");
    return !lf ? crlf : !crlf ? lf : lf < crlf ? lf : crlf;
}

void mt__d_http_input(mt_d_conn_t *c)
{
    char *end = head_end(c->in.p);
    if (!end) {
        if (memchr(c->in.p, '\0', c->in.len))
            respond_text(c, 400, "Bad Request", "bad request\n"); /* binary garbage */
        return; /* a head in several reads: wait for the rest (or the head deadline) */
    }
    end[1] = '\0'; /* keeps the last line's '\n' */
    /* Split into lines, dropping a '\r' before each '\n'. */
    char *line = c->in.p;
    char *nl = strchr(line, '\n');
    *nl = '\0';
    if (nl > line && nl[-1] == '\r')
        nl[-1] = '\0';
    const char *host = NULL, *auth = NULL;
    for (char *h = nl + 1; *h;) {
        char *e = strchr(h, '\n');
        *e = '\0';
        if (e > h && e[-1] == '\r')
            e[-1] = '\0';
        char *colon = strchr(h, ':');
        if (colon) {
            *colon = '\0';
            char *v = colon + 1;
            v += strspn(v, " \t");
            if (strcasecmp(h, "Host") == 0) {
                if (host) {
                    respond_text(c, 400, "Bad Request", "more than one Host header\n");
                    return;
                }
                host = v;
            } else if (strcasecmp(h, "Authorization") == 0) {
                auth = v;
            }
        }
        h = e + 1;
    }
    /* Request line: METHOD SP TARGET SP HTTP/1.x */
    char *sp1 = strchr(line, ' ');
    char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp1 || !sp2 || strchr(sp2 + 1, ' ')) {
        respond_text(c, 400, "Bad Request", "malformed request line\n");
        return;
    }
    *sp1 = '\0';
    *sp2 = '\0';
    const char *method = line, *version = sp2 + 1;
    char *target = sp1 + 1;
    if (strcmp(version, "HTTP/1.1") != 0 && strcmp(version, "HTTP/1.0") != 0) {
        respond_text(c, 400, "Bad Request", "unsupported HTTP version\n");
        return;
    }
    if (!valid_target(target)) {
        respond_text(c, 400, "Bad Request", "bad request target\n");
        return;
    }
    /* HTTP/1.1 requires Host; a 1.0 client without one is no browser (no rebinding). */
    if ((host && !host_allowed(c->d, host)) || (!host && strcmp(version, "HTTP/1.1") == 0)) {
        respond_text(c, 403, "Forbidden", "Host must be localhost, 127.0.0.1 or [::1]\n");
        return;
    }
    char *q = strchr(target, '?');
    char qtok[64];
    long qlen = q ? take_query_token(q + 1, qtok) : -1;
    if (q && !q[1])
        *q = '\0';
    size_t plen0 = q ? (size_t)(q - target) : strlen(target);
    /* Open: the health check, the metrics when configured so, and the page's static
     * files (the same bytes as in the source; a browser's navigation to the page cannot
     * carry the token, which the page sends with each request for data). */
    bool open_route =
        (plen0 == 8 && strncmp(target, "/healthz", 8) == 0) ||
        (c->d->cfg.metrics_open && plen0 == 8 && strncmp(target, "/metrics", 8) == 0) ||
        mt__d_web_is_asset(target, plen0);
    if (c->d->cfg.http_auth && !open_route) {
        bool ok = false;
        if (auth && strncasecmp(auth, "Bearer ", 7) == 0)
            ok = token_equal(c->d->token, auth + 7, strlen(auth + 7));
        if (!ok && qlen >= 0)
            ok = token_equal(c->d->token, qtok, (size_t)qlen);
        if (!ok) {
            static const char why[] = "token required: see `memtrace token`\n";
            respond(c, 401, "Unauthorized", "text/plain; charset=utf-8",
                    "WWW-Authenticate: Bearer realm=\"memtrace\"\r\n", why, sizeof why - 1, false);
            return;
        }
    }
    bool head = strcmp(method, "HEAD") == 0;
    if (!head && strcmp(method, "GET") != 0) {
        respond(c, 405, "Method Not Allowed", "text/plain; charset=utf-8", "Allow: GET, HEAD\r\n",
                "method not allowed\n", 19, false);
        return;
    }
    char path[128];
    size_t plen = q ? (size_t)(q - target) : strlen(target);
    if (plen >= sizeof path) {
        respond_text(c, 404, "Not Found", "not found\n");
        return;
    }
    memcpy(path, target, plen);
    path[plen] = '\0';
    if (strcmp(path, "/events") == 0)
        start_sse(c, q ? q + 1 : NULL, head);
    else if (strcmp(path, "/metrics") == 0)
        serve_metrics(c, head);
    else if (strcmp(path, "/state") == 0)
        serve_state(c, head);
    else if (strcmp(path, "/healthz") == 0)
        respond(c, 200, "OK", "text/plain; charset=utf-8", NULL, "ok\n", 3, head);
    else if (!mt__d_web_route(c, path, q ? q + 1 : NULL, head))
        respond_text(c, 404, "Not Found", "not found\n");
}
