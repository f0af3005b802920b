/* The segment map: the device memory an allocator holds, as the event stream describes it.
 * The one reading of segment_alloc/free and segment_map/unmap, shared by the analysis model
 * and the recorder's OOM snapshot (docs/oom-snapshot.md).
 *
 * A segment or a mapping at [addr, addr + size) first cuts whatever overlapped it (that is
 * proved gone). Mapped pages that touch mapped pages of the same device, pool and stream
 * on either side join them: the allocator maps at a run's end, at its start, or into the gap
 * between two runs (which then become one), and an expandable segment is one maximal run
 * of mapped pages, as in the allocator's snapshot. A free or an unmap cuts its range out of
 * whatever it overlaps: the start, the end or the middle of a segment (a run whose middle
 * pages are unmapped becomes two).
 *
 * The segments are kept in an ordered map (util/btree.h): add, cut, find and remove cost
 * O(log n) plus the segments they cut, whatever the order the addresses come in. */
#ifndef MT_UTIL_SEGMAP_H
#define MT_UTIL_SEGMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/btree.h"

typedef struct mt__seg_s {
    uint64_t addr, size; /* bytes; size > 0 */
    uint32_t stream;     /* mt_stream_id of the events */
    uint8_t device;      /* the events' device */
    uint8_t pool;        /* mt_pool_e */
    uint8_t mapped;      /* 1: mapped pages of an expandable segment, 0: a plain segment */
    uint8_t uncertain;   /* known before a gap and not seen since (the model's; never joined) */
} mt__seg_t;

/* Invariants (mt__segmap_check): t holds util/btree.h's invariants, its records the
 * segments that start below 2^64 - 1, keyed by addr; top[0..ntop) (ntop <= captop) are those
 * that start at 2^64 - 1, newest first (ends are reckoned in 64 bits, saturated: these hold
 * no byte, nothing cuts them, and several may coexist, as in the sorted array before the
 * tree); the segments in address order (t's, then top's) are disjoint (an end past 2^64
 * counts as 2^64), size > 0; bytes = sum of size; unc = sum of size over uncertain ones;
 * unc <= bytes. */
typedef struct mt__segmap_s {
    mt__bt_t t;              /* the segments by addr (record size set at the first add) */
    mt__seg_t *top;          /* the segments at 2^64 - 1; captop allocated */
    size_t ntop, captop;     /* entries */
    unsigned __int128 bytes; /* bytes of all segments */
    unsigned __int128 unc;   /* bytes of uncertain ones */
} mt__segmap_t;

/* A position in the map: one segment, or the end. mt__segmap_add, _cut and _remove
 * invalidate every position but the one _remove returns; _set_uncertain none. */
typedef struct mt__segmap_it_s {
    mt__bt_cur_t c;        /* a segment of t, or the end of t's */
    size_t i;              /* at the end of t's: top[i] (ntop: the end) */
    const mt__segmap_t *m; /* the map */
} mt__segmap_it_t;

/* A zeroed mt__segmap_t is an empty map. Frees its memory and empties it. */
void mt__segmap_fini(mt__segmap_t *m);
/* Adds s (copied), after cutting what it overlaps; mapped pages join touching runs. 0 or
 * MT_ENOMEM (the map then lacks s, and still holds its invariants). size 0: nothing. */
int mt__segmap_add(mt__segmap_t *m, const mt__seg_t *s);
/* Removes [addr, addr + size) from whatever it overlaps. 0 or MT_ENOMEM (a split's right
 * part could not be kept: the map holds less than it should, and its invariants). */
int mt__segmap_cut(mt__segmap_t *m, uint64_t addr, uint64_t size);
/* The first segment, in address order (the end when none). */
mt__segmap_it_t mt__segmap_first(const mt__segmap_t *m);
/* The first segment that starts at or after addr (the end when none). */
mt__segmap_it_t mt__segmap_lower(const mt__segmap_t *m, uint64_t addr);
/* The first segment that starts at addr, else the one holding addr, else the end. */
mt__segmap_it_t mt__segmap_find(const mt__segmap_t *m, uint64_t addr);
/* Removes the segment at it (not the end); returns the position of the one after it. */
mt__segmap_it_t mt__segmap_remove(mt__segmap_t *m, mt__segmap_it_t it);
/* Walks the invariants: 0, or MT_EPROTO with the first violation in why (may be NULL). */
int mt__segmap_check(const mt__segmap_t *m, char *why, size_t whylen);

/* Segments held. */
static inline size_t mt__segmap_count(const mt__segmap_t *m)
{
    return m->t.n + m->ntop;
}

/* The segment at it (borrowed until the map changes; change it through the calls above
 * only), or NULL at the end. */
static inline const mt__seg_t *mt__segmap_get(mt__segmap_it_t it)
{
    if (!mt__bt_end(it.c))
        return (const mt__seg_t *)mt__bt_get(it.c);
    return it.m != NULL && it.i < it.m->ntop ? &it.m->top[it.i] : NULL;
}

static inline bool mt__segmap_end(mt__segmap_it_t it)
{
    return mt__segmap_get(it) == NULL;
}

/* Steps to the next segment in address order (from the last to the end). */
static inline void mt__segmap_next(mt__segmap_it_t *it)
{
    if (!mt__bt_end(it->c))
        mt__bt_next(&it->c); /* from t's last to top[0] (i is 0 while in t) */
    else if (it->m != NULL && it->i < it->m->ntop)
        it->i++;
}

/* Sets the uncertain flag of the segment at it, keeping unc. */
static inline void mt__segmap_set_uncertain(mt__segmap_t *m, mt__segmap_it_t it, bool uncertain)
{
    mt__seg_t *s = (mt__seg_t *)mt__segmap_get(it);
    if (s->uncertain == uncertain)
        return;
    if (uncertain)
        m->unc += s->size;
    else
        m->unc -= s->size;
    s->uncertain = uncertain;
}

#endif
