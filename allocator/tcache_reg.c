/* The registry of live allocators and each thread's TLS entries for the caches it has
 * (tcache.c): a thread's exit gives its caches back to the allocators still alive, and
 * fork's handlers walk the registry (fork.c). Lock order: reg_mu, then an allocator's mu. */
#include <stdlib.h>

#include "allocator/tcache_impl.h"
#include "util/grow.h"

_Thread_local mt__tc_tls_t mt__tc_tls[TC_TLS];
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
    struct reg_ent_s *n = mt__grow(reg, &cap_reg, nreg + 1, sizeof *n, 8);
    if (n == NULL)
        rc = MT_ENOMEM;
    else
        reg = n;
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
        if (mt__tc_tls[i].id == a->id)
            mt__tc_tls[i] = (mt__tc_tls_t){0, NULL};
}

static void thread_exit(void *arg);

static void make_key(void)
{
    tls_key_rc = pthread_key_create(&tls_key, thread_exit);
}

void mt__tc_prepare_slow(mt_alloc_t *a)
{
    for (int i = 0; i < TC_TLS; i++)
        if (mt__tc_tls[i].id == 0)
            return;
    /* Every entry taken: those naming destroyed allocators are free (their caches went
     * with them). */
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < TC_TLS; i++)
        if (reg_find(mt__tc_tls[i].id) == NULL)
            mt__tc_tls[i] = (mt__tc_tls_t){0, NULL};
    pthread_mutex_unlock(&reg_mu);
}

int mt__tc_tls_bind(void)
{
    pthread_once(&tls_once, make_key);
    if (tls_key_rc != 0)
        return MT_ENOMEM;
    return pthread_setspecific(tls_key, mt__tc_tls) == 0 ? 0 : MT_ENOMEM;
}

/* pthread key destructor: this thread's caches go back into their allocators, if alive. */
static void thread_exit(void *arg)
{
    (void)arg;
    for (int i = 0; i < TC_TLS; i++) {
        if (mt__tc_tls[i].id == 0)
            continue;
        pthread_mutex_lock(&reg_mu);
        mt_alloc_t *a = reg_find(mt__tc_tls[i].id);
        if (a != NULL) {
            mt__alloc_lock_unbiased(a); /* the cache's gate may be the bias */
            mt__tc_drop(a, mt__tc_tls[i].c);
            mt__alloc_unlock(a);
        }
        pthread_mutex_unlock(&reg_mu);
        mt__tc_tls[i] = (mt__tc_tls_t){0, NULL};
    }
}

/* ---- fork (fork.c) ---- */

void mt__tc_reg_lock(void)
{
    pthread_mutex_lock(&reg_mu);
}

void mt__tc_reg_unlock(void)
{
    pthread_mutex_unlock(&reg_mu);
}

size_t mt__tc_reg_count(void)
{
    return nreg;
}

mt_alloc_t *mt__tc_reg_get(size_t i)
{
    return i < nreg ? reg[i].a : NULL;
}

void mt__tc_reg_reinit(void)
{
    pthread_mutex_init(&reg_mu, NULL);
}
