/* CPU forward of the RNN engine (the "cpu" compute path, used on the sim backend).
 *
 * Per layer, direction and chunk of C time steps (internal.h): ONE sgemm projects the
 * inputs of the chunk's steps at once ([C*B, in] x [in, g*H], biases pre-filled), then each
 * step makes one recurrent sgemm ([B, H] x [H, g*H]) and the elementwise cell math; the
 * states carry from chunk to chunk. In training mode the activated gates and the per-step
 * auxiliary vector (LSTM: c; GRU: R_n h + b_Rn) are written straight into the chunk's
 * reserve, and outputs of layers below the top stay there for backward; nothing else is
 * kept. Unidirectional modules run chunk-major (a chunk through all layers, then the next),
 * so inference's temporary memory is independent of T and a training chunk is complete,
 * ready to leave the device, before the next one starts. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rnn/internal.h"

static bool keeps_gates(const mt__rnn_shape_t *s)
{
    return s->mode == MT_RNN_LSTM || s->mode == MT_RNN_GRU;
}

/* ---- chunks and reserve layout ---- */

int mt__rnn_cpu_chunk_len(const mt__rnn_shape_t *s)
{
    return s->chunk > 0 ? s->chunk : MT__RNN_CHUNK;
}

int mt__rnn_cpu_nchunks(const mt__rnn_shape_t *s, int T)
{
    int c = mt__rnn_cpu_chunk_len(s);
    return (T + c - 1) / c;
}

int mt__rnn_cpu_chunk_steps(const mt__rnn_shape_t *s, int T, int k)
{
    int c = mt__rnn_cpu_chunk_len(s);
    return T - k * c < c ? T - k * c : c;
}

static size_t pseudo_reserve(const mt__rnn_shape_t *s, size_t nb)
{
    if (!keeps_gates(s))
        return 0;
    return nb * (size_t)(s->gates + 1) * (size_t)s->hidden;
}

size_t mt__rnn_cpu_chunk_floats(const mt__rnn_shape_t *s, int n, int B)
{
    size_t nb = (size_t)n * (size_t)B;
    size_t dh = (size_t)s->dirs * (size_t)s->hidden;
    return (size_t)s->layers * (size_t)s->dirs * pseudo_reserve(s, nb) +
           (size_t)(s->layers - 1) * nb * dh;
}

size_t mt__rnn_cpu_reserve_floats(const mt__rnn_shape_t *s, int T, int B)
{
    return mt__rnn_cpu_chunk_floats(s, T, B);
}

float *mt__rnn_cpu_gates(const mt__rnn_shape_t *s, float *chunk, int n, int B, int p)
{
    if (!keeps_gates(s))
        return NULL;
    return chunk + (size_t)p * pseudo_reserve(s, (size_t)n * (size_t)B);
}

float *mt__rnn_cpu_aux(const mt__rnn_shape_t *s, float *chunk, int n, int B, int p)
{
    if (!keeps_gates(s))
        return NULL;
    size_t nb = (size_t)n * (size_t)B;
    return mt__rnn_cpu_gates(s, chunk, n, B, p) + nb * (size_t)s->gates * (size_t)s->hidden;
}

float *mt__rnn_cpu_layer_out(const mt__rnn_shape_t *s, float *chunk, int n, int B, int l)
{
    size_t nb = (size_t)n * (size_t)B;
    size_t dh = (size_t)s->dirs * (size_t)s->hidden;
    return chunk + (size_t)s->layers * (size_t)s->dirs * pseudo_reserve(s, nb) +
           (size_t)l * nb * dh;
}

/* ---- workspace ---- */

/* Workspace: rec [B, gH], h and c states [L*D, B, H] each, then (inference, or RNN modes in
 * training) the gate buffer [C, B, gH], then (inference with L > 1) two layer buffers
 * [C, B, D*H] (unidirectional: chunk-major) or [T, B, D*H] (bidirectional: layer-major), or
 * (training with dropout) the dropped input of the layer being run [C, B, D*H]. */
size_t mt__rnn_cpu_fwd_work_floats(const mt__rnn_shape_t *s, int T, int B, bool training)
{
    int cl = mt__rnn_cpu_chunk_len(s);
    size_t c = (size_t)(T < cl ? T : cl);
    size_t b = (size_t)B, h = (size_t)s->hidden, gh = (size_t)s->gates * h;
    size_t ld = (size_t)s->layers * (size_t)s->dirs;
    size_t n = b * gh + 2 * ld * b * h;
    if (!training || !keeps_gates(s))
        n += c * b * gh;
    if (!training && s->layers > 1)
        n += 2 * (s->dirs == 1 ? c : (size_t)T) * b * (size_t)s->dirs * h;
    if (training && mt__rnn_drop_on(s))
        n += c * b * (size_t)s->dirs * h;
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

typedef struct fwd_s {
    const mt__rnn_shape_t *s;
    const float *w;
    const mt_rnn_io_t *io;
    bool training;
    uint64_t key; /* dropout */
    float *rec, *hst, *cst, *gbuf;
    float *lbuf[2]; /* inference, L > 1 */
    float *dbuf;    /* training with dropout: the dropped input of layer l > 0 */
} fwd_t;

/* Layer l, direction d over chunk k (reserve r when training), states carried in hst/cst. */
static void fwd_chunk(const fwd_t *f, int l, int d, int k, float *r)
{
    const mt__rnn_shape_t *s = f->s;
    int T = f->io->seq_len, B = f->io->batch, H = s->hidden, D = s->dirs, L = s->layers;
    int dh = D * H, n = mt__rnn_cpu_chunk_steps(s, T, k), p = l * D + d;
    size_t t0 = (size_t)k * (size_t)mt__rnn_cpu_chunk_len(s), bh = (size_t)B * (size_t)H;
    /* Inference keeps layer outputs in lbuf: chunk-local (D = 1) or whole-sequence. */
    size_t lofs = D == 1 ? 0 : t0 * (size_t)B * (size_t)dh;
    const float *in;
    float *out;
    if (l == 0)
        in = f->io->x + t0 * (size_t)B * (size_t)s->input;
    else if (f->training)
        in = mt__rnn_cpu_layer_out(s, r, n, B, l - 1);
    else
        in = f->lbuf[(l - 1) % 2] + lofs;
    if (l > 0 && f->dbuf) {
        /* The reserve keeps layer l-1's output h; layer l reads it through the mask. */
        size_t row = (size_t)B * (size_t)dh;
        mt__rnn_drop_apply(s, f->key, l - 1, t0 * row, (size_t)n * row, in, f->dbuf);
        in = f->dbuf;
    }
    if (l == L - 1)
        out = f->io->y + t0 * (size_t)B * (size_t)dh;
    else if (f->training)
        out = mt__rnn_cpu_layer_out(s, r, n, B, l);
    else
        out = f->lbuf[l % 2] + lofs;
    dir_run_t a = {
        .s = s,
        .w = mt__rnn_mats(s, (float *)f->w, l, d),
        .steps = n,
        .batch = B,
        .in = mt__rnn_layer_in(s, l),
        .x = in,
        .out = out + (size_t)d * H,
        .ldo = dh,
        .gates = f->gbuf,
        .aux = NULL,
        .h = f->hst + (size_t)p * bh,
        .c = f->cst + (size_t)p * bh,
        .rec = f->rec,
        .reverse = d == 1,
    };
    if (f->training && keeps_gates(s)) {
        a.gates = mt__rnn_cpu_gates(s, r, n, B, p);
        a.aux = mt__rnn_cpu_aux(s, r, n, B, p);
    }
    run_dir(&a);
}

int mt__rnn_cpu_forward_chunks(const mt__rnn_shape_t *s, const float *w, const mt_rnn_io_t *io,
                               bool training, uint64_t key, const mt__rnn_chunks_t *chunks,
                               float *work)
{
    int T = io->seq_len, B = io->batch, H = s->hidden, D = s->dirs, L = s->layers;
    int gh = s->gates * H, K = mt__rnn_cpu_nchunks(s, T);
    int C = T < mt__rnn_cpu_chunk_len(s) ? T : mt__rnn_cpu_chunk_len(s);
    size_t bh = (size_t)B * (size_t)H, nstate = (size_t)L * (size_t)D * bh;
    if (training && !chunks)
        return MT_EINVAL;

    fwd_t f = {.s = s, .w = w, .io = io, .training = training, .key = key};
    f.rec = work;
    f.hst = f.rec + (size_t)B * gh;
    f.cst = f.hst + nstate;
    f.gbuf = f.cst + nstate;
    if (!training && L > 1) {
        f.lbuf[0] = f.gbuf + (size_t)C * B * gh;
        f.lbuf[1] = f.lbuf[0] + (size_t)(D == 1 ? C : T) * B * D * H;
    }
    if (training && mt__rnn_drop_on(s))
        f.dbuf = f.gbuf + (keeps_gates(s) ? 0 : (size_t)C * B * gh);
    if (io->hx)
        memcpy(f.hst, io->hx, nstate * sizeof(float));
    else
        memset(f.hst, 0, nstate * sizeof(float));
    if (io->cx && s->mode == MT_RNN_LSTM)
        memcpy(f.cst, io->cx, nstate * sizeof(float));
    else
        memset(f.cst, 0, nstate * sizeof(float));

    int rc = 0;
    if (D == 1) {
        /* Chunk-major: chunk k is complete (and may leave the device) before k+1 starts. */
        for (int k = 0; k < K && rc == 0; k++) {
            float *r = NULL;
            if (training)
                rc = chunks->fwd_get(chunks->ud, k, &r);
            for (int l = 0; l < L && rc == 0; l++)
                fwd_chunk(&f, l, 0, k, r);
            if (training && rc == 0)
                rc = chunks->fwd_done(chunks->ud, k);
        }
    } else {
        float **r = calloc((size_t)K, sizeof *r);
        if (!r)
            return MT_ENOMEM;
        for (int k = 0; training && k < K && rc == 0; k++)
            rc = chunks->fwd_get(chunks->ud, k, &r[k]);
        for (int l = 0; l < L && rc == 0; l++)
            for (int d = 0; d < D; d++)
                for (int i = 0; i < K; i++) {
                    int k = d == 0 ? i : K - 1 - i;
                    fwd_chunk(&f, l, d, k, r[k]);
                }
        for (int k = 0; training && k < K && rc == 0; k++)
            rc = chunks->fwd_done(chunks->ud, k);
        free(r);
    }
    if (rc)
        return rc;
    if (io->hy)
        memcpy(io->hy, f.hst, nstate * sizeof(float));
    if (io->cy && s->mode == MT_RNN_LSTM)
        memcpy(io->cy, f.cst, nstate * sizeof(float));
    return 0;
}

/* ---- one flat reserve ---- */

typedef struct flat_s {
    const mt__rnn_shape_t *s;
    float *base;
    int B;
} flat_t;

static int flat_get(void *ud, int k, float **out)
{
    const flat_t *f = ud;
    *out = f->base + mt__rnn_cpu_chunk_floats(f->s, k * mt__rnn_cpu_chunk_len(f->s), f->B);
    return 0;
}

static int flat_done(void *ud, int k)
{
    (void)ud;
    (void)k;
    return 0;
}

static mt__rnn_chunks_t flat_chunks(flat_t *f)
{
    mt__rnn_chunks_t c = {flat_get, flat_done, flat_get, flat_done, f};
    return c;
}

int mt__rnn_cpu_forward_drop(const mt__rnn_shape_t *s, const float *w, const mt_rnn_io_t *io,
                             bool training, uint64_t key, float *reserve, float *work)
{
    flat_t f = {s, reserve, io->batch};
    mt__rnn_chunks_t c = flat_chunks(&f);
    return mt__rnn_cpu_forward_chunks(s, w, io, training, key, training ? &c : NULL, work);
}

int mt__rnn_cpu_backward_drop(const mt__rnn_shape_t *s, const float *w, float *dw,
                              const mt_rnn_io_t *io, uint64_t key, float *reserve,
                              const mt_rnn_grad_io_t *g, float *work)
{
    flat_t f = {s, reserve, io->batch};
    mt__rnn_chunks_t c = flat_chunks(&f);
    return mt__rnn_cpu_backward_chunks(s, w, dw, io, key, &c, g, work);
}

int mt__rnn_cpu_forward(const mt__rnn_shape_t *s, const float *w, const mt_rnn_io_t *io,
                        bool training, float *reserve, float *work)
{
    return mt__rnn_cpu_forward_drop(s, w, io, training, 0, reserve, work);
}

int mt__rnn_cpu_backward(const mt__rnn_shape_t *s, const float *w, float *dw, const mt_rnn_io_t *io,
                         float *reserve, const mt_rnn_grad_io_t *g, float *work)
{
    return mt__rnn_cpu_backward_drop(s, w, dw, io, 0, reserve, g, work);
}
