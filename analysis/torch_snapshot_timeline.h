/* A snapshot's live bytes over time by the user's site of their stacks: the view PyTorch's
 * viewer calls the active memory timeline, bounded to the top sites and "other". */
#ifndef MT_ANALYSIS_TORCH_SNAPSHOT_TIMELINE_H
#define MT_ANALYSIS_TORCH_SNAPSHOT_TIMELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "analysis/frames.h"
#include "analysis/torch_snapshot.h"

#define MT_TS_TIMELINE_NONE UINT32_MAX /* site_of: a stack no allocation of the trace used */

/* Invariants: nsites <= top + 1; the last site is "other" exactly when other is true;
 * sites are ordered by peak, largest first ("other" last whatever its peak);
 * for every bucket b, bytes[b * nsites + s] is site s's live bytes at the moment the
 * total of all sites was largest within b (or, for a bucket with no record, at its start). */
typedef struct mt_ts_timeline_s {
    size_t nsites;     /* sites kept, <= top + 1 */
    bool other;        /* the last site gathers every stack outside the top */
    char **names;      /* nsites names, owned: "transformer.py:54 forward", "other" */
    uint32_t *stack;   /* nsites: the site's stack with the most bytes at its peak (0: other) */
    uint64_t *peak;    /* nsites: the site's largest live bytes over the trace */
    uint32_t *site_of; /* nstacks: the site of each snapshot stack, or MT_TS_TIMELINE_NONE */
    size_t nstacks;    /* ts->nstacks when built */
    bool by_time;      /* t are epoch seconds; false: the file has no times, t are record indexes */
    size_t nbuckets;   /* >= 1 when the trace has a record, else 0 */
    double *t;         /* nbuckets: the bucket's start */
    uint64_t *bytes;   /* nbuckets * nsites, bucket by bucket */
} mt_ts_timeline_t;

/* The timeline of ts's records (mt__ts_records: all devices) in at most nbuckets buckets,
 * sites keyed by the rules' site of each stack (r NULL: the defaults), the top sites by peak
 * bytes kept and the rest in "other". An allocation is live from its alloc to the first of
 * its free_requested / free_completed (as PyTorch's viewer draws it). *out is new.
 * 0, MT_EINVAL (top or nbuckets 0), MT_ENOMEM. */
int mt__ts_timeline_create(mt_ts_timeline_t **out, const mt_ts_t *ts, const mt_fr_rules_t *r,
                           size_t top, size_t nbuckets);
void mt__ts_timeline_destroy(mt_ts_timeline_t **p);

#endif
