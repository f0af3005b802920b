/* A process's device allocations as a replayable trace (report.h, mt__report_trace): what
 * memtrace's allocator would reserve for the same sequence is then mt__replay_run's figure,
 * shown beside the gap. */
#include <stdlib.h>
#include <string.h>

#include "analysis/report.h"
#include "analysis/trace_csv.h"
#include "util/addrmap.h"

/* Invariant: the trace's ops and the open table agree: an addr is in open iff an allocate
 * of it has no free yet; its value is the allocate's slot | stream index << 32. */
typedef struct build_s {
    mt_trace_t *t;
    size_t cap_ops, cap_streams;
    mt__amap_t open; /* addr -> slot | stream << 32 (a block at address 0 is not replayed) */
    uint64_t live_bytes;
    size_t live;
    uint64_t *size_of; /* bytes by slot */
    size_t cap_slots;
} build_t;

static int push_op(build_t *b, const mt_trace_op_t *op)
{
    mt_trace_t *t = b->t;
    if (t->nops == b->cap_ops) {
        size_t cap = b->cap_ops ? 2 * b->cap_ops : 1024;
        mt_trace_op_t *v = realloc(t->ops, cap * sizeof *v);
        if (v == NULL)
            return MT_ENOMEM;
        t->ops = v;
        b->cap_ops = cap;
    }
    t->ops[t->nops++] = *op;
    return 0;
}

static int on_alloc(build_t *b, const mt_event_rec_t *ev)
{
    mt_trace_t *t = b->t;
    uint64_t size = ev->requested ? ev->requested : ev->size, v;
    if (ev->addr == 0 || mt__amap_get(&b->open, ev->addr, &v) == 0 || t->nslots >= UINT32_MAX)
        return 0; /* its free was lost: the allocator would refuse the address twice */
    if (t->nslots == b->cap_slots) {
        size_t cap = b->cap_slots ? 2 * b->cap_slots : 1024;
        uint64_t *v = realloc(b->size_of, cap * sizeof *v);
        if (v == NULL)
            return MT_ENOMEM;
        b->size_of = v;
        b->cap_slots = cap;
    }
    mt_trace_op_t op = {.size = size, .slot = (uint32_t)t->nslots, .action = MT_TRACE_ALLOCATE};
    int rc = mt__trace_stream_index(b->t, &b->cap_streams, ev->stream, &op.stream);
    if (rc == 0)
        rc = mt__amap_put(&b->open, ev->addr, op.slot | (uint64_t)op.stream << 32);
    if (rc == 0 && (rc = push_op(b, &op)) != 0)
        mt__amap_del(&b->open, ev->addr);
    if (rc != 0)
        return rc;
    b->size_of[t->nslots++] = size;
    t->nallocs++;
    b->live_bytes += size;
    b->live++;
    t->peak_live_bytes = b->live_bytes > t->peak_live_bytes ? b->live_bytes : t->peak_live_bytes;
    t->peak_live_count = b->live > t->peak_live_count ? b->live : t->peak_live_count;
    return 0;
}

/* The program's free (free_requested; a free_completed whose request was not seen). */
static int on_free(build_t *b, const mt_event_rec_t *ev)
{
    uint64_t v;
    if (mt__amap_get(&b->open, ev->addr, &v) != 0)
        return 0; /* allocated before the log, or already freed */
    uint32_t slot = (uint32_t)v;
    mt_trace_op_t op = {.size = b->size_of[slot],
                        .slot = slot,
                        .stream = (uint16_t)(v >> 32),
                        .action = MT_TRACE_FREE};
    int rc = push_op(b, &op);
    if (rc != 0)
        return rc;
    mt__amap_del(&b->open, ev->addr);
    b->t->nfrees++;
    b->live_bytes -= op.size;
    b->live--;
    return 0;
}

static int each(void *ctx, const mt__report_point_t *pt)
{
    build_t *b = ctx;
    const mt_event_rec_t *ev = pt->ev;
    if (ev->pool == MT_POOL_HOST)
        return 0;
    switch (ev->kind) {
    case MT_EV_ALLOC:
        return on_alloc(b, ev);
    case MT_EV_FREE_REQUESTED:
    case MT_EV_FREE_COMPLETED:
        return on_free(b, ev);
    case MT_EV_OOM:
        b->t->nfailures++;
        return 0;
    default:
        return 0;
    }
}

int mt__report_trace(const mt__report_t *r, size_t i, mt_trace_t **out)
{
    *out = NULL;
    build_t b = {.t = calloc(1, sizeof(mt_trace_t))};
    if (b.t == NULL)
        return MT_ENOMEM;
    int rc = mt__report_replay(r, i, each, &b);
    mt__amap_fini(&b.open);
    free(b.size_of);
    if (rc != 0) {
        mt__trace_free(&b.t);
        return rc;
    }
    b.t->nslots = b.t->nallocs;
    b.t->nrows = b.t->nallocs + b.t->nfrees + b.t->nfailures;
    b.t->leaked = b.live;
    *out = b.t;
    return 0;
}
