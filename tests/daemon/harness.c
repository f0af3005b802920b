#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "memtrace/prof.h"
#include "tests/daemon/harness.h"

uint64_t th_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

mt_d_cfg_t th_cfg(void)
{
    mt_d_cfg_t cfg = mt__d_cfg_default();
    cfg.idle_timeout_ms = 300;
    cfg.keepalive_ms = 200;
    cfg.http_token = TH_TOKEN;
    cfg.oom_dir = "off"; /* tests never write OOM snapshots into $HOME */
    return cfg;
}

static void *run_thread(void *arg)
{
    th_daemon_t *t = arg;
    mt__d_run(t->d);
    return NULL;
}

void th_daemon_start(th_daemon_t *t, mt_d_cfg_t cfg)
{
    th_daemon_create(t, cfg);
    th_daemon_run(t);
}

void th_daemon_create(th_daemon_t *t, mt_d_cfg_t cfg)
{
    snprintf(t->dir, sizeof t->dir, "/tmp/mt-dtest-XXXXXX");
    assert_non_null(mkdtemp(t->dir));
    snprintf(t->sock, sizeof t->sock, "%s/d.sock", t->dir);
    assert_int_equal(uv_loop_init(&t->loop), 0);
    cfg.socket_path = t->sock;
    cfg.http_port = 0;
    cfg.loop = &t->loop;
    assert_int_equal(mt__d_create(&t->d, &cfg), 0);
    t->port = mt__d_http_port(t->d);
    assert_true(t->port > 0);
    struct stat st;
    assert_int_equal(stat(t->sock, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
}

void th_daemon_run(th_daemon_t *t)
{
    assert_int_equal(pthread_create(&t->thread, NULL, run_thread, t), 0);
}

void th_daemon_stop(th_daemon_t *t)
{
    mt__d_stop(t->d);
    assert_int_equal(pthread_join(t->thread, NULL), 0);
    mt__d_destroy(&t->d);
    assert_null(t->d);
    assert_int_equal(uv_loop_close(&t->loop), 0);
    assert_int_equal(access(t->sock, F_OK), -1);
    /* The daemon keeps its token file for its next start; the test's directory goes. */
    char tok[sizeof t->sock + 8];
    snprintf(tok, sizeof tok, "%s.token", t->sock);
    unlink(tok);
    if (rmdir(t->dir) != 0)
        fail_msg("cannot remove the test daemon's directory %s: %s", t->dir, strerror(errno));
}

pid_t th_daemon_child(const char *sock, const char *log)
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
        cfg.log_path = log;
        cfg.loop = &loop;
        cfg.handle_signals = true;
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

/* The producer's body, in a process of its own (see th_producer). */
static void producer_body(const char *sock, unsigned n, unsigned slots, unsigned burst, int stop_fd)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.slots = slots;
    cfg.name = "th-producer";
    mt_prof_t *p = NULL;
    if (mt_prof_create(&p, &cfg) != 0)
        _exit(10);
    uint64_t allocated = 0;
    for (unsigned i = 0; i < n; i++) {
        mt_event_rec_t ev = {0};
        uint64_t addr = 0x10000000u + (uint64_t)(i / 2) * 4096;
        ev.addr = addr;
        ev.size = 4096;
        ev.requested = 4000;
        ev.tag = (uint8_t)((i / 2) % 7);
        ev.pool = MT_POOL_SMALL;
        if (i % 2 == 0) {
            ev.kind = MT_EV_ALLOC;
            allocated += 4096;
        } else {
            ev.kind = MT_EV_FREE_COMPLETED;
            allocated -= 4096;
        }
        ev.allocated = allocated;
        ev.reserved = 2u << 20;
        if (mt_prof_record(p, &ev) != 0)
            _exit(11); /* the ring is sized so that this cannot happen */
        if (burst && (i + 1) % burst == 0)
            usleep(1000);
    }
    if (stop_fd >= 0) {
        char c = 1;
        if (write(stop_fd, &c, 1) != 1)
            _exit(12);
        for (;;)
            pause();
    }
    mt_prof_destroy(&p);
    _exit(0);
}

#define ROLE_ARG "--th-role"

/* The child execs this test binary again: after fork, a process whose parent runs other
 * threads (the in-process daemon) may only call async-signal-safe functions, and the
 * profiler starts a thread, which under ASan can hang on an allocator lock held by one of
 * those threads at the fork. */
pid_t th_spawn(const char *role, const char *const args[5])
{
    char *argv[9] = {"th-child", ROLE_ARG, (char *)role};
    for (int i = 0; i < 5 && args != NULL && args[i] != NULL; i++)
        argv[3 + i] = (char *)args[i];
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid > 0)
        return pid;
    execv("/proc/self/exe", argv);
    _exit(13);
}

int th_prof_open(const char *sock, const char *name, mt_prof_t **out)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.name = name;
    return mt_prof_create(out, &cfg);
}

const char *th_role(int argc, char **argv, char ***args)
{
    if (argc < 3 || strcmp(argv[1], ROLE_ARG) != 0)
        return NULL;
    *args = argv + 3;
    return argv[2];
}

pid_t th_producer(const char *sock, unsigned n, unsigned slots, unsigned burst, int stop_fd)
{
    char a[4][24];
    snprintf(a[0], sizeof a[0], "%u", n);
    snprintf(a[1], sizeof a[1], "%u", slots);
    snprintf(a[2], sizeof a[2], "%u", burst);
    snprintf(a[3], sizeof a[3], "%d", stop_fd);
    const char *const args[5] = {sock, a[0], a[1], a[2], a[3]};
    return th_spawn("producer", args);
}

void th_producer_dispatch(int argc, char **argv)
{
    char **a;
    const char *role = th_role(argc, argv, &a);
    if (role == NULL || strcmp(role, "producer") != 0 || argc != 8)
        return;
    producer_body(a[0], (unsigned)strtoul(a[1], NULL, 10), (unsigned)strtoul(a[2], NULL, 10),
                  (unsigned)strtoul(a[3], NULL, 10), atoi(a[4]));
}

int th_wait(pid_t pid)
{
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return st;
}

int th_wait_within(pid_t pid, int timeout_ms, const char *what)
{
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    int st = 0;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return st;
        if (r < 0 && errno != EINTR)
            fail_msg("waitpid on %s (pid %d): %s", what, (int)pid, strerror(errno));
        if (r == 0 && th_now_ms() >= deadline) {
            kill(pid, SIGKILL);
            th_wait(pid);
            fail_msg("%s (pid %d) still running after %d ms: killed", what, (int)pid, timeout_ms);
        }
        usleep(10000);
    }
}

int th_consumer(const char *sock, const char *filter)
{
    int fd;
    assert_int_equal(mt__d_client_connect(sock, &fd), 0);
    char req[512];
    int n = snprintf(req, sizeof req, "{\"type\":\"subscribe\",\"role\":\"consumer\"%s%s}\n",
                     filter && *filter ? "," : "", filter ? filter : "");
    assert_int_equal(mt__d_client_send(fd, req, (size_t)n), 0);
    /* The answer line, byte by byte: what follows belongs to th_consume. */
    char line[256];
    size_t len = 0;
    while (len < sizeof line - 1) {
        ssize_t r = recv(fd, &line[len], 1, 0);
        assert_true(r == 1);
        if (line[len] == '\n')
            break;
        len++;
    }
    line[len] = '\0';
    assert_string_equal(line, "{\"ok\":true}");
    return fd;
}

/* Classifies one line without a JSON parser: consumers must keep up with the daemon in
 * these tests, and a parse per line would make the reader the bottleneck. The shape is
 * still checked: one object per line, with a type. */
static void count_line(th_count_t *c, const char *line, size_t len)
{
    if (len < 2 || line[0] != '{' || line[len - 1] != '}' || memchr(line, '\n', len)) {
        c->bad_line = true;
        return;
    }
    char tmp[1024];
    size_t n = len < sizeof tmp - 1 ? len : sizeof tmp - 1;
    memcpy(tmp, line, n);
    tmp[n] = '\0';
    const char *pidp = strstr(tmp, "\"pid\":");
    int pid = pidp ? atoi(pidp + 6) : 0;
    if (strstr(tmp, "\"type\":\"event\"")) {
        c->events++;
        unsigned i = 0;
        while (i < c->npids && c->pids[i] != pid)
            i++;
        if (i == c->npids && c->npids < 16)
            c->pids[c->npids++] = pid;
        if (i < 16)
            c->per_pid[i]++;
    } else if (strstr(tmp, "\"type\":\"gap\"")) {
        const char *l = strstr(tmp, "\"lost\":");
        c->gaps++;
        c->lost += l ? strtoull(l + 7, NULL, 10) : 0;
    } else {
        c->bad_line = true;
    }
}

void th_consume(int fd, uint64_t want, int timeout_ms, th_count_t *c)
{
    enum { CAP = 1 << 16 };
    char *buf = malloc(CAP), *line = malloc(CAP); /* per call: readers run in threads */
    assert_non_null(buf);
    assert_non_null(line);
    size_t llen = 0;
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    while (c->events + c->lost < want && th_now_ms() < deadline) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 50) <= 0)
            continue;
        ssize_t r = recv(fd, buf, CAP, 0);
        if (r <= 0)
            break;
        for (ssize_t i = 0; i < r; i++) {
            if (buf[i] == '\n') {
                count_line(c, line, llen);
                llen = 0;
            } else if (llen < CAP) {
                line[llen++] = buf[i];
            }
        }
    }
    free(buf);
    free(line);
}

uint64_t th_count_of(const th_count_t *c, int pid)
{
    for (unsigned i = 0; i < c->npids; i++)
        if (c->pids[i] == pid)
            return c->per_pid[i];
    return 0;
}

int th_http_raw(int port, const char *request, size_t len, char **out)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    if (len)
        assert_int_equal(mt__d_client_send(fd, request, len), 0);
    char *resp = NULL;
    int rc = mt__d_client_read_all(fd, 64u << 20, 5000, &resp, NULL);
    close(fd);
    assert_int_equal(rc, 0);
    int status = 0;
    sscanf(resp, "HTTP/1.1 %d", &status);
    *out = resp;
    return status;
}

int th_http_get(int port, const char *path, char **out)
{
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\n" TH_HDRS "\r\n", path);
    return th_http_raw(port, req, (size_t)n, out);
}

const char *th_http_body(const char *resp)
{
    const char *b = strstr(resp, "\r\n\r\n");
    return b ? b + 4 : "";
}

void *th_state(const char *sock)
{
    char *s = NULL;
    assert_int_equal(mt__d_client_state(sock, 5000, &s), 0);
    json_error_t err;
    json_t *st = json_loads(s, 0, &err);
    free(s);
    assert_non_null(st);
    return st;
}

void *th_wait_exited(const char *sock, int pid, int timeout_ms)
{
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    do {
        json_t *st = th_state(sock);
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(st, "processes"), i, p)
        {
            if (json_integer_value(json_object_get(p, "pid")) == pid &&
                strcmp(json_string_value(json_object_get(p, "state")), "exited") == 0) {
                json_incref(p);
                json_decref(st);
                return p;
            }
        }
        json_decref(st);
        usleep(20000);
    } while (th_now_ms() < deadline);
    return NULL;
}
