/* OOM snapshots under attack and in bad weather: an OOM storm (a program that catches OOMs
 * and retries) in local mode and through the daemon, a symbolic link higher up the OOM
 * directory's path, and a full disk. Each case names what it must keep: bounded time and a
 * snapshot per interval, a daemon that keeps answering and acts on SIGTERM, files elsewhere
 * left alone, the newest snapshot written. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "analysis/torch_snapshot.h"
#include "memtrace/prof.h"
#include "tests/common/test_main.h"
#include "tests/daemon/harness.h"
#include "tests/security/common.h"

#define STORM      20000 /* OOMs of a storm */
#define STORM_LIVE 3000  /* live allocations before it: snapshots of some size */

/* In a forked child: a failed check ends it, saying why. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);                      \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Files in dir whose names end in suffix (and, if prefix, begin with it). */
static unsigned count_files(const char *dir, const char *prefix, const char *suffix)
{
    DIR *d = opendir(dir);
    unsigned n = 0;
    size_t sl = strlen(suffix);
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
        size_t l = strlen(e->d_name);
        n += l >= sl && strcmp(e->d_name + l - sl, suffix) == 0 &&
             (prefix == NULL || strncmp(e->d_name, prefix, strlen(prefix)) == 0);
    }
    if (d != NULL)
        closedir(d);
    return n;
}

static void rm_rf(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static mt_event_rec_t event(int kind, uint64_t addr, uint64_t size, uint64_t t)
{
    return (mt_event_rec_t){.time_ns = t,
                            .addr = addr,
                            .size = size,
                            .requested = size,
                            .kind = (uint8_t)kind,
                            .pool = MT_POOL_LARGE};
}

/* A local recorder writing its log and OOM snapshots under dir/oom; interval in ms ("0":
 * every OOM). */
static mt_prof_t *local_prof(const char *dir, const char *oomdir, const char *interval,
                             sec_log_t *msgs)
{
    char logp[256];
    snprintf(logp, sizeof logp, "%s/run-%u.ndjson", dir, (unsigned)(mono_ns() % 1000000u));
    mt_prof_cfg_t pc = mt_prof_cfg_default();
    snprintf(pc.oom_dir, sizeof pc.oom_dir, "%s", oomdir);
    pc.oom_interval_ms = (unsigned)strtoul(interval, NULL, 10);
    pc.mode = MT_PROF_LOG;
    pc.log_path = logp;
    pc.log = msgs ? sec_log_cb : NULL;
    pc.log_ud = msgs;
    mt_prof_t *p = NULL;
    if (mt_prof_create(&p, &pc) != 0)
        return NULL;
    return p;
}

/* live allocations, then n OOMs from t0 on, step ns apart. */
static void record_storm(mt_prof_t *p, unsigned live, unsigned n, uint64_t t0, uint64_t step)
{
    mt_event_rec_t seg = event(MT_EV_SEGMENT_ALLOC, 1u << 30, (uint64_t)live << 20, t0);
    mt_prof_record(p, &seg);
    for (unsigned i = 0; i < live; i++) {
        mt_event_rec_t a = event(MT_EV_ALLOC, (1u << 30) + ((uint64_t)i << 20), 1u << 20, t0);
        mt_prof_record(p, &a);
    }
    for (unsigned i = 0; i < n; i++) {
        mt_event_rec_t o = event(MT_EV_OOM, 0, 0, t0 + 1000 + i * step);
        o.requested = 1u << 30;
        mt_prof_record(p, &o);
    }
}

/* ---- the storm, local mode ---- */

/* 20 000 OOMs over 2.5 intervals of 1 s (by the events' clock): three snapshots, at the
 * OOMs the interval names (the 1st, the 8001st, the 16001st), the rest counted, all in a
 * few seconds however slow the disk. */
static void test_local_storm(void **state)
{
    (void)state;
    char dir[64], oomdir[128], name[200];
    sec_tmpdir(dir, sizeof dir);
    snprintf(oomdir, sizeof oomdir, "%s/oom", dir);
    sec_log_t msgs = {{0}};
    uint64_t t0 = mono_ns();
    mt_prof_t *p = local_prof(dir, oomdir, "1000", &msgs);
    assert_non_null(p);
    const uint64_t step = 2500000000u / STORM; /* 2.5 s of OOMs */
    record_storm(p, STORM_LIVE, STORM, mono_ns(), step);
    assert_int_equal(mt_prof_flush(p), 0);
    mt_prof_stats_t st;
    mt_prof_stats(p, &st);
    mt_prof_destroy(&p);
    double secs = (double)(mono_ns() - t0) / 1e9;
    print_message("storm of %u OOMs: %.2f s, %llu snapshots, %llu suppressed\n", STORM, secs,
                  (unsigned long long)st.oom_snapshots,
                  (unsigned long long)st.oom_snapshots_suppressed);
    assert_int_equal(st.dropped, 0);
    assert_true(secs < 10.0);
    assert_int_equal(count_files(oomdir, "oom-", ".json"), 3);
    assert_int_equal(count_files(oomdir, "oom-", ".pickle"), 3);
    const unsigned nth[3] = {1, 1 + 1000000000u / (unsigned)step, 1 + 2000000000u / (unsigned)step};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s/oom-%d-dev0-%u.pickle", oomdir, (int)getpid(), nth[i]);
        if (access(name, R_OK) != 0)
            fail_msg("no %s", name);
    }
    assert_int_equal(st.oom_snapshots, 3);
    assert_int_equal(st.oom_snapshots_suppressed, STORM - 3);
    char want[96];
    snprintf(want, sizeof want, "%u of %u OOMs got no snapshot", STORM - 3, STORM);
    if (strstr(msgs.text, want) == NULL)
        fail_msg("want '%s' in: %s", want, msgs.text);
    rm_rf(dir);
}

/* ---- the storm, through the daemon ---- */

/* The producer: records through the daemon, STORM OOMs in bursts, says so on stop_fd and
 * waits to be killed. */
static void storm_producer(const char *sock, int stop_fd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that failed does not wait to kill it */
    mt_prof_t *p = NULL;
    if (th_prof_open(sock, "stormer", &p) != 0)
        _exit(10);
    record_storm(p, STORM_LIVE, STORM, mono_ns(), 1000);
    char c = 1;
    if (write(stop_fd, &c, 1) != 1)
        _exit(11);
    for (;;)
        pause();
}

/* GET /healthz with a 5 s deadline; returns the ms it took (5000 when it did not answer). */
static unsigned healthz_ms(int port)
{
    uint64_t t = mono_ns();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(0x7f000001)};
    static const char req[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    char buf[512];
    ssize_t r = -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        send(fd, req, sizeof req - 1, MSG_NOSIGNAL) == (ssize_t)sizeof req - 1)
        r = recv(fd, buf, sizeof buf - 1, 0);
    close(fd);
    unsigned ms = (unsigned)((mono_ns() - t) / 1000000u);
    return r > 12 && memcmp(buf, "HTTP/1.1 200", 12) == 0 ? ms : 5000;
}

/* The number after `name ` in the Prometheus text, or -1. */
static long long metric(const char *text, const char *name)
{
    const char *s = strstr(text, name);
    return s ? strtoll(s + strlen(name), NULL, 10) : -1;
}

/* A producer's OOM storm: the daemon's loop goes on answering /healthz within a second
 * (the snapshots are made off the loop), one snapshot is written in the interval, and the
 * other OOMs are counted in /metrics. */
static void test_daemon_storm(void **state)
{
    (void)state;
    char dir[64], oomdir[128];
    sec_tmpdir(dir, sizeof dir);
    snprintf(oomdir, sizeof oomdir, "%s/oom", dir);
    th_daemon_t t;
    mt_d_cfg_t cfg = th_cfg();
    cfg.oom_dir = oomdir;
    cfg.oom_interval_ms = 60000;
    th_daemon_start(&t, cfg);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", fds[1]);
    const char *const args[5] = {t.sock, fdarg, NULL};
    pid_t pid = th_spawn("stormer", args);
    close(fds[1]);
    char c;
    if (read(fds[0], &c, 1) != 1)
        fail_msg("the storm's producer failed: status %d", WEXITSTATUS(th_wait(pid)));
    close(fds[0]);
    /* Until the daemon has seen the whole storm (or 20 s), /healthz every 50 ms. */
    unsigned worst = 0, asked = 0;
    long long seen = 0;
    char *m = NULL;
    for (uint64_t until = th_now_ms() + 20000; th_now_ms() < until; usleep(50000)) {
        unsigned ms = healthz_ms(t.port);
        worst = ms > worst ? ms : worst;
        asked++;
        free(m);
        m = NULL;
        assert_int_equal(th_http_get(t.port, "/metrics", &m), 200);
        seen = metric(m, "memtrace_daemon_oom_snapshots_total{result=\"written\"} ") +
               metric(m, "memtrace_daemon_oom_snapshots_total{result=\"suppressed\"} ");
        if (seen >= STORM && count_files(oomdir, "oom-", ".pickle") > 0)
            break;
    }
    print_message("daemon storm: /healthz asked %u times, the slowest %u ms; %lld OOMs seen\n",
                  asked, worst, seen);
    assert_true(worst < 1000);
    assert_int_equal(seen, STORM);
    assert_int_equal(metric(m, "memtrace_daemon_oom_snapshots_total{result=\"written\"} "), 1);
    assert_int_equal(metric(m, "memtrace_daemon_oom_snapshots_total{result=\"suppressed\"} "),
                     STORM - 1);
    free(m);
    assert_int_equal(count_files(oomdir, "oom-", ".json"), 1);
    assert_int_equal(count_files(oomdir, "oom-", ".pickle"), 1);
    kill(pid, SIGKILL);
    th_wait(pid);
    uint64_t t_stop = th_now_ms();
    th_daemon_stop(&t);
    assert_true(th_now_ms() - t_stop < 2000);
    rm_rf(dir);
}

/* The daemon in a child of its own, signals handled, snapshots into oomdir; returns once
 * its socket is bound. The child exits 0 when it stopped cleanly. */
static pid_t daemon_child(const char *sock, const char *oomdir)
{
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uv_loop_t loop;
        if (uv_loop_init(&loop) != 0)
            _exit(3);
        mt_d_cfg_t cfg = th_cfg();
        cfg.socket_path = sock;
        cfg.http_port = -1;
        cfg.loop = &loop;
        cfg.handle_signals = true;
        cfg.oom_dir = oomdir;
        cfg.oom_interval_ms = 60000;
        mt_d_t *d = NULL;
        if (mt__d_create(&d, &cfg) != 0)
            _exit(4);
        char c = 1;
        if (write(ready[1], &c, 1) != 1)
            _exit(5);
        int rc = mt__d_run(d);
        mt__d_destroy(&d);
        _exit(rc == 0 && uv_loop_close(&loop) == 0 ? 0 : 6);
    }
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    close(ready[0]);
    close(ready[1]);
    return pid;
}

/* SIGTERM in the middle of a storm: the daemon acts on it within 3 s (it finishes the
 * snapshot it has queued, and exits cleanly). */
static void test_daemon_sigterm_in_storm(void **state)
{
    (void)state;
    char dir[64], oomdir[128], sock[128];
    sec_tmpdir(dir, sizeof dir);
    snprintf(oomdir, sizeof oomdir, "%s/oom", dir);
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    pid_t dpid = daemon_child(sock, oomdir);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", fds[1]);
    const char *const args[5] = {sock, fdarg, NULL};
    pid_t pid = th_spawn("stormer", args);
    close(fds[1]);
    char c;
    if (read(fds[0], &c, 1) != 1)
        fail_msg("the storm's producer failed: status %d", WEXITSTATUS(th_wait(pid)));
    close(fds[0]);
    usleep(20000); /* the daemon is draining the storm */
    assert_int_equal(kill(dpid, SIGTERM), 0);
    int st = th_wait_within(dpid, 3000, "the daemon to act on SIGTERM during an OOM storm");
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    kill(pid, SIGKILL);
    th_wait(pid);
    rm_rf(dir);
}

/* ---- a link higher up the path ---- */

/* One OOM of a local recorder whose OOM directory is oomdir. */
static void one_oom(const char *dir, const char *oomdir, unsigned live, sec_log_t *msgs)
{
    mt_prof_t *p = local_prof(dir, oomdir, "0", msgs);
    assert_non_null(p);
    record_storm(p, live, 1, mono_ns(), 1);
    assert_int_equal(mt_prof_flush(p), 0);
    mt_prof_destroy(&p);
}

/* victim/oom holds ten snapshots of another program; link points at victim from a directory
 * anyone may write to (and, second case, is another user's, in a sticky one). An OOM
 * directory of link/oom must be refused: nothing written there, nothing pruned. A link of
 * ours in a directory of ours is followed. */
static void test_link_higher_up(void **state)
{
    (void)state;
    char dir[64], victim[128], open_dir[128], sticky[128], mine[128], path[300];
    sec_tmpdir(dir, sizeof dir);
    snprintf(victim, sizeof victim, "%s/victim/oom", dir);
    snprintf(path, sizeof path, "%s/victim", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(mkdir(victim, 0700), 0);
    for (int i = 1; i <= 10; i++) {
        snprintf(path, sizeof path, "%s/oom-1-dev0-%d.json", victim, i);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs("{}", f);
        fclose(f);
    }
    /* a directory anyone may write to, not sticky: whoever could have put the link */
    snprintf(open_dir, sizeof open_dir, "%s/open", dir);
    assert_int_equal(mkdir(open_dir, 0777), 0);
    assert_int_equal(chmod(open_dir, 0777), 0);
    snprintf(path, sizeof path, "%s/open/link", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    assert_int_equal(symlink(victim, path), 0);
    snprintf(path, sizeof path, "%s/open/link/oom", dir);
    sec_log_t msgs = {{0}};
    one_oom(dir, path, 4, &msgs);
    snprintf(victim, sizeof victim, "%s/victim/oom", dir);
    assert_int_equal(count_files(victim, "oom-", ".json"), 10);
    assert_int_equal(count_files(victim, "oom-", ".pickle"), 0);
    if (strstr(msgs.text, "not a private directory of ours") == NULL)
        fail_msg("no warning: %s", msgs.text);
    /* another user's link in a sticky directory (as /tmp): not followed either */
    if (geteuid() == 0) {
        snprintf(sticky, sizeof sticky, "%s/sticky", dir);
        assert_int_equal(mkdir(sticky, 0777), 0);
        assert_int_equal(chmod(sticky, 01777), 0);
        snprintf(path, sizeof path, "%s/sticky/link", dir);
        snprintf(victim, sizeof victim, "%s/victim", dir);
        assert_int_equal(symlink(victim, path), 0);
        assert_int_equal(lchown(path, SEC_OTHER_UID, SEC_OTHER_UID), 0);
        snprintf(path, sizeof path, "%s/sticky/link/oom", dir);
        one_oom(dir, path, 4, NULL);
        snprintf(victim, sizeof victim, "%s/victim/oom", dir);
        assert_int_equal(count_files(victim, "oom-", ".json"), 10);
        assert_int_equal(count_files(victim, "oom-", ".pickle"), 0);
    }
    /* ours, in a directory of ours closed to others: followed */
    snprintf(mine, sizeof mine, "%s/mine", dir);
    assert_int_equal(mkdir(mine, 0700), 0);
    snprintf(path, sizeof path, "%s/mine/link", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    assert_int_equal(symlink(victim, path), 0);
    snprintf(path, sizeof path, "%s/mine/link/oom", dir);
    one_oom(dir, path, 4, NULL);
    snprintf(victim, sizeof victim, "%s/victim/oom", dir);
    assert_int_equal(count_files(victim, "oom-", ".pickle"), 1);
    assert_int_equal(count_files(victim, "oom-", ".json"), 8); /* the 8 newest kept */
    rm_rf(dir);
}

/* ---- a full disk ---- */

static off_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : -1;
}

static void copy_file(const char *from, const char *to, time_t mtime)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    CHECK(system(cmd) == 0, "%s", cmd);
    struct timespec ts[2] = {{.tv_sec = mtime}, {.tv_sec = mtime}};
    CHECK(utimensat(AT_FDCWD, to, ts, 0) == 0, "%s", strerror(errno));
}

/* In a child with a 16 MiB tmpfs of its own at oomdir: five older snapshots and a filler
 * leave less room than one snapshot needs. The new one is written whole (the oldest goes
 * to make room), nothing half-written stays. */
static void full_disk_body(const char *dir, const char *oomdir)
{
    char path[300], to[300];
    /* a first snapshot, to learn its size and copy as older ones */
    one_oom(dir, oomdir, 2000, NULL);
    snprintf(path, sizeof path, "%s/oom-%d-dev0-1.json", oomdir, (int)getpid());
    off_t pair = file_size(path);
    snprintf(path, sizeof path, "%s/oom-%d-dev0-1.pickle", oomdir, (int)getpid());
    pair += file_size(path);
    CHECK(pair > 100000, "pair of %lld bytes", (long long)pair);
    for (int i = 1; i <= 5; i++)
        for (int k = 0; k < 2; k++) {
            const char *ext = k ? "pickle" : "json";
            snprintf(path, sizeof path, "%s/oom-%d-dev0-1.%s", oomdir, (int)getpid(), ext);
            snprintf(to, sizeof to, "%s/oom-1-dev0-%d.%s", oomdir, i, ext);
            copy_file(path, to, 1000000000 + i);
        }
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/oom-%d-dev0-1.%s", oomdir, (int)getpid(),
                 k ? "pickle" : "json");
        CHECK(unlink(path) == 0, "%s", strerror(errno));
    }
    /* a filler, until less than half a snapshot is free */
    snprintf(path, sizeof path, "%s/filler", oomdir);
    int fd = open(path, O_WRONLY | O_CREAT, 0600);
    CHECK(fd >= 0, "%s", strerror(errno));
    static char zeros[4096];
    struct statvfs vs;
    while (statvfs(oomdir, &vs) == 0 && (off_t)(vs.f_bavail * vs.f_bsize) > pair / 2)
        CHECK(write(fd, zeros, sizeof zeros) == (ssize_t)sizeof zeros, "%s", strerror(errno));
    close(fd);
    sec_log_t msgs = {{0}};
    one_oom(dir, oomdir, 2000, &msgs);
    /* the new snapshot is whole: both files, readable */
    snprintf(path, sizeof path, "%s/oom-%d-dev0-1.json", oomdir, (int)getpid());
    json_t *j = json_load_file(path, 0, NULL);
    CHECK(j != NULL, "the newest JSON is missing or cut; log: %s", msgs.text);
    json_decref(j);
    snprintf(path, sizeof path, "%s/oom-%d-dev0-1.pickle", oomdir, (int)getpid());
    mt_ts_t *ts = NULL;
    char err[512];
    CHECK(mt__ts_read(&ts, path, err, sizeof err) == 0, "the newest pickle: %s; log: %s", err,
          msgs.text);
    mt__ts_destroy(&ts);
    /* the oldest went for it, the others stay, nothing half-written is left */
    snprintf(path, sizeof path, "%s/oom-1-dev0-1.json", oomdir);
    CHECK(access(path, F_OK) != 0, "the oldest is still there");
    snprintf(path, sizeof path, "%s/oom-1-dev0-5.pickle", oomdir);
    CHECK(access(path, F_OK) == 0, "a newer older one went");
    CHECK(count_files(oomdir, NULL, ".tmp") == 0, "a temporary file is left");
}

static void test_full_disk(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip(); /* a tmpfs of our own needs root */
    char dir[64], oomdir[128];
    sec_tmpdir(dir, sizeof dir);
    snprintf(oomdir, sizeof oomdir, "%s/oom", dir);
    assert_int_equal(mkdir(oomdir, 0700), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* A mount of our own, gone with this process. */
        if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
            mount("tmpfs", oomdir, "tmpfs", 0, "size=16m,mode=0700") != 0)
            _exit(77);
        full_disk_body(dir, oomdir);
        _exit(0);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
        skip();
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    rm_rf(dir);
}

int main(int argc, char **argv)
{
    char **args;
    const char *role = th_role(argc, argv, &args);
    if (role != NULL && strcmp(role, "stormer") == 0)
        storm_producer(args[0], atoi(args[1]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local_storm),
        cmocka_unit_test(test_link_higher_up),
        cmocka_unit_test(test_full_disk),
        cmocka_unit_test(test_daemon_sigterm_in_storm),
        /* last: failing, it leaves its daemon's threads behind, and the others fork */
        cmocka_unit_test(test_daemon_storm),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
