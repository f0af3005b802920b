/* End to end: producer processes -> daemon -> consumers, over the real sockets. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/daemon/harness.h"
#include "tests/common/test_main.h"

typedef struct reader_s {
    pthread_t th;
    int fd;
    uint64_t want;
    th_count_t count;
} reader_t;

static void *reader_main(void *arg)
{
    reader_t *r = arg;
    th_consume(r->fd, r->want, 15000, &r->count);
    return NULL;
}

static void reader_start(reader_t *r, int fd, uint64_t want)
{
    memset(r, 0, sizeof *r);
    r->fd = fd;
    r->want = want;
    assert_int_equal(pthread_create(&r->th, NULL, reader_main, r), 0);
}

static void reader_join(reader_t *r)
{
    assert_int_equal(pthread_join(r->th, NULL), 0);
    close(r->fd);
}

static void assert_exited(const char *sock, pid_t pid, const char *reason, uint64_t events)
{
    json_t *p = th_wait_exited(sock, pid, 5000);
    assert_non_null(p);
    assert_string_equal(json_string_value(json_object_get(p, "exit_reason")), reason);
    assert_int_equal(json_integer_value(json_object_get(p, "events")), events);
    assert_int_equal(json_integer_value(json_object_get(p, "dropped")), 0);
    json_decref(p);
}

/* Three producers, two consumers reading concurrently: every event reaches both, once. */
static void test_counts_match_exactly(void **state)
{
    enum { NPROD = 3, N = 6000 };
    th_daemon_t t;
    /* Queues that hold every line (~4 MB each): no gap, however slow the readers' threads
     * are on a loaded machine (a consumer that falls behind: the next test). */
    mt_d_cfg_t cfg = th_cfg();
    cfg.consumer_queue_bytes = 16u << 20;
    th_daemon_start(&t, cfg);
    reader_t r[2];
    reader_start(&r[0], th_consumer(t.sock, ""), NPROD * N);
    reader_start(&r[1], th_consumer(t.sock, ""), NPROD * N);
    pid_t pids[NPROD];
    for (int i = 0; i < NPROD; i++)
        pids[i] = th_producer(t.sock, N, 8192, 500, -1);
    for (int i = 0; i < NPROD; i++) {
        int st = th_wait(pids[i]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    for (int k = 0; k < 2; k++) {
        reader_join(&r[k]);
        assert_false(r[k].count.bad_line);
        assert_int_equal(r[k].count.gaps, 0);
        assert_int_equal(r[k].count.events, NPROD * N);
        for (int i = 0; i < NPROD; i++)
            assert_int_equal(th_count_of(&r[k].count, pids[i]), N);
    }
    for (int i = 0; i < NPROD; i++)
        assert_exited(t.sock, pids[i], "clean", N);
    th_daemon_stop(&t);
}

/* A consumer that never reads: the other one still gets everything, without a gap; the
 * stuck one, once it reads, sees a gap whose count accounts for every missing event. */
static void test_stuck_consumer_does_not_stall_others(void **state)
{
    enum { N = 40000 };
    th_daemon_t t;
    /* The reader's queue holds all N lines (~9 MB): it gets everything however little CPU
     * its thread gets on a loaded machine, and a gap can only come from the stuck one.
     * Admitted first, it takes that much of the budget; the stuck one gets the 1 MiB left
     * and overflows it. */
    mt_d_cfg_t cfg = th_cfg();
    cfg.consumer_queue_bytes = 32u << 20;
    cfg.consumer_budget_bytes = cfg.consumer_queue_bytes + (1u << 20) + 2 * cfg.write_high_water;
    th_daemon_start(&t, cfg);
    reader_t fast;
    reader_start(&fast, th_consumer(t.sock, ""), N);
    int stuck = th_consumer(t.sock, "");
    pid_t pid = th_producer(t.sock, N, 65536, 200, -1);
    int st = th_wait(pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    reader_join(&fast);
    assert_int_equal(fast.count.events, N);
    assert_int_equal(fast.count.gaps, 0);
    assert_exited(t.sock, pid, "clean", N);

    th_count_t c = {0};
    th_consume(stuck, N, 10000, &c);
    close(stuck);
    assert_false(c.bad_line);
    assert_true(c.gaps >= 1);
    assert_true(c.lost > 0);
    assert_true(c.events < N);
    assert_int_equal(c.events + c.lost, N);
    json_t *s = th_state(t.sock);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(s, "daemon"), "consumer_dropped")),
        c.lost);
    json_decref(s);
    th_daemon_stop(&t);
}

/* SIGKILL after the events are recorded: the ring outlives the process and every event
 * it published is delivered; the process is kept, marked killed. */
static void test_sigkill_producer_delivers_everything(void **state)
{
    enum { N = 5000 };
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    int fd = th_consumer(t.sock, "");
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = th_producer(t.sock, N, 8192, 0, pfd[1]);
    char c;
    assert_int_equal(read(pfd[0], &c, 1), 1);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int st = th_wait(pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    th_count_t cnt = {0};
    th_consume(fd, N, 10000, &cnt);
    assert_int_equal(th_count_of(&cnt, pid), N);
    assert_int_equal(cnt.gaps, 0);
    assert_exited(t.sock, pid, "killed", N);
    close(fd);
    close(pfd[0]);
    close(pfd[1]);
    th_daemon_stop(&t);
}

/* Polls /state until process pid has more than n events. */
static void wait_events(const char *sock, int pid, json_int_t n)
{
    json_int_t got = -1;
    for (uint64_t end = th_now_ms() + 30000; got <= n && th_now_ms() < end; usleep(10000)) {
        json_t *st = th_state(sock);
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(st, "processes"), i, p)
        {
            if (json_integer_value(json_object_get(p, "pid")) == pid)
                got = json_integer_value(json_object_get(p, "events"));
        }
        json_decref(st);
    }
    assert_true(got > n);
}

/* SIGKILL while the producer is emitting: whatever it published is delivered, in order,
 * and the consumer's count matches the daemon's (a slot it was killed in the middle of
 * writing may show up as one lost event, in a gap record, never as a torn event). */
static void test_sigkill_mid_stream(void **state)
{
    enum { N = 60000 };
    th_daemon_t t;
    /* The consumer reads only after the kill: its queue holds all the producer can emit
     * (N lines, ~14 MB), so that a loaded machine's timing never makes it overflow. */
    mt_d_cfg_t cfg = th_cfg();
    cfg.consumer_queue_bytes = 32u << 20;
    th_daemon_start(&t, cfg);
    int fd = th_consumer(t.sock, "");
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    /* ~50 k events/s for over a second; after N it waits to be killed (it says so on pfd,
     * unread: the kill then comes after the last event, which is as valid a test). */
    pid_t pid = th_producer(t.sock, N, 65536, 50, pfd[1]);
    wait_events(t.sock, pid, 1000); /* killed mid-stream, whatever the load */
    assert_int_equal(kill(pid, SIGKILL), 0);
    int st = th_wait(pid);
    assert_true(WIFSIGNALED(st));
    json_t *p = th_wait_exited(t.sock, pid, 5000);
    assert_non_null(p);
    assert_string_equal(json_string_value(json_object_get(p, "exit_reason")), "killed");
    uint64_t events = (uint64_t)json_integer_value(json_object_get(p, "events"));
    uint64_t dropped = (uint64_t)json_integer_value(json_object_get(p, "dropped"));
    json_decref(p);
    assert_true(events > 100);
    assert_true(dropped <= 1);
    th_count_t cnt = {0};
    th_consume(fd, events + dropped, 5000, &cnt);
    assert_false(cnt.bad_line);
    assert_int_equal(th_count_of(&cnt, pid), events);
    assert_int_equal(cnt.lost, dropped);
    close(pfd[0]);
    close(pfd[1]);
    close(fd);
    th_daemon_stop(&t);
}

/* Filters: by kind, by tag, by pid (another process's events never arrive). */
static void test_filters(void **state)
{
    enum { N = 1400 }; /* 700 alloc/free pairs, tags cycling over 7 */
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    int by_kind = th_consumer(t.sock, "\"kinds\":[\"alloc\"]");
    int by_tag = th_consumer(t.sock, "\"tags\":[\"weights\",2]");
    int by_pid = th_consumer(t.sock, "\"pid\":[1]");
    pid_t pid = th_producer(t.sock, N, 4096, 0, -1);
    assert_int_equal(th_wait(pid), 0);
    assert_exited(t.sock, pid, "clean", N);
    th_count_t k = {0}, g = {0}, p = {0};
    th_consume(by_kind, N / 2, 5000, &k);
    th_consume(by_tag, 2 * 2 * N / 14, 5000, &g);
    th_consume(by_pid, 1, 300, &p);
    assert_int_equal(k.events, N / 2);
    assert_int_equal(g.events, 2 * 2 * N / 14); /* tags 1 and 2, alloc + free each */
    assert_int_equal(p.events, 0);
    close(by_kind);
    close(by_tag);
    close(by_pid);
    th_daemon_stop(&t);
}

int main(int argc, char **argv)
{
    th_producer_dispatch(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_match_exactly),
        cmocka_unit_test(test_stuck_consumer_does_not_stall_others),
        cmocka_unit_test(test_sigkill_producer_delivers_everything),
        cmocka_unit_test(test_sigkill_mid_stream),
        cmocka_unit_test(test_filters),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
