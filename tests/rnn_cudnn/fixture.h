/* Fixture of the cuDNN path tests: a module on the cuda backend over the fake driver of
 * tests/cuda (MEMTRACE_LIBCUDA), with the fake cuDNN of fake_cudnn.c linked in, a log sink
 * that keeps the last warning or error, and helpers for device buffers. Teardown checks
 * that the module's invariants hold and that nothing leaked: no fake cuDNN object, no
 * allocator byte, no fake driver byte. */
#ifndef MT_TESTS_RNN_CUDNN_FIXTURE_H
#define MT_TESTS_RNN_CUDNN_FIXTURE_H

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

#include "backend/backend_cuda.h"
#include "rnn/internal.h"
#include "tests/cuda/fake_ctl.h"
#include "tests/rnn_cudnn/fake_cudnn.h"

#define MiB ((size_t)1 << 20)

typedef struct fx_s {
    mt_backend_t *b;
    mt_alloc_t *a;
    mt_stream_t *s;
    mt_rnn_t *m;
    mt_rnn_cfg_t cfg;
    int errors, warnings;
    char last_log[512];
    char version_log[1024]; /* the info line naming the loaded libcudnn */
    long live0;             /* fake cuDNN objects before the test (a failed test may leave some) */
    size_t used0;           /* fake driver bytes before the test */
} fx_t;

static inline void fx_log(void *ud, mt_log_level_e level, const char *msg)
{
    fx_t *f = ud;
    f->errors += level == MT_LOG_ERROR;
    f->warnings += level == MT_LOG_WARN;
    if (level <= MT_LOG_WARN)
        snprintf(f->last_log, sizeof f->last_log, "%s", msg);
    if (level == MT_LOG_INFO && strstr(msg, "libcudnn"))
        snprintf(f->version_log, sizeof f->version_log, "%s", msg);
}

static inline size_t clock_fn(void)
{
    return fk.ncalls();
}

/* A module on device `device` of a two-device fake, called from a thread whose runtime
 * current device is 0. */
static inline void fx_up_on(fx_t *f, int device)
{
    memset(f, 0, sizeof *f);
    fk.reset(256 * MiB, 2);
    fake_dnn_reset();
    /* The plumbing tests (call order, pointers, sizes, tags) use the fake's markers over the
     * engine's own layout, where cuDNN gets the flat buffers as they are; the numeric tests
     * (test_rnn_cudnn_numeric.c) switch both off: cuDNN's layout, computed numbers. */
    fake_dnn_markers(true);
    fake_dnn_interleaved_layout(true);
    fake_dnn_set_current_device(0);
    f->live0 = fake_dnn_live();
    f->used0 = fk.used();
    fake_dnn_set_clock(clock_fn);
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_CUDA;
    bc.device = device;
    assert_int_equal(mt_backend_create(&f->b, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    /* Plain segments: the fake driver never reuses device addresses (16 GiB in all), and
     * every expandable range reserves twice the device; these tests are about the RNN. */
    assert_int_equal(mt_alloc_cfg_parse(&ac, "rules:reference", NULL, 0), 0);
    ac.backend = f->b;
    assert_int_equal(mt_alloc_create(&f->a, &ac), 0);
    assert_int_equal(mt_stream_create(f->b, &f->s), 0);
    f->cfg = mt_rnn_cfg_default();
    f->cfg.mode = MT_RNN_LSTM;
    f->cfg.input_size = 5;
    f->cfg.hidden_size = 8;
    f->cfg.num_layers = 2;
    f->cfg.bidirectional = true;
    f->cfg.alloc = f->a;
    f->cfg.stream = f->s;
    f->cfg.log = fx_log;
    f->cfg.log_ud = f;
}

static inline void fx_up(fx_t *f)
{
    fx_up_on(f, 0);
}

static inline void fx_down(fx_t *f)
{
    if (f->m)
        assert_int_equal(mt__rnn_check(f->m), 0);
    mt_rnn_destroy(&f->m);
    assert_int_equal(fake_dnn_live(), f->live0); /* every handle and descriptor destroyed */
    assert_int_equal(mt_alloc_check(f->a), 0);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(f->a, &st), 0);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 0); /* nothing leaked */
    mt_stream_destroy(f->b, &f->s);
    mt_alloc_destroy(&f->a);
    mt_backend_destroy(&f->b);
    assert_int_equal(fk.used(), f->used0);
    fake_dnn_set_hook(NULL, NULL);
}

/* A device buffer of n floats, tagged batch, filled with v. */
static inline float *dbuf(fx_t *f, size_t n, float v)
{
    float *host = malloc(n * sizeof *host);
    assert_non_null(host);
    for (size_t i = 0; i < n; i++)
        host[i] = v;
    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(f->a, n * sizeof(float), f->s, MT_TAG_BATCH, &p), 0);
    assert_int_equal(mt_memcpy(f->b, p, host, n * sizeof(float), MT_MEMCPY_HOST_TO_DEVICE), 0);
    free(host);
    return p;
}

static inline void dget(fx_t *f, float *host, const float *dev, size_t n)
{
    assert_int_equal(mt_stream_synchronize(f->b, f->s), 0);
    assert_int_equal(mt_memcpy(f->b, host, dev, n * sizeof(float), MT_MEMCPY_DEVICE_TO_HOST), 0);
}

static inline int gates_of(int mode)
{
    return mode == MT_RNN_LSTM ? 4 : mode == MT_RNN_GRU ? 3 : 1;
}

#endif
