/* /metrics passes `promtool check metrics` (exit 77, skipped, without promtool), and its
 * figures match what the producer recorded. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

static void test_metrics_pass_promtool(void **state)
{
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    /* 301 events: the last alloc stays live, tag (150 % 7) = 3 (optimizer). */
    pid_t pid = th_producer(t.sock, 301, 1024, 0, -1);
    assert_int_equal(th_wait(pid), 0);
    json_t *p = th_wait_exited(t.sock, pid, 5000);
    assert_non_null(p);
    json_decref(p);
    int consumer = th_consumer(t.sock, ""); /* so the consumer gauge has something */

    char *r = NULL;
    assert_int_equal(th_http_get(t.port, "/metrics", &r), 200);
    assert_non_null(strstr(r, "Content-Type: text/plain; version=0.0.4"));
    const char *body = th_http_body(r);
    assert_true(strlen(body) > 0 && body[strlen(body) - 1] == '\n');
    char line[160];
    snprintf(line, sizeof line, "memtrace_events_total{pid=\"%d\"} 301\n", (int)pid);
    assert_non_null(strstr(body, line));
    snprintf(line, sizeof line, "memtrace_allocated_bytes{pid=\"%d\"} 4096\n", (int)pid);
    assert_non_null(strstr(body, line));
    snprintf(line, sizeof line, "memtrace_tag_allocated_bytes{pid=\"%d\",tag=\"optimizer\"} 4096\n",
             (int)pid);
    assert_non_null(strstr(body, line));
    snprintf(line, sizeof line, "memtrace_tag_peak_bytes{pid=\"%d\",tag=\"weights\"} 4096\n",
             (int)pid);
    assert_non_null(strstr(body, line));
    assert_non_null(strstr(body, "memtrace_consumers 1\n"));
    assert_non_null(strstr(body, "memtrace_processes{state=\"exited\"} 1\n"));

    char path[64];
    snprintf(path, sizeof path, "/tmp/mt-dtest-metrics-%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(body, f);
    fclose(f);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s", path);
    int st = system(cmd);
    unlink(path);
    free(r);
    close(consumer);
    th_daemon_stop(&t);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    if (system("command -v promtool > /dev/null 2>&1") != 0) {
        fprintf(stderr, "promtool not found (Debian package prometheus): skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_pass_promtool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
