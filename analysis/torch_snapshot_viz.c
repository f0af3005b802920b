/* A trace that PyTorch's memory_viz can draw (torch_snapshot.h, mt__ts_viz_safe).
 *
 * Its state view ("Allocator State History") starts from the segments and blocks at the
 * end and undoes the trace's entries from the last to the one selected; each state must be
 * one it can draw (docs/torch-snapshot.md, "What memory_viz needs of a trace"). A log that
 * lost events breaks that: a free_requested undone with no block, a free undone outside
 * every segment, a segment undone with blocks still in it. The walk here undoes the trace
 * as the viewer does and leaves out each entry it could not undo. */
#include <stdlib.h>
#include <string.h>

#include "analysis/torch_snapshot.h"
#include "analysis/torch_snapshot_walk.h"

/* A segment as the viewer keeps it: [addr, end) on a stream. */
typedef struct vseg_s {
    uint64_t addr, end;
    int64_t stream;
} vseg_t;

/* Invariants: v[0..n) sorted by addr; n <= cap. A zeroed list is empty. */
typedef struct vsegs_s {
    vseg_t *v;
    size_t n, cap;
} vsegs_t;

/* The first segment starting above addr (n when none). */
static size_t vs_above(const vsegs_t *s, uint64_t addr)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->v[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The index of the segment holding [addr, end), or SIZE_MAX. */
static size_t vs_holding(const vsegs_t *s, uint64_t addr, uint64_t end)
{
    size_t i = vs_above(s, addr);
    return i > 0 && addr < s->v[i - 1].end && end <= s->v[i - 1].end ? i - 1 : SIZE_MAX;
}

static void vs_remove(vsegs_t *s, size_t i)
{
    memmove(&s->v[i], &s->v[i + 1], (s->n - i - 1) * sizeof *s->v);
    s->n--;
}

/* Adds g in order; join: merged with a neighbour it touches on its stream (an unmap
 * undone). 0 or MT_ENOMEM. */
static int vs_insert(vsegs_t *s, vseg_t g, bool join)
{
    vseg_t *v = mt__grow(s->v, &s->cap, s->n + 1, sizeof *v, 64);
    if (v == NULL)
        return MT_ENOMEM;
    s->v = v;
    size_t i = vs_above(s, g.addr);
    memmove(&s->v[i + 1], &s->v[i], (s->n - i) * sizeof *s->v);
    s->v[i] = g;
    s->n++;
    if (!join)
        return 0;
    if (i + 1 < s->n && s->v[i + 1].addr == g.end && s->v[i + 1].stream == g.stream) {
        s->v[i].end = s->v[i + 1].end;
        vs_remove(s, i + 1);
    }
    if (i > 0 && s->v[i - 1].end == g.addr && s->v[i - 1].stream == g.stream) {
        s->v[i - 1].end = s->v[i].end;
        vs_remove(s, i);
    }
    return 0;
}

/* Whether [addr, end) meets a segment. */
static bool vs_meets(const vsegs_t *s, uint64_t addr, uint64_t end)
{
    size_t i = vs_above(s, addr);
    return (i > 0 && s->v[i - 1].end > addr) || (i < s->n && s->v[i].addr < end);
}

/* Whether a live block starts in [addr, end) (a scan: segment entries are few). */
static bool live_in(const livemap_t *m, uint64_t addr, uint64_t end)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->v[i].addr >= addr && m->v[i].addr < end)
            return true;
    return false;
}

/* The segments and live blocks of device d at the end, as the viewer starts. */
static int start(const mt_ts_t *ts, unsigned d, vsegs_t *s, livemap_t *live)
{
    for (size_t i = 0; i < ts->nsegments; i++) {
        const mt_ts_segment_t *g = &ts->segments[i];
        if ((unsigned)g->device != d)
            continue;
        int rc = vs_insert(
            s, (vseg_t){g->addr, mt_model_sat_add(g->addr, g->total_size), g->stream}, false);
        for (uint32_t k = 0; rc == 0 && k < g->nblocks; k++) {
            const mt_ts_block_t *b = &ts->blocks[g->first_block + k];
            if (b->state == MT_TS_INACTIVE || lm_find(live, b->addr) != NULL)
                continue;
            live_t *l = lm_insert(live, b->addr);
            if (l == NULL)
                return MT_ENOMEM;
            l->freed = b->state == MT_TS_ACTIVE_PENDING_FREE;
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Undoes device d's entries ev[0..n) from the last, clearing keep[i] for each it cannot.
 * 0 or MT_ENOMEM. */
static int walk(const mt_ts_t *ts, unsigned d, const mt_ts_event_t *ev, size_t n, bool *keep)
{
    vsegs_t s = {0};
    livemap_t live = {0};
    int rc = start(ts, d, &s, &live);
    for (size_t j = n; rc == 0 && j > 0; j--) {
        size_t i = j - 1;
        const mt_ts_event_t *e = &ev[i];
        uint64_t end = mt_model_sat_add(e->addr, e->size);
        live_t *l = NULL;
        size_t k;
        switch (e->action) {
        case MT_TS_FREE_COMPLETED: {
            /* the viewer reads a free_requested right before it as one free */
            bool pair =
                i > 0 && ev[i - 1].action == MT_TS_FREE_REQUESTED && ev[i - 1].addr == e->addr;
            if (vs_holding(&s, e->addr, mt_model_sat_add(e->addr, 1)) == SIZE_MAX) {
                keep[i] = false;
                if (pair)
                    keep[i - 1] = false;
            } else if ((l = lm_find(&live, e->addr)) != NULL ||
                       (l = lm_insert(&live, e->addr)) != NULL) {
                l->freed = !pair;
            } else {
                rc = MT_ENOMEM;
            }
            if (pair)
                j--;
            break;
        }
        case MT_TS_FREE_REQUESTED:
            if ((l = lm_find(&live, e->addr)) == NULL)
                keep[i] = false;
            else
                l->freed = 0;
            break;
        case MT_TS_ALLOC:
            if ((l = lm_find(&live, e->addr)) != NULL)
                lm_erase(&live, l);
            break;
        case MT_TS_SEGMENT_FREE:
        case MT_TS_SEGMENT_UNMAP:
            /* the viewer would lay it over a segment it still has: its blocks then fall in
             * neither (its search assumes segments apart) */
            if (vs_meets(&s, e->addr, end))
                keep[i] = false;
            else if (e->size > 0)
                rc = vs_insert(&s, (vseg_t){e->addr, end, e->stream},
                               e->action == MT_TS_SEGMENT_UNMAP);
            break;
        case MT_TS_SEGMENT_ALLOC:
            k = vs_holding(&s, e->addr, mt_model_sat_add(e->addr, 1));
            if (k == SIZE_MAX || s.v[k].addr != e->addr || live_in(&live, s.v[k].addr, s.v[k].end))
                keep[i] = false;
            else
                vs_remove(&s, k);
            break;
        case MT_TS_SEGMENT_MAP:
            k = vs_holding(&s, e->addr, end);
            if (k == SIZE_MAX || live_in(&live, e->addr, end)) {
                keep[i] = false;
            } else if (s.v[k].addr == e->addr) {
                s.v[k].addr = end;
                if (s.v[k].addr == s.v[k].end)
                    vs_remove(&s, k);
            } else if (s.v[k].end == end) {
                s.v[k].end = e->addr;
            } else {
                vseg_t upper = {end, s.v[k].end, s.v[k].stream};
                s.v[k].end = e->addr;
                rc = vs_insert(&s, upper, false);
            }
            break;
        default:
            break;
        }
    }
    free(s.v);
    lm_fini(&live);
    return rc;
}

int mt__ts_viz_safe(mt_ts_t *ts, size_t *dropped)
{
    *dropped = 0;
    if (ts->nevents == 0)
        return 0;
    bool *keep = malloc(ts->nevents * sizeof *keep);
    if (keep == NULL)
        return MT_ENOMEM;
    memset(keep, 1, ts->nevents * sizeof *keep);
    int rc = 0;
    for (unsigned d = 0; d < ts->ndevices && rc == 0; d++)
        rc = walk(ts, d, ts->events + ts->dev_first[d], ts->dev_first[d + 1] - ts->dev_first[d],
                  keep + ts->dev_first[d]);
    if (rc == 0) {
        size_t w = 0;
        for (unsigned d = 0; d < ts->ndevices; d++) {
            size_t first = ts->dev_first[d], last = ts->dev_first[d + 1];
            ts->dev_first[d] = (uint32_t)w;
            for (size_t i = first; i < last; i++)
                if (keep[i])
                    ts->events[w++] = ts->events[i];
        }
        ts->dev_first[ts->ndevices] = (uint32_t)w;
        *dropped = ts->nevents - w;
        ts->nevents = w;
    }
    free(keep);
    return rc;
}
