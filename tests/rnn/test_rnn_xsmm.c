/* The per-step products on packed panels (rnn/xsmm.c): the panel layout element by element,
 * the product against a double reference at odd sizes (panels not a multiple of the panel
 * width, rows across the kernel calls, strided X and C, beta 0 over NaN and beta 1), a row's
 * bits the same whatever rows are computed beside it, and the kernels' forward and backward with
 * the packed products against the same kernels with the library's sgemm, hidden 13 and 45 (gate
 * columns 52 and 180: full panels and a remainder), packed and padded, every mode, 2 layers, both
 * directions. Runs on libxsmm where it is built in, else on the plain loops over the same layout.
 * Host buffers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rnn/internal.h"
#include "tests/common/test_main.h"

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}

/* P[k, n] = src[k*rs + n*cs] sits at dst[j*MB*K + k*w + c], n = j*MB + c, w = the panel's
 * width. */
static void check_layout(int K, int N, bool trans)
{
    uint64_t st = 7;
    int ld = trans ? K + 3 : N + 5; /* src: [K, ld] or, transposed, [N, ld] */
    size_t ns = (size_t)(trans ? N : K) * ld;
    float *src = malloc(ns * sizeof(float)), *dst = malloc((size_t)K * N * sizeof(float));
    for (size_t i = 0; i < ns; i++)
        src[i] = frand(&st);
    int rs = trans ? 1 : ld, cs = trans ? ld : 1;
    mt__rnn_xsmm_pack(dst, src, rs, cs, K, N);
    int mb = MT__RNN_XSMM_MB;
    for (int n = 0; n < N; n++) {
        int j = n / mb, c = n % mb, w = N - j * mb < mb ? N - j * mb : mb;
        for (int k = 0; k < K; k++) {
            float want = src[(size_t)k * rs + (size_t)n * cs];
            float got = dst[(size_t)j * mb * K + (size_t)k * w + c];
            if (got != want)
                fail_msg("K %d N %d trans %d: P[%d, %d] = %g at panel %d row %d col %d, got %g", K,
                         N, trans, k, n, want, j, k, c, got);
        }
    }
    free(src);
    free(dst);
}

static void pack_layout(void **state)
{
    (void)state;
    int Ks[] = {1, 13, 52}, Ns[] = {1, 13, 32, 52, 64, 70};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 6; b++)
            for (int t = 0; t < 2; t++)
                check_layout(Ks[a], Ns[b], t);
}

static void check_mm(int M, int N, int K, float beta)
{
    uint64_t st = (uint64_t)(M * 1000 + N * 10 + K);
    int ldx = K + 3, ldc = N + 5;
    float *X = malloc((size_t)M * ldx * sizeof(float)), *P0 = malloc((size_t)K * N * sizeof(float));
    float *P = malloc((size_t)K * N * sizeof(float)), *C = malloc((size_t)M * ldc * sizeof(float));
    float *C0 = malloc((size_t)M * ldc * sizeof(float));
    for (size_t i = 0; i < (size_t)M * ldx; i++)
        X[i] = frand(&st);
    for (size_t i = 0; i < (size_t)K * N; i++)
        P0[i] = frand(&st);
    for (size_t i = 0; i < (size_t)M * ldc; i++)
        C0[i] = C[i] = beta != 0.0f ? frand(&st) : NAN; /* beta 0 must not read C */
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc; j++)
            C0[(size_t)i * ldc + j] = C[(size_t)i * ldc + j] = 12345.0f; /* past N: untouched */
    mt__rnn_xsmm_pack(P, P0, N, 1, K, N);
    mt__rnn_xsmm_mm(M, N, K, X, ldx, P, beta, C, ldc);
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double want = beta != 0.0f ? C0[(size_t)i * ldc + j] : 0.0, mag = fabs(want);
            for (int k = 0; k < K; k++) {
                double v = (double)X[(size_t)i * ldx + k] * P0[(size_t)k * N + j];
                want += v;
                mag += fabs(v);
            }
            double got = C[(size_t)i * ldc + j];
            if (!(fabs(got - want) <= 1e-5 * mag + 1e-30))
                fail_msg("M %d N %d K %d beta %g: C[%d, %d] = %.9g, want %.9g", M, N, K,
                         (double)beta, i, j, got, want);
        }
        for (int j = N; j < ldc; j++)
            assert_true(C[(size_t)i * ldc + j] == 12345.0f);
    }
    free(X);
    free(P0);
    free(P);
    free(C);
    free(C0);
}

static void mm_matches_reference(void **state)
{
    (void)state;
    int Ms[] = {1, 13, 32, 33, 45}, Ns[] = {13, 52, 64, 70}, Ks[] = {13, 52};
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 2; c++) {
                check_mm(Ms[a], Ns[b], Ks[c], 0.0f);
                check_mm(Ms[a], Ns[b], Ks[c], 1.0f);
            }
}

/* A row of C comes out the same bits whatever rows are computed beside it: the step loops
 * split the batch where the threads' speeds say, so a row lands at any position of a 32-row
 * tile, in a tile of any row count. For each shape, the rows [a, a + m) computed alone must
 * equal those rows of the whole product, for every m in 1..70 at offsets that put them at
 * every kind of place (tile starts, ends, across tiles). */
static void check_rows_anywhere(int N, int K, float beta)
{
    enum { MR = 70 };
    uint64_t st = (uint64_t)(N * 131 + K * 7) + (beta != 0.0f);
    int ldx = K + 1, ldc = N + 3;
    size_t nx = (size_t)MR * ldx, nc = (size_t)MR * ldc;
    float *X = malloc(nx * sizeof(float)), *P0 = malloc((size_t)K * N * sizeof(float));
    float *P = malloc((size_t)K * N * sizeof(float)), *C0 = malloc(nc * sizeof(float));
    float *full = malloc(nc * sizeof(float)), *part = malloc(nc * sizeof(float));
    for (size_t i = 0; i < nx; i++)
        X[i] = frand(&st);
    for (size_t i = 0; i < (size_t)K * N; i++)
        P0[i] = frand(&st);
    for (size_t i = 0; i < nc; i++)
        C0[i] = beta != 0.0f ? frand(&st) : 0.0f;
    mt__rnn_xsmm_pack(P, P0, N, 1, K, N);
    memcpy(full, C0, nc * sizeof(float));
    mt__rnn_xsmm_mm(MR, N, K, X, ldx, P, beta, full, ldc);
    for (int m = 1; m <= MR; m++) {
        int offs[] = {0, 1, 7, 31, 32, 33, 45, MR - m};
        for (size_t o = 0; o < sizeof offs / sizeof offs[0]; o++) {
            int a = offs[o];
            if (a + m > MR)
                continue;
            memcpy(part, C0, nc * sizeof(float));
            mt__rnn_xsmm_mm(m, N, K, X + (size_t)a * ldx, ldx, P, beta, part + (size_t)a * ldc,
                            ldc);
            for (int i = a; i < a + m; i++) {
                const float *f = full + (size_t)i * ldc, *g = part + (size_t)i * ldc;
                if (memcmp(f, g, (size_t)N * sizeof(float)) == 0)
                    continue;
                int j = 0;
                while (f[j] == g[j] && j < N - 1)
                    j++;
                fail_msg("N %d K %d beta %g: row %d computed in rows [%d, %d) gives C[%d, %d] = "
                         "%a, the whole product %a (%s)",
                         N, K, (double)beta, i, a, a + m, i, j, (double)g[j], (double)f[j],
                         mt__rnn_xsmm_info());
            }
        }
    }
    free(X);
    free(P0);
    free(P);
    free(C0);
    free(full);
    free(part);
}

static void rows_same_bits_anywhere(void **state)
{
    (void)state;
    int Ns[] = {13, 32, 52, 70, 100}, Ks[] = {1, 13, 40, 64, 100};
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 5; b++) {
            check_rows_anywhere(Ns[a], Ks[b], 0.0f);
            check_rows_anywhere(Ns[a], Ks[b], 1.0f);
        }
}

/* ---- the kernels with packed products against the same kernels on sgemm ---- */

typedef struct run_s {
    float *y, *hy, *cy, *dw, *dx, *dhx, *dcx;
} run_t;

enum { IN = 7, NSEQ = 5 };
static const int LENS[NSEQ] = {9, 7, 7, 4, 1};

static void run_free(run_t *r)
{
    float *p[] = {r->y, r->hy, r->cy, r->dw, r->dx, r->dhx, r->dcx};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
}

static float *rnd(size_t n, uint64_t seed, float scale)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = scale * frand(&seed);
    return p;
}

/* One training forward and backward of shape s over io (packed or padded, rows tokens). */
static run_t train(const mt__rnn_shape_t *s, mt_rnn_io_t io, size_t rows)
{
    int H = s->hidden, D = s->dirs;
    size_t nw = mt__rnn_weight_floats(s), ny = rows * (size_t)D * H;
    size_t nst = (size_t)s->layers * D * (size_t)io.batch * H;
    run_t r = {malloc(ny * sizeof(float)),        malloc(nst * sizeof(float)),
               malloc(nst * sizeof(float)),       calloc(nw, sizeof(float)),
               malloc(rows * IN * sizeof(float)), malloc(nst * sizeof(float)),
               malloc(nst * sizeof(float))};
    float *w = rnd(nw, 3, 0.5f), *x = rnd(rows * IN, 4, 1.0f), *hx = rnd(nst, 5, 1.0f);
    float *cx = rnd(nst, 6, 1.0f), *dy = rnd(ny, 7, 1.0f), *dhy = rnd(nst, 8, 1.0f);
    float *dcy = rnd(nst, 9, 1.0f);
    io.x = x;
    io.y = r.y;
    io.hx = hx;
    io.cx = cx;
    io.hy = r.hy;
    io.cy = r.cy;
    size_t nres = mt__rnn_cpu_io_reserve(s, &io);
    size_t nwf = mt__rnn_cpu_io_fwd_work(s, &io, true), nwb = mt__rnn_cpu_io_bwd_work(s, &io);
    float *res = malloc(nres * sizeof(float));
    float *work = malloc((nwf > nwb ? nwf : nwb) * sizeof(float));
    assert_int_equal(mt__rnn_cpu_forward(s, w, &io, true, res, work), 0);
    mt_rnn_grad_io_t g = {dy, dhy, dcy, r.dx, r.dhx, r.dcx};
    assert_int_equal(mt__rnn_cpu_backward(s, w, r.dw, &io, res, &g, work), 0);
    float *p[] = {w, x, hx, cx, dy, dhy, dcy, res, work};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
    return r;
}

static void expect_near(const char *what, const float *want, const float *got, size_t n,
                        const char *label)
{
    double scale = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(want[i]));
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= 1e-5 * (fabs(want[i]) + 0.1 * scale) + 1e-30))
            fail_msg("%s: %s[%zu] = %.9g with packed products, %.9g with sgemm", label, what, i,
                     (double)got[i], (double)want[i]);
}

static void check_engine(int mode, int H, bool bi, bool packed, int chunk)
{
    mt_rnn_cfg_t cfg = mt_rnn_cfg_default();
    cfg.mode = mode;
    cfg.input_size = IN;
    cfg.hidden_size = H;
    cfg.num_layers = 2;
    cfg.bidirectional = bi;
    mt__rnn_shape_t s;
    memset(&s, 0, sizeof s);
    assert_int_equal(mt__rnn_shape_init(&s, &cfg), 0);
    s.chunk = chunk;
    int bs[9] = {0};
    size_t rows = 0;
    for (int t = 0; t < LENS[0]; t++) {
        for (int b = 0; b < NSEQ; b++)
            bs[t] += packed ? LENS[b] > t : 1;
        rows += (size_t)bs[t];
    }
    mt_rnn_io_t io = {.seq_len = LENS[0], .batch = NSEQ};
    if (packed) {
        io.batch_sizes = bs;
        io.tokens = rows;
    }
    s.xsmm = false;
    run_t a = train(&s, io, rows);
    s.xsmm = true;
    run_t b = train(&s, io, rows);
    char label[96];
    snprintf(label, sizeof label, "%s H=%d %s %s chunk %d", mt_rnn_mode_name(mode), H,
             bi ? "bi" : "uni", packed ? "packed" : "padded", chunk);
    size_t nst = (size_t)2 * s.dirs * NSEQ * H;
    expect_near("y", a.y, b.y, rows * s.dirs * H, label);
    expect_near("hy", a.hy, b.hy, nst, label);
    if (mode == MT_RNN_LSTM) {
        expect_near("cy", a.cy, b.cy, nst, label);
        expect_near("dcx", a.dcx, b.dcx, nst, label);
    }
    expect_near("dw", a.dw, b.dw, mt__rnn_weight_floats(&s), label);
    expect_near("dx", a.dx, b.dx, rows * IN, label);
    expect_near("dhx", a.dhx, b.dhx, nst, label);
    run_free(&a);
    run_free(&b);
}

#define ENGINE_TEST(name, mode)                                                                    \
    static void name(void **state)                                                                 \
    {                                                                                              \
        (void)state;                                                                               \
        int hs[2] = {13, 45};                                                                      \
        for (int h = 0; h < 2; h++)                                                                \
            for (int bi = 0; bi < 2; bi++)                                                         \
                for (int pk = 0; pk < 2; pk++)                                                     \
                    for (int chunk = 0; chunk <= 3; chunk += 3)                                    \
                        check_engine(mode, hs[h], bi, pk, chunk);                                  \
    }

ENGINE_TEST(engine_lstm, MT_RNN_LSTM)
ENGINE_TEST(engine_gru, MT_RNN_GRU)
ENGINE_TEST(engine_tanh, MT_RNN_TANH)

/* Where backward's xh cannot hold R's panels (one row of one step: xh is [1, in + H]), the dh
 * products read R in place; forward still packs. */
static void engine_small_xh(void **state)
{
    (void)state;
    mt_rnn_cfg_t cfg = mt_rnn_cfg_default();
    cfg.mode = MT_RNN_LSTM;
    cfg.input_size = IN;
    cfg.hidden_size = 13;
    mt__rnn_shape_t s;
    memset(&s, 0, sizeof s);
    assert_int_equal(mt__rnn_shape_init(&s, &cfg), 0);
    mt_rnn_io_t io = {.seq_len = 1, .batch = 1};
    assert_true(mt__rnn_cpu_ld(IN + 13) < 4 * 13 * 13); /* xh's floats < R's */
    s.xsmm = false;
    run_t a = train(&s, io, 1);
    s.xsmm = true;
    run_t b = train(&s, io, 1);
    expect_near("y", a.y, b.y, 13, "small xh");
    expect_near("dw", a.dw, b.dw, mt__rnn_weight_floats(&s), "small xh");
    expect_near("dhx", a.dhx, b.dhx, 13, "small xh");
    run_free(&a);
    run_free(&b);
}

/* The probe (the first use of libxsmm in the process, in main) left OMP_PROC_BIND as the
 * program had it: libxsmm_init sets it to TRUE, which made libgomp pin the engine's thread and
 * the second half of its step loops to one core. */
static bool bind_leaked;

static void probe_keeps_omp_env(void **state)
{
    (void)state;
    assert_false(bind_leaked);
}

int main(void)
{
    unsetenv("OMP_PROC_BIND");
    const char *info = mt__rnn_xsmm_info();
    bind_leaked = getenv("OMP_PROC_BIND") != NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pack_layout),
        cmocka_unit_test(mm_matches_reference),
        cmocka_unit_test(rows_same_bits_anywhere),
        cmocka_unit_test(engine_lstm),
        cmocka_unit_test(engine_gru),
        cmocka_unit_test(engine_tanh),
        cmocka_unit_test(engine_small_xh),
        cmocka_unit_test(probe_keeps_omp_env),
    };
    printf("# per-step products on %s\n", info);
    return MT_TEST_RUN(tests, NULL, NULL);
}
