/* The free extents kept from one figure to the next (analysis/model_free.c) against the
 * sweep of every block (mt__model_figures): random event streams, the two figures compared
 * (every field, bit for bit) at every event, at random moments and rarely (the journal
 * filled and applied in between), with the model's checker (which rebuilds the kept
 * extents and compares them) after each comparison. One stream is what an allocator gives
 * (blocks in the free space of segments, segments freed empty, runs mapped page by page,
 * gaps): there the extents must stay kept, not be dropped and swept anew. The other is
 * anything: overlapping and empty blocks, blocks outside every segment, segments freed
 * under live blocks, cuts of nothing, frees of another size. Then the report's timeline:
 * each of its samples is the figures of one state of the replay. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "analysis/model_internal.h"
#include "analysis/report.h"
#include "model_gen.h"
#include "mt_config.h"
#include "tests/common/test_main.h"

/* A run's steps: a quarter where each costs 10-50x (MT_TEST_LIGHT: the sanitizers' build,
 * qemu), the rare events' rates kept. */
#define RUN_STEPS(n) (MT_TEST_LIGHT ? (n) / 4 : (n))

#define PAGE (UINT64_C(64) << 10)
#define BASE UINT64_C(0x7f0000000000)

static uint64_t rng(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

typedef struct blk_s {
    uint64_t addr, size;
} blk_t;

typedef struct run_s {
    mgen_t g;
    uint64_t seed;
    blk_t live[4096]; /* the blocks the stream allocated and has not freed */
    size_t nlive;
    size_t events;              /* applied */
    size_t compared, kept;      /* comparisons, and those with the extents kept */
    mt__report_t *r;            /* the events go here too when set */
    mt_model_figures_t *states; /* when set: the full figures after each event */
    size_t nstates;
} run_t;

static const mt__mclass_t *device(const run_t *x)
{
    return &x->g.m->cls[MT_MODEL_DEVICE];
}

static void compare(run_t *x)
{
    mt_model_figures_t full, kept;
    assert_int_equal(mt__model_figures(x->g.m, MT_MODEL_DEVICE, &full), 0);
    assert_int_equal(mt__model_figures_kept(x->g.m, MT_MODEL_DEVICE, &kept), 0);
    if (memcmp(&full, &kept, sizeof full) != 0)
        fail_msg("event %zu: free %llu, largest %llu; kept %llu, %llu", x->events,
                 (unsigned long long)full.total_free, (unsigned long long)full.largest_free,
                 (unsigned long long)kept.total_free, (unsigned long long)kept.largest_free);
    char why[256] = "";
    if (mt__model_check(x->g.m, why, sizeof why) != 0)
        fail_msg("event %zu: mt__model_check: %s", x->events, why);
    x->compared++;
    x->kept += mt__model_free_following(device(x));
}

/* Applies one event; compares the figures with probability 1 / every. */
static void put(run_t *x, int kind, uint64_t addr, uint64_t size, uint64_t every)
{
    mt_event_rec_t ev = mgen_rec(&x->g, kind, addr, size, (int)(addr >> 16) % 7);
    if (rng(&x->seed) % 64 == 0 && kind != MT_EV_GAP)
        ev.seq += 1 + rng(&x->seed) % 3; /* events lost before it: a gap */
    x->g.seq = ev.seq + 1;
    assert_int_equal(mt__model_apply(x->g.m, &ev), 0);
    if (x->r != NULL)
        assert_int_equal(mt__report_add_event(x->r, 1, &ev, NULL), 0);
    x->events++;
    if (x->states != NULL)
        assert_int_equal(mt__model_figures(x->g.m, MT_MODEL_DEVICE, &x->states[x->nstates++]), 0);
    if (rng(&x->seed) % every == 0)
        compare(x);
}

static bool overlaps_live(const run_t *x, uint64_t addr, uint64_t end)
{
    for (size_t i = 0; i < x->nlive; i++)
        if (x->live[i].addr < end && addr < x->live[i].addr + x->live[i].size)
            return true;
    return false;
}

/* The segment of the device class at random, or NULL. */
static const mt__seg_t *some_segment(run_t *x)
{
    const mt__segmap_t *m = &device(x)->segs;
    size_t n = mt__segmap_count(m);
    if (n == 0)
        return NULL;
    mt__segmap_it_t it = mt__segmap_first(m);
    for (size_t k = rng(&x->seed) % n; k > 0; k--)
        mt__segmap_next(&it);
    return mt__segmap_get(it);
}

/* One event of an allocator's shape over 256 pages. */
static void allocator_step(run_t *x, uint64_t every)
{
    const mt__segmap_t *segs = &device(x)->segs;
    uint64_t at = BASE + rng(&x->seed) % 256 * PAGE, len = (1 + rng(&x->seed) % 4) * PAGE;
    unsigned what = (unsigned)(rng(&x->seed) % 17);
    const mt__seg_t *g = some_segment(x);
    if (what < 2 || g == NULL) { /* a segment where there is none, or pages mapped */
        bool mapped = what == 1;
        if (mapped && g != NULL && g->mapped && rng(&x->seed) % 2) /* at a run's end */
            at = g->addr + g->size, len = PAGE;
        const mt__seg_t *holding = mt__segmap_get(mt__segmap_find(segs, at));
        const mt__seg_t *next = mt__segmap_get(mt__segmap_lower(segs, at));
        if (holding == NULL && (next == NULL || next->addr >= at + len))
            put(x, mapped ? MT_EV_SEGMENT_MAP : MT_EV_SEGMENT_ALLOC, at, len, every);
        return;
    }
    if (what < 3 && rng(&x->seed) % 3 == 0) { /* a segment freed, pages unmapped: empty */
        uint64_t a = g->addr, n = g->size;
        if (g->mapped && g->size > PAGE) /* a page of the run: its start, middle or end */
            a += rng(&x->seed) % (g->size / PAGE) * PAGE, n = PAGE;
        if (!overlaps_live(x, a, a + n))
            put(x, g->mapped ? MT_EV_SEGMENT_UNMAP : MT_EV_SEGMENT_FREE, a, n, every);
        return;
    }
    if (what < 12 && x->nlive < 4096) { /* a block in the free space of a segment */
        uint64_t a = g->addr + rng(&x->seed) % (g->size / 512) * 512;
        uint64_t n = (1 + rng(&x->seed) % 64) * 512, end = g->addr + g->size;
        n = a + n > end ? end - a : n;
        if (!overlaps_live(x, a, a + n)) {
            put(x, MT_EV_ALLOC, a, n, every);
            x->live[x->nlive++] = (blk_t){a, n};
            if (rng(&x->seed) % 4 == 0) { /* a temporary: freed at once */
                x->nlive--;
                put(x, MT_EV_FREE_REQUESTED, a, n, every);
                put(x, MT_EV_FREE_COMPLETED, a, n, every);
            }
        }
        return;
    }
    if (x->nlive > 0) { /* a block freed */
        size_t i = rng(&x->seed) % x->nlive;
        blk_t b = x->live[i];
        x->live[i] = x->live[--x->nlive];
        put(x, MT_EV_FREE_REQUESTED, b.addr, b.size, every);
        put(x, MT_EV_FREE_COMPLETED, b.addr, b.size, every);
        if (rng(&x->seed) % 2 == 0) { /* the same block again (a training loop's), or
                                       * one of another size at its address */
            b.size = rng(&x->seed) % 4 == 0 && b.size > 512 ? b.size - 512 : b.size;
            put(x, MT_EV_ALLOC, b.addr, b.size, every);
            x->live[x->nlive++] = b;
        }
    }
}

static void any_step(run_t *x, uint64_t every, uint64_t base);

/* steps events of the allocator's shape, one in odd (0: none) anything. */
static void allocator_run(uint64_t seed, size_t steps, uint64_t every, uint64_t odd)
{
    run_t *x = calloc(1, sizeof *x);
    assert_non_null(x);
    x->seed = seed;
    assert_int_equal(mt__model_create(&x->g.m, NULL), 0);
    compare(x); /* the first: the extents are made, then kept */
    size_t most = 0;
    for (size_t s = 0; s < steps; s++) {
        if (odd != 0 && rng(&x->seed) % odd == 0)
            any_step(x, every, BASE);
        else
            allocator_step(x, every);
        most = device(x)->live > most ? device(x)->live : most;
    }
    compare(x);
    assert_true(x->compared > 2 && most > 200);
    if (odd == 0) /* never dropped: every figure but the first costs the changes since */
        assert_int_equal(x->kept, x->compared);
    else /* dropped, and kept again */
        assert_true(x->kept > 0 && x->kept < x->compared);
    mt__model_destroy(&x->g.m);
    free(x);
}

static void test_allocator_streams(void **state)
{
    (void)state;
    allocator_run(1, RUN_STEPS(20000), 1, 0);   /* the figures after every event */
    allocator_run(2, RUN_STEPS(40000), 40, 0);  /* now and then */
    allocator_run(3, 60000, 9000, 0);           /* the journal fills between two */
    allocator_run(4, RUN_STEPS(30000), 1, 400); /* now and then anything: dropped, made again */
    allocator_run(5, RUN_STEPS(40000), 30, 150);
}

/* Anything over 64 pages near the top of the address space or at its bottom. */
static void any_step(run_t *x, uint64_t every, uint64_t base)
{
    uint64_t at = base + rng(&x->seed) % 64 * PAGE + (rng(&x->seed) % 4 == 0 ? 4096 : 0);
    uint64_t len = (rng(&x->seed) % 5) * PAGE / (1 + rng(&x->seed) % 3);
    static const int kinds[] = {MT_EV_SEGMENT_ALLOC, MT_EV_SEGMENT_MAP,    MT_EV_SEGMENT_FREE,
                                MT_EV_SEGMENT_UNMAP, MT_EV_ALLOC,          MT_EV_ALLOC,
                                MT_EV_ALLOC,         MT_EV_FREE_REQUESTED, MT_EV_FREE_COMPLETED,
                                MT_EV_FREE_COMPLETED};
    int kind = kinds[rng(&x->seed) % (sizeof kinds / sizeof kinds[0])];
    if ((kind == MT_EV_FREE_REQUESTED || kind == MT_EV_FREE_COMPLETED) && x->nlive > 0 &&
        rng(&x->seed) % 4 != 0) {
        size_t i = rng(&x->seed) % x->nlive;
        at = x->live[i].addr;
        len = rng(&x->seed) % 8 == 0 ? len : x->live[i].size; /* another size now and then */
        if (kind == MT_EV_FREE_COMPLETED)
            x->live[i] = x->live[--x->nlive];
    }
    if (kind == MT_EV_ALLOC && x->nlive < 4096)
        x->live[x->nlive++] = (blk_t){at, len};
    put(x, kind, at, len, every);
}

static void any_run(uint64_t seed, size_t steps, uint64_t every, uint64_t base)
{
    run_t *x = calloc(1, sizeof *x);
    assert_non_null(x);
    x->seed = seed;
    assert_int_equal(mt__model_create(&x->g.m, NULL), 0);
    compare(x);
    for (size_t s = 0; s < steps; s++)
        any_step(x, every, base);
    compare(x);
    mt__model_destroy(&x->g.m);
    free(x);
}

static void test_any_streams(void **state)
{
    (void)state;
    any_run(11, RUN_STEPS(30000), 1, BASE);
    any_run(12, RUN_STEPS(30000), 25, BASE);
    any_run(13, RUN_STEPS(20000), 1, 0);                      /* address 0 among them */
    any_run(14, RUN_STEPS(20000), 3, UINT64_MAX - 60 * PAGE); /* ends at 2^64 */
}

/* The report's timeline at many steps: each sample (allocated, reserved, utilization,
 * fragmentation) is the full figures of a state of the replay, in time order. */
static void test_timeline_samples(void **state)
{
    (void)state;
    run_t *x = calloc(1, sizeof *x);
    assert_non_null(x);
    x->seed = 21;
    mt__report_cfg_t cfg = mt__report_cfg_default();
    cfg.timeline_steps = 700;
    assert_int_equal(mt__report_create(&x->r, &cfg), 0);
    assert_int_equal(mt__model_create(&x->g.m, NULL), 0);
    enum { STEPS = 3000 };
    x->states = calloc(2 * STEPS + 2, sizeof *x->states);
    assert_non_null(x->states);
    assert_int_equal(mt__model_figures(x->g.m, MT_MODEL_DEVICE, &x->states[x->nstates++]), 0);
    for (size_t s = 0; s < STEPS; s++)
        allocator_step(x, UINT64_MAX);
    const mt_model_figures_t *st = x->states;
    size_t n = x->nstates;
    json_t *res = mt__report_result(x->r);
    assert_non_null(res);
    json_t *p = json_array_get(json_object_get(res, "processes"), 0);
    json_t *tl = json_object_get(p, "timeline"), *pt;
    assert_true(json_array_size(tl) > 100);
    size_t i, from = 0;
    json_array_foreach(tl, i, pt)
    {
        uint64_t a = (uint64_t)json_integer_value(json_object_get(pt, "allocated"));
        uint64_t r = (uint64_t)json_integer_value(json_object_get(pt, "reserved"));
        double u = json_real_value(json_object_get(pt, "utilization"));
        double f = json_real_value(json_object_get(pt, "fragmentation"));
        size_t k = from;
        while (k < n && !(st[k].allocated == a && st[k].reserved == r && st[k].utilization == u &&
                          st[k].fragmentation == f))
            k++;
        if (k == n)
            fail_msg("sample %zu (%llu allocated, fragmentation %.17g) is no state's", i,
                     (unsigned long long)a, f);
        from = k;
    }
    json_decref(res);
    free(x->states);
    mt__report_destroy(&x->r);
    mt__model_destroy(&x->g.m);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allocator_streams),
        cmocka_unit_test(test_any_streams),
        cmocka_unit_test(test_timeline_samples),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
