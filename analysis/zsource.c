/* Decompression while reading (zsource.h): one step loop over three decoders. */
#include "analysis/zsource.h"

#include <errno.h>
#include <fcntl.h>
#include <lzma.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>
#include <unistd.h>

#include "memtrace/common.h"

enum { IN_CHUNK = 64 * 1024 };

/* Invariants: in_pos <= in_len <= IN_CHUNK; in[in_pos, in_len) is read from f and not yet
 * given to the decoder; in_off = the file's bytes before in[0]; once failed != 0 every read
 * returns it; done => the decoder ended and the input is used up. */
struct mt__zsrc_s {
    FILE *f;
    int codec;
    int failed;
    bool in_eof;   /* f has no more bytes */
    bool done;     /* the end: every stream decoded, nothing after them */
    bool boundary; /* gzip, zstd: the last step ended a member or frame */
    size_t in_pos, in_len;
    uint64_t in_off;
    union {
        lzma_stream xz;
        z_stream gz;
        ZSTD_DStream *zs;
    } u;
    char err[256];
    unsigned char in[IN_CHUNK];
};

static int fail(mt__zsrc_t *z, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(mt__zsrc_t *z, int code, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(z->err, sizeof z->err, "%s: %s (at byte %llu of the file)", mt__zsrc_name(z->codec),
             msg, (unsigned long long)(z->in_off + z->in_pos));
    z->failed = code;
    return code;
}

int mt__zsrc_sniff(const void *p, size_t n)
{
    static const unsigned char xz[6] = {0xfd, '7', 'z', 'X', 'Z', 0};
    static const unsigned char gz[2] = {0x1f, 0x8b};
    static const unsigned char zst[4] = {0x28, 0xb5, 0x2f, 0xfd};
    if (n >= sizeof xz && memcmp(p, xz, sizeof xz) == 0)
        return MT__Z_XZ;
    if (n >= sizeof gz && memcmp(p, gz, sizeof gz) == 0)
        return MT__Z_GZIP;
    if (n >= sizeof zst && memcmp(p, zst, sizeof zst) == 0)
        return MT__Z_ZSTD;
    /* a skippable frame first (pzstd writes one): 0x184D2A50..5F, little-endian */
    const unsigned char *b = p;
    if (n >= 4 && (b[0] & 0xF0) == 0x50 && b[1] == 0x2A && b[2] == 0x4D && b[3] == 0x18)
        return MT__Z_ZSTD;
    return MT__Z_NONE;
}

const char *mt__zsrc_name(int codec)
{
    switch (codec) {
    case MT__Z_XZ:
        return "xz";
    case MT__Z_GZIP:
        return "gzip";
    case MT__Z_ZSTD:
        return "zstd";
    default:
        return "none";
    }
}

int mt__zsrc_open(mt__zsrc_t **out, FILE *f, int codec, const void *pre, size_t npre)
{
    *out = NULL;
    if (f == NULL || npre > IN_CHUNK || (npre > 0 && pre == NULL) ||
        (codec != MT__Z_XZ && codec != MT__Z_GZIP && codec != MT__Z_ZSTD))
        return MT_EINVAL;
    mt__zsrc_t *z = calloc(1, sizeof *z);
    if (z == NULL)
        return MT_ENOMEM;
    z->f = f;
    z->codec = codec;
    if (npre > 0)
        memcpy(z->in, pre, npre);
    z->in_len = npre;
    int ok;
    if (codec == MT__Z_XZ) {
        z->u.xz = (lzma_stream)LZMA_STREAM_INIT;
        ok = lzma_stream_decoder(&z->u.xz, MT__Z_MEMLIMIT, LZMA_CONCATENATED) == LZMA_OK;
    } else if (codec == MT__Z_GZIP) {
        ok = inflateInit2(&z->u.gz, 15 + 16) == Z_OK; /* 15 + 16: a gzip header only */
    } else {
        z->u.zs = ZSTD_createDStream();
        ok = z->u.zs != NULL &&
             !ZSTD_isError(ZSTD_DCtx_setParameter(z->u.zs, ZSTD_d_windowLogMax, 28));
        if (!ok)
            ZSTD_freeDStream(z->u.zs);
    }
    if (!ok) {
        free(z);
        return MT_ENOMEM;
    }
    *out = z;
    return 0;
}

/* More input when what was read is used up. Returns 0 or MT_EIO. */
static int fill(mt__zsrc_t *z)
{
    if (z->in_pos < z->in_len || z->in_eof)
        return 0;
    z->in_off += z->in_len;
    z->in_pos = 0;
    z->in_len = fread(z->in, 1, sizeof z->in, z->f);
    if (z->in_len < sizeof z->in) {
        if (ferror(z->f))
            return fail(z, MT_EIO, "read error");
        z->in_eof = true;
    }
    return 0;
}

/* One xz step into out[0, cap): *n produced. */
static int step_xz(mt__zsrc_t *z, unsigned char *out, size_t cap, size_t *n)
{
    lzma_stream *s = &z->u.xz;
    s->next_in = z->in + z->in_pos;
    s->avail_in = z->in_len - z->in_pos;
    s->next_out = out;
    s->avail_out = cap;
    /* FINISH once the last input is in: the decoder then knows that nothing follows. */
    lzma_ret ret = lzma_code(s, z->in_eof ? LZMA_FINISH : LZMA_RUN);
    z->in_pos = z->in_len - s->avail_in;
    *n = cap - s->avail_out;
    switch (ret) {
    case LZMA_OK:
        return 0;
    case LZMA_STREAM_END:
        z->done = true;
        return 0;
    case LZMA_MEMLIMIT_ERROR:
        return fail(z, MT_EPROTO, "needs more than %zu MiB of memory to decompress",
                    MT__Z_MEMLIMIT >> 20);
    case LZMA_MEM_ERROR:
        return fail(z, MT_ENOMEM, "out of memory");
    case LZMA_FORMAT_ERROR:
    case LZMA_OPTIONS_ERROR:
        return fail(z, MT_EPROTO, "not a stream this decoder reads");
    case LZMA_DATA_ERROR:
        return fail(z, MT_EPROTO, "compressed data is corrupt");
    case LZMA_BUF_ERROR:
        return fail(z, MT_EPROTO, "the file ends inside compressed data (truncated?)");
    default:
        return fail(z, MT_EPROTO, "decoder error %d", (int)ret);
    }
}

/* One gzip step; a member's end is a boundary, and what follows it must be another member. */
static int step_gzip(mt__zsrc_t *z, unsigned char *out, size_t cap, size_t *n)
{
    z_stream *s = &z->u.gz;
    *n = 0;
    if (z->boundary) {
        if (z->in_pos == z->in_len) { /* (fill ran: the input is at its end) */
            z->done = true;
            return 0;
        }
        if (inflateReset(s) != Z_OK)
            return fail(z, MT_EPROTO, "decoder error");
        z->boundary = false;
    }
    s->next_in = z->in + z->in_pos;
    s->avail_in = (uInt)(z->in_len - z->in_pos);
    s->next_out = out;
    s->avail_out = (uInt)(cap > UINT32_MAX ? UINT32_MAX : cap);
    uInt out0 = s->avail_out;
    int ret = inflate(s, Z_NO_FLUSH);
    z->in_pos = z->in_len - s->avail_in;
    *n = out0 - s->avail_out;
    switch (ret) {
    case Z_OK:
    case Z_BUF_ERROR: /* no progress possible with this input: more is read, or it ends */
        return 0;
    case Z_STREAM_END:
        z->boundary = true;
        return 0;
    case Z_MEM_ERROR:
        return fail(z, MT_ENOMEM, "out of memory");
    default:
        return fail(z, MT_EPROTO, "compressed data is corrupt (%s)", s->msg ? s->msg : "?");
    }
}

/* One zstd step; a frame's end is a boundary (frames follow one another). */
static int step_zstd(mt__zsrc_t *z, unsigned char *out, size_t cap, size_t *n)
{
    ZSTD_inBuffer in = {z->in + z->in_pos, z->in_len - z->in_pos, 0};
    ZSTD_outBuffer o = {out, cap, 0};
    size_t ret = ZSTD_decompressStream(z->u.zs, &o, &in);
    z->in_pos += in.pos;
    *n = o.pos;
    if (ZSTD_isError(ret)) {
        if (ZSTD_getErrorCode(ret) == ZSTD_error_frameParameter_windowTooLarge)
            return fail(z, MT_EPROTO, "needs more than %zu MiB of memory to decompress",
                        MT__Z_MEMLIMIT >> 20);
        if (ZSTD_getErrorCode(ret) == ZSTD_error_memory_allocation)
            return fail(z, MT_ENOMEM, "out of memory");
        return fail(z, MT_EPROTO, "compressed data is corrupt (%s)", ZSTD_getErrorName(ret));
    }
    if (in.pos > 0 || o.pos > 0) /* (a step with nothing to do says what the next frame needs) */
        z->boundary = ret == 0;
    return 0;
}

int mt__zsrc_read(mt__zsrc_t *z, void *buf, size_t cap, size_t *n)
{
    *n = 0;
    if (z->failed)
        return z->failed;
    while (!z->done && cap > 0) {
        int rc = fill(z);
        if (rc != 0)
            return rc;
        size_t pos0 = z->in_pos;
        rc = z->codec == MT__Z_XZ     ? step_xz(z, buf, cap, n)
             : z->codec == MT__Z_GZIP ? step_gzip(z, buf, cap, n)
                                      : step_zstd(z, buf, cap, n);
        if (*n > 0) /* what came out before an error is delivered; the error comes next */
            return 0;
        if (rc != 0 || z->done)
            return rc;
        /* Nothing came out: the decoder waits for input. At the end of the file that is the
         * end, if a member or frame had just ended; else the file was cut. */
        if (z->in_pos == pos0 && z->in_pos == z->in_len && z->in_eof) {
            if (z->boundary)
                z->done = true;
            else
                return fail(z, MT_EPROTO, "the file ends inside compressed data (truncated?)");
        }
    }
    return 0;
}

const char *mt__zsrc_error(const mt__zsrc_t *z)
{
    return z->err;
}

void mt__zsrc_close(mt__zsrc_t **p)
{
    mt__zsrc_t *z = *p;
    if (z == NULL)
        return;
    if (z->codec == MT__Z_XZ)
        lzma_end(&z->u.xz);
    else if (z->codec == MT__Z_GZIP)
        inflateEnd(&z->u.gz);
    else
        ZSTD_freeDStream(z->u.zs);
    free(z);
    *p = NULL;
}

/* ---- a FILE over it ---- */

/* Invariants: f = raw, or a cookie stream over this; z != NULL for a compressed file;
 * pre[pos, npre) are raw bytes taken to look and not yet given. */
struct mt__zfile_s {
    FILE *raw, *f;
    mt__zsrc_t *z;
    int codec;
    size_t npre, pos;
    unsigned char pre[8];
};

static ssize_t zfile_read(void *cookie, char *buf, size_t size)
{
    mt__zfile_t *zf = cookie;
    if (zf->z != NULL) {
        size_t n = 0;
        if (mt__zsrc_read(zf->z, buf, size, &n) != 0) {
            errno = EIO;
            return -1;
        }
        return (ssize_t)n;
    }
    if (zf->pos < zf->npre) {
        size_t n = zf->npre - zf->pos < size ? zf->npre - zf->pos : size;
        memcpy(buf, zf->pre + zf->pos, n);
        zf->pos += n;
        return (ssize_t)n;
    }
    size_t n = fread(buf, 1, size, zf->raw);
    if (n == 0 && ferror(zf->raw))
        return -1;
    return (ssize_t)n;
}

int mt__zfile_open(mt__zfile_t **out, FILE *raw)
{
    *out = NULL;
    mt__zfile_t *zf = calloc(1, sizeof *zf);
    if (zf == NULL)
        return MT_ENOMEM;
    zf->raw = raw;
    /* Rewound only where it can be, to where it was: a failed fseek on a pipe drops what it
     * had buffered, and a borrowed stream need not be at its start. */
    struct stat st;
    long at = fstat(fileno(raw), &st) == 0 && S_ISREG(st.st_mode) ? ftell(raw) : -1;
    zf->npre = fread(zf->pre, 1, 6, raw); /* the longest magic */
    if (zf->npre < 6 && ferror(raw)) {
        free(zf);
        return MT_EIO;
    }
    zf->codec = mt__zsrc_sniff(zf->pre, zf->npre);
    if (zf->codec == MT__Z_NONE && at >= 0 && fseek(raw, at, SEEK_SET) == 0) {
        zf->f = raw; /* a plain file read as it is, at full speed */
        *out = zf;
        return 0;
    }
    int rc = 0;
    if (zf->codec != MT__Z_NONE)
        rc = mt__zsrc_open(&zf->z, raw, zf->codec, zf->pre, zf->npre);
    static const cookie_io_functions_t io = {.read = zfile_read};
    if (rc == 0 && (zf->f = fopencookie(zf, "r", io)) == NULL)
        rc = MT_ENOMEM;
    if (rc != 0) {
        mt__zsrc_close(&zf->z);
        free(zf);
        return rc;
    }
    *out = zf;
    return 0;
}

FILE *mt__zfile_stream(const mt__zfile_t *zf)
{
    return zf->f;
}

int mt__zfile_codec(const mt__zfile_t *zf)
{
    return zf->codec;
}

const char *mt__zfile_error(const mt__zfile_t *zf)
{
    return zf->z != NULL ? mt__zsrc_error(zf->z) : "";
}

void mt__zfile_close(mt__zfile_t **p)
{
    mt__zfile_t *zf = *p;
    if (zf == NULL)
        return;
    if (zf->f != NULL && zf->f != zf->raw)
        fclose(zf->f);
    mt__zsrc_close(&zf->z);
    free(zf);
    *p = NULL;
}

/* ---- looking into a pipe ---- */

int mt__zsrc_pipe_peek(int fd, void *buf, size_t cap, size_t *n, bool *ended)
{
    *n = 0;
    *ended = false;
#if defined(__linux__)
    struct stat st;
    if (cap > 0 && fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) { /* a socket peeks itself */
        /* the end is asked for before the bytes: a writer that ends after the look has
         * sent more than was seen */
        struct pollfd pf = {.fd = fd, .events = POLLIN | POLLRDHUP};
        bool hup = poll(&pf, 1, 0) == 1 && (pf.revents & (POLLHUP | POLLRDHUP));
        ssize_t k = recv(fd, buf, cap, MSG_PEEK);
        if (k < 0)
            return MT_EINVAL;
        *n = (size_t)k;
        *ended = k == 0 || hup;
        return 0;
    }
    int p[2];
    if (cap == 0 || pipe2(p, O_CLOEXEC) != 0)
        return MT_EINVAL;
    /* The end first, as above; tee(2) then copies what waits in fd without taking it
     * (waiting for a first byte). */
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    bool hup = poll(&pf, 1, 0) == 1 && (pf.revents & POLLHUP);
    ssize_t k = tee(fd, p[1], cap, 0);
    int rc = k < 0 ? MT_EINVAL : 0;
    for (size_t got = 0; k > 0 && got < (size_t)k;) {
        ssize_t r = read(p[0], (unsigned char *)buf + got, (size_t)k - got);
        if (r <= 0) {
            rc = MT_EIO;
            break;
        }
        got += (size_t)r;
        *n = got;
    }
    close(p[0]);
    close(p[1]);
    *ended = k == 0 || hup;
    return rc;
#else
    (void)fd;
    (void)buf;
    (void)cap;
    return MT_EINVAL;
#endif
}

int mt__zsrc_first_byte(const void *p, size_t n, int codec, unsigned char *c)
{
    FILE *f = fmemopen((void *)(uintptr_t)p, n, "rb");
    if (f == NULL)
        return MT_ENOMEM;
    mt__zsrc_t *z = NULL;
    size_t got = 0;
    int rc = mt__zsrc_open(&z, f, codec, NULL, 0);
    if (rc == 0)
        rc = mt__zsrc_read(z, c, 1, &got);
    mt__zsrc_close(&z);
    fclose(f);
    return rc != 0 ? rc : got == 1 ? 1 : 0;
}
