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
 * Dropout (p > 0 with L > 1; otherwise the RNN descriptor gets NULL, as before dropout
 * existed): a cudnnDropoutDescriptor set at init with p and the module's dropout seed, on
 * generator states of cudnnDropoutGetStatesSize bytes. The states are one allocator block
 * for the module's life, tagged workspace: like the step workspace they are the library's
 * scratch, not a pass's activations (they neither grow with T and B nor go away between
 * passes, and tagging them activations would make the profiler see activations that never
 * drop to zero). The masks of a pass are cuDNN's business, in its reserve (tagged
 * activations, sized by cudnnGetRNNTempSpaceSizes with the dropout descriptor attached), so
 * activation accounting follows cuDNN. cuDNN applies dropout in TRAINING forwards only.
 * mt_rnn_set_dropout_state re-initialises the states (cudnnSetDropoutDescriptor again).
 *
 * Memory: workspace and reserve are the module's allocations from the caching allocator
 * (tagged workspace and activations), sized by cudnnGetRNNTempSpaceSizes through the size
 * functions below; cuDNN never allocates device memory itself here. Every cuDNN call runs
 * on the module's stream (cudnnSetStream), the stream the allocator orders those blocks on.
 * Inference of a unidirectional module runs chunk by chunk (MT__RNN_CHUNK steps), so its
 * workspace does not grow with the sequence length. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "memtrace/backend.h"

#include "backend/backend_cuda.h"
#include "rnn/cudnn_lib.h"
#include "rnn/internal.h"

/* The RNN API used here (cudnnRNNForward, the _v8 backward calls, cudnnGetRNNWeightParams,
 * cudnnGetLastErrorString) is cuDNN 9's; meson checks this too and leaves the path out. */
#if CUDNN_MAJOR < 9
#error "the cudnn compute path needs cuDNN >= 9"
#endif

/* libcudnn and the runtime calls, loaded by the first module's init (cudnn_lib.c) and kept
 * for the process: every call below goes through it. */
static const mt__dnn_t *dl;

/* One matrix or bias: byte offsets in our flat buffer and in cuDNN's weight space. */
typedef struct region_s {
    size_t ours, dnn, bytes;
} region_t;

/* Per-module cuDNN state. Invariants: rnn, xd, yd, hd exist while h does; T, B > 0 iff the
 * data descriptors, hd and the three sizes describe shape (T, B); lens (tagged workspace)
 * holds lens_T rows of lens_B device int32s, row t - 1 filled with t, or is NULL; regions
 * tile our flat buffer, each also inside [0, weight_bytes) of cuDNN's; gather iff some
 * region's dnn != ours or weight_bytes differs from ours, and then sw, sdw exist. */
typedef struct cudnn_state_s {
    cudnnHandle_t h;
    cudnnRNNDescriptor_t rnn;
    cudnnRNNDataDescriptor_t xd; /* [T, B, input] */
    cudnnRNNDataDescriptor_t yd; /* [T, B, D*H] */
    cudnnTensorDescriptor_t hd;  /* [L*D, B, H]: hx, hy, cx, cy and their gradients */
    cudnnTensorDescriptor_t qd;  /* scratch for cudnnGetRNNWeightParams answers */
    cudnnTensorDescriptor_t bd;
    cudnnDropoutDescriptor_t dd; /* dropout, or NULL (no dropout: NULL to cuDNN) */
    void *dstates;               /* dd's generator states (tagged workspace) */
    size_t dstates_bytes;        /* cudnnDropoutGetStatesSize */
    size_t weight_bytes;         /* cudnnGetRNNWeightSpaceSize */
    region_t *regions;           /* every matrix and bias: where we and cuDNN keep it */
    size_t nregions;
    bool gather; /* cuDNN's layout differs from ours: sw and sdw are in use */
    float *sw;   /* weight space in cuDNN's layout (weight_bytes, tagged weights) */
    float *sdw;  /* its gradients (weight_bytes, tagged grads) */
    int T, B;
    size_t work_inf, work_train, reserve;
    int size_err;   /* the last failed size query's code, 0 after a pass found its sizes */
    int *host_lens; /* B ints: the data descriptors' seqLengthArray (each T unless packed) */
    int host_cap;
    bool packed;    /* the described shape has per-sequence lengths (host_lens) */
    int32_t *plens; /* packed: devSeqLengths of the described shape (plens_cap ints) */
    int plens_cap;
    int32_t *lens;     /* devSeqLengths for every T <= lens_T, B <= lens_B */
    uint32_t *sum_buf; /* host staging of cudnn_checksum (sum_cap words) */
    size_t sum_cap;
    int lens_T, lens_B;
} cudnn_state_t;

static cudnn_state_t *S(const mt_rnn_t *m)
{
    return m->path_state;
}

#define plog(m, level, ...) mt__logf((m)->cfg.log, (m)->cfg.log_ud, level, __VA_ARGS__)

/* cuDNN 9 groups its status codes by thousands. */
static int status_to_mt(cudnnStatus_t s)
{
    if (s == CUDNN_STATUS_SUCCESS)
        return 0;
    switch ((int)s / 1000) {
    case 1:
        return MT_ENODEV; /* not initialised: no driver or device */
    case 2:
        return MT_EINVAL;
    case 3:
        return MT_ENOTSUP;
    default:
        if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
            s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
            return MT_ENOMEM;
        return MT_EIO;
    }
}

/* Maps s, logging the failing call once when it failed. */
static int check(const mt_rnn_t *m, cudnnStatus_t s, const char *what)
{
    int rc = status_to_mt(s);
    if (rc) {
        /* cuDNN 9 says why in its per-thread last-error text: the status alone rarely does. */
        char why[512] = "";
        dl->cudnnGetLastErrorString(why, sizeof why);
        plog(m, MT_LOG_ERROR, "rnn: cudnn: %s failed: %s (%d)%s%s", what,
             dl->cudnnGetErrorString(s), (int)s, why[0] ? ": " : "", why);
    }
    return rc;
}

#define CK(m, call)                                                                                \
    do {                                                                                           \
        int rc_ = check((m), (call), #call);                                                       \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

/* The calling thread's current device while the path works, restored on leave. */
typedef struct dev_guard_s {
    int prev;
    bool switched;
} dev_guard_t;

static int dev_enter(const mt_rnn_t *m, dev_guard_t *g)
{
    g->switched = false;
    int dev = mt_backend_device(m->backend);
    cudaError_t e = dl->cudaGetDevice(&g->prev);
    if (e == cudaSuccess && g->prev != dev) {
        e = dl->cudaSetDevice(dev);
        g->switched = e == cudaSuccess;
    }
    if (e != cudaSuccess) {
        plog(m, MT_LOG_WARN, "rnn: cudnn unavailable: selecting device %d: %s (%d)", dev,
             dl->cudaGetErrorString(e), (int)e);
        return MT_ENODEV;
    }
    return 0;
}

static void dev_leave(const dev_guard_t *g)
{
    if (g->switched)
        dl->cudaSetDevice(g->prev);
}

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
    CK(m, dl->cudnnSetRNNDescriptor_v8(st->rnn, CUDNN_RNN_ALGO_STANDARD, modes[s->mode],
                                       s->bias ? CUDNN_RNN_DOUBLE_BIAS : CUDNN_RNN_NO_BIAS,
                                       s->dirs == 2 ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL,
                                       CUDNN_LINEAR_INPUT, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT,
                                       CUDNN_FMA_MATH, s->input, s->hidden, s->hidden, s->layers,
                                       st->dd, CUDNN_RNN_PADDED_IO_DISABLED));
    return 0;
}

/* True when d (as cudnnGetRNNWeightParams filled it) describes a row-major [rows x cols]
 * float matrix, as the engine's views keep each gate's rows: dims {1, rows, cols}, strides
 * {rows cols, cols, 1}. Counting elements is not enough: a transposed or strided answer has
 * as many and would be read in another order. */
static int desc_matches(const mt_rnn_t *m, cudnnTensorDescriptor_t d, int rows, int cols, bool *ok,
                        char *got, size_t gotlen)
{
    cudnnDataType_t dt;
    int nd = 0, dims[8] = {0}, strides[8] = {0};
    CK(m, dl->cudnnGetTensorNdDescriptor(d, 8, &dt, &nd, dims, strides));
    *ok = dt == CUDNN_DATA_FLOAT && nd == 3 && dims[0] == 1 && dims[1] == rows && dims[2] == cols &&
          strides[1] == cols && strides[2] == 1;
    snprintf(got, gotlen, "dims {%d, %d, %d} strides {%d, %d, %d} (%d dims)", dims[0], dims[1],
             dims[2], strides[0], strides[1], strides[2], nd);
    return 0;
}

/* Records where cuDNN keeps one matrix or bias (got, relative to base) against where our
 * canonical layout keeps it (want, rows x cols). A region cuDNN describes with another
 * shape or strides, or places outside its weight space, cannot be translated: MT_ENOTSUP. */
static int add_region(mt_rnn_t *m, cudnn_state_t *st, const char *what, int p, int id,
                      const void *got, cudnnTensorDescriptor_t d, const float *want, int rows,
                      int cols)
{
    if (!want && !got)
        return 0;
    bool ok = false;
    char shape[160] = "no address";
    int rc = got ? desc_matches(m, d, rows, cols, &ok, shape, sizeof shape) : 0;
    if (rc)
        return rc;
    size_t bytes = (size_t)rows * (size_t)cols * sizeof(float);
    ptrdiff_t off = got ? (const char *)got - (const char *)m->w : -1;
    if (!want || !ok || off < 0 || off % (ptrdiff_t)sizeof(float) != 0 ||
        (size_t)off > st->weight_bytes || st->weight_bytes - (size_t)off < bytes) {
        plog(m, MT_LOG_ERROR,
             "rnn: cudnn describes the %s of pseudo-layer %d, linear layer %d as %s at byte %td "
             "of a %zu-byte weight space; the module has a row-major [%d x %d] float %s there",
             what, p, id, shape, off, st->weight_bytes, want ? rows : 0, cols,
             want ? "block" : "nothing");
        return MT_ENOTSUP;
    }
    st->regions[st->nregions++] = (region_t){
        .ours = (size_t)((const char *)want - (const char *)m->w),
        .dnn = (size_t)off,
        .bytes = bytes,
    };
    return 0;
}

static int by_ours(const void *a, const void *b)
{
    const region_t *x = a, *y = b;
    return x->ours < y->ours ? -1 : x->ours > y->ours;
}

/* Regions next to each other in both layouts become one copy: cuDNN's layout keeps each
 * pseudo-layer's matrices together and its biases together, so a gather is 2 copies per
 * pseudo-layer (1 without bias), not one per gate. */
static void coalesce(cudnn_state_t *st)
{
    qsort(st->regions, st->nregions, sizeof *st->regions, by_ours);
    size_t n = 0;
    for (size_t i = 0; i < st->nregions; i++) {
        region_t *last = n ? &st->regions[n - 1] : NULL;
        const region_t *r = &st->regions[i];
        if (last && last->ours + last->bytes == r->ours && last->dnn + last->bytes == r->dnn)
            last->bytes += r->bytes;
        else
            st->regions[n++] = *r;
    }
    st->nregions = n;
}

/* Asks cuDNN where every matrix and bias lives (addresses relative to a weight space at
 * m->w: cudnnGetRNNWeightParams only computes them) and decides whether to gather. */
static int locate_weights(mt_rnn_t *m, cudnn_state_t *st)
{
    const mt__rnn_shape_t *s = &m->shape;
    size_t H = (size_t)s->hidden;
    st->regions = calloc(m->nviews * (size_t)s->gates, sizeof *st->regions);
    if (!st->regions)
        return MT_ENOMEM;
    for (int l = 0; l < s->layers; l++) {
        int in = mt__rnn_layer_in(s, l);
        for (int d = 0; d < s->dirs; d++) {
            int p = l * s->dirs + d;
            mt__rnn_mats_t mats = mt__rnn_mats(s, m->w, l, d);
            for (int id = 0; id < 2 * s->gates; id++) {
                void *ma = NULL, *ba = NULL;
                CK(m, dl->cudnnGetRNNWeightParams(st->h, st->rnn, p, st->weight_bytes, m->w, id,
                                                  st->qd, &ma, st->bd, &ba));
                bool rec = id >= s->gates;
                int gi = rec ? id - s->gates : id;
                int cols = rec ? s->hidden : in;
                const float *wm = (rec ? mats.r : mats.w) + (size_t)gi * H * (size_t)cols;
                const float *wb = NULL;
                if (s->bias)
                    wb = (rec ? mats.br : mats.bw) + (size_t)gi * H;
                int rc = add_region(m, st, "matrix", p, id, ma, st->qd, wm, s->hidden, cols);
                if (rc == 0)
                    rc = add_region(m, st, "bias", p, id, ba, st->bd, wb, wb ? s->hidden : 0, 1);
                if (rc)
                    return rc;
            }
        }
    }
    coalesce(st);
    st->gather = st->weight_bytes != m->weight_floats * sizeof(float);
    for (size_t i = 0; i < st->nregions; i++)
        st->gather = st->gather || st->regions[i].dnn != st->regions[i].ours;
    if (!st->gather)
        return 0;
    /* Zeroed once: the bytes between and after the regions are never written again, and
     * cuDNN may read the whole space (garbage there could be NaN). */
    int rc = mt_alloc_malloc(m->alloc, st->weight_bytes, m->cfg.stream, MT_TAG_WEIGHTS,
                             (void **)&st->sw);
    if (rc == 0)
        rc = mt_alloc_malloc(m->alloc, st->weight_bytes, m->cfg.stream, MT_TAG_GRADS,
                             (void **)&st->sdw);
    if (rc == 0)
        rc = mt_memset_async(m->backend, st->sw, 0, st->weight_bytes, m->cfg.stream);
    if (rc == 0)
        rc = mt_memset_async(m->backend, st->sdw, 0, st->weight_bytes, m->cfg.stream);
    if (rc == 0)
        plog(m, MT_LOG_INFO,
             "rnn: cudnn's weight layout (%zu bytes) is not the engine's (%zu bytes): each "
             "forward copies the weights into a cudnn-layout copy and each backward the weights "
             "and gradients there and the gradients back (%zu copies of %zu bytes each way), "
             "and the two copies hold %zu bytes",
             st->weight_bytes, m->weight_floats * sizeof(float), st->nregions,
             m->weight_floats * sizeof(float), 2 * st->weight_bytes);
    return rc;
}

/* Gather mode: copies every region of src (one layout) to dst (the other), on the module's
 * stream; to_dnn: ours -> cuDNN's. */
static int copy_regions(mt_rnn_t *m, cudnn_state_t *st, void *dst, const void *src, bool to_dnn)
{
    for (size_t i = 0; i < st->nregions; i++) {
        const region_t *r = &st->regions[i];
        size_t from = to_dnn ? r->ours : r->dnn, to = to_dnn ? r->dnn : r->ours;
        int rc = mt_memcpy_async(m->backend, (char *)dst + to, (const char *)src + from, r->bytes,
                                 MT_MEMCPY_DEVICE_TO_DEVICE, m->cfg.stream);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- data descriptors ---- */

/* Length of each sequence of io's shape: T each, or from the batch sizes (sequence b runs
 * while b < batch_sizes[t]). */
static void shape_lengths(const mt_rnn_io_t *io, int *lens)
{
    int T = io->seq_len, B = io->batch;
    if (!io->batch_sizes) {
        for (int i = 0; i < B; i++)
            lens[i] = T;
        return;
    }
    for (int t = 0; t < T; t++) {
        int lo = t + 1 < T ? io->batch_sizes[t + 1] : 0;
        for (int b = lo; b < io->batch_sizes[t] && b < B; b++)
            lens[b] = t + 1;
    }
}

/* True when io's shape is the one described (no lengths array to compare when padded). */
static bool same_shape(const cudnn_state_t *st, const mt_rnn_io_t *io)
{
    if (st->T != io->seq_len || st->B != io->batch || st->packed != (io->batch_sizes != NULL))
        return false;
    if (!st->packed)
        return true;
    int T = io->seq_len;
    for (int t = 0; t < T; t++) {
        int lo = t + 1 < T ? io->batch_sizes[t + 1] : 0;
        for (int b = lo; b < io->batch_sizes[t]; b++)
            if (st->host_lens[b] != t + 1)
                return false;
    }
    return true;
}

/* Points the data descriptors and the size cache at io's shape. */
static int describe_shape(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    cudnn_state_t *st = S(m);
    const mt__rnn_shape_t *s = &m->shape;
    int T = io->seq_len, B = io->batch;
    st->T = st->B = 0;
    if (B > st->host_cap) {
        int *n = realloc(st->host_lens, (size_t)B * sizeof *n);
        if (!n)
            return MT_ENOMEM;
        st->host_lens = n;
        st->host_cap = B;
    }
    shape_lengths(io, st->host_lens);
    st->packed = io->batch_sizes != NULL;
    CK(m, dl->cudnnSetRNNDataDescriptor(st->xd, CUDNN_DATA_FLOAT,
                                        CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, T, B, s->input,
                                        st->host_lens, NULL));
    CK(m, dl->cudnnSetRNNDataDescriptor(st->yd, CUDNN_DATA_FLOAT,
                                        CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, T, B,
                                        s->dirs * s->hidden, st->host_lens, NULL));
    int dims[3] = {s->layers * s->dirs, B, s->hidden};
    int strides[3] = {B * s->hidden, s->hidden, 1};
    CK(m, dl->cudnnSetTensorNdDescriptor(st->hd, CUDNN_DATA_FLOAT, 3, dims, strides));
    size_t unused;
    CK(m, dl->cudnnGetRNNTempSpaceSizes(st->h, st->rnn, CUDNN_FWD_MODE_INFERENCE, st->xd,
                                        &st->work_inf, &unused));
    CK(m, dl->cudnnGetRNNTempSpaceSizes(st->h, st->rnn, CUDNN_FWD_MODE_TRAINING, st->xd,
                                        &st->work_train, &st->reserve));
    st->T = T;
    st->B = B;
    return 0;
}

/* describe_shape on the backend's device; nothing to do when the shape is already
 * described. */
static int set_shape(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    cudnn_state_t *st = S(m);
    if (same_shape(st, io))
        return 0;
    dev_guard_t g;
    int rc = dev_enter(m, &g);
    if (rc == 0)
        rc = describe_shape(m, io);
    dev_leave(&g);
    return rc;
}

/* A size function cannot return an error: keep it for the call that follows. */
static void shape_for_size(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    int rc = set_shape(m, io);
    if (rc)
        S(m)->size_err = rc;
}

/* The same for a padded shape (T, B). */
static void padded_for_size(const mt_rnn_t *m, int T, int B)
{
    mt_rnn_io_t io = {.seq_len = T, .batch = B};
    shape_for_size(m, &io);
}

/* devSeqLengths: cuDNN reads the lengths from device memory, asynchronously, possibly
 * after the call returns. They are kept as a table (row t - 1 = B copies of t) that only
 * grows: a shape within it needs no copy and no wait, so variable-length batches after a
 * warm-up at the largest shape cost nothing here. Growing makes a new table, filled on
 * the module's stream and waited for (the host staging must outlive the copy); the old one
 * goes back to the allocator stream-ordered, after the work that may still read it. */
static int packed_lengths(mt_rnn_t *m, cudnn_state_t *st);

static int device_lengths(mt_rnn_t *m, cudnn_state_t *st)
{
    if (st->packed)
        return packed_lengths(m, st);
    if (st->lens && st->T <= st->lens_T && st->B <= st->lens_B)
        return 0;
    int nT = st->T > st->lens_T ? st->T : st->lens_T;
    int nB = st->B > st->lens_B ? st->B : st->lens_B;
    size_t n = (size_t)nT * (size_t)nB;
    int32_t *host = malloc(n * sizeof *host);
    if (!host)
        return MT_ENOMEM;
    for (int t = 0; t < nT; t++)
        for (int b = 0; b < nB; b++)
            host[(size_t)t * (size_t)nB + (size_t)b] = t + 1;
    int32_t *dev = NULL;
    int rc =
        mt_alloc_malloc(m->alloc, n * sizeof *host, m->cfg.stream, MT_TAG_WORKSPACE, (void **)&dev);
    if (rc == 0)
        rc = mt_memcpy_async(m->backend, dev, host, n * sizeof *host, MT_MEMCPY_HOST_TO_DEVICE,
                             m->cfg.stream);
    if (rc == 0)
        rc = mt_stream_synchronize(m->backend, m->cfg.stream);
    free(host);
    if (rc) {
        if (dev)
            mt_alloc_free(m->alloc, dev);
        return rc;
    }
    if (st->lens)
        mt_alloc_free(m->alloc, st->lens);
    st->lens = dev;
    st->lens_T = nT;
    st->lens_B = nB;
    return 0;
}

/* Packed shapes: their lengths copied to a device array that only grows (a warm-up at the
 * largest batch makes it large enough), on the module's stream; the host waits for the copy
 * because host_lens is the staging and changes with the next shape. */
static int packed_lengths(mt_rnn_t *m, cudnn_state_t *st)
{
    if (st->B > st->plens_cap) {
        int32_t *dev = NULL;
        int rc = mt_alloc_malloc(m->alloc, (size_t)st->B * sizeof *dev, m->cfg.stream,
                                 MT_TAG_WORKSPACE, (void **)&dev);
        if (rc)
            return rc;
        if (st->plens)
            mt_alloc_free(m->alloc, st->plens);
        st->plens = dev;
        st->plens_cap = st->B;
    }
    _Static_assert(sizeof(int) == sizeof(int32_t), "seqLengthArray is int, devSeqLengths int32");
    int rc = mt_memcpy_async(m->backend, st->plens, st->host_lens, (size_t)st->B * sizeof(int32_t),
                             MT_MEMCPY_HOST_TO_DEVICE, m->cfg.stream);
    if (rc == 0)
        rc = mt_stream_synchronize(m->backend, m->cfg.stream);
    return rc;
}

/* The lengths of the described shape on the device. */
static const int32_t *lengths(const cudnn_state_t *st)
{
    if (st->packed)
        return st->plens;
    return st->lens + (size_t)(st->T - 1) * (size_t)st->lens_B;
}

/* Everything a compute call needs for io's shape. A size query that failed earlier is not
 * returned here: the shape is described afresh, and covers() catches the pass whose
 * buffers were sized by the failed query. */
static int prepare(mt_rnn_t *m, const mt_rnn_io_t *io)
{
    int rc = set_shape(m, io);
    if (rc == 0)
        rc = device_lengths(m, S(m));
    return rc;
}

/* The buffer at p (an allocator block, or a place inside one) has at least need bytes from
 * p on. A pointer the allocator does not know cannot be measured and passes. Short: the
 * error of the failed size query that sized it (logged then), else MT_EINVAL. */
static int covers(const mt_rnn_t *m, const void *p, size_t need, const char *what)
{
    cudnn_state_t *st = S(m);
    void *base = NULL;
    size_t size = 0;
    int tag;
    if (need == 0 || (p && mt_alloc_block_info(m->alloc, p, &base, &size, &tag) != 0))
        return 0;
    size_t have = p ? size - (size_t)((const char *)p - (const char *)base) : 0;
    if (have >= need)
        return 0;
    plog(m, MT_LOG_ERROR, "rnn: cudnn: the %s has %zu bytes, cuDNN needs %zu for this shape%s",
         what, have, need, st->size_err ? " (its size query failed)" : "");
    return st->size_err ? st->size_err : MT_EINVAL;
}

/* ---- the path ---- */

static void cudnn_fini(mt_rnn_t *m)
{
    cudnn_state_t *st = S(m);
    if (!st)
        return;
    dev_guard_t g;
    bool on_device = st->h && dev_enter(m, &g) == 0;
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
        dl->cudnnDestroyTensorDescriptor(st->qd);
    if (st->bd)
        dl->cudnnDestroyTensorDescriptor(st->bd);
    if (st->hd)
        dl->cudnnDestroyTensorDescriptor(st->hd);
    if (st->yd)
        dl->cudnnDestroyRNNDataDescriptor(st->yd);
    if (st->xd)
        dl->cudnnDestroyRNNDataDescriptor(st->xd);
    if (st->rnn)
        dl->cudnnDestroyRNNDescriptor(st->rnn);
    if (st->dd) /* after the RNN descriptor that refers to it */
        dl->cudnnDestroyDropoutDescriptor(st->dd);
    if (st->h)
        dl->cudnnDestroy(st->h);
    if (on_device)
        dev_leave(&g);
    free(st->host_lens);
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
    CK(m, dl->cudnnCreateDropoutDescriptor(&st->dd));
    CK(m, dl->cudnnDropoutGetStatesSize(st->h, &st->dstates_bytes));
    int rc =
        mt_alloc_malloc(m->alloc, st->dstates_bytes, m->cfg.stream, MT_TAG_WORKSPACE, &st->dstates);
    if (rc)
        return rc;
    /* Initialises the states with a kernel on the handle's stream, the module's: in order
     * with the allocation above and the forwards that follow. */
    CK(m, dl->cudnnSetDropoutDescriptor(st->dd, st->h, m->shape.dropout, st->dstates,
                                        st->dstates_bytes, dropout_seed(m)));
    return 0;
}

static int cudnn_drop_reseed(mt_rnn_t *m)
{
    cudnn_state_t *st = S(m);
    if (!st->dd)
        return 0;
    dev_guard_t g;
    int rc = dev_enter(m, &g);
    if (rc == 0)
        rc = check(m,
                   dl->cudnnSetDropoutDescriptor(st->dd, st->h, m->shape.dropout, st->dstates,
                                                 st->dstates_bytes, dropout_seed(m)),
                   "cudnnSetDropoutDescriptor");
    dev_leave(&g);
    return rc;
}

static int init_state(mt_rnn_t *m, cudnn_state_t *st)
{
    CK(m, dl->cudnnSetStream(st->h, (cudaStream_t)mt__cuda_stream_handle(m->cfg.stream)));
    CK(m, dl->cudnnCreateRNNDescriptor(&st->rnn));
    CK(m, dl->cudnnCreateRNNDataDescriptor(&st->xd));
    CK(m, dl->cudnnCreateRNNDataDescriptor(&st->yd));
    CK(m, dl->cudnnCreateTensorDescriptor(&st->hd));
    CK(m, dl->cudnnCreateTensorDescriptor(&st->qd));
    CK(m, dl->cudnnCreateTensorDescriptor(&st->bd));
    int rc = init_dropout(m, st);
    if (rc == 0)
        rc = set_rnn_descriptor(m, st);
    if (rc)
        return rc;
    CK(m, dl->cudnnGetRNNWeightSpaceSize(st->h, st->rnn, &st->weight_bytes));
    return locate_weights(m, st);
}

static int cudnn_init(mt_rnn_t *m)
{
    if (!mt__cuda_is_cuda(m->backend))
        return MT_ENOTSUP;
    char why[384];
    if (mt__dnn_open(&dl, why, sizeof why) != 0) {
        plog(m, MT_LOG_WARN, "rnn: cudnn unavailable: %s", why);
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
    size_t v = dl->cudnnGetVersion();
    if (v < 90000) {
        plog(m, MT_LOG_WARN,
             "rnn: cudnn unavailable: the loaded libcudnn is version %zu (%zu.%zu), this path "
             "needs 9 or newer (built against %d.%d.%d)",
             v, v / 1000, v % 1000 / 100, CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
        cudnn_fini(m);
        return MT_ENODEV;
    }
    plog(m, MT_LOG_INFO, "rnn: cudnn: libcudnn %zu.%zu.%zu (built against %d.%d.%d)", v / 10000,
         v % 10000 / 100, v % 100, CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
    dev_guard_t g;
    int rc = dev_enter(m, &g);
    if (rc) {
        cudnn_fini(m);
        return rc;
    }
    cudnnStatus_t cs = dl->cudnnCreate(&st->h);
    if (cs != CUDNN_STATUS_SUCCESS) {
        st->h = NULL;
        plog(m, MT_LOG_WARN, "rnn: cudnn unavailable: cudnnCreate: %s (%d)",
             dl->cudnnGetErrorString(cs), (int)cs);
        rc = status_to_mt(cs) == MT_ENOMEM ? MT_ENOMEM : MT_ENODEV;
    } else {
        rc = init_state(m, st);
    }
    dev_leave(&g);
    if (rc)
        cudnn_fini(m);
    return rc;
}

static size_t cudnn_reserve_bytes(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    shape_for_size(m, io);
    return S(m)->T ? S(m)->reserve : 0;
}

/* Inference of a unidirectional module runs in chunks of MT__RNN_CHUNK steps, each a
 * cudnnRNNForward whose final states start the next, so its workspace (cuDNN's grows with
 * T) is bounded independently of T, as the engine promises (U2). Packed batches run as one
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
        padded_for_size(m, shapes[i], B);
        if (!S(m)->T)
            return 0;
        w = S(m)->work_inf > w ? S(m)->work_inf : w;
    }
    return w;
}

static size_t cudnn_fwd_work_bytes(const mt_rnn_t *m, const mt_rnn_io_t *io, bool training)
{
    if (chunked(m, io, training)) {
        size_t w = chunk_work_bytes(m, io->seq_len, io->batch);
        return w ? align_up(w, 512) + 4 * state_bytes(m, io->batch) : 0;
    }
    shape_for_size(m, io);
    return S(m)->T ? (training ? S(m)->work_train : S(m)->work_inf) : 0;
}

/* Backward's workspace is cuDNN's training workspace, followed by room for dx when the
 * caller does not want it (cudnnRNNBackwardData_v8 always writes dx). */
static size_t dx_scratch_offset(const cudnn_state_t *st)
{
    return align_up(st->work_train, 512);
}

static size_t cudnn_bwd_work_bytes(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    shape_for_size(m, io);
    if (!S(m)->T)
        return 0;
    size_t rows = io->batch_sizes ? io->tokens : (size_t)io->seq_len * (size_t)io->batch;
    return dx_scratch_offset(S(m)) + rows * (size_t)m->shape.input * sizeof(float);
}

/* One cudnnRNNForward over io with weight space ws. */
static int forward_once(mt_rnn_t *m, const void *ws, const mt_rnn_io_t *io, bool training,
                        void *reserve, void *work)
{
    cudnn_state_t *st = S(m);
    int rc = prepare(m, io);
    if (rc)
        return rc;
    rc = covers(m, work, training ? st->work_train : st->work_inf, "workspace");
    if (rc == 0 && training)
        rc = covers(m, reserve, st->reserve, "reserve");
    if (rc)
        return rc;
    st->size_err = 0;
    bool lstm = m->shape.mode == MT_RNN_LSTM;
    CK(m, dl->cudnnRNNForward(st->h, st->rnn,
                              training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE,
                              lengths(st), st->xd, io->x, st->yd, io->y, st->hd, io->hx, io->hy,
                              st->hd, lstm ? io->cx : NULL, lstm ? io->cy : NULL, st->weight_bytes,
                              ws, training ? st->work_train : st->work_inf, work,
                              training ? st->reserve : 0, training ? reserve : NULL));
    return 0;
}

/* Inference chunk by chunk (see chunked()): chunk k reads the states chunk k - 1 wrote into
 * the workspace's ping-pong buffers; the first reads io's, the last writes io's. */
static int forward_chunks(mt_rnn_t *m, const void *ws, const mt_rnn_io_t *io, void *work)
{
    const mt__rnn_shape_t *s = &m->shape;
    int T = io->seq_len, B = io->batch;
    size_t sb = state_bytes(m, B);
    size_t cw = chunk_work_bytes(m, T, B);
    if (!cw) {
        int rc = S(m)->size_err;
        S(m)->size_err = 0;
        return rc ? rc : MT_EIO;
    }
    char *states = (char *)work + align_up(cw, 512);
    float *h[2] = {(float *)states, (float *)(states + sb)};
    float *c[2] = {(float *)(states + 2 * sb), (float *)(states + 3 * sb)};
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
    int rc = st->gather ? copy_regions(m, st, st->sw, w, true) : 0;
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
    int rc = prepare(m, io);
    if (rc)
        return rc;
    /* Gather mode: the forward's weights again (another call may have used sw since), and
     * the module's gradients, which cuDNN adds to and which go back afterwards. */
    if (st->gather) {
        rc = copy_regions(m, st, st->sw, w, true);
        if (rc == 0)
            rc = copy_regions(m, st, st->sdw, dw, true);
        if (rc)
            return rc;
    }
    const void *ws = st->gather ? (const void *)st->sw : w;
    float *dws = st->gather ? st->sdw : dw;
    bool lstm = m->shape.mode == MT_RNN_LSTM;
    size_t xbytes = (io->batch_sizes ? io->tokens : (size_t)io->seq_len * (size_t)io->batch) *
                    (size_t)m->shape.input * sizeof(float);
    rc = covers(m, work, g->dx ? st->work_train : dx_scratch_offset(st) + xbytes, "workspace");
    if (rc == 0)
        rc = covers(m, reserve, st->reserve, "reserve");
    if (rc)
        return rc;
    st->size_err = 0;
    void *dx = g->dx ? (void *)g->dx : (char *)work + dx_scratch_offset(st);
    /* Data first: it leaves in the reserve what the weight gradients are computed from. */
    CK(m, dl->cudnnRNNBackwardData_v8(st->h, st->rnn, lengths(st), st->yd, io->y, g->dy, st->xd, dx,
                                      st->hd, io->hx, g->dhy, g->dhx, st->hd, lstm ? io->cx : NULL,
                                      lstm ? g->dcy : NULL, lstm ? g->dcx : NULL, st->weight_bytes,
                                      ws, st->work_train, work, st->reserve, reserve));
    /* ADD: gradients accumulate in the module's grad buffer (zeroed by the module), or in
     * its cudnn-layout copy, which then goes back. */
    CK(m, dl->cudnnRNNBackwardWeights_v8(st->h, st->rnn, CUDNN_WGRAD_MODE_ADD, lengths(st), st->xd,
                                         io->x, st->hd, io->hx, st->yd, io->y, st->weight_bytes,
                                         dws, st->work_train, work, st->reserve, reserve));
    return st->gather ? copy_regions(m, st, dw, st->sdw, false) : 0;
}

/* drop_key is unused: cuDNN draws the masks from its states and keeps them in its reserve. */
static int cudnn_forward(mt_rnn_t *m, const float *w, const mt_rnn_io_t *io, bool training,
                         uint64_t drop_key, void *reserve, void *work)
{
    (void)drop_key;
    dev_guard_t dg;
    int rc = dev_enter(m, &dg);
    if (rc == 0)
        rc = run_forward(m, w, io, training, reserve, work);
    dev_leave(&dg);
    return rc;
}

static int cudnn_backward(mt_rnn_t *m, const float *w, float *dw, const mt_rnn_io_t *io,
                          uint64_t drop_key, void *reserve, const mt_rnn_grad_io_t *g, void *work)
{
    (void)drop_key;
    dev_guard_t dg;
    int rc = dev_enter(m, &dg);
    if (rc == 0)
        rc = run_backward(m, w, dw, io, reserve, g, work);
    dev_leave(&dg);
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
    .copy = cudnn_copy,
    .zero = cudnn_zero,
    .drop_reseed = cudnn_drop_reseed,
};
