/* The module on the caching allocator: public forward/backward against the reference,
 * activation buffers tagged and freed after backward, non-contiguity detection and
 * compaction events (U1), flatten, replicate, inference memory constant in T (U2), and
 * warm-up -> zero backend mallocs over 50 random-length batches (U2). */
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "rnn/internal.h"
#include "tests/rnn/fixture.h"
#include "tests/rnn/ref.h"
#include "tests/common/test_main.h"

#define MIB ((size_t)1 << 20)

static void expect_close(const char *what, size_t i, double want, double got, double tol)
{
    if (fabs(want - got) > tol * (1.0 + fabs(want))) {
        print_error("%s[%zu]: want %.7g, got %.7g\n", what, i, want, got);
        fail();
    }
}

/* Public forward equals the double reference; the reserve is tagged activations with the
 * advertised size, and is gone after backward; marks bracket the calls. */
static void public_forward_backward(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(256 * MIB);
    for (int mode = 0; mode < 4; mode++) {
        int T = 6, B = 3, in = 5, H = 7, L = 2;
        mt_rnn_cfg_t c = fx_cfg(fx, mode, in, H, L, true);
        mt_rnn_t *m;
        assert_int_equal(mt_rnn_create(&m, &c), 0);
        assert_string_equal(mt_rnn_path_name(m), "cpu");
        size_t nw, nx = (size_t)T * B * in, ny = (size_t)T * B * 2 * H, ns = (size_t)L * 2 * B * H;
        float *w = mt_rnn_weights(m, &nw);
        float *x = fx_buf(fx, nx, MT_TAG_BATCH, 11), *y = fx_buf(fx, ny, MT_TAG_ACTIVATIONS, 0);
        float *hx = fx_buf(fx, ns, MT_TAG_ACTIVATIONS, 12),
              *hy = fx_buf(fx, ns, MT_TAG_ACTIVATIONS, 0);
        float *cx = fx_buf(fx, ns, MT_TAG_ACTIVATIONS, 13),
              *cy = fx_buf(fx, ns, MT_TAG_ACTIVATIONS, 0);
        float *dy = fx_buf(fx, ny, MT_TAG_ACTIVATIONS, 14), *dx = fx_buf(fx, nx, MT_TAG_BATCH, 0);

        double *wd = malloc(nw * sizeof(double)), *xd = malloc(nx * sizeof(double));
        double *hxd = malloc(ns * sizeof(double)), *cxd = malloc(ns * sizeof(double));
        double *yd = malloc(ny * sizeof(double)), *hyd = malloc(ns * sizeof(double));
        double *cyd = calloc(ns, sizeof(double));
        for (size_t i = 0; i < nw; i++)
            wd[i] = w[i];
        for (size_t i = 0; i < nx; i++)
            xd[i] = x[i];
        for (size_t i = 0; i < ns; i++) {
            hxd[i] = hx[i];
            cxd[i] = cx[i];
        }
        ref_shape_t rs = {mode, in, H, L, 2, true};
        ref_forward(&rs, wd, T, B, xd, hxd, cxd, yd, hyd, cyd);

        uint64_t marks0 = fx->kinds[MT_EV_MARK];
        mt_rnn_io_t io = {
            .seq_len = T, .batch = B, .x = x, .y = y, .hx = hx, .cx = cx, .hy = hy, .cy = cy};
        mt_rnn_reserve_t *res = NULL;
        assert_int_equal(mt_rnn_forward(m, &io, &res), 0);
        assert_non_null(res);
        for (size_t i = 0; i < ny; i++)
            expect_close("y", i, yd[i], y[i], 1e-5);
        for (size_t i = 0; i < ns; i++)
            expect_close("hy", i, hyd[i], hy[i], 1e-5);
        if (mode == MT_RNN_LSTM)
            for (size_t i = 0; i < ns; i++)
                expect_close("cy", i, cyd[i], cy[i], 1e-5);

        mt_rnn_act_t act;
        assert_int_equal(mt_rnn_activation_bytes(m, T, B, &act), 0);
        mt_alloc_stats_t st = fx_stats(fx);
        /* y, hx, hy, cx, cy, dy are the caller's activations; the rest is the reserve. */
        int64_t caller = (int64_t)((2 * ny + 4 * ns) * sizeof(float));
        assert_int_equal(st.tag_requested_bytes[MT_TAG_ACTIVATIONS].current - caller,
                         (int64_t)act.reserve_bytes);
        assert_int_equal(st.tag_requested_bytes[MT_TAG_WORKSPACE].current, 0);

        mt_rnn_grad_io_t g = {.dy = dy, .dx = dx};
        assert_int_equal(mt_rnn_backward(m, &res, &g), 0);
        assert_null(res);
        st = fx_stats(fx);
        assert_int_equal(st.tag_requested_bytes[MT_TAG_ACTIVATIONS].current, caller);
        assert_true(st.tag_requested_bytes[MT_TAG_WORKSPACE].peak > 0);
        assert_int_equal(fx->kinds[MT_EV_MARK] - marks0, 4);
        float *dw = mt_rnn_grads(m, NULL);
        double norm = 0;
        for (size_t i = 0; i < nw; i++)
            norm += fabs(dw[i]);
        assert_true(norm > 0);
        assert_int_equal(mt_rnn_zero_grads(m), 0);
        for (size_t i = 0; i < nw; i++)
            assert_true(dw[i] == 0.0f);

        /* A reserve can be dropped without backward; bad arguments are refused. */
        assert_int_equal(mt_rnn_forward(m, &io, &res), 0);
        mt_rnn_reserve_release(m, &res);
        assert_null(res);
        assert_int_equal(mt_rnn_backward(m, &res, &g), MT_EINVAL);
        io.seq_len = 0;
        assert_int_equal(mt_rnn_forward(m, &io, &res), MT_EINVAL);
        assert_int_equal(mt_rnn_step(m, B, x, hx, cx, NULL, hy, cy), MT_EINVAL); /* bi */

        float *bufs[] = {x, y, hx, hy, cx, cy, dy, dx};
        for (size_t i = 0; i < 8; i++)
            fx_put(fx, bufs[i]);
        free(wd);
        free(xd);
        free(hxd);
        free(cxd);
        free(yd);
        free(hyd);
        free(cyd);
        mt_rnn_destroy(&m);
    }
    assert_int_equal(fx_stats(fx).allocated_bytes[MT_STAT_ALL].current, 0);
    fx_free(&fx);
}

/* U1: a rebound parameter is detected; each call compacts (one event with the bytes
 * copied), the warning is logged once; results use the rebound values; flatten restores
 * one buffer and stops the copies. */
static void compaction_and_flatten(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(256 * MIB);
    int T = 5, B = 2, in = 4, H = 6;
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, in, H, 2, false);
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    size_t nw;
    mt_rnn_weights(m, &nw);
    size_t wbytes = nw * sizeof(float);
    float *x = fx_buf(fx, (size_t)T * B * in, MT_TAG_BATCH, 5);
    float *y0 = fx_buf(fx, (size_t)T * B * H, MT_TAG_ACTIVATIONS, 0);
    float *y1 = fx_buf(fx, (size_t)T * B * H, MT_TAG_ACTIVATIONS, 0);
    float *dy = fx_buf(fx, (size_t)T * B * H, MT_TAG_ACTIVATIONS, 6);
    mt_rnn_io_t io = {
        .seq_len = T, .batch = B, .x = x, .y = y0, .hx = NULL, .cx = NULL, .hy = NULL, .cy = NULL};
    assert_int_equal(mt_rnn_forward(m, &io, NULL), 0);
    assert_true(mt_rnn_is_flat(m));
    assert_int_equal(fx->kinds[MT_EV_COMPACTION], 0);

    /* Move weight_hh_l1 elsewhere, as a replicated module's parameter would be. */
    mt_rnn_param_t p;
    assert_int_equal(mt_rnn_param_find(m, "weight_hh_l1", &p), 0);
    float *moved = fx_buf(fx, p.numel, MT_TAG_WEIGHTS, 0);
    memcpy(moved, p.data, p.numel * sizeof(float));
    assert_int_equal(mt_rnn_bind_param(m, "weight_hh_l1", moved), 0);
    assert_int_equal(mt_rnn_bind_param(m, "nope", moved), MT_ENOENT);
    assert_false(mt_rnn_is_flat(m));
    assert_int_equal(mt__rnn_check(m), 0);
    assert_int_equal(mt_rnn_param_find(m, "weight_hh_l1", &p), 0);
    assert_ptr_equal(p.data, moved);

    io.y = y1;
    assert_int_equal(mt_rnn_forward(m, &io, NULL), 0);
    assert_memory_equal(y0, y1, (size_t)T * B * H * sizeof(float));
    assert_int_equal(fx->kinds[MT_EV_COMPACTION], 1);
    assert_int_equal(fx->last_compact, wbytes);
    assert_int_equal(fx->warnings, 1);
    assert_non_null(strstr(fx->last_warning, "mt_rnn_flatten"));

    /* Training: one compaction in forward, reused by backward. Inference: one per call. */
    mt_rnn_reserve_t *res;
    assert_int_equal(mt_rnn_forward(m, &io, &res), 0);
    mt_rnn_grad_io_t g = {.dy = dy};
    assert_int_equal(mt_rnn_backward(m, &res, &g), 0);
    assert_int_equal(mt_rnn_forward(m, &io, NULL), 0);
    assert_int_equal(fx->kinds[MT_EV_COMPACTION], 3);
    assert_int_equal(fx->compact_bytes, 3 * wbytes);
    assert_int_equal(fx->warnings, 1);
    mt_rnn_stats_t st;
    assert_int_equal(mt_rnn_stats(m, &st), 0);
    assert_false(st.flat);
    assert_int_equal(st.compactions, 3);
    assert_int_equal(st.compacted_bytes, 3 * wbytes);
    assert_int_equal(st.forwards, 4);
    assert_int_equal(st.backwards, 1);

    /* The engine reads the rebound memory: changing it changes the output. */
    for (size_t i = 0; i < p.numel; i++)
        moved[i] *= 0.5f;
    assert_int_equal(mt_rnn_forward(m, &io, NULL), 0);
    assert_memory_not_equal(y0, y1, (size_t)T * B * H * sizeof(float));
    memcpy(y0, y1, (size_t)T * B * H * sizeof(float));

    /* Flatten copies it home; no compaction afterwards, same results. */
    uint64_t before = fx->kinds[MT_EV_COMPACTION];
    assert_int_equal(mt_rnn_flatten(m), 0);
    assert_true(mt_rnn_is_flat(m));
    assert_int_equal(mt__rnn_check(m), 0);
    assert_int_equal(mt_rnn_param_find(m, "weight_hh_l1", &p), 0);
    assert_ptr_equal(p.data, mt_rnn_weights(m, NULL) + p.offset);
    assert_memory_equal(p.data, moved, p.numel * sizeof(float));
    assert_int_equal(mt_rnn_forward(m, &io, NULL), 0);
    assert_memory_equal(y0, y1, (size_t)T * B * H * sizeof(float));
    assert_int_equal(fx->kinds[MT_EV_COMPACTION], before);

    /* Binding a parameter back to its own place counts as flat too. */
    assert_int_equal(mt_rnn_bind_param(m, "bias_ih_l0", moved), 0);
    assert_false(mt_rnn_is_flat(m));
    assert_int_equal(mt_rnn_param_find(m, "bias_ih_l0", &p), 0);
    assert_int_equal(mt_rnn_bind_param(m, "bias_ih_l0", mt_rnn_weights(m, NULL) + p.offset), 0);
    assert_true(mt_rnn_is_flat(m));
    assert_int_equal(mt__rnn_check(m), 0);

    float *bufs[] = {x, y0, y1, dy, moved};
    for (size_t i = 0; i < 5; i++)
        fx_put(fx, bufs[i]);
    mt_rnn_destroy(&m);
    fx_free(&fx);
}

/* Replicating a non-flat module onto another device gives a flat copy with the current
 * values, which computes the same and never compacts. */
static void replicate_is_flat(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(256 * MIB), *fy = fx_new(256 * MIB);
    int T = 4, B = 2, in = 3, H = 5;
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_GRU, in, H, 2, true);
    mt_rnn_t *m, *r;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    mt_rnn_param_t p;
    assert_int_equal(mt_rnn_param_find(m, "weight_ih_l1_reverse", &p), 0);
    float *moved = fx_buf(fx, p.numel, MT_TAG_WEIGHTS, 77);
    assert_int_equal(mt_rnn_bind_param(m, p.name, moved), 0);

    assert_int_equal(mt_rnn_replicate(m, fy->a, &r), 0);
    assert_true(mt_rnn_is_flat(r));
    mt_rnn_param_t q;
    assert_int_equal(mt_rnn_param_find(r, "weight_ih_l1_reverse", &q), 0);
    assert_memory_equal(q.data, moved, q.numel * sizeof(float));
    int tag;
    assert_int_equal(mt_alloc_block_info(fy->a, mt_rnn_weights(r, NULL), NULL, NULL, &tag), 0);
    assert_int_equal(tag, MT_TAG_WEIGHTS);

    size_t ny = (size_t)T * B * 2 * H;
    float *x = fx_buf(fx, (size_t)T * B * in, MT_TAG_BATCH, 3), *y = fx_buf(fx, ny, 0, 0);
    float *x2 = fx_buf(fy, (size_t)T * B * in, MT_TAG_BATCH, 3), *y2 = fx_buf(fy, ny, 0, 0);
    mt_rnn_io_t io = {
        .seq_len = T, .batch = B, .x = x, .y = y, .hx = NULL, .cx = NULL, .hy = NULL, .cy = NULL};
    mt_rnn_io_t io2 = {
        .seq_len = T, .batch = B, .x = x2, .y = y2, .hx = NULL, .cx = NULL, .hy = NULL, .cy = NULL};
    assert_int_equal(mt_rnn_forward(m, &io, NULL), 0);
    assert_int_equal(mt_rnn_forward(r, &io2, NULL), 0);
    assert_memory_equal(y, y2, ny * sizeof(float));
    assert_int_equal(fx->kinds[MT_EV_COMPACTION], 1);
    assert_int_equal(fy->kinds[MT_EV_COMPACTION], 0);
    mt_rnn_stats_t st;
    assert_int_equal(mt_rnn_stats(r, &st), 0);
    assert_int_equal(st.compactions, 0);

    fx_put(fx, x);
    fx_put(fx, y);
    fx_put(fx, moved);
    fx_put(fy, x2);
    fx_put(fy, y2);
    mt_rnn_destroy(&r);
    mt_rnn_destroy(&m);
    fx_free(&fy);
    fx_free(&fx);
}

/* Peak allocated bytes while generating n steps with mt_rnn_step (ping-pong states). */
static int64_t generate_peak(rnn_fx_t *fx, mt_rnn_t *m, int n, float *out_last)
{
    int B = 2, H = 8, L = 2, in = 3;
    size_t ns = (size_t)L * B * H;
    float *x = fx_buf(fx, (size_t)B * in, MT_TAG_BATCH, 9);
    float *h[2] = {fx_buf(fx, ns, MT_TAG_ACTIVATIONS, 0), fx_buf(fx, ns, MT_TAG_ACTIVATIONS, 0)};
    float *c[2] = {fx_buf(fx, ns, MT_TAG_ACTIVATIONS, 0), fx_buf(fx, ns, MT_TAG_ACTIVATIONS, 0)};
    float *y = fx_buf(fx, (size_t)B * H, MT_TAG_ACTIVATIONS, 0);
    mt_alloc_reset_peak(fx->a);
    uint64_t allocs0 = 0;
    for (int t = 0; t < n; t++) {
        if (t == 1) /* the first step may make the module's step workspace */
            allocs0 = fx->kinds[MT_EV_ALLOC];
        int cur = t & 1;
        assert_int_equal(
            mt_rnn_step(m, B, x, t ? h[cur] : NULL, t ? c[cur] : NULL, y, h[!cur], c[!cur]), 0);
        /* Feed the output back, as sampling does. */
        for (int i = 0; i < B * in; i++)
            x[i] = y[i % (B * H)];
    }
    int64_t peak = fx_stats(fx).allocated_bytes[MT_STAT_ALL].peak;
    /* No allocator call per generated step: the step workspace stays with the module. */
    assert_int_equal(fx->kinds[MT_EV_ALLOC], allocs0);
    assert_int_equal(mt__rnn_check(m), 0);
    memcpy(out_last, y, (size_t)B * H * sizeof(float));
    fx_put(fx, x);
    fx_put(fx, h[0]);
    fx_put(fx, h[1]);
    fx_put(fx, c[0]);
    fx_put(fx, c[1]);
    fx_put(fx, y);
    return peak;
}

/* U2: inference memory is constant in the sequence length: 100 000 steps peak exactly as
 * high as 100; the chunked whole-sequence inference forward's extra memory does not grow
 * with T either. */
static void inference_memory_constant(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(256 * MIB);
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 3, 8, 2, false);
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    float last[16];
    int64_t p100 = generate_peak(fx, m, 100, last);
    int64_t p100k = generate_peak(fx, m, 100000, last);
    assert_true(p100 > 0);
    assert_int_equal(p100, p100k);
    for (int i = 0; i < 16; i++)
        assert_true(isfinite(last[i]));
    int64_t held = fx_stats(fx).allocated_bytes[MT_STAT_ALL].current;
    assert_int_equal(mt_rnn_step_release(m), 0);
    assert_true(fx_stats(fx).allocated_bytes[MT_STAT_ALL].current < held);
    assert_int_equal(mt__rnn_check(m), 0);

    /* Whole-sequence inference: peak minus the caller's x and y is the same at any T. */
    int64_t extra[2];
    int Ts[2] = {1000, 20000};
    for (int k = 0; k < 2; k++) {
        int T = Ts[k], B = 2;
        float *x = fx_buf(fx, (size_t)T * B * 3, MT_TAG_BATCH, 4);
        float *y = fx_buf(fx, (size_t)T * B * 8, MT_TAG_ACTIVATIONS, 0);
        mt_alloc_reset_peak(fx->a);
        int64_t base = fx_stats(fx).allocated_bytes[MT_STAT_ALL].current;
        mt_rnn_io_t io = {.seq_len = T,
                          .batch = B,
                          .x = x,
                          .y = y,
                          .hx = NULL,
                          .cx = NULL,
                          .hy = NULL,
                          .cy = NULL};
        assert_int_equal(mt_rnn_forward(m, &io, NULL), 0);
        extra[k] = fx_stats(fx).allocated_bytes[MT_STAT_ALL].peak - base;
        fx_put(fx, x);
        fx_put(fx, y);
    }
    assert_true(extra[0] > 0);
    assert_int_equal(extra[0], extra[1]);
    mt_rnn_destroy(&m);
    fx_free(&fx);
}

/* One training step at (T, B) with caller buffers, as a program would run it: the
 * gradient buffers dy and dx after the forward, or before it with the others (early), as
 * the warm-up holds them. */
static void train_step(rnn_fx_t *fx, mt_rnn_t *m, int T, int B, int in, int H, int L, bool early)
{
    size_t nx = (size_t)T * B * in, ny = (size_t)T * B * H, ns = (size_t)L * B * H;
    float *dy = NULL, *dx = NULL;
    if (early) {
        dy = fx_buf(fx, ny, MT_TAG_ACTIVATIONS, 2);
        dx = fx_buf(fx, nx, MT_TAG_BATCH, 0);
    }
    float *x = fx_buf(fx, nx, MT_TAG_BATCH, (uint64_t)T * 31 + (uint64_t)B);
    float *y = fx_buf(fx, ny, MT_TAG_ACTIVATIONS, 0);
    float *hx = fx_buf(fx, ns, MT_TAG_ACTIVATIONS, 1);
    float *hy = fx_buf(fx, ns, MT_TAG_ACTIVATIONS, 0);
    float *cy = fx_buf(fx, ns, MT_TAG_ACTIVATIONS, 0);
    mt_rnn_io_t io = {
        .seq_len = T, .batch = B, .x = x, .y = y, .hx = hx, .cx = NULL, .hy = hy, .cy = cy};
    mt_rnn_reserve_t *res;
    assert_int_equal(mt_rnn_forward(m, &io, &res), 0);
    if (!early) {
        dy = fx_buf(fx, ny, MT_TAG_ACTIVATIONS, 2);
        dx = fx_buf(fx, nx, MT_TAG_BATCH, 0);
    }
    mt_rnn_grad_io_t g = {.dy = dy, .dx = dx};
    assert_int_equal(mt_rnn_backward(m, &res, &g), 0);
    float *bufs[] = {dx, dy, cy, hy, hx, y, x};
    for (size_t i = 0; i < 7; i++)
        fx_put(fx, bufs[i]);
}

/* MT_TEST_BATCHES: fewer batches and a smaller hidden size under an emulator
 * (tests/cross/avx2_qemu.sh), where every FMA is a call into soft float (95 % of its time
 * by perf) and the point is the CPU's code paths, not the count; 0 = natively. */
static int emulated_batches(void)
{
    const char *nb = getenv("MT_TEST_BATCHES");
    return nb != NULL && atoi(nb) >= 2 ? atoi(nb) : 0;
}

/* Backend mallocs made by 50 random-length batches, with or without the warm-up, the
 * gradient buffers allocated after the forward or before it (early). */
static uint64_t random_batches(bool warm, bool early, uint64_t *reserved_peak)
{
    rnn_fx_t *fx = fx_new(512 * MIB);
    int nb = emulated_batches();
    bool emulated = nb > 0;
    int in = 64, H = emulated ? 64 : 128, L = 2, maxT = 50, maxB = 16;
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, in, H, L, false);
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    float *dw = mt_rnn_grads(m, NULL);
    if (warm) {
        assert_int_equal(mt_rnn_warmup(m, maxT, maxB), 0);
        size_t nw;
        mt_rnn_weights(m, &nw);
        for (size_t i = 0; i < nw; i++)
            assert_true(dw[i] == 0.0f); /* zero inputs: gradients untouched */
        assert_int_equal(fx->kinds[MT_EV_MARK] >= 2, 1);
    }
    uint64_t before = fx_backend_mallocs(fx);
    uint64_t st = 12345;
    int n = emulated ? nb : 50;
    for (int it = 0; it < n; it++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        int T = 1 + (int)((st >> 33) % (uint64_t)maxT);
        int B = 1 + (int)((st >> 20) % (uint64_t)maxB);
        if (it == n / 2) { /* the largest shape once, in the middle */
            T = maxT;
            B = maxB;
        }
        train_step(fx, m, T, B, in, H, L, early);
        assert_int_equal(mt_alloc_check(fx->a), 0);
        assert_int_equal(mt__rnn_check(m), 0);
    }
    uint64_t made = fx_backend_mallocs(fx) - before;
    *reserved_peak = (uint64_t)fx_stats(fx).reserved_bytes[MT_STAT_ALL].peak;
    mt_rnn_destroy(&m);
    fx_free(&fx);
    return made;
}

static void warmup_zero_backend_mallocs(void **state)
{
    (void)state;
    uint64_t rp_warm, rp_cold;
    uint64_t warm = random_batches(true, false, &rp_warm);
    /* The order's run tests the allocator's logic, not the CPU's: native runs only. */
    uint64_t early = emulated_batches() ? 0 : random_batches(true, true, &rp_warm);
    uint64_t cold = random_batches(false, false, &rp_cold);
    print_message("backend mallocs over the batches: %llu with warm-up (%llu with the gradient "
                  "buffers before the forward%s), %llu without\n",
                  (unsigned long long)warm, (unsigned long long)early,
                  emulated_batches() ? ": not run" : "", (unsigned long long)cold);
    assert_int_equal(warm, 0);
    assert_int_equal(early, 0);
    assert_true(cold > 0);
}

/* Backend mallocs of training steps at the shapes shapes[0..n) (T, B pairs), gradient
 * buffers early or not, after a warm-up at (maxT, maxB) or none (maxT = 0), with H = 128:
 * small shapes, where the step's first request differs from the warm-up's and the
 * workspaces take most of the reservation. */
static uint64_t small_steps(int maxT, int maxB, const int (*shapes)[2], size_t n, bool early)
{
    rnn_fx_t *fx = fx_new(256 * MIB);
    int in = 64, H = 128, L = 2;
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, in, H, L, false);
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    if (maxT > 0)
        assert_int_equal(mt_rnn_warmup(m, maxT, maxB), 0);
    uint64_t before = fx_backend_mallocs(fx);
    for (size_t i = 0; i < n; i++) {
        uint64_t was = fx_backend_mallocs(fx);
        train_step(fx, m, shapes[i][0], shapes[i][1], in, H, L, early);
        if (maxT > 0 && fx_backend_mallocs(fx) != was)
            print_message("step %zu at T=%d, B=%d after a warm-up at T=%d, B=%d: %llu backend "
                          "mallocs\n",
                          i, shapes[i][0], shapes[i][1], maxT, maxB,
                          (unsigned long long)(fx_backend_mallocs(fx) - was));
        assert_int_equal(mt_alloc_check(fx->a), 0);
    }
    uint64_t made = fx_backend_mallocs(fx) - before;
    mt_rnn_destroy(&m);
    fx_free(&fx);
    return made;
}

/* After a warm-up at (12, 8), steps at (5, 1) then (8, 6) (the second's backward
 * workspace once went to the device: the first step had left the plan's pass open), then
 * every shape within the bounds, make no backend malloc, whether the caller allocates its
 * gradient buffers after the forward or before it; without the warm-up the first steps make
 * some. */
static void warmup_small_shapes(void **state)
{
    (void)state;
    const int first[][2] = {{5, 1}, {8, 6}};
    int all[12 * 8 + 2][2] = {{5, 1}, {8, 6}};
    size_t n = 2;
    for (int T = 12; T >= 1; T--)
        for (int B = 1; B <= 8; B++) {
            all[n][0] = T;
            all[n++][1] = B;
        }
    for (int early = 0; early < 2; early++) {
        assert_true(small_steps(0, 0, first, 2, early) > 0);
        assert_int_equal(small_steps(12, 8, first, 2, early), 0);
        if (!emulated_batches()) /* 200 steps: too slow in soft float */
            assert_int_equal(small_steps(12, 8, (const int(*)[2])all, n, early), 0);
    }
}

/* Device memory exhaustion: create, forward and warm-up fail with MT_ENOMEM, leave nothing
 * allocated behind, and the module still works at a size that fits. */
static void out_of_memory_is_clean(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(32 * MIB);
    mt_rnn_t *m = NULL;
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 8, 2048, 2, true); /* ~200 MiB of weights */
    assert_int_equal(mt_rnn_create(&m, &c), MT_ENOMEM);
    assert_null(m);
    assert_int_equal(fx_stats(fx).allocated_bytes[MT_STAT_ALL].current, 0);

    c = fx_cfg(fx, MT_RNN_LSTM, 8, 64, 1, false);
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    int64_t base = fx_stats(fx).allocated_bytes[MT_STAT_ALL].current;
    int T = 2000, B = 16; /* reserve: T*B*5H floats = 40 MiB > capacity */
    float *x = fx_buf(fx, (size_t)T * B * 8, MT_TAG_BATCH, 1);
    float *y = fx_buf(fx, (size_t)T * B * 64, MT_TAG_ACTIVATIONS, 0);
    mt_rnn_io_t io = {
        .seq_len = T, .batch = B, .x = x, .y = y, .hx = NULL, .cx = NULL, .hy = NULL, .cy = NULL};
    mt_rnn_reserve_t *res = (mt_rnn_reserve_t *)&io;
    assert_int_equal(mt_rnn_forward(m, &io, &res), MT_ENOMEM);
    assert_null(res);
    /* Inference at the same length fits: its memory does not grow with T. */
    assert_int_equal(mt_rnn_forward(m, &io, NULL), 0);
    io.seq_len = 100;
    assert_int_equal(mt_rnn_forward(m, &io, &res), 0);
    mt_rnn_reserve_release(m, &res);
    fx_put(fx, x);
    fx_put(fx, y);
    assert_int_equal(fx_stats(fx).allocated_bytes[MT_STAT_ALL].current, base);

    assert_int_equal(mt_rnn_warmup(m, 4000, 64), MT_ENOMEM);
    assert_int_equal(mt_alloc_warmup_end(fx->a, NULL), MT_EINVAL); /* warm-up was closed */
    assert_int_equal(fx_stats(fx).allocated_bytes[MT_STAT_ALL].current, base);
    assert_int_equal(mt_rnn_warmup(m, 50, 4), 0);
    mt_rnn_destroy(&m);
    fx_free(&fx);
}

typedef struct late_fill_s {
    float *x;
    size_t n;
} late_fill_t;

/* Queued on the module's stream: writes the input only after a while, as a slow copy. */
static void late_fill(void *ud)
{
    late_fill_t *f = ud;
    struct timespec ts = {0, 30 * 1000 * 1000};
    nanosleep(&ts, NULL);
    for (size_t i = 0; i < f->n; i++)
        f->x[i] = (float)((i % 7) * 0.25 - 0.75);
}

/* The CPU path computes on the calling thread, but only after the work already queued on
 * the module's stream: a forward issued right after an asynchronous write into x sees it. */
static void cpu_path_orders_after_stream(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64 * MIB);
    mt_stream_t *s;
    assert_int_equal(mt_stream_create(fx->b, &s), 0);
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_GRU, 4, 8, 1, false);
    c.stream = s;
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    int T = 3, B = 2;
    size_t nx = (size_t)T * B * 4, ny = (size_t)T * B * 8;
    float *x = fx_buf(fx, nx, MT_TAG_BATCH, 0), *y1 = fx_buf(fx, ny, 0, 0);
    float *y2 = fx_buf(fx, ny, 0, 0);
    late_fill_t f = {x, nx};
    assert_int_equal(mt_stream_launch_host_func(fx->b, s, late_fill, &f), 0);
    mt_rnn_io_t io = {
        .seq_len = T, .batch = B, .x = x, .y = y1, .hx = NULL, .cx = NULL, .hy = NULL, .cy = NULL};
    assert_int_equal(mt_rnn_forward(m, &io, NULL), 0);
    assert_int_equal(mt_stream_synchronize(fx->b, s), 0);
    io.y = y2; /* x is final now */
    assert_int_equal(mt_rnn_forward(m, &io, NULL), 0);
    assert_memory_equal(y1, y2, ny * sizeof(float));
    fx_put(fx, x);
    fx_put(fx, y1);
    fx_put(fx, y2);
    mt_rnn_destroy(&m);
    mt_stream_destroy(fx->b, &s);
    fx_free(&fx);
}

/* With no library named, the module takes the default for its thread count (docs/blas.md:
 * oneDNN at one thread; at two the linked CBLAS where it is OpenBLAS, else BLIS, where they
 * load; the linked CBLAS under ASan), and
 * follows mt_rnn_set_gemm_threads; a library named in the configuration stays. */
#if !defined(__SANITIZE_ADDRESS__)
static const char *loads(rnn_fx_t *fx, const char *lib)
{
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 3, 4, 1, false);
    c.gemm = lib;
    mt_rnn_t *m;
    if (mt_rnn_create(&m, &c) != 0)
        return NULL;
    mt_rnn_destroy(&m);
    return lib;
}
#endif

static void default_library_follows_threads(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64 * MIB);
    unsetenv("MEMTRACE_RNN_GEMM");
#if defined(__SANITIZE_ADDRESS__)
    const char *one = "cblas", *two = "cblas";
#else
    const mt__rnn_gemm_t *cb;
    assert_int_equal(mt__rnn_gemm_get("cblas", &cb), 0);
    const char *one = loads(fx, "dnnl") ? "dnnl" : loads(fx, "blis") ? "blis" : "cblas";
    const char *two = mt__rnn_gemm_halves(cb) ? "cblas" : loads(fx, "blis") ? "blis" : one;
#endif
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 3, 4, 1, false);
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    assert_string_equal(mt_rnn_gemm_name(m), one);
    assert_int_equal(mt_rnn_set_gemm_threads(m, 2), 0);
    assert_string_equal(mt_rnn_gemm_name(m), two);
    assert_int_equal(mt_rnn_set_gemm_threads(m, 1), 0);
    assert_string_equal(mt_rnn_gemm_name(m), one);
    mt_rnn_destroy(&m);

    c.gemm = "cblas";
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    assert_int_equal(mt_rnn_set_gemm_threads(m, 2), 0);
    assert_string_equal(mt_rnn_gemm_name(m), "cblas");
    mt_rnn_destroy(&m);
    fx_free(&fx);
}

int main(void)
{
    /* clang-format off */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(public_forward_backward),
        cmocka_unit_test(compaction_and_flatten),
        cmocka_unit_test(replicate_is_flat),
        cmocka_unit_test(inference_memory_constant),
        cmocka_unit_test(warmup_zero_backend_mallocs),
        cmocka_unit_test(warmup_small_shapes),
        cmocka_unit_test(out_of_memory_is_clean),
        cmocka_unit_test(cpu_path_orders_after_stream),
        cmocka_unit_test(default_library_follows_threads),
    };
    /* clang-format on */
    return MT_TEST_RUN(tests, NULL, NULL);
}
