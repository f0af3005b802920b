/* Private interface of the RNN engine, shared by its files and by the compute paths.
 *
 * The seam: a module (mt_rnn_s) holds the descriptors, the flat weight and gradient
 * buffers and the parameter views; it knows nothing of how a cell is computed. A compute
 * path (mt__rnn_path_t: "cpu" here, "cudnn" on a GPU build) implements forward, backward and
 * the sizes of its reserve and workspace. module.c allocates those from the caching
 * allocator with the right tags and dispatches through m->path; params.c compacts rebound
 * weights for a call; lifecycle.c creates the module and warmup.c warms it up. */
#ifndef MT_RNN_INTERNAL_H
#define MT_RNN_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "memtrace/host.h"
#include "memtrace/rnn.h"

/* The shape of a module, everything the layout and the kernels need.
 * Invariants: gates = 4 (LSTM), 3 (GRU), 1 (RNN); dirs in {1, 2}; layers, input, hidden
 * >= 1. */
/* A GEMM library of the cpu path (gemm.c). */
typedef struct mt__rnn_gemm_s mt__rnn_gemm_t;

typedef struct mt__rnn_shape_s {
    int mode;      /* mt_rnn_mode_e */
    int gates;     /* g */
    int input;     /* input_size of layer 0 */
    int hidden;    /* H */
    int layers;    /* L */
    int dirs;      /* D */
    bool bias;     /* the layout holds 2*g*H bias floats per pseudo-layer */
    int chunk;     /* cpu path: time steps per chunk (0 = MT__RNN_CHUNK); set by the module */
    float dropout; /* on the outputs of layers 0 .. L-2 in training, in [0, 1); 0 = none */
    const mt__rnn_gemm_t *gemm; /* cpu path: the kernels' GEMM library; NULL = linked CBLAS */
    int threads; /* cpu path: mt_rnn_set_gemm_threads's count (0 = not set: one thread) */
    bool xsmm;   /* cpu path: per-step products on libxsmm over packed panels (xsmm.c) */
    /* cpu path: the module's worker threads (par.c), owned by the module: made when
     * mt_rnn_set_gemm_threads asks for two or more (one fewer than the parts), joined by
     * mt_rnn_destroy; NULL = the other parts of a job on threads of their own */
    struct mt__rnn_par_s *par;
} mt__rnn_shape_t;

/* ---- the GEMM seam (gemm.c) ---- */

/* The library called name ("cblas", "blis", "dnnl"), loaded on first use: MT_EINVAL for
 * another name, MT_ENOTSUP if it cannot be loaded here. Process-wide, never unloaded. */
int mt__rnn_gemm_get(const char *name, const mt__rnn_gemm_t **out);
const char *mt__rnn_gemm_name(const mt__rnn_gemm_t *g);
/* Library, version and kernel (or ISA), e.g. "OpenBLAS ..., kernel SkylakeX"; with xsmm,
 * followed by the libxsmm the per-step products run on. */
const char *mt__rnn_gemm_info(const mt__rnn_gemm_t *g, bool xsmm);
/* The library's thread count (process-wide for that library). */
int mt__rnn_gemm_set_threads(const mt__rnn_gemm_t *g, int n);
/* Whether the library's thread count can be set for each part of mt__rnn_parts_par: oneDNN's
 * per calling thread, BLIS's and OpenBLAS's for the process; not an unknown CBLAS. */
bool mt__rnn_gemm_halves(const mt__rnn_gemm_t *g);
/* The count for the calling thread where the library keeps one per thread (oneDNN); 0. */
int mt__rnn_gemm_set_threads_here(const mt__rnn_gemm_t *g, int n);

/* ---- threads (par.c; docs/rnn-cpu.md, Threads) ---- */

/* The most parts a job is cut into (the caller and up to 7 workers). */
#define MT__RNN_PARTS_MAX 8

/* The module's worker threads, workers of them (1 .. MT__RNN_PARTS_MAX - 1), started here and
 * joined by mt__rnn_par_destroy. *out is new. */
typedef struct mt__rnn_par_s mt__rnn_par_t;
int mt__rnn_par_create(mt__rnn_par_t **out, int workers);
/* Stops and joins the workers (in a forked child, where they do not run, only frees them).
 * Sets *p = NULL. */
void mt__rnn_par_destroy(mt__rnn_par_t **p);
/* The number of workers (0 for NULL). */
int mt__rnn_par_workers(const mt__rnn_par_t *p);
/* The parts a job of s is cut into: 1 below two threads, else min(s->threads,
 * MT__RNN_PARTS_MAX). */
int mt__rnn_par_parts(const mt__rnn_shape_t *s);
/* Runs fn(arg, bound[i], bound[i + 1]) for each non-empty part i < np (bound non-decreasing),
 * the first on the calling thread and the others on s->par's workers (or threads of their own
 * when there are too few workers or they serve another caller), all with the library at one
 * thread, when s->threads >= 2, two or more parts are non-empty and mt__rnn_gemm_halves(s->gemm)
 * (back to s->threads after every part); else fn(arg, bound[0], bound[np]) on the caller. The
 * step loops run the batch's rows in parts this way: each sequence's recurrence is independent
 * of the others', so the parts never wait for each other. work (NULL or np values, any unit):
 * with np = 2, the two parts' times update mt__rnn_par_share. */
void mt__rnn_parts_par(const mt__rnn_shape_t *s, const int *bound, int np, const double *work,
                       void (*fn)(void *, int, int), void *arg);
/* mt__rnn_parts_par over items [0, n) in mt__rnn_par_parts(s) (at most n) equal parts. */
void mt__rnn_even_par(const mt__rnn_shape_t *s, int n, void (*fn)(void *, int, int), void *arg);
/* mt__rnn_parts_par over two parts [0, split) and [split, nb); _w with their work w0, w1. */
void mt__rnn_rows_par(const mt__rnn_shape_t *s, int split, int nb, void (*fn)(void *, int, int),
                      void *arg);
void mt__rnn_rows_par_w(const mt__rnn_shape_t *s, int split, int nb, double w0, double w1,
                        void (*fn)(void *, int, int), void *arg);
/* The share of a two-part job's work the caller should take for both parts to end together,
 * from the speeds recent two-part jobs with known work measured (1/2 to begin with). Tests
 * set it; frozen, jobs do not change it. */
double mt__rnn_par_share(void);
void mt__rnn_par_set_share(double f, bool freeze);
/* Parts of work w0 and w1 took tc and tw ns on the caller and on the worker: the share moves
 * 1/4 of the way to the caller's part of the speed, within [1/5, 4/5]; jobs under 200 us, or
 * with a part of no work or no time, leave it. */
void mt__rnn_par_learn(double w0, double w1, uint64_t tc, uint64_t tw);
/* fn(arg, i) for each tile 0 <= i < n, taken in turn by the threads of mt__rnn_parts_par (by
 * the caller alone where that runs one): a core the host runs slower takes fewer tiles.
 * The tiles are fixed by n, so the results are the same whichever thread runs a tile. */
void mt__rnn_tiles_par(const mt__rnn_shape_t *s, int n, void (*fn)(void *, int), void *arg);
/* mt__rnn_sgemm on s->gemm, C split in mt__rnn_even_par's parts of its rows (M >= N) or
 * columns, 32 at a time; else one call with the library's own threads. */
void mt__rnn_sgemm_par(const mt__rnn_shape_t *s, bool ta, bool tb, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C,
                       int ldc);
/* Half 0 or 1 of the product, on the calling thread: at two threads the same calls, so the
 * same bits, as mt__rnn_sgemm_par's parts. */
void mt__rnn_sgemm_half(const mt__rnn_shape_t *s, int half, bool ta, bool tb, int M, int N, int K,
                        float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                        float *C, int ldc);
/* Row-major C[M, N] = alpha op(A) op(B) + beta C; g NULL = the linked CBLAS. */
void mt__rnn_sgemm(const mt__rnn_gemm_t *g, bool ta, bool tb, int M, int N, int K, float alpha,
                   const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* ---- small-GEMM kernels on packed panels (xsmm.c) ----
 *
 * The per-step products (32 rows) read a weight matrix P[K, N] packed in column panels of
 * MT__RNN_XSMM_MB: panel j (columns [j*MB, j*MB + w), w = min(MB, N - j*MB)) starts at
 * j*MB*K floats, its row k at k*w. Exactly K*N floats, no padding. */
#define MT__RNN_XSMM_MB 32
/* Built with libxsmm, the CPU has AVX2 and its JIT works (probed once). */
bool mt__rnn_xsmm_available(void);
/* Available and not switched off by MEMTRACE_RNN_XSMM=0: what a new shape takes. */
bool mt__rnn_xsmm_wanted(void);
/* "libxsmm 1.17..., JIT for hsw", or why it is not used. */
const char *mt__rnn_xsmm_info(void);
/* dst = the packed form of P[k, n] = src[k*rs + n*cs] (P = src: rs = row stride, cs = 1;
 * P = src^T: rs = 1, cs = src's row stride). */
void mt__rnn_xsmm_pack(float *dst, const float *src, int rs, int cs, int K, int N);
/* Row-major C[M, N] = X[M, K] P + beta C, P packed (beta 0 or 1). On libxsmm's kernels, or
 * plain loops where it has none. A row of C comes out the same bits whatever M is and
 * wherever the row sits in X: the step loops' split may fall anywhere (xsmm.c). */
void mt__rnn_xsmm_mm(int M, int N, int K, const float *X, int ldx, const float *P, float beta,
                     float *C, int ldc);
/* mt__rnn_xsmm_pack of panels [p0, p1) alone (the same floats of dst as the whole). */
void mt__rnn_xsmm_pack_panels(float *dst, const float *src, int rs, int cs, int K, int N, int p0,
                              int p1);
/* mt__rnn_xsmm_mm's row tiles: their count for M rows, and tile i alone (rows [32 i, 32 i + 32)
 * of C, the same call mt__rnn_xsmm_mm_par makes for it). */
int mt__rnn_xsmm_tiles(int M);
void mt__rnn_xsmm_mm_tile(int i, int M, int N, int K, const float *X, int ldx, const float *P,
                          float beta, float *C, int ldc);
/* mt__rnn_xsmm_pack and mt__rnn_xsmm_mm in tiles of mt__rnn_tiles_par: panels, then 32 rows of
 * C, each the same call at one thread or two (the large products of a pass). */
void mt__rnn_xsmm_pack_par(const mt__rnn_shape_t *s, float *dst, const float *src, int rs, int cs,
                           int K, int N);
void mt__rnn_xsmm_mm_par(const mt__rnn_shape_t *s, int M, int N, int K, const float *X, int ldx,
                         const float *P, float beta, float *C, int ldc);

/* ---- the cell loops' instruction set (isa.c; docs/rnn-cpu.md, ISA levels) ----
 *
 * The cell loops are compiled for x86-64-v4 (AVX-512) and v3 (AVX2 and FMA) too, so that they
 * run 16 or 8 lanes wide where the CPU can, their polynomials as fused multiply-adds (rnn/ is
 * built with -ffp-contract=fast). One level is chosen once per process: the highest the CPU
 * runs, capped by $MEMTRACE_CPU_ISA (avx512, avx2, baseline), so that a host with AVX-512
 * tests the lower builds too. GCC on x86-64 only; elsewhere the one default build. */
typedef enum mt__rnn_isa_e {
    MT__RNN_ISA_BASELINE = 0, /* the build's default target (x86-64: SSE2) */
    MT__RNN_ISA_AVX2 = 1,     /* x86-64-v3 */
    MT__RNN_ISA_AVX512 = 2,   /* x86-64-v4 */
} mt__rnn_isa_e;

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MT__RNN_ISA_X86 1
#else
#define MT__RNN_ISA_X86 0
#endif

/* "baseline", "avx2", "avx512" ("unknown" for another value). */
const char *mt__rnn_isa_name(int level);
/* The highest level this CPU runs (baseline where the build has one level). */
int mt__rnn_isa_cpu(void);
/* $MEMTRACE_CPU_ISA as a cap, read now: 0 with *cap the level it names (avx512 when unset or
 * empty), or MT_EINVAL for another value (*cap avx512). */
int mt__rnn_isa_from_env(int *cap);
/* The level in use: min(mt__rnn_isa_cpu(), the cap), chosen on the first call of any of
 * these (a bad $MEMTRACE_CPU_ISA caps nothing: mt__rnn_isa_check refuses it). */
int mt__rnn_isa(void);
/* 0, or MT_EINVAL after logging, when $MEMTRACE_CPU_ISA was unknown at the choice (module
 * creation on the cpu path fails then). */
int mt__rnn_isa_check(mt_log_cb log, void *ud);
/* Tests: sets the level in use, at most mt__rnn_isa_cpu(); returns the level set. */
int mt__rnn_isa_set(int level);

/* Defines static void name params, which runs name##_body args (a MT__RNN_ISA_BODY function)
 * compiled for the level in use. */
#define MT__RNN_ISA_BODY static inline __attribute__((always_inline))
#if MT__RNN_ISA_X86
#define MT__RNN_ISA_DISPATCH(name, params, args)                                                   \
    __attribute__((target("arch=x86-64-v4"))) static void name##_v4 params                         \
    {                                                                                              \
        name##_body args;                                                                          \
    }                                                                                              \
    __attribute__((target("arch=x86-64-v3"))) static void name##_v3 params                         \
    {                                                                                              \
        name##_body args;                                                                          \
    }                                                                                              \
    static void name##_v1 params                                                                   \
    {                                                                                              \
        name##_body args;                                                                          \
    }                                                                                              \
    static void name params                                                                        \
    {                                                                                              \
        switch (mt__rnn_isa()) {                                                                   \
        case MT__RNN_ISA_AVX512:                                                                   \
            name##_v4 args;                                                                        \
            break;                                                                                 \
        case MT__RNN_ISA_AVX2:                                                                     \
            name##_v3 args;                                                                        \
            break;                                                                                 \
        default:                                                                                   \
            name##_v1 args;                                                                        \
        }                                                                                          \
    }
#else
#define MT__RNN_ISA_DISPATCH(name, params, args)                                                   \
    static void name params                                                                        \
    {                                                                                              \
        name##_body args;                                                                          \
    }
#endif

/* e^v without a libm call or a branch, so the cell loops vectorize (`#pragma omp simd`,
 * -fopenmp-simd): v clamped to [-87, 88], v = n ln2 + r with |r| <= ln2/2 (n rounded by the
 * 1.5 x 2^23 trick, ln2 in two parts), Cephes' degree-5 polynomial for e^r, 2^n put into the
 * exponent bits. Relative error about 2e-7 (libm's expf: 1e-7); the golden tests against
 * PyTorch hold it. */
static inline float mt__rnn_exp(float v)
{
    v = v > 88.0f ? 88.0f : v;
    v = v < -87.0f ? -87.0f : v;
    float fn = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = v - fn * 0.693359375f - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)fn + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline float mt__rnn_sigmoid(float v)
{
    return 1.0f / (1.0f + mt__rnn_exp(-v));
}

/* tanh through one exp: libm's tanhf goes through expm1f and does not vectorize
 * (docs/rnn-cpu.md, Cell loops). Absolute error ~2e-7 (the cancellation near 0 is absolute, not
 * relative), far below what float training notices; the gradient checks run against a double
 * reference. */
static inline float mt__rnn_tanh(float v)
{
    return 2.0f / (1.0f + mt__rnn_exp(-2.0f * v)) - 1.0f;
}

/* ---- workspace layouts (layout.c; docs/rnn-cpu.md, Workspace layouts) ----
 *
 * Each workspace is described once, by a layout function that places its regions one after
 * another and returns them with the total; the size functions return the total and the
 * kernels carve base + off. Units are the workspace's own (floats on the cpu path, bytes on
 * the cuDNN path and for the step workspace). */
typedef struct mt__rnn_region_s {
    size_t off;  /* from the workspace's start, a multiple of the layout's alignment */
    size_t size; /* 0 = the region is absent */
} mt__rnn_region_t;

/* Places a region of size units at *end rounded up to align (a power of two), and moves
 * *end past it. */
static inline mt__rnn_region_t mt__rnn_place(size_t *end, size_t size, size_t align)
{
    mt__rnn_region_t r = {(*end + align - 1) & ~(align - 1), size};
    *end = r.off + size;
    return r;
}

/* The regions r[0 .. n) are each a multiple of align from the start, inside [0, total), and
 * pairwise disjoint (empty ones overlap nothing). */
bool mt__rnn_regions_valid(const mt__rnn_region_t *r, int n, size_t total, size_t align);

/* ---- layout (layout.c) ---- */

int mt__rnn_shape_init(mt__rnn_shape_t *s, const mt_rnn_cfg_t *cfg);
/* Input width of layer l: input for l = 0, D*H above. */
int mt__rnn_layer_in(const mt__rnn_shape_t *s, int layer);
/* Floats of pseudo-layer (layer, dir): g*H*(in + H) + (bias ? 2*g*H : 0). */
size_t mt__rnn_pseudo_floats(const mt__rnn_shape_t *s, int layer);
/* Offset in floats of pseudo-layer (layer, dir) in the flat buffer. */
size_t mt__rnn_pseudo_offset(const mt__rnn_shape_t *s, int layer, int dir);
/* Total floats of the flat buffer. */
size_t mt__rnn_weight_floats(const mt__rnn_shape_t *s);

/* Pointers to the four parts of one pseudo-layer inside a flat buffer (base). Biases are
 * NULL when the module has none. */
typedef struct mt__rnn_mats_s {
    float *w;  /* [g*H, in] */
    float *r;  /* [g*H, H] */
    float *bw; /* [g*H] */
    float *br; /* [g*H] */
} mt__rnn_mats_t;
mt__rnn_mats_t mt__rnn_mats(const mt__rnn_shape_t *s, float *base, int layer, int dir);

/* One parameter view; the names live in the module's name table. */
typedef struct mt__rnn_view_s {
    char name[40];
    int kind; /* mt_rnn_param_kind_e */
    int layer;
    int dir;
    size_t offset; /* floats */
    int rows;
    int cols;
    float *data; /* current binding; flat + offset when not rebound */
} mt__rnn_view_t;

/* Number of views: L*D*(bias ? 4 : 2). */
size_t mt__rnn_view_count(const mt__rnn_shape_t *s);
/* Fills views[0 .. count) in PyTorch's order with data = flat + offset. */
void mt__rnn_views_init(const mt__rnn_shape_t *s, mt__rnn_view_t *views, float *flat);

/* Activation accounting (the formulas are documented at mt_rnn_act_t). */
void mt__rnn_activation(const mt__rnn_shape_t *s, int T, int B, mt_rnn_act_t *out);

/* ---- dropout between layers (dropout.c) ----
 *
 * The mask of a training pass is a pure function of its key (mt__rnn_drop_key of the
 * module's seed and training-forward counter), the layer whose output it applies to, and
 * the element's index in that output [T, B, D*H] (so the forward and reverse halves of a
 * bidirectional output get independent masks, as PyTorch's dropout over the concatenated
 * output). Nothing of it is stored: the cpu path regenerates it in backward (see
 * dropout.c for why). */

/* True when a training forward of s applies dropout: p > 0 and a layer above the first. */
bool mt__rnn_drop_on(const mt__rnn_shape_t *s);
uint64_t mt__rnn_drop_key(uint64_t seed, uint64_t counter);
/* dst[i] = src[i] * mask(first + i) for i < count, over the output of layer `layer`: 0
 * where dropped, src[i] * (1 / (1 - p)) where kept. dst may equal src (in place). Used for
 * the next layer's input in forward and for the gradient flowing back through it. */
void mt__rnn_drop_apply(const mt__rnn_shape_t *s, uint64_t key, int layer, size_t first,
                        size_t count, const float *src, float *dst);

/* ---- compute paths ---- */

/* A compute path. Every function gets the module (shape, backend, allocator, stream and the
 * path's own per-module state in m->path_state). Sizes may depend on that state (cuDNN asks
 * cudnnGetRNNTempSpaceSizes), so they are functions of the module, not of the shape alone. */
typedef struct mt__rnn_path_s {
    const char *name;
    /* Optional: set up m->path_state (descriptors, handles) after the flat buffers exist;
     * fini releases it. */
    int (*init)(mt_rnn_t *m);
    void (*fini)(mt_rnn_t *m);
    /* Bytes of the reserve a training forward of io's shape (seq_len, batch and, packed,
     * batch_sizes and tokens; io's pointers unused) keeps for backward. */
    size_t (*reserve_bytes)(const mt_rnn_t *m, const mt_rnn_io_t *io);
    /* Optional: a path that keeps its reserve in pieces makes and frees it itself (the cpu
     * path: one allocator block per chunk of time steps, which activation offload can park
     * in pinned host memory). The handle is what forward and backward get as reserve.
     * Without them, module.c allocates reserve_bytes as one block tagged activations. */
    int (*reserve_new)(mt_rnn_t *m, const mt_rnn_io_t *io, void **out);
    void (*reserve_free)(mt_rnn_t *m, void *reserve);
    /* Bytes of temporary workspace for forward (training or inference) and backward. */
    size_t (*fwd_work_bytes)(const mt_rnn_t *m, const mt_rnn_io_t *io, bool training);
    size_t (*bwd_work_bytes)(const mt_rnn_t *m, const mt_rnn_io_t *io);
    /* Optional: a checksum of n floats of device memory, kept in the reserve for what
     * backward reads back from the caller (y, x, hx, cx) and compared before backward. */
    uint64_t (*checksum)(mt_rnn_t *m, const float *p, size_t n);
    /* The checksum costs copies and stream waits: used only with cfg.check_saved. */
    bool checksum_opt_in;
    /* w: flat weights (the module's buffer or a compacted copy). reserve is unused (and
     * may be NULL) in inference mode, or when reserve_bytes is 0. drop_key: the training
     * pass's dropout key (mt__rnn_drop_key), the same for its forward and backward; a path
     * with its own dropout generator (cuDNN) ignores it. */
    int (*forward)(mt_rnn_t *m, const float *w, const mt_rnn_io_t *io, bool training,
                   uint64_t drop_key, void *reserve, void *work);
    /* io is the forward's; data gradients first, then weight gradients added to dw. */
    int (*backward)(mt_rnn_t *m, const float *w, float *dw, const mt_rnn_io_t *io,
                    uint64_t drop_key, void *reserve, const mt_rnn_grad_io_t *g, void *work);
    /* Optional: the module's dropout seed or counter changed (mt_rnn_set_dropout_state); a
     * path with its own generator re-seeds it. */
    int (*drop_reseed)(mt_rnn_t *m);
    /* Optional: a path whose generator keeps its state on the device (cuDNN's states, which
     * each training forward advances) keeps a copy of it (drop_keep) and puts it back
     * (drop_restore, which also frees the copy, whether or not keep succeeded), so that a
     * training forward between the two leaves later masks as they were (warm-up). */
    int (*drop_keep)(mt_rnn_t *m);
    int (*drop_restore)(mt_rnn_t *m);
    /* Device-to-device copy of n bytes (compaction, flatten, replicate), and zeroing. */
    int (*copy)(mt_rnn_t *m, void *dst, const void *src, size_t n);
    int (*zero)(mt_rnn_t *m, void *dst, size_t n);
} mt__rnn_path_t;

extern const mt__rnn_path_t mt__rnn_cpu_path;
/* cudnn_path.c, compiled when MT_HAVE_CUDNN (mt_config.h). */
extern const mt__rnn_path_t mt__rnn_cudnn_path;

/* The CPU kernels (cpu_forward.c, cpu_backward.c): CBLAS + elementwise cell math.
 *
 * They work in chunks of C = shape.chunk time steps (MT__RNN_CHUNK if 0): the input
 * projection is one sgemm over a chunk's C*B rows, and backward merges the weight-gradient
 * sgemms per chunk, accumulating chunk after chunk (last first). Every run of a module
 * therefore rounds the same way whatever memory holds its reserve, which is what makes an
 * offloaded run bit-identical to a plain one.
 *
 * Unidirectional modules run chunk-major (chunk k through every layer, then chunk k+1;
 * backward chunk k through every layer top-down, then k-1), so only the chunks around the
 * current one are touched. Bidirectional ones run layer-major over the same chunks (the
 * reverse direction needs the whole sequence of the layer below). */
#define MT__RNN_CHUNK 64

/* Where the kernels find the reserve of chunk k (steps [k*C, k*C + n)). Forward calls
 * fwd_get(k) before writing chunk k and fwd_done(k) after; unidirectional forward visits
 * chunks in order, one at a time. Backward calls bwd_get(k) before reading chunk k (again
 * for a chunk it already holds: it also reads chunk k-1's last step while differentiating
 * chunk k) and bwd_done(k) when chunk k is no longer needed; unidirectional backward visits
 * chunks last to first. A chunk of 0 floats may come back NULL. */
typedef struct mt__rnn_chunks_s {
    int (*fwd_get)(void *ud, int k, float **out);
    int (*fwd_done)(void *ud, int k);
    int (*bwd_get)(void *ud, int k, float **out);
    int (*bwd_done)(void *ud, int k);
    void *ud;
} mt__rnn_chunks_t;

/* Whether the reserve keeps a pseudo-layer's activated gates and aux (LSTM and GRU; the
 * plain RNN modes recompute them). */
static inline bool mt__rnn_cpu_keeps_gates(const mt__rnn_shape_t *s)
{
    return s->mode == MT_RNN_LSTM || s->mode == MT_RNN_GRU;
}

/* ---- a batch in time, chunks and the reserve (cpu_chunks.c) ---- */
/* The time structure of a batch (built from mt_rnn_io_t by mt__rnn_seq_init, host memory).
 * Padded input is the packed form with every batch size B.
 * Invariants: T >= 1; bs[0] = B >= 1; B >= bs[t] >= bs[t+1] >= 1 for t < T-1; bs[T] = 0 (a
 * sentinel: no sequence runs past T); off[0] = 0, off[t+1] = off[t] + bs[t]; rows = off[T].
 * The rows of step t are [off[t], off[t] + bs[t]) of x, y and every per-step buffer, and
 * sequence b (in packed order) runs at step t iff b < bs[t]. */
typedef struct mt__rnn_seq_s {
    int T;       /* steps (the longest sequence) */
    int B;       /* sequences */
    size_t rows; /* tokens: sum of the lengths */
    int *bs;     /* [T + 1] */
    size_t *off; /* [T + 1] */
} mt__rnn_seq_t;

/* From io (batch_sizes, or T steps of B): MT_ENOMEM, or 0. Does not validate: the module
 * checks io first (mt__rnn_seq_check). */
int mt__rnn_seq_init(mt__rnn_seq_t *q, const mt_rnn_io_t *io);
void mt__rnn_seq_fini(mt__rnn_seq_t *q);
/* 0 if io's batch_sizes describe a valid packed batch of io->tokens rows (see
 * mt_rnn_io_t), else MT_EINVAL after logging what is wrong. Reads at most seq_len entries. */
int mt__rnn_seq_check(const mt_rnn_io_t *io, mt_log_cb log, void *ud);

/* Chunk geometry: C, the number of chunks of T steps, the steps of chunk k, its first row
 * and its rows, and the most rows of any chunk. */
int mt__rnn_cpu_chunk_len(const mt__rnn_shape_t *s);
int mt__rnn_cpu_nchunks(const mt__rnn_shape_t *s, int T);
int mt__rnn_cpu_chunk_steps(const mt__rnn_shape_t *s, int T, int k);
size_t mt__rnn_cpu_chunk_row0(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q, int k);
size_t mt__rnn_cpu_chunk_rows(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q, int k);
size_t mt__rnn_cpu_max_chunk_rows(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q);
/* Row stride in floats of every [rows, g*H] gate buffer (the reserve's gates, the
 * recurrent product, R^T, the weight-gradient sums): g*H, plus 16 when g*H is a multiple
 * of 256 (at most 1/16 more): rows 1 KiB-multiples apart put a column of the matrix in a
 * few cache sets (docs/rnn-cpu.md, Row strides). */
int mt__rnn_cpu_gld(const mt__rnn_shape_t *s);
/* A row stride for a matrix of n columns that the GEMMs read: n, plus 16 when n is a multiple
 * of 256 (mt__rnn_cpu_gld is this for g*H). */
int mt__rnn_cpu_ld(int n);

/* Reserve layout of ONE chunk of nb rows (steps x sequences running), in floats from its
 * start: for each pseudo-layer p = l*D + d in order, gates [nb, g*H] (rows
 * mt__rnn_cpu_gld apart) then aux [nb, H] (LSTM:
 * c; GRU: R_n h + b_Rn; none for RNN), then the outputs of layers 0 .. L-2, each
 * [nb, D*H]. Its size is linear in nb, so the whole reserve (mt__rnn_cpu_reserve_floats) is
 * the chunk size at nb = sum of the lengths (T*B padded). */
size_t mt__rnn_cpu_chunk_floats(const mt__rnn_shape_t *s, size_t nb);
size_t mt__rnn_cpu_reserve_floats(const mt__rnn_shape_t *s, size_t rows);
float *mt__rnn_cpu_gates(const mt__rnn_shape_t *s, float *chunk, size_t nb, int p);
float *mt__rnn_cpu_aux(const mt__rnn_shape_t *s, float *chunk, size_t nb, int p);
float *mt__rnn_cpu_layer_out(const mt__rnn_shape_t *s, float *chunk, size_t nb, int l);

/* ---- the kernels (cpu_forward.c, cpu_backward.c) ---- */
/* The first sequence of the second part when the step loops of steps [t0, t0 + n) run in two
 * parts (the first about share of the work), or B on one thread (s->threads < 2); w gets
 * the rows of each part. */
int mt__rnn_cpu_split(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q, int t0, int n, double share,
                      double w[2]);
/* The step loops' parts for steps [t0, t0 + n): their count np (1 .. mt__rnn_par_parts(s),
 * at most B), bound[0 .. np] (0 = bound[0] < ... < bound[np] = B) and each part's rows in
 * w[0 .. np). Two parts: mt__rnn_cpu_split at share; more: parts of about equal rows. */
int mt__rnn_cpu_parts(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q, int t0, int n, double share,
                      int bound[MT__RNN_PARTS_MAX + 1], double w[MT__RNN_PARTS_MAX]);

size_t mt__rnn_cpu_fwd_work_floats(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q, bool training);
size_t mt__rnn_cpu_bwd_work_floats(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q);
/* chunks: the training reserve (unused, may be NULL, in inference). key: the pass's dropout
 * key (used when mt__rnn_drop_on(s) in training; backward must get forward's). io may be
 * packed (batch_sizes); it is not checked here. */
int mt__rnn_cpu_forward_chunks(const mt__rnn_shape_t *s, const float *w, const mt_rnn_io_t *io,
                               bool training, uint64_t key, const mt__rnn_chunks_t *chunks,
                               float *work);
int mt__rnn_cpu_backward_chunks(const mt__rnn_shape_t *s, const float *w, float *dw,
                                const mt_rnn_io_t *io, uint64_t key, const mt__rnn_chunks_t *chunks,
                                const mt_rnn_grad_io_t *g, float *work);
/* The same over one flat reserve of mt__rnn_cpu_reserve_floats floats holding the chunks
 * one after the other (tests, and any caller with one buffer); without _drop, key 0. The
 * workspace sizes are those of mt__rnn_cpu_*_work_floats for io's seq. */
int mt__rnn_cpu_forward(const mt__rnn_shape_t *s, const float *w, const mt_rnn_io_t *io,
                        bool training, float *reserve, float *work);
int mt__rnn_cpu_backward(const mt__rnn_shape_t *s, const float *w, float *dw, const mt_rnn_io_t *io,
                         float *reserve, const mt_rnn_grad_io_t *g, float *work);
int mt__rnn_cpu_forward_drop(const mt__rnn_shape_t *s, const float *w, const mt_rnn_io_t *io,
                             bool training, uint64_t key, float *reserve, float *work);
int mt__rnn_cpu_backward_drop(const mt__rnn_shape_t *s, const float *w, float *dw,
                              const mt_rnn_io_t *io, uint64_t key, float *reserve,
                              const mt_rnn_grad_io_t *g, float *work);
/* Workspace floats of mt__rnn_cpu_forward/backward for io (tests): MT_ENOMEM -> 0. */
size_t mt__rnn_cpu_io_fwd_work(const mt__rnn_shape_t *s, const mt_rnn_io_t *io, bool training);
size_t mt__rnn_cpu_io_bwd_work(const mt__rnn_shape_t *s, const mt_rnn_io_t *io);
size_t mt__rnn_cpu_io_reserve(const mt__rnn_shape_t *s, const mt_rnn_io_t *io);

/* ---- the cpu path's reserve store and activation offload (offload.c) ---- */

/* The chunks of one training pass, each its own allocator block (tagged activations). With
 * the module's offload window W > 0 (unidirectional only), forward keeps at most W chunks on
 * the device: the chunk leaving the window is copied to pinned host memory on a side stream
 * and its block freed after the copy's event; backward brings chunks back ahead of need,
 * holding at most W + 1 (the chunk differentiated reads its predecessor's last step). */
typedef struct mt__rnn_store_s mt__rnn_store_t;
int mt__rnn_store_new(mt_rnn_t *m, const mt_rnn_io_t *io, mt__rnn_store_t **out);
void mt__rnn_store_free(mt_rnn_t *m, mt__rnn_store_t *st);
/* The kernels' view of the store. */
void mt__rnn_store_chunks(mt__rnn_store_t *st, mt__rnn_chunks_t *out);
/* Validates an offload setting for m: 0, MT_EINVAL or MT_ENOTSUP. */
int mt__rnn_offload_check(const mt_rnn_t *m, mt_host_cache_t *host, int window);
/* Frees the module's side stream and event (mt_rnn_destroy). */
void mt__rnn_offload_fini(mt_rnn_t *m);

/* ---- the module ---- */

/* Invariants: w and dw hold weight_floats floats each (allocator blocks tagged weights and
 * grads); the views tile [0, weight_floats) in PyTorch's order; rebound = #{i : views[i].data
 * != w + views[i].offset}, so the module is flat iff rebound == 0; warned is set the first
 * time a call finds it non-flat; step_ws == NULL iff step_ws_bytes == 0. Checked by
 * mt__rnn_check. */
struct mt_rnn_s {
    mt_rnn_cfg_t cfg;
    mt__rnn_shape_t shape;
    const mt__rnn_path_t *path;
    bool gemm_auto;        /* cpu path: the library is the default for the thread count */
    mt_alloc_t *alloc;     /* borrowed */
    mt_backend_t *backend; /* borrowed, the allocator's */
    float *w;              /* flat weights */
    float *dw;             /* flat gradients */
    size_t weight_floats;
    size_t nviews;
    mt__rnn_view_t *views; /* nviews, host memory */
    size_t rebound;        /* views not at their flat place */
    bool warned;           /* the non-flat warning was logged */
    mt_rnn_stats_t stats;
    void *path_state;      /* owned by the path (init/fini), NULL for the cpu path */
    void *step_ws;         /* mt_rnn_step's workspace (tagged workspace) or NULL */
    size_t step_ws_bytes;  /* its size; it only grows (to the largest batch stepped) */
    mt_stream_t *off_side; /* offload copies (made on first use, owned) or NULL */
    mt_event_t *off_mark;  /* scratch: a point of the module's stream, with off_side */
    uint64_t drop_seed;    /* dropout: seed and successful training forwards since it */
    uint64_t drop_counter;
};

/* Walks the module's invariants (views tile the flat buffer, rebound count, its buffers are
 * allocator blocks with their tags). 0 if they hold, MT_EIO after logging the first
 * violation. Tests call it after every step. */
int mt__rnn_check(const mt_rnn_t *m);

/* Allocation helpers of the module's files (lifecycle.c). dmalloc: a block of bytes tagged
 * tag on the module's stream (bytes 0: *out = NULL and 0); dfree: its free (NULL: nothing);
 * mark: an MT_EV_MARK event (which: mt_mark_e) through the module's allocator. */
int mt__rnn_dmalloc(mt_rnn_t *m, size_t bytes, int tag, void **out);
void mt__rnn_dfree(mt_rnn_t *m, void *p);
void mt__rnn_mark(mt_rnn_t *m, int which, uint64_t payload);

/* The weights for one call: the flat buffer, or a compacted copy in *copy that the caller
 * frees (params.c). */
int mt__rnn_weights_for_call(mt_rnn_t *m, const float **w, float **copy);

/* What a training forward hands to backward. */
struct mt_rnn_reserve_s {
    mt_rnn_t *m;    /* the module that made it */
    mt_rnn_io_t io; /* the forward's arguments (borrowed pointers) */
    void *space;    /* path reserve: one block tagged activations, or the path's handle
                     * (reserve_new) */
    size_t bytes;
    float *wcopy;      /* compacted weights used by forward (tagged weights), or NULL */
    uint64_t drop_key; /* the forward's dropout key: backward regenerates its masks */
    int *batch_sizes;  /* packed: a copy of the forward's (io.batch_sizes points here) */
    bool summed;       /* sums[] hold checksums of io.y, x, hx, cx after forward */
    uint64_t sums[4];
};

#endif
