/* Reading the binary log (profiler/binlog.h): its records in file order, and the same items
 * lines_pipe.h gives for the NDJSON log it stands for, so that every reader reads both
 * (docs/readers.md, "The binary log"). */
#ifndef MT_ANALYSIS_BINLOG_READ_H
#define MT_ANALYSIS_BINLOG_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "analysis/lines_pipe.h"
#include "profiler/binlog.h"

/* Whether head[0..n) begins as a binary log does (n >= MT__BLOG_MAGIC_LEN). */
bool mt__blog_is_binary(const void *head, size_t n);

/* One record of block `pid`'s (an event or a line; names are applied, not given).
 * names[t]: the NUL-terminated name the block gave tag t, or NULL (the built-in one or
 * "tag<n>"). A non-zero return stops the reading, and is returned. */
typedef int (*mt__blog_rec_cb)(void *ud, const mt__blog_rec_t *r, int32_t pid,
                               const char *const *names);
/* A part of the file that is not a whole block, or a block's damaged rest: msg names it,
 * with its byte offsets. The reading goes on after it (a non-zero return stops it). */
typedef int (*mt__blog_bad_cb)(void *ud, const char *msg);

/* Reads f (borrowed) to its end; head[0..nhead) are its first bytes, already read from it.
 * 0 at the end, a callback's non-zero return, MT_ENOMEM, or MT_EIO when f cannot be read
 * (what was before the error was given). */
int mt__blog_read(FILE *f, const void *head, size_t nhead, mt__blog_rec_cb rec, mt__blog_bad_cb bad,
                  void *ud);

/* The tag name callback of the encoder (mt_prof_alloc_write) over names (as given to rec). */
const char *mt__blog_name_of(void *names, int tag);

/* The binary log f as lines_pipe items (the lines_pipe_run contract): the NDJSON line of a
 * record, or, with cfg->fast, the item its fast decoder would give for it, made without the
 * text; a damaged part as MT_LINE_BAD. */
int mt__blog_pipe(FILE *f, const void *head, size_t nhead, const mt__lines_pipe_cfg_t *cfg,
                  mt__line_cb cb, void *ud, unsigned long *lineno);

#endif
