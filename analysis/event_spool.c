/* The events kept for replays, in chunks spilled to a temporary file (see event_spool.h). */
#include "analysis/event_spool.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "memtrace/common.h"
#include "util/grow.h"

#define CHUNK_BYTES ((size_t)MT__SPOOL_CHUNK * sizeof(mt_event_rec_t))

void mt__spool_file_open(mt__spool_file_t *f, const char *dir)
{
    *f = (mt__spool_file_t){.fd = -1};
    if (!dir)
        return;
#ifdef O_TMPFILE
    f->fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
#endif
    if (f->fd < 0) { /* a file system without O_TMPFILE: a named file, unlinked at once */
        char path[4096];
        if (snprintf(path, sizeof path, "%s/memtrace-spool-XXXXXX", dir) >= (int)sizeof path)
            return;
        f->fd = mkostemp(path, O_CLOEXEC);
        if (f->fd >= 0)
            unlink(path);
    }
}

void mt__spool_file_close(mt__spool_file_t *f)
{
    if (f->fd >= 0)
        close(f->fd);
    free(f->cache);
    *f = (mt__spool_file_t){.fd = -1};
}

/* len bytes at off, written from buf (write) or read into it: all of them, or MT_EIO. */
static int transfer(int fd, void *buf, size_t len, uint64_t off, bool write)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = write ? pwrite(fd, p, len, (off_t)off) : pread(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return MT_EIO;
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

static int write_all(int fd, const void *buf, size_t len, uint64_t off)
{
    return transfer(fd, (void *)buf, len, off, true);
}

static int read_all(int fd, void *buf, size_t len, uint64_t off)
{
    return transfer(fd, buf, len, off, false);
}

/* The full tail into the file; it is then empty. */
static int spill(mt__spool_t *s, mt__spool_file_t *f)
{
    if (s->nchunks == s->cap_off) {
        size_t cap = s->cap_off;
        uint64_t *seq0 = mt__grow(s->seq0, &cap, s->nchunks + 1, sizeof(*seq0), 64);
        if (!seq0)
            return MT_ENOMEM;
        s->seq0 = seq0;
        uint64_t *off = mt__grow(s->off, &s->cap_off, s->nchunks + 1, sizeof(*off), 64);
        if (!off)
            return MT_ENOMEM;
        s->off = off;
    }
    int rc = write_all(f->fd, s->tail, CHUNK_BYTES, f->end);
    if (rc != 0)
        return rc;
    s->seq0[s->nchunks] = s->tail[0].seq;
    s->off[s->nchunks++] = f->end;
    f->end += CHUNK_BYTES;
    return 0;
}

int mt__spool_push(mt__spool_t *s, mt__spool_file_t *f, const mt_event_rec_t *ev)
{
    size_t in_tail = s->n - s->nchunks * MT__SPOOL_CHUNK;
    /* A file that cannot take a chunk (a full disk) is given up for this process: its
     * tail then grows past a chunk, and never equals one again. */
    if (in_tail == MT__SPOOL_CHUNK && f->fd >= 0 && spill(s, f) == 0)
        in_tail = 0;
    if (in_tail == s->tail_cap) {
        /* Small first (a daemon's log may name thousands of short processes), doubling up
         * to a chunk when spilled; without a file, without bound. */
        mt_event_rec_t *t = mt__grow(s->tail, &s->tail_cap, in_tail + 1, sizeof(*t), 16);
        if (!t)
            return MT_ENOMEM;
        s->tail = t;
    }
    s->tail[in_tail] = *ev;
    s->n++;
    return 0;
}

int mt__spool_get(const mt__spool_t *s, const mt__spool_file_t *f, size_t k, mt_event_rec_t *out)
{
    size_t c = k / MT__SPOOL_CHUNK;
    if (c >= s->nchunks) {
        *out = s->tail[k - s->nchunks * MT__SPOOL_CHUNK];
        return 0;
    }
    return read_all(f->fd, out, sizeof(*out),
                    s->off[c] + (uint64_t)(k % MT__SPOOL_CHUNK) * sizeof(*out));
}

/* Whether one of v[0, n) (strictly increasing seqs) is identical to ev. */
static bool in_run(const mt_event_rec_t *v, size_t n, const mt_event_rec_t *ev)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v[mid].seq < ev->seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && memcmp(&v[lo], ev, sizeof(*ev)) == 0;
}

int mt__spool_find(const mt__spool_t *s, mt__spool_file_t *f, const mt_event_rec_t *ev, bool *found)
{
    *found = false;
    size_t in_tail = s->n - s->nchunks * MT__SPOOL_CHUNK;
    if (s->nchunks == 0 || (in_tail > 0 && s->tail[0].seq <= ev->seq)) {
        *found = in_run(s->tail, in_tail, ev);
        return 0;
    }
    /* The last chunk whose first seq is at most ev's: ev can only be there. */
    size_t lo = 0, hi = s->nchunks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->seq0[mid] <= ev->seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return 0; /* before the first event */
    uint64_t off = s->off[lo - 1];
    if (!f->cache || f->cache_off != off) {
        if (!f->cache && !(f->cache = malloc(CHUNK_BYTES)))
            return MT_ENOMEM;
        int rc = read_all(f->fd, f->cache, CHUNK_BYTES, off);
        f->cache_off = rc == 0 ? off : UINT64_MAX;
        if (rc != 0)
            return rc;
    }
    *found = in_run(f->cache, MT__SPOOL_CHUNK, ev);
    return 0;
}

int mt__spool_chunk(const mt__spool_t *s, const mt__spool_file_t *f, size_t c, mt_event_rec_t *buf,
                    const mt_event_rec_t **evs, size_t *n)
{
    if (c >= s->nchunks) {
        *evs = s->tail;
        *n = s->n - s->nchunks * MT__SPOOL_CHUNK;
        return 0;
    }
    *evs = buf;
    *n = MT__SPOOL_CHUNK;
    return read_all(f->fd, buf, CHUNK_BYTES, s->off[c]);
}

void mt__spool_free(mt__spool_t *s)
{
    free(s->tail);
    free(s->off);
    free(s->seq0);
    *s = (mt__spool_t){0};
}
