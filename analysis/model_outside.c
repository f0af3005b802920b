/* Device memory outside the allocator (docs/outside.md): each device's used bytes as the
 * driver reported them (MT_EV_DEVICE), the bytes libraries took without the allocator
 * (MT_EV_OUTSIDE_*), the library names (MT_EV_LIBRARY_LABEL), and the split of the device's
 * used bytes into parts that add up to it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/model_internal.h"

static mt__mdev_t *dev_of(mt_model_t *m, unsigned d)
{
    mt__mdevice_t *v = mt__model_dev_get(m, d);
    if (v == NULL)
        return NULL;
    if (v->out == NULL && (v->out = calloc(1, sizeof *v->out)) != NULL)
        v->out->self = UINT64_MAX;
    return v->out;
}

int mt__model_outside_apply(mt_model_t *m, const mt_event_rec_t *ev)
{
    if (ev->kind == MT_EV_LIBRARY_LABEL) {
        if (ev->tag == 0 || ev->tag >= MT_TAG_MAX)
            return 0;
        if (m->libname == NULL && (m->libname = calloc(MT_TAG_MAX, sizeof *m->libname)) == NULL)
            return MT_ENOMEM;
        (void)mt_event_label_unpack(ev, m->libname[ev->tag]);
        return 0;
    }
    mt__mdev_t *o = dev_of(m, ev->device);
    if (o == NULL)
        return MT_ENOMEM;
    if (ev->kind == MT_EV_DEVICE) {
        o->used = ev->size;
        o->total = ev->requested;
        o->self = ev->addr <= ev->size ? ev->addr : UINT64_MAX; /* more than used: not a figure */
        o->peak_used = ev->size > o->peak_used ? ev->size : o->peak_used;
        if (!o->seen) {
            /* Before the allocator's first segment: what the context holds, with anything
             * else in use that no event names (other processes too, unless the driver
             * told this process's own bytes). */
            uint64_t a = 0, r = 0, mine = o->self != UINT64_MAX ? o->self : ev->size;
            mt__model_device(m, ev->device, false, &a, &r);
            uint64_t known = mt_model_sat_add(r, o->libs);
            o->context = mine > known ? mine - known : 0;
        }
        o->seen = true;
        return 0;
    }
    unsigned id = ev->tag < MT_TAG_MAX ? ev->tag : 0;
    if (ev->kind == MT_EV_OUTSIDE_ALLOC) {
        o->lib[id] = mt_model_sat_add(o->lib[id], ev->size);
        o->libs = mt_model_sat_add(o->libs, ev->size);
        o->lib_peak[id] = o->lib[id] > o->lib_peak[id] ? o->lib[id] : o->lib_peak[id];
    } else { /* a free of more than was seen (a log begun late) stops at 0 */
        uint64_t b = ev->size < o->lib[id] ? ev->size : o->lib[id];
        o->lib[id] -= b;
        o->libs -= b;
    }
    return 0;
}

void mt__model_outside_free(mt_model_t *m)
{
    for (size_t i = 0; i < m->ndev; i++) {
        free(m->dev[i].out);
        m->dev[i].out = NULL;
    }
    free(m->libname);
}

int mt__model_outside_check(const mt_model_t *m, char *why, size_t whylen)
{
    for (size_t k = 0; k < m->ndev; k++) {
        const mt__mdev_t *o = m->dev[k].out;
        unsigned d = m->dev[k].device;
        if (o == NULL)
            continue;
        uint64_t sum = 0;
        for (unsigned i = 0; i < MT_TAG_MAX; i++) {
            MT__MCHECK(o->lib_peak[i] >= o->lib[i], "device %u library %u: peak below bytes", d, i);
            sum = mt_model_sat_add(sum, o->lib[i]);
        }
        MT__MCHECK(sum == o->libs, "device %u: outside bytes %llu, libraries sum to %llu", d,
                   (unsigned long long)o->libs, (unsigned long long)sum);
        MT__MCHECK(o->peak_used >= o->used && (o->seen || (o->used == 0 && o->context == 0)),
                   "device %u: used figures", d);
        MT__MCHECK(o->self == UINT64_MAX || o->self <= o->used, "device %u: own bytes above used",
                   d);
    }
    return 0;
}

/* The parts of one device's used bytes, each taken from what is left: the allocators'
 * reserved bytes, the libraries', the context, and the rest. */
static void split(const mt_model_t *m, unsigned d, const mt__mdev_t *o, mt_model_outside_t *out)
{
    uint64_t a = 0, r = 0;
    mt__model_device(m, d, false, &a, &r);
    *out = (mt_model_outside_t){
        .device = d, .used = o->used, .total = o->total, .peak_used = o->peak_used, .reserved = r};
    uint64_t left = o->used > r ? o->used - r : 0;
    out->outside = left;
    out->libraries = o->libs < left ? o->libs : left;
    left -= out->libraries;
    out->context = o->context < left ? o->context : left;
    left -= out->context;
    out->self_known = o->self != UINT64_MAX;
    if (out->self_known) {
        uint64_t others = o->used - o->self;
        out->other_processes = others < left ? others : left;
        left -= out->other_processes;
    }
    out->not_seen = left;
}

size_t mt__model_outside(const mt_model_t *m, mt_model_outside_t *out, size_t max)
{
    size_t n = 0;
    for (size_t k = 0; k < m->ndev; k++) { /* by ordinal */
        const mt__mdev_t *o = m->dev[k].out;
        if (o == NULL || !o->seen)
            continue;
        if (n < max)
            split(m, m->dev[k].device, o, &out[n]);
        n++;
    }
    return n;
}

const char *mt__model_library_name(const mt_model_t *m, unsigned id)
{
    if (id == 0 || id >= MT_TAG_MAX || m->libname == NULL || m->libname[id][0] == '\0')
        return id == 0 ? "unnamed" : "library?";
    return m->libname[id];
}

size_t mt__model_outside_libraries(const mt_model_t *m, unsigned device, mt_model_library_t *out,
                                   size_t max)
{
    const mt__mdevice_t *v = device < 256 ? mt__model_dev_find(m, device) : NULL;
    const mt__mdev_t *o = v != NULL ? v->out : NULL;
    if (o == NULL)
        return 0;
    size_t n = 0;
    for (unsigned i = 0; i < MT_TAG_MAX; i++) {
        if (o->lib_peak[i] == 0)
            continue;
        mt_model_library_t row = {.id = i,
                                  .name = mt__model_library_name(m, i),
                                  .bytes = o->lib[i],
                                  .peak = o->lib_peak[i]};
        size_t k = n < max ? n : max; /* insertion by bytes, then peak, largest first */
        while (k > 0 && (out[k - 1].bytes < row.bytes ||
                         (out[k - 1].bytes == row.bytes && out[k - 1].peak < row.peak))) {
            if (k < max)
                out[k] = out[k - 1];
            k--;
        }
        if (k < max)
            out[k] = row;
        n++;
    }
    return n;
}
