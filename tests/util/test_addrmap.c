/* The address table (util/addrmap.h) and the segment map (util/segmap.h): random operations
 * against a plain reference, the checker after every step; the segment map's cuts at a
 * segment's start, end and middle, and mapped pages joining runs on either side. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "memtrace/common.h"
#include "util/addrmap.h"
#include "util/segmap.h"
#include "tests/common/test_main.h"

static uint64_t rng(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void check_amap(const mt__amap_t *m)
{
    char why[128] = "";
    if (mt__amap_check(m, why, sizeof why) != 0)
        fail_msg("%s", why);
}

/* Keys drawn from a small range (so puts replace and deletes hit), with the keys a
 * clustered allocator gives (multiples of 512); the reference is an array by key. At
 * each room (at most half, a quarter or a sixteenth full), the checker holding the table to
 * it. */
static void amap_random(unsigned room)
{
    enum { KEYS = 3000, OPS = 60000 };
    uint64_t *ref = calloc(KEYS, sizeof *ref); /* value + 1; 0 = absent */
    assert_non_null(ref);
    mt__amap_t m = {.room = room};
    uint64_t seed = 7, v;
    size_t most = 0;
    size_t n = 0;
    for (int op = 0; op < OPS; op++) {
        size_t k = rng(&seed) % KEYS;
        uint64_t key = (uint64_t)(k + 1) * 512;
        switch (rng(&seed) % 3) {
        case 0:
        case 1:
            assert_int_equal(mt__amap_put(&m, key, (uint64_t)op), 0);
            n += ref[k] == 0;
            ref[k] = (uint64_t)op + 1;
            break;
        default:
            assert_int_equal(mt__amap_del(&m, key), ref[k] ? 0 : MT_ENOENT);
            n -= ref[k] != 0;
            ref[k] = 0;
        }
        assert_int_equal(m.n, n);
        assert_true(m.cap >= m.n << (1 + room));
        most = n > most ? n : most;
        if (op % 97 == 0) {
            check_amap(&m);
            for (size_t j = 0; j < KEYS; j++) {
                int rc = mt__amap_get(&m, (uint64_t)(j + 1) * 512, &v);
                assert_int_equal(rc, ref[j] ? 0 : MT_ENOENT);
                if (ref[j])
                    assert_int_equal(v, ref[j] - 1);
            }
        }
    }
    check_amap(&m);
    assert_int_equal(mt__amap_put(&m, 0, 1), MT_EINVAL);
    assert_int_equal(mt__amap_get(&m, 0, &v), MT_ENOENT);
    assert_true(most > 1000); /* the table grew through several sizes */
    mt__amap_fini(&m);
    assert_int_equal(mt__amap_get(&m, 512, &v), MT_ENOENT); /* empty again */
    assert_int_equal(mt__amap_del(&m, 512), MT_ENOENT);
    assert_int_equal(m.room, room); /* kept for reuse */
    free(ref);
}

static void test_amap_random(void **state)
{
    (void)state;
    amap_random(0);
    amap_random(1);
    amap_random(3);
}

/* A quarter-full table grows where a half-full one would not, and the checker tells a
 * table fuller than its room allows. */
static void test_amap_room(void **state)
{
    (void)state;
    mt__amap_t half = {0}, quarter = {.room = 1};
    for (uint64_t k = 1; k <= 8; k++) {
        assert_int_equal(mt__amap_put(&half, k << 9, k), 0);
        assert_int_equal(mt__amap_put(&quarter, k << 9, k), 0);
    }
    assert_int_equal(half.cap, 16);
    assert_int_equal(quarter.cap, 32);
    check_amap(&half);
    check_amap(&quarter);
    quarter.room = 2;
    assert_int_equal(mt__amap_check(&quarter, NULL, 0), MT_EPROTO);
    half.room = 1; /* 8 keys in 16 slots: more than a quarter */
    assert_int_equal(mt__amap_check(&half, NULL, 0), MT_EPROTO);
    mt__amap_fini(&half);
    mt__amap_fini(&quarter);
    mt__amap_t wide = {.room = 4}; /* beyond a sixteenth: not a room the checker takes */
    assert_int_equal(mt__amap_check(&wide, NULL, 0), MT_EPROTO);
}

/* A sixteenth's room holds until the table passes 2^20 slots; from there on, a quarter's. */
static void test_amap_room_bounded(void **state)
{
    (void)state;
    mt__amap_t m = {.room = 3};
    uint64_t k = 1;
    for (; m.cap <= ((size_t)1 << 20); k++) {
        assert_int_equal(m.room, 3);
        assert_int_equal(mt__amap_put(&m, k << 9, k), 0);
    }
    assert_int_equal(m.room, 1);
    assert_int_equal(m.cap, (size_t)1 << 21);
    assert_int_equal(m.n, 65537); /* the 65,537th key needed more than 2^20 slots */
    check_amap(&m);
    mt__amap_fini(&m);
}

/* The checker sees a key its probe cannot reach. */
static void test_amap_check_fails(void **state)
{
    (void)state;
    mt__amap_t m = {0};
    for (uint64_t k = 1; k <= 5; k++)
        assert_int_equal(mt__amap_put(&m, k << 9, k), 0);
    check_amap(&m);
    size_t i = 0;
    while (m.keys[i] == 0)
        i++;
    m.keys[i] = 0; /* lost without n knowing */
    assert_int_equal(mt__amap_check(&m, NULL, 0), MT_EPROTO);
    mt__amap_fini(&m);
}

static void check_segs(const mt__segmap_t *m)
{
    char why[128] = "";
    if (mt__segmap_check(m, why, sizeof why) != 0)
        fail_msg("%s", why);
}

static mt__seg_t page(uint64_t at, uint64_t len, int mapped)
{
    return (mt__seg_t){.addr = at, .size = len, .stream = 1, .pool = 2, .mapped = (uint8_t)mapped};
}

#define MIB ((uint64_t)1 << 20)

/* The position of the i-th segment in address order (the end past the last). */
static mt__segmap_it_t nth(const mt__segmap_t *m, size_t i)
{
    mt__segmap_it_t it = mt__segmap_first(m);
    while (i-- > 0 && !mt__segmap_end(it))
        mt__segmap_next(&it);
    return it;
}

/* The index of the segment at it in address order, or -1 at the end. */
static long index_of(const mt__segmap_t *m, mt__segmap_it_t it)
{
    if (mt__segmap_end(it))
        return -1;
    long i = 0;
    for (mt__segmap_it_t k = mt__segmap_first(m); mt__segmap_get(k) != mt__segmap_get(it);
         mt__segmap_next(&k))
        i++;
    return i;
}

static void assert_seg(const mt__segmap_t *m, size_t i, uint64_t addr, uint64_t size)
{
    assert_true(i < mt__segmap_count(m));
    const mt__seg_t *g = mt__segmap_get(nth(m, i));
    assert_int_equal(g->addr, addr);
    assert_int_equal(g->size, size);
}

/* A run built by mapping at its end, at its start and into a gap; pages unmapped from its
 * start, end and middle. */
static void test_segmap_runs(void **state)
{
    (void)state;
    const uint64_t B = 0x100000000ull;
    mt__segmap_t m = {0};
    mt__seg_t s = page(B + 4 * MIB, 2 * MIB, 1);
    assert_int_equal(mt__segmap_add(&m, &s), 0);
    s = page(B + 6 * MIB, 2 * MIB, 1); /* at its end */
    assert_int_equal(mt__segmap_add(&m, &s), 0);
    s = page(B + 2 * MIB, 2 * MIB, 1); /* at its start */
    assert_int_equal(mt__segmap_add(&m, &s), 0);
    assert_int_equal(mt__segmap_count(&m), 1);
    assert_seg(&m, 0, B + 2 * MIB, 6 * MIB);
    s = page(B + 12 * MIB, 2 * MIB, 1); /* a second run */
    assert_int_equal(mt__segmap_add(&m, &s), 0);
    s = page(B + 8 * MIB, 4 * MIB, 1); /* the gap: the runs join */
    assert_int_equal(mt__segmap_add(&m, &s), 0);
    check_segs(&m);
    assert_int_equal(mt__segmap_count(&m), 1);
    assert_seg(&m, 0, B + 2 * MIB, 12 * MIB);
    assert_true(m.bytes == 12 * MIB);
    /* Pages out of the middle: two runs, both still mapped. */
    assert_int_equal(mt__segmap_cut(&m, B + 6 * MIB, 4 * MIB), 0);
    check_segs(&m);
    assert_int_equal(mt__segmap_count(&m), 2);
    assert_seg(&m, 0, B + 2 * MIB, 4 * MIB);
    assert_seg(&m, 1, B + 10 * MIB, 4 * MIB);
    assert_int_equal(index_of(&m, mt__segmap_find(&m, B + 11 * MIB)), 1);
    assert_int_equal(index_of(&m, mt__segmap_find(&m, B + 7 * MIB)), -1);
    /* Its start, then its end. */
    assert_int_equal(mt__segmap_cut(&m, B + 2 * MIB, 2 * MIB), 0);
    assert_int_equal(mt__segmap_cut(&m, B + 12 * MIB, 2 * MIB), 0);
    check_segs(&m);
    assert_seg(&m, 0, B + 4 * MIB, 2 * MIB);
    assert_seg(&m, 1, B + 10 * MIB, 2 * MIB);
    /* One unmap over both. */
    assert_int_equal(mt__segmap_cut(&m, B, 16 * MIB), 0);
    assert_int_equal(mt__segmap_count(&m), 0);
    assert_true(m.bytes == 0);
    mt__segmap_fini(&m);
}

/* What does not join: plain segments, another stream, an uncertain run. A new range cuts
 * what it overlaps. */
static void test_segmap_no_join(void **state)
{
    (void)state;
    mt__segmap_t m = {0};
    mt__seg_t s = page(0x10000000, MIB, 0);
    assert_int_equal(mt__segmap_add(&m, &s), 0);
    s = page(0x10100000, MIB, 0); /* plain: never joined */
    assert_int_equal(mt__segmap_add(&m, &s), 0);
    s = page(0x10200000, MIB, 1);
    assert_int_equal(mt__segmap_add(&m, &s), 0);
    s = page(0x10300000, MIB, 1);
    s.stream = 2; /* another stream's run */
    assert_int_equal(mt__segmap_add(&m, &s), 0);
    assert_int_equal(mt__segmap_count(&m), 4);
    mt__segmap_set_uncertain(&m, nth(&m, 2), true);
    assert_true(m.unc == MIB);
    s = page(0x10280000, MIB, 1); /* overlaps the uncertain run's end and the next */
    s.stream = 2;
    assert_int_equal(mt__segmap_add(&m, &s), 0);
    check_segs(&m);
    assert_int_equal(mt__segmap_count(&m), 4);
    assert_seg(&m, 2, 0x10200000, 0x80000);
    assert_seg(&m, 3, 0x10280000, 0x100000 + 0x80000); /* joined the stream-2 rest */
    assert_true(m.unc == 0x80000);
    (void)mt__segmap_remove(&m, nth(&m, 2));
    assert_true(m.unc == 0);
    check_segs(&m);
    mt__segmap_fini(&m);
}

/* Random maps and unmaps of 2 MiB pages in one range against a page bitmap: the runs are
 * the maximal runs of mapped pages. */
static void test_segmap_random(void **state)
{
    (void)state;
    enum { PAGES = 64, OPS = 20000 };
    const uint64_t B = 0x7f0000000000ull, P = 2 * MIB;
    bool mapped[PAGES] = {0};
    mt__segmap_t m = {0};
    uint64_t seed = 11;
    for (int op = 0; op < OPS; op++) {
        size_t at = rng(&seed) % PAGES, len = 1 + rng(&seed) % 6;
        len = at + len > PAGES ? PAGES - at : len;
        bool map = rng(&seed) % 2;
        if (map) {
            mt__seg_t s = page(B + at * P, len * P, 1);
            assert_int_equal(mt__segmap_add(&m, &s), 0);
        } else
            assert_int_equal(mt__segmap_cut(&m, B + at * P, len * P), 0);
        for (size_t i = at; i < at + len; i++)
            mapped[i] = map;
        check_segs(&m);
        size_t k = 0;
        for (size_t i = 0; i < PAGES;) {
            if (!mapped[i]) {
                i++;
                continue;
            }
            size_t j = i;
            while (j < PAGES && mapped[j])
                j++;
            assert_seg(&m, k++, B + i * P, (j - i) * P);
            i = j;
        }
        assert_int_equal(mt__segmap_count(&m), k);
    }
    mt__segmap_fini(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_amap_random),       cmocka_unit_test(test_amap_room),
        cmocka_unit_test(test_amap_room_bounded), cmocka_unit_test(test_amap_check_fails),
        cmocka_unit_test(test_segmap_runs),       cmocka_unit_test(test_segmap_no_join),
        cmocka_unit_test(test_segmap_random),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
