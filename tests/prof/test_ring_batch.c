/* The ring's compact batches of a thread cache (util/evbatch.h): round trip, repeats,
 * interleaving across the ring's end, drops, a small drain budget, corruption, a batch
 * claimed and never written, and the global path's timed entries. */
#include "tests/prof/ring_test_util.h"

#include <stdatomic.h>

#include "tests/common/test_main.h"
#include "util/evbatch.h"

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

/* The global path's timed entries: each event stamped the header's time + its dt, with
 * the request from requested's low bits; a repeat count on one is no producer's. */
static void test_batch_timed(void **state)
{
    (void)state;
    mt__ring_t *r = NULL;
    assert_int_equal(mt__ring_create(&r, 64, "evbt"), 0);
    const uint64_t t = 1000000, lo = ((uint64_t)1 << MT__EVB_REQ_BITS) - 1;
    mt__evb_ent_t e[3] = {
        {.addr = 0x200000,
         .size = 9,
         .requested = 0 | 0ull << MT__EVB_REQ_BITS,
         .op = MT__EVB_STACK | MT__EVB_TIMED},
        {.addr = 0x200000,
         .size = 8192,
         .requested = 5000 | 70ull << MT__EVB_REQ_BITS,
         .stream = 3,
         .op = MT__EVB_POP | MT__EVB_TIMED,
         .pool = MT_POOL_LARGE,
         .tag = 2},
        {.addr = 0x200000,
         .size = 8192,
         .requested = 5000 | MT__EVB_DT_MAX << MT__EVB_REQ_BITS,
         .stream = 3,
         .op = MT__EVB_FREE | MT__EVB_TIMED,
         .pool = MT_POOL_LARGE,
         .tag = 2},
    };
    mt__evb_hdr_t h = {
        .time_ns = t, .allocated0 = 100, .reserved = 1 << 21, .nent = 3, .nev = 4, .device = 0};
    assert_int_equal(put_batch(r, &h, e), 0);
    collect_t got;
    collect_init(&got);
    assert_int_equal(mt__ring_drain(r, collect_cb, &got, SIZE_MAX), 4);
    static const int kinds[4] = {MT_EV_STACK_REF, MT_EV_ALLOC, MT_EV_FREE_REQUESTED,
                                 MT_EV_FREE_COMPLETED};
    static const uint64_t times[4] = {t, t + 70, t + MT__EVB_DT_MAX, t + MT__EVB_DT_MAX};
    static const uint64_t reqs[4] = {0, 5000, 5000, 0};
    static const uint64_t alloc[4] = {100 + 8192, 100 + 8192, 100, 100};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(got.evs[i].kind, kinds[i]);
        assert_int_equal(got.evs[i].time_ns, times[i]);
        assert_int_equal(got.evs[i].requested, reqs[i]);
        assert_int_equal(got.evs[i].allocated, alloc[i]);
        assert_int_equal(got.evs[i].seq, (uint64_t)i);
    }
    assert_int_equal(got.evs[0].size, 9); /* the stack id */
    assert_int_equal(got.evs[1].size, 8192);
    assert_int_equal(mt__evb_req(&e[1]), 5000);
    assert_true((e[1].requested & lo) == 5000);
    free(got.evs);
    /* a repeat on a timed entry: refused whole (counted lost), as any batch no producer
     * writes */
    mt__evb_ent_t bad[2] = {e[1], e[2]};
    bad[0].op = MT__EVB_POP_FREE | MT__EVB_TIMED;
    bad[0].rep = 1;
    mt__evb_hdr_t hb = h;
    hb.nent = 2;
    hb.nev = 6 + 2;
    assert_int_equal(mt__evb_expand(&hb, bad, 0, collect_cb, &got), MT_EPROTO);
    mt__ring_close(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_roundtrip),        cmocka_unit_test(test_batch_repeats),
        cmocka_unit_test(test_batch_interleaved_wrap), cmocka_unit_test(test_batch_dropped),
        cmocka_unit_test(test_batch_small_max),        cmocka_unit_test(test_batch_corrupt),
        cmocka_unit_test(test_batch_stalled),          cmocka_unit_test(test_batch_timed),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
