/* The cuDNN path's numbers against the CPU path's: the fake cuDNN computes a reference RNN
 * from the weights where its cudnnGetRNNWeightParams says they are (cuDNN's layout: all
 * matrices first, then all biases), so a layout, gate-order or orientation mistake in the
 * path shows up here as wrong y, h_n, c_n or gradients. Two modules with the same seed (so
 * the same weights): one on the cuda backend over the fake driver (path "cudnn"), one on
 * sim (path "cpu"). Also: the y the caller changed between forward and backward. */
#include <math.h>

#include "tests/rnn_cudnn/fixture.h"
#include "tests/common/test_main.h"

/* Both paths compute in float with FMA and no TF32 (CUDNN_FMA_MATH); the fake sums in
 * double, the cpu path through BLAS in float. Measured worst: ~2e-6 relative; this bound
 * (documented in docs/cudnn.md) leaves room for the summation orders of a real GPU. */
#define TOL 1e-4

typedef struct ref_mod_s {
    mt_backend_t *b;
    mt_alloc_t *a;
    mt_rnn_t *m;
} ref_mod_t;

static void ref_up(ref_mod_t *r, const mt_rnn_cfg_t *cfg)
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 64 * MiB;
    assert_int_equal(mt_backend_create(&r->b, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = r->b;
    assert_int_equal(mt_alloc_create(&r->a, &ac), 0);
    mt_rnn_cfg_t c = *cfg;
    c.alloc = r->a;
    c.stream = NULL;
    c.log = NULL;
    assert_int_equal(mt_rnn_create(&r->m, &c), 0);
    assert_string_equal(mt_rnn_path_name(r->m), "cpu");
}

static void ref_down(ref_mod_t *r)
{
    mt_rnn_destroy(&r->m);
    mt_alloc_destroy(&r->a);
    mt_backend_destroy(&r->b);
}

static float *sbuf(ref_mod_t *r, const float *host, size_t n)
{
    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(r->a, (n ? n : 1) * sizeof(float), NULL, MT_TAG_BATCH, &p), 0);
    if (host)
        memcpy(p, host, n * sizeof(float));
    else
        memset(p, 0, n * sizeof(float));
    return p;
}

static float *cbuf(fx_t *f, const float *host, size_t n)
{
    float *p = dbuf(f, n ? n : 1, 0.0f);
    if (host && n)
        assert_int_equal(mt_memcpy(f->b, p, host, n * sizeof(float), MT_MEMCPY_HOST_TO_DEVICE), 0);
    return p;
}

static void fill(float *v, size_t n, uint64_t *seed)
{
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((double)(*seed >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

/* Worst |a - b| / (1 + |b|) over n floats of device memory a (cuda) and host b (cpu). */
static double worst(fx_t *f, const float *dev, const float *ref, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    dget(f, h, dev, n);
    double w = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)h[i] - (double)ref[i]) / (1.0 + fabs((double)ref[i]));
        if (!(e <= w)) /* NaN too */
            w = isnan(e) ? INFINITY : e;
    }
    free(h);
    return w;
}

typedef struct case_s {
    mt_rnn_mode_e mode;
    int layers;
    bool bidir, bias;
    const int *lens; /* packed lengths, or NULL for padded T x B */
    int nlens;
} case_t;

static double g_worst; /* over every case, printed at the end */

static void run_case(const case_t *k)
{
    fx_t f;
    fx_up(&f);
    fake_dnn_markers(false);
    fake_dnn_interleaved_layout(false);
    f.cfg.mode = k->mode;
    f.cfg.num_layers = k->layers;
    f.cfg.bidirectional = k->bidir;
    f.cfg.bias = k->bias;
    f.cfg.input_size = 5;
    f.cfg.hidden_size = 7;
    f.cfg.seed = 42;
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    assert_string_equal(mt_rnn_path_name(f.m), "cudnn");
    ref_mod_t r;
    ref_up(&r, &f.cfg);

    const int I = 5, H = 7, D = k->bidir ? 2 : 1, LD = k->layers * D;
    int T = 4, B = 3;
    mt_rnn_pack_t pk;
    size_t N = (size_t)T * (size_t)B;
    if (k->lens) {
        assert_int_equal(mt_rnn_pack_init(&pk, k->lens, k->nlens, 64, true, NULL, NULL), 0);
        N = pk.tokens;
        T = pk.max_len;
        B = k->nlens;
    }
    bool lstm = k->mode == MT_RNN_LSTM;
    size_t nx = N * I, ny = N * (size_t)(D * H), ns = (size_t)LD * B * H;
    uint64_t seed = 7;
    float *hx = malloc(nx * sizeof *hx), *hdy = malloc(ny * sizeof *hdy);
    float *hs[4]; /* hx, cx, dhy, dcy */
    fill(hx, nx, &seed);
    fill(hdy, ny, &seed);
    for (int i = 0; i < 4; i++) {
        hs[i] = malloc(ns * sizeof(float));
        fill(hs[i], ns, &seed);
    }

    /* cuda */
    float *cx_ = cbuf(&f, hx, nx), *cy_ = cbuf(&f, NULL, ny), *cdy = cbuf(&f, hdy, ny);
    float *cdx = cbuf(&f, NULL, nx), *cst[4], *cout[4]; /* outs: hy, cy, dhx, dcx */
    for (int i = 0; i < 4; i++) {
        cst[i] = cbuf(&f, hs[i], ns);
        cout[i] = cbuf(&f, NULL, ns);
    }
    mt_rnn_io_t io = {.seq_len = T,
                      .batch = B,
                      .x = cx_,
                      .y = cy_,
                      .hx = cst[0],
                      .cx = lstm ? cst[1] : NULL,
                      .hy = cout[0],
                      .cy = lstm ? cout[1] : NULL};
    if (k->lens)
        mt_rnn_pack_io(&pk, &io);
    mt_rnn_reserve_t *res = NULL;
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
    mt_rnn_grad_io_t g = {.dy = cdy,
                          .dhy = cst[2],
                          .dcy = lstm ? cst[3] : NULL,
                          .dx = cdx,
                          .dhx = cout[2],
                          .dcx = lstm ? cout[3] : NULL};
    assert_int_equal(mt_rnn_backward(f.m, &res, &g), 0);

    /* cpu */
    float *sx = sbuf(&r, hx, nx), *sy = sbuf(&r, NULL, ny), *sdy = sbuf(&r, hdy, ny);
    float *sdx = sbuf(&r, NULL, nx), *sst[4], *sout[4];
    for (int i = 0; i < 4; i++) {
        sst[i] = sbuf(&r, hs[i], ns);
        sout[i] = sbuf(&r, NULL, ns);
    }
    mt_rnn_io_t rio = {.seq_len = T,
                       .batch = B,
                       .x = sx,
                       .y = sy,
                       .hx = sst[0],
                       .cx = lstm ? sst[1] : NULL,
                       .hy = sout[0],
                       .cy = lstm ? sout[1] : NULL};
    if (k->lens)
        mt_rnn_pack_io(&pk, &rio);
    mt_rnn_reserve_t *rres = NULL;
    assert_int_equal(mt_rnn_forward(r.m, &rio, &rres), 0);
    mt_rnn_grad_io_t rg = {.dy = sdy,
                           .dhy = sst[2],
                           .dcy = lstm ? sst[3] : NULL,
                           .dx = sdx,
                           .dhx = sout[2],
                           .dcx = lstm ? sout[3] : NULL};
    assert_int_equal(mt_rnn_backward(r.m, &rres, &rg), 0);

    /* the same weights, then every output and gradient */
    size_t nw = 0, nw2 = 0;
    float *w = mt_rnn_weights(f.m, &nw), *w2 = mt_rnn_weights(r.m, &nw2);
    assert_int_equal(nw, nw2);
    assert_true(worst(&f, w, w2, nw) == 0.0);
    double e[9] = {
        worst(&f, cy_, sy, ny),
        worst(&f, cout[0], sout[0], ns),
        lstm ? worst(&f, cout[1], sout[1], ns) : 0.0,
        worst(&f, cdx, sdx, nx),
        worst(&f, cout[2], sout[2], ns),
        lstm ? worst(&f, cout[3], sout[3], ns) : 0.0,
        worst(&f, mt_rnn_grads(f.m, NULL), mt_rnn_grads(r.m, NULL), nw),
    };
    static const char *names[] = {"y", "h_n", "c_n", "dx", "dhx", "dcx", "dw"};
    for (int i = 0; i < 7; i++) {
        if (!(e[i] <= TOL))
            print_error("%s L%d D%d bias %d %s: %s differs by %g\n", mt_rnn_mode_name(k->mode),
                        k->layers, D, k->bias, k->lens ? "packed" : "padded", names[i], e[i]);
        assert_true(e[i] <= TOL);
        g_worst = e[i] > g_worst ? e[i] : g_worst;
    }
    /* a gradient that is zero everywhere would compare equal too: it is not */
    float *gh = malloc(nw * sizeof *gh);
    dget(&f, gh, mt_rnn_grads(f.m, NULL), nw);
    double mag = 0.0;
    for (size_t i = 0; i < nw; i++)
        mag += fabs(gh[i]);
    assert_true(mag > 0.1);
    free(gh);
    assert_int_equal(f.errors, 0);

    float *cb[] = {cx_,    cy_,    cdy,     cdx,     cst[0],  cst[1],
                   cst[2], cst[3], cout[0], cout[1], cout[2], cout[3]};
    for (size_t i = 0; i < sizeof cb / sizeof cb[0]; i++)
        assert_int_equal(mt_alloc_free(f.a, cb[i]), 0);
    float *sb[] = {sx,     sy,     sdy,     sdx,     sst[0],  sst[1],
                   sst[2], sst[3], sout[0], sout[1], sout[2], sout[3]};
    for (size_t i = 0; i < sizeof sb / sizeof sb[0]; i++)
        assert_int_equal(mt_alloc_free(r.a, sb[i]), 0);
    free(hx);
    free(hdy);
    for (int i = 0; i < 4; i++)
        free(hs[i]);
    if (k->lens)
        mt_rnn_pack_fini(&pk);
    ref_down(&r);
    fx_down(&f);
}

static const int lens5[] = {5, 3, 3, 1};

/* Every cell, 1 and 2 layers, uni- and bidirectional, with bias, padded. */
static void test_matches_cpu_padded(void **state)
{
    (void)state;
    mt_rnn_mode_e modes[] = {MT_RNN_LSTM, MT_RNN_GRU, MT_RNN_TANH, MT_RNN_RELU};
    for (int mi = 0; mi < 4; mi++)
        for (int L = 1; L <= 2; L++)
            for (int bi = 0; bi < 2; bi++)
                run_case(&(case_t){modes[mi], L, bi, true, NULL, 0});
}

/* The same over packed variable-length input (lengths 5, 3, 3, 1). */
static void test_matches_cpu_packed(void **state)
{
    (void)state;
    mt_rnn_mode_e modes[] = {MT_RNN_LSTM, MT_RNN_GRU, MT_RNN_TANH, MT_RNN_RELU};
    for (int mi = 0; mi < 4; mi++)
        for (int L = 1; L <= 2; L++)
            for (int bi = 0; bi < 2; bi++)
                run_case(&(case_t){modes[mi], L, bi, true, lens5, 4});
}

/* Without bias (cuDNN's NO_BIAS: no bias regions at all). */
static void test_matches_cpu_no_bias(void **state)
{
    (void)state;
    run_case(&(case_t){MT_RNN_LSTM, 2, true, false, NULL, 0});
    run_case(&(case_t){MT_RNN_GRU, 2, true, false, lens5, 4});
    print_message("worst relative difference cudnn vs cpu over all cases: %.3g (bound %g)\n",
                  g_worst, TOL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_cpu_padded),
        cmocka_unit_test(test_matches_cpu_packed),
        cmocka_unit_test(test_matches_cpu_no_bias),
    };
    return MT_TEST_RUN(tests, fake_ctl_open, fake_ctl_close);
}
