/* The model's segment map: segments (segment_alloc/free) and mapped pages of expandable
 * segments (segment_map/unmap), and the free extents they leave around the blocks.
 *
 * One unmap may cover pages of several maps (the allocator maps an expandable segment
 * piece by piece and releases it at once): unmapping cuts [addr, addr + size) out of
 * whatever it overlaps. Pages mapped right after mapped pages of the same stream and
 * pool extend them, so an expandable segment is one range as the allocator's snapshot
 * shows it. A new segment or mapping proves whatever overlapped it gone. */
#include "analysis/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "util/assert.h"

static uint64_t end_of(uint64_t addr, uint64_t size)
{
    return size > UINT64_MAX - addr ? UINT64_MAX : addr + size;
}

/* First index whose segment starts at or after addr. */
static size_t seg_lower(const mt__mclass_t *c, uint64_t addr)
{
    size_t lo = 0, hi = c->nsegs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->segs[mid].addr < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int seg_insert_at(mt__mclass_t *c, size_t i, const mt_model_seg_t *s)
{
    if (c->nsegs == c->segs_cap) {
        size_t cap = c->segs_cap ? 2 * c->segs_cap : 16;
        mt_model_seg_t *v = realloc(c->segs, cap * sizeof(*v));
        if (!v)
            return MT_ENOMEM;
        c->segs = v;
        c->segs_cap = cap;
    }
    /* Segments stay sorted and disjoint: callers cut what overlapped first. */
    mt_assert(i == 0 || end_of(c->segs[i - 1].addr, c->segs[i - 1].size) <= s->addr);
    mt_assert(i == c->nsegs || end_of(s->addr, s->size) <= c->segs[i].addr);
    memmove(&c->segs[i + 1], &c->segs[i], (c->nsegs - i) * sizeof(*s));
    c->segs[i] = *s;
    c->nsegs++;
    c->seg_bytes += s->size;
    if (s->uncertain)
        c->seg_unc += s->size;
    return 0;
}

static void seg_remove_at(mt__mclass_t *c, size_t i)
{
    const mt_model_seg_t *s = &c->segs[i];
    c->seg_bytes -= s->size;
    if (s->uncertain)
        c->seg_unc -= s->size;
    memmove(&c->segs[i], &c->segs[i + 1], (c->nsegs - i - 1) * sizeof(*s));
    c->nsegs--;
}

void mt__model_segs_mark_uncertain(mt__mclass_t *c)
{
    c->seg_unc = c->seg_bytes;
    for (size_t i = 0; i < c->nsegs; i++) {
        c->segs[i].uncertain = 1;
        if (c->segs[i].size > c->seg_unc_max)
            c->seg_unc_max = c->segs[i].size;
    }
}

int mt__model_seg_cut(mt__mclass_t *c, uint64_t addr, uint64_t size)
{
    uint64_t end = end_of(addr, size);
    size_t i = seg_lower(c, addr);
    i = i > 0 ? i - 1 : 0; /* the one before may reach into the range */
    int rc = 0;
    while (rc == 0 && i < c->nsegs && c->segs[i].addr < end) {
        mt_model_seg_t s = c->segs[i];
        uint64_t send = end_of(s.addr, s.size);
        if (send <= addr) {
            i++;
            continue;
        }
        seg_remove_at(c, i);
        if (s.addr < addr) {
            mt_model_seg_t left = s;
            left.size = addr - s.addr;
            rc = seg_insert_at(c, i++, &left);
        }
        if (rc == 0 && send > end) {
            mt_model_seg_t right = s;
            right.addr = end;
            right.size = send - end;
            rc = seg_insert_at(c, i++, &right);
        }
    }
    mt__model_drop_uncertain_in(c, addr, size);
    mt_assert(c->seg_unc <= c->seg_bytes);
    return rc;
}

int mt__model_seg_add(mt__mclass_t *c, const mt_event_rec_t *ev, bool mapped)
{
    if (ev->size == 0)
        return 0;
    int rc = mt__model_seg_cut(c, ev->addr, ev->size);
    if (rc != 0)
        return rc;
    size_t i = seg_lower(c, ev->addr);
    mt_model_seg_t *prev = i > 0 ? &c->segs[i - 1] : NULL;
    mt_model_seg_t *next = i < c->nsegs ? &c->segs[i] : NULL;
    /* Mapped pages of one (pool, stream) that touch mapped pages on either side are one
     * expandable segment with them: the allocator maps at a run's end, at its start, or
     * into the gap between two runs (which then join). */
    bool with_prev = mapped && prev && prev->mapped && !prev->uncertain && prev->pool == ev->pool &&
                     prev->stream == ev->stream && end_of(prev->addr, prev->size) == ev->addr &&
                     ev->size <= UINT64_MAX - prev->size;
    bool with_next = mapped && next && next->mapped && !next->uncertain && next->pool == ev->pool &&
                     next->stream == ev->stream && end_of(ev->addr, ev->size) == next->addr &&
                     ev->size <= UINT64_MAX - next->size;
    if (with_prev && with_next && next->size <= UINT64_MAX - prev->size - ev->size) {
        uint64_t more = next->size;
        seg_remove_at(c, i);
        prev = &c->segs[i - 1];
        prev->size += ev->size + more;
        c->seg_bytes += ev->size + more;
        return 0;
    }
    if (with_prev) {
        prev->size += ev->size;
        c->seg_bytes += ev->size;
        return 0;
    }
    if (with_next) {
        next->addr = ev->addr;
        next->size += ev->size;
        c->seg_bytes += ev->size;
        return 0;
    }
    mt_model_seg_t s = {.addr = ev->addr,
                        .size = ev->size,
                        .stream = ev->stream,
                        .pool = ev->pool,
                        .mapped = mapped ? 1 : 0};
    return seg_insert_at(c, i, &s);
}

void mt__model_seg_touch(mt__mclass_t *c, uint64_t addr)
{
    if (c->seg_unc == 0)
        return;
    size_t i = seg_lower(c, addr);
    if (i == c->nsegs || c->segs[i].addr != addr) {
        if (i == 0)
            return;
        i--;
    }
    mt_model_seg_t *s = &c->segs[i];
    if (s->uncertain && addr - s->addr < s->size) {
        s->uncertain = 0;
        c->seg_unc -= s->size;
    }
}

void mt__model_segs_prune(mt__mclass_t *c)
{
    if (c->seg_unc == 0) {
        c->seg_unc_max = 0;
        return;
    }
    mt__u128 certain = c->seg_bytes - c->seg_unc;
    mt__u128 room = c->rsum > certain ? c->rsum - certain : 0;
    if ((mt__u128)c->seg_unc_max <= room)
        return;
    uint64_t max = 0;
    for (size_t i = 0; i < c->nsegs;) {
        mt_model_seg_t s = c->segs[i];
        if (!s.uncertain) {
            i++;
            continue;
        }
        if ((mt__u128)s.size > room) {
            seg_remove_at(c, i);
            mt__model_drop_uncertain_in(c, s.addr, s.size);
            continue;
        }
        max = s.size > max ? s.size : max;
        i++;
    }
    c->seg_unc_max = max;
}

/* ---- free extents ---- */

static int cmp_range(const void *a, const void *b)
{
    const mt__range_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The blocks as sorted (addr, size) ranges: from map when given, else from the table. */
static mt__range_t *sorted_blocks(const mt__mclass_t *c, const mt_model_map_t *map, size_t *n)
{
    *n = 0;
    size_t want = map ? map->nblocks : c->live;
    mt__range_t *v = malloc((want ? want : 1) * sizeof(*v));
    if (!v)
        return NULL;
    if (map) {
        for (size_t i = 0; i < map->nblocks; i++)
            v[(*n)++] = (mt__range_t){map->blocks[i].addr, map->blocks[i].size};
        return v;
    }
    for (size_t i = 0; i < c->cap; i++)
        if (c->tab[i].state == MT__SLOT_FULL)
            v[(*n)++] = (mt__range_t){c->tab[i].addr, c->tab[i].size};
    qsort(v, *n, sizeof(*v), cmp_range);
    return v;
}

int mt__model_free_extents(const mt__mclass_t *c, uint64_t *total, uint64_t *largest,
                           mt_model_map_t *map)
{
    *total = *largest = 0;
    size_t nb = 0, k = 0;
    mt__range_t *blk = sorted_blocks(c, map, &nb);
    if (!blk)
        return MT_ENOMEM;
    if (map) {
        map->segs = malloc((c->nsegs ? c->nsegs : 1) * sizeof(*map->segs));
        if (!map->segs) {
            free(blk);
            return MT_ENOMEM;
        }
        map->nsegs = c->nsegs;
    }
    mt__u128 sum = 0;
    for (size_t i = 0; i < c->nsegs; i++) {
        uint64_t a = c->segs[i].addr, e = end_of(a, c->segs[i].size), cur = a, used = 0;
        while (k < nb && end_of(blk[k].addr, blk[k].size) <= a)
            k++;
        for (size_t j = k; j < nb && blk[j].addr < e; j++) {
            uint64_t ba = blk[j].addr > a ? blk[j].addr : a;
            uint64_t be = end_of(blk[j].addr, blk[j].size);
            be = be < e ? be : e;
            if (ba > cur) {
                sum += ba - cur;
                *largest = ba - cur > *largest ? ba - cur : *largest;
            }
            if (be > cur) {
                used += be - (ba > cur ? ba : cur);
                cur = be;
            }
        }
        if (e > cur) {
            sum += e - cur;
            *largest = e - cur > *largest ? e - cur : *largest;
        }
        if (map) {
            map->segs[i] = c->segs[i];
            map->segs[i].used = used;
        }
    }
    *total = mt__model_sat(sum);
    free(blk);
    return 0;
}

/* ---- checker ---- */

int mt__model_segs_check(const mt__mclass_t *c, char *why, size_t whylen)
{
    mt__u128 bytes = 0, unc = 0;
    for (size_t i = 0; i < c->nsegs; i++) {
        const mt_model_seg_t *s = &c->segs[i];
        bool ok =
            s->size > 0 && (i == 0 || end_of(c->segs[i - 1].addr, c->segs[i - 1].size) <= s->addr);
        if (!ok) {
            if (why)
                snprintf(why, whylen, "segment %zu at %#llx: empty, unsorted or overlapping", i,
                         (unsigned long long)s->addr);
            return MT_EPROTO;
        }
        bytes += s->size;
        if (s->uncertain) {
            unc += s->size;
            if (s->size > c->seg_unc_max) {
                if (why)
                    snprintf(why, whylen, "uncertain segment above seg_unc_max");
                return MT_EPROTO;
            }
        }
    }
    if (bytes != c->seg_bytes || unc != c->seg_unc) {
        if (why)
            snprintf(why, whylen, "segment byte sums differ from the segments");
        return MT_EPROTO;
    }
    return 0;
}
