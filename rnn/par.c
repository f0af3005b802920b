/* The cpu path's threads (docs/rnn-cpu.md, Threads). mt__rnn_parts_par runs the first part
 * of a job on the caller and the others on the module's workers; mt__rnn_tiles_par lets every
 * part take fixed tiles of a job in turn; mt__rnn_even_par and mt__rnn_sgemm_par cut a job or
 * a large product into equal parts.
 *
 * The workers belong to the module (mt__rnn_par_create when mt_rnn_set_gemm_threads asks
 * for two or more threads, joined by mt__rnn_par_destroy from mt_rnn_destroy): the library
 * starts no thread of its own accord and leaves none behind. A thread started per job starts
 * late on an idle vCPU and the caller waits for it at every join, so a worker spins for a
 * while after each job, so that the pass's next job starts at once, then sleeps on a
 * condition variable.
 *
 * The workers serve one caller at a time (`own`). A second caller, a job posted from inside
 * a job, a shape with too few workers, or a forked child (the workers are not in it: the pid
 * differs) gets threads of its own for the other parts. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "rnn/internal.h"
#include "util/assert.h"
#include "util/cpu.h"

/* How long a worker spins for its next job before it sleeps, and how long the caller spins
 * for a worker's part before it yields its core. */
enum { WORKER_SPIN_NS = 300 * 1000, CALLER_SPIN_NS = 200 * 1000 };

typedef struct job_s {
    const mt__rnn_gemm_t *g;
    void (*fn)(void *, int, int);
    void *arg;
    int b0, b1;
} job_t;

/* One worker thread.
 * Invariants: done <= posted <= done + 1 (sequence numbers, modulo 2^32); the worker reads
 * job only while posted != done, and the caller, holding the pool's own, writes it only
 * while posted == done. sleeping is true only while the worker waits on cv (holding mu when
 * it changes). quit is set, under own, only by mt__rnn_par_destroy, with one more post. */
typedef struct worker_s {
    pthread_mutex_t mu; /* with cv: the worker's sleep */
    pthread_cond_t cv;
    atomic_uint posted, done;
    atomic_bool sleeping;
    atomic_bool quit;
    job_t job;
    uint64_t took;    /* ns of the worker's last part, written before done */
    pthread_t thread; /* joined by mt__rnn_par_destroy */
} worker_t;

/* Invariants: 1 <= n <= MT__RNN_PARTS_MAX - 1, w[0 .. n) started; own is held by the caller
 * whose job parts the workers run. */
struct mt__rnn_par_s {
    pthread_mutex_t own;
    int n;     /* workers */
    pid_t pid; /* the process the workers run in */
    worker_t w[MT__RNN_PARTS_MAX - 1];
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spins while *v == old, for at most budget_ns; true if it changed. */
static bool spin_while(atomic_uint *v, unsigned old, uint64_t budget_ns)
{
    uint64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(v, memory_order_acquire) != old)
            return true;
        mt__cpu_relax();
        if ((i & 63) == 63) {
            uint64_t t = now_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > budget_ns)
                return false;
        }
    }
}

/* A job's part off the caller: oneDNN's thread count is per thread, so it is set here. */
static void run_job(const job_t *j)
{
    (void)mt__rnn_gemm_set_threads_here(j->g, 1);
    j->fn(j->arg, j->b0, j->b1);
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    unsigned seen = 0;
    for (;;) {
        if (!spin_while(&w->posted, seen, WORKER_SPIN_NS)) {
            pthread_mutex_lock(&w->mu);
            /* sleeping, then posted; the caller stores posted, then reads sleeping (both
             * sequentially consistent): one of the two sees the other's store. */
            atomic_store(&w->sleeping, true);
            while (atomic_load(&w->posted) == seen)
                pthread_cond_wait(&w->cv, &w->mu);
            atomic_store(&w->sleeping, false);
            pthread_mutex_unlock(&w->mu);
        }
        seen = atomic_load_explicit(&w->posted, memory_order_acquire);
        mt_assert(seen == atomic_load(&w->done) + 1);
        if (atomic_load(&w->quit))
            break;
        job_t j = w->job;
        uint64_t t0 = now_ns();
        run_job(&j);
        w->took = now_ns() - t0;
        atomic_store_explicit(&w->done, seen, memory_order_release);
    }
    return NULL;
}

/* Wakes the worker for the post just made. */
static void wake(worker_t *w)
{
    if (atomic_load(&w->sleeping)) {
        pthread_mutex_lock(&w->mu);
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
}

/* Starts worker w (its mutex, condition variable and thread): 0 or MT_EAGAIN. */
static int worker_start(worker_t *w)
{
    if (pthread_mutex_init(&w->mu, NULL) != 0)
        goto fail_mu;
    if (pthread_cond_init(&w->cv, NULL) != 0)
        goto fail_cv;
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0)
        goto fail_thread;
    return 0;

fail_thread:
    pthread_cond_destroy(&w->cv);
fail_cv:
    pthread_mutex_destroy(&w->mu);
fail_mu:
    return MT_EAGAIN;
}

/* Stops and joins worker w (the caller holds own). */
static void worker_stop(worker_t *w)
{
    atomic_store(&w->quit, true);
    atomic_store(&w->posted, atomic_load(&w->posted) + 1);
    wake(w);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

int mt__rnn_par_create(mt__rnn_par_t **out, int workers)
{
    if (workers < 1 || workers > MT__RNN_PARTS_MAX - 1)
        return MT_EINVAL;
    mt__rnn_par_t *p = calloc(1, sizeof *p);
    if (!p)
        return MT_ENOMEM;
    if (pthread_mutex_init(&p->own, NULL) != 0)
        goto fail_own;
    p->pid = getpid();
    for (; p->n < workers; p->n++)
        if (worker_start(&p->w[p->n]) != 0)
            goto fail_workers;
    *out = p;
    return 0;

fail_workers:
    pthread_mutex_lock(&p->own);
    for (int i = 0; i < p->n; i++)
        worker_stop(&p->w[i]);
    pthread_mutex_unlock(&p->own);
    pthread_mutex_destroy(&p->own);
fail_own:
    free(p);
    return MT_EAGAIN;
}

int mt__rnn_par_workers(const mt__rnn_par_t *p)
{
    return p ? p->n : 0;
}

void mt__rnn_par_destroy(mt__rnn_par_t **pp)
{
    if (!pp || !*pp)
        return;
    mt__rnn_par_t *p = *pp;
    *pp = NULL;
    /* In a forked child the workers do not exist (and own may have been held by a thread
     * that is not there either): only the memory is ours to free. */
    if (p->pid == getpid()) {
        pthread_mutex_lock(&p->own);
        for (int i = 0; i < p->n; i++)
            worker_stop(&p->w[i]);
        pthread_mutex_unlock(&p->own);
        pthread_mutex_destroy(&p->own);
    }
    free(p);
}

/* The workers of s for this caller (own taken), or NULL: none, fewer than need, another
 * caller's, or not in this process. */
static mt__rnn_par_t *take_workers(const mt__rnn_shape_t *s, int need)
{
    mt__rnn_par_t *p = s->par;
    if (!p || p->n < need || p->pid != getpid() || pthread_mutex_trylock(&p->own) != 0)
        return NULL;
    return p;
}

/* The caller's wait for a worker's part: spin, then yield its core (the worker may share
 * it with other work). */
static void wait_done(worker_t *w, unsigned seq)
{
    if (spin_while(&w->done, seq - 1, CALLER_SPIN_NS))
        return;
    while (atomic_load_explicit(&w->done, memory_order_acquire) != seq)
        sched_yield();
}

static void *spawned_main(void *p)
{
    run_job(p);
    return NULL;
}

/* Parts 1 .. np-1 on threads of their own and part 0 on the caller; a part whose thread
 * cannot start runs on the caller after it (the same rows in the same order: the same
 * results, on one thread). */
static void run_spawned(const job_t *j, int np)
{
    pthread_t t[MT__RNN_PARTS_MAX];
    bool started[MT__RNN_PARTS_MAX] = {false};
    for (int i = 1; i < np; i++)
        started[i] = pthread_create(&t[i], NULL, spawned_main, (void *)&j[i]) == 0;
    j[0].fn(j[0].arg, j[0].b0, j[0].b1);
    for (int i = 1; i < np; i++) {
        if (started[i])
            pthread_join(t[i], NULL);
        else
            j[i].fn(j[i].arg, j[i].b0, j[i].b1);
    }
}

/* ---- the caller's share ----
 *
 * A host may run two vCPUs at different speeds for stretches of seconds. A two-part job whose
 * parts' work is known gives both threads' speeds; the share the caller should take for the
 * parts to end together follows them (an average over
 * jobs, each weighing 1/4, kept in [1/5, 4/5]), in 1/65536. The bounds are kept in those
 * units, so that the share read back is never outside them. */
enum { SHARE_ONE = 65536, SHARE_MIN = (SHARE_ONE + 4) / 5, SHARE_MAX = SHARE_ONE - SHARE_MIN };
static atomic_uint share = SHARE_ONE / 2;
static atomic_bool share_frozen;

double mt__rnn_par_share(void)
{
    return (double)atomic_load_explicit(&share, memory_order_relaxed) / SHARE_ONE;
}

void mt__rnn_par_set_share(double f, bool freeze)
{
    f = f < 0.0 ? 0.0 : f > 1.0 ? 1.0 : f;
    atomic_store(&share, (unsigned)lround(f * SHARE_ONE));
    atomic_store(&share_frozen, freeze);
}

void mt__rnn_par_learn(double w0, double w1, uint64_t tc, uint64_t tw)
{
    if (atomic_load(&share_frozen) || w0 <= 0 || w1 <= 0 || tc + tw < 200 * 1000 || !tc || !tw)
        return; /* short jobs are mostly noise */
    double vc = w0 / (double)tc, vw = w1 / (double)tw, f = vc / (vc + vw);
    double next = 0.75 * mt__rnn_par_share() + 0.25 * f;
    long u = lround(next * SHARE_ONE);
    u = u < SHARE_MIN ? SHARE_MIN : u > SHARE_MAX ? SHARE_MAX : u;
    atomic_store_explicit(&share, (unsigned)u, memory_order_relaxed);
}

int mt__rnn_par_parts(const mt__rnn_shape_t *s)
{
    return s->threads < 2 ? 1 : s->threads < MT__RNN_PARTS_MAX ? s->threads : MT__RNN_PARTS_MAX;
}

void mt__rnn_parts_par(const mt__rnn_shape_t *s, const int *bound, int np, const double *work,
                       void (*fn)(void *, int, int), void *arg)
{
    const mt__rnn_gemm_t *g = s->gemm;
    mt_assert(np >= 1 && np <= MT__RNN_PARTS_MAX);
    job_t j[MT__RNN_PARTS_MAX];
    int n = 0;
    for (int i = 0; i < np; i++) {
        mt_assert(bound[i] <= bound[i + 1]);
        if (bound[i] < bound[i + 1])
            j[n++] = (job_t){g, fn, arg, bound[i], bound[i + 1]};
    }
    if (s->threads < 2 || n < 2 || !mt__rnn_gemm_halves(g)) {
        fn(arg, bound[0], bound[np]);
        return;
    }
    /* BLIS and OpenBLAS take single-threaded calls from several threads at once; their count
     * is process-wide, so it goes back up only once every part is done. */
    (void)mt__rnn_gemm_set_threads(g, 1);
    mt__rnn_par_t *p = take_workers(s, n - 1);
    if (!p) {
        run_spawned(j, n);
    } else {
        unsigned seq[MT__RNN_PARTS_MAX];
        for (int i = 1; i < n; i++) {
            worker_t *w = &p->w[i - 1];
            mt_assert(atomic_load(&w->posted) == atomic_load(&w->done));
            w->job = j[i];
            seq[i] = atomic_load(&w->posted) + 1;
            atomic_store(&w->posted, seq[i]);
            wake(w);
        }
        uint64_t t0 = now_ns();
        fn(arg, j[0].b0, j[0].b1);
        uint64_t tc = now_ns() - t0;
        for (int i = 1; i < n; i++)
            wait_done(&p->w[i - 1], seq[i]);
        /* The share is the caller's against one worker's (docs/rnn-cpu.md, Threads). */
        if (work && np == 2 && n == 2)
            mt__rnn_par_learn(work[0], work[1], tc, p->w[0].took);
        pthread_mutex_unlock(&p->own);
    }
    (void)mt__rnn_gemm_set_threads(g, s->threads);
}

void mt__rnn_even_par(const mt__rnn_shape_t *s, int n, void (*fn)(void *, int, int), void *arg)
{
    int np = mt__rnn_par_parts(s), bound[MT__RNN_PARTS_MAX + 1];
    np = n < np ? (n > 1 ? n : 1) : np;
    for (int i = 0; i <= np; i++)
        bound[i] = (int)((long long)i * n / np);
    mt__rnn_parts_par(s, bound, np, NULL, fn, arg);
}

void mt__rnn_rows_par(const mt__rnn_shape_t *s, int split, int nb, void (*fn)(void *, int, int),
                      void *arg)
{
    const int bound[3] = {0, split < 0 ? 0 : split > nb ? nb : split, nb};
    mt__rnn_parts_par(s, bound, 2, NULL, fn, arg);
}

void mt__rnn_rows_par_w(const mt__rnn_shape_t *s, int split, int nb, double w0, double w1,
                        void (*fn)(void *, int, int), void *arg)
{
    const int bound[3] = {0, split < 0 ? 0 : split > nb ? nb : split, nb};
    const double work[2] = {w0, w1};
    mt__rnn_parts_par(s, bound, 2, work, fn, arg);
}

/* ---- tiles taken in turn ---- */

typedef struct tiles_s {
    void (*fn)(void *, int);
    void *arg;
    int n;
    atomic_int next; /* the next tile not yet taken */
} tiles_t;

/* One thread's share: the next tile until none is left. */
static void take_tiles(void *arg, int unused0, int unused1)
{
    (void)unused0, (void)unused1;
    tiles_t *t = arg;
    for (int i; (i = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed)) < t->n;)
        t->fn(t->arg, i);
}

void mt__rnn_tiles_par(const mt__rnn_shape_t *s, int n, void (*fn)(void *, int), void *arg)
{
    if (n <= 0)
        return;
    tiles_t t = {.fn = fn, .arg = arg, .n = n};
    atomic_init(&t.next, 0);
    /* Every part runs take_tiles; at one thread the caller's takes them all. */
    int np = mt__rnn_par_parts(s), bound[MT__RNN_PARTS_MAX + 1];
    np = n < np ? n : np;
    for (int i = 0; i <= np; i++)
        bound[i] = i;
    mt__rnn_parts_par(s, bound, np, NULL, take_tiles, &t);
    mt_assert(atomic_load(&t.next) >= n);
}

/* ---- a product in parts ---- */

typedef struct gpart_s {
    const mt__rnn_gemm_t *g;
    bool ta, tb, rows; /* rows: C split by rows, else by columns */
    int M, N, K;
    float alpha, beta;
    const float *A, *B;
    int lda, ldb, ldc;
    float *C;
} gpart_t;

/* Blocks [i0, i1) of 32 rows (or columns) of C. */
static void gemm_part(void *arg, int i0, int i1)
{
    const gpart_t *p = arg;
    int n = p->rows ? p->M : p->N, a = i0 * 32, e = i1 * 32 < n ? i1 * 32 : n;
    if (p->rows) {
        const float *A = p->ta ? p->A + a : p->A + (size_t)a * p->lda;
        mt__rnn_sgemm(p->g, p->ta, p->tb, e - a, p->N, p->K, p->alpha, A, p->lda, p->B, p->ldb,
                      p->beta, p->C + (size_t)a * p->ldc, p->ldc);
    } else {
        const float *B = p->tb ? p->B + (size_t)a * p->ldb : p->B + a;
        mt__rnn_sgemm(p->g, p->ta, p->tb, p->M, e - a, p->K, p->alpha, p->A, p->lda, B, p->ldb,
                      p->beta, p->C + a, p->ldc);
    }
}

/* The product as 32-row (or column) blocks, split by rows when M >= N; its block count. */
static int gemm_blocks(gpart_t *p, const mt__rnn_shape_t *s, bool ta, bool tb, int M, int N, int K,
                       float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                       float *C, int ldc)
{
    bool rows = M >= N;
    *p = (gpart_t){s->gemm, ta, tb, rows, M, N, K, alpha, beta, A, B, lda, ldb, ldc, C};
    return ((rows ? M : N) + 31) / 32;
}

void mt__rnn_sgemm_half(const mt__rnn_shape_t *s, int half, bool ta, bool tb, int M, int N, int K,
                        float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                        float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    gpart_t p;
    int nb = gemm_blocks(&p, s, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    int b0 = half ? nb / 2 : 0, b1 = half ? nb : nb / 2;
    if (b0 < b1)
        gemm_part(&p, b0, b1);
}

void mt__rnn_sgemm_par(const mt__rnn_shape_t *s, bool ta, bool tb, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C,
                       int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    gpart_t p;
    int nb = gemm_blocks(&p, s, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    mt__rnn_even_par(s, nb, gemm_part, &p);
}
