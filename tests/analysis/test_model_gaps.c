/* The event model across many gaps: uncertain blocks settled, freed, dropped from the middle
 * of the stale index, their addresses reused at other sizes, and segments made certain,
 * split, joined and cut between the gaps. A small reference of the model's rules (the block
 * and segment lists, walked whole at each step) follows the same stream, and after every
 * event the model's map must equal it and the model's checker must pass. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "analysis/model.h"
#include "model_gen.h"
#include "tests/common/test_main.h"

#define KIB  (UINT64_C(1) << 10)
#define MIB  (UINT64_C(1) << 20)
#define BASE UINT64_C(0x7f0000000000)

static void check(const mt_model_t *m)
{
    char why[256] = "";
    int rc = mt__model_check(m, why, sizeof why);
    if (rc != 0)
        fail_msg("mt__model_check: %s", why);
}

/* ---- the reference: the rules of analysis/model.c and model_segs.c, on plain lists ---- */

#define MAXB 4096
#define MAXS 1024

typedef struct rblock_s {
    uint64_t addr, size;
    bool unc, pending;
} rblock_t;

typedef struct rseg_s {
    uint64_t addr, size;
    bool unc, mapped;
} rseg_t;

typedef struct ref_s {
    rblock_t b[MAXB];
    size_t nb;
    rseg_t s[MAXS]; /* by addr */
    size_t ns;
    uint64_t unmatched;
} ref_t;

static rblock_t *ref_find(ref_t *r, uint64_t addr)
{
    for (size_t i = 0; i < r->nb; i++)
        if (r->b[i].addr == addr)
            return &r->b[i];
    return NULL;
}

static void ref_delete(ref_t *r, rblock_t *b)
{
    *b = r->b[--r->nb];
}

/* The uncertain blocks that reach into [addr, addr + size) are gone. */
static void ref_drop_unc(ref_t *r, uint64_t addr, uint64_t size)
{
    for (size_t i = 0; i < r->nb;) {
        rblock_t *b = &r->b[i];
        if (b->unc && b->addr < addr + size && b->addr + b->size > addr)
            ref_delete(r, b);
        else
            i++;
    }
}

static void ref_touch(ref_t *r, uint64_t addr)
{
    for (size_t i = 0; i < r->ns; i++)
        if (r->s[i].addr <= addr && addr < r->s[i].addr + r->s[i].size) {
            r->s[i].unc = false;
            return;
        }
}

static void ref_seg_insert(ref_t *r, rseg_t g)
{
    assert_true(r->ns < MAXS);
    size_t i = r->ns;
    while (i > 0 && r->s[i - 1].addr > g.addr) {
        r->s[i] = r->s[i - 1];
        i--;
    }
    r->s[i] = g;
    r->ns++;
}

static void ref_seg_remove(ref_t *r, size_t i)
{
    memmove(&r->s[i], &r->s[i + 1], (r->ns - i - 1) * sizeof(r->s[0]));
    r->ns--;
}

static void ref_cut(ref_t *r, uint64_t addr, uint64_t size)
{
    uint64_t end = addr + size;
    for (size_t i = 0; i < r->ns;) {
        rseg_t g = r->s[i];
        uint64_t gend = g.addr + g.size;
        if (gend <= addr || g.addr >= end) {
            i++;
            continue;
        }
        ref_seg_remove(r, i);
        if (g.addr < addr) {
            rseg_t left = g;
            left.size = addr - g.addr;
            ref_seg_insert(r, left);
        }
        if (gend > end) {
            rseg_t right = g;
            right.addr = end;
            right.size = gend - end;
            ref_seg_insert(r, right);
        }
        i = 0; /* (the list is short) */
    }
}

static void ref_seg_add(ref_t *r, uint64_t addr, uint64_t size, bool mapped)
{
    ref_drop_unc(r, addr, size);
    ref_cut(r, addr, size);
    rseg_t g = {.addr = addr, .size = size, .mapped = mapped};
    /* the certain mapped runs it touches, one on each side, join it */
    for (size_t i = 0; mapped && i < r->ns; i++) {
        rseg_t n = r->s[i];
        if (n.mapped && !n.unc && n.addr + n.size == addr) {
            g.addr = n.addr;
            g.size += n.size;
            ref_seg_remove(r, i);
            break;
        }
    }
    for (size_t i = 0; mapped && i < r->ns; i++) {
        rseg_t n = r->s[i];
        if (n.mapped && !n.unc && addr + size == n.addr) {
            g.size += n.size;
            ref_seg_remove(r, i);
            break;
        }
    }
    ref_seg_insert(r, g);
}

static void ref_apply(ref_t *r, int kind, uint64_t addr, uint64_t size)
{
    rblock_t *b = ref_find(r, addr);
    switch (kind) {
    case MT_EV_ALLOC:
        if (b)
            ref_delete(r, b);
        ref_drop_unc(r, addr, size);
        assert_true(r->nb < MAXB);
        r->b[r->nb++] = (rblock_t){.addr = addr, .size = size};
        ref_touch(r, addr);
        break;
    case MT_EV_FREE_REQUESTED:
        if (!b) {
            r->unmatched++;
            break;
        }
        b->unc = false;
        b->pending = true;
        b->size = size;
        ref_touch(r, addr);
        break;
    case MT_EV_FREE_COMPLETED:
        if (b) {
            ref_delete(r, b);
            ref_touch(r, addr);
        }
        break;
    case MT_EV_SEGMENT_ALLOC:
    case MT_EV_SEGMENT_MAP:
        ref_seg_add(r, addr, size, kind == MT_EV_SEGMENT_MAP);
        break;
    case MT_EV_SEGMENT_FREE:
    case MT_EV_SEGMENT_UNMAP:
        ref_drop_unc(r, addr, size);
        ref_cut(r, addr, size);
        break;
    default:
        break;
    }
}

static void ref_gap(ref_t *r)
{
    for (size_t i = 0; i < r->nb; i++)
        r->b[i].unc = true;
    for (size_t i = 0; i < r->ns; i++)
        r->s[i].unc = true;
}

static int cmp_rblock(const void *a, const void *b)
{
    const rblock_t *x = a, *y = b;
    return (x->addr > y->addr) - (x->addr < y->addr);
}

/* The model's map against the reference: every block and segment, with its flags. */
static void same_as_ref(const mt_model_t *m, ref_t *r, size_t step)
{
    mt_model_map_t map;
    assert_int_equal(mt__model_map(m, MT_MODEL_DEVICE, &map), 0);
    qsort(r->b, r->nb, sizeof(r->b[0]), cmp_rblock);
    if (map.nblocks != r->nb || map.nsegs != r->ns)
        fail_msg("step %zu: %zu blocks, %zu segments; the reference has %zu, %zu", step,
                 map.nblocks, map.nsegs, r->nb, r->ns);
    for (size_t i = 0; i < r->nb; i++) {
        const mt_model_block_t *b = &map.blocks[i];
        const rblock_t *e = &r->b[i];
        if (b->addr != e->addr || b->size != e->size || !b->uncertain != !e->unc ||
            !b->pending != !e->pending)
            fail_msg("step %zu: block %zu at %#llx+%llu unc %d pending %d, want %#llx+%llu unc "
                     "%d pending %d",
                     step, i, (unsigned long long)b->addr, (unsigned long long)b->size,
                     b->uncertain, b->pending, (unsigned long long)e->addr,
                     (unsigned long long)e->size, e->unc, e->pending);
    }
    for (size_t i = 0; i < r->ns; i++) {
        const mt_model_seg_t *g = &map.segs[i];
        const rseg_t *e = &r->s[i];
        if (g->addr != e->addr || g->size != e->size || !g->uncertain != !e->unc ||
            !g->mapped != !e->mapped)
            fail_msg("step %zu: segment %zu at %#llx+%llu unc %d, want %#llx+%llu unc %d", step, i,
                     (unsigned long long)g->addr, (unsigned long long)g->size, g->uncertain,
                     (unsigned long long)e->addr, (unsigned long long)e->size, e->unc);
    }
    mt__model_map_free(&map);
}

/* ---- the stream ---- */

typedef struct run_s {
    mgen_t g;
    ref_t *r;
    size_t step;
    uint64_t rng;
    bool lost; /* an event was lost since the last one applied: its seq jumps */
} run_t;

static uint64_t rnd(run_t *x, uint64_t n)
{
    x->rng ^= x->rng >> 12;
    x->rng ^= x->rng << 25;
    x->rng ^= x->rng >> 27;
    return (x->rng * UINT64_C(2685821657736338717)) % n;
}

/* Applies the event to the model and the reference, then compares them. */
static void put(run_t *x, int kind, uint64_t addr, uint64_t size)
{
    mt_event_rec_t ev = mgen_rec(&x->g, kind, addr, size, 0);
    assert_int_equal(mt__model_apply(x->g.m, &ev), 0);
    if (x->lost)
        ref_gap(x->r); /* the seq jumped: a gap before the event */
    x->lost = false;
    ref_apply(x->r, kind, addr, size);
    check(x->g.m);
    same_as_ref(x->g.m, x->r, x->step++);
}

/* A gap: an event lost (the next one's seq jumps), or a gap record. */
static void lose(run_t *x)
{
    if (rnd(x, 2) == 0) {
        (void)mgen_rec(&x->g, MT_EV_MARK, 0, 0, 0);
        x->lost = true;
        return;
    }
    mt_event_rec_t gap = {.kind = MT_EV_GAP, .size = 1};
    assert_int_equal(mt__model_apply(x->g.m, &gap), 0);
    ref_gap(x->r);
    check(x->g.m);
    same_as_ref(x->g.m, x->r, x->step++);
}

/* Whether [addr, addr + size) meets a certain block (the allocator never overlaps two). */
static bool meets_certain(const ref_t *r, uint64_t addr, uint64_t size, uint64_t except)
{
    for (size_t i = 0; i < r->nb; i++) {
        const rblock_t *b = &r->b[i];
        if (!b->unc && b->addr != except && b->addr < addr + size && b->addr + b->size > addr)
            return true;
    }
    return false;
}

#define NSEG 48 /* 2 MiB slots; the segments come and go in them */

static void test_many_gaps(void **state)
{
    (void)state;
    static ref_t ref;
    memset(&ref, 0, sizeof ref);
    run_t x = {.r = &ref, .rng = UINT64_C(0x9e3779b97f4a7c15)};
    assert_int_equal(mt__model_create(&x.g.m, NULL), 0);
    /* Lost at the start: room in the totals, so that none of the uncertain blocks or
     * segments is dropped by them (the reference knows nothing of the totals). */
    (void)mgen_rec(&x.g, MT_EV_ALLOC, BASE + (UINT64_C(1) << 40), UINT64_C(1) << 40, 0);
    (void)mgen_rec(&x.g, MT_EV_SEGMENT_ALLOC, BASE + (UINT64_C(1) << 40), UINT64_C(1) << 41, 0);
    x.lost = true;
    for (uint64_t i = 0; i < NSEG; i += 2) /* plain segments, every other slot */
        put(&x, MT_EV_SEGMENT_ALLOC, BASE + i * 2 * MIB, 2 * MIB);
    enum { ROUNDS = 400 };
    size_t gaps = 0, settled = 0, reused = 0;
    for (size_t round = 0; round < ROUNDS; round++) {
        size_t ops = 1 + (size_t)rnd(&x, 12);
        for (size_t o = 0; o < ops; o++) {
            uint64_t what = rnd(&x, 100);
            if (what < 40) { /* a new block somewhere, certain blocks not met */
                uint64_t size = (1 + rnd(&x, 64)) * 4 * KIB;
                uint64_t addr = BASE + rnd(&x, NSEG * 2 * MIB / (4 * KIB)) * 4 * KIB;
                if (meets_certain(&ref, addr, size, UINT64_MAX))
                    continue;
                put(&x, MT_EV_ALLOC, addr, size); /* uncertain ones it meets go */
            } else if (what < 60 && ref.nb > 0) { /* a block freed: settled first if it was
                                                   * uncertain */
                rblock_t b = ref.b[rnd(&x, ref.nb)];
                settled += b.unc;
                put(&x, MT_EV_FREE_REQUESTED, b.addr, b.size);
                if (rnd(&x, 3) != 0)
                    put(&x, MT_EV_FREE_COMPLETED, b.addr, b.size);
            } else if (what < 70 && ref.nb > 0) { /* its address reused at another size */
                rblock_t b = ref.b[rnd(&x, ref.nb)];
                uint64_t size = b.size + (1 + rnd(&x, 8)) * 4 * KIB;
                if (meets_certain(&ref, b.addr, size, b.addr))
                    continue;
                if (!b.unc) { /* freed as seen */
                    put(&x, MT_EV_FREE_REQUESTED, b.addr, b.size);
                    put(&x, MT_EV_FREE_COMPLETED, b.addr, b.size);
                }
                put(&x, MT_EV_ALLOC, b.addr, size); /* an uncertain one: its free was lost */
                reused++;
            } else if (what < 80) { /* mapped pages in an odd slot: runs that join */
                uint64_t slot = 1 + 2 * rnd(&x, NSEG / 2);
                uint64_t off = rnd(&x, 4) * 512 * KIB;
                put(&x, MT_EV_SEGMENT_MAP, BASE + slot * 2 * MIB + off, 512 * KIB);
            } else if (what < 88) { /* pages unmapped, or a segment's middle freed */
                uint64_t slot = rnd(&x, NSEG);
                uint64_t off = (1 + rnd(&x, 2)) * 512 * KIB;
                put(&x, slot % 2 ? MT_EV_SEGMENT_UNMAP : MT_EV_SEGMENT_FREE,
                    BASE + slot * 2 * MIB + off, 512 * KIB);
            } else if (what < 92) { /* a whole slot's segment again, or one in its middle */
                uint64_t slot = 2 * rnd(&x, NSEG / 2);
                if (rnd(&x, 2) == 0)
                    put(&x, MT_EV_SEGMENT_ALLOC, BASE + slot * 2 * MIB, 2 * MIB);
                else
                    put(&x, MT_EV_SEGMENT_ALLOC, BASE + slot * 2 * MIB + MIB, 512 * KIB);
            } else if (ref.nb > 0) { /* a block freed in the lost events, and met later */
                rblock_t b = ref.b[rnd(&x, ref.nb)];
                if (!b.unc)
                    continue;
                uint64_t size = b.size + 4 * KIB;
                if (meets_certain(&ref, b.addr + 4 * KIB, size, UINT64_MAX))
                    continue;
                put(&x, MT_EV_ALLOC, b.addr + 4 * KIB, size);
            }
        }
        /* Every hundredth round: hundreds of segment changes and dozens of blocks between
         * two gaps (the segment notes past their bound; the stale index's sorted inserts). */
        for (size_t o = 0; round % 100 == 99 && o < 300; o++) {
            uint64_t slot = 1 + 2 * rnd(&x, NSEG / 2);
            uint64_t off = rnd(&x, 4) * 512 * KIB;
            put(&x, o % 3 ? MT_EV_SEGMENT_MAP : MT_EV_SEGMENT_UNMAP, BASE + slot * 2 * MIB + off,
                512 * KIB);
            uint64_t size = 4 * KIB;
            uint64_t addr = BASE + rnd(&x, NSEG * 2 * MIB / (4 * KIB)) * 4 * KIB;
            if (o % 4 == 0 && !meets_certain(&ref, addr, size, UINT64_MAX))
                put(&x, MT_EV_ALLOC, addr, size);
        }
        if (rnd(&x, 8) != 0) { /* most rounds end in a gap */
            lose(&x);
            gaps++;
        }
    }
    assert_true(gaps > ROUNDS / 2);
    assert_true(settled > 20 && reused > 20);
    /* At the end every uncertain block goes with its segment: the table empties from the
     * middle. */
    for (uint64_t i = 0; i < NSEG; i++)
        put(&x, i % 2 ? MT_EV_SEGMENT_UNMAP : MT_EV_SEGMENT_FREE, BASE + i * 2 * MIB, 2 * MIB);
    for (size_t i = 0; i < ref.nb; i++)
        assert_false(ref.b[i].unc);
    assert_int_equal(ref.ns, 0);
    mt__model_destroy(&x.g.m);
}

/* A dead entry of the stale index (a block dropped since the gap that listed it) between a
 * live uncertain block and an allocation that overlaps the live one's end does not hide the
 * live one: the allocation proves it gone. */
static void test_overlap_past_a_dropped_block(void **state)
{
    (void)state;
    mgen_t g = {0};
    assert_int_equal(mt__model_create(&g.m, NULL), 0);
    (void)mgen_rec(&g, MT_EV_ALLOC, BASE + 64 * MIB, 64 * MIB, 0); /* lost: room in the totals */
    mt_event_rec_t ev = mgen_rec(&g, MT_EV_SEGMENT_ALLOC, BASE, 8 * MIB, 0);
    assert_int_equal(mt__model_apply(g.m, &ev), 0);
    ev = mgen_rec(&g, MT_EV_ALLOC, BASE + MIB, MIB, 0); /* d, made uncertain by the next gap */
    assert_int_equal(mt__model_apply(g.m, &ev), 0);
    ev = mgen_rec(&g, MT_EV_ALLOC, BASE + 7 * MIB, 64 * KIB, 0); /* e, uncertain throughout */
    assert_int_equal(mt__model_apply(g.m, &ev), 0);
    (void)mgen_rec(&g, MT_EV_FREE_REQUESTED, BASE + MIB, MIB, 0); /* lost */
    ev = mgen_rec(&g, MT_EV_ALLOC, BASE, 3 * MIB, 0);             /* p, over d: d is gone */
    assert_int_equal(mt__model_apply(g.m, &ev), 0);
    check(g.m);
    (void)mgen_rec(&g, MT_EV_FREE_REQUESTED, BASE, 3 * MIB, 0); /* lost: p uncertain */
    ev = mgen_rec(&g, MT_EV_ALLOC, BASE + 2 * MIB, 4 * MIB, 0); /* q, over p's end */
    assert_int_equal(mt__model_apply(g.m, &ev), 0);
    check(g.m);
    mt_model_tag_t t;
    mt__model_tag(g.m, MT_MODEL_DEVICE, 0, &t);
    assert_int_equal(t.uncertain_blocks, 1); /* e; p went */
    assert_int_equal(t.bytes, 4 * MIB);      /* q */
    mt__model_destroy(&g.m);
}

static bool seg_uncertain(const mt_model_t *m, uint64_t addr, size_t nth)
{
    mt_model_map_t map;
    assert_int_equal(mt__model_map(m, MT_MODEL_DEVICE, &map), 0);
    size_t i = 0;
    while (i < map.nsegs && (map.segs[i].addr != addr || nth-- > 0))
        i++;
    assert_true(i < map.nsegs);
    bool unc = map.segs[i].uncertain;
    mt__model_map_free(&map);
    return unc;
}

static void apply(mgen_t *g, int kind, uint64_t addr, uint64_t size)
{
    mt_event_rec_t ev = mgen_rec(g, kind, addr, size, 0);
    assert_int_equal(mt__model_apply(g->m, &ev), 0);
    check(g->m);
}

static void gap(mgen_t *g)
{
    mt_event_rec_t ev = {.kind = MT_EV_GAP, .size = 1};
    assert_int_equal(mt__model_apply(g->m, &ev), 0);
    check(g->m);
}

/* Segments at 2^64 - 1 (a crafted log's: they hold no byte, several coexist) and one whose
 * end runs past 2^64: each made certain again between gaps is uncertain after the next. */
static void test_segments_at_the_top(void **state)
{
    (void)state;
    mgen_t g = {0};
    assert_int_equal(mt__model_create(&g.m, NULL), 0);
    (void)mgen_rec(&g, MT_EV_SEGMENT_ALLOC, BASE, UINT64_C(1) << 50, 0); /* lost: room */
    const uint64_t top = UINT64_MAX, high = UINT64_MAX - MIB + 1;
    apply(&g, MT_EV_SEGMENT_ALLOC, high, 2 * MIB); /* runs past 2^64 */
    apply(&g, MT_EV_SEGMENT_ALLOC, top, 4096);
    gap(&g);
    assert_true(seg_uncertain(g.m, high, 0) && seg_uncertain(g.m, top, 0));
    apply(&g, MT_EV_SEGMENT_MAP, top, 8192); /* a second one at the top, newest first */
    apply(&g, MT_EV_ALLOC, top, 0);          /* touches the newest */
    assert_false(seg_uncertain(g.m, top, 0));
    assert_true(seg_uncertain(g.m, top, 1));
    apply(&g, MT_EV_ALLOC, high + 4096, 4096); /* touches the one past 2^64 */
    assert_false(seg_uncertain(g.m, high, 0));
    gap(&g);
    assert_true(seg_uncertain(g.m, high, 0) && seg_uncertain(g.m, top, 0) &&
                seg_uncertain(g.m, top, 1));
    mt__model_destroy(&g.m);
    /* the one past 2^64 touched at 2^64 - 1 itself, with none at the top */
    g = (mgen_t){0};
    assert_int_equal(mt__model_create(&g.m, NULL), 0);
    (void)mgen_rec(&g, MT_EV_SEGMENT_ALLOC, BASE, UINT64_C(1) << 50, 0); /* lost: room */
    apply(&g, MT_EV_SEGMENT_ALLOC, high, 2 * MIB);
    gap(&g);
    apply(&g, MT_EV_ALLOC, top, 0);
    assert_false(seg_uncertain(g.m, high, 0));
    gap(&g);
    mt_model_map_t map;
    assert_int_equal(mt__model_map(g.m, MT_MODEL_DEVICE, &map), 0);
    for (size_t i = 0; i < map.nsegs; i++)
        assert_true(map.segs[i].uncertain);
    mt__model_map_free(&map);
    mt__model_destroy(&g.m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_gaps),
        cmocka_unit_test(test_overlap_past_a_dropped_block),
        cmocka_unit_test(test_segments_at_the_top),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
