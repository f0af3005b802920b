/* The binary log (profiler/binlog.h, docs/telemetry.md "The binary log"):
 *  - the recorder given the same events in its two forms: the binary log converted back is
 *    the NDJSON log, line for line (gap times aside), for every kind, numbers past
 *    INT64_MAX, tags named by labels and by a tag_name override whose answers change, stack
 *    refs, drops;
 *  - the readers' items (lines_pipe) of the two logs are the same, record by record: the
 *    binary reader's fast items are exactly what the NDJSON decoder makes of the lines;
 *  - NDJSON -> binary -> NDJSON is the same bytes, on the shipped logs;
 *  - a damaged log (cut blocks, flipped bytes, junk, blocks of a bad version) is read up to
 *    the damage and on from the next block, each damaged part said with its offsets, and
 *    random mutations never crash the reader or make it read out of bounds;
 *  - a binary log at the file size limit ends on a whole block. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "analysis/binlog_conv.h"
#include "analysis/lines_pipe.h"
#include "memtrace/alloc.h"
#include "memtrace/prof.h"

static char *src_root;

static uint64_t rng_s = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return rng_s;
}

/* The tag_name override: its answer for user tag 9 changes with the phase. */
static int phase;
static const char *phase_name(void *ud, int tag)
{
    (void)ud;
    static const char *const names[] = {
        NULL, "", "phase two", "quote\" and \\ and \x01", "caf\xc3\xa9", "bad \xff utf-8"};
    return tag == 9 ? names[phase % 6] : tag == 10 ? "always ten" : NULL;
}

/* One value of a field: small, near a power of two, or past INT64_MAX now and then. */
static uint64_t value(void)
{
    uint64_t r = rnd();
    switch (r % 8) {
    case 0:
        return r >> 1 | 1ull << 63;
    case 1:
        return r % 16;
    default:
        return (r >> 8) % (1ull << (r % 48));
    }
}

/* A deterministic stream of events of every kind into p, flushed every flush_every (0:
 * at the end only, so that one drain fills the recorder's buffer and blocks begin in the
 * middle of it). */
static int flush_every = 500;
static size_t blocks_of(const char *buf, size_t n, size_t *at, size_t max);
static void record_mix(mt_prof_t *p, int n, uint64_t seed)
{
    rng_s = seed;
    uint64_t t = 1000;
    for (int i = 0; i < n; i++) {
        mt_event_rec_t ev;
        memset(&ev, 0, sizeof ev);
        uint64_t r = rnd();
        ev.kind = (uint8_t)(r % 4 == 0 ? 1 + rnd() % (MT_EV_KIND_COUNT + 1) /* one unknown */
                                       : (uint64_t)(1 + r % 3));
        t += rnd() % 5000;
        ev.time_ns = r % 97 == 0 ? value() | 1 : t;
        ev.addr = r % 5 == 0 ? value() : 0x7f0000000000ull + (rnd() % 4096) * 512;
        ev.size = value();
        ev.requested = r % 3 ? ev.size : value();
        ev.allocated = value();
        ev.reserved = r % 2 ? ev.allocated : value();
        ev.stream = (uint32_t)(r % 7 ? 0 : rnd());
        ev.pool = (uint8_t)(r % 11 ? rnd() % 4 : rnd());
        ev.tag = (uint8_t)(r % 13 ? rnd() % 12 : rnd());
        ev.device = (uint8_t)(r % 17 ? 0 : rnd());
        if (r % 29 == 0)
            ev.kind = MT_EV_STACK_REF; /* more of them: ids of every range */
        if (ev.kind == MT_EV_MARK)
            ev.addr = r % 3 ? 1 + rnd() % MT_MARK_WARMUP_END : value();
        if (ev.kind == MT_EV_TAG_LABEL || ev.kind == MT_EV_LIBRARY_LABEL)
            ev.tag = (uint8_t)(7 + rnd() % 5);
        if (ev.kind == MT_EV_STACK_REF) {
            ev.size = rnd() % 2 ? 1 + rnd() % 1000 : value(); /* 0, or past 32 bits, too */
            mt_prof_record(p, &ev);
            ev.kind = MT_EV_ALLOC; /* the alloc its stack is for, mostly */
            if (rnd() % 4 == 0)
                ev.addr++;
            ev.size = value();
        }
        if (flush_every != 0 && i % flush_every == flush_every - 1) {
            mt_prof_flush(p); /* the blocks end; the override's answers change */
            phase++;
        }
        mt_prof_record(p, &ev);
    }
    mt_prof_flush(p);
}

static void tmp_path(char *buf, size_t len, const char *what)
{
    snprintf(buf, len, "/tmp/mt_binlog_test_%d_%s", (int)getpid(), what);
}

/* A log of the mix in the given form at path, its user tags named by the stream's labels
 * alone, or also by the override (phase_name). */
static bool with_override = true;
static void make_log(const char *path, int format, int n, uint32_t slots)
{
    unlink(path);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = path;
    cfg.log_format = format;
    cfg.stacks = MT_STACKS_OFF;
    cfg.slots = slots;
    cfg.drain_ms = 3600 * 1000; /* drained at the flushes only: the same drops both times */
    cfg.tag_name = with_override ? phase_name : NULL;
    phase = 0;
    mt_prof_t *p = NULL;
    assert_int_equal(mt_prof_create(&p, &cfg), 0);
    record_mix(p, n, 42);
    mt_prof_destroy(&p);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n + 65536 > cap) {
            cap = (n + 65536) * 2;
            buf = realloc(buf, cap + 1);
            assert_non_null(buf);
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int no_damage(void *ud, const char *msg)
{
    fail_msg("damaged: %s", msg);
    (void)ud;
    return 0;
}

/* The NDJSON of the binary log at path. */
static char *converted(const char *path, size_t *len)
{
    FILE *in = fopen(path, "rb");
    assert_non_null(in);
    char *s = NULL;
    FILE *out = open_memstream(&s, len);
    uint64_t recs;
    assert_int_equal(mt__blog_to_ndjson(in, NULL, 0, out, no_damage, NULL, &recs), 0);
    fclose(out);
    fclose(in);
    return s;
}

/* The lines to compare: not the hello and exit (their times are the recorder's own), and a
 * gap's time (the drain's) masked. */
static char *comparable(const char *text)
{
    char *out = malloc(strlen(text) + 1), *w = out;
    assert_non_null(out);
    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n');
        size_t k = e ? (size_t)(e - l) + 1 : strlen(l);
        bool skip = memmem(l, k, "\"type\":\"hello\"", 14) || memmem(l, k, "\"type\":\"exit\"", 13);
        if (!skip) {
            memcpy(w, l, k);
            if (memmem(l, k, "\"type\":\"gap\"", 12)) {
                char *tn = memmem(w, k, "\"t_ns\":", 7);
                for (char *d = tn ? tn + 7 : NULL; d && *d >= '0' && *d <= '9'; d++)
                    *d = '0';
            }
            w += k;
        }
        l += k;
    }
    *w = '\0';
    return out;
}

static void test_binary_converts_to_the_ndjson(void **state)
{
    (void)state;
    /* rounds 2 and 3: one drain of 60 000 events, its blocks begun as the buffer fills */
    for (int round = 0; round < 4; round++) {
        with_override = round % 2 == 0;
        flush_every = round < 2 ? 500 : 0;
        int n = round < 2 ? 6000 : 60000;
        uint32_t slots = round < 2 ? 4096 : 1u << 17;
        char nd[108], bin[108];
        tmp_path(nd, sizeof nd, "mix.ndjson");
        tmp_path(bin, sizeof bin, "mix.mtlog");
        make_log(nd, MT_PROF_LOG_NDJSON, n, slots);
        make_log(bin, MT_PROF_LOG_AUTO, n, slots); /* binary by its name */
        size_t nl, bl, cl;
        char *ndjson = slurp(nd, &nl), *binary = slurp(bin, &bl), *back = converted(bin, &cl);
        assert_memory_equal(binary, "\x89MTLOG\r\n", 8);
        size_t at[8];
        if (round >= 2) /* several blocks of one drain */
            assert_true(blocks_of(binary, bl, at, 8) >= 3);
        char *a = comparable(ndjson), *b = comparable(back);
        if (round < 2) /* drops happened: gaps compared */
            assert_true(strstr(a, "\"type\":\"gap\"") != NULL);
        if (with_override && round < 2)
            assert_true(strstr(a, "phase two") && strstr(a, "always ten") && strstr(a, "\\ufffd"));
        else if (!with_override) /* the labels' names, which change in the middle of blocks */
            assert_true(strstr(a, "\"kind\":\"tag_label\"") && !strstr(a, "phase two"));
        assert_string_equal(b, a);
        fprintf(stderr, "NDJSON %zu bytes, binary %zu (%.1f%%)\n", nl, bl,
                100.0 * (double)bl / (double)nl);
        free(a);
        free(b);
        free(ndjson);
        free(binary);
        free(back);
        unlink(nd);
        unlink(bin);
    }
    with_override = true;
    flush_every = 500;
}

/* ---- the readers' items ---- */

typedef struct items_s {
    mt__line_item_t *v;
    char **text;
    size_t n, cap;
} items_t;

static int keep_item(void *ud, const mt__line_item_t *it, unsigned long lineno)
{
    (void)lineno;
    items_t *x = ud;
    if (it->what == MT_LINE_RAW &&
        (strstr(it->text, "\"type\":\"hello\"") || strstr(it->text, "\"type\":\"exit\"") ||
         strstr(it->text, "\"type\":\"gap\"")))
        return 0;
    if (x->n == x->cap) {
        x->cap = x->cap ? 2 * x->cap : 1024;
        x->v = realloc(x->v, x->cap * sizeof *x->v);
        x->text = realloc(x->text, x->cap * sizeof *x->text);
        assert_true(x->v && x->text);
    }
    x->v[x->n] = *it;
    x->text[x->n] = it->text ? strndup(it->text, it->len) : NULL;
    x->n++;
    return 0;
}

static void read_items(const char *path, bool fast, int threads, items_t *x)
{
    memset(x, 0, sizeof *x);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    mt__lines_pipe_cfg_t pc = {.max = 65536, .fast = fast, .threads = threads};
    assert_int_equal(mt__lines_pipe_run(f, &pc, keep_item, x, NULL), 0);
    fclose(f);
}

static void items_free(items_t *x)
{
    for (size_t i = 0; i < x->n; i++)
        free(x->text[i]);
    free(x->text);
    free(x->v);
}

static void test_items_are_the_ndjson_items(void **state)
{
    (void)state;
    char nd[108], bin[108];
    tmp_path(nd, sizeof nd, "items.ndjson");
    tmp_path(bin, sizeof bin, "items.bin");
    make_log(nd, MT_PROF_LOG_NDJSON, 4000, 1 << 16);
    make_log(bin, MT_PROF_LOG_BINARY, 4000, 1 << 16);
    for (int fast = 0; fast < 2; fast++) {
        items_t a, b;
        read_items(nd, fast, 2, &a);
        read_items(bin, fast, 1, &b);
        assert_int_equal(a.n, b.n);
        size_t events = 0;
        for (size_t i = 0; i < a.n; i++) {
            if (a.v[i].what != b.v[i].what)
                fail_msg("item %zu: %d (%s) against %d (%s)", i, a.v[i].what,
                         a.text[i] ? a.text[i] : "", b.v[i].what, b.text[i] ? b.text[i] : "");
            if (a.v[i].what == MT_LINE_EVENT) {
                events++;
                assert_int_equal(a.v[i].pid, b.v[i].pid);
                assert_memory_equal(&a.v[i].ev, &b.v[i].ev, sizeof a.v[i].ev);
            }
            if (a.text[i] || b.text[i])
                assert_string_equal(a.text[i] ? a.text[i] : "(none)",
                                    b.text[i] ? b.text[i] : "(none)");
        }
        /* the fast items are most of them, and the others are there too */
        assert_true(fast ? events > a.n / 2 : events == 0);
        items_free(&a);
        items_free(&b);
    }
    unlink(nd);
    unlink(bin);
}

/* ---- NDJSON -> binary -> NDJSON ---- */

static void round_trip(const char *path)
{
    char bin[108], back[108];
    tmp_path(bin, sizeof bin, "rt.mtlog");
    tmp_path(back, sizeof back, "rt.ndjson");
    FILE *in = fopen(path, "rb"), *out = fopen(bin, "wb");
    assert_true(in && out);
    uint64_t lines, events;
    assert_int_equal(mt__blog_from_ndjson(in, out, &lines, &events), 0);
    fclose(in);
    fclose(out);
    size_t n1, n2;
    char *a = slurp(path, &n1), *b = converted(bin, &n2);
    if (n1 > 0 && a[n1 - 1] != '\n') /* the last line gets its newline */
        assert_int_equal(n2, n1 + 1);
    else
        assert_int_equal(n2, n1);
    assert_memory_equal(a, b, n1);
    fprintf(stderr, "%s: %llu lines, %llu as events\n", path, (unsigned long long)lines,
            (unsigned long long)events);
    free(a);
    free(b);
    unlink(bin);
}

static void test_ndjson_round_trip(void **state)
{
    (void)state;
    static const char *const logs[] = {
        "tests/snapshot/data/frames_log.ndjson",
        "tests/prof/data/valid_daemon.ndjson",
        "tests/prof/data/invalid.ndjson",
        "tests/fuzz/corpus/report/stacks_valid.ndjson",
        "tests/fuzz/corpus/report/callsites.ndjson",
        "tests/fuzz/corpus/report/one_process.ndjson",
        "tests/fuzz/corpus/report/stacks_corrupt_table.ndjson",
    };
    for (size_t i = 0; i < sizeof logs / sizeof *logs; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", src_root, logs[i]);
        round_trip(path);
    }
    char nd[108];
    tmp_path(nd, sizeof nd, "rt-mix.ndjson");
    make_log(nd, MT_PROF_LOG_NDJSON, 3000, 1 << 16);
    round_trip(nd);
    unlink(nd);
}

/* ---- damage ---- */

typedef struct dmg_s {
    unsigned bad, events, lines;
    char first[256];
} dmg_t;

static int dmg_rec(void *ud, const mt__blog_rec_t *r, int32_t pid, const char *const *names)
{
    (void)pid;
    (void)names;
    dmg_t *d = ud;
    if (r->type == MT__BLOG_EVENT)
        d->events++;
    else
        d->lines++;
    return 0;
}

static int dmg_bad(void *ud, const char *msg)
{
    dmg_t *d = ud;
    if (d->bad++ == 0)
        snprintf(d->first, sizeof d->first, "%s", msg);
    return 0;
}

static dmg_t read_mem(const char *buf, size_t n)
{
    dmg_t d = {0};
    FILE *f = fmemopen((void *)buf, n, "rb");
    assert_non_null(f);
    int rc = mt__blog_read(f, NULL, 0, dmg_rec, dmg_bad, &d);
    assert_int_equal(rc, 0);
    fclose(f);
    return d;
}

/* Byte offsets of the log's blocks (its magic), up to max. */
static size_t blocks_of(const char *buf, size_t n, size_t *at, size_t max)
{
    size_t k = 0;
    for (size_t i = 0; i + 8 <= n && k < max; i++)
        if (memcmp(buf + i, "\x89MTLOG\r\n", 8) == 0)
            at[k++] = i;
    return k;
}

static void test_damage_read_around(void **state)
{
    (void)state;
    char bin[108];
    tmp_path(bin, sizeof bin, "dmg.mtlog");
    make_log(bin, MT_PROF_LOG_BINARY, 6000, 1 << 16);
    size_t n;
    char *log = slurp(bin, &n);
    dmg_t whole = read_mem(log, n);
    assert_int_equal(whole.bad, 0);
    size_t at[64];
    size_t nb = blocks_of(log, n, at, 64);
    assert_true(nb >= 6);

    /* a block cut in its middle, the next written after it (a write not cut back) */
    size_t cut = at[3] + (at[4] - at[3]) / 2;
    char *buf = malloc(n + 100);
    assert_non_null(buf);
    memcpy(buf, log, cut);
    memcpy(buf + cut, log + at[4], n - at[4]);
    dmg_t d = read_mem(buf, cut + n - at[4]);
    assert_int_equal(d.bad, 1);
    assert_non_null(strstr(d.first, "a block cut short where another begins"));
    assert_true(d.events < whole.events && d.events > whole.events * 9 / 10);

    /* the file cut in its last block */
    d = read_mem(log, n - 7);
    assert_int_equal(d.bad, 1);
    assert_non_null(strstr(d.first, "cut short by the end of the file"));
    assert_true(d.events + 8 >= whole.events);

    /* junk between two blocks, and at the start */
    memcpy(buf, log, at[2]);
    memset(buf + at[2], 'x', 100);
    memcpy(buf + at[2] + 100, log + at[2], n - at[2]);
    d = read_mem(buf, n + 100);
    assert_int_equal(d.bad, 1);
    assert_int_equal(d.events, whole.events);
    char expect[96];
    snprintf(expect, sizeof expect, "bytes %zu-%zu: not a block", at[2], at[2] + 100);
    assert_non_null(strstr(d.first, expect));

    /* a version this reader does not know: that block skipped, the others read */
    memcpy(buf, log, n);
    buf[at[1] + 8] = 2;
    d = read_mem(buf, n);
    assert_int_equal(d.bad, 1);
    assert_non_null(strstr(d.first, "format version"));
    assert_true(d.events < whole.events);

    /* a bad record type inside a block: the records before it kept, the next blocks read */
    memcpy(buf, log, n);
    {
        mt__blog_state_t st = {0};
        mt__blog_rec_t rec;
        const char *why;
        const unsigned char *q = (const unsigned char *)buf + at[2] + 24,
                            *e = (const unsigned char *)buf + at[3];
        for (int k = 0; k < 100 && q < e; k++)
            assert_int_equal(mt__blog_next(&st, &q, e, &rec, &why), 0);
        buf[(const char *)q - buf] = 0x7f; /* the 101st record's type */
    }
    d = read_mem(buf, n);
    assert_int_equal(d.bad, 1);
    assert_non_null(strstr(d.first, "an unknown record type; the rest of its block skipped"));
    assert_true(d.events > whole.events / 2 && d.events < whole.events);

    /* random mutations: never a crash, an overrun (ASan) or an endless read */
    for (int round = 0; round < 3000; round++) {
        memcpy(buf, log, n);
        size_t m = 1 + rnd() % 8, len = n;
        for (size_t k = 0; k < m; k++)
            buf[rnd() % len] = (char)rnd();
        if (rnd() % 4 == 0)
            len = rnd() % n;
        d = read_mem(buf, len);
        assert_true(d.events <= whole.events + 64);
    }
    free(buf);
    free(log);
    unlink(bin);
}

/* A binary log at the file size limit (ulimit -f) stops on a whole block. */
static void test_fsize_limit_whole_blocks(void **state)
{
    (void)state;
    char bin[108];
    tmp_path(bin, sizeof bin, "fsize.mtlog");
    unlink(bin);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(10);
        rl.rlim_cur = 16 * 1024;
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(11);
        mt_prof_cfg_t cfg = mt_prof_cfg_default();
        cfg.mode = MT_PROF_LOG;
        cfg.log_path = bin;
        cfg.stacks = MT_STACKS_OFF;
        cfg.drain_ms = 3600 * 1000;
        mt_prof_t *p = NULL;
        if (mt_prof_create(&p, &cfg) != 0)
            _exit(12);
        for (uint64_t i = 0; i < 20000; i++) {
            mt_event_rec_t ev = {.kind = i % 2 ? MT_EV_FREE_COMPLETED : MT_EV_ALLOC,
                                 .time_ns = 1000 + i * 7919,
                                 .addr = 0x10000 + (i * 2654435761u % 100000) * 512,
                                 .size = 512 + i % 1000};
            mt_prof_record(p, &ev);
            if (i % 256 == 0)
                mt_prof_flush(p);
        }
        mt_prof_flush(p);
        mt_prof_stats_t st;
        mt_prof_stats(p, &st);
        if (st.written == 0 || st.written >= 20000)
            _exit(13);
        mt_prof_destroy(&p);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    size_t n;
    char *log = slurp(bin, &n);
    assert_true(n > 0 && n <= 16 * 1024);
    dmg_t d = read_mem(log, n);
    assert_int_equal(d.bad, 0);
    assert_true(d.events > 0);
    free(log);
    unlink(bin);
}

int main(int argc, char **argv)
{
    src_root = argc > 1 ? argv[1] : ".";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binary_converts_to_the_ndjson),
        cmocka_unit_test(test_items_are_the_ndjson_items),
        cmocka_unit_test(test_ndjson_round_trip),
        cmocka_unit_test(test_damage_read_around),
        cmocka_unit_test(test_fsize_limit_whole_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
