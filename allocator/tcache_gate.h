/* The exclusion between a thread cache's owner (its fast paths, without mu) and a thread
 * holding mu that claims the cache (tcache.c). Its own header so that a litmus test can
 * drive exactly the code the allocator runs (tests/cross/test_tc_gate.c).
 *
 * With membarrier (Linux >= 4.14) it is Dekker's algorithm with the full fence on the rare
 * side only (an asymmetric Dekker, as in liburcu and folly's asymmetric barriers):
 *   owner:   busy = 1; compiler barrier; r = claim (acquire); r ? (busy = 0, give up) : run
 *   claimer: claim = 1; seq_cst fence; membarrier(PRIVATE_EXPEDITED); wait busy = 0 (acquire)
 * membarrier makes every running thread of the process execute a full barrier (smp_mb,
 * dmb ish on arm64) at some point of its program order between the call's start and end,
 * and a thread not running has passed one in the scheduler. So the owner's compiler
 * barrier acts as a seq_cst fence for this pair: either the owner's store of busy precedes
 * that barrier (then it is visible when membarrier returns and the claimer waits for the
 * fast path to end) or the owner's load of claim follows it (then it sees claim = 1, or a
 * later value, and takes the global path, which waits for mu). The forbidden outcome, the
 * owner running on claim = 0 while the claimer read busy = 0, is store buffering (SB),
 * which both x86-TSO and the arm64 model allow without the barrier: a plain store then a
 * load of another location may be reordered by any store buffer, so the compiler barrier
 * alone is not enough anywhere, and no acquire/release can replace the barrier either.
 * The data of the cache then moves by release/acquire alone: the owner's busy = 0
 * (release) after its fast path, read by the claimer's wait (acquire); the claimer's
 * claim = 0 (release) after its work, read by the owner's next load of claim (acquire).
 * The owner pays a plain store and a load instead of an atomic exchange per operation; a
 * claim costs a system call.
 * Without membarrier both sides take a test-and-set lock (acquire / release).
 * Invariants: busy and claim are 0 or 1; busy = 1 only while the owner is between enter
 * and exit (or giving up); claim = 1 only while one thread holding mu claims; lkbusy = 1
 * only while the owner takes or holds the allocator's lock by its bias (lock.h). */
#ifndef MT_ALLOCATOR_TCACHE_GATE_H
#define MT_ALLOCATOR_TCACHE_GATE_H

#include <stdbool.h>
#include <stdint.h>

#include "util/cpu.h"

typedef struct mt__tc_gate_s {
    uint8_t busy;  /* the owner's fast path runs (written by the owner only) */
    uint8_t claim; /* a thread holding mu excludes the fast paths */
    uint8_t lock;  /* without membarrier: a test-and-set lock both sides take */
    /* The owner holds or is taking the allocator's lock by its bias (lock.h; written by the
     * owner only, read by a revoker holding mu). */
    uint8_t lkbusy;
} mt__tc_gate_t;

/* Registers the process for membarrier (once; later calls return the first answer): true
 * when the asymmetric protocol may be used. */
bool mt__tc_gate_asym(void);

static inline void mt__tc_gate_lock(mt__tc_gate_t *g)
{
    while (__atomic_test_and_set(&g->lock, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(&g->lock, __ATOMIC_RELAXED))
            mt__cpu_relax();
}

static inline void mt__tc_gate_unlock(mt__tc_gate_t *g)
{
    __atomic_clear(&g->lock, __ATOMIC_RELEASE);
}

/* The owner, before a fast operation; false = a claim stands: take the global path. */
static inline bool mt__tc_gate_enter(mt__tc_gate_t *g, bool asym)
{
    if (__builtin_expect(!asym, 0)) {
        mt__tc_gate_lock(g);
        return true;
    }
    __atomic_store_n(&g->busy, 1, __ATOMIC_RELAXED);
    /* The compiler keeps the store before the load; the claimer's membarrier orders them
     * in the hardware (see above). */
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if (__builtin_expect(!__atomic_load_n(&g->claim, __ATOMIC_ACQUIRE), 1))
        return true;
    __atomic_store_n(&g->busy, 0, __ATOMIC_RELEASE);
    return false;
}

/* The owner, after a fast operation that entered. */
static inline void mt__tc_gate_exit(mt__tc_gate_t *g, bool asym)
{
    if (__builtin_expect(!asym, 0))
        mt__tc_gate_unlock(g);
    else
        __atomic_store_n(&g->busy, 0, __ATOMIC_RELEASE);
}

/* The claimer's first half (asym only): claim = 1 made visible to every thread, each of
 * which passes a full barrier before this returns. */
void mt__tc_gate_announce(mt__tc_gate_t *g);
/* The calling thread's stores made visible to every thread, each of which passes a full
 * barrier before this returns (asym only: membarrier). */
void mt__tc_gate_barrier(void);

/* Excludes the owner's fast paths (the caller holds mu and is not the owner). */
static inline void mt__tc_gate_claim(mt__tc_gate_t *g, bool asym)
{
    if (!asym) {
        mt__tc_gate_lock(g);
        return;
    }
    mt__tc_gate_announce(g);
    while (__atomic_load_n(&g->busy, __ATOMIC_ACQUIRE))
        mt__cpu_relax();
}

static inline void mt__tc_gate_unclaim(mt__tc_gate_t *g, bool asym)
{
    if (!asym)
        mt__tc_gate_unlock(g);
    else
        __atomic_store_n(&g->claim, 0, __ATOMIC_RELEASE);
}

#endif
