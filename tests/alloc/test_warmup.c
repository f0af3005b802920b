/* Warm-up reservations, snapshots, tags, statistics and the event stream. */
#include "helpers.h"
#include "tests/common/test_main.h"

/* ---- an RNN-like batch: per-step activations kept for backward, temporaries ---- */

enum { MAXLEN = 64, B = 32, H = 256, IN = 128 };

static unsigned next_rand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 8) & 0xffffff;
}

static void run_batch(mt_alloc_t *a, mt_stream_t *s, int len, unsigned *seed)
{
    void *acts[3 * MAXLEN];
    int n = 0;
    void *x = xmalloc_dev(a, (size_t)len * B * IN * 4, s, MT_TAG_BATCH);
    for (int t = 0; t < len; t++) {
        acts[n++] = xmalloc_dev(a, 4 * H * B * 4, s, MT_TAG_ACTIVATIONS); /* gates */
        acts[n++] = xmalloc_dev(a, H * B * 4, s, MT_TAG_ACTIVATIONS);     /* h */
        acts[n++] = xmalloc_dev(a, H * B * 4, s, MT_TAG_ACTIVATIONS);     /* c */
        void *ws = xmalloc_dev(a, 2 * H * B * 4 + next_rand(seed) % 4096, s, MT_TAG_WORKSPACE);
        assert_int_equal(mt_alloc_free(a, ws), 0);
    }
    void *y = xmalloc_dev(a, (size_t)len * B * H * 4, s, MT_TAG_ACTIVATIONS);
    void *dh = xmalloc_dev(a, H * B * 4, s, MT_TAG_GRADS);
    for (int t = len - 1; t >= 0; t--) {
        void *dg = xmalloc_dev(a, 4 * H * B * 4, s, MT_TAG_WORKSPACE);
        assert_int_equal(mt_alloc_free(a, dg), 0);
        for (int k = 0; k < 3; k++)
            assert_int_equal(mt_alloc_free(a, acts[--n]), 0);
    }
    assert_int_equal(mt_alloc_free(a, dh), 0);
    assert_int_equal(mt_alloc_free(a, y), 0);
    assert_int_equal(mt_alloc_free(a, x), 0);
}

/* Free bytes in reserved segments, and how many reserved segments there are. */
static void reserved_room(mt_alloc_t *a, size_t *free_bytes, size_t *nseg)
{
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    *free_bytes = 0;
    *nseg = 0;
    for (size_t i = 0; i < snap->nsegments; i++) {
        if (!snap->segments[i].reserved)
            continue;
        (*nseg)++;
        for (size_t k = 0; k < snap->segments[i].nblocks; k++)
            if (snap->segments[i].blocks[k].state == MT_BLOCK_INACTIVE)
                *free_bytes += snap->segments[i].blocks[k].size;
    }
    mt_alloc_snapshot_free(&snap);
}

static void test_warmup_then_zero_backend_mallocs(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(1024 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    unsigned seed = 42;
    /* Weights and their gradients live across the whole run. */
    void *w = xmalloc_dev(a, 4 * H * (H + IN) * 4, s, MT_TAG_WEIGHTS);
    void *gw = xmalloc_dev(a, 4 * H * (H + IN) * 4, s, MT_TAG_GRADS);

    mt_alloc_reset_peak(a);
    mt_alloc_stats_t st_before = stats_of(a);
    size_t room_before = (size_t)(st_before.reserved_bytes[MT_STAT_ALL].current -
                                  st_before.allocated_bytes[MT_STAT_ALL].current);
    assert_int_equal(mt_alloc_warmup_begin(a), 0);
    run_batch(a, s, MAXLEN, &seed);
    int64_t transient = stats_of(a).allocated_bytes[MT_STAT_ALL].peak -
                        stats_of(a).allocated_bytes[MT_STAT_ALL].current;
    assert_int_equal(mt_alloc_warmup_end(a, s), 0);
    assert_int_equal(mt_alloc_warmup_end(a, s), MT_EINVAL); /* not warming any more */
    assert_int_equal(mt_alloc_check(a), 0);

    /* The reserved segments (the weights' segment, whose free room counts, and a new one
     * for the rest) have free room for the whole transient peak ... */
    size_t free_reserved = 0, nres = 0;
    reserved_room(a, &free_reserved, &nres);
    assert_true(nres >= 1);
    assert_true((int64_t)free_reserved >= transient);
    /* ... and the footprint grew by what the room before lacked, plus slack, not by the
     * whole peak. */
    int64_t lack = transient + transient / 32 - (int64_t)room_before;
    int64_t grown = stats_of(a).reserved_bytes[MT_STAT_ALL].current -
                    st_before.reserved_bytes[MT_STAT_ALL].current;
    assert_true(grown <= (lack > 0 ? lack : 0) + (int64_t)(4 * MIB));
    assert_true(grown < transient);

    uint64_t m0 = backend_mallocs(b);
    for (int batch = 0; batch < 50; batch++) {
        int len = 1 + (int)(next_rand(&seed) % MAXLEN);
        run_batch(a, s, len, &seed);
        /* The cache may be emptied between batches: the reservation survives it. */
        if (batch % 10 == 9)
            assert_int_equal(mt_alloc_empty_cache(a), 0);
    }
    assert_int_equal(backend_mallocs(b), m0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_stats_t st = stats_of(a);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 2 * 4 * H * (H + IN) * 4);
    mt_alloc_free(a, w);
    mt_alloc_free(a, gw);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s);
    mt_backend_destroy(&b);
}

/* A warm-up whose transient requests fit in the free room of the segment holding the
 * long-lived blocks reserves nothing new: that segment becomes the reservation. A block
 * allocated during the warm-up and kept is not transient. A second warm-up of the same
 * shape changes nothing. */
static void test_warmup_uses_free_room(void **state)
{
    (void)state;
    enum { SHORT = 8 };
    mt_backend_t *b = sim_backend(512 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    unsigned seed = 7;
    void *w = xmalloc_dev(a, 2 * MIB, s, MT_TAG_WEIGHTS); /* one 20 MiB large segment */
    assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_ALL].current, 20 * MIB);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(mt_alloc_warmup_begin(a), 0);
        run_batch(a, s, SHORT, &seed);
        /* Optimizer state created lazily in the first step lives on: not transient. */
        void *kept = round == 0 ? xmalloc_dev(a, 3 * MIB, s, MT_TAG_OPTIMIZER) : NULL;
        (void)kept;
        uint64_t m0 = backend_mallocs(b);
        assert_int_equal(mt_alloc_warmup_end(a, s), 0);
        assert_int_equal(backend_mallocs(b), m0);
        assert_int_equal(mt_alloc_check(a), 0);
        assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_ALL].current, 20 * MIB);
        size_t room = 0, nres = 0;
        reserved_room(a, &room, &nres);
        assert_int_equal(nres, 1);
        assert_int_equal(room, 15 * MIB);
    }
    uint64_t m0 = backend_mallocs(b);
    for (int batch = 0; batch < 50; batch++)
        run_batch(a, s, 1 + (int)(next_rand(&seed) % SHORT), &seed);
    assert_int_equal(backend_mallocs(b), m0);
    /* The reservation stands after its long-lived blocks are gone, like any other. */
    assert_int_equal(mt_alloc_free(a, w), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_true(stats_of(a).reserved_bytes[MT_STAT_ALL].current >= (int64_t)(20 * MIB));
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s);
    mt_backend_destroy(&b);
}

/* With no long-lived room, the plan is one new segment near the transient peak; a
 * second warm-up of the same shape reuses it without a backend call. */
static void test_warmup_fresh_segment(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(512 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    unsigned seed = 3;
    assert_int_equal(mt_alloc_warmup_begin(a), 0);
    run_batch(a, s, MAXLEN, &seed);
    int64_t transient = stats_of(a).allocated_bytes[MT_STAT_ALL].peak;
    assert_int_equal(mt_alloc_warmup_end(a, s), 0);
    uint64_t m1 = backend_mallocs(b);
    assert_int_equal(mt_alloc_warmup_begin(a), 0);
    run_batch(a, s, MAXLEN, &seed);
    assert_int_equal(mt_alloc_warmup_end(a, s), 0);
    assert_int_equal(backend_mallocs(b), m1);
    int64_t reserved = stats_of(a).reserved_bytes[MT_STAT_ALL].current;
    assert_true(reserved >= transient);
    assert_true(reserved <= transient + transient / 32 + (int64_t)(2 * MIB));
    size_t room = 0, nres = 0;
    reserved_room(a, &room, &nres);
    assert_int_equal(nres, 1);
    uint64_t m0 = backend_mallocs(b);
    for (int batch = 0; batch < 50; batch++)
        run_batch(a, s, 1 + (int)(next_rand(&seed) % MAXLEN), &seed);
    assert_int_equal(backend_mallocs(b), m0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s);
    mt_backend_destroy(&b);
}

/* ---- a planned warm-up: tensors of a static graph (the somas_* traces' kind) ---- */

enum { NT = 700 };

typedef struct tensor_s {
    uint32_t t0, t1; /* allocated at step t0, freed at step t1 */
    size_t size;
} tensor_t;

/* Deterministic tensors: one allocated per step, most short-lived, some living across
 * much of the step, sizes from 512 B to 48 MiB. */
static void make_tensors(tensor_t *t, unsigned seed)
{
    for (uint32_t i = 0; i < NT; i++) {
        unsigned r = next_rand(&seed) % 100, life;
        if (r < 70)
            life = 1 + next_rand(&seed) % 8;
        else if (r < 95)
            life = 10 + next_rand(&seed) % 90;
        else
            life = 150 + next_rand(&seed) % 400;
        size_t size = (size_t)512 << (next_rand(&seed) % 17);
        size += (next_rand(&seed) % 64) * (size / 64);
        t[i] = (tensor_t){i, i + life, size};
    }
}

/* One pass: at each step the tensors ending there are freed, then that step's one is
 * allocated; ptr[i] receives tensor i's address. Returns the peak of live bytes. */
static size_t run_tensors(mt_alloc_t *a, mt_stream_t *s, const tensor_t *t, void **ptr)
{
    size_t live = 0, peak = 0;
    for (uint32_t step = 0; step < NT + 600; step++) {
        for (uint32_t i = 0; i < NT; i++)
            if (t[i].t1 == step || (step == NT + 599 && t[i].t1 > step)) {
                assert_int_equal(mt_alloc_free(a, ptr[i]), 0);
                live -= t[i].size;
            }
        if (step < NT) {
            ptr[step] = xmalloc_dev(a, t[step].size, s, MT_TAG_ACTIVATIONS);
            live += t[step].size;
            peak = live > peak ? live : peak;
        }
    }
    return peak;
}

/* A warm-up of a fixed sequence is planned offline: the reservation is within 1/16 (and
 * the 2 MiB rounding) of the sequence's peak of live bytes (330 MiB for a 311.8 MiB peak;
 * sizing by a best-fit replay, as before, reserved 386 MiB), every later pass of the same
 * sequence lands each tensor at the address it had in the pass before, and none calls
 * the backend. */
static void test_warmup_plan_repeats_exactly(void **state)
{
    (void)state;
    tensor_t *t = malloc(NT * sizeof *t);
    void **p0 = calloc(NT, sizeof *p0), **p1 = calloc(NT, sizeof *p1);
    assert_true(t && p0 && p1);
    make_tensors(t, 11);
    mt_backend_t *b = sim_backend(4096 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    assert_int_equal(mt_alloc_warmup_begin(a), 0);
    size_t peak = run_tensors(a, s, t, p0);
    assert_int_equal(mt_alloc_warmup_end(a, s), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    int64_t reserved = stats_of(a).reserved_bytes[MT_STAT_ALL].current;
    print_message("tensor peak %.1f MiB, reservation %.1f MiB\n", (double)peak / MIB,
                  (double)reserved / MIB);
    assert_true(reserved >= (int64_t)peak);
    assert_true(reserved <= (int64_t)(peak + peak / 16 + 2 * MIB));
    uint64_t m0 = backend_mallocs(b);
    mt_alloc_reset_peak(a);
    run_tensors(a, s, t, p0);
    for (int pass = 0; pass < 3; pass++) {
        run_tensors(a, s, t, p1);
        assert_memory_equal(p0, p1, NT * sizeof *p0);
        assert_int_equal(mt_alloc_check(a), 0);
    }
    assert_int_equal(backend_mallocs(b), m0);
    mt_alloc_stats_t st = stats_of(a);
    assert_int_equal(st.reserved_bytes[MT_STAT_ALL].peak, reserved);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s);
    mt_backend_destroy(&b);
    free(t);
    free(p0);
    free(p1);
}

/* The offline placement on random items: no two items live at the same time share a
 * byte of a strip, bounded strips hold what they are given, and the unbounded strip's
 * extent stays near the peak of what the bounded ones cannot hold. */
static void test_plan_place_is_sound(void **state)
{
    (void)state;
    enum { N = 1500, STRIPS = 3 };
    mt__plan_item_t *it = malloc(N * sizeof *it);
    assert_non_null(it);
    for (unsigned seed = 1; seed <= 4; seed++) {
        unsigned rs = seed;
        for (uint32_t i = 0; i < N; i++) {
            uint32_t life =
                next_rand(&rs) % 10 < 8 ? 1 + next_rand(&rs) % 20 : 1 + next_rand(&rs) % 600;
            it[i] = (mt__plan_item_t){
                .size = (1 + next_rand(&rs) % 64) * 512 * (1 + i % 7), .t0 = i, .t1 = i + life};
        }
        /* Two small bounded strips (seed 1 has none) and the unbounded one. */
        size_t cap[STRIPS] = {seed > 1 ? 96 * KIB : 0, seed > 1 ? 1 * MIB : 0, 0};
        size_t ext[3] = {0};
        for (int how = 0; how < 3; how++) {
            size_t extent = 0;
            if (how == 0)
                assert_int_equal(mt__plan_place_sweep(it, N, cap, STRIPS, &extent), 0);
            else if (how == 1)
                assert_int_equal(
                    mt__plan_place_greedy(it, N, cap, STRIPS, &extent, UINT64_MAX, NULL), 0);
            else
                assert_int_equal(mt__plan_place(it, N, cap, STRIPS, &extent), 0);
            size_t peak = 0;
            for (uint32_t step = 0; step < N + 600; step++) {
                size_t live = 0;
                for (uint32_t i = 0; i < N; i++)
                    if (it[i].t0 <= step && step < it[i].t1)
                        live += it[i].size;
                peak = live > peak ? live : peak;
            }
            for (uint32_t i = 0; i < N; i++) {
                assert_true(it[i].strip < STRIPS);
                if (it[i].strip + 1 < STRIPS)
                    assert_true(it[i].off + it[i].size <= cap[it[i].strip]);
                else
                    assert_true(it[i].off + it[i].size <= extent);
                for (uint32_t j = i + 1; j < N; j++) {
                    bool in_time = it[i].t0 < it[j].t1 && it[j].t0 < it[i].t1;
                    bool in_space = it[i].strip == it[j].strip &&
                                    it[i].off < it[j].off + it[j].size &&
                                    it[j].off < it[i].off + it[i].size;
                    assert_false(in_time && in_space);
                }
            }
            static const char *const name[] = {"sweep", "greedy", "kept"};
            print_message("seed %u, %s: peak %zu, extent %zu (%.3f)\n", seed, name[how], peak,
                          extent, (double)extent / (double)peak);
            if (how > 0) /* the sweep alone is only sound; the one kept is also tight */
                assert_true(extent <= peak + peak / 20);
            ext[how] = extent;
            if (how == 2) /* never worse than the greedy orders alone */
                assert_true(ext[2] <= ext[1] && ext[2] <= ext[0]);
            if (seed == 1)
                assert_true(extent >= peak);
        }
    }
    free(it);
}

/* The warm-up's plan is computed with the allocator's lock released: another thread's
 * allocation completes while a plan of 200 k records is being made, not after it. The
 * planner says when it starts (a debug message, made without the lock); the message's
 * callback, in the planning thread, starts the other thread and waits for its allocation
 * to complete before letting the planning go on. If the lock were held there, the
 * allocation could not complete until the planning ended: the wait would run out. */
typedef struct unlocked_s {
    mt_alloc_t *a;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool started, done, done_in_time;
    int plans;    /* planning messages seen */
    void *change; /* test_plan_again: allocated by the first message's callback */
} unlocked_t;

static void *other_thread(void *arg)
{
    unlocked_t *u = arg;
    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(u->a, 1 * MIB, NULL, MT_TAG_OTHER, &p), 0);
    assert_int_equal(mt_alloc_free(u->a, p), 0);
    pthread_mutex_lock(&u->mu);
    u->done = true;
    pthread_cond_broadcast(&u->cv);
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

static void planning_log(void *ud, mt_log_level_e level, const char *msg)
{
    unlocked_t *u = ud;
    if (level != MT_LOG_DEBUG || strstr(msg, "lock released") == NULL || u->plans++ > 0)
        return;
    u->started = true;
    assert_int_equal(pthread_create(&u->th, NULL, other_thread, u), 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60; /* only a lock held here ends the wait this way */
    pthread_mutex_lock(&u->mu);
    while (!u->done && pthread_cond_timedwait(&u->cv, &u->mu, &until) == 0)
        ;
    u->done_in_time = u->done;
    pthread_mutex_unlock(&u->mu);
}

static void test_plan_leaves_the_lock(void **state)
{
    (void)state;
    enum { RECORDS = 200000, LIVE = 64 };
    mt_backend_t *b = sim_backend(4096 * MIB);
    unlocked_t u = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    cfg.backend = b;
    cfg.log = planning_log;
    cfg.log_ud = &u;
    assert_int_equal(mt_alloc_create(&u.a, &cfg), 0);
    mt_alloc_t *a = u.a;
    void *live[LIVE] = {0};
    unsigned seed = 5;
    assert_int_equal(mt_alloc_warmup_begin(a), 0);
    for (int i = 0; i < RECORDS / 2; i++) { /* an allocation and a free per step */
        void **slot = &live[i % LIVE];
        if (*slot != NULL)
            assert_int_equal(mt_alloc_free(a, *slot), 0);
        size_t n = (1 + next_rand(&seed) % 128) * 512;
        assert_int_equal(mt_alloc_malloc(a, n, NULL, MT_TAG_OTHER, slot), 0);
    }
    for (int i = 0; i < LIVE; i++)
        assert_int_equal(mt_alloc_free(a, live[i]), 0);
    assert_int_equal(mt_alloc_warmup_end(a, NULL), 0);
    assert_true(u.started);       /* the planner ran with the lock released */
    assert_true(u.done_in_time);  /* and another thread allocated meanwhile */
    assert_int_equal(u.plans, 1); /* once: nothing it planned with had changed */
    assert_int_equal(pthread_join(u.th, NULL), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* A plan made with the lock released is installed only if the free blocks it was made for
 * are still there: here the first planning message's callback takes a block from the free
 * room of the weights' segment (a candidate), so the planner must plan again, and the plan
 * it installs must leave that block alone. */
static void changing_log(void *ud, mt_log_level_e level, const char *msg)
{
    unlocked_t *u = ud;
    if (level != MT_LOG_DEBUG || strstr(msg, "lock released") == NULL || u->plans++ > 0)
        return;
    assert_int_equal(mt_alloc_malloc(u->a, 3 * MIB, NULL, MT_TAG_OTHER, &u->change), 0);
}

static void test_plan_again_when_blocks_change(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(1024 * MIB);
    unlocked_t u = {0};
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    cfg.backend = b;
    cfg.log = changing_log;
    cfg.log_ud = &u;
    char err[128];
    assert_int_equal(mt_alloc_cfg_parse(&cfg, "rules:reference", err, sizeof err), 0);
    assert_int_equal(mt_alloc_create(&u.a, &cfg), 0);
    mt_alloc_t *a = u.a;
    void *w = xmalloc_dev(a, 4 * MIB, NULL, MT_TAG_WEIGHTS); /* a 20 MiB segment, 16 free */
    assert_int_equal(mt_alloc_warmup_begin(a), 0);
    void *p[16];
    for (int i = 0; i < 16; i++)
        p[i] = xmalloc_dev(a, (size_t)(1 + i % 4) * MIB, NULL, MT_TAG_OTHER);
    for (int i = 0; i < 16; i++)
        assert_int_equal(mt_alloc_free(a, p[i]), 0);
    assert_int_equal(mt_alloc_warmup_end(a, NULL), 0);
    assert_int_equal(u.plans, 2); /* planned again after the change */
    assert_non_null(u.change);
    assert_int_equal(mt_alloc_check(a), 0);
    /* The plan is followed with the changed block still live: no planned block may land on
     * it (the checker and the sim would catch an overlap). */
    uint64_t m0 = backend_mallocs(b);
    for (int i = 0; i < 16; i++)
        p[i] = xmalloc_dev(a, (size_t)(1 + i % 4) * MIB, NULL, MT_TAG_OTHER);
    void *base = NULL;
    size_t size = 0;
    for (int i = 0; i < 16; i++) {
        assert_int_equal(mt_alloc_block_info(a, p[i], &base, &size, NULL), 0);
        bool apart = (uintptr_t)p[i] + size <= (uintptr_t)u.change ||
                     (uintptr_t)u.change + 3 * MIB <= (uintptr_t)p[i];
        assert_true(apart);
    }
    for (int i = 0; i < 16; i++)
        assert_int_equal(mt_alloc_free(a, p[i]), 0);
    assert_int_equal(backend_mallocs(b), m0);
    assert_int_equal(mt_alloc_check(a), 0);
    assert_int_equal(mt_alloc_free(a, u.change), 0);
    assert_int_equal(mt_alloc_free(a, w), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_reserve(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(512 * MIB);
    rec_sink_t rec;
    rec_init(&rec);
    mt_alloc_t *a = make_alloc(b, "garbage_collection_threshold:0.1", &rec.sink);
    assert_int_equal(mt_alloc_reserve(a, 100 * MIB - 5, NULL), 0);
    assert_int_equal(rec_count(&rec, MT_EV_RESERVE), 1);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 100 * MIB);
    uint64_t m0 = backend_mallocs(b);
    /* Requests of any size, small or large, are carved from it. */
    void *p[6];
    size_t sizes[6] = {1000, 70 * MIB, 512, 3 * MIB, 20 * MIB, 4096};
    for (int i = 0; i < 6; i++)
        p[i] = xmalloc_dev(a, sizes[i], NULL, 0);
    assert_int_equal(backend_mallocs(b), m0);
    assert_int_equal(mt_alloc_check(a), 0);
    for (int i = 0; i < 6; i++)
        mt_alloc_free(a, p[i]);
    /* empty_cache and GC leave it alone. */
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 100 * MIB);
    void *q = xmalloc_dev(a, 150 * MIB, NULL, 0); /* runs GC: reserved > 0.1 x limit */
    s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 250 * MIB);
    mt_alloc_free(a, q);
    /* A reservation that is already large enough is kept; a larger one replaces it. */
    assert_int_equal(mt_alloc_reserve(a, 50 * MIB, NULL), 0);
    assert_int_equal(backend_mallocs(b), m0 + 1);
    assert_int_equal(mt_alloc_reserve(a, 120 * MIB, NULL), 0);
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    size_t res_bytes = 0;
    for (size_t i = 0; i < snap->nsegments; i++)
        if (snap->segments[i].reserved)
            res_bytes += snap->segments[i].size;
    assert_int_equal(res_bytes, 120 * MIB);
    mt_alloc_snapshot_free(&snap);
    /* A reservation beyond the device fails with the OOM report. */
    assert_int_equal(mt_alloc_reserve(a, 2048 * MIB, NULL), MT_ENOMEM);
    assert_non_null(strstr(mt_alloc_last_error(a), "tried to allocate"));
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    s = (mt_alloc_stats_t){0};
    assert_int_equal(mt__sim_used_bytes(b), 0);
    mt_backend_destroy(&b);
    rec_fini(&rec);
}

static void test_snapshot_content(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    char *p1 = xmalloc_dev(a, 100, NULL, MT_TAG_WEIGHTS);
    char *p2 = xmalloc_dev(a, 2000, NULL, MT_TAG_GRADS);
    char *p3 = xmalloc_dev(a, 5 * MIB, NULL, MT_TAG_OPTIMIZER);
    mt_alloc_free(a, p2);
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    assert_int_equal(snap->nsegments, 2);
    assert_true(snap->segments[0].addr < snap->segments[1].addr);
    uint64_t total = 0;
    for (size_t i = 0; i < snap->nsegments; i++) {
        const mt_snapshot_segment_t *sg = &snap->segments[i];
        uint64_t at = sg->addr;
        for (size_t j = 0; j < sg->nblocks; j++) {
            assert_int_equal(sg->blocks[j].addr, at);
            at += sg->blocks[j].size;
        }
        assert_int_equal(at, sg->addr + sg->size);
        total += sg->size;
        if (sg->pool == MT_POOL_SMALL) {
            assert_int_equal(sg->size, 2 * MIB);
            /* p2's block merged with the free tail when it was freed. */
            assert_int_equal(sg->nblocks, 2);
            assert_int_equal(sg->blocks[0].addr, (uintptr_t)p1);
            assert_int_equal(sg->blocks[0].state, MT_BLOCK_ACTIVE_ALLOCATED);
            assert_int_equal(sg->blocks[0].requested, 100);
            assert_int_equal(sg->blocks[0].size, 512);
            assert_int_equal(sg->blocks[0].tag, MT_TAG_WEIGHTS);
            assert_int_equal(sg->blocks[1].state, MT_BLOCK_INACTIVE);
            assert_int_equal(sg->blocks[1].requested, 0);
            assert_int_equal(sg->blocks[1].size, 2 * MIB - 512);
        } else {
            assert_int_equal(sg->pool, MT_POOL_LARGE);
            assert_int_equal(sg->size, 20 * MIB);
            assert_int_equal(sg->blocks[0].addr, (uintptr_t)p3);
            assert_int_equal(sg->blocks[0].tag, MT_TAG_OPTIMIZER);
            assert_int_equal(sg->blocks[0].requested, 5 * MIB);
            assert_int_equal(sg->blocks[1].size, 15 * MIB);
        }
    }
    assert_int_equal(total, (uint64_t)snap->stats.reserved_bytes[MT_STAT_ALL].current);
    assert_int_equal(snap->stats.allocated_bytes[MT_STAT_ALL].current, 512 + 5 * MIB);
    assert_true(snap->stats.utilization > 0.2 && snap->stats.utilization < 0.3);
    assert_int_equal(snap->stats.largest_free_block, 15 * MIB);
    assert_int_equal(snap->stats.total_free, 22 * MIB - 512 - 5 * MIB);
    mt_alloc_snapshot_free(&snap);
    assert_null(snap);
    mt_alloc_free(a, p1);
    mt_alloc_free(a, p3);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_tags_and_stats(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    int kv = -1, again = -1, w = -1;
    assert_int_equal(mt_alloc_tag_register(a, "kv_cache", &kv), 0);
    assert_int_equal(kv, MT_TAG_USER_FIRST);
    assert_int_equal(mt_alloc_tag_register(a, "kv_cache", &again), 0);
    assert_int_equal(again, kv);
    assert_int_equal(mt_alloc_tag_register(a, "weights", &w), 0);
    assert_int_equal(w, MT_TAG_WEIGHTS);
    assert_string_equal(mt_alloc_tag_name(a, kv), "kv_cache");
    assert_string_equal(mt_alloc_tag_name(a, MT_TAG_ACTIVATIONS), "activations");
    assert_string_equal(mt_alloc_tag_name(a, 30), "other");
    assert_string_equal(mt_tag_builtin_name(MT_TAG_BATCH), "batch");

    void *p = xmalloc_dev(a, 1000, NULL, kv);
    void *q = xmalloc_dev(a, 3000, NULL, kv);
    void *r = xmalloc_dev(a, 12 * MIB + 1, NULL, MT_TAG_WEIGHTS);
    void *bad = NULL;
    assert_int_equal(mt_alloc_malloc(a, 10, NULL, MT_TAG_MAX, &bad), MT_EINVAL);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.tag_allocated_bytes[kv].current, 1024 + 3072);
    assert_int_equal(s.tag_requested_bytes[kv].current, 4000);
    assert_int_equal(s.tag_allocated_bytes[MT_TAG_WEIGHTS].current, 12 * MIB + 512);
    assert_int_equal(s.allocation[MT_STAT_SMALL].current, 2);
    assert_int_equal(s.allocation[MT_STAT_LARGE].current, 1);
    int tag = -1;
    assert_int_equal(mt_alloc_block_info(a, q, NULL, NULL, &tag), 0);
    assert_int_equal(tag, kv);
    mt_alloc_free(a, q);
    s = stats_of(a);
    assert_int_equal(s.tag_allocated_bytes[kv].current, 1024);
    assert_int_equal(s.tag_allocated_bytes[kv].peak, 4096);
    assert_int_equal(s.tag_allocated_bytes[kv].freed, 3072);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].peak, 4096 + 12 * MIB + 512);
    mt_alloc_reset_peak(a);
    s = stats_of(a);
    assert_int_equal(s.tag_allocated_bytes[kv].peak, 1024);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].peak, 1024 + 12 * MIB + 512);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].allocated, 4096 + 12 * MIB + 512);
    /* All user ids taken: MT_ENOMEM. */
    int t = 0, rc = 0;
    char label[32];
    for (int i = 0; i < MT_TAG_MAX && rc == 0; i++) {
        snprintf(label, sizeof label, "label%d", i);
        rc = mt_alloc_tag_register(a, label, &t);
    }
    assert_int_equal(rc, MT_ENOMEM);
    mt_alloc_free(a, p);
    mt_alloc_free(a, r);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_event_stream(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_stream_t *s1 = NULL;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    rec_sink_t rec;
    rec_init(&rec);
    mt_alloc_t *a = make_alloc(b, NULL, &rec.sink);
    assert_int_equal(rec.n, 2);
    assert_int_equal(rec.ev[0].kind, MT_EV_CONFIG);
    assert_int_equal(rec.ev[0].size, 256 * MIB);
    /* The device's own figure before any segment: nothing used, the capacity. */
    assert_int_equal(rec.ev[1].kind, MT_EV_DEVICE);
    assert_int_equal(rec.ev[1].size, 0);
    assert_int_equal(rec.ev[1].requested, 256 * MIB);

    void *p = xmalloc_dev(a, 1000, s1, MT_TAG_BATCH);
    assert_int_equal(rec.n, 5);
    const mt_event_rec_t *seg = &rec.ev[2], *dev = &rec.ev[3], *al = &rec.ev[4];
    /* After a segment, the device's figure says what the driver now counts used. */
    assert_int_equal(dev->kind, MT_EV_DEVICE);
    assert_int_equal(dev->size, 2 * MIB);
    assert_int_equal(dev->reserved, 2 * MIB);
    assert_int_equal(seg->kind, MT_EV_SEGMENT_ALLOC);
    assert_int_equal(seg->size, 2 * MIB);
    assert_int_equal(seg->reserved, 2 * MIB);
    assert_int_equal(seg->pool, MT_POOL_SMALL);
    assert_int_equal(al->kind, MT_EV_ALLOC);
    assert_int_equal(al->addr, (uintptr_t)p);
    assert_int_equal(al->size, 1024);
    assert_int_equal(al->requested, 1000);
    assert_int_equal(al->allocated, 1024);
    assert_int_equal(al->reserved, 2 * MIB);
    assert_int_equal(al->stream, mt_stream_id(s1));
    assert_int_equal(al->tag, MT_TAG_BATCH);
    assert_int_equal(al->pool, MT_POOL_SMALL);
    assert_int_equal(al->device, 0);
    assert_true(al->time_ns >= seg->time_ns && seg->time_ns > 0);
    assert_int_equal(al->seq, 0);

    mt_alloc_free(a, p); /* into the thread's cache: its events go at the marker */
    mt_alloc_emit(a, MT_EV_MARK, MT_MARK_ITERATION, 7, 0);
    assert_int_equal(rec_count(&rec, MT_EV_FREE_REQUESTED), 1);
    assert_int_equal(rec_count(&rec, MT_EV_FREE_COMPLETED), 1);
    assert_int_equal(rec.ev[rec.n - 2].kind, MT_EV_FREE_COMPLETED);
    assert_int_equal(rec.ev[rec.n - 2].allocated, 0);
    assert_int_equal(rec.ev[rec.n - 1].kind, MT_EV_MARK);
    assert_int_equal(rec.ev[rec.n - 1].addr, MT_MARK_ITERATION);
    assert_int_equal(rec.ev[rec.n - 1].size, 7);
    assert_int_equal(rec.ev[rec.n - 1].reserved, 2 * MIB);
    mt_alloc_empty_cache(a);
    assert_int_equal(rec_count(&rec, MT_EV_SEGMENT_FREE), 1);
    assert_int_equal(rec.ev[rec.n - 2].kind, MT_EV_DEVICE);
    assert_int_equal(rec.ev[rec.n - 2].size, 0);
    assert_int_equal(rec.ev[rec.n - 1].kind, MT_EV_EMPTY_CACHE);
    assert_int_equal(rec.ev[rec.n - 1].size, 2 * MIB);
    assert_int_equal(rec.ev[rec.n - 1].reserved, 0);
    for (size_t i = 1; i < rec.n; i++)
        assert_true(rec.ev[i].time_ns >= rec.ev[i - 1].time_ns);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s1);
    mt_backend_destroy(&b);
    rec_fini(&rec);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warmup_then_zero_backend_mallocs),
        cmocka_unit_test(test_warmup_uses_free_room),
        cmocka_unit_test(test_warmup_fresh_segment),
        cmocka_unit_test(test_warmup_plan_repeats_exactly),
        cmocka_unit_test(test_plan_place_is_sound),
        cmocka_unit_test(test_plan_leaves_the_lock),
        cmocka_unit_test(test_plan_again_when_blocks_change),
        cmocka_unit_test(test_reserve),
        cmocka_unit_test(test_snapshot_content),
        cmocka_unit_test(test_tags_and_stats),
        cmocka_unit_test(test_event_stream),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
