/* Why reserved exceeds allocated: the gap reserved - allocated of one class of memory at one
 * moment, split by cause from the model's segment map (docs/analysis.md, "The gap"). One
 * definition for `memtrace report` (peak_gap, end_gap) and the daemon's /state.
 *
 * Causes, each in bytes, over the map's segments:
 *   pinned_free       free bytes of (non-expandable) segments that also hold a live block:
 *                     the live blocks keep the segment, so its free bytes cannot go back;
 *   cached_segments   whole (non-expandable) segments without any block, kept by the cache;
 *   stream_pending    blocks freed by the program and waiting on stream events, and the free
 *                     bytes of segments that only such blocks hold;
 *   expandable_slack  free bytes of mapped pages of expandable segments;
 *   untracked         the rest: reserved - allocated - the above. Reserved bytes the map
 *                     does not show (segments from before the stream began, lost events)
 *                     and live blocks the allocated total does not count. 0 when the
 *                     stream is complete; may be negative.
 * So the causes add up to reserved - allocated exactly, untracked included.
 * Rounding of requests (block size - requested size, over live blocks whose request is
 * known) lies inside allocated, not in the gap: it is reported beside it, and
 * requested = allocated - rounding when every request is known. */
#ifndef MT_ANALYSIS_GAP_H
#define MT_ANALYSIS_GAP_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "analysis/model.h"

typedef enum mt_gap_cause_e {
    MT_GAP_PINNED_FREE = 0,
    MT_GAP_CACHED_SEGMENTS = 1,
    MT_GAP_STREAM_PENDING = 2,
    MT_GAP_EXPANDABLE_SLACK = 3,
    MT_GAP_UNTRACKED = 4,
    MT_GAP_CAUSES = 5,
} mt_gap_cause_e;

/* A call stack whose largest live block pins segments: the free bytes of those segments. */
typedef struct mt_gap_pin_s {
    uint32_t stack;    /* model stack id of the largest live block (0: none recorded) */
    uint64_t bytes;    /* free bytes of the segments it pins, saturated */
    uint64_t segments; /* segments it pins */
    uint64_t block;    /* bytes, the largest of its pinning blocks */
} mt_gap_pin_t;

/* Invariants: sum over c of cause[c] = reserved - allocated (as signed 128-bit sums; each
 * cause but untracked >= 0); pins sorted by bytes, largest first, then by stack; sum of
 * pins' bytes = cause[MT_GAP_PINNED_FREE] (unless saturated). */
typedef struct mt_gap_s {
    uint64_t reserved, allocated; /* bytes, the class's totals at that moment */
    int64_t cause[MT_GAP_CAUSES]; /* bytes, by mt_gap_cause_e, clamped to int64 */
    uint64_t rounding;            /* bytes of live blocks above their requests (known ones) */
    uint64_t requested_known;     /* bytes requested by live blocks whose request is known */
    uint64_t blocks_unknown;      /* live blocks whose request is unknown */
    uint64_t segments;            /* segments (or mapped ranges) in the map */
    mt_gap_pin_t *pins;           /* new array of npins, or NULL */
    size_t npins;
} mt_gap_t;

/* The gap of a map whose class has the totals reserved and allocated (map borrowed). *out
 * is filled; free it with mt__gap_free. 0 or MT_ENOMEM (then *out holds no pins). */
int mt__gap_of_map(const mt_model_map_t *map, uint64_t allocated, uint64_t reserved, mt_gap_t *out);
/* The gap of class cls of m now: its map and totals. 0 or MT_ENOMEM. */
int mt__gap_of_model(const mt_model_t *m, int cls, mt_gap_t *out);
void mt__gap_free(mt_gap_t *g);

/* "pinned_free", ...; NULL out of range. */
const char *mt__gap_cause_name(int cause);

/* {"reserved_bytes", "allocated_bytes", "gap_bytes", "causes": [{"cause", "bytes"}],
 * "rounding_bytes", "requested_known_bytes", "blocks_request_unknown", "pins":
 * [{"stack", "bytes", "segments", "largest_block_bytes"}] (the first top)}. New reference,
 * NULL without memory. Callers name the pins' stacks (the report adds "site"). */
json_t *mt__gap_json(const mt_gap_t *g, size_t top);
/* After the pins are named: rows whose "site" reads the same (stacks that differ below the
 * user's frame) become one, bytes and segments added (saturating), the largest block the
 * largest, the other members the first row's; largest first again, the first top kept.
 * 0 or MT_ENOMEM (pins then half merged: not to be shown). */
int mt__gap_pins_by_site(json_t *pins, size_t top);

#endif
