/* Many processes in one report, as `memtrace report` and `diff` read a job of many ranks:
 * the model's figures kept per device named (ordinals 0 and 200, pinned host memory,
 * managed and outside memory), the high and low tags, each process's figures and the job's
 * read from a log of 300 ranks streamed as report reads it; the table of seen records as it
 * grows; and the result that frees each process's analysis as it goes, and keeps only what
 * the diff reads, giving the same figures. The checker runs after every event of the model
 * cases. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "analysis/diff.h"
#include "analysis/model.h"
#include "analysis/report.h"
#include "tests/common/test_main.h"

#define KIB   (UINT64_C(1) << 10)
#define MIB   (UINT64_C(1) << 20)
#define RANKS 300
#define HIGH  31 /* the highest user tag: the tag arrays' last entry */

static void check(const mt_model_t *m)
{
    char why[256] = "";
    if (mt__model_check(m, why, sizeof why) != 0)
        fail_msg("mt__model_check: %s", why);
}

static uint64_t seq_no;

static void apply(mt_model_t *m, int kind, unsigned dev, int pool, int tag, uint64_t addr,
                  uint64_t size, uint64_t requested, uint64_t allocated, uint64_t reserved)
{
    mt_event_rec_t ev = {.seq = seq_no++,
                         .time_ns = seq_no * 1000,
                         .kind = (uint8_t)kind,
                         .device = (uint8_t)dev,
                         .pool = (uint8_t)pool,
                         .tag = (uint8_t)tag,
                         .addr = addr,
                         .size = size,
                         .requested = requested,
                         .allocated = allocated,
                         .reserved = reserved};
    assert_int_equal(mt__model_apply(m, &ev), 0);
    check(m);
}

/* ---- the model: state per device named ---- */

static void test_model_devices_named(void **state)
{
    (void)state;
    mt_model_t *m = NULL;
    assert_int_equal(mt__model_create(&m, NULL), 0);
    seq_no = 0;
    mt_model_dev_t d[4];
    assert_int_equal(mt__model_devices(m, d, 4), 0);
    /* Devices named out of order: 200, then 0, then 7 (pinned host memory only). */
    apply(m, MT_EV_SEGMENT_ALLOC, 200, MT_POOL_LARGE, 0, 0x200000000, 8 * MIB, 8 * MIB, 0, 8 * MIB);
    apply(m, MT_EV_ALLOC, 200, MT_POOL_LARGE, HIGH, 0x200000000, 3 * MIB, 3 * MIB, 3 * MIB,
          8 * MIB);
    apply(m, MT_EV_SEGMENT_ALLOC, 0, MT_POOL_SMALL, 0, 0x100000000, 2 * MIB, 2 * MIB, 0, 2 * MIB);
    apply(m, MT_EV_ALLOC, 0, MT_POOL_SMALL, MT_TAG_WEIGHTS, 0x100000000, 512 * KIB, 500 * KIB,
          512 * KIB, 2 * MIB);
    apply(m, MT_EV_SEGMENT_ALLOC, 7, MT_POOL_HOST, 0, 0x300000000, 2 * MIB, 2 * MIB, 0, 2 * MIB);
    apply(m, MT_EV_ALLOC, 7, MT_POOL_HOST, MT_TAG_OTHER, 0x300000000, 4 * KIB, 4 * KIB, 4 * KIB,
          2 * MIB);
    apply(m, MT_EV_FREE_COMPLETED, 200, MT_POOL_LARGE, HIGH, 0x200000000, 3 * MIB, 0, 0, 8 * MIB);

    /* By ordinal, only those with device memory; each its own peak. */
    assert_int_equal(mt__model_devices(m, d, 4), 2);
    assert_int_equal(d[0].device, 0);
    assert_int_equal(d[0].allocated, 512 * KIB);
    assert_int_equal(d[0].reserved, 2 * MIB);
    assert_int_equal(d[1].device, 200);
    assert_int_equal(d[1].allocated, 0);
    assert_int_equal(d[1].peak_allocated, 3 * MIB);
    assert_int_equal(d[1].peak_reserved, 8 * MIB);
    uint64_t a = 1, r = 1;
    assert_int_equal(mt__model_source(m, 256 + 7, &a, &r), 0);
    assert_int_equal(a, 4 * KIB);
    assert_int_equal(r, 2 * MIB);
    assert_int_equal(mt__model_source(m, 7, &a, &r), 0); /* named, no device memory */
    assert_int_equal(a, 0);
    assert_int_equal(mt__model_source(m, 255, &a, &r), 0); /* never named */
    assert_int_equal(a + r, 0);
    assert_int_equal(mt__model_source(m, MT_EVENT_SOURCES, &a, &r), MT_EINVAL);
    mt__model_device(m, 200, false, &a, &r);
    assert_int_equal(r, 8 * MIB);

    mt_model_figures_t f;
    assert_int_equal(mt__model_figures(m, MT_MODEL_DEVICE, &f), 0);
    assert_int_equal(f.allocated, 512 * KIB);
    assert_int_equal(f.reserved, 10 * MIB);
    assert_int_equal(f.peak_allocated, 3 * MIB + 512 * KIB);
    assert_int_equal(mt__model_figures(m, MT_MODEL_HOST, &f), 0);
    assert_int_equal(f.allocated, 4 * KIB);
    mt_model_tag_t t;
    mt__model_tag(m, MT_MODEL_DEVICE, HIGH, &t);
    assert_int_equal(t.bytes, 0);
    assert_int_equal(t.peak, 3 * MIB);
    mt__model_tag(m, MT_MODEL_DEVICE, MT_TAG_WEIGHTS, &t);
    assert_int_equal(t.bytes, 512 * KIB);

    /* Managed memory on 200 and 0, outside memory on 200: summed over the devices. */
    apply(m, MT_EV_MANAGED, 200, MT_POOL_LARGE, MT_MANAGED_RESIDENCY, 5, MIB, 2 * MIB, 0, 8 * MIB);
    apply(m, MT_EV_MANAGED, 0, MT_POOL_SMALL, MT_MANAGED_RESIDENCY, 1, 3 * MIB, MIB, 512 * KIB,
          2 * MIB);
    apply(m, MT_EV_MANAGED, 200, MT_POOL_LARGE, MT_MANAGED_RESIDENCY, 7, 2 * MIB, 4 * MIB, 0,
          8 * MIB);
    mt_model_managed_t g;
    mt__model_managed(m, &g);
    assert_int_equal(g.events, 3);
    assert_int_equal(g.faults, 8);
    assert_int_equal(g.device_now, 5 * MIB);
    assert_int_equal(g.migrated, 5 * MIB);
    assert_int_equal(g.managed_peak, 10 * MIB);
    apply(m, MT_EV_DEVICE, 200, MT_POOL_NONE, 0, 20 * MIB, 100 * MIB, 1024 * MIB, 0, 8 * MIB);
    apply(m, MT_EV_OUTSIDE_ALLOC, 200, MT_POOL_NONE, 3, 0x900000000, MIB, MIB, 0, 8 * MIB);
    mt_model_outside_t o[2];
    assert_int_equal(mt__model_outside(m, o, 2), 1);
    assert_int_equal(o[0].device, 200);
    assert_int_equal(o[0].used, 100 * MIB);
    assert_int_equal(o[0].reserved, 8 * MIB);
    assert_int_equal(o[0].libraries, MIB);
    mt_model_library_t lib[2];
    assert_int_equal(mt__model_outside_libraries(m, 200, lib, 2), 1);
    assert_int_equal(lib[0].id, 3);
    assert_int_equal(mt__model_outside_libraries(m, 0, lib, 2), 0);
    mt__model_destroy(&m);
}

/* ---- a log of many ranks, read as report reads it ---- */

typedef struct log_s {
    char *buf;
    size_t len;
    FILE *f;
} log_t;

/* Rank r's device 0 weights (low tag) and its peak, when devices 0 and 200 (high tag, ranks
 * r % 3 = 0) both count. */
static uint64_t weights_of(int r)
{
    return (1 + (uint64_t)(r % 4)) * MIB;
}

static uint64_t kv_of(int r)
{
    return r % 3 == 0 ? 2 * MIB + (uint64_t)r * 4 * KIB : 0;
}

static uint64_t peak_of(int r)
{
    return weights_of(r) + (r % 3 == 0 ? kv_of(r) + MIB : 0);
}

typedef struct proc_log_s {
    FILE *f;
    int pid;
    uint64_t seq, alloc[2][2], res[2][2]; /* [device 0 / 200][host] */
} proc_log_t;

/* An event line as the recorder writes it; da, dr: the change of its source's totals. */
static void ev_line(proc_log_t *p, const char *kind, int dev, const char *pool, int tag,
                    uint64_t addr, uint64_t size, int64_t da, int64_t dr)
{
    int d = dev != 0, h = strcmp(pool, "host") == 0;
    p->alloc[d][h] += (uint64_t)da;
    p->res[d][h] += (uint64_t)dr;
    char tagf[64]; /* an outside event's tag is a library id */
    if (strncmp(kind, "outside_", 8) == 0)
        snprintf(tagf, sizeof tagf, "\"library_id\":%d", tag);
    else
        snprintf(tagf, sizeof tagf, "\"tag\":\"%s\",\"tag_id\":%d",
                 tag == HIGH             ? "kv_hi"
                 : tag == MT_TAG_WEIGHTS ? "weights"
                 : tag == MT_TAG_GRADS   ? "grads"
                                         : "other",
                 tag);
    fprintf(p->f,
            "{\"v\":1,\"type\":\"event\",\"seq\":%llu,\"t_ns\":%llu,\"pid\":%d,\"dev\":%d,"
            "\"kind\":\"%s\",\"addr\":\"0x%llx\",\"size\":%llu,\"requested\":%llu,\"pool\":\"%s\","
            "%s,\"stream\":0,\"allocated\":%llu,\"reserved\":%llu}\n",
            (unsigned long long)p->seq, (unsigned long long)(1000 + p->seq * 1000), p->pid, dev,
            kind, (unsigned long long)addr, (unsigned long long)size, (unsigned long long)size,
            pool, tagf, (unsigned long long)p->alloc[d][h], (unsigned long long)p->res[d][h]);
    p->seq++;
}

static void rank_log(FILE *f, int r)
{
    proc_log_t p = {.f = f, .pid = 5000 + r};
    fprintf(f,
            "{\"v\":1,\"type\":\"hello\",\"pid\":%d,\"name\":\"train\",\"start_realtime_ns\":1,"
            "\"rank\":%d,\"local_rank\":%d,\"world_size\":%d,\"job\":\"big\"}\n",
            p.pid, r, r % 8, RANKS);
    ev_line(&p, "segment_alloc", 0, "large", 0, 0x100000000, 8 * MIB, 0, (int64_t)(8 * MIB));
    ev_line(&p, "alloc", 0, "large", MT_TAG_WEIGHTS, 0x100000000, weights_of(r),
            (int64_t)weights_of(r), 0);
    if (r % 3 == 0) {
        fprintf(f,
                "{\"v\":1,\"type\":\"event\",\"seq\":%llu,\"t_ns\":1,\"pid\":%d,\"dev\":200,"
                "\"kind\":\"tag_label\",\"tag_id\":%d,\"label\":\"kv_hi\"}\n",
                (unsigned long long)p.seq++, p.pid, HIGH);
        fprintf(f,
                "{\"v\":1,\"type\":\"event\",\"seq\":%llu,\"t_ns\":1,\"pid\":%d,\"dev\":200,"
                "\"kind\":\"library_label\",\"library_id\":3,\"label\":\"nccl\"}\n",
                (unsigned long long)p.seq++, p.pid);
        ev_line(&p, "segment_alloc", 200, "large", 0, 0x200000000, 16 * MIB, 0,
                (int64_t)(16 * MIB));
        ev_line(&p, "alloc", 200, "large", HIGH, 0x200000000, kv_of(r), (int64_t)kv_of(r), 0);
        ev_line(&p, "alloc", 200, "large", MT_TAG_GRADS, 0x200000000 + 8 * MIB, MIB, (int64_t)MIB,
                0);
        ev_line(&p, "free_completed", 200, "large", MT_TAG_GRADS, 0x200000000 + 8 * MIB, MIB,
                -(int64_t)MIB, 0);
        ev_line(&p, "outside_alloc", 200, "none", 3, 0x900000000, MIB, 0, 0);
        /* used, total; addr: this process's bytes */
        fprintf(f,
                "{\"v\":1,\"type\":\"event\",\"seq\":%llu,\"t_ns\":%llu,\"pid\":%d,\"dev\":200,"
                "\"kind\":\"device\",\"addr\":\"0x%llx\",\"size\":%llu,\"requested\":%llu,"
                "\"pool\":\"none\",\"tag\":\"other\",\"tag_id\":0,\"stream\":0,\"allocated\":%llu,"
                "\"reserved\":%llu}\n",
                (unsigned long long)p.seq, (unsigned long long)(1000 + p.seq * 1000), p.pid,
                (unsigned long long)(17 * MIB), (unsigned long long)(100 * MIB),
                (unsigned long long)(1024 * MIB), (unsigned long long)p.alloc[1][0],
                (unsigned long long)p.res[1][0]);
        p.seq++;
    }
    if (r % 6 == 0) {
        ev_line(&p, "segment_alloc", 200, "host", 0, 0x300000000, 2 * MIB, 0, (int64_t)(2 * MIB));
        ev_line(&p, "alloc", 200, "host", 0, 0x300000000, 4 * KIB, (int64_t)(4 * KIB), 0);
    }
    fprintf(f, "{\"v\":1,\"type\":\"exit\",\"pid\":%d,\"clean\":true}\n", p.pid);
}

static void make_log(log_t *l)
{
    l->f = open_memstream(&l->buf, &l->len);
    assert_non_null(l->f);
    for (int r = 0; r < RANKS; r++)
        rank_log(l->f, r);
    assert_int_equal(fclose(l->f), 0);
}

static mt__report_t *read_log(const log_t *l, bool stream)
{
    mt__report_cfg_t cfg = mt__report_cfg_default();
    cfg.stream = stream;
    cfg.by_callsite = true;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, &cfg), 0);
    char err[256];
    for (const char *s = l->buf, *e; s < l->buf + l->len; s = e + 1) {
        e = memchr(s, '\n', (size_t)(l->buf + l->len - s));
        assert_non_null(e);
        if (mt__report_add_line(r, s, (size_t)(e - s + 1), err, sizeof err) != 0)
            fail_msg("line %.*s: %s", (int)(e - s), s, err);
    }
    return r;
}

static int64_t num(const json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    if (!json_is_integer(v))
        fail_msg("no integer %s", k);
    return json_integer_value(v);
}

static void check_rank(const json_t *p, int r)
{
    assert_int_equal(num(p, "rank"), r);
    assert_int_equal(num(p, "pid"), 5000 + r);
    assert_int_equal(num(p, "peak_allocated"), peak_of(r));
    assert_int_equal(num(p, "final_allocated"), weights_of(r) + kv_of(r));
    json_t *tags = json_object_get(p, "peak_by_tag");
    assert_int_equal(num(tags, "weights"), weights_of(r));
    json_t *devs = json_object_get(p, "devices");
    assert_int_equal(json_array_size(devs), r % 3 == 0 ? 2 : 1);
    json_t *d0 = json_array_get(devs, 0);
    assert_int_equal(num(d0, "device"), 0);
    assert_int_equal(num(d0, "peak_allocated"), weights_of(r));
    assert_int_equal(num(d0, "final_reserved"), 8 * MIB);
    json_t *host = json_object_get(p, "host");
    assert_int_equal(num(host, "peak_allocated"), r % 6 == 0 ? 4 * KIB : 0);
    assert_int_equal(num(host, "final_reserved"), r % 6 == 0 ? 2 * MIB : 0);
    if (r % 3 != 0) {
        assert_int_equal(json_object_size(tags), 1);
        assert_null(json_object_get(p, "device_memory"));
        return;
    }
    assert_int_equal(num(tags, "kv_hi"), kv_of(r));
    assert_int_equal(num(tags, "grads"), MIB);
    json_t *d200 = json_array_get(devs, 1);
    assert_int_equal(num(d200, "device"), 200);
    assert_int_equal(num(d200, "peak_allocated"), kv_of(r) + MIB);
    assert_int_equal(num(d200, "final_allocated"), kv_of(r));
    assert_int_equal(num(d200, "final_reserved"), 16 * MIB);
    json_t *dm = json_object_get(p, "device_memory");
    assert_int_equal(json_array_size(dm), 1);
    json_t *o = json_array_get(dm, 0);
    assert_int_equal(num(o, "device"), 200);
    assert_int_equal(num(json_object_get(o, "end"), "used"), 100 * MIB);
    assert_int_equal(num(json_object_get(o, "end"), "reserved"), 16 * MIB);
    assert_int_equal(num(json_object_get(o, "end"), "libraries"), MIB);
    json_t *lib = json_array_get(json_object_get(o, "libraries"), 0);
    assert_string_equal(json_string_value(json_object_get(lib, "library")), "nccl");
    assert_int_equal(num(lib, "bytes"), MIB);
}

/* A streamed result's process: the same object as the whole result's k-th. */
typedef struct each_s {
    const json_t *procs;
    size_t k;
} each_t;

static int each_same(void *ctx, json_t *p)
{
    each_t *e = ctx;
    assert_true(json_equal(p, json_array_get(e->procs, e->k++)));
    json_object_del(p, "peak_by_tag"); /* the printers may change it: the jobs' view stands */
    return 0;
}

static void test_job_of_many_ranks(void **state)
{
    (void)state;
    log_t l = {0};
    make_log(&l);
    mt__report_t *r = read_log(&l, true);
    assert_int_equal(mt__report_process_count(r), RANKS);
    json_t *res = mt__report_result(r);
    assert_non_null(res);
    json_t *procs = json_object_get(res, "processes");
    assert_int_equal(json_array_size(procs), RANKS);
    int top = 0;
    for (int k = 0; k < RANKS; k++) {
        check_rank(json_array_get(procs, (size_t)k), k);
        top = peak_of(k) > peak_of(top) ? k : top;
    }
    json_t *jobs = json_object_get(res, "jobs");
    assert_int_equal(json_array_size(jobs), 1);
    json_t *g = json_array_get(jobs, 0);
    assert_string_equal(json_string_value(json_object_get(g, "job")), "big");
    assert_int_equal(num(g, "world_size"), RANKS);
    assert_int_equal(json_array_size(json_object_get(g, "ranks")), RANKS);
    json_t *h = json_object_get(g, "highest");
    assert_int_equal(num(h, "rank"), top);
    assert_int_equal(num(h, "peak_allocated"), peak_of(top));

    /* Asked again, the same document; the final result too, each analysis freed after. */
    json_t *again = mt__report_result(r);
    assert_true(json_equal(res, again));
    json_decref(again);
    json_t *fin = mt__report_result_final(r, NULL);
    assert_true(json_equal(res, fin));
    json_decref(fin);
    assert_int_equal(mt__report_process_count(r), RANKS);
    mt__report_destroy(&r);

    /* Streamed: each process whole, then the document of the jobs' views and the same jobs
     * (the highest rank's tags among them, though the callback dropped them). */
    r = read_log(&l, true);
    json_t *head = mt__report_result_head(r);
    each_t e = {procs, 0};
    json_t *st = mt__report_result_stream(r, each_same, &e);
    mt__report_destroy(&r);
    assert_non_null(st);
    assert_int_equal(e.k, RANKS);
    assert_true(json_equal(json_object_get(st, "jobs"), jobs));
    const char *hk;
    json_t *hv;
    json_object_foreach(head, hk, hv)
    {
        assert_true(json_equal(hv, json_object_get(res, hk)));
    }
    assert_int_equal(json_object_size(head) + 2, json_object_size(res)); /* processes, jobs */
    json_decref(head);
    json_decref(st);

    /* Kept for the diff: only the members it reads, the same values; the diff of the two
     * forms against the whole document finds nothing changed. */
    r = read_log(&l, true);
    json_t *kept = mt__report_result_final(r, mt__diff_process_members);
    mt__report_destroy(&r);
    assert_non_null(kept);
    assert_null(json_object_get(kept, "jobs"));
    json_t *kp = json_object_get(kept, "processes");
    assert_int_equal(json_array_size(kp), RANKS);
    size_t nmem = 0;
    while (mt__diff_process_members[nmem] != NULL)
        nmem++;
    for (size_t k = 0; k < RANKS; k++) {
        json_t *a = json_array_get(kp, k), *b = json_array_get(procs, k);
        assert_true(json_object_size(a) <= nmem);
        const char *key;
        json_t *v;
        json_object_foreach(a, key, v)
        {
            assert_true(json_equal(v, json_object_get(b, key)));
        }
        for (size_t i = 0; i < nmem; i++)
            assert_true((json_object_get(a, mt__diff_process_members[i]) != NULL) ==
                        (json_object_get(b, mt__diff_process_members[i]) != NULL));
    }
    mt_diff_cfg_t dc = mt__diff_cfg_default();
    json_t *d1 = NULL, *d2 = NULL;
    assert_int_equal(mt__diff_reports(res, res, &dc, &d1, NULL), 0);
    assert_int_equal(mt__diff_reports(kept, kept, &dc, &d2, NULL), 0);
    assert_true(json_equal(d1, d2));
    assert_int_equal(num(json_object_get(d2, "peak_allocated"), "delta"), 0);
    json_decref(d1);
    json_decref(d2);
    json_decref(kept);
    json_decref(res);
    free(l.buf);
}

/* ---- the table of seen records, from a few entries up ---- */

static uint64_t duplicates(mt__report_t *r)
{
    json_t *res = mt__report_result(r);
    assert_non_null(res);
    uint64_t d = (uint64_t)num(res, "duplicates");
    json_decref(res);
    return d;
}

/* seq s of process 7: the same record for the same s. */
static void seen_add(mt__report_t *r, uint64_t s)
{
    mt_event_rec_t ev = {.seq = s,
                         .time_ns = 1000 + s,
                         .kind = MT_EV_MARK,
                         .addr = MT_MARK_FORWARD_BEGIN,
                         .size = s};
    assert_int_equal(mt__report_add_event(r, 7, &ev, NULL), 0);
}

static void test_seen_grows(void **state)
{
    (void)state;
    mt__report_cfg_t cfg = mt__report_cfg_default();
    cfg.stream = true;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, &cfg), 0);
    /* From seq 1000: 300 records (the table doubles from 64 to 512), then all read again. */
    for (uint64_t s = 1000; s < 1300; s++)
        seen_add(r, s);
    for (uint64_t s = 1000; s < 1300; s++)
        seen_add(r, s);
    assert_int_equal(duplicates(r), 300);
    /* A jump of a million seqs: the table at its bound, the newest 65536 seqs told. */
    seen_add(r, 1001300);
    seen_add(r, 1001300);
    seen_add(r, 1300); /* older than the bound: kept, out of order */
    assert_int_equal(duplicates(r), 301);
    /* Out of order, nothing is told apart any more (as before: it is never read). */
    seen_add(r, 1001301);
    seen_add(r, 1001301);
    assert_int_equal(duplicates(r), 301);
    mt__report_destroy(&r);

    /* Beyond the bound from the start: the newest SEEN_MAX seqs of a long run. */
    assert_int_equal(mt__report_create(&r, &cfg), 0);
    for (uint64_t s = 0; s < 70000; s++)
        seen_add(r, s);
    seen_add(r, 69999);
    seen_add(r, 70000 - 65536);
    assert_int_equal(duplicates(r), 2);
    mt__report_destroy(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_devices_named),
        cmocka_unit_test(test_job_of_many_ranks),
        cmocka_unit_test(test_seen_grows),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
