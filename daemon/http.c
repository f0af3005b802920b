/* memtraced: a deliberately small HTTP/1.1 server on 127.0.0.1.
 *
 * One request per connection (every answer says "Connection: close"), GET (and HEAD)
 * only, a bounded request head (cfg.max_request_bytes; larger gets 431), a deadline for
 * the head to arrive (the sweep timer closes idle half requests). Routes:
 *   GET /events   Server-Sent Events of the event stream (filters: ?pid=&kind=&tag=)
 *   GET /metrics  Prometheus text exposition (version 0.0.4)
 *   GET /state    JSON of every known process
 *   GET /healthz  "ok"
 * Anything else: 404; another method: 405; a malformed head: 400. */
#include <stdlib.h>
#include <string.h>

#include "daemon/internal.h"
#include "daemon/web.h"

static void respond(mt_d_conn_t *c, int status, const char *reason, const char *ctype,
                    const char *extra_headers, const char *body, size_t blen, bool head_only)
{
    mt_d_t *d = c->d;
    mt_d_buf_t *b = &d->scratch;
    b->len = 0;
    int rc = mt__d_buf_printf(b,
                              "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                              "Cache-Control: no-store\r\nConnection: close\r\n%s\r\n",
                              status, reason, ctype, blen, extra_headers ? extra_headers : "");
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
    b->len = 0;
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

void mt__d_http_input(mt_d_conn_t *c)
{
    char *end = strstr(c->in.p, "\r\n\r\n");
    if (!end) {
        if (memchr(c->in.p, '\0', c->in.len))
            respond_text(c, 400, "Bad Request", "bad request\n"); /* binary garbage */
        return; /* a head in several reads: wait for the rest (or the idle deadline) */
    }
    *end = '\0';
    char *eol = strstr(c->in.p, "\r\n");
    if (eol)
        *eol = '\0';
    /* Request line: METHOD SP TARGET SP HTTP/1.x */
    char *line = c->in.p;
    char *sp1 = strchr(line, ' ');
    char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp1 || !sp2 || strchr(sp2 + 1, ' ')) {
        respond_text(c, 400, "Bad Request", "malformed request line\n");
        return;
    }
    *sp1 = '\0';
    *sp2 = '\0';
    const char *method = line, *target = sp1 + 1, *version = sp2 + 1;
    if (strcmp(version, "HTTP/1.1") != 0 && strcmp(version, "HTTP/1.0") != 0) {
        respond_text(c, 400, "Bad Request", "unsupported HTTP version\n");
        return;
    }
    if (!valid_target(target)) {
        respond_text(c, 400, "Bad Request", "bad request target\n");
        return;
    }
    bool head = strcmp(method, "HEAD") == 0;
    if (!head && strcmp(method, "GET") != 0) {
        respond(c, 405, "Method Not Allowed", "text/plain; charset=utf-8", "Allow: GET, HEAD\r\n",
                "method not allowed\n", 19, false);
        return;
    }
    char path[128];
    const char *q = strchr(target, '?');
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
