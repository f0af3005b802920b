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
#include "util/btree.h"

/* A segment as the viewer keeps it: [addr, end) on a stream. */
typedef struct vseg_s {
    uint64_t addr, end;
    int64_t stream;
} vseg_t;

/* Invariants: t holds util/btree.h's, its records vseg_t keyed by addr; they lie apart and
 * are not empty (a device's segments at the end lie apart, and the walk adds only one that
 * meets none). A zeroed list is empty. An ordered map, not a sorted array: a memmove per
 * segment undone was quadratic on logs of many segments. */
typedef struct vsegs_s {
    mt__bt_t t;
} vsegs_t;

static vseg_t *vs_get(mt__bt_cur_t c)
{
    return (vseg_t *)mt__bt_get(c);
}

/* The segment holding [addr, end), or the end. */
static mt__bt_cur_t vs_holding(const vsegs_t *s, uint64_t addr, uint64_t end)
{
    mt__bt_cur_t c = mt__bt_floor(&s->t, addr);
    const vseg_t *g = vs_get(c);
    return g != NULL && addr < g->end && end <= g->end ? c : (mt__bt_cur_t){0};
}

/* Adds g, which meets none; join: merged with a neighbour it touches on its stream (an
 * unmap undone). 0 or MT_ENOMEM. */
static int vs_insert(vsegs_t *s, vseg_t g, bool join)
{
    if (join) {
        mt__bt_cur_t nc = mt__bt_lower(&s->t, g.addr), pc = nc;
        mt__bt_prev(&s->t, &pc);
        vseg_t *prev = vs_get(pc), *next = vs_get(nc);
        bool with_next = next != NULL && next->addr == g.end && next->stream == g.stream;
        if (prev != NULL && prev->end == g.addr && prev->stream == g.stream) {
            prev->end = with_next ? next->end : g.end;
            if (with_next)
                (void)mt__bt_erase(&s->t, nc);
            return 0;
        }
        if (with_next) {
            mt__bt_rekey(&s->t, nc, g.addr);
            return 0;
        }
    }
    if (s->t.rsize == 0)
        mt__bt_init(&s->t, sizeof g);
    int rc = mt__bt_insert(&s->t, &g, NULL);
    mt_assert(rc != MT_EINVAL); /* g meets no segment */
    return rc;
}

/* Whether [addr, end) meets a segment. */
static bool vs_meets(const vsegs_t *s, uint64_t addr, uint64_t end)
{
    mt__bt_cur_t c = mt__bt_floor(&s->t, addr), after = c;
    if (mt__bt_end(after))
        after = mt__bt_first(&s->t);
    else
        mt__bt_next(&after);
    return (vs_get(c) != NULL && vs_get(c)->end > addr) ||
           (vs_get(after) != NULL && vs_get(after)->addr < end);
}

/* The live blocks by address, for "does one start in [addr, end)": a Fenwick tree of counts
 * over the sorted addresses a block can live at (the end state's blocks and the addresses
 * the walk revives: free_completed entries). O(log n) per change and query; a scan of the
 * live blocks at each segment entry was quadratic on long expandable-segment runs.
 * Invariants: key[0..n) ascending and distinct; fw is the Fenwick tree of cnt[0..n), where
 * cnt[i] = 1 if a block at key[i] is live (in the walk's livemap), else 0. */
typedef struct vlive_s {
    uint64_t *key;
    uint32_t *fw; /* 1-based */
    size_t n;
} vlive_t;

static int u64_cmp(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* The first key >= addr (n when none). */
static size_t vl_lower(const vlive_t *t, uint64_t addr)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->key[mid] < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* cnt[key of addr] += d (addr one of the keys). */
static void vl_add(vlive_t *t, uint64_t addr, int d)
{
    size_t i = vl_lower(t, addr);
    mt_assert(i < t->n && t->key[i] == addr);
    for (i++; i <= t->n; i += i & (~i + 1))
        t->fw[i] += (uint32_t)d;
}

/* cnt[0..i) summed. */
static uint32_t vl_prefix(const vlive_t *t, size_t i)
{
    uint32_t sum = 0;
    for (; i > 0; i -= i & (~i + 1))
        sum += t->fw[i];
    return sum;
}

/* Whether a live block starts in [addr, end). */
static bool live_in(const vlive_t *t, uint64_t addr, uint64_t end)
{
    return addr < end && vl_prefix(t, vl_lower(t, end)) != vl_prefix(t, vl_lower(t, addr));
}

/* The keys of device d: its end state's blocks and its free_completed entries' addresses.
 * 0 or MT_ENOMEM. */
static int vl_init(vlive_t *t, const mt_ts_t *ts, unsigned d, const mt_ts_event_t *ev, size_t n)
{
    size_t cap = n;
    for (size_t i = 0; i < ts->nsegments; i++)
        if ((unsigned)ts->segments[i].device == d)
            cap += ts->segments[i].nblocks;
    *t = (vlive_t){0};
    t->key = malloc((cap + 1) * sizeof *t->key);
    if (t->key == NULL)
        return MT_ENOMEM;
    for (size_t i = 0; i < ts->nsegments; i++) {
        const mt_ts_segment_t *g = &ts->segments[i];
        for (uint32_t k = 0; (unsigned)g->device == d && k < g->nblocks; k++)
            t->key[t->n++] = ts->blocks[g->first_block + k].addr;
    }
    for (size_t i = 0; i < n; i++)
        if (ev[i].action == MT_TS_FREE_COMPLETED)
            t->key[t->n++] = ev[i].addr;
    qsort(t->key, t->n, sizeof *t->key, u64_cmp);
    size_t w = 0;
    for (size_t i = 0; i < t->n; i++)
        if (w == 0 || t->key[i] != t->key[w - 1])
            t->key[w++] = t->key[i];
    t->n = w;
    t->fw = calloc(t->n + 1, sizeof *t->fw);
    return t->fw != NULL ? 0 : MT_ENOMEM;
}

static void vl_fini(vlive_t *t)
{
    free(t->key);
    free(t->fw);
    *t = (vlive_t){0};
}

/* The segments and live blocks of device d at the end, as the viewer starts. */
static int start(const mt_ts_t *ts, unsigned d, vsegs_t *s, livemap_t *live, vlive_t *by)
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
            vl_add(by, b->addr, 1);
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
    vlive_t by = {0};
    int rc = vl_init(&by, ts, d, ev, n);
    if (rc == 0)
        rc = start(ts, d, &s, &live, &by);
    for (size_t j = n; rc == 0 && j > 0; j--) {
        size_t i = j - 1;
        const mt_ts_event_t *e = &ev[i];
        uint64_t end = mt_model_sat_add(e->addr, e->size);
        live_t *l = NULL;
        mt__bt_cur_t k;
        vseg_t *g;
        switch (e->action) {
        case MT_TS_FREE_COMPLETED: {
            /* the viewer reads a free_requested right before it as one free */
            bool pair =
                i > 0 && ev[i - 1].action == MT_TS_FREE_REQUESTED && ev[i - 1].addr == e->addr;
            if (mt__bt_end(vs_holding(&s, e->addr, mt_model_sat_add(e->addr, 1)))) {
                keep[i] = false;
                if (pair)
                    keep[i - 1] = false;
            } else if ((l = lm_find(&live, e->addr)) != NULL) {
                l->freed = !pair;
            } else if ((l = lm_insert(&live, e->addr)) != NULL) {
                l->freed = !pair;
                vl_add(&by, e->addr, 1);
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
            if ((l = lm_find(&live, e->addr)) != NULL) {
                lm_erase(&live, l);
                vl_add(&by, e->addr, -1);
            }
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
            g = vs_get(k);
            if (g == NULL || g->addr != e->addr || live_in(&by, g->addr, g->end))
                keep[i] = false;
            else
                (void)mt__bt_erase(&s.t, k);
            break;
        case MT_TS_SEGMENT_MAP:
            k = vs_holding(&s, e->addr, end);
            g = vs_get(k);
            if (g == NULL || live_in(&by, e->addr, end)) {
                keep[i] = false;
            } else if (g->addr == e->addr) {
                if (end == g->end)
                    (void)mt__bt_erase(&s.t, k);
                else
                    mt__bt_rekey(&s.t, k, end); /* its start undone */
            } else if (g->end == end) {
                g->end = e->addr;
            } else {
                vseg_t upper = {end, g->end, g->stream};
                g->end = e->addr;
                rc = vs_insert(&s, upper, false);
            }
            break;
        default:
            break;
        }
    }
    mt__bt_fini(&s.t);
    lm_fini(&live);
    vl_fini(&by);
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
