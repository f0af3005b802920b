/* Packed batches through the CPU kernels, against the double-precision reference of ref.h
 * run sequence by sequence (each at its own length, batch 1): y, hy, cy within 1e-5, and
 * every gradient (weights, dx, dhx, dcx) against central finite differences of that
 * reference's loss. Every mode x {1, 2 layers} x {uni, bi}, with chunks of the whole batch
 * and of 2 steps (a sequence ends, or in reverse starts, inside a chunk and at its border),
 * lengths {5, 3, 3, 1}. Host buffers: no allocator. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#include "rnn/internal.h"
#include "tests/rnn/ref.h"
#include "tests/common/test_main.h"

enum { IN = 3, HID = 4, NB = 4 };
static const int LENS[NB] = {5, 3, 3, 1};

typedef struct pk_s {
    ref_shape_t rs;
    mt__rnn_shape_t s;
    int T, bs[8];
    size_t N, off[9];
    size_t nw, nx, ny, nst;
    double *w, *x, *hx, *cx, *ry, *rh, *rc; /* x [N, in], ry [N, DH]: packed rows */
} pk_t;

static void pk_init(pk_t *f, int mode, int layers, bool bi, int chunk, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    f->rs = (ref_shape_t){mode, IN, HID, layers, bi ? 2 : 1, true};
    mt_rnn_cfg_t cfg = mt_rnn_cfg_default();
    cfg.mode = mode;
    cfg.input_size = IN;
    cfg.hidden_size = HID;
    cfg.num_layers = layers;
    cfg.bidirectional = bi;
    assert_int_equal(mt__rnn_shape_init(&f->s, &cfg), 0);
    f->s.chunk = chunk;
    f->T = LENS[0];
    for (int t = 0; t < f->T; t++) {
        for (int b = 0; b < NB; b++)
            f->bs[t] += LENS[b] > t;
        f->off[t + 1] = f->off[t] + (size_t)f->bs[t];
    }
    f->N = f->off[f->T];
    f->nw = ref_total(&f->rs);
    f->nx = f->N * IN;
    f->ny = f->N * f->rs.dirs * HID;
    f->nst = (size_t)layers * f->rs.dirs * NB * HID;
    uint64_t st = seed;
    double **arrs[] = {&f->w, &f->x, &f->hx, &f->cx, &f->ry, &f->rh, &f->rc};
    size_t lens[] = {f->nw, f->nx, f->nst, f->nst, f->ny, f->nst, f->nst};
    for (int a = 0; a < 7; a++) {
        *arrs[a] = malloc(lens[a] * sizeof(double));
        for (size_t i = 0; i < lens[a]; i++)
            (*arrs[a])[i] = ref_rand(&st, a == 0 ? 0.6 : 1.0);
    }
}

static void pk_free(pk_t *f)
{
    double *a[] = {f->w, f->x, f->hx, f->cx, f->ry, f->rh, f->rc};
    for (int i = 0; i < 7; i++)
        free(a[i]);
}

/* The reference over the packed batch: sequence b alone, its rows gathered from the packed
 * form; y scattered back to packed rows, hy/cy to row b of each state. */
static void pk_ref(const pk_t *f, const double *w, const double *x, const double *hx,
                   const double *cx, double *y, double *hy, double *cy)
{
    int DH = f->rs.dirs * HID, LD = f->rs.layers * f->rs.dirs;
    for (int b = 0; b < NB; b++) {
        int T = LENS[b];
        double *xs = malloc(sizeof(double) * (size_t)T * IN);
        double *ys = malloc(sizeof(double) * (size_t)T * DH);
        double *h0 = malloc(sizeof(double) * (size_t)LD * HID);
        double *c0 = malloc(sizeof(double) * (size_t)LD * HID);
        double *h1 = malloc(sizeof(double) * (size_t)LD * HID);
        double *c1 = calloc((size_t)LD * HID, sizeof(double));
        for (int t = 0; t < T; t++)
            memcpy(xs + (size_t)t * IN, x + (f->off[t] + b) * IN, sizeof(double) * IN);
        for (int p = 0; p < LD; p++) {
            memcpy(h0 + p * HID, hx + ((size_t)p * NB + b) * HID, sizeof(double) * HID);
            memcpy(c0 + p * HID, cx + ((size_t)p * NB + b) * HID, sizeof(double) * HID);
        }
        ref_forward(&f->rs, w, T, 1, xs, h0, c0, ys, h1, c1);
        for (int t = 0; t < T; t++)
            memcpy(y + (f->off[t] + b) * DH, ys + (size_t)t * DH, sizeof(double) * DH);
        for (int p = 0; p < LD; p++) {
            memcpy(hy + ((size_t)p * NB + b) * HID, h1 + p * HID, sizeof(double) * HID);
            memcpy(cy + ((size_t)p * NB + b) * HID, c1 + p * HID, sizeof(double) * HID);
        }
        free(xs);
        free(ys);
        free(h0);
        free(c0);
        free(h1);
        free(c1);
    }
}

static double pk_loss(const pk_t *f)
{
    double *y = malloc(f->ny * sizeof(double)), *hy = malloc(f->nst * sizeof(double));
    double *cy = calloc(f->nst, sizeof(double));
    pk_ref(f, f->w, f->x, f->hx, f->cx, y, hy, cy);
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

static double fd(const pk_t *f, double *v, size_t i)
{
    const double eps = 1e-6;
    double keep = v[i];
    v[i] = keep + eps;
    double lp = pk_loss(f);
    v[i] = keep - eps;
    double lm = pk_loss(f);
    v[i] = keep;
    return (lp - lm) / (2 * eps);
}

static float *to_float(const double *d, size_t n)
{
    float *o = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        o[i] = (float)d[i];
    return o;
}

static void expect_close(const char *what, size_t i, double want, double got, double tol)
{
    if (fabs(want - got) > tol * (1.0 + fabs(want))) {
        print_error("%s[%zu]: want %.7g, got %.7g\n", what, i, want, got);
        fail();
    }
}

static void check_packed(int mode, int layers, bool bi, int chunk)
{
    pk_t f;
    pk_init(&f, mode, layers, bi, chunk, 0x77u + (uint64_t)mode * 31 + layers * 5 + bi);
    float *w = to_float(f.w, f.nw), *x = to_float(f.x, f.nx);
    float *hx = to_float(f.hx, f.nst), *cx = to_float(f.cx, f.nst);
    float *dy = to_float(f.ry, f.ny), *dhy = to_float(f.rh, f.nst), *dcy = to_float(f.rc, f.nst);
    float *y = malloc(f.ny * sizeof(float)), *hy = malloc(f.nst * sizeof(float));
    float *cy = malloc(f.nst * sizeof(float)), *dw = calloc(f.nw, sizeof(float));
    float *dx = malloc(f.nx * sizeof(float)), *dhx = malloc(f.nst * sizeof(float));
    float *dcx = malloc(f.nst * sizeof(float));
    mt_rnn_io_t io = {.seq_len = f.T,
                      .batch = NB,
                      .x = x,
                      .y = y,
                      .hx = hx,
                      .cx = cx,
                      .hy = hy,
                      .cy = cy,
                      .batch_sizes = f.bs,
                      .tokens = f.N};
    assert_int_equal(mt__rnn_seq_check(&io, NULL, NULL), 0);
    /* Poisoned ends catch a read or write past the packed rows. */
    size_t nres = mt__rnn_cpu_io_reserve(&f.s, &io);
    assert_int_equal(nres, mt__rnn_cpu_reserve_floats(&f.s, f.N));
    size_t nwf = mt__rnn_cpu_io_fwd_work(&f.s, &io, true), nwb = mt__rnn_cpu_io_bwd_work(&f.s, &io);
    float *res = malloc(nres * sizeof(float));
    float *work = malloc((nwf > nwb ? nwf : nwb) * sizeof(float));
    assert_int_equal(mt__rnn_cpu_forward(&f.s, w, &io, true, res, work), 0);

    double *ry = malloc(f.ny * sizeof(double)), *rhy = malloc(f.nst * sizeof(double));
    double *rcy = calloc(f.nst, sizeof(double));
    pk_ref(&f, f.w, f.x, f.hx, f.cx, ry, rhy, rcy);
    for (size_t i = 0; i < f.ny; i++)
        expect_close("y", i, ry[i], y[i], 1e-5);
    for (size_t i = 0; i < f.nst; i++) {
        expect_close("hy", i, rhy[i], hy[i], 1e-5);
        if (mode == MT_RNN_LSTM)
            expect_close("cy", i, rcy[i], cy[i], 1e-5);
    }
    /* Inference gives the training forward's outputs. */
    float *y2 = malloc(f.ny * sizeof(float)), *hy2 = malloc(f.nst * sizeof(float));
    float *wi = malloc(mt__rnn_cpu_io_fwd_work(&f.s, &io, false) * sizeof(float));
    mt_rnn_io_t inf = io;
    inf.y = y2;
    inf.hy = hy2;
    inf.cy = NULL;
    assert_int_equal(mt__rnn_cpu_forward(&f.s, w, &inf, false, NULL, wi), 0);
    for (size_t i = 0; i < f.ny; i++)
        expect_close("y (inference)", i, y[i], y2[i], 1e-6);
    for (size_t i = 0; i < f.nst; i++)
        expect_close("hy (inference)", i, hy[i], hy2[i], 1e-6);

    mt_rnn_grad_io_t g = {dy, dhy, dcy, dx, dhx, dcx};
    assert_int_equal(mt__rnn_cpu_backward(&f.s, w, dw, &io, res, &g, work), 0);
    const double tol = 2e-4;
    for (size_t i = 0; i < f.nw; i++)
        expect_close("dw", i, fd(&f, f.w, i), dw[i], tol);
    for (size_t i = 0; i < f.nx; i++)
        expect_close("dx", i, fd(&f, f.x, i), dx[i], tol);
    for (size_t i = 0; i < f.nst; i++) {
        expect_close("dhx", i, fd(&f, f.hx, i), dhx[i], tol);
        if (mode == MT_RNN_LSTM)
            expect_close("dcx", i, fd(&f, f.cx, i), dcx[i], tol);
    }
    float *ptrs[] = {w,  x,  hx,  cx,  dy,  dhy,  dcy, y,   hy, cy,
                     dw, dx, dhx, dcx, res, work, y2,  hy2, wi};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        free(ptrs[i]);
    free(ry);
    free(rhy);
    free(rcy);
    pk_free(&f);
}

#define PK_TEST(name, mode)                                                                        \
    static void name(void **state)                                                                 \
    {                                                                                              \
        (void)state;                                                                               \
        for (int layers = 1; layers <= 2; layers++)                                                \
            for (int bi = 0; bi < 2; bi++)                                                         \
                for (int chunk = 0; chunk <= 2; chunk += 2)                                        \
                    check_packed(mode, layers, bi, chunk);                                         \
    }

PK_TEST(packed_tanh, MT_RNN_TANH)
PK_TEST(packed_relu, MT_RNN_RELU)
PK_TEST(packed_lstm, MT_RNN_LSTM)
PK_TEST(packed_gru, MT_RNN_GRU)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(packed_tanh),
        cmocka_unit_test(packed_lstm),
        cmocka_unit_test(packed_gru),
        cmocka_unit_test(packed_relu),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
