/* Small-GEMM kernels for the per-step products of the cpu path: libxsmm's JIT kernels over a
 * right operand packed in column panels (docs/blas.md: on an AMD EPYC they ran the 32-row
 * recurrent and dh products at 84-91 GFLOP/s where oneDNN's sgemm ran 72-88 on the same
 * data, and libxsmm on the unpacked matrix, rows 1024 floats apart, 33-40).
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

enum { ROWS = 32 }; /* rows of X per kernel call: kernels of at most 32 x 32 x K */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool usable;
static char info[96] = "libxsmm not built in";

static void probe(void)
{
#if MT_HAVE_XSMM
    /* libxsmm_init sets OMP_PROC_BIND=TRUE when no affinity variable is set ("autopin").
     * libgomp, loaded later with oneDNN, then pinned the calling thread to one core, and
     * the second half of the step loops, a thread it creates, inherited that core: both
     * halves ran on one core (docs/blas.md). The program's setting is put back. */
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

#if MT_HAVE_XSMM
/* The kernel of a panel w wide over n rows (column-major: C[w x n] = P[w x K] X[K x n]), with
 * prefetch of the next panel into L2; NULL if libxsmm makes none. */
static libxsmm_smmfunction kernel(int w, int n, int K, int ldx, int ldc, float beta)
{
    float one = 1.0f;
    int fl = LIBXSMM_GEMM_FLAGS('N', 'N'), pf = LIBXSMM_GEMM_PREFETCH_AL2;
    return libxsmm_smmdispatch(w, n, K, &w, &ldx, &ldc, &one, &beta, &fl, &pf);
}
#endif

void mt__rnn_xsmm_mm(int M, int N, int K, const float *X, int ldx, const float *P, float beta,
                     float *C, int ldc)
{
    mt_assert(beta == 0.0f || beta == 1.0f);
    int full = N / MT__RNN_XSMM_MB, rem = N % MT__RNN_XSMM_MB;
    size_t pstride = (size_t)MT__RNN_XSMM_MB * (size_t)K;
    for (int i0 = 0; i0 < M; i0 += ROWS) {
        int n = M - i0 < ROWS ? M - i0 : ROWS;
        const float *x = X + (size_t)i0 * ldx;
        float *c = C + (size_t)i0 * ldc;
#if MT_HAVE_XSMM
        libxsmm_smmfunction f = full ? kernel(MT__RNN_XSMM_MB, n, K, ldx, ldc, beta) : NULL;
        libxsmm_smmfunction fr = rem ? kernel(rem, n, K, ldx, ldc, beta) : NULL;
        for (int j = 0; j < full; j++) {
            const float *p = P + (size_t)j * pstride, *pn = j + 1 < full ? p + pstride : P;
            float *cj = c + (size_t)j * MT__RNN_XSMM_MB;
            if (f)
                f(p, x, cj, pn, x, cj);
            else
                panel_ref(n, MT__RNN_XSMM_MB, K, x, ldx, p, beta, cj, ldc);
        }
        if (rem) {
            const float *p = P + (size_t)full * pstride;
            float *cj = c + (size_t)full * MT__RNN_XSMM_MB;
            if (fr)
                fr(p, x, cj, P, x, cj);
            else
                panel_ref(n, rem, K, x, ldx, p, beta, cj, ldc);
        }
#else
        for (int j = 0; j * MT__RNN_XSMM_MB < N; j++)
            panel_ref(n, j < full ? MT__RNN_XSMM_MB : rem, K, x, ldx, P + (size_t)j * pstride, beta,
                      c + (size_t)j * MT__RNN_XSMM_MB, ldc);
#endif
    }
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
