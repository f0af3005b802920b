/* OOM observers (called once per OOM, without the lock, with the figures; removal) and
 * scoped statistics (nested scopes, totals, peaks exact against the program's truth with
 * thread caches on, depth limit, named marks in the event stream). */
#include <pthread.h>

#include "tests/alloc/helpers.h"
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

typedef struct job_s {
    mt_alloc_t *a;
    size_t size;
} job_t;

/* Allocates and frees: the block stays in this thread's cache, counted as allocated. */
static void job_alloc_free(void *arg)
{
    job_t *j = arg;
    assert_int_equal(mt_alloc_free(j->a, xmalloc_dev(j->a, j->size, NULL, MT_TAG_OTHER)), 0);
}

/* ---- OOM observers ---- */

typedef struct seen_s {
    mt_alloc_t *a;
    int calls;
    mt_alloc_oom_info_t info;
    char msg[2048];
    int stats_rc;            /* mt_alloc_stats called inside the observer */
    int64_t stats_allocated; /* its allocated bytes */
} seen_t;

static void observe(void *ud, const mt_alloc_oom_info_t *info)
{
    seen_t *s = ud;
    s->calls++;
    s->info = *info;
    snprintf(s->msg, sizeof s->msg, "%s", info->message);
    mt_alloc_stats_t st;
    s->stats_rc = mt_alloc_stats(s->a, &st); /* would deadlock under the lock */
    s->stats_allocated = st.allocated_bytes[MT_STAT_ALL].current;
}

static void test_oom_observer(void **state)
{
    mt_backend_t *b = sim_backend(48 * MIB);
    mt_alloc_t *a = make_alloc_default(b, "", NULL);
    seen_t s = {.a = a}, other = {.a = a};
    assert_int_equal(mt_alloc_add_oom_observer(a, observe, &s), 0);
    assert_int_equal(mt_alloc_add_oom_observer(a, observe, &other), 0);
    void *held = xmalloc_dev(a, 40 * MIB, NULL, MT_TAG_WEIGHTS);

    /* Served requests call no observer. */
    void *small = xmalloc_dev(a, 1 * MIB, NULL, MT_TAG_OTHER);
    assert_int_equal(s.calls, 0);

    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(a, 20 * MIB, NULL, MT_TAG_ACTIVATIONS, &p), MT_ENOMEM);
    assert_null(p);
    assert_int_equal(s.calls, 1);
    assert_int_equal(other.calls, 1);
    assert_int_equal(s.info.device, 0);
    assert_int_equal(s.info.requested, 20 * MIB);
    assert_int_equal(s.info.allocated, 41 * MIB);
    assert_int_equal(s.stats_rc, 0);
    assert_int_equal(s.stats_allocated, 41 * MIB);
    mt_alloc_stats_t st = stats_of(a);
    assert_int_equal(s.info.reserved, (uint64_t)st.reserved_bytes[MT_STAT_ALL].current);
    assert_int_equal(s.info.limit, 48 * MIB);
    size_t fr = 0, tot = 0;
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(s.info.free, fr);
    assert_true(s.info.free < 20 * MIB);
    assert_string_equal(s.msg, mt_alloc_last_error(a));
    assert_non_null(strstr(s.msg, "out of memory"));

    /* A size beyond any device is an OOM too. */
    assert_int_equal(mt_alloc_malloc(a, (size_t)1 << 61, NULL, MT_TAG_OTHER, &p), MT_ENOMEM);
    assert_int_equal(s.calls, 2);
    assert_int_equal(s.info.requested, (uint64_t)1 << 61);

    /* Removed, an observer is no longer called; the other still is. */
    assert_int_equal(mt_alloc_remove_oom_observer(a, observe, &s), 0);
    assert_int_equal(mt_alloc_remove_oom_observer(a, observe, &s), MT_ENOENT);
    assert_int_equal(mt_alloc_malloc(a, 20 * MIB, NULL, MT_TAG_ACTIVATIONS, &p), MT_ENOMEM);
    assert_int_equal(s.calls, 2);
    assert_int_equal(other.calls, 3);
    assert_int_equal(stats_of(a).num_ooms, 3);

    mt_alloc_free(a, small);
    mt_alloc_free(a, held);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_oom_observer_limits(void **state)
{
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc(b, "", NULL);
    seen_t s[9];
    for (int i = 0; i < 8; i++)
        assert_int_equal(mt_alloc_add_oom_observer(a, observe, &s[i]), 0);
    assert_int_equal(mt_alloc_add_oom_observer(a, observe, &s[8]), MT_EBUSY);
    assert_int_equal(mt_alloc_add_oom_observer(a, NULL, &s[8]), MT_EINVAL);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* ---- scoped statistics ---- */

static void test_scopes_nested(void **state)
{
    mt_backend_t *b = sim_backend(256 * MIB);
    rec_sink_t r;
    rec_init(&r);
    mt_alloc_t *a = make_alloc_default(b, "", &r.sink);
    void *before = xmalloc_dev(a, 8 * MIB, NULL, MT_TAG_OTHER);

    assert_int_equal(mt_alloc_stats_push(a, "outer"), 0);
    void *A = xmalloc_dev(a, 4 * MIB, NULL, MT_TAG_OTHER);
    assert_int_equal(mt_alloc_stats_push(a, "inner"), 0);
    assert_int_equal(mt_alloc_stats_depth(a), 2);
    void *B = xmalloc_dev(a, 2 * MIB, NULL, MT_TAG_OTHER);
    mt_alloc_free(a, B);
    void *C = xmalloc_dev(a, 1 * MIB, NULL, MT_TAG_OTHER);
    mt_alloc_scope_stats_t in;
    assert_int_equal(mt_alloc_stats_pop(a, &in), 0);
    assert_int_equal(in.start_bytes, 12 * MIB);
    assert_int_equal(in.peak_bytes, 2 * MIB);
    assert_int_equal(in.current_bytes, 1 * MIB);
    assert_int_equal(in.allocated_bytes, 3 * MIB);
    assert_int_equal(in.freed_bytes, 2 * MIB);
    assert_int_equal(in.allocations, 2);
    assert_int_equal(in.frees, 1);

    /* Frees of blocks from before the scope count in it; the current may go below 0. */
    mt_alloc_free(a, A);
    mt_alloc_free(a, C);
    mt_alloc_free(a, before);
    mt_alloc_scope_stats_t out;
    assert_int_equal(mt_alloc_stats_pop(a, &out), 0);
    assert_int_equal(out.start_bytes, 8 * MIB);
    assert_int_equal(out.peak_bytes, 6 * MIB); /* A + B, inside the inner scope */
    assert_int_equal(out.current_bytes, -(int64_t)(8 * MIB));
    assert_int_equal(out.allocated_bytes, 7 * MIB);
    assert_int_equal(out.freed_bytes, 15 * MIB);
    assert_int_equal(out.allocations, 3);
    assert_int_equal(out.frees, 4);
    assert_int_equal(mt_alloc_stats_pop(a, &out), MT_EINVAL);

    /* Push and pop are named marks in the stream. */
    const char *want[] = {"outer", "inner", "/inner", "/outer"};
    int k = 0;
    for (size_t i = 0; i < r.n; i++) {
        if (r.ev[i].kind != MT_EV_MARK_NAMED)
            continue;
        assert_true(k < 4);
        mt_event_rec_t w = {0};
        mt_event_mark_name_pack(&w, want[k++]);
        assert_int_equal(r.ev[i].addr, w.addr);
        assert_int_equal(r.ev[i].size, w.size);
    }
    assert_int_equal(k, 4);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    rec_fini(&r);
}

static void test_scope_depth_limit(void **state)
{
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc_default(b, "", NULL);
    for (int i = 0; i < MT_ALLOC_SCOPE_MAX; i++)
        assert_int_equal(mt_alloc_stats_push(a, NULL), 0);
    assert_int_equal(mt_alloc_stats_push(a, NULL), MT_EOVERFLOW);
    for (int i = 0; i < MT_ALLOC_SCOPE_MAX; i++)
        assert_int_equal(mt_alloc_stats_pop(a, NULL), 0);
    assert_int_equal(mt_alloc_stats_depth(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* With thread caches on (no sink): a block freed into the cache still counts in the
 * allocator's counters, so a global allocation made meanwhile would overstate the scope's
 * peak unless the caches are flushed first. The earlier, higher global peaks (bytes and
 * counts) keep the global guard from flushing. */
static void test_scope_peak_exact_with_tcache(void **state)
{
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc_default(b, "tcache:1", NULL);
    void *early[8];
    for (int i = 0; i < 8; i++) /* high peaks of bytes and of counts */
        early[i] = xmalloc_dev(a, 8 * MIB, NULL, MT_TAG_OTHER);
    for (int i = 0; i < 8; i++)
        mt_alloc_free(a, early[i]);
    worker_t w;
    worker_start(&w);
    job_t j = {a, 1 * MIB};
    assert_int_equal(mt_alloc_stats_push(a, NULL), 0);
    worker_run(&w, job_alloc_free, &j); /* 1 MiB held in the worker's cache */
    void *q = xmalloc_dev(a, 2 * MIB, NULL, MT_TAG_OTHER);
    mt_alloc_scope_stats_t s;
    assert_int_equal(mt_alloc_stats_pop(a, &s), 0);
    assert_int_equal(s.peak_bytes, 2 * MIB);
    assert_int_equal(s.allocations, 2);
    assert_int_equal(s.frees, 1);
    mt_alloc_free(a, q);
    worker_stop(&w);

    /* A random run against the truth, nested scopes open throughout. */
    enum { N = 64, STEPS = 20000 };
    void *live[N] = {0};
    size_t sz[N] = {0};
    int64_t truth = 0, peak_outer, peak_inner = 0;
    uint64_t rng = 88172645463325252ull;
    assert_int_equal(mt_alloc_stats_push(a, "outer"), 0);
    peak_outer = truth;
    int64_t start_inner = 0;
    bool inner_open = false;
    for (int i = 0; i < STEPS; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int k = (int)(rng % N);
        if (i % 997 == 0) {
            if (inner_open) {
                mt_alloc_scope_stats_t in;
                assert_int_equal(mt_alloc_stats_pop(a, &in), 0);
                assert_int_equal(in.start_bytes, start_inner);
                assert_int_equal(in.start_bytes + in.peak_bytes, peak_inner);
                assert_int_equal(in.start_bytes + in.current_bytes, truth);
            } else {
                assert_int_equal(mt_alloc_stats_push(a, "inner"), 0);
                start_inner = peak_inner = truth;
            }
            inner_open = !inner_open;
        }
        if (live[k] != NULL) {
            mt_alloc_free(a, live[k]);
            live[k] = NULL;
            truth -= (int64_t)sz[k];
        } else {
            sz[k] = (size_t)(1 + (rng >> 20) % 4) * 512 * KIB;
            live[k] = xmalloc_dev(a, sz[k], NULL, MT_TAG_OTHER);
            truth += (int64_t)sz[k];
            if (truth > peak_outer)
                peak_outer = truth;
            if (inner_open && truth > peak_inner)
                peak_inner = truth;
        }
    }
    if (inner_open)
        assert_int_equal(mt_alloc_stats_pop(a, NULL), 0);
    assert_int_equal(mt_alloc_stats_pop(a, &s), 0);
    assert_int_equal(s.start_bytes, 0);
    assert_int_equal(s.peak_bytes, peak_outer);
    assert_int_equal(s.current_bytes, truth);
    for (int k = 0; k < N; k++)
        mt_alloc_free(a, live[k]);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oom_observer),
        cmocka_unit_test(test_oom_observer_limits),
        cmocka_unit_test(test_scopes_nested),
        cmocka_unit_test(test_scope_depth_limit),
        cmocka_unit_test(test_scope_peak_exact_with_tcache),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
