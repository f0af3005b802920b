/* Expandable segments: one virtual range per (pool, stream), reserved once, in which pages
 * are mapped where requests need them.
 *
 * Each maximal run of mapped pages is one segment, so blocks tile a segment's mapped bytes
 * exactly as they tile a plain one. A request that finds no cached block maps the fewest
 * pages that give it room: extending a run's free tail or free head, or filling the gap
 * between two runs (which then become one), else starting a run. Whole free pages inside
 * runs are unmapped when the cache is released and, with release_to_fit, before a mapping
 * would raise reserved bytes: the pages move to where the request needs them, and reserved
 * tracks live bytes to within the partial pages at the edges of free blocks.
 * docs/allocator-policy.md has the measurements. */
#include <stdlib.h>

#include "allocator/internal.h"
#include "util/grow.h"

#define EXP_PAGE ((size_t)2 << 20) /* mapping unit: the usual VM granularity */

static size_t round_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

size_t mt__exp_page(const mt_alloc_t *a)
{
    return a->vm_gran > EXP_PAGE ? a->vm_gran : EXP_PAGE;
}

static bool is_run_of(const mt_segment_t *s, const mt_binset_t *bins)
{
    return s->expandable && s->bins == bins;
}

static size_t free_tail(const mt_segment_t *s)
{
    return s != NULL && s->last->state == MT_BLOCK_INACTIVE ? s->last->size : 0;
}

static size_t free_head(const mt_segment_t *s)
{
    return s != NULL && s->first->state == MT_BLOCK_INACTIVE ? s->first->size : 0;
}

/* ---- planning a mapping ---- */

/* Pages [at, at + len) to map; left ends at `at` and right starts at at + len when set. */
typedef struct exp_plan_s {
    uintptr_t at;
    size_t len;
    size_t gap; /* bytes of the unmapped gap the pages come from */
    mt_segment_t *left, *right;
} exp_plan_t;

/* Where a request prefers its pages (place_high): zoned => requests of at least place_high
 * bytes (high) prefer the top half of the range, [mid, end), the others the bottom half. */
typedef struct exp_zone_s {
    uintptr_t mid;
    bool zoned, high;
} exp_zone_t;

static bool in_zone(const exp_zone_t *z, const exp_plan_t *c)
{
    return !z->zoned || (z->high ? c->at >= z->mid : c->at + c->len <= z->mid);
}

static void consider(exp_plan_t *best, const exp_plan_t *c, const exp_zone_t *z)
{
    if (c->len == 0 || c->len > c->gap)
        return;
    bool joins = c->left != NULL && c->right != NULL;
    bool best_joins = best->left != NULL && best->right != NULL;
    if (best->len != 0 && in_zone(z, c) != in_zone(z, best)) {
        if (in_zone(z, c))
            *best = *c;
        return;
    }
    if (best->len == 0 || c->len < best->len ||
        (c->len == best->len &&
         (c->gap < best->gap || (c->gap == best->gap && joins > best_joins))))
        *best = *c;
}

/* The lowest in-flight mapping of (sr, bp) that starts at or above lo, or NULL. */
static const mt__map_t *next_map(const mt_alloc_t *a, const mt_streamrec_t *sr, int bp,
                                 uintptr_t lo)
{
    const mt__map_t *best = NULL;
    for (const mt__map_t *m = a->maps; m != NULL; m = m->next)
        if (m->sr == sr && m->bp == bp && m->at >= lo && (best == NULL || m->at < best->at))
            best = m;
    return best;
}

static mt_segment_t *next_run(mt_segment_t *s, const mt_binset_t *bins)
{
    while (s != NULL && !is_run_of(s, bins))
        s = s->next;
    return s;
}

/* The placement of an rsize block: in its zone (place_high), then the one that maps the
 * fewest pages, then the smallest gap (so large gaps stay whole), then one that joins two
 * runs. A high request may also start at the top of the last gap. Pages another thread is
 * mapping bound gaps like runs without free edges. False when the range is full. */
static bool exp_plan(const mt_alloc_t *a, const mt_streamrec_t *sr, int bp, size_t rsize,
                     exp_plan_t *best)
{
    size_t page = mt__exp_page(a);
    const mt_binset_t *bins = sr->bins[bp];
    uintptr_t lo = sr->vbase[bp], end = lo + sr->vsize[bp];
    exp_zone_t z = {.mid = lo + sr->vsize[bp] / 2,
                    .zoned = a->cfg.place_high > 0,
                    .high = a->cfg.place_high > 0 && rsize >= a->cfg.place_high};
    mt_segment_t *left = NULL, *s = next_run(a->segs, bins);
    *best = (exp_plan_t){0};
    for (;;) {
        const mt__map_t *m = next_map(a, sr, bp, lo);
        bool busy = m != NULL && m->at < (s != NULL ? s->addr : end);
        mt_segment_t *right = busy ? NULL : s;
        uintptr_t gap_end = busy ? m->at : s != NULL ? s->addr : end;
        size_t gap = gap_end - lo, lf = free_tail(left), rf = free_head(right);
        if (gap > 0) {
            size_t len = rsize > lf ? round_up(rsize - lf, page) : page;
            exp_plan_t c = {lo, len, gap, left, len == gap ? right : NULL};
            consider(best, &c, &z);
            if (!busy && s == NULL && z.high) {
                len = round_up(rsize, page);
                c = (exp_plan_t){gap_end - len, len, gap, len == gap ? left : NULL, NULL};
                consider(best, &c, &z);
            }
            if (right != NULL) {
                len = rsize > rf ? round_up(rsize - rf, page) : page;
                c = (exp_plan_t){gap_end - len, len, gap, len == gap ? left : NULL, right};
                consider(best, &c, &z);
                if (lf + gap + rf >= rsize) {
                    c = (exp_plan_t){lo, gap, gap, left, right};
                    consider(best, &c, &z);
                }
            }
        }
        if (busy) {
            left = NULL;
            lo = m->at + m->len;
            continue;
        }
        if (s == NULL)
            break;
        left = s;
        lo = s->addr + s->size;
        s = next_run(s->next, bins);
    }
    return best->len > 0;
}

/* ---- mapping ---- */

/* Fixes the links after block gone (absorbed into into, its predecessor): into->next was
 * set to gone->next already. */
static void drop_link(mt_segment_t *seg, mt_block_t *gone, mt_block_t *into)
{
    if (gone->next != NULL)
        gone->next->prev = into;
    else
        seg->last = into;
}

/* Right's blocks join left (the pages between them were just mapped). */
static void exp_join(mt_alloc_t *a, mt_streamrec_t *sr, mt_segment_t *left, mt_segment_t *right)
{
    mt_assert(left->addr + left->size == right->addr && left->bins == right->bins);
    for (mt_block_t *b = right->first; b != NULL; b = b->next)
        b->seg = left;
    left->last->next = right->first;
    right->first->prev = left->last;
    left->last = right->last;
    left->size += right->size;
    left->vsize = left->size;
    mt__seg_unlink(a, right);
    mt__stat_add(a->st.segment, right->slot, -1);
    sr->nruns[right->pool]--;
    free(right);
}

/* The run of bins ending at addr (ends) or starting at it (!ends), or NULL. */
static mt_segment_t *run_at(const mt_alloc_t *a, const mt_binset_t *bins, uintptr_t addr, bool ends)
{
    for (mt_segment_t *s = a->segs; s != NULL && s->addr <= addr; s = s->next)
        if (is_run_of(s, bins) && (ends ? s->addr + s->size : s->addr) == addr)
            return s;
    return NULL;
}

/* Maps the plan's pages with the lock released, then joins them to the runs they touch
 * now (the plan's neighbours may have changed meanwhile) and merges the block with its
 * free neighbours. MT_EAGAIN: mapped, but the merged block no longer fits rsize (another
 * thread took a neighbour's free edge): the caller plans again. */
static int exp_map(mt_alloc_t *a, mt_streamrec_t *sr, int bp, const exp_plan_t *p, size_t rsize,
                   mt_block_t **out)
{
    /* Metadata first, so that nothing can fail once the pages are mapped. */
    mt_block_t *nb = mt__block_new(a);
    mt_segment_t *fresh = nb != NULL ? calloc(1, sizeof *fresh) : NULL;
    if (fresh == NULL) {
        if (nb != NULL)
            mt__block_release(a, nb);
        return MT_ENOMEM;
    }
    mt__map_t m = {p->at, p->len, sr, bp, a->maps};
    a->maps = &m;
    sr->nmaps[bp]++;
    a->inflight_map_bytes += p->len;
    mt__alloc_unlock(a);
    int rc = mt_backend_vm_map(a->backend, (void *)p->at, p->len);
    mt__alloc_lock(a);
    mt__map_t **pp = &a->maps;
    while (*pp != &m) {
        mt_assert(*pp != NULL); /* nobody else unlinks it */
        pp = &(*pp)->next;
    }
    *pp = m.next;
    mt_assert(sr->nmaps[bp] > 0 && a->inflight_map_bytes >= p->len);
    sr->nmaps[bp]--;
    a->inflight_map_bytes -= p->len;
    pthread_cond_broadcast(&a->cv);
    if (rc != 0) {
        free(fresh);
        mt__block_release(a, nb);
        return rc;
    }
    mt_binset_t *bins = sr->bins[bp];
    mt_segment_t *left = run_at(a, bins, p->at, true);
    mt_segment_t *right = run_at(a, bins, p->at + p->len, false), *seg = left ? left : right;
    /* The free edges the new pages join leave the bins before their neighbours change. */
    mt_block_t *lo = left != NULL && free_tail(left) ? left->last : NULL;
    mt_block_t *hi = right != NULL && free_head(right) ? right->first : NULL;
    if (lo != NULL)
        mt__seg_bin_out(a, lo);
    if (hi != NULL)
        mt__seg_bin_out(a, hi);
    nb->addr = p->at;
    nb->size = p->len;
    nb->state = MT_BLOCK_INACTIVE;
    if (seg == NULL) {
        *fresh = (mt_segment_t){.addr = p->at,
                                .size = p->len,
                                .vsize = p->len,
                                .first = nb,
                                .last = nb,
                                .bins = bins,
                                .stream = sr->stream,
                                .sid = sr->sid,
                                .pool = (uint8_t)bp,
                                .expandable = true};
        mt__seg_link(a, fresh);
        mt__stats_split(a, bp);
        fresh->slot = (uint8_t)mt__stat_slot(a, bp);
        mt__stat_add(a->st.segment, fresh->slot, 1);
        sr->nruns[bp]++;
        seg = fresh;
    } else {
        free(fresh);
        if (left != NULL) {
            nb->prev = seg->last;
            seg->last->next = nb;
            seg->last = nb;
        } else {
            nb->next = seg->first;
            seg->first->prev = nb;
            seg->first = nb;
            seg->addr = p->at;
        }
        seg->size += p->len;
    }
    nb->seg = seg;
    seg->vsize = seg->size;
    if (left != NULL && right != NULL)
        exp_join(a, sr, left, right);
    if (lo != NULL) {
        lo->size += nb->size;
        lo->next = nb->next;
        drop_link(seg, nb, lo);
        mt__block_release(a, nb);
        nb = lo;
    }
    if (hi != NULL) {
        nb->size += hi->size;
        nb->next = hi->next;
        drop_link(seg, hi, nb);
        mt__block_release(a, hi);
    }
    seg->last_used = ++a->clock;
    mt__stat_add(a->st.reserved_bytes, mt__stat_slot(a, bp), (int64_t)p->len);
    a->st.num_device_alloc++;
    mt__alloc_emit(a, MT_EV_SEGMENT_MAP, p->at, p->len, rsize, sr->sid, mt__public_pool(bp), 0);
    mt__alloc_emit_device(a);
    mt__seg_bin_in(a, nb);
    if (nb->size < rsize)
        return MT_EAGAIN;
    *out = nb;
    return 0;
}

/* ---- unmapping ---- */

/* Releases the (bp) range of sr when it has no run and no mapping in flight; vm_release
 * with the lock released. A thread in mt__exp_grow that planned in the range plans again
 * after any release of the lock, and reserves a new range if this one went. */
static void range_drop(mt_alloc_t *a, mt_streamrec_t *sr, int bp)
{
    if (sr->vsize[bp] == 0 || sr->nruns[bp] != 0 || sr->nmaps[bp] != 0)
        return;
    mt_assert(!sr->reserving[bp]);
    void *base = (void *)sr->vbase[bp];
    size_t size = sr->vsize[bp];
    sr->vbase[bp] = 0;
    sr->vsize[bp] = 0;
    mt__alloc_unlock_raw(a); /* no whole check: destroy calls this on a half-freed state */
    int rc = mt_backend_vm_release(a->backend, base, size);
    mt__alloc_lock(a);
    if (rc != 0)
        mt__alloc_log(a, MT_LOG_WARN, "memtrace: releasing an expandable range failed: %s",
                      mt_strerror(rc));
}

/* Whole pages inside free block b: [*p, *q), empty when *q <= *p. */
static void whole_pages(const mt_alloc_t *a, const mt_block_t *b, uintptr_t *p, uintptr_t *q)
{
    size_t page = mt__exp_page(a);
    *p = round_up(b->addr, page);
    *q = (b->addr + b->size) / page * page;
}

/* Plans the unmapping of the whole pages of free block b, the highest `limit` bytes of them
 * at most (rounded up to a page): b leaves the bins and becomes MT__BLOCK_UNMAPPING.
 * Returns bytes planned (0: none, or no host memory for the entry: the pages stay). */
static size_t plan_unmap(mt_alloc_t *a, mt__unmap_batch_t *q, mt_block_t *b, size_t limit)
{
    uintptr_t p, e;
    whole_pages(a, b, &p, &e);
    if (b->state != MT_BLOCK_INACTIVE || e <= p)
        return 0;
    size_t len = e - p;
    if (limit < len)
        len = round_up(limit, mt__exp_page(a));
    p = e - len;
    mt__unmap_t *nv = mt__grow(q->v, &q->cap, q->n + 1, sizeof *nv, 8);
    if (nv == NULL)
        return 0;
    q->v = nv;
    mt_segment_t *seg2 = calloc(1, sizeof *seg2);
    bool two = p > b->addr && e < b->addr + b->size; /* b keeps parts on both sides */
    mt_block_t *t = seg2 != NULL && two ? mt__block_new(a) : NULL;
    if (seg2 == NULL || (two && t == NULL)) {
        free(seg2);
        return 0;
    }
    mt__seg_bin_out(a, b);
    mt_assert(b->seg->expandable && !b->split_counted && b->npending == 0 &&
              p % mt__exp_page(a) == 0);
    b->state = MT__BLOCK_UNMAPPING;
    q->v[q->n++] = (mt__unmap_t){b, p, len, seg2, t, 0};
    return len;
}

/* A piece of an unmapped block that stays free: merged with neighbours that became free
 * while the lock was released, then binned. */
static void keep_free(mt_alloc_t *a, mt_block_t *b)
{
    b->state = MT_BLOCK_INACTIVE;
    mt__seg_merge_in(a, b);
}

/* Finishes entry u after its unmap (lock held): the run loses the pages and shrinks, splits
 * in two or goes; the parts of the block beside the pages stay free. A failed unmap keeps
 * the pages and frees the block again. Returns bytes unmapped. */
static size_t finish_unmap(mt_alloc_t *a, mt__unmap_t *u)
{
    mt_block_t *b = u->blk;
    mt_assert(b->state == MT__BLOCK_UNMAPPING && u->at >= b->addr &&
              u->at + u->len <= b->addr + b->size);
    if (u->rc != 0) {
        mt__alloc_log(a, MT_LOG_WARN, "memtrace: unmapping expandable pages failed: %s",
                      mt_strerror(u->rc));
        free(u->seg2);
        if (u->t != NULL)
            mt__block_release(a, u->t);
        keep_free(a, b);
        return 0;
    }
    a->st.num_device_free++;
    mt_segment_t *seg = b->seg, *seg2 = u->seg2;
    int bp = seg->pool;
    mt_streamrec_t *sr = mt__alloc_streamrec(a, seg->stream);
    mt_assert(sr != NULL); /* made at the run's first mapping, kept until destroy */
    uintptr_t p = u->at, q = p + u->len, bend = b->addr + b->size, send = seg->addr + seg->size;
    mt_block_t *before = b->prev, *after = b->next, *old_last = seg->last;
    /* Neighbours freed while the lock was released lose b as a neighbour: out of the bins
     * while their links change (their inactive_split count follows the links). */
    bool out_before = before != NULL && before->state == MT_BLOCK_INACTIVE;
    bool out_after = after != NULL && after->state == MT_BLOCK_INACTIVE;
    if (out_before)
        mt__seg_bin_out(a, before);
    if (out_after)
        mt__seg_bin_out(a, after);
    /* The parts of b below and above the pages: b serves the lower one, or the upper one
     * when there is no lower one; u->t the upper one beside a lower one. */
    mt_block_t *head = p > b->addr ? b : NULL;
    mt_block_t *tail = q < bend ? (head != NULL ? u->t : b) : NULL;
    if (head != NULL)
        head->size = p - b->addr;
    if (tail != NULL) {
        tail->addr = q;
        tail->size = bend - q;
        tail->state = MT__BLOCK_UNMAPPING; /* free, binned by keep_free below */
    }
    if (u->t != NULL && tail != u->t)
        mt__block_release(a, u->t);
    /* The lower part of the run ends at head (or before), the upper one starts at tail
     * (or after). */
    mt_block_t *low_last = head != NULL ? head : before;
    mt_block_t *up_first = tail != NULL ? tail : after;
    mt_block_t *up_last = old_last == b ? tail : old_last;
    if (low_last != NULL)
        low_last->next = NULL;
    if (tail != NULL)
        tail->next = after;
    if (after != NULL)
        after->prev = tail;
    if (up_first != NULL)
        up_first->prev = NULL;
    if (head != b && tail != b)
        mt__block_release(a, b);
    mt_segment_t *up_seg = seg;
    if (low_last == NULL && up_first == NULL) {
        /* The pages were the whole run. */
        mt__seg_unlink(a, seg);
        mt__stat_add(a->st.segment, mt__stat_slot(a, bp), -1);
        sr->nruns[bp]--;
        free(seg);
        free(seg2);
        seg = up_seg = NULL;
    } else if (low_last == NULL) {
        seg->addr = q;
        seg->size = send - q;
        seg->first = up_first;
        seg->last = up_last;
        free(seg2);
    } else if (up_first == NULL) {
        seg->size = p - seg->addr;
        seg->last = low_last;
        free(seg2);
    } else {
        *seg2 = *seg;
        seg2->addr = q;
        seg2->size = seg2->vsize = send - q;
        seg2->first = up_first;
        seg2->last = up_last;
        seg->size = seg->vsize = p - seg->addr;
        seg->last = low_last;
        up_seg = seg2;
        mt__seg_link(a, seg2);
        mt__stat_add(a->st.segment, mt__stat_slot(a, bp), 1);
        sr->nruns[bp]++;
    }
    if (seg != NULL)
        seg->vsize = seg->size;
    for (mt_block_t *x = up_first; x != NULL; x = x->next)
        x->seg = up_seg;
    mt__stat_add(a->st.reserved_bytes, mt__stat_slot(a, bp), -(int64_t)u->len);
    mt__alloc_emit(a, MT_EV_SEGMENT_UNMAP, p, u->len, 0, sr->sid, mt__public_pool(bp), 0);
    mt__alloc_emit_device(a);
    if (out_before)
        mt__seg_bin_in(a, before);
    if (out_after)
        mt__seg_bin_in(a, after);
    if (head != NULL)
        keep_free(a, head);
    if (tail != NULL)
        keep_free(a, tail);
    range_drop(a, sr, bp);
    return u->len;
}

size_t mt__exp_unmap_run(mt_alloc_t *a, mt__unmap_batch_t *q)
{
    size_t got = 0;
    if (q->n > 0) {
        q->done = 0;
        q->next = a->unmaps;
        a->unmaps = q;
        mt__alloc_unlock(a);
        /* Work queued on the runs' streams may still touch these pages. The whole device is
         * synchronised (a rare path): a stream itself may be gone by now. */
        (void)mt_device_synchronize(a->backend);
        for (size_t i = 0; i < q->n; i++)
            q->v[i].rc = mt_backend_vm_unmap(a->backend, (void *)q->v[i].at, q->v[i].len);
        mt__alloc_lock(a);
        /* In order, as planned; a range left without runs is released as its last run goes
         * (the lock is dropped for that, the entries still to finish stay in flight). */
        while (q->done < q->n)
            got += finish_unmap(a, &q->v[q->done++]);
        mt__unmap_batch_t **pp = &a->unmaps;
        while (*pp != q) {
            mt_assert(*pp != NULL); /* nobody else unlinks it */
            pp = &(*pp)->next;
        }
        *pp = q->next;
        pthread_cond_broadcast(&a->cv);
    }
    free(q->v);
    *q = (mt__unmap_batch_t){0};
    return got;
}

static bool has_whole_page(const mt_alloc_t *a, const mt_block_t *b)
{
    uintptr_t p, q;
    if (b->state != MT_BLOCK_INACTIVE)
        return false;
    whole_pages(a, b, &p, &q);
    return q > p;
}

bool mt__exp_releasable(const mt_alloc_t *a, const mt_segment_t *seg)
{
    for (const mt_block_t *b = seg->first; b != NULL; b = b->next)
        if (has_whole_page(a, b))
            return true;
    return false;
}

size_t mt__exp_plan_release(mt_alloc_t *a, mt__unmap_batch_t *q, mt_segment_t *seg)
{
    mt_assert(seg->expandable);
    size_t planned = 0;
    for (mt_block_t *b = seg->first; b != NULL; b = b->next)
        if (has_whole_page(a, b))
            planned += plan_unmap(a, q, b, SIZE_MAX);
    return planned;
}

size_t mt__exp_release(mt_alloc_t *a, mt_segment_t *seg)
{
    mt__unmap_batch_t q = {0};
    mt__exp_plan_release(a, &q, seg);
    return mt__exp_unmap_run(a, &q);
}

/* Free blocks with whole pages of every run (a rare path, so a temporary array is fine). */
static mt_block_t **candidates(mt_alloc_t *a, size_t *n)
{
    size_t cap = 16;
    mt_block_t **v = malloc(cap * sizeof *v);
    *n = 0;
    for (mt_segment_t *s = a->segs; v != NULL && s != NULL; s = s->next) {
        if (!s->expandable)
            continue;
        for (mt_block_t *b = s->first; b != NULL; b = b->next) {
            if (!has_whole_page(a, b))
                continue;
            mt_block_t **nv = mt__grow(v, &cap, *n + 1, sizeof *nv, 16);
            if (nv == NULL)
                return v;
            v = nv;
            v[(*n)++] = b;
        }
    }
    return v;
}

static size_t span_pages(const mt_alloc_t *a, const mt_block_t *b)
{
    uintptr_t p, q;
    whole_pages(a, b, &p, &q);
    return q > p ? q - p : 0;
}

static int by_span_desc(const void *x, const void *y, void *arg)
{
    size_t s = span_pages(arg, *(mt_block_t *const *)x),
           t = span_pages(arg, *(mt_block_t *const *)y);
    return s > t ? -1 : s < t;
}

/* release_to_fit: unmaps whole free pages elsewhere, largest spans first (fewest calls),
 * until need bytes went back; the plan's own edge blocks are left alone. Returns bytes
 * planned: when > 0 the lock was released, and the caller plans its mapping again. */
static size_t exp_release_to_fit(mt_alloc_t *a, size_t need, const exp_plan_t *p)
{
    size_t n, planned = 0;
    mt_block_t **v = candidates(a, &n);
    if (v == NULL)
        return 0;
    qsort_r(v, n, sizeof *v, by_span_desc, a);
    mt__unmap_batch_t q = {0};
    for (size_t i = 0; i < n && planned < need; i++) {
        if ((p->left && v[i] == p->left->last) || (p->right && v[i] == p->right->first))
            continue;
        planned += plan_unmap(a, &q, v[i], need - planned);
    }
    free(v);
    mt__exp_unmap_run(a, &q);
    return planned;
}

/* Reserves the (bp) range of sr with the lock released; one thread at a time per range,
 * the others wait for it. */
static int range_reserve(mt_alloc_t *a, mt_streamrec_t *sr, int bp, size_t rsize)
{
    while (sr->reserving[bp])
        mt__alloc_wait(a);
    if (sr->vsize[bp] != 0)
        return 0;
    /* Twice the device: the range costs address space only, and runs that move to
     * where requests need them leave unmapped gaps behind. Every (stream, pool) has its
     * own, so with many streams the device's address space can run short: then once the
     * device, then the request alone (place_high's halves shrink with the range). */
    size_t page = mt__exp_page(a);
    size_t cap = a->capacity > rsize ? a->capacity : rsize;
    size_t want[3] = {round_up(cap > SIZE_MAX / 4 ? cap : 2 * cap, page), round_up(cap, page),
                      round_up(rsize, page)};
    size_t vsize = 0;
    void *base = NULL;
    sr->reserving[bp] = true;
    mt__alloc_unlock(a);
    int rc = MT_ENOMEM;
    for (int i = 0; i < 3 && rc == MT_ENOMEM; i++) {
        if (i > 0 && want[i] >= want[i - 1])
            continue;
        vsize = want[i];
        rc = mt_backend_vm_reserve(a->backend, vsize, &base);
    }
    mt__alloc_lock(a);
    mt_assert(sr->reserving[bp] && sr->vsize[bp] == 0);
    sr->reserving[bp] = false;
    pthread_cond_broadcast(&a->cv);
    if (rc == MT_ENOMEM) {
        /* No address space left even for the request: a plain segment takes it. */
        if (!a->va_short_logged) {
            a->va_short_logged = true;
            mt__alloc_log(a, MT_LOG_WARN,
                          "memtrace: the device's address space is short (%zu bytes could not "
                          "be reserved for stream %u's expandable range): requests that need "
                          "one get plain segments meanwhile",
                          want[2], sr->sid);
        }
        return MT__ENORANGE;
    }
    if (rc != 0)
        return rc;
    if (vsize != want[0] && !a->va_short_logged) {
        a->va_short_logged = true;
        mt__alloc_log(a, MT_LOG_WARN,
                      "memtrace: the device's address space is short: stream %u's expandable "
                      "range is %zu bytes instead of %zu",
                      sr->sid, vsize, want[0]);
    }
    mt_assert((uintptr_t)base % page == 0);
    sr->vbase[bp] = (uintptr_t)base;
    sr->vsize[bp] = vsize;
    return 0;
}

/* The loop of mt__exp_grow, sr->users[bp] counting this thread. Each pass that released
 * the lock plans again; a request that fails only because of other threads' work in
 * flight waits for that work and tries again. */
static int exp_grow(mt_alloc_t *a, mt_streamrec_t *sr, int bp, size_t rsize, mt_block_t **out)
{
    bool fitted = false; /* release_to_fit ran (once per request, as planned) */
    for (;;) {
        int rc = range_reserve(a, sr, bp, rsize);
        if (rc != 0)
            return rc;
        exp_plan_t p;
        if (!exp_plan(a, sr, bp, rsize, &p)) {
            if (!mt__alloc_inflight(a))
                return MT_ENOMEM;
            mt__alloc_wait(a);
            continue;
        }
        size_t over = mt__seg_over_peak(a, p.len + a->inflight_map_bytes);
        if (a->cfg.release_to_fit && over > 0 && !fitted) {
            fitted = true;
            if (exp_release_to_fit(a, over, &p) > 0)
                continue;
        }
        if (!mt__seg_within_limit(a, p.len + a->inflight_map_bytes)) {
            if (a->inflight_map_bytes == 0 && a->unmaps == NULL)
                return MT_ENOMEM;
            mt__alloc_wait(a);
            continue;
        }
        rc = exp_map(a, sr, bp, &p, rsize, out);
        if (rc != MT_EAGAIN)
            return rc;
    }
}

int mt__exp_grow(mt_alloc_t *a, mt_streamrec_t *sr, int bp, size_t rsize, mt_block_t **out)
{
    size_t page = mt__exp_page(a);
    if (a->vm_gran == 0 || page % a->vm_gran != 0)
        return MT_ENOTSUP; /* pages must be whole VM granules; use plain segments */
    if (mt__alloc_binset(a, sr, bp) == NULL)
        return MT_ENOMEM;
    sr->users[bp]++;
    int rc = exp_grow(a, sr, bp, rsize, out);
    mt_assert(sr->users[bp] > 0);
    sr->users[bp]--;
    if (rc != 0)
        range_drop(a, sr, bp);
    return rc;
}

void mt__exp_fork_child(mt_alloc_t *a)
{
    for (size_t i = 0; i < a->nstreams; i++)
        for (int bp = 0; bp < 2; bp++) {
            a->streams[i]->users[bp] = 0;
            range_drop(a, a->streams[i], bp); /* a range its users had not mapped yet */
        }
}

void mt__exp_destroy(mt_alloc_t *a)
{
    for (size_t i = 0; i < a->nstreams; i++)
        for (int bp = 0; bp < 2; bp++) {
            mt_streamrec_t *sr = a->streams[i];
            mt_assert(sr->users[bp] == 0 && sr->nmaps[bp] == 0);
            sr->nruns[bp] = 0;
            range_drop(a, sr, bp);
        }
}
