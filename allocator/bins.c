/* Size-class bins: two-level segregated fit (TLSF-like) over host-side block metadata.
 *
 * A request finds its class in O(1) (a log2 and a shift), examines a bounded number of
 * candidates there for the best fit, and otherwise jumps to the next non-empty class
 * with two find-first-set operations on the row and class bitmaps. Blocks in any class
 * above the request's own are all large enough, so the first candidate there fits
 * unless the oversize rules (upper bound) exclude it. */
#include <stdlib.h>

#include "allocator/internal.h"

size_t mt__bin_class_min(unsigned cls)
{
    unsigned row = cls / MT__SL_N, sl = cls % MT__SL_N;
    if (row == 0)
        return (size_t)sl * MT__ALIGN;
    unsigned fl = row + (MT__SL_BITS - 1);
    return ((size_t)(MT__SL_N + sl) << (fl - MT__SL_BITS)) * MT__ALIGN;
}

mt_binset_t *mt__bins_create(int bp, mt_stream_t *s)
{
    mt_binset_t *bs = calloc(1, sizeof *bs);
    if (bs == NULL)
        return NULL;
    bs->pool = (uint8_t)bp;
    bs->stream = s;
    return bs;
}

void mt__bins_insert(mt_binset_t *bs, mt_block_t *b)
{
    mt__bins_changed(bs->sr);
    mt__bins_link(bs, b, mt__bin_class(b->size));
}

void mt__bins_remove(mt_binset_t *bs, mt_block_t *b)
{
    /* b is on the list of its class: a double remove or a stale cls fails here. */
    mt_assert(b->state == MT_BLOCK_INACTIVE && b->cls == mt__bin_class(b->size));
    mt_assert(b->bin_prev != NULL ? b->bin_prev->bin_next == b : bs->heads[b->cls] == b);
    mt__bins_changed(bs->sr);
    mt__bins_unlink(bs, b);
}

/* First non-empty class strictly above c, or MT__NCLASS. */
static unsigned next_class(const mt_binset_t *bs, unsigned c)
{
    unsigned r = c / MT__SL_N, s = c % MT__SL_N;
    uint32_t m = s + 1 < MT__SL_N ? bs->cls_map[r] & (~0u << (s + 1)) : 0;
    if (m != 0)
        return r * MT__SL_N + (unsigned)__builtin_ctz(m);
    uint64_t rows = r + 1 < 64 ? bs->row_map & (~0ull << (r + 1)) : 0;
    if (rows == 0)
        return MT__NCLASS;
    r = (unsigned)__builtin_ctzll(rows);
    mt_assert(bs->cls_map[r] != 0);
    return r * MT__SL_N + (unsigned)__builtin_ctz(bs->cls_map[r]);
}

/* Smallest fitting block among the first MT__BEST_FIT_SCAN of class c, the lowest address
 * among equal sizes (address-ordered best fit: new blocks gather at low addresses and free
 * room stays whole at the top; somas_pangu_2.6B cold 0.943 -> 0.960). */
static mt_block_t *scan_class(const mt_binset_t *bs, unsigned c, size_t size, size_t upper)
{
    mt_block_t *best = NULL;
    int n = 0;
    for (mt_block_t *b = bs->heads[c]; b != NULL && n < MT__BEST_FIT_SCAN; b = b->bin_next, n++) {
        if (b->size < size || b->size >= upper)
            continue;
        if (best == NULL || b->size < best->size || (b->size == best->size && b->addr < best->addr))
            best = b;
    }
    return best;
}

mt_block_t *mt__bins_find(const mt_binset_t *bs, size_t size, size_t upper)
{
    if (bs == NULL || bs->nblocks == 0)
        return NULL;
    unsigned c = mt__bin_class(size);
    mt_block_t *b = bs->heads[c] ? scan_class(bs, c, size, upper) : NULL;
    while (b == NULL) {
        c = next_class(bs, c);
        if (c >= MT__NCLASS || mt__bin_class_min(c) >= upper)
            return NULL;
        b = scan_class(bs, c, size, upper);
    }
    return b;
}

size_t mt__bins_largest(const mt_binset_t *bs)
{
    if (bs == NULL || bs->row_map == 0)
        return 0;
    unsigned r = 63u - (unsigned)__builtin_clzll(bs->row_map);
    unsigned c = r * MT__SL_N + (31u - (unsigned)__builtin_clz(bs->cls_map[r]));
    size_t best = 0;
    for (mt_block_t *b = bs->heads[c]; b != NULL; b = b->bin_next)
        if (b->size > best)
            best = b->size;
    return best;
}

const char *mt__bins_check(const mt_binset_t *bs, size_t *nblocks)
{
    size_t n = 0, bytes = 0;
    for (unsigned r = 0; r < MT__ROWS; r++) {
        if (((bs->row_map >> r) & 1) != (bs->cls_map[r] != 0))
            return "row bitmap disagrees with class bitmap";
        for (unsigned s = 0; s < MT__SL_N; s++) {
            unsigned c = r * MT__SL_N + s;
            if (((bs->cls_map[r] >> s) & 1) != (bs->heads[c] != NULL))
                return "class bitmap disagrees with free list";
            const mt_block_t *prev = NULL;
            for (const mt_block_t *b = bs->heads[c]; b != NULL; b = b->bin_next) {
                if (b->bin_prev != prev)
                    return "broken free-list back link";
                if (b->state != MT_BLOCK_INACTIVE)
                    return "active block in a free bin";
                if (b->cls != c || mt__bin_class(b->size) != c)
                    return "block in the wrong size class";
                if (b->seg == NULL || b->seg->bins != bs)
                    return "block in the bins of another pool or stream";
                n++;
                bytes += b->size;
                prev = b;
            }
        }
    }
    for (unsigned r = MT__ROWS; r < 64; r++)
        if ((bs->row_map >> r) & 1)
            return "row bitmap bit beyond the last row";
    if (n != bs->nblocks || bytes != bs->bytes)
        return "binset block count or bytes disagree with the lists";
    *nblocks = n;
    return NULL;
}
