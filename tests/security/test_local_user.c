/* Another local user against a producer: a daemon of another uid on
 * our socket path, squatted shared-memory names, a log path that is a symlink or another
 * user's file. The victim must record everything, to its own log, and say why. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/daemon.h"
#include "memtrace/prof.h"
#include "tests/security/common.h"
#include "tests/common/test_main.h"

#define NEVENTS 200

static void record(mt_prof_t *p, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        mt_event_rec_t ev = {.kind = MT_EV_ALLOC, .addr = 0x1000 + 512u * i, .size = 512};
        assert_int_equal(mt_prof_record(p, &ev), 0);
    }
}

static unsigned count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[4096];
    unsigned n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* A child of another uid that binds sock and answers every hello with ok, as a fake daemon
 * would; returns its pid once it listens. */
static pid_t fake_daemon(const char *dir, const char *sock)
{
    assert_int_equal(chown(dir, SEC_OTHER_UID, SEC_OTHER_UID), 0);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(ready[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with the test, even if it fails */
        if (setresgid(SEC_OTHER_UID, SEC_OTHER_UID, SEC_OTHER_UID) != 0 ||
            setresuid(SEC_OTHER_UID, SEC_OTHER_UID, SEC_OTHER_UID) != 0)
            _exit(3);
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0)
            _exit(4);
        chmod(sock, 0777);
        if (write(ready[1], "x", 1) != 1)
            _exit(5);
        for (;;) {
            int c = accept(fd, NULL, NULL);
            if (c < 0)
                continue;
            char buf[1024];
            if (read(c, buf, sizeof buf) > 0 && write(c, "{\"ok\":true}\n", 12) != 12)
                _exit(6);
            /* kept open: the victim believes it is registered */
        }
    }
    close(ready[1]);
    char b;
    assert_int_equal(read(ready[0], &b, 1), 1);
    close(ready[0]);
    return pid;
}

static void test_fake_daemon_not_trusted(void **state)
{
    (void)state;
    if (!sec_can_switch_uid())
        skip(); /* needs root to play another uid */
    char dir[64], sock[100], log[128];
    sec_tmpdir(dir, sizeof dir);
    snprintf(sock, sizeof sock, "%s/memtrace.sock", dir);
    snprintf(log, sizeof log, "%s/victim.ndjson", dir);
    pid_t fake = fake_daemon(dir, sock);

    sec_log_t msgs = {{0}};
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.socket = sock;
    cfg.log_path = log;
    cfg.log = sec_log_cb;
    cfg.log_ud = &msgs;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    assert_int_equal(st.mode, MT_PROF_LOG); /* not the impostor */
    assert_non_null(strstr(msgs.text, "not trusted"));
    record(p, NEVENTS);
    mt_prof_destroy(&p);
    assert_int_equal(count_lines(log, "\"type\":\"event\""), NEVENTS);

    /* tail and top refuse it too */
    int fd = -1;
    assert_int_equal(mt__d_client_connect(sock, &fd), -EPERM);
    assert_int_equal(fd, -1);

    kill(fake, SIGKILL);
    waitpid(fake, NULL, 0);
    unlink(sock);
    unlink(log);
    rmdir(dir);
}

/* The default socket is in a directory of its own (0700, ours), never loose in /tmp. */
static void test_default_socket_in_private_dir(void **state)
{
    (void)state;
    char *xdg = getenv("XDG_RUNTIME_DIR") ? strdup(getenv("XDG_RUNTIME_DIR")) : NULL;
    char *env = getenv("MEMTRACE_SOCKET") ? strdup(getenv("MEMTRACE_SOCKET")) : NULL;
    unsetenv("XDG_RUNTIME_DIR");
    unsetenv("MEMTRACE_SOCKET");
    char buf[108], want[64];
    assert_int_equal(mt_prof_socket_path(buf, sizeof buf), 0);
    snprintf(want, sizeof want, "/tmp/memtrace-%u/", (unsigned)geteuid());
    assert_int_equal(strncmp(buf, want, strlen(want)), 0);
    if (xdg)
        setenv("XDG_RUNTIME_DIR", xdg, 1);
    if (env)
        setenv("MEMTRACE_SOCKET", env, 1);
    free(xdg);
    free(env);
}

static int unsquat(void **state)
{
    (void)state;
    char name[96];
    for (unsigned n = 0; n < 1024; n++) {
        snprintf(name, sizeof name, "/memtrace.%u.%d.%u", (unsigned)getuid(), (int)getpid(), n);
        shm_unlink(name);
    }
    return 0;
}

/* Every ring name the old scheme (/memtrace.<uid>.<pid>.<n>) could pick is taken. */
static void test_squatted_ring_names(void **state)
{
    (void)state;
    char dir[64], log[128], name[96];
    sec_tmpdir(dir, sizeof dir);
    snprintf(log, sizeof log, "%s/squat.ndjson", dir);
    for (unsigned n = 0; n < 1024; n++) {
        snprintf(name, sizeof name, "/memtrace.%u.%d.%u", (unsigned)getuid(), (int)getpid(), n);
        int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0644);
        if (fd >= 0)
            close(fd);
    }
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.socket = "/nonexistent/memtrace.sock";
    cfg.log_path = log;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    assert_int_equal(st.mode, MT_PROF_LOG);
    record(p, NEVENTS);
    mt_prof_destroy(&p);
    assert_int_equal(count_lines(log, "\"type\":\"event\""), NEVENTS);
    unlink(log);
    rmdir(dir);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static off_t size_of(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : -1;
}

static void test_log_symlink_not_followed(void **state)
{
    (void)state;
    char dir[64], target[128], link[128];
    sec_tmpdir(dir, sizeof dir);
    snprintf(target, sizeof target, "%s/rt_target.txt", dir);
    snprintf(link, sizeof link, "%s/link.ndjson", dir);
    write_file(target, "keep\n");
    assert_int_equal(symlink(target, link), 0);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = link;
    mt_prof_t *p = NULL;
    int rc = mt_prof_create(&p, &cfg);
    if (rc == 0) {
        record(p, 10);
        mt_prof_destroy(&p);
    }
    assert_int_equal(size_of(target), 5); /* nothing appended through the link */
    assert_int_not_equal(rc, 0);
    unlink(link);
    unlink(target);
    rmdir(dir);
}

static void test_log_of_another_user_refused(void **state)
{
    (void)state;
    if (!sec_can_switch_uid())
        skip();
    char dir[64], path[128];
    sec_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/planted.ndjson", dir);
    write_file(path, "");
    assert_int_equal(chmod(path, 0666), 0);
    assert_int_equal(chown(path, SEC_OTHER_UID, SEC_OTHER_UID), 0);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = path;
    mt_prof_t *p = NULL;
    int rc = mt_prof_create(&p, &cfg);
    if (rc == 0) {
        record(p, 10);
        mt_prof_destroy(&p);
    }
    assert_int_equal(size_of(path), 0); /* the attacker reads nothing of ours */
    assert_int_equal(rc, -EPERM);
    unlink(path);
    rmdir(dir);
}

/* The default log name ./memtrace-<pid>.ndjson, planted: the victim records elsewhere. */
static void test_default_log_planted(void **state)
{
    (void)state;
    if (!sec_can_switch_uid())
        skip();
    char dir[64], planted[160], cwd[512];
    sec_tmpdir(dir, sizeof dir);
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(dir), 0);
    snprintf(planted, sizeof planted, "memtrace-%d.ndjson", (int)getpid());
    write_file(planted, "");
    assert_int_equal(chmod(planted, 0666), 0);
    assert_int_equal(chown(planted, SEC_OTHER_UID, SEC_OTHER_UID), 0);
    unsetenv("MEMTRACE_LOG");
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.socket = "/nonexistent/memtrace.sock";
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    const char *used = mt_prof_log_path(p);
    assert_non_null(used);
    char path[256];
    snprintf(path, sizeof path, "%s", used);
    record(p, NEVENTS);
    mt_prof_destroy(&p);
    assert_int_equal(size_of(planted), 0);
    assert_int_equal(count_lines(path, "\"type\":\"event\""), NEVENTS);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    unlink(path);
    unlink(planted);
    assert_int_equal(chdir(cwd), 0);
    rmdir(dir);
}

static void test_new_log_is_private(void **state)
{
    (void)state;
    char dir[64], path[128];
    sec_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/new.ndjson", dir);
    mode_t old = umask(0);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = path;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    mt_prof_destroy(&p);
    umask(old);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fake_daemon_not_trusted),
        cmocka_unit_test(test_default_socket_in_private_dir),
        cmocka_unit_test_teardown(test_squatted_ring_names, unsquat),
        cmocka_unit_test(test_log_symlink_not_followed),
        cmocka_unit_test(test_log_of_another_user_refused),
        cmocka_unit_test(test_default_log_planted),
        cmocka_unit_test(test_new_log_is_private),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
