/* CPU forward of the RNN engine (the "cpu" compute path, used on the sim backend).
 *
 * Per layer and direction: ONE sgemm projects the inputs of all time steps at once
 * ([T*B, in] x [in, g*H], biases pre-filled), then each step makes one recurrent sgemm
 * ([B, H] x [H, g*H]) and the elementwise cell math. In training mode the activated gates
 * and the per-step auxiliary vector (LSTM: c; GRU: R_n h + b_Rn) are written straight into
 * the reserve, and layer outputs of layers below the top stay there for backward; nothing
 * else is kept. Inference of unidirectional modules runs in chunks of MT__RNN_CHUNK steps
 * through all layers, carrying the states, so its temporary memory is independent of T. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "rnn/internal.h"

static bool keeps_gates(const mt__rnn_shape_t *s)
{
    return s->mode == MT_RNN_LSTM || s->mode == MT_RNN_GRU;
}

/* ---- reserve layout ---- */

static size_t pseudo_reserve(const mt__rnn_shape_t *s, size_t tb)
{
    if (!keeps_gates(s))
        return 0;
    return tb * (size_t)(s->gates + 1) * (size_t)s->hidden;
}

size_t mt__rnn_cpu_reserve_floats(const mt__rnn_shape_t *s, int T, int B)
{
    size_t tb = (size_t)T * (size_t)B;
    size_t dh = (size_t)s->dirs * (size_t)s->hidden;
    return (size_t)s->layers * (size_t)s->dirs * pseudo_reserve(s, tb) +
           (size_t)(s->layers - 1) * tb * dh;
}

float *mt__rnn_cpu_gates(const mt__rnn_shape_t *s, float *reserve, int T, int B, int p)
{
    if (!keeps_gates(s))
        return NULL;
    return reserve + (size_t)p * pseudo_reserve(s, (size_t)T * (size_t)B);
}

float *mt__rnn_cpu_aux(const mt__rnn_shape_t *s, float *reserve, int T, int B, int p)
{
    if (!keeps_gates(s))
        return NULL;
    size_t tb = (size_t)T * (size_t)B;
    return mt__rnn_cpu_gates(s, reserve, T, B, p) + tb * (size_t)s->gates * (size_t)s->hidden;
}

float *mt__rnn_cpu_layer_out(const mt__rnn_shape_t *s, float *reserve, int T, int B, int l)
{
    size_t tb = (size_t)T * (size_t)B;
    size_t dh = (size_t)s->dirs * (size_t)s->hidden;
    return reserve + (size_t)s->layers * (size_t)s->dirs * pseudo_reserve(s, tb) +
           (size_t)l * tb * dh;
}

/* ---- workspace ---- */

static int chunk_steps(const mt__rnn_shape_t *s, int T, bool training)
{
    if (training || s->dirs == 2 || T < MT__RNN_CHUNK)
        return T;
    return MT__RNN_CHUNK;
}

/* Workspace: rec [B, gH], h and c states [L*D, B, H] each, then (inference, or RNN modes in
 * training) the gate buffer [C, B, gH], then (inference with L > 1) two layer buffers
 * [C, B, D*H]. */
size_t mt__rnn_cpu_fwd_work_floats(const mt__rnn_shape_t *s, int T, int B, bool training)
{
    size_t c = (size_t)chunk_steps(s, T, training);
    size_t b = (size_t)B, h = (size_t)s->hidden, gh = (size_t)s->gates * h;
    size_t ld = (size_t)s->layers * (size_t)s->dirs;
    size_t n = b * gh + 2 * ld * b * h;
    if (!training || !keeps_gates(s))
        n += c * b * gh;
    if (!training && s->layers > 1)
        n += 2 * c * b * (size_t)s->dirs * h;
    return n;
}

/* ---- one layer, one direction, over C steps ---- */

typedef struct dir_run_s {
    const mt__rnn_shape_t *s;
    mt__rnn_mats_t w;
    int steps;      /* C */
    int batch;      /* B */
    int in;         /* input width */
    const float *x; /* [C, B, in] */
    float *out;     /* output of step 0, this direction's columns; row stride ldo */
    int ldo;
    float *gates; /* [C, B, gH] */
    float *aux;   /* [C, B, H] or NULL (inference) */
    float *h;     /* state [B, H], in/out */
    float *c;     /* LSTM state [B, H], in/out */
    float *rec;   /* [B, gH] */
    bool reverse;
} dir_run_t;

static void project_inputs(const dir_run_t *a)
{
    const mt__rnn_shape_t *s = a->s;
    int H = s->hidden, gh = s->gates * H;
    size_t rows = (size_t)a->steps * (size_t)a->batch;
    if (a->w.bw) {
        /* The recurrent bias is folded in too, except GRU's n gate, where it sits inside
         * r * (R_n h + b_Rn). */
        int fold = s->mode == MT_RNN_GRU ? 2 * H : gh;
        float *row0 = a->gates;
        for (int j = 0; j < gh; j++)
            row0[j] = a->w.bw[j] + (j < fold ? a->w.br[j] : 0.0f);
        for (size_t r = 1; r < rows; r++)
            memcpy(a->gates + r * (size_t)gh, row0, (size_t)gh * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, gh, a->in, 1.0f, a->x, a->in,
                a->w.w, a->in, a->w.bw ? 1.0f : 0.0f, a->gates, gh);
}

static void lstm_cell(const dir_run_t *a, float *g, float *o, float *aux)
{
    int H = a->s->hidden, gh = 4 * H;
    for (int b = 0; b < a->batch; b++) {
        float *gb = g + (size_t)b * gh;
        const float *rb = a->rec + (size_t)b * gh;
        float *cb = a->c + (size_t)b * H;
        float *ob = o + (size_t)b * a->ldo;
        for (int j = 0; j < H; j++) {
            float ii = mt__rnn_sigmoid(gb[j] + rb[j]);
            float ff = mt__rnn_sigmoid(gb[H + j] + rb[H + j]);
            float gg = mt__rnn_tanh(gb[2 * H + j] + rb[2 * H + j]);
            float oo = mt__rnn_sigmoid(gb[3 * H + j] + rb[3 * H + j]);
            float cc = ff * cb[j] + ii * gg;
            cb[j] = cc;
            ob[j] = oo * mt__rnn_tanh(cc);
            gb[j] = ii;
            gb[H + j] = ff;
            gb[2 * H + j] = gg;
            gb[3 * H + j] = oo;
        }
        if (aux)
            memcpy(aux + (size_t)b * H, cb, (size_t)H * sizeof(float));
    }
}

static void gru_cell(const dir_run_t *a, float *g, float *o, float *aux, const float *hp, int ldh)
{
    int H = a->s->hidden, gh = 3 * H;
    const float *brn = a->w.br ? a->w.br + 2 * H : NULL;
    for (int b = 0; b < a->batch; b++) {
        float *gb = g + (size_t)b * gh;
        const float *rb = a->rec + (size_t)b * gh;
        const float *hb = hp + (size_t)b * ldh;
        float *ob = o + (size_t)b * a->ldo;
        for (int j = 0; j < H; j++) {
            float rr = mt__rnn_sigmoid(gb[j] + rb[j]);
            float zz = mt__rnn_sigmoid(gb[H + j] + rb[H + j]);
            float rn = rb[2 * H + j] + (brn ? brn[j] : 0.0f);
            float nn = mt__rnn_tanh(gb[2 * H + j] + rr * rn);
            ob[j] = (1.0f - zz) * nn + zz * hb[j];
            gb[j] = rr;
            gb[H + j] = zz;
            gb[2 * H + j] = nn;
            if (aux)
                aux[(size_t)b * H + j] = rn;
        }
    }
}

static void rnn_cell(const dir_run_t *a, float *g, float *o)
{
    int H = a->s->hidden;
    bool relu = a->s->mode == MT_RNN_RELU;
    for (int b = 0; b < a->batch; b++) {
        const float *gb = g + (size_t)b * H;
        const float *rb = a->rec + (size_t)b * H;
        float *ob = o + (size_t)b * a->ldo;
        for (int j = 0; j < H; j++) {
            float v = gb[j] + rb[j];
            ob[j] = relu ? (v > 0.0f ? v : 0.0f) : mt__rnn_tanh(v);
        }
    }
}

static void run_dir(const dir_run_t *a)
{
    const mt__rnn_shape_t *s = a->s;
    int H = s->hidden, gh = s->gates * H, B = a->batch;
    size_t step_out = (size_t)B * (size_t)a->ldo;
    project_inputs(a);
    int last = 0;
    for (int k = 0; k < a->steps; k++) {
        int t = a->reverse ? a->steps - 1 - k : k;
        const float *hp = a->h;
        int ldh = H;
        if (k > 0) {
            int tp = a->reverse ? t + 1 : t - 1;
            hp = a->out + (size_t)tp * step_out;
            ldh = a->ldo;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, gh, H, 1.0f, hp, ldh, a->w.r, H,
                    0.0f, a->rec, gh);
        float *g = a->gates + (size_t)t * (size_t)B * (size_t)gh;
        float *o = a->out + (size_t)t * step_out;
        float *aux = a->aux ? a->aux + (size_t)t * (size_t)B * (size_t)H : NULL;
        if (s->mode == MT_RNN_LSTM)
            lstm_cell(a, g, o, aux);
        else if (s->mode == MT_RNN_GRU)
            gru_cell(a, g, o, aux, hp, ldh);
        else
            rnn_cell(a, g, o);
        last = t;
    }
    /* Carry the final hidden state (the next chunk, hy). */
    for (int b = 0; b < B; b++)
        memcpy(a->h + (size_t)b * H, a->out + (size_t)last * step_out + (size_t)b * a->ldo,
               (size_t)H * sizeof(float));
}

/* ---- the whole stack ---- */

int mt__rnn_cpu_forward(const mt__rnn_shape_t *s, const float *w, const mt_rnn_io_t *io,
                        bool training, float *reserve, float *work)
{
    int T = io->seq_len, B = io->batch, H = s->hidden, D = s->dirs, L = s->layers;
    int gh = s->gates * H, dh = D * H;
    int C = chunk_steps(s, T, training);
    size_t bh = (size_t)B * (size_t)H, nstate = (size_t)L * (size_t)D * bh;

    float *rec = work;
    float *hst = rec + (size_t)B * gh;
    float *cst = hst + nstate;
    float *gbuf = cst + nstate;
    float *lbuf[2] = {NULL, NULL};
    if (!training && L > 1) {
        lbuf[0] = gbuf + (size_t)C * B * gh;
        lbuf[1] = lbuf[0] + (size_t)C * B * dh;
    }
    if (io->hx)
        memcpy(hst, io->hx, nstate * sizeof(float));
    else
        memset(hst, 0, nstate * sizeof(float));
    if (io->cx && s->mode == MT_RNN_LSTM)
        memcpy(cst, io->cx, nstate * sizeof(float));
    else
        memset(cst, 0, nstate * sizeof(float));

    for (int t0 = 0; t0 < T; t0 += C) {
        int n = T - t0 < C ? T - t0 : C;
        const float *in = io->x + (size_t)t0 * B * s->input;
        for (int l = 0; l < L; l++) {
            float *out;
            if (l == L - 1)
                out = io->y + (size_t)t0 * B * dh;
            else if (training)
                out = mt__rnn_cpu_layer_out(s, reserve, T, B, l);
            else
                out = lbuf[l % 2];
            for (int d = 0; d < D; d++) {
                int p = l * D + d;
                dir_run_t a = {
                    .s = s,
                    .w = mt__rnn_mats(s, (float *)w, l, d),
                    .steps = n,
                    .batch = B,
                    .in = mt__rnn_layer_in(s, l),
                    .x = in,
                    .out = out + (size_t)d * H,
                    .ldo = dh,
                    .gates = gbuf,
                    .aux = NULL,
                    .h = hst + (size_t)p * bh,
                    .c = cst + (size_t)p * bh,
                    .rec = rec,
                    .reverse = d == 1,
                };
                if (training && keeps_gates(s)) {
                    a.gates = mt__rnn_cpu_gates(s, reserve, T, B, p);
                    a.aux = mt__rnn_cpu_aux(s, reserve, T, B, p);
                }
                run_dir(&a);
            }
            in = out;
        }
    }
    if (io->hy)
        memcpy(io->hy, hst, nstate * sizeof(float));
    if (io->cy && s->mode == MT_RNN_LSTM)
        memcpy(io->cy, cst, nstate * sizeof(float));
    return 0;
}
