/* The two decoders of the log readers give the same result (docs/readers.md): every
 * command that reads logs (report, plot, export, diff, view) is run on the same logs once
 * through the general path (MEMTRACE_READER=jansson, or the view's view_general_reader)
 * and once through the event-line decoder, and what it prints, writes and serves must be
 * the same bytes, with the same exit status. The logs: the ones the repo ships (daemon
 * logs, stack tables, malformed lines) and a replay of a real trace through the allocator
 * on the sim backend, written by the profiler's line writer.
 *
 * usage: test_daemon_readers MEMTRACE_EXE SOURCE_ROOT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "analysis/binlog_conv.h"
#include "analysis/trace_csv.h"
#include "daemon/internal.h"
#include "daemon/web.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "tests/common/test_main.h"
#include "tests/daemon/harness.h"

#define REPLAY_EVENTS      30000 /* events of the replayed trace written (about 7 MB) */
#define NLOGS              8
#define EXPORT_EVENTS      250000 /* events of the long process export writes (about 60 MB) */
#define EXPORT_PROCS       8      /* processes of the log of many, each of */
#define EXPORT_PROC_EVENTS 50000  /* events (about 98 MB in all) */

static const char *exe, *root;
static char dir[64];
static char logs[NLOGS][512];
static size_t nlogs;

/* ---- the replay logs ---- */

typedef struct evbuf_s {
    mt_event_rec_t *v;
    size_t n, cap;
} evbuf_t;

static void keep_event(void *ud, const mt_event_rec_t *ev)
{
    evbuf_t *b = ud;
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 4096;
        b->v = realloc(b->v, b->cap * sizeof *b->v);
        assert_non_null(b->v);
    }
    b->v[b->n++] = *ev;
}

/* Every event of one replay of trace through the allocator on the sim backend, its end
 * included (every block and segment freed). */
static void record(const char *trace, evbuf_t *b)
{
    char err[256];
    mt_trace_t *t = NULL;
    if (mt__trace_load(&t, trace, err, sizeof err) != 0)
        fail_msg("%s", err);
    mt_event_sink_t sink = {.emit = keep_event, .ud = b};
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = (size_t)64 << 30;
    mt_backend_t *be = NULL;
    assert_int_equal(mt_backend_create(&be, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = be;
    ac.sink = &sink;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &ac), 0);
    void **ptr = calloc(t->nslots + 1, sizeof *ptr);
    assert_non_null(ptr);
    for (size_t i = 0; i < t->nops; i++) {
        const mt_trace_op_t *op = &t->ops[i];
        if (op->action == MT_TRACE_ALLOCATE) {
            /* Tags cycle over the built-in ones, so that lines carry their names. */
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
    mt_alloc_destroy(&a);
    mt_backend_destroy(&be);
    free(ptr);
    mt__trace_free(&t);
    assert_true(b->n >= 1000);
}

/* Process pid into f: its hello, the events of b again and again (sequence numbers and
 * times going on) until n are written, its exit. */
static void write_process(FILE *f, const evbuf_t *b, int pid, size_t n)
{
    json_t *h = mt_prof_hello_to_json(pid, "replay", 0, 0);
    char *hello = h ? json_dumps(h, JSON_COMPACT) : NULL;
    json_decref(h);
    assert_non_null(hello);
    fprintf(f, "%s\n", hello);
    free(hello);
    char line[4096];
    for (size_t i = 0; i < n; i++) {
        mt_event_rec_t e = b->v[i % b->n];
        e.seq = i;
        e.time_ns = 1000000 + 1000 * (uint64_t)i;
        size_t len = mt_prof_event_write(line, sizeof line, &e, pid, NULL, NULL);
        assert_true(len < sizeof line);
        assert_int_equal(fwrite(line, 1, len, f), len);
    }
    fprintf(f, "{\"v\":1,\"type\":\"exit\",\"pid\":%d,\"t_ns\":%zu,\"clean\":true}\n", pid,
            1000000 + 1000 * n);
}

static evbuf_t pangu;

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/mt-readers-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    /* Two processes: a replay cut short (blocks and segments still live at its end) and
     * a whole one of another trace. */
    char trace[512];
    snprintf(trace, sizeof trace, "%s/data/traces/somas_pangu_2.6B.csv", root);
    record(trace, &pangu);
    evbuf_t resnet = {0};
    snprintf(trace, sizeof trace, "%s/data/traces/somas_resnet50.csv", root);
    record(trace, &resnet);
    snprintf(logs[0], sizeof logs[0], "%s/replay.ndjson", dir);
    FILE *f = fopen(logs[0], "w");
    if (!f)
        return -1;
    write_process(f, &pangu, 4242, REPLAY_EVENTS);
    write_process(f, &resnet, 4343, resnet.n);
    free(resnet.v);
    if (fclose(f) != 0)
        return -1;
    static const char *const shipped[] = {
        "tests/prof/data/valid_daemon.ndjson",
        "tests/prof/data/invalid.ndjson",
        "tests/snapshot/data/frames_log.ndjson",
        "tests/fuzz/corpus/report/callsites.ndjson",
        "tests/fuzz/corpus/report/stacks_valid.ndjson",
        "tests/fuzz/corpus/report/one_process.ndjson",
        "tests/fuzz/corpus/report/stacks_ends_mid_table.ndjson",
    };
    nlogs = 1;
    for (size_t i = 0; i < sizeof shipped / sizeof *shipped && nlogs < NLOGS; i++)
        snprintf(logs[nlogs++], sizeof logs[0], "%s/%s", root, shipped[i]);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(logs[0]);
    rmdir(dir);
    free(pangu.v);
    return 0;
}

/* ---- the commands ---- */

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        *len = 0;
        return strdup("(no file)");
    }
    char *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n + 65536 > cap) {
            cap = 2 * (n + 65536);
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    fclose(f);
    *len = n;
    return buf;
}

typedef struct run_s {
    int status;
    char *out, *err, *file; /* standard output, standard error, the file written (-o) */
    size_t nout, nerr, nfile;
} run_t;

/* args with OUT standing for the output file; MEMTRACE_READER=jansson when general. */
static run_t run(const char *args, bool general)
{
    char cmd[4096], path[128];
    snprintf(path, sizeof path, "%s/out", dir);
    unlink(path);
    char a[2048];
    const char *o = strstr(args, "OUT");
    if (o)
        snprintf(a, sizeof a, "%.*s%s%s", (int)(o - args), args, path, o + 3);
    else
        snprintf(a, sizeof a, "%s", args);
    snprintf(cmd, sizeof cmd, "cd %s && %s %s %s > %s/stdout 2> %s/stderr", dir,
             general ? "MEMTRACE_READER=jansson" : "env -u MEMTRACE_READER", exe, a, dir, dir);
    run_t r = {0};
    int st = system(cmd);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    char p[128];
    snprintf(p, sizeof p, "%s/stdout", dir);
    r.out = slurp(p, &r.nout);
    unlink(p);
    snprintf(p, sizeof p, "%s/stderr", dir);
    r.err = slurp(p, &r.nerr);
    unlink(p);
    r.file = slurp(path, &r.nfile);
    unlink(path);
    return r;
}

static void run_free(run_t *r)
{
    free(r->out);
    free(r->err);
    free(r->file);
}

static void same(const char *what, const char *args, const char *a, size_t na, const char *b,
                 size_t nb)
{
    if (na != nb || memcmp(a, b, na) != 0) {
        size_t i = 0;
        while (i < na && i < nb && a[i] == b[i])
            i++;
        fail_msg("%s %s: %s differs at byte %zu (%zu vs %zu bytes): jansson (or memory) "
                 "'%.80s' / fast (or spooled) '%.80s'",
                 exe, args, what, i, na, nb, a + (i < na ? i : na), b + (i < nb ? i : nb));
    }
}

static void both_ways(const char *args)
{
    run_t g = run(args, true), f = run(args, false);
    if (g.status != f.status)
        fail_msg("%s: exit %d through jansson, %d through the fast decoder", args, g.status,
                 f.status);
    same("stdout", args, g.out, g.nout, f.out, f.nout);
    same("stderr", args, g.err, g.nerr, f.err, f.nerr);
    same("the output file", args, g.file, g.nfile, f.file, f.nfile);
    run_free(&g);
    run_free(&f);
}

static void test_commands_same(void **state)
{
    (void)state;
    static const char *const forms[] = {
        "report %s",
        "report --json %s",
        "report --json --by site --stacks --replay %s",
        "plot -o OUT %s",
        "plot --flamegraph -o OUT %s",
        "export --format torch-snapshot %s -o OUT",
        "export --format torch-snapshot --torch-format 1 %s -o OUT",
        "diff --json %s %s",
    };
    char args[2048];
    for (size_t l = 0; l < nlogs; l++)
        for (size_t i = 0; i < sizeof forms / sizeof *forms; i++) {
            snprintf(args, sizeof args, forms[i], logs[l], logs[0]);
            both_ways(args);
        }
}

/* The replay log really is read by the fast decoder: its report through the general path
 * is the reference above, so this only makes sure the comparison compared something. */
static void test_replay_nonempty(void **state)
{
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "report --json %s", logs[0]);
    run_t r = run(args, false);
    assert_int_equal(r.status, 0);
    json_t *j = json_loadb(r.out, r.nout, 0, NULL);
    assert_non_null(j);
    assert_true(json_integer_value(json_object_get(j, "lines")) > REPLAY_EVENTS);
    json_decref(j);
    run_free(&r);
}

/* ---- peak memory of a command ---- */

/* Linux counts in a child's ru_maxrss the pages it held before its exec: a command forked
 * from this process (large: the replays recorded, and under meson's MALLOC_PERTURB_ every
 * block it allocated is touched) would peak at this process's size at least (22.4 MB for
 * every command, whatever it did). So the commands are started by a fresh copy of this
 * program (spawn_main), whose own pages are few, and it passes their figure back. */

/* `test_daemon_readers --spawn CMD ARGS...`: runs CMD (its output to /dev/null) and prints
 * its peak resident set in KiB and its exit status. `memtrace view` serves until Ctrl-C: it
 * is stopped so once it says where to open its page (its load done). */
static int spawn_main(char **argv)
{
    bool view = argv[3] && strcmp(argv[3], "view") == 0;
    int fd[2] = {-1, -1};
    if (view && pipe(fd) != 0)
        return 125;
    pid_t c = fork();
    if (c < 0)
        return 125;
    if (c == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr))
            _exit(126);
        if (view && (dup2(fd[1], 2) < 0 || close(fd[0]) != 0))
            _exit(126);
        execv(argv[2], argv + 2);
        _exit(127);
    }
    if (view) {
        close(fd[1]);
        char buf[1024];
        size_t have = 0;
        ssize_t got;
        while ((got = read(fd[0], buf + have, sizeof buf - 1 - have)) > 0) {
            have += (size_t)got;
            buf[have] = '\0';
            if (strstr(buf, "open http"))
                break;
            if (have > sizeof buf / 2) { /* the tail, where the text may be cut */
                memmove(buf, buf + have - 32, 32);
                have = 32;
            }
        }
        kill(c, SIGINT);
        close(fd[0]);
    }
    int st;
    struct rusage ru;
    if (wait4(c, &st, 0, &ru) != c)
        return 125;
    printf("%ld %d\n", ru.ru_maxrss, WIFEXITED(st) ? WEXITSTATUS(st) : 128);
    return 0;
}

/* The peak resident set of `memtrace args...` (args NULL-terminated, at most 8), in bytes;
 * exit status 0 asserted. */
static double peak_rss_of(const char *const *args)
{
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(len > 0);
    self[len] = '\0';
    char *av[12] = {self, "--spawn", (char *)exe};
    for (int i = 0; args[i]; i++) {
        assert_true(i < 8);
        av[3 + i] = (char *)args[i];
    }
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    fflush(NULL);
    pid_t c = fork();
    assert_true(c >= 0);
    if (c == 0) {
        if (dup2(fd[1], 1) < 0)
            _exit(126);
        close(fd[0]);
        close(fd[1]);
        execv(self, av);
        _exit(127);
    }
    close(fd[1]);
    char buf[64];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 && (r = read(fd[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    close(fd[0]);
    int st;
    assert_int_equal(waitpid(c, &st, 0), c);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    long kb = 0;
    int status = -1;
    assert_int_equal(sscanf(buf, "%ld %d", &kb, &status), 2);
    assert_int_equal(status, 0);
    return (double)kb * 1024;
}

/* ---- export's memory ---- */

/* Exports the process with the most events of log, and fails when the peak resident set
 * passes 1.5 x the output's size + 4 MiB. */
static void export_within(const char *what, const char *log)
{
    char out[128];
    snprintf(out, sizeof out, "%s/long.pickle", dir);
    const char *args[] = {"export", "--format", "torch-snapshot", log, "-o", out, NULL};
    double rss = peak_rss_of(args);
    struct stat sb, lb;
    assert_int_equal(stat(out, &sb), 0);
    assert_int_equal(stat(log, &lb), 0);
    double size = (double)sb.st_size;
    print_message("export, %s: log %.1f MB, output %.1f MB, peak RSS %.1f MB (%.2f x the "
                  "output)\n",
                  what, (double)lb.st_size / 1e6, size / 1e6, rss / 1e6, rss / size);
    unlink(out);
    /* The process's own pages (code, libraries, buffers) are about 4 MiB. */
    if (rss > 1.5 * size + (4 << 20))
        fail_msg("export (%s): peak RSS %.1f MB is above 1.5 x its output (%.1f MB) + 4 MiB", what,
                 rss / 1e6, size / 1e6);
}

/* `memtrace export` of one long process keeps its memory near the output's size (the
 * issue's bound: 1.5 times), not the log's: the events are fed from the report to the
 * snapshot without a copy, the snapshot's trace is built in place, and the log's events go
 * before the file is written. Measured by the child's peak resident set; under a sanitizer
 * that figure means nothing, and the test is skipped. */
static void test_export_memory(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    skip();
#endif
    char log[128];
    snprintf(log, sizeof log, "%s/long.ndjson", dir);
    FILE *f = fopen(log, "w");
    assert_non_null(f);
    write_process(f, &pangu, 5000, EXPORT_EVENTS);
    assert_int_equal(fclose(f), 0);
    export_within("one process", log);
    unlink(log);
}

/* The same of a log of EXPORT_PROCS processes (a daemon's log): the process exported is
 * known only at the end (the one with the most events), so every process's events are kept
 * until then, but on disk (analysis/event_spool.h), a chunk of each in memory. Before, they
 * were kept in memory: 64 bytes an event of every process, about 26 MB here against an
 * output of 4.6 MB. */
static void test_export_memory_procs(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    skip();
#endif
    char log[128];
    snprintf(log, sizeof log, "%s/procs.ndjson", dir);
    FILE *f = fopen(log, "w");
    assert_non_null(f);
    for (int i = 0; i < EXPORT_PROCS; i++)
        write_process(f, &pangu, 6100 + i, EXPORT_PROC_EVENTS + (i == 3 ? 1 : 0));
    assert_int_equal(fclose(f), 0);
    export_within("many processes", log);
    unlink(log);
}

/* ---- memory bounded by the model ---- */

/* The peak resident set of `memtrace a1 a2 [a3] [a4] > /dev/null`, in bytes; exit status 0
 * asserted. */
static double peak_rss(const char *a1, const char *a2, const char *a3, const char *a4)
{
    const char *args[] = {a1, a2, a3, a4, NULL};
    return peak_rss_of(args);
}

/* `memtrace report` and `memtrace diff` apply each event to the model as it is read and keep
 * none: a log of twice the events with the same live blocks and segments (the replay frees
 * everything at the end of each copy of the trace) takes no more memory. Before, every event
 * was kept (64 bytes each: about 15 MB more here). Skipped under a sanitizer, whose shadow
 * memory makes RSS mean nothing. */
static void test_report_memory(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    skip();
#endif
    char logs2[2][128];
    double rss[2][2];
    size_t n = 4 * pangu.n; /* about 230 k events, 57 MB */
    for (int k = 0; k < 2; k++) {
        snprintf(logs2[k], sizeof logs2[k], "%s/mem%d.ndjson", dir, k);
        FILE *f = fopen(logs2[k], "w");
        assert_non_null(f);
        write_process(f, &pangu, 6000, (k + 1) * n);
        assert_int_equal(fclose(f), 0);
        rss[k][0] = peak_rss("report", "--json", logs2[k], NULL);
        rss[k][1] = peak_rss("diff", "--json", logs2[k], logs2[k]);
    }
    for (int c = 0; c < 2; c++) {
        print_message("%s: %zu events %.1f MB, %zu events %.1f MB peak RSS\n",
                      c ? "diff" : "report", n, rss[0][c] / 1e6, 2 * n, rss[1][c] / 1e6);
        /* 2 MiB of slack: the allocator's arenas and the pipe's blocks vary a little. */
        if (rss[1][c] > rss[0][c] + (2 << 20))
            fail_msg("%s: peak RSS %.1f MB on %zu events, %.1f MB on %zu: it grows with the log",
                     c ? "diff" : "report", rss[0][c] / 1e6, n, rss[1][c] / 1e6, 2 * n);
    }
    unlink(logs2[0]);
    unlink(logs2[1]);
}

/* The peak RSS of `memtrace CMD ARGS... LOG` on a log of n, then 2n events of one process
 * with the same live set: no more than 2 MiB apart (the allocator's arenas and the pipe's
 * blocks vary a little), or the command keeps memory that grows with the log. */
static void rss_flat(const char *cmd, const char *a1, const char *a2)
{
    char logs2[2][128];
    double rss[2];
    size_t n = 4 * pangu.n; /* about 230 k events, 57 MB */
    for (int k = 0; k < 2; k++) {
        snprintf(logs2[k], sizeof logs2[k], "%s/%smem%d.ndjson", dir, cmd, k);
        FILE *f = fopen(logs2[k], "w");
        assert_non_null(f);
        write_process(f, &pangu, 6000, (k + 1) * n);
        assert_int_equal(fclose(f), 0);
        rss[k] = peak_rss(cmd, a1, a2, logs2[k]);
        unlink(logs2[k]);
    }
    print_message("%s: %zu events %.1f MB, %zu events %.1f MB peak RSS\n", cmd, n, rss[0] / 1e6,
                  2 * n, rss[1] / 1e6);
    if (rss[1] > rss[0] + (2 << 20))
        fail_msg("%s: peak RSS %.1f MB on %zu events, %.1f MB on %zu: it grows with the log", cmd,
                 rss[0] / 1e6, n, rss[1] / 1e6, 2 * n);
}

/* `memtrace plot` replays the process it draws three times (extent and peaks, the map at the
 * peak, the time buckets), so it keeps the events, but on disk (analysis/event_spool.h).
 * Before, they were kept in memory, 64 bytes each (about 15 MB more here). */
static void test_plot_memory(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    skip();
#endif
    rss_flat("plot", "-o", "/dev/null");
}

/* `memtrace view` keeps each process's window of events for its past states (a million
 * each by default), but on disk (daemon/web.h, analysis/event_spool.h). Before, the windows
 * were in memory, 64 bytes an event (about 15 MB more here). */
static void test_view_memory(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    skip();
#endif
    rss_flat("view", "--port", "0");
}

/* ---- memtrace view's loader ---- */

static char *get(th_daemon_t *t, const char *path, int *status)
{
    char *resp = NULL;
    *status = th_http_get(t->port, path, &resp);
    char *body = strdup(th_http_body(resp));
    free(resp);
    assert_non_null(body);
    return body;
}

/* spool: NULL, or where the windows are kept (as `memtrace view` keeps them). */
static void load(th_daemon_t *t, bool general, const char *spool, const char *log,
                 unsigned long *events, unsigned long *bad, char *err, size_t errlen, int *rc)
{
    mt_d_cfg_t cfg = th_cfg();
    cfg.view_general_reader = general;
    cfg.max_exited = 1u << 16;
    th_daemon_create(t, cfg);
    mt__d_set_event_window(t->d, 4096); /* past states of the replay go through the base */
    assert_int_equal(mt__d_set_event_spool(t->d, spool), 0);
    *events = *bad = 0;
    err[0] = '\0';
    *rc = mt__d_view_load(t->d, log, events, bad, err, errlen);
    /* Times are shown on this machine's clock, its offset read once per daemon: the two
     * daemons' reads may differ by a microsecond. Both show monotonic times instead. */
    for (const mt_d_proc_t *p = t->d->procs; p; p = p->next) {
        mt_d_web_proc_t *w = mt__d_web_find(t->d, p);
        if (w)
            w->off_ns = 0;
    }
    th_daemon_run(t);
}

/* g's and f's answers to /state and every route of each process are the same bytes. */
static void routes_same(th_daemon_t *g, th_daemon_t *f, const char *log, json_t **state_out)
{
    int gs, fs;
    char *gst = get(g, "/state", &gs), *fst = get(f, "/state", &fs);
    assert_int_equal(gs, fs);
    /* Every byte but the daemon's own start time. */
    json_t *st = json_loads(gst, 0, NULL), *st2 = json_loads(fst, 0, NULL);
    assert_non_null(st);
    assert_non_null(st2);
    json_object_del(json_object_get(st, "daemon"), "start_realtime_ns");
    json_object_del(json_object_get(st2, "daemon"), "start_realtime_ns");
    char *d1 = json_dumps(st, JSON_COMPACT), *d2 = json_dumps(st2, JSON_COMPACT);
    same("/state", log, d1, strlen(d1), d2, strlen(d2));
    free(d1);
    free(d2);
    json_decref(st2);
    free(gst);
    free(fst);
    json_t *procs = json_object_get(st, "processes");
    size_t i;
    json_t *p;
    json_array_foreach(procs, i, p)
    {
        long long pid = (long long)json_integer_value(json_object_get(p, "pid"));
        static const char *const routes[] = {
            "/history?pid=%lld&buckets=300",
            "/map?pid=%lld",
            "/map?pid=%lld&seq=100",
            "/map?pid=%lld&seq=28000", /* within the replay's window, past its first chunks */
            "/tail?pid=%lld&n=1000",
            "/callsites?pid=%lld",
            "/callsites?pid=%lld&seq=27000",
            "/gap?pid=%lld",
            "/gap?pid=%lld&seq=29000",
            "/analysis?pid=%lld",
        };
        for (size_t k = 0; k < sizeof routes / sizeof *routes; k++) {
            char path[128];
            snprintf(path, sizeof path, routes[k], pid);
            char *a = get(g, path, &gs), *b = get(f, path, &fs);
            if (gs != fs)
                fail_msg("%s %s: status %d and %d", log, path, gs, fs);
            same(path, log, a, strlen(a), b, strlen(b));
            free(a);
            free(b);
        }
    }
    *state_out = st;
}

static void test_view_same(void **state)
{
    (void)state;
    for (size_t l = 0; l < nlogs; l++) {
        th_daemon_t g, f;
        unsigned long ge, gb, fe, fb;
        char gerr[320], ferr[320];
        int grc, frc;
        load(&g, true, NULL, logs[l], &ge, &gb, gerr, sizeof gerr, &grc);
        load(&f, false, NULL, logs[l], &fe, &fb, ferr, sizeof ferr, &frc);
        assert_int_equal(grc, frc);
        assert_int_equal(ge, fe);
        assert_int_equal(gb, fb);
        assert_string_equal(gerr, ferr);
        json_t *st;
        routes_same(&g, &f, logs[l], &st);
        if (l == 0) /* the replay: both processes, every event */
            assert_int_equal(json_array_size(json_object_get(st, "processes")), 2);
        json_decref(st);
        th_daemon_stop(&g);
        th_daemon_stop(&f);
    }
}

/* other, another form of log, loads through view's loader as log does: the same processes,
 * events, malformed lines (the first one's message but for the file's name) and routes. */
static void loads_same(const char *log, const char *other)
{
    th_daemon_t t, o;
    unsigned long te, tb, oe, ob;
    char terr[320], oerr[320];
    int trc, orc;
    load(&t, false, NULL, log, &te, &tb, terr, sizeof terr, &trc);
    load(&o, false, NULL, other, &oe, &ob, oerr, sizeof oerr, &orc);
    assert_int_equal(trc, orc);
    assert_int_equal(te, oe);
    assert_int_equal(tb, ob);
    const char *tm = strchr(terr, ':'), *om = strchr(oerr, ':');
    assert_string_equal(tm ? tm : "", om ? om : "");
    json_t *st;
    routes_same(&t, &o, log, &st);
    json_decref(st);
    th_daemon_stop(&t);
    th_daemon_stop(&o);
}

/* The binary form of each log (memtrace convert's) serves, through view's loader, what the
 * log serves: the same processes, events, malformed lines and routes. */
static void test_view_binary_same(void **state)
{
    (void)state;
    for (size_t l = 0; l < nlogs; l++) {
        char bin[128];
        snprintf(bin, sizeof bin, "%s/binary.mtlog", dir);
        FILE *in = fopen(logs[l], "rb"), *out = fopen(bin, "wb");
        assert_true(in && out);
        uint64_t lines, evs;
        assert_int_equal(mt__blog_from_ndjson(in, out, &lines, &evs), 0);
        fclose(in);
        assert_int_equal(fclose(out), 0);
        loads_same(logs[l], bin);
        unlink(bin);
    }
}

/* Writes src gzip'ed (zlib's encoder) to dst, cut to its first `keep` bytes (SIZE_MAX: whole). */
static void gzip_file(const char *src, const char *dst, size_t keep)
{
    FILE *in = fopen(src, "rb");
    assert_non_null(in);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.whole", dst);
    gzFile z = gzopen(tmp, "wb6");
    assert_non_null(z);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        assert_int_equal(gzwrite(z, buf, (unsigned)n), (int)n);
    fclose(in);
    assert_int_equal(gzclose(z), Z_OK);
    in = fopen(tmp, "rb");
    FILE *out = fopen(dst, "wb");
    assert_true(in && out);
    size_t left = keep;
    while (left > 0 && (n = fread(buf, 1, left < sizeof buf ? left : sizeof buf, in)) > 0) {
        assert_int_equal(fwrite(buf, 1, n, out), n);
        left -= n;
    }
    fclose(in);
    assert_int_equal(fclose(out), 0);
    unlink(tmp);
}

/* Each log gzip'ed serves, through view's loader, what the log serves; cut inside its
 * compressed data, it is one malformed line more, named, and the events before the cut
 * load. */
static void test_view_compressed_same(void **state)
{
    (void)state;
    for (size_t l = 0; l < nlogs; l++) {
        char gz[160];
        snprintf(gz, sizeof gz, "%s/log.ndjson.gz", dir);
        gzip_file(logs[l], gz, SIZE_MAX);
        loads_same(logs[l], gz);
        if (l == 0) { /* cut: a third of the compressed bytes */
            th_daemon_t t, c;
            unsigned long te, tb, ce, cb;
            char terr[320], cerr[320];
            int trc, crc;
            load(&t, false, NULL, logs[l], &te, &tb, terr, sizeof terr, &trc);
            th_daemon_stop(&t);
            struct stat sb;
            assert_int_equal(stat(gz, &sb), 0);
            gzip_file(logs[l], gz, (size_t)sb.st_size / 3);
            load(&c, false, NULL, gz, &ce, &cb, cerr, sizeof cerr, &crc);
            assert_int_equal(crc, 0);
            assert_int_equal(cb, tb + 1);
            assert_true(ce > 0 && ce < te);
            if (tb == 0)
                assert_non_null(strstr(cerr, "gzip: the file ends inside compressed data"));
            th_daemon_stop(&c);
        }
        unlink(gz);
    }
}

/* A window kept in a spool (`memtrace view`'s) serves what one in memory serves: the replay's
 * 30000 events go through a window of 4096, so its evicted chunks are in the base and its
 * past states read chunks back from the file. */
static void test_view_spooled_same(void **state)
{
    (void)state;
    for (size_t l = 0; l < nlogs; l++) {
        th_daemon_t m, s;
        unsigned long me, mb, se, sb;
        char merr[320], serr[320];
        int mrc, src;
        load(&m, false, NULL, logs[l], &me, &mb, merr, sizeof merr, &mrc);
        load(&s, false, dir, logs[l], &se, &sb, serr, sizeof serr, &src);
        assert_int_equal(mrc, src);
        assert_int_equal(me, se);
        assert_string_equal(merr, serr);
        for (const mt_d_proc_t *p = s.d->procs; p; p = p->next) {
            const mt_d_web_proc_t *t = mt__d_web_find(s.d, p);
            assert_true(t == NULL || t->win == NULL); /* spooled */
            if (l == 0 && p->pid == 4242) /* the replay's first process: evicted chunks */
                assert_true(t->wcount == 4096 && t->sp.nchunks > 8);
        }
        json_t *st;
        routes_same(&m, &s, logs[l], &st);
        json_decref(st);
        th_daemon_stop(&m);
        th_daemon_stop(&s);
    }
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "--spawn") == 0)
        return spawn_main(argv);
    if (argc < 3) {
        fprintf(stderr, "usage: test_daemon_readers MEMTRACE_EXE SOURCE_ROOT\n");
        return 2;
    }
    exe = argv[1];
    root = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_nonempty),
        cmocka_unit_test(test_commands_same),
        cmocka_unit_test(test_view_same),
        cmocka_unit_test(test_export_memory),
        cmocka_unit_test(test_report_memory),
        cmocka_unit_test(test_export_memory_procs),
        cmocka_unit_test(test_plot_memory),
        cmocka_unit_test(test_view_memory),
        cmocka_unit_test(test_view_spooled_same),
        cmocka_unit_test(test_view_binary_same),
        cmocka_unit_test(test_view_compressed_same),
    };
    return MT_TEST_RUN(tests, setup, teardown);
}
