/* Host-allocation failures in the CLI: memtrace_fault (the memtrace tool linked with the
 * injector, armed by $MT_FAULT_AT) runs a command once per allocation site of its main
 * thread. Each run must end normally: exit 0 (the failure was absorbed) or a non-zero
 * status with a message that says memory ran out; never a crash.
 * usage: test_fault_tools MEMTRACE_FAULT TRACE.csv LOG.ndjson OTHER.ndjson SNAPSHOT.pickle */
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
 * its failure (exit 0) must print exactly what a clean run prints. */
static long tool_loop(const char *name, char *const argv[], bool same_output)
{
    static char err[16384], clean[1 << 20], out[1 << 20];
    assert_int_equal(run(argv, 0, err, sizeof err, clean, sizeof clean), 0);
    for (long n = 1;; n += stride) {
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
                    n - 1, stride);
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
    if (argc != 6) {
        fprintf(stderr, "usage: test_fault_tools MEMTRACE_FAULT TRACE.csv LOG.ndjson "
                        "OTHER.ndjson SNAPSHOT.pickle\n");
        return 2;
    }
    const char *st = getenv("MT_FAULT_STRIDE");
    stride = st != NULL && atol(st) > 0 ? atol(st) : 1;
    tool = argv[1];
    trace = argv[2];
    other = argv[4];
    snapshot = argv[5];
    char dir[64];
    if ((logfile = without_libc(argv[3], dir, sizeof dir)) == NULL)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay), cmocka_unit_test(test_report),
        cmocka_unit_test(test_plot),   cmocka_unit_test(test_report_snapshot),
        cmocka_unit_test(test_diff),
    };
    int rc = MT_TEST_RUN(tests, NULL, NULL);
    unlink(logfile);
    rmdir(dir);
    return rc;
}
