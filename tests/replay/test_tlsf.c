/* The one-pool TLSF bounds of bench_alloc's replay table (bench/tlsf.c, headers beside the
 * blocks; bench/tlsf_oob.c, records out of band): random allocates and frees never overlap
 * and stay in the pool, every invariant holds after each step, freed memory coalesces back
 * into one block, and an exhausted pool says so with NULL. The out-of-band pool is mapped
 * PROT_NONE, so any touch of it by that allocator would end the test with SIGSEGV. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "bench/tlsf.h"
#include "tests/common/test_main.h"

#define POOL  (8u << 20)
#define SLOTS 512

typedef struct live_s {
    unsigned char *p;
    size_t size;
    unsigned char tag;
} live_t;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Sizes from 0 B to 256 KiB, most of them small, as tensors are. */
static size_t random_size(void)
{
    unsigned shift = (unsigned)(next_rand() % 19);
    return (size_t)(next_rand() % ((size_t)1 << shift));
}

static int cmp_ptr(const void *a, const void *b)
{
    const live_t *x = a, *y = b;
    return x->p < y->p ? -1 : x->p > y->p;
}

/* Every live block lies in the pool [base, base + bytes) and none overlaps the next in
 * address order. */
static void assert_disjoint(const char *base, size_t bytes, const live_t *live)
{
    static live_t s[SLOTS];
    size_t n = 0;
    for (size_t i = 0; i < SLOTS; i++)
        if (live[i].p != NULL)
            s[n++] = live[i];
    qsort(s, n, sizeof *s, cmp_ptr);
    for (size_t i = 0; i < n; i++) {
        assert_true((const char *)s[i].p >= base);
        assert_true((const char *)s[i].p + s[i].size <= base + bytes);
        if (i + 1 < n)
            assert_true(s[i].p + s[i].size <= s[i + 1].p);
    }
}

static void assert_pool_disjoint(const mt_tlsf_t *t, const live_t *live)
{
    const char *base;
    size_t bytes;
    mt_tlsf_bounds(t, &base, &bytes);
    assert_disjoint(base, bytes, live);
}

static void test_random_ops(void **state)
{
    (void)state;
    mt_tlsf_t *t;
    assert_int_equal(mt_tlsf_create(&t, POOL), 0);
    static live_t live[SLOTS];
    memset(live, 0, sizeof live);
    size_t fails = 0;
    for (unsigned step = 0; step < 20000; step++) {
        live_t *l = &live[next_rand() % SLOTS];
        if (l->p != NULL) {
            /* Nobody wrote into it while it was ours. */
            for (size_t k = 0; k < l->size; k += 61)
                assert_int_equal(l->p[k], l->tag);
            mt_tlsf_free(t, l->p);
            l->p = NULL;
        } else {
            l->size = random_size();
            l->p = mt_tlsf_malloc(t, l->size);
            if (l->p == NULL) {
                fails++;
                continue;
            }
            assert_int_equal((uintptr_t)l->p % MT_TLSF_ALIGN, 0);
            l->tag = (unsigned char)(step | 1);
            memset(l->p, l->tag, l->size);
        }
        if (step % 64 == 0) {
            assert_int_equal(mt_tlsf_check(t), 0);
            assert_pool_disjoint(t, live);
        }
    }
    assert_int_equal(mt_tlsf_check(t), 0);
    assert_pool_disjoint(t, live);
    /* The pool holds 512 blocks of at most 256 KiB with room to spare most of the time. */
    print_message("%zu of the allocates failed\n", fails);
    assert_true(fails < 200);
    for (size_t i = 0; i < SLOTS; i++)
        mt_tlsf_free(t, live[i].p);
    assert_int_equal(mt_tlsf_in_use(t), 0);
    assert_int_equal(mt_tlsf_check(t), 0);
    /* Everything merged back into one block: 7/8 of the pool fits in one piece (good fit
     * rounds a request up to its list's bound, so the whole pool would not). */
    void *all = mt_tlsf_malloc(t, POOL / 8 * 7);
    assert_non_null(all);
    mt_tlsf_free(t, all);
    assert_int_equal(mt_tlsf_check(t), 0);
    mt_tlsf_destroy(&t);
    assert_null(t);
}

static void test_exhaustion_and_high_water(void **state)
{
    (void)state;
    mt_tlsf_t *t;
    assert_int_equal(mt_tlsf_create(&t, 1u << 20), 0);
    void *p[300];
    size_t n = 0;
    while (n < 300 && (p[n] = mt_tlsf_malloc(t, 4000)) != NULL)
        n++;
    /* 1 MiB holds 256 blocks of 4000 B (4016 with their headers, rounded), not 300. */
    assert_true(n >= 250 && n < 300);
    assert_true(mt_tlsf_high_water(t) <= 1u << 20);
    assert_true(mt_tlsf_high_water(t) >= n * 4000);
    assert_int_equal(mt_tlsf_check(t), 0);
    /* Freeing every other block leaves holes of 4000 B: a larger request does not fit in one
     * of them, an equal one does. */
    for (size_t i = 0; i < n; i += 2)
        mt_tlsf_free(t, p[i]);
    assert_null(mt_tlsf_malloc(t, 8192));
    void *q = mt_tlsf_malloc(t, 4000);
    assert_non_null(q);
    assert_int_equal(mt_tlsf_check(t), 0);
    mt_tlsf_free(t, q);
    for (size_t i = 1; i < n; i += 2)
        mt_tlsf_free(t, p[i]);
    assert_int_equal(mt_tlsf_check(t), 0);
    assert_non_null(q = mt_tlsf_malloc(t, 900u << 10));
    mt_tlsf_free(t, q);
    mt_tlsf_destroy(&t);
    assert_int_equal(mt_tlsf_create(&t, 100), MT_EINVAL);
    assert_null(t);
}

/* The out-of-band bound: the same random walk, its blocks granule-aligned and as large as
 * asked; the pool is never touched (PROT_NONE), so the blocks are checked by address. */
static void test_oob_random_ops(void **state)
{
    (void)state;
    mt_tlsf_oob_t *t;
    assert_int_equal(mt_tlsf_oob_create(&t, POOL), 0);
    const char *base;
    size_t bytes;
    mt_tlsf_oob_bounds(t, &base, &bytes);
    assert_int_equal(bytes, POOL);
    static live_t live[SLOTS];
    memset(live, 0, sizeof live);
    size_t fails = 0, want = 0;
    for (unsigned step = 0; step < 20000; step++) {
        live_t *l = &live[next_rand() % SLOTS];
        if (l->p != NULL) {
            mt_tlsf_oob_free(t, l->p);
            want -= l->size;
            l->p = NULL;
        } else {
            size_t size = random_size();
            l->p = mt_tlsf_oob_malloc(t, size);
            if (l->p == NULL) {
                fails++;
                continue;
            }
            assert_int_equal((uintptr_t)l->p % MT_TLSF_OOB_GRAN, 0);
            /* what it holds: the request rounded up to granules */
            l->size = size == 0
                          ? MT_TLSF_OOB_GRAN
                          : (size + MT_TLSF_OOB_GRAN - 1) / MT_TLSF_OOB_GRAN * MT_TLSF_OOB_GRAN;
            want += l->size;
        }
        assert_int_equal(mt_tlsf_oob_in_use(t), want);
        if (step % 64 == 0) {
            assert_int_equal(mt_tlsf_oob_check(t), 0);
            assert_disjoint(base, bytes, live);
        }
    }
    assert_int_equal(mt_tlsf_oob_check(t), 0);
    assert_disjoint(base, bytes, live);
    print_message("%zu of the allocates failed\n", fails);
    assert_true(fails < 200);
    for (size_t i = 0; i < SLOTS; i++)
        mt_tlsf_oob_free(t, live[i].p);
    assert_int_equal(mt_tlsf_oob_in_use(t), 0);
    assert_int_equal(mt_tlsf_oob_check(t), 0);
    void *all = mt_tlsf_oob_malloc(t, POOL / 8 * 7);
    assert_ptr_equal(all, base); /* one block again, from the pool's start */
    mt_tlsf_oob_free(t, all);
    assert_int_equal(mt_tlsf_oob_check(t), 0);
    mt_tlsf_oob_destroy(&t);
    assert_null(t);
}

static void test_oob_exhaustion_and_merges(void **state)
{
    (void)state;
    mt_tlsf_oob_t *t;
    assert_int_equal(mt_tlsf_oob_create(&t, 1u << 20), 0);
    void *p[300];
    size_t n = 0;
    while (n < 300 && (p[n] = mt_tlsf_oob_malloc(t, 4000)) != NULL)
        n++;
    /* No headers: 1 MiB holds exactly 256 blocks of 4000 B rounded to 4096, in order. */
    assert_int_equal(n, 256);
    assert_int_equal(mt_tlsf_oob_high_water(t), 1u << 20);
    assert_int_equal(mt_tlsf_oob_check(t), 0);
    for (size_t i = 1; i < n; i++)
        assert_ptr_equal((char *)p[i], (char *)p[i - 1] + 4096);
    /* Holes of 4096 B: a larger request does not fit, an equal one does, in a hole. */
    for (size_t i = 0; i < n; i += 2)
        mt_tlsf_oob_free(t, p[i]);
    assert_null(mt_tlsf_oob_malloc(t, 8192));
    void *q = mt_tlsf_oob_malloc(t, 4096);
    assert_non_null(q);
    assert_int_equal(((char *)q - (char *)p[0]) % 8192, 0);
    assert_int_equal(mt_tlsf_oob_check(t), 0);
    mt_tlsf_oob_free(t, q);
    /* Freeing the odd ones merges each with both neighbours: one block of 1 MiB again. */
    for (size_t i = 1; i < n; i += 2)
        mt_tlsf_oob_free(t, p[i]);
    assert_int_equal(mt_tlsf_oob_check(t), 0);
    assert_ptr_equal(q = mt_tlsf_oob_malloc(t, 1u << 20), p[0]);
    assert_null(mt_tlsf_oob_malloc(t, 1));
    mt_tlsf_oob_free(t, q);
    mt_tlsf_oob_destroy(&t);
    assert_int_equal(mt_tlsf_oob_create(&t, 100), MT_EINVAL);
    assert_null(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_ops),
        cmocka_unit_test(test_exhaustion_and_high_water),
        cmocka_unit_test(test_oob_random_ops),
        cmocka_unit_test(test_oob_exhaustion_and_merges),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
