/* The per-process state model, fed records directly: per-tag accounting, the segment map
 * and the fragmentation figure. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis/model_gen.h"
#include "daemon/internal.h"
#include "tests/common/test_main.h"

static mt_event_rec_t rec(int kind, uint64_t addr, uint64_t size, int tag)
{
    return (mt_event_rec_t){.kind = (uint8_t)kind, .addr = addr, .size = size, .tag = (uint8_t)tag};
}

/* The running totals an allocator would carry (one process at a time). */
static mgen_t gen;

static void apply(mt_d_proc_t *p, int kind, uint64_t addr, uint64_t size, int tag)
{
    mt_event_rec_t ev = mgen_rec(&gen, kind, addr, size, tag);
    assert_int_equal(mt__d_proc_apply(p, &ev), 0);
    char why[256] = "";
    if ((ev.seq < 64 || ev.seq % 97 == 0) && mt__model_check(p->model, why, sizeof why) != 0)
        fail_msg("mt__model_check: %s", why);
}

static mt_model_figures_t fig(const mt_d_proc_t *p, int cls)
{
    mt_model_figures_t f;
    assert_int_equal(mt__model_figures(p->model, cls, &f), 0);
    return f;
}

static mt_model_tag_t tagf(const mt_d_proc_t *p, int cls, int tag)
{
    mt_model_tag_t t;
    mt__model_tag(p->model, cls, tag, &t);
    return t;
}

#define MIB (1u << 20)

static void test_tags_and_fragmentation(void **state)
{
    mt_d_proc_t *p = NULL;
    assert_int_equal((gen = (mgen_t){0}, mt__d_proc_create(&p, 42, "unit")), 0);
    /* One 2 MiB segment with blocks at [0,512K) weights, [1M,1.5M) grads: two free gaps
     * of 512K -> fragmentation 1 - 512K/1M = 1/2. */
    apply(p, MT_EV_SEGMENT_ALLOC, 0x100000000, 2 * MIB, 0);
    apply(p, MT_EV_ALLOC, 0x100000000, MIB / 2, MT_TAG_WEIGHTS);
    apply(p, MT_EV_ALLOC, 0x100000000 + MIB, MIB / 2, MT_TAG_GRADS);
    assert_int_equal(tagf(p, 0, MT_TAG_WEIGHTS).bytes, MIB / 2);
    assert_int_equal(tagf(p, 0, MT_TAG_GRADS).bytes, MIB / 2);
    mt_model_figures_t f = fig(p, 0);
    assert_int_equal(f.total_free, MIB);
    assert_int_equal(f.largest_free, MIB / 2);
    assert_true(f.fragmentation > 0.4999 && f.fragmentation < 0.5001);

    /* Free requested: no longer allocated, still occupying until completed. */
    apply(p, MT_EV_FREE_REQUESTED, 0x100000000, MIB / 2, MT_TAG_WEIGHTS);
    assert_int_equal(tagf(p, 0, MT_TAG_WEIGHTS).bytes, 0);
    assert_int_equal(tagf(p, 0, MT_TAG_WEIGHTS).peak, MIB / 2);
    f = fig(p, 0);
    assert_int_equal(f.total_free, MIB);
    apply(p, MT_EV_FREE_COMPLETED, 0x100000000, MIB / 2, MT_TAG_WEIGHTS);
    assert_int_equal(tagf(p, 0, MT_TAG_WEIGHTS).bytes, 0); /* not subtracted twice */
    f = fig(p, 0);
    assert_int_equal(f.total_free, MIB + MIB / 2); /* [0,1M) and [1.5M,2M) */
    assert_int_equal(f.largest_free, MIB);

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
    apply(p, MT_EV_FREE_REQUESTED, 0x100000000 + MIB, MIB / 2, MT_TAG_GRADS);
    apply(p, MT_EV_FREE_COMPLETED, 0x100000000 + MIB, MIB / 2, MT_TAG_GRADS);
    apply(p, MT_EV_SEGMENT_FREE, 0x100000000, 2 * MIB, 0);
    f = fig(p, 0);
    assert_int_equal(f.total_free, 0);
    assert_true(f.fragmentation == 0.0);
    assert_int_equal(fig(p, 0).segments, 0);
    assert_int_equal(fig(p, 0).blocks, 0);
    mt__d_proc_destroy(&p);
    assert_null(p);
}

static void test_expandable_pages(void **state)
{
    mt_d_proc_t *p = NULL;
    assert_int_equal((gen = (mgen_t){0}, mt__d_proc_create(&p, 7, "exp")), 0);
    apply(p, MT_EV_SEGMENT_MAP, 0x200000000, 8 * MIB, 0);
    apply(p, MT_EV_SEGMENT_UNMAP, 0x200000000 + 2 * MIB, 2 * MIB, 0); /* a hole in the middle */
    assert_int_equal(fig(p, 0).segments, 2);
    mt_model_map_t map;
    assert_int_equal(mt__model_map(p->model, MT_MODEL_DEVICE, &map), 0);
    assert_int_equal(map.segs[0].size, 2 * MIB);
    assert_int_equal(map.segs[1].addr, 0x200000000 + 4 * MIB);
    assert_int_equal(map.segs[1].size, 4 * MIB);
    mt__model_map_free(&map);
    mt_model_figures_t f = fig(p, 0);
    assert_int_equal(f.total_free, 6 * MIB);
    assert_int_equal(f.largest_free, 4 * MIB);
    mt__d_proc_destroy(&p);
}

/* Many blocks: the table grows and keeps exact accounting through churn. */
static void test_block_table_churn(void **state)
{
    mt_d_proc_t *p = NULL;
    assert_int_equal((gen = (mgen_t){0}, mt__d_proc_create(&p, 9, "churn")), 0);
    for (int round = 0; round < 3; round++) {
        for (uint64_t i = 0; i < 5000; i++)
            apply(p, MT_EV_ALLOC, 0x1000 + i * 512, 512, (int)(i % 5));
        assert_int_equal(fig(p, 0).blocks, 5000);
        for (uint64_t i = 0; i < 5000; i += 2) {
            apply(p, MT_EV_FREE_REQUESTED, 0x1000 + i * 512, 512, 0);
            apply(p, MT_EV_FREE_COMPLETED, 0x1000 + i * 512, 512, 0);
        }
        assert_int_equal(fig(p, 0).blocks, 2500);
        for (uint64_t i = 1; i < 5000; i += 2) {
            apply(p, MT_EV_FREE_REQUESTED, 0x1000 + i * 512, 512, 0);
            apply(p, MT_EV_FREE_COMPLETED, 0x1000 + i * 512, 512, 0);
        }
        assert_int_equal(fig(p, 0).blocks, 0);
        for (int t = 0; t < MT_TAG_MAX; t++)
            assert_int_equal(tagf(p, 0, t).bytes, 0);
    }
    assert_int_equal(tagf(p, 0, 0).peak, 1000 * 512);
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
    assert_int_equal((gen = (mgen_t){0}, mt__d_proc_create(&p, 43, "sources")), 0);
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
    assert_int_equal(fig(p, 0).reserved, 60 * MIB);
    assert_int_equal(fig(p, 1).reserved, 2 * MIB);
    assert_int_equal(fig(p, 0).segments, 2);
    assert_int_equal(fig(p, 1).segments, 1);
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
    assert_int_equal(fig(p, 0).allocated, MIB);
    assert_int_equal(fig(p, 0).reserved, 60 * MIB);
    assert_int_equal(fig(p, 0).peak_allocated, MIB);
    assert_int_equal(fig(p, 0).peak_reserved, 60 * MIB);
    assert_int_equal(tagf(p, 0, MT_TAG_ACTIVATIONS).bytes, MIB);
    assert_int_equal(tagf(p, 0, MT_TAG_ACTIVATIONS).peak, MIB);
    assert_int_equal(fig(p, 0).blocks, 1);
    mt_model_figures_t f = fig(p, 0);
    /* The two device segments seen (device 1's allocator holds 20 MiB more, from before). */
    assert_int_equal(f.total_free, 39 * MIB);
    /* Host: its own totals, tags and free space. */
    assert_int_equal(fig(p, 1).allocated, 4096);
    assert_int_equal(fig(p, 1).peak_reserved, 2 * MIB);
    assert_int_equal(tagf(p, 1, MT_TAG_ACTIVATIONS).bytes, 4096);
    assert_int_equal(fig(p, 1).blocks, 1);
    f = fig(p, 1);
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
    /* Per device: device 0 holds the 1 MiB block in 20 MiB, device 1 40 MiB;
     * the process's figures above are their sums. */
    json_t *devs = mt__d_proc_json(p, false);
    json_t *dv = json_object_get(devs, "devices");
    assert_int_equal(json_array_size(dv), 2);
    uint64_t want_a[2] = {MIB, 0}, want_r[2] = {20 * MIB, 40 * MIB};
    for (size_t i = 0; i < 2; i++) {
        json_t *d = json_array_get(dv, i);
        assert_int_equal(json_integer_value(json_object_get(d, "device")), i);
        assert_int_equal(json_integer_value(json_object_get(d, "allocated_bytes")), want_a[i]);
        assert_int_equal(json_integer_value(json_object_get(d, "reserved_bytes")), want_r[i]);
        assert_int_equal(json_integer_value(json_object_get(d, "peak_reserved_bytes")), want_r[i]);
    }
    json_decref(devs);

    /* The host block freed: host allocated drops, its peak stays, the device is untouched. */
    h.kind = MT_EV_FREE_COMPLETED;
    h.allocated = 0;
    assert_int_equal(mt__d_proc_apply(p, &h), 0);
    assert_int_equal(fig(p, 1).allocated, 0);
    assert_int_equal(fig(p, 1).peak_allocated, 4096);
    assert_int_equal(tagf(p, 1, MT_TAG_ACTIVATIONS).bytes, 0);
    assert_int_equal(fig(p, 0).allocated, MIB);
    assert_int_equal(tagf(p, 0, MT_TAG_ACTIVATIONS).bytes, MIB);
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
    assert_int_equal((gen = (mgen_t){0}, mt__d_proc_create(&p, 7, "unit")), 0);
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
    assert_int_equal(tagf(p, 0, 7).bytes, 4096);
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
    /* Not UTF-8: listed all the same, the stray byte as U+FFFD. */
    assert_string_equal(json_string_value(json_object_get(labels, "12")), "bad\xef\xbf\xbd");
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

/* Issue 10's daemon cases: after dropped events a cleanly exited process shows no
 * phantom tag bytes in /state, and a forged stream of sizes near 2^63 serves bounded
 * figures (fragmentation in [0, 1], no negative byte counts). */
static void test_gap_then_clean_exit(void **state)
{
    (void)state;
    mt_d_proc_t *p = NULL;
    assert_int_equal((gen = (mgen_t){0}, mt__d_proc_create(&p, 44, "gappy")), 0);
    apply(p, MT_EV_SEGMENT_ALLOC, 0x100000000, 64 * MIB, 0);
    for (uint64_t i = 0; i < 16; i++)
        apply(p, MT_EV_ALLOC, 0x100000000 + i * 4 * MIB, 4 * MIB, MT_TAG_ACTIVATIONS);
    /* The daemon paused: 20 events lost (frees among them), then a gap record. */
    for (uint64_t i = 0; i < 10; i++) {
        (void)mgen_rec(&gen, MT_EV_FREE_REQUESTED, 0x100000000 + i * 4 * MIB, 4 * MIB, 4);
        (void)mgen_rec(&gen, MT_EV_FREE_COMPLETED, 0x100000000 + i * 4 * MIB, 4 * MIB, 4);
    }
    mt_event_rec_t gap = rec(MT_EV_GAP, 0, 20, 0);
    assert_int_equal(mt__d_proc_apply(p, &gap), 0);
    json_t *j = mt__d_proc_json(p, false);
    json_t *t0 = json_array_get(json_object_get(j, "tags"), 0);
    assert_int_equal(json_integer_value(json_object_get(t0, "allocated_bytes")), 0);
    assert_int_equal(json_integer_value(json_object_get(t0, "uncertain_blocks")), 16);
    json_decref(j);
    /* The rest is freed and seen; the process ends with 0 allocated. */
    for (uint64_t i = 10; i < 16; i++) {
        apply(p, MT_EV_FREE_REQUESTED, 0x100000000 + i * 4 * MIB, 4 * MIB, MT_TAG_ACTIVATIONS);
        apply(p, MT_EV_FREE_COMPLETED, 0x100000000 + i * 4 * MIB, 4 * MIB, MT_TAG_ACTIVATIONS);
    }
    j = mt__d_proc_json(p, true);
    assert_int_equal(json_integer_value(json_object_get(j, "allocated_bytes")), 0);
    assert_null(json_object_get(j, "uncertain_bytes"));
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(j, "tags"), i, t)
    {
        assert_int_equal(json_integer_value(json_object_get(t, "allocated_bytes")), 0);
        assert_null(json_object_get(t, "uncertain_bytes"));
    }
    assert_int_equal(json_integer_value(json_object_get(j, "blocks")), 0);
    json_decref(j);
    mt__d_proc_destroy(&p);
}

static void test_forged_sizes_bounded(void **state)
{
    (void)state;
    mt_d_proc_t *p = NULL;
    assert_int_equal(mt__d_proc_create(&p, 45, "forged"), 0);
    const uint64_t huge = (UINT64_C(1) << 63) + 512;
    mt_event_rec_t evs[] = {
        {.kind = MT_EV_SEGMENT_ALLOC, .addr = 0x1000, .size = huge, .reserved = huge},
        {.seq = 1, .kind = MT_EV_SEGMENT_ALLOC, .addr = 0x2000, .size = 4096, .reserved = 3},
        {.seq = 2,
         .kind = MT_EV_ALLOC,
         .addr = 0x1000,
         .size = UINT64_MAX,
         .allocated = huge,
         .reserved = 3,
         .device = 1},
        {.seq = 3,
         .kind = MT_EV_ALLOC,
         .addr = 0x9000,
         .size = huge,
         .allocated = huge,
         .reserved = huge,
         .device = 2},
    };
    for (size_t k = 0; k < sizeof evs / sizeof evs[0]; k++)
        assert_int_equal(mt__d_proc_apply(p, &evs[k]), 0);
    assert_int_equal(mt__model_check(p->model, NULL, 0), 0);
    json_t *j = mt__d_proc_json(p, true);
    double frag = json_real_value(json_object_get(j, "fragmentation"));
    assert_true(frag >= 0.0 && frag <= 1.0);
    const char *keys[] = {"allocated_bytes", "reserved_bytes", "total_free_bytes",
                          "largest_free_block_bytes", "peak_allocated_bytes"};
    for (size_t k = 0; k < 5; k++)
        assert_true(json_integer_value(json_object_get(j, keys[k])) >= 0);
    assert_true(json_integer_value(json_object_get(j, "total_free_bytes")) <=
                json_integer_value(json_object_get(j, "reserved_bytes")));
    json_decref(j);
    mt__d_proc_destroy(&p);
}

/* A writer of many pieces reports the first failure as it was: a buffer that cannot grow
 * (its length at the top of size_t) makes every append fail with MT_EOVERFLOW, and the
 * metrics text says so, not another code. A failure sticks: an append that would fit after
 * it does nothing and returns the same code, until the buffer is cleared. */
static void test_buffer_first_error(void **state)
{
    (void)state;
    mt_d_buf_t b = {0};
    assert_int_equal(mt__d_buf_append(&b, "ab", 2), 0);
    size_t len = b.len;
    b.len = SIZE_MAX - 1;
    assert_int_equal(mt__d_buf_printf(&b, "%d", 12), MT_EOVERFLOW);
    b.len = len;
    assert_int_equal(mt__d_buf_append(&b, "c", 1), MT_EOVERFLOW);
    assert_int_equal(mt__d_buf_fail(&b, MT_ENOMEM), MT_EOVERFLOW);
    assert_int_equal(b.len, 2);
    mt__d_buf_clear(&b);
    assert_int_equal(mt__d_buf_append(&b, "c", 1), 0);
    assert_string_equal(b.p, "c");
    mt__d_buf_free(&b);

    char dir[] = "/tmp/mt-dstate-XXXXXX", sock[64];
    assert_non_null(mkdtemp(dir));
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    mt_d_cfg_t cfg = mt__d_cfg_default();
    cfg.socket_path = sock;
    cfg.http_port = -1;
    cfg.loop = &loop;
    mt_d_t *d = NULL;
    assert_int_equal(mt__d_create(&d, &cfg), 0);
    mt_d_buf_t o = {.len = SIZE_MAX / 2 + 1};
    assert_int_equal(mt__d_metrics_text(d, &o), MT_EOVERFLOW);
    o = (mt_d_buf_t){0};
    assert_int_equal(mt__d_metrics_text(d, &o), 0);
    assert_non_null(strstr(o.p, "memtrace_processes"));
    mt__d_buf_free(&o);
    mt__d_destroy(&d);
    assert_int_equal(uv_loop_close(&loop), 0);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tags_and_fragmentation),
        cmocka_unit_test(test_expandable_pages),
        cmocka_unit_test(test_block_table_churn),
        cmocka_unit_test(test_totals_sum_over_sources),
        cmocka_unit_test(test_tag_labels),
        cmocka_unit_test(test_gap_then_clean_exit),
        cmocka_unit_test(test_forged_sizes_bounded),
        cmocka_unit_test(test_buffer_first_error),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
