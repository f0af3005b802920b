/* The restricted pickle reader (pickle.h): one pass over the bytes, a stack machine for
 * the plain-data opcodes only, values in an arena. Opcodes and their operands follow
 * Python's Lib/pickletools.py, the format's own description. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "analysis/pickle_internal.h"
#include "analysis/zsource.h"
#include "memtrace/common.h"

mt_pk_cfg_t mt__pk_cfg_default(void)
{
    return (mt_pk_cfg_t){
        .max_depth = 64,
        .max_stack = (size_t)1 << 20,
        .max_memo = (size_t)1 << 26,
        .max_memory = (size_t)4 << 30,
        .max_inflate = MT__PK_INFLATE_MAX,
    };
}

/* ---- operands ---- */

static int take(mt__pk_reader_t *r, size_t n, const unsigned char **out)
{
    if ((size_t)(r->end - r->p) < n)
        return mt__pk_fail(r, MT_EPROTO,
                           "needs %zu bytes of operand, the file has %zu left (truncated)", n,
                           (size_t)(r->end - r->p));
    *out = r->p;
    r->p += n;
    return 0;
}

static uint64_t le(const unsigned char *b, size_t n)
{
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;)
        v = v << 8 | b[i];
    return v;
}

/* A length operand of n bytes, checked against the bytes left. */
static int take_len(mt__pk_reader_t *r, size_t n, size_t *len)
{
    const unsigned char *b = NULL;
    if (take(r, n, &b) < 0)
        return r->rc;
    uint64_t v = le(b, n);
    if (v > (uint64_t)(r->end - r->p))
        return mt__pk_fail(r, MT_EPROTO,
                           "a length of %llu bytes, the file has %zu left (truncated, or a length "
                           "that lies)",
                           (unsigned long long)v, (size_t)(r->end - r->p));
    *len = (size_t)v;
    return 0;
}

/* UTF-8 as Python's decoder with 'surrogatepass' accepts it (pickle writes surrogates
 * that way). */
static bool utf8_ok(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        unsigned lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf)
            k = 1;
        else if (c >= 0xe0 && c <= 0xef) {
            k = 2;
            if (c == 0xe0)
                lo = 0xa0;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3;
            if (c == 0xf0)
                lo = 0x90;
            if (c == 0xf4)
                hi = 0x8f;
        } else
            return false;
        if (n - i <= k || s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
        i += k + 1;
    }
    return true;
}

static int string(mt__pk_reader_t *r, int type, size_t lenbytes)
{
    size_t n;
    if (take_len(r, lenbytes, &n) < 0)
        return r->rc;
    const unsigned char *b = r->p;
    r->p += n;
    if (type == MT_PK_STR && !utf8_ok(b, n))
        return mt__pk_fail(r, MT_EPROTO, "a str of %zu bytes that is not UTF-8", n);
    mt_pk_value_t *v = mt__pk_new_value(r, type);
    char *s = v ? mt__pk_alloc(r, n + 1) : NULL;
    if (s == NULL)
        return r->rc;
    memcpy(s, b, n);
    s[n] = '\0';
    v->u.s = s;
    v->n = n;
    return mt__pk_push(r, v);
}

static int integer(mt__pk_reader_t *r, int64_t i)
{
    mt_pk_value_t *v = mt__pk_new_value(r, MT_PK_INT);
    if (v == NULL)
        return r->rc;
    v->u.i = i;
    return mt__pk_push(r, v);
}

/* LONG1/LONG4: little-endian two's complement of n bytes. */
static int long_n(mt__pk_reader_t *r, size_t lenbytes)
{
    size_t n;
    const unsigned char *b = NULL;
    if (take_len(r, lenbytes, &n) < 0 || take(r, n, &b) < 0)
        return r->rc;
    /* Redundant sign bytes beyond 8 are allowed, as long as the value fits. */
    while (n > 8 &&
           ((b[n - 1] == 0 && !(b[n - 2] & 0x80)) || (b[n - 1] == 0xff && (b[n - 2] & 0x80))))
        n--;
    /* 2^63..2^64-1: PyTorch writes C++'s size_t as it is (a frame's unknown line is
     * SIZE_MAX); kept as its 64-bit pattern, which reads -1 for SIZE_MAX. */
    if (n == 9 && b[8] == 0 && (b[7] & 0x80))
        return integer(r, (int64_t)le(b, 8));
    if (n > 8)
        return mt__pk_fail(r, MT_EPROTO, "an integer of %zu bytes does not fit in 64 bits", n);
    if (n == 0)
        return integer(r, 0);
    uint64_t u = le(b, n);
    if (n < 8 && (b[n - 1] & 0x80))
        u |= ~(uint64_t)0 << (8 * n);
    return integer(r, (int64_t)u);
}

static int memo_put(mt__pk_reader_t *r, size_t idx)
{
    if (r->sp == 0 || (r->nmarks && r->marks[r->nmarks - 1] == r->sp))
        return mt__pk_fail(r, MT_EPROTO, "nothing on the stack to memoize");
    if (idx > r->nmemo)
        return mt__pk_fail(r, MT_EPROTO, "memo index %zu skips past the memo's %zu entries", idx,
                           r->nmemo);
    if (r->in_batch && idx < r->batch_memo_low)
        r->batch_memo_low = idx;
    size_t s = mt__pk_memo_slot(r, idx);
    if (s != SIZE_MAX && s >= r->memo_cap &&
        mt__pk_grow(r, (void **)&r->memo, &r->memo_cap, s + 1, sizeof *r->memo, r->cfg->max_memo,
                    "memo entries") < 0)
        return r->rc;
    if (idx == r->nmemo)
        r->nmemo++;
    if (s != SIZE_MAX)
        r->memo[s] = r->stack[r->sp - 1];
    return 0;
}

static int memo_get(mt__pk_reader_t *r, size_t idx)
{
    if (idx >= r->nmemo)
        return mt__pk_fail(r, MT_EPROTO, "memo index %zu not set (the memo has %zu entries)", idx,
                           r->nmemo);
    size_t s = mt__pk_memo_slot(r, idx);
    if (s == SIZE_MAX || r->memo[s] == NULL)
        return mt__pk_fail(r, MT_EAGAIN, "memo index %zu is a value streamed and freed", idx);
    return mt__pk_push(r, r->memo[s]);
}

/* GLOBAL's operands, for the message only: "module.name" cut short and made printable. */
static void global_name(mt__pk_reader_t *r, char *out, size_t len)
{
    size_t o = 0;
    int lines = 0;
    for (const unsigned char *q = r->p; q < r->end && lines < 2 && o + 1 < len; q++) {
        if (*q == '\n') {
            if (++lines < 2 && o + 1 < len)
                out[o++] = '.';
            continue;
        }
        out[o++] = *q >= 0x20 && *q < 0x7f ? (char)*q : '?';
    }
    out[o] = '\0';
}

/* ---- the machine ---- */

static int refuse(mt__pk_reader_t *r)
{
    switch (r->op) {
    case 'c':
    case 'i': {
        char name[96];
        global_name(r, name, sizeof name);
        return mt__pk_fail(r, MT_EPROTO,
                           "refused: it would import %s (a snapshot holds only plain "
                           "data; nothing is imported or called)",
                           name[0] ? name : "a name");
    }
    case 0x93:
    case 'R':
    case 'b':
    case 'o':
    case 0x81:
    case 0x92:
    case 0x82:
    case 0x83:
    case 0x84:
    case 'P':
    case 'Q':
        return mt__pk_fail(r, MT_EPROTO,
                           "refused: it imports, builds or calls objects (a snapshot "
                           "holds only plain data; nothing is imported or called)");
    default:
        if (strcmp(mt__pk_opcode_name(r->op), "unknown") == 0)
            return mt__pk_fail(r, MT_EPROTO, "not a pickle opcode");
        return mt__pk_fail(r, MT_EPROTO,
                           "refused: not one of the opcodes pickle.dump writes for "
                           "a snapshot (protocols 2 to 5, plain data)");
    }
}

static int step(mt__pk_reader_t *r, bool *stop)
{
    const unsigned char *b = NULL;
    size_t n = 0, base = 0;
    mt_pk_value_t *v;
    switch (r->op) {
    case 0x80: /* PROTO */
        if (take(r, 1, &b) < 0)
            return r->rc;
        if (*b < 2 || *b > 5)
            return mt__pk_fail(r, MT_EPROTO, "protocol %u; this reader takes protocols 2 to 5", *b);
        return 0;
    case 0x95: /* FRAME: a hint for buffered readers; the length must hold */
        return take_len(r, 8, &n);
    case '.':
        if (r->nmarks)
            return mt__pk_fail(r, MT_EPROTO, "%zu MARK%s left open", r->nmarks,
                               r->nmarks == 1 ? "" : "s");
        if (r->sp != 1)
            return mt__pk_fail(r, MT_EPROTO, "%zu values on the stack instead of one", r->sp);
        *stop = true;
        return 0;
    case 'N':
        return mt__pk_push(r, mt__pk_new_value(r, MT_PK_NONE));
    case 0x88:
    case 0x89:
        if ((v = mt__pk_new_value(r, MT_PK_BOOL)) != NULL)
            v->u.i = r->op == 0x88;
        return mt__pk_push(r, v);
    case 'J':
        if (take(r, 4, &b) < 0)
            return r->rc;
        return integer(r, (int32_t)(uint32_t)le(b, 4));
    case 'K':
        if (take(r, 1, &b) < 0)
            return r->rc;
        return integer(r, b[0]);
    case 'M':
        if (take(r, 2, &b) < 0)
            return r->rc;
        return integer(r, (int64_t)le(b, 2));
    case 0x8a:
        return long_n(r, 1);
    case 0x8b:
        return long_n(r, 4);
    case 'G': {
        if (take(r, 8, &b) < 0)
            return r->rc;
        uint64_t u = 0;
        for (int i = 0; i < 8; i++)
            u = u << 8 | b[i];
        if ((v = mt__pk_new_value(r, MT_PK_FLOAT)) != NULL)
            memcpy(&v->u.f, &u, 8);
        return mt__pk_push(r, v);
    }
    case 0x8c:
        return string(r, MT_PK_STR, 1);
    case 'X':
        return string(r, MT_PK_STR, 4);
    case 0x8d:
        return string(r, MT_PK_STR, 8);
    case 'C':
        return string(r, MT_PK_BYTES, 1);
    case 'B':
        return string(r, MT_PK_BYTES, 4);
    case 0x8e:
    case 0x96:
        return string(r, MT_PK_BYTES, 8);
    case ']':
        return mt__pk_push(r, mt__pk_new_value(r, MT_PK_LIST));
    case '}':
        return mt__pk_push(r, mt__pk_new_value(r, MT_PK_DICT));
    case ')':
        return mt__pk_push(r, mt__pk_new_value(r, MT_PK_TUPLE));
    case 0x85:
    case 0x86:
    case 0x87:
        return mt__pk_make_tuple(r, r->op - 0x84u);
    case 't':
        if (mt__pk_pop_mark(r, &base) < 0)
            return r->rc;
        return mt__pk_make_tuple(r, r->sp - base);
    case '(':
        if (r->nmarks >= r->cfg->max_depth * 2u)
            return mt__pk_fail(r, MT_EPROTO, "more than %u MARKs open (limit of this reader)",
                               r->cfg->max_depth * 2u);
        if (r->stream != NULL && mt__pk_stream_mark(r) < 0)
            return r->rc;
        if (r->nmarks == r->marks_cap &&
            mt__pk_grow(r, (void **)&r->marks, &r->marks_cap, r->nmarks + 1, sizeof *r->marks,
                        r->cfg->max_depth * 2u, "MARKs") < 0)
            return r->rc;
        r->marks[r->nmarks++] = r->sp;
        return 0;
    case 'a':
    case 's':
        n = r->op == 'a' ? 1 : 2;
        if (mt__pk_need_stack(r, n + 1) < 0)
            return r->rc;
        if (r->op == 'a' && r->stream != NULL) {
            int took =
                mt__pk_stream_items(r, r->stack[r->sp - 2], r->stack + r->sp - 1, 1, SIZE_MAX);
            if (took < 0)
                return r->rc;
            if (took) {
                r->sp--;
                return 0;
            }
        }
        if (mt__pk_extend(r, r->stack[r->sp - n - 1], r->stack + r->sp - n, n) < 0)
            return r->rc;
        r->sp -= n;
        return 0;
    case 'e':
    case 'u':
        if (mt__pk_pop_mark(r, &base) < 0)
            return r->rc;
        n = r->sp - base;
        if (base == 0 || (r->nmarks && r->marks[r->nmarks - 1] == base))
            return mt__pk_fail(r, MT_EPROTO, "no %s below its MARK",
                               r->op == 'e' ? "list" : "dict");
        if (r->op == 'u' && n % 2)
            return mt__pk_fail(r, MT_EPROTO, "an odd number of values (%zu) for key, value pairs",
                               n);
        if (r->op == 'e' && r->stream != NULL) {
            int took = mt__pk_stream_items(r, r->stack[base - 1], r->stack + base, n, r->nmarks);
            if (took < 0)
                return r->rc;
            if (took) {
                r->sp = base;
                return 0;
            }
        }
        if (mt__pk_extend(r, r->stack[base - 1], r->stack + base, n) < 0)
            return r->rc;
        r->sp = base;
        return 0;
    case 0x94:
        return memo_put(r, r->nmemo);
    case 'q':
        if (take(r, 1, &b) < 0)
            return r->rc;
        return memo_put(r, b[0]);
    case 'r':
        if (take(r, 4, &b) < 0)
            return r->rc;
        return memo_put(r, (size_t)le(b, 4));
    case 'h':
        if (take(r, 1, &b) < 0)
            return r->rc;
        return memo_get(r, b[0]);
    case 'j':
        if (take(r, 4, &b) < 0)
            return r->rc;
        return memo_get(r, (size_t)le(b, 4));
    default:
        return refuse(r);
    }
}

static int parse(mt_pk_doc_t **out, const void *buf, size_t len, const mt_pk_cfg_t *cfg,
                 const mt_pk_stream_t *stream, bool mapped, char *err, size_t errlen)
{
    mt_pk_cfg_t def = mt__pk_cfg_default();
    char dummy[1];
    mt__pk_reader_t r = {
        .cfg = cfg ? cfg : &def,
        .start = buf,
        .p = buf,
        .end = (const unsigned char *)buf + len,
        .err = err ? err : dummy,
        .errlen = err ? errlen : sizeof dummy,
        .stream = stream,
        .mapped = mapped,
    };
    *out = NULL;
    if ((r.doc = calloc(1, sizeof *r.doc)) == NULL) {
        snprintf(r.err, r.errlen, "out of memory");
        return MT_ENOMEM;
    }
    r.doc->input_size = len;
    bool stop = false;
    if (len < 2 || r.p[0] != 0x80) {
        snprintf(r.err, r.errlen,
                 "offset 0: not a pickle of protocol 2 to 5 (it does not start with PROTO)");
        r.rc = MT_EPROTO;
    }
    if (r.rc == 0 && stream != NULL)
        mt__pk_prescan(&r);
    while (r.rc == 0 && !stop) {
        if (r.p == r.end) {
            snprintf(r.err, r.errlen, "offset %zu: the file ends before STOP (truncated)", len);
            r.rc = MT_EPROTO;
            break;
        }
        r.op_offset = (size_t)(r.p - r.start);
        r.op = *r.p++;
        step(&r, &stop);
        if (r.mapped && r.op_offset - r.dropped >= ((size_t)16 << 20))
            mt__pk_drop_pages(&r, r.p);
    }
    if (r.rc == 0 && r.p != r.end) {
        snprintf(r.err, r.errlen, "offset %zu: %zu bytes after STOP", (size_t)(r.p - r.start),
                 (size_t)(r.end - r.p));
        r.rc = MT_EPROTO;
    }
    if (r.rc == 0)
        r.doc->root = r.stack[0];
    mt__pk_stream_abort(&r);
    free(r.refd);
    free(r.rank);
    free(r.stack);
    free(r.memo);
    free(r.marks);
    if (r.rc != 0) {
        mt__pk_doc_free(r.doc);
        return r.rc;
    }
    *out = r.doc;
    return 0;
}

int mt__pk_parse(mt_pk_doc_t **out, const void *buf, size_t len, const mt_pk_cfg_t *cfg, char *err,
                 size_t errlen)
{
    return parse(out, buf, len, cfg, NULL, false, err, errlen);
}

int mt__pk_parse_stream(mt_pk_doc_t **out, const void *buf, size_t len, const mt_pk_cfg_t *cfg,
                        const mt_pk_stream_t *stream, char *err, size_t errlen)
{
    return parse(out, buf, len, cfg, stream, false, err, errlen);
}

/* The bytes of f (borrowed, at its start) as they read through zsource's stream (the
 * decompression its first bytes announce, else as they are) into a buffer of their own:
 * *buf (malloc'd) and *len. At most max bytes; err names the decoder's complaint or the
 * limit. */
static int slurp(FILE *f, size_t max, const char *path, char **buf, size_t *len, char *err,
                 size_t errlen)
{
    *buf = NULL;
    *len = 0;
    mt__zfile_t *zf = NULL;
    int rc = mt__zfile_open(&zf, f);
    if (rc != 0) {
        snprintf(err, errlen, "%s: %s", path, rc == MT_ENOMEM ? "out of memory" : "cannot read");
        return rc;
    }
    FILE *in = mt__zfile_stream(zf);
    const char *codec = mt__zsrc_name(mt__zfile_codec(zf));
    char *b = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        bool full = n == cap && cap >= max; /* the input must end here */
        if (!full && n == cap) {
            size_t ncap = cap == 0 ? (size_t)1 << 20 : cap * 2;
            ncap = ncap > max ? max : ncap;
            char *nb = realloc(b, ncap);
            if (nb == NULL) {
                snprintf(err, errlen, "%s: out of memory reading it (%zu bytes)", path, ncap);
                rc = MT_ENOMEM;
                goto done;
            }
            b = nb;
            cap = ncap;
        }
        unsigned char more;
        size_t got = fread(full ? (char *)&more : b + n, 1, full ? 1 : cap - n, in);
        if (got == 0 && ferror(in)) {
            const char *why = mt__zfile_error(zf);
            snprintf(err, errlen, "%s: %s", path, why[0] ? why : "read error");
            rc = why[0] ? MT_EPROTO : MT_EIO;
            goto done;
        }
        if (got == 0)
            break;
        if (n == 0 && (full ? more : (unsigned char)b[0]) != 0x80) {
            /* not a pickle: said now, not after 4 GiB of it */
            snprintf(err, errlen,
                     "%s: offset 0: not a pickle of protocol 2 to 5 (it does not start with "
                     "PROTO)",
                     path);
            rc = MT_EPROTO;
            goto done;
        }
        if (full) {
            if (mt__zfile_codec(zf) != MT__Z_NONE)
                snprintf(err, errlen,
                         "%s: compressed with %s, it decompresses to more than %zu bytes: "
                         "decompress it first (%s -dk FILE)",
                         path, codec, max, codec);
            else
                snprintf(err, errlen, "%s: more than %zu bytes through a pipe: give it as a file",
                         path, max);
            rc = MT_EPROTO;
            goto done;
        }
        n += got;
    }
    *buf = b;
    *len = n;
    b = NULL;
done:
    free(b);
    mt__zfile_close(&zf);
    return rc;
}

int mt__pk_parse_file_stream(mt_pk_doc_t **out, const char *path, const mt_pk_cfg_t *cfg,
                             const mt_pk_stream_t *stream, char *err, size_t errlen)
{
    *out = NULL;
    /* "-": standard input (a pipe, or a file given with <) */
    int fd =
        strcmp(path, "-") == 0 ? fcntl(0, F_DUPFD_CLOEXEC, 3) : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(e));
        return e == ENOENT ? MT_ENOENT : MT_EIO;
    }
    int rc = MT_EIO;
    struct stat st;
    void *map = MAP_FAILED;
    char *buf = NULL;
    FILE *f = NULL;
    if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s: cannot read (a directory?)", path);
        goto done;
    }
    size_t size = (size_t)st.st_size;
    bool reg = S_ISREG(st.st_mode);
    /* A plain regular file is mapped. A compressed one (known by its first bytes) is read
     * through its decompression into memory, and so is whatever a pipe brings. */
    unsigned char head[6];
    ssize_t nh = reg ? pread(fd, head, sizeof head, 0) : 0; /* (zsource looks into a pipe) */
    int codec = mt__zsrc_sniff(head, nh > 0 ? (size_t)nh : 0);
    if (codec != MT__Z_NONE || !reg) {
        size_t max = cfg != NULL ? cfg->max_inflate : MT__PK_INFLATE_MAX;
        if ((f = fdopen(fd, "rb")) == NULL) {
            snprintf(err, errlen, "%s: cannot read", path);
            goto done;
        }
        fd = -1; /* f's now */
        if ((rc = slurp(f, max, path, &buf, &size, err, errlen)) != 0)
            goto done;
    } else {
        /* Mapped, the file is read once from the page cache and its pages given back as
         * the reader passes them; a copy in memory would cost its whole size until the end. */
        if (size > 0)
            map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map != MAP_FAILED)
            madvise(map, size, MADV_SEQUENTIAL);
        else {
            if ((buf = malloc(size ? size : 1)) == NULL) {
                snprintf(err, errlen, "%s: out of memory for %zu bytes", path, size);
                rc = MT_ENOMEM;
                goto done;
            }
            for (size_t got = 0; got < size;) {
                ssize_t k = pread(fd, buf + got, size - got, (off_t)got);
                if (k <= 0) {
                    snprintf(err, errlen, "%s: read error", path);
                    goto done;
                }
                got += (size_t)k;
            }
        }
    }
    char msg[512];
    const void *bytes = map != MAP_FAILED ? map : buf;
    if (stream != NULL && stream->begin != NULL)
        stream->begin(stream->ud, size);
    rc = parse(out, bytes, size, cfg, stream, map != MAP_FAILED, msg, sizeof msg);
    if (rc < 0)
        snprintf(err, errlen, "%s: %s", path, msg);
done:
    if (map != MAP_FAILED)
        munmap(map, size);
    free(buf);
    if (f != NULL)
        fclose(f);
    if (fd >= 0)
        close(fd);
    return rc;
}

int mt__pk_parse_file(mt_pk_doc_t **out, const char *path, const mt_pk_cfg_t *cfg, char *err,
                      size_t errlen)
{
    return mt__pk_parse_file_stream(out, path, cfg, NULL, err, errlen);
}
