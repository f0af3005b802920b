/* The fake cuDNN's reference RNN (see fake_cudnn_ref.h). Plain loops in double precision,
 * one sequence at a time: clarity over speed, the shapes under test are tiny. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/rnn_cudnn/fake_cudnn_ref.h"

size_t fref_act_width(const fref_t *n)
{
    return (size_t)(n->g + 2) * (size_t)n->H;
}

size_t fref_act_floats(const fref_t *n)
{
    return (size_t)n->L * (size_t)n->D * n->tokens * fref_act_width(n);
}

size_t fref_dpre_floats(const fref_t *n)
{
    return (size_t)n->L * (size_t)n->D * n->tokens * (size_t)n->g * (size_t)n->H;
}

size_t fref_mask_bytes(const fref_t *n)
{
    return (size_t)(n->L - 1) * n->tokens * (size_t)n->D * (size_t)n->H;
}

static int layer_in(const fref_t *n, int l)
{
    return l == 0 ? n->in : n->D * n->H;
}

static double sigm(double v)
{
    return 1.0 / (1.0 + exp(-v));
}

static float *act_at(const fref_t *n, const float *act, int p, long row)
{
    return (float *)act + ((size_t)p * n->tokens + (size_t)row) * fref_act_width(n);
}

/* Element k of layer l's input at row: x, or the lower layer's output through its mask. */
static double input_at(const fref_t *n, const float *x, const float *act, int l, long row, int k)
{
    if (l == 0)
        return x[(size_t)row * (size_t)n->in + (size_t)k];
    int d = k / n->H, j = k % n->H;
    int p = (l - 1) * n->D + d;
    double v = act_at(n, act, p, row)[(size_t)(n->g + 1) * (size_t)n->H + (size_t)j];
    if (n->mask) {
        size_t m = ((size_t)(l - 1) * n->tokens + (size_t)row) * (size_t)(n->D * n->H) + (size_t)k;
        v *= n->mask[m] ? n->drop_scale : 0.0;
    }
    return v;
}

/* The step order of direction d over sequence b: the i-th step's time. */
static int step_time(const fref_t *n, int d, int b, int i)
{
    return d == 0 ? i : n->lens[b] - 1 - i;
}

/* h of pseudo-layer p at row: from y for the top layer (as cuDNN reads it), else the reserve. */
static const float *h_at(const fref_t *n, const float *act, const float *y, int p, long row)
{
    int l = p / n->D, d = p % n->D;
    if (y && l == n->L - 1)
        return y + (size_t)row * (size_t)(n->D * n->H) + (size_t)d * (size_t)n->H;
    return act_at(n, act, p, row) + (size_t)(n->g + 1) * (size_t)n->H;
}

/* The state before step i of sequence b: the previous step's, or the initial one. */
static const float *prev_h(const fref_t *n, const float *act, const float *y, const float *hx,
                           int p, int d, int b, int i, const float *zeros)
{
    if (i > 0)
        return h_at(n, act, y, p, n->row[(size_t)step_time(n, d, b, i - 1) * n->B + b]);
    return hx ? hx + ((size_t)p * n->B + (size_t)b) * (size_t)n->H : zeros;
}

static const float *prev_c(const fref_t *n, const float *act, const float *cx, int p, int d, int b,
                           int i, const float *zeros)
{
    if (i > 0)
        return act_at(n, act, p, n->row[(size_t)step_time(n, d, b, i - 1) * n->B + b]) +
               (size_t)n->g * (size_t)n->H;
    return cx ? cx + ((size_t)p * n->B + (size_t)b) * (size_t)n->H : zeros;
}

/* ---- forward ---- */

static void forward_pseudo(const fref_t *n, const float *x, const float *hx, const float *cx,
                           float *hy, float *cy, float *act, int l, int d, const float *zeros)
{
    int H = n->H, g = n->g, p = l * n->D + d, cols = layer_in(n, l);
    const float **W = n->mat + (size_t)p * 2 * g, **R = W + g;
    const float **bW = n->bias + (size_t)p * 2 * g, **bR = bW + g;
    double *in = malloc((size_t)cols * sizeof *in),
           *pre = malloc((size_t)(2 * g * H) * sizeof *pre);
    for (int b = 0; b < n->B; b++) {
        for (int i = 0; i < n->lens[b]; i++) {
            long row = n->row[(size_t)step_time(n, d, b, i) * n->B + b];
            const float *h0 = prev_h(n, act, NULL, hx, p, d, b, i, zeros);
            const float *c0 = prev_c(n, act, cx, p, d, b, i, zeros);
            for (int k = 0; k < cols; k++)
                in[k] = input_at(n, x, act, l, row, k);
            /* pre[q H + j] = W_q in + b_W; pre[(g + q) H + j] = R_q h0 + b_R */
            for (int q = 0; q < g; q++) {
                for (int j = 0; j < H; j++) {
                    double a = bW[q] ? bW[q][j] : 0.0, r = bR[q] ? bR[q][j] : 0.0;
                    for (int k = 0; k < cols; k++)
                        a += (double)W[q][(size_t)j * cols + k] * in[k];
                    for (int k = 0; k < H; k++)
                        r += (double)R[q][(size_t)j * H + k] * h0[k];
                    pre[q * H + j] = a;
                    pre[(g + q) * H + j] = r;
                }
            }
            float *o = act_at(n, act, p, row), *ho = o + (size_t)(g + 1) * H;
            for (int j = 0; j < H; j++) {
                double h;
                switch (n->cell) {
                case FREF_LSTM: {
                    double ig = sigm(pre[j] + pre[4 * H + j]);
                    double fg = sigm(pre[H + j] + pre[5 * H + j]);
                    double gg = tanh(pre[2 * H + j] + pre[6 * H + j]);
                    double og = sigm(pre[3 * H + j] + pre[7 * H + j]);
                    double c = fg * c0[j] + ig * gg;
                    h = og * tanh(c);
                    o[j] = (float)ig, o[H + j] = (float)fg, o[2 * H + j] = (float)gg;
                    o[3 * H + j] = (float)og, o[4 * H + j] = (float)c;
                    break;
                }
                case FREF_GRU: {
                    double rg = sigm(pre[j] + pre[3 * H + j]);
                    double zg = sigm(pre[H + j] + pre[4 * H + j]);
                    double rh = pre[5 * H + j];
                    double ng = tanh(pre[2 * H + j] + rg * rh);
                    h = (1.0 - zg) * ng + zg * h0[j];
                    o[j] = (float)rg, o[H + j] = (float)zg, o[2 * H + j] = (float)ng;
                    o[3 * H + j] = (float)rh;
                    break;
                }
                default: {
                    double v = pre[j] + pre[H + j];
                    h = n->cell == FREF_TANH ? tanh(v) : (v > 0.0 ? v : 0.0);
                    o[j] = (float)h;
                    break;
                }
                }
                ho[j] = (float)h;
            }
        }
        size_t s = ((size_t)p * n->B + (size_t)b) * (size_t)H;
        long last = n->row[(size_t)step_time(n, d, b, n->lens[b] - 1) * n->B + b];
        const float *o = act_at(n, act, p, last);
        for (int j = 0; j < H && hy; j++)
            hy[s + j] = o[(size_t)(g + 1) * H + j];
        for (int j = 0; j < H && cy; j++)
            cy[s + j] = o[(size_t)g * H + j];
    }
    free(in);
    free(pre);
}

void fref_forward(const fref_t *n, const float *x, float *y, const float *hx, const float *cx,
                  float *hy, float *cy, float *act)
{
    float *zeros = calloc((size_t)n->H, sizeof *zeros);
    for (int l = 0; l < n->L; l++)
        for (int d = 0; d < n->D; d++)
            forward_pseudo(n, x, hx, cx, hy, cy, act, l, d, zeros);
    for (size_t r = 0; r < n->tokens; r++)
        for (int d = 0; d < n->D; d++)
            memcpy(y + (r * n->D + d) * n->H, h_at(n, act, NULL, (n->L - 1) * n->D + d, (long)r),
                   (size_t)n->H * sizeof *y);
    free(zeros);
}

/* ---- backward ---- */

/* The pre-activation gradients of one step, from dh (and LSTM's dc, updated in place);
 * dpw gets the W side, dpr the R side (they differ only in GRU's n gate). */
static void step_grads(const fref_t *n, const float *o, const float *h0, const float *c0,
                       const double *dh, double *dc, double *dpw, double *dpr)
{
    int H = n->H;
    for (int j = 0; j < H; j++) {
        switch (n->cell) {
        case FREF_LSTM: {
            double ig = o[j], fg = o[H + j], gg = o[2 * H + j], og = o[3 * H + j];
            double tc = tanh(o[4 * H + j]);
            double dct = dc[j] + dh[j] * og * (1.0 - tc * tc);
            dpw[j] = dct * gg * ig * (1.0 - ig);
            dpw[H + j] = dct * c0[j] * fg * (1.0 - fg);
            dpw[2 * H + j] = dct * ig * (1.0 - gg * gg);
            dpw[3 * H + j] = dh[j] * tc * og * (1.0 - og);
            dc[j] = dct * fg;
            for (int q = 0; q < 4; q++)
                dpr[q * H + j] = dpw[q * H + j];
            break;
        }
        case FREF_GRU: {
            double rg = o[j], zg = o[H + j], ng = o[2 * H + j], rh = o[3 * H + j];
            double dn = dh[j] * (1.0 - zg) * (1.0 - ng * ng);
            dpw[j] = dn * rh * rg * (1.0 - rg);
            dpw[H + j] = dh[j] * (h0[j] - ng) * zg * (1.0 - zg);
            dpw[2 * H + j] = dn;
            dpr[j] = dpw[j];
            dpr[H + j] = dpw[H + j];
            dpr[2 * H + j] = dn * rg;
            break;
        }
        default: {
            double h = o[j];
            dpw[j] = n->cell == FREF_TANH ? dh[j] * (1.0 - h * h) : (h > 0.0 ? dh[j] : 0.0);
            dpr[j] = dpw[j];
            break;
        }
        }
    }
}

static void backward_pseudo(const fref_t *n, const float *y, const double *dout, double *din,
                            const float *hx, const float *dhy, float *dhx, const float *cx,
                            const float *dcy, float *dcx, const float *act, float *dpre, int l,
                            int d, const float *zeros)
{
    int H = n->H, g = n->g, p = l * n->D + d, cols = layer_in(n, l), DH = n->D * H;
    const float **W = n->mat + (size_t)p * 2 * g, **R = W + g;
    double *dh = malloc((size_t)H * sizeof *dh), *carry = malloc((size_t)H * sizeof *carry);
    double *dc = malloc((size_t)H * sizeof *dc);
    double *dpw = malloc((size_t)(g * H) * sizeof *dpw),
           *dpr = malloc((size_t)(g * H) * sizeof *dpr);
    for (int b = 0; b < n->B; b++) {
        size_t s = ((size_t)p * n->B + (size_t)b) * (size_t)H;
        for (int j = 0; j < H; j++) {
            carry[j] = dhy ? dhy[s + j] : 0.0;
            dc[j] = dcy && n->cell == FREF_LSTM ? dcy[s + j] : 0.0;
        }
        for (int i = n->lens[b] - 1; i >= 0; i--) {
            long row = n->row[(size_t)step_time(n, d, b, i) * n->B + b];
            const float *o = act_at(n, act, p, row);
            const float *h0 = prev_h(n, act, y, hx, p, d, b, i, zeros);
            const float *c0 = prev_c(n, act, cx, p, d, b, i, zeros);
            for (int j = 0; j < H; j++)
                dh[j] = dout[(size_t)row * DH + (size_t)d * H + j] + carry[j];
            step_grads(n, o, h0, c0, dh, dc, dpw, dpr);
            float *dp = dpre + ((size_t)p * n->tokens + (size_t)row) * (size_t)(g * H);
            for (int k = 0; k < g * H; k++)
                dp[k] = (float)dpw[k];
            for (int k = 0; k < H; k++)
                carry[k] = n->cell == FREF_GRU ? dh[k] * o[H + k] : 0.0;
            for (int q = 0; q < g; q++) {
                for (int j = 0; j < H; j++) {
                    for (int k = 0; k < H; k++)
                        carry[k] += (double)R[q][(size_t)j * H + k] * dpr[q * H + j];
                    for (int k = 0; k < cols; k++)
                        din[(size_t)row * cols + k] +=
                            (double)W[q][(size_t)j * cols + k] * dpw[q * H + j];
                }
            }
        }
        for (int j = 0; j < H && dhx; j++)
            dhx[s + j] = (float)carry[j];
        for (int j = 0; j < H && dcx; j++)
            dcx[s + j] = (float)dc[j];
    }
    free(dh);
    free(carry);
    free(dc);
    free(dpw);
    free(dpr);
}

void fref_backward_data(const fref_t *n, const float *y, const float *dy, float *dx,
                        const float *hx, const float *dhy, float *dhx, const float *cx,
                        const float *dcy, float *dcx, const float *act, float *dpre)
{
    float *zeros = calloc((size_t)n->H, sizeof *zeros);
    size_t DH = (size_t)(n->D * n->H);
    double *dout = malloc(n->tokens * DH * sizeof *dout);
    for (size_t k = 0; k < n->tokens * DH; k++)
        dout[k] = dy[k];
    for (int l = n->L - 1; l >= 0; l--) {
        size_t cols = (size_t)layer_in(n, l);
        double *din = calloc(n->tokens * cols, sizeof *din);
        for (int d = 0; d < n->D; d++)
            backward_pseudo(n, y, dout, din, hx, dhy, dhx, cx, dcy, dcx, act, dpre, l, d, zeros);
        if (l == 0) {
            for (size_t k = 0; k < n->tokens * cols; k++)
                dx[k] = (float)din[k];
        } else if (n->mask) {
            /* through the mask of layer l - 1's output */
            for (size_t k = 0; k < n->tokens * cols; k++)
                din[k] *= n->mask[(size_t)(l - 1) * n->tokens * cols + k] ? n->drop_scale : 0.0;
        }
        free(dout);
        dout = din;
    }
    free(dout);
    free(zeros);
}

void fref_backward_weights(const fref_t *n, const float *x, const float *hx, const float *y,
                           const float *act, const float *dpre, float **dmat, float **dbias)
{
    float *zeros = calloc((size_t)n->H, sizeof *zeros);
    int H = n->H, g = n->g;
    for (int l = 0; l < n->L; l++) {
        int cols = layer_in(n, l);
        double *in = malloc((size_t)cols * sizeof *in);
        for (int d = 0; d < n->D; d++) {
            int p = l * n->D + d;
            float **dW = dmat + (size_t)p * 2 * g, **dR = dW + g;
            float **dbW = dbias + (size_t)p * 2 * g, **dbR = dbW + g;
            for (int b = 0; b < n->B; b++) {
                for (int i = 0; i < n->lens[b]; i++) {
                    long row = n->row[(size_t)step_time(n, d, b, i) * n->B + b];
                    const float *o = act_at(n, act, p, row);
                    const float *h0 = prev_h(n, act, y, hx, p, d, b, i, zeros);
                    const float *dp =
                        dpre + ((size_t)p * n->tokens + (size_t)row) * (size_t)(g * H);
                    for (int k = 0; k < cols; k++)
                        in[k] = input_at(n, x, act, l, row, k);
                    for (int q = 0; q < g; q++) {
                        for (int j = 0; j < H; j++) {
                            double gw = dp[q * H + j];
                            double gr = n->cell == FREF_GRU && q == 2 ? gw * o[j] : gw;
                            for (int k = 0; k < cols; k++)
                                dW[q][(size_t)j * cols + k] += (float)(gw * in[k]);
                            for (int k = 0; k < H; k++)
                                dR[q][(size_t)j * H + k] += (float)(gr * h0[k]);
                            if (dbW[q])
                                dbW[q][j] += (float)gw;
                            if (dbR[q])
                                dbR[q][j] += (float)gr;
                        }
                    }
                }
            }
        }
        free(in);
    }
    free(zeros);
}
