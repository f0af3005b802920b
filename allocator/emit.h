/* The allocator's one door to its event sink (emit.c; docs/telemetry.md): every event
 * leaves through mt__alloc_emit_recs, the global path's allocs and frees through
 * mt__alloc_emit_alloc/free (held back while a->gb), a thread cache's batches through
 * mt__alloc_emit_cached. Included by internal.h, after mt_alloc_t. */
#ifndef MT_ALLOCATOR_EMIT_H
#define MT_ALLOCATOR_EMIT_H

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
/* A global allocation's events (mu held): its stack's ref (stack != 0) and its alloc, of
 * block [addr, +size) for req bytes, stamped now; out: a thread's cache took the block
 * (they go out at once, with the ones held back). */
enum { MT__GB_CAP = 64, MT__GB_NS = 200000 };
void mt__alloc_emit_alloc(mt_alloc_t *a, uint64_t addr, uint64_t size, uint64_t req, uint32_t sid,
                          int pool, int tag, uint32_t stack, bool out);
/* A global free's events (mu held): free_requested (req != 0: the bytes requested), then
 * free_completed, stamped t (0 = now). Both are held back while a->gb
 * (docs/telemetry.md, "The global path's events"). */
void mt__alloc_emit_free(mt_alloc_t *a, uint64_t addr, uint64_t size, uint64_t req, uint32_t sid,
                         int pool, int tag, uint64_t t);
/* Hands the events held back to the sink (mu held). */
void mt__alloc_gb_flush(mt_alloc_t *a);
/* A thread cache's fast operations (a->rec; inside its exclusion, or with mu held and the
 * cache claimed): ents[0..nent), of nev events (util/evbatch.h), handed over with one stamp
 * (now, of the cache's own clock; made non-decreasing here) and the program's totals, in compact
 * form to a sink that takes it (write_batch), else as events made in out[0..nev). */
struct mt__evb_ent_s;
void mt__alloc_emit_cached(mt_alloc_t *a, const struct mt__evb_ent_s *ents, size_t nent, size_t nev,
                           mt_event_rec_t *out, uint64_t now);
/* A flush gave bytes held by a cache back to the bins (mu held, a->rec), the counters
 * lowered by as much, with no event: the program had freed them. */
void mt__alloc_rec_flushed(mt_alloc_t *a, int64_t bytes);
/* MT_EV_STATS stamped t: the totals, size = peak allocated bytes, requested = bytes
 * requested by the live allocations (mu held). */
void mt__alloc_emit_stats(mt_alloc_t *a, uint64_t t);
/* The periodic MT_EV_STATS (cfg.stats_period_ms), due from the stamp t of an event just
 * emitted: one compare per event, and an idle allocator sends none. */
void mt__alloc_stats_due(mt_alloc_t *a, uint64_t t);

#endif
