/* The event clock: CLOCK_MONOTONIC nanoseconds at a fraction of the cost of
 * clock_gettime (util/clock.c). Used by the allocator to stamp its events. */
#ifndef MT_UTIL_CLOCK_H
#define MT_UTIL_CLOCK_H

#include <stdbool.h>
#include <stdint.h>

/* CLOCK_MONOTONIC nanoseconds at a fraction of the cost of
 * clock_gettime. With an invariant TSC (x86-64, CPUID says constant and nonstop), a read
 * is rdtsc and ns = base_ns + ((tsc - base_tsc) * mult >> 32), where (base_tsc, base_ns)
 * is a pair of simultaneous reads of both clocks taken at most one span (1 ms) ago and
 * mult the TSC period in 32.32 fixed point, calibrated over 50 us at creation and refined
 * at each re-anchoring over the whole time since. A read past the span (or with the TSC
 * behind base_tsc, which an unsigned difference turns into a huge one) re-anchors with
 * clock_gettime, so the error is bounded by one span's worth of rate error (tens of ns
 * once refined; under 1 us in the first millisecond), never accumulated. Without an
 * invariant TSC every read is clock_gettime.
 * Invariants: tsc => mult > 0 and span_ticks * mult is about 1 ms << 32 < 2^52 (the fast
 * path's product cannot overflow); values returned never decrease (last_ns); not
 * thread-safe (the allocator's mutex guards it). */
typedef struct mt__clock_s {
    bool tsc;            /* reads use the TSC */
    uint64_t mult;       /* ns per tick, 32.32 fixed point */
    uint64_t base_tsc;   /* anchor: TSC ... */
    uint64_t base_ns;    /* ... and CLOCK_MONOTONIC read together */
    uint64_t span_ticks; /* re-anchor when this many ticks passed since the anchor */
    uint64_t cal_tsc;    /* start of the rate-refinement interval */
    uint64_t cal_ns;
    uint64_t last_ns; /* last value returned */
} mt__clock_t;

void mt__clock_init(mt__clock_t *c, bool allow_tsc);
uint64_t mt__clock_slow(mt__clock_t *c);
#if defined(__x86_64__)
static inline uint64_t mt__rdtsc(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}
#endif
/* Now, in CLOCK_MONOTONIC ns (see mt__clock_t). */
static inline uint64_t mt__clock_now(mt__clock_t *c)
{
#if defined(__x86_64__)
    if (__builtin_expect(c->tsc, 1)) {
        uint64_t d = mt__rdtsc() - c->base_tsc;
        if (__builtin_expect(d < c->span_ticks, 1)) {
            uint64_t ns = c->base_ns + ((d * c->mult) >> 32);
            if (ns > c->last_ns)
                c->last_ns = ns;
            return c->last_ns;
        }
    }
#endif
    return mt__clock_slow(c);
}

#endif
