/* The thread caches' exclusion (allocator/tcache_gate.h), on any ISA and under qemu-aarch64:
 * - a litmus test of the asymmetric Dekker itself, store buffering (SB) on busy/claim, run
 *   on the gate's own code: the owner may never run its fast path (it read claim = 0)
 *   while the claimer read busy = 0. The same shape without membarrier is run beside it
 *   and its forbidden outcomes counted, to show the harness can see SB where it happens;
 * - the allocator's fast paths under a thread that keeps claiming and flushing their caches:
 *   no block is ever in two threads' hands, and the counters stay exact.
 * qemu-user runs guest threads as host threads: on an x86 host its TCG gives x86-TSO order
 * plus store buffering, not the arm64 model's weaker one, so these runs are evidence for the
 * SB case (the one this protocol is about) and for the build, not for every arm64
 * reordering; the rest rests on the review in tcache_gate.h. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/test_main.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc/helpers.h"
#include "allocator/tcache.h"
#include "allocator/tcache_gate.h"
#include "tests/cross/litmus.h"
#include "util/cpu.h"

/* ---- litmus: SB on the gate ---- */

typedef struct litmus_s {
    _Alignas(64) mt__tc_gate_t g;
    _Alignas(64) atomic_uint sync; /* two-thread barrier: arrivals so far */
    _Alignas(64) atomic_int stop;
    bool real;                    /* the gate's announce (membarrier), else a plain store */
    uint8_t saw_busy[LITMUS_MAX]; /* claimer: busy read right after announcing */
    uint8_t entered[LITMUS_MAX];  /* owner: the gate let it in */
    unsigned rounds;
} litmus_t;

static void *litmus_owner(void *arg)
{
    litmus_t *l = arg;
    unsigned phase = 0;
    uint32_t seed = 0x1234567u;
    for (unsigned i = 0;; i++) {
        litmus_meet(&l->sync, &phase);
        if (atomic_load(&l->stop))
            return NULL;
        litmus_jitter(&seed, true);
        bool in = mt__tc_gate_enter(&l->g, true);
        l->entered[i] = in;
        litmus_meet(&l->sync, &phase); /* the claimer has read busy */
        if (in)
            mt__tc_gate_exit(&l->g, true);
        litmus_meet(&l->sync, &phase); /* the claimer has unclaimed */
    }
}

static void litmus_run(litmus_t *l)
{
    pthread_t th;
    atomic_init(&l->sync, 0);
    atomic_init(&l->stop, 0);
    memset(&l->g, 0, sizeof l->g);
    assert_int_equal(pthread_create(&th, NULL, litmus_owner, l), 0);
    unsigned phase = 0;
    uint32_t seed = 0x89abcdefu;
    uint64_t t0 = litmus_now_ns();
    unsigned i;
    for (i = 0; litmus_more(i, t0); i++) {
        litmus_meet(&l->sync, &phase);
        litmus_jitter(&seed, false);
        if (l->real) {
            mt__tc_gate_announce(&l->g);
        } else { /* the same without the barrier: what a compiler barrier alone gives */
            __atomic_store_n(&l->g.claim, 1, __ATOMIC_RELAXED);
            __atomic_signal_fence(__ATOMIC_SEQ_CST);
        }
        l->saw_busy[i] = __atomic_load_n(&l->g.busy, __ATOMIC_ACQUIRE);
        litmus_meet(&l->sync, &phase);
        mt__tc_gate_unclaim(&l->g, true);
        litmus_meet(&l->sync, &phase);
    }
    atomic_store(&l->stop, 1);
    litmus_meet(&l->sync, &phase);
    pthread_join(th, NULL);
    l->rounds = i;
}

static unsigned forbidden(const litmus_t *l)
{
    return litmus_forbidden(l->entered, l->saw_busy, l->rounds);
}

static void test_gate_litmus_sb(void **state)
{
    (void)state;
    if (!mt__tc_gate_asym())
        skip(); /* no membarrier: the gate is a test-and-set lock, no Dekker to test */
    litmus_t *l = calloc(1, sizeof *l);
    assert_non_null(l);
    l->real = false;
    litmus_run(l);
    unsigned control = forbidden(l), control_rounds = l->rounds;
    l->real = true;
    litmus_run(l);
    unsigned bad = forbidden(l), owner_in = 0;
    for (unsigned i = 0; i < l->rounds; i++)
        owner_in += l->entered[i];
    print_message("SB litmus: without membarrier %u forbidden of %u rounds; gate %u of %u "
                  "(owner entered in %u)\n",
                  control, control_rounds, bad, l->rounds, owner_in);
    assert_true(l->rounds >= LITMUS_MIN);
    assert_int_equal(bad, 0);
    free(l);
}

/* ---- the allocator under claims ---- */

#define WORKERS 2
#define BLOCK   (200 * KIB)
#define RUN_NS  (3ull * 1000000000ull)

typedef struct worker_s {
    mt_alloc_t *a;
    mt_stream_t *s;
    uint64_t id;
    uint64_t ops;
    uint64_t clobbered; /* a block's words changed under its holder */
    atomic_int *stop;
} worker_t;

/* Free/malloc pairs of one size on its own stream (the fast path, once the block is
 * cached), stamping each block it holds and checking the stamp before the free: a block
 * also handed to another thread, or flushed to the bins while in use, is overwritten. */
static void *worker_main(void *arg)
{
    worker_t *w = arg;
    while (!atomic_load(w->stop)) {
        void *p = NULL;
        assert_int_equal(mt_alloc_malloc(w->a, BLOCK, w->s, 0, &p), 0);
        uint64_t *head = p, *tail = (uint64_t *)((char *)p + BLOCK - 8);
        uint64_t stamp = w->id << 48 | w->ops;
        __atomic_store_n(head, stamp, __ATOMIC_RELAXED);
        __atomic_store_n(tail, ~stamp, __ATOMIC_RELAXED);
        for (int k = 0; k < 8; k++) {
            if (__atomic_load_n(head, __ATOMIC_RELAXED) != stamp ||
                __atomic_load_n(tail, __ATOMIC_RELAXED) != ~stamp)
                w->clobbered++;
            mt__cpu_relax();
        }
        assert_int_equal(mt_alloc_free(w->a, p), 0);
        w->ops++;
        /* The block now held in the cache a while, for the claimer to find it there. */
        for (int k = 0; k < 64; k++)
            mt__cpu_relax();
    }
    return NULL;
}

static void test_fast_paths_under_claims(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc_default(b, NULL, NULL);
    atomic_int stop = 0;
    worker_t w[WORKERS];
    pthread_t th[WORKERS];
    for (int i = 0; i < WORKERS; i++) {
        w[i] = (worker_t){.a = a, .id = (uint64_t)i + 1, .stop = &stop};
        assert_int_equal(mt_stream_create(b, &w[i].s), 0);
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    /* This thread claims every cache again and again: a flush that finds a held block
     * proves the owners were on their fast paths meanwhile. */
    uint64_t claims = 0, held = 0, t0 = litmus_now_ns();
    while (litmus_now_ns() - t0 < RUN_NS) {
        mt__alloc_lock(a);
        held += mt__tc_flush_all(a);
        mt__alloc_unlock(a);
        if (++claims % 16 == 0)
            assert_int_equal(mt_alloc_check(a), 0);
    }
    atomic_store(&stop, 1);
    uint64_t ops = 0;
    for (int i = 0; i < WORKERS; i++) {
        pthread_join(th[i], NULL);
        ops += w[i].ops;
        assert_int_equal(w[i].clobbered, 0);
    }
    print_message("claims: %llu flushes (%llu found held blocks), %llu malloc/free pairs\n",
                  (unsigned long long)claims, (unsigned long long)held, (unsigned long long)ops);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_stats_t st = stats_of(a);
    assert_int_equal(st.allocation[MT_STAT_ALL].allocated, ops);
    assert_int_equal(st.allocation[MT_STAT_ALL].current, 0);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 0);
    assert_true(held > 0);
    for (int i = 0; i < WORKERS; i++)
        mt_stream_destroy(b, &w[i].s);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_litmus_sb),
        cmocka_unit_test(test_fast_paths_under_claims),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
