/* The model's structs, shared by its files (model.c: events, blocks, tags, gaps;
 * model_stale.c: the uncertain blocks by address; model_big.c: uncertain items by size;
 * model_figures.c: its figures and map as read; model_segs.c: the segment map and free
 * extents; model_growth.c: iterations). */
#ifndef MT_ANALYSIS_MODEL_INTERNAL_H
#define MT_ANALYSIS_MODEL_INTERNAL_H

#include "analysis/model.h"
#include "util/addrmap.h"
#include "util/btree.h"
#include "util/segmap.h"

/* Exact sums: a class has at most MT_EVENT_SOURCES sources and any number of blocks of
 * up to 2^64 - 1 bytes; 128 bits hold every sum the model keeps, and figures saturate to
 * 64 bits only when they are read (mt__model_sat). */
typedef unsigned __int128 mt__u128;

static inline uint64_t mt__model_sat(mt__u128 v)
{
    return v > UINT64_MAX ? UINT64_MAX : (uint64_t)v;
}

/* A checker's step (the model's files' *_check): when cond fails, the message goes to
 * why[whylen] (when given) and the checker returns MT_EPROTO. */
#define MT__MCHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (why && whylen)                                                                     \
                snprintf(why, whylen, __VA_ARGS__);                                                \
            return MT_EPROTO;                                                                      \
        }                                                                                          \
    } while (0)

/* A live block (alloc seen, free_completed not), in its class's dense array, found by addr
 * through the class's address table. */
typedef struct mt__mblock_s {
    uint64_t addr, size; /* bytes */
    uint64_t requested;  /* bytes the alloc asked for, <= size; 0 unknown */
    uint32_t sidx;       /* its stack's index in the model's stacks (model_stacks.c); 0 = id 0,
                            MT__SIDX_NONE = counted in no stack's figures */
    uint8_t tag;         /* < MT_TAG_MAX */
    uint8_t pool;        /* mt_pool_e */
    uint8_t pending;     /* free requested: no longer allocated, still occupying */
    uint8_t uncertain;   /* live before a gap, not seen since: its free may be lost */
    uint64_t t_alloc;    /* ns, its alloc's time_ns (0 unknown) */
} mt__mblock_t;

#define MT__SIDX_NONE UINT32_MAX

typedef struct mt__mstacks_s mt__mstacks_t;

typedef struct mt__range_s {
    uint64_t addr, size;
} mt__range_t;

struct mt__mclass_s;

/* The uncertain items of one kind (blocks, segments) of a class as a max-heap by size
 * (model_big.c), so that those larger than a room are found from the largest down: a walk
 * of every one at each event that lowers the room is quadratic when they go a few at a time.
 * What tells the kinds apart (model_stale.c's blocks, model_segs.c's segments): */
typedef struct mt__mbig_kind_s {
    /* whether r is the record of an item the heap must hold (not one since gone, settled,
     * resized or cut) */
    bool (*current)(const struct mt__mclass_s *c, mt__range_t r);
    /* a bound on the current items: the room a rebuild takes, its measure of garbage */
    size_t (*bound)(const struct mt__mclass_s *c);
    /* writes the records of the current items to out (room for bound of them): how many */
    size_t (*fill)(const struct mt__mclass_s *c, mt__range_t *out);
} mt__mbig_kind_t;

/* Invariants (mt__model_big_check): n <= cap; !lost => h[0..n) is a max-heap by (size,
 * addr) holding the record of every current item (and maybe records no longer current,
 * dropped when they reach the top, or all at once when n > 2 bound + 64). */
typedef struct mt__mbig_s {
    mt__range_t *h; /* cap allocated */
    size_t n, cap;
    bool lost; /* a record could not be added: not used until made anew from the items */
} mt__mbig_t;

/* One class of memory (device, or pinned host).
 * Invariants (mt__model_check):
 *   blocks[0..live) distinct addresses; at maps each non-zero addr to its index (util/addrmap.h
 *   invariants), zero names the one at address 0 (a malformed log's), at.n + (zero != 0) =
 *   live; live <= cap;
 *   known = sum_t tag_bytes[t]; unc = sum_t unc_bytes[t];
 *   tag_bytes[t] = sum size over live, !pending, !uncertain blocks of tag t; tag_blocks[t] = #;
 *   unc_bytes[t] = sum size over live, !pending, uncertain blocks of tag t; unc_blocks[t] = #;
 *   pool_bytes[p] = sum size over live, !pending, !uncertain blocks of pool p;
 *   tag_peak[t] >= min(tag_bytes[t], UINT64_MAX);
 *   nuncertain = #live uncertain blocks, blocks[0..nuncertain) (the rest certain);
 *   stale holds util/btree.h's invariants, its records (addr, size) keyed by addr, and
 *   stale = {(b.addr, b.size) : b in blocks[0..nuncertain)} (stale.n = nuncertain: no
 *   record of a block freed, settled or certain); unc_max >= size of every live, !pending,
 *   uncertain block; big holds mt__mbig_t's invariants, its current items the live,
 *   !pending, uncertain blocks b, as (b.addr, b.size);
 *   segs holds util/segmap.h's invariants (sorted, disjoint, its byte sums);
 *   seg_unc_max >= size of every uncertain seg; seg_big holds mt__mbig_t's invariants, its
 *   current items the uncertain segments s with s.addr < 2^64 - 1, as (s.addr, s.size);
 *   the certain segments at 2^64 - 1 are a prefix of segs.top (top[0..j) certain, the rest
 *   uncertain, for some j);
 *   seg_new_ok => every certain segment s below 2^64 - 1 has s.addr in seg_new[0..nseg_new)
 *   (every seg_new[i] < 2^64 - 1); nseg_new <= seg_new_cap; !seg_new_ok => nseg_new = 0;
 *   fr NULL or holding model_free.c's invariants;
 *   asum/rsum = sum over the model's devices v of v.alloc[h]/v.res[h] (h = 1 for the host
 *   class, 0 for the device class: the class's sources);
 *   peak_alloc >= sat(asum), peak_res >= sat(rsum). */
typedef struct mt__mclass_s {
    mt__u128 asum, rsum;             /* bytes, exact sums of the sources' latest totals */
    uint64_t peak_alloc, peak_res;   /* bytes, saturated */
    mt__mblock_t *blocks;            /* live entries, uncertain first; cap allocated */
    size_t cap, live;                /* entries */
    mt__amap_t at;                   /* addr -> index in blocks, for addr != 0 */
    size_t zero;                     /* 1 + index of the block at address 0; 0 = none */
    mt__u128 tag_bytes[MT_TAG_MAX];  /* known live bytes by tag */
    uint32_t tags_held;              /* bit t: a known block of tag t was counted; tag_bytes
                                      * of every tag not set is 0 */
    uint64_t tag_blocks[MT_TAG_MAX]; /* known live blocks by tag */
    uint64_t tag_peak[MT_TAG_MAX];   /* bytes, saturated */
    mt__u128 unc_bytes[MT_TAG_MAX];  /* uncertain bytes by tag */
    uint64_t unc_blocks[MT_TAG_MAX]; /* uncertain blocks by tag */
    mt__u128 pool_bytes[4];          /* known live bytes by pool */
    mt__u128 known, unc;             /* sums of tag_bytes, unc_bytes */
    uint64_t unc_max;                /* bytes, bound on an uncertain block's size */
    size_t nuncertain;               /* FULL uncertain blocks (pending ones too) */
    /* the uncertain blocks' (addr, size) records by addr (model_stale.c) */
    mt__bt_t stale;
    /* the same of the !pending ones as a max-heap by size, with records of blocks since
     * gone, settled or resized left in (model_stale.c) */
    mt__mbig_t big;
    mt__segmap_t segs;      /* the segment map, shared with the recorder's OOM snapshot */
    struct mt__mfree_s *fr; /* the free extents kept (model_free.c); NULL: not kept */
    uint64_t seg_unc_max;   /* bytes, bound on an uncertain segment's size */
    /* the uncertain segments below 2^64 - 1 as a max-heap by size, with records of
     * segments since gone, settled or cut left in (model_segs.c) */
    mt__mbig_t seg_big;
    uint64_t unmatched_frees; /* frees of blocks never seen allocated */
    bool had_gap;             /* a gap happened (figures may be uncertain) */
    /* The starts of the segments made or made certain since the last gap (and maybe of some
     * since gone), so that a gap marks those, not every segment (model_segs.c); seg_new_ok
     * false: not kept (before the first gap, or grown past their bound), the next gap walks
     * every segment. */
    uint64_t *seg_new;
    size_t nseg_new, seg_new_cap;
    bool seg_new_ok;
    /* call stacks (model_stacks.c): the model's table, this class's index in it, the
     * count of times allocated rose to a new peak (per-stack peak figures are taken
     * lazily against it), and the stack of the alloc being applied */
    mt__mstacks_t *stk;
    int k;
    uint64_t peak_ep;
    uint32_t next_sidx;
    /* temporary allocations (model_temp.c): NULL until the first one, or when not tracked */
    struct mt__mtemp_s *tmp;
    uint64_t tmp_window_us; /* µs, the model's cfg.temporary_window_us */
    uint64_t t_known;       /* ns: blocks allocated before it have no lifetime (0: all do) */
} mt__mclass_t;

/* One device's memory outside the allocator (model_outside.c).
 * Invariants: libs = sum lib[]; lib_peak[i] >= lib[i]; peak_used >= used; before the first
 * MT_EV_DEVICE (seen false) used = context = 0. */
typedef struct mt__mdev_s {
    bool seen;                     /* an MT_EV_DEVICE arrived */
    uint64_t used, total;          /* bytes, its latest */
    uint64_t peak_used;            /* bytes */
    uint64_t context;              /* bytes used at the first figure, less what events named
                                      (and, with self known, less other processes') */
    uint64_t self;                 /* bytes this process holds, its latest; UINT64_MAX: not
                                      known */
    uint64_t lib[MT_TAG_MAX];      /* bytes outside by library id (0: unnamed) */
    uint64_t lib_peak[MT_TAG_MAX]; /* bytes */
    uint64_t libs;                 /* sum of lib */
} mt__mdev_t;

/* One device ordinal d's figures (model_devs.c), made at the first event naming d: its two
 * sources' totals ([h]: h = 0 the device's allocator, source d; h = 1 its pinned host
 * cache, source 256 + d, mt_event_source), its managed memory and its memory outside the
 * allocator.
 * Invariants (mt__model_devs_check): peak_alloc[h] >= alloc[h], peak_res[h] >= res[h];
 * seen[h] || (alloc[h] = 0 && res[h] = 0); !managed => mres = mdev = mfaults = mmoved = 0;
 * out NULL or holding mt__mdev_t's invariants. */
typedef struct mt__mdevice_s {
    uint64_t alloc[2], res[2];           /* bytes, the source's latest totals */
    uint64_t peak_alloc[2], peak_res[2]; /* bytes */
    /* managed (an MT_EV_MANAGED event arrived): reserved bytes since, and the latest
     * residency figures: bytes resident, faults so far, bytes migrated so far */
    uint64_t mres, mdev, mfaults, mmoved;
    mt__mdev_t *out; /* outside the allocator: NULL until its first such event */
    uint8_t device;  /* d */
    bool seen[2];    /* the source has reported totals */
    bool managed;
} mt__mdevice_t;

/* Invariants: a source's totals count in exactly the class of its pool
 * (mt_event_source >= 256 <=> host); nit <= capit; lost_seq, lost_rec count events;
 * dev[0..ndev) strictly increasing by device, ndev <= capdev <= 256, dhint < ndev (or 0);
 * mres_sum = sum over dev of mres, managed.device_now = sum of mdev, managed.faults = sum
 * of mfaults, managed.migrated = sum of mmoved (modulo 2^64, as they are kept). */
struct mt_model_s {
    mt_model_cfg_t cfg;
    /* the devices events named, by ordinal (their sources, managed and outside figures);
     * dhint: the one found last */
    mt__mdevice_t *dev;
    size_t ndev, capdev, dhint;
    mt__mclass_t cls[MT_MODEL_CLASSES];
    uint64_t events;   /* records applied */
    uint64_t lost_rec; /* events lost as MT_EV_GAP records say */
    uint64_t lost_seq; /* events lost as seq jumps say */
    uint64_t next_seq; /* last seq + 1 */
    bool seq_seen;
    /* iteration samples (cfg.keep_iterations) */
    size_t nit, capit;
    uint64_t *it_no;              /* iteration numbers */
    double *it_alloc;             /* device allocated bytes */
    double (*it_tag)[MT_TAG_MAX]; /* device bytes by tag, known + uncertain */
    /* Spans between marks: it_peak[k] (k < nit - 1) is the device's peak allocated from mark
     * k to mark k + 1; the open span's (from the last mark, or from the start when nit = 0)
     * is span_peak. peak_span: 0 = the device's peak came before the first mark, k > 0 =
     * in the span opened by mark k - 1. span_peak >= the allocated bytes now. */
    uint64_t *it_peak;
    uint64_t span_peak;
    size_t peak_span;
    mt__mstacks_t *stacks; /* NULL until a stack ref, definition or module arrives */
    bool ref_applied;      /* a stack ref came since the last mt__model_stack_before: its
                              pending ref may be set (false => it is not) */
    /* settings changed at run time (MT_EV_SETTING), in order: at most MT_MODEL_SETTINGS_MAX
     * kept, the rest counted in settings_dropped */
    mt_model_setting_t *settings;
    size_t nsettings, capsettings;
    uint64_t settings_dropped;
    /* managed memory: the figures summed (each device's latest are its mt__mdevice_t's) */
    mt_model_managed_t managed;
    uint64_t mres_sum;
    /* outside the allocator: library names by id ("" unnamed), NULL until the first */
    char (*libname)[MT_EVENT_LABEL_MAX + 1];
};

/* The figures the daemon's web history reads after every event, read straight from the
 * class: the same values as mt__model_figures_totals's allocated, reserved and
 * peak_allocated, and as mt__model_tag's bytes, without the rest those two compute
 * (utilization, uncertainty). The tests compare them on random replays. */
static inline void mt__model_levels(const mt_model_t *m, int cls, uint64_t *allocated,
                                    uint64_t *reserved, uint64_t *peak_allocated)
{
    const mt__mclass_t *c = &m->cls[cls == MT_MODEL_HOST ? MT_MODEL_HOST : MT_MODEL_DEVICE];
    *allocated = mt__model_sat(c->asum);
    *reserved = mt__model_sat(c->rsum);
    *peak_allocated = c->peak_alloc;
}

/* mt__model_tag(m, cls, tag, &t).bytes for tag < MT_TAG_MAX. */
static inline uint64_t mt__model_tag_bytes(const mt_model_t *m, int cls, int tag)
{
    const mt__mclass_t *c = &m->cls[cls == MT_MODEL_HOST ? MT_MODEL_HOST : MT_MODEL_DEVICE];
    uint64_t a = mt__model_sat(c->asum), b = mt__model_sat(c->tag_bytes[tag]);
    return b < a ? b : a;
}

/* The tags whose mt__model_tag_bytes may be nonzero (bit t for tag t): every other one's
 * is 0. */
static inline uint32_t mt__model_tags_held(const mt_model_t *m, int cls)
{
    return m->cls[cls == MT_MODEL_HOST ? MT_MODEL_HOST : MT_MODEL_DEVICE].tags_held;
}

/* model_segs.c */
/* Sorts v[0..n) by addr (addresses distinct, so the order is the one any sort gives); tmp
 * holds n entries. A radix sort over the bits the addresses differ in: the figures sort the
 * live blocks each time they are read, and qsort's calls were a fifth of a report's time. */
void mt__model_sort_ranges(mt__range_t *v, size_t n, mt__range_t *tmp);
/* A gap: every segment becomes uncertain (walking those made certain since the last gap,
 * when they were noted). */
void mt__model_segs_mark_uncertain(mt__mclass_t *c);
void mt__model_segs_free(mt__mclass_t *c);
/* A segment or mapped pages appear at [addr, addr + size): what overlapped is gone. */
int mt__model_seg_add(mt__mclass_t *c, const mt_event_rec_t *ev, bool mapped);
/* Segment free / unmap of [addr, addr + size). */
int mt__model_seg_cut(mt__mclass_t *c, uint64_t addr, uint64_t size);
/* A block at addr was just allocated or freed: the segment holding it is live. */
void mt__model_seg_touch(mt__mclass_t *c, uint64_t addr);
/* Drops uncertain segments the class's reserved bytes prove gone. */
void mt__model_segs_prune(mt__mclass_t *c);
/* Free extents: total and largest, from segments and blocks. MT_ENOMEM. */
int mt__model_free_extents(const mt__mclass_t *c, uint64_t *total, uint64_t *largest,
                           mt_model_map_t *map);
/* The live blocks as (addr, size) ranges sorted by addr, *n of them (new, room for 2 n), or
 * NULL (no memory). */
mt__range_t *mt__model_sorted_blocks(const mt__mclass_t *c, size_t *n);
/* The free extents of the segments around the sorted blocks blk[0..nb): total and largest,
 * and map's segments when map is not NULL (map->segs of the segments' count). */
void mt__model_sweep(const mt__mclass_t *c, const mt__range_t *blk, size_t nb, uint64_t *total,
                     uint64_t *largest, mt_model_map_t *map);
int mt__model_segs_check(const mt__mclass_t *c, char *why, size_t whylen);

/* model_free.c: the free extents kept from one mt__model_figures_kept to the next. The
 * model tells them each change of its live blocks and segments (the notes below do nothing
 * while c->fr is NULL: a model nobody asks for them pays a test per change). */
void mt__model_free_block(mt__mclass_t *c, uint64_t addr, uint64_t size, int d);
void mt__model_free_cut(mt__mclass_t *c, uint64_t addr, uint64_t size);
void mt__model_free_added(mt__mclass_t *c, uint64_t addr, uint64_t size, int rc);
/* Free extents: total and largest, as mt__model_free_extents, from the kept ones (made at
 * the first call). MT_ENOMEM. */
int mt__model_free_kept(mt__mclass_t *c, uint64_t *total, uint64_t *largest);
void mt__model_free_destroy(mt__mclass_t *c);
/* Whether the extents are kept now (the next figures cost the changes since the last),
 * not dropped (the next figures sweep every block). For the tests. */
bool mt__model_free_following(const mt__mclass_t *c);
int mt__model_free_check(const mt__mclass_t *c, char *why, size_t whylen);

/* A live block [addr, addr + size) appeared (d = 1) or went (d = -1). */
static inline void mt__model_free_note_block(mt__mclass_t *c, uint64_t addr, uint64_t size, int d)
{
    if (c->fr != NULL)
        mt__model_free_block(c, addr, size, d);
}

/* The segment map is about to lose [addr, addr + size) (a cut, a removal, an add's cut). */
static inline void mt__model_free_note_cut(mt__mclass_t *c, uint64_t addr, uint64_t size)
{
    if (c->fr != NULL)
        mt__model_free_cut(c, addr, size);
}

/* The segment map changed with return rc: [addr, addr + size) was added (size 0: a cut,
 * nothing added). */
static inline void mt__model_free_note_added(mt__mclass_t *c, uint64_t addr, uint64_t size, int rc)
{
    if (c->fr != NULL)
        mt__model_free_added(c, addr, size, rc);
}

/* model.c, for model_stale.c: the live block at addr, or NULL (borrowed until the next
 * insert or delete); removes b (an uncertain b leaves the stale index too). */
mt__mblock_t *mt__model_block_find(const mt__mclass_t *c, uint64_t addr);
void mt__model_block_delete(mt__mclass_t *c, mt__mblock_t *b);

/* model_stale.c: the uncertain blocks by address (c->stale). */
/* Adds the uncertain blocks' records of blocks[from..to) (certain now, soon uncertain), or
 * none of them: 0 or MT_ENOMEM (the index unchanged). */
int mt__model_stale_add(mt__mclass_t *c, size_t from, size_t to);
/* Takes the record of the uncertain block at addr out (settled or deleted). */
void mt__model_stale_del(mt__mclass_t *c, uint64_t addr);
/* Adds a block made uncertain, !pending, to c->big (or sets c->big.lost). */
void mt__model_stale_big_add(mt__mclass_t *c, uint64_t addr, uint64_t size);
/* Drops the uncertain blocks within [addr, addr + size) (for model.c and model_segs.c). */
void mt__model_drop_uncertain_in(mt__mclass_t *c, uint64_t addr, uint64_t size);
/* Uncertain blocks larger than what the allocated total leaves room for are gone. */
void mt__model_prune_by_totals(mt__mclass_t *c);
int mt__model_stale_check(const mt__mclass_t *c, char *why, size_t whylen);

/* model_big.c: the largest items first (mt__mbig_t). */
/* Adds r, the record of a current item of kind k, to b (or sets b->lost). */
void mt__model_big_push(mt__mclass_t *c, mt__mbig_t *b, const mt__mbig_kind_t *k, mt__range_t r);
/* Takes out of b the records of the current items larger than room, into *out (new, *n of
 * them, sorted by addr; an item may be named twice, the two records side by side) and
 * leaves a current item's record on top (or none): b->n > 0 ? b->h[0].size : 0 is then the
 * largest item's size. 0, or MT_ENOMEM: b cannot be used (the caller walks every item;
 * records taken out are those of items above the room, which that walk removes). */
int mt__model_big_take(mt__mclass_t *c, mt__mbig_t *b, const mt__mbig_kind_t *k, mt__u128 room,
                       mt__range_t **out, size_t *n);
/* b's invariants against c's items: 0, or MT_EPROTO with the first violation in why (the
 * holding part skipped when there is no memory for it). */
int mt__model_big_check(const mt__mclass_t *c, const mt__mbig_t *b, const mt__mbig_kind_t *k,
                        char *why, size_t whylen);
void mt__model_big_fini(mt__mbig_t *b);

/* model_stacks.c */
/* Adds (sign 1) or removes (sign -1) b in its stack's figures of class c. */
void mt__model_stack_account(mt__mclass_t *c, const mt__mblock_t *b, int sign);
/* A stack ref record: remembered for the alloc that follows. 0 or MT_ENOMEM (forgotten: the
 * alloc then counts as no stack). */
int mt__model_stack_ref(mt_model_t *m, const mt_event_rec_t *ev);
/* Before ev is applied to c: the stack index its alloc gets (c->next_sidx); clears the
 * pending ref. 0 or MT_ENOMEM (the alloc counts under no stack, or under none at all when
 * the table of stacks could not be made). */
int mt__model_stack_before(mt_model_t *m, mt__mclass_t *c, const mt_event_rec_t *ev);
/* One iteration sample of every stack's device bytes (growth). */
void mt__model_stacks_iteration(mt_model_t *m);
uint32_t mt__model_stack_id(const mt_model_t *m, uint32_t sidx);
void mt__model_stacks_free(mt_model_t *m);
int mt__model_stacks_check(const mt_model_t *m, char *why, size_t whylen);

/* model_temp.c */
/* The program frees b (certain, not pending) at t_free ns: counted when temporary. 0, or
 * MT_ENOMEM (not counted). */
int mt__model_temp_free(mt__mclass_t *c, const mt__mblock_t *b, uint64_t t_free);
void mt__model_temp_free_all(mt__mclass_t *c);
int mt__model_temp_check(const mt__mclass_t *c, char *why, size_t whylen);

/* model_devs.c */
/* Device d's figures (d < 256), made when new (zero, not seen); NULL: no memory. Borrowed
 * until the next call that makes one. */
mt__mdevice_t *mt__model_dev_get(mt_model_t *m, unsigned d);
/* Device d's figures, or NULL when no event named d. */
const mt__mdevice_t *mt__model_dev_find(const mt_model_t *m, unsigned d);
void mt__model_devs_free(mt_model_t *m);
int mt__model_devs_check(const mt_model_t *m, char *why, size_t whylen);

/* model_outside.c */
/* Applies MT_EV_DEVICE, MT_EV_OUTSIDE_* and MT_EV_LIBRARY_LABEL. 0 or MT_ENOMEM. */
int mt__model_outside_apply(mt_model_t *m, const mt_event_rec_t *ev);
void mt__model_outside_free(mt_model_t *m);
int mt__model_outside_check(const mt_model_t *m, char *why, size_t whylen);

/* model_growth.c */
int mt__model_iteration(mt_model_t *m, uint64_t iteration);
void mt__model_iterations_free(mt_model_t *m);

#endif
