/* The recorder's OOM snapshot (written without a daemon) against the allocator's own
 * snapshot, with expandable segments on (the default): after pages are unmapped from the
 * middle of a run (the run splits in two), and after pages mapped into the gap join the
 * two runs again, each OOM's pickle must list the same segments as mt_alloc_snapshot
 * (address, mapped bytes, expandable), with the same live blocks in each. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "analysis/torch_snapshot.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "tests/common/test_main.h"

#define MIB ((size_t)1 << 20)

/* Expandable segments in the allocator's snapshot. */
static size_t count_expandable(const mt_alloc_snapshot_t *snap)
{
    size_t n = 0;
    for (size_t i = 0; i < snap->nsegments; i++)
        n += snap->segments[i].expandable;
    return n;
}

static void print_segments(const char *who, const mt_alloc_snapshot_t *snap, const mt_ts_t *ts)
{
    for (size_t i = 0; snap != NULL && i < snap->nsegments; i++)
        print_message("%s: allocator segment %zu: %#llx + %llu (%zu blocks)\n", who, i,
                      (unsigned long long)snap->segments[i].addr,
                      (unsigned long long)snap->segments[i].size, snap->segments[i].nblocks);
    for (size_t i = 0; ts != NULL && i < ts->nsegments; i++)
        print_message("%s: recorder segment %zu: %#llx + %llu (%u blocks)\n", who, i,
                      (unsigned long long)ts->segments[i].addr,
                      (unsigned long long)ts->segments[i].total_size, ts->segments[i].nblocks);
}

/* The pickle at path equals the allocator's snapshot segment by segment. */
static void compare(const char *path, mt_alloc_t *a, const char *when)
{
    mt_ts_t *ts = NULL;
    char err[768];
    if (mt_ts_read(&ts, path, err, sizeof err) != 0)
        fail_msg("%s: %s", when, err);
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    if (ts->nsegments != snap->nsegments) {
        print_segments(when, snap, ts);
        fail_msg("%s: the recorder's snapshot has %zu segments, the allocator's %zu", when,
                 ts->nsegments, snap->nsegments);
    }
    for (size_t i = 0; i < snap->nsegments; i++) {
        const mt_snapshot_segment_t *s = &snap->segments[i];
        const mt_ts_segment_t *g = &ts->segments[i];
        if (g->addr != s->addr || g->total_size != s->size || g->expandable != s->expandable) {
            print_segments(when, snap, ts);
            fail_msg("%s: segment %zu: recorder %#llx + %llu, allocator %#llx + %llu", when, i,
                     (unsigned long long)g->addr, (unsigned long long)g->total_size,
                     (unsigned long long)s->addr, (unsigned long long)s->size);
        }
        /* The live blocks, in address order, on both sides. */
        uint64_t alloc = 0;
        size_t k = g->first_block, kend = g->first_block + g->nblocks;
        for (size_t j = 0; j < s->nblocks; j++) {
            const mt_snapshot_block_t *b = &s->blocks[j];
            if (b->state == MT_BLOCK_INACTIVE)
                continue;
            while (k < kend && ts->blocks[k].state == MT_TS_INACTIVE)
                k++;
            if (k == kend || ts->blocks[k].addr != b->addr || ts->blocks[k].size != b->size ||
                (ts->blocks[k].state == MT_TS_ACTIVE_PENDING_FREE) !=
                    (b->state == MT_BLOCK_ACTIVE_PENDING_FREE))
                fail_msg("%s: segment %zu: live block %#llx + %llu missing or different in the "
                         "recorder's snapshot",
                         when, i, (unsigned long long)b->addr, (unsigned long long)b->size);
            alloc += b->state == MT_BLOCK_ACTIVE_ALLOCATED ? b->size : 0;
            k++;
        }
        while (k < kend && ts->blocks[k].state == MT_TS_INACTIVE)
            k++;
        if (k != kend)
            fail_msg("%s: segment %zu: the recorder lists a live block the allocator does not "
                     "(%#llx)",
                     when, i, (unsigned long long)ts->blocks[k].addr);
        assert_int_equal(g->allocated_size, alloc);
    }
    mt_alloc_snapshot_free(&snap);
    mt_ts_destroy(&ts);
}

/* Pages freed in the middle of a run are unmapped (empty_cache), splitting it; an OOM;
 * the gap mapped again by a request that fits it, joining the runs; another OOM. */
static void test_middle_unmap_then_join(void **state)
{
    (void)state;
    char tmp[] = "/tmp/mt-test-oomsnap-XXXXXX";
    assert_non_null(mkdtemp(tmp));
    char oomdir[128], logp[128], path[256], cmd[300];
    snprintf(oomdir, sizeof oomdir, "%s/oom", tmp);
    snprintf(logp, sizeof logp, "%s/run.ndjson", tmp);
    mt_prof_cfg_t pc = mt_prof_cfg_default();
    snprintf(pc.oom_dir, sizeof pc.oom_dir, "%s", oomdir);
    pc.oom_interval_ms = 0; /* a snapshot at every OOM */
    pc.mode = MT_PROF_LOG;
    pc.log_path = logp;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &pc), 0);
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 256 * MIB;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default(); /* expandable segments */
    ac.backend = b;
    ac.sink = mt_prof_sink(p);
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &ac), 0);

    enum { N = 6 };
    void *x[N], *y;
    for (int i = 0; i < N; i++)
        assert_int_equal(mt_alloc_malloc(a, 8 * MIB, NULL, MT_TAG_ACTIVATIONS, &x[i]), 0);
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    size_t before = count_expandable(snap);
    mt_alloc_snapshot_free(&snap);
    /* Two neighbours in the middle freed and their pages unmapped: the run splits. */
    assert_int_equal(mt_alloc_free(a, x[2]), 0);
    assert_int_equal(mt_alloc_free(a, x[3]), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    size_t after = count_expandable(snap);
    mt_alloc_snapshot_free(&snap);
    print_message("expandable segments: %zu, after the middle unmap %zu\n", before, after);
    assert_true(after == before + 1); /* the workload did split a run */
    assert_int_equal(mt_alloc_malloc(a, (size_t)1 << 40, NULL, MT_TAG_ACTIVATIONS, &y), MT_ENOMEM);
    assert_int_equal(mt_prof_flush(p), 0);
    snprintf(path, sizeof path, "%s/oom-%d-dev0-1.pickle", oomdir, (int)getpid());
    compare(path, a, "after the middle unmap");

    /* The gap mapped again: the two runs are one segment. */
    assert_int_equal(mt_alloc_malloc(a, 16 * MIB, NULL, MT_TAG_WEIGHTS, &x[2]), 0);
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    print_message("expandable segments after the gap is mapped: %zu\n", count_expandable(snap));
    mt_alloc_snapshot_free(&snap);
    assert_int_equal(mt_alloc_malloc(a, (size_t)1 << 40, NULL, MT_TAG_ACTIVATIONS, &y), MT_ENOMEM);
    assert_int_equal(mt_prof_flush(p), 0);
    snprintf(path, sizeof path, "%s/oom-%d-dev0-2.pickle", oomdir, (int)getpid());
    compare(path, a, "after the gap is mapped");

    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    mt_prof_destroy(&p);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_middle_unmap_then_join),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
