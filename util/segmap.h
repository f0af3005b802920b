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
 * pages are unmapped becomes two). */
#ifndef MT_UTIL_SEGMAP_H
#define MT_UTIL_SEGMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct mt__seg_s {
    uint64_t addr, size; /* bytes; size > 0 */
    uint32_t stream;     /* mt_stream_id of the events */
    uint8_t device;      /* the events' device */
    uint8_t pool;        /* mt_pool_e */
    uint8_t mapped;      /* 1: mapped pages of an expandable segment, 0: a plain segment */
    uint8_t uncertain;   /* known before a gap and not seen since (the model's; never joined) */
} mt__seg_t;

/* Invariants (mt__segmap_check): v[0..n) sorted by addr, disjoint (an end past 2^64 counts
 * as 2^64), size > 0; n <= cap; bytes = sum of size; unc = sum of size over uncertain ones;
 * unc <= bytes. */
typedef struct mt__segmap_s {
    mt__seg_t *v;            /* n entries, by addr; cap allocated */
    size_t n, cap;           /* entries */
    unsigned __int128 bytes; /* bytes of all segments */
    unsigned __int128 unc;   /* bytes of uncertain ones */
} mt__segmap_t;

/* A zeroed mt__segmap_t is an empty map. Frees its memory and empties it. */
void mt__segmap_fini(mt__segmap_t *m);
/* Adds s (copied), after cutting what it overlaps; mapped pages join touching runs. 0 or
 * MT_ENOMEM (the map then lacks s, and still holds its invariants). size 0: nothing. */
int mt__segmap_add(mt__segmap_t *m, const mt__seg_t *s);
/* Removes [addr, addr + size) from whatever it overlaps. 0 or MT_ENOMEM (a split's right
 * part could not be kept: the map holds less than it should, and its invariants). */
int mt__segmap_cut(mt__segmap_t *m, uint64_t addr, uint64_t size);
/* First index whose segment starts at or after addr (n when none). */
size_t mt__segmap_lower(const mt__segmap_t *m, uint64_t addr);
/* Index of the segment holding addr, or -1. */
ptrdiff_t mt__segmap_find(const mt__segmap_t *m, uint64_t addr);
/* Removes entry i (< n). */
void mt__segmap_remove_at(mt__segmap_t *m, size_t i);
/* Sets entry i's uncertain flag, keeping unc. */
void mt__segmap_set_uncertain(mt__segmap_t *m, size_t i, bool uncertain);
/* Walks the invariants: 0, or MT_EPROTO with the first violation in why (may be NULL). */
int mt__segmap_check(const mt__segmap_t *m, char *why, size_t whylen);

#endif
