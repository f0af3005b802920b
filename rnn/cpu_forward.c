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
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "rnn/internal.h"
#include "util/assert.h"

/* ---- workspace ---- */

/* The input projection runs on libxsmm over W^T's panels at two or more threads, in tiles
 * any thread may take. At one thread the library's product is as fast, and the panels would
 * be a copy of W in the workspace for nothing (docs/rnn-cpu.md, Workspace layouts). */
static bool wt_panels(const mt__rnn_shape_t *s)
{
    return s->xsmm && s->threads >= 2;
}

/* Offset in floats of pseudo-layer p's W^T panels inside the FWD_WT region (p = L*D: the
 * region's size). */
static size_t wt_offset(const mt__rnn_shape_t *s, int p)
{
    size_t gh = (size_t)s->gates * (size_t)s->hidden, n = 0;
    for (int i = 0; wt_panels(s) && i < p; i++)
        n += (size_t)mt__rnn_layer_in(s, i / s->dirs) * gh;
    return n;
}

/* The forward workspace, in floats (docs/rnn-cpu.md, Workspace layouts). FWD_RT: per
 * pseudo-layer, R transposed [H, gH] (libxsmm: packed in panels, in H*gH of its floats) and
 * the input projection's folded bias [gH], rows gld apart; FWD_WT: W^T [in, gH] of each
 * pseudo-layer in panels (wt_panels); FWD_REC: the recurrent product [B, gH]; FWD_H, FWD_C:
 * the carried states [L*D, B, H]; FWD_GATES: the gate buffer [rows of a chunk, gH]
 * (inference, or the RNN modes in training, whose gates the reserve does not keep);
 * FWD_L0, FWD_L1: the layer buffers of inference with L > 1, of a chunk's rows
 * (unidirectional) or of all rows (bidirectional), D*H wide; FWD_DROP: the dropped input of
 * the layer being run in training with dropout [rows of a chunk, D*H]. */
enum { FWD_RT, FWD_WT, FWD_REC, FWD_H, FWD_C, FWD_GATES, FWD_L0, FWD_L1, FWD_DROP, FWD_NREG };

typedef struct fwd_layout_s {
    mt__rnn_region_t reg[FWD_NREG];
    size_t total; /* floats */
} fwd_layout_t;

static fwd_layout_t fwd_layout(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q, bool training)
{
    size_t c = mt__rnn_cpu_max_chunk_rows(s, q);
    size_t b = (size_t)q->B, h = (size_t)s->hidden, gl = (size_t)mt__rnn_cpu_gld(s);
    size_t ld = (size_t)s->layers * (size_t)s->dirs, dh = (size_t)s->dirs * h;
    size_t lrows = s->dirs == 1 ? c : q->rows;
    bool lbufs = !training && s->layers > 1;
    fwd_layout_t y = {.total = 0};
    y.reg[FWD_RT] = mt__rnn_place(&y.total, ld * (h + 1) * gl, 1);
    y.reg[FWD_WT] = mt__rnn_place(&y.total, wt_offset(s, s->layers * s->dirs), 1);
    y.reg[FWD_REC] = mt__rnn_place(&y.total, b * gl, 1);
    y.reg[FWD_H] = mt__rnn_place(&y.total, ld * b * h, 1);
    y.reg[FWD_C] = mt__rnn_place(&y.total, ld * b * h, 1);
    y.reg[FWD_GATES] =
        mt__rnn_place(&y.total, !training || !mt__rnn_cpu_keeps_gates(s) ? c * gl : 0, 1);
    y.reg[FWD_L0] = mt__rnn_place(&y.total, lbufs ? lrows * dh : 0, 1);
    y.reg[FWD_L1] = mt__rnn_place(&y.total, lbufs ? lrows * dh : 0, 1);
    y.reg[FWD_DROP] = mt__rnn_place(&y.total, training && mt__rnn_drop_on(s) ? c * dh : 0, 1);
    mt_assert(mt__rnn_regions_valid(y.reg, FWD_NREG, y.total, 1));
    return y;
}

/* Region i of the workspace at work, or NULL where the layout has none. */
static float *fwd_region(const fwd_layout_t *y, float *work, int i)
{
    return y->reg[i].size ? work + y->reg[i].off : NULL;
}

size_t mt__rnn_cpu_fwd_work_floats(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q, bool training)
{
    return fwd_layout(s, q, training).total;
}

/* The row that splits the steps [t0, t0 + n) of a batch in two parts, the first about
 * share of the work (the rows of sequence b are the steps it runs; sorted by decreasing
 * length, the first sequences are the longest): the first row of the second part, or B when
 * the module runs its step loops on one thread; w gets each part's rows. */
int mt__rnn_cpu_split(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q, int t0, int n, double share,
                      double w[2])
{
    int B = q->B, split = B - 1;
    size_t total = q->off[t0 + n] - q->off[t0], acc = 0;
    w[0] = (double)total;
    w[1] = 0;
    if (s->threads < 2 || B < 2)
        return B;
    double want = share * (double)total;
    for (int b = 0; b < B - 1; b++) {
        int steps = 0; /* of sequence b in the chunk: the steps t with bs[t] > b */
        while (steps < n && q->bs[t0 + steps] > b)
            steps++;
        acc += (size_t)steps;
        if ((double)acc >= want) {
            /* The nearer of the rows before and after the target (never an empty part). */
            size_t before = acc - (size_t)steps;
            bool back = b > 0 && want - (double)before < (double)acc - want;
            split = back ? b : b + 1;
            acc = back ? before : acc;
            break;
        }
    }
    w[0] = (double)acc;
    w[1] = (double)(total - acc);
    return split;
}

/* Rows of sequence b in steps [t0, t0 + n): the steps t with bs[t] > b. */
static size_t seq_steps(const mt__rnn_seq_t *q, int t0, int n, int b)
{
    int steps = 0;
    while (steps < n && q->bs[t0 + steps] > b)
        steps++;
    return (size_t)steps;
}

int mt__rnn_cpu_parts(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q, int t0, int n, double share,
                      int bound[MT__RNN_PARTS_MAX + 1], double w[MT__RNN_PARTS_MAX])
{
    int B = q->B, np = mt__rnn_par_parts(s);
    np = B < np ? B : np;
    if (np <= 2) {
        double w2[2];
        int split = mt__rnn_cpu_split(s, q, t0, n, share, w2);
        bound[0] = 0;
        bound[1] = split;
        bound[2] = B;
        w[0] = w2[0];
        w[1] = w2[1];
        return split < B ? 2 : 1;
    }
    /* Part k ends at the sequence boundary nearest k/np of the rows, after the previous
     * part's end and leaving a sequence for each part still to come. */
    size_t total = q->off[t0 + n] - q->off[t0], acc = 0;
    int k = 1;
    bound[0] = 0;
    for (int b = 0; b < B && k < np; b++) {
        size_t r = seq_steps(q, t0, n, b);
        acc += r;
        double want = (double)total * k / np;
        if ((double)acc < want)
            continue;
        bool back = b > bound[k - 1] && want - (double)(acc - r) < (double)acc - want;
        int e = back ? b : b + 1, last = B - (np - k);
        bound[k] = e < bound[k - 1] + 1 ? bound[k - 1] + 1 : e > last ? last : e;
        k++;
    }
    for (; k < np; k++) /* rows ran out (empty sequences): one sequence each */
        bound[k] = bound[k - 1] + 1;
    bound[np] = B;
    for (int i = 0; i < np; i++) {
        w[i] = 0;
        for (int b = bound[i]; b < bound[i + 1]; b++)
            w[i] += (double)seq_steps(q, t0, n, b);
    }
    return np;
}

/* ---- one layer, one direction, over one chunk ---- */

typedef struct dir_run_s {
    const mt__rnn_shape_t *s;
    const mt__rnn_seq_t *q;
    mt__rnn_mats_t w;
    const float *rt;   /* R transposed [H, gH], rows gl apart or packed (s->xsmm) */
    const float *wt;   /* W^T [in, gH] packed (wt_panels), or NULL: the library reads W */
    const float *bias; /* [gH]: b_W plus b_R folded (all but GRU's n gate), or zeros */
    int t0;            /* the chunk's first step */
    int steps;         /* its steps */
    size_t rows;       /* its rows: q->off[t0 + steps] - q->off[t0] */
    int in;            /* input width */
    const float *x;    /* [rows, in] */
    float *out;        /* output of the chunk's first row, this direction's columns; stride ldo */
    int ldo;
    float *gates; /* [rows, gH] */
    float *aux;   /* [rows, H] or NULL (inference) */
    float *h;     /* state [B, H], in/out */
    float *c;     /* LSTM state [B, H], in/out */
    float *rec;   /* [B, gH] */
    bool reverse;
} dir_run_t;

/* The chunk-local first row of step t0 + t. */
static size_t lrow(const dir_run_t *a, int t)
{
    return a->q->off[a->t0 + t] - a->q->off[a->t0];
}

/* gates = x W^T over the chunk's rows, in tiles taken in turn (libxsmm) or in even parts; the
 * bias is added by the cell, in the same pass that reads the gates. */
static void project_inputs(const dir_run_t *a)
{
    int gh = a->s->gates * a->s->hidden, gl = mt__rnn_cpu_gld(a->s);
    if (a->wt)
        mt__rnn_xsmm_mm_par(a->s, (int)a->rows, gh, a->in, a->x, a->in, a->wt, 0.0f, a->gates, gl);
    else
        mt__rnn_sgemm_par(a->s, false, true, (int)a->rows, gh, a->in, 1.0f, a->x, a->in, a->w.w,
                          a->in, 0.0f, a->gates, gl);
}

/* The previous hidden state of the sequences running at a step: row b < split at
 * hp + b*ldh, row b >= split (reverse direction: sequences that start at this step) at
 * h0 + b*H, the carried state. */
typedef struct prev_s {
    const float *hp;
    int ldh;
    int split;
    const float *h0;
} prev_t;

static const float *prev_row(const prev_t *p, int b, int H)
{
    return b < p->split ? p->hp + (size_t)b * p->ldh : p->h0 + (size_t)b * H;
}

/* The cells compute rows [b0, b1) of a step: g = the step's gates (x W^T), rec = h R^T. */
MT__RNN_ISA_BODY void lstm_cell_body(const dir_run_t *a, int b0, int b1, float *g, float *o,
                                     float *aux)
{
    int H = a->s->hidden, gl = mt__rnn_cpu_gld(a->s);
    const float *bi = a->bias;
    for (int b = b0; b < b1; b++) {
        float *gb = g + (size_t)b * gl;
        const float *rb = a->rec + (size_t)b * gl;
        float *cb = a->c + (size_t)b * H;
        float *ob = o + (size_t)b * a->ldo;
        float *ab = aux ? aux + (size_t)b * H : cb;
#pragma omp simd
        for (int j = 0; j < H; j++) {
            float ii = mt__rnn_sigmoid((gb[j] + bi[j]) + rb[j]);
            float ff = mt__rnn_sigmoid((gb[H + j] + bi[H + j]) + rb[H + j]);
            float gg = mt__rnn_tanh((gb[2 * H + j] + bi[2 * H + j]) + rb[2 * H + j]);
            float oo = mt__rnn_sigmoid((gb[3 * H + j] + bi[3 * H + j]) + rb[3 * H + j]);
            float cc = ff * cb[j] + ii * gg;
            cb[j] = cc;
            ab[j] = cc;
            ob[j] = oo * mt__rnn_tanh(cc);
            gb[j] = ii;
            gb[H + j] = ff;
            gb[2 * H + j] = gg;
            gb[3 * H + j] = oo;
        }
    }
}
MT__RNN_ISA_DISPATCH(lstm_cell,
                     (const dir_run_t *a, int b0, int b1, float *g, float *o, float *aux),
                     (a, b0, b1, g, o, aux))

MT__RNN_ISA_BODY void gru_cell_body(const dir_run_t *a, int b0, int b1, float *g, float *o,
                                    float *aux, const prev_t *pv)
{
    int H = a->s->hidden, gl = mt__rnn_cpu_gld(a->s);
    const float *bi = a->bias;
    /* Without biases the folded bias row is gH zeros: reading it keeps the loop free of a
     * per-element choice, which compilers turn into masked loads from NULL (an emulator
     * that faults on masked-out lanes, qemu's, then stops the program). */
    const float *brn = a->w.br ? a->w.br + 2 * H : bi;
    for (int b = b0; b < b1; b++) {
        float *gb = g + (size_t)b * gl;
        const float *rb = a->rec + (size_t)b * gl;
        const float *hb = prev_row(pv, b, H);
        float *ob = o + (size_t)b * a->ldo;
#pragma omp simd
        for (int j = 0; j < H; j++) {
            float rr = mt__rnn_sigmoid((gb[j] + bi[j]) + rb[j]);
            float zz = mt__rnn_sigmoid((gb[H + j] + bi[H + j]) + rb[H + j]);
            float rn = rb[2 * H + j] + brn[j];
            float nn = mt__rnn_tanh((gb[2 * H + j] + bi[2 * H + j]) + rr * rn);
            ob[j] = (1.0f - zz) * nn + zz * hb[j];
            gb[j] = rr;
            gb[H + j] = zz;
            gb[2 * H + j] = nn;
            if (aux)
                aux[(size_t)b * H + j] = rn;
        }
    }
}
MT__RNN_ISA_DISPATCH(gru_cell,
                     (const dir_run_t *a, int b0, int b1, float *g, float *o, float *aux,
                      const prev_t *pv),
                     (a, b0, b1, g, o, aux, pv))

MT__RNN_ISA_BODY void rnn_cell_body(const dir_run_t *a, int b0, int b1, float *g, float *o)
{
    int H = a->s->hidden, gl = mt__rnn_cpu_gld(a->s);
    bool relu = a->s->mode == MT_RNN_RELU;
    const float *bi = a->bias;
    for (int b = b0; b < b1; b++) {
        const float *gb = g + (size_t)b * gl;
        const float *rb = a->rec + (size_t)b * gl;
        float *ob = o + (size_t)b * a->ldo;
        /* Two loops: with the choice inside, GCC vectorized neither. */
        if (relu) {
#pragma omp simd
            for (int j = 0; j < H; j++) {
                float v = (gb[j] + bi[j]) + rb[j];
                ob[j] = v > 0.0f ? v : 0.0f;
            }
        } else {
#pragma omp simd
            for (int j = 0; j < H; j++)
                ob[j] = mt__rnn_tanh((gb[j] + bi[j]) + rb[j]);
        }
    }
}
MT__RNN_ISA_DISPATCH(rnn_cell, (const dir_run_t *a, int b0, int b1, float *g, float *o),
                     (a, b0, b1, g, o))

/* Copies rows [lo, hi) of output step row r into the carried state. */
static void carry(const dir_run_t *a, size_t r, int lo, int hi)
{
    int H = a->s->hidden;
    for (int b = lo; b < hi; b++)
        memcpy(a->h + (size_t)b * H, a->out + (r + (size_t)b) * a->ldo, (size_t)H * sizeof(float));
}

static int imin(int x, int y)
{
    return x < y ? x : y;
}

static int imax(int x, int y)
{
    return x > y ? x : y;
}

/* rec[n, gH] = h[n, H] R^T: on libxsmm over R^T's panels, or the library's sgemm. */
static void recurrent(const dir_run_t *a, int n, const float *h, int ldh, float *rec)
{
    const mt__rnn_shape_t *s = a->s;
    int H = s->hidden, gh = s->gates * H, gl = mt__rnn_cpu_gld(s);
    if (s->xsmm)
        mt__rnn_xsmm_mm(n, gh, H, h, ldh, a->rt, 0.0f, rec, gl);
    else
        mt__rnn_sgemm(s->gemm, false, false, n, gh, H, 1.0f, h, ldh, a->rt, gl, 0.0f, rec, gl);
}

/* The chunk's steps for the sequences b0 <= b < b1 (mt__rnn_rows_par). */
static void run_steps(void *arg, int b0, int b1)
{
    const dir_run_t *a = arg;
    const mt__rnn_shape_t *s = a->s;
    const int *bs = a->q->bs;
    int H = s->hidden, gl = mt__rnn_cpu_gld(s);
    for (int k = 0; k < a->steps; k++) {
        int t = a->reverse ? a->steps - 1 - k : k, tg = a->t0 + t, nb = bs[tg];
        int e = imin(b1, nb); /* rows [b0, e) of this step */
        size_t r = lrow(a, t);
        /* The first step of the chunk starts from the carried state (whose rows of
         * sequences not yet started in reverse hold hx); later ones from the step before,
         * except, in reverse, the sequences that start at this step. */
        prev_t pv = {a->h, H, nb, a->h};
        if (k > 0) {
            int tp = a->reverse ? t + 1 : t - 1;
            pv.hp = a->out + lrow(a, tp) * (size_t)a->ldo;
            pv.ldh = a->ldo;
            pv.split = a->reverse ? bs[tg + 1] : nb;
        }
        if (e <= b0)
            continue; /* none of these sequences runs at this step */
        int m = imin(e, pv.split);
        if (m > b0)
            recurrent(a, m - b0, pv.hp + (size_t)b0 * pv.ldh, pv.ldh, a->rec + (size_t)b0 * gl);
        int m2 = imax(b0, pv.split);
        if (m2 < e)
            recurrent(a, e - m2, a->h + (size_t)m2 * H, H, a->rec + (size_t)m2 * gl);
        float *g = a->gates + r * (size_t)gl;
        float *o = a->out + r * (size_t)a->ldo;
        float *aux = a->aux ? a->aux + r * (size_t)H : NULL;
        if (s->mode == MT_RNN_LSTM)
            lstm_cell(a, b0, e, g, o, aux);
        else if (s->mode == MT_RNN_GRU)
            gru_cell(a, b0, e, g, o, aux, &pv);
        else
            rnn_cell(a, b0, e, g, o);
        /* The carried state: every running sequence after the chunk's last step (the next
         * chunk, hy); in forward, also a sequence that ends here (hy). */
        if (k == a->steps - 1)
            carry(a, r, b0, e);
        else if (!a->reverse)
            carry(a, r, imax(b0, bs[tg + 1]), e);
    }
}

static void run_dir(const dir_run_t *a)
{
    project_inputs(a);
    /* The cut follows the threads' speeds where the per-step products are libxsmm's, whose
     * rows come out the same however the batch is cut. A library may round a row
     * differently with other rows beside it, so its products keep fixed parts
     * (docs/rnn-cpu.md, Bit identity). */
    int bound[MT__RNN_PARTS_MAX + 1];
    double w[MT__RNN_PARTS_MAX], f = a->s->xsmm ? mt__rnn_par_share() : 0.5;
    int np = mt__rnn_cpu_parts(a->s, a->q, a->t0, a->steps, f, bound, w);
    mt__rnn_parts_par(a->s, bound, np, w, run_steps, (void *)a);
}

/* dst[n, m] = src[m, n]^T, row-major with leading dimensions ldd and lds, in tiles of 32
 * rows and columns (a cache line of each of 32 rows at a time). */
static void transpose(float *restrict dst, int ldd, const float *restrict src, int lds, int m,
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
                    d[i] = src[(size_t)i * lds + j];
            }
        }
    }
}

/* prepare()'s work in items of 32 rows of R (a panel of R^T): item i is block i % nblk of
 * pseudo-layer i / nblk, and block 0 also computes the layer's folded bias. */
typedef struct prep_job_s {
    const mt__rnn_shape_t *s;
    const float *w;
    float *rt; /* FWD_RT */
    int nblk;
} prep_job_t;

static void prepare_items(void *arg, int i0, int i1)
{
    const prep_job_t *j = arg;
    const mt__rnn_shape_t *s = j->s;
    int H = s->hidden, gh = s->gates * H, gl = mt__rnn_cpu_gld(s);
    for (int i = i0; i < i1; i++) {
        int p = i / j->nblk, r0 = (i % j->nblk) * MT__RNN_XSMM_MB;
        int n = gh - r0 < MT__RNN_XSMM_MB ? gh - r0 : MT__RNN_XSMM_MB;
        mt__rnn_mats_t m = mt__rnn_mats(s, (float *)j->w, p / s->dirs, p % s->dirs);
        float *rt = j->rt + (size_t)p * ((size_t)H + 1) * gl, *bias = rt + (size_t)H * gl;
        const float *r = m.r + (size_t)r0 * H;
        if (s->xsmm) /* R^T [H, gH] in panels: H*gH of the H*gl floats */
            mt__rnn_xsmm_pack(rt + (size_t)r0 * H, r, 1, H, H, n);
        else
            transpose(rt + r0, gl, r, H, n, H);
        if (r0 > 0)
            continue;
        /* The recurrent bias is folded in too, except GRU's n gate, where it sits inside
         * r * (R_n h + b_Rn). */
        int fold = s->mode == MT_RNN_GRU ? 2 * H : gh;
        for (int c = 0; c < gh; c++)
            bias[c] = m.bw ? m.bw[c] + (c < fold ? m.br[c] : 0.0f) : 0.0f;
    }
}

/* R^T and the folded bias of every pseudo-layer into rt (FWD_RT), then (wt_panels) W^T's
 * panels into wt (FWD_WT); in even parts of the items, then in tiles (a serial part would
 * cost as much as the parallel rest). */
static void prepare(const mt__rnn_shape_t *s, const float *w, float *rt, float *wt)
{
    int gh = s->gates * s->hidden;
    prep_job_t j = {s, w, rt, (gh + MT__RNN_XSMM_MB - 1) / MT__RNN_XSMM_MB};
    int n = s->layers * s->dirs * j.nblk;
    mt__rnn_even_par(s, n, prepare_items, &j);
    for (int p = 0; wt && p < s->layers * s->dirs; p++) {
        mt__rnn_mats_t m = mt__rnn_mats(s, (float *)w, p / s->dirs, p % s->dirs);
        int in = mt__rnn_layer_in(s, p / s->dirs);
        mt__rnn_xsmm_pack_par(s, wt + wt_offset(s, p), m.w, 1, in, in, gh);
    }
}

/* ---- the whole stack ---- */

typedef struct fwd_s {
    const mt__rnn_shape_t *s;
    const mt__rnn_seq_t *q;
    const float *w;
    const mt_rnn_io_t *io;
    bool training;
    uint64_t key; /* dropout */
    float *rt;    /* FWD_RT, filled by prepare() */
    float *wt;    /* FWD_WT, filled by prepare(), or NULL */
    float *rec, *hst, *cst, *gbuf;
    float *lbuf[2]; /* inference, L > 1 */
    float *dbuf;    /* training with dropout: the dropped input of layer l > 0 */
} fwd_t;

/* Layer l, direction d over chunk k (reserve r when training), states carried in hst/cst. */
static void fwd_chunk(const fwd_t *f, int l, int d, int k, float *r)
{
    const mt__rnn_shape_t *s = f->s;
    const mt__rnn_seq_t *q = f->q;
    int B = q->B, H = s->hidden, D = s->dirs, L = s->layers;
    int dh = D * H, n = mt__rnn_cpu_chunk_steps(s, q->T, k), p = l * D + d;
    size_t row0 = mt__rnn_cpu_chunk_row0(s, q, k), nb = mt__rnn_cpu_chunk_rows(s, q, k);
    size_t bh = (size_t)B * (size_t)H;
    /* Inference keeps layer outputs in lbuf: chunk-local (D = 1) or whole-sequence. */
    size_t lofs = D == 1 ? 0 : row0 * (size_t)dh;
    const float *in;
    float *out;
    if (l == 0)
        in = f->io->x + row0 * (size_t)s->input;
    else if (f->training)
        in = mt__rnn_cpu_layer_out(s, r, nb, l - 1);
    else
        in = f->lbuf[(l - 1) % 2] + lofs;
    if (l > 0 && f->dbuf) {
        /* The reserve keeps layer l-1's output h; layer l reads it through the mask. */
        mt__rnn_drop_apply(s, f->key, l - 1, row0 * (size_t)dh, nb * (size_t)dh, in, f->dbuf);
        in = f->dbuf;
    }
    if (l == L - 1)
        out = f->io->y + row0 * (size_t)dh;
    else if (f->training)
        out = mt__rnn_cpu_layer_out(s, r, nb, l);
    else
        out = f->lbuf[l % 2] + lofs;
    dir_run_t a = {
        .s = s,
        .q = q,
        .w = mt__rnn_mats(s, (float *)f->w, l, d),
        .rt = f->rt + (size_t)p * ((size_t)H + 1) * (size_t)mt__rnn_cpu_gld(s),
        .bias = f->rt + ((size_t)p * ((size_t)H + 1) + (size_t)H) * (size_t)mt__rnn_cpu_gld(s),
        .wt = f->wt ? f->wt + wt_offset(s, p) : NULL,
        .t0 = k * mt__rnn_cpu_chunk_len(s),
        .steps = n,
        .rows = nb,
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
    if (f->training && mt__rnn_cpu_keeps_gates(s)) {
        a.gates = mt__rnn_cpu_gates(s, r, nb, p);
        a.aux = mt__rnn_cpu_aux(s, r, nb, p);
    }
    run_dir(&a);
}

static int forward_seq(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q, const float *w,
                       const mt_rnn_io_t *io, bool training, uint64_t key,
                       const mt__rnn_chunks_t *chunks, float *work)
{
    int T = q->T, B = q->B, H = s->hidden, D = s->dirs, L = s->layers;
    int K = mt__rnn_cpu_nchunks(s, T);
    size_t bh = (size_t)B * (size_t)H, nstate = (size_t)L * (size_t)D * bh;

    fwd_t f = {.s = s, .q = q, .w = w, .io = io, .training = training, .key = key};
    fwd_layout_t y = fwd_layout(s, q, training);
    f.rt = fwd_region(&y, work, FWD_RT);
    f.wt = fwd_region(&y, work, FWD_WT);
    f.rec = fwd_region(&y, work, FWD_REC);
    f.hst = fwd_region(&y, work, FWD_H);
    f.cst = fwd_region(&y, work, FWD_C);
    f.gbuf = fwd_region(&y, work, FWD_GATES);
    f.lbuf[0] = fwd_region(&y, work, FWD_L0);
    f.lbuf[1] = fwd_region(&y, work, FWD_L1);
    f.dbuf = fwd_region(&y, work, FWD_DROP);
    prepare(s, w, f.rt, f.wt);
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

int mt__rnn_cpu_forward_chunks(const mt__rnn_shape_t *s, const float *w, const mt_rnn_io_t *io,
                               bool training, uint64_t key, const mt__rnn_chunks_t *chunks,
                               float *work)
{
    if (training && !chunks)
        return MT_EINVAL;
    mt__rnn_seq_t q;
    int rc = mt__rnn_seq_init(&q, io);
    if (rc)
        return rc;
    rc = forward_seq(s, &q, w, io, training, key, chunks, work);
    mt__rnn_seq_fini(&q);
    return rc;
}

/* ---- one flat reserve ---- */

typedef struct flat_s {
    const mt__rnn_shape_t *s;
    float *base;
    mt__rnn_seq_t q;
} flat_t;

static int flat_get(void *ud, int k, float **out)
{
    const flat_t *f = ud;
    *out = f->base + mt__rnn_cpu_chunk_floats(f->s, mt__rnn_cpu_chunk_row0(f->s, &f->q, k));
    return 0;
}

static int flat_done(void *ud, int k)
{
    (void)ud;
    (void)k;
    return 0;
}

static int flat_init(flat_t *f, const mt__rnn_shape_t *s, const mt_rnn_io_t *io, float *reserve,
                     mt__rnn_chunks_t *c)
{
    f->s = s;
    f->base = reserve;
    *c = (mt__rnn_chunks_t){flat_get, flat_done, flat_get, flat_done, f};
    return mt__rnn_seq_init(&f->q, io);
}

int mt__rnn_cpu_forward_drop(const mt__rnn_shape_t *s, const float *w, const mt_rnn_io_t *io,
                             bool training, uint64_t key, float *reserve, float *work)
{
    flat_t f;
    mt__rnn_chunks_t c;
    int rc = flat_init(&f, s, io, reserve, &c);
    if (rc == 0)
        rc = mt__rnn_cpu_forward_chunks(s, w, io, training, key, training ? &c : NULL, work);
    mt__rnn_seq_fini(&f.q);
    return rc;
}

int mt__rnn_cpu_backward_drop(const mt__rnn_shape_t *s, const float *w, float *dw,
                              const mt_rnn_io_t *io, uint64_t key, float *reserve,
                              const mt_rnn_grad_io_t *g, float *work)
{
    flat_t f;
    mt__rnn_chunks_t c;
    int rc = flat_init(&f, s, io, reserve, &c);
    if (rc == 0)
        rc = mt__rnn_cpu_backward_chunks(s, w, dw, io, key, &c, g, work);
    mt__rnn_seq_fini(&f.q);
    return rc;
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

/* ---- sizes for one io ---- */

size_t mt__rnn_cpu_io_fwd_work(const mt__rnn_shape_t *s, const mt_rnn_io_t *io, bool training)
{
    mt__rnn_seq_t q;
    if (mt__rnn_seq_init(&q, io))
        return 0;
    size_t n = mt__rnn_cpu_fwd_work_floats(s, &q, training);
    mt__rnn_seq_fini(&q);
    return n;
}

size_t mt__rnn_cpu_io_bwd_work(const mt__rnn_shape_t *s, const mt_rnn_io_t *io)
{
    mt__rnn_seq_t q;
    if (mt__rnn_seq_init(&q, io))
        return 0;
    size_t n = mt__rnn_cpu_bwd_work_floats(s, &q);
    mt__rnn_seq_fini(&q);
    return n;
}

size_t mt__rnn_cpu_io_reserve(const mt__rnn_shape_t *s, const mt_rnn_io_t *io)
{
    size_t rows = io->batch_sizes ? io->tokens : (size_t)io->seq_len * (size_t)io->batch;
    return mt__rnn_cpu_reserve_floats(s, rows);
}
