/* Writes a real local log of a program whose device holds memory outside memtrace's
 * allocator, for `memtrace report` (test_report_outside.c): on the sim backend with a
 * modelled context of 200 MiB, a library that reports its 48 MiB (mt_alloc_note_outside,
 * "libfakecublas.so"), and 16 MiB + EXTRA MiB that nothing reports (not seen), beside
 * 40 + 20 MiB of blocks in memtrace's allocator, over two iterations, then one OOM.
 * The blocks are freed and the cache emptied before the end, so at the end the device holds
 * only what is outside.
 *
 * usage: prof_outside LOG [EXTRA_MIB]; the rank and job come from the launcher's variables
 * (RANK, WORLD_SIZE, MEMTRACE_JOB: mt_prof_cfg_from_env). Exit 0 when the log was written. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"

#define MIB ((uint64_t)1 << 20)

#define TRY(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0) {                                                                            \
            fprintf(stderr, "prof_outside: %s: %s\n", #call, mt_strerror(rc_));                    \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: prof_outside LOG [EXTRA_MIB]\n");
        return 2;
    }
    uint64_t extra = argc == 3 ? strtoull(argv[2], NULL, 10) : 0;
    setenv("MEMTRACE_OOM_DIR", "off", 1); /* its OOM writes no snapshot into $HOME */
    unlink(argv[1]);

    mt_prof_cfg_t pc = mt_prof_cfg_default();
    (void)mt_prof_cfg_from_env(&pc);
    pc.mode = MT_PROF_LOG;
    pc.log_path = argv[1];
    pc.socket = "/nonexistent/memtrace.sock";
    mt_prof_t *prof = NULL;
    TRY(mt_prof_create(&prof, &pc));

    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 2048 * MIB;
    bc.sim_context = 200 * MIB;
    bc.sim_malloc_cost_ns = bc.sim_free_cost_ns = 0;
    mt_backend_t *b = NULL;
    TRY(mt_backend_create(&b, &bc));

    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.sink = mt_prof_sink(prof);
    ac.expandable_segments = false;
    mt_alloc_t *a = NULL;
    TRY(mt_alloc_create(&a, &ac));

    void *x = NULL, *y = NULL, *lib = NULL, *quiet = NULL, *big = NULL;
    mt_alloc_emit(a, MT_EV_MARK, MT_MARK_ITERATION, 0, 0);
    TRY(mt_alloc_malloc(a, 40 * MIB, NULL, 0, &x));
    /* A library that says what it takes (as the drop-in does for what it forwards)... */
    TRY(mt_backend_malloc(b, 48 * MIB, &lib));
    TRY(mt_alloc_note_outside(a, false, (uintptr_t)lib, 48 * MIB, "libfakecublas.so"));
    /* ...and memory nobody reports. */
    TRY(mt_backend_malloc(b, (16 + extra) * MIB, &quiet));
    mt_alloc_emit(a, MT_EV_MARK, MT_MARK_ITERATION, 1, 0);
    TRY(mt_alloc_malloc(a, 20 * MIB, NULL, 0, &y)); /* a new segment: the device's peak */
    if (mt_alloc_malloc(a, 4096 * MIB, NULL, 0, &big) != MT_ENOMEM) {
        fprintf(stderr, "prof_outside: 4 GiB fitted on a 2 GiB device\n");
        return 1;
    }
    TRY(mt_alloc_free(a, x));
    TRY(mt_alloc_free(a, y));
    TRY(mt_alloc_empty_cache(a));
    mt_alloc_destroy(&a);
    mt_prof_destroy(&prof);
    TRY(mt_backend_free(b, lib)); /* after the log's end: the log ends with them held */
    TRY(mt_backend_free(b, quiet));
    mt_backend_destroy(&b);
    return 0;
}
