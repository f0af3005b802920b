/* Two-level segregated fit over one pool (tlsf.h). The classic layout: every block starts
 * with a two-word header (the physical predecessor, then the size with two flag bits); a free
 * block also holds its free-list links in its payload. The levels, lists and their search
 * (tlsf_map.h) make both malloc and free O(1) whatever the number of blocks. */
#include "tlsf.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "memtrace/common.h"
#include "tlsf_map.h"

#define SL_COUNT   TLSF_SL_COUNT
#define ALIGN_LOG2 TLSF_ALIGN_LOG2 /* MT_TLSF_ALIGN = 16 */
#define FL_COUNT   TLSF_FL_COUNT
#define HDR        sizeof(block_t) /* header bytes before each payload */
#define MIN_SIZE   ((size_t)16)    /* a free block's payload holds its two links */

#define F_FREE      ((size_t)1) /* this block is free */
#define F_PREV_FREE ((size_t)2) /* the block physically before this one is free */
#define F_MASK      ((size_t)15)

_Static_assert(MT_TLSF_ALIGN == 1u << ALIGN_LOG2, "alignment and its log agree");

/* A block header; the payload follows it. */
typedef struct block_s {
    struct block_s *prev_phys; /* the block physically before; NULL for the first */
    size_t size;               /* payload bytes (multiple of 16) | F_FREE | F_PREV_FREE */
} block_t;

/* The free-list links, in a free block's payload. */
typedef struct links_s {
    block_t *next, *prev;
} links_t;

_Static_assert(sizeof(block_t) == MT_TLSF_ALIGN, "payloads stay aligned");

/* The control structure and its pool.
 * Invariants (mt_tlsf_check):
 *   blocks tile [base, end): next(b) = b + HDR + size(b), the last block is the sentinel of
 *   size 0 at end - HDR, always in use;
 *   prev_phys(next(b)) = b, and F_PREV_FREE(next(b)) = F_FREE(b);
 *   no two free blocks are neighbours (freeing merges them);
 *   a free block of size s is in list [fl][sl] = mapping(s), and only there;
 *   bit sl of sl_map[fl] = list [fl][sl] is not empty; bit fl of fl_map = sl_map[fl] != 0;
 *   in_use = the sum of the sizes of the blocks in use (the sentinel is 0);
 *   high_water >= end offset of every block in use (header + payload) since creation. */
struct mt_tlsf_s {
    uint64_t fl_map;                    /* bit fl: some list of first level fl is not empty */
    uint32_t sl_map[FL_COUNT];          /* bit sl: list [fl][sl] is not empty */
    block_t *heads[FL_COUNT][SL_COUNT]; /* free lists, LIFO */
    char *base, *end;                   /* the pool, [base, end) */
    size_t map_bytes;                   /* the mapping's length */
    size_t in_use;                      /* payload bytes in use */
    size_t high_water;                  /* bytes from base, see above */
};

/* ---- blocks ---- */

static size_t bsize(const block_t *b)
{
    return b->size & ~F_MASK;
}

static block_t *next_phys(const block_t *b)
{
    return (block_t *)((char *)b + HDR + bsize(b));
}

static links_t *links(block_t *b)
{
    return (links_t *)(b + 1);
}

static void list_remove(mt_tlsf_t *t, block_t *b)
{
    int fl, sl;
    tlsf_mapping_insert(bsize(b), &fl, &sl);
    links_t *l = links(b);
    if (l->next != NULL)
        links(l->next)->prev = l->prev;
    if (l->prev != NULL) {
        links(l->prev)->next = l->next;
    } else {
        t->heads[fl][sl] = l->next;
        if (l->next == NULL) {
            t->sl_map[fl] &= ~(1u << sl);
            if (t->sl_map[fl] == 0)
                t->fl_map &= ~(1ull << fl);
        }
    }
}

static void list_insert(mt_tlsf_t *t, block_t *b)
{
    int fl, sl;
    tlsf_mapping_insert(bsize(b), &fl, &sl);
    block_t *h = t->heads[fl][sl];
    *links(b) = (links_t){.next = h, .prev = NULL};
    if (h != NULL)
        links(h)->prev = b;
    t->heads[fl][sl] = b;
    t->sl_map[fl] |= 1u << sl;
    t->fl_map |= 1ull << fl;
}

/* Marks b free or in use, and tells its physical successor. */
static void set_free(block_t *b, bool is_free)
{
    block_t *n = next_phys(b);
    if (is_free) {
        b->size |= F_FREE;
        n->size |= F_PREV_FREE;
        n->prev_phys = b;
    } else {
        b->size &= ~F_FREE;
        n->size &= ~F_PREV_FREE;
    }
}

/* ---- the pool ---- */

int mt_tlsf_create(mt_tlsf_t **out, size_t pool_bytes)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t pg = page > 0 ? (size_t)page : 4096;
    *out = NULL;
    if (pool_bytes < pg || pool_bytes > MT_TLSF_MAX_REQUEST)
        return MT_EINVAL;
    size_t len = (pool_bytes + pg - 1) / pg * pg;
    mt_tlsf_t *t = calloc(1, sizeof *t);
    if (t == NULL)
        return MT_ENOMEM;
    void *m =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        goto fail_map;
    t->base = m;
    t->end = t->base + len;
    t->map_bytes = len;
    /* One free block over all but the sentinel's header. */
    block_t *first = (block_t *)t->base;
    first->prev_phys = NULL;
    first->size = len - 2 * HDR;
    block_t *sentinel = next_phys(first);
    sentinel->size = 0;
    set_free(first, true);
    list_insert(t, first);
    *out = t;
    return 0;
fail_map:
    free(t);
    return MT_ENOMEM;
}

void mt_tlsf_destroy(mt_tlsf_t **p)
{
    if (*p == NULL)
        return;
    munmap((*p)->base, (*p)->map_bytes);
    free(*p);
    *p = NULL;
}

void *mt_tlsf_malloc(mt_tlsf_t *t, size_t size)
{
    if (size > MT_TLSF_MAX_REQUEST)
        return NULL;
    size = size < MIN_SIZE ? MIN_SIZE : (size + MT_TLSF_ALIGN - 1) & ~(size_t)(MT_TLSF_ALIGN - 1);
    int fl, sl;
    /* The head of the request's own list first, if it is large enough: one comparison, and
     * the good fit's rounding up no longer skips a block that fits exactly, which keeps the
     * pool's high-water close to the peak in use. */
    tlsf_mapping_insert(size, &fl, &sl);
    block_t *b = t->heads[fl][sl];
    if (b == NULL || bsize(b) < size) {
        tlsf_mapping_search(size, &fl, &sl);
        if (!tlsf_find_list(t->fl_map, t->sl_map, &fl, &sl))
            return NULL;
        b = t->heads[fl][sl];
    }
    list_remove(t, b);
    size_t have = bsize(b);
    if (have >= size + HDR + MIN_SIZE) {
        /* Split: the tail becomes a free block of its own. Its successor was not free (b
         * was, and free blocks do not touch), so it needs no merge. */
        block_t *rest = (block_t *)((char *)b + HDR + size);
        rest->size = (have - size - HDR) | F_FREE;
        b->size = size | (b->size & F_MASK);
        rest->prev_phys = b;
        set_free(rest, true);
        list_insert(t, rest);
    }
    set_free(b, false);
    t->in_use += bsize(b);
    size_t reach = (size_t)((char *)next_phys(b) - t->base);
    if (reach > t->high_water)
        t->high_water = reach;
    return b + 1;
}

void mt_tlsf_free(mt_tlsf_t *t, void *p)
{
    if (p == NULL)
        return;
    block_t *b = (block_t *)p - 1;
    t->in_use -= bsize(b);
    if (b->size & F_PREV_FREE) {
        block_t *prev = b->prev_phys;
        list_remove(t, prev);
        prev->size += HDR + bsize(b);
        b = prev;
    }
    block_t *n = next_phys(b);
    if (n->size & F_FREE) {
        list_remove(t, n);
        b->size += HDR + bsize(n);
    }
    set_free(b, true);
    list_insert(t, b);
}

size_t mt_tlsf_high_water(const mt_tlsf_t *t)
{
    return t->high_water;
}

void mt_tlsf_bounds(const mt_tlsf_t *t, const char **base, size_t *bytes)
{
    *base = t->base;
    *bytes = t->map_bytes;
}

size_t mt_tlsf_in_use(const mt_tlsf_t *t)
{
    return t->in_use;
}

/* ---- the checker ---- */

/* Is b on list [fl][sl]? */
static bool on_list(const mt_tlsf_t *t, const block_t *b, int fl, int sl)
{
    for (block_t *x = t->heads[fl][sl]; x != NULL; x = links(x)->next)
        if (x == b)
            return true;
    return false;
}

int mt_tlsf_check(const mt_tlsf_t *t)
{
    size_t in_use = 0, nfree = 0;
    const block_t *prev = NULL;
    bool prev_free = false;
    const block_t *b = (const block_t *)t->base;
    for (;;) {
        if ((const char *)b < t->base || (const char *)b + HDR > t->end)
            return MT_EPROTO;
        if (prev_free && b->prev_phys != prev)
            return MT_EPROTO; /* the link is only kept while the predecessor is free */
        if (((b->size & F_PREV_FREE) != 0) != prev_free || bsize(b) % MT_TLSF_ALIGN != 0)
            return MT_EPROTO;
        bool is_free = (b->size & F_FREE) != 0;
        if ((const char *)b + HDR == t->end) { /* the sentinel */
            if (bsize(b) != 0 || is_free)
                return MT_EPROTO;
            break;
        }
        if (is_free) {
            int fl, sl;
            tlsf_mapping_insert(bsize(b), &fl, &sl);
            if (prev_free || !on_list(t, b, fl, sl))
                return MT_EPROTO;
            nfree++;
        } else {
            in_use += bsize(b);
            if ((size_t)((const char *)next_phys(b) - t->base) > t->high_water)
                return MT_EPROTO;
        }
        prev = b;
        prev_free = is_free;
        b = next_phys(b);
    }
    if (in_use != t->in_use)
        return MT_EPROTO;
    /* The lists hold exactly the free blocks, and the bitmaps say which lists are not empty. */
    size_t listed = 0;
    for (int fl = 0; fl < FL_COUNT; fl++) {
        for (int sl = 0; sl < (int)SL_COUNT; sl++) {
            bool bit = (t->sl_map[fl] >> sl) & 1u;
            if (bit != (t->heads[fl][sl] != NULL))
                return MT_EPROTO;
            const block_t *p = NULL;
            for (block_t *x = t->heads[fl][sl]; x != NULL; x = links(x)->next) {
                if (!(x->size & F_FREE) || links(x)->prev != p || ++listed > nfree)
                    return MT_EPROTO;
                p = x;
            }
        }
        if ((((t->fl_map >> fl) & 1u) != 0) != (t->sl_map[fl] != 0))
            return MT_EPROTO;
    }
    return listed == nfree ? 0 : MT_EPROTO;
}
