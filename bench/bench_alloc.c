/* Allocator benchmark: prints a table of the cached path and of trace replays through
 * memtrace's caching allocator (sim backend), beside the same sequences through
 *   (a) no caching: one sim backend malloc/free per request, with its modelled cost, and
 *   (b) the host allocators glibc malloc, jemalloc (mallocx/dallocx) and mimalloc
 *       (mi_malloc/mi_free) for the per-operation cost.
 * jemalloc and mimalloc are dlopen'ed RTLD_LOCAL: both libraries define malloc, and linking
 * either would replace the process allocator (and so the "glibc malloc" row).
 *
 * Goals (issue 2) are printed beside the figures: a cached alloc+free pair <= 100 ns
 * median on one thread; utilization at peak >= 0.95 on the RNN-like trace with warm-up,
 * >= 0.90 without. Only a release build's numbers count.
 *
 * usage: bench_alloc [--quick] [TRACE.csv ...]   (default: the traces in data/traces) */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "mt_config.h"
#include "analysis/replay.h"
#include "analysis/trace_csv.h"

#define UTIL_GOAL_WARM 0.95
#define UTIL_GOAL_COLD 0.90
#define PAIR_GOAL_NS   100.0

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t median(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_u64);
    return v[n / 2];
}

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
    mt_backend_t *b;                           /* no caching: the sim backend */
    void *(*x_malloc)(size_t size, int flags); /* jemalloc mallocx or a mi_malloc wrapper */
    void (*x_free)(void *p, int flags);
    void *(*mi_malloc)(size_t size);
    void (*mi_free)(void *p);
} impl_t;

static int nocache_alloc(impl_t *im, size_t size, void **out)
{
    return mt_backend_malloc(im->b, size, out);
}
static void nocache_free(impl_t *im, void *p)
{
    mt_backend_free(im->b, p);
}
static int glibc_alloc(impl_t *im, size_t size, void **out)
{
    return (*out = malloc(size)) ? 0 : MT_ENOMEM;
}
static void glibc_free(impl_t *im, void *p)
{
    free(p);
}
static int je_alloc(impl_t *im, size_t size, void **out)
{
    return (*out = im->x_malloc(size, 0)) ? 0 : MT_ENOMEM;
}
static void je_free(impl_t *im, void *p)
{
    im->x_free(p, 0);
}
static int mi_alloc(impl_t *im, size_t size, void **out)
{
    return (*out = im->mi_malloc(size)) ? 0 : MT_ENOMEM;
}
static void mi_free_(impl_t *im, void *p)
{
    im->mi_free(p);
}

/* Loads a host allocator without letting it interpose malloc. Returns false (with a note)
 * when the library is absent. */
static bool load_host(impl_t *im, const char *const libs[], const char *sym_alloc,
                      const char *sym_free, char *note, size_t notelen)
{
    void *h = NULL;
    for (size_t i = 0; libs[i] != NULL && h == NULL; i++)
        h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(note, notelen, "%s skipped: %s", im->name, dlerror());
        return false;
    }
    void *a = dlsym(h, sym_alloc), *f = dlsym(h, sym_free);
    if (a == NULL || f == NULL) {
        snprintf(note, notelen, "%s skipped: no %s/%s in the library", im->name, sym_alloc,
                 sym_free);
        return false;
    }
    if (im->alloc == je_alloc) {
        *(void **)&im->x_malloc = a;
        *(void **)&im->x_free = f;
    } else {
        *(void **)&im->mi_malloc = a;
        *(void **)&im->mi_free = f;
    }
    return true;
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
        uint64_t t0 = now_ns();
        for (unsigned i = 0; i < n; i++) {
            void *p;
            if (im->alloc(im, size, &p) == 0)
                im->free(im, p);
            __asm__ volatile("" ::: "memory"); /* keep the pair from being elided */
        }
        t[r] = now_ns() - t0;
    }
    return (double)median(t, rounds) / n;
}

static int cached_path(const opts_t *o, impl_t *hosts, size_t nhosts, size_t size)
{
    char workload[64], sz[16];
    human(sz, sizeof sz, (double)size);
    snprintf(workload, sizeof workload, "cached pair %s", sz);
    unsigned rounds = o->quick ? 5 : 15, n = o->quick ? 20000 : 200000;

    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    mt_backend_t *b;
    mt_alloc_t *a;
    int rc = mt_backend_create(&b, &bc);
    if (rc < 0)
        return rc;
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    if ((rc = mt_alloc_create(&a, &ac)) < 0) {
        mt_backend_destroy(&b);
        return rc;
    }
    uint64_t t[64];
    void *p = NULL;
    mt_alloc_malloc(a, size, NULL, MT_TAG_OTHER, &p); /* the first pair fills the cache */
    mt_alloc_free(a, p);
    for (unsigned r = 0; r < rounds; r++) {
        uint64_t t0 = now_ns();
        for (unsigned i = 0; i < n; i++) {
            if (mt_alloc_malloc(a, size, NULL, MT_TAG_OTHER, &p) == 0)
                mt_alloc_free(a, p);
        }
        t[r] = now_ns() - t0;
    }
    double ns = (double)median(t, rounds) / n;
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

    for (size_t i = 0; i < nhosts; i++) {
        ns = pairs_host(&hosts[i], size, rounds, n);
        l = (line_t){workload, hosts[i].name, ns, -1, -1, -1, -1, NULL};
        print_line(&l);
    }
    return 0;
}

/* ---- (2) trace replays ---- */

/* Replays the ops through im once; returns elapsed ns, 0 on failure. Live pointers are
 * freed at the end (untimed). *peak receives the highest sum of live sizes rounded to
 * 512 bytes (what a device malloc per request would hold). */
static uint64_t replay_host(impl_t *im, const mt_trace_t *t, void **ptrs, uint64_t *peak)
{
    uint64_t live = 0, hi = 0;
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < t->nops; i++) {
        const mt_trace_op_t *op = &t->ops[i];
        uint64_t rounded = (op->size + 511) / 512 * 512;
        if (op->action == MT_TRACE_ALLOCATE) {
            if (op->size == 0 || im->alloc(im, op->size, &ptrs[op->slot]) < 0) {
                ptrs[op->slot] = NULL;
                continue;
            }
            live += rounded;
            hi = live > hi ? live : hi;
        } else if (ptrs[op->slot] != NULL) {
            im->free(im, ptrs[op->slot]);
            ptrs[op->slot] = NULL;
            live -= rounded;
        }
    }
    uint64_t el = now_ns() - t0;
    for (size_t i = 0; i < t->nslots; i++)
        if (ptrs[i] != NULL) {
            im->free(im, ptrs[i]);
            ptrs[i] = NULL;
        }
    *peak = hi;
    return el;
}

static int trace_rows(const opts_t *o, const char *path, impl_t *hosts, size_t nhosts,
                      bool rnn_like)
{
    char err[MT_TRACE_ERR_LEN + 256];
    mt_trace_t *t;
    int rc = mt_trace_load(&t, path, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "bench_alloc: %s\n", err);
        return rc;
    }
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    double pairs = t->nops / 2.0 > 0 ? t->nops / 2.0 : 1;
    unsigned rounds = o->quick ? 1 : 5;
    /* The RNN-like trace carries the goals: default policies with and without warm-up,
     * then the same with expandable segments for comparison. */
    static const struct {
        bool warm;
        const char *conf;
        const char *label;
    } variants[] = {
        {true, NULL, " (warm-up)"},
        {false, NULL, ""},
        {true, "expandable_segments:True", " (expandable, warm-up)"},
        {false, "expandable_segments:True", " (expandable)"},
    };
    char wl[4][80];
    for (size_t v = rnn_like ? 0 : 1; v < (rnn_like ? 4u : 2u); v++) {
        snprintf(wl[v], sizeof wl[v], "%.20s%s", base, variants[v].label);
        mt_replay_cfg_t cfg = mt_replay_cfg_default();
        cfg.warmup = variants[v].warm;
        cfg.alloc_conf = variants[v].conf;
        cfg.rounds = rounds;
        mt_replay_result_t r;
        if ((rc = mt_replay_run(t, &cfg, &r, err, sizeof err)) < 0) {
            fprintf(stderr, "bench_alloc: %s: %s\n", base, err);
            mt_trace_free(&t);
            return rc;
        }
        char goal_buf[64];
        const char *goal = NULL;
        if (rnn_like)
            goal = goal_text(goal_buf, sizeof goal_buf, "util >= %.2f", r.utilization_at_peak,
                             cfg.warmup ? UTIL_GOAL_WARM : UTIL_GOAL_COLD, false);
        line_t l = {
            wl[v],
            "memtrace",
            (double)r.elapsed_ns / pairs,
            (double)r.modelled_ns / pairs,
            (long long)(r.backend_malloc + r.backend_free + r.backend_map + r.backend_unmap),
            (double)r.peak_reserved,
            (double)r.peak_allocated,
            goal};
        print_line(&l);
        if (r.ooms)
            printf("%-36s %-13s %llu allocations failed (out of memory)\n", "", "",
                   (unsigned long long)r.ooms);
        if (cfg.warmup)
            printf("%-36s %-13s warm-up pass: %llu backend calls, reserved %.1f MiB\n", "", "",
                   (unsigned long long)r.warmup_backend_calls,
                   (double)r.warmup_reserved / (1 << 20));
    }
    const char *w = wl[1];
    void **ptrs = calloc(t->nslots ? t->nslots : 1, sizeof *ptrs);
    if (ptrs == NULL) {
        mt_trace_free(&t);
        return MT_ENOMEM;
    }
    /* No caching, on a fresh sim device of the default capacity. */
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    mt_backend_t *b;
    if ((rc = mt_backend_create(&b, &bc)) == 0) {
        impl_t nc = {.name = "no caching", .alloc = nocache_alloc, .free = nocache_free, .b = b};
        uint64_t peak;
        uint64_t el = replay_host(&nc, t, ptrs, &peak);
        mt_backend_counters_t c;
        mt_backend_counters(b, &c);
        line_t l = {w,
                    nc.name,
                    (double)el / pairs,
                    (double)c.modelled_ns / pairs,
                    (long long)(c.malloc_calls + c.free_calls),
                    (double)peak,
                    (double)peak,
                    NULL};
        print_line(&l);
        mt_backend_destroy(&b);
    }
    for (size_t i = 0; i < nhosts; i++) {
        uint64_t best = UINT64_MAX, peak;
        for (unsigned r = 0; r < rounds; r++) {
            uint64_t el = replay_host(&hosts[i], t, ptrs, &peak);
            best = el < best ? el : best;
        }
        line_t l = {w, hosts[i].name, (double)best / pairs, -1, -1, -1, -1, NULL};
        print_line(&l);
    }
    free(ptrs);
    mt_trace_free(&t);
    return 0;
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
    opts_t o = {0};
    const char *traces[16];
    size_t ntraces = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            o.quick = true;
        else if (argv[i][0] != '-' && ntraces < 16)
            traces[ntraces++] = argv[i];
        else {
            fprintf(stderr, "usage: bench_alloc [--quick] [TRACE.csv ...]\n");
            return 2;
        }
    }
    static const char *const defaults[] = {"rnn_varlen.csv", "somas_resnet50.csv",
                                           "somas_pangu_2.6B.csv"};
    static char paths[3][4096];
    if (ntraces == 0)
        for (size_t i = 0; i < 3; i++) {
            snprintf(paths[i], sizeof paths[i], "%s/data/traces/%s", MT_SOURCE_ROOT, defaults[i]);
            traces[ntraces++] = paths[i];
        }

    static const char *const je_libs[] = {"libjemalloc.so.2", "libjemalloc.so", NULL};
    static const char *const mi_libs[] = {"libmimalloc.so.2", "libmimalloc.so", NULL};
    impl_t all[3] = {
        {.name = "glibc malloc", .alloc = glibc_alloc, .free = glibc_free},
        {.name = "jemalloc", .alloc = je_alloc, .free = je_free},
        {.name = "mimalloc", .alloc = mi_alloc, .free = mi_free_},
    };
    char notes[2][256] = {"", ""};
    bool ok[3] = {true, load_host(&all[1], je_libs, "mallocx", "dallocx", notes[0], 256),
                  load_host(&all[2], mi_libs, "mi_malloc", "mi_free", notes[1], 256)};
    impl_t hosts[3];
    size_t nhosts = 0;
    for (size_t i = 0; i < 3; i++)
        if (ok[i])
            hosts[nhosts++] = all[i];

    mt_backend_cfg_t bc = mt_backend_cfg_default();
    printf("memtrace allocator benchmark: %s build, sim backend (modelled segment malloc "
           "%llu ns, free %llu ns)\n",
#ifdef NDEBUG
           "release",
#else
           "NON-RELEASE (figures not representative; use --buildtype=release)",
#endif
           (unsigned long long)bc.sim_malloc_cost_ns, (unsigned long long)bc.sim_free_cost_ns);
    printf("goals: cached alloc+free pair <= %.0f ns median (one thread); utilization at "
           "peak >= %.2f on the RNN-like trace with warm-up, >= %.2f without\n",
           PAIR_GOAL_NS, UTIL_GOAL_WARM, UTIL_GOAL_COLD);
    printf("ns/pair = wall time per allocate+free pair (traces: total / (events/2)), modelled "
           "backend cost included; util@peak = peak allocated / peak reserved\n");
    for (int i = 0; i < 2; i++)
        if (notes[i][0])
            printf("note: %s\n", notes[i]);
    printf("\n");
    header();
    int rc = 0;
    static const size_t sizes[] = {64 << 10, 8 << 20};
    for (size_t i = 0; i < 2 && rc == 0; i++)
        rc = cached_path(&o, hosts, nhosts, sizes[i]);
    for (size_t i = 0; i < ntraces && rc == 0; i++)
        rc = trace_rows(&o, traces[i], hosts, nhosts, strstr(traces[i], "rnn") != NULL);
    if (rc < 0) {
        fprintf(stderr, "bench_alloc: %s\n", mt_strerror(rc));
        return 1;
    }
    return 0;
}
