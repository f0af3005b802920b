/* An address table: non-zero 64-bit addresses to 64-bit values (an index, a pointer), open
 * addressing with linear probing from a Fibonacci-hashed home slot and backward-shift
 * deletion (no tombstones). The one address table of the tree: the allocator's blocks, the
 * thread caches' entries, the model's and readers' tables (stack ids among them, as id + 1),
 * the pickle reader's copies of a streamed batch. The probes are inline: they are
 * on the allocator's global path, twice per malloc+free pair. */
#ifndef MT_UTIL_ADDRMAP_H
#define MT_UTIL_ADDRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memtrace/common.h"
#include "util/assert.h"

/* Invariants (mt__amap_check): cap = 0 (keys = vals = NULL, shift = 0) or a power of two
 * >= 16 with shift = 64 - log2(cap); n = #slots with key != 0; n << (1 + room) <= cap (an
 * empty slot ends every probe); each key appears once, and no empty slot lies between its
 * home slot and its slot (cyclically). A zeroed table is empty and at most half full. */
typedef struct mt__amap_s {
    uint64_t *keys; /* cap slots; 0 = empty */
    uint64_t *vals; /* cap slots; vals[i] belongs to keys[i] */
    size_t cap;     /* slots */
    /* keys held; stored as a relaxed atomic (the same plain store in the hardware), so that
     * a thread may read it as a hint while the holder of the table changes it (a thread
     * cache's owner reads its count before it takes the cache: tcache.c, mt__tc_free) */
    size_t n;
    unsigned shift; /* 64 - log2(cap) */
    /* The table is at most 2^-(1 + room) full: 0 (half, the default), 1 (a quarter) up to 3
     * (a sixteenth: the allocator's block table, where each probe past the home slot is a
     * mispredicted branch on the hot path; docs/bench-replay.md has what it saves). Set
     * while empty; a table grown past 2^20 slots keeps at most a quarter's. */
    unsigned room;
} mt__amap_t;

void mt__amap_fini(mt__amap_t *m);
/* Doubles m (or makes its first 16 slots): 0 or MT_ENOMEM (m unchanged). */
int mt__amap_grow(mt__amap_t *m);
/* Walks the invariants: 0, or MT_EPROTO with the first violation in why (may be NULL). */
int mt__amap_check(const mt__amap_t *m, char *why, size_t whylen);

/* key's home slot (cap > 0): one multiply, its high bits. */
static inline size_t mt__amap_home(const mt__amap_t *m, uint64_t key)
{
    return (size_t)((key * UINT64_C(0x9e3779b97f4a7c15)) >> m->shift);
}

/* The slot holding key, or the empty slot where its probe ends (cap > 0). */
static inline size_t mt__amap_slot(const mt__amap_t *m, uint64_t key)
{
    size_t mask = m->cap - 1, i = mt__amap_home(m, key);
    while (m->keys[i] != 0 && m->keys[i] != key)
        i = (i + 1) & mask;
    return i;
}

/* Whether key (!= 0) is held; then *slot = its slot (for mt__amap_del_at). */
static inline bool mt__amap_find(const mt__amap_t *m, uint64_t key, size_t *slot)
{
    if (key == 0 || m->cap == 0)
        return false;
    size_t i = mt__amap_slot(m, key);
    *slot = i;
    return m->keys[i] != 0;
}

/* *val = key's value: 0, or MT_ENOENT (*val untouched). */
static inline int mt__amap_get(const mt__amap_t *m, uint64_t key, uint64_t *val)
{
    size_t i;
    if (!mt__amap_find(m, key, &i))
        return MT_ENOENT;
    *val = m->vals[i];
    return 0;
}

/* Maps key (!= 0) to val, replacing what key had. 0, MT_EINVAL (key 0) or MT_ENOMEM (the
 * table unchanged). */
static inline int mt__amap_put(mt__amap_t *m, uint64_t key, uint64_t val)
{
    if (key == 0)
        return MT_EINVAL;
    if ((m->n + 1) << (1 + m->room) > m->cap) {
        int rc = mt__amap_grow(m);
        if (rc != 0)
            return rc;
    }
    size_t i = mt__amap_slot(m, key);
    __atomic_store_n(&m->n, m->n + (m->keys[i] == 0), __ATOMIC_RELAXED); /* (see n) */
    m->keys[i] = key;
    m->vals[i] = val;
    return 0;
}

/* Removes key, which is held, from its slot (hint: a slot found for it earlier, or any
 * value when m may have changed since): a later key of the probe moves into the hole
 * unless its home lies cyclically in (hole, its slot], so every probe still reaches its
 * key. */
static inline void mt__amap_del_at(mt__amap_t *m, uint64_t key, size_t hint)
{
    size_t mask = m->cap - 1, i = hint;
    if (i >= m->cap || m->keys[i] != key)
        i = mt__amap_slot(m, key);
    mt_assert(key != 0 && m->keys[i] == key && m->n > 0); /* held */
    for (size_t j = (i + 1) & mask; m->keys[j] != 0; j = (j + 1) & mask) {
        size_t h = mt__amap_home(m, m->keys[j]);
        if (((j - h) & mask) >= ((j - i) & mask)) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->keys[i] = 0;
    m->vals[i] = 0;
    __atomic_store_n(&m->n, m->n - 1, __ATOMIC_RELAXED); /* (see n) */
}

/* Removes key: 0, or MT_ENOENT. */
static inline int mt__amap_del(mt__amap_t *m, uint64_t key)
{
    size_t i;
    if (!mt__amap_find(m, key, &i))
        return MT_ENOENT;
    mt__amap_del_at(m, key, i);
    return 0;
}

#endif
