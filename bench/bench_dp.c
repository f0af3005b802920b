/* bench_dp: a data-parallel LSTM training step on 2 sim devices against the same step on
 * 1 device at the same global batch. The sim backend models each peer copy's
 * cost on its stream (MEMTRACE_SIM_PEER_COST_NS + bytes / MEMTRACE_SIM_PEER_BANDWIDTH,
 * defaults 10 us and 12 GiB/s). A 2-device step: broadcast device 0's flat weights to the
 * replica (one peer copy), forward + backward of half the batch on each device (each on its
 * own thread and stream), the replica's flat gradients back to device 0 (one peer copy)
 * and summed, an SGD step. The goal is one flat copy per replica each way per step: no
 * per-parameter copies. Rounds alternate the two steps; rows print the median of ROUNDS
 * of each after WARM warm-up rounds; compare only ratios taken in one run. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/machine.h"
#include "memtrace/alloc.h"
#include "memtrace/rnn.h"

#define H      256
#define IN     64
#define T      64
#define B      16 /* global batch */
#define ROUNDS 15
#define WARM   3

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) {                                                                                 \
            fprintf(stderr, "bench_dp: %s failed: %s\n", #call, mt_strerror(rc_));                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* One device's share: its module and batch buffers. */
typedef struct dev_s {
    mt_alloc_t *a;
    mt_rnn_t *m;
    int batch;
    float *x, *y, *dy, *dx;
} share_t;

static float *buf(mt_alloc_t *a, size_t n, int tag, float fill)
{
    float *p = NULL;
    CHECK(mt_alloc_malloc(a, n * sizeof(float), NULL, tag, (void **)&p));
    for (size_t i = 0; i < n; i++)
        p[i] = fill * (float)((i * 2654435761u) % 1000) / 1000.0f;
    return p;
}

static void dev_init(share_t *d, mt_alloc_t *a, mt_rnn_t *m, int batch)
{
    d->a = a;
    d->m = m;
    d->batch = batch;
    d->x = buf(a, (size_t)T * batch * IN, MT_TAG_BATCH, 0.5f);
    d->y = buf(a, (size_t)T * batch * H, MT_TAG_ACTIVATIONS, 0);
    d->dy = buf(a, (size_t)T * batch * H, MT_TAG_ACTIVATIONS, 0.01f);
    d->dx = buf(a, (size_t)T * batch * IN, MT_TAG_ACTIVATIONS, 0);
}

static void dev_fini(share_t *d)
{
    float *v[] = {d->x, d->y, d->dy, d->dx};
    for (int i = 0; i < 4; i++)
        mt_alloc_free(d->a, v[i]);
}

static void *fwd_bwd(void *arg)
{
    share_t *d = arg;
    mt_rnn_io_t io = {.seq_len = T, .batch = d->batch, .x = d->x, .y = d->y};
    mt_rnn_reserve_t *res = NULL;
    CHECK(mt_rnn_forward(d->m, &io, &res));
    mt_rnn_grad_io_t g = {.dy = d->dy, .dx = d->dx};
    CHECK(mt_rnn_backward(d->m, &res, &g));
    return NULL;
}

static void sgd(mt_rnn_t *m)
{
    size_t n = 0;
    float *w = mt_rnn_weights(m, &n), *g = mt_rnn_grads(m, NULL);
    for (size_t i = 0; i < n; i++)
        w[i] -= 1e-4f * g[i];
    CHECK(mt_rnn_zero_grads(m));
}

int main(void)
{
    /* A program's choice the library leaves to it: oneDNN's OpenMP team sleeps between
     * calls instead of spinning on cores the cell math needs (docs/blas.md). */
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    mt_bench_print_machine(stdout);
    double load[3] = {0, 0, 0};
    getloadavg(load, 3);
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    char err[256];
    if (mt_backend_cfg_from_env(&bc, err, sizeof err) != 0) {
        fprintf(stderr, "bench_dp: %s\n", err);
        return 2;
    }
    bc.kind = MT_BACKEND_SIM;
    bc.sim_devices = 2;
    mt_backend_t *b0 = NULL, *b1 = NULL;
    CHECK(mt_backend_create(&b0, &bc));
    CHECK(mt_backend_get_device(b0, 1, &b1));
    mt_alloc_t *a0 = NULL, *a1 = NULL;
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b0;
    CHECK(mt_alloc_create(&a0, &ac));
    ac.backend = b1;
    CHECK(mt_alloc_create(&a1, &ac));
    mt_rnn_cfg_t rc = mt_rnn_cfg_default();
    rc.mode = MT_RNN_LSTM;
    rc.input_size = IN;
    rc.hidden_size = H;
    rc.alloc = a0;
    mt_rnn_t *m0 = NULL, *m1 = NULL;
    CHECK(mt_rnn_create(&m0, &rc));
    CHECK(mt_rnn_replicate(m0, a1, &m1));
    size_t nw = 0;
    float *w0 = mt_rnn_weights(m0, &nw), *w1 = mt_rnn_weights(m1, NULL);
    float *g0 = mt_rnn_grads(m0, NULL), *g1 = mt_rnn_grads(m1, NULL);
    size_t wbytes = nw * sizeof(float);
    float *recv = buf(a0, nw, MT_TAG_GRADS, 0);
    printf("bench_dp: LSTM input %d, hidden %d, T %d, global batch %d (2 devices: %d each); "
           "flat weights %.2f MiB in %zu parameters; GEMM %s; load average %.2f %.2f %.2f\n",
           IN, H, T, B, B / 2, (double)wbytes / (1 << 20), mt_rnn_param_count(m0),
           mt_rnn_gemm_info(m0), load[0], load[1], load[2]);

    /* Rounds alternate the 1-device step (whole batch) and the 2-device step (half each),
     * so that both see the same machine load. */
    share_t one, d[2];
    dev_init(&one, a0, m0, B);
    dev_init(&d[0], a0, m0, B / 2);
    dev_init(&d[1], a1, m1, B / 2);
    uint64_t t1[ROUNDS], t2[ROUNDS], tc[ROUNDS];
    mt_backend_counters_t c0a, c1a, c0b, c1b;
    for (int r = 0; r < WARM + ROUNDS; r++) {
        if (r == WARM) {
            mt_backend_counters(b0, &c0a);
            mt_backend_counters(b1, &c1a);
        }
        uint64_t t = mt_bench_now_ns();
        fwd_bwd(&one);
        sgd(m0);
        if (r >= WARM)
            t1[r - WARM] = mt_bench_now_ns() - t;

        t = mt_bench_now_ns();
        CHECK(mt_memcpy_peer_async(b1, w1, 1, w0, 0, wbytes, NULL)); /* broadcast */
        CHECK(mt_stream_synchronize(b1, NULL));
        uint64_t copy = mt_bench_now_ns() - t;
        pthread_t th;
        if (pthread_create(&th, NULL, fwd_bwd, &d[1]) != 0)
            return 1;
        fwd_bwd(&d[0]);
        pthread_join(th, NULL);
        uint64_t tr = mt_bench_now_ns();
        CHECK(mt_memcpy_peer_async(b0, recv, 0, g1, 1, wbytes, NULL)); /* reduce */
        CHECK(mt_stream_synchronize(b0, NULL));
        copy += mt_bench_now_ns() - tr;
        for (size_t i = 0; i < nw; i++)
            g0[i] += recv[i];
        sgd(m0);
        CHECK(mt_rnn_zero_grads(m1));
        if (r >= WARM) {
            t2[r - WARM] = mt_bench_now_ns() - t;
            tc[r - WARM] = copy;
        }
    }
    mt_backend_counters(b0, &c0b);
    mt_backend_counters(b1, &c1b);
    dev_fini(&one);
    dev_fini(&d[0]);
    dev_fini(&d[1]);

    uint64_t copies = c0b.peer_copies + c1b.peer_copies - c0a.peer_copies - c1a.peer_copies;
    uint64_t bytes = c0b.peer_bytes + c1b.peer_bytes - c0a.peer_bytes - c1a.peer_bytes;
    uint64_t mod = c0b.peer_ns + c1b.peer_ns - c0a.peer_ns - c1a.peer_ns;
    double per_copies = (double)copies / ROUNDS, per_mib = (double)bytes / ROUNDS / (1 << 20);
    uint64_t m1s = mt_bench_median(t1, ROUNDS), m2s = mt_bench_median(t2, ROUNDS),
             mcs = mt_bench_median(tc, ROUNDS);
    printf("\n%-44s %12s\n", "row", "median");
    printf("%-44s %9.3f ms\n", "1-device step (batch 16)", m1s / 1e6);
    printf("%-44s %9.3f ms   (x%.2f of 1 device)\n", "2-device data-parallel step (8 + 8)",
           m2s / 1e6, (double)m2s / (double)m1s);
    printf("%-44s %9.3f ms   (%.1f %% of the step; modelled %.3f ms)\n",
           "  of which in peer copies (wall)", mcs / 1e6, 100.0 * (double)mcs / (double)m2s,
           (double)mod / ROUNDS / 1e6);
    printf("%-44s %9.1f      (%.2f MiB; flat weights %.2f MiB each way)\n",
           "  peer copies per step", per_copies, per_mib, (double)wbytes / (1 << 20));
    bool met = per_copies == 2.0 && bytes == 2 * wbytes * (uint64_t)ROUNDS;
    printf("goal: one flat copy per replica each way per step (2 copies, %zu parameters never "
           "copied one by one): %s\n",
           mt_rnn_param_count(m0), met ? "met" : "NOT met");

    mt_alloc_free(a0, recv);
    mt_rnn_destroy(&m1);
    mt_rnn_destroy(&m0);
    mt_alloc_destroy(&a1);
    mt_alloc_destroy(&a0);
    mt_backend_destroy(&b0);
    return met ? 0 : 1;
}
