/* PyTorch memory snapshots: the restricted unpickler, the model, its figures, the writer.
 * argv[1] is tests/snapshot/data (made by make_snapshots.py). */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "analysis/pickle.h"
#include "analysis/replay.h"
#include "analysis/frames.h"
#include "analysis/torch_snapshot.h"
#include "memtrace/alloc.h"
#include "memtrace/common.h"
#include "tests/common/test_main.h"

static const char *data_dir;
#define MiB (1024ull * 1024)

static mt_ts_t *load(const char *name)
{
    char path[1024], err[768];
    snprintf(path, sizeof path, "%s/%s", data_dir, name);
    mt_ts_t *ts = NULL;
    int rc = mt__ts_read(&ts, path, err, sizeof err);
    if (rc != 0)
        fail_msg("%s: %s", path, err);
    return ts;
}

/* ---- the pickle layer ---- */

static mt_pk_doc_t *parse(const void *b, size_t n, const mt_pk_cfg_t *cfg, int *rc, char *err,
                          size_t errlen)
{
    mt_pk_doc_t *d = NULL;
    *rc = mt__pk_parse(&d, b, n, cfg, err, errlen);
    return d;
}

static void test_pickle_roundtrip(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    mt__pkw_t w;
    mt__pkw_init(&w, f);
    mt__pkw_dict_begin(&w);
    mt__pkw_str(&w, "ints");
    mt__pkw_list_begin(&w);
    const int64_t ints[] = {0,
                            1,
                            255,
                            256,
                            65535,
                            65536,
                            -1,
                            -129,
                            INT32_MAX,
                            INT32_MIN,
                            (int64_t)1 << 40,
                            -((int64_t)1 << 40),
                            INT64_MAX,
                            INT64_MIN,
                            0x7f0000000000};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        mt__pkw_int(&w, ints[i]);
    mt__pkw_list_end(&w);
    mt__pkw_str(&w, "many");
    uint32_t memo = mt__pkw_put_next(&w);
    mt__pkw_list_begin(&w);
    for (int i = 0; i < 2500; i++) /* three batches */
        mt__pkw_int(&w, i);
    mt__pkw_list_end(&w);
    mt__pkw_str(&w, "again");
    mt__pkw_get(&w, memo);
    mt__pkw_str(&w, "misc");
    mt__pkw_tuple_begin(&w);
    mt__pkw_none(&w);
    mt__pkw_bool(&w, true);
    mt__pkw_float(&w, 2.5);
    mt__pkw_str(&w, "h\xc3\xa9");
    mt__pkw_tuple_end(&w);
    mt__pkw_dict_end(&w);
    assert_int_equal(mt__pkw_finish(&w), 0);
    fclose(f);

    char err[512];
    int rc;
    mt_pk_doc_t *d = parse(buf, len, NULL, &rc, err, sizeof err);
    if (rc != 0)
        fail_msg("%s", err);
    const mt_pk_value_t *root = mt__pk_root(d);
    assert_int_equal(root->type, MT_PK_DICT);
    const mt_pk_value_t *iv = mt__pk_get(root, "ints");
    assert_int_equal(iv->n, sizeof ints / sizeof ints[0]);
    for (size_t i = 0; i < iv->n; i++)
        assert_true(iv->u.items[i]->u.i == ints[i]);
    const mt_pk_value_t *many = mt__pk_get(root, "many");
    assert_int_equal(many->n, 2500);
    assert_int_equal(many->u.items[2499]->u.i, 2499);
    assert_ptr_equal(mt__pk_get(root, "again"), many); /* the memo shares, never copies */
    const mt_pk_value_t *misc = mt__pk_get(root, "misc");
    assert_int_equal(misc->type, MT_PK_TUPLE);
    assert_int_equal(misc->u.items[0]->type, MT_PK_NONE);
    assert_int_equal(misc->u.items[1]->u.i, 1);
    assert_true(misc->u.items[2]->u.f == 2.5);
    assert_string_equal(misc->u.items[3]->u.s, "h\xc3\xa9");
    assert_int_equal(root->depth, 3);
    assert_null(mt__pk_get(root, "absent"));
    mt__pk_doc_destroy(&d);
    assert_null(d);

    /* Every proper prefix is refused with a message, never read past. */
    for (size_t n = 0; n < len; n += 7) {
        char *cut = malloc(n ? n : 1);
        memcpy(cut, buf, n);
        err[0] = '\0';
        d = parse(cut, n, NULL, &rc, err, sizeof err);
        assert_int_equal(rc, MT_EPROTO);
        assert_null(d);
        assert_non_null(strstr(err, "offset "));
        free(cut);
    }
    free(buf);
}

static void test_pickle_limits(void **state)
{
    (void)state;
    /* 100k-element list under a 64 KiB memory limit: refused, named, no crash. */
    size_t n = 100000;
    unsigned char *b = malloc(4 + 2 * n + 2);
    size_t o = 0;
    b[o++] = 0x80;
    b[o++] = 4;
    b[o++] = ']';
    b[o++] = '(';
    for (size_t i = 0; i < n; i++) {
        b[o++] = 'K';
        b[o++] = 1;
    }
    b[o++] = 'e';
    b[o++] = '.';
    mt_pk_cfg_t cfg = mt__pk_cfg_default();
    cfg.max_memory = 64 * 1024;
    char err[512];
    int rc;
    mt_pk_doc_t *d = parse(b, o, &cfg, &rc, err, sizeof err);
    assert_int_equal(rc, MT_ENOMEM);
    assert_non_null(strstr(err, "more than the reader's 65536 bytes"));
    cfg = mt__pk_cfg_default();
    cfg.max_stack = 1000;
    d = parse(b, o, &cfg, &rc, err, sizeof err);
    assert_int_equal(rc, MT_ENOMEM);
    assert_non_null(strstr(err, "values on the stack"));
    d = parse(b, o, NULL, &rc, err, sizeof err);
    assert_int_equal(rc, 0);
    assert_int_equal(mt__pk_root(d)->n, n);
    assert_true(mt__pk_memory(d) < 8 * MiB);
    mt__pk_doc_destroy(&d);
    free(b);
}

/* ---- the model ---- */

static void test_v2_layout(void **state)
{
    (void)state;
    const char *files[] = {"v2_all_actions_p2.pickle", "v2_all_actions_p3.pickle",
                           "v2_all_actions_p4.pickle", "v2_all_actions_p5.pickle"};
    for (size_t k = 0; k < 4; k++) {
        mt_ts_t *ts = load(files[k]);
        assert_int_equal(ts->era, 2);
        assert_int_equal(ts->nsegments, 3);
        assert_int_equal(ts->nblocks, 9);
        assert_int_equal(ts->ndevices, 2);
        assert_int_equal(ts->nevents, 16 + 9);
        assert_int_equal(ts->skipped_actions, 1);
        assert_int_equal(ts->nannotations, 3);
        assert_string_equal(ts->annotations[2].name, "optimizer");
        assert_true(ts->annotations[0].start && !ts->annotations[1].start);
        assert_string_equal(ts->alloc_conf, "expandable_segments:True");
        assert_true(ts->segments[0].large && !ts->segments[1].large);
        assert_true(ts->segments[2].expandable);
        assert_int_equal(ts->blocks[1].state, MT_TS_ACTIVE_PENDING_FREE);
        /* Frame lists shared in the file are one stack: TRAIN, LOSS, OPT. */
        assert_int_equal(ts->nstacks, 4);
        assert_int_equal(ts->events[8].action, MT_TS_OOM);
        assert_int_equal(ts->events[8].addr, 1 * MiB); /* device_free */
        assert_int_equal(mt__ts_check(ts, NULL, 0), 0);

        mt_ts_figures_t f;
        assert_int_equal(mt__ts_figures(ts, 0, &f), 0);
        assert_int_equal(f.peak_reserved, 22 * MiB);
        /* 8 MiB + (6 MiB - 100) + 512, and the 4096 bytes of the block from before the
         * trace (which it frees at the end) */
        assert_int_equal(f.peak_allocated, 14 * MiB + 412 + 4096);
        assert_int_equal(f.ooms, 1);
        assert_int_equal(f.orphan_frees, 1);
        assert_int_equal(f.pre_blocks, 1);
        assert_int_equal(f.allocs, 5);
        assert_int_equal(mt__ts_figures(ts, 1, &f), 0);
        assert_int_equal(f.peak_reserved, 5 * MiB); /* 2 + 2 mapped, then a 2 MiB segment */
        assert_int_equal(f.reserved_start, 0);
        assert_int_equal(f.end_reserved, 3 * MiB);

        char buf[128];
        mt_ts_site_t sites[4];
        size_t nsites;
        uint64_t peak;
        /* The block the trace frees without having allocated it (4096 bytes asked) was
         * live from the trace's start: at the peak too. */
        assert_int_equal(mt__ts_sites_at_peak(ts, 0, sites, 4, &nsites, &peak), 0);
        assert_int_equal(peak, 14 * MiB + 412 + 4096);
        assert_int_equal(nsites, 4);
        mt_fr_frame_t fr[8];
        int frame;
        assert_string_equal(mt__ts_stack_key(ts, sites[0].stack, NULL, MT_FR_BY_SITE, fr, 8, &frame,
                                             buf, sizeof buf),
                            "adam.py:150 step");
        assert_int_equal(sites[0].bytes, 8 * MiB);
        assert_string_equal(mt__ts_stack_key(ts, sites[1].stack, NULL, MT_FR_BY_SITE, fr, 8, &frame,
                                             buf, sizeof buf),
                            "model.py:41 forward");
        assert_int_equal(sites[1].bytes, 6 * MiB - 100);
        assert_int_equal(sites[2].bytes, 4096);
        assert_int_equal(sites[2].stack, 0);
        assert_int_equal(sites[3].bytes, 512);
        mt__ts_destroy(&ts);
        assert_null(ts);
    }
}

static void test_v113_layout(void **state)
{
    (void)state;
    mt_ts_t *ts = load("v113_segments.pickle");
    assert_int_equal(ts->era, 1);
    assert_int_equal(ts->nsegments, 2);
    assert_int_equal(ts->nblocks, 4);
    assert_int_equal(ts->nevents, 0);
    assert_int_equal(ts->nhistory, 3);
    /* Blocks without an address tile their segment in order. */
    assert_int_equal(ts->blocks[1].addr, 0x7F2000000000ull + 4 * MiB);
    assert_int_equal(ts->blocks[1].nhistory, 2);
    assert_int_equal(ts->history[ts->blocks[1].first_history].real_size, 8 * MiB);
    assert_int_equal(ts->blocks[3].state, MT_TS_INACTIVE);
    mt__ts_destroy(&ts);
}

/* Every malformed file is refused with MT_EPROTO and the message its .expected names. */
static void test_invalid_files(void **state)
{
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/invalid", data_dir);
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 8 || strcmp(e->d_name + len - 7, ".pickle") != 0)
            continue;
        char path[1200], exp[1300], line[512] = "", err[768] = "";
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(exp, sizeof exp, "%s.expected", path);
        FILE *f = fopen(exp, "r");
        assert_non_null(f);
        assert_non_null(fgets(line, sizeof line, f));
        fclose(f);
        line[strcspn(line, "\n")] = '\0';
        mt_ts_t *ts = NULL;
        int rc = mt__ts_read(&ts, path, err, sizeof err);
        if (rc != MT_EPROTO || strstr(err, line + 2) == NULL || strncmp(err, path, strlen(path)))
            fail_msg("%s: rc %d, message '%s', expected '%s'", path, rc, err, line + 2);
        assert_null(ts);
        n++;
    }
    closedir(d);
    assert_true(n >= 20);
}

/* ---- writing ---- */

static mt_ts_t *reread(const mt_ts_t *ts, int era)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(mt__ts_write(ts, f, era), 0);
    fclose(f);
    char err[768];
    mt_pk_doc_t *d = NULL;
    int rc = mt__pk_parse(&d, buf, len, NULL, err, sizeof err);
    if (rc != 0)
        fail_msg("%s", err);
    free(buf);
    mt_ts_t *back = NULL;
    if (mt__ts_from_pickle(&back, d, "written", err, sizeof err) != 0)
        fail_msg("%s", err);
    return back;
}

static void assert_same_segments(const mt_ts_t *a, const mt_ts_t *b)
{
    assert_int_equal(a->nsegments, b->nsegments);
    assert_int_equal(a->nblocks, b->nblocks);
    for (size_t i = 0; i < a->nsegments; i++) {
        assert_int_equal(a->segments[i].addr, b->segments[i].addr);
        assert_int_equal(a->segments[i].total_size, b->segments[i].total_size);
        assert_int_equal(a->segments[i].device, b->segments[i].device);
        assert_int_equal(a->segments[i].large, b->segments[i].large);
    }
    for (size_t i = 0; i < a->nblocks; i++) {
        assert_int_equal(a->blocks[i].addr, b->blocks[i].addr);
        assert_int_equal(a->blocks[i].size, b->blocks[i].size);
        assert_int_equal(a->blocks[i].state, b->blocks[i].state);
    }
}

static void test_write_roundtrip(void **state)
{
    (void)state;
    mt_ts_t *ts = load("v2_all_actions_p4.pickle");
    mt_ts_t *back = reread(ts, 2);
    assert_int_equal(back->era, 2);
    assert_same_segments(ts, back);
    assert_int_equal(back->nevents, ts->nevents);
    assert_int_equal(back->nstacks, ts->nstacks); /* stacks written once, then memo refs */
    assert_int_equal(back->nannotations, ts->nannotations);
    assert_string_equal(back->alloc_conf, ts->alloc_conf);
    for (size_t i = 0; i < ts->nevents; i++) {
        const mt_ts_event_t *x = &ts->events[i], *y = &back->events[i];
        assert_int_equal(x->action, y->action);
        assert_int_equal(x->addr, y->addr);
        assert_int_equal(x->size, y->size);
        assert_int_equal(x->stream, y->stream);
        assert_int_equal(x->time_us, y->time_us);
        assert_int_equal(x->device, y->device);
    }
    for (unsigned d = 0; d < 2; d++) {
        mt_ts_figures_t f1, f2;
        assert_int_equal(mt__ts_figures(ts, d, &f1), 0);
        assert_int_equal(mt__ts_figures(back, d, &f2), 0);
        assert_memory_equal(&f1, &f2, sizeof f1);
    }
    mt__ts_destroy(&back);

    /* 1.13: the list of segments, history built from each allocated block. */
    back = reread(ts, 1);
    assert_int_equal(back->era, 1);
    assert_same_segments(ts, back);
    assert_int_equal(back->nevents, 0);
    assert_int_equal(back->nhistory, 4); /* the allocated and pending blocks */
    mt__ts_destroy(&back);
    mt__ts_destroy(&ts);

    ts = load("v113_segments.pickle");
    back = reread(ts, 1);
    assert_same_segments(ts, back);
    assert_int_equal(back->nhistory, ts->nhistory);
    mt__ts_destroy(&back);
    mt__ts_destroy(&ts);
}

/* The trace as an allocation trace: every allocate freed once, frees carry the size. */
static void test_to_trace_and_replay(void **state)
{
    (void)state;
    mt_ts_t *ts = load("v2_all_actions_p4.pickle");
    mt_trace_t *t = NULL;
    char err[256];
    assert_int_equal(mt__ts_to_trace(ts, 0, &t, err, sizeof err), 0);
    /* the block from before the trace is allocated first, and freed by the trace */
    assert_int_equal(t->nallocs, 5 + 1);
    assert_int_equal(t->nfrees, 3 + 1);
    assert_int_equal(t->nfailures, 1);
    assert_int_equal(t->leaked, 2);
    assert_int_equal(t->ops[0].action, MT_TRACE_ALLOCATE);
    assert_int_equal(t->ops[0].size, 4096);
    assert_int_equal(t->peak_live_bytes, 14 * MiB + 412 + 4096);
    assert_int_equal(t->nstreams, 1);
    mt_replay_cfg_t cfg = mt__replay_cfg_default();
    mt_replay_result_t r;
    assert_int_equal(mt__replay_run(t, &cfg, &r, err, sizeof err), 0);
    assert_true(r.peak_allocated >= t->peak_live_bytes);
    assert_true(r.peak_reserved >= r.peak_allocated);
    mt__trace_free(&t);
    assert_int_equal(mt__ts_to_trace(ts, 1, &t, err, sizeof err), 0);
    assert_int_equal(t->nstreams, 1);
    assert_int_equal(t->streams[0], 7);
    mt__trace_free(&t);
    mt__ts_destroy(&ts);
}

static int count_rec(void *ctx, const mt_event_rec_t *ev, uint32_t stack, unsigned flags)
{
    (void)flags;
    uint64_t *c = ctx;
    (void)stack;
    c[0]++;
    if (ev->allocated > c[1])
        c[1] = ev->allocated;
    if (ev->reserved > c[2])
        c[2] = ev->reserved;
    return 0;
}

static void test_records(void **state)
{
    (void)state;
    mt_ts_t *ts = load("v2_all_actions_p4.pickle");
    uint64_t c[3] = {0};
    assert_int_equal(mt__ts_records(ts, count_rec, c), 0);
    /* The snapshot marker carries nothing; the forward START/END annotations are marks, and
     * the optimizer START a named mark; the block the trace frees without having allocated
     * it was there before the trace: its alloc comes first. */
    assert_int_equal(c[0], ts->nevents - 1 + 3 + 1);
    assert_int_equal(c[1], 8 * MiB + 6 * MiB + 512 + 4096); /* rounded block bytes */
    assert_int_equal(c[2], 22 * MiB);
    mt__ts_destroy(&ts);

    /* No trace (1.13): the state as events: 2 segments, 2 allocated blocks. */
    ts = load("v113_segments.pickle");
    memset(c, 0, sizeof c);
    assert_int_equal(mt__ts_records(ts, count_rec, c), 0);
    assert_int_equal(c[0], 4);
    assert_int_equal(c[1], 12 * MiB);
    assert_int_equal(c[2], 22 * MiB);
    mt__ts_destroy(&ts);
}

/* The records made up from the state before the trace, up to 8. */
typedef struct before_s {
    mt_event_rec_t r[8];
    size_t n;
} before_t;

static int before_rec(void *ctx, const mt_event_rec_t *ev, uint32_t stack, unsigned flags)
{
    (void)stack;
    before_t *b = ctx;
    if ((flags & MT_TS_REC_BEFORE) && b->n < 8)
        b->r[b->n++] = *ev;
    return 0;
}

static void assert_rec(const mt_event_rec_t *r, int kind, uint64_t addr, uint64_t size)
{
    assert_int_equal(r->kind, kind);
    assert_true(r->addr == addr);
    assert_true(r->size == size);
}

/* Expandable segments in a trace begun mid-run: pages were mapped before it where the first
 * event touching them is an unmap, or none touches them and they are mapped at the end.
 * Before, a segment whose pages the trace mapped was left out whole, and its blocks from
 * before the trace lay in no segment. */
static void test_expandable_before_trace(void **state)
{
    (void)state;
    const uint64_t X = 0x7F4000000000;
    mt_ts_t *ts = load("v2_expandable_midrun.pickle");
    before_t b = {0};
    assert_int_equal(mt__ts_records(ts, before_rec, &b), 0);
    assert_int_equal(b.n, 3);
    assert_rec(&b.r[0], MT_EV_SEGMENT_MAP, X, 4 * MiB);           /* kept, its end mapped */
    assert_rec(&b.r[1], MT_EV_SEGMENT_MAP, X + 6 * MiB, 2 * MiB); /* unmapped by the trace */
    assert_rec(&b.r[2], MT_EV_ALLOC, X, 4 * MiB);
    assert_int_equal(b.r[0].pool, MT_POOL_LARGE);
    assert_true(b.r[2].reserved == 6 * MiB && b.r[2].allocated == 4 * MiB);
    mt__ts_destroy(&ts);

    /* Made here: maps and unmaps that overlap, one range touched twice (its first touch
     * decides), a map of pages never mapped at the end, an untouched run at the end. */
    assert_int_equal(mt__ts_create(&ts), 0);
    const uint64_t P = 2 * MiB;
    const struct {
        int action;
        uint64_t addr, size;
    } evs[] = {
        {MT_TS_SEGMENT_UNMAP, X, 2 * P},     /* [0, 2): mapped before */
        {MT_TS_SEGMENT_MAP, X, 3 * P},       /* [2, 3): unmapped before */
        {MT_TS_SEGMENT_UNMAP, X + 2 * P, P}, /* (seen) */
        {MT_TS_SEGMENT_MAP, X + 10 * P, P},  /* [10, 11): unmapped, never at the end */
        {MT_TS_SEGMENT_UNMAP, X + 10 * P, P},
    };
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++) {
        mt_ts_event_t e = {
            .action = (uint8_t)evs[i].action, .addr = evs[i].addr, .size = evs[i].size};
        assert_int_equal(mt__ts_add_event(ts, &e), 0);
    }
    /* At the end: [0, 2) (mapped again) and [5, 7), untouched. */
    mt_ts_segment_t sg = {.addr = X, .total_size = 2 * P, .large = true, .expandable = true};
    mt_ts_block_t blk = {.addr = X, .size = 2 * P, .state = MT_TS_INACTIVE};
    assert_int_equal(mt__ts_add_segment(ts, &sg, &blk, 1), 0);
    sg.addr = blk.addr = X + 5 * P;
    assert_int_equal(mt__ts_add_segment(ts, &sg, &blk, 1), 0);
    memset(&b, 0, sizeof b);
    assert_int_equal(mt__ts_records(ts, before_rec, &b), 0);
    assert_int_equal(b.n, 2);
    assert_rec(&b.r[0], MT_EV_SEGMENT_MAP, X, 2 * P);
    assert_rec(&b.r[1], MT_EV_SEGMENT_MAP, X + 5 * P, 2 * P);
    mt__ts_destroy(&ts);
}

/* A file's segment sizes are 64-bit and unchecked: sums past 2^63 are still exact, and a
 * figure past 2^64 reads as the largest a field holds (no signed overflow, for UBSan). */
static void test_figures_huge_sizes(void **state)
{
    (void)state;
    mt_ts_t *ts;
    assert_int_equal(mt__ts_create(&ts), 0);
    const uint64_t big = (UINT64_C(1) << 63) - 512;
    mt_ts_event_t e = {.action = MT_TS_SEGMENT_ALLOC, .addr = 0x10000, .size = big};
    assert_int_equal(mt__ts_add_event(ts, &e), 0);
    e.addr += big;
    assert_int_equal(mt__ts_add_event(ts, &e), 0);
    e.action = MT_TS_SEGMENT_FREE;
    assert_int_equal(mt__ts_add_event(ts, &e), 0);
    mt_ts_figures_t f;
    assert_int_equal(mt__ts_figures(ts, 0, &f), 0);
    assert_true(f.peak_reserved == 2 * big);
    assert_true(f.end_reserved == big);
    assert_int_equal(f.segment_events, 3);
    /* Three at once exceed 2^64. */
    e.action = MT_TS_SEGMENT_ALLOC;
    for (int k = 0; k < 2; k++) {
        e.addr += big;
        assert_int_equal(mt__ts_add_event(ts, &e), 0);
    }
    assert_int_equal(mt__ts_figures(ts, 0, &f), 0);
    assert_true(f.peak_reserved == UINT64_MAX);
    mt__ts_destroy(&ts);
}

/* The snapshot as mt__ts_write writes it (era 2), in a buffer of its own. */
static char *written(const mt_ts_t *ts, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    assert_non_null(f);
    assert_int_equal(mt__ts_write(ts, f, 2), 0);
    fclose(f);
    return buf;
}

/* A snapshot compressed by gzip, xz or zstd (the tools' own files) reads as the plain one:
 * the same model, written back to the same bytes. */
static void test_compressed(void **state)
{
    (void)state;
    static const char *const names[][2] = {
        {"v2_torch_frames.pickle", "compressed/v2_torch_frames.pickle.gz"},
        {"v2_all_actions_p4.pickle", "compressed/v2_all_actions_p4.pickle.xz"},
        {"v2_midrun.pickle", "compressed/v2_midrun.pickle.zst"},
        /* pzstd 1.5.4's: a skippable frame first */
        {"v2_all_actions_p4.pickle", "compressed/v2_all_actions_p4.pickle.pzstd.zst"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        mt_ts_t *plain = load(names[i][0]), *z = load(names[i][1]);
        assert_true(plain->nevents > 0 || plain->nsegments > 0);
        assert_int_equal(plain->nevents, z->nevents);
        assert_same_segments(plain, z);
        size_t na, nb;
        char *a = written(plain, &na), *b = written(z, &nb);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na);
        free(a);
        free(b);
        mt__ts_destroy(&plain);
        mt__ts_destroy(&z);
    }
}

/* Decompression stops at cfg.max_inflate, naming the limit and what to do; a limit of
 * exactly the pickle's size reads it. */
static void test_compressed_limit(void **state)
{
    (void)state;
    char path[1024], plain[1024], err[768];
    snprintf(path, sizeof path, "%s/compressed/v2_all_actions_p4.pickle.xz", data_dir);
    snprintf(plain, sizeof plain, "%s/v2_all_actions_p4.pickle", data_dir);
    FILE *f = fopen(plain, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    fclose(f);
    mt_pk_cfg_t cfg = mt__pk_cfg_default();
    mt_pk_doc_t *doc = NULL;
    cfg.max_inflate = size - 1;
    assert_int_equal(mt__pk_parse_file(&doc, path, &cfg, err, sizeof err), MT_EPROTO);
    assert_null(doc);
    assert_non_null(strstr(err, "compressed with xz, it decompresses to more than"));
    assert_non_null(strstr(err, "decompress it first (xz -dk FILE)"));
    assert_int_equal(strncmp(err, path, strlen(path)), 0);
    cfg.max_inflate = size;
    if (mt__pk_parse_file(&doc, path, &cfg, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(mt__pk_input_size(doc), size);
    mt__pk_doc_destroy(&doc);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_snapshot DATA_DIR\n");
        return 2;
    }
    data_dir = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pickle_roundtrip),    cmocka_unit_test(test_pickle_limits),
        cmocka_unit_test(test_v2_layout),           cmocka_unit_test(test_v113_layout),
        cmocka_unit_test(test_invalid_files),       cmocka_unit_test(test_write_roundtrip),
        cmocka_unit_test(test_to_trace_and_replay), cmocka_unit_test(test_records),
        cmocka_unit_test(test_figures_huge_sizes),  cmocka_unit_test(test_expandable_before_trace),
        cmocka_unit_test(test_compressed),          cmocka_unit_test(test_compressed_limit),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
