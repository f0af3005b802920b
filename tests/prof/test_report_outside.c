/* `memtrace report` of device memory outside the allocator (docs/outside.md), end to end: a
 * real program (prof_outside: sim backend, a 200 MiB context, libfakecublas.so reporting
 * 48 MiB, 16 MiB nobody reports, 40 + 20 MiB of blocks) writes its log; the report's text
 * and JSON give the split of the device's used bytes exactly, at the end and at the peak of
 * used, and at the OOM; both line readers give the same report; two ranks of one job that
 * differ only in memory nobody reports differ in their outside column; a log without the
 * device's figures gets no such section.
 *
 * usage: test_prof_report_outside MEMTRACE PROF_OUTSIDE */
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

#include "mt_config.h"
#include "tests/common/test_main.h"

#define MIB ((json_int_t)1 << 20)

static const char *memtrace_exe, *producer_exe;
static char dir[64];

/* The standard output of cmd (new), which must exit 0. */
static char *run(const char *cmd)
{
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    size_t k;
    while ((k = fread(out + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap) {
            out = realloc(out, cap *= 2);
            assert_non_null(out);
        }
    }
    out[n] = '\0';
    int st = pclose(f);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s: status %d\n%s", cmd, st, out);
    return out;
}

/* s with every run of spaces made one space, in place: the columns' widths are not what the
 * test holds the report to. */
static char *squeeze(char *s)
{
    char *w = s;
    for (const char *r = s; *r; r++)
        if (*r != ' ' || w == s || w[-1] != ' ')
            *w++ = *r;
    *w = '\0';
    return s;
}

static void has(const char *text, const char *want)
{
    if (strstr(text, want) == NULL)
        fail_msg("report lacks \"%s\":\n%s", want, text);
}

/* A log of prof_outside at dir/name, with extra MiB nobody reports; rank < 0: no rank. */
static void produce(char path[256], const char *name, int rank, int extra)
{
    snprintf(path, 256, "%s/%s", dir, name);
    char cmd[768];
    if (rank >= 0)
        snprintf(cmd, sizeof cmd,
                 "env -u MEMTRACE_RANK -u MEMTRACE_WORLD_SIZE -u SLURM_PROCID -u "
                 "OMPI_COMM_WORLD_RANK RANK=%d WORLD_SIZE=2 "
                 "MEMTRACE_JOB=outjob %s %s %d",
                 rank, producer_exe, path, extra);
    else
        snprintf(cmd, sizeof cmd,
                 "env -u RANK -u MEMTRACE_RANK -u SLURM_PROCID -u OMPI_COMM_WORLD_RANK %s %s %d",
                 producer_exe, path, extra);
    free(run(cmd));
}

/* The report of logs (a space-separated list), as JSON (new) or text (new, squeezed). */
static json_t *report_json(const char *logs, const char *reader)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s%s %s report --json %s", reader ? "MEMTRACE_READER=" : "",
             reader ? reader : "", memtrace_exe, logs);
    char *out = run(cmd);
    json_error_t err;
    json_t *j = json_loads(out, 0, &err);
    if (j == NULL)
        fail_msg("not JSON (%s):\n%s", err.text, out);
    free(out);
    return j;
}

static char *report_text(const char *logs, const char *reader)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s%s %s report %s", reader ? "MEMTRACE_READER=" : "",
             reader ? reader : "", memtrace_exe, logs);
    return run(cmd);
}

/* res validates against the telemetry schema (ajv, tests/prof/validate.mjs); not checked
 * without node or ajv (npm ci --prefix tests/prof). */
static void schema_ok(const json_t *res)
{
    if (system("command -v node > /dev/null 2>&1") != 0)
        return;
    char path[320];
    snprintf(path, sizeof path, "%s/report.ndjson", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(json_dumpf(res, f, JSON_COMPACT), 0);
    fputc('\n', f);
    fclose(f);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "node %s/tests/prof/validate.mjs %s/docs/telemetry.schema.json %s >&2", MT_SOURCE_ROOT,
             MT_SOURCE_ROOT, path);
    int st = system(cmd);
    unlink(path);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) != 77)
        assert_int_equal(WEXITSTATUS(st), 0);
}

static json_int_t geti(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    if (!json_is_integer(v))
        fail_msg("no integer \"%s\"", k);
    return json_integer_value(v);
}

/* A split {used, reserved, outside, libraries, context, not_seen}: the figures asked for, and
 * the parts adding up to used. */
static void split_is(const json_t *s, json_int_t used, json_int_t reserved, json_int_t libraries,
                     json_int_t context, json_int_t not_seen)
{
    assert_non_null(s);
    assert_int_equal(geti(s, "used"), used);
    assert_int_equal(geti(s, "reserved"), reserved);
    assert_int_equal(geti(s, "outside"), used - reserved);
    assert_int_equal(geti(s, "libraries"), libraries);
    assert_int_equal(geti(s, "context"), context);
    assert_int_equal(geti(s, "not_seen"), not_seen);
    assert_int_equal(geti(s, "reserved") + geti(s, "libraries") + geti(s, "context") +
                         geti(s, "not_seen"),
                     geti(s, "used"));
}

static void test_split_in_json(void **state)
{
    (void)state;
    char log[256];
    produce(log, "one.ndjson", -1, 0);
    json_t *res = report_json(log, NULL);
    json_t *p = json_array_get(json_object_get(res, "processes"), 0);
    json_t *dm = json_object_get(p, "device_memory");
    assert_int_equal(json_array_size(dm), 1);
    json_t *d = json_array_get(dm, 0);
    assert_int_equal(geti(d, "device"), 0);
    assert_int_equal(geti(d, "total"), 2048 * MIB);
    assert_int_equal(geti(d, "peak_used"), 324 * MIB);
    /* At the end the allocator gave everything back: only what is outside is left. */
    split_is(json_object_get(d, "end"), 264 * MIB, 0, 48 * MIB, 200 * MIB, 16 * MIB);
    /* The device was fullest with both blocks' segments (40 + 20 MiB) held. */
    split_is(json_object_get(d, "at_peak_used"), 324 * MIB, 60 * MIB, 48 * MIB, 200 * MIB,
             16 * MIB);
    assert_int_equal(geti(p, "peak_reserved"), 60 * MIB);
    json_t *libs = json_object_get(d, "libraries");
    assert_int_equal(json_array_size(libs), 1);
    json_t *l = json_array_get(libs, 0);
    assert_string_equal(json_string_value(json_object_get(l, "library")), "libfakecublas.so");
    assert_int_equal(geti(l, "bytes"), 48 * MIB);
    assert_int_equal(geti(l, "peak"), 48 * MIB);
    assert_int_equal(geti(l, "at_peak_used"), 48 * MIB);
    /* The OOM, with the device's figure sent right before it. */
    json_t *ooms = json_object_get(p, "ooms");
    assert_int_equal(geti(ooms, "count"), 1);
    json_t *o = json_array_get(json_object_get(ooms, "first"), 0);
    assert_int_equal(geti(o, "requested"), 4096 * MIB);
    assert_int_equal(geti(o, "free"), (2048 - 324) * MIB);
    split_is(json_object_get(o, "device_memory"), 324 * MIB, 60 * MIB, 48 * MIB, 200 * MIB,
             16 * MIB);
    schema_ok(res);
    json_decref(res);
    unlink(log);
}

static void test_split_in_text(void **state)
{
    (void)state;
    char log[256];
    produce(log, "one.ndjson", -1, 0);
    char *t = squeeze(report_text(log, NULL));
    has(t, "device 0 memory as the driver reports it: 264.0 MiB used of 2.0 GiB (peak 324.0 "
           "MiB)\n");
    has(t, " at the end at peak used\n");
    has(t, "\n used 264.0 MiB 324.0 MiB\n");
    has(t, "\n memtrace reserved 0 B 60.0 MiB\n");
    has(t, "\n outside the allocator 264.0 MiB 264.0 MiB\n");
    has(t, "\n libfakecublas.so 48.0 MiB 48.0 MiB\n");
    has(t, "\n context 200.0 MiB 200.0 MiB\n");
    has(t, "\n not seen 16.0 MiB 16.0 MiB\n");
    has(t, "out of memory: 1 OOM\n");
    has(t, "device 0: asked 4.0 GiB, 1.7 GiB free; used 324.0 MiB: memtrace reserved 60.0 MiB, "
           "outside 264.0 MiB (libraries 48.0 MiB, context 200.0 MiB, not seen 16.0 MiB)\n");
    free(t);
    unlink(log);
}

/* The event-line decoder takes the device lines and leaves the outside and label lines to
 * jansson; jansson alone must give the same report. */
static void test_readers_agree(void **state)
{
    (void)state;
    char log[256];
    produce(log, "one.ndjson", -1, 0);
    json_t *fast = report_json(log, NULL), *slow = report_json(log, "jansson");
    assert_non_null(
        json_object_get(json_array_get(json_object_get(slow, "processes"), 0), "device_memory"));
    if (!json_equal(fast, slow)) {
        char *a = json_dumps(fast, JSON_INDENT(1)), *b = json_dumps(slow, JSON_INDENT(1));
        fail_msg("the readers' reports differ:\n%s\n----\n%s", a, b);
    }
    json_decref(fast);
    json_decref(slow);
    char *tf = report_text(log, NULL), *ts = report_text(log, "jansson");
    assert_string_equal(tf, ts);
    free(tf);
    free(ts);
    unlink(log);
}

/* Two ranks of one job: rank 1 holds 32 MiB more that nobody reports. */
static void test_ranks_outside(void **state)
{
    (void)state;
    char r0[256], r1[256], logs[600];
    produce(r0, "rank0.ndjson", 0, 0);
    produce(r1, "rank1.ndjson", 1, 32);
    snprintf(logs, sizeof logs, "%s %s", r0, r1);
    json_t *res = report_json(logs, NULL);
    json_t *g = json_array_get(json_object_get(res, "jobs"), 0);
    assert_string_equal(json_string_value(json_object_get(g, "job")), "outjob");
    json_t *ranks = json_object_get(g, "ranks");
    assert_int_equal(json_array_size(ranks), 2);
    static const json_int_t want[2] = {264 * MIB, 296 * MIB};
    for (size_t i = 0; i < 2; i++) {
        json_t *r = json_array_get(ranks, i);
        assert_int_equal(geti(r, "rank"), (json_int_t)i);
        assert_int_equal(geti(r, "peak_allocated"), 60 * MIB);
        assert_int_equal(geti(r, "peak_reserved"), 60 * MIB);
        assert_int_equal(geti(r, "outside_bytes"), want[i]);
        assert_int_equal(geti(r, "ooms"), 1);
    }
    schema_ok(res);
    json_decref(res);
    char *t = squeeze(report_text(logs, NULL));
    has(t, " RANK PID PEAK ALLOCATED PEAK RESERVED OUTSIDE OOMS PEAK ITER\n");
    has(t, " 60.0 MiB 60.0 MiB 264.0 MiB 1 1 <- highest\n");
    has(t, " 60.0 MiB 60.0 MiB 296.0 MiB 1 1\n");
    free(t);
    unlink(r0);
    unlink(r1);
}

/* A log from before the device's figures (its device lines taken out): no device memory
 * section and no outside column, no error; the OOM is still listed, without a split. */
static void test_old_log(void **state)
{
    (void)state;
    char log[256], old[300], cmd[1024];
    produce(log, "rank0.ndjson", 0, 0);
    snprintf(old, sizeof old, "%s/old.ndjson", dir);
    snprintf(cmd, sizeof cmd, "grep -v '\"kind\":\"device\"' %s > %s", log, old);
    assert_int_equal(system(cmd), 0);
    json_t *res = report_json(old, NULL);
    json_t *p = json_array_get(json_object_get(res, "processes"), 0);
    assert_null(json_object_get(p, "device_memory"));
    json_t *o = json_array_get(json_object_get(json_object_get(p, "ooms"), "first"), 0);
    assert_non_null(o);
    assert_null(json_object_get(o, "device_memory"));
    json_t *r = json_array_get(
        json_object_get(json_array_get(json_object_get(res, "jobs"), 0), "ranks"), 0);
    assert_null(json_object_get(r, "outside_bytes"));
    schema_ok(res);
    json_decref(res);
    char *t = squeeze(report_text(old, NULL));
    assert_null(strstr(t, "as the driver reports it"));
    has(t, " 60.0 MiB 60.0 MiB - 1 1\n");
    free(t);
    unlink(log);
    unlink(old);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s MEMTRACE PROF_OUTSIDE\n", argv[0]);
        return 2;
    }
    memtrace_exe = argv[1];
    producer_exe = argv[2];
    snprintf(dir, sizeof dir, "/tmp/mt-report-outside-%d", (int)getpid());
    char cmd[128];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    if (system(cmd) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_in_json), cmocka_unit_test(test_split_in_text),
        cmocka_unit_test(test_readers_agree), cmocka_unit_test(test_ranks_outside),
        cmocka_unit_test(test_old_log),
    };
    int rc = MT_TEST_RUN(tests, NULL, NULL);
    rmdir(dir);
    return rc;
}
