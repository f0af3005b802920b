/* The shared-memory event ring's consumer: drain, gaps, acknowledgement. The layout and
 * protocol are described once, in ring.h. */
#include "profiler/ring.h"
#include "profiler/ring_impl.h"
#include "memtrace/alloc.h"
#include "util/assert.h"
#include "util/busguard.h"

#include <signal.h>
#include <string.h>
#include <time.h>

/* ---- consumer ---- */

void mt__ring_mark_dead(mt__ring_t *r)
{
    r->producer_dead = true;
}

void mt__ring_set_stuck_timeout(mt__ring_t *r, uint64_t ns)
{
    r->stuck_timeout_ns = ns;
}

bool mt__ring_empty(const mt__ring_t *r)
{
    uint64_t pos =
        r->defer ? r->cons_pos : atomic_load_explicit(&r->hdr->read_idx, memory_order_relaxed);
    return pos == atomic_load_explicit(&r->hdr->claim, memory_order_acquire);
}

/* May the unpublished slot at pos be given up? Only when its writer cannot finish, or has
 * had it claimed for the stuck timeout. claim: the drain's snapshot. */
static bool may_skip(mt__ring_t *r, uint64_t pos, uint64_t claim)
{
    if (r->producer_dead ||
        (atomic_load_explicit(&r->hdr->flags, memory_order_acquire) & MT_RING_F_EXITED) ||
        pos < r->aged_below)
        return true;
    if (r->hdr->pid > 0 && kill(r->hdr->pid, 0) != 0 && errno == ESRCH) {
        r->producer_dead = true;
        return true;
    }
    uint64_t now = mt__ring_now_ns(CLOCK_MONOTONIC);
    if (r->stuck_since_ns == 0 || r->stuck_pos != pos) {
        r->stuck_pos = pos;
        r->stuck_since_ns = now;
        r->stuck_claim = claim;
        return false;
    }
    if (now - r->stuck_since_ns < r->stuck_timeout_ns)
        return false;
    if (r->aged_below < r->stuck_claim)
        r->aged_below = r->stuck_claim;
    return true;
}

/* The consumer has consumed up to pos: published now, or kept until mt__ring_ack. */
static void consumed(mt__ring_t *r, uint64_t pos)
{
    if (r->defer)
        r->cons_pos = pos;
    else
        atomic_store_explicit(&r->hdr->read_idx, pos, memory_order_release);
}

/* Gives up the n positions from pos, counted lost. */
static void skip_n(mt__ring_t *r, uint64_t pos, uint64_t n)
{
    mt_assert(r->stuck_since_ns == 0 || r->stuck_pos <= pos);
    atomic_fetch_add_explicit(&r->hdr->lost, n, memory_order_relaxed);
    consumed(r, pos + n);
    r->stuck_since_ns = 0;
}

static void skip_slot(mt__ring_t *r, uint64_t pos)
{
    skip_n(r, pos, 1);
}

void mt__ring_defer_ack(mt__ring_t *r)
{
    if (r->defer)
        return;
    r->cons_pos = atomic_load_explicit(&r->hdr->read_idx, memory_order_relaxed);
    r->defer = true;
}

void mt__ring_ack(mt__ring_t *r)
{
    if (r != NULL)
        mt__ring_ack_to(r, r->cons_pos);
}

uint64_t mt__ring_drained(const mt__ring_t *r)
{
    return r->cons_pos;
}

void mt__ring_ack_to(mt__ring_t *r, uint64_t pos)
{
    if (!r || !r->defer)
        return;
    mt_assert(pos <= r->cons_pos);
    if (pos > atomic_load_explicit(&r->hdr->read_idx, memory_order_relaxed))
        atomic_store_explicit(&r->hdr->read_idx, pos, memory_order_release);
}

/* Could a producer have written ev? Records are passed on to other programs (the
 * daemon's consumers decode its lines), so one with a field out of range (a kind that
 * does not exist or that only a consumer writes, a tag or pool past the last, a marker or
 * tag label that could not be named) is counted lost, as a torn one is. */
static inline __attribute__((always_inline)) bool record_valid(const mt_event_rec_t *ev)
{
    /* seq is the producer's count of events: UINT64_MAX cannot be reached, and taking it
     * would wrap the consumer's next_seq to 0. */
    if (ev->kind == 0 || ev->kind >= MT_EV_KIND_COUNT || ev->kind == MT_EV_GAP ||
        ev->tag >= MT_TAG_MAX || ev->pool > MT_POOL_HOST || ev->seq == UINT64_MAX)
        return false;
    if (ev->kind == MT_EV_TAG_LABEL) {
        char label[MT_EVENT_LABEL_MAX + 1];
        return ev->tag >= MT_TAG_USER_FIRST && mt_event_label_unpack(ev, label) > 0;
    }
    if (ev->kind == MT_EV_LIBRARY_LABEL) {
        char label[MT_EVENT_LABEL_MAX + 1];
        return ev->tag >= 1 && mt_event_label_unpack(ev, label) > 0;
    }
    if (ev->kind == MT_EV_STACK_REF)
        return ev->size != 0 && (ev->size <= MT_STACK_ID_MAX || ev->size == MT_STACK_ID_OVERFLOW);
    if (ev->kind == MT_EV_MARK_NAMED) {
        char name[MT_EVENT_LABEL_MAX + 1];
        return ev->requested == 0 && mt_event_label_unpack(ev, name) > 0;
    }
    return ev->kind != MT_EV_MARK || (ev->addr >= 1 && ev->addr <= MT_MARK_WARMUP_END);
}

/* Announces up to limit drops or losses not yet reported, as one gap record. */
static void report_gap(mt__ring_t *r, mt__ring_cb cb, void *ud, uint64_t limit)
{
    mt__ring_hdr_t *h = r->hdr;
    uint64_t missing = atomic_load_explicit(&h->dropped, memory_order_acquire) +
                       atomic_load_explicit(&h->lost, memory_order_relaxed);
    if (missing <= r->gaps_reported || limit == 0)
        return;
    uint64_t n = missing - r->gaps_reported;
    if (n > limit)
        n = limit;
    mt_event_rec_t gap;
    memset(&gap, 0, sizeof(gap));
    gap.kind = MT_EV_GAP;
    gap.seq = r->next_seq;
    gap.size = n;
    gap.time_ns = mt__ring_now_ns(CLOCK_MONOTONIC);
    r->gaps_reported += n;
    cb(ud, &gap);
}

/* ev to cb, after a gap record for the hole in the seqs before it, as far as drops and
 * losses account for it (with concurrent producers, seqs may also arrive slightly out of
 * order). */
static inline void deliver(mt__ring_t *r, mt__ring_cb cb, void *ud, const mt_event_rec_t *ev)
{
    if (ev->seq > r->next_seq)
        report_gap(r, cb, ud, ev->seq - r->next_seq);
    if (ev->seq + 1 > r->next_seq)
        r->next_seq = ev->seq + 1;
    mt_assert(r->next_seq > ev->seq);
    cb(ud, ev);
}

typedef struct expand_s {
    mt__ring_t *r;
    mt__ring_cb cb;
    void *ud;
    size_t delivered;
} expand_t;

/* One event of a batch. mt__evb_expand checked the whole batch first, which covers
 * record_valid's checks for the kinds a batch makes (kind, pool, tag, a stack id, a seq
 * below UINT64_MAX); checked builds assert the two agree. */
static void expand_cb(void *ud, const mt_event_rec_t *ev)
{
    expand_t *x = ud;
    mt_assert(record_valid(ev));
    deliver(x->r, x->cb, x->ud, ev);
    x->delivered++;
}

/* The batch whose header slot was published at pos (hs: its copy, c: the commit word read
 * before the copy), claim the call's snapshot, n the events the call delivered so far: its
 * events to cb (*got counts them), or its positions counted lost. Returns the positions it
 * took, or 0 when it does not fit in max after n > 0 events (it is left for the next
 * call). */
static uint64_t drain_batch(mt__ring_t *r, const mt_event_rec_t *hs, uint64_t pos, uint64_t c,
                            uint64_t claim, size_t max, size_t n, size_t *got, mt__ring_cb cb,
                            void *ud)
{
    mt__evb_hdr_t h;
    /* nev is believed only when all its positions were claimed (the payload slots are then
     * within the claimed window and the ring); else the slot is one invalid record. */
    if (mt__evb_hdr_unpack(hs, &h) != 0 || h.nev > claim - pos || mt__evb_slots(h.nent) > h.nev) {
        skip_slot(r, pos);
        return 1;
    }
    if (n > 0 && h.nev > max - n)
        return 0;
    const size_t k = mt__evb_slots(h.nent);
    mt_assert(2 * (k - 1) <= MT__EVB_MAX_EV && k <= h.nev && h.nev <= claim - pos);
    for (size_t j = 1; j < k; j++)
        memcpy(&r->evb[2 * (j - 1)], &r->recs[(pos + j) & r->mask], sizeof(mt_event_rec_t));
    /* The seqlock re-check of the header's commit word, covering the payload's copy too. */
    atomic_thread_fence(memory_order_acquire);
    expand_t x = {.r = r, .cb = cb, .ud = ud};
    if (atomic_load_explicit(&r->commit[pos & r->mask], memory_order_relaxed) != c ||
        mt__evb_expand(&h, r->evb, hs->seq, expand_cb, &x) != 0) {
        skip_n(r, pos, h.nev);
        return h.nev;
    }
    r->stuck_since_ns = 0;
    *got = x.delivered;
    return h.nev;
}

int mt__ring_drain(mt__ring_t *r, mt__ring_cb cb, void *ud, size_t max)
{
    if (!r || !cb)
        return MT_EINVAL;
    mt__ring_hdr_t *h = r->hdr;
    uint64_t pos =
        r->defer ? r->cons_pos : atomic_load_explicit(&h->read_idx, memory_order_relaxed);
    size_t n = 0;
    /* claim is the producers' hot cache line: read once per call, and the call stops at
     * that snapshot instead of chasing the producer. A consumer reading slots and commit
     * words just as they are written pulls those lines away from the producer's core
     * between its writes (each commit line holds eight positions); records published
     * during the call are for the next one. */
    uint64_t claim = atomic_load_explicit(&h->claim, memory_order_acquire);
    /* The header is the producer's memory: a claim behind read_idx or more than a ring
     * ahead of it breaks claim - read_idx <= S, and skipping up to it would run for up to
     * 2^64 positions. Such a ring is refused, not followed. */
    if (claim - pos > (uint64_t)r->mask + 1)
        return MT_EPROTO;
    while (n < max) {
        /* The claim snapshot bounds the call (a forged header was refused above). */
        mt_assert(claim - pos <= (uint64_t)r->mask + 1);
        if (pos == claim)
            break;
        _Atomic uint64_t *cw = &r->commit[pos & r->mask];
        uint64_t c = atomic_load_explicit(cw, memory_order_acquire);
        if (c != pos + 1) {
            if (!may_skip(r, pos, claim))
                break;
            /* What let the slot go (the exit flag, acquired, or the producer's death) was
             * seen after the commit word was read, and the producer may have published
             * in between: its last records come just before its exit flag. Read the word
             * again, after that, so a record published before the exit is delivered. */
            c = atomic_load_explicit(cw, memory_order_acquire);
            if (c != pos + 1) {
                skip_slot(r, pos);
                pos++;
                continue;
            }
        }
        /* The records ahead, and their commit words, on their way: a drain reads lines the
         * producer's core wrote (or that went out to memory), and their misses were most of
         * a drain's time. */
        __builtin_prefetch(&r->recs[(pos + DRAIN_AHEAD) & r->mask], 0);
        if ((pos & 7) == 0)
            __builtin_prefetch(&r->commit[(pos + 8 * DRAIN_AHEAD) & r->mask], 0);
        mt_event_rec_t ev = r->recs[pos & r->mask];
        /* Seqlock-style re-check: if a writer reused the slot while we copied it
         * (only possible after a skip), the copy may be torn; count it lost. A batch's
         * header is no record: it is checked, with its payload, on its own. */
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(cw, memory_order_relaxed) == c && record_valid(&ev)) {
            r->stuck_since_ns = 0;
            pos++;
            if ((pos & (READ_PUBLISH - 1)) == 0)
                consumed(r, pos);
            deliver(r, cb, ud, &ev);
            n++;
        } else if (ev.kind == MT__EVB_KIND) {
            const uint64_t from = pos;
            size_t got = 0;
            uint64_t took = drain_batch(r, &ev, pos, c, claim, max, n, &got, cb, ud);
            if (took == 0)
                break;
            pos += took;
            n += got;
            /* read_idx as if the batch's positions had been crossed one by one */
            if ((from ^ pos) >= READ_PUBLISH)
                consumed(r, pos);
        } else {
            skip_slot(r, pos);
            pos++;
        }
    }
    /* Counted once per call: a locked add per record cost the consumer as much as the
     * rest of its work on a record. */
    /* Wrap-aware: a forged read_idx near 2^64 passes the check above with claim small. A
     * batch longer than max is delivered whole when it comes first. */
    mt_assert((n <= max || n <= MT__EVB_MAX_EV) && claim - pos <= (uint64_t)r->mask + 1);
    if (n > 0)
        atomic_fetch_add_explicit(&h->delivered, n, memory_order_relaxed);
    consumed(r, pos);
    /* Drops after the last record are announced once nothing is pending. */
    if (pos == atomic_load_explicit(&h->claim, memory_order_acquire))
        report_gap(r, cb, ud, UINT64_MAX);
    return (int)n;
}
