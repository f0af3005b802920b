/* The model's figures per device ordinal (model_internal.h, mt__mdevice_t): kept for the
 * devices the events named, in an array sorted by ordinal that grows as devices appear, so
 * that a process costs what it used. A process of a distributed job touches one device or
 * a few of the 256 ordinals; fixed arrays per source and per ordinal were most of an empty
 * model's 32 KiB, and a report of thousands of ranks keeps a model per rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/model_internal.h"
#include "util/assert.h"
#include "util/grow.h"

/* The index of the first entry whose ordinal is >= d (m->ndev: none). */
static size_t lower(const mt_model_t *m, unsigned d)
{
    if (m->dhint < m->ndev && m->dev[m->dhint].device == d)
        return m->dhint; /* events of one device come in runs */
    size_t lo = 0, hi = m->ndev;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->dev[mid].device < d)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

const mt__mdevice_t *mt__model_dev_find(const mt_model_t *m, unsigned d)
{
    size_t i = lower(m, d);
    return i < m->ndev && m->dev[i].device == d ? &m->dev[i] : NULL;
}

mt__mdevice_t *mt__model_dev_get(mt_model_t *m, unsigned d)
{
    mt_assert(d < 256);
    size_t i = lower(m, d);
    if (i < m->ndev && m->dev[i].device == d) {
        m->dhint = i;
        return &m->dev[i];
    }
    if (m->ndev == m->capdev) {
        mt__mdevice_t *v = mt__grow(m->dev, &m->capdev, m->ndev + 1, sizeof *v, 2);
        if (v == NULL)
            return NULL;
        m->dev = v;
    }
    memmove(&m->dev[i + 1], &m->dev[i], (m->ndev - i) * sizeof *m->dev);
    m->dev[i] = (mt__mdevice_t){.device = (uint8_t)d};
    m->ndev++;
    m->dhint = i;
    mt_assert((i == 0 || m->dev[i - 1].device < d) &&
              (i + 1 == m->ndev || m->dev[i + 1].device > d));
    return &m->dev[i];
}

void mt__model_devs_free(mt_model_t *m)
{
    free(m->dev);
    m->dev = NULL;
    m->ndev = m->capdev = m->dhint = 0;
}

int mt__model_devs_check(const mt_model_t *m, char *why, size_t whylen)
{
    MT__MCHECK(m->ndev <= m->capdev && m->ndev <= 256 && (m->ndev == 0 || m->dhint < m->ndev),
               "devices: %zu entries of %zu, hint %zu", m->ndev, m->capdev, m->dhint);
    uint64_t mres = 0, mdev = 0, faults = 0, moved = 0; /* wrapping, as the model's sums */
    for (size_t i = 0; i < m->ndev; i++) {
        const mt__mdevice_t *v = &m->dev[i];
        MT__MCHECK(i == 0 || m->dev[i - 1].device < v->device, "devices: %u after %u, not sorted",
                   v->device, m->dev[i - 1].device);
        for (int h = 0; h < 2; h++) {
            MT__MCHECK(v->peak_alloc[h] >= v->alloc[h] && v->peak_res[h] >= v->res[h] &&
                           (v->seen[h] || (v->alloc[h] == 0 && v->res[h] == 0)),
                       "device %u%s: peaks below the latest totals, or totals never reported",
                       v->device, h ? " (host)" : "");
        }
        MT__MCHECK(v->managed ||
                       (v->mres == 0 && v->mdev == 0 && v->mfaults == 0 && v->mmoved == 0),
                   "device %u: managed figures of a device not managed", v->device);
        mres += v->mres;
        mdev += v->mdev;
        faults += v->mfaults;
        moved += v->mmoved;
    }
    MT__MCHECK(mres == m->mres_sum && mdev == m->managed.device_now &&
                   faults == m->managed.faults && moved == m->managed.migrated,
               "managed sums differ from the devices'");
    return 0;
}
