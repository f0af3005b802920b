/* Host-allocation failures in the CLI: memtrace_fault (the memtrace tool linked with the
 * injector, armed by $MT_FAULT_AT) runs a command once per allocation site of its main
 * thread. Each run must end normally: exit 0 (the failure was absorbed) or a non-zero
 * status with a message that says memory ran out; never a crash.
 * usage: test_fault_tools MEMTRACE_FAULT TRACE.csv LOG.ndjson OTHER.ndjson SNAPSHOT.pickle
 *        LOST.ndjson */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tests/common/test_main.h"

/* One run of a command with one failed allocation takes well under a second on a quiet
 * host; this bounds a run that hangs, with room for a host loaded many times over. */
enum { CHILD_SECONDS = 60 };

/* Every stride-th site is failed ($MT_FAULT_STRIDE, default 1): the sanitizer build, where
 * a run costs ten times more, takes a sample; the plain build takes every site. */
static long stride = 1;
static const char *tool;
static const char *trace;
static const char *logfile;
static const char *other;    /* a second log, of other stacks and tags: what diff compares */
static const char *snapshot; /* a PyTorch snapshot with frames: its own sections */
static const char *lost;     /* a log with segments that lost events: what export leaves out */
static char ranks[2][600];   /* LOG as ranks 0 and 1 of one job: view's job view */

/* Reads fd to its end into buf (truncated to cap - 1, NUL-terminated); returns the length. */
static size_t slurp(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    ssize_t r;
    char sink[4096];
    while ((r = read(fd, len < cap - 1 ? buf + len : sink,
                     len < cap - 1 ? cap - 1 - len : sizeof sink)) > 0)
        if (len < cap - 1)
            len += (size_t)r;
    buf[len] = '\0';
    close(fd);
    return len;
}

/* Runs argv with MT_FAULT_AT=n; stderr into err, stdout into out. Returns the wait status. */
static int run(char *const argv[], long n, char *err, size_t errcap, char *out, size_t outcap)
{
    int fds[2], ofds[2];
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(pipe(ofds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char at[32];
        snprintf(at, sizeof at, "%ld", n);
        setenv("MT_FAULT_AT", at, 1);
        /* A tool may exit on an error without freeing what it holds: not a leak to hunt. */
        setenv("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1", 1);
        /* A hang is bounded per run, and named by the site that hung: the alarm survives
         * execv and its SIGALRM ends the run (reported as killed by signal 14). */
        alarm(CHILD_SECONDS);
        dup2(fds[1], STDERR_FILENO);
        dup2(ofds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        close(ofds[0]);
        close(ofds[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    close(ofds[1]);
    /* stdout first: the tools write little to stderr, which the pipe holds meanwhile. */
    slurp(ofds[0], out, outcap);
    slurp(fds[0], err, errcap);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

/* same_output: the command's output does not vary from run to run, so a run that absorbed
 * its failure (exit 0) must print exactly what a clean run prints. every: only every
 * every-th site of the stride's (a command of many sites, each slow). */
static long tool_loop_every(const char *name, char *const argv[], bool same_output, long every)
{
    static char err[16384], clean[1 << 20], out[1 << 20];
    assert_int_equal(run(argv, 0, err, sizeof err, clean, sizeof clean), 0);
    for (long n = 1;; n += stride * every) {
        int status = run(argv, n, err, sizeof err, out, sizeof out);
        bool injected = strstr(err, "mt-fault: host allocation") != NULL;
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
            fail_msg("%s: host allocation %ld failed: no exit within %d s; stderr:\n%s", name, n,
                     CHILD_SECONDS, err);
        if (WIFSIGNALED(status))
            fail_msg("%s: host allocation %ld failed: killed by signal %d; stderr:\n%s", name, n,
                     WTERMSIG(status), err);
        int code = WEXITSTATUS(status);
        if (!injected) {
            if (code != 0)
                fail_msg("%s: exit %d without an injected failure; stderr:\n%s", name, code, err);
            fprintf(stderr, "%s: %ld allocation sites at most, every %ld-th failed in turn\n", name,
                    n - 1, stride * every);
            return n - 1;
        }
        if (code == 0 && same_output && strcmp(out, clean) != 0)
            fail_msg("%s: host allocation %ld failed: exit 0 but the output differs from a "
                     "clean run's; stderr:\n%s",
                     name, n, err);
        if (code != 0 && strstr(err, "out of memory") == NULL &&
            strstr(err, "Cannot allocate memory") == NULL)
            fail_msg("%s: host allocation %ld failed: exit %d without saying memory ran out; "
                     "stderr:\n%s",
                     name, n, code, err);
    }
}

static long tool_loop(const char *name, char *const argv[], bool same_output)
{
    return tool_loop_every(name, argv, same_output, 1);
}

static void test_replay(void **state)
{
    (void)state;
    char *argv[] = {(char *)tool, "replay", (char *)trace, "--warmup", "--json", NULL};
    assert_true(tool_loop("memtrace replay --json", argv, false) > 10);
    char *text[] = {
        (char *)tool, "replay", (char *)trace, "--alloc-conf", "expandable_segments:True", NULL};
    assert_true(tool_loop("memtrace replay", text, false) > 10);
}

static void test_report(void **state)
{
    (void)state;
    char *argv[] = {(char *)tool, "report", (char *)logfile, NULL};
    assert_true(tool_loop("memtrace report", argv, true) > 10);
    char *json[] = {(char *)tool, "report", "--json", (char *)logfile, NULL};
    assert_true(tool_loop("memtrace report --json", json, true) > 10);
}

static void test_plot(void **state)
{
    (void)state;
    char *argv[] = {(char *)tool, "plot", (char *)logfile, "-o", "/dev/stdout", NULL};
    assert_true(tool_loop("memtrace plot", argv, true) > 10);
}

/* Both sides' analyses with every call site kept and named (the symbolizer, the model's
 * stacks), then the comparison, as text and as JSON. */
static void test_diff(void **state)
{
    (void)state;
    char *argv[] = {(char *)tool, "diff", (char *)logfile, (char *)other, NULL};
    assert_true(tool_loop("memtrace diff", argv, true) > 10);
    char *json[] = {(char *)tool, "diff", "--json", (char *)logfile, (char *)other, NULL};
    assert_true(tool_loop("memtrace diff --json", json, true) > 10);
}

/* A PyTorch snapshot: its events through the model, then its call sites at the peak and
 * its annotations, each part of the answer a failure must refuse, never shorten. */
static void test_report_snapshot(void **state)
{
    (void)state;
    char *argv[] = {(char *)tool, "report", (char *)snapshot, NULL};
    assert_true(tool_loop("memtrace report SNAPSHOT", argv, true) > 10);
}

/* A log as a PyTorch snapshot, in both layouts: the log read on one thread (the reader's
 * threads' allocations are not failed: the main thread's then count 86 sites, not 62), the
 * segments and blocks at its end, its trace with the entries it leaves out. */
static void test_export(void **state)
{
    (void)state;
    setenv("MEMTRACE_READER_THREADS", "1", 1);
    char *v2[] = {(char *)tool, "export", "--format", "torch-snapshot",
                  (char *)lost, "-o",     "-",        NULL};
    assert_true(tool_loop("memtrace export", v2, true) > 10);
    char *v1[] = {
        (char *)tool, "export", "--format", "torch-snapshot", "--torch-format", "1", (char *)lost,
        "-o",         "-",      NULL};
    assert_true(tool_loop("memtrace export --torch-format 1", v1, true) > 10);
    char *tags[] = {(char *)tool,    "export", "--format", "torch-snapshot",
                    (char *)logfile, "-o",     "-",        NULL};
    assert_true(tool_loop("memtrace export LOG", tags, true) > 10);
    unsetenv("MEMTRACE_READER_THREADS");
}

/* view's loading, printed instead of served (--print-state): a log, a snapshot, a job's
 * two ranks (the report's job view, read a second time), and two runs compared (every
 * 16th site of `memtrace diff`'s 1500: each run symbolizes both sides). */
static void test_view(void **state)
{
    (void)state;
    char *log[] = {(char *)tool, "view", "--print-state", (char *)logfile, NULL};
    assert_true(tool_loop("memtrace view LOG", log, true) > 10);
    char *snap[] = {(char *)tool, "view", "--print-state", (char *)snapshot, NULL};
    assert_true(tool_loop("memtrace view SNAPSHOT", snap, true) > 10);
    char *job[] = {(char *)tool, "view", "--print-state", ranks[0], ranks[1], NULL};
    assert_true(tool_loop_every("memtrace view RANK0 RANK1", job, true, 4) > 10);
    char *cmp[] = {(char *)tool,  "view", "--print-state", "--compare", (char *)logfile,
                   (char *)other, NULL};
    assert_true(tool_loop_every("memtrace view --compare", cmp, true, 16) > 10);
}

/* What a clean run of argv prints after the first `key` in its output, as far as
 * stop_at (e.g. the pid of `"pid":`), into buf. */
static void clean_field(char *const argv[], const char *key, const char *stop_at, char *buf,
                        size_t len)
{
    static char err[16384], out[1 << 20];
    assert_int_equal(run(argv, 0, err, sizeof err, out, sizeof out), 0);
    const char *at = strstr(out, key);
    assert_non_null(at);
    at += strlen(key);
    size_t n = strcspn(at, stop_at);
    assert_true(n > 0 && n < len);
    memcpy(buf, at, n);
    buf[n] = '\0';
}

/* The page's routes answered from a loaded log and snapshot (--get, the server's own steps
 * without a socket): every site of the loading and of each answer; a failure must refuse
 * the answer (HTTP 500 "out of memory"), never shorten it. /state names this process
 * (its pid, its start): not compared. */
static void test_view_routes(void **state)
{
    (void)state;
    char pid[24], addr[24], q[9][96];
    char *st[] = {(char *)tool, "view", "--print-state", (char *)logfile, NULL};
    clean_field(st, "\"pid\":", ",", pid, sizeof pid);
    snprintf(q[0], sizeof q[0], "/tail?pid=%s&n=400", pid);
    char *tail[] = {(char *)tool, "view", "--get", q[0], (char *)logfile, NULL};
    clean_field(tail, "\"kind\":\"alloc\",\"addr\":\"", "\"", addr, sizeof addr);
    const char *fmt[] = {"/map?pid=%s",         "/spark?pid=%s", "/callsites?pid=%s",
                         "/tail?pid=%s&n=50",   "/gap?pid=%s",   "/analysis?pid=%s",
                         "/block?pid=%s&addr=", "/state?pid=%s", "/history?pid=%s&buckets=50"};
    for (int i = 0; i < 9; i++)
        snprintf(q[i], sizeof q[i], fmt[i], pid);
    strncat(q[6], addr, sizeof q[6] - strlen(q[6]) - 1);
    char *log[] = {(char *)tool, "view", "--get",         q[0], "--get", q[1], "--get", q[2],
                   "--get",      q[3],   "--get",         q[4], "--get", q[5], "--get", q[6],
                   "--get",      q[8],   (char *)logfile, NULL};
    assert_true(tool_loop("memtrace view --get ROUTES LOG", log, true) > 10);
    char *st2[] = {(char *)tool, "view", "--get", q[7], (char *)logfile, NULL};
    assert_true(tool_loop("memtrace view --get /state LOG", st2, false) > 10);
    char *snap[] = {
        (char *)tool,     "view",       "--get", "/sites?pid=1",    "--get", "/callsites?pid=1",
        "--get",          "/gap?pid=1", "--get", "/analysis?pid=1", "--get", "/map?pid=1",
        (char *)snapshot, NULL};
    assert_true(tool_loop("memtrace view --get ROUTES SNAPSHOT", snap, true) > 10);
}

/* src as rank `rank` of a job of two: its hello names the rank, and every pid is moved by
 * rank (two processes, not one). Returns whether path was written. */
static bool rank_log(const char *src, const char *path, int rank)
{
    static const char hello[] = "\"type\":\"hello\",";
    FILE *in = fopen(src, "r"), *out = fopen(path, "w");
    char *line = NULL;
    size_t len = 0;
    bool named = false;
    while (in != NULL && out != NULL && getline(&line, &len, in) != -1) {
        const char *p = line, *h = strstr(line, hello), *at;
        while ((at = strstr(p, "\"pid\":")) != NULL) {
            if (h != NULL && h < at) { /* the rank goes after the hello's type */
                fprintf(out, "%.*s\"rank\":%d,\"world_size\":2,\"job\":\"fault\",",
                        (int)(h + sizeof hello - 1 - p), p, rank);
                p = h + sizeof hello - 1;
                h = NULL;
                named = true;
            }
            char *end;
            long pid = strtol(at + 6, &end, 10);
            fprintf(out, "%.*s%ld", (int)(at + 6 - p), p, pid + rank);
            p = end;
        }
        fputs(p, out);
    }
    free(line);
    bool ok = in != NULL && out != NULL && !ferror(in) && named;
    if (in != NULL)
        fclose(in);
    if (out != NULL && fclose(out) != 0)
        ok = false;
    return ok;
}

/* LOG without its libc module records, in a new directory: a frame in libc then names no
 * module. libc's separate debug info (libc6-dbg, which valgrind brings) is otherwise
 * decompressed by libdw in each of the ~1300 runs, 90 ms of a run's 120, in code whose
 * allocations the injector neither fails nor numbers (inject.c, from_elfutils). The
 * symbolizer's own sites stay reached through the program's module (its symbols, and its
 * lines where it has debug info). Returns the copy's path, or NULL. */
static char *without_libc(const char *log, char *dir, size_t cap)
{
    static char path[600];
    snprintf(dir, cap, "/tmp/mt-ftools-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return NULL;
    snprintf(path, sizeof path, "%s/log.ndjson", dir);
    FILE *in = fopen(log, "r"), *out = fopen(path, "w");
    char *line = NULL;
    size_t len = 0, dropped = 0;
    while (in != NULL && out != NULL && getline(&line, &len, in) != -1) {
        if (strstr(line, "\"kind\":\"module\"") != NULL && strstr(line, "/libc.so") != NULL)
            dropped++;
        else
            fputs(line, out);
    }
    free(line);
    bool ok = in != NULL && out != NULL && !ferror(in) && dropped > 0;
    if (in != NULL)
        fclose(in);
    if (out != NULL && fclose(out) != 0)
        ok = false;
    if (!ok)
        fprintf(stderr, "test_fault_tools: could not copy %s without its libc module to %s\n", log,
                path);
    return ok ? path : NULL;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: test_fault_tools MEMTRACE_FAULT TRACE.csv LOG.ndjson "
                        "OTHER.ndjson SNAPSHOT.pickle LOST.ndjson\n");
        return 2;
    }
    const char *st = getenv("MT_FAULT_STRIDE");
    stride = st != NULL && atol(st) > 0 ? atol(st) : 1;
    tool = argv[1];
    trace = argv[2];
    other = argv[4];
    snapshot = argv[5];
    lost = argv[6];
    char dir[64];
    if ((logfile = without_libc(argv[3], dir, sizeof dir)) == NULL)
        return 1;
    int rc = 0;
    for (int i = 0; i < 2; i++) {
        snprintf(ranks[i], sizeof ranks[i], "%s/rank%d.ndjson", dir, i);
        if (!rank_log(logfile, ranks[i], i)) {
            fprintf(stderr, "test_fault_tools: could not write %s\n", ranks[i]);
            rc = 1;
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay), cmocka_unit_test(test_report),
        cmocka_unit_test(test_plot),   cmocka_unit_test(test_report_snapshot),
        cmocka_unit_test(test_diff),
    };
    /* $MT_FAULT_TOOLS=loads: export and view's loading instead, a meson test of their own
     * that runs beside the others (MT_TEST_FILTER takes one pattern). */
    const struct CMUnitTest loads[] = {
        cmocka_unit_test(test_export),
        cmocka_unit_test(test_view),
        cmocka_unit_test(test_view_routes),
    };
    const char *group = getenv("MT_FAULT_TOOLS");
    if (rc == 0 && group != NULL && strcmp(group, "loads") == 0)
        rc = MT_TEST_RUN(loads, NULL, NULL);
    else if (rc == 0)
        rc = MT_TEST_RUN(tests, NULL, NULL);
    unlink(ranks[0]);
    unlink(ranks[1]);
    unlink(logfile);
    rmdir(dir);
    return rc;
}
