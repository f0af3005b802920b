/* memtrace RNN engine: RNN (tanh/relu), LSTM and GRU layers over the caching allocator.
 *
 * Formulas are cuDNN's (= PyTorch's): LSTM gates i, f, g, o; GRU gates r, z, n with the
 * linear-before-reset form n = tanh(W_n x + b_Wn + r * (R_n h + b_Rn)). Tensors are float32,
 * sequence-major: x [T, B, input_size], y [T, B, D*H], states [L*D, B, H] (D = 2 when
 * bidirectional). Every pointer passed to the engine is device memory of the module's
 * allocator (on the sim backend, host-addressable memory).
 *
 * All weights live in ONE flat buffer (tagged weights) in the engine's layout (the one
 * older cuDNN documentation calls canonical; where cuDNN reports another, the cuDNN path
 * copies, docs/cudnn.md): pseudo-layers in the order layer 0 forward, layer 0 reverse, layer 1
 * forward, ...; inside each, W_0..W_{g-1} ([H x in] row-major), R_0..R_{g-1} ([H x H]), then the g
 * input biases, then the g recurrent biases ([H] each); g = 4 (LSTM: i, f, g, o), 3 (GRU: r, z, n),
 * 1 (RNN); in = input_size for layer 0, D*H above. Parameters are exposed as named views with
 * PyTorch's names and shapes (weight_ih_l{k}[_reverse] = [g*H, in], the g W matrices
 * stacked; weight_hh_... = [g*H, H]; bias_ih_..., bias_hh_... = [g*H]). Gradients live in a
 * second flat buffer (tagged grads) with the same layout and ACCUMULATE, as cuDNN's do.
 *
 * Dropout between layers (cfg.dropout = p, as PyTorch's nn.LSTM(dropout=p) and cuDNN's RNN
 * dropout): in a TRAINING forward, the output of every layer but the last is multiplied, on
 * its way into the next layer, by a mask that is 0 with probability p and 1 / (1 - p)
 * otherwise (inverted dropout); for a bidirectional module the mask covers the concatenated
 * [forward, reverse] output. Inference forwards and mt_rnn_step apply none; neither do the
 * recurrent states, hy, nor y (the top layer's output). Backward sends gradients through the
 * same mask. p = 0 (the default) computes exactly what a module without dropout does.
 * Masks (cpu path) are a function of the dropout seed, the module's count of training
 * forwards since that seed was set, the layer and the element, so a pass can be reproduced
 * with mt_rnn_set_dropout_state and its masks read with mt_rnn_dropout_mask. They are not
 * kept in the reserve: backward regenerates them, so activation memory per step (and
 * mt_rnn_activation_bytes' engine figures) is the same with or without dropout, and
 * activation offload works with dropout, bit-identical to the plain run with the same masks.
 * cuDNN path: cuDNN's own dropout (a dropout descriptor whose generator states, from
 * cudnnDropoutGetStatesSize, are one allocator block tagged workspace for the module's life),
 * its masks in cuDNN's reserve (tagged activations, sized by cuDNN); each training forward
 * advances the states. Its weight layout, math mode and the tolerance between the two paths:
 * docs/cudnn.md.
 *
 * Activation offload (U4): with offload_window = W > 0, a training forward keeps the reserve
 * of at most W chunks of chunk_steps time steps on the device; older chunks are copied to
 * pinned host memory (offload_host) on a side stream and come back ahead of need during
 * backward, which holds at most W + 1 chunks. The arithmetic is the same code in the same
 * order with or without offload (the engine always works in those chunks), so outputs and
 * gradients are bit-identical to the plain run of the same module. CPU path,
 * unidirectional modules only (MT_ENOTSUP otherwise).
 *
 * Thread-safety: a module is used by one thread at a time; different modules may run in
 * parallel (the allocator serialises their allocations). */
#ifndef MEMTRACE_RNN_H
#define MEMTRACE_RNN_H

#include <stdbool.h>
#include "memtrace/alloc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_rnn_s mt_rnn_t;
/* The pinned host cache of memtrace/host.h. */
struct mt_host_cache_s;
/* What a training forward keeps for backward (the reserve space). Opaque. */
typedef struct mt_rnn_reserve_s mt_rnn_reserve_t;

typedef enum mt_rnn_mode_e {
    MT_RNN_TANH = 0, /* h' = tanh(W x + R h + b_W + b_R) */
    MT_RNN_RELU = 1, /* h' = relu(W x + R h + b_W + b_R) */
    MT_RNN_LSTM = 2,
    MT_RNN_GRU = 3, /* linear-before-reset */
} mt_rnn_mode_e;

typedef struct mt_rnn_cfg_s {
    mt_rnn_mode_e mode;
    int input_size;      /* >= 1 */
    int hidden_size;     /* H >= 1 */
    int num_layers;      /* L >= 1 */
    bool bidirectional;  /* D = 2 if true, else 1 */
    bool bias;           /* false: no bias entries in the layout (cuDNN's NO_BIAS); true */
    uint64_t seed;       /* initialisation: uniform(-1/sqrt(H), 1/sqrt(H)) from this seed */
    mt_alloc_t *alloc;   /* borrowed, required; outlives the module */
    mt_stream_t *stream; /* borrowed, optional (NULL = default stream) */
    mt_log_cb log;       /* optional */
    void *log_ud;
    /* Time steps per chunk of the engine's batched GEMMs and of its reserve blocks (cpu
     * path); 0 = 64. Part of the arithmetic: runs of modules with different chunks round
     * differently (within float error). */
    int chunk_steps;
    /* Activation offload (see above): chunks of reserve kept on the device during forward,
     * 0 = no offload; offload_host (borrowed, over the allocator's backend) is required
     * when > 0. Changed later with mt_rnn_set_offload. */
    int offload_window;
    struct mt_host_cache_s *offload_host;
    /* Dropout between layers (see above): probability in [0, 1), 0 = none (MT_EINVAL and a
     * logged error otherwise; a warning when > 0 with one layer, where it does nothing). */
    float dropout;
    uint64_t dropout_seed; /* the masks' seed (the cuDNN path seeds cuDNN's states with it) */
    /* cpu path: the GEMM library, "cblas" (the linked one), "blis" or "dnnl" (oneDNN),
     * loaded at run time; NULL or "auto" = the default
     * chosen by measurement for the thread count (docs/blas.md: dnnl at one thread; at two
     * or more, cblas where it is OpenBLAS, else blis; each else the next, else cblas).
     * MT_ENOTSUP (logged) if a library asked for by name cannot be loaded. oneDNN runs on
     * libgomp, whose team spins between calls unless the program's environment has
     * OMP_WAIT_POLICY=PASSIVE before the first call (docs/blas.md): the library never sets
     * it. */
    const char *gemm;
    /* cudnn path: checksum what backward reads back from the caller (y, x, hx, cx) at the
     * end of each training forward and again before backward, and refuse a backward whose
     * inputs changed (MT_EINVAL, logged). Each check copies those buffers to the host after
     * a stream wait, so it is a debugging aid, off by default (docs/cudnn.md); mt_rnn_cfg_from_env
     * sets it from MEMTRACE_RNN_CHECK_SAVED=1. The cpu path always checks (host memory, no
     * copy). */
    bool check_saved;
} mt_rnn_cfg_t;

/* Forward inputs and outputs. Pointers are borrowed for the call; after a TRAINING forward,
 * x, y, hx and cx must stay unchanged until mt_rnn_backward (the reserve refers to them, as
 * cuDNN's backward takes them again; the cpu path checks: MT_EINVAL naming the one changed).
 * Packed input (batch_sizes != NULL, see docs/rnn-packed.md): x is [tokens, input_size] and
 * y [tokens, D*H], time-major, the batch_sizes[t] rows of step t contiguous; sequences in
 * decreasing length; states [L*D, B, H] in that order, hy/cy each sequence's state at its
 * own last step. MT_EINVAL (logged) unless B = batch_sizes[0] >= batch_sizes[t] >=
 * batch_sizes[t+1] >= 1 and their sum = tokens. */
typedef struct mt_rnn_io_s {
    int seq_len;            /* T >= 1 (packed: the longest length) */
    int batch;              /* B >= 1 */
    const float *x;         /* [T, B, input_size], required */
    float *y;               /* [T, B, D*H], required */
    const float *hx;        /* [L*D, B, H], NULL = zeros */
    const float *cx;        /* LSTM only: [L*D, B, H], NULL = zeros */
    float *hy;              /* [L*D, B, H], optional: final hidden states */
    float *cy;              /* LSTM only, optional: final cell states */
    const int *batch_sizes; /* packed: [T] host memory, NULL = every sequence T steps */
    size_t tokens;          /* packed: rows of x and y (sum of the lengths); else unused */
} mt_rnn_io_t;

/* Backward inputs and outputs (gradients of the loss); packed: dy and dx have the rows of
 * y and x ([tokens, ...]). */
typedef struct mt_rnn_grad_io_s {
    const float *dy;  /* [T, B, D*H], required */
    const float *dhy; /* [L*D, B, H], NULL = zeros */
    const float *dcy; /* LSTM only, NULL = zeros */
    float *dx;        /* [T, B, input_size], optional (NULL = not computed) */
    float *dhx;       /* [L*D, B, H], optional */
    float *dcx;       /* LSTM only, optional */
} mt_rnn_grad_io_t;

typedef enum mt_rnn_param_kind_e {
    MT_RNN_WEIGHT_IH = 0, /* [g*H, in] */
    MT_RNN_WEIGHT_HH = 1, /* [g*H, H] */
    MT_RNN_BIAS_IH = 2,   /* [g*H] */
    MT_RNN_BIAS_HH = 3,   /* [g*H] */
} mt_rnn_param_kind_e;

/* A named view of one parameter. */
typedef struct mt_rnn_param_s {
    const char *name; /* borrowed from the module, e.g. "weight_hh_l1_reverse" */
    int kind;         /* mt_rnn_param_kind_e */
    int layer;        /* 0 .. L-1 */
    int dir;          /* 0 forward, 1 reverse */
    size_t offset;    /* floats from the start of the flat weight (and grad) buffer */
    size_t numel;     /* rows x cols */
    int rows;         /* g*H */
    int cols;         /* in, H, or 1 for biases */
    float *data;      /* where the parameter lives now: flat + offset unless rebound */
    float *grad;      /* grad flat buffer + offset (always) */
} mt_rnn_param_t;

/* Counters of one module. */
typedef struct mt_rnn_stats_s {
    bool flat;                /* every parameter lives in the flat buffer */
    uint64_t compactions;     /* calls that had to copy the weights into a temporary */
    uint64_t compacted_bytes; /* bytes copied by those compactions */
    uint64_t forwards;        /* mt_rnn_forward + mt_rnn_step calls */
    uint64_t backwards;
    size_t weight_bytes; /* size of the flat buffer */
    /* Activation offload, totals since creation. */
    uint64_t offloads;      /* reserve chunks copied to pinned host memory */
    uint64_t restores;      /* chunks copied back */
    uint64_t offload_bytes; /* device -> host */
    uint64_t restore_bytes; /* host -> device */
    /* The latest training pass (forward to backward or release): its whole reserve, and the
     * most of it on the device at once (equal without offload). */
    size_t pass_reserve_bytes;
    size_t pass_reserve_peak_bytes;
} mt_rnn_stats_t;

/* Activation memory of a training forward, and what an op-by-op cell would keep.
 * Units: "H-vectors" = H floats per (time step, batch element, layer, direction).
 * Engine: LSTM 6 (i, f, g, o after activation, c, h), GRU 5 (r, z, n, R_n h + b_Rn, h),
 * RNN 1 (h); the h of the top layer is the output y, which the caller holds. The cpu path
 * pads a row of gates by 16 floats when g*H is a multiple of 256 (LSTM H = 256: 6.0625).
 * Op-by-op (every intermediate of a per-step autograd cell stays alive until backward):
 * LSTM 21 = W x + b (4) + R h + b (4) + their sum (4) + sigmoid/tanh outputs (4)
 *         + f*c, i*g, c, tanh(c), o*tanh(c) = h (5);
 * GRU 17  = W x + b (3) + R h + b (3) + r,z sums (2) + r, z (2) + r*(R_n h + b) (1)
 *         + n sum (1) + n (1) + 1-z, (1-z)*n, z*h, h (4);
 * RNN 4   = W x + b, R h + b, sum, h.
 * With dropout (p > 0, L > 1), op by op also keeps each lower layer's dropped output (1) and
 * its byte mask (1/4): opbyop_hvec grows by 1.25 (L-1)/L; the engine's figures do not change
 * (it regenerates masks in backward). */
typedef struct mt_rnn_act_s {
    double engine_hvec;           /* H-vectors kept per (step, batch, layer-direction) */
    double opbyop_hvec;           /* the op-by-op estimate, same unit */
    size_t engine_bytes_per_step; /* for the given B, all layers and directions */
    size_t opbyop_bytes_per_step;
    size_t reserve_bytes; /* what mt_rnn_forward(training) allocates (tagged
                           * activations; cpu path: one block per chunk of
                           * chunk_steps steps) for the given T and B; excludes y */
} mt_rnn_act_t;

/* Defaults: LSTM, input 1, hidden 1, 1 layer, unidirectional, with biases, seed 1, chunks
 * of 64 steps, no offload, no dropout (dropout_seed 0), no saved-inputs check on the cudnn
 * path. */
MT_API mt_rnn_cfg_t mt_rnn_cfg_default(void);
/* Applies $MEMTRACE_RNN_GEMM (a gemm name, or "auto") to cfg->gemm if set and not empty:
 * the value is borrowed from the environment; and $MEMTRACE_RNN_CHECK_SAVED (set, not "0")
 * to cfg->check_saved. mt_rnn_create reads no environment variable
 * of a module's settings; programs that honour this one call this at their edge. */
MT_API int mt_rnn_cfg_from_env(mt_rnn_cfg_t *cfg);

/* Creates a module and its flat weight and gradient buffers (gradients zeroed), weights
 * initialised from cfg->seed. *out is new. MT_ENOTSUP if the allocator's backend has no
 * compute path in this build (a CUDA device without cuDNN). */
MT_API int mt_rnn_create(mt_rnn_t **out, const mt_rnn_cfg_t *cfg);
/* Sets activation offload for the following training passes (window 0 = none; host
 * borrowed, required when window > 0). MT_ENOTSUP for bidirectional modules or a path
 * without chunked reserves, MT_EINVAL for a host cache over another backend. A pass
 * already forwarded keeps the setting it started with. */
MT_API int mt_rnn_set_offload(mt_rnn_t *m, struct mt_host_cache_s *host, int window);
/* Dropout state: the seed of the masks and the number of training forwards since (each
 * successful training forward adds one; mt_rnn_warmup's does not count). Setting a state
 * again makes the following training forwards draw the same masks as after the first time:
 * save it with mt_rnn_dropout_state before a pass, set it back to redo the pass. A
 * replica (mt_rnn_replicate) starts at (cfg.dropout_seed, 0). cuDNN path: setting the state
 * re-initialises cuDNN's generator (cudnnSetDropoutDescriptor) from a seed that mixes both
 * (the seed itself when counter is 0); it is a fresh start, not where cuDNN's generator
 * would be after counter forwards. cuDNN documents only that each training forward reads
 * and advances the states, and that its results repeat on the same GPU architecture and
 * cuDNN version: the masks repeat for the same sequence of training forwards of the same
 * shapes there, not across GPU models or cuDNN versions, and they are not the cpu path's.
 * Reading the state back gives what was set plus the forwards since. */
MT_API int mt_rnn_set_dropout_state(mt_rnn_t *m, uint64_t seed, uint64_t counter);
MT_API int mt_rnn_dropout_state(const mt_rnn_t *m, uint64_t *seed, uint64_t *counter);
/* The mask of the training forward made at state (seed, counter), applied to the output of
 * layer 0 .. L-2 for shape (seq_len, batch): out (host memory, seq_len * batch * D*H floats,
 * laid out as y) gets the factor each element is multiplied by, 0 or 1 / (1 - p) (all 1
 * without dropout). MT_EINVAL for a layer outside [0, L-1), MT_ENOTSUP on the cuDNN path. */
MT_API int mt_rnn_dropout_mask(const mt_rnn_t *m, uint64_t seed, uint64_t counter, int layer,
                               int seq_len, int batch, float *out);
/* Frees the module's buffers (and any parameter bindings it owns). Sets *p = NULL. */
MT_API void mt_rnn_destroy(mt_rnn_t **p);

MT_API const mt_rnn_cfg_t *mt_rnn_cfg(const mt_rnn_t *m);
/* "cpu" (sim backend; GEMMs on CBLAS, BLIS or oneDNN) or "cudnn". Static string. */
MT_API const char *mt_rnn_path_name(const mt_rnn_t *m);
/* cpu path: the GEMM library in use ("cblas", "blis", "dnnl"; "cudnn" on that path) and a
 * line naming its version and kernel, the cell loops' ISA level (MEMTRACE_CPU_ISA caps it;
 * docs/blas.md), and libxsmm's when the per-step products run on it (built with libxsmm,
 * an AVX2 CPU, MEMTRACE_RNN_XSMM not "0"). Static strings. */
MT_API const char *mt_rnn_gemm_name(const mt_rnn_t *m);
MT_API const char *mt_rnn_gemm_info(const mt_rnn_t *m);
/* Threads of the module's GEMM library (process-wide for that library: this call is the
 * program's choice to change it); at two or more, the module starts min(threads, 8) - 1 worker
 * threads of its own (joined by mt_rnn_destroy) and a pass runs in that many parts plus one
 * (docs/rnn-cpu.md, Threads). A module on the default library takes the default for the new
 * count. At two, the
 * forward's workspace holds W^T in libxsmm's panels too: call mt_rnn_warmup after this. MT_ENOTSUP
 * where the library has no setter (or on the cuDNN path). */
MT_API int mt_rnn_set_gemm_threads(mt_rnn_t *m, int threads);

/* ---- parameters ---- */

/* The flat buffers (borrowed) and their length in floats (count may be NULL). */
MT_API float *mt_rnn_weights(const mt_rnn_t *m, size_t *count);
MT_API float *mt_rnn_grads(const mt_rnn_t *m, size_t *count);
/* Sets every gradient to zero. */
MT_API int mt_rnn_zero_grads(mt_rnn_t *m);
/* Number of named parameters: 2 or 4 per layer and direction. */
MT_API size_t mt_rnn_param_count(const mt_rnn_t *m);
/* The i-th parameter, in PyTorch's order. MT_ENOENT if i is out of range. */
MT_API int mt_rnn_param_get(const mt_rnn_t *m, size_t i, mt_rnn_param_t *out);
MT_API int mt_rnn_param_find(const mt_rnn_t *m, const char *name, mt_rnn_param_t *out);
/* Rebinds parameter name to numel floats at ptr (borrowed: device memory that outlives the
 * binding), as a replicated or hand-modified module would have them. The values at ptr are
 * the parameter from now on. Binding ptr = flat + offset makes it flat again. */
MT_API int mt_rnn_bind_param(mt_rnn_t *m, const char *name, float *ptr);
/* True if every parameter lives at its place in the flat buffer. */
MT_API bool mt_rnn_is_flat(const mt_rnn_t *m);
/* Copies every rebound parameter into the flat buffer and binds it there again. */
MT_API int mt_rnn_flatten(mt_rnn_t *m);
/* A copy of m on another allocator (device): same configuration, the parameters' current
 * values, flat from construction (it never compacts), zero gradients. *out is new. */
MT_API int mt_rnn_replicate(const mt_rnn_t *m, mt_alloc_t *alloc, mt_rnn_t **out);

/* ---- compute ---- */

/* Forward over a whole sequence. With reserve != NULL it runs in training mode: *reserve is
 * new and holds what backward needs (tagged activations) until mt_rnn_backward or
 * mt_rnn_reserve_release. With reserve == NULL it runs in inference mode: nothing is kept,
 * and for unidirectional modules the temporary memory is bounded independently of T. If the
 * parameters are not flat, they are compacted into a temporary copy first (U1: one warning
 * per module through the log, one MT_EV_COMPACTION event per compaction). */
MT_API int mt_rnn_forward(mt_rnn_t *m, const mt_rnn_io_t *io, mt_rnn_reserve_t **reserve);
/* Backward for data and weights of the training forward that made *reserve. Weight
 * gradients are added to the grad buffer. Takes ownership of *reserve (released even on
 * failure) and sets *reserve = NULL. */
MT_API int mt_rnn_backward(mt_rnn_t *m, mt_rnn_reserve_t **reserve, const mt_rnn_grad_io_t *g);
/* Releases a reserve without running backward. Sets *reserve = NULL. */
MT_API void mt_rnn_reserve_release(mt_rnn_t *m, mt_rnn_reserve_t **reserve);
/* One inference time step for batch B: x [B, input_size], y [B, D*H] (may be NULL),
 * hx/cx [L*D, B, H] (NULL = zeros), hy/cy [L*D, B, H] required (cy for LSTM). hy must not
 * alias hx (ping-pong two state buffers). Memory use does not depend on how many steps run.
 * Unidirectional modules only (MT_EINVAL otherwise). */
MT_API int mt_rnn_step(mt_rnn_t *m, int batch, const float *x, const float *hx, const float *cx,
                       float *y, float *hy, float *cy);
/* mt_rnn_step keeps one step's workspace (tagged workspace) in the module between calls, so
 * generation makes no allocator call per step; this frees it (the next step re-makes it). */
MT_API int mt_rnn_step_release(mt_rnn_t *m);

/* ---- packed sequences (docs/rnn-packed.md) ---- */

/* The shape of a batch of sequences of their own lengths (host memory, owned: init/fini).
 * Invariants: lengths non-increasing, in [1, capacity]; batch_sizes[t] = #{i : lengths[i] >
 * t} for t < max_len = lengths[0]; tokens = sum of lengths; sorted_indices and
 * unsorted_indices are inverse permutations of [0, batch). */
typedef struct mt_rnn_pack_s {
    int batch;             /* B >= 1 */
    int capacity;          /* padded length of the tensors pack/unpack read and write */
    int max_len;           /* T = the longest length */
    size_t tokens;         /* N = rows of the packed form */
    int *lengths;          /* [B], packed order (decreasing) */
    int *batch_sizes;      /* [T] */
    int *sorted_indices;   /* [B]: packed sequence i is input sequence sorted_indices[i] */
    int *unsorted_indices; /* [B]: input sequence j is packed sequence unsorted_indices[j] */
} mt_rnn_pack_t;

/* From lengths[batch] (host memory) of sequences padded to capacity steps. enforce_sorted:
 * the lengths are promised non-increasing (MT_EINVAL if not), the order is kept; false:
 * sorted here (stable), as PyTorch's enforce_sorted=False. MT_EINVAL (logged through log)
 * for a length < 1 or > capacity. */
MT_API int mt_rnn_pack_init(mt_rnn_pack_t *p, const int *lengths, int batch, int capacity,
                            bool enforce_sorted, mt_log_cb log, void *log_ud);
MT_API void mt_rnn_pack_fini(mt_rnn_pack_t *p);
/* Sets io's seq_len, batch, batch_sizes (borrowed from p) and tokens. */
MT_API void mt_rnn_pack_io(const mt_rnn_pack_t *p, mt_rnn_io_t *io);
/* Device copies through m's path: padded [capacity, B, width] (input order) -> packed
 * [tokens, width]; unpack the reverse, steps past a sequence's end set to 0. */
MT_API int mt_rnn_pack(mt_rnn_t *m, const mt_rnn_pack_t *p, int width, const float *padded,
                       float *packed);
MT_API int mt_rnn_unpack(mt_rnn_t *m, const mt_rnn_pack_t *p, int width, const float *packed,
                         float *padded);
/* States [groups, B, width] from input order to packed order (hx, cx) and back (hy, cy);
 * src and dst must not alias. */
MT_API int mt_rnn_pack_states(mt_rnn_t *m, const mt_rnn_pack_t *p, int groups, int width,
                              const float *src, float *dst);
MT_API int mt_rnn_unpack_states(mt_rnn_t *m, const mt_rnn_pack_t *p, int groups, int width,
                                const float *src, float *dst);

/* Warm-up (U2): runs a training forward and backward at the largest shape (max_T, max_B)
 * on zero inputs inside mt_alloc_warmup_begin/end, with its own input and output buffers
 * (tagged batch), so that a later forward and backward within those bounds makes no
 * backend malloc, the caller's buffers included when they are among the step's twelve
 * (x, y, hx, cx, hy, cy and their gradients) allocated before the forward, or the gradients
 * between it and the backward (docs/rnn-cpu.md, Warm-up).
 * Gradients are unchanged (zero inputs give zero gradients). */
MT_API int mt_rnn_warmup(mt_rnn_t *m, int max_T, int max_B);
/* The same for packed batches: afterwards any packed batch of at most max_tokens tokens and
 * max_batch sequences (any lengths) makes no backend malloc. MT_EINVAL if max_tokens <
 * max_batch. */
MT_API int mt_rnn_warmup_packed(mt_rnn_t *m, size_t max_tokens, int max_batch);

/* ---- reporting ---- */

MT_API int mt_rnn_stats(const mt_rnn_t *m, mt_rnn_stats_t *out);
/* Activation memory for a training forward of seq_len x batch; see mt_rnn_act_t. */
MT_API int mt_rnn_activation_bytes(const mt_rnn_t *m, int seq_len, int batch, mt_rnn_act_t *out);
/* The same for a packed batch (batch_sizes[seq_len], host memory; MT_EINVAL, logged, if it
 * is not one): reserve_bytes is that of its tokens, the per-step figures those of B =
 * batch_sizes[0]. */
MT_API int mt_rnn_activation_bytes_packed(const mt_rnn_t *m, int seq_len, const int *batch_sizes,
                                          mt_rnn_act_t *out);
/* Static name of a mode: "rnn_tanh", "rnn_relu", "lstm", "gru"; "unknown" otherwise. */
MT_API const char *mt_rnn_mode_name(int mode);

#ifdef __cplusplus
}
#endif
#endif
