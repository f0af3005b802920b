/* Reading telemetry logs into the report engine, for `memtrace report` and `memtrace plot`. */
#ifndef MT_TOOLS_LOGS_H
#define MT_TOOLS_LOGS_H

#define MT_LOG_LINE_MAX 65536 /* bytes of one log line, its newline excluded */

#include <stdbool.h>

#include "analysis/report.h"

/* Feeds every line of the n logs (paths[i], "-" = standard input) to r, in order: a
 * process's events may be split over several logs (the daemon's, then the program's own
 * after the daemon went away), and an event found twice counts once. Malformed lines are
 * named on stderr (the first ten of each log) and counted in *bad. Returns 0, or 1 when a
 * log could not be opened or read, 2 when a line is longer than MT_LOG_LINE_MAX (said
 * on stderr, naming the line). */
int mt_tool_read_logs(mt__report_t *r, const char *prog, char *const *paths, int n,
                      unsigned long *bad);

/* Whether MEMTRACE_READER=jansson asks the readers to decode every line with jansson, never
 * with the event-line decoder (docs/readers.md: benchmarks, and ruling the decoder out). The
 * libraries read no environment; the commands pass this on in their configurations. */
bool mt_tool_general_reader(void);
/* MEMTRACE_DEBUGINFOD=1: the symbolizer may ask debuginfod servers (analysis/symbolize.h). */
bool mt_tool_debuginfod(void);

/* The threads the readers read a log with (analysis/lines_pipe.h): 1 when
 * MEMTRACE_READER_THREADS=1 asks for the caller's thread alone (to compare the outputs, or
 * on a core of its own), else mt__lines_pipe_threads(). */
int mt_tool_threads(void);

/* Where the readers that replay a log (plot, export) put the events they keep, in an unlinked
 * file (analysis/event_spool.h): $TMPDIR, else /tmp. */
const char *mt_tool_spill_dir(void);

/* After a failed write, removes the output named with -o when it is a regular file (a
 * half-written image or snapshot); a device, pipe or symbolic link stays (-o /dev/full,
 * run as root, must not delete the device). */
void mt_tool_remove_output(const char *path);

/* Says on stderr, after prog's line of what it wrote, how many trace entries a snapshot
 * left out (mt_ts_t.viz_dropped; nothing when none). */
void mt_tool_viz_dropped(const char *prog, size_t n);

#endif
