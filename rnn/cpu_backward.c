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
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rnn/internal.h"
#include "util/assert.h"

/* Offset in floats of pseudo-layer p's weight-gradient accumulators in BWD_ACC: dW^T
 * [in, gH] then dR^T [H, gH] per pseudo-layer. The libraries run X^T G faster than G^T X, so
 * the gradients are summed transposed over every chunk and added to dw once (acc_flush). */
static size_t acc_offset(const mt__rnn_shape_t *s, int p)
{
    size_t gl = (size_t)mt__rnn_cpu_gld(s), n = 0;
    for (int i = 0; i < p; i++)
        n += (size_t)(mt__rnn_layer_in(s, i / s->dirs) + s->hidden) * gl;
    return n;
}

/* The widest row stride of the xh buffer: ld(in + H) of the widest layer input
 * (docs/rnn-cpu.md, Row strides). */
static int xh_ld(const mt__rnn_shape_t *s)
{
    int in = mt__rnn_layer_in(s, 0), up = mt__rnn_layer_in(s, s->layers - 1);
    return mt__rnn_cpu_ld((in > up ? in : up) + s->hidden);
}

/* Floats of W's panels for the input gradient beside the weight gradients: at two or more
 * threads with libxsmm, the widest layer input's gH x in; else 0 (the panels go in xh). */
static size_t wpan_floats(const mt__rnn_shape_t *s)
{
    int in = mt__rnn_layer_in(s, 0), up = mt__rnn_layer_in(s, s->layers - 1);
    if (!s->xsmm || s->threads < 2)
        return 0;
    return (size_t)s->gates * (size_t)s->hidden * (size_t)(in > up ? in : up);
}

/* The backward workspace, in floats (docs/rnn-cpu.md, Workspace layouts). BWD_ACC: the
 * weight-gradient accumulators (acc_offset); BWD_XH: xh [rows of a chunk, xh_ld]; BWD_DH,
 * BWD_DC: the carried dh and dc [L*D, B, H]; BWD_ZEROS: [B, H]; BWD_DGH: [B, gH]; BWD_DBIAS:
 * the bias-gradient sums of the step loops' parts [max(2, parts), gH + H] (one row per sequence
 * goes in xh, back_dir); BWD_GATES: the RNN modes' gate gradients [rows of a chunk, gH] (LSTM and
 * GRU write theirs over the reserve's gates); BWD_D0, BWD_D1: the gradient between layers
 * (L > 1), of a chunk's rows (unidirectional) or of all rows (bidirectional), D*H wide;
 * BWD_DROP: the regenerated dropped input of the layer being differentiated (dropout)
 * [rows of a chunk, D*H]; BWD_WPAN: W's panels (wpan_floats). */
enum {
    BWD_ACC,
    BWD_XH,
    BWD_DH,
    BWD_DC,
    BWD_ZEROS,
    BWD_DGH,
    BWD_DBIAS,
    BWD_GATES,
    BWD_D0,
    BWD_D1,
    BWD_DROP,
    BWD_WPAN,
    BWD_NREG
};

typedef struct bwd_layout_s {
    mt__rnn_region_t reg[BWD_NREG];
    size_t total; /* floats */
} bwd_layout_t;

static bwd_layout_t bwd_layout(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q)
{
    size_t c = mt__rnn_cpu_max_chunk_rows(s, q);
    size_t b = (size_t)q->B, h = (size_t)s->hidden, gl = (size_t)mt__rnn_cpu_gld(s);
    size_t ld = (size_t)s->layers * (size_t)s->dirs, dh = (size_t)s->dirs * h;
    size_t drows = s->layers > 1 ? (s->dirs == 1 ? c : q->rows) : 0;
    bool gates_in_reserve = mt__rnn_cpu_keeps_gates(s);
    bwd_layout_t y = {.total = 0};
    y.reg[BWD_ACC] = mt__rnn_place(&y.total, acc_offset(s, s->layers * s->dirs), 1);
    y.reg[BWD_XH] = mt__rnn_place(&y.total, c * (size_t)xh_ld(s), 1);
    y.reg[BWD_DH] = mt__rnn_place(&y.total, ld * b * h, 1);
    y.reg[BWD_DC] = mt__rnn_place(&y.total, ld * b * h, 1);
    y.reg[BWD_ZEROS] = mt__rnn_place(&y.total, b * h, 1);
    y.reg[BWD_DGH] = mt__rnn_place(&y.total, b * gl, 1);
    size_t parts = mt__rnn_par_parts(s) > 2 ? (size_t)mt__rnn_par_parts(s) : 2;
    y.reg[BWD_DBIAS] = mt__rnn_place(&y.total, parts * ((size_t)s->gates + 1) * h, 1);
    y.reg[BWD_GATES] = mt__rnn_place(&y.total, gates_in_reserve ? 0 : c * gl, 1);
    y.reg[BWD_D0] = mt__rnn_place(&y.total, drows * dh, 1);
    y.reg[BWD_D1] = mt__rnn_place(&y.total, drows * dh, 1);
    y.reg[BWD_DROP] = mt__rnn_place(&y.total, mt__rnn_drop_on(s) ? c * dh : 0, 1);
    y.reg[BWD_WPAN] = mt__rnn_place(&y.total, wpan_floats(s), 1);
    mt_assert(mt__rnn_regions_valid(y.reg, BWD_NREG, y.total, 1));
    return y;
}

/* Region i of the workspace at work, or NULL where the layout has none. */
static float *bwd_region(const bwd_layout_t *y, float *work, int i)
{
    return y->reg[i].size ? work + y->reg[i].off : NULL;
}

size_t mt__rnn_cpu_bwd_work_floats(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q)
{
    return bwd_layout(s, q).total;
}

/* One layer and direction over one chunk (chunk-local pointers, rows as in the seq). */
typedef struct dir_back_s {
    const mt__rnn_shape_t *s;
    const mt__rnn_seq_t *q;
    mt__rnn_mats_t w, dw;
    float *accw, *accr; /* dW^T [in, gH], dR^T [H, gH] */
    int t0, T;          /* the chunk's first step and its steps */
    size_t rows;        /* its rows */
    int in;             /* input width */
    const float *x;     /* layer input [rows, in] */
    const float *out;   /* layer output, this direction's columns, row stride ldo */
    int ldo;
    /* The neighbouring chunk's step that precedes the chunk's first processed step (row
     * stride ldh for h, H for c), NULL if none; and the initial states (hx, cx of this layer
     * and direction, row b at b*H), NULL = zeros. */
    const float *hin;
    int ldh;
    const float *cin;
    const float *h0, *c0;
    float *g;          /* [rows, gH]: gates in, pre-activation gradients out */
    float *aux;        /* [rows, H] (LSTM c, GRU R_n h + b_Rn -> r * dn) or NULL */
    const float *dout; /* gradient of out, same strides as out */
    float *din;        /* [rows, in] or NULL */
    float din_beta;    /* 0 for the first direction, 1 to add the second */
    float *dhn, *dcn;  /* carried dh, dc [B, H] of this layer and direction */
    float *zeros, *dgh;
    /* The bias gradients summed by the step loops, rows of [gH + H]: what b_W gets, then
     * GRU's n-gate part of b_R (r * dn). Sequence b adds into db + b * dbst: one row per
     * sequence (dbst = gH + H), so that the sums do not depend on where the loops split the
     * batch, or one per part (dbst = 0, db the part's row; back_steps picks it). */
    float *db;
    size_t dbst;
    /* The step loops' parts (mt__rnn_cpu_parts): with dbst = 0, part i sums into row i. */
    int np;
    int bound[MT__RNN_PARTS_MAX + 1];
    /* [rows, in + H] (gather_xh), rows xh_ld apart: each row of the chunk's input beside
     * the state its step started from, the A operand of [dW^T; dR^T]. */
    float *xh;
    int xld;
    size_t xh_cap; /* floats of xh */
    /* R [gH, H] packed for libxsmm (s->xsmm), in xh while the step loops run (xh is
     * gathered after them), or NULL: the dh products read R in place. */
    const float *rp;
    /* At two or more threads with libxsmm (wpan_floats): room for W [gH, in] in panels, so the
     * input gradient's tiles can run beside the weight gradients, or NULL. */
    float *wpan;
    bool reverse;
} dir_back_t;

static size_t brow(const dir_back_t *a, int t)
{
    return a->q->off[a->t0 + t] - a->q->off[a->t0];
}

/* The state before step t (chunk-local) of each running sequence: rows b < split from the
 * previous step of the direction (h at hp + b*ldh, c at cp + b*H); the others (at the
 * sequence's start) from the initial states h0/c0, or zeros. */
typedef struct bprev_s {
    int split;
    const float *hp, *cp;
    int ldh;
    const float *h0, *c0;
} bprev_t;

static bprev_t prev_of(const dir_back_t *a, int t)
{
    const int *bs = a->q->bs;
    int tg = a->t0 + t, H = a->s->hidden;
    bprev_t p = {0, NULL, NULL, H, a->h0 ? a->h0 : a->zeros, a->c0 ? a->c0 : a->zeros};
    bool first = a->reverse ? t == a->T - 1 : t == 0;
    int tp = a->reverse ? t + 1 : t - 1;
    p.split = a->reverse ? bs[tg + 1] : bs[tg];
    if (!first) {
        p.hp = a->out + brow(a, tp) * (size_t)a->ldo;
        p.ldh = a->ldo;
        p.cp = a->aux ? a->aux + brow(a, tp) * (size_t)H : NULL;
    } else if (a->hin) {
        p.hp = a->hin;
        p.ldh = a->ldh;
        p.cp = a->cin;
    } else {
        p.split = 0; /* the sequence's first step in this direction */
    }
    return p;
}

static const float *bprev_h(const bprev_t *p, int b, int H)
{
    return b < p->split ? p->hp + (size_t)b * p->ldh : p->h0 + (size_t)b * H;
}

static const float *bprev_c(const bprev_t *p, int b, int H)
{
    return b < p->split ? p->cp + (size_t)b * H : p->c0 + (size_t)b * H;
}

/* dh[n, H] = X[n, K] R[K, H] + beta dh: the dh a step sends to its previous step, from the
 * gate gradients (K = gH; GRU: its n gate's scaled by r). */
static void dh_product(const dir_back_t *a, int n, const float *X, int ldx, int K, float beta,
                       float *dh)
{
    int H = a->s->hidden;
    if (a->rp)
        mt__rnn_xsmm_mm(n, H, K, X, ldx, a->rp, beta, dh, H);
    else
        mt__rnn_sgemm(a->s->gemm, false, false, n, H, K, 1.0f, X, ldx, a->w.r, H, beta, dh, H);
}

MT__RNN_ISA_BODY void lstm_step_body(const dir_back_t *a, int t, const bprev_t *pv, int b0, int B,
                                     float *dbs)
{
    int H = a->s->hidden, gh = 4 * H, gl = mt__rnn_cpu_gld(a->s);
    size_t r = brow(a, t);
    const float *ct = a->aux + r * H;
    float *g = a->g + r * gl;
    const float *dout = a->dout + r * a->ldo;
    for (int b = b0; b < B; b++) {
        float *gb = g + (size_t)b * gl, *db = dbs + (size_t)b * a->dbst;
        const float *cp = bprev_c(pv, b, H);
#pragma omp simd
        for (int j = 0; j < H; j++) {
            size_t k = (size_t)b * H + j;
            float dh = dout[(size_t)b * a->ldo + j] + a->dhn[k];
            float ii = gb[j], ff = gb[H + j], gg = gb[2 * H + j], oo = gb[3 * H + j];
            float tc = mt__rnn_tanh(ct[k]);
            float dc = a->dcn[k] + dh * oo * (1.0f - tc * tc);
            float d_o = dh * tc;
            a->dcn[k] = dc * ff;
            float di = dc * gg * ii * (1.0f - ii), df = dc * cp[j] * ff * (1.0f - ff);
            float dg = dc * ii * (1.0f - gg * gg), dop = d_o * oo * (1.0f - oo);
            gb[j] = di;
            gb[H + j] = df;
            gb[2 * H + j] = dg;
            gb[3 * H + j] = dop;
            db[j] += di;
            db[H + j] += df;
            db[2 * H + j] += dg;
            db[3 * H + j] += dop;
        }
    }
    dh_product(a, B - b0, g + (size_t)b0 * gl, gl, gh, 0.0f, a->dhn + (size_t)b0 * H);
}
MT__RNN_ISA_DISPATCH(lstm_step,
                     (const dir_back_t *a, int t, const bprev_t *pv, int b0, int B, float *dbs),
                     (a, t, pv, b0, B, dbs))

MT__RNN_ISA_BODY void gru_step_body(const dir_back_t *a, int t, const bprev_t *pv, int b0, int B,
                                    float *dbs)
{
    int H = a->s->hidden, gh = 3 * H, gl = mt__rnn_cpu_gld(a->s);
    size_t r = brow(a, t);
    float *g = a->g + r * gl;
    float *aux = a->aux + r * H;
    const float *dout = a->dout + r * a->ldo;
    for (int b = b0; b < B; b++) {
        float *gb = g + (size_t)b * gl, *db = dbs + (size_t)b * a->dbst;
        float *dg = a->dgh + (size_t)b * gl;
        const float *hp = bprev_h(pv, b, H);
#pragma omp simd
        for (int j = 0; j < H; j++) {
            size_t k = (size_t)b * H + j;
            float dh = dout[(size_t)b * a->ldo + j] + a->dhn[k];
            float rr = gb[j], zz = gb[H + j], nn = gb[2 * H + j], rn = aux[k];
            float dnp = dh * (1.0f - zz) * (1.0f - nn * nn);
            float drp = dnp * rn * rr * (1.0f - rr);
            float dzp = dh * (hp[j] - nn) * zz * (1.0f - zz);
            a->dhn[k] = dh * zz;
            gb[j] = drp;
            gb[H + j] = dzp;
            gb[2 * H + j] = dnp;
            aux[k] = dnp * rr;
            dg[j] = drp;
            dg[H + j] = dzp;
            dg[2 * H + j] = dnp * rr;
            db[j] += drp;
            db[H + j] += dzp;
            db[2 * H + j] += dnp;
            db[3 * H + j] += dnp * rr;
        }
    }
    dh_product(a, B - b0, a->dgh + (size_t)b0 * gl, gl, gh, 1.0f, a->dhn + (size_t)b0 * H);
}
MT__RNN_ISA_DISPATCH(gru_step,
                     (const dir_back_t *a, int t, const bprev_t *pv, int b0, int B, float *dbs),
                     (a, t, pv, b0, B, dbs))

MT__RNN_ISA_BODY void rnn_step_body(const dir_back_t *a, int t, int b0, int B, float *dbs)
{
    int H = a->s->hidden, gl = mt__rnn_cpu_gld(a->s);
    bool relu = a->s->mode == MT_RNN_RELU;
    size_t r = brow(a, t);
    float *g = a->g + r * gl;
    const float *o = a->out + r * a->ldo;
    const float *dout = a->dout + r * a->ldo;
    for (int b = b0; b < B; b++) {
        float *gb = g + (size_t)b * gl, *db = dbs + (size_t)b * a->dbst;
#pragma omp simd
        for (int j = 0; j < H; j++) {
            size_t k = (size_t)b * H + j;
            float dh = dout[(size_t)b * a->ldo + j] + a->dhn[k];
            float hv = o[(size_t)b * a->ldo + j];
            float v = relu ? (hv > 0.0f ? dh : 0.0f) : dh * (1.0f - hv * hv);
            gb[j] = v;
            db[j] += v;
        }
    }
    dh_product(a, B - b0, g + (size_t)b0 * gl, gl, H, 0.0f, a->dhn + (size_t)b0 * H);
}
MT__RNN_ISA_DISPATCH(rnn_step, (const dir_back_t *a, int t, int b0, int B, float *dbs),
                     (a, t, b0, B, dbs))

/* GRU's dR^T += Hs^T Gs over the chunk's n rows: its n gate's columns come from aux
 * (r * dn). */
static void gru_recurrent_grad(const dir_back_t *a, const float *hs, int ldh, int n)
{
    int H = a->s->hidden, gl = mt__rnn_cpu_gld(a->s);
    if (n <= 0)
        return;
    mt__rnn_sgemm_par(a->s, true, false, H, 2 * H, n, 1.0f, hs, ldh, a->g, gl, 1.0f, a->accr, gl);
    mt__rnn_sgemm_par(a->s, true, false, H, H, n, 1.0f, hs, ldh, a->aux, H, 1.0f,
                      a->accr + (size_t)2 * H, gl);
}

/* xh, rows of sequences [b0, b1) at every step: the row's input x, then the state its step
 * started from (mt__rnn_parts_par: each part gathers its own). */
static void gather_xh(void *arg, int b0, int b1)
{
    const dir_back_t *a = arg;
    int H = a->s->hidden, in = a->in;
    for (int t = 0; t < a->T; t++) {
        bprev_t pv = prev_of(a, t);
        int nb = a->q->bs[a->t0 + t], e = b1 < nb ? b1 : nb;
        size_t r = brow(a, t);
        for (int b = b0; b < e; b++) {
            float *d = a->xh + (r + (size_t)b) * (size_t)a->xld;
            memcpy(d, a->x + (r + (size_t)b) * (size_t)in, (size_t)in * sizeof(float));
            memcpy(d + in, bprev_h(&pv, b, H), (size_t)H * sizeof(float));
        }
    }
}

/* The chunk's steps, in reverse of forward's order, for the sequences b0 <= b < b1
 * (mt__rnn_rows_par): the gate gradients and the dh each sends to its previous step. */
static void back_steps(void *arg, int b0, int b1)
{
    const dir_back_t *a = arg;
    const mt__rnn_shape_t *s = a->s;
    size_t dbl = (size_t)(s->gates + 1) * (size_t)s->hidden;
    int part = 0;
    while (part + 1 < a->np && a->bound[part + 1] <= b0)
        part++;
    float *db = a->dbst ? a->db : a->db + (size_t)part * dbl;
    for (int k = 0; k < a->T; k++) {
        int t = a->reverse ? k : a->T - 1 - k, nb = a->q->bs[a->t0 + t];
        int e = b1 < nb ? b1 : nb;
        if (e <= b0)
            continue;
        bprev_t pv = prev_of(a, t);
        if (s->mode == MT_RNN_LSTM)
            lstm_step(a, t, &pv, b0, e, db);
        else if (s->mode == MT_RNN_GRU)
            gru_step(a, t, &pv, b0, e, db);
        else
            rnn_step(a, t, b0, e, db);
    }
}

/* The weight gradients' two halves (tiles 0 and 1, mt__rnn_sgemm_half)
 * and the input gradient's 32-row tiles, in one job whose tiles both threads take in turn:
 * a thread that ends its tile takes input-gradient tiles while another ends its own. */
typedef struct wdx_s {
    const dir_back_t *a;
    int wm; /* rows of the weight-gradient product */
} wdx_t;

static void wdx_tile(void *arg, int i)
{
    const wdx_t *j = arg;
    const dir_back_t *a = j->a;
    int gh = a->s->gates * a->s->hidden, gl = mt__rnn_cpu_gld(a->s), tb = (int)a->rows;
    if (i < 2) {
        mt__rnn_sgemm_half(a->s, i, true, false, j->wm, gh, tb, 1.0f, a->xh, a->xld, a->g, gl, 1.0f,
                           a->accw, gl);
        return;
    }
    mt__rnn_xsmm_mm_tile(i - 2, tb, a->in, gh, a->g, gl, a->wpan, a->din_beta, a->din, a->in);
}

static void weights_and_dx(const dir_back_t *a, int wm)
{
    wdx_t j = {a, wm};
    mt__rnn_tiles_par(a->s, 2 + mt__rnn_xsmm_tiles((int)a->rows), wdx_tile, &j);
}

static void back_dir(const dir_back_t *a)
{
    const mt__rnn_shape_t *s = a->s;
    int H = s->hidden, gh = s->gates * H, gl = mt__rnn_cpu_gld(s), T = a->T, B = a->q->B;
    size_t tb = a->rows, dbl = (size_t)(gh + H), rpn = 0;

    /* xh is free until the steps are done: it holds R's panels meanwhile, when they fit, and
     * after them the sequences' bias sums, when those fit too (docs/rnn-cpu.md, Workspace
     * layouts). */
    dir_back_t run = *a;
    if (s->xsmm && (size_t)gh * (size_t)H <= a->xh_cap) {
        mt__rnn_xsmm_pack_par(s, a->xh, a->w.r, H, 1, gh, H);
        run.rp = a->xh;
        rpn = (size_t)gh * (size_t)H;
    }
    /* With the dh products on libxsmm and a row of sums per sequence, the cut changes no
     * result, so it may follow the threads' speeds (as forward's run_dir); else fixed parts,
     * each with its row of sums in BWD_DBIAS (docs/rnn-cpu.md, Threads). */
    bool per_seq = run.rp && rpn + (size_t)B * dbl <= a->xh_cap;
    run.db = per_seq ? a->xh + rpn : a->db;
    run.dbst = per_seq ? dbl : 0;
    double w[MT__RNN_PARTS_MAX], f = per_seq ? mt__rnn_par_share() : 0.5;
    run.np = mt__rnn_cpu_parts(s, a->q, a->t0, T, f, run.bound, w);
    size_t nsum = per_seq ? (size_t)B : (size_t)run.np;
    memset(run.db, 0, nsum * dbl * sizeof(float));
    mt__rnn_parts_par(s, run.bound, run.np, w, back_steps, &run);
    if (a->dw.bw) {
        /* The rows of sums in their order, into the first (now, before xh is reused); b_W
         * and b_R enter the same sum, so their gradients are equal, except GRU's n gate,
         * whose b_R sits inside r * (R_n h + b_Rn). */
        float *d = run.db;
        for (size_t r = 1; r < nsum; r++)
            for (size_t j = 0; j < dbl; j++)
                d[j] += d[r * dbl + j];
        int fold = s->mode == MT_RNN_GRU ? 2 * H : gh;
        for (int j = 0; j < gh; j++) {
            a->dw.bw[j] += d[j];
            if (j < fold)
                a->dw.br[j] += d[j];
        }
        for (int j = fold; j < gh; j++)
            a->dw.br[j] += d[gh + j - fold];
    }
    /* The input gradient on libxsmm: at two or more threads, W's panels in wpan and its tiles in
     * the weight gradients' job (below); else, while xh is still free for W's panels, in tiles
     * taken in turn, before the gather. */
    bool dx_done = false, dx_beside = a->din && a->wpan;
    if (dx_beside) {
        mt__rnn_xsmm_pack_par(s, a->wpan, a->w.w, a->in, 1, gh, a->in);
    } else if (a->din && s->xsmm && (size_t)gh * (size_t)a->in <= a->xh_cap) {
        mt__rnn_xsmm_pack_par(s, a->xh, a->w.w, a->in, 1, gh, a->in);
        mt__rnn_xsmm_mm_par(s, (int)tb, a->in, gh, a->g, gl, a->xh, a->din_beta, a->din, a->in);
        dx_done = true;
    }
    mt__rnn_parts_par(s, run.bound, run.np, NULL, gather_xh, (void *)a);

    /* Weight gradients merged over the chunk's steps, dW and dR in one product: each row of
     * G beside its input and the state its step started from (gathered: the step before,
     * the neighbouring chunk, hx or zeros; packed batches would otherwise make one small
     * product per step), and accw, accr are one [in + H, gH] matrix. GRU's n gate takes
     * another right-hand side for dR (r * dn). */
    int wm = s->mode == MT_RNN_GRU ? a->in : a->in + H;
    if (dx_beside) {
        weights_and_dx(a, wm);
        dx_done = true;
    } else {
        mt__rnn_sgemm_par(s, true, false, wm, gh, (int)tb, 1.0f, a->xh, a->xld, a->g, gl, 1.0f,
                          a->accw, gl);
    }
    if (s->mode == MT_RNN_GRU)
        gru_recurrent_grad(a, a->xh + a->in, a->xld, (int)tb);
    if (a->din && !dx_done)
        mt__rnn_sgemm_par(a->s, false, false, (int)tb, a->in, gh, 1.0f, a->g, gl, a->w.w, a->in,
                          a->din_beta, a->din, a->in);
}

typedef struct bwd_s {
    const mt__rnn_shape_t *s;
    const mt__rnn_seq_t *q;
    const float *w;
    float *dw;
    const mt_rnn_io_t *io;
    const mt_rnn_grad_io_t *g;
    float *acc; /* acc_offset */
    float *xh;
    size_t xh_cap; /* floats of xh */
    float *dhn, *dcn, *zeros, *dgh, *dbias, *rbuf;
    float *dbuf[2]; /* L > 1 */
    uint64_t key;   /* dropout: forward's key */
    float *xdrop;   /* dropout: layer l > 0's input, regenerated per chunk */
    float *wpan;    /* wpan_floats, or NULL */
} bwd_t;

/* Layer l, direction d over chunk k (reserve r); rn is the reserve of the neighbouring
 * chunk whose step enters this one (k-1 forward, k+1 reverse), NULL if there is none. */
static void back_chunk(const bwd_t *b, int l, int d, int k, float *r, float *rn)
{
    const mt__rnn_shape_t *s = b->s;
    const mt__rnn_seq_t *q = b->q;
    const mt_rnn_io_t *io = b->io;
    const mt_rnn_grad_io_t *g = b->g;
    int T = q->T, B = q->B, H = s->hidden, D = s->dirs, L = s->layers;
    int dh = D * H, K = mt__rnn_cpu_nchunks(s, T);
    int n = mt__rnn_cpu_chunk_steps(s, T, k), p = l * D + d;
    bool gates_in_reserve = mt__rnn_cpu_keeps_gates(s);
    size_t bh = (size_t)B * H, so = (size_t)p * bh;
    size_t row0 = mt__rnn_cpu_chunk_row0(s, q, k), nb = mt__rnn_cpu_chunk_rows(s, q, k);
    size_t ofs = D == 1 ? 0 : row0 * (size_t)dh; /* into dbuf */
    const float *in =
        l == 0 ? io->x + row0 * (size_t)s->input : mt__rnn_cpu_layer_out(s, r, nb, l - 1);
    if (l > 0 && b->xdrop) {
        /* The weight gradient needs the input forward used: the mask applied again. */
        mt__rnn_drop_apply(s, b->key, l - 1, row0 * (size_t)dh, nb * (size_t)dh, in, b->xdrop);
        in = b->xdrop;
    }
    const float *out = l == L - 1 ? io->y + row0 * (size_t)dh : mt__rnn_cpu_layer_out(s, r, nb, l);
    const float *dout = l == L - 1 ? g->dy + row0 * (size_t)dh : b->dbuf[l % 2] + ofs;
    float *din = l > 0   ? b->dbuf[(l - 1) % 2] + ofs
                 : g->dx ? g->dx + row0 * (size_t)s->input
                         : NULL;
    dir_back_t a = {
        .s = s,
        .q = q,
        .w = mt__rnn_mats(s, (float *)b->w, l, d),
        .dw = mt__rnn_mats(s, b->dw, l, d),
        .accw = b->acc + acc_offset(s, p),
        .accr =
            b->acc + acc_offset(s, p) + (size_t)mt__rnn_layer_in(s, l) * (size_t)mt__rnn_cpu_gld(s),
        .t0 = k * mt__rnn_cpu_chunk_len(s),
        .T = n,
        .rows = nb,
        .in = mt__rnn_layer_in(s, l),
        .x = in,
        .out = out + (size_t)d * H,
        .ldo = dh,
        .hin = NULL,
        .ldh = H,
        .cin = NULL,
        .h0 = io->hx ? io->hx + so : NULL,
        .c0 = io->cx && s->mode == MT_RNN_LSTM ? io->cx + so : NULL,
        .g = gates_in_reserve ? mt__rnn_cpu_gates(s, r, nb, p) : b->rbuf,
        .aux = mt__rnn_cpu_aux(s, r, nb, p),
        .dout = dout + (size_t)d * H,
        .din = din,
        .din_beta = d == 0 ? 0.0f : 1.0f,
        .dhn = b->dhn + so,
        .dcn = b->dcn + so,
        .zeros = b->zeros,
        .dgh = b->dgh,
        .db = b->dbias,
        .xh = b->xh,
        .xld = mt__rnn_cpu_ld(mt__rnn_layer_in(s, l) + H),
        .xh_cap = b->xh_cap,
        .wpan = b->wpan,
        .reverse = d == 1,
    };
    int kn = d == 0 ? k - 1 : k + 1;
    if (kn >= 0 && kn < K) {
        /* The neighbour's step next to this chunk: its last (forward) or first (reverse). */
        size_t nrow0 = mt__rnn_cpu_chunk_row0(s, q, kn), nnb = mt__rnn_cpu_chunk_rows(s, q, kn);
        int tn = d == 0 ? a.t0 - 1 : a.t0 + n;
        size_t row = q->off[tn] - nrow0;
        const float *hn = l == L - 1 ? io->y + q->off[tn] * (size_t)dh
                                     : mt__rnn_cpu_layer_out(s, rn, nnb, l) + row * dh;
        a.hin = hn + (size_t)d * H;
        a.ldh = dh;
        a.cin = s->mode == MT_RNN_LSTM ? mt__rnn_cpu_aux(s, rn, nnb, p) + row * H : NULL;
    }
    back_dir(&a);
}

/* dst[n, m] += src[m, n]^T, row-major with leading dimensions lds and ldd, in tiles. */
static void add_transposed(float *restrict dst, int ldd, const float *restrict src, int lds, int m,
                           int n)
{
    enum { TILE = 32 };
    for (int i0 = 0; i0 < m; i0 += TILE) {
        int i1 = i0 + TILE < m ? i0 + TILE : m;
        for (int j0 = 0; j0 < n; j0 += TILE) {
            int j1 = j0 + TILE < n ? j0 + TILE : n;
            for (int j = j0; j < j1; j++) {
                float *d = dst + (size_t)j * ldd;
                for (int i = i0; i < i1; i++)
                    d[i] += src[(size_t)i * lds + j];
            }
        }
    }
}

/* acc_flush's work in items of 32 rows of an accumulator [in + H, gH] (a tile of 32
 * columns of dw's W and R), pseudo-layer by pseudo-layer: nw of W's, then nr of R's. */
static void flush_tiles(const mt__rnn_shape_t *s, int p, int *nw, int *nr)
{
    *nw = (mt__rnn_layer_in(s, p / s->dirs) + 31) / 32;
    *nr = (s->hidden + 31) / 32;
}

static void flush_items(void *arg, int i0, int i1)
{
    const bwd_t *b = arg;
    const mt__rnn_shape_t *s = b->s;
    int H = s->hidden, gh = s->gates * H, gl = mt__rnn_cpu_gld(s), i = 0;
    for (int p = 0; p < s->layers * s->dirs && i < i1; p++) {
        int in = mt__rnn_layer_in(s, p / s->dirs), nw, nr;
        flush_tiles(s, p, &nw, &nr);
        mt__rnn_mats_t dw = mt__rnn_mats(s, b->dw, p / s->dirs, p % s->dirs);
        const float *accw = b->acc + acc_offset(s, p), *accr = accw + (size_t)in * gl;
        for (int t = 0; t < nw + nr; t++, i++) {
            if (i < i0 || i >= i1)
                continue;
            bool isw = t < nw;
            int r0 = (isw ? t : t - nw) * 32, n = isw ? in : H;
            int m = n - r0 < 32 ? n - r0 : 32;
            const float *src = (isw ? accw : accr) + (size_t)r0 * gl;
            add_transposed((isw ? dw.w : dw.r) + r0, n, src, gl, m, gh);
        }
    }
}

/* dw += the accumulated dW and dR of every pseudo-layer (in even parts). */
static void acc_flush(const bwd_t *b)
{
    const mt__rnn_shape_t *s = b->s;
    int n = 0;
    for (int p = 0; p < s->layers * s->dirs; p++) {
        int nw, nr;
        flush_tiles(s, p, &nw, &nr);
        n += nw + nr;
    }
    mt__rnn_even_par(s, n, flush_items, (void *)b);
}

enum { ZERO_BLOCK = 1024 }; /* floats: zero_acc's unit */

/* Zeroes the accumulators, blocks [k0, k1) of ZERO_BLOCK floats (mt__rnn_rows_par). */
static void zero_acc(void *arg, int k0, int k1)
{
    const bwd_t *b = arg;
    size_t n = acc_offset(b->s, b->s->layers * b->s->dirs);
    size_t a = (size_t)k0 * ZERO_BLOCK, e = (size_t)k1 * ZERO_BLOCK;
    memset(b->acc + a, 0, ((e < n ? e : n) - a) * sizeof(float));
}

/* The gradient layer l > 0 sent to its input, over rows [row0, row0 + nb) of dbuf (at ofs):
 * through the mask, it becomes the gradient of layer l-1's output. */
static void drop_back(const bwd_t *b, int l, size_t row0, size_t nb, size_t ofs)
{
    size_t dh = (size_t)b->s->dirs * (size_t)b->s->hidden;
    float *d = b->dbuf[(l - 1) % 2] + ofs;
    mt__rnn_drop_apply(b->s, b->key, l - 1, row0 * dh, nb * dh, d, d);
}

static int backward_seq(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q, const float *w, float *dw,
                        const mt_rnn_io_t *io, uint64_t key, const mt__rnn_chunks_t *chunks,
                        const mt_rnn_grad_io_t *g, float *work)
{
    int T = q->T, B = q->B, H = s->hidden, D = s->dirs, L = s->layers;
    int K = mt__rnn_cpu_nchunks(s, T);
    size_t bh = (size_t)B * H, nstate = (size_t)L * (size_t)D * bh;

    bwd_t b = {.s = s, .q = q, .w = w, .dw = dw, .io = io, .g = g, .key = key};
    bwd_layout_t y = bwd_layout(s, q);
    b.acc = bwd_region(&y, work, BWD_ACC);
    b.xh = bwd_region(&y, work, BWD_XH);
    b.xh_cap = y.reg[BWD_XH].size;
    b.dhn = bwd_region(&y, work, BWD_DH);
    b.dcn = bwd_region(&y, work, BWD_DC);
    b.zeros = bwd_region(&y, work, BWD_ZEROS);
    b.dgh = bwd_region(&y, work, BWD_DGH);
    b.dbias = bwd_region(&y, work, BWD_DBIAS);
    b.rbuf = bwd_region(&y, work, BWD_GATES);
    b.dbuf[0] = bwd_region(&y, work, BWD_D0);
    b.dbuf[1] = bwd_region(&y, work, BWD_D1);
    b.xdrop = bwd_region(&y, work, BWD_DROP);
    b.wpan = bwd_region(&y, work, BWD_WPAN);
    int nz = (int)((y.reg[BWD_ACC].size + ZERO_BLOCK - 1) / ZERO_BLOCK);
    mt__rnn_even_par(s, nz, zero_acc, &b);
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
                    drop_back(&b, l, mt__rnn_cpu_chunk_row0(s, q, k),
                              mt__rnn_cpu_chunk_rows(s, q, k), 0);
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
                drop_back(&b, l, 0, q->rows, 0);
        }
        for (int k = K - 1; k >= 0 && rc == 0; k--)
            rc = chunks->bwd_done(chunks->ud, k);
        free(r);
    }
    if (rc)
        return rc;
    acc_flush(&b);
    if (g->dhx)
        memcpy(g->dhx, b.dhn, nstate * sizeof(float));
    if (g->dcx && s->mode == MT_RNN_LSTM)
        memcpy(g->dcx, b.dcn, nstate * sizeof(float));
    return 0;
}

int mt__rnn_cpu_backward_chunks(const mt__rnn_shape_t *s, const float *w, float *dw,
                                const mt_rnn_io_t *io, uint64_t key, const mt__rnn_chunks_t *chunks,
                                const mt_rnn_grad_io_t *g, float *work)
{
    mt__rnn_seq_t q;
    int rc = mt__rnn_seq_init(&q, io);
    if (rc)
        return rc;
    rc = backward_seq(s, &q, w, dw, io, key, chunks, g, work);
    mt__rnn_seq_fini(&q);
    return rc;
}
