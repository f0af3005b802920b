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
 * analysis and output included; so are the plot, export and view rows (view: the loading of
 * the log, until it says where to open the page, then Ctrl-C). MEMTRACE_READER=jansson
 * selects the general path (jansson, then mt_prof_event_from_json) for the "jansson" rows;
 * --before EXE adds rows of another build (the tree before a change) on the same file. Rows
 * of a command also give its peak RSS (the child's ru_maxrss); export's give its output's
 * size beside it.
 *
 * --one-process writes the copies of the trace as one long run of one process (export
 * writes one process: its output then grows with the log).
 *
 * --no-jansson leaves out the jansson rows (a multi-GB log takes minutes through jansson).
 * --rounds N runs the memtrace commands N times, the builds interleaved (before, after,
 * after, before, ...), and keeps of each row the run of least CPU time: on cores other work
 * shares, a single run moves by a fifth from one minute to the next.
 * The diff row compares the log with itself: it reads the file twice, and its MB/s count
 * both copies.
 *
 * usage: bench_readers TRACE.csv MEMTRACE_EXE [--mb N] [--keep PATH] [--before EXE]
 *                      [--one-process] [--no-jansson] [--rounds N] */
#include <errno.h>
#include <signal.h>
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

/* Copies of the recorded events until the file holds mb megabytes: one process each, or
 * (one) all one process, a run that does the trace again and again (each copy ends with
 * every block and segment freed, so the next one starts from an empty device). *events:
 * event lines written. 0 or -1. */
static int write_log(const char *path, const evbuf_t *evs, double mb, bool one, uint64_t *events)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    static char line[4096];
    uint64_t bytes = 0, n = 0;
    for (int copy = 0; bytes < mb * 1e6; copy++) {
        int pid = one ? 10000 : 10000 + copy;
        uint64_t first = one ? n : 0; /* sequence numbers and times go on across copies */
        if (!one || copy == 0)
            write_json_line(f, mt_prof_hello_to_json(pid, "bench_readers", 0, 0));
        for (size_t i = 0; i < evs->n; i++) {
            mt_event_rec_t ev = evs->v[i];
            ev.seq = first + i;
            ev.time_ns = 1000000 + 1000 * (first + i);
            size_t len = mt_prof_event_write(line, sizeof line, &ev, pid, NULL, NULL);
            if (len >= sizeof line || fwrite(line, 1, len, f) != len) {
                fclose(f);
                return -1;
            }
            bytes += len;
            n++;
        }
        if (!one || bytes >= mb * 1e6)
            fprintf(f,
                    "{\"v\":1,\"type\":\"exit\",\"pid\":%d,\"t_ns\":%llu,\"clean\":true,"
                    "\"emitted\":%llu,\"dropped\":0,\"lost\":0}\n",
                    pid, (unsigned long long)(1000000 + 1000 * (first + evs->n)),
                    (unsigned long long)(one ? n : evs->n));
    }
    *events = n;
    return fclose(f) == 0 ? 0 : -1;
}

/* ---- timing ---- */

typedef struct row_s {
    const char *name;
    double wall_s, cpu_s;
    double rss_mb; /* the child's peak resident set, MB; 0: not a child */
    double out_mb; /* the size of what it wrote to OUT, MB; 0: not measured */
    double reads;  /* copies of the log it reads: 2 for diff (the log against itself), else 1 */
    int status;    /* exit status; -1 not run */
} row_t;

static double tv_s(struct timeval tv)
{
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

/* Runs argv with stdin from in (NULL: inherited) and stdout to /dev/null; extra_env one
 * "K=V" or NULL. until: NULL, or a text the child writes to stderr once it is done with
 * what is timed (memtrace view: "open http"); it is then stopped with SIGINT, and its
 * stderr is not shown. */
static row_t run_until(const char *name, char *const argv[], const char *in, const char *extra_env,
                       const char *until)
{
    row_t r = {.name = name, .status = -1};
    int pfd[2] = {-1, -1};
    if (until && pipe(pfd) != 0)
        return r;
    fflush(NULL); /* or the child writes our buffered lines again */
    uint64_t t0 = mt_bench_now_ns();
    pid_t c = fork();
    if (c == 0) {
        if (in && !freopen(in, "r", stdin))
            _exit(126);
        if (!freopen("/dev/null", "w", stdout))
            _exit(126);
        if (until) {
            dup2(pfd[1], 2);
            close(pfd[0]);
            close(pfd[1]);
        }
        if (extra_env)
            putenv((char *)extra_env);
        execvp(argv[0], argv);
        _exit(127);
    }
    if (until) {
        close(pfd[1]);
        char buf[4096];
        size_t have = 0;
        ssize_t got;
        bool seen = false;
        while (!seen && (got = read(pfd[0], buf + have, sizeof buf - 1 - have)) > 0) {
            have += (size_t)got;
            buf[have] = '\0';
            seen = strstr(buf, until) != NULL;
            if (have > sizeof buf / 2) { /* keep the tail, where the text may be cut */
                memmove(buf, buf + have - 64, 64);
                have = 64;
            }
        }
        if (c > 0)
            kill(c, SIGINT);
        close(pfd[0]);
    }
    if (c < 0)
        return r;
    int st;
    struct rusage ru;
    if (wait4(c, &st, 0, &ru) != c)
        return r;
    r.wall_s = (double)(mt_bench_now_ns() - t0) / 1e9;
    r.cpu_s = tv_s(ru.ru_utime) + tv_s(ru.ru_stime);
    r.rss_mb = (double)ru.ru_maxrss / 1024.0; /* KiB on Linux */
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return r;
}

static row_t run_cmd(const char *name, char *const argv[], const char *in, const char *extra_env)
{
    return run_until(name, argv, in, extra_env, NULL);
}

static double cpu_now_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return tv_s(ru.ru_utime) + tv_s(ru.ru_stime);
}

/* Every line of path into a report engine, as `memtrace report` reads it, no analysis and
 * no event kept: the reading alone. */
static row_t run_read(const char *name, const char *path, bool jansson)
{
    row_t r = {.name = name, .status = -1};
    mt__report_cfg_t cfg = mt__report_cfg_default();
    cfg.general_reader = jansson;
    cfg.stream = true;
    cfg.replay_only = true;
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
    if (r->reads > 1) {
        mb *= r->reads;
        events = (uint64_t)((double)events * r->reads);
    }
    if (r->status < 0 || r->wall_s <= 0) {
        printf("%-56s %9s\n", r->name, "not run");
        return;
    }
    char rss[32] = "-", out[32] = "";
    if (r->rss_mb > 0)
        snprintf(rss, sizeof rss, "%.0f", r->rss_mb);
    if (r->out_mb > 0)
        snprintf(out, sizeof out, "  (output %.0f MB)", r->out_mb);
    printf("%-56s %9.2f %9.2f %9.0f %11.0f %12.2f %9s%s%s\n", r->name, r->wall_s, r->cpu_s,
           mb / r->wall_s, r->cpu_s > 0 ? mb / r->cpu_s : 0.0, (double)events / r->wall_s / 1e6,
           rss, out, r->status ? "  (failed)" : "");
}

/* The rows of one memtrace executable: report, plot, export (to out, whose size the row
 * keeps) and view's load. what: the rows' suffix; env: NULL or MEMTRACE_READER=jansson. */
static int exe_rows(row_t *rows, const char *exe, const char *path, const char *out,
                    const char *what, const char *env)
{
    static char names[64][96];
    static int nn;
    int n = 0;
    if (nn + 5 > 64) /* later rounds reuse the names of the first */
        nn = 0;
    char *rep[] = {(char *)exe, "report", (char *)path, NULL};
    char *plot[] = {(char *)exe, "plot", "-o", "-", (char *)path, NULL};
    char *exp[] = {(char *)exe,  "export", "--format",  "torch-snapshot",
                   (char *)path, "-o",     (char *)out, NULL};
    char *view[] = {(char *)exe, "view", "--port", "0", (char *)path, NULL};
    char *diff[] = {(char *)exe, "diff", "--json", (char *)path, (char *)path, NULL};
    static const char *const cmds[] = {"memtrace report", "memtrace plot",
                                       "memtrace export torch-snapshot", "memtrace view (load)",
                                       "memtrace diff (log against itself)"};
    char *const *argvs[] = {rep, plot, exp, view, diff};
    for (int i = 0; i < 5 && nn < 64; i++) {
        snprintf(names[nn], sizeof names[nn], "%s, %s", cmds[i], what);
        rows[n] = run_until(names[nn++], argvs[i], NULL, env, i == 3 ? "open http" : NULL);
        if (i == 4)
            rows[n].reads = 2;
        if (i == 2) {
            struct stat sb;
            rows[n].out_mb = stat(out, &sb) == 0 ? (double)sb.st_size / 1e6 : 0;
            unlink(out);
        }
        n++;
    }
    return n;
}

static const char py_loop[] = "import json, sys\n"
                              "n = 0\n"
                              "for line in sys.stdin.buffer:\n"
                              "    json.loads(line)\n"
                              "    n += 1\n";

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_readers TRACE.csv MEMTRACE_EXE [--mb N] [--keep PATH] "
                        "[--before EXE] [--one-process] [--no-jansson] [--rounds N]\n");
        return 2;
    }
    double mb_target = 400;
    const char *keep = NULL, *before = NULL;
    bool one = false, jansson = true;
    int rounds = 1;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--one-process") == 0) {
            one = true;
            continue;
        }
        if (strcmp(argv[i], "--no-jansson") == 0) {
            jansson = false;
            continue;
        }
        if (i + 1 >= argc)
            break;
        if (strcmp(argv[i], "--mb") == 0)
            mb_target = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--keep") == 0)
            keep = argv[i + 1];
        else if (strcmp(argv[i], "--before") == 0)
            before = argv[i + 1];
        else if (strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[i + 1]) < 1 ? 1 : atoi(argv[i + 1]) > 5 ? 5 : atoi(argv[i + 1]);
        i++;
    }
    mt_bench_print_machine(stdout);
    printf(
        "threads: the memtrace commands read with 2 threads when 2 cores are online (one cuts and\n"
        "decodes lines, the other applies them: analysis/lines_pipe.h), and so does the \"read\" "
        "row;\n"
        "the \"decode\" row, cat, python3 and jq use 1. MB/cpu-s counts the CPU time of every\n"
        "thread.\n");

    char err[256];
    mt_trace_t *t = NULL;
    if (mt__trace_load(&t, argv[1], err, sizeof err) != 0) {
        fprintf(stderr, "bench_readers: %s\n", err);
        return 1;
    }
    evbuf_t evs = {0};
    int rc = record_trace(t, &evs);
    mt__trace_free(&t);
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
    if (write_log(path, &evs, mb_target, one, &events) != 0) {
        fprintf(stderr, "bench_readers: cannot write %s\n", path);
        return 1;
    }
    free(evs.v);
    struct stat sb;
    stat(path, &sb);
    double mb = (double)sb.st_size / 1e6;
    printf("log: %s, %.0f MB, %.2f M event lines (%.0f bytes each), %s, written in %.1f s\n", path,
           mb, (double)events / 1e6, (double)sb.st_size / (double)events,
           one ? "one process" : "one process per copy of the trace",
           (double)(mt_bench_now_ns() - t0) / 1e9);

    /* Warm the page cache, so every row reads from memory. */
    char *cat_argv[] = {"cat", (char *)path, NULL};
    run_cmd("cat", cat_argv, NULL, NULL);

    if (rounds > 1)
        printf("rows of memtrace commands: the least CPU of %d runs, before and after "
               "interleaved\n",
               rounds);
    row_t rows[40];
    int n = 0;
    rows[n++] = run_cmd("cat > /dev/null", cat_argv, NULL, NULL);
    char *py_argv[] = {"python3", "-c", (char *)py_loop, NULL};
    rows[n++] = have("python3") ? run_cmd("python3 json.loads loop", py_argv, path, NULL)
                                : (row_t){.name = "python3 json.loads loop", .status = -1};
    char *jq_argv[] = {"jq", "-c", ".", (char *)path, NULL};
    rows[n++] = have("jq") ? run_cmd("jq -c .", jq_argv, NULL, NULL)
                           : (row_t){.name = "jq -c . (not installed)", .status = -1};
    if (jansson)
        rows[n++] = run_read("read, before (MEMTRACE_READER=jansson)", path, true);
    rows[n++] = run_read("read, after (fast decoder)", path, false);
    rows[n++] = run_decode(path);
    char out[64];
    snprintf(out, sizeof out, "/tmp/bench_readers_%d.pickle", (int)getpid());
    if (jansson)
        n += exe_rows(rows + n, argv[2], path, out, "MEMTRACE_READER=jansson",
                      "MEMTRACE_READER=jansson");
    /* before and after, interleaved over the rounds; each row the run of least CPU. */
    int at_before = n, at_after = before ? n + 5 : n;
    for (int k = 0; k < rounds; k++) {
        for (int b = 0; b < 2; b++) {
            bool is_before = (b == 0) == (k % 2 == 0);
            if (is_before && !before)
                continue;
            row_t got[5];
            int at = is_before ? at_before : at_after;
            exe_rows(got, is_before ? before : argv[2], path, out,
                     is_before ? "before (--before build)" : "after", NULL);
            for (int i = 0; i < 5; i++)
                if (k == 0 || (got[i].status == 0 && got[i].cpu_s < rows[at + i].cpu_s))
                    rows[at + i] = got[i];
        }
    }
    n = at_after + 5;

    printf("\n%-56s %9s %9s %9s %11s %12s %9s\n", "reader", "wall s", "cpu s", "MB/s", "MB/cpu-s",
           "M events/s", "RSS MB");
    for (int i = 0; i < n; i++)
        print_row(&rows[i], mb, events);
    if (!keep)
        unlink(path);
    int failed = 0;
    for (int i = 0; i < n; i++)
        failed |= rows[i].status > 0;
    return failed ? 1 : 0;
}
