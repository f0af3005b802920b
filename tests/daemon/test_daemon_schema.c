/* Everything the daemon emits validates against docs/telemetry.schema.json: its log file
 * (events, process_event lines), the /state answer, a consumer's gap line and SSE data.
 * Uses the profiler's ajv validator (tests/prof/validate.mjs); exit 77 (skipped) without
 * node or ajv. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "mt_config.h"
#include "tests/daemon/harness.h"
#include "tests/common/test_main.h"

static const char validator[] = MT_SOURCE_ROOT "/tests/prof/validate.mjs";
static const char schema[] = MT_SOURCE_ROOT "/docs/telemetry.schema.json";

/* Appends to f the lines of fd that contain needle, reading until fd has been quiet for
 * quiet_ms (the connection stays open). */
static unsigned copy_lines(int fd, FILE *f, const char *needle, int quiet_ms)
{
    size_t cap = 64u << 20, len = 0;
    char *all = malloc(cap);
    assert_non_null(all);
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, quiet_ms) <= 0)
            break;
        ssize_t r = recv(fd, all + len, cap - 1 - len, 0);
        if (r <= 0)
            break;
        len += (size_t)r;
        assert_true(len < cap - 1);
    }
    all[len] = '\0';
    unsigned n = 0;
    for (char *save = NULL, *l = strtok_r(all, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (strstr(l, needle)) {
            fprintf(f, "%s\n", l);
            n++;
        }
    }
    free(all);
    return n;
}

static void test_daemon_output_matches_schema(void **state)
{
    char log[96], out[96];
    snprintf(log, sizeof log, "/tmp/mt-dtest-schema-log-%d.ndjson", (int)getpid());
    snprintf(out, sizeof out, "/tmp/mt-dtest-schema-%d.ndjson", (int)getpid());
    unlink(log);
    mt_d_cfg_t cfg = th_cfg();
    cfg.log_path = log;
    cfg.consumer_queue_bytes = 16 << 10;
    cfg.write_high_water = 4 << 10;
    th_daemon_t t;
    th_daemon_start(&t, cfg);
    int stuck = th_consumer(t.sock, "");
    /* Small kernel buffers, so that the stuck consumer's queue overflows soon. */
    int small = 4096;
    setsockopt(stuck, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);

    pid_t clean = th_producer(t.sock, 30000, 32768, 0, -1); /* ~9 MB of lines */
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t killed = th_producer(t.sock, 200, 1024, 0, pfd[1]);
    char c;
    assert_int_equal(read(pfd[0], &c, 1), 1);
    kill(killed, SIGKILL);
    th_wait(killed);
    assert_int_equal(th_wait(clean), 0);
    json_t *p = th_wait_exited(t.sock, killed, 5000);
    json_decref(p);
    p = th_wait_exited(t.sock, clean, 5000);
    json_decref(p);

    FILE *f = fopen(out, "w");
    assert_non_null(f);
    char *st = NULL;
    assert_int_equal(mt__d_client_state(t.sock, 5000, &st), 0);
    fputs(st, f); /* one line, '\n' included */
    free(st);
    assert_true(copy_lines(stuck, f, "\"type\":\"gap\"", 500) >= 1);
    close(stuck);
    fclose(f);
    th_daemon_stop(&t);

    char cmd[512];
    snprintf(cmd, sizeof cmd, "node %s %s %s %s", validator, schema, out, log);
    int rc = system(cmd);
    unlink(out);
    unlink(log);
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 0);
}

/* A producer on a sim device with a 32 MiB context: 4 MiB from its allocator, 8 MiB outside
 * it reported by "libfakenccl.so", so that /state has an "outside" device with a library. */
static void outside_body(const char *sock)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.name = "th-outside";
    mt_prof_t *p = NULL;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_context = (size_t)32 << 20;
    mt_backend_t *b = NULL;
    if (mt_prof_create(&p, &cfg) != 0 || mt_backend_create(&b, &bc) != 0)
        _exit(10);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.sink = mt_prof_sink(p);
    mt_alloc_t *a = NULL;
    void *x, *lib;
    if (mt_alloc_create(&a, &ac) != 0 || mt_alloc_malloc(a, 4u << 20, NULL, 0, &x) != 0 ||
        mt_backend_malloc(b, 8u << 20, &lib) != 0 ||
        mt_alloc_note_outside(a, false, (uintptr_t)lib, 8u << 20, "libfakenccl.so") != 0)
        _exit(11);
    mt_prof_destroy(&p);
    _exit(0);
}

/* Runs the validator on file (negative: "!file", every line must be rejected); its exit
 * status. */
static int validate(const char *file, bool negative)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "node %s %s %s%s", validator, schema, negative ? "!" : "", file);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* /state with a process's "outside" devices validates; the same answer with a part missing,
 * a library without a name or a member the schema does not define is rejected. */
static void test_state_outside_schema(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    const char *const args[5] = {t.sock};
    pid_t pid = th_spawn("outside", args);
    assert_int_equal(th_wait(pid), 0);
    json_decref(th_wait_exited(t.sock, pid, 5000));
    char *st = NULL;
    assert_int_equal(mt__d_client_state(t.sock, 5000, &st), 0);
    th_daemon_stop(&t);
    json_error_t jerr;
    json_t *good = json_loads(st, 0, &jerr);
    free(st);
    assert_non_null(good);
    json_t *od = json_array_get(
        json_object_get(json_array_get(json_object_get(good, "processes"), 0), "outside"), 0);
    if (!json_is_object(od) || json_array_size(json_object_get(od, "libraries")) != 1)
        fail_msg("/state has no \"outside\" device with a library");

    char ok[96], bad[96];
    snprintf(ok, sizeof ok, "/tmp/mt-dtest-outside-ok-%d.ndjson", (int)getpid());
    snprintf(bad, sizeof bad, "/tmp/mt-dtest-outside-bad-%d.ndjson", (int)getpid());
    FILE *fo = fopen(ok, "w"), *fb = fopen(bad, "w");
    assert_true(fo && fb);
    json_dumpf(good, fo, JSON_COMPACT);
    fputc('\n', fo);
    for (int k = 0; k < 3; k++) {
        json_t *mut = json_deep_copy(good);
        json_t *m = json_array_get(
            json_object_get(json_array_get(json_object_get(mut, "processes"), 0), "outside"), 0);
        if (k == 0)
            json_object_del(m, "not_seen");
        else if (k == 1)
            json_object_del(json_array_get(json_object_get(m, "libraries"), 0), "name");
        else
            json_object_set_new(m, "others", json_integer(1));
        json_dumpf(mut, fb, JSON_COMPACT);
        fputc('\n', fb);
        json_decref(mut);
    }
    fclose(fo);
    fclose(fb);
    json_decref(good);
    int rc_ok = validate(ok, false), rc_bad = validate(bad, true);
    unlink(ok);
    unlink(bad);
    assert_int_equal(rc_ok, 0);
    assert_int_equal(rc_bad, 0);
}

int main(int argc, char **argv)
{
    th_producer_dispatch(argc, argv);
    char **rargs;
    const char *role = th_role(argc, argv, &rargs);
    if (role != NULL && strcmp(role, "outside") == 0)
        outside_body(rargs[0]);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "command -v node > /dev/null && node %s > /dev/null 2>&1", validator);
    int rc = system(cmd);
    /* validate.mjs with no arguments: 2 (usage) when ajv loads, 77 when it is missing. */
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 2) {
        fprintf(stderr, "node or ajv missing (npm ci --prefix tests/prof): skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_daemon_output_matches_schema),
        cmocka_unit_test(test_state_outside_schema),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
