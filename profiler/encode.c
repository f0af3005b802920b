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

/* Numbers are written as whole 8-byte words (little-endian: the first character in the
 * lowest byte), so a number's store may reach up to 8 bytes past its last digit, and the
 * drainers' writer copies its prepared pieces MT__PROF_ENC_FRAG bytes at a time: bytes the
 * rest of the line overwrites. Past the line's end, the drainers' writer may leave such
 * bytes within the room it asks for (the widest line is 316 bytes besides names, FIXED_MAX
 * 400); the general writer writes its last number exactly and leaves none. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "encode.c writes digits as little-endian words"
#endif
#define OVERRUN 64
_Static_assert(316 + OVERRUN <= FIXED_MAX && MT__PROF_ENC_FRAG <= OVERRUN,
               "a line's stores stay within the room it asks for");

#define ASCII_ZEROS 0x3030303030303030ull

static inline void store8(char *w, uint64_t x)
{
    memcpy(w, &x, 8);
}

/* v < 10^8 as its 8 decimal digits (leading zeros included), digit values 0..9 one per
 * byte, the most significant in the lowest byte: both halves of v in one word, then
 * "divide by 100" and "by 10" in all lanes at once (multiply and shift: exact for lanes
 * below 10^4 and 10^2), no table, no loop. */
static inline uint64_t digits8(uint32_t v)
{
    uint64_t x = (uint64_t)(v / 10000) | (uint64_t)(v % 10000) << 32;
    uint64_t h = (x * 10486) >> 20 & 0x0000007f0000007full;
    x = h | (x - 100 * h) << 16;
    h = (x * 103) >> 10 & 0x000f000f000f000full;
    return h | (x - 10 * h) << 8;
}

/* v < 10^8 without leading zeros ("0" for 0); stores 8 bytes. */
static inline char *put_small(char *w, uint32_t v)
{
    uint64_t d = digits8(v);
    int zeros = __builtin_ctzll(d | 1ull << 56) >> 3; /* bit 56: the last digit always shows */
    store8(w, (d | ASCII_ZEROS) >> (8 * zeros));
    return w + 8 - zeros;
}

/* The number writers are inlined into the line writers: a call per field cost as much as
 * the field's digits. */
#define HOT static inline __attribute__((always_inline))

/* Stores up to 24 bytes (8 per group of 8 digits). */
HOT char *put_u64(char *w, uint64_t v)
{
    if (v < 10) { /* devices, streams, ids, empty totals: one digit is common */
        *w = (char)('0' + v);
        return w + 1;
    }
    if (v < 100000000)
        return put_small(w, (uint32_t)v);
    if (v < 10000000000000000ull) {
        uint64_t hi = v / 100000000;
        w = put_small(w, (uint32_t)hi);
        store8(w, digits8((uint32_t)(v - hi * 100000000)) | ASCII_ZEROS);
        return w + 8;
    }
    uint64_t top = v / 10000000000000000ull, rest = v - top * 10000000000000000ull;
    uint64_t mid = rest / 100000000;
    w = put_small(w, (uint32_t)top);
    store8(w, digits8((uint32_t)mid) | ASCII_ZEROS);
    store8(w + 8, digits8((uint32_t)(rest - mid * 100000000)) | ASCII_ZEROS);
    return w + 16;
}

/* A byte count as an integer the decoder reads back: saturated at INT64_MAX. */
HOT char *put_sat(char *w, uint64_t v)
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

/* The last number of a general writer's line: its digits only, so that that writer changes
 * no byte past the line's NUL (every earlier store is covered by the bytes that follow it). */
static char *put_sat_exact(char *w, uint64_t v)
{
    char tmp[24];
    size_t n = (size_t)(put_sat(tmp, v) - tmp);
    memcpy(w, tmp, n);
    return w + n;
}

/* The 8 hex digits of v, lowercase, the most significant in the lowest byte: the nibbles
 * spread one per byte, then '0' + n, plus 'a' - '0' - 10 where n >= 10 (n + 6 carries into
 * bit 4). */
static inline uint64_t hex8(uint32_t v)
{
    uint64_t x = v;
    x = (x & 0xffff0000ull) << 16 | (x & 0xffffull);
    x = (x & 0x0000ff000000ff00ull) << 8 | (x & 0x000000ff000000ffull);
    x = (x & 0x00f000f000f000f0ull) << 4 | (x & 0x000f000f000f000full);
    x = __builtin_bswap64(x);
    uint64_t letters = (x + 0x0606060606060606ull) >> 4 & 0x0101010101010101ull;
    return x + ASCII_ZEROS + letters * ('a' - '0' - 10);
}

/* "0x..." lowercase, no leading zeros; stores up to 8 bytes past the closing quote's place. */
HOT char *put_hex(char *w, uint64_t v)
{
    int n = v ? (64 - __builtin_clzll(v) + 3) / 4 : 1;
    memcpy(w, "\"0x", 3);
    w += 3;
    if (n <= 8) {
        store8(w, hex8((uint32_t)v) >> (8 * (8 - n)));
        w += n;
    } else {
        store8(w, hex8((uint32_t)(v >> 32)) >> (8 * (16 - n)));
        w += n - 8;
        store8(w, hex8((uint32_t)v));
        w += 8;
    }
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
    char tmp[MT__PROF_TAG_LABEL_MAX + 32]; /* the number's stores reach past its digits */
    char *w = LIT(tmp, "tag");
    w = put_int(w, tag);
    *w = '\0';
    memcpy(buf, tmp, (size_t)(w - tmp) + 1);
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
    w = put_sat_exact(w, ev->size);
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
        w = put_sat_exact(w, ev->size);
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
    bool with_stack = stack != 0 && ev->kind == MT_EV_ALLOC;
    w = with_stack ? put_sat(w, ev->reserved) : put_sat_exact(w, ev->reserved);
    if (with_stack) {
        w = LIT(w, ",\"stack\":");
        w = put_sat_exact(w, stack);
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

/* A prepared piece: a fixed-size copy (a few word moves) instead of one of its length. */
static inline char *copy_piece(char *w, const char *p, size_t n)
{
    memcpy(w, p, MT__PROF_ENC_FRAG);
    if (n > MT__PROF_ENC_FRAG) /* a tag's piece may be longer */
        memcpy(w + MT__PROF_ENC_FRAG, p + MT__PROF_ENC_FRAG, n - MT__PROF_ENC_FRAG);
    return w + n;
}
#define PIECE(w, p, n) copy_piece((w), (p), (n))

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
