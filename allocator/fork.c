/* Fork handling (cfg.atfork): a child of fork() gets one thread, the forking one, and a
 * copy of the parent's memory taken at one instant. Any lock another thread held then is
 * held for ever in the child, and any structure another thread was changing is half
 * changed. The handlers below, registered once per process by the first allocator that
 * asks (pthread_atfork), make that instant a quiet one for every allocator that asked.
 *
 * prepare, in a fixed order (the lock order of docs/allocator-locking.md):
 *   1. the registry of live allocators (tcache.c), which also keeps allocators from being
 *      created or destroyed meanwhile;
 *   2. each allocator's mu, in registry order, then waiting (cv) until it has no work in
 *      flight with the lock released: a synchronize, a vm_* call or a range being reserved
 *      belongs to a thread the child will not have, and would be waited for in vain;
 *   3. each allocator's thread caches (their gates), so that no fast path is half done;
 *   4. the backends' locks (mt__backend_fork), last, since the allocator calls its backend
 *      with mu held.
 * parent: the same released. child: every lock made anew (a mutex held at fork is not
 * unlocked in the child; one made anew is), and the state of the threads that are gone
 * taken back: their caches flushed into the bins (what they held is free, what they had
 * handed out stays allocated to the program), counts of threads waiting inside the
 * allocator cleared.
 *
 * Waiting in prepare for work in flight cannot deadlock on the allocator's account: that
 * work needs only its own allocator's mu (released by the wait) and its backend's locks
 * (not yet taken). */
#include "allocator/tcache.h"
#include "backend/backend.h"

static pthread_once_t register_once = PTHREAD_ONCE_INIT;
static int register_rc = -1;

/* Work another thread does with this allocator's lock released, which the child would wait
 * for in vain. */
static bool busy(const mt_alloc_t *a)
{
    if (mt__alloc_inflight(a))
        return true;
    for (size_t i = 0; i < a->nstreams; i++)
        if (a->streams[i]->reserving[0] || a->streams[i]->reserving[1])
            return true;
    return false;
}

/* The i-th allocator of the registry that asked for fork handling, or NULL. */
static mt_alloc_t *asked(size_t i)
{
    mt_alloc_t *a = mt__tc_reg_get(i);
    return a != NULL && a->cfg.atfork ? a : NULL;
}

/* Whether allocator i's backend was already handled for an earlier one. */
static bool backend_seen(size_t i)
{
    mt_backend_t *b = asked(i)->backend;
    for (size_t j = 0; j < i; j++)
        if (asked(j) != NULL && asked(j)->backend == b)
            return true;
    return false;
}

static void fork_prepare(void)
{
    mt__tc_reg_lock();
    size_t n = mt__tc_reg_count();
    for (size_t i = 0; i < n; i++) {
        mt_alloc_t *a = asked(i);
        if (a == NULL)
            continue;
        mt__alloc_lock_unbiased(a); /* every cache but the caller's goes in the child */
        while (busy(a))
            mt__alloc_wait(a);
    }
    for (size_t i = 0; i < n; i++)
        if (asked(i) != NULL) {
            mt__tc_claim_all(asked(i));
            mt__alloc_gb_flush(asked(i)); /* the child would hand them over again */
        }
    for (size_t i = 0; i < n; i++)
        if (asked(i) != NULL && !backend_seen(i))
            mt__backend_fork(asked(i)->backend, MT__FORK_PREPARE);
}

static void fork_parent(void)
{
    size_t n = mt__tc_reg_count();
    for (size_t i = 0; i < n; i++)
        if (asked(i) != NULL && !backend_seen(i))
            mt__backend_fork(asked(i)->backend, MT__FORK_PARENT);
    for (size_t i = 0; i < n; i++) {
        mt_alloc_t *a = asked(i);
        if (a == NULL)
            continue;
        mt__tc_unclaim_all(a);
        mt__alloc_unlock_raw(a);
    }
    mt__tc_reg_unlock();
}

/* The child's copy of a, its mu held by this thread (prepare): locks made anew, the state
 * of the threads that are gone taken back. */
static void child_one(mt_alloc_t *a)
{
    /* The mutex is made anew rather than unlocked, as the preload does, so nothing of the
     * parent's waiters survives in it; the same goes for the condition variable. */
    pthread_mutexattr_t at;
    bool attr = pthread_mutexattr_init(&at) == 0;
#if defined(PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP)
    if (attr)
        (void)pthread_mutexattr_settype(&at, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
    pthread_mutex_init(&a->mu, attr ? &at : NULL);
    if (attr)
        pthread_mutexattr_destroy(&at);
    pthread_cond_init(&a->cv, NULL);
#if MT_ASSERT_LEVEL >= 1
    a->owner = 0;
#endif
    a->bias = NULL; /* a wait in prepare may have left the caller's own */
    a->lk_gate = NULL;
    a->bias_cand = NULL;
    a->bias_run = 0;
    mt__alloc_lock(a);
    mt__tc_fork_child(a);
    /* Threads that were waiting inside the allocator (for pages of a range, or while
     * running the free callbacks) are gone with their counts. */
    mt__exp_fork_child(a);
    a->in_free_cbs = false;
    mt__alloc_unlock(a); /* with expensive assertions: the child's state checked whole */
}

static void fork_child(void)
{
    size_t n = mt__tc_reg_count();
    for (size_t i = 0; i < n; i++)
        if (asked(i) != NULL && !backend_seen(i))
            mt__backend_fork(asked(i)->backend, MT__FORK_CHILD);
    mt__tc_fork_child_reg();
    for (size_t i = 0; i < n; i++)
        if (asked(i) != NULL)
            child_one(asked(i));
}

static void register_handlers(void)
{
    register_rc = pthread_atfork(fork_prepare, fork_parent, fork_child);
}

int mt__alloc_fork_register(void)
{
    pthread_once(&register_once, register_handlers);
    return register_rc == 0 ? 0 : MT_ENOMEM;
}
