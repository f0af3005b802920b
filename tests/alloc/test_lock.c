/* No blocking call under the allocator's lock: every device/stream/event synchronize and
 * every vm_reserve/release/map/unmap the allocator makes runs with its mutex released
 * (docs/allocator-locking.md). The sim backend's call hook sees each such call and checks
 * the lock from the calling thread. A two-thread stress run then maps, unmaps and empties
 * the cache on one stream while another thread allocates on a second one. */
#include <pthread.h>
#include <unistd.h>

#include "helpers.h"
#include "tests/common/test_main.h"

/* ---- the watcher ---- */

enum { C_DEV, C_STREAM, C_EVENT, C_RESERVE, C_RELEASE, C_MAP, C_UNMAP, C_N };
static const char *const call_names[C_N] = {"device_synchronize",
                                            "stream_synchronize",
                                            "event_synchronize",
                                            "vm_reserve",
                                            "vm_release",
                                            "vm_map",
                                            "vm_unmap"};

typedef struct watch_s {
    mt_alloc_t *a;
    gate_t gate;   /* closed by free_pending, opened by the first synchronize after it */
    bool threaded; /* other threads use a: only the owner field can tell who holds it */
    pthread_mutex_t mu;
    unsigned calls[C_N];
    unsigned violations;
    char first[64]; /* the first call made under the lock */
} watch_t;

/* True when the calling thread holds a's lock. */
static bool lock_held_here(watch_t *w)
{
#if MT_ASSERT_LEVEL >= 1
    if (w->threaded)
        return mt__alloc_held(w->a);
#endif
    /* One thread: the lock is held only by this thread, by its bias (allocator/lock.h) or
     * through the mutex, which is then busy. */
    if (w->a->lk_gate != NULL || pthread_mutex_trylock(&w->a->mu) != 0)
        return true;
    pthread_mutex_unlock(&w->a->mu);
    return false;
}

static void on_call(void *ud, const char *call)
{
    watch_t *w = ud;
    if (w->a == NULL)
        return;
    bool held = lock_held_here(w);
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < C_N; i++)
        if (strcmp(call, call_names[i]) == 0)
            w->calls[i]++;
    if (held && w->violations++ == 0)
        snprintf(w->first, sizeof w->first, "%s", call);
    pthread_mutex_unlock(&w->mu);
    /* The allocator waits for the stream: let its queued work run, so that the wait ends
     * (and a free is pending exactly until the allocator synchronises). */
    if (strstr(call, "synchronize") != NULL)
        gate_open(&w->gate);
}

static void watch(watch_t *w, mt_backend_t *b, mt_alloc_t *a)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->gate.mu, NULL);
    pthread_cond_init(&w->gate.cv, NULL);
    w->gate.open = true;
    w->a = a;
    assert_int_equal(mt__sim_set_call_hook(b, on_call, w), 0);
}

static void unwatch(watch_t *w, mt_backend_t *b)
{
    assert_int_equal(mt__sim_set_call_hook(b, NULL, NULL), 0);
    gate_open(&w->gate);
    pthread_mutex_destroy(&w->mu);
}

/* Fails the test, naming the call, when one was made under the lock. */
static void assert_no_violation(const watch_t *w)
{
    if (w->violations != 0)
        fail_msg("%u blocking call(s) under the allocator lock, the first: %s", w->violations,
                 w->first);
}

/* Frees p after a use on stream s that stays queued until the allocator synchronises (the
 * watcher then opens the gate), so the free is pending until then. */
static void free_pending(mt_alloc_t *a, mt_backend_t *b, void *p, mt_stream_t *s, watch_t *w)
{
    pthread_mutex_lock(&w->gate.mu);
    w->gate.open = false;
    pthread_mutex_unlock(&w->gate.mu);
    assert_int_equal(mt_alloc_record_stream(a, p, s), 0);
    assert_int_equal(mt_stream_launch_host_func(b, s, gate_wait, &w->gate), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
}

/* ---- each path ---- */

/* Expandable segments: the range is reserved and pages mapped at malloc; empty_cache
 * synchronises the device, unmaps and releases the range. */
static void test_expandable_map_unmap(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, "expandable_segments:True", NULL);
    watch_t w;
    watch(&w, b, a);
    void *p = xmalloc_dev(a, 8 * MIB, NULL, 0);
    void *q = xmalloc_dev(a, 100 * KIB, NULL, 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(mt_alloc_free(a, q), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_ALL].current, 0);
    assert_true(w.calls[C_RESERVE] >= 2 && w.calls[C_MAP] >= 2);
    assert_true(w.calls[C_DEV] >= 1 && w.calls[C_UNMAP] >= 2 && w.calls[C_RELEASE] >= 2);
    assert_no_violation(&w);
    assert_int_equal(mt_alloc_check(a), 0);
    unwatch(&w, b);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* release_to_fit: a malloc unmaps a free hole elsewhere before it maps its own pages. */
static void test_release_to_fit(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(512 * MIB);
    rec_sink_t rec;
    rec_init(&rec);
    mt_alloc_t *a = make_alloc(b, "expandable_segments:True,release_to_fit:True", &rec.sink);
    char *pa = xmalloc_dev(a, 8 * MIB, NULL, 0);
    char *pb = xmalloc_dev(a, 8 * MIB, NULL, 0);
    char *pc = xmalloc_dev(a, 8 * MIB, NULL, 0);
    assert_int_equal(mt_alloc_free(a, pb), 0);
    watch_t w;
    watch(&w, b, a);
    rec.n = 0;
    char *pd = xmalloc_dev(a, 12 * MIB, NULL, 0);
    assert_ptr_equal(pd, pc + 8 * MIB);
    assert_int_equal(rec_count(&rec, MT_EV_SEGMENT_UNMAP), 1);
    assert_int_equal(rec_count(&rec, MT_EV_SEGMENT_MAP), 1);
    assert_int_equal(w.calls[C_UNMAP], 1);
    assert_int_equal(w.calls[C_MAP], 1);
    assert_true(w.calls[C_DEV] >= 1);
    assert_no_violation(&w);
    assert_int_equal(mt_alloc_check(a), 0);
    unwatch(&w, b);
    mt_alloc_free(a, pa);
    mt_alloc_free(a, pc);
    mt_alloc_free(a, pd);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    rec_fini(&rec);
}

/* Garbage collection unmaps the oldest run's free pages when reserved passes the threshold. */
static void test_garbage_collection(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a =
        make_alloc(b, "expandable_segments:True,garbage_collection_threshold:0.5", NULL);
    watch_t w;
    watch(&w, b, a);
    void *pa = xmalloc_dev(a, 24 * MIB, NULL, 0);
    void *pb = xmalloc_dev(a, 16 * MIB, NULL, 0);
    assert_int_equal(mt_alloc_free(a, pb), 0);
    unsigned unmaps = w.calls[C_UNMAP];
    void *pc = xmalloc_dev(a, 20 * MIB, NULL, 0);
    assert_true(w.calls[C_UNMAP] > unmaps); /* the collection gave pages back */
    assert_no_violation(&w);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, pa);
    mt_alloc_free(a, pc);
    unwatch(&w, b);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* OOM recovery waits for the pending frees of another stream (event synchronize). */
static void test_oom_waits_pending(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s2), 0);
    watch_t w;
    watch(&w, b, a);
    void *p = xmalloc_dev(a, 40 * MIB, NULL, 0);
    free_pending(a, b, p, s2, &w);
    void *q = xmalloc_dev(a, 40 * MIB, NULL, 0); /* fits only once p's free completes */
    assert_ptr_equal(q, p);
    assert_true(w.calls[C_EVENT] >= 1);
    assert_true(stats_of(a).num_sync_all_streams >= 1);
    assert_no_violation(&w);
    assert_int_equal(mt_alloc_free(a, q), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    unwatch(&w, b);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

/* A free whose event cannot be created waits for the other stream instead. */
static void test_record_stream_sync(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s2), 0);
    watch_t w;
    watch(&w, b, a);
    void *p = xmalloc_dev(a, 1 * MIB, NULL, 0);
    assert_int_equal(mt__sim_inject_event_failures(b, 1), 0);
    free_pending(a, b, p, s2, &w);
    assert_int_equal(w.calls[C_STREAM], 1);
    assert_no_violation(&w);
    /* The free completed when the stream was done: the block is cached, not pending. */
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.active_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(mt_alloc_check(a), 0);
    unwatch(&w, b);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

/* empty_cache waits for pending frees before it releases the cache. */
static void test_empty_cache_pending(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, "expandable_segments:True", NULL);
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s2), 0);
    watch_t w;
    watch(&w, b, a);
    void *p = xmalloc_dev(a, 4 * MIB, NULL, 0);
    free_pending(a, b, p, s2, &w);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_ALL].current, 0);
    assert_true(w.calls[C_EVENT] >= 1 && w.calls[C_UNMAP] >= 1 && w.calls[C_RELEASE] >= 1);
    assert_no_violation(&w);
    assert_int_equal(mt_alloc_check(a), 0);
    unwatch(&w, b);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

/* A warm-up's end empties the cache (pending frees waited for, pages unmapped) and a
 * reservation under OOM does the same. */
static void test_warmup(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, "expandable_segments:True", NULL);
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s2), 0);
    watch_t w;
    watch(&w, b, a);
    assert_int_equal(mt_alloc_warmup_begin(a), 0);
    void *x = xmalloc_dev(a, 6 * MIB, NULL, 0);
    void *p = xmalloc_dev(a, 4 * MIB, NULL, 0);
    assert_int_equal(mt_alloc_free(a, x), 0);
    free_pending(a, b, p, s2, &w);
    assert_int_equal(mt_alloc_warmup_end(a, NULL), 0);
    assert_true(w.calls[C_EVENT] >= 1 && w.calls[C_UNMAP] >= 1);
    /* A reservation that does not fit beside cached pages releases them first. */
    void *y = xmalloc_dev(a, 30 * MIB, NULL, 0);
    assert_int_equal(mt_alloc_free(a, y), 0);
    unsigned unmaps = w.calls[C_UNMAP];
    assert_int_equal(mt_alloc_reserve(a, 40 * MIB, NULL), 0);
    assert_true(w.calls[C_UNMAP] > unmaps);
    assert_no_violation(&w);
    assert_int_equal(mt_alloc_check(a), 0);
    unwatch(&w, b);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

/* destroy waits for pending frees, unmaps live pages and releases the ranges. */
static void test_destroy(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, "expandable_segments:True", NULL);
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s2), 0);
    watch_t w;
    watch(&w, b, a);
    (void)xmalloc_dev(a, 6 * MIB, NULL, 0); /* left live: destroy releases it */
    void *p = xmalloc_dev(a, 4 * MIB, NULL, 0);
    free_pending(a, b, p, s2, &w);
    unsigned before[C_N];
    memcpy(before, w.calls, sizeof before);
    mt_alloc_destroy(&a);
    assert_true(w.calls[C_EVENT] > before[C_EVENT] && w.calls[C_DEV] > before[C_DEV]);
    assert_true(w.calls[C_UNMAP] > before[C_UNMAP] && w.calls[C_RELEASE] > before[C_RELEASE]);
    assert_no_violation(&w);
    unwatch(&w, b);
    assert_int_equal(mt__sim_used_bytes(b), 0);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

/* ---- two threads ---- */

#define LIVE_MAX 8

typedef struct live_s {
    uintptr_t addr;
    size_t size;
} live_t;

/* Every live block of both threads: a block handed out twice overlaps another. */
typedef struct board_s {
    pthread_mutex_t mu;
    live_t v[2 * LIVE_MAX];
    size_t n;
    unsigned overlaps;
} board_t;

static void board_add(board_t *bd, uintptr_t addr, size_t size)
{
    pthread_mutex_lock(&bd->mu);
    for (size_t i = 0; i < bd->n; i++)
        if (addr < bd->v[i].addr + bd->v[i].size && bd->v[i].addr < addr + size)
            bd->overlaps++;
    bd->v[bd->n++] = (live_t){addr, size};
    pthread_mutex_unlock(&bd->mu);
}

static void board_del(board_t *bd, uintptr_t addr)
{
    pthread_mutex_lock(&bd->mu);
    for (size_t i = 0; i < bd->n; i++)
        if (bd->v[i].addr == addr) {
            bd->v[i] = bd->v[--bd->n];
            break;
        }
    pthread_mutex_unlock(&bd->mu);
}

typedef struct worker_s {
    mt_alloc_t *a;
    mt_backend_t *b;
    mt_stream_t *stream;
    mt_stream_t *other; /* some blocks are used there too before their free (record_stream) */
    board_t *board;
    unsigned seed;
    bool big; /* sizes that force mapping and unmapping, and empty_cache */
    int ops;
    unsigned errors; /* failed calls or a block whose contents another thread changed */
} worker_t;

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 8) & 0xffffff;
}

static void nap(void *ud)
{
    (void)ud;
    usleep(200);
}

static void put_free(worker_t *wk, live_t *l, unsigned r)
{
    /* Its first and last bytes still hold this worker's seed: nobody else wrote there. */
    const unsigned char *p = (const unsigned char *)l->addr;
    if (p[0] != (unsigned char)wk->seed || p[l->size - 1] != (unsigned char)wk->seed)
        wk->errors++;
    board_del(wk->board, l->addr);
    if (r % 8 == 0) {
        /* Queued work on the other stream keeps the free pending for a while. */
        if (mt_stream_launch_host_func(wk->b, wk->other, nap, NULL) != 0 ||
            mt_alloc_record_stream(wk->a, (void *)l->addr, wk->other) != 0)
            wk->errors++;
    }
    if (mt_alloc_free(wk->a, (void *)l->addr) != 0)
        wk->errors++;
}

static void *work(void *arg)
{
    worker_t *wk = arg;
    live_t live[LIVE_MAX];
    size_t n = 0;
    unsigned s = wk->seed;
    for (int i = 0; i < wk->ops; i++) {
        unsigned r = rnd(&s);
        if (n == LIVE_MAX || (n > 0 && r % 3 == 0)) {
            size_t k = rnd(&s) % n;
            put_free(wk, &live[k], r);
            live[k] = live[--n];
            continue;
        }
        if (wk->big && r % 17 == 0) {
            if (mt_alloc_empty_cache(wk->a) != 0)
                wk->errors++;
            continue;
        }
        size_t size = wk->big ? (1 + rnd(&s) % 12) * MIB + rnd(&s) % MIB : 512 + rnd(&s) % MIB;
        void *p = NULL;
        int rc = mt_alloc_malloc(wk->a, size, wk->stream, 0, &p);
        if (rc == MT_ENOMEM)
            continue; /* the device may be full for a moment: both threads hold memory */
        if (rc != 0 || p == NULL) {
            wk->errors++;
            continue;
        }
        /* Writes go to the sim's device pages: an unmapped page faults. */
        ((unsigned char *)p)[0] = (unsigned char)wk->seed;
        ((unsigned char *)p)[size - 1] = (unsigned char)wk->seed;
        board_add(wk->board, (uintptr_t)p, size);
        live[n++] = (live_t){(uintptr_t)p, size};
    }
    while (n > 0)
        put_free(wk, &live[--n], 1);
    return NULL;
}

/* Two threads on two streams of one allocator over conf: one with sizes that map and
 * unmap pages (or take plain segments) and empty the cache, the other with small blocks;
 * both use some blocks on the other's stream before freeing them. shared: both threads
 * take large blocks on one stream, so that they map and unmap in one range at once. The
 * sim's VM calls cost 20 us each, like the driver's, so that they overlap. */
static void two_threads(const char *conf, bool expandable, bool shared)
{
    mt_backend_t *b = sim_backend(128 * MIB);
    mt_alloc_t *a = make_alloc(b, conf, NULL);
    mt__sim_set_costs(b, 20000, 20000);
    mt_stream_t *s1 = NULL;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    watch_t w;
    watch(&w, b, a);
    w.threaded = true;
    board_t bd = {.n = 0};
    pthread_mutex_init(&bd.mu, NULL);
    worker_t wk[2] = {
        {a, b, NULL, s1, &bd, .seed = 7, .big = true, .ops = 3000},
        {a, b, shared ? NULL : s1, s1, &bd, .seed = 11, .big = shared, .ops = 3000},
    };
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, work, &wk[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(wk[0].errors, 0);
    assert_int_equal(wk[1].errors, 0);
    assert_int_equal(bd.overlaps, 0);
    if (expandable)
        assert_true(w.calls[C_MAP] > 0 && w.calls[C_UNMAP] > 0 && w.calls[C_DEV] > 0);
#if MT_ASSERT_LEVEL >= 1
    assert_no_violation(&w);
#endif
    assert_int_equal(mt_alloc_check(a), 0);
    assert_int_equal(stats_of(a).allocated_bytes[MT_STAT_ALL].current, 0);
    /* Every block came back once: after the pending frees, nothing is active and the
     * whole cache goes back to the device. */
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    mt_alloc_stats_t st = stats_of(a);
    assert_int_equal(st.active_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(st.active[MT_STAT_ALL].current, 0);
    assert_int_equal(st.reserved_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(st.allocation[MT_STAT_ALL].allocated, st.allocation[MT_STAT_ALL].freed);
    assert_int_equal(mt__sim_used_bytes(b), 0);
    assert_int_equal(mt__sim_check(b), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    unwatch(&w, b);
    pthread_mutex_destroy(&bd.mu);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s1);
    mt_backend_destroy(&b);
}

static void test_two_threads_release_to_fit(void **state)
{
    (void)state;
    two_threads("expandable_segments:True,release_to_fit:True", true, false);
}

static void test_two_threads_gc(void **state)
{
    (void)state;
    two_threads("expandable_segments:True,garbage_collection_threshold:0.5", true, false);
}

static void test_two_threads_plain(void **state)
{
    (void)state;
    two_threads(NULL, false, false);
}

static void test_two_threads_one_range(void **state)
{
    (void)state;
    two_threads("expandable_segments:True,release_to_fit:True", true, true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expandable_map_unmap),
        cmocka_unit_test(test_release_to_fit),
        cmocka_unit_test(test_garbage_collection),
        cmocka_unit_test(test_oom_waits_pending),
        cmocka_unit_test(test_record_stream_sync),
        cmocka_unit_test(test_empty_cache_pending),
        cmocka_unit_test(test_warmup),
        cmocka_unit_test(test_destroy),
        cmocka_unit_test(test_two_threads_release_to_fit),
        cmocka_unit_test(test_two_threads_gc),
        cmocka_unit_test(test_two_threads_plain),
        cmocka_unit_test(test_two_threads_one_range),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
