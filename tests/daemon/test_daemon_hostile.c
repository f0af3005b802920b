/* Producers of the daemon's own user that misbehave on purpose: one process registering
 * ring after ring. The daemon refuses it with a named error and keeps serving everyone
 * else. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
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

/* A log callback that keeps the daemon's lines (it runs on the daemon's thread). */
typedef struct logbuf_s {
    pthread_mutex_t mu;
    char text[16384];
} logbuf_t;

static void logbuf_cb(void *ud, mt_log_level_e level, const char *msg)
{
    (void)level;
    logbuf_t *l = ud;
    pthread_mutex_lock(&l->mu);
    size_t n = strlen(l->text);
    if (n + strlen(msg) + 2 < sizeof l->text) {
        strcat(l->text, msg);
        strcat(l->text, "\n");
    }
    pthread_mutex_unlock(&l->mu);
}

static bool logbuf_has(logbuf_t *l, const char *s)
{
    pthread_mutex_lock(&l->mu);
    bool has = strstr(l->text, s) != NULL;
    pthread_mutex_unlock(&l->mu);
    return has;
}

/* Sends a hello for ring r on a new connection; returns the fd, the first answer line in
 * line (without its '\n'). */
static int hello(const char *sock, const mt__ring_t *r, char *line, size_t cap)
{
    char msg[256];
    int n = snprintf(msg, sizeof msg,
                     "{\"type\":\"hello\",\"role\":\"producer\",\"version\":1,\"pid\":%d,"
                     "\"name\":\"hostile\",\"shm\":\"%s\",\"slots\":%u}\n",
                     (int)getpid(), mt__ring_name(r), (unsigned)mt__ring_header(r)->slots);
    int fd;
    assert_int_equal(mt_d_client_connect(sock, &fd), 0);
    assert_int_equal(mt_d_client_send(fd, msg, (size_t)n), 0);
    size_t i = 0;
    for (; i < cap - 1; i++) {
        if (recv(fd, &line[i], 1, 0) != 1 || line[i] == '\n')
            break;
    }
    line[i] = '\0';
    return fd;
}

/* ---- helpers ---- */

/* The newest registration of pid in the daemon's state that is `state` ("running" or
 * "exited"), and how many such there are; NULL if none. *new*. */
static json_t *find_proc(const char *sock, int pid, const char *state, int *count)
{
    json_t *st = th_state(sock), *found = NULL, *pr;
    size_t i;
    *count = 0;
    json_array_foreach(json_object_get(st, "processes"), i, pr)
    {
        if (json_integer_value(json_object_get(pr, "pid")) == pid &&
            strcmp(json_string_value(json_object_get(pr, "state")), state) == 0) {
            found = pr;
            ++*count;
        }
    }
    json_incref(found);
    json_decref(st);
    return found;
}

/* Waits until pid has exited `n` times in the daemon's state; returns the newest. *new*. */
static json_t *wait_exited_n(const char *sock, int pid, int n)
{
    for (uint64_t end = th_now_ms() + 5000; th_now_ms() < end; usleep(10000)) {
        int got;
        json_t *pr = find_proc(sock, pid, "exited", &got);
        if (got >= n)
            return pr;
        json_decref(pr);
    }
    fail_msg("pid %d has not exited %d times", pid, n);
    return NULL;
}

/* Others still get in and through: a producer's 1000 events all reach the daemon. */
static void assert_producer_works(const th_daemon_t *t)
{
    pid_t pid = th_producer(t->sock, 1000, 1024, 0, -1);
    assert_int_equal(th_wait(pid), 0);
    json_t *p = wait_exited_n(t->sock, pid, 1);
    assert_true(json_integer_value(json_object_get(p, "events")) >= 1000);
    json_decref(p);
    assert_healthy(t);
}

/* ---- rings per process ---- */

/* One process registering ring after ring (968 in the attack): the 17th live one is
 * refused with an error that names the limit, and a producer made through the profiler
 * reports that error on its log callback. A ring given back makes room again. */
static void test_rings_per_process_capped(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    enum { N = 17 };
    mt__ring_t *r[N] = {0};
    int fd[N];
    char line[256];
    for (int i = 0; i < N; i++) {
        assert_int_equal(mt__ring_create(&r[i], 64, "many"), 0);
        fd[i] = hello(t.sock, r[i], line, sizeof line);
        if (i < N - 1 && strcmp(line, "{\"ok\":true}") != 0)
            fail_msg("ring %d refused: %s", i, line);
    }
    if (!strstr(line, "\"ok\":false") || !strstr(line, "too many rings for process"))
        fail_msg("ring %d of one process: %s, expected a refusal naming the limit", N, line);
    assert_non_null(strstr(line, "max_rings_per_proc"));

    /* The profiler says why it has no daemon. */
    logbuf_t plog = {.mu = PTHREAD_MUTEX_INITIALIZER};
    mt_prof_cfg_t pc = mt_prof_cfg_default();
    pc.mode = MT_PROF_DAEMON;
    pc.socket = t.sock;
    pc.log = logbuf_cb;
    pc.log_ud = &plog;
    mt_prof_t *p = NULL;
    assert_int_not_equal(mt_prof_create(&p, &pc), 0);
    if (!logbuf_has(&plog, "too many rings for process"))
        fail_msg("the producer's log does not name the limit: %s", plog.text);

    /* Another process still gets in. */
    assert_producer_works(&t);

    /* A producer that goes makes room for the next. */
    close(fd[0]);
    mt__ring_close(&r[0]);
    json_t *gone = th_wait_exited(t.sock, getpid(), 5000);
    assert_non_null(gone);
    json_decref(gone);
    close(fd[N - 1]);
    mt__ring_close(&r[N - 1]);
    assert_int_equal(mt__ring_create(&r[0], 64, "again"), 0);
    fd[0] = hello(t.sock, r[0], line, sizeof line);
    assert_string_equal(line, "{\"ok\":true}");
    for (int i = 0; i < N - 1; i++) {
        close(fd[i]);
        mt__ring_close(&r[i]);
    }
    assert_healthy(&t);
    th_daemon_stop(&t);
}

/* The rings of one user, all its processes together: with a cap of 3, the fourth live
 * ring is refused, whichever process asks. */
static void test_rings_per_uid_capped(void **state)
{
    (void)state;
    th_daemon_t t;
    mt_d_cfg_t cfg = th_cfg();
    cfg.max_rings_per_uid = 3;
    th_daemon_start(&t, cfg);
    mt__ring_t *r[3] = {0};
    int fd[3];
    char line[256];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(mt__ring_create(&r[i], 64, "uid"), 0);
        fd[i] = hello(t.sock, r[i], line, sizeof line);
        assert_string_equal(line, "{\"ok\":true}");
    }
    mt__ring_t *more = NULL;
    assert_int_equal(mt__ring_create(&more, 64, "more"), 0);
    int fd4 = hello(t.sock, more, line, sizeof line);
    if (!strstr(line, "too many rings for uid") || !strstr(line, "max_rings_per_uid"))
        fail_msg("a fourth ring of the user: %s", line);
    close(fd4);
    /* another process of the same user is refused too */
    pid_t pid = th_producer(t.sock, 10, 1024, 0, -1);
    assert_int_equal(WEXITSTATUS(th_wait(pid)), 10); /* mt_prof_create failed */
    for (int i = 0; i < 3; i++) {
        close(fd[i]);
        mt__ring_close(&r[i]);
    }
    mt__ring_close(&more);
    th_daemon_stop(&t);
}

int main(int argc, char **argv)
{
    th_producer_dispatch(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rings_per_process_capped),
        cmocka_unit_test(test_rings_per_uid_capped),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
