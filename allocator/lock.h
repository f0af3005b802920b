/* The allocator's lock (included by internal.h): mu, biased to one thread's cache.
 *
 * A program that allocates from one thread takes mu once per global operation, and the
 * uncontended mutex's two atomic instructions are a third of a global malloc or free. So
 * the lock is biased, as Java's monitors once were (Kawachiya et al., "Lock reservation",
 * OOPSLA 2002), with the asymmetric Dekker of tcache_gate.h in place of their CAS:
 *
 *   bias owner, to take:  g->lkbusy = 1; compiler barrier; bias == g ? hold : (lkbusy = 0, mu)
 *   bias owner, to drop:  g->lkbusy = 0 (release)
 *   any other thread:     mu; if bias: bias = NULL; seq_cst fence; membarrier; wait
 *                         lkbusy = 0 (acquire); then hold with mu
 *
 * membarrier puts a full barrier in the owner's program order while the revoker waits in
 * the call: the owner's lkbusy = 1 is before it (the revoker sees it and waits for the
 * release) or its load of bias is after it (it sees NULL and takes mu). So exactly one of
 * them holds the lock; the data moves by the release of lkbusy or of mu.
 *
 * The bias is g, the gate of a thread's cache (tcache_impl.h), so that each owner writes
 * only its own lkbusy and a thread that once owned the bias cannot clobber the next
 * owner's. It is set by a thread that took mu `64 << bias_level` times in a row with no
 * other thread between; a revocation raises bias_level when the bias served fewer than
 * 2^12 takes (threads that take turns stop paying membarrier calls) and lowers it
 * otherwise. Only with cfg.lock_bias, where membarrier works (mt__tc_gate_asym), and not
 * under TSan, which cannot see the barrier.
 *
 * A cache whose gate is the bias is freed only with mu held and the bias cleared
 * (mt__alloc_lock_unbiased); mt__alloc_wait from a biased hold releases it and takes mu,
 * returning as a spurious wake-up would (every caller waits in a loop).
 *
 * Debug builds record the holder, so that functions that need the lock assert it
 * (mt__alloc_assert_owner, after jemalloc's malloc_mutex_assert_owner). With expensive
 * assertions, the unlock that ends a public operation checks the whole allocator,
 * amortized: each operation earns MT__CHECK_STEPS steps and the walk runs once the credit
 * covers its cost, so a small allocator is checked after every operation or few, and a
 * large one stays within a constant factor of its speed. */
#ifndef MT_ALLOCATOR_LOCK_H
#define MT_ALLOCATOR_LOCK_H

#define MT__CHECK_STEPS 256
/* Runs of mu's takes a bias needs: 64 << level, level <= MT__BIAS_LEVEL_MAX. */
#define MT__BIAS_RUN       64
#define MT__BIAS_LEVEL_MAX 14
#define MT__BIAS_SERVED    ((uint64_t)1 << 12)

/* Runs mt__alloc_is_valid when the credit allows and aborts on a violation. */
void mt__alloc_check_amortized(mt_alloc_t *a);
#if MT_ASSERT_LEVEL >= 1
/* True when the calling thread holds the lock. */
static inline bool mt__alloc_held(const mt_alloc_t *a)
{
    return __atomic_load_n(&a->owner, __ATOMIC_RELAXED) == mt__thread_id();
}
/* A macro, so that a failure names the caller's file, line and function. */
#define mt__alloc_assert_owner(a) mt_assert(mt__alloc_held(a))
#else
#define mt__alloc_assert_owner(a) ((void)(a))
#endif
/* Every invariant of the allocator (the struct comments), lock held; a static description
 * of the first violation, or NULL. Allocates nothing. */
const char *mt__alloc_is_valid(mt_alloc_t *a);

/* The lock's invariants (the holder): bias_level <= MT__BIAS_LEVEL_MAX; lk_gate = NULL or
 * its lkbusy = 1; bias = NULL or the gate of a cache in a->caches. Static text of the
 * first violation, or NULL. */
const char *mt__alloc_lock_check(const mt_alloc_t *a);

/* Takes mu (lock.c): the bias revoked if another thread's, or set to mine (the calling
 * thread's cache's gate, or NULL) after a run. */
void mt__alloc_lock_mu(mt_alloc_t *a, mt__tc_gate_t *mine);
/* Takes mu with no bias left, the caller's own included (destroy, fork, a cache's free). */
void mt__alloc_lock_unbiased(mt_alloc_t *a);

static inline void mt__alloc_took(mt_alloc_t *a)
{
#if MT_ASSERT_LEVEL >= 1
    mt_assert(__atomic_load_n(&a->owner, __ATOMIC_RELAXED) == 0);
    __atomic_store_n(&a->owner, mt__thread_id(), __ATOMIC_RELAXED);
#else
    (void)a;
#endif
}

/* The owner's half of the protocol: true when the thread of gate mine now holds the lock by
 * its bias; false (lkbusy back to 0) when the bias is not, or no longer, mine. */
static inline bool mt__alloc_bias_enter(mt_alloc_t *a, mt__tc_gate_t *mine)
{
    __atomic_store_n(&mine->lkbusy, 1, __ATOMIC_RELAXED);
    /* The revoker's membarrier orders the store before the load (tcache_gate.h). */
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if (__builtin_expect(__atomic_load_n(&a->bias, __ATOMIC_ACQUIRE) == mine, 1))
        return true;
    __atomic_store_n(&mine->lkbusy, 0, __ATOMIC_RELEASE);
    return false;
}

/* The revoker's first half (mu held): bias = NULL made visible to every thread, each of
 * which passes a full barrier before this returns; then it waits for the owner's lkbusy
 * to be 0 (lock.c). */
void mt__alloc_bias_drop(mt_alloc_t *a);

/* Takes the lock; mine: the gate of the calling thread's cache for a (the hot paths have it
 * at hand), or NULL. */
static inline void mt__alloc_lock_by(mt_alloc_t *a, mt__tc_gate_t *mine)
{
    if (mine != NULL && __atomic_load_n(&a->bias, __ATOMIC_RELAXED) == mine &&
        mt__alloc_bias_enter(a, mine)) {
        a->lk_gate = mine;
        a->bias_takes++;
        mt__alloc_took(a);
        return;
    }
    mt__alloc_lock_mu(a, mine);
}

static inline void mt__alloc_lock(mt_alloc_t *a)
{
    mt__alloc_lock_mu(a, NULL);
}

/* Releases the lock without the whole check (destroy, and the checker itself). */
static inline void mt__alloc_unlock_raw(mt_alloc_t *a)
{
#if MT_ASSERT_LEVEL >= 1
    mt__alloc_assert_owner(a);
    __atomic_store_n(&a->owner, 0, __ATOMIC_RELAXED);
#endif
    mt__tc_gate_t *g = a->lk_gate;
    if (g != NULL) {
        a->lk_gate = NULL;
        __atomic_store_n(&g->lkbusy, 0, __ATOMIC_RELEASE);
    } else {
        pthread_mutex_unlock(&a->mu);
    }
}

static inline void mt__alloc_unlock(mt_alloc_t *a)
{
#if MT_ASSERT_LEVEL >= 2
    mt__alloc_check_amortized(a);
#endif
    mt__alloc_unlock_raw(a);
}

/* Waits on a->cv for in-flight work of another thread to end (the lock released
 * meanwhile); from a biased hold, the lock is released and taken again through mu. */
void mt__alloc_wait(mt_alloc_t *a);

/* True when the lock is biased to the calling thread's cache gate mine (tests). */
static inline bool mt__alloc_biased_to(const mt_alloc_t *a, const mt__tc_gate_t *mine)
{
    return mine != NULL && __atomic_load_n(&a->bias, __ATOMIC_RELAXED) == mine;
}

#endif
