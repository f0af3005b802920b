/* Walking one device's trace of a snapshot (internal to the snapshot conversions,
 * torch_snapshot_conv.c): the live blocks by address, the one reading of the trace's
 * meaning, and what was there before the trace began (torch_snapshot_walk.c). */
#ifndef MT_ANALYSIS_TORCH_SNAPSHOT_WALK_H
#define MT_ANALYSIS_TORCH_SNAPSHOT_WALK_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "analysis/torch_snapshot.h"
#include "memtrace/common.h"
#include "memtrace/event.h"
#include "util/addrmap.h"
#include "util/grow.h"

/* ---- live blocks by address: a dense array indexed by util's address table ---- */

typedef struct live_s {
    uint64_t addr;  /* > 1 (addresses 0 and 1 are never blocks) */
    uint64_t size;  /* requested bytes */
    uint32_t slot;  /* trace slot */
    uint32_t stack; /* call stack */
    uint8_t freed;  /* free_requested seen, free_completed not yet */
} live_t;

/* Invariants: v[0..n) distinct addresses, in no order; at maps each one's addr to its index
 * (at.n = n); n <= cap. A zeroed livemap_t is empty. */
typedef struct livemap_s {
    live_t *v;
    size_t n, cap;
    mt__amap_t at;
} livemap_t;

static inline void lm_fini(livemap_t *m)
{
    free(m->v);
    mt__amap_fini(&m->at);
    *m = (livemap_t){0};
}

/* The entry of addr, or NULL. Borrowed until the next lm_insert or lm_erase. */
static inline live_t *lm_find(livemap_t *m, uint64_t addr)
{
    uint64_t i;
    return mt__amap_get(&m->at, addr, &i) == 0 ? &m->v[i] : NULL;
}

/* A new zeroed entry for addr (none must exist), or NULL (no memory). */
static inline live_t *lm_insert(livemap_t *m, uint64_t addr)
{
    live_t *v = mt__grow(m->v, &m->cap, m->n + 1, sizeof *v, 1024);
    if (v == NULL)
        return NULL;
    m->v = v;
    if (mt__amap_put(&m->at, addr, m->n) != 0)
        return NULL;
    m->v[m->n] = (live_t){.addr = addr};
    return &m->v[m->n++];
}

/* Removes e; the last entry moves into its place. */
static inline void lm_erase(livemap_t *m, live_t *e)
{
    size_t i = (size_t)(e - m->v);
    (void)mt__amap_del(&m->at, e->addr);
    if (i < --m->n) {
        m->v[i] = m->v[m->n];
        (void)mt__amap_put(&m->at, m->v[i].addr, i); /* replaces: no allocation */
    }
}

/* ---- walking one device's trace ----
 * The one reading of the trace's meaning, shared by every conversion: an alloc opens a
 * block, the first of free_requested / free_completed closes it (the other is then
 * absorbed), a free of an unknown block is an orphan from before the trace began. */

typedef struct walk_s {
    livemap_t live;
    uint32_t nslots;
} walk_t;

enum { W_SKIP = 0, W_OPEN = 1, W_CLOSE = 2 };

/* What event e does to the live blocks: W_OPEN (*l the new block), W_CLOSE (*l the block,
 * erase it after use with lm_erase), or W_SKIP. MT_ENOMEM. */
static inline int walk_step(walk_t *w, const mt_ts_event_t *e, live_t **l, bool *orphan)
{
    *orphan = false;
    *l = NULL;
    live_t *x;
    switch (e->action) {
    case MT_TS_ALLOC:
        if ((x = lm_find(&w->live, e->addr)) != NULL)
            lm_erase(&w->live, x); /* a block whose free_completed was not recorded */
        if (e->addr <= 1 || (x = lm_insert(&w->live, e->addr)) == NULL)
            return e->addr <= 1 ? W_SKIP : MT_ENOMEM;
        x->size = e->size;
        x->slot = w->nslots++;
        x->stack = e->stack;
        *l = x;
        return W_OPEN;
    case MT_TS_FREE_REQUESTED:
    case MT_TS_FREE_COMPLETED:
        x = lm_find(&w->live, e->addr);
        if (x == NULL) {
            /* Allocated before the trace began. Its free_completed is absorbed too. */
            *orphan = true;
            if (e->action == MT_TS_FREE_REQUESTED && e->addr > 1) {
                if ((x = lm_insert(&w->live, e->addr)) == NULL)
                    return MT_ENOMEM;
                x->freed = 1;
            }
            return W_SKIP;
        }
        if (x->freed) { /* the free_completed after its free_requested */
            lm_erase(&w->live, x);
            return W_SKIP;
        }
        if (e->action == MT_TS_FREE_REQUESTED)
            x->freed = 1; /* kept until free_completed, to absorb it */
        *l = x;
        return W_CLOSE;
    default:
        return W_SKIP;
    }
}

static inline uint64_t round_block(uint64_t requested)
{
    return requested <= 512 ? 512 : (requested + 511) & ~(uint64_t)511;
}

static inline const mt_ts_event_t *dev_events(const mt_ts_t *ts, unsigned d, size_t *n)
{
    if (d >= ts->ndevices) {
        *n = 0;
        return NULL;
    }
    *n = ts->dev_first[d + 1] - ts->dev_first[d];
    return ts->events + ts->dev_first[d];
}

/* ---- the expandable segments at the end (torch_snapshot_walk.c) ----
 * Invariants: v[0..n) are the device's expandable segments of non-zero size, by address. */
typedef struct mt_ts_xsegs_s {
    const mt_ts_segment_t **v;
    size_t n;
} mt_ts_xsegs_t;

/* Device d's expandable segments at the end into *out (mt__ts_xsegs_fini). 0 or MT_ENOMEM. */
int mt__ts_xsegs(const mt_ts_t *ts, unsigned device, mt_ts_xsegs_t *out);
void mt__ts_xsegs_fini(mt_ts_xsegs_t *x);
/* The one holding addr (the last starting at or below it), or NULL. */
const mt_ts_segment_t *mt__ts_xseg_holding(const mt_ts_xsegs_t *x, uint64_t addr);

/* ---- what was there before the trace began (torch_snapshot_walk.c) ----
 * PyTorch keeps a device's last max_entries events only, so a trace mostly starts in the
 * middle of a run, after its weights and many segments were made. As memory_viz reads a
 * snapshot, what was there then is: the segments at the end that no segment_alloc of the
 * trace made, with those the trace frees without having made them; the blocks allocated
 * at the end that the trace did not allocate, with those it frees without having allocated
 * them. Expandable pages were mapped then where the first of the trace's maps and unmaps
 * to touch them is an unmap, or none touches them and they are mapped at the end.
 * A block whose free_completed the trace holds without its free_requested was asked free
 * before it: active then, not allocated (pending).
 * Invariants: recs[0..nsegs) are segment_allocs (segment_maps: runs of expandable pages)
 * in address order, recs[nsegs..nsegs + npending) the pending blocks' allocs and
 * recs[nsegs + npending..n) the other blocks', each part in address order, each with
 * device, stream, pool and its running totals (allocated, reserved, from 0; a pending one's
 * allocated holds it, the next does not) set and seq, time_ns 0; stacks[i] is recs[i]'s
 * stack id and streams[i] its stream; allocated and reserved are the totals after the last
 * (allocated = the sizes of recs[nsegs + npending..n)). */
typedef struct mt_ts_pre_s {
    mt_event_rec_t *recs;
    uint32_t *stacks;
    int64_t *streams; /* streams[i]: recs[i]'s stream as the file gives it (a cudaStream_t) */
    size_t n, nsegs, npending;
    size_t norphans; /* blocks of them the trace frees (the rest are allocated at its end) */
    uint64_t allocated, reserved;
    /* the trace's allocs still allocated at the end: walk slot + 1 -> the block's bytes
     * there (the trace itself has only the request) */
    mt__amap_t end_size;
} mt_ts_pre_t;

/* Device d's state before its trace, into *out (mt__ts_pre_fini). 0 or MT_ENOMEM. */
int mt__ts_pre_state(const mt_ts_t *ts, unsigned device, mt_ts_pre_t *out);
void mt__ts_pre_fini(mt_ts_pre_t *p);
/* Opens p's blocks in w, as if their allocs had been walked but taking no slot (sizes: the
 * blocks' bytes, or their requests when requested); the pending ones marked freed, as after
 * their free_requested. 0 or MT_ENOMEM. */
int mt__ts_pre_open(const mt_ts_pre_t *p, walk_t *w, bool requested);

#endif
