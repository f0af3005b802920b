/* Statistics in the reference vocabulary, snapshots, the invariant checker and the
 * out-of-memory report. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/tcache.h"

/* ---- stats ---- */

static size_t largest_free(const mt_alloc_t *a)
{
    size_t best = 0;
    for (size_t i = 0; i < a->nstreams; i++) {
        for (int bp = 0; bp < MT__BP_N; bp++) {
            size_t l = mt__bins_largest(a->streams[i]->bins[bp]);
            if (l > best)
                best = l;
        }
    }
    return best;
}

static void fill_freed(mt_stat_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        s[i].freed = s[i].allocated - (uint64_t)s[i].current;
}

/* Every mt_stat_t array of the stats, for the loops over all of them. */
#define FOR_EACH_STAT(X, s)                                                                        \
    X((s)->allocated_bytes, MT_STAT_N);                                                            \
    X((s)->reserved_bytes, MT_STAT_N);                                                             \
    X((s)->active_bytes, MT_STAT_N);                                                               \
    X((s)->inactive_split_bytes, MT_STAT_N);                                                       \
    X((s)->requested_bytes, MT_STAT_N);                                                            \
    X((s)->allocation, MT_STAT_N);                                                                 \
    X((s)->segment, MT_STAT_N);                                                                    \
    X((s)->active, MT_STAT_N);                                                                     \
    X((s)->inactive_split, MT_STAT_N);                                                             \
    X((s)->tag_allocated_bytes, MT_TAG_MAX);                                                       \
    X((s)->tag_requested_bytes, MT_TAG_MAX);                                                       \
    X(&(s)->oversize_allocations, 1);                                                              \
    X(&(s)->oversize_segments, 1)

void mt__stats_sync(mt_alloc_t *a)
{
    if (!a->st_one)
        return;
    mt_alloc_stats_t *s = &a->st;
    mt_stat_t *pooled[] = {
        s->allocated_bytes, s->reserved_bytes, s->active_bytes, s->inactive_split_bytes,
        s->requested_bytes, s->allocation,     s->segment,      s->active,
        s->inactive_split};
    for (size_t i = 0; i < sizeof pooled / sizeof pooled[0]; i++)
        pooled[i][MT_STAT_LARGE] = pooled[i][MT_STAT_ALL];
}

void mt__stats_unone(mt_alloc_t *a)
{
    mt__stats_sync(a);
    a->st_one = false;
    for (mt_segment_t *seg = a->segs; seg != NULL; seg = seg->next)
        seg->slot = (uint8_t)mt__stat_pool(seg->pool);
}

/* The raw figures: st with active's cumulative figures (allocated_bytes' and allocation's)
 * and freed filled in (cumulative since creation). */
static void raw_stats(mt_alloc_t *a, mt_alloc_stats_t *out)
{
    mt__stats_sync(a);
    *out = a->st;
    for (int i = 0; i < MT_STAT_N; i++) {
        out->active_bytes[i].allocated = out->allocated_bytes[i].allocated;
        out->active[i].allocated = out->allocation[i].allocated;
    }
    FOR_EACH_STAT(fill_freed, out);
}

/* Subtracts the cumulative figures kept at the last reset_accumulated. */
static void since(mt_stat_t *s, const mt_stat_t *base, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        s[i].allocated -= base[i].allocated;
        s[i].freed -= base[i].freed;
    }
}

void mt__alloc_compute_stats(mt_alloc_t *a, mt_alloc_stats_t *out)
{
    mt__alloc_assert_owner(a);
    raw_stats(a, out);
    const mt_alloc_stats_t *b = &a->acc0;
#define SINCE(arr, n)                                                                              \
    since(arr, (const mt_stat_t *)((const char *)(arr) - (const char *)out + (const char *)b), n)
    FOR_EACH_STAT(SINCE, out);
#undef SINCE
    out->num_alloc_retries -= b->num_alloc_retries;
    out->num_ooms -= b->num_ooms;
    out->num_device_alloc -= b->num_device_alloc;
    out->num_device_free -= b->num_device_free;
    out->num_sync_all_streams -= b->num_sync_all_streams;
    out->max_split_size = a->cfg.max_split_size;
    int64_t reserved = a->st.reserved_bytes[MT_STAT_ALL].current;
    int64_t allocated = a->st.allocated_bytes[MT_STAT_ALL].current;
    int64_t active = a->st.active_bytes[MT_STAT_ALL].current;
    out->largest_free_block = largest_free(a);
    out->total_free = (uint64_t)(reserved - active);
    out->utilization = reserved > 0 ? (double)allocated / (double)reserved : 1.0;
    out->fragmentation =
        out->total_free > 0 ? 1.0 - (double)out->largest_free_block / (double)out->total_free : 0.0;
    out->capacity = a->capacity;
    out->limit = a->limit;
}

int mt_alloc_stats(mt_alloc_t *a, mt_alloc_stats_t *out)
{
    if (a == NULL || out == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    /* Flushed, the counters are the truth, and the free-space figures (inactive_split,
     * largest free block) see the cached blocks as the free space they are. */
    mt__tc_flush_all(a);
    if (a->async != NULL)
        mt__async_refresh(a); /* the pool may have given memory back at a synchronize */
    mt__alloc_compute_stats(a, out);
    mt__alloc_unlock(a);
    return 0;
}

static void reset_peaks(mt_stat_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        s[i].peak = s[i].current;
}

void mt_alloc_reset_peak(mt_alloc_t *a)
{
    if (a == NULL)
        return;
    mt__alloc_lock(a);
    mt__tc_flush_all(a); /* the counters are the truth: the peaks start from it */
    mt_alloc_stats_t *s = &a->st;
    reset_peaks(s->allocated_bytes, MT_STAT_N);
    reset_peaks(s->reserved_bytes, MT_STAT_N);
    reset_peaks(s->active_bytes, MT_STAT_N);
    reset_peaks(s->inactive_split_bytes, MT_STAT_N);
    reset_peaks(s->requested_bytes, MT_STAT_N);
    reset_peaks(s->allocation, MT_STAT_N);
    reset_peaks(s->segment, MT_STAT_N);
    reset_peaks(s->active, MT_STAT_N);
    reset_peaks(s->inactive_split, MT_STAT_N);
    reset_peaks(s->tag_allocated_bytes, MT_TAG_MAX);
    reset_peaks(s->tag_requested_bytes, MT_TAG_MAX);
    reset_peaks(&s->oversize_allocations, 1);
    reset_peaks(&s->oversize_segments, 1);
    mt__alloc_unlock(a);
}

void mt_alloc_reset_accumulated(mt_alloc_t *a)
{
    if (a == NULL)
        return;
    mt__alloc_lock(a);
    mt__tc_flush_all(a); /* the cached pairs' counts folded in first */
    raw_stats(a, &a->acc0);
    mt__alloc_unlock(a);
}

const char *mt_alloc_last_error(mt_alloc_t *a)
{
    return a ? a->last_error : "";
}

/* ---- OOM report ---- */

const char *mt__alloc_human(size_t v, char *buf, size_t n)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double d = (double)v;
    int u = 0;
    while (d >= 1024.0 && u < 4) {
        d /= 1024.0;
        u++;
    }
    snprintf(buf, n, "%.2f %s", d, unit[u]);
    return buf;
}

/* Appends to the OOM report what holds the memory, by tag, largest first ("activations
 * 5.10 GiB, weights 1.20 GiB, ..."), and where the recorder keeps this OOM's snapshot (the
 * sink's note), so the message says what to look at. */
static void oom_report_tags(mt_alloc_t *a)
{
    size_t len = strlen(a->last_error), cap = sizeof a->last_error;
    int order[MT_TAG_MAX], n = 0;
    for (int t = 0; t < MT_TAG_MAX; t++)
        if (a->st.tag_allocated_bytes[t].current > 0)
            order[n++] = t;
    for (int i = 1; i < n; i++) /* insertion sort by bytes, at most MT_TAG_MAX */
        for (int j = i; j > 0 && a->st.tag_allocated_bytes[order[j]].current >
                                     a->st.tag_allocated_bytes[order[j - 1]].current;
             j--) {
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    for (int i = 0; i < n && len + 1 < cap; i++) {
        char h[32];
        int w = snprintf(
            a->last_error + len, cap - len, "%s%s %s",
            i ? ", " : " Allocated by tag: ", mt_alloc_tag_name(a, order[i]),
            mt__alloc_human((size_t)a->st.tag_allocated_bytes[order[i]].current, h, sizeof h));
        len = w > 0 && (size_t)w < cap - len ? len + (size_t)w : cap - 1;
    }
    if (n > 0 && len + 2 < cap) {
        a->last_error[len++] = '.';
        a->last_error[len] = '\0';
    }
    const mt_event_sink_t *s = a->cfg.sink;
    if (s != NULL && s->oom_note != NULL && len + 2 < cap) {
        char note[384] = "";
        s->oom_note(s->ud, (unsigned)a->device, a->st.num_ooms, note, sizeof note);
        if (note[0] != '\0')
            snprintf(a->last_error + len, cap - len, " %s.", note);
    }
}

void mt__alloc_oom_report(mt_alloc_t *a, size_t request, size_t rsize, const char *why)
{
    mt__alloc_assert_owner(a);
    size_t free_b = 0, total_b = 0;
    (void)mt_backend_mem_get_info(a->backend, &free_b, &total_b);
    size_t reserved = (size_t)a->st.reserved_bytes[MT_STAT_ALL].current;
    size_t allocated = (size_t)a->st.allocated_bytes[MT_STAT_ALL].current;
    size_t unalloc = reserved - allocated;
    size_t largest = largest_free(a);
    char h[8][32];
    snprintf(
        a->last_error, sizeof a->last_error,
        "out of memory (%s): tried to allocate %s (%zu bytes, %zu rounded). Device %d "
        "has a total capacity of %s of which %s is free (memory limit %s). Of the "
        "allocated memory %s is allocated by memtrace, and %s is reserved by memtrace but "
        "unallocated (reserved %s in total; largest free block %s). If reserved but "
        "unallocated memory is large try setting "
        "MEMTRACE_ALLOC_CONF=expandable_segments:True to avoid fragmentation, or "
        "max_split_size_mb to stop large cached blocks from being split.",
        why, mt__alloc_human(request, h[0], sizeof h[0]), request, rsize, a->device,
        mt__alloc_human(total_b, h[1], sizeof h[1]), mt__alloc_human(free_b, h[2], sizeof h[2]),
        mt__alloc_human(a->limit, h[3], sizeof h[3]), mt__alloc_human(allocated, h[4], sizeof h[4]),
        mt__alloc_human(unalloc, h[5], sizeof h[5]), mt__alloc_human(reserved, h[6], sizeof h[6]),
        mt__alloc_human(largest, h[7], sizeof h[7]));
    (void)mt__alloc_outside_text(a, a->last_error, strlen(a->last_error), sizeof a->last_error,
                                 total_b - free_b, reserved);
    oom_report_tags(a);
    mt__alloc_log(a, MT_LOG_ERROR, "memtrace: %s", a->last_error);
}

/* ---- snapshot ---- */

/* priv_pool took padding: the layout programs built before it know is unchanged. */
_Static_assert(sizeof(void *) != 8 || sizeof(mt_snapshot_segment_t) == 48,
               "mt_snapshot_segment_t keeps its size");

int mt_alloc_snapshot(mt_alloc_t *a, mt_alloc_snapshot_t **out)
{
    if (a == NULL || out == NULL)
        return MT_EINVAL;
    *out = NULL;
    mt_alloc_snapshot_t *snap = calloc(1, sizeof *snap);
    if (snap == NULL)
        return MT_ENOMEM;
    mt__alloc_lock(a);
    mt__tc_flush_all(a); /* cached blocks are free memory in the snapshot */
    int rc = 0;
    snap->segments = calloc(a->nsegs ? a->nsegs : 1, sizeof *snap->segments);
    if (snap->segments == NULL) {
        rc = MT_ENOMEM;
        goto out;
    }
    for (mt_segment_t *seg = a->segs; seg != NULL; seg = seg->next) {
        mt_snapshot_segment_t *ss = &snap->segments[snap->nsegments++];
        ss->addr = seg->addr;
        ss->size = seg->size;
        ss->pool = mt__public_pool(seg->pool);
        ss->stream = seg->sid;
        ss->expandable = seg->expandable;
        ss->reserved = seg->reserved;
        ss->priv_pool = seg->priv ? seg->bins->sr->pool->id : 0;
        size_t n = 0;
        for (mt_block_t *b = seg->first; b != NULL; b = b->next)
            n++;
        ss->blocks = calloc(n ? n : 1, sizeof *ss->blocks);
        if (ss->blocks == NULL) {
            rc = MT_ENOMEM;
            goto out;
        }
        for (mt_block_t *b = seg->first; b != NULL; b = b->next) {
            mt_snapshot_block_t *sb = &ss->blocks[ss->nblocks++];
            sb->addr = b->addr;
            sb->size = b->size;
            /* A block whose pages are being unmapped is free memory to the program. */
            bool free_b = b->state == MT_BLOCK_INACTIVE || b->state == MT__BLOCK_UNMAPPING;
            sb->requested = free_b ? 0 : b->requested;
            sb->state = free_b ? MT_BLOCK_INACTIVE : b->state;
            sb->tag = free_b ? MT_TAG_OTHER : b->tag;
        }
    }
    mt__alloc_compute_stats(a, &snap->stats);
out:
    mt__alloc_unlock(a);
    if (rc != 0) {
        mt_alloc_snapshot_free(&snap);
        return rc;
    }
    *out = snap;
    return 0;
}

void mt_alloc_snapshot_free(mt_alloc_snapshot_t **p)
{
    if (p == NULL || *p == NULL)
        return;
    mt_alloc_snapshot_t *s = *p;
    for (size_t i = 0; i < s->nsegments; i++)
        free(s->segments[i].blocks);
    free(s->segments);
    free(s);
    *p = NULL;
}

/* ---- invariant check ---- */

/* Sums recomputed from the segments, indexed like the stats arrays. */
typedef struct {
    int64_t reserved[MT_STAT_N], segments[MT_STAT_N];
    int64_t allocated[MT_STAT_N], allocs[MT_STAT_N], requested[MT_STAT_N];
    int64_t active[MT_STAT_N], nactive[MT_STAT_N];
    int64_t split[MT_STAT_N], nsplit[MT_STAT_N];
    int64_t tag_alloc[MT_TAG_MAX], tag_req[MT_TAG_MAX];
    int64_t oversize_allocs, oversize_segs;
    size_t inactive, hashed, pending_events, unmapping;
} sums_t;

static void add2(int64_t *arr, int bp, int64_t d)
{
    arr[MT_STAT_ALL] += d;
    arr[mt__stat_pool(bp)] += d;
}

static const char *check_block(mt_alloc_t *a, const mt_segment_t *seg, const mt_block_t *b,
                               sums_t *s)
{
    if (b->seg != seg)
        return "block points to another segment";
    if (b->tce != NULL && b->state != MT_BLOCK_ACTIVE_ALLOCATED)
        return "tcache: owned block not allocated";
    if (b->size < MT__ALIGN || b->size % MT__ALIGN != 0 || b->addr % MT__ALIGN != 0)
        return "block size or address not aligned";
    if (b->next != NULL && (b->next->prev != b || b->next->addr != b->addr + b->size))
        return "blocks of a segment are not contiguous and address-ordered";
    if (b->state == MT_BLOCK_INACTIVE) {
        if (b->next != NULL && b->next->state == MT_BLOCK_INACTIVE)
            return "two adjacent free blocks";
        if (b->split_counted != (b->prev != NULL || b->next != NULL))
            return "inactive_split flag disagrees with the block's neighbours";
        if (b->npending != 0)
            return "inactive block with pending events";
        s->inactive++;
        if (b->split_counted) {
            add2(s->split, seg->pool, (int64_t)b->size);
            add2(s->nsplit, seg->pool, 1);
        }
        if (mt__addrmap_get(&a->map, b->addr) != NULL)
            return "inactive block in the address map";
        return NULL;
    }
    if (b->state == MT__BLOCK_UNMAPPING) {
        if (!seg->expandable || b->split_counted || b->npending != 0)
            return "unmapping block outside an expandable run, or counted as free or pending";
        if (mt__addrmap_get(&a->map, b->addr) != NULL)
            return "unmapping block in the address map";
        s->unmapping++;
        return NULL;
    }
    if (b->state != MT_BLOCK_ACTIVE_ALLOCATED && b->state != MT_BLOCK_ACTIVE_PENDING_FREE)
        return "block state out of range";
    if (mt__addrmap_get(&a->map, b->addr) != b)
        return "active block missing from the address map";
    if (b->split_counted)
        return "active block counted as inactive_split";
    if (b->tag >= MT_TAG_MAX)
        return "block tag out of range";
    s->hashed++;
    add2(s->active, seg->pool, (int64_t)b->size);
    add2(s->nactive, seg->pool, 1);
    if (b->state == MT_BLOCK_ACTIVE_PENDING_FREE) {
        if (b->npending == 0)
            return "pending-free block without pending events";
        s->pending_events += b->npending;
        return NULL;
    }
    if (b->npending != 0)
        return "allocated block with pending events";
    if (b->tce != NULL && !mt__tc_in_owner(b))
        return "tcache: owned block missing from its owner's table";
    if (b->requested == 0 || b->requested > b->size)
        return "requested size outside (0, block size]";
    add2(s->allocated, seg->pool, (int64_t)b->size);
    add2(s->allocs, seg->pool, 1);
    s->oversize_allocs += b->size >= a->cfg.max_split_size;
    add2(s->requested, seg->pool, (int64_t)b->requested);
    s->tag_alloc[b->tag] += (int64_t)b->size;
    s->tag_req[b->tag] += (int64_t)b->requested;
    return NULL;
}

static const char *check_segment(mt_alloc_t *a, const mt_segment_t *seg, sums_t *s)
{
    if (seg->size == 0 || seg->first == NULL || seg->last == NULL)
        return "empty segment";
    if (seg->first->addr != seg->addr || seg->first->prev != NULL || seg->last->next != NULL)
        return "segment's first/last block do not bound it";
    if (seg->last->addr + seg->last->size != seg->addr + seg->size)
        return "blocks do not tile the segment";
    if (seg->reserved != (seg->pool == MT__BP_RESERVED))
        return "reserved flag disagrees with the pool";
    if (seg->expandable) {
        size_t page = mt__exp_page(a);
        const mt_streamrec_t *sr = mt__alloc_streamrec(a, seg->stream);
        if (seg->size % page != 0 || seg->addr % page != 0 || seg->vsize != seg->size)
            return "expandable segment's mapped run is not whole pages";
        if (sr == NULL || seg->pool > MT__BP_LARGE || seg->addr < sr->vbase[seg->pool] ||
            seg->addr + seg->size > sr->vbase[seg->pool] + sr->vsize[seg->pool])
            return "expandable segment outside its stream's range";
        if (seg->next != NULL && seg->next->bins == seg->bins && seg->next->expandable &&
            seg->next->addr == seg->addr + seg->size)
            return "two touching runs of one range were not joined";
    } else if (seg->vsize != seg->size) {
        return "plain segment with a virtual size";
    }
    if (seg->bins == NULL || seg->bins->pool != seg->pool || seg->bins->stream != seg->stream)
        return "segment attached to the bins of another pool or stream";
    add2(s->reserved, seg->pool, (int64_t)seg->size);
    add2(s->segments, seg->pool, 1);
    s->oversize_segs += !seg->expandable && seg->size >= a->cfg.max_split_size;
    for (const mt_block_t *b = seg->first; b != NULL; b = b->next) {
        const char *why = check_block(a, seg, b, s);
        if (why != NULL)
            return why;
        if (b->next == NULL && b != seg->last)
            return "segment's last block is not the end of its list";
    }
    return NULL;
}

/* The in-flight unmaps and mappings (internal.h, at mt__unmap_t and mt__map_t). */
static const char *check_inflight(mt_alloc_t *a, size_t unmapping)
{
    size_t page = mt__exp_page(a), entries = 0, bytes = 0;
    for (const mt__unmap_batch_t *q = a->unmaps; q != NULL; q = q->next) {
        if (q->done > q->n || q->n > q->cap)
            return "unmap batch counts out of order";
        for (size_t i = q->done; i < q->n; i++) {
            const mt__unmap_t *u = &q->v[i];
            const mt_block_t *b = u->blk;
            if (b->state != MT__BLOCK_UNMAPPING || u->len == 0 || u->at % page != 0 ||
                u->len % page != 0 || u->at < b->addr || u->at + u->len > b->addr + b->size ||
                u->seg2 == NULL)
                return "in-flight unmap outside its block's whole pages";
            entries++;
        }
    }
    if (entries != unmapping)
        return "unmapping blocks disagree with the in-flight unmaps";
    for (const mt__map_t *m = a->maps; m != NULL; m = m->next) {
        const mt_streamrec_t *sr = m->sr;
        if (m->bp < 0 || m->bp > MT__BP_LARGE || sr->nmaps[m->bp] == 0 || m->len == 0 ||
            m->at % page != 0 || m->len % page != 0 || m->at < sr->vbase[m->bp] ||
            m->at + m->len > sr->vbase[m->bp] + sr->vsize[m->bp])
            return "in-flight mapping outside its range";
        for (const mt_segment_t *seg = a->segs; seg != NULL; seg = seg->next)
            if (seg->addr < m->at + m->len && m->at < seg->addr + seg->vsize)
                return "in-flight mapping overlaps a segment";
        for (const mt__map_t *o = m->next; o != NULL; o = o->next)
            if (o->at < m->at + m->len && m->at < o->at + o->len)
                return "two in-flight mappings overlap";
        bytes += m->len;
    }
    if (bytes != a->inflight_map_bytes)
        return "in-flight mapping bytes disagree with the mappings";
    return NULL;
}

static const char *cmp_stat(const mt_stat_t *st, const int64_t *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (st[i].current != want[i] || st[i].peak < st[i].current)
            return what;
    return NULL;
}

/* A global allocation checks active's peaks only where allocated's moved or freed blocks
 * wait for events (alloc.c): each active peak is at least its allocated's. */
static const char *cmp_peaks(const mt_alloc_stats_t *st)
{
    for (int i = 0; i < MT_STAT_N; i++)
        if (st->active_bytes[i].peak < st->allocated_bytes[i].peak ||
            st->active[i].peak < st->allocation[i].peak)
            return "active peak below allocated peak";
    return NULL;
}

const char *mt__alloc_is_valid(mt_alloc_t *a)
{
    if (a->async != NULL)
        return mt__async_is_valid(a);
    mt__stats_sync(a);
    if (a->small_max != (a->cfg.expandable_segments && a->cfg.one_pool ? 0 : MT__SMALL_SIZE))
        return "small_max disagrees with expandable_segments and one_pool";
    const char *why = NULL;
    sums_t s = {0};
    size_t nsegs = 0;
    for (const mt_segment_t *seg = a->segs; seg != NULL; seg = seg->next) {
        nsegs++;
        if (seg->next != NULL &&
            (seg->next->prev != seg || seg->next->addr < seg->addr + seg->vsize))
            return "segments overlap or are not in address order";
        if (a->st_one ? seg->pool == MT__BP_SMALL || seg->slot != MT_STAT_ALL
                      : seg->slot != mt__stat_pool(seg->pool))
            return "segment's stat slot disagrees with its pool";
        if ((why = check_segment(a, seg, &s)) != NULL)
            return why;
    }
    if (nsegs != a->nsegs)
        return "segment count disagrees with the list";
    size_t binned = 0;
    for (size_t i = 0; i < a->nstreams; i++) {
        const mt_streamrec_t *sr = a->streams[i];
        for (int bp = 0; bp < MT__BP_N; bp++) {
            if (sr->bins[bp] == NULL)
                continue;
            size_t n = 0;
            if ((why = mt__bins_check(sr->bins[bp], &n)) != NULL)
                return why;
            binned += n;
            if (sr->bins[bp]->sr != sr)
                return "binset not linked to its stream's record";
        }
        for (int bp = 0; bp < 2; bp++) {
            size_t runs = 0;
            for (const mt_segment_t *seg = a->segs; seg != NULL; seg = seg->next)
                runs += seg->expandable && seg->pool == bp && seg->bins->sr == sr;
            size_t maps = 0;
            for (const mt__map_t *m = a->maps; m != NULL; m = m->next)
                maps += m->sr == sr && m->bp == bp;
            if (runs != sr->nruns[bp] || maps != sr->nmaps[bp])
                return "stream's count of expandable runs or mappings is wrong";
            if ((runs > 0 || sr->nmaps[bp] > 0) && sr->vsize[bp] == 0)
                return "expandable runs or mappings without a range";
            if (sr->users[bp] == 0 && (sr->vsize[bp] > 0) != (runs > 0))
                return "expandable range without runs kept, or runs without a range";
            if (sr->reserving[bp] && (sr->vsize[bp] != 0 || sr->users[bp] == 0))
                return "range reserved twice, or by nobody";
        }
    }
    if (a->nscopes > MT_ALLOC_SCOPE_MAX || a->noom_obs > MT__OOM_OBS_MAX)
        return "more statistics scopes or OOM observers than room for them";
    for (unsigned i = 0; i < a->nscopes; i++)
        if (a->scopes[i].start > a->scopes[i].peak)
            return "statistics scope whose peak is below its start";
    if (a->nscopes > 0 && a->st.allocated_bytes[MT_STAT_ALL].current > a->scope_hw)
        return "allocated bytes above the open scopes' high-water mark";
    if (binned != s.inactive)
        return "bins do not hold exactly the inactive blocks";
    if (s.hashed != a->map.n)
        return "address map does not hold exactly the active blocks";
    if ((why = mt__addrmap_check(&a->map)) != NULL)
        return why;
    for (size_t i = 0, used = 0; i < a->map.cap; i++) {
        const mt_block_t *b = mt__addrmap_at(&a->map, i);
        if (b == NULL)
            continue;
        if (b->addr != a->map.keys[i] || b->state == MT_BLOCK_INACTIVE)
            return "address map entry does not name an active block at its key";
        if (mt__addrmap_get(&a->map, a->map.keys[i]) != b)
            return "address map entry unreachable by probing";
        if (++used > a->map.cap / 2)
            return "address map above its load factor";
    }
    bool waited = false;
    for (size_t i = 0; i < a->npending; i++) {
        if (a->pending[i].blk->state != MT_BLOCK_ACTIVE_PENDING_FREE)
            return "pending event for a block that is not pending";
        waited |= a->pending[i].waited;
    }
    if (waited && !a->syncing)
        return "pending event marked waited with no thread waiting";
    if (a->npending + a->nholds != s.pending_events)
        return "pending events disagree with the blocks' counts";
    if ((why = check_inflight(a, s.unmapping)) != NULL)
        return why;
    const mt_alloc_stats_t *st = &a->st;
    if ((why = cmp_stat(st->reserved_bytes, s.reserved, MT_STAT_N, "reserved_bytes stat")) ||
        (why = cmp_stat(st->segment, s.segments, MT_STAT_N, "segment stat")) ||
        (why = cmp_stat(st->allocated_bytes, s.allocated, MT_STAT_N, "allocated_bytes stat")) ||
        (why = cmp_stat(st->allocation, s.allocs, MT_STAT_N, "allocation stat")) ||
        (why = cmp_stat(st->requested_bytes, s.requested, MT_STAT_N, "requested_bytes stat")) ||
        (why = cmp_stat(st->active_bytes, s.active, MT_STAT_N, "active_bytes stat")) ||
        (why = cmp_stat(st->active, s.nactive, MT_STAT_N, "active stat")) ||
        (why = cmp_stat(st->inactive_split_bytes, s.split, MT_STAT_N, "inactive_split_bytes")) ||
        (why = cmp_stat(st->inactive_split, s.nsplit, MT_STAT_N, "inactive_split stat")) ||
        (why = cmp_stat(st->tag_allocated_bytes, s.tag_alloc, MT_TAG_MAX, "tag_allocated")) ||
        (why = cmp_stat(st->tag_requested_bytes, s.tag_req, MT_TAG_MAX, "tag_requested")) ||
        (why =
             cmp_stat(&st->oversize_allocations, &s.oversize_allocs, 1, "oversize_allocations")) ||
        (why = cmp_stat(&st->oversize_segments, &s.oversize_segs, 1, "oversize_segments")) ||
        (why = cmp_peaks(st)))
        return why;
    if ((why = mt__tc_check(a)) != NULL || (why = mt__pool_check(a)) != NULL ||
        (why = mt__alloc_gb_check(a)) != NULL || (why = mt__alloc_lock_check(a)) != NULL)
        return why;
    return mt__plan_check(a);
}

void mt__alloc_check_amortized(mt_alloc_t *a)
{
#if MT_ASSERT_LEVEL >= 2
    size_t cost = a->nsegs + a->map.cap + a->map.n;
    for (size_t i = 0; i < a->nstreams; i++)
        for (int bp = 0; bp < MT__BP_N; bp++)
            if (a->streams[i]->bins[bp] != NULL)
                cost += MT__NCLASS + a->streams[i]->bins[bp]->nblocks;
    a->check_credit += MT__CHECK_STEPS;
    if (a->check_credit < cost)
        return;
    a->check_credit = 0;
    mt_assert_valid(mt__alloc_is_valid(a));
#else
    (void)a;
#endif
}

int mt_alloc_check(mt_alloc_t *a)
{
    if (a == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    const char *why = mt__alloc_is_valid(a);
    if (why != NULL) {
        snprintf(a->last_error, sizeof a->last_error, "allocator invariant violated: %s", why);
        mt__alloc_log(a, MT_LOG_ERROR, "memtrace: %s", a->last_error);
    }
    /* Raw: a violation is reported here, not turned into an abort. */
    mt__alloc_unlock_raw(a);
    return why != NULL ? MT_EIO : 0;
}
