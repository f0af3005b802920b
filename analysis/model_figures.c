/* Reading the event-replay model (model.h): its figures per class, tag, source and
 * device, and the blocks of a class for the segment map. Changing it is model.c's. */
#include "analysis/model_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- figures ---- */

void mt__model_figures_totals(const mt_model_t *m, int cls, mt_model_figures_t *out)
{
    const mt__mclass_t *c = &m->cls[cls == MT_MODEL_HOST ? MT_MODEL_HOST : MT_MODEL_DEVICE];
    *out = (mt_model_figures_t){0};
    out->reserved = mt__model_sat(c->rsum);
    out->allocated = mt__model_sat(c->asum);
    out->peak_allocated = c->peak_alloc;
    out->peak_reserved = c->peak_res;
    out->utilization = mt__model_utilization(out->allocated, out->reserved);
    out->blocks = c->live;
    out->segments = mt__segmap_count(&c->segs);
    /* At most allocated - known bytes of the uncertain blocks can still be live. */
    mt__u128 room = c->asum > c->known ? c->asum - c->known : 0;
    out->uncertain_bytes = mt__model_sat(c->unc < room ? c->unc : room);
    out->untracked_bytes = c->had_gap && room > c->unc ? mt__model_sat(room - c->unc) : 0;
    out->unmatched_frees = c->unmatched_frees;
    /* Pending uncertain blocks count in no figure but the free extents: they alone do not
     * make the class uncertain. */
    out->uncertain = c->unc > 0 || c->segs.unc > 0 || out->untracked_bytes > 0;
}

/* The free extents' figures in out, capped by the reserved bytes. */
static void free_figures(mt_model_figures_t *out)
{
    if (out->total_free > out->reserved)
        out->total_free = out->reserved;
    if (out->largest_free > out->total_free)
        out->largest_free = out->total_free;
    out->fragmentation = mt__model_fragmentation(out->largest_free, out->total_free);
}

int mt__model_figures(const mt_model_t *m, int cls, mt_model_figures_t *out)
{
    const mt__mclass_t *c = &m->cls[cls == MT_MODEL_HOST ? MT_MODEL_HOST : MT_MODEL_DEVICE];
    mt__model_figures_totals(m, cls, out);
    int rc = mt__model_free_extents(c, &out->total_free, &out->largest_free, NULL);
    free_figures(out);
    return rc;
}

int mt__model_figures_kept(mt_model_t *m, int cls, mt_model_figures_t *out)
{
    mt__mclass_t *c = &m->cls[cls == MT_MODEL_HOST ? MT_MODEL_HOST : MT_MODEL_DEVICE];
    mt__model_figures_totals(m, cls, out);
    int rc = mt__model_free_kept(c, &out->total_free, &out->largest_free);
    free_figures(out);
    return rc;
}

void mt__model_tag(const mt_model_t *m, int cls, int tag, mt_model_tag_t *out)
{
    const mt__mclass_t *c = &m->cls[cls == MT_MODEL_HOST ? MT_MODEL_HOST : MT_MODEL_DEVICE];
    *out = (mt_model_tag_t){0};
    if (tag < 0 || tag >= MT_TAG_MAX)
        return;
    uint64_t a = mt__model_sat(c->asum);
    mt__u128 room = c->asum > c->known ? c->asum - c->known : 0;
    uint64_t b = mt__model_sat(c->tag_bytes[tag]);
    uint64_t u = mt__model_sat(c->unc_bytes[tag] < room ? c->unc_bytes[tag] : room);
    out->bytes = b < a ? b : a;
    out->blocks = c->tag_blocks[tag];
    out->peak = c->tag_peak[tag] < c->peak_alloc ? c->tag_peak[tag] : c->peak_alloc;
    out->uncertain_bytes = u;
    out->uncertain_blocks = c->unc_blocks[tag];
}

int mt__model_source(const mt_model_t *m, unsigned src, uint64_t *allocated, uint64_t *reserved)
{
    if (src >= MT_EVENT_SOURCES)
        return MT_EINVAL;
    mt__model_device(m, src & 255u, src >= 256, allocated, reserved);
    return 0;
}

void mt__model_device(const mt_model_t *m, unsigned device, bool host, uint64_t *allocated,
                      uint64_t *reserved)
{
    const mt__mdevice_t *v = mt__model_dev_find(m, device & 255u);
    *allocated = v != NULL ? v->alloc[host] : 0;
    *reserved = v != NULL ? v->res[host] : 0;
}

size_t mt__model_devices(const mt_model_t *m, mt_model_dev_t *out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < m->ndev; i++) { /* by ordinal */
        const mt__mdevice_t *v = &m->dev[i];
        if (!v->seen[0])
            continue;
        if (n < max)
            out[n] = (mt_model_dev_t){.device = v->device,
                                      .allocated = v->alloc[0],
                                      .reserved = v->res[0],
                                      .peak_allocated = v->peak_alloc[0],
                                      .peak_reserved = v->peak_res[0]};
        n++;
    }
    return n;
}

uint64_t mt__model_pool_bytes(const mt_model_t *m, int pool)
{
    if (pool < 0 || pool > MT_POOL_HOST)
        return 0;
    const mt__mclass_t *c = &m->cls[pool == MT_POOL_HOST ? MT_MODEL_HOST : MT_MODEL_DEVICE];
    return mt__model_sat(c->pool_bytes[pool]);
}

uint64_t mt__model_events(const mt_model_t *m)
{
    return m->events;
}

uint64_t mt__model_lost(const mt_model_t *m)
{
    return m->lost_rec > m->lost_seq ? m->lost_rec : m->lost_seq;
}

/* ---- blocks for the map ---- */

int mt__model_map(const mt_model_t *m, int cls, mt_model_map_t *out)
{
    const mt__mclass_t *c = &m->cls[cls == MT_MODEL_HOST ? MT_MODEL_HOST : MT_MODEL_DEVICE];
    memset(out, 0, sizeof(*out));
    out->blocks = malloc((c->live ? c->live : 1) * sizeof(*out->blocks));
    mt__range_t *order = malloc((c->live ? 2 * c->live : 1) * sizeof(*order));
    if (!out->blocks || !order) {
        free(order);
        mt__model_map_free(out);
        return MT_ENOMEM;
    }
    /* (addr, index) pairs sorted, then the blocks taken in that order */
    for (size_t i = 0; i < c->live; i++)
        order[i] = (mt__range_t){c->blocks[i].addr, i};
    mt__model_sort_ranges(order, c->live, order + c->live);
    for (size_t i = 0; i < c->live; i++) {
        const mt__mblock_t *b = &c->blocks[order[i].size];
        out->blocks[out->nblocks++] = (mt_model_block_t){.addr = b->addr,
                                                         .size = b->size,
                                                         .stack = mt__model_stack_id(m, b->sidx),
                                                         .tag = b->tag,
                                                         .pool = b->pool,
                                                         .pending = b->pending,
                                                         .uncertain = b->uncertain,
                                                         .requested = b->requested};
    }
    free(order);
    int rc = mt__model_free_extents(c, &out->total_free, &out->largest_free, out);
    if (rc != 0) {
        mt__model_map_free(out);
        return rc;
    }
    uint64_t r = mt__model_sat(c->rsum);
    out->total_free = out->total_free < r ? out->total_free : r;
    out->largest_free = out->largest_free < out->total_free ? out->largest_free : out->total_free;
    return 0;
}

void mt__model_map_free(mt_model_map_t *map)
{
    free(map->segs);
    free(map->blocks);
    memset(map, 0, sizeof(*map));
}
