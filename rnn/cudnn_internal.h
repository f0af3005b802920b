/* The cudnn path's shared state and helpers (cudnn_path.c: the path; cudnn_weights.c: where
 * cuDNN keeps each matrix and the copies between layouts; cudnn_shape.c: data descriptors,
 * sizes and device lengths; cudnn_lib.c: loading, status codes, the device guard). */
#ifndef MT_RNN_CUDNN_INTERNAL_H
#define MT_RNN_CUDNN_INTERNAL_H

/* Only builds with cuDNN's headers use it (the layer check compiles each folder's headers
 * without them). */
#if __has_include(<cudnn.h>)
#include "rnn/cudnn_lib.h"
#include "rnn/internal.h"
#include "util/log.h"

/* The RNN API used here (cudnnRNNForward, the _v8 backward calls, cudnnGetRNNWeightParams,
 * cudnnGetLastErrorString) is cuDNN 9's; meson checks this too and leaves the path out. */
#if CUDNN_MAJOR < 9
#error "the cudnn compute path needs cuDNN >= 9"
#endif

/* The loaded library (cudnn_path.c sets it at the first init). */
extern const mt__dnn_t *mt__dnn;

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
    void *dstates_kept;          /* warm-up: a copy of dstates (dstates_bytes), else NULL */
    bool dstates_stale;          /* a re-seed (or a warm-up's restore) failed midway: dstates
                                  * may hold neither state; the next training forward
                                  * re-initialises them from the module's seed and counter */
    bool kept_stale;             /* dstates_stale when the warm-up kept them */
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
    int32_t *plens; /* packed: devSeqLengths (plens_cap ints), its first plens_n = plens_key */
    int plens_cap;
    int *plens_key;    /* host copy of what plens holds (plens_cap ints); staging of its copy */
    int plens_n;       /* lengths plens holds, 0 = none (a new plens, or a failed copy) */
    int32_t *lens;     /* devSeqLengths for every T <= lens_T, B <= lens_B */
    uint32_t *sum_buf; /* host staging of cudnn_checksum (sum_cap words) */
    size_t sum_cap;
    int lens_T, lens_B;
} cudnn_state_t;

static inline cudnn_state_t *S(const mt_rnn_t *m)
{
    return m->path_state;
}

#define plog(m, level, ...) mt__logf((m)->cfg.log, (m)->cfg.log_ud, level, __VA_ARGS__)

/* cuDNN's status as an MT_E* code. */
int mt__dnn_status(cudnnStatus_t s);
/* Maps s, logging the failing call (with cuDNN's last-error text) when it failed. */
int mt__dnn_check(const mt_rnn_t *m, cudnnStatus_t s, const char *what);

#define CK(m, call)                                                                                \
    do {                                                                                           \
        int rc_ = mt__dnn_check((m), (call), #call);                                               \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

/* The calling thread's current device while the path works, restored on leave. */
typedef struct dev_guard_s {
    int prev;
    bool switched;
} dev_guard_t;

int mt__dnn_dev_enter(const mt_rnn_t *m, dev_guard_t *g);
void mt__dnn_dev_leave(const dev_guard_t *g);

/* cudnn_weights.c: asks cuDNN where every matrix and bias lives, checks each is a row-major
 * [H x cols] float block, and decides whether to gather (then sw, sdw exist, zeroed). */
int mt__dnn_locate_weights(mt_rnn_t *m, cudnn_state_t *st);
/* Copies every region of src (one layout) to dst (the other) on the module's stream;
 * to_dnn: the engine's -> cuDNN's. */
int mt__dnn_copy_regions(mt_rnn_t *m, cudnn_state_t *st, void *dst, const void *src, bool to_dnn);

/* cudnn_shape.c. A size function cannot return an error: describes io's shape for the size
 * queries, keeping a failure in size_err. */
void mt__dnn_shape_for_size(const mt_rnn_t *m, const mt_rnn_io_t *io);
void mt__dnn_padded_for_size(const mt_rnn_t *m, int T, int B);
/* Everything a compute call needs for io's shape (descriptors, device lengths). */
int mt__dnn_prepare(mt_rnn_t *m, const mt_rnn_io_t *io);
/* The lengths of the described shape on the device. */
const int32_t *mt__dnn_lengths(const cudnn_state_t *st);
/* The buffer at p has at least need bytes (see cudnn_shape.c). */
int mt__dnn_covers(const mt_rnn_t *m, const void *p, size_t need, const char *what);

#endif
#endif
