/* The layout of a per-thread cache, shared by tcache.c (the caches) and tcache_check.c
 * (their invariants). The global paths (alloc.c, free.c) read it only through the inline
 * checks at its end; the allocator's other files use tcache.h. */
#ifndef MT_ALLOCATOR_TCACHE_IMPL_H
#define MT_ALLOCATOR_TCACHE_IMPL_H

#include "allocator/tcache.h"
#include "allocator/tcache_gate.h"
#include "util/evbatch.h"

#define TC_HELD        256  /* blocks a cache holds at most */
#define TC_TLS         4    /* allocators a thread caches for at once */
#define TC_WINDOW      256  /* owns per verdict on whether owning pays */
#define TC_PAYS        8    /* owning pays with >= 1 pop per TC_PAYS owns */
#define TC_BACKOFF_MIN 1024 /* global allocations skipped after a window that did not pay */
#define TC_BACKOFF_MAX 65536
#define TC_BATCH       256 /* fast operations' events handed to the sink at once */

/* A thread's caches: (allocator id, cache) entries, id 0 = free (tcache.c). */
typedef struct mt__tc_tls_s {
    uint64_t id;
    mt__tcache_t *c;
} mt__tc_tls_t;
extern _Thread_local mt__tc_tls_t mt__tc_tls[TC_TLS];

/* The calling thread's cache for a, or NULL. */
static inline mt__tcache_t *mt__tc_find(const mt_alloc_t *a)
{
    const mt__tc_tls_t *t = mt__tc_tls; /* one TLS address computation */
    uint64_t id = a->id;
    for (int i = 0; i < TC_TLS; i++)
        if (t[i].id == id)
            return t[i].c;
    return NULL;
}

/* Before taking mu on a global path, given the calling thread's cache for a (mine, the
 * fast path's mt__tc_find, or NULL): without one, a TLS entry made free for a. */
static inline void mt__tc_prepare(mt_alloc_t *a, const mt__tcache_t *mine)
{
    if (mine == NULL && __atomic_load_n(&a->tc_on, __ATOMIC_RELAXED))
        mt__tc_prepare_slow(a);
}

/* An owned block's record in its owner's cache: everything the fast paths read and write,
 * so that they do not touch the block struct.
 * Invariants: b->tce = this entry; addr = b->addr, size = b->size, req = b->requested,
 * tag = b->tag, used = (b->nuses != 0), sr = b->seg->bins->sr,
 * sp = its segment's stat pool; held => on the cache's held list, linked by next. On the
 * cache's free list, next links it and b = NULL. */
typedef struct mt__tc_ent_s {
    mt_block_t *b;
    mt__tcache_t *c;           /* the owner */
    struct mt__tc_ent_s *next; /* held list or free list */
    uintptr_t addr;
    size_t size;
    mt_streamrec_t *sr; /* its segment's stream record, readable without mu while owned */
    size_t req;         /* requested bytes (the counters' and the program's) */
    uint64_t seq;       /* owner's operation count at its last free into the cache */
    uint64_t k;         /* owner's operation count when it was last handed out */
    uint64_t ver;       /* sr->free_ver when the global path handed it out */
    uint64_t pver;      /* planned: a->plan_ver when the global path handed it out, its
                         * pair then leaving the plan as it was (else 0) */
    bool held;          /* on the held list (freed by the program) */
    bool used;          /* another stream used it (record_stream): its free is global */
    uint8_t tag;        /* its tag (the counters' and the program's) */
    uint8_t sp;         /* MT_STAT_SMALL or MT_STAT_LARGE of its segment's pool */
} mt__tc_ent_t;

/* A cache's cumulative counts since its last flush, per counter the fast paths touch:
 * bytes/count/req are indexed by stat pool (MT_STAT_SMALL, MT_STAT_LARGE; [ALL] unused),
 * the ALL counter's being their sum; active_bytes' and active's are allocated_bytes' and
 * allocation's (stats.c). */
typedef struct tc_counts_s {
    int64_t bytes[MT_STAT_N], count[MT_STAT_N], req[MT_STAT_N];
    int64_t tag_bytes[MT_TAG_MAX], tag_req[MT_TAG_MAX];
} tc_counts_t;

/* A thread's cache for one allocator.
 * Invariants:
 *   live maps the address of exactly the blocks with tce->c = this cache to their entry,
 *   each block ACTIVE_ALLOCATED in a->map;
 *   held lists exactly the held ones, newest first (seq decreasing), nheld of them,
 *   nheld <= TC_HELD;
 *   the allocator's counters hold every owned block, held or not, as allocated with its
 *   own size, requested bytes and tag (a pop takes a block back only with those), so
 *   for every counter: truth = a->st.c.current - sum over held blocks of theirs, and
 *   truth <= a->st.c.current <= a->st.c.peak; a flush makes truth = counters;
 *   cum = sum over the pops since the last flush (added to .allocated at flush). */
struct mt__tcache_s {
    _Alignas(64) mt__tc_gate_t gate; /* excludes the owner's fast paths (tcache_gate.h) */
    mt_alloc_t *a;                   /* borrowed */
    mt__tcache_t *next;              /* a->caches, under mu */
    mt__tcache_t *prev;
    mt__amap_t live;       /* owned blocks' entries by address */
    mt__tc_ent_t *held;    /* held entries, newest first, linked by next */
    mt__tc_ent_t *last;    /* an owned block's, the last handed out (a free looks here first) */
    uintptr_t last_addr;   /* last's address when last != NULL (owner only, read without
                            * its exclusion) */
    mt__tc_ent_t *spare;   /* entries not in use, linked by next */
    mt__tc_ent_t **chunks; /* the entries' storage (freed with the cache) */
    size_t nchunks, cap_chunks;
    size_t nheld;
    size_t nplan;  /* live entries with pver != 0 (changed under mu only) */
    uint64_t nops; /* pushes and pops so far: the held blocks' order, and whether a
                    * block's pop repeats the best fit that handed it out */
    /* Whether owning pays (owner thread only): pops and owns in the current window, and
     * how many more global allocations skip owning. A window of TC_WINDOW owns with fewer
     * than 1 pop in TC_PAYS turns owning off for `backoff` allocations (doubling up to
     * TC_BACKOFF_MAX while it keeps not paying), since an owned block costs a table
     * insert, and its free a flush, on a thread whose pairs do not repeat. */
    uint32_t pops, owns, skip, backoff;
    tc_counts_t cum; /* the pops' counts since the last flush */
    /* Recording (a->rec): the fast operations not yet handed to the sink, in order, one
     * compact entry each (util/evbatch.h), nev events in all; they are stamped and given
     * their totals when handed over (mt__tc_push): when TC_BATCH events would overflow, and
     * before the global path touches the cache (a claim, the owner's own global operation,
     * a flush, exit). nbuf <= nev <= TC_BATCH, nbuf < nev when pend, nev = the entries'
     * events (+ 1 when pend). out: the events made of them for a sink that takes no
     * compact batch. */
    uint32_t nbuf, nev;
    const mt__tc_ent_t *fold; /* the block whose POP is buf's last entry or pending, else
                               * NULL */
    const mt__tc_ent_t *pair; /* the block whose POP_FREE is buf's last entry, else NULL */
    bool pend; /* fold's POP is not in buf yet: fold = pair, and its free adds one to the
                * last entry's rep (one event of nev) */
    mt__evb_ent_t buf[TC_BATCH];
    mt_event_rec_t out[TC_BATCH];
    /* Stamps the pushes (not thread-safe: its owner's, or a claimer's, which the exclusion
     * orders); a copy of a->clk, so that no clock line is shared between threads. */
    mt__clock_t clk;
};

/* Excludes c's owner's fast paths (mu held; a no-op for the owner itself, whose fast paths
 * do not run meanwhile) / ends the exclusion. */
void mt__tc_claim(mt__tcache_t *c);
void mt__tc_unclaim(mt__tcache_t *c);

/* k += sign x (size, 1, req) in stat pool sp and tag. */
static inline void mt__tc_counts_add(tc_counts_t *k, int sp, int tag, int64_t size, int64_t req,
                                     int64_t sign)
{
    k->bytes[sp] += sign * size;
    k->count[sp] += sign;
    k->req[sp] += sign * req;
    k->tag_bytes[tag] += sign * size;
    k->tag_req[tag] += sign * req;
}

/* The global path's inline checks of the calling thread's cache c (mt__tc_prepare's, or
 * NULL), so that a thread whose cache has nothing to do pays no call into tcache.c.
 *
 * Clean: c holds no block and keeps back no event (pend implies nbuf >= 1), so
 * mt__tc_flush_mine would do nothing. Read by the owner, before mu or with it: a claimer
 * only lowers nheld and nbuf, which only the owner raises. */
static inline bool mt__tc_clean(const mt__tcache_t *c)
{
    return c == NULL || (c->nheld | c->nbuf) == 0;
}

/* Idle (mu held, and kept until the allocation's mt__tc_own without releasing it): the
 * peak guard and mt__tc_own of a global allocation would do nothing but count it in c's
 * backoff. Either c is the allocator's only cache, clean, in a backoff (skip > 0), with
 * the fast paths on; or there is no cache and the fast paths are off. */
static inline bool mt__tc_idle(const mt_alloc_t *a, const mt__tcache_t *c)
{
    if (c == NULL)
        return a->caches == NULL && !a->tc_on;
    return (c->nheld | c->nbuf) == 0 && c->skip != 0 && a->caches == c && c->next == NULL &&
           a->tc_on;
}

/* ---- tcache_reg.c: the registry of live allocators, the TLS entries' key ----
 * Binds the calling thread's TLS entries to the key whose destructor gives its caches back
 * at thread exit: 0, or MT_ENOMEM. */
int mt__tc_tls_bind(void);
/* In a fork child: the registry's lock made anew. */
void mt__tc_reg_reinit(void);
/* Flushes c, gives up its live blocks and frees it (mu held; tcache.c). */
void mt__tc_drop(mt_alloc_t *a, mt__tcache_t *c);

/* mt__tc_own's work for an idle cache: one global allocation of its backoff counted. */
static inline void mt__tc_idle_own(mt__tcache_t *c)
{
    if (c != NULL) {
        mt_assert(c->skip > 0);
        c->skip--;
    }
}

#endif
