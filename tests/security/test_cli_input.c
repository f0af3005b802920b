/* Bad input and write errors of the CLI: endless lines, bad
 * settings, full disks. argv[1] = the memtrace binary, argv[2] = the source root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "memtrace/prof.h"
#include "tests/security/common.h"
#include "tests/common/test_main.h"

static const char *mt, *src;

#ifdef __SANITIZE_ADDRESS__
#define CAP "" /* ASan reserves terabytes of address space: the timeout alone bounds it */
#else
#define CAP "ulimit -v 262144 &&"
#endif

/* A replay's text report times glibc malloc on the trace; meson's MALLOC_PERTURB_ makes
 * glibc fill every one of those MiB-sized blocks, which on a loaded machine alone outlasts
 * the timeout. The replays here test settings and write errors, not the host allocators. */
#define NO_PERTURB "MALLOC_PERTURB_=0 "
/* A replay that runs in well under a second, for the cases that need one to finish. */
#define SMALL_TRACE "replay tests/fault/data/small.csv"

/* Runs "memtrace ARGS" under a 60 s timeout; env is put before it (variables, ulimit). */
static int run(const char *env, const char *args, const char *redirect, char **out)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd %s && %s timeout 60 %s %s 2>&1 %s", src, env, mt, args, redirect);
    return sec_run(cmd, out);
}

static void expect_fail(const char *env, const char *args, const char *redirect, int status,
                        const char *msg)
{
    char *out = NULL;
    int rc = run(env, args, redirect, &out);
    if (rc != status || !strstr(out, msg))
        fail_msg("memtrace %s: status %d (want %d), output: %.300s (want '%s')", args, rc, status,
                 out, msg);
    free(out);
}

static void test_endless_lines(void **state)
{
    (void)state;
    /* bounded: 256 MiB of address space is plenty, and 60 s is an eternity */
    expect_fail(CAP, "replay /dev/zero", "", 2, "/dev/zero:1: line longer than 1024 bytes");
    expect_fail(CAP, "report /dev/zero", "", 1, "/dev/zero:1: line longer than 65536 bytes");
    expect_fail(CAP, "plot /dev/zero -o /dev/null", "", 1,
                "/dev/zero:1: line longer than 65536 bytes");
}

static void test_settings(void **state)
{
    (void)state;
    const char *trace = "replay data/traces/rnn_varlen.csv";
    expect_fail("MEMTRACE_SIM_CAPACITY=-1", trace, "", 2, "MEMTRACE_SIM_CAPACITY: not a");
    expect_fail("MEMTRACE_SIM_CAPACITY=16777217T", trace, "", 2,
                "MEMTRACE_SIM_CAPACITY: too large");
    expect_fail("MEMTRACE_SIM_CAPACITY=0x10G", trace, "", 2, "MEMTRACE_SIM_CAPACITY");
    expect_fail("MEMTRACE_SIM_CAPACITY=' 8G'", trace, "", 2, "MEMTRACE_SIM_CAPACITY");
    expect_fail("MEMTRACE_SIM_MALLOC_COST_NS=-1", trace, "", 2,
                "MEMTRACE_SIM_MALLOC_COST_NS: not a");
    expect_fail("MEMTRACE_SIM_FREE_COST_NS=99999999999999999999", trace, "", 2,
                "MEMTRACE_SIM_FREE_COST_NS: too large");
    /* 010G is ten GiB, not octal eight (NO_PERTURB: see its definition) */
    /* A small trace: the setting is what is tested, and the demo's trace takes minutes
     * under ASan on a loaded host (past run()'s 60 s bound). */
    char *out = NULL;
    assert_int_equal(run(NO_PERTURB "MEMTRACE_SIM_CAPACITY=010G", SMALL_TRACE, "", &out), 0);
    assert_non_null(strstr(out, "capacity 10.00 GiB"));
    free(out);
    expect_fail("", "report --min-r2 nan x.ndjson", "", 2, "--min-r2");
    expect_fail("", "report --min-r2 -0.5 x.ndjson", "", 2, "--min-r2");
    expect_fail("", "report --min-growth -1 x.ndjson", "", 2, "--min-growth");
    expect_fail("", "report --min-growth 99999999999999999999G x.ndjson", "", 2, "--min-growth");
}

/* A small log with events, recorded here, for plot. */
static void make_log(const char *path)
{
    unlink(path);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = path;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    for (unsigned i = 0; i < 200; i++) {
        mt_event_rec_t ev = {.kind = MT_EV_ALLOC,
                             .addr = 0x10000 + 4096u * i,
                             .size = 4096,
                             .allocated = 4096u * (i + 1),
                             .reserved = 1u << 24};
        assert_int_equal(mt_prof_record(p, &ev), 0);
    }
    mt_prof_destroy(&p);
}

static void test_full_disk(void **state)
{
    (void)state;
    char dir[64], log[128], svg[128];
    sec_tmpdir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/plot.ndjson", dir);
    snprintf(svg, sizeof svg, "%s/full.svg", dir);
    make_log(log);
    char args[320];
    snprintf(args, sizeof args, "report --json %s", log);
    expect_fail("", args, "> /dev/full", 1, "writing standard output");
    expect_fail(NO_PERTURB, SMALL_TRACE, "> /dev/full", 1,
                "writing standard output: No space left on device");
    /* a disk that fills: the file size limit (SIGXFSZ ignored, so write fails EFBIG) */
    snprintf(args, sizeof args, "plot %s -o %s", log, svg);
    char want[320];
    snprintf(want, sizeof want, "writing %s:", svg);
    expect_fail("trap '' XFSZ; ulimit -f 1;", args, "", 1, want);
    snprintf(args, sizeof args, "plot %s -o /dev/full", log);
    expect_fail("", args, "", 1, "writing /dev/full: No space left on device");
    unlink(svg);
    unlink(log);
    rmdir(dir);
}

/* A daemon (same uid) that accepts the subscription, then sends 64 MiB without a newline. */
static void test_tail_line_cap(void **state)
{
    (void)state;
    char dir[64], sock[100];
    sec_tmpdir(dir, sizeof dir);
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 1), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGPIPE, SIG_IGN);
        int c = accept(lfd, NULL, NULL);
        char junk[4096];
        if (c < 0 || read(c, junk, sizeof junk) <= 0 || write(c, "{\"ok\":true}\n", 12) != 12)
            _exit(1);
        memset(junk, 'a', sizeof junk);
        for (int i = 0; i < (64 << 20) / (int)sizeof junk; i++)
            if (write(c, junk, sizeof junk) <= 0)
                _exit(0);
        _exit(0);
    }
    close(lfd);
    char args[160];
    snprintf(args, sizeof args, "tail --socket %s", sock);
    expect_fail(CAP, args, "> /dev/null", 1, "a line over 1048576 bytes");
    waitpid(pid, NULL, 0);
    unlink(sock);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MEMTRACE SOURCE_ROOT\n", argv[0]);
        return 2;
    }
    mt = argv[1];
    src = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endless_lines),
        cmocka_unit_test(test_settings),
        cmocka_unit_test(test_full_disk),
        cmocka_unit_test(test_tail_line_cap),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
