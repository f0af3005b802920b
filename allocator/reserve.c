/* Warm-up reservations: cached segments of the reserved pool of a stream, which serve
 * requests of any size on that stream before the pools are searched. A later run whose
 * live transient bytes fit in them therefore never calls the backend's malloc.
 *
 * mt_alloc_reserve(bytes) reserves one new segment of the user's size. A measured
 * warm-up (warmup_begin/end) records its requests in order and plans the reservation
 * offline: every transient allocation (freed within the warm-up) gets an address such
 * that allocations live at the same time never overlap (plan.c, with the lock released). The
 * free room left in the stream's large segments that hold long-lived blocks (weights,
 * optimizer state: typically most of a 20 MiB segment) is offered first; what does not
 * fit there goes to one new segment, as large as the placement's extent (rounded up to
 * 2 MiB). The segments the plan uses become reserved (they keep serving any size on the
 * stream and are never released while the reservation stands).
 *
 * The plan stays with the allocator (mt__plan_t): later requests on the reservation's
 * stream are matched, in order, with the warm-up's allocations, and one that is no
 * larger than its planned block and whose planned place is free is put exactly there.
 * A run that repeats the warm-up's sequence thus reproduces the plan block for block
 * and needs no more than its extent. Any other request (larger than planned, or its
 * place taken, or beyond the sequence) falls back to best fit in the reservation, then
 * to the pools. When no planned block is live but the plan expects some, the run has
 * left the sequence, and a request the first entry takes starts it again (the next
 * iteration of a training loop). Requests on every stream are recorded and placed on
 * the reservation's stream (conservative, like the measured peak). */
#include <stdlib.h>
#include <string.h>

#include "allocator/tcache.h"

/* Slack added to a measured warm-up peak when the sequence could not be recorded (no
 * host memory) and the whole transient peak is reserved instead of a plan: it covers
 * fragmentation inside the reservation under best fit. */
#define WARMUP_SLACK_DIV 32
#define RESERVE_ROUND    ((size_t)2 << 20)

/* ---- the plan's lifetime ---- */

/* Forgets the plan: its blocks become ordinary ones. */
static void plan_drop(mt_alloc_t *a)
{
    mt__plan_t *p = &a->plan;
    if (p->live > 0)
        for (mt_segment_t *s = a->segs; s != NULL; s = s->next)
            for (mt_block_t *b = s->first; b != NULL; b = b->next)
                b->planned = false;
    free(p->ent);
    free(p->segs);
    free(p->taken);
    *p = (mt__plan_t){0};
    mt__plan_bump(a);
}

void mt__plan_fini(mt_alloc_t *a)
{
    plan_drop(a);
}

bool mt__plan_uses(const mt_alloc_t *a, const mt_segment_t *seg)
{
    for (size_t i = 0; i < a->plan.nsegs; i++)
        if (a->plan.segs[i] == seg)
            return true;
    return false;
}

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
        if (mt__plan_uses(a, s))
            plan_drop(a);
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
        mt__alloc_emit_device(a);
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
    if (a->async != NULL)
        return MT_ENOTSUP; /* the pool holds memory, not the allocator */
    mt__alloc_lock(a);
    mt__tc_quiesce(a); /* the reservation sees the threads' cached blocks free */
    if (a->npending > 0)
        mt__alloc_process_events(a);
    int rc = reserve_locked(a, bytes, stream);
    mt__tc_resume(a);
    mt__alloc_unlock(a);
    return rc;
}

int mt_alloc_warmup_begin(mt_alloc_t *a)
{
    if (a == NULL)
        return MT_EINVAL;
    if (a->async != NULL)
        return MT_ENOTSUP; /* a warm-up plans a reservation, which the pool has no use for */
    mt__alloc_lock(a);
    if (a->nroutes > 0) { /* a capture's requests belong to its pool, not to a warm-up plan */
        mt__alloc_unlock(a);
        return MT_EBUSY;
    }
    mt__tc_quiesce(a); /* no thread caches while warming: the warm-up sees every request */
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

/* ---- planning: offline placement of the recorded warm-up ----
 * Items are the warm-up's transient allocations (freed within it), live from their
 * allocation to their free (op indices). Strips are the free blocks of the candidate
 * segments (bounded) and one new segment (unbounded); plan.c places the items. The new
 * segment is the unbounded strip's extent rounded up to RESERVE_ROUND, with no slack: a
 * later run that repeats the sequence lands every block where the plan put it.
 *
 * The placement runs with the lock released (it is O(n log n), but n may be a million):
 * warmup_end takes the recorded sequence and the strips under the lock, plans without it,
 * and installs under the lock if the candidates and their free blocks are still what it
 * planned with; otherwise it plans again from what they are now. */

typedef struct strip_s {
    uint32_t cand;  /* candidate segment index; ncand = the new segment */
    uintptr_t base; /* address of the free block (0 for the new segment) */
} strip_t;

typedef struct build_s {
    /* Taken under the lock (build_strips): what the plan is valid for. */
    mt_segment_t **cand; /* candidate segments, address order */
    uintptr_t *cand_addr;
    size_t ncand;
    strip_t *strips; /* bounded strips, then the new segment */
    size_t *cap;
    size_t nstrips;
    /* Made from the sequence alone, without the lock. */
    mt__plan_item_t *items; /* transient allocations */
    uint32_t *item_ent;     /* per item: its entry (allocation index) */
    size_t nitems;
    uint32_t *ent_of;  /* per op: index of the allocation it is (or frees) */
    uint32_t *free_op; /* per entry: op index of its free, or MT__PLAN_NONE */
    size_t nent;
    uint32_t *left; /* per entry: mt__plan_ent_t.left, for the placement of items */
    bool *anchor;   /* per entry: mt__plan_ent_t.anchor */
    size_t extent;  /* the placement's */
} build_t;

static void strips_free(build_t *bd)
{
    free(bd->cand);
    free(bd->cand_addr);
    free(bd->strips);
    free(bd->cap);
    bd->cand = NULL;
    bd->cand_addr = NULL;
    bd->strips = NULL;
    bd->cap = NULL;
    bd->ncand = bd->nstrips = 0;
}

static void build_free(build_t *bd)
{
    strips_free(bd);
    free(bd->items);
    free(bd->item_ent);
    free(bd->ent_of);
    free(bd->free_op);
    free(bd->left);
    free(bd->anchor);
}

/* Items and lifetimes from the recorded ops (no lock needed). */
static int build_items(build_t *bd, const mt__warm_op_t *ops, size_t nops)
{
    bd->ent_of = malloc((nops + 1) * sizeof *bd->ent_of);
    bd->free_op = malloc((nops + 1) * sizeof *bd->free_op);
    bd->items = malloc((nops + 1) * sizeof *bd->items);
    bd->item_ent = malloc((nops + 1) * sizeof *bd->item_ent);
    if (!bd->ent_of || !bd->free_op || !bd->items || !bd->item_ent)
        return MT_ENOMEM;
    for (size_t i = 0; i < nops; i++) {
        const mt__warm_op_t *op = &ops[i];
        if (op->rsize > 0) {
            bd->ent_of[i] = (uint32_t)bd->nent;
            bd->free_op[bd->nent++] = MT__PLAN_NONE;
        } else {
            bd->ent_of[i] = bd->ent_of[op->of];
            bd->free_op[bd->ent_of[i]] = (uint32_t)i;
        }
    }
    for (size_t i = 0; i < nops; i++) {
        const mt__warm_op_t *op = &ops[i];
        uint32_t k = bd->ent_of[i];
        if (op->rsize == 0 || bd->free_op[k] == MT__PLAN_NONE)
            continue;
        bd->item_ent[bd->nitems] = k;
        bd->items[bd->nitems++] = (mt__plan_item_t){
            .size = (op->rsize + MT__MIN_BLOCK - 1) / MT__MIN_BLOCK * MT__MIN_BLOCK,
            .t0 = (uint32_t)i,
            .t1 = bd->free_op[k],
        };
    }
    return 0;
}

/* The candidates of stream (its reserved segments and its plain large segments), and one
 * bounded strip per free block of theirs, then the unbounded one (lock held). */
static int build_strips(build_t *bd, const mt_alloc_t *a, mt_stream_t *stream)
{
    mt__alloc_assert_owner(a);
    bd->cand = malloc((a->nsegs + 1) * sizeof *bd->cand);
    bd->cand_addr = malloc((a->nsegs + 1) * sizeof *bd->cand_addr);
    if (bd->cand == NULL || bd->cand_addr == NULL)
        return MT_ENOMEM;
    size_t n = 1;
    for (mt_segment_t *s = a->segs; s != NULL; s = s->next)
        if (s->stream == stream && !s->expandable && !s->priv &&
            (s->pool == MT__BP_RESERVED || s->pool == MT__BP_LARGE)) {
            bd->cand_addr[bd->ncand] = s->addr;
            bd->cand[bd->ncand++] = s;
            for (const mt_block_t *b = s->first; b != NULL; b = b->next)
                n += b->state == MT_BLOCK_INACTIVE;
        }
    bd->strips = malloc(n * sizeof *bd->strips);
    bd->cap = malloc(n * sizeof *bd->cap);
    if (!bd->strips || !bd->cap)
        return MT_ENOMEM;
    for (size_t i = 0; i < bd->ncand; i++)
        for (const mt_block_t *b = bd->cand[i]->first; b != NULL; b = b->next)
            if (b->state == MT_BLOCK_INACTIVE) {
                bd->strips[bd->nstrips] = (strip_t){(uint32_t)i, b->addr};
                bd->cap[bd->nstrips++] = b->size;
            }
    bd->strips[bd->nstrips] = (strip_t){(uint32_t)bd->ncand, 0};
    bd->cap[bd->nstrips++] = SIZE_MAX;
    return 0;
}

/* Whether x and y were taken from the same candidates and free blocks. */
static bool strips_same(const build_t *x, const build_t *y)
{
    if (x->ncand != y->ncand || x->nstrips != y->nstrips)
        return false;
    for (size_t i = 0; i < x->ncand; i++)
        if (x->cand[i] != y->cand[i] || x->cand_addr[i] != y->cand_addr[i])
            return false;
    for (size_t i = 0; i < x->nstrips; i++) /* field by field: strip_t has padding */
        if (x->strips[i].cand != y->strips[i].cand || x->strips[i].base != y->strips[i].base ||
            x->cap[i] != y->cap[i])
            return false;
    return true;
}

/* left and anchor of every entry: the recorded sequence swept in order with the placed
 * entries live at each step in an ordered set by (segment, address); k1/k2 give an
 * entry's, k1 = UINT64_MAX for one without a place. */
static int links(build_t *bd, const mt__warm_op_t *ops, size_t nops, const uint64_t *k1,
                 const uint64_t *k2)
{
    mt__pset_t lv;
    if (mt__pset_init(&lv, 64) != 0)
        return MT_ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < nops && rc == 0; i++) {
        uint32_t k = bd->ent_of[i];
        bool alloc = ops[i].rsize > 0;
        if (alloc) {
            bd->anchor[k] = lv.n == 0;
            bd->left[k] = MT__PLAN_NONE;
        }
        if (k1[k] == UINT64_MAX)
            continue;
        if (!alloc) {
            bool ok = mt__pset_erase(&lv, k1[k], k2[k]);
            mt_assert(ok);
            (void)ok;
            continue;
        }
        const mt__pset_node_t *x = mt__pset_below(&lv, k1[k], k2[k]);
        if (x != NULL && x->k1 == k1[k])
            bd->left[k] = (uint32_t)x->val;
        rc = mt__pset_insert(&lv, k1[k], k2[k], k);
    }
    mt__pset_fini(&lv);
    return rc;
}

/* The placement of the items in the strips, and the entries' links by the places it gives
 * (candidate, then address; the new segment's base is not known yet but the order is):
 * everything of the plan that needs no lock. */
static int plan_compute(build_t *bd, const mt__warm_op_t *ops, size_t nops)
{
    int rc = mt__plan_place(bd->items, bd->nitems, bd->cap, bd->nstrips, &bd->extent);
    if (rc != 0)
        return rc;
    uint64_t *k1 = malloc((bd->nent + 1) * sizeof *k1);
    uint64_t *k2 = malloc((bd->nent + 1) * sizeof *k2);
    free(bd->left);
    free(bd->anchor);
    bd->left = malloc((bd->nent + 1) * sizeof *bd->left);
    bd->anchor = malloc((bd->nent + 1) * sizeof *bd->anchor);
    rc = MT_ENOMEM;
    if (k1 != NULL && k2 != NULL && bd->left != NULL && bd->anchor != NULL) {
        for (size_t k = 0; k < bd->nent; k++)
            k1[k] = UINT64_MAX;
        for (size_t i = 0; i < bd->nitems; i++) {
            const mt__plan_item_t *it = &bd->items[i];
            const strip_t *st = &bd->strips[it->strip];
            k1[bd->item_ent[i]] = st->cand;
            k2[bd->item_ent[i]] = st->base + it->off;
        }
        rc = links(bd, ops, nops, k1, k2);
    }
    free(k1);
    free(k2);
    return rc;
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

/* Makes the reservation the placement needs and installs the plan: candidates whose room
 * it uses become (or stay) reservations, earlier reservations it does not use are
 * released, and the unbounded strip becomes a new segment. */
static int plan_commit(mt_alloc_t *a, mt_streamrec_t *sr, build_t *bd, const mt__warm_op_t *ops,
                       size_t nops)
{
    size_t ncand = bd->ncand, extent = bd->extent;
    mt_segment_t **cand = bd->cand;
    mt__plan_t p = {.n = bd->nent, .sr = sr};
    p.ent = calloc(p.n, sizeof *p.ent);
    p.taken = calloc((p.n + 63) / 64, sizeof *p.taken);
    p.segs = malloc((ncand + 1) * sizeof *p.segs);
    uint16_t *segno = malloc((ncand + 1) * sizeof *segno);
    int rc = MT_ENOMEM;
    if (p.ent == NULL || p.taken == NULL || p.segs == NULL || segno == NULL)
        goto fail_host;
    for (size_t i = 0; i <= ncand; i++)
        segno[i] = UINT16_MAX;
    for (size_t i = 0; i < bd->nitems; i++)
        segno[bd->strips[bd->items[i].strip].cand] = 0;
    for (size_t i = 0; i < ncand; i++) {
        mt_segment_t *s = cand[i];
        if (segno[i] == UINT16_MAX || p.nsegs == UINT16_MAX) {
            segno[i] = UINT16_MAX;
            if (s->reserved)
                mt__seg_release(a, s);
            continue;
        }
        if (!s->reserved && (rc = seg_make_reserved(a, sr, s)) != 0)
            goto fail_host;
        mt__alloc_emit(a, MT_EV_RESERVE, s->addr, s->size, 0, sr->sid, MT_POOL_LARGE, 0);
        segno[i] = (uint16_t)p.nsegs;
        p.segs[p.nsegs++] = s;
    }
    uintptr_t new_base = 0;
    if (extent > 0) {
        size_t size = (extent + RESERVE_ROUND - 1) / RESERVE_ROUND * RESERVE_ROUND;
        mt_segment_t *seg = NULL;
        if ((rc = mt__seg_new(a, sr, MT__BP_RESERVED, size, &seg)) != 0) {
            a->st.num_ooms++;
            mt__alloc_oom_report(a, size, size, "warm-up reservation");
            goto fail_host;
        }
        mt__alloc_emit(a, MT_EV_RESERVE, seg->addr, seg->size, extent, sr->sid, MT_POOL_LARGE, 0);
        new_base = seg->addr;
        segno[ncand] = (uint16_t)p.nsegs;
        p.segs[p.nsegs++] = seg;
    }
    bool all = true; /* every item placed (the links were computed for that) */
    for (size_t i = 0; i < bd->nitems; i++) {
        const mt__plan_item_t *it = &bd->items[i];
        const strip_t *st = &bd->strips[it->strip];
        mt__plan_ent_t *e = &p.ent[bd->item_ent[i]];
        if (segno[st->cand] == UINT16_MAX) {
            all = false;
            continue; /* more segments than a plan indexes: left unplanned */
        }
        e->seg = segno[st->cand];
        e->addr = (st->cand == ncand ? new_base : st->base) + it->off;
        e->size = it->size;
    }
    if (!all) { /* links again, by the places the entries got */
        uint64_t *k1 = malloc((p.n + 1) * sizeof *k1), *k2 = malloc((p.n + 1) * sizeof *k2);
        rc = MT_ENOMEM;
        if (k1 != NULL && k2 != NULL) {
            for (size_t k = 0; k < p.n; k++) {
                k1[k] = p.ent[k].addr != 0 ? p.ent[k].seg : UINT64_MAX;
                k2[k] = p.ent[k].addr;
            }
            rc = links(bd, ops, nops, k1, k2);
        }
        free(k1);
        free(k2);
        if (rc != 0)
            goto fail_host;
    }
    for (size_t k = 0; k < p.n; k++) {
        p.ent[k].left = bd->left[k];
        p.ent[k].anchor = bd->anchor[k];
    }
    free(segno);
    while (p.first < p.n && p.ent[p.first].addr == 0)
        p.first++;
    p.cursor = p.first;
    if (p.nsegs == 0 || p.first == p.n) {
        free(p.ent);
        free(p.taken);
        free(p.segs);
        return 0;
    }
    a->plan = p;
    mt__plan_bump(a);
    return 0;

fail_host:
    free(segno);
    free(p.ent);
    free(p.taken);
    free(p.segs);
    return rc;
}

/* Unlocked passes tried before the plan is made with the lock held: each ends in vain only
 * when another thread changed the candidates' free blocks meanwhile. */
#define PLAN_TRIES 3

/* Plans and makes the reservation of the recorded warm-up ops[0..nops) on stream (see the
 * top of the file), lock held on entry and on return, released while placing. */
static int warmup_plan(mt_alloc_t *a, mt_stream_t *stream, const mt__warm_op_t *ops, size_t nops)
{
    mt_streamrec_t *sr = mt__alloc_streamrec(a, stream);
    if (sr == NULL)
        return MT_ENOMEM;
    build_t bd = {0}, now = {0};
    int rc = build_strips(&bd, a, stream);
    for (int tries = 0; rc == 0; tries++) {
        bool unlocked = tries < PLAN_TRIES;
        if (unlocked) {
            mt__alloc_unlock(a);
            /* Called without the lock, unlike the allocator's other messages. */
            mt__alloc_log(a, MT_LOG_DEBUG,
                          "memtrace: planning a warm-up of %zu operations with the lock "
                          "released",
                          nops);
        }
        if (tries == 0)
            rc = build_items(&bd, ops, nops);
        if (rc == 0)
            rc = plan_compute(&bd, ops, nops);
        if (unlocked)
            mt__alloc_lock(a);
        if (!unlocked || rc != 0)
            break;
        strips_free(&now);
        if ((rc = build_strips(&now, a, stream)) != 0 || strips_same(&bd, &now))
            break;
        /* The free blocks changed while planning: plan again with what they are now. */
        strips_free(&bd);
        bd.cand = now.cand;
        bd.cand_addr = now.cand_addr;
        bd.ncand = now.ncand;
        bd.strips = now.strips;
        bd.cap = now.cap;
        bd.nstrips = now.nstrips;
        now = (build_t){0};
    }
    if (rc != 0)
        goto out;
    if (bd.extent > a->limit) {
        rc = MT_ENOMEM;
        goto out;
    }
    plan_drop(a); /* before any of its segments goes */
    rc = plan_commit(a, sr, &bd, ops, nops);
out:
    build_free(&now);
    build_free(&bd);
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
    if (a->async != NULL)
        return MT_ENOTSUP;
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
        /* The sequence is this call's while it plans with the lock released (a warm-up
         * begun meanwhile records into a new one). */
        mt__warm_op_t *ops = a->wops;
        size_t nops = a->nwops;
        a->wops = NULL;
        a->nwops = a->cap_wops = 0;
        rc = warmup_plan(a, stream, ops, nops);
        if (a->wops == NULL) { /* kept for the next warm-up */
            a->wops = ops;
            a->cap_wops = nops;
        } else {
            free(ops);
        }
        if (rc != MT_ENOMEM)
            goto out;
        /* No host memory to plan, or no room found below the limit: the whole peak. */
    }
    size_t persist = persistent_bytes(a);
    size_t peak = (size_t)a->warm_peak;
    size_t transient = peak > persist ? peak - persist : 0;
    rc = transient > 0 ? reserve_locked(a, transient + transient / WARMUP_SLACK_DIV, stream) : 0;
out:
    if (!a->warming)
        a->nwops = 0;
    mt__tc_resume(a); /* on again unless a plan is in force */
    mt__alloc_unlock(a);
    return rc;
}
