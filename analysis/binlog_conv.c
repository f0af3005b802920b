/* The binary log to NDJSON and back (see binlog_conv.h). */
#include "analysis/binlog_conv.h"

#include <stdlib.h>
#include <string.h>

#include "analysis/lines.h"
#include "analysis/ndjson_fast.h"
#include "memtrace/alloc.h"
#include "memtrace/common.h"
#include "memtrace/prof.h"

/* ---- binary to NDJSON ---- */

typedef struct to_s {
    FILE *out;
    char *line;
    size_t cap;
    uint64_t records;
    mt__blog_bad_cb bad;
    void *bad_ud;
} to_t;

static int to_bad(void *ud, const char *msg)
{
    to_t *t = ud;
    return t->bad(t->bad_ud, msg);
}

static int to_rec(void *ud, const mt__blog_rec_t *r, int32_t pid, const char *const *names)
{
    to_t *t = ud;
    t->records++;
    if (r->type == MT__BLOG_LINE) {
        if (fwrite(r->text, 1, r->len, t->out) != r->len || putc('\n', t->out) == EOF)
            return MT_EIO;
        return 0;
    }
    size_t n = mt_prof_alloc_write(t->line, t->cap, &r->ev, pid, r->stack, mt__blog_name_of,
                                   (void *)names);
    if (n == 0 || n >= t->cap) {
        char *b = realloc(t->line, n + 1);
        if (!b)
            return MT_ENOMEM;
        t->line = b;
        t->cap = n + 1;
        n = mt_prof_alloc_write(t->line, t->cap, &r->ev, pid, r->stack, mt__blog_name_of,
                                (void *)names);
        if (n == 0 || n >= t->cap)
            return MT_ENOMEM;
    }
    return fwrite(t->line, 1, n, t->out) == n ? 0 : MT_EIO;
}

int mt__blog_to_ndjson(FILE *in, const void *head, size_t nhead, FILE *out, mt__blog_bad_cb bad,
                       void *ud, uint64_t *records)
{
    to_t t = {.out = out, .cap = 4096, .bad = bad, .bad_ud = ud};
    if (!(t.line = malloc(t.cap)))
        return MT_ENOMEM;
    int rc = mt__blog_read(in, head, nhead, to_rec, to_bad, &t);
    free(t.line);
    *records = t.records;
    return rc;
}

/* ---- NDJSON to binary ---- */

#define BLOCK_BYTES (256u << 10) /* payload of a block the converter writes, about */

/* Invariants: buf[0..MT__BLOG_HDR) is the block's header's room, buf[MT__BLOG_HDR..len)
 * its records, nrec of them, of process pid (-1: no event yet); names[t] is the name the
 * block gave tag t (valid while st.named has bit t). */
typedef struct from_s {
    FILE *out;
    char *buf;
    size_t len, cap;
    uint32_t nrec;
    int32_t pid;
    mt__blog_state_t st;
    char *names[MT_TAG_MAX];
    uint32_t stack;    /* the last stack ref's id, for the alloc line after it */
    uint64_t stack_at; /* and its address */
    char *line;        /* a line made back from a record, cap2 bytes */
    size_t cap2;
} from_t;

static int block_out(from_t *f)
{
    if (f->nrec > 0) {
        mt__blog_header(f->buf, (uint32_t)(f->len - MT__BLOG_HDR), f->pid < 0 ? 0 : f->pid,
                        f->nrec);
        if (fwrite(f->buf, 1, f->len, f->out) != f->len)
            return MT_EIO;
    }
    f->len = MT__BLOG_HDR;
    f->nrec = 0;
    f->pid = -1;
    memset(&f->st, 0, sizeof f->st);
    return 0;
}

/* Room for n more bytes in the block (a new block when it is full): 0 or MT_E*. */
static int room(from_t *f, size_t n)
{
    int rc;
    if (f->len + n > BLOCK_BYTES + MT__BLOG_HDR && f->nrec > 0 && (rc = block_out(f)) != 0)
        return rc;
    if (f->len + n > f->cap) {
        size_t cap = f->cap;
        while (cap < f->len + n)
            cap *= 2;
        char *b = realloc(f->buf, cap);
        if (!b)
            return MT_ENOMEM;
        f->buf = b;
        f->cap = cap;
    }
    return 0;
}

static int put_text(from_t *f, const char *s, size_t n)
{
    if (n > MT__BLOG_BLOCK_MAX / 2)
        return MT_EOVERFLOW;
    int rc = room(f, n + MT__BLOG_TEXT_EXTRA);
    if (rc == 0) {
        f->len += mt__blog_put_line(f->buf + f->len, s, (uint32_t)n);
        f->nrec++;
    }
    return rc;
}

/* The line s[0..n) (its newline excluded) as an event record when the encoder makes it back
 * byte for byte from one; 1 then, 0 when it does not, or MT_E*. */
static int put_event(from_t *f, const char *s, size_t n)
{
    mt_event_rec_t ev;
    int pid;
    const char *tag;
    size_t tl;
    if (!mt__ndjson_event(s, n, &ev, &pid, &tag, &tl))
        return 0;
    uint32_t stack = 0;
    if (ev.kind == MT_EV_ALLOC && f->stack && ev.addr == f->stack_at)
        stack = f->stack;
    f->stack = ev.kind == MT_EV_STACK_REF ? (uint32_t)ev.size : 0;
    f->stack_at = ev.addr;
    /* The tag's name as the line gives it (a built-in one too: the encoder writes it the
     * same whichever way it comes). */
    char *names[MT_TAG_MAX] = {0}, *name = NULL;
    bool named = mt__blog_kind_named(ev.kind);
    if (named) {
        if (!(name = malloc(tl + 1)))
            return MT_ENOMEM;
        memcpy(name, tag, tl);
        name[tl] = '\0';
        names[ev.tag] = name;
    }
    size_t m = mt_prof_alloc_write(f->line, f->cap2, &ev, pid, stack, mt__blog_name_of, names);
    if (m >= f->cap2) {
        char *b = realloc(f->line, m + 1);
        if (!b) {
            free(name);
            return MT_ENOMEM;
        }
        f->line = b;
        f->cap2 = m + 1;
        m = mt_prof_alloc_write(f->line, f->cap2, &ev, pid, stack, mt__blog_name_of, names);
    }
    if (m != n + 1 || memcmp(f->line, s, n) != 0) {
        free(name);
        return 0; /* not what the encoder writes: kept as text */
    }
    int rc = room(f, MT__BLOG_EVENT_MAX + MT__BLOG_TEXT_EXTRA + tl);
    if (rc == 0 && f->pid >= 0 && f->pid != pid)
        rc = block_out(f);
    if (rc != 0) {
        free(name);
        return rc;
    }
    f->pid = pid;
    if (named && !(f->st.named >> ev.tag & 1 && strcmp(f->names[ev.tag], name) == 0)) {
        f->len += mt__blog_put_name(&f->st, f->buf + f->len, ev.tag, name, (uint32_t)tl);
        f->nrec++;
        free(f->names[ev.tag]);
        f->names[ev.tag] = name;
        name = NULL;
    }
    free(name);
    f->len += mt__blog_put_event(&f->st, f->buf + f->len, &ev, stack);
    f->nrec++;
    return 1;
}

int mt__blog_from_ndjson(FILE *in, FILE *out, uint64_t *lines, uint64_t *events)
{
    from_t f = {
        .out = out, .cap = BLOCK_BYTES + 4096, .cap2 = 4096, .pid = -1, .len = MT__BLOG_HDR};
    mt__lines_t ls = {0};
    int rc = MT_ENOMEM;
    *lines = *events = 0;
    if (!(f.buf = malloc(f.cap)) || !(f.line = malloc(f.cap2)))
        goto out;
    if ((rc = mt__lines_open(&ls, in, MT__BLOG_BLOCK_MAX / 2)) != 0)
        goto out;
    const char *s;
    size_t n;
    while ((rc = mt__lines_next(&ls, &s, &n)) == 1) {
        if (n > 0 && s[n - 1] == '\n')
            n--;
        ++*lines;
        /* a line's names are given per block: a new block forgets them */
        rc = put_event(&f, s, n);
        if (rc == 1) {
            ++*events;
            continue;
        }
        if (rc < 0 || (rc = put_text(&f, s, n)) != 0)
            goto out;
    }
    if (rc == 0)
        rc = block_out(&f);
out:
    mt__lines_close(&ls);
    for (int t = 0; t < MT_TAG_MAX; t++)
        free(f.names[t]);
    free(f.line);
    free(f.buf);
    return rc;
}
