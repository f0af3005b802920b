/* The shared-memory event ring: order, wrap-around, drops and gaps, concurrent
 * writers, a consumer in another process, and a producer killed with SIGKILL (a thread
 * cache's compact batches: test_ring_batch.c). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "profiler/ring.h"
#include "tests/common/test_main.h"

#include "tests/prof/ring_test_util.h"

static void test_create_open_layout(void **state)
{
    (void)state;
    mt__ring_t *p = NULL, *c = NULL;
    assert_int_equal(mt__ring_create(&p, 100, "layout"), 0);
    const mt__ring_hdr_t *h = mt__ring_header(p);
    assert_int_equal(h->slots, 128); /* rounded up to a power of two */
    assert_int_equal(h->pid, getpid());
    assert_string_equal(h->comm, "layout");
    assert_non_null(strstr(mt__ring_name(p), "/memtrace."));
    assert_int_equal(mt__ring_open(&c, mt__ring_name(p)), 0);
    assert_int_equal(mt__ring_owner_uid(c), getuid());
    assert_int_equal(mt__ring_header(c)->slots, 128);
    /* The consumer unlinks; the mapping stays usable and a second open fails. */
    assert_int_equal(mt__ring_unlink(c), 0);
    mt__ring_t *again = NULL;
    assert_int_equal(mt__ring_open(&again, mt__ring_name(p)), MT_ENOENT);
    mt_event_rec_t ev = mkev(7);
    assert_int_equal(mt__ring_push(p, &ev), 0);
    collect_t col;
    collect_init(&col);
    assert_int_equal(mt__ring_drain(c, collect_cb, &col, 100), 1);
    assert_int_equal(col.evs[0].requested, 7);
    assert_int_equal(col.evs[0].seq, 0);
    mt__ring_close(&c);
    mt__ring_close(&p);
    assert_null(p);
    free(col.evs);
}

static void test_open_rejects_bad(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_open(&r, "/etc/passwd"), MT_EINVAL);
    assert_int_equal(mt__ring_open(&r, "/memtrace./x"), MT_EINVAL);
    assert_int_equal(mt__ring_open(&r, "/memtrace.none.0.0"), MT_ENOENT);
    /* An object with the right name but no ring in it. */
    char name[64];
    snprintf(name, sizeof(name), "/memtrace.test.%d.bad", (int)getpid());
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 4096), 0);
    close(fd);
    assert_int_equal(mt__ring_open(&r, name), MT_EPROTO);
    assert_null(r);
    shm_unlink(name);
}

static void test_wraparound(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 8, "wrap"), 0);
    collect_t col;
    collect_init(&col);
    /* 10 rounds of 5 through 8 slots: positions wrap many times, nothing is lost. */
    for (uint64_t round = 0; round < 10; round++) {
        for (uint64_t i = 0; i < 5; i++) {
            mt_event_rec_t ev = mkev(round * 5 + i);
            assert_int_equal(mt__ring_push(r, &ev), 0);
        }
        assert_int_equal(mt__ring_drain(r, collect_cb, &col, SIZE_MAX), 5);
    }
    assert_int_equal(col.n, 50);
    assert_int_equal(col.ngaps, 0);
    for (size_t i = 0; i < col.n; i++) {
        assert_int_equal(col.evs[i].seq, i);
        assert_int_equal(col.evs[i].requested, i);
    }
    assert_true(mt__ring_empty(r));
    mt__ring_stats_t st;
    mt__ring_stats(r, &st);
    assert_int_equal(st.emitted, 50);
    assert_int_equal(st.delivered, 50);
    assert_int_equal(st.dropped, 0);
    mt__ring_close(&r);
    free(col.evs);
}

/* Deferred acknowledgement: a drain moves the consumer's own position, read_idx moves only
 * at mt__ring_ack (the daemon acknowledges once its log is written, so that a producer
 * taking over after a SIGKILL starts at what the log does not hold). */
static void test_deferred_ack(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 256, "defer"), 0);
    mt__ring_defer_ack(r);
    collect_t col;
    collect_init(&col);
    for (uint64_t i = 0; i < 100; i++) {
        mt_event_rec_t ev = mkev(i);
        assert_int_equal(mt__ring_push(r, &ev), 0);
    }
    assert_int_equal(mt__ring_drain(r, collect_cb, &col, SIZE_MAX), 100);
    mt__ring_stats_t st;
    mt__ring_stats(r, &st);
    assert_int_equal(st.read, 0); /* not past the 64-record publication point either */
    assert_true(mt__ring_empty(r));
    assert_int_equal(mt__ring_drain(r, collect_cb, &col, SIZE_MAX), 0); /* not delivered twice */
    mt__ring_ack(r);
    mt__ring_stats(r, &st);
    assert_int_equal(st.read, 100);
    for (uint64_t i = 100; i < 110; i++) {
        mt_event_rec_t ev = mkev(i);
        assert_int_equal(mt__ring_push(r, &ev), 0);
    }
    assert_int_equal(mt__ring_drain(r, collect_cb, &col, 4), 4);
    assert_int_equal(mt__ring_drain(r, collect_cb, &col, SIZE_MAX), 6);
    mt__ring_stats(r, &st);
    assert_int_equal(st.read, 100);
    mt__ring_ack(r);
    mt__ring_stats(r, &st);
    assert_int_equal(st.read, 110);
    assert_int_equal(col.n, 110);
    for (size_t i = 0; i < col.n; i++)
        assert_int_equal(col.evs[i].seq, i);
    mt__ring_close(&r);
    free(col.evs);
}

static void test_drops_and_gap(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 8, "drops"), 0);
    for (uint64_t i = 0; i < 8; i++) {
        mt_event_rec_t ev = mkev(i);
        assert_int_equal(mt__ring_push(r, &ev), 0);
    }
    /* Full: the next three are dropped, but still take seqs 8, 9, 10. */
    for (uint64_t i = 8; i < 11; i++) {
        mt_event_rec_t ev = mkev(i);
        assert_int_equal(mt__ring_push(r, &ev), MT_EAGAIN);
    }
    collect_t col;
    collect_init(&col);
    /* max bounds the batch. */
    assert_int_equal(mt__ring_drain(r, collect_cb, &col, 3), 3);
    assert_int_equal(mt__ring_drain(r, collect_cb, &col, SIZE_MAX), 5);
    mt_event_rec_t ev = mkev(11);
    assert_int_equal(mt__ring_push(r, &ev), 0);
    assert_int_equal(mt__ring_drain(r, collect_cb, &col, SIZE_MAX), 1);
    assert_int_equal(col.n, 9);
    assert_int_equal(col.evs[7].seq, 7);
    assert_int_equal(col.evs[8].seq, 11); /* the hole 8..10 */
    assert_int_equal(col.gaps, 3);
    assert_int_equal(col.ngaps, 1);
    /* Announced before the first event after it, or at the end of the drain that
     * emptied the ring: either way after seq 7 and before seq 11 is read. */
    assert_int_equal(col.gap_before, 8);
    mt__ring_stats_t st;
    mt__ring_stats(r, &st);
    assert_int_equal(st.dropped, 3);
    assert_int_equal(st.emitted, 12);
    mt__ring_close(&r);
    free(col.evs);
}

/* ---- concurrent writers ---- */

#define NTHREADS   4
#define PER_THREAD 20000

typedef struct writer_s {
    mt__ring_t *r;
    int id;
    uint64_t dropped;
} writer_t;

static void *writer_main(void *arg)
{
    writer_t *w = arg;
    for (uint64_t i = 0; i < PER_THREAD; i++) {
        mt_event_rec_t ev = mkev(i);
        ev.device = (uint8_t)w->id;
        if (mt__ring_push(w->r, &ev) == MT_EAGAIN)
            w->dropped++;
    }
    return NULL;
}

typedef struct seen_s {
    uint8_t *seen; /* by seq */
    uint64_t count, dups, gaps;
    uint64_t next_req[NTHREADS]; /* per writer: its own events stay in order */
    uint64_t disorder;
    uint64_t last_seq, global_disorder; /* seqs must increase in ring order too */
    bool any;
} seen_t;

static void seen_cb(void *ud, const mt_event_rec_t *ev)
{
    seen_t *s = ud;
    if (ev->kind == MT_EV_GAP) {
        s->gaps += ev->size;
        return;
    }
    if (ev->seq >= NTHREADS * PER_THREAD || s->seen[ev->seq]++)
        s->dups++;
    if (ev->requested < s->next_req[ev->device])
        s->disorder++;
    s->next_req[ev->device] = ev->requested + 1;
    if (s->any && ev->seq <= s->last_seq)
        s->global_disorder++;
    s->last_seq = ev->seq;
    s->any = true;
    s->count++;
}

static void test_concurrent_writers(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 1024, "mpsc"), 0);
    seen_t s;
    memset(&s, 0, sizeof(s));
    s.seen = calloc(NTHREADS * PER_THREAD, 1);
    pthread_t th[NTHREADS];
    writer_t w[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        w[i] = (writer_t){.r = r, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, writer_main, &w[i]), 0);
    }
    /* Drain while they write (the small ring forces both drops and wrap-around). */
    int running = NTHREADS;
    while (running) {
        mt__ring_drain(r, seen_cb, &s, SIZE_MAX);
        mt__ring_stats_t st;
        mt__ring_stats(r, &st);
        if (st.emitted == NTHREADS * PER_THREAD)
            running = 0;
    }
    uint64_t dropped = 0;
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(th[i], NULL);
        dropped += w[i].dropped;
    }
    while (mt__ring_drain(r, seen_cb, &s, SIZE_MAX) > 0) {
    }
    mt__ring_stats_t st;
    mt__ring_stats(r, &st);
    assert_int_equal(s.dups, 0);
    assert_int_equal(s.disorder, 0);
    assert_int_equal(s.global_disorder, 0);
    assert_int_equal(st.dropped, dropped);
    assert_int_equal(st.lost, 0);
    /* Every seq seen exactly once or counted dropped, and the gaps say how many. */
    assert_int_equal(s.count + dropped, NTHREADS * PER_THREAD);
    assert_int_equal(s.gaps, dropped);
    uint64_t unseen = 0;
    for (uint64_t i = 0; i < NTHREADS * PER_THREAD; i++)
        unseen += !s.seen[i];
    assert_int_equal(unseen, dropped);
    mt__ring_close(&r);
    free(s.seen);
}

/* ---- a producer in another process, killed with SIGKILL ---- */

static void test_producer_sigkill(void **state)
{
    (void)state;
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        mt__ring_t *r = NULL;
        if (mt__ring_create(&r, 256, "victim") != 0)
            _exit(1);
        for (uint64_t i = 0; i < 100; i++) {
            mt_event_rec_t ev = mkev(i);
            mt__ring_push(r, &ev);
        }
        /* Die in the middle of a write: slot claimed, never published. */
        mt_event_rec_t *slot;
        uint64_t pos;
        mt__ring_reserve(r, &slot, &pos);
        slot->kind = MT_EV_FREE_REQUESTED;
        char name[MT_RING_NAME_MAX];
        snprintf(name, sizeof(name), "%s", mt__ring_name(r));
        ssize_t w = write(pfd[1], name, sizeof(name));
        (void)w;
        for (;;)
            pause();
    }
    close(pfd[1]);
    char name[MT_RING_NAME_MAX];
    assert_int_equal(read(pfd[0], name, sizeof(name)), (ssize_t)sizeof(name));
    close(pfd[0]);
    mt__ring_t *c = NULL;
    assert_int_equal(mt__ring_open(&c, name), 0);
    assert_int_equal(mt__ring_unlink(c), 0); /* as the daemon does: no name left behind */
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));

    collect_t col;
    collect_init(&col);
    mt__ring_mark_dead(c);
    assert_int_equal(mt__ring_drain(c, collect_cb, &col, SIZE_MAX), 100);
    assert_int_equal(col.n, 100);
    for (size_t i = 0; i < 100; i++)
        assert_int_equal(col.evs[i].requested, i);
    /* The half-written slot is skipped, counted lost and announced as a gap. */
    assert_int_equal(col.gaps, 1);
    assert_true(mt__ring_empty(c));
    mt__ring_stats_t st;
    mt__ring_stats(c, &st);
    assert_int_equal(st.lost, 1);
    assert_int_equal(st.flags & MT_RING_F_EXITED, 0);
    mt__ring_close(&c);
    free(col.evs);
}

/* A live producer stalled mid-write holds the consumer only for the stuck timeout. */
static void test_stuck_slot_timeout(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 16, "stuck"), 0);
    mt__ring_set_stuck_timeout(r, 1000000); /* 1 ms */
    mt_event_rec_t *slot;
    uint64_t pos;
    assert_int_equal(mt__ring_reserve(r, &slot, &pos), 0);
    mt_event_rec_t ev = mkev(1);
    assert_int_equal(mt__ring_push(r, &ev), 0);
    collect_t col;
    collect_init(&col);
    assert_int_equal(mt__ring_drain(r, collect_cb, &col, SIZE_MAX), 0); /* waits */
    assert_int_equal(col.ngaps, 0);
    usleep(5000);
    assert_int_equal(mt__ring_drain(r, collect_cb, &col, SIZE_MAX), 1);
    assert_int_equal(col.gaps, 1);
    assert_int_equal(col.evs[0].seq, 1);
    mt__ring_close(&r);
    free(col.evs);
}

/* push_n: one claim for one operation's events, consecutive seqs; when the ring has room
 * for only part of a batch, what fits is recorded and the rest dropped, seen as a gap. */
static void test_push_batches(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 8, "batch"), 0);
    mt_event_rec_t ev[2];
    uint64_t i = 0;
    for (int k = 0; k < 4; k++) { /* 8 events: exactly full */
        ev[0] = mkev(i++);
        ev[1] = mkev(i++);
        assert_int_equal(mt__ring_push_n(r, ev, 2), 0);
    }
    ev[0] = mkev(100);
    ev[1] = mkev(101);
    assert_int_equal(mt__ring_push_n(r, ev, 2), 2); /* full: both dropped */
    collect_t c;
    collect_init(&c);
    assert_int_equal(mt__ring_drain(r, collect_cb, &c, SIZE_MAX), 8);
    for (size_t k = 0; k < 8; k++) {
        assert_int_equal(c.evs[k].seq, k);
        assert_int_equal(c.evs[k].requested, k);
    }
    assert_int_equal(c.gaps, 2);
    /* 7 of 8 used: a batch of two records its first event and drops the second. */
    for (int k = 0; k < 7; k++) {
        ev[0] = mkev(i++);
        assert_int_equal(mt__ring_push_n(r, ev, 1), 0);
    }
    ev[0] = mkev(200);
    ev[1] = mkev(201);
    assert_int_equal(mt__ring_push_n(r, ev, 2), 1);
    collect_t d;
    collect_init(&d);
    assert_int_equal(mt__ring_drain(r, collect_cb, &d, SIZE_MAX), 8);
    for (size_t k = 0; k < 8; k++) /* seqs go on after the two dropped ones */
        assert_int_equal(d.evs[k].seq, 10 + k);
    assert_int_equal(d.evs[7].requested, 200);
    assert_int_equal(d.gaps, 1);
    mt__ring_stats_t st;
    mt__ring_stats(r, &st);
    assert_int_equal(st.dropped, 3);
    assert_int_equal(st.emitted, 19);
    assert_int_equal(st.delivered, 16);
    free(c.evs);
    free(d.evs);
    mt__ring_close(&r);
}

/* Objects in /dev/shm named for process pid's rings. */
static int shm_objects_of(pid_t pid)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "memtrace.%u.%d.", (unsigned)getuid(), (int)pid);
    DIR *d = opendir("/dev/shm");
    if (d == NULL)
        return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* A file size limit (ulimit -f) below the ring: sizing the file past it would raise
 * SIGXFSZ and kill the program. Create refuses by name, makes nothing, and a ring that
 * mt__ring_fit shrinks is made. Run in a child: the limit is per process. */
static void test_fsize_limit(void **state)
{
    (void)state;
    const size_t area = (size_t)20 << 20; /* the stack table's order of size */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {.rlim_cur = 1 << 20, .rlim_max = RLIM_INFINITY};
        if (getrlimit(RLIMIT_FSIZE, &rl) == 0)
            rl.rlim_cur = 1 << 20;
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(10);
        mt__ring_t *r = NULL;
        if (mt__ring_fsize_limit() != 1 << 20)
            _exit(11);
        if (mt__ring_create_ex(&r, MT_RING_DEFAULT_SLOTS, "fsize", false, area) != MT_EFBIG ||
            r != NULL)
            _exit(12);
        if (mt__ring_create_ex(&r, MT_RING_DEFAULT_SLOTS, "fsize", true, area) != MT_EFBIG)
            _exit(13);
        uint32_t slots = MT_RING_DEFAULT_SLOTS;
        size_t a = area;
        if (mt__ring_fit(1 << 20, &slots, &a) != 0 || a != 0 || slots >= MT_RING_DEFAULT_SLOTS ||
            mt__ring_file_size(slots, a) > 1 << 20 || mt__ring_file_size(slots * 2, a) <= 1 << 20)
            _exit(14);
        if (mt__ring_create_ex(&r, slots, "fsize", false, a) != 0)
            _exit(15);
        mt_event_rec_t ev = mkev(1);
        if (mt__ring_push(r, &ev) != 0)
            _exit(16);
        mt__ring_close(&r);
        /* Nothing at all fits a limit below the smallest ring. */
        slots = MT_RING_DEFAULT_SLOTS;
        a = 0;
        if (mt__ring_fit(mt__ring_file_size(MT_RING_MIN_SLOTS, 0) - 1, &slots, &a) != MT_EFBIG)
            _exit(17);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st))
        fail_msg("the child was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_int_equal(shm_objects_of(pid), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fsize_limit),        cmocka_unit_test(test_create_open_layout),
        cmocka_unit_test(test_open_rejects_bad),   cmocka_unit_test(test_wraparound),
        cmocka_unit_test(test_deferred_ack),       cmocka_unit_test(test_drops_and_gap),
        cmocka_unit_test(test_concurrent_writers), cmocka_unit_test(test_producer_sigkill),
        cmocka_unit_test(test_stuck_slot_timeout), cmocka_unit_test(test_push_batches),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
