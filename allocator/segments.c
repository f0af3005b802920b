/* Segments: what the allocator holds from the backend, and the blocks tiling them.
 *
 * Segment sizes, split and merge rules follow the reference allocator: small pool
 * segments are 2 MiB, large ones 20 MiB for requests under 10 MiB and otherwise the
 * request rounded up to 2 MiB. Only whole unsplit segments go back to the backend.
 * Expandable segments are one virtual range per (pool, stream) whose pages are mapped at
 * the end on demand and unmapped from the end when the tail is free. */
#include <stdlib.h>

#include "allocator/internal.h"

static size_t round_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

size_t mt__seg_alloc_size(const mt_alloc_t *a, int bp, size_t rsize)
{
    if (bp == MT__BP_SMALL)
        return MT__SMALL_BUFFER;
    if (rsize < MT__MIN_LARGE && !a->cfg.fit_large_segments)
        return MT__LARGE_BUFFER;
    return round_up(rsize, MT__ROUND_LARGE);
}

/* ---- the address-ordered segment list ---- */

void mt__seg_link(mt_alloc_t *a, mt_segment_t *seg)
{
    mt_segment_t *prev = NULL, *cur = a->segs;
    while (cur != NULL && cur->addr < seg->addr) {
        prev = cur;
        cur = cur->next;
    }
    /* Backend ranges never overlap: the list stays address-ordered and disjoint. */
    mt_assert(seg->vsize >= seg->size && seg->vsize > 0);
    mt_assert(prev == NULL || prev->addr + prev->vsize <= seg->addr);
    mt_assert(cur == NULL || seg->addr + seg->vsize <= cur->addr);
    seg->prev = prev;
    seg->next = cur;
    if (prev != NULL)
        prev->next = seg;
    else
        a->segs = seg;
    if (cur != NULL)
        cur->prev = seg;
    a->nsegs++;
}

void mt__seg_unlink(mt_alloc_t *a, mt_segment_t *seg)
{
    mt_assert(a->nsegs > 0 && (seg->prev != NULL ? seg->prev->next == seg : a->segs == seg));
    if (seg->prev != NULL)
        seg->prev->next = seg->next;
    else
        a->segs = seg->next;
    if (seg->next != NULL)
        seg->next->prev = seg->prev;
    a->nsegs--;
}

mt_segment_t *mt__seg_find(const mt_alloc_t *a, uintptr_t addr)
{
    for (mt_segment_t *s = a->segs; s != NULL && s->addr <= addr; s = s->next)
        if (addr < s->addr + s->size)
            return s;
    return NULL;
}

bool mt__seg_is_whole_free(const mt_segment_t *seg)
{
    return seg->first != NULL && seg->first == seg->last && seg->first->state == MT_BLOCK_INACTIVE;
}

/* ---- bins with inactive_split accounting ---- */

void mt__seg_bin_in(mt_alloc_t *a, mt_block_t *b)
{
    mt__alloc_assert_owner(a);
    mt_assert(!b->split_counted && b->npending == 0);
    /* Free neighbours were merged first (the previous one may be a block being split,
     * still inactive until it is handed out). */
    mt_assert(b->next == NULL || b->next->state != MT_BLOCK_INACTIVE);
    mt__bins_changed(b->seg->bins->sr);
    mt__bins_link(b->seg->bins, b, mt__bin_class(b->size));
    if (b->prev != NULL || b->next != NULL) {
        b->split_counted = true;
        mt__stat_add(a->st.inactive_split_bytes, b->seg->slot, (int64_t)b->size);
        mt__stat_add(a->st.inactive_split, b->seg->slot, 1);
    }
}

void mt__seg_bin_out(mt_alloc_t *a, mt_block_t *b)
{
    mt__alloc_assert_owner(a);
    mt_assert(b->split_counted == (b->prev != NULL || b->next != NULL));
    mt__bins_changed(b->seg->bins->sr);
    mt__bins_unlink(b->seg->bins, b);
    if (b->split_counted) {
        b->split_counted = false;
        mt__stat_add(a->st.inactive_split_bytes, b->seg->slot, -(int64_t)b->size);
        mt__stat_add(a->st.inactive_split, b->seg->slot, -1);
    }
}

/* ---- split and merge ---- */

void mt__seg_split(mt_alloc_t *a, mt_block_t *b, size_t size)
{
    /* b was just taken out of the bins and is not yet handed out. */
    mt_assert(b->state == MT_BLOCK_INACTIVE && !b->split_counted);
    mt_assert(size % MT__ALIGN == 0 && size > 0 && size < b->size);
    mt_block_t *r = mt__block_new(a);
    if (r == NULL)
        return; /* no host memory for metadata: hand the block out whole */
    mt__seg_link_rest(b, r, size);
    mt_assert_expensive(mt__seg_tiles(b->seg));
    mt__seg_bin_in(a, r);
}

/* ---- new segments ---- */

bool mt__seg_within_limit(const mt_alloc_t *a, size_t more)
{
    size_t reserved = (size_t)a->st.reserved_bytes[MT_STAT_ALL].current;
    return more <= a->limit && reserved <= a->limit - more;
}

int mt__seg_new(mt_alloc_t *a, mt_streamrec_t *sr, int bp, size_t size, mt_segment_t **out)
{
    mt__alloc_assert_owner(a);
    mt_assert(size > 0 && size % MT__ALIGN == 0);
    mt_binset_t *bins = mt__alloc_binset(a, sr, bp);
    if (bins == NULL)
        return MT_ENOMEM;
    if (!mt__seg_within_limit(a, size))
        return MT_ENOMEM;
    void *p = NULL;
    int rc = mt__managed_seg_malloc(a, size, &p);
    if (rc != 0)
        return rc;
    mt_segment_t *seg = calloc(1, sizeof *seg);
    mt_block_t *b = seg ? mt__block_new(a) : NULL;
    if (b == NULL) {
        free(seg);
        (void)mt__managed_seg_free(a, p);
        return MT_ENOMEM;
    }
    seg->addr = (uintptr_t)p;
    seg->size = seg->vsize = size;
    seg->pool = (uint8_t)bp;
    seg->reserved = bp == MT__BP_RESERVED;
    seg->priv = sr->pool != NULL;
    seg->stream = sr->stream;
    seg->sid = sr->sid;
    seg->bins = bins;
    seg->first = seg->last = b;
    seg->last_used = ++a->clock;
    b->addr = seg->addr;
    b->size = size;
    b->seg = seg;
    b->state = MT_BLOCK_INACTIVE;
    mt__seg_link(a, seg);
    mt__stats_split(a, bp);
    seg->slot = (uint8_t)mt__stat_slot(a, bp);
    mt__stat_add(a->st.reserved_bytes, seg->slot, (int64_t)size);
    mt__stat_add(a->st.segment, seg->slot, 1);
    if (size >= a->cfg.max_split_size)
        mt__stat_add1(&a->st.oversize_segments, 1);
    a->st.num_device_alloc++;
    mt__alloc_emit(a, MT_EV_SEGMENT_ALLOC, seg->addr, size, 0, seg->sid, mt__public_pool(bp), 0);
    mt__alloc_emit_device(a);
    mt__seg_bin_in(a, b);
    *out = seg;
    return 0;
}

int mt__seg_grow(mt_alloc_t *a, mt_streamrec_t *sr, int bp, size_t rsize, mt_block_t **out)
{
    mt__alloc_assert_owner(a);
    /* A private pool's segments are plain: its memory stays put until the pool is released,
     * which an expandable range's page release would not keep. */
    if (a->cfg.expandable_segments && sr->pool == NULL) {
        int rc = mt__exp_grow(a, sr, bp, rsize, out);
        if (rc == MT_ENOTSUP) {
            /* A backend without virtual memory: plain segments from now on, with their rules
             * (small requests back in the small pool, one_pool having no range to share). */
            a->cfg.expandable_segments = false;
            a->small_max = MT__SMALL_SIZE;
        } else if (rc != MT__ENORANGE) {
            return rc;
        }
        /* MT__ENORANGE: this request's stream has no range and no address space is left
         * for one; a plain segment serves it, and a later request tries a range again. */
    }
    mt_segment_t *seg = NULL;
    int rc = mt__seg_new(a, sr, bp, mt__seg_alloc_size(a, bp, rsize), &seg);
    if (rc == 0)
        *out = seg->first;
    return rc;
}

/* ---- release ---- */

size_t mt__seg_release(mt_alloc_t *a, mt_segment_t *seg)
{
    mt__alloc_assert_owner(a);
    if (seg->expandable)
        return mt__exp_release(a, seg);
    if (!mt__seg_is_whole_free(seg))
        return 0;
    mt_block_t *b = seg->first;
    mt__seg_bin_out(a, b);
    mt__block_release(a, b);
    int rc = mt__managed_seg_free(a, (void *)seg->addr);
    if (rc != 0)
        mt__alloc_log(a, MT_LOG_WARN, "memtrace: backend free of a segment failed: %s",
                      mt_strerror(rc));
    size_t size = seg->size;
    mt_assert(a->st.reserved_bytes[MT_STAT_ALL].current >= (int64_t)size);
    mt__stat_add(a->st.reserved_bytes, seg->slot, -(int64_t)size);
    mt__stat_add(a->st.segment, seg->slot, -1);
    if (size >= a->cfg.max_split_size)
        mt__stat_add1(&a->st.oversize_segments, -1);
    a->st.num_device_free++;
    mt__alloc_emit(a, MT_EV_SEGMENT_FREE, seg->addr, size, 0, seg->sid, mt__public_pool(seg->pool),
                   0);
    mt__alloc_emit_device(a);
    mt__seg_unlink(a, seg);
    free(seg);
    return size;
}

static bool releasable(const mt_alloc_t *a, const mt_segment_t *seg)
{
    return seg->expandable ? mt__exp_releasable(a, seg) : mt__seg_is_whole_free(seg);
}

static int by_age(const void *x, const void *y)
{
    const mt_segment_t *s = *(mt_segment_t *const *)x, *t = *(mt_segment_t *const *)y;
    return s->last_used < t->last_used ? -1 : s->last_used > t->last_used;
}

static int by_size_desc(const void *x, const void *y)
{
    const mt_segment_t *s = *(mt_segment_t *const *)x, *t = *(mt_segment_t *const *)y;
    return s->size > t->size ? -1 : s->size < t->size;
}

/* Candidate segments (a rare path, so a temporary array is fine). */
static mt_segment_t **collect(mt_alloc_t *a, bool (*pick)(const mt_segment_t *, const void *),
                              const void *arg, size_t *n)
{
    *n = 0;
    mt_segment_t **v = malloc((a->nsegs + 1) * sizeof *v);
    if (v == NULL)
        return NULL;
    for (mt_segment_t *s = a->segs; s != NULL; s = s->next)
        if (pick(s, arg))
            v[(*n)++] = s;
    return v;
}

static bool pick_gc(const mt_segment_t *s, const void *arg)
{
    return !s->reserved && !s->priv && releasable(arg, s);
}

/* PyTorch's collection by reuse age: while less than the excess over the threshold has
 * been reclaimed, release every candidate whose age (allocator operations since its last
 * use) is at least the candidates' mean age, then recompute the mean over those left. A
 * sweep does not stop at the target, so that the collection does not run again at once. */
void mt__seg_gc(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    size_t reserved = (size_t)a->st.reserved_bytes[MT_STAT_ALL].current;
    if (reserved <= a->gc_limit)
        return;
    size_t target = reserved - a->gc_limit;
    size_t n;
    mt_segment_t **v = collect(a, pick_gc, a, &n);
    if (v == NULL)
        return;
    /* Expandable runs' pages are planned and unmapped together after the sweeps, with the
     * lock released; plain segments go at once. */
    mt__unmap_batch_t q = {0};
    size_t reclaimed = 0;
    long double total_age = 0;
    for (size_t i = 0; i < n; i++)
        total_age += (long double)(a->clock - v[i]->last_used);
    bool freed = true;
    while (reclaimed < target && freed && n > 0) {
        long double mean = total_age / (long double)n;
        freed = false;
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t age = a->clock - v[i]->last_used;
            if ((long double)age < mean) {
                v[kept++] = v[i];
                continue;
            }
            freed = true;
            total_age -= (long double)age;
            if (v[i]->expandable)
                reclaimed += mt__exp_plan_release(a, &q, v[i]);
            else
                reclaimed += mt__seg_release(a, v[i]);
        }
        n = kept;
    }
    free(v);
    mt__exp_unmap_run(a, &q);
}

typedef struct {
    const mt_binset_t *bs;
    size_t min;
} oversize_arg_t;

static bool pick_oversize(const mt_segment_t *s, const void *arg)
{
    const oversize_arg_t *o = arg;
    return s->bins == o->bs && !s->reserved && !s->priv && !s->expandable &&
           mt__seg_is_whole_free(s) && s->size >= o->min;
}

bool mt__seg_release_oversize(mt_alloc_t *a, mt_binset_t *bs, size_t need)
{
    oversize_arg_t arg = {bs, a->cfg.max_split_size};
    size_t n;
    mt_segment_t **v = collect(a, pick_oversize, &arg, &n);
    if (v == NULL || n == 0) {
        free(v);
        return false;
    }
    /* The smallest oversize segment that alone covers the request, else the largest
     * ones until the request is covered (the reference's order). */
    qsort(v, n, sizeof *v, by_size_desc);
    size_t fit = n;
    for (size_t i = 0; i < n; i++)
        if (v[i]->size >= need)
            fit = i;
    if (fit < n) {
        mt__seg_release(a, v[fit]);
    } else {
        size_t got = 0;
        for (size_t i = 0; i < n && got < need; i++)
            got += mt__seg_release(a, v[i]);
    }
    free(v);
    return true;
}

size_t mt__seg_release_smaller(mt_alloc_t *a, const mt_binset_t *bs, size_t rsize)
{
    size_t released = 0;
    mt_segment_t *next;
    for (mt_segment_t *s = a->segs; s != NULL; s = next) {
        next = s->next;
        if (s->bins == bs && !s->expandable && !s->reserved && !s->priv && s->size < rsize)
            released += mt__seg_release(a, s); /* a no-op unless whole and free */
    }
    return released;
}

static bool pick_cached(const mt_segment_t *s, const void *arg)
{
    (void)arg;
    return !s->reserved && !s->priv && !s->expandable && mt__seg_is_whole_free(s);
}

size_t mt__seg_over_peak(const mt_alloc_t *a, size_t more)
{
    size_t reserved = (size_t)a->st.reserved_bytes[MT_STAT_ALL].current;
    size_t high = (size_t)a->st.reserved_bytes[MT_STAT_ALL].peak;
    return reserved + more > high ? reserved + more - high : 0;
}

size_t mt__seg_release_to_fit(mt_alloc_t *a, size_t need)
{
    if (need == 0)
        return 0;
    size_t n, got = 0;
    mt_segment_t **v = collect(a, pick_cached, NULL, &n);
    if (v == NULL)
        return 0;
    qsort(v, n, sizeof *v, by_age);
    for (size_t i = 0; i < n && got < need; i++)
        got += mt__seg_release(a, v[i]);
    free(v);
    return got;
}

size_t mt__seg_release_all(mt_alloc_t *a, bool include_reserved, mt_stream_t *stream, bool only)
{
    mt__alloc_assert_owner(a);
    size_t released = 0;
    mt_segment_t *next;
    mt__unmap_batch_t q = {0}; /* expandable pages, unmapped after the walk */
    for (mt_segment_t *s = a->segs; s != NULL; s = next) {
        next = s->next;
        if ((s->reserved && !include_reserved) || s->priv)
            continue; /* a private pool's segments go back through mt_pool_release only */
        if (only && s->stream != stream)
            continue;
        if (s->expandable)
            mt__exp_plan_release(a, &q, s);
        else
            released += mt__seg_release(a, s);
    }
    return released + mt__exp_unmap_run(a, &q);
}

void mt__seg_destroy_all(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    bool synced = false;
    while (a->segs != NULL) {
        mt_segment_t *seg = a->segs;
        for (mt_block_t *b = seg->first; b != NULL; b = b->next) {
            free(b->uses);
            b->uses = NULL;
        }
        if (seg->expandable) {
            /* No other thread uses a (destroy): the lock is released for the calls only. */
            mt__alloc_unlock_raw(a);
            if (!synced)
                (void)mt_device_synchronize(a->backend);
            (void)mt_backend_vm_unmap(a->backend, (void *)seg->addr, seg->size);
            mt__alloc_lock(a);
            synced = true;
            a->st.num_device_free++;
        } else {
            (void)mt__managed_seg_free(a, (void *)seg->addr);
            a->st.num_device_free++;
        }
        /* Totals first: the event carries the reserved bytes after the release. */
        mt__stat_add(a->st.reserved_bytes, seg->slot, -(int64_t)seg->size);
        mt__stat_add(a->st.segment, seg->slot, -1);
        if (!seg->expandable && seg->size >= a->cfg.max_split_size)
            mt__stat_add1(&a->st.oversize_segments, -1);
        mt__alloc_emit(a, seg->expandable ? MT_EV_SEGMENT_UNMAP : MT_EV_SEGMENT_FREE, seg->addr,
                       seg->size, 0, seg->sid, mt__public_pool(seg->pool), 0);
        mt__seg_unlink(a, seg);
        free(seg);
    }
    mt__exp_destroy(a); /* the virtual ranges, now that nothing is mapped */
    mt__alloc_emit_device(a);
}
