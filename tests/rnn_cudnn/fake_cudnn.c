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
    size_t tokens;            /* sum of the lengths: the rows of a packed tensor */
    int lens[FAKE_MAX_BATCH]; /* the seqLengthArray copied */
};

static struct {
    fake_dnn_call_t calls[MAXCALLS];
    size_t ncalls;
    size_t (*clock)(void);
    const char *fail_name;
    cudnnStatus_t fail_status;
    int shift_p, shift_id;
    ptrdiff_t shift;
    size_t extra;
    size_t pad;          /* padded layout: region alignment in bytes, 0 = canonical */
    bool expect_weights; /* forward checks weight k of our layout holds the value k */
    void (*hook)(const fake_dnn_call_t *c, void *ud);
    void *hook_ud;
    long live;
    char err[256];
    const void *data_done_reserve; /* reserve of the last backward data */
    size_t dropout_forwards;       /* training forwards with dropout applied */
    int device;                    /* the runtime's current device */
} F = {.shift_p = -1};

void fake_dnn_reset(void)
{
    F.ncalls = 0;
    F.fail_name = NULL;
    F.shift_p = -1;
    F.shift = 0;
    F.extra = 0;
    F.pad = 0;
    F.expect_weights = false;
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
                     (size_t)(gates + 1);
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
    if (states)
        memset(DEV(states), (int)(seed & 0xff), stateSizeInBytes);
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
    *d = (struct cudnnRNNDataStruct){.set = true,
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
 * recurrent biases) and returns their count; *space = the weight space's bytes. Canonical:
 * dnn = 4 * canon. Padded (F.pad > 0): the space starts with F.pad bytes and every region
 * starts at a multiple of F.pad. */
static size_t layout(const struct cudnnRNNStruct *r, size_t *space)
{
    size_t g = (size_t)gates_of(r), H = (size_t)r->hidden, canon = 0, cursor = F.pad, k = 0;
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
                if (F.pad)
                    cursor = (cursor + F.pad - 1) / F.pad * F.pad;
                e->dnn = F.pad ? cursor : canon * sizeof(float);
                canon += n;
                cursor += n * sizeof(float);
            }
        }
    }
    *space = (F.pad ? (cursor + F.pad - 1) / F.pad * F.pad : canon * sizeof(float)) + F.extra;
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

static void done(const fake_dnn_call_t *c)
{
    if (F.hook)
        F.hook(c, F.hook_ud);
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
    if (!x || !y || !weightSpace || hDesc->nd != 3 || cDesc->nd != 3 ||
        hDesc->dims[1] != xDesc->B || hDesc->dims[2] != d->hidden ||
        hDesc->dims[0] != d->layers * dirs_of(d))
        return refuse(c, "x, y, weights or state descriptors");
    if (d->mode != CUDNN_LSTM && (cx || cy))
        return refuse(c, "cell states for a non-LSTM cell");
    if (!weights_home(d, weightSpace))
        return refuse(c, "a weight is not where this layout has it");
    if (training && d->drop && d->drop->p > 0.0f) {
        /* The generator states are read (and advanced) by a training forward with dropout:
         * they must still be the live block cudnnSetDropoutDescriptor initialised. */
        const unsigned char *stb = DEV(d->drop->states);
        for (size_t k = 0; k < d->drop->bytes; k++)
            if (stb[k] != (unsigned char)(d->drop->seed & 0xff))
                return refuse(c, "dropout states do not hold what cudnnSetDropoutDescriptor set");
        c->i[5] = 1; /* dropout applied */
        F.dropout_forwards++;
    }
    size_t space, k = layout(d, &space);
    const char *ws = weightSpace;
    memset(workSpace, 0xA5, workSpaceSize);
    if (training)
        memset(reserveSpace, 0x5A, reserveSpaceSize);
    /* the last float of the last region (the last recurrent bias, or matrix) */
    float last = ((const float *)(ws + R[k - 1].dnn))[R[k - 1].n - 1];
    size_t ny = yDesc->tokens * (size_t)yDesc->vec;
    for (size_t k = 0; k < ny; k++)
        ((float *)y)[k] = last;
    size_t nh = (size_t)hDesc->dims[0] * (size_t)hDesc->dims[1] * (size_t)hDesc->dims[2];
    for (size_t k = 0; k < nh && hy; k++)
        ((float *)hy)[k] = hx ? ((const float *)hx)[k] + 1.0f : 1.0f;
    for (size_t k = 0; k < nh && cy; k++)
        ((float *)cy)[k] = cx ? ((const float *)cx)[k] + 1.0f : 1.0f;
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
    (void)hx;
    (void)cx;
    (void)cDesc;
    cudnnStatus_t s = check_common(c, handle, d, devSeqLengths, xDesc, yDesc, weightSpaceSize,
                                   workSpaceSize, workSpace, true, reserveSpaceSize, reserveSpace);
    if (s)
        return s;
    if (!y || !dy || !dx || !weightSpace)
        return refuse(c, "y, dy, dx or weights NULL");
    if (!weights_home(d, weightSpace))
        return refuse(c, "a weight is not where this layout has it");
    /* forward's pattern must still be there: the same reserve, untouched since */
    const unsigned char *r = reserveSpace;
    for (size_t k = 0; k < reserveSpaceSize; k++)
        if (r[k] != 0x5A)
            return refuse(c, "reserve space does not hold the forward's contents");
    size_t nx = xDesc->tokens * (size_t)xDesc->vec;
    for (size_t k = 0; k < nx; k++)
        ((float *)dx)[k] = 2.0f * ((const float *)dy)[k % (yDesc->tokens * (size_t)yDesc->vec)];
    size_t nh = (size_t)hDesc->dims[0] * (size_t)hDesc->dims[1] * (size_t)hDesc->dims[2];
    for (size_t k = 0; k < nh && dhx; k++)
        ((float *)dhx)[k] = dhy ? ((const float *)dhy)[k] : 0.0f;
    for (size_t k = 0; k < nh && dcx; k++)
        ((float *)dcx)[k] = dcy ? ((const float *)dcy)[k] : 0.0f;
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
    (void)hDesc;
    cudnnStatus_t s = check_common(c, handle, d, devSeqLengths, xDesc, yDesc, weightSpaceSize,
                                   workSpaceSize, workSpace, true, reserveSpaceSize, reserveSpace);
    if (s)
        return s;
    if (!x || !y || !dweightSpace)
        return refuse(c, "x, y or dweightSpace NULL");
    if (F.data_done_reserve != reserveSpace)
        return refuse(c, "backward weights before backward data on this reserve");
    F.data_done_reserve = NULL;
    /* element j of region i gets canon + j + 1: its index in our layout, plus one */
    size_t space, k = layout(d, &space);
    for (size_t i = 0; i < k; i++) {
        float *dw = (float *)((char *)dweightSpace + R[i].dnn);
        for (size_t j = 0; j < R[i].n; j++) {
            float v = (float)(R[i].canon + j + 1);
            dw[j] = addGrad == CUDNN_WGRAD_MODE_ADD ? dw[j] + v : v;
        }
    }
    done(c);
    return CUDNN_STATUS_SUCCESS;
}

/* C = alpha A + beta C over equal shapes (the only case the path uses). */
cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void *alpha,
                             const cudnnTensorDescriptor_t aDesc, const void *A, const void *beta,
                             const cudnnTensorDescriptor_t cDesc, void *C)
{
    BEGIN("cudnnAddTensor");
    c->p[0] = A;
    c->p[1] = C;
    A = DEV(A), C = DEV(C);
    if (!handle || handle->device != F.device || aDesc->nd != cDesc->nd || !A || !C)
        return refuse(c, "descriptors or pointers");
    size_t n = 1;
    for (int k = 0; k < aDesc->nd; k++) {
        if (aDesc->dims[k] != cDesc->dims[k])
            return refuse(c, "shapes differ");
        n *= (size_t)aDesc->dims[k];
    }
    c->n[0] = n * sizeof(float);
    float a = *(const float *)alpha, b = *(const float *)beta;
    for (size_t k = 0; k < n; k++)
        ((float *)C)[k] = a * ((const float *)A)[k] + b * ((float *)C)[k];
    return CUDNN_STATUS_SUCCESS;
}
