/* Dropout between layers through the public API on the cpu path: invalid probabilities
 * refused, p = 0 bit-identical to a module without dropout, inference unaffected, the
 * masks' statistics and exact scaling, the module's training forward equal to the
 * reference with the masks mt_rnn_dropout_mask reports, masks that change per pass and
 * come back with the dropout state (gradients too), warm-up leaving the state alone,
 * activation accounting, and activation offload bit-identical with dropout. Gradients
 * against finite differences: test_rnn_grad.c. */
#include <math.h>

#include "memtrace/host.h"
#include "tests/rnn/fixture.h"
#include "tests/rnn/ref.h"
#include "tests/common/test_main.h"

static int errors_seen;
static char last_error[512];

static void err_log(void *ud, mt_log_level_e level, const char *msg)
{
    fx_log(ud, level, msg);
    if (level == MT_LOG_ERROR) {
        errors_seen++;
        snprintf(last_error, sizeof last_error, "%s", msg);
    }
}

/* One pass's buffers on the fixture's allocator. */
typedef struct pass_s {
    int T, B, in, dh, nst;
    float *x, *y, *hx, *hy, *cy, *dy, *dx;
} pass_t;

static pass_t pass_new(rnn_fx_t *fx, const mt_rnn_cfg_t *c, int T, int B)
{
    pass_t p = {.T = T, .B = B, .in = c->input_size};
    int D = c->bidirectional ? 2 : 1;
    p.dh = D * c->hidden_size;
    p.nst = c->num_layers * D * B * c->hidden_size;
    p.x = fx_buf(fx, (size_t)T * B * p.in, MT_TAG_BATCH, 11);
    p.hx = fx_buf(fx, (size_t)p.nst, MT_TAG_ACTIVATIONS, 12);
    p.dy = fx_buf(fx, (size_t)T * B * p.dh, MT_TAG_ACTIVATIONS, 13);
    p.y = fx_buf(fx, (size_t)T * B * p.dh, MT_TAG_ACTIVATIONS, 0);
    p.hy = fx_buf(fx, (size_t)p.nst, MT_TAG_ACTIVATIONS, 0);
    p.cy = fx_buf(fx, (size_t)p.nst, MT_TAG_ACTIVATIONS, 0);
    p.dx = fx_buf(fx, (size_t)T * B * p.in, MT_TAG_ACTIVATIONS, 0);
    return p;
}

static void pass_free(rnn_fx_t *fx, pass_t *p)
{
    float *b[] = {p->x, p->y, p->hx, p->hy, p->cy, p->dy, p->dx};
    for (int i = 0; i < 7; i++)
        fx_put(fx, b[i]);
}

static size_t ny(const pass_t *p)
{
    return (size_t)p->T * p->B * p->dh;
}

/* Forward (training when train), then backward when train; grads zeroed first. */
static void run(mt_rnn_t *m, pass_t *p, bool train)
{
    mt_rnn_io_t io = {.seq_len = p->T,
                      .batch = p->B,
                      .x = p->x,
                      .y = p->y,
                      .hx = p->hx,
                      .hy = p->hy,
                      .cy = mt_rnn_cfg(m)->mode == MT_RNN_LSTM ? p->cy : NULL};
    if (!train) {
        assert_int_equal(mt_rnn_forward(m, &io, NULL), 0);
        return;
    }
    assert_int_equal(mt_rnn_zero_grads(m), 0);
    mt_rnn_reserve_t *res = NULL;
    assert_int_equal(mt_rnn_forward(m, &io, &res), 0);
    mt_rnn_grad_io_t g = {.dy = p->dy, .dx = p->dx};
    assert_int_equal(mt_rnn_backward(m, &res, &g), 0);
}

/* Copies of what a pass produced, to compare bit for bit. */
typedef struct out_s {
    float *y, *hy, *dx, *dw;
    size_t ny, nst, nx, nw;
} out_t;

static out_t keep(const mt_rnn_t *m, const pass_t *p)
{
    out_t o = {.ny = ny(p), .nst = (size_t)p->nst, .nx = (size_t)p->T * p->B * p->in};
    float *dw = mt_rnn_grads(m, &o.nw);
    o.y = malloc(o.ny * 4);
    o.hy = malloc(o.nst * 4);
    o.dx = malloc(o.nx * 4);
    o.dw = malloc(o.nw * 4);
    memcpy(o.y, p->y, o.ny * 4);
    memcpy(o.hy, p->hy, o.nst * 4);
    memcpy(o.dx, p->dx, o.nx * 4);
    memcpy(o.dw, dw, o.nw * 4);
    return o;
}

static bool same(const out_t *a, const out_t *b)
{
    return memcmp(a->y, b->y, a->ny * 4) == 0 && memcmp(a->hy, b->hy, a->nst * 4) == 0 &&
           memcmp(a->dx, b->dx, a->nx * 4) == 0 && memcmp(a->dw, b->dw, a->nw * 4) == 0;
}

static void drop_out(out_t *o)
{
    free(o->y);
    free(o->hy);
    free(o->dx);
    free(o->dw);
}

static void invalid_p_refused(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    const float bad[] = {-0.1f, 1.0f, 1.5f, NAN, INFINITY};
    for (int i = 0; i < 5; i++) {
        mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 3, 4, 2, false);
        c.log = err_log;
        c.dropout = bad[i];
        errors_seen = 0;
        mt_rnn_t *m = NULL;
        assert_int_equal(mt_rnn_create(&m, &c), MT_EINVAL);
        assert_null(m);
        assert_int_equal(errors_seen, 1);
        assert_non_null(strstr(last_error, "dropout"));
    }
    /* Bounds that are valid: 0 and just below 1; one layer warns (it would do nothing). */
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_GRU, 3, 4, 2, true);
    c.dropout = 0.999f;
    mt_rnn_t *m = NULL;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    mt_rnn_destroy(&m);
    c.num_layers = 1;
    c.dropout = 0.5f;
    fx->warnings = 0;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    assert_int_equal(fx->warnings, 1);
    assert_non_null(strstr(fx->last_warning, "no effect with 1 layer"));
    mt_rnn_destroy(&m);
    fx_free(&fx);
}

/* p = 0 (set explicitly, with a seed) computes exactly what a module that never heard of
 * dropout does, in training; so does p > 0 with one layer. */
static void p_zero_bit_identical(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    for (int mode = 0; mode < 4; mode++) {
        for (int L = 1; L <= 2; L++) {
            mt_rnn_cfg_t c = fx_cfg(fx, mode, 3, 5, L, mode % 2 == 1);
            pass_t p = pass_new(fx, &c, 9, 3);
            mt_rnn_t *plain = NULL, *zero = NULL;
            assert_int_equal(mt_rnn_create(&plain, &c), 0);
            mt_rnn_cfg_t cz = c;
            cz.dropout = L == 1 ? 0.5f : 0.0f;
            cz.dropout_seed = 987654321;
            assert_int_equal(mt_rnn_create(&zero, &cz), 0);
            run(plain, &p, true);
            out_t a = keep(plain, &p);
            run(zero, &p, true);
            out_t b = keep(zero, &p);
            assert_true(same(&a, &b));
            drop_out(&a);
            drop_out(&b);
            mt_rnn_destroy(&plain);
            mt_rnn_destroy(&zero);
            pass_free(fx, &p);
        }
    }
    fx_free(&fx);
}

/* Inference applies no dropout: same output as p = 0; a training forward does differ. */
static void inference_unaffected(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    for (int bi = 0; bi < 2; bi++) {
        mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 3, 6, 3, bi);
        pass_t p = pass_new(fx, &c, 70, 2); /* > one chunk: chunked inference */
        mt_rnn_t *plain = NULL, *drop = NULL;
        assert_int_equal(mt_rnn_create(&plain, &c), 0);
        c.dropout = 0.5f;
        assert_int_equal(mt_rnn_create(&drop, &c), 0);
        run(plain, &p, false);
        float *y0 = malloc(ny(&p) * 4);
        memcpy(y0, p.y, ny(&p) * 4);
        run(drop, &p, false);
        assert_memory_equal(y0, p.y, ny(&p) * 4);
        /* mt_rnn_step (inference, one step) too */
        float *hy = fx_buf(fx, (size_t)p.nst, MT_TAG_ACTIVATIONS, 0);
        float *cy = fx_buf(fx, (size_t)p.nst, MT_TAG_ACTIVATIONS, 0);
        float *s0 = malloc((size_t)p.nst * 4);
        if (!bi) {
            assert_int_equal(mt_rnn_step(plain, 2, p.x, p.hx, NULL, NULL, hy, cy), 0);
            memcpy(s0, hy, (size_t)p.nst * 4);
            assert_int_equal(mt_rnn_step(drop, 2, p.x, p.hx, NULL, NULL, hy, cy), 0);
            assert_memory_equal(s0, hy, (size_t)p.nst * 4);
        }
        run(drop, &p, true);
        assert_memory_not_equal(y0, p.y, ny(&p) * 4);
        free(s0);
        fx_put(fx, hy);
        fx_put(fx, cy);
        free(y0);
        mt_rnn_destroy(&plain);
        mt_rnn_destroy(&drop);
        pass_free(fx, &p);
    }
    fx_free(&fx);
}

/* Over 64 x 16 x 2*64 elements: the dropped fraction is within 0.01 of p (about 7 standard
 * deviations; the seed is fixed, so the check is deterministic), kept factors are exactly
 * 1 / (1 - p), layers and passes get different masks. */
static void mask_statistics(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    const float ps[] = {0.1f, 0.3f, 0.5f, 0.9f};
    const int T = 64, B = 16;
    for (int i = 0; i < 4; i++) {
        mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 3, 64, 3, true);
        c.dropout = ps[i];
        c.dropout_seed = 42;
        mt_rnn_t *m = NULL;
        assert_int_equal(mt_rnn_create(&m, &c), 0);
        size_t n = (size_t)T * B * 128;
        float *m0 = malloc(n * 4), *m1 = malloc(n * 4), *m2 = malloc(n * 4);
        assert_int_equal(mt_rnn_dropout_mask(m, 42, 0, 0, T, B, m0), 0);
        assert_int_equal(mt_rnn_dropout_mask(m, 42, 0, 1, T, B, m1), 0);
        assert_int_equal(mt_rnn_dropout_mask(m, 42, 1, 0, T, B, m2), 0);
        float scale = 1.0f / (1.0f - ps[i]);
        size_t dropped = 0, differ_l = 0, differ_c = 0;
        for (size_t k = 0; k < n; k++) {
            assert_true(m0[k] == 0.0f || m0[k] == scale);
            dropped += m0[k] == 0.0f;
            differ_l += m0[k] != m1[k];
            differ_c += m0[k] != m2[k];
        }
        double frac = (double)dropped / (double)n;
        if (fabs(frac - ps[i]) > 0.01) {
            print_error("p %g: dropped fraction %g\n", (double)ps[i], frac);
            fail();
        }
        /* Independent masks disagree on a fraction 2 p (1 - p) of the elements. */
        double want = 2.0 * ps[i] * (1.0 - ps[i]);
        assert_true(fabs((double)differ_l / (double)n - want) < 0.02);
        assert_true(fabs((double)differ_c / (double)n - want) < 0.02);
        assert_int_equal(mt_rnn_dropout_mask(m, 42, 0, 2, T, B, m0), MT_EINVAL); /* top */
        assert_int_equal(mt_rnn_dropout_mask(m, 42, 0, -1, T, B, m0), MT_EINVAL);
        free(m0);
        free(m1);
        free(m2);
        mt_rnn_destroy(&m);
    }
    fx_free(&fx);
}

/* The module's training forward is the double reference with the masks that
 * mt_rnn_dropout_mask gives for the state the forward started from. */
static void forward_matches_reported_masks(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    const int modes[] = {MT_RNN_GRU, MT_RNN_TANH, MT_RNN_LSTM};
    for (int i = 0; i < 3; i++) {
        int T = 6, B = 3, H = 4, L = 3;
        bool bi = i != 1;
        mt_rnn_cfg_t c = fx_cfg(fx, modes[i], 3, H, L, bi);
        c.dropout = 0.3f;
        c.dropout_seed = 7 + (uint64_t)i;
        mt_rnn_t *m = NULL;
        assert_int_equal(mt_rnn_create(&m, &c), 0);
        pass_t p = pass_new(fx, &c, T, B);
        run(m, &p, true); /* the second pass is checked: counter 1 */
        uint64_t seed, ctr;
        assert_int_equal(mt_rnn_dropout_state(m, &seed, &ctr), 0);
        assert_true(seed == c.dropout_seed && ctr == 1);
        run(m, &p, true);
        size_t n = ny(&p), nw;
        double *mask[2];
        float *f = malloc(n * 4);
        for (int l = 0; l < L - 1; l++) {
            assert_int_equal(mt_rnn_dropout_mask(m, seed, ctr, l, T, B, f), 0);
            mask[l] = malloc(n * sizeof(double));
            for (size_t k = 0; k < n; k++)
                mask[l][k] = f[k];
        }
        ref_shape_t rs = {modes[i], 3, H, L, bi ? 2 : 1, true};
        float *w = mt_rnn_weights(m, &nw);
        double *dw = malloc(nw * sizeof(double)), *xd = malloc((size_t)T * B * 3 * 8);
        double *dh = malloc((size_t)p.nst * 8), *ry = malloc(n * 8), *rh = malloc(p.nst * 8);
        double *rc = malloc(p.nst * 8);
        for (size_t k = 0; k < nw; k++)
            dw[k] = w[k];
        for (size_t k = 0; k < (size_t)T * B * 3; k++)
            xd[k] = p.x[k];
        for (int k = 0; k < p.nst; k++)
            dh[k] = p.hx[k];
        ref_forward_masked(&rs, dw, T, B, xd, dh, NULL, ry, rh, rc, (const double *const *)mask);
        for (size_t k = 0; k < n; k++)
            if (fabs(ry[k] - p.y[k]) > 1e-5) {
                print_error("mode %d y[%zu]: want %g, got %g\n", modes[i], k, ry[k],
                            (double)p.y[k]);
                fail();
            }
        free(dw);
        free(xd);
        free(dh);
        free(ry);
        free(rh);
        free(rc);
        free(f);
        for (int l = 0; l < L - 1; l++)
            free(mask[l]);
        pass_free(fx, &p);
        mt_rnn_destroy(&m);
    }
    fx_free(&fx);
}

/* Two training passes draw different masks; setting the state back redoes both, outputs
 * and gradients bit for bit; a warm-up in between does not move the state. */
static void state_reproduces_masks(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    for (int bi = 0; bi < 2; bi++) {
        mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 3, 8, 2, bi);
        c.dropout = 0.25f;
        mt_rnn_t *m = NULL;
        assert_int_equal(mt_rnn_create(&m, &c), 0);
        pass_t p = pass_new(fx, &c, 12, 4);
        assert_int_equal(mt_rnn_set_dropout_state(m, 1234, 10), 0);
        run(m, &p, true);
        out_t a1 = keep(m, &p);
        run(m, &p, true);
        out_t a2 = keep(m, &p);
        assert_false(same(&a1, &a2));
        assert_memory_not_equal(a1.y, a2.y, a1.ny * 4);
        uint64_t seed, ctr;
        assert_int_equal(mt_rnn_dropout_state(m, &seed, &ctr), 0);
        assert_true(seed == 1234 && ctr == 12);
        assert_int_equal(mt_rnn_warmup(m, 16, 4), 0);
        assert_int_equal(mt_rnn_dropout_state(m, &seed, &ctr), 0);
        assert_true(ctr == 12);
        run(m, &p, false); /* inference does not count either */
        assert_int_equal(mt_rnn_set_dropout_state(m, 1234, 10), 0);
        run(m, &p, true);
        out_t b1 = keep(m, &p);
        run(m, &p, true);
        out_t b2 = keep(m, &p);
        assert_true(same(&a1, &b1));
        assert_true(same(&a2, &b2));
        /* Another seed, other masks. */
        assert_int_equal(mt_rnn_set_dropout_state(m, 1235, 10), 0);
        run(m, &p, true);
        out_t c1 = keep(m, &p);
        assert_memory_not_equal(a1.y, c1.y, a1.ny * 4);
        out_t *all[] = {&a1, &a2, &b1, &b2, &c1};
        for (int i = 0; i < 5; i++)
            drop_out(all[i]);
        pass_free(fx, &p);
        mt_rnn_destroy(&m);
    }
    fx_free(&fx);
}

/* Masks are not kept: the reserve, the engine's figures and the activations the allocator
 * sees during a pass are those of p = 0; the op-by-op estimate grows by 1.25 (L-1)/L. */
static void activation_accounting(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 3, 16, 3, false);
    pass_t p = pass_new(fx, &c, 20, 4);
    mt_rnn_t *m0 = NULL, *m1 = NULL;
    assert_int_equal(mt_rnn_create(&m0, &c), 0);
    c.dropout = 0.3f;
    assert_int_equal(mt_rnn_create(&m1, &c), 0);
    mt_rnn_act_t a0, a1;
    assert_int_equal(mt_rnn_activation_bytes(m0, 20, 4, &a0), 0);
    assert_int_equal(mt_rnn_activation_bytes(m1, 20, 4, &a1), 0);
    assert_int_equal(a0.reserve_bytes, a1.reserve_bytes);
    assert_int_equal(a0.engine_bytes_per_step, a1.engine_bytes_per_step);
    assert_true(a1.engine_hvec == 6.0 && a0.opbyop_hvec == 21.0);
    assert_true(fabs(a1.opbyop_hvec - (21.0 + 1.25 * 2.0 / 3.0)) < 1e-12);
    mt_rnn_t *ms[] = {m0, m1};
    for (int i = 0; i < 2; i++) {
        mt_alloc_stats_t before = fx_stats(fx);
        mt_rnn_io_t io = {.seq_len = 20, .batch = 4, .x = p.x, .y = p.y};
        mt_rnn_reserve_t *res = NULL;
        assert_int_equal(mt_rnn_forward(ms[i], &io, &res), 0);
        mt_alloc_stats_t during = fx_stats(fx);
        int64_t kept = (int64_t)during.tag_requested_bytes[MT_TAG_ACTIVATIONS].current -
                       (int64_t)before.tag_requested_bytes[MT_TAG_ACTIVATIONS].current;
        assert_int_equal(kept, (int64_t)a0.reserve_bytes);
        mt_rnn_reserve_release(ms[i], &res);
    }
    mt_rnn_destroy(&m0);
    mt_rnn_destroy(&m1);
    pass_free(fx, &p);
    fx_free(&fx);
}

/* Activation offload with dropout: the same masks (same state), outputs and gradients bit
 * for bit those of the plain module, with chunks actually offloaded. */
static void offload_with_dropout(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    mt_host_cfg_t hc = mt_host_cfg_default();
    hc.backend = fx->b;
    hc.capacity = 16u << 20;
    mt_host_cache_t *host = NULL;
    assert_int_equal(mt_host_cache_create(&host, &hc), 0);
    const int modes[] = {MT_RNN_LSTM, MT_RNN_GRU};
    for (int i = 0; i < 2; i++) {
        mt_rnn_cfg_t c = fx_cfg(fx, modes[i], 3, 8, 3, false);
        c.dropout = 0.4f;
        c.dropout_seed = 99;
        c.chunk_steps = 4;
        pass_t p = pass_new(fx, &c, 30, 3);
        mt_rnn_t *plain = NULL, *off = NULL;
        assert_int_equal(mt_rnn_create(&plain, &c), 0);
        c.offload_window = 2;
        c.offload_host = host;
        assert_int_equal(mt_rnn_create(&off, &c), 0);
        run(plain, &p, true);
        out_t a = keep(plain, &p);
        run(off, &p, true);
        out_t b = keep(off, &p);
        assert_true(same(&a, &b));
        mt_rnn_stats_t st;
        assert_int_equal(mt_rnn_stats(off, &st), 0);
        assert_true(st.offloads > 0 && st.restores == st.offloads);
        assert_true(st.pass_reserve_peak_bytes < st.pass_reserve_bytes);
        drop_out(&a);
        drop_out(&b);
        mt_rnn_destroy(&plain);
        mt_rnn_destroy(&off);
        pass_free(fx, &p);
    }
    mt_host_cache_destroy(&host);
    fx_free(&fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(invalid_p_refused),
        cmocka_unit_test(p_zero_bit_identical),
        cmocka_unit_test(inference_unaffected),
        cmocka_unit_test(mask_statistics),
        cmocka_unit_test(forward_matches_reported_masks),
        cmocka_unit_test(state_reproduces_masks),
        cmocka_unit_test(activation_accounting),
        cmocka_unit_test(offload_with_dropout),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
