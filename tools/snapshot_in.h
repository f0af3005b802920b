/* PyTorch memory snapshots as input to the memtrace commands (replay, report, plot). */
#ifndef MT_TOOLS_SNAPSHOT_IN_H
#define MT_TOOLS_SNAPSHOT_IN_H

#include <stdbool.h>

#include "analysis/replay.h"
#include "analysis/report.h"
#include "analysis/torch_snapshot.h"

/* `memtrace replay SNAPSHOT.pickle`: every device's trace through the allocator, with
 * PyTorch's own figures beside memtrace's. Returns the exit status (0, 1, 2). */
int mt_tool_replay_snapshot(const char *path, const mt_replay_cfg_t *cfg, bool json);

/* Feeds the snapshot's events to the report as one process (pid 0, named after the file),
 * tags from memtrace's tag frames. Returns 0 or an MT_E* code (message on stderr with
 * prog). */
int mt_tool_report_snapshot(mt__report_t *r, const mt_ts_t *ts, const char *path);

/* Reads a snapshot file, printing "prog: message" on failure. Returns 0, or the exit status
 * (2 malformed, 1 unreadable). */
int mt_tool_read_snapshot(const char *prog, const char *path, mt_ts_t **out);

#endif
