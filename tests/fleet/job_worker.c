/* One rank of a data-parallel job, for tests/fleet/job_ranks.py: a caching allocator on the
 * sim backend recording to its local log, with its rank, job and settings from the
 * environment as a launched rank takes them (RANK, WORLD_SIZE, MEMTRACE_JOB, MEMTRACE_LOG,
 * MEMTRACE_STACKS: mt_prof_cfg_from_env).
 *
 *   job_worker ITERATIONS [EXTRA_FROM]
 *
 * Each iteration is marked (MT_MARK_ITERATION, its number) and allocates and frees the same
 * activations and gradients on every rank. With EXTRA_FROM, the rank also keeps 8 MiB more
 * (tag "kv_cache", from grow_cache) in each iteration from EXTRA_FROM on: the rank whose
 * memory grows where the others' does not. Exits 0, or 1 with a message. */
#include <stdio.h>
#include <stdlib.h>

#include "memtrace/alloc.h"
#include "memtrace/prof.h"

#define MIB       ((size_t)1 << 20)
#define CACHE_MAX 64

static void die(const char *what, int rc)
{
    fprintf(stderr, "job_worker: %s: %s\n", what, mt_strerror(rc));
    exit(1);
}

/* A call site of its own, for the report to name. */
__attribute__((noinline)) static void *grow_cache(mt_alloc_t *a, int tag)
{
    void *p = NULL;
    int rc = mt_alloc_malloc(a, 8 * MIB, NULL, tag, &p);
    if (rc != 0)
        die("malloc kv_cache", rc);
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: job_worker ITERATIONS [EXTRA_FROM]\n");
        return 2;
    }
    int iterations = atoi(argv[1]), extra_from = argc > 2 ? atoi(argv[2]) : -1, rc;
    mt_backend_cfg_t bcfg = mt_backend_cfg_default();
    bcfg.kind = MT_BACKEND_SIM;
    mt_backend_t *b = NULL;
    if ((rc = mt_backend_create(&b, &bcfg)) != 0)
        die("backend", rc);
    mt_prof_cfg_t pcfg = mt_prof_cfg_default();
    if ((rc = mt_prof_cfg_from_env(&pcfg)) != 0 || (rc = mt_prof_stacks_from_env(&pcfg, NULL, 0)))
        die("profiler settings from the environment", rc);
    pcfg.mode = MT_PROF_LOG;
    pcfg.name = "job_worker";
    mt_prof_t *prof = NULL;
    if ((rc = mt_prof_create(&prof, &pcfg)) != 0)
        die("profiler", rc);
    mt_alloc_cfg_t acfg = mt_alloc_cfg_default();
    acfg.backend = b;
    acfg.sink = mt_prof_sink(prof);
    mt_alloc_t *a = NULL;
    if ((rc = mt_alloc_create(&a, &acfg)) != 0)
        die("allocator", rc);
    int kv = 0;
    if ((rc = mt_alloc_tag_register(a, "kv_cache", &kv)) != 0)
        die("tag", rc);
    void *w = NULL, *cache[CACHE_MAX] = {0};
    int ncache = 0;
    if ((rc = mt_alloc_malloc(a, 16 * MIB, NULL, MT_TAG_WEIGHTS, &w)) != 0)
        die("malloc weights", rc);
    for (int i = 0; i < iterations; i++) {
        mt_alloc_emit(a, MT_EV_MARK, MT_MARK_ITERATION, (uint64_t)i, MT_TAG_OTHER);
        void *act = NULL, *grad = NULL;
        if ((rc = mt_alloc_malloc(a, (size_t)(4 + i % 3) * MIB, NULL, MT_TAG_ACTIVATIONS, &act)))
            die("malloc activations", rc);
        if ((rc = mt_alloc_malloc(a, 2 * MIB, NULL, MT_TAG_GRADS, &grad)) != 0)
            die("malloc grads", rc);
        if (extra_from >= 0 && i >= extra_from && ncache < CACHE_MAX)
            cache[ncache++] = grow_cache(a, kv);
        mt_alloc_free(a, grad);
        mt_alloc_free(a, act);
    }
    for (int k = 0; k < ncache; k++)
        mt_alloc_free(a, cache[k]);
    mt_alloc_free(a, w);
    mt_alloc_destroy(&a);
    mt_prof_destroy(&prof);
    mt_backend_destroy(&b);
    return 0;
}
