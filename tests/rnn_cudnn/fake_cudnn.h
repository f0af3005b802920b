/* A fake of the cuDNN 9 calls the "cudnn" compute path makes (fake_cudnn.c,
 * fake_cudnn_compute.c), and of the four CUDA runtime calls it makes (cudaGetDevice,
 * cudaSetDevice, cudaGetErrorString, cudaRuntimeGetVersion): a shared library the path loads in
 * place of libcudnn and libcudart (MEMTRACE_LIBCUDNN, MEMTRACE_LIBCUDART), which the tests also
 * link for these controls. It records every call with its arguments, answers size and layout
 * queries from cuDNN's layout (or the engine's, or a perturbed one, on demand), checks the
 * arguments of the compute calls the way cuDNN's contract states them, and touches the memory it is
 * given (through the fake driver's shadow of device memory), so an undersized buffer shows up under
 * ASan.
 *
 * Its kernels compute: a reference RNN (fake_cudnn_ref.c) reads every matrix and bias where
 * this fake's cudnnGetRNNWeightParams says it is, in cuDNN's layout (all matrices of all
 * pseudo-layers first, then all biases), keeps its activations in the reserve, reads the
 * top layer's h back from y in backward, and draws dropout masks from the generator states,
 * whose counter each training forward with dropout advances. The state descriptors must be
 * fully packed [L D, B, H]. fake_dnn_markers(true) turns the kernels into markers for the
 * plumbing tests: forward writes every y element as the last float of the last region and
 * hy = hx + 1; backward data writes dx = 2 dy; backward weights adds k + 1 to the float it
 * keeps for element k of the canonical layout, so a gradient buffer in our layout reads
 * k + 1 per backward exactly when every region landed home. */
#ifndef MT_TESTS_RNN_CUDNN_FAKE_CUDNN_H
#define MT_TESTS_RNN_CUDNN_FAKE_CUDNN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cudnn.h>

/* One recorded call. Which argument lands where is listed per function in fake_cudnn.c. */
typedef struct fake_dnn_call_s {
    const char *name;
    size_t clock;     /* the clock (fake driver calls so far) when the call was made */
    int device;       /* the runtime's current device during the call */
    const void *p[8]; /* pointer arguments (and pointers returned) */
    size_t n[4];      /* byte sizes */
    int i[16];        /* ints and enums */
    double f;         /* a float argument (dropout) */
    uint64_t u;       /* a 64-bit argument (seed) */
    cudnnStatus_t status;
} fake_dnn_call_t;

/* Forgets every call, failure and perturbation (live objects are kept). */
void fake_dnn_reset(void);
/* Clock read at each call, to order cuDNN calls against the fake driver's log. */
void fake_dnn_set_clock(size_t (*clock)(void));
/* The next call of name returns status (recorded, no effect). */
void fake_dnn_fail(const char *name, cudnnStatus_t status);
/* Reports the matrix of (pseudo_layer, lin_id) bytes away from its canonical place. */
void fake_dnn_shift_param(int pseudo_layer, int lin_id, ptrdiff_t bytes);
/* Describes the matrix of (pseudo_layer, lin_id) transposed: [cols x H], as many elements. */
void fake_dnn_transpose_param(int pseudo_layer, int lin_id);
/* Reports a weight space this many bytes larger (unused bytes at its end). */
void fake_dnn_weight_space_extra(size_t bytes);
/* Reports a padded layout: the space starts with align bytes and every matrix and bias
 * starts at a multiple of align (0 = the canonical layout, the default). */
void fake_dnn_pad_layout(size_t align);
/* The layout: false (the default) = cuDNN's, all matrices first, then all biases; true =
 * the engine's canonical one (per pseudo-layer: matrices, then biases). */
void fake_dnn_interleaved_layout(bool on);
/* Compute calls write markers (see above) instead of computing. */
void fake_dnn_markers(bool on);
/* Forward refuses a weight space whose bytes outside every region are not zero. */
void fake_dnn_check_padding(bool on);
/* cudnnGetVersion's answer (default 91900). */
void fake_dnn_set_version(size_t version);
/* Forward and backward data refuse to run unless element j of every region holds canon + j
 * (its index in the canonical layout), wherever this layout puts the region. */
void fake_dnn_expect_weights(bool on);
/* Called at the end of each successful compute call (forward, backward data/weights),
 * while its buffers are still live. */
void fake_dnn_set_hook(void (*hook)(const fake_dnn_call_t *c, void *ud), void *ud);

/* The fake runtime's current device of the (single) calling thread. */
int fake_dnn_current_device(void);
void fake_dnn_set_current_device(int device);

/* The seqLengthArray a data descriptor (a call's p0) was last set with: its batch, and up to
 * cap lengths copied to out. Packed shapes get workspace (training) and reserve sized by
 * their sum of lengths, which is T x B when every sequence is T long. */
size_t fake_dnn_data_lengths(const void *desc, int *out, int cap);

size_t fake_dnn_ncalls(void);
const fake_dnn_call_t *fake_dnn_call(size_t i);
/* Index of the first call named name at or after from, or SIZE_MAX. */
size_t fake_dnn_find(const char *name, size_t from);
size_t fake_dnn_count(const char *name);
/* Handles and descriptors created and not destroyed. */
long fake_dnn_live(void);
/* Why the last compute call was refused ("" if none). */
const char *fake_dnn_last_error(void);

/* The fake's temporary-space sizes (deliberately not multiples of 512). */
size_t fake_dnn_work_bytes(int training, int gates, int hidden, int T, int B);
size_t fake_dnn_reserve_bytes(int gates, int hidden, int layers, int dirs, int T, int B);
/* Dropout: cudnnDropoutGetStatesSize's answer (not a multiple of 512), and what a dropout
 * descriptor with p > 0 adds to the training reserve (a byte per element of the outputs of
 * layers 0 .. L-2). A training forward with dropout checks the states still hold what
 * cudnnSetDropoutDescriptor wrote (its seed's low byte everywhere), records i5 = 1, and
 * counts itself here. */
size_t fake_dnn_dropout_states_bytes(void);
size_t fake_dnn_dropout_reserve_bytes(int hidden, int layers, int dirs, int T, int B);
size_t fake_dnn_dropout_forwards(void);

#endif
