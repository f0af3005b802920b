/* The CLI against a live daemon: `memtrace tail`, `memtrace top` (--once, --json, live
 * with q), `memtrace daemon` (--help, refusal on a busy socket). argv[1] is the memtrace
 * binary. */
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
#include <sys/wait.h>
#include <unistd.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "tests/daemon/harness.h"
#include "tests/common/test_main.h"

static const char *memtrace;

/* Runs cmd with sh, feeding it `input` on stdin if not NULL; returns the exit status and
 * stdout (new). */
static int run(const char *cmd, const char *input, char **out)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/mt-dtest-cli-%d.out", (int)getpid());
    char buf[1200];
    if (input)
        snprintf(buf, sizeof buf, "printf '%s' | %s > %s", input, cmd, path);
    else
        snprintf(buf, sizeof buf, "%s < /dev/null > %s", cmd, path);
    int st = system(buf);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t cap = 1 << 20;
    char *s = calloc(1, cap);
    size_t n = fread(s, 1, cap - 1, f);
    s[n] = '\0';
    fclose(f);
    unlink(path);
    *out = s;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_help(void **state)
{
    static const char *cmds[] = {"daemon", "tail", "top"};
    for (int i = 0; i < 3; i++) {
        char cmd[512], *out;
        snprintf(cmd, sizeof cmd, "%s %s --help", memtrace, cmds[i]);
        assert_int_equal(run(cmd, NULL, &out), 0);
        assert_non_null(strstr(out, "usage: memtrace"));
        assert_non_null(strstr(out, "examples:"));
        free(out);
        snprintf(cmd, sizeof cmd, "%s %s --bogus 2>/dev/null", memtrace, cmds[i]);
        assert_int_equal(run(cmd, NULL, &out), 2);
        free(out);
    }
}

/* A bad option value is refused, naming the option, the value and what it wants. */
static void test_bad_values_named(void **state)
{
    static const char *const cases[][3] = {
        {"daemon --port 70000", "--port: bad value '70000'", "0-65535"},
        {"daemon --queue-bytes 10", "--queue-bytes: bad value '10'", "4096"},
        {"tail --pid 12x", "--pid: bad value '12x'", "process ids"},
        {"tail --count 0", "--count: bad value '0'", "above 0"},
        {"tail --binary --count 5", "--count counts lines", "--binary writes none"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[512], *out;
        snprintf(cmd, sizeof cmd, "(%s %s 2>&1)", memtrace, cases[i][0]); /* stderr too */
        assert_int_equal(run(cmd, NULL, &out), 2);
        assert_non_null(strstr(out, cases[i][1]));
        assert_non_null(strstr(out, cases[i][2]));
        free(out);
    }
}

/* Runs the shell command cmd (a `memtrace tail`) in the background and waits until it has
 * subscribed to the daemon at sock (the daemon counts it): a producer started before that
 * records events tail never sees. Its pid. */
static pid_t start_tail(const char *cmd, const char *sock)
{
    fflush(NULL);
    pid_t tail = fork();
    if (tail == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int consumers = 0;
    for (uint64_t end = th_now_ms() + 30000; consumers != 1 && th_now_ms() < end;) {
        json_t *st = th_state(sock);
        consumers =
            (int)json_integer_value(json_object_get(json_object_get(st, "daemon"), "consumers"));
        json_decref(st);
        if (consumers != 1)
            usleep(10000);
    }
    if (consumers != 1) {
        kill(tail, SIGKILL);
        th_wait(tail);
        fail_msg("memtrace tail did not subscribe within 30 s (%d consumers)", consumers);
    }
    return tail;
}

static void test_tail_and_top(void **state)
{
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    char cmd[512], *out;

    /* tail, in the background, started before the producer. */
    char tail_out[64];
    snprintf(tail_out, sizeof tail_out, "/tmp/mt-dtest-tail-%d.out", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s tail --socket %s --kind alloc --tag weights --count 10 > %s",
             memtrace, t.sock, tail_out);
    pid_t tail = start_tail(cmd, t.sock);
    pid_t pid = th_producer(t.sock, 400, 1024, 0, -1);
    assert_int_equal(th_wait(pid), 0);
    int st = th_wait_within(tail, 30000, "memtrace tail --count 10, after the producer's events");
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    FILE *f = fopen(tail_out, "r");
    assert_non_null(f);
    char line[1024];
    int lines = 0;
    while (fgets(line, sizeof line, f)) {
        assert_non_null(strstr(line, "\"kind\":\"alloc\""));
        assert_non_null(strstr(line, "\"tag\":\"weights\""));
        lines++;
    }
    fclose(f);
    unlink(tail_out);
    assert_int_equal(lines, 10);
    json_decref(th_wait_exited(t.sock, pid, 5000));

    snprintf(cmd, sizeof cmd, "%s top --once --socket %s", memtrace, t.sock);
    assert_int_equal(run(cmd, NULL, &out), 0);
    char pidstr[16];
    snprintf(pidstr, sizeof pidstr, "%d", (int)pid);
    assert_non_null(strstr(out, pidstr));
    assert_non_null(strstr(out, "clean"));
    assert_non_null(strstr(out, "weights"));
    assert_null(strstr(out, "\033["));
    free(out);

    snprintf(cmd, sizeof cmd, "%s top --json --socket %s", memtrace, t.sock);
    assert_int_equal(run(cmd, NULL, &out), 0);
    json_error_t err;
    json_t *j = json_loads(out, 0, &err);
    assert_non_null(j);
    assert_int_equal(json_array_size(json_object_get(j, "processes")), 1);
    json_decref(j);
    free(out);

    /* Live view: redraws with ANSI codes, quits on q. */
    snprintf(cmd, sizeof cmd, "%s top --interval 100 --socket %s", memtrace, t.sock);
    assert_int_equal(run(cmd, "q", &out), 0);
    assert_non_null(strstr(out, "\033[H\033[2J"));
    assert_non_null(strstr(out, pidstr));
    free(out);

    /* A second daemon on the same socket refuses to start. */
    snprintf(cmd, sizeof cmd, "%s daemon --foreground --quiet --port off --socket %s", memtrace,
             t.sock);
    assert_int_equal(run(cmd, NULL, &out), 1);
    free(out);
    th_daemon_stop(&t);

    /* No daemon: a clear failure, not a hang. */
    snprintf(cmd, sizeof cmd, "%s top --once --socket %s 2>/dev/null", memtrace, t.sock);
    assert_int_equal(run(cmd, NULL, &out), 1);
    free(out);
    snprintf(cmd, sizeof cmd, "%s tail --socket %s 2>/dev/null", memtrace, t.sock);
    assert_int_equal(run(cmd, NULL, &out), 1);
    free(out);
}

/* `memtrace tail --binary` writes a binary log of what its filters pass, which the readers
 * read: the producer's allocs, each of them, and nothing else. */
static void test_tail_binary(void **state)
{
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    char cmd[512], out_path[64], *out;
    snprintf(out_path, sizeof out_path, "/tmp/mt-dtest-tail-%d.mtlog", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s tail --socket %s --binary --kind alloc > %s", memtrace, t.sock,
             out_path);
    pid_t tail = start_tail(cmd, t.sock);
    pid_t pid = th_producer(t.sock, 400, 1024, 0, -1);
    assert_int_equal(th_wait(pid), 0);
    json_decref(th_wait_exited(t.sock, pid, 5000));
    th_daemon_stop(&t); /* the stream ends: tail exits */
    int st = th_wait_within(tail, 30000, "memtrace tail --binary, after the daemon stopped");
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    FILE *f = fopen(out_path, "rb");
    assert_non_null(f);
    char magic[8] = {0};
    assert_int_equal(fread(magic, 1, 8, f), 8);
    fclose(f);
    assert_memory_equal(magic, "\x89MTLOG\r\n", 8);
    snprintf(cmd, sizeof cmd, "(%s convert %s -o - 2>/dev/null | grep -c '\"kind\":\"alloc\"')",
             memtrace, out_path);
    assert_int_equal(run(cmd, NULL, &out), 0);
    assert_int_equal(atoi(out), 200); /* th_producer: 400 events, alloc/free pairs */
    free(out);
    snprintf(cmd, sizeof cmd, "(%s convert %s -o - 2>/dev/null | grep -c '\"type\":\"event\"')",
             memtrace, out_path);
    assert_int_equal(run(cmd, NULL, &out), 0);
    assert_int_equal(atoi(out), 200);
    free(out);
    unlink(out_path);
}

/* `memtrace daemon` detached: returns once it listens; SIGTERM removes its socket. */
static void test_daemon_detached(void **state)
{
    char dir[] = "/tmp/mt-dtest-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sock[96], cmd[512], *out;
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(cmd, sizeof cmd, "%s daemon --quiet --port 0 --socket %s", memtrace, sock);
    assert_int_equal(run(cmd, NULL, &out), 0);
    int dpid = 0;
    assert_int_equal(sscanf(out, "memtrace daemon: started, pid %d", &dpid), 1);
    free(out);
    assert_int_equal(access(sock, F_OK), 0);
    json_t *st = th_state(sock);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(st, "daemon"), "pid")),
                     dpid);
    json_decref(st);
    assert_int_equal(kill(dpid, SIGTERM), 0);
    /* A deadline, not a count of polls: a loaded machine may take seconds to schedule it. */
    for (uint64_t end = th_now_ms() + 30000; access(sock, F_OK) == 0 && th_now_ms() < end;)
        usleep(10000);
    if (access(sock, F_OK) == 0)
        fail_msg("the detached daemon (pid %d) left %s in place 30 s after SIGTERM", dpid, sock);
    /* The daemon keeps its token file for its next start; the test's directory goes. */
    char tok[128];
    snprintf(tok, sizeof tok, "%s.token", sock);
    unlink(tok);
    assert_int_equal(rmdir(dir), 0);
}

/* A producer with allocators on 2 sim devices: 3 MiB live on device 0, 5 MiB on 1. */
static void devices_body(const char *sock)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.name = "th-devices";
    mt_prof_t *p = NULL;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_devices = 2;
    bc.sim_capacity = (size_t)256 << 20;
    mt_backend_t *b = NULL, *b1 = NULL;
    if (mt_prof_create(&p, &cfg) != 0 || mt_backend_create(&b, &bc) != 0 ||
        mt_backend_get_device(b, 1, &b1) != 0)
        _exit(10);
    void *x;
    for (int d = 0; d < 2; d++) {
        mt_alloc_cfg_t ac = mt_alloc_cfg_default();
        ac.backend = d ? b1 : b;
        ac.sink = mt_prof_sink(p);
        mt_alloc_t *a = NULL;
        if (mt_alloc_create(&a, &ac) != 0 ||
            mt_alloc_malloc(a, (d ? 5u : 3u) << 20, NULL, MT_TAG_WEIGHTS, &x) != 0)
            _exit(11);
    }
    mt_prof_destroy(&p);
    _exit(0);
}

/* `memtrace top` with a process on 2 devices: a line per device under the process's,
 * whose figures are the sums. */
static void test_top_per_device(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    const char *const args[5] = {t.sock};
    pid_t pid = th_spawn("devices", args);
    assert_int_equal(th_wait(pid), 0);
    json_decref(th_wait_exited(t.sock, pid, 5000));
    char cmd[600], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s top --once --socket %s", memtrace, t.sock);
    assert_int_equal(run(cmd, NULL, &out), 0);
    assert_non_null(strstr(out, "8.0 MiB")); /* the process: 3 + 5 */
    assert_non_null(strstr(out, "device 0       3.0 MiB allocated"));
    assert_non_null(strstr(out, "device 1       5.0 MiB allocated"));
    free(out);
    th_daemon_stop(&t);
}

/* A producer that is rank 3 of 4 in job "ddp": 1 MiB on device 0. */
static void ranked_body(const char *sock)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.name = "th-ranked";
    cfg.job.rank = 3;
    cfg.job.world_size = 4;
    snprintf(cfg.job.id, sizeof cfg.job.id, "ddp");
    mt_prof_t *p = NULL;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    mt_backend_t *b = NULL;
    if (mt_prof_create(&p, &cfg) != 0 || mt_backend_create(&b, &bc) != 0)
        _exit(10);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.sink = mt_prof_sink(p);
    mt_alloc_t *a = NULL;
    void *x;
    if (mt_alloc_create(&a, &ac) != 0 || mt_alloc_malloc(a, 1u << 20, NULL, MT_TAG_WEIGHTS, &x))
        _exit(11);
    mt_prof_destroy(&p);
    _exit(0);
}

/* `memtrace top` shows a RANK column once a process has a rank: "rank/world job", and "-"
 * for a process without one; with no ranked process there is no such column. */
static void test_top_rank_column(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    pid_t plain = th_producer(t.sock, 10, 1024, 0, -1);
    assert_int_equal(th_wait(plain), 0);
    json_decref(th_wait_exited(t.sock, plain, 5000));
    char cmd[600], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s top --once --socket %s", memtrace, t.sock);
    assert_int_equal(run(cmd, NULL, &out), 0);
    assert_null(strstr(out, "RANK"));
    free(out);
    const char *const args[5] = {t.sock};
    pid_t pid = th_spawn("ranked", args);
    assert_int_equal(th_wait(pid), 0);
    json_decref(th_wait_exited(t.sock, pid, 5000));
    assert_int_equal(run(cmd, NULL, &out), 0);
    assert_non_null(strstr(out, "PID      RANK                 NAME"));
    char line[128];
    snprintf(line, sizeof line, "%-8d %-20s th-ranked", (int)pid, "3/4 ddp");
    if (!strstr(out, line))
        fail_msg("no line '%s' in:\n%s", line, out);
    snprintf(line, sizeof line, "%-8d %-20s ", (int)plain, "-");
    assert_non_null(strstr(out, line));
    free(out);
    th_daemon_stop(&t);
}

/* A producer on a 1 GiB sim device with a 64 MiB context: 8 MiB from its allocator, 24 MiB
 * outside it reported by "libfakenccl.so", 4 MiB nobody reports. */
static void outside_body(const char *sock)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.name = "th-outside";
    mt_prof_t *p = NULL;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = (size_t)1 << 30;
    bc.sim_context = (size_t)64 << 20;
    mt_backend_t *b = NULL;
    if (mt_prof_create(&p, &cfg) != 0 || mt_backend_create(&b, &bc) != 0)
        _exit(10);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.sink = mt_prof_sink(p);
    ac.expandable_segments = false;
    mt_alloc_t *a = NULL;
    void *x, *lib, *quiet;
    if (mt_alloc_create(&a, &ac) != 0 || mt_alloc_malloc(a, 8u << 20, NULL, MT_TAG_WEIGHTS, &x))
        _exit(11);
    if (mt_backend_malloc(b, 24u << 20, &lib) != 0 ||
        mt_alloc_note_outside(a, false, (uintptr_t)lib, 24u << 20, "libfakenccl.so") != 0 ||
        mt_backend_malloc(b, 4u << 20, &quiet) != 0)
        _exit(12);
    mt_alloc_emit(a, MT_EV_STATS, 0, 0, 0); /* a device figure that sees the quiet 4 MiB */
    mt_prof_destroy(&p);
    _exit(0);
}

/* `memtrace top` shows the device's used bytes and what is outside the allocator (USED,
 * OUTSIDE), and a line per device with the daemon's split of used, which adds up. */
static void test_top_outside(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    pid_t plain = th_producer(t.sock, 10, 1024, 0, -1); /* raw events: no device figure */
    assert_int_equal(th_wait(plain), 0);
    json_decref(th_wait_exited(t.sock, plain, 5000));
    const char *const args[5] = {t.sock};
    pid_t pid = th_spawn("outside", args);
    assert_int_equal(th_wait(pid), 0);
    json_t *p = th_wait_exited(t.sock, pid, 5000);
    assert_non_null(p);
    double res = json_number_value(
        json_object_get(json_array_get(json_object_get(p, "devices"), 0), "reserved_bytes"));
    json_decref(p);
    double mib = (double)(1u << 20), used = 64 * mib + res + 24 * mib + 4 * mib;
    char cmd[600], *out = NULL, want[256];
    snprintf(cmd, sizeof cmd, "%s top --once --socket %s", memtrace, t.sock);
    assert_int_equal(run(cmd, NULL, &out), 0);
    if (!strstr(out, "   FRAG        USED     OUTSIDE  EVENTS/S"))
        fail_msg("no USED and OUTSIDE columns in:\n%s", out);
    snprintf(want, sizeof want, " %7.1f MiB %7.1f MiB ", used / mib, (used - res) / mib);
    if (!strstr(out, want))
        fail_msg("no used and outside figures '%s' in:\n%s", want, out);
    snprintf(want, sizeof want,
             "outside dev 0  used %.1f MiB of 1.0 GiB = reserved %.1f MiB + libfakenccl.so 24.0 "
             "MiB + context 64.0 MiB + not seen 4.0 MiB\n",
             used / mib, res / mib);
    if (!strstr(out, want))
        fail_msg("no line '%s' in:\n%s", want, out);
    char line[128]; /* the process without a figure: "-" in both columns */
    snprintf(line, sizeof line, "%-8d th-producer", (int)plain);
    const char *row = strstr(out, line);
    if (!row)
        fail_msg("no line for the raw producer in:\n%s", out);
    const char *eol = strchr(row, '\n');
    const char *dash = strstr(row, "           -           - ");
    assert_true(dash != NULL && dash < eol);
    free(out);
    th_daemon_stop(&t);
}

/* A producer whose 8-slot ring overflows: 20 000 events in one burst, most dropped. */
static void dropper_body(const char *sock)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.slots = 8;
    cfg.name = "th-dropper";
    mt_prof_t *p = NULL;
    if (mt_prof_create(&p, &cfg) != 0)
        _exit(10);
    for (unsigned i = 0; i < 20000; i++) {
        mt_event_rec_t ev = {
            .kind = MT_EV_MARK, .addr = MT_MARK_ITERATION, .size = i, .pool = MT_POOL_NONE};
        mt_prof_record(p, &ev);
    }
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    mt_prof_destroy(&p);
    _exit(st.dropped > 0 ? 0 : 11);
}

/* `memtrace top` gives a process's drops as a share of what it offered. */
static void test_top_drop_rate(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    const char *const args[5] = {t.sock};
    pid_t pid = th_spawn("dropper", args);
    assert_int_equal(th_wait(pid), 0);
    json_t *p = th_wait_exited(t.sock, pid, 5000);
    assert_non_null(p);
    double dropped = json_number_value(json_object_get(p, "dropped"));
    double events = json_number_value(json_object_get(p, "events"));
    json_decref(p);
    assert_true(dropped > 0);
    char cmd[600], *out = NULL, want[96];
    snprintf(cmd, sizeof cmd, "%s top --once --socket %s", memtrace, t.sock);
    assert_int_equal(run(cmd, NULL, &out), 0);
    snprintf(want, sizeof want, " %.0f (%.1f%%)\n", dropped, 100 * dropped / (dropped + events));
    if (!strstr(out, "DROPS (RATE)") || !strstr(out, want))
        fail_msg("no drop rate '%s' in:\n%s", want, out);
    free(out);
    th_daemon_stop(&t);
}

int main(int argc, char **argv)
{
    th_producer_dispatch(argc, argv);
    char **rargs;
    const char *role = th_role(argc, argv, &rargs);
    if (role != NULL && strcmp(role, "devices") == 0)
        devices_body(rargs[0]);
    if (role != NULL && strcmp(role, "ranked") == 0)
        ranked_body(rargs[0]);
    if (role != NULL && strcmp(role, "outside") == 0)
        outside_body(rargs[0]);
    if (role != NULL && strcmp(role, "dropper") == 0)
        dropper_body(rargs[0]);
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH-TO-memtrace\n", argv[0]);
        return 2;
    }
    memtrace = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_bad_values_named),
        cmocka_unit_test(test_tail_and_top),
        cmocka_unit_test(test_tail_binary),
        cmocka_unit_test(test_top_per_device),
        cmocka_unit_test(test_top_rank_column),
        cmocka_unit_test(test_top_outside),
        cmocka_unit_test(test_top_drop_rate),
        cmocka_unit_test(test_daemon_detached),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
