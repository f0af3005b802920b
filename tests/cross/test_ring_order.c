/* The event ring's ordering (profiler/ring.c), on any ISA and under qemu-aarch64:
 * - a record published just before its producer exits or dies is delivered, not skipped
 *   as unpublished (the consumer reads the commit word again after it learns of the end);
 * - producers on several threads and a consumer on another: every record delivered whole
 *   (its fields agree with each other), in each producer's order, none lost. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/test_main.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "profiler/ring.h"

/* ---- kill(): the consumer's "is the producer alive?" ----
 * The ring asks with kill(pid, 0) after reading a commit word it found unpublished. This
 * definition stands in for libc's in this program (the ring is linked in statically), so a
 * test can make the producer publish and die exactly between those two steps. */
static struct {
    mt__ring_t *r;
    uint64_t pos;
    bool armed;
} die_after_publish;

int kill(pid_t pid, int sig)
{
    if (die_after_publish.armed && sig == 0 && pid == getpid()) {
        die_after_publish.armed = false;
        mt__ring_commit(die_after_publish.r, die_after_publish.pos);
        errno = ESRCH;
        return -1;
    }
    return (int)syscall(SYS_kill, pid, sig);
}

static mt_event_rec_t mkev(uint64_t producer, uint64_t i)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = MT_EV_ALLOC;
    ev.pool = MT_POOL_LARGE;
    ev.addr = producer << 40 | i;
    ev.size = 512;
    /* Derived from addr: a record mixing two writes disagrees with itself. */
    ev.requested = ev.addr * 0x9E3779B97F4A7C15ull;
    ev.allocated = ~ev.addr;
    ev.reserved = ev.addr ^ 0x5555555555555555ull;
    ev.time_ns = ev.addr + 7;
    return ev;
}

static bool whole(const mt_event_rec_t *ev)
{
    return ev->requested == ev->addr * 0x9E3779B97F4A7C15ull && ev->allocated == ~ev->addr &&
           ev->reserved == (ev->addr ^ 0x5555555555555555ull) && ev->time_ns == ev->addr + 7;
}

typedef struct sink_s {
    uint64_t n, torn, gaps;
    uint64_t next[4]; /* per producer: the i expected next at least */
    uint64_t order;   /* records of a producer that came before an earlier one of it */
} sink_t;

static void sink_cb(void *ud, const mt_event_rec_t *ev)
{
    sink_t *s = ud;
    if (ev->kind == MT_EV_GAP) {
        s->gaps += ev->size;
        return;
    }
    s->n++;
    if (!whole(ev)) {
        s->torn++;
        return;
    }
    uint64_t p = ev->addr >> 40, i = ev->addr & ((1ull << 40) - 1);
    if (p >= 4 || i < s->next[p])
        s->order++;
    else
        s->next[p] = i + 1;
}

/* The producer publishes its slot and dies between the consumer's read of the commit word
 * and its check for a live producer: the record is there, and delivered. Before the
 * consumer read the word again, it was skipped and counted lost. */
static void test_published_then_died(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create_private(&r, 16, "died"), 0);
    mt_event_rec_t *slot;
    uint64_t pos;
    assert_int_equal(mt__ring_reserve(r, &slot, &pos), 0);
    uint64_t seq = slot->seq;
    *slot = mkev(1, 0);
    slot->seq = seq;
    die_after_publish.r = r;
    die_after_publish.pos = pos;
    die_after_publish.armed = true;
    sink_t s = {0};
    assert_int_equal(mt__ring_drain(r, sink_cb, &s, SIZE_MAX), 1);
    assert_false(die_after_publish.armed); /* the consumer did ask */
    mt__ring_stats_t st;
    mt__ring_stats(r, &st);
    assert_int_equal(st.lost, 0);
    assert_int_equal(st.delivered, 1);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.torn, 0);
    assert_int_equal(s.gaps, 0);
    assert_true(mt__ring_empty(r));
    mt__ring_close(&r);
}

/* ---- threads ---- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef struct prod_s {
    mt__ring_t *r;
    uint64_t id, n;
    _Atomic uint64_t dropped; /* read by the consumer meanwhile */
    bool exit_flag;           /* set MT_RING_F_EXITED after the last push */
    atomic_int *go;
} prod_t;

static void *producer(void *arg)
{
    prod_t *p = arg;
    while (!atomic_load(p->go))
        ;
    for (uint64_t i = 0; i < p->n; i++) {
        /* Room for the batch first, as far as this thread can tell (the other producer may
         * take it: then the ring drops, and the count says so). */
        mt__ring_stats_t st;
        for (unsigned spins = 0;; spins++) {
            mt__ring_stats(p->r, &st);
            if (st.claimed - st.read + 2 <= st.slots)
                break;
            if (spins > 64)
                sched_yield();
        }
        mt_event_rec_t ev[2] = {mkev(p->id, 2 * i), mkev(p->id, 2 * i + 1)};
        atomic_fetch_add(&p->dropped, mt__ring_push_n(p->r, ev, 2));
    }
    if (p->exit_flag)
        mt__ring_set_flags(p->r, MT_RING_F_EXITED);
    return NULL;
}

/* Two producers and this thread as the consumer, on a ring small enough to wrap many
 * times: each record arrives whole and in its producer's order, and what was not
 * delivered is exactly what the producers dropped. */
static void test_mpsc_stress(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create_private(&r, 64, "mpsc"), 0);
    mt__ring_set_stuck_timeout(r, UINT64_MAX); /* producers are alive: never skip */
    atomic_int go = 0;
    prod_t p[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        p[k] = (prod_t){.r = r, .id = (uint64_t)k, .n = 5000, .go = &go};
        atomic_init(&p[k].dropped, 0);
        assert_int_equal(pthread_create(&th[k], NULL, producer, &p[k]), 0);
    }
    sink_t s = {0};
    atomic_store(&go, 1);
    uint64_t t0 = now_ns();
    for (;;) {
        int n = mt__ring_drain(r, sink_cb, &s, SIZE_MAX);
        assert_true(n >= 0);
        if (s.n + atomic_load(&p[0].dropped) + atomic_load(&p[1].dropped) == 4 * p[0].n &&
            mt__ring_empty(r))
            break;
        assert_true(now_ns() - t0 < 60ull * 1000000000ull); /* no record stays unpublished */
    }
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    mt__ring_stats_t st;
    mt__ring_stats(r, &st);
    print_message("mpsc: %llu delivered, %llu dropped\n", (unsigned long long)s.n,
                  (unsigned long long)st.dropped);
    assert_int_equal(s.torn, 0);
    assert_int_equal(s.order, 0);
    assert_int_equal(st.lost, 0);
    assert_int_equal(st.dropped, p[0].dropped + p[1].dropped);
    assert_int_equal(s.n + st.dropped, 4 * p[0].n);
    assert_true(s.n > 0);
    mt__ring_close(&r);
}

/* A producer's last records, then its exit flag, while the consumer drains: every round,
 * the consumer that sees the flag still finds the records published before it. */
static void test_exit_flag_rounds(void **state)
{
    (void)state;
    uint64_t lost = 0, rounds = 0, t0 = now_ns();
    for (; rounds < 3000 && now_ns() - t0 < 3ull * 1000000000ull; rounds++) {
        mt__ring_t *r = NULL;
        assert_int_equal(mt__ring_create_private(&r, 16, "exit"), 0);
        atomic_int go = 0;
        prod_t p = {.r = r, .id = 0, .n = 1, .exit_flag = true, .go = &go};
        atomic_init(&p.dropped, 0);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, producer, &p), 0);
        sink_t s = {0};
        atomic_store(&go, 1);
        mt__ring_stats_t st;
        do {
            assert_true(mt__ring_drain(r, sink_cb, &s, SIZE_MAX) >= 0);
            mt__ring_stats(r, &st);
        } while (!(st.flags & MT_RING_F_EXITED) || !mt__ring_empty(r));
        pthread_join(th, NULL);
        lost += st.lost;
        assert_int_equal(s.torn, 0);
        mt__ring_close(&r);
    }
    print_message("exit flag: %llu rounds\n", (unsigned long long)rounds);
    assert_int_equal(lost, 0);
    assert_true(rounds >= 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_then_died),
        cmocka_unit_test(test_mpsc_stress),
        cmocka_unit_test(test_exit_flag_rounds),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
