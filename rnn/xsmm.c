/* Small-GEMM kernels for the per-step products of the cpu path: libxsmm's JIT kernels over a
 * right operand packed in column panels (docs/rnn-cpu.md, Per-step products on libxsmm).
 *
 * A panel is a contiguous [K, w] block of the operand, so every kernel call streams one
 * compact block instead of w columns of rows 4 KiB apart. Used when the build found libxsmm
 * (MT_HAVE_XSMM), the CPU has AVX2 (libxsmm's target) and $MEMTRACE_RNN_XSMM is not "0";
 * else the kernels keep the GEMM library's sgemm on the unpacked operand. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt_config.h"
#include "rnn/internal.h"
#include "util/assert.h"

#if MT_HAVE_XSMM
#include <libxsmm.h>
#endif

/* Rows of C per tile of mt__rnn_xsmm_mm_par, and per kernel call (KROWS divides ROWS). */
#ifndef MT__RNN_XSMM_KROWS
#define MT__RNN_XSMM_KROWS 8
#endif
enum { ROWS = 32, KROWS = MT__RNN_XSMM_KROWS };
_Static_assert(ROWS % KROWS == 0, "a tile of mt__rnn_xsmm_mm_par is whole kernel calls");

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool usable;
static char info[96] = "libxsmm not built in";

static void probe(void)
{
#if MT_HAVE_XSMM
    /* libxsmm_init sets OMP_PROC_BIND=TRUE when no affinity variable is set ("autopin").
     * libgomp, loaded later with oneDNN, would then pin the calling thread to one core, and
     * the threads started afterwards for the step loops' other parts would inherit it.
     * The program's setting is put back. */
    bool bind_unset = getenv("OMP_PROC_BIND") == NULL;
    libxsmm_init();
    if (bind_unset)
        unsetenv("OMP_PROC_BIND");
    int arch = libxsmm_get_target_archid();
    if (arch < LIBXSMM_X86_AVX2) {
        snprintf(info, sizeof info, "libxsmm %s: CPU below AVX2 (target %s)", LIBXSMM_VERSION,
                 libxsmm_get_target_arch());
        return;
    }
    /* JIT must work here (an executable mapping): one kernel of the shape used. */
    float one = 1.0f;
    int mb = MT__RNN_XSMM_MB, fl = LIBXSMM_GEMM_FLAGS('N', 'N'), pf = LIBXSMM_GEMM_PREFETCH_NONE;
    if (!libxsmm_smmdispatch(mb, 1, 1, &mb, NULL, NULL, &one, &one, &fl, &pf)) {
        snprintf(info, sizeof info, "libxsmm %s: no JIT kernel here", LIBXSMM_VERSION);
        return;
    }
    usable = true;
    snprintf(info, sizeof info, "libxsmm %s, JIT for %s", LIBXSMM_VERSION,
             libxsmm_get_target_arch());
#endif
}

bool mt__rnn_xsmm_available(void)
{
    pthread_once(&once, probe);
    return usable;
}

bool mt__rnn_xsmm_wanted(void)
{
    const char *env = getenv("MEMTRACE_RNN_XSMM");
    return !(env && strcmp(env, "0") == 0) && mt__rnn_xsmm_available();
}

const char *mt__rnn_xsmm_info(void)
{
    pthread_once(&once, probe);
    return info;
}

void mt__rnn_xsmm_pack(float *restrict dst, const float *restrict src, int rs, int cs, int K, int N)
{
    for (int j0 = 0; j0 < N; j0 += MT__RNN_XSMM_MB) {
        int w = N - j0 < MT__RNN_XSMM_MB ? N - j0 : MT__RNN_XSMM_MB;
        float *d = dst + (size_t)j0 * (size_t)K;
        if (cs == 1) {
            for (int k = 0; k < K; k++)
                memcpy(d + (size_t)k * w, src + (size_t)k * rs + j0, (size_t)w * sizeof(float));
        } else {
            /* A transposition: read down each source row (contiguous in k), write strided. */
            for (int c = 0; c < w; c++) {
                const float *s = src + (size_t)(j0 + c) * cs;
                for (int k = 0; k < K; k++)
                    d[(size_t)k * w + c] = s[(size_t)k * rs];
            }
        }
    }
}

/* C[M, w] (+)= X[M, K] P_j[K, w] with plain loops: what runs without libxsmm or a kernel. */
static void panel_ref(int M, int w, int K, const float *X, int ldx, const float *p, float beta,
                      float *C, int ldc)
{
    for (int i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        for (int j = 0; j < w; j++)
            c[j] = beta != 0.0f ? c[j] : 0.0f;
        for (int k = 0; k < K; k++) {
            float x = X[(size_t)i * ldx + k];
            const float *pk = p + (size_t)k * w;
            for (int j = 0; j < w; j++)
                c[j] += x * pk[j];
        }
    }
}

/* ---- the product ----
 *
 * Every KROWS rows of X go through the one kernel of KROWS rows, whatever M is. The step loops
 * split a batch where the threads' speeds say, so a row may fall anywhere in a call of any row
 * count, and libxsmm's AVX-512 code generator builds a panel narrower than 17 columns over
 * 2..11 rows with another order of the sums than over 12 or more (the row's bits then followed
 * the split). A kernel gives a row the same bits at any of its positions, so the last rows,
 * fewer than KROWS, run it too, on a thread's scratch of KROWS rows: their X rows copied in,
 * C's too when beta is 1, their rows of C copied back. The scratch keeps X's and C's row
 * strides, so that the very kernel of the whole tiles runs it. KROWS = 8 keeps the padding
 * small (a 32-sequence batch cut 14/18 computes 16 and 24 rows) at about the rate
 * of a 32-row kernel; the panels are the outer loop, so a panel stays in L1 across a call's
 * tiles. tests/rnn/test_rnn_xsmm.c checks a row's bits against the whole product at every row
 * count and offset. */

#if MT_HAVE_XSMM
/* The kernel of a panel w wide over KROWS rows (column-major: C[w x KROWS] = P[w x K]
 * X[K x KROWS]), with prefetch of the next panel into L2; NULL if libxsmm makes none. */
static libxsmm_smmfunction kernel(int w, int K, int ldx, int ldc, float beta)
{
    float one = 1.0f;
    int n = KROWS, fl = LIBXSMM_GEMM_FLAGS('N', 'N'), pf = LIBXSMM_GEMM_PREFETCH_AL2;
    return libxsmm_smmdispatch(w, n, K, &w, &ldx, &ldc, &one, &beta, &fl, &pf);
}

/* A thread's scratch of KROWS rows of X (ldx apart) then KROWS of C (ldc apart), kept for the
 * thread's next partial tiles and freed when it exits. Only the first K floats of an X row
 * and N of a C row are written; rows past a tile's are whatever an earlier tile left (zeros
 * at first): they feed only rows of C that are not copied back, since a row of C reads no
 * other row of X. */
typedef struct scratch_s {
    size_t cap; /* floats of f */
    float f[];
} scratch_t;

static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static pthread_key_t scratch_key;
static bool scratch_ok;

static void scratch_key_init(void)
{
    scratch_ok = pthread_key_create(&scratch_key, free) == 0;
}

/* The calling thread's scratch of at least n floats, or NULL (no memory). */
static float *scratch(size_t n)
{
    pthread_once(&scratch_once, scratch_key_init);
    if (!scratch_ok)
        return NULL;
    scratch_t *s = pthread_getspecific(scratch_key);
    if (s && s->cap >= n)
        return s->f;
    scratch_t *t = calloc(1, sizeof *t + n * sizeof(float));
    if (!t || pthread_setspecific(scratch_key, t) != 0) {
        free(t);
        return NULL;
    }
    free(s);
    t->cap = n;
    return t->f;
}

/* C[M, N] (+)= X[M, K] P on the kernels f (full panels) and fr (the last, narrower one);
 * false, having done nothing, if M is not a multiple of KROWS and the thread has no scratch
 * (no memory). */
static bool mm_kernels(libxsmm_smmfunction f, libxsmm_smmfunction fr, int M, int N, int K,
                       const float *X, int ldx, const float *P, float beta, float *C, int ldc)
{
    int whole = M - M % KROWS, part = M - whole;
    float *sx = NULL, *sc = NULL;
    if (part) {
        size_t xs = (size_t)KROWS * (size_t)ldx;
        sx = scratch(xs + (size_t)KROWS * (size_t)ldc);
        if (!sx)
            return false;
        sc = sx + xs;
        for (int i = 0; i < part; i++) {
            size_t r = (size_t)(whole + i);
            memcpy(sx + (size_t)i * ldx, X + r * ldx, (size_t)K * sizeof(float));
            if (beta != 0.0f)
                memcpy(sc + (size_t)i * ldc, C + r * ldc, (size_t)N * sizeof(float));
        }
    }
    size_t pstride = (size_t)MT__RNN_XSMM_MB * (size_t)K;
    for (int j = 0; j * MT__RNN_XSMM_MB < N; j++) {
        const float *p = P + (size_t)j * pstride;
        const float *pn = (j + 1) * MT__RNN_XSMM_MB < N ? p + pstride : P;
        libxsmm_smmfunction k = N - j * MT__RNN_XSMM_MB >= MT__RNN_XSMM_MB ? f : fr;
        size_t c0 = (size_t)j * MT__RNN_XSMM_MB;
        for (int i0 = 0; i0 < whole; i0 += KROWS) {
            const float *x = X + (size_t)i0 * ldx;
            float *c = C + (size_t)i0 * ldc + c0;
            k(p, x, c, pn, x, c);
        }
        if (part)
            k(p, sx, sc + c0, pn, sx, sc + c0);
    }
    for (int i = 0; i < part; i++)
        memcpy(C + (size_t)(whole + i) * ldc, sc + (size_t)i * ldc, (size_t)N * sizeof(float));
    return true;
}
#endif

void mt__rnn_xsmm_mm(int M, int N, int K, const float *X, int ldx, const float *P, float beta,
                     float *C, int ldc)
{
    mt_assert(beta == 0.0f || beta == 1.0f);
    if (M <= 0 || N <= 0)
        return;
    int full = N / MT__RNN_XSMM_MB, rem = N % MT__RNN_XSMM_MB;
#if MT_HAVE_XSMM
    /* The kernels depend on the panels, K, the strides and beta, never on M: a product runs
     * on them for all its rows or, where libxsmm has one of them not, on the plain loops for
     * all its rows. Without its scratch a thread falls to the plain loops too: the right
     * values, but not the kernels' bits. */
    libxsmm_smmfunction f = full ? kernel(MT__RNN_XSMM_MB, K, ldx, ldc, beta) : NULL;
    libxsmm_smmfunction fr = rem ? kernel(rem, K, ldx, ldc, beta) : NULL;
    if ((!full || f) && (!rem || fr) && mm_kernels(f, fr, M, N, K, X, ldx, P, beta, C, ldc))
        return;
#endif
    /* The plain loops compute a row alone: the same bits whatever rows are beside it. */
    size_t pstride = (size_t)MT__RNN_XSMM_MB * (size_t)K;
    for (int j = 0; j * MT__RNN_XSMM_MB < N; j++)
        panel_ref(M, j < full ? MT__RNN_XSMM_MB : rem, K, X, ldx, P + (size_t)j * pstride, beta,
                  C + (size_t)j * MT__RNN_XSMM_MB, ldc);
}

void mt__rnn_xsmm_pack_panels(float *dst, const float *src, int rs, int cs, int K, int N, int p0,
                              int p1)
{
    int c0 = p0 * MT__RNN_XSMM_MB, c1 = p1 * MT__RNN_XSMM_MB < N ? p1 * MT__RNN_XSMM_MB : N;
    if (c0 < c1)
        mt__rnn_xsmm_pack(dst + (size_t)c0 * (size_t)K, src + (size_t)c0 * (size_t)cs, rs, cs, K,
                          c1 - c0);
}

typedef struct par_s {
    int M, N, K, ldx, ldc, rs, cs;
    const float *X, *P, *src;
    float beta;
    float *C, *dst;
} par_t;

static void pack_tile(void *arg, int i)
{
    const par_t *p = arg;
    mt__rnn_xsmm_pack_panels(p->dst, p->src, p->rs, p->cs, p->K, p->N, i, i + 1);
}

void mt__rnn_xsmm_pack_par(const mt__rnn_shape_t *s, float *dst, const float *src, int rs, int cs,
                           int K, int N)
{
    par_t p = {.K = K, .N = N, .rs = rs, .cs = cs, .src = src, .dst = dst};
    mt__rnn_tiles_par(s, (N + MT__RNN_XSMM_MB - 1) / MT__RNN_XSMM_MB, pack_tile, &p);
}

int mt__rnn_xsmm_tiles(int M)
{
    return (M + ROWS - 1) / ROWS;
}

void mt__rnn_xsmm_mm_tile(int i, int M, int N, int K, const float *X, int ldx, const float *P,
                          float beta, float *C, int ldc)
{
    int i0 = i * ROWS, n = M - i0 < ROWS ? M - i0 : ROWS;
    mt__rnn_xsmm_mm(n, N, K, X + (size_t)i0 * (size_t)ldx, ldx, P, beta,
                    C + (size_t)i0 * (size_t)ldc, ldc);
}

static void mm_tile(void *arg, int i)
{
    const par_t *p = arg;
    mt__rnn_xsmm_mm_tile(i, p->M, p->N, p->K, p->X, p->ldx, p->P, p->beta, p->C, p->ldc);
}

void mt__rnn_xsmm_mm_par(const mt__rnn_shape_t *s, int M, int N, int K, const float *X, int ldx,
                         const float *P, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    par_t p = {
        .M = M, .N = N, .K = K, .ldx = ldx, .ldc = ldc, .X = X, .P = P, .beta = beta, .C = C};
    mt__rnn_tiles_par(s, mt__rnn_xsmm_tiles(M), mm_tile, &p);
}
