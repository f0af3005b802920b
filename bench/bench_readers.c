/* bench_readers: how fast the log readers read NDJSON, beside cat, Python's json.loads loop
 * and jq on the same file in the same run (docs/readers.md).
 *
 * The log is made here: a real trace (a CSV of data/traces) is replayed through the caching
 * allocator on the sim backend with an event sink that keeps every event, and the events
 * are written by the profiler's line writer (mt_prof_event_write), one process per copy of
 * the trace, with hello and exit lines, until the file reaches --mb megabytes.
 *
 * Rows: each reader over the whole file, wall time, CPU time (user + sys), MB/s and
 * events/s by wall time, and MB per CPU second: the figure per core, and the one that
 * means something when other work shares the cores (a busy machine stretches wall time). "read"
 * rows are this process feeding every line to the report engine (tools/logs.c, the reading of
 * report/plot/export/diff) without the analysis; "memtrace report" rows are the whole command,
 * analysis and output included. MEMTRACE_READER=jansson selects the general path (jansson, then
 * mt_prof_event_from_json) for the "before" rows.
 *
 * usage: bench_readers TRACE.csv MEMTRACE_EXE [--mb N] [--keep PATH] */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "analysis/ndjson_fast.h"
#include "analysis/report.h"
#include "analysis/trace_csv.h"
#include "bench/machine.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "tools/logs.h"

/* ---- making the log ---- */

typedef struct evbuf_s {
    mt_event_rec_t *v;
    size_t n, cap;
} evbuf_t;

static void keep_event(void *ud, const mt_event_rec_t *ev)
{
    evbuf_t *b = ud;
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 4096;
        mt_event_rec_t *v = realloc(b->v, cap * sizeof(*v));
        if (!v)
            return; /* counted as missing below */
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = *ev;
}

/* The events of one replay of t, in order. 0 or -1. */
static int record_trace(const mt_trace_t *t, evbuf_t *out)
{
    mt_backend_t *b = NULL;
    mt_alloc_t *a = NULL;
    void **ptr = calloc(t->nslots ? t->nslots : 1, sizeof(*ptr));
    mt_event_sink_t sink = {.emit = keep_event, .ud = out};
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = (size_t)64 << 30;
    int rc = -1;
    if (!ptr || mt_backend_create(&b, &bc) != 0)
        goto out_backend;
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.sink = &sink;
    if (mt_alloc_create(&a, &ac) != 0)
        goto out_alloc;
    for (size_t i = 0; i < t->nops; i++) {
        const mt_trace_op_t *op = &t->ops[i];
        if (op->action == MT_TRACE_ALLOCATE) {
            /* Tags cycle over the built-in ones so that the lines carry their names. */
            if (mt_alloc_malloc(a, op->size, NULL, (int)(op->slot % 4), &ptr[op->slot]) != 0)
                ptr[op->slot] = NULL;
        } else if (ptr[op->slot]) {
            mt_alloc_free(a, ptr[op->slot]);
            ptr[op->slot] = NULL;
        }
    }
    for (size_t s = 0; s < t->nslots; s++)
        if (ptr[s])
            mt_alloc_free(a, ptr[s]);
    rc = 0;
    mt_alloc_destroy(&a);
out_alloc:
    mt_backend_destroy(&b);
out_backend:
    free(ptr);
    return rc;
}

static int write_json_line(FILE *f, void *obj)
{
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!s)
        return -1;
    fprintf(f, "%s\n", s);
    free(s);
    return 0;
}

/* Copies of the recorded events, one process each, until the file holds mb megabytes.
 * *events: event lines written. 0 or -1. */
static int write_log(const char *path, const evbuf_t *evs, double mb, uint64_t *events)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    static char line[4096];
    uint64_t bytes = 0, n = 0;
    for (int copy = 0; bytes < mb * 1e6; copy++) {
        int pid = 10000 + copy;
        write_json_line(f, mt_prof_hello_to_json(pid, "bench_readers", 0, 0));
        for (size_t i = 0; i < evs->n; i++) {
            mt_event_rec_t ev = evs->v[i];
            ev.seq = i;
            ev.time_ns = 1000000 + 1000 * (uint64_t)i;
            size_t len = mt_prof_event_write(line, sizeof line, &ev, pid, NULL, NULL);
            if (len >= sizeof line || fwrite(line, 1, len, f) != len) {
                fclose(f);
                return -1;
            }
            bytes += len;
            n++;
        }
        fprintf(f,
                "{\"v\":1,\"type\":\"exit\",\"pid\":%d,\"t_ns\":%zu,\"clean\":true,"
                "\"emitted\":%zu,\"dropped\":0,\"lost\":0}\n",
                pid, 1000000 + 1000 * evs->n, evs->n);
    }
    *events = n;
    return fclose(f) == 0 ? 0 : -1;
}

/* ---- timing ---- */

typedef struct row_s {
    const char *name;
    double wall_s, cpu_s;
    int status; /* exit status; -1 not run */
} row_t;

static double tv_s(struct timeval tv)
{
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

/* Runs argv with stdin from in (NULL: inherited) and stdout to /dev/null; extra_env one
 * "K=V" or NULL. */
static row_t run_cmd(const char *name, char *const argv[], const char *in, const char *extra_env)
{
    row_t r = {.name = name, .status = -1};
    fflush(NULL); /* or the child writes our buffered lines again */
    uint64_t t0 = mt_bench_now_ns();
    pid_t c = fork();
    if (c == 0) {
        if (in && !freopen(in, "r", stdin))
            _exit(126);
        if (!freopen("/dev/null", "w", stdout))
            _exit(126);
        if (extra_env)
            putenv((char *)extra_env);
        execvp(argv[0], argv);
        _exit(127);
    }
    if (c < 0)
        return r;
    int st;
    struct rusage ru;
    if (wait4(c, &st, 0, &ru) != c)
        return r;
    r.wall_s = (double)(mt_bench_now_ns() - t0) / 1e9;
    r.cpu_s = tv_s(ru.ru_utime) + tv_s(ru.ru_stime);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return r;
}

static double cpu_now_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return tv_s(ru.ru_utime) + tv_s(ru.ru_stime);
}

/* Every line of path into a report engine, as `memtrace report` reads it, no analysis. */
static row_t run_read(const char *name, const char *path, bool jansson)
{
    row_t r = {.name = name, .status = -1};
    mt__report_cfg_t cfg = mt__report_cfg_default();
    cfg.general_reader = jansson;
    mt__report_t *rep = NULL;
    if (mt__report_create(&rep, &cfg) != 0)
        return r;
    unsigned long bad = 0;
    char *paths[1] = {(char *)path};
    double c0 = cpu_now_s();
    uint64_t t0 = mt_bench_now_ns();
    r.status = mt_tool_read_logs(rep, "bench_readers", paths, 1, &bad);
    r.wall_s = (double)(mt_bench_now_ns() - t0) / 1e9;
    r.cpu_s = cpu_now_s() - c0;
    if (bad)
        r.status = 3;
    mt__report_destroy(&rep);
    return r;
}

/* The fast decoder alone over lines already in memory (the file mapped, its pages faulted
 * in first): its own ceiling. */
static row_t run_decode(const char *path)
{
    row_t r = {.name = "decode only (fast, in memory)", .status = -1};
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_size == 0) {
        if (fd >= 0)
            close(fd);
        return r;
    }
    char *buf = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    close(fd);
    if (buf == MAP_FAILED)
        return r;
    uint64_t ok = 0;
    double c0 = cpu_now_s();
    uint64_t t0 = mt_bench_now_ns();
    for (const char *p = buf, *end = buf + sb.st_size; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        mt_event_rec_t ev;
        int pid;
        const char *tag;
        size_t tl;
        ok += mt__ndjson_event(p, len, &ev, &pid, &tag, &tl);
        p += len + 1;
    }
    r.wall_s = (double)(mt_bench_now_ns() - t0) / 1e9;
    r.cpu_s = cpu_now_s() - c0;
    r.status = ok > 0 ? 0 : 3;
    munmap(buf, (size_t)sb.st_size);
    return r;
}

static bool have(const char *prog)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

static void print_row(const row_t *r, double mb, uint64_t events)
{
    if (r->status < 0 || r->wall_s <= 0) {
        printf("%-42s %9s\n", r->name, "not run");
        return;
    }
    printf("%-42s %9.2f %9.2f %9.0f %11.0f %12.2f%s\n", r->name, r->wall_s, r->cpu_s,
           mb / r->wall_s, r->cpu_s > 0 ? mb / r->cpu_s : 0.0, (double)events / r->wall_s / 1e6,
           r->status ? "  (failed)" : "");
}

static const char py_loop[] = "import json, sys\n"
                              "n = 0\n"
                              "for line in sys.stdin.buffer:\n"
                              "    json.loads(line)\n"
                              "    n += 1\n";

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_readers TRACE.csv MEMTRACE_EXE [--mb N] [--keep PATH]\n");
        return 2;
    }
    double mb_target = 400;
    const char *keep = NULL;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--mb") == 0)
            mb_target = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--keep") == 0)
            keep = argv[i + 1];
    }
    mt_bench_print_machine(stdout);
    printf("threads: 1 (every reader below is single-threaded)\n");

    char err[256];
    mt_trace_t *t = NULL;
    if (mt_trace_load(&t, argv[1], err, sizeof err) != 0) {
        fprintf(stderr, "bench_readers: %s\n", err);
        return 1;
    }
    evbuf_t evs = {0};
    int rc = record_trace(t, &evs);
    mt_trace_free(&t);
    if (rc != 0 || evs.n == 0) {
        fprintf(stderr, "bench_readers: the replay recorded no events\n");
        return 1;
    }
    char tmp[] = "/tmp/bench_readers_XXXXXX.ndjson";
    const char *path = keep;
    if (!path) {
        int fd = mkstemps(tmp, 7);
        if (fd < 0) {
            perror("bench_readers: mkstemps");
            return 1;
        }
        close(fd);
        path = tmp;
    }
    uint64_t events = 0;
    uint64_t t0 = mt_bench_now_ns();
    if (write_log(path, &evs, mb_target, &events) != 0) {
        fprintf(stderr, "bench_readers: cannot write %s\n", path);
        return 1;
    }
    free(evs.v);
    struct stat sb;
    stat(path, &sb);
    double mb = (double)sb.st_size / 1e6;
    printf("log: %s, %.0f MB, %.2f M event lines (%.0f bytes each), written in %.1f s\n", path, mb,
           (double)events / 1e6, (double)sb.st_size / (double)events,
           (double)(mt_bench_now_ns() - t0) / 1e9);

    /* Warm the page cache, so every row reads from memory. */
    char *cat_argv[] = {"cat", (char *)path, NULL};
    run_cmd("cat", cat_argv, NULL, NULL);

    row_t rows[10];
    int n = 0;
    rows[n++] = run_cmd("cat > /dev/null", cat_argv, NULL, NULL);
    char *py_argv[] = {"python3", "-c", (char *)py_loop, NULL};
    rows[n++] = have("python3") ? run_cmd("python3 json.loads loop", py_argv, path, NULL)
                                : (row_t){.name = "python3 json.loads loop", .status = -1};
    char *jq_argv[] = {"jq", "-c", ".", (char *)path, NULL};
    rows[n++] = have("jq") ? run_cmd("jq -c .", jq_argv, NULL, NULL)
                           : (row_t){.name = "jq -c . (not installed)", .status = -1};
    rows[n++] = run_read("read, before (MEMTRACE_READER=jansson)", path, true);
    rows[n++] = run_read("read, after (fast decoder)", path, false);
    rows[n++] = run_decode(path);
    char *rep_argv[] = {argv[2], "report", (char *)path, NULL};
    rows[n++] =
        run_cmd("memtrace report, before (jansson)", rep_argv, NULL, "MEMTRACE_READER=jansson");
    rows[n++] = run_cmd("memtrace report, after", rep_argv, NULL, NULL);

    printf("\n%-42s %9s %9s %9s %11s %12s\n", "reader", "wall s", "cpu s", "MB/s", "MB/cpu-s",
           "M events/s");
    for (int i = 0; i < n; i++)
        print_row(&rows[i], mb, events);
    if (!keep)
        unlink(path);
    int failed = 0;
    for (int i = 0; i < n; i++)
        failed |= rows[i].status > 0;
    return failed ? 1 : 0;
}
