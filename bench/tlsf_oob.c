/* Two-level segregated fit with its records out of band (tlsf.h, mt_tlsf_oob_*). A block is
 * a run of granules; its record is rec[g], g its first granule, so a free finds it by its
 * address alone and a block finds its physical successor at rec[g + size]. The records of
 * granules that start no block are stale and never read. */
#include "tlsf.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "memtrace/common.h"
#include "tlsf_map.h"

#define GRAN_LOG2   9
#define NONE        UINT32_MAX
#define F_FREE      (1u << 31) /* this block is free */
#define F_PREV_FREE (1u << 30) /* the block physically before this one is free */
#define G_MASK      (F_PREV_FREE - 1u)

_Static_assert(MT_TLSF_OOB_GRAN == 1u << GRAN_LOG2, "granule and its log agree");
_Static_assert(MT_TLSF_OOB_GRAN >= TLSF_SMALL, "every block is at or above level 1");

/* A block's record. */
typedef struct rec_s {
    uint32_t size;       /* granules | F_FREE | F_PREV_FREE; 0 granules: the sentinel */
    uint32_t prev_phys;  /* first granule of the block before; kept while that one is free */
    uint32_t next, prev; /* free-list links (first granules), NONE at the ends */
} rec_t;

/* The control structure, its pool and its records.
 * Invariants (mt_tlsf_oob_check):
 *   blocks tile granules [0, ngran): next(g) = g + gsize(g); the sentinel of 0 granules is
 *   at ngran, always in use;
 *   F_PREV_FREE(next(g)) = F_FREE(g), and then prev_phys(next(g)) = g;
 *   no two free blocks are neighbours; a free block of s granules is in list
 *   [fl][sl] = mapping(s * GRAN), and only there; the bitmaps say which lists are not empty;
 *   in_use = the bytes of the blocks in use; high_water >= the end offset of every block in
 *   use since creation. */
struct mt_tlsf_oob_s {
    uint64_t fl_map;
    uint32_t sl_map[TLSF_FL_COUNT];
    uint32_t heads[TLSF_FL_COUNT][TLSF_SL_COUNT]; /* first granules, NONE: empty */
    rec_t *rec;                                   /* [ngran + 1] */
    char *base;                                   /* the pool, PROT_NONE */
    size_t ngran, pool_bytes, rec_bytes;
    size_t in_use, high_water;
};

static uint32_t gsize(const mt_tlsf_oob_t *t, uint32_t g)
{
    return t->rec[g].size & G_MASK;
}

static void list_remove(mt_tlsf_oob_t *t, uint32_t g)
{
    int fl, sl;
    tlsf_mapping_insert((size_t)gsize(t, g) << GRAN_LOG2, &fl, &sl);
    rec_t *r = &t->rec[g];
    if (r->next != NONE)
        t->rec[r->next].prev = r->prev;
    if (r->prev != NONE) {
        t->rec[r->prev].next = r->next;
    } else {
        t->heads[fl][sl] = r->next;
        if (r->next == NONE) {
            t->sl_map[fl] &= ~(1u << sl);
            if (t->sl_map[fl] == 0)
                t->fl_map &= ~(1ull << fl);
        }
    }
}

static void list_insert(mt_tlsf_oob_t *t, uint32_t g)
{
    int fl, sl;
    tlsf_mapping_insert((size_t)gsize(t, g) << GRAN_LOG2, &fl, &sl);
    uint32_t h = t->heads[fl][sl];
    t->rec[g].next = h;
    t->rec[g].prev = NONE;
    if (h != NONE)
        t->rec[h].prev = g;
    t->heads[fl][sl] = g;
    t->sl_map[fl] |= 1u << sl;
    t->fl_map |= 1ull << fl;
}

/* Marks g free (and tells its successor where it starts) or in use. */
static void set_free(mt_tlsf_oob_t *t, uint32_t g, bool is_free)
{
    rec_t *n = &t->rec[g + gsize(t, g)];
    if (is_free) {
        t->rec[g].size |= F_FREE;
        n->size |= F_PREV_FREE;
        n->prev_phys = g;
    } else {
        t->rec[g].size &= ~F_FREE;
        n->size &= ~F_PREV_FREE;
    }
}

int mt_tlsf_oob_create(mt_tlsf_oob_t **out, size_t pool_bytes)
{
    *out = NULL;
    if (pool_bytes < MT_TLSF_OOB_GRAN || pool_bytes > MT_TLSF_OOB_MAX_POOL)
        return MT_EINVAL;
    mt_tlsf_oob_t *t = calloc(1, sizeof *t);
    if (t == NULL)
        return MT_ENOMEM;
    t->ngran = (pool_bytes + MT_TLSF_OOB_GRAN - 1) >> GRAN_LOG2;
    t->pool_bytes = t->ngran << GRAN_LOG2;
    t->rec_bytes = (t->ngran + 1) * sizeof(rec_t);
    void *m =
        mmap(NULL, t->pool_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        goto fail_pool;
    t->base = m;
    m = mmap(NULL, t->rec_bytes, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        goto fail_rec;
    t->rec = m;
    memset(t->heads, 0xff, sizeof t->heads);
    /* One free block over the whole pool, then the sentinel. */
    t->rec[0] = (rec_t){.size = (uint32_t)t->ngran, .prev_phys = NONE};
    t->rec[t->ngran] = (rec_t){.size = 0, .prev_phys = NONE, .next = NONE, .prev = NONE};
    set_free(t, 0, true);
    list_insert(t, 0);
    *out = t;
    return 0;
fail_rec:
    munmap(t->base, t->pool_bytes);
fail_pool:
    free(t);
    return MT_ENOMEM;
}

void mt_tlsf_oob_destroy(mt_tlsf_oob_t **p)
{
    if (*p == NULL)
        return;
    munmap((*p)->base, (*p)->pool_bytes);
    munmap((*p)->rec, (*p)->rec_bytes);
    free(*p);
    *p = NULL;
}

void *mt_tlsf_oob_malloc(mt_tlsf_oob_t *t, size_t size)
{
    if (size > t->pool_bytes)
        return NULL;
    uint32_t want = size == 0 ? 1 : (uint32_t)((size + MT_TLSF_OOB_GRAN - 1) >> GRAN_LOG2);
    size_t bytes = (size_t)want << GRAN_LOG2;
    int fl, sl;
    /* The head of the request's own list first, if large enough (as tlsf.c). */
    tlsf_mapping_insert(bytes, &fl, &sl);
    uint32_t g = t->heads[fl][sl];
    if (g == NONE || gsize(t, g) < want) {
        tlsf_mapping_search(bytes, &fl, &sl);
        if (!tlsf_find_list(t->fl_map, t->sl_map, &fl, &sl))
            return NULL;
        g = t->heads[fl][sl];
    }
    list_remove(t, g);
    uint32_t have = gsize(t, g);
    if (have > want) {
        /* Split: the tail becomes a free block whose successor was not free (g was). */
        uint32_t r = g + want;
        t->rec[r].size = have - want;
        t->rec[g].size = want | (t->rec[g].size & (F_FREE | F_PREV_FREE));
        t->rec[r].prev_phys = g;
        set_free(t, r, true);
        list_insert(t, r);
    }
    set_free(t, g, false);
    t->in_use += bytes;
    size_t reach = (size_t)(g + want) << GRAN_LOG2;
    if (reach > t->high_water)
        t->high_water = reach;
    return t->base + ((size_t)g << GRAN_LOG2);
}

void mt_tlsf_oob_free(mt_tlsf_oob_t *t, void *p)
{
    if (p == NULL)
        return;
    uint32_t g = (uint32_t)(((char *)p - t->base) >> GRAN_LOG2);
    t->in_use -= (size_t)gsize(t, g) << GRAN_LOG2;
    if (t->rec[g].size & F_PREV_FREE) {
        uint32_t pv = t->rec[g].prev_phys;
        list_remove(t, pv);
        t->rec[pv].size += gsize(t, g);
        g = pv;
    }
    uint32_t n = g + gsize(t, g);
    if (t->rec[n].size & F_FREE) {
        list_remove(t, n);
        t->rec[g].size += gsize(t, n);
    }
    set_free(t, g, true);
    list_insert(t, g);
}

size_t mt_tlsf_oob_high_water(const mt_tlsf_oob_t *t)
{
    return t->high_water;
}

void mt_tlsf_oob_bounds(const mt_tlsf_oob_t *t, const char **base, size_t *bytes)
{
    *base = t->base;
    *bytes = t->pool_bytes;
}

size_t mt_tlsf_oob_in_use(const mt_tlsf_oob_t *t)
{
    return t->in_use;
}

/* ---- the checker ---- */

static bool on_list(const mt_tlsf_oob_t *t, uint32_t g, int fl, int sl)
{
    for (uint32_t x = t->heads[fl][sl]; x != NONE; x = t->rec[x].next)
        if (x == g)
            return true;
    return false;
}

int mt_tlsf_oob_check(const mt_tlsf_oob_t *t)
{
    size_t in_use = 0, nfree = 0;
    uint32_t prev = NONE;
    bool prev_free = false;
    for (size_t g = 0;; g += gsize(t, (uint32_t)g)) {
        if (g > t->ngran)
            return MT_EPROTO;
        const rec_t *r = &t->rec[g];
        if (((r->size & F_PREV_FREE) != 0) != prev_free || (prev_free && r->prev_phys != prev))
            return MT_EPROTO;
        bool is_free = (r->size & F_FREE) != 0;
        if (g == t->ngran) { /* the sentinel */
            if ((r->size & G_MASK) != 0 || is_free)
                return MT_EPROTO;
            break;
        }
        if ((r->size & G_MASK) == 0)
            return MT_EPROTO;
        if (is_free) {
            int fl, sl;
            tlsf_mapping_insert((size_t)(r->size & G_MASK) << GRAN_LOG2, &fl, &sl);
            if (prev_free || !on_list(t, (uint32_t)g, fl, sl))
                return MT_EPROTO;
            nfree++;
        } else {
            in_use += (size_t)(r->size & G_MASK) << GRAN_LOG2;
            if ((g + (r->size & G_MASK)) << GRAN_LOG2 > t->high_water)
                return MT_EPROTO;
        }
        prev = (uint32_t)g;
        prev_free = is_free;
    }
    if (in_use != t->in_use)
        return MT_EPROTO;
    size_t listed = 0;
    for (int fl = 0; fl < TLSF_FL_COUNT; fl++) {
        for (int sl = 0; sl < (int)TLSF_SL_COUNT; sl++) {
            if ((((t->sl_map[fl] >> sl) & 1u) != 0) != (t->heads[fl][sl] != NONE))
                return MT_EPROTO;
            uint32_t p = NONE;
            for (uint32_t x = t->heads[fl][sl]; x != NONE; x = t->rec[x].next) {
                if (!(t->rec[x].size & F_FREE) || t->rec[x].prev != p || ++listed > nfree)
                    return MT_EPROTO;
                p = x;
            }
        }
        if ((((t->fl_map >> fl) & 1u) != 0) != (t->sl_map[fl] != 0))
            return MT_EPROTO;
    }
    return listed == nfree ? 0 : MT_EPROTO;
}
