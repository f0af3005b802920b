/* A ring's read_idx never passes what is in the daemon's log file, now that a drain tick
 * which another follows hands its last batch to the encoder without waiting for it
 * (daemon/lines.c): the rings are acknowledged only when that batch is back, written and
 * flushed. A producer that takes over after the daemon dies starts its local log at
 * read_idx, so an acknowledgement ahead of the file loses events.
 *
 * The encoder's flush is held (fflush is wrapped at link time, -Wl,--wrap=fflush): the
 * daemon then stands with batches written to stdio but not flushed, and the file on disk
 * must hold at least read_idx events. Released, every event is in the file once. */
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

static void test_ack_follows_the_log(void **state)
{
    (void)state;
    th_daemon_t t;
    mt_d_cfg_t cfg = th_cfg();
    char dir[] = "/tmp/mt-dack-XXXXXX", log[64];
    assert_non_null(mkdtemp(dir));
    snprintf(log, sizeof log, "%s/d.ndjson", dir);
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, SLOTS, "ack"), 0);
    mt_event_rec_t ev = {.pool = MT_POOL_SMALL, .tag = MT_TAG_ACTIVATIONS};
    for (uint32_t i = 0; i < N; i++) {
        ev.kind = i & 1 ? MT_EV_FREE_COMPLETED : MT_EV_ALLOC;
        ev.time_ns = 1000 + i;
        ev.addr = 0x100000 + 4096 * (uint64_t)(i / 2 % 64);
        ev.size = ev.requested = 4096;
        ev.allocated = i & 1 ? 0 : 4096;
        assert_int_equal(mt__ring_push(r, &ev), 0);
    }
    /* several ticks, each of two batches: ticks that others follow at once */
    cfg.drain_budget = BUDGET;
    cfg.log_path = log;
    th_daemon_create(&t, cfg);
    th_daemon_run(&t);
    test_thread = pthread_self();
    loop_thread = t.thread;
    atomic_store(&threads_known, true);
    gate_set(true);

    int fd = -1;
    char err[256];
    assert_int_equal(mt__prof_client_register(t.sock, r, NULL, 5000, &fd, err, sizeof err), 0);
    /* The encoder holds the first tick's last batch, written and not flushed; the loop goes
     * on until no batch is free. Whatever it did, read_idx is within the file. */
    assert_true(wait_held());
    usleep(100 * 1000);
    uint64_t acked = read_idx(r);
    uint64_t logged = events_in(log);
    assert_true(acked <= logged);
    assert_true(acked < N); /* the daemon stands: not everything went through */

    gate_set(false);
    for (int i = 0; i < 1000 && read_idx(r) < N; i++)
        usleep(10 * 1000);
    assert_int_equal(read_idx(r), N);
    assert_int_equal(events_in(log), N);

    close(fd);
    th_daemon_stop(&t);
    atomic_store(&threads_known, false);
    mt__ring_close(&r);
    unlink(log);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ack_follows_the_log),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
