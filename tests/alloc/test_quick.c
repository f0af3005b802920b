/* Quick lists (allocator/quick.c): a block freed on its own stream is kept whole for the
 * next request of its size, while every stat, snapshot and search sees it as merged free
 * space; record_stream, warm-up and the release paths keep their contracts. */
#include "helpers.h"
#include "tests/common/test_main.h"

static uint32_t rng(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

static size_t nquick(mt_alloc_t *a)
{
    mt__alloc_lock(a);
    size_t n = a->nquick;
    mt__alloc_unlock(a);
    return n;
}

/* The stats against the snapshot, whose free blocks are the merged runs: largest free
 * block, total free and inactive_split (free blocks of segments with other blocks). */
static void stats_agree_with_snapshot(mt_alloc_t *a)
{
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(a, &snap), 0);
    uint64_t largest = 0, total = 0, nsplit = 0, split_bytes = 0;
    for (size_t i = 0; i < snap->nsegments; i++) {
        const mt_snapshot_segment_t *s = &snap->segments[i];
        for (size_t j = 0; j < s->nblocks; j++) {
            const mt_snapshot_block_t *b = &s->blocks[j];
            if (j > 0 && b->state == MT_BLOCK_INACTIVE &&
                s->blocks[j - 1].state == MT_BLOCK_INACTIVE)
                fail_msg("snapshot shows two touching free blocks at %#llx",
                         (unsigned long long)b->addr);
            if (b->state != MT_BLOCK_INACTIVE)
                continue;
            total += b->size;
            largest = b->size > largest ? b->size : largest;
            if (s->nblocks > 1) {
                nsplit++;
                split_bytes += b->size;
            }
        }
    }
    const mt_alloc_stats_t *st = &snap->stats;
    assert_int_equal(st->largest_free_block, largest);
    assert_int_equal(st->total_free, total);
    assert_int_equal(st->inactive_split[MT_STAT_ALL].current, nsplit);
    assert_int_equal(st->inactive_split_bytes[MT_STAT_ALL].current, split_bytes);
    for (int k = 0; k < MT_STAT_N; k++) {
        assert_true(st->inactive_split[k].peak >= st->inactive_split[k].current);
        assert_int_equal(st->allocation[k].allocated - st->allocation[k].freed,
                         st->allocation[k].current);
    }
    mt_alloc_snapshot_free(&snap);
}

static void test_same_size_comes_back_whole(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, "tcache:0", NULL); /* the quick lists alone */
    void *p = xmalloc_dev(a, 64 * KIB, NULL, MT_TAG_ACTIVATIONS);
    uint64_t m = backend_mallocs(b);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(nquick(a), 1);
    /* Free as if merged: the whole 2 MiB segment is one free block, not split. */
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(s.active_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(s.active[MT_STAT_SMALL].current, 0);
    assert_int_equal(s.inactive_split[MT_STAT_ALL].current, 0);
    assert_int_equal(s.inactive_split_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(s.largest_free_block, 2 * MIB);
    assert_int_equal(s.total_free, 2 * MIB);
    stats_agree_with_snapshot(a);
    assert_int_equal(mt_alloc_check(a), 0);
    /* A double free is still refused. */
    assert_int_equal(mt_alloc_free(a, p), MT_ENOENT);

    void *q = xmalloc_dev(a, 64 * KIB - 100, NULL, MT_TAG_WEIGHTS); /* same rounded size */
    assert_ptr_equal(q, p);
    assert_int_equal(nquick(a), 0);
    assert_int_equal(backend_mallocs(b), m);
    s = stats_of(a);
    assert_int_equal(s.allocated_bytes[MT_STAT_ALL].current, 64 * KIB);
    assert_int_equal(s.requested_bytes[MT_STAT_ALL].current, 64 * KIB - 100);
    assert_int_equal(s.tag_allocated_bytes[MT_TAG_WEIGHTS].current, 64 * KIB);
    assert_int_equal(s.tag_allocated_bytes[MT_TAG_ACTIVATIONS].current, 0);
    assert_int_equal(s.allocation[MT_STAT_ALL].allocated, 2);
    assert_int_equal(s.allocation[MT_STAT_ALL].freed, 1);
    assert_int_equal(s.inactive_split[MT_STAT_ALL].current, 1);
    assert_int_equal(s.inactive_split[MT_STAT_ALL].peak, 1);
    assert_int_equal(s.inactive_split_bytes[MT_STAT_ALL].current, 2 * MIB - 64 * KIB);
    stats_agree_with_snapshot(a);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, q);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* Another size finds the quick blocks' space merged before any device call. */
static void test_other_size_uses_their_space(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, "tcache:0", NULL); /* the quick lists alone */
    char *p1 = xmalloc_dev(a, 512 * KIB, NULL, 0);
    char *p2 = xmalloc_dev(a, 512 * KIB, NULL, 0);
    char *p3 = xmalloc_dev(a, 1 * MIB, NULL, 0); /* the segment is full */
    assert_ptr_equal(p2, p1 + 512 * KIB);
    uint64_t m = backend_mallocs(b);
    mt_alloc_free(a, p2);
    mt_alloc_free(a, p1);
    assert_int_equal(nquick(a), 2);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.largest_free_block, 1 * MIB); /* the two, merged */
    assert_int_equal(s.inactive_split[MT_STAT_ALL].current, 1);
    stats_agree_with_snapshot(a);
    char *r = xmalloc_dev(a, 1 * MIB, NULL, 0);
    assert_ptr_equal(r, p1);
    assert_int_equal(backend_mallocs(b), m);
    assert_int_equal(nquick(a), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, r);
    mt_alloc_free(a, p3);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* A free right after a free block merges: a later take of it would not be the block the
 * bins give (their merged run starts lower). A free before a quick block merges through. */
static void test_free_beside_free_merges(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, "tcache:0", NULL); /* the quick lists alone */
    char *p1 = xmalloc_dev(a, 64 * KIB, NULL, 0);
    char *p2 = xmalloc_dev(a, 64 * KIB, NULL, 0);
    char *p3 = xmalloc_dev(a, 64 * KIB, NULL, 0);
    char *p4 = xmalloc_dev(a, 64 * KIB, NULL, 0);
    mt_alloc_free(a, p1);
    assert_int_equal(nquick(a), 1);
    mt_alloc_free(a, p2); /* after p1, free: merged with it */
    assert_int_equal(nquick(a), 0);
    mt_alloc_free(a, p4); /* after p3, allocated: kept */
    assert_int_equal(nquick(a), 1);
    stats_agree_with_snapshot(a);
    mt_alloc_free(a, p3); /* before p4 (quick) and after p1+p2: one free segment */
    assert_int_equal(nquick(a), 0);
    mt_alloc_stats_t s = stats_of(a);
    assert_int_equal(s.largest_free_block, 2 * MIB);
    assert_int_equal(s.inactive_split[MT_STAT_ALL].current, 0);
    stats_agree_with_snapshot(a);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* A block another stream used waits for its events and then goes to the bins, never to
 * a quick list (the reuse must wait for that stream, which a quick hit would not). */
static void test_recorded_block_never_quick(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, "tcache:0", NULL); /* the quick lists alone */
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s2), 0);
    void *p = xmalloc_dev(a, 64 * KIB, NULL, 0);
    assert_int_equal(mt_alloc_record_stream(a, p, s2), 0);
    assert_int_equal(mt_alloc_free(a, p), 0);
    assert_int_equal(nquick(a), 0);
    assert_int_equal(mt_stream_synchronize(b, s2), 0);
    void *q = xmalloc_dev(a, 128 * KIB, NULL, 0); /* processes the completed event */
    assert_int_equal(nquick(a), 0);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, q);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

static void test_empty_cache_and_warmup_flush(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, "tcache:0", NULL); /* the quick lists alone */
    void *p = xmalloc_dev(a, 64 * KIB, NULL, 0);
    mt_alloc_free(a, p);
    assert_int_equal(nquick(a), 1);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(nquick(a), 0);
    assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_ALL].current, 0);

    p = xmalloc_dev(a, 64 * KIB, NULL, 0);
    mt_alloc_free(a, p);
    assert_int_equal(nquick(a), 1);
    assert_int_equal(mt_alloc_warmup_begin(a), 0);
    assert_int_equal(nquick(a), 0);
    for (int i = 0; i < 3; i++) {
        p = xmalloc_dev(a, 64 * KIB, NULL, 0);
        mt_alloc_free(a, p);
        assert_int_equal(nquick(a), 0); /* the warm-up records the bins' placement */
    }
    assert_true(mt_alloc_warmup_end(a, NULL) <= 0);
    uint64_t m = backend_mallocs(b);
    for (int i = 0; i < 3; i++) {
        p = xmalloc_dev(a, 64 * KIB, NULL, 0);
        mt_alloc_free(a, p);
        assert_int_equal(nquick(a), 0); /* a stream with a reservation keeps none */
    }
    assert_int_equal(backend_mallocs(b), m);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

static void test_check_sees_quick_damage(void **state)
{
    (void)state;
    mt_backend_t *b = sim_backend(256 * MIB);
    mt_alloc_t *a = make_alloc(b, "tcache:0", NULL); /* the quick lists alone */
    void *p = xmalloc_dev(a, 64 * KIB, NULL, 0);
    void *q = xmalloc_dev(a, 64 * KIB, NULL, 0);
    mt_alloc_free(a, p);
    assert_int_equal(mt_alloc_check(a), 0);
    mt_block_t *blk = mt__addrmap_get(&a->map, (uintptr_t)p);
    assert_non_null(blk);
    assert_int_equal(blk->state, MT__BLOCK_QUICK);
    mt__qslot_t *slot = &blk->seg->bins->quick[mt__quick_slot(blk->size)];
    slot->n++;
    assert_int_equal(mt_alloc_check(a), MT_EIO);
    assert_non_null(strstr(mt_alloc_last_error(a), "quick"));
    slot->n--;
    blk->state = MT_BLOCK_INACTIVE;
    assert_int_equal(mt_alloc_check(a), MT_EIO);
    blk->state = MT__BLOCK_QUICK;
    a->st.inactive_split[MT_STAT_ALL].current++;
    assert_int_equal(mt_alloc_check(a), MT_EIO);
    a->st.inactive_split[MT_STAT_ALL].current--;
    assert_int_equal(mt_alloc_check(a), 0);
    mt_alloc_free(a, q);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

/* Random sizes (few, so that quick hits are common), random frees, two streams: the
 * checker and the snapshot agree with the stats after every operation. */
static void test_random_against_snapshot(void **state)
{
    (void)state;
    static const size_t sizes[] = {512, 3 * KIB, 64 * KIB, 700 * KIB, 1 * MIB, 3 * MIB, 12 * MIB};
    mt_backend_t *b = sim_backend(512 * MIB);
    mt_alloc_t *a = make_alloc(b, "tcache:0", NULL); /* the quick lists alone */
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s2), 0);
    void *live[64] = {0};
    uint32_t seed = 12345;
    size_t hits = 0;
    for (int op = 0; op < 4000; op++) {
        int i = (int)(rng(&seed) % 64);
        if (live[i] == NULL) {
            size_t before = nquick(a);
            size_t n = sizes[rng(&seed) % 7];
            mt_stream_t *s = rng(&seed) % 4 == 0 ? s2 : NULL;
            assert_int_equal(mt_alloc_malloc(a, n, s, 0, &live[i]), 0);
            hits += nquick(a) < before;
        } else {
            assert_int_equal(mt_alloc_free(a, live[i]), 0);
            live[i] = NULL;
        }
        assert_int_equal(mt_alloc_check(a), 0);
        stats_agree_with_snapshot(a);
    }
    assert_true(hits > 200); /* the lists were exercised */
    for (int i = 0; i < 64; i++)
        if (live[i] != NULL)
            mt_alloc_free(a, live[i]);
    stats_agree_with_snapshot(a);
    assert_int_equal(mt_alloc_empty_cache(a), 0);
    assert_int_equal(stats_of(a).reserved_bytes[MT_STAT_ALL].current, 0);
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_size_comes_back_whole),
        cmocka_unit_test(test_other_size_uses_their_space),
        cmocka_unit_test(test_free_beside_free_merges),
        cmocka_unit_test(test_recorded_block_never_quick),
        cmocka_unit_test(test_empty_cache_and_warmup_flush),
        cmocka_unit_test(test_check_sees_quick_damage),
        cmocka_unit_test(test_random_against_snapshot),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
