/* `memtrace convert`: the binary log (profiler/binlog.h) to NDJSON and back, losslessly.
 * Binary to NDJSON gives the lines the recorder would have written (the one encoder);
 * NDJSON to binary keeps a line as an event record only when the encoder makes it back
 * byte for byte, and as text otherwise, so NDJSON -> binary -> NDJSON is the same bytes
 * (every line ended by a newline). */
#ifndef MT_ANALYSIS_BINLOG_CONV_H
#define MT_ANALYSIS_BINLOG_CONV_H

#include <stdint.h>
#include <stdio.h>

#include "analysis/binlog_read.h"

/* The binary log in (its first bytes head[0..nhead) already read) as NDJSON into out;
 * damaged parts to bad (see mt__blog_read). *records: records written. 0, MT_EIO (reading
 * in or writing out failed), MT_ENOMEM, or bad's non-zero return. */
int mt__blog_to_ndjson(FILE *in, const void *head, size_t nhead, FILE *out, mt__blog_bad_cb bad,
                       void *ud, uint64_t *records);

/* The NDJSON log in as a binary log into out. *lines: lines read; *events: those kept as
 * event records. 0, MT_EIO, MT_ENOMEM, or MT_EOVERFLOW (a line over 8 MiB). */
int mt__blog_from_ndjson(FILE *in, FILE *out, uint64_t *lines, uint64_t *events);

#endif
