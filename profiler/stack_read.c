/* Reading a producer's stack table (stack.h) as "stack" and "module" lines: the local
 * drainer reads its own process's, the daemon the producers'. The area is another
 * process's memory: every count, offset and length is checked against the limits before
 * use, and a bad entry reads as missing (the stack's frames are then "unknown"). */
#include "profiler/stack.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"

/* [off, off + len) lies inside an area of size bytes; *end = off + len. Written so that
 * no sum can wrap: a forged offset near 2^64 must fail here, not pass as a small one. */
static bool span(uint64_t off, uint64_t len, size_t size, uint64_t *end)
{
    if (off > size || len > size - off)
        return false;
    *end = off + len;
    return true;
}

int mt__stab_view(mt__stab_view_t *v, const void *area, size_t size)
{
    memset(v, 0, sizeof *v);
    if (!area || size < sizeof(mt__stab_hdr_t))
        return MT_EPROTO;
    const mt__stab_hdr_t *h = area;
    if (h->magic != MT__STAB_MAGIC || h->version != 1 || h->hdr_size != sizeof(mt__stab_hdr_t))
        return MT_EPROTO;
    mt__stab_hdr_t c;
    memcpy(&c, h, offsetof(mt__stab_hdr_t, nstacks));
    /* each table inside the area, in order, of the size its count says */
    uint64_t defs_end, frames_end, mods_end, py_end, str_end;
    bool ok = c.max_stacks <= MT_STACK_ID_MAX && c.max_frames <= (1u << 26) &&
              c.max_modules <= (1u << 16) && c.max_py <= (1u << 24) && c.str_bytes <= (64u << 20) &&
              c.defs_off >= sizeof(mt__stab_hdr_t) &&
              span(c.defs_off, (uint64_t)c.max_stacks * sizeof(mt__stab_def_t), size, &defs_end) &&
              c.frames_off >= defs_end &&
              span(c.frames_off, (uint64_t)c.max_frames * 8u, size, &frames_end) &&
              c.mods_off >= frames_end &&
              span(c.mods_off, (uint64_t)c.max_modules * sizeof(mt__stab_mod_t), size, &mods_end) &&
              c.py_off >= mods_end &&
              span(c.py_off, (uint64_t)c.max_py * sizeof(mt__stab_py_t), size, &py_end) &&
              c.str_off >= py_end && span(c.str_off, c.str_bytes, size, &str_end) &&
              c.defs_off % 8 == 0 && c.frames_off % 8 == 0 && c.mods_off % 8 == 0 &&
              c.py_off % 8 == 0;
    if (!ok)
        return MT_EPROTO;
    v->base = area;
    v->size = size;
    v->h = c;
    return 0;
}

static const mt__stab_hdr_t *hdr(const mt__stab_view_t *v)
{
    return (const mt__stab_hdr_t *)(const void *)v->base;
}

uint32_t mt__stab_view_nstacks(const mt__stab_view_t *v)
{
    if (!v->base)
        return 0;
    uint32_t n = atomic_load_explicit(&((mt__stab_hdr_t *)hdr(v))->nstacks, memory_order_acquire);
    return n < v->h.max_stacks ? n : v->h.max_stacks;
}

uint32_t mt__stab_view_nmods(const mt__stab_view_t *v)
{
    if (!v->base)
        return 0;
    uint32_t n = atomic_load_explicit(&((mt__stab_hdr_t *)hdr(v))->nmods, memory_order_acquire);
    return n < v->h.max_modules ? n : v->h.max_modules;
}

uint64_t mt__stab_view_overflow(const mt__stab_view_t *v)
{
    return v->base
               ? atomic_load_explicit(&((mt__stab_hdr_t *)hdr(v))->overflow, memory_order_relaxed)
               : 0;
}

/* A string of the names table, or NULL when out of bounds. */
static json_t *str_at(const mt__stab_view_t *v, uint32_t off, uint32_t len)
{
    if ((uint64_t)off + len > v->h.str_bytes || len > MT__STAB_PATH_MAX)
        return NULL;
    char buf[MT__STAB_PATH_MAX + 1];
    memcpy(buf, v->base + v->h.str_off + off, len);
    buf[len] = '\0';
    for (uint32_t i = 0; i < len; i++)
        if (buf[i] == '\0')
            return NULL;
    json_t *s = json_stringn_nocheck(buf, len);
    if (s && !json_string_value(s)) {
        json_decref(s);
        return NULL;
    }
    return s;
}

static size_t dump_line(json_t *o, char *buf, size_t cap)
{
    if (!o)
        return 0;
    size_t n = json_dumpb(o, NULL, 0, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (n == 0) {
        json_decref(o);
        return 0;
    }
    if (n + 2 > cap) {
        json_decref(o);
        return n + 2;
    }
    json_dumpb(o, buf, cap, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    buf[n] = '\n';
    buf[n + 1] = '\0';
    return n + 1;
}

static json_t *hex(uint64_t x)
{
    char b[24];
    snprintf(b, sizeof b, "0x%llx", (unsigned long long)x);
    return json_string(b);
}

size_t mt__stab_stack_line(const mt__stab_view_t *v, uint32_t id, int pid, char *buf, size_t cap)
{
    if (id == 0 || id > mt__stab_view_nstacks(v))
        return 0;
    mt__stab_def_t d;
    memcpy(&d, v->base + v->h.defs_off + (size_t)(id - 1) * sizeof d, sizeof d);
    if (d.n > MT_STACK_DEPTH_MAX || (uint64_t)d.off + d.n > v->h.max_frames)
        return 0;
    uint64_t w[MT_STACK_DEPTH_MAX];
    memcpy(w, v->base + v->h.frames_off + (size_t)d.off * 8u, (size_t)d.n * 8u);
    uint32_t npy = atomic_load_explicit(&((mt__stab_hdr_t *)hdr(v))->npy, memory_order_acquire);
    json_t *fr = json_array();
    for (int i = 0; fr && i < d.n; i++) {
        json_t *f = NULL;
        if (!(w[i] & MT__STAB_PY_BIT)) {
            f = json_pack("{s:o}", "ip", hex(w[i]));
        } else {
            uint32_t pid_ = (uint32_t)(w[i] >> 32) & 0x7fffffffu;
            mt__stab_py_t p;
            json_t *fn = NULL, *fl = NULL;
            if (pid_ >= 1 && pid_ <= npy && pid_ <= v->h.max_py) {
                memcpy(&p, v->base + v->h.py_off + (size_t)(pid_ - 1) * sizeof p, sizeof p);
                fn = str_at(v, p.func_off, p.func_len);
                fl = str_at(v, p.file_off, p.file_len);
            }
            f = json_pack("{s:o, s:o, s:I}", "py", fn ? fn : json_string("?"), "file",
                          fl ? fl : json_string("?"), "line", (json_int_t)(uint32_t)w[i]);
        }
        if (!f || json_array_append_new(fr, f) != 0) {
            json_decref(fr);
            fr = NULL;
        }
    }
    if (!fr)
        return 0;
    json_t *o = json_pack("{s:i, s:s, s:i, s:I, s:o}", "v", 1, "kind", "stack", "pid", pid, "id",
                          (json_int_t)id, "frames", fr);
    if (o && (d.flags & 1) && json_object_set_new(o, "truncated", json_true()) != 0) {
        json_decref(o); /* a stack not said truncated is a stack told wrong */
        o = NULL;
    }
    return dump_line(o, buf, cap);
}

size_t mt__stab_module_line(const mt__stab_view_t *v, uint32_t i, int pid, char *buf, size_t cap)
{
    if (i >= mt__stab_view_nmods(v))
        return 0;
    mt__stab_mod_t m;
    memcpy(&m, v->base + v->h.mods_off + (size_t)i * sizeof m, sizeof m);
    json_t *path = str_at(v, m.path_off, m.path_len);
    if (!path || m.size == 0 || m.bid_len > sizeof m.bid || m.base > UINT64_MAX - m.size) {
        json_decref(path);
        return 0;
    }
    char bid[2 * sizeof m.bid + 1];
    for (int k = 0; k < m.bid_len; k++)
        snprintf(bid + 2 * k, 3, "%02x", m.bid[k]);
    bid[2 * m.bid_len] = '\0';
    json_t *o = json_pack("{s:i, s:s, s:i, s:o, s:o, s:I, s:s}", "v", 1, "kind", "module", "pid",
                          pid, "path", path, "base", hex(m.base), "size",
                          (json_int_t)(m.size > INT64_MAX ? INT64_MAX : m.size), "build_id", bid);
    return dump_line(o, buf, cap);
}

#define LINE_MAX_ (64 * 1024)

int mt__stab_emit_for(const mt__stab_view_t *v, mt__stab_seen_t *seen, uint32_t id, int pid,
                      void (*put)(void *ud, const char *line, size_t len), void *ud)
{
    if (!v->base)
        return 0;
    char *buf = NULL;
    uint32_t nm = mt__stab_view_nmods(v);
    bool want = id >= 1 && id <= MT_STACK_ID_MAX;
    if (want && !seen->bits) {
        seen->bits = calloc(MT_STACK_ID_MAX / 64 + 1, sizeof(uint64_t));
        if (!seen->bits)
            return MT_ENOMEM;
    }
    want = want && !(seen->bits[id / 64] >> (id % 64) & 1);
    if (seen->mods >= nm && !want)
        return 0;
    buf = malloc(LINE_MAX_);
    if (!buf)
        return MT_ENOMEM;
    /* modules first: a stack's frames resolve against the map as it was when it was made */
    for (; seen->mods < nm; seen->mods++) {
        size_t n = mt__stab_module_line(v, seen->mods, pid, buf, LINE_MAX_);
        if (n > 0 && n < LINE_MAX_)
            put(ud, buf, n);
    }
    if (want) {
        size_t n = mt__stab_stack_line(v, id, pid, buf, LINE_MAX_);
        if (n > 0 && n < LINE_MAX_) {
            put(ud, buf, n);
            seen->bits[id / 64] |= UINT64_C(1) << (id % 64);
        }
    }
    free(buf);
    return 0;
}

void mt__stab_seen_free(mt__stab_seen_t *s)
{
    free(s->bits);
    memset(s, 0, sizeof *s);
}
