/* The size mapping and list search shared by the two TLSF bounds (tlsf.c: headers beside
 * the blocks; tlsf_oob.c: records out of band). Sizes map to a first level (the highest set
 * bit) and a second level (the next TLSF_SL_LOG2 bits); two bitmaps find the first
 * non-empty list that can hold a request with two count-trailing-zeros. */
#ifndef MT_BENCH_TLSF_MAP_H
#define MT_BENCH_TLSF_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TLSF_SL_LOG2    5 /* 32 second-level lists per first level */
#define TLSF_SL_COUNT   (1u << TLSF_SL_LOG2)
#define TLSF_ALIGN_LOG2 4 /* sizes below TLSF_SMALL are split linearly, 16 bytes a list */
#define TLSF_FL_SHIFT   (TLSF_SL_LOG2 + TLSF_ALIGN_LOG2)
#define TLSF_SMALL      ((size_t)1 << TLSF_FL_SHIFT) /* 512: sizes below share level 0 */
#define TLSF_FL_MAX     40                           /* sizes below 2^TLSF_FL_MAX */
#define TLSF_FL_COUNT   (TLSF_FL_MAX - TLSF_FL_SHIFT + 1)

_Static_assert(TLSF_FL_COUNT <= 64, "the first-level bitmap is one 64-bit word");

static inline int tlsf_fls(size_t x) /* index of the highest set bit, x > 0 */
{
    return 63 - __builtin_clzll((unsigned long long)x);
}

/* The list a free block of size s belongs to. */
static inline void tlsf_mapping_insert(size_t s, int *fl, int *sl)
{
    if (s < TLSF_SMALL) {
        *fl = 0;
        *sl = (int)(s >> TLSF_ALIGN_LOG2);
    } else {
        int f = tlsf_fls(s);
        *sl = (int)((s >> (f - TLSF_SL_LOG2)) ^ TLSF_SL_COUNT);
        *fl = f - TLSF_FL_SHIFT + 1;
    }
}

/* The first list whose every block holds s: s rounded up to the next list boundary. */
static inline void tlsf_mapping_search(size_t s, int *fl, int *sl)
{
    if (s >= TLSF_SMALL)
        s += ((size_t)1 << (tlsf_fls(s) - TLSF_SL_LOG2)) - 1;
    tlsf_mapping_insert(s, fl, sl);
}

/* The first non-empty list at (fl, >= sl), else at the first non-empty level above fl:
 * true and (*fl, *sl) set, or false when there is none. */
static inline bool tlsf_find_list(uint64_t fl_map, const uint32_t *sl_map, int *fl, int *sl)
{
    uint32_t sm = *fl < TLSF_FL_COUNT ? sl_map[*fl] & (~0u << *sl) : 0;
    if (sm == 0) {
        uint64_t fm = *fl + 1 < TLSF_FL_COUNT ? fl_map & (~0ull << (*fl + 1)) : 0;
        if (fm == 0)
            return false;
        *fl = __builtin_ctzll(fm);
        sm = sl_map[*fl];
    }
    *sl = __builtin_ctz(sm);
    return true;
}

#endif
