/* bench_rnn: the RNN engine's CPU path against its goals, then its train-step
 * time and activation memory per shape.
 *
 * The goal table (best of --iters timed steps after one warm-up each; every ratio taken in
 * this run, on this machine):
 *   - LSTM 2x256, B=32, lengths drawn uniformly from 10..100: packed vs the same batch
 *     padded to 100. Tokens/s count the real tokens in both. Goals: packed >= 1.6x padded
 *     tokens/s, activation peak <= 0.6x padded's (peak of the activations tag during the
 *     step plus y, which backward reads back).
 *   - The same batch through PyTorch (bench/torch_rnn.py, /usr/bin/python3, 2 threads,
 *     pack_padded_sequence) when torch is installed. Goal: memtrace >= 2x its tokens/s.
 *   - The training step (LSTM 2x256, T=100, B=32) on each GEMM library (linked CBLAS,
 *     BLIS, oneDNN) at 1 and 2 threads, against the GEMM bound: the step's GEMM FLOPs at
 *     the best sgemm rate measured on this machine at that thread count (any library, a
 *     2048x1024x512 product). Goal: >= 85 % of the bound. At 1 thread every FLOP of the
 *     step and of the bound's product runs on the calling thread, and both are timed with
 *     its CPU clock too: on a shared machine the wall clock also counts the time other
 *     processes hold the core, which the CPU clock does not. The 1-thread verdict uses the
 *     CPU clock, the 2-thread one the wall clock (its figure says the load average).
 * Then the per-shape table: ms per step, tokens/s, activation bytes kept per time step
 * (measured) next to the op-by-op estimate, with the anchors of design.md section 2. */
#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/machine.h"
#include "memtrace/alloc.h"
#include "memtrace/rnn.h"
#include "rnn/internal.h"

#ifndef BENCH_TORCH_SCRIPT
#define BENCH_TORCH_SCRIPT "bench/torch_rnn.py"
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time of the calling thread. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double load_avg(void)
{
    double l[1] = {-1.0};
    return getloadavg(l, 1) == 1 ? l[0] : -1.0;
}

static void fail(const char *what, int rc)
{
    fprintf(stderr, "bench_rnn: %s: %s\n", what, mt_strerror(rc));
    exit(1);
}

static float *buf(mt_alloc_t *a, size_t n, int tag, unsigned seed)
{
    float *p;
    int rc = mt_alloc_malloc(a, (n ? n : 1) * sizeof(float), NULL, tag, (void **)&p);
    if (rc)
        fail("malloc", rc);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = seed ? (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f : 0.0f;
    }
    return p;
}

/* ---- one module's training step ---- */

typedef struct shape_s {
    int mode, T, B, in, H, L;
    bool bi;
    bool rebind;   /* U1: weight_hh_l0 lives outside the flat buffer, so every call compacts */
    float dropout; /* between layers (training): masks regenerated in backward, none kept */
} shape_t;

typedef struct step_s {
    double fwd, bwd, step; /* seconds: best of the timed steps (step = best fwd + bwd pair) */
    double cpu_step;       /* the calling thread's CPU seconds of the best step */
    double mean_fwd, mean_bwd;
    size_t act_peak; /* activations-tag peak during a step above its start, plus y */
    size_t reserve;  /* the engine's reserve of the pass */
} step_t;

static mt_rnn_t *module(mt_alloc_t *a, const shape_t *s, const char *gemm)
{
    mt_rnn_cfg_t c = mt_rnn_cfg_default();
    c.mode = s->mode;
    c.input_size = s->in;
    c.hidden_size = s->H;
    c.num_layers = s->L;
    c.bidirectional = s->bi;
    c.dropout = s->dropout;
    c.alloc = a;
    c.gemm = gemm;
    mt_rnn_t *m;
    int rc = mt_rnn_create(&m, &c);
    return rc ? NULL : m;
}

/* Times iters training steps of io (after one untimed step). */
static step_t time_steps(mt_alloc_t *a, mt_rnn_t *m, const mt_rnn_io_t *io, size_t rows, int iters)
{
    const mt_rnn_cfg_t *c = mt_rnn_cfg(m);
    size_t D = c->bidirectional ? 2 : 1, ny = rows * D * (size_t)c->hidden_size;
    size_t nx = rows * (size_t)c->input_size;
    float *dy = buf(a, ny, MT_TAG_BATCH, 2), *dx = buf(a, nx, MT_TAG_BATCH, 0);
    mt_rnn_grad_io_t g = {.dy = dy, .dx = dx};
    step_t r = {1e30, 1e30, 1e30, 1e30, 0, 0, 0, 0};
    for (int it = 0; it <= iters; it++) {
        mt_alloc_stats_t st0, st1;
        mt_alloc_reset_peak(a);
        mt_alloc_stats(a, &st0);
        double c0 = cpu_s(), t0 = now_s();
        mt_rnn_reserve_t *res;
        int rc = mt_rnn_forward(m, io, &res);
        if (rc)
            fail("forward", rc);
        double t1 = now_s();
        if ((rc = mt_rnn_backward(m, &res, &g)))
            fail("backward", rc);
        double t2 = now_s(), c2 = cpu_s();
        mt_alloc_stats(a, &st1);
        if (it == 0) /* warms the caches */
            continue;
        r.fwd = t1 - t0 < r.fwd ? t1 - t0 : r.fwd;
        r.bwd = t2 - t1 < r.bwd ? t2 - t1 : r.bwd;
        r.step = t2 - t0 < r.step ? t2 - t0 : r.step;
        r.cpu_step = c2 - c0 < r.cpu_step ? c2 - c0 : r.cpu_step;
        r.mean_fwd += (t1 - t0) / iters;
        r.mean_bwd += (t2 - t1) / iters;
        r.act_peak = (size_t)(st1.tag_allocated_bytes[MT_TAG_ACTIVATIONS].peak -
                              st0.tag_allocated_bytes[MT_TAG_ACTIVATIONS].current) +
                     ny * sizeof(float);
    }
    mt_rnn_stats_t rs;
    mt_rnn_stats(m, &rs);
    r.reserve = rs.pass_reserve_bytes;
    mt_alloc_free(a, dy);
    mt_alloc_free(a, dx);
    return r;
}

/* ---- GEMM rates of the libraries on this machine ---- */

typedef void (*bli_sgemm_fn)(int, int, int64_t, int64_t, int64_t, float *, float *, int64_t,
                             int64_t, float *, int64_t, int64_t, float *, float *, int64_t,
                             int64_t);
typedef int (*dnnl_sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t,
                             const float *, int64_t, float, float *, int64_t);

/* The bound's product on libxsmm: rows [r0, r1) of C = A P, P packed in the engine's panels
 * (rnn/xsmm.c: 32 columns wide, 32 rows of A per kernel call, the rows outer; of the
 * blockings measured, panels of 16, 32, 64 columns by 16, 32, 64 rows, rows or panels outer,
 * this ran fastest: docs/blas.md). */
typedef struct xs_part_s {
    const float *A, *P;
    float *C;
    int r0, r1, N, K;
} xs_part_t;

static void *xs_part(void *arg)
{
    const xs_part_t *p = arg;
    mt__rnn_xsmm_mm(p->r1 - p->r0, p->N, p->K, p->A + (size_t)p->r0 * p->K, p->K, p->P, 1.0f,
                    p->C + (size_t)p->r0 * p->N, p->N);
    return NULL;
}

/* GFLOP/s of one row-major 2048x1024x512 sgemm on library lib ("cblas", "blis", "dnnl", or
 * "xsmm": libxsmm's kernels on the right operand packed, the packing not timed, the rows in
 * two halves on two threads at 2) at threads threads, best of 6 by the wall clock, and in
 * *cpu_rate by the calling thread's CPU clock (the rate at 1 thread); 0 if the library is not
 * there. */
static double sgemm_rate(const char *lib, int threads, double *cpu_rate)
{
    *cpu_rate = 0.0;
    const int M = 2048, N = 1024, K = 512;
    void *h = NULL, *fn = NULL;
    float *P = NULL;
    if (strcmp(lib, "xsmm") == 0) {
        if (!mt__rnn_xsmm_available())
            return 0.0;
        fn = (void *)(uintptr_t)mt__rnn_xsmm_mm;
    } else if (strcmp(lib, "blis") == 0) {
        h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
        fn = h ? dlsym(h, "bli_sgemm") : NULL;
        void (*thr)(int64_t) =
            h ? (void (*)(int64_t))(uintptr_t)dlsym(h, "bli_thread_set_num_threads") : NULL;
        if (thr)
            thr(threads);
    } else if (strcmp(lib, "dnnl") == 0) {
        h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
        fn = h ? dlsym(h, "dnnl_sgemm") : NULL;
        void (*thr)(int) = h ? (void (*)(int))(uintptr_t)dlsym(h, "omp_set_num_threads") : NULL;
        if (thr)
            thr(threads);
    } else {
        void (*thr)(int) =
            (void (*)(int))(uintptr_t)dlsym(RTLD_DEFAULT, "openblas_set_num_threads");
        if (thr)
            thr(threads);
        fn = (void *)(uintptr_t)cblas_sgemm;
    }
    if (!fn)
        return 0.0;
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
    float *C = calloc((size_t)M * N, sizeof(float));
    for (int i = 0; i < M * K; i++)
        A[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < K * N; i++)
        B[i] = (float)(i % 5) * 0.1f;
    if (strcmp(lib, "xsmm") == 0) {
        P = malloc(sizeof(float) * K * N);
        mt__rnn_xsmm_pack(P, B, 1, K, K, N); /* P = B^T, as the others' 'T' */
    }
    double best = 1e30, cbest = 1e30;
    float one = 1.0f;
    for (int r = 0; r < 6; r++) {
        double c0 = cpu_s(), t0 = now_s();
        if (P) {
            xs_part_t part[2] = {{A, P, C, 0, threads > 1 ? M / 2 : M, N, K},
                                 {A, P, C, M / 2, M, N, K}};
            pthread_t t;
            bool two = threads > 1 && pthread_create(&t, NULL, xs_part, &part[1]) == 0;
            if (threads > 1 && !two)
                part[0].r1 = M;
            xs_part(&part[0]);
            if (two)
                pthread_join(t, NULL);
        } else if (strcmp(lib, "blis") == 0)
            ((bli_sgemm_fn)fn)(0, 8, M, N, K, &one, A, K, 1, B, K, 1, &one, C, N, 1);
        else if (strcmp(lib, "dnnl") == 0)
            ((dnnl_sgemm_fn)fn)('N', 'T', M, N, K, 1.0f, A, K, B, K, 1.0f, C, N);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 1.0f, C,
                        N);
        double t = now_s() - t0, c = cpu_s() - c0;
        best = r > 0 && t < best ? t : best; /* the first call loads and packs */
        cbest = r > 0 && c < cbest ? c : cbest;
    }
    free(A);
    free(B);
    free(C);
    free(P);
    *cpu_rate = 2.0 * M * N * K / cbest * 1e-9;
    return 2.0 * M * N * K / best * 1e-9;
}

/* GEMM FLOPs of one LSTM/GRU/RNN training step over rows tokens: forward (input projection
 * and recurrent products) and backward (data: dx and dh; weights: dW and dR), each 2 FLOPs
 * per multiply-add of g*H x (in + H) per token, layer and direction. */
static double step_flops(const shape_t *s, size_t rows)
{
    int g = s->mode == MT_RNN_LSTM ? 4 : s->mode == MT_RNN_GRU ? 3 : 1, D = s->bi ? 2 : 1;
    double f = 0;
    for (int l = 0; l < s->L; l++) {
        int in = l == 0 ? s->in : D * s->H;
        f += 3.0 * 2.0 * (double)rows * g * s->H * (double)(in + s->H) * D;
    }
    return f;
}

/* ---- one library's step in a fresh process ---- */

/* The candidates of the GEMM bound's rate: the three libraries and libxsmm's kernels. */
enum { NCAND = 4 };
static const char *const cands[NCAND] = {"cblas", "blis", "dnnl", "xsmm"};

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* `bench_rnn --step LIB THREADS ITERS QUICK`: the train step of the goal table on GEMM
 * library LIB, in a process of its own: the libraries' worker threads (OpenBLAS's pthreads,
 * oneDNN's OpenMP team) keep running for a while after a call, and two teams on 2 cores
 * would measure each other. Each round measures the best sgemm rate of the three libraries
 * and then one step, back to back, so that the load of a shared machine weighs on both
 * alike; prints the medians "step <s> rate <GFLOP/s> ratio <bound / step>" by the wall
 * clock, then the same by the calling thread's CPU clock ("cstep", "crate", "cratio"), or
 * "step none"; then "rates" and each candidate's median rate (the CPU clock's at 1 thread,
 * the wall clock's at 2; 0 where it is not there). */
static int child_step(mt_alloc_t *a, const char *lib, int threads, int iters, bool quick)
{
    shape_t t = {MT_RNN_LSTM, 100, 32, quick ? 64 : 256, quick ? 64 : 256, 2, false, false, 0.0f};
    mt_rnn_t *m = module(a, &t, lib);
    if (!m) {
        printf("step none\n");
        return 0;
    }
    size_t full = (size_t)t.T * t.B;
    float *x = buf(a, full * t.in, MT_TAG_BATCH, 1), *y = buf(a, full * t.H, MT_TAG_BATCH, 0);
    mt_rnn_io_t io = {.seq_len = t.T, .batch = t.B, .x = x, .y = y};
    double flops = step_flops(&t, full), step[16], rate[16], ratio[16];
    double cstep[16], crate[16], cratio[16], each[NCAND][16];
    int n = iters < 16 ? iters : 16;
    for (int r = 0; r < n; r++) {
        rate[r] = crate[r] = 0;
        for (int i = 0; i < NCAND; i++) {
            double c, g = sgemm_rate(cands[i], threads, &c);
            rate[r] = g > rate[r] ? g : rate[r];
            crate[r] = c > crate[r] ? c : crate[r];
            each[i][r] = threads == 1 ? c : g;
        }
        mt_rnn_set_gemm_threads(m, threads);
        /* The best of 3 steps, as the bound is the best of its repetitions: one slow moment
         * of the host then weighs on neither alone. */
        step_t st = time_steps(a, m, &io, full, 3);
        step[r] = st.step;
        ratio[r] = flops / (rate[r] * 1e9) / st.step;
        cstep[r] = st.cpu_step;
        cratio[r] = flops / (crate[r] * 1e9) / st.cpu_step;
    }
    double *cols[6] = {step, rate, ratio, cstep, crate, cratio};
    for (int i = 0; i < 6; i++)
        qsort(cols[i], (size_t)n, sizeof step[0], cmp_double);
    printf("step %.6f rate %.3f ratio %.4f cstep %.6f crate %.3f cratio %.4f %s\n", step[n / 2],
           rate[n / 2], ratio[n / 2], cstep[n / 2], crate[n / 2], cratio[n / 2],
           mt_rnn_gemm_info(m));
    printf("spread %.4f %.4f %.4f %.4f\n", ratio[n / 4], ratio[n - 1 - n / 4], cratio[n / 4],
           cratio[n - 1 - n / 4]);
    printf("rates");
    for (int i = 0; i < NCAND; i++) {
        qsort(each[i], (size_t)n, sizeof step[0], cmp_double);
        printf(" %s %.1f", cands[i], each[i][n / 2]);
    }
    printf("\n");
    mt_alloc_free(a, x);
    mt_alloc_free(a, y);
    mt_rnn_destroy(&m);
    return 0;
}

static const char *self_exe = "bench_rnn";

/* ---- the goal table ---- */

static void verdict(const char *row, const char *figure, const char *goal, bool met,
                    const char *note)
{
    printf("%-44s | %-32s | %-22s | %-7s %s\n", row, figure, goal, met ? "MET" : "NOT MET",
           note ? note : "");
}

static void goals(mt_alloc_t *a, int iters, bool quick)
{
    shape_t s = {MT_RNN_LSTM, 100, 32, 256, 256, 2, false, false, 0.0f};
    if (quick)
        s = (shape_t){MT_RNN_LSTM, 100, 32, 64, 64, 2, false, false, 0.0f};
    /* Lengths uniform in 10..100, one seeded draw. */
    int lens[32];
    uint64_t rs = 12;
    for (int b = 0; b < s.B; b++) {
        rs = rs * 6364136223846793005ull + 1442695040888963407ull;
        lens[b] = 10 + (int)((rs >> 33) % 91);
    }
    mt_rnn_pack_t p;
    int rc = mt_rnn_pack_init(&p, lens, s.B, s.T, false, NULL, NULL);
    if (rc)
        fail("pack", rc);
    mt_rnn_t *m = module(a, &s, NULL);
    if (!m)
        fail("module", MT_EINVAL);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    mt_rnn_set_gemm_threads(m, (int)cores);
    printf("\ngoals (engine GEMM: %s = %s; %ld threads for the packed, padded and PyTorch rows, "
           "1 and 2 below)\n",
           mt_rnn_gemm_name(m), mt_rnn_gemm_info(m), cores);
    printf("%-44s | %-32s | %-22s | %s\n", "row", "figure", "goal", "verdict");
    size_t full = (size_t)s.T * s.B;
    float *x = buf(a, full * s.in, MT_TAG_BATCH, 1), *y = buf(a, full * s.H, MT_TAG_BATCH, 0);
    mt_rnn_io_t pio = {.x = x, .y = y}, dio = {.seq_len = s.T, .batch = s.B, .x = x, .y = y};
    mt_rnn_pack_io(&p, &pio);
    /* Packed and padded steps alternate, round after round, and the medians are compared:
     * the load of a shared machine weighs on both alike. */
    double tpk[16], tpd[16];
    int rounds = 2 * iters + 1 < 16 ? 2 * iters + 1 : 15;
    step_t pk = {0}, pd = {0};
    for (int r = 0; r < rounds; r++) {
        pk = time_steps(a, m, &pio, p.tokens, 1);
        pd = time_steps(a, m, &dio, full, 1);
        tpk[r] = pk.step;
        tpd[r] = pd.step;
    }
    qsort(tpk, (size_t)rounds, sizeof tpk[0], cmp_double);
    qsort(tpd, (size_t)rounds, sizeof tpd[0], cmp_double);
    double tok_pk = (double)p.tokens / tpk[rounds / 2], tok_pd = (double)p.tokens / tpd[rounds / 2];
    char fig[96], row[96];
    snprintf(row, sizeof row, "LSTM %dx%d B=%d len U[10,100]: packed vs pad", s.L, s.H, s.B);
    snprintf(fig, sizeof fig, "%.0f vs %.0f tok/s = %.2fx", tok_pk, tok_pd, tok_pk / tok_pd);
    verdict(row, fig, ">= 1.6x real tok/s", tok_pk >= 1.6 * tok_pd, NULL);
    snprintf(fig, sizeof fig, "%.1f vs %.1f MiB = %.2fx", pk.act_peak / 1048576.0,
             pd.act_peak / 1048576.0, (double)pk.act_peak / (double)pd.act_peak);
    verdict("  activation peak (reserve + y)", fig, "<= 0.6x", pk.act_peak <= 0.6 * pd.act_peak,
            NULL);

    /* PyTorch on the same lengths. */
    char cmd[2048];
    int n = snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s 2 %d %d %d %d ", BENCH_TORCH_SCRIPT,
                     iters > 2 ? 2 : iters, s.in, s.H, s.L);
    for (int b = 0; b < s.B && n < (int)sizeof cmd - 8; b++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, "%s%d", b ? "," : "", lens[b]);
    snprintf(cmd + n, sizeof cmd - (size_t)n, " 2>&1");
    FILE *f = popen(cmd, "r");
    char line[512] = "";
    if (!f || !fgets(line, sizeof line, f))
        snprintf(line, sizeof line, "torch unavailable: could not run %s", BENCH_TORCH_SCRIPT);
    if (f)
        pclose(f);
    char ver[64];
    double ttok = 0, tms = 0;
    int tthr = 0;
    if (sscanf(line, "torch %63s tokens/s %lf step_ms %lf threads %d", ver, &ttok, &tms, &tthr) ==
        4) {
        snprintf(row, sizeof row, "  PyTorch %s, %d threads, packed", ver, tthr);
        snprintf(fig, sizeof fig, "%.0f vs %.0f tok/s = %.2fx", tok_pk, ttok, tok_pk / ttok);
        verdict(row, fig, ">= 2x torch tok/s", tok_pk >= 2.0 * ttok, NULL);
    } else {
        line[strcspn(line, "\n")] = '\0';
        printf("  PyTorch row not measured: %s\n", line);
    }
    mt_rnn_destroy(&m);

    /* The training step against the GEMM bound, per library and thread count. */
    const char *libs[3] = {"cblas", "blis", "dnnl"};
    shape_t t = s;
    double flops = step_flops(&t, full);
    /* The host's speed moves by several percent from one round to the next: the median of
     * 9 rounds is steadier than that of the 3 the other rows take (docs/blas.md, session 10). */
    int srounds = quick ? 3 : 9;
    printf(
        "  GEMM bound = the step's %.2f GFLOP at the best sgemm rate of the three libraries and "
        "libxsmm's kernels on packed panels (2048x1024x512), measured right before each step; "
        "medians of %d rounds, each the best of 3 steps against the best of 6 repetitions of the "
        "bound's product (the %% is the median of the rounds' bound/step ratios; 'rounds' gives "
        "their quartiles)\n",
        flops * 1e-9, srounds);
    /* The library a module takes by default at each thread count, marked in the rows. */
    char def[3][8] = {"", "", ""};
    mt_rnn_t *dm = module(a, &s, NULL);
    for (int threads = 1; dm && threads <= 2; threads++)
        if (mt_rnn_set_gemm_threads(dm, threads) == 0)
            snprintf(def[threads], sizeof def[threads], "%s", mt_rnn_gemm_name(dm));
    mt_rnn_destroy(&dm);
    printf("  * the engine's default library at that thread count\n");
    for (int threads = 1; threads <= 2; threads++) {
        for (int i = 0; i < 3; i++) {
            char c2[1200], out[512] = "";
            snprintf(c2, sizeof c2, "%s --step %s %d %d %d", self_exe, libs[i], threads, srounds,
                     quick ? 1 : 0);
            FILE *pf = popen(c2, "r");
            double sec = 0, rate = 0, ratio = 0, csec = 0, crate = 0, cratio = 0;
            char rates[256] = "";
            double q[4] = {0, 0, 0, 0}; /* the rounds' quartiles: wall ratio, CPU ratio */
            while (pf && fgets(out, sizeof out, pf)) {
                if (sscanf(out, "step %lf rate %lf ratio %lf cstep %lf crate %lf cratio %lf", &sec,
                           &rate, &ratio, &csec, &crate, &cratio) == 6)
                    continue;
                if (sscanf(out, "spread %lf %lf %lf %lf", &q[0], &q[1], &q[2], &q[3]) == 4)
                    continue;
                if (strncmp(out, "rates ", 6) == 0)
                    snprintf(rates, sizeof rates, "%.200s", out + 6);
            }
            if (pf)
                pclose(pf);
            if (sec <= 0) {
                printf("    %-6s not available here\n", libs[i]);
                continue;
            }
            snprintf(row, sizeof row, "  train step %dx%d T=%d B=%d, %s, %d thr%s", t.L, t.H, t.T,
                     t.B, libs[i], threads, strcmp(def[threads], libs[i]) == 0 ? " *" : "");
            char note[128];
            if (threads == 1) {
                snprintf(fig, sizeof fig, "cpu %.1f ms (bound %.1f) = %.1f %%", csec * 1e3,
                         flops / (crate * 1e9) * 1e3, 100.0 * cratio);
                snprintf(note, sizeof note,
                         "rounds %.1f-%.1f %%; wall %.1f ms (bound %.1f) = %.1f %%, load %.1f",
                         100.0 * q[2], 100.0 * q[3], sec * 1e3, flops / (rate * 1e9) * 1e3,
                         100.0 * ratio, load_avg());
            } else {
                snprintf(fig, sizeof fig, "%.1f ms (bound %.1f) = %.1f %%", sec * 1e3,
                         flops / (rate * 1e9) * 1e3, 100.0 * ratio);
                snprintf(note, sizeof note, "rounds %.1f-%.1f %%; wall clock, load %.1f",
                         100.0 * q[0], 100.0 * q[1], load_avg());
            }
            verdict(row, fig, ">= 85 % of GEMM bound", (threads == 1 ? cratio : ratio) >= 0.85,
                    note);
            rates[strcspn(rates, "\n")] = '\0';
            printf("    bound's candidates, GFLOP/s (%s clock): %s\n",
                   threads == 1 ? "CPU" : "wall", rates);
        }
    }
    mt_alloc_free(a, x);
    mt_alloc_free(a, y);
    mt_rnn_pack_fini(&p);
}

/* ---- the per-shape table ---- */

static void run(mt_alloc_t *a, const shape_t *s, int iters)
{
    mt_rnn_t *m = module(a, s, NULL);
    if (!m)
        fail("mt_rnn_create", MT_EINVAL);
    float *moved = NULL;
    int rc;
    if (s->rebind) {
        mt_rnn_param_t p;
        if ((rc = mt_rnn_param_find(m, "weight_hh_l0", &p)))
            fail("param", rc);
        moved = buf(a, p.numel, MT_TAG_WEIGHTS, 0);
        memcpy(moved, p.data, p.numel * sizeof(float));
        if ((rc = mt_rnn_bind_param(m, p.name, moved)))
            fail("bind", rc);
    }
    int D = s->bi ? 2 : 1;
    size_t rows = (size_t)s->T * s->B, nx = rows * s->in, ny = rows * D * s->H;
    float *x = buf(a, nx, MT_TAG_BATCH, 1), *y = buf(a, ny, MT_TAG_BATCH, 0);
    mt_rnn_io_t io = {.seq_len = s->T, .batch = s->B, .x = x, .y = y};
    step_t st = time_steps(a, m, &io, rows, iters);
    mt_rnn_act_t act;
    mt_rnn_activation_bytes(m, s->T, s->B, &act);
    /* Kept per time step: the reserve plus y, which backward reads back. */
    double kept_step = (double)st.reserve / s->T + (double)ny * sizeof(float) / s->T;
    double hvec = kept_step / ((double)s->B * s->H * s->L * D * sizeof(float));
    char name[16];
    snprintf(name, sizeof name, "%s%s%s", mt_rnn_mode_name(s->mode), s->rebind ? "*" : "",
             s->dropout > 0.0f ? "+" : "");
    printf("%-8s %4d %3d %4d %4d %2d %3s | %8.1f %8.1f %8.1f %9.0f | %9.1f %6.2f %9.1f %5.1f\n",
           name, s->T, s->B, s->in, s->H, s->L, s->bi ? "bi" : "uni", 1e3 * st.mean_fwd,
           1e3 * st.mean_bwd, 1e3 * (st.mean_fwd + st.mean_bwd),
           (double)rows / (st.mean_fwd + st.mean_bwd), kept_step / 1024.0, hvec,
           (double)act.opbyop_bytes_per_step / 1024.0, act.opbyop_hvec);
    if (s->dropout > 0.0f)
        printf("  + dropout %g between the layers (the op-by-op estimate adds the dropped outputs "
               "and masks)\n",
               (double)s->dropout);
    if (s->rebind) {
        mt_rnn_stats_t rs;
        mt_rnn_stats(m, &rs);
        printf("  * weights not flat (U1): %llu compactions, %.2f MiB copied per train step\n",
               (unsigned long long)rs.compactions,
               (double)rs.compacted_bytes / (iters + 1) / (1024.0 * 1024.0));
        mt_alloc_free(a, moved);
    }
    fflush(stdout);
    mt_alloc_free(a, x);
    mt_alloc_free(a, y);
    mt_rnn_destroy(&m);
}

int main(int argc, char **argv)
{
    /* A program's choice the library leaves to it: oneDNN's OpenMP team sleeps between
     * calls instead of spinning on cores the cell math needs (docs/blas.md). */
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    bool goals_only = argc > 1 && strcmp(argv[1], "--goals") == 0;
    bool step = argc == 6 && strcmp(argv[1], "--step") == 0;
    if (argc > 1 && !quick && !goals_only && !step) {
        printf("usage: bench_rnn [--quick | --goals]\n");
        return strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    self_exe = argv[0];
    /* oneDNN's OpenMP team, and anything else OpenMP here, sleeps instead of spinning
     * between calls (the engine does the same when it loads oneDNN: docs/blas.md). */
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    if (!step)
        mt_bench_print_machine(stdout);
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    mt_backend_t *b;
    int rc = mt_backend_create(&b, &bc);
    if (rc)
        fail("backend", rc);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    mt_alloc_t *a;
    if ((rc = mt_alloc_create(&a, &ac)))
        fail("allocator", rc);
    int iters = quick ? 2 : 3;
    if (step) {
        rc = child_step(a, argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]) != 0);
        mt_alloc_destroy(&a);
        mt_backend_destroy(&b);
        return rc;
    }
    goals(a, iters, quick);
    if (goals_only) {
        mt_alloc_destroy(&a);
        mt_backend_destroy(&b);
        return 0;
    }

    static const shape_t full[] = {
        {MT_RNN_LSTM, 100, 32, 256, 256, 2, false, false, 0.0f},
        {MT_RNN_LSTM, 100, 32, 256, 256, 2, false, true, 0.0f},
        {MT_RNN_LSTM, 100, 32, 256, 256, 2, false, false, 0.3f},
        {MT_RNN_LSTM, 100, 32, 512, 512, 2, false, false, 0.0f},
        {MT_RNN_LSTM, 100, 32, 256, 256, 2, true, false, 0.0f},
        {MT_RNN_GRU, 100, 32, 256, 256, 2, false, false, 0.0f},
        {MT_RNN_TANH, 100, 32, 256, 256, 2, false, false, 0.0f},
    };
    static const shape_t small[] = {
        {MT_RNN_LSTM, 50, 16, 128, 128, 2, false, false, 0.0f},
        {MT_RNN_LSTM, 50, 16, 128, 128, 2, false, true, 0.0f},
        {MT_RNN_LSTM, 50, 16, 128, 128, 2, false, false, 0.3f},
        {MT_RNN_GRU, 50, 16, 128, 128, 2, false, false, 0.0f},
    };
    const shape_t *shapes = quick ? small : full;
    size_t n = quick ? sizeof small / sizeof small[0] : sizeof full / sizeof full[0];

    printf("\nper shape (default GEMM library, default threads; mean of %d timed steps)\n", iters);
    printf("%-8s %4s %3s %4s %4s %2s %3s | %8s %8s %8s %9s | %9s %6s %9s %5s\n", "mode", "T", "B",
           "in", "H", "L", "dir", "fwd ms", "bwd ms", "step ms", "tokens/s", "kept KiB", "Hvec",
           "opbyop", "Hvec");
    for (size_t i = 0; i < n; i++)
        run(a, &shapes[i], iters);
    printf("\n'kept' = activation bytes per time step (all layers, the batch) that a training\n"
           "forward holds for backward (the engine's reserve), plus y;\n"
           "'Hvec' = the same in H-vectors per (step, batch element, layer, direction).\n"
           "Anchors (design.md section 2): a fused LSTM keeps ~5-6 H-vectors, an op-by-op\n"
           "autograd cell 18+ (our estimate: LSTM 21, GRU 17, RNN 4; formula in rnn.h).\n");
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    return 0;
}
