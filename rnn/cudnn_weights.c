/* Where cuDNN keeps each matrix and bias, and the copies between the engine's layout and
 * cuDNN's (the "weight layout" paragraph of cudnn_path.c; docs/cudnn.md). */
#include <stdio.h>
#include <stdlib.h>

#include "rnn/cudnn_internal.h"

/* True when d (as cudnnGetRNNWeightParams filled it) describes a row-major [rows x cols]
 * float matrix, as the engine's views keep each gate's rows: dims {1, rows, cols}, strides
 * {rows cols, cols, 1}. Counting elements is not enough: a transposed or strided answer has
 * as many and would be read in another order. */
static int desc_matches(const mt_rnn_t *m, cudnnTensorDescriptor_t d, int rows, int cols, bool *ok,
                        char *got, size_t gotlen)
{
    cudnnDataType_t dt;
    int nd = 0, dims[8] = {0}, strides[8] = {0};
    CK(m, mt__dnn->cudnnGetTensorNdDescriptor(d, 8, &dt, &nd, dims, strides));
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
int mt__dnn_locate_weights(mt_rnn_t *m, cudnn_state_t *st)
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
                CK(m, mt__dnn->cudnnGetRNNWeightParams(st->h, st->rnn, p, st->weight_bytes, m->w,
                                                       id, st->qd, &ma, st->bd, &ba));
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
int mt__dnn_copy_regions(mt_rnn_t *m, cudnn_state_t *st, void *dst, const void *src, bool to_dnn)
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
