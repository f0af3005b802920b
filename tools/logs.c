/* Reading telemetry logs line by line into the report engine (see logs.h). */
#include "tools/logs.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include "analysis/zsource.h"
#include "analysis/lines_pipe.h"
#include "analysis/trace_csv.h"
#include "util/text.h"

#define MAX_ERRORS_SHOWN 10

typedef struct reader_s {
    mt__report_t *r;
    const char *path;
    unsigned long mine;   /* malformed lines */
    unsigned long lineno; /* of the line over MT_LOG_LINE_MAX, when one ended the reading */
    bool rmm;             /* the first line is an RMM log's header (the reading stopped) */
} reader_t;

/* One line of the log into rd->r, in file order (lines_pipe.h): 0 to go on, MT_ENOMEM, or
 * MT_EOVERFLOW for a line longer than MT_LOG_LINE_MAX (the reading stops there). */
static int take_line(void *ud, const mt__line_item_t *it, unsigned long lineno)
{
    reader_t *rd = ud;
    if (it->what == MT_LINE_EVENT)
        return mt__report_add_decoded(rd->r, it->pid, &it->ev, it->text, it->len);
    if (it->what == MT_LINE_LONG) {
        rd->lineno = lineno;
        return MT_EOVERFLOW;
    }
    if (lineno == 1 && it->what == MT_LINE_RAW && mt__trace_is_header(it->text, it->len)) {
        rd->rmm = true;
        return MT_EPROTO;
    }
    if (it->what == MT_LINE_BAD) { /* a damaged part of a binary log: said, read on */
        if (rd->mine++ < MAX_ERRORS_SHOWN)
            fprintf(stderr, "%s: damaged binary log: %.*s\n", rd->path, (int)it->len, it->text);
        return 0;
    }
    char err[256];
    int rc = mt__report_add_line(rd->r, it->text, it->len, err, sizeof(err));
    if (rc == MT_ENOMEM)
        return rc;
    if (rc != 0 && rd->mine++ < MAX_ERRORS_SHOWN) {
        char e[MT_TEXT_ESC_SIZE(256)]; /* the parser's message quotes the line */
        fprintf(stderr, "%s:%lu: malformed line: %s\n", rd->path, lineno,
                mt__text_escape(err, e, sizeof e));
    }
    return 0;
}

static int rmm_log(const char *prog, const char *path, unsigned long *bad)
{
    fprintf(stderr, "%s: %s is an RMM log (CSV), not a memtrace log: 'memtrace replay' reads it\n",
            prog, path);
    *bad += 1;
    return 2;
}

static int read_one(mt__report_t *r, const char *prog, const char *path, unsigned long *bad)
{
    FILE *raw = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!raw) {
        fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
        return 1;
    }
    /* A log compressed with xz, gzip or zstd reads as its text (analysis/zsource.h). */
    mt__zfile_t *zf = NULL;
    int zrc = mt__zfile_open(&zf, raw);
    if (zrc != 0) {
        fprintf(stderr, "%s: %s: %s\n", prog, path,
                zrc == MT_ENOMEM ? "out of memory" : "cannot be read");
        if (raw != stdin)
            fclose(raw);
        return 1;
    }
    FILE *f = mt__zfile_stream(zf);
    /* One line at most MT_LOG_LINE_MAX bytes (docs/telemetry.md): a longer one (a corrupt
     * log, /dev/zero) is an error naming it, read no further, not a buffer without bound.
     * The lines are cut on the other core, and decoded on either, while this one applies
     * them. */
    mt__lines_pipe_cfg_t pc = {
        .max = MT_LOG_LINE_MAX, .fast = mt__report_decodes(r), .threads = mt_tool_threads()};
    reader_t rd = {.r = r, .path = path};
    int rc = mt__lines_pipe_run(f, &pc, take_line, &rd, NULL);
    char zerr[256];
    snprintf(zerr, sizeof zerr, "%s", mt__zfile_error(zf));
    mt__zfile_close(&zf);
    if (raw != stdin)
        fclose(raw);
    if (rd.rmm) /* an RMM log would read as lines of garbage: named once instead */
        return rmm_log(prog, path, bad);
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
    if (rc == MT_EIO && zerr[0] != '\0') {
        /* Bad compressed data (a log cut while it was written, say): named as a malformed
         * line is, and what came before it is kept. */
        fprintf(stderr, "%s: %s: %s; the lines before it are read\n", prog, path, zerr);
        *bad += 1;
        return 0;
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

bool mt_tool_debuginfod(void)
{
    const char *v = getenv("MEMTRACE_DEBUGINFOD");
    return v != NULL && strcmp(v, "1") == 0;
}

bool mt_tool_general_reader(void)
{
    const char *reader = getenv("MEMTRACE_READER");
    return reader != NULL && strcmp(reader, "jansson") == 0;
}

int mt_tool_threads(void)
{
    const char *t = getenv("MEMTRACE_READER_THREADS");
    return t != NULL && strcmp(t, "1") == 0 ? 1 : mt__lines_pipe_threads();
}

const char *mt_tool_spill_dir(void)
{
    const char *dir = getenv("TMPDIR");
    return dir && *dir ? dir : "/tmp";
}

void mt_tool_viz_dropped(const char *prog, size_t n)
{
    if (n > 0)
        fprintf(stderr,
                "%s: %zu trace entries left out: they do not fit the segments and blocks at "
                "the end (the log lost events around them), and memory_viz's state view "
                "could not undo them (docs/torch-snapshot.md)\n",
                prog, n);
}

void mt_tool_remove_output(const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISREG(st.st_mode))
        remove(path);
}
