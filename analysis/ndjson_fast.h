/* A decoder of the common event lines of a telemetry log, without jansson: the lines
 * profiler/encode.c writes for allocator events and stack refs, byte for byte in its key
 * order. Readers try it first and hand every line it declines to jansson and
 * mt_prof_event_from_json, so a line it accepts gives exactly the record the jansson path
 * gives, and every error is still the jansson path's (docs/readers.md). */
#ifndef MT_ANALYSIS_NDJSON_FAST_H
#define MT_ANALYSIS_NDJSON_FAST_H

#include <stdbool.h>
#include <stddef.h>

#include "memtrace/event.h"

/* Decodes line[0..len) (without its newline) into *ev and *pid when it is an "event" line
 * of the writer's exact form: no whitespace, no escapes, only printable ASCII in strings,
 * integers within the decoder's ranges. *tag, *tag_len: the line's "tag" string, borrowed
 * from line (not NUL-terminated); NULL and 0 for a line without one (stack refs). Returns
 * false, leaving the outputs undefined, for any other line: the caller decodes it the
 * general way. Never fails otherwise; reads no byte outside line[0..len). */
bool mt__ndjson_event(const char *line, size_t len, mt_event_rec_t *ev, int *pid, const char **tag,
                      size_t *tag_len);

#endif
