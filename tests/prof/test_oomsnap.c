/* The recorder's OOM snapshot (written without a daemon) against the allocator's own
 * snapshot, with expandable segments on (the default): after pages are unmapped from the
 * middle of a run (the run splits in two), and after pages mapped into the gap join the
 * two runs again, each OOM's pickle must list the same segments as mt_alloc_snapshot
 * (address, mapped bytes, expandable, pool, stream) with the same blocks in each: every
 * block's address, size and state (free runs too), and each live block's requested size and
 * tag. */
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
    if (mt__ts_read(&ts, path, err, sizeof err) != 0)
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
        if ((g->large != (s->pool != MT_POOL_SMALL)) || g->stream != (int64_t)s->stream)
            fail_msg("%s: segment %zu: recorder %s on stream %lld, allocator %s on %u", when, i,
                     g->large ? "large" : "small", (long long)g->stream,
                     s->pool == MT_POOL_SMALL ? "small" : "large", s->stream);
        /* Every block in address order on both sides: a free run is one inactive block (the
         * allocator's neighbouring inactive pieces are merged first). */
        uint64_t alloc = 0, active = 0, req = 0;
        size_t k = g->first_block, kend = g->first_block + g->nblocks;
        for (size_t j = 0; j < s->nblocks; j++, k++) {
            mt_snapshot_block_t b = s->blocks[j];
            while (b.state == MT_BLOCK_INACTIVE && j + 1 < s->nblocks &&
                   s->blocks[j + 1].state == MT_BLOCK_INACTIVE)
                b.size += s->blocks[++j].size;
            int want = b.state == MT_BLOCK_INACTIVE              ? MT_TS_INACTIVE
                       : b.state == MT_BLOCK_ACTIVE_PENDING_FREE ? MT_TS_ACTIVE_PENDING_FREE
                                                                 : MT_TS_ACTIVE_ALLOCATED;
            if (k == kend || ts->blocks[k].addr != b.addr || ts->blocks[k].size != b.size ||
                ts->blocks[k].state != want) {
                print_segments(when, snap, ts);
                fail_msg("%s: segment %zu: block %#llx + %llu (state %d) missing or different in "
                         "the recorder's snapshot (%#llx + %llu, state %d)",
                         when, i, (unsigned long long)b.addr, (unsigned long long)b.size, b.state,
                         k < kend ? (unsigned long long)ts->blocks[k].addr : 0ull,
                         k < kend ? (unsigned long long)ts->blocks[k].size : 0ull,
                         k < kend ? ts->blocks[k].state : -1);
            }
            if (b.state == MT_BLOCK_INACTIVE)
                continue;
            if (ts->blocks[k].requested != b.requested || ts->blocks[k].tag != b.tag)
                fail_msg("%s: segment %zu: block %#llx: recorder requested %llu tag %d, "
                         "allocator %llu tag %d",
                         when, i, (unsigned long long)b.addr,
                         (unsigned long long)ts->blocks[k].requested, ts->blocks[k].tag,
                         (unsigned long long)b.requested, b.tag);
            active += b.size;
            alloc += b.state == MT_BLOCK_ACTIVE_ALLOCATED ? b.size : 0;
            req += b.state == MT_BLOCK_ACTIVE_ALLOCATED ? b.requested : 0;
        }
        if (k != kend)
            fail_msg("%s: segment %zu: the recorder lists %zu blocks more (first %#llx)", when, i,
                     kend - k, (unsigned long long)ts->blocks[k].addr);
        assert_int_equal(g->allocated_size, alloc);
        assert_int_equal(g->active_size, active);
        assert_int_equal(g->requested_size, req);
    }
    mt_alloc_snapshot_free(&snap);
    mt__ts_destroy(&ts);
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

    enum { N = 6, NS = 3 };
    void *x[N], *sm[NS], *y;
    for (int i = 0; i < N; i++)
        assert_int_equal(mt_alloc_malloc(a, 8 * MIB, NULL, MT_TAG_ACTIVATIONS, &x[i]), 0);
    /* Small blocks, asked for less than their rounded size, one freed between two: a free
     * gap inside a segment, and requested sizes the pickle must carry. */
    for (int i = 0; i < NS; i++)
        assert_int_equal(mt_alloc_malloc(a, 5000 + (size_t)i, NULL, MT_TAG_WEIGHTS, &sm[i]), 0);
    assert_int_equal(mt_alloc_free(a, sm[1]), 0);
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
