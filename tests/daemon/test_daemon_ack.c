/* A ring's read_idx never passes what is in the daemon's log file, now that a drain tick
 * which another follows hands its last batch to the encoder without waiting for it
 * (daemon/lines.c): the rings are acknowledged only when that batch is back, written and
 * flushed. A producer that takes over after the daemon dies starts its local log at
 * read_idx, so an acknowledgement ahead of the file loses events.
 *
 * The encoder's flush is held (fflush is wrapped at link time, -Wl,--wrap=fflush): the
 * daemon then stands with batches written to stdio but not flushed, and the file on disk
 * must hold at least read_idx events. Released, every event is in the file once. A consumer
 * that hangs up meanwhile is freed only after the batches that name it are back. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/harness.h"
#include "profiler/internal.h"
#include "profiler/ring.h"
#include "tests/common/test_main.h"

enum { N = 16384, SLOTS = 1 << 15, BUDGET = 2048 };

/* ---- the held flush: any thread but the test's and the daemon loop's (the encoder) ---- */

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static bool gate_closed, held; /* under gate_mu */
static pthread_t test_thread, loop_thread;
static atomic_bool threads_known;

int __real_fflush(FILE *f);
int __wrap_fflush(FILE *f);
int __wrap_fflush(FILE *f)
{
    pthread_t self = pthread_self();
    if (f != NULL && atomic_load(&threads_known) && !pthread_equal(self, test_thread) &&
        !pthread_equal(self, loop_thread)) {
        pthread_mutex_lock(&gate_mu);
        while (gate_closed) {
            held = true;
            pthread_cond_broadcast(&gate_cv);
            pthread_cond_wait(&gate_cv, &gate_mu);
        }
        pthread_mutex_unlock(&gate_mu);
    }
    return __real_fflush(f);
}

static void gate_set(bool closed)
{
    pthread_mutex_lock(&gate_mu);
    gate_closed = closed;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* Waits up to 10 s for the encoder to stand in the held flush. */
static bool wait_held(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&gate_mu);
    int rc = 0;
    while (!held && rc == 0)
        rc = pthread_cond_timedwait(&gate_cv, &gate_mu, &until);
    bool h = held;
    pthread_mutex_unlock(&gate_mu);
    return h;
}

/* ---- the log ---- */

/* Whole event lines in the file at path. */
static uint64_t events_in(const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    uint64_t n = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 0)
        n += line[len - 1] == '\n' && strstr(line, "\"type\":\"event\"") != NULL;
    free(line);
    fclose(f);
    return n;
}

static uint64_t read_idx(const mt__ring_t *r)
{
    return atomic_load_explicit(&mt__ring_header(r)->read_idx, memory_order_acquire);
}

/* A daemon with an NDJSON log in a directory of its own, on its thread, its encoder's flush
 * held; a ring of N events (alloc/free pairs), not yet registered. */
typedef struct fixture_s {
    th_daemon_t t;
    char dir[32], log[64];
    mt__ring_t *r;
} fixture_t;

static void fixture_start(fixture_t *f)
{
    snprintf(f->dir, sizeof f->dir, "/tmp/mt-dack-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->log, sizeof f->log, "%s/d.ndjson", f->dir);
    f->r = NULL;
    assert_int_equal(mt__ring_create(&f->r, SLOTS, "ack"), 0);
    mt_event_rec_t ev = {.pool = MT_POOL_SMALL, .tag = MT_TAG_ACTIVATIONS};
    for (uint32_t i = 0; i < N; i++) {
        ev.kind = i & 1 ? MT_EV_FREE_COMPLETED : MT_EV_ALLOC;
        ev.time_ns = 1000 + i;
        ev.addr = 0x100000 + 4096 * (uint64_t)(i / 2 % 64);
        ev.size = ev.requested = 4096;
        ev.allocated = i & 1 ? 0 : 4096;
        assert_int_equal(mt__ring_push(f->r, &ev), 0);
    }
    mt_d_cfg_t cfg = th_cfg();
    cfg.drain_budget = BUDGET; /* several ticks of two batches, each followed by another */
    cfg.log_path = f->log;
    th_daemon_create(&f->t, cfg);
    th_daemon_run(&f->t);
    test_thread = pthread_self();
    loop_thread = f->t.thread;
    atomic_store(&threads_known, true);
    gate_set(true);
}

/* Registers the ring; returns once the encoder stands in the held flush and the loop has
 * had time to go on as far as it can. */
static int fixture_register(fixture_t *f)
{
    int fd = -1;
    char err[256];
    assert_int_equal(mt__prof_client_register(f->t.sock, f->r, NULL, 5000, &fd, err, sizeof err),
                     0);
    assert_true(wait_held());
    usleep(100 * 1000);
    return fd;
}

/* Lets the encoder go; every event reaches the log once and the ring is acknowledged. */
static void fixture_finish(fixture_t *f, int fd)
{
    gate_set(false);
    for (int i = 0; i < 1000 && read_idx(f->r) < N; i++)
        usleep(10 * 1000);
    assert_int_equal(read_idx(f->r), N);
    assert_int_equal(events_in(f->log), N);
    close(fd);
    th_daemon_stop(&f->t);
    atomic_store(&threads_known, false);
    mt__ring_close(&f->r);
    unlink(f->log);
    rmdir(f->dir);
}

static void test_ack_follows_the_log(void **state)
{
    (void)state;
    fixture_t f;
    fixture_start(&f);
    int fd = fixture_register(&f);
    /* The encoder holds the first tick's last batch, written and not flushed; the loop went
     * on until no batch was free. Whatever it did, read_idx is within the file. */
    uint64_t acked = read_idx(f.r);
    uint64_t logged = events_in(f.log);
    assert_true(acked <= logged);
    assert_true(acked < N); /* the daemon stands: not everything went through */
    fixture_finish(&f, fd);
}

/* A consumer that hangs up while batches that name it are the encoder's: its connection is
 * freed only once they are back (under ASan, a use after free otherwise), and the daemon
 * goes on serving. */
static void test_consumer_gone_mid_flight(void **state)
{
    (void)state;
    fixture_t f;
    fixture_start(&f);
    int cons = th_consumer(f.t.sock, "");
    int fd = fixture_register(&f);
    close(cons); /* its EOF is seen between two ticks, batches in flight */
    gate_set(false);
    for (int i = 0; i < 1000 && read_idx(f.r) < N; i++)
        usleep(10 * 1000);
    int again = th_consumer(f.t.sock, ""); /* answered: the loop is alive */
    close(again);
    fixture_finish(&f, fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ack_follows_the_log),
        cmocka_unit_test(test_consumer_gone_mid_flight),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
