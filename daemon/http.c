/* memtraced: a deliberately small HTTP/1.1 server on 127.0.0.1.
 *
 * One request per connection (every answer says "Connection: close"), GET (and HEAD)
 * only, a bounded request head (cfg.max_request_bytes; larger gets 431), a deadline for
 * the whole head to arrive (cfg.head_timeout_ms from the accept; the sweep timer closes
 * late ones). Lines may end in CRLF or a bare LF.
 *
 * A head goes through three steps (http.h): parsed (http_request.c: 400 naming what is
 * wrong), looked up in the one route table (routes.c: 404, 405), authorized
 * (http_request.c), then answered by its route's handler. Every request, whatever its
 * route (web.c's too), passes two checks before any 404 or 405
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
 * The API's routes, answered here:
 *   GET /events   Server-Sent Events of the event stream (filters: ?pid=&kind=&tag=)
 *   GET /metrics  Prometheus text exposition (version 0.0.4)
 *   GET /state    JSON of every known process
 *   GET /healthz  "ok"
 * Anything else: 404; another method: 405 (checked after the two checks above). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/http.h"
#include "daemon/internal.h"
#include "daemon/web.h"
#include "util/json.h"

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

void mt__d_http_serve_events(mt_d_conn_t *c, const char *query, bool head_only)
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

void mt__d_http_serve_metrics(mt_d_conn_t *c, const char *query, bool head_only)
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

void mt__d_http_serve_state(mt_d_conn_t *c, const char *query, bool head_only)
{
    json_t *st = mt__d_state_json(c->d);
    char *s = NULL;
    size_t n = 0;
    int rc = st ? mt__json_dumps(st, JSON_COMPACT, &s, &n) : MT_ENOMEM;
    json_decref(st);
    if (rc) {
        respond_text(c, 500, "Internal Server Error", "out of memory\n");
        return;
    }
    s[n] = '\n'; /* the NUL is not sent: Content-Length covers n + 1 bytes */
    respond(c, 200, "OK", "application/json", NULL, s, n + 1, head_only);
    free(s);
}

void mt__d_http_serve_healthz(mt_d_conn_t *c, const char *query, bool head_only)
{
    respond(c, 200, "OK", "text/plain; charset=utf-8", NULL, "ok\n", 3, head_only);
}

/* ---- the request path ---- */

/* The query without its first token= parameter (it is no handler's business), written
 * over the query's own bytes in c->in; NULL when the target has no '?'. */
static const char *query_without_token(mt_d_conn_t *c, const mt_d_req_t *r)
{
    if (!r->query.p)
        return NULL;
    char *q = c->in.p + (r->query.p - c->in.p);
    size_t n = r->query.n;
    if (r->token.p) {
        size_t from = (size_t)(r->token.p - 6 - r->query.p); /* "token=" */
        size_t to = (size_t)(r->token.p + r->token.n - r->query.p);
        if (to < n)
            to++; /* the '&' after it */
        if (to == n && from > 0)
            from--; /* nothing follows: the '&' before it */
        memmove(q + from, q + to, n - to);
        n -= to - from;
    }
    q[n] = '\0'; /* over the ' ' before the version at most */
    return q;
}

int mt__d_http_get(mt_d_t *d, const char *target, mt_d_buf_t *out, int *status)
{
    *status = 0;
    size_t plen = strcspn(target, "?");
    if (target[0] != '/' || (plen == 7 && memcmp(target, "/events", 7) == 0))
        return MT_EINVAL;
    for (const char *s = target; *s; s++)
        if ((unsigned char)*s <= ' ' || *s == 0x7f)
            return MT_EINVAL;
    /* A connection of no socket (c.capture): its request goes through the server's own
     * steps, parse, route, authorize (the process's own: no token), answer. */
    mt_d_conn_t c = {.d = d, .kind = MT_D_CONN_HTTP_NEW, .capture = out};
    int rc = mt__d_buf_printf(&c.in, "GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n", target);
    size_t had = out->len;
    if (rc == 0)
        mt__d_http_input(&c);
    mt__d_buf_free(&c.in);
    if (rc == 0 && !out->err && out->len == had)
        rc = MT_ENOMEM; /* closed without an answer: its own buffer ran out */
    if (rc == 0 && out->err)
        rc = out->err;
    if (rc == 0 && sscanf(out->p + had, "HTTP/1.1 %d ", status) != 1)
        rc = MT_EPROTO;
    return rc;
}

static mt_d_http_policy_t policy_of(const mt_d_t *d)
{
    return (mt_d_http_policy_t){.names = {d->cfg.http_host, d->cfg.http_name},
                                .auth = d->cfg.http_auth,
                                .metrics_open = d->cfg.metrics_open,
                                .token = d->token};
}

void mt__d_http_input(mt_d_conn_t *c)
{
    mt_d_req_t req;
    mt_d_req_e e = mt__d_http_parse_request(c->in.p, c->in.len, &req);
    if (e == MT_D_REQ_INCOMPLETE)
        return; /* a head in several reads: wait for the rest (or the head deadline) */
    if (e != MT_D_REQ_OK) {
        respond_text(c, 400, "Bad Request", mt__d_http_req_message(e));
        return;
    }
    mt_d_route_match_t m = mt__d_route_find(req.method, req.path);
    mt_d_http_policy_t pol = policy_of(c->d);
    if (c->capture)
        pol.auth = false; /* asked by this process itself (mt__d_http_get), of no peer */
    switch (mt__d_http_authorize(&pol, &req, m.route)) {
    case 0:
        break;
    case 403:
        respond_text(c, 403, "Forbidden", "Host must be localhost, 127.0.0.1 or [::1]\n");
        return;
    default: {
        static const char why[] = "token required: see `memtrace token`\n";
        respond(c, 401, "Unauthorized", "text/plain; charset=utf-8",
                "WWW-Authenticate: Bearer realm=\"memtrace\"\r\n", why, sizeof why - 1, false);
        return;
    }
    }
    if (m.status == 405) {
        respond(c, 405, "Method Not Allowed", "text/plain; charset=utf-8",
                "Allow: " MT_D_HTTP_ALLOW "\r\n", "method not allowed\n", 19, false);
        return;
    }
    if (m.status == 404) {
        respond_text(c, 404, "Not Found", "not found\n");
        return;
    }
    bool head = req.method.n == 4 && memcmp(req.method.p, "HEAD", 4) == 0;
    const char *query = query_without_token(c, &req);
    const char *badp = m.route->numbers && query ? mt__d_web_bad_param(query) : NULL;
    if (badp) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s: not a valid number\n", badp);
        mt__d_web_bad(c, 400, msg);
    } else if (m.asset) {
        respond(c, 200, "OK", m.asset->ctype, NULL, (const char *)m.asset->data, m.asset->len,
                head);
    } else {
        m.route->fn(c, query, head);
    }
}
