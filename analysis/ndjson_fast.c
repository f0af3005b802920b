/* The fast decoder of event lines (see ndjson_fast.h). It accepts a strict subset of what
 * jansson and mt_prof_event_from_json accept, and decodes it to the same record: each
 * check below is the decoder's (profiler/json.c) or narrower. Narrower is always safe
 * (the line goes to jansson); wider never is, so where the two could differ (leading
 * zeros, signs, numbers past INT64_MAX, hex forms strtoull reads loosely, escapes,
 * non-ASCII bytes) this one declines. */
#include "analysis/ndjson_fast.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "memtrace/alloc.h"

/* The part of the line not read yet: p <= e. */
typedef struct cur_s {
    const char *p, *e;
} cur_t;

/* Inlined so that memcmp sees a constant length and becomes a few loads. */
static inline __attribute__((always_inline)) bool lit(cur_t *c, const char *s, size_t n)
{
    if ((size_t)(c->e - c->p) < n || memcmp(c->p, s, n) != 0)
        return false;
    c->p += n;
    return true;
}
#define LIT(c, s) lit((c), (s), sizeof(s) - 1)

/* A JSON integer that jansson reads as a json_int_t >= 0: no sign, no leading zero, at
 * most INT64_MAX. A fraction or exponent after it fails the literal that follows. */
static bool num(cur_t *c, uint64_t *out)
{
    const char *p = c->p;
    if (p == c->e || (unsigned)(*p - '0') > 9)
        return false;
    uint64_t v = (uint64_t)(*p++ - '0');
    if (v != 0) {
        /* 19 digits fit in 64 bits unsigned; INT64_MAX has 19. */
        for (int n = 1; p < c->e && (unsigned)(*p - '0') <= 9; n++, p++) {
            if (n == 19)
                return false;
            v = v * 10 + (uint64_t)(*p - '0');
        }
        if (v > (uint64_t)INT64_MAX)
            return false;
    }
    c->p = p;
    *out = v;
    return true;
}

/* The pid: the decoder casts the integer to int, so only values an int holds, where the
 * cast changes nothing. "-0" is left to jansson. */
static bool pid_num(cur_t *c, int *out)
{
    bool neg = c->p < c->e && *c->p == '-';
    if (neg)
        c->p++;
    uint64_t v;
    if (!num(c, &v) || v > (uint64_t)INT_MAX || (neg && v == 0))
        return false;
    *out = neg ? -(int)v : (int)v;
    return true;
}

/* A string of printable ASCII without quotes or backslashes: its bytes are its value. */
static bool str(cur_t *c, const char **s, size_t *n)
{
    if (c->p == c->e || *c->p != '"')
        return false;
    const char *b = ++c->p;
    while (c->p < c->e && (unsigned char)(*c->p - 0x20) < 0x5f && *c->p != '"' && *c->p != '\\')
        c->p++;
    if (c->p == c->e || *c->p != '"')
        return false;
    *s = b;
    *n = (size_t)(c->p - b);
    c->p++;
    return true;
}

/* "0x" and 1 to 16 hex digits: what strtoull reads to the same value, without its
 * leeway (spaces, signs, a second "0x"). */
static bool hex(cur_t *c, uint64_t *out)
{
    if (!LIT(c, "\"0x"))
        return false;
    uint64_t v = 0;
    int n = 0;
    for (; c->p < c->e && n <= 16; c->p++, n++) {
        unsigned ch = (unsigned char)*c->p, d;
        if (ch - '0' <= 9)
            d = ch - '0';
        else if ((ch | 0x20) - 'a' <= 5)
            d = (ch | 0x20) - 'a' + 10;
        else
            break;
        v = v << 4 | d;
    }
    if (n == 0 || n > 16 || !LIT(c, "\""))
        return false;
    *out = v;
    return true;
}

/* The first i in [lo, hi] whose name is s[0..n), as the decoder's name_lookup; -1. */
static int lookup(const char *s, size_t n, const char *(*namef)(int), int lo, int hi)
{
    for (int i = lo; i <= hi; i++) {
        const char *name = namef(i);
        /* The first byte rules out most names without a call (an empty s matches only an
         * empty name: name[0] is then the NUL compared below). */
        if (n > 0 && name[0] != s[0])
            continue;
        if (strncmp(name, s, n) == 0 && name[n] == '\0') /* strncmp: stops at name's end */
            return i;
    }
    return -1;
}

static bool stack_id(cur_t *c)
{
    uint64_t id;
    return LIT(c, ",\"stack\":") && num(c, &id) && id != 0 && id <= UINT32_MAX;
}

/* The rest of a stack ref, after its kind: addr, pool, stack (in size). */
static bool stack_ref(cur_t *c, mt_event_rec_t *ev)
{
    const char *s;
    size_t n;
    uint64_t id;
    if (!LIT(c, ",\"addr\":") || !hex(c, &ev->addr) || !LIT(c, ",\"pool\":") || !str(c, &s, &n))
        return false;
    int pl = lookup(s, n, mt_pool_name, 0, MT_POOL_HOST);
    if (pl < 0 || !LIT(c, ",\"stack\":") || !num(c, &id) || id == 0 || id > UINT32_MAX)
        return false;
    ev->pool = (uint8_t)pl;
    ev->size = id;
    return true;
}

/* The rest of an allocator event, after its kind. */
static bool figures(cur_t *c, mt_event_rec_t *ev, const char **tag, size_t *tag_len)
{
    const char *s;
    size_t n;
    uint64_t v;
    if (ev->kind == MT_EV_MARK) {
        if (!LIT(c, ",\"mark\":") || !str(c, &s, &n))
            return false;
        int mk = lookup(s, n, mt_mark_name, 1, MT_MARK_WARMUP_END);
        if (mk < 0)
            return false;
        ev->addr = (uint64_t)mk;
    } else if (!LIT(c, ",\"addr\":") || !hex(c, &ev->addr)) {
        return false;
    }
    if (!LIT(c, ",\"size\":") || !num(c, &ev->size) || !LIT(c, ",\"requested\":") ||
        !num(c, &ev->requested) || !LIT(c, ",\"pool\":") || !str(c, &s, &n))
        return false;
    int pl = lookup(s, n, mt_pool_name, 0, MT_POOL_HOST);
    if (pl < 0 || !LIT(c, ",\"tag\":") || !str(c, tag, tag_len))
        return false;
    ev->pool = (uint8_t)pl;
    if (!LIT(c, ",\"tag_id\":") || !num(c, &v) || v >= MT_TAG_MAX)
        return false;
    ev->tag = (uint8_t)v;
    if (!LIT(c, ",\"stream\":") || !num(c, &v) || v > UINT32_MAX)
        return false;
    ev->stream = (uint32_t)v;
    if (!LIT(c, ",\"allocated\":") || !num(c, &ev->allocated) || !LIT(c, ",\"reserved\":") ||
        !num(c, &ev->reserved))
        return false;
    return ev->kind != MT_EV_ALLOC || c->p == c->e || *c->p != ',' || stack_id(c);
}

bool mt__ndjson_event(const char *line, size_t len, mt_event_rec_t *ev, int *pid, const char **tag,
                      size_t *tag_len)
{
    cur_t c = {line, line + len};
    const char *s;
    size_t n;
    uint64_t dev;
    memset(ev, 0, sizeof(*ev));
    *tag = NULL;
    *tag_len = 0;
    if (!LIT(&c, "{\"v\":1,\"type\":\"event\",\"seq\":") || !num(&c, &ev->seq) ||
        !LIT(&c, ",\"t_ns\":") || !num(&c, &ev->time_ns) || !LIT(&c, ",\"pid\":") ||
        !pid_num(&c, pid) || !LIT(&c, ",\"dev\":") || !num(&c, &dev) || dev > UINT8_MAX ||
        !LIT(&c, ",\"kind\":") || !str(&c, &s, &n))
        return false;
    ev->device = (uint8_t)dev;
    int k = lookup(s, n, mt_event_kind_name, 1, MT_EV_KIND_COUNT - 1);
    /* Gaps, labels and named marks are rare and carry strings that may need unescaping, and
     * outside events name a library, not a tag: jansson's. */
    if (k < 0 || k == MT_EV_GAP || k == MT_EV_TAG_LABEL || k == MT_EV_MARK_NAMED ||
        k == MT_EV_LIBRARY_LABEL || k == MT_EV_OUTSIDE_ALLOC || k == MT_EV_OUTSIDE_FREE)
        return false;
    ev->kind = (uint8_t)k;
    bool ok = k == MT_EV_STACK_REF ? stack_ref(&c, ev) : figures(&c, ev, tag, tag_len);
    return ok && LIT(&c, "}") && c.p == c.e;
}
