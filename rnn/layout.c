/* The flat weight layout (cuDNN's canonical one), the named views over it, and the
 * activation accounting. Pure arithmetic: no allocation, no compute. */
#include <stdio.h>
#include <string.h>

#include "rnn/internal.h"

int mt__rnn_shape_init(mt__rnn_shape_t *s, const mt_rnn_cfg_t *cfg)
{
    if (cfg->input_size < 1 || cfg->hidden_size < 1 || cfg->num_layers < 1)
        return MT_EINVAL;
    switch (cfg->mode) {
    case MT_RNN_TANH:
    case MT_RNN_RELU:
        s->gates = 1;
        break;
    case MT_RNN_LSTM:
        s->gates = 4;
        break;
    case MT_RNN_GRU:
        s->gates = 3;
        break;
    default:
        return MT_EINVAL;
    }
    s->mode = cfg->mode;
    s->input = cfg->input_size;
    s->hidden = cfg->hidden_size;
    s->layers = cfg->num_layers;
    s->dirs = cfg->bidirectional ? 2 : 1;
    s->bias = cfg->bias;
    /* Written so that NaN fails too. */
    if (!(cfg->dropout >= 0.0f && cfg->dropout < 1.0f))
        return MT_EINVAL;
    s->dropout = cfg->dropout;
    s->xsmm = mt__rnn_xsmm_wanted();
    return 0;
}

int mt__rnn_layer_in(const mt__rnn_shape_t *s, int layer)
{
    return layer == 0 ? s->input : s->dirs * s->hidden;
}

size_t mt__rnn_pseudo_floats(const mt__rnn_shape_t *s, int layer)
{
    size_t gh = (size_t)s->gates * (size_t)s->hidden;
    size_t n = gh * ((size_t)mt__rnn_layer_in(s, layer) + (size_t)s->hidden);
    return s->bias ? n + 2 * gh : n;
}

size_t mt__rnn_pseudo_offset(const mt__rnn_shape_t *s, int layer, int dir)
{
    size_t off = 0;
    for (int l = 0; l < layer; l++)
        off += (size_t)s->dirs * mt__rnn_pseudo_floats(s, l);
    return off + (size_t)dir * mt__rnn_pseudo_floats(s, layer);
}

size_t mt__rnn_weight_floats(const mt__rnn_shape_t *s)
{
    return mt__rnn_pseudo_offset(s, s->layers, 0);
}

mt__rnn_mats_t mt__rnn_mats(const mt__rnn_shape_t *s, float *base, int layer, int dir)
{
    size_t gh = (size_t)s->gates * (size_t)s->hidden;
    mt__rnn_mats_t m;
    m.w = base + mt__rnn_pseudo_offset(s, layer, dir);
    m.r = m.w + gh * (size_t)mt__rnn_layer_in(s, layer);
    m.bw = s->bias ? m.r + gh * (size_t)s->hidden : NULL;
    m.br = s->bias ? m.bw + gh : NULL;
    return m;
}

size_t mt__rnn_view_count(const mt__rnn_shape_t *s)
{
    return (size_t)s->layers * (size_t)s->dirs * (s->bias ? 4 : 2);
}

void mt__rnn_views_init(const mt__rnn_shape_t *s, mt__rnn_view_t *views, float *flat)
{
    static const char *const kind_names[] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    int gh = s->gates * s->hidden;
    size_t i = 0;
    for (int l = 0; l < s->layers; l++) {
        for (int d = 0; d < s->dirs; d++) {
            size_t base = mt__rnn_pseudo_offset(s, l, d);
            int in = mt__rnn_layer_in(s, l);
            /* Offsets of the four parts inside the pseudo-layer, and their columns. */
            size_t offs[4] = {0, (size_t)gh * (size_t)in, (size_t)gh * (size_t)(in + s->hidden),
                              (size_t)gh * (size_t)(in + s->hidden) + (size_t)gh};
            int cols[4] = {in, s->hidden, 1, 1};
            int nkinds = s->bias ? 4 : 2;
            for (int k = 0; k < nkinds; k++, i++) {
                mt__rnn_view_t *v = &views[i];
                snprintf(v->name, sizeof v->name, "%s_l%d%s", kind_names[k], l,
                         d ? "_reverse" : "");
                v->kind = k;
                v->layer = l;
                v->dir = d;
                v->offset = base + offs[k];
                v->rows = gh;
                v->cols = cols[k];
                v->data = flat ? flat + v->offset : NULL;
            }
        }
    }
}

/* ---- activation accounting ---- */

/* H-vectors per (step, batch element, layer-direction); derivations at mt_rnn_act_t. The
 * gates take a row of mt__rnn_cpu_gld floats (g*H, or a little more). */
static double engine_hvec(const mt__rnn_shape_t *s)
{
    switch (s->mode) {
    case MT_RNN_LSTM: /* i, f, g, o, c, h */
    case MT_RNN_GRU:  /* r, z, n, R_n h + b_Rn, h */
        return (double)(mt__rnn_cpu_gld(s) + 2 * s->hidden) / (double)s->hidden;
    default:
        return 1.0; /* h */
    }
}

static double opbyop_hvec(int mode)
{
    switch (mode) {
    case MT_RNN_LSTM:
        return 21.0;
    case MT_RNN_GRU:
        return 17.0;
    default:
        return 4.0;
    }
}

void mt__rnn_activation(const mt__rnn_shape_t *s, int T, int B, mt_rnn_act_t *out)
{
    size_t per = (size_t)B * (size_t)s->hidden * (size_t)s->layers * (size_t)s->dirs;
    out->engine_hvec = engine_hvec(s);
    out->opbyop_hvec = opbyop_hvec(s->mode);
    /* Dropout: op by op, each lower layer's dropped output (1) and its byte mask (1/4) stay
     * too, averaged over the L layers; the engine regenerates the mask (dropout.c). */
    if (mt__rnn_drop_on(s))
        out->opbyop_hvec += 1.25 * (double)(s->layers - 1) / (double)s->layers;
    out->engine_bytes_per_step = (size_t)(out->engine_hvec * (double)per) * sizeof(float);
    out->opbyop_bytes_per_step = (size_t)(out->opbyop_hvec * (double)per) * sizeof(float);
    out->reserve_bytes = 0; /* filled by the module from its compute path */
    (void)T;
}

bool mt__rnn_regions_valid(const mt__rnn_region_t *r, int n, size_t total, size_t align)
{
    for (int i = 0; i < n; i++) {
        if (r[i].off % align != 0 || r[i].off > total || r[i].size > total - r[i].off)
            return false;
        for (int j = 0; j < i; j++) {
            if (!r[i].size || !r[j].size)
                continue;
            if (r[i].off < r[j].off + r[j].size && r[j].off < r[i].off + r[i].size)
                return false;
        }
    }
    return true;
}
