/* The benchmarks' traces (trace_load.h). */
#include "trace_load.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "memtrace/common.h"

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Loads the trace at path; a .xz or .gz file is read through `xz -dc` or `gzip -dc` (the
 * build has no compression library, and both tools are in every Debian base system), so
 * nothing is written to disk. *t is new. Returns as mt__trace_load. */
int mt_bench_load_trace(const char *path, mt_trace_t **t, char *err, size_t errlen)
{
    const char *tool = ends_with(path, ".xz") ? "xz" : ends_with(path, ".gz") ? "gzip" : NULL;
    if (tool == NULL)
        return mt__trace_load(t, path, err, errlen);
    if (access(path, R_OK) != 0) {
        snprintf(err, errlen, "%s: cannot open", path);
        return MT_ENOENT;
    }
    if (strchr(path, '\'') != NULL) {
        snprintf(err, errlen, "%s: a quote in the path of a compressed trace", path);
        return MT_EINVAL;
    }
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "%s -dc -- '%s'", tool, path);
    FILE *f = popen(cmd, "r");
    if (f == NULL) {
        snprintf(err, errlen, "%s: cannot run %s", path, tool);
        return MT_EIO;
    }
    int rc = mt__trace_load_file(t, f, path, err, errlen);
    int status = pclose(f);
    if (rc == 0 && status != 0) {
        snprintf(err, errlen, "%s: %s -dc failed (status %d)", path, tool, status);
        mt__trace_free(t);
        rc = MT_EIO;
    }
    return rc;
}

const char *mt_bench_base_name(const char *path)
{
    return strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
}
