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

const char *mt__addrmap_check(const mt_addrmap_t *m)
{
    static _Thread_local char why[96];
    if (mt__amap_check(m, why, sizeof why) != 0)
        return why;
    for (size_t i = 0; i < m->cap; i++) {
        const mt_block_t *b = mt__addrmap_at(m, i);
        if (m->keys[i] != 0 && (b == NULL || b->addr != m->keys[i]))
            return "address table: a value whose block is not at its key";
    }
    return NULL;
}
