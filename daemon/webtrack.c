/* memtraced: per-process history buckets and event windows for the web page (web.h). */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "analysis/event_store.h"
#include "analysis/model.h"
#include "analysis/model_internal.h"
#include "daemon/internal.h"
#include "daemon/web.h"
#include "util/assert.h"

static int64_t clock_offset_ns(void)
{
    struct timespec r, m;
    clock_gettime(CLOCK_REALTIME, &r);
    clock_gettime(CLOCK_MONOTONIC, &m);
    return ((int64_t)r.tv_sec - (int64_t)m.tv_sec) * 1000000000 +
           ((int64_t)r.tv_nsec - (int64_t)m.tv_nsec);
}

static mt_d_web_t *web_of(mt_d_t *d, bool create)
{
    if (!d->web && create) {
        d->web = calloc(1, sizeof *d->web);
        if (d->web) {
            d->web->window = MT_D_WEB_WINDOW;
            d->web->file.fd = -1;
        }
    }
    return d->web;
}

void mt__d_web_set_window(mt_d_t *d, size_t events)
{
    mt_d_web_t *w = web_of(d, true);
    if (w)
        w->window = events < 1024 ? 1024 : events;
}

void mt__d_set_event_window(mt_d_t *d, size_t events)
{
    mt__d_web_set_window(d, events);
}

int mt__d_web_set_spool(mt_d_t *d, const char *dir)
{
    mt_d_web_t *w = web_of(d, true);
    char *copy = dir ? strdup(dir) : NULL;
    if (!w || (dir && !copy)) {
        free(copy);
        return MT_ENOMEM;
    }
    free(w->spool_dir);
    w->spool_dir = copy;
    return 0;
}

int mt__d_set_event_spool(mt_d_t *d, const char *dir)
{
    return mt__d_web_set_spool(d, dir);
}

static void ck_free(mt_d_web_ck_t *c)
{
    for (int cls = 0; cls < MT_MODEL_CLASSES; cls++)
        mt__model_map_free(&c->map[cls]);
}

static void tracker_free(mt_d_web_t *w, mt_d_web_proc_t *t)
{
    if (w->rd_t == t)
        w->rd_t = NULL;
    for (size_t i = 0; i < t->nck; i++)
        ck_free(&t->ck[i]);
    free(t->coarse);
    free(t->win);
    mt__spool_free(&t->sp);
    mt__model_destroy(&t->base);
    free(t);
}

static mt_d_web_proc_t *tracker_new(mt_d_web_t *w, const mt_d_proc_t *p)
{
    mt_d_web_proc_t *t = calloc(1, sizeof *t);
    if (!t)
        goto fail_alloc;
    t->coarse = calloc(MT_D_WEB_COARSE, sizeof *t->coarse);
    if (!t->coarse)
        goto fail_coarse;
    t->wcap = w->window;
    t->ckstep = t->wcap / 2;
    t->pcap = t->wcap + t->ckstep;
    t->web = w;
    if (w->spool_dir && !w->file_tried) {
        mt__spool_file_open(&w->file, w->spool_dir);
        w->file_tried = true;
    }
    /* Cache-line aligned: each event is one line, stored around the cache (window_record). */
    bool spooled = w->spool_dir && w->file.fd >= 0;
    if (!spooled && !(t->win = aligned_alloc(64, t->pcap * sizeof *t->win)))
        goto fail_window;
    t->nck = t->win != NULL; /* the first checkpoint: before any event, empty */
    t->ck_due = t->ckstep;
    /* The base is read for its blocks, segments and totals (mt__d_web_state_at), never for
     * temporary allocations: it does not track them, which every free would cost. */
    mt_model_cfg_t bcfg = mt__model_cfg_default();
    bcfg.temporary_window_us = 0;
    if (mt__model_create(&t->base, &bcfg) != 0)
        goto fail_base;
    t->proc = p;
    t->off_ns = p->clock_known ? p->clock_off_ns : clock_offset_ns();
    t->fine_ns = MT_D_WEB_FINE_NS;
    t->coarse_ns = MT_D_WEB_COARSE0_NS;
    t->next = w->procs;
    w->procs = t;
    return t;
fail_base:
    free(t->win);
fail_window:
    free(t->coarse);
fail_coarse:
    free(t);
fail_alloc:
    return NULL;
}

mt_d_web_proc_t *mt__d_web_find(mt_d_t *d, const mt_d_proc_t *p)
{
    mt_d_web_t *w = d->web;
    if (!w)
        return NULL;
    if (w->last && w->last->proc == p)
        return w->last;
    for (mt_d_web_proc_t *t = w->procs; t; t = t->next)
        if (t->proc == p)
            return w->last = t;
    return NULL;
}

void mt__d_web_forget(mt_d_t *d, const mt_d_proc_t *p)
{
    mt_d_web_t *w = d->web;
    if (!w)
        return;
    for (mt_d_web_proc_t **pp = &w->procs; *pp; pp = &(*pp)->next) {
        if ((*pp)->proc != p)
            continue;
        mt_d_web_proc_t *t = *pp;
        *pp = t->next;
        if (w->last == t)
            w->last = NULL;
        tracker_free(w, t);
        return;
    }
}

void mt__d_web_free(mt_d_t *d)
{
    mt_d_web_t *w = d->web;
    if (!w)
        return;
    while (w->procs) {
        mt_d_web_proc_t *t = w->procs;
        w->procs = t->next;
        tracker_free(w, t);
    }
    mt__spool_file_close(&w->file);
    free(w->spool_dir);
    free(w->rd);
    free(w);
    d->web = NULL;
}

/* a absorbs the later bucket b (same figures as one bucket over both spans). */
static void bucket_merge(mt_d_web_bkt_t *a, const mt_d_web_bkt_t *b)
{
    if (b->amin < a->amin)
        a->amin = b->amin;
    if (b->amax > a->amax)
        a->amax = b->amax;
    if (b->rmax > a->rmax)
        a->rmax = b->rmax;
    if (b->hmax > a->hmax)
        a->hmax = b->hmax;
    a->alast = b->alast;
    a->rlast = b->rlast;
    a->peak = b->peak;
    a->hres = b->hres;
    memcpy(a->tag, b->tag, sizeof a->tag);
    a->ooms += b->ooms;
    a->events += b->events;
}

/* Halves the coarse resolution: buckets merged in pairs of the doubled width. */
static void coarse_halve(mt_d_web_proc_t *t)
{
    uint64_t w2 = t->coarse_ns * 2;
    size_t n = 0;
    for (size_t i = 0; i < t->ncoarse; i++) {
        uint64_t t0 = t->coarse[i].t0 / w2 * w2;
        if (n > 0 && t->coarse[n - 1].t0 == t0) {
            bucket_merge(&t->coarse[n - 1], &t->coarse[i]);
        } else {
            t->coarse[n] = t->coarse[i];
            t->coarse[n].t0 = t0;
            n++;
        }
    }
    t->ncoarse = n;
    t->coarse_ns = w2;
}

/* Folds p, the figures of events since the last fold (p->t0 unused), into bucket b, which
 * starts at t0: as if each of them had been folded there in turn. */
static void bucket_put(mt_d_web_bkt_t *b, uint64_t t0, const mt_d_web_bkt_t *p)
{
    if (b->t0 != t0) {
        *b = *p;
        b->t0 = t0;
    } else {
        bucket_merge(b, p);
    }
    mt_assert(b->amin <= b->alast && b->alast <= b->amax);
}

void mt__d_web_history_flush(mt_d_web_proc_t *t)
{
    mt_d_web_bkt_t *pend = &t->pend;
    if (!pend->events)
        return;
    uint64_t f0 = t->pend_f0; /* the pending events' times all fall in [f0, f0 + fine) */
    bucket_put(&t->fine[f0 / t->fine_ns % MT_D_WEB_FINE], f0, pend);
    /* A coarse width is a multiple of the fine one: the pending events share one coarse
     * bucket, the one f0 is in. Within the newest (the usual case) without a division. */
    uint64_t last0 = t->ncoarse > 0 ? t->coarse[t->ncoarse - 1].t0 : 0;
    uint64_t c0 = t->ncoarse > 0 && f0 >= last0 && f0 - last0 < t->coarse_ns
                      ? last0
                      : f0 / t->coarse_ns * t->coarse_ns;
    if (t->ncoarse > 0 && c0 < last0)
        c0 = last0; /* a clock that went back: the last bucket */
    if (t->ncoarse == 0 || last0 != c0) {
        if (t->ncoarse == MT_D_WEB_COARSE) {
            while (t->ncoarse == MT_D_WEB_COARSE) /* sparse buckets may not pair up at once */
                coarse_halve(t);
            c0 = f0 / t->coarse_ns * t->coarse_ns;
            if (c0 < t->coarse[t->ncoarse - 1].t0)
                c0 = t->coarse[t->ncoarse - 1].t0;
        }
        if (t->ncoarse == 0 || t->coarse[t->ncoarse - 1].t0 != c0)
            t->coarse[t->ncoarse++].t0 = 0; /* a new bucket, filled by the fold */
    }
    bucket_put(&t->coarse[t->ncoarse - 1], c0, pend);
    mt_assert(t->ncoarse <= MT_D_WEB_COARSE);
    pend->events = 0;
}

/* Updates t's figures now and adds them to the pending events' figures, which go into the
 * two levels of buckets once an event falls in another fine bucket (or a reader asks).
 * Per event, so it reads the model's few figures it shows directly (mt__model_levels) and
 * copies only the one tag an event can change. */
static void history_record(mt_d_web_proc_t *t, const mt_d_proc_t *p, const mt_event_rec_t *ev)
{
    mt_d_web_bkt_t *c = &t->cur;
    uint64_t hpeak;
    mt__model_levels(p->model, MT_MODEL_DEVICE, &c->alast, &c->rlast, &c->peak);
    mt__model_levels(p->model, MT_MODEL_HOST, &c->hmax, &c->hres, &hpeak);
    int tag = -1; /* the one tag of cur this event changes */
    if (ev->tag < MT_TAG_MAX && ev->pool != MT_POOL_HOST) {
        tag = ev->tag;
        c->tag[tag] = mt__model_tag_bytes(p->model, MT_MODEL_DEVICE, tag);
    }
    uint64_t now = ev->time_ns ? ev->time_ns : 1;
    t->last_ns = now;
    uint64_t f0 = now / t->fine_ns * t->fine_ns;
    mt_d_web_bkt_t *pend = &t->pend;
    if (pend->events && f0 != t->pend_f0)
        mt__d_web_history_flush(t);
    if (!pend->events) {
        *pend = *c;
        pend->amin = pend->amax = c->alast;
        pend->rmax = c->rlast;
        pend->ooms = pend->events = 0;
        t->pend_f0 = f0;
    } else {
        if (c->alast < pend->amin)
            pend->amin = c->alast;
        if (c->alast > pend->amax)
            pend->amax = c->alast;
        if (c->rlast > pend->rmax)
            pend->rmax = c->rlast;
        if (c->hmax > pend->hmax)
            pend->hmax = c->hmax;
        pend->alast = c->alast;
        pend->rlast = c->rlast;
        pend->peak = c->peak;
        pend->hres = c->hres;
        if (tag >= 0)
            pend->tag[tag] = c->tag[tag];
    }
    pend->ooms += ev->kind == MT_EV_OOM;
    pend->events++;
    mt_assert_expensive(memcmp(pend->tag, c->tag, sizeof c->tag) == 0);
}

#define CHUNK_BYTES ((size_t)MT__SPOOL_CHUNK * sizeof(mt_event_rec_t))

/* Event k of t's spool (k < sp.n): in its tail, or in the chunk read last. */
static const mt_event_rec_t *spool_at(const mt_d_web_proc_t *t, size_t k)
{
    static const mt_event_rec_t unreadable = {.kind = MT_EV_GAP};
    const mt__spool_t *s = &t->sp;
    size_t c = k / MT__SPOOL_CHUNK;
    if (c >= s->nchunks)
        return &s->tail[k - s->nchunks * MT__SPOOL_CHUNK];
    mt_d_web_t *w = t->web;
    if (w->rd_t != t || w->rd_c != c) {
        const mt_event_rec_t *evs;
        size_t n;
        w->rd_t = NULL;
        if (!w->rd && !(w->rd = malloc(CHUNK_BYTES)))
            return &unreadable;
        if (mt__spool_chunk(s, &w->file, c, w->rd, &evs, &n) != 0)
            return &unreadable;
        w->rd_t = t;
        w->rd_c = c;
    }
    return &w->rd[k % MT__SPOOL_CHUNK];
}

const mt_event_rec_t *mt__d_web_window_at(const mt_d_web_proc_t *t, size_t i)
{
    mt_assert(i < t->wcount);
    if (!t->win)
        return spool_at(t, t->sp.n - t->wcount + i);
    return &t->win[(t->whead + t->pcap - t->wcount + i) % t->pcap];
}

const mt_event_rec_t *mt__d_web_pre_at(const mt_d_web_proc_t *t, size_t i)
{
    mt_assert(t->win && i < t->npre);
    return &t->win[(t->whead + 2 * t->pcap - t->wcount - t->npre + i) % t->pcap];
}

/* Events of the window faulted in at once, ahead of the stores: 1 MiB (a window a process
 * does not fill keeps at most this much more than it uses). */
#define WINDOW_PREFAULT (((size_t)1 << 20) / sizeof(mt_event_rec_t))

/* Faults the window in a piece at a time as it first fills: a log loaded into a new window
 * stored each event into a page not yet touched, one fault per page, a third of view's load
 * on a virtual machine. Advice only; the pages the window never reaches stay unused. */
static void window_prefault(mt_d_web_proc_t *t)
{
    size_t to = t->pcap - t->wready > WINDOW_PREFAULT ? t->wready + WINDOW_PREFAULT : t->pcap;
#ifdef MADV_POPULATE_WRITE
    const uintptr_t page = 4096;
    uintptr_t lo = ((uintptr_t)(t->win + t->wready) + page - 1) & ~(page - 1);
    uintptr_t hi = (uintptr_t)(t->win + to) & ~(page - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
#endif
    t->wready = to;
}

/* The spooled window: ev appended to the spool (into its chunk in memory, which goes to the
 * file when full: one pwrite per 1024 events, the kernel's page cache instead of memory new
 * to the process), the oldest event then evicted into the base. Out of memory, ev is not
 * kept (or the base misses it): MT_ENOMEM. */
static int spool_record(mt_d_web_proc_t *t, const mt_event_rec_t *ev)
{
    if (mt__spool_push(&t->sp, &t->web->file, ev) != 0)
        return MT_ENOMEM;
    t->wseq = ev->seq;
    if (t->wcount < t->wcap) {
        t->wcount++;
        return 0;
    }
    size_t k = t->sp.n - 1 - t->wcount; /* the oldest, leaving the window */
    int rc = mt__model_apply(t->base, spool_at(t, k)) == MT_ENOMEM ? MT_ENOMEM : 0;
    size_t c = k / MT__SPOOL_CHUNK;
#ifdef FALLOC_FL_PUNCH_HOLE
    /* A chunk wholly evicted is never read again: its disk goes back (advice only). */
    if ((k + 1) % MT__SPOOL_CHUNK == 0 && c < t->sp.nchunks)
        (void)fallocate(t->web->file.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        (off_t)t->sp.off[c], (off_t)CHUNK_BYTES);
#else
    (void)c;
#endif
    return rc;
}

/* No more checkpoints (a map too large, or out of memory): from now on the evicted events
 * go to a base model, which starts as the state before the window. MT_ENOMEM when that
 * state could not be made: past states then start from the base as it was. */
static int ck_stop(mt_d_web_proc_t *t)
{
    mt_model_t *m = NULL;
    int rc = mt__d_web_state_at(t, 0, &m) == 0 ? 0 : MT_ENOMEM;
    if (rc == 0) {
        mt__model_destroy(&t->base);
        t->base = m;
    }
    for (size_t i = 0; i < t->nck; i++)
        ck_free(&t->ck[i]);
    t->nck = 0;
    t->npre = 0;
    return rc;
}

/* A checkpoint of p's model, after its events so far: every ckstep events. Without memory
 * for it, checkpoints stop (ck_stop: past states as right, rebuilt from the base). */
static int ck_take(mt_d_web_proc_t *t, const mt_d_proc_t *p)
{
    mt_assert(t->nck > 0 && t->nck < MT_D_WEB_CKS);
    mt_d_web_ck_t *c = &t->ck[t->nck];
    memset(c, 0, sizeof *c);
    c->at = t->nrec;
    size_t n = 0;
    int rc = 0;
    for (int cls = 0; cls < MT_MODEL_CLASSES && rc == 0; cls++) {
        rc = mt__model_map(p->model, cls, &c->map[cls]);
        mt__model_figures_totals(p->model, cls, &c->f[cls]);
        n += c->map[cls].nblocks + c->map[cls].nsegs;
    }
    if (rc != 0 || n > MT_D_WEB_CK_MAX) {
        ck_free(c);
        return ck_stop(t);
    }
    t->nck++;
    return 0;
}

/* ev into t's window: 0, or MT_ENOMEM when a past state it serves is no longer right. */
static int window_record(mt_d_web_proc_t *t, const mt_d_proc_t *p, const mt_event_rec_t *ev)
{
    int rc = 0;
    if (!t->win)
        return spool_record(t, ev);
    if (t->whead >= t->wready && t->wready < t->pcap)
        window_prefault(t);
    if (t->wcount == t->wcap) {
        /* The oldest event leaves the window: kept before it (a checkpoint and the events
         * since rebuild the state there), or applied to the base model. */
        if (t->nck)
            t->npre++;
        else if (mt__model_apply(t->base, mt__d_web_window_at(t, 0)) == MT_ENOMEM)
            rc = MT_ENOMEM;
        t->wcount--;
    }
    /* Streamed: a loaded log's window is far larger than the cache, and an ordinary store
     * first read the line it overwrote (nine tenths of recording an event, a quarter of
     * view's loading). The loop's thread reads the window back itself. The slot is the
     * oldest kept event's only when the ring is full, which the checkpoints prevent. */
    mt__event_store(&t->win[t->whead], ev);
    t->wseq = ev->seq;
    t->whead = t->whead + 1 == t->pcap ? 0 : t->whead + 1; /* no division per event */
    t->wcount++;
    t->nrec++;
    if (!t->nck)
        return rc;
    if (--t->ck_due == 0) {
        t->ck_due = t->ckstep;
        if (ck_take(t, p) != 0)
            rc = MT_ENOMEM;
        if (!t->nck)
            return rc;
    }
    /* The checkpoint the window needs is the newest at or before its first event. */
    uint64_t first = t->nrec - t->wcount;
    if (t->nck >= 2 && t->ck[1].at <= first) {
        ck_free(&t->ck[0]);
        memmove(&t->ck[0], &t->ck[1], (t->nck - 1) * sizeof t->ck[0]);
        t->nck--;
        t->npre = (size_t)(first - t->ck[0].at);
    }
    mt_assert(t->npre + t->wcount <= t->pcap);
    return rc;
}

int mt__d_web_set_span(mt_d_t *d, const mt_d_proc_t *p, uint64_t span_ns)
{
    mt_d_web_t *w = web_of(d, true);
    mt_d_web_proc_t *t = w ? mt__d_web_find(d, p) : NULL;
    if (w && !t)
        t = tracker_new(w, p);
    if (!t)
        return MT_ENOMEM;
    mt_assert(t->nrec == 0 && t->ncoarse == 0);
    uint64_t f = MT_D_WEB_FINE_NS;
    while (f > 1000 && f / 2 * (MT_D_WEB_FINE / 2) >= span_ns)
        f /= 2; /* (halved from 250 ms: 125 ms, 62.5 ms, ... down to a microsecond) */
    t->fine_ns = f;
    t->coarse_ns = f * (MT_D_WEB_COARSE0_NS / MT_D_WEB_FINE_NS);
    return 0;
}

int mt__d_web_record(mt_d_t *d, const mt_d_proc_t *p, const mt_event_rec_t *ev)
{
    mt_d_web_t *w = web_of(d, true);
    if (!w)
        return MT_ENOMEM;
    mt_d_web_proc_t *t = mt__d_web_find(d, p);
    if (!t && (t = tracker_new(w, p)) == NULL)
        return MT_ENOMEM;
    w->last = t;
    int rc = window_record(t, p, ev);
    if (ev->kind != MT_EV_GAP && ev->kind != MT_EV_TAG_LABEL && ev->kind != MT_EV_LIBRARY_LABEL)
        history_record(t, p, ev);
    return rc;
}
