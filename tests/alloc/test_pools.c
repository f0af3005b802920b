/* Private pools (mt_pool_*): what a stream capture's allocations keep. A block freed in a
 * pool is reused only by that pool's later allocations; eager requests (on the capturing
 * stream or another) never get it, so a captured graph may write its addresses on every
 * replay; the pool's segments go back only through mt_pool_release, which refuses while a
 * block is live; and the event stream keeps the analysis model equal to the allocator. */
#include <stdatomic.h>

#include "analysis/model.h"
#include "helpers.h"
#include "tests/common/test_main.h"

#define N (4 * MIB)

static bool overlaps(const void *p, size_t n, const void *q, size_t m)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return a < b + m && b < a + n;
}

static uint32_t pool_of(mt_alloc_t *a, const void *p)
{
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    uint32_t id = UINT32_MAX;
    for (size_t i = 0; i < snap->nsegments; i++) {
        const mt_snapshot_segment_t *s = &snap->segments[i];
        if ((uintptr_t)p >= s->addr && (uintptr_t)p < s->addr + s->size)
            id = s->priv_pool;
    }
    mt_alloc_snapshot_free(&snap);
    return id;
}

static int64_t reserved_of(mt_alloc_t *a)
{
    return stats_of(a).reserved_bytes[MT_STAT_ALL].current;
}

/* ---- isolation ---- */

/* Eager requests of the freed block's exact size, on the capturing stream and on the
 * default stream, get other memory; the pool's next routed request gets the block back; a
 * second pool does not see it either. Plain and expandable (default) configurations, with
 * and without thread caches. */
static void isolation_in(const char *base, const char *conf)
{
    mt_backend_t *b = sim_backend(512 * MIB);
    mt_alloc_t *a = make_alloc_from(b, base, conf, NULL);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    uint32_t p1 = 0, p2 = 0;
    assert_int_equal(mt_pool_create(a, &p1), 0);
    assert_int_equal(mt_pool_create(a, &p2), 0);
    assert_true(p1 >= 1 && p2 != p1);

    assert_int_equal(mt_pool_begin(a, p1, s), 0);
    void *tmp = xmalloc_dev(a, N, s, MT_TAG_ACTIVATIONS);
    void *small = xmalloc_dev(a, 1000, s, MT_TAG_ACTIVATIONS);
    assert_int_equal(mt_alloc_free(a, tmp), 0);
    assert_int_equal(mt_alloc_free(a, small), 0);
    assert_int_equal(mt_pool_end(a, p1, s), 0);
    assert_int_equal(pool_of(a, tmp), p1);
    assert_int_equal(pool_of(a, small), p1);
    assert_int_equal(mt_alloc_check(a), 0);

    /* Eager, twice each so that a thread cache would have a pair to repeat. */
    for (int k = 0; k < 2; k++) {
        void *e1 = xmalloc_dev(a, N, s, 0);
        void *e2 = xmalloc_dev(a, N, NULL, 0);
        void *e3 = xmalloc_dev(a, 1000, s, 0);
        assert_false(overlaps(e1, N, tmp, N) || overlaps(e2, N, tmp, N) ||
                     overlaps(e3, 1000, tmp, N));
        assert_false(overlaps(e1, N, small, 1000) || overlaps(e3, 1000, small, 1000));
        assert_int_equal(pool_of(a, e1), 0);
        assert_int_equal(pool_of(a, e3), 0);
        assert_int_equal(mt_alloc_free(a, e1), 0);
        assert_int_equal(mt_alloc_free(a, e2), 0);
        assert_int_equal(mt_alloc_free(a, e3), 0);
    }
    /* Another pool: its own memory. */
    assert_int_equal(mt_pool_begin(a, p2, s), 0);
    void *o = xmalloc_dev(a, N, s, 0);
    assert_false(overlaps(o, N, tmp, N));
    assert_int_equal(pool_of(a, o), p2);
    assert_int_equal(mt_alloc_free(a, o), 0);
    assert_int_equal(mt_pool_end(a, p2, s), 0);
    /* The same pool again: the block comes back. */
    assert_int_equal(mt_pool_begin(a, p1, s), 0);
    void *again = xmalloc_dev(a, N, s, 0);
    assert_ptr_equal(again, tmp);
    assert_int_equal(mt_alloc_free(a, again), 0);
    assert_int_equal(mt_pool_end(a, p1, s), 0);
    assert_int_equal(mt_alloc_check(a), 0);

    assert_int_equal(mt_pool_release(a, p1), 0);
    assert_int_equal(mt_pool_release(a, p2), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s);
    mt_backend_destroy(&b);
}

static void test_isolation(void **state)
{
    (void)state;
    isolation_in("rules:reference", NULL);
    isolation_in("rules:reference", "tcache:0");
    isolation_in(NULL, NULL); /* expandable segments, one pool, thread caches */
}

/* ---- the N6 scenario ---- */

/* What a replay of the captured graph does: tmp = a * 2; out = tmp + 1 (bytes stand for
 * the values). */
static void replay(mt_backend_t *b, mt_stream_t *s, void *tmp, void *out)
{
    assert_int_equal(mt_memset_async(b, tmp, 6, N, s), 0);
    assert_int_equal(mt_memset_async(b, out, 7, N, s), 0);
}

static void expect_bytes(mt_backend_t *b, mt_stream_t *s, const void *p, int v, const char *what)
{
    unsigned char *host = malloc(N);
    assert_non_null(host);
    assert_int_equal(mt_memcpy_async(b, host, p, N, MT_MEMCPY_DEVICE_TO_HOST, s), 0);
    assert_int_equal(mt_stream_synchronize(b, s), 0);
    for (size_t i = 0; i < N; i++)
        if (host[i] != v)
            fail_msg("%s: byte %zu is %d, not %d", what, i, host[i], v);
    free(host);
}

/* Capture tmp = a*2; out = tmp + 1; del tmp. After it, eager e = full_like(a, 7) on the
 * capturing stream and on the default stream; 3 replays; e must keep its values. Then a
 * capture of a size never seen (a cache miss inside the capture) takes a new segment of
 * the pool, not eager memory. */
static void test_capture_scenario(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(512 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    void *in = xmalloc_dev(a, N, s, 0); /* a, eager, before the capture */
    assert_int_equal(mt_memset_async(b, in, 3, N, s), 0);
    /* Warm-up on the side stream, as torch.cuda.graph does: a block of tmp's size sits
     * free in the eager cache when the capture begins. */
    assert_int_equal(mt_alloc_free(a, xmalloc_dev(a, N, s, 0)), 0);
    int64_t eager_reserved = reserved_of(a);

    uint32_t g = 0;
    assert_int_equal(mt_pool_create(a, &g), 0);
    assert_int_equal(mt_pool_begin(a, g, s), 0);
    void *tmp = xmalloc_dev(a, N, s, 0);
    void *out = xmalloc_dev(a, N, s, 0);
    assert_int_equal(mt_alloc_free(a, tmp), 0); /* del tmp */
    assert_int_equal(mt_pool_end(a, g, s), 0);

    void *e = xmalloc_dev(a, N, s, 0);     /* torch.full_like(a, 7.) */
    void *e0 = xmalloc_dev(a, N, NULL, 0); /* and on the default stream */
    assert_int_equal(mt_memset_async(b, e, 7, N, s), 0);
    assert_int_equal(mt_memset_async(b, e0, 7, N, NULL), 0);
    for (int r = 0; r < 3; r++) {
        replay(b, s, tmp, out);
        /* eager work between replays: a new request of tmp's size, then its free */
        void *x = xmalloc_dev(a, N, s, 0);
        assert_int_equal(mt_memset_async(b, x, 9, N, s), 0);
        assert_int_equal(mt_alloc_free(a, x), 0);
    }
    assert_int_equal(mt_stream_synchronize(b, s), 0);
    expect_bytes(b, s, e, 7, "eager tensor after the replays");
    expect_bytes(b, NULL, e0, 7, "eager tensor on the default stream after the replays");
    replay(b, s, tmp, out); /* a 4th replay; out is read after it, as a program would */
    expect_bytes(b, s, out, 7, "captured output");
    assert_false(overlaps(e, N, tmp, N) || overlaps(e, N, out, N));
    assert_false(overlaps(e0, N, tmp, N) || overlaps(e0, N, out, N));
    assert_int_equal(pool_of(a, tmp), g);
    assert_int_equal(pool_of(a, out), g);
    assert_true(reserved_of(a) > eager_reserved); /* the pool's segment counts */

    /* A second capture into the same pool (torch shares pools between graphs) with a size
     * never allocated before. */
    const size_t big = 37 * MIB + 512;
    uint64_t pres0 = 0;
    assert_int_equal(mt_pool_usage(a, g, &pres0, NULL), 0);
    assert_int_equal(mt_pool_begin(a, g, s), 0);
    void *w = xmalloc_dev(a, big, s, 0);
    assert_int_equal(mt_pool_end(a, g, s), 0);
    uint64_t pres1 = 0, palloc = 0;
    assert_int_equal(mt_pool_usage(a, g, &pres1, &palloc), 0);
    assert_true(pres1 >= pres0 + big);
    size_t wsize = 0;
    assert_int_equal(mt_alloc_block_info(a, w, NULL, &wsize, NULL), 0);
    assert_int_equal(palloc, N + wsize); /* out and w live; tmp free in the pool */
    assert_int_equal(pool_of(a, w), g);
    assert_false(overlaps(w, big, e, N) || overlaps(w, big, e0, N) || overlaps(w, big, in, N));
    assert_int_equal(mt_alloc_check(a), 0);

    /* The graphs are destroyed; their outputs die; the pool goes. */
    assert_int_equal(mt_alloc_free(a, out), 0);
    assert_int_equal(mt_alloc_free(a, w), 0);
    assert_int_equal(mt_pool_release(a, g), 0);
    assert_int_equal(pool_of(a, tmp), UINT32_MAX); /* its memory is gone */
    assert_int_equal(mt_alloc_free(a, e), 0);
    assert_int_equal(mt_alloc_free(a, e0), 0);
    assert_int_equal(mt_alloc_free(a, in), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s);
    mt_backend_destroy(&b);
}

static uint64_t rng(uint64_t *s);

/* ---- release ---- */

/* Release refuses while a block is live or a stream is routed, changing nothing; after the
 * frees it gives the segments back: reserved bytes drop by the pool's, the device sees the
 * frees, the id is gone. empty_cache and an OOM's cache release never take pool memory. */
static void test_release(void **state)
{
    (void)state;
    rec_sink_t rec;
    rec_init(&rec);
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, &rec.sink);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    uint32_t g = 0;
    assert_int_equal(mt_pool_create(a, &g), 0);
    assert_int_equal(mt_pool_begin(a, g, s), 0);
    void *p = xmalloc_dev(a, 8 * MIB, s, 0);
    void *q = xmalloc_dev(a, 8 * MIB, s, 0);
    void *whole = xmalloc_dev(a, 12 * MIB, s, 0);      /* a segment of its own */
    assert_int_equal(mt_pool_release(a, g), MT_EBUSY); /* routed */
    assert_int_equal(mt_pool_end(a, g, s), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(mt_alloc_free(a, whole), 0); /* a whole free segment of the pool */
    int64_t before = reserved_of(a);
    uint64_t pres = 0;
    assert_int_equal(mt_pool_usage(a, g, &pres, NULL), 0);
    assert_true(pres >= 28 * MIB && (int64_t)pres == before);
    assert_int_equal(mt_pool_release(a, g), MT_EBUSY); /* q is live */
    assert_int_equal(reserved_of(a), before);
    assert_int_equal(pool_of(a, q), g);

    /* The cache release paths keep the pool's free memory. */
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(reserved_of(a), before);
    void *big = NULL;
    assert_int_equal(mt_alloc_malloc(a, 60 * MIB, s, 0, &big), MT_ENOMEM);
    assert_int_equal(reserved_of(a), before);
    assert_int_equal(mt_alloc_check(a), 0);

    assert_int_equal(mt_alloc_free(a, q), 0);
    uint64_t frees0 = stats_of(a).num_device_free;
    size_t nev = rec.n;
    assert_int_equal(mt_pool_release(a, g), 0);
    assert_int_equal(reserved_of(a), before - (int64_t)pres);
    assert_true(stats_of(a).num_device_free > frees0);
    size_t segfrees = 0;
    for (size_t i = nev; i < rec.n; i++)
        segfrees += rec.ev[i].kind == MT_EV_SEGMENT_FREE;
    assert_true(segfrees >= 1);
    assert_int_equal(mt_pool_release(a, g), MT_ENOENT);
    assert_int_equal(mt_pool_begin(a, g, s), MT_ENOENT);
    /* The memory serves eager requests now. */
    void *r = xmalloc_dev(a, 60 * MIB, s, 0);
    assert_int_equal(mt_alloc_free(a, r), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s);
    mt_backend_destroy(&b);
    rec_fini(&rec);
}

/* A pool block freed while another stream still reads it (record_stream) is live for the
 * release until that stream's work is done. */
static void test_release_waits_for_events(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s = NULL, *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    assert_int_equal(mt_stream_create(b, &s2), 0);
    uint32_t g = 0;
    assert_int_equal(mt_pool_create(a, &g), 0);
    assert_int_equal(mt_pool_begin(a, g, s), 0);
    void *p = xmalloc_dev(a, MIB, s, 0);
    assert_int_equal(mt_pool_end(a, g, s), 0);
    gate_t gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
    assert_int_equal(mt_alloc_record_stream(a, p, s2), 0);
    assert_int_equal(mt_stream_launch_host_func(b, s2, gate_wait, &gate), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(mt_pool_release(a, g), MT_EBUSY);
    gate_open(&gate);
    assert_int_equal(mt_stream_synchronize(b, s2), 0);
    assert_int_equal(mt_pool_release(a, g), 0);
    assert_int_equal(reserved_of(a), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

/* A free callback runs without the lock while its request holds the pool's stream record;
 * ending the routing and releasing the pool from there must not free that record. */
typedef struct cb_ctx_s {
    uint32_t id;
    mt_stream_t *s;
    int end_rc, release_rc;
    int calls;
} cb_ctx_t;

static bool release_from_callback(void *ud, mt_alloc_t *a, size_t size, mt_stream_t *stream)
{
    (void)size;
    (void)stream;
    cb_ctx_t *c = ud;
    if (c->calls++ == 0) {
        c->end_rc = mt_pool_end(a, c->id, c->s);
        c->release_rc = mt_pool_release(a, c->id);
    }
    return false;
}

static void test_release_while_lock_released(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    cb_ctx_t c = {.s = s};
    assert_int_equal(mt_pool_create(a, &c.id), 0);
    assert_int_equal(mt_pool_begin(a, c.id, s), 0);
    assert_int_equal(mt_alloc_add_free_callback(a, release_from_callback, &c), 0);
    void *p = xmalloc_dev(a, MIB, s, 0); /* a miss: the callbacks run */
    assert_int_equal(c.calls, 1);
    assert_int_equal(c.end_rc, 0);
    assert_int_equal(c.release_rc, MT_EBUSY);
    assert_int_equal(pool_of(a, p), c.id);
    assert_int_equal(mt_alloc_check(a), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(mt_pool_release(a, c.id), 0);
    assert_int_equal(mt_alloc_remove_free_callback(a, release_from_callback, &c), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s);
    mt_backend_destroy(&b);
}

/* Two threads, thread caches on: one captures into a pool again and again on its stream,
 * the other allocates eagerly on its own stream and the default one (a request on the
 * capturing stream is routed whichever thread makes it, as PyTorch's without a filter). No
 * eager block handed out after a pool block may lie in that block's memory (the pool keeps
 * it until its release at the end; before, the device may have given it to either). */
static _Atomic uint64_t thr_seq;
enum { THREAD_OPS = 64 * 47, THREAD_KEEP = 4 }; /* whole captures of 64 */

typedef struct thr_s {
    mt_alloc_t *a;
    mt_stream_t *s, *other;
    uint32_t pool; /* 0: eager */
    uintptr_t *lo, *hi;
    uint64_t *seq; /* thr_seq when handed out */
    size_t n;
    int rc;
} thr_t;

static void *thr_run(void *arg)
{
    thr_t *t = arg;
    uint64_t seed = t->pool ? 0x1234567ull : 0x7654321ull;
    void *keep[THREAD_KEEP] = {NULL};
    for (size_t op = 0; op < THREAD_OPS && t->rc == 0; op++) {
        if (t->pool != 0 && op % 64 == 0)
            t->rc = mt_pool_begin(t->a, t->pool, t->s);
        size_t n = 1 + rng(&seed) % (3 * MIB);
        mt_stream_t *s = t->pool == 0 && op % 3 == 0 ? t->other : t->s;
        void *p = NULL;
        if (t->rc == 0)
            t->rc = mt_alloc_malloc(t->a, n, s, 0, &p);
        size_t bsz = 0;
        if (t->rc == 0)
            t->rc = mt_alloc_block_info(t->a, p, NULL, &bsz, NULL);
        t->seq[t->n] = atomic_fetch_add(&thr_seq, 1);
        t->lo[t->n] = (uintptr_t)p;
        t->hi[t->n++] = (uintptr_t)p + bsz;
        size_t k = rng(&seed) % THREAD_KEEP;
        if (t->rc == 0 && keep[k] != NULL)
            t->rc = mt_alloc_free(t->a, keep[k]);
        keep[k] = p;
        if (t->rc == 0 && t->pool != 0 && op % 64 == 63) {
            t->rc = mt_pool_end(t->a, t->pool, t->s);
            for (int i = 0; i < THREAD_KEEP && t->rc == 0; i++) /* the capture's frees */
                if (keep[i] != NULL && (t->rc = mt_alloc_free(t->a, keep[i])) == 0)
                    keep[i] = NULL;
        }
    }
    for (int i = 0; i < THREAD_KEEP && t->rc == 0; i++)
        if (keep[i] != NULL)
            t->rc = mt_alloc_free(t->a, keep[i]);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(1024 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL); /* thread caches, expandable */
    mt_stream_t *s1 = NULL, *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    assert_int_equal(mt_stream_create(b, &s2), 0);
    thr_t t[2] = {{.a = a, .s = s1}, {.a = a, .s = s2, .other = NULL}};
    assert_int_equal(mt_pool_create(a, &t[0].pool), 0);
    for (int i = 0; i < 2; i++) {
        t[i].lo = calloc(THREAD_OPS, sizeof *t[i].lo);
        t[i].hi = calloc(THREAD_OPS, sizeof *t[i].hi);
        t[i].seq = calloc(THREAD_OPS, sizeof *t[i].seq);
        assert_true(t[i].lo && t[i].hi && t[i].seq);
    }
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, thr_run, &t[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(t[0].rc, 0);
    assert_int_equal(t[1].rc, 0);
    assert_int_equal(mt_alloc_check(a), 0);
    for (size_t i = 0; i < t[1].n; i++)
        for (size_t j = 0; j < t[0].n; j++)
            if (t[1].seq[i] > t[0].seq[j] && t[1].lo[i] < t[0].hi[j] && t[0].lo[j] < t[1].hi[i])
                fail_msg("eager block %zu at %#lx lies in pool block %zu at %#lx", i,
                         (unsigned long)t[1].lo[i], j, (unsigned long)t[0].lo[j]);
    assert_int_equal(mt_pool_release(a, t[0].pool), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    for (int i = 0; i < 2; i++) {
        free(t[i].lo);
        free(t[i].hi);
        free(t[i].seq);
    }
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s1);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

/* ---- errors ---- */

static void test_errors(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    uint32_t g = 0;
    assert_int_equal(mt_pool_create(NULL, &g), MT_EINVAL);
    assert_int_equal(mt_pool_create(a, NULL), MT_EINVAL);
    assert_int_equal(mt_pool_begin(a, 99, NULL), MT_ENOENT);
    assert_int_equal(mt_pool_create(a, &g), 0);
    assert_int_equal(mt_pool_end(a, g, NULL), MT_ENOENT);
    assert_int_equal(mt_pool_begin(a, g, NULL), 0);
    assert_int_equal(mt_pool_begin(a, g, NULL), MT_EBUSY);
    assert_int_equal(mt_alloc_warmup_begin(a), MT_EBUSY);
    assert_int_equal(mt_pool_end(a, g + 1, NULL), MT_ENOENT);
    assert_int_equal(mt_pool_end(a, g, NULL), 0);
    assert_int_equal(mt_alloc_warmup_begin(a), 0);
    assert_int_equal(mt_pool_begin(a, g, NULL), MT_EBUSY);
    assert_int_equal(mt_alloc_warmup_end(a, NULL), 0);
    assert_int_equal(mt_pool_usage(a, g + 7, NULL, NULL), MT_ENOENT);
    /* A pool left to the allocator is freed with it (ASan's leak check). */
    void *p = NULL;
    assert_int_equal(mt_pool_begin(a, g, NULL), 0);
    assert_int_equal(mt_alloc_malloc(a, 1000, NULL, 0, &p), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* ---- events: the analysis model follows the pools ---- */

typedef struct feed_s {
    mt_event_sink_t sink;
    mt_model_t *m;
    uint64_t seq;
} feed_t;

static void feed_emit(void *ud, const mt_event_rec_t *ev)
{
    feed_t *f = ud;
    mt_event_rec_t e = *ev;
    e.seq = f->seq++;
    if (mt__model_apply(f->m, &e) != 0)
        abort();
}

static uint64_t rng(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void model_equals(mt_alloc_t *a, const mt_model_t *m, size_t op)
{
    mt_alloc_stats_t st = stats_of(a);
    mt_model_figures_t f;
    assert_int_equal(mt__model_figures(m, MT_MODEL_DEVICE, &f), 0);
    if (f.allocated != (uint64_t)st.allocated_bytes[MT_STAT_ALL].current ||
        f.reserved != (uint64_t)st.reserved_bytes[MT_STAT_ALL].current ||
        f.total_free != st.total_free || f.largest_free != st.largest_free_block)
        fail_msg("op %zu: model %llu/%llu free %llu largest %llu; allocator %lld/%lld free %llu "
                 "largest %llu",
                 op, (unsigned long long)f.allocated, (unsigned long long)f.reserved,
                 (unsigned long long)f.total_free, (unsigned long long)f.largest_free,
                 (long long)st.allocated_bytes[MT_STAT_ALL].current,
                 (long long)st.reserved_bytes[MT_STAT_ALL].current,
                 (unsigned long long)st.total_free, (unsigned long long)st.largest_free_block);
    assert_false(f.uncertain);
    char why[256] = "";
    if (mt__model_check(m, why, sizeof why) != 0)
        fail_msg("op %zu: mt__model_check: %s", op, why);
}

/* A block, or a range a pool's block had (pool: index into ids, or -1 for eager). */
typedef struct range_s {
    void *p;
    size_t n;
    int pool;
} range_t;

/* Random captures into a few pools among eager traffic on three streams: pool blocks are
 * never reused by eager requests (each routed block is remembered until its pool is
 * released), the invariants hold, and the model fed the events equals the allocator. */
static void random_in(const char *base, uint64_t seed)
{
    enum { LIVE = 96, POOLS = 3, SEEN = 4096 };
    feed_t feed = {.sink = {.emit = feed_emit}};
    feed.sink.ud = &feed;
    assert_int_equal(mt__model_create(&feed.m, NULL), 0);
    mt_backend_t *b = sim_backend(768 * MIB);
    mt_alloc_t *a = make_alloc_from(b, base, NULL, &feed.sink);
    mt_stream_t *st[3] = {NULL, NULL, NULL};
    assert_int_equal(mt_stream_create(b, &st[1]), 0);
    assert_int_equal(mt_stream_create(b, &st[2]), 0);
    range_t live[LIVE];
    size_t nlive = 0;
    uint32_t ids[POOLS] = {0};
    int routed[3] = {-1, -1, -1}; /* pool index per stream */
    /* Address ranges pool blocks had, per pool, until it is released. */
    range_t seen[SEEN];
    size_t nseen = 0;
    for (size_t op = 0; op < 3000; op++) {
        uint64_t r = rng(&seed) % 100;
        int si = (int)(rng(&seed) % 3);
        if (r < 50 && nlive < LIVE) {
            size_t n = rng(&seed) % 4 == 0 ? 1 + rng(&seed) % (24 * MIB) : 1 + rng(&seed) % MIB;
            void *p = NULL;
            int rc = mt_alloc_malloc(a, n, st[si], 0, &p);
            if (rc == MT_ENOMEM)
                continue;
            assert_int_equal(rc, 0);
            size_t bsz = 0;
            assert_int_equal(mt_alloc_block_info(a, p, NULL, &bsz, NULL), 0);
            for (size_t k = 0; k < nseen; k++)
                if (seen[k].pool != routed[si] && overlaps(p, bsz, seen[k].p, seen[k].n))
                    fail_msg("op %zu: a request (pool %d) got memory of pool %d", op, routed[si],
                             seen[k].pool);
            if (routed[si] >= 0 && nseen < SEEN)
                seen[nseen++] = (range_t){p, bsz, routed[si]};
            live[nlive++] = (range_t){p, bsz, routed[si]};
        } else if (r < 88 && nlive > 0) {
            size_t i = rng(&seed) % nlive;
            if (r % 7 == 0)
                assert_int_equal(mt_alloc_record_stream(a, live[i].p, st[rng(&seed) % 3]), 0);
            assert_int_equal(mt_alloc_free(a, live[i].p), 0);
            live[i] = live[--nlive];
        } else if (r < 94) {
            int pi = (int)(rng(&seed) % POOLS);
            if (routed[si] >= 0) {
                assert_int_equal(mt_pool_end(a, ids[routed[si]], st[si]), 0);
                routed[si] = -1;
            } else {
                if (ids[pi] == 0)
                    assert_int_equal(mt_pool_create(a, &ids[pi]), 0);
                assert_int_equal(mt_pool_begin(a, ids[pi], st[si]), 0);
                routed[si] = pi;
            }
        } else if (r < 97) {
            int pi = (int)(rng(&seed) % POOLS);
            if (ids[pi] == 0)
                continue;
            bool busy = routed[0] == pi || routed[1] == pi || routed[2] == pi;
            for (size_t i = 0; i < nlive && !busy; i++)
                busy = live[i].pool == pi;
            int rc = mt_pool_release(a, ids[pi]);
            if (busy) {
                assert_int_equal(rc, MT_EBUSY);
                continue;
            }
            if (rc == MT_EBUSY) /* a free still waiting for another stream */
                continue;
            assert_int_equal(rc, 0);
            ids[pi] = 0;
            size_t k = 0;
            for (size_t j = 0; j < nseen; j++)
                if (seen[j].pool != pi)
                    seen[k++] = seen[j];
            nseen = k;
        } else {
            assert_int_equal(mt_alloc_empty_cache(a), 0);
        }
        assert_int_equal(mt_alloc_check(a), 0);
        model_equals(a, feed.m, op);
    }
    for (int si = 0; si < 3; si++)
        if (routed[si] >= 0)
            assert_int_equal(mt_pool_end(a, ids[routed[si]], st[si]), 0);
    for (size_t i = 0; i < nlive; i++)
        assert_int_equal(mt_alloc_free(a, live[i].p), 0);
    /* Every stream, the default one too: a free recorded on it waits for its event. */
    for (int s = 0; s < 3; s++)
        assert_int_equal(mt_stream_synchronize(b, st[s]), 0);
    for (int pi = 0; pi < POOLS; pi++)
        if (ids[pi] != 0)
            assert_int_equal(mt_pool_release(a, ids[pi]), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(reserved_of(a), 0);
    model_equals(a, feed.m, SIZE_MAX);
    mt_alloc_destroy(&a);
    mt__model_destroy(&feed.m);
    mt_stream_destroy(b, &st[1]);
    mt_stream_destroy(b, &st[2]);
    mt_backend_destroy(&b);
}

static void test_random_with_model(void **state)
{
    (void)state;
    random_in("rules:reference", 0x9E3779B97F4A7C15ull);
    random_in(NULL, 0xD1B54A32D192ED03ull); /* expandable eager segments beside plain pools */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isolation),
        cmocka_unit_test(test_capture_scenario),
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_release_waits_for_events),
        cmocka_unit_test(test_release_while_lock_released),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_random_with_model),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
