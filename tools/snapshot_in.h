/* PyTorch memory snapshots as input to the memtrace commands (replay, report, plot). */
#ifndef MT_TOOLS_SNAPSHOT_IN_H
#define MT_TOOLS_SNAPSHOT_IN_H

#include <stdbool.h>

#include <jansson.h>

#include "analysis/replay.h"
#include "analysis/report.h"
#include "analysis/torch_snapshot.h"

/* `memtrace replay SNAPSHOT.pickle`: every device's trace through the allocator, with
 * PyTorch's own figures beside memtrace's. Returns the exit status (0, 1, 2). */
int mt_tool_replay_snapshot(const char *path, const mt_replay_cfg_t *cfg, bool json);

/* Feeds the snapshot's events to the report as one process (named after the file, with
 * the pseudo pid given), tags from memtrace's tag frames. Returns 0 or an MT_E* code
 * (message on stderr). */
int mt_tool_report_snapshot(mt__report_t *r, const mt_ts_t *ts, const char *path, int pid);

/* The inputs of `memtrace report` / `plot`: logs, and snapshots kept for their call
 * sites and annotations. */
#define MT_TOOL_MAX_SNAPSHOTS 16
typedef struct mt_tool_inputs_s {
    mt_ts_t *ts[MT_TOOL_MAX_SNAPSHOTS];
    const char *path[MT_TOOL_MAX_SNAPSHOTS];
    size_t n;
} mt_tool_inputs_t;

/* Like mt_tool_read_logs, but a path that is a snapshot (mt__ts_is_pickle) is read as one,
 * its events fed as process number i + 1. Returns the exit status: 0, 1 (unreadable),
 * 2 (a malformed snapshot; said on stderr with prog). */
int mt_tool_read_inputs(mt__report_t *r, const char *prog, char *const *paths, int n,
                        unsigned long *bad, mt_tool_inputs_t *in);
/* Adds "snapshots": [{file, layout, devices: [{device, peak_allocated_bytes, by,
 * call_sites_at_peak}], annotations}] to the report's result: cfg->top groups of live bytes
 * at the peak by cfg->by, named by their user frame (cfg->frames, analysis/frames.h). 0 or
 * MT_ENOMEM (res then not to be shown: part of it may be missing). */
int mt_tool_inputs_json(const mt_tool_inputs_t *in, json_t *res, const mt__report_cfg_t *cfg);
/* Each snapshot process's "temporary" member (res from mt__report_result(r)) by the sites
 * of the snapshot's frames, unless grouped by tag. 0 or MT_ENOMEM. */
int mt_tool_inputs_temporary(const mt_tool_inputs_t *in, mt__report_t *r, json_t *res,
                             const mt__report_cfg_t *cfg);
/* The same as text, after the report's; stacks: each group's whole kept stack below it.
 * 0 or MT_ENOMEM (what was printed stays). */
int mt_tool_inputs_print(const mt_tool_inputs_t *in, const mt__report_cfg_t *cfg, bool stacks);
void mt_tool_inputs_free(mt_tool_inputs_t *in);

/* Reads a snapshot file, printing "prog: message" on failure. Returns 0, or the exit status
 * (2 malformed, 1 unreadable). */
int mt_tool_read_snapshot(const char *prog, const char *path, mt_ts_t **out);

#endif
