/* The allocator's one door to its event sink. Every event leaves through emit_recs, the
 * global path's under mu and a thread cache's fast operations inside their exclusion.
 * While the caches run with a recording sink (a->rec), the totals events carry are made
 * the program's there: the counters hold a block a cache holds as allocated, the events
 * do not (docs/allocator-tcache.md, "Recording"). */
#include <sched.h>

#include "allocator/tcache.h"
#include "util/cpu.h"
#include "util/evbatch.h"

void mt__alloc_fill_rec(const mt_alloc_t *a, mt_event_rec_t *ev, int kind, uint64_t addr,
                        uint64_t size, uint64_t requested, uint32_t sid, int pool, int tag,
                        uint64_t t)
{
    *ev = (mt_event_rec_t){
        .time_ns = t,
        .addr = addr,
        .size = size,
        .requested = requested,
        .allocated = (uint64_t)a->st.allocated_bytes[MT_STAT_ALL].current,
        .reserved = (uint64_t)a->st.reserved_bytes[MT_STAT_ALL].current,
        .stream = sid,
        .kind = (uint8_t)kind,
        .pool = (uint8_t)pool,
        .tag = (uint8_t)tag,
        .device = (uint8_t)a->device,
    };
}

/* ---- the recording state (a->rec: rec_lock and what it guards) ---- */

static void rec_lock(mt_alloc_t *a)
{
    unsigned spins = 0;
    while (__atomic_test_and_set(&a->rec_lock, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(&a->rec_lock, __ATOMIC_RELAXED))
            if (++spins % 256 == 0)
                sched_yield(); /* its holder may wait for the ring (a lossless sink) */
            else
                mt__cpu_relax();
}

static void rec_unlock(mt_alloc_t *a)
{
    __atomic_clear(&a->rec_lock, __ATOMIC_RELEASE);
}

/* The stamp of an event emitted now, after t_min's: stamps never decrease in the order the
 * sink receives them (rec_lock held). */
static uint64_t rec_stamp(mt_alloc_t *a, uint64_t t)
{
    if (t < a->rec_t)
        t = a->rec_t;
    a->rec_t = t;
    return t;
}

static void push(mt_alloc_t *a, const mt_event_rec_t *ev, size_t n)
{
    const mt_event_sink_t *s = a->cfg.sink;
    if (n > 1 && s->emit_n != NULL) {
        s->emit_n(s->ud, ev, n);
        return;
    }
    if (s->emit != NULL)
        for (size_t i = 0; i < n; i++)
            s->emit(s->ud, &ev[i]);
}

/* ev[0..n) to the sink now, in the order of the state changes (mu held). */
static void emit_now(mt_alloc_t *a, mt_event_rec_t *ev, size_t n)
{
    if (!a->rec) {
        push(a, ev, n);
        return;
    }
    mt__alloc_assert_owner(a);
    rec_lock(a);
    for (size_t i = 0; i < n; i++) {
        /* ev carries the counters (filled under mu, which no other writer of them holds) */
        a->rec_g = (int64_t)ev[i].allocated;
        a->rec_res = ev[i].reserved;
        mt_assert(a->rec_held >= 0 && a->rec_g >= a->rec_held);
        ev[i].allocated = (uint64_t)(a->rec_g - a->rec_held);
        ev[i].time_ns = rec_stamp(a, ev[i].time_ns);
    }
    push(a, ev, n); /* as the sink's emit: an OOM, say, may need its care */
    rec_unlock(a);
}

void mt__alloc_emit_recs(mt_alloc_t *a, mt_event_rec_t *ev, size_t n)
{
    if (a->gb_n != 0)
        mt__alloc_gb_flush(a); /* the events held back come first */
    emit_now(a, ev, n);
}

static void make_events(const mt__evb_hdr_t *h, const mt__evb_ent_t *ents, mt_event_rec_t *out)
{
    size_t n = mt__evb_make(h, ents, out);
    mt_assert(n == h->nev); /* the allocator's own entries */
    (void)n;
}

/* Hands batch (h, ents) to the sink, rec_lock held (released here; it was given its place
 * in the order): when the sink claims (event.h), its places are claimed under the lock and
 * the batch is copied outside it, in compact form when the sink takes it (the events are
 * made where they are read), so that two threads' batches copy at once. A sink that cannot
 * claim receives the events, made in out[0..h->nev), under the lock. */
static void send_batch(mt_alloc_t *a, const mt__evb_hdr_t *h, const mt__evb_ent_t *ents,
                       mt_event_rec_t *out)
{
    const mt_event_sink_t *s = a->cfg.sink;
    uint64_t tok[2];
    if (s->claim != NULL && s->claim(s->ud, h->nev, tok)) {
        rec_unlock(a);
        if (s->write_batch != NULL && mt__evb_slots(h->nent) <= h->nev) {
            s->write_batch(s->ud, tok, h, ents);
            return;
        }
        make_events(h, ents, out);
        s->write(s->ud, tok, out, h->nev);
        return;
    }
    make_events(h, ents, out);
    push(a, out, h->nev);
    rec_unlock(a);
}

/* A cache's batch takes its place in the sink's order under rec_lock, in O(1): the bytes
 * held before it (so each event's totals) and its stamp. */
void mt__alloc_emit_cached(mt_alloc_t *a, const mt__evb_ent_t *ents, size_t nent, size_t nev,
                           mt_event_rec_t *out, uint64_t now)
{
    int64_t d = 0; /* the change of the program's allocated bytes: of the held ones, -d */
    for (size_t i = 0; i < nent; i++)
        d += mt__evb_op_delta(&ents[i]);
    rec_lock(a);
    int64_t held0 = a->rec_held;
    mt__evb_hdr_t h = {
        .time_ns = rec_stamp(a, now),
        .allocated0 = a->rec_g - held0,
        .reserved = a->rec_res,
        .nent = (uint32_t)nent,
        .nev = (uint32_t)nev,
        .device = (uint8_t)a->device,
    };
    a->rec_held = held0 - d;
    mt_assert(a->rec_held >= 0 && a->rec_g >= a->rec_held);
    send_batch(a, &h, ents, out);
}

/* ---- the global path's allocs and frees, held back (docs/telemetry.md) ----
 * They are kept as timed entries (util/evbatch.h), each with its own stamp, and handed
 * over as one batch (one lock, one claim of ring slots, a quarter of the bytes). They may
 * follow a thread cache's batch pushed meanwhile: that batch tells only of blocks the
 * cache owns, whose allocs were handed over when it took them (mt__alloc_emit_alloc's
 * out), and its totals are rec_g's, the counters' as of the global events handed over. Any
 * other event, a flush of the caches (mt__alloc_rec_flushed) and the sink's source hand
 * them over first; so does an operation MT__GB_NS after the first, or at other reserved
 * bytes. */

void mt__alloc_gb_flush(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    uint32_t n = a->gb_n;
    if (n == 0)
        return;
    int64_t d = 0; /* the change of the counters' allocated bytes */
    for (uint32_t i = 0; i < n; i++)
        d += mt__evb_op_delta(&a->gb[i]);
    rec_lock(a);
    /* no counter changed but by these operations since the last event handed over */
    mt_assert(a->rec_g + d == a->gb_g);
    mt__evb_hdr_t h = {
        .time_ns = rec_stamp(a, a->gb_t0),
        .allocated0 = a->rec_g - a->rec_held,
        .reserved = a->gb_res,
        .nent = n,
        .nev = a->gb_nev,
        .device = (uint8_t)a->device,
    };
    a->rec_t = h.time_ns + mt__evb_dt(&a->gb[n - 1]);
    a->rec_g = a->gb_g;
    a->rec_res = a->gb_res;
    mt_assert(a->rec_held >= 0 && a->rec_g >= a->rec_held);
    a->gb_n = a->gb_nev = 0;
    send_batch(a, &h, a->gb, a->gb_out);
}

const char *mt__alloc_gb_check(const mt_alloc_t *a)
{
    if (a->gb_n > MT__GB_CAP || a->gb_nev < a->gb_n || a->gb_nev > 2 * a->gb_n ||
        (a->gb == NULL && a->gb_n != 0))
        return "emit: the events held back (gb_n, gb_nev) out of range";
    int64_t d = 0;
    uint32_t nev = 0;
    for (uint32_t i = 0; i < a->gb_n; i++) {
        d += mt__evb_op_delta(&a->gb[i]);
        nev += mt__evb_ent_events(&a->gb[i]);
        if (!(a->gb[i].op & MT__EVB_TIMED) || mt__evb_dt(&a->gb[i]) >= MT__GB_NS)
            return "emit: an event held back is no timed entry of its batch";
    }
    if (a->gb_n != 0 && (nev != a->gb_nev || a->rec_g + d != a->gb_g))
        return "emit: the events held back do not add up to their counts and totals";
    return NULL;
}

void mt__alloc_emit_alloc_now(mt_alloc_t *a, uint64_t addr, uint64_t size, uint64_t req,
                              uint32_t sid, int pool, int tag, uint32_t stack, uint64_t t)
{
    mt__alloc_assert_owner(a);
    mt_event_rec_t ev[2];
    size_t n = stack != 0 ? 2 : 1;
    mt__alloc_fill_rec(a, &ev[n - 1], MT_EV_ALLOC, addr, size, req, sid, pool, tag, t);
    if (stack != 0)
        mt__alloc_fill_rec(a, &ev[0], MT_EV_STACK_REF, addr, stack, 0, sid, pool, tag, t);
    mt__alloc_emit_recs(a, ev, n);
    mt__alloc_stats_due(a, t);
}

void mt__alloc_emit_free_now(mt_alloc_t *a, uint64_t addr, uint64_t size, uint64_t req,
                             uint32_t sid, int pool, int tag, uint64_t t)
{
    mt__alloc_assert_owner(a);
    mt_event_rec_t ev[2];
    size_t n = 0;
    if (req != 0)
        mt__alloc_fill_rec(a, &ev[n++], MT_EV_FREE_REQUESTED, addr, size, req, sid, pool, tag, t);
    mt__alloc_fill_rec(a, &ev[n++], MT_EV_FREE_COMPLETED, addr, size, 0, sid, pool, tag, t);
    mt__alloc_emit_recs(a, ev, n);
    mt__alloc_stats_due(a, t);
}

void mt__alloc_rec_flushed(mt_alloc_t *a, int64_t bytes)
{
    mt__alloc_assert_owner(a);
    mt__alloc_gb_flush(a); /* their rec_g is the counters' before this flush */
    rec_lock(a);
    a->rec_g -= bytes;
    a->rec_held -= bytes;
    mt_assert(a->rec_held >= 0 && a->rec_g >= a->rec_held);
    rec_unlock(a);
}

/* ---- the global path's events ---- */

void mt__alloc_emit_stats(mt_alloc_t *a, uint64_t t)
{
    if (a->cfg.sink == NULL || a->cfg.sink->emit == NULL)
        return;
    mt_event_rec_t ev;
    mt__alloc_fill_rec(a, &ev, MT_EV_STATS, 0, (uint64_t)a->st.allocated_bytes[MT_STAT_ALL].peak,
                       (uint64_t)a->st.requested_bytes[MT_STAT_ALL].current, 0, MT_POOL_NONE, 0, t);
    mt__alloc_emit_recs(a, &ev, 1);
    mt__alloc_emit_device(a);
}

void mt__alloc_stats_emit_due(mt_alloc_t *a, uint64_t t)
{
    a->stats_next_ns = t + a->stats_period_ns;
    mt__alloc_emit_stats(a, t);
}

void mt__alloc_emit_slow(mt_alloc_t *a, int kind, uint64_t addr, uint64_t size, uint64_t requested,
                         uint32_t sid, int pool, int tag, uint64_t t)
{
    mt__alloc_assert_owner(a); /* events leave in the order of the state changes */
    if (a->cfg.sink == NULL || a->cfg.sink->emit == NULL)
        return;
    mt_event_rec_t ev;
    mt__alloc_fill_rec(a, &ev, kind, addr, size, requested, sid, pool, tag,
                       t != 0 ? t : mt__clock_now(&a->clk));
    mt__alloc_emit_recs(a, &ev, 1);
    mt__alloc_stats_due(a, ev.time_ns);
}
