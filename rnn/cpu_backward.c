/* CPU backward of the RNN engine: data and weight gradients.
 *
 * Chunk by chunk (see internal.h: unidirectional modules chunk-major, last chunk first;
 * bidirectional ones layer-major), each layer and direction in reverse of its forward order.
 * Per step, the elementwise math turns dh (from above plus from the next step) into the
 * gradients of the gate pre-activations, written IN PLACE over the reserve's gates (they are
 * not needed once their step is done), and one sgemm sends dh to the previous step. Weight
 * gradients are then merged over the chunk's steps: one sgemm for dW ([gH, C*B] x
 * [C*B, in]), one for dR (GRU: two, because its n gate's recurrent gradient is r * dn), and
 * one for the input gradient. They accumulate into dw, as cuDNN's RNNBackwardWeights does.
 * The carried dh (and LSTM dc) of every layer and direction lives in the workspace. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rnn/internal.h"

/* Workspace: dh_next and dc_next [L*D, B, H] each, zeros [B, H], dgh [B, gH] (GRU), the RNN
 * modes' gate gradients [C, B, H], and (L > 1) two buffers for the gradient between layers,
 * [C, B, D*H] (unidirectional: chunk-major) or [T, B, D*H] (bidirectional), then (dropout)
 * the regenerated dropped input of the layer being differentiated [C, B, D*H]. */
size_t mt__rnn_cpu_bwd_work_floats(const mt__rnn_shape_t *s, int T, int B)
{
    int cl = mt__rnn_cpu_chunk_len(s);
    size_t c = (size_t)(T < cl ? T : cl);
    size_t b = (size_t)B, h = (size_t)s->hidden, gh = (size_t)s->gates * h;
    size_t ld = (size_t)s->layers * (size_t)s->dirs;
    size_t n = 2 * ld * b * h + b * h + b * gh;
    if (s->mode != MT_RNN_LSTM && s->mode != MT_RNN_GRU)
        n += c * b * gh;
    if (s->layers > 1)
        n += 2 * (s->dirs == 1 ? c : (size_t)T) * b * (size_t)s->dirs * h;
    if (mt__rnn_drop_on(s))
        n += c * b * (size_t)s->dirs * h;
    return n;
}

/* One layer and direction over one chunk of T steps (chunk-local pointers). */
typedef struct dir_back_s {
    const mt__rnn_shape_t *s;
    mt__rnn_mats_t w, dw;
    int T, B, in;
    const float *x;   /* layer input [T, B, in] */
    const float *out; /* layer output, this direction's columns, row stride ldo */
    int ldo;
    /* The state entering the chunk's first processed step: the neighbouring chunk's step
     * (row stride ldh for h, H for c), or hx/cx at the sequence's end; NULL = zeros. */
    const float *hin;
    int ldh;
    const float *cin;
    float *g;          /* [T, B, gH]: gates in, pre-activation gradients out */
    float *aux;        /* [T, B, H] (LSTM c, GRU R_n h + b_Rn -> r * dn) or NULL */
    const float *dout; /* gradient of out, same strides as out */
    float *din;        /* [T, B, in] or NULL */
    float din_beta;    /* 0 for the first direction, 1 to add the second */
    float *dhn, *dcn;  /* carried dh, dc [B, H] of this layer and direction */
    float *zeros, *dgh;
    bool reverse;
} dir_back_t;

static void lstm_step(const dir_back_t *a, int t, bool first, int tp)
{
    int H = a->s->hidden, gh = 4 * H, B = a->B;
    const float *ct = a->aux + (size_t)t * B * H;
    const float *cp = first ? (a->cin ? a->cin : a->zeros) : a->aux + (size_t)tp * B * H;
    float *g = a->g + (size_t)t * B * gh;
    const float *dout = a->dout + (size_t)t * B * a->ldo;
    for (int b = 0; b < B; b++) {
        float *gb = g + (size_t)b * gh;
        for (int j = 0; j < H; j++) {
            size_t k = (size_t)b * H + j;
            float dh = dout[(size_t)b * a->ldo + j] + a->dhn[k];
            float ii = gb[j], ff = gb[H + j], gg = gb[2 * H + j], oo = gb[3 * H + j];
            float tc = mt__rnn_tanh(ct[k]);
            float dc = a->dcn[k] + dh * oo * (1.0f - tc * tc);
            float d_o = dh * tc;
            a->dcn[k] = dc * ff;
            gb[j] = dc * gg * ii * (1.0f - ii);
            gb[H + j] = dc * cp[k] * ff * (1.0f - ff);
            gb[2 * H + j] = dc * ii * (1.0f - gg * gg);
            gb[3 * H + j] = d_o * oo * (1.0f - oo);
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, H, gh, 1.0f, g, gh, a->w.r, H, 0.0f,
                a->dhn, H);
}

static void gru_step(const dir_back_t *a, int t, const float *hp, int ldh)
{
    int H = a->s->hidden, gh = 3 * H, B = a->B;
    float *g = a->g + (size_t)t * B * gh;
    float *aux = a->aux + (size_t)t * B * H;
    const float *dout = a->dout + (size_t)t * B * a->ldo;
    for (int b = 0; b < B; b++) {
        float *gb = g + (size_t)b * gh;
        float *db = a->dgh + (size_t)b * gh;
        for (int j = 0; j < H; j++) {
            size_t k = (size_t)b * H + j;
            float dh = dout[(size_t)b * a->ldo + j] + a->dhn[k];
            float rr = gb[j], zz = gb[H + j], nn = gb[2 * H + j], rn = aux[k];
            float dnp = dh * (1.0f - zz) * (1.0f - nn * nn);
            float drp = dnp * rn * rr * (1.0f - rr);
            float dzp = dh * (hp[(size_t)b * ldh + j] - nn) * zz * (1.0f - zz);
            a->dhn[k] = dh * zz;
            gb[j] = drp;
            gb[H + j] = dzp;
            gb[2 * H + j] = dnp;
            aux[k] = dnp * rr;
            db[j] = drp;
            db[H + j] = dzp;
            db[2 * H + j] = dnp * rr;
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, H, gh, 1.0f, a->dgh, gh, a->w.r, H,
                1.0f, a->dhn, H);
}

static void rnn_step(const dir_back_t *a, int t)
{
    int H = a->s->hidden, B = a->B;
    bool relu = a->s->mode == MT_RNN_RELU;
    float *g = a->g + (size_t)t * B * H;
    const float *o = a->out + (size_t)t * B * a->ldo;
    const float *dout = a->dout + (size_t)t * B * a->ldo;
    for (int b = 0; b < B; b++) {
        for (int j = 0; j < H; j++) {
            size_t k = (size_t)b * H + j;
            float dh = dout[(size_t)b * a->ldo + j] + a->dhn[k];
            float hv = o[(size_t)b * a->ldo + j];
            g[k] = relu ? (hv > 0.0f ? dh : 0.0f) : dh * (1.0f - hv * hv);
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, H, H, 1.0f, g, H, a->w.r, H, 0.0f,
                a->dhn, H);
}

/* dR += Gs^T Hs over n rows; for GRU the n gate's rows come from aux (r * dn). */
static void recurrent_grad(const dir_back_t *a, const float *gs, const float *as, const float *hs,
                           int ldh, int n)
{
    int H = a->s->hidden, gh = a->s->gates * H;
    if (a->s->mode == MT_RNN_GRU) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, 2 * H, H, n, 1.0f, gs, gh, hs, ldh,
                    1.0f, a->dw.r, H);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, H, n, 1.0f, as, H, hs, ldh, 1.0f,
                    a->dw.r + (size_t)2 * H * H, H);
    } else {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, gh, H, n, 1.0f, gs, gh, hs, ldh, 1.0f,
                    a->dw.r, H);
    }
}

static void back_dir(const dir_back_t *a)
{
    const mt__rnn_shape_t *s = a->s;
    int H = s->hidden, gh = s->gates * H, B = a->B, T = a->T;
    size_t bh = (size_t)B * H, tb = (size_t)T * B;

    for (int k = 0; k < T; k++) {
        int t = a->reverse ? k : T - 1 - k;
        bool first = a->reverse ? t == T - 1 : t == 0;
        int tp = a->reverse ? t + 1 : t - 1;
        if (s->mode == MT_RNN_LSTM) {
            lstm_step(a, t, first, tp);
        } else if (s->mode == MT_RNN_GRU) {
            const float *hp = a->hin ? a->hin : a->zeros;
            int ldh = a->hin ? a->ldh : H;
            if (!first) {
                hp = a->out + (size_t)tp * B * a->ldo;
                ldh = a->ldo;
            }
            gru_step(a, t, hp, ldh);
        } else {
            rnn_step(a, t);
        }
    }

    /* Weight gradients merged over the chunk's steps. */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, gh, a->in, (int)tb, 1.0f, a->g, gh, a->x,
                a->in, 1.0f, a->dw.w, a->in);
    if (T > 1) {
        /* Step t's h_prev is the output of t-1 (forward) or t+1 (reverse). */
        size_t skip_g = bh * (size_t)s->gates, skip_o = (size_t)B * a->ldo;
        const float *gs = a->reverse ? a->g : a->g + skip_g;
        const float *as = a->aux ? (a->reverse ? a->aux : a->aux + bh) : NULL;
        const float *hs = a->reverse ? a->out + skip_o : a->out;
        recurrent_grad(a, gs, as, hs, a->ldo, (T - 1) * B);
    }
    if (a->hin) {
        int tf = a->reverse ? T - 1 : 0;
        const float *as = a->aux ? a->aux + (size_t)tf * bh : NULL;
        recurrent_grad(a, a->g + (size_t)tf * bh * s->gates, as, a->hin, a->ldh, B);
    }
    if (a->dw.bw) {
        for (size_t r = 0; r < tb; r++) {
            const float *gr = a->g + r * gh;
            for (int j = 0; j < gh; j++)
                a->dw.bw[j] += gr[j];
            if (s->mode == MT_RNN_GRU) {
                const float *ar = a->aux + r * H;
                for (int j = 0; j < 2 * H; j++)
                    a->dw.br[j] += gr[j];
                for (int j = 0; j < H; j++)
                    a->dw.br[2 * H + j] += ar[j];
            } else {
                /* b_W and b_R enter the same sum: their gradients are equal. */
                for (int j = 0; j < gh; j++)
                    a->dw.br[j] += gr[j];
            }
        }
    }
    if (a->din)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)tb, a->in, gh, 1.0f, a->g, gh,
                    a->w.w, a->in, a->din_beta, a->din, a->in);
}

typedef struct bwd_s {
    const mt__rnn_shape_t *s;
    const float *w;
    float *dw;
    const mt_rnn_io_t *io;
    const mt_rnn_grad_io_t *g;
    float *dhn, *dcn, *zeros, *dgh, *rbuf;
    float *dbuf[2]; /* L > 1 */
    uint64_t key;   /* dropout: forward's key */
    float *xdrop;   /* dropout: layer l > 0's input, regenerated per chunk */
} bwd_t;

/* Layer l, direction d over chunk k (reserve r); rn is the reserve of the neighbouring
 * chunk whose step enters this one (k-1 forward, k+1 reverse), NULL if there is none. */
static void back_chunk(const bwd_t *b, int l, int d, int k, float *r, float *rn)
{
    const mt__rnn_shape_t *s = b->s;
    const mt_rnn_io_t *io = b->io;
    const mt_rnn_grad_io_t *g = b->g;
    int T = io->seq_len, B = io->batch, H = s->hidden, D = s->dirs, L = s->layers;
    int dh = D * H, C = mt__rnn_cpu_chunk_len(s), K = mt__rnn_cpu_nchunks(s, T);
    int n = mt__rnn_cpu_chunk_steps(s, T, k), p = l * D + d;
    bool gates_in_reserve = s->mode == MT_RNN_LSTM || s->mode == MT_RNN_GRU;
    size_t bh = (size_t)B * H, so = (size_t)p * bh, t0 = (size_t)k * (size_t)C;
    size_t ofs = D == 1 ? 0 : t0 * (size_t)B * (size_t)dh; /* into dbuf */
    const float *in =
        l == 0 ? io->x + t0 * B * (size_t)s->input : mt__rnn_cpu_layer_out(s, r, n, B, l - 1);
    if (l > 0 && b->xdrop) {
        /* The weight gradient needs the input forward used: the mask applied again. */
        size_t row = (size_t)B * (size_t)dh;
        mt__rnn_drop_apply(s, b->key, l - 1, t0 * row, (size_t)n * row, in, b->xdrop);
        in = b->xdrop;
    }
    const float *out =
        l == L - 1 ? io->y + t0 * B * (size_t)dh : mt__rnn_cpu_layer_out(s, r, n, B, l);
    const float *dout = l == L - 1 ? g->dy + t0 * B * (size_t)dh : b->dbuf[l % 2] + ofs;
    float *din = l > 0   ? b->dbuf[(l - 1) % 2] + ofs
                 : g->dx ? g->dx + t0 * B * (size_t)s->input
                         : NULL;
    dir_back_t a = {
        .s = s,
        .w = mt__rnn_mats(s, (float *)b->w, l, d),
        .dw = mt__rnn_mats(s, b->dw, l, d),
        .T = n,
        .B = B,
        .in = mt__rnn_layer_in(s, l),
        .x = in,
        .out = out + (size_t)d * H,
        .ldo = dh,
        .hin = io->hx ? io->hx + so : NULL,
        .ldh = H,
        .cin = io->cx && s->mode == MT_RNN_LSTM ? io->cx + so : NULL,
        .g = gates_in_reserve ? mt__rnn_cpu_gates(s, r, n, B, p) : b->rbuf,
        .aux = mt__rnn_cpu_aux(s, r, n, B, p),
        .dout = dout + (size_t)d * H,
        .din = din,
        .din_beta = d == 0 ? 0.0f : 1.0f,
        .dhn = b->dhn + so,
        .dcn = b->dcn + so,
        .zeros = b->zeros,
        .dgh = b->dgh,
        .reverse = d == 1,
    };
    int kn = d == 0 ? k - 1 : k + 1;
    if (kn >= 0 && kn < K) {
        int nn = mt__rnn_cpu_chunk_steps(s, T, kn);
        size_t row = d == 0 ? (size_t)nn - 1 : 0;
        const float *hn = l == L - 1 ? io->y + ((size_t)kn * C + row) * B * (size_t)dh
                                     : mt__rnn_cpu_layer_out(s, rn, nn, B, l) + row * B * dh;
        a.hin = hn + (size_t)d * H;
        a.ldh = dh;
        a.cin = s->mode == MT_RNN_LSTM ? mt__rnn_cpu_aux(s, rn, nn, B, p) + row * bh : NULL;
    }
    back_dir(&a);
}

/* The gradient layer l > 0 sent to its input, over steps [t0, t0 + n) of dbuf (at ofs):
 * through the mask, it becomes the gradient of layer l-1's output. */
static void drop_back(const bwd_t *b, int l, size_t t0, int n, size_t ofs)
{
    size_t row = (size_t)b->io->batch * (size_t)b->s->dirs * (size_t)b->s->hidden;
    float *d = b->dbuf[(l - 1) % 2] + ofs;
    mt__rnn_drop_apply(b->s, b->key, l - 1, t0 * row, (size_t)n * row, d, d);
}

int mt__rnn_cpu_backward_chunks(const mt__rnn_shape_t *s, const float *w, float *dw,
                                const mt_rnn_io_t *io, uint64_t key, const mt__rnn_chunks_t *chunks,
                                const mt_rnn_grad_io_t *g, float *work)
{
    int T = io->seq_len, B = io->batch, H = s->hidden, D = s->dirs, L = s->layers;
    int gh = s->gates * H, dh = D * H, K = mt__rnn_cpu_nchunks(s, T);
    int C = T < mt__rnn_cpu_chunk_len(s) ? T : mt__rnn_cpu_chunk_len(s);
    size_t bh = (size_t)B * H, nstate = (size_t)L * (size_t)D * bh;
    bool gates_in_reserve = s->mode == MT_RNN_LSTM || s->mode == MT_RNN_GRU;

    bwd_t b = {.s = s, .w = w, .dw = dw, .io = io, .g = g, .key = key};
    b.dhn = work;
    b.dcn = b.dhn + nstate;
    b.zeros = b.dcn + nstate;
    b.dgh = b.zeros + bh;
    b.rbuf = b.dgh + (size_t)B * gh;
    float *next = gates_in_reserve ? b.rbuf : b.rbuf + (size_t)C * B * gh;
    if (L > 1) {
        b.dbuf[0] = next;
        b.dbuf[1] = b.dbuf[0] + (size_t)(D == 1 ? C : T) * B * dh;
    }
    if (mt__rnn_drop_on(s))
        b.xdrop = b.dbuf[1] + (size_t)(D == 1 ? C : T) * B * dh;
    memset(b.zeros, 0, bh * sizeof(float));
    if (g->dhy)
        memcpy(b.dhn, g->dhy, nstate * sizeof(float));
    else
        memset(b.dhn, 0, nstate * sizeof(float));
    if (g->dcy && s->mode == MT_RNN_LSTM)
        memcpy(b.dcn, g->dcy, nstate * sizeof(float));
    else
        memset(b.dcn, 0, nstate * sizeof(float));

    int rc = 0;
    if (D == 1) {
        /* Chunk-major, last chunk first; chunk k also reads chunk k-1's last step. */
        for (int k = K - 1; k >= 0 && rc == 0; k--) {
            float *r = NULL, *rp = NULL;
            rc = chunks->bwd_get(chunks->ud, k, &r);
            if (rc == 0 && k > 0)
                rc = chunks->bwd_get(chunks->ud, k - 1, &rp);
            for (int l = L - 1; l >= 0 && rc == 0; l--) {
                back_chunk(&b, l, 0, k, r, rp);
                if (l > 0 && b.xdrop)
                    drop_back(&b, l, (size_t)k * (size_t)C, mt__rnn_cpu_chunk_steps(s, T, k), 0);
            }
            if (rc == 0)
                rc = chunks->bwd_done(chunks->ud, k);
        }
    } else {
        float **r = calloc((size_t)K, sizeof *r);
        if (!r)
            return MT_ENOMEM;
        for (int k = K - 1; k >= 0 && rc == 0; k--)
            rc = chunks->bwd_get(chunks->ud, k, &r[k]);
        for (int l = L - 1; l >= 0 && rc == 0; l--) {
            for (int d = 0; d < D; d++)
                for (int i = 0; i < K; i++) {
                    int k = d == 0 ? K - 1 - i : i, kn = d == 0 ? k - 1 : k + 1;
                    back_chunk(&b, l, d, k, r[k], kn >= 0 && kn < K ? r[kn] : NULL);
                }
            /* Both directions have added their part of the input gradient: mask it. */
            if (l > 0 && b.xdrop)
                drop_back(&b, l, 0, T, 0);
        }
        for (int k = K - 1; k >= 0 && rc == 0; k--)
            rc = chunks->bwd_done(chunks->ud, k);
        free(r);
    }
    if (rc)
        return rc;
    if (g->dhx)
        memcpy(g->dhx, b.dhn, nstate * sizeof(float));
    if (g->dcx && s->mode == MT_RNN_LSTM)
        memcpy(g->dcx, b.dcn, nstate * sizeof(float));
    return 0;
}
