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
