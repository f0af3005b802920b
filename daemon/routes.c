/* memtraced: the one route table of the HTTP server (http.h), the JSON API's routes
 * (http.c) and the web page's (web.c, web_analysis.c) alike. What each answers is said
 * beside its handler; who may call it is said here, in one place. */
#include <string.h>

#include "daemon/http.h"
#include "daemon/internal.h"
#include "daemon/web.h"

#define GET_HEAD (MT_D_HTTP_GET | MT_D_HTTP_HEAD)

const mt_d_route_t mt__d_routes[] = {
    /* The API: http.c */
    {"/events", GET_HEAD, MT_D_ACCESS_TOKEN, false, mt__d_http_serve_events},
    {"/metrics", GET_HEAD, MT_D_ACCESS_METRICS, false, mt__d_http_serve_metrics},
    {"/state", GET_HEAD, MT_D_ACCESS_TOKEN, false, mt__d_http_serve_state},
    {"/healthz", GET_HEAD, MT_D_ACCESS_OPEN, false, mt__d_http_serve_healthz},
    /* The page's data: web.c, web_analysis.c */
    {"/history", GET_HEAD, MT_D_ACCESS_TOKEN, true, mt__d_web_serve_history},
    {"/spark", GET_HEAD, MT_D_ACCESS_TOKEN, true, mt__d_web_serve_spark},
    {"/map", GET_HEAD, MT_D_ACCESS_TOKEN, true, mt__d_web_serve_map},
    {"/block", GET_HEAD, MT_D_ACCESS_TOKEN, true, mt__d_web_serve_block},
    {"/callsites", GET_HEAD, MT_D_ACCESS_TOKEN, true, mt__d_web_serve_callsites},
    {"/tail", GET_HEAD, MT_D_ACCESS_TOKEN, true, mt__d_web_serve_tail},
    {"/sites", GET_HEAD, MT_D_ACCESS_TOKEN, true, mt__d_web_serve_sites},
    {"/gap", GET_HEAD, MT_D_ACCESS_TOKEN, true, mt__d_web_serve_gap},
    {"/analysis", GET_HEAD, MT_D_ACCESS_TOKEN, true, mt__d_web_serve_analysis},
    {"/diff", GET_HEAD, MT_D_ACCESS_TOKEN, true, mt__d_web_serve_diff},
    {"/jobs", GET_HEAD, MT_D_ACCESS_TOKEN, true, mt__d_web_serve_jobs},
    /* The page itself: "/" (index.html) and its embedded files, static bytes. */
    {"/", GET_HEAD, MT_D_ACCESS_OPEN, false, NULL},
};
const size_t mt__d_nroutes = sizeof mt__d_routes / sizeof mt__d_routes[0];

static bool path_is(mt_d_str_t path, const char *lit)
{
    size_t n = strlen(lit);
    return path.n == n && memcmp(path.p, lit, n) == 0;
}

/* The embedded file path names ("/" is index.html), or NULL. */
static const mt_d_asset_t *find_asset(mt_d_str_t path)
{
    const char *want = path_is(path, "/") ? "/index.html" : NULL;
    for (size_t i = 0; i < mt__d_web_nassets; i++) {
        const mt_d_asset_t *a = &mt__d_web_assets[i];
        if (want ? strcmp(a->path, want) == 0 : path_is(path, a->path))
            return a;
    }
    return NULL;
}

static unsigned method_bit(mt_d_str_t method)
{
    return path_is(method, "GET") ? MT_D_HTTP_GET : path_is(method, "HEAD") ? MT_D_HTTP_HEAD : 0;
}

mt_d_route_match_t mt__d_route_find(mt_d_str_t method, mt_d_str_t path)
{
    mt_d_route_match_t m = {404, NULL, NULL};
    const mt_d_route_t *page = &mt__d_routes[mt__d_nroutes - 1];
    for (size_t i = 0; i + 1 < mt__d_nroutes && !m.route; i++)
        if (path_is(path, mt__d_routes[i].path))
            m.route = &mt__d_routes[i];
    if (!m.route && (m.asset = find_asset(path)) != NULL)
        m.route = page;
    unsigned bit = method_bit(method), any = 0;
    for (size_t i = 0; i < mt__d_nroutes; i++)
        any |= mt__d_routes[i].methods;
    if (m.route)
        m.status = bit & m.route->methods ? 0 : 405;
    else if (!(bit & any))
        m.status = 405; /* a method no route answers: 405 whatever the path */
    return m;
}
