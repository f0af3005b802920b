/* Host-side metadata storage: a pool of block structs (so the hot path never calls
 * malloc once the pool is warm) and the address -> block hash table that makes free()
 * O(1). Both are private to one allocator and guarded by its mutex. */
#include <stdlib.h>
#include <string.h>

#include "allocator/internal.h"
#include "util/grow.h"

#define BLOCKS_PER_CHUNK 256

/* ---- block pool ---- */

static int grow_blocks(mt_alloc_t *a)
{
    void **nc = mt__grow(a->blk_chunks, &a->cap_chunks, a->nchunks + 1, sizeof *nc, 8);
    if (nc == NULL)
        return MT_ENOMEM;
    a->blk_chunks = nc;
    mt_block_t *chunk = aligned_alloc(_Alignof(mt_block_t), BLOCKS_PER_CHUNK * sizeof *chunk);
    if (chunk == NULL)
        return MT_ENOMEM;
    a->blk_chunks[a->nchunks++] = chunk;
    for (size_t i = 0; i < BLOCKS_PER_CHUNK; i++) {
        chunk[i].bin_next = a->blk_free;
        a->blk_free = &chunk[i];
    }
    return 0;
}

mt_block_t *mt__block_new(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    if (a->blk_free == NULL && grow_blocks(a) != 0)
        return NULL;
    mt_block_t *b = a->blk_free;
    a->blk_free = b->bin_next;
    memset(b, 0, sizeof *b);
    return b;
}

void mt__block_release(mt_alloc_t *a, mt_block_t *b)
{
    mt__alloc_assert_owner(a);
    /* A struct going back to the pool is in no free list and no address map. */
    mt_assert(mt__addrmap_get(&a->map, b->addr) != b);
    free(b->uses);
    b->uses = NULL;
    b->bin_next = a->blk_free;
    a->blk_free = b;
}

void mt__blocks_fini(mt_alloc_t *a)
{
    for (size_t i = 0; i < a->nchunks; i++)
        free(a->blk_chunks[i]);
    free(a->blk_chunks);
    a->blk_chunks = NULL;
    a->nchunks = a->cap_chunks = 0;
    a->blk_free = NULL;
}

/* ---- address map ---- */

/* Fibonacci hashing of the address; block addresses are multiples of 256, so the low
 * bits carry nothing and a multiplicative hash spreads the high ones. */
static inline size_t slot_of(uintptr_t key, size_t cap)
{
    return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

int mt__addrmap_init(mt_addrmap_t *m)
{
    m->cap = 1024;
    m->n = 0;
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->vals = calloc(m->cap, sizeof *m->vals);
    if (m->keys == NULL || m->vals == NULL) {
        mt__addrmap_fini(m);
        return MT_ENOMEM;
    }
    return 0;
}

void mt__addrmap_fini(mt_addrmap_t *m)
{
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
    m->cap = m->n = 0;
}

static void raw_put(uintptr_t *keys, mt_block_t **vals, size_t cap, uintptr_t k, mt_block_t *v)
{
    size_t i = slot_of(k, cap);
    while (keys[i] != 0 && keys[i] != k)
        i = (i + 1) & (cap - 1);
    keys[i] = k;
    vals[i] = v;
}

/* Every key is found by probing from its home slot, and n counts them (a walk: for
 * mt_assert_expensive). */
static inline bool map_consistent(const mt_addrmap_t *m)
{
    size_t n = 0;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == 0)
            continue;
        n++;
        if (mt__addrmap_get(m, m->keys[i]) != m->vals[i])
            return false;
    }
    return n == m->n;
}

static int rehash(mt_addrmap_t *m, size_t cap)
{
    uintptr_t *keys = calloc(cap, sizeof *keys);
    mt_block_t **vals = calloc(cap, sizeof *vals);
    if (keys == NULL || vals == NULL) {
        free(keys);
        free(vals);
        return MT_ENOMEM;
    }
    mt_assert(cap > m->cap && (cap & (cap - 1)) == 0);
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i] != 0)
            raw_put(keys, vals, cap, m->keys[i], m->vals[i]);
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    mt_assert_expensive(map_consistent(m));
    return 0;
}

int mt__addrmap_put(mt_addrmap_t *m, mt_block_t *b)
{
    mt_assert(b->addr != 0 && b->addr % MT__ALIGN == 0 && b->state != MT_BLOCK_INACTIVE);
    if ((m->n + 1) * 2 > m->cap) {
        int rc = rehash(m, m->cap * 2);
        if (rc != 0)
            return rc;
    }
    size_t i = slot_of(b->addr, m->cap);
    while (m->keys[i] != 0) {
        if (m->keys[i] == b->addr) {
            /* Two live blocks never share an address: only b itself may be put again. */
            mt_assert(m->vals[i] == b);
            m->vals[i] = b;
            return 0;
        }
        i = (i + 1) & (m->cap - 1);
    }
    m->keys[i] = b->addr;
    m->vals[i] = b;
    m->n++;
    mt_assert(m->n * 2 <= m->cap);
    return 0;
}

mt_block_t *mt__addrmap_get(const mt_addrmap_t *m, uintptr_t addr)
{
    if (addr == 0)
        return NULL;
    mt_assert(m->n < m->cap); /* an empty slot ends every probe */
    size_t i = slot_of(addr, m->cap);
    while (m->keys[i] != 0) {
        if (m->keys[i] == addr)
            return m->vals[i];
        i = (i + 1) & (m->cap - 1);
    }
    return NULL;
}

/* Backward-shift deletion keeps probe sequences intact without tombstones. */
void mt__addrmap_del(mt_addrmap_t *m, uintptr_t addr)
{
    size_t mask = m->cap - 1;
    size_t i = slot_of(addr, m->cap);
    mt_assert(addr != 0 && m->n > 0);
    while (m->keys[i] != addr) {
        /* Only active blocks are deleted, and each is in the map. */
        mt_assert(m->keys[i] != 0);
        if (m->keys[i] == 0)
            return;
        i = (i + 1) & mask;
    }
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (m->keys[j] == 0)
            break;
        size_t home = slot_of(m->keys[j], m->cap);
        /* Move j back into the hole at i unless its home lies cyclically in (i, j]. */
        bool in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!in_range) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->keys[i] = 0;
    m->vals[i] = NULL;
    m->n--;
    mt_assert(mt__addrmap_get(m, addr) == NULL);
}
