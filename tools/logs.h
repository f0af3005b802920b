/* Reading telemetry logs into the report engine, for `memtrace report` and `memtrace plot`. */
#ifndef MT_TOOLS_LOGS_H
#define MT_TOOLS_LOGS_H

#include "analysis/report.h"

/* Feeds every line of the n logs (paths[i], "-" = standard input) to r, in order: a
 * process's events may be split over several logs (the daemon's, then the program's own
 * after the daemon went away), and an event found twice counts once. Malformed lines are
 * named on stderr (the first ten of each log) and counted in *bad. Returns 0, or 1 when a
 * log could not be opened or read (said on stderr, prefixed with prog). */
int mt_tool_read_logs(mt__report_t *r, const char *prog, char *const *paths, int n,
                      unsigned long *bad);

#endif
