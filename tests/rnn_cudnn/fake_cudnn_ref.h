/* The fake cuDNN's arithmetic: a plain reference RNN (LSTM, GRU linear-before-reset, RNN
 * tanh/relu; layers; bidirectional; bias; per-sequence lengths), written from cuDNN's
 * documented formulas, independently of the engine's rnn/ code. Every matrix and bias is
 * read where the fake's cudnnGetRNNWeightParams says it is (mat[], bias[]), so a layout,
 * gate-order or orientation mistake in the caller shows up as wrong numbers.
 *
 * Reserve (floats, written by forward, read by backward): for pseudo-layer p and token row r,
 * act[(p * tokens + r) * ref_act_width + k] with k in [0, g H) the gate activations (LSTM
 * i f g o, GRU r z n, RNN h), [g H, (g + 1) H) LSTM's c or GRU's R_n h + b_Rn, and
 * [(g + 1) H, (g + 2) H) h; then dpre[(p * tokens + r) * g H + k], the gradients of the
 * gates' pre-activations backward data leaves for backward weights; then a byte per element
 * of the dropout masks of layers 0 .. L - 2 (1 kept, 0 dropped). */
#ifndef MT_TESTS_RNN_CUDNN_FAKE_CUDNN_REF_H
#define MT_TESTS_RNN_CUDNN_FAKE_CUDNN_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum fref_cell_e { FREF_TANH, FREF_RELU, FREF_LSTM, FREF_GRU } fref_cell_e;

typedef struct fref_s {
    fref_cell_e cell;
    int g, H, L, D, in;  /* gates, hidden, layers, directions, input size */
    const float **mat;   /* [p * 2g + id]: W_0..W_{g-1}, R_0..R_{g-1} ([H x cols] row-major) */
    const float **bias;  /* [p * 2g + id], NULL entries without bias */
    int T, B;            /* max length, batch */
    const int *lens;     /* [B] */
    const long *row;     /* [t * B + b]: token row of (t, b), -1 past the sequence's end */
    size_t tokens;       /* rows of x and y */
    float drop_scale;    /* 1 / (1 - p) */
    const uint8_t *mask; /* dropout masks or NULL */
} fref_t;

/* Floats per (pseudo-layer, row) of the forward's part of the reserve. */
size_t fref_act_width(const fref_t *n);
/* Floats of the reserve's act and dpre parts; bytes of the masks. */
size_t fref_act_floats(const fref_t *n);
size_t fref_dpre_floats(const fref_t *n);
size_t fref_mask_bytes(const fref_t *n);

/* y [tokens, D H]; hx, cx, hy, cy [L D, B, H] (NULL: zeros / not written). */
void fref_forward(const fref_t *n, const float *x, float *y, const float *hx, const float *cx,
                  float *hy, float *cy, float *act);
/* dx [tokens, in]; the top layer's h is read from y, as cuDNN reads it. */
void fref_backward_data(const fref_t *n, const float *y, const float *dy, float *dx,
                        const float *hx, const float *dhy, float *dhx, const float *cx,
                        const float *dcy, float *dcx, const float *act, float *dpre);
/* Adds the weight gradients into dmat/dbias (laid out as mat/bias). */
void fref_backward_weights(const fref_t *n, const float *x, const float *hx, const float *y,
                           const float *act, const float *dpre, float **dmat, float **dbias);

#endif
