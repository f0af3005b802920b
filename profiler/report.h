/* Offline analysis of a telemetry log (NDJSON, schema v1), for `memtrace report`.
 *
 * Lines are fed one at a time; the result is one JSON document (new json_t *) with,
 * per process: peaks (allocated, reserved, by tag), a timeline of allocated, reserved,
 * utilization and fragmentation, the allocations never freed grouped by tag and size,
 * and the growth detector's verdict. All of these are device memory only: pinned host
 * memory (events of pool MT_POOL_HOST, from a pinned host cache) is summarised apart, in
 * the process's "host" member (peaks, final totals, peaks by tag, never freed).
 *
 * Growth detector: at each MT_MARK_ITERATION marker the process's allocated total (and
 * each tag's live bytes) is sampled; the first sample is dropped as warm-up when there
 * are at least five; a least-squares line is fitted over the rest. Growth is flagged
 * when the slope is positive, the fit explains the samples (r2 >= min_r2), the rise
 * over the fitted samples is at least min_growth_bytes, and at least 3/4 of the steps
 * do not go down: memory that rises steadily from one iteration to the next, the sign
 * of history kept alive (a list of tensors appended to every step). */
#ifndef MT_PROFILER_REPORT_H
#define MT_PROFILER_REPORT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct mt__report_s mt__report_t;

typedef struct mt__report_cfg_s {
    unsigned timeline_steps;   /* samples in the timeline; 20 */
    uint64_t min_growth_bytes; /* rise needed to flag growth; 1 MiB */
    double min_r2;             /* goodness of fit needed to flag growth; 0.8 */
    unsigned top;              /* rows of never-freed groups kept; 10 */
} mt__report_cfg_t;

mt__report_cfg_t mt__report_cfg_default(void);
int mt__report_create(mt__report_t **out, const mt__report_cfg_t *cfg);
void mt__report_destroy(mt__report_t **r);
/* One log line (without or with its '\n'). Returns 0 (also for record types the
 * report does not use), or MT_EPROTO with a message in err for a malformed line. */
int mt__report_add_line(mt__report_t *r, const char *line, size_t len, char *err, size_t errlen);
/* The analysis of everything added so far. New reference, or NULL (no memory). */
json_t *mt__report_result(mt__report_t *r);

#endif
