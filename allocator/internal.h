/* Private layout of the caching allocator, shared by its files:
 *   alloc.c    create/destroy, malloc/free, streams, block info, tags
 *   pending.c  pending frees: events recorded at free, their pool, waits for them
 *   bins.c     size-class bins (two-level segregated fit with bitmaps)
 *   meta.c     block-struct pool and the address -> block hash table
 *   blocks.h   the hot paths' steps on them inline: bins' lists, block pool, table probes
 *   segments.c segments, split/merge, release and garbage collection
 *   expandable.c expandable segments: mapped runs of a virtual range, map/unmap where needed
 *   config.c   configuration defaults, string parsing, environment
 *   stats.c    statistics, snapshot, invariant check, OOM report
 *   reserve.c  warm-up reservations: recording, the plan's reservation
 *   plan_follow.c placement by the plan: later requests matched with the warm-up's
 *   plan.c     offline placement of a recorded warm-up (greedy by size, or a sweep)
 *   pset.c     an ordered set (treap) for the planner's sweep and the plan's links
 *   free.c     free, record_stream and block lookup: the path a block takes back
 *   tcache.c   per-thread caches: a thread's same-size reuse without the lock (tcache.h)
 *   tcache_check.c the caches' invariants (tcache_impl.h: a cache's layout)
 *   fork.c     pthread_atfork handlers (cfg.atfork): a fork child may use the allocator
 *   pools.c    private pools (mt_pool_*): memory a stream capture's allocations keep
 *   plan.h     the warm-up plan's types and the calls of reserve.c, plan.c and
 *              plan_follow.c on it
 *
 * All metadata lives on the host; nothing is ever written into device memory.
 * Every function here expects the allocator's mutex held unless it says otherwise; those
 * that make a blocking backend call (a synchronize, a vm_* call) release it around the
 * call and say so: their callers re-validate what they held (docs/allocator-locking.md). */
#ifndef MT_ALLOCATOR_INTERNAL_H
#define MT_ALLOCATOR_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "memtrace/alloc.h"
#include "util/addrmap.h"
#include "util/assert.h"
#include "util/clock.h"
#include "allocator/tcache_gate.h"

/* ---- policy constants (the reference allocator's values) ---- */

#define MT__MIN_BLOCK     ((size_t)512)      /* smallest block; default rounding step */
#define MT__ALIGN         ((size_t)256)      /* finest block step: addresses and sizes */
#define MT__SMALL_SIZE    ((size_t)1 << 20)  /* requests <= this go to the small pool */
#define MT__SMALL_BUFFER  ((size_t)2 << 20)  /* small pool segment size */
#define MT__LARGE_BUFFER  ((size_t)20 << 20) /* large pool segment for requests < MIN_LARGE */
#define MT__MIN_LARGE     ((size_t)10 << 20) /* requests below get a LARGE_BUFFER segment */
#define MT__ROUND_LARGE   ((size_t)2 << 20)  /* bigger large segments round up to this */
#define MT__BEST_FIT_SCAN 16                 /* candidates examined per size class */
#define MT__PLACE_HIGH    ((size_t)32 << 20) /* default place_high (docs/allocator-policy.md) */
/* Internal result of the expandable path (never returned by a public call): no address
 * range could be reserved for the request's stream; the caller takes a plain segment. */
#define MT__ENORANGE (-4096)

/* ---- size classes ----
 * Sizes are multiples of MT__ALIGN. With u = size / MT__ALIGN: u < 32 maps linearly to
 * class u (row 0); otherwise fl = floor(log2 u) >= 5, sl = the 5 bits below the top one,
 * class = (fl - 4) * 32 + sl. A class therefore spans at most 1/32 of its power of two
 * (TLSF's ~3 % worst-case internal waste); row r >= 1 covers [2^(r+4), 2^(r+5)) units. */
#define MT__SL_BITS 5
#define MT__SL_N    (1u << MT__SL_BITS) /* classes per row */
#define MT__ROWS    48                  /* sizes < 2^(8 + 4 + 48) bytes */
#define MT__NCLASS  (MT__ROWS * MT__SL_N)
_Static_assert(MT__ROWS <= 64, "row bitmap is one uint64_t");
_Static_assert(MT__SL_N == 32, "class bitmap per row is one uint32_t");
_Static_assert(MT__MIN_BLOCK % MT__ALIGN == 0, "512 is a multiple of the alignment");

typedef struct mt_block_s mt_block_t;
typedef struct mt_segment_s mt_segment_t;
typedef struct mt_binset_s mt_binset_t;
typedef struct mt_streamrec_s mt_streamrec_t;
typedef struct mt__tcache_s mt__tcache_t;
typedef struct mt__tc_ent_s mt__tc_ent_t;
typedef struct mt__async_s mt__async_t;
typedef struct mt__pool_s mt__pool_t;

/* Block state of the allocator's own, beside mt_block_state_e: the whole pages of a free
 * block of an expandable run are being unmapped with the lock released (expandable.c).
 * Snapshots report such a block as inactive. */
#define MT__BLOCK_UNMAPPING 3

/* Internal pools: the two public ones plus the warm-up reservation pool, whose blocks
 * serve requests of any size on their stream. Reservation segments report as large. */
enum { MT__BP_SMALL = 0, MT__BP_LARGE = 1, MT__BP_RESERVED = 2, MT__BP_N = 3 };

/* A block is a contiguous piece of one segment.
 * Invariants: prev/next link the blocks of one segment in address order and
 * next->addr = addr + size (they tile the segment's mapped bytes exactly);
 * two inactive neighbours never coexist (merged at free completion);
 * state = INACTIVE  <=> the block is in exactly one bin: seg->bins, class mt__bin_class(size);
 * state in {ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE} <=> the block is in the address hash
 * table;
 * state = ACTIVE_PENDING_FREE <=> npending > 0 (events recorded at free not yet complete, plus
 * one while its free waits for a stream with the lock released);
 * state = MT__BLOCK_UNMAPPING <=> the block is the blk of exactly one unfinished entry of
 * an in-flight unmap batch (a->unmaps); it is in no bin and not in the hash table, its
 * segment is expandable, and it counts in reserved but in no active or inactive stat;
 * split_counted <=> state = INACTIVE and (prev or next) (counted in inactive_split).
 * tce != NULL => state = ACTIVE_ALLOCATED and a thread cache owns the block (tcache.c): tce
 * is its entry there, holding what the program holds of it; requested and tag are then what
 * the allocator's counters hold. */
struct mt_block_s {
    uintptr_t addr;       /* device address, multiple of MT__ALIGN */
    size_t size;          /* bytes, multiple of MT__ALIGN; >= MT__MIN_BLOCK except a free
                           * tail left by unmapping expandable pages */
    size_t requested;     /* bytes asked for; 0 when inactive */
    mt_segment_t *seg;    /* owning segment */
    mt_block_t *prev;     /* previous block of the segment (lower address) or NULL */
    mt_block_t *next;     /* next block of the segment or NULL */
    mt_block_t *bin_prev; /* free list of the block's size class (when inactive) */
    mt_block_t *bin_next; /* also the free-list link of the block-struct pool */
    mt_stream_t **uses;   /* streams other than seg->stream that used it (record_stream) */
    mt__tc_ent_t *tce;    /* its entry in the thread cache that owns it, or NULL (tcache.c) */
    uint32_t nuses;       /* entries in uses */
    uint32_t cap_uses;    /* capacity of uses */
    uint32_t npending;    /* events recorded at free, not yet seen complete */
    uint32_t gen;         /* warm-up generation at allocation (reserve.c) */
    uint32_t wid;         /* allocated while warming: index of its op in a->wops */
    uint16_t cls;         /* size class while inactive */
    uint8_t state;        /* mt_block_state_e or MT__BLOCK_UNMAPPING */
    uint8_t tag;          /* mt_tag_e or user tag, < MT_TAG_MAX */
    bool split_counted;   /* counted in inactive_split stats */
    bool planned;         /* placed by the warm-up plan, counted in a->plan.live (plan_follow.c) */
};

/* A segment is one backend allocation (or, when expandable, one virtual range of which
 * the first `size` bytes are mapped).
 * Invariants: first..last tile [addr, addr + size); size > 0;
 * expandable => one maximal run of mapped pages of its stream's range: addr and size
 * are multiples of mt__exp_page, vsize = size;
 * reserved => pool = MT__BP_RESERVED; segments are linked in address order;
 * priv <=> bins->sr->pool != NULL; priv => !expandable and !reserved, and no block of it
 * has an owner (a thread cache would hand it to eager requests).
 * A reserved (warm-up) segment is the user's explicit request for cached memory: garbage
 * collection, empty_cache, oversize release and OOM recovery never return it to the
 * backend; only mt_alloc_destroy (or a larger reservation replacing it) does. A private
 * pool's segment (priv) is likewise kept by every release path: a captured graph replays
 * into its blocks' addresses even after they were freed, so the memory goes back only
 * through mt_pool_release (pools.c). */
struct mt_segment_s {
    uintptr_t addr;      /* first device address */
    size_t size;         /* bytes backed by device memory (mapped bytes if expandable) */
    size_t vsize;        /* = size (kept for the disjointness checks) */
    mt_block_t *first;   /* lowest block */
    mt_block_t *last;    /* highest block */
    mt_binset_t *bins;   /* bins of (pool, stream) holding its inactive blocks */
    mt_stream_t *stream; /* stream it serves (NULL = default stream); compared, never called */
    uint32_t sid;        /* mt_stream_id(stream), kept so that events and snapshots never
                          * touch a stream the program has destroyed since */
    mt_segment_t *prev;  /* address-ordered list of all segments */
    mt_segment_t *next;
    uint64_t last_used; /* allocator clock at the last alloc/free in it (GC age) */
    uint8_t pool;       /* MT__BP_* */
    uint8_t slot;       /* its counters' slot, mt__stat_slot(a, pool) */
    bool expandable;
    bool reserved;
    bool priv; /* belongs to a private pool (bins->sr->pool) */
};

/* Free blocks of one (pool, stream): TLSF-like segregated fit.
 * Invariants: bit r of row_map <=> cls_map[r] != 0; bit s of cls_map[r] <=> heads[r*32+s]
 * is non-NULL; every block on heads[c] is inactive, of this binset, and has cls = c;
 * nblocks/bytes = count/sum of sizes over all lists. */
struct mt_binset_s {
    uint64_t row_map;              /* non-empty rows */
    uint32_t cls_map[MT__ROWS];    /* non-empty classes per row */
    mt_block_t *heads[MT__NCLASS]; /* doubly linked free lists (LIFO) */
    size_t nblocks;                /* blocks in the bins */
    size_t bytes;                  /* bytes in the bins */
    uint8_t pool;                  /* MT__BP_* */
    mt_stream_t *stream;
    mt_streamrec_t *sr; /* the stream's record (sr->bins[pool] = this) */
};

/* Per stream seen by the allocator: its bins (created lazily) and, with expandable
 * segments, one virtual range per pool whose mapped runs are segments (expandable.c).
 * Invariants: nruns = number of expandable segments of (pool, stream);
 * nruns > 0 or nmaps > 0 => vsize > 0; users = 0 => (vsize > 0 <=> nruns > 0) (a range
 * left without runs is released by the operation that emptied it, or that reserved it and
 * could not map); reserving => vsize = 0 and users > 0;
 * every run and every in-flight mapping of (pool, stream) lies in [vbase, vbase + vsize);
 * no two of them overlap, and no two runs touch. */
struct mt_streamrec_s {
    mt_stream_t *stream;
    uint32_t sid;                /* mt_stream_id(stream) at first use */
    mt_binset_t *bins[MT__BP_N]; /* NULL until first needed */
    uintptr_t vbase[2];          /* small, large: reserved virtual range, page-aligned */
    size_t vsize[2];             /* bytes of the range; 0 = none reserved */
    uint32_t nruns[2];           /* expandable segments (mapped runs) in the range */
    uint32_t nmaps[2];           /* mappings in flight in the range (a->maps) */
    uint32_t users[2];           /* threads in mt__exp_grow on the range (it may have no
                                  * run yet while they map) */
    bool reserving[2];           /* a vm_reserve for the range is in flight */
    uint64_t free_ver;           /* changes of its free space (its bins): written
                                  * under mu with __atomic stores (bins.c), read by the
                                  * thread caches without it */
    /* The private pool whose blocks on this stream it holds, or NULL for the stream's own
     * (eager) record. Stream lookups (mt__alloc_streamrec, last_sr) see only the eager
     * records; a pool's are reached through the pool and a->routes (pools.c). */
    mt__pool_t *pool;
};

/* Pages of a free block being unmapped with the lock released. seg2 and t are allocated
 * when the entry is planned, so that finishing after the unmap cannot fail: seg2 for the
 * upper part of a run the pages split, t for the block above the pages when the block
 * keeps a part below them too. Invariants: blk->state = MT__BLOCK_UNMAPPING;
 * [at, at + len) is whole pages inside [blk->addr, blk->addr + blk->size). */
typedef struct mt__unmap_s {
    mt_block_t *blk;
    uintptr_t at;       /* first page, multiple of mt__exp_page */
    size_t len;         /* bytes, multiple of mt__exp_page, > 0 */
    mt_segment_t *seg2; /* new, owned by the entry until used */
    mt_block_t *t;      /* new or NULL, owned by the entry until used */
    int rc;             /* the vm_unmap's result, once made */
} mt__unmap_t;

/* Entries planned together: one device synchronize, then their unmaps, all with the
 * lock released. Linked into a->unmaps from the release of the lock until every entry is
 * finished. Invariants: done <= n <= cap; entries [done, n) are unfinished. */
typedef struct mt__unmap_batch_s {
    mt__unmap_t *v;
    size_t n, cap, done;
    struct mt__unmap_batch_s *next;
} mt__unmap_batch_t;

/* Pages being mapped with the lock released: in no run yet, but no other mapping may
 * place pages there (exp_plan treats the range as taken). Lives on the mapping thread's
 * stack, linked into a->maps. */
typedef struct mt__map_s {
    uintptr_t at; /* first page */
    size_t len;   /* bytes, whole pages */
    mt_streamrec_t *sr;
    int bp;
    struct mt__map_s *next;
} mt__map_t;

/* An event recorded at free on a stream that used the block, awaiting completion. */
typedef struct mt_pending_s {
    mt_event_t *ev;  /* pooled event (returned to evpool when complete) */
    mt_block_t *blk; /* its block, state ACTIVE_PENDING_FREE */
    bool waited;     /* a thread synchronizes ev with the lock released: nobody else
                      * queries or recycles it meanwhile (waited => a->syncing) */
} mt_pending_t;

/* Active blocks by start address: util's address table (util/addrmap.h), each value a
 * block's struct. Invariants (mt__addrmap_check): those of mt__amap_t, and vals[i] is the
 * block at keys[i]. */
typedef mt__amap_t mt_addrmap_t;

#include "allocator/plan.h" /* the warm-up plan's types (mt__plan_t) and calls */

/* The allocator.
 * Thread-safety: one pthread mutex (mu) per allocator guards all of its state; the event
 * sink and the log callback are called with it held. No call that blocks on the device
 * (device/stream/event synchronize) or takes the driver's VM locks (vm_reserve, release,
 * map, unmap) is made with mu held: the operation decides under mu, marks what it works on
 * as in flight (a pending entry `waited`, a block MT__BLOCK_UNMAPPING in a->unmaps, pages
 * in a->maps, a range `reserving`), releases mu, makes the call, retakes mu and finishes;
 * threads that need in-flight memory wait on cv. Plain segment mallocs and frees stay
 * under mu (as in the reference allocator). docs/allocator-locking.md has the details.
 * Invariants (checked by mt_alloc_check):
 *   reserved_bytes[ALL].current = sum of segment sizes;
 *   allocated_bytes[ALL].current = sum of sizes of ACTIVE_ALLOCATED blocks;
 *   active_bytes[ALL].current = allocated + sum of sizes of ACTIVE_PENDING_FREE blocks;
 *   inactive_split_bytes[ALL].current = sum of sizes of inactive blocks with a neighbour
 *   (inactive_split: their number); each [SMALL] + [LARGE] = [ALL], warm-up reservations
 *   counting as LARGE; the counts likewise; tag_* likewise summed per tag;
 *   st_one => no segment of the small pool was ever made: every [SMALL] entry is 0 and
 *   the [LARGE] ones, equal to [ALL], are not kept (mt__stats_sync writes them);
 *   npending + nholds = sum of npending over the ACTIVE_PENDING_FREE blocks;
 *   inflight_map_bytes = sum of len over a->maps; unmapping blocks = unfinished entries
 *   of a->unmaps; syncing <=> some pending entry is waited (or a sync runs without any);
 *   the address map holds exactly the active blocks; requested_bytes[ALL].current = sum
 *   of requested over ACTIVE_ALLOCATED blocks; active*.peak >= allocated_bytes/allocation's;
 *   not kept: st.*.freed (allocated - current), active*.allocated (= allocated_bytes' and
 *   allocation's), filled in by mt__alloc_compute_stats. */
#define MT__FREE_CB_MAX 8
typedef struct mt__free_cb_s {
    mt_alloc_free_cb cb;
    void *ud;
} mt__free_cb_t;

#define MT__OOM_OBS_MAX 8
typedef struct mt__oom_obs_s {
    mt_alloc_oom_cb cb;
    void *ud;
} mt__oom_obs_t;

/* An open statistics scope (observe.c). Invariant, for the open scopes i < nscopes:
 * start <= peak, and max(peak, scope_hw) is the highest allocated_bytes[ALL] truth
 * since its push. */
typedef struct mt__scope_s {
    int64_t start;   /* allocated bytes at push */
    int64_t peak;    /* highest allocated bytes seen up to the last push/pop */
    uint64_t alloc0; /* allocated_bytes[ALL].allocated at push */
    uint64_t count0; /* allocation[ALL].allocated at push */
    int64_t ccount0; /* allocation[ALL].current at push */
    char name[MT_EVENT_MARK_NAME_MAX + 1]; /* recorded at pop as "/" + name; "" = none */
} mt__scope_t;

struct mt_alloc_s {
    pthread_mutex_t mu; /* the lock, with the bias below (lock.h) */
    /* The bias (lock.h): bias is the gate of the cache whose owner may take the lock
     * without mu, NULL = none (atomic; set and cleared with mu held, or cleared by its
     * owner holding the lock). lk_gate: the holder's gate when it holds the lock by the
     * bias, NULL when it holds mu. The rest is mu's: the last thread that took mu (its
     * cache's gate, compared only), its run of takes, the level of the run a new bias
     * needs, and the takes by the bias since it was set. Invariants: mt__alloc_lock_check
     * (lock.h). */
    mt__tc_gate_t *bias;
    mt__tc_gate_t *lk_gate;
    const mt__tc_gate_t *bias_cand;
    uint32_t bias_run, bias_level;
    uint64_t bias_takes;
#if MT_ASSERT_LEVEL >= 1
    uintptr_t owner; /* mt__thread_id() of the thread holding mu, 0 = none (debug builds) */
#endif
#if MT_ASSERT_LEVEL >= 2
    uint64_t check_credit; /* steps of whole checks earned by operations (expensive level) */
#endif
    mt_alloc_cfg_t cfg;    /* copy; sink and backend borrowed */
    mt_backend_t *backend; /* borrowed */
    int device;            /* backend device ordinal */
    size_t capacity;       /* device total bytes */
    size_t limit;          /* memory_fraction x capacity, bytes */
    size_t gc_limit;       /* garbage_collection_threshold x limit; 0 = off */
    size_t vm_gran;        /* backend VM granularity, bytes (0 = no VM support) */
    bool round_pow2;       /* some interval has roundup_power2_divisions > 1 */
    /* Rounded requests up to this size take the small pool: MT__SMALL_SIZE, or 0 when the
     * segments are expandable and one_pool shares their range (set with either). */
    size_t small_max;
    /* Only the large pool has had segments (the default, one_pool: every one): the
     * pool-indexed stats keep [ALL] alone, [LARGE] being the same (see the invariants).
     * Cleared, once, before the first small-pool segment is counted (mt__stats_split). */
    bool st_one;

    mt_segment_t *segs; /* all segments, address order */
    size_t nsegs;

    mt_streamrec_t **streams; /* nstreams records, each allocated once (stable) */
    size_t nstreams;
    size_t cap_streams;
    mt_streamrec_t *last_sr; /* one-entry cache for the hot path */

    mt_addrmap_t map; /* active blocks by address */

    mt_block_t *blk_free; /* pool of unused block structs (linked by bin_next) */
    void **blk_chunks;    /* chunks backing the pool, freed at destroy */
    size_t nchunks, cap_chunks;

    mt_pending_t *pending; /* events awaiting completion */
    size_t npending, cap_pending;
    size_t nholds; /* frees waiting for a stream with the lock released (one npending each) */

    /* In-flight work with the lock released (see the thread-safety note above). */
    pthread_cond_t cv;         /* broadcast whenever in-flight work ends */
    bool syncing;              /* a thread synchronizes the waited pending events */
    mt__unmap_batch_t *unmaps; /* unmap batches under way */
    mt__map_t *maps;           /* mappings under way */
    size_t inflight_map_bytes; /* sum of their lengths: counted against the limit */
    mt_event_t **evpool;       /* idle events, reused instead of create/destroy */
    size_t nevpool, cap_evpool;

    uint64_t clock;       /* operation counter: segment ages for GC */
    uint32_t gen;         /* warm-up generation; blocks remember theirs */
    bool warming;         /* between warmup_begin and warmup_end */
    bool va_short_logged; /* the warning that address space ran short was given */
    int64_t warm_peak;    /* peak allocated bytes since warmup_begin */
    /* The warm-up's request sequence, replayed at warmup_end to plan the reservation
     * (reserve.c). wops_failed: a host allocation for it failed; the plan then falls
     * back to reserving the whole measured transient peak. */
    mt__warm_op_t *wops;
    size_t nwops, cap_wops;
    bool wops_failed;
    mt__plan_t plan;   /* placement of the last warm-up's allocations in its reservation */
    uint64_t plan_ver; /* changes of the plan's state (mt__plan_bump), never reset: >= 1 */

    /* Free-memory callbacks (mt_alloc_add_free_callback), in registration order.
     * in_free_cbs: a run of them is under way (the lock is released meanwhile). */
    mt__free_cb_t free_cbs[MT__FREE_CB_MAX];
    unsigned nfree_cbs; /* <= MT__FREE_CB_MAX */
    bool in_free_cbs;
    mt__oom_obs_t oom_obs[MT__OOM_OBS_MAX]; /* OOM observers, registration order */
    unsigned noom_obs;                      /* <= MT__OOM_OBS_MAX */
    /* Statistics scopes (observe.c). scope_hw: while nscopes > 0, the highest
     * allocated_bytes[ALL] truth since the last push or pop, and
     * allocated_bytes[ALL].current <= scope_hw (the thread caches' peak guard keeps it). */
    mt__scope_t scopes[MT_ALLOC_SCOPE_MAX];
    unsigned nscopes;               /* <= MT_ALLOC_SCOPE_MAX */
    int64_t scope_hw;               /* bytes */
    mt__clock_t clk;                /* time of events (only read with a sink) */
    uint64_t stats_period_ns;       /* cfg.stats_period_ms in ns; 0 = no MT_EV_STATS */
    uint64_t stats_next_ns;         /* event time from which the next MT_EV_STATS is due */
    mt_alloc_stats_t st;            /* incrementally maintained parts of the stats */
    mt_alloc_stats_t acc0;          /* st's cumulative figures at the last reset_accumulated */
    char tag_names[MT_TAG_MAX][32]; /* user labels; "" = unused id */
    char last_error[2048];
    /* Outside the allocator (outside.c): the device's used bytes when it was created (the
     * context, and whatever else held memory then), and the library ids announced on its
     * sink (bit id). */
    uint64_t used_at_create;
    uint32_t lib_told;
    /* Per-thread caches (tcache.c). id: unique over the process's life, the key of the
     * threads' TLS entries (an address may be reused by a later allocator). tc_on: the fast
     * paths may run (cfg.tcache, no sink, not warming); written under mu with
     * __atomic stores, read inside a cache's exclusion. caches: every thread's cache for this
     * allocator, linked by next/prev, changed under mu. */
    uint64_t id;
    uint8_t tc_on;
    uint8_t tc_pend; /* npending > 0 (atomic mirror): a malloc then polls, on the global path */
    mt__tcache_t *caches;
    /* backend:cudaMallocAsync (async.c): the live allocations; NULL under the caching
     * allocator. Set at creation, never changed: the entry points test it without mu. */
    mt__async_t *async;
    mt_managed_stats_t mlast; /* managed.c: the figures of the last residency sample sent */
    /* Private pools (pools.c). routes: the streams whose allocations go to a pool now,
     * nroutes of them; tc_on stays 0 while nroutes > 0, so that every request of a routed
     * stream takes the global path, which routes it. */
    mt__pool_t **pools; /* npools live pools, creation order */
    size_t npools, cap_pools;
    uint32_t next_pool_id; /* id of the next pool created, >= 1 */
    struct mt__route_s *routes;
    size_t nroutes, cap_routes;
    /* Recording with the caches on (emit.c; cfg.tcache and a recording sink, set at
     * create): rec. Under rec_lock (a spin lock taken after mu or inside a cache's
     * exclusion, nothing taken inside it but the sink's emit): rec_held = bytes of the
     * blocks the caches hold as of the events emitted (allocated to the counters, freed to
     * the program); rec_g, rec_res = the counters' allocated and reserved carried by the
     * global path's last event, rec_g lowered by what flushes gave back since; rec_t = the
     * last stamp emitted (each cache stamps its events with its own clock). Every event
     * carries allocated
     * = rec_g - rec_held at its emission. Invariants: 0 <= rec_held <= rec_g; outside a
     * fast operation rec_held = sum over the caches of their held entries' sizes minus
     * the changes their buffered events tell (mt__tcache_t.buf). rec_mute:
     * a flush frees held blocks, whose frees were told at the program's free (mu). */
    bool rec;
    bool rec_mute;
    /* The global path's allocs and frees held back (emit.c; mu): gb[0..gb_n), timed
     * entries (util/evbatch.h) of gb_nev events, stamped from gb_t0, at reserved bytes
     * gb_res; gb_g = the counters' allocated bytes after the last. gb != NULL only while rec
     * and the sink can be asked for them (source); gb_out: room for their events (a sink
     * without batches). Invariants: gb_n <= MT__GB_CAP, gb_n <= gb_nev <= 2 gb_n; gb_n = 0
     * while gb = NULL; rec_g + their allocated bytes' change = gb_g. */
    struct mt__evb_ent_s *gb;
    mt_event_rec_t *gb_out;
    uint32_t gb_n, gb_nev;
    uint64_t gb_t0, gb_res;
    int64_t gb_g;
    char rec_pad[64]; /* rec_lock on a line apart from what the fast paths read */
    uint8_t rec_lock;
    int64_t rec_g, rec_held;
    uint64_t rec_res, rec_t;
};

/* ---- lock.c: the lock, biased to a thread ---- */
#include "allocator/lock.h"

/* True when a thread has work in flight with the lock released that may give memory back
 * or take it (a request that failed meanwhile may succeed after waiting). */
static inline bool mt__alloc_inflight(const mt_alloc_t *a)
{
    return a->syncing || a->nholds > 0 || a->unmaps != NULL || a->maps != NULL;
}

/* ---- managed.c ---- */
/* A segment from the backend: managed memory with cfg.managed_memory, else plain. */
int mt__managed_seg_malloc(mt_alloc_t *a, size_t size, void **out);
int mt__managed_seg_free(mt_alloc_t *a, void *ptr);
/* cfg.managed_memory's demands on the rest of cfg and on the backend; 0 or an MT_E* code
 * with err naming the conflict. */
int mt__managed_cfg_validate(const mt_alloc_cfg_t *c, char *err, size_t errlen);

/* ---- alloc.c ---- */
void mt__alloc_log(mt_alloc_t *a, mt_log_level_e level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
size_t mt__alloc_round_size(size_t size, unsigned divisions);
/* The divisions cfg gives a request of size bytes (its interval's). */
unsigned mt__alloc_divisions(const mt_alloc_cfg_t *c, size_t size);
/* The size a request of size bytes is served as: the one place a request is rounded. */
static inline size_t mt__alloc_round(const mt_alloc_t *a, size_t size)
{
    if (__builtin_expect(!__atomic_load_n(&a->round_pow2, __ATOMIC_RELAXED), 1))
        return size <= MT__MIN_BLOCK ? MT__MIN_BLOCK
                                     : (size + MT__MIN_BLOCK - 1) & ~(MT__MIN_BLOCK - 1);
    return mt__alloc_round_size(size, mt__alloc_divisions(&a->cfg, size));
}
mt_streamrec_t *mt__alloc_streamrec(mt_alloc_t *a, mt_stream_t *s);
/* A new record of stream s (of private pool `pool`, NULL: the shared bins), listed in
 * a->streams; NULL without memory (nothing listed). */
mt_streamrec_t *mt__alloc_streamrec_add(mt_alloc_t *a, mt_stream_t *s, mt__pool_t *pool);
mt_binset_t *mt__alloc_binset(mt_alloc_t *a, mt_streamrec_t *sr, int bp);
/* ---- pending.c ---- */
/* An idle event from the pool, or a new one; NULL when the backend cannot make one. */
mt_event_t *mt__alloc_event_get(mt_alloc_t *a);
/* Returns ev to the pool (destroys it when the pool cannot grow). */
void mt__alloc_event_put(mt_alloc_t *a, mt_event_t *ev);
/* Adds ev, recorded for pending block b, to a->pending. */
int mt__alloc_pending_push(mt_alloc_t *a, mt_event_t *ev, mt_block_t *b);
/* Waits with the lock released for the streams b->uses[0..n) of pending block b that got
 * no event, holding b pending meanwhile; completes b when nothing else is pending. */
void mt__alloc_wait_streams(mt_alloc_t *a, mt_block_t *b, uint32_t n);
/* Queries pending events; completes blocks whose events are done. An event recorded into
 * a stream capture (MT_EBUSY) never is: its block stays pending. */
void mt__alloc_process_events(mt_alloc_t *a);
/* Waits for every pending event with the lock released, then completes their blocks (and
 * any other thread's that completed meanwhile). */
void mt__alloc_sync_pending(mt_alloc_t *a);
/* Completes every block still pending after mt__alloc_sync_pending (those of captured
 * events): the allocator is being destroyed, their memory goes with it. */
void mt__alloc_pending_drop(mt_alloc_t *a);
/* Marks an inactive-bound block free: merge, insert into bins, stats, event stamped t
 * (0 = now), emitted in one batch after req (the free's free_requested) when given. */
void mt__alloc_free_complete(mt_alloc_t *a, mt_block_t *b);

/* ---- segments.c ---- */
/* Size of a new segment for a rounded request in pool bp (small/large). */
size_t mt__seg_alloc_size(const mt_alloc_t *a, int bp, size_t rsize);
/* Gets a block of at least rsize bytes by a backend malloc (or expandable mapping) for
 * (bp, sr); the returned block is inactive and in the bins. Fails with MT_ENOMEM when
 * the backend or the memory limit refuses. */
int mt__seg_grow(mt_alloc_t *a, mt_streamrec_t *sr, int bp, size_t rsize, mt_block_t **out);
/* Allocates a whole segment of exactly size bytes (already rounded) for pool bp. */
int mt__seg_new(mt_alloc_t *a, mt_streamrec_t *sr, int bp, size_t size, mt_segment_t **out);
/* Returns a whole free segment (or an expandable one's whole free pages) to the backend.
 * Returns bytes given back. An expandable segment's pages are unmapped with the lock
 * released: seg may be gone on return. */
size_t mt__seg_release(mt_alloc_t *a, mt_segment_t *seg);
/* Splits b so that it is exactly size bytes, the remainder going back to the bins. The
 * malloc's take and the free's merge: blocks.h. */
void mt__seg_split(mt_alloc_t *a, mt_block_t *b, size_t size);
/* Garbage collection: releases the oldest unused cached segments until reserved is at or
 * below the GC limit (expandable pages with the lock released). */
void mt__seg_gc(mt_alloc_t *a);
/* Releases cached oversize blocks (>= max_split_size) of (bp, stream) that form whole
 * segments, largest first, until `need` bytes were released. True if any. */
bool mt__seg_release_oversize(mt_alloc_t *a, mt_binset_t *bs, size_t need);
/* Releases the cached whole plain segments of bs smaller than rsize (they cannot serve
 * it). Returns bytes released. */
size_t mt__seg_release_smaller(mt_alloc_t *a, const mt_binset_t *bs, size_t rsize);
/* Releases cached whole plain segments (not reservations), oldest first, until at least
 * need bytes went back (release_to_fit). Returns bytes released. */
size_t mt__seg_release_to_fit(mt_alloc_t *a, size_t need);
/* Bytes by which reserved + more would exceed the reserved_bytes peak:
 * release_to_fit gives back only that much, so cache that costs no new peak is kept. */
size_t mt__seg_over_peak(const mt_alloc_t *a, size_t more);
/* Releases every unused cached segment (reserved ones only when include_reserved);
 * expandable pages are unmapped with the lock released. Returns bytes released. Caller
 * has synchronised pending events. */
size_t mt__seg_release_all(mt_alloc_t *a, bool include_reserved, mt_stream_t *only_stream,
                           bool only);
bool mt__seg_is_whole_free(const mt_segment_t *seg);
/* Puts an inactive block into its segment's bins / takes it out, keeping the
 * inactive_split statistics. */
void mt__seg_bin_in(mt_alloc_t *a, mt_block_t *b);
void mt__seg_bin_out(mt_alloc_t *a, mt_block_t *b);
/* The segment containing addr, or NULL. */
mt_segment_t *mt__seg_find(const mt_alloc_t *a, uintptr_t addr);
/* Returns every segment to the backend regardless of its blocks (destroy: no other thread
 * uses the allocator; synchronize and vm_* calls are made with the lock released). */
void mt__seg_destroy_all(mt_alloc_t *a);

void mt__seg_link(mt_alloc_t *a, mt_segment_t *seg);
void mt__seg_unlink(mt_alloc_t *a, mt_segment_t *seg);
/* reserved + more stays within the memory_fraction limit. */
bool mt__seg_within_limit(const mt_alloc_t *a, size_t more);

/* ---- expandable.c ---- */
/* Mapping unit of expandable segments, bytes (a multiple of the VM granularity). */
size_t mt__exp_page(const mt_alloc_t *a);
/* Maps pages of the (bp, stream) range so that an rsize block fits; the block returned is
 * inactive and in the bins. Reserves and maps with the lock released. MT_ENOTSUP when the
 * backend has no usable VM. */
int mt__exp_grow(mt_alloc_t *a, mt_streamrec_t *sr, int bp, size_t rsize, mt_block_t **out);
/* Plans the unmapping of every whole free page of run seg into q (lock held): the blocks
 * become MT__BLOCK_UNMAPPING. Returns bytes planned. */
size_t mt__exp_plan_release(mt_alloc_t *a, mt__unmap_batch_t *q, mt_segment_t *seg);
/* Runs q: one device synchronize and the unmaps with the lock released, then finishes each
 * entry in order (stats, events) and frees q's array. Returns bytes unmapped. */
size_t mt__exp_unmap_run(mt_alloc_t *a, mt__unmap_batch_t *q);
/* Unmaps every whole free page of run seg (plan and run). Returns bytes unmapped. */
size_t mt__exp_release(mt_alloc_t *a, mt_segment_t *seg);
bool mt__exp_releasable(const mt_alloc_t *a, const mt_segment_t *seg);
/* Releases the virtual ranges (destroy, after every run was unmapped; lock released
 * around each release). */
void mt__exp_destroy(mt_alloc_t *a);
/* In a fork child: the counts of threads inside mt__exp_grow cleared (they are gone) and a
 * range they had reserved but not mapped released (lock released around it). */
void mt__exp_fork_child(mt_alloc_t *a);

/* ---- pools.c ---- */
/* A stream routed to a private pool (mt_pool_begin). */
typedef struct mt__route_s {
    mt_stream_t *stream; /* compared, never called */
    mt__pool_t *pool;
} mt__route_t;
/* A private pool.
 * Invariants: id >= 1, unique among a->pools; srs[0..nsrs) are distinct records of distinct
 * streams, each in a->streams with sr->pool = this pool, and every record in a->streams
 * whose pool is this one is among them; nroutes = number of a->routes naming it. */
struct mt__pool_s {
    uint32_t id;
    uint32_t nroutes;     /* streams routed to it now */
    mt_streamrec_t **srs; /* its stream records, created on first use */
    size_t nsrs, cap_srs;
};
/* The record a request on stream takes: a pool's when the stream is routed (created on
 * first use), else the stream's own. NULL when host memory ran out. */
mt_streamrec_t *mt__pool_route(mt_alloc_t *a, mt_stream_t *stream);
/* Frees every pool and route (destroy; the records are freed with a->streams). */
void mt__pool_fini(mt_alloc_t *a);
/* The pools' invariants, mu held; a static description of the first violation or NULL. */
const char *mt__pool_check(const mt_alloc_t *a);

/* ---- fork.c ---- */
/* Registers the fork handlers, once per process (cfg.atfork). 0 or MT_ENOMEM. */
int mt__alloc_fork_register(void);

/* ---- stats.c ---- */
/* current += d; peak and allocated (d > 0) follow. freed is not kept here: it is always
 * allocated - current, filled in by mt__alloc_compute_stats (one store less per free). */
static inline void mt__stat_add1(mt_stat_t *s, int64_t d)
{
    s->current += d;
    if (d > 0) {
        s->allocated += (uint64_t)d;
        if (s->current > s->peak)
            s->peak = s->current;
    }
}
/* The pool-indexed forms below take a slot: MT_STAT_ALL (st_one: [ALL] alone) or the
 * stat pool whose entry follows [ALL] (mt__stat_slot). */
static inline void mt__stat_add(mt_stat_t *arr, int slot, int64_t d)
{
    mt__stat_add1(&arr[MT_STAT_ALL], d);
    if (slot != MT_STAT_ALL)
        mt__stat_add1(&arr[slot], d);
}
/* Steps that took minus away and then added plus (both >= 0), as one update of
 * arr[MT_STAT_ALL] and arr[slot]: the current, peak and allocated the steps one by one
 * leave (every value between is at most the last). */
static inline void mt__stat_move1(mt_stat_t *s, int64_t plus, int64_t minus)
{
    s->current += plus - minus;
    if (plus > 0) {
        s->allocated += (uint64_t)plus;
        if (s->current > s->peak)
            s->peak = s->current;
    }
}
static inline void mt__stat_move(mt_stat_t *arr, int slot, int64_t plus, int64_t minus)
{
    mt__stat_move1(&arr[MT_STAT_ALL], plus, minus);
    if (slot != MT_STAT_ALL)
        mt__stat_move1(&arr[slot], plus, minus);
}
/* The hot path's forms, sign known. */
static inline void mt__stat_inc1(mt_stat_t *x, int64_t d)
{
    x->current += d;
    x->allocated += (uint64_t)d;
    if (__builtin_expect(x->current > x->peak, 0))
        x->peak = x->current;
}
static inline void mt__stat_inc2(mt_stat_t *arr, int slot, int64_t d)
{
    mt__stat_inc1(&arr[MT_STAT_ALL], d);
    if (slot != MT_STAT_ALL)
        mt__stat_inc1(&arr[slot], d);
}
static inline void mt__stat_sub1(mt_stat_t *x, int64_t d)
{
    x->current -= d;
}
static inline void mt__stat_sub2(mt_stat_t *arr, int slot, int64_t d)
{
    arr[MT_STAT_ALL].current -= d;
    if (slot != MT_STAT_ALL)
        arr[slot].current -= d;
}
static inline int mt__stat_pool(int bp)
{
    return bp == MT__BP_SMALL ? MT_STAT_SMALL : MT_STAT_LARGE;
}
/* The slot of internal pool bp's counters. */
static inline int mt__stat_slot(const mt_alloc_t *a, int bp)
{
    mt_assert(!a->st_one || bp != MT__BP_SMALL);
    return a->st_one ? MT_STAT_ALL : mt__stat_pool(bp);
}
/* st_one: [LARGE] of every pool-indexed stat set to [ALL] (mu held; before a reader). */
void mt__stats_sync(mt_alloc_t *a);
/* st_one ends: [LARGE] made equal to [ALL], and every segment's slot its pool's. */
void mt__stats_unone(mt_alloc_t *a);
/* Before a segment of internal pool bp is counted: st_one ends at the first small one. */
static inline void mt__stats_split(mt_alloc_t *a, int bp)
{
    if (__builtin_expect(a->st_one && bp == MT__BP_SMALL, 0))
        mt__stats_unone(a);
}
static inline int mt__public_pool(int bp)
{
    return bp == MT__BP_SMALL ? MT_POOL_SMALL : MT_POOL_LARGE;
}
/* Fills a->last_error with the OOM report and logs it. */
void mt__alloc_oom_report(mt_alloc_t *a, size_t request, size_t rsize, const char *why);
/* v bytes as "1.50 GiB" in buf (n bytes); returns buf. */
const char *mt__alloc_human(size_t v, char *buf, size_t n);

/* ---- outside.c ---- */
/* MT_EV_DEVICE: the device's used and total bytes now (lock held; nothing without a sink). */
void mt__alloc_emit_device(mt_alloc_t *a);
/* Appends to buf[len..cap) the OOM message's account of the device memory the allocator
 * does not hold (used - reserved): by library, then the rest. Returns the new length. */
size_t mt__alloc_outside_text(const mt_alloc_t *a, char *buf, size_t len, size_t cap, size_t used,
                              size_t reserved);

/* ---- observe.c ---- */
/* An OOM observers' run, prepared under mu and made without it. */
typedef struct mt__oom_call_s {
    mt__oom_obs_t obs[MT__OOM_OBS_MAX];
    unsigned n;
    mt_alloc_oom_info_t info;
    char msg[sizeof((mt_alloc_t *)0)->last_error];
} mt__oom_call_t;
/* Under mu, after an OOM of a request of size bytes: fills *call (n = 0 if no observer). */
void mt__oom_prepare(mt_alloc_t *a, size_t size, mt__oom_call_t *call);
/* Without mu: calls the observers of a prepared run. */
void mt__oom_run(const mt__oom_call_t *call);
/* Under mu, on the global path's allocation: keeps scope_hw (see mt_alloc_s). */
static inline void mt__scope_track(mt_alloc_t *a)
{
    if (__builtin_expect(a->nscopes != 0, 0) &&
        a->st.allocated_bytes[MT_STAT_ALL].current > a->scope_hw)
        a->scope_hw = a->st.allocated_bytes[MT_STAT_ALL].current;
}
void mt__alloc_compute_stats(mt_alloc_t *a, mt_alloc_stats_t *out);

/* ---- reserve.c (the rest in plan.h) ---- */
/* The plan's state changed (cursor, taken entries, live blocks, the plan itself): written
 * under mu with an atomic store, read by the thread caches without it. */
static inline void mt__plan_bump(mt_alloc_t *a)
{
    __atomic_store_n(&a->plan_ver, a->plan_ver + 1, __ATOMIC_RELAXED);
}
/* b, placed by the plan, is being freed. */
static inline void mt__plan_freed(mt_alloc_t *a, mt_block_t *b)
{
    mt_assert(b->planned && a->plan.live > 0);
    b->planned = false;
    a->plan.live--;
    mt__plan_bump(a);
}

/* ---- free.c ---- */
/* Frees allocated block b (lock held): its counters, events, pending events for the
 * streams that used it, then the bins. b->owner must be NULL. */
void mt__alloc_free_block(mt_alloc_t *a, mt_block_t *b);

/* ---- config.c ---- */
int mt__alloc_cfg_validate(const mt_alloc_cfg_t *cfg, char *err, size_t errlen);

/* ---- async.c: backend:cudaMallocAsync, the public entry points' other path ---- */
/* Sets the pool up (release threshold UINT64_MAX) and a->async; a->cfg.tcache off. */
int mt__async_init(mt_alloc_t *a);
/* Frees what is still live into the pool and a->async (mu held). */
void mt__async_fini(mt_alloc_t *a);
int mt__async_malloc(mt_alloc_t *a, size_t size, mt_stream_t *stream, int tag, void **out);
int mt__async_free(mt_alloc_t *a, void *ptr);
int mt__async_record_stream(mt_alloc_t *a, void *ptr, mt_stream_t *stream);
int mt__async_block_info(mt_alloc_t *a, const void *ptr, void **base, size_t *size, int *tag);
int mt__async_empty_cache(mt_alloc_t *a);
/* reserved_bytes from the pool (mu held). */
void mt__async_refresh(mt_alloc_t *a);
/* The invariants of async.c's struct, mu held; a static description or NULL. */
const char *mt__async_is_valid(mt_alloc_t *a);

/* ---- bins.c, meta.c, segments.c: their steps the hot paths take inline ---- */
#include "allocator/blocks.h"
/* ---- emit.c: the allocator's events ---- */
#include "allocator/emit.h"

#endif
