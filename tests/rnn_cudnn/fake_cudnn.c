/* The fake cuDNN (see fake_cudnn.h). A test double: one process-wide state is the whole
 * library. Recorded arguments per call:
 *   cudnnCreate                 p0 handle
 *   cudnnSetStream              p0 handle, p1 stream
 *   cudnnSetRNNDescriptor_v8    p0 desc, p1 dropoutDesc; i0 algo, i1 cellMode, i2 biasMode,
 *                               i3 dirMode, i4 inputMode, i5 dataType, i6 mathPrec,
 *                               i7 mathType, i8 input, i9 hidden, i10 proj, i11 layers,
 *                               i12 auxFlags
 *   cudnnSetRNNDataDescriptor   p0 desc; i0 dataType, i1 layout, i2 T, i3 B, i4 vectorSize,
 *                               i5 1 if every seqLengthArray entry is T; p1 paddingFill;
 *                               n0 the sum of the lengths (fake_dnn_data_lengths: the array)
 *   cudnnSetTensorNdDescriptor  p0 desc; i0 nbDims, i1..i3 dims
 *   cudnnGetRNNWeightSpaceSize  n0 answer
 *   cudnnGetRNNTempSpaceSizes   p0 xDesc; i0 fwdMode; n0 workspace, n1 reserve
 *   cudnnGetRNNWeightParams     p0 weightSpace, p1 mAddr (returned), p2 bAddr (returned);
 *                               i0 pseudoLayer, i1 linLayerID; n0 weightSpaceSize
 *   cudnnRNNForward             p0 x, p1 y, p2 hx, p3 hy, p4 weightSpace, p5 workSpace,
 *                               p6 reserveSpace, p7 devSeqLengths; i0 fwdMode, i1 cx != NULL,
 *                               i2 cy != NULL, i3 T, i4 B, i5 1 if dropout was applied;
 *                               n0 weight, n1 work, n2 reserve sizes
 *   cudnnRNNBackwardData_v8     p0 y, p1 dy, p2 dx, p3 weightSpace, p4 workSpace,
 *                               p5 reserveSpace, p6 devSeqLengths, p7 dhx; n0..n2 sizes
 *   cudnnRNNBackwardWeights_v8  p0 x, p1 hx, p2 y, p3 dweightSpace, p4 workSpace,
 *                               p5 reserveSpace, p6 devSeqLengths; i0 addGrad; n0..n2 sizes
 *   cudnnAddTensor              p0 A, p1 C; n0 bytes
 *   cudnnDropoutGetStatesSize   p0 handle; n0 answer
 *   cudnnSetDropoutDescriptor   p0 desc, p1 handle, p2 states; n0 stateSizeInBytes; f dropout,
 *                               u seed
 *   cudnnCreate/DestroyDropoutDescriptor  p0 desc */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/rnn_cudnn/fake_cudnn.h"
#include "tests/rnn_cudnn/fake_cudnn_ref.h"

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

static struct {
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
} F = {.shift_p = -1, .trans_p = -1, .version = 91900};

void fake_dnn_reset(void)
{
    F.ncalls = 0;
    F.fail_name = NULL;
    F.shift_p = -1;
    F.trans_p = -1;
    F.shift = 0;
    F.extra = 0;
    F.pad = 0;
    F.expect_weights = false;
    F.interleaved = false;
    F.markers = false;
    F.check_pad = false;
    F.version = 91900;
    F.hook = NULL;
    F.err[0] = 0;
    F.data_done_reserve = NULL;
    F.dropout_forwards = 0;
}

size_t fake_dnn_dropout_forwards(void)
{
    return F.dropout_forwards;
}

void fake_dnn_set_clock(size_t (*clock)(void))
{
    F.clock = clock;
}

void fake_dnn_fail(const char *name, cudnnStatus_t status)
{
    F.fail_name = name;
    F.fail_status = status;
}

void fake_dnn_shift_param(int pseudo_layer, int lin_id, ptrdiff_t bytes)
{
    F.shift_p = pseudo_layer;
    F.shift_id = lin_id;
    F.shift = bytes;
}

void fake_dnn_transpose_param(int pseudo_layer, int lin_id)
{
    F.trans_p = pseudo_layer;
    F.trans_id = lin_id;
}

void fake_dnn_weight_space_extra(size_t bytes)
{
    F.extra = bytes;
}

void fake_dnn_pad_layout(size_t align)
{
    F.pad = align;
}

void fake_dnn_expect_weights(bool on)
{
    F.expect_weights = on;
}

void fake_dnn_interleaved_layout(bool on)
{
    F.interleaved = on;
}

void fake_dnn_markers(bool on)
{
    F.markers = on;
}

void fake_dnn_check_padding(bool on)
{
    F.check_pad = on;
}

void fake_dnn_set_version(size_t version)
{
    F.version = version;
}

void fake_dnn_set_hook(void (*hook)(const fake_dnn_call_t *c, void *ud), void *ud)
{
    F.hook = hook;
    F.hook_ud = ud;
}

size_t fake_dnn_ncalls(void)
{
    return F.ncalls;
}

const fake_dnn_call_t *fake_dnn_call(size_t i)
{
    return i < F.ncalls ? &F.calls[i] : NULL;
}

size_t fake_dnn_find(const char *name, size_t from)
{
    for (size_t i = from; i < F.ncalls; i++)
        if (strcmp(F.calls[i].name, name) == 0)
            return i;
    return SIZE_MAX;
}

size_t fake_dnn_count(const char *name)
{
    size_t n = 0;
    for (size_t i = 0; i < F.ncalls; i++)
        n += strcmp(F.calls[i].name, name) == 0;
    return n;
}

int fake_dnn_current_device(void)
{
    return F.device;
}

void fake_dnn_set_current_device(int device)
{
    F.device = device;
}

long fake_dnn_live(void)
{
    return F.live;
}

const char *fake_dnn_last_error(void)
{
    return F.err;
}

size_t fake_dnn_work_bytes(int training, int gates, int hidden, int T, int B)
{
    size_t tbh = (size_t)T * (size_t)B * (size_t)hidden * (size_t)gates;
    return training ? 3001 + 8 * tbh : 1001 + 4 * (size_t)B * (size_t)hidden * (size_t)gates;
}

size_t fake_dnn_reserve_bytes(int gates, int hidden, int layers, int dirs, int T, int B)
{
    return 777 + 4 * (size_t)T * (size_t)B * (size_t)hidden * (size_t)layers * (size_t)dirs *
                     (size_t)(2 * gates + 2);
}

/* The fake driver's streams run on their own threads: a "kernel" of this fake runs on
 * the caller's thread, so it first waits for all stream work queued before it, which
 * keeps the stream order a real cuDNN kernel would see (more waiting, never less). */
static void (*drv_idle)(void);
static void *(*drv_shadow)(const void *dptr);

static void drain_streams(void)
{
    const char *path = getenv("MEMTRACE_LIBCUDA");
    if (drv_idle == NULL && path != NULL) {
        void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (lib != NULL) {
            *(void **)&drv_idle = dlsym(lib, "fake_cuda_idle");
            *(void **)&drv_shadow = dlsym(lib, "fake_cuda_shadow");
        }
    }
    if (drv_idle != NULL)
        drv_idle();
}

/* Where this fake's "kernels" read and write a device address: the fake driver's device
 * memory is not host-addressable, its bytes live behind fake_cuda_shadow. */
#define DEV(p) ((p) != NULL && drv_shadow != NULL ? drv_shadow(p) : (void *)(p))

/* Records a call; returns the injected failure for it, if any. */
static fake_dnn_call_t *rec(const char *name, cudnnStatus_t *st)
{
    static fake_dnn_call_t overflow;
    drain_streams();
    fake_dnn_call_t *c = F.ncalls < MAXCALLS ? &F.calls[F.ncalls++] : &overflow;
    memset(c, 0, sizeof *c);
    c->name = name;
    c->clock = F.clock ? F.clock() : 0;
    c->device = F.device;
    *st = CUDNN_STATUS_SUCCESS;
    if (F.fail_name && strcmp(F.fail_name, name) == 0) {
        F.fail_name = NULL;
        *st = F.fail_status;
    }
    c->status = *st;
    return c;
}

static cudnnStatus_t refuse(fake_dnn_call_t *c, const char *why)
{
    snprintf(F.err, sizeof F.err, "%s: %s", c->name, why);
    c->status = CUDNN_STATUS_BAD_PARAM;
    return CUDNN_STATUS_BAD_PARAM;
}

#define BEGIN(name)                                                                                \
    cudnnStatus_t st_;                                                                             \
    fake_dnn_call_t *c = rec(name, &st_);                                                          \
    if (st_ != CUDNN_STATUS_SUCCESS)                                                               \
    return st_

/* ---- the runtime's device selection ---- */

cudaError_t cudaGetDevice(int *device)
{
    *device = F.device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    cudnnStatus_t st;
    fake_dnn_call_t *c = rec("cudaSetDevice", &st);
    c->i[0] = device;
    if (st != CUDNN_STATUS_SUCCESS)
        return cudaErrorInvalidDevice;
    F.device = device;
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t error)
{
    return error == cudaSuccess ? "no error" : "fake runtime error";
}

/* ---- handles and descriptors ---- */

const char *cudnnGetErrorString(cudnnStatus_t status)
{
    return status == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS" : "FAKE_CUDNN_STATUS_ERROR";
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle)
{
    BEGIN("cudnnCreate");
    *handle = calloc(1, sizeof **handle);
    (*handle)->device = F.device;
    F.live++;
    c->p[0] = *handle;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle)
{
    BEGIN("cudnnDestroy");
    c->p[0] = handle;
    free(handle);
    F.live--;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream)
{
    BEGIN("cudnnSetStream");
    c->p[0] = handle;
    c->p[1] = stream;
    handle->stream = stream;
    return CUDNN_STATUS_SUCCESS;
}

#define CREATE_DESTROY(T, create, destroy)                                                         \
    cudnnStatus_t create(T *d)                                                                     \
    {                                                                                              \
        BEGIN(#create);                                                                            \
        *d = calloc(1, sizeof **d);                                                                \
        F.live++;                                                                                  \
        c->p[0] = *d;                                                                              \
        return CUDNN_STATUS_SUCCESS;                                                               \
    }                                                                                              \
    cudnnStatus_t destroy(T d)                                                                     \
    {                                                                                              \
        BEGIN(#destroy);                                                                           \
        c->p[0] = d;                                                                               \
        free(d);                                                                                   \
        F.live--;                                                                                  \
        return CUDNN_STATUS_SUCCESS;                                                               \
    }

CREATE_DESTROY(cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor)
CREATE_DESTROY(cudnnRNNDescriptor_t, cudnnCreateRNNDescriptor, cudnnDestroyRNNDescriptor)
CREATE_DESTROY(cudnnRNNDataDescriptor_t, cudnnCreateRNNDataDescriptor,
               cudnnDestroyRNNDataDescriptor)
CREATE_DESTROY(cudnnDropoutDescriptor_t, cudnnCreateDropoutDescriptor,
               cudnnDestroyDropoutDescriptor)

size_t fake_dnn_dropout_states_bytes(void)
{
    return 70001;
}

cudnnStatus_t cudnnDropoutGetStatesSize(cudnnHandle_t handle, size_t *sizeInBytes)
{
    BEGIN("cudnnDropoutGetStatesSize");
    c->p[0] = handle;
    if (!handle)
        return refuse(c, "no handle");
    *sizeInBytes = fake_dnn_dropout_states_bytes();
    c->n[0] = *sizeInBytes;
    return CUDNN_STATUS_SUCCESS;
}

/* Checks the states cover what GetStatesSize said (p > 0) and "initialises" them: a byte
 * pattern from the seed, over every byte (an undersized block shows up under ASan). */
cudnnStatus_t cudnnSetDropoutDescriptor(cudnnDropoutDescriptor_t d, cudnnHandle_t handle,
                                        float dropout, void *states, size_t stateSizeInBytes,
                                        unsigned long long seed)
{
    BEGIN("cudnnSetDropoutDescriptor");
    c->p[0] = d;
    c->p[1] = handle;
    c->p[2] = states;
    c->n[0] = stateSizeInBytes;
    c->f = dropout;
    c->u = seed;
    if (!d || !handle || handle->device != F.device)
        return refuse(c, "descriptor, handle or device");
    if (!(dropout >= 0.0f && dropout < 1.0f))
        return refuse(c, "dropout outside [0, 1)");
    if (dropout > 0.0f && (!states || stateSizeInBytes < fake_dnn_dropout_states_bytes()))
        return refuse(c, "states missing or smaller than cudnnDropoutGetStatesSize");
    if (states) {
        /* a counter of training forwards (0), then the seed's low byte */
        memset(DEV(states), (int)(seed & 0xff), stateSizeInBytes);
        if (stateSizeInBytes >= sizeof(uint64_t))
            memset(DEV(states), 0, sizeof(uint64_t));
    }
    *d = (struct cudnnDropoutStruct){true, dropout, states, stateSizeInBytes, seed};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t d, cudnnDataType_t dataType,
                                         int nbDims, const int dimA[], const int strideA[])
{
    BEGIN("cudnnSetTensorNdDescriptor");
    c->p[0] = d;
    c->i[0] = nbDims;
    if (nbDims < 1 || nbDims > 8 || dataType != CUDNN_DATA_FLOAT)
        return refuse(c, "bad dims or type");
    d->nd = nbDims;
    for (int k = 0; k < nbDims; k++) {
        d->dims[k] = dimA[k];
        d->strides[k] = strideA[k];
        if (k < 3)
            c->i[1 + k] = dimA[k];
    }
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t d, int nbDimsRequested,
                                         cudnnDataType_t *dataType, int *nbDims, int dimA[],
                                         int strideA[])
{
    BEGIN("cudnnGetTensorNdDescriptor");
    c->p[0] = d;
    *dataType = CUDNN_DATA_FLOAT;
    *nbDims = d->nd;
    for (int k = 0; k < d->nd && k < nbDimsRequested; k++) {
        dimA[k] = d->dims[k];
        strideA[k] = d->strides[k];
    }
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetRNNDescriptor_v8(cudnnRNNDescriptor_t d, cudnnRNNAlgo_t algo,
                                       cudnnRNNMode_t cellMode, cudnnRNNBiasMode_t biasMode,
                                       cudnnDirectionMode_t dirMode, cudnnRNNInputMode_t inputMode,
                                       cudnnDataType_t dataType, cudnnDataType_t mathPrec,
                                       cudnnMathType_t mathType, int32_t inputSize,
                                       int32_t hiddenSize, int32_t projSize, int32_t numLayers,
                                       cudnnDropoutDescriptor_t dropoutDesc, uint32_t auxFlags)
{
    BEGIN("cudnnSetRNNDescriptor_v8");
    c->p[0] = d;
    c->p[1] = dropoutDesc;
    int v[] = {algo,     cellMode,  biasMode,   dirMode,  inputMode, dataType,     mathPrec,
               mathType, inputSize, hiddenSize, projSize, numLayers, (int)auxFlags};
    memcpy(c->i, v, sizeof v);
    if (inputSize < 1 || hiddenSize < 1 || numLayers < 1 || projSize != hiddenSize)
        return refuse(c, "bad sizes");
    if (dropoutDesc && !dropoutDesc->set)
        return refuse(c, "dropout descriptor not set");
    *d = (struct cudnnRNNStruct){true,       algo,     cellMode,  biasMode, dirMode,
                                 inputMode,  dataType, mathPrec,  mathType, inputSize,
                                 hiddenSize, projSize, numLayers, auxFlags, dropoutDesc};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetRNNDataDescriptor(cudnnRNNDataDescriptor_t d, cudnnDataType_t dataType,
                                        cudnnRNNDataLayout_t layout, int maxSeqLength,
                                        int batchSize, int vectorSize, const int seqLengthArray[],
                                        void *paddingFill)
{
    BEGIN("cudnnSetRNNDataDescriptor");
    bool full = true;
    for (int b = 0; b < batchSize; b++)
        full = full && seqLengthArray[b] == maxSeqLength;
    c->p[0] = d;
    c->p[1] = paddingFill;
    int v[] = {dataType, layout, maxSeqLength, batchSize, vectorSize, full};
    memcpy(c->i, v, sizeof v);
    if (maxSeqLength < 1 || batchSize < 1 || vectorSize < 1 || batchSize > FAKE_MAX_BATCH)
        return refuse(c, "bad sizes");
    if (dataType != CUDNN_DATA_FLOAT)
        return refuse(c, "data type other than float");
    if (layout != CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED &&
        layout != CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED &&
        layout != CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED)
        return refuse(c, "unknown layout");
    /* cuDNN's packed layout: lengths in [1, T], non-increasing (sorted by length). */
    size_t tokens = 0;
    for (int b = 0; b < batchSize; b++) {
        int n = seqLengthArray[b];
        if (n < 1 || n > maxSeqLength)
            return refuse(c, "a sequence length outside [1, maxSeqLength]");
        if (layout == CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED && b > 0 && n > seqLengthArray[b - 1])
            return refuse(c, "packed layout with lengths not in decreasing order");
        tokens += (size_t)n;
    }
    c->n[0] = tokens;
    if (layout != CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED) /* padded: T B rows */
        tokens = (size_t)maxSeqLength * (size_t)batchSize;
    *d = (struct cudnnRNNDataStruct){.set = true,
                                     .fill = paddingFill ? *(const float *)paddingFill : 0.0f,
                                     .has_fill = paddingFill != NULL,
                                     .layout = layout,
                                     .T = maxSeqLength,
                                     .B = batchSize,
                                     .vec = vectorSize,
                                     .full = full,
                                     .tokens = tokens};
    memcpy(d->lens, seqLengthArray, (size_t)batchSize * sizeof(int));
    return CUDNN_STATUS_SUCCESS;
}

/* ---- the layout, written independently of the engine's layout.c ---- */

static int gates_of(const struct cudnnRNNStruct *r)
{
    return r->mode == CUDNN_LSTM ? 4 : r->mode == CUDNN_GRU ? 3 : 1;
}

static int dirs_of(const struct cudnnRNNStruct *r)
{
    return r->dir == CUDNN_BIDIRECTIONAL ? 2 : 1;
}

/* One matrix or bias: where the canonical layout has it (floats) and where this fake says
 * it is (bytes). */
typedef struct region_s {
    int p, id;
    bool bias;
    size_t canon, n, dnn;
} region_t;

#define MAXREG 4096
static region_t R[MAXREG];

/* Fills R in canonical order (per pseudo-layer: W_0..W_{g-1}, R_0..R_{g-1}, input biases,
 * recurrent biases; canon counts floats in that order, the engine's layout) and returns
 * their count; *space = the weight space's bytes. Where this fake puts them (dnn, bytes):
 * by default cuDNN's layout as every public description gives it, all matrices of all
 * pseudo-layers first (in canonical order), then all biases; with F.interleaved, the
 * canonical order itself. Padded (F.pad > 0): the space starts with F.pad bytes and every
 * region starts at a multiple of F.pad. */
static size_t layout(const struct cudnnRNNStruct *r, size_t *space)
{
    size_t g = (size_t)gates_of(r), H = (size_t)r->hidden, canon = 0, k = 0;
    for (int p = 0; p < r->layers * dirs_of(r); p++) {
        size_t in = p / dirs_of(r) == 0 ? (size_t)r->input : (size_t)dirs_of(r) * H;
        for (int part = 0; part < 4; part++) {
            bool bias = part >= 2;
            if (bias && r->bias == CUDNN_RNN_NO_BIAS)
                continue;
            for (size_t q = 0; q < g; q++) {
                size_t n = bias ? H : part == 0 ? H * in : H * H;
                region_t *e = &R[k++ % MAXREG];
                e->p = p;
                e->id = (int)((part % 2) * g + q);
                e->bias = bias;
                e->canon = canon;
                e->n = n;
                canon += n;
            }
        }
    }
    size_t cursor = F.pad;
    for (int pass = 0; pass < (F.interleaved ? 1 : 2); pass++) {
        for (size_t i = 0; i < k; i++) {
            region_t *e = &R[i];
            if (!F.interleaved && e->bias != (pass == 1))
                continue;
            if (F.pad)
                cursor = (cursor + F.pad - 1) / F.pad * F.pad;
            e->dnn = cursor;
            cursor += e->n * sizeof(float);
        }
    }
    *space = (F.pad ? (cursor + F.pad - 1) / F.pad * F.pad : cursor) + F.extra;
    return k;
}

static size_t space_bytes(const struct cudnnRNNStruct *r)
{
    size_t space;
    layout(r, &space);
    return space;
}

cudnnStatus_t cudnnGetRNNWeightSpaceSize(cudnnHandle_t handle, cudnnRNNDescriptor_t d,
                                         size_t *weightSpaceSize)
{
    BEGIN("cudnnGetRNNWeightSpaceSize");
    if (!handle || !d->set)
        return refuse(c, "descriptor not set");
    *weightSpaceSize = space_bytes(d);
    c->n[0] = *weightSpaceSize;
    return CUDNN_STATUS_SUCCESS;
}

static void set_desc(cudnnTensorDescriptor_t t, int rows, int cols)
{
    t->nd = 3;
    t->dims[0] = 1;
    t->dims[1] = rows;
    t->dims[2] = cols;
    t->strides[0] = rows * cols;
    t->strides[1] = cols;
    t->strides[2] = 1;
}

cudnnStatus_t cudnnGetRNNWeightParams(cudnnHandle_t handle, cudnnRNNDescriptor_t d,
                                      int32_t pseudoLayer, size_t weightSpaceSize,
                                      const void *weightSpace, int32_t linLayerID,
                                      cudnnTensorDescriptor_t mDesc, void **mAddr,
                                      cudnnTensorDescriptor_t bDesc, void **bAddr)
{
    BEGIN("cudnnGetRNNWeightParams");
    c->p[0] = weightSpace;
    c->i[0] = pseudoLayer;
    c->i[1] = linLayerID;
    c->n[0] = weightSpaceSize;
    size_t space, k = layout(d, &space);
    if (!handle || !d->set || pseudoLayer < 0 || pseudoLayer >= d->layers * dirs_of(d) ||
        linLayerID < 0 || linLayerID >= 2 * gates_of(d) || weightSpaceSize != space)
        return refuse(c, "bad pseudo-layer, linear layer or size");
    const char *base = weightSpace;
    *mAddr = NULL;
    *bAddr = NULL;
    for (size_t i = 0; i < k; i++) {
        const region_t *e = &R[i];
        if (e->p != pseudoLayer || e->id != linLayerID)
            continue;
        int rows = d->hidden, cols = (int)(e->n / (size_t)d->hidden);
        if (e->bias) {
            *bAddr = (void *)(base + e->dnn);
            set_desc(bDesc, rows, 1);
        } else {
            *mAddr = (void *)(base + e->dnn);
            if (pseudoLayer == F.shift_p && linLayerID == F.shift_id)
                *mAddr = (char *)*mAddr + F.shift;
            if (pseudoLayer == F.trans_p && linLayerID == F.trans_id)
                set_desc(mDesc, cols, rows);
            else
                set_desc(mDesc, rows, cols);
        }
    }
    c->p[1] = *mAddr;
    c->p[2] = *bAddr;
    return CUDNN_STATUS_SUCCESS;
}

size_t fake_dnn_dropout_reserve_bytes(int hidden, int layers, int dirs, int T, int B);

/* The reserve: the plain size, plus a byte mask per element of the lower layers' outputs
 * when a dropout descriptor with p > 0 is attached. */
static size_t reserve_of(const struct cudnnRNNStruct *d, int T, int B)
{
    size_t n = fake_dnn_reserve_bytes(gates_of(d), d->hidden, d->layers, dirs_of(d), T, B);
    if (d->drop && d->drop->p > 0.0f)
        n += fake_dnn_dropout_reserve_bytes(d->hidden, d->layers, dirs_of(d), T, B);
    return n;
}

/* Workspace for a descriptor: training's grows with the tokens (T x B when every sequence
 * is T long), inference's with the batch. */
static size_t work_of(const struct cudnnRNNStruct *d, const struct cudnnRNNDataStruct *xd,
                      bool training)
{
    if (training)
        return fake_dnn_work_bytes(1, gates_of(d), d->hidden, (int)xd->tokens, 1);
    return fake_dnn_work_bytes(0, gates_of(d), d->hidden, xd->T, xd->B);
}

size_t fake_dnn_data_lengths(const void *desc, int *out, int cap)
{
    const struct cudnnRNNDataStruct *d = desc;
    for (int b = 0; b < d->B && b < cap; b++)
        out[b] = d->lens[b];
    return (size_t)d->B;
}

cudnnStatus_t cudnnGetRNNTempSpaceSizes(cudnnHandle_t handle, cudnnRNNDescriptor_t d,
                                        cudnnForwardMode_t fwdMode, cudnnRNNDataDescriptor_t xDesc,
                                        size_t *workSpaceSize, size_t *reserveSpaceSize)
{
    BEGIN("cudnnGetRNNTempSpaceSizes");
    c->p[0] = xDesc;
    c->i[0] = fwdMode;
    if (!handle || !d->set || !xDesc->set)
        return refuse(c, "descriptor not set");
    bool training = fwdMode == CUDNN_FWD_MODE_TRAINING;
    *workSpaceSize = work_of(d, xDesc, training);
    *reserveSpaceSize = training ? reserve_of(d, (int)xDesc->tokens, 1) : 0;
    c->n[0] = *workSpaceSize;
    c->n[1] = *reserveSpaceSize;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- compute ---- */

size_t fake_dnn_dropout_reserve_bytes(int hidden, int layers, int dirs, int T, int B)
{
    return (size_t)T * (size_t)B * (size_t)dirs * (size_t)hidden * (size_t)(layers - 1);
}

/* The checks every compute call shares: descriptors agree with the RNN, sizes cover what
 * the size queries said, the device sequence lengths hold T for each batch entry. */
static cudnnStatus_t check_common(fake_dnn_call_t *c, cudnnHandle_t h, cudnnRNNDescriptor_t d,
                                  const int32_t *lens, cudnnRNNDataDescriptor_t xd,
                                  cudnnRNNDataDescriptor_t yd, size_t wsize, size_t work_size,
                                  const void *work, bool training, size_t res_size, const void *res)
{
    if (!h || !d->set || !xd->set || !yd->set)
        return refuse(c, "descriptor not set");
    if (h->device != F.device)
        return refuse(c, "called on another device than the handle's");
    if (xd->T != yd->T || xd->B != yd->B || xd->vec != d->input ||
        yd->vec != dirs_of(d) * d->hidden || xd->layout != yd->layout ||
        memcmp(xd->lens, yd->lens, (size_t)xd->B * sizeof(int)) != 0)
        return refuse(c, "data descriptors disagree with the RNN");
    if (!lens)
        return refuse(c, "devSeqLengths is NULL");
    for (int b = 0; b < xd->B; b++)
        if (lens[b] != xd->lens[b])
            return refuse(c, "devSeqLengths differs from the data descriptor");
    if (wsize != space_bytes(d))
        return refuse(c, "weight space size");
    size_t need = work_of(d, xd, training);
    if (work_size < need || (need && !work))
        return refuse(c, "workspace too small");
    if (training) {
        size_t rneed = reserve_of(d, (int)xd->tokens, 1);
        if (res_size < rneed || !res)
            return refuse(c, "reserve space too small");
    }
    return CUDNN_STATUS_SUCCESS;
}

/* With expect_weights: every weight at this layout's place holds its canonical index. */
static bool weights_home(const struct cudnnRNNStruct *d, const void *weightSpace)
{
    size_t space, k = layout(d, &space);
    const char *ws = weightSpace;
    for (size_t i = 0; i < k && F.expect_weights; i++)
        for (size_t j = 0; j < R[i].n; j++)
            if (((const float *)(ws + R[i].dnn))[j] != (float)(R[i].canon + j))
                return false;
    return true;
}

/* With check_pad: every byte of the space outside the regions (padding, the extra tail) is
 * zero, as a weight space cuDNN may read whole must be. */
static bool padding_zero(const struct cudnnRNNStruct *d, const void *weightSpace)
{
    size_t space, k = layout(d, &space);
    const unsigned char *ws = weightSpace;
    for (size_t b = 0; b < space && F.check_pad; b++) {
        bool inside = false;
        for (size_t i = 0; i < k && !inside; i++)
            inside = b >= R[i].dnn && b < R[i].dnn + R[i].n * sizeof(float);
        if (!inside && ws[b] != 0)
            return false;
    }
    return true;
}

/* A state tensor descriptor must be [L D, B, H], fully packed, float. */
static bool state_desc_ok(const struct cudnnRNNStruct *d, cudnnTensorDescriptor_t t, int B)
{
    return t && t->nd == 3 && t->dims[0] == d->layers * dirs_of(d) && t->dims[1] == B &&
           t->dims[2] == d->hidden && t->strides[2] == 1 && t->strides[1] == d->hidden &&
           t->strides[0] == B * d->hidden;
}

static void done(const fake_dnn_call_t *c)
{
    if (F.hook)
        F.hook(c, F.hook_ud);
}

/* ---- the reference network over a call's buffers ---- */

typedef struct net_s {
    fref_t n;
    const float **mat, **bias;
    long *row;
} net_t;

static void net_free(net_t *t)
{
    free(t->mat);
    free(t->bias);
    free(t->row);
}

/* The reference network of d over xd's rows, its weights where this layout puts them in
 * the (host view of the) weight space ws. */
static void net_init(net_t *t, const struct cudnnRNNStruct *d, const struct cudnnRNNDataStruct *xd,
                     const void *ws)
{
    static const fref_cell_e cells[] = {
        [CUDNN_RNN_RELU] = FREF_RELU,
        [CUDNN_RNN_TANH] = FREF_TANH,
        [CUDNN_LSTM] = FREF_LSTM,
        [CUDNN_GRU] = FREF_GRU,
    };
    int g = gates_of(d), P = d->layers * dirs_of(d);
    t->mat = calloc((size_t)(P * 2 * g), sizeof *t->mat);
    t->bias = calloc((size_t)(P * 2 * g), sizeof *t->bias);
    t->row = malloc((size_t)xd->T * (size_t)xd->B * sizeof *t->row);
    size_t space, k = layout(d, &space);
    for (size_t i = 0; i < k; i++) {
        const float *a = (const float *)((const char *)ws + R[i].dnn);
        if (R[i].bias)
            t->bias[R[i].p * 2 * g + R[i].id] = a;
        else
            t->mat[R[i].p * 2 * g + R[i].id] = a;
    }
    /* rows: packed, step t's running sequences contiguous; padded, T x B or B x T */
    long next = 0;
    for (int tt = 0; tt < xd->T; tt++) {
        for (int b = 0; b < xd->B; b++) {
            long r = -1;
            if (xd->layout == CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED)
                r = tt < xd->lens[b] ? next++ : -1;
            else if (xd->layout == CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED)
                r = tt < xd->lens[b] ? (long)tt * xd->B + b : -1;
            else
                r = tt < xd->lens[b] ? (long)b * xd->T + tt : -1;
            t->row[(size_t)tt * xd->B + b] = r;
        }
    }
    t->n = (fref_t){
        .cell = cells[d->mode],
        .g = g,
        .H = d->hidden,
        .L = d->layers,
        .D = dirs_of(d),
        .in = d->input,
        .mat = t->mat,
        .bias = t->bias,
        .T = xd->T,
        .B = xd->B,
        .lens = xd->lens,
        .row = t->row,
        .tokens = xd->tokens,
        .drop_scale = 1.0f,
    };
}

/* Where the reserve keeps the forward's activations, backward data's gradients, its
 * marker tail (0x5A, checked by backward) and the dropout masks. */
static float *res_act(void *res)
{
    return res;
}

static float *res_dpre(const net_t *t, void *res)
{
    return (float *)res + fref_act_floats(&t->n);
}

static unsigned char *res_tail(const net_t *t, void *res)
{
    return (unsigned char *)(res_dpre(t, res) + fref_dpre_floats(&t->n));
}

static uint8_t *res_mask(const net_t *t, void *res)
{
    return res_tail(t, res) + 777;
}

/* The dropout generator: states hold a 64-bit counter of training forwards in their first 8
 * bytes, then the seed's low byte. */
static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void draw_masks(const struct cudnnDropoutStruct *dr, uint64_t counter, uint8_t *mask,
                       size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t h =
            mix(dr->seed * 0x9e3779b97f4a7c15ull + mix(counter * 0x632be59bd9b4e019ull + i));
        double u = (double)(h >> 11) / 9007199254740992.0;
        mask[i] = u >= (double)dr->p;
    }
}

/* Padded layouts: the padding rows of an output get the descriptor's fill. */
static void fill_padding(const net_t *t, const struct cudnnRNNDataStruct *yd, float *y)
{
    if (yd->layout == CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED || !yd->has_fill)
        return;
    for (int tt = 0; tt < yd->T; tt++)
        for (int b = 0; b < yd->B; b++) {
            if (t->row[(size_t)tt * yd->B + b] >= 0)
                continue;
            long r = yd->layout == CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED ? (long)tt * yd->B + b
                                                                            : (long)b * yd->T + tt;
            for (int k = 0; k < yd->vec; k++)
                y[(size_t)r * yd->vec + k] = yd->fill;
        }
}

cudnnStatus_t cudnnRNNForward(cudnnHandle_t handle, cudnnRNNDescriptor_t d,
                              cudnnForwardMode_t fwdMode, const int32_t devSeqLengths[],
                              cudnnRNNDataDescriptor_t xDesc, const void *x,
                              cudnnRNNDataDescriptor_t yDesc, void *y,
                              cudnnTensorDescriptor_t hDesc, const void *hx, void *hy,
                              cudnnTensorDescriptor_t cDesc, const void *cx, void *cy,
                              size_t weightSpaceSize, const void *weightSpace, size_t workSpaceSize,
                              void *workSpace, size_t reserveSpaceSize, void *reserveSpace)
{
    BEGIN("cudnnRNNForward");
    const void *p[] = {x, y, hx, hy, weightSpace, workSpace, reserveSpace, devSeqLengths};
    memcpy(c->p, p, sizeof p);
    x = DEV(x), y = DEV(y), hx = DEV(hx), hy = DEV(hy), cx = DEV(cx), cy = DEV(cy);
    weightSpace = DEV(weightSpace), workSpace = DEV(workSpace);
    reserveSpace = DEV(reserveSpace), devSeqLengths = DEV(devSeqLengths);
    c->i[0] = fwdMode;
    c->i[1] = cx != NULL;
    c->i[2] = cy != NULL;
    c->i[3] = xDesc->T;
    c->i[4] = xDesc->B;
    c->n[0] = weightSpaceSize;
    c->n[1] = workSpaceSize;
    c->n[2] = reserveSpaceSize;
    bool training = fwdMode == CUDNN_FWD_MODE_TRAINING;
    cudnnStatus_t s =
        check_common(c, handle, d, devSeqLengths, xDesc, yDesc, weightSpaceSize, workSpaceSize,
                     workSpace, training, reserveSpaceSize, reserveSpace);
    if (s)
        return s;
    if (!x || !y || !weightSpace || !state_desc_ok(d, hDesc, xDesc->B))
        return refuse(c, "x, y, weights or the hidden-state descriptor's shape or strides");
    if (d->mode == CUDNN_LSTM && !state_desc_ok(d, cDesc, xDesc->B))
        return refuse(c, "the cell-state descriptor's shape or strides");
    if (d->mode != CUDNN_LSTM && (cx || cy))
        return refuse(c, "cell states for a non-LSTM cell");
    if (!weights_home(d, weightSpace))
        return refuse(c, "a weight is not where this layout has it");
    if (!padding_zero(d, weightSpace))
        return refuse(c, "weight-space bytes outside every matrix and bias are not zero");
    bool drop = training && d->drop && d->drop->p > 0.0f;
    uint64_t counter = 0;
    if (drop) {
        /* The generator states are read (and advanced) by a training forward with dropout:
         * they must still be the live block cudnnSetDropoutDescriptor initialised. */
        const unsigned char *stb = DEV(d->drop->states);
        for (size_t k = sizeof counter; k < d->drop->bytes; k++)
            if (stb[k] != (unsigned char)(d->drop->seed & 0xff))
                return refuse(c, "dropout states do not hold what cudnnSetDropoutDescriptor set");
        memcpy(&counter, stb, sizeof counter);
        c->i[5] = 1; /* dropout applied */
        c->u = counter;
        F.dropout_forwards++;
    }
    memset(workSpace, 0xA5, workSpaceSize);
    net_t t;
    net_init(&t, d, xDesc, weightSpace);
    if (training) {
        memset(reserveSpace, 0, reserveSpaceSize);
        memset(res_tail(&t, reserveSpace), 0x5A, 777);
    }
    if (drop) {
        draw_masks(d->drop, counter, res_mask(&t, reserveSpace), fref_mask_bytes(&t.n));
        t.n.mask = res_mask(&t, reserveSpace);
        t.n.drop_scale = 1.0f / (1.0f - d->drop->p);
        counter++;
        memcpy(DEV(d->drop->states), &counter, sizeof counter);
    }
    if (F.markers) {
        /* the last float of the last region (the last recurrent bias, or matrix) */
        size_t space, k = layout(d, &space);
        float last = ((const float *)((const char *)weightSpace + R[k - 1].dnn))[R[k - 1].n - 1];
        for (size_t e = 0; e < yDesc->tokens * (size_t)yDesc->vec; e++)
            ((float *)y)[e] = last;
        size_t nh = (size_t)hDesc->dims[0] * (size_t)hDesc->dims[1] * (size_t)hDesc->dims[2];
        for (size_t e = 0; e < nh && hy; e++)
            ((float *)hy)[e] = hx ? ((const float *)hx)[e] + 1.0f : 1.0f;
        for (size_t e = 0; e < nh && cy; e++)
            ((float *)cy)[e] = cx ? ((const float *)cx)[e] + 1.0f : 1.0f;
    } else {
        /* inference keeps its activations in a scratch the size of training's */
        float *act =
            training ? res_act(reserveSpace) : calloc(fref_act_floats(&t.n) + 1, sizeof(float));
        fref_forward(&t.n, x, y, hx, cx, hy, cy, act);
        fill_padding(&t, yDesc, y);
        if (!training)
            free(act);
    }
    net_free(&t);
    done(c);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnRNNBackwardData_v8(cudnnHandle_t handle, cudnnRNNDescriptor_t d,
                                      const int32_t devSeqLengths[], cudnnRNNDataDescriptor_t yDesc,
                                      const void *y, const void *dy, cudnnRNNDataDescriptor_t xDesc,
                                      void *dx, cudnnTensorDescriptor_t hDesc, const void *hx,
                                      const void *dhy, void *dhx, cudnnTensorDescriptor_t cDesc,
                                      const void *cx, const void *dcy, void *dcx,
                                      size_t weightSpaceSize, const void *weightSpace,
                                      size_t workSpaceSize, void *workSpace,
                                      size_t reserveSpaceSize, void *reserveSpace)
{
    BEGIN("cudnnRNNBackwardData_v8");
    const void *p[] = {y, dy, dx, weightSpace, workSpace, reserveSpace, devSeqLengths, dhx};
    memcpy(c->p, p, sizeof p);
    y = DEV(y), dy = DEV(dy), dx = DEV(dx), hx = DEV(hx), dhy = DEV(dhy), dhx = DEV(dhx);
    cx = DEV(cx), dcy = DEV(dcy), dcx = DEV(dcx), weightSpace = DEV(weightSpace);
    workSpace = DEV(workSpace), reserveSpace = DEV(reserveSpace);
    devSeqLengths = DEV(devSeqLengths);
    c->n[0] = weightSpaceSize;
    c->n[1] = workSpaceSize;
    c->n[2] = reserveSpaceSize;
    cudnnStatus_t s = check_common(c, handle, d, devSeqLengths, xDesc, yDesc, weightSpaceSize,
                                   workSpaceSize, workSpace, true, reserveSpaceSize, reserveSpace);
    if (s)
        return s;
    if (!y || !dy || !dx || !weightSpace || !state_desc_ok(d, hDesc, xDesc->B))
        return refuse(c, "y, dy, dx, weights or the hidden-state descriptor");
    if (d->mode == CUDNN_LSTM && !state_desc_ok(d, cDesc, xDesc->B))
        return refuse(c, "the cell-state descriptor's shape or strides");
    if (!weights_home(d, weightSpace))
        return refuse(c, "a weight is not where this layout has it");
    net_t t;
    net_init(&t, d, xDesc, weightSpace);
    /* forward's tail must still be there: the same reserve, untouched since */
    const unsigned char *r = res_tail(&t, reserveSpace);
    for (size_t k = 0; k < 777; k++) {
        if (r[k] != 0x5A) {
            net_free(&t);
            return refuse(c, "reserve space does not hold the forward's contents");
        }
    }
    if (d->drop && d->drop->p > 0.0f) {
        t.n.mask = res_mask(&t, reserveSpace);
        t.n.drop_scale = 1.0f / (1.0f - d->drop->p);
    }
    if (F.markers) {
        size_t nx = xDesc->tokens * (size_t)xDesc->vec;
        for (size_t k = 0; k < nx; k++)
            ((float *)dx)[k] = 2.0f * ((const float *)dy)[k % (yDesc->tokens * (size_t)yDesc->vec)];
        size_t nh = (size_t)hDesc->dims[0] * (size_t)hDesc->dims[1] * (size_t)hDesc->dims[2];
        for (size_t k = 0; k < nh && dhx; k++)
            ((float *)dhx)[k] = dhy ? ((const float *)dhy)[k] : 0.0f;
        for (size_t k = 0; k < nh && dcx; k++)
            ((float *)dcx)[k] = dcy ? ((const float *)dcy)[k] : 0.0f;
    } else {
        fref_backward_data(&t.n, y, dy, dx, hx, dhy, dhx, d->mode == CUDNN_LSTM ? cx : NULL, dcy,
                           d->mode == CUDNN_LSTM ? dcx : NULL, res_act(reserveSpace),
                           res_dpre(&t, reserveSpace));
        fill_padding(&t, xDesc, dx);
    }
    net_free(&t);
    memset(workSpace, 0xA6, workSpaceSize);
    F.data_done_reserve = reserveSpace;
    done(c);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnRNNBackwardWeights_v8(cudnnHandle_t handle, cudnnRNNDescriptor_t d,
                                         cudnnWgradMode_t addGrad, const int32_t devSeqLengths[],
                                         cudnnRNNDataDescriptor_t xDesc, const void *x,
                                         cudnnTensorDescriptor_t hDesc, const void *hx,
                                         cudnnRNNDataDescriptor_t yDesc, const void *y,
                                         size_t weightSpaceSize, void *dweightSpace,
                                         size_t workSpaceSize, void *workSpace,
                                         size_t reserveSpaceSize, void *reserveSpace)
{
    BEGIN("cudnnRNNBackwardWeights_v8");
    const void *p[] = {x, hx, y, dweightSpace, workSpace, reserveSpace, devSeqLengths};
    memcpy(c->p, p, sizeof p);
    x = DEV(x), hx = DEV(hx), y = DEV(y), dweightSpace = DEV(dweightSpace);
    workSpace = DEV(workSpace), reserveSpace = DEV(reserveSpace);
    devSeqLengths = DEV(devSeqLengths);
    c->i[0] = addGrad;
    c->n[0] = weightSpaceSize;
    c->n[1] = workSpaceSize;
    c->n[2] = reserveSpaceSize;
    cudnnStatus_t s = check_common(c, handle, d, devSeqLengths, xDesc, yDesc, weightSpaceSize,
                                   workSpaceSize, workSpace, true, reserveSpaceSize, reserveSpace);
    if (s)
        return s;
    if (!x || !y || !dweightSpace || !state_desc_ok(d, hDesc, xDesc->B))
        return refuse(c, "x, y, dweightSpace or the hidden-state descriptor");
    if (F.data_done_reserve != reserveSpace)
        return refuse(c, "backward weights before backward data on this reserve");
    F.data_done_reserve = NULL;
    size_t space, k = layout(d, &space);
    if (addGrad != CUDNN_WGRAD_MODE_ADD)
        for (size_t i = 0; i < k; i++)
            memset((char *)dweightSpace + R[i].dnn, 0, R[i].n * sizeof(float));
    if (F.markers) {
        /* element j of region i gets canon + j + 1: its index in our layout, plus one */
        for (size_t i = 0; i < k; i++) {
            float *dw = (float *)((char *)dweightSpace + R[i].dnn);
            for (size_t j = 0; j < R[i].n; j++)
                dw[j] += (float)(R[i].canon + j + 1);
        }
    } else {
        net_t t, dt;
        net_init(&t, d, xDesc, dweightSpace); /* its weights unused: the shape and rows */
        net_init(&dt, d, xDesc, dweightSpace);
        if (d->drop && d->drop->p > 0.0f) {
            t.n.mask = res_mask(&t, reserveSpace);
            t.n.drop_scale = 1.0f / (1.0f - d->drop->p);
        }
        fref_backward_weights(&t.n, x, hx, y, res_act(reserveSpace), res_dpre(&t, reserveSpace),
                              (float **)dt.mat, (float **)dt.bias);
        net_free(&t);
        net_free(&dt);
    }
    done(c);
    return CUDNN_STATUS_SUCCESS;
}

/* ---- library ---- */

size_t cudnnGetVersion(void)
{
    return F.version;
}

/* cuDNN keeps the last error's text per thread; the fake keeps the last refusal's. */
void cudnnGetLastErrorString(char *message, size_t max_size)
{
    if (message && max_size)
        snprintf(message, max_size, "%s", F.err);
}
