/* Hostile HTTP and socket clients against the daemon: the
 * token and Host checks on every route, the token file, the log's mode, slowloris, the
 * connection caps, consumers that never read, bare-LF request lines, a taken port. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "memtrace/prof.h"
#include "tests/daemon/harness.h"
#include "tests/security/common.h"
#include "tests/common/test_main.h"

static int get(int port, const char *path, const char *headers, char **out)
{
    char req[512];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\n%s\r\n", path, headers);
    return th_http_raw(port, req, (size_t)n, out);
}

#define HOST   "Host: 127.0.0.1\r\n"
#define BEARER "Authorization: Bearer " TH_TOKEN "\r\n"

static void expect(int port, const char *path, const char *headers, int status)
{
    char *r = NULL;
    int got = get(port, path, headers, &r);
    if (got != status)
        fail_msg("GET %s with [%s]: %d, expected %d: %.200s", path, headers, got, status, r);
    free(r);
}

static void test_token_on_every_route(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    const char *routes[] = {"/state",          "/metrics", "/events",      "/nope",
                            "/state?x=1",      "/history", "/map?pid=1",   "/tail?pid=1",
                            "/index.html.bak", "/app.jsx", "/vendor/nope", "/callsites"};
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        expect(t.port, routes[i], HOST, 401);
        expect(t.port, routes[i], HOST "Authorization: Bearer 0123456789abcdef0123456789abcdeX\r\n",
               401);
        expect(t.port, routes[i], HOST "Cookie: memtrace_token=nope\r\n", 401);
        /* a cookie, even with the right token, is no credential: none is ever set */
        expect(t.port, routes[i], HOST "Cookie: memtrace_token=" TH_TOKEN "\r\n", 401);
    }
    expect(t.port, "/healthz", HOST, 200); /* open: it says nothing */
    /* the page's static files are open (a navigation to #token=... carries no token), and
     * still behind the Host check */
    expect(t.port, "/", HOST, 200);
    expect(t.port, "/index.html", HOST, 200);
    expect(t.port, "/app.js", HOST, 200);
    expect(t.port, "/app.js?v=1", HOST, 200);
    expect(t.port, "/", "Host: evil.example\r\n", 403);
    expect(t.port, "/state", HOST BEARER, 200);
    expect(t.port, "/state", HOST "authorization: bearer " TH_TOKEN "\r\n", 200);
    /* No answer sets a cookie: a cookie for localhost goes to every port of it. */
    const char *asks[][2] = {{"/state?token=" TH_TOKEN, HOST},
                             {"/state", HOST BEARER},
                             {"/", HOST},
                             {"/?token=" TH_TOKEN, HOST},
                             {"/app.js", HOST BEARER},
                             {"/state", HOST},
                             {"/healthz", HOST}};
    for (size_t i = 0; i < sizeof asks / sizeof *asks; i++) {
        char *r = NULL;
        int status = get(t.port, asks[i][0], asks[i][1], &r);
        assert_true(status == 200 || status == 401);
        if (r && strcasestr(r, "\nSet-Cookie:") != NULL)
            fail_msg("GET %s sets a cookie: %.300s", asks[i][0], r);
        free(r);
    }
    expect(t.port, "/state?token=" TH_TOKEN, HOST, 200);
    /* the token is taken out of the query before the filters read it */
    expect(t.port, "/events?token=" TH_TOKEN "&kind=bogus", HOST, 400);
    th_daemon_stop(&t);
}

static void test_metrics_open(void **state)
{
    (void)state;
    th_daemon_t t;
    mt_d_cfg_t cfg = th_cfg();
    cfg.metrics_open = true;
    th_daemon_start(&t, cfg);
    expect(t.port, "/metrics", HOST, 200);
    expect(t.port, "/state", HOST, 401);
    expect(t.port, "/events", HOST, 401);
    th_daemon_stop(&t);
}

static void test_host_check(void **state)
{
    (void)state;
    th_daemon_t t;
    mt_d_cfg_t cfg = th_cfg();
    cfg.http_name = "box.lan";
    th_daemon_start(&t, cfg);
    expect(t.port, "/state", "Host: evil.example\r\n" BEARER, 403);
    expect(t.port, "/state", "Host: evil.example:9477\r\n" BEARER, 403);
    expect(t.port, "/healthz", "Host: localhost.evil.example\r\n", 403);
    expect(t.port, "/state", "Host: 127.0.0.1.nip.io\r\n" BEARER, 403);
    expect(t.port, "/state", BEARER, 403); /* HTTP/1.1 without Host */
    expect(t.port, "/state", "Host: localhost\r\nHost: evil\r\n" BEARER, 400);
    expect(t.port, "/state", "Host: localhost:9477\r\n" BEARER, 200);
    expect(t.port, "/state", "Host: LOCALHOST\r\n" BEARER, 200);
    expect(t.port, "/state", "Host: [::1]:80\r\n" BEARER, 200);
    expect(t.port, "/state", "Host: box.lan:9477\r\n" BEARER, 200);
    th_daemon_stop(&t);
}

/* Without a configured token, the daemon makes one in <socket>.token, 0600, and keeps it. */
static void test_token_file(void **state)
{
    (void)state;
    th_daemon_t t;
    mt_d_cfg_t cfg = th_cfg();
    cfg.http_token = NULL;
    mode_t old = umask(0);
    th_daemon_start(&t, cfg);
    umask(old);
    char path[200], tok[40];
    assert_int_equal(mt__d_token_path(t.sock, path, sizeof path), 0);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(mt__d_client_token(t.sock, tok, sizeof tok), 0);
    assert_int_equal(strlen(tok), 32);
    assert_string_equal(tok, mt__d_http_token(t.d));
    char hdr[160];
    snprintf(hdr, sizeof hdr, HOST "Authorization: Bearer %s\r\n", tok);
    expect(t.port, "/state", hdr, 200);
    expect(t.port, "/state", HOST BEARER, 401);
    /* a token file others may read is not trusted by the client */
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(mt__d_client_token(t.sock, tok, sizeof tok), -EPERM);
    th_daemon_stop(&t);
    unlink(path);
    rmdir(t.dir);
}

static void test_daemon_log_private(void **state)
{
    (void)state;
    char dir[] = "/tmp/mt-seclog-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char log[128], target[128], link[128];
    snprintf(log, sizeof log, "%s/d.ndjson", dir);
    snprintf(target, sizeof target, "%s/target", dir);
    snprintf(link, sizeof link, "%s/link.ndjson", dir);
    th_daemon_t t;
    mt_d_cfg_t cfg = th_cfg();
    cfg.log_path = log;
    mode_t old = umask(022);
    th_daemon_start(&t, cfg);
    umask(old);
    th_daemon_stop(&t);
    struct stat st;
    assert_int_equal(stat(log, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    /* a symlink as --log: refused, the target untouched */
    FILE *f = fopen(target, "w");
    fputs("keep\n", f);
    fclose(f);
    assert_int_equal(symlink(target, link), 0);
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    cfg = th_cfg();
    char sock[128];
    snprintf(sock, sizeof sock, "%s/s.sock", dir);
    cfg.socket_path = sock;
    cfg.http_port = -1;
    cfg.log_path = link;
    cfg.loop = &loop;
    mt_d_t *d = NULL;
    assert_int_equal(mt__d_create(&d, &cfg), -EPERM);
    assert_int_equal(uv_loop_close(&loop), 0);
    assert_int_equal(stat(target, &st), 0);
    assert_int_equal(st.st_size, 5);
    unlink(link);
    unlink(target);
    unlink(log);
    rmdir(dir);
}

static void test_bare_lf(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    char *r = NULL;
    static const char lf[] = "GET /healthz HTTP/1.1\nHost: localhost\n\n";
    assert_int_equal(th_http_raw(t.port, lf, sizeof lf - 1, &r), 200);
    free(r);
    static const char lf2[] = "GET /state HTTP/1.0\nAuthorization: Bearer " TH_TOKEN "\n\n";
    assert_int_equal(th_http_raw(t.port, lf2, sizeof lf2 - 1, &r), 200);
    free(r);
    th_daemon_stop(&t);
}

static int tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

/* 1 if the daemon closed fd (EOF or reset) within ms, 0 if it is still open. */
static int closed_within(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, ms) <= 0)
        return 0;
    char b[256];
    return recv(fd, b, sizeof b, MSG_DONTWAIT) <= 0;
}

/* One byte every 100 ms restarts the idle timer (300 ms) forever; the head deadline does not
 * move. */
static void test_slowloris(void **state)
{
    (void)state;
    th_daemon_t t;
    mt_d_cfg_t cfg = th_cfg();
    cfg.head_timeout_ms = 800;
    th_daemon_start(&t, cfg);
    int fd = tcp_connect(t.port);
    const char *req = "GET /healthz HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    int closed = 0;
    for (int i = 0; req[i] && !closed; i++) {
        if (send(fd, req + i, 1, MSG_NOSIGNAL) != 1) {
            closed = 1;
            break;
        }
        closed = closed_within(fd, 100);
    }
    close(fd);
    assert_true(closed); /* 40 bytes = 4 s of trickling: closed after 0.8-1.8 s */
    th_daemon_stop(&t);
}

static void test_connection_caps(void **state)
{
    (void)state;
    th_daemon_t t;
    mt_d_cfg_t cfg = th_cfg();
    cfg.max_http_per_peer = 4;
    cfg.idle_timeout_ms = 5000;
    cfg.head_timeout_ms = 5000;
    th_daemon_start(&t, cfg);
    int fds[6];
    for (int i = 0; i < 6; i++)
        fds[i] = tcp_connect(t.port);
    int refused = 0;
    for (int i = 0; i < 6; i++)
        refused += closed_within(fds[i], 300);
    assert_int_equal(refused, 2);
    /* producers still get in while HTTP is full */
    pid_t pid = th_producer(t.sock, 100, 1024, 0, -1);
    assert_int_equal(th_wait(pid), 0);
    for (int i = 0; i < 6; i++)
        close(fds[i]);
    th_daemon_stop(&t);

    /* fds kept for producers: with a reserve larger than the limit, HTTP gets none */
    cfg = th_cfg();
    cfg.fd_reserve = 1u << 30;
    th_daemon_start(&t, cfg);
    int fd = tcp_connect(t.port);
    assert_int_equal(closed_within(fd, 1000), 1);
    close(fd);
    pid = th_producer(t.sock, 100, 1024, 0, -1);
    assert_int_equal(th_wait(pid), 0);
    th_daemon_stop(&t);
}

/* ---- another local user against the owner's HTTP access ---- */

/* Counts the daemon's lines about refused connections (it logs on its own thread). */
static _Atomic unsigned g_refusal_lines;

static void count_refusals(void *ud, mt_log_level_e level, const char *msg)
{
    (void)ud;
    (void)level;
    if (strstr(msg, "refused"))
        atomic_fetch_add(&g_refusal_lines, 1);
}

/* A TCP connection to 127.0.0.1:port, or -1 (the attacker does not assert). */
static int try_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* An authorised GET /state that does not assert: its status, 0 if refused. */
static int owner_get(int port)
{
    static const char req[] = "GET /state HTTP/1.1\r\n" HOST BEARER "\r\n";
    int fd = try_connect(port);
    if (fd < 0)
        return 0;
    char *resp = NULL;
    int status = 0;
    if (mt__d_client_send(fd, req, sizeof req - 1) == 0 &&
        mt__d_client_read_all(fd, 64u << 20, 5000, &resp, NULL) == 0)
        sscanf(resp, "HTTP/1.1 %d", &status);
    free(resp);
    close(fd);
    return status;
}

/* The attacker of test_other_user_lockout, as uid SEC_OTHER_UID: 16 idle connections,
 * each reopened as soon as the daemon closes it, and a connect loop, for ms. */
static int lockout_body(int port, int ms)
{
    if (setresgid(SEC_OTHER_UID, SEC_OTHER_UID, SEC_OTHER_UID) != 0 ||
        setresuid(SEC_OTHER_UID, SEC_OTHER_UID, SEC_OTHER_UID) != 0)
        return 2;
    int idle[16];
    for (int i = 0; i < 16; i++)
        idle[i] = try_connect(port);
    for (uint64_t end = th_now_ms() + (uint64_t)ms; th_now_ms() < end;) {
        for (int i = 0; i < 16; i++) {
            char b[64];
            if (idle[i] >= 0 && recv(idle[i], b, sizeof b, MSG_DONTWAIT) < 0 && errno == EAGAIN)
                continue; /* still open */
            if (idle[i] >= 0)
                close(idle[i]);
            idle[i] = try_connect(port);
        }
        for (int i = 0; i < 20; i++) {
            int fd = try_connect(port);
            if (fd >= 0)
                close(fd);
        }
        usleep(1000);
    }
    return 0;
}

/* Another local user holds 16 idle connections to the owner's daemon (the per-peer cap)
 * and loops connecting: every local user is 127.0.0.1, so a cap keyed on the address
 * locked the owner out (19 of 19 authorised requests failed) and the refusals wrote tens
 * of thousands of warnings. The owner's requests must all succeed, and the refusals must
 * cost a bounded number of lines. */
static void test_other_user_lockout(void **state)
{
    (void)state;
    if (!sec_can_switch_uid())
        skip();
    atomic_store(&g_refusal_lines, 0);
    th_daemon_t t;
    mt_d_cfg_t cfg = th_cfg();
    cfg.idle_timeout_ms = 5000; /* the defaults: idle connections live their 5 s */
    cfg.head_timeout_ms = 5000;
    cfg.log = count_refusals;
    th_daemon_start(&t, cfg);
    char port[16];
    snprintf(port, sizeof port, "%d", t.port);
    const char *const args[5] = {port, "4000"};
    pid_t pid = th_spawn("lockout", args);
    usleep(500 * 1000); /* its idle connections are in */
    int ok = 0, tried = 0;
    for (uint64_t end = th_now_ms() + 3000; th_now_ms() < end; usleep(100 * 1000)) {
        tried++;
        ok += owner_get(t.port) == 200;
    }
    int st = th_wait_within(pid, 20000, "the attacker");
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    th_daemon_stop(&t);
    unsigned lines = atomic_load(&g_refusal_lines);
    if (ok != tried || lines > 4)
        fail_msg("%d of %d authorised requests answered, %u lines about refusals", ok, tried,
                 lines);
}

/* Reads the head of the answer to a GET /events on fd: 200, the consumer was admitted. */
static void assert_admitted(int fd)
{
    char buf[256] = {0};
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 10000), 1);
    assert_true(recv(fd, buf, sizeof buf - 1, 0) > 0);
    assert_non_null(strstr(buf, "200 OK"));
}

/* Polls /state until the daemon counts n consumers (a closed one is released in the turn
 * of the loop that sees it close, before the next connection is accepted). */
static void wait_consumers(const char *sock, int n)
{
    int got = -1;
    for (uint64_t end = th_now_ms() + 10000; got != n && th_now_ms() < end; usleep(10000)) {
        json_t *st = th_state(sock);
        got = (int)json_integer_value(json_object_get(json_object_get(st, "daemon"), "consumers"));
        json_decref(st);
    }
    assert_int_equal(got, n);
}

static void test_consumer_caps(void **state)
{
    (void)state;
    th_daemon_t t;
    mt_d_cfg_t cfg = th_cfg();
    cfg.max_consumers = 3;
    th_daemon_start(&t, cfg);
    int fds[3];
    char *r = NULL;
    for (int i = 0; i < 3; i++) {
        fds[i] = tcp_connect(t.port);
        static const char req[] = "GET /events HTTP/1.1\r\n" HOST BEARER "\r\n";
        assert_int_equal(send(fds[i], req, sizeof req - 1, MSG_NOSIGNAL), (ssize_t)sizeof req - 1);
        assert_admitted(fds[i]); /* counted before the next one asks */
    }
    assert_int_equal(get(t.port, "/events", HOST BEARER, &r), 503);
    free(r);
    /* the Unix door is counted too */
    int u = -1;
    assert_int_equal(mt__d_client_connect(t.sock, &u), 0);
    static const char sub[] = "{\"type\":\"subscribe\",\"role\":\"consumer\"}\n";
    assert_int_equal(mt__d_client_send(u, sub, sizeof sub - 1), 0);
    assert_int_equal(mt__d_client_read_all(u, 4096, 3000, &r, NULL), 0);
    assert_non_null(strstr(r, "too many consumers"));
    free(r);
    close(u);
    close(fds[0]);
    wait_consumers(t.sock, 2); /* the daemon has seen it go */
    /* one left: there is room again */
    int fd = tcp_connect(t.port);
    static const char req[] = "GET /events HTTP/1.1\r\n" HOST BEARER "\r\n";
    assert_int_equal(send(fd, req, sizeof req - 1, MSG_NOSIGNAL), (ssize_t)sizeof req - 1);
    char buf[256] = {0};
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 2000), 1);
    assert_true(recv(fd, buf, sizeof buf - 1, 0) > 0);
    assert_non_null(strstr(buf, "200 OK"));
    close(fd);
    close(fds[1]);
    close(fds[2]);
    th_daemon_stop(&t);

    /* a budget of 1 MiB: 4 MiB queues do not fit, smaller ones do, then none */
    cfg = th_cfg();
    cfg.consumer_budget_bytes = 1u << 20;
    th_daemon_start(&t, cfg);
    int n200 = 0, n503 = 0, cs[8];
    for (int i = 0; i < 8; i++) {
        cs[i] = tcp_connect(t.port);
        assert_int_equal(send(cs[i], req, sizeof req - 1, MSG_NOSIGNAL), (ssize_t)sizeof req - 1);
        memset(buf, 0, sizeof buf);
        p.fd = cs[i];
        assert_int_equal(poll(&p, 1, 2000), 1);
        assert_true(recv(cs[i], buf, sizeof buf - 1, 0) > 0);
        n200 += strstr(buf, "200 OK") != NULL;
        n503 += strstr(buf, "503") != NULL;
    }
    assert_true(n200 >= 1 && n200 <= 3); /* (1 MiB - k * 256 KiB) / ... at >= 64 KiB each */
    assert_int_equal(n200 + n503, 8);
    for (int i = 0; i < 8; i++)
        close(cs[i]);
    th_daemon_stop(&t);
}

/* The port is taken: the error says so (-EADDRINUSE), not that the socket is busy. */
static void test_port_taken(void **state)
{
    (void)state;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 1), 0);
    socklen_t len = sizeof sa;
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &len), 0);
    int port = ntohs(sa.sin_port);
    char dir[] = "/tmp/mt-secport-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sock[128];
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    mt_d_cfg_t cfg = th_cfg();
    cfg.socket_path = sock;
    cfg.http_port = port;
    cfg.loop = &loop;
    mt_d_t *d = NULL;
    assert_int_equal(mt__d_create(&d, &cfg), -EADDRINUSE);
    assert_int_equal(uv_loop_close(&loop), 0);
    close(lfd);
    rmdir(dir);
}

/* A process named with a terminal escape and a newline cannot clear the daemon's terminal
 * or forge a line of its log. */
static void test_name_escaped_in_daemon_log(void **state)
{
    (void)state;
    static sec_log_t msgs;
    memset(&msgs, 0, sizeof msgs);
    th_daemon_t t;
    mt_d_cfg_t cfg = th_cfg();
    cfg.log = sec_log_cb;
    cfg.log_ud = &msgs;
    th_daemon_start(&t, cfg);
    /* The producer execs this binary again (th_spawn): the daemon's thread runs here, and a
     * forked child that starts the profiler (malloc, a thread) can hang on a lock held at
     * the fork. The daemon logs the registration before it answers it, so the line is
     * there once the producer has exited. */
    const char *const args[5] = {t.sock};
    pid_t pid = th_spawn("escaped-name", args);
    assert_int_equal(th_wait(pid), 0);
    th_daemon_stop(&t);
    assert_non_null(strstr(msgs.text, "(ev\\e[2J\\nforged) registered"));
    assert_null(strchr(msgs.text, 0x1b));
}

/* The producer of test_name_escaped_in_daemon_log: registers under a hostile name. */
static int escaped_name_body(const char *sock)
{
    mt_prof_t *p = NULL;
    if (th_prof_open(sock, "ev\x1b[2J\nforged", &p) != 0)
        return 1;
    mt_prof_destroy(&p);
    return 0;
}

int main(int argc, char **argv)
{
    th_producer_dispatch(argc, argv);
    char **a;
    const char *role = th_role(argc, argv, &a);
    if (role != NULL && strcmp(role, "escaped-name") == 0)
        _exit(escaped_name_body(a[0]));
    if (role != NULL && strcmp(role, "lockout") == 0)
        _exit(lockout_body(atoi(a[0]), atoi(a[1])));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_on_every_route),
        cmocka_unit_test(test_metrics_open),
        cmocka_unit_test(test_host_check),
        cmocka_unit_test(test_token_file),
        cmocka_unit_test(test_daemon_log_private),
        cmocka_unit_test(test_bare_lf),
        cmocka_unit_test(test_slowloris),
        cmocka_unit_test(test_connection_caps),
        cmocka_unit_test(test_other_user_lockout),
        cmocka_unit_test(test_consumer_caps),
        cmocka_unit_test(test_port_taken),
        cmocka_unit_test(test_name_escaped_in_daemon_log),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
