/* Per-thread caches: a block the thread freed, kept whole in a LIFO of its (stream, size),
 * taken back by the thread's next request of that rounded size on that stream without the
 * allocator's lock (docs/allocator-tcache.md has the design and its invariants).
 *
 * To the allocator's structures and counters a block a cache holds is still allocated,
 * to its owner, and a pop takes it back only with the request and tag the counters hold
 * for it: no fast operation changes a counter. The counters overstate the truth by the
 * held blocks until a flush, which every reader of them (stats, snapshot, reset_peak)
 * and a global allocation that would raise a peak make first. */
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "allocator/tcache_impl.h"
#include "util/entry.h"
#include "util/grow.h"

/* ---- the calling thread's cache (TLS entries: tcache_reg.c) ---- */

static inline mt__tcache_t *tls_find(const mt_alloc_t *a)
{
    return mt__tc_find(a);
}

mt__tcache_t *mt__tc_mine(const mt_alloc_t *a)
{
    return tls_find(a);
}

/* ---- exclusion of the owner's fast paths ----
 * Every access to a cache other than its owner's fast paths holds mu (flushes, disown,
 * record_stream and block_info, the checker, thread exit): those exclude each other
 * through mu, and the owner needs no exclusion from its own fast paths while it holds mu.
 * The fast paths must be excluded by the others: the gate of tcache_gate.h (an asymmetric
 * Dekker with membarrier, else a test-and-set lock). */

static bool asym; /* membarrier registered: set once, before the first cache exists */
static pthread_once_t asym_once = PTHREAD_ONCE_INIT;

static void asym_init(void)
{
#if defined(__linux__) && defined(SYS_membarrier)
    asym = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
#endif
}

bool mt__tc_gate_asym(void)
{
    pthread_once(&asym_once, asym_init);
    return asym;
}

void mt__tc_gate_barrier(void)
{
    /* The stores are ordered before the barriers membarrier makes the other threads pass
     * by this fence, not by what the kernel happens to do on entry: the C11 model sees no
     * fence in a system call. It costs nothing beside the call. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#if defined(__linux__) && defined(SYS_membarrier)
    long rc = syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    mt_assert(rc == 0); /* registered (asym_init): it cannot fail */
    (void)rc;
#endif
}

void mt__tc_gate_announce(mt__tc_gate_t *g)
{
    __atomic_store_n(&g->claim, 1, __ATOMIC_RELAXED);
    mt__tc_gate_barrier();
}

/* The owner, before a fast operation; false = a claim stands: take the global path. */
static inline bool fast_enter(mt__tcache_t *c)
{
    return mt__tc_gate_enter(&c->gate, asym);
}

static inline void fast_exit(mt__tcache_t *c)
{
    mt__tc_gate_exit(&c->gate, asym);
}

void mt__tc_claim(mt__tcache_t *c)
{
    if (tls_find(c->a) != c)
        mt__tc_gate_claim(&c->gate, asym);
    mt__tc_push(c->a, c); /* its events before any the claimer's work makes */
}

void mt__tc_unclaim(mt__tcache_t *c)
{
    if (tls_find(c->a) == c)
        return;
    mt__tc_gate_unclaim(&c->gate, asym);
}

void mt__tc_lock_owner(mt_block_t *b)
{
    mt__tc_claim(b->tce->c);
}

void mt__tc_unlock_owner(mt_block_t *b)
{
    mt__tc_unclaim(b->tce->c);
}

bool mt__tc_held(const mt_block_t *b)
{
    return b->tce->held;
}

void mt__tc_used(mt_block_t *b)
{
    b->tce->used = b->nuses != 0;
}

/* ---- entries ---- */

#define TC_ENT_CHUNK 64 /* entries per allocation of a cache's storage */

static inline mt__tc_ent_t *live_get(const mt__tcache_t *c, uintptr_t addr)
{
    uint64_t v;
    return mt__amap_get(&c->live, addr, &v) == 0 ? (mt__tc_ent_t *)(uintptr_t)v : NULL;
}

/* A spare entry of c (mu held, c claimed), or NULL when host memory ran out. */
static mt__tc_ent_t *ent_get(mt__tcache_t *c)
{
    if (c->spare == NULL) {
        mt__tc_ent_t **nc = mt__grow(c->chunks, &c->cap_chunks, c->nchunks + 1, sizeof *nc, 8);
        if (nc == NULL)
            return NULL;
        c->chunks = nc;
        mt__tc_ent_t *chunk = calloc(TC_ENT_CHUNK, sizeof *chunk);
        if (chunk == NULL)
            return NULL;
        c->chunks[c->nchunks++] = chunk;
        for (size_t i = 0; i < TC_ENT_CHUNK; i++) {
            chunk[i].next = c->spare;
            c->spare = &chunk[i];
        }
    }
    mt__tc_ent_t *e = c->spare;
    c->spare = e->next;
    return e;
}

/* e's block leaves c (mu held, c claimed): out of the live table, e spare again. */
static void ent_drop(mt__tcache_t *c, mt__tc_ent_t *e)
{
    mt_assert(e->b->tce == e);
    (void)mt__amap_del(&c->live, e->addr);
    if (c->last == e)
        c->last = NULL;
    c->nplan -= e->pver != 0;
    e->b->tce = NULL;
    *e = (mt__tc_ent_t){.next = c->spare};
    c->spare = e;
}

static void ents_free(mt__tcache_t *c)
{
    for (size_t i = 0; i < c->nchunks; i++)
        free(c->chunks[i]);
    free(c->chunks);
    c->chunks = NULL;
    c->nchunks = c->cap_chunks = 0;
    c->spare = NULL;
}

/* ---- fast paths ---- */

/* ---- the fast paths' events (a->rec: a recording sink) ----
 * Kept in the cache's buffer and handed to the sink many at a time, always before the
 * global path touches the cache (mt__tc_push), so that the sink receives them before any
 * event that depends on them: the sequence it receives stays a history of the allocator. */

/* The pending pop's entry written (c->pend): a POP like the POP_FREE last in buf, of
 * the same block. */
static void pend_out(mt__tcache_t *c)
{
    mt_assert(c->pend && c->fold == c->pair && c->nbuf >= 1 && c->nbuf < c->nev);
    mt__evb_ent_t *x = &c->buf[c->nbuf];
    *x = c->buf[c->nbuf - 1];
    x->op = MT__EVB_POP;
    x->rep = 0;
    c->pend = false;
    c->pair = NULL;
    __atomic_store_n(&c->nbuf, c->nbuf + 1, __ATOMIC_RELAXED);
}

void mt__tc_push(mt_alloc_t *a, mt__tcache_t *c)
{
    if (c->pend)
        pend_out(c);
    if (c->nbuf == 0)
        return;
    mt__alloc_emit_cached(a, c->buf, c->nbuf, c->nev, c->out, mt__clock_now(&c->clk));
    c->nev = 0;
    c->fold = c->pair = NULL;
    __atomic_store_n(&c->nbuf, 0, __ATOMIC_RELAXED);
}

void mt__tc_push_all(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    for (mt__tcache_t *c = a->caches; c != NULL; c = c->next)
        if (__atomic_load_n(&c->nbuf, __ATOMIC_RELAXED) != 0) { /* a hint; the claim decides */
            mt__tc_claim(c);
            mt__tc_unclaim(c);
        }
    mt__alloc_gb_flush(a); /* and the global path's held back: everything kept is out */
}

/* Room for n more entries, of nev events, in c's buffer (the owner, inside its
 * exclusion). */
static inline mt__evb_ent_t *buf_room(mt_alloc_t *a, mt__tcache_t *c, uint32_t n, uint32_t nev)
{
    if (c->pend)
        pend_out(c);
    if (__builtin_expect(c->nev + nev > TC_BATCH, 0))
        mt__tc_push(a, c);
    mt__evb_ent_t *x = &c->buf[c->nbuf];
    c->nev += nev;
    c->fold = c->pair = NULL;
    __atomic_store_n(&c->nbuf, c->nbuf + n, __ATOMIC_RELAXED); /* read by mt__tc_push_all */
    return x;
}

/* Every field stored (a zeroing of the whole entry first compiled to a slow rep stos). */
static inline void fill(const mt__tc_ent_t *e, mt__evb_ent_t *x, int op, uint64_t size,
                        uint64_t requested)
{
    x->addr = e->addr;
    x->size = size;
    x->requested = requested;
    x->stream = e->sr->sid;
    x->op = (uint8_t)op;
    x->pool = (uint8_t)(e->sp == MT_STAT_SMALL ? MT_POOL_SMALL : MT_POOL_LARGE);
    x->tag = e->tag;
    x->rep = 0;
}

/* The call stack of a pop, asked of the sink (0: none); out of line: most sinks give none. */
static __attribute__((noinline)) uint32_t pop_stack(mt_alloc_t *a, const mt__tc_ent_t *e,
                                                    uintptr_t ra)
{
    const mt_event_sink_t *s = a->cfg.sink;
    uintptr_t entry = mt__entry_enter(ra);
    uint32_t stack = s->stack(s->ud, e->req, MT_POOL_NONE, a->cfg.stacks);
    mt__entry_leave(entry);
    return stack;
}

/* A pop: its alloc, after its call stack's ref when the sink gives one (as the global
 * path's). */
static inline void tell_pop(mt_alloc_t *a, mt__tcache_t *c, const mt__tc_ent_t *e, uintptr_t ra)
{
    uint32_t stack = 0;
    if (__builtin_expect(a->cfg.sink->stack != NULL && a->cfg.stacks != MT_STACKS_OFF, 0))
        stack = pop_stack(a, e, ra);
    /* The same pair again (a tight loop): buf's last entry is this block's POP_FREE, with
     * the same request and tag (a pop takes a block back only with those). The pop is
     * pending: its free makes it one more repeat of that entry, and anything else first
     * writes it as an entry of its own (pend_out). */
    if (c->pair == e && stack == 0 && c->nev + 3 <= TC_BATCH &&
        c->buf[c->nbuf - 1].rep < UINT8_MAX) {
        c->pend = true;
        c->fold = e;
        c->nev++;
        return;
    }
    mt__evb_ent_t *x = buf_room(a, c, stack != 0 ? 2 : 1, stack != 0 ? 2 : 1);
    if (stack != 0)
        fill(e, x++, MT__EVB_STACK, stack, 0);
    fill(e, x, MT__EVB_POP, e->size, e->req);
    c->fold = e;
}

static inline void tell_free(mt_alloc_t *a, mt__tcache_t *c, const mt__tc_ent_t *e)
{
    /* (fold, not the entry just written: a load of it would wait for that store) */
    if (c->fold == e && c->nev + 2 <= TC_BATCH) {
        mt__evb_ent_t *x = &c->buf[c->nbuf - 1];
        if (c->pend) {
            mt_assert(x->op == MT__EVB_POP_FREE && x->addr == e->addr && x->requested == e->req &&
                      x->tag == e->tag);
            x->rep++;
            c->pend = false;
        } else {
            x->op = MT__EVB_POP_FREE;
        }
        c->pair = e;
        c->fold = NULL;
        c->nev += 2;
        return;
    }
    fill(e, buf_room(a, c, 1, 2), MT__EVB_FREE, e->size, e->req);
}

/* mt__tc_malloc's pop (a = c->a), out of line: the way to the global path saves no
 * register. */
static __attribute__((noinline)) int pop(mt__tcache_t *c, size_t size, mt_stream_t *stream, int tag,
                                         void **out, uintptr_t ra)
{
    mt_alloc_t *a = c->a;
    size_t rsize = mt__alloc_round(a, size);
    if (!fast_enter(c))
        goto global;
    /* Only the newest held block can be the one best fit would give again: since the
     * global path handed it out, this cache did nothing but free it (k, seq), so no
     * other block was freed into it since, and its stream's free space did not change
     * (ver), nor the plan (pver). tc_on after fast_enter: a flush that turned it off is
     * ordered by the exclusion. */
    mt__tc_ent_t *e = c->held;
    if (e == NULL || e->size != rsize || e->sr->stream != stream || e->seq != c->nops ||
        e->k + 1 != c->nops || e->ver != __atomic_load_n(&e->sr->free_ver, __ATOMIC_RELAXED) ||
        (e->pver != 0 && e->pver != __atomic_load_n(&a->plan_ver, __ATOMIC_RELAXED)) ||
        !__atomic_load_n(&a->tc_on, __ATOMIC_RELAXED))
        goto refuse;
    /* Only with the block's own request and tag, which the counters hold for it: so
     * they never change on a fast path (tcache_impl.h). */
    if (size != e->req || tag != e->tag)
        goto refuse;
    mt_assert(e->held && e->c == c && e->b->tce == e);
    int sp = e->sp;
    c->held = e->next;
    c->nheld--;
    c->last = e;
    c->last_addr = e->addr;
    e->next = NULL;
    e->held = false;
    e->k = ++c->nops;
    c->pops++;
    mt__tc_counts_add(&c->cum, sp, tag, (int64_t)rsize, (int64_t)size, 1);
    if (a->rec)
        tell_pop(a, c, e, ra);
    fast_exit(c);
    *out = (void *)e->addr;
    return 0;
refuse:
    fast_exit(c);
global:
    return mt__alloc_malloc_global(a, size, stream, tag, out, ra, c);
}

int mt__tc_malloc(mt_alloc_t *a, size_t size, mt_stream_t *stream, int tag, void **out,
                  uintptr_t ra)
{
    mt__tcache_t *c = tls_find(a);
    /* With events pending, a malloc polls them first (the global path), as it always did:
     * a block another stream was using becomes reusable at the first malloc after. */
    /* Nothing held (a claimer only lowers nheld): no pop, whatever the request. */
    if (c == NULL || __atomic_load_n(&c->nheld, __ATOMIC_RELAXED) == 0 ||
        __atomic_load_n(&a->tc_pend, __ATOMIC_RELAXED) || size > ((size_t)1 << 60))
        return mt__alloc_malloc_global(a, size, stream, tag, out, ra, c);
    return pop(c, size, stream, tag, out, ra);
}

/* mt__tc_free's push (a = c->a), out of line as pop is. */
static __attribute__((noinline)) int push(mt__tcache_t *c, void *ptr)
{
    mt_alloc_t *a = c->a;
    if (!fast_enter(c))
        return mt__alloc_free_global(a, ptr, c);
    mt__tc_ent_t *e = c->last;
    if (e == NULL || e->addr != (uintptr_t)ptr)
        e = c->skip == 0 && c->live.n != 0 ? live_get(c, (uintptr_t)ptr) : NULL;
    /* Held: a double free, which the global path reports. used: record_stream's streams
     * get events, on the global path. A planned block whose pair no longer repeats the
     * plan: its free is the plan's. */
    if (e == NULL || e->held || e->used || !__atomic_load_n(&a->tc_on, __ATOMIC_RELAXED) ||
        (e->pver != 0 && e->pver != __atomic_load_n(&a->plan_ver, __ATOMIC_RELAXED)))
        goto slow;
    if (c->nheld >= TC_HELD)
        goto slow;
    e->next = c->held;
    c->held = e;
    c->nheld++;
    e->held = true;
    e->seq = ++c->nops;
    if (a->rec)
        tell_free(a, c, e);
    fast_exit(c);
    return 0;
slow:
    fast_exit(c);
    return mt__alloc_free_global(a, ptr, c);
}

int mt__tc_free(mt_alloc_t *a, void *ptr)
{
    mt__tcache_t *c = tls_find(a);
    /* No owned block live (a claimer only lowers the count): the free is the global
     * path's. The block handed out last is looked at first: in a pair, the one freed
     * now. While owning does not pay (skip), no other is looked up: the blocks this
     * thread allocates meanwhile are not owned, and an owned one that comes back then is
     * freed by the global path, which finds it through b->tce (a table look-up per free
     * of a program whose pairs do not repeat, the real traces', was most of this path);
     * so then a free of another address goes global at once (last_addr: the owner's). */
    if (c == NULL || __atomic_load_n(&c->live.n, __ATOMIC_RELAXED) == 0 ||
        (c->skip != 0 && c->last_addr != (uintptr_t)ptr))
        return mt__alloc_free_global(a, ptr, c);
    return push(c, ptr);
}

/* ---- flushing (mu held) ---- */

static void fold1(mt_stat_t *s, int sp, int64_t d)
{
    s[MT_STAT_ALL].allocated += (uint64_t)d;
    s[sp].allocated += (uint64_t)d;
}

/* Everything c holds goes back: held blocks freed to the bins, the cumulative counts
 * added; afterwards truth = counters for c. */
static bool flush_locked(mt_alloc_t *a, mt__tcache_t *c)
{
    mt__alloc_assert_owner(a);
    mt__tc_push(a, c);
    bool freed = c->nheld > 0;
    /* In the order the program freed them (the list's is newest first), so that segment
     * ages (GC) are the frees'. */
    mt__tc_ent_t *held[TC_HELD];
    size_t n = 0;
    for (mt__tc_ent_t *e = c->held; e != NULL; e = e->next)
        held[n++] = e;
    mt_assert(n == c->nheld);
    c->held = NULL;
    __atomic_store_n(&c->nheld, 0, __ATOMIC_RELAXED); /* its owner reads it before its gate */
    int64_t bytes = 0;
    a->rec_mute = true; /* the program's frees of them were told (fast_free) */
    while (n > 0) {
        mt__tc_ent_t *e = held[--n];
        mt_block_t *b = e->b;
        bytes += (int64_t)b->size;
        ent_drop(c, e);
        mt__alloc_free_block(a, b);
    }
    a->rec_mute = false;
    if (a->rec && bytes != 0)
        mt__alloc_rec_flushed(a, bytes);
    tc_counts_t *k = &c->cum;
    for (int sp = MT_STAT_SMALL; sp <= MT_STAT_LARGE; sp++) {
        fold1(a->st.allocated_bytes, sp, k->bytes[sp]); /* active_bytes' and active's too */
        fold1(a->st.allocation, sp, k->count[sp]);
        fold1(a->st.requested_bytes, sp, k->req[sp]);
    }
    for (int t = 0; t < MT_TAG_MAX; t++) {
        a->st.tag_allocated_bytes[t].allocated += (uint64_t)k->tag_bytes[t];
        a->st.tag_requested_bytes[t].allocated += (uint64_t)k->tag_req[t];
    }
    memset(k, 0, sizeof *k);
    return freed;
}

static inline bool dirty(const mt__tcache_t *c)
{
    return c->nheld > 0 || c->cum.count[MT_STAT_SMALL] != 0 || c->cum.count[MT_STAT_LARGE] != 0;
}

/* Another thread's cache (or this one's), claimed meanwhile, flushed if it has anything to
 * give back; true when a held block went back to the bins. */
static bool flush_claimed(mt_alloc_t *a, mt__tcache_t *c)
{
    mt__tc_claim(c);
    bool freed = dirty(c) && flush_locked(a, c);
    mt__tc_unclaim(c);
    return freed;
}

void mt__tc_flush_mine(mt_alloc_t *a, mt__tcache_t *c)
{
    mt__alloc_assert_owner(a);
    mt_assert(c == NULL || c == tls_find(a));
    /* The owner's own fields, and its claim is a no-op (its fast paths do not run now). */
    if (c == NULL)
        return;
    mt__tc_push(a, c); /* its fast operations came before this global one */
    if (c->nheld > 0)
        flush_locked(a, c);
}

bool mt__tc_flush_all(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    bool freed = false;
    for (mt__tcache_t *c = a->caches; c != NULL; c = c->next)
        freed |= flush_claimed(a, c);
    mt__alloc_gb_flush(a);
    return freed;
}

void mt__tc_flush_others(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    mt__tcache_t *mine = tls_find(a);
    for (mt__tcache_t *c = a->caches; c != NULL; c = c->next) {
        /* Only a cache that owns planned blocks may hold one (nplan changes under mu):
         * the others are not claimed, which costs a system call. */
        if (c != mine && c->nplan != 0)
            (void)flush_claimed(a, c);
    }
}

static inline bool over(const mt_stat_t *s, int64_t d)
{
    return s->current + d > s->peak;
}

void mt__tc_peak_guard(mt_alloc_t *a, const mt__tcache_t *mine, int sp, size_t size, size_t req,
                       int tag)
{
    const mt__tcache_t *c = a->caches;
    /* NULL when the cache was made after mt__tc_prepare (a free callback's request) */
    if (mine == NULL)
        mine = tls_find(a);
    mt_assert(mine == tls_find(a));
    /* No cache, or only the caller's and it holds nothing: the counters are the truth. */
    if (c == NULL || (c->next == NULL && c == mine && c->nheld == 0))
        return;
    const mt_alloc_stats_t *st = &a->st;
    int64_t z = (int64_t)size, r = (int64_t)req;
    /* An open statistics scope's peak is guarded as the others are (observe.c). */
    if ((a->nscopes != 0 && st->allocated_bytes[MT_STAT_ALL].current + z > a->scope_hw) ||
        over(&st->allocated_bytes[MT_STAT_ALL], z) || over(&st->allocated_bytes[sp], z) ||
        over(&st->active_bytes[MT_STAT_ALL], z) || over(&st->active_bytes[sp], z) ||
        over(&st->requested_bytes[MT_STAT_ALL], r) || over(&st->requested_bytes[sp], r) ||
        over(&st->allocation[MT_STAT_ALL], 1) || over(&st->allocation[sp], 1) ||
        over(&st->active[MT_STAT_ALL], 1) || over(&st->active[sp], 1) ||
        over(&st->tag_allocated_bytes[tag], z) || over(&st->tag_requested_bytes[tag], r))
        mt__tc_flush_all(a);
}

/* ---- ownership ---- */

/* The calling thread's cache for a, made (and linked) if there is none and a TLS entry is
 * free (mt__tc_prepare); NULL without one. */
static mt__tcache_t *mine(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    mt__tcache_t *c = tls_find(a);
    if (c != NULL)
        return c;
    int slot = -1;
    for (int i = 0; i < TC_TLS && slot < 0; i++)
        if (mt__tc_tls[i].id == 0)
            slot = i;
    (void)mt__tc_gate_asym();
    if (slot < 0)
        return NULL;
    c = aligned_alloc(_Alignof(mt__tcache_t), sizeof *c); /* no line shared with others */
    if (c == NULL)
        goto fail_cache;
    memset(c, 0, sizeof *c);
    c->clk = a->clk;            /* calibrated at create; mu held, which guards a->clk */
    if (mt__tc_tls_bind() != 0) /* its destructor runs at thread exit */
        goto fail_key;
    c->a = a;
    c->next = a->caches;
    if (a->caches != NULL)
        a->caches->prev = c;
    a->caches = c;
    mt__tc_tls[slot] = (mt__tc_tls_t){a->id, c};
    return c;

fail_key:
    free(c);
fail_cache:
    return NULL;
}

/* Whether c should own one more block (c is the calling thread's: its fields are its
 * own). */
static bool owning_pays(mt__tcache_t *c)
{
    if (c->skip > 0) {
        c->skip--;
        return false;
    }
    if (++c->owns < TC_WINDOW)
        return true;
    if ((uint64_t)c->pops * TC_PAYS < c->owns) {
        c->backoff = c->backoff == 0 ? TC_BACKOFF_MIN
                                     : (c->backoff < TC_BACKOFF_MAX ? c->backoff * 2 : c->backoff);
        c->skip = c->backoff;
    } else {
        c->backoff = 0;
    }
    c->owns = c->pops = 0;
    return true;
}

void mt__tc_own(mt_alloc_t *a, mt__tcache_t *c, mt_block_t *b, int sp, bool repeat)
{
    mt__alloc_assert_owner(a);
    mt_assert(c == NULL || c == tls_find(a));
    /* A backoff counts the thread's global allocations, ownable or not, as an idle
     * cache's (mt__tc_idle_own) do. */
    if (c != NULL && c->skip > 0) {
        c->skip--;
        return;
    }
    /* In a reservation only planned blocks: best fit there is the plan's fallback. */
    /* Oversize blocks stay on the global path, which keeps their counters. */
    /* A private pool's blocks neither: a thread's cache would hand them to eager requests
     * (the routing may end while a request that took one is under way). */
    if (!a->tc_on || !repeat || (b->seg->pool == MT__BP_RESERVED && !b->planned) ||
        b->size >= a->cfg.max_split_size || b->seg->priv)
        return;
    if (c == NULL) /* none yet (or made since mt__tc_prepare, by a free callback's request) */
        c = mine(a);
    if (c == NULL || !owning_pays(c))
        return;
    mt__tc_claim(c);
    mt__tc_ent_t *e = ent_get(c);
    if (e != NULL && mt__amap_put(&c->live, b->addr, (uint64_t)(uintptr_t)e) != 0) {
        e->next = c->spare;
        c->spare = e;
        e = NULL;
    }
    if (e != NULL) {
        mt_streamrec_t *sr = b->seg->bins->sr;
        *e = (mt__tc_ent_t){
            .b = b,
            .c = c,
            .addr = b->addr,
            .size = b->size,
            .sr = sr,
            .req = b->requested,
            .k = c->nops,
            .ver = __atomic_load_n(&sr->free_ver, __ATOMIC_RELAXED),
            .pver = b->planned ? a->plan_ver : 0,
            .tag = b->tag,
            .used = b->nuses != 0,
            .sp = (uint8_t)sp,
        };
        b->tce = e;
        c->nplan += b->planned;
        c->last = e;
        c->last_addr = e->addr;
    }
    mt__tc_unclaim(c);
}

int mt__tc_disown(mt_alloc_t *a, mt_block_t *b)
{
    mt__alloc_assert_owner(a);
    mt__tc_ent_t *e = b->tce;
    mt__tcache_t *c = e->c;
    mt__tc_claim(c);
    if (e->held) {
        mt__tc_unclaim(c);
        return MT_ENOENT;
    }
    ent_drop(c, e);
    mt__tc_unclaim(c);
    return 0;
}

/* ---- state changes ---- */

void mt__tc_quiesce(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    __atomic_store_n(&a->tc_on, 0, __ATOMIC_RELAXED);
    mt__tc_flush_all(a);
}

void mt__tc_resume(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    bool on = a->cfg.tcache && !a->warming && a->id != 0 && a->nroutes == 0;
    __atomic_store_n(&a->tc_on, on ? 1 : 0, __ATOMIC_RELAXED);
}

/* Flushes c and gives up its live blocks (mu held, c claimed or its thread gone). */
static void give_back(mt_alloc_t *a, mt__tcache_t *c)
{
    flush_locked(a, c);
    for (size_t i = 0; i < c->live.cap; i++)
        if (c->live.keys[i] != 0)
            ((mt__tc_ent_t *)(uintptr_t)c->live.vals[i])->b->tce = NULL;
    c->last = NULL;
    c->nplan = 0;
}

/* Unlinks c (given back) from a and frees it (mu held). */
static void unlink_free(mt_alloc_t *a, mt__tcache_t *c)
{
    /* The bias names no freed gate (mt__alloc_lock_unbiased before a cache's free). */
    mt_assert(__atomic_load_n(&a->bias, __ATOMIC_RELAXED) != &c->gate && a->lk_gate != &c->gate);
    if (a->bias_cand == &c->gate)
        a->bias_cand = NULL;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        a->caches = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    mt__amap_fini(&c->live);
    ents_free(c);
    free(c);
}

void mt__tc_drop(mt_alloc_t *a, mt__tcache_t *c)
{
    mt__tc_claim(c);
    give_back(a, c);
    mt__tc_unclaim(c);
    unlink_free(a, c);
}

void mt__tc_free_all(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    while (a->caches != NULL)
        mt__tc_drop(a, a->caches);
}

/* ---- fork (fork.c) ---- */

void mt__tc_claim_all(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    for (mt__tcache_t *c = a->caches; c != NULL; c = c->next)
        mt__tc_claim(c);
}

void mt__tc_unclaim_all(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    for (mt__tcache_t *c = a->caches; c != NULL; c = c->next)
        mt__tc_unclaim(c);
}

void mt__tc_fork_child_reg(void)
{
    mt__tc_reg_reinit();
    /* Registration is a property of the process's memory; made again, in case the kernel
     * does not carry it into the child. Without it the gates fall back to their lock,
     * which is safe to switch to now that every gate is open and one thread runs. */
    if (asym)
        asym_init();
}

void mt__tc_fork_child(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    mt__tcache_t *mine = tls_find(a), *next;
    for (mt__tcache_t *c = a->caches; c != NULL; c = next) {
        next = c->next;
        /* The parent's claims (and, without membarrier, their locks) are held by this
         * thread, and no fast path was running: every gate is simply open again. */
        c->gate = (mt__tc_gate_t){0};
        if (c == mine)
            continue;
        /* Its thread does not exist here: what it held is free, what it had handed out
         * stays allocated, as an ordinary block the program may still free. */
        give_back(a, c);
        unlink_free(a, c);
    }
}
