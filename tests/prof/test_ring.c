/* The shared-memory event ring: order, wrap-around, drops and gaps, concurrent
 * writers, a consumer in another process, and a producer killed with SIGKILL. */
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

typedef struct collect_s {
    mt_event_rec_t *evs; /* events delivered, in order */
    size_t n, cap;
    uint64_t gaps;  /* sum of gap sizes */
    size_t ngaps;   /* number of gap records */
    int gap_before; /* index in evs before which the first gap arrived; -1 none */
} collect_t;

static void collect_cb(void *ud, const mt_event_rec_t *ev)
{
    collect_t *c = ud;
    if (ev->kind == MT_EV_GAP) {
        if (c->ngaps == 0)
            c->gap_before = (int)c->n;
        c->gaps += ev->size;
        c->ngaps++;
        return;
    }
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->evs = realloc(c->evs, c->cap * sizeof(*c->evs));
        assert_non_null(c->evs);
    }
    c->evs[c->n++] = *ev;
}

static void collect_init(collect_t *c)
{
    memset(c, 0, sizeof(*c));
    c->gap_before = -1;
}

static mt_event_rec_t mkev(uint64_t i)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof(ev));
    ev.kind = MT_EV_ALLOC;
    ev.addr = 0x1000 + i * 512;
    ev.size = 512;
    ev.requested = i;
    ev.time_ns = i;
    return ev;
}

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

/* ---- a thread cache's batches (util/evbatch.h) ---- */

/* The ring's slot and commit word of pos, by the layout ring.h gives. */
static mt_event_rec_t *slot_at(mt__ring_t *r, uint64_t pos)
{
    const mt__ring_hdr_t *h = mt__ring_header(r);
    size_t commit = ((size_t)h->slots * 8 + 63) & ~(size_t)63;
    return (mt_event_rec_t *)(void *)((char *)(uintptr_t)h + MT_RING_HEADER_SIZE + commit) +
           (pos & (h->slots - 1));
}

static uint64_t commit_at(mt__ring_t *r, uint64_t pos)
{
    const mt__ring_hdr_t *h = mt__ring_header(r);
    const _Atomic uint64_t *c =
        (const _Atomic uint64_t *)(const void *)((const char *)h + MT_RING_HEADER_SIZE);
    return atomic_load(&c[pos & (h->slots - 1)]);
}

/* A batch of nent entries, their ops cycling from op0 (STACK, POP, FREE, POP_FREE), the
 * last one no STACK. */
static void mkbatch(mt__evb_hdr_t *h, mt__evb_ent_t *e, uint32_t nent, unsigned op0, uint64_t t)
{
    uint32_t nev = 0;
    for (uint32_t i = 0; i < nent; i++) {
        uint8_t op = (uint8_t)(MT__EVB_STACK + (op0 + i) % 4);
        if (op == MT__EVB_STACK && i + 1 == nent)
            op = MT__EVB_POP; /* a stack ref comes before its alloc */
        e[i] = (mt__evb_ent_t){.addr = 0x100000 + i * 4096,
                               .size = op == MT__EVB_STACK ? 5 + i : 4096,
                               .requested = op == MT__EVB_STACK ? 0 : 1000 + i,
                               .stream = 7,
                               .op = op,
                               .pool = MT_POOL_SMALL,
                               .tag = (uint8_t)(i % 3)};
        nev += mt__evb_op_events(op);
    }
    *h = (mt__evb_hdr_t){.time_ns = t,
                         .allocated0 = 1 << 20,
                         .reserved = 2 << 20,
                         .nent = nent,
                         .nev = nev,
                         .device = 1};
}

/* Claims and writes the batch as the profiler's sink does; returns its position, or
 * UINT64_MAX when the claim failed. */
static uint64_t put_batch(mt__ring_t *r, const mt__evb_hdr_t *h, const mt__evb_ent_t *e)
{
    uint64_t tok[2];
    mt__ring_claim(r, h->nev, tok);
    mt__ring_write_batch(r, tok, h, e);
    return tok[1] == UINT64_MAX ? UINT64_MAX : tok[0];
}

/* Appends the events the batch stands for, from seq0, to c. */
static void expect_batch(collect_t *c, const mt__evb_hdr_t *h, const mt__evb_ent_t *e,
                         uint64_t seq0)
{
    assert_int_equal(mt__evb_expand(h, e, seq0, collect_cb, c), 0);
}

static void assert_same(const collect_t *got, const collect_t *want)
{
    assert_int_equal(got->n, want->n);
    for (size_t i = 0; i < got->n; i++)
        assert_memory_equal(&got->evs[i], &want->evs[i], sizeof(mt_event_rec_t));
}

/* A batch drained gives its expansion with seqs from the claim's; it writes only its
 * first k slots (the last one's unused half zeroed) and publishes only its first. */
static void test_batch_roundtrip(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 64, "evb"), 0);
    collect_t got, want;
    collect_init(&got);
    collect_init(&want);
    /* A lap of plain records first: the batch's slots hold old bytes. */
    for (uint64_t i = 0; i < 64; i++) {
        mt_event_rec_t ev = mkev(i);
        ev.stream = 0xffffffffu;
        assert_int_equal(mt__ring_push(r, &ev), 0);
    }
    assert_int_equal(mt__ring_drain(r, collect_cb, &want, SIZE_MAX), 64);
    free(want.evs);
    collect_init(&want);
    mt__evb_hdr_t h;
    mt__evb_ent_t e[9];
    mkbatch(&h, e, 9, 0, 555); /* 9 entries, 15 events, 6 slots */
    assert_int_equal(h.nev, 15);
    size_t k = mt__evb_slots(h.nent);
    uint64_t pos = put_batch(r, &h, e);
    assert_int_equal(pos, 64);
    assert_int_equal(commit_at(r, pos), pos + 1);
    for (uint64_t p = pos + 1; p < pos + h.nev; p++) /* never published */
        assert_int_equal(commit_at(r, p), p - 64 + 1);
    for (uint64_t p = pos + k; p < pos + h.nev; p++) /* never written */
        assert_int_equal(slot_at(r, p)->stream, 0xffffffffu);
    static const mt__evb_ent_t zero;
    assert_memory_equal((mt__evb_ent_t *)(void *)slot_at(r, pos + k - 1) + 1, &zero, sizeof zero);
    assert_int_equal(mt__ring_drain(r, collect_cb, &got, SIZE_MAX), 15);
    expect_batch(&want, &h, e, 64);
    assert_same(&got, &want);
    assert_int_equal(got.ngaps, 0);
    assert_int_equal(got.evs[14].seq, 78);
    mt__ring_stats_t st;
    mt__ring_stats(r, &st);
    assert_int_equal(st.read, 79);
    assert_int_equal(st.delivered, 79);
    assert_int_equal(st.lost, 0);
    assert_true(mt__ring_empty(r));
    free(got.evs);
    free(want.evs);
    mt__ring_close(&r);
}

/* A POP_FREE's repeats (a loop's pairs, one entry): rep + 1 pairs of events, the
 * program's bytes back where they were after each; rep on any other op is no producer's. */
static void test_batch_repeats(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 64, "evbrep"), 0);
    mt__evb_hdr_t h;
    mt__evb_ent_t e[5];
    mkbatch(&h, e, 5, 3, 9); /* POP_FREE, STACK, POP, FREE, POP_FREE: 10 events */
    assert_int_equal(h.nev, 10);
    e[0].rep = 4;
    e[4].rep = 2;
    h.nev += 3 * 4 + 3 * 2;
    assert_int_equal(mt__evb_ent_events(&e[0]), 15);
    uint64_t pos = put_batch(r, &h, e);
    assert_int_equal(pos, 0);
    collect_t got, want;
    collect_init(&got);
    collect_init(&want);
    assert_int_equal(mt__ring_drain(r, collect_cb, &got, SIZE_MAX), 28);
    expect_batch(&want, &h, e, 0);
    assert_same(&got, &want);
    for (int i = 0; i < 15; i++) { /* the first entry's five pairs */
        const mt_event_rec_t *ev = &got.evs[i];
        assert_int_equal(ev->kind, i % 3 == 0   ? MT_EV_ALLOC
                                   : i % 3 == 1 ? MT_EV_FREE_REQUESTED
                                                : MT_EV_FREE_COMPLETED);
        assert_int_equal(ev->addr, e[0].addr);
        assert_int_equal(ev->seq, (uint64_t)i);
        assert_int_equal(ev->allocated, i % 3 == 0 ? (1u << 20) + 4096 : 1u << 20);
    }
    assert_int_equal(got.evs[27].kind, MT_EV_FREE_COMPLETED);
    assert_int_equal(got.evs[27].addr, e[4].addr);
    assert_int_equal(got.ngaps, 0);
    free(got.evs);
    free(want.evs);
    /* rep on a STACK, a POP or a FREE: the batch is refused whole */
    for (int i = 1; i <= 3; i++) {
        mkbatch(&h, e, 5, 3, 9);
        e[i].rep = 1;
        h.nev += mt__evb_op_events(e[i].op);
        collect_init(&got);
        assert_int_equal(mt__evb_expand(&h, e, 0, collect_cb, &got), MT_EPROTO);
        assert_int_equal(got.n, 0);
        free(got.evs);
    }
    mt__ring_close(&r);
}

/* Batches among plain records, one with its payload wrapping round the ring's end,
 * another with its header in the last slot: one order, consecutive seqs. */
static void test_batch_interleaved_wrap(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 16, "evbwrap"), 0);
    collect_t got, want;
    collect_init(&got);
    collect_init(&want);
    for (uint64_t i = 0; i < 13; i++) {
        mt_event_rec_t ev = mkev(i);
        assert_int_equal(mt__ring_push(r, &ev), 0);
    }
    assert_int_equal(mt__ring_drain(r, collect_cb, &want, SIZE_MAX), 13);
    free(want.evs);
    collect_init(&want);
    mt__evb_hdr_t h1, h2;
    mt__evb_ent_t e1[8], e2[3];
    mkbatch(&h1, e1, 8, 1, 10);
    assert_int_equal(h1.nev, 14);
    mt_event_rec_t ev = mkev(100);
    assert_int_equal(mt__ring_push(r, &ev), 0); /* 13 */
    ev.seq = 13;
    collect_cb(&want, &ev);
    assert_int_equal(put_batch(r, &h1, e1), 14); /* header in slot 14, payload 15, 0, 1, 2 */
    expect_batch(&want, &h1, e1, 14);
    assert_int_equal(mt__ring_drain(r, collect_cb, &got, SIZE_MAX), 15);
    mt_event_rec_t three[3] = {mkev(101), mkev(102), mkev(103)};
    assert_int_equal(mt__ring_push_n(r, three, 2), 0); /* 28, 29 */
    assert_int_equal(mt__ring_push(r, &three[2]), 0);  /* 30 */
    for (int i = 0; i < 3; i++) {
        three[i].seq = 28 + (uint64_t)i;
        collect_cb(&want, &three[i]);
    }
    mkbatch(&h2, e2, 3, 3, 20);
    assert_int_equal(put_batch(r, &h2, e2), 31); /* header in slot 15, payload 0, 1 */
    expect_batch(&want, &h2, e2, 31);
    ev = mkev(104);
    assert_int_equal(mt__ring_push(r, &ev), 0);
    ev.seq = 31 + h2.nev;
    collect_cb(&want, &ev);
    assert_int_equal(mt__ring_drain(r, collect_cb, &got, SIZE_MAX), (int)(4 + h2.nev));
    assert_same(&got, &want);
    for (size_t i = 0; i < got.n; i++)
        assert_int_equal(got.evs[i].seq, 13 + i);
    assert_int_equal(got.ngaps, 0);
    assert_true(mt__ring_empty(r));
    free(got.evs);
    free(want.evs);
    mt__ring_close(&r);
}

/* A batch that finds no room is dropped whole: nev seqs missing, one gap of nev. */
static void test_batch_dropped(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 16, "evbdrop"), 0);
    for (uint64_t i = 0; i < 10; i++) {
        mt_event_rec_t ev = mkev(i);
        assert_int_equal(mt__ring_push(r, &ev), 0);
    }
    mt__evb_hdr_t h;
    mt__evb_ent_t e[4];
    mkbatch(&h, e, 4, 0, 1); /* 7 events: 17 > 16 */
    assert_int_equal(put_batch(r, &h, e), UINT64_MAX);
    collect_t got;
    collect_init(&got);
    assert_int_equal(mt__ring_drain(r, collect_cb, &got, SIZE_MAX), 10);
    assert_int_equal(put_batch(r, &h, e), 10); /* position 10, seq 17 */
    assert_int_equal(mt__ring_drain(r, collect_cb, &got, SIZE_MAX), 7);
    assert_int_equal(got.evs[9].seq, 9);
    assert_int_equal(got.evs[10].seq, 17);
    assert_int_equal(got.evs[16].seq, 23);
    assert_int_equal(got.gaps, 7);
    assert_int_equal(got.gap_before, 10);
    mt__ring_stats_t st;
    mt__ring_stats(r, &st);
    assert_int_equal(st.dropped, 7);
    assert_int_equal(st.emitted, 24);
    free(got.evs);
    mt__ring_close(&r);
}

typedef struct seen_read_s {
    collect_t c;
    mt__ring_t *r;
    uint64_t read_at_100; /* read_idx when the event of seq 100 was delivered */
} seen_read_t;

static void seen_read_cb(void *ud, const mt_event_rec_t *ev)
{
    seen_read_t *s = ud;
    if (ev->kind != MT_EV_GAP && ev->seq == 100)
        s->read_at_100 = mt__ring_read_idx(s->r);
    collect_cb(&s->c, ev);
}

/* A batch goes whole into one drain: after other records it waits for the next call when
 * it does not fit in what is left of max, first it is delivered past max. read_idx is
 * still published as the drain crosses multiples of 64 in a batch. */
static void test_batch_small_max(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 256, "evbmax"), 0);
    mt__evb_hdr_t h;
    mt__evb_ent_t e[6];
    mkbatch(&h, e, 6, 0, 1);
    assert_int_equal(h.nev, 9);
    mt_event_rec_t ev = mkev(0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(mt__ring_push(r, &ev), 0);
    assert_int_equal(put_batch(r, &h, e), 3);
    assert_int_equal(mt__ring_push(r, &ev), 0);
    seen_read_t s = {.r = r};
    collect_init(&s.c);
    assert_int_equal(mt__ring_drain(r, seen_read_cb, &s, 5), 3); /* not the 9 */
    assert_int_equal(mt__ring_drain(r, seen_read_cb, &s, 5), 9); /* whole, past max */
    assert_int_equal(s.c.evs[3].seq, 3);
    assert_int_equal(s.c.evs[11].seq, 11);
    assert_int_equal(mt__ring_drain(r, seen_read_cb, &s, 5), 1);
    /* positions 13..59 plain, the batch 60..68, 69..128 plain, in one drain */
    for (int i = 13; i < 60; i++)
        assert_int_equal(mt__ring_push(r, &ev), 0);
    assert_int_equal(put_batch(r, &h, e), 60);
    for (int i = 69; i < 129; i++)
        assert_int_equal(mt__ring_push(r, &ev), 0);
    assert_int_equal(mt__ring_drain(r, seen_read_cb, &s, SIZE_MAX), 129 - 13);
    assert_int_equal(s.c.n, 129);
    assert_int_equal(s.c.evs[100].seq, 100);
    assert_int_equal(s.read_at_100, 69);
    free(s.c.evs);
    mt__ring_close(&r);
}

/* Batches no producer writes are counted lost, as many as their positions, and the drain
 * goes on with the next record. */
enum { CORRUPT_ENTRY, CORRUPT_COUNT, CORRUPT_MAGIC, CORRUPT_PAST_CLAIM, CORRUPT_ONE, CORRUPT_END };

static void test_batch_corrupt(void **state)
{
    (void)state;
    for (int how = 0; how < CORRUPT_END; how++) {
        mt__ring_t *r = NULL;
        assert_int_equal(mt__ring_create(&r, 64, "evbbad"), 0);
        mt__evb_hdr_t h;
        mt__evb_ent_t e[5];
        mkbatch(&h, e, 5, 0, 1); /* 8 events, 4 slots */
        assert_int_equal(h.nev, 8);
        if (how == CORRUPT_ENTRY)
            e[3].op = 9;
        uint64_t pos = put_batch(r, &h, e);
        assert_int_equal(pos, 0);
        mt_event_rec_t *hs = slot_at(r, pos);
        if (how == CORRUPT_COUNT)
            hs->size = 4; /* nent: the entries' events no longer add up to nev */
        else if (how == CORRUPT_MAGIC)
            hs->stream ^= 1;
        else if (how == CORRUPT_PAST_CLAIM)
            hs->requested = 10; /* claim is 9 */
        else if (how == CORRUPT_ONE)
            hs->size = hs->requested = 1; /* nev 1, yet 2 slots */
        mt_event_rec_t ev = mkev(42);
        assert_int_equal(mt__ring_push(r, &ev), 0);
        /* A header not believed lets only its slot go: the rest is skipped as never
         * published, at once only for a producer known gone. */
        bool trusted = how == CORRUPT_ENTRY || how == CORRUPT_COUNT;
        if (!trusted)
            mt__ring_mark_dead(r);
        collect_t got;
        collect_init(&got);
        assert_int_equal(mt__ring_drain(r, collect_cb, &got, SIZE_MAX), 1);
        assert_int_equal(got.evs[0].requested, 42);
        assert_int_equal(got.evs[0].seq, 8);
        assert_int_equal(got.gaps, 8);
        mt__ring_stats_t st;
        mt__ring_stats(r, &st);
        assert_int_equal(st.lost, 8);
        assert_int_equal(st.read, 9);
        free(got.evs);
        mt__ring_close(&r);
    }
}

/* A batch claimed and never written by a live producer holds the consumer for one stuck
 * timeout, not one per position. */
static void test_batch_stalled(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 64, "evbstall"), 0);
    mt__ring_set_stuck_timeout(r, 1000000); /* 1 ms */
    uint64_t tok[2];
    mt__ring_claim(r, 20, tok); /* its writer stalls */
    assert_int_equal(tok[0], 0);
    mt_event_rec_t ev = mkev(7);
    assert_int_equal(mt__ring_push(r, &ev), 0);
    collect_t got;
    collect_init(&got);
    assert_int_equal(mt__ring_drain(r, collect_cb, &got, SIZE_MAX), 0);
    usleep(5000);
    assert_int_equal(mt__ring_drain(r, collect_cb, &got, SIZE_MAX), 1);
    assert_int_equal(got.evs[0].seq, 20);
    assert_int_equal(got.gaps, 20);
    mt__ring_stats_t st;
    mt__ring_stats(r, &st);
    assert_int_equal(st.lost, 20);
    free(got.evs);
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
        cmocka_unit_test(test_fsize_limit),
        cmocka_unit_test(test_create_open_layout),
        cmocka_unit_test(test_open_rejects_bad),
        cmocka_unit_test(test_wraparound),
        cmocka_unit_test(test_deferred_ack),
        cmocka_unit_test(test_drops_and_gap),
        cmocka_unit_test(test_concurrent_writers),
        cmocka_unit_test(test_producer_sigkill),
        cmocka_unit_test(test_stuck_slot_timeout),
        cmocka_unit_test(test_push_batches),
        cmocka_unit_test(test_batch_roundtrip),
        cmocka_unit_test(test_batch_repeats),
        cmocka_unit_test(test_batch_interleaved_wrap),
        cmocka_unit_test(test_batch_dropped),
        cmocka_unit_test(test_batch_small_max),
        cmocka_unit_test(test_batch_corrupt),
        cmocka_unit_test(test_batch_stalled),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
