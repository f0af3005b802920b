/* `memtrace report` over the logs of several ranks of one job (docs/fleet.md "Ranks and
 * jobs"): each log is a real local log written by the profiler with its rank in the header;
 * the report keeps each rank apart even when their pids are the same (ranks on several hosts)
 * and names the rank that peaked highest. Also writes the logs for the CLI test
 * (prof_report_cli_ranks) when given a directory. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memtrace/prof.h"
#include "mt_config.h"
#include "analysis/report.h"
#include "tests/common/test_main.h"

#define M (UINT64_C(1) << 20)

static void record(mt_prof_t *p, int kind, uint64_t addr, uint64_t size, uint64_t allocated,
                   uint64_t reserved)
{
    mt_event_rec_t ev = {.kind = (uint8_t)kind,
                         .pool = MT_POOL_LARGE,
                         .addr = addr,
                         .size = size,
                         .requested = size,
                         .tag = MT_TAG_ACTIVATIONS,
                         .allocated = allocated,
                         .reserved = reserved};
    assert_int_equal(mt_prof_record(p, &ev), 0);
}

/* A log of rank `rank` of 4 in job "ddp-1" whose peak is mib MiB allocated (in a segment of
 * 2 * mib MiB), all freed at the end. */
static void write_rank_log(const char *path, int rank, uint64_t mib)
{
    unlink(path);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = path;
    cfg.socket = "/nonexistent/memtrace.sock";
    cfg.job.rank = rank;
    cfg.job.local_rank = rank % 2;
    cfg.job.world_size = 4;
    snprintf(cfg.job.id, sizeof cfg.job.id, "ddp-1");
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    record(p, MT_EV_SEGMENT_ALLOC, 0x10000000, 2 * mib * M, 0, 2 * mib * M);
    record(p, MT_EV_ALLOC, 0x10000000, mib * M, mib * M, 2 * mib * M);
    record(p, MT_EV_FREE_COMPLETED, 0x10000000, mib * M, 0, 2 * mib * M);
    mt_prof_destroy(&p);
}

static void write_logs(const char *dir, char paths[3][256])
{
    static const uint64_t mib[3] = {3, 7, 2}; /* rank 1 peaks highest */
    for (int r = 0; r < 3; r++) {
        snprintf(paths[r], 256, "%s/rank%d.ndjson", dir, r);
        write_rank_log(paths[r], r, mib[r]);
    }
}

static void feed_file(mt__report_t *r, const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[8192], err[256];
    while (fgets(line, sizeof line, f))
        assert_int_equal(mt__report_add_line(r, line, strlen(line), err, sizeof err), 0);
    fclose(f);
}

/* res validates against the telemetry schema (ajv, tests/prof/validate.mjs); not checked
 * without node or ajv (npm ci --prefix tests/prof). */
static void schema_ok(const json_t *res)
{
    if (system("command -v node > /dev/null 2>&1") != 0)
        return;
    char path[64];
    snprintf(path, sizeof path, "/tmp/mt-report-ranks-%d.ndjson", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(json_dumpf(res, f, JSON_COMPACT), 0);
    fputc('\n', f);
    fclose(f);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "node %s/tests/prof/validate.mjs %s/docs/telemetry.schema.json %s >&2", MT_SOURCE_ROOT,
             MT_SOURCE_ROOT, path);
    int st = system(cmd);
    unlink(path);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) != 77)
        assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_ranks_of_one_job(void **state)
{
    (void)state;
    char dir[64], paths[3][256];
    snprintf(dir, sizeof dir, "/tmp/mt_report_ranks_%d", (int)getpid());
    char cmd[128];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    assert_int_equal(system(cmd), 0);
    setenv("MEMTRACE_OOM_DIR", "off", 1);
    write_logs(dir, paths);

    mt__report_cfg_t cfg = mt__report_cfg_default();
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, &cfg), 0);
    /* Read in an order other than by rank, and one log twice: still three processes. */
    feed_file(r, paths[2]);
    feed_file(r, paths[0]);
    feed_file(r, paths[1]);
    feed_file(r, paths[1]);
    json_t *res = mt__report_result(r);
    assert_non_null(res);
    json_t *procs = json_object_get(res, "processes");
    /* One pid (this test's) for three ranks: three processes, not one. */
    assert_int_equal(json_array_size(procs), 3);
    json_t *p0 = json_array_get(procs, 0);
    assert_int_equal(json_integer_value(json_object_get(p0, "rank")), 2);
    assert_string_equal(json_string_value(json_object_get(p0, "job")), "ddp-1");
    assert_int_equal(json_integer_value(json_object_get(p0, "peak_allocated")), 2 * M);
    assert_int_equal(json_integer_value(json_object_get(res, "duplicates")), 3);

    json_t *jobs = json_object_get(res, "jobs");
    assert_int_equal(json_array_size(jobs), 1);
    json_t *g = json_array_get(jobs, 0);
    assert_string_equal(json_string_value(json_object_get(g, "job")), "ddp-1");
    assert_int_equal(json_integer_value(json_object_get(g, "world_size")), 4);
    assert_string_equal(json_string_value(json_object_get(g, "timeline_origin")), "first_event");
    json_t *ranks = json_object_get(g, "ranks");
    assert_int_equal(json_array_size(ranks), 3);
    static const uint64_t want[3] = {3, 7, 2};
    for (int i = 0; i < 3; i++) {
        json_t *row = json_array_get(ranks, (size_t)i);
        assert_int_equal(json_integer_value(json_object_get(row, "rank")), i);
        assert_int_equal(json_integer_value(json_object_get(row, "local_rank")), i % 2);
        assert_int_equal(json_integer_value(json_object_get(row, "peak_allocated")), want[i] * M);
        assert_int_equal(json_integer_value(json_object_get(row, "peak_reserved")),
                         2 * want[i] * M);
    }
    json_t *h = json_object_get(g, "highest");
    assert_int_equal(json_integer_value(json_object_get(h, "rank")), 1);
    assert_int_equal(json_integer_value(json_object_get(h, "peak_allocated")), 7 * M);
    assert_int_equal(json_integer_value(json_object_get(g, "median_peak_allocated")), 3 * M);
    assert_int_equal(json_integer_value(json_object_get(h, "above_median_bytes")), 4 * M);
    assert_int_equal(json_integer_value(json_object_get(g, "spread_bytes")), 5 * M);
    assert_int_equal(json_integer_value(json_object_get(g, "missing")), 1);
    json_t *miss = json_object_get(g, "missing_ranks");
    assert_int_equal(json_array_size(miss), 1);
    assert_int_equal(json_integer_value(json_array_get(miss, 0)), 3);
    schema_ok(res);
    json_decref(res);
    mt__report_destroy(&r);
    for (int i = 0; i < 3; i++)
        unlink(paths[i]);
    rmdir(dir);
}

/* Logs without ranks: no "jobs" member, and one pid stays one process. */
static void test_no_ranks_no_jobs(void **state)
{
    (void)state;
    mt__report_cfg_t cfg = mt__report_cfg_default();
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, &cfg), 0);
    static const char *const lines[] = {
        "{\"v\":1,\"type\":\"hello\",\"pid\":9,\"name\":\"a\",\"start_realtime_ns\":1,"
        "\"start_mono_ns\":1}",
        "{\"v\":1,\"type\":\"hello\",\"pid\":9,\"name\":\"a\",\"start_realtime_ns\":1,"
        "\"start_mono_ns\":1}",
    };
    char err[256];
    for (int i = 0; i < 2; i++)
        assert_int_equal(mt__report_add_line(r, lines[i], strlen(lines[i]), err, sizeof err), 0);
    json_t *res = mt__report_result(r);
    assert_non_null(res);
    assert_int_equal(json_array_size(json_object_get(res, "processes")), 1);
    assert_null(json_object_get(res, "jobs"));
    json_decref(res);
    mt__report_destroy(&r);
}

int main(int argc, char **argv)
{
    if (argc == 2) { /* the CLI test's logs */
        char paths[3][256];
        setenv("MEMTRACE_OOM_DIR", "off", 1);
        write_logs(argv[1], paths);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranks_of_one_job),
        cmocka_unit_test(test_no_ranks_no_jobs),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
