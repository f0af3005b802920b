/* bench_plan: the warm-up planner (allocator/plan.c) on recorded sequences of 10 k, 100 k
 * and 1 M allocations shaped like a bidirectional GRU's training (per iteration: per layer,
 * direction and step, saved activations that live until backward passes that step again,
 * and short temporaries; sequence lengths vary, so sizes do).
 *
 * (1) placement: the greedy orders over their time-indexed placed items, the sweep
 *     (O(n log n)), and what mt__plan_place keeps; time, the greedy's work (entries of its
 *     index visited and moved, both orders) and planned extent against the peak of live
 *     bytes (its lower bound; no bounded strips here). Built with -DMT_PLAN_BEFORE against
 *     the tree before this planner, the one row is that tree's greedy (all placed items
 *     scanned per item). With --trace, the same rows for a recorded trace's whole window
 *     (the items reserve.c makes of it: the allocations freed within it).
 * (2) lock: mt_alloc_warmup_end of such a warm-up on the sim backend, while another thread
 *     allocates and frees in a loop: the time warmup_end took, and the longest that one of
 *     the other thread's pairs waited (the lock was held for at least that long).
 * usage: bench_plan [--quick] [--greedy-max N] [--trace FILE.csv[.xz]]...: --quick stops at
 * 100 k; the planner before runs up to N items (default 100 k: at 1 M it would take hours);
 * a .xz trace is read through `xz -dc`. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "allocator/internal.h"
#include "analysis/trace_csv.h"
#include "backend/backend_sim.h"
#include "bench/machine.h"

typedef struct op_s {
    size_t size; /* > 0: an allocation; 0: the free of allocation `of` */
    uint32_t of;
} op_t;

typedef struct seq_s {
    op_t *v;
    size_t n, cap, nalloc;
} seq_t;

static void push(seq_t *s, size_t size, uint32_t of)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (s->v == NULL)
            abort();
    }
    s->v[s->n++] = (op_t){size, of};
    s->nalloc += size > 0;
}

static uint32_t alloc(seq_t *s, size_t size)
{
    push(s, size, 0);
    return (uint32_t)(s->nalloc - 1);
}

static unsigned rnd(unsigned *x)
{
    *x = *x * 1103515245u + 12345u;
    return *x >> 8;
}

/* A bi-GRU training run of about `want` allocations (batch 32, hidden 512, 2 layers). */
static void bigru(seq_t *s, size_t want, unsigned seed)
{
    enum { B = 32, H = 512, L = 2, TMAX = 64 };
    uint32_t *saved = malloc((size_t)L * 2 * TMAX * 2 * sizeof *saved);
    if (saved == NULL)
        abort();
    while (s->nalloc < want) {
        size_t T = 8 + rnd(&seed) % (TMAX - 8);
        uint32_t out = alloc(s, T * B * H * 2 * 4);
        for (int l = 0; l < L; l++)
            for (int d = 0; d < 2; d++) {
                uint32_t proj = alloc(s, T * B * 3 * H * 4); /* input projection, all steps */
                for (size_t t = 0; t < T; t++) {
                    uint32_t *sv = &saved[((l * 2 + d) * TMAX + t) * 2];
                    sv[0] = alloc(s, B * 3 * H * 4); /* gates, saved */
                    uint32_t tmp = alloc(s, B * H * 4);
                    sv[1] = alloc(s, B * H * 4); /* h, saved */
                    push(s, 0, tmp);
                }
                push(s, 0, proj);
            }
        uint32_t logits = alloc(s, T * B * 8192 * 4 / 8);
        uint32_t gout = alloc(s, T * B * H * 2 * 4);
        push(s, 0, logits);
        for (int l = L - 1; l >= 0; l--)
            for (int d = 1; d >= 0; d--) {
                uint32_t gproj = alloc(s, T * B * 3 * H * 4);
                for (size_t t = T; t-- > 0;) {
                    uint32_t *sv = &saved[((l * 2 + d) * TMAX + t) * 2];
                    uint32_t gg = alloc(s, B * 3 * H * 4);
                    uint32_t dh = alloc(s, B * H * 4);
                    push(s, 0, sv[0]);
                    push(s, 0, sv[1]);
                    push(s, 0, gg);
                    push(s, 0, dh);
                }
                push(s, 0, gproj);
            }
        push(s, 0, gout);
        push(s, 0, out);
    }
    free(saved);
}

/* The items of a sequence, as reserve.c makes them: its allocations freed within it, in
 * order; *peak = the highest sum of their live sizes. */
static mt__plan_item_t *items_of(const seq_t *s, size_t *n, size_t *peak)
{
    mt__plan_item_t *it = malloc((s->nalloc + 1) * sizeof *it);
    if (it == NULL)
        abort();
    for (size_t i = 0, k = 0; i < s->n; i++) {
        if (s->v[i].size > 0)
            it[k++] = (mt__plan_item_t){.size = (s->v[i].size + 511) / 512 * 512,
                                        .t0 = (uint32_t)i}; /* t1 = 0: not freed */
        else
            it[s->v[i].of].t1 = (uint32_t)i;
    }
    size_t live = 0;
    *peak = 0;
    for (size_t i = 0, k = 0; i < s->n; i++) {
        if (s->v[i].size > 0 && it[k++].t1 > 0) {
            live += it[k - 1].size;
            *peak = live > *peak ? live : *peak;
        } else if (s->v[i].size == 0) {
            live -= it[s->v[i].of].size;
        }
    }
    *n = 0;
    for (size_t k = 0; k < s->nalloc; k++)
        if (it[k].t1 > 0)
            it[(*n)++] = it[k];
    return it;
}

/* The sequence of a recorded trace (all its streams as one), or false with a message. */
static bool trace_seq(const char *path, seq_t *s)
{
    char err[MT_TRACE_ERR_LEN + 256];
    mt_trace_t *t = NULL;
    if (mt__trace_load(&t, path, err, sizeof err) != 0) { /* (compressed or not) */
        fprintf(stderr, "bench_plan: %s\n", err);
        return false;
    }
    for (size_t i = 0; i < t->nops; i++)
        push(s, t->ops[i].action == MT_TRACE_ALLOCATE ? t->ops[i].size : 0, t->ops[i].slot);
    mt__trace_free(&t);
    return true;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef int (*place_fn)(mt__plan_item_t *, size_t, const size_t *, size_t, size_t *);

#ifndef MT_PLAN_BEFORE
static uint64_t greedy_work; /* of the last greedy() */
/* The greedy orders alone, without a budget. */
static int greedy(mt__plan_item_t *it, size_t n, const size_t *cap, size_t ns, size_t *extent)
{
    return mt__plan_place_greedy(it, n, cap, ns, extent, UINT64_MAX, &greedy_work);
}
#endif

static void place_row(const char *what, const char *name, place_fn fn, const mt__plan_item_t *src,
                      size_t n, size_t peak)
{
    mt__plan_item_t *it = malloc(n * sizeof *it);
    if (it == NULL)
        abort();
    memcpy(it, src, n * sizeof *it);
    size_t cap[1] = {SIZE_MAX}, extent = 0;
    double t0 = now_s();
    int rc = fn(it, n, cap, 1, &extent);
    double t = now_s() - t0;
    char work[32] = "";
#ifndef MT_PLAN_BEFORE
    if (fn == greedy)
        snprintf(work, sizeof work, "%.3f", (double)greedy_work * 1e-9);
#endif
    printf("| %s | %zu | %s | %.3f | %s | %.1f | %.4f |%s\n", what, n, name, t, work,
           (double)extent / (1 << 20), (double)extent / (double)peak, rc != 0 ? " (failed)" : "");
    fflush(stdout);
    free(it);
}

/* ---- (2) the lock ---- */

typedef struct other_s {
    mt_alloc_t *a;
    int stop, ready; /* atomics */
    double worst;    /* longest pair, s */
    uint64_t pairs;
} other_t;

static void *other_main(void *arg)
{
    other_t *o = arg;
    __atomic_store_n(&o->ready, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&o->stop, __ATOMIC_ACQUIRE)) {
        void *p = NULL;
        double t0 = now_s();
        if (mt_alloc_malloc(o->a, 4096, NULL, MT_TAG_OTHER, &p) == 0)
            mt_alloc_free(o->a, p);
        double d = now_s() - t0;
        o->worst = d > o->worst ? d : o->worst;
        o->pairs++;
    }
    return NULL;
}

static void lock_row(const char *what, const seq_t *s)
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = (size_t)16 << 30;
    mt_backend_t *b = NULL;
    mt_alloc_t *a = NULL;
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    if (mt_backend_create(&b, &bc) != 0)
        abort();
    cfg.backend = b;
    if (mt_alloc_create(&a, &cfg) != 0)
        abort();
    void **ptr = calloc(s->nalloc, sizeof *ptr);
    if (ptr == NULL)
        abort();
    mt_alloc_warmup_begin(a);
    for (size_t i = 0, k = 0; i < s->n; i++) {
        if (s->v[i].size > 0)
            mt_alloc_malloc(a, s->v[i].size, NULL, MT_TAG_OTHER, &ptr[k++]);
        else
            mt_alloc_free(a, ptr[s->v[i].of]);
    }
    other_t o = {.a = a};
    pthread_t th;
    pthread_create(&th, NULL, other_main, &o);
    while (!__atomic_load_n(&o.ready, __ATOMIC_ACQUIRE))
        ;
    double t0 = now_s();
    int rc = mt_alloc_warmup_end(a, NULL);
    double t = now_s() - t0;
    __atomic_store_n(&o.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    mt_alloc_stats_t st;
    mt_alloc_stats(a, &st);
    printf("| %s | %zu | %.3f | %.3f | %llu | %.1f |%s\n", what, s->nalloc, t, o.worst,
           (unsigned long long)o.pairs, (double)st.reserved_bytes[MT_STAT_ALL].current / (1 << 20),
           rc != 0 ? " (failed)" : "");
    fflush(stdout);
    free(ptr);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* The rows of (1) for one sequence. */
static void place_rows(const char *what, const seq_t *s, size_t greedy_max)
{
    size_t n = 0, peak = 0;
    mt__plan_item_t *it = items_of(s, &n, &peak);
#ifdef MT_PLAN_BEFORE /* built against the tree before: its one planner */
    if (n <= greedy_max)
        place_row(what, "greedy, all placed scanned (before)", mt__plan_place, it, n, peak);
    else
        printf("| %s | %zu | greedy, all placed scanned (before) | not run (O(n^2)) | | | |\n",
               what, n);
#else
    (void)greedy_max;
    place_row(what, "greedy", greedy, it, n, peak);
    place_row(what, "sweep", mt__plan_place_sweep, it, n, peak);
    place_row(what, "kept (after)", mt__plan_place, it, n, peak);
#endif
    free(it);
}

int main(int argc, char **argv)
{
    bool quick = false;
    size_t greedy_max = 100000, ntrace = 0;
    const char **trace = calloc((size_t)argc, sizeof *trace);
    if (trace == NULL)
        abort();
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--greedy-max") == 0 && i + 1 < argc)
            greedy_max = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--trace") == 0 && i + 1 < argc)
            trace[ntrace++] = argv[++i];
    }
    mt_bench_print_machine(stdout);
    static const size_t ns[] = {10000, 100000, 1000000};
    size_t nn = quick ? 2 : 3;
    seq_t *seq = calloc(nn + ntrace, sizeof *seq);
    char(*what)[64] = calloc(nn + ntrace, sizeof *what);
    if (seq == NULL || what == NULL)
        abort();
    for (size_t i = 0; i < nn; i++) {
        bigru(&seq[i], ns[i], 1);
        snprintf(what[i], sizeof what[i], "bi-GRU");
    }
    for (size_t i = 0; i < ntrace; i++) {
        const char *base = strrchr(trace[i], '/');
        snprintf(what[nn + i], sizeof what[nn + i], "%s", base != NULL ? base + 1 : trace[i]);
        if (!trace_seq(trace[i], &seq[nn + i]))
            return 1;
    }
    printf("\n(1) placement of a warm-up (extent / peak of live bytes; 1.0 = optimal; work: "
           "the greedy's, G entries)\n\n");
    printf("| sequence | allocations | planner | seconds | work G | extent MiB | extent / peak "
           "|\n|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < nn + ntrace; i++)
        place_rows(what[i], &seq[i], greedy_max);
    printf(
        "\n(2) mt_alloc_warmup_end while another thread allocates and frees 4 KiB in a loop\n\n");
    printf("| sequence | allocations | warmup_end s | other thread's longest pair s | its pairs "
           "meanwhile | reserved MiB |\n|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < nn + ntrace; i++) {
        lock_row(what[i], &seq[i]);
        free(seq[i].v);
    }
    free(seq);
    free(what);
    free(trace);
    return 0;
}
