/* Gradient checks of the CPU path against finite differences of a double-precision naive
 * reference (tests/rnn/ref.h), for every mode x {1, 2 layers} x {uni, bi}, and with dropout
 * between layers (fixed masks); plus forward
 * equivalence of the fast path with the reference, inference = training output, chunked
 * inference over long sequences, and gradient accumulation. The kernels are called with
 * plain host buffers: this file needs no allocator. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#include "rnn/internal.h"
#include "tests/rnn/ref.h"
#include "tests/common/test_main.h"

/* Workspace floats of a padded (T, B) batch. */
static size_t fwd_work(const mt__rnn_shape_t *s, int T, int B, bool training)
{
    mt_rnn_io_t io = {.seq_len = T, .batch = B};
    return mt__rnn_cpu_io_fwd_work(s, &io, training);
}

static size_t bwd_work(const mt__rnn_shape_t *s, int T, int B)
{
    mt_rnn_io_t io = {.seq_len = T, .batch = B};
    return mt__rnn_cpu_io_bwd_work(s, &io);
}

typedef struct gcase_s {
    int mode, layers;
    bool bi, bias, states;
    int chunk;     /* time steps per chunk of the kernels; 0 = MT__RNN_CHUNK (one chunk here) */
    float dropout; /* between layers, with the masks of key DROP_KEY (fixed across the
                    * perturbed forwards of the finite differences) */
    int hidden;    /* 0 = 4 */
    int samples;   /* 0: every gradient over T = 5 steps; n: about n weights and n/4 of each
                    * data gradient, over T = 3 (the large shapes) */
} gcase_t;

#define DROP_KEY 0x5eedf00dull

/* Everything of one check, in double (reference) and float (engine). */
typedef struct fixture_s {
    ref_shape_t rs;
    mt__rnn_shape_t s;
    int T, B;
    size_t nw, nx, ny, nst;
    double *w, *x, *hx, *cx, *ry, *rh, *rc; /* ry, rh, rc: loss coefficients */
    double *mask[2];                        /* dropout: the factors of layer 0's output */
} fixture_t;

static void fixture_init(fixture_t *f, const gcase_t *c, int T, int B, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    int H = c->hidden ? c->hidden : 4;
    f->rs = (ref_shape_t){c->mode, 3, H, c->layers, c->bi ? 2 : 1, c->bias};
    mt_rnn_cfg_t cfg = mt_rnn_cfg_default();
    cfg.mode = c->mode;
    cfg.input_size = 3;
    cfg.hidden_size = H;
    cfg.num_layers = c->layers;
    cfg.bidirectional = c->bi;
    cfg.bias = c->bias;
    cfg.dropout = c->dropout;
    assert_int_equal(mt__rnn_shape_init(&f->s, &cfg), 0);
    f->s.chunk = c->chunk;
    f->T = T;
    f->B = B;
    f->nw = ref_total(&f->rs);
    assert_int_equal(f->nw, mt__rnn_weight_floats(&f->s));
    f->nx = (size_t)T * B * 3;
    f->ny = (size_t)T * B * f->rs.dirs * H;
    f->nst = (size_t)c->layers * f->rs.dirs * B * H;
    uint64_t st = seed;
    double **arrs[] = {&f->w, &f->x, &f->hx, &f->cx, &f->ry, &f->rh, &f->rc};
    size_t lens[] = {f->nw, f->nx, f->nst, f->nst, f->ny, f->nst, f->nst};
    for (int a = 0; a < 7; a++) {
        *arrs[a] = malloc(lens[a] * sizeof(double));
        for (size_t i = 0; i < lens[a]; i++)
            (*arrs[a])[i] = ref_rand(&st, a == 0 ? 0.6 * sqrt(4.0 / H) : 1.0);
    }
    if (!c->states) {
        free(f->hx);
        free(f->cx);
        f->hx = f->cx = NULL;
    }
    if (c->dropout > 0.0f) {
        /* The engine's masks, read by applying them to ones; the reference applies them on
         * its own, so forward equivalence also checks where the kernels apply them. */
        assert_true(c->layers == 2);
        size_t n = (size_t)T * B * f->rs.dirs * H;
        float *ones = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            ones[i] = 1.0f;
        mt__rnn_drop_apply(&f->s, DROP_KEY, 0, 0, n, ones, ones);
        f->mask[0] = malloc(n * sizeof(double));
        size_t dropped = 0;
        for (size_t i = 0; i < n; i++) {
            f->mask[0][i] = ones[i];
            dropped += ones[i] == 0.0f;
        }
        assert_true(dropped > 0 && dropped < n);
        free(ones);
    }
}

static void fixture_free(fixture_t *f)
{
    free(f->w);
    free(f->x);
    free(f->hx);
    free(f->cx);
    free(f->ry);
    free(f->rh);
    free(f->rc);
    free(f->mask[0]);
}

static double ref_loss(const fixture_t *f)
{
    double *y = malloc(f->ny * sizeof(double));
    double *hy = malloc(f->nst * sizeof(double));
    double *cy = calloc(f->nst, sizeof(double));
    ref_forward_masked(&f->rs, f->w, f->T, f->B, f->x, f->hx, f->cx, y, hy, cy,
                       f->mask[0] ? (const double *const *)f->mask : NULL);
    double l = 0.0;
    for (size_t i = 0; i < f->ny; i++)
        l += f->ry[i] * y[i];
    for (size_t i = 0; i < f->nst; i++)
        l += f->rh[i] * hy[i] + (f->rs.mode == MT_RNN_LSTM ? f->rc[i] * cy[i] : 0.0);
    free(y);
    free(hy);
    free(cy);
    return l;
}

static float *to_float(const double *d, size_t n)
{
    if (!d)
        return NULL;
    float *o = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        o[i] = (float)d[i];
    return o;
}

/* Central difference of the reference loss with respect to v[i]. */
static double fd(const fixture_t *f, double *v, size_t i)
{
    const double eps = 1e-6;
    double keep = v[i];
    v[i] = keep + eps;
    double lp = ref_loss(f);
    v[i] = keep - eps;
    double lm = ref_loss(f);
    v[i] = keep;
    return (lp - lm) / (2 * eps);
}

static void expect_close(const char *what, size_t i, double want, double got, double tol)
{
    if (fabs(want - got) > tol * (1.0 + fabs(want))) {
        print_error("%s[%zu]: want %.7g, got %.7g\n", what, i, want, got);
        fail();
    }
}

static void check_grad_case(const gcase_t *c)
{
    fixture_t f;
    fixture_init(&f, c, c->samples ? 3 : 5, 2,
                 0x1234u + (uint64_t)c->mode * 97 + c->layers * 7 + c->bi);
    float *w = to_float(f.w, f.nw), *x = to_float(f.x, f.nx);
    float *hx = to_float(f.hx, f.nst), *cx = to_float(f.cx, f.nst);
    float *dy = to_float(f.ry, f.ny), *dhy = to_float(f.rh, f.nst), *dcy = to_float(f.rc, f.nst);
    float *y = malloc(f.ny * sizeof(float)), *hy = malloc(f.nst * sizeof(float));
    float *cy = malloc(f.nst * sizeof(float));
    float *dw = calloc(f.nw, sizeof(float)), *dx = malloc(f.nx * sizeof(float));
    float *dhx = malloc(f.nst * sizeof(float)), *dcx = malloc(f.nst * sizeof(float));
    float *res = malloc(mt__rnn_cpu_reserve_floats(&f.s, (size_t)f.T * f.B) * sizeof(float) + 4);
    size_t nwork = fwd_work(&f.s, f.T, f.B, true);
    size_t nbw = bwd_work(&f.s, f.T, f.B);
    float *work = malloc((nwork > nbw ? nwork : nbw) * sizeof(float));

    mt_rnn_io_t io = {
        .seq_len = f.T, .batch = f.B, .x = x, .y = y, .hx = hx, .cx = cx, .hy = hy, .cy = cy};
    assert_int_equal(mt__rnn_cpu_forward_drop(&f.s, w, &io, true, DROP_KEY, res, work), 0);

    /* Forward equivalence with the reference. */
    double *ry = malloc(f.ny * sizeof(double)), *rhy = malloc(f.nst * sizeof(double));
    double *rcy = calloc(f.nst, sizeof(double));
    ref_forward_masked(&f.rs, f.w, f.T, f.B, f.x, f.hx, f.cx, ry, rhy, rcy,
                       f.mask[0] ? (const double *const *)f.mask : NULL);
    for (size_t i = 0; i < f.ny; i++)
        expect_close("y", i, ry[i], y[i], 1e-5);
    for (size_t i = 0; i < f.nst; i++) {
        expect_close("hy", i, rhy[i], hy[i], 1e-5);
        if (c->mode == MT_RNN_LSTM)
            expect_close("cy", i, rcy[i], cy[i], 1e-5);
    }

    mt_rnn_grad_io_t g = {dy, dhy, dcy, dx, dhx, dcx};
    assert_int_equal(mt__rnn_cpu_backward_drop(&f.s, w, dw, &io, DROP_KEY, res, &g, work), 0);

    const double tol = 2e-4;
    /* Sampled: strides prime to the layout's periods, so the samples spread over W, R, the
     * biases, the gates and the batch. */
    size_t wstep = c->samples ? f.nw / (size_t)c->samples + 1 : 1;
    size_t xstep = c->samples ? 7 : 1;
    size_t sstep = c->samples ? f.nst / (size_t)(c->samples / 4 + 1) + 1 : 1;
    for (size_t i = 0; i < f.nw; i += wstep)
        expect_close("dw", i, fd(&f, f.w, i), dw[i], tol);
    for (size_t i = 0; i < f.nx; i += xstep)
        expect_close("dx", i, fd(&f, f.x, i), dx[i], tol);
    if (f.hx) {
        for (size_t i = 0; i < f.nst; i += sstep)
            expect_close("dhx", i, fd(&f, f.hx, i), dhx[i], tol);
        if (c->mode == MT_RNN_LSTM)
            for (size_t i = 0; i < f.nst; i += sstep)
                expect_close("dcx", i, fd(&f, f.cx, i), dcx[i], tol);
    }

    free(ry);
    free(rhy);
    free(rcy);
    float *ptrs[] = {w, x, hx, cx, dy, dhy, dcy, y, hy, cy, dw, dx, dhx, dcx, res, work};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        free(ptrs[i]);
    fixture_free(&f);
}

#define GRAD_TEST(name, mode, layers, bi)                                                          \
    static void name(void **state)                                                                 \
    {                                                                                              \
        (void)state;                                                                               \
        gcase_t c = {mode, layers, bi, true, true, 0, 0.0f, 0, 0};                                 \
        check_grad_case(&c);                                                                       \
    }

GRAD_TEST(grad_tanh_1_uni, MT_RNN_TANH, 1, false)
GRAD_TEST(grad_tanh_1_bi, MT_RNN_TANH, 1, true)
GRAD_TEST(grad_tanh_2_uni, MT_RNN_TANH, 2, false)
GRAD_TEST(grad_tanh_2_bi, MT_RNN_TANH, 2, true)
GRAD_TEST(grad_relu_1_uni, MT_RNN_RELU, 1, false)
GRAD_TEST(grad_relu_1_bi, MT_RNN_RELU, 1, true)
GRAD_TEST(grad_relu_2_uni, MT_RNN_RELU, 2, false)
GRAD_TEST(grad_relu_2_bi, MT_RNN_RELU, 2, true)
GRAD_TEST(grad_lstm_1_uni, MT_RNN_LSTM, 1, false)
GRAD_TEST(grad_lstm_1_bi, MT_RNN_LSTM, 1, true)
GRAD_TEST(grad_lstm_2_uni, MT_RNN_LSTM, 2, false)
GRAD_TEST(grad_lstm_2_bi, MT_RNN_LSTM, 2, true)
GRAD_TEST(grad_gru_1_uni, MT_RNN_GRU, 1, false)
GRAD_TEST(grad_gru_1_bi, MT_RNN_GRU, 1, true)
GRAD_TEST(grad_gru_2_uni, MT_RNN_GRU, 2, false)
GRAD_TEST(grad_gru_2_bi, MT_RNN_GRU, 2, true)

/* Without biases and without initial states (hx = cx = NULL mean zeros). */
static void grad_no_bias_no_states(void **state)
{
    (void)state;
    for (int mode = 0; mode < 4; mode++) {
        gcase_t c = {mode, 2, true, false, false, 0, 0.0f, 0, 0};
        check_grad_case(&c);
    }
}

/* Shapes whose g*H is a multiple of 256, where the kernels pad every row of gates (and of
 * R^T, the recurrent product and the weight-gradient sums) to g*H + 16 floats: LSTM H = 64
 * over 2 layers both ways and in chunks, GRU and tanh H = 256 (1 layer, sampled: the
 * reference is slow at that size; backward also reads R from a copy with rows H + 16
 * apart). Then backward's other padded copies: LSTM H = 128 both ways, whose layer 1 input
 * (256 wide) makes backward read W from a copy with rows 272 apart, and tanh H = 253, whose
 * layer 0 gathers input and previous state into rows of 3 + 253 -> 272 floats. */
static void grad_padded_rows(void **state)
{
    (void)state;
    const gcase_t cases[] = {
        {MT_RNN_LSTM, 2, false, true, true, 0, 0.0f, 64, 20},
        {MT_RNN_LSTM, 2, true, true, true, 2, 0.0f, 64, 20},
        {MT_RNN_GRU, 1, false, true, true, 2, 0.0f, 256, 8},
        {MT_RNN_TANH, 1, true, true, true, 2, 0.0f, 256, 8},
        {MT_RNN_LSTM, 2, true, true, true, 2, 0.0f, 128, 8},
        {MT_RNN_TANH, 2, false, true, true, 2, 0.0f, 253, 8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mt_rnn_cfg_t cfg = mt_rnn_cfg_default();
        cfg.mode = cases[i].mode;
        cfg.hidden_size = cases[i].hidden;
        mt__rnn_shape_t s;
        assert_int_equal(mt__rnn_shape_init(&s, &cfg), 0);
        int gh = s.gates * s.hidden;
        assert_int_equal(mt__rnn_cpu_gld(&s), gh % 256 == 0 ? gh + 16 : gh);
        check_grad_case(&cases[i]);
    }
}

/* Chunks of 2 steps over T = 5 (2, 2, 1): the state entering a chunk comes from the
 * neighbouring chunk (the previous one forward, the next one in reverse), weight gradients
 * accumulate chunk by chunk. */
static void grad_chunked(void **state)
{
    (void)state;
    for (int mode = 0; mode < 4; mode++) {
        for (int bi = 0; bi < 2; bi++) {
            gcase_t c = {mode, 2, bi, true, true, 2, 0.0f, 0, 0};
            check_grad_case(&c);
        }
        gcase_t c = {mode, 2, false, false, false, 1, 0.0f, 0, 0};
        check_grad_case(&c);
    }
}

/* Dropout p = 0.4 between the 2 layers: forward equals the reference with the engine's
 * masks, and gradients (dx through the mask into layer 0, weights of both layers) match
 * finite differences with the masks fixed, for LSTM, GRU and tanh, uni and bi; also over
 * chunks of 2 steps, where each chunk's masks sit at its offset in the sequence. */
static void grad_dropout(void **state)
{
    (void)state;
    const int modes[] = {MT_RNN_LSTM, MT_RNN_GRU, MT_RNN_TANH};
    for (int i = 0; i < 3; i++) {
        for (int bi = 0; bi < 2; bi++) {
            gcase_t c = {modes[i], 2, bi, true, true, 0, 0.4f, 0, 0};
            check_grad_case(&c);
            gcase_t ck = {modes[i], 2, bi, true, false, 2, 0.4f, 0, 0};
            check_grad_case(&ck);
        }
    }
}

/* Inference (chunked for unidirectional modules when T > MT__RNN_CHUNK) gives the training
 * forward's outputs and final states. */
static void inference_matches_training(void **state)
{
    (void)state;
    for (int mode = 0; mode < 4; mode++) {
        for (int bi = 0; bi < 2; bi++) {
            gcase_t c = {mode, 2, bi, true, true, 0, 0.0f, 0, 0};
            fixture_t f;
            int T = 2 * MT__RNN_CHUNK + 7;
            fixture_init(&f, &c, T, 3, 99 + mode);
            float *w = to_float(f.w, f.nw), *x = to_float(f.x, f.nx);
            float *hx = to_float(f.hx, f.nst), *cx = to_float(f.cx, f.nst);
            float *y1 = malloc(f.ny * 4), *y2 = malloc(f.ny * 4);
            float *h1 = malloc(f.nst * 4), *h2 = malloc(f.nst * 4);
            float *c1 = calloc(f.nst, 4), *c2 = calloc(f.nst, 4);
            float *res = malloc(mt__rnn_cpu_reserve_floats(&f.s, (size_t)T * 3) * 4 + 4);
            float *wk1 = malloc(fwd_work(&f.s, T, 3, true) * 4);
            size_t ninf = fwd_work(&f.s, T, 3, false);
            float *wk2 = malloc(ninf * 4);
            if (!bi) /* bounded workspace: independent of T */
                assert_int_equal(ninf, fwd_work(&f.s, 10 * T, 3, false));
            mt_rnn_io_t a = {
                .seq_len = T, .batch = 3, .x = x, .y = y1, .hx = hx, .cx = cx, .hy = h1, .cy = c1};
            mt_rnn_io_t b = {
                .seq_len = T, .batch = 3, .x = x, .y = y2, .hx = hx, .cx = cx, .hy = h2, .cy = c2};
            assert_int_equal(mt__rnn_cpu_forward(&f.s, w, &a, true, res, wk1), 0);
            assert_int_equal(mt__rnn_cpu_forward(&f.s, w, &b, false, NULL, wk2), 0);
            for (size_t i = 0; i < f.ny; i++)
                expect_close("y", i, y1[i], y2[i], 1e-6);
            for (size_t i = 0; i < f.nst; i++) {
                expect_close("hy", i, h1[i], h2[i], 1e-6);
                expect_close("cy", i, c1[i], c2[i], 1e-6);
            }
            float *ptrs[] = {w, x, hx, cx, y1, y2, h1, h2, c1, c2, res, wk1, wk2};
            for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
                free(ptrs[i]);
            fixture_free(&f);
        }
    }
}

/* Weight gradients accumulate across backward calls, as cuDNN's do. */
static void gradients_accumulate(void **state)
{
    (void)state;
    gcase_t c = {MT_RNN_LSTM, 2, true, true, true, 0, 0.0f, 0, 0};
    fixture_t f;
    fixture_init(&f, &c, 4, 2, 7);
    float *w = to_float(f.w, f.nw), *x = to_float(f.x, f.nx);
    float *hx = to_float(f.hx, f.nst), *cx = to_float(f.cx, f.nst), *dy = to_float(f.ry, f.ny);
    float *y = malloc(f.ny * 4), *dw = calloc(f.nw, 4), *once = malloc(f.nw * 4);
    float *res = malloc(mt__rnn_cpu_reserve_floats(&f.s, 8) * 4);
    size_t nf = fwd_work(&f.s, 4, 2, true);
    size_t nb = bwd_work(&f.s, 4, 2);
    float *work = malloc((nf > nb ? nf : nb) * 4);
    mt_rnn_io_t io = {
        .seq_len = 4, .batch = 2, .x = x, .y = y, .hx = hx, .cx = cx, .hy = NULL, .cy = NULL};
    mt_rnn_grad_io_t g = {dy, NULL, NULL, NULL, NULL, NULL};
    for (int rep = 0; rep < 2; rep++) {
        assert_int_equal(mt__rnn_cpu_forward(&f.s, w, &io, true, res, work), 0);
        assert_int_equal(mt__rnn_cpu_backward_drop(&f.s, w, dw, &io, DROP_KEY, res, &g, work), 0);
        if (rep == 0)
            memcpy(once, dw, f.nw * 4);
    }
    int nonzero = 0;
    for (size_t i = 0; i < f.nw; i++) {
        expect_close("2*dw", i, 2.0 * once[i], dw[i], 1e-5);
        nonzero += once[i] != 0.0f;
    }
    assert_true(nonzero > (int)f.nw / 2);
    float *ptrs[] = {w, x, hx, cx, dy, y, dw, once, res, work};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        free(ptrs[i]);
    fixture_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(grad_tanh_1_uni),        cmocka_unit_test(grad_tanh_1_bi),
        cmocka_unit_test(grad_tanh_2_uni),        cmocka_unit_test(grad_tanh_2_bi),
        cmocka_unit_test(grad_relu_1_uni),        cmocka_unit_test(grad_relu_1_bi),
        cmocka_unit_test(grad_relu_2_uni),        cmocka_unit_test(grad_relu_2_bi),
        cmocka_unit_test(grad_lstm_1_uni),        cmocka_unit_test(grad_lstm_1_bi),
        cmocka_unit_test(grad_lstm_2_uni),        cmocka_unit_test(grad_lstm_2_bi),
        cmocka_unit_test(grad_gru_1_uni),         cmocka_unit_test(grad_gru_1_bi),
        cmocka_unit_test(grad_gru_2_uni),         cmocka_unit_test(grad_gru_2_bi),
        cmocka_unit_test(grad_no_bias_no_states), cmocka_unit_test(inference_matches_training),
        cmocka_unit_test(gradients_accumulate),   cmocka_unit_test(grad_chunked),
        cmocka_unit_test(grad_dropout),           cmocka_unit_test(grad_padded_rows),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
