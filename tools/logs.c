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

static int read_one(mt__report_t *r, const char *prog, const char *path, unsigned long *bad)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
        return 1;
    }
    /* One line at most MT_LOG_LINE_MAX bytes (docs/telemetry.md): a longer one (a corrupt
     * log, /dev/zero) is an error naming it, read no further, not a buffer without bound. */
    char *line = malloc(MT_LOG_LINE_MAX + 2);
    if (!line) {
        fprintf(stderr, "%s: out of memory\n", prog);
        if (f != stdin)
            fclose(f);
        return 1;
    }
    unsigned long lineno = 0, mine = 0;
    int rc = 0;
    bool too_long = false;
    for (;;) {
        size_t len = 0;
        int ch = EOF;
        while (len <= MT_LOG_LINE_MAX && (ch = getc_unlocked(f)) != EOF) {
            line[len++] = (char)ch;
            if (ch == '\n')
                break;
        }
        if (len == 0)
            break;
        lineno++;
        if (ch != '\n' && ch != EOF) {
            fprintf(stderr, "%s:%lu: line longer than %d bytes: not a memtrace log\n", path, lineno,
                    MT_LOG_LINE_MAX);
            too_long = true;
            break;
        }
        line[len] = '\0';
        char err[256];
        rc = mt__report_add_line(r, line, len, err, sizeof(err));
        if (rc == MT_ENOMEM)
            break;
        if (rc != 0 && mine++ < MAX_ERRORS_SHOWN) {
            char e[MT_TEXT_ESC_SIZE(256)]; /* the parser's message quotes the line */
            fprintf(stderr, "%s:%lu: malformed line: %s\n", path, lineno,
                    mt__text_escape(err, e, sizeof e));
        }
    }
    bool oom = rc == MT_ENOMEM;
    int read_err = ferror(f);
    free(line);
    if (f != stdin)
        fclose(f);
    if (mine > MAX_ERRORS_SHOWN)
        fprintf(stderr, "%s: %lu malformed lines in all\n", path, mine);
    *bad += mine;
    if (too_long) {
        *bad += 1;
        return 2;
    }
    if (oom) {
        fprintf(stderr, "%s: %s: out of memory\n", prog, path);
        return 1;
    }
    if (read_err) {
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
