/* The event line writers against a frozen copy of the encoder whose lines the readers, the
 * daemon's log and every stored log were made with (encode_ref.inc, the writer before it
 * wrote numbers a word at a time): byte for byte the same lines and the same return values
 * (line length, or the room asked for), over every event kind, mark, pool and tag, numbers
 * at every digit count and at the edges (0, INT64_MAX and past it, UINT64_MAX, negative
 * pids and tags), names that need escaping or are not UTF-8, labels, stacks and gaps, and
 * random records. A changed byte in any line fails here. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/prof.h"
#include "mt_config.h"
#include "profiler/internal.h"
#include "tests/common/test_main.h"

/* The frozen encoder, its functions renamed (ref_*). */
#define mt__prof_tag_label  ref_tag_label
#define mt_prof_event_write ref_event_write
#define mt_prof_alloc_write ref_alloc_write
const char *ref_tag_label(int tag, const char *(*tag_name)(void *ud, int tag), void *ud,
                          char buf[MT__PROF_TAG_LABEL_MAX]);
size_t ref_event_write(char *buf, size_t cap, const mt_event_rec_t *ev, int pid,
                       const char *(*tag_name)(void *ud, int tag), void *ud);
size_t ref_alloc_write(char *buf, size_t cap, const mt_event_rec_t *ev, int pid, uint32_t stack,
                       const char *(*tag_name)(void *ud, int tag), void *ud);
#include "encode_ref.inc"
#undef mt__prof_tag_label
#undef mt_prof_event_write
#undef mt_prof_alloc_write

#define CAP 16384

/* Tag names: none (built-in names, "tag<n>"), ones to escape, not UTF-8, long (past the
 * drainers' pieces, and past 1 KiB), empty (the default name then). */
static const char *name_of(void *ud, int tag)
{
    static char longer[200], huge[1500];
    if (longer[0] == '\0') {
        memset(longer, 'L', sizeof longer - 1);
        for (size_t i = 0; i < sizeof huge - 1; i++)
            huge[i] = "a\"\\\n\x01\xc3\xa9z"[i % 8];
    }
    static const char *const names[] = {"",
                                        "weights",
                                        "a\"b\\c/d",
                                        "\x01\x1f\x7f ctl",
                                        "\b\t\n\v\f\r",
                                        "caf\xc3\xa9 \xe2\x82\xac",
                                        "bad\xff\xc3",
                                        "\xf0\x9f\x98\x80",
                                        "\xed\xa0\x80 surrogate",
                                        NULL,
                                        longer,
                                        huge};
    int set = *(const int *)ud;
    size_t n = sizeof names / sizeof names[0];
    return names[((size_t)tag + (size_t)set) % n];
}

static uint64_t xs(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* One writer (0: mt_prof_alloc_write, 1: the drainers' writer e, 2: mt_prof_event_write)
 * at room cap. */
static size_t write_with(int which, mt__prof_enc_t *e, char *buf, size_t cap,
                         const mt_event_rec_t *ev, uint32_t stack,
                         const char *(*tag_name)(void *, int), void *ud)
{
    char *b = cap ? buf : NULL;
    if (which == 0)
        return mt_prof_alloc_write(b, cap, ev, e->pid, stack, tag_name, ud);
    if (which == 1)
        return mt__prof_enc_write(e, buf, cap, ev, stack, tag_name, ud);
    return mt_prof_event_write(b, cap, ev, e->pid, tag_name, ud);
}

/* Every writer's line for ev against the frozen one's, at full room; for one record in
 * eight (by seq) also at the room the line asks for, one byte less, just the line's, none. */
static void expect_golden(mt__prof_enc_t *e, const mt_event_rec_t *ev, uint32_t stack,
                          const char *(*tag_name)(void *, int), void *ud)
{
    static char want[CAP], got[CAP];
    for (int which = 0; which < 3; which++) {
        uint32_t st = which == 2 ? 0 : stack;
        size_t nw = ref_alloc_write(want, CAP, ev, e->pid, st, tag_name, ud);
        size_t need = ref_alloc_write(NULL, 0, ev, e->pid, st, tag_name, ud);
        assert_true(nw < CAP && need <= CAP);
        const size_t caps[] = {CAP, need, need - 1, nw + 1, 0};
        for (size_t c = 0; c < (ev->seq % 8 == 0 ? sizeof caps / sizeof caps[0] : 1); c++) {
            size_t cap = caps[c];
            size_t nr = ref_alloc_write(cap ? want : NULL, cap, ev, e->pid, st, tag_name, ud);
            memset(got, 0x55, need + 64 < CAP ? need + 64 : CAP);
            size_t ng = write_with(which, e, got, cap, ev, st, tag_name, ud);
            if (ng != nr)
                fail_msg("writer %d, room %zu, kind %d tag %d: returned %zu, the frozen one %zu",
                         which, cap, ev->kind, ev->tag, ng, nr);
            if (nr < cap && memcmp(got, want, nr + 1) != 0)
                fail_msg("writer %d, kind %d tag %d pool %d, the frozen line then this one:\n%s%s",
                         which, ev->kind, ev->tag, ev->pool, want, got);
            /* the public writers change no byte past the NUL, as the frozen one */
            for (size_t i = nr + 1; which != 1 && nr < cap && i < need + 64 && i < CAP; i++)
                if (got[i] != 0x55)
                    fail_msg("writer %d, kind %d: byte %zu past the line changed", which, ev->kind,
                             i - nr);
        }
    }
}

/* Numbers at every decimal and hex digit count, and the edges. */
static uint64_t edge(size_t i)
{
    static uint64_t v[96];
    static size_t n;
    if (n == 0) {
        uint64_t p = 1;
        v[n++] = 0;
        for (int k = 1; k <= 19; k++) { /* 10^k - 1 and 10^k */
            p *= 10;
            v[n++] = p - 1;
            v[n++] = p;
        }
        for (int k = 1; k < 16; k++) { /* 16^k - 1 and 16^k */
            v[n++] = (UINT64_C(1) << (4 * k)) - 1;
            v[n++] = UINT64_C(1) << (4 * k);
        }
        v[n++] = UINT32_MAX;
        v[n++] = (uint64_t)INT64_MAX;
        v[n++] = (uint64_t)INT64_MAX + 1;
        v[n++] = UINT64_MAX;
        v[n++] = 0x7f0000000000ull;
        v[n++] = 0xa0b1c2d3e4f50617ull;
        v[n++] = 1000000000123456789ull;
    }
    return v[i % n];
}
#define EDGES 80 /* >= the values edge() holds */

static void fill_label(mt_event_rec_t *ev, int i)
{
    static const char *const labels[] = {
        "", "lbl", "a\"b\\c", "\x01\x1f\t\n", "caf\xc3\xa9", "bad\xff", "123456789012345678901234"};
    mt_event_label_pack(ev, labels[i % 7]);
}

/* Every kind, pool, tag and mark, each number field walking the edges, under each naming. */
static void test_every_kind_edges(void **state)
{
    (void)state;
    static mt__prof_enc_t e;
    static const int pids[] = {0, 1, 4242, -1, INT_MAX, INT_MIN};
    for (int set = -1; set < 12; set++) {
        const char *(*tn)(void *, int) = set < 0 ? NULL : name_of;
        mt__prof_enc_init(&e, pids[(set + 1) % 6]);
        for (int kind = 0; kind < MT_EV_KIND_COUNT; kind++)
            for (int tag = 0; tag < MT_TAG_MAX; tag++) {
                mt_event_rec_t ev;
                memset(&ev, 0, sizeof ev);
                ev.kind = (uint8_t)kind;
                ev.tag = (uint8_t)tag;
                ev.pool = (uint8_t)(tag % (MT_POOL_HOST + 1));
                ev.device = (uint8_t)(tag * 37);
                for (size_t i = 0; i < EDGES; i += 1 + (size_t)(set > 2) * 3) {
                    ev.seq = edge(i);
                    ev.time_ns = edge(i + 1);
                    ev.addr = kind == MT_EV_MARK ? i % (MT_MARK_WARMUP_END + 2) : edge(i + 2);
                    ev.size = edge(i + 3);
                    ev.requested = edge(i + 4);
                    ev.allocated = edge(i + 5);
                    ev.reserved = edge(i + 6);
                    ev.stream = (uint32_t)edge(i + 7);
                    if (kind == MT_EV_TAG_LABEL || kind == MT_EV_MARK_NAMED ||
                        kind == MT_EV_LIBRARY_LABEL)
                        fill_label(&ev, (int)i);
                    uint32_t stack = i % 3 == 0 ? 0 : (uint32_t)edge(i + 8);
                    expect_golden(&e, &ev, stack, tn, &set);
                }
            }
    }
}

/* Random records, every field of any width, pools and devices past their ranges too: 12
 * rounds of 20 000, 4 where each instruction costs 10-50x (MT_TEST_LIGHT: sanitizers, qemu). */
static void test_random(void **state)
{
    (void)state;
    static mt__prof_enc_t e;
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (int round = 0; round < (MT_TEST_LIGHT ? 4 : 12); round++) {
        int set = round;
        mt__prof_enc_init(&e, (int)(uint32_t)xs(&s) >> (xs(&s) % 32));
        for (int i = 0; i < 20000; i++) {
            mt_event_rec_t ev;
            uint64_t *f = &ev.seq;
            for (int k = 0; k < 7; k++)
                f[k] = xs(&s) >> (xs(&s) % 64);
            ev.stream = (uint32_t)(xs(&s) >> (xs(&s) % 64));
            ev.kind = (uint8_t)(xs(&s) % MT_EV_KIND_COUNT);
            ev.pool = (uint8_t)(xs(&s) % (MT_POOL_HOST + 3));
            ev.tag = (uint8_t)(xs(&s) % (MT_TAG_MAX + 2));
            ev.device = (uint8_t)xs(&s);
            if (ev.kind == MT_EV_MARK)
                ev.addr = xs(&s) % (MT_MARK_WARMUP_END + 2);
            if (ev.kind == MT_EV_TAG_LABEL || ev.kind == MT_EV_MARK_NAMED ||
                ev.kind == MT_EV_LIBRARY_LABEL)
                fill_label(&ev, i);
            expect_golden(&e, &ev, xs(&s) % 2 ? (uint32_t)xs(&s) : 0, name_of, &set);
        }
    }
}

/* The name of a tag without one: "tag<n>", every sign and width. */
static void test_tag_label(void **state)
{
    (void)state;
    for (int64_t t = INT_MIN; t <= INT_MAX; t += t < -1000 || t > 1000 ? 65537 * 3 : 1) {
        char a[MT__PROF_TAG_LABEL_MAX], b[MT__PROF_TAG_LABEL_MAX];
        assert_string_equal(mt__prof_tag_label((int)t, NULL, NULL, a),
                            ref_tag_label((int)t, NULL, NULL, b));
    }
    char a[MT__PROF_TAG_LABEL_MAX], b[MT__PROF_TAG_LABEL_MAX];
    assert_string_equal(mt__prof_tag_label(INT_MAX, NULL, NULL, a),
                        ref_tag_label(INT_MAX, NULL, NULL, b));
    assert_string_equal(mt__prof_tag_label(INT_MIN, NULL, NULL, a), "tag-2147483648");
}

/* Two lines as they stand in logs today, whatever both writers do. */
static void test_fixed_lines(void **state)
{
    (void)state;
    static mt__prof_enc_t e;
    mt__prof_enc_init(&e, 12345);
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = MT_EV_ALLOC;
    ev.pool = MT_POOL_LARGE;
    ev.tag = MT_TAG_ACTIVATIONS;
    ev.seq = 123456;
    ev.time_ns = 1000000350;
    ev.addr = 0x7f0000000000u;
    ev.size = ev.requested = ev.allocated = 524288;
    ev.reserved = 67108864;
    char got[1024];
    const char *want =
        "{\"v\":1,\"type\":\"event\",\"seq\":123456,\"t_ns\":1000000350,\"pid\":12345,\"dev\":0,"
        "\"kind\":\"alloc\",\"addr\":\"0x7f0000000000\",\"size\":524288,\"requested\":524288,"
        "\"pool\":\"large\",\"tag\":\"activations\",\"tag_id\":4,\"stream\":0,"
        "\"allocated\":524288,\"reserved\":67108864}\n";
    assert_int_equal(mt__prof_enc_write(&e, got, sizeof got, &ev, 0, NULL, NULL), strlen(want));
    assert_string_equal(got, want);
    ev.seq = UINT64_MAX;
    ev.addr = UINT64_MAX;
    ev.size = (uint64_t)INT64_MAX + 1;
    ev.stream = UINT32_MAX;
    ev.device = 255;
    want = "{\"v\":1,\"type\":\"event\",\"seq\":9223372036854775807,\"t_ns\":1000000350,"
           "\"pid\":-7,\"dev\":255,\"kind\":\"alloc\",\"addr\":\"0xffffffffffffffff\","
           "\"size\":9223372036854775807,\"requested\":524288,\"pool\":\"large\","
           "\"tag\":\"activations\",\"tag_id\":4,\"stream\":4294967295,\"allocated\":524288,"
           "\"reserved\":67108864,\"stack\":4294967295}\n";
    assert_int_equal(mt_prof_alloc_write(got, sizeof got, &ev, -7, UINT32_MAX, NULL, NULL),
                     strlen(want));
    assert_string_equal(got, want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind_edges),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_tag_label),
        cmocka_unit_test(test_fixed_lines),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
