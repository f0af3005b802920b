/* A thread cache's events in compact form: what the allocator hands a recorder that takes
 * batches (mt_event_sink_t.write_batch), and what the ring stores for them (one header slot,
 * then the entries two per slot). The events a batch stands for are the ones the cache's
 * operations would have emitted one by one (docs/telemetry.md, "Batches of a thread cache"):
 * mt__evb_expand gives them back, field for field.
 *
 * Each entry is one fast operation (and a pop followed at once by the free of its block
 * is one entry): its events, in order, are
 *   STACK     stack_ref (size = the stack id), always just before a POP or POP_FREE, with
 *             the totals of the alloc it precedes (as the global path gives them)
 *   POP       alloc (the program's allocated bytes rise by size)
 *   FREE      free_requested, free_completed (they fall by size at the first)
 *   POP_FREE  alloc, free_requested, free_completed, rep + 1 times (the same block
 *             taken and freed again with the same request: a tight loop's pair)
 * Every event of a batch carries the batch's time, reserved bytes and device; allocated is
 * the program's figure after the event, from allocated0 (before the batch) and the sizes.
 * A timed entry (op | MT__EVB_TIMED: the global path's, emit.c) carries its own time: its
 * events are stamped time_ns + dt, dt = requested >> 40 (ns, < 2^24), and its request is
 * requested's low 40 bits (mt__evb_req); rep is 0 in it.
 * Invariants of a batch a producer writes: 1 <= nent <= nev <= MT__EVB_MAX_EV, nev = the
 * sum of the entries' events; rep = 0 but for POP_FREE; every entry's op, pool and tag in
 * range, 0 < requested <= size for POP, POP_FREE and FREE; a STACK followed by a POP or
 * POP_FREE; allocated never below 0. */
#ifndef MT_UTIL_EVBATCH_H
#define MT_UTIL_EVBATCH_H

#include <stddef.h>
#include <stdint.h>

#include "memtrace/event.h"

#define MT__EVB_MAX_EV 1024        /* events of one batch at most */
#define MT__EVB_KIND   0xB7        /* the header slot's kind: no event's (>= MT_EV_KIND_COUNT) */
#define MT__EVB_MAGIC  0x45564231u /* the header slot's stream field: "EVB1" */

enum { MT__EVB_STACK = 1, MT__EVB_POP, MT__EVB_FREE, MT__EVB_POP_FREE, MT__EVB_OP_END };
#define MT__EVB_TIMED    0x80u /* op flag: dt and the request share requested (above) */
#define MT__EVB_REQ_BITS 40
#define MT__EVB_DT_MAX   (((uint64_t)1 << (64 - MT__EVB_REQ_BITS)) - 1)

typedef struct mt__evb_ent_s {
    uint64_t addr;
    uint64_t size;      /* the block's bytes; STACK: the stack id */
    uint64_t requested; /* the program's request (STACK: 0) */
    uint32_t stream;
    uint8_t op; /* MT__EVB_* */
    uint8_t pool;
    uint8_t tag;
    uint8_t rep; /* POP_FREE: its pair's repeats after the first; else 0 */
} mt__evb_ent_t;

_Static_assert(sizeof(mt__evb_ent_t) == 32, "two entries per ring slot");

typedef struct mt__evb_hdr_s {
    uint64_t time_ns;
    int64_t allocated0; /* the program's allocated bytes before the batch's first event */
    uint64_t reserved;
    uint32_t nent; /* entries */
    uint32_t nev;  /* events they stand for */
    uint8_t device;
} mt__evb_hdr_t;

/* An entry's op without the TIMED flag; its request; its time after the header's. */
static inline unsigned mt__evb_op(const mt__evb_ent_t *e)
{
    return e->op & ~MT__EVB_TIMED;
}
static inline uint64_t mt__evb_req(const mt__evb_ent_t *e)
{
    return e->op & MT__EVB_TIMED ? e->requested & (((uint64_t)1 << MT__EVB_REQ_BITS) - 1)
                                 : e->requested;
}
static inline uint64_t mt__evb_dt(const mt__evb_ent_t *e)
{
    return e->op & MT__EVB_TIMED ? e->requested >> MT__EVB_REQ_BITS : 0;
}

/* Events of one entry's op, without its flag (0 for an op out of range). */
static inline unsigned mt__evb_op_events(unsigned op)
{
    return op == MT__EVB_STACK || op == MT__EVB_POP ? 1
           : op == MT__EVB_FREE                     ? 2
           : op == MT__EVB_POP_FREE                 ? 3
                                                    : 0;
}

/* Events an entry stands for (0 for an op out of range). */
static inline unsigned mt__evb_ent_events(const mt__evb_ent_t *e)
{
    return mt__evb_op_events(mt__evb_op(e)) * (1u + e->rep);
}

/* The change of the program's allocated bytes an entry makes (its first event's, then 0). */
static inline int64_t mt__evb_op_delta(const mt__evb_ent_t *e)
{
    unsigned op = mt__evb_op(e);
    return op == MT__EVB_POP ? (int64_t)e->size : op == MT__EVB_FREE ? -(int64_t)e->size : 0;
}

/* Ring slots a batch of nent entries takes with its header. */
static inline size_t mt__evb_slots(size_t nent)
{
    return 1 + (nent + 1) / 2;
}

/* The header as a ring slot (kind MT__EVB_KIND; seq left 0 for the ring) and back.
 * unpack: 0, or MT_EPROTO when the slot is no header a producer writes. */
void mt__evb_hdr_pack(const mt__evb_hdr_t *h, mt_event_rec_t *slot);
int mt__evb_hdr_unpack(const mt_event_rec_t *slot, mt__evb_hdr_t *out);

/* Calls cb for each event of the batch, in order, the first with seq0 and the next ones
 * with the following seqs. Every entry is checked first (the header's counts, each op,
 * pool, tag and size, allocated never negative): MT_EPROTO and no call when one could not
 * come from a producer; else 0. */
int mt__evb_expand(const mt__evb_hdr_t *h, const mt__evb_ent_t *ents, uint64_t seq0,
                   void (*cb)(void *ud, const mt_event_rec_t *ev), void *ud);

/* The same for the producer's own batches, unchecked: the events (seq 0) into
 * out[0..h->nev); returns how many. */
size_t mt__evb_make(const mt__evb_hdr_t *h, const mt__evb_ent_t *ents, mt_event_rec_t *out);

#endif
