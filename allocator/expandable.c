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

/* The placement of an rsize block: in its zone (place_high), then the one that maps the
 * fewest pages, then the smallest gap (so large gaps stay whole), then one that joins two
 * runs. A high request may also start at the top of the last gap. False when the range is
 * full. */
static bool exp_plan(const mt_alloc_t *a, const mt_streamrec_t *sr, int bp, size_t rsize,
                     exp_plan_t *best)
{
    size_t page = mt__exp_page(a);
    const mt_binset_t *bins = sr->bins[bp];
    uintptr_t lo = sr->vbase[bp], end = lo + sr->vsize[bp];
    exp_zone_t z = {.mid = lo + sr->vsize[bp] / 2,
                    .zoned = a->cfg.place_high > 0,
                    .high = a->cfg.place_high > 0 && rsize >= a->cfg.place_high};
    mt_segment_t *left = NULL;
    *best = (exp_plan_t){0};
    for (mt_segment_t *s = a->segs;; s = s->next) {
        while (s != NULL && !is_run_of(s, bins))
            s = s->next;
        uintptr_t gap_end = s != NULL ? s->addr : end;
        size_t gap = gap_end - lo, lf = free_tail(left), rf = free_head(s);
        if (gap > 0) {
            size_t len = rsize > lf ? round_up(rsize - lf, page) : page;
            exp_plan_t c = {lo, len, gap, left, len == gap ? s : NULL};
            consider(best, &c, &z);
            if (s == NULL && z.high) {
                len = round_up(rsize, page);
                c = (exp_plan_t){gap_end - len, len, gap, len == gap ? left : NULL, NULL};
                consider(best, &c, &z);
            }
            if (s != NULL) {
                len = rsize > rf ? round_up(rsize - rf, page) : page;
                c = (exp_plan_t){gap_end - len, len, gap, len == gap ? left : NULL, s};
                consider(best, &c, &z);
                if (lf + gap + rf >= rsize) {
                    c = (exp_plan_t){lo, gap, gap, left, s};
                    consider(best, &c, &z);
                }
            }
        }
        if (s == NULL)
            break;
        left = s;
        lo = s->addr + s->size;
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
    mt__stat_add(a->st.segment, right->pool, -1);
    sr->nruns[right->pool]--;
    free(right);
}

static int exp_apply(mt_alloc_t *a, mt_streamrec_t *sr, int bp, const exp_plan_t *p, size_t rsize,
                     mt_block_t **out)
{
    if (!mt__seg_within_limit(a, p->len))
        return MT_ENOMEM;
    /* Metadata first, so that nothing can fail once the pages are mapped. */
    mt_block_t *nb = mt__block_new(a);
    mt_segment_t *seg = p->left != NULL ? p->left : p->right, *fresh = NULL;
    if (nb == NULL)
        return MT_ENOMEM;
    if (seg == NULL && (fresh = calloc(1, sizeof *fresh)) == NULL) {
        mt__block_release(a, nb);
        return MT_ENOMEM;
    }
    int rc = mt_backend_vm_map(a->backend, (void *)p->at, p->len);
    if (rc != 0) {
        free(fresh);
        mt__block_release(a, nb);
        return rc;
    }
    /* The free edges the new pages join leave the bins before their neighbours change. */
    mt_block_t *lo = p->left != NULL && free_tail(p->left) ? p->left->last : NULL;
    mt_block_t *hi = p->right != NULL && free_head(p->right) ? p->right->first : NULL;
    if (lo != NULL)
        mt__seg_bin_out(a, lo);
    if (hi != NULL)
        mt__seg_bin_out(a, hi);
    nb->addr = p->at;
    nb->size = p->len;
    nb->state = MT_BLOCK_INACTIVE;
    if (fresh != NULL) {
        *fresh = (mt_segment_t){.addr = p->at,
                                .size = p->len,
                                .vsize = p->len,
                                .first = nb,
                                .last = nb,
                                .bins = sr->bins[bp],
                                .stream = sr->stream,
                                .sid = sr->sid,
                                .pool = (uint8_t)bp,
                                .expandable = true};
        mt__seg_link(a, fresh);
        mt__stat_add(a->st.segment, bp, 1);
        sr->nruns[bp]++;
        seg = fresh;
    } else if (p->left != NULL) {
        nb->prev = seg->last;
        seg->last->next = nb;
        seg->last = nb;
        seg->size += p->len;
    } else {
        nb->next = seg->first;
        seg->first->prev = nb;
        seg->first = nb;
        seg->addr = p->at;
        seg->size += p->len;
    }
    nb->seg = seg;
    seg->vsize = seg->size;
    if (p->left != NULL && p->right != NULL)
        exp_join(a, sr, p->left, p->right);
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
    mt__stat_add(a->st.reserved_bytes, bp, (int64_t)p->len);
    a->st.num_device_alloc++;
    mt__alloc_emit(a, MT_EV_SEGMENT_MAP, p->at, p->len, rsize, sr->sid, mt__public_pool(bp), 0);
    mt__seg_bin_in(a, nb);
    mt_assert(nb->size >= rsize);
    *out = nb;
    return 0;
}

/* ---- unmapping ---- */

static void range_release(mt_alloc_t *a, mt_streamrec_t *sr, int bp)
{
    int rc = mt_backend_vm_release(a->backend, (void *)sr->vbase[bp], sr->vsize[bp]);
    if (rc != 0)
        mt__alloc_log(a, MT_LOG_WARN, "memtrace: releasing an expandable range failed: %s",
                      mt_strerror(rc));
    sr->vbase[bp] = 0;
    sr->vsize[bp] = 0;
}

/* Whole pages inside free block b: [*p, *q), empty when *q <= *p. */
static void whole_pages(const mt_alloc_t *a, const mt_block_t *b, uintptr_t *p, uintptr_t *q)
{
    size_t page = mt__exp_page(a);
    *p = round_up(b->addr, page);
    *q = (b->addr + b->size) / page * page;
}

static void drop_block(mt_alloc_t *a, mt_segment_t *seg, mt_block_t *b)
{
    if (b->prev != NULL)
        b->prev->next = b->next;
    else
        seg->first = b->next;
    if (b->next != NULL)
        b->next->prev = b->prev;
    else
        seg->last = b->prev;
    mt__block_release(a, b);
}

/* Unmaps the whole pages of free block b, the highest `limit` bytes of them at most (rounded
 * up to a page). The run shrinks, splits in two or goes. The device was synchronised by the
 * caller. Returns bytes unmapped. */
static size_t exp_unmap_block(mt_alloc_t *a, mt_block_t *b, size_t limit)
{
    uintptr_t p, q;
    whole_pages(a, b, &p, &q);
    if (q <= p)
        return 0;
    size_t len = q - p;
    if (limit < len)
        len = round_up(limit, mt__exp_page(a));
    p = q - len;
    mt_segment_t *seg = b->seg, *seg2 = NULL;
    mt_streamrec_t *sr = mt__alloc_streamrec(a, seg->stream);
    uintptr_t bend = b->addr + b->size, send = seg->addr + seg->size;
    bool interior = p > seg->addr && q < send;
    mt_block_t *t = NULL;
    if (sr == NULL || (interior && ((seg2 = calloc(1, sizeof *seg2)) == NULL ||
                                    (q < bend && (t = mt__block_new(a)) == NULL)))) {
        free(seg2);
        return 0; /* no host memory for the pieces: keep the pages */
    }
    int rc = mt_backend_vm_unmap(a->backend, (void *)p, len);
    if (rc != 0) {
        mt__alloc_log(a, MT_LOG_WARN, "memtrace: unmapping expandable pages failed: %s",
                      mt_strerror(rc));
        free(seg2);
        if (t != NULL)
            mt__block_release(a, t);
        return 0;
    }
    a->st.num_device_free++;
    int bp = seg->pool;
    mt__seg_bin_out(a, b);
    mt_block_t *keep = NULL; /* pieces of b that stay free, binned again at the end */
    if (!interior && p == seg->addr && q == send) {
        drop_block(a, seg, b);
        mt__seg_unlink(a, seg);
        mt__stat_add(a->st.segment, bp, -1);
        sr->nruns[bp]--;
        free(seg);
        seg = NULL;
    } else if (!interior && p == seg->addr) {
        seg->addr = q;
        seg->size = send - q;
        if (q == bend) {
            drop_block(a, seg, b);
        } else {
            b->addr = q;
            b->size = bend - q;
            keep = b;
        }
    } else if (!interior) {
        seg->size = p - seg->addr;
        if (p == b->addr) {
            drop_block(a, seg, b);
        } else {
            b->size = p - b->addr;
            keep = b;
        }
    } else {
        mt_block_t *after = b->next, *old_last = seg->last;
        *seg2 = *seg;
        seg2->addr = q;
        seg2->size = seg2->vsize = send - q;
        if (t != NULL) {
            t->addr = q;
            t->size = bend - q;
            t->state = MT_BLOCK_INACTIVE;
            t->next = after;
            if (after != NULL)
                after->prev = t;
        } else {
            after->prev = NULL; /* q = bend < send: b has a successor */
        }
        seg2->first = t != NULL ? t : after;
        seg2->last = after != NULL ? old_last : t;
        b->next = NULL;
        seg->last = b;
        seg->size = p - seg->addr;
        if (p == b->addr)
            drop_block(a, seg, b);
        else {
            b->size = p - b->addr;
            keep = b;
        }
        for (mt_block_t *x = seg2->first; x != NULL; x = x->next)
            x->seg = seg2;
        seg->vsize = seg->size;
        mt__seg_link(a, seg2);
        mt__stat_add(a->st.segment, bp, 1);
        sr->nruns[bp]++;
    }
    if (seg != NULL)
        seg->vsize = seg->size;
    mt__stat_add(a->st.reserved_bytes, bp, -(int64_t)len);
    mt__alloc_emit(a, MT_EV_SEGMENT_UNMAP, p, len, 0, sr->sid, mt__public_pool(bp), 0);
    if (keep != NULL)
        mt__seg_bin_in(a, keep);
    if (t != NULL)
        mt__seg_bin_in(a, t);
    if (sr->nruns[bp] == 0)
        range_release(a, sr, bp);
    return len;
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

/* Free blocks with whole pages: of seg, or of every run when seg is NULL (a rare path, so a
 * temporary array is fine). */
static mt_block_t **candidates(mt_alloc_t *a, const mt_segment_t *seg, size_t *n)
{
    size_t cap = 16;
    mt_block_t **v = malloc(cap * sizeof *v);
    *n = 0;
    for (mt_segment_t *s = seg ? (mt_segment_t *)seg : a->segs; v != NULL && s != NULL;
         s = seg ? NULL : s->next) {
        if (!s->expandable)
            continue;
        for (mt_block_t *b = s->first; b != NULL; b = b->next) {
            if (!has_whole_page(a, b))
                continue;
            if (*n == cap) {
                mt_block_t **nv = realloc(v, 2 * cap * sizeof *nv);
                if (nv == NULL)
                    return v;
                v = nv;
                cap *= 2;
            }
            v[(*n)++] = b;
        }
    }
    return v;
}

size_t mt__exp_release(mt_alloc_t *a, mt_segment_t *seg)
{
    size_t n, got = 0;
    mt_block_t **v = candidates(a, seg, &n);
    if (v != NULL && n > 0) {
        /* Work queued on the run's stream may still touch these pages. The whole device is
         * synchronised (a rare path): the stream itself may be gone by now. */
        (void)mt_device_synchronize(a->backend);
        for (size_t i = 0; i < n; i++)
            got += exp_unmap_block(a, v[i], SIZE_MAX);
    }
    free(v);
    return got;
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
 * until need bytes went back; the plan's own edge blocks are left alone. */
static size_t exp_release_to_fit(mt_alloc_t *a, size_t need, const exp_plan_t *p)
{
    size_t n, got = 0;
    mt_block_t **v = candidates(a, NULL, &n);
    if (v == NULL)
        return 0;
    qsort_r(v, n, sizeof *v, by_span_desc, a);
    bool synced = false;
    for (size_t i = 0; i < n && got < need; i++) {
        if ((p->left && v[i] == p->left->last) || (p->right && v[i] == p->right->first))
            continue;
        if (!synced)
            (void)mt_device_synchronize(a->backend);
        synced = true;
        got += exp_unmap_block(a, v[i], need - got);
    }
    free(v);
    return got;
}

int mt__exp_grow(mt_alloc_t *a, mt_streamrec_t *sr, int bp, size_t rsize, mt_block_t **out)
{
    size_t page = mt__exp_page(a);
    if (a->vm_gran == 0 || page % a->vm_gran != 0)
        return MT_ENOTSUP; /* pages must be whole VM granules; use plain segments */
    if (mt__alloc_binset(a, sr, bp) == NULL)
        return MT_ENOMEM;
    if (sr->vsize[bp] == 0) {
        /* Twice the device: the range costs address space only, and runs that move to
         * where requests need them leave unmapped gaps behind. */
        size_t cap = a->capacity > rsize ? a->capacity : rsize;
        size_t vsize = round_up(cap > SIZE_MAX / 4 ? cap : 2 * cap, page);
        void *base = NULL;
        int rc = mt_backend_vm_reserve(a->backend, vsize, &base);
        if (rc != 0)
            return rc;
        mt_assert((uintptr_t)base % page == 0);
        sr->vbase[bp] = (uintptr_t)base;
        sr->vsize[bp] = vsize;
    }
    exp_plan_t p;
    if (!exp_plan(a, sr, bp, rsize, &p))
        return MT_ENOMEM;
    size_t over = mt__seg_over_peak(a, p.len);
    if (a->cfg.release_to_fit && over > 0 && exp_release_to_fit(a, over, &p) > 0 &&
        (sr->vsize[bp] == 0 || !exp_plan(a, sr, bp, rsize, &p)))
        return sr->vsize[bp] == 0 ? mt__exp_grow(a, sr, bp, rsize, out) : MT_ENOMEM;
    int rc = exp_apply(a, sr, bp, &p, rsize, out);
    if (rc != 0 && sr->nruns[bp] == 0)
        range_release(a, sr, bp);
    return rc;
}

void mt__exp_destroy(mt_alloc_t *a)
{
    for (size_t i = 0; i < a->nstreams; i++)
        for (int bp = 0; bp < 2; bp++)
            if (a->streams[i]->vsize[bp] != 0) {
                a->streams[i]->nruns[bp] = 0;
                range_release(a, a->streams[i], bp);
            }
}
