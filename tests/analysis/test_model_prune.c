/* The model's pruning by the totals (model_stale.c, model_segs.c): after a gap, an uncertain
 * block larger than what the allocated total leaves for the uncertain ones is gone, and so
 * is an uncertain segment larger than what the reserved total leaves. Rounds of blocks (of
 * segments) allocated, freed (some frees lost in gaps) and settled, against a reference
 * that applies the rule by walking every block (segment) after every event; the model's map
 * must equal it and its checker must pass after each event. The model finds those from the
 * largest down (a walk of all of them at each event was quadratic when they go a few at a
 * time). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/model.h"
#include "model_gen.h"
#include "tests/common/test_main.h"

#define KIB  (UINT64_C(1) << 10)
#define BASE UINT64_C(0x7f0000000000)
#define MAXB 2048

typedef struct rblock_s {
    uint64_t addr, size;
    bool unc, pending, gone; /* gone: freed in truth (its free was lost or is yet to come) */
} rblock_t;

typedef struct run_s {
    mgen_t g;
    rblock_t b[MAXB]; /* the reference: the blocks the model should hold */
    size_t nb;
    uint64_t next, rng;
    size_t step, pruned;
    bool lost;     /* an event was lost since the last one applied: the model sees a gap */
    uint64_t seen; /* the allocated total of the last event applied (a lost one's is not) */
} run_t;

static uint64_t rnd_from(uint64_t *rng, uint64_t n)
{
    *rng ^= *rng >> 12;
    *rng ^= *rng << 25;
    *rng ^= *rng >> 27;
    return (*rng * UINT64_C(2685821657736338717)) % n;
}

static uint64_t rnd(run_t *x, uint64_t n)
{
    return rnd_from(&x->rng, n);
}

/* The rule, walked whole over v[0..*n) (blocks, or segments, never pending): room = the
 * total seen - known bytes. Returns how many it removed. */
static size_t ref_walk(rblock_t *v, size_t *n, uint64_t seen)
{
    uint64_t known = 0;
    for (size_t i = 0; i < *n; i++)
        if (!v[i].unc && !v[i].pending)
            known += v[i].size;
    uint64_t room = seen > known ? seen - known : 0, gone = 0;
    for (size_t i = 0; i < *n;) {
        if (v[i].unc && !v[i].pending && v[i].size > room) {
            v[i] = v[--*n];
            gone++;
        } else {
            i++;
        }
    }
    return gone;
}

static void ref_prune(run_t *x)
{
    x->pruned += ref_walk(x->b, &x->nb, x->seen);
}

static int by_addr(const void *a, const void *b)
{
    const rblock_t *p = a, *q = b;
    return (p->addr > q->addr) - (p->addr < q->addr);
}

/* The model's device map at a step, after its checker passed. */
static void checked_map(const mt_model_t *m, size_t step, mt_model_map_t *map)
{
    char why[256] = "";
    if (mt__model_check(m, why, sizeof why) != 0)
        fail_msg("step %zu: mt__model_check: %s", step, why);
    assert_int_equal(mt__model_map(m, MT_MODEL_DEVICE, map), 0);
}

static void same_as_ref(run_t *x)
{
    mt_model_map_t map;
    checked_map(x->g.m, x->step, &map);
    qsort(x->b, x->nb, sizeof(x->b[0]), by_addr);
    if (map.nblocks != x->nb)
        fail_msg("step %zu: %zu blocks, the reference %zu", x->step, map.nblocks, x->nb);
    for (size_t i = 0; i < x->nb; i++) {
        const mt_model_block_t *b = &map.blocks[i];
        const rblock_t *e = &x->b[i];
        if (b->addr != e->addr || b->size != e->size || !b->uncertain != !e->unc ||
            !b->pending != !e->pending)
            fail_msg("step %zu: block %zu %#llx+%llu unc %d pending %d, want %#llx+%llu unc %d "
                     "pending %d",
                     x->step, i, (unsigned long long)b->addr, (unsigned long long)b->size,
                     b->uncertain, b->pending, (unsigned long long)e->addr,
                     (unsigned long long)e->size, e->unc, e->pending);
    }
    mt__model_map_free(&map);
    x->step++;
}

static rblock_t *ref_find(run_t *x, uint64_t addr)
{
    for (size_t i = 0; i < x->nb; i++)
        if (x->b[i].addr == addr)
            return &x->b[i];
    return NULL;
}

/* An event seen: applied to the model and the reference (lost: seen by neither, its
 * totals carried by the next one). */
static void put(run_t *x, int kind, uint64_t addr, uint64_t size, bool lost)
{
    mt_event_rec_t ev = mgen_rec(&x->g, kind, addr, size, 0);
    if (lost) {
        x->lost = true;
        return;
    }
    assert_int_equal(mt__model_apply(x->g.m, &ev), 0);
    x->seen = ev.allocated;
    for (size_t i = 0; x->lost && i < x->nb; i++) /* the seq jumped: a gap before it */
        x->b[i].unc = true;
    x->lost = false;
    rblock_t *b = ref_find(x, addr);
    if (kind == MT_EV_ALLOC) {
        assert_true(b == NULL && x->nb < MAXB); /* addresses are never reused here */
        x->b[x->nb++] = (rblock_t){.addr = addr, .size = size};
    } else if (kind == MT_EV_FREE_REQUESTED && b != NULL) {
        b->unc = false;
        b->pending = true;
    } else if (kind == MT_EV_FREE_COMPLETED && b != NULL) {
        *b = x->b[--x->nb];
    }
    ref_prune(x);
    same_as_ref(x);
}

/* A gap record: every block the model holds is uncertain, then pruned by the totals. */
static void gap_record(run_t *x)
{
    mt_event_rec_t gap = {.kind = MT_EV_GAP, .size = 1};
    assert_int_equal(mt__model_apply(x->g.m, &gap), 0);
    for (size_t i = 0; i < x->nb; i++)
        x->b[i].unc = true;
    ref_prune(x);
    same_as_ref(x);
}

static void test_prune_by_totals(void **state)
{
    (void)state;
    static run_t x;
    memset(&x, 0, sizeof x);
    x.rng = UINT64_C(0x2545f4914f6cdd1d);
    x.next = BASE;
    assert_int_equal(mt__model_create(&x.g.m, NULL), 0);
    put(&x, MT_EV_SEGMENT_ALLOC, BASE, UINT64_C(1) << 40, false);
    /* truth: the blocks live in the program, by address (the reference's may be fewer) */
    static uint64_t live[MAXB], lsize[MAXB];
    size_t nlive = 0, gaps = 0;
    for (int round = 0; round < 300; round++) {
        size_t adds = 1 + (size_t)rnd(&x, 24);
        for (size_t i = 0; i < adds && nlive < MAXB / 2; i++) {
            uint64_t size = (1 + rnd(&x, 256)) * 4 * KIB;
            live[nlive] = x.next;
            lsize[nlive++] = size;
            put(&x, MT_EV_ALLOC, x.next, size, false);
            x.next += size;
        }
        /* frees, a few at a time in any order: lost ones in a burst, then a gap */
        bool burst = rnd(&x, 4) == 0;
        size_t frees = (size_t)rnd(&x, nlive + 1);
        for (size_t i = 0; i < frees && nlive > 0; i++) {
            size_t k = (size_t)rnd(&x, nlive);
            uint64_t a = live[k], s = lsize[k];
            live[k] = live[--nlive];
            lsize[k] = lsize[nlive];
            bool lost = burst && rnd(&x, 2) == 0;
            put(&x, MT_EV_FREE_REQUESTED, a, s, lost);
            if (rnd(&x, 8) != 0) /* some stay pending until a later round's events */
                put(&x, MT_EV_FREE_COMPLETED, a, s, lost);
        }
        if (burst && rnd(&x, 2) == 0) /* a gap record too (else the next seq tells it) */
            gap_record(&x);
        gaps += burst;
    }
    /* Blocks made uncertain then settled, many times over: the records of the settled ones
     * outnumber the rest, and the model makes its records anew. */
    for (int round = 0; round < 40; round++) {
        uint64_t first = x.next;
        for (int i = 0; i < 100; i++) {
            put(&x, MT_EV_ALLOC, x.next, 4 * KIB * (uint64_t)(1 + i % 7), false);
            x.next += 4 * KIB * (uint64_t)(1 + i % 7);
        }
        gap_record(&x);
        for (int i = 0, a = 0; i < 100; a += 4 * (1 + i % 7), i++) {
            uint64_t at = first + (uint64_t)a * KIB, size = 4 * KIB * (uint64_t)(1 + i % 7);
            put(&x, MT_EV_FREE_REQUESTED, at, size, false);
            put(&x, MT_EV_FREE_COMPLETED, at, size, false);
        }
    }
    /* what the run went through: gaps, and blocks the totals proved gone */
    assert_true(gaps > 30);
    assert_true(x.pruned > 100);
    mt__model_destroy(&x.g.m);
}

/* ---- segments ---- */

#define UNIT  (UINT64_C(2) << 20) /* bytes: segments are whole units */
#define NUNIT 1024                /* the address space of the random rounds, in units */
#define MAXS  2048

typedef struct srun_s {
    mgen_t g;
    rblock_t r[MAXS]; /* the reference: the segments the model should hold (none pending) */
    size_t nr;
    rblock_t t[MAXS]; /* truth: the segments the program holds (unc unused) */
    size_t nt;
    uint64_t rng;
    size_t step, pruned, parts; /* parts: uncertain segments cut in two or shortened */
    bool lost;
    uint64_t seen; /* the reserved total of the last event applied */
} srun_t;

static uint64_t seg_end(const rblock_t *s)
{
    return s->size > UINT64_MAX - s->addr ? UINT64_MAX : s->addr + s->size;
}

/* Cuts [a, e) out of v[0..*n) as the segment map does (those at 2^64 - 1 stay); counts in
 * *parts the uncertain segments that keep a part. */
static void ref_cut(rblock_t *v, size_t *n, uint64_t a, uint64_t e, size_t *parts)
{
    size_t k = *n;
    for (size_t i = 0; i < k; i++) {
        rblock_t g = v[i];
        uint64_t ge = seg_end(&g);
        if (g.addr == UINT64_MAX || ge <= a || g.addr >= e)
            continue;
        if (g.unc && (g.addr < a || ge > e))
            (*parts)++;
        v[i].size = g.addr < a ? a - g.addr : 0; /* 0: nothing left at its start */
        if (ge > e) {
            assert_true(*n < MAXS);
            v[(*n)++] = (rblock_t){.addr = e, .size = ge - e, .unc = g.unc};
        }
    }
    size_t j = 0;
    for (size_t i = 0; i < *n; i++)
        if (v[i].size > 0)
            v[j++] = v[i];
    *n = j;
}

static void sref_prune(srun_t *x)
{
    x->pruned += ref_walk(x->r, &x->nr, x->seen);
}

static int seg_order(const void *a, const void *b)
{
    const rblock_t *p = a, *q = b;
    if (p->addr != q->addr)
        return (p->addr > q->addr) - (p->addr < q->addr);
    if (p->size != q->size)
        return (p->size > q->size) - (p->size < q->size);
    return (int)p->unc - (int)q->unc;
}

static void segs_same_as_ref(srun_t *x)
{
    mt_model_map_t map;
    checked_map(x->g.m, x->step, &map);
    if (map.nsegs != x->nr)
        fail_msg("step %zu: %zu segments, the reference %zu", x->step, map.nsegs, x->nr);
    static rblock_t got[MAXS];
    for (size_t i = 0; i < map.nsegs; i++)
        got[i] = (rblock_t){
            .addr = map.segs[i].addr, .size = map.segs[i].size, .unc = map.segs[i].uncertain != 0};
    mt__model_map_free(&map);
    /* (those at 2^64 - 1 in any order: a multiset) */
    qsort(got, x->nr, sizeof(got[0]), seg_order);
    qsort(x->r, x->nr, sizeof(x->r[0]), seg_order);
    for (size_t i = 0; i < x->nr; i++)
        if (seg_order(&got[i], &x->r[i]) != 0)
            fail_msg("step %zu: segment %zu %#llx+%llu unc %d, want %#llx+%llu unc %d", x->step, i,
                     (unsigned long long)got[i].addr, (unsigned long long)got[i].size, got[i].unc,
                     (unsigned long long)x->r[i].addr, (unsigned long long)x->r[i].size,
                     x->r[i].unc);
    x->step++;
}

/* The reference's step for a seen event (a gap first when one was lost before it). */
static void sref_apply(srun_t *x, int kind, uint64_t addr, uint64_t size)
{
    for (size_t i = 0; x->lost && i < x->nr; i++)
        x->r[i].unc = true;
    x->lost = false;
    uint64_t end = size > UINT64_MAX - addr ? UINT64_MAX : addr + size;
    if (kind == MT_EV_SEGMENT_ALLOC) {
        ref_cut(x->r, &x->nr, addr, end, &x->parts);
        assert_true(x->nr < MAXS);
        x->r[x->nr++] = (rblock_t){.addr = addr, .size = size};
    } else if (kind == MT_EV_SEGMENT_FREE) {
        ref_cut(x->r, &x->nr, addr, end, &x->parts);
    } else { /* a block's event: the segment holding it is live */
        for (size_t i = 0; i < x->nr; i++)
            if (x->r[i].addr <= addr && addr < seg_end(&x->r[i]))
                x->r[i].unc = false;
    }
}

/* An event: the truth changes; seen (!lost), the model and the reference too. */
static void sput(srun_t *x, int kind, uint64_t addr, uint64_t size, bool lost)
{
    mt_event_rec_t ev = mgen_rec(&x->g, kind, addr, size, 0);
    uint64_t end = size > UINT64_MAX - addr ? UINT64_MAX : addr + size;
    size_t ignored = 0;
    if (kind == MT_EV_SEGMENT_ALLOC && addr != UINT64_MAX)
        ref_cut(x->t, &x->nt, addr, end, &ignored);
    if (kind == MT_EV_SEGMENT_ALLOC) {
        assert_true(x->nt < MAXS);
        x->t[x->nt++] = (rblock_t){.addr = addr, .size = size};
    } else if (kind == MT_EV_SEGMENT_FREE && addr == UINT64_MAX) { /* (the map cuts none) */
        for (size_t i = 0; i < x->nt; i++)
            if (x->t[i].addr == addr && x->t[i].size == size) {
                x->t[i] = x->t[--x->nt];
                break;
            }
    } else if (kind == MT_EV_SEGMENT_FREE) {
        ref_cut(x->t, &x->nt, addr, end, &ignored);
    }
    if (lost) {
        x->lost = true;
        return;
    }
    assert_int_equal(mt__model_apply(x->g.m, &ev), 0);
    x->seen = ev.reserved;
    sref_apply(x, kind, addr, size);
    sref_prune(x);
    segs_same_as_ref(x);
}

static void sgap_record(srun_t *x)
{
    mt_event_rec_t gap = {.kind = MT_EV_GAP, .size = 1};
    assert_int_equal(mt__model_apply(x->g.m, &gap), 0);
    for (size_t i = 0; i < x->nr; i++) /* (pruned at the next event: a gap record has no totals) */
        x->r[i].unc = true;
    segs_same_as_ref(x);
}

/* A block allocated in the segment at t[k] and freed: the segment holding it is live. */
static void touch(srun_t *x, size_t k)
{
    uint64_t at = x->t[k].addr + rnd_from(&x->rng, x->t[k].size / (4 * KIB)) * 4 * KIB;
    sput(x, MT_EV_ALLOC, at, 4 * KIB, false);
    sput(x, MT_EV_FREE_REQUESTED, at, 4 * KIB, false);
    sput(x, MT_EV_FREE_COMPLETED, at, 4 * KIB, false);
}

/* A segment of the truth below 2^64 - 1 (MAXS: none). */
static size_t some_seg(srun_t *x)
{
    for (int tries = 0; x->nt > 0 && tries < 8; tries++) {
        size_t k = (size_t)rnd_from(&x->rng, x->nt);
        if (x->t[k].addr != UINT64_MAX)
            return k;
    }
    return MAXS;
}

/* One random operation of the rounds, lost with odds 1/lose (0: never). */
static void seg_op(srun_t *x, uint64_t lose)
{
    uint64_t op = rnd_from(&x->rng, 19);
    bool lost = lose > 0 && rnd_from(&x->rng, lose) == 0;
    size_t k = some_seg(x);
    if (op < 8) { /* a segment, mostly small, in space the truth leaves free */
        uint64_t units =
            rnd_from(&x->rng, 4) == 0 ? 1 + rnd_from(&x->rng, 64) : 1 + rnd_from(&x->rng, 8);
        uint64_t a = BASE + rnd_from(&x->rng, NUNIT - units) * UNIT, e = a + units * UNIT;
        for (size_t i = 0; i < x->nt; i++)
            if (x->t[i].addr < e && a < seg_end(&x->t[i]))
                return;
        sput(x, MT_EV_SEGMENT_ALLOC, a, units * UNIT, lost);
    } else if (op < 14 && k < MAXS) { /* a free: the whole, or units from its start, end or
                                          middle */
        uint64_t n = x->t[k].size / UNIT, lo = 0, hi = n;
        if (n > 1 && rnd_from(&x->rng, 2) == 0) {
            lo = rnd_from(&x->rng, n);
            hi = lo + 1 + rnd_from(&x->rng, n - lo);
        }
        sput(x, MT_EV_SEGMENT_FREE, x->t[k].addr + lo * UNIT, (hi - lo) * UNIT, lost);
    } else if (k < MAXS) {
        touch(x, k);
    }
}

static void test_prune_segments(void **state)
{
    (void)state;
    static srun_t x;
    memset(&x, 0, sizeof x);
    x.rng = UINT64_C(0x9e3779b97f4a7c15);
    assert_int_equal(mt__model_create(&x.g.m, NULL), 0);
    size_t gaps = 0;
    for (int round = 0; round < 1500; round++) {
        bool burst = rnd_from(&x.rng, 4) == 0;
        size_t ops = 1 + (size_t)rnd_from(&x.rng, 12);
        for (size_t i = 0; i < ops; i++)
            seg_op(&x, burst ? 2 : 0);
        if (burst && rnd_from(&x.rng, 2) == 0)
            sgap_record(&x);
        gaps += burst;
        /* now and then all freed, half the frees lost: the reserved total then leaves less
         * room than the uncertain segments whose frees were lost, and proves them gone */
        for (bool drain = rnd_from(&x.rng, 16) == 0; drain && x.nt > 0;)
            sput(&x, MT_EV_SEGMENT_FREE, x.t[0].addr, x.t[0].size, rnd_from(&x.rng, 2) == 0);
    }
    /* Segments made uncertain then settled, many times over (the records of the settled
     * ones outnumber the rest, and the model makes its records anew), then freed with their
     * frees lost: the reserved total proves them gone, the largest first. */
    size_t random_pruned = x.pruned;
    while (x.nt > 0) /* the rest of the truth freed first (seen) */
        sput(&x, MT_EV_SEGMENT_FREE, x.t[0].addr, x.t[0].size, false);
    uint64_t base = BASE + NUNIT * UNIT;
    for (uint64_t i = 0; i < 200; i++)
        sput(&x, MT_EV_SEGMENT_ALLOC, base + 8 * i * UNIT, (1 + i % 7) * UNIT, false);
    for (uint64_t i = 1; i <= 3; i++) /* and some at 2^64 - 1, which the heap leaves out */
        sput(&x, MT_EV_SEGMENT_ALLOC, UINT64_MAX, 2 * i * UNIT, false);
    for (int round = 0; round < 20; round++) {
        sgap_record(&x);
        for (size_t k = 0; k < x.nt; k++)
            if (x.t[k].addr != UINT64_MAX)
                touch(&x, k);
    }
    sgap_record(&x);
    for (uint64_t i = 1; i <= 3; i++)
        sput(&x, MT_EV_SEGMENT_FREE, UINT64_MAX, 2 * i * UNIT, true);
    for (uint64_t i = 0; i < 200; i++) /* lost frees of the larger half, seen of the rest */
        sput(&x, MT_EV_SEGMENT_FREE, base + 8 * i * UNIT, (1 + i % 7) * UNIT, i % 7 >= 3);
    sput(&x, MT_EV_SEGMENT_ALLOC, base, UNIT, false); /* the only one: no room for the rest */
    assert_int_equal(x.nr, 1);
    /* what the runs went through: gaps, uncertain segments cut (a part of them kept), and
     * segments proved gone at random and one at a time at the end */
    assert_true(gaps > 200);
    assert_true(x.parts > 200);
    assert_true(random_pruned > 300);
    assert_true(x.pruned > random_pruned + 50);
    mt__model_destroy(&x.g.m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_prune_by_totals),
                                       cmocka_unit_test(test_prune_segments)};
    return MT_TEST_RUN(tests, NULL, NULL);
}
