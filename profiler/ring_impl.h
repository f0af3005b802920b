/* The event ring's process-local handle, shared by ring.c (lifecycle, producer) and
 * ring_read.c (consumer). Nothing else reads it: the others use ring.h. */
#ifndef MT_PROFILER_RING_IMPL_H
#define MT_PROFILER_RING_IMPL_H

#include "profiler/ring.h"
#include "util/evbatch.h"

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define DEFAULT_STUCK_NS (500u * 1000u * 1000u)
/* Records ahead of the one written that push asks ownership of (prefetch_write): a few
 * operations, time enough for a line to come back from the consumer's core. */
#define PREFETCH_AHEAD 4
/* The consumer publishes read_idx every this many records (and at the end of a drain),
 * not after each: a producer that finds the ring full re-reads read_idx, and a line the
 * consumer rewrote after every record cost it a cache miss per push (the JSON drainer,
 * which falls behind under heavy allocation, made a heavy allocator 4x slower that way). */
#define READ_PUBLISH 64
/* Records ahead of the one read that a drain asks for (prefetch): about a microsecond of
 * draining, the time a line takes to come from memory or the producer's core. */
#define DRAIN_AHEAD 8

struct mt__ring_s {
    mt__ring_hdr_t *hdr;      /* shared, start of the mapping */
    _Atomic uint64_t *commit; /* shared, slots entries */
    mt_event_rec_t *recs;     /* shared, slots entries */
    size_t map_size;          /* bytes mapped */
    void *area;               /* the stack table's area, mapped apart, or NULL */
    size_t area_size;
    uint64_t mask; /* slots - 1 */
    char name[MT_RING_NAME_MAX];
    bool owner;         /* created here (producer) */
    bool linked;        /* the name still exists as far as we know */
    uint32_t owner_uid; /* st_uid of the shm object */
    /* consumer: the busguard ids (util/busguard.h) of the mapping and the area, 0 = none.
     * The producer owns the file and may shrink it under us at any time. */
    int guard_map, guard_area;
    /* producer: a process-local copy of read_idx, never ahead of the shared one, so a
     * push reads the consumer's cache line only when the ring looks full */
    _Atomic uint64_t cached_read;
    /* consumer state (only the single consumer touches it) */
    bool producer_dead;
    uint64_t stuck_timeout_ns;
    uint64_t stuck_pos;      /* position of the unpublished slot being waited on */
    uint64_t stuck_since_ns; /* 0 = not waiting */
    uint64_t stuck_claim;    /* claim (the drain's snapshot) when that wait began */
    /* Positions below were claimed before a wait that ran out began: one still unpublished
     * has been so for the stuck timeout too (a batch's untouched positions, claimed with
     * its header, are given up at once after it, not after a timeout each). */
    uint64_t aged_below;
    uint64_t gaps_reported; /* dropped + lost already announced as gap records */
    uint64_t next_seq;      /* highest seq delivered + 1 (0 = none yet) */
    /* Deferred acknowledgement (mt__ring_defer_ack): the consumer's own position, ahead of
     * the shared read_idx by what it delivered but has not yet acknowledged.
     * Invariant: defer => read_idx <= cons_pos <= claim. */
    bool defer;
    uint64_t cons_pos;
    /* consumer: a batch's entries, copied out of the ring before they are expanded */
    _Alignas(64) mt__evb_ent_t evb[MT__EVB_MAX_EV];
};

static inline uint64_t mt__ring_now_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
