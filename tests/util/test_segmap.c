/* The segment map (util/segmap.h) against the sorted array it replaced, kept here as the
 * reference of its meaning: a cut at a segment's start, middle and end (and of nothing),
 * mapped runs joined on either side, uncertain segments never joined, segments at 2^64 - 1,
 * over many thousands of random operations with the checker after each; and segments
 * added in ascending and descending order, then cut and removed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "memtrace/common.h"
#include "util/segmap.h"
#include "tests/common/test_main.h"

static uint64_t rng(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

typedef struct ref_s {
    mt__seg_t v[16384];
    size_t n;
    unsigned __int128 bytes, unc;
} ref_t;

static uint64_t end_of(uint64_t addr, uint64_t size)
{
    return size > UINT64_MAX - addr ? UINT64_MAX : addr + size;
}

static size_t ref_lower(const ref_t *m, uint64_t addr)
{
    size_t i = 0;
    while (i < m->n && m->v[i].addr < addr)
        i++;
    return i;
}

static long ref_find(const ref_t *m, uint64_t addr)
{
    size_t i = ref_lower(m, addr);
    if (i < m->n && m->v[i].addr == addr)
        return (long)i;
    if (i == 0 || addr - m->v[i - 1].addr >= m->v[i - 1].size)
        return -1;
    return (long)i - 1;
}

static void ref_insert_at(ref_t *m, size_t i, const mt__seg_t *s)
{
    assert_true(m->n < sizeof m->v / sizeof m->v[0]);
    memmove(&m->v[i + 1], &m->v[i], (m->n - i) * sizeof *s);
    m->v[i] = *s;
    m->n++;
    m->bytes += s->size;
    m->unc += s->uncertain ? s->size : 0;
}

static void ref_remove_at(ref_t *m, size_t i)
{
    m->bytes -= m->v[i].size;
    m->unc -= m->v[i].uncertain ? m->v[i].size : 0;
    memmove(&m->v[i], &m->v[i + 1], (m->n - i - 1) * sizeof m->v[0]);
    m->n--;
}

static void ref_cut(ref_t *m, uint64_t addr, uint64_t size)
{
    uint64_t end = end_of(addr, size);
    size_t i = ref_lower(m, addr);
    i = i > 0 ? i - 1 : 0;
    while (i < m->n && m->v[i].addr < end) {
        mt__seg_t s = m->v[i];
        uint64_t send = end_of(s.addr, s.size);
        if (send <= addr) {
            i++;
            continue;
        }
        ref_remove_at(m, i);
        if (s.addr < addr) {
            mt__seg_t left = s;
            left.size = addr - s.addr;
            ref_insert_at(m, i++, &left);
        }
        if (send > end) {
            mt__seg_t right = s;
            right.addr = end;
            right.size = send - end;
            ref_insert_at(m, i++, &right);
        }
    }
}

static bool ref_joins(const mt__seg_t *run, const mt__seg_t *s)
{
    return s->mapped && run->mapped && !run->uncertain && !s->uncertain &&
           run->device == s->device && run->pool == s->pool && run->stream == s->stream;
}

static void ref_add(ref_t *m, const mt__seg_t *s)
{
    if (s->size == 0)
        return;
    ref_cut(m, s->addr, s->size);
    size_t i = ref_lower(m, s->addr);
    mt__seg_t *prev = i > 0 ? &m->v[i - 1] : NULL, *next = i < m->n ? &m->v[i] : NULL;
    bool wp = prev && ref_joins(prev, s) && end_of(prev->addr, prev->size) == s->addr &&
              s->size <= UINT64_MAX - prev->size;
    bool wn = next && ref_joins(next, s) && end_of(s->addr, s->size) == next->addr &&
              s->size <= UINT64_MAX - next->size;
    if (wp && wn && next->size <= UINT64_MAX - prev->size - s->size) {
        uint64_t more = next->size;
        ref_remove_at(m, i);
        m->v[i - 1].size += s->size + more;
        m->bytes += s->size + more;
    } else if (wp) {
        prev->size += s->size;
        m->bytes += s->size;
    } else if (wn) {
        next->addr = s->addr;
        next->size += s->size;
        m->bytes += s->size;
    } else {
        ref_insert_at(m, i, s);
    }
}

static void check_segs(const mt__segmap_t *m)
{
    char why[160] = "";
    if (mt__segmap_check(m, why, sizeof why) != 0)
        fail_msg("%s", why);
}

static mt__segmap_it_t nth(const mt__segmap_t *m, size_t i)
{
    mt__segmap_it_t it = mt__segmap_first(m);
    while (i-- > 0 && !mt__segmap_end(it))
        mt__segmap_next(&it);
    return it;
}

static void same_as_ref(const mt__segmap_t *m, const ref_t *r, size_t op)
{
    check_segs(m);
    if (mt__segmap_count(m) != r->n || m->bytes != r->bytes || m->unc != r->unc)
        fail_msg("op %zu: %zu segments, the reference %zu (or their sums differ)", op,
                 mt__segmap_count(m), r->n);
    size_t i = 0;
    for (mt__segmap_it_t it = mt__segmap_first(m); !mt__segmap_end(it); mt__segmap_next(&it)) {
        if (memcmp(mt__segmap_get(it), &r->v[i], sizeof r->v[i]) != 0)
            fail_msg("op %zu: segment %zu differs from the reference's (%#llx + %llu)", op, i,
                     (unsigned long long)r->v[i].addr, (unsigned long long)r->v[i].size);
        i++;
    }
}

/* Random adds (plain or mapped, two streams, some uncertain), cuts (of nothing too),
 * removals and flag changes over `pages` pages of 2 MiB at base, ops times. */
static void seg_random(uint64_t seed, uint64_t base, size_t pages, size_t ops)
{
    const uint64_t P = 2u << 20;
    mt__segmap_t m = {0};
    static ref_t r;
    memset(&r, 0, sizeof r);
    for (size_t op = 0; op < ops; op++) {
        uint64_t at = base + rng(&seed) % pages * P, len = (1 + rng(&seed) % 4) * P;
        if (rng(&seed) % 8 == 0) /* off the page grid: cuts inside a segment's pages */
            at += rng(&seed) % P, len = rng(&seed) % (3 * P);
        unsigned what = (unsigned)(rng(&seed) % 16);
        if (what < 9) {
            mt__seg_t s = {.addr = at,
                           .size = len,
                           .stream = (uint32_t)(rng(&seed) % 8 == 0),
                           .pool = 2,
                           .mapped = (uint8_t)(what < 6),
                           .uncertain = (uint8_t)(rng(&seed) % 16 == 0)};
            assert_int_equal(mt__segmap_add(&m, &s), 0);
            ref_add(&r, &s);
        } else if (what < 13) {
            assert_int_equal(mt__segmap_cut(&m, at, len), 0);
            ref_cut(&r, at, len);
        } else if (what < 14 && r.n > 0) {
            size_t i = rng(&seed) % r.n;
            (void)mt__segmap_remove(&m, nth(&m, i));
            ref_remove_at(&r, i);
        } else if (r.n > 0) {
            size_t i = rng(&seed) % r.n;
            bool u = rng(&seed) % 2;
            mt__segmap_set_uncertain(&m, nth(&m, i), u);
            r.unc -= r.v[i].uncertain ? r.v[i].size : 0;
            r.v[i].uncertain = u;
            r.unc += u ? r.v[i].size : 0;
        }
        same_as_ref(&m, &r, op);
        /* the searches from an address anywhere in the range */
        uint64_t q = base + rng(&seed) % (pages * P + P);
        long f = ref_find(&r, q);
        mt__segmap_it_t it = mt__segmap_find(&m, q);
        assert_true(f < 0 ? mt__segmap_end(it) : mt__segmap_get(it) == mt__segmap_get(nth(&m, f)));
        it = mt__segmap_lower(&m, q);
        assert_true(mt__segmap_get(it) == mt__segmap_get(nth(&m, ref_lower(&r, q))));
    }
    mt__segmap_fini(&m);
    check_segs(&m);
}

static void test_segmap_against_array(void **state)
{
    (void)state;
    seg_random(7, 0x7f0000000000ull, 48, 50000);    /* a few segments, cut and joined often */
    seg_random(9, 0x7f0000000000ull, 12000, 30000); /* thousands: the tree three levels */
    /* at the top of the address space, where ends saturate at 2^64 */
    seg_random(13, UINT64_MAX - 40 * (2ull << 20), 48, 20000);
}

/* Segments added one by one upwards and downwards, plain and mapped (which join into one
 * run), then cut from the start, the middle and the end. */
static void test_segmap_in_order(void **state)
{
    (void)state;
    const uint64_t B = 0x7f0000000000ull, P = 2u << 20;
    enum { N = 6000 };
    for (int mapped = 0; mapped < 2; mapped++)
        for (int down = 0; down < 2; down++) {
            mt__segmap_t m = {0};
            static ref_t r;
            memset(&r, 0, sizeof r);
            for (uint64_t k = 0; k < N; k++) {
                uint64_t i = down ? N - 1 - k : k;
                /* plain segments a page apart; mapped pages touching */
                mt__seg_t s = {.addr = B + i * P * (mapped ? 1 : 2),
                               .size = P,
                               .pool = 2,
                               .mapped = (uint8_t)mapped};
                assert_int_equal(mt__segmap_add(&m, &s), 0);
                ref_add(&r, &s);
                if (k % 512 == 0)
                    same_as_ref(&m, &r, k);
            }
            same_as_ref(&m, &r, N);
            assert_int_equal(mt__segmap_count(&m), mapped ? 1 : N);
            uint64_t span = N * P * (mapped ? 1 : 2);
            const uint64_t cuts[][2] = {
                {B, 3 * P}, {B + span / 2 - P / 2, 5 * P}, {B + span - 3 * P, 3 * P}};
            for (size_t c = 0; c < 3; c++) {
                assert_int_equal(mt__segmap_cut(&m, cuts[c][0], cuts[c][1]), 0);
                ref_cut(&r, cuts[c][0], cuts[c][1]);
                same_as_ref(&m, &r, N + c);
            }
            /* and every other one taken out, upwards */
            for (mt__segmap_it_t it = mt__segmap_first(&m); !mt__segmap_end(it);) {
                it = mt__segmap_remove(&m, it);
                if (!mt__segmap_end(it))
                    mt__segmap_next(&it);
            }
            check_segs(&m);
            mt__segmap_fini(&m);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_segmap_against_array),
        cmocka_unit_test(test_segmap_in_order),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
