/* Reading telemetry logs line by line into the report engine (see logs.h). */
#include "tools/logs.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define MAX_ERRORS_SHOWN 10

static int read_one(mt__report_t *r, const char *prog, const char *path, unsigned long *bad)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    unsigned long lineno = 0, mine = 0;
    int rc = 0;
    errno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        char err[256];
        rc = mt__report_add_line(r, line, (size_t)len, err, sizeof(err));
        if (rc == MT_ENOMEM)
            break;
        if (rc != 0 && mine++ < MAX_ERRORS_SHOWN)
            fprintf(stderr, "%s:%lu: malformed line: %s\n", path, lineno, err);
        errno = 0;
    }
    /* getline also stops when it cannot grow its buffer: that is not the end of the log. */
    bool oom = rc == MT_ENOMEM || (!feof(f) && !ferror(f) && errno == ENOMEM);
    int read_err = ferror(f);
    free(line);
    if (f != stdin)
        fclose(f);
    if (mine > MAX_ERRORS_SHOWN)
        fprintf(stderr, "%s: %lu malformed lines in all\n", path, mine);
    *bad += mine;
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
    for (int i = 0; i < n; i++)
        if (read_one(r, prog, paths[i], bad) != 0)
            return 1;
    return 0;
}
