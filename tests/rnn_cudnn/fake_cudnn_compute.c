/* The fake cuDNN's compute calls (see fake_cudnn.h): checks of their arguments as cuDNN's
 * contract states them, then the reference RNN of fake_cudnn_ref.c over the buffers (or the
 * markers), the reserve laid out as fake_cudnn_ref.h says. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/rnn_cudnn/fake_cudnn_int.h"
#include "tests/rnn_cudnn/fake_cudnn_ref.h"

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
        return fake_dnn_refuse(c, "descriptor not set");
    if (h->device != F.device)
        return fake_dnn_refuse(c, "called on another device than the handle's");
    if (xd->T != yd->T || xd->B != yd->B || xd->vec != d->input ||
        yd->vec != fake_dnn_dirs_of(d) * d->hidden || xd->layout != yd->layout ||
        memcmp(xd->lens, yd->lens, (size_t)xd->B * sizeof(int)) != 0)
        return fake_dnn_refuse(c, "data descriptors disagree with the RNN");
    if (!lens)
        return fake_dnn_refuse(c, "devSeqLengths is NULL");
    for (int b = 0; b < xd->B; b++)
        if (lens[b] != xd->lens[b])
            return fake_dnn_refuse(c, "devSeqLengths differs from the data descriptor");
    if (wsize != fake_dnn_space_bytes(d))
        return fake_dnn_refuse(c, "weight space size");
    size_t need = fake_dnn_work_of(d, xd, training);
    if (work_size < need || (need && !work))
        return fake_dnn_refuse(c, "workspace too small");
    if (training) {
        size_t rneed = fake_dnn_reserve_of(d, (int)xd->tokens, 1);
        if (res_size < rneed || !res)
            return fake_dnn_refuse(c, "reserve space too small");
    }
    return CUDNN_STATUS_SUCCESS;
}

/* With expect_weights: every weight at this layout's place holds its canonical index. */
static bool weights_home(const struct cudnnRNNStruct *d, const void *weightSpace)
{
    size_t space, k = fake_dnn_layout(d, &space);
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
    size_t space, k = fake_dnn_layout(d, &space);
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
    return t && t->nd == 3 && t->dims[0] == d->layers * fake_dnn_dirs_of(d) && t->dims[1] == B &&
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
    int g = fake_dnn_gates_of(d), P = d->layers * fake_dnn_dirs_of(d);
    t->mat = calloc((size_t)(P * 2 * g), sizeof *t->mat);
    t->bias = calloc((size_t)(P * 2 * g), sizeof *t->bias);
    t->row = malloc((size_t)xd->T * (size_t)xd->B * sizeof *t->row);
    size_t space, k = fake_dnn_layout(d, &space);
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
        .D = fake_dnn_dirs_of(d),
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
        return fake_dnn_refuse(c,
                               "x, y, weights or the hidden-state descriptor's shape or strides");
    if (d->mode == CUDNN_LSTM && !state_desc_ok(d, cDesc, xDesc->B))
        return fake_dnn_refuse(c, "the cell-state descriptor's shape or strides");
    if (d->mode != CUDNN_LSTM && (cx || cy))
        return fake_dnn_refuse(c, "cell states for a non-LSTM cell");
    if (!weights_home(d, weightSpace))
        return fake_dnn_refuse(c, "a weight is not where this layout has it");
    if (!padding_zero(d, weightSpace))
        return fake_dnn_refuse(c, "weight-space bytes outside every matrix and bias are not zero");
    bool drop = training && d->drop && d->drop->p > 0.0f;
    uint64_t counter = 0;
    if (drop) {
        /* The generator states are read (and advanced) by a training forward with dropout:
         * they must still be the live block cudnnSetDropoutDescriptor initialised. */
        const unsigned char *stb = DEV(d->drop->states);
        for (size_t k = sizeof counter; k < d->drop->bytes; k++)
            if (stb[k] != (unsigned char)(d->drop->seed & 0xff))
                return fake_dnn_refuse(
                    c, "dropout states do not hold what cudnnSetDropoutDescriptor set");
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
        size_t space, k = fake_dnn_layout(d, &space);
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
        return fake_dnn_refuse(c, "y, dy, dx, weights or the hidden-state descriptor");
    if (d->mode == CUDNN_LSTM && !state_desc_ok(d, cDesc, xDesc->B))
        return fake_dnn_refuse(c, "the cell-state descriptor's shape or strides");
    if (!weights_home(d, weightSpace))
        return fake_dnn_refuse(c, "a weight is not where this layout has it");
    net_t t;
    net_init(&t, d, xDesc, weightSpace);
    /* forward's tail must still be there: the same reserve, untouched since */
    const unsigned char *r = res_tail(&t, reserveSpace);
    for (size_t k = 0; k < 777; k++) {
        if (r[k] != 0x5A) {
            net_free(&t);
            return fake_dnn_refuse(c, "reserve space does not hold the forward's contents");
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
        return fake_dnn_refuse(c, "x, y, dweightSpace or the hidden-state descriptor");
    if (F.data_done_reserve != reserveSpace)
        return fake_dnn_refuse(c, "backward weights before backward data on this reserve");
    F.data_done_reserve = NULL;
    size_t space, k = fake_dnn_layout(d, &space);
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
