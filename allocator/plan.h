/* The warm-up plan of the caching allocator (reserve.c records a warm-up and makes its
 * plan, plan.c places it, plan_follow.c follows it): the plan's types and calls. internal.h
 * includes this header; the inline functions that change the plan's state in the allocator
 * (mt__plan_bump, mt__plan_freed) live there, beside struct mt_alloc_s. */
#ifndef MT_ALLOCATOR_PLAN_H
#define MT_ALLOCATOR_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memtrace/alloc.h"

typedef struct mt_block_s mt_block_t;
typedef struct mt_segment_s mt_segment_t;
typedef struct mt_streamrec_s mt_streamrec_t;

/* One request of a warm-up, in order: an allocation of rsize bytes (its index is the
 * block's wid), or, when rsize = 0, the free of the allocation at index `of`. */
typedef struct mt__warm_op_s {
    size_t rsize;
    uint32_t of;
} mt__warm_op_t;

/* The warm-up plan (reserve.c): where each allocation of the last recorded warm-up goes in
 * its reservation, so that a later run repeating the warm-up's requests lands every block
 * where the offline placement put it. ent[k] is the k-th allocation of the warm-up; a run
 * takes them in order from the cursor, one per request on the plan's stream.
 * Invariants: n = 0 <=> sr = NULL <=> nsegs = 0; n > 0 => first, cursor < n and
 * ent[first].addr != 0, ent[cursor].addr != 0 (first: the lowest such entry); ntaken = number of
 * bits set in taken, each for an entry < n with addr != 0; every segs[i] is a segment of a->segs
 * with reserved set and stream = sr->stream; ent[k].addr != 0 => ent[k].seg < nsegs, [addr, addr +
 * size) lies in segs[ent[k].seg], size is a multiple of MT__ALIGN and >= MT__MIN_BLOCK; ent[k].left
 * != MT__PLAN_NONE => ent[left].addr != 0, same seg, ent[left].addr + ent[left].size <=
 * ent[k].addr; live = number of blocks with planned set; each is ACTIVE_ALLOCATED in one of segs.
 */
#define MT__PLAN_NONE UINT32_MAX
typedef struct mt__plan_ent_s {
    uintptr_t addr; /* planned device address; 0 = not placed (kept past the warm-up) */
    size_t size;    /* planned bytes: the rounded request, rounded up to MT__MIN_BLOCK */
    uint32_t left;  /* entry whose planned block ends nearest below addr while this one is
                     * allocated (a start for finding its free block), or MT__PLAN_NONE */
    uint16_t seg;   /* index into segs */
    bool anchor;    /* no planned block is live just before it (an iteration may start here) */
} mt__plan_ent_t;

typedef struct mt__plan_s {
    mt__plan_ent_t *ent; /* n entries, in the warm-up's allocation order */
    size_t n;            /* entries; 0 = no plan */
    size_t first;        /* first entry with a place: where a pass starts */
    size_t cursor;       /* entry after the last one taken: the next request's */
    uint64_t *taken;     /* bit k: ent[k] was taken in this pass over the sequence */
    size_t ntaken;       /* bits set in taken */
    size_t live;         /* blocks placed by the plan and still allocated */
    mt_streamrec_t *sr;  /* the reservation's stream */
    mt_segment_t **segs; /* segments the plan places into, nsegs of them */
    size_t nsegs;
} mt__plan_t;

/* One item of the offline placement (plan.c): live at times t0 <= t < t1, size bytes;
 * placed at offset off of strip `strip`. */
typedef struct mt__plan_item_s {
    size_t size;     /* bytes, > 0 */
    size_t off;      /* out: offset in the strip */
    uint32_t t0, t1; /* lifetime in op indices, t0 < t1 */
    uint32_t strip;  /* out: strip index */
} mt__plan_item_t;

/* ---- reserve.c ---- */
/* Appends an allocation (b just allocated, rounded request rsize) / the free of b to the
 * warm-up's recorded sequence; only called while a->warming. */
void mt__warm_record_alloc(mt_alloc_t *a, mt_block_t *b, size_t rsize);
void mt__warm_record_free(mt_alloc_t *a, const mt_block_t *b);
/* Frees the plan (destroy). */
void mt__plan_fini(mt_alloc_t *a);
/* seg is one of the plan's segments. */
bool mt__plan_uses(const mt_alloc_t *a, const mt_segment_t *seg);

/* ---- plan_follow.c ---- */
/* The cached block the plan gives a request of rsize bytes on sr (inactive, in the bins,
 * starting at the planned address), or NULL: no plan for sr, the request differs from
 * the planned one, or its place is taken. Advances the plan's cursor. *front: the free
 * block split off below it, out of the bins until the caller has made the returned
 * block active (then mt__seg_bin_in), or NULL; *entry: the entry taken. */
mt_block_t *mt__plan_take(mt_alloc_t *a, mt_streamrec_t *sr, size_t rsize, mt_block_t **front,
                          size_t *entry);
/* Whether a free of the block just taken for entry k, then a request of rsize bytes on the
 * plan's stream, would give that block again with the plan's state as it is now (free
 * space unchanged): a pair a thread cache may then repeat without the lock. */
bool mt__plan_repeats(const mt_alloc_t *a, size_t k, size_t rsize);
/* The plan's invariants (mt__plan_t); a static description of the first violation or NULL. */
const char *mt__plan_check(const mt_alloc_t *a);

/* ---- plan.c ---- */
/* Entries (and blocks) of its index the greedy placement may visit or move per item and
 * per factor of two of n, both orders together, before it gives up for the sweep (plan.c). */
#define MT__PLAN_WORK 1024
/* ... plus this many whatever n: small sequences whose blocks mostly live at once
 * (somas_pangu_2.6B: 18 692 allocations, 0.6 G entries) keep the greedy's plan, as they
 * did when it scanned every placed item; a few seconds at most. */
#define MT__PLAN_WORK_MIN ((uint64_t)1 << 32)
/* Places items[0..n) in strips 0..nstrips-1: strips below nstrips - 1 hold cap[s] bytes,
 * the last is unbounded; *extent = bytes used of the last. 0 or MT_ENOMEM (host memory).
 * Item sizes are multiples of MT__MIN_BLOCK, and so are the offsets given. */
int mt__plan_place(mt__plan_item_t *items, size_t n, const size_t *cap, size_t nstrips,
                   size_t *extent);
/* The strategies of mt__plan_place, one at a time (tests and the bench compare them).
 * The greedy orders give up with MT_EAGAIN once they visited more than `budget` entries of
 * their index (mt__plan_budget(n): O(n log n) plus a constant; UINT64_MAX: never); *work
 * (NULL: not wanted) = the entries both orders visited and moved, also on MT_EAGAIN. */
int mt__plan_place_greedy(mt__plan_item_t *items, size_t n, const size_t *cap, size_t nstrips,
                          size_t *extent, uint64_t budget, uint64_t *work);
int mt__plan_place_sweep(mt__plan_item_t *items, size_t n, const size_t *cap, size_t nstrips,
                         size_t *extent);
static inline uint64_t mt__plan_budget(size_t n)
{
    uint64_t lg = 1;
    while (lg < 64 && ((uint64_t)1 << lg) < n)
        lg++;
    return MT__PLAN_WORK * (uint64_t)n * lg + MT__PLAN_WORK_MIN;
}

/* ---- pset.c: an ordered set of (k1, k2) keys with a value, for the planner ----
 * Invariants: the nodes reachable from root are a treap: in-order by (k1, k2), which are
 * unique; a node's pri >= its children's; max = the largest val of its subtree; n of them. */
typedef struct mt__pset_node_s {
    uint64_t k1, k2;
    uint64_t val, max;
    uint32_t l, r; /* children, 0 = none (node 0 is never used) */
    uint32_t pri;
} mt__pset_node_t;
typedef struct mt__pset_s {
    mt__pset_node_t *v; /* nodes 1..used (freed ones linked by l from free) */
    size_t cap, n;
    uint32_t root, used, free, rng;
} mt__pset_t;
int mt__pset_init(mt__pset_t *t, size_t hint);
void mt__pset_fini(mt__pset_t *t);
/* Adds a key not in the set. 0 or MT_ENOMEM. Node pointers given out before are stale. */
int mt__pset_insert(mt__pset_t *t, uint64_t k1, uint64_t k2, uint64_t val);
/* Removes the key; false if it was not there. */
bool mt__pset_erase(mt__pset_t *t, uint64_t k1, uint64_t k2);
/* The node of the smallest key >= (k1, k2) / of the largest key < (k1, k2), or NULL. */
const mt__pset_node_t *mt__pset_ceil(const mt__pset_t *t, uint64_t k1, uint64_t k2);
const mt__pset_node_t *mt__pset_below(const mt__pset_t *t, uint64_t k1, uint64_t k2);
/* The node of the smallest key whose val >= bound, or NULL. */
const mt__pset_node_t *mt__pset_first_val(const mt__pset_t *t, uint64_t bound);

#endif
