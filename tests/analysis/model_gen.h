/* A hand-written event stream for model tests: events in seq order with the running totals
 * an allocator would carry. */
#ifndef MT_TESTS_ANALYSIS_MODEL_GEN_H
#define MT_TESTS_ANALYSIS_MODEL_GEN_H

#include <string.h>

#include "analysis/model.h"

typedef struct mgen_s {
    mt_model_t *m;
    uint64_t seq, t, allocated, reserved;
    int pool, device;
} mgen_t;

static inline mt_event_rec_t mgen_rec(mgen_t *g, int kind, uint64_t addr, uint64_t size, int tag)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof(ev));
    switch (kind) {
    case MT_EV_ALLOC:
        g->allocated += size;
        break;
    case MT_EV_FREE_REQUESTED:
        g->allocated -= size;
        break;
    case MT_EV_SEGMENT_ALLOC:
    case MT_EV_SEGMENT_MAP:
        g->reserved += size;
        break;
    case MT_EV_SEGMENT_FREE:
    case MT_EV_SEGMENT_UNMAP:
        g->reserved -= size;
        break;
    default:
        break;
    }
    ev.seq = g->seq++;
    ev.time_ns = (g->t += 1000);
    ev.kind = (uint8_t)kind;
    ev.addr = addr;
    ev.size = size;
    ev.requested = size;
    ev.tag = (uint8_t)tag;
    ev.pool = (uint8_t)(g->pool ? g->pool : MT_POOL_LARGE);
    ev.device = (uint8_t)g->device;
    ev.allocated = g->allocated;
    ev.reserved = g->reserved;
    return ev;
}

#endif
