/* The sim's model of the driver's stream-ordered pool (cudaMallocAsync on the device's
 * default pool).
 *
 * The pool holds chunks: segments of the sim device, each a multiple of 2 MiB, carved into
 * blocks. A request takes the best-fitting free block it may reuse, else the pool grows
 * by a new chunk (a segment malloc, with its modelled cost). A free is stream-ordered: the
 * block belongs to the freeing stream at once, and to any stream once that stream has run
 * every op queued before the free (the driver's opportunistic reuse) or once a stream
 * waits on an event recorded after the free (its reuse that follows event dependencies).
 * At a synchronize, whole unused chunks go back to the device while the pool holds more
 * than its release threshold; a trim does the same down to the bytes it is asked to
 * keep; a growth that the device refuses first gives back every chunk it can, then
 * fails. Ordering through a chain of streams (A -> C -> B) is not followed: only direct
 * waits and completion are, which makes reuse later, never earlier, than the driver's. */
#include <stdlib.h>

#include "backend/backend_sim.h"
#include "backend/sim_internal.h"

#define POOL_ALIGN ((size_t)512)     /* the driver's allocation alignment */
#define POOL_CHUNK ((size_t)2 << 20) /* growth step: the VMM granularity */
#define SID_ANY    UINT32_MAX        /* a free every stream may reuse (it completed) */

/* One block of a chunk. Free blocks: sid/seq say which free it was (see the file
 * comment); live blocks: sid/seq unused. */
typedef struct pblk_s {
    struct pblk_s *next; /* next block of the chunk, address order */
    uintptr_t addr;      /* device address, multiple of POOL_ALIGN */
    size_t size;         /* bytes, multiple of POOL_ALIGN, > 0 */
    bool live;           /* handed out by malloc_async, not yet freed */
    uint32_t sid;        /* free: the freeing stream's id, or SID_ANY */
    uint64_t seq;        /* free: ops queued on sid before the free */
} pblk_t;

/* Invariants: blks tile [base, base + size) in address order; no two adjacent free blocks
 * both have sid = SID_ANY (they are merged); live = sum of the live blocks' sizes. */
typedef struct pchunk_s {
    struct pchunk_s *next;
    uintptr_t base; /* a segment of the sim device */
    size_t size;    /* bytes, multiple of POOL_CHUNK */
    size_t live;    /* bytes of live blocks */
    pblk_t *blks;
} pchunk_t;

/* Stream waiter waits on a record made on stream sid after seq ops. */
typedef struct pdep_s {
    uint32_t waiter, sid;
    uint64_t seq;
} pdep_t;

/* Invariants (under mu): reserved = sum of chunk sizes; used = sum of chunk live bytes;
 * used <= reserved; reserved <= reserved_high; used <= used_high.
 * Lock order: mu before the device's streams_mu, stream mus, mu and cost_mu. */
typedef struct sim_pool_s {
    pthread_mutex_t mu;
    pchunk_t *chunks;
    size_t reserved;      /* bytes */
    size_t used;          /* bytes */
    size_t reserved_high; /* bytes */
    size_t used_high;     /* bytes */
    uint64_t threshold;   /* release threshold, bytes; 0 (the driver's default) */
    pdep_t *deps;         /* one entry per (waiter, sid), the highest seq */
    size_t ndeps, cap_deps;
} sim_pool_t;

static sim_t *to_sim(mt_backend_t *b)
{
    return (sim_t *)b;
}

static size_t round_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

int mt__sim_pool_init(sim_t *s)
{
    sim_pool_t *p = calloc(1, sizeof *p);
    if (p == NULL)
        return MT_ENOMEM;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        return MT_ENOMEM;
    }
    s->pool = p;
    return 0;
}

static void chunk_free(pchunk_t *c)
{
    while (c->blks != NULL) {
        pblk_t *b = c->blks;
        c->blks = b->next;
        free(b);
    }
    free(c);
}

void mt__sim_pool_fini(sim_t *s)
{
    sim_pool_t *p = s->pool;
    if (p == NULL)
        return;
    while (p->chunks != NULL) {
        pchunk_t *c = p->chunks;
        p->chunks = c->next;
        (void)mt__sim_free(&s->base, (void *)c->base);
        chunk_free(c);
    }
    free(p->deps);
    pthread_mutex_destroy(&p->mu);
    free(p);
    s->pool = NULL;
}

void mt__sim_pool_fork(sim_t *s, int phase)
{
    if (phase == MT__FORK_PREPARE)
        pthread_mutex_lock(&s->pool->mu);
    else if (phase == MT__FORK_PARENT)
        pthread_mutex_unlock(&s->pool->mu);
    else
        pthread_mutex_init(&s->pool->mu, NULL);
}

/* ---- ordering (mu held) ---- */

static uint32_t sid_of(const mt_stream_t *st)
{
    return mt_stream_id(st);
}

/* True once stream sid ran every op queued before a free at seq (or is gone: it drained). */
static bool free_completed(sim_t *s, uint32_t sid, uint64_t seq)
{
    uint64_t enq, done;
    return mt__sim_stream_progress(s, sid, &enq, &done) != 0 || done >= seq;
}

static bool ordered_by_wait(const sim_pool_t *p, uint32_t waiter, uint32_t sid, uint64_t seq)
{
    for (size_t i = 0; i < p->ndeps; i++)
        if (p->deps[i].waiter == waiter && p->deps[i].sid == sid)
            return p->deps[i].seq >= seq;
    return false;
}

/* Marks completed frees reusable by all and merges adjacent ones. */
static void settle(sim_t *s, pchunk_t *c)
{
    for (pblk_t *b = c->blks; b != NULL; b = b->next)
        if (!b->live && b->sid != SID_ANY && free_completed(s, b->sid, b->seq))
            b->sid = SID_ANY;
    for (pblk_t *b = c->blks; b != NULL && b->next != NULL;) {
        pblk_t *n = b->next;
        if (!b->live && !n->live && b->sid == SID_ANY && n->sid == SID_ANY) {
            b->size += n->size;
            b->next = n->next;
            free(n);
        } else {
            b = n;
        }
    }
}

static bool reusable(sim_t *s, const sim_pool_t *p, const pblk_t *b, uint32_t sid)
{
    if (b->live)
        return false;
    return b->sid == SID_ANY || b->sid == sid || free_completed(s, b->sid, b->seq) ||
           ordered_by_wait(p, sid, b->sid, b->seq);
}

/* ---- growth and release (mu held) ---- */

/* Gives back whole unused chunks whose frees completed while the pool holds more than
 * keep bytes; returns the bytes given back. */
static size_t release_unused(sim_t *s, sim_pool_t *p, size_t keep)
{
    size_t given = 0;
    for (pchunk_t **pc = &p->chunks; *pc != NULL && p->reserved > keep;) {
        pchunk_t *c = *pc;
        if (c->live == 0)
            settle(s, c);
        if (c->live != 0 || c->blks->next != NULL || c->blks->sid != SID_ANY) {
            pc = &c->next;
            continue;
        }
        *pc = c->next;
        (void)mt__sim_free(&s->base, (void *)c->base);
        p->reserved -= c->size;
        given += c->size;
        chunk_free(c);
    }
    return given;
}

/* A new chunk for a request of rsize bytes; on the device's refusal the pool gives back
 * what it can and tries once more. */
static int grow(sim_t *s, sim_pool_t *p, size_t rsize, pchunk_t **out)
{
    size_t size = round_up(rsize, POOL_CHUNK);
    pchunk_t *c = calloc(1, sizeof *c);
    pblk_t *b = calloc(1, sizeof *b);
    if (c == NULL || b == NULL) {
        free(c);
        free(b);
        return MT_ENOMEM;
    }
    void *base = NULL;
    int rc = mt__sim_malloc(&s->base, size, &base);
    if (rc == MT_ENOMEM && release_unused(s, p, 0) > 0)
        rc = mt__sim_malloc(&s->base, size, &base);
    if (rc != 0) {
        free(c);
        free(b);
        return rc;
    }
    *b = (pblk_t){.addr = (uintptr_t)base, .size = size, .sid = SID_ANY};
    *c = (pchunk_t){.next = p->chunks, .base = (uintptr_t)base, .size = size, .blks = b};
    p->chunks = c;
    p->reserved += size;
    if (p->reserved > p->reserved_high)
        p->reserved_high = p->reserved;
    *out = c;
    return 0;
}

/* ---- ops ---- */

int mt__sim_malloc_async(mt_backend_t *b, size_t size, mt_stream_t *st, void **out)
{
    sim_t *s = to_sim(b);
    sim_pool_t *p = s->pool;
    uint32_t sid = sid_of(st);
    uint64_t enq, done;
    if (mt__sim_stream_progress(s, sid, &enq, &done) != 0)
        return MT_EINVAL; /* not a live stream of this device */
    if (size > s->capacity)
        return MT_ENOMEM;
    size_t rsize = round_up(size, POOL_ALIGN);
    pthread_mutex_lock(&p->mu);
    pchunk_t *bc = NULL;
    pblk_t *best = NULL;
    for (pchunk_t *c = p->chunks; c != NULL; c = c->next) {
        settle(s, c);
        for (pblk_t *k = c->blks; k != NULL; k = k->next)
            if (k->size >= rsize && (best == NULL || k->size < best->size) &&
                reusable(s, p, k, sid)) {
                best = k;
                bc = c;
            }
    }
    int rc = 0;
    if (best == NULL) {
        rc = grow(s, p, rsize, &bc);
        if (rc != 0)
            goto out;
        best = bc->blks;
    }
    if (best->size - rsize >= POOL_ALIGN) {
        pblk_t *rest = malloc(sizeof *rest);
        if (rest == NULL) {
            rc = MT_ENOMEM;
            goto out;
        }
        *rest = (pblk_t){.next = best->next,
                         .addr = best->addr + rsize,
                         .size = best->size - rsize,
                         .sid = best->sid,
                         .seq = best->seq};
        best->next = rest;
        best->size = rsize;
    }
    best->live = true;
    bc->live += best->size;
    p->used += best->size;
    if (p->used > p->used_high)
        p->used_high = p->used;
    *out = (void *)best->addr;
out:
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int mt__sim_free_async(mt_backend_t *b, void *ptr, mt_stream_t *st)
{
    sim_t *s = to_sim(b);
    sim_pool_t *p = s->pool;
    uintptr_t a = (uintptr_t)ptr;
    uint32_t sid = sid_of(st);
    uint64_t enq = 0, done = 0;
    if (mt__sim_stream_progress(s, sid, &enq, &done) != 0)
        return MT_EINVAL; /* a stream of another device, or destroyed */
    int rc = MT_EINVAL;   /* not a live pool allocation: the driver's invalid value */
    pthread_mutex_lock(&p->mu);
    for (pchunk_t *c = p->chunks; c != NULL && rc != 0; c = c->next) {
        if (a < c->base || a >= c->base + c->size)
            continue;
        for (pblk_t *k = c->blks, *prev = NULL; k != NULL; prev = k, k = k->next) {
            if (k->addr != a || !k->live)
                continue;
            k->live = false;
            k->sid = sid;
            k->seq = enq;
            c->live -= k->size;
            p->used -= k->size;
            /* Neighbours freed on the same stream are one free as late as the later. */
            pblk_t *n = k->next;
            if (n != NULL && !n->live && n->sid == sid) {
                k->size += n->size;
                k->seq = n->seq > k->seq ? n->seq : k->seq;
                k->next = n->next;
                free(n);
            }
            if (prev != NULL && !prev->live && prev->sid == sid) {
                prev->size += k->size;
                prev->seq = k->seq > prev->seq ? k->seq : prev->seq;
                prev->next = k->next;
                free(k);
            }
            rc = 0;
            break;
        }
        break;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void mt__sim_pool_note_wait(sim_t *s, uint32_t waiter_id, uint32_t sid, uint64_t seq)
{
    sim_pool_t *p = s->pool;
    if (waiter_id == sid)
        return;
    pthread_mutex_lock(&p->mu);
    size_t i = 0;
    while (i < p->ndeps && !(p->deps[i].waiter == waiter_id && p->deps[i].sid == sid))
        i++;
    if (i == p->ndeps) {
        if (p->ndeps == p->cap_deps) {
            size_t cap = p->cap_deps ? 2 * p->cap_deps : 8;
            pdep_t *v = realloc(p->deps, cap * sizeof *v);
            if (v == NULL) {
                /* Without the entry reuse waits for completion: later, still correct. */
                pthread_mutex_unlock(&p->mu);
                return;
            }
            p->deps = v;
            p->cap_deps = cap;
        }
        p->deps[p->ndeps++] = (pdep_t){.waiter = waiter_id, .sid = sid, .seq = seq};
    } else if (seq > p->deps[i].seq) {
        p->deps[i].seq = seq;
    }
    pthread_mutex_unlock(&p->mu);
}

void mt__sim_pool_on_sync(sim_t *s)
{
    sim_pool_t *p = s->pool;
    pthread_mutex_lock(&p->mu);
    if (p->threshold < p->reserved)
        (void)release_unused(s, p, (size_t)p->threshold);
    pthread_mutex_unlock(&p->mu);
}

int mt__sim_pool_set_release_threshold(mt_backend_t *b, uint64_t bytes)
{
    sim_pool_t *p = to_sim(b)->pool;
    pthread_mutex_lock(&p->mu);
    p->threshold = bytes;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int mt__sim_pool_trim_to(mt_backend_t *b, size_t keep)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->pool->mu);
    (void)release_unused(s, s->pool, keep);
    pthread_mutex_unlock(&s->pool->mu);
    return 0;
}

int mt__sim_pool_usage(mt_backend_t *b, mt_pool_usage_t *out)
{
    sim_pool_t *p = to_sim(b)->pool;
    pthread_mutex_lock(&p->mu);
    *out = (mt_pool_usage_t){.reserved = p->reserved,
                             .used = p->used,
                             .reserved_high = p->reserved_high,
                             .used_high = p->used_high};
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int mt__sim_pool_reset_high(mt_backend_t *b)
{
    sim_pool_t *p = to_sim(b)->pool;
    pthread_mutex_lock(&p->mu);
    p->reserved_high = p->reserved;
    p->used_high = p->used;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

/* ---- test hooks (backend_sim.h) ---- */

int mt__sim_pool_check(const mt_backend_t *b)
{
    if (!mt__sim_is_sim(b))
        return MT_EINVAL;
    sim_pool_t *p = ((const sim_t *)b)->pool;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    size_t reserved = 0, used = 0;
    for (const pchunk_t *c = p->chunks; c != NULL && rc == 0; c = c->next) {
        size_t live = 0;
        uintptr_t at = c->base;
        for (const pblk_t *k = c->blks; k != NULL; k = k->next) {
            if (k->addr != at || k->size == 0 || k->size % POOL_ALIGN != 0)
                rc = MT_EIO;
            if (k->next != NULL && !k->live && !k->next->live && k->sid == SID_ANY &&
                k->next->sid == SID_ANY)
                rc = MT_EIO;
            live += k->live ? k->size : 0;
            at += k->size;
        }
        if (at != c->base + c->size || live != c->live || c->size % POOL_CHUNK != 0)
            rc = MT_EIO;
        reserved += c->size;
        used += c->live;
    }
    if (reserved != p->reserved || used != p->used || p->used > p->reserved ||
        p->reserved > p->reserved_high || p->used > p->used_high)
        rc = MT_EIO;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

size_t mt__sim_pool_chunk_count(const mt_backend_t *b)
{
    if (!mt__sim_is_sim(b))
        return 0;
    sim_pool_t *p = ((const sim_t *)b)->pool;
    size_t n = 0;
    pthread_mutex_lock(&p->mu);
    for (const pchunk_t *c = p->chunks; c != NULL; c = c->next)
        n++;
    pthread_mutex_unlock(&p->mu);
    return n;
}
