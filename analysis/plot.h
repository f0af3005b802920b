/* One picture of a process's memory from a telemetry log, for `memtrace plot`: a single
 * self-contained SVG (no scripts, fonts or files outside it) in the spirit of PyTorch's
 * memory_viz "active memory timeline".
 *
 * - Timeline: device memory in use over time as stacked areas by tag, the reserved bytes
 *   as a line above them with the cache (reserved, not in use) shaded, OOM markers,
 *   iteration ticks, the peak, and the moment the segment map is drawn at.
 * - Pinned host memory (pool host), when the log has any, in a small panel of its own: it
 *   is not device memory and never enters the device figures.
 * - Segment map at the peak of reserved memory (the fullest moment of that peak): each
 *   segment a bar proportional to its size, blocks coloured by tag, free space grey, with
 *   utilization and fragmentation figures.
 *
 * The timeline is sampled into at most max_buckets time buckets; each keeps the state of
 * its lowest and highest moment (by bytes in use), in time order, so peaks and troughs
 * survive however many events the log holds: the SVG's size is bounded by the buckets. */
#ifndef MT_ANALYSIS_PLOT_H
#define MT_ANALYSIS_PLOT_H

#include <stddef.h>
#include <stdio.h>

#include "analysis/report.h"

typedef struct mt__plot_cfg_s {
    int pid;              /* process to draw; -1: the one with the most events */
    unsigned width;       /* SVG width in px; 1200 (at least 800) */
    unsigned height;      /* SVG height in px; 800 (at least 600) */
    unsigned max_buckets; /* time buckets of the timeline, two points each; 1000 */
} mt__plot_cfg_t;

mt__plot_cfg_t mt__plot_cfg_default(void);

/* Writes the SVG of one process of r (fed a whole log) to f. MT_ENOENT with a message in
 * err when the log has no such process or it has no events; MT_ENOMEM; MT_EIO when f fails. */
int mt__plot_svg(const mt__report_t *r, const mt__plot_cfg_t *cfg, FILE *f, char *err,
                 size_t errlen);

#endif
