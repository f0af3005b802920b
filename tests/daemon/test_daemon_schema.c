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
    assert_int_equal(mt_d_client_state(t.sock, 5000, &st), 0);
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

int main(int argc, char **argv)
{
    th_producer_dispatch(argc, argv);
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
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
