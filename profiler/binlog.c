/* The binary log's blocks and records (see binlog.h). */
#include "profiler/binlog.h"

#include <string.h>

#include "memtrace/alloc.h"
#include "memtrace/common.h"

bool mt__blog_kind_named(int kind)
{
    return kind > 0 && kind < MT_EV_KIND_COUNT && kind != MT_EV_GAP && kind != MT_EV_TAG_LABEL &&
           kind != MT_EV_MARK_NAMED && kind != MT_EV_STACK_REF && kind != MT_EV_OUTSIDE_ALLOC &&
           kind != MT_EV_OUTSIDE_FREE && kind != MT_EV_LIBRARY_LABEL;
}

/* ---- little-endian words and varints ---- */

static void put_le(char *w, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        w[i] = (char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static inline char *put_var(char *w, uint64_t v)
{
    while (v >= 0x80) {
        *w++ = (char)(v | 0x80);
        v >>= 7;
    }
    *w++ = (char)v;
    return w;
}

/* Differences as zigzag varints: small either way. */
static inline char *put_delta(char *w, uint64_t now, uint64_t before)
{
    uint64_t d = now - before;
    return put_var(w, (d << 1) ^ (uint64_t) - (int64_t)(d >> 63));
}

/* A varint at *p (at most 10 bytes, the last < 0x80, no bits past 64): true. */
static inline bool get_var(const unsigned char **p, const unsigned char *end, uint64_t *out)
{
    const unsigned char *q = *p;
    uint64_t v = 0;
    for (int s = 0; q < end && s < 64; s += 7) {
        unsigned char b = *q++;
        if (s == 63 && b > 1)
            return false;
        v |= (uint64_t)(b & 0x7f) << s;
        if (b < 0x80) {
            *p = q;
            *out = v;
            return true;
        }
    }
    return false;
}

static inline bool get_delta(const unsigned char **p, const unsigned char *end, uint64_t before,
                             uint64_t *out)
{
    uint64_t z;
    if (!get_var(p, end, &z))
        return false;
    *out = before + ((z >> 1) ^ (uint64_t) - (int64_t)(z & 1));
    return true;
}

/* The block's state after ev: the writer's and the reader's alike. */
static void state_after(mt__blog_state_t *st, const mt_event_rec_t *ev)
{
    st->seq = ev->seq;
    st->time_ns = ev->time_ns;
    st->addr = ev->addr;
    st->allocated = ev->allocated;
    st->reserved = ev->reserved;
    st->stream = ev->stream;
    st->pool = ev->pool;
    st->tag = ev->tag;
    st->device = ev->device;
}

/* ---- writing ---- */

void mt__blog_header(char hdr[MT__BLOG_HDR], uint32_t payload, int32_t pid, uint32_t records)
{
    memcpy(hdr, MT__BLOG_MAGIC, MT__BLOG_MAGIC_LEN);
    put_le(hdr + 8, MT__BLOG_VERSION, 2);
    put_le(hdr + 10, 0, 2);
    put_le(hdr + 12, payload, 4);
    put_le(hdr + 16, (uint32_t)pid, 4);
    put_le(hdr + 20, records, 4);
}

size_t mt__blog_put_event(mt__blog_state_t *st, char *w, const mt_event_rec_t *ev, uint32_t stack)
{
    char *b = w;
    bool meta = ev->stream == st->stream && ev->pool == st->pool && ev->tag == st->tag &&
                ev->device == st->device;
    bool totals = ev->allocated == st->allocated && ev->reserved == st->reserved;
    int f = (ev->seq == st->seq + 1 ? MT__BLOG_F_SEQ : 0) |
            (ev->requested == ev->size ? MT__BLOG_F_REQ : 0) | (meta ? MT__BLOG_F_META : 0) |
            (stack ? MT__BLOG_F_STACK : 0) | (totals ? MT__BLOG_F_TOTALS : 0);
    *w++ = (char)(0x80 | f);
    *w++ = (char)ev->kind;
    if (!(f & MT__BLOG_F_SEQ))
        w = put_delta(w, ev->seq, st->seq + 1);
    w = put_delta(w, ev->time_ns, st->time_ns);
    w = put_delta(w, ev->addr, st->addr);
    w = put_var(w, ev->size);
    if (!(f & MT__BLOG_F_REQ))
        w = put_var(w, ev->requested);
    if (!totals) {
        w = put_delta(w, ev->allocated, st->allocated);
        w = put_delta(w, ev->reserved, st->reserved);
    }
    if (!meta) {
        w = put_var(w, ev->stream);
        *w++ = (char)ev->pool;
        *w++ = (char)ev->tag;
        *w++ = (char)ev->device;
    }
    if (stack)
        w = put_var(w, stack);
    state_after(st, ev);
    return (size_t)(w - b);
}

size_t mt__blog_put_line_head(char *w, uint32_t n)
{
    w[0] = 'J';
    put_le(w + 1, n, 4);
    return 5;
}

size_t mt__blog_put_line(char *w, const char *text, uint32_t n)
{
    size_t h = mt__blog_put_line_head(w, n);
    if (n > 0) /* text may be NULL then */
        memcpy(w + h, text, n);
    return h + (size_t)n;
}

size_t mt__blog_put_name(mt__blog_state_t *st, char *w, int tag, const char *text, uint32_t n)
{
    w[0] = 'N';
    w[1] = (char)tag;
    put_le(w + 2, n, 4);
    if (n > 0) /* text may be NULL then */
        memcpy(w + 6, text, n);
    if (tag >= 0 && tag < 32)
        st->named |= 1u << tag;
    return 6 + (size_t)n;
}

/* ---- reading ---- */

int mt__blog_header_read(const void *hdr, uint32_t *payload, int32_t *pid, uint32_t *records,
                         const char **err)
{
    const unsigned char *h = hdr;
    if (memcmp(h, MT__BLOG_MAGIC, MT__BLOG_MAGIC_LEN) != 0) {
        *err = "not a block (no block magic)";
        return MT_EPROTO;
    }
    if (get_le(h + 8, 2) != MT__BLOG_VERSION || get_le(h + 10, 2) != 0) {
        *err = "a block of a format version this reader does not know";
        return MT_EPROTO;
    }
    *payload = (uint32_t)get_le(h + 12, 4);
    *pid = (int32_t)(uint32_t)get_le(h + 16, 4);
    *records = (uint32_t)get_le(h + 20, 4);
    if (*payload > MT__BLOG_BLOCK_MAX) {
        *err = "a block longer than 16 MiB";
        return MT_EPROTO;
    }
    return 0;
}

static int bad(const char **err, const char *why)
{
    *err = why;
    return MT_EPROTO;
}

static int next_text(const unsigned char **p, const unsigned char *end, mt__blog_rec_t *r,
                     const char **err)
{
    const unsigned char *q = *p + 1;
    r->type = **p == 'J' ? MT__BLOG_LINE : MT__BLOG_NAME;
    if (r->type == MT__BLOG_NAME) {
        if (q == end)
            return bad(err, "a name record cut short");
        r->tag = *q++;
        if (r->tag >= MT_TAG_MAX)
            return bad(err, "a name record of a tag out of range");
    }
    if (end - q < 4)
        return bad(err, "a text record cut short");
    uint32_t n = (uint32_t)get_le(q, 4);
    q += 4;
    if ((size_t)(end - q) < n)
        return bad(err, "a text record longer than its block");
    r->text = (const char *)q;
    r->len = n;
    *p = q + n;
    return 0;
}

int mt__blog_next(mt__blog_state_t *st, const unsigned char **p, const unsigned char *end,
                  mt__blog_rec_t *r, const char **err)
{
    const unsigned char *q = *p;
    unsigned f = *q;
    if (f == 'J' || f == 'N') {
        int rc = next_text(p, end, r, err);
        if (rc == 0 && r->type == MT__BLOG_NAME)
            st->named |= 1u << r->tag;
        return rc;
    }
    if (f < 0x80 || (f & 0x60) != 0)
        return bad(err, "an unknown record type");
    if (++q == end)
        return bad(err, "an event record cut short");
    mt_event_rec_t *ev = &r->ev;
    memset(ev, 0, sizeof *ev);
    ev->kind = *q++;
    uint64_t v = st->seq + 1;
    bool ok = (f & MT__BLOG_F_SEQ) || get_delta(&q, end, st->seq + 1, &v);
    ev->seq = v;
    ok = ok && get_delta(&q, end, st->time_ns, &ev->time_ns) &&
         get_delta(&q, end, st->addr, &ev->addr) && get_var(&q, end, &ev->size);
    ev->requested = ev->size;
    ok = ok && ((f & MT__BLOG_F_REQ) || get_var(&q, end, &ev->requested));
    ev->allocated = st->allocated;
    ev->reserved = st->reserved;
    ok = ok && ((f & MT__BLOG_F_TOTALS) || (get_delta(&q, end, st->allocated, &ev->allocated) &&
                                            get_delta(&q, end, st->reserved, &ev->reserved)));
    if (!ok)
        return bad(err, "an event record cut short or with a bad number");
    if (f & MT__BLOG_F_META) {
        ev->stream = st->stream;
        ev->pool = st->pool;
        ev->tag = st->tag;
        ev->device = st->device;
    } else {
        if (!get_var(&q, end, &v) || v > UINT32_MAX || end - q < 3)
            return bad(err, "an event record cut short or with a bad stream");
        ev->stream = (uint32_t)v;
        ev->pool = q[0];
        ev->tag = q[1];
        ev->device = q[2];
        q += 3;
    }
    r->stack = 0;
    if (f & MT__BLOG_F_STACK) {
        if (!get_var(&q, end, &v) || v == 0 || v > UINT32_MAX)
            return bad(err, "an event record cut short or with a bad stack id");
        r->stack = (uint32_t)v;
    }
    r->type = MT__BLOG_EVENT;
    state_after(st, ev);
    *p = q;
    return 0;
}
