/* Per-thread caches (allocator/tcache.c): every stat and peak exact against a reference
 * model in 1 and 2 threads, cross-thread frees, record_stream, OOM and empty_cache with
 * blocks held in another thread's cache, thread exit, destroy while a thread still names
 * the allocator, and mt_alloc_check after every step. */
#include <pthread.h>
#include <sched.h>

#include "helpers.h"
#include "allocator/tcache.h"
#include "allocator/tcache_impl.h" /* TC_WINDOW, TC_BACKOFF_MIN */
#include "tests/common/test_main.h"

/* ---- a thread that runs jobs on request (its cache lives as long as it does) ---- */

typedef struct worker_s {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void (*job)(void *);
    void *arg;
    bool quit;
} worker_t;

static void *worker_main(void *p)
{
    worker_t *w = p;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->job == NULL && !w->quit)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->job == NULL)
            break;
        void (*job)(void *) = w->job;
        pthread_mutex_unlock(&w->mu);
        job(w->arg);
        pthread_mutex_lock(&w->mu);
        w->job = NULL;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void worker_start(worker_t *w)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    assert_int_equal(pthread_create(&w->th, NULL, worker_main, w), 0);
}

static void worker_run(worker_t *w, void (*job)(void *), void *arg)
{
    pthread_mutex_lock(&w->mu);
    w->job = job;
    w->arg = arg;
    pthread_cond_broadcast(&w->cv);
    while (w->job != NULL)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

static void worker_stop(worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    w->quit = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

/* ---- the reference model: the program's view of the counters the caches defer ---- */

enum { M_BYTES, M_REQ, M_COUNT, M_ABYTES, M_ACTIVE, M_N };

typedef struct model_s {
    int64_t cur[M_N], peak[M_N];
    uint64_t cum[M_N];
    int64_t tcur[2][MT_TAG_MAX], tpeak[2][MT_TAG_MAX];
    uint64_t tcum[2][MT_TAG_MAX];
} model_t;

static void m_one(int64_t *cur, int64_t *peak, uint64_t *cum, int64_t d)
{
    *cur += d;
    if (d > 0)
        *cum += (uint64_t)d;
    if (*cur > *peak)
        *peak = *cur;
}

/* The default configuration keeps one pool: every statistic counts as LARGE. */
static void model_add(model_t *m, int tag, int64_t size, int64_t req, int sign)
{
    int64_t d[M_N] = {size, req, 1, size, 1};
    for (int k = 0; k < M_N; k++)
        m_one(&m->cur[k], &m->peak[k], &m->cum[k], sign * d[k]);
    m_one(&m->tcur[0][tag], &m->tpeak[0][tag], &m->tcum[0][tag], sign * size);
    m_one(&m->tcur[1][tag], &m->tpeak[1][tag], &m->tcum[1][tag], sign * req);
}

static const mt_stat_t *stat_of(const mt_alloc_stats_t *s, int k)
{
    switch (k) {
    case M_BYTES:
        return s->allocated_bytes;
    case M_REQ:
        return s->requested_bytes;
    case M_COUNT:
        return s->allocation;
    case M_ABYTES:
        return s->active_bytes;
    default:
        return s->active;
    }
}

/* Current, cumulative and (when peaks) peak values of the model equal the allocator's. */
static void model_compare(mt_alloc_t *a, const model_t *m, bool peaks)
{
    mt_alloc_stats_t s = stats_of(a);
    for (int k = 0; k < M_N; k++) {
        const mt_stat_t *x = stat_of(&s, k);
        for (int sp = MT_STAT_ALL; sp <= MT_STAT_LARGE; sp += MT_STAT_LARGE) {
            assert_int_equal(x[sp].current, m->cur[k]);
            assert_int_equal(x[sp].allocated, m->cum[k]);
            assert_int_equal(x[sp].allocated - x[sp].freed, (uint64_t)x[sp].current);
            if (peaks)
                assert_int_equal(x[sp].peak, m->peak[k]);
        }
        assert_int_equal(x[MT_STAT_SMALL].current, 0);
    }
    for (int t = 0; t < MT_TAG_MAX; t++) {
        assert_int_equal(s.tag_allocated_bytes[t].current, m->tcur[0][t]);
        assert_int_equal(s.tag_requested_bytes[t].current, m->tcur[1][t]);
        assert_int_equal(s.tag_allocated_bytes[t].allocated, m->tcum[0][t]);
        assert_int_equal(s.tag_requested_bytes[t].allocated, m->tcum[1][t]);
        if (peaks) {
            assert_int_equal(s.tag_allocated_bytes[t].peak, m->tpeak[0][t]);
            assert_int_equal(s.tag_requested_bytes[t].peak, m->tpeak[1][t]);
        }
    }
}

/* Bytes the allocator's own counter holds beyond the program's: what caches hold. */
static int64_t held_bytes(mt_alloc_t *a, const model_t *m)
{
    mt__alloc_lock(a);
    int64_t g = a->st.allocated_bytes[MT_STAT_ALL].current;
    mt__alloc_unlock(a);
    return g - m->cur[M_BYTES];
}

static size_t cache_count(mt_alloc_t *a)
{
    mt__alloc_lock(a);
    size_t n = mt__tc_count(a);
    mt__alloc_unlock(a);
    return n;
}

static uint32_t rng(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* ---- random pairs against the model ---- */

#define LIVE 12

typedef struct run_s {
    mt_alloc_t *a;
    mt_stream_t *s;
    model_t m;
    uint32_t seed;
    unsigned ops;
    size_t held_seen; /* frees after which a cache held the block */
    bool check;       /* mt_alloc_check after every op */
} run_t;

typedef struct live_s {
    void *p;
    int64_t size, req;
    int tag;
} live_t;

static void do_alloc(run_t *r, live_t *l, size_t rounded, size_t req, int tag)
{
    assert_int_equal(mt_alloc_malloc(r->a, req, r->s, tag, &l->p), 0);
    size_t size = 0;
    int t = -1;
    assert_int_equal(mt_alloc_block_info(r->a, l->p, NULL, &size, &t), 0);
    assert_int_equal(t, tag);
    assert_true(size >= rounded);
    *l = (live_t){l->p, (int64_t)size, (int64_t)req, tag};
    model_add(&r->m, tag, l->size, l->req, 1);
}

static void do_free(run_t *r, live_t *l)
{
    assert_int_equal(mt_alloc_free(r->a, l->p), 0);
    model_add(&r->m, l->tag, l->size, l->req, -1);
    l->p = NULL;
}

static void random_run(void *arg)
{
    run_t *r = arg;
    static const size_t sizes[] = {64 << 10, 200 << 10, 3 << 20};
    live_t live[LIVE] = {{0}};
    for (unsigned i = 0; i < r->ops; i++) {
        unsigned k = rng(&r->seed) % LIVE, what = rng(&r->seed) % 10;
        size_t rounded = sizes[rng(&r->seed) % 3];
        size_t req = rounded - (rng(&r->seed) % 3 == 0 ? rng(&r->seed) % 500 : 0);
        int tag = (int)(rng(&r->seed) % 3);
        if (live[k].p != NULL && what < 4) {
            do_free(r, &live[k]);
        } else if (live[k].p != NULL) {
            /* pairs: free it and ask again for its size, twice (the second is the cache's
             * when nothing moved), maybe with another request or tag */
            for (int twice = 0; twice < 2; twice++) {
                int64_t was = live[k].size;
                do_free(r, &live[k]);
                r->held_seen += r->check && held_bytes(r->a, &r->m) > 0;
                /* 9: the second asks less, 7: more, 8: another tag (no pop: a pop keeps
                 * the request and tag the counters hold for the block) */
                size_t less = what == 9   ? 100u * (unsigned)twice
                              : what == 7 ? 100u * (unsigned)(1 - twice)
                                          : 0;
                do_alloc(r, &live[k], (size_t)was, (size_t)was - less,
                         what == 8 ? (tag + twice) % 3 : live[k].tag);
            }
        } else {
            do_alloc(r, &live[k], rounded, req, tag);
        }
        if (r->check)
            assert_int_equal(mt_alloc_check(r->a), 0);
    }
    for (unsigned k = 0; k < LIVE; k++)
        if (live[k].p != NULL)
            do_free(r, &live[k]);
    if (r->check)
        assert_int_equal(mt_alloc_check(r->a), 0);
}

static void test_stats_exact_one_thread(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(1024 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    run_t r = {.a = a, .seed = 12345, .ops = 400, .check = true};
    for (int round = 0; round < 10; round++) {
        random_run(&r);
        model_compare(a, &r.m, true); /* the peaks too: the truth's, never a stale cache's */
    }
    assert_true(r.held_seen > 100); /* the fast path was taken */
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void *run_thread(void *arg)
{
    random_run(arg);
    return NULL;
}

static void test_stats_exact_two_threads(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(1024 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    mt_stream_t *s[2];
    run_t r[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(mt_stream_create(b, &s[i]), 0);
        r[i] = (run_t){.a = a, .s = s[i], .seed = 777u + (uint32_t)i, .ops = 3000, .check = i == 0};
    }
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, run_thread, &r[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(mt_alloc_check(a), 0);
    model_t sum = r[0].m;
    for (int k = 0; k < M_N; k++)
        sum.cum[k] += r[1].m.cum[k], sum.cur[k] += r[1].m.cur[k];
    for (int t = 0; t < MT_TAG_MAX; t++)
        for (int j = 0; j < 2; j++)
            sum.tcum[j][t] += r[1].m.tcum[j][t], sum.tcur[j][t] += r[1].m.tcur[j][t];
    model_compare(a, &sum, false);
    /* The true peak lies between either thread's and their sum. */
    mt_alloc_stats_t st = stats_of(a);
    for (int k = 0; k < M_N; k++) {
        int64_t p = stat_of(&st, k)[MT_STAT_ALL].peak;
        assert_true(p >= r[0].m.peak[k] && p >= r[1].m.peak[k]);
        assert_true(p <= r[0].m.peak[k] + r[1].m.peak[k]);
    }
    mt_alloc_destroy(&a);
    for (int i = 0; i < 2; i++)
        mt_stream_destroy(b, &s[i]);
    mt_backend_destroy(&b);
}

/* ---- scripted cases ---- */

typedef struct pair_s {
    mt_alloc_t *a;
    mt_stream_t *s;
    size_t size;
    int tag;
    void *p;
} pair_t;

static void job_alloc(void *arg)
{
    pair_t *j = arg;
    j->p = xmalloc_dev(j->a, j->size, j->s, j->tag);
}

static void job_free(void *arg)
{
    pair_t *j = arg;
    assert_int_equal(mt_alloc_free(j->a, j->p), 0);
}

/* A pair on the thread, its block left held in the thread's cache. */
static void job_pair_held(void *arg)
{
    job_alloc(arg);
    job_free(arg);
    job_alloc(arg); /* taken back from the cache */
    job_free(arg);
}

/* This thread's cache in a backoff (TC_WINDOW blocks owned, none popped), peaks reset. */
static void back_off(mt_alloc_t *a)
{
    static void *ps[TC_WINDOW];
    for (int i = 0; i < TC_WINDOW; i++)
        ps[i] = xmalloc_dev(a, 64 * KIB, NULL, 0);
    for (int i = 0; i < TC_WINDOW; i++)
        assert_int_equal(mt_alloc_free(a, ps[i]), 0);
    mt_alloc_reset_peak(a); /* flushes every cache */
    assert_true(mt__tc_mine(a)->skip > 0);
}

/* Another thread holds a freed block: a global allocation that would raise the count
 * above its peak flushes it first, so the peak stays the truth's 1; also when this
 * thread's own cache is idle (in a backoff, holding nothing). */
static void peak_not_raised(bool idle)
{
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    if (idle)
        back_off(a);
    void *x = xmalloc_dev(a, 8 * MIB, NULL, 0); /* room for both below, on this stream */
    assert_int_equal(mt_alloc_free(a, x), 0);
    worker_t w;
    worker_start(&w);
    pair_t j = {a, NULL, 4 * MIB, 1, NULL};
    worker_run(&w, job_pair_held, &j);
    assert_int_equal(mt_alloc_check(a), 0);
    mt__alloc_lock(a);
    assert_int_equal(a->st.allocation[MT_STAT_ALL].current, 1); /* held, to the counters */
    mt__alloc_unlock(a);
    void *q = xmalloc_dev(a, 1 * MIB, NULL, 1); /* fits in x's free space: no device call */
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.allocation[MT_STAT_ALL].peak, 1);
    assert_int_equal(s.allocation[MT_STAT_ALL].current, 1);
    assert_int_equal(s.tag_allocated_bytes[1].peak, 4 * MIB);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].peak, 8 * MIB);
    assert_int_equal(mt_alloc_free(a, q), 0);
    worker_stop(&w);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_peak_not_raised_by_held_block(void **state)
{
    (void)state;
    peak_not_raised(false);
    peak_not_raised(true);
}

/* A block the worker asks for again with another request: its cache does not hand it out
 * (a pop keeps the request and tag the counters hold), the global path does, so the
 * counters hold the program's request at once. Freed by this thread, it leaves the
 * owner's table, the owner cannot hand it out again, and the counters stay the truth. */
static void job_pair_other_request(void *arg)
{
    pair_t *j = arg;
    job_alloc(j);
    job_free(j);
    j->p = xmalloc_dev(j->a, j->size - 100, j->s, j->tag); /* not from the cache */
}

static void test_cross_thread_free(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    worker_t w;
    worker_start(&w);
    pair_t j = {a, NULL, 64 * KIB, 2, NULL};
    worker_run(&w, job_pair_other_request, &j);
    void *p = j.p;
    mt__alloc_lock(a);
    mt_block_t *blk = mt__addrmap_get(&a->map, (uintptr_t)p);
    bool owned = blk->tce != NULL;
    size_t req = blk->requested;
    int64_t cur = a->st.requested_bytes[MT_STAT_ALL].current;
    mt__alloc_unlock(a); /* before any assertion: a failed one must not leave mu held */
    assert_true(owned);  /* the worker's, handed out by the global path */
    assert_int_equal(req, 64 * KIB - 100); /* the program's request, without a flush */
    assert_int_equal(cur, 64 * KIB - 100);
    int tag = -1;
    size_t size = 0;
    assert_int_equal(mt_alloc_block_info(a, p, NULL, &size, &tag), 0);
    assert_int_equal(tag, 2);
    assert_int_equal(size, 64 * KIB);
    assert_int_equal(mt_alloc_free(a, p), 0); /* this thread frees the worker's block */
    assert_int_equal(mt_alloc_check(a), 0);
    assert_null(blk->tce);
    assert_int_equal(mt_alloc_free(a, p), MT_ENOENT); /* and it is gone */
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(s.requested_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(s.requested_bytes[MT_STAT_ALL].allocated, 2 * 64 * KIB - 100);
    assert_int_equal(s.allocation[MT_STAT_ALL].allocated, 2);
    assert_int_equal(s.tag_allocated_bytes[2].allocated, 2 * 64 * KIB);
    assert_int_equal(s.tag_requested_bytes[2].current, 0);
    /* the worker's next pair: the global path, then its own cache again */
    worker_run(&w, job_pair_held, &j);
    assert_int_equal(mt_alloc_check(a), 0);
    /* a free of a block held in a cache (a double free) is refused */
    assert_int_equal(mt_alloc_free(a, j.p), MT_ENOENT);
    assert_int_equal(mt_alloc_check(a), 0);
    s = stats_of(a);
    assert_int_equal(s.allocation[MT_STAT_ALL].current, 0);
    assert_int_equal(s.allocation[MT_STAT_ALL].allocated, 4);
    worker_stop(&w);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* record_stream on a block the cache handed out: its free takes the global path, the
 * event is recorded, and the block is not handed out again before s2's work ran. */
static void test_record_stream_goes_global(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    mt_stream_t *s1 = NULL, *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s1), 0);
    assert_int_equal(mt_stream_create(b, &s2), 0);
    void *p = xmalloc_dev(a, MIB, s1, 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_ptr_equal(xmalloc_dev(a, MIB, s1, 0), p); /* from the cache */
    gate_t g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
    assert_int_equal(mt_alloc_record_stream(a, p, s2), 0);
    assert_int_equal(mt_stream_launch_host_func(b, s2, gate_wait, &g), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    mt__alloc_lock(a);
    assert_int_equal(a->npending, 1); /* the event on s2, not the cache */
    mt__alloc_unlock(a);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(s.active_bytes[MT_STAT_ALL].current, MIB); /* pending on s2 */
    void *q = xmalloc_dev(a, MIB, s1, 0);
    assert_ptr_not_equal(q, p);
    assert_int_equal(mt_alloc_free(a, q), 0); /* held in the cache */
    gate_open(&g);
    assert_int_equal(mt_stream_synchronize(b, s2), 0);
    /* With an event pending, a malloc polls it (the global path), as it always did. */
    q = xmalloc_dev(a, MIB, s1, 0);
    s = stats_of(a);
    assert_int_equal(s.active_bytes[MT_STAT_ALL].current, s.allocated_bytes[MT_STAT_ALL].current);
    assert_int_equal(mt_alloc_free(a, q), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s1);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

/* The device is full but for a block another thread's cache holds: the request gets it. */
static void test_oom_flushes_other_caches(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s2), 0);
    worker_t w;
    worker_start(&w);
    pair_t j = {a, NULL, 40 * MIB, 0, NULL};
    worker_run(&w, job_pair_held, &j);
    void *q = xmalloc_dev(a, 40 * MIB, NULL, 0); /* same stream: the held block */
    assert_ptr_equal(q, j.p);
    assert_int_equal(mt_alloc_check(a), 0);
    assert_int_equal(mt_alloc_free(a, q), 0); /* held in this thread's cache now */
    j.s = s2;
    worker_run(&w, job_alloc, &j); /* another stream: released, then mapped again */
    assert_int_equal(mt_alloc_check(a), 0);
    worker_run(&w, job_free, &j);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.num_ooms, 0);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 0);
    worker_stop(&w);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

/* empty_cache gives back the memory of blocks held in every thread's cache. */
static void test_empty_cache_flushes(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    worker_t w;
    worker_start(&w);
    pair_t j = {a, NULL, 6 * MIB, 0, NULL};
    worker_run(&w, job_pair_held, &j);
    void *p = xmalloc_dev(a, 2 * MIB, NULL, 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt__alloc_lock(a);
    assert_int_equal(a->st.reserved_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(a->st.allocated_bytes[MT_STAT_ALL].current, 0);
    mt__alloc_unlock(a);
    worker_stop(&w);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* A thread that exits gives its held blocks back and its cache goes. */
static void *exit_after_pair(void *arg)
{
    job_pair_held(arg);
    return NULL;
}

static void test_thread_exit_flushes(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    pair_t j = {a, NULL, 64 * KIB, 0, NULL};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, exit_after_pair, &j), 0);
    pthread_join(th, NULL);
    assert_int_equal(cache_count(a), 0);
    mt__alloc_lock(a);
    assert_int_equal(a->st.allocated_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(a->st.allocation[MT_STAT_ALL].allocated, 2); /* the pop counted */
    mt__alloc_unlock(a);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* The allocator is destroyed while a thread's TLS still names it; a new one (perhaps at
 * the same address) is used by that thread, which then exits: nothing of the old one is
 * touched (ASan), and the new one's cache is its own. */
static void test_destroy_while_named(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    worker_t w;
    worker_start(&w);
    for (int round = 0; round < 6; round++) { /* more rounds than TLS entries */
        mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
        pair_t j = {a, NULL, 64 * KIB, 0, NULL};
        worker_run(&w, job_pair_held, &j);
        assert_int_equal(cache_count(a), 1);
        mt_alloc_destroy(&a); /* the worker's held block and cache go with it */
        mt_alloc_t *a2 = make_alloc_default(b, NULL, NULL);
        j.a = a2;
        worker_run(&w, job_pair_held, &j);
        assert_int_equal(cache_count(a2), 1);
        assert_int_equal(mt_alloc_check(a2), 0);
        mt_alloc_stats_t s = stats_of(a2);
        assert_int_equal(s.allocation[MT_STAT_ALL].allocated, 2);
        assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 0);
        mt_alloc_destroy(&a2);
    }
    worker_stop(&w);
    mt_backend_destroy(&b);
}

/* Where the fast paths are off: tcache:0, while warming; and after a warm-up of two pairs,
 * whose next request takes the plan's other entry (test_tcache_plan.c has the pairs a
 * cache serves under a plan). A recording sink leaves them on (test_tcache_rec.c). */
static void test_off_where_it_must_be(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    rec_sink_t rec;
    rec_init(&rec);
    const char *confs[] = {"tcache:0", NULL};
    for (int i = 0; i < 2; i++) {
        mt_alloc_t *a = make_alloc_default(b, confs[i], i == 1 ? &rec.sink : NULL);
        model_t m;
        memset(&m, 0, sizeof m);
        void *p = xmalloc_dev(a, MIB, NULL, 0);
        assert_int_equal(mt_alloc_free(a, p), 0);
        assert_int_equal(held_bytes(a, &m), i == 1 ? MIB : 0);
        mt_alloc_destroy(&a);
    }
    rec_fini(&rec);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    model_t m;
    memset(&m, 0, sizeof m);
    assert_int_equal(mt_alloc_warmup_begin(a), 0);
    void *p = xmalloc_dev(a, MIB, NULL, 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(held_bytes(a, &m), 0);
    p = xmalloc_dev(a, MIB, NULL, 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(mt_alloc_warmup_end(a, NULL), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    uint64_t calls = backend_mallocs(b);
    p = xmalloc_dev(a, MIB, NULL, 0); /* the plan places it: no device call; its pair
                                       * moves the plan's cursor, so no cache either */
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(held_bytes(a, &m), 0);
    assert_int_equal(backend_mallocs(b), calls);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* The cache hands a block out again only where best fit would: here another thread's
 * free made an exact 64 KiB hole after p was handed out, and p, freed beside the free
 * tail of its page, is part of a larger run; best fit takes the hole. */
static void test_pop_only_where_best_fit_would(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    void *x = xmalloc_dev(a, 64 * KIB, NULL, 0);
    void *y = xmalloc_dev(a, 64 * KIB, NULL, 0);
    void *p = xmalloc_dev(a, 64 * KIB, NULL, 0);
    assert_int_equal(mt_alloc_free(a, p), 0); /* into this thread's cache */
    worker_t w;
    worker_start(&w);
    pair_t j = {a, NULL, 0, 0, x};
    worker_run(&w, job_free, &j); /* the global path: a hole where x was */
    worker_stop(&w);
    void *q = xmalloc_dev(a, 64 * KIB, NULL, 0);
    assert_ptr_equal(q, x);
    assert_int_equal(mt_alloc_check(a), 0);
    assert_int_equal(mt_alloc_free(a, q), 0);
    assert_int_equal(mt_alloc_free(a, y), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* A pop of a block handed out before the last one (on another stream) makes it the last:
 * mt_alloc_check compares the address a free in a backoff looks at with it. */
static void test_pop_becomes_last(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    mt_stream_t *s = NULL;
    assert_int_equal(mt_stream_create(b, &s), 0);
    void *x = xmalloc_dev(a, 64 * KIB, s, 0);
    void *y = xmalloc_dev(a, 64 * KIB, NULL, 0);
    assert_int_equal(mt_alloc_free(a, x), 0);
    assert_ptr_equal(xmalloc_dev(a, 64 * KIB, s, 0), x); /* from the cache */
    assert_int_equal(mt_alloc_check(a), 0);
    assert_int_equal(mt_alloc_free(a, x), 0);
    assert_int_equal(mt_alloc_free(a, y), 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s);
    mt_backend_destroy(&b);
}

/* Frees of owned blocks of many sizes are all held (up to TC_HELD), whatever their sizes
 * and streams: none is sent to the global path by a table slot another size took. The
 * counters hold them as allocated until a flush, which stats makes. */
static void test_many_sizes_held(void **state)
{
    (void)state;
    enum { N = 100 };
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    void *p[N];
    for (int i = 0; i < N; i++)
        p[i] = xmalloc_dev(a, (size_t)(i + 1) * 4 * KIB, NULL, 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(mt_alloc_free(a, p[i]), 0);
    mt__alloc_lock(a);
    int64_t held = a->st.allocation[MT_STAT_ALL].current;
    mt__alloc_unlock(a);
    assert_int_equal(held, N); /* every free was the cache's */
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.allocation[MT_STAT_ALL].current, 0);
    assert_int_equal(s.allocation[MT_STAT_ALL].allocated, N);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* A thread whose blocks are never taken back from its cache stops giving them to it (a
 * window of TC_WINDOW owned blocks without a pop), and starts again TC_BACKOFF_MIN global
 * allocations later. The counters overstate the truth only while the cache holds a block. */
static void test_owning_backs_off(void **state)
{
    (void)state;
    enum { N = TC_WINDOW + 64 };
    mt_backend_t *b = sim_backend(1024 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    model_t m;
    memset(&m, 0, sizeof m);
    static void *ps[N];
    for (int i = 0; i < N; i++) /* owned, none ever popped */
        ps[i] = xmalloc_dev(a, 64 * KIB, NULL, 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(mt_alloc_free(a, ps[i]), 0);
    mt__alloc_lock(a);
    mt__tc_flush_all(a);
    mt__alloc_unlock(a);
    int global = 0; /* global allocations since owning stopped */
    void *p = xmalloc_dev(a, 64 * KIB, NULL, 0);
    global++;
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(held_bytes(a, &m), 0); /* not owned: its free went global */
    while (global < TC_BACKOFF_MIN - (N - TC_WINDOW)) {
        p = xmalloc_dev(a, 64 * KIB, NULL, 0);
        global++;
        assert_int_equal(mt_alloc_free(a, p), 0);
        assert_int_equal(held_bytes(a, &m), 0);
    }
    p = xmalloc_dev(a, 64 * KIB, NULL, 0); /* owned again */
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(held_bytes(a, &m), 64 * KIB);
    void *q = xmalloc_dev(a, 64 * KIB, NULL, 0); /* the fast path gives it back */
    assert_ptr_equal(q, p);
    assert_int_equal(held_bytes(a, &m), 64 * KIB); /* q is live (m counts nothing) */
    assert_int_equal(mt_alloc_free(a, q), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* ---- the exclusion of the fast paths by claims ---- */

typedef struct spin_s {
    mt_alloc_t *a;
    mt_stream_t *s;
    int stop;       /* atomic: the claimer is done */
    unsigned pairs; /* atomic: pairs made */
    void *live;     /* a block of the spinner's, live throughout (block_info's target) */
} spin_t;

static void *spin_pairs(void *arg)
{
    spin_t *x = arg;
    __atomic_store_n(&x->live, xmalloc_dev(x->a, 128 * KIB, x->s, 1), __ATOMIC_RELEASE);
    while (!__atomic_load_n(&x->stop, __ATOMIC_ACQUIRE)) {
        void *p = xmalloc_dev(x->a, 64 * KIB, x->s, 0);
        assert_int_equal(mt_alloc_free(x->a, p), 0);
        __atomic_fetch_add(&x->pairs, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* One thread makes pairs, mostly in its cache, while this one claims that cache over and
 * over: stats (a flush), the checker, block_info and record_stream on the other thread's
 * live block. Every claim sees a consistent cache (the checker) and the counts stay exact:
 * with membarrier the owner takes no lock, so this is the protocol's test. */
static void test_claims_against_fast_paths(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    spin_t x = {.a = a};
    assert_int_equal(mt_stream_create(b, &x.s), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, spin_pairs, &x), 0);
    while (__atomic_load_n(&x.live, __ATOMIC_ACQUIRE) == NULL)
        sched_yield();
    unsigned p0 = __atomic_load_n(&x.pairs, __ATOMIC_RELAXED);
    /* at least 2000 claims, and until the other thread made 1000 pairs meanwhile */
    for (int i = 0; i < 2000 || __atomic_load_n(&x.pairs, __ATOMIC_RELAXED) - p0 < 1000; i++) {
        switch (i % 4) {
        case 0:
            assert_int_equal(mt_alloc_check(a), 0);
            break;
        case 1: {
            mt_alloc_stats_t st = stats_of(a);
            /* the live block, and at most the pair in flight */
            assert_true(st.allocation[MT_STAT_ALL].current >= 1 &&
                        st.allocation[MT_STAT_ALL].current <= 2);
            break;
        }
        case 2: {
            int tag = -1;
            size_t size = 0;
            assert_int_equal(mt_alloc_block_info(a, x.live, NULL, &size, &tag), 0);
            assert_int_equal(tag, 1);
            assert_int_equal(size, 128 * KIB);
            break;
        }
        default:
            assert_int_equal(mt_alloc_record_stream(a, x.live, x.s), 0); /* its own stream */
        }
    }
    __atomic_store_n(&x.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    assert_int_equal(mt_alloc_free(a, x.live), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_stats_t st = stats_of(a);
    assert_int_equal(st.allocation[MT_STAT_ALL].current, 0);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(st.allocation[MT_STAT_ALL].allocated, (uint64_t)x.pairs + 1);
    assert_int_equal(st.tag_allocated_bytes[0].allocated, (uint64_t)x.pairs * 64 * KIB);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &x.s);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_exact_one_thread),
        cmocka_unit_test(test_stats_exact_two_threads),
        cmocka_unit_test(test_peak_not_raised_by_held_block),
        cmocka_unit_test(test_cross_thread_free),
        cmocka_unit_test(test_record_stream_goes_global),
        cmocka_unit_test(test_oom_flushes_other_caches),
        cmocka_unit_test(test_empty_cache_flushes),
        cmocka_unit_test(test_thread_exit_flushes),
        cmocka_unit_test(test_destroy_while_named),
        cmocka_unit_test(test_off_where_it_must_be),
        cmocka_unit_test(test_pop_only_where_best_fit_would),
        cmocka_unit_test(test_many_sizes_held),
        cmocka_unit_test(test_pop_becomes_last),
        cmocka_unit_test(test_owning_backs_off),
        cmocka_unit_test(test_claims_against_fast_paths),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
