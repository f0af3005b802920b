/* bench_prof: what recording costs the program (the goal: on an allocation-heavy
 * loop of cached alloc+free pairs, recording on costs <= 5 % over recording off and
 * <= 50 ns per event).
 *
 * Configurations, each on a fresh sim backend + caching allocator, same loop:
 *   off         no sink: the allocator neither stamps nor emits events
 *   profiler off the sink of a profiler created off (MEMTRACE_PROF=off): dropped by the
 *               allocator at create, so it must cost what "off" costs
 *   ring        the profiler's ring, read by a consumer thread that only drains, as the
 *               daemon does from its own process (the production path)
 *   local log   the profiler in log mode: its drainer thread encodes JSON to /dev/null
 *               (the no-daemon fallback; drops are counted when the encoder falls behind)
 *   stacks      the ring path with call stacks, sampled (the default) and all:
 *               unwinding (libunwind), interning and the stack_ref record, on the
 *               allocating thread
 * plus the ring's push alone (no allocator), with a draining consumer, and the event clock
 * alone; then the call-stack rows: stacks=all through a 10-deep recursion built without
 * frame pointers, and the table's memory for 1 M distinct stacks. The same configurations then time
 * LSTM training steps through the RNN engine: a workload that computes between its allocations, as
 * programs do. Rounds alternate the configurations and the best (lowest) time of each is kept,
 * which filters out the noise of a shared machine; the drops shown are those of that round. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/machine.h"
#include "memtrace/alloc.h"
#include "memtrace/prof.h"
#include "memtrace/rnn.h"
#include "allocator/internal.h"
#include "profiler/ring.h"
#include "profiler/stack.h"
#include "bench/stack_deep.h"
#include <sys/mman.h>
#include <sys/stat.h>

#define PAIRS  400000
#define ROUNDS 5
#define PUSHES 2000000

/* ---- a consumer thread draining a ring, as the daemon does ---- */

typedef struct reader_s {
    mt__ring_t *ring;
    _Atomic int stop;
    uint64_t seen;
    pthread_t th;
} reader_t;

static void count_cb(void *ud, const mt_event_rec_t *ev)
{
    if (ev->kind != MT_EV_GAP)
        ((reader_t *)ud)->seen++;
}

static void *reader_main(void *arg)
{
    reader_t *r = arg;
    /* Like the daemon: on each timer tick (1 ms), read everything published. */
    while (!atomic_load(&r->stop)) {
        while (mt__ring_drain(r->ring, count_cb, r, 65536) > 0) {
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    while (mt__ring_drain(r->ring, count_cb, r, SIZE_MAX) > 0) {
    }
    return NULL;
}

static void null_emit(void *ud, const mt_event_rec_t *ev)
{
    (*(uint64_t *)ud)++;
    (void)ev;
}

/* The empty sink takes batches as the profiler's does (claim, write, write_batch), so that
 * its row is the allocator's side of that path: the events counted, nothing copied. */
static bool null_claim(void *ud, size_t n, uint64_t tok[2])
{
    tok[0] = tok[1] = 0;
    *(uint64_t *)ud += n;
    return true;
}

static void null_write(void *ud, const uint64_t tok[2], const mt_event_rec_t *ev, size_t n)
{
    (void)ud, (void)tok, (void)ev, (void)n;
}

static void null_write_batch(void *ud, const uint64_t tok[2], const void *h, const void *e)
{
    (void)ud, (void)tok, (void)h, (void)e;
}

static void ring_sink(void *ud, const mt_event_rec_t *ev)
{
    mt__ring_push(ud, ev);
}

static void ring_sink_n(void *ud, const mt_event_rec_t *ev, size_t n)
{
    mt__ring_push_n(ud, ev, n);
}

/* A source to register, as the profiler's sink has (event.h): the allocator then keeps
 * the global path's events back and hands them over many at a time; the round's end
 * (mt_alloc_destroy) hands over the rest. */
static void any_source(void *ud, void (*push)(void *arg), void *arg, bool on)
{
    (void)ud, (void)push, (void)arg, (void)on;
}

/* A batch in two steps, as the profiler's sink takes a thread cache's (event.h). */
static bool ring_claim(void *ud, size_t n, uint64_t tok[2])
{
    mt__ring_claim(ud, n, tok);
    return true;
}

static void ring_write(void *ud, const uint64_t tok[2], const mt_event_rec_t *ev, size_t n)
{
    mt__ring_write(ud, tok, ev, n);
}

static void ring_write_batch(void *ud, const uint64_t tok[2], const void *h, const void *e)
{
    mt__ring_write_batch(ud, tok, h, e);
}

/* ---- the allocation loop ---- */

enum {
    CFG_OFF,
    CFG_PROF_OFF,
    CFG_NULL,
    CFG_RING,
    CFG_LOG,
    CFG_LOG_LOSSLESS,
    CFG_STK_SAMPLED,
    CFG_STK_ALL,
    NCFG
};
static const char *const cfg_names[NCFG] = {"recording off",
                                            "profiler attached, created off",
                                            "empty sink (allocator side)",
                                            "ring + reader (daemon path)",
                                            "local log (JSON drainer)",
                                            "local log, lossless",
                                            "ring + stacks=sampled",
                                            "ring + stacks=all"};

typedef struct result_s {
    double best_ns_per_pair;
    double best_cpu_ns_per_pair; /* the allocating thread's CPU time: what a busy machine's
                                  * preemptions do not inflate */
    uint64_t events, dropped;
} result_t;

/* One configuration's recording, set up around one allocator. */
typedef struct rec_s {
    int cfgi;
    mt_backend_t *b; /* a fresh sim device */
    mt_alloc_t *a;   /* the caching allocator over it, recording as cfgi says */
    mt__ring_t *ring;
    reader_t rd;
    mt_prof_t *prof;
    mt_event_sink_t sink; /* borrowed by the allocator: lives as long as it */
    uint64_t null_count;
    mt__stab_t *stab; /* stack configurations: the table, over area */
    void *area;
    int stk_mode;
} rec_t;

static void stk_emit(void *ud, const mt_event_rec_t *ev)
{
    mt__ring_push(((rec_t *)ud)->ring, ev);
}

static void stk_emit_n(void *ud, const mt_event_rec_t *ev, size_t n)
{
    mt__ring_push_n(((rec_t *)ud)->ring, ev, n);
}

static uint32_t stk_stack(void *ud, uint64_t bytes, int pool, int mode)
{
    (void)pool;
    rec_t *r = ud;
    return mt__stab_capture(r->stab, mode == MT_STACKS_DEFAULT ? r->stk_mode : mode, bytes);
}

/* Attaches configuration cfgi's recording (none for CFG_OFF) to ac. */
static int rec_attach(rec_t *r, int cfgi, mt_alloc_cfg_t *ac)
{
    r->cfgi = cfgi;
    if (cfgi == CFG_NULL) {
        r->sink = (mt_event_sink_t){.emit = null_emit,
                                    .claim = null_claim,
                                    .write = null_write,
                                    .write_batch = null_write_batch,
                                    .source = any_source,
                                    .ud = &r->null_count};
        ac->sink = &r->sink;
    } else if (cfgi == CFG_RING) {
        if (mt__ring_create(&r->ring, 1 << 16, "bench") != 0)
            return -1;
        mt__ring_unlink(r->ring);
        r->rd.ring = r->ring;
        pthread_create(&r->rd.th, NULL, reader_main, &r->rd);
        r->sink = (mt_event_sink_t){.emit = ring_sink,
                                    .emit_n = ring_sink_n,
                                    .claim = ring_claim,
                                    .write = ring_write,
                                    .write_batch = ring_write_batch,
                                    .source = any_source,
                                    .ud = r->ring};
        ac->sink = &r->sink;
    } else if (cfgi == CFG_STK_SAMPLED || cfgi == CFG_STK_ALL) {
        /* the ring path, with the profiler's stack table over an area of its own */
        size_t sz = mt__stab_area_size();
        r->area = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (r->area == MAP_FAILED || mt__stab_create(&r->stab, r->area, sz) != 0 ||
            mt__ring_create(&r->ring, 1 << 16, "bench") != 0)
            return -1;
        mt__ring_unlink(r->ring);
        r->rd.ring = r->ring;
        pthread_create(&r->rd.th, NULL, reader_main, &r->rd);
        r->stk_mode = cfgi == CFG_STK_ALL ? MT_STACKS_ALL : MT_STACKS_SAMPLED;
        r->sink = (mt_event_sink_t){.emit = stk_emit,
                                    .emit_n = stk_emit_n,
                                    .stack = stk_stack,
                                    .source = any_source,
                                    .ud = r};
        ac->sink = &r->sink;
    } else if (cfgi == CFG_PROF_OFF) {
        mt_prof_cfg_t pc = mt_prof_cfg_default();
        pc.mode = MT_PROF_OFF;
        if (mt_prof_create(&r->prof, &pc) != 0)
            return -1;
        ac->sink = mt_prof_sink(r->prof);
    } else if (cfgi == CFG_LOG || cfgi == CFG_LOG_LOSSLESS) {
        mt_prof_cfg_t pc = mt_prof_cfg_default();
        pc.mode = MT_PROF_LOG;
        pc.lossless_stall_ms = cfgi == CFG_LOG_LOSSLESS ? MT_PROF_LOSSLESS_STALL_MS : 0;
        pc.stacks = MT_STACKS_OFF; /* the JSON drainer's cost alone, as before stacks */
        pc.log_path = "/dev/null";
        if (mt_prof_create(&r->prof, &pc) != 0)
            return -1;
        ac->sink = mt_prof_sink(r->prof);
    }
    return 0;
}

/* A fresh sim backend and allocator (r->b, r->a), recording as configuration cfgi. */
static int rec_start(rec_t *r, int cfgi)
{
    memset(r, 0, sizeof(*r));
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    if (mt_backend_create(&r->b, &bc) != 0)
        return -1;
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = r->b;
    if (rec_attach(r, cfgi, &ac) != 0 || mt_alloc_create(&r->a, &ac) != 0)
        return -1;
    return 0;
}

/* Events offered so far. */
static uint64_t rec_events(rec_t *r)
{
    if (r->ring) {
        mt__ring_stats_t st;
        mt__ring_stats(r->ring, &st);
        return st.emitted;
    }
    if (r->cfgi == CFG_LOG || r->cfgi == CFG_LOG_LOSSLESS || r->cfgi == CFG_PROF_OFF) {
        mt_prof_stats_t st;
        mt_prof_stats(r->prof, &st);
        return st.emitted;
    }
    return r->null_count;
}

/* Destroys the allocator, ends the recording (events offered and dropped), destroys the
 * backend. */
static void rec_stop(rec_t *r, uint64_t *events, uint64_t *dropped)
{
    mt_alloc_destroy(&r->a);
    *events = *dropped = 0;
    if (r->cfgi == CFG_NULL) {
        *events = r->null_count;
    } else if (r->ring) {
        atomic_store(&r->rd.stop, 1);
        pthread_join(r->rd.th, NULL);
        mt__ring_stats_t st;
        mt__ring_stats(r->ring, &st);
        *events = st.emitted;
        *dropped = st.dropped;
        mt__ring_close(&r->ring);
        mt__stab_destroy(&r->stab);
        if (r->area)
            munmap(r->area, mt__stab_area_size());
    } else if (r->cfgi == CFG_LOG || r->cfgi == CFG_LOG_LOSSLESS || r->cfgi == CFG_PROF_OFF) {
        mt_prof_stats_t st;
        mt_prof_stats(r->prof, &st);
        *events = st.emitted;
        *dropped = st.dropped;
        mt_prof_destroy(&r->prof);
    }
    mt_backend_destroy(&r->b);
}

static int run_loop(int cfgi, result_t *res)
{
    rec_t rec;
    if (rec_start(&rec, cfgi) != 0)
        return -1;
    mt_alloc_t *a = rec.a;
    /* Warm the cache: every size of the loop has a cached block afterwards. */
    static const size_t sizes[8] = {512, 4096, 65536, 1 << 20, 3 << 20, 8 << 20, 1000, 200000};
    void *p[8];
    for (int i = 0; i < 8; i++)
        mt_alloc_malloc(a, sizes[i], NULL, MT_TAG_ACTIVATIONS, &p[i]);
    for (int i = 0; i < 8; i++)
        mt_alloc_free(a, p[i]);
    uint64_t t0 = mt_bench_now_ns(), c0 = mt_bench_thread_cpu_ns();
    for (int i = 0; i < PAIRS; i++) {
        void *q;
        mt_alloc_malloc(a, sizes[i & 7], NULL, MT_TAG_ACTIVATIONS, &q);
        mt_alloc_free(a, q);
    }
    uint64_t dt = mt_bench_now_ns() - t0;
    double cpu = (double)(mt_bench_thread_cpu_ns() - c0) / PAIRS;
    if (cpu < res->best_cpu_ns_per_pair || res->best_cpu_ns_per_pair == 0)
        res->best_cpu_ns_per_pair = cpu;
    double ns = (double)dt / PAIRS;
    bool best = ns < res->best_ns_per_pair || res->best_ns_per_pair == 0;
    if (best)
        res->best_ns_per_pair = ns;
    uint64_t dropped;
    rec_stop(&rec, &res->events, &dropped);
    if (best) /* the drops of the round whose time is shown */
        res->dropped = dropped;
    return 0;
}

/* ---- the thread cache's own path: one size, one stream per thread ---- */

#define CPAIRS 1000000

typedef struct cpair_s {
    mt_alloc_t *a;
    mt_stream_t *s;
    pthread_barrier_t *bar;
    uint64_t ns;
} cpair_t;

static void *cpair_main(void *arg)
{
    cpair_t *c = arg;
    void *q;
    mt_alloc_malloc(c->a, 65536, c->s, MT_TAG_ACTIVATIONS, &q); /* the first pair fills it */
    mt_alloc_free(c->a, q);
    if (c->bar)
        pthread_barrier_wait(c->bar);
    uint64_t t0 = mt_bench_now_ns();
    for (int i = 0; i < CPAIRS; i++) {
        mt_alloc_malloc(c->a, 65536, c->s, MT_TAG_ACTIVATIONS, &q);
        __asm__ volatile("" ::: "memory");
        mt_alloc_free(c->a, q);
    }
    c->ns = mt_bench_now_ns() - t0;
    return NULL;
}

typedef struct cresult_s {
    double one_ns, two_ns; /* best ns per pair: one thread; two threads at once (wall / 2n) */
    uint64_t events, dropped;
} cresult_t;

/* CPAIRS cached 64 KiB pairs of configuration cfgi: one thread, then two threads on two
 * streams of one allocator at once. */
static int run_cached(int cfgi, cresult_t *res)
{
    for (int threads = 1; threads <= 2; threads++) {
        rec_t rec;
        if (rec_start(&rec, cfgi) != 0)
            return -1;
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)threads);
        cpair_t c[2];
        pthread_t th[2];
        for (int i = 0; i < threads; i++) {
            c[i] = (cpair_t){rec.a, NULL, threads > 1 ? &bar : NULL, 0};
            if (mt_stream_create(rec.b, &c[i].s) != 0)
                return -1;
            pthread_create(&th[i], NULL, cpair_main, &c[i]);
        }
        uint64_t wall = 0;
        for (int i = 0; i < threads; i++) {
            pthread_join(th[i], NULL);
            wall = c[i].ns > wall ? c[i].ns : wall;
        }
        double ns = (double)wall / ((double)CPAIRS * threads);
        double *best = threads == 1 ? &res->one_ns : &res->two_ns;
        bool better = *best == 0 || ns < *best;
        *best = better ? ns : *best;
        for (int i = 0; i < threads; i++)
            mt_stream_destroy(rec.b, &c[i].s);
        pthread_barrier_destroy(&bar);
        uint64_t ev, dr;
        rec_stop(&rec, &ev, &dr);
        if (threads == 1 && better) {
            res->events = ev;
            res->dropped = dr;
        }
    }
    return 0;
}

/* ---- a workload with work between allocations: LSTM training steps ---- */

#define RNN_STEPS 6
/* A step's time has two regimes here (42 or 52 ms, by where the BLAS threads land) that
 * last several rounds: the best of a few rounds per configuration may catch one
 * configuration in each, so rounds are compared pairwise and the median is kept. */
#define RNN_ROUNDS 9

typedef struct rnn_result_s {
    double ms[RNN_ROUNDS]; /* ms per step, by round */
    double events_per_step;
    uint64_t dropped;
} rnn_result_t;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..RNN_ROUNDS) (v is left as it was); *lo and *hi get the extremes. */
static double median(const double *v, double *lo, double *hi)
{
    double w[RNN_ROUNDS];
    memcpy(w, v, sizeof(w));
    qsort(w, RNN_ROUNDS, sizeof(double), cmp_double);
    if (lo != NULL)
        *lo = w[0];
    if (hi != NULL)
        *hi = w[RNN_ROUNDS - 1];
    return RNN_ROUNDS % 2 ? w[RNN_ROUNDS / 2] : (w[RNN_ROUNDS / 2 - 1] + w[RNN_ROUNDS / 2]) / 2;
}

static float *rnn_buf(mt_alloc_t *a, size_t n, int tag)
{
    float *p = NULL;
    if (mt_alloc_malloc(a, n * sizeof(float), NULL, tag, (void **)&p) != 0)
        return NULL;
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u) >> 24 & 0xff) / 256.0f - 0.5f;
    return p;
}

/* RNN_STEPS timed steps (forward in training mode + backward) of a 2-layer LSTM, after one
 * untimed step, through the engine and the caching allocator, in configuration cfgi;
 * round's figures go to res. */
static int run_rnn(int cfgi, int round, rnn_result_t *res)
{
    enum { T = 64, B = 16, IN = 128, H = 256 };
    rec_t rec;
    if (rec_start(&rec, cfgi) != 0)
        return -1;
    mt_alloc_t *a = rec.a;
    mt_rnn_cfg_t c = mt_rnn_cfg_default();
    c.mode = MT_RNN_LSTM;
    c.input_size = IN;
    c.hidden_size = H;
    c.num_layers = 2;
    c.alloc = a;
    mt_rnn_t *m = NULL;
    if (mt_rnn_create(&m, &c) != 0)
        return -1;
    size_t nx = (size_t)T * B * IN, ny = (size_t)T * B * H;
    float *x = rnn_buf(a, nx, MT_TAG_BATCH), *y = rnn_buf(a, ny, MT_TAG_ACTIVATIONS);
    float *dy = rnn_buf(a, ny, MT_TAG_ACTIVATIONS), *dx = rnn_buf(a, nx, MT_TAG_BATCH);
    if (!x || !y || !dy || !dx)
        return -1;
    mt_rnn_io_t io = {
        .seq_len = T, .batch = B, .x = x, .y = y, .hx = NULL, .cx = NULL, .hy = NULL, .cy = NULL};
    mt_rnn_grad_io_t g = {.dy = dy, .dx = dx};
    uint64_t t0 = 0, ev0 = 0;
    for (int it = 0; it <= RNN_STEPS; it++) {
        if (it == 1) { /* step 0 fills the cache */
            t0 = mt_bench_now_ns();
            ev0 = rec_events(&rec);
        }
        mt_rnn_reserve_t *rsv = NULL;
        if (mt_rnn_forward(m, &io, &rsv) != 0 || mt_rnn_backward(m, &rsv, &g) != 0)
            return -1;
    }
    double ms = (double)(mt_bench_now_ns() - t0) / 1e6 / RNN_STEPS;
    /* Events of the timed steps: counted before the buffers and the module are freed. */
    uint64_t ev1 = rec_events(&rec);
    mt_alloc_free(a, x);
    mt_alloc_free(a, y);
    mt_alloc_free(a, dy);
    mt_alloc_free(a, dx);
    mt_rnn_destroy(&m);
    uint64_t events, dropped;
    rec_stop(&rec, &events, &dropped);
    res->ms[round] = ms;
    res->events_per_step = (double)(ev1 - ev0) / RNN_STEPS;
    res->dropped += dropped;
    return 0;
}

/* ---- the event clock alone ---- */

/* ns per read of the allocator's event clock (the TSC where invariant): every recorded
 * operation reads it once, so two reads per pair are a floor under any recording that
 * stamps each operation. */
static double clock_alone(void)
{
    mt__clock_t c;
    mt__clock_init(&c, true);
    volatile uint64_t sink = 0;
    uint64_t t0 = mt_bench_now_ns();
    for (int i = 0; i < PUSHES; i++)
        sink += mt__clock_now(&c);
    (void)sink;
    return (double)(mt_bench_now_ns() - t0) / PUSHES;
}

/* ---- the ring alone ---- */

/* One thread pushes half a ring at a time (timed), then drains it (not timed): the
 * intrinsic cost of a push, without an allocator or a second core in the way. */
static double push_alone(uint64_t *dropped)
{
    mt__ring_t *ring = NULL;
    const uint32_t slots = 1 << 16;
    if (mt__ring_create(&ring, slots, "bench") != 0)
        return -1;
    mt__ring_unlink(ring);
    reader_t rd = {.ring = ring};
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof(ev));
    ev.kind = MT_EV_ALLOC;
    ev.time_ns = 1;
    uint64_t spent = 0;
    for (int done = 0; done < PUSHES; done += slots / 2) {
        uint64_t t0 = mt_bench_now_ns();
        for (uint32_t i = 0; i < slots / 2; i++) {
            ev.addr = i;
            mt__ring_push(ring, &ev);
        }
        spent += mt_bench_now_ns() - t0;
        while (mt__ring_drain(ring, count_cb, &rd, SIZE_MAX) > 0) {
        }
    }
    mt__ring_stats_t st;
    mt__ring_stats(ring, &st);
    *dropped = st.dropped;
    double ns = (double)spent / (double)st.emitted;
    mt__ring_close(&ring);
    return ns;
}

/* ---- the local log's drain alone ---- */

#define DRAIN_EVENTS (1u << 20)

/* The local log's writer, alone: a profiler in log mode whose drainer sleeps, a ring of
 * DRAIN_EVENTS records filled by one thread (alloc, free_requested, free_completed, as the
 * loop above makes them), then drained into path by mt_prof_flush (binary records taken in
 * batches, encoded into the 64 KiB buffer, one write per buffer). Events per second of the
 * drain, per producer (one ring); *cpu_rate the same per second of the draining thread's CPU
 * time (user and system: the encoder and the writes), which a busy machine's preemptions do
 * not lower. */
static double log_drain_alone(const char *path, int format, uint64_t *written, double *cpu_rate)
{
    mt_prof_cfg_t pc = mt_prof_cfg_default();
    pc.mode = MT_PROF_LOG;
    pc.log_format = format;
    pc.stacks = MT_STACKS_OFF;
    pc.slots = DRAIN_EVENTS;
    pc.drain_ms = 3600 * 1000; /* the drainer thread stays out of the way */
    pc.log_path = path;
    mt_prof_t *p = NULL;
    if (mt_prof_create(&p, &pc) != 0)
        return -1;
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof ev);
    ev.pool = MT_POOL_LARGE;
    ev.tag = MT_TAG_ACTIVATIONS;
    ev.reserved = 64u << 20;
    static const uint8_t kinds[3] = {MT_EV_ALLOC, MT_EV_FREE_REQUESTED, MT_EV_FREE_COMPLETED};
    for (uint32_t i = 0; i < DRAIN_EVENTS; i++) {
        ev.kind = kinds[i % 3];
        ev.time_ns = 1000000000u + (uint64_t)i * 70;
        ev.addr = 0x7f0000000000u + (uint64_t)(i / 3 % 8) * (2u << 20);
        ev.size = ev.requested = 65536u << (i % 5);
        ev.allocated = ev.kind == MT_EV_FREE_COMPLETED ? 0 : ev.size;
        mt_prof_record(p, &ev);
    }
    uint64_t t0 = mt_bench_now_ns(), c0 = mt_bench_thread_cpu_ns();
    mt_prof_flush(p);
    double dt = (double)(mt_bench_now_ns() - t0), dc = (double)(mt_bench_thread_cpu_ns() - c0);
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    *written = st.written;
    mt_prof_destroy(&p);
    *cpu_rate = dc > 0 ? (double)st.written / dc * 1e9 : 0;
    return dt > 0 ? (double)st.written / dt * 1e9 : 0;
}

/* ---- call stacks: a 10-deep stack without frame pointers, and the table's bound ---- */

#define DEEP        10
#define DEEP_PAIRS  100000
#define DISTINCT_1M 1000000

static int deep_pair(void *ud)
{
    mt_alloc_t *a = ud;
    void *p = NULL;
    if (mt_alloc_malloc(a, 4096, NULL, MT_TAG_OTHER, &p) != 0)
        return -1;
    return mt_alloc_free(a, p);
}

typedef struct capture_ctx_s {
    mt__stab_t *stab;
    uint64_t ns;
} capture_ctx_t;

static int deep_capture(void *ud)
{
    capture_ctx_t *c = ud;
    uint64_t t0 = mt_bench_now_ns();
    for (int i = 0; i < DEEP_PAIRS; i++)
        if (mt__stab_capture(c->stab, MT_STACKS_ALL, 4096) == 0)
            return -1;
    c->ns = mt_bench_now_ns() - t0;
    return 0;
}

typedef struct deep_result_s {
    double off_ns, all_ns, capture_ns, frames;
    uint64_t dropped;
} deep_result_t;

/* alloc+free pairs at the bottom of a DEEP-frame recursion built without frame pointers,
 * stacks off then all on the same allocator and ring (best of ROUNDS each, alternating),
 * and the capture alone (unwinding + interning) at the same depth. */
static int deep_stacks(deep_result_t *out)
{
    rec_t rec;
    if (rec_start(&rec, CFG_STK_ALL) != 0)
        return -1;
    memset(out, 0, sizeof *out);
    for (int round = 0; round < ROUNDS; round++) {
        for (int m = 0; m < 2; m++) {
            rec.stk_mode = m ? MT_STACKS_ALL : MT_STACKS_OFF;
            uint64_t t0 = mt_bench_now_ns();
            for (int i = 0; i < DEEP_PAIRS; i++)
                if (mt_bench_deep(DEEP, deep_pair, rec.a) != 0)
                    return -1;
            double ns = (double)(mt_bench_now_ns() - t0) / DEEP_PAIRS;
            double *best = m ? &out->all_ns : &out->off_ns;
            if (*best == 0 || ns < *best)
                *best = ns;
        }
        capture_ctx_t c = {rec.stab, 0};
        if (mt_bench_deep(DEEP, deep_capture, &c) != 0)
            return -1;
        double ns = (double)c.ns / DEEP_PAIRS;
        if (out->capture_ns == 0 || ns < out->capture_ns)
            out->capture_ns = ns;
    }
    mt__stab_stats_t st;
    mt__stab_stats(rec.stab, &st);
    out->frames = st.stacks ? (double)st.frames / st.stacks : 0;
    uint64_t events;
    rec_stop(&rec, &events, &out->dropped);
    return 0;
}

/* Interns DISTINCT_1M distinct 10-frame stacks into a fresh table: what it stores, counts
 * and occupies. */
static int table_1m(mt__stab_stats_t *st, double *ns_per)
{
    size_t sz = mt__stab_area_size();
    void *area = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    mt__stab_t *t = NULL;
    if (area == MAP_FAILED || mt__stab_create(&t, area, sz) != 0)
        return -1;
    uint64_t w[10];
    for (int k = 0; k < 10; k++)
        w[k] = 0x400000 + (uint64_t)k * 0x1000;
    uint64_t t0 = mt_bench_now_ns();
    for (uint32_t i = 0; i < DISTINCT_1M; i++) {
        w[0] = 0x7f0000000000ull + i;
        (void)mt__stab_intern(t, w, 10, false);
    }
    *ns_per = (double)(mt_bench_now_ns() - t0) / DISTINCT_1M;
    mt__stab_stats(t, st);
    mt__stab_destroy(&t);
    munmap(area, sz);
    return 0;
}

/* The local log's drain rows, NDJSON and binary: to /dev/null (the encoder and the buffer)
 * and to a file, alternating, best of rounds each; the file's bytes per event. */
static void drain_rows(int rounds)
{
    static const char *const name[2][2] = {
        {"local log drain, /dev/null", "local log drain, file in /tmp"},
        {"binary log drain, /dev/null", "binary log drain, file in /tmp"}};
    static const int fmt[2] = {MT_PROF_LOG_NDJSON, MT_PROF_LOG_BINARY};
    char logfile[] = "/tmp/mt-bench-prof-XXXXXX";
    int lfd = mkstemp(logfile);
    if (lfd >= 0)
        close(lfd);
    double best[2][2] = {{0}}, cpu[2][2] = {{0}}, bytes[2] = {0}, c = 0;
    uint64_t w[2][2] = {{0}};
    for (int round = 0; round < rounds && lfd >= 0; round++) {
        for (int f = 0; f < 2; f++) {
            for (int to = 0; to < 2; to++) {
                unlink(logfile);
                double r = log_drain_alone(to ? logfile : "/dev/null", fmt[f], &w[f][to], &c);
                best[f][to] = r > best[f][to] ? r : best[f][to];
                cpu[f][to] = c > cpu[f][to] ? c : cpu[f][to];
            }
            struct stat st;
            if (stat(logfile, &st) == 0 && w[f][1] > 0)
                bytes[f] = (double)st.st_size / (double)w[f][1];
        }
    }
    unlink(logfile);
    /* wall-clock rate; then per second of the draining thread's CPU time */
    for (int f = 0; f < 2; f++)
        for (int to = 0; to < 2; to++)
            printf("%-30s %10s %11s %10s %7.2f M/s %9llu   %s (%.2f M/s of CPU time%s)\n",
                   name[f][to], "-", "-", "-", best[f][to] / 1e6,
                   (unsigned long long)(DRAIN_EVENTS - w[f][to]),
                   to ? "(with the file system's write)" : ">= 10 M events/s per producer",
                   cpu[f][to] / 1e6, "");
    printf("%-30s %.1f bytes per event in NDJSON, %.1f in the binary log\n", "log size", bytes[0],
           bytes[1]);
}

/* ---- the cached pair recorded with nothing dropped ----
 * The ring row above counts what the program pays while its reader keeps up or not: a
 * claim that finds the ring full costs almost nothing, so the more is dropped, the cheaper
 * a pair looks. Here the ring holds the whole loop (4 Mi slots, 1 M pairs = 3 M events)
 * and is drained between laps only: every event is written, none is read meanwhile. With
 * two threads, each makes half the pairs on a stream of its own, on one allocator. */
enum { ND_PAIRS = 1000000, ND_LAPS = 5, ND_THREADS = 2, ND_SLOTS = 1u << 22 };

static void nd_count(void *ud, const mt_event_rec_t *ev)
{
    (void)ev;
    (*(uint64_t *)ud)++;
}

typedef struct nd_thread_s {
    mt_alloc_t *a;
    mt_stream_t *s;
    long pairs;
    pthread_barrier_t *start, *end;
    pthread_t th;
} nd_thread_t;

static void nd_loop(mt_alloc_t *a, mt_stream_t *s, long pairs)
{
    for (long i = 0; i < pairs; i++) {
        void *q;
        mt_alloc_malloc(a, 64 << 10, s, 1, &q);
        __asm__ __volatile__("" ::: "memory");
        mt_alloc_free(a, q);
    }
}

/* A second thread's laps: each between the main thread's two barriers. */
static void *nd_main(void *arg)
{
    nd_thread_t *t = arg;
    for (int lap = 0; lap < ND_LAPS; lap++) {
        pthread_barrier_wait(t->start);
        nd_loop(t->a, t->s, t->pairs);
        pthread_barrier_wait(t->end);
    }
    return NULL;
}

/* ns per pair of wall time (all threads' pairs), the best lap after the first, for mode 0 (no
 * sink), 1 (events: claim and write), 2 (compact batches: write_batch), on nt (1 or ND_THREADS)
 * threads. */
static double nodrop_pair(int mode, int nt, uint64_t *dropped)
{
    mt_backend_t *b = NULL;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    mt__ring_t *ring = NULL;
    if (mt_backend_create(&b, &bc) != 0 || mt__ring_create(&ring, ND_SLOTS, "nodrop") != 0)
        return -1;
    mt__ring_unlink(ring);
    /* Every page of the ring present before the laps, as in a ring that has wrapped once:
     * compact batches touch one line per batch's positions, so the first lap alone left
     * most pages to fault in the timed ones (the kernel's page-cache lock, shared by the
     * two threads, was then most of a pair). Adding 0 changes no byte. */
    char *map = (char *)(uintptr_t)mt__ring_header(ring);
    for (size_t off = 0; off < mt__ring_map_size(ND_SLOTS); off += 4096)
        __atomic_fetch_add((uint64_t *)(void *)(map + off), 0, __ATOMIC_RELAXED);
    mt_event_sink_t sink = {.emit = ring_sink,
                            .emit_n = ring_sink_n,
                            .claim = ring_claim,
                            .write = ring_write,
                            .write_batch = mode == 2 ? ring_write_batch : NULL,
                            .ud = ring};
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.sink = mode == 0 ? NULL : &sink;
    mt_alloc_t *a = NULL;
    nd_thread_t t[ND_THREADS] = {0};
    pthread_barrier_t start, end;
    double best = -1;
    uint64_t seen = 0;
    int started = 0;
    pthread_barrier_init(&start, NULL, (unsigned)nt);
    pthread_barrier_init(&end, NULL, (unsigned)nt);
    if (mt_alloc_create(&a, &ac) != 0)
        goto out;
    for (int i = 0; i < nt; i++) {
        t[i] = (nd_thread_t){a, NULL, ND_PAIRS / nt, &start, &end, 0};
        if (mt_stream_create(b, &t[i].s) != 0)
            goto out;
    }
    for (; started + 1 < nt; started++)
        if (pthread_create(&t[started + 1].th, NULL, nd_main, &t[started + 1]) != 0)
            goto out;
    for (int lap = 0; lap < ND_LAPS; lap++) {
        pthread_barrier_wait(&start);
        uint64_t t0 = mt_bench_now_ns();
        nd_loop(a, t[0].s, t[0].pairs);
        pthread_barrier_wait(&end);
        double ns = (double)(mt_bench_now_ns() - t0) / (double)(t[0].pairs * nt);
        if (lap > 0 && (best < 0 || ns < best))
            best = ns;
        while (mt__ring_drain(ring, nd_count, &seen, 1 << 20) > 0) {
        }
    }
    mt__ring_stats_t st;
    mt__ring_stats(ring, &st);
    *dropped = st.dropped;
out:
    if (started + 1 < nt) { /* a thread could not start: none waits at a barrier */
        best = -1;
        nt = started + 1;
    }
    for (int i = 1; i < nt; i++)
        pthread_join(t[i].th, NULL);
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&end);
    mt_alloc_destroy(&a);
    for (int i = 0; i < ND_THREADS; i++)
        mt_stream_destroy(b, &t[i].s);
    mt__ring_close(&ring);
    mt_backend_destroy(&b);
    return best;
}

static void nodrop_rows(void)
{
    static const char *names[] = {"recording off", "events (claim + write)",
                                  "compact batches (write_batch)"};
    double off = 0;
    printf("\nthe cached pair recorded with nothing dropped: %d pairs into a ring that holds "
           "them, drained between laps; best of %d laps after the first; two threads: "
           "half the pairs each, one stream each, one allocator, ns per pair of wall time\n\n",
           ND_PAIRS, ND_LAPS - 1);
    printf("%-30s %10s %8s %9s %10s %8s   %s\n", "configuration", "ns/pair", "x off", "dropped",
           "2 threads", "scaling", "goal");
    for (int m = 0; m < 3; m++) {
        uint64_t dropped = 0, dropped2 = 0;
        double ns = nodrop_pair(m, 1, &dropped), ns2 = nodrop_pair(m, ND_THREADS, &dropped2);
        if (m == 0)
            off = ns;
        printf("%-30s %10.1f %7.2fx %9llu %10.1f %7.2fx   %s\n", names[m], ns, ns / off,
               (unsigned long long)(dropped + dropped2), ns2, ns / ns2,
               m == 2 ? "<= 2x off; 2 threads >= 1.6x" : "");
    }
}

int main(int argc, char **argv)
{
    /* "--loop": the allocation loop's rows and the ring alone only (no LSTM, no stacks):
     * for profiling the record path and for quick A/B runs. */
    bool loop_only = argc > 1 && strcmp(argv[1], "--loop") == 0;
    /* "--drain [rounds]": the local log's drain rows alone (the encoder's A/B runs). */
    if (argc > 1 && strcmp(argv[1], "--drain") == 0) {
        int r = argc > 2 ? atoi(argv[2]) : ROUNDS;
        drain_rows(r < 1 ? ROUNDS : r);
        return 0;
    }
    /* then, optionally, the rounds (more on a loaded machine) and one configuration's
     * number alone (to profile it) */
    int rounds = loop_only && argc > 2 ? atoi(argv[2]) : ROUNDS;
    int only = loop_only && argc > 3 ? atoi(argv[3]) : -1;
    if (rounds < 1)
        rounds = ROUNDS;
    /* A program's choice the library leaves to it: oneDNN's OpenMP team sleeps between
     * calls instead of spinning on cores the cell math needs (docs/blas.md). */
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    result_t res[NCFG];
    memset(res, 0, sizeof(res));
    mt_bench_print_machine(stdout);
    for (int round = 0; round < rounds; round++)
        for (int c = 0; c < NCFG; c++)
            if ((!loop_only || c <= CFG_LOG_LOSSLESS) && (only < 0 || c == only) &&
                run_loop(c, &res[c]) != 0) {
                fprintf(stderr, "bench_prof: setup failed (%s)\n", cfg_names[c]);
                return 1;
            }
    double best_push = 0;
    uint64_t push_drops = 0;
    for (int round = 0; round < ROUNDS; round++) {
        uint64_t d = 0;
        double ns = push_alone(&d);
        if (best_push == 0 || ns < best_push) {
            best_push = ns;
            push_drops = d;
        }
    }

    double best_clock = 0;
    for (int round = 0; round < ROUNDS; round++) {
        double ns = clock_alone();
        if (best_clock == 0 || ns < best_clock)
            best_clock = ns;
    }

    double off = res[CFG_OFF].best_ns_per_pair;
    printf("recording overhead: %d cached alloc+free pairs (8 sizes, sim backend), best of %d "
           "rounds\n\n",
           PAIRS, rounds);
    double off_cpu = res[CFG_OFF].best_cpu_ns_per_pair;
    printf("%-30s %10s %11s %10s %10s %9s %9s %9s   %s\n", "configuration", "ns/pair",
           "events/pair", "overhead", "ns/event", "dropped", "cpu ns/p", "cpu ns/ev", "goal");
    printf("%-30s %10.1f %11s %10s %10s %9s %9.1f %9s   %s\n", cfg_names[CFG_OFF], off, "-", "-",
           "-", "-", off_cpu, "-", "(baseline)");
    for (int c = CFG_OFF + 1; c < (loop_only ? CFG_STK_SAMPLED : NCFG); c++) {
        /* Events of the timed loop only: the round's total minus set-up events. */
        double per_pair = res[c].events ? (double)res[c].events / (PAIRS + 16) : 0;
        double extra = res[c].best_ns_per_pair - off;
        double per_event = per_pair > 0 ? extra / per_pair : 0;
        double cpu_ev = per_pair > 0 ? (res[c].best_cpu_ns_per_pair - off_cpu) / per_pair : 0;
        printf("%-30s %10.1f %11.1f %9.1f%% %10.1f %9llu %9.1f %9.1f   %s\n", cfg_names[c],
               res[c].best_ns_per_pair, per_pair, 100 * extra / off, per_event,
               (unsigned long long)res[c].dropped, res[c].best_cpu_ns_per_pair, cpu_ev,
               c == CFG_RING           ? "<= 5 %, <= 50 ns/event"
               : c == CFG_PROF_OFF     ? "0 % (costs nothing)"
               : c == CFG_NULL         ? "(time stamps + event build, no recording)"
               : c == CFG_LOG          ? "(fallback, informative)"
               : c == CFG_LOG_LOSSLESS ? "(0 dropped: waits for the drainer)"
                                       : "(informative: shallow stack, one call site)");
    }
    printf("%-30s %10s %11s %10s %10.1f %9llu   %s\n", "ring push alone (1 thread)", "-", "1", "-",
           best_push, (unsigned long long)push_drops, "<= 50 ns/event");
    printf("%-30s %10.1f %11s %9.1f%% %10s %9s   %s\n", "event clock, 2 reads alone",
           2 * best_clock, "-", 100 * 2 * best_clock / off, "-", "-",
           "(floor of stamping each operation; 5 % of off is the goal)");
    drain_rows(ROUNDS);

    /* The pair the thread cache serves (one size on its stream), recorded from its path. */
    cresult_t cr[NCFG];
    memset(cr, 0, sizeof(cr));
    for (int round = 0; round < rounds; round++)
        for (int c = 0; c <= CFG_LOG_LOSSLESS; c++)
            if ((only < 0 || c == only) && run_cached(c, &cr[c]) != 0) {
                fprintf(stderr, "bench_prof: setup failed (%s, cached pair)\n", cfg_names[c]);
                return 1;
            }
    double coff = cr[CFG_OFF].one_ns;
    printf("\nthe thread cache's path: %d cached 64 KiB pairs (one size, one stream), best of "
           "%d rounds; two threads: one stream each, one allocator, ns per pair of the pair "
           "of threads' wall time\n\n",
           CPAIRS, rounds);
    printf("%-30s %10s %8s %11s %9s %10s %8s   %s\n", "configuration", "ns/pair", "x off",
           "events/pair", "dropped", "2 threads", "scaling", "goal");
    for (int c = 0; c <= CFG_LOG_LOSSLESS; c++) {
        double per_pair = (double)cr[c].events / (CPAIRS + 1);
        printf("%-30s %10.1f %7.2fx %11.1f %9llu %10.1f %7.2fx   %s\n", cfg_names[c], cr[c].one_ns,
               cr[c].one_ns / coff, c == CFG_OFF ? 0.0 : per_pair,
               (unsigned long long)cr[c].dropped, cr[c].two_ns, cr[c].one_ns / cr[c].two_ns,
               c == CFG_OFF        ? "(baseline)"
               : c == CFG_PROF_OFF ? "1.0x off (costs nothing)"
               : c == CFG_RING     ? "<= 2x off; 2 threads >= 1.6x"
                                   : "(informative)");
    }
    if (only < 0)
        nodrop_rows();
    if (loop_only)
        return 0;

    /* The same recordings under a workload that computes between its allocations. The
     * order of the configurations rotates from round to round, and each round's figure is
     * compared with the same round's "off": neighbours in time share the machine's state. */
    rnn_result_t rr[NCFG];
    memset(rr, 0, sizeof(rr));
    for (int round = 0; round < RNN_ROUNDS; round++)
        for (int k = 0; k < NCFG; k++) {
            int c = (round + k) % NCFG;
            if (run_rnn(c, round, &rr[c]) != 0) {
                fprintf(stderr, "bench_prof: LSTM setup failed (%s)\n", cfg_names[c]);
                return 1;
            }
        }
    printf("\nthe same recordings on LSTM training steps (2 layers, H=256, T=64, B=16, CPU path, "
           "sim backend), %d steps per round, %d rounds:\nmedian ms/step, and the median (range) "
           "over rounds of the overhead over the same round's \"off\"\n\n",
           RNN_STEPS, RNN_ROUNDS);
    printf("%-30s %10s %11s %22s %9s   %s\n", "configuration", "ms/step", "events/step",
           "overhead (range)", "dropped", "goal");
    printf("%-30s %10.2f %11s %22s %9s   %s\n", cfg_names[CFG_OFF],
           median(rr[CFG_OFF].ms, NULL, NULL), "-", "-", "-", "(baseline)");
    double ring_over = 0;
    for (int c = CFG_OFF + 1; c < NCFG; c++) {
        double over[RNN_ROUNDS];
        for (int r = 0; r < RNN_ROUNDS; r++)
            over[r] = 100 * (rr[c].ms[r] - rr[CFG_OFF].ms[r]) / rr[CFG_OFF].ms[r];
        double lo, hi, med = median(over, &lo, &hi);
        if (c == CFG_RING)
            ring_over = med;
        char cell[64];
        snprintf(cell, sizeof cell, "%.2f%% (%.1f..%.1f)", med, lo, hi);
        printf("%-30s %10.2f %11.1f %22s %9llu   %s\n", cfg_names[c], median(rr[c].ms, NULL, NULL),
               rr[c].events_per_step, cell, (unsigned long long)rr[c].dropped,
               c == CFG_RING          ? "<= 5 %"
               : c == CFG_PROF_OFF    ? "0 % (costs nothing)"
               : c == CFG_NULL        ? "(time stamps + event build, no recording)"
               : c == CFG_STK_SAMPLED ? "<= 5 % over the ring's (stacks off)"
               : c == CFG_STK_ALL     ? "(informative)"
                                      : "(fallback, informative)");
    }
    /* stacks=sampled against stacks off (the ring row), round by round */
    double sover[RNN_ROUNDS], slo, shi;
    for (int r = 0; r < RNN_ROUNDS; r++)
        sover[r] = 100 * (rr[CFG_STK_SAMPLED].ms[r] - rr[CFG_RING].ms[r]) / rr[CFG_RING].ms[r];
    double smed = median(sover, &slo, &shi);

    deep_result_t dr;
    mt__stab_stats_t t1m;
    double ns_1m = 0;
    if (deep_stacks(&dr) != 0 || table_1m(&t1m, &ns_1m) != 0) {
        fprintf(stderr, "bench_prof: call-stack rows failed\n");
        return 1;
    }
    double per_alloc = dr.all_ns - dr.off_ns;
    printf("\ncall stacks: alloc+free pairs at the bottom of a %d-deep recursion built "
           "with -fomit-frame-pointer, ring + reader, best of %d rounds\n\n",
           DEEP, ROUNDS);
    printf("%-38s %10s   %s\n", "row", "figure", "goal");
    printf("%-38s %7.1f ns   %s\n", "pair, stacks off", dr.off_ns, "(baseline)");
    printf("%-38s %7.1f ns   %s\n", "pair, stacks=all", dr.all_ns, "");
    printf("%-38s %7.1f ns   %s (%.1f frames kept per stack; %llu dropped)\n",
           "stacks=all: cost per allocation", per_alloc, "<= 500 ns", dr.frames,
           (unsigned long long)dr.dropped);
    printf("%-38s %7.1f ns   %s\n", "  of which unwind + intern alone", dr.capture_ns,
           "(informative)");
    printf("%-38s %6.2f %%    %s (range %.1f..%.1f over %d rounds)\n",
           "stacks=sampled over off, LSTM step", smed, "<= 5 %", slo, shi, RNN_ROUNDS);
    /* The same overhead from its parts, which the machine's noise does not blur: the
     * captures a step makes (its stack_ref records) times what one costs (the row above),
     * over the step's time. */
    double refs = rr[CFG_STK_SAMPLED].events_per_step - rr[CFG_RING].events_per_step;
    double step_ns = median(rr[CFG_RING].ms, NULL, NULL) * 1e6;
    printf("%-38s %6.3f %%    %s (%.1f captures per step x %.0f ns, over %.1f ms)\n",
           "  the same, from its parts", 100 * refs * per_alloc / step_ns, "<= 5 %", refs,
           per_alloc, step_ns / 1e6);
    printf("%-38s %7.1f MiB  %s (%u stored, %llu counted not stored, %.0f ns per intern)\n",
           "table memory, 1 M distinct stacks", (double)t1m.table_bytes / (1 << 20), "bounded",
           t1m.stacks, (unsigned long long)t1m.overflow, ns_1m);
    printf("%-38s %7.1f MiB  %s\n", "  bound (area + index, any workload)",
           (double)t1m.bound_bytes / (1 << 20), "(documented in docs/telemetry.md)");

    double extra = res[CFG_RING].best_ns_per_pair - off;
    double per_pair = (double)res[CFG_RING].events / (PAIRS + 16);
    printf(
        "\nverdict (ring): overhead %.1f %% (goal <= 5 %%): %s; %.1f ns/event (goal <= 50): %s\n",
        100 * extra / off, 100 * extra / off <= 5.0 ? "met" : "NOT met",
        per_pair > 0 ? extra / per_pair : 0.0,
        per_pair > 0 && extra / per_pair <= 50.0 ? "met" : "NOT met");
    printf("verdict (ring, LSTM training steps): overhead %.2f %% (goal <= 5 %%): %s\n", ring_over,
           ring_over <= 5.0 ? "met" : "NOT met");
    printf(
        "verdict (stacks=all, %d-deep, no frame pointers): %.1f ns per allocation (goal <= 500): "
        "%s\n",
        DEEP, per_alloc, per_alloc <= 500.0 ? "met" : "NOT met");
    printf("verdict (stacks=sampled, LSTM training steps): %.2f %% over stacks off (goal <= 5 %%): "
           "%s\n",
           smed, smed <= 5.0 ? "met" : "NOT met");
    printf("verdict (stack table, 1 M distinct stacks): %.1f MiB, bound %.1f MiB: %s\n",
           (double)t1m.table_bytes / (1 << 20), (double)t1m.bound_bytes / (1 << 20),
           t1m.table_bytes <= t1m.bound_bytes ? "met" : "NOT met");
    if (res[CFG_RING].dropped > 0)
        printf("(the ring round shown dropped %llu events: its reader was starved of CPU, a "
               "drop costs less than a record, so that figure is too low; run again)\n",
               (unsigned long long)res[CFG_RING].dropped);
    return 0;
}
