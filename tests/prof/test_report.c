/* The log analysis behind `memtrace report`, on crafted logs: growth across iterations
 * detected (and the growing tag named) or not, peaks by tag, never-freed allocations,
 * fragmentation, multiple processes, malformed lines, and pinned host memory kept apart from
 * the device figures. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memtrace/prof.h"
#include "mt_config.h"
#include "analysis/frames.h"
#include "analysis/report.h"
#include "tests/common/test_main.h"

#define MiB (UINT64_C(1) << 20)

/* A fake allocator for one pid: keeps the totals and feeds encoded lines to r. */
typedef struct gen_s {
    mt__report_t *r;
    char (*out)[512]; /* when set, lines are kept here (*nout of them) instead of fed to r */
    size_t *nout, maxout;
    int pid;
    int pool; /* 0: MT_POOL_LARGE */
    uint64_t seq, t, allocated, reserved;
} gen_t;

static void emit(gen_t *g, int kind, uint64_t addr, uint64_t size, int tag)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof(ev));
    ev.seq = g->seq++;
    ev.time_ns = (g->t += 1000);
    ev.kind = (uint8_t)kind;
    ev.addr = addr;
    ev.size = size;
    ev.requested = size;
    ev.tag = (uint8_t)tag;
    ev.pool = (uint8_t)(g->pool ? g->pool : MT_POOL_LARGE);
    ev.allocated = g->allocated;
    ev.reserved = g->reserved;
    char line[1024];
    size_t n = mt_prof_event_write(line, sizeof(line), &ev, g->pid, NULL, NULL);
    assert_true(n > 0 && n < sizeof(line));
    if (g->out != NULL) {
        assert_true(*g->nout < g->maxout && n < sizeof(g->out[0]));
        memcpy(g->out[(*g->nout)++], line, n + 1);
        return;
    }
    char err[128];
    assert_int_equal(mt__report_add_line(g->r, line, n, err, sizeof(err)), 0);
}

static void galloc(gen_t *g, uint64_t addr, uint64_t size, int tag)
{
    g->allocated += size;
    emit(g, MT_EV_ALLOC, addr, size, tag);
}

static void gfree(gen_t *g, uint64_t addr, uint64_t size, int tag)
{
    g->allocated -= size;
    emit(g, MT_EV_FREE_REQUESTED, addr, size, tag);
    emit(g, MT_EV_FREE_COMPLETED, addr, size, tag);
}

static void segment(gen_t *g, uint64_t addr, uint64_t size)
{
    g->reserved += size;
    emit(g, MT_EV_SEGMENT_ALLOC, addr, size, 0);
}

/* A training loop: weights once; per iteration activations allocated and freed; if
 * leak, one 2 MiB "history" activation per iteration is kept alive. */
static void training(gen_t *g, int iters, bool leak)
{
    const uint64_t base = 0x100000000;
    segment(g, base, 1024 * MiB);
    galloc(g, base, 64 * MiB, MT_TAG_WEIGHTS);
    uint64_t kept = base + 512 * MiB;
    for (int it = 0; it < iters; it++) {
        emit(g, MT_EV_MARK, MT_MARK_ITERATION, (uint64_t)it, 0);
        /* Noise: the live set of an iteration varies a little. */
        uint64_t act = (32 + (uint64_t)(it * 7 % 5)) * MiB;
        galloc(g, base + 64 * MiB, act, MT_TAG_ACTIVATIONS);
        galloc(g, base + 200 * MiB, 8 * MiB, MT_TAG_WORKSPACE);
        gfree(g, base + 200 * MiB, 8 * MiB, MT_TAG_WORKSPACE);
        if (leak) {
            galloc(g, kept, 2 * MiB, MT_TAG_ACTIVATIONS);
            kept += 2 * MiB;
        }
        gfree(g, base + 64 * MiB, act, MT_TAG_ACTIVATIONS);
    }
}

static json_t *run(bool leak, int iters)
{
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    gen_t g = {.r = r, .pid = 42};
    training(&g, iters, leak);
    json_t *res = mt__report_result(r);
    assert_non_null(res);
    mt__report_destroy(&r);
    return res;
}

static json_t *proc0(json_t *res)
{
    json_t *p = json_array_get(json_object_get(res, "processes"), 0);
    assert_non_null(p);
    return p;
}

static void test_growth_detected(void **state)
{
    (void)state;
    json_t *res = run(true, 20);
    json_t *p = proc0(res);
    json_t *g = json_object_get(p, "growth");
    assert_int_equal(json_integer_value(json_object_get(g, "iterations")), 20);
    assert_true(json_is_true(json_object_get(g, "detected")));
    double slope = json_real_value(json_object_get(g, "slope_bytes_per_iteration"));
    assert_true(slope > 1.5 * MiB && slope < 2.5 * MiB);
    json_t *tags = json_object_get(g, "tags");
    assert_int_equal(json_array_size(tags), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(tags, 0), "tag")),
                        "activations");
    /* The kept blocks are never freed: 20 x 2 MiB activations, plus the weights. */
    json_t *nf = json_object_get(p, "never_freed");
    assert_int_equal(json_integer_value(json_object_get(nf, "count")), 21);
    assert_int_equal(json_integer_value(json_object_get(nf, "bytes")), 64 * MiB + 40 * MiB);
    json_t *g0 = json_array_get(json_object_get(nf, "groups"), 0);
    assert_string_equal(json_string_value(json_object_get(g0, "tag")), "weights");
    json_t *g1 = json_array_get(json_object_get(nf, "groups"), 1);
    assert_string_equal(json_string_value(json_object_get(g1, "tag")), "activations");
    assert_int_equal(json_integer_value(json_object_get(g1, "count")), 20);
    assert_int_equal(json_integer_value(json_object_get(g1, "size")), 2 * MiB);
    json_decref(res);
}

static void test_no_growth(void **state)
{
    (void)state;
    json_t *res = run(false, 20);
    json_t *p = proc0(res);
    json_t *g = json_object_get(p, "growth");
    assert_int_equal(json_integer_value(json_object_get(g, "iterations")), 20);
    assert_false(json_is_true(json_object_get(g, "detected")));
    assert_int_equal(json_array_size(json_object_get(g, "tags")), 0);
    json_t *nf = json_object_get(p, "never_freed");
    assert_int_equal(json_integer_value(json_object_get(nf, "count")), 1); /* weights */
    /* Peaks by tag: weights 64 MiB, activations 32..36 MiB, workspace 8 MiB. */
    json_t *peak = json_object_get(p, "peak_by_tag");
    assert_int_equal(json_integer_value(json_object_get(peak, "weights")), 64 * MiB);
    assert_int_equal(json_integer_value(json_object_get(peak, "activations")), 36 * MiB);
    assert_int_equal(json_integer_value(json_object_get(peak, "workspace")), 8 * MiB);
    assert_int_equal(json_integer_value(json_object_get(p, "peak_allocated")), 108 * MiB);
    assert_int_equal(json_integer_value(json_object_get(p, "peak_reserved")), 1024 * MiB);
    json_decref(res);
}

/* A user tag named by its label announcement: the report's peaks, growth and
 * never-freed groups say "logits", not "tag7"; the announcement changes no figure. */
static void test_labelled_tag(void **state)
{
    (void)state;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    gen_t g = {.r = r, .pid = 43};
    const int logits = MT_TAG_USER_FIRST;
    mt_event_rec_t lab;
    memset(&lab, 0, sizeof lab);
    lab.seq = g.seq++;
    lab.time_ns = 500;
    lab.kind = MT_EV_TAG_LABEL;
    lab.tag = (uint8_t)logits;
    mt_event_label_pack(&lab, "logits");
    char line[1024], err[128];
    size_t n = mt_prof_event_write(line, sizeof line, &lab, g.pid, NULL, NULL);
    assert_true(n > 0 && n < sizeof line);
    assert_int_equal(mt__report_add_line(r, line, n, err, sizeof err), 0);
    segment(&g, 0x100000000, 256 * MiB);
    galloc(&g, 0x100000000, 16 * MiB, MT_TAG_WEIGHTS);
    uint64_t kept = 0x100000000 + 128 * MiB;
    for (int it = 0; it < 12; it++) {
        emit(&g, MT_EV_MARK, MT_MARK_ITERATION, (uint64_t)it, 0);
        galloc(&g, kept, 4 * MiB, logits); /* a leak of logits: never freed */
        kept += 4 * MiB;
    }
    json_t *res = mt__report_result(r);
    assert_non_null(res);
    mt__report_destroy(&r);
    json_t *p = proc0(res);
    json_t *peak = json_object_get(p, "peak_by_tag");
    assert_int_equal(json_integer_value(json_object_get(peak, "logits")), 48 * MiB);
    assert_null(json_object_get(peak, "tag7"));
    assert_int_equal(json_integer_value(json_object_get(p, "peak_allocated")), 64 * MiB);
    json_t *tags = json_object_get(json_object_get(p, "growth"), "tags");
    assert_int_equal(json_array_size(tags), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(tags, 0), "tag")),
                        "logits");
    json_t *groups = json_object_get(json_object_get(p, "never_freed"), "groups");
    bool named = false;
    for (size_t i = 0; i < json_array_size(groups); i++)
        named |= strcmp(json_string_value(json_object_get(json_array_get(groups, i), "tag")),
                        "logits") == 0;
    assert_true(named);
    json_decref(res);
}

static void test_few_iterations(void **state)
{
    (void)state;
    json_t *res = run(true, 2); /* growing, but two samples cannot tell a trend */
    json_t *g = json_object_get(proc0(res), "growth");
    assert_false(json_is_true(json_object_get(g, "detected")));
    json_decref(res);
}

static void test_timeline_fragmentation(void **state)
{
    (void)state;
    mt__report_cfg_t cfg = mt__report_cfg_default();
    cfg.timeline_steps = 4;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, &cfg), 0);
    gen_t g = {.r = r, .pid = 7};
    /* One 8 MiB segment, four 2 MiB blocks; free blocks 0 and 2: free space is two
     * separate 2 MiB holes, so fragmentation = 1 - 2/4 = 0.5. */
    segment(&g, 0x1000000, 8 * MiB);
    for (uint64_t i = 0; i < 4; i++)
        galloc(&g, 0x1000000 + i * 2 * MiB, 2 * MiB, MT_TAG_BATCH);
    gfree(&g, 0x1000000, 2 * MiB, MT_TAG_BATCH);
    gfree(&g, 0x1000000 + 4 * MiB, 2 * MiB, MT_TAG_BATCH);
    json_t *res = mt__report_result(r);
    json_t *tl = json_object_get(proc0(res), "timeline");
    assert_int_equal(json_array_size(tl), 4);
    json_t *last = json_array_get(tl, 3);
    assert_true(json_real_value(json_object_get(last, "fragmentation")) > 0.49);
    assert_true(json_real_value(json_object_get(last, "fragmentation")) < 0.51);
    assert_true(json_real_value(json_object_get(last, "utilization")) > 0.49);
    assert_true(json_real_value(json_object_get(last, "utilization")) < 0.51);
    /* Mid-run the segment was full: utilization 1, nothing free. */
    json_t *mid = json_array_get(tl, 1);
    assert_int_equal(json_integer_value(json_object_get(mid, "allocated")), 8 * MiB);
    assert_true(json_real_value(json_object_get(mid, "fragmentation")) < 0.01);
    json_decref(res);
    mt__report_destroy(&r);
}

static void feed(mt__report_t *r, char (*lines)[512], size_t from, size_t to)
{
    char err[128];
    for (size_t i = from; i < to; i++)
        assert_int_equal(mt__report_add_line(r, lines[i], strlen(lines[i]), err, sizeof(err)), 0);
}

/* One process's events split over two logs that overlap (the daemon's log, then the
 * program's own after a takeover): the report of both equals the report of the whole run,
 * with the overlap counted once. A later process reusing the pid (other records under the
 * same seqs) is not taken for a duplicate. */
static void test_two_logs_counted_once(void **state)
{
    (void)state;
    enum { MAXL = 4096 };
    char(*lines)[512] = calloc(MAXL, sizeof *lines);
    char(*other)[512] = calloc(MAXL, sizeof *other);
    assert_non_null(lines);
    assert_non_null(other);
    size_t n = 0, m = 0;
    gen_t g = {.out = lines, .nout = &n, .maxout = MAXL, .pid = 42};
    training(&g, 30, true);
    gen_t h = {.out = other, .nout = &m, .maxout = MAXL, .pid = 42, .t = 1000000000};
    training(&h, 5, false);

    mt__report_t *whole = NULL, *split = NULL;
    assert_int_equal(mt__report_create(&whole, NULL), 0);
    assert_int_equal(mt__report_create(&split, NULL), 0);
    feed(whole, lines, 0, n);
    size_t j = n / 3, k = 2 * n / 3;
    feed(split, lines, 0, k); /* the daemon's log */
    feed(split, lines, j, n); /* the program's own, from where the daemon's acknowledged */
    json_t *rw = mt__report_result(whole), *rs = mt__report_result(split);
    assert_int_equal(json_integer_value(json_object_get(rs, "duplicates")), k - j);
    assert_int_equal(json_integer_value(json_object_get(rw, "duplicates")), 0);
    json_t *pw = proc0(rw), *ps = proc0(rs);
    assert_int_equal(json_integer_value(json_object_get(ps, "duplicates")), k - j);
    static const char *const same[] = {"events",          "peak_allocated", "peak_reserved",
                                       "final_allocated", "timeline",       "never_freed",
                                       "growth"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        assert_true(json_equal(json_object_get(pw, same[i]), json_object_get(ps, same[i])));
    assert_true(json_is_true(json_object_get(json_object_get(ps, "growth"), "detected")));

    /* The pid reused: the other run's records (seqs from 0 again) are all kept. */
    feed(split, other, 0, m);
    json_t *rr = mt__report_result(split);
    assert_int_equal(json_integer_value(json_object_get(rr, "duplicates")), k - j);
    assert_int_equal(json_integer_value(json_object_get(proc0(rr), "events")), n + m);
    json_decref(rw);
    json_decref(rs);
    json_decref(rr);
    mt__report_destroy(&whole);
    mt__report_destroy(&split);
    free(lines);
    free(other);
}

static void test_processes_and_malformed(void **state)
{
    (void)state;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    char err[256];
    const char *hello = "{\"v\":1,\"type\":\"hello\",\"pid\":5,\"name\":\"a\","
                        "\"start_realtime_ns\":1,\"start_mono_ns\":1}";
    assert_int_equal(mt__report_add_line(r, hello, strlen(hello), err, sizeof(err)), 0);
    gen_t a = {.r = r, .pid = 5}, b = {.r = r, .pid = 6};
    galloc(&a, 0x1000, 512, MT_TAG_OTHER);
    galloc(&b, 0x1000, 1024, MT_TAG_GRADS);
    const char *gap = "{\"v\":1,\"type\":\"gap\",\"seq\":3,\"t_ns\":5,\"pid\":6,\"lost\":4}";
    assert_int_equal(mt__report_add_line(r, gap, strlen(gap), err, sizeof(err)), 0);
    const char *exit_ = "{\"v\":1,\"type\":\"exit\",\"pid\":5,\"t_ns\":9,\"clean\":true,"
                        "\"emitted\":1,\"dropped\":0,\"lost\":0}";
    assert_int_equal(mt__report_add_line(r, exit_, strlen(exit_), err, sizeof(err)), 0);
    /* The daemon's log names processes with process_event lines. */
    const char *reg = "{\"v\":1,\"type\":\"process_event\",\"event\":\"register\",\"pid\":6,"
                      "\"name\":\"b\"}";
    assert_int_equal(mt__report_add_line(r, reg, strlen(reg), err, sizeof(err)), 0);
    const char *qgap = "{\"v\":1,\"type\":\"gap\",\"lost\":3,\"source\":\"daemon\"}";
    assert_int_equal(mt__report_add_line(r, qgap, strlen(qgap), err, sizeof(err)), 0);
    /* Record types the report does not use are accepted. */
    const char *snap = "{\"v\":1,\"type\":\"snapshot\",\"pid\":5}";
    assert_int_equal(mt__report_add_line(r, snap, strlen(snap), err, sizeof(err)), 0);

    const char *bad[] = {
        "{\"v\":1,\"type\":\"event\"",                      /* truncated */
        "[]",                                               /* not an object */
        "{\"v\":9,\"type\":\"event\"}",                     /* unknown version */
        "{\"v\":1,\"type\":\"event\",\"pid\":1,\"seq\":1}", /* missing members */
        "\n",                                               /* empty */
    };
    const char *why[] = {"not JSON", "object", "version", "t_ns", "empty"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        assert_int_equal(mt__report_add_line(r, bad[i], strlen(bad[i]), err, sizeof(err)),
                         MT_EPROTO);
        assert_non_null(strstr(err, why[i]));
    }
    json_t *res = mt__report_result(r);
    assert_int_equal(json_integer_value(json_object_get(res, "malformed")), 5);
    assert_int_equal(json_integer_value(json_object_get(res, "events")), 2);
    json_t *procs = json_object_get(res, "processes");
    assert_int_equal(json_array_size(procs), 2);
    json_t *pa = json_array_get(procs, 0), *pb = json_array_get(procs, 1);
    assert_string_equal(json_string_value(json_object_get(pa, "name")), "a");
    assert_string_equal(json_string_value(json_object_get(pa, "exit")), "clean");
    assert_string_equal(json_string_value(json_object_get(pb, "exit")), "unknown");
    assert_int_equal(json_integer_value(json_object_get(pb, "lost")), 4);
    assert_string_equal(json_string_value(json_object_get(pb, "name")), "b");
    assert_int_equal(json_integer_value(json_object_get(res, "lost_unattributed")), 3);
    assert_int_equal(json_integer_value(json_object_get(pb, "peak_allocated")), 1024);
    json_decref(res);
    mt__report_destroy(&r);
}

/* A process with a device allocator and a pinned host cache (two event sources, each with
 * its own running totals): per iteration the activations are copied to a 16 MiB pinned
 * block and back; a 4 MiB pinned staging buffer is never freed. The device figures are
 * those of the device alone; the host summary has the pinned figures. */
static json_t *run_with_host(void)
{
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    gen_t g = {.r = r, .pid = 42};
    gen_t h = {.r = r, .pid = 42, .pool = MT_POOL_HOST};
    const uint64_t base = 0x100000000, hbase = 0x700000000;
    segment(&g, base, 1024 * MiB);
    galloc(&g, base, 64 * MiB, MT_TAG_WEIGHTS);
    h.t = g.t;
    segment(&h, hbase, 64 * MiB);
    galloc(&h, hbase, 4 * MiB, MT_TAG_BATCH);
    for (int it = 0; it < 20; it++) {
        emit(&g, MT_EV_MARK, MT_MARK_ITERATION, (uint64_t)it, 0);
        uint64_t act = (32 + (uint64_t)(it * 7 % 5)) * MiB;
        galloc(&g, base + 64 * MiB, act, MT_TAG_ACTIVATIONS);
        h.t = g.t;
        galloc(&h, hbase + 4 * MiB, 16 * MiB, MT_TAG_ACTIVATIONS);
        g.t = h.t;
        galloc(&g, base + 200 * MiB, 8 * MiB, MT_TAG_WORKSPACE);
        gfree(&g, base + 200 * MiB, 8 * MiB, MT_TAG_WORKSPACE);
        gfree(&g, base + 64 * MiB, act, MT_TAG_ACTIVATIONS);
        h.t = g.t;
        gfree(&h, hbase + 4 * MiB, 16 * MiB, MT_TAG_ACTIVATIONS);
        g.t = h.t;
    }
    json_t *res = mt__report_result(r);
    assert_non_null(res);
    mt__report_destroy(&r);
    return res;
}

static void test_host_apart(void **state)
{
    (void)state;
    json_t *res = run_with_host();
    assert_int_equal(json_array_size(json_object_get(res, "processes")), 1);
    json_t *p = proc0(res);

    /* Device: exactly as without the host cache (test_no_growth). */
    assert_int_equal(json_integer_value(json_object_get(p, "peak_allocated")), 108 * MiB);
    assert_int_equal(json_integer_value(json_object_get(p, "peak_reserved")), 1024 * MiB);
    assert_int_equal(json_integer_value(json_object_get(p, "final_allocated")), 64 * MiB);
    assert_int_equal(json_integer_value(json_object_get(p, "final_reserved")), 1024 * MiB);
    json_t *peak = json_object_get(p, "peak_by_tag");
    assert_int_equal(json_integer_value(json_object_get(peak, "activations")), 36 * MiB);
    assert_null(json_object_get(peak, "batch"));
    json_t *nf = json_object_get(p, "never_freed");
    assert_int_equal(json_integer_value(json_object_get(nf, "count")), 1);
    assert_int_equal(json_integer_value(json_object_get(nf, "bytes")), 64 * MiB);
    json_t *tl = json_object_get(p, "timeline");
    size_t i;
    json_t *smp;
    json_array_foreach(tl, i, smp)
    {
        assert_true(json_integer_value(json_object_get(smp, "peak_allocated")) <=
                    (json_int_t)(108 * MiB));
        assert_int_equal(json_integer_value(json_object_get(smp, "reserved")), 1024 * MiB);
    }
    json_t *gr = json_object_get(p, "growth");
    assert_int_equal(json_integer_value(json_object_get(gr, "iterations")), 20);
    assert_false(json_is_true(json_object_get(gr, "detected")));

    /* Pinned host: 4 MiB staging + 16 MiB copies at the peak, in one 64 MiB segment. */
    json_t *hs = json_object_get(p, "host");
    assert_non_null(hs);
    assert_int_equal(json_integer_value(json_object_get(hs, "events")), 2 + 20 * 3);
    assert_int_equal(json_integer_value(json_object_get(hs, "peak_allocated")), 20 * MiB);
    assert_int_equal(json_integer_value(json_object_get(hs, "peak_reserved")), 64 * MiB);
    assert_int_equal(json_integer_value(json_object_get(hs, "final_allocated")), 4 * MiB);
    assert_int_equal(json_integer_value(json_object_get(hs, "final_reserved")), 64 * MiB);
    json_t *hpeak = json_object_get(hs, "peak_by_tag");
    assert_int_equal(json_integer_value(json_object_get(hpeak, "activations")), 16 * MiB);
    assert_int_equal(json_integer_value(json_object_get(hpeak, "batch")), 4 * MiB);
    json_t *hnf = json_object_get(hs, "never_freed");
    assert_int_equal(json_integer_value(json_object_get(hnf, "count")), 1);
    assert_int_equal(json_integer_value(json_object_get(hnf, "bytes")), 4 * MiB);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(hnf, "groups"), 0), "tag")),
                        "batch");
    json_decref(res);
}

/* A process without a pinned host cache has an empty host summary. */
static void test_host_empty(void **state)
{
    (void)state;
    json_t *res = run(false, 3);
    json_t *hs = json_object_get(proc0(res), "host");
    assert_non_null(hs);
    assert_int_equal(json_integer_value(json_object_get(hs, "events")), 0);
    assert_int_equal(json_integer_value(json_object_get(hs, "peak_allocated")), 0);
    assert_int_equal(json_object_size(json_object_get(hs, "peak_by_tag")), 0);
    json_decref(res);
}

/* The report document (with a host summary) validates against the telemetry schema (ajv,
 * tests/prof/validate.mjs); skipped without node or ajv. */
static void test_report_matches_schema(void **state)
{
    (void)state;
    if (system("command -v node > /dev/null 2>&1") != 0)
        skip();
    json_t *res = run_with_host();
    char path[64];
    snprintf(path, sizeof path, "/tmp/mt-report-schema-%d.ndjson", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(json_dumpf(res, f, JSON_COMPACT), 0);
    fputc('\n', f);
    fclose(f);
    json_decref(res);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "node %s/tests/prof/validate.mjs %s/docs/telemetry.schema.json %s >&2", MT_SOURCE_ROOT,
             MT_SOURCE_ROOT, path);
    int st = system(cmd);
    unlink(path);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77)
        skip(); /* ajv not installed: npm ci --prefix tests/prof */
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* Call sites grouped by function, where the merges reorder them: function f<i> has a large
 * stack (bytes falling with i) and a small one (bytes rising with i), so by function the
 * sums rise with i and the merged rows must come out in the reverse of their first order
 * (a report of 16,000 such functions took 28 s with the insertion sort this replaced). */
static void test_callsites_reranked(void **state)
{
    (void)state;
    enum { K = 300 };
    mt__report_cfg_t cfg = mt__report_cfg_default();
    cfg.by_callsite = true;
    cfg.by = MT_FR_BY_FUNCTION;
    cfg.top = K;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, &cfg), 0);
    char line[512], err[128];
    int n =
        snprintf(line, sizeof line, "{\"v\":1,\"type\":\"hello\",\"pid\":7,\"name\":\"sites\"}");
    assert_int_equal(mt__report_add_line(r, line, (size_t)n, err, sizeof err), 0);
    for (int i = 0; i < K; i++) {
        for (int j = 1; j <= 2; j++) {
            n = snprintf(line, sizeof line,
                         "{\"v\":1,\"kind\":\"stack\",\"pid\":7,\"id\":%d,\"frames\":"
                         "[{\"py\":\"f%d\",\"file\":\"/src/m.py\",\"line\":%d}]}",
                         2 * i + j, i, j);
            assert_int_equal(mt__report_add_line(r, line, (size_t)n, err, sizeof err), 0);
        }
    }
    gen_t g = {.r = r, .pid = 7};
    uint64_t base = 0x10000000, at = base;
    segment(&g, base, 1024 * MiB);
    for (int i = 0; i < K; i++) {
        for (int j = 1; j <= 2; j++) {
            uint64_t size = 512 * (uint64_t)(j == 1 ? 3 * K - i : 2 * i + 1);
            n = snprintf(line, sizeof line,
                         "{\"v\":1,\"type\":\"event\",\"seq\":%" PRIu64 ",\"t_ns\":%" PRIu64
                         ",\"pid\":7,\"dev\":0,\"kind\":\"stack_ref\","
                         "\"addr\":\"0x%" PRIx64 "\",\"pool\":\"large\",\"stack\":%d}",
                         g.seq++, g.t += 1000, at, 2 * i + j);
            assert_int_equal(mt__report_add_line(r, line, (size_t)n, err, sizeof err), 0);
            galloc(&g, at, size, MT_TAG_BATCH);
            at += size;
        }
    }
    json_t *res = mt__report_result(r);
    json_t *rows = json_object_get(json_object_get(proc0(res), "callsites"), "at_peak");
    assert_int_equal(json_array_size(rows), K);
    for (int k = 0; k < K; k++) {
        json_t *row = json_array_get(rows, (size_t)k);
        char want[32];
        snprintf(want, sizeof want, "f%d (m.py)", K - 1 - k);
        assert_string_equal(json_string_value(json_object_get(row, "site")), want);
        assert_int_equal(json_integer_value(json_object_get(row, "bytes")),
                         512 * (3 * K + (K - 1 - k) + 1));
        assert_int_equal(json_integer_value(json_object_get(row, "stacks")), 2);
    }
    json_decref(res);
    mt__report_destroy(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_growth_detected),
        cmocka_unit_test(test_no_growth),
        cmocka_unit_test(test_labelled_tag),
        cmocka_unit_test(test_few_iterations),
        cmocka_unit_test(test_timeline_fragmentation),
        cmocka_unit_test(test_callsites_reranked),
        cmocka_unit_test(test_processes_and_malformed),
        cmocka_unit_test(test_two_logs_counted_once),
        cmocka_unit_test(test_host_apart),
        cmocka_unit_test(test_host_empty),
        cmocka_unit_test(test_report_matches_schema),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
