/* Quick lists: blocks freed on their own stream kept whole, by exact size, for an
 * immediate same-size reuse (glibc's tcache, jemalloc's tcache bins), so that the common
 * alloc/free cycle of one size costs neither a bin search, a split, a merge nor a hash
 * update. The layout and invariants are in internal.h (mt__qslot_t, mt_binset_t, runs).
 *
 * A quick block is free but not merged. The inactive_split stats describe the merged
 * state: each run of free blocks counts once. mt__seg_bin_in/out count inactive blocks
 * one by one, which agrees with that for a run of one block; runs of several blocks hold a
 * quick block and change only here, where each operation is one logical step: the stats
 * of the runs it touches are taken off before and put back after (run_stats). */
#include "allocator/tcache.h"

static bool is_free(const mt_block_t *b)
{
    return b != NULL && (b->state == MT_BLOCK_INACTIVE || b->state == MT__BLOCK_QUICK);
}

size_t mt__quick_run(const mt_block_t *b, const mt_block_t **first)
{
    while (is_free(b->prev))
        b = b->prev;
    if (first != NULL)
        *first = b;
    size_t n = 0;
    for (; is_free(b); b = b->next)
        n += b->size;
    return n;
}

/* The inactive_split contribution of the run through free block b: (1, bytes) when the
 * run has a non-free neighbour, else (0, 0). */
typedef struct {
    int64_t n, bytes;
} runstat_t;

static runstat_t run_stats(const mt_block_t *b)
{
    const mt_block_t *first;
    size_t bytes = mt__quick_run(b, &first);
    bool split = first->prev != NULL || first->addr + bytes != b->seg->addr + b->seg->size;
    return split ? (runstat_t){1, (int64_t)bytes} : (runstat_t){0, 0};
}

/* Contribution of the runs next to a block that is not free (its two sides). */
static runstat_t side_stats(const mt_block_t *b)
{
    runstat_t r = {0, 0};
    if (is_free(b->prev))
        r = run_stats(b->prev);
    if (is_free(b->next)) {
        runstat_t n = run_stats(b->next);
        r.n += n.n;
        r.bytes += n.bytes;
    }
    return r;
}

/* inactive_split moves from `from` to `to` in one step (peak and totals as one change). */
static void split_move(mt_alloc_t *a, int bp, runstat_t from, runstat_t to)
{
    int sp = mt__stat_pool(bp);
    if (to.n > from.n)
        mt__stat_inc2(a->st.inactive_split, sp, to.n - from.n);
    else if (to.n < from.n)
        mt__stat_sub2(a->st.inactive_split, sp, from.n - to.n);
    if (to.bytes > from.bytes)
        mt__stat_inc2(a->st.inactive_split_bytes, sp, to.bytes - from.bytes);
    else if (to.bytes < from.bytes)
        mt__stat_sub2(a->st.inactive_split_bytes, sp, from.bytes - to.bytes);
}

/* The runs on both sides of b (b itself not counted): bytes of free blocks before and
 * after it, and the split contributions of those two runs apart (b not free) and of the
 * one run they form with b (b free). One walk each way, for the quick path. */
static inline void around(const mt_block_t *b, runstat_t *apart, runstat_t *joined)
{
    int64_t left = 0, right = 0;
    const mt_block_t *x = b->prev, *first = b;
    for (; is_free(x); x = x->prev)
        left += (int64_t)x->size, first = x;
    const mt_block_t *last = b;
    for (x = b->next; is_free(x); x = x->next)
        right += (int64_t)x->size, last = x;
    *apart = (runstat_t){(left > 0) + (right > 0), left + right};
    bool whole = first->prev == NULL && last->next == NULL;
    *joined = whole ? (runstat_t){0, 0} : (runstat_t){1, left + right + (int64_t)b->size};
}

/* ---- the lists ---- */

static void list_push(mt_binset_t *bs, mt_block_t *b)
{
    unsigned i = mt__quick_slot(b->size);
    mt__qslot_t *q = &bs->quick[i];
    mt_assert(q->n == 0 || (q->size == b->size && q->n < MT__QDEPTH));
    mt__tc_bump(bs->sr);
    b->bin_prev = NULL;
    b->bin_next = q->head;
    if (q->head != NULL)
        q->head->bin_prev = b;
    q->head = b;
    q->size = b->size;
    q->n++;
    bs->qmap |= (uint64_t)1 << i;
    bs->nquick++;
}

static void list_remove(mt_binset_t *bs, mt_block_t *b)
{
    unsigned i = mt__quick_slot(b->size);
    mt__qslot_t *q = &bs->quick[i];
    mt_assert(q->n > 0 && q->size == b->size && b->state == MT__BLOCK_QUICK);
    mt__tc_bump(bs->sr);
    if (b->bin_prev != NULL)
        b->bin_prev->bin_next = b->bin_next;
    else
        q->head = b->bin_next;
    if (b->bin_next != NULL)
        b->bin_next->bin_prev = b->bin_prev;
    b->bin_prev = b->bin_next = NULL;
    if (--q->n == 0)
        bs->qmap &= ~((uint64_t)1 << i);
    bs->nquick--;
}

/* No bin of bs in classes [c0, c1] holds a block, but `except` alone in its class. */
static bool classes_empty(const mt_binset_t *bs, unsigned c0, unsigned c1, const mt_block_t *except)
{
    for (unsigned r = c0 / MT__SL_N; r <= c1 / MT__SL_N; r++) {
        if (((bs->row_map >> r) & 1) == 0)
            continue;
        uint32_t m = bs->cls_map[r];
        if (r == c0 / MT__SL_N)
            m &= ~0u << (c0 % MT__SL_N);
        if (r == c1 / MT__SL_N && c1 % MT__SL_N != MT__SL_N - 1)
            m &= (2u << (c1 % MT__SL_N)) - 1;
        for (; m != 0; m &= m - 1) {
            const mt_block_t *h = bs->heads[r * MT__SL_N + (unsigned)__builtin_ctz(m)];
            if (h != except || h->bin_next != NULL)
                return false;
        }
    }
    return true;
}

/* ---- keep, take, dissolve, flush ---- */

bool mt__quick_push(mt_alloc_t *a, mt_block_t *b)
{
    mt__alloc_assert_owner(a);
    mt_assert(b->state == MT_BLOCK_ACTIVE_PENDING_FREE && b->npending == 0 && b->nuses == 0);
    mt_assert(!b->split_counted && !a->warming);
    /* Kept only where a later take can be what the bins would give (mt__quick_take):
     * nothing free before it; a free run may follow. */
    if (is_free(b->prev))
        return false;
    runstat_t apart, joined;
    around(b, &apart, &joined);
    int bp = b->seg->pool, sp = mt__stat_pool(bp);
    mt__stat_sub2(a->st.active_bytes, sp, (int64_t)b->size);
    mt__stat_sub2(a->st.active, sp, 1);
    b->state = MT__BLOCK_QUICK;
    b->requested = 0;
    list_push(b->seg->bins, b);
    a->nquick++;
    split_move(a, bp, apart, joined);
    b->seg->last_used = ++a->clock;
    return true;
}

mt_block_t *mt__quick_take(mt_alloc_t *a, mt_streamrec_t *sr, int bp, size_t rsize)
{
    mt__alloc_assert_owner(a);
    mt_binset_t *bs = sr->bins[bp];
    unsigned i = mt__quick_slot(rsize);
    if (bs->quick[i].n == 0 || bs->quick[i].size != rsize)
        return NULL;
    mt_block_t *b = bs->quick[i].head;
    /* Only the block the bins would give: with b merged into its free tail (if any),
     * best fit finds nothing in the classes from rsize's to the merged block's but it. */
    const mt_block_t *tail = is_free(b->next) ? b->next : NULL;
    size_t merged = rsize + (tail != NULL ? tail->size : 0);
    if (merged >= a->cfg.max_split_size ||
        !classes_empty(bs, mt__bin_class(rsize), mt__bin_class(merged), tail))
        return NULL;
    runstat_t apart, joined;
    around(b, &apart, &joined);
    list_remove(bs, b);
    a->nquick--;
    split_move(a, b->seg->pool, joined, apart); /* the runs beside it now stand alone */
    return b;
}

/* Saved inactive_split stats: merging quick blocks changes no run, so the stats after
 * are the ones before (mt__seg_bin_in/out move them meanwhile). */
typedef struct {
    mt_stat_t n[MT_STAT_N], bytes[MT_STAT_N];
} splitsave_t;

static void split_save(const mt_alloc_t *a, splitsave_t *s)
{
    for (int i = 0; i < MT_STAT_N; i++) {
        s->n[i] = a->st.inactive_split[i];
        s->bytes[i] = a->st.inactive_split_bytes[i];
    }
}

static void split_restore(mt_alloc_t *a, const splitsave_t *s)
{
    for (int i = 0; i < MT_STAT_N; i++) {
        a->st.inactive_split[i] = s->n[i];
        a->st.inactive_split_bytes[i] = s->bytes[i];
    }
}

/* Quick block b becomes inactive, merged with its inactive neighbours, in the bins. */
static mt_block_t *unquick(mt_alloc_t *a, mt_block_t *b)
{
    list_remove(b->seg->bins, b);
    a->nquick--;
    mt__addrmap_del(&a->map, b->addr);
    b->state = MT_BLOCK_INACTIVE;
    b = mt__seg_merge(a, b);
    mt__seg_bin_in(a, b);
    return b;
}

mt_block_t *mt__quick_dissolve(mt_alloc_t *a, mt_block_t *b)
{
    mt__alloc_assert_owner(a);
    mt_assert(is_free(b));
    while (is_free(b->prev))
        b = b->prev;
    /* Left to right: each quick block merges with the inactive one before it. */
    for (;;) {
        if (b->state == MT__BLOCK_QUICK)
            b = unquick(a, b); /* b may be gone: merged into the block before it */
        if (!is_free(b->next))
            break;
        b = b->next;
    }
    mt_assert(b->state == MT_BLOCK_INACTIVE && !is_free(b->prev));
    return b;
}

static runstat_t region_stats(const mt_block_t *b)
{
    return is_free(b) ? run_stats(b) : side_stats(b);
}

void mt__quick_step_begin(mt_alloc_t *a, const mt_block_t *b, mt__qstep_t *st)
{
    mt__alloc_assert_owner(a);
    splitsave_t *s = (splitsave_t *)st->save;
    _Static_assert(sizeof st->save >= sizeof(splitsave_t), "room for the saved stats");
    split_save(a, s);
    runstat_t r = region_stats(b);
    st->n = r.n;
    st->bytes = r.bytes;
}

void mt__quick_step_end(mt_alloc_t *a, const mt_block_t *b, const mt__qstep_t *st)
{
    mt__alloc_assert_owner(a);
    split_restore(a, (const splitsave_t *)st->save);
    split_move(a, b->seg->pool, (runstat_t){st->n, st->bytes}, region_stats(b));
}

void mt__quick_flush(mt_alloc_t *a, mt_binset_t *bs)
{
    mt__alloc_assert_owner(a);
    if (bs->nquick == 0)
        return;
    splitsave_t save;
    split_save(a, &save);
    while (bs->qmap != 0)
        unquick(a, bs->quick[__builtin_ctzll(bs->qmap)].head);
    split_restore(a, &save);
}

void mt__quick_flush_all(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    if (a->nquick == 0)
        return;
    splitsave_t save;
    split_save(a, &save);
    for (size_t i = 0; i < a->nstreams; i++) {
        for (int bp = 0; bp < MT__BP_N; bp++) {
            mt_binset_t *bs = a->streams[i]->bins[bp];
            while (bs != NULL && bs->qmap != 0)
                unquick(a, bs->quick[__builtin_ctzll(bs->qmap)].head);
        }
    }
    split_restore(a, &save);
    mt_assert(a->nquick == 0);
}

size_t mt__quick_largest(const mt_alloc_t *a)
{
    size_t best = 0;
    for (size_t i = 0; i < a->nstreams && a->nquick > 0; i++) {
        for (int bp = 0; bp < MT__BP_N; bp++) {
            const mt_binset_t *bs = a->streams[i]->bins[bp];
            for (uint64_t m = bs != NULL ? bs->qmap : 0; m != 0; m &= m - 1) {
                const mt__qslot_t *q = &bs->quick[__builtin_ctzll(m)];
                for (const mt_block_t *b = q->head; b != NULL; b = b->bin_next) {
                    size_t r = mt__quick_run(b, NULL);
                    best = r > best ? r : best;
                }
            }
        }
    }
    return best;
}

const char *mt__quick_check(const mt_alloc_t *a, const mt_binset_t *bs, size_t *n)
{
    size_t total = 0;
    if (a->warming && bs->nquick != 0)
        return "quick blocks kept while warming";
    if (bs->sr->bins[MT__BP_RESERVED] != NULL && bs->nquick != 0)
        return "quick blocks kept on a stream with a warm-up reservation";
    for (unsigned i = 0; i < MT__QSLOTS; i++) {
        const mt__qslot_t *q = &bs->quick[i];
        if (((bs->qmap >> i) & 1) != (q->n > 0))
            return "quick slot bitmap disagrees with its list";
        if (q->n > MT__QDEPTH || (q->n > 0 && mt__quick_slot(q->size) != i))
            return "quick slot over its depth or holding a size of another slot";
        uint32_t len = 0;
        const mt_block_t *prev = NULL;
        for (const mt_block_t *b = q->head; b != NULL; prev = b, b = b->bin_next) {
            if (++len > q->n)
                return "quick list longer than its count";
            if (b->bin_prev != prev)
                return "quick list's back link broken";
            if (b->state != MT__BLOCK_QUICK || b->seg->bins != bs || b->size != q->size)
                return "quick list holds a block of another state, binset or size";
            if (b->seg->expandable)
                return "quick block in an expandable run";
            if (b->requested != 0 || b->nuses != 0 || b->npending != 0 || b->split_counted)
                return "quick block with a request, uses, pending events or a split count";
        }
        if (len != q->n)
            return "quick list shorter than its count";
        total += len;
    }
    if (total != bs->nquick)
        return "binset's quick count disagrees with its lists";
    *n += total;
    return NULL;
}
