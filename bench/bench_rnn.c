/* bench_rnn: training-step time of the RNN engine's CPU path and its activation memory.
 *
 * For each shape: one warm-up step, then --iters timed steps (forward in training mode +
 * backward for data and weights) on the sim backend. Prints ms per step, tokens/s, the
 * activation bytes the engine keeps per time step (measured: the activations tag while the
 * reserve is live, plus the output y it reads back) next to the op-by-op estimate
 * (mt_rnn_act_t), and the anchors of design.md §2: a fused LSTM keeps ~5-6 H-vectors per
 * (step, batch element), an op-by-op autograd cell 18+. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "memtrace/alloc.h"
#include "memtrace/rnn.h"

typedef struct shape_s {
    int mode, T, B, in, H, L;
    bool bi;
    bool rebind;   /* U1: weight_hh_l0 lives outside the flat buffer, so every call compacts */
    float dropout; /* between layers (training): masks regenerated in backward, none kept */
} shape_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fail(const char *what, int rc)
{
    fprintf(stderr, "bench_rnn: %s: %s\n", what, mt_strerror(rc));
    exit(1);
}

static float *buf(mt_alloc_t *a, size_t n, int tag, unsigned seed)
{
    float *p;
    int rc = mt_alloc_malloc(a, n * sizeof(float), NULL, tag, (void **)&p);
    if (rc)
        fail("malloc", rc);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = seed ? (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f : 0.0f;
    }
    return p;
}

static void run(mt_alloc_t *a, const shape_t *s, int iters)
{
    mt_rnn_cfg_t c = mt_rnn_cfg_default();
    c.mode = s->mode;
    c.input_size = s->in;
    c.hidden_size = s->H;
    c.num_layers = s->L;
    c.bidirectional = s->bi;
    c.dropout = s->dropout;
    c.alloc = a;
    mt_rnn_t *m;
    int rc = mt_rnn_create(&m, &c);
    if (rc)
        fail("mt_rnn_create", rc);
    float *moved = NULL;
    if (s->rebind) {
        mt_rnn_param_t p;
        if ((rc = mt_rnn_param_find(m, "weight_hh_l0", &p)))
            fail("param", rc);
        moved = buf(a, p.numel, MT_TAG_WEIGHTS, 0);
        memcpy(moved, p.data, p.numel * sizeof(float));
        if ((rc = mt_rnn_bind_param(m, p.name, moved)))
            fail("bind", rc);
    }
    int D = s->bi ? 2 : 1;
    size_t nx = (size_t)s->T * s->B * s->in, ny = (size_t)s->T * s->B * D * s->H;
    float *x = buf(a, nx, MT_TAG_BATCH, 1), *y = buf(a, ny, MT_TAG_ACTIVATIONS, 0);
    float *dy = buf(a, ny, MT_TAG_ACTIVATIONS, 2), *dx = buf(a, nx, MT_TAG_BATCH, 0);
    mt_rnn_io_t io = {.seq_len = s->T,
                      .batch = s->B,
                      .x = x,
                      .y = y,
                      .hx = NULL,
                      .cx = NULL,
                      .hy = NULL,
                      .cy = NULL};
    mt_rnn_grad_io_t g = {.dy = dy, .dx = dx};
    double tf = 0, tb = 0;
    int64_t kept = 0;
    for (int it = 0; it <= iters; it++) {
        mt_alloc_stats_t st0, st1;
        mt_alloc_stats(a, &st0);
        double t0 = now_s();
        mt_rnn_reserve_t *res;
        if ((rc = mt_rnn_forward(m, &io, &res)))
            fail("forward", rc);
        double t1 = now_s();
        mt_alloc_stats(a, &st1);
        if ((rc = mt_rnn_backward(m, &res, &g)))
            fail("backward", rc);
        double t2 = now_s();
        if (it > 0) { /* iteration 0 warms the caches */
            tf += t1 - t0;
            tb += t2 - t1;
        }
        kept = st1.tag_requested_bytes[MT_TAG_ACTIVATIONS].current -
               st0.tag_requested_bytes[MT_TAG_ACTIVATIONS].current;
    }
    mt_rnn_act_t act;
    mt_rnn_activation_bytes(m, s->T, s->B, &act);
    /* Kept per time step: the reserve plus y, which backward reads back. */
    double kept_step = (double)kept / s->T + (double)ny * sizeof(float) / s->T;
    double hvec = kept_step / ((double)s->B * s->H * s->L * D * sizeof(float));
    double step = (tf + tb) / iters;
    char name[16];
    snprintf(name, sizeof name, "%s%s%s", mt_rnn_mode_name(s->mode), s->rebind ? "*" : "",
             s->dropout > 0.0f ? "+" : "");
    printf("%-8s %4d %3d %4d %4d %2d %3s | %8.1f %8.1f %8.1f %9.0f | %9.1f %6.2f %9.1f %5.1f\n",
           name, s->T, s->B, s->in, s->H, s->L, s->bi ? "bi" : "uni", 1e3 * tf / iters,
           1e3 * tb / iters, 1e3 * step, (double)s->T * s->B / step, kept_step / 1024.0, hvec,
           (double)act.opbyop_bytes_per_step / 1024.0, act.opbyop_hvec);
    if (s->dropout > 0.0f)
        printf("  + dropout %g between the layers (the op-by-op estimate adds the dropped outputs "
               "and masks)\n",
               (double)s->dropout);
    if (s->rebind) {
        mt_rnn_stats_t rs;
        mt_rnn_stats(m, &rs);
        printf("  * weights not flat (U1): %llu compactions, %.2f MiB copied per train step\n",
               (unsigned long long)rs.compactions,
               (double)rs.compacted_bytes / (iters + 1) / (1024.0 * 1024.0));
        mt_alloc_free(a, moved);
    }
    fflush(stdout);
    mt_alloc_free(a, x);
    mt_alloc_free(a, y);
    mt_alloc_free(a, dy);
    mt_alloc_free(a, dx);
    mt_rnn_destroy(&m);
}

int main(int argc, char **argv)
{
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    if (argc > 1 && !quick) {
        printf("usage: bench_rnn [--quick]\n");
        return strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    mt_backend_t *b;
    int rc = mt_backend_create(&b, &bc);
    if (rc)
        fail("backend", rc);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    mt_alloc_t *a;
    if ((rc = mt_alloc_create(&a, &ac)))
        fail("allocator", rc);

    static const shape_t full[] = {
        {MT_RNN_LSTM, 100, 32, 256, 256, 2, false, false, 0.0f},
        {MT_RNN_LSTM, 100, 32, 256, 256, 2, false, true, 0.0f},
        {MT_RNN_LSTM, 100, 32, 256, 256, 2, false, false, 0.3f},
        {MT_RNN_LSTM, 100, 32, 512, 512, 2, false, false, 0.0f},
        {MT_RNN_LSTM, 100, 32, 256, 256, 2, true, false, 0.0f},
        {MT_RNN_GRU, 100, 32, 256, 256, 2, false, false, 0.0f},
        {MT_RNN_TANH, 100, 32, 256, 256, 2, false, false, 0.0f},
    };
    static const shape_t small[] = {
        {MT_RNN_LSTM, 50, 16, 128, 128, 2, false, false, 0.0f},
        {MT_RNN_LSTM, 50, 16, 128, 128, 2, false, true, 0.0f},
        {MT_RNN_LSTM, 50, 16, 128, 128, 2, false, false, 0.3f},
        {MT_RNN_GRU, 50, 16, 128, 128, 2, false, false, 0.0f},
    };
    const shape_t *shapes = quick ? small : full;
    size_t n = quick ? sizeof small / sizeof small[0] : sizeof full / sizeof full[0];
    int iters = quick ? 2 : 3;

    printf("RNN engine, CPU path (CBLAS) on the %s backend; %d timed train steps per shape\n",
           mt_backend_name(b), iters);
    printf("%-8s %4s %3s %4s %4s %2s %3s | %8s %8s %8s %9s | %9s %6s %9s %5s\n", "mode", "T", "B",
           "in", "H", "L", "dir", "fwd ms", "bwd ms", "step ms", "tokens/s", "kept KiB", "Hvec",
           "opbyop", "Hvec");
    for (size_t i = 0; i < n; i++)
        run(a, &shapes[i], iters);
    printf("\n'kept' = activation bytes per time step (all layers, the batch) that a training\n"
           "forward holds for backward, measured on the allocator's activations tag, plus y;\n"
           "'Hvec' = the same in H-vectors per (step, batch element, layer, direction).\n"
           "Anchors (design.md section 2): a fused LSTM keeps ~5-6 H-vectors, an op-by-op\n"
           "autograd cell 18+ (our estimate: LSTM 21, GRU 17, RNN 4; formula in rnn.h).\n");
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    return 0;
}
