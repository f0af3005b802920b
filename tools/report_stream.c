/* `memtrace report` printed as its processes are made (report_print.h): the same bytes as
 * the document printed whole, without the document of every process held at once. A job of
 * thousands of ranks held its processes' JSON (35 KiB a rank in jansson's objects) beside
 * their analyses; now each process's object is printed, or its text kept in a file, and
 * dropped before the next one is made, and only what the jobs read of it stays. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "analysis/report.h"
#include "memtrace/common.h"
#include "tools/logs.h"
#include "tools/report_print.h"

typedef struct stream_s {
    const mt__report_print_opts_t *pr;
    const json_t *head; /* what the fitting reads of the document (no "snapshots": streamed) */
    bool as_json;
    FILE *text; /* as text: the processes' text until the jobs are printed */
    size_t n;   /* processes printed */
    int err;    /* MT_ENOMEM, or -EIO: the output could not be written */
} stream_t;

typedef struct nest_s {
    int shift; /* spaces added after each newline */
    bool bad;  /* a write failed */
} nest_t;

/* jansson's writer: its bytes on stdout as they are when nested shift / 2 levels deeper with
 * JSON_INDENT(2), each line after the first indented by shift more spaces (strings hold no
 * raw newline: JSON escapes it). Writes, never allocates: json_dumps grows a buffer, and
 * jansson drops a key whose growth failed without saying so. */
static int put_nested(const char *buf, size_t size, void *data)
{
    nest_t *n = data;
    for (const char *nl; size > 0 && (nl = memchr(buf, '\n', size)) != NULL;) {
        size_t k = (size_t)(nl - buf) + 1;
        n->bad |= fwrite(buf, 1, k, stdout) != k || fprintf(stdout, "%*s", n->shift, "") < 0;
        buf += k;
        size -= k;
    }
    n->bad |= size > 0 && fwrite(buf, 1, size, stdout) != size;
    return n->bad ? -1 : 0;
}

/* v's JSON_INDENT(2) form written as the member of an object shift / 2 levels deep: 0, -EIO
 * (a write failed) or MT_ENOMEM. */
static int dump_nested(const json_t *v, int shift)
{
    nest_t n = {shift, false};
    if (json_dump_callback(v, put_nested, &n, JSON_INDENT(2) | JSON_ENCODE_ANY) == 0)
        return 0;
    return n.bad ? -EIO : MT_ENOMEM;
}

/* The document doc's members, as json_dumpf(JSON_INDENT(2)) writes them, around its
 * processes: before (doc: the head, mt__report_result_head), its members then the opening of
 * "processes"; after (doc: the whole, its processes left out), the array's end, then the
 * members that follow it (the jobs). The members' names are the report's own plain words: no
 * escape to write. 0, -EIO or MT_ENOMEM. */
static int put_members(const json_t *doc, bool before, size_t nprocs)
{
    const char *k;
    json_t *v;
    bool first = true, past = false;
    int rc = 0;
    if (!before && fprintf(stdout, "%s]", nprocs > 0 ? "\n  " : "") < 0)
        return -EIO;
    json_object_foreach((json_t *)doc, k, v)
    {
        past |= strcmp(k, "processes") == 0;
        if (rc != 0 || strcmp(k, "processes") == 0 || past == before)
            continue;
        rc = fprintf(stdout, "%s\n  \"%s\": ", first && before ? "{" : ",", k) < 0
                 ? -EIO
                 : dump_nested(v, 2);
        first = false;
    }
    if (rc == 0)
        rc = fputs(before ? ",\n  \"processes\": [" : "\n}\n", stdout) < 0 ? -EIO : 0;
    return rc;
}

static int one(void *ctx, json_t *p)
{
    stream_t *st = ctx;
    if (mt__report_print_fit_process(st->head, p, st->pr) != 0)
        return st->err = MT_ENOMEM;
    if (!st->as_json) {
        mt__report_print_process(st->text, p, st->pr);
        st->n++;
        return st->err = ferror(st->text) ? -EIO : 0;
    }
    st->err = fputs(st->n++ > 0 ? ",\n    " : "\n    ", stdout) < 0 ? -EIO : dump_nested(p, 4);
    return st->err;
}

/* A file the processes' text waits in: unlinked in the spill directory, else memory. */
static FILE *text_file(char **mem, size_t *len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/memtrace-report-XXXXXX", mt_tool_spill_dir());
    int fd = mkstemp(path);
    if (fd >= 0) {
        unlink(path);
        FILE *f = fdopen(fd, "w+");
        if (f != NULL)
            return f;
        close(fd);
    }
    return open_memstream(mem, len);
}

/* The processes' text kept in f (mem: a memory stream's bytes) onto stdout. An error of
 * stdout is main's to tell, as for the text printed straight (tools/main.c); -EIO: the kept
 * text could not be read back. */
static int copy_out(FILE *f, char *mem)
{
    if (fflush(f) != 0)
        return -EIO;
    if (mem != NULL) { /* a memory stream: its bytes as of the fflush */
        fputs(mem, stdout);
        return 0;
    }
    char buf[1024]; /* below stdout's buffer, as the printers' writes are: what stdio holds at
                     * the end, and so main's message on a full disk, are theirs */
    size_t n;
    if (fseek(f, 0, SEEK_SET) != 0)
        return -EIO;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, stdout);
    return ferror(f) ? -EIO : 0;
}

int mt__report_print_streamed(mt__report_t *r, const mt__report_print_opts_t *pr, bool as_json,
                              char *const *logs, int nlogs, unsigned long bad)
{
    stream_t st = {.pr = pr, .as_json = as_json};
    json_t *head = mt__report_result_head(r), *doc = NULL;
    char *mem = NULL;
    size_t len = 0;
    st.head = head;
    if (head == NULL)
        st.err = MT_ENOMEM;
    else if (as_json)
        st.err = put_members(head, true, 0);
    else if ((st.text = text_file(&mem, &len)) == NULL)
        st.err = MT_ENOMEM;
    if (st.err == 0 && (doc = mt__report_result_stream(r, one, &st)) == NULL && st.err == 0)
        st.err = MT_ENOMEM;
    if (st.err == 0 && !as_json) {
        mt__report_print_head(doc, st.n, pr, logs, nlogs, bad);
        st.err = copy_out(st.text, mem);
    } else if (st.err == 0) {
        st.err = put_members(doc, false, st.n); /* the array's end, then the jobs */
    }
    if (st.text != NULL)
        fclose(st.text);
    free(mem);
    json_decref(doc);
    json_decref(head);
    if (st.err == 0 && as_json && fflush(stdout) != 0)
        st.err = -EIO; /* (as json_dumpf's failure was told) */
    if (st.err != 0)
        fprintf(stderr, "memtrace report: %s\n",
                st.err == MT_ENOMEM ? "out of memory" : "cannot write the report: write error");
    return st.err != 0;
}
