/* Warm-up reservations: cached segments of the reserved pool of a stream, which serve
 * requests of any size on that stream before the pools are searched. A later run whose
 * live transient bytes fit in them therefore never calls the backend's malloc.
 *
 * mt_alloc_reserve(bytes) reserves one new segment of the user's size. A measured
 * warm-up (warmup_begin/end) plans the reservation instead of sizing it by the peak
 * alone: the free room left in the stream's large segments that hold long-lived blocks
 * (weights, optimizer state: typically most of a 20 MiB segment) counts towards it, and
 * only what the warm-up's transient requests cannot fit there is reserved as a new
 * segment. "Fit" is decided by replaying the recorded request sequence (sizes and order)
 * with best fit over that free room plus a candidate new segment, growing the candidate
 * until the replay fits. The segments whose room the plan uses become reserved (they keep
 * serving any size on the stream and are never released while the reservation stands),
 * so a run that repeats the warm-up's pattern finds the same room. Requests on every
 * stream are recorded and replayed on the reservation's stream (conservative, like the
 * measured peak). A replay costs O(requests x free extents); the search makes
 * O(log(size / 2 MiB)) of them, once per warm-up. */
#include <stdlib.h>
#include <string.h>

#include "allocator/internal.h"

/* Slack added to a measured warm-up peak: the peak is measured in rounded block sizes,
 * so rounding is already in it; the slack covers fragmentation inside the reservation
 * when a later run allocates the same shapes at other lengths or in another order. One
 * thirty-second of the peak (then rounded up to 2 MiB) keeps utilization at peak above
 * 0.95; the RNN-like test pattern needs none beyond the 2 MiB rounding. */
#define WARMUP_SLACK_DIV 32
#define RESERVE_ROUND    ((size_t)2 << 20)

static int reserve_locked(mt_alloc_t *a, size_t bytes, mt_stream_t *stream)
{
    mt__alloc_assert_owner(a);
    size_t size = (bytes + RESERVE_ROUND - 1) / RESERVE_ROUND * RESERVE_ROUND;
    mt_streamrec_t *sr = mt__alloc_streamrec(a, stream);
    if (sr == NULL)
        return MT_ENOMEM;
    /* Already reserved enough as one unused segment? Smaller unused reservations of this
     * stream are replaced by the new one (mt__seg_release leaves segments holding blocks,
     * such as a warm-up's reserved weight segment, alone). */
    mt_segment_t *next;
    for (mt_segment_t *s = a->segs; s != NULL; s = next) {
        next = s->next;
        if (!s->reserved || s->stream != stream)
            continue;
        if (s->size >= size && mt__seg_is_whole_free(s)) {
            mt__alloc_emit(a, MT_EV_RESERVE, s->addr, s->size, bytes, mt_stream_id(stream),
                           mt__public_pool(s->pool), 0);
            return 0;
        }
        mt__seg_release(a, s);
    }
    mt_segment_t *seg = NULL;
    int rc = mt__seg_new(a, sr, MT__BP_RESERVED, size, &seg);
    if (rc != 0 && a->cfg.release_on_oom) {
        if (a->npending > 0)
            mt__alloc_sync_pending(a);
        mt__seg_release_all(a, false, NULL, false);
        a->st.num_alloc_retries++;
        rc = mt__seg_new(a, sr, MT__BP_RESERVED, size, &seg);
    }
    if (rc != 0) {
        a->st.num_ooms++;
        size_t free_b = 0, total_b = 0;
        (void)mt_backend_mem_get_info(a->backend, &free_b, &total_b);
        mt__alloc_emit(a, MT_EV_OOM, 0, free_b, bytes, mt_stream_id(stream), MT_POOL_LARGE, 0);
        mt__alloc_oom_report(a, bytes, size, "warm-up reservation");
        return MT_ENOMEM;
    }
    mt__alloc_emit(a, MT_EV_RESERVE, seg->addr, seg->size, bytes, mt_stream_id(stream),
                   MT_POOL_LARGE, 0);
    return 0;
}

int mt_alloc_reserve(mt_alloc_t *a, size_t bytes, mt_stream_t *stream)
{
    if (a == NULL)
        return MT_EINVAL;
    if (bytes == 0)
        return 0;
    if (bytes > ((size_t)1 << 60))
        return MT_ENOMEM;
    mt__alloc_lock(a);
    if (a->npending > 0)
        mt__alloc_process_events(a);
    mt__quick_flush_all(a); /* the plan sees merged free space */
    int rc = reserve_locked(a, bytes, stream);
    mt__alloc_unlock(a);
    return rc;
}

int mt_alloc_warmup_begin(mt_alloc_t *a)
{
    if (a == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    mt__quick_flush_all(a); /* nothing is kept quick while warming */
    a->warming = true;
    a->gen++;
    a->warm_peak = a->st.allocated_bytes[MT_STAT_ALL].current;
    a->nwops = 0;
    a->wops_failed = false;
    mt__alloc_unlock(a);
    return 0;
}

/* ---- recording ---- */

static void wop_push(mt_alloc_t *a, size_t rsize, uint32_t of)
{
    if (a->wops_failed)
        return;
    if (a->nwops == a->cap_wops) {
        size_t cap = a->cap_wops ? a->cap_wops * 2 : 256;
        mt__warm_op_t *n = cap <= UINT32_MAX ? realloc(a->wops, cap * sizeof *n) : NULL;
        if (n == NULL) {
            a->wops_failed = true;
            return;
        }
        a->wops = n;
        a->cap_wops = cap;
    }
    a->wops[a->nwops++] = (mt__warm_op_t){rsize, of};
}

void mt__warm_record_alloc(mt_alloc_t *a, mt_block_t *b, size_t rsize)
{
    mt__alloc_assert_owner(a);
    mt_assert(a->warming && b->state == MT_BLOCK_ACTIVE_ALLOCATED);
    b->wid = (uint32_t)a->nwops;
    wop_push(a, rsize, 0);
}

void mt__warm_record_free(mt_alloc_t *a, const mt_block_t *b)
{
    mt__alloc_assert_owner(a);
    mt_assert(a->warming && (a->wops_failed || b->wid < a->nwops));
    wop_push(a, 0, b->wid);
}

/* ---- planning: best-fit replay of the warm-up over free extents ----
 * A model of the reserved pool: free extents (segment index, address, size) kept sorted
 * by (segment, address); an allocation takes the smallest extent that fits (the lowest
 * on ties) from its front, whole when the remainder would be under the minimum block
 * (the reserved pool's split rule); a free coalesces with same-segment neighbours. The
 * real bins are a segregated best fit, so the model is close to, not identical with,
 * the allocator; the plan's slack covers the difference. */

typedef struct ext_s {
    uint32_t seg;
    uintptr_t addr;
    size_t size;
} ext_t;

typedef struct plan_s {
    ext_t *ext; /* free extents, sorted by (seg, addr) */
    size_t next, cap;
    ext_t *placed;  /* per op: where its allocation went (allocations only) */
    bool *freed;    /* per op: the allocation is freed later in the warm-up */
    bool *seg_used; /* per candidate segment: the replay placed a block in it */
    size_t peak;    /* transient peak of the replay, bytes */
} plan_t;

static int ext_cmp(const ext_t *x, uint32_t seg, uintptr_t addr)
{
    if (x->seg != seg)
        return x->seg < seg ? -1 : 1;
    return x->addr < addr ? -1 : x->addr > addr ? 1 : 0;
}

static int ext_insert(plan_t *p, ext_t e)
{
    size_t lo = 0, hi = p->next;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ext_cmp(&p->ext[mid], e.seg, e.addr) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    ext_t *prev = lo > 0 ? &p->ext[lo - 1] : NULL;
    ext_t *next = lo < p->next ? &p->ext[lo] : NULL;
    bool with_prev = prev && prev->seg == e.seg && prev->addr + prev->size == e.addr;
    bool with_next = next && next->seg == e.seg && e.addr + e.size == next->addr;
    if (with_prev && with_next) {
        prev->size += e.size + next->size;
        memmove(next, next + 1, (p->next - lo - 1) * sizeof *next);
        p->next--;
    } else if (with_prev) {
        prev->size += e.size;
    } else if (with_next) {
        next->addr = e.addr;
        next->size += e.size;
    } else {
        if (p->next == p->cap) {
            size_t cap = p->cap ? p->cap * 2 : 64;
            ext_t *n = realloc(p->ext, cap * sizeof *n);
            if (n == NULL)
                return MT_ENOMEM;
            p->ext = n;
            p->cap = cap;
        }
        memmove(&p->ext[lo + 1], &p->ext[lo], (p->next - lo) * sizeof e);
        p->ext[lo] = e;
        p->next++;
    }
    return 0;
}

/* Free extents of the candidate segments (in candidate order) and, when extra > 0, one
 * fresh segment of extra bytes as candidate ncand. */
static int plan_reset(plan_t *p, mt_segment_t *const *cand, size_t ncand, size_t extra)
{
    p->next = 0;
    for (size_t i = 0; i < ncand; i++)
        for (const mt_block_t *b = cand[i]->first; b != NULL; b = b->next)
            if (b->state == MT_BLOCK_INACTIVE &&
                ext_insert(p, (ext_t){(uint32_t)i, b->addr, b->size}) != 0)
                return MT_ENOMEM;
    if (extra > 0 && ext_insert(p, (ext_t){(uint32_t)ncand, 0, extra}) != 0)
        return MT_ENOMEM;
    return 0;
}

/* Replays the transient requests (allocations freed within the warm-up) over the extents;
 * 0 if every one fits, MT_ENOMEM if one does not (or host memory ran out). */
static int plan_replay(plan_t *p, const mt_alloc_t *a, size_t ncand)
{
    memset(p->seg_used, 0, (ncand + 1) * sizeof *p->seg_used);
    size_t live = 0;
    p->peak = 0;
    for (size_t i = 0; i < a->nwops; i++) {
        const mt__warm_op_t *op = &a->wops[i];
        if (op->rsize == 0) {
            ext_t e = p->placed[op->of];
            live -= e.size;
            if (ext_insert(p, e) != 0)
                return MT_ENOMEM;
            continue;
        }
        if (!p->freed[i])
            continue; /* kept past the warm-up: already has its memory */
        size_t best = SIZE_MAX;
        for (size_t k = 0; k < p->next; k++)
            if (p->ext[k].size >= op->rsize &&
                (best == SIZE_MAX || p->ext[k].size < p->ext[best].size))
                best = k;
        if (best == SIZE_MAX)
            return MT_ENOMEM;
        ext_t *e = &p->ext[best];
        ext_t got = *e;
        if (e->size - op->rsize >= MT__MIN_BLOCK) {
            got.size = op->rsize;
            e->addr += op->rsize;
            e->size -= op->rsize;
        } else {
            memmove(e, e + 1, (p->next - best - 1) * sizeof *e);
            p->next--;
        }
        p->placed[i] = got;
        p->seg_used[got.seg] = true;
        live += got.size;
        if (live > p->peak)
            p->peak = live;
    }
    return 0;
}

static int plan_fits(plan_t *p, const mt_alloc_t *a, mt_segment_t *const *cand, size_t ncand,
                     size_t extra)
{
    int rc = plan_reset(p, cand, ncand, extra);
    return rc != 0 ? rc : plan_replay(p, a, ncand);
}

static size_t round_reserve(size_t n)
{
    return (n + RESERVE_ROUND - 1) / RESERVE_ROUND * RESERVE_ROUND;
}

/* The smallest new segment (a multiple of 2 MiB, possibly 0) with which the replay fits
 * and the room (free room of the candidates + new segment) is at least the transient
 * peak plus its slack. Fit is close to monotonic in the size, not exactly: the search
 * doubles to a fitting size, bisects below it, and keeps only sizes that were replayed.
 * On success p describes the replay with the returned size. */
static int plan_search(plan_t *p, const mt_alloc_t *a, mt_segment_t *const *cand, size_t ncand,
                       size_t *extra)
{
    size_t room = 0;
    for (size_t i = 0; i < ncand; i++)
        for (const mt_block_t *b = cand[i]->first; b != NULL; b = b->next)
            if (b->state == MT_BLOCK_INACTIVE)
                room += b->size;
    /* The transient peak, measured on room enough for every request. */
    size_t sum = 0;
    for (size_t i = 0; i < a->nwops; i++)
        if (a->wops[i].rsize > 0 && p->freed[i])
            sum += a->wops[i].rsize;
    int rc = plan_fits(p, a, cand, ncand, sum);
    if (rc != 0)
        return rc;
    size_t need = p->peak + p->peak / WARMUP_SLACK_DIV;
    size_t lo = need > room ? round_reserve(need - room) : 0;
    if (plan_fits(p, a, cand, ncand, lo) == 0) {
        *extra = lo;
        return 0;
    }
    size_t hi = lo > 0 ? lo : RESERVE_ROUND;
    for (;;) {
        if (hi > a->limit)
            return MT_ENOMEM;
        if (plan_fits(p, a, cand, ncand, hi) == 0)
            break;
        lo = hi;
        hi *= 2;
    }
    /* Invariant: lo does not fit, hi fits. */
    while (hi - lo > RESERVE_ROUND) {
        size_t mid = round_reserve(lo + (hi - lo) / 2);
        if (mid >= hi)
            break;
        if (plan_fits(p, a, cand, ncand, mid) == 0)
            hi = mid;
        else
            lo = mid;
    }
    *extra = hi;
    return plan_fits(p, a, cand, ncand, hi);
}

/* Moves an existing segment's free room into the reserved pool of its stream. Only
 * large-pool segments qualify: the reserved pool reports as large, so every statistic
 * stays the same. */
static int seg_make_reserved(mt_alloc_t *a, mt_streamrec_t *sr, mt_segment_t *seg)
{
    mt_assert(seg->pool == MT__BP_LARGE && !seg->expandable && seg->stream == sr->stream);
    mt_binset_t *rb = mt__alloc_binset(a, sr, MT__BP_RESERVED);
    if (rb == NULL)
        return MT_ENOMEM;
    for (mt_block_t *b = seg->first; b != NULL; b = b->next)
        if (b->state == MT_BLOCK_INACTIVE)
            mt__seg_bin_out(a, b);
    seg->pool = MT__BP_RESERVED;
    seg->reserved = true;
    seg->bins = rb;
    for (mt_block_t *b = seg->first; b != NULL; b = b->next)
        if (b->state == MT_BLOCK_INACTIVE)
            mt__seg_bin_in(a, b);
    return 0;
}

/* Plans and makes the reservation of a recorded warm-up on stream (see the top of the
 * file). Candidates: the stream's reserved segments and its plain large segments still
 * holding blocks after the cache was emptied. */
static int warmup_plan(mt_alloc_t *a, mt_stream_t *stream)
{
    mt_streamrec_t *sr = mt__alloc_streamrec(a, stream);
    if (sr == NULL)
        return MT_ENOMEM;
    plan_t p = {0};
    mt_segment_t **cand = malloc((a->nsegs + 1) * sizeof *cand);
    p.placed = malloc((a->nwops + 1) * sizeof *p.placed);
    p.freed = calloc(a->nwops + 1, sizeof *p.freed);
    p.seg_used = calloc(a->nsegs + 2, sizeof *p.seg_used);
    int rc = MT_ENOMEM;
    if (cand == NULL || p.placed == NULL || p.freed == NULL || p.seg_used == NULL)
        goto out;
    for (size_t i = 0; i < a->nwops; i++)
        if (a->wops[i].rsize == 0)
            p.freed[a->wops[i].of] = true;
    size_t ncand = 0;
    for (mt_segment_t *s = a->segs; s != NULL; s = s->next)
        if (s->stream == stream && !s->expandable &&
            (s->pool == MT__BP_RESERVED || s->pool == MT__BP_LARGE))
            cand[ncand++] = s;
    size_t extra = 0;
    if ((rc = plan_search(&p, a, cand, ncand, &extra)) != 0)
        goto out;
    /* The plan supersedes reservations it does not use; large segments whose room it
     * uses join the reserved pool. */
    for (size_t i = 0; i < ncand; i++) {
        mt_segment_t *s = cand[i];
        if (!p.seg_used[i]) {
            if (s->reserved)
                mt__seg_release(a, s);
            continue;
        }
        if (!s->reserved && (rc = seg_make_reserved(a, sr, s)) != 0)
            goto out;
        mt__alloc_emit(a, MT_EV_RESERVE, s->addr, s->size, 0, sr->sid, MT_POOL_LARGE, 0);
    }
    if (extra > 0) {
        mt_segment_t *seg = NULL;
        if ((rc = mt__seg_new(a, sr, MT__BP_RESERVED, extra, &seg)) != 0) {
            a->st.num_ooms++;
            mt__alloc_oom_report(a, extra, extra, "warm-up reservation");
            goto out;
        }
        mt__alloc_emit(a, MT_EV_RESERVE, seg->addr, seg->size, extra, sr->sid, MT_POOL_LARGE, 0);
    }
out:
    free(cand);
    free(p.placed);
    free(p.freed);
    free(p.seg_used);
    free(p.ext);
    return rc;
}

/* Bytes of blocks allocated before warmup_begin and still allocated: they were live for
 * the whole warm-up, so they are part of its peak but need no room in the reservation. */
static size_t persistent_bytes(const mt_alloc_t *a)
{
    size_t n = 0;
    for (const mt_segment_t *s = a->segs; s != NULL; s = s->next)
        for (const mt_block_t *b = s->first; b != NULL; b = b->next)
            if (b->state == MT_BLOCK_ACTIVE_ALLOCATED && b->gen < a->gen)
                n += b->size;
    return n;
}

int mt_alloc_warmup_end(mt_alloc_t *a, mt_stream_t *stream)
{
    if (a == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    int rc = 0;
    if (!a->warming) {
        rc = MT_EINVAL;
        goto out;
    }
    a->warming = false;
    if (a->npending > 0)
        mt__alloc_sync_pending(a);
    size_t released = mt__seg_release_all(a, false, NULL, false);
    mt__alloc_emit(a, MT_EV_EMPTY_CACHE, 0, released, 0, 0, MT_POOL_NONE, 0);
    if (!a->wops_failed && a->nwops > 0) {
        rc = warmup_plan(a, stream);
        if (rc != MT_ENOMEM)
            goto out;
        /* No host memory to plan, or no room found below the limit: the whole peak. */
    }
    size_t persist = persistent_bytes(a);
    size_t peak = (size_t)a->warm_peak;
    size_t transient = peak > persist ? peak - persist : 0;
    rc = transient > 0 ? reserve_locked(a, transient + transient / WARMUP_SLACK_DIV, stream) : 0;
out:
    a->nwops = 0;
    mt__alloc_unlock(a);
    return rc;
}
