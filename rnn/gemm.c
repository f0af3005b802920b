/* The cpu path's GEMM seam: every matrix product of the kernels goes through
 * mt__rnn_sgemm, which runs on one of three Debian libraries (docs/rnn-cpu.md, GEMM
 * libraries and their selection):
 *   - "cblas": the CBLAS the library links (OpenBLAS in the Debian build);
 *   - "blis":  BLIS (libblis.so.4), its typed API bli_sgemm with row and column strides;
 *   - "dnnl":  oneDNN (libdnnl.so.2), dnnl_sgemm, JIT kernels for the CPU's ISA.
 * BLIS and oneDNN are loaded with dlopen(RTLD_LOCAL) on first use, so neither is a build
 * dependency, and only symbols unique to them are used (BLIS's own cblas_sgemm would bind
 * its internal BLAS calls to the linked OpenBLAS, which exports the same names). The
 * libraries are process-wide; a module holds a pointer to the one it computes with. */
#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rnn/internal.h"

/* Row-major C = alpha op(A) op(B) + beta C. */
typedef void (*sgemm_fn)(const mt__rnn_gemm_t *g, bool ta, bool tb, int M, int N, int K,
                         float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                         float *C, int ldc);

struct mt__rnn_gemm_s {
    const char *name; /* "cblas", "blis", "dnnl" */
    sgemm_fn run;
    void *lib; /* dlopen handle, NULL for cblas */
    void *fn;  /* the library's entry point */
    void *thr; /* its thread-count setter, or NULL */
    int thr_kind;
    char info[160]; /* library, version, kernel (what the loaders write) */
    /* Per level of the cell loops (mt__rnn_isa_e): the same, and that level's name (isa.c);
     * then also the per-step products' libxsmm (xsmm.c). */
    char info_c[MT__RNN_ISA_AVX512 + 1][192];
    char info_x[MT__RNN_ISA_AVX512 + 1][320];
};

/* ---- cblas (linked) ---- */

static void run_cblas(const mt__rnn_gemm_t *g, bool ta, bool tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc)
{
    (void)g;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- BLIS ---- */

typedef void (*bli_sgemm_fn)(int transa, int transb, int64_t m, int64_t n, int64_t k, float *alpha,
                             float *a, int64_t rsa, int64_t csa, float *b, int64_t rsb, int64_t csb,
                             float *beta, float *c, int64_t rsc, int64_t csc);
enum { BLI_NO_TRANSPOSE = 0, BLI_TRANSPOSE = 8 }; /* blis.h: BLIS_TRANS_BIT = 1 << 3 */

static void run_blis(const mt__rnn_gemm_t *g, bool ta, bool tb, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta, float *C,
                     int ldc)
{
    /* A row-major matrix of leading dimension ld has row stride ld and column stride 1;
     * BLIS applies the transposition to the stored matrix. */
    ((bli_sgemm_fn)g->fn)(ta ? BLI_TRANSPOSE : BLI_NO_TRANSPOSE,
                          tb ? BLI_TRANSPOSE : BLI_NO_TRANSPOSE, M, N, K, &alpha, (float *)A, lda,
                          1, (float *)B, ldb, 1, &beta, C, ldc, 1);
}

/* ---- oneDNN ---- */

typedef int (*dnnl_sgemm_fn)(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha,
                             const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                             float *C, int64_t ldc);

static void run_dnnl(const mt__rnn_gemm_t *g, bool ta, bool tb, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta, float *C,
                     int ldc)
{
    /* dnnl_sgemm is row-major. It fails only on bad arguments, which the kernels never
     * pass (the same ones go to CBLAS in the tests). */
    (void)((dnnl_sgemm_fn)g->fn)(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb,
                                 beta, C, ldc);
}

/* ---- the table ---- */

enum { THR_NONE = 0, THR_OPENBLAS, THR_BLIS, THR_OMP };

static mt__rnn_gemm_t gemms[3] = {
    {.name = "cblas", .run = run_cblas},
    {.name = "blis", .run = run_blis},
    {.name = "dnnl", .run = run_dnnl},
};
static int loaded[3]; /* 0 not tried, 1 usable, -1 not available */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void describe_cblas(mt__rnn_gemm_t *g)
{
    typedef char *(*str_fn)(void);
    str_fn core = (str_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "openblas_get_corename");
    str_fn cfg = (str_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "openblas_get_config");
    g->thr = dlsym(RTLD_DEFAULT, "openblas_set_num_threads");
    g->thr_kind = g->thr ? THR_OPENBLAS : THR_NONE;
    if (core)
        snprintf(g->info, sizeof g->info, "%s, kernel %s", cfg ? cfg() : "OpenBLAS", core());
    else
        snprintf(g->info, sizeof g->info, "the linked CBLAS");
}

static int load_blis(mt__rnn_gemm_t *g)
{
    g->lib = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!g->lib)
        return -1;
    g->fn = dlsym(g->lib, "bli_sgemm");
    g->thr = dlsym(g->lib, "bli_thread_set_num_threads");
    g->thr_kind = THR_BLIS;
    typedef char *(*str_fn)(void);
    typedef int (*id_fn)(void);
    typedef char *(*arch_fn)(int);
    str_fn ver = (str_fn)(uintptr_t)dlsym(g->lib, "bli_info_get_version_str");
    id_fn id = (id_fn)(uintptr_t)dlsym(g->lib, "bli_arch_query_id");
    arch_fn arch = (arch_fn)(uintptr_t)dlsym(g->lib, "bli_arch_string");
    snprintf(g->info, sizeof g->info, "BLIS %s, kernel %s", ver ? ver() : "?",
             id && arch ? arch(id()) : "?");
    return g->fn ? 1 : -1;
}

static int load_dnnl(mt__rnn_gemm_t *g)
{
    /* Its OpenMP team spins between calls unless the program set OMP_WAIT_POLICY=PASSIVE
     * before libgomp starts. That is the program's environment to
     * set, not ours: see the gemm field in rnn.h. */
    g->lib = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!g->lib)
        return -1;
    g->fn = dlsym(g->lib, "dnnl_sgemm");
    /* Debian's oneDNN runs on OpenMP: its thread count is the OpenMP runtime's. */
    g->thr = dlsym(g->lib, "omp_set_num_threads");
    g->thr_kind = g->thr ? THR_OMP : THR_NONE;
    typedef struct {
        int major, minor, patch;
        const char *hash;
        unsigned cpu_runtime, gpu_runtime;
    } dnnl_version_t;
    typedef const dnnl_version_t *(*ver_fn)(void);
    typedef int (*isa_fn)(void);
    ver_fn ver = (ver_fn)(uintptr_t)dlsym(g->lib, "dnnl_version");
    isa_fn isa = (isa_fn)(uintptr_t)dlsym(g->lib, "dnnl_get_effective_cpu_isa");
    const dnnl_version_t *v = ver ? ver() : NULL;
    snprintf(g->info, sizeof g->info, "oneDNN %d.%d.%d, JIT for cpu isa 0x%x", v ? v->major : 0,
             v ? v->minor : 0, v ? v->patch : 0, isa ? (unsigned)isa() : 0u);
    return g->fn ? 1 : -1;
}

static int index_of(const char *name)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(gemms[i].name, name) == 0)
            return i;
    return -1;
}

int mt__rnn_gemm_get(const char *name, const mt__rnn_gemm_t **out)
{
    *out = NULL;
    int i = index_of(name);
    if (i < 0)
        return MT_EINVAL;
    pthread_mutex_lock(&lock);
    if (loaded[i] == 0) {
        if (i == 0) {
            describe_cblas(&gemms[0]);
            loaded[0] = 1;
        } else {
            loaded[i] = i == 1 ? load_blis(&gemms[1]) : load_dnnl(&gemms[2]);
        }
    }
    int ok = loaded[i] > 0;
    bool fill = ok && !gemms[i].info_x[0][0];
    for (int l = 0; fill && l <= MT__RNN_ISA_AVX512; l++) {
        mt__rnn_gemm_t *g = &gemms[i];
        snprintf(g->info_c[l], sizeof g->info_c[l], "%s; cell loops %s", g->info,
                 mt__rnn_isa_name(l));
        snprintf(g->info_x[l], sizeof g->info_x[l], "%s; per-step products on %s", g->info_c[l],
                 mt__rnn_xsmm_info());
    }
    pthread_mutex_unlock(&lock);
    if (!ok)
        return MT_ENOTSUP;
    *out = &gemms[i];
    return 0;
}

const char *mt__rnn_gemm_name(const mt__rnn_gemm_t *g)
{
    return g ? g->name : "cblas";
}

const char *mt__rnn_gemm_info(const mt__rnn_gemm_t *g, bool xsmm)
{
    if (!g)
        return "the linked CBLAS";
    int l = mt__rnn_isa();
    return xsmm ? g->info_x[l] : g->info_c[l];
}

int mt__rnn_gemm_set_threads(const mt__rnn_gemm_t *g, int n)
{
    if (!g || n < 1)
        return MT_EINVAL;
    switch (g->thr_kind) {
    case THR_OPENBLAS:
        ((void (*)(int))(uintptr_t)g->thr)(n);
        return 0;
    case THR_BLIS:
        ((void (*)(int64_t))(uintptr_t)g->thr)(n);
        return 0;
    case THR_OMP:
        ((void (*)(int))(uintptr_t)g->thr)(n);
        return 0;
    default:
        return MT_ENOTSUP;
    }
}

void mt__rnn_sgemm(const mt__rnn_gemm_t *g, bool ta, bool tb, int M, int N, int K, float alpha,
                   const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (!g)
        run_cblas(NULL, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
        g->run(g, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

bool mt__rnn_gemm_halves(const mt__rnn_gemm_t *g)
{
    /* OpenBLAS too: every large product of a pass runs in parts (mt__rnn_sgemm_par), so the
     * pass makes no multi-threaded call of its own whose workers would spin beside the
     * parts. */
    return g && g->thr_kind != THR_NONE;
}

int mt__rnn_gemm_set_threads_here(const mt__rnn_gemm_t *g, int n)
{
    /* A thread starts from OMP_NUM_THREADS (or the core count): one team per part. The other
     * libraries' counts are global, set by the caller. */
    return g && g->thr_kind == THR_OMP ? mt__rnn_gemm_set_threads(g, n) : 0;
}
