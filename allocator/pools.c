/* Private pools (mt_pool_*): the memory of a stream capture's allocations.
 *
 * A CUDA graph records the addresses its kernels use, including those of blocks the
 * capture freed before it ended (a temporary freed between two kernels is still written by
 * every replay). PyTorch therefore gives each capture a private pool: while a stream
 * captures, its allocations come from the pool's own segments; a block freed there goes
 * back to the pool's free lists only, where later allocations routed to the pool may take
 * it but eager requests never see it; and the segments stay until the pool is released.
 *
 * Here a pool is a set of stream records (mt_streamrec_t, one per stream it served) that
 * stream lookups skip. A routed request takes its pool's record instead of its stream's,
 * so everything below the record (bins, segments, split and merge, events, statistics) is
 * the allocator's ordinary code, and blocks of different records never mix.
 * The segments are plain (never expandable) and marked priv, which every release path
 * (GC, empty_cache, OOM recovery, release_to_fit, oversize and smaller-segment release)
 * skips; mt_pool_release returns them once no block is live. */
#include <stdlib.h>
#include <string.h>

#include "allocator/internal.h"
#include "allocator/tcache.h"
#include "util/grow.h"

/* ---- lookups ---- */

static mt__pool_t *find_pool(const mt_alloc_t *a, uint32_t id)
{
    for (size_t i = 0; i < a->npools; i++)
        if (a->pools[i]->id == id)
            return a->pools[i];
    return NULL;
}

static mt__route_t *find_route(const mt_alloc_t *a, mt_stream_t *stream)
{
    for (size_t i = 0; i < a->nroutes; i++)
        if (a->routes[i].stream == stream)
            return &a->routes[i];
    return NULL;
}

/* p's record of stream, created (and listed in a->streams) on first use. */
static mt_streamrec_t *pool_streamrec(mt_alloc_t *a, mt__pool_t *p, mt_stream_t *stream)
{
    for (size_t i = 0; i < p->nsrs; i++)
        if (p->srs[i]->stream == stream)
            return p->srs[i];
    /* p's list grown first: once the record is in a->streams, nothing may fail */
    mt_streamrec_t **ps = mt__grow(p->srs, &p->cap_srs, p->nsrs + 1, sizeof *ps, 2);
    if (ps == NULL)
        return NULL;
    p->srs = ps;
    mt_streamrec_t *sr = mt__alloc_streamrec_add(a, stream, p);
    if (sr != NULL)
        p->srs[p->nsrs++] = sr;
    return sr;
}

mt_streamrec_t *mt__pool_route(mt_alloc_t *a, mt_stream_t *stream)
{
    mt__alloc_assert_owner(a);
    const mt__route_t *r = find_route(a, stream);
    return r != NULL ? pool_streamrec(a, r->pool, stream) : mt__alloc_streamrec(a, stream);
}

static bool in_pool(const mt_segment_t *seg, const mt__pool_t *p)
{
    return seg->priv && seg->bins->sr->pool == p;
}

/* ---- the public calls ---- */

int mt_pool_create(mt_alloc_t *a, uint32_t *out_id)
{
    if (a == NULL || out_id == NULL)
        return MT_EINVAL;
    *out_id = 0;
    if (a->async != NULL)
        return MT_ENOTSUP; /* the driver's pool places the memory, not the allocator */
    mt__pool_t *p = calloc(1, sizeof *p);
    if (p == NULL)
        return MT_ENOMEM;
    mt__alloc_lock(a);
    mt__pool_t **np = mt__grow(a->pools, &a->cap_pools, a->npools + 1, sizeof *np, 4);
    if (np == NULL || a->next_pool_id == UINT32_MAX) {
        if (np != NULL)
            a->pools = np;
        mt__alloc_unlock(a);
        free(p);
        return MT_ENOMEM;
    }
    a->pools = np;
    p->id = ++a->next_pool_id;
    a->pools[a->npools++] = p;
    *out_id = p->id;
    mt__alloc_unlock(a);
    return 0;
}

int mt_pool_begin(mt_alloc_t *a, uint32_t id, mt_stream_t *stream)
{
    if (a == NULL)
        return MT_EINVAL;
    if (a->async != NULL)
        return MT_ENOTSUP;
    mt__alloc_lock(a);
    int rc = 0;
    mt__pool_t *p = find_pool(a, id);
    if (p == NULL) {
        rc = MT_ENOENT;
        goto out;
    }
    /* A warm-up records every request to plan a reservation; a capture's requests belong to
     * the pool, not to that plan. */
    if (find_route(a, stream) != NULL || a->warming) {
        rc = MT_EBUSY;
        goto out;
    }
    mt__route_t *nr = mt__grow(a->routes, &a->cap_routes, a->nroutes + 1, sizeof *nr, 4);
    if (nr == NULL) {
        rc = MT_ENOMEM;
        goto out;
    }
    a->routes = nr;
    a->routes[a->nroutes++] = (mt__route_t){.stream = stream, .pool = p};
    p->nroutes++;
    /* The thread caches serve a stream's requests without the lock, hence without the
     * routing: off while any stream is routed (their blocks go back to the bins). */
    mt__tc_quiesce(a);
    mt_assert(a->tc_on == 0 && p->nroutes >= 1);
out:
    mt__alloc_unlock(a);
    return rc;
}

int mt_pool_end(mt_alloc_t *a, uint32_t id, mt_stream_t *stream)
{
    if (a == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    mt__route_t *r = find_route(a, stream);
    int rc = r != NULL && r->pool->id == id ? 0 : MT_ENOENT;
    if (rc == 0) {
        mt_assert(r->pool->nroutes > 0);
        r->pool->nroutes--;
        *r = a->routes[--a->nroutes];
        if (a->nroutes == 0)
            mt__tc_resume(a);
    }
    mt__alloc_unlock(a);
    return rc;
}

/* Forgets p's stream records (their segments are gone) and p itself. */
static void pool_forget(mt_alloc_t *a, mt__pool_t *p)
{
    size_t k = 0;
    for (size_t i = 0; i < a->nstreams; i++) {
        mt_streamrec_t *sr = a->streams[i];
        if (sr->pool != p) {
            a->streams[k++] = sr;
            continue;
        }
        for (int bp = 0; bp < MT__BP_N; bp++) {
            mt_assert(sr->bins[bp] == NULL || sr->bins[bp]->nblocks == 0);
            free(sr->bins[bp]);
        }
        if (a->last_sr == sr)
            a->last_sr = NULL;
        free(sr);
    }
    a->nstreams = k;
    for (size_t i = 0; i < a->npools; i++) {
        if (a->pools[i] == p) {
            memmove(&a->pools[i], &a->pools[i + 1], (a->npools - i - 1) * sizeof a->pools[0]);
            a->npools--;
            break;
        }
    }
    free(p->srs);
    free(p);
}

int mt_pool_release(mt_alloc_t *a, uint32_t id)
{
    if (a == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    int rc = 0;
    mt__pool_t *p = find_pool(a, id);
    if (p == NULL) {
        rc = MT_ENOENT;
        goto out;
    }
    /* A request that released the lock (free callbacks, a wait for events or mappings) may
     * hold one of the pool's records and come back to it: the records stay until it is done. */
    if (p->nroutes > 0 || a->in_free_cbs || mt__alloc_inflight(a)) {
        rc = MT_EBUSY;
        goto out;
    }
    /* Frees whose events have completed count as done. */
    if (a->npending > 0)
        mt__alloc_process_events(a);
    for (const mt_segment_t *s = a->segs; s != NULL; s = s->next) {
        if (in_pool(s, p) && !mt__seg_is_whole_free(s)) {
            rc = MT_EBUSY; /* a live block: the caller frees it first */
            goto out;
        }
    }
    mt_segment_t *next;
    for (mt_segment_t *s = a->segs; s != NULL; s = next) {
        next = s->next;
        if (in_pool(s, p)) {
            size_t got = mt__seg_release(a, s);
            mt_assert(got > 0); /* plain and whole free: released under the lock */
            (void)got;
        }
    }
    pool_forget(a, p);
out:
    mt__alloc_unlock(a);
    return rc;
}

int mt_pool_usage(mt_alloc_t *a, uint32_t id, uint64_t *reserved, uint64_t *allocated)
{
    if (a == NULL)
        return MT_EINVAL;
    mt__alloc_lock(a);
    const mt__pool_t *p = find_pool(a, id);
    uint64_t r = 0, al = 0;
    for (const mt_segment_t *s = a->segs; p != NULL && s != NULL; s = s->next) {
        if (!in_pool(s, p))
            continue;
        r += s->size;
        for (const mt_block_t *b = s->first; b != NULL; b = b->next)
            al += b->state == MT_BLOCK_ACTIVE_ALLOCATED ? b->size : 0;
    }
    mt__alloc_unlock(a);
    if (p == NULL)
        return MT_ENOENT;
    if (reserved != NULL)
        *reserved = r;
    if (allocated != NULL)
        *allocated = al;
    return 0;
}

/* ---- lifecycle and checks ---- */

void mt__pool_fini(mt_alloc_t *a)
{
    for (size_t i = 0; i < a->npools; i++) {
        free(a->pools[i]->srs);
        free(a->pools[i]);
    }
    free(a->pools);
    free(a->routes);
    a->pools = NULL;
    a->routes = NULL;
    a->npools = a->nroutes = 0;
}

static bool pool_listed(const mt_alloc_t *a, const mt__pool_t *p)
{
    for (size_t i = 0; i < a->npools; i++)
        if (a->pools[i] == p)
            return true;
    return false;
}

static bool stream_listed(const mt_alloc_t *a, const mt_streamrec_t *sr)
{
    for (size_t i = 0; i < a->nstreams; i++)
        if (a->streams[i] == sr)
            return true;
    return false;
}

static const char *check_pool(const mt_alloc_t *a, size_t i)
{
    const mt__pool_t *p = a->pools[i];
    if (p->id == 0 || p->id > a->next_pool_id)
        return "pool id out of range";
    for (size_t j = 0; j < i; j++)
        if (a->pools[j]->id == p->id)
            return "two pools share an id";
    uint32_t routed = 0;
    for (size_t j = 0; j < a->nroutes; j++)
        routed += a->routes[j].pool == p;
    if (routed != p->nroutes)
        return "pool's route count disagrees with the routes";
    for (size_t j = 0; j < p->nsrs; j++) {
        if (p->srs[j]->pool != p || !stream_listed(a, p->srs[j]))
            return "pool's stream record not listed, or of another pool";
        for (size_t k = 0; k < j; k++)
            if (p->srs[k]->stream == p->srs[j]->stream)
                return "pool holds two records of one stream";
    }
    return NULL;
}

const char *mt__pool_check(const mt_alloc_t *a)
{
    const char *why;
    for (size_t i = 0; i < a->npools; i++)
        if ((why = check_pool(a, i)) != NULL)
            return why;
    for (size_t i = 0; i < a->nroutes; i++) {
        if (!pool_listed(a, a->routes[i].pool))
            return "route to a pool that does not exist";
        for (size_t j = 0; j < i; j++)
            if (a->routes[j].stream == a->routes[i].stream)
                return "stream routed twice";
    }
    if (a->nroutes > 0 && a->tc_on)
        return "thread caches on while a stream is routed to a pool";
    if (a->last_sr != NULL && a->last_sr->pool != NULL)
        return "stream lookup cache holds a pool's record";
    for (size_t i = 0; i < a->nstreams; i++) {
        const mt__pool_t *p = a->streams[i]->pool;
        if (p == NULL)
            continue;
        bool found = false;
        for (size_t j = 0; pool_listed(a, p) && j < p->nsrs; j++)
            found |= p->srs[j] == a->streams[i];
        if (!found)
            return "stream record of a pool that does not list it";
    }
    for (const mt_segment_t *s = a->segs; s != NULL; s = s->next) {
        if (s->priv != (s->bins->sr->pool != NULL))
            return "segment's priv flag disagrees with its bins' record";
        if (s->priv && (s->expandable || s->reserved))
            return "private pool segment that is expandable or reserved";
        for (const mt_block_t *b = s->priv ? s->first : NULL; b != NULL; b = b->next)
            if (b->tce != NULL)
                return "private pool block owned by a thread cache";
    }
    return NULL;
}
