/* The replays of a process's kept events (cfg.stream off): each event in log order from the
 * spool, through a fresh model to a point, the segment map at the end or at an event, and
 * the model after them all (report.h). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/event_spool.h"
#include "analysis/model.h"
#include "analysis/model_internal.h"
#include "analysis/report.h"
#include "memtrace/prof.h"
#include "util/assert.h"
#include "analysis/report_internal.h"

/* fn on each of p's first limit events, in log order, as the spool gives them back chunk by
 * chunk; a nonzero return stops it and is returned. */
static int each_event(const mt__report_t *r, const proc_t *p, size_t limit, mt__report_event_fn fn,
                      void *ctx)
{
    mt_event_rec_t *buf = NULL;
    if (p->evs.nchunks && !(buf = malloc(MT__SPOOL_CHUNK * sizeof(*buf))))
        return MT_ENOMEM;
    size_t k = 0;
    int rc = 0;
    for (size_t c = 0; rc == 0 && c <= p->evs.nchunks && k < limit; c++) {
        const mt_event_rec_t *evs;
        size_t n;
        rc = mt__spool_chunk(&p->evs, &r->spool, c, buf, &evs, &n);
        for (size_t j = 0; rc == 0 && j < n && k < limit; j++, k++)
            rc = fn(ctx, &evs[j], k);
    }
    free(buf);
    return rc;
}

typedef struct replay_s {
    mt_model_t *m;
    mt__report_point_fn fn;
    void *ctx;
} replay_t;

static int replay_one(void *ctx, const mt_event_rec_t *ev, size_t k)
{
    replay_t *rp = ctx;
    int rc = mt__model_apply(rp->m, ev);
    if (rc != 0)
        return rc;
    uint64_t tag_live[MT_TAG_MAX] = {0}, peak;
    mt__report_point_t pt = {.ev = ev,
                             .index = k,
                             .tag_live = tag_live,
                             .tag_mask = mt__model_tags_held(rp->m, MT_MODEL_DEVICE),
                             .model = rp->m};
    mt__model_levels(rp->m, MT_MODEL_DEVICE, &pt.allocated, &pt.reserved, &peak);
    mt__model_levels(rp->m, MT_MODEL_HOST, &pt.host_allocated, &pt.host_reserved, &peak);
    for (uint32_t held = pt.tag_mask; held != 0; held &= held - 1) {
        int t = __builtin_ctz(held);
        tag_live[t] = mt__model_tag_bytes(rp->m, MT_MODEL_DEVICE, t);
    }
    return rp->fn(rp->ctx, &pt);
}

/* A model as the replays start it: empty, with the process's stack table and modules. */
static int replay_model(const proc_t *p, const mt_model_cfg_t *cfg, mt_model_t **out)
{
    int rc = mt__model_create(out, cfg);
    if (rc == 0)
        mt__model_lifetimes_from(*out, p->t_known);
    if (rc == 0 && p->tables)
        rc = mt__model_tables_copy(*out, p->tables);
    return rc;
}

int mt__report_replay(const mt__report_t *r, size_t i, mt__report_point_fn fn, void *ctx)
{
    if (i >= r->nprocs || r->cfg.stream) /* no events kept to replay */
        return MT_EINVAL;
    const proc_t *p = &r->procs[i];
    replay_t rp = {.fn = fn, .ctx = ctx};
    int rc = replay_model(p, NULL, &rp.m);
    if (rc == 0)
        rc = each_event(r, p, SIZE_MAX, replay_one, &rp);
    mt__model_destroy(&rp.m);
    return rc;
}

void mt__report_drop_events(mt__report_t *r, size_t i)
{
    if (i < r->nprocs)
        mt__spool_free(&r->procs[i].evs);
}

int mt__report_each(const mt__report_t *r, size_t i, mt__report_event_fn fn, void *ctx)
{
    if (i >= r->nprocs || r->cfg.stream) /* no events kept to replay */
        return MT_EINVAL;
    return each_event(r, &r->procs[i], SIZE_MAX, fn, ctx);
}

typedef struct feed_s {
    mt_model_t *m;
    mt__report_event_fn fn;
    void *ctx;
} feed_t;

static int feed_one(void *ctx, const mt_event_rec_t *ev, size_t k)
{
    feed_t *fd = ctx;
    int rc = mt__model_apply(fd->m, ev);
    return rc != 0 ? rc : fd->fn(fd->ctx, ev, k);
}

int mt__report_replay_map(const mt__report_t *r, size_t i, mt__report_event_fn fn, void *ctx,
                          mt__report_map_t *out)
{
    memset(out, 0, sizeof(*out));
    if (i >= r->nprocs || r->cfg.stream) /* no events kept to replay */
        return MT_EINVAL;
    const proc_t *p = &r->procs[i];
    feed_t fd = {.fn = fn, .ctx = ctx};
    int rc = replay_model(p, NULL, &fd.m);
    if (rc == 0)
        rc = each_event(r, p, SIZE_MAX, feed_one, &fd);
    if (rc == 0)
        rc = mt__model_map(fd.m, MT_MODEL_DEVICE, out);
    mt__model_destroy(&fd.m);
    return rc;
}

static int apply_one(void *ctx, const mt_event_rec_t *ev, size_t k)
{
    (void)k;
    return mt__model_apply(ctx, ev);
}

typedef struct ending_s {
    mt_model_t *m;
    size_t next;  /* events applied */
    bool refused; /* the model refused event next */
} ending_t;

static int apply_counted(void *ctx, const mt_event_rec_t *ev, size_t k)
{
    ending_t *e = ctx;
    int rc = mt__model_apply(e->m, ev);
    e->refused = rc != 0;
    e->next = rc != 0 ? k : k + 1;
    return rc;
}

int mt__report_map_end(const mt__report_t *r, size_t i, mt__report_map_t *out, size_t *stopped,
                       bool *refused)
{
    memset(out, 0, sizeof(*out));
    *stopped = 0;
    *refused = false;
    if (i >= r->nprocs || r->cfg.stream) /* no events kept to replay */
        return MT_EINVAL;
    ending_t e = {0};
    int rc = replay_model(&r->procs[i], NULL, &e.m);
    if (rc == 0)
        rc = each_event(r, &r->procs[i], SIZE_MAX, apply_counted, &e);
    if (rc == 0)
        rc = mt__model_map(e.m, MT_MODEL_DEVICE, out);
    *stopped = rc == 0 ? SIZE_MAX : e.next;
    *refused = rc != 0 && e.refused;
    mt__model_destroy(&e.m);
    return rc;
}

int mt__report_map_at(const mt__report_t *r, size_t i, size_t index, bool host,
                      mt__report_map_t *out)
{
    memset(out, 0, sizeof(*out));
    if (i >= r->nprocs || r->cfg.stream) /* no events kept to replay */
        return MT_EINVAL;
    const proc_t *p = &r->procs[i];
    mt_model_t *m = NULL;
    int rc = replay_model(p, NULL, &m);
    if (rc == 0)
        rc = each_event(r, p, index == SIZE_MAX ? SIZE_MAX : index + 1, apply_one, m);
    if (rc == 0)
        rc = mt__model_map(m, host ? MT_MODEL_HOST : MT_MODEL_DEVICE, out);
    mt__model_destroy(&m);
    return rc;
}

int mt__report_model(const mt__report_t *r, size_t i, mt_model_t **out)
{
    *out = NULL;
    if (i >= r->nprocs || r->cfg.stream) /* no events kept to replay */
        return MT_EINVAL;
    const proc_t *p = &r->procs[i];
    mt_model_t *m = NULL;
    mt_model_cfg_t mc = {.keep_iterations = true,
                         .temporary_window_us = r->cfg.temporary_window_us};
    int rc = replay_model(p, &mc, &m);
    if (rc == 0)
        rc = each_event(r, p, SIZE_MAX, apply_one, m); /* strict, as the report's own pass */
    if (rc != 0) {
        mt__model_destroy(&m);
        return rc;
    }
    *out = m;
    return 0;
}

void mt__report_map_free(mt__report_map_t *m)
{
    mt__model_map_free(m);
}
