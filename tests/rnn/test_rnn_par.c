/* mt__rnn_rows_par: the two halves of a job run on two threads with oneDNN (its count is per
 * thread), BLIS and OpenBLAS (for the process), the second on the shape's worker thread
 * (a module's, here the test's), which stays the same from job to job; mt__rnn_sgemm_par's halves
 * make the product; mt__rnn_tiles_par's tiles each run once, more of them on the faster thread, and
 * libxsmm's products in tiles are the same bits as in one call. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "rnn/internal.h"
#include "tests/common/test_main.h"

typedef struct seen_s {
    pthread_t who[2];
    long tid[2]; /* the kernel's ids: a new thread may reuse an old one's pthread_t */
    int lo[2], hi[2];
    int calls;
    pthread_mutex_t lock;
} seen_t;

static void record(void *arg, int b0, int b1)
{
    seen_t *s = arg;
    pthread_mutex_lock(&s->lock);
    int i = b0 == 0 ? 0 : 1;
    s->who[i] = pthread_self();
    s->tid[i] = (long)syscall(SYS_gettid);
    s->lo[i] = b0;
    s->hi[i] = b1;
    s->calls++;
    pthread_mutex_unlock(&s->lock);
}

/* The worker of every shape here, as a module at two threads has its own. */
static mt__rnn_par_t *par;

static int make_par(void **state)
{
    (void)state;
    return mt__rnn_par_create(&par, 1);
}

static int free_par(void **state)
{
    (void)state;
    mt__rnn_par_destroy(&par);
    return par != NULL;
}

/* A small shape whose jobs run on library g at two threads. */
static mt__rnn_shape_t shape_on(const mt__rnn_gemm_t *g)
{
    return (mt__rnn_shape_t){.par = par,
                             .mode = MT_RNN_LSTM,
                             .gates = 4,
                             .input = 3,
                             .hidden = 4,
                             .layers = 1,
                             .dirs = 1,
                             .gemm = g,
                             .threads = 2};
}

/* Rows [0, 5) on the caller and [5, 12) on another thread, for library name (two = false:
 * all rows in one call on the caller). */
static void halves_on(const char *name, bool two)
{
    const mt__rnn_gemm_t *g;
    int rc = mt__rnn_gemm_get(name, &g);
    if (rc == MT_ENOTSUP) {
        printf("# %s is not installed here: not checked\n", name);
        return;
    }
    assert_int_equal(rc, 0);
    mt__rnn_shape_t sh = shape_on(g);
    seen_t s = {.calls = 0, .lock = PTHREAD_MUTEX_INITIALIZER};
    mt__rnn_rows_par(&sh, 5, 12, record, &s);
    if (!two) {
        assert_int_equal(s.calls, 1);
        assert_int_equal(s.hi[0], 12);
        assert_true(pthread_equal(s.who[0], pthread_self()));
        return;
    }
    assert_int_equal(s.calls, 2);
    assert_int_equal(s.lo[0], 0);
    assert_int_equal(s.hi[0], 5);
    assert_int_equal(s.lo[1], 5);
    assert_int_equal(s.hi[1], 12);
    assert_true(pthread_equal(s.who[0], pthread_self()));
    assert_false(pthread_equal(s.who[1], pthread_self()));
    /* At one thread: one call over all rows, on the caller. */
    sh.threads = 1;
    s.calls = 0;
    mt__rnn_rows_par(&sh, 5, 12, record, &s);
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.lo[0], 0);
    assert_int_equal(s.hi[0], 12);
    assert_true(pthread_equal(s.who[0], pthread_self()));
}

static void cblas_halves(void **state)
{
    (void)state;
    halves_on("cblas", true);
}

static void blis_halves(void **state)
{
    (void)state;
    halves_on("blis", true);
}

static void dnnl_halves(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    skip(); /* oneDNN's OpenMP threads and LeakSanitizer: see test_rnn_golden.c */
#endif
    halves_on("dnnl", true);
}

static mt__rnn_shape_t two_threads(void)
{
    const mt__rnn_gemm_t *g;
    assert_int_equal(mt__rnn_gemm_get("cblas", &g), 0);
    return shape_on(g);
}

/* The second halves of consecutive jobs run on one thread, also after it slept (longer
 * than it spins between jobs). */
static void worker_persists(void **state)
{
    (void)state;
    mt__rnn_shape_t sh = two_threads();
    long first = 0;
    for (int i = 0; i < 50; i++) {
        seen_t s = {.calls = 0, .lock = PTHREAD_MUTEX_INITIALIZER};
        if (i % 10 == 9)
            nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
        mt__rnn_rows_par(&sh, 3, 8, record, &s);
        assert_int_equal(s.calls, 2);
        assert_int_equal(s.lo[1], 3);
        assert_int_equal(s.hi[1], 8);
        assert_false(pthread_equal(s.who[1], pthread_self()));
        if (i == 0)
            first = s.tid[1];
        assert_int_equal(s.tid[1], first);
    }
}

/* Jobs from two threads at once: the worker serves one, the other gets a thread of its own;
 * every half runs exactly once. */
typedef struct count_s {
    int hits[64];
} count_t;

static void count_rows(void *arg, int b0, int b1)
{
    count_t *c = arg;
    for (int b = b0; b < b1; b++)
        c->hits[b]++;
}

static void *caller_main(void *p)
{
    int *bad = p;
    mt__rnn_shape_t sh = two_threads();
    for (int i = 0; i < 400; i++) {
        count_t c = {{0}};
        int nb = 2 + i % 62;
        mt__rnn_rows_par(&sh, nb / 2, nb, count_rows, &c);
        for (int b = 0; b < 64; b++)
            *bad += c.hits[b] != (b < nb);
    }
    return NULL;
}

static void two_callers(void **state)
{
    (void)state;
    pthread_t t[2];
    int bad[2] = {0, 0};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, caller_main, &bad[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(bad[0] + bad[1], 0);
}

/* Two operands of n floats in [-0.5, 0.5) and two equal outputs in [0, 1), from rand(). */
typedef struct mats_s {
    float *a, *b, *c1, *c2;
} mats_t;

static mats_t mats_new(size_t n)
{
    mats_t m = {malloc(sizeof(float) * n), malloc(sizeof(float) * n), malloc(sizeof(float) * n),
                malloc(sizeof(float) * n)};
    assert_non_null(m.a && m.b && m.c1 && m.c2);
    for (size_t i = 0; i < n; i++) {
        m.a[i] = (float)rand() / RAND_MAX - 0.5f;
        m.b[i] = (float)rand() / RAND_MAX - 0.5f;
        m.c1[i] = m.c2[i] = (float)rand() / RAND_MAX;
    }
    return m;
}

static void mats_free(mats_t *m)
{
    free(m->a);
    free(m->b);
    free(m->c1);
    free(m->c2);
}

/* The product in halves (rows when M >= N, else columns; every transposition) against one
 * call, on odd sizes. */
static void sgemm_halves(void **state)
{
    (void)state;
    mt__rnn_shape_t sh = two_threads();
    const int shapes[][3] = {{70, 45, 33}, {45, 70, 33}, {64, 64, 1}, {1, 96, 7}, {33, 2, 5}};
    srand(7);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int M = shapes[k][0], N = shapes[k][1], K = shapes[k][2], ld = 100;
        mats_t m = mats_new((size_t)ld * ld);
        float *A = m.a, *B = m.b, *C = m.c1, *R = m.c2;
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            for (int i = 0; i < ld * ld; i++)
                R[i] = C[i];
            mt__rnn_sgemm(sh.gemm, ta, tb, M, N, K, 0.5f, A, ld, B, ld, 1.0f, R, ld);
            mt__rnn_sgemm_par(&sh, ta, tb, M, N, K, 0.5f, A, ld, B, ld, 1.0f, C, ld);
            for (int i = 0; i < ld * ld; i++) {
                bool inside = i / ld < M && i % ld < N;
                if (inside)
                    assert_true(fabsf(C[i] - R[i]) <= 1e-5f * (1.0f + fabsf(R[i])));
                else
                    assert_true(C[i] == R[i]); /* outside C[M, N]: untouched */
            }
        }
        mats_free(&m);
    }
}

/* mt__rnn_sgemm_half's two halves, run one after the other on one thread, are the same bits
 * as mt__rnn_sgemm_par's at two threads (the backward runs them as tiles beside the input
 * gradient's); odd sizes, rows and columns. */
static void sgemm_half_matches_par(void **state)
{
    (void)state;
    mt__rnn_shape_t sh = two_threads();
    const int shapes[][3] = {{70, 45, 33}, {45, 70, 33}, {96, 130, 17}, {20, 3, 9}};
    srand(11);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int M = shapes[k][0], N = shapes[k][1], K = shapes[k][2], ld = 140;
        size_t nf = (size_t)ld * ld;
        mats_t m = mats_new(nf);
        float *A = m.a, *B = m.b, *C1 = m.c1, *C2 = m.c2;
        mt__rnn_sgemm_par(&sh, true, false, M, N, K, 1.0f, A, ld, B, ld, 1.0f, C1, ld);
        (void)mt__rnn_gemm_set_threads(sh.gemm, 1);
        for (int h = 1; h >= 0; h--) /* either order */
            mt__rnn_sgemm_half(&sh, h, true, false, M, N, K, 1.0f, A, ld, B, ld, 1.0f, C2, ld);
        (void)mt__rnn_gemm_set_threads(sh.gemm, 2);
        assert_memory_equal(C1, C2, sizeof(float) * nf);
        mats_free(&m);
    }
}

/* ---- tiles taken in turn ---- */

typedef struct tally_s {
    pthread_t caller;
    atomic_int worker_tiles, caller_tiles;
    atomic_int hits[200];
    atomic_bool worker_seen;
} tally_t;

static void tally(void *arg, int i)
{
    tally_t *t = arg;
    atomic_fetch_add(&t->hits[i], 1);
    if (!pthread_equal(pthread_self(), t->caller)) {
        atomic_store(&t->worker_seen, true);
        atomic_fetch_add(&t->worker_tiles, 1);
        return;
    }
    atomic_fetch_add(&t->caller_tiles, 1);
    /* The caller's core is the slow one: it waits (5 s at most) until the other thread has
     * started, then takes 5 ms a tile. */
    for (int w = 0; w < 5000 && !atomic_load(&t->worker_seen); w++)
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
}

/* Every tile runs once, for any count; where the caller is slow, the other thread takes
 * the tiles it does not get to (fixed halves would give each 20). */
static void tiles_taken_in_turn(void **state)
{
    (void)state;
    mt__rnn_shape_t sh = two_threads();
    for (int n = 0; n <= 40; n += n < 5 ? 1 : 7) {
        tally_t *t = calloc(1, sizeof *t);
        assert_non_null(t);
        t->caller = pthread_self();
        mt__rnn_tiles_par(&sh, n, tally, t);
        for (int i = 0; i < 200; i++)
            assert_int_equal(atomic_load(&t->hits[i]), i < n);
        assert_int_equal(atomic_load(&t->caller_tiles) + atomic_load(&t->worker_tiles), n);
        if (n == 40) {
            assert_true(atomic_load(&t->worker_seen));
            assert_true(atomic_load(&t->caller_tiles) <= 10); /* ~1, with room for a slow host */
        }
        free(t);
    }
    /* One thread: the caller takes them all. */
    sh.threads = 1;
    tally_t *t = calloc(1, sizeof *t);
    assert_non_null(t);
    t->caller = pthread_self();
    atomic_store(&t->worker_seen, true); /* no wait in tally */
    mt__rnn_tiles_par(&sh, 6, tally, t);
    assert_int_equal(atomic_load(&t->caller_tiles), 6);
    free(t);
}

/* The packing and the product in tiles are the same bits as one call, whichever thread
 * takes which tile (odd sizes, beta 0 and 1; C untouched outside [M, N]). */
static void xsmm_tiles_match(void **state)
{
    (void)state;
    mt__rnn_shape_t sh = two_threads();
    const int shapes[][3] = {{70, 45, 33}, {129, 100, 64}, {31, 7, 5}, {1, 64, 3}};
    srand(9);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int M = shapes[k][0], N = shapes[k][1], K = shapes[k][2], ld = 140;
        size_t nf = (size_t)ld * ld;
        mats_t m = mats_new(nf);
        float *X = m.a, *W = m.b, *C1 = m.c1, *C2 = m.c2;
        float *P1 = calloc(nf, sizeof(float)), *P2 = calloc(nf, sizeof(float));
        assert_non_null(P1 && P2);
        for (int tr = 0; tr < 2; tr++) { /* P = W [K, N], then P = W^T (W [N, K]) */
            int rs = tr ? 1 : ld, cs = tr ? ld : 1;
            mt__rnn_xsmm_pack(P1, W, rs, cs, K, N);
            mt__rnn_xsmm_pack_par(&sh, P2, W, rs, cs, K, N);
            assert_memory_equal(P1, P2, sizeof(float) * nf);
            for (int b = 0; b < 2; b++) {
                mt__rnn_xsmm_mm(M, N, K, X, ld, P1, (float)b, C1, ld);
                mt__rnn_xsmm_mm_par(&sh, M, N, K, X, ld, P2, (float)b, C2, ld);
                assert_memory_equal(C1, C2, sizeof(float) * nf);
            }
        }
        free(P1);
        free(P2);
        mats_free(&m);
    }
}

/* ---- the caller's share ---- */

static void slow_caller(void *arg, int b0, int b1)
{
    (void)b1;
    const pthread_t *caller = arg;
    bool mine = pthread_equal(pthread_self(), *caller);
    (void)b0;
    nanosleep(&(struct timespec){0, (mine ? 4 : 1) * 1000 * 1000}, NULL);
}

/* Halves of equal work where the caller sleeps 4 times as long: its share falls from 1/2
 * toward 1/5, and never under it (a sleep may run long on a loaded host, so only the
 * direction and the bound are asserted here); frozen, it stays. */
static void share_follows_speeds(void **state)
{
    (void)state;
    mt__rnn_shape_t sh = two_threads();
    pthread_t me = pthread_self();
    mt__rnn_par_set_share(0.5, false);
    for (int i = 0; i < 20; i++)
        mt__rnn_rows_par_w(&sh, 4, 8, 1.0, 1.0, slow_caller, &me);
    double f = mt__rnn_par_share();
    assert_true(f < 0.45);
    assert_true(f >= 0.2);
    mt__rnn_par_set_share(0.5, true);
    for (int i = 0; i < 5; i++)
        mt__rnn_rows_par_w(&sh, 4, 8, 1.0, 1.0, slow_caller, &me);
    assert_true(mt__rnn_par_share() == 0.5);
    /* Jobs without work figures leave it alone. */
    mt__rnn_par_set_share(0.5, false);
    for (int i = 0; i < 5; i++)
        mt__rnn_rows_par(&sh, 4, 8, slow_caller, &me);
    assert_true(mt__rnn_par_share() == 0.5);
}

/* The learning itself, on given times: a quarter of the way each job, within [1/5, 4/5]
 * exactly as read back, and short or empty halves ignored. */
static void share_learning(void **state)
{
    (void)state;
    const uint64_t ms = 1000 * 1000;
    mt__rnn_par_set_share(0.5, false);
    mt__rnn_par_learn(1.0, 1.0, 4 * ms, 1 * ms); /* caller's speed share 1/5 */
    assert_true(fabs(mt__rnn_par_share() - (0.75 * 0.5 + 0.25 * 0.2)) < 1e-4);
    mt__rnn_par_learn(3.0, 1.0, 1 * ms, 1 * ms); /* 3/4 */
    assert_true(fabs(mt__rnn_par_share() - (0.75 * 0.425 + 0.25 * 0.75)) < 1e-4);
    for (int i = 0; i < 60; i++) /* the caller 100 times slower: down to the bound */
        mt__rnn_par_learn(1.0, 1.0, 100 * ms, 1 * ms);
    assert_true(mt__rnn_par_share() >= 0.2);
    assert_true(mt__rnn_par_share() < 0.2 + 1e-4);
    for (int i = 0; i < 60; i++)
        mt__rnn_par_learn(1.0, 1.0, 1 * ms, 100 * ms);
    assert_true(mt__rnn_par_share() <= 0.8);
    assert_true(mt__rnn_par_share() > 0.8 - 1e-4);
    mt__rnn_par_set_share(0.5, false);
    mt__rnn_par_learn(1.0, 1.0, 150 * 1000, 40 * 1000); /* 190 us in all: noise */
    mt__rnn_par_learn(0.0, 1.0, 4 * ms, 1 * ms);
    mt__rnn_par_learn(1.0, 1.0, 0, 1 * ms);
    assert_true(mt__rnn_par_share() == 0.5);
    mt__rnn_par_set_share(0.5, true);
    mt__rnn_par_learn(1.0, 1.0, 4 * ms, 1 * ms);
    assert_true(mt__rnn_par_share() == 0.5);
    mt__rnn_par_set_share(0.5, false);
}

/* The step loops' cut: the row nearest the share of the work, never an empty part, and the
 * parts' rows in w; at one thread the whole batch. */
static void split_nearest_share(void **state)
{
    (void)state;
    mt__rnn_shape_t sh = two_threads();
    mt_rnn_io_t io = {.seq_len = 10, .batch = 32};
    mt__rnn_seq_t q;
    assert_int_equal(mt__rnn_seq_init(&q, &io), 0);
    const double shares[] = {0.5, 0.47, 0.2, 0.8, 0.0, 1.0};
    const int want[] = {16, 15, 6, 26, 1, 31};
    for (int i = 0; i < 6; i++) {
        double w[2];
        assert_int_equal(mt__rnn_cpu_split(&sh, &q, 0, 10, shares[i], w), want[i]);
        assert_true(w[0] == 10.0 * want[i] && w[1] == 10.0 * (32 - want[i]));
    }
    mt__rnn_seq_fini(&q);
    /* Packed, lengths 6, 5, 3, 1 (15 rows): half is 7.5, nearer after 1 sequence (6) than
     * after 2 (11). */
    const int bs[6] = {4, 3, 3, 2, 2, 1};
    io = (mt_rnn_io_t){.seq_len = 6, .batch = 4, .batch_sizes = bs, .tokens = 15};
    assert_int_equal(mt__rnn_seq_init(&q, &io), 0);
    double w[2];
    assert_int_equal(mt__rnn_cpu_split(&sh, &q, 0, 6, 0.5, w), 1);
    assert_true(w[0] == 6.0 && w[1] == 9.0);
    sh.threads = 1;
    assert_int_equal(mt__rnn_cpu_split(&sh, &q, 0, 6, 0.5, w), 4);
    assert_true(w[0] == 15.0 && w[1] == 0.0);
    mt__rnn_seq_fini(&q);
}

/* ---- more than two parts ---- */

typedef struct parts_seen_s {
    long tid[MT__RNN_PARTS_MAX];
    int lo[MT__RNN_PARTS_MAX], hi[MT__RNN_PARTS_MAX];
    atomic_int calls;
} parts_seen_t;

/* Records the part that starts at b0 (bounds 0, 3, 6, ...: part b0 / 3). */
static void record_part(void *arg, int b0, int b1)
{
    parts_seen_t *s = arg;
    int i = b0 / 3;
    s->tid[i] = (long)syscall(SYS_gettid);
    s->lo[i] = b0;
    s->hi[i] = b1;
    atomic_fetch_add(&s->calls, 1);
    /* Long enough that no thread could run two parts one after the other unnoticed. */
    nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL);
}

/* At 4 threads with 3 workers, 4 parts run once each, on 4 different threads, the first on
 * the caller; with too few workers (or none) the other parts get threads of their own; an
 * empty part is not run. */
static void four_parts(void **state)
{
    (void)state;
    mt__rnn_par_t *p4;
    assert_int_equal(mt__rnn_par_create(&p4, 3), 0);
    assert_int_equal(mt__rnn_par_workers(p4), 3);
    mt__rnn_shape_t sh = two_threads();
    sh.threads = 4;
    assert_int_equal(mt__rnn_par_parts(&sh), 4);
    const int bound[5] = {0, 3, 6, 9, 12};
    for (int round = 0; round < 3; round++) {
        sh.par = round == 0 ? p4 : round == 1 ? par : NULL; /* 3 workers, 1, none */
        parts_seen_t s = {.calls = 0};
        mt__rnn_parts_par(&sh, bound, 4, NULL, record_part, &s);
        assert_int_equal(atomic_load(&s.calls), 4);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(s.lo[i], 3 * i);
            assert_int_equal(s.hi[i], 3 * i + 3);
            for (int k = 0; k < i; k++)
                assert_int_not_equal(s.tid[i], s.tid[k]);
        }
        assert_int_equal(s.tid[0], (long)syscall(SYS_gettid));
    }
    sh.par = p4;
    const int gap[5] = {0, 3, 3, 6, 9}; /* part 1 empty */
    parts_seen_t s = {.calls = 0};
    mt__rnn_parts_par(&sh, gap, 4, NULL, record_part, &s);
    assert_int_equal(atomic_load(&s.calls), 3);
    /* Tiles at 3 threads: each once. */
    sh.threads = 3;
    tally_t *t = calloc(1, sizeof *t);
    assert_non_null(t);
    t->caller = pthread_self();
    atomic_store(&t->worker_seen, true); /* no wait in tally */
    mt__rnn_tiles_par(&sh, 40, tally, t);
    for (int i = 0; i < 200; i++)
        assert_int_equal(atomic_load(&t->hits[i]), i < 40);
    free(t);
    mt__rnn_par_destroy(&p4);
    assert_null(p4);
}

/* The step loops' parts at 3 and 4 threads: bounds strictly increasing from 0 to B, every
 * row in one part, each part within one sequence's rows of an equal share; a batch of fewer
 * sequences than threads gets one part per sequence. */
static void parts_about_equal(void **state)
{
    (void)state;
    mt__rnn_shape_t sh = two_threads();
    const int bs[10] = {9, 9, 8, 7, 6, 5, 4, 3, 2, 1}; /* lengths 10, 9, ..., 2 */
    mt_rnn_io_t io = {.seq_len = 10, .batch = 9, .batch_sizes = bs, .tokens = 54};
    mt__rnn_seq_t q;
    assert_int_equal(mt__rnn_seq_init(&q, &io), 0);
    for (int threads = 3; threads <= 8; threads++) {
        sh.threads = threads;
        int bound[MT__RNN_PARTS_MAX + 1];
        double w[MT__RNN_PARTS_MAX], sum = 0;
        int np = mt__rnn_cpu_parts(&sh, &q, 0, 10, 0.5, bound, w);
        assert_int_equal(np, threads);
        assert_int_equal(bound[0], 0);
        assert_int_equal(bound[np], 9);
        for (int i = 0; i < np; i++) {
            assert_true(bound[i] < bound[i + 1]);
            assert_true(w[i] <= 54.0 / np + 10.0); /* the longest sequence has 10 rows */
            sum += w[i];
        }
        assert_true(sum == 54.0);
    }
    mt__rnn_seq_fini(&q);
    io = (mt_rnn_io_t){.seq_len = 2, .batch = 3};
    assert_int_equal(mt__rnn_seq_init(&q, &io), 0);
    sh.threads = 4;
    int bound[MT__RNN_PARTS_MAX + 1];
    double w[MT__RNN_PARTS_MAX];
    assert_int_equal(mt__rnn_cpu_parts(&sh, &q, 0, 2, 0.5, bound, w), 3);
    for (int i = 0; i <= 3; i++)
        assert_int_equal(bound[i], i);
    mt__rnn_seq_fini(&q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cblas_halves),         cmocka_unit_test(blis_halves),
        cmocka_unit_test(dnnl_halves),          cmocka_unit_test(worker_persists),
        cmocka_unit_test(two_callers),          cmocka_unit_test(sgemm_halves),
        cmocka_unit_test(tiles_taken_in_turn),  cmocka_unit_test(xsmm_tiles_match),
        cmocka_unit_test(share_follows_speeds), cmocka_unit_test(share_learning),
        cmocka_unit_test(split_nearest_share),  cmocka_unit_test(four_parts),
        cmocka_unit_test(parts_about_equal),    cmocka_unit_test(sgemm_half_matches_par),
    };
    return MT_TEST_RUN(tests, make_par, free_par);
}
