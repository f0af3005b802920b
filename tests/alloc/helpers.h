/* Shared fixtures of the allocator tests: a sim backend with zero modelled cost, an
 * allocator over it, and an event sink that records what it is given. */
#ifndef MT_TESTS_ALLOC_HELPERS_H
#define MT_TESTS_ALLOC_HELPERS_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/alloc.h"
#include "allocator/internal.h"
#include "backend/backend.h"
#include "backend/backend_sim.h"

#define MIB ((size_t)1 << 20)
#define KIB ((size_t)1 << 10)

typedef struct rec_sink_s {
    mt_event_sink_t sink;
    mt_event_rec_t *ev;
    size_t n, cap;
} rec_sink_t;

static inline void rec_emit(void *ud, const mt_event_rec_t *ev)
{
    rec_sink_t *r = ud;
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 256;
        r->ev = realloc(r->ev, r->cap * sizeof *r->ev);
        assert_non_null(r->ev);
    }
    r->ev[r->n++] = *ev;
}

static inline void rec_init(rec_sink_t *r)
{
    memset(r, 0, sizeof *r);
    r->sink.emit = rec_emit;
    r->sink.ud = r;
}

static inline size_t rec_count(const rec_sink_t *r, int kind)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n; i++)
        n += r->ev[i].kind == kind;
    return n;
}

static inline void rec_fini(rec_sink_t *r)
{
    free(r->ev);
    memset(r, 0, sizeof *r);
}

/* Last log message at MT_LOG_ERROR, for assertions on the OOM report. */
typedef struct log_capture_s {
    char last_error[2048];
    int nerrors;
} log_capture_t;

static inline void capture_log(void *ud, mt_log_level_e level, const char *msg)
{
    log_capture_t *c = ud;
    if (level == MT_LOG_ERROR) {
        snprintf(c->last_error, sizeof c->last_error, "%s", msg);
        c->nerrors++;
    }
}

/* A gate that keeps a stream busy: work queued behind gate_wait runs once gate_open is
 * called. */
typedef struct gate_s {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open;
} gate_t;

static inline void gate_wait(void *ud)
{
    gate_t *g = ud;
    pthread_mutex_lock(&g->mu);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static inline void gate_open(gate_t *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static inline mt_backend_t *sim_backend(size_t capacity)
{
    mt_backend_cfg_t c = mt_backend_cfg_default();
    c.kind = MT_BACKEND_SIM;
    c.sim_capacity = capacity;
    c.sim_malloc_cost_ns = c.sim_free_cost_ns = 0;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &c), 0);
    return b;
}

/* An allocator with the reference's rules (rules:reference: plain segments, as these tests
 * assert segment shapes and device calls of those rules), then conf on top. make_alloc_default
 * starts from mt_alloc_cfg_default() instead. */
static inline mt_alloc_t *make_alloc_from(mt_backend_t *b, const char *base, const char *conf,
                                          const mt_event_sink_t *sink)
{
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    cfg.backend = b;
    cfg.sink = sink;
    char err[256];
    assert_int_equal(mt_alloc_cfg_parse(&cfg, base, err, sizeof err), 0);
    assert_int_equal(mt_alloc_cfg_parse(&cfg, conf, err, sizeof err), 0);
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &cfg), 0);
    return a;
}

static inline mt_alloc_t *make_alloc(mt_backend_t *b, const char *conf, const mt_event_sink_t *sink)
{
    return make_alloc_from(b, "rules:reference", conf, sink);
}

static inline mt_alloc_t *make_alloc_default(mt_backend_t *b, const char *conf,
                                             const mt_event_sink_t *sink)
{
    return make_alloc_from(b, NULL, conf, sink);
}

static inline uint64_t backend_mallocs(mt_backend_t *b)
{
    mt_backend_counters_t c;
    mt_backend_counters(b, &c);
    return c.malloc_calls;
}

static inline mt_alloc_stats_t stats_of(mt_alloc_t *a)
{
    mt_alloc_stats_t s;
    assert_int_equal(mt_alloc_stats(a, &s), 0);
    return s;
}

static inline void *xmalloc_dev(mt_alloc_t *a, size_t n, mt_stream_t *s, int tag)
{
    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(a, n, s, tag, &p), 0);
    assert_non_null(p);
    return p;
}

#endif
