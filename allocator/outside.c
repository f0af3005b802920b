/* Device memory outside the allocator (docs/outside.md): the device's used bytes as the
 * driver reports them (MT_EV_DEVICE), and what callers such as the drop-in report of the
 * memory libraries took without the allocator (MT_EV_OUTSIDE_*), by the library's name.
 *
 * Library ids are the process's, shared by its allocators, so that one producer's stream
 * never gives two names one id: ids 1..MT__LIB_MAX in the order first named, id 0 for no
 * name and for names past the table. Each allocator announces an id (MT_EV_LIBRARY_LABEL)
 * before its first event that carries it, since each may have its own sink. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "allocator/internal.h"

/* Ids fit the event's tag field with a tag's bound, so no reader indexes past its tables. */
#define MT__LIB_MAX (MT_TAG_MAX - 1)

/* Invariants: lib_count <= MT__LIB_MAX; lib_name[1..lib_count] non-empty and distinct, each
 * at most MT_EVENT_LABEL_MAX bytes cut as labels are (mt_event_label_fit); written under
 * lib_mu, never changed once written. lib_dev[d][id] = bytes of library id outside on device
 * d, summed over every allocator of d (a free never takes it below 0). */
static pthread_mutex_t lib_mu = PTHREAD_MUTEX_INITIALIZER;
static char lib_name[MT__LIB_MAX + 1][MT_EVENT_LABEL_MAX + 1];
static unsigned lib_count;
static uint64_t lib_dev[256][MT__LIB_MAX + 1];

/* The id of library (interned), 0 for none or a full table. */
static unsigned lib_id(const char *library)
{
    if (library == NULL || library[0] == '\0')
        return 0;
    char name[MT_EVENT_LABEL_MAX + 1];
    size_t n = mt_event_label_fit(library);
    memcpy(name, library, n);
    name[n] = '\0';
    unsigned id = 0;
    pthread_mutex_lock(&lib_mu);
    for (unsigned i = 1; i <= lib_count; i++)
        if (strcmp(lib_name[i], name) == 0) {
            id = i;
            break;
        }
    if (id == 0 && lib_count < MT__LIB_MAX) {
        id = ++lib_count;
        memcpy(lib_name[id], name, n + 1);
    }
    pthread_mutex_unlock(&lib_mu);
    return id;
}

void mt__alloc_emit_device(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    if (a->cfg.sink == NULL)
        return;
    size_t free_b = 0, total_b = 0;
    if (mt_backend_mem_get_info(a->backend, &free_b, &total_b) != 0 || free_b > total_b)
        return;
    uint64_t self = 0;
    if (mt_backend_process_used(a->backend, &self) != 0)
        self = UINT64_MAX; /* not known: the split then has no other processes' part */
    mt__alloc_emit(a, MT_EV_DEVICE, self, total_b - free_b, total_b, 0, MT_POOL_NONE, 0);
}

/* Announces id on a's stream once (lock held). */
static void announce(mt_alloc_t *a, unsigned id)
{
    if (id == 0 || (a->lib_told >> id & 1u) || a->cfg.sink == NULL)
        return;
    a->lib_told |= UINT32_C(1) << id;
    mt_event_rec_t ev;
    mt__alloc_fill_rec(a, &ev, MT_EV_LIBRARY_LABEL, 0, 0, 0, 0, MT_POOL_NONE, (int)id,
                       mt__clock_now(&a->clk));
    pthread_mutex_lock(&lib_mu);
    mt_event_label_pack(&ev, lib_name[id]);
    pthread_mutex_unlock(&lib_mu);
    mt__alloc_emit_recs(a, &ev, 1);
}

int mt_alloc_note_outside(mt_alloc_t *a, bool freed, uint64_t addr, uint64_t size,
                          const char *library)
{
    if (a == NULL || size == 0)
        return MT_EINVAL;
    unsigned id = lib_id(library);
    uint64_t *held = &lib_dev[(uint8_t)a->device][id];
    if (freed) {
        uint64_t cur = __atomic_load_n(held, __ATOMIC_RELAXED), next;
        do
            next = cur > size ? cur - size : 0;
        while (!__atomic_compare_exchange_n(held, &cur, next, true, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED));
    } else {
        __atomic_fetch_add(held, size, __ATOMIC_RELAXED);
    }
    if (a->cfg.sink == NULL)
        return 0;
    mt__alloc_lock(a);
    announce(a, id);
    mt__alloc_emit(a, freed ? MT_EV_OUTSIDE_FREE : MT_EV_OUTSIDE_ALLOC, addr, size, 0, 0,
                   MT_POOL_NONE, (int)id);
    mt__alloc_emit_device(a);
    mt__alloc_unlock(a);
    return 0;
}

uint64_t mt_alloc_outside_bytes(const mt_alloc_t *a, const char *library)
{
    if (a == NULL)
        return 0;
    const uint64_t *row = lib_dev[(uint8_t)a->device];
    if (library != NULL) {
        unsigned id = 0;
        pthread_mutex_lock(&lib_mu);
        for (unsigned i = 1; i <= lib_count && id == 0; i++)
            if (strcmp(lib_name[i], library) == 0)
                id = i;
        pthread_mutex_unlock(&lib_mu);
        return id == 0 && library[0] != '\0' ? 0 : __atomic_load_n(&row[id], __ATOMIC_RELAXED);
    }
    uint64_t sum = 0;
    for (unsigned i = 0; i <= MT__LIB_MAX; i++)
        sum += __atomic_load_n(&row[i], __ATOMIC_RELAXED);
    return sum;
}

/* Appends to buf (NUL-terminated, of cap bytes, len used) where the device's memory that
 * the allocator does not hold is: the libraries memtrace saw, largest first (at most 4),
 * and the rest. used: the device's used bytes now; reserved: the allocator's. */
size_t mt__alloc_outside_text(const mt_alloc_t *a, char *buf, size_t len, size_t cap, size_t used,
                              size_t reserved)
{
    if (len + 1 >= cap || used <= reserved)
        return len;
    const uint64_t *row = lib_dev[(uint8_t)a->device];
    unsigned top[4] = {0};
    uint64_t topb[4] = {0}, libs = 0;
    for (unsigned i = 0; i <= MT__LIB_MAX; i++) {
        uint64_t b = __atomic_load_n(&row[i], __ATOMIC_RELAXED);
        libs += b;
        for (int k = 0; k < 4 && b > 0; k++)
            if (b > topb[k]) {
                memmove(&top[k + 1], &top[k], (size_t)(3 - k) * sizeof top[0]);
                memmove(&topb[k + 1], &topb[k], (size_t)(3 - k) * sizeof topb[0]);
                top[k] = i;
                topb[k] = b;
                break;
            }
    }
    char h[3][32];
    size_t outside = used - reserved;
    int w = snprintf(buf + len, cap - len, " Outside memtrace's allocator the device holds %s",
                     mt__alloc_human(outside, h[0], sizeof h[0]));
    len = w > 0 && (size_t)w < cap - len ? len + (size_t)w : cap - 1;
    pthread_mutex_lock(&lib_mu);
    for (int k = 0; k < 4 && topb[k] > 0 && len + 1 < cap; k++) {
        mt__alloc_human((size_t)topb[k], h[1], sizeof h[1]);
        w = snprintf(buf + len, cap - len, "%s%s %s", k ? ", " : ": ",
                     top[k] ? lib_name[top[k]] : "unnamed libraries", h[1]);
        len = w > 0 && (size_t)w < cap - len ? len + (size_t)w : cap - 1;
    }
    pthread_mutex_unlock(&lib_mu);
    uint64_t self = 0;
    bool known = mt_backend_process_used(a->backend, &self) == 0 && self <= used;
    if (len + 1 < cap && known && used > self) {
        /* The driver tells this process's own bytes: the rest of the device is others'. */
        size_t others = used - (size_t)self;
        w = snprintf(buf + len, cap - len, "%sother processes %s", libs ? ", " : ": ",
                     mt__alloc_human(others, h[2], sizeof h[2]));
        len = w > 0 && (size_t)w < cap - len ? len + (size_t)w : cap - 1;
        libs += others;
    }
    if (len + 1 < cap) {
        size_t rest = outside > libs ? outside - (size_t)libs : 0;
        mt__alloc_human(rest, h[2], sizeof h[2]);
        mt__alloc_human((size_t)a->used_at_create, h[1], sizeof h[1]);
        w = snprintf(buf + len, cap - len,
                     "%s%s not seen by memtrace (the CUDA context,%s copies of the runtime it "
                     "does not hook; %s was in use when the allocator was created).",
                     libs ? ", and " : ", ", h[2], known ? "" : " other processes,", h[1]);
        len = w > 0 && (size_t)w < cap - len ? len + (size_t)w : cap - 1;
    }
    return len;
}
