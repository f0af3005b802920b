/* Events in compact form: a thread cache's, the global path's (evbatch.h). */
#include "util/evbatch.h"

#include "memtrace/alloc.h"
#include "memtrace/common.h"

void mt__evb_hdr_pack(const mt__evb_hdr_t *h, mt_event_rec_t *slot)
{
    *slot = (mt_event_rec_t){
        .time_ns = h->time_ns,
        .addr = (uint64_t)h->allocated0,
        .size = h->nent,
        .requested = h->nev,
        .reserved = h->reserved,
        .stream = MT__EVB_MAGIC,
        .kind = MT__EVB_KIND,
        .device = h->device,
    };
}

int mt__evb_hdr_unpack(const mt_event_rec_t *slot, mt__evb_hdr_t *out)
{
    if (slot->kind != MT__EVB_KIND || slot->stream != MT__EVB_MAGIC || slot->pool != 0 ||
        slot->tag != 0 || slot->allocated != 0 || slot->size == 0 || slot->size > slot->requested ||
        slot->requested > MT__EVB_MAX_EV || (int64_t)slot->addr < 0)
        return MT_EPROTO;
    *out = (mt__evb_hdr_t){
        .time_ns = slot->time_ns,
        .allocated0 = (int64_t)slot->addr,
        .reserved = slot->reserved,
        .nent = (uint32_t)slot->size,
        .nev = (uint32_t)slot->requested,
        .device = slot->device,
    };
    return 0;
}

/* Sizes of blocks and requests below 2^62: sums of a batch's cannot overflow. */
#define SIZE_LIMIT ((uint64_t)1 << 62)

static bool entry_ok(const mt__evb_hdr_t *h, const mt__evb_ent_t *e)
{
    unsigned op = mt__evb_op(e);
    uint64_t req = mt__evb_req(e);
    if (mt__evb_op_events(op) == 0 || e->pool > MT_POOL_HOST || e->tag >= MT_TAG_MAX ||
        (e->rep != 0 && (op != MT__EVB_POP_FREE || (e->op & MT__EVB_TIMED))) ||
        mt__evb_dt(e) > UINT64_MAX - h->time_ns)
        return false;
    if (op == MT__EVB_STACK)
        return req == 0 && e->size != 0 &&
               (e->size <= MT_STACK_ID_MAX || e->size == MT_STACK_ID_OVERFLOW);
    return e->size < SIZE_LIMIT && req != 0 && req <= e->size;
}

/* One event of entry e into *ev, every field stored and none read back (a copy of the
 * record just written would wait for its stores to drain). */
static inline void put(mt_event_rec_t *ev, const mt__evb_hdr_t *h, const mt__evb_ent_t *e, int kind,
                       int64_t allocated, uint64_t requested)
{
    ev->seq = 0;
    ev->time_ns = h->time_ns + mt__evb_dt(e);
    ev->addr = e->addr;
    ev->size = e->size;
    ev->requested = requested;
    ev->allocated = (uint64_t)allocated;
    ev->reserved = h->reserved;
    ev->stream = e->stream;
    ev->kind = (uint8_t)kind;
    ev->pool = e->pool;
    ev->tag = e->tag;
    ev->device = h->device;
}

/* The events of entry i (1 to 3, seq 0) into ev, the program's allocated bytes *a carried
 * past them; returns how many. */
static inline unsigned entry_events(const mt__evb_hdr_t *h, const mt__evb_ent_t *ents, uint32_t i,
                                    int64_t *a, mt_event_rec_t *ev)
{
    const mt__evb_ent_t *e = &ents[i];
    unsigned op = mt__evb_op(e);
    if (op == MT__EVB_STACK) { /* the totals of the alloc it precedes */
        put(ev, h, e, MT_EV_STACK_REF, *a + (int64_t)ents[i + 1].size, 0);
        return 1;
    }
    uint64_t req = mt__evb_req(e);
    unsigned n = 0;
    if (op != MT__EVB_FREE) {
        *a += (int64_t)e->size;
        put(&ev[n++], h, e, MT_EV_ALLOC, *a, req);
        if (op == MT__EVB_POP)
            return 1;
    }
    *a -= (int64_t)e->size;
    put(&ev[n], h, e, MT_EV_FREE_REQUESTED, *a, req);
    put(&ev[n + 1], h, e, MT_EV_FREE_COMPLETED, *a, 0);
    return n + 2;
}

int mt__evb_expand(const mt__evb_hdr_t *h, const mt__evb_ent_t *ents, uint64_t seq0,
                   void (*cb)(void *ud, const mt_event_rec_t *ev), void *ud)
{
    if (h->nent == 0 || h->nent > h->nev || h->nev > MT__EVB_MAX_EV || h->allocated0 < 0 ||
        seq0 > UINT64_MAX - h->nev)
        return MT_EPROTO;
    /* Checked whole before the first call: a batch is delivered entirely or not at all. */
    uint64_t nev = 0;
    int64_t a = h->allocated0;
    for (uint32_t i = 0; i < h->nent; i++) {
        const mt__evb_ent_t *e = &ents[i];
        if (!entry_ok(h, e) ||
            (mt__evb_op(e) == MT__EVB_STACK &&
             (i + 1 == h->nent || (mt__evb_op(&ents[i + 1]) != MT__EVB_POP &&
                                   mt__evb_op(&ents[i + 1]) != MT__EVB_POP_FREE))))
            return MT_EPROTO;
        nev += mt__evb_ent_events(e);
        a += mt__evb_op_delta(e);
        if (a < 0 || (uint64_t)a >= SIZE_LIMIT)
            return MT_EPROTO;
    }
    if (nev != h->nev)
        return MT_EPROTO;
    a = h->allocated0;
    uint64_t seq = seq0;
    mt_event_rec_t ev[3];
    for (uint32_t i = 0; i < h->nent; i++)
        for (unsigned r = 0; r <= ents[i].rep; r++) {
            unsigned n = entry_events(h, ents, i, &a, ev);
            for (unsigned j = 0; j < n; j++) {
                ev[j].seq = seq++;
                cb(ud, &ev[j]);
            }
        }
    return 0;
}

size_t mt__evb_make(const mt__evb_hdr_t *h, const mt__evb_ent_t *ents, mt_event_rec_t *out)
{
    int64_t a = h->allocated0;
    size_t n = 0;
    for (uint32_t i = 0; i < h->nent; i++)
        for (unsigned r = 0; r <= ents[i].rep; r++)
            n += entry_events(h, ents, i, &a, out + n);
    return n;
}
