/* Reading telemetry logs line by line into the report engine (see logs.h). */
#include "tools/logs.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include "util/text.h"

#define MAX_ERRORS_SHOWN 10

/* Bytes read at once: many lines per read, and few enough to stay in the cache. A line
 * never needs more than MT_LOG_LINE_MAX + 1 of them (its bytes and its newline). */
#define CHUNK (1u << 20)
_Static_assert(CHUNK > MT_LOG_LINE_MAX + 1, "a whole line fits the buffer");

typedef struct reader_s {
    mt__report_t *r;
    const char *path;
    unsigned long lineno, mine; /* lines read, malformed lines among them */
    int rc;                     /* the last line's: MT_ENOMEM stops the reading */
} reader_t;

static void one_line(reader_t *rd, const char *line, size_t len)
{
    char err[256];
    rd->lineno++;
    rd->rc = mt__report_add_line(rd->r, line, len, err, sizeof(err));
    if (rd->rc != 0 && rd->rc != MT_ENOMEM && rd->mine++ < MAX_ERRORS_SHOWN) {
        char e[MT_TEXT_ESC_SIZE(256)]; /* the parser's message quotes the line */
        fprintf(stderr, "%s:%lu: malformed line: %s\n", rd->path, rd->lineno,
                mt__text_escape(err, e, sizeof e));
    }
}

/* Feeds the lines of f to rd->r: 0, MT_ENOMEM, MT_EOVERFLOW for a line longer than
 * MT_LOG_LINE_MAX (rd->lineno is its number), MT_EIO for a read error. Lines are cut in
 * place in one buffer: each is passed with its newline (the last without, when the file
 * ends without one), and is NUL-terminated as the parser's callers expect. */
static int read_lines(reader_t *rd, FILE *f, char *buf)
{
    size_t have = 0; /* bytes of an unfinished line at buf[0..have) */
    for (;;) {
        size_t got = fread(buf + have, 1, CHUNK - have, f);
        if (got == 0) {
            if (ferror(f))
                return MT_EIO;
            if (have > MT_LOG_LINE_MAX) {
                rd->lineno++;
                return MT_EOVERFLOW;
            }
            if (have > 0) {
                buf[have] = '\0';
                one_line(rd, buf, have);
            }
            return rd->rc == MT_ENOMEM ? MT_ENOMEM : 0;
        }
        char *p = buf, *end = buf + have + got;
        char *nl;
        while ((nl = memchr(p, '\n', (size_t)(end - p))) != NULL) {
            if ((size_t)(nl - p) > MT_LOG_LINE_MAX) {
                rd->lineno++;
                return MT_EOVERFLOW;
            }
            char keep = nl[1]; /* nl + 1 <= end < buf + CHUNK + 1: see buf's size */
            nl[1] = '\0';
            one_line(rd, p, (size_t)(nl + 1 - p));
            nl[1] = keep;
            if (rd->rc == MT_ENOMEM)
                return MT_ENOMEM;
            p = nl + 1;
        }
        have = (size_t)(end - p);
        if (have > MT_LOG_LINE_MAX) {
            rd->lineno++;
            return MT_EOVERFLOW;
        }
        memmove(buf, p, have);
    }
}

static int read_one(mt__report_t *r, const char *prog, const char *path, unsigned long *bad)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
        return 1;
    }
    /* One line at most MT_LOG_LINE_MAX bytes (docs/telemetry.md): a longer one (a corrupt
     * log, /dev/zero) is an error naming it, read no further, not a buffer without bound.
     * One byte more than CHUNK: the NUL after a line that ends the buffer. */
    char *buf = malloc(CHUNK + 1);
    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", prog);
        if (f != stdin)
            fclose(f);
        return 1;
    }
    reader_t rd = {.r = r, .path = path};
    int rc = read_lines(&rd, f, buf);
    free(buf);
    if (f != stdin)
        fclose(f);
    if (rd.mine > MAX_ERRORS_SHOWN)
        fprintf(stderr, "%s: %lu malformed lines in all\n", path, rd.mine);
    *bad += rd.mine;
    if (rc == MT_EOVERFLOW) {
        fprintf(stderr, "%s:%lu: line longer than %d bytes: not a memtrace log\n", path, rd.lineno,
                MT_LOG_LINE_MAX);
        *bad += 1;
        return 2;
    }
    if (rc == MT_ENOMEM) {
        fprintf(stderr, "%s: %s: out of memory\n", prog, path);
        return 1;
    }
    if (rc == MT_EIO) {
        fprintf(stderr, "%s: error reading %s\n", prog, path);
        return 1;
    }
    return 0;
}

int mt_tool_read_logs(mt__report_t *r, const char *prog, char *const *paths, int n,
                      unsigned long *bad)
{
    for (int i = 0; i < n; i++) {
        int rc = read_one(r, prog, paths[i], bad);
        if (rc != 0)
            return rc;
    }
    return 0;
}
