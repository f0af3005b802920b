/* Per-thread caches: a block the thread freed, kept whole in a LIFO of its (stream, size),
 * taken back by the thread's next request of that rounded size on that stream without the
 * allocator's lock (docs/allocator-tcache.md has the design and its invariants).
 *
 * To the allocator's structures a block a cache holds is still allocated, to its owner.
 * The counters the fast paths would change stay untouched; each cache keeps allowances:
 * how much the allocator's counters overstate the program's truth because of its blocks.
 * A pop is taken only if no allowance goes negative, so the counters never understate the
 * truth and no fast operation can pass a peak; a global allocation that would raise a peak
 * first flushes every cache, so the peak it sets is the truth's. */
#include <stdlib.h>
#include <string.h>

#include "allocator/tcache.h"

#define TC_SLOTS 64 /* LIFOs per cache, direct-mapped by (stream, size) */
#define TC_DEPTH 16 /* blocks per LIFO at most */
#define TC_TLS   4  /* allocators a thread caches for at once */
_Static_assert(TC_SLOTS == 64, "slot index is the top 6 bits of a hash");

/* One LIFO: blocks of exactly `size` bytes of `stream`, newest first, linked by bin_next.
 * Invariants: n <= TC_DEPTH; n > 0 => every block on it has tc_held, owner = this cache,
 * size = size, tc_sr->stream = stream, tc_sp = sp, and slot_of(stream, size) is its index. */
typedef struct tc_lifo_s {
    mt_block_t *head;
    mt_stream_t *stream;
    size_t size; /* bytes */
    uint32_t n;
    uint8_t sp; /* MT_STAT_SMALL or MT_STAT_LARGE */
} tc_lifo_t;

/* The allowances and cumulative counts of one cache, per counter the fast paths touch.
 * bytes/count/req are indexed by stat pool (MT_STAT_SMALL, MT_STAT_LARGE; [ALL] unused):
 * the ALL counter's allowance is their sum; active_bytes and active have the allowances
 * of allocated_bytes and allocation (a held block is neither allocated nor active to the
 * program, a popped one both). */
typedef struct tc_counts_s {
    int64_t bytes[MT_STAT_N], count[MT_STAT_N], req[MT_STAT_N];
    int64_t tag_bytes[MT_TAG_MAX], tag_req[MT_TAG_MAX];
} tc_counts_t;

/* A thread's cache for one allocator.
 * Invariants (g(b) = the block's values in the allocator's counters: size, 1, requested
 * under tag; t(b) = the program's: 0 when tc_held, else size, 1, tc_req under tc_tag):
 *   live holds exactly the blocks with owner = this cache, each ACTIVE_ALLOCATED in a->map;
 *   nheld = number of them with tc_held = sum of lifo[i].n;
 *   div lists exactly the live (not held) ones whose t differs from g, ndiv of them;
 *   allow.c = sum over live of g_c(b) - t_c(b) >= 0 for every counter c;
 *   so for every counter: truth_c = a->st.c.current - sum over caches allow.c and
 *   truth_c <= a->st.c.current <= a->st.c.peak;
 *   cum.c = sum of t_c over the pops since the last flush (added to .allocated at flush). */
struct mt__tcache_s {
    _Alignas(64) uint8_t lock; /* test-and-set spin lock: the owner's fast ops, a flush */
    mt_alloc_t *a;             /* borrowed */
    mt__tcache_t *next;        /* a->caches, under mu */
    mt__tcache_t *prev;
    mt_addrmap_t live; /* owned blocks by address */
    mt_block_t *div;   /* live blocks with t != g, linked by bin_next/bin_prev */
    size_t ndiv, nheld;
    uint64_t nops;     /* pushes and pops so far: the held blocks' order, and whether a
                        * block's pop repeats the best fit that handed it out */
    tc_counts_t allow; /* >= 0 each */
    tc_counts_t cum;   /* cumulative truth increments since the last flush */
    tc_lifo_t lifo[TC_SLOTS];
};

/* ---- the lock ---- */

static inline void tc_lock(mt__tcache_t *c)
{
    while (__atomic_test_and_set(&c->lock, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(&c->lock, __ATOMIC_RELAXED))
            __builtin_ia32_pause();
}

static inline void tc_unlock(mt__tcache_t *c)
{
    __atomic_clear(&c->lock, __ATOMIC_RELEASE);
}

void mt__tc_lock_owner(mt_block_t *b)
{
    tc_lock(b->owner);
}

void mt__tc_unlock_owner(mt_block_t *b)
{
    tc_unlock(b->owner);
}

/* ---- TLS entries and the registry of live allocators ---- */

typedef struct tc_tls_s {
    uint64_t id; /* allocator id; 0 = free entry */
    mt__tcache_t *c;
} tc_tls_t;

static _Thread_local tc_tls_t tls[TC_TLS];
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
static int tls_key_rc = -1;
static uint64_t next_id = 1;

/* The ids of the allocators alive now, with their addresses (thread exit flushes only
 * into those). Lock order: reg_mu, then an allocator's mu. */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct reg_ent_s {
    uint64_t id;
    mt_alloc_t *a;
} * reg;
static size_t nreg, cap_reg;

static mt_alloc_t *reg_find(uint64_t id)
{
    for (size_t i = 0; i < nreg; i++)
        if (reg[i].id == id)
            return reg[i].a;
    return NULL;
}

int mt__tc_register(mt_alloc_t *a)
{
    a->id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&reg_mu);
    int rc = 0;
    if (nreg == cap_reg) {
        size_t cap = cap_reg ? cap_reg * 2 : 8;
        struct reg_ent_s *n = realloc(reg, cap * sizeof *n);
        if (n == NULL)
            rc = MT_ENOMEM;
        else {
            reg = n;
            cap_reg = cap;
        }
    }
    if (rc == 0)
        reg[nreg++] = (struct reg_ent_s){a->id, a};
    pthread_mutex_unlock(&reg_mu);
    return rc;
}

void mt__tc_unregister(mt_alloc_t *a)
{
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < nreg; i++)
        if (reg[i].id == a->id)
            reg[i] = reg[--nreg];
    if (nreg == 0) { /* the last one: nothing kept for a process that is done */
        free(reg);
        reg = NULL;
        cap_reg = 0;
    }
    pthread_mutex_unlock(&reg_mu);
    for (int i = 0; i < TC_TLS; i++)
        if (tls[i].id == a->id)
            tls[i] = (tc_tls_t){0, NULL};
}

static inline mt__tcache_t *tls_find(const mt_alloc_t *a)
{
    for (int i = 0; i < TC_TLS; i++)
        if (tls[i].id == a->id)
            return tls[i].c;
    return NULL;
}

static void thread_exit(void *arg);

static void make_key(void)
{
    tls_key_rc = pthread_key_create(&tls_key, thread_exit);
}

void mt__tc_prepare(mt_alloc_t *a)
{
    if (!__atomic_load_n(&a->tc_on, __ATOMIC_RELAXED) || tls_find(a) != NULL)
        return;
    for (int i = 0; i < TC_TLS; i++)
        if (tls[i].id == 0)
            return;
    /* Every entry taken: those naming destroyed allocators are free (their caches went
     * with them). */
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < TC_TLS; i++)
        if (reg_find(tls[i].id) == NULL)
            tls[i] = (tc_tls_t){0, NULL};
    pthread_mutex_unlock(&reg_mu);
}

/* ---- fast paths ---- */

static inline unsigned slot_of(const mt_stream_t *s, size_t size)
{
    uint64_t h = ((uint64_t)(uintptr_t)s >> 4) * 0xff51afd7ed558ccdull ^ (uint64_t)(size >> 8);
    return (unsigned)((h * 0x9E3779B97F4A7C15ull) >> 58);
}

static inline void counts_add(tc_counts_t *k, int sp, int tag, int64_t size, int64_t req,
                              int64_t sign)
{
    k->bytes[sp] += sign * size;
    k->count[sp] += sign;
    k->req[sp] += sign * req;
    k->tag_bytes[tag] += sign * size;
    k->tag_req[tag] += sign * req;
}

static inline void div_link(mt__tcache_t *c, mt_block_t *b)
{
    b->tc_div = true;
    b->bin_prev = NULL;
    b->bin_next = c->div;
    if (c->div != NULL)
        c->div->bin_prev = b;
    c->div = b;
    c->ndiv++;
}

static inline void div_unlink(mt__tcache_t *c, mt_block_t *b)
{
    if (b->bin_prev != NULL)
        b->bin_prev->bin_next = b->bin_next;
    else
        c->div = b->bin_next;
    if (b->bin_next != NULL)
        b->bin_next->bin_prev = b->bin_prev;
    b->bin_next = b->bin_prev = NULL;
    b->tc_div = false;
    c->ndiv--;
}

bool mt__tc_malloc(mt_alloc_t *a, size_t size, mt_stream_t *stream, int tag, void **out)
{
    /* With events pending, a malloc polls them first (the global path), as it always did:
     * a block another stream was using becomes reusable at the first malloc after. */
    if (!__atomic_load_n(&a->tc_on, __ATOMIC_RELAXED) ||
        __atomic_load_n(&a->tc_pend, __ATOMIC_RELAXED))
        return false;
    mt__tcache_t *c = tls_find(a);
    if (c == NULL || size > ((size_t)1 << 60))
        return false;
    size_t rsize = mt__alloc_round_size(size, a->cfg.roundup_power2_divisions);
    tc_lifo_t *l = &c->lifo[slot_of(stream, rsize)];
    tc_lock(c);
    mt_block_t *b = l->head;
    int sp = l->sp;
    /* tc_on again under the lock: a flush that turned it off is ordered by the lock.
     * Only the block best fit would give again: since the global path handed it out,
     * this cache did nothing but free it (tc_k, tc_seq) and its stream's free space did
     * not change (tc_ver). Only if every allowance stays >= 0. */
    if (l->n == 0 || l->stream != stream || l->size != rsize || b->tc_seq != c->nops ||
        b->tc_k + 1 != c->nops ||
        b->tc_ver != __atomic_load_n(&b->tc_sr->tc_ver, __ATOMIC_RELAXED) ||
        (b->tc_pver != 0 && b->tc_pver != __atomic_load_n(&a->plan_ver, __ATOMIC_RELAXED)) ||
        !__atomic_load_n(&a->tc_on, __ATOMIC_RELAXED) || c->allow.req[sp] < (int64_t)size ||
        c->allow.tag_bytes[tag] < (int64_t)rsize || c->allow.tag_req[tag] < (int64_t)size) {
        tc_unlock(c);
        return false;
    }
    mt_assert(b->tc_held && b->owner == c && b->size == rsize);
    mt_assert(c->allow.bytes[sp] >= (int64_t)rsize && c->allow.count[sp] >= 1);
    l->head = b->bin_next;
    l->n--;
    c->nheld--;
    b->bin_next = NULL;
    b->tc_held = false;
    b->tc_req = size;
    b->tc_tag = (uint8_t)tag;
    b->tc_k = ++c->nops;
    counts_add(&c->allow, sp, tag, (int64_t)rsize, (int64_t)size, -1);
    counts_add(&c->cum, sp, tag, (int64_t)rsize, (int64_t)size, 1);
    if (size != b->requested || tag != b->tag)
        div_link(c, b);
    tc_unlock(c);
    *out = (void *)b->addr;
    return true;
}

bool mt__tc_free(mt_alloc_t *a, void *ptr)
{
    if (!__atomic_load_n(&a->tc_on, __ATOMIC_RELAXED))
        return false;
    mt__tcache_t *c = tls_find(a);
    if (c == NULL)
        return false;
    tc_lock(c);
    mt_block_t *b = mt__addrmap_get(&c->live, (uintptr_t)ptr);
    /* Held: a double free, which the global path reports. nuses: record_stream's streams
     * get events, on the global path. */
    if (b == NULL || b->tc_held || b->nuses != 0 || !__atomic_load_n(&a->tc_on, __ATOMIC_RELAXED))
        goto slow;
    /* A planned block whose pair no longer repeats the plan: its free is the plan's. */
    if (b->tc_pver != 0 && b->tc_pver != __atomic_load_n(&a->plan_ver, __ATOMIC_RELAXED))
        goto slow;
    tc_lifo_t *l = &c->lifo[slot_of(b->tc_sr->stream, b->size)];
    if (l->n > 0 && (l->stream != b->tc_sr->stream || l->size != b->size || l->n >= TC_DEPTH))
        goto slow;
    if (b->tc_div)
        div_unlink(c, b);
    counts_add(&c->allow, b->tc_sp, b->tc_tag, (int64_t)b->size, (int64_t)b->tc_req, 1);
    l->stream = b->tc_sr->stream;
    l->size = b->size;
    l->sp = b->tc_sp;
    b->bin_next = l->head;
    l->head = b;
    l->n++;
    c->nheld++;
    b->tc_held = true;
    b->tc_seq = ++c->nops;
    tc_unlock(c);
    return true;
slow:
    tc_unlock(c);
    return false;
}

/* ---- flushing (mu held) ---- */

/* Makes live block b's counters the program's: the allocator's counters and the
 * allowances move by t(b) - g(b), so the truth stays. */
static void rebase(mt_alloc_t *a, mt__tcache_t *c, mt_block_t *b)
{
    int sp = b->tc_sp;
    int64_t size = (int64_t)b->size, g = (int64_t)b->requested, t = (int64_t)b->tc_req;
    mt_stat_t *st = a->st.requested_bytes;
    st[MT_STAT_ALL].current += t - g;
    st[sp].current += t - g;
    a->st.tag_allocated_bytes[b->tag].current -= size;
    a->st.tag_allocated_bytes[b->tc_tag].current += size;
    a->st.tag_requested_bytes[b->tag].current -= g;
    a->st.tag_requested_bytes[b->tc_tag].current += t;
    c->allow.req[sp] -= g - t;
    c->allow.tag_bytes[b->tag] -= size;
    c->allow.tag_bytes[b->tc_tag] += size;
    c->allow.tag_req[b->tag] -= g;
    c->allow.tag_req[b->tc_tag] += t;
    b->requested = b->tc_req;
    b->tag = b->tc_tag;
    div_unlink(c, b);
}

static int by_seq(const void *x, const void *y)
{
    uint64_t p = (*(mt_block_t *const *)x)->tc_seq, q = (*(mt_block_t *const *)y)->tc_seq;
    return p < q ? -1 : p > q;
}

static void fold1(mt_stat_t *s, int sp, int64_t d)
{
    s[MT_STAT_ALL].allocated += (uint64_t)d;
    s[sp].allocated += (uint64_t)d;
}

/* Everything c holds goes back: diverged blocks rebased, held blocks freed to the bins,
 * the cumulative counts added; afterwards the allowances are 0 and truth = counters. */
static bool flush_locked(mt_alloc_t *a, mt__tcache_t *c)
{
    mt__alloc_assert_owner(a);
    while (c->div != NULL)
        rebase(a, c, c->div);
    bool freed = c->nheld > 0;
    /* In the order the program freed them, so that segment ages (GC) are the frees'. */
    mt_block_t *held[TC_SLOTS * TC_DEPTH];
    size_t n = 0;
    for (int i = 0; i < TC_SLOTS && n < c->nheld; i++) {
        tc_lifo_t *l = &c->lifo[i];
        for (mt_block_t *b = l->head; b != NULL; b = b->bin_next)
            held[n++] = b;
        l->head = NULL;
        l->n = 0;
    }
    mt_assert(n == c->nheld);
    qsort(held, n, sizeof held[0], by_seq);
    c->nheld = 0;
    for (size_t i = 0; i < n; i++) {
        mt_block_t *b = held[i];
        b->bin_next = NULL;
        counts_add(&c->allow, b->tc_sp, b->tag, (int64_t)b->size, (int64_t)b->requested, -1);
        mt__addrmap_del(&c->live, b->addr);
        b->owner = NULL;
        b->tc_held = false;
        mt__alloc_free_block(a, b);
    }
    tc_counts_t *k = &c->cum;
    for (int sp = MT_STAT_SMALL; sp <= MT_STAT_LARGE; sp++) {
        fold1(a->st.allocated_bytes, sp, k->bytes[sp]);
        fold1(a->st.active_bytes, sp, k->bytes[sp]);
        fold1(a->st.allocation, sp, k->count[sp]);
        fold1(a->st.active, sp, k->count[sp]);
        fold1(a->st.requested_bytes, sp, k->req[sp]);
    }
    for (int t = 0; t < MT_TAG_MAX; t++) {
        a->st.tag_allocated_bytes[t].allocated += (uint64_t)k->tag_bytes[t];
        a->st.tag_requested_bytes[t].allocated += (uint64_t)k->tag_req[t];
    }
    memset(k, 0, sizeof *k);
#if MT_ASSERT_LEVEL >= 1
    static const tc_counts_t zero;
    mt_assert(memcmp(&c->allow, &zero, sizeof zero) == 0);
#endif
    return freed;
}

static inline bool dirty(const mt__tcache_t *c)
{
    return c->nheld > 0 || c->ndiv > 0 || c->cum.count[MT_STAT_SMALL] != 0 ||
           c->cum.count[MT_STAT_LARGE] != 0;
}

void mt__tc_flush_mine(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    mt__tcache_t *c = tls_find(a);
    if (c == NULL)
        return;
    tc_lock(c);
    if (c->nheld > 0 || c->ndiv > 0)
        flush_locked(a, c);
    tc_unlock(c);
}

bool mt__tc_flush_all(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    bool freed = false;
    for (mt__tcache_t *c = a->caches; c != NULL; c = c->next) {
        tc_lock(c);
        if (dirty(c))
            freed |= flush_locked(a, c);
        tc_unlock(c);
    }
    return freed;
}

void mt__tc_flush_others(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    mt__tcache_t *mine = tls_find(a);
    for (mt__tcache_t *c = a->caches; c != NULL; c = c->next) {
        if (c == mine)
            continue;
        tc_lock(c);
        if (dirty(c))
            flush_locked(a, c);
        tc_unlock(c);
    }
}

static inline bool over(const mt_stat_t *s, int64_t d)
{
    return s->current + d > s->peak;
}

void mt__tc_peak_guard(mt_alloc_t *a, int sp, size_t size, size_t req, int tag)
{
    if (a->caches == NULL)
        return;
    const mt_alloc_stats_t *st = &a->st;
    int64_t z = (int64_t)size, r = (int64_t)req;
    if (over(&st->allocated_bytes[MT_STAT_ALL], z) || over(&st->allocated_bytes[sp], z) ||
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
    mt__tcache_t *c = tls_find(a);
    if (c != NULL)
        return c;
    int slot = -1;
    for (int i = 0; i < TC_TLS && slot < 0; i++)
        if (tls[i].id == 0)
            slot = i;
    pthread_once(&tls_once, make_key);
    if (slot < 0 || tls_key_rc != 0)
        return NULL;
    c = aligned_alloc(_Alignof(mt__tcache_t), sizeof *c); /* no line shared with others */
    if (c == NULL)
        goto fail_cache;
    memset(c, 0, sizeof *c);
    if (mt__addrmap_init(&c->live) != 0)
        goto fail_live;
    if (pthread_setspecific(tls_key, tls) != 0) /* its destructor runs at thread exit */
        goto fail_key;
    c->a = a;
    c->next = a->caches;
    if (a->caches != NULL)
        a->caches->prev = c;
    a->caches = c;
    tls[slot] = (tc_tls_t){a->id, c};
    return c;

fail_key:
    mt__addrmap_fini(&c->live);
fail_live:
    free(c);
fail_cache:
    return NULL;
}

void mt__tc_own(mt_alloc_t *a, mt_block_t *b, int sp, bool repeat)
{
    mt__alloc_assert_owner(a);
    /* In a reservation only planned blocks: best fit there is the plan's fallback. */
    if (!a->tc_on || !repeat || (b->seg->pool == MT__BP_RESERVED && !b->planned))
        return;
    mt__tcache_t *c = mine(a);
    if (c == NULL)
        return;
    tc_lock(c);
    if (mt__addrmap_put(&c->live, b) == 0) {
        b->owner = c;
        b->tc_held = false;
        b->tc_div = false;
        b->tc_req = b->requested;
        b->tc_tag = b->tag;
        b->tc_sp = (uint8_t)sp;
        b->tc_sr = b->seg->bins->sr;
        b->tc_k = c->nops;
        b->tc_ver = __atomic_load_n(&b->tc_sr->tc_ver, __ATOMIC_RELAXED);
        b->tc_pver = b->planned ? a->plan_ver : 0;
    }
    tc_unlock(c);
}

int mt__tc_disown(mt_alloc_t *a, mt_block_t *b)
{
    mt__alloc_assert_owner(a);
    mt__tcache_t *c = b->owner;
    tc_lock(c);
    if (b->tc_held) {
        tc_unlock(c);
        return MT_ENOENT;
    }
    if (b->tc_div) {
        /* Its allowance g - t leaves with it: if the rest would go negative (other live
         * blocks asked more than their counters hold), the whole cache is flushed. */
        int sp = b->tc_sp, gt = b->tag, tt = b->tc_tag;
        int64_t g = (int64_t)b->requested, t = (int64_t)b->tc_req, z = (int64_t)b->size;
        int64_t tb = c->allow.tag_bytes[gt] - (gt != tt ? z : 0);
        int64_t tr = c->allow.tag_req[gt] - g + (gt == tt ? t : 0);
        if (c->allow.req[sp] - (g - t) < 0 || tb < 0 || tr < 0)
            flush_locked(a, c);
        else
            rebase(a, c, b);
    }
    mt__addrmap_del(&c->live, b->addr);
    b->owner = NULL;
    tc_unlock(c);
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
    bool on = a->cfg.tcache && a->cfg.sink == NULL && !a->warming && a->id != 0;
    __atomic_store_n(&a->tc_on, on ? 1 : 0, __ATOMIC_RELAXED);
}

/* Flushes c, gives up its live blocks and frees it (mu held). */
static void drop(mt_alloc_t *a, mt__tcache_t *c)
{
    tc_lock(c);
    flush_locked(a, c);
    for (size_t i = 0; i < c->live.cap; i++)
        if (c->live.keys[i] != 0)
            c->live.vals[i]->owner = NULL;
    tc_unlock(c);
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        a->caches = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    mt__addrmap_fini(&c->live);
    free(c);
}

void mt__tc_free_all(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    while (a->caches != NULL)
        drop(a, a->caches);
}

/* pthread key destructor: this thread's caches go back into their allocators, if alive. */
static void thread_exit(void *arg)
{
    (void)arg;
    for (int i = 0; i < TC_TLS; i++) {
        if (tls[i].id == 0)
            continue;
        pthread_mutex_lock(&reg_mu);
        mt_alloc_t *a = reg_find(tls[i].id);
        if (a != NULL) {
            mt__alloc_lock(a);
            drop(a, tls[i].c);
            mt__alloc_unlock(a);
        }
        pthread_mutex_unlock(&reg_mu);
        tls[i] = (tc_tls_t){0, NULL};
    }
}

/* ---- checker ---- */

bool mt__tc_in_owner(const mt_block_t *b)
{
    /* The live table changes only under mu, which the checker holds. */
    return mt__addrmap_get(&b->owner->live, b->addr) == b;
}

size_t mt__tc_count(const mt_alloc_t *a)
{
    size_t n = 0;
    for (const mt__tcache_t *c = a->caches; c != NULL; c = c->next)
        n++;
    return n;
}

static const char *check_one(mt_alloc_t *a, mt__tcache_t *c)
{
    tc_counts_t want;
    memset(&want, 0, sizeof want);
    size_t held = 0, div = 0;
    for (size_t i = 0; i < c->live.cap; i++) {
        if (c->live.keys[i] == 0)
            continue;
        mt_block_t *b = c->live.vals[i];
        if (b->owner != c || b->addr != c->live.keys[i])
            return "tcache: live entry names a block of another owner";
        if (b->state != MT_BLOCK_ACTIVE_ALLOCATED || mt__addrmap_get(&a->map, b->addr) != b)
            return "tcache: owned block not allocated in the address map";
        if (b->tc_sp != mt__stat_pool(b->seg->pool) || b->tc_sr != b->seg->bins->sr)
            return "tcache: owned block's stream or pool disagrees with its segment";
        if (b->tc_pver != 0 && b->tc_pver == a->plan_ver && !b->planned)
            return "tcache: block with the plan's current version not planned";
        if (b->tc_pver > a->plan_ver)
            return "tcache: block's plan version ahead of the plan's";
        counts_add(&want, b->tc_sp, b->tag, (int64_t)b->size, (int64_t)b->requested, 1);
        if (b->tc_held) {
            held++;
            if (b->tc_div)
                return "tcache: held block on the diverged list";
            continue;
        }
        counts_add(&want, b->tc_sp, b->tc_tag, (int64_t)b->size, (int64_t)b->tc_req, -1);
        div += b->tc_div;
        if (b->tc_div != (b->tc_req != b->requested || b->tc_tag != b->tag))
            return "tcache: diverged flag disagrees with the block's values";
        if (b->tc_req == 0 || b->tc_req > b->size)
            return "tcache: live block's requested size outside (0, size]";
    }
    size_t nlist = 0;
    for (const mt_block_t *b = c->div; b != NULL; b = b->bin_next)
        if (++nlist > div || b->owner != c || !b->tc_div)
            return "tcache: diverged list disagrees with its blocks";
    if (div != c->ndiv || nlist != div)
        return "tcache: diverged count wrong";
    size_t nlifo = 0;
    for (int i = 0; i < TC_SLOTS; i++) {
        const tc_lifo_t *l = &c->lifo[i];
        if (l->n > TC_DEPTH)
            return "tcache: LIFO over its depth";
        size_t k = 0;
        for (const mt_block_t *b = l->head; b != NULL; b = b->bin_next, k++)
            if (k >= l->n || b->owner != c || !b->tc_held || b->size != l->size ||
                b->tc_sr->stream != l->stream || b->tc_sp != l->sp ||
                slot_of(l->stream, l->size) != (unsigned)i)
                return "tcache: LIFO block out of place";
        if (k != l->n)
            return "tcache: LIFO count wrong";
        nlifo += k;
    }
    if (nlifo != held || held != c->nheld)
        return "tcache: held blocks and LIFOs disagree";
    if (memcmp(&want, &c->allow, sizeof want) != 0)
        return "tcache: allowances differ from the owned blocks' counters minus the program's";
    const int64_t *w = (const int64_t *)&c->allow;
    for (size_t i = 0; i < sizeof want / sizeof *w; i++)
        if (w[i] < 0)
            return "tcache: negative allowance";
    return NULL;
}

/* Counters minus every allowance must stay within [0, peak]. */
static const char *check_truth(const mt_alloc_t *a, const tc_counts_t *sum)
{
    const mt_alloc_stats_t *st = &a->st;
    for (int sp = MT_STAT_ALL; sp < MT_STAT_N; sp++) {
        int64_t z = sp == MT_STAT_ALL ? sum->bytes[1] + sum->bytes[2] : sum->bytes[sp];
        int64_t n = sp == MT_STAT_ALL ? sum->count[1] + sum->count[2] : sum->count[sp];
        int64_t r = sp == MT_STAT_ALL ? sum->req[1] + sum->req[2] : sum->req[sp];
        if (st->allocated_bytes[sp].current - z < 0 || st->allocation[sp].current - n < 0 ||
            st->requested_bytes[sp].current - r < 0 || st->active_bytes[sp].current - z < 0 ||
            st->active[sp].current - n < 0)
            return "tcache: a counter minus the allowances is negative";
    }
    for (int t = 0; t < MT_TAG_MAX; t++)
        if (st->tag_allocated_bytes[t].current < sum->tag_bytes[t] ||
            st->tag_requested_bytes[t].current < sum->tag_req[t])
            return "tcache: a tag counter minus the allowances is negative";
    return NULL;
}

const char *mt__tc_check(mt_alloc_t *a)
{
    tc_counts_t sum;
    memset(&sum, 0, sizeof sum);
    const char *why = NULL;
    bool on = a->tc_on;
    for (mt__tcache_t *c = a->caches; c != NULL && why == NULL; c = c->next) {
        if (c->a != a || (c->next != NULL && c->next->prev != c))
            return "tcache: cache list broken";
        tc_lock(c);
        why = check_one(a, c);
        if (why == NULL && !on && (c->nheld > 0 || c->ndiv > 0))
            why = "tcache: blocks held while the fast paths are off";
        int64_t *s = (int64_t *)&sum;
        const int64_t *k = (const int64_t *)&c->allow;
        for (size_t i = 0; i < sizeof sum / sizeof *s; i++)
            s[i] += k[i];
        tc_unlock(c);
    }
    if (why != NULL)
        return why;
    return check_truth(a, &sum);
}
