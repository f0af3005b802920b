/* The binary log's reader (see binlog_read.h).
 *
 * A block is taken whole into the buffer, with the 8 bytes after it: a sound block is
 * followed by the next block's magic or by the end of the file. One that is not (a write
 * the recorder could not cut back, a copy cut short) is read up to the next magic inside
 * it, and said to be damaged; bytes that begin no block are skipped to the next magic, and
 * said so. Nothing before the damage is dropped. */
#include "analysis/binlog_read.h"

#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/alloc.h"
#include "memtrace/common.h"
#include "memtrace/prof.h"
#include "profiler/internal.h"

bool mt__blog_is_binary(const void *head, size_t n)
{
    return n >= MT__BLOG_MAGIC_LEN && memcmp(head, MT__BLOG_MAGIC, MT__BLOG_MAGIC_LEN) == 0;
}

/* Invariants: lo <= hi <= cap; buf[lo..hi) is the file's bytes from offset base + lo on,
 * not yet taken; names[t] is NULL or a NUL-terminated copy of tag t's name in the current
 * block. */
typedef struct rd_s {
    FILE *f;
    unsigned char *buf;
    size_t cap, lo, hi;
    uint64_t base;
    bool eof, ioerr, nomem;
    char *names[MT_TAG_MAX];
    mt__blog_rec_cb rec;
    mt__blog_bad_cb bad;
    void *ud;
} rd_t;

/* Up to n bytes at lo (fewer only at the end of the file or on an error): their count. */
static size_t avail(rd_t *r, size_t n)
{
    if (r->hi - r->lo >= n || r->eof)
        return r->hi - r->lo < n ? r->hi - r->lo : n;
    if (r->lo > 0) {
        memmove(r->buf, r->buf + r->lo, r->hi - r->lo);
        r->base += r->lo;
        r->hi -= r->lo;
        r->lo = 0;
    }
    if (n > r->cap) {
        size_t cap = r->cap;
        while (cap < n)
            cap *= 2;
        unsigned char *b = realloc(r->buf, cap);
        if (!b) {
            r->nomem = true;
            return r->hi; /* too few bytes: the caller sees nomem */
        }
        r->buf = b;
        r->cap = cap;
    }
    while (r->hi < n && !r->eof) {
        size_t got = fread(r->buf + r->hi, 1, r->cap - r->hi, r->f);
        r->hi += got;
        if (got == 0) {
            r->eof = true;
            r->ioerr = ferror(r->f) != 0;
        }
    }
    return r->hi < n ? r->hi : n;
}

static int say(rd_t *r, const char *fmt, uint64_t a, uint64_t b, const char *why)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, a, b, why);
    return r->bad(r->ud, msg);
}

/* Where the first whole magic in buf[from, to) begins, or to. */
static size_t next_magic(const rd_t *r, size_t from, size_t to)
{
    for (size_t i = from; i + MT__BLOG_MAGIC_LEN <= to; i++)
        if (r->buf[i] == 0x89 && memcmp(r->buf + i, MT__BLOG_MAGIC, MT__BLOG_MAGIC_LEN) == 0)
            return i;
    return to;
}

/* Skips to the next block magic after the byte at lo (or to the end); says how many
 * bytes, and why. */
static int resync(rd_t *r, const char *why)
{
    uint64_t from = r->base + r->lo;
    r->lo++;
    while (avail(r, MT__BLOG_MAGIC_LEN) == MT__BLOG_MAGIC_LEN) {
        size_t m = next_magic(r, r->lo, r->hi);
        if (m < r->hi) {
            r->lo = m;
            return say(r, "bytes %" PRIu64 "-%" PRIu64 ": %s; skipped to the next block", from,
                       r->base + r->lo, why);
        }
        r->lo = r->hi - (MT__BLOG_MAGIC_LEN - 1); /* perhaps a magic's beginning */
    }
    r->lo = r->hi;
    return say(r, "bytes %" PRIu64 "-%" PRIu64 ": %s; no block after them", from, r->base + r->lo,
               why);
}

static void names_reset(rd_t *r)
{
    for (int t = 0; t < MT_TAG_MAX; t++) {
        free(r->names[t]);
        r->names[t] = NULL;
    }
}

/* The records of buf[at..end), of a block of pid; one cut short (cut) may end inside a
 * record, which is then not said on its own. */
static int records(rd_t *r, size_t at, size_t end, int32_t pid, bool cut, uint64_t *given,
                   bool *broken)
{
    mt__blog_state_t st;
    memset(&st, 0, sizeof st);
    const unsigned char *p = r->buf + at, *e = r->buf + end;
    while (p < e) {
        mt__blog_rec_t rec;
        const char *why;
        if (mt__blog_next(&st, &p, e, &rec, &why) != 0) {
            *broken = true;
            if (cut)
                return 0; /* the cut is said */
            uint64_t off = r->base + (size_t)(p - r->buf);
            return say(r, "bytes %" PRIu64 "-%" PRIu64 ": %s; the rest of its block skipped", off,
                       r->base + end, why);
        }
        if (rec.type == MT__BLOG_NAME) {
            free(r->names[rec.tag]);
            r->names[rec.tag] = NULL;
            if (rec.len > 0) {
                char *s = malloc((size_t)rec.len + 1);
                if (!s)
                    return MT_ENOMEM;
                memcpy(s, rec.text, rec.len);
                s[rec.len] = '\0';
                r->names[rec.tag] = s;
            }
            ++*given;
            continue;
        }
        int rc = r->rec(r->ud, &rec, pid, (const char *const *)r->names);
        ++*given;
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int read_all(rd_t *r)
{
    for (;;) {
        size_t a = avail(r, MT__BLOG_HDR);
        if (r->ioerr)
            return MT_EIO;
        if (a == 0)
            return 0;
        uint64_t at = r->base + r->lo;
        uint32_t payload, nrec;
        int32_t pid;
        const char *why = "a block's header cut short";
        int rc;
        if (a < MT__BLOG_HDR ||
            mt__blog_header_read(r->buf + r->lo, &payload, &pid, &nrec, &why) != 0) {
            if ((rc = resync(r, why)) != 0)
                return rc;
            continue;
        }
        size_t whole = MT__BLOG_HDR + (size_t)payload;
        a = avail(r, whole + MT__BLOG_MAGIC_LEN);
        if (r->ioerr)
            return MT_EIO;
        if (r->nomem)
            return MT_ENOMEM;
        /* Sound: whole, and followed by the end or a block. Else cut where a block begins
         * inside it, if one does. */
        size_t span = a < whole ? a : whole, end = r->lo + span;
        bool inner = false; /* another block begins inside this one */
        if (a != whole && !(a >= whole + MT__BLOG_MAGIC_LEN &&
                            mt__blog_is_binary(r->buf + r->lo + whole, MT__BLOG_MAGIC_LEN))) {
            size_t m = next_magic(r, r->lo + MT__BLOG_MAGIC_LEN, end);
            inner = m < end;
            end = m;
        }
        bool cut = inner || a < whole;
        names_reset(r);
        uint64_t given = 0;
        bool broken = false;
        if (end > r->lo + MT__BLOG_HDR &&
            (rc = records(r, r->lo + MT__BLOG_HDR, end, pid, cut, &given, &broken)) != 0)
            return rc;
        if (cut) {
            rc = say(r, "bytes %" PRIu64 "-%" PRIu64 ": %s; the records before the cut are read",
                     at, r->base + end,
                     inner ? "a block cut short where another begins"
                           : "a block cut short by the end of the file");
            if (rc != 0)
                return rc;
        } else if (!broken && given != nrec) {
            char why2[96];
            snprintf(why2, sizeof why2, "%" PRIu64 " records where its header says %" PRIu32, given,
                     nrec);
            if ((rc = say(r, "bytes %" PRIu64 "-%" PRIu64 ": a block of %s", at, r->base + end,
                          why2)) != 0)
                return rc;
        }
        r->lo = end;
    }
}

int mt__blog_read(FILE *f, const void *head, size_t nhead, mt__blog_rec_cb rec, mt__blog_bad_cb bad,
                  void *ud)
{
    rd_t r = {.f = f, .cap = 1u << 20, .rec = rec, .bad = bad, .ud = ud};
    if (nhead > r.cap)
        return MT_EINVAL;
    if (!(r.buf = malloc(r.cap)))
        return MT_ENOMEM;
    if (nhead > 0)
        memcpy(r.buf, head, nhead);
    r.hi = nhead;
    int rc = read_all(&r);
    names_reset(&r);
    free(r.buf);
    return rc;
}

const char *mt__blog_name_of(void *names, int tag)
{
    return tag >= 0 && tag < MT_TAG_MAX ? ((const char *const *)names)[tag] : NULL;
}

/* ---- as lines_pipe items ---- */

typedef struct pipe_s {
    const mt__lines_pipe_cfg_t *cfg;
    mt__line_cb cb;
    void *ud;
    unsigned long lineno;
    char *line; /* a line made for an item: cap bytes */
    size_t cap;
    char tagbuf[MT__PROF_TAG_LABEL_MAX];
} pipe_t;

static bool plain(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)(*s - 0x20) >= 0x5f || *s == '"' || *s == '\\')
            return false;
    return true;
}

/* A number as the line writes it: past INT64_MAX, INT64_MAX (encode.c, put_sat). */
static uint64_t sat(uint64_t v)
{
    return v > (uint64_t)INT64_MAX ? (uint64_t)INT64_MAX : v;
}

/* Whether ndjson_fast takes ev's line, whose numbers are ev's saturated (sat) and its tag's
 * name tag: its checks, on the record. */
static bool fast_ok(const mt_event_rec_t *ev, int32_t pid, const char *tag)
{
    int k = ev->kind;
    if (pid < 0 || k <= 0 || k >= MT_EV_KIND_COUNT || k == MT_EV_GAP || k == MT_EV_TAG_LABEL ||
        k == MT_EV_MARK_NAMED || k == MT_EV_LIBRARY_LABEL || k == MT_EV_OUTSIDE_ALLOC ||
        k == MT_EV_OUTSIDE_FREE || ev->pool > MT_POOL_HOST)
        return false;
    if (k == MT_EV_STACK_REF)
        return ev->size != 0 && ev->size <= UINT32_MAX;
    if (k == MT_EV_MARK && (ev->addr < 1 || ev->addr > MT_MARK_WARMUP_END))
        return false;
    return ev->tag < MT_TAG_MAX && plain(tag);
}

static int give(pipe_t *pp, const mt__line_item_t *it)
{
    return pp->cb(pp->ud, it, ++pp->lineno);
}

/* text[0..n) as a raw item (a long one past cfg->max). */
static int give_raw(pipe_t *pp, const char *text, size_t n, bool copy)
{
    if (n > pp->cfg->max)
        return give(pp, &(mt__line_item_t){.what = MT_LINE_LONG});
    if (copy) {
        if (n + 1 > pp->cap) {
            char *b = realloc(pp->line, n + 1);
            if (!b)
                return MT_ENOMEM;
            pp->line = b;
            pp->cap = n + 1;
        }
        memcpy(pp->line, text, n);
        pp->line[n] = '\0';
    }
    return give(pp, &(mt__line_item_t){.what = MT_LINE_RAW, .text = pp->line, .len = (uint32_t)n});
}

static int pipe_rec(void *ud, const mt__blog_rec_t *r, int32_t pid, const char *const *names)
{
    pipe_t *pp = ud;
    if (r->type == MT__BLOG_LINE)
        return give_raw(pp, r->text, r->len, true);
    const mt_event_rec_t *ev = &r->ev;
    if (pp->cfg->fast) {
        const char *tag = "";
        if (ev->kind != MT_EV_STACK_REF && ev->tag < MT_TAG_MAX)
            tag = mt__prof_tag_label(ev->tag, mt__blog_name_of, (void *)names, pp->tagbuf);
        if (fast_ok(ev, pid, tag)) {
            mt__line_item_t it = {.what = MT_LINE_EVENT, .pid = pid};
            it.ev.seq = sat(ev->seq);
            it.ev.time_ns = sat(ev->time_ns);
            it.ev.device = ev->device;
            it.ev.kind = ev->kind;
            it.ev.addr = ev->addr;
            it.ev.pool = ev->pool;
            it.ev.size = sat(ev->size);
            if (ev->kind != MT_EV_STACK_REF) {
                it.ev.requested = sat(ev->requested);
                it.ev.tag = ev->tag;
                it.ev.stream = ev->stream;
                it.ev.allocated = sat(ev->allocated);
                it.ev.reserved = sat(ev->reserved);
                it.text = tag;
                it.len = (uint32_t)strlen(tag);
            }
            return give(pp, &it);
        }
    }
    size_t n =
        mt_prof_alloc_write(pp->line, pp->cap, ev, pid, r->stack, mt__blog_name_of, (void *)names);
    if (n == 0 || n >= pp->cap) {
        char *b = realloc(pp->line, n + 1);
        if (!b)
            return MT_ENOMEM;
        pp->line = b;
        pp->cap = n + 1;
        n = mt_prof_alloc_write(pp->line, pp->cap, ev, pid, r->stack, mt__blog_name_of,
                                (void *)names);
        if (n == 0 || n >= pp->cap)
            return MT_ENOMEM;
    }
    pp->line[n - 1] = '\0'; /* its newline */
    return give_raw(pp, pp->line, n - 1, false);
}

static int pipe_bad(void *ud, const char *msg)
{
    pipe_t *pp = ud;
    return give(pp,
                &(mt__line_item_t){.what = MT_LINE_BAD, .text = msg, .len = (uint32_t)strlen(msg)});
}

int mt__blog_pipe(FILE *f, const void *head, size_t nhead, const mt__lines_pipe_cfg_t *cfg,
                  mt__line_cb cb, void *ud, unsigned long *lineno)
{
    pipe_t pp = {.cfg = cfg, .cb = cb, .ud = ud, .cap = 4096};
    if (!(pp.line = malloc(pp.cap)))
        return MT_ENOMEM;
    int rc = mt__blog_read(f, head, nhead, pipe_rec, pipe_bad, &pp);
    free(pp.line);
    *lineno = pp.lineno;
    return rc;
}
