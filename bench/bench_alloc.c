/* Allocator benchmark, three tables from one run on one machine:
 *   (1) the cached path: an alloc+free pair on one stream, beside no caching (a sim backend
 *       malloc/free per request, modelled cost) and the host allocators glibc malloc,
 *       jemalloc and mimalloc; then 2 threads on 2 streams against 1 thread;
 *   (2) trace replays, cold (the first pass in a fresh process) and warm (the median of the
 *       later passes): memtrace's ns per op (modelled backend cost taken out) beside two
 *       one-pool TLSF bounds (bench/tlsf.c: headers beside the blocks, as a host allocator
 *       keeps them; bench/tlsf_oob.c: records out of band, as a device allocator must) and
 *       the host allocators on the same sequence;
 *   (3) the policy table: utilization at peak, device calls and modelled ns per op for each
 *       policy setting on each trace (docs/allocator-policy.md chose the defaults by it).
 * jemalloc and mimalloc are dlopen'ed RTLD_LOCAL (analysis/replay.c): both define malloc,
 * and linking either would replace the process allocator (and so the glibc row).
 *
 * usage: bench_alloc [--quick] [--wall] [--heap-defaults] [TRACE.csv[.xz|.gz] ...]
 *        (default: data/traces)
 *        bench_alloc --replay-child KIND PASSES cpu|wall TRACE   (one process of table (2))
 * Table (2) times each pass by the process's CPU clock (page faults included, preemption
 * by other jobs on a shared machine not); --wall times it by the wall clock. Its host heaps
 * keep the pages they got, as memtrace's cache does (keep_pages_env); --heap-defaults runs
 * them as they come. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "mt_config.h"
#include "analysis/replay.h"
#include "analysis/trace_csv.h"
#include "machine.h"
#include "tlsf.h"

#define PAIR_GOAL_NS     40.0 /* cached alloc+free pair, one thread */
#define SCALE_GOAL       1.6  /* 2 threads on 2 streams against 1 thread */
#define UTIL_GOAL_COLD   0.95 /* every trace, no warm-up */
#define UTIL_GOAL_RESNET 0.97 /* somas_resnet50, no warm-up */
#define UTIL_GOAL_EXPAND 0.98 /* every trace, expandable segments */
#define UTIL_GOAL_WARM   0.96 /* with warm-up, 0 device calls after it */

static void human(char *buf, size_t n, double bytes)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    while (bytes >= 1024 && u < 3) {
        bytes /= 1024;
        u++;
    }
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
}

/* ---- allocators under test ---- */

/* One way of getting and returning memory. alloc returns 0 or a negative code. */
typedef struct impl_s {
    const char *name;
    int (*alloc)(struct impl_s *im, size_t size, void **out);
    void (*free)(struct impl_s *im, void *p);
    mt_backend_t *b;             /* no caching: the sim backend */
    const mt_host_alloc_t *host; /* host allocators */
} impl_t;

static int nocache_alloc(impl_t *im, size_t size, void **out)
{
    return mt_backend_malloc(im->b, size, out);
}
static void nocache_free(impl_t *im, void *p)
{
    mt_backend_free(im->b, p);
}
static int host_alloc(impl_t *im, size_t size, void **out)
{
    return (*out = im->host->alloc(size)) ? 0 : MT_ENOMEM;
}
static void host_free(impl_t *im, void *p)
{
    im->host->free(p);
}

/* ---- the table ---- */

static void header(void)
{
    printf("%-36s %-13s %10s %10s %9s %10s %10s %6s  %s\n", "workload", "allocator", "ns/pair",
           "modelled", "backend", "peak", "peak", "util", "goal");
    printf("%-36s %-13s %10s %10s %9s %10s %10s %6s\n", "", "", "(wall)", "ns/pair", "calls",
           "reserved", "allocated", "@peak");
}

typedef struct line_s {
    const char *workload;
    const char *allocator;
    double ns_pair;
    double modelled_pair;                 /* < 0: not applicable */
    long long backend_calls;              /* < 0: not applicable */
    double peak_reserved, peak_allocated; /* < 0: not applicable */
    const char *goal;
} line_t;

static void print_line(const line_t *l)
{
    char c1[32] = "-", c2[32] = "-", c3[32] = "-", c4[32] = "-", c5[32] = "-";
    if (l->modelled_pair >= 0)
        snprintf(c1, sizeof c1, "%.1f", l->modelled_pair);
    if (l->backend_calls >= 0)
        snprintf(c2, sizeof c2, "%lld", l->backend_calls);
    if (l->peak_reserved >= 0)
        human(c3, sizeof c3, l->peak_reserved);
    if (l->peak_allocated >= 0)
        human(c4, sizeof c4, l->peak_allocated);
    if (l->peak_reserved > 0 && l->peak_allocated >= 0)
        snprintf(c5, sizeof c5, "%.3f", l->peak_allocated / l->peak_reserved);
    printf("%-36s %-13s %10.1f %10s %9s %10s %10s %6s  %s\n", l->workload, l->allocator, l->ns_pair,
           c1, c2, c3, c4, c5, l->goal ? l->goal : "");
}

/* ---- (1) the cached path ---- */

typedef struct opts_s {
    bool quick;
    bool wall;          /* table (2) by the wall clock instead of each process's CPU clock */
    bool heap_defaults; /* table (2)'s host heaps with their defaults (keep_pages_env) */
} opts_t;

/* Writes "<fmt with target>: MET" or ": NOT MET" into g; returns g. */
static const char *goal_text(char *g, size_t n, const char *fmt, double v, double target, bool le)
{
    bool met = le ? v <= target : v >= target;
    int k = snprintf(g, n, fmt, target);
    if (k >= 0 && (size_t)k < n)
        snprintf(g + k, n - (size_t)k, "%s", met ? ": MET" : ": NOT MET");
    return g;
}

/* Median ns per alloc+free pair of one size, over rounds of n pairs. */
static double pairs_host(impl_t *im, size_t size, unsigned rounds, unsigned n)
{
    uint64_t t[64];
    for (unsigned r = 0; r < rounds; r++) {
        uint64_t t0 = mt_bench_now_ns();
        for (unsigned i = 0; i < n; i++) {
            void *p;
            if (im->alloc(im, size, &p) == 0)
                im->free(im, p);
            __asm__ volatile("" ::: "memory"); /* keep the pair from being elided */
        }
        t[r] = mt_bench_now_ns() - t0;
    }
    return (double)mt_bench_median(t, rounds) / n;
}

/* Pairs of one size on one stream of one allocator, timed in rounds. A line of its own:
 * the two threads of the scaling rows each write theirs. */
typedef struct pair_job_s {
    _Alignas(64) mt_alloc_t *a;
    mt_stream_t *s;
    size_t size;
    unsigned rounds, n;
    uint64_t t[64];
    double cpu_ns;               /* the thread's CPU time over all rounds */
    const mt_host_alloc_t *host; /* a host allocator instead of a (the anchor), or NULL */
} pair_job_t;

static double thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* n pairs of j; returns the wall ns they took. */
static uint64_t pairs_run(const pair_job_t *j, unsigned n)
{
    void *p = NULL;
    uint64_t t0 = mt_bench_now_ns();
    if (j->host != NULL) {
        for (unsigned i = 0; i < n; i++) {
            if ((p = j->host->alloc(j->size)) != NULL)
                j->host->free(p);
            __asm__ volatile("" ::: "memory"); /* keep the pair from being elided */
        }
    } else {
        for (unsigned i = 0; i < n; i++)
            if (mt_alloc_malloc(j->a, j->size, j->s, MT_TAG_OTHER, &p) == 0)
                mt_alloc_free(j->a, p);
    }
    return mt_bench_now_ns() - t0;
}

static void pair_job(pair_job_t *j)
{
    double c0 = thread_cpu_ns();
    for (unsigned r = 0; r < j->rounds; r++)
        j->t[r] = pairs_run(j, j->n);
    j->cpu_ns = thread_cpu_ns() - c0;
}

static int sim_alloc(mt_backend_t **b, mt_alloc_t **a)
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    int rc = mt_backend_create(b, &bc);
    if (rc < 0)
        return rc;
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = *b;
    if ((rc = mt_alloc_create(a, &ac)) < 0)
        mt_backend_destroy(b);
    return rc;
}

static int cached_path(const opts_t *o, const mt_host_alloc_t *hosts, size_t size)
{
    char workload[64], sz[16];
    human(sz, sizeof sz, (double)size);
    snprintf(workload, sizeof workload, "cached pair %s", sz);
    unsigned rounds = o->quick ? 5 : 15, n = o->quick ? 20000 : 200000;
    mt_backend_t *b;
    mt_alloc_t *a;
    int rc = sim_alloc(&b, &a);
    if (rc < 0)
        return rc;
    void *p = NULL;
    mt_alloc_malloc(a, size, NULL, MT_TAG_OTHER, &p); /* the first pair fills the cache */
    mt_alloc_free(a, p);
    pair_job_t j = {.a = a, .size = size, .rounds = rounds, .n = n};
    pair_job(&j);
    double ns = (double)mt_bench_median(j.t, rounds) / n;
    char goal[64];
    mt_alloc_stats_t st;
    mt_alloc_stats(a, &st);
    mt_backend_counters_t c;
    mt_backend_counters(b, &c);
    line_t l = {workload,
                "memtrace",
                ns,
                (double)c.modelled_ns / ((double)rounds * n + 1),
                (long long)(c.malloc_calls + c.free_calls + c.vm_map_calls + c.vm_unmap_calls),
                (double)st.reserved_bytes[0].peak,
                (double)st.allocated_bytes[0].peak,
                goal_text(goal, sizeof goal, "median <= %.0f ns", ns, PAIR_GOAL_NS, true)};
    print_line(&l);
    mt_alloc_destroy(&a);

    /* No caching: every request is a device malloc and free, at the modelled cost. */
    impl_t nc = {.name = "no caching", .alloc = nocache_alloc, .free = nocache_free, .b = b};
    unsigned nc_n = o->quick ? 20 : 200;
    mt_backend_counters(b, &c);
    uint64_t calls0 = c.malloc_calls + c.free_calls, mod0 = c.modelled_ns;
    ns = pairs_host(&nc, size, 5, nc_n);
    mt_backend_counters(b, &c);
    l = (line_t){workload,
                 nc.name,
                 ns,
                 (double)(c.modelled_ns - mod0) / (5.0 * nc_n),
                 (long long)(c.malloc_calls + c.free_calls - calls0),
                 (double)size,
                 (double)size,
                 NULL};
    print_line(&l);
    mt_backend_destroy(&b);

    for (size_t i = 0; i < MT_HOST_N; i++) {
        if (hosts[i].alloc == NULL)
            continue;
        impl_t im = {
            .name = hosts[i].name, .alloc = host_alloc, .free = host_free, .host = &hosts[i]};
        ns = pairs_host(&im, size, rounds, n);
        l = (line_t){workload, im.name, ns, -1, -1, -1, -1, NULL};
        print_line(&l);
    }
    return 0;
}

/* The pair after a warm-up of it: the plan placed the first request, and each pair after
 * leaves the plan as it is, so the thread's cache serves it (docs/allocator-tcache.md);
 * 0 device calls after the warm-up. */
static int warm_pair_row(const opts_t *o, size_t size)
{
    unsigned rounds = o->quick ? 5 : 15, n = o->quick ? 20000 : 200000;
    mt_backend_t *b;
    mt_alloc_t *a;
    int rc = sim_alloc(&b, &a);
    if (rc < 0)
        return rc;
    void *p = NULL;
    mt_alloc_warmup_begin(a);
    if ((rc = mt_alloc_malloc(a, size, NULL, MT_TAG_OTHER, &p)) == 0)
        mt_alloc_free(a, p);
    mt_alloc_warmup_end(a, NULL);
    mt_backend_counters_t c0, c;
    mt_backend_counters(b, &c0);
    pair_job_t j = {.a = a, .size = size, .rounds = rounds, .n = n};
    pair_job(&j);
    mt_backend_counters(b, &c);
    char workload[64], sz[16];
    human(sz, sizeof sz, (double)size);
    snprintf(workload, sizeof workload, "cached pair %s, after warm-up", sz);
    mt_alloc_stats_t st;
    mt_alloc_stats(a, &st);
    double ns = (double)mt_bench_median(j.t, rounds) / n;
    char goal[64];
    line_t l = {workload,
                "memtrace",
                ns,
                (double)(c.modelled_ns - c0.modelled_ns) / ((double)rounds * n),
                (long long)(c.malloc_calls + c.free_calls + c.vm_map_calls + c.vm_unmap_calls -
                            c0.malloc_calls - c0.free_calls - c0.vm_map_calls - c0.vm_unmap_calls),
                (double)st.reserved_bytes[0].peak,
                (double)st.allocated_bytes[0].peak,
                goal_text(goal, sizeof goal, "median <= %.0f ns", ns, PAIR_GOAL_NS, true)};
    print_line(&l);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    return rc;
}

/* ---- 2 threads against 1 ----
 * The two cores of a shared machine are seldom both free for long, and one long run of
 * each kind compares different moments of the machine. So the runs are short rounds, in
 * pairs taken back to back: thread 0 alone, then threads 0 and 1 at once (every other
 * pair in the opposite order). A pair's ratio is the 2-thread throughput over the
 * 1-thread one, of the same pairs: 2 n / max(t0, t1) over n / t_alone; the statistic is
 * the median ratio. */
#define SCALE_ROUNDS 101

typedef struct duo_s {
    pair_job_t *j[2];
    unsigned n, rounds;
    pthread_barrier_t bar;
    uint64_t alone[SCALE_ROUNDS], both[2][SCALE_ROUNDS]; /* wall ns per round */
    double cpu_alone, cpu_both[2];                       /* thread CPU ns, summed */
} duo_t;

typedef struct duo_arg_s {
    duo_t *d;
    int i;
} duo_arg_t;

static void *duo_thread(void *arg)
{
    duo_t *d = ((duo_arg_t *)arg)->d;
    int i = ((duo_arg_t *)arg)->i;
    for (unsigned r = 0; r < d->rounds; r++) {
        for (int phase = 0; phase < 2; phase++) {
            bool together = (phase == 0) == (r % 2 == 1);
            pthread_barrier_wait(&d->bar);
            if (!together && i == 1)
                continue;
            double c0 = thread_cpu_ns();
            uint64_t t = pairs_run(d->j[i], d->n);
            double c = thread_cpu_ns() - c0;
            if (together) {
                d->both[i][r] = t;
                d->cpu_both[i] += c;
            } else {
                d->alone[r] = t;
                d->cpu_alone += c;
            }
        }
    }
    return NULL;
}

/* Median 2-thread / 1-thread throughput ratio of j[0], j[1] (see above); one, two: pairs
 * per microsecond of the median rounds; cpu[3]: CPU ns per pair alone, then of each
 * thread together. */
static double scaling(pair_job_t *j0, pair_job_t *j1, unsigned n, unsigned rounds, double *one,
                      double *two, double cpu[3])
{
    duo_t *d = calloc(1, sizeof *d);
    if (d == NULL) {
        *one = *two = cpu[0] = cpu[1] = cpu[2] = 0;
        return 0;
    }
    *d = (duo_t){.j = {j0, j1}, .n = n, .rounds = rounds};
    for (int i = 0; i < 2; i++) /* warm: the caches filled, the first miss taken */
        pairs_run(d->j[i], 100);
    pthread_barrier_init(&d->bar, NULL, 2);
    pthread_t th[2];
    duo_arg_t arg[2] = {{d, 0}, {d, 1}};
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, duo_thread, &arg[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&d->bar);
    uint64_t ratio[SCALE_ROUNDS], slow[SCALE_ROUNDS];
    for (unsigned r = 0; r < rounds; r++) {
        slow[r] = d->both[0][r] > d->both[1][r] ? d->both[0][r] : d->both[1][r];
        ratio[r] = (uint64_t)(1e6 * 2.0 * (double)d->alone[r] / (double)(slow[r] + 1));
    }
    double med = (double)mt_bench_median(ratio, rounds) / 1e6;
    *one = n / ((double)mt_bench_median(d->alone, rounds) / 1000.0);
    *two = 2.0 * n / ((double)mt_bench_median(slow, rounds) / 1000.0);
    double pairs = (double)rounds * n;
    cpu[0] = d->cpu_alone / pairs;
    cpu[1] = d->cpu_both[0] / pairs;
    cpu[2] = d->cpu_both[1] / pairs;
    free(d);
    return med;
}

/* Throughput of cached pairs: 1 thread on one stream against 2 threads on 2 streams of one
 * allocator; the same with two allocators (nothing of the allocator shared: what is left
 * is the machine's); beside the host allocators' own scaling in the same run. */
static int threads_row(const opts_t *o, const mt_host_alloc_t *hosts, size_t size)
{
    unsigned rounds = o->quick ? 21 : SCALE_ROUNDS, n = o->quick ? 5000 : 40000;
    mt_backend_t *b;
    mt_alloc_t *a[2] = {NULL, NULL};
    int rc = sim_alloc(&b, &a[0]);
    if (rc < 0)
        return rc;
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    rc = mt_alloc_create(&a[1], &ac);
    mt_stream_t *s[2] = {NULL, NULL};
    for (int i = 0; i < 2 && rc == 0; i++)
        rc = mt_stream_create(b, &s[i]);
    static pair_job_t j[2];
    char goal[64];
    for (int two_allocs = 0; two_allocs < 2 && rc == 0; two_allocs++) {
        for (int i = 0; i < 2; i++)
            j[i] = (pair_job_t){.a = a[two_allocs ? i : 0], .s = s[i], .size = size};
        double one, two, cpu[3];
        double x = scaling(&j[0], &j[1], n, rounds, &one, &two, cpu);
        const char *what =
            two_allocs ? "2 threads, 2 allocators (64 KiB)" : "2 threads, 2 streams (64 KiB)";
        printf("%-36s %-13s %10.1f pairs/us with 1 thread, %.1f with 2: median ratio %.2fx  %s\n",
               what, "memtrace", one, two, x,
               two_allocs
                   ? "(anchor)"
                   : goal_text(goal, sizeof goal, "2 threads >= %.1fx", x, SCALE_GOAL, false));
        /* Wall throughput needs two idle cores; CPU time per pair does not: equal figures
         * mean the threads do not slow each other (no shared lock or cache line). */
        printf("%-36s %-13s %10.1f CPU ns/pair with 1 thread, %.1f and %.1f with 2\n", what,
               "memtrace", cpu[0], cpu[1], cpu[2]);
    }
    for (int i = 0; i < 2; i++) {
        mt_alloc_destroy(&a[i]);
        if (s[i] != NULL)
            mt_stream_destroy(b, &s[i]);
    }
    mt_backend_destroy(&b);
    for (size_t i = 0; i < MT_HOST_N && rc == 0; i++) {
        if (hosts[i].alloc == NULL)
            continue;
        for (int k = 0; k < 2; k++)
            j[k] = (pair_job_t){.size = size, .host = &hosts[i]};
        double one, two, cpu[3];
        double x = scaling(&j[0], &j[1], n, rounds, &one, &two, cpu);
        printf("%-36s %-13s %10.1f pairs/us with 1 thread, %.1f with 2: median ratio %.2fx  "
               "(anchor; CPU ns/pair %.1f, then %.1f and %.1f)\n",
               "2 threads (64 KiB)", hosts[i].name, one, two, x, cpu[0], cpu[1], cpu[2]);
    }
    return rc;
}

/* ---- loading traces ---- */

/* ---- (2) replays, cold and warm, each allocator in fresh processes ----
 * Every column is measured the same way: a fresh process (this program re-executed with
 * --replay-child) loads the trace, then replays it npasses times in a row through one
 * allocator that nothing in the process has used before. Pass 0 is the cold pass: glibc's
 * main arena has only served the trace loader (whose big arrays are mmap'ed), jemalloc and
 * mimalloc are dlopen'ed untouched, memtrace gets a new sim backend and allocator, each TLSF
 * bound a new pool of untouched pages (the out-of-band one never touches its pool: its
 * first touch is its record table's). Later passes are warm. No column writes into the
 * blocks it gets: first touch means the allocator's own (its headers, its metadata). */

enum { K_MEMTRACE, K_PLAN, K_TLSF, K_TLSF_OOB, K_GLIBC, K_JEMALLOC, K_MIMALLOC, K_N };
static const char *const kind_arg[K_N] = {"memtrace", "memtrace-plan", "tlsf",    "tlsf-oob",
                                          "glibc",    "jemalloc",      "mimalloc"};
static const char *const kind_label[K_N] = {"memtrace", "memtrace+plan", "TLSF 1-pool", "TLSF oob",
                                            "glibc",    "jemalloc",      "mimalloc"};

#define MAX_PASSES     16
#define WARM_TLSF_GOAL 1.5 /* memtrace warm ns/op against the one-pool bound's (both kinds) */
#define WARM_MI_GOAL   1.0 /* memtrace warm ns/op against mimalloc's */
#define COLD_MI_GOAL   1.0 /* memtrace cold ns/op against mimalloc's */

/* What one child reports. */
typedef struct child_out_s {
    unsigned n;              /* passes */
    uint64_t ns[MAX_PASSES]; /* wall ns of each pass (memtrace: without the modelled cost) */
    uint64_t modelled0;      /* memtrace: the sim backend's modelled ns in pass 0 */
    uint64_t high_cold;      /* memtrace: peak reserved of pass 0; TLSF: pool high-water */
    uint64_t high_warm;      /* the same over the later passes; 0 = not applicable */
    uint64_t peak_live;      /* the trace's peak live bytes, as requested */
    char note[192];          /* why there are no figures, if so */
} child_out_t;

static mt_tlsf_t *tlsf_pool; /* the child's pool, for the mt_host_alloc_t hooks */
static void *tlsf_hook_alloc(size_t size)
{
    return mt_tlsf_malloc(tlsf_pool, size);
}
static void tlsf_hook_free(void *p)
{
    mt_tlsf_free(tlsf_pool, p);
}
static mt_tlsf_oob_t *oob_pool; /* the same for the out-of-band bound */
static void *oob_hook_alloc(size_t size)
{
    return mt_tlsf_oob_malloc(oob_pool, size);
}
static void oob_hook_free(void *p)
{
    mt_tlsf_oob_free(oob_pool, p);
}
static size_t tlsf_hook_high(void)
{
    return mt_tlsf_high_water(tlsf_pool);
}
static size_t oob_hook_high(void)
{
    return mt_tlsf_oob_high_water(oob_pool);
}

/* A bound's passes through h: the cold one, then npasses - 1 warm ones, with its pool's
 * high-water (high) after each. */
static int bound_passes(const mt_host_alloc_t *h, size_t (*high)(void), const mt_trace_t *t,
                        unsigned npasses, bool cpu, child_out_t *o)
{
    int rc = mt__replay_host_passes(h, t, 1, cpu, o->ns);
    o->high_cold = rc == 0 ? high() : 0;
    if (rc == 0)
        rc = mt__replay_host_passes(h, t, npasses - 1, cpu, o->ns + 1);
    o->high_warm = rc == 0 ? high() : 0;
    return rc;
}

/* The child: replays path npasses times through kind and prints one line,
 * "ok N ns0 .. nsN-1 modelled0 high_cold high_warm peak_live" or "skip reason". */
static int replay_child(const char *kind, unsigned npasses, const char *clock, const char *path)
{
    bool cpu = strcmp(clock, "cpu") == 0;
    char err[MT_TRACE_ERR_LEN + 256];
    mt_trace_t *t;
    int k = 0;
    while (k < K_N && strcmp(kind, kind_arg[k]) != 0)
        k++;
    if (k == K_N || npasses < 2 || npasses > MAX_PASSES || (!cpu && strcmp(clock, "wall") != 0)) {
        fprintf(stderr, "bench_alloc: bad --replay-child arguments\n");
        return 2;
    }
    int rc = mt__trace_load(&t, path, err, sizeof err);
    if (rc < 0) {
        printf("skip %s\n", err);
        return 1;
    }
    child_out_t o = {.n = npasses, .peak_live = t->peak_live_bytes};
    if (k == K_MEMTRACE || k == K_PLAN) {
        mt_replay_cfg_t cfg = mt__replay_cfg_default();
        cfg.warmup = k == K_PLAN;
        cfg.cpu_time = cpu;
        uint64_t modelled[MAX_PASSES];
        mt_replay_result_t r;
        rc = mt__replay_passes(t, &cfg, npasses, o.ns, modelled, &r, &o.high_warm, err, sizeof err);
        o.modelled0 = modelled[0];
        o.high_cold = r.peak_reserved;
    } else if (k == K_TLSF || k == K_TLSF_OOB) {
        /* Room for the good fit's worst case on these traces, reserved, not touched. */
        uint64_t want = 3 * t->peak_live_bytes + (64u << 20);
        if (k == K_TLSF) {
            mt_host_alloc_t h = {.name = "tlsf", .alloc = tlsf_hook_alloc, .free = tlsf_hook_free};
            rc =
                mt_tlsf_create(&tlsf_pool, want < MT_TLSF_MAX_REQUEST ? want : MT_TLSF_MAX_REQUEST);
            if (rc == 0)
                rc = bound_passes(&h, tlsf_hook_high, t, npasses, cpu, &o);
        } else {
            mt_host_alloc_t h = {
                .name = "tlsf-oob", .alloc = oob_hook_alloc, .free = oob_hook_free};
            rc = mt_tlsf_oob_create(&oob_pool,
                                    want < MT_TLSF_OOB_MAX_POOL ? want : MT_TLSF_OOB_MAX_POOL);
            if (rc == 0)
                rc = bound_passes(&h, oob_hook_high, t, npasses, cpu, &o);
        }
        snprintf(err, sizeof err, "%s", mt_strerror(rc));
    } else {
        mt_host_alloc_t h;
        mt__host_alloc_load(&h, k == K_GLIBC      ? MT_HOST_GLIBC
                                : k == K_JEMALLOC ? MT_HOST_JEMALLOC
                                                  : MT_HOST_MIMALLOC);
        if (h.alloc == NULL) {
            printf("skip %s\n", h.note);
            mt__trace_free(&t);
            return 0;
        }
        rc = mt__replay_host_passes(&h, t, npasses, cpu, o.ns);
        snprintf(err, sizeof err, "%s", mt_strerror(rc));
    }
    mt__trace_free(&t);
    if (rc < 0) {
        printf("skip %s: %s\n", kind, err);
        return 1;
    }
    printf("ok %u", o.n);
    for (unsigned i = 0; i < o.n; i++)
        printf(" %llu", (unsigned long long)o.ns[i]);
    printf(" %llu %llu %llu %llu\n", (unsigned long long)o.modelled0,
           (unsigned long long)o.high_cold, (unsigned long long)o.high_warm,
           (unsigned long long)o.peak_live);
    return 0;
}

/* The host heaps' own settings that keep the pages they got, as memtrace's cache does during
 * a replay (it gives nothing back without empty_cache): with their defaults they return
 * freed pages to the kernel (mimalloc's decommit, jemalloc's decay, glibc's trim and its
 * dynamic mmap threshold) and fault them in again on the next pass, which measures the
 * host's page faults as much as the heap (1.6-14 us a page on some VMs here). Set in a
 * child before it starts: each reads them once, at its first call. --heap-defaults keeps
 * their defaults. */
static void keep_pages_env(int kind)
{
    if (kind == K_MIMALLOC) {
        setenv("MIMALLOC_ALLOW_DECOMMIT", "0", 1); /* mimalloc 2.0 */
        setenv("MIMALLOC_PURGE_DELAY", "-1", 1);   /* mimalloc 2.1 and later */
    } else if (kind == K_JEMALLOC) {
        setenv("MALLOC_CONF", "dirty_decay_ms:-1,muzzy_decay_ms:-1", 1);
    } else if (kind == K_GLIBC) {
        /* the largest mmap threshold glibc takes (32 MiB on 64 bits) fixes it there */
        static const char keep[] = "glibc.malloc.trim_threshold=68719476736:"
                                   "glibc.malloc.mmap_threshold=33554432";
        const char *cur = getenv("GLIBC_TUNABLES");
        char buf[1024];
        snprintf(buf, sizeof buf, "%s%s%s", cur ? cur : "", cur ? ":" : "", keep);
        setenv("GLIBC_TUNABLES", buf, 1);
    }
}

/* Runs one child (this program, re-executed) and reads its line into *o; keep: the host
 * heaps keep their pages (keep_pages_env). */
static int run_child(int kind, unsigned npasses, bool wall, bool keep, const char *path,
                     child_out_t *o)
{
    memset(o, 0, sizeof *o);
    int fd[2];
    if (pipe(fd) != 0)
        return MT_EIO;
    char passes[16];
    snprintf(passes, sizeof passes, "%u", npasses);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]);
        close(fd[1]);
        if (keep)
            keep_pages_env(kind);
        char *argv[] = {"bench_alloc", "--replay-child",      (char *)kind_arg[kind],
                        passes,        wall ? "wall" : "cpu", (char *)path,
                        NULL};
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(fd[1]);
    if (pid < 0) {
        close(fd[0]);
        return MT_EIO;
    }
    char line[2048] = "";
    FILE *f = fdopen(fd[0], "r");
    if (f == NULL || fgets(line, sizeof line, f) == NULL)
        line[0] = '\0';
    if (f != NULL)
        fclose(f);
    else
        close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    line[strcspn(line, "\n")] = '\0';
    if (strncmp(line, "ok ", 3) != 0) {
        snprintf(o->note, sizeof o->note, "%.180s",
                 strncmp(line, "skip ", 5) == 0 ? line + 5 : "the child failed");
        return 0;
    }
    char *p = line + 3, *q;
    o->n = (unsigned)strtoul(p, &q, 10);
    if (o->n > MAX_PASSES)
        o->n = 0;
    for (unsigned i = 0; i < o->n; i++)
        o->ns[i] = strtoull(q, &q, 10);
    o->modelled0 = strtoull(q, &q, 10);
    o->high_cold = strtoull(q, &q, 10);
    o->high_warm = strtoull(q, &q, 10);
    o->peak_live = strtoull(q, &q, 10);
    return 0;
}

/* One allocator on one trace over all its processes. */
typedef struct col_s {
    bool ok;
    double cold, warm, modelled; /* ns per op: median cold pass, median warm pass, model */
    double util_cold, util_warm; /* peak live requested / high-water; < 0 = not applicable */
    char note[192];
} col_t;

static void measure(int kind, const char *path, unsigned procs, unsigned npasses, bool wall,
                    bool keep, double ops, col_t *c)
{
    uint64_t cold[8], warm[8 * MAX_PASSES], model[8];
    size_t nc = 0, nw = 0;
    memset(c, 0, sizeof *c);
    c->util_cold = c->util_warm = -1;
    for (unsigned p = 0; p < procs && p < 8; p++) {
        child_out_t o;
        if (run_child(kind, npasses, wall, keep, path, &o) < 0 || o.n < 2) {
            snprintf(c->note, sizeof c->note, "%s", o.note[0] ? o.note : "no figures");
            return;
        }
        cold[nc] = o.ns[0];
        model[nc++] = o.modelled0;
        for (unsigned i = 1; i < o.n; i++)
            warm[nw++] = o.ns[i];
        if (o.high_cold > 0)
            c->util_cold = (double)o.peak_live / (double)o.high_cold;
        if (o.high_warm > 0)
            c->util_warm = (double)o.peak_live / (double)o.high_warm;
    }
    c->ok = nc > 0 && nw > 0;
    if (!c->ok)
        return;
    c->cold = (double)mt_bench_median(cold, nc) / ops;
    c->modelled = (double)mt_bench_median(model, nc) / ops;
    c->warm = (double)mt_bench_median(warm, nw) / ops;
}

/* "warm 1.23x TLSF (<=1.5) MET; warm 1.10x TLSF oob (<=1.5) MET; warm 0.91x mimalloc
 * (<=1.0) MET; cold ..." */
static void verdict(char *g, size_t n, const col_t *m, const col_t *tlsf, const col_t *oob,
                    const col_t *mi)
{
    size_t k = 0;
    g[0] = '\0';
    if (tlsf->ok) {
        double x = m->warm / tlsf->warm;
        k += (size_t)snprintf(g + k, n - k, "warm %.2fx TLSF (<=%.1f) %s", x, WARM_TLSF_GOAL,
                              x <= WARM_TLSF_GOAL ? "MET" : "NOT MET");
    }
    if (oob->ok && k < n) {
        double x = m->warm / oob->warm;
        k += (size_t)snprintf(g + k, n - k, "%swarm %.2fx TLSF oob (<=%.1f) %s", k ? "; " : "", x,
                              WARM_TLSF_GOAL, x <= WARM_TLSF_GOAL ? "MET" : "NOT MET");
    }
    if (mi->ok && k < n) {
        /* Cold includes the first touch for every column: memtrace's is the modelled cost of
         * its device calls (the sim backend touches no memory). */
        double w = m->warm / mi->warm, c = (m->cold + m->modelled) / mi->cold;
        snprintf(g + k, n - k, "%swarm %.2fx mimalloc (<=%.1f) %s; cold %.2fx mimalloc (<=%.1f) %s",
                 k ? "; " : "", w, WARM_MI_GOAL, w <= WARM_MI_GOAL ? "MET" : "NOT MET", c,
                 COLD_MI_GOAL, c <= COLD_MI_GOAL ? "MET" : "NOT MET");
    }
}

static int speed_rows(const opts_t *o, const char *path)
{
    char err[MT_TRACE_ERR_LEN + 256];
    mt_trace_t *t;
    int rc = mt__trace_load(&t, path, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "bench_alloc: %s\n", err);
        return rc;
    }
    double ops = t->nops ? (double)t->nops : 1;
    char sz[16];
    human(sz, sizeof sz, (double)t->peak_live_bytes);
    printf("%s: %zu events, peak live %s\n", basename(path), t->nrows, sz);
    mt__trace_free(&t);
    unsigned procs = o->quick ? 1 : 3, npasses = o->quick ? 4 : 6;
    col_t col[K_N];
    for (int k = 0; k < K_N; k++)
        measure(k, path, procs, npasses, o->wall, !o->heap_defaults, ops, &col[k]);
    for (int k = 0; k < K_N; k++) {
        const col_t *c = &col[k];
        if (!c->ok) {
            printf("  %-14s left out: %s\n", kind_label[k], c->note);
            continue;
        }
        char m[16] = "-", uc[16] = "-", uw[16] = "-", g[256] = "";
        if (k == K_MEMTRACE || k == K_PLAN)
            snprintf(m, sizeof m, "%.1f", c->modelled);
        if (c->util_cold >= 0)
            snprintf(uc, sizeof uc, "%.3f", c->util_cold);
        if (c->util_warm >= 0)
            snprintf(uw, sizeof uw, "%.3f", c->util_warm);
        if (k == K_MEMTRACE || k == K_PLAN)
            verdict(g, sizeof g, c, &col[K_TLSF], &col[K_TLSF_OOB], &col[K_MIMALLOC]);
        printf("  %-14s %9.1f %9s %9.1f %9s %9s  %s\n", kind_label[k], c->cold, m, c->warm, uc, uw,
               g);
    }
    return 0;
}

/* ---- (3) the policy table ---- */

typedef struct policy_s {
    const char *label;
    const char *conf; /* "" = the defaults */
    bool expandable;  /* judged against the expandable-segments goal */
    bool is_default;  /* a row of mt_alloc_cfg_default() (expandable: read from it) */
    bool warm;        /* a warm-up pass first; measured after it */
    bool second;      /* an unmeasured pass first on the same allocator (steady state) */
} policy_t;

#define EXP "expandable_segments:True"
#define REF "rules:reference"
/* The rows, from the reference's rules to the default. Each setting is spelled out in full
 * (the reference rows pin rules:reference) so a row means the same whatever the default. */
static const policy_t policies[] = {
    {"reference (rules:reference)", REF, false, false, false, false},
    {"reference, warm-up", REF, false, false, true, false},
    {"reference, second pass", REF, false, false, false, true},
    {"reference+release_to_fit", REF ",release_to_fit:True", false, false, false, false},
    {"ref+rtf+fit_large+split_tails",
     REF ",release_to_fit:True,fit_large_segments:True,split_large_tails:True", false, false, false,
     false},
    {"expandable", REF "," EXP, true, false, false, false},
    {"expandable+rtf", REF "," EXP ",release_to_fit:True", true, false, false, false},
    {"expandable+rtf+one_pool", REF "," EXP ",release_to_fit:True,one_pool:True", true, false,
     false, false},
    {"expandable+rtf+place_high", REF "," EXP ",release_to_fit:True,place_high_mb:32", true, false,
     false, false},
    {"expandable+rtf+one_pool+place_high",
     REF "," EXP ",release_to_fit:True,one_pool:True,place_high_mb:32", true, false, false, false},
    {"DEFAULT (mt_alloc_cfg_default)", "", false, true, false, false},
    {"DEFAULT, warm-up", "", false, true, true, false},
    {"DEFAULT, second pass", "", false, true, false, true},
};

static const char *policy_goal(char *g, size_t n, const policy_t *p, const char *base,
                               const mt_replay_result_t *r)
{
    double u = r->utilization_at_peak;
    uint64_t calls = r->backend_malloc + r->backend_free + r->backend_map + r->backend_unmap;
    if (p->warm) {
        goal_text(g, n, "util >= %.2f", u, UTIL_GOAL_WARM, false);
        if (calls != 0)
            snprintf(g + strlen(g), n - strlen(g), ", device calls after warm-up: NOT 0");
        return g;
    }
    if (p->second)
        return "-"; /* the goals are for a cold start */
    bool resnet = strstr(base, "resnet50") != NULL;
    double cold = resnet ? UTIL_GOAL_RESNET : UTIL_GOAL_COLD;
    bool expandable = p->is_default ? mt_alloc_cfg_default().expandable_segments : p->expandable;
    if (expandable && p->is_default) {
        /* an expandable default is judged both as the cold default and as expandable */
        char g2[48];
        goal_text(g, n, "cold util >= %.2f", u, cold, false);
        goal_text(g2, sizeof g2, "expandable >= %.2f", u, UTIL_GOAL_EXPAND, false);
        snprintf(g + strlen(g), n - strlen(g), "; %s", g2);
        return g;
    }
    if (expandable)
        return goal_text(g, n, "util >= %.2f (expandable)", u, UTIL_GOAL_EXPAND, false);
    return goal_text(g, n, "cold util >= %.2f", u, cold, false);
}

static int policy_rows(const char *path)
{
    char err[MT_TRACE_ERR_LEN + 256];
    mt_trace_t *t;
    int rc = mt__trace_load(&t, path, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "bench_alloc: %s\n", err);
        return rc;
    }
    const char *base = basename(path);
    double ops = t->nops ? (double)t->nops : 1;
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++) {
        mt_replay_cfg_t cfg = mt__replay_cfg_default();
        cfg.alloc_conf = policies[i].conf[0] != '\0' ? policies[i].conf : NULL;
        cfg.warmup = policies[i].warm;
        cfg.second_pass = policies[i].second;
        mt_replay_result_t r;
        if ((rc = mt__replay_run(t, &cfg, &r, err, sizeof err)) < 0) {
            fprintf(stderr, "bench_alloc: %s: %s\n", base, err);
            break;
        }
        uint64_t calls = r.backend_malloc + r.backend_free + r.backend_map + r.backend_unmap;
        char g[128], calls_s[48];
        if (policies[i].warm)
            snprintf(calls_s, sizeof calls_s, "%llu (+%llu warm-up)", (unsigned long long)calls,
                     (unsigned long long)r.warmup_backend_calls);
        else if (policies[i].second)
            snprintf(calls_s, sizeof calls_s, "%llu (+%llu 1st)", (unsigned long long)calls,
                     (unsigned long long)r.first_pass_backend_calls);
        else
            snprintf(calls_s, sizeof calls_s, "%llu", (unsigned long long)calls);
        printf("%-24s %-36s %6.4f %18s %10.1f %9.1f  %s\n", base, policies[i].label,
               r.utilization_at_peak, calls_s, (double)r.modelled_ns / ops,
               (double)r.elapsed_ns / ops, policy_goal(g, sizeof g, &policies[i], base, &r));
    }
    mt__trace_free(&t);
    return rc;
}

/* Debian's jemalloc uses initial-exec TLS, which a dlopen'ed library may only get from the
 * static TLS surplus that glibc sizes at start-up. Re-executing once with a larger surplus
 * (a glibc tunable) lets it load without linking it, i.e. without it replacing malloc. */
static void ensure_static_tls(char **argv)
{
    static const char tunable[] = "glibc.rtld.optional_static_tls=65536";
    const char *cur = getenv("GLIBC_TUNABLES");
    if (cur != NULL && strstr(cur, "optional_static_tls") != NULL)
        return;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s%s%s", cur ? cur : "", cur ? ":" : "", tunable);
    if (setenv("GLIBC_TUNABLES", buf, 1) == 0)
        execv("/proc/self/exe", argv);
    /* If that failed, carry on: jemalloc's row is then skipped with a note. */
}

int main(int argc, char **argv)
{
    ensure_static_tls(argv);
    if (argc == 6 && strcmp(argv[1], "--replay-child") == 0)
        return replay_child(argv[2], (unsigned)strtoul(argv[3], NULL, 10), argv[4], argv[5]);
    opts_t o = {0};
    const char *traces[16];
    size_t ntraces = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            o.quick = true;
        else if (strcmp(argv[i], "--wall") == 0)
            o.wall = true;
        else if (strcmp(argv[i], "--heap-defaults") == 0)
            o.heap_defaults = true;
        else if (argv[i][0] != '-' && ntraces < 16)
            traces[ntraces++] = argv[i];
        else {
            fprintf(stderr, "usage: bench_alloc [--quick] [--wall] [--heap-defaults] "
                            "[TRACE.csv[.xz|.gz] ...]\n");
            return 2;
        }
    }
    static const char *const defaults[] = {"torch_lstm.csv.xz",        "torch_gru.csv.xz",
                                           "torch_transformer.csv.xz", "rnn_varlen.csv",
                                           "somas_resnet50.csv",       "somas_pangu_2.6B.csv"};
    enum { NDEFAULTS = sizeof defaults / sizeof defaults[0] };
    static char paths[NDEFAULTS][4096];
    if (ntraces == 0)
        for (size_t i = 0; i < NDEFAULTS; i++) {
            snprintf(paths[i], sizeof paths[i], "%s/data/traces/%s", MT_SOURCE_ROOT, defaults[i]);
            traces[ntraces++] = paths[i];
        }
    mt_host_alloc_t hosts[MT_HOST_N];
    mt__host_allocs_load(hosts);

    mt_backend_cfg_t bc = mt_backend_cfg_default();
    printf("memtrace allocator benchmark: %s build, sim backend (modelled segment malloc / vm "
           "map %llu ns, free / unmap %llu ns)\n",
#ifdef NDEBUG
           "release",
#else
           "NON-RELEASE (figures not representative; use --buildtype=release)",
#endif
           (unsigned long long)bc.sim_malloc_cost_ns, (unsigned long long)bc.sim_free_cost_ns);
    mt_bench_print_machine(stdout);
    for (int i = 0; i < MT_HOST_N; i++)
        if (hosts[i].alloc == NULL)
            printf("note: %s\n", hosts[i].note);

    printf("\n(1) the cached path. ns/pair = wall time per allocate+free pair (median of "
           "rounds), modelled backend cost included\n");
    header();
    int rc = 0;
    static const size_t sizes[] = {64 << 10, 8 << 20};
    for (size_t i = 0; i < 2 && rc == 0; i++)
        rc = cached_path(&o, hosts, sizes[i]);
    if (rc == 0)
        rc = warm_pair_row(&o, 64 << 10);
    if (rc == 0)
        rc = threads_row(&o, hosts, 64 << 10);

    printf("\n(2) trace replays, %s ns per allocate-or-free. cold: the first pass of a fresh "
           "process (median of %d processes); warm: the later passes of the same processes "
           "(median of %d).\n",
           o.wall ? "wall-clock" : "CPU-time (the process's own, page faults included)",
           o.quick ? 1 : 3, o.quick ? 3 : 15);
    printf(
        "    memtrace: sim backend, its modelled device cost taken out (shown for the cold pass); "
        "memtrace+plan: the first pass inside\n    mt_alloc_warmup_begin/end. The cold verdict "
        "adds memtrace's model back (first touch counted for every column).\n    util = peak "
        "live requested / peak reserved (memtrace) or pool high-water (TLSF).\n");
    printf("    host heaps: %s\n",
           o.heap_defaults ? "their defaults (--heap-defaults)"
                           : "keeping the pages they got, as memtrace's cache does "
                             "(MIMALLOC_ALLOW_DECOMMIT=0, MIMALLOC_PURGE_DELAY=-1; jemalloc "
                             "dirty/muzzy_decay_ms:-1;\n    glibc trim_threshold 64 GiB, "
                             "mmap_threshold 32 MiB); --heap-defaults for their defaults");
    printf("  %-14s %9s %9s %9s %9s %9s  %s\n", "allocator", "cold", "(model)", "warm", "util cold",
           "util warm", "verdict against the goals");
    for (size_t i = 0; i < ntraces && rc == 0; i++)
        rc = speed_rows(&o, traces[i]);

    printf("\n(3) policies: utilization at peak (peak allocated / peak reserved), device calls "
           "in the measured pass, modelled device ns per op, wall ns per op\n");
    printf("DEFAULT = mt_alloc_cfg_default() with no MEMTRACE_ALLOC_CONF; \"second pass\": the "
           "trace replayed again on the same allocator, calls of the first in brackets\n");
    printf("%-24s %-36s %6s %18s %10s %9s  %s\n", "trace", "policy (alloc conf)", "util",
           "device calls", "modelled", "wall", "goal");
    for (size_t i = 0; i < ntraces && rc == 0; i++)
        rc = policy_rows(traces[i]);
    if (rc < 0) {
        fprintf(stderr, "bench_alloc: %s\n", mt_strerror(rc));
        return 1;
    }
    return 0;
}
