/* Lines of a file, read in large blocks and cut in place, on the caller's thread. The log
 * readers read through lines_pipe.h (the same lines, cut and decoded on a second core); this
 * one is the reference its tests hold it to (docs/readers.md). */
#ifndef MT_ANALYSIS_LINES_H
#define MT_ANALYSIS_LINES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Bytes asked of the file at once: many lines per read, few enough to stay in the cache. */
#define MT_LINES_BLOCK (1u << 20)

/* A reader of f's lines. Invariants: buf holds cap + 1 bytes; buf <= p <= end <=
 * buf + cap; cap > max + 1, so a line of max bytes and its newline always fit; kept is
 * NULL or the byte after the last line given (overwritten by its NUL, put back on the next
 * call); skipping: the rest of an over-long line is being passed over. */
typedef struct mt__lines_s {
    FILE *f;              /* borrowed */
    char *buf;            /* owned */
    size_t cap;           /* bytes, MT_LINES_BLOCK or more */
    size_t max;           /* longest line given, newline excluded, bytes */
    char *p, *end;        /* bytes read and not yet given: [p, end) */
    char *kept, keep;     /* where the last line's NUL went, and the byte it hid */
    unsigned long lineno; /* lines given or refused so far (1 = the first line) */
    bool eof, skipping;
} mt__lines_t;

/* Starts reading f (borrowed; not closed) with lines of at most max bytes (newline
 * excluded). 0 or MT_ENOMEM. */
int mt__lines_open(mt__lines_t *ls, FILE *f, size_t max);

/* The next line: 1 and *line, *len (the line's bytes with its newline, if it has one;
 * line[len] is a NUL; borrowed until the next call); 0 at the end of the file; MT_EOVERFLOW
 * for a line longer than ls->max (ls->lineno is its number; the next call goes on after it,
 * so a caller may stop or skip it); MT_EIO when the file cannot be read. */
int mt__lines_next(mt__lines_t *ls, const char **line, size_t *len);

/* Frees the buffer (not the file). Safe on a zeroed or closed reader. */
void mt__lines_close(mt__lines_t *ls);

#endif
