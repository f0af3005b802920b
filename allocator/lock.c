/* The allocator's lock: mu and its bias (lock.h). */
#include <sched.h>

#include "allocator/internal.h"
#include "allocator/tcache_impl.h"

#if defined(__SANITIZE_THREAD__)
#define MT__BIAS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MT__BIAS_TSAN 1
#endif
#endif

/* Whether a bias may be set: cfg.lock_bias, membarrier works, and TSan (which cannot see its
 * barrier) is not watching. */
static bool bias_allowed(const mt_alloc_t *a)
{
#ifdef MT__BIAS_TSAN
    (void)a;
    return false;
#else
    return a->cfg.lock_bias && mt__tc_gate_asym();
#endif
}

static mt__tc_gate_t *gate_of_mine(const mt_alloc_t *a)
{
    mt__tcache_t *c = mt__tc_find(a);
    return c != NULL ? &c->gate : NULL;
}

void mt__alloc_bias_drop(mt_alloc_t *a)
{
    __atomic_store_n(&a->bias, NULL, __ATOMIC_RELAXED);
    mt__tc_gate_barrier();
}

/* Ends bias b (mu held; b not the calling thread's): once this returns, its owner neither
 * holds the lock by it nor can take it so. */
static void revoke(mt_alloc_t *a, mt__tc_gate_t *b)
{
    mt__alloc_bias_drop(a);
    /* The owner's hold is one operation; if its thread was preempted inside it, this one
     * gives up its core rather than spin through the owner's time slice. */
    for (unsigned spins = 0; __atomic_load_n(&b->lkbusy, __ATOMIC_ACQUIRE); spins++) {
        if (spins < 1024)
            mt__cpu_relax();
        else
            sched_yield();
    }
    /* bias_takes is the owner's, read after its release. A bias that served few takes
     * before another thread came makes the next one harder to win. */
    if (a->bias_takes < MT__BIAS_SERVED) {
        if (a->bias_level < MT__BIAS_LEVEL_MAX)
            a->bias_level++;
    } else if (a->bias_level > 0) {
        a->bias_level--;
    }
}

/* A take of mu by the thread of gate mine (or an unknown one): its run, and a bias when the
 * run is long enough (mu held, no bias). */
static void run(mt_alloc_t *a, mt__tc_gate_t *mine)
{
    if (mine == NULL || a->bias_cand != mine) {
        a->bias_cand = mine;
        a->bias_run = 1;
        return;
    }
    if (++a->bias_run < ((uint32_t)MT__BIAS_RUN << a->bias_level) || !bias_allowed(a))
        return;
    a->bias_run = 0;
    a->bias_takes = 0;
    __atomic_store_n(&a->bias, mine, __ATOMIC_RELEASE);
}

/* mu just taken by the thread of gate mine (NULL = look it up): another thread's bias
 * revoked, this one's run counted if counted. */
static void took_mu(mt_alloc_t *a, mt__tc_gate_t *mine, bool counted)
{
    if (mine == NULL)
        mine = gate_of_mine(a);
    mt__tc_gate_t *b = __atomic_load_n(&a->bias, __ATOMIC_RELAXED);
    if (b == NULL) {
        if (counted)
            run(a, mine);
    } else if (b != mine) { /* the owner's own fast path does not run while it is here */
        revoke(a, b);
    }
    mt__alloc_took(a);
}

void mt__alloc_lock_mu(mt_alloc_t *a, mt__tc_gate_t *mine)
{
    pthread_mutex_lock(&a->mu);
    took_mu(a, mine, true);
}

void mt__alloc_lock_unbiased(mt_alloc_t *a)
{
    pthread_mutex_lock(&a->mu);
    took_mu(a, NULL, false);                            /* another thread's bias revoked */
    __atomic_store_n(&a->bias, NULL, __ATOMIC_RELAXED); /* and the caller's dropped */
    a->bias_cand = NULL;
    a->bias_run = 0;
}

void mt__alloc_wait(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    mt__tc_gate_t *g = a->lk_gate;
    if (g != NULL) {
        /* mu may be held by a revoker waiting for this hold to end: release, then queue. */
        mt__alloc_unlock_raw(a);
        mt__alloc_lock_mu(a, g);
        return;
    }
#if MT_ASSERT_LEVEL >= 1
    __atomic_store_n(&a->owner, 0, __ATOMIC_RELAXED);
#endif
    pthread_cond_wait(&a->cv, &a->mu);
    /* mu taken again inside the wait: a bias set meanwhile is revoked as at any take. */
    took_mu(a, NULL, false);
}

const char *mt__alloc_lock_check(const mt_alloc_t *a)
{
    if (a->bias_level > MT__BIAS_LEVEL_MAX)
        return "lock's bias level above its maximum";
    if (a->lk_gate != NULL && __atomic_load_n(&a->lk_gate->lkbusy, __ATOMIC_RELAXED) != 1)
        return "lock held by a bias whose gate is not busy";
    /* Read by the holder: a revoker may only clear it meanwhile. */
    const mt__tc_gate_t *b = __atomic_load_n(&a->bias, __ATOMIC_RELAXED);
    if (b == NULL)
        return NULL;
    for (const mt__tcache_t *c = a->caches; c != NULL; c = c->next)
        if (&c->gate == b)
            return NULL;
    return "lock biased to the gate of no live cache";
}
