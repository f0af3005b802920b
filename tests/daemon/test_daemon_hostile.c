/* Producers of the daemon's own user that misbehave on purpose: one process registering
 * ring after ring, and a producer that truncates its ring file under the daemon's
 * mapping, before a drain and in the middle of one. The daemon refuses the first with a
 * named error, lets go of the second, and keeps serving everyone else. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "profiler/ring.h"
#include "profiler/stack.h"
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
    assert_int_equal(mt__d_client_connect(sock, &fd), 0);
    assert_int_equal(mt__d_client_send(fd, msg, (size_t)n), 0);
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

/* Waits until the daemon has drained at least `events` events of pid's running
 * registration. */
static void wait_events(const char *sock, int pid, long long events)
{
    long long got = -1;
    for (uint64_t end = th_now_ms() + 10000; th_now_ms() < end; usleep(5000)) {
        int n;
        json_t *pr = find_proc(sock, pid, "running", &n);
        got = pr ? json_integer_value(json_object_get(pr, "events")) : -1;
        json_decref(pr);
        if (got >= events)
            return;
    }
    fail_msg("pid %d: %lld events drained, expected %lld", pid, got, events);
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

/* ---- truncated rings ---- */

/* A registered producer (this process) truncates its ring file between two drains: the
 * daemon's next read of the mapping would fault. The daemon keeps what it read, lets go of
 * the producer ("corrupt") with a warning that says why, and keeps serving. Round 0 cuts
 * the whole file, round 1 keeps the header page only (records waiting in the pages that
 * go), round 2 keeps the records and cuts the stack table that a stack ref then makes the
 * daemon read. Round 3 keeps the header page when everything was drained, claims a slot
 * it never publishes (a producer dying as it writes into the cut) and goes: no drain reads
 * past the cut, and the daemon must still tell the truncation from a kill. */
static void test_truncated_ring(void **state)
{
    (void)state;
    static logbuf_t dlog = {.mu = PTHREAD_MUTEX_INITIALIZER};
    memset(dlog.text, 0, sizeof dlog.text);
    mt_d_cfg_t cfg = th_cfg();
    cfg.log = logbuf_cb;
    cfg.log_ud = &dlog;
    th_daemon_t t;
    th_daemon_start(&t, cfg);
    for (int round = 0; round < 4; round++) {
        mt__ring_t *r = NULL;
        assert_int_equal(mt__ring_create_ex(&r, 1024, "truncator", false, mt__stab_area_size()), 0);
        size_t asz;
        void *area = mt__ring_area(r, &asz);
        mt__stab_t *tab = NULL;
        assert_int_equal(mt__stab_create(&tab, area, asz), 0);
        uint64_t frames[2] = {0x401000, 0x402000};
        assert_int_equal(mt__stab_intern(tab, frames, 2, false), 1);
        /* the hostile producer keeps a descriptor of its ring (the daemon unlinks the name) */
        int shm = shm_open(mt__ring_name(r), O_RDWR, 0);
        assert_true(shm >= 0);
        char line[256];
        int fd = hello(t.sock, r, line, sizeof line);
        assert_string_equal(line, "{\"ok\":true}");
        mt_event_rec_t ev = {.kind = MT_EV_ALLOC, .addr = 0x1000, .size = 512, .allocated = 512};
        for (int i = 0; i < 10; i++)
            assert_int_equal(mt__ring_push(r, &ev), 0);
        wait_events(t.sock, getpid(), 10);
        off_t to = round == 2 ? (off_t)mt__ring_map_size(1024) : round == 0 ? 0 : 4096;
        if (round == 1) {
            for (int i = 0; i < 10; i++)
                assert_int_equal(mt__ring_push(r, &ev), 0);
        }
        if (round == 3) {
            /* claimed, never published: its commit word is in the page that stays */
            mt_event_rec_t *slot;
            uint64_t pos;
            assert_int_equal(mt__ring_reserve(r, &slot, &pos), 0);
            assert_true(MT_RING_HEADER_SIZE + 8 * (pos % 1024 + 1) <= 4096);
        }
        assert_int_equal(ftruncate(shm, to), 0);
        /* From here on the cut pages are not ours to touch either. */
        if (round == 2) {
            /* the records stay: a stack ref makes the daemon read the table that went */
            mt_event_rec_t ref = {.kind = MT_EV_STACK_REF, .addr = 0x2000, .size = 1};
            mt_event_rec_t al = {.kind = MT_EV_ALLOC, .addr = 0x2000, .size = 512};
            assert_int_equal(mt__ring_push(r, &ref), 0);
            assert_int_equal(mt__ring_push(r, &al), 0);
        }
        /* the daemon closes the connection once it let go of the ring; round 3's producer
         * goes first */
        if (round == 3)
            assert_int_equal(shutdown(fd, SHUT_WR), 0);
        char *rest = NULL;
        assert_int_equal(mt__d_client_read_all(fd, 1024, 5000, &rest, NULL), 0);
        free(rest);
        close(fd);
        json_t *p = wait_exited_n(t.sock, getpid(), round + 1);
        const char *why = json_string_value(json_object_get(p, "exit_reason"));
        if (strcmp(why, "corrupt") != 0)
            fail_msg("round %d: exit reason %s, expected corrupt", round, why);
        json_decref(p);
        close(shm);
        mt__stab_destroy(&tab);
        mt__ring_close(&r);
        assert_healthy(&t);
    }
    if (!logbuf_has(&dlog, "ring file shrank"))
        fail_msg("no warning names the truncation: %s", dlog.text);
    assert_producer_works(&t);
    th_daemon_stop(&t);
}

/* The truncating producer of test_truncated_mid_drain: registers a ring, records as fast
 * as it can from a thread, and after delay_us truncates the ring file to `to` bytes. Its
 * own next write then faults: it exits 3 from SIGBUS. */
static _Atomic bool g_run = true;
static mt__ring_t *g_ring;

static void *pusher(void *arg)
{
    (void)arg;
    mt_event_rec_t ev[64];
    for (int i = 0; i < 64; i++)
        ev[i] = (mt_event_rec_t){.kind = (uint8_t)(i % 2 ? MT_EV_FREE_COMPLETED : MT_EV_ALLOC),
                                 .addr = 0x1000u + (uint64_t)(i / 2) * 512,
                                 .size = 512};
    while (atomic_load(&g_run))
        mt__ring_push_n(g_ring, ev, 64);
    return NULL;
}

static void on_own_sigbus(int sig)
{
    (void)sig;
    _exit(3);
}

static int truncator_body(const char *sock, long to, long delay_us)
{
    signal(SIGBUS, on_own_sigbus);
    if (mt__ring_create_ex(&g_ring, 1u << 14, "truncator", false, mt__stab_area_size()) != 0)
        return 1;
    int shm = shm_open(mt__ring_name(g_ring), O_RDWR, 0);
    if (shm < 0)
        return 1;
    char msg[256];
    int n = snprintf(msg, sizeof msg,
                     "{\"type\":\"hello\",\"role\":\"producer\",\"version\":1,\"pid\":%d,"
                     "\"name\":\"truncator\",\"shm\":\"%s\",\"slots\":%u}\n",
                     (int)getpid(), mt__ring_name(g_ring), 1u << 14);
    int fd;
    char ok[32] = {0};
    if (mt__d_client_connect(sock, &fd) != 0 || mt__d_client_send(fd, msg, (size_t)n) != 0 ||
        recv(fd, ok, sizeof ok - 1, 0) <= 0 || !strstr(ok, "\"ok\":true"))
        return 1;
    pthread_t th;
    if (pthread_create(&th, NULL, pusher, NULL) != 0)
        return 1;
    usleep((useconds_t)delay_us);
    if (ftruncate(shm, (off_t)to) != 0)
        return 1;
    usleep(20000);
    atomic_store(&g_run, false);
    pthread_join(th, NULL);
    return 0;
}

/* Producers truncating their rings while they record and the daemon drains them: at
 * random moments, to nothing, to the header alone, and to half the records. Every one
 * exits "corrupt", however the cut fell between the daemon's reads. */
static void test_truncated_mid_drain(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    srand(1234);
    const long sizes[] = {0, 4096, (long)mt__ring_map_size(1u << 14) / 2};
    for (int round = 0; round < 12; round++) {
        char to[24], delay[24];
        snprintf(to, sizeof to, "%ld", sizes[round % 3]);
        snprintf(delay, sizeof delay, "%d", 1000 + rand() % 30000);
        const char *const args[5] = {t.sock, to, delay};
        pid_t pid = th_spawn("truncator", args);
        int st = th_wait_within(pid, 20000, "the truncating producer");
        assert_true(WIFEXITED(st));
        assert_true(WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 3);
        json_t *p = wait_exited_n(t.sock, pid, 1);
        const char *why = json_string_value(json_object_get(p, "exit_reason"));
        /* The daemon's reads may all miss the cut (a full ring it emptied, then the one slot
         * the producer died writing, its commit word in the header page), so it looks past
         * the records when the producer goes. */
        if (strcmp(why, "corrupt") != 0)
            fail_msg("round %d (cut to %ld bytes): exit reason %s, expected corrupt", round,
                     sizes[round % 3], why);
        json_decref(p);
        assert_healthy(&t);
    }
    assert_producer_works(&t);
    th_daemon_stop(&t);
}

int main(int argc, char **argv)
{
    th_producer_dispatch(argc, argv);
    char **a;
    const char *role = th_role(argc, argv, &a);
    if (role != NULL && strcmp(role, "truncator") == 0)
        _exit(truncator_body(a[0], atol(a[1]), atol(a[2])));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rings_per_process_capped),
        cmocka_unit_test(test_rings_per_uid_capped),
        cmocka_unit_test(test_truncated_ring),
        cmocka_unit_test(test_truncated_mid_drain),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
