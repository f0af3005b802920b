/* Reading telemetry logs line by line into the report engine (see logs.h). */
#include "tools/logs.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include "analysis/lines.h"
#include "util/text.h"

#define MAX_ERRORS_SHOWN 10

typedef struct reader_s {
    mt__report_t *r;
    const char *path;
    unsigned long mine; /* malformed lines */
} reader_t;

/* Feeds the lines of ls to rd->r: 0, MT_ENOMEM, MT_EOVERFLOW for a line longer than
 * MT_LOG_LINE_MAX (ls->lineno is its number), MT_EIO for a read error. Each line is passed
 * with its newline (the last without, when the file ends without one), NUL-terminated as
 * the parser's callers expect. */
static int read_lines(reader_t *rd, mt__lines_t *ls)
{
    const char *line;
    size_t len;
    int rc;
    while ((rc = mt__lines_next(ls, &line, &len)) == 1) {
        char err[256];
        rc = mt__report_add_line(rd->r, line, len, err, sizeof(err));
        if (rc == MT_ENOMEM)
            return rc;
        if (rc != 0 && rd->mine++ < MAX_ERRORS_SHOWN) {
            char e[MT_TEXT_ESC_SIZE(256)]; /* the parser's message quotes the line */
            fprintf(stderr, "%s:%lu: malformed line: %s\n", rd->path, ls->lineno,
                    mt__text_escape(err, e, sizeof e));
        }
    }
    return rc;
}

static int read_one(mt__report_t *r, const char *prog, const char *path, unsigned long *bad)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
        return 1;
    }
    /* One line at most MT_LOG_LINE_MAX bytes (docs/telemetry.md): a longer one (a corrupt
     * log, /dev/zero) is an error naming it, read no further, not a buffer without bound. */
    mt__lines_t ls;
    if (mt__lines_open(&ls, f, MT_LOG_LINE_MAX) != 0) {
        fprintf(stderr, "%s: out of memory\n", prog);
        if (f != stdin)
            fclose(f);
        return 1;
    }
    reader_t rd = {.r = r, .path = path};
    int rc = read_lines(&rd, &ls);
    unsigned long lineno = ls.lineno;
    mt__lines_close(&ls);
    if (f != stdin)
        fclose(f);
    if (rd.mine > MAX_ERRORS_SHOWN)
        fprintf(stderr, "%s: %lu malformed lines in all\n", path, rd.mine);
    *bad += rd.mine;
    if (rc == MT_EOVERFLOW) {
        fprintf(stderr, "%s:%lu: line longer than %d bytes: not a memtrace log\n", path, lineno,
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

bool mt_tool_general_reader(void)
{
    const char *reader = getenv("MEMTRACE_READER");
    return reader != NULL && strcmp(reader, "jansson") == 0;
}
