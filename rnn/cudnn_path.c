/* The "cudnn" compute path: the module's flat buffers handed to cuDNN 9's RNN API.
 *
 * Honest status: this file has run only against the fake cuDNN in tests/rnn_cudnn (over the
 * fake driver of tests/cuda), never on a GPU. The fake checks the calls, their order, the
 * sizes and the pointers, and computes a reference RNN from the weights where it says they
 * are, so the numbers are compared with the cpu path's (docs/cudnn.md).
 *
 * Loading: libcudnn and the runtime calls are loaded at the first init (cudnn_lib.c); the
 * loaded version must be 9 or newer, and is logged.
 *
 * Call sequence (design.md §2): at init, cudnnSetRNNDescriptor_v8 (algo STANDARD, double
 * bias, mathType FMA for fp32 parity with the CPU path), cudnnGetRNNWeightSpaceSize (must
 * match our flat buffer), cudnnGetRNNWeightParams for every matrix and bias (where cuDNN
 * says each lives is taken from it, not assumed; see "weight layout" below); per shape
 * (T, B), cudnnSetRNNDataDescriptor and cudnnGetRNNTempSpaceSizes; then cudnnRNNForward, and
 * cudnnRNNBackwardData_v8 before cudnnRNNBackwardWeights_v8 (which needs what backward data
 * left in the reserve). Weight gradients are accumulated (CUDNN_WGRAD_MODE_ADD) into the
 * module's grad buffer, which the module zeroes at creation and on mt_rnn_zero_grads.
 *
 * Weight layout: the module's flat buffer (and every view of it) is the engine's layout
 * (per pseudo-layer: matrices, then biases). When cuDNN reports exactly that layout, the flat
 * weight and grad buffers go to cuDNN as they are. When it reports another one (all
 * matrices first, as public descriptions of cuDNN give it; padding; a larger space), the
 * path keeps a weight space and a grad space in cuDNN's layout (tagged weights and grads,
 * zeroed once), copies the weights there before each call and, around backward weights, the
 * module's gradients there and back, so gradients still accumulate where the views are.
 * Regions adjacent in both layouts are copied together; the cost is in docs/cudnn.md.
 *
 * Data layout: our tensors are cuDNN's SEQ_MAJOR_PACKED layout: dense [T, B, F] when every
 * sequence is T long, and the packed [tokens, F] of a packed batch (io.batch_sizes), whose
 * per-sequence lengths (length b = #{t : batch_sizes[t] > b}) are the data descriptors'
 * seqLengthArray; cuDNN sizes workspace and reserve for that descriptor. Padded I/O is not
 * needed (CUDNN_RNN_PADDED_IO_DISABLED).
 *
 * Device: a cuDNN handle belongs to the device current when it was created, and its
 * kernels run on the current device, so every entry switches the calling thread to the
 * backend's device (cudaSetDevice) and back to the caller's afterwards.
 *
 * Dropout (p > 0 with L > 1; otherwise the RNN descriptor gets NULL): a cudnnDropoutDescriptor set
 * at init with p and the module's dropout seed, on generator states of cudnnDropoutGetStatesSize
 * bytes. The states are one allocator block for the module's life, tagged workspace: like the step
 * workspace they are the library's scratch, not a pass's activations (they neither grow with T and
 * B nor go away between passes, and tagging them activations would make the profiler see
 * activations that never drop to zero). The masks of a pass are cuDNN's business, in its reserve
 * (tagged activations, sized by cudnnGetRNNTempSpaceSizes with the dropout descriptor attached), so
 * activation accounting follows cuDNN. cuDNN applies dropout in TRAINING forwards only.
 * mt_rnn_set_dropout_state re-initialises the states (cudnnSetDropoutDescriptor again); if
 * that fails the states are stale (cuDNN may have written part of them) and the next
 * training forward re-initialises them from the module's state before it runs. The
 * warm-up keeps a copy of the states and puts it back after its training forward.
 *
 * Memory: workspace and reserve are the module's allocations from the caching allocator
 * (tagged workspace and activations), sized by cudnnGetRNNTempSpaceSizes through the size
 * functions below; cuDNN never allocates device memory itself here. Every cuDNN call runs
 * on the module's stream (cudnnSetStream), the stream the allocator orders those blocks on.
 * Inference of a unidirectional module runs chunk by chunk (MT__RNN_CHUNK steps), so its
 * workspace does not grow with the sequence length. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "memtrace/backend.h"

#include "backend/backend_cuda.h"
#include "rnn/cudnn_internal.h"
#include "util/assert.h"

/* libcudnn and the runtime calls, loaded by the first module's init and kept for the
 * process: every call goes through it. */
const mt__dnn_t *mt__dnn;

static size_t align_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

/* ---- descriptors ---- */

static int set_rnn_descriptor(mt_rnn_t *m, cudnn_state_t *st)
{
    const mt__rnn_shape_t *s = &m->shape;
    static const cudnnRNNMode_t modes[] = {
        [MT_RNN_TANH] = CUDNN_RNN_TANH,
        [MT_RNN_RELU] = CUDNN_RNN_RELU,
        [MT_RNN_LSTM] = CUDNN_LSTM,
        [MT_RNN_GRU] = CUDNN_GRU,
    };
    /* dd: the dropout descriptor, NULL without dropout. projSize = hiddenSize means no LSTM
     * projection. */
    CK(m, mt__dnn->cudnnSetRNNDescriptor_v8(
              st->rnn, CUDNN_RNN_ALGO_STANDARD, modes[s->mode],
              s->bias ? CUDNN_RNN_DOUBLE_BIAS : CUDNN_RNN_NO_BIAS,
              s->dirs == 2 ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT,
              CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, s->input, s->hidden, s->hidden,
              s->layers, st->dd, CUDNN_RNN_PADDED_IO_DISABLED));
    return 0;
}

/* ---- the path ---- */

static void cudnn_fini(mt_rnn_t *m)
{
    cudnn_state_t *st = S(m);
    if (!st)
        return;
    dev_guard_t g;
    bool on_device = st->h && mt__dnn_dev_enter(m, &g) == 0;
    /* Frees are stream-ordered: safe with work still in flight. */
    if (st->lens)
        mt_alloc_free(m->alloc, st->lens);
    if (st->plens)
        mt_alloc_free(m->alloc, st->plens);
    if (st->sw)
        mt_alloc_free(m->alloc, st->sw);
    if (st->sdw)
        mt_alloc_free(m->alloc, st->sdw);
    if (st->dstates)
        mt_alloc_free(m->alloc, st->dstates);
    if (st->qd)
        mt__dnn->cudnnDestroyTensorDescriptor(st->qd);
    if (st->bd)
        mt__dnn->cudnnDestroyTensorDescriptor(st->bd);
    if (st->hd)
        mt__dnn->cudnnDestroyTensorDescriptor(st->hd);
    if (st->yd)
        mt__dnn->cudnnDestroyRNNDataDescriptor(st->yd);
    if (st->xd)
        mt__dnn->cudnnDestroyRNNDataDescriptor(st->xd);
    if (st->rnn)
        mt__dnn->cudnnDestroyRNNDescriptor(st->rnn);
    if (st->dd) /* after the RNN descriptor that refers to it */
        mt__dnn->cudnnDestroyDropoutDescriptor(st->dd);
    if (st->h)
        mt__dnn->cudnnDestroy(st->h);
    if (on_device)
        mt__dnn_dev_leave(&g);
    free(st->host_lens);
    free(st->plens_key);
    free(st->regions);
    free(st->sum_buf);
    free(st);
    m->path_state = NULL;
}

/* cuDNN's seed for the module's dropout state: the seed itself at counter 0 (so cfg's
 * dropout_seed is what cuDNN gets), otherwise a mix of both. */
static unsigned long long dropout_seed(const mt_rnn_t *m)
{
    return m->drop_counter == 0 ? m->drop_seed : mt__rnn_drop_key(m->drop_seed, m->drop_counter);
}

/* The dropout descriptor and its states (see the head of this file). */
static int init_dropout(mt_rnn_t *m, cudnn_state_t *st)
{
    if (!mt__rnn_drop_on(&m->shape))
        return 0;
    CK(m, mt__dnn->cudnnCreateDropoutDescriptor(&st->dd));
    CK(m, mt__dnn->cudnnDropoutGetStatesSize(st->h, &st->dstates_bytes));
    int rc =
        mt_alloc_malloc(m->alloc, st->dstates_bytes, m->cfg.stream, MT_TAG_WORKSPACE, &st->dstates);
    if (rc)
        return rc;
    /* Initialises the states with a kernel on the handle's stream, the module's: in order
     * with the allocation above and the forwards that follow. */
    CK(m, mt__dnn->cudnnSetDropoutDescriptor(st->dd, st->h, m->shape.dropout, st->dstates,
                                             st->dstates_bytes, dropout_seed(m)));
    return 0;
}

/* Re-initialises the states from the module's seed and counter (a kernel on the module's
 * stream). cuDNN may fail after its kernel wrote part of them: they are then marked stale,
 * and the next training forward tries again before it draws from them. Caller is on the
 * module's device. */
static int seed_states(mt_rnn_t *m, cudnn_state_t *st)
{
    int rc = mt__dnn_check(m,
                           mt__dnn->cudnnSetDropoutDescriptor(st->dd, st->h, m->shape.dropout,
                                                              st->dstates, st->dstates_bytes,
                                                              dropout_seed(m)),
                           "cudnnSetDropoutDescriptor");
    st->dstates_stale = rc != 0;
    return rc;
}

static int cudnn_drop_reseed(mt_rnn_t *m)
{
    cudnn_state_t *st = S(m);
    if (!st->dd)
        return 0;
    dev_guard_t g;
    int rc = mt__dnn_dev_enter(m, &g);
    if (rc == 0)
        rc = seed_states(m, st);
    mt__dnn_dev_leave(&g);
    return rc;
}

static int init_state(mt_rnn_t *m, cudnn_state_t *st)
{
    CK(m, mt__dnn->cudnnSetStream(st->h, (cudaStream_t)mt__cuda_stream_handle(m->cfg.stream)));
    CK(m, mt__dnn->cudnnCreateRNNDescriptor(&st->rnn));
    CK(m, mt__dnn->cudnnCreateRNNDataDescriptor(&st->xd));
    CK(m, mt__dnn->cudnnCreateRNNDataDescriptor(&st->yd));
    CK(m, mt__dnn->cudnnCreateTensorDescriptor(&st->hd));
    CK(m, mt__dnn->cudnnCreateTensorDescriptor(&st->qd));
    CK(m, mt__dnn->cudnnCreateTensorDescriptor(&st->bd));
    int rc = init_dropout(m, st);
    if (rc == 0)
        rc = set_rnn_descriptor(m, st);
    if (rc)
        return rc;
    CK(m, mt__dnn->cudnnGetRNNWeightSpaceSize(st->h, st->rnn, &st->weight_bytes));
    return mt__dnn_locate_weights(m, st);
}

static int cudnn_init(mt_rnn_t *m)
{
    if (!mt__cuda_is_cuda(m->backend))
        return MT_ENOTSUP;
    char why[2048];
    if (mt__dnn_open(&mt__dnn, why, sizeof why) != 0) {
        /* Loudly once per process: the program's RNN then runs on no GPU, which is easy to
         * miss; later modules say it again at info. */
        static atomic_flag warned = ATOMIC_FLAG_INIT;
        bool first = !atomic_flag_test_and_set(&warned);
        plog(m, first ? MT_LOG_WARN : MT_LOG_INFO,
             "rnn: cudnn unavailable: %s. The RNN module cannot use the GPU (MT_ENODEV; set "
             "MEMTRACE_LIBCUDNN and MEMTRACE_LIBCUDART to the files, or MEMTRACE_CUDNN_ROOTS to "
             "the site-packages holding the nvidia wheels)",
             why);
        return MT_ENODEV;
    }
    cudnn_state_t *st = calloc(1, sizeof *st);
    if (!st)
        return MT_ENOMEM;
    m->path_state = st;
    /* Where there is no driver (this build machine), selecting the device or cudnnCreate
     * fails (NOT_INITIALIZED): ENODEV, with the reason in the log. */
    /* The library loaded at run time may be older than the headers: cuDNN 9 encodes its
     * version as major * 10000 + minor * 100 + patch. */
    size_t v = mt__dnn->cudnnGetVersion();
    if (v < 90000) {
        plog(m, MT_LOG_WARN,
             "rnn: cudnn unavailable: the loaded libcudnn is version %zu (%zu.%zu), this path "
             "needs 9 or newer (built against %d.%d.%d)",
             v, v / 1000, v % 1000 / 100, CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
        cudnn_fini(m);
        return MT_ENODEV;
    }
    int rv = 0;
    if (mt__dnn->cudaRuntimeGetVersion(&rv) != cudaSuccess)
        rv = 0;
    plog(m, MT_LOG_INFO,
         "rnn: cudnn: libcudnn %zu.%zu.%zu (built against %d.%d.%d) from %s; CUDA runtime "
         "%d.%d (built against %d.%d) from %s",
         v / 10000, v % 10000 / 100, v % 100, CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL,
         mt__dnn_path(0), rv / 1000, rv % 1000 / 10, CUDART_VERSION / 1000,
         CUDART_VERSION % 1000 / 10, mt__dnn_path(1));
    dev_guard_t g;
    int rc = mt__dnn_dev_enter(m, &g);
    if (rc) {
        cudnn_fini(m);
        return rc;
    }
    cudnnStatus_t cs = mt__dnn->cudnnCreate(&st->h);
    if (cs != CUDNN_STATUS_SUCCESS) {
        st->h = NULL;
        plog(m, MT_LOG_WARN, "rnn: cudnn unavailable: cudnnCreate: %s (%d)",
             mt__dnn->cudnnGetErrorString(cs), (int)cs);
        rc = mt__dnn_status(cs) == MT_ENOMEM ? MT_ENOMEM : MT_ENODEV;
    } else {
        rc = init_state(m, st);
    }
    mt__dnn_dev_leave(&g);
    if (rc)
        cudnn_fini(m);
    return rc;
}

static size_t cudnn_reserve_bytes(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    mt__dnn_shape_for_size(m, io);
    return S(m)->T ? S(m)->reserve : 0;
}

/* Inference of a unidirectional module runs in chunks of MT__RNN_CHUNK steps, each a
 * cudnnRNNForward whose final states start the next, so its workspace (cuDNN's grows with
 * T) is bounded independently of T, as the cpu path's is (docs/rnn-cpu.md, Chunks and the
 * reserve). Packed batches run as one
 * call: sequences end inside chunks, and their final states would be spread over them. */
static bool chunked(const mt_rnn_t *m, const mt_rnn_io_t *io, bool training)
{
    return !training && m->shape.dirs == 1 && io->seq_len > MT__RNN_CHUNK && !io->batch_sizes;
}

/* Bytes of one [L, B, H] state buffer in the chunked workspace. */
static size_t state_bytes(const mt_rnn_t *m, int B)
{
    return align_up((size_t)m->shape.layers * (size_t)B * (size_t)m->shape.hidden * sizeof(float),
                    512);
}

/* Chunked inference workspace: cuDNN's for the larger of the full chunk and the tail,
 * then two h and two c state buffers (ping-pong between chunks). */
static size_t chunk_work_bytes(const mt_rnn_t *m, int T, int B)
{
    size_t w = 0;
    int tail = T % MT__RNN_CHUNK;
    int shapes[2] = {MT__RNN_CHUNK, tail};
    for (int i = 0; i < (tail ? 2 : 1); i++) {
        mt__dnn_padded_for_size(m, shapes[i], B);
        if (!S(m)->T)
            return 0;
        w = S(m)->work_inf > w ? S(m)->work_inf : w;
    }
    return w;
}

/* The chunked inference workspace, in bytes (docs/rnn-cpu.md, Workspace layouts): cuDNN's
 * own workspace, then the ping-pong states h0, h1, c0, c1, 512-byte aligned. total = 0 when
 * cuDNN cannot size a chunk. */
enum { CHW_CUDNN, CHW_H0, CHW_H1, CHW_C0, CHW_C1, CHW_NREG };

typedef struct chunk_layout_s {
    mt__rnn_region_t reg[CHW_NREG];
    size_t total; /* bytes */
} chunk_layout_t;

static chunk_layout_t chunk_layout(const mt_rnn_t *m, int T, int B)
{
    chunk_layout_t y = {.total = 0};
    size_t cw = chunk_work_bytes(m, T, B), sb = state_bytes(m, B);
    if (!cw)
        return y;
    y.reg[CHW_CUDNN] = mt__rnn_place(&y.total, cw, 512);
    for (int i = CHW_H0; i < CHW_NREG; i++)
        y.reg[i] = mt__rnn_place(&y.total, sb, 512);
    mt_assert(mt__rnn_regions_valid(y.reg, CHW_NREG, y.total, 512));
    return y;
}

static size_t cudnn_fwd_work_bytes(const mt_rnn_t *m, const mt_rnn_io_t *io, bool training)
{
    if (chunked(m, io, training))
        return chunk_layout(m, io->seq_len, io->batch).total;
    mt__dnn_shape_for_size(m, io);
    return S(m)->T ? (training ? S(m)->work_train : S(m)->work_inf) : 0;
}

/* Backward's workspace, in bytes: cuDNN's training workspace (BWW_CUDNN), then room for dx
 * (BWW_DX) when the caller does not want it (cudnnRNNBackwardData_v8 always writes dx).
 * Sized for io; st must hold io's shape (mt__dnn_shape_for_size or mt__dnn_prepare). */
enum { BWW_CUDNN, BWW_DX, BWW_NREG };

typedef struct bwd_ws_layout_s {
    mt__rnn_region_t reg[BWW_NREG];
    size_t total; /* bytes */
} bwd_ws_layout_t;

static bwd_ws_layout_t bwd_ws_layout(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    size_t rows = io->batch_sizes ? io->tokens : (size_t)io->seq_len * (size_t)io->batch;
    bwd_ws_layout_t y = {.total = 0};
    y.reg[BWW_CUDNN] = mt__rnn_place(&y.total, S(m)->work_train, 512);
    y.reg[BWW_DX] = mt__rnn_place(&y.total, rows * (size_t)m->shape.input * sizeof(float), 512);
    mt_assert(mt__rnn_regions_valid(y.reg, BWW_NREG, y.total, 512));
    return y;
}

static size_t cudnn_bwd_work_bytes(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    mt__dnn_shape_for_size(m, io);
    if (!S(m)->T)
        return 0;
    return bwd_ws_layout(m, io).total;
}

/* One cudnnRNNForward over io with weight space ws. */
static int forward_once(mt_rnn_t *m, const void *ws, const mt_rnn_io_t *io, bool training,
                        void *reserve, void *work)
{
    cudnn_state_t *st = S(m);
    int rc = mt__dnn_prepare(m, io);
    if (rc)
        return rc;
    rc = mt__dnn_covers(m, work, training ? st->work_train : st->work_inf, "workspace");
    if (rc == 0 && training)
        rc = mt__dnn_covers(m, reserve, st->reserve, "reserve");
    if (rc)
        return rc;
    st->size_err = 0;
    bool lstm = m->shape.mode == MT_RNN_LSTM;
    CK(m, mt__dnn->cudnnRNNForward(
              st->h, st->rnn, training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE,
              mt__dnn_lengths(st), st->xd, io->x, st->yd, io->y, st->hd, io->hx, io->hy, st->hd,
              lstm ? io->cx : NULL, lstm ? io->cy : NULL, st->weight_bytes, ws,
              training ? st->work_train : st->work_inf, work, training ? st->reserve : 0,
              training ? reserve : NULL));
    return 0;
}

/* Inference chunk by chunk (see chunked()): chunk k reads the states chunk k - 1 wrote into
 * the workspace's ping-pong buffers; the first reads io's, the last writes io's. */
static int forward_chunks(mt_rnn_t *m, const void *ws, const mt_rnn_io_t *io, void *work)
{
    const mt__rnn_shape_t *s = &m->shape;
    int T = io->seq_len, B = io->batch;
    chunk_layout_t y = chunk_layout(m, T, B);
    if (!y.total) {
        int rc = S(m)->size_err;
        S(m)->size_err = 0;
        return rc ? rc : MT_EIO;
    }
    char *base = work;
    float *h[2] = {(float *)(base + y.reg[CHW_H0].off), (float *)(base + y.reg[CHW_H1].off)};
    float *c[2] = {(float *)(base + y.reg[CHW_C0].off), (float *)(base + y.reg[CHW_C1].off)};
    bool lstm = s->mode == MT_RNN_LSTM;
    for (int t0 = 0, k = 0; t0 < T; t0 += MT__RNN_CHUNK, k++) {
        int n = T - t0 < MT__RNN_CHUNK ? T - t0 : MT__RNN_CHUNK;
        bool last = t0 + n == T;
        mt_rnn_io_t ck = {
            .seq_len = n,
            .batch = B,
            .x = io->x + (size_t)t0 * (size_t)B * (size_t)s->input,
            .y = io->y + (size_t)t0 * (size_t)B * (size_t)s->hidden,
            .hx = k == 0 ? io->hx : h[(k - 1) % 2],
            .cx = !lstm    ? NULL
                  : k == 0 ? io->cx
                           : c[(k - 1) % 2],
            .hy = last ? io->hy : h[k % 2],
            .cy = !lstm  ? NULL
                  : last ? io->cy
                         : c[k % 2],
        };
        int rc = forward_once(m, ws, &ck, false, NULL, work);
        if (rc)
            return rc;
    }
    return 0;
}

static int run_forward(mt_rnn_t *m, const float *w, const mt_rnn_io_t *io, bool training,
                       void *reserve, void *work)
{
    cudnn_state_t *st = S(m);
    int rc = st->gather ? mt__dnn_copy_regions(m, st, st->sw, w, true) : 0;
    if (rc)
        return rc;
    const void *ws = st->gather ? (const void *)st->sw : w;
    if (chunked(m, io, training))
        return forward_chunks(m, ws, io, work);
    return forward_once(m, ws, io, training, reserve, work);
}

static int run_backward(mt_rnn_t *m, const float *w, float *dw, const mt_rnn_io_t *io,
                        void *reserve, const mt_rnn_grad_io_t *g, void *work)
{
    cudnn_state_t *st = S(m);
    int rc = mt__dnn_prepare(m, io);
    if (rc)
        return rc;
    /* Gather mode: the forward's weights again (another call may have used sw since), and
     * the module's gradients, which cuDNN adds to and which go back afterwards. */
    if (st->gather) {
        rc = mt__dnn_copy_regions(m, st, st->sw, w, true);
        if (rc == 0)
            rc = mt__dnn_copy_regions(m, st, st->sdw, dw, true);
        if (rc)
            return rc;
    }
    const void *ws = st->gather ? (const void *)st->sw : w;
    float *dws = st->gather ? st->sdw : dw;
    bool lstm = m->shape.mode == MT_RNN_LSTM;
    bwd_ws_layout_t y = bwd_ws_layout(m, io);
    rc = mt__dnn_covers(m, work, g->dx ? st->work_train : y.total, "workspace");
    if (rc == 0)
        rc = mt__dnn_covers(m, reserve, st->reserve, "reserve");
    if (rc)
        return rc;
    st->size_err = 0;
    void *dx = g->dx ? (void *)g->dx : (char *)work + y.reg[BWW_DX].off;
    /* Data first: it leaves in the reserve what the weight gradients are computed from. */
    CK(m, mt__dnn->cudnnRNNBackwardData_v8(st->h, st->rnn, mt__dnn_lengths(st), st->yd, io->y,
                                           g->dy, st->xd, dx, st->hd, io->hx, g->dhy, g->dhx,
                                           st->hd, lstm ? io->cx : NULL, lstm ? g->dcy : NULL,
                                           lstm ? g->dcx : NULL, st->weight_bytes, ws,
                                           st->work_train, work, st->reserve, reserve));
    /* ADD: gradients accumulate in the module's grad buffer (zeroed by the module), or in
     * its cudnn-layout copy, which then goes back. */
    CK(m, mt__dnn->cudnnRNNBackwardWeights_v8(st->h, st->rnn, CUDNN_WGRAD_MODE_ADD,
                                              mt__dnn_lengths(st), st->xd, io->x, st->hd, io->hx,
                                              st->yd, io->y, st->weight_bytes, dws, st->work_train,
                                              work, st->reserve, reserve));
    return st->gather ? mt__dnn_copy_regions(m, st, dw, st->sdw, false) : 0;
}

/* drop_key is unused: cuDNN draws the masks from its states and keeps them in its reserve. */
static int cudnn_forward(mt_rnn_t *m, const float *w, const mt_rnn_io_t *io, bool training,
                         uint64_t drop_key, void *reserve, void *work)
{
    (void)drop_key;
    cudnn_state_t *st = S(m);
    dev_guard_t dg;
    int rc = mt__dnn_dev_enter(m, &dg);
    if (rc == 0 && training && st->dd && st->dstates_stale) {
        rc = seed_states(m, st);
        plog(m, rc ? MT_LOG_ERROR : MT_LOG_WARN,
             "rnn: cudnn: the dropout states were left invalid by a failed re-seed or warm-up; "
             "re-initialising them from the module's dropout state %s",
             rc ? "failed: no training forward runs until it succeeds" : "before this forward");
    }
    if (rc == 0)
        rc = run_forward(m, w, io, training, reserve, work);
    mt__dnn_dev_leave(&dg);
    return rc;
}

static int cudnn_backward(mt_rnn_t *m, const float *w, float *dw, const mt_rnn_io_t *io,
                          uint64_t drop_key, void *reserve, const mt_rnn_grad_io_t *g, void *work)
{
    (void)drop_key;
    dev_guard_t dg;
    int rc = mt__dnn_dev_enter(m, &dg);
    if (rc == 0)
        rc = run_backward(m, w, dw, io, reserve, g, work);
    mt__dnn_dev_leave(&dg);
    return rc;
}

/* What backward reads back from the caller (y above all: cuDNN's backward takes it again)
 * must be what forward saw. Device memory has no version counter here and memtrace has no
 * kernels of its own, so the bytes come to the host (after the stream's work) and are summed
 * there: a Fletcher sum over 32-bit words in 8 lanes, which any change of one float and any
 * reordering alters. The price is a device-to-host copy of y, x, hx and cx and a stream wait
 * at the end of each training forward and at the start of each backward. A failed copy
 * gives 0 (logged), which the other end's sum then differs from unless it failed too. */
static uint64_t cudnn_checksum(mt_rnn_t *m, const float *p, size_t n)
{
    cudnn_state_t *st = S(m);
    if (n > st->sum_cap) {
        uint32_t *b = realloc(st->sum_buf, n * sizeof *b);
        if (!b)
            goto fail;
        st->sum_buf = b;
        st->sum_cap = n;
    }
    _Static_assert(sizeof(float) == sizeof(uint32_t), "floats are summed as 32-bit words");
    if (mt_stream_synchronize(m->backend, m->cfg.stream) != 0 ||
        mt_memcpy(m->backend, st->sum_buf, p, n * sizeof(float), MT_MEMCPY_DEVICE_TO_HOST) != 0)
        goto fail;
    uint64_t a[8] = {0}, b[8] = {0};
    for (size_t i = 0; i < n; i++) {
        a[i % 8] += st->sum_buf[i];
        b[i % 8] += a[i % 8];
    }
    uint64_t h = n;
    for (int j = 0; j < 8; j++)
        h = (h ^ a[j]) * 0x100000001b3ull ^ b[j];
    return h;

fail:
    plog(m, MT_LOG_ERROR, "rnn: cudnn: cannot read %zu floats back to check them", n);
    return 0;
}

/* Copies and zeroing are queued on the module's stream, in order with the cuDNN calls. */
static int cudnn_copy(mt_rnn_t *m, void *dst, const void *src, size_t n)
{
    if (!n)
        return 0;
    return mt_memcpy_async(m->backend, dst, src, n, MT_MEMCPY_DEVICE_TO_DEVICE, m->cfg.stream);
}

static int cudnn_zero(mt_rnn_t *m, void *dst, size_t n)
{
    if (!n)
        return 0;
    return mt_memset_async(m->backend, dst, 0, n, m->cfg.stream);
}

/* The warm-up's copy of the dropout states (see drop_keep in rnn/internal.h). The states
 * are device memory that holds cuDNN's whole generator (cudnnSetDropoutDescriptor writes
 * it there, each training forward reads and advances it there), so their bytes put back
 * at the same address are the generator as it was. States already stale stay stale. */
static int cudnn_drop_keep(mt_rnn_t *m)
{
    cudnn_state_t *st = S(m);
    st->kept_stale = st->dstates_stale;
    if (!st->dd || st->dstates_stale)
        return 0;
    int rc = mt_alloc_malloc(m->alloc, st->dstates_bytes, m->cfg.stream, MT_TAG_WORKSPACE,
                             &st->dstates_kept);
    if (rc == 0)
        rc = cudnn_copy(m, st->dstates_kept, st->dstates, st->dstates_bytes);
    if (rc && st->dstates_kept) {
        mt_alloc_free(m->alloc, st->dstates_kept);
        st->dstates_kept = NULL;
    }
    if (rc)
        plog(m, MT_LOG_ERROR, "rnn: cudnn: cannot keep a copy of the dropout states (%s)",
             mt_strerror(rc));
    return rc;
}

static int cudnn_drop_restore(mt_rnn_t *m)
{
    cudnn_state_t *st = S(m);
    int rc = 0;
    if (st->dd && st->kept_stale) {
        st->dstates_stale = true;
    } else if (st->dstates_kept) {
        rc = cudnn_copy(m, st->dstates, st->dstates_kept, st->dstates_bytes);
        if (rc) {
            st->dstates_stale = true;
            plog(m, MT_LOG_ERROR,
                 "rnn: cudnn: cannot put the dropout states back after the warm-up (%s): "
                 "the next training forward re-initialises them",
                 mt_strerror(rc));
        }
    }
    if (st->dstates_kept) {
        mt_alloc_free(m->alloc, st->dstates_kept);
        st->dstates_kept = NULL;
    }
    return rc;
}

const mt__rnn_path_t mt__rnn_cudnn_path = {
    .name = "cudnn",
    .init = cudnn_init,
    .fini = cudnn_fini,
    .reserve_bytes = cudnn_reserve_bytes,
    .fwd_work_bytes = cudnn_fwd_work_bytes,
    .bwd_work_bytes = cudnn_bwd_work_bytes,
    .forward = cudnn_forward,
    .backward = cudnn_backward,
    .checksum = cudnn_checksum,
    .checksum_opt_in = true,
    .copy = cudnn_copy,
    .zero = cudnn_zero,
    .drop_reseed = cudnn_drop_reseed,
    .drop_keep = cudnn_drop_keep,
    .drop_restore = cudnn_drop_restore,
};
