/* Host-side benchmark, on the sim backend, where copies are real memcpy on the
 * streams' worker threads and "compute" is real CPU work queued on the compute stream:
 *   1. prefetcher step time with the copy on a side stream (overlap) and on the compute
 *      stream (serial), for a copy-heavy batch; anchors: copy alone, compute alone, and the
 *      ideal overlapped step max(copy, compute);
 *   2. parameter paging: time per task switch when every set is resident, when every
 *      activation misses, and when the next set is prefetched during the current compute;
 *   3. activation offload (an engine option): peak device activation bytes and training
 *      step time of an LSTM without offload and with windows of 1, 2, 4 reserve chunks, and
 *      whether the gradients are bit-identical to the plain run.
 * Goals are printed beside the figures. Timings come from a machine shared with other
 * work: each figure is the median of several repetitions. Only a release build counts.
 *
 * usage: bench_host [--quick] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/machine.h"
#include "memtrace/host.h"

#define MIB ((size_t)1 << 20)

#define OVERLAP_GOAL      1.15 /* overlapped step <= 1.15 x max(copy, compute) */
#define PREFETCH_GOAL     0.75 /* prefetched miss costs <= 75 % of an unprefetched miss */
#define OFFLOAD_TIME_GOAL 1.30 /* offloaded step <= 1.3 x the plain step */

static int reps = 5;

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_host: %s: %s\n", what, mt_strerror(rc));
    exit(1);
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0)                                                                              \
            die(#call, rc_);                                                                       \
    } while (0)

typedef struct env_s {
    mt_backend_t *b;
    mt_alloc_t *a;
    mt_host_cache_t *h;
    mt_stream_t *compute;
} env_t;

static void env_init(env_t *e)
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = (size_t)2 << 30;
    CHECK(mt_backend_create(&e->b, &bc));
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = e->b;
    CHECK(mt_alloc_create(&e->a, &ac));
    mt_host_cfg_t hc = mt_host_cfg_default();
    hc.backend = e->b;
    hc.capacity = (size_t)1 << 30;
    CHECK(mt_host_cache_create(&e->h, &hc));
    CHECK(mt_stream_create(e->b, &e->compute));
}

static void env_fini(env_t *e)
{
    CHECK(mt_device_synchronize(e->b));
    mt_stream_destroy(e->b, &e->compute);
    mt_host_cache_destroy(&e->h);
    mt_alloc_destroy(&e->a);
    mt_backend_destroy(&e->b);
}

/* ---- 1. prefetcher ---- */

typedef struct work_s {
    const float *data;
    size_t n;
    int passes;
    uint64_t sleep_ns; /* > 0: a modelled device kernel that does not use a host core */
    volatile float sink;
} work_t;

/* The "kernel": passes over the batch with a little arithmetic per element, or (modelled
 * device kernel) a sleep, as a GPU kernel occupies the device but no host core. */
static void compute_fn(void *ud)
{
    work_t *w = ud;
    if (w->sleep_ns != 0) {
        struct timespec ts = {.tv_sec = (time_t)(w->sleep_ns / 1000000000u),
                              .tv_nsec = (long)(w->sleep_ns % 1000000000u)};
        nanosleep(&ts, NULL);
        return;
    }
    float acc = 0.0f;
    for (int p = 0; p < w->passes; p++)
        for (size_t i = 0; i < w->n; i++)
            acc = acc * 0.999f + w->data[i];
    w->sink = acc;
}

static int fill_header(void *ud, uint64_t index, void *dst, size_t bytes)
{
    (void)ud;
    (void)bytes;
    memcpy(dst, &index, sizeof index); /* staging already holds a pinned dataset */
    return 0;
}

static uint64_t time_copy(env_t *e, void *dev, void *pinned, size_t bytes)
{
    uint64_t t[16];
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = mt_bench_now_ns();
        CHECK(mt_memcpy_async(e->b, dev, pinned, bytes, MT_MEMCPY_HOST_TO_DEVICE, e->compute));
        CHECK(mt_stream_synchronize(e->b, e->compute));
        t[r] = mt_bench_now_ns() - t0;
    }
    return mt_bench_median(t, reps);
}

static uint64_t time_compute(env_t *e, work_t *w)
{
    uint64_t t[16];
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = mt_bench_now_ns();
        CHECK(mt_stream_launch_host_func(e->b, e->compute, compute_fn, w));
        CHECK(mt_stream_synchronize(e->b, e->compute));
        t[r] = mt_bench_now_ns() - t0;
    }
    return mt_bench_median(t, reps);
}

static uint64_t time_loader(env_t *e, size_t bytes, const work_t *tmpl, bool overlap, int steps)
{
    mt_prefetch_cfg_t pc = mt_prefetch_cfg_default();
    pc.alloc = e->a;
    pc.host = e->h;
    pc.compute = e->compute;
    pc.batch_bytes = bytes;
    pc.overlap = overlap;
    mt_prefetch_t *p = NULL;
    CHECK(mt_prefetch_create(&p, &pc));
    work_t *w = calloc((size_t)steps, sizeof *w);
    uint64_t t[16];
    for (int r = 0; r < reps; r++) {
        CHECK(mt_device_synchronize(e->b));
        uint64_t t0 = mt_bench_now_ns();
        int submitted = 0;
        for (; submitted < 2; submitted++)
            CHECK(mt_prefetch_submit_fill(p, bytes, fill_header, NULL));
        for (int k = 0; k < steps; k++) {
            mt_prefetch_batch_t bt;
            CHECK(mt_prefetch_next(p, &bt));
            w[k] = *tmpl;
            w[k].data = bt.data;
            CHECK(mt_stream_launch_host_func(e->b, e->compute, compute_fn, &w[k]));
            CHECK(mt_prefetch_release(p, &bt));
            if (submitted < steps) {
                CHECK(mt_prefetch_submit_fill(p, bytes, fill_header, NULL));
                submitted++;
            }
        }
        CHECK(mt_stream_synchronize(e->b, e->compute));
        t[r] = (mt_bench_now_ns() - t0) / (uint64_t)steps;
    }
    mt_prefetch_destroy(&p);
    free(w);
    return mt_bench_median(t, reps);
}

static void bench_prefetch(bool quick)
{
    env_t e;
    env_init(&e);
    const size_t bytes = (quick ? 8 : 32) * MIB;
    const int steps = quick ? 6 : 12;
    void *dev = NULL, *pinned = NULL;
    CHECK(mt_alloc_malloc(e.a, bytes, e.compute, MT_TAG_BATCH, &dev));
    CHECK(mt_host_malloc(e.h, bytes, MT_TAG_BATCH, &pinned));
    memset(pinned, 1, bytes);
    memset(dev, 1, bytes);
    uint64_t copy = time_copy(&e, dev, pinned, bytes);
    work_t w1 = {.data = dev, .n = bytes / sizeof(float), .passes = 1};
    uint64_t pass = time_compute(&e, &w1);
    /* Compute about as long as the copy (over a prefix of the batch, or several passes):
     * the case where overlap matters most, with an ideal speed-up of 2. */
    size_t nel = bytes / sizeof(float);
    double want = (double)copy / (double)(pass ? pass : 1) * (double)nel;
    int passes = 1;
    size_t n = nel;
    if (want < (double)nel)
        n = want < 1024 ? 1024 : (size_t)want;
    else
        passes = (int)(want / (double)nel + 0.5);
    work_t wn = {.data = dev, .n = n, .passes = passes};
    uint64_t comp = time_compute(&e, &wn);
    CHECK(mt_host_free(e.h, pinned));
    CHECK(mt_alloc_free(e.a, dev));

    work_t kern = {.data = NULL, .sleep_ns = copy};
    uint64_t kcomp = time_compute(&e, &kern);
    printf("\n## 1. Prefetcher: %zu MiB batch, %d steps (median of %d)\n\n", bytes >> 20, steps,
           reps);
    printf("copy alone (H2D from pinned): %.2f ms (%.2f GB/s). Compute is either real CPU work "
           "on the compute stream's thread (%d x %zu floats, %.2f ms; it competes with the copy "
           "thread for this machine's cores) or a modelled device kernel (a sleep of the copy's "
           "duration, %.2f ms: busy device, idle host core, as on a GPU).\n\n",
           copy / 1e6, (double)bytes / (double)copy, passes, n, comp / 1e6, kcomp / 1e6);
    printf("| compute            | serial (copy on compute stream) | overlap (side stream) | "
           "speed-up | ideal max(copy, compute) | overlap / ideal | goal <= %.2f |\n",
           OVERLAP_GOAL);
    printf(
        "|--------------------|------------|------------|-------|------------|-------|------|\n");
    const work_t *tm[2] = {&kern, &wn};
    const uint64_t cm[2] = {kcomp, comp};
    const char *names[2] = {"modelled kernel", "CPU work"};
    for (int i = 0; i < 2; i++) {
        uint64_t serial = time_loader(&e, bytes, tm[i], false, steps);
        uint64_t over = time_loader(&e, bytes, tm[i], true, steps);
        uint64_t ideal = copy > cm[i] ? copy : cm[i];
        double ratio = (double)over / (double)ideal;
        /* The goal is for the GPU-like case. With CPU work, the sim's copy thread and the
         * compute share this machine's cores: that row is informative only. */
        const char *verdict = i == 1 ? "informative" : ratio <= OVERLAP_GOAL ? "met" : "NOT met";
        printf("| %-18s | %7.2f ms | %7.2f ms | %.2fx | %7.2f ms | %.2f | %s |\n", names[i],
               serial / 1e6, over / 1e6, (double)serial / (double)over, ideal / 1e6, ratio,
               verdict);
    }
    env_fini(&e);
}

/* ---- 2. parameter paging ---- */

typedef struct pstep_s {
    const float *w;
    float *g;
    size_t n;
} pstep_t;

static void grad_fn(void *ud)
{
    pstep_t *s = ud;
    for (size_t i = 0; i < s->n; i++)
        s->g[i] += s->w[i] * 0.001f + 1.0f;
}

typedef struct page_res_s {
    uint64_t per_switch;
    mt_param_pager_stats_t st;
} page_res_t;

static page_res_t time_paging(env_t *e, size_t nparams, unsigned ntasks, unsigned cache,
                              bool prefetch, int switches)
{
    mt_param_pager_cfg_t pc = mt_param_pager_cfg_default();
    pc.alloc = e->a;
    pc.host = e->h;
    pc.compute = e->compute;
    pc.ntasks = ntasks;
    pc.nparams = nparams;
    pc.cache_sets = cache;
    pstep_t *steps = calloc((size_t)switches, sizeof *steps);
    uint64_t t[16];
    page_res_t out;
    for (int r = 0; r < reps; r++) {
        mt_param_pager_t *p = NULL;
        CHECK(mt_param_pager_create(&p, &pc));
        /* Warm: every set visited once, so the resident case starts resident. */
        for (unsigned k = 0; k < ntasks; k++) {
            float *dw, *dg;
            CHECK(mt_param_pager_activate(p, k, &dw, &dg));
            CHECK(mt_param_pager_deactivate(p, k));
        }
        CHECK(mt_device_synchronize(e->b));
        uint64_t t0 = mt_bench_now_ns();
        for (int s = 0; s < switches; s++) {
            unsigned task = (unsigned)s % ntasks;
            float *dw, *dg;
            CHECK(mt_param_pager_activate(p, task, &dw, &dg));
            if (prefetch)
                CHECK(mt_param_pager_prefetch(p, (task + 1) % ntasks));
            steps[s] = (pstep_t){dw, dg, nparams};
            CHECK(mt_stream_launch_host_func(e->b, e->compute, grad_fn, &steps[s]));
            CHECK(mt_param_pager_deactivate(p, task));
        }
        for (unsigned k = 0; k < ntasks; k++)
            CHECK(mt_param_pager_host_wait(p, k));
        CHECK(mt_stream_synchronize(e->b, e->compute));
        t[r] = (mt_bench_now_ns() - t0) / (uint64_t)switches;
        mt_param_pager_stats(p, &out.st);
        mt_param_pager_destroy(&p);
    }
    free(steps);
    out.per_switch = mt_bench_median(t, reps);
    return out;
}

static void bench_paging(bool quick)
{
    env_t e;
    env_init(&e);
    const size_t nparams = (quick ? 4 : 16) * MIB / sizeof(float);
    const unsigned T = 4;
    const int switches = quick ? 8 : 16;
    page_res_t hit = time_paging(&e, nparams, T, T, false, switches);
    page_res_t miss = time_paging(&e, nparams, T, 2, false, switches);
    page_res_t pre = time_paging(&e, nparams, T, 2, true, switches);
    size_t set = nparams * sizeof(float);
    double extra_miss = (double)miss.per_switch - (double)hit.per_switch;
    double extra_pre = (double)pre.per_switch - (double)hit.per_switch;
    printf("\n## 2. Parameter paging: %u tasks of %zu MiB, device cache of 2 sets, %d switches "
           "(median of %d)\n\n",
           T, set >> 20, switches, reps);
    printf("| case                                   | per switch | uploads | hits | max resident "
           "|\n");
    printf("|----------------------------------------|------------|---------|------|--------------|"
           "\n");
    printf("| all sets resident (cache = %u)          | %7.2f ms | %7llu | %4llu | %12u |\n", T,
           hit.per_switch / 1e6, (unsigned long long)hit.st.uploads,
           (unsigned long long)hit.st.hits, hit.st.max_resident);
    printf("| every activation misses (LRU, cache 2) | %7.2f ms | %7llu | %4llu | %12u |\n",
           miss.per_switch / 1e6, (unsigned long long)miss.st.uploads,
           (unsigned long long)miss.st.hits, miss.st.max_resident);
    printf("| misses, next set prefetched            | %7.2f ms | %7llu | %4llu | %12u |\n",
           pre.per_switch / 1e6, (unsigned long long)pre.st.uploads,
           (unsigned long long)pre.st.hits, pre.st.max_resident);
    double share = extra_miss > 0 ? extra_pre / extra_miss : 0.0;
    printf("\ncost of paging per switch over resident: %.2f ms unprefetched, %.2f ms prefetched "
           "(%.0f %%; goal <= %.0f %%: %s). Every switch also writes the gradients back (%zu "
           "MiB D2H + host accumulate).\n",
           extra_miss / 1e6, extra_pre / 1e6, share * 100, PREFETCH_GOAL * 100,
           share <= PREFETCH_GOAL ? "met" : "NOT met", set >> 20);
    env_fini(&e);
}

/* ---- 3. activation offload ---- */

typedef struct off_res_s {
    uint64_t step;
    size_t peak;   /* allocator peak of activations-tagged bytes */
    size_t pinned; /* host cache's pinned bytes after the run */
    float *dw;     /* gradients of one pass (malloc) */
    mt_rnn_stats_t st;
} off_res_t;

/* One training pass of m with the given window (0 = plain); fills o's figures of the pass. */
static uint64_t offload_pass(env_t *e, mt_rnn_t *m, const mt_rnn_io_t *io,
                             const mt_rnn_grad_io_t *g, int window, off_res_t *o)
{
    CHECK(mt_rnn_set_offload(m, window > 0 ? e->h : NULL, window));
    CHECK(mt_rnn_zero_grads(m));
    mt_rnn_stats_t before;
    CHECK(mt_rnn_stats(m, &before));
    mt_alloc_reset_peak(e->a);
    uint64_t t0 = mt_bench_now_ns();
    mt_rnn_reserve_t *res = NULL;
    CHECK(mt_rnn_forward(m, io, &res));
    CHECK(mt_rnn_backward(m, &res, g));
    uint64_t t = mt_bench_now_ns() - t0;
    mt_alloc_stats_t st;
    CHECK(mt_alloc_stats(e->a, &st));
    o->peak = (size_t)st.tag_allocated_bytes[MT_TAG_ACTIVATIONS].peak;
    CHECK(mt_rnn_stats(m, &o->st));
    o->st.offload_bytes -= before.offload_bytes;
    size_t nw;
    const float *dw = mt_rnn_grads(m, &nw);
    if (!o->dw && !(o->dw = malloc(nw * sizeof(float))))
        die("malloc", MT_ENOMEM);
    memcpy(o->dw, dw, nw * sizeof(float));
    o->pinned = mt_host_cache_pinned_bytes(e->h);
    return t;
}

/* The cases' passes interleaved repetition by repetition, so that the load of the shared
 * machine drifts over all of them alike; each step time is the median. */
static void time_offload(env_t *e, mt_rnn_t *m, const mt_rnn_io_t *io, const mt_rnn_grad_io_t *g,
                         const int *windows, int ncases, off_res_t *out)
{
    uint64_t t[8][16];
    memset(out, 0, (size_t)ncases * sizeof *out);
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < ncases; i++)
            t[i][r] = offload_pass(e, m, io, g, windows[i], &out[i]);
    for (int i = 0; i < ncases; i++)
        out[i].step = mt_bench_median(t[i], reps);
}

static float *dev_floats(env_t *e, size_t n)
{
    float *d = NULL;
    CHECK(mt_alloc_malloc(e->a, n * sizeof(float), NULL, MT_TAG_BATCH, (void **)&d));
    for (size_t i = 0; i < n; i++)
        d[i] = (float)((i * 2654435761u) % 1000u) / 1000.0f - 0.5f;
    return d;
}

static void bench_offload(bool quick)
{
    env_t e;
    env_init(&e);
    const int T = quick ? 128 : 256, B = 16, I = 64, H = quick ? 128 : 256, L = 2, chunk = 16;
    mt_rnn_cfg_t rc = mt_rnn_cfg_default();
    rc.mode = MT_RNN_LSTM;
    rc.input_size = I;
    rc.hidden_size = H;
    rc.num_layers = L;
    rc.chunk_steps = chunk;
    rc.alloc = e.a;
    mt_rnn_t *m = NULL;
    CHECK(mt_rnn_create(&m, &rc));
    size_t nw;
    mt_rnn_weights(m, &nw);
    float *x = dev_floats(&e, (size_t)T * B * I);
    float *y = dev_floats(&e, (size_t)T * B * H);
    float *dy = dev_floats(&e, (size_t)T * B * H);
    float *dx = dev_floats(&e, (size_t)T * B * I);
    mt_rnn_io_t io = {.seq_len = T, .batch = B, .x = x, .y = y};
    mt_rnn_grad_io_t g = {.dy = dy, .dx = dx};
    enum { NCASES = 4 };
    int windows[NCASES] = {0, 1, 2, 4}; /* none, then offload windows */
    off_res_t res[NCASES];
    time_offload(&e, m, &io, &g, windows, NCASES, res);
    off_res_t none = res[0], *w = res + 1;
    size_t full = none.st.pass_reserve_bytes;
    double chunk_mib = (double)full / T * chunk / (double)MIB;
    printf("\n## 3. Activation offload: LSTM L=%d, H=%d, B=%d, T=%d, chunks of %d steps (%.2f "
           "MiB of reserve each; median of %d)\n\n",
           L, H, B, T, chunk, chunk_mib, reps);
    printf("| case              | peak device activations (reserve) | step time | "
           "offloaded/step | gradients vs none | goal |\n");
    printf("|-------------------|-----------------------------------|-----------|"
           "----------------|-------------------|------|\n");
    printf("| none              | %9.2f MiB (%9.2f MiB)   | %6.2f ms | %10s     | %17s | "
           "anchor: the whole reserve, %.2f MiB |\n",
           none.peak / (double)MIB, none.st.pass_reserve_peak_bytes / (double)MIB, none.step / 1e6,
           "-", "-", full / (double)MIB);
    for (int i = 0; i < 3; i++) {
        int win = windows[i + 1];
        double goal_peak = (win + 1) * chunk_mib;
        double ratio = (double)w[i].step / (double)none.step;
        bool same = memcmp(w[i].dw, none.dw, nw * sizeof(float)) == 0;
        printf("| window %d chunk(s) | %9.2f MiB (%9.2f MiB)   | %6.2f ms | %10.2f MiB | %17s "
               "| peak <= (window+1) chunks = %.2f MiB: %s; time x%.2f of none (<= %.2f: %s) "
               "|\n",
               win, w[i].peak / (double)MIB, w[i].st.pass_reserve_peak_bytes / (double)MIB,
               w[i].step / 1e6, w[i].st.offload_bytes / (double)MIB,
               same ? "bit-identical" : "DIFFERENT", goal_peak,
               w[i].peak / (double)MIB <= goal_peak ? "met" : "NOT met", ratio, OFFLOAD_TIME_GOAL,
               ratio <= OFFLOAD_TIME_GOAL ? "met" : "NOT met");
    }
    printf("\npinned host memory held by the cache after the runs: %.2f MiB\n",
           w[2].pinned / (double)MIB);
    for (int i = 0; i < NCASES; i++)
        free(res[i].dw);
    float *bufs[] = {x, y, dy, dx};
    for (int i = 0; i < 4; i++)
        CHECK(mt_alloc_free(e.a, bufs[i]));
    mt_rnn_destroy(&m);
    env_fini(&e);
}

int main(int argc, char **argv)
{
    /* A program's choice the library leaves to it: oneDNN's OpenMP team sleeps between
     * calls instead of spinning on cores the cell math needs (docs/blas.md). */
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    if (quick)
        reps = 3;
    printf("# bench_host: pinned host cache, prefetch, paging, activation offload (sim)\n");
    mt_bench_print_machine(stdout);
    bench_prefetch(quick);
    bench_paging(quick);
    bench_offload(quick);
    return 0;
}
