/* bench_record: what recording costs a real program, on the allocation traces recorded from
 * PyTorch training (data/traces/torch_*.csv.xz: an LSTM, a bi-GRU and a small transformer,
 * variable lengths; most of their operations miss the thread caches and take the
 * allocator's global path).
 *
 * Each trace is replayed twice on a fresh sim backend (no modelled malloc cost) and caching
 * allocator, the second pass timed (a training loop's later iterations), under:
 *   off         no sink
 *   one by one  the ring with a reader thread (as the daemon reads it), the sink without a
 *               source: every global operation's events claimed and written at once
 *   held back   the same sink with a source, as the profiler's: the global path's events
 *               kept as timed entries and handed over 64 at a time (docs/telemetry.md)
 *   allocator's side  held back into a sink that claims and keeps nothing: what recording
 *               costs before the hand-over (the clock read of each operation, the entries),
 *               so the difference to "held back" is the ring's share
 * Rounds alternate the configurations; the lowest time of each is kept (thread CPU time,
 * which a busy machine's preemptions do not inflate, and wall time), with the drops of the
 * round shown. The goal (issue 31): recording <= 10 ns per event.
 *
 * usage: bench_record [--rounds N] [TRACE.csv[.xz] ...]   (default: the three torch traces) */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/machine.h"
#include "analysis/trace_csv.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "profiler/ring.h"
#include "util/evbatch.h"

enum { CFG_OFF, CFG_ONE, CFG_HELD, CFG_SIDE, NCFG };
static const char *const cfg_names[NCFG] = {"off", "one by one (ring + reader)",
                                            "held back (ring + reader)",
                                            "held back, allocator's side"};

typedef struct reader_s {
    mt__ring_t *ring;
    _Atomic int stop;
    pthread_t th;
} reader_t;

static void count_cb(void *ud, const mt_event_rec_t *ev)
{
    (void)ud, (void)ev;
}

/* Like the daemon: on each timer tick (1 ms), read everything published. */
static void *reader_main(void *arg)
{
    reader_t *r = arg;
    while (!atomic_load(&r->stop)) {
        while (mt__ring_drain(r->ring, count_cb, NULL, 65536) > 0) {
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* The ring's sink, as the profiler's (event.h), and the source it registers. */
typedef struct sink_s {
    mt_event_sink_t s;
    mt__ring_t *ring;
    uint64_t kept; /* events the sink that keeps nothing was handed */
    void (*push)(void *arg);
    void *arg;
} sink_t;

static void ring_emit(void *ud, const mt_event_rec_t *ev)
{
    mt__ring_push(((sink_t *)ud)->ring, ev);
}

static void ring_emit_n(void *ud, const mt_event_rec_t *ev, size_t n)
{
    mt__ring_push_n(((sink_t *)ud)->ring, ev, n);
}

static bool ring_claim(void *ud, size_t n, uint64_t tok[2])
{
    sink_t *k = ud;
    if (n > mt__ring_slots(k->ring))
        return false;
    mt__ring_claim(k->ring, n, tok);
    return true;
}

static void ring_write(void *ud, const uint64_t tok[2], const mt_event_rec_t *ev, size_t n)
{
    mt__ring_write(((sink_t *)ud)->ring, tok, ev, n);
}

static void ring_write_batch(void *ud, const uint64_t tok[2], const void *h, const void *e)
{
    mt__ring_write_batch(((sink_t *)ud)->ring, tok, h, e);
}

/* The sink that keeps nothing: every claim granted, every batch counted and dropped. */
static bool none_claim(void *ud, size_t n, uint64_t tok[2])
{
    (void)ud, (void)n;
    tok[0] = tok[1] = 0;
    return true;
}

static void none_write_batch(void *ud, const uint64_t tok[2], const void *h, const void *e)
{
    (void)tok, (void)e;
    ((sink_t *)ud)->kept += ((const mt__evb_hdr_t *)h)->nev;
}

static void ring_source(void *ud, void (*push)(void *arg), void *arg, bool on)
{
    sink_t *k = ud;
    k->push = on ? push : NULL;
    k->arg = on ? arg : NULL;
}

typedef struct result_s {
    double cpu_ns, wall_ns; /* per operation, the lowest */
    double events;          /* per operation */
    uint64_t dropped;       /* of the round with the lowest CPU time */
} result_t;

/* One pass of trace t through a; ptrs: a slot's block. 0 or the failing call's code. */
static int pass(mt_alloc_t *a, const mt_trace_t *t, void **ptrs)
{
    for (size_t i = 0; i < t->nops; i++) {
        const mt_trace_op_t *op = &t->ops[i];
        int rc = op->action == MT_TRACE_ALLOCATE
                     ? mt_alloc_malloc(a, op->size, NULL, MT_TAG_ACTIVATIONS, &ptrs[op->slot])
                     : mt_alloc_free(a, ptrs[op->slot]);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* One round of configuration c on trace t, folded into *res. */
static int round_of(int c, const mt_trace_t *t, void **ptrs, result_t *res)
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_malloc_cost_ns = bc.sim_free_cost_ns = 0;
    mt_backend_t *b = NULL;
    if (mt_backend_create(&b, &bc) != 0)
        return -1;
    sink_t k = {0};
    reader_t rd = {0};
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    if (c != CFG_OFF) {
        if (mt__ring_create(&k.ring, 1 << 16, "bench_record") != 0)
            return -1;
        mt__ring_unlink(k.ring);
        k.s = (mt_event_sink_t){.emit = ring_emit,
                                .emit_n = ring_emit_n,
                                .claim = ring_claim,
                                .write = ring_write,
                                .write_batch = ring_write_batch,
                                .source = c >= CFG_HELD ? ring_source : NULL,
                                .ud = &k};
        if (c == CFG_SIDE) {
            k.s.claim = none_claim;
            k.s.write_batch = none_write_batch;
        }
        ac.sink = &k.s;
        rd.ring = k.ring;
        pthread_create(&rd.th, NULL, reader_main, &rd);
    }
    mt_alloc_t *a = NULL;
    int rc = mt_alloc_create(&a, &ac);
    if (rc == 0)
        rc = pass(a, t, ptrs); /* the first pass: the pools made */
    mt__ring_stats_t s0 = {0}, s1 = {0};
    if (k.push != NULL)
        k.push(k.arg);
    if (k.ring != NULL)
        mt__ring_stats(k.ring, &s0);
    uint64_t kept0 = k.kept;
    uint64_t w0 = mt_bench_now_ns(), c0 = mt_bench_thread_cpu_ns();
    if (rc == 0)
        rc = pass(a, t, ptrs);
    if (k.push != NULL)
        k.push(k.arg); /* what is held back belongs to this pass */
    double cpu = (double)(mt_bench_thread_cpu_ns() - c0) / (double)t->nops;
    double wall = (double)(mt_bench_now_ns() - w0) / (double)t->nops;
    if (k.ring != NULL)
        mt__ring_stats(k.ring, &s1);
    uint64_t kept = k.kept - kept0;
    mt_alloc_destroy(&a);
    if (k.ring != NULL) {
        atomic_store(&rd.stop, 1);
        pthread_join(rd.th, NULL);
        mt__ring_close(&k.ring);
    }
    mt_backend_destroy(&b);
    if (rc != 0)
        return rc;
    if (res->cpu_ns == 0 || cpu < res->cpu_ns) {
        res->cpu_ns = cpu;
        res->dropped = s1.dropped - s0.dropped;
    }
    if (res->wall_ns == 0 || wall < res->wall_ns)
        res->wall_ns = wall;
    res->events = (double)(s1.emitted - s0.emitted + kept) / (double)t->nops;
    return 0;
}

static int trace_rows(const char *path, int rounds)
{
    mt_trace_t *t = NULL;
    char err[512];
    int rc = mt__trace_load(&t, path, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "bench_record: %s\n", err);
        return rc;
    }
    void **ptrs = calloc(t->nallocs, sizeof *ptrs);
    result_t res[NCFG];
    memset(res, 0, sizeof res);
    for (int r = 0; r < rounds && ptrs != NULL && rc == 0; r++)
        for (int c = 0; c < NCFG && rc == 0; c++)
            rc = round_of(c, t, ptrs, &res[c]);
    if (rc != 0 || ptrs == NULL) {
        fprintf(stderr, "bench_record: %s: replay failed (%d)\n", path, rc);
        free(ptrs);
        mt__trace_free(&t);
        return rc != 0 ? rc : MT_ENOMEM;
    }
    printf("%s: %zu operations, the second pass timed, best of %d rounds\n", basename(path),
           t->nops, rounds);
    printf("  %-28s %9s %9s %10s %11s %10s   %s\n", "configuration", "ns/op", "cpu ns/op",
           "events/op", "cpu ns/ev", "dropped", "goal");
    for (int c = 0; c < NCFG; c++) {
        double ev = res[c].events;
        double per = c != CFG_OFF && ev > 0 ? (res[c].cpu_ns - res[CFG_OFF].cpu_ns) / ev : 0;
        char extra[32] = "-";
        if (c != CFG_OFF)
            snprintf(extra, sizeof extra, "%.1f", per);
        printf("  %-28s %9.1f %9.1f %10.2f %11s %10llu   %s\n", cfg_names[c], res[c].wall_ns,
               res[c].cpu_ns, ev, extra, (unsigned long long)res[c].dropped,
               c == CFG_OFF    ? "(baseline)"
               : c == CFG_HELD ? (per <= 10 ? "<= 10 ns/event: met" : "<= 10 ns/event: not met")
               : c == CFG_SIDE ? "(informative: before the ring)"
                               : "(informative: before)");
    }
    printf("\n");
    free(ptrs);
    mt__trace_free(&t);
    return 0;
}

int main(int argc, char **argv)
{
    int rounds = 7, first = 1;
    if (argc > 2 && strcmp(argv[1], "--rounds") == 0) {
        rounds = atoi(argv[2]) > 0 ? atoi(argv[2]) : rounds;
        first = 3;
    }
    static const char *const defaults[] = {"data/traces/torch_lstm.csv.xz",
                                           "data/traces/torch_gru.csv.xz",
                                           "data/traces/torch_transformer.csv.xz"};
    mt_bench_print_machine(stdout);
    printf("recording cost on traces of real programs (docs/telemetry.md, \"The global path's "
           "events\")\n\n");
    int rc = 0;
    if (first < argc)
        for (int i = first; i < argc && rc == 0; i++)
            rc = trace_rows(argv[i], rounds);
    else
        for (size_t i = 0; i < sizeof defaults / sizeof *defaults && rc == 0; i++)
            rc = trace_rows(defaults[i], rounds);
    return rc == 0 ? 0 : 1;
}
