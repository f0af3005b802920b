/* The per-process state model, fed records directly: per-tag accounting, the segment map
 * and the fragmentation figure. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <string.h>

#include "daemon/internal.h"

static mt_event_rec_t rec(int kind, uint64_t addr, uint64_t size, int tag)
{
    return (mt_event_rec_t){.kind = (uint8_t)kind, .addr = addr, .size = size, .tag = (uint8_t)tag};
}

static void apply(mt_d_proc_t *p, int kind, uint64_t addr, uint64_t size, int tag)
{
    mt_event_rec_t ev = rec(kind, addr, size, tag);
    assert_int_equal(mt__d_proc_apply(p, &ev), 0);
}

#define MIB (1u << 20)

static void test_tags_and_fragmentation(void **state)
{
    mt_d_proc_t *p = NULL;
    assert_int_equal(mt__d_proc_create(&p, 42, "unit"), 0);
    /* One 2 MiB segment with blocks at [0,512K) weights, [1M,1.5M) grads: two free gaps
     * of 512K -> fragmentation 1 - 512K/1M = 1/2. */
    apply(p, MT_EV_SEGMENT_ALLOC, 0x100000000, 2 * MIB, 0);
    apply(p, MT_EV_ALLOC, 0x100000000, MIB / 2, MT_TAG_WEIGHTS);
    apply(p, MT_EV_ALLOC, 0x100000000 + MIB, MIB / 2, MT_TAG_GRADS);
    assert_int_equal(p->dev.tag_allocated[MT_TAG_WEIGHTS], MIB / 2);
    assert_int_equal(p->dev.tag_allocated[MT_TAG_GRADS], MIB / 2);
    mt_d_frag_t f;
    mt__d_proc_frag(p, &f);
    assert_int_equal(f.total_free, MIB);
    assert_int_equal(f.largest_free_block, MIB / 2);
    assert_true(f.fragmentation > 0.4999 && f.fragmentation < 0.5001);

    /* Free requested: no longer allocated, still occupying until completed. */
    apply(p, MT_EV_FREE_REQUESTED, 0x100000000, MIB / 2, MT_TAG_WEIGHTS);
    assert_int_equal(p->dev.tag_allocated[MT_TAG_WEIGHTS], 0);
    assert_int_equal(p->dev.tag_peak[MT_TAG_WEIGHTS], MIB / 2);
    mt__d_proc_frag(p, &f);
    assert_int_equal(f.total_free, MIB);
    apply(p, MT_EV_FREE_COMPLETED, 0x100000000, MIB / 2, MT_TAG_WEIGHTS);
    assert_int_equal(p->dev.tag_allocated[MT_TAG_WEIGHTS], 0); /* not subtracted twice */
    mt__d_proc_frag(p, &f);
    assert_int_equal(f.total_free, MIB + MIB / 2); /* [0,1M) and [1.5M,2M) */
    assert_int_equal(f.largest_free_block, MIB);

    /* JSON: segment map with used bytes, tags with peaks. */
    json_t *j = mt__d_proc_json(p, true);
    assert_non_null(j);
    json_t *segs = json_object_get(j, "segments");
    assert_int_equal(json_array_size(segs), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(segs, 0), "used_bytes")),
                     MIB / 2);
    assert_int_equal(json_array_size(json_object_get(j, "tags")), 2);
    json_decref(j);

    /* Segment freed: no free space left. */
    apply(p, MT_EV_FREE_COMPLETED, 0x100000000 + MIB, MIB / 2, MT_TAG_GRADS);
    apply(p, MT_EV_SEGMENT_FREE, 0x100000000, 2 * MIB, 0);
    mt__d_proc_frag(p, &f);
    assert_int_equal(f.total_free, 0);
    assert_true(f.fragmentation == 0.0);
    assert_int_equal(p->dev.nranges, 0);
    assert_int_equal(p->dev.nblocks, 0);
    mt__d_proc_destroy(&p);
    assert_null(p);
}

static void test_expandable_pages(void **state)
{
    mt_d_proc_t *p = NULL;
    assert_int_equal(mt__d_proc_create(&p, 7, "exp"), 0);
    apply(p, MT_EV_SEGMENT_MAP, 0x200000000, 8 * MIB, 0);
    apply(p, MT_EV_SEGMENT_UNMAP, 0x200000000 + 2 * MIB, 2 * MIB, 0); /* a hole in the middle */
    assert_int_equal(p->dev.nranges, 2);
    assert_int_equal(p->dev.ranges[0].size, 2 * MIB);
    assert_int_equal(p->dev.ranges[1].addr, 0x200000000 + 4 * MIB);
    assert_int_equal(p->dev.ranges[1].size, 4 * MIB);
    mt_d_frag_t f;
    mt__d_proc_frag(p, &f);
    assert_int_equal(f.total_free, 6 * MIB);
    assert_int_equal(f.largest_free_block, 4 * MIB);
    mt__d_proc_destroy(&p);
}

/* Many blocks: the table grows and keeps exact accounting through churn. */
static void test_block_table_churn(void **state)
{
    mt_d_proc_t *p = NULL;
    assert_int_equal(mt__d_proc_create(&p, 9, "churn"), 0);
    for (int round = 0; round < 3; round++) {
        for (uint64_t i = 0; i < 5000; i++)
            apply(p, MT_EV_ALLOC, 0x1000 + i * 512, 512, (int)(i % 5));
        assert_int_equal(p->dev.nblocks, 5000);
        for (uint64_t i = 0; i < 5000; i += 2)
            apply(p, MT_EV_FREE_COMPLETED, 0x1000 + i * 512, 512, 0);
        assert_int_equal(p->dev.nblocks, 2500);
        for (uint64_t i = 1; i < 5000; i += 2)
            apply(p, MT_EV_FREE_COMPLETED, 0x1000 + i * 512, 512, 0);
        assert_int_equal(p->dev.nblocks, 0);
        for (int t = 0; t < MT_TAG_MAX; t++)
            assert_int_equal(p->dev.tag_allocated[t], 0);
    }
    assert_int_equal(p->dev.tag_peak[0], 1000 * 512);
    /* An unknown free and a GAP record change nothing. */
    apply(p, MT_EV_FREE_COMPLETED, 0xdead000, 512, 0);
    mt_event_rec_t gap = rec(MT_EV_GAP, 0, 12, 0);
    assert_int_equal(mt__d_proc_apply(p, &gap), 0);
    assert_int_equal(p->kind_count[MT_EV_GAP], 1);
    mt__d_proc_destroy(&p);
}

/* A process with two device allocators and a pinned host cache: each reports its own running
 * totals; the device figures are the sum over the device sources (not the last event's) and
 * never count pinned host pages, which have figures of their own (totals, peaks, tags,
 * segment map). */
static void test_totals_sum_over_sources(void **state)
{
    (void)state;
    mt_d_proc_t *p = NULL;
    assert_int_equal(mt__d_proc_create(&p, 43, "sources"), 0);
    mt_event_rec_t d0 = {.kind = MT_EV_SEGMENT_ALLOC,
                         .addr = 0x1000000,
                         .size = 20 * MIB,
                         .pool = MT_POOL_LARGE,
                         .device = 0,
                         .allocated = 0,
                         .reserved = 20 * MIB};
    mt_event_rec_t d1 = d0;
    d1.addr = 0x9000000;
    d1.device = 1;
    d1.reserved = 40 * MIB;
    mt_event_rec_t host = d0;
    host.addr = 0x20000000;
    host.pool = MT_POOL_HOST;
    host.size = 2 * MIB;
    host.reserved = 2 * MIB;
    assert_int_equal(mt__d_proc_apply(p, &d0), 0);
    assert_int_equal(mt__d_proc_apply(p, &d1), 0);
    assert_int_equal(mt__d_proc_apply(p, &host), 0);
    assert_int_equal(p->dev.reserved, 60 * MIB);
    assert_int_equal(p->host.reserved, 2 * MIB);
    assert_int_equal(p->dev.nranges, 2);
    assert_int_equal(p->host.nranges, 1);
    mt_event_rec_t a = {.kind = MT_EV_ALLOC,
                        .addr = 0x1000000,
                        .size = MIB,
                        .requested = MIB,
                        .pool = MT_POOL_LARGE,
                        .tag = MT_TAG_ACTIVATIONS,
                        .device = 0,
                        .allocated = MIB,
                        .reserved = 20 * MIB};
    assert_int_equal(mt__d_proc_apply(p, &a), 0);
    mt_event_rec_t h = {.kind = MT_EV_ALLOC,
                        .addr = 0x20000000,
                        .size = 4096,
                        .requested = 4096,
                        .pool = MT_POOL_HOST,
                        .tag = MT_TAG_ACTIVATIONS,
                        .device = 0,
                        .allocated = 4096,
                        .reserved = 2 * MIB};
    assert_int_equal(mt__d_proc_apply(p, &h), 0);
    /* Device: one 1 MiB block in 60 MiB; the host block is not there. */
    assert_int_equal(p->dev.allocated, MIB);
    assert_int_equal(p->dev.reserved, 60 * MIB);
    assert_int_equal(p->dev.peak_allocated, MIB);
    assert_int_equal(p->dev.peak_reserved, 60 * MIB);
    assert_int_equal(p->dev.tag_allocated[MT_TAG_ACTIVATIONS], MIB);
    assert_int_equal(p->dev.tag_peak[MT_TAG_ACTIVATIONS], MIB);
    assert_int_equal(p->dev.nblocks, 1);
    mt_d_frag_t f;
    mt__d_proc_frag(p, &f);
    /* The two device segments seen (device 1's allocator holds 20 MiB more, from before). */
    assert_int_equal(f.total_free, 39 * MIB);
    /* Host: its own totals, tags and free space. */
    assert_int_equal(p->host.allocated, 4096);
    assert_int_equal(p->host.peak_reserved, 2 * MIB);
    assert_int_equal(p->host.tag_allocated[MT_TAG_ACTIVATIONS], 4096);
    assert_int_equal(p->host.nblocks, 1);
    mt__d_acct_frag(&p->host, &f);
    assert_int_equal(f.total_free, 2 * MIB - 4096);

    json_t *j = mt__d_proc_json(p, true);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "allocated_bytes")), MIB);
    assert_int_equal(json_integer_value(json_object_get(j, "reserved_bytes")), 60 * MIB);
    assert_int_equal(json_array_size(json_object_get(j, "segments")), 2);
    json_t *tag0 = json_array_get(json_object_get(j, "tags"), 0);
    assert_int_equal(json_integer_value(json_object_get(tag0, "peak_bytes")), MIB);
    json_t *jh = json_object_get(j, "host");
    assert_non_null(jh);
    assert_int_equal(json_integer_value(json_object_get(jh, "allocated_bytes")), 4096);
    assert_int_equal(json_integer_value(json_object_get(jh, "reserved_bytes")), 2 * MIB);
    assert_int_equal(json_integer_value(json_object_get(jh, "peak_allocated_bytes")), 4096);
    assert_int_equal(json_integer_value(json_object_get(jh, "peak_reserved_bytes")), 2 * MIB);
    assert_int_equal(json_array_size(json_object_get(jh, "segments")), 1);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(jh, "segments"), 0), "pool")),
                        "host");
    json_decref(j);

    /* The host block freed: host allocated drops, its peak stays, the device is untouched. */
    h.kind = MT_EV_FREE_COMPLETED;
    h.allocated = 0;
    assert_int_equal(mt__d_proc_apply(p, &h), 0);
    assert_int_equal(p->host.allocated, 0);
    assert_int_equal(p->host.peak_allocated, 4096);
    assert_int_equal(p->host.tag_allocated[MT_TAG_ACTIVATIONS], 0);
    assert_int_equal(p->dev.allocated, MIB);
    assert_int_equal(p->dev.tag_allocated[MT_TAG_ACTIVATIONS], MIB);
    mt__d_proc_destroy(&p);
}

/* A label announcement for tag. */
static void announce(mt_d_proc_t *p, int tag, const char *label)
{
    mt_event_rec_t ev = {.kind = MT_EV_TAG_LABEL, .tag = (uint8_t)tag};
    mt_event_label_pack(&ev, label);
    assert_int_equal(mt__d_proc_apply(p, &ev), 0);
}

static const char *tags_name(json_t *j, int tag)
{
    size_t i;
    json_t *tg;
    json_array_foreach(json_object_get(j, "tags"), i, tg)
    {
        if (json_integer_value(json_object_get(tg, "tag")) == tag)
            return json_string_value(json_object_get(tg, "name"));
    }
    return NULL;
}

/* Labels name user tags in the state's figures; an announcement changes no figure; a
 * label that would make two tags look alike (a repeat, a built-in name, "tag<n>") or is
 * not UTF-8 leaves its tag "tag<n>"; a later announcement renames. */
static void test_tag_labels(void **state)
{
    (void)state;
    mt_d_proc_t *p = NULL;
    assert_int_equal(mt__d_proc_create(&p, 7, "unit"), 0);
    apply(p, MT_EV_SEGMENT_ALLOC, 0x100000000, 2 * MIB, 0);
    announce(p, 7, "logits");
    announce(p, 8, "dup");
    announce(p, 9, "dup");
    announce(p, 10, "weights");
    announce(p, 11, "tag12");
    announce(p, 12, "bad\xff");
    announce(p, 13, "hidden");
    assert_int_equal(p->kind_count[MT_EV_TAG_LABEL], 7);
    assert_int_equal(p->events, 0); /* counted by the drain loop, not here */
    for (int t = 7; t <= 12; t++)
        apply(p, MT_EV_ALLOC, 0x100000000 + (uint64_t)(t - 7) * 4096, 4096, t);
    assert_int_equal(p->dev.tag_allocated[7], 4096);
    char nb[16];
    assert_string_equal(mt__d_tag_name(p, 7, nb, sizeof nb), "logits");
    assert_string_equal(mt__d_tag_name(p, 8, nb, sizeof nb), "tag8");
    assert_string_equal(mt__d_tag_name(p, 9, nb, sizeof nb), "tag9");
    assert_string_equal(mt__d_tag_name(p, 10, nb, sizeof nb), "tag10");
    assert_string_equal(mt__d_tag_name(p, 11, nb, sizeof nb), "tag11");
    assert_string_equal(mt__d_tag_name(p, 12, nb, sizeof nb), "tag12");
    assert_string_equal(mt__d_tag_name(p, MT_TAG_WEIGHTS, nb, sizeof nb), "weights");
    assert_string_equal(mt__d_proc_label(p, 7), "logits");
    assert_null(mt__d_proc_label(p, 8));

    json_t *j = mt__d_proc_json(p, false);
    assert_non_null(j);
    assert_string_equal(tags_name(j, 7), "logits");
    assert_string_equal(tags_name(j, 8), "tag8");
    assert_null(tags_name(j, 13)); /* no bytes: not in tags, but its label is known */
    json_t *labels = json_object_get(j, "tag_labels");
    assert_string_equal(json_string_value(json_object_get(labels, "13")), "hidden");
    assert_string_equal(json_string_value(json_object_get(labels, "9")), "dup");
    assert_null(json_object_get(labels, "12")); /* not UTF-8: not a JSON string */
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "kinds"), "tag_label")),
                     7);
    json_decref(j);

    /* Renaming one of the pair makes both unique again. */
    announce(p, 9, "kv_cache");
    assert_string_equal(mt__d_tag_name(p, 8, nb, sizeof nb), "dup");
    assert_string_equal(mt__d_tag_name(p, 9, nb, sizeof nb), "kv_cache");
    /* Built-in ids cannot be renamed. */
    announce(p, MT_TAG_GRADS, "mine");
    assert_string_equal(mt__d_tag_name(p, MT_TAG_GRADS, nb, sizeof nb), "grads");
    mt__d_proc_destroy(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tags_and_fragmentation),
        cmocka_unit_test(test_expandable_pages),
        cmocka_unit_test(test_block_table_churn),
        cmocka_unit_test(test_totals_sum_over_sources),
        cmocka_unit_test(test_tag_labels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
