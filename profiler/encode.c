/* The event line writer: the one encoder of event and gap records (schema v1,
 * docs/telemetry.md). The daemon's drain loop and the profiler's local-log drainer both
 * write every event through it, up to millions a second, so it writes bytes directly
 * into the caller's buffer: no allocation, no jansson object, no printf.
 *
 * Numbers follow what jansson (the decoder, mt_prof_event_from_json) can read back:
 * integers are signed 64-bit there, so byte counts above INT64_MAX (never real) saturate;
 * addresses are "0x..." strings and keep all 64 bits. Strings are escaped as JSON
 * requires; bytes that are not valid UTF-8 (only a user's tag name can hold any) become
 * U+FFFD so that every line is valid JSON. */
#include <string.h>

#include "profiler/internal.h"
#include "util/text.h"

/* The literal prefixes below write "v":1. */
_Static_assert(MT__PROF_SCHEMA_VERSION == 1, "event lines write the schema version literally");

/* Bytes of an event line besides its four names (kind, mark, pool, tag): keys,
 * punctuation, the names' quotes and every number at its widest come to 316; the margin
 * leaves room for a member added to the schema. */
#define FIXED_MAX 400
/* An escaped string is at most 6 bytes per input byte ("\u001f", "\ufffd"). */
#define ESC_MAX 6

/* "00" "01" ... "99": two digits per division. */
static const char pairs[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233"
    "34353637383940414243444546474849505152535455565758596061626364656667"
    "6869707172737475767778798081828384858687888990919293949596979899";

static int decimal_digits(uint64_t v)
{
    static const uint64_t pow10[20] = {
        1ull,
        10ull,
        100ull,
        1000ull,
        10000ull,
        100000ull,
        1000000ull,
        10000000ull,
        100000000ull,
        1000000000ull,
        10000000000ull,
        100000000000ull,
        1000000000000ull,
        10000000000000ull,
        100000000000000ull,
        1000000000000000ull,
        10000000000000000ull,
        100000000000000000ull,
        1000000000000000000ull,
        10000000000000000000ull,
    };
    /* bits * log10(2) (1233 / 4096) is the digit count or one less. */
    int t = ((64 - __builtin_clzll(v | 1)) * 1233) >> 12;
    return t + ((v | 1) >= pow10[t]); /* v | 1: 0 has one digit too */
}

/* v < 10^8 as exactly 8 digits: four independent divisions, not a chain of them. */
static void put8(char *p, uint32_t v)
{
    uint32_t hi = v / 10000, lo = v % 10000;
    memcpy(p, pairs + 2 * (hi / 100), 2);
    memcpy(p + 2, pairs + 2 * (hi % 100), 2);
    memcpy(p + 4, pairs + 2 * (lo / 100), 2);
    memcpy(p + 6, pairs + 2 * (lo % 100), 2);
}

/* Digits are written backwards from the end, which is known first: no reversal. */
static char *put_u64(char *w, uint64_t v)
{
    char *end = w + decimal_digits(v);
    char *p = end;
    while (v >= 100000000) {
        p -= 8;
        put8(p, (uint32_t)(v % 100000000));
        v /= 100000000;
    }
    uint32_t u = (uint32_t)v;
    while (u >= 100) {
        unsigned i = (u % 100) * 2;
        u /= 100;
        *--p = pairs[i + 1];
        *--p = pairs[i];
    }
    if (u >= 10) {
        *--p = pairs[u * 2 + 1];
        *--p = pairs[u * 2];
    } else {
        *--p = (char)('0' + u);
    }
    return end;
}

/* A byte count as an integer the decoder reads back: saturated at INT64_MAX. */
static char *put_sat(char *w, uint64_t v)
{
    return put_u64(w, v > (uint64_t)INT64_MAX ? (uint64_t)INT64_MAX : v);
}

static char *put_int(char *w, int64_t v)
{
    if (v < 0) {
        *w++ = '-';
        return put_u64(w, (uint64_t)0 - (uint64_t)v);
    }
    return put_u64(w, (uint64_t)v);
}

/* "00" "01" ... "ff": two hex digits per byte. */
static const char hex_pairs[513] =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
    "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f"
    "404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f"
    "606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f"
    "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f"
    "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf"
    "c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf"
    "e0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff";

/* Lowercase, no leading zeros, backwards a byte (two digits) at a time. */
static char *put_hex(char *w, uint64_t v)
{
    int n = v ? (64 - __builtin_clzll(v) + 3) / 4 : 1;
    *w++ = '"';
    *w++ = '0';
    *w++ = 'x';
    char *p = w + n;
    for (; p - w >= 2; v >>= 8) {
        p -= 2;
        memcpy(p, hex_pairs + 2 * (v & 0xff), 2);
    }
    if (p > w)
        *--p = hex_pairs[2 * (v & 15) + 1];
    w += n;
    *w++ = '"';
    return w;
}

#define LIT(w, s) (memcpy((w), (s), sizeof(s) - 1), (w) + sizeof(s) - 1)

/* A JSON string: at most ESC_MAX bytes per input byte plus the quotes. */
static char *put_str(char *w, const char *s)
{
    static const char hx[] = "0123456789abcdef";
    *w++ = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned char c = *p;
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') { /* the usual case */
            *w++ = (char)c;
            p++;
        } else if (c == '"' || c == '\\') {
            *w++ = '\\';
            *w++ = (char)c;
            p++;
        } else if (c < 0x20) {
            static const char esc[] = "btn_fr"; /* \b \t \n (\v has none) \f \r */
            *w++ = '\\';
            if (c >= '\b' && c <= '\r' && c != '\v') {
                *w++ = esc[c - '\b'];
            } else {
                w = LIT(w, "u00");
                *w++ = hx[c >> 4];
                *w++ = hx[c & 15];
            }
            p++;
        } else {
            int n = mt__text_utf8_len(p);
            if (n == 0) {
                w = LIT(w, "\\ufffd");
                p++;
            } else {
                memcpy(w, p, (size_t)n);
                w += n;
                p += n;
            }
        }
    }
    *w++ = '"';
    return w;
}

const char *mt__prof_tag_label(int tag, const char *(*tag_name)(void *ud, int tag), void *ud,
                               char buf[MT__PROF_TAG_LABEL_MAX])
{
    const char *s = tag_name ? tag_name(ud, tag) : NULL;
    if (s && *s)
        return s;
    if (tag >= 0 && tag < MT_TAG_USER_FIRST)
        return mt_tag_builtin_name(tag);
    char *w = LIT(buf, "tag");
    w = put_int(w, tag);
    *w = '\0';
    return buf;
}

static char *write_gap(char *w, const mt_event_rec_t *ev, int pid)
{
    w = LIT(w, "{\"v\":1,\"type\":\"gap\",\"seq\":");
    w = put_sat(w, ev->seq);
    w = LIT(w, ",\"t_ns\":");
    w = put_sat(w, ev->time_ns);
    w = LIT(w, ",\"pid\":");
    w = put_int(w, pid);
    w = LIT(w, ",\"lost\":");
    w = put_sat(w, ev->size);
    return LIT(w, "}\n");
}

/* What every event line starts with: version, type, sequence, time, process, device. */
static char *write_head(char *w, const mt_event_rec_t *ev, int pid)
{
    w = LIT(w, "{\"v\":1,\"type\":\"event\",\"seq\":");
    w = put_sat(w, ev->seq);
    w = LIT(w, ",\"t_ns\":");
    w = put_sat(w, ev->time_ns);
    w = LIT(w, ",\"pid\":");
    w = put_int(w, pid);
    w = LIT(w, ",\"dev\":");
    w = put_u64(w, ev->device);
    return w;
}

/* A user tag's label: the tag's name is the label it announces, whatever tag_name says,
 * so that the line states what the allocator registered. A named mark carries its name
 * the same way. */
static char *write_label(char *w, const mt_event_rec_t *ev, int pid, const char *label)
{
    w = write_head(w, ev, pid);
    if (ev->kind == MT_EV_MARK_NAMED) {
        /* Unlike a label, a named mark is a point of the allocator's timeline: its totals. */
        w = LIT(w, ",\"kind\":\"mark_named\",\"allocated\":");
        w = put_sat(w, ev->allocated);
        w = LIT(w, ",\"reserved\":");
        w = put_sat(w, ev->reserved);
        w = LIT(w, ",\"name\":");
    } else if (ev->kind == MT_EV_LIBRARY_LABEL) {
        w = LIT(w, ",\"kind\":\"library_label\",\"library_id\":");
        w = put_u64(w, ev->tag);
        w = LIT(w, ",\"label\":");
    } else {
        w = LIT(w, ",\"kind\":\"tag_label\",\"tag_id\":");
        w = put_u64(w, ev->tag);
        w = LIT(w, ",\"label\":");
    }
    w = put_str(w, label);
    return LIT(w, "}\n");
}

size_t mt_prof_event_write(char *buf, size_t cap, const mt_event_rec_t *ev, int pid,
                           const char *(*tag_name)(void *ud, int tag), void *ud)
{
    return mt_prof_alloc_write(buf, cap, ev, pid, 0, tag_name, ud);
}

size_t mt_prof_alloc_write(char *buf, size_t cap, const mt_event_rec_t *ev, int pid, uint32_t stack,
                           const char *(*tag_name)(void *ud, int tag), void *ud)
{
    if (ev->kind == MT_EV_STACK_REF) {
        if (!buf || cap <= FIXED_MAX)
            return FIXED_MAX + 1;
        char *w = write_head(buf, ev, pid);
        w = LIT(w, ",\"kind\":\"stack_ref\",\"addr\":");
        w = put_hex(w, ev->addr);
        w = LIT(w, ",\"pool\":");
        w = put_str(w, mt_pool_name(ev->pool));
        w = LIT(w, ",\"stack\":");
        w = put_sat(w, ev->size);
        w = LIT(w, "}\n");
        *w = '\0';
        return (size_t)(w - buf);
    }
    if (ev->kind == MT_EV_GAP) {
        if (!buf || cap <= FIXED_MAX)
            return FIXED_MAX + 1;
        char *w = write_gap(buf, ev, pid);
        *w = '\0';
        return (size_t)(w - buf);
    }
    if (ev->kind == MT_EV_TAG_LABEL || ev->kind == MT_EV_MARK_NAMED ||
        ev->kind == MT_EV_LIBRARY_LABEL) {
        char label[MT_EVENT_LABEL_MAX + 1];
        mt_event_label_unpack(ev, label);
        size_t need = FIXED_MAX + ESC_MAX * MT_EVENT_LABEL_MAX + 1;
        if (!buf || cap < need)
            return need;
        char *w = write_label(buf, ev, pid, label);
        *w = '\0';
        return (size_t)(w - buf);
    }
    char tagbuf[MT__PROF_TAG_LABEL_MAX];
    const char *kind = mt_event_kind_name(ev->kind);
    const char *mark = ev->kind == MT_EV_MARK ? mt_mark_name((int)ev->addr) : NULL;
    const char *pool = mt_pool_name(ev->pool);
    bool outside = ev->kind == MT_EV_OUTSIDE_ALLOC || ev->kind == MT_EV_OUTSIDE_FREE;
    const char *tag = outside ? "" : mt__prof_tag_label(ev->tag, tag_name, ud, tagbuf);
    size_t names = strlen(kind) + (mark ? strlen(mark) : 0) + strlen(pool) + strlen(tag);
    size_t need = FIXED_MAX + ESC_MAX * names + 1; /* + the NUL */
    if (!buf || cap < need)
        return need;
    char *w = buf;
    w = write_head(w, ev, pid);
    w = LIT(w, ",\"kind\":");
    w = put_str(w, kind);
    if (mark) {
        w = LIT(w, ",\"mark\":");
        w = put_str(w, mark);
    } else {
        w = LIT(w, ",\"addr\":");
        w = put_hex(w, ev->addr);
    }
    w = LIT(w, ",\"size\":");
    w = put_sat(w, ev->size);
    w = LIT(w, ",\"requested\":");
    w = put_sat(w, ev->requested);
    w = LIT(w, ",\"pool\":");
    w = put_str(w, pool);
    if (outside) { /* its tag is a library id (event.h), not the allocator's tag */
        w = LIT(w, ",\"library_id\":");
        w = put_u64(w, ev->tag);
    } else {
        w = LIT(w, ",\"tag\":");
        w = put_str(w, tag);
        w = LIT(w, ",\"tag_id\":");
        w = put_u64(w, ev->tag);
    }
    w = LIT(w, ",\"stream\":");
    w = put_u64(w, ev->stream);
    w = LIT(w, ",\"allocated\":");
    w = put_sat(w, ev->allocated);
    w = LIT(w, ",\"reserved\":");
    w = put_sat(w, ev->reserved);
    if (stack != 0 && ev->kind == MT_EV_ALLOC) {
        w = LIT(w, ",\"stack\":");
        w = put_u64(w, stack);
    }
    w = LIT(w, "}\n");
    *w = '\0';
    return (size_t)(w - buf);
}

/* ---- the drainers' line writer: the same lines, names prepared once ---- */

/* Kinds whose lines are the common shape (addr, sizes, pool, tag, totals). */
static bool common_shape(int kind)
{
    return kind > 0 && kind < MT_EV_KIND_COUNT && kind != MT_EV_MARK && kind != MT_EV_GAP &&
           kind != MT_EV_TAG_LABEL && kind != MT_EV_MARK_NAMED && kind != MT_EV_STACK_REF &&
           kind != MT_EV_OUTSIDE_ALLOC && kind != MT_EV_OUTSIDE_FREE && kind != MT_EV_LIBRARY_LABEL;
}

/* Copies the piece [from, w) into frag if it fits; its length, or 0. */
static uint8_t keep_piece(char *frag, size_t cap, const char *from, const char *w)
{
    size_t n = (size_t)(w - from);
    if (n >= cap || n > UINT8_MAX)
        return 0;
    memcpy(frag, from, n);
    return (uint8_t)n;
}

void mt__prof_enc_init(mt__prof_enc_t *e, int pid)
{
    char tmp[FIXED_MAX + ESC_MAX * 64];
    memset(e, 0, sizeof *e);
    e->pid = pid;
    char *w = LIT(tmp, ",\"pid\":");
    w = put_int(w, pid);
    w = LIT(w, ",\"dev\":");
    e->pid_len = keep_piece(e->pid_frag, sizeof e->pid_frag, tmp, w);
    for (int k = 0; k < MT_EV_KIND_COUNT; k++) {
        const char *name = common_shape(k) ? mt_event_kind_name(k) : NULL;
        if (name == NULL || strlen(name) > 48)
            continue;
        w = LIT(tmp, ",\"kind\":");
        w = put_str(w, name);
        w = LIT(w, ",\"addr\":");
        e->kind_len[k] = keep_piece(e->kind_frag[k], sizeof e->kind_frag[k], tmp, w);
        e->kind_name[k] = (uint8_t)strlen(name);
    }
    for (int pl = 0; pl <= MT_POOL_HOST; pl++) {
        const char *name = mt_pool_name(pl);
        if (strlen(name) > 48)
            continue;
        w = LIT(tmp, ",\"pool\":");
        w = put_str(w, name);
        e->pool_len[pl] = keep_piece(e->pool_frag[pl], sizeof e->pool_frag[pl], tmp, w);
        e->pool_name[pl] = (uint8_t)strlen(name);
    }
}

void mt__prof_enc_forget_tags(mt__prof_enc_t *e)
{
    e->tags_known = 0;
    e->tags_long = 0;
}

/* Fills tag t's piece from tag_name; false when the name is too long for it. */
static bool learn_tag(mt__prof_enc_t *e, int t, const char *(*tag_name)(void *ud, int tag),
                      void *ud)
{
    char tagbuf[MT__PROF_TAG_LABEL_MAX];
    const char *name = mt__prof_tag_label(t, tag_name, ud, tagbuf);
    uint32_t bit = UINT32_C(1) << t;
    e->tags_known |= bit;
    size_t len = strlen(name);
    if (len > (MT__PROF_ENC_TAG - 48) / ESC_MAX) {
        e->tags_long |= bit;
        return false;
    }
    e->tag_name[t] = (uint8_t)len;
    char tmp[MT__PROF_ENC_TAG + 64];
    char *w = LIT(tmp, ",\"tag\":");
    w = put_str(w, name);
    w = LIT(w, ",\"tag_id\":");
    w = put_u64(w, (uint64_t)t);
    w = LIT(w, ",\"stream\":");
    e->tag_len[t] = keep_piece(e->tag[t], sizeof e->tag[t], tmp, w);
    if (e->tag_len[t] == 0) {
        e->tags_long |= bit;
        return false;
    }
    return true;
}

#define PIECE(w, p, n) (memcpy((w), (p), (n)), (w) + (n))

size_t mt__prof_enc_write(mt__prof_enc_t *e, char *buf, size_t cap, const mt_event_rec_t *ev,
                          uint32_t stack, const char *(*tag_name)(void *ud, int tag), void *ud)
{
    int kind = ev->kind, tag = ev->tag;
    uint32_t bit = tag < MT_TAG_MAX ? UINT32_C(1) << tag : 0;
    if (kind >= MT_EV_KIND_COUNT || e->kind_len[kind] == 0 || ev->pool > MT_POOL_HOST ||
        e->pool_len[ev->pool] == 0 || bit == 0 || buf == NULL || (e->tags_long & bit) != 0 ||
        ((e->tags_known & bit) == 0 && !learn_tag(e, tag, tag_name, ud)))
        return mt_prof_alloc_write(buf, cap, ev, e->pid, stack, tag_name, ud);
    /* The room the general writer asks for, from the same names: the same answer. */
    size_t need =
        FIXED_MAX +
        ESC_MAX * ((size_t)e->kind_name[kind] + e->pool_name[ev->pool] + e->tag_name[tag]) + 1;
    if (cap < need)
        return need;
    char *w = LIT(buf, "{\"v\":1,\"type\":\"event\",\"seq\":");
    w = put_sat(w, ev->seq);
    w = LIT(w, ",\"t_ns\":");
    w = put_sat(w, ev->time_ns);
    w = PIECE(w, e->pid_frag, e->pid_len);
    w = put_u64(w, ev->device);
    w = PIECE(w, e->kind_frag[kind], e->kind_len[kind]);
    w = put_hex(w, ev->addr);
    w = LIT(w, ",\"size\":");
    w = put_sat(w, ev->size);
    w = LIT(w, ",\"requested\":");
    w = put_sat(w, ev->requested);
    w = PIECE(w, e->pool_frag[ev->pool], e->pool_len[ev->pool]);
    w = PIECE(w, e->tag[tag], e->tag_len[tag]);
    w = put_u64(w, ev->stream);
    w = LIT(w, ",\"allocated\":");
    w = put_sat(w, ev->allocated);
    w = LIT(w, ",\"reserved\":");
    w = put_sat(w, ev->reserved);
    if (stack != 0 && kind == MT_EV_ALLOC) {
        w = LIT(w, ",\"stack\":");
        w = put_u64(w, stack);
    }
    w = LIT(w, "}\n");
    *w = '\0';
    return (size_t)(w - buf);
}
