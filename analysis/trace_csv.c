/* RMM logging CSV: a strict streaming reader and a loader that resolves pointers to slots.
 * See trace_csv.h for the format and the error message shape. */
#include "analysis/trace_csv.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/zsource.h"
#include "memtrace/common.h"
#include "util/addrmap.h"
#include "util/grow.h"

enum { NFIELDS = 6, CHUNK = 64 * 1024, EXCERPT = 40 };

static const char *const field_names[NFIELDS] = {"Thread",  "Time", "Action",
                                                 "Pointer", "Size", "Stream"};

/* Invariants: pos <= len <= CHUNK; buf[pos, len) is read but not yet consumed;
 * once failed != 0 every call returns it. */
struct mt_trace_reader_s {
    FILE *f;         /* the file being read */
    mt__zsrc_t *z;   /* its decompression, when its first bytes name one (else NULL) */
    int codec;       /* that decompression's mt__zcodec_e */
    bool owns_file;  /* opened by mt__trace_reader_open: closed with the reader */
    bool at_eof;     /* fread (or the decompression) reported the end */
    int failed;      /* 0 or the sticky error code */
    uint64_t line;   /* number of the last line read, 1-based */
    size_t pos, len; /* consumed / filled bytes of buf */
    char *name;      /* for messages */
    char err[MT_TRACE_ERR_LEN];
    char buf[CHUNK];
    char text[MT_TRACE_MAX_LINE + 1]; /* the current line, NUL-terminated */
};

/* ---- messages ---- */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Prints at most EXCERPT bytes of s[0, n) into out, with non-printable bytes as \xNN, so a
 * message stays one readable line whatever the file holds. */
static void excerpt(char *out, size_t outlen, const char *s, size_t n)
{
    size_t o = 0;
    size_t shown = n < EXCERPT ? n : EXCERPT;
    for (size_t i = 0; i < shown && o + 5 < outlen; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, outlen - o, "\\x%02x", c);
    }
    if (shown < n && o + 4 < outlen) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o < outlen ? o : outlen - 1] = '\0';
}

static int fail(mt_trace_reader_t *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(mt_trace_reader_t *r, int code, const char *fmt, ...)
{
    char msg[MT_TRACE_ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(r->err, sizeof r->err, "%.200s:%llu: %.280s", r->name, (unsigned long long)r->line,
             msg);
    r->failed = code;
    return code;
}

static int fail_field(mt_trace_reader_t *r, int field, const char *what, const char *s, size_t n)
{
    char ex[EXCERPT * 4 + 8];
    excerpt(ex, sizeof ex, s, n);
    return fail(r, MT_EPROTO, "field '%s': %s: \"%s\"", field_names[field], what, ex);
}

/* ---- lines ---- */

/* Refills buf. Returns 0, or MT_EIO on a read error (MT_EPROTO: bad compressed data). */
static int refill(mt_trace_reader_t *r)
{
    r->pos = 0;
    if (r->z != NULL) {
        int rc = mt__zsrc_read(r->z, r->buf, sizeof r->buf, &r->len);
        r->at_eof = rc == 0 && r->len == 0;
        return rc;
    }
    r->len = fread(r->buf, 1, sizeof r->buf, r->f);
    if (r->len < sizeof r->buf) {
        if (ferror(r->f))
            return MT_EIO;
        r->at_eof = true;
    }
    return 0;
}

/* Reads the next line into r->text (line ending removed: "\n" or "\r\n").
 * Returns 1 for a line, 0 at end of file, or an error code.
 * *complete tells whether the line ended with a newline (false for a last line without one);
 * *length is its length. */
static int read_line(mt_trace_reader_t *r, size_t *length, bool *complete)
{
    size_t n = 0;
    bool too_long = false, nul = false, any = false;
    for (;;) {
        if (r->pos == r->len) {
            if (r->at_eof)
                break;
            int rc = refill(r);
            if (rc != 0) {
                r->line++;
                return r->z != NULL ? fail(r, rc, "%s", mt__zsrc_error(r->z))
                                    : fail(r, MT_EIO, "read error");
            }
            continue;
        }
        any = true;
        const char *start = r->buf + r->pos;
        const char *nl = memchr(start, '\n', r->len - r->pos);
        size_t take = nl ? (size_t)(nl - start) : r->len - r->pos;
        if (memchr(start, '\0', take) != NULL)
            nul = true;
        if (n + take > MT_TRACE_MAX_LINE) {
            /* Stop here: the rest of an endless line (/dev/zero) is never read. */
            too_long = true;
            size_t room = MT_TRACE_MAX_LINE - (n < MT_TRACE_MAX_LINE ? n : MT_TRACE_MAX_LINE);
            memcpy(r->text + n, start, room);
            n += room;
            r->pos += take;
            goto got;
        } else {
            memcpy(r->text + n, start, take);
            n += take;
        }
        r->pos += take + (nl ? 1 : 0);
        if (nl) {
            *complete = true;
            goto got;
        }
    }
    if (!any)
        return 0;
    *complete = false;
got:
    r->line++;
    r->text[n] = '\0';
    if (too_long)
        return fail(r, MT_EPROTO, "line longer than %d bytes", MT_TRACE_MAX_LINE);
    if (r->line == 1 && r->z != NULL && mt__zsrc_sniff(r->text, n) != MT__Z_NONE)
        return fail(r, MT_EPROTO, "%s data inside the %s data: compressed twice",
                    mt__zsrc_name(mt__zsrc_sniff(r->text, n)), mt__zsrc_name(r->codec));
    if (nul)
        return fail(r, MT_EPROTO, "NUL byte in line (not a text file?)");
    if (n > 0 && r->text[n - 1] == '\r')
        r->text[--n] = '\0';
    *length = n;
    return 1;
}

/* ---- fields ---- */

static bool parse_dec(const char *s, size_t n, uint64_t *out)
{
    if (n == 0 || n > 20)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool parse_hex(const char *s, size_t n, uint64_t *out)
{
    if (n == 0 || n > 16)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        int d = hex_digit(s[i]);
        if (d < 0)
            return false;
        v = (v << 4) | (uint64_t)d;
    }
    *out = v;
    return true;
}

/* A pointer or stream as RMM's releases write them: with 0x (fmt::ptr, the format of older
 * releases and of RMM_BACKWARDS_COMPATIBILITY builds) or without (printf's %llx, newer
 * ones), and the two mixed (a pointer with 0x and a stream without, as in RMM's docs). */
static bool parse_hex_0x(const char *s, size_t n, uint64_t *out)
{
    if (n >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        s += 2;
        n -= 2;
    }
    return parse_hex(s, n, out);
}

static bool two_digits(const char *s, unsigned max, unsigned *out)
{
    if (s[0] < '0' || s[0] > '9' || s[1] < '0' || s[1] > '9')
        return false;
    *out = (unsigned)(s[0] - '0') * 10 + (unsigned)(s[1] - '0');
    return *out <= max;
}

/* SECONDS[.FRACTION] (up to 12 and 9 digits), as RMM's documentation shows the Time
 * column (seconds since the epoch), into microseconds. */
static bool parse_seconds(const char *s, size_t n, uint64_t *out_us)
{
    const char *dot = memchr(s, '.', n);
    size_t ni = dot ? (size_t)(dot - s) : n, nf = dot ? n - ni - 1 : 0;
    uint64_t sec, frac = 0;
    if (ni == 0 || ni > 12 || (dot && (nf == 0 || nf > 9)) || !parse_dec(s, ni, &sec) ||
        (dot && !parse_dec(dot + 1, nf, &frac)))
        return false;
    for (size_t i = nf; i < 6; i++) /* microseconds: scaled up or cut down to 6 digits */
        frac *= 10;
    for (size_t i = 6; i < nf; i++)
        frac /= 10;
    *out_us = sec * 1000000 + frac;
    return true;
}

/* HH:MM:SS.uuuuuu, as spdlog's %H:%M:%S.%f writes it (what RMM's logging adaptor sets), or
 * seconds (parse_seconds). */
static bool parse_time(const char *s, size_t n, uint64_t *out_us)
{
    unsigned h, m, sec;
    uint64_t us;
    if (n > 2 && s[2] != ':')
        return parse_seconds(s, n, out_us);
    if (n != 15 || s[2] != ':' || s[5] != ':' || s[8] != '.')
        return false;
    if (!two_digits(s, 23, &h) || !two_digits(s + 3, 59, &m) || !two_digits(s + 6, 59, &sec))
        return false;
    if (!parse_dec(s + 9, 6, &us))
        return false;
    *out_us = ((uint64_t)h * 3600 + m * 60 + sec) * 1000000 + us;
    return true;
}

static int parse_row(mt_trace_reader_t *r, size_t n, bool complete, mt_trace_row_t *row)
{
    const char *f[NFIELDS];
    size_t fl[NFIELDS];
    size_t nf = 0;
    const char *s = r->text, *end = r->text + n;
    for (;;) {
        const char *c = memchr(s, ',', (size_t)(end - s));
        const char *stop = c ? c : end;
        if (nf < NFIELDS) {
            f[nf] = s;
            fl[nf] = (size_t)(stop - s);
        }
        nf++;
        if (!c)
            break;
        s = c + 1;
    }
    if (n == 0)
        return fail(r, MT_EPROTO, "empty line (expected %d fields)", NFIELDS);
    if (nf != NFIELDS) {
        if (!complete && nf < NFIELDS)
            return fail(r, MT_EPROTO,
                        "truncated line at end of file: %zu of %d fields (Thread,Time,"
                        "Action,Pointer,Size,Stream); field '%s' is missing",
                        nf, NFIELDS, field_names[nf]);
        if (nf < NFIELDS)
            return fail(r, MT_EPROTO, "expected %d fields, found %zu; field '%s' is missing",
                        NFIELDS, nf, field_names[nf]);
        return fail(r, MT_EPROTO, "expected %d fields, found %zu", NFIELDS, nf);
    }
    row->line = r->line;
    if (!parse_dec(f[0], fl[0], &row->thread))
        return fail_field(r, 0, fl[0] ? "not a decimal number" : "empty", f[0], fl[0]);
    if (!parse_time(f[1], fl[1], &row->time_us))
        return fail_field(r, 1, "not a time HH:MM:SS.uuuuuu or seconds", f[1], fl[1]);
    if (fl[2] == 8 && memcmp(f[2], "allocate", 8) == 0)
        row->action = MT_TRACE_ALLOCATE;
    else if ((fl[2] == 4 && memcmp(f[2], "free", 4) == 0) ||
             (fl[2] == 10 && memcmp(f[2], "deallocate", 10) == 0)) /* (RMM's docs' word) */
        row->action = MT_TRACE_FREE;
    else if (fl[2] == 16 && memcmp(f[2], "allocate failure", 16) == 0)
        row->action = MT_TRACE_ALLOCATE_FAILURE;
    else
        return fail_field(r, 2, "not one of allocate, free, allocate failure", f[2], fl[2]);
    if (!parse_hex_0x(f[3], fl[3], &row->ptr))
        return fail_field(r, 3, "not a hex pointer", f[3], fl[3]);
    if (!parse_dec(f[4], fl[4], &row->size))
        return fail_field(r, 4, fl[4] ? "not a decimal number" : "empty", f[4], fl[4]);
    if (!parse_hex_0x(f[5], fl[5], &row->stream)) {
        if (!complete && fl[5] == 0)
            return fail(r, MT_EPROTO, "truncated line at end of file: field 'Stream' is empty");
        return fail_field(r, 5, fl[5] ? "not a hex number" : "empty", f[5], fl[5]);
    }
    return 1;
}

bool mt__trace_is_header(const char *text, size_t len)
{
    size_t n = sizeof MT_TRACE_HEADER - 1;
    return len >= n && memcmp(text, MT_TRACE_HEADER, n) == 0;
}

/* ---- reader ---- */

int mt__trace_reader_from_file(mt_trace_reader_t **out, FILE *f, const char *name, char *err,
                               size_t errlen)
{
    *out = NULL;
    mt_trace_reader_t *r = calloc(1, sizeof *r);
    if (r == NULL || (r->name = strdup(name ? name : "-")) == NULL) {
        free(r);
        set_err(err, errlen, "%s: out of memory", name ? name : "-");
        return MT_ENOMEM;
    }
    r->f = f;
    /* The first bytes say whether the file is compressed (xz, gzip, zstd): then the reader
     * takes its lines from the decompression. */
    int rc = refill(r);
    int codec = rc == 0 ? mt__zsrc_sniff(r->buf, r->len) : MT__Z_NONE;
    if (rc != 0) {
        r->line = 1;
        rc = fail(r, MT_EIO, "read error");
    } else if (codec != MT__Z_NONE) {
        r->codec = codec;
        rc = mt__zsrc_open(&r->z, f, codec, r->buf, r->len);
        if (rc != 0)
            rc = fail(r, rc, "no memory for the %s decoder", mt__zsrc_name(codec));
        r->len = r->pos = 0;
        r->at_eof = false;
    }
    size_t n = 0;
    bool complete = false;
    if (rc == 0)
        rc = read_line(r, &n, &complete);
    if (rc == 0) {
        r->line = 1;
        rc = fail(r, MT_EPROTO, "empty file: expected the header %s", MT_TRACE_HEADER);
    } else if (rc == 1 && (n != strlen(MT_TRACE_HEADER) || memcmp(r->text, MT_TRACE_HEADER, n))) {
        char ex[EXCERPT * 4 + 8];
        excerpt(ex, sizeof ex, r->text, n);
        rc = fail(r, MT_EPROTO, "bad header \"%s\": expected exactly %s", ex, MT_TRACE_HEADER);
    }
    if (rc < 0) {
        set_err(err, errlen, "%s", r->err);
        mt__zsrc_close(&r->z);
        free(r->name);
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int mt__trace_reader_open(mt_trace_reader_t **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    if (strcmp(path, "-") == 0)
        return mt__trace_reader_from_file(out, stdin, "-", err, errlen);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        set_err(err, errlen, "%s: cannot open: %s", path, strerror(e));
        return e == ENOMEM ? MT_ENOMEM : MT_ENOENT; /* fopen allocates its buffer */
    }
    int rc = mt__trace_reader_from_file(out, f, path, err, errlen);
    if (rc < 0) {
        fclose(f);
        return rc;
    }
    (*out)->owns_file = true;
    return 0;
}

int mt__trace_reader_next(mt_trace_reader_t *r, mt_trace_row_t *row)
{
    if (r->failed)
        return r->failed;
    size_t n = 0;
    bool complete = false;
    int rc = read_line(r, &n, &complete);
    if (rc != 1)
        return rc;
    return parse_row(r, n, complete, row);
}

const char *mt__trace_reader_error(const mt_trace_reader_t *r)
{
    return r->err;
}

const char *mt__trace_reader_name(const mt_trace_reader_t *r)
{
    return r->name;
}

void mt__trace_reader_close(mt_trace_reader_t **p)
{
    mt_trace_reader_t *r = *p;
    if (r == NULL)
        return;
    mt__zsrc_close(&r->z);
    if (r->owns_file)
        fclose(r->f);
    free(r->name);
    free(r);
    *p = NULL;
}

const char *mt__trace_action_name(int action)
{
    switch (action) {
    case MT_TRACE_ALLOCATE:
        return "allocate";
    case MT_TRACE_FREE:
        return "free";
    case MT_TRACE_ALLOCATE_FAILURE:
        return "allocate failure";
    default:
        return "unknown";
    }
}

/* ---- live pointers: a dense array, indexed by pointer through util/addrmap ---- */

typedef struct live_s {
    uint64_t ptr;  /* trace pointer, != 0 */
    uint64_t size; /* bytes */
    uint64_t line; /* of its allocate */
    uint32_t slot;
    uint16_t stream;
} live_t;

/* Invariants: v[0..count) are the live pointers, distinct; at maps each one's ptr to its
 * index (at.n = count); count <= cap. */
typedef struct live_map_s {
    live_t *v;
    size_t count, cap;
    mt__amap_t at; /* ptr -> index in v */
} live_map_t;

static live_t *live_find(live_map_t *m, uint64_t p)
{
    uint64_t i;
    return mt__amap_get(&m->at, p, &i) == 0 ? &m->v[i] : NULL;
}

static int live_insert(live_map_t *m, const live_t *e)
{
    live_t *v = mt__grow(m->v, &m->cap, m->count + 1, sizeof *v, 1024);
    if (v == NULL)
        return MT_ENOMEM;
    m->v = v;
    int rc = mt__amap_put(&m->at, e->ptr, m->count);
    if (rc < 0)
        return rc;
    m->v[m->count++] = *e;
    return 0;
}

/* The last entry moves into e's place. */
static void live_remove(live_map_t *m, live_t *e)
{
    size_t i = (size_t)(e - m->v);
    mt__amap_del(&m->at, e->ptr);
    if (i + 1 < m->count) {
        m->v[i] = m->v[m->count - 1];
        mt__amap_put(&m->at, m->v[i].ptr, i); /* replaces: no allocation */
    }
    m->count--;
}

static void live_fini(live_map_t *m)
{
    free(m->v);
    mt__amap_fini(&m->at);
}

/* ---- loading ---- */

typedef struct loader_s {
    mt_trace_t *t;
    size_t cap_ops, cap_streams;
    live_map_t live;
    uint64_t live_bytes;
} loader_t;

int mt__trace_stream_index(mt_trace_t *t, size_t *cap, uint64_t stream, uint16_t *out)
{
    for (size_t i = 0; i < t->nstreams; i++)
        if (t->streams[i] == stream) {
            *out = (uint16_t)i;
            return 0;
        }
    if (t->nstreams == UINT16_MAX)
        return MT_EOVERFLOW;
    uint64_t *s = mt__grow(t->streams, cap, t->nstreams + 1, sizeof *s, 4);
    if (s == NULL)
        return MT_ENOMEM;
    t->streams = s;
    t->streams[t->nstreams] = stream;
    *out = (uint16_t)t->nstreams++;
    return 0;
}

static int push_op(loader_t *L, const mt_trace_op_t *op)
{
    mt_trace_t *t = L->t;
    mt_trace_op_t *o = mt__grow(t->ops, &L->cap_ops, t->nops + 1, sizeof *o, 1024);
    if (o == NULL)
        return MT_ENOMEM;
    t->ops = o;
    t->ops[t->nops++] = *op;
    return 0;
}

/* Applies one checked row. Returns 0, or an error with the message in err. */
static int load_row(loader_t *L, const mt_trace_row_t *row, const char *name, char *err,
                    size_t errlen)
{
    mt_trace_t *t = L->t;
    unsigned long long line = (unsigned long long)row->line;
    unsigned long long ptr = (unsigned long long)row->ptr;
    t->nrows++;
    if (row->action == MT_TRACE_ALLOCATE_FAILURE) {
        t->nfailures++;
        return 0;
    }
    mt_trace_op_t op = {.size = row->size, .action = (uint8_t)row->action};
    int rc = 0;
    if (row->ptr == 0) {
        /* A null pointer is what RMM logs for zero-byte requests (allocate) and for
         * deallocate(nullptr): neither touches memory, so neither becomes an op. */
        if (row->action == MT_TRACE_ALLOCATE && row->size != 0)
            goto null_alloc;
        if (row->action == MT_TRACE_ALLOCATE)
            t->nallocs++;
        else
            t->nfrees++;
        return 0;
    }
    if (row->action == MT_TRACE_ALLOCATE) {
        live_t *e = live_find(&L->live, row->ptr);
        if (e != NULL) {
            set_err(err, errlen,
                    "%s:%llu: field 'Pointer': allocate of 0x%llx, which is still live "
                    "(allocated at line %llu, not freed)",
                    name, line, ptr, (unsigned long long)e->line);
            return MT_EPROTO;
        }
        if (t->nallocs >= UINT32_MAX)
            goto too_big;
        live_t n = {
            .ptr = row->ptr, .size = row->size, .line = row->line, .slot = (uint32_t)t->nallocs};
        if ((rc = mt__trace_stream_index(L->t, &L->cap_streams, row->stream, &n.stream)) < 0) {
            if (rc == MT_ENOMEM)
                goto oom;
            goto too_big;
        }
        if ((rc = live_insert(&L->live, &n)) < 0)
            goto oom;
        op.slot = n.slot;
        op.stream = n.stream;
        t->nallocs++;
        /* Saturates: sizes are 64-bit, so a nonsense trace could wrap the sum. */
        L->live_bytes =
            row->size > UINT64_MAX - L->live_bytes ? UINT64_MAX : L->live_bytes + row->size;
        if (L->live_bytes > t->peak_live_bytes)
            t->peak_live_bytes = L->live_bytes;
        if (L->live.count > t->peak_live_count)
            t->peak_live_count = L->live.count;
    } else {
        live_t *e = live_find(&L->live, row->ptr);
        if (e == NULL) {
            set_err(err, errlen,
                    "%s:%llu: field 'Pointer': free of 0x%llx, which is not live "
                    "(never allocated, or already freed)",
                    name, line, ptr);
            return MT_EPROTO;
        }
        if (e->size != row->size) {
            set_err(err, errlen,
                    "%s:%llu: field 'Size': free of 0x%llx with size %llu, but it was "
                    "allocated with size %llu at line %llu",
                    name, line, ptr, (unsigned long long)row->size, (unsigned long long)e->size,
                    (unsigned long long)e->line);
            return MT_EPROTO;
        }
        op.slot = e->slot;
        /* The block belongs to the stream it was allocated on, whatever the free row says
         * (RMM logs the stream of the deallocate call, which may differ). */
        op.stream = e->stream;
        L->live_bytes = L->live_bytes > e->size ? L->live_bytes - e->size : 0;
        live_remove(&L->live, e);
        t->nfrees++;
    }
    if ((rc = push_op(L, &op)) < 0)
        goto oom;
    return 0;
null_alloc:
    set_err(err, errlen,
            "%s:%llu: field 'Pointer': allocate of %llu bytes returned 0x0 "
            "(a failed allocation is logged as 'allocate failure')",
            name, line, (unsigned long long)row->size);
    return MT_EPROTO;
too_big:
    set_err(err, errlen, "%s:%llu: too many allocations or streams for one trace", name, line);
    return MT_EOVERFLOW;
oom:
    set_err(err, errlen, "%s:%llu: out of memory", name, line);
    return MT_ENOMEM;
}

void mt__trace_free(mt_trace_t **p)
{
    mt_trace_t *t = *p;
    if (t == NULL)
        return;
    free(t->ops);
    free(t->streams);
    free(t);
    *p = NULL;
}

static int load(mt_trace_t **out, mt_trace_reader_t *r, char *err, size_t errlen)
{
    loader_t L = {.t = calloc(1, sizeof(mt_trace_t))};
    int rc = 0;
    if (L.t == NULL) {
        set_err(err, errlen, "%s: out of memory", mt__trace_reader_name(r));
        rc = MT_ENOMEM;
        goto done;
    }
    mt_trace_row_t row;
    while ((rc = mt__trace_reader_next(r, &row)) == 1)
        if ((rc = load_row(&L, &row, mt__trace_reader_name(r), err, errlen)) < 0)
            goto done;
    if (rc < 0) {
        set_err(err, errlen, "%s", mt__trace_reader_error(r));
        goto done;
    }
    L.t->nslots = L.t->nallocs;
    L.t->leaked = L.live.count;
done:
    live_fini(&L.live);
    if (rc < 0)
        mt__trace_free(&L.t);
    *out = L.t;
    return rc;
}

int mt__trace_load_file(mt_trace_t **out, FILE *f, const char *name, char *err, size_t errlen)
{
    *out = NULL;
    mt_trace_reader_t *r;
    int rc = mt__trace_reader_from_file(&r, f, name, err, errlen);
    if (rc < 0)
        return rc;
    rc = load(out, r, err, errlen);
    mt__trace_reader_close(&r);
    return rc;
}

int mt__trace_load(mt_trace_t **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    mt_trace_reader_t *r;
    int rc = mt__trace_reader_open(&r, path, err, errlen);
    if (rc < 0)
        return rc;
    rc = load(out, r, err, errlen);
    mt__trace_reader_close(&r);
    return rc;
}
