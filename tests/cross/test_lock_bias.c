/* The allocator's biased lock (allocator/lock.h), on any ISA and under qemu-aarch64:
 * - a bias is won by a run of takes and lost to another thread's take;
 * - mutual exclusion while the bias moves: two threads keep a two-word record consistent
 *   under the lock, one taking it by its bias, the other through mu now and then, so the
 *   bias is revoked and won again many times;
 * - a wait from a biased hold returns holding mu;
 * - the public paths: two threads on the global path (sizes that no cache repeats) with a
 *   third reading the statistics, the counters exact at the end. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/test_main.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <time.h>

#include "alloc/helpers.h"
#include "allocator/tcache_impl.h"
#include "tests/cross/litmus.h"
#include "util/cpu.h"

/* ---- litmus: SB on the bias ---- */

typedef struct litmus_s {
    mt_alloc_t *a;
    _Alignas(64) mt__tc_gate_t g;
    _Alignas(64) atomic_uint sync; /* two-thread barrier: arrivals so far */
    _Alignas(64) atomic_int stop;
    bool real;                    /* the revoker's drop with membarrier, else a plain store */
    uint8_t saw_busy[LITMUS_MAX]; /* revoker: lkbusy read right after dropping the bias */
    uint8_t entered[LITMUS_MAX];  /* owner: it holds the lock by the bias */
    unsigned rounds;
} litmus_t;

static void *litmus_owner(void *arg)
{
    litmus_t *l = arg;
    unsigned phase = 0;
    uint32_t seed = 0x1234567u;
    for (unsigned i = 0;; i++) {
        litmus_meet(&l->sync, &phase); /* the bias is the owner's */
        if (atomic_load(&l->stop))
            return NULL;
        litmus_jitter(&seed, true);
        bool in = mt__alloc_bias_enter(l->a, &l->g);
        l->entered[i] = in;
        litmus_meet(&l->sync, &phase); /* the revoker has read lkbusy */
        if (in)
            __atomic_store_n(&l->g.lkbusy, 0, __ATOMIC_RELEASE);
        litmus_meet(&l->sync, &phase);
    }
}

static void litmus_run(litmus_t *l)
{
    pthread_t th;
    atomic_init(&l->sync, 0);
    atomic_init(&l->stop, 0);
    memset(&l->g, 0, sizeof l->g);
    __atomic_store_n(&l->a->bias, &l->g, __ATOMIC_RELAXED);
    assert_int_equal(pthread_create(&th, NULL, litmus_owner, l), 0);
    unsigned phase = 0;
    uint32_t seed = 0x89abcdefu;
    uint64_t t0 = litmus_now_ns();
    unsigned i;
    for (i = 0; litmus_more(i, t0); i++) {
        litmus_meet(&l->sync, &phase);
        litmus_jitter(&seed, false);
        if (l->real) {
            mt__alloc_bias_drop(l->a);
        } else { /* the same without the barrier: what a compiler barrier alone gives */
            __atomic_store_n(&l->a->bias, NULL, __ATOMIC_RELAXED);
            __atomic_signal_fence(__ATOMIC_SEQ_CST);
        }
        l->saw_busy[i] = __atomic_load_n(&l->g.lkbusy, __ATOMIC_ACQUIRE);
        litmus_meet(&l->sync, &phase);
        __atomic_store_n(&l->a->bias, &l->g, __ATOMIC_RELAXED); /* the next round's bias */
        litmus_meet(&l->sync, &phase);
    }
    atomic_store(&l->stop, 1);
    litmus_meet(&l->sync, &phase);
    pthread_join(th, NULL);
    __atomic_store_n(&l->a->bias, NULL, __ATOMIC_RELAXED);
    l->rounds = i;
}

static unsigned forbidden(const litmus_t *l)
{
    return litmus_forbidden(l->entered, l->saw_busy, l->rounds);
}

static void test_bias_litmus_sb(void **state)
{
    (void)state;
    if (!mt__tc_gate_asym())
        skip(); /* no membarrier: the lock is never biased */
    mt_backend_t *b = sim_backend(64 * MIB);
    litmus_t *l = calloc(1, sizeof *l);
    assert_non_null(l);
    l->a = make_alloc_default(b, NULL, NULL);
    l->real = false;
    litmus_run(l);
    unsigned control = forbidden(l), control_rounds = l->rounds;
    l->real = true;
    litmus_run(l);
    unsigned bad = forbidden(l), owner_in = 0;
    for (unsigned i = 0; i < l->rounds; i++)
        owner_in += l->entered[i];
    print_message("bias SB litmus: without membarrier %u forbidden of %u rounds; with it %u of "
                  "%u (owner entered in %u)\n",
                  control, control_rounds, bad, l->rounds, owner_in);
    assert_true(l->rounds >= LITMUS_MIN);
    assert_int_equal(bad, 0);
    mt_alloc_destroy(&l->a);
    free(l);
    mt_backend_destroy(&b);
}

/* The calling thread's cache for a, made by a global malloc and free (the gate a bias
 * names: the checker requires a live cache's). */
static mt__tc_gate_t *my_gate(mt_alloc_t *a)
{
    void *p = NULL;
    assert_int_equal(mt_alloc_malloc(a, 4096, NULL, 0, &p), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    mt__tcache_t *c = mt__tc_find(a);
    assert_non_null(c);
    return &c->gate;
}

static void *take_once(void *arg)
{
    mt_alloc_t *a = arg;
    mt__alloc_lock(a);
    mt__alloc_unlock(a);
    return NULL;
}

static void test_bias_won_and_lost(void **state)
{
    (void)state;
    if (!mt__tc_gate_asym())
        skip(); /* no membarrier: the lock is never biased */
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    mt__tc_gate_t *mine = my_gate(a);
    uint32_t level = a->bias_level;
    int n = 0;
    for (; n < 100000 && !mt__alloc_biased_to(a, mine); n++) {
        mt__alloc_lock_by(a, mine);
        assert_null(a->lk_gate); /* taken through mu until the run is long enough */
        mt__alloc_unlock(a);
    }
    assert_true(n >= 1 && n <= MT__BIAS_RUN << level); /* the malloc's takes began the run */
    mt__alloc_lock_by(a, mine);
    assert_ptr_equal(a->lk_gate, mine);
    assert_int_equal(mine->lkbusy, 1);
    assert_null(mt__alloc_lock_check(a));
    mt__alloc_unlock(a);
    assert_int_equal(mine->lkbusy, 0);
    /* The owner's own take through mu keeps its bias. */
    mt__alloc_lock(a);
    assert_null(a->lk_gate);
    assert_ptr_equal(a->bias, mine);
    mt__alloc_unlock(a);
    /* Another thread's take revokes it. */
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, take_once, a), 0);
    pthread_join(th, NULL);
    assert_null(a->bias);
    assert_int_equal(a->bias_level, level + 1); /* it served fewer than MT__BIAS_SERVED takes */
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* lock_bias:0: the lock is never biased, however long the run; the key is refused at run
 * time; a bad value is named. */
static void test_bias_off(void **state)
{
    (void)state;
    mt_alloc_cfg_t cfg = mt_alloc_cfg_default();
    char err[256];
    assert_true(cfg.lock_bias);
    assert_int_equal(mt_alloc_cfg_parse(&cfg, "lock_bias:maybe", err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "lock_bias"));
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc_default(b, "lock_bias:0", NULL);
    mt__tc_gate_t *mine = my_gate(a);
    for (int n = 0; n < 100000; n++) {
        mt__alloc_lock_by(a, mine);
        assert_null(a->lk_gate);
        mt__alloc_unlock(a);
    }
    assert_null(a->bias);
    assert_int_equal(mt_alloc_set_settings(a, "lock_bias:1", err, sizeof err), MT_ENOTSUP);
    assert_non_null(strstr(err, "lock_bias"));
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_wait_from_biased_hold(void **state)
{
    (void)state;
    if (!mt__tc_gate_asym())
        skip();
    mt_backend_t *b = sim_backend(64 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    mt__tc_gate_t *mine = my_gate(a);
    while (!mt__alloc_biased_to(a, mine)) {
        mt__alloc_lock_by(a, mine);
        mt__alloc_unlock(a);
    }
    mt__alloc_lock_by(a, mine);
    assert_ptr_equal(a->lk_gate, mine);
    mt__alloc_wait(a); /* returns at once, holding mu, its bias kept */
    assert_null(a->lk_gate);
    assert_int_equal(mine->lkbusy, 0);
    assert_ptr_equal(a->bias, mine);
    assert_int_equal(pthread_mutex_trylock(&a->mu), EBUSY);
    mt__alloc_unlock(a);
    mt__alloc_lock_by(a, mine); /* and the next take is by the bias again */
    assert_ptr_equal(a->lk_gate, mine);
    mt__alloc_unlock(a);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* ---- exclusion while the bias moves ---- */

/* The other thread waits for the owner to win a bias, then revokes it: after a few of the
 * owner's biased takes in odd rounds (the next bias harder to win), after more than
 * MT__BIAS_SERVED in even ones (easier). So the bias is won and lost EXCL_ROUNDS times
 * whatever the host's speed. Without an asymmetric barrier (qemu, TSan) there is no bias,
 * and the other thread takes mu EXCL_ROUNDS times, one per gap. */
#define EXCL_ROUNDS 200
#define EXCL_GAP_NS (200ull * 1000ull)
#define EXCL_CAP_NS (60ull * 1000000000ull) /* a round that never comes fails, not hangs */

typedef struct excl_s {
    mt_alloc_t *a;
    uint64_t x, y;                /* x = y outside the lock; written under it, not atomic */
    uint64_t torn;                /* takes that found x != y */
    uint64_t takes;               /* the owner's takes */
    uint64_t other, revoked;      /* the other thread's takes, those that found a bias */
    _Alignas(64) uint64_t biased; /* the owner's takes by its bias (atomic, read by both) */
    _Alignas(64) atomic_int stop; /* the other thread is done */
} excl_t;

static void step(excl_t *e)
{
    if (e->x != e->y)
        e->torn++;
    e->x++;
    for (int k = 0; k < 4; k++)
        mt__cpu_relax();
    e->y++;
}

static void *owner_main(void *arg)
{
    excl_t *e = arg;
    mt__tc_gate_t *mine = my_gate(e->a);
    while (!atomic_load(&e->stop)) {
        for (int i = 0; i < 64; i++) {
            mt__alloc_lock_by(e->a, mine);
            if (e->a->lk_gate != NULL)
                __atomic_fetch_add(&e->biased, 1, __ATOMIC_RELAXED);
            step(e);
            mt__alloc_unlock(e->a);
        }
        e->takes += 64;
    }
    return NULL;
}

/* Spins until the owner holds a bias and has taken the lock by it more than n times since
 * base; false past the cap. */
static bool wait_biased(excl_t *e, uint64_t base, uint64_t n, uint64_t t0)
{
    while (__atomic_load_n(&e->a->bias, __ATOMIC_RELAXED) == NULL ||
           __atomic_load_n(&e->biased, __ATOMIC_RELAXED) - base <= n) {
        if (litmus_now_ns() - t0 > EXCL_CAP_NS)
            return false;
        mt__cpu_relax();
    }
    return true;
}

static void test_exclusion_while_bias_moves(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(64 * MIB);
    static excl_t e;
    e = (excl_t){.a = make_alloc_default(b, NULL, NULL)};
    bool asym = mt__tc_gate_asym();
    uint32_t seed = 0x9e3779b9u;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, owner_main, &e), 0);
    uint64_t t0 = litmus_now_ns();
    bool late = false;
    for (unsigned r = 0; r < EXCL_ROUNDS && !late; r++) {
        if (asym) {
            uint64_t base = __atomic_load_n(&e.biased, __ATOMIC_RELAXED);
            uint64_t n = r % 2 ? litmus_rng(&seed) % 8 : MT__BIAS_SERVED + litmus_rng(&seed) % 256;
            late = !wait_biased(&e, base, n, t0);
        } else {
            uint64_t t = litmus_now_ns();
            while (litmus_now_ns() - t < EXCL_GAP_NS)
                mt__cpu_relax();
        }
        bool was = __atomic_load_n(&e.a->bias, __ATOMIC_RELAXED) != NULL;
        mt__alloc_lock(e.a);
        e.revoked += was && e.a->bias == NULL;
        step(&e);
        e.other++;
        mt__alloc_unlock(e.a);
    }
    atomic_store(&e.stop, 1);
    pthread_join(th, NULL);
    print_message("owner %llu takes (%llu by the bias), other %llu (%llu revoked a bias), %.2f s\n",
                  (unsigned long long)e.takes, (unsigned long long)e.biased,
                  (unsigned long long)e.other, (unsigned long long)e.revoked,
                  (double)(litmus_now_ns() - t0) / 1e9);
    assert_false(late);
    assert_int_equal(e.torn, 0);
    assert_int_equal(e.x, e.takes + e.other);
    assert_int_equal(e.y, e.x);
    assert_int_equal(e.other, EXCL_ROUNDS);
    if (asym) {
        /* Every round found a bias and revoked it; the owner took by each (even rounds) more
         * than MT__BIAS_SERVED times. */
        assert_int_equal(e.revoked, EXCL_ROUNDS);
        assert_true(e.biased > (EXCL_ROUNDS / 2) * MT__BIAS_SERVED);
    } else {
        assert_int_equal(e.revoked, 0);
        assert_int_equal(e.biased, 0);
    }
    mt_alloc_destroy(&e.a);
    mt_backend_destroy(&b);
}

/* ---- the public paths ---- */

#define PUB_THREADS 2
#define PUB_OPS     200000

typedef struct pub_s {
    mt_alloc_t *a;
    mt_stream_t *s;
    uint32_t seed;
    uint64_t clobbered;
} pub_t;

/* Global-path mallocs and frees of sizes that vary (no cache repeats them), 8 live at a
 * time, each block stamped and checked before its free. */
static void *pub_main(void *arg)
{
    pub_t *w = arg;
    void *live[8] = {0};
    uint64_t stamp[8] = {0};
    for (uint32_t i = 0; i < PUB_OPS; i++) {
        int k = (int)(i % 8);
        if (live[k] != NULL) {
            if (*(uint64_t *)live[k] != stamp[k])
                w->clobbered++;
            assert_int_equal(mt_alloc_free(w->a, live[k]), 0);
        }
        w->seed = w->seed * 1103515245u + 12345u;
        size_t size = 512 + (w->seed >> 8) % (64 * 1024);
        assert_int_equal(mt_alloc_malloc(w->a, size, w->s, 0, &live[k]), 0);
        stamp[k] = (uint64_t)(uintptr_t)w << 20 ^ i;
        *(uint64_t *)live[k] = stamp[k];
    }
    for (int k = 0; k < 8; k++)
        assert_int_equal(mt_alloc_free(w->a, live[k]), 0);
    return NULL;
}

static void test_public_paths_two_threads(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(512 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    pub_t w[PUB_THREADS];
    pthread_t th[PUB_THREADS];
    for (int i = 0; i < PUB_THREADS; i++) {
        w[i] = (pub_t){.a = a, .seed = (uint32_t)i * 7919u + 1u};
        assert_int_equal(mt_stream_create(b, &w[i].s), 0);
        assert_int_equal(pthread_create(&th[i], NULL, pub_main, &w[i]), 0);
    }
    int reads = 0;
    for (; reads < 200; reads++) { /* a reader that takes the lock now and then */
        mt_alloc_stats_t st = stats_of(a);
        assert_true(st.allocation[MT_STAT_ALL].current <= 8 * PUB_THREADS);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < PUB_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].clobbered, 0);
    }
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_stats_t st = stats_of(a);
    assert_int_equal(st.allocation[MT_STAT_ALL].allocated, (uint64_t)PUB_THREADS * PUB_OPS);
    assert_int_equal(st.allocation[MT_STAT_ALL].current, 0);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 0);
    for (int i = 0; i < PUB_THREADS; i++)
        mt_stream_destroy(b, &w[i].s);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bias_litmus_sb),
        cmocka_unit_test(test_bias_won_and_lost),
        cmocka_unit_test(test_bias_off),
        cmocka_unit_test(test_wait_from_biased_hold),
        cmocka_unit_test(test_exclusion_while_bias_moves),
        cmocka_unit_test(test_public_paths_two_threads),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
