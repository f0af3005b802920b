/* The two-core line reader (analysis/lines_pipe.h) that report, plot, export, diff and view
 * read logs with: it gives the lines, their numbers and the over-long ones exactly as the
 * line-by-line reader (analysis/lines.h) does, on one thread or two, across its blocks; and a
 * log with every event kind and odd but valid JSON (escapes, other key orders, whitespace,
 * large integers, unknown keys) reads to the same report through the event-line decoder as
 * through jansson alone, with malformed lines named by their line numbers both ways. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis/lines.h"
#include "analysis/lines_pipe.h"
#include "analysis/report.h"
#include "memtrace/alloc.h"
#include "memtrace/prof.h"
#include "tests/common/test_main.h"
#include "tools/logs.h"

static char path[64];

static int setup(void **state)
{
    (void)state;
    snprintf(path, sizeof path, "/tmp/mt_lines_pipe_%d.ndjson", (int)getpid());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    return 0;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* ---- the same lines as the line-by-line reader ---- */

/* The line-by-line reader's lines, to compare the pipe's with, one at a time. */
typedef struct expect_s {
    mt__lines_t ls;
    unsigned long given;
    unsigned long events; /* MT_LINE_EVENT items seen */
} expect_t;

static int same_line(void *ud, const mt__line_item_t *it, unsigned long lineno)
{
    expect_t *x = ud;
    const char *line;
    size_t len;
    int rc = mt__lines_next(&x->ls, &line, &len);
    x->given++;
    if (lineno != x->ls.lineno)
        fail_msg("line %lu given as %lu", x->ls.lineno, lineno);
    if (it->what == MT_LINE_LONG) {
        assert_int_equal(rc, MT_EOVERFLOW);
        return 0;
    }
    assert_int_equal(rc, 1);
    if (len > 0 && line[len - 1] == '\n')
        len--;
    if (it->what == MT_LINE_EVENT) { /* only the writer's event lines */
        x->events++;
        assert_true(len > 21 && memcmp(line, "{\"v\":1,\"type\":\"event\"", 21) == 0);
        return 0;
    }
    assert_int_equal(it->what, MT_LINE_RAW);
    if (it->len != len || memcmp(it->text, line, len) != 0)
        fail_msg("line %lu: %zu bytes given, %zu expected", lineno, (size_t)it->len, len);
    assert_int_equal(it->text[len], '\0');
    return 0;
}

/* Lines of every length around the limit and around the blocks' size (several blocks in
 * all), empty ones, CRLF endings, event lines, over-long lines that straddle blocks. */
static void write_mixed(size_t max, int last)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    static char buf[(4u << 20) + 16]; /* the longest line below: 1 MiB + 5, 1.5 blocks */
    size_t total = 0, next_long = MT_LINES_PIPE_BLOCK / 3;
    for (unsigned i = 0; total < 3 * MT_LINES_PIPE_BLOCK + 8 * max + 12345; i++) {
        size_t len;
        if (total >= next_long) {
            /* Over-long lines every third of a block (and 4 lines at the limit), of lengths that
             * end them at every place in a block: some end in the block they start in, some
             * straddle. */
            next_long = total + MT_LINES_PIPE_BLOCK / 3 + 4 * max;
            len = max + 1 + rnd() % MT_LINES_PIPE_BLOCK;
            memset(buf, 'L', len);
            goto put;
        }
        switch (rnd() % 8) {
        case 0:
            len = 0;
            break;
        case 1: /* at or just past the limit */
            len = max - 1 + rnd() % 3;
            break;
        case 2: /* rarely, much longer than a block can hold */
            len = rnd() % 400 == 0 ? MT_LINES_PIPE_BLOCK / 2 + rnd() % MT_LINES_PIPE_BLOCK
                                   : rnd() % max;
            break;
        case 3: {
            mt_event_rec_t ev = {.seq = i, .kind = MT_EV_ALLOC, .addr = 4096, .size = 512};
            len = mt_prof_event_write(buf, sizeof buf, &ev, 7, NULL, NULL) - 1;
            if (rnd() % 2)
                buf[len++] = '\r';
            goto put;
        }
        default:
            len = rnd() % 300;
        }
        memset(buf, 'a' + (int)(i % 26), len);
    put:
        buf[len] = '\n';
        assert_int_equal(fwrite(buf, 1, len + 1, f), len + 1);
        total += len + 1;
    }
    if (last == 1) /* a last line without a newline */
        fputs("the end", f);
    if (last == 2) { /* an over-long last line without a newline */
        memset(buf, 'q', max + 5);
        fwrite(buf, 1, max + 5, f);
    }
    assert_int_equal(fclose(f), 0);
}

static void test_pipe_as_lines(void **state)
{
    (void)state;
    size_t maxes[] = {1000, 65536, 1u << 20};
    for (int last = 0; last <= 2; last++) {
        size_t max = maxes[last];
        write_mixed(max, last);
        for (int threads = 1; threads <= 2; threads++)
            for (int fast = 0; fast <= 1; fast++) {
                FILE *f = fopen(path, "r"), *g = fopen(path, "r");
                assert_non_null(f);
                assert_non_null(g);
                expect_t x = {0};
                assert_int_equal(mt__lines_open(&x.ls, g, max), 0);
                mt__lines_pipe_cfg_t pc = {.max = max, .fast = fast, .threads = threads};
                unsigned long lines = 0;
                assert_int_equal(mt__lines_pipe_run(f, &pc, same_line, &x, &lines), 0);
                assert_int_equal(lines, x.given);
                if (lines <= (max < 10000 ? 500u : 20u))
                    fail_msg("%lu lines (max %zu, last %d, threads %d)", lines, max, last, threads);
                const char *line;
                size_t len;
                assert_int_equal(mt__lines_next(&x.ls, &line, &len), 0); /* nothing left */
                if (fast)
                    assert_true(x.events > 0);
                else
                    assert_int_equal(x.events, 0);
                mt__lines_close(&x.ls);
                fclose(f);
                fclose(g);
            }
    }
}

/* A callback that stops at the 10th line: the pipe stops there, on either thread count. */
static int stop_at_10(void *ud, const mt__line_item_t *it, unsigned long lineno)
{
    (void)it;
    *(unsigned long *)ud = lineno;
    return lineno == 10 ? MT_EBUSY : 0;
}

static void test_pipe_stops(void **state)
{
    (void)state;
    write_mixed(1000, 0);
    for (int threads = 1; threads <= 2; threads++) {
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        unsigned long seen = 0, lines = 0;
        mt__lines_pipe_cfg_t pc = {.max = 1000, .fast = true, .threads = threads};
        assert_int_equal(mt__lines_pipe_run(f, &pc, stop_at_10, &seen, &lines), MT_EBUSY);
        assert_int_equal(seen, 10);
        assert_int_equal(lines, 10);
        fclose(f);
    }
    mt__lines_pipe_cfg_t bad = {.max = 0, .threads = 1};
    assert_int_equal(mt__lines_pipe_run(stdin, &bad, stop_at_10, NULL, NULL), MT_EINVAL);
}

/* ---- the decoding shared by the two threads ---- */

/* What the callback saw: a hash of every item (its kind, and an event's record, pid and
 * tag), the event items, and a pause every `slow` lines (0: none) so that the reading
 * thread runs ahead and decodes the blocks itself. */
typedef struct seen_s {
    uint64_t hash;
    unsigned long events, slow;
} seen_t;

static void mix(uint64_t *h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        *h = (*h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
}

static int hash_item(void *ud, const mt__line_item_t *it, unsigned long lineno)
{
    seen_t *sn = ud;
    mix(&sn->hash, &it->what, sizeof it->what);
    if (it->what == MT_LINE_EVENT) {
        sn->events++;
        mix(&sn->hash, &it->ev, sizeof it->ev);
        mix(&sn->hash, &it->pid, sizeof it->pid);
    }
    if (it->what != MT_LINE_LONG)
        mix(&sn->hash, it->text, it->len);
    if (sn->slow && lineno % sn->slow == 0)
        usleep(200);
    return 0;
}

/* Event lines over many blocks, among other lines: on two threads, whichever decodes a
 * block (the reading thread when the callback is slow, mostly the caller's when it is
 * fast), every event line is given decoded, and every item as one thread gives it. */
static void test_pipe_decodes_on_either(void **state)
{
    (void)state;
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    unsigned long nev = 0;
    for (unsigned i = 0; i < 120000; i++) {
        if (i % 7 == 3) {
            fprintf(f, "{\"v\":1,\"type\":\"hello\",\"pid\":%u}\n", i);
            continue;
        }
        char line[512];
        mt_event_rec_t ev = {.seq = i,
                             .time_ns = 1000u * i,
                             .kind = MT_EV_ALLOC,
                             .addr = 4096u * (i % 977),
                             .size = 512u + i % 4096};
        size_t n = mt_prof_event_write(line, sizeof line, &ev, 7 + i % 3, NULL, NULL);
        assert_true(n > 1);
        assert_int_equal(fwrite(line, 1, n, f), n);
        nev++;
    }
    assert_int_equal(fclose(f), 0);
    seen_t one = {.hash = 0xcbf29ce484222325ull};
    f = fopen(path, "r");
    assert_non_null(f);
    mt__lines_pipe_cfg_t pc = {.max = 65536, .fast = true, .threads = 1};
    assert_int_equal(mt__lines_pipe_run(f, &pc, hash_item, &one, NULL), 0);
    fclose(f);
    assert_int_equal(one.events, nev);
    for (unsigned long slow = 0; slow <= 100; slow += 100) {
        seen_t two = {.hash = 0xcbf29ce484222325ull, .slow = slow};
        f = fopen(path, "r");
        assert_non_null(f);
        pc.threads = 2;
        assert_int_equal(mt__lines_pipe_run(f, &pc, hash_item, &two, NULL), 0);
        fclose(f);
        if (two.events != nev || two.hash != one.hash)
            fail_msg("slow %lu: %lu of %lu events decoded, hash %s", slow, two.events, nev,
                     two.hash == one.hash ? "same" : "differs");
    }
}

/* ---- the same report through the decoder as through jansson ---- */

/* Replaces the first occurrence of from in s (of cap bytes) with to. */
static void replace(char *s, size_t cap, const char *from, const char *to)
{
    char *p = strstr(s, from);
    assert_non_null(p);
    size_t nf = strlen(from), nt = strlen(to), rest = strlen(p + nf);
    assert_true((size_t)(p - s) + nt + rest < cap);
    memmove(p + nt, p + nf, rest + 1);
    memcpy(p, to, nt);
}

/* A writer line made odd but kept valid, in one of several ways (by i). */
static void oddify(char *s, size_t cap, unsigned i)
{
    size_t n = strlen(s);
    switch (i % 6) {
    case 0: /* whitespace around the separators and at both ends */
        replace(s, cap, ",\"seq\":", " ,\t\"seq\" : ");
        replace(s, cap, "{", " { ");
        strcat(s, " ");
        break;
    case 1: /* another key order: seq moved to the end */ {
        char *q = strstr(s, ",\"seq\":");
        char *e = strchr(q + 7, ',');
        char seq[64];
        snprintf(seq, sizeof seq, "%.*s", (int)(e - q), q);
        memmove(q, e, strlen(e) + 1);
        n = strlen(s);
        s[n - 1] = '\0'; /* the closing brace */
        strcat(s, seq);
        strcat(s, "}");
        break;
    }
    case 2: /* escapes: in a key, and in the kind's name when it starts with an a */
        replace(s, cap, "{\"v\":1", "{\"\\u0076\":1");
        if (strstr(s, "\"kind\":\"a"))
            replace(s, cap, "\"kind\":\"a", "\"kind\":\"\\u0061");
        break;
    case 3: /* keys the reader does not know, before and after */
        replace(s, cap, "{", "{\"zz\":{\"a\":[1,2.5,null,\"\\\"\"]},");
        s[strlen(s) - 1] = '\0';
        strcat(s, ",\"future\":true}");
        break;
    case 4: /* the largest seq a JSON integer holds, and a time of 0 */ {
        char *q = strstr(s, "\"seq\":") + 6;
        char *e = strchr(q, ',');
        char rest[4096];
        snprintf(rest, sizeof rest, "9223372036854775807%s", e);
        strcpy(q, rest);
        break;
    }
    default: /* a CRLF ending */
        strcat(s, "\r");
        break;
    }
}

/* Every event kind as the writer writes it, with figures at 64-bit edges; then the same
 * lines made odd; malformed lines at known places. *bad_at: their line numbers. */
static void write_kinds_log(unsigned long *bad_at, size_t *nbad)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"v\":1,\"type\":\"hello\",\"pid\":31,\"name\":\"kinds \\\"quoted\\\"\"}\n", f);
    unsigned long lineno = 1;
    *nbad = 0;
    static const uint64_t edges[] = {0, 1, UINT32_MAX, (uint64_t)INT64_MAX, 1ull << 40};
    char line[4096];
    for (unsigned round = 0; round < 2; round++)
        for (unsigned i = 0; i < 4 * (MT_EV_KIND_COUNT - 1); i++) {
            mt_event_rec_t ev = {0};
            ev.seq = round * 1000 + i;
            ev.time_ns = 1000 * (uint64_t)i;
            ev.kind = (uint8_t)(1 + i % (MT_EV_KIND_COUNT - 1));
            ev.addr = ev.kind == MT_EV_MARK ? 1 + i % MT_MARK_WARMUP_END
                                            : 0xffffffffffff0000ull - 4096ull * i;
            ev.size = ev.kind == MT_EV_STACK_REF ? 1 + i : edges[i % 5];
            ev.requested = edges[(i + 1) % 5];
            ev.allocated = edges[(i + 2) % 5];
            ev.reserved = edges[(i + 3) % 5];
            ev.stream = (uint32_t)(i % 3);
            ev.pool = (uint8_t)(i % (MT_POOL_HOST + 1));
            ev.tag = (uint8_t)(i % 5);
            if (ev.kind == MT_EV_TAG_LABEL) /* a label names a user tag, a library 1 or more */
                ev.tag = (uint8_t)(MT_TAG_USER_FIRST + i % 5);
            if (ev.kind == MT_EV_LIBRARY_LABEL)
                ev.tag = (uint8_t)(1 + i % 5);
            ev.device = (uint8_t)(i % 2);
            if (ev.kind == MT_EV_TAG_LABEL || ev.kind == MT_EV_MARK_NAMED ||
                ev.kind == MT_EV_LIBRARY_LABEL)
                mt_event_label_pack(&ev, i % 2 ? "lab\\el" : "a \"label\"");
            size_t len =
                mt_prof_alloc_write(line, sizeof line, &ev, 31, i % 3 ? 0 : 5 + i, NULL, NULL);
            assert_true(len < sizeof line);
            line[len - 1] = '\0';
            if (round == 1)
                oddify(line, sizeof line, i);
            fprintf(f, "%s\n", line);
            lineno++;
            if (i % 29 == 11) { /* a malformed line after it */
                static const char *const bad[] = {
                    "{\"v\":1,\"type\":\"event\",\"seq\":\"x\"}", "{not json", "",
                    "{\"v\":1,\"type\":\"event\",\"seq\":1,\"t_ns\":1,\"pid\":31,\"dev\":0,"
                    "\"kind\":\"alloc\",\"addr\":\"0x1\",\"size\":-1}"};
                fprintf(f, "%s\n", bad[*nbad % 4]);
                bad_at[(*nbad)++] = ++lineno;
            }
        }
    fputs("{\"v\":1,\"type\":\"exit\",\"pid\":31,\"clean\":true}", f); /* no newline */
    assert_int_equal(fclose(f), 0);
}

/* The report of path through mt_tool_read_logs, and what it wrote on stderr. */
static json_t *read_report(bool general, unsigned long *bad, char *errs, size_t errcap)
{
    mt__report_cfg_t cfg = mt__report_cfg_default();
    cfg.general_reader = general;
    mt__report_t *r = NULL;
    assert_int_equal(mt__report_create(&r, &cfg), 0);
    char epath[80];
    snprintf(epath, sizeof epath, "%s.err", path);
    fflush(stderr);
    int saved = dup(2), fd = open(epath, O_CREAT | O_TRUNC | O_RDWR, 0600);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    char *paths[1] = {path};
    *bad = 0;
    int status = mt_tool_read_logs(r, "test", paths, 1, bad);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    assert_int_equal(status, 0);
    ssize_t got = pread(fd, errs, errcap - 1, 0);
    errs[got > 0 ? got : 0] = '\0';
    close(fd);
    unlink(epath);
    json_t *j = mt__report_result(r);
    assert_non_null(j);
    mt__report_destroy(&r);
    return j;
}

static void test_decoder_same_as_jansson(void **state)
{
    (void)state;
    unsigned long bad_at[64];
    size_t nbad;
    write_kinds_log(bad_at, &nbad);
    assert_true(nbad >= 4 && nbad <= 10); /* every one is named (ten at most are) */
    static char e1[16384], e2[16384];
    unsigned long b1, b2;
    json_t *a = read_report(true, &b1, e1, sizeof e1);
    json_t *b = read_report(false, &b2, e2, sizeof e2);
    if (b1 != nbad)
        fail_msg("%lu malformed lines, %zu written:\n%s", b1, nbad, e1);
    assert_int_equal(b2, nbad);
    assert_string_equal(e1, e2);
    for (size_t i = 0; i < nbad; i++) {
        char want[96];
        snprintf(want, sizeof want, "%s:%lu: malformed line: ", path, bad_at[i]);
        if (!strstr(e2, want))
            fail_msg("line %lu not named: %s", bad_at[i], e2);
    }
    if (!json_equal(a, b)) {
        char *sa = json_dumps(a, JSON_COMPACT), *sb = json_dumps(b, JSON_COMPACT);
        fail_msg("the reports differ:\n%.3000s\n%.3000s", sa, sb);
    }
    /* The analysis is not empty: the events were read. */
    json_t *procs = json_object_get(a, "processes");
    assert_true(json_array_size(procs) == 1);
    assert_true(json_integer_value(json_object_get(a, "events")) >= 4 * (MT_EV_KIND_COUNT - 1));
    json_decref(a);
    json_decref(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pipe_as_lines, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipe_stops, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipe_decodes_on_either, setup, teardown),
        cmocka_unit_test_setup_teardown(test_decoder_same_as_jansson, setup, teardown),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
