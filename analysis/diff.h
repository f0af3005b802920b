/* What changed between two runs: two report results (report.h's mt__report_result, with the
 * "snapshots" member tools/snapshot_in.h adds for snapshot inputs) compared figure by
 * figure, for `memtrace diff` and the page's compare view (docs/diff.md).
 *
 * Compared: peak and final allocated and reserved (summed over each side's processes), live
 * bytes at the peak per site (each process's "callsites" rows, or a snapshot's
 * "call_sites_at_peak", keyed by their "site": the report's --by grouping) and never-freed
 * bytes per site, and peak and never-freed bytes per tag. Each site or tag row says whether
 * it is new, gone, grew, shrank or is the same. Gates for CI: growth of peak allocated in
 * percent, and growth of one site's bytes at the peak; a new site grows from 0. */
#ifndef MT_ANALYSIS_DIFF_H
#define MT_ANALYSIS_DIFF_H

#include <jansson.h>
#include <stdint.h>

typedef struct mt_diff_cfg_s {
    double max_peak_growth_pct; /* gate on peak allocated growth, percent; < 0: none */
    int64_t max_site_growth;    /* gate on one site's growth at the peak, bytes; < 0: none */
} mt_diff_cfg_t;

mt_diff_cfg_t mt__diff_cfg_default(void); /* no gates */

/* The members of a report's process that mt__diff_reports reads (NULL-terminated): a side
 * may keep only these of each (mt__report_result_final). */
extern const char *const mt__diff_process_members[];

/* The diff of before and after (both borrowed) as a new JSON document in *out:
 * {"v", "type": "diff", "peak_allocated", "peak_reserved", "final_allocated",
 *  "final_reserved": each {"before", "after", "delta", "growth_pct"}, "sites": [...],
 *  "tags": [...], each row {"key", "before", "after", "delta", "status",
 *  "never_freed_before", "never_freed_after"} largest |delta| first, "new", "grew", "gone",
 *  "freed_now" (sites of both runs with never-freed bytes before, none after),
 *  "never_freed_now" (the reverse): lists of site keys, "gates": [{"gate", "limit", "value",
 *  "crossed", "what"}], "crossed": bool}. *crossed (may be NULL) is the number of gates
 * crossed. 0, or MT_ENOMEM (*out NULL). */
int mt__diff_reports(const json_t *before, const json_t *after, const mt_diff_cfg_t *cfg,
                     json_t **out, int *crossed);

#endif
