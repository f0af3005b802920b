/* The fast event decoder (analysis/ndjson_fast.h) against the jansson path it stands in
 * front of: on every line the line writer writes (every kind, every field at its edges),
 * on the logs the repo ships, on a replay of a real trace, and on hundreds of thousands of
 * mutations of those lines, it either declines or decodes exactly the same record. And
 * the report reads a log, and rejects a malformed line, with the same result and the same
 * message through either path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/report.h"
#include "analysis/trace_csv.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "tests/analysis/fast_check.h"
#include "tests/common/test_main.h"

static const char *data_root; /* the source tree: its .ndjson logs and data/traces */

/* ---- lines ---- */

typedef struct lines_s {
    char **v;
    size_t n, cap;
} lines_t;

static void lines_add(lines_t *l, const char *s, size_t n)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->v = realloc(l->v, l->cap * sizeof(*l->v));
        assert_non_null(l->v);
    }
    l->v[l->n] = strndup(s, n);
    assert_non_null(l->v[l->n]);
    l->n++;
}

static void lines_free(lines_t *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof(*l));
}

/* Asserts the property on one line; returns whether the fast decoder took it. */
static bool check(const char *s, size_t n)
{
    char why[160] = "";
    fast_check_e rc = fast_check(s, n, why, sizeof why);
    if (rc == FAST_DIFFERS)
        fail_msg("fast decoder differs on %.*s: %s", (int)n, s, why);
    return rc == FAST_SAME;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A figure at one of the edges a decoder gets wrong, or anything. */
static uint64_t edge(void)
{
    static const uint64_t e[] = {0,
                                 1,
                                 9,
                                 10,
                                 99,
                                 UINT8_MAX,
                                 UINT8_MAX + 1,
                                 UINT32_MAX,
                                 (uint64_t)UINT32_MAX + 1,
                                 INT64_MAX,
                                 (uint64_t)INT64_MAX + 1,
                                 UINT64_MAX,
                                 1000000000000000000ull};
    return rnd() % 3 ? rnd() >> (rnd() % 64) : e[rnd() % (sizeof e / sizeof e[0])];
}

static const char *odd_tag(void *ud, int tag)
{
    (void)ud;
    static const char *const names[] = {NULL,          "",        "a \"quoted\" tag", "tab\there",
                                        "caf\xc3\xa9", "bad\xff", "plain_name"};
    return names[tag % 7];
}

/* Lines of every kind as the writer writes them, fields at their edges. */
static void writer_lines(lines_t *out, size_t n, size_t *must_take)
{
    char buf[4096];
    *must_take = 0;
    for (size_t i = 0; i < n; i++) {
        mt_event_rec_t ev = {0};
        ev.seq = edge();
        ev.time_ns = edge();
        ev.kind = (uint8_t)(1 + rnd() % (MT_EV_KIND_COUNT - 1));
        ev.addr = ev.kind == MT_EV_MARK ? 1 + rnd() % MT_MARK_WARMUP_END : edge();
        ev.size = edge();
        ev.requested = edge();
        ev.allocated = edge();
        ev.reserved = edge();
        ev.stream = (uint32_t)edge();
        ev.pool = (uint8_t)(rnd() % (MT_POOL_HOST + 1));
        ev.tag = (uint8_t)(rnd() % MT_TAG_MAX);
        ev.device = (uint8_t)edge();
        if (ev.kind == MT_EV_TAG_LABEL || ev.kind == MT_EV_MARK_NAMED ||
            ev.kind == MT_EV_LIBRARY_LABEL)
            mt_event_label_pack(&ev, rnd() % 2 ? "label" : "a \"label\"");
        if (ev.kind == MT_EV_STACK_REF)
            ev.size = 1 + rnd() % UINT32_MAX;
        int pid = (int)(rnd() % 3 ? rnd() % 100000 : (uint32_t)rnd());
        uint32_t stack = rnd() % 2 ? (uint32_t)(1 + rnd() % UINT32_MAX) : 0;
        bool odd = rnd() % 4 == 0;
        size_t len =
            mt_prof_alloc_write(buf, sizeof buf, &ev, pid, stack, odd ? odd_tag : NULL, NULL);
        assert_true(len < sizeof buf);
        lines_add(out, buf, len - 1); /* without its newline, as the report strips it */
        /* What the fast decoder must take: an event of the common kinds whose strings are
         * plain ASCII. */
        const char *tn = odd ? odd_tag(NULL, ev.tag) : NULL;
        bool plain = !tn || !*tn || strcmp(tn, "plain_name") == 0;
        bool rare = ev.kind == MT_EV_GAP || ev.kind == MT_EV_TAG_LABEL ||
                    ev.kind == MT_EV_MARK_NAMED || ev.kind == MT_EV_LIBRARY_LABEL ||
                    ev.kind == MT_EV_OUTSIDE_ALLOC || ev.kind == MT_EV_OUTSIDE_FREE;
        if (!rare && (plain || ev.kind == MT_EV_STACK_REF))
            (*must_take)++;
    }
}

static void keep_event(void *ud, const mt_event_rec_t *ev)
{
    lines_t *l = ud;
    char buf[4096];
    size_t len = mt_prof_event_write(buf, sizeof buf, ev, 4242, NULL, NULL);
    lines_add(l, buf, len - 1);
}

/* The events of a real trace replayed on the sim backend, as the writer writes them. */
static void replay_lines(lines_t *out, const char *trace)
{
    char err[256];
    mt_trace_t *t = NULL;
    if (mt__trace_load(&t, trace, err, sizeof err) != 0)
        fail_msg("%s", err);
    mt_backend_t *b = NULL;
    mt_alloc_t *a = NULL;
    mt_event_sink_t sink = {.emit = keep_event, .ud = out};
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = (size_t)64 << 30;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.sink = &sink;
    assert_int_equal(mt_alloc_create(&a, &ac), 0);
    void **ptr = calloc(t->nslots + 1, sizeof(*ptr));
    assert_non_null(ptr);
    for (size_t i = 0; i < t->nops; i++) {
        const mt_trace_op_t *op = &t->ops[i];
        if (op->action == MT_TRACE_ALLOCATE)
            assert_int_equal(
                mt_alloc_malloc(a, op->size, NULL, (int)(op->slot % 4), &ptr[op->slot]), 0);
        else
            assert_int_equal(mt_alloc_free(a, ptr[op->slot]), 0);
    }
    free(ptr);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    mt__trace_free(&t);
}

/* Every line of every .ndjson file under dir (one level of subfolders). */
static void log_lines(lines_t *out, const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[1024];
        int pl = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (pl < 0 || (size_t)pl >= sizeof path)
            continue; /* a path this deep is no log of ours */
        size_t nl = strlen(e->d_name);
        if (nl > 7 && strcmp(e->d_name + nl - 7, ".ndjson") == 0) {
            FILE *f = fopen(path, "r");
            assert_non_null(f);
            char *line = NULL;
            size_t cap = 0;
            ssize_t n;
            while ((n = getline(&line, &cap, f)) > 0)
                lines_add(out, line, (size_t)n - (line[n - 1] == '\n'));
            free(line);
            fclose(f);
        } else if (depth > 0) {
            log_lines(out, path, depth - 1);
        }
    }
    closedir(d);
}

/* ---- the tests ---- */

static void test_every_writer_line(void **state)
{
    (void)state;
    lines_t l = {0};
    size_t must;
    writer_lines(&l, 20000, &must);
    size_t took = 0;
    for (size_t i = 0; i < l.n; i++)
        took += check(l.v[i], strlen(l.v[i]));
    /* The common lines go the fast way: a decoder that declines everything is no use. */
    assert_int_equal(took, must);
    assert_true(must > l.n / 2);
    lines_free(&l);
}

static void test_real_logs(void **state)
{
    (void)state;
    lines_t l = {0};
    char path[1024];
    snprintf(path, sizeof path, "%s/tests", data_root);
    log_lines(&l, path, 3);
    assert_true(l.n > 50); /* the shipped logs were found */
    size_t took = 0;
    for (size_t i = 0; i < l.n; i++)
        took += check(l.v[i], strlen(l.v[i]));
    assert_true(took > 0);
    size_t logs = l.n;
    snprintf(path, sizeof path, "%s/data/traces/somas_resnet50.csv", data_root);
    replay_lines(&l, path);
    assert_true(l.n > logs + 2000);
    for (size_t i = logs; i < l.n; i++)
        if (!check(l.v[i], strlen(l.v[i])))
            fail_msg("a line of the replay goes the slow way: %s", l.v[i]);
    lines_free(&l);
}

/* One mutation of s (n bytes) into out; returns its length. */
static size_t mutate(const char *s, size_t n, char *out, size_t cap)
{
    static const char pool[] = "0123456789-+.eE\"\\ ,:{}[]xX\x7f\x01\xc3\xa9\xff"
                               "abcfnrtu";
    size_t pos = n ? rnd() % n : 0;
    char c = pool[rnd() % (sizeof pool - 1)];
    size_t m = 0;
    switch (rnd() % 6) {
    case 0: /* replace a byte */
        memcpy(out, s, n);
        out[pos] = c;
        m = n;
        break;
    case 1: /* delete a byte */
        memcpy(out, s, pos);
        memcpy(out + pos, s + pos + 1, n - pos - 1);
        m = n - 1;
        break;
    case 2: /* insert a byte */
        memcpy(out, s, pos);
        out[pos] = c;
        memcpy(out + pos + 1, s + pos, n - pos);
        m = n + 1;
        break;
    case 3: /* cut short */
        memcpy(out, s, pos);
        m = pos;
        break;
    case 4: { /* a run of digits where digits are, past the limits */
        memcpy(out, s, pos);
        size_t k = 1 + rnd() % 21;
        for (size_t i = 0; i < k && pos + i < cap; i++)
            out[pos + i] = (char)('0' + rnd() % 10);
        memcpy(out + pos + k, s + pos, n - pos);
        m = n + k;
        break;
    }
    default: { /* a member's text repeated */
        size_t k = 1 + rnd() % 24;
        if (pos + k > n)
            k = n - pos;
        memcpy(out, s, pos + k);
        memcpy(out + pos + k, s + pos, n - pos);
        m = n + k;
        break;
    }
    }
    assert_true(m <= cap);
    return m;
}

static void test_mutations(void **state)
{
    (void)state;
    lines_t l = {0};
    size_t must;
    writer_lines(&l, 400, &must);
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/prof/data", data_root);
    log_lines(&l, path, 0);
    char buf[8192];
    size_t took = 0, tried = 0;
    for (int round = 0; round < 300; round++) {
        for (size_t i = 0; i < l.n; i++) {
            size_t n = strlen(l.v[i]);
            if (n + 64 > sizeof buf)
                continue;
            size_t m = mutate(l.v[i], n, buf, sizeof buf);
            took += check(buf, m);
            tried++;
        }
    }
    /* Some mutations keep a valid line (a digit for a digit): those must be taken too. */
    assert_true(took > 0);
    assert_true(tried > 100000);
    lines_free(&l);
}

/* The same lines through two reports, one per path: the same return, the same message,
 * the same analysis. */
static void test_report_same_both_ways(void **state)
{
    (void)state;
    lines_t l = {0};
    size_t must;
    writer_lines(&l, 300, &must);
    char buf[8192];
    size_t base = l.n;
    for (size_t i = 0; i < 3000; i++) {
        const char *s = l.v[i % base];
        size_t m = mutate(s, strlen(s), buf, sizeof buf);
        lines_add(&l, buf, m);
    }
    mt__report_cfg_t general = mt__report_cfg_default();
    general.general_reader = true;
    mt__report_t *slow = NULL, *fast = NULL;
    assert_int_equal(mt__report_create(&slow, &general), 0);
    assert_int_equal(mt__report_create(&fast, NULL), 0);
    size_t bad = 0;
    for (size_t i = 0; i < l.n; i++) {
        char e1[256] = "", e2[256] = "";
        size_t n = strlen(l.v[i]);
        int r1 = mt__report_add_line(slow, l.v[i], n, e1, sizeof e1);
        int r2 = mt__report_add_line(fast, l.v[i], n, e2, sizeof e2);
        if (r1 != r2 || strcmp(e1, e2) != 0)
            fail_msg("%s: jansson %d \"%s\", fast %d \"%s\"", l.v[i], r1, e1, r2, e2);
        bad += r1 != 0;
    }
    assert_true(bad > 0); /* the mutations did make malformed lines, named the same way */
    json_t *a = mt__report_result(slow), *b = mt__report_result(fast);
    assert_non_null(a);
    assert_non_null(b);
    if (!json_equal(a, b)) {
        char *sa = json_dumps(a, JSON_COMPACT), *sb = json_dumps(b, JSON_COMPACT);
        fail_msg("the reports differ:\n%.2000s\n%.2000s", sa, sb);
    }
    json_decref(a);
    json_decref(b);
    mt__report_destroy(&slow);
    mt__report_destroy(&fast);
    lines_free(&l);
}

int main(int argc, char **argv)
{
    data_root = argc > 1 ? argv[1] : ".";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_writer_line),
        cmocka_unit_test(test_real_logs),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_report_same_both_ways),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
