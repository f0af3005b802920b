/* Terminal and log escapes: a process whose name and tag label hold a
 * screen clear, a newline with a forged line after it, and a C1 CSI. The real `memtrace
 * daemon` (its stderr), `memtrace top`, and the text `memtrace report` of the daemon's log
 * print no raw control byte and no forged line; /state lists the label, JSON-escaped.
 * argv[1] is the memtrace binary. */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "memtrace/alloc.h"
#include "memtrace/prof.h"
#include "tests/daemon/harness.h"
#include "tests/security/common.h"
#include "tests/common/test_main.h"

#define NAME                                                                                       \
    "ev\x1b[2J\nFORGED \xc2\x9b"                                                                   \
    "31m"
#define LABEL "l\x1b[2J\nFORGED\x7f"

static const char *memtrace;

/* No control byte but the line feeds between lines (C0, DEL, C1 as UTF-8 or raw), and no
 * line that starts with what followed a newline in the name or label. */
static void assert_clean(const char *what, const char *text)
{
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        bool bad = (*p < 0x20 && *p != '\n') || *p == 0x7f ||
                   (p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0);
        if (bad)
            fail_msg("%s: raw control byte 0x%02x at offset %td:\n%s", what, *p,
                     (const char *)p - text, text);
    }
    for (const char *l = text; l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
        if (strncmp(l, "FORGED", 6) == 0)
            fail_msg("%s: a forged line:\n%s", what, text);
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char *buf = calloc(1, 1 << 20);
    assert_non_null(buf);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* `memtrace daemon` in the foreground, stderr into err; returns once the socket answers. */
static pid_t start_daemon(const char *sock, const char *log, const char *err)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with the test, even if it fails */
        int fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 2) < 0)
            _exit(3);
        execl(memtrace, memtrace, "daemon", "--foreground", "--port", "off", "--socket", sock,
              "--log", log, (char *)NULL);
        _exit(4);
    }
    /* A connect, not the file: the socket exists from bind(), a moment before listen(),
     * and a producer connecting in between is refused. */
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    assert_true(strlen(sock) < sizeof sa.sun_path);
    memcpy(sa.sun_path, sock, strlen(sock) + 1);
    for (uint64_t end = th_now_ms() + 30000;; usleep(10000)) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fd >= 0);
        int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
        close(fd);
        if (rc == 0)
            return pid;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            fail_msg("memtrace daemon exited (status %d) before it answered on %s:\n%s", st, sock,
                     read_all(err));
        if (th_now_ms() >= end) {
            kill(pid, SIGKILL);
            th_wait(pid);
            fail_msg("memtrace daemon did not answer on %s within 30 s:\n%s", sock, read_all(err));
        }
    }
}

/* A producer named NAME announcing LABEL for a user tag, and one allocation under it. */
static pid_t hostile_producer(const char *sock)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        mt_prof_cfg_t pc = mt_prof_cfg_default();
        pc.mode = MT_PROF_DAEMON;
        pc.socket = sock;
        pc.name = NAME;
        mt_prof_t *p = NULL;
        if (mt_prof_create(&p, &pc) != 0)
            _exit(1);
        mt_event_rec_t lab = {.kind = MT_EV_TAG_LABEL, .tag = MT_TAG_USER_FIRST};
        mt_event_label_pack(&lab, LABEL);
        mt_event_rec_t al = {.kind = MT_EV_ALLOC,
                             .tag = MT_TAG_USER_FIRST,
                             .addr = 0x10000,
                             .size = 4096,
                             .requested = 4000};
        int rc = mt_prof_record(p, &lab) || mt_prof_record(p, &al);
        mt_prof_destroy(&p);
        _exit(rc ? 2 : 0);
    }
    return pid;
}

static void test_escaped_everywhere(void **state)
{
    (void)state;
    char dir[64], sock[128], log[128], err[128], cmd[1024];
    sec_tmpdir(dir, sizeof dir);
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(log, sizeof log, "%s/d.ndjson", dir);
    snprintf(err, sizeof err, "%s/d.err", dir);
    pid_t daemon = start_daemon(sock, log, err);
    pid_t prod = hostile_producer(sock);
    assert_int_equal(th_wait(prod), 0);
    json_t *p = th_wait_exited(sock, prod, 10000);
    assert_non_null(p);

    /* /state: the name and the label as they are (JSON escapes them). */
    assert_string_equal(json_string_value(json_object_get(p, "name")), NAME);
    char id[8];
    snprintf(id, sizeof id, "%d", MT_TAG_USER_FIRST);
    const char *label = json_string_value(json_object_get(json_object_get(p, "tag_labels"), id));
    assert_non_null(label); /* listed, not dropped */
    assert_string_equal(label, LABEL);
    json_decref(p);

    char *out = NULL;
    snprintf(cmd, sizeof cmd, "%s top --once --socket %s 2>&1", memtrace, sock);
    assert_int_equal(sec_run(cmd, &out), 0);
    assert_non_null(strstr(out, "ev\\e[2J\\nFO")); /* the name, cut to its column */
    assert_clean("top", out);
    if (getenv("SEC_ESCAPE_SHOW"))
        fputs(out, stderr);
    free(out);

    kill(daemon, SIGTERM);
    assert_int_equal(th_wait(daemon), 0);

    snprintf(cmd, sizeof cmd, "%s report %s 2>&1", memtrace, log);
    assert_int_equal(sec_run(cmd, &out), 0);
    assert_non_null(strstr(out, "\"ev\\e[2J\\nFORGED \\xc2\\x9b31m\""));
    assert_non_null(strstr(out, "l\\e[2J\\nFORGED\\x7f"));
    assert_clean("report", out);
    if (getenv("SEC_ESCAPE_SHOW"))
        fputs(out, stderr);
    free(out);

    out = read_all(err);
    assert_non_null(strstr(out, "(ev\\e[2J\\nFORGED \\xc2\\x9b31m) registered"));
    assert_clean("daemon stderr", out);
    free(out);

    unlink(log);
    unlink(err);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MEMTRACE_BINARY\n", argv[0]);
        return 2;
    }
    memtrace = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escaped_everywhere),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
