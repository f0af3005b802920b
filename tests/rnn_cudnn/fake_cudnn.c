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

#include "tests/rnn_cudnn/fake_cudnn_int.h"

fake_state_t fake_dnn_state = {.shift_p = -1, .trans_p = -1, .version = 91900};

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

void *fake_dnn_dev(const void *p)
{
    return p != NULL && drv_shadow != NULL ? drv_shadow(p) : (void *)p;
}

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

/* Records a call; returns the injected failure for it, if any. */
fake_dnn_call_t *fake_dnn_rec(const char *name, cudnnStatus_t *st)
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

cudnnStatus_t fake_dnn_refuse(fake_dnn_call_t *c, const char *why)
{
    snprintf(F.err, sizeof F.err, "%s: %s", c->name, why);
    c->status = CUDNN_STATUS_BAD_PARAM;
    return CUDNN_STATUS_BAD_PARAM;
}

/* ---- the runtime's device selection ---- */

cudaError_t cudaGetDevice(int *device)
{
    *device = F.device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    cudnnStatus_t st;
    fake_dnn_call_t *c = fake_dnn_rec("cudaSetDevice", &st);
    c->i[0] = device;
    if (st != CUDNN_STATUS_SUCCESS)
        return cudaErrorInvalidDevice;
    F.device = device;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version)
{
    *version = CUDART_VERSION;
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
        return fake_dnn_refuse(c, "no handle");
    *sizeInBytes = fake_dnn_dropout_states_bytes();
    c->n[0] = *sizeInBytes;
    return CUDNN_STATUS_SUCCESS;
}

/* Checks the states cover what GetStatesSize said (p > 0) and "initialises" them: a byte
 * pattern from the seed, over every byte (an undersized block shows up under ASan). An
 * injected failure (fake_dnn_fail) comes after the initialising kernel wrote the first half
 * of the states, as a cuDNN failing midway may leave them: neither the old state nor the
 * new. */
cudnnStatus_t cudnnSetDropoutDescriptor(cudnnDropoutDescriptor_t d, cudnnHandle_t handle,
                                        float dropout, void *states, size_t stateSizeInBytes,
                                        unsigned long long seed)
{
    cudnnStatus_t st_;
    fake_dnn_call_t *c = fake_dnn_rec("cudnnSetDropoutDescriptor", &st_);
    if (st_ != CUDNN_STATUS_SUCCESS) {
        if (states && stateSizeInBytes >= fake_dnn_dropout_states_bytes())
            memset(DEV(states), (int)(~seed & 0xff), stateSizeInBytes / 2);
        return st_;
    }
    c->p[0] = d;
    c->p[1] = handle;
    c->p[2] = states;
    c->n[0] = stateSizeInBytes;
    c->f = dropout;
    c->u = seed;
    if (!d || !handle || handle->device != F.device)
        return fake_dnn_refuse(c, "descriptor, handle or device");
    if (!(dropout >= 0.0f && dropout < 1.0f))
        return fake_dnn_refuse(c, "dropout outside [0, 1)");
    if (dropout > 0.0f && (!states || stateSizeInBytes < fake_dnn_dropout_states_bytes()))
        return fake_dnn_refuse(c, "states missing or smaller than cudnnDropoutGetStatesSize");
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
        return fake_dnn_refuse(c, "bad dims or type");
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
        return fake_dnn_refuse(c, "bad sizes");
    if (dropoutDesc && !dropoutDesc->set)
        return fake_dnn_refuse(c, "dropout descriptor not set");
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
        return fake_dnn_refuse(c, "bad sizes");
    if (dataType != CUDNN_DATA_FLOAT)
        return fake_dnn_refuse(c, "data type other than float");
    if (layout != CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED &&
        layout != CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED &&
        layout != CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED)
        return fake_dnn_refuse(c, "unknown layout");
    /* cuDNN's packed layout: lengths in [1, T], non-increasing (sorted by length). */
    size_t tokens = 0;
    for (int b = 0; b < batchSize; b++) {
        int n = seqLengthArray[b];
        if (n < 1 || n > maxSeqLength)
            return fake_dnn_refuse(c, "a sequence length outside [1, maxSeqLength]");
        if (layout == CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED && b > 0 && n > seqLengthArray[b - 1])
            return fake_dnn_refuse(c, "packed layout with lengths not in decreasing order");
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

int fake_dnn_gates_of(const struct cudnnRNNStruct *r)
{
    return r->mode == CUDNN_LSTM ? 4 : r->mode == CUDNN_GRU ? 3 : 1;
}

int fake_dnn_dirs_of(const struct cudnnRNNStruct *r)
{
    return r->dir == CUDNN_BIDIRECTIONAL ? 2 : 1;
}

/* One matrix or bias: where the canonical layout has it (floats) and where this fake says
 * it is (bytes). */
region_t R[MAXREG];

/* Fills R in canonical order (per pseudo-layer: W_0..W_{g-1}, R_0..R_{g-1}, input biases,
 * recurrent biases; canon counts floats in that order, the engine's layout) and returns
 * their count; *space = the weight space's bytes. Where this fake puts them (dnn, bytes):
 * by default cuDNN's layout as every public description gives it, all matrices of all
 * pseudo-layers first (in canonical order), then all biases; with F.interleaved, the
 * canonical order itself. Padded (F.pad > 0): the space starts with F.pad bytes and every
 * region starts at a multiple of F.pad. */
size_t fake_dnn_layout(const struct cudnnRNNStruct *r, size_t *space)
{
    size_t g = (size_t)fake_dnn_gates_of(r), H = (size_t)r->hidden, canon = 0, k = 0;
    for (int p = 0; p < r->layers * fake_dnn_dirs_of(r); p++) {
        size_t in =
            p / fake_dnn_dirs_of(r) == 0 ? (size_t)r->input : (size_t)fake_dnn_dirs_of(r) * H;
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

size_t fake_dnn_space_bytes(const struct cudnnRNNStruct *r)
{
    size_t space;
    fake_dnn_layout(r, &space);
    return space;
}

cudnnStatus_t cudnnGetRNNWeightSpaceSize(cudnnHandle_t handle, cudnnRNNDescriptor_t d,
                                         size_t *weightSpaceSize)
{
    BEGIN("cudnnGetRNNWeightSpaceSize");
    if (!handle || !d->set)
        return fake_dnn_refuse(c, "descriptor not set");
    *weightSpaceSize = fake_dnn_space_bytes(d);
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
    size_t space, k = fake_dnn_layout(d, &space);
    if (!handle || !d->set || pseudoLayer < 0 || pseudoLayer >= d->layers * fake_dnn_dirs_of(d) ||
        linLayerID < 0 || linLayerID >= 2 * fake_dnn_gates_of(d) || weightSpaceSize != space)
        return fake_dnn_refuse(c, "bad pseudo-layer, linear layer or size");
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

/* The reserve: the plain size, plus a byte mask per element of the lower layers' outputs
 * when a dropout descriptor with p > 0 is attached. */
size_t fake_dnn_reserve_of(const struct cudnnRNNStruct *d, int T, int B)
{
    size_t n = fake_dnn_reserve_bytes(fake_dnn_gates_of(d), d->hidden, d->layers,
                                      fake_dnn_dirs_of(d), T, B);
    if (d->drop && d->drop->p > 0.0f)
        n += fake_dnn_dropout_reserve_bytes(d->hidden, d->layers, fake_dnn_dirs_of(d), T, B);
    return n;
}

/* Workspace for a descriptor: training's grows with the tokens (T x B when every sequence
 * is T long), inference's with the batch. */
size_t fake_dnn_work_of(const struct cudnnRNNStruct *d, const struct cudnnRNNDataStruct *xd,
                        bool training)
{
    if (training)
        return fake_dnn_work_bytes(1, fake_dnn_gates_of(d), d->hidden, (int)xd->tokens, 1);
    return fake_dnn_work_bytes(0, fake_dnn_gates_of(d), d->hidden, xd->T, xd->B);
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
        return fake_dnn_refuse(c, "descriptor not set");
    bool training = fwdMode == CUDNN_FWD_MODE_TRAINING;
    *workSpaceSize = fake_dnn_work_of(d, xDesc, training);
    *reserveSpaceSize = training ? fake_dnn_reserve_of(d, (int)xDesc->tokens, 1) : 0;
    c->n[0] = *workSpaceSize;
    c->n[1] = *reserveSpaceSize;
    return CUDNN_STATUS_SUCCESS;
}
