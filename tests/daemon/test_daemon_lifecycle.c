/* Daemon lifecycle: SIGTERM shutdown in a process of its own, stale and busy socket
 * paths, eviction of exited processes, the NDJSON log file. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "profiler/internal.h"
#include "profiler/ring.h"
#include "tests/daemon/harness.h"
#include "tests/common/test_main.h"

static void make_dir(char *dir, size_t n)
{
    snprintf(dir, n, "/tmp/mt-dtest-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

/* The daemon in a child, with its signal handling on: SIGTERM stops it cleanly (the
 * child exits 0 only if mt__d_run returned and uv_loop_close succeeded) and the socket
 * file is removed. */
static void test_sigterm_clean_shutdown(void **state)
{
    char dir[64], sock[100];
    make_dir(dir, sizeof dir);
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    pid_t pid = th_daemon_child(sock, NULL);
    /* A subscriber and a half-open connection must not hold the shutdown up. */
    int fd = th_consumer(sock, "");
    int idle;
    assert_int_equal(mt__d_client_connect(sock, &idle), 0);
    assert_int_equal(access(sock, F_OK), 0);
    assert_int_equal(kill(pid, SIGTERM), 0);
    int st = th_wait(pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_int_equal(access(sock, F_OK), -1);
    char buf[16];
    assert_int_equal(recv(fd, buf, sizeof buf, 0), 0); /* the subscriber saw EOF */
    close(fd);
    close(idle);
    rmdir(dir);
}

static void test_stale_and_busy_socket(void **state)
{
    th_daemon_t t;
    char dir[64], sock[100];
    make_dir(dir, sizeof dir);
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    /* A stale socket file: bound, never listened on, its owner gone. */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd);
    assert_int_equal(access(sock, F_OK), 0);

    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    mt_d_cfg_t cfg = th_cfg();
    cfg.socket_path = sock;
    cfg.http_port = -1;
    cfg.loop = &loop;
    mt_d_t *d = NULL;
    assert_int_equal(mt__d_create(&d, &cfg), 0); /* the stale file was replaced */
    assert_int_equal(mt__d_http_port(d), -1);
    mt__d_destroy(&d);
    assert_int_equal(uv_loop_close(&loop), 0);
    assert_int_equal(access(sock, F_OK), -1);

    /* A live daemon on the path: a second one refuses, and the first keeps working. */
    th_daemon_start(&t, th_cfg());
    assert_int_equal(uv_loop_init(&loop), 0);
    cfg.socket_path = t.sock;
    assert_int_equal(mt__d_create(&d, &cfg), MT_EBUSY);
    assert_null(d);
    assert_int_equal(uv_loop_close(&loop), 0);
    json_t *st = th_state(t.sock);
    assert_non_null(json_object_get(st, "processes"));
    json_decref(st);
    th_daemon_stop(&t);

    /* Something that is not a socket is never removed. */
    FILE *f = fopen(sock, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(uv_loop_init(&loop), 0);
    cfg.socket_path = sock;
    assert_int_equal(mt__d_create(&d, &cfg), MT_EBUSY);
    assert_int_equal(uv_loop_close(&loop), 0);
    assert_int_equal(access(sock, F_OK), 0);
    unlink(sock);
    rmdir(dir);
}

static void test_eviction_and_log(void **state)
{
    char log[128];
    snprintf(log, sizeof log, "/tmp/mt-dtest-log-%d.ndjson", (int)getpid());
    unlink(log);
    mt_d_cfg_t cfg = th_cfg();
    cfg.max_exited = 2;
    cfg.log_path = log;
    th_daemon_t t;
    th_daemon_start(&t, cfg);
    pid_t pids[4];
    for (int i = 0; i < 4; i++) {
        pids[i] = th_producer(t.sock, 50, 64, 0, -1);
        assert_int_equal(th_wait(pids[i]), 0);
        json_t *p = th_wait_exited(t.sock, pids[i], 5000);
        assert_non_null(p);
        json_decref(p);
    }
    json_t *st = th_state(t.sock);
    json_t *procs = json_object_get(st, "processes");
    assert_int_equal(json_array_size(procs), 2); /* the two oldest were evicted */
    assert_int_equal(json_integer_value(json_object_get(json_array_get(procs, 0), "pid")), pids[2]);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(procs, 1), "pid")), pids[3]);
    json_decref(st);
    th_daemon_stop(&t);

    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char line[2048];
    unsigned events = 0, registers = 0, exits = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        assert_non_null(o);
        const char *type = json_string_value(json_object_get(o, "type"));
        const char *ev = json_string_value(json_object_get(o, "event"));
        events += strcmp(type, "event") == 0;
        registers += strcmp(type, "process_event") == 0 && strcmp(ev, "register") == 0;
        exits += strcmp(type, "process_event") == 0 && strcmp(ev, "exit") == 0;
        json_decref(o);
    }
    fclose(f);
    unlink(log);
    assert_int_equal(events, 4 * 50);
    assert_int_equal(registers, 4);
    assert_int_equal(exits, 4);
}

static void test_cfg_validation(void **state)
{
    mt_d_cfg_t cfg = th_cfg();
    mt_d_t *d = NULL;
    cfg.http_port = 70000;
    assert_int_equal(mt__d_create(&d, &cfg), MT_EINVAL);
    cfg = th_cfg();
    cfg.drain_interval_ms = 0;
    assert_int_equal(mt__d_create(&d, &cfg), MT_EINVAL);
    cfg = th_cfg();
    cfg.socket_path = "/tmp/a-socket-path-that-is-far-too-long-for-sun_path-xxxxxxxxxxxxxxxxxxxxxxx"
                      "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx.sock";
    cfg.http_port = -1;
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    cfg.loop = &loop;
    assert_int_equal(mt__d_create(&d, &cfg), MT_EINVAL);
    assert_null(d);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* mt__d_create reads no environment: the socket and OOM settings the variables name reach it
 * through mt__d_cfg_from_env, which the executables call (docs/process-state.md). */
static void test_env_only_through_cfg(void **state)
{
    char dir[64], env_sock[96], cfg_sock[96];
    make_dir(dir, sizeof dir);
    snprintf(env_sock, sizeof env_sock, "%s/env.sock", dir);
    snprintf(cfg_sock, sizeof cfg_sock, "%s/cfg.sock", dir);
    setenv("MEMTRACE_SOCKET", env_sock, 1);
    setenv("MEMTRACE_OOM_DIR", dir, 1);
    setenv("MEMTRACE_OOM_INTERVAL_MS", "250", 1);
    mt_d_cfg_t cfg = mt__d_cfg_default();
    assert_string_equal(cfg.default_socket, "");
    assert_string_equal(cfg.default_oom_dir, "");
    assert_int_equal(cfg.oom_interval_ms, -1);
    /* A default socket of the cfg's, the variable set: create takes the cfg's. */
    snprintf(cfg.default_socket, sizeof cfg.default_socket, "%s", cfg_sock);
    cfg.http_port = -1;
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    cfg.loop = &loop;
    mt_d_t *d = NULL;
    assert_int_equal(mt__d_create(&d, &cfg), 0);
    assert_string_equal(mt__d_socket_path(d), cfg_sock);
    assert_int_equal(access(env_sock, F_OK), -1);
    mt__d_destroy(&d);
    assert_int_equal(uv_loop_close(&loop), 0);
    /* The executables' edge: the variables into the cfg. */
    cfg = mt__d_cfg_default();
    assert_int_equal(mt__d_cfg_from_env(&cfg), 0);
    assert_string_equal(cfg.default_socket, env_sock);
    assert_string_equal(cfg.default_oom_dir, dir);
    assert_int_equal(cfg.oom_interval_ms, 250);
    cfg.oom_interval_ms = 0; /* a program's choice stays */
    assert_int_equal(mt__d_cfg_from_env(&cfg), 0);
    assert_int_equal(cfg.oom_interval_ms, 0);
    setenv("MEMTRACE_OOM_DIR", "off", 1);
    assert_int_equal(mt__d_cfg_from_env(&cfg), 0);
    assert_string_equal(cfg.default_oom_dir, "");
    unsetenv("MEMTRACE_SOCKET");
    unsetenv("MEMTRACE_OOM_DIR");
    unsetenv("MEMTRACE_OOM_INTERVAL_MS");
    assert_int_equal(rmdir(dir), 0);
}

/* The daemon leaves the process's SIGPIPE disposition alone, and with the default one (a
 * SIGPIPE kills) consumers that hang up before their answer is written cost it nothing:
 * each write fails with EPIPE in the loop's thread, where SIGPIPE is blocked and drained. */
static void test_sigpipe_left_alone(void **state)
{
    struct sigaction dfl = {.sa_handler = SIG_DFL}, before, after;
    sigemptyset(&dfl.sa_mask);
    assert_int_equal(sigaction(SIGPIPE, &dfl, &before), 0);
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    assert_int_equal(sigaction(SIGPIPE, NULL, &after), 0);
    assert_ptr_equal(after.sa_handler, SIG_DFL);
    static const char req[] = "{\"type\":\"state\"}\n";
    for (int i = 0; i < 50; i++) {
        int fd;
        assert_int_equal(mt__d_client_connect(t.sock, &fd), 0);
        assert_int_equal(mt__d_client_send(fd, req, sizeof req - 1), 0);
        close(fd); /* before the answer: the daemon's write meets a closed peer */
    }
    json_t *st = th_state(t.sock); /* still alive and answering */
    assert_non_null(json_object_get(st, "processes"));
    json_decref(st);
    th_daemon_stop(&t);
    assert_int_equal(sigaction(SIGPIPE, NULL, &after), 0);
    assert_ptr_equal(after.sa_handler, SIG_DFL);
    sigset_t pending;
    assert_int_equal(sigpending(&pending), 0);
    assert_int_equal(sigismember(&pending, SIGPIPE), 0);
    assert_int_equal(sigaction(SIGPIPE, &before, NULL), 0);
}

/* A user tag's name in the log changes exactly at its label, with the lines encoded by
 * the daemon's encoder thread a batch behind the drain: the lines before a label (in the
 * same batch, drained in one tick) keep the name they had. */
static void test_label_names_in_order(void **state)
{
    (void)state;
    enum { N = 5000, TAG = MT_TAG_USER_FIRST + 2, FIRST = 1500, SECOND = 3700 };
    char log[128];
    snprintf(log, sizeof log, "/tmp/mt-dtest-labels-%d.ndjson", (int)getpid());
    unlink(log);
    mt_d_cfg_t cfg = th_cfg();
    cfg.log_path = log;
    th_daemon_t t;
    th_daemon_start(&t, cfg);
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 8192, "labels"), 0);
    static const char *want[N]; /* the name of each alloc line, in order */
    unsigned nwant = 0;
    for (unsigned i = 0; i < N; i++) {
        mt_event_rec_t ev = {.pool = 1, .tag = TAG, .time_ns = 1000 + i};
        if (i == FIRST || i == SECOND) {
            ev.kind = MT_EV_TAG_LABEL;
            mt_event_label_pack(&ev, i == FIRST ? "first" : "second");
        } else {
            ev.kind = i % 2 ? MT_EV_FREE_COMPLETED : MT_EV_ALLOC;
            ev.addr = 0x7f0000000000u + (uint64_t)(i / 2) * 4096;
            ev.size = ev.requested = 4096;
            if (ev.kind == MT_EV_ALLOC)
                want[nwant++] = i < FIRST ? "tag9" : i < SECOND ? "first" : "second";
        }
        assert_int_equal(mt__ring_push(r, &ev), 0);
    }
    /* registered once full: the daemon drains them in one go, batch after batch */
    int fd = -1;
    char err[256];
    assert_int_equal(mt__prof_client_register(t.sock, r, NULL, 5000, &fd, err, sizeof err), 0);
    const mt__ring_hdr_t *h = mt__ring_header(r);
    for (int i = 0; i < 5000 && atomic_load(&h->read_idx) < N; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&h->read_idx), N);
    close(fd);
    th_daemon_stop(&t);
    mt__ring_close(&r);

    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char line[2048];
    unsigned seen = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        assert_non_null(o);
        const char *kind = json_string_value(json_object_get(o, "kind"));
        const char *tag = json_string_value(json_object_get(o, "tag"));
        if (kind && tag && strcmp(kind, "alloc") == 0)
            bad += seen >= nwant || strcmp(tag, want[seen++]) != 0;
        json_decref(o);
    }
    fclose(f);
    unlink(log);
    assert_int_equal(seen, nwant);
    assert_int_equal(bad, 0);
}

int main(int argc, char **argv)
{
    th_producer_dispatch(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigterm_clean_shutdown), cmocka_unit_test(test_stale_and_busy_socket),
        cmocka_unit_test(test_eviction_and_log),       cmocka_unit_test(test_label_names_in_order),
        cmocka_unit_test(test_cfg_validation),         cmocka_unit_test(test_sigpipe_left_alone),
        cmocka_unit_test(test_env_only_through_cfg),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
