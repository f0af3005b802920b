/* memtraced: the event lines' encoder thread.
 *
 * The loop thread drains the rings and applies each record to the figures; the JSON lines
 * (profiler/encode.c's line writer) and the log file's write are the larger half of a drain
 * with lines, so they run on a thread of the daemon's own, behind the loop: while the
 * encoder writes batch k, the loop fills batch k + 1, and up to MT_D_LINES_DEPTH - 1
 * batches wait for the encoder in order, so that it goes from one to the next without
 * sleeping. A batch comes back to the loop in order (at a later hand-off, or
 * mt__d_lines_sync) before its lines go to the consumers. A tick that another follows at
 * once ends with its last batch handed off and not waited for (mt__d_lines_handoff_acked):
 * the rings are acknowledged when that batch is back, its lines written and the log
 * flushed by the encoder; every other tick ends with the batches back, the log flushed and
 * the rings acknowledged (producers.c, ack_drained). Either way read_idx never passes what
 * is not yet in the log. The thread is started by mt__d_create and joined by
 * mt__d_destroy; without it (it could not be started) the loop encodes each batch itself
 * at its hand-off. The encoder also builds each consumer's chunk of the batch's lines;
 * the loop queues them (libuv writes them) when the batch is back. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/internal.h"
#include "profiler/binlog.h"
#include "profiler/internal.h"
#include "util/assert.h"

/* The line of r (not a table line) appended to t, '\n' included. 0 or MT_ENOMEM. */
static int encode_rec(mt_d_lines_t *L, mt_d_buf_t *t, mt_d_batch_rec_t *r)
{
    mt_d_proc_t *p = (mt_d_proc_t *)r->proc; /* its names are read, never written, here */
    if (L->enc && L->enc_proc != p) {
        mt__prof_enc_init(L->enc, p->pid); /* p's pieces, once per run of its records */
        L->enc_proc = p;
    }
    size_t need = 1024; /* enough for every line without a long user tag name */
    for (;;) {
        int rc = mt__d_buf_reserve(t, need);
        if (rc)
            return rc;
        size_t room = t->cap - t->len;
        char *w = t->p + t->len;
        size_t n =
            L->enc ? mt__prof_enc_write(L->enc, w, room, &r->ev, r->stack, mt__d_proc_label, p)
                   : mt_prof_alloc_write(w, room, &r->ev, p->pid, r->stack, mt__d_proc_label, p);
        if (n < room) {
            t->len += n;
            return 0;
        }
        need = n;
    }
}

/* Ends the binary block begun at start of o (if one was), its header filled. */
static void bin_end(mt_d_buf_t *o, size_t start, int pid, uint32_t nrec)
{
    if (nrec > 0)
        mt__blog_header(o->p + start, (uint32_t)(o->len - start - MT__BLOG_HDR), pid, nrec);
    else
        o->len = start; /* (none begun: start == len) */
}

int mt__d_encode_bin(const mt_d_batch_t *b, mt_d_buf_t *o, const mt_d_sub_t *sel, uint32_t *nlines)
{
    mt__blog_state_t st;
    size_t start = o->len;
    uint32_t nrec = 0, lines = 0;
    int pid = 0;
    for (size_t i = 0; i < b->n; i++) {
        const mt_d_batch_rec_t *r = &b->rec[i];
        if (sel != NULL && !mt__d_sub_matches(sel, r))
            continue;
        lines++;
        const char *name = NULL;
        size_t nlen = 0, need = MT__BLOG_HDR + MT__BLOG_EVENT_MAX;
        bool named = r->ev.kind != 0 && mt__blog_kind_named(r->ev.kind) && r->ev.tag < MT_TAG_MAX;
        if (named) {
            name = mt__d_proc_label((void *)r->proc, r->ev.tag);
            nlen = name ? strlen(name) : 0;
            need += MT__BLOG_TEXT_EXTRA + nlen;
        }
        if (r->ev.kind == 0)
            need = MT__BLOG_HDR + MT__BLOG_TEXT_EXTRA + r->len;
        if (nrec > 0 && (r->pid != pid || o->len - start > MT_D_BIN_BLOCK_BYTES)) {
            bin_end(o, start, pid, nrec);
            nrec = 0;
        }
        if (mt__d_buf_reserve(o, need) != 0)
            return MT_ENOMEM;
        if (nrec == 0) {
            start = o->len;
            o->len += MT__BLOG_HDR;
            pid = r->pid;
            memset(&st, 0, sizeof st);
        }
        char *w = o->p + o->len;
        if (r->ev.kind == 0) { /* a table line, its newline left out */
            uint32_t n = r->len - (r->len > 0 && b->pre.p[r->off + r->len - 1] == '\n');
            o->len += mt__blog_put_line(w, b->pre.p + r->off, n);
            nrec++;
            continue;
        }
        if (r->ev.kind == MT_EV_TAG_LABEL && r->ev.tag < MT_TAG_MAX)
            st.named &= ~(1u << r->ev.tag);
        if (named && !(st.named >> r->ev.tag & 1)) {
            w += mt__blog_put_name(&st, w, r->ev.tag, name ? name : "", (uint32_t)nlen);
            nrec++;
        }
        w += mt__blog_put_event(&st, w, &r->ev, r->stack);
        o->len = (size_t)(w - o->p);
        nrec++;
    }
    bin_end(o, start, pid, nrec);
    *nlines = lines;
    return 0;
}

/* o's bytes appended to b's log, its blocks reserved ahead first (util/fileahead.h); a
 * short write sets b->write_failed. */
static void log_write(mt_d_lines_t *L, mt_d_batch_t *b, const mt_d_buf_t *o)
{
    if (o->len == 0)
        return;
    mt__fa_ahead(&L->fa, fileno(b->logf), o->len);
    b->write_failed = fwrite(o->p, 1, o->len, b->logf) != o->len;
}

/* The encoder's work on one batch: the binary log's blocks and the binary consumers'
 * chunks (b->binbuf when the log or an unfiltered consumer takes them all), then, when the
 * log or a consumer takes text, every record's line into b->text, in order (table lines
 * copied from b->pre), the log's lines and the other consumers' chunks. */
static void run_job(mt_d_lines_t *L, mt_d_batch_t *b)
{
    if (b->enc_stale)
        L->enc_proc = NULL; /* a tag's name changed, or a process went */
    mt__d_buf_clear(&b->text);
    mt__d_buf_clear(&b->binbuf);
    b->write_failed = false;
    /* (without outs, the loop fans the batch out from b->text itself) */
    bool text = (b->logf && !b->bin) || !b->outs_ok, all_bin = b->logf && b->bin;
    for (size_t k = 0; b->outs_ok && k < b->nouts; k++) {
        const mt_d_sub_t *s = &b->outs[k].conn->sub;
        text |= !s->binary;
        all_bin |= s->binary && mt__d_sub_all(s);
    }
    uint32_t nall = 0;
    if (all_bin && mt__d_encode_bin(b, &b->binbuf, NULL, &nall) != 0) {
        mt__d_buf_clear(&b->binbuf); /* its sticky error goes; the binary chunks are lost */
        all_bin = false;
        if (b->logf && b->bin)
            b->write_failed = true;
    }
    if (b->logf && b->bin && all_bin)
        log_write(L, b, &b->binbuf);
    if (b->outs_ok)
        mt__d_consumers_build_binary(b);
    if (!text)
        return;
    for (size_t i = 0; i < b->n; i++) {
        mt_d_batch_rec_t *r = &b->rec[i];
        size_t off = b->text.len;
        int rc = r->ev.kind == 0 ? mt__d_buf_append(&b->text, b->pre.p + r->off, r->len)
                                 : encode_rec(L, &b->text, r);
        if (rc) {                      /* out of memory: the event is counted, not forwarded */
            mt__d_buf_clear(&b->text); /* its sticky error goes; the lines kept so far stay */
            b->text.len = off;
            r->len = 0;
            continue;
        }
        r->off = (uint32_t)off;
        r->len = (uint32_t)(b->text.len - off);
    }
    if (b->logf && !b->bin)
        log_write(L, b, &b->text);
    if (b->outs_ok)
        mt__d_consumers_build(b);
}

/* run_job, then the log flushed when the batch's rings are acknowledged at its return. */
static void run_batch(mt_d_lines_t *L, mt_d_batch_t *b)
{
    run_job(L, b);
    if (b->ack && b->logf && !b->write_failed)
        b->write_failed = fflush(b->logf) != 0;
}

static void *encoder_main(void *arg)
{
    mt_d_lines_t *L = arg;
    (void)pthread_setname_np(pthread_self(), "memtraced-lines"); /* (top -H, perf) */
    pthread_mutex_lock(&L->mu);
    for (;;) {
        while (L->encoded == L->handed && !L->quit)
            pthread_cond_wait(&L->go, &L->mu);
        if (L->encoded == L->handed)
            break;
        mt_d_batch_t *b = &L->b[L->encoded % MT_D_LINES_DEPTH];
        pthread_mutex_unlock(&L->mu);
        run_batch(L, b);
        struct timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        atomic_store_explicit(&L->cpu_ns, (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec,
                              memory_order_relaxed);
        pthread_mutex_lock(&L->mu);
        L->encoded++;
        pthread_cond_signal(&L->done);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

int mt__d_lines_init(mt_d_t *d)
{
    mt_d_lines_t *L = &d->lines;
    memset(L, 0, sizeof *L);
    for (int i = 0; i < MT_D_LINES_DEPTH; i++)
        if (!(L->b[i].rec = malloc(MT_D_BATCH_CAP * sizeof *L->b[i].rec)))
            return MT_ENOMEM;
    L->fill = &L->b[0];
    L->enc = malloc(sizeof *L->enc); /* NULL: the general writer */
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->go, NULL);
    pthread_cond_init(&L->done, NULL);
    L->inited = true;
    L->on = pthread_create(&L->th, NULL, encoder_main, L) == 0;
    return 0;
}

/* Waits until the encoder has done every batch handed off (the loop's own batches only
 * remain). */
static void wait_encoded(mt_d_lines_t *L)
{
    if (!L->on)
        return;
    pthread_mutex_lock(&L->mu);
    while (L->encoded != L->handed)
        pthread_cond_wait(&L->done, &L->mu);
    pthread_mutex_unlock(&L->mu);
}

/* Takes the oldest batch handed off back from the encoder (waiting for it when wait, else
 * only if it is done), closes the log if its write failed, sends its lines to the
 * consumers and acknowledges the rings it carries. False when none was taken back. */
static bool take_back(mt_d_t *d, bool wait)
{
    mt_d_lines_t *L = &d->lines;
    if (L->taken == L->handed)
        return false;
    if (L->on) {
        pthread_mutex_lock(&L->mu);
        bool done = L->encoded > L->taken;
        while (wait && !done) {
            pthread_cond_wait(&L->done, &L->mu);
            done = L->encoded > L->taken;
        }
        pthread_mutex_unlock(&L->mu);
        if (!done)
            return false;
    }
    uint64_t k = L->taken;
    mt_d_batch_t *b = &L->b[k % MT_D_LINES_DEPTH];
    if (b->logf && b->logf == d->logf) {
        if (b->write_failed) {
            mt__d_log(d, MT_LOG_ERROR, "writing %s failed; the log is closed", d->log_path);
            wait_encoded(L); /* the later batches' writes to it are done (and fail) */
            mt__d_logfile_end(d);
        } else {
            d->log_dirty = true;
        }
    }
    if (b->outs_ok)
        mt__d_consumers_deliver(d, b);
    else
        mt__d_consumers_fanout(d, b);
    b->n = 0;
    mt__d_buf_clear(&b->pre);
    L->taken = k + 1;
    mt_assert(L->taken <= L->handed);
    if (b->ack) {
        b->ack = false;
        mt__d_procs_ack(d, k);
    }
    return true;
}

/* Hands off the batch being filled (ack: the last of a tick, see mt__d_lines_handoff_acked);
 * its hand-off takes back the batches done first, and waits for the oldest while no other
 * batch is free to fill next. */
static void handoff(mt_d_t *d, bool ack)
{
    mt_d_lines_t *L = &d->lines;
    mt_d_batch_t *b = L->fill;
    if (!L->inited || b->n == 0)
        return;
    while (take_back(d, false))
        ;
    while (L->handed - L->taken > MT_D_LINES_DEPTH - 2)
        (void)take_back(d, true);
    b->logf = d->logf;
    b->bin = d->log_bin;
    b->outs_ok = mt__d_consumers_prepare(d, b) == 0;
    b->enc_stale = L->stale;
    b->ack = ack;
    L->stale = false;
    if (!L->on) {
        run_batch(L, b);
        L->encoded++;
        L->handed++;
    } else {
        pthread_mutex_lock(&L->mu);
        L->handed++;
        pthread_cond_signal(&L->go);
        pthread_mutex_unlock(&L->mu);
    }
    L->fill = &L->b[L->handed % MT_D_LINES_DEPTH];
    mt_assert(L->fill->n == 0 && L->handed - L->taken <= MT_D_LINES_DEPTH - 1);
}

void mt__d_lines_handoff(mt_d_t *d)
{
    handoff(d, false);
}

bool mt__d_lines_handoff_acked(mt_d_t *d)
{
    mt_d_lines_t *L = &d->lines;
    if (!L->inited || L->fill->n == 0)
        return false;
    unsigned slot = (unsigned)(L->handed % MT_D_LINES_DEPTH);
    for (mt_d_proc_t *p = d->procs; p; p = p->next) {
        if (p->ring) {
            p->ack_pos[slot] = mt__ring_drained(p->ring);
            p->ack_at[slot] = L->handed + 1;
        }
    }
    handoff(d, true);
    return true;
}

void mt__d_lines_sync(mt_d_t *d)
{
    if (!d->lines.inited)
        return;
    handoff(d, false);
    while (take_back(d, true))
        ;
}

uint64_t mt__d_lines_cpu_ns(const mt_d_t *d)
{
    return atomic_load_explicit(&d->lines.cpu_ns, memory_order_relaxed);
}

void mt__d_lines_close(mt_d_t *d)
{
    mt_d_lines_t *L = &d->lines;
    if (L->inited) {
        mt__d_lines_sync(d);
        if (L->on) {
            pthread_mutex_lock(&L->mu);
            L->quit = true;
            pthread_cond_signal(&L->go);
            pthread_mutex_unlock(&L->mu);
            pthread_join(L->th, NULL);
            L->on = false;
        }
        pthread_cond_destroy(&L->done);
        pthread_cond_destroy(&L->go);
        pthread_mutex_destroy(&L->mu);
        L->inited = false;
    }
    for (int i = 0; i < MT_D_LINES_DEPTH; i++) {
        free(L->b[i].rec);
        L->b[i].rec = NULL;
        mt__d_buf_free(&L->b[i].pre);
        mt__d_buf_free(&L->b[i].text);
        mt__d_buf_free(&L->b[i].binbuf);
        free(L->b[i].outs);
        L->b[i].outs = NULL;
    }
    free(L->enc);
    L->enc = NULL;
}
