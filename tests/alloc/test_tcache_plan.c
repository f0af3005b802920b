/* Per-thread caches while a warm-up plan is in force (allocator/tcache.c, reserve.c): the
 * pair after a warm-up is the cache's, and over a long mixed sequence the cache changes
 * nothing the plan decides: every address, the plan's cursor, taken entries and live
 * blocks, device calls and stats equal those of the same sequence with tcache:0, with
 * mt_alloc_check after every step. */
#include <pthread.h>

#include "helpers.h"
#include "allocator/tcache.h"
#include "tests/common/test_main.h"

static uint64_t plan_ver(mt_alloc_t *a)
{
    mt__alloc_lock(a);
    uint64_t v = a->plan_ver;
    mt__alloc_unlock(a);
    return v;
}

/* The plan's count of live planned blocks. */
static size_t plan_live(mt_alloc_t *a)
{
    mt__alloc_lock(a);
    size_t n = a->plan.live;
    mt__alloc_unlock(a);
    return n;
}

/* Bytes the allocator's counter holds beyond what the program holds (live): a cache's. */
static int64_t held(mt_alloc_t *a, int64_t live)
{
    mt__alloc_lock(a);
    int64_t g = a->st.allocated_bytes[MT_STAT_ALL].current;
    mt__alloc_unlock(a);
    return g - live;
}

static uint64_t device_calls(mt_backend_t *b)
{
    mt_backend_counters_t c;
    mt_backend_counters(b, &c);
    return c.malloc_calls + c.free_calls + c.vm_map_calls + c.vm_unmap_calls;
}

/* An allocator on b after a warm-up of one 64 KiB pair on the default stream: its plan. */
static mt_alloc_t *warm_pair(mt_backend_t *b)
{
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    assert_int_equal(mt_alloc_warmup_begin(a), 0);
    void *p = xmalloc_dev(a, 64 * KIB, NULL, 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(mt_alloc_warmup_end(a, NULL), 0);
    return a;
}

/* The bench's case: a warm-up of one pair, then pairs. Each free leaves the block in the
 * thread's cache and each request takes it back there: the plan is not consulted (its
 * version does not move), its block stays planned and live, no device call. */
static void test_pair_after_warmup_is_cached(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = warm_pair(b);
    uint64_t calls = device_calls(b);
    void *first = xmalloc_dev(a, 64 * KIB, NULL, 0); /* the global path: the plan places it */
    void *p = first;
    uint64_t v = plan_ver(a);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(mt_alloc_free(a, first), 0);
        assert_int_equal(held(a, 0), 64 * KIB); /* freed into the cache */
        p = xmalloc_dev(a, 64 * KIB, NULL, 0);
        assert_ptr_equal(p, first);
        assert_int_equal(held(a, 64 * KIB), 0);
        assert_int_equal(plan_ver(a), v); /* taken back without the plan */
        mt__alloc_lock(a);
        assert_int_equal(a->plan.live, 1);
        assert_int_equal(a->plan.ntaken, 1);
        mt__alloc_unlock(a);
        assert_int_equal(mt_alloc_check(a), 0);
    }
    assert_int_equal(device_calls(b), calls);
    /* The cumulative counts come back at the flush stats makes: 101 allocations. */
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.allocation[MT_STAT_ALL].allocated, 102);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 64 * KIB);
    assert_int_equal(mt_alloc_free(a, p), 0); /* held: planned and live to the plan */
    assert_int_equal(plan_live(a), 1);
    s = stats_of(a); /* flushes the cache: the block's free reaches the plan */
    assert_int_equal(plan_live(a), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* Another thread's pair: its cache owns the planned block and holds it freed. */
typedef struct other_s {
    mt_alloc_t *a;
    void *first, *p; /* the first pair's block, the last one's */
} other_t;

static void *other_pair(void *arg)
{
    other_t *o = arg;
    for (int i = 0; i < 3; i++) {
        o->p = xmalloc_dev(o->a, 64 * KIB, NULL, 0);
        if (i == 0)
            o->first = o->p;
        assert_int_equal(mt_alloc_free(o->a, o->p), 0);
    }
    return NULL;
}

/* A planned block another thread's cache holds is freed, to the plan, before this thread's
 * request on the plan's stream: the plan restarts its pass and gives the same place, as it
 * would had the other thread's free taken the global path. */
static void test_other_threads_planned_block(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = warm_pair(b);
    other_t o = {a, NULL, NULL};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_pair, &o), 0);
    pthread_join(th, NULL);
    assert_int_equal(held(a, 0), 0); /* its exit flushed its cache */
    /* Now this thread's cache holds the planned block and the other thread asks. */
    void *q = xmalloc_dev(a, 64 * KIB, NULL, 0);
    assert_ptr_equal(q, o.p);
    assert_int_equal(mt_alloc_free(a, q), 0);
    assert_int_equal(held(a, 0), 64 * KIB); /* held in this thread's cache, planned */
    uint64_t v = plan_ver(a);
    assert_int_equal(pthread_create(&th, NULL, other_pair, &o), 0);
    pthread_join(th, NULL);
    assert_ptr_equal(o.first, q); /* the planned place at once, the pass restarted */
    assert_ptr_equal(o.p, q);
    assert_true(plan_ver(a) != v);
    assert_int_equal(held(a, 0), 0); /* this thread's cache was flushed to the plan */
    assert_int_equal(plan_live(a), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* ---- the same sequence with and without the cache ---- */

#define SLOTS 8

typedef struct side_s {
    mt_backend_t *b;
    mt_alloc_t *a;
    mt_stream_t *s2;
    void *live[SLOTS];
    size_t size[SLOTS]; /* block sizes of the live ones */
    int64_t bytes;      /* the program's allocated bytes */
    unsigned kept;      /* frees after which a cache held the block */
} side_t;

static void side_init(side_t *x, const char *conf)
{
    x->b = sim_backend(1024 * MIB);
    x->a = make_alloc_default(x->b, conf, NULL);
    assert_int_equal(mt_stream_create(x->b, &x->s2), 0);
    memset(x->live, 0, sizeof x->live);
    x->bytes = 0;
    x->kept = 0;
}

static void side_fini(side_t *x)
{
    for (int k = 0; k < SLOTS; k++)
        if (x->live[k] != NULL)
            assert_int_equal(mt_alloc_free(x->a, x->live[k]), 0);
    assert_int_equal(mt_alloc_check(x->a), 0);
    mt_alloc_destroy(&x->a);
    mt_stream_destroy(x->b, &x->s2);
    mt_backend_destroy(&x->b);
}

/* One step on both sides: slot k freed if live, else allocated (size, stream 2 or not).
 * Returns whether the cached side took the plan's path (its version moved). */
static bool both(side_t x[2], int k, size_t size, bool other)
{
    uint64_t v = plan_ver(x[0].a);
    for (int i = 0; i < 2; i++) {
        side_t *y = &x[i];
        if (y->live[k] != NULL) {
            assert_int_equal(mt_alloc_free(y->a, y->live[k]), 0);
            y->live[k] = NULL;
            y->bytes -= (int64_t)y->size[k];
            y->kept += held(y->a, y->bytes) > 0;
        } else {
            y->live[k] = xmalloc_dev(y->a, size, other ? y->s2 : NULL, (int)(size % 3));
            assert_int_equal(mt_alloc_block_info(y->a, y->live[k], NULL, &y->size[k], NULL), 0);
            y->bytes += (int64_t)y->size[k];
        }
        assert_int_equal(mt_alloc_check(x[i].a), 0);
    }
    /* The cache gives what the plan gives: the same place (each side's device addresses
     * are its backend's: the same offset in a segment of the same size). */
    if (x[0].live[k] != NULL) {
        size_t where[2][2];
        for (int i = 0; i < 2; i++) {
            mt__alloc_lock(x[i].a);
            const mt_segment_t *seg = mt__seg_find(x[i].a, (uintptr_t)x[i].live[k]);
            where[i][0] = (uintptr_t)x[i].live[k] - seg->addr;
            where[i][1] = seg->size;
            mt__alloc_unlock(x[i].a);
        }
        assert_int_equal(where[0][0], where[1][0]);
        assert_int_equal(where[0][1], where[1][1]);
    }
    return plan_ver(x[0].a) != v;
}

/* The plan's state, device calls and the stats of both sides agree (stats flush the
 * caches: afterwards the cached side's plan is the truth's). */
static void agree(side_t x[2])
{
    mt_alloc_stats_t s[2] = {stats_of(x[0].a), stats_of(x[1].a)};
    const mt_stat_t *st[2][6];
    for (int i = 0; i < 2; i++) {
        const mt_alloc_stats_t *y = &s[i];
        const mt_stat_t *t[6] = {y->allocated_bytes, y->requested_bytes, y->allocation,
                                 y->active_bytes,    y->active,          y->reserved_bytes};
        memcpy(st[i], t, sizeof t);
    }
    for (int c = 0; c < 6; c++)
        for (int sp = 0; sp < MT_STAT_N; sp++) {
            assert_int_equal(st[0][c][sp].current, st[1][c][sp].current);
            assert_int_equal(st[0][c][sp].peak, st[1][c][sp].peak);
            assert_int_equal(st[0][c][sp].allocated, st[1][c][sp].allocated);
        }
    for (int t = 0; t < MT_TAG_MAX; t++) {
        assert_int_equal(s[0].tag_allocated_bytes[t].current, s[1].tag_allocated_bytes[t].current);
        assert_int_equal(s[0].tag_allocated_bytes[t].peak, s[1].tag_allocated_bytes[t].peak);
        assert_int_equal(s[0].tag_requested_bytes[t].allocated,
                         s[1].tag_requested_bytes[t].allocated);
    }
    assert_int_equal(device_calls(x[0].b), device_calls(x[1].b));
    const mt__plan_t *p[2] = {&x[0].a->plan, &x[1].a->plan};
    for (int i = 0; i < 2; i++)
        mt__alloc_lock(x[i].a);
    assert_int_equal(p[0]->n, p[1]->n);
    assert_int_equal(p[0]->cursor, p[1]->cursor);
    assert_int_equal(p[0]->ntaken, p[1]->ntaken);
    assert_int_equal(p[0]->live, p[1]->live);
    assert_memory_equal(p[0]->taken, p[1]->taken, (p[0]->n + 63) / 64 * sizeof *p[0]->taken);
    for (int i = 0; i < 2; i++)
        mt__alloc_unlock(x[i].a);
}

static uint32_t rng(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* An iteration of a training loop: a workspace pair first (larger than what follows, so
 * that its pair repeats the plan: the pass restarts at it), then activations. */
static void iteration(side_t x[2])
{
    both(x, 0, MIB, false);
    both(x, 0, 0, false);
    both(x, 1, 256 * KIB, false);
    both(x, 2, 64 * KIB, false);
    both(x, 1, 0, false);
    both(x, 3, 96 * KIB, false);
    both(x, 3, 0, false);
    both(x, 2, 0, false);
}

static void test_plan_exact_with_cache(void **state)
{
    (void)state;
    side_t x[2];
    side_init(&x[0], NULL);
    side_init(&x[1], "tcache:0");
    both(x, 7, 3 * MIB, false); /* weights, alive throughout */
    for (int i = 0; i < 2; i++)
        assert_int_equal(mt_alloc_warmup_begin(x[i].a), 0);
    iteration(x);
    for (int i = 0; i < 2; i++)
        assert_int_equal(mt_alloc_warmup_end(x[i].a, NULL), 0);
    agree(x);
    static const size_t sizes[] = {64 * KIB, 96 * KIB, 256 * KIB, MIB, 3 * MIB};
    uint32_t seed = 2024;
    unsigned cached = 0, planned = 0;
    for (int round = 0; round < 300; round++) {
        unsigned what = rng(&seed) % 8;
        if (what < 3) {
            iteration(x);
        } else if (what < 6) {
            /* pairs of the workspace: after the first, the cache's when the plan allows */
            int n = 2 + (int)(rng(&seed) % 6);
            size_t size = what == 5 ? sizes[rng(&seed) % 5] : MIB;
            for (int j = 0; j < 2 * n; j++) {
                bool plan = both(x, 0, size, false);
                planned += plan;
                cached += !plan && j % 2 == 0 && j > 0 && size == MIB;
            }
        } else {
            /* the sequence left: other sizes, other slots, the other stream */
            int k = 4 + (int)(rng(&seed) % 3);
            both(x, k, sizes[rng(&seed) % 5], what == 7);
        }
        if (round % 25 == 0)
            agree(x);
    }
    agree(x);
    /* The cache served pairs while the plan was in force (taken back without the plan;
     * the frees kept), never on the side without caches. */
    assert_true(cached > 100);
    assert_true(x[0].kept > 100);
    assert_int_equal(x[1].kept, 0);
    assert_true(planned > 100);
    side_fini(&x[0]);
    side_fini(&x[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pair_after_warmup_is_cached),
        cmocka_unit_test(test_other_threads_planned_block),
        cmocka_unit_test(test_plan_exact_with_cache),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
