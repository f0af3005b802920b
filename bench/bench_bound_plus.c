/* What memtrace's per-operation bookkeeping costs on the one-pool bound.
 *
 *   bench_bound_plus [--rounds R] [--passes P] TRACE.csv[.xz|.gz] ...
 *
 * The out-of-band TLSF bound of bench_alloc's replay table (bench/tlsf_oob.c) replays each
 * trace bare, then with the work every memtrace operation does besides finding and
 * merging blocks, added one piece at a time:
 *
 *   bound       mt_tlsf_oob_malloc / mt_tlsf_oob_free alone;
 *   +lock       inside the steps of memtrace's biased lock when the thread holds the bias
 *               (allocator/lock.h, the case of one thread: a store of its busy flag, a
 *               compiler fence and a load of the bias on entry, a release store on exit);
 *   +table      the block's request and tag kept under its address in util/addrmap.h, the
 *               hash table memtrace keeps its blocks in, as sparse (put at malloc, find and
 *               delete at free);
 *   +counters   memtrace's statistics as its global path keeps them: allocated, requested,
 *               allocation, active bytes and count (current, peak, cumulative; per pool and
 *               ALL) and the per-tag bytes;
 *   granule     +counters with the record in an array indexed by the block's first
 *               512-byte granule in place of the hash table (what a lean core could do: a
 *               free finds its record with one load, as the bound does);
 *   memtrace    the allocator itself (sim backend, default settings, the replay's own path).
 *
 * Each is timed by the thread's CPU clock per pass, in rounds that alternate the rows (a
 * fresh pool each time); a row's figure is the median of its warm passes (pass 1 on) over
 * all rounds. Compare ratios within one run only (docs/bench-replay.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/alloc.h"
#include "analysis/replay.h"
#include "analysis/trace_csv.h"
#include "machine.h"
#include "tlsf.h"
#include "util/addrmap.h"

enum { R_BOUND, R_LOCK, R_TABLE, R_COUNTERS, R_GRANULE, R_MEMTRACE, R_N };
static const char *const row_name[R_N] = {"bound",     "+lock",   "+table",
                                          "+counters", "granule", "memtrace"};
#define MAX_PASSES 16
#define MAX_ROUNDS 16
#define GRAN_LOG2  9
#define POOL_SLOT  1 /* the counters' slot of the one pool (MT_STAT_ALL is 0) */

/* The state of the row being replayed (one at a time, one thread). */
static struct {
    int row;
    mt_tlsf_oob_t *pool;
    const char *base;  /* the pool's first byte: granule g is base + g << GRAN_LOG2 */
    uint64_t *granule; /* the granule row's records: request << 8 | tag */
    mt__amap_t table;
    int busy;   /* the biased lock's flag of the one thread */
    void *bias; /* the thread the lock is biased to: this one */
    mt_alloc_stats_t st;
} b;

static inline void lock(void)
{
    __atomic_store_n(&b.busy, 1, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if (__builtin_expect(__atomic_load_n(&b.bias, __ATOMIC_ACQUIRE) != &b, 0))
        abort(); /* (only the biased case is measured) */
}

static inline void unlock(void)
{
    __atomic_store_n(&b.busy, 0, __ATOMIC_RELEASE);
}

static inline void inc1(mt_stat_t *x, int64_t d)
{
    x->current += d;
    x->allocated += (uint64_t)d;
    if (__builtin_expect(x->current > x->peak, 0))
        x->peak = x->current;
}

static inline void inc2(mt_stat_t *arr, int64_t d)
{
    inc1(&arr[MT_STAT_ALL], d);
    inc1(&arr[POOL_SLOT], d);
}

static inline void sub1(mt_stat_t *x, int64_t d)
{
    x->current -= d;
    x->freed += (uint64_t)d;
}

static inline void sub2(mt_stat_t *arr, int64_t d)
{
    sub1(&arr[MT_STAT_ALL], d);
    sub1(&arr[POOL_SLOT], d);
}

/* The rounded size the bound hands out for a request (its granules). */
static inline int64_t rounded(uint64_t req)
{
    uint64_t g = ((uint64_t)1 << GRAN_LOG2) - 1;
    return (int64_t)((req + g) & ~g);
}

static void *row_alloc(size_t size)
{
    int row = b.row;
    if (row >= R_LOCK)
        lock();
    void *p = mt_tlsf_oob_malloc(b.pool, size);
    uint64_t rec = ((uint64_t)size << 8) | 4; /* the request, tag 4 */
    if (p != NULL && row == R_GRANULE)
        b.granule[((const char *)p - b.base) >> GRAN_LOG2] = rec;
    else if (p != NULL && row >= R_TABLE && mt__amap_put(&b.table, (uintptr_t)p, rec) != 0)
        abort(); /* (a benchmark: no host memory is not a case it measures) */
    if (p != NULL && row >= R_COUNTERS) {
        int64_t bytes = rounded(size), req = (int64_t)size;
        inc2(b.st.allocated_bytes, bytes);
        inc2(b.st.requested_bytes, req);
        inc2(b.st.allocation, 1);
        inc2(b.st.active_bytes, bytes);
        inc2(b.st.active, 1);
        inc1(&b.st.tag_allocated_bytes[4], bytes);
        inc1(&b.st.tag_requested_bytes[4], req);
    }
    if (row >= R_LOCK)
        unlock();
    return p;
}

static void row_free(void *p)
{
    int row = b.row;
    if (row >= R_LOCK)
        lock();
    uint64_t rec = 0;
    if (row == R_GRANULE) {
        size_t g = (size_t)(((const char *)p - b.base) >> GRAN_LOG2);
        rec = b.granule[g];
        b.granule[g] = 0;
    } else if (row >= R_TABLE) {
        size_t slot;
        if (!mt__amap_find(&b.table, (uintptr_t)p, &slot))
            abort();
        rec = b.table.vals[slot];
        mt__amap_del_at(&b.table, (uintptr_t)p, slot);
    }
    if (row >= R_COUNTERS) {
        int64_t req = (int64_t)(rec >> 8), bytes = rounded(rec >> 8);
        int tag = (int)(rec & 255);
        sub2(b.st.allocated_bytes, bytes);
        sub2(b.st.requested_bytes, req);
        sub2(b.st.allocation, 1);
        sub2(b.st.active_bytes, bytes);
        sub2(b.st.active, 1);
        sub1(&b.st.tag_allocated_bytes[tag], bytes);
        sub1(&b.st.tag_requested_bytes[tag], req);
    }
    mt_tlsf_oob_free(b.pool, p);
    if (row >= R_LOCK)
        unlock();
}

/* One row's passes on t, in a fresh pool: ns[0..npasses). 0 or a negative MT_E*. */
static int run_row(int row, const mt_trace_t *t, unsigned npasses, uint64_t *ns)
{
    if (row == R_MEMTRACE) {
        mt_replay_cfg_t cfg = mt__replay_cfg_default();
        cfg.cpu_time = true;
        uint64_t modelled[MAX_PASSES], high;
        mt_replay_result_t r;
        char err[256];
        int rc = mt__replay_passes(t, &cfg, npasses, ns, modelled, &r, &high, err, sizeof err);
        if (rc != 0)
            fprintf(stderr, "bench_bound_plus: memtrace: %s\n", err);
        return rc;
    }
    uint64_t want = 3 * t->peak_live_bytes + (64u << 20);
    int rc = mt_tlsf_oob_create(&b.pool, want < MT_TLSF_OOB_MAX_POOL ? want : MT_TLSF_OOB_MAX_POOL);
    if (rc != 0)
        return rc;
    size_t bytes;
    mt_tlsf_oob_bounds(b.pool, &b.base, &bytes);
    b.granule = row == R_GRANULE ? calloc(bytes >> GRAN_LOG2, sizeof *b.granule) : NULL;
    b.table = (mt__amap_t){.room = 3}; /* as the allocator keeps its block table */
    memset(&b.st, 0, sizeof b.st);
    b.row = row;
    b.bias = &b;
    if (row == R_GRANULE && b.granule == NULL) {
        rc = MT_ENOMEM;
    } else {
        mt_host_alloc_t h = {.name = row_name[row], .alloc = row_alloc, .free = row_free};
        rc = mt__replay_host_passes(&h, t, npasses, true, ns);
    }
    free(b.granule);
    mt__amap_fini(&b.table);
    mt_tlsf_oob_destroy(&b.pool);
    return rc;
}

static int bench_trace(const char *path, unsigned rounds, unsigned npasses)
{
    char err[MT_TRACE_ERR_LEN + 64];
    mt_trace_t *t;
    int rc = mt__trace_load(&t, path, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "bench_bound_plus: %s\n", err);
        return rc;
    }
    static uint64_t warm[R_N][MAX_ROUNDS * MAX_PASSES];
    size_t nwarm[R_N] = {0};
    for (unsigned r = 0; r < rounds && rc == 0; r++) {
        for (int k = 0; k < R_N && rc == 0; k++) {
            int row = (int)(r % 2 ? R_N - 1 - k : k); /* each round the other way round */
            uint64_t ns[MAX_PASSES];
            rc = run_row(row, t, npasses, ns);
            for (unsigned i = 1; rc == 0 && i < npasses; i++)
                warm[row][nwarm[row]++] = ns[i];
        }
    }
    if (rc == 0) {
        const char *slash = strrchr(path, '/');
        printf("%s: %zu operations, peak live %.1f MiB\n", slash ? slash + 1 : path, t->nops,
               (double)t->peak_live_bytes / (1 << 20));
        double bound = 0;
        for (int row = 0; row < R_N; row++) {
            double op = (double)mt_bench_median(warm[row], nwarm[row]) / (double)t->nops;
            if (row == R_BOUND)
                bound = op;
            printf("  %-10s %8.1f ns/op  %5.2fx the bound\n", row_name[row], op, op / bound);
        }
    }
    mt__trace_free(&t);
    return rc;
}

int main(int argc, char **argv)
{
    unsigned rounds = 3, npasses = 6;
    int i = 1;
    for (; i + 1 < argc && argv[i][0] == '-'; i += 2) {
        unsigned v = (unsigned)strtoul(argv[i + 1], NULL, 10);
        if (strcmp(argv[i], "--rounds") == 0 && v >= 1 && v <= MAX_ROUNDS)
            rounds = v;
        else if (strcmp(argv[i], "--passes") == 0 && v >= 2 && v <= MAX_PASSES)
            npasses = v;
        else
            break;
    }
    if (i >= argc || argv[i][0] == '-') {
        fprintf(stderr, "usage: bench_bound_plus [--rounds 1..%d] [--passes 2..%d] TRACE...\n",
                MAX_ROUNDS, MAX_PASSES);
        return 2;
    }
    mt_bench_print_machine(stdout);
    printf("one thread; CPU ns per allocate-or-free, the median of the warm passes (%u rounds "
           "of %u passes, rows alternated, a fresh pool each)\n",
           rounds, npasses - 1);
    int rc = 0;
    for (; i < argc && rc == 0; i++)
        rc = bench_trace(argv[i], rounds, npasses);
    return rc == 0 ? 0 : 1;
}
