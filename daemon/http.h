/* memtraced's HTTP request path, in three steps that each can be tested alone:
 *   mt__d_http_parse_request  bytes -> a request, or the name of what is wrong with them
 *                             (pure: no I/O, no daemon state);
 *   mt__d_route_find          (method, path) -> the one route table's row, or 404 / 405;
 *   mt__d_http_authorize      (policy, request, row) -> may it be answered (403, 401)?
 * http.c runs them in that order for every connection's head and answers. */
#ifndef MT_DAEMON_HTTP_H
#define MT_DAEMON_HTTP_H

#include <stdbool.h>
#include <stddef.h>

/* A piece of the request's bytes: p[0, n), not NUL-terminated. p == NULL: absent. */
typedef struct mt_d_str_s {
    const char *p;
    size_t n;
} mt_d_str_t;

/* What parse_request found. Every value but OK and INCOMPLETE is answered 400 with
 * mt__d_http_req_message()'s line. */
typedef enum mt_d_req_e {
    MT_D_REQ_OK = 0,
    MT_D_REQ_INCOMPLETE,  /* no blank line yet: wait for more (or the head deadline) */
    MT_D_REQ_BINARY,      /* a NUL byte before the head's end */
    MT_D_REQ_DUP_HOST,    /* more than one Host header */
    MT_D_REQ_BAD_LINE,    /* the request line is not METHOD SP TARGET SP VERSION */
    MT_D_REQ_BAD_VERSION, /* neither HTTP/1.1 nor HTTP/1.0 */
    MT_D_REQ_BAD_TARGET,  /* not '/' then printable ASCII without spaces */
    MT_D_REQ_NCODES
} mt_d_req_e;

/* A parsed request head. Every piece points into the parsed bytes (borrowed).
 * Invariants (OK): method has no ' '; path.p[0] == '/'; path and query hold only bytes
 * 0x21..0x7e; query.p == NULL iff the target has no '?' (then token.p == NULL too);
 * token, when present, lies inside query; head_len <= the bytes given. */
typedef struct mt_d_req_s {
    mt_d_str_t method; /* any bytes but ' ' (checked against the route, later) */
    mt_d_str_t path;   /* the target before '?' */
    mt_d_str_t query;  /* after '?', token=... included; empty for "/x?" */
    mt_d_str_t token;  /* the value of the query's first token=, or absent */
    mt_d_str_t host;   /* Host's value (absent: no Host header) */
    mt_d_str_t auth;   /* the last Authorization header's value, or absent */
    bool http11;       /* HTTP/1.1 (else 1.0) */
    size_t head_len;   /* bytes of the head, its blank line included */
} mt_d_req_t;

/* Parses the head at the start of buf[0, len). Bytes after its blank line (a body) are
 * ignored. Lines end in CRLF or a bare LF. */
mt_d_req_e mt__d_http_parse_request(const char *buf, size_t len, mt_d_req_t *out);
/* The 400 answer's body for an error code: a static line ending in '\n'. */
const char *mt__d_http_req_message(mt_d_req_e e);
/* The error's name ("MT_D_REQ_DUP_HOST"), for tests and the fuzzer's messages. */
const char *mt__d_http_req_name(mt_d_req_e e);

/* ---- the route table (routes.c) ---- */

enum { MT_D_HTTP_GET = 1u << 0, MT_D_HTTP_HEAD = 1u << 1 };

/* Who may call a route when the daemon has a token (cfg.http_auth). */
typedef enum mt_d_access_e {
    MT_D_ACCESS_TOKEN = 0, /* the token, in Authorization: Bearer or ?token= */
    MT_D_ACCESS_OPEN,      /* anyone who passes the Host check (health check, page files) */
    MT_D_ACCESS_METRICS,   /* open with cfg.metrics_open, else the token */
} mt_d_access_e;

struct mt_d_conn_s;
struct mt_d_asset_s;
/* Answers the request; query is NULL when the target has no '?', else without token=. */
typedef void (*mt_d_route_cb)(struct mt_d_conn_s *c, const char *query, bool head);

/* One row: a path, the methods it answers and who may call it. */
typedef struct mt_d_route_s {
    const char *path; /* "/state"; "/" and the page's files match the one page row */
    unsigned methods; /* MT_D_HTTP_* */
    mt_d_access_e access;
    bool numbers;     /* pid, seq, from, ... in the query are checked first (400) */
    mt_d_route_cb fn; /* NULL for the page row: the file found is sent */
} mt_d_route_t;

/* The API's handlers (http.c): the event stream (SSE), Prometheus text, the state as JSON,
 * "ok". */
void mt__d_http_serve_events(struct mt_d_conn_s *c, const char *query, bool head);
void mt__d_http_serve_metrics(struct mt_d_conn_s *c, const char *query, bool head);
void mt__d_http_serve_state(struct mt_d_conn_s *c, const char *query, bool head);
void mt__d_http_serve_healthz(struct mt_d_conn_s *c, const char *query, bool head);

/* The API's and the page's routes, the page row last. */
extern const mt_d_route_t mt__d_routes[];
extern const size_t mt__d_nroutes;

/* The result of a look-up: status 0 with a row (and for the page row its file), or 404
 * (no such path) or 405 (a method no route of this path answers). */
typedef struct mt_d_route_match_s {
    int status;
    const mt_d_route_t *route;
    const struct mt_d_asset_s *asset;
} mt_d_route_match_t;

mt_d_route_match_t mt__d_route_find(mt_d_str_t method, mt_d_str_t path);
/* "GET, HEAD": the methods of a 405's Allow header. */
#define MT_D_HTTP_ALLOW "GET, HEAD"

/* ---- authorization ---- */

/* What a request is checked against, taken from the daemon's settings. */
typedef struct mt_d_http_policy_s {
    const char *names[2]; /* cfg.http_host, cfg.http_name: this host's names (or NULL) */
    bool auth;            /* cfg.http_auth: routes but the open ones need the token */
    bool metrics_open;    /* cfg.metrics_open */
    const char *token;    /* the token ("" when auth is off) */
} mt_d_http_policy_t;

/* 0 when the request may be answered, else the status to refuse it with: 403 (its Host
 * names another host, or an HTTP/1.1 request has none) or 401 (no valid token for a
 * route that needs one). route is NULL for a path no route has (it needs the token). */
int mt__d_http_authorize(const mt_d_http_policy_t *pol, const mt_d_req_t *req,
                         const mt_d_route_t *route);

#endif
