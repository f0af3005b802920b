/* quickstart: the smallest complete use of memtrace's C API.
 *
 * A backend (cuda if a GPU answers, else the sim device), a caching allocator recording
 * its events through the profiler (to memtraced if it runs, else to a local NDJSON log),
 * a warm-up reservation, a few tagged allocations on two streams, and the statistics.
 * Build (from a checkout, after ./dev.sh build):
 *   cc -Iinclude examples/quickstart.c build/libmemtrace.so -Wl,-rpath,build -o quickstart
 */
#include <stdio.h>
#include <stdlib.h>

#include "memtrace/alloc.h"
#include "memtrace/prof.h"

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0) {                                                                            \
            fprintf(stderr, "quickstart: %s failed: %s\n", #call, mt_strerror(rc_));               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void log_to_stderr(void *ud, mt_log_level_e level, const char *msg)
{
    (void)ud;
    (void)level;
    fprintf(stderr, "[memtrace] %s\n", msg);
}

int main(void)
{
    mt_backend_cfg_t bcfg = mt_backend_cfg_default(); /* reads MEMTRACE_BACKEND etc. */
    char err[256];
    if (mt_backend_cfg_from_env(&bcfg, err, sizeof err) != 0) {
        fprintf(stderr, "quickstart: %s\n", err);
        return 2;
    }
    bcfg.log = log_to_stderr;
    mt_backend_t *b = NULL;
    CHECK(mt_backend_create(&b, &bcfg));

    mt_prof_cfg_t pcfg = mt_prof_cfg_default();
    pcfg.log = log_to_stderr;
    if (mt_prof_cfg_from_env(&pcfg) != 0) { /* MEMTRACE_PROF, MEMTRACE_LOG, ... */
        fprintf(stderr, "quickstart: MEMTRACE_PROF or MEMTRACE_PROF_LOSSLESS is malformed\n");
        return 2;
    }
    mt_prof_t *prof = NULL;
    CHECK(mt_prof_create(&prof, &pcfg));

    mt_alloc_cfg_t acfg = mt_alloc_cfg_default();
    acfg.backend = b;
    acfg.sink = mt_prof_sink(prof);
    acfg.log = log_to_stderr;
    if (mt_alloc_cfg_from_env(&acfg, err, sizeof err) != 0) { /* MEMTRACE_ALLOC_CONF */
        fprintf(stderr, "quickstart: %s\n", err);
        return 2;
    }
    mt_alloc_t *a = NULL;
    CHECK(mt_alloc_create(&a, &acfg));

    mt_stream_t *side = NULL;
    CHECK(mt_stream_create(b, &side));

    /* Warm-up: reserve the largest working set once; later iterations that stay within it
     * never call the device's malloc. */
    CHECK(mt_alloc_reserve(a, 64u << 20, NULL));

    int embeddings = 0;
    CHECK(mt_alloc_tag_register(a, "embeddings", &embeddings));
    void *w = NULL, *emb = NULL;
    CHECK(mt_alloc_malloc(a, 8u << 20, NULL, MT_TAG_WEIGHTS, &w));
    CHECK(mt_alloc_malloc(a, 3u << 20, NULL, embeddings, &emb));

    for (int it = 0; it < 100; it++) {
        mt_alloc_emit(a, MT_EV_MARK, MT_MARK_ITERATION, (uint64_t)it, 0);
        void *act = NULL, *batch = NULL;
        CHECK(mt_alloc_malloc(a, (size_t)(1 + it % 7) << 20, NULL, MT_TAG_ACTIVATIONS, &act));
        CHECK(mt_alloc_malloc(a, 512u << 10, NULL, MT_TAG_BATCH, &batch));
        /* The batch is also read on the side stream: its block is not reused until the
         * side stream's work queued so far has run. */
        CHECK(mt_memset_async(b, batch, 0, 512u << 10, side));
        CHECK(mt_alloc_record_stream(a, batch, side));
        CHECK(mt_alloc_free(a, batch));
        CHECK(mt_alloc_free(a, act));
        /* A training loop waits for its streams once per step. Without it the host runs
         * ahead, freed batches pile up pending on the side stream, and the cache grows
         * past the reservation (try it: `memtrace report` shows the extra segment). */
        CHECK(mt_stream_synchronize(b, side));
    }

    mt_alloc_stats_t st;
    CHECK(mt_alloc_stats(a, &st));
    printf("backend %s: peak allocated %.1f MiB, peak reserved %.1f MiB, "
           "%llu device mallocs for %llu requests, fragmentation %.2f\n",
           mt_backend_name(b), st.allocated_bytes[MT_STAT_ALL].peak / 1048576.0,
           st.reserved_bytes[MT_STAT_ALL].peak / 1048576.0, (unsigned long long)st.num_device_alloc,
           (unsigned long long)st.allocation[MT_STAT_ALL].allocated, st.fragmentation);
    mt_prof_stats_t ps;
    mt_prof_stats(prof, &ps);
    printf("%llu events recorded via %s%s%s\n", (unsigned long long)ps.emitted,
           mt_prof_mode_name(ps.mode), mt_prof_log_path(prof) ? " to " : "",
           mt_prof_log_path(prof) ? mt_prof_log_path(prof) : "");

    CHECK(mt_alloc_free(a, emb));
    CHECK(mt_alloc_free(a, w));
    mt_stream_destroy(b, &side);
    mt_alloc_destroy(&a);
    mt_prof_destroy(&prof);
    mt_backend_destroy(&b);
    return 0;
}
