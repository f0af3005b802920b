/* CPU backward of the RNN engine: data and weight gradients.
 *
 * Layers run top to bottom, each direction in reverse of its forward order. Per step, the
 * elementwise math turns dh (from above plus from the next step) into the gradients of the
 * gate pre-activations, written IN PLACE over the reserve's gates (they are not needed once
 * their step is done), and one sgemm sends dh to the previous step. Weight gradients are then
 * merged over all steps: one sgemm for dW ([gH, T*B] x [T*B, in]), one for dR (GRU: two,
 * because its n gate's recurrent gradient is r * dn), and one for the input gradient. They
 * accumulate into dw, as cuDNN's RNNBackwardWeights does. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "rnn/internal.h"

/* Workspace: dh_next, dc_next, zeros ([B, H] each), dgh [B, gH] (GRU), the RNN modes' gate
 * gradients [T, B, H], and two [T, B, D*H] buffers for the gradient between layers. */
size_t mt__rnn_cpu_bwd_work_floats(const mt__rnn_shape_t *s, int T, int B)
{
    size_t b = (size_t)B, h = (size_t)s->hidden, gh = (size_t)s->gates * h;
    size_t tb = (size_t)T * b;
    size_t n = 3 * b * h + b * gh;
    if (s->mode != MT_RNN_LSTM && s->mode != MT_RNN_GRU)
        n += tb * gh;
    if (s->layers > 1)
        n += 2 * tb * (size_t)s->dirs * h;
    return n;
}

typedef struct dir_back_s {
    const mt__rnn_shape_t *s;
    mt__rnn_mats_t w, dw;
    int T, B, in;
    const float *x;   /* layer input [T, B, in] */
    const float *out; /* layer output, this direction's columns, row stride ldo */
    int ldo;
    const float *h0;   /* [B, H] or NULL */
    const float *c0;   /* [B, H] or NULL */
    float *g;          /* [T, B, gH]: gates in, pre-activation gradients out */
    float *aux;        /* [T, B, H] (LSTM c, GRU R_n h + b_Rn -> r * dn) or NULL */
    const float *dout; /* gradient of out, same strides as out */
    const float *dh0;  /* dhy slice or NULL */
    const float *dc0;
    float *dhx; /* [B, H] or NULL */
    float *dcx;
    float *din;     /* [T, B, in] or NULL */
    float din_beta; /* 0 for the first direction, 1 to add the second */
    float *dhn, *dcn, *zeros, *dgh;
    bool reverse;
} dir_back_t;

static void lstm_step(const dir_back_t *a, int t, bool first, int tp)
{
    int H = a->s->hidden, gh = 4 * H, B = a->B;
    const float *ct = a->aux + (size_t)t * B * H;
    const float *cp = first ? (a->c0 ? a->c0 : a->zeros) : a->aux + (size_t)tp * B * H;
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
    if (a->dh0)
        memcpy(a->dhn, a->dh0, bh * sizeof(float));
    else
        memset(a->dhn, 0, bh * sizeof(float));
    if (a->dc0 && s->mode == MT_RNN_LSTM)
        memcpy(a->dcn, a->dc0, bh * sizeof(float));
    else
        memset(a->dcn, 0, bh * sizeof(float));

    for (int k = 0; k < T; k++) {
        int t = a->reverse ? k : T - 1 - k;
        bool first = a->reverse ? t == T - 1 : t == 0;
        int tp = a->reverse ? t + 1 : t - 1;
        if (s->mode == MT_RNN_LSTM) {
            lstm_step(a, t, first, tp);
        } else if (s->mode == MT_RNN_GRU) {
            const float *hp = a->h0 ? a->h0 : a->zeros;
            int ldh = H;
            if (!first) {
                hp = a->out + (size_t)tp * B * a->ldo;
                ldh = a->ldo;
            }
            gru_step(a, t, hp, ldh);
        } else {
            rnn_step(a, t);
        }
    }
    if (a->dhx)
        memcpy(a->dhx, a->dhn, bh * sizeof(float));
    if (a->dcx && s->mode == MT_RNN_LSTM)
        memcpy(a->dcx, a->dcn, bh * sizeof(float));

    /* Merged weight gradients over all steps. */
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
    if (a->h0) {
        int tf = a->reverse ? T - 1 : 0;
        const float *as = a->aux ? a->aux + (size_t)tf * bh : NULL;
        recurrent_grad(a, a->g + (size_t)tf * bh * s->gates, as, a->h0, H, B);
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

int mt__rnn_cpu_backward(const mt__rnn_shape_t *s, const float *w, float *dw, const mt_rnn_io_t *io,
                         float *reserve, const mt_rnn_grad_io_t *g, float *work)
{
    int T = io->seq_len, B = io->batch, H = s->hidden, D = s->dirs, L = s->layers;
    int gh = s->gates * H, dh = D * H;
    size_t bh = (size_t)B * H, tb = (size_t)T * B;
    bool gates_in_reserve = s->mode == MT_RNN_LSTM || s->mode == MT_RNN_GRU;

    float *dhn = work, *dcn = dhn + bh, *zeros = dcn + bh, *dgh = zeros + bh;
    float *rbuf = dgh + (size_t)B * gh;
    float *dbuf[2] = {NULL, NULL};
    float *next = gates_in_reserve ? rbuf : rbuf + tb * gh;
    if (L > 1) {
        dbuf[0] = next;
        dbuf[1] = dbuf[0] + tb * dh;
    }
    memset(zeros, 0, bh * sizeof(float));

    for (int l = L - 1; l >= 0; l--) {
        const float *in = l == 0 ? io->x : mt__rnn_cpu_layer_out(s, reserve, T, B, l - 1);
        const float *out = l == L - 1 ? io->y : mt__rnn_cpu_layer_out(s, reserve, T, B, l);
        const float *dout = l == L - 1 ? g->dy : dbuf[l % 2];
        float *din = l == 0 ? g->dx : dbuf[(l - 1) % 2];
        for (int d = 0; d < D; d++) {
            int p = l * D + d;
            size_t so = (size_t)p * bh;
            dir_back_t a = {
                .s = s,
                .w = mt__rnn_mats(s, (float *)w, l, d),
                .dw = mt__rnn_mats(s, dw, l, d),
                .T = T,
                .B = B,
                .in = mt__rnn_layer_in(s, l),
                .x = in,
                .out = out + (size_t)d * H,
                .ldo = dh,
                .h0 = io->hx ? io->hx + so : NULL,
                .c0 = io->cx && s->mode == MT_RNN_LSTM ? io->cx + so : NULL,
                .g = gates_in_reserve ? mt__rnn_cpu_gates(s, reserve, T, B, p) : rbuf,
                .aux = mt__rnn_cpu_aux(s, reserve, T, B, p),
                .dout = dout + (size_t)d * H,
                .dh0 = g->dhy ? g->dhy + so : NULL,
                .dc0 = g->dcy ? g->dcy + so : NULL,
                .dhx = g->dhx ? g->dhx + so : NULL,
                .dcx = g->dcx ? g->dcx + so : NULL,
                .din = din,
                .din_beta = d == 0 ? 0.0f : 1.0f,
                .dhn = dhn,
                .dcn = dcn,
                .zeros = zeros,
                .dgh = dgh,
                .reverse = d == 1,
            };
            back_dir(&a);
        }
    }
    return 0;
}
