/* What the fake cuDNN's two files share (fake_cudnn.c: calls, descriptors, layout, sizes;
 * fake_cudnn_compute.c: the compute calls over the reference RNN). Test code only. */
#ifndef MT_TESTS_RNN_CUDNN_FAKE_CUDNN_INT_H
#define MT_TESTS_RNN_CUDNN_FAKE_CUDNN_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "tests/rnn_cudnn/fake_cudnn.h"

#define MAXCALLS 16384

struct cudnnContext {
    cudaStream_t stream;
    int device; /* current when the handle was created */
};

struct cudnnTensorStruct {
    int nd;
    int dims[8];
    int strides[8];
};

struct cudnnDropoutStruct {
    bool set;
    float p;
    void *states;
    size_t bytes;
    unsigned long long seed;
};

struct cudnnRNNStruct {
    bool set;
    int algo, mode, bias, dir, input_mode, dtype, mprec, math;
    int input, hidden, proj, layers;
    uint32_t aux;
    cudnnDropoutDescriptor_t drop; /* as given to cudnnSetRNNDescriptor_v8 */
};

#define FAKE_MAX_BATCH 256

struct cudnnRNNDataStruct {
    bool set;
    int layout, T, B, vec;
    bool full;                /* every sequence is T long */
    size_t tokens;            /* rows of the tensor: the sum of the lengths when packed, T B else */
    int lens[FAKE_MAX_BATCH]; /* the seqLengthArray copied */
    bool has_fill;            /* unpacked: padding rows of outputs get fill */
    float fill;
};

typedef struct fake_state_s {
    fake_dnn_call_t calls[MAXCALLS];
    size_t ncalls;
    size_t (*clock)(void);
    const char *fail_name;
    cudnnStatus_t fail_status;
    int shift_p, shift_id;
    int trans_p, trans_id; /* this matrix is described transposed ([cols x H]) */
    ptrdiff_t shift;
    size_t extra;
    size_t pad;          /* padded layout: region alignment in bytes, 0 = canonical */
    bool expect_weights; /* forward checks weight k of our layout holds the value k */
    bool interleaved;    /* layout: per pseudo-layer matrices then biases (else all matrices
                          * of all pseudo-layers first, then all biases: cuDNN's) */
    bool markers;        /* compute calls write markers instead of computing */
    bool check_pad;      /* forward refuses weight-space bytes outside regions that are not 0 */
    size_t version;      /* cudnnGetVersion's answer */
    void (*hook)(const fake_dnn_call_t *c, void *ud);
    void *hook_ud;
    long live;
    char err[256];
    const void *data_done_reserve; /* reserve of the last backward data */
    size_t dropout_forwards;       /* training forwards with dropout applied */
    int device;                    /* the runtime's current device */
} fake_state_t;

extern fake_state_t fake_dnn_state;
#define F fake_dnn_state

/* One matrix or bias: where the canonical layout has it (floats) and where this fake says
 * it is (bytes). */
typedef struct region_s {
    int p, id;
    bool bias;
    size_t canon, n, dnn;
} region_t;

#define MAXREG 4096
extern region_t R[MAXREG];

/* Records a call; returns the injected failure for it, if any. */
fake_dnn_call_t *fake_dnn_rec(const char *name, cudnnStatus_t *st);
/* Refuses c with a reason (kept for fake_dnn_last_error and cudnnGetLastErrorString). */
cudnnStatus_t fake_dnn_refuse(fake_dnn_call_t *c, const char *why);
/* Where this fake's "kernels" read and write a device address: the fake driver's device
 * memory is not host-addressable, its bytes live behind fake_cuda_shadow. */
void *fake_dnn_dev(const void *p);
#define DEV(p) fake_dnn_dev(p)

#define BEGIN(name)                                                                                \
    cudnnStatus_t st_;                                                                             \
    fake_dnn_call_t *c = fake_dnn_rec(name, &st_);                                                 \
    if (st_ != CUDNN_STATUS_SUCCESS)                                                               \
    return st_

int fake_dnn_gates_of(const struct cudnnRNNStruct *r);
int fake_dnn_dirs_of(const struct cudnnRNNStruct *r);
/* Fills R (see fake_cudnn.c); returns the region count, *space the weight space's bytes. */
size_t fake_dnn_layout(const struct cudnnRNNStruct *r, size_t *space);
size_t fake_dnn_space_bytes(const struct cudnnRNNStruct *r);
size_t fake_dnn_reserve_of(const struct cudnnRNNStruct *d, int T, int B);
size_t fake_dnn_work_of(const struct cudnnRNNStruct *d, const struct cudnnRNNDataStruct *xd,
                        bool training);

#endif
