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

void mt__alloc_gb_flush(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    size_t n = a->gb_n;
    if (n == 0)
        return;
    a->gb_n = 0;
    emit_now(a, a->gb, n);
}

void mt__alloc_emit_recs(mt_alloc_t *a, mt_event_rec_t *ev, size_t n)
{
    if (a->gb_n != 0)
        mt__alloc_gb_flush(a); /* the events held back come first */
    emit_now(a, ev, n);
}

/* The global path's allocs and frees are held back and handed over MT__GB_CAP events at a
 * time (one lock, one claim of ring slots), the stamp of each its own. They may follow a
 * thread cache's batch pushed meanwhile: that batch tells only of blocks the cache owns,
 * whose allocs were handed over when it took them (mt__alloc_op_end's now), and its totals
 * are rec_g's, the counters' as of the global events handed over (docs/telemetry.md). Any
 * other event, a flush of the caches (mt__alloc_rec_flushed) and the sink's source hand
 * them over first; so does an alloc older than MT__GB_NS. */
mt_event_rec_t *mt__alloc_op_begin(mt_alloc_t *a, mt_event_rec_t *local, size_t n)
{
    mt__alloc_assert_owner(a);
    mt_assert(n >= 1 && n <= 2 && a->gb_n <= MT__GB_CAP);
    if (a->gb == NULL)
        return local;
    if (a->gb_n + n > MT__GB_CAP)
        mt__alloc_gb_flush(a);
    return &a->gb[a->gb_n];
}

void mt__alloc_op_end(mt_alloc_t *a, mt_event_rec_t *ev, size_t n, bool now)
{
    if (a->gb == NULL) {
        emit_now(a, ev, n);
        return;
    }
    mt_assert(ev == &a->gb[a->gb_n] && a->gb_n + n <= MT__GB_CAP);
    if (a->gb_n == 0)
        a->gb_t0 = ev[0].time_ns;
    a->gb_n += (uint32_t)n;
    if (now || ev[n - 1].time_ns - a->gb_t0 >= MT__GB_NS)
        mt__alloc_gb_flush(a);
}
static void make_events(const mt__evb_hdr_t *h, const mt__evb_ent_t *ents, mt_event_rec_t *out)
{
    size_t n = mt__evb_make(h, ents, out);
    mt_assert(n == h->nev); /* the caches' own entries */
    (void)n;
}

/* A cache's batch takes its place in the sink's order under rec_lock, in O(1): the bytes
 * held before it (so each event's totals), its stamp and, when the sink claims (event.h),
 * its places. It is then copied outside the lock, in compact form when the sink takes it
 * (the events are made where they are read), so that two threads' batches copy at once.
 * A sink that cannot claim receives the events under the lock. */
void mt__alloc_emit_cached(mt_alloc_t *a, const mt__evb_ent_t *ents, size_t nent, size_t nev,
                           mt_event_rec_t *out, uint64_t now)
{
    const mt_event_sink_t *s = a->cfg.sink;
    int64_t d = 0; /* the change of the program's allocated bytes: of the held ones, -d */
    for (size_t i = 0; i < nent; i++)
        d += mt__evb_op_delta(&ents[i]);
    uint64_t tok[2];
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
    if (s->claim != NULL && s->claim(s->ud, nev, tok)) {
        rec_unlock(a);
        if (s->write_batch != NULL && mt__evb_slots(nent) <= nev) {
            s->write_batch(s->ud, tok, &h, ents);
            return;
        }
        make_events(&h, ents, out);
        s->write(s->ud, tok, out, nev);
        return;
    }
    make_events(&h, ents, out);
    push(a, out, nev);
    rec_unlock(a);
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

void mt__alloc_stats_due(mt_alloc_t *a, uint64_t t)
{
    if (__builtin_expect(a->stats_period_ns == 0 || t < a->stats_next_ns, 1))
        return;
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
