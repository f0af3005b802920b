/* Round trips through a PyTorch snapshot, from a log recorded from memtrace's own allocator
 * (sim backend, a randomized run with tags, two streams, markers, blocks left live):
 * - log -> snapshot (both layouts, written and read back) -> report gives the same peaks,
 *   per-tag peaks, final totals and segment map as the log itself;
 * - the snapshot's trace replayed (memtrace replay's engine) reserves exactly what the
 *   recording allocator reserved, at its peak.
 * `test_roundtrip --write-log FILE` only writes the log (for test_torch.sh). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "analysis/replay.h"
#include "analysis/report.h"
#include "analysis/torch_snapshot.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "tests/common/test_main.h"

enum { PID = 77 };

typedef struct rec_s {
    FILE *log; /* NULL: not recording */
} rec_t;

static void emit(void *ud, const mt_event_rec_t *ev)
{
    rec_t *r = ud;
    char line[1024];
    size_t n = mt_prof_event_write(line, sizeof line, ev, PID, NULL, NULL);
    if (r->log != NULL && n < sizeof line)
        fwrite(line, 1, n, r->log);
}

/* Records a run into log; *peak_reserved is the allocator's own figure. */
static void record(FILE *log, uint64_t *peak_reserved, unsigned seed, const char *conf)
{
    rec_t rec = {.log = log};
    mt_event_sink_t sink = {.emit = emit, .ud = &rec};
    json_t *hello = mt_prof_hello_to_json(PID, "roundtrip", 0, 0);
    char *h = json_dumps(hello, JSON_COMPACT);
    fprintf(log, "%s\n", h);
    free(h);
    json_decref(hello);
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = (size_t)8 << 30;
    bc.sim_malloc_cost_ns = 0;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    /* NULL: the default (expandable segments); else e.g. the reference's plain segments. */
    if (conf != NULL)
        assert_int_equal(mt_alloc_cfg_parse(&ac, conf, NULL, 0), 0);
    ac.backend = b;
    ac.sink = &sink;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &ac), 0);
    int kv;
    assert_int_equal(mt_alloc_tag_register(a, "kv cache", &kv), 0);
    mt_stream_t *s2 = NULL;
    assert_int_equal(mt_stream_create(b, &s2), 0);
    enum { N = 4000, LIVE = 300 };
    void *ptr[LIVE] = {0};
    srand(seed);
    for (int i = 0; i < N; i++) {
        if (i % 500 == 0)
            mt_alloc_emit(a, MT_EV_MARK, MT_MARK_ITERATION, (uint64_t)i / 500, 0);
        if (i % 500 == 10)
            mt_alloc_emit(a, MT_EV_MARK, MT_MARK_FORWARD_BEGIN, 0, 0);
        if (i % 500 == 200)
            mt_alloc_emit(a, MT_EV_MARK, MT_MARK_FORWARD_END, 0, 0);
        int k = rand() % LIVE;
        if (ptr[k] != NULL) {
            assert_int_equal(mt_alloc_free(a, ptr[k]), 0);
            ptr[k] = NULL;
            continue;
        }
        size_t size =
            rand() % 4 == 0 ? (size_t)(rand() % (8 << 20)) + 1 : (size_t)(rand() % 70000) + 1;
        int tag = rand() % 5 == 0 ? kv : rand() % MT_TAG_USER_FIRST;
        assert_int_equal(mt_alloc_malloc(a, size, k % 3 == 0 ? s2 : NULL, tag, &ptr[k]), 0);
    }
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(a, &st), 0);
    *peak_reserved = (uint64_t)st.reserved_bytes[MT_STAT_ALL].peak;
    /* Blocks stay live at the end (the snapshot's segments have allocated blocks): the
     * recording stops before the allocator is destroyed. */
    rec.log = NULL;
    mt_alloc_destroy(&a);
    mt_stream_destroy(b, &s2);
    mt_backend_destroy(&b);
}

static mt__report_t *report_of_log(const char *buf, size_t len)
{
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    const char *p = buf, *end = buf + len;
    char err[256];
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (mt__report_add_line(r, p, n, err, sizeof err) != 0)
            fail_msg("log line: %s", err);
        p += n + 1;
    }
    return r;
}

typedef struct feed_s {
    mt__report_t *r;
    const mt_ts_t *ts;
    uint64_t seq;
} feed_t;

static const char *ts_tag(void *ud, int tag)
{
    const mt_ts_t *ts = ud;
    return ts->tag_label[tag];
}

static int feed(void *ctx, const mt_event_rec_t *ev, uint32_t stack, unsigned flags)
{
    (void)flags;
    feed_t *f = ctx;
    (void)stack;
    mt_event_rec_t e = *ev;
    e.seq = ++f->seq;
    char line[1024], err[256];
    size_t n = mt_prof_event_write(line, sizeof line, &e, PID, ts_tag, (void *)f->ts);
    assert_true(n < sizeof line);
    if (mt__report_add_line(f->r, line, n, err, sizeof err) != 0)
        fail_msg("record: %s", err);
    return 0;
}

static mt__report_t *report_of_snapshot(const mt_ts_t *ts)
{
    feed_t f = {.ts = ts};
    assert_int_equal(mt__report_create(&f.r, NULL), 0);
    for (int t = MT_TAG_USER_FIRST; t < MT_TAG_MAX; t++)
        if (ts->tag_label[t] != NULL) {
            mt_event_rec_t ev = {.kind = MT_EV_TAG_LABEL, .tag = (uint8_t)t};
            mt_event_label_pack(&ev, ts->tag_label[t]);
            feed(&f, &ev, 0, 0);
        }
    assert_int_equal(mt__ts_records(ts, feed, &f), 0);
    return f.r;
}

static mt_ts_t *write_and_read(const mt_ts_t *ts, int era)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(mt__ts_write(ts, f, era), 0);
    fclose(f);
    mt_pk_doc_t *d = NULL;
    char err[768];
    if (mt__pk_parse(&d, buf, len, NULL, err, sizeof err) != 0)
        fail_msg("%s", err);
    free(buf);
    mt_ts_t *back = NULL;
    if (mt__ts_from_pickle(&back, d, "mem", err, sizeof err) != 0)
        fail_msg("%s", err);
    return back;
}

static void assert_json_same(json_t *a, json_t *b, const char *key)
{
    json_t *x = json_object_get(a, key), *y = json_object_get(b, key);
    assert_non_null(x);
    if (!json_equal(x, y)) {
        char *sx = json_dumps(x, JSON_COMPACT), *sy = json_dumps(y, JSON_COMPACT);
        fail_msg("%s: log %s, snapshot %s", key, sx, sy ? sy : "(none)");
    }
}

/* Log -> snapshot -> records: the same figures and the same segment map at the end, under
 * the allocator settings conf (NULL: the default). */
static void roundtrip(const char *conf)
{
    char *log = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&log, &len);
    uint64_t alloc_peak_reserved;
    record(f, &alloc_peak_reserved, 1, conf);
    fclose(f);

    mt__report_t *ra = report_of_log(log, len);
    mt_ts_t *ts = NULL;
    char err[256];
    assert_int_equal(mt__ts_from_report(&ts, ra, 0, 1, err, sizeof err), 0);
    assert_int_equal(mt__ts_check(ts, err, sizeof err), 0);
    assert_true(ts->nsegments > 0);
    assert_true(ts->nannotations >= 16 + 8); /* forward start/end, iterations */
    assert_string_equal(ts->tag_label[MT_TAG_USER_FIRST], "kv cache");

    mt_ts_t *back = write_and_read(ts, 2);
    mt__report_t *rb = report_of_snapshot(back);
    json_t *ja = mt__report_result(ra), *jb = mt__report_result(rb);
    json_t *pa = json_array_get(json_object_get(ja, "processes"), 0);
    json_t *pb = json_array_get(json_object_get(jb, "processes"), 0);
    const char *keys[] = {"peak_allocated", "peak_reserved", "final_allocated", "final_reserved",
                          "peak_by_tag"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        assert_json_same(pa, pb, keys[i]);
    /* The iteration marks came back through the annotations (their place among events of
     * the same microsecond is not kept: time_us is PyTorch's resolution). */
    json_t *ga = json_object_get(pa, "growth"), *gb = json_object_get(pb, "growth");
    assert_json_same(ga, gb, "iterations");
    assert_json_same(ga, gb, "first_iteration");
    assert_json_same(ga, gb, "last_iteration");

    /* The segment map at the end. */
    int pid;
    const char *name;
    size_t na, nb;
    assert_int_equal(mt__report_process(ra, 0, &pid, &name, &na), 0);
    assert_int_equal(mt__report_process(rb, 0, &pid, &name, &nb), 0);
    mt__report_map_t ma, mb;
    assert_int_equal(mt__report_map_at(ra, 0, na - 1, false, &ma), 0);
    assert_int_equal(mt__report_map_at(rb, 0, nb - 1, false, &mb), 0);
    assert_int_equal(ma.nsegs, mb.nsegs);
    assert_int_equal(ma.nblocks, mb.nblocks);
    for (size_t i = 0; i < ma.nsegs; i++) {
        assert_int_equal(ma.segs[i].addr, mb.segs[i].addr);
        assert_int_equal(ma.segs[i].size, mb.segs[i].size);
    }
    for (size_t i = 0; i < ma.nblocks; i++) {
        assert_int_equal(ma.blocks[i].addr, mb.blocks[i].addr);
        assert_int_equal(ma.blocks[i].size, mb.blocks[i].size);
        assert_int_equal(ma.blocks[i].tag, mb.blocks[i].tag);
    }
    /* The snapshot's own segments are that map too. */
    assert_int_equal(back->nsegments, ma.nsegs);
    mt__report_map_free(&ma);
    mt__report_map_free(&mb);
    json_decref(ja);
    json_decref(jb);

    /* Replay of the snapshot's trace reserves what the recording allocator reserved. */
    mt_trace_t *t = NULL;
    assert_int_equal(mt__ts_to_trace(back, 0, &t, err, sizeof err), 0);
    assert_int_equal(t->nstreams, 2);
    mt_replay_cfg_t cfg = mt__replay_cfg_default();
    cfg.capacity = (size_t)8 << 30;
    cfg.alloc_conf = conf; /* the recording allocator's rules */
    mt_replay_result_t res;
    assert_int_equal(mt__replay_run(t, &cfg, &res, err, sizeof err), 0);
    assert_int_equal(res.peak_reserved, alloc_peak_reserved);
    mt_ts_figures_t fig;
    assert_int_equal(mt__ts_figures(back, 0, &fig), 0);
    assert_int_equal(fig.peak_reserved, alloc_peak_reserved); /* and PyTorch's own figure */
    mt__trace_free(&t);

    /* 1.13: the same segments and blocks, history built from the blocks' tags. */
    mt_ts_t *old = write_and_read(ts, 1);
    assert_int_equal(old->era, 1);
    assert_int_equal(old->nsegments, ts->nsegments);
    assert_int_equal(old->nblocks, ts->nblocks);
    for (size_t i = 0; i < ts->nblocks; i++)
        assert_int_equal(old->blocks[i].size, ts->blocks[i].size);
    mt__ts_destroy(&old);

    mt__ts_destroy(&back);
    mt__ts_destroy(&ts);
    mt__report_destroy(&ra);
    mt__report_destroy(&rb);
    free(log);
}

/* Expandable segments: mapped pages join into one segment only within a pool, and the
 * trace's map events carry none; the conversion takes it from the final segments. */
static void test_roundtrip_default(void **state)
{
    (void)state;
    roundtrip(NULL);
}

static void test_roundtrip_reference(void **state)
{
    (void)state;
    roundtrip("rules:reference");
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-log") == 0) {
        FILE *f = fopen(argv[2], "w");
        if (f == NULL) {
            perror(argv[2]);
            return 1;
        }
        uint64_t peak;
        record(f, &peak, 2, NULL);
        return fclose(f) == 0 ? 0 : 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_roundtrip_default),
                                       cmocka_unit_test(test_roundtrip_reference)};
    return MT_TEST_RUN(tests, NULL, NULL);
}
