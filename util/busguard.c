/* See busguard.h. */
#include "util/busguard.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { SLOT_FREE = 0, SLOT_BUSY = 1, SLOT_LIVE = 2 };

/* A guarded range. The handler reads start, len and prot only while state is SLOT_LIVE
 * (acquire); add and remove move a slot FREE -> BUSY -> LIVE -> BUSY -> FREE, writing the
 * fields while it is BUSY. */
typedef struct slot_s {
    _Atomic int state;
    _Atomic uintptr_t start;
    _Atomic size_t len; /* bytes */
    _Atomic int prot;
    _Atomic bool hit;
} slot_t;

static slot_t g_slots[MT_BUSGUARD_MAX];
static _Atomic int g_high; /* slots [0, g_high) may be live */
static size_t g_page;      /* bytes; set before the handler is installed */
static pthread_mutex_t g_install = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction g_prev; /* the disposition ours replaced, for faults not ours */

/* A fault that is not ours: what would have happened without us. */
static void chain(int sig, siginfo_t *si, void *uc)
{
    if ((g_prev.sa_flags & SA_SIGINFO) && g_prev.sa_sigaction) {
        g_prev.sa_sigaction(sig, si, uc);
        return;
    }
    if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN) {
        g_prev.sa_handler(sig);
        return;
    }
    /* The default action (an ignored SIGBUS from a fault would retry forever): raised
     * while blocked, it is delivered, and kills, as the handler returns. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    int saved = errno;
    uintptr_t a = (uintptr_t)si->si_addr;
    int high = atomic_load_explicit(&g_high, memory_order_acquire);
    for (int i = 0; i < high && si->si_code > 0; i++) {
        slot_t *s = &g_slots[i];
        if (atomic_load_explicit(&s->state, memory_order_acquire) != SLOT_LIVE)
            continue;
        uintptr_t start = atomic_load_explicit(&s->start, memory_order_relaxed);
        if (a - start >= atomic_load_explicit(&s->len, memory_order_relaxed))
            continue;
        /* The raw system call: an interceptor (a sanitizer's) need not be signal-safe. */
        long r = syscall(SYS_mmap, a & ~(uintptr_t)(g_page - 1), g_page,
                         atomic_load_explicit(&s->prot, memory_order_relaxed),
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0L);
        if (r == -1)
            break;
        atomic_store_explicit(&s->hit, true, memory_order_release);
        errno = saved;
        return;
    }
    errno = saved;
    chain(sig, si, uc);
}

/* Installs on_sigbus unless it is the current disposition (another part of the program,
 * or a test framework, may have set its own since). */
static int ensure_handler(void)
{
    int rc = 0;
    pthread_mutex_lock(&g_install);
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) != 0) {
        rc = MT_EIO;
    } else if (!(cur.sa_flags & SA_SIGINFO) || cur.sa_sigaction != on_sigbus) {
        if (g_page == 0)
            g_page = (size_t)sysconf(_SC_PAGESIZE);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        g_prev = cur;
        if (sigaction(SIGBUS, &sa, NULL) != 0)
            rc = MT_EIO;
    }
    pthread_mutex_unlock(&g_install);
    return rc;
}

int mt__busguard_add(const void *addr, size_t len, int prot)
{
    int rc = ensure_handler();
    if (rc)
        return rc;
    for (int i = 0; i < MT_BUSGUARD_MAX; i++) {
        slot_t *s = &g_slots[i];
        int expect = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&s->state, &expect, SLOT_BUSY))
            continue;
        atomic_store_explicit(&s->start, (uintptr_t)addr, memory_order_relaxed);
        atomic_store_explicit(&s->len, len, memory_order_relaxed);
        atomic_store_explicit(&s->prot, prot, memory_order_relaxed);
        atomic_store_explicit(&s->hit, false, memory_order_relaxed);
        int high = atomic_load(&g_high);
        while (high < i + 1 && !atomic_compare_exchange_weak(&g_high, &high, i + 1))
            ;
        atomic_store_explicit(&s->state, SLOT_LIVE, memory_order_release);
        return i + 1;
    }
    return MT_ENOMEM;
}

void mt__busguard_remove(int id)
{
    if (id <= 0 || id > MT_BUSGUARD_MAX)
        return;
    slot_t *s = &g_slots[id - 1];
    atomic_store_explicit(&s->state, SLOT_BUSY, memory_order_release);
    atomic_store_explicit(&s->len, 0, memory_order_relaxed);
    atomic_store_explicit(&s->state, SLOT_FREE, memory_order_release);
}

bool mt__busguard_hit(int id)
{
    if (id <= 0 || id > MT_BUSGUARD_MAX)
        return false;
    return atomic_load_explicit(&g_slots[id - 1].hit, memory_order_acquire);
}
