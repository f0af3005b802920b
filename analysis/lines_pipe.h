/* A log's lines cut and decoded on two cores: one thread reads the file in large blocks and
 * cuts them at newlines, the event lines of each block are decoded (ndjson_fast.h) by
 * whichever of the two threads is free first, and the caller's thread takes the lines in
 * file order and applies them. The order the caller sees is the file's, so a model fed from
 * it is the one a line-by-line reader builds (docs/readers.md). */
#ifndef MT_ANALYSIS_LINES_PIPE_H
#define MT_ANALYSIS_LINES_PIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "memtrace/event.h"

/* Bytes read at once into one block, and blocks in flight (read, decoded or applied). */
#define MT_LINES_PIPE_BLOCK (256u << 10)
#define MT_LINES_PIPE_DEPTH 4

typedef enum mt__line_what_e {
    MT_LINE_EVENT = 0, /* an event line the fast decoder read: ev, pid, text = its tag */
    MT_LINE_RAW = 1,   /* any other line (empty ones too): text, for the general path */
    MT_LINE_LONG = 2,  /* a line longer than the reader's max: no text (what is read of it
                        * is dropped; the next item is the line after it) */
    MT_LINE_BAD = 3,   /* a damaged part of a binary log: text says what and where (its byte
                        * offsets); the reading goes on after it */
} mt__line_what_e;

/* One line. text is borrowed until the callback returns: for MT_LINE_RAW the line without
 * its newline, text[len] == '\0'; for MT_LINE_EVENT the tag string inside the line (not
 * NUL-terminated), or NULL and 0 for a line without one. */
typedef struct mt__line_item_s {
    mt_event_rec_t ev; /* MT_LINE_EVENT only */
    const char *text;
    uint32_t len; /* bytes of text */
    int32_t pid;  /* MT_LINE_EVENT only, >= 0 */
    uint8_t what; /* mt__line_what_e */
} mt__line_item_t;

/* Called for each line in file order; lineno counts from 1 and counts every line (empty,
 * long and malformed ones too). A non-zero return stops the reading, and is returned. */
typedef int (*mt__line_cb)(void *ud, const mt__line_item_t *it, unsigned long lineno);

typedef struct mt__lines_pipe_cfg_s {
    size_t max;  /* longest line given, newline excluded, bytes; > 0 */
    bool fast;   /* decode event lines (else every line is MT_LINE_RAW) */
    int threads; /* 2: read and cut on a thread of its own, decode on either; 1: all on the
                  * caller's */
} mt__lines_pipe_cfg_t;

/* The threads worth using here: 2 when more than one core is online, else 1. */
int mt__lines_pipe_threads(void);

/* Reads f (borrowed, not closed) to its end, calling cb for every line; a binary log
 * (profiler/binlog.h) gives, record by record, the items of the NDJSON it stands for. Returns 0 at
 * the end of the file, cb's non-zero return, MT_ENOMEM, MT_EIO when f cannot be read (the lines
 * before the error were given), MT_EINVAL for a bad cfg. *lines (may be NULL): lines given. */
int mt__lines_pipe_run(FILE *f, const mt__lines_pipe_cfg_t *cfg, mt__line_cb cb, void *ud,
                       unsigned long *lines);

#endif
