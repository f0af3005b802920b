/* RNN test fixture: a sim backend with no modelled malloc cost, an allocator over it, an
 * event sink that counts kinds and keeps compaction sizes, and a log sink that counts
 * warnings. */
#ifndef MT_TESTS_RNN_FIXTURE_H
#define MT_TESTS_RNN_FIXTURE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/alloc.h"
#include "memtrace/rnn.h"

typedef struct rnn_fx_s {
    mt_backend_t *b;
    mt_alloc_t *a;
    mt_event_sink_t sink;
    uint64_t kinds[32];     /* events seen per kind */
    uint64_t compact_bytes; /* sum of MT_EV_COMPACTION sizes */
    uint64_t last_compact;  /* size of the last one */
    int warnings;
    char last_warning[512];
} rnn_fx_t;

static inline void fx_emit(void *ud, const mt_event_rec_t *ev)
{
    rnn_fx_t *fx = ud;
    if (ev->kind < 32)
        fx->kinds[ev->kind]++;
    if (ev->kind == MT_EV_COMPACTION) {
        fx->compact_bytes += ev->size;
        fx->last_compact = ev->size;
    }
}

static inline void fx_log(void *ud, mt_log_level_e level, const char *msg)
{
    rnn_fx_t *fx = ud;
    if (level == MT_LOG_WARN) {
        fx->warnings++;
        snprintf(fx->last_warning, sizeof fx->last_warning, "%s", msg);
    }
}

static inline rnn_fx_t *fx_new(size_t capacity)
{
    rnn_fx_t *fx = calloc(1, sizeof *fx);
    assert_non_null(fx);
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = capacity;
    bc.sim_malloc_cost_ns = 0;
    bc.sim_free_cost_ns = 0;
    assert_int_equal(mt_backend_create(&fx->b, &bc), 0);
    fx->sink.emit = fx_emit;
    fx->sink.ud = fx;
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = fx->b;
    ac.sink = &fx->sink;
    assert_int_equal(mt_alloc_create(&fx->a, &ac), 0);
    return fx;
}

static inline void fx_free(rnn_fx_t **p)
{
    rnn_fx_t *fx = *p;
    assert_int_equal(mt_alloc_check(fx->a), 0);
    mt_alloc_destroy(&fx->a);
    mt_backend_destroy(&fx->b);
    free(fx);
    *p = NULL;
}

static inline mt_rnn_cfg_t fx_cfg(rnn_fx_t *fx, int mode, int in, int H, int L, bool bi)
{
    mt_rnn_cfg_t c = mt_rnn_cfg_default();
    c.mode = mode;
    c.input_size = in;
    c.hidden_size = H;
    c.num_layers = L;
    c.bidirectional = bi;
    c.alloc = fx->a;
    c.log = fx_log;
    c.log_ud = fx;
    return c;
}

/* A device buffer of n floats from the fixture's allocator, filled from seed (or zeros). */
static inline float *fx_buf(rnn_fx_t *fx, size_t n, int tag, uint64_t seed)
{
    float *p = NULL;
    assert_int_equal(mt_alloc_malloc(fx->a, n * sizeof(float), NULL, tag, (void **)&p), 0);
    uint64_t st = seed;
    for (size_t i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = seed ? (float)((double)(st >> 11) / 9007199254740992.0 * 2.0 - 1.0) : 0.0f;
    }
    return p;
}

static inline void fx_put(rnn_fx_t *fx, void *p)
{
    assert_int_equal(mt_alloc_free(fx->a, p), 0);
}

static inline mt_alloc_stats_t fx_stats(rnn_fx_t *fx)
{
    mt_alloc_stats_t s;
    assert_int_equal(mt_alloc_stats(fx->a, &s), 0);
    return s;
}

static inline uint64_t fx_backend_mallocs(rnn_fx_t *fx)
{
    mt_backend_counters_t c;
    mt_backend_counters(fx->b, &c);
    return c.malloc_calls + c.vm_map_calls;
}

/* What mt_rnn_gemm_info says of a small module on lib, built on fx (a static copy). */
static inline const char *fx_gemm_info(rnn_fx_t *fx, const char *lib)
{
    static char info[512];
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 2, 2, 1, false);
    c.gemm = lib;
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    snprintf(info, sizeof info, "%s", mt_rnn_gemm_info(m));
    mt_rnn_destroy(&m);
    return info;
}

#endif
