/* Another local user, for real: the test creates a user with
 * useradd, and processes running as that user (uid, gid and groups of the new account,
 * as setpriv --init-groups would set them) attack a victim program at once:
 * - they squat every shared-memory ring name the old scheme could give the victim's pid;
 * - they bind the victim's daemon socket path and answer every hello with ok (a fake
 *   daemon that reads nothing);
 * - they plant a symlink at the victim's default log name, in the shared directory the
 *   victim runs in, pointing at a file of the victim.
 * The victim (this test's uid, root) must record every event to a log of its own, leave
 * the target file untouched and say why. And with the victim's daemon running (its socket
 * even made world-writable), that user reads none of the victim's processes: not through
 * the Unix socket, not over HTTP without the token ("no user is ever shown
 * another user's processes"). The user, its group, the shared directory and the
 * squatted names are removed afterwards, also when the test fails. Exits 77 (skipped),
 * saying why, where no user can be made (not root, no useradd). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
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
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "memtrace/prof.h"
#include "tests/daemon/harness.h"
#include "tests/security/common.h"
#include <netinet/in.h>
#include "tests/common/test_main.h"

#define NEVENTS 500
#define SQUATS  1024

static char user[32];       /* the attacker's account, made by this test */
static uid_t auid;          /* its uid */
static gid_t agid;          /* its group */
static char dir[64];        /* shared, sticky, world-writable: like /tmp */
static char secret_dir[64]; /* the victim's own 0700 directory */
static pid_t fake_pid = -1;

/* Runs argv (no shell); returns its exit status, or -1 if it could not run. */
static int run(char *const argv[])
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, 1);
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Users of earlier runs that died before removing theirs: mtxu<pid> with pid gone. */
static void remove_stale_users(void)
{
    setpwent();
    struct passwd *pw;
    char stale[16][32];
    int n = 0;
    while ((pw = getpwent()) != NULL && n < 16) {
        char *end;
        if (strncmp(pw->pw_name, "mtxu", 4) != 0)
            continue;
        long pid = strtol(pw->pw_name + 4, &end, 10);
        if (*end == '\0' && pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH)
            snprintf(stale[n++], sizeof stale[0], "%s", pw->pw_name);
    }
    endpwent();
    for (int i = 0; i < n; i++) {
        char *argv[] = {"/usr/sbin/userdel", stale[i], NULL};
        run(argv);
    }
}

/* 0, or a reason not to run (printed by main). */
static const char *make_user(void)
{
    if (geteuid() != 0)
        return "not root: no second user can be made";
    if (access("/usr/sbin/useradd", X_OK) != 0 || access("/usr/sbin/userdel", X_OK) != 0)
        return "no /usr/sbin/useradd and userdel";
    remove_stale_users();
    snprintf(user, sizeof user, "mtxu%d", (int)getpid());
    char *argv[] = {"/usr/sbin/useradd",
                    "--system",
                    "--no-create-home",
                    "--user-group",
                    "--shell",
                    "/usr/sbin/nologin",
                    user,
                    NULL};
    int rc = -1;
    for (int i = 0; i < 10 && rc != 0; i++) /* another useradd may hold the lock a moment */
        if ((rc = run(argv)) != 0)
            usleep(300 * 1000);
    if (rc != 0)
        return "useradd failed (read-only /etc, or no permission)";
    struct passwd *pw = getpwnam(user);
    if (pw == NULL)
        return "useradd said yes but the user is not there";
    auid = pw->pw_uid;
    agid = pw->pw_gid;
    return NULL;
}

static void remove_user(void)
{
    if (user[0] == '\0')
        return;
    char *argv[] = {"/usr/sbin/userdel", user, NULL};
    if (run(argv) != 0)
        fprintf(stderr, "cross_user: userdel %s failed\n", user);
    else if (getpwnam(user) != NULL || getgrnam(user) != NULL)
        fprintf(stderr, "cross_user: %s is still there after userdel\n", user);
}

/* In a child: becomes the attacker for good (groups, gid, uid), as setpriv would. */
static void become_attacker(void)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with the test, even if it fails */
    if (initgroups(user, agid) != 0 || setresgid(agid, agid, agid) != 0 ||
        setresuid(auid, auid, auid) != 0 || geteuid() != auid)
        _exit(90);
}

static void attacker_squat(pid_t victim)
{
    become_attacker();
    char name[96];
    for (unsigned n = 0; n < SQUATS; n++) {
        snprintf(name, sizeof name, "/memtrace.%u.%d.%u", 0u, (int)victim, n);
        int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0644);
        if (fd < 0)
            _exit(91);
        close(fd);
    }
    _exit(0);
}

static void attacker_link(const char *link, const char *target)
{
    become_attacker();
    _exit(symlink(target, link) == 0 ? 0 : 92);
}

static void attacker_daemon(const char *sock, int ready)
{
    become_attacker();
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0 ||
        chmod(sock, 0777) != 0 || write(ready, "x", 1) != 1)
        _exit(93);
    for (;;) {
        int c = accept(fd, NULL, NULL);
        char buf[1024];
        if (c >= 0 && read(c, buf, sizeof buf) > 0 && write(c, "{\"ok\":true}\n", 12) != 12)
            _exit(94);
        /* kept open: a victim that trusted it would believe it is registered */
    }
}

/* Every wait of the parent is bounded, far beyond what any load needs, and names what it
 * waited for: a child that hangs fails the test with that name instead of running into
 * meson's timeout. */
#define WAIT_MS 30000

/* pid's exit status (128 + signal if killed); a child still running after WAIT_MS is
 * killed and the test fails, naming what. */
static int wait_child(pid_t pid, const char *what)
{
    uint64_t deadline = th_now_ms() + WAIT_MS;
    int st = 0;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR)
            fail_msg("waitpid on %s (pid %d): %s", what, (int)pid, strerror(errno));
        if (r == 0 && th_now_ms() >= deadline) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
            fail_msg("%s (pid %d) did not exit within %d s: killed", what, (int)pid,
                     WAIT_MS / 1000);
        }
        usleep(10000);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* read() of up to len bytes from fd once something or EOF is there; fails the test,
 * naming what, if nothing came within WAIT_MS. */
static ssize_t read_within(int fd, void *buf, size_t len, const char *what)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int pr;
    while ((pr = poll(&pfd, 1, WAIT_MS)) < 0 && errno == EINTR)
        ;
    if (pr == 0)
        fail_msg("no word from %s within %d s", what, WAIT_MS / 1000);
    return read(fd, buf, len);
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

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/mt-xu-XXXXXX");
    snprintf(secret_dir, sizeof secret_dir, "/tmp/mt-xu-own-XXXXXX");
    if (!mkdtemp(dir) || !mkdtemp(secret_dir) || chmod(dir, 01777) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (fake_pid > 0) {
        kill(fake_pid, SIGKILL);
        wait_child(fake_pid, "the fake daemon, killed");
        fake_pid = -1;
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", dir, secret_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_victim_records_everything(void **state)
{
    (void)state;
    char sock[100], target[128], msgs_path[128];
    snprintf(sock, sizeof sock, "%s/memtrace.sock", dir);
    snprintf(target, sizeof target, "%s/secret.txt", secret_dir);
    snprintf(msgs_path, sizeof msgs_path, "%s/victim.msgs", secret_dir);
    FILE *t = fopen(target, "w");
    assert_non_null(t);
    fputs("keep\n", t);
    fclose(t);

    /* The fake daemon, bound first. */
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    fflush(NULL);
    fake_pid = fork();
    assert_true(fake_pid >= 0);
    if (fake_pid == 0)
        attacker_daemon(sock, ready[1]);
    close(ready[1]); /* a fake daemon that dies before binding is then an EOF here */
    char b;
    if (read_within(ready[0], &b, 1, "the fake daemon (bound, or why not)") != 1) {
        int why = wait_child(fake_pid, "the fake daemon, failed");
        fake_pid = -1;
        fail_msg("the fake daemon exited %d before it was bound (90: not the attacker; 93: "
                 "bind, listen or chmod)",
                 why);
    }
    close(ready[0]);
    struct stat st;
    assert_int_equal(lstat(sock, &st), 0);
    assert_int_equal(st.st_uid, auid);

    /* The victim: started, then held until the squats and the link are in place. */
    int go[2], out[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(out), 0);
    pid_t victim = fork();
    assert_true(victim >= 0);
    if (victim == 0) {
        close(go[1]);
        close(out[0]);
        if (read(go[0], &b, 1) != 1 || chdir(dir) != 0)
            _exit(10);
        unsetenv("MEMTRACE_LOG");
        unsetenv("MEMTRACE_PROF");
        static sec_log_t msgs;
        mt_prof_cfg_t cfg = mt_prof_cfg_default(); /* auto: daemon, else the local log */
        cfg.socket = sock;
        cfg.log = sec_log_cb;
        cfg.log_ud = &msgs;
        mt_prof_t *p = NULL;
        if (mt_prof_create(&p, &cfg) != 0)
            _exit(11);
        mt_prof_stats_t ps;
        mt_prof_stats(p, &ps);
        if (ps.mode != MT_PROF_LOG)
            _exit(12);
        for (unsigned i = 0; i < NEVENTS; i++) {
            mt_event_rec_t ev = {.kind = MT_EV_ALLOC, .addr = 0x1000 + 512u * i, .size = 512};
            if (mt_prof_record(p, &ev) != 0)
                _exit(13);
        }
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, mt_prof_log_path(p));
        mt_prof_destroy(&p);
        FILE *m = fopen(msgs_path, "w");
        if (!m)
            _exit(14);
        fputs(msgs.text, m);
        fclose(m);
        if (write(out[1], path, strlen(path) + 1) != (ssize_t)strlen(path) + 1)
            _exit(15);
        _exit(0);
    }
    close(go[0]);
    close(out[1]);

    pid_t squat = fork();
    assert_true(squat >= 0);
    if (squat == 0)
        attacker_squat(victim);
    assert_int_equal(wait_child(squat, "the attacker squatting ring names"), 0);
    char link[128];
    snprintf(link, sizeof link, "%s/memtrace-%d.ndjson", dir, (int)victim);
    pid_t linker = fork();
    assert_true(linker >= 0);
    if (linker == 0)
        attacker_link(link, target);
    assert_int_equal(wait_child(linker, "the attacker planting the link"), 0);
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(st.st_uid, auid);

    assert_int_equal(write(go[1], "x", 1), 1);
    char path[512] = "";
    ssize_t n = read_within(out[0], path, sizeof path - 1, "the victim (its log's path)");
    int rc = wait_child(victim, "the victim recording to its own log");
    close(go[1]);
    close(out[0]);

    /* The squatted names were the attacker's: removed whatever happened. */
    char name[96];
    for (unsigned i = 0; i < SQUATS; i++) {
        snprintf(name, sizeof name, "/memtrace.%u.%d.%u", 0u, (int)victim, i);
        shm_unlink(name);
    }
    assert_int_equal(rc, 0);
    assert_true(n > 0);
    /* Everything recorded, to a file of the victim's own, and nothing through the link. */
    assert_int_equal(count_lines(path, "\"type\":\"event\""), NEVENTS);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_uid, geteuid());
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(stat(target, &st), 0);
    assert_int_equal(st.st_size, 5);
    /* And it said why it did not use the daemon. */
    char text[8192] = "";
    FILE *m = fopen(msgs_path, "r");
    assert_non_null(m);
    text[fread(text, 1, sizeof text - 1, m)] = '\0';
    fclose(m);
    char want[64];
    snprintf(want, sizeof want, "runs as uid %u", (unsigned)auid);
    if (!strstr(text, want) || !strstr(text, "not trusted"))
        fail_msg("the victim's messages do not name the untrusted daemon:\n%s", text);
}

/* Reads fd until EOF into buf (NUL-terminated); -1 if the peer neither closed nor sent
 * anything for 10 s: a daemon that leaves a refused client hanging is a failure too. A
 * reset is a close: the daemon closing on our unread request resets a Unix socket. */
static ssize_t read_to_eof(int fd, char *buf, size_t cap)
{
    struct timeval tv = {.tv_sec = 10};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
        return -1;
    size_t n = 0;
    ssize_t r = 0;
    while (n < cap - 1 && ((r = read(fd, buf + n, cap - 1 - n)) > 0 || (r < 0 && errno == EINTR)))
        n += r > 0 ? (size_t)r : 0;
    buf[n] = '\0';
    return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? -1 : (ssize_t)n;
}

/* The attacker's reads of the victim's daemon: 0 if it learned nothing, else the step
 * (7 and 8: the daemon kept the Unix or the HTTP connection open without an answer). */
static int attacker_reads(const char *sock, int port, int victim)
{
    become_attacker();
    char pidtxt[32], buf[65536];
    snprintf(pidtxt, sizeof pidtxt, "\"pid\":%d", victim);
    /* The Unix socket, as a consumer asking for the state. */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        return 1; /* it must get as far as the daemon's own check */
    static const char req[] = "{\"type\":\"state\"}\n";
    if (send(fd, req, sizeof req - 1, MSG_NOSIGNAL) != (ssize_t)sizeof req - 1 && errno != EPIPE)
        return 2;
    ssize_t got = read_to_eof(fd, buf, sizeof buf);
    close(fd);
    if (got < 0)
        return 7;
    if (strstr(buf, pidtxt) || strstr(buf, "processes"))
        return 3;
    /* HTTP without the token. */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&in, sizeof in) != 0)
        return 4;
    static const char get[] = "GET /state HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    if (send(fd, get, sizeof get - 1, MSG_NOSIGNAL) != (ssize_t)sizeof get - 1)
        return 5;
    got = read_to_eof(fd, buf, sizeof buf);
    close(fd);
    if (got < 0)
        return 8;
    if (strncmp(buf, "HTTP/1.1 401", 12) != 0 || strstr(buf, pidtxt))
        return 6;
    return 0;
}

static void test_other_user_sees_nothing(void **state)
{
    (void)state;
    static sec_log_t msgs;
    memset(&msgs, 0, sizeof msgs);
    th_daemon_t t;
    mt_d_cfg_t cfg = th_cfg();
    cfg.log = sec_log_cb;
    cfg.log_ud = &msgs;
    th_daemon_start(&t, cfg);
    /* Made reachable on purpose: the daemon's own check must hold alone. */
    assert_int_equal(chmod(t.dir, 0755), 0);
    assert_int_equal(chmod(t.sock, 0666), 0);
    /* Both children exec this binary again (th_spawn): the daemon's thread runs here, and
     * a forked child that mallocs (initgroups, the profiler) can hang on a lock it held. */
    const char *const vargs[5] = {t.sock};
    pid_t victim = th_spawn("victim", vargs);
    assert_int_equal(wait_child(victim, "the victim recording through the daemon"), 0);
    json_t *p = th_wait_exited(t.sock, victim, 10000);
    assert_non_null(p); /* the victim's own view has it */
    json_decref(p);
    char ids[48], port[16], vpid[16];
    snprintf(ids, sizeof ids, "%u:%u", (unsigned)auid, (unsigned)agid);
    snprintf(port, sizeof port, "%d", t.port);
    snprintf(vpid, sizeof vpid, "%d", (int)victim);
    const char *const aargs[5] = {user, ids, t.sock, port, vpid};
    pid_t atk = th_spawn("attacker-reads", aargs);
    int rc = wait_child(atk, "the attacker reading the daemon");
    th_daemon_stop(&t);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(msgs.text, "refused a connection from another uid"));
}

/* The victim of test_other_user_sees_nothing: one event through the daemon at sock. */
static int victim_body(const char *sock)
{
    mt_prof_t *p = NULL;
    if (th_prof_open(sock, "victim", &p) != 0)
        return 1;
    mt_event_rec_t ev = {.kind = MT_EV_ALLOC, .addr = 0x1000, .size = 512};
    int rc = mt_prof_record(p, &ev);
    mt_prof_destroy(&p);
    return rc ? 2 : 0;
}

/* The roles th_spawn runs in a fresh exec; returns only when this process has none. */
static void child_dispatch(int argc, char **argv)
{
    char **a;
    const char *role = th_role(argc, argv, &a);
    if (role == NULL)
        return;
    if (strcmp(role, "victim") == 0 && argc == 4)
        _exit(victim_body(a[0]));
    if (strcmp(role, "attacker-reads") == 0 && argc == 8) {
        unsigned u, g;
        if (sscanf(a[1], "%u:%u", &u, &g) != 2)
            _exit(97);
        snprintf(user, sizeof user, "%s", a[0]);
        auid = (uid_t)u;
        agid = (gid_t)g;
        _exit(attacker_reads(a[2], atoi(a[3]), atoi(a[4])));
    }
    _exit(98);
}

int main(int argc, char **argv)
{
    th_producer_dispatch(argc, argv);
    child_dispatch(argc, argv);
    const char *why = make_user();
    if (why) {
        printf("skipped: %s\n", why);
        return 77;
    }
    printf("attacker: user %s, uid %u, gid %u\n", user, (unsigned)auid, (unsigned)agid);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_victim_records_everything, setup, teardown),
        cmocka_unit_test(test_other_user_sees_nothing),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    remove_user();
    return mt_test_end(rc);
}
