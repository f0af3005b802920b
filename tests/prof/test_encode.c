/* The event line writer (mt_prof_event_write), the one encoder of events: every line it
 * writes is one compact JSON object that jansson parses and mt_prof_event_from_json turns
 * back into the same record, over every kind, mark, pool, tag and the extreme values;
 * names are escaped into valid JSON and UTF-8; a buffer too small is reported, never
 * overrun. (Schema validation of its output, with ajv, is the prof_schema test.) */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/prof.h"
#include "profiler/internal.h"
#include "tests/common/test_main.h"

#define LINE_CAP 1024 /* the header's promise for tag names under 64 bytes */

/* Writes ev, checks the line's framing, parses it (strictly: one object, no duplicate
 * keys, valid UTF-8). New json_t. */
static json_t *write_parse(const mt_event_rec_t *ev, int pid,
                           const char *(*tag_name)(void *ud, int tag), void *ud)
{
    char buf[LINE_CAP];
    size_t n = mt_prof_event_write(buf, sizeof buf, ev, pid, tag_name, ud);
    assert_true(n > 2 && n < sizeof buf);
    assert_int_equal(strlen(buf), n);
    assert_int_equal(buf[n - 1], '\n');
    assert_null(memchr(buf, '\n', n - 1));
    json_error_t e;
    json_t *j = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &e);
    if (!j)
        fail_msg("%s: %s", e.text, buf);
    assert_true(json_is_object(j));
    return j;
}

/* The record back from its line; its pid through *pid. */
static void roundtrip(const mt_event_rec_t *ev, int pid, mt_event_rec_t *back, int *pid_back)
{
    json_t *j = write_parse(ev, pid, NULL, NULL);
    char err[128] = "";
    int rc = mt_prof_event_from_json(j, back, pid_back, err, sizeof err);
    if (rc != 0)
        fail_msg("decode: %s", err);
    json_decref(j);
}

static void expect_same(const mt_event_rec_t *ev, int pid)
{
    mt_event_rec_t back;
    int pid_back = 0;
    roundtrip(ev, pid, &back, &pid_back);
    assert_int_equal(pid_back, pid);
    assert_memory_equal(&back, ev, sizeof back);
}

static mt_event_rec_t sample(int kind, int tag, int pool)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof ev);
    ev.seq = (uint64_t)kind * 100000 + (uint64_t)tag * 10 + (uint64_t)pool;
    ev.time_ns = UINT64_C(123456789012345) + (uint64_t)tag;
    ev.addr = kind == MT_EV_MARK ? (uint64_t)(1 + tag % MT_MARK_WARMUP_END)
                                 : UINT64_C(0x7f12345678c0) + (uint64_t)tag * 512;
    ev.size = UINT64_C(4096) << (tag % 30);
    ev.requested = ev.size - (uint64_t)tag;
    ev.allocated = UINT64_C(1) << 33;
    ev.reserved = UINT64_C(3) << 33;
    ev.stream = (uint32_t)tag * 0x9e3779b9u;
    ev.kind = (uint8_t)kind;
    ev.pool = (uint8_t)pool;
    ev.tag = (uint8_t)tag;
    ev.device = (uint8_t)(tag * 37);
    return ev;
}

static void test_every_kind_tag_pool(void **state)
{
    (void)state;
    for (int kind = MT_EV_ALLOC; kind < MT_EV_GAP; kind++)
        for (int tag = 0; tag < MT_TAG_MAX; tag++)
            for (int pool = MT_POOL_NONE; pool <= MT_POOL_HOST; pool++) {
                mt_event_rec_t ev = sample(kind, tag, pool);
                expect_same(&ev, 4242 + tag);
            }
}

/* The line is canonical compact JSON: jansson, which keeps members in insertion order,
 * dumps the parsed object back to the same bytes. */
static void test_compact_canonical(void **state)
{
    (void)state;
    for (int kind = MT_EV_ALLOC; kind <= MT_EV_GAP; kind++) {
        mt_event_rec_t ev = sample(kind, kind * 2, kind % 4);
        if (kind == MT_EV_GAP)
            ev.size = 9;
        char buf[LINE_CAP];
        size_t n = mt_prof_event_write(buf, sizeof buf, &ev, 77, NULL, NULL);
        assert_true(n > 0 && n < sizeof buf);
        json_t *j = json_loadb(buf, n, 0, NULL);
        assert_non_null(j);
        char *again = json_dumps(j, JSON_COMPACT);
        assert_non_null(again);
        buf[n - 1] = '\0';
        assert_string_equal(again, buf);
        assert_string_equal(json_string_value(json_object_get(j, "type")),
                            kind == MT_EV_GAP ? "gap" : "event");
        free(again);
        json_decref(j);
    }
}

static void test_every_mark(void **state)
{
    (void)state;
    for (int m = MT_MARK_ITERATION; m <= MT_MARK_WARMUP_END; m++) {
        mt_event_rec_t ev = sample(MT_EV_MARK, 3, MT_POOL_NONE);
        ev.addr = (uint64_t)m;
        ev.size = 1000 + (uint64_t)m; /* the marker's payload */
        json_t *j = write_parse(&ev, 5, NULL, NULL);
        assert_string_equal(json_string_value(json_object_get(j, "mark")), mt_mark_name(m));
        assert_null(json_object_get(j, "addr"));
        json_decref(j);
        expect_same(&ev, 5);
    }
}

static void test_extremes(void **state)
{
    (void)state;
    mt_event_rec_t zero = {.kind = MT_EV_ALLOC};
    expect_same(&zero, 0);
    json_t *j = write_parse(&zero, 0, NULL, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "addr")), "0x0");
    json_decref(j);

    /* The largest values the decoder can hold come back exactly. */
    mt_event_rec_t ev = {
        .seq = (uint64_t)INT64_MAX,
        .time_ns = (uint64_t)INT64_MAX,
        .addr = UINT64_MAX,
        .size = (uint64_t)INT64_MAX,
        .requested = (uint64_t)INT64_MAX,
        .allocated = (uint64_t)INT64_MAX,
        .reserved = (uint64_t)INT64_MAX - 1,
        .stream = UINT32_MAX,
        .kind = MT_EV_OOM,
        .pool = MT_POOL_HOST,
        .tag = MT_TAG_MAX - 1,
        .device = UINT8_MAX,
    };
    expect_same(&ev, INT_MAX);
    expect_same(&ev, -1);
    expect_same(&ev, INT_MIN);
    /* The widest line (every number at its widest) is within the capacity asked for. */
    mt_event_rec_t wide = ev;
    wide.seq = wide.time_ns = UINT64_MAX;
    wide.kind = MT_EV_FREE_REQUESTED;
    char line[LINE_CAP];
    size_t n = mt_prof_event_write(line, sizeof line, &wide, INT_MIN, NULL, NULL);
    assert_true(n < sizeof line);
    assert_true(n < mt_prof_event_write(NULL, 0, &wide, INT_MIN, NULL, NULL));
    j = write_parse(&ev, 1, NULL, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "addr")), "0xffffffffffffffff");
    json_decref(j);

    /* Above INT64_MAX (never a real count) saturates: what jansson can read. */
    mt_event_rec_t big = ev;
    big.seq = UINT64_MAX;
    big.time_ns = (uint64_t)INT64_MAX + 1;
    big.size = UINT64_MAX;
    big.allocated = UINT64_MAX - 1;
    big.reserved = UINT64_MAX;
    big.requested = UINT64_C(1) << 63;
    mt_event_rec_t back;
    int pid = 0;
    roundtrip(&big, 3, &back, &pid);
    mt_event_rec_t want = ev;
    want.reserved = (uint64_t)INT64_MAX;
    assert_memory_equal(&back, &want, sizeof back);
}

/* Every digit count of the decimal and hex writers: 10^k - 1, 10^k, 10^k + 1 in the byte
 * counts, 16^k - 1 and 16^k in the address, the pid at every power of ten too. */
static void test_digit_boundaries(void **state)
{
    (void)state;
    uint64_t p10 = 1;
    for (int k = 0; k <= 18; k++, p10 *= 10) {
        mt_event_rec_t ev = sample(MT_EV_SEGMENT_ALLOC, k, MT_POOL_LARGE);
        ev.seq = p10;
        ev.time_ns = p10 - 1;
        ev.size = p10 + 1;
        ev.requested = p10 * 9;
        ev.allocated = p10 * 2 - 1;
        ev.reserved = p10 / 2;
        ev.stream = (uint32_t)(p10 > UINT32_MAX ? UINT32_MAX : p10 - 1);
        ev.device = (uint8_t)(p10 > 100 ? 255 : p10 + 9);
        ev.addr = k < 16 ? (UINT64_C(1) << (4 * k)) : UINT64_MAX >> (4 * (k - 16));
        expect_same(&ev, (int)(p10 > INT32_MAX ? INT32_MAX : p10));
        ev.addr = k < 16 ? (UINT64_C(1) << (4 * k)) - 1 : ev.addr - 1;
        expect_same(&ev, -(int)(p10 > INT32_MAX ? INT32_MAX : p10 - 1));
        /* The digits themselves, not only the round trip. */
        json_t *j = write_parse(&ev, 1, NULL, NULL);
        assert_int_equal(json_integer_value(json_object_get(j, "seq")), p10);
        assert_int_equal(json_integer_value(json_object_get(j, "t_ns")), p10 - 1);
        char hex[24];
        snprintf(hex, sizeof hex, "0x%llx", (unsigned long long)ev.addr);
        assert_string_equal(json_string_value(json_object_get(j, "addr")), hex);
        json_decref(j);
    }
}

static void test_gap(void **state)
{
    (void)state;
    mt_event_rec_t ev = {.kind = MT_EV_GAP, .seq = 77, .time_ns = 5, .size = 12};
    json_t *j = write_parse(&ev, 9, NULL, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "type")), "gap");
    assert_int_equal(json_integer_value(json_object_get(j, "lost")), 12);
    assert_null(json_object_get(j, "kind"));
    json_decref(j);
    expect_same(&ev, 9);
    /* The gap line carries only seq, t_ns, pid and lost: other fields are not kept. */
    mt_event_rec_t noisy = ev;
    noisy.addr = 1;
    noisy.tag = 3;
    noisy.allocated = 99;
    mt_event_rec_t back;
    int pid = 0;
    roundtrip(&noisy, 9, &back, &pid);
    assert_memory_equal(&back, &ev, sizeof back);
    ev.seq = (uint64_t)INT64_MAX;
    ev.time_ns = (uint64_t)INT64_MAX;
    ev.size = (uint64_t)INT64_MAX;
    expect_same(&ev, INT_MAX);
}

/* Kinds, marks and tags outside their enums are still written as valid JSON ("unknown",
 * "tag<n>"); the decoder refuses them, naming the field. */
static void expect_refused(const mt_event_rec_t *ev, const char *field)
{
    json_t *j = write_parse(ev, 1, NULL, NULL);
    mt_event_rec_t back;
    char err[128] = "";
    assert_int_equal(mt_prof_event_from_json(j, &back, NULL, err, sizeof err), MT_EPROTO);
    assert_non_null(strstr(err, field));
    json_decref(j);
}

static void test_out_of_range(void **state)
{
    (void)state;
    mt_event_rec_t ev = sample(MT_EV_ALLOC, 1, MT_POOL_SMALL);
    ev.kind = 0;
    expect_refused(&ev, "kind");
    ev.kind = 40;
    expect_refused(&ev, "kind");
    ev.kind = UINT8_MAX;
    expect_refused(&ev, "kind");
    /* mt_pool_name names any other pool "none": it reads back as MT_POOL_NONE. */
    for (int pool = MT_POOL_HOST + 1; pool <= UINT8_MAX; pool += 63) {
        ev = sample(MT_EV_ALLOC, 1, pool);
        mt_event_rec_t back;
        int pid = 0;
        roundtrip(&ev, 1, &back, &pid);
        assert_int_equal(back.pool, MT_POOL_NONE);
        back.pool = ev.pool;
        assert_memory_equal(&back, &ev, sizeof back);
    }
    ev = sample(MT_EV_MARK, 1, MT_POOL_NONE);
    ev.addr = 0;
    expect_refused(&ev, "mark");
    ev.addr = UINT64_MAX;
    expect_refused(&ev, "mark");
    for (int tag = MT_TAG_MAX; tag <= UINT8_MAX; tag += 37) {
        ev = sample(MT_EV_FREE_COMPLETED, 0, MT_POOL_LARGE);
        ev.tag = (uint8_t)tag;
        json_t *j = write_parse(&ev, 1, NULL, NULL);
        char want[16];
        snprintf(want, sizeof want, "tag%d", tag);
        assert_string_equal(json_string_value(json_object_get(j, "tag")), want);
        json_decref(j);
        expect_refused(&ev, "tag_id");
    }
}

/* ---- tag names ---- */

typedef struct names_s {
    const char *user; /* the name of MT_TAG_USER_FIRST */
} names_t;

static const char *names(void *ud, int tag)
{
    const names_t *n = ud;
    if (tag == MT_TAG_USER_FIRST)
        return n->user;
    if (tag == MT_TAG_USER_FIRST + 2)
        return ""; /* empty: falls back like NULL */
    return NULL;
}

/* The tag name of ev written with user name `name`, parsed back by jansson. */
static void expect_tag(const char *name, const char *want)
{
    names_t n = {name};
    mt_event_rec_t ev = sample(MT_EV_ALLOC, MT_TAG_USER_FIRST, MT_POOL_LARGE);
    json_t *j = write_parse(&ev, 1, names, &n);
    assert_string_equal(json_string_value(json_object_get(j, "tag")), want);
    assert_int_equal(json_integer_value(json_object_get(j, "tag_id")), MT_TAG_USER_FIRST);
    mt_event_rec_t back;
    assert_int_equal(mt_prof_event_from_json(j, &back, NULL, NULL, 0), 0);
    assert_memory_equal(&back, &ev, sizeof back);
    json_decref(j);
}

static void test_tag_names(void **state)
{
    (void)state;
    names_t n = {"kv_cache"};
    mt_event_rec_t ev = sample(MT_EV_ALLOC, MT_TAG_WEIGHTS, MT_POOL_SMALL);
    json_t *j = write_parse(&ev, 1, names, &n);
    assert_string_equal(json_string_value(json_object_get(j, "tag")), "weights");
    json_decref(j);
    expect_tag("kv_cache", "kv_cache");
    ev.tag = MT_TAG_USER_FIRST + 1;
    j = write_parse(&ev, 1, names, &n);
    assert_string_equal(json_string_value(json_object_get(j, "tag")), "tag8");
    json_decref(j);
    ev.tag = MT_TAG_USER_FIRST + 2;
    j = write_parse(&ev, 1, names, &n);
    assert_string_equal(json_string_value(json_object_get(j, "tag")), "tag9");
    json_decref(j);
}

static void test_tag_name_escapes(void **state)
{
    (void)state;
    expect_tag("a\"b\\c/d", "a\"b\\c/d");
    expect_tag("\b\t\n\v\f\r\x01\x1f\x7f", "\b\t\n\v\f\r\x01\x1f\x7f");
    /* Valid UTF-8 of 2, 3 and 4 bytes passes as is. */
    expect_tag("gr\xc3\xb6\xc3\x9f"
               "e \xe2\x82\xac \xf0\x9f\x98\x80",
               "gr\xc3\xb6\xc3\x9f"
               "e \xe2\x82\xac \xf0\x9f\x98\x80");
    /* Invalid bytes become U+FFFD (EF BF BD), one per byte: a lone continuation, an
     * overlong '/', a surrogate, a sequence cut short, above U+10FFFF, 0xff. */
    expect_tag("a\x80z", "a\xef\xbf\xbdz");
    expect_tag("\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd");
    expect_tag("\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    expect_tag("x\xe2\x82", "x\xef\xbf\xbd\xef\xbf\xbd");
    expect_tag("\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    expect_tag("\xff", "\xef\xbf\xbd");
    /* 63 bytes that all need 6: still within LINE_CAP (write_parse asserts it). */
    char worst[64];
    memset(worst, 0x01, 63);
    worst[63] = '\0';
    expect_tag(worst, worst);
}

/* ---- capacity ---- */

static void test_capacity(void **state)
{
    (void)state;
    mt_event_rec_t ev = sample(MT_EV_SEGMENT_UNMAP, 5, MT_POOL_LARGE);
    char line[LINE_CAP];
    size_t n = mt_prof_event_write(line, sizeof line, &ev, 1, NULL, NULL);
    assert_true(n > 0 && n < sizeof line);
    size_t need = mt_prof_event_write(NULL, 0, &ev, 1, NULL, NULL);
    assert_true(need > n);
    /* Too small: says so with a capacity that is enough, and writes nothing. */
    char buf[LINE_CAP + 16];
    for (size_t cap = 0; cap < need; cap += 7) {
        memset(buf, 0xAA, sizeof buf);
        size_t r = mt_prof_event_write(buf, cap, &ev, 1, NULL, NULL);
        assert_true(r >= cap);
        assert_true(r >= need);
        for (size_t i = 0; i < sizeof buf; i++)
            assert_int_equal((unsigned char)buf[i], 0xAA);
    }
    /* With that capacity, the same line; bytes past the NUL untouched. */
    memset(buf, 0xAA, sizeof buf);
    assert_int_equal(mt_prof_event_write(buf, need, &ev, 1, NULL, NULL), n);
    assert_memory_equal(buf, line, n + 1);
    for (size_t i = need; i < sizeof buf; i++)
        assert_int_equal((unsigned char)buf[i], 0xAA);
    /* Gaps too. */
    mt_event_rec_t gap = {.kind = MT_EV_GAP, .seq = 1, .size = 2};
    size_t gneed = mt_prof_event_write(NULL, 0, &gap, 1, NULL, NULL);
    assert_true(gneed > 0);
    assert_true(mt_prof_event_write(buf, gneed, &gap, 1, NULL, NULL) < gneed);
}

/* A user tag name longer than any fixed buffer: the reported capacity is enough. */
static void test_long_tag_name(void **state)
{
    (void)state;
    size_t len = 5000;
    char *name = malloc(len + 1);
    assert_non_null(name);
    for (size_t i = 0; i < len; i++)
        name[i] = (char)(i % 3 == 0 ? '"' : 'a' + i % 26);
    name[len] = '\0';
    names_t nm = {name};
    mt_event_rec_t ev = sample(MT_EV_ALLOC, MT_TAG_USER_FIRST, MT_POOL_SMALL);
    char small[LINE_CAP];
    size_t need = mt_prof_event_write(small, sizeof small, &ev, 1, names, &nm);
    assert_true(need >= sizeof small);
    char *buf = malloc(need);
    assert_non_null(buf);
    size_t n = mt_prof_event_write(buf, need, &ev, 1, names, &nm);
    assert_true(n < need);
    json_t *j = json_loadb(buf, n, JSON_REJECT_DUPLICATES, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "tag")), name);
    mt_event_rec_t back;
    assert_int_equal(mt_prof_event_from_json(j, &back, NULL, NULL, 0), 0);
    assert_memory_equal(&back, &ev, sizeof back);
    json_decref(j);
    free(buf);
    free(name);
}

/* ---- tag labels (MT_EV_TAG_LABEL) ---- */

/* A label announcement with label packed, as the allocator emits it. */
static mt_event_rec_t label_event(int tag, const char *label)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof ev);
    ev.seq = 77;
    ev.time_ns = 123456789;
    ev.kind = MT_EV_TAG_LABEL;
    ev.tag = (uint8_t)tag;
    ev.device = 3;
    mt_event_label_pack(&ev, label);
    return ev;
}

/* The label goes out as "label" (its own, whatever tag_name says) and comes back to the
 * same record, for short labels, exactly 24 bytes, and JSON escapes. */
static void test_label_roundtrip(void **state)
{
    (void)state;
    static const char *const labels[] = {
        "logits",
        "x",
        "exactly_twenty_four_byte",
        "quote\"back\\slash",
        "gr\xc3\xb6\xc3\x9f"
        "e",
    };
    for (size_t i = 0; i < sizeof labels / sizeof labels[0]; i++) {
        int tag = MT_TAG_USER_FIRST + (int)i;
        mt_event_rec_t ev = label_event(tag, labels[i]);
        expect_same(&ev, 99);
        names_t override = {.user = "override"}; /* the line ignores tag_name */
        json_t *j = write_parse(&ev, 99, names, &override);
        assert_string_equal(json_string_value(json_object_get(j, "kind")), "tag_label");
        assert_string_equal(json_string_value(json_object_get(j, "label")), labels[i]);
        assert_int_equal(json_integer_value(json_object_get(j, "tag_id")), tag);
        assert_null(json_object_get(j, "addr"));
        json_decref(j);
        char back[MT_EVENT_LABEL_MAX + 1];
        assert_int_equal(mt_event_label_unpack(&ev, back), strlen(labels[i]));
        assert_string_equal(back, labels[i]);
    }
}

/* Longer labels are cut at 24 bytes, never inside a UTF-8 character. */
static void test_label_truncation(void **state)
{
    (void)state;
    char back[MT_EVENT_LABEL_MAX + 1];
    mt_event_rec_t ev = label_event(9, "a_label_much_longer_than_twenty_four_bytes");
    assert_int_equal(mt_event_label_unpack(&ev, back), MT_EVENT_LABEL_MAX);
    assert_string_equal(back, "a_label_much_longer_than");
    /* 23 ASCII bytes then a 2-byte character: it would end at byte 25, so it goes. */
    ev = label_event(9, "abcdefghijklmnopqrstuvw\xc3\xa9z");
    assert_int_equal(mt_event_label_unpack(&ev, back), 23);
    assert_string_equal(back, "abcdefghijklmnopqrstuvw");
    /* Eight 3-byte characters fill 24 bytes exactly; a ninth is cut whole. */
    ev = label_event(9, "\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac"
                        "\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac");
    assert_int_equal(mt_event_label_unpack(&ev, back), 24);
    /* 22 ASCII + a 4-byte character: cut to 22. */
    ev = label_event(9, "abcdefghijklmnopqrstuv\xf0\x9f\x98\x80");
    assert_int_equal(mt_event_label_unpack(&ev, back), 22);
    expect_same(&ev, 1);
}

/* A label line with a built-in tag id or no label is refused by the decoder. */
static void test_label_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "{\"v\":1,\"type\":\"event\",\"seq\":1,\"t_ns\":1,\"pid\":1,\"dev\":0,"
        "\"kind\":\"tag_label\",\"tag_id\":2,\"label\":\"x\"}",
        "{\"v\":1,\"type\":\"event\",\"seq\":1,\"t_ns\":1,\"pid\":1,\"dev\":0,"
        "\"kind\":\"tag_label\",\"tag_id\":7,\"label\":\"\"}",
        "{\"v\":1,\"type\":\"event\",\"seq\":1,\"t_ns\":1,\"pid\":1,\"dev\":0,"
        "\"kind\":\"tag_label\",\"tag_id\":32,\"label\":\"x\"}",
        "{\"v\":1,\"type\":\"event\",\"seq\":1,\"t_ns\":1,\"pid\":1,\"dev\":0,"
        "\"kind\":\"tag_label\",\"tag_id\":7}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *j = json_loads(bad[i], 0, NULL);
        assert_non_null(j);
        mt_event_rec_t ev;
        char err[128] = "";
        assert_int_equal(mt_prof_event_from_json(j, &ev, NULL, err, sizeof err), MT_EPROTO);
        assert_true(strstr(err, "tag_id") != NULL || strstr(err, "label") != NULL);
        json_decref(j);
    }
}

/* ---- named marks (MT_EV_MARK_NAMED) ---- */

/* A named mark as the preload emits it: the name in addr/size, the allocator's totals. */
static mt_event_rec_t named_mark(const char *name)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof ev);
    ev.seq = 5;
    ev.time_ns = 987654321;
    ev.kind = MT_EV_MARK_NAMED;
    ev.device = 1;
    ev.allocated = UINT64_C(1) << 40;
    ev.reserved = (UINT64_C(1) << 40) + 512;
    mt_event_mark_name_pack(&ev, name);
    return ev;
}

/* The line carries the name and the totals, and comes back to the same record; names are
 * cut at 16 bytes, never inside a UTF-8 character. */
static void test_mark_named(void **state)
{
    (void)state;
    mt_event_rec_t ev = named_mark("epoch_end");
    expect_same(&ev, 42);
    json_t *j = write_parse(&ev, 42, NULL, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "kind")), "mark_named");
    assert_string_equal(json_string_value(json_object_get(j, "name")), "epoch_end");
    assert_true(json_integer_value(json_object_get(j, "reserved")) == (json_int_t)ev.reserved);
    assert_null(json_object_get(j, "addr"));
    assert_null(json_object_get(j, "tag"));
    json_decref(j);
    char back[MT_EVENT_LABEL_MAX + 1];
    ev = named_mark("a_name_longer_than_sixteen");
    assert_int_equal(ev.requested, 0);
    assert_int_equal(mt_event_label_unpack(&ev, back), MT_EVENT_MARK_NAME_MAX);
    assert_string_equal(back, "a_name_longer_th");
    expect_same(&ev, 1);
    ev = named_mark("abcdefghijklmno\xc3\xa9"); /* 15 + a 2-byte character: cut to 15 */
    assert_int_equal(mt_event_label_unpack(&ev, back), 15);
    expect_same(&ev, 1);
    static const char *const bad[] = {
        "{\"v\":1,\"type\":\"event\",\"seq\":1,\"t_ns\":1,\"pid\":1,\"dev\":0,"
        "\"kind\":\"mark_named\",\"allocated\":0,\"reserved\":0,\"name\":\"\"}",
        "{\"v\":1,\"type\":\"event\",\"seq\":1,\"t_ns\":1,\"pid\":1,\"dev\":0,"
        "\"kind\":\"mark_named\",\"allocated\":0,\"reserved\":0}",
        "{\"v\":1,\"type\":\"event\",\"seq\":1,\"t_ns\":1,\"pid\":1,\"dev\":0,"
        "\"kind\":\"mark_named\",\"name\":\"x\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *b = json_loads(bad[i], 0, NULL);
        assert_non_null(b);
        mt_event_rec_t out;
        char err[128] = "";
        assert_int_equal(mt_prof_event_from_json(b, &out, NULL, err, sizeof err), MT_EPROTO);
        assert_true(strstr(err, "name") != NULL || strstr(err, "allocated") != NULL);
        json_decref(b);
    }
}

/* ---- the drainers' writer (mt__prof_enc_write): the same bytes as the general one ---- */

/* Tag names that change when told to (as the stream's labels do), some to escape, some
 * too long for the writer's pieces, some empty (the default name then). */
typedef struct gen_names_s {
    int gen;
} gen_names_t;

static const char *gen_name(void *ud, int tag)
{
    static const char *const pool[] = {
        "",     "weights",  "a\"b\\c", "\x01ctl", "caf\xc3\xa9", "bad\xff",
        "tag3", "tab\tbed", NULL,      "x",       "activations"};
    static char longname[200];
    const gen_names_t *n = ud;
    int k = (tag * 7 + n->gen) % 13;
    if (k == 12) {
        memset(longname, 'L', sizeof longname - 1); /* past the writer's piece: general */
        longname[sizeof longname - 1] = '\0';
        return longname;
    }
    return k < 11 ? pool[k] : NULL;
}

static uint64_t xs(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A value of any width: the digit counts the writers handle differently. */
static uint64_t any_width(uint64_t *s)
{
    uint64_t v = xs(s);
    return v >> (xs(s) % 64);
}

static void expect_enc_same(mt__prof_enc_t *e, const mt_event_rec_t *ev, uint32_t stack,
                            gen_names_t *names, size_t cap)
{
    static char a[8192], b[8192];
    memset(a, 0x55, sizeof a);
    memset(b, 0x55, sizeof b);
    size_t na = mt_prof_alloc_write(a, cap, ev, e->pid, stack, gen_name, names);
    size_t nb = mt__prof_enc_write(e, b, cap, ev, stack, gen_name, names);
    if (na != nb || (na < cap && memcmp(a, b, na + 1) != 0))
        fail_msg("kind %d tag %d pool %d cap %zu: %zu vs %zu\n%.*s%.*s", ev->kind, ev->tag,
                 ev->pool, cap, na, nb, (int)(na < cap ? na : 0), a, (int)(nb < cap ? nb : 0), b);
    /* The general writer changes nothing past the NUL; the drainers' writer nothing past
     * the room the line asks for (below it, its scratch). */
    static char untouched[64];
    memset(untouched, 0x55, sizeof untouched);
    size_t need = mt_prof_alloc_write(NULL, 0, ev, e->pid, stack, gen_name, names);
    assert_memory_equal(a + (na < cap ? na + 1 : 0), untouched, 64);
    assert_memory_equal(b + (need < cap ? need : cap), untouched, 64);
    if (na < cap && ev->kind == MT_EV_ALLOC) { /* numbers as printf writes them */
        char want[96];
        snprintf(want, sizeof want, "\"seq\":%llu,\"t_ns\":%llu,", (unsigned long long)ev->seq,
                 (unsigned long long)ev->time_ns);
        if (ev->seq <= INT64_MAX && ev->time_ns <= INT64_MAX)
            assert_non_null(strstr(b, want));
        snprintf(want, sizeof want, "\"addr\":\"0x%llx\",\"size\":%llu,",
                 (unsigned long long)ev->addr, (unsigned long long)ev->size);
        if (ev->size <= INT64_MAX)
            assert_non_null(strstr(b, want));
        snprintf(want, sizeof want, "\"stream\":%u,", (unsigned)ev->stream);
        assert_non_null(strstr(b, want));
    }
}

/* 200 000 random records over every kind, pool, tag and pid sign, with stack ids, and tag
 * names that change between rounds (forget_tags): every line and every return value is the
 * general writer's; so is the room asked for when the buffer is too small. */
static void test_enc_same_bytes(void **state)
{
    (void)state;
    static mt__prof_enc_t e;
    gen_names_t names = {0};
    uint64_t s = 0x9e3779b97f4a7c15ull;
    static const int pids[] = {1, 4242, INT_MAX, INT_MIN, -7};
    for (int round = 0; round < 20; round++) {
        mt__prof_enc_init(&e, pids[round % 5]);
        names.gen = round;
        for (int i = 0; i < 10000; i++) {
            mt_event_rec_t ev;
            memset(&ev, 0, sizeof ev);
            ev.seq = any_width(&s);
            ev.time_ns = any_width(&s);
            ev.addr = any_width(&s);
            ev.size = any_width(&s);
            ev.requested = any_width(&s);
            ev.allocated = any_width(&s);
            ev.reserved = any_width(&s);
            ev.stream = (uint32_t)any_width(&s);
            ev.kind = (uint8_t)(xs(&s) % MT_EV_KIND_COUNT);
            ev.pool = (uint8_t)(xs(&s) % (MT_POOL_HOST + 1));
            ev.tag = (uint8_t)(xs(&s) % MT_TAG_MAX);
            ev.device = (uint8_t)xs(&s);
            if (ev.kind == MT_EV_MARK)
                ev.addr = 1 + xs(&s) % MT_MARK_WARMUP_END;
            if (ev.kind == MT_EV_TAG_LABEL || ev.kind == MT_EV_MARK_NAMED ||
                ev.kind == MT_EV_LIBRARY_LABEL) {
                mt_event_label_pack(&ev, "lbl");
                ev.requested = 0;
            }
            uint32_t stack = xs(&s) % 3 == 0 ? (uint32_t)xs(&s) : 0;
            expect_enc_same(&e, &ev, stack, &names, 8192);
            if (i % 97 == 0) /* a buffer too small, or just large enough */
                expect_enc_same(&e, &ev, stack, &names, 300 + xs(&s) % 900);
            if (i == 5000) { /* a label changed a name */
                names.gen++;
                mt__prof_enc_forget_tags(&e);
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind_tag_pool), cmocka_unit_test(test_compact_canonical),
        cmocka_unit_test(test_every_mark),          cmocka_unit_test(test_extremes),
        cmocka_unit_test(test_digit_boundaries),    cmocka_unit_test(test_gap),
        cmocka_unit_test(test_out_of_range),        cmocka_unit_test(test_tag_names),
        cmocka_unit_test(test_tag_name_escapes),    cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_long_tag_name),       cmocka_unit_test(test_label_roundtrip),
        cmocka_unit_test(test_label_truncation),    cmocka_unit_test(test_label_refused),
        cmocka_unit_test(test_mark_named),          cmocka_unit_test(test_enc_same_bytes),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
