/* The model's pruning by the totals (model_stale.c): after a gap, an uncertain block larger
 * than what the allocated total leaves for the uncertain ones is gone. Rounds of blocks
 * allocated, freed (some frees lost in gaps) and settled, against a reference that applies
 * the rule by walking every block after every event; the model's map must equal it and its
 * checker must pass after each event. The model finds those blocks from the largest down
 * (a walk of all of them at each event was quadratic when they go a few at a time). */
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

static uint64_t rnd(run_t *x, uint64_t n)
{
    x->rng ^= x->rng >> 12;
    x->rng ^= x->rng << 25;
    x->rng ^= x->rng >> 27;
    return (x->rng * UINT64_C(2685821657736338717)) % n;
}

/* The rule, walked whole: room = allocated total - known bytes. */
static void ref_prune(run_t *x)
{
    uint64_t known = 0;
    for (size_t i = 0; i < x->nb; i++)
        if (!x->b[i].unc && !x->b[i].pending)
            known += x->b[i].size;
    uint64_t room = x->seen > known ? x->seen - known : 0;
    for (size_t i = 0; i < x->nb;) {
        if (x->b[i].unc && !x->b[i].pending && x->b[i].size > room) {
            x->b[i] = x->b[--x->nb];
            x->pruned++;
        } else {
            i++;
        }
    }
}

static int by_addr(const void *a, const void *b)
{
    const rblock_t *p = a, *q = b;
    return (p->addr > q->addr) - (p->addr < q->addr);
}

static void same_as_ref(run_t *x)
{
    char why[256] = "";
    if (mt__model_check(x->g.m, why, sizeof why) != 0)
        fail_msg("step %zu: mt__model_check: %s", x->step, why);
    mt_model_map_t map;
    assert_int_equal(mt__model_map(x->g.m, MT_MODEL_DEVICE, &map), 0);
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

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_prune_by_totals)};
    return MT_TEST_RUN(tests, NULL, NULL);
}
