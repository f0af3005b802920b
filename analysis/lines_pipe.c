/* A log's lines cut and decoded on two cores (see lines_pipe.h).
 *
 * The producer (a thread of its own, or the caller's when threads is 1) fills the blocks in
 * turn: the unfinished line of the previous block first, then a read of the file behind it;
 * it cuts the block at its newlines and writes one item per line. The decoding of a block's
 * event lines is then taken by whichever thread comes to it first: the producer, when it has
 * no block to fill, decodes the newest filled block nobody took; the consumer (the caller's
 * thread) takes the blocks in turn, decodes the one it comes to if nobody took it, and hands
 * its items to the callback. So the decoding, most of the reading, goes to the core that has
 * time for it. A block is the producer's until it is marked full, then the consumer's until
 * it is marked free, its decoding the taker's alone: every hand-over is once per block,
 * under the mutex. */
#include "analysis/lines_pipe.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis/binlog_read.h"
#include "analysis/ndjson_fast.h"
#include "memtrace/common.h"

/* Invariants: nitems <= icap; while full, items[..nitems) point into buf; decoded implies
 * taken implies full. */
typedef struct block_s {
    char *buf;              /* cap + 1 bytes: a NUL after a last line without newline */
    mt__line_item_t *items; /* icap items */
    size_t nitems, icap;
    int rc;       /* 0, or MT_EIO / MT_ENOMEM: the reading ended after the items */
    bool last;    /* the file ended in this block */
    bool full;    /* cut and handed over (guarded by mu) */
    bool taken;   /* its decoding taken by one thread (guarded by mu) */
    bool decoded; /* ... and done (guarded by mu) */
} block_t;

/* Invariants: ncarry <= cfg.max (a longer unfinished line is dropped and skipping set);
 * cap = MT_LINES_PIPE_BLOCK + cfg.max + 1, so a carried line and a read of a block fit. */
typedef struct pipe_s {
    FILE *f;
    mt__lines_pipe_cfg_t cfg;
    size_t cap;
    block_t blk[MT_LINES_PIPE_DEPTH];
    char *carry; /* the producer's: the unfinished line at the end of the last block */
    size_t ncarry;
    bool skipping; /* the rest of a line longer than max is being passed over */
    bool eof;
    pthread_mutex_t mu;
    pthread_cond_t ready; /* a block filled or decoded: the consumer waits on it */
    pthread_cond_t freed; /* a block given back, or stop: the producer waits on it */
    bool stop;            /* the consumer is done: the producer reads no further (guarded by mu) */
} pipe_t;

int mt__lines_pipe_threads(void)
{
    return sysconf(_SC_NPROCESSORS_ONLN) > 1 ? 2 : 1;
}

/* ---- the producer ---- */

static mt__line_item_t *item_new(block_t *b)
{
    if (b->nitems == b->icap) {
        size_t icap = b->icap ? 2 * b->icap : 4096;
        mt__line_item_t *v = realloc(b->items, icap * sizeof(*v));
        if (!v)
            return NULL;
        b->items = v;
        b->icap = icap;
    }
    return &b->items[b->nitems++];
}

/* One line p[0..n), NUL-terminated at p[n], into b, as MT_LINE_RAW (decode() decodes it
 * later) or MT_LINE_LONG. 0 or MT_ENOMEM. */
static int put_line(pipe_t *pp, block_t *b, char *p, size_t n)
{
    mt__line_item_t *it = item_new(b);
    if (!it)
        return MT_ENOMEM;
    if (n > pp->cfg.max) {
        *it = (mt__line_item_t){.what = MT_LINE_LONG};
        return 0;
    }
    it->what = MT_LINE_RAW;
    it->text = p;
    it->len = (uint32_t)n;
    return 0;
}

/* The event lines of a filled block decoded in place (with cfg.fast): a line the decoder
 * takes becomes MT_LINE_EVENT, any other stays MT_LINE_RAW. Touches b's items alone. */
static void decode(const pipe_t *pp, block_t *b)
{
    if (!pp->cfg.fast)
        return;
    for (size_t i = 0; i < b->nitems; i++) {
        mt__line_item_t *it = &b->items[i];
        if (it->what != MT_LINE_RAW)
            continue;
        size_t m = it->len; /* the decoder reads the line without a CR of a CRLF file */
        while (m > 0 && it->text[m - 1] == '\r')
            m--;
        int pid;
        const char *tag;
        size_t tl;
        if (mt__ndjson_event(it->text, m, &it->ev, &pid, &tag, &tl) && pid >= 0) {
            it->what = MT_LINE_EVENT;
            it->pid = pid;
            it->text = tag;
            it->len = (uint32_t)tl;
        }
    }
}

/* Fills b: the carried line, a read, the items. Sets b->rc and b->last. */
static void fill(pipe_t *pp, block_t *b)
{
    b->nitems = 0;
    b->rc = 0;
    b->last = false;
    memcpy(b->buf, pp->carry, pp->ncarry);
    char *end = b->buf + pp->ncarry;
    pp->ncarry = 0;
    if (!pp->eof) {
        size_t got = fread(end, 1, pp->cap - (size_t)(end - b->buf), pp->f);
        if (got == 0) {
            if (ferror(pp->f)) {
                b->rc = MT_EIO;
                b->last = true;
                return;
            }
            pp->eof = true;
        }
        end += got;
    }
    char *p = b->buf, *nl;
    while ((nl = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        size_t n = (size_t)(nl - p);
        *nl = '\0';
        if (pp->skipping)
            pp->skipping = false; /* the end of a line already given as long */
        else if (put_line(pp, b, p, n) != 0)
            goto out_nomem;
        p = nl + 1;
    }
    size_t tail = (size_t)(end - p);
    if (pp->skipping) {
        /* still inside a long line: what was read of it is dropped */
    } else if (tail > pp->cfg.max) {
        if (put_line(pp, b, p, tail) != 0) /* a MT_LINE_LONG item */
            goto out_nomem;
        pp->skipping = true;
    } else if (pp->eof) {
        if (tail > 0) { /* the last line, without a newline */
            *end = '\0';
            if (put_line(pp, b, p, tail) != 0)
                goto out_nomem;
        }
    } else {
        memcpy(pp->carry, p, tail);
        pp->ncarry = tail;
    }
    b->last = pp->eof;
    return;
out_nomem:
    b->rc = MT_ENOMEM;
    b->last = true;
}

/* The newest filled block whose decoding nobody took, or NULL; next is the number of
 * blocks filled so far. Called under mu. */
static block_t *untaken(pipe_t *pp, size_t next)
{
    for (size_t k = 1; k <= MT_LINES_PIPE_DEPTH && k <= next; k++) {
        block_t *b = &pp->blk[(next - k) % MT_LINES_PIPE_DEPTH];
        if (b->full && !b->taken)
            return b;
    }
    return NULL;
}

static void *producer(void *arg)
{
    pipe_t *pp = arg;
    size_t next = 0;   /* blocks filled */
    bool done = false; /* the last block is filled */
    pthread_mutex_lock(&pp->mu);
    while (!pp->stop) {
        block_t *b = &pp->blk[next % MT_LINES_PIPE_DEPTH];
        if (!done && !b->full) {
            pthread_mutex_unlock(&pp->mu);
            fill(pp, b);
            pthread_mutex_lock(&pp->mu);
            b->full = true;
            done = b->last;
            next++;
            pthread_cond_signal(&pp->ready);
            continue;
        }
        if ((b = untaken(pp, next)) != NULL) {
            b->taken = true;
            pthread_mutex_unlock(&pp->mu);
            decode(pp, b);
            pthread_mutex_lock(&pp->mu);
            b->decoded = true;
            pthread_cond_signal(&pp->ready);
            continue;
        }
        if (done)
            break; /* every block filled, every decoding taken */
        pthread_cond_wait(&pp->freed, &pp->mu);
    }
    pthread_mutex_unlock(&pp->mu);
    return NULL;
}

/* ---- the consumer ---- */

/* b's items to cb. Returns cb's first non-zero return, else b->rc. */
static int give(block_t *b, mt__line_cb cb, void *ud, unsigned long *lineno)
{
    for (size_t i = 0; i < b->nitems; i++) {
        int rc = cb(ud, &b->items[i], ++*lineno);
        if (rc != 0)
            return rc;
    }
    return b->rc;
}

static int run_inline(pipe_t *pp, mt__line_cb cb, void *ud, unsigned long *lineno)
{
    block_t *b = &pp->blk[0];
    for (;;) {
        fill(pp, b);
        decode(pp, b);
        int rc = give(b, cb, ud, lineno);
        if (rc != 0 || b->last)
            return rc;
    }
}

static int run_threaded(pipe_t *pp, mt__line_cb cb, void *ud, unsigned long *lineno)
{
    pthread_t th;
    if (pthread_create(&th, NULL, producer, pp) != 0)
        return run_inline(pp, cb, ud, lineno);
    int rc = 0;
    for (size_t i = 0;; i++) {
        block_t *b = &pp->blk[i % MT_LINES_PIPE_DEPTH];
        pthread_mutex_lock(&pp->mu);
        while (!b->full)
            pthread_cond_wait(&pp->ready, &pp->mu);
        bool mine = !b->taken;
        b->taken = true;
        while (!mine && !b->decoded)
            pthread_cond_wait(&pp->ready, &pp->mu);
        pthread_mutex_unlock(&pp->mu);
        if (mine)
            decode(pp, b);
        rc = give(b, cb, ud, lineno);
        bool done = rc != 0 || b->last;
        pthread_mutex_lock(&pp->mu);
        b->full = b->taken = b->decoded = false;
        pp->stop = done;
        pthread_cond_signal(&pp->freed);
        pthread_mutex_unlock(&pp->mu);
        if (done)
            break;
    }
    pthread_join(th, NULL);
    return rc;
}

int mt__lines_pipe_run(FILE *f, const mt__lines_pipe_cfg_t *cfg, mt__line_cb cb, void *ud,
                       unsigned long *lines)
{
    unsigned long lineno = 0;
    if (lines)
        *lines = 0;
    if (!cfg || cfg->max == 0 || cfg->max > UINT32_MAX)
        return MT_EINVAL;
    pipe_t pp = {.f = f, .cfg = *cfg, .cap = MT_LINES_PIPE_BLOCK + cfg->max + 1};
    int rc = MT_ENOMEM;
    int nblk = cfg->threads > 1 ? MT_LINES_PIPE_DEPTH : 1;
    pp.carry = malloc(cfg->max + 1 > MT__BLOG_MAGIC_LEN ? cfg->max + 1 : MT__BLOG_MAGIC_LEN);
    if (!pp.carry)
        goto out_alloc;
    /* The first bytes say which form: the binary log's, or lines (carried into the first
     * block as an unfinished line is). */
    while (pp.ncarry < MT__BLOG_MAGIC_LEN) {
        size_t got = fread(pp.carry + pp.ncarry, 1, MT__BLOG_MAGIC_LEN - pp.ncarry, f);
        if (got == 0)
            break;
        pp.ncarry += got;
    }
    if (ferror(f)) {
        rc = MT_EIO;
        goto out_alloc;
    }
    if (mt__blog_is_binary(pp.carry, pp.ncarry)) {
        rc = mt__blog_pipe(f, pp.carry, pp.ncarry, cfg, cb, ud, &lineno);
        goto out_alloc;
    }
    if (pp.ncarry > cfg->max) { /* a first line longer than max, already */
        mt__line_item_t it = {.what = MT_LINE_LONG};
        pp.skipping = memchr(pp.carry, '\n', pp.ncarry) == NULL;
        if (pp.skipping) {
            pp.ncarry = 0;
            if ((rc = cb(ud, &it, ++lineno)) != 0)
                goto out_alloc;
        }
    }
    for (int i = 0; i < nblk; i++)
        if (!(pp.blk[i].buf = malloc(pp.cap + 1)))
            goto out_alloc;
    if (nblk > 1) {
        pthread_mutex_init(&pp.mu, NULL);
        pthread_cond_init(&pp.ready, NULL);
        pthread_cond_init(&pp.freed, NULL);
        rc = run_threaded(&pp, cb, ud, &lineno);
        pthread_cond_destroy(&pp.freed);
        pthread_cond_destroy(&pp.ready);
        pthread_mutex_destroy(&pp.mu);
    } else {
        rc = run_inline(&pp, cb, ud, &lineno);
    }
out_alloc:
    for (int i = 0; i < nblk; i++) {
        free(pp.blk[i].buf);
        free(pp.blk[i].items);
    }
    free(pp.carry);
    if (lines)
        *lines = lineno;
    return rc;
}
