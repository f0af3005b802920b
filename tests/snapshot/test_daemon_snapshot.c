/* Snapshots through the daemon: a process recorded by the daemon (memtrace's allocator on
 * the sim backend, tags, then out-of-memory five times) gets its OOM snapshots written into
 * the OOM directory, bounded in number, named as the allocator's message says, readable as
 * PyTorch snapshots and memtrace JSON; `memtrace snapshot PID` writes its live state.
 * argv[1]: the memtrace executable. */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "analysis/torch_snapshot.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "profiler/internal.h"
#include "tests/daemon/harness.h"
#include "tests/common/test_main.h"

static const char *memtrace_exe;

/* Threads of this process now. */
static int thread_count(void)
{
    DIR *dir = opendir("/proc/self/task");
    int n = 0;
    assert_non_null(dir);
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(dir);
    return n;
}

/* The child: records through the daemon, runs out of memory five times, says so on
 * stop_fd and waits to be killed. */
static void oomer_body(const char *sock, int stop_fd)
{
    mt_prof_cfg_t pc = mt_prof_cfg_default();
    (void)mt_prof_cfg_from_env(&pc); /* MEMTRACE_OOM_DIR, as the drop-in reads it */
    pc.mode = MT_PROF_DAEMON;
    pc.socket = sock;
    pc.name = "oomer";
    mt_prof_t *p = NULL;
    if (mt_prof_create(&p, &pc) != 0)
        _exit(10);
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = (size_t)64 << 20;
    mt_backend_t *b = NULL;
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    mt_alloc_t *a = NULL;
    /* Plain segments: the snapshots below count a small and a large segment. */
    if (mt_backend_create(&b, &bc) != 0 || mt_alloc_cfg_parse(&ac, "rules:reference", NULL, 0) != 0)
        _exit(11);
    ac.backend = b;
    ac.sink = mt_prof_sink(p);
    if (mt_alloc_create(&a, &ac) != 0)
        _exit(12);
    int kv;
    void *x;
    if (mt_alloc_tag_register(a, "kv cache", &kv) != 0 ||
        mt_alloc_malloc(a, 20 << 20, NULL, kv, &x) != 0 ||
        mt_alloc_malloc(a, 3 << 20, NULL, MT_TAG_ACTIVATIONS, &x) != 0 ||
        mt_alloc_malloc(a, 1000, NULL, MT_TAG_WEIGHTS, &x) != 0)
        _exit(13);
    for (int i = 0; i < 5; i++)
        if (mt_alloc_malloc(a, (size_t)1 << 30, NULL, MT_TAG_ACTIVATIONS, &x) != MT_ENOMEM)
            _exit(14);
    /* The message gives the bytes by tag and names the daemon's snapshot of this OOM. */
    char want[512];
    snprintf(want, sizeof want, "%s/oom-%d-dev0-5.pickle", getenv("MEMTRACE_OOM_DIR"),
             (int)getpid());
    const char *msg = mt_alloc_last_error(a);
    if (strstr(msg, "Allocated by tag: kv cache 20.00 MiB, activations 3.00 MiB, weights "
                    "1.00 KiB.") == NULL ||
        strstr(msg, want) == NULL) {
        fprintf(stderr, "OOM message: %s\n", msg);
        _exit(16);
    }
    mt_prof_flush(p);
    char c = 1;
    if (write(stop_fd, &c, 1) != 1)
        _exit(15);
    for (;;)
        pause();
}

static unsigned count_json(const char *dir)
{
    DIR *d = opendir(dir);
    unsigned n = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        n += l > 5 && strcmp(e->d_name + l - 5, ".json") == 0;
    }
    if (d != NULL)
        closedir(d);
    return n;
}

static void test_oom_and_live_snapshots(void **state)
{
    (void)state;
    char tmp[] = "/tmp/mt-test-oomsnap-XXXXXX";
    assert_non_null(mkdtemp(tmp));
    char oomdir[128], path[256], cmd[1024];
    snprintf(oomdir, sizeof oomdir, "%s/oom", tmp);

    th_daemon_t t;
    int threads_before = thread_count();
    mt_d_cfg_t cfg = th_cfg();
    cfg.oom_dir = oomdir;
    cfg.oom_max_snapshots = 3;
    cfg.oom_interval_ms = 0; /* every OOM: five in a row */
    th_daemon_start(&t, cfg);
    setenv("MEMTRACE_OOM_DIR", oomdir, 1); /* the recorder names the daemon's files by it */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", fds[1]);
    const char *const args[5] = {t.sock, fdarg, NULL};
    pid_t pid = th_spawn("oomer", args);
    close(fds[1]);
    char c;
    if (read(fds[0], &c, 1) != 1)
        fail_msg("the recording child failed: status %d", WEXITSTATUS(th_wait(pid)));
    close(fds[0]);

    /* The fifth OOM's snapshot, named as the allocator's message names it. */
    snprintf(path, sizeof path, "%s/oom-%d-dev0-5.pickle", oomdir, (int)pid);
    uint64_t until = th_now_ms() + 10000;
    while (access(path, R_OK) != 0 && th_now_ms() < until)
        usleep(10000);
    /* The pruning follows the .pickle: wait until it has run (five written, three kept). */
    for (until = th_now_ms() + 10000; count_json(oomdir) > 3 && th_now_ms() < until;)
        usleep(10000);
    mt_ts_t *ts = NULL;
    char err[768];
    if (mt__ts_read(&ts, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_true(ts->nsegments >= 2);
    assert_int_equal(ts->ndevices, 1);
    assert_int_equal(ts->events[ts->nevents - 1].action, MT_TS_OOM);
    assert_int_equal(ts->events[ts->nevents - 1].size, (uint64_t)1 << 30);
    assert_string_equal(ts->tag_label[MT_TAG_USER_FIRST], "kv cache");
    mt__ts_destroy(&ts);
    snprintf(path, sizeof path, "%s/oom-%d-dev0-5.json", oomdir, (int)pid);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "type")), "snapshot");
    assert_int_equal(json_integer_value(json_object_get(j, "pid")), pid);
    json_decref(j);
    /* Bounded: five OOMs, three snapshots kept; the directory is private. */
    assert_int_equal(count_json(oomdir), 3);
    struct stat st;
    assert_int_equal(stat(oomdir, &st), 0);
    assert_int_equal(st.st_mode & 077, 0);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 077, 0);

    /* memtrace snapshot PID: the live state now. */
    snprintf(cmd, sizeof cmd, "'%s' snapshot %d --socket '%s' -o '%s/now.pickle' 2>/dev/null",
             memtrace_exe, (int)pid, t.sock, tmp);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/now.pickle", tmp);
    if (mt__ts_read(&ts, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_true(ts->nsegments >= 2);
    assert_true(ts->nevents >= 8); /* segment allocs, allocs, the OOMs */
    size_t active = 0;
    for (size_t i = 0; i < ts->nblocks; i++)
        active += ts->blocks[i].state == MT_TS_ACTIVE_ALLOCATED;
    assert_int_equal(active, 3);
    mt__ts_destroy(&ts);
    snprintf(cmd, sizeof cmd, "'%s' snapshot 999999 --socket '%s' -o '%s/x.pickle' 2>/dev/null",
             memtrace_exe, t.sock, tmp);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);

    kill(pid, SIGKILL);
    th_wait(pid);
    th_daemon_stop(&t);
    /* The snapshots' writer was the daemon's: joined by its destroy, none left running. */
    assert_int_equal(thread_count(), threads_before);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    assert_int_equal(system(cmd), 0);
}

/* No daemon: the recorder writes the OOM snapshot itself, under the name the allocator's
 * message gives. */
static void test_recorder_oom_snapshot(void **state)
{
    (void)state;
    char tmp[] = "/tmp/mt-test-recoom-XXXXXX";
    assert_non_null(mkdtemp(tmp));
    char oomdir[128], logp[128], path[256], cmd[300];
    snprintf(oomdir, sizeof oomdir, "%s/oom", tmp);
    snprintf(logp, sizeof logp, "%s/run.ndjson", tmp);
    mt_prof_cfg_t pc = mt_prof_cfg_default();
    snprintf(pc.oom_dir, sizeof pc.oom_dir, "%s", oomdir);
    pc.oom_interval_ms = 0; /* every OOM: two in a row */
    pc.mode = MT_PROF_LOG;
    pc.log_path = logp;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &pc), 0);
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = (size_t)64 << 20;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    assert_int_equal(mt_alloc_cfg_parse(&ac, "rules:reference", NULL, 0), 0); /* as above */
    ac.backend = b;
    ac.sink = mt_prof_sink(p);
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &ac), 0);
    int kv;
    void *x, *y;
    assert_int_equal(mt_alloc_tag_register(a, "kv cache", &kv), 0);
    assert_int_equal(mt_alloc_malloc(a, 20 << 20, NULL, kv, &x), 0);
    assert_int_equal(mt_alloc_malloc(a, 5000, NULL, MT_TAG_WEIGHTS, &y), 0);
    assert_int_equal(mt_alloc_free(a, y), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(mt_alloc_malloc(a, (size_t)1 << 30, NULL, MT_TAG_ACTIVATIONS, &y),
                         MT_ENOMEM);
    snprintf(path, sizeof path, "%s/oom-%d-dev0-2.pickle", oomdir, (int)getpid());
    const char *msg = mt_alloc_last_error(a);
    if (strstr(msg, "(by the recorder)") == NULL || strstr(msg, path) == NULL ||
        strstr(msg, "Allocated by tag: kv cache 20.00 MiB.") == NULL)
        fail_msg("OOM message: %s", msg);
    assert_int_equal(mt_prof_flush(p), 0); /* the drainer has followed every event */
    mt_ts_t *ts = NULL;
    char err[768];
    if (mt__ts_read(&ts, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_true(ts->nsegments >= 1);
    assert_int_equal(ts->events[ts->nevents - 1].action, MT_TS_OOM);
    size_t active = 0;
    for (size_t i = 0; i < ts->nblocks; i++)
        active += ts->blocks[i].state == MT_TS_ACTIVE_ALLOCATED;
    assert_int_equal(active, 1);
    assert_string_equal(ts->tag_label[MT_TAG_USER_FIRST], "kv cache");
    mt__ts_destroy(&ts);
    snprintf(path, sizeof path, "%s/oom-%d-dev0-2.json", oomdir, (int)getpid());
    json_t *j = json_load_file(path, 0, NULL);
    assert_non_null(j);
    assert_true(json_array_size(json_object_get(j, "events")) >= 5);
    json_decref(j);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    mt_prof_destroy(&p);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    assert_int_equal(system(cmd), 0);
}

/* A snapshot file appears whole: nothing is ever written under its final name (a reader
 * watching the directory, as the tests above do, would open it half-written), an existing
 * one is never replaced, and nothing else is left in the directory. */
static void test_snapshot_file_appears_whole(void **state)
{
    (void)state;
    char dir[] = "/tmp/mt-snapw-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    int dfd;
    assert_int_equal(mt__oomsnap_dir_open(dir, &dfd), 0);
    snprintf(path, sizeof path, "%s/oom-1-dev0-1.json", dir);
    int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    assert_true(in >= 0);
    assert_true(inotify_add_watch(in, dir, IN_MODIFY | IN_CLOSE_WRITE | IN_CREATE) >= 0);
    size_t n = 4u << 20;
    char *data = malloc(n);
    assert_non_null(data);
    for (size_t i = 0; i < n; i++)
        data[i] = (char)('a' + i % 26);
    assert_int_equal(mt__oomsnap_write_at(dfd, "oom-1-dev0-1.json", data, n), 0);
    char buf[65536] __attribute__((aligned(8)));
    unsigned created = 0, written_final = 0;
    ssize_t r;
    while ((r = read(in, buf, sizeof buf)) > 0)
        for (char *q = buf; q < buf + r;) {
            const struct inotify_event *e = (const struct inotify_event *)q;
            if (e->len > 0 && strcmp(e->name, "oom-1-dev0-1.json") == 0) {
                created += (e->mask & IN_CREATE) != 0;
                written_final += (e->mask & (IN_MODIFY | IN_CLOSE_WRITE)) != 0;
            }
            q += sizeof *e + e->len;
        }
    close(in);
    assert_int_equal(created, 1);
    assert_int_equal(written_final, 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal((size_t)st.st_size, n);
    assert_int_equal(st.st_mode & 0777, 0600);
    /* never over an existing file: it keeps its content */
    assert_int_equal(mt__oomsnap_write_at(dfd, "oom-1-dev0-1.json", "x", 1), MT_EBUSY);
    close(dfd);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal((size_t)st.st_size, n);
    unsigned entries = 0;
    DIR *dh = opendir(dir);
    assert_non_null(dh);
    for (struct dirent *e; (e = readdir(dh)) != NULL;)
        entries += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(dh);
    assert_int_equal(entries, 1);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
    free(data);
}

int main(int argc, char **argv)
{
    char **args;
    const char *role = th_role(argc, argv, &args);
    if (role != NULL && strcmp(role, "oomer") == 0)
        oomer_body(args[0], atoi(args[1]));
    if (argc < 2) {
        fprintf(stderr, "usage: test_daemon_snapshot MEMTRACE\n");
        return 2;
    }
    memtrace_exe = argv[1];
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_oom_and_live_snapshots),
                                       cmocka_unit_test(test_recorder_oom_snapshot),
                                       cmocka_unit_test(test_snapshot_file_appears_whole)};
    return MT_TEST_RUN(tests, NULL, NULL);
}
