/* Test-side reference for the RNN engine: the canonical cuDNN weight layout written out
 * from its definition, and a naive double-precision per-step forward (no GEMMs, no fused
 * bias, no in-place tricks) that the engine is checked against. */
#ifndef MT_TESTS_RNN_REF_H
#define MT_TESTS_RNN_REF_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref_shape_s {
    int mode; /* mt_rnn_mode_e values: 0 tanh, 1 relu, 2 lstm, 3 gru */
    int input, hidden, layers, dirs;
    bool bias;
} ref_shape_t;

static inline int ref_gates(const ref_shape_t *s)
{
    return s->mode == 2 ? 4 : s->mode == 3 ? 3 : 1;
}

static inline int ref_in(const ref_shape_t *s, int l)
{
    return l == 0 ? s->input : s->dirs * s->hidden;
}

/* Canonical layout: pseudo-layers (l, d) in order l*D + d; each is W_0..W_{g-1} [H x in],
 * R_0..R_{g-1} [H x H], g input biases, g recurrent biases. */
static inline size_t ref_pseudo_size(const ref_shape_t *s, int l)
{
    size_t g = (size_t)ref_gates(s), H = (size_t)s->hidden;
    return g * H * (size_t)ref_in(s, l) + g * H * H + (s->bias ? 2 * g * H : 0);
}

static inline size_t ref_offset(const ref_shape_t *s, int l, int d)
{
    size_t off = 0;
    for (int p = 0; p < l * s->dirs + d; p++)
        off += ref_pseudo_size(s, p / s->dirs);
    return off;
}

static inline size_t ref_total(const ref_shape_t *s)
{
    return ref_offset(s, s->layers, 0);
}

/* Element (gate q, row j, column i) of W, of R, and bias q/j. */
static inline size_t ref_w_at(const ref_shape_t *s, int l, int d, int q, int j, int i)
{
    return ref_offset(s, l, d) + ((size_t)q * s->hidden + j) * ref_in(s, l) + i;
}

static inline size_t ref_r_at(const ref_shape_t *s, int l, int d, int q, int j, int i)
{
    size_t g = (size_t)ref_gates(s);
    return ref_offset(s, l, d) + g * s->hidden * ref_in(s, l) +
           ((size_t)q * s->hidden + j) * s->hidden + i;
}

static inline size_t ref_bw_at(const ref_shape_t *s, int l, int d, int q, int j)
{
    size_t g = (size_t)ref_gates(s), H = (size_t)s->hidden;
    return ref_offset(s, l, d) + g * H * ref_in(s, l) + g * H * H + (size_t)q * H + j;
}

static inline size_t ref_br_at(const ref_shape_t *s, int l, int d, int q, int j)
{
    return ref_bw_at(s, l, d, q, j) + (size_t)ref_gates(s) * s->hidden;
}

static inline double ref_sig(double v)
{
    return 1.0 / (1.0 + exp(-v));
}

/* Forward in double. x [T, B, input]; hx, cx [L*D, B, H] or NULL; y [T, B, D*H];
 * hy, cy [L*D, B, H] (cy used for LSTM). masks: NULL, or for each layer l < L-1 the factors
 * [T, B, D*H] its output is multiplied by on its way into layer l+1 (dropout). */
static inline void ref_forward_masked(const ref_shape_t *s, const double *w, int T, int B,
                                      const double *x, const double *hx, const double *cx,
                                      double *y, double *hy, double *cy, const double *const *masks)
{
    int H = s->hidden, D = s->dirs, DH = D * H, g = ref_gates(s);
    double *in = malloc(sizeof(double) * (size_t)T * B * (s->input > DH ? s->input : DH));
    double *out = malloc(sizeof(double) * (size_t)T * B * DH);
    double *h = malloc(sizeof(double) * (size_t)B * H);
    double *c = malloc(sizeof(double) * (size_t)B * H);
    double *hn = malloc(sizeof(double) * (size_t)B * H);
    double *px = malloc(sizeof(double) * (size_t)g * H);
    double *ph = malloc(sizeof(double) * (size_t)g * H);
    memcpy(in, x, sizeof(double) * (size_t)T * B * s->input);
    for (int l = 0; l < s->layers; l++) {
        int nin = ref_in(s, l);
        for (int d = 0; d < D; d++) {
            int p = l * D + d;
            for (int k = 0; k < B * H; k++) {
                h[k] = hx ? hx[(size_t)p * B * H + k] : 0.0;
                c[k] = cx ? cx[(size_t)p * B * H + k] : 0.0;
            }
            for (int step = 0; step < T; step++) {
                int t = d ? T - 1 - step : step;
                for (int b = 0; b < B; b++) {
                    for (int q = 0; q < g; q++) {
                        for (int j = 0; j < H; j++) {
                            double a = s->bias ? w[ref_bw_at(s, l, d, q, j)] : 0.0;
                            for (int i = 0; i < nin; i++)
                                a += w[ref_w_at(s, l, d, q, j, i)] *
                                     in[((size_t)t * B + b) * nin + i];
                            double r = s->bias ? w[ref_br_at(s, l, d, q, j)] : 0.0;
                            for (int i = 0; i < H; i++)
                                r += w[ref_r_at(s, l, d, q, j, i)] * h[b * H + i];
                            px[q * H + j] = a;
                            ph[q * H + j] = r;
                        }
                    }
                    for (int j = 0; j < H; j++) {
                        double hv, hp = h[b * H + j];
                        if (s->mode == 2) {
                            double ig = ref_sig(px[j] + ph[j]);
                            double fg = ref_sig(px[H + j] + ph[H + j]);
                            double gg = tanh(px[2 * H + j] + ph[2 * H + j]);
                            double og = ref_sig(px[3 * H + j] + ph[3 * H + j]);
                            c[b * H + j] = fg * c[b * H + j] + ig * gg;
                            hv = og * tanh(c[b * H + j]);
                        } else if (s->mode == 3) {
                            double rg = ref_sig(px[j] + ph[j]);
                            double zg = ref_sig(px[H + j] + ph[H + j]);
                            double ng = tanh(px[2 * H + j] + rg * ph[2 * H + j]);
                            hv = (1.0 - zg) * ng + zg * hp;
                        } else {
                            double v = px[j] + ph[j];
                            hv = s->mode == 1 ? (v > 0 ? v : 0) : tanh(v);
                        }
                        hn[b * H + j] = hv;
                        out[((size_t)t * B + b) * DH + d * H + j] = hv;
                    }
                }
                memcpy(h, hn, sizeof(double) * (size_t)B * H);
            }
            if (hy)
                memcpy(hy + (size_t)p * B * H, h, sizeof(double) * (size_t)B * H);
            if (cy && s->mode == 2)
                memcpy(cy + (size_t)p * B * H, c, sizeof(double) * (size_t)B * H);
        }
        for (size_t i = 0; i < (size_t)T * B * DH; i++)
            in[i] = out[i] * (masks && l < s->layers - 1 ? masks[l][i] : 1.0);
    }
    memcpy(y, out, sizeof(double) * (size_t)T * B * DH);
    free(in);
    free(out);
    free(h);
    free(c);
    free(hn);
    free(px);
    free(ph);
}

static inline void ref_forward(const ref_shape_t *s, const double *w, int T, int B, const double *x,
                               const double *hx, const double *cx, double *y, double *hy,
                               double *cy)
{
    ref_forward_masked(s, w, T, B, x, hx, cx, y, hy, cy, NULL);
}

/* Deterministic test data in [-a, a]. */
static inline double ref_rand(uint64_t *st, double a)
{
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    return ((double)(*st >> 11) / 9007199254740992.0 * 2.0 - 1.0) * a;
}

#endif
