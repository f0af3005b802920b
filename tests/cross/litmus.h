/* The two-thread store-buffering litmus harness of tests/cross (test_tc_gate.c,
 * test_lock_bias.c): both threads meet before each round's racing accesses, leave the
 * meeting together, wait a random few turns, race, and meet again; the rounds run for
 * LITMUS_NS after LITMUS_MIN of them, however few that leaves on a loaded machine. */
#ifndef MT_TESTS_CROSS_LITMUS_H
#define MT_TESTS_CROSS_LITMUS_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "util/cpu.h"

#define LITMUS_MAX    20000
#define LITMUS_NS     (2ull * 1000000000ull)  /* per variant, after LITMUS_MIN rounds */
#define LITMUS_MIN    200                     /* rounds, at least, for a meaningful run */
#define LITMUS_CAP_NS (60ull * 1000000000ull) /* however few rounds that leaves */

static inline uint64_t litmus_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint32_t litmus_rng(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* Both threads leave the meeting of phase k together (sequentially consistent: the
 * meeting's own ordering ends before the round's racing accesses start). */
static inline void litmus_meet(atomic_uint *sync, unsigned *phase)
{
    unsigned target = 2 * ++*phase;
    atomic_fetch_add(sync, 1);
    /* Spinning long enough that the other thread, if it runs, arrives while this one
     * still spins (the two then leave together and race); yielding after that: on a
     * loaded machine (CI's two cores) the other thread may not be running at all. */
    for (unsigned spins = 0; atomic_load(sync) < target; spins++) {
        if (spins < (1u << 16))
            mt__cpu_relax();
        else
            sched_yield();
    }
}

/* A random delay before the racing accesses, in the unit of the meeting's spin loop: the
 * thread that arrives last at a meeting leaves it first, ahead of the other by about one
 * turn of that loop (a few ns natively, far longer under qemu's TCG), so without it the
 * two would reach the race in the same order every round. wide: half the delays are long
 * enough to outlast the other side's membarrier call, so that this side's store also comes
 * after the other's read, where only its own load keeps it out. */
static inline void litmus_jitter(uint32_t *seed, bool wide)
{
    uint32_t r = litmus_rng(seed);
    for (unsigned n = wide && (r & 1) ? (r >> 1) % 512 : (r >> 1) % 8; n > 0; n--)
        mt__cpu_relax();
}

/* The rounds (of n) with the forbidden outcome: the owner got in (entered) while the other
 * side read its flag as clear (saw = 0). */
static inline unsigned litmus_forbidden(const uint8_t *entered, const uint8_t *saw, unsigned n)
{
    unsigned k = 0;
    for (unsigned i = 0; i < n; i++)
        k += entered[i] && !saw[i];
    return k;
}

/* Round i of a run that began at t0 runs. */
static inline bool litmus_more(unsigned i, uint64_t t0)
{
    uint64_t dt = litmus_now_ns() - t0;
    return i < LITMUS_MAX && (i < LITMUS_MIN || dt < LITMUS_NS) && dt < LITMUS_CAP_NS;
}

#endif
