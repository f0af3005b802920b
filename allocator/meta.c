/* Host-side metadata storage: a pool of block structs (so the hot path never calls
 * malloc once the pool is warm) and the address -> block hash table that makes free()
 * O(1) (its probes: internal.h). Both are private to one allocator and guarded by its
 * mutex. */
#include <stdlib.h>

#include "allocator/internal.h"
#include "util/grow.h"

#define BLOCKS_PER_CHUNK 256

/* ---- block pool ---- */

int mt__blocks_grow(mt_alloc_t *a)
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

void mt__blocks_fini(mt_alloc_t *a)
{
    for (size_t i = 0; i < a->nchunks; i++)
        free(a->blk_chunks[i]);
    free(a->blk_chunks);
    a->blk_chunks = NULL;
    a->nchunks = a->cap_chunks = 0;
    a->blk_free = NULL;
}

/* ---- address table ---- */

#define MAP_FIRST 16 /* slots of a table's first allocation */

void mt__addrmap_fini(mt_addrmap_t *m)
{
    free(m->keys);
    free(m->vals);
    *m = (mt_addrmap_t){0};
}

int mt__addrmap_grow(mt_addrmap_t *m)
{
    size_t cap = m->cap ? m->cap * 2 : MAP_FIRST;
    mt_addrmap_t t = {calloc(cap, sizeof *t.keys), calloc(cap, sizeof *t.vals), cap, m->n,
                      (unsigned)__builtin_clzll((unsigned long long)cap) + 1};
    if (t.keys == NULL || t.vals == NULL || cap < m->cap) {
        free(t.keys);
        free(t.vals);
        return MT_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i] != 0) {
            size_t j = mt__addrmap_slot(&t, m->keys[i]);
            t.keys[j] = m->keys[i];
            t.vals[j] = m->vals[i];
        }
    free(m->keys);
    free(m->vals);
    *m = t;
    mt_assert_expensive(mt__addrmap_check(m) == NULL);
    return 0;
}

const char *mt__addrmap_check(const mt_addrmap_t *m)
{
    if (m->cap == 0)
        return m->n == 0 && m->keys == NULL && m->vals == NULL ? NULL
                                                               : "address table: empty "
                                                                 "but not zeroed";
    if (m->cap < MAP_FIRST || (m->cap & (m->cap - 1)) != 0 ||
        m->shift != (unsigned)__builtin_clzll((unsigned long long)m->cap) + 1)
        return "address table: capacity not a power of two >= 16, or shift not its log";
    size_t n = 0;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == 0)
            continue;
        n++;
        if (m->vals[i] == NULL || m->vals[i]->addr != m->keys[i])
            return "address table: a value whose block is not at its key";
        /* The probe from its home reaches slot i before any empty slot or another copy. */
        if (mt__addrmap_slot(m, m->keys[i]) != i)
            return "address table: a key its probe does not reach, or held twice";
    }
    if (n != m->n)
        return "address table: n differs from the keys held";
    if (m->n * 2 > m->cap)
        return "address table: more than half full";
    return NULL;
}
