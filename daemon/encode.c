/* memtraced: the event line encoder of the hot path.
 *
 * The telemetry schema is the profiler's (profiler/json.c, mt_prof_event_to_json, printed
 * with JSON_COMPACT). Building a jansson object per event costs microseconds, more than
 * the daemon's whole budget per event at 1 M events/s, so lines are written here directly,
 * byte for byte the same as the profiler's encoding: tests/daemon/test_daemon_encode.c
 * compares the two over every kind, marks, tags, gaps and extreme values, so any change of
 * the schema in profiler/json.c fails that test until this file follows. */
#include <string.h>

#include "daemon/internal.h"

static char *put_u64(char *w, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *w++ = tmp[--n];
    return w;
}

/* The profiler's u64(): json_int_t is signed, larger values saturate. */
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

static char *put_hex(char *w, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    char tmp[16];
    int n = 0;
    do {
        tmp[n++] = digits[v & 15];
        v >>= 4;
    } while (v);
    *w++ = '"';
    *w++ = '0';
    *w++ = 'x';
    while (n)
        *w++ = tmp[--n];
    *w++ = '"';
    return w;
}

#define LIT(w, s) (memcpy((w), (s), sizeof(s) - 1), (w) + sizeof(s) - 1)

/* A JSON string as jansson writes it (no '/' escaping); at most 6 bytes per input byte
 * plus quotes. Names here are short static identifiers; len is capped by the caller. */
static char *put_str(char *w, const char *s)
{
    *w++ = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            *w++ = '\\';
            *w++ = (char)c;
        } else if (c < 0x20) {
            static const char esc[] = "btnvfr";
            *w++ = '\\';
            if (c >= '\b' && c <= '\r' && c != '\v') {
                *w++ = esc[c - '\b'];
            } else {
                static const char hx[] = "0123456789abcdef";
                w = LIT(w, "u00");
                *w++ = hx[c >> 4];
                *w++ = hx[c & 15];
            }
        } else {
            *w++ = (char)c;
        }
    }
    *w++ = '"';
    return w;
}

int mt__d_encode_event(mt_d_buf_t *b, int pid, const mt_event_rec_t *ev)
{
    char tagbuf[16];
    const char *kind = mt_event_kind_name(ev->kind);
    const char *mark = ev->kind == MT_EV_MARK ? mt_mark_name((int)ev->addr) : NULL;
    const char *pool = mt_pool_name(ev->pool);
    const char *tag = mt__d_tag_name(ev->tag, tagbuf, sizeof tagbuf);
    size_t names = strlen(kind) + (mark ? strlen(mark) : 0) + strlen(pool) + strlen(tag);
    int rc = mt__d_buf_reserve(b, 400 + 6 * names);
    if (rc)
        return rc;
    char *w = b->p + b->len;
    if (ev->kind == MT_EV_GAP) {
        w = LIT(w, "{\"v\":1,\"type\":\"gap\",\"seq\":");
        w = put_sat(w, ev->seq);
        w = LIT(w, ",\"t_ns\":");
        w = put_sat(w, ev->time_ns);
        w = LIT(w, ",\"pid\":");
        w = put_int(w, pid);
        w = LIT(w, ",\"lost\":");
        w = put_sat(w, ev->size);
        w = LIT(w, "}\n");
    } else {
        w = LIT(w, "{\"v\":1,\"type\":\"event\",\"seq\":");
        w = put_sat(w, ev->seq);
        w = LIT(w, ",\"t_ns\":");
        w = put_sat(w, ev->time_ns);
        w = LIT(w, ",\"pid\":");
        w = put_int(w, pid);
        w = LIT(w, ",\"dev\":");
        w = put_u64(w, ev->device);
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
        w = LIT(w, ",\"tag\":");
        w = put_str(w, tag);
        w = LIT(w, ",\"tag_id\":");
        w = put_u64(w, ev->tag);
        w = LIT(w, ",\"stream\":");
        w = put_u64(w, ev->stream);
        w = LIT(w, ",\"allocated\":");
        w = put_sat(w, ev->allocated);
        w = LIT(w, ",\"reserved\":");
        w = put_sat(w, ev->reserved);
        w = LIT(w, "}\n");
    }
    b->len = (size_t)(w - b->p);
    b->p[b->len] = '\0';
    return 0;
}
