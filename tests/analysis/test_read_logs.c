/* The log reader of report, plot, export and diff (tools/logs.c, on analysis/lines.c, which
 * `memtrace view` reads with too) reads in blocks: lines
 * that straddle two blocks, a last line without its newline, CRLF endings and the line
 * length limit must come out as line-by-line reading gives them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis/lines.h"
#include "memtrace/prof.h"
#include "tests/common/test_main.h"
#include "tools/logs.h"

static char path[64];

static int setup(void **state)
{
    (void)state;
    snprintf(path, sizeof path, "/tmp/mt_read_logs_%d.ndjson", (int)getpid());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    return 0;
}

static json_t *result_of_lines(char **lines, size_t n)
{
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    for (size_t i = 0; i < n; i++) {
        char err[256];
        (void)mt__report_add_line(r, lines[i], strlen(lines[i]), err, sizeof err);
    }
    json_t *j = mt__report_result(r);
    mt__report_destroy(&r);
    return j;
}

static json_t *result_of_file(int *status, unsigned long *bad)
{
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    char *paths[1] = {path};
    *bad = 0;
    *status = mt_tool_read_logs(r, "test", paths, 1, bad);
    json_t *j = mt__report_result(r);
    mt__report_destroy(&r);
    return j;
}

/* About 3 MiB of events in lines of varying length, some malformed, some with CRLF, the
 * last without a newline: the same report as the lines fed one by one. */
static void test_blocks_as_lines(void **state)
{
    (void)state;
    size_t n = 14000;
    char **lines = calloc(n, sizeof(*lines));
    assert_non_null(lines);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    char buf[1024];
    unsigned long malformed = 0;
    for (size_t i = 0; i < n; i++) {
        mt_event_rec_t ev = {.seq = i,
                             .time_ns = 1000 * i,
                             .kind = i % 2 ? MT_EV_FREE_COMPLETED : MT_EV_ALLOC,
                             .addr = 0x10000 * (i / 2 + 1),
                             .size = 512 * (i % 97 + 1),
                             .requested = 500,
                             .pool = MT_POOL_SMALL};
        size_t len = mt_prof_event_write(buf, sizeof buf, &ev, 77, NULL, NULL);
        if (i % 501 == 3) { /* malformed: cut short */
            len /= 2;
            buf[len++] = '\n';
            malformed++;
        }
        if (i % 7 == 0) { /* a CRLF ending */
            buf[len - 1] = '\r';
            buf[len++] = '\n';
        }
        if (i == n - 1)
            len--; /* the last line has no newline */
        lines[i] = strndup(buf, len);
        assert_int_equal(fwrite(buf, 1, len, f), len);
    }
    assert_int_equal(fclose(f), 0);
    int status;
    unsigned long bad;
    json_t *a = result_of_file(&status, &bad);
    json_t *b = result_of_lines(lines, n);
    assert_int_equal(status, 0);
    assert_int_equal(bad, malformed);
    assert_int_equal(json_integer_value(json_object_get(a, "lines")), n);
    assert_true(json_equal(a, b));
    json_decref(a);
    json_decref(b);
    for (size_t i = 0; i < n; i++)
        free(lines[i]);
    free(lines);
}

/* A line of MT_LOG_LINE_MAX bytes is read (and is malformed); one byte more is the end,
 * wherever the line falls in a block. */
static void test_line_limit(void **state)
{
    (void)state;
    static char big[MT_LOG_LINE_MAX + 2];
    for (int extra = 0; extra <= 1; extra++) {
        for (size_t lead = 0; lead < 3; lead++) {
            FILE *f = fopen(path, "w");
            assert_non_null(f);
            /* Lines before it move it across the 1 MiB block boundary. */
            for (size_t i = 0; i < lead * 8; i++) {
                memset(big, 'x', MT_LOG_LINE_MAX / 2);
                big[MT_LOG_LINE_MAX / 2] = '\n';
                fwrite(big, 1, MT_LOG_LINE_MAX / 2 + 1, f);
            }
            size_t len = MT_LOG_LINE_MAX + (size_t)extra;
            memset(big, 'y', len);
            big[len] = '\n';
            fwrite(big, 1, len + 1, f);
            fputs("{\"v\":1,\"type\":\"hello\",\"pid\":5,\"name\":\"after\"}\n", f);
            assert_int_equal(fclose(f), 0);
            int status;
            unsigned long bad;
            json_t *j = result_of_file(&status, &bad);
            if (extra == 0) {
                assert_int_equal(status, 0);
                assert_int_equal(bad, lead * 8 + 1);
                assert_int_equal(json_integer_value(json_object_get(j, "lines")), lead * 8 + 2);
            } else {
                assert_int_equal(status, 2);
                assert_int_equal(bad, lead * 8 + 1);
            }
            json_decref(j);
        }
    }
}

/* The shared line reader (analysis/lines.h) as `memtrace view` uses it: an over-long line
 * is refused and skipped, wherever it falls across blocks, and reading goes on after it with
 * the line numbers of line-by-line reading; a last line without a newline, and one that is
 * over-long, end the file as they should. */
static void test_skip_long_lines(void **state)
{
    (void)state;
    enum { MAX = 1000 };
    static char big[3 * MT_LINES_BLOCK];
    for (int last_open = 0; last_open <= 1; last_open++)
        for (size_t longlen = MAX + 1; longlen <= 2 * MT_LINES_BLOCK + 7; longlen *= 97) {
            FILE *f = fopen(path, "w");
            assert_non_null(f);
            fputs("first\n", f);
            memset(big, 'y', longlen);
            big[longlen] = '\n';
            fwrite(big, 1, longlen + 1, f);
            memset(big, 'z', MAX);
            big[MAX] = '\n';
            fwrite(big, 1, MAX + 1, f); /* exactly MAX: given */
            fputs("\r\n", f);
            if (last_open) { /* over-long at the end, without a newline */
                big[MAX] = 'z';
                fwrite(big, 1, MAX + 1, f);
            } else
                fputs("last", f);
            assert_int_equal(fclose(f), 0);
            f = fopen(path, "r");
            assert_non_null(f);
            mt__lines_t ls;
            assert_int_equal(mt__lines_open(&ls, f, MAX), 0);
            const char *line;
            size_t len;
            assert_int_equal(mt__lines_next(&ls, &line, &len), 1);
            assert_int_equal(len, 6);
            assert_string_equal(line, "first\n");
            assert_int_equal(mt__lines_next(&ls, &line, &len), MT_EOVERFLOW);
            assert_int_equal(ls.lineno, 2);
            assert_int_equal(mt__lines_next(&ls, &line, &len), 1);
            assert_int_equal(ls.lineno, 3);
            assert_int_equal(len, MAX + 1);
            assert_int_equal(line[0], 'z');
            assert_int_equal(line[len], '\0');
            assert_int_equal(mt__lines_next(&ls, &line, &len), 1);
            assert_string_equal(line, "\r\n");
            if (last_open) {
                assert_int_equal(mt__lines_next(&ls, &line, &len), MT_EOVERFLOW);
                assert_int_equal(ls.lineno, 5);
            } else {
                assert_int_equal(mt__lines_next(&ls, &line, &len), 1);
                assert_int_equal(len, 4);
                assert_string_equal(line, "last");
            }
            assert_int_equal(mt__lines_next(&ls, &line, &len), 0);
            assert_int_equal(mt__lines_next(&ls, &line, &len), 0);
            mt__lines_close(&ls);
            fclose(f);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_blocks_as_lines, setup, teardown),
        cmocka_unit_test_setup_teardown(test_line_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_skip_long_lines, setup, teardown),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
