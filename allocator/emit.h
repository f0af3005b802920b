/* The allocator's one door to its event sink (emit.c; docs/telemetry.md): every event
 * leaves through mt__alloc_emit_recs, the global path's allocs and frees through
 * mt__alloc_emit_alloc/free (held back while a->gb), a thread cache's batches through
 * mt__alloc_emit_cached. Included by internal.h, after mt_alloc_t. */
#ifndef MT_ALLOCATOR_EMIT_H
#define MT_ALLOCATOR_EMIT_H

#include "util/clock.h"
#include "util/evbatch.h"

/* Sends one event to the sink, stamped t (0 = now). A free's free_requested and
 * free_completed share one stamp: one clock read per allocator operation. */
void mt__alloc_emit_slow(mt_alloc_t *a, int kind, uint64_t addr, uint64_t size, uint64_t requested,
                         uint32_t sid, int pool, int tag, uint64_t t);
/* Sends one event, stamped now; a single predictable branch when there is no sink. */
static inline void mt__alloc_emit(mt_alloc_t *a, int kind, uint64_t addr, uint64_t size,
                                  uint64_t requested, uint32_t sid, int pool, int tag)
{
    if (__builtin_expect(a->cfg.sink != NULL, 0))
        mt__alloc_emit_slow(a, kind, addr, size, requested, sid, pool, tag, 0);
}
/* ev, stamped t, with the totals of now (the counters'). */
void mt__alloc_fill_rec(const mt_alloc_t *a, mt_event_rec_t *ev, int kind, uint64_t addr,
                        uint64_t size, uint64_t requested, uint32_t sid, int pool, int tag,
                        uint64_t t);
/* The global path's events ev[0..n) (mu held), in one batch when the sink takes batches;
 * their totals made the program's while a->rec (ev's allocated and stamp may change). */
void mt__alloc_emit_recs(mt_alloc_t *a, mt_event_rec_t *ev, size_t n);
/* Hands the events held back to the sink (mu held). */
void mt__alloc_gb_flush(mt_alloc_t *a);
/* The invariants of the events held back (mt_alloc_t.gb, mu held); static text of the
 * first violation, or NULL. */
const char *mt__alloc_gb_check(const mt_alloc_t *a);
/* A thread cache's fast operations (a->rec; inside its exclusion, or with mu held and the
 * cache claimed): ents[0..nent), of nev events (util/evbatch.h), handed over with one stamp
 * (now, of the cache's own clock; made non-decreasing here) and the program's totals, in compact
 * form to a sink that takes it (write_batch), else as events made in out[0..nev). */
void mt__alloc_emit_cached(mt_alloc_t *a, const mt__evb_ent_t *ents, size_t nent, size_t nev,
                           mt_event_rec_t *out, uint64_t now);
/* A flush gave bytes held by a cache back to the bins (mu held, a->rec), the counters
 * lowered by as much, with no event: the program had freed them. */
void mt__alloc_rec_flushed(mt_alloc_t *a, int64_t bytes);
/* MT_EV_STATS stamped t: the totals, size = peak allocated bytes, requested = bytes
 * requested by the live allocations (mu held). */
void mt__alloc_emit_stats(mt_alloc_t *a, uint64_t t);
/* The periodic MT_EV_STATS (cfg.stats_period_ms), due from the stamp t of an event just
 * emitted: one compare per event, and an idle allocator sends none. */
void mt__alloc_stats_emit_due(mt_alloc_t *a, uint64_t t);
static inline void mt__alloc_stats_due(mt_alloc_t *a, uint64_t t)
{
    if (__builtin_expect(a->stats_period_ns != 0 && t >= a->stats_next_ns, 0))
        mt__alloc_stats_emit_due(a, t);
}

/* ---- the global path's allocs and frees (docs/telemetry.md, "The global path's events")
 * Held back as timed entries (util/evbatch.h) while a->gb, inline on the global path; one
 * by one (the _now functions, the same events) without it, or for a request that does not
 * fit an entry. */
enum { MT__GB_CAP = 64, MT__GB_NS = 200000 };
void mt__alloc_emit_alloc_now(mt_alloc_t *a, uint64_t addr, uint64_t size, uint64_t req,
                              uint32_t sid, int pool, int tag, uint32_t stack, uint64_t t);
void mt__alloc_emit_free_now(mt_alloc_t *a, uint64_t addr, uint64_t size, uint64_t req,
                             uint32_t sid, int pool, int tag, uint64_t t);

/* Room for n entries stamped t (mu held, a->gb): the ones held back handed over first when
 * they cannot share a batch with them (full, t MT__GB_NS after the first or before it,
 * other reserved bytes). */
static inline mt__evb_ent_t *mt__alloc_gb_room(mt_alloc_t *a, uint32_t n, uint64_t t)
{
    uint64_t res = (uint64_t)a->st.reserved_bytes[MT_STAT_ALL].current;
    if (a->gb_n != 0 && (a->gb_n + n > MT__GB_CAP || t - a->gb_t0 >= MT__GB_NS || res != a->gb_res))
        mt__alloc_gb_flush(a);
    if (a->gb_n == 0) {
        a->gb_t0 = t;
        a->gb_res = res;
    }
    return &a->gb[a->gb_n];
}

/* Entry e, each field stored and none read back (a struct built on the stack and copied
 * would be loaded from stores not yet drained). */
static inline void mt__alloc_gb_put(const mt_alloc_t *a, mt__evb_ent_t *e, unsigned op,
                                    uint64_t addr, uint64_t size, uint64_t req, uint32_t sid,
                                    int pool, int tag, uint64_t t)
{
    e->addr = addr;
    e->size = size;
    e->requested = req | (t - a->gb_t0) << MT__EVB_REQ_BITS;
    e->stream = sid;
    e->op = (uint8_t)(op | MT__EVB_TIMED);
    e->pool = (uint8_t)pool;
    e->tag = (uint8_t)tag;
    e->rep = 0;
}

/* A global allocation's events (mu held): its stack's ref (stack != 0) and its alloc, of
 * block [addr, +size) for req bytes, stamped now; out: a thread's cache took the block
 * (they go out at once, with the ones held back: its free may come in the cache's batch). */
static inline void mt__alloc_emit_alloc(mt_alloc_t *a, uint64_t addr, uint64_t size, uint64_t req,
                                        uint32_t sid, int pool, int tag, uint32_t stack, bool out)
{
    uint64_t t = mt__clock_now(&a->clk);
    if (a->gb == NULL || req >> MT__EVB_REQ_BITS != 0) {
        mt__alloc_emit_alloc_now(a, addr, size, req, sid, pool, tag, stack, t);
        return;
    }
    uint32_t n = stack != 0 ? 2 : 1;
    mt__evb_ent_t *e = mt__alloc_gb_room(a, n, t);
    if (stack != 0) /* its ref first, in the same batch */
        mt__alloc_gb_put(a, &e[0], MT__EVB_STACK, addr, stack, 0, sid, pool, tag, t);
    mt__alloc_gb_put(a, &e[n - 1], MT__EVB_POP, addr, size, req, sid, pool, tag, t);
    a->gb_n += n;
    a->gb_nev += n;
    a->gb_g = a->st.allocated_bytes[MT_STAT_ALL].current;
    if (out)
        mt__alloc_gb_flush(a);
    mt__alloc_stats_due(a, t);
}

/* A global free's events (mu held): free_requested (req != 0: the bytes requested), then
 * free_completed, stamped t (0 = now). */
static inline void mt__alloc_emit_free(mt_alloc_t *a, uint64_t addr, uint64_t size, uint64_t req,
                                       uint32_t sid, int pool, int tag, uint64_t t)
{
    t = t != 0 ? t : mt__clock_now(&a->clk);
    if (a->gb == NULL || req == 0 || req >> MT__EVB_REQ_BITS != 0) {
        mt__alloc_emit_free_now(a, addr, size, req, sid, pool, tag, t);
        return;
    }
    mt__alloc_gb_put(a, mt__alloc_gb_room(a, 1, t), MT__EVB_FREE, addr, size, req, sid, pool, tag,
                     t);
    a->gb_n++;
    a->gb_nev += 2;
    a->gb_g = a->st.allocated_bytes[MT_STAT_ALL].current;
    mt__alloc_stats_due(a, t);
}

#endif
