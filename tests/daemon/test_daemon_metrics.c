/* /metrics passes `promtool check metrics` (exit 77, skipped, without promtool), and its
 * figures match what the producer recorded; pinned host memory has series of its own and is
 * not counted in the device ones. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "tests/daemon/harness.h"
#include "tests/common/test_main.h"

/* promtool accepts body as Prometheus text exposition. */
static void promtool_ok(const char *body)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/mt-dtest-metrics-%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(body, f);
    fclose(f);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s", path);
    int st = system(cmd);
    unlink(path);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_metrics_pass_promtool(void **state)
{
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    /* 301 events: the last alloc stays live, tag (150 % 7) = 3 (optimizer). */
    pid_t pid = th_producer(t.sock, 301, 1024, 0, -1);
    assert_int_equal(th_wait(pid), 0);
    json_t *p = th_wait_exited(t.sock, pid, 5000);
    assert_non_null(p);
    json_decref(p);
    int consumer = th_consumer(t.sock, ""); /* so the consumer gauge has something */

    char *r = NULL;
    assert_int_equal(th_http_get(t.port, "/metrics", &r), 200);
    assert_non_null(strstr(r, "Content-Type: text/plain; version=0.0.4"));
    const char *body = th_http_body(r);
    assert_true(strlen(body) > 0 && body[strlen(body) - 1] == '\n');
    char line[160];
    snprintf(line, sizeof line, "memtrace_events_total{pid=\"%d\"} 301\n", (int)pid);
    assert_non_null(strstr(body, line));
    snprintf(line, sizeof line, "memtrace_allocated_bytes{pid=\"%d\"} 4096\n", (int)pid);
    assert_non_null(strstr(body, line));
    snprintf(line, sizeof line, "memtrace_tag_allocated_bytes{pid=\"%d\",tag=\"optimizer\"} 4096\n",
             (int)pid);
    assert_non_null(strstr(body, line));
    snprintf(line, sizeof line, "memtrace_tag_peak_bytes{pid=\"%d\",tag=\"weights\"} 4096\n",
             (int)pid);
    assert_non_null(strstr(body, line));
    assert_non_null(strstr(body, "memtrace_consumers 1\n"));
    assert_non_null(strstr(body, "memtrace_processes{state=\"exited\"} 1\n"));

    promtool_ok(body);
    free(r);
    close(consumer);
    th_daemon_stop(&t);
}

static void record(mt_prof_t *p, int kind, int pool, uint64_t addr, uint64_t size,
                   uint64_t allocated, uint64_t reserved)
{
    mt_event_rec_t ev = {.kind = (uint8_t)kind,
                         .pool = (uint8_t)pool,
                         .addr = addr,
                         .size = size,
                         .requested = size,
                         .tag = MT_TAG_ACTIVATIONS,
                         .allocated = allocated,
                         .reserved = reserved};
    if (mt_prof_record(p, &ev) != 0)
        _exit(11);
}

/* A forked producer with a device allocator and a pinned host cache: device 2 MiB segment
 * with a 1 MiB block; host 4 MiB segment with a 3 MiB block, then 2 MiB of it freed. */
static void host_producer_body(const char *sock)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.name = "th-host";
    mt_prof_t *p = NULL;
    if (mt_prof_create(&p, &cfg) != 0)
        _exit(10);
    const uint64_t M = 1u << 20;
    record(p, MT_EV_SEGMENT_ALLOC, MT_POOL_LARGE, 0x10000000, 2 * M, 0, 2 * M);
    record(p, MT_EV_ALLOC, MT_POOL_LARGE, 0x10000000, M, M, 2 * M);
    record(p, MT_EV_SEGMENT_ALLOC, MT_POOL_HOST, 0x70000000, 4 * M, 0, 4 * M);
    record(p, MT_EV_ALLOC, MT_POOL_HOST, 0x70000000, 2 * M, 2 * M, 4 * M);
    record(p, MT_EV_ALLOC, MT_POOL_HOST, 0x70200000, M, 3 * M, 4 * M);
    record(p, MT_EV_FREE_COMPLETED, MT_POOL_HOST, 0x70000000, 2 * M, M, 4 * M);
    mt_prof_destroy(&p);
    _exit(0);
}

static void test_host_series(void **state)
{
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    const char *const args[5] = {t.sock};
    pid_t pid = th_spawn("host", args);
    assert_int_equal(th_wait(pid), 0);
    json_t *p = th_wait_exited(t.sock, pid, 5000);
    assert_non_null(p);
    json_decref(p);

    char *r = NULL;
    assert_int_equal(th_http_get(t.port, "/metrics", &r), 200);
    const char *body = th_http_body(r);
    static const char *const want[] = {
        "memtrace_allocated_bytes{pid=\"%d\"} 1048576\n",
        "memtrace_reserved_bytes{pid=\"%d\"} 2097152\n",
        "memtrace_peak_allocated_bytes{pid=\"%d\"} 1048576\n",
        "memtrace_tag_peak_bytes{pid=\"%d\",tag=\"activations\"} 1048576\n",
        "memtrace_host_allocated_bytes{pid=\"%d\"} 1048576\n",
        "memtrace_host_reserved_bytes{pid=\"%d\"} 4194304\n",
        "memtrace_host_peak_allocated_bytes{pid=\"%d\"} 3145728\n",
        "memtrace_host_peak_reserved_bytes{pid=\"%d\"} 4194304\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char line[160];
        snprintf(line, sizeof line, want[i], (int)pid);
        if (!strstr(body, line))
            fail_msg("missing from /metrics: %s", line);
    }
    assert_non_null(strstr(body, "# TYPE memtrace_host_allocated_bytes gauge\n"));
    assert_non_null(strstr(body, "# HELP memtrace_host_reserved_bytes "));

    promtool_ok(body);
    free(r);
    th_daemon_stop(&t);
}

/* ---- ranks and jobs ---- */

/* A forked producer that is rank 5 (local rank 1) of 8 in job "train-7": 1 MiB live. The
 * job id comes in as the program wrote it and is sanitized by the profiler. */
static void ranked_producer_body(const char *sock)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.name = "th-ranked";
    cfg.job.rank = 5;
    cfg.job.local_rank = 1;
    cfg.job.world_size = 8;
    snprintf(cfg.job.id, sizeof cfg.job.id, "train\"7");
    mt_prof_t *p = NULL;
    if (mt_prof_create(&p, &cfg) != 0)
        _exit(10);
    const uint64_t M = 1u << 20;
    record(p, MT_EV_SEGMENT_ALLOC, MT_POOL_LARGE, 0x10000000, 2 * M, 0, 2 * M);
    record(p, MT_EV_ALLOC, MT_POOL_LARGE, 0x10000000, M, M, 2 * M);
    mt_prof_destroy(&p);
    _exit(0);
}

/* Every per-process series of a ranked process carries rank and job labels; /state has the
 * four fields; an unranked process's series stay as they were (pid only). */
static void test_rank_job_labels(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    const char *const args[5] = {t.sock};
    pid_t pid = th_spawn("ranked", args);
    assert_int_equal(th_wait(pid), 0);
    json_t *p = th_wait_exited(t.sock, pid, 5000);
    assert_non_null(p);
    assert_int_equal(json_integer_value(json_object_get(p, "rank")), 5);
    assert_int_equal(json_integer_value(json_object_get(p, "local_rank")), 1);
    assert_int_equal(json_integer_value(json_object_get(p, "world_size")), 8);
    assert_string_equal(json_string_value(json_object_get(p, "job")), "train_7");
    json_decref(p);
    pid_t plain = th_producer(t.sock, 10, 1024, 0, -1);
    assert_int_equal(th_wait(plain), 0);
    p = th_wait_exited(t.sock, plain, 5000);
    assert_non_null(p);
    assert_null(json_object_get(p, "rank"));
    assert_null(json_object_get(p, "job"));
    json_decref(p);

    char *r = NULL;
    assert_int_equal(th_http_get(t.port, "/metrics", &r), 200);
    const char *body = th_http_body(r);
    static const char *const want[] = {
        "memtrace_allocated_bytes{pid=\"%d\",rank=\"5\",job_id=\"train_7\"} 1048576\n",
        "memtrace_peak_reserved_bytes{pid=\"%d\",rank=\"5\",job_id=\"train_7\"} 2097152\n",
        "memtrace_utilization_ratio{pid=\"%d\",rank=\"5\",job_id=\"train_7\"} 0.5\n",
        "memtrace_tag_peak_bytes{pid=\"%d\",rank=\"5\",job_id=\"train_7\",tag=\"activations\"} "
        "1048576\n",
        "memtrace_events_total{pid=\"%d\",rank=\"5\",job_id=\"train_7\"} 2\n",
        "memtrace_process_info{pid=\"%d\",rank=\"5\",job_id=\"train_7\",name=\"th-ranked\",",
        "memtrace_device_allocated_bytes{pid=\"%d\",rank=\"5\",job_id=\"train_7\",device=\"0\"} "
        "1048576\n",
        "memtrace_pool_allocated_bytes{pid=\"%d\",rank=\"5\",job_id=\"train_7\",pool=\"large\"} "
        "1048576\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char line[200];
        snprintf(line, sizeof line, want[i], (int)pid);
        if (!strstr(body, line))
            fail_msg("missing from /metrics: %s", line);
    }
    char line[160];
    snprintf(line, sizeof line, "memtrace_events_total{pid=\"%d\"} 10\n", (int)plain);
    assert_non_null(strstr(body, line));
    promtool_ok(body);
    free(r);
    th_daemon_stop(&t);
}

/* ---- several devices ---- */

/* A forked producer with real allocators on 2 sim devices: 3 MiB live on device 0, 5 MiB
 * on device 1 (each in its own segment). */
static void devices_producer_body(const char *sock)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.name = "th-devices";
    mt_prof_t *p = NULL;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_devices = 2;
    bc.sim_capacity = (size_t)256 << 20;
    mt_backend_t *b = NULL, *b1 = NULL;
    if (mt_prof_create(&p, &cfg) != 0 || mt_backend_create(&b, &bc) != 0 ||
        mt_backend_get_device(b, 1, &b1) != 0)
        _exit(10);
    mt_alloc_t *a[2] = {NULL, NULL};
    void *x;
    for (int d = 0; d < 2; d++) {
        mt_alloc_cfg_t ac = mt_alloc_cfg_default();
        ac.backend = d ? b1 : b;
        ac.sink = mt_prof_sink(p);
        if (mt_alloc_create(&a[d], &ac) != 0 ||
            mt_alloc_malloc(a[d], (d ? 5u : 3u) << 20, NULL, MT_TAG_WEIGHTS, &x) != 0)
            _exit(11);
    }
    mt_prof_destroy(&p); /* the allocators (and their blocks) outlive the recording */
    _exit(0);
}

/* /state and /metrics break device memory down by device; the process's figures are the
 * sums; promtool accepts the device label. */
static void test_devices_series(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    const char *const args[5] = {t.sock};
    pid_t pid = th_spawn("devices", args);
    assert_int_equal(th_wait(pid), 0);
    json_t *p = th_wait_exited(t.sock, pid, 5000);
    assert_non_null(p);
    const uint64_t M = 1u << 20;
    assert_int_equal(json_integer_value(json_object_get(p, "allocated_bytes")), 8 * M);
    json_t *dv = json_object_get(p, "devices");
    assert_int_equal(json_array_size(dv), 2);
    uint64_t sum_r = 0;
    for (size_t i = 0; i < 2; i++) {
        json_t *d = json_array_get(dv, i);
        assert_int_equal(json_integer_value(json_object_get(d, "device")), i);
        assert_int_equal(json_integer_value(json_object_get(d, "allocated_bytes")),
                         (i ? 5 : 3) * M);
        assert_int_equal(json_integer_value(json_object_get(d, "peak_allocated_bytes")),
                         (i ? 5 : 3) * M);
        sum_r += (uint64_t)json_integer_value(json_object_get(d, "reserved_bytes"));
    }
    assert_int_equal(json_integer_value(json_object_get(p, "reserved_bytes")), sum_r);
    json_decref(p);

    char *r = NULL;
    assert_int_equal(th_http_get(t.port, "/metrics", &r), 200);
    const char *body = th_http_body(r);
    char line[160];
    for (int d = 0; d < 2; d++) {
        snprintf(line, sizeof line,
                 "memtrace_device_allocated_bytes{pid=\"%d\",device=\"%d\"} %llu\n", (int)pid, d,
                 (unsigned long long)((d ? 5 : 3) * M));
        if (!strstr(body, line))
            fail_msg("missing from /metrics: %s", line);
        snprintf(line, sizeof line,
                 "memtrace_device_peak_allocated_bytes{pid=\"%d\",device=\"%d\"} %llu\n", (int)pid,
                 d, (unsigned long long)((d ? 5 : 3) * M));
        if (!strstr(body, line))
            fail_msg("missing from /metrics: %s", line);
    }
    snprintf(line, sizeof line, "memtrace_allocated_bytes{pid=\"%d\"} %llu\n", (int)pid,
             (unsigned long long)(8 * M));
    assert_non_null(strstr(body, line));
    promtool_ok(body);
    free(r);
    th_daemon_stop(&t);
}

/* ---- user tag labels ---- */

/* A forked producer with a real allocator (sim backend) that registers two user tags,
 * "logits" and one that needs escaping, and keeps blocks of each live: 3 x 4 KiB logits,
 * 2 x 4 KiB of the other, 1 x 4 KiB weights. */
#define ODD_LABEL "lo\"g\\its"
static void labelled_producer_body(const char *sock)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.name = "th-labels";
    /* No call stacks: sampled ones come at random (an exponential interval, seeded per
     * process), and a sampled logits allocation brings its module and stack table lines
     * and a stack_ref into the filtered tail below, which counts its lines exactly. */
    cfg.stacks = MT_STACKS_OFF;
    mt_prof_t *p = NULL;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    mt_backend_t *b = NULL;
    if (mt_prof_create(&p, &cfg) != 0 || mt_backend_create(&b, &bc) != 0)
        _exit(10);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.sink = mt_prof_sink(p);
    mt_alloc_t *a = NULL;
    int logits, odd;
    if (mt_alloc_create(&a, &ac) != 0 || mt_alloc_tag_register(a, "logits", &logits) != 0 ||
        mt_alloc_tag_register(a, ODD_LABEL, &odd) != 0)
        _exit(11);
    void *x;
    for (int i = 0; i < 6; i++)
        if (mt_alloc_malloc(a, 4096, NULL, i < 3 ? logits : i < 5 ? odd : MT_TAG_WEIGHTS, &x))
            _exit(12);
    mt_prof_destroy(&p); /* the allocator (and its blocks) outlive the recording */
    _exit(0);
}

/* Reads whole lines from fd into buf until n lines came or timeout_ms passed. Returns the
 * number of lines. */
static int read_lines(int fd, char *buf, size_t cap, int n, int timeout_ms)
{
    size_t len = 0;
    int lines = 0;
    uint64_t end = th_now_ms() + (uint64_t)timeout_ms;
    while (lines < n && len < cap - 1 && th_now_ms() < end) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 50) <= 0)
            continue;
        ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
        if (r <= 0)
            break;
        for (ssize_t i = 0; i < r; i++)
            lines += buf[len + (size_t)i] == '\n';
        len += (size_t)r;
    }
    buf[len] = '\0';
    return lines;
}

/* The names reach the daemon's views through the stream: /metrics (escaped label
 * values, promtool passes), /state read after the process ended (a late consumer), and
 * tail lines; `tail --tag logits` sees only that tag's events and its announcement. */
static void test_labels_named(void **state)
{
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    int only_logits = th_consumer(t.sock, "\"tags\":[\"logits\"]");
    const char *const args[5] = {t.sock};
    pid_t pid = th_spawn("labels", args);
    assert_int_equal(th_wait(pid), 0);
    json_t *p = th_wait_exited(t.sock, pid, 5000);
    assert_non_null(p);
    json_t *labels = json_object_get(p, "tag_labels");
    assert_string_equal(json_string_value(json_object_get(labels, "7")), "logits");
    assert_string_equal(json_string_value(json_object_get(labels, "8")), ODD_LABEL);
    int seen = 0;
    size_t i;
    json_t *tg;
    json_array_foreach(json_object_get(p, "tags"), i, tg)
    {
        const char *name = json_string_value(json_object_get(tg, "name"));
        json_int_t bytes = json_integer_value(json_object_get(tg, "allocated_bytes"));
        if (strcmp(name, "logits") == 0 && bytes == 3 * 4096)
            seen |= 1;
        else if (strcmp(name, ODD_LABEL) == 0 && bytes == 2 * 4096)
            seen |= 2;
        else if (strncmp(name, "tag", 3) == 0)
            fail_msg("unnamed tag %s in /state", name);
    }
    assert_int_equal(seen, 3);
    json_decref(p);

    char *r = NULL;
    assert_int_equal(th_http_get(t.port, "/metrics", &r), 200);
    const char *body = th_http_body(r);
    char line[160];
    snprintf(line, sizeof line, "memtrace_tag_allocated_bytes{pid=\"%d\",tag=\"logits\"} 12288\n",
             (int)pid);
    assert_non_null(strstr(body, line));
    snprintf(line, sizeof line, "memtrace_tag_peak_bytes{pid=\"%d\",tag=\"lo\\\"g\\\\its\"} 8192\n",
             (int)pid);
    assert_non_null(strstr(body, line));
    assert_null(strstr(body, "tag=\"tag7\""));
    promtool_ok(body);
    free(r);

    /* The filtered tail: the announcement and the three logits allocations, named. */
    char buf[8192];
    assert_int_equal(read_lines(only_logits, buf, sizeof buf, 4, 5000), 4);
    assert_int_equal(read_lines(only_logits, buf + strlen(buf), sizeof buf - strlen(buf), 1, 300),
                     0);
    assert_non_null(strstr(buf, "\"kind\":\"tag_label\",\"tag_id\":7,\"label\":\"logits\""));
    int allocs = 0;
    for (const char *s = buf; (s = strstr(s, "\"kind\":\"alloc\"")) != NULL; s++) {
        allocs++;
        const char *eol = strchr(s, '\n');
        const char *tag = strstr(s, "\"tag\":\"logits\"");
        assert_true(tag != NULL && tag < eol);
    }
    assert_int_equal(allocs, 3);
    close(only_logits);
    th_daemon_stop(&t);
}

/* ---- device memory outside the allocator (docs/outside.md) ---- */

#define OUT_M ((uint64_t)1 << 20)

/* A forked producer, rank 2 of job "ddp-out", on a 1 GiB sim device with a 96 MiB context:
 * 40 MiB from its allocator; outside it 32 MiB reported by "libfakenccl.so", 8 MiB by no
 * library, 4 MiB by a library that calls itself "context", and 16 MiB nobody reports. */
static void outside_producer_body(const char *sock)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.name = "th-outside";
    cfg.job.rank = 2;
    snprintf(cfg.job.id, sizeof cfg.job.id, "ddp-out");
    mt_prof_t *p = NULL;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 1024 * OUT_M;
    bc.sim_context = 96 * OUT_M;
    mt_backend_t *b = NULL;
    if (mt_prof_create(&p, &cfg) != 0 || mt_backend_create(&b, &bc) != 0)
        _exit(10);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.sink = mt_prof_sink(p);
    ac.expandable_segments = false;
    mt_alloc_t *a = NULL;
    void *x, *nccl, *anon, *fake, *quiet;
    if (mt_alloc_create(&a, &ac) != 0 || mt_alloc_malloc(a, 40 * OUT_M, NULL, 0, &x) != 0)
        _exit(11);
    if (mt_backend_malloc(b, 32 * OUT_M, &nccl) != 0 || mt_backend_malloc(b, 8 * OUT_M, &anon) ||
        mt_backend_malloc(b, 4 * OUT_M, &fake) != 0 ||
        mt_alloc_note_outside(a, false, (uintptr_t)nccl, 32 * OUT_M, "libfakenccl.so") != 0 ||
        mt_alloc_note_outside(a, false, (uintptr_t)anon, 8 * OUT_M, NULL) != 0 ||
        mt_alloc_note_outside(a, false, (uintptr_t)fake, 4 * OUT_M, "context") != 0)
        _exit(12);
    if (mt_backend_malloc(b, 16 * OUT_M, &quiet) != 0)
        _exit(13);
    mt_alloc_emit(a, MT_EV_STATS, 0, 0, 0); /* a device figure that sees the quiet 16 MiB */
    mt_prof_destroy(&p);                    /* the memory outlives the recording */
    _exit(0);
}

/* A member of an /state object as an unsigned integer; fails the test when absent. */
static uint64_t member(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    if (!json_is_integer(v))
        fail_msg("/state: no integer \"%s\"", k);
    return (uint64_t)json_integer_value(v);
}

/* /metrics and /state show the model's split of the device's used bytes: used and total,
 * one series per library (the impersonator of a part renamed, id 0 "unnamed"), the context
 * and what nobody reported, with the process's usual labels; the parts and the reserved
 * bytes add up to used; promtool passes. */
static void test_outside_series(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    const char *const args[5] = {t.sock};
    pid_t pid = th_spawn("outside", args);
    assert_int_equal(th_wait(pid), 0);
    json_t *p = th_wait_exited(t.sock, pid, 5000);
    assert_non_null(p);
    json_t *od = json_array_get(json_object_get(p, "outside"), 0);
    if (!json_is_object(od))
        fail_msg("/state has no \"outside\" device");
    assert_int_equal(json_array_size(json_object_get(p, "outside")), 1);
    uint64_t res = member(json_array_get(json_object_get(p, "devices"), 0), "reserved_bytes");
    uint64_t used = 96 * OUT_M + res + (32 + 8 + 4 + 16) * OUT_M;
    assert_int_equal(member(od, "device"), 0);
    assert_int_equal(member(od, "used"), used);
    assert_int_equal(member(od, "total"), 1024 * OUT_M);
    assert_int_equal(member(od, "reserved"), res);
    assert_int_equal(member(od, "context"), 96 * OUT_M);
    assert_int_equal(member(od, "not_seen"), 16 * OUT_M);
    assert_int_equal(member(od, "libraries_total"), 44 * OUT_M);
    assert_int_equal(member(od, "reserved") + member(od, "libraries_total") +
                         member(od, "context") + member(od, "not_seen"),
                     member(od, "used"));
    json_t *libs = json_object_get(od, "libraries");
    assert_int_equal(json_array_size(libs), 3);
    json_t *l0 = json_array_get(libs, 0); /* largest first */
    assert_string_equal(json_string_value(json_object_get(l0, "name")), "libfakenccl.so");
    assert_int_equal(member(l0, "bytes"), 32 * OUT_M);
    assert_int_equal(member(l0, "peak"), 32 * OUT_M);
    assert_string_equal(json_string_value(json_object_get(json_array_get(libs, 1), "name")),
                        "unnamed");
    char fake[24];
    snprintf(fake, sizeof fake, "library%d",
             (int)json_integer_value(json_object_get(json_array_get(libs, 2), "id")));
    assert_string_equal(json_string_value(json_object_get(json_array_get(libs, 2), "name")), fake);
    json_decref(p);

    char *r = NULL;
    assert_int_equal(th_http_get(t.port, "/metrics", &r), 200);
    const char *body = th_http_body(r);
    char lbl[96];
    snprintf(lbl, sizeof lbl, "{pid=\"%d\",rank=\"2\",job_id=\"ddp-out\",device=\"0\"", (int)pid);
    struct {
        const char *fam, *library;
        uint64_t v;
    } want[] = {
        {"memtrace_device_used_bytes", NULL, used},
        {"memtrace_device_total_bytes", NULL, 1024 * OUT_M},
        {"memtrace_device_outside_allocator_bytes", "libfakenccl.so", 32 * OUT_M},
        {"memtrace_device_outside_allocator_bytes", "unnamed", 8 * OUT_M},
        {"memtrace_device_outside_allocator_bytes", fake, 4 * OUT_M},
        {"memtrace_device_outside_allocator_bytes", "context", 96 * OUT_M},
        {"memtrace_device_outside_allocator_bytes", "not_seen", 16 * OUT_M},
        {"memtrace_device_reserved_bytes", NULL, res},
    };
    uint64_t sum = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char line[256];
        if (want[i].library)
            snprintf(line, sizeof line, "%s%s,library=\"%s\"} %llu\n", want[i].fam, lbl,
                     want[i].library, (unsigned long long)want[i].v);
        else
            snprintf(line, sizeof line, "%s%s} %llu\n", want[i].fam, lbl,
                     (unsigned long long)want[i].v);
        if (!strstr(body, line))
            fail_msg("missing from /metrics: %s", line);
        if (i >= 2)
            sum += want[i].v;
    }
    assert_int_equal(sum, used); /* the parts and reserved make used */
    /* one context series: the library that calls itself so has a name of its own */
    const char *c1 = strstr(body, "library=\"context\"");
    assert_non_null(c1);
    assert_null(strstr(c1 + 1, "library=\"context\""));
    assert_non_null(strstr(body, "# HELP memtrace_device_outside_allocator_bytes "));
    assert_non_null(strstr(body, "# TYPE memtrace_device_used_bytes gauge\n"));
    promtool_ok(body);
    free(r);
    th_daemon_stop(&t);
}

/* A forked producer that writes the outside events itself, as a hostile or broken one may:
 * a library named with bytes that are not UTF-8 (id 3), one named as the default name of
 * id 3 ("library3", id 4), on a device figure of 100 MiB used of 1 GiB. */
static void forged_outside_body(const char *sock)
{
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_DAEMON;
    cfg.socket = sock;
    cfg.name = "th-forged";
    mt_prof_t *p = NULL;
    if (mt_prof_create(&p, &cfg) != 0)
        _exit(10);
    mt_event_rec_t ev = {
        .kind = MT_EV_DEVICE, .addr = UINT64_MAX, .size = 100 * OUT_M, .requested = 1024 * OUT_M};
    const char *names[2] = {"lib\xff\xfe", "library3"};
    int rc = mt_prof_record(p, &ev);
    for (int i = 0; i < 2; i++) {
        ev = (mt_event_rec_t){.kind = MT_EV_LIBRARY_LABEL, .tag = (uint8_t)(3 + i)};
        mt_event_label_pack(&ev, names[i]);
        rc |= mt_prof_record(p, &ev);
        ev = (mt_event_rec_t){.kind = MT_EV_OUTSIDE_ALLOC,
                              .tag = (uint8_t)(3 + i),
                              .addr = 0x1000000u * (uint64_t)(i + 1),
                              .size = (uint64_t)(i + 1) * OUT_M};
        rc |= mt_prof_record(p, &ev);
    }
    ev = (mt_event_rec_t){
        .kind = MT_EV_DEVICE, .addr = UINT64_MAX, .size = 103 * OUT_M, .requested = 1024 * OUT_M};
    rc |= mt_prof_record(p, &ev);
    if (rc != 0)
        _exit(11);
    mt_prof_destroy(&p);
    _exit(0);
}

/* Library names that are not clean text, or that could be taken for another library's
 * default name, become "library<id>": every series stays unique and promtool passes. */
static void test_outside_forged_names(void **state)
{
    (void)state;
    th_daemon_t t;
    th_daemon_start(&t, th_cfg());
    const char *const args[5] = {t.sock};
    pid_t pid = th_spawn("forged", args);
    assert_int_equal(th_wait(pid), 0);
    json_decref(th_wait_exited(t.sock, pid, 5000));
    char *r = NULL;
    assert_int_equal(th_http_get(t.port, "/metrics", &r), 200);
    const char *body = th_http_body(r);
    char line[256];
    static const struct {
        const char *library;
        unsigned mib;
    } want[] = {{"library4", 2}, {"library3", 1}, {"context", 100}, {"not_seen", 0}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        snprintf(line, sizeof line,
                 "memtrace_device_outside_allocator_bytes{pid=\"%d\",device=\"0\",library=\"%s\"} "
                 "%llu\n",
                 (int)pid, want[i].library, (unsigned long long)(want[i].mib * OUT_M));
        if (!strstr(body, line))
            fail_msg("missing from /metrics: %s", line);
    }
    const char *l3 = strstr(body, "library=\"library3\"");
    assert_null(strstr(l3 + 1, "library=\"library3\""));
    assert_null(strstr(body, "\xff"));
    promtool_ok(body);
    free(r);
    th_daemon_stop(&t);
}

int main(int argc, char **argv)
{
    th_producer_dispatch(argc, argv);
    char **args;
    const char *role = th_role(argc, argv, &args);
    if (role != NULL && strcmp(role, "host") == 0)
        host_producer_body(args[0]);
    if (role != NULL && strcmp(role, "labels") == 0)
        labelled_producer_body(args[0]);
    if (role != NULL && strcmp(role, "devices") == 0)
        devices_producer_body(args[0]);
    if (role != NULL && strcmp(role, "ranked") == 0)
        ranked_producer_body(args[0]);
    if (role != NULL && strcmp(role, "outside") == 0)
        outside_producer_body(args[0]);
    if (role != NULL && strcmp(role, "forged") == 0)
        forged_outside_body(args[0]);
    if (system("command -v promtool > /dev/null 2>&1") != 0) {
        fprintf(stderr, "promtool not found (Debian package prometheus): skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_pass_promtool), cmocka_unit_test(test_host_series),
        cmocka_unit_test(test_devices_series),        cmocka_unit_test(test_labels_named),
        cmocka_unit_test(test_rank_job_labels),       cmocka_unit_test(test_outside_series),
        cmocka_unit_test(test_outside_forged_names),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
