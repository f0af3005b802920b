/* The parameters of an RNN module: the flat weight and gradient buffers seen as named views
 * in PyTorch's order, rebinding a view to memory outside the flat buffer, flatten and
 * replicate, and compaction: the weights a call runs on when views were rebound. */
#include <stdint.h>
#include <string.h>

#include "util/log.h"
#include "rnn/internal.h"

#define rlog(m, level, ...) mt__logf((m)->cfg.log, (m)->cfg.log_ud, level, __VA_ARGS__)

/* ---- parameters ---- */

float *mt_rnn_weights(const mt_rnn_t *m, size_t *count)
{
    if (count)
        *count = m->weight_floats;
    return m->w;
}

float *mt_rnn_grads(const mt_rnn_t *m, size_t *count)
{
    if (count)
        *count = m->weight_floats;
    return m->dw;
}

int mt_rnn_zero_grads(mt_rnn_t *m)
{
    return m->path->zero(m, m->dw, m->weight_floats * sizeof(float));
}

size_t mt_rnn_param_count(const mt_rnn_t *m)
{
    return m->nviews;
}

static void fill_param(const mt_rnn_t *m, const mt__rnn_view_t *v, mt_rnn_param_t *out)
{
    out->name = v->name;
    out->kind = v->kind;
    out->layer = v->layer;
    out->dir = v->dir;
    out->offset = v->offset;
    out->rows = v->rows;
    out->cols = v->cols;
    out->numel = (size_t)v->rows * (size_t)v->cols;
    out->data = v->data;
    out->grad = m->dw + v->offset;
}

int mt_rnn_param_get(const mt_rnn_t *m, size_t i, mt_rnn_param_t *out)
{
    if (!m || !out)
        return MT_EINVAL;
    if (i >= m->nviews)
        return MT_ENOENT;
    fill_param(m, &m->views[i], out);
    return 0;
}

static mt__rnn_view_t *find_view(const mt_rnn_t *m, const char *name)
{
    for (size_t i = 0; i < m->nviews; i++)
        if (strcmp(m->views[i].name, name) == 0)
            return &m->views[i];
    return NULL;
}

int mt_rnn_param_find(const mt_rnn_t *m, const char *name, mt_rnn_param_t *out)
{
    if (!m || !name || !out)
        return MT_EINVAL;
    mt__rnn_view_t *v = find_view(m, name);
    if (!v)
        return MT_ENOENT;
    fill_param(m, v, out);
    return 0;
}

int mt_rnn_bind_param(mt_rnn_t *m, const char *name, float *ptr)
{
    if (!m || !name || !ptr)
        return MT_EINVAL;
    mt__rnn_view_t *v = find_view(m, name);
    if (!v)
        return MT_ENOENT;
    bool was = v->data != m->w + v->offset;
    bool now = ptr != m->w + v->offset;
    v->data = ptr;
    m->rebound = m->rebound - (was ? 1 : 0) + (now ? 1 : 0);
    return 0;
}

bool mt_rnn_is_flat(const mt_rnn_t *m)
{
    return m->rebound == 0;
}

int mt_rnn_flatten(mt_rnn_t *m)
{
    if (!m)
        return MT_EINVAL;
    for (size_t i = 0; i < m->nviews; i++) {
        mt__rnn_view_t *v = &m->views[i];
        float *home = m->w + v->offset;
        if (v->data == home)
            continue;
        size_t n = (size_t)v->rows * (size_t)v->cols * sizeof(float);
        int rc = m->path->copy(m, home, v->data, n);
        if (rc)
            return rc;
        v->data = home;
        m->rebound--;
    }
    rlog(m, MT_LOG_INFO, "rnn: weights flattened into one buffer of %zu bytes",
         m->weight_floats * sizeof(float));
    return 0;
}

int mt_rnn_replicate(const mt_rnn_t *m, mt_alloc_t *alloc, mt_rnn_t **out)
{
    if (!m || !alloc || !out)
        return MT_EINVAL;
    mt_rnn_cfg_t cfg = m->cfg;
    cfg.alloc = alloc;
    if (alloc != m->alloc)
        cfg.stream = NULL; /* streams belong to their backend */
    if (mt_alloc_backend(alloc) != m->backend) {
        /* So does a pinned host cache: the replica starts without offload. */
        cfg.offload_window = 0;
        cfg.offload_host = NULL;
    }
    mt_rnn_t *r;
    int rc = mt_rnn_create(&r, &cfg);
    if (rc)
        return rc;
    /* A flat module is one copy; otherwise each parameter goes straight to its place in
     * the replica's flat buffer. */
    if (m->rebound == 0) {
        rc = r->path->copy(r, r->w, m->w, m->weight_floats * sizeof(float));
        if (rc)
            mt_rnn_destroy(&r);
        else
            *out = r;
        return rc;
    }
    for (size_t i = 0; i < m->nviews; i++) {
        const mt__rnn_view_t *v = &m->views[i];
        size_t n = (size_t)v->rows * (size_t)v->cols * sizeof(float);
        rc = r->path->copy(r, r->w + v->offset, v->data, n);
        if (rc) {
            mt_rnn_destroy(&r);
            return rc;
        }
    }
    *out = r;
    return 0;
}

/* ---- compaction ---- */

/* Weights for one call: the flat buffer, or (when parameters were rebound) a new compacted
 * copy in *copy (tagged weights, the caller frees it), announced by a one-time warning and
 * an MT_EV_COMPACTION event per call. */
int mt__rnn_weights_for_call(mt_rnn_t *m, const float **w, float **copy)
{
    *copy = NULL;
    *w = m->w;
    if (m->rebound == 0)
        return 0;
    size_t bytes = m->weight_floats * sizeof(float);
    if (!m->warned) {
        m->warned = true;
        rlog(m, MT_LOG_WARN,
             "rnn: %zu of %zu parameters are not in the flat weight buffer; every call now "
             "copies all %zu bytes of weights into a temporary buffer. Call mt_rnn_flatten() "
             "(or replicate with mt_rnn_replicate(), which is flat) to avoid it",
             m->rebound, m->nviews, bytes);
    }
    float *c;
    int rc = mt__rnn_dmalloc(m, bytes, MT_TAG_WEIGHTS, (void **)&c);
    if (rc)
        return rc;
    for (size_t i = 0; i < m->nviews; i++) {
        const mt__rnn_view_t *v = &m->views[i];
        rc = m->path->copy(m, c + v->offset, v->data,
                           (size_t)v->rows * (size_t)v->cols * sizeof(float));
        if (rc) {
            mt__rnn_dfree(m, c);
            return rc;
        }
    }
    m->stats.compactions++;
    m->stats.compacted_bytes += bytes;
    mt_alloc_emit(m->alloc, MT_EV_COMPACTION, (uint64_t)(uintptr_t)c, bytes, MT_TAG_WEIGHTS);
    *copy = c;
    *w = c;
    return 0;
}
