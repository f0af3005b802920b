/* The allocator's event clock: CLOCK_MONOTONIC nanoseconds, read from the TSC where
 * that is sound, because clock_gettime (~21 ns here, a vDSO call that itself reads the
 * TSC and converts) was most of what recording an event cost. See mt__clock_t. */
#include <time.h>

#include "util/clock.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#define CAL_NS        (50u * 1000u)   /* initial calibration spin */
#define SPAN_NS       (1000u * 1000u) /* re-anchor against CLOCK_MONOTONIC this often */
#define REFINE_MIN    (1000u * 1000u) /* refine the rate over at least this many ns */
#define RATE_JUMP_DIV 100             /* a rate 1 % off the last one restarts refinement */
#define PAIR_TRIES    3               /* simultaneous reads tried per anchor */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* An invariant TSC (CPUID 0x80000007 EDX bit 8; Linux shows it as constant_tsc and
 * nonstop_tsc) ticks at one rate in every P- and C-state. */
static bool tsc_invariant(void)
{
#if defined(__x86_64__)
    unsigned eax, ebx, ecx, edx;
    if (__get_cpuid(0x80000000u, &eax, &ebx, &ecx, &edx) == 0 || eax < 0x80000007u)
        return false;
    if (__get_cpuid(0x80000007u, &eax, &ebx, &ecx, &edx) == 0)
        return false;
    return (edx >> 8) & 1u;
#else
    return false;
#endif
}

#if defined(__x86_64__)
/* ns per tick as a 32.32 fixed-point multiplier, from an interval; 0 if unusable. */
static uint64_t rate(uint64_t dns, uint64_t dticks)
{
    if (dticks == 0)
        return 0;
    unsigned __int128 m = ((unsigned __int128)dns << 32) / dticks;
    return m == 0 || m > ((unsigned __int128)1 << 40) ? 0 : (uint64_t)m;
}

/* A simultaneous read of both clocks: the TSC taken on both sides of clock_gettime,
 * keeping the tightest of a few tries, so that a preemption between the two reads is
 * unlikely to skew the pair (a skewed anchor offsets every time until the next one). */
static void pair_read(uint64_t *ns, uint64_t *tsc)
{
    uint64_t best = UINT64_MAX;
    *ns = *tsc = 0;
    for (int i = 0; i < PAIR_TRIES; i++) {
        uint64_t a = mt__rdtsc(), n = mono_ns(), b = mt__rdtsc();
        if (b - a < best) {
            best = b - a;
            *ns = n;
            *tsc = a + (b - a) / 2;
        }
    }
}
#endif

void mt__clock_init(mt__clock_t *c, bool allow_tsc)
{
    *c = (mt__clock_t){0};
#if defined(__x86_64__)
    if (allow_tsc && tsc_invariant()) {
        uint64_t ns0 = 0, t0 = 0, ns1 = 0, t1 = 0;
        pair_read(&ns0, &t0);
        do
            pair_read(&ns1, &t1);
        while (ns1 - ns0 < CAL_NS);
        c->mult = rate(ns1 - ns0, t1 - t0);
        if (c->mult != 0) {
            c->tsc = true;
            c->cal_tsc = t0;
            c->cal_ns = ns0;
            c->base_tsc = t1;
            c->base_ns = ns1;
            c->last_ns = ns1;
            /* ticks of one span, so that d * mult stays far below 2^64 */
            c->span_ticks = (uint64_t)(((unsigned __int128)SPAN_NS << 32) / c->mult);
            return;
        }
    }
#else
    (void)allow_tsc;
#endif
    c->last_ns = mono_ns();
}

uint64_t mt__clock_slow(mt__clock_t *c)
{
    uint64_t ns = 0;
#if defined(__x86_64__)
    if (c->tsc) {
        uint64_t t = 0;
        pair_read(&ns, &t);
        /* Refine the rate over the whole time since calibration: the longer the interval,
         * the smaller the error of the two clock reads. A rate far off the current one
         * (the machine was suspended, the TSC jumped) restarts the interval instead. */
        if (t > c->cal_tsc && ns - c->cal_ns >= REFINE_MIN) {
            uint64_t m = rate(ns - c->cal_ns, t - c->cal_tsc);
            uint64_t tol = c->mult / RATE_JUMP_DIV;
            if (m != 0 && m + tol >= c->mult && m <= c->mult + tol) {
                c->mult = m;
            } else {
                c->cal_tsc = t;
                c->cal_ns = ns;
            }
        }
        c->base_tsc = t;
        c->base_ns = ns;
    } else {
        ns = mono_ns();
    }
#else
    ns = mono_ns();
#endif
    if (ns > c->last_ns)
        c->last_ns = ns;
    return c->last_ns;
}

/* ---- util/entry.h ---- */
#include "util/entry.h"
_Thread_local uintptr_t mt__entry_ra;
