/* HTTP routes and malformed input on both sockets: every bad request gets an error
 * answer or a closed connection, and the daemon keeps serving. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "profiler/ring.h"
#include "tests/daemon/harness.h"
#include "tests/common/test_main.h"

static void assert_healthy(const th_daemon_t *t)
{
    char *r = NULL;
    assert_int_equal(th_http_get(t->port, "/healthz", &r), 200);
    assert_string_equal(th_http_body(r), "ok\n");
    free(r);
}

static void test_routes(void **state)
{
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    pid_t pid = th_producer(t.sock, 200, 1024, 0, -1);
    assert_int_equal(th_wait(pid), 0);
    json_t *p = th_wait_exited(t.sock, pid, 5000);
    assert_non_null(p);
    json_decref(p);

    char *r = NULL;
    assert_healthy(&t);
    assert_int_equal(th_http_get(t.port, "/state", &r), 200);
    assert_non_null(strstr(r, "Content-Type: application/json"));
    json_error_t err;
    json_t *st = json_loads(th_http_body(r), 0, &err);
    free(r);
    assert_non_null(st);
    json_t *procs = json_object_get(st, "processes");
    assert_int_equal(json_array_size(procs), 1);
    json_t *pj = json_array_get(procs, 0);
    assert_int_equal(json_integer_value(json_object_get(pj, "pid")), pid);
    assert_int_equal(json_integer_value(json_object_get(pj, "events")), 200);
    assert_string_equal(json_string_value(json_object_get(pj, "exit_reason")), "clean");
    /* 100 pairs over 7 tags: tags 0..6 each saw a peak of one 4096-byte block. */
    assert_int_equal(json_array_size(json_object_get(pj, "tags")), 7);
    assert_true(json_is_array(json_object_get(pj, "segments")));
    assert_int_equal(json_integer_value(json_object_get(pj, "allocated_bytes")), 0);
    json_decref(st);

    assert_int_equal(th_http_get(t.port, "/metrics", &r), 200);
    assert_non_null(strstr(r, "# TYPE memtrace_events_total counter"));
    free(r);
    assert_int_equal(th_http_get(t.port, "/nope", &r), 404);
    free(r);
    assert_int_equal(th_http_get(t.port, "/events?kind=bogus", &r), 400);
    free(r);
    static const char post[] = "POST /state HTTP/1.1\r\n" TH_HDRS "Content-Length: 0\r\n\r\n";
    assert_int_equal(th_http_raw(t.port, post, sizeof post - 1, &r), 405);
    assert_non_null(strstr(r, "Allow: GET"));
    free(r);
    static const char head[] = "HEAD /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
    assert_int_equal(th_http_raw(t.port, head, sizeof head - 1, &r), 200);
    assert_string_equal(th_http_body(r), "");
    free(r);
    th_daemon_stop(&t);
}

static void test_bad_http(void **state)
{
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    char *r = NULL;
    static const char garbage[] = "\x01\x02\xff garbage \r\n\r\n";
    assert_int_equal(th_http_raw(t.port, garbage, sizeof garbage - 1, &r), 400);
    free(r);
    static const char binary[] = "GET /\0\0\0";
    assert_int_equal(th_http_raw(t.port, binary, sizeof binary - 1, &r), 400);
    free(r);
    static const char version[] = "GET /healthz HTTP/9.9\r\n\r\n";
    assert_int_equal(th_http_raw(t.port, version, sizeof version - 1, &r), 400);
    free(r);
    static const char target[] = "GET healthz HTTP/1.1\r\n\r\n";
    assert_int_equal(th_http_raw(t.port, target, sizeof target - 1, &r), 400);
    free(r);
    /* A head larger than the limit: refused, not buffered without bound. */
    size_t big = 16 * 1024;
    char *huge = malloc(big);
    memcpy(huge, "GET / HTTP/1.1\r\nX: ", 19);
    memset(huge + 19, 'a', big - 19);
    assert_int_equal(th_http_raw(t.port, huge, big, &r), 431);
    free(r);
    free(huge);
    /* Half a request: closed at the idle deadline, without an answer. */
    static const char half[] = "GET /healthz HTTP/1.1\r\n";
    uint64_t t0 = th_now_ms();
    assert_int_equal(th_http_raw(t.port, half, sizeof half - 1, &r), 0);
    assert_string_equal(r, "");
    assert_true(th_now_ms() - t0 < 4000);
    free(r);
    assert_healthy(&t);
    th_daemon_stop(&t);
}

/* Sends raw bytes on the Unix socket and returns what comes back until EOF (new). */
static char *unix_exchange(const th_daemon_t *t, const char *msg, size_t len)
{
    int fd;
    assert_int_equal(mt__d_client_connect(t->sock, &fd), 0);
    if (len)
        mt__d_client_send(fd, msg, len); /* may fail once the daemon has hung up: fine */
    char *out = NULL;
    assert_int_equal(mt__d_client_read_all(fd, 1 << 20, 5000, &out, NULL), 0);
    close(fd);
    return out;
}

static void assert_refused(const th_daemon_t *t, const char *msg, size_t len)
{
    char *out = unix_exchange(t, msg, len);
    assert_non_null(strstr(out, "\"ok\":false"));
    assert_non_null(strstr(out, "\"error\":"));
    free(out);
}

static void test_bad_unix_input(void **state)
{
    mt_d_cfg_t cfg = th_cfg();
    cfg.max_line_bytes = 4096;
    th_daemon_t t;
    th_daemon_start(&t, cfg);
    static const char garbage[] = "\x01\x02 not json at all\n";
    assert_refused(&t, garbage, sizeof garbage - 1);
    static const char array[] = "[1,2,3]\n";
    assert_refused(&t, array, sizeof array - 1);
    static const char role[] = "{\"type\":\"hello\",\"role\":\"consumer\"}\n";
    assert_refused(&t, role, sizeof role - 1);
    static const char noshm[] = "{\"type\":\"hello\",\"role\":\"producer\",\"version\":1,"
                                "\"pid\":1}\n";
    assert_refused(&t, noshm, sizeof noshm - 1);
    static const char badshm[] = "{\"type\":\"hello\",\"role\":\"producer\",\"version\":1,"
                                 "\"pid\":1,\"shm\":\"/memtrace.no.such.ring\",\"slots\":8}\n";
    assert_refused(&t, badshm, sizeof badshm - 1);
    static const char escape[] = "{\"type\":\"hello\",\"role\":\"producer\",\"version\":1,"
                                 "\"pid\":1,\"shm\":\"/../../etc/passwd\",\"slots\":8}\n";
    assert_refused(&t, escape, sizeof escape - 1);
    static const char version[] = "{\"type\":\"hello\",\"role\":\"producer\",\"version\":7,"
                                  "\"pid\":1,\"shm\":\"/memtrace.x\"}\n";
    assert_refused(&t, version, sizeof version - 1);
    static const char kind[] = "{\"type\":\"subscribe\",\"role\":\"consumer\",\"kinds\":[\"x\"]}\n";
    assert_refused(&t, kind, sizeof kind - 1);
    static const char pid[] = "{\"type\":\"subscribe\",\"role\":\"consumer\",\"pid\":[-4]}\n";
    assert_refused(&t, pid, sizeof pid - 1);
    /* An oversized line without a newline: refused once past the limit. */
    size_t big = 100000;
    char *huge = malloc(big);
    memset(huge, '{', big);
    assert_refused(&t, huge, big);
    free(huge);
    /* Saying nothing: closed at the idle deadline. */
    char *out = unix_exchange(&t, NULL, 0);
    assert_string_equal(out, "");
    free(out);
    /* Still serving. */
    int fd = th_consumer(t.sock, "\"kinds\":\"alloc\"");
    close(fd);
    assert_healthy(&t);
    json_t *st = th_state(t.sock);
    assert_true(json_integer_value(json_object_get(json_object_get(st, "daemon"), "rejected")) >=
                10);
    json_decref(st);
    th_daemon_stop(&t);
}

/* Reads from fd until needle has been seen count times (or timeout); returns the count. */
static int read_until(int fd, const char *needle, int count, int timeout_ms, char **all)
{
    size_t cap = 1 << 20, len = 0;
    char *buf = calloc(1, cap);
    uint64_t deadline = th_now_ms() + (uint64_t)timeout_ms;
    int seen = 0;
    while (th_now_ms() < deadline && len < cap - 1) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 50) <= 0)
            continue;
        ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
        if (r <= 0)
            break;
        len += (size_t)r;
        seen = 0;
        for (const char *p = buf; (p = strstr(p, needle)) != NULL; p++)
            seen++;
        if (seen >= count)
            break;
    }
    *all = buf;
    return seen;
}

static void test_sse(void **state)
{
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)t.port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    static const char req[] =
        "GET /events?kind=alloc HTTP/1.1\r\n" TH_HDRS "Accept: text/event-stream\r\n\r\n";
    assert_int_equal(mt__d_client_send(fd, req, sizeof req - 1), 0);
    char *all = NULL;
    assert_int_equal(read_until(fd, ": memtrace", 1, 3000, &all), 1);
    assert_non_null(strstr(all, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"));
    free(all);
    pid_t pid = th_producer(t.sock, 100, 1024, 0, -1);
    assert_int_equal(th_wait(pid), 0);
    assert_int_equal(read_until(fd, "data: {", 50, 5000, &all), 50);
    assert_non_null(strstr(all, "id: 0\ndata: {"));
    assert_null(strstr(all, "\"kind\":\"free_completed\""));
    free(all);
    /* Idle: keep-alive comments (every 200 ms in the test configuration). */
    assert_int_equal(read_until(fd, ": keep-alive\n\n", 1, 3000, &all), 1);
    free(all);
    close(fd);
    th_daemon_stop(&t);
}

/* A registered producer that sends an oversized line is cut off (and treated as gone);
 * a hello naming another process's pid, or a ring that is not the sender's, is refused. */
static void test_producer_misbehaving(void **state)
{
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 64, "self"), 0);
    char hello[256];
    int n = snprintf(hello, sizeof hello,
                     "{\"type\":\"hello\",\"role\":\"producer\",\"version\":1,\"pid\":%d,"
                     "\"name\":\"self\",\"shm\":\"%s\",\"slots\":64}\n",
                     1, mt__ring_name(r));
    assert_refused(&t, hello, (size_t)n); /* pid 1 is not us */

    n = snprintf(hello, sizeof hello,
                 "{\"type\":\"hello\",\"role\":\"producer\",\"version\":1,\"pid\":%d,"
                 "\"name\":\"self\",\"shm\":\"%s\",\"slots\":64}\n",
                 (int)getpid(), mt__ring_name(r));
    int fd;
    assert_int_equal(mt__d_client_connect(t.sock, &fd), 0);
    assert_int_equal(mt__d_client_send(fd, hello, (size_t)n), 0);
    char line[64] = {0};
    for (size_t i = 0; i < sizeof line - 1; i++) {
        assert_int_equal(recv(fd, &line[i], 1, 0), 1);
        if (line[i] == '\n') {
            line[i] = '\0';
            break;
        }
    }
    assert_string_equal(line, "{\"ok\":true}");
    mt_event_rec_t ev = {.kind = MT_EV_ALLOC, .addr = 0x1000, .size = 512, .allocated = 512};
    assert_int_equal(mt__ring_push(r, &ev), 0);
    static const char poke[] = "{\"type\":\"poke\"}\n";
    assert_int_equal(mt__d_client_send(fd, poke, sizeof poke - 1), 0);
    char junk[5000];
    memset(junk, 'x', sizeof junk);
    mt__d_client_send(fd, junk, sizeof junk);
    char *rest = NULL;
    assert_int_equal(mt__d_client_read_all(fd, 1024, 5000, &rest, NULL), 0); /* EOF */
    assert_string_equal(rest, "");
    free(rest);
    close(fd);
    json_t *p = th_wait_exited(t.sock, getpid(), 5000);
    assert_non_null(p);
    assert_int_equal(json_integer_value(json_object_get(p, "events")), 1);
    assert_string_equal(json_string_value(json_object_get(p, "exit_reason")), "killed");
    json_decref(p);
    mt__ring_close(&r);
    assert_healthy(&t);
    th_daemon_stop(&t);
}

/* A live producer whose ring header breaks the layout's invariants (claim far ahead of
 * what was read): the daemon keeps what it read, lets go of the ring (exit reason
 * "corrupt", connection closed) and keeps serving everyone else. */
static void test_producer_corrupt_ring(void **state)
{
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 64, "corrupt"), 0);
    char hello[256];
    int n = snprintf(hello, sizeof hello,
                     "{\"type\":\"hello\",\"role\":\"producer\",\"version\":1,\"pid\":%d,"
                     "\"name\":\"corrupt\",\"shm\":\"%s\",\"slots\":64}\n",
                     (int)getpid(), mt__ring_name(r));
    int fd;
    assert_int_equal(mt__d_client_connect(t.sock, &fd), 0);
    assert_int_equal(mt__d_client_send(fd, hello, (size_t)n), 0);
    char *reply = NULL;
    mt_event_rec_t ev = {.kind = MT_EV_ALLOC, .addr = 0x1000, .size = 512, .allocated = 512};
    assert_int_equal(mt__ring_push(r, &ev), 0);
    /* The adversary writes its own shared header. */
    mt__ring_hdr_t *h = (mt__ring_hdr_t *)mt__ring_header(r);
    uint64_t bogus = atomic_load(&h->read_idx) + 1000000;
    atomic_store(&h->claim, bogus);
    /* The daemon closes the connection once it gave up on the ring. */
    assert_int_equal(mt__d_client_read_all(fd, 1024, 5000, &reply, NULL), 0);
    assert_non_null(strstr(reply, "\"ok\":true"));
    free(reply);
    close(fd);
    json_t *p = th_wait_exited(t.sock, getpid(), 5000);
    assert_non_null(p);
    assert_string_equal(json_string_value(json_object_get(p, "exit_reason")), "corrupt");
    json_decref(p);
    mt__ring_close(&r);
    assert_healthy(&t);
    th_daemon_stop(&t);
}

/* Holds the daemon's thread, once, in its log callback at the first "registered" line:
 * the loop is busy (as in a long drain on a starved CPU) until the test has sent its
 * request and hold_ms have passed since the hold began. */
typedef struct gate_s {
    pthread_mutex_t mu;
    bool held;        /* the daemon's thread is held */
    bool sent;        /* the test has sent its request */
    unsigned hold_ms; /* > the idle timeout */
} gate_t;

static void gate_log(void *ud, mt_log_level_e level, const char *msg)
{
    (void)level;
    gate_t *g = ud;
    pthread_mutex_lock(&g->mu);
    bool first = !g->held && strstr(msg, " registered") != NULL;
    g->held |= first;
    pthread_mutex_unlock(&g->mu);
    if (!first)
        return;
    uint64_t until = th_now_ms() + g->hold_ms, give_up = th_now_ms() + 30000;
    for (bool sent = false; !sent && th_now_ms() < give_up; usleep(1000)) {
        pthread_mutex_lock(&g->mu);
        sent = g->sent;
        pthread_mutex_unlock(&g->mu);
    }
    while (th_now_ms() < until)
        usleep(1000);
}

/* A client whose request came in time is answered even when the daemon's loop was busy
 * past the idle deadline before it could read the request: idle means nothing to read. */
static void test_busy_daemon_answers_waiting_client(void **state)
{
    (void)state;
    static gate_t g = {.mu = PTHREAD_MUTEX_INITIALIZER};
    mt_d_cfg_t cfg = th_cfg();
    cfg.log = gate_log;
    cfg.log_ud = &g;
    g.hold_ms = cfg.idle_timeout_ms + 200;
    th_daemon_t t;
    th_daemon_start(&t, cfg);
    /* Connected first, so accepted before the producer's hello is read. */
    int fd;
    assert_int_equal(mt__d_client_connect(t.sock, &fd), 0);
    pid_t pid = th_producer(t.sock, 0, 1024, 0, -1); /* its registration holds the daemon */
    bool held = false;
    for (uint64_t end = th_now_ms() + 30000; !held && th_now_ms() < end; usleep(1000)) {
        pthread_mutex_lock(&g.mu);
        held = g.held;
        pthread_mutex_unlock(&g.mu);
    }
    assert_true(held);
    static const char req[] = "{\"type\":\"state\"}\n";
    assert_int_equal(mt__d_client_send(fd, req, sizeof req - 1), 0);
    pthread_mutex_lock(&g.mu);
    g.sent = true;
    pthread_mutex_unlock(&g.mu);
    char *out = NULL;
    assert_int_equal(mt__d_client_read_all(fd, 1u << 20, 30000, &out, NULL), 0);
    close(fd);
    json_t *st = json_loads(out, 0, NULL);
    free(out);
    assert_non_null(st);
    assert_non_null(json_object_get(st, "daemon"));
    json_decref(st);
    assert_int_equal(th_wait(pid), 0);
    th_daemon_stop(&t);
}

int main(int argc, char **argv)
{
    th_producer_dispatch(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routes),
        cmocka_unit_test(test_bad_http),
        cmocka_unit_test(test_bad_unix_input),
        cmocka_unit_test(test_sse),
        cmocka_unit_test(test_producer_misbehaving),
        cmocka_unit_test(test_producer_corrupt_ring),
        cmocka_unit_test(test_busy_daemon_answers_waiting_client),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
