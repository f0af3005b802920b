/* The RMM CSV reader and loader (analysis/trace_csv.c): valid input, the bundled traces, and
 * every malformed case kept under data/invalid/ (NAME.csv with its expected message in
 * NAME.err: the text that must follow the file name). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "analysis/trace_csv.h"
#include "tests/common/test_main.h"

#ifndef REPLAY_DATA_DIR
#error "REPLAY_DATA_DIR must name tests/replay/data"
#endif
#ifndef TRACES_DIR
#error "TRACES_DIR must name data/traces"
#endif

#define HEADER MT_TRACE_HEADER "\n"

/* Loads text as a trace named "mem.csv". */
static int load_text(const char *text, mt_trace_t **t, char *err, size_t errlen)
{
    FILE *f = fmemopen((void *)text, strlen(text), "rb");
    assert_non_null(f);
    int rc = mt__trace_load_file(t, f, "mem.csv", err, errlen);
    fclose(f);
    return rc;
}

static void test_row_fields(void **state)
{
    const char *text = HEADER "2342727,15:47:02.841961,allocate,0x10012400000,1048576,0\n"
                              "9,00:00:00.000001,allocate failure,0x0,77,Ab0\n"
                              "18446744073709551615,23:59:59.999999,free,0xFFFFFFFFFFFFFFFF,"
                              "18446744073709551615,ffffffffffffffff\n";
    FILE *f = fmemopen((void *)text, strlen(text), "rb");
    assert_non_null(f);
    mt_trace_reader_t *r;
    char err[MT_TRACE_ERR_LEN];
    assert_int_equal(mt__trace_reader_from_file(&r, f, "mem.csv", err, sizeof err), 0);
    mt_trace_row_t row;
    assert_int_equal(mt__trace_reader_next(r, &row), 1);
    assert_int_equal(row.line, 2);
    assert_int_equal(row.thread, 2342727);
    assert_int_equal(row.time_us, ((15 * 3600 + 47 * 60 + 2) * 1000000ull) + 841961);
    assert_int_equal(row.action, MT_TRACE_ALLOCATE);
    assert_int_equal(row.ptr, 0x10012400000ull);
    assert_int_equal(row.size, 1048576);
    assert_int_equal(row.stream, 0);
    assert_int_equal(mt__trace_reader_next(r, &row), 1);
    assert_int_equal(row.line, 3);
    assert_int_equal(row.action, MT_TRACE_ALLOCATE_FAILURE);
    assert_int_equal(row.time_us, 1);
    assert_int_equal(row.stream, 0xab0);
    assert_int_equal(mt__trace_reader_next(r, &row), 1);
    assert_int_equal(row.action, MT_TRACE_FREE);
    assert_true(row.thread == UINT64_MAX && row.size == UINT64_MAX);
    assert_true(row.ptr == UINT64_MAX && row.stream == UINT64_MAX);
    assert_int_equal(mt__trace_reader_next(r, &row), 0);
    assert_int_equal(mt__trace_reader_next(r, &row), 0);
    assert_string_equal(mt__trace_reader_error(r), "");
    mt__trace_reader_close(&r);
    assert_null(r);
    fclose(f);
}

static void test_errors_are_sticky(void **state)
{
    const char *text = HEADER "1,00:00:00.000001,allocate,0x1000,12a,0\n"
                              "1,00:00:00.000002,allocate,0x2000,12,0\n";
    FILE *f = fmemopen((void *)text, strlen(text), "rb");
    mt_trace_reader_t *r;
    assert_int_equal(mt__trace_reader_from_file(&r, f, "mem.csv", NULL, 0), 0);
    mt_trace_row_t row;
    assert_int_equal(mt__trace_reader_next(r, &row), MT_EPROTO);
    assert_string_equal(mt__trace_reader_error(r),
                        "mem.csv:2: field 'Size': not a decimal number: \"12a\"");
    /* A caller that ignores the error cannot read past the bad row. */
    assert_int_equal(mt__trace_reader_next(r, &row), MT_EPROTO);
    mt__trace_reader_close(&r);
    fclose(f);
}

/* Semantics: streams in order of first use, pointer reuse after free, failures skipped,
 * a zero-byte allocate of 0x0 and the stream of a block taken from its allocate. */
static void test_load_semantics(void **state)
{
    char path[1024], err[MT_TRACE_ERR_LEN];
    snprintf(path, sizeof path, "%s/valid/streams.csv", REPLAY_DATA_DIR);
    mt_trace_t *t;
    assert_int_equal(mt__trace_load(&t, path, err, sizeof err), 0);
    assert_int_equal(t->nrows, 10);
    assert_int_equal(t->nallocs, 5);
    assert_int_equal(t->nfrees, 4);
    assert_int_equal(t->nfailures, 1);
    assert_int_equal(t->nops, 8);
    assert_int_equal(t->nstreams, 2);
    assert_int_equal(t->streams[0], 0);
    assert_int_equal(t->streams[1], 0x7f3a2c000b70ull);
    assert_int_equal(t->peak_live_bytes, 2048 + 20971520);
    assert_int_equal(t->peak_live_count, 2);
    assert_int_equal(t->leaked, 0);
    /* 0x10012400000 is allocated twice (after its free): two slots, each closed once. */
    assert_int_equal(t->ops[0].slot, 0);
    assert_int_equal(t->ops[2].action, MT_TRACE_FREE);
    assert_int_equal(t->ops[2].slot, 0);
    assert_int_equal(t->ops[3].action, MT_TRACE_ALLOCATE);
    assert_int_equal(t->ops[3].size, 2048);
    assert_int_not_equal(t->ops[3].slot, 0);
    assert_int_equal(t->ops[7].slot, t->ops[3].slot);
    /* The upper-case stream of the 20 MiB allocate is the same stream. */
    assert_int_equal(t->ops[5].stream, 1);
    for (size_t i = 0; i < t->nops; i++)
        assert_true(t->ops[i].slot < t->nslots);
    mt__trace_free(&t);
    assert_null(t);
}

static void test_crlf_and_no_final_newline(void **state)
{
    char path[1024], err[MT_TRACE_ERR_LEN];
    mt_trace_t *a, *b;
    snprintf(path, sizeof path, "%s/valid/streams.csv", REPLAY_DATA_DIR);
    assert_int_equal(mt__trace_load(&a, path, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/valid/crlf_no_final_newline.csv", REPLAY_DATA_DIR);
    assert_int_equal(mt__trace_load(&b, path, err, sizeof err), 0);
    assert_int_equal(a->nops, b->nops);
    assert_memory_equal(a->ops, b->ops, a->nops * sizeof a->ops[0]);
    mt__trace_free(&a);
    mt__trace_free(&b);
}

/* RMM's releases write pointers and streams with 0x (fmt::ptr: older releases and
 * RMM_BACKWARDS_COMPATIBILITY builds) or without (%llx: newer ones), and its docs show a
 * pointer with 0x beside a stream without: the same trace read from each. */
static void test_rmm_hex_forms(void **state)
{
    (void)state;
    char path[1024], err[MT_TRACE_ERR_LEN];
    mt_trace_t *a, *b;
    snprintf(path, sizeof path, "%s/valid/streams.csv", REPLAY_DATA_DIR);
    assert_int_equal(mt__trace_load(&a, path, err, sizeof err), 0);
    static const char *const forms[] = {"rmm_fmt_ptr.csv", "rmm_printf.csv"};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        snprintf(path, sizeof path, "%s/valid/%s", REPLAY_DATA_DIR, forms[i]);
        if (mt__trace_load(&b, path, err, sizeof err) != 0)
            fail_msg("%s", err);
        assert_int_equal(a->nops, b->nops);
        assert_int_equal(a->nstreams, b->nstreams);
        assert_memory_equal(a->streams, b->streams, a->nstreams * sizeof a->streams[0]);
        assert_memory_equal(a->ops, b->ops, a->nops * sizeof a->ops[0]);
        assert_int_equal(a->nfailures, b->nfailures);
        mt__trace_free(&b);
    }
    mt__trace_free(&a);
}

/* RMM's documentation shows the Time column as seconds since the epoch and a free as
 * 'deallocate' (its adaptor writes HH:MM:SS.uuuuuu and 'free'): a file written to the
 * documentation is read as the same trace. */
static void test_rmm_documented_form(void **state)
{
    (void)state;
    char err[MT_TRACE_ERR_LEN];
    mt_trace_t *a, *b;
    assert_int_equal(load_text(HEADER "140573312345856,1634567890.123456,allocate,0x7f8a40000000,"
                                      "1024,0x7f8a38001020\n"
                                      "140573312345856,1634567890.234567,allocate,0x7f8a40000400,"
                                      "2048,0x7f8a38001020\n"
                                      "140573312345856,1634567890.345678,deallocate,0x7f8a40000000,"
                                      "1024,0x7f8a38001020\n",
                               &a, err, sizeof err),
                     0);
    assert_int_equal(load_text(HEADER "140573312345856,00:00:00.000001,allocate,0x7f8a40000000,"
                                      "1024,0x7f8a38001020\n"
                                      "140573312345856,00:00:00.000002,allocate,0x7f8a40000400,"
                                      "2048,0x7f8a38001020\n"
                                      "140573312345856,00:00:00.000003,free,0x7f8a40000000,"
                                      "1024,0x7f8a38001020\n",
                               &b, err, sizeof err),
                     0);
    assert_int_equal(a->nops, 3);
    assert_int_equal(a->nfrees, 1);
    assert_int_equal(a->nstreams, 1);
    assert_true(a->streams[0] == 0x7f8a38001020u);
    assert_int_equal(a->nops, b->nops);
    assert_memory_equal(a->ops, b->ops, a->nops * sizeof a->ops[0]);
    mt__trace_free(&a);
    mt__trace_free(&b);
    /* whole seconds, and a fraction of any length up to 9 digits */
    assert_int_equal(load_text(HEADER "1,1634567890,allocate,0x1000,12,0\n"
                                      "1,1634567890.5,free,0x1000,12,0\n",
                               &a, err, sizeof err),
                     0);
    assert_int_equal(a->nfrees, 1);
    mt__trace_free(&a);
}

static void test_header_only_and_leaks(void **state)
{
    char path[1024], err[MT_TRACE_ERR_LEN];
    mt_trace_t *t;
    snprintf(path, sizeof path, "%s/valid/header_only.csv", REPLAY_DATA_DIR);
    assert_int_equal(mt__trace_load(&t, path, err, sizeof err), 0);
    assert_int_equal(t->nrows, 0);
    assert_int_equal(t->nops, 0);
    mt__trace_free(&t);
    assert_int_equal(load_text(HEADER "1,00:00:00.000001,allocate,0x1000,12,0\n"
                                      "1,00:00:00.000002,free,0x0,0,0\n",
                               &t, err, sizeof err),
                     0);
    assert_int_equal(t->leaked, 1);
    assert_int_equal(t->nops, 1);
    assert_int_equal(t->nfrees, 1);
    mt__trace_free(&t);
}

/* Lines that straddle the reader's 64 KiB chunks, and many live pointers (the hash table
 * grows and deletes by backward shift): every free must still find its allocate. */
static void test_many_rows_across_chunks(void **state)
{
    enum { N = 20000 };
    size_t cap = (size_t)N * 2 * 64 + 64;
    char *text = malloc(cap);
    assert_non_null(text);
    size_t n = (size_t)snprintf(text, cap, "%s", HEADER);
    /* Allocate N pointers, then free them all in an order unrelated to the allocation
     * order (a stride coprime with N). */
    for (unsigned i = 0; i < N; i++)
        n += (size_t)snprintf(text + n, cap - n, "1,00:00:00.000001,allocate,0x%x00,%u,0\n", i + 1,
                              i % 4096 + 1);
    for (unsigned i = 0; i < N; i++) {
        unsigned k = (i * 7919u) % N;
        n += (size_t)snprintf(text + n, cap - n, "1,00:00:00.000002,free,0x%x00,%u,0\n", k + 1,
                              k % 4096 + 1);
    }
    char err[MT_TRACE_ERR_LEN] = "";
    mt_trace_t *t;
    int rc = load_text(text, &t, err, sizeof err);
    if (rc != 0)
        fail_msg("%s", err);
    assert_int_equal(t->nops, 2 * N);
    assert_int_equal(t->leaked, 0);
    assert_int_equal(t->peak_live_count, N);
    for (unsigned i = 0; i < N; i++) {
        unsigned k = (i * 7919u) % N;
        assert_int_equal(t->ops[N + i].slot, k);
    }
    mt__trace_free(&t);
    free(text);
}

static void test_bundled_traces(void **state)
{
    static const struct {
        const char *name;
        size_t rows;
    } traces[] = {{"somas_resnet50.csv", 2084}, {"somas_pangu_2.6B.csv", 37384}};
    char path[1024], err[MT_TRACE_ERR_LEN];
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", TRACES_DIR, traces[i].name);
        mt_trace_t *t;
        int rc = mt__trace_load(&t, path, err, sizeof err);
        if (rc != 0)
            fail_msg("%s", err);
        assert_int_equal(t->nrows, traces[i].rows);
        assert_int_equal(t->nallocs, t->nfrees);
        assert_int_equal(t->leaked, 0);
        mt__trace_free(&t);
    }
    /* The generated RNN-like trace: balanced, one stream, and of the promised length. */
    snprintf(path, sizeof path, "%s/rnn_varlen.csv", TRACES_DIR);
    mt_trace_t *t;
    assert_int_equal(mt__trace_load(&t, path, err, sizeof err), 0);
    assert_true(t->nrows >= 3000 && t->nrows <= 30000);
    assert_int_equal(t->nallocs, t->nfrees);
    assert_int_equal(t->nstreams, 1);
    assert_int_equal(t->leaked, 0);
    mt__trace_free(&t);
}

static mt_trace_t *load_ok(const char *path)
{
    char err[MT_TRACE_ERR_LEN];
    mt_trace_t *t = NULL;
    if (mt__trace_load(&t, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    return t;
}

/* Compressed traces read as their text: files the real xz, gzip and zstd wrote, in several
 * streams, members and frames (data/valid: streams.csv cut in two, each part compressed on
 * its own), and the shipped torch traces (xz, each many of the reader's buffers long). */
static void test_compressed(void **state)
{
    static const char *const parts[] = {"streams_2members.csv.gz", "streams_2streams.csv.xz",
                                        "streams_2frames.csv.zst"};
    char path[1024];
    snprintf(path, sizeof path, "%s/valid/streams.csv", REPLAY_DATA_DIR);
    mt_trace_t *plain = load_ok(path);
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/valid/%s", REPLAY_DATA_DIR, parts[i]);
        mt_trace_t *t = load_ok(path);
        assert_int_equal(t->nrows, plain->nrows);
        assert_int_equal(t->nops, plain->nops);
        assert_int_equal(t->nfailures, plain->nfailures);
        assert_int_equal(t->nstreams, plain->nstreams);
        assert_memory_equal(t->streams, plain->streams, t->nstreams * sizeof t->streams[0]);
        assert_memory_equal(t->ops, plain->ops, t->nops * sizeof t->ops[0]);
        mt__trace_free(&t);
    }
    mt__trace_free(&plain);
    static const char *const two[] = {"two_allocs.csv.xz", "two_allocs.csv.gz",
                                      "two_allocs.csv.zst"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/valid/%s", REPLAY_DATA_DIR, two[i]);
        mt_trace_t *t = load_ok(path);
        assert_int_equal(t->nallocs, 2);
        assert_int_equal(t->ops[0].size, 16777216);
        assert_int_equal(t->ops[1].size, 8388608);
        mt__trace_free(&t);
    }
    static const struct {
        const char *name;
        size_t rows, allocs, leaked;
    } torch[] = {{"torch_lstm.csv.xz", 160786, 80396, 6},
                 {"torch_gru.csv.xz", 294298, 147152, 6},
                 {"torch_transformer.csv.xz", 34966, 17486, 6}};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", TRACES_DIR, torch[i].name);
        mt_trace_t *t = load_ok(path);
        assert_int_equal(t->nrows, torch[i].rows);
        assert_int_equal(t->nallocs, torch[i].allocs);
        assert_int_equal(t->nallocs + t->nfrees, t->nrows);
        assert_int_equal(t->leaked, torch[i].leaked);
        mt__trace_free(&t);
    }
}

/* A reader on a compressed stream hands out the rows decoded before an error, then the
 * error: a truncated xz file's rows are all read. */
static void test_compressed_prefix_kept(void **state)
{
    char path[1024], err[MT_TRACE_ERR_LEN];
    snprintf(path, sizeof path, "%s/invalid/xz_truncated.csv", REPLAY_DATA_DIR);
    mt_trace_reader_t *r;
    assert_int_equal(mt__trace_reader_open(&r, path, err, sizeof err), 0);
    mt_trace_row_t row;
    int rc, rows = 0;
    while ((rc = mt__trace_reader_next(r, &row)) == 1)
        rows++;
    assert_int_equal(rc, MT_EPROTO);
    assert_int_equal(rows, 10); /* every row of streams.csv */
    assert_non_null(strstr(mt__trace_reader_error(r), "xz: the file ends inside"));
    assert_int_equal(mt__trace_reader_next(r, &row), MT_EPROTO); /* sticky */
    mt__trace_reader_close(&r);
}

static void test_missing_file(void **state)
{
    char err[MT_TRACE_ERR_LEN];
    mt_trace_t *t = (mt_trace_t *)&err; /* must be reset to NULL */
    assert_int_equal(mt__trace_load(&t, REPLAY_DATA_DIR "/no/such.csv", err, sizeof err),
                     MT_ENOENT);
    assert_null(t);
    assert_non_null(strstr(err, "no/such.csv: cannot open"));
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *buf = calloc(1, 4096);
    assert_non_null(buf);
    size_t n = fread(buf, 1, 4095, f);
    fclose(f);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    return buf;
}

/* Every data/invalid/NAME.csv fails to load with MT_EPROTO and the message
 * "<path>" + contents of NAME.err. */
static void test_invalid_files(void **state)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/invalid", REPLAY_DATA_DIR);
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int cases = 0;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".csv") != 0)
            continue;
        char csv[2048], errf[2048], err[MT_TRACE_ERR_LEN], want[2048 + 4096];
        snprintf(csv, sizeof csv, "%s/%s", dir, e->d_name);
        snprintf(errf, sizeof errf, "%s/%.*s.err", dir, (int)(len - 4), e->d_name);
        char *expected = slurp(errf);
        snprintf(want, sizeof want, "%s%s", csv, expected);
        mt_trace_t *t = NULL;
        int rc = mt__trace_load(&t, csv, err, sizeof err);
        if (rc != MT_EPROTO || strstr(err, want) == NULL)
            fail_msg("%s: rc %d, message\n  %s\nexpected it to contain\n  %s", e->d_name, rc, err,
                     want);
        assert_null(t);
        free(expected);
        cases++;
    }
    closedir(d);
    /* The cases the issue names, at least: header, number, pointer, action, time, unknown
     * free, double free, truncated, missing fields, empty file. */
    assert_true(cases >= 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_fields),
        cmocka_unit_test(test_errors_are_sticky),
        cmocka_unit_test(test_load_semantics),
        cmocka_unit_test(test_crlf_and_no_final_newline),
        cmocka_unit_test(test_rmm_hex_forms),
        cmocka_unit_test(test_header_only_and_leaks),
        cmocka_unit_test(test_many_rows_across_chunks),
        cmocka_unit_test(test_bundled_traces),
        cmocka_unit_test(test_compressed),
        cmocka_unit_test(test_compressed_prefix_kept),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_invalid_files),
        cmocka_unit_test(test_rmm_documented_form),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
