/* Rounding, size classes and bins, split and merge rules, and the configuration keys. */
#include "helpers.h"
#include "tests/common/test_main.h"

/* ---- rounding ---- */

static void test_round_default(void **state)
{
    (void)state;
    assert_int_equal(mt__alloc_round_size(1, 0), 512);
    assert_int_equal(mt__alloc_round_size(512, 0), 512);
    assert_int_equal(mt__alloc_round_size(513, 0), 1024);
    assert_int_equal(mt__alloc_round_size(1200, 0), 1536);
    assert_int_equal(mt__alloc_round_size(MIB + 1, 0), MIB + 512);
}

/* PyTorch's round_size: with N > 1 divisions and a size above N x 512 B, the next of N
 * steps between two powers of two; else 512-byte steps. Values worked from its code. */
static void test_round_power2_divisions(void **state)
{
    (void)state;
    assert_int_equal(mt__alloc_round_size(1200, 4), 1536); /* <= 4 x 512: plain */
    assert_int_equal(mt__alloc_round_size(1024, 4), 1024);
    assert_int_equal(mt__alloc_round_size(2049, 2), 3072); /* steps of 1024 from 2048 */
    assert_int_equal(mt__alloc_round_size(3000, 4), 3072);
    assert_int_equal(mt__alloc_round_size(300, 4), 512);
    assert_int_equal(mt__alloc_round_size(4096, 4), 4096); /* a power of two stays */
    /* 5 MiB + 1 with 4 divisions of [4, 8) MiB -> 6 MiB; 1 division means none. */
    assert_int_equal(mt__alloc_round_size(5 * MIB + 1, 4), 6 * MIB);
    assert_int_equal(mt__alloc_round_size(5 * MIB + 1, 1), 5 * MIB + 512);
    assert_int_equal(mt__alloc_round_size(600, 64), 1024);
    assert_int_equal(mt__alloc_round_size(40000, 64), 40448); /* floor 32768 / 64 = 512 */

    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, "roundup_power2_divisions:4", NULL);
    void *p = xmalloc_dev(a, 5 * MIB + 1, NULL, MT_TAG_OTHER);
    size_t sz = 0;
    assert_int_equal(mt_alloc_block_info(a, p, NULL, &sz, NULL), 0);
    assert_int_equal(sz, 6 * MIB);
    void *q = xmalloc_dev(a, 1200, NULL, MT_TAG_OTHER);
    assert_int_equal(mt_alloc_block_info(a, q, NULL, &sz, NULL), 0);
    assert_int_equal(sz, 1536);
    assert_int_equal((uintptr_t)q % 512, 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, p);
    mt_alloc_free(a, q);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* The per-interval list, read as PyTorch's parser reads it: the first key also fills the
 * intervals below it, and ">" fills from the last key's interval (that one included). */
static void test_round_divisions_per_interval(void **state)
{
    (void)state;
    mt_alloc_cfg_t c = mt_alloc_cfg_default();
    char err[256];
    assert_int_equal(
        mt_alloc_cfg_parse(&c, "roundup_power2_divisions:[256:1,512:2,1024:4,>:8],tcache:1", err,
                           sizeof err),
        0);
    assert_int_equal(mt__alloc_divisions(&c, 1000), 1);
    assert_int_equal(mt__alloc_divisions(&c, 300 * MIB), 1);
    assert_int_equal(mt__alloc_divisions(&c, 600 * MIB), 2);
    assert_int_equal(mt__alloc_divisions(&c, 1536 * MIB), 8); /* ">" overwrote 1024's 4 */
    assert_int_equal(mt__alloc_divisions(&c, (size_t)100 << 30), 8);
    assert_int_equal(
        mt_alloc_cfg_parse(&c, "roundup_power2_divisions:[ 2 : 4 , >:2 ]", err, sizeof err), 0);
    assert_int_equal(mt__alloc_divisions(&c, 512), 4);     /* below 1 MiB: interval 0 */
    assert_int_equal(mt__alloc_divisions(&c, 3 * MIB), 2); /* [2, 4) MiB, overwritten */
    assert_int_equal(mt__alloc_divisions(&c, 9 * MIB), 2);
    assert_int_equal(mt_alloc_cfg_parse(&c, "roundup_power2_divisions:16", err, sizeof err), 0);
    for (size_t i = 0; i < MT_ALLOC_ROUNDUP_INTERVALS; i++)
        assert_int_equal(c.roundup_power2_divisions[i], 16);

    /* The allocator rounds by the interval of each request. */
    mt_backend_t *b = sim_backend(1024 * MIB);
    mt_alloc_t *a = make_alloc(b, "roundup_power2_divisions:[4:1,8:4,16:1]", NULL);
    void *p = xmalloc_dev(a, 5 * MIB + 1, NULL, MT_TAG_OTHER); /* [4, 8): 1 -> 512 B steps */
    void *q = xmalloc_dev(a, 9 * MIB + 1, NULL, MT_TAG_OTHER); /* [8, 16): 4 -> 10 MiB */
    size_t sz = 0;
    assert_int_equal(mt_alloc_block_info(a, p, NULL, &sz, NULL), 0);
    assert_int_equal(sz, 5 * MIB + 512);
    assert_int_equal(mt_alloc_block_info(a, q, NULL, &sz, NULL), 0);
    assert_int_equal(sz, 10 * MIB);
    assert_int_equal(mt__alloc_round(a, 17 * MIB + 1), 17 * MIB + 512); /* [16, 32): 1 */
    mt_alloc_free(a, p);
    mt_alloc_free(a, q);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* ---- size classes and bins ---- */

static void test_class_mapping(void **state)
{
    (void)state;
    /* Classes are monotonic, each size lies in [min(c), min(c+1)), and a class spans at
     * most 1/32 of its power of two above the linear range. */
    unsigned prev = 0;
    for (size_t s = 512; s < 64 * MIB; s += s / 97 / 256 * 256 + 256) {
        unsigned c = mt__bin_class(s);
        assert_true(c >= prev);
        assert_true(mt__bin_class_min(c) <= s);
        assert_true(mt__bin_class_min(c + 1) > s);
        if (s >= 32 * 256)
            assert_true(mt__bin_class_min(c + 1) - mt__bin_class_min(c) <= s / 32 + 256);
        prev = c;
    }
    assert_int_equal(mt__bin_class(512), 2);
    assert_int_equal(mt__bin_class(8192), 32);
    assert_int_equal(mt__bin_class(8192 + 256), 33);
    assert_int_equal(mt__bin_class(16384), 64);
    assert_int_equal(mt__bin_class(16384 + 256), 64); /* same class: step 512 there */
    assert_int_equal(mt__bin_class(16384 + 512), 65);
    /* the linear row's edges, and sizes past the last row in its last class */
    assert_int_equal(mt__bin_class(0), 0);
    assert_int_equal(mt__bin_class(8192 - 256), 31);
    assert_int_equal(mt__bin_class(((size_t)1 << 60) - 256), MT__NCLASS - 1);
    assert_int_equal(mt__bin_class(SIZE_MAX), MT__NCLASS - 1);
    assert_true(mt__bin_class(((size_t)1 << 59) - 256) < MT__NCLASS - 1);
}

static mt_block_t *fake_block(mt_segment_t *seg, size_t size)
{
    mt_block_t *b = calloc(1, sizeof *b);
    b->size = size;
    b->addr = 4096;
    b->seg = seg;
    b->state = MT_BLOCK_INACTIVE;
    return b;
}

static void test_bins_find(void **state)
{
    (void)state;
    mt_binset_t *bs = mt__bins_create(MT__BP_LARGE, NULL);
    mt_segment_t seg = {.bins = bs, .pool = MT__BP_LARGE};
    assert_null(mt__bins_find(bs, 512, SIZE_MAX));
    mt_block_t *b1 = fake_block(&seg, 3 * MIB);
    mt_block_t *b2 = fake_block(&seg, 3 * MIB + 64 * KIB);
    mt_block_t *b3 = fake_block(&seg, 40 * MIB);
    mt__bins_insert(bs, b3);
    mt__bins_insert(bs, b2);
    mt__bins_insert(bs, b1);
    size_t n = 0;
    assert_null(mt__bins_check(bs, &n));
    assert_int_equal(n, 3);
    /* Best fit inside the class, then the next non-empty class by bitmap. */
    assert_ptr_equal(mt__bins_find(bs, 3 * MIB, SIZE_MAX), b1);
    assert_ptr_equal(mt__bins_find(bs, 3 * MIB + 1024, SIZE_MAX), b2);
    assert_ptr_equal(mt__bins_find(bs, 4 * MIB, SIZE_MAX), b3);
    assert_null(mt__bins_find(bs, 41 * MIB, SIZE_MAX));
    /* The upper bound (oversize rules) excludes big blocks. */
    assert_null(mt__bins_find(bs, 4 * MIB, 40 * MIB));
    assert_int_equal(mt__bins_largest(bs), 40 * MIB);
    mt__bins_remove(bs, b3);
    assert_null(mt__bins_find(bs, 4 * MIB, SIZE_MAX));
    assert_int_equal(bs->row_map & (1ull << (mt__bin_class(40 * MIB) / 32)), 0);
    assert_null(mt__bins_check(bs, &n));
    assert_int_equal(n, 2);
    mt__bins_remove(bs, b1);
    mt__bins_remove(bs, b2);
    assert_int_equal(bs->row_map, 0);
    assert_int_equal(bs->nblocks, 0);
    free(b1);
    free(b2);
    free(b3);
    free(bs);
}

/* ---- split and merge ---- */

static void test_small_split_merge(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    char *p1 = xmalloc_dev(a, 1000, NULL, 0);
    char *p2 = xmalloc_dev(a, 1000, NULL, 0);
    char *p3 = xmalloc_dev(a, 1000, NULL, 0);
    /* One 2 MiB small segment, split in address order. */
    assert_ptr_equal(p2, p1 + 1024);
    assert_ptr_equal(p3, p2 + 1024);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_SMALL].current, 2 * MIB);
    assert_int_equal(s.segment[MT_STAT_ALL].current, 1);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 3 * 1024);
    assert_int_equal(s.requested_bytes[MT_STAT_ALL].current, 3000);
    assert_int_equal(s.inactive_split_bytes[MT_STAT_ALL].current, 2 * MIB - 3 * 1024);
    /* Free the middle one: it stays a separate free block between two allocated ones. */
    mt_alloc_free(a, p2);
    s = stats_of(a);
    assert_int_equal(s.inactive_split[MT_STAT_ALL].current, 2);
    assert_int_equal(mt_alloc_check(a), 0);
    /* Freeing p1 merges with p2's block; freeing p3 merges everything back. */
    mt_alloc_free(a, p1);
    s = stats_of(a);
    assert_int_equal(s.inactive_split[MT_STAT_ALL].current, 2);
    assert_int_equal(s.inactive_split_bytes[MT_STAT_ALL].current, 2 * MIB - 1024);
    mt_alloc_free(a, p3);
    s = stats_of(a);
    assert_int_equal(s.inactive_split[MT_STAT_ALL].current, 0);
    assert_int_equal(s.largest_free_block, 2 * MIB);
    assert_true(s.fragmentation == 0.0);
    assert_int_equal(mt_alloc_check(a), 0);
    /* Cached: the same request comes back without a backend call. */
    uint64_t m = backend_mallocs(b);
    void *p4 = xmalloc_dev(a, 1000, NULL, 0);
    assert_ptr_equal(p4, p1);
    assert_int_equal(backend_mallocs(b), m);
    mt_alloc_free(a, p4);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* Equal-size free blocks come back lowest address first, whichever was freed last: the
 * reference's best fit (ordered by size, then address), with no same-size layer of its own
 * order in front of the bins. A LIFO of whole freed blocks returned p3 here. */
static void test_equal_sizes_lowest_address(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    enum { N = 6 };
    char *p[N];
    for (int i = 0; i < N; i++)
        p[i] = xmalloc_dev(a, 4096, NULL, 0);
    for (int i = 1; i < N; i++)
        assert_ptr_equal(p[i], p[i - 1] + 4096);
    /* Free every other block, lowest last: none of them merges with another. */
    for (int i = N - 2; i >= 0; i -= 2)
        mt_alloc_free(a, p[i]);
    for (int i = 0; i < N; i += 2) {
        void *q = xmalloc_dev(a, 4096, NULL, 0);
        assert_ptr_equal(q, p[i]);
    }
    /* The same with the highest freed last, and one reused at once in between. */
    for (int i = 0; i < N; i += 2)
        mt_alloc_free(a, p[i]);
    void *q = xmalloc_dev(a, 4096, NULL, 0);
    assert_ptr_equal(q, p[0]);
    mt_alloc_free(a, q);
    q = xmalloc_dev(a, 4096, NULL, 0);
    assert_ptr_equal(q, p[0]);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, q);
    for (int i = 1; i < N; i += 2)
        mt_alloc_free(a, p[i]);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_large_split_rules(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(512 * MIB);
    mt_alloc_t *a = make_alloc(b, NULL, NULL);
    /* 3 MiB gets a 20 MiB segment; the 17 MiB remainder (> 1 MiB) is split off. */
    void *p = xmalloc_dev(a, 3 * MIB, NULL, 0);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_LARGE].current, 20 * MIB);
    assert_int_equal(s.allocated_bytes[MT_STAT_LARGE].current, 3 * MIB);
    assert_int_equal(s.inactive_split_bytes[MT_STAT_LARGE].current, 17 * MIB);
    /* 16.5 MiB from the 17 MiB remainder: 0.5 MiB left is not > 1 MiB, so no split. */
    void *q = xmalloc_dev(a, 16 * MIB + 512 * KIB, NULL, 0);
    size_t sz = 0;
    assert_int_equal(mt_alloc_block_info(a, q, NULL, &sz, NULL), 0);
    assert_int_equal(sz, 17 * MIB);
    s = stats_of(a);
    assert_int_equal(s.allocated_bytes[MT_STAT_LARGE].current, 20 * MIB);
    assert_int_equal(s.requested_bytes[MT_STAT_LARGE].current, 19 * MIB + 512 * KIB);
    /* 11 MiB: a segment rounded up to 2 MiB (12 MiB), not 20. */
    void *r = xmalloc_dev(a, 11 * MIB, NULL, 0);
    s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_LARGE].current, 32 * MIB);
    assert_int_equal(s.segment[MT_STAT_LARGE].current, 2);
    /* Interior pointers resolve to their block. */
    void *base = NULL;
    assert_int_equal(mt_alloc_block_info(a, (char *)q + 12345, &base, &sz, NULL), 0);
    assert_ptr_equal(base, q);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, p);
    mt_alloc_free(a, q);
    mt_alloc_free(a, r);
    assert_int_equal(mt_alloc_free(a, r), MT_ENOENT);
    assert_int_equal(mt_alloc_free(a, (char *)p + 512), MT_ENOENT);
    assert_int_equal(mt_alloc_block_info(a, p, NULL, NULL, NULL), MT_ENOENT);
    assert_int_equal(mt_alloc_check(a), 0);
    s = stats_of(a);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(s.inactive_split_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    s = stats_of(a);
    assert_int_equal(s.reserved_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(s.num_device_free, 2);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_max_split_size_rules(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(1024 * MIB);
    mt_alloc_t *a = make_alloc(b, "max_split_size_mb:64", NULL);
    /* A 100 MiB (oversize) block cached... */
    void *big = xmalloc_dev(a, 100 * MIB, NULL, 0);
    mt_alloc_free(a, big);
    /* ...is not taken by a request below max_split_size, */
    uint64_t m = backend_mallocs(b);
    void *small = xmalloc_dev(a, 30 * MIB, NULL, 0);
    assert_true(small != big);
    assert_int_equal(backend_mallocs(b), m + 1);
    /* nor by an oversize request 20 MiB or more smaller than it, */
    void *over = xmalloc_dev(a, 70 * MIB, NULL, 0);
    assert_true(over != big);
    /* but by one within 20 MiB of it, and then it is not split. */
    void *over2 = xmalloc_dev(a, 90 * MIB, NULL, 0);
    assert_ptr_equal(over2, big);
    size_t sz = 0;
    assert_int_equal(mt_alloc_block_info(a, over2, NULL, &sz, NULL), 0);
    assert_int_equal(sz, 100 * MIB);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, small);
    mt_alloc_free(a, over);
    mt_alloc_free(a, over2);
    mt_alloc_destroy(&a);

    /* max_non_split_rounding_mb widens that 20 MiB: a 64 MiB margin lets the 70 MiB request
     * take the cached 100 MiB block whole. */
    a = make_alloc(b, "max_split_size_mb:64,max_non_split_rounding_mb:64", NULL);
    big = xmalloc_dev(a, 100 * MIB, NULL, 0);
    mt_alloc_free(a, big);
    m = backend_mallocs(b);
    over = xmalloc_dev(a, 70 * MIB, NULL, 0);
    assert_ptr_equal(over, big);
    assert_int_equal(backend_mallocs(b), m);
    assert_int_equal(mt_alloc_block_info(a, over, NULL, &sz, NULL), 0);
    assert_int_equal(sz, 100 * MIB);
    /* PyTorch's oversize counters: the 100 MiB block and its segment. */
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(a, &st), 0);
    assert_int_equal(st.oversize_allocations.current, 1);
    assert_int_equal(st.oversize_allocations.allocated, 2);
    assert_int_equal(st.oversize_segments.current, 1);
    assert_int_equal(st.max_split_size, 64 * MIB);
    /* ...but not a request under max_split_size. */
    mt_alloc_free(a, over);
    assert_int_equal(mt_alloc_stats(a, &st), 0);
    assert_int_equal(st.oversize_allocations.current, 0);
    assert_int_equal(st.oversize_allocations.freed, 2);
    assert_int_equal(st.oversize_allocations.peak, 1);
    /* reset_accumulated zeroes what is cumulative, keeps what is current and the peaks. */
    mt_alloc_reset_accumulated(a);
    assert_int_equal(mt_alloc_stats(a, &st), 0);
    assert_int_equal(st.oversize_allocations.allocated, 0);
    assert_int_equal(st.oversize_allocations.freed, 0);
    assert_int_equal(st.oversize_allocations.peak, 1);
    assert_int_equal(st.oversize_segments.current, 1);
    assert_int_equal(st.allocation[MT_STAT_ALL].allocated, 0);
    assert_int_equal(st.num_device_alloc, 0);
    assert_true(st.reserved_bytes[MT_STAT_ALL].current >= (int64_t)(100 * MIB));
    small = xmalloc_dev(a, 30 * MIB, NULL, 0);
    assert_true(small != big);
    mt_alloc_free(a, small);
    assert_int_equal(mt_alloc_stats(a, &st), 0);
    assert_int_equal(st.allocation[MT_STAT_ALL].allocated, 1);
    assert_int_equal(st.allocation[MT_STAT_ALL].freed, 1);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* ---- configuration ---- */

static void test_config_keys(void **state)
{
    (void)state;
    mt_alloc_cfg_t c = mt_alloc_cfg_default();
    assert_int_equal(c.max_split_size, SIZE_MAX);
    assert_true(c.release_on_oom);
    assert_true(c.memory_fraction == 1.0);
    char err[256];
    assert_int_equal(mt_alloc_cfg_parse(&c,
                                        "max_split_size_mb:128, roundup_power2_divisions:8,"
                                        "garbage_collection_threshold:0.6,"
                                        "memory_fraction:0.5,expandable_segments:True,"
                                        "release_on_oom:false,"
                                        "release_smaller_segments:False",
                                        err, sizeof err),
                     0);
    assert_int_equal(c.max_split_size, 128 * MIB);
    assert_int_equal(c.roundup_power2_divisions[0], 8);
    assert_int_equal(c.roundup_power2_divisions[MT_ALLOC_ROUNDUP_INTERVALS - 1], 8);
    assert_int_equal(c.max_non_split_rounding, 20 * MIB);
    assert_int_equal(mt_alloc_cfg_parse(&c, "max_non_split_rounding_mb:48", err, sizeof err), 0);
    assert_int_equal(c.max_non_split_rounding, 48 * MIB);
    assert_true(c.garbage_collection_threshold == 0.6);
    assert_true(c.memory_fraction == 0.5);
    assert_true(c.expandable_segments);
    assert_false(c.release_on_oom);
    assert_false(c.release_smaller_segments);
    assert_true(mt_alloc_cfg_default().release_smaller_segments);
    assert_int_equal(mt_alloc_cfg_parse(&c, "expandable_segments:0", err, sizeof err), 0);
    assert_false(c.expandable_segments);
    assert_int_equal(mt_alloc_cfg_parse(&c,
                                        "release_to_fit:True,fit_large_segments:1,"
                                        "split_large_tails:true,one_pool:True",
                                        err, sizeof err),
                     0);
    assert_true(c.release_to_fit && c.fit_large_segments && c.split_large_tails && c.one_pool);
    assert_int_equal(
        mt_alloc_cfg_parse(&c, "place_high_mb:48,expandable_segments:1", err, sizeof err), 0);
    assert_int_equal(c.place_high, 48 * MIB);
    /* rules:reference turns every policy beyond the reference's off, and later keys apply
     * on top of it. */
    assert_int_equal(
        mt_alloc_cfg_parse(&c, "rules:reference,max_split_size_mb:64", err, sizeof err), 0);
    assert_false(c.expandable_segments || c.release_to_fit || c.fit_large_segments ||
                 c.split_large_tails || c.one_pool);
    assert_int_equal(c.place_high, 0);
    assert_int_equal(c.max_split_size, 64 * MIB);
    assert_false(c.release_on_oom); /* not a placement rule: left as set above */
    /* The default: the recommended cold setting of docs/allocator-policy.md. */
    mt_alloc_cfg_t d = mt_alloc_cfg_default();
    assert_true(d.expandable_segments && d.release_to_fit && d.one_pool);
    assert_int_equal(d.place_high, 32 * MIB);
    assert_false(d.fit_large_segments || d.split_large_tails);
}

static void expect_bad(const char *conf, const char *key, const char *value)
{
    mt_alloc_cfg_t c = mt_alloc_cfg_default();
    mt_alloc_cfg_t before = c;
    char err[256] = "";
    assert_int_equal(mt_alloc_cfg_parse(&c, conf, err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, key));
    assert_non_null(strstr(err, value));
    assert_memory_equal(&c, &before, sizeof c);
}

static void test_config_errors(void **state)
{
    (void)state;
    expect_bad("max_split_size_mb:abc", "max_split_size_mb", "abc");
    expect_bad("release_to_fit:maybe", "release_to_fit", "maybe");
    expect_bad("one_pool:2", "one_pool", "2");
    expect_bad("max_split_size_mb:10", "max_split_size_mb", "10");
    expect_bad("roundup_power2_divisions:3", "roundup_power2_divisions", "3");
    expect_bad("roundup_power2_divisions:[3:2]", "roundup_power2_divisions", "[3:2]");
    expect_bad("roundup_power2_divisions:[256:3]", "roundup_power2_divisions", "[256:3]");
    expect_bad("roundup_power2_divisions:[256:2", "roundup_power2_divisions", "[256:2");
    expect_bad("roundup_power2_divisions:[256]", "roundup_power2_divisions", "[256]");
    expect_bad("roundup_power2_divisions:[256:2,x:4]", "roundup_power2_divisions", "x:4");
    expect_bad("max_non_split_rounding_mb:10", "max_non_split_rounding_mb", "10");
    expect_bad("garbage_collection_threshold:1.5", "garbage_collection_threshold", "1.5");
    expect_bad("garbage_collection_threshold:x", "garbage_collection_threshold", "x");
    expect_bad("memory_fraction:0", "memory_fraction", "0");
    expect_bad("memory_fraction:2", "memory_fraction", "2");
    expect_bad("expandable_segments:maybe", "expandable_segments", "maybe");
    expect_bad("release_on_oom:yes", "release_on_oom", "yes");
    expect_bad("release_smaller_segments:2", "release_smaller_segments", "2");
    expect_bad("bogus_key:1", "bogus_key", "1");
    expect_bad("place_high_mb:-1", "place_high_mb", "-1");
    expect_bad("rules:pytorch", "rules", "pytorch");
    /* A good key before a bad one is not applied either. */
    expect_bad("expandable_segments:True,nope:2", "nope", "2");
    expect_bad("max_split_size_mb", "max_split_size_mb", "");

    setenv("MEMTRACE_ALLOC_CONF", "expandable_segments:true,max_split_size_mb:200", 1);
    mt_alloc_cfg_t c = mt_alloc_cfg_default();
    char err[256];
    assert_int_equal(mt_alloc_cfg_from_env(&c, err, sizeof err), 0);
    assert_true(c.expandable_segments);
    assert_int_equal(c.max_split_size, 200 * MIB);
    setenv("MEMTRACE_ALLOC_CONF", "frobnicate:1", 1);
    assert_int_equal(mt_alloc_cfg_from_env(&c, err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "frobnicate"));
    unsetenv("MEMTRACE_ALLOC_CONF");

    /* The constructor validates too. */
    mt_backend_t *b = sim_backend(64 * MIB);
    c = mt_alloc_cfg_default();
    c.backend = b;
    c.memory_fraction = 1.5;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &c), MT_EINVAL);
    assert_null(a);
    c.memory_fraction = 1.0;
    c.backend = NULL;
    assert_int_equal(mt_alloc_create(&a, &c), MT_EINVAL);
    mt_backend_destroy(&b);
}

/* torch.cuda.memory._set_allocator_settings: the keys that can change do, each change is
 * an event, and the rest are refused by name with nothing changed. */
static void test_settings_at_run_time(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(1024 * MIB);
    rec_sink_t r;
    rec_init(&r);
    mt_alloc_t *a = make_alloc(b, "tcache:1", &r.sink);
    void *p = xmalloc_dev(a, 100 * MIB, NULL, 0);
    char err[256];
    assert_int_equal(mt_alloc_set_settings(a,
                                           "max_split_size_mb:64,roundup_power2_divisions:4,"
                                           "garbage_collection_threshold:0.5",
                                           err, sizeof err),
                     0);
    /* The live 100 MiB block counts as oversize under the new rule. */
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(a, &st), 0);
    assert_int_equal(st.max_split_size, 64 * MIB);
    assert_int_equal(st.oversize_allocations.current, 1);
    assert_int_equal(mt_alloc_check(a), 0);
    /* New requests take the new rounding. */
    void *q = xmalloc_dev(a, 5 * MIB + 1, NULL, 0);
    size_t sz = 0;
    assert_int_equal(mt_alloc_block_info(a, q, NULL, &sz, NULL), 0);
    assert_int_equal(sz, 6 * MIB);
    /* One event per changed value: max_split, gc threshold, 16 intervals. */
    assert_int_equal(rec_count(&r, MT_EV_SETTING), 18);
    bool seen = false;
    for (size_t i = 0; i < r.n; i++)
        if (r.ev[i].kind == MT_EV_SETTING && r.ev[i].addr == MT_SETTING_MAX_SPLIT_SIZE) {
            assert_int_equal(r.ev[i].size, 64 * MIB);
            assert_true(r.ev[i].requested == UINT64_MAX);
            seen = true;
        }
    assert_true(seen);
    char nb[48];
    assert_string_equal(mt_setting_name(MT_SETTING_ROUNDUP_0 + 3, nb, sizeof nb),
                        "roundup_power2_divisions[3]");
    /* Keys that shape existing segments are refused by name; nothing changes. */
    size_t n0 = r.n;
    assert_int_equal(mt_alloc_set_settings(a, "release_on_oom:False,tcache:False", err, sizeof err),
                     MT_ENOTSUP);
    assert_non_null(strstr(err, "tcache"));
    assert_int_equal(mt_alloc_set_settings(a, "max_split_size_mb:x", err, sizeof err), MT_EINVAL);
    assert_int_equal(r.n, n0);
    assert_int_equal(mt_alloc_stats(a, &st), 0);
    assert_int_equal(st.max_split_size, 64 * MIB);
    /* Back to unlimited: the block is no longer oversize. */
    assert_int_equal(mt_alloc_set_settings(a, "max_split_size_mb:1000000000000", err, sizeof err),
                     0);
    mt_alloc_free(a, p);
    mt_alloc_free(a, q);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    rec_fini(&r);
    mt_backend_destroy(&b);
}

static void test_memory_fraction_limit(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(100 * MIB);
    mt_alloc_t *a = make_alloc(b, "memory_fraction:0.5", NULL);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.limit, 50 * MIB);
    void *p = xmalloc_dev(a, 40 * MIB, NULL, 0);
    void *q = NULL;
    /* 40 + 20 MiB would exceed the 50 MiB limit although the device has room. */
    assert_int_equal(mt_alloc_malloc(a, 12 * MIB, NULL, 0, &q), MT_ENOMEM);
    assert_null(q);
    assert_non_null(strstr(mt_alloc_last_error(a), "limit"));
    s = stats_of(a);
    assert_int_equal(s.num_ooms, 1);
    assert_true(s.reserved_bytes[MT_STAT_ALL].current <= (int64_t)(50 * MIB));
    mt_alloc_free(a, p);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* The checker is only worth its calls if it notices damage: corrupt, expect a
 * violation naming it, repair, expect none. */
static void test_check_detects_corruption(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, "tcache:0", NULL); /* p's block to the bins (test_tcache) */
    char *p = xmalloc_dev(a, 1000, NULL, 0);
    char *q = xmalloc_dev(a, 1000, NULL, 0);
    mt_alloc_free(a, p);
    assert_int_equal(mt_alloc_check(a), 0);

    a->st.allocated_bytes[MT_STAT_SMALL].current += 512;
    assert_int_equal(mt_alloc_check(a), MT_EIO);
    assert_non_null(strstr(mt_alloc_last_error(a), "allocated_bytes"));
    a->st.allocated_bytes[MT_STAT_SMALL].current -= 512;
    assert_int_equal(mt_alloc_check(a), 0);

    mt_block_t *free_blk = a->segs->first; /* p's block, inactive */
    assert_int_equal(free_blk->state, MT_BLOCK_INACTIVE);
    mt_binset_t *bs = free_blk->seg->bins;
    unsigned c = free_blk->cls;
    bs->cls_map[c / 32] ^= 1u << (c % 32);
    assert_int_equal(mt_alloc_check(a), MT_EIO);
    assert_non_null(strstr(mt_alloc_last_error(a), "bitmap"));
    bs->cls_map[c / 32] ^= 1u << (c % 32);
    assert_int_equal(mt_alloc_check(a), 0);

    mt_block_t *used = free_blk->next; /* q's block */
    used->size -= 512;
    assert_int_equal(mt_alloc_check(a), MT_EIO);
    used->size += 512;
    mt__addrmap_del(&a->map, used->addr);
    assert_int_equal(mt_alloc_check(a), MT_EIO);
    assert_non_null(strstr(mt_alloc_last_error(a), "address map"));
    assert_int_equal(mt__addrmap_put(&a->map, used), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, q);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_default),
        cmocka_unit_test(test_round_power2_divisions),
        cmocka_unit_test(test_round_divisions_per_interval),
        cmocka_unit_test(test_class_mapping),
        cmocka_unit_test(test_bins_find),
        cmocka_unit_test(test_small_split_merge),
        cmocka_unit_test(test_equal_sizes_lowest_address),
        cmocka_unit_test(test_large_split_rules),
        cmocka_unit_test(test_max_split_size_rules),
        cmocka_unit_test(test_config_keys),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_settings_at_run_time),
        cmocka_unit_test(test_memory_fraction_limit),
        cmocka_unit_test(test_check_detects_corruption),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
