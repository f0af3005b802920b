/* The free extents of a class kept as it changes, for mt__model_figures_kept: the report's
 * timeline takes the figures at up to 4 points per step (up to 40 000), and
 * mt__model_free_extents sorts every live block each time (2 M live blocks: 33 s).
 *
 * The free extents are the ranges of each segment that no live block covers (split where a
 * segment ends, even where the next one begins); the figures need their sum and the largest.
 * When the live blocks are apart, each within one segment or outside every one and none
 * empty (what an allocator's events give), a change moves only the extents around it:
 *   - a block allocated inside a segment lies in one extent, which it cuts in up to two;
 *   - a block freed there becomes an extent, joined with the extents that touch it in its
 *     segment;
 *   - a block outside every segment changes nothing, but is kept (by address) for the
 *     segment that may come around it;
 *   - a segment cut first proves that no block lies in what it takes (the segments' bytes
 *     there equal the extents'), then takes the extents there;
 *   - a segment added meets no block (the cut before it took the segments there; it must
 *     meet none of the blocks outside), and becomes an extent, joined with the extents
 *     that touch it where the map joined it with a run.
 * Anything else (overlapping blocks, a block across a segment's end, an empty one, a block
 * in a segment cut, no memory) drops the kept extents: the next figures sweep every block
 * as mt__model_free_extents does, give its result, and keep the extents again when the
 * blocks are back in that shape. The figures are the same either way.
 *
 * Block changes wait in a journal until the figures are read, a segment changes, or the
 * journal is full: a free and an allocation of the same block in a row cancel there (a
 * training loop's), so a run between two figures costs the blocks it really changed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/model_internal.h"
#include "memtrace/common.h"
#include "util/assert.h"
#include "util/btree.h"

#define JOURNAL_MAX 4096 /* block changes held before they are applied */

typedef struct ext_s {
    uint64_t addr, end; /* [addr, end), end > addr */
} ext_t;

typedef struct size_count_s {
    uint64_t size; /* bytes */
    uint64_t n;    /* extents of that size, > 0 */
} size_count_t;

typedef struct jop_s {
    uint64_t addr, size; /* the block */
    int64_t d;           /* 1: appeared, -1: went, 0: cancelled by a later one */
} jop_t;

/* Invariants (mt__model_free_check). When valid, with the journal's changes applied:
 *   ext holds the free extents (above) by addr, sum their bytes, sizes for each extent size
 *   the number of extents of it; out holds the live blocks outside every segment as [addr,
 *   end) by addr, apart; every other live block lies in one segment, apart from the rest;
 *   no live block is empty. j[0..jn) are the block changes since, in order, jn <= jcap <=
 *   JOURNAL_MAX (a power of two, or 0); slot[0..jcap) hold indexes in j: when slot[home(a)]
 *   = i with i < jn, j[i].addr = a and j[i].d != 0, j[i] is the latest change of the block
 *   at a (a reverse one may cancel it); any other value names nothing.
 * When not valid: ext, sizes, out are empty, sum = 0, j = slot = NULL, jn = jcap = 0. */
struct mt__mfree_s {
    bool valid;
    mt__bt_t ext;   /* ext_t by addr */
    mt__bt_t sizes; /* size_count_t by size */
    mt__bt_t out;   /* ext_t by addr: blocks outside every segment */
    mt__u128 sum;   /* bytes of ext */
    jop_t *j;       /* jcap allocated */
    size_t jn, jcap;
    uint32_t *slot; /* jcap: by an address's hash, its latest change in j (a cache: a
                     * collision loses a cancellation, never makes a wrong one) */
    unsigned shift; /* 64 - log2(jcap) */
};

typedef struct mt__mfree_s mfree_t;

static uint64_t end_of(uint64_t addr, uint64_t size)
{
    return size > UINT64_MAX - addr ? UINT64_MAX : addr + size;
}

static ext_t *ext_at(mt__bt_cur_t c)
{
    return (ext_t *)mt__bt_get(c);
}

/* Drops the kept extents: the next figures sweep the blocks. */
static void drop(mfree_t *f)
{
    mt__bt_fini(&f->ext);
    mt__bt_fini(&f->sizes);
    mt__bt_fini(&f->out);
    free(f->j);
    free(f->slot);
    f->j = NULL;
    f->slot = NULL;
    f->jn = f->jcap = 0;
    f->sum = 0;
    f->valid = false;
}

/* ---- the extents and their sizes ---- */

static int size_count(mfree_t *f, uint64_t size, int d)
{
    mt__bt_cur_t c = mt__bt_lower(&f->sizes, size);
    size_count_t *r = mt__bt_get(c);
    if (r != NULL && r->size == size) {
        r->n += (uint64_t)(int64_t)d;
        if (r->n == 0)
            (void)mt__bt_erase(&f->sizes, c);
        return 0;
    }
    mt_assert(d > 0);
    return mt__bt_insert(&f->sizes, &(size_count_t){size, 1}, NULL);
}

/* Adds the extent [addr, end). 0 or MT_ENOMEM (then drop). */
static int ext_put(mfree_t *f, uint64_t addr, uint64_t end)
{
    int rc = mt__bt_insert(&f->ext, &(ext_t){addr, end}, NULL);
    if (rc == 0 && (rc = size_count(f, end - addr, 1)) != 0)
        return rc;
    f->sum += end - addr;
    return rc;
}

/* Removes the extent at c; returns the position after it. */
static mt__bt_cur_t ext_del(mfree_t *f, mt__bt_cur_t c)
{
    ext_t x = *ext_at(c);
    (void)size_count(f, x.end - x.addr, -1);
    f->sum -= x.end - x.addr;
    return mt__bt_erase(&f->ext, c);
}

/* ---- block changes ---- */

/* The block [addr, end) appeared. 0, or MT_EPROTO when the extents cannot follow it. */
static int block_in(const mt__mclass_t *c, mfree_t *f, uint64_t addr, uint64_t end)
{
    if (end <= addr)
        return MT_EPROTO;
    if (!mt__segmap_end(mt__segmap_find(&c->segs, addr))) {
        mt__bt_cur_t k = mt__bt_floor(&f->ext, addr);
        const ext_t *x = ext_at(k);
        if (x == NULL || addr >= x->end || end > x->end)
            return MT_EPROTO; /* over another block, or past its segment */
        ext_t was = *x;
        (void)ext_del(f, k);
        int rc = was.addr < addr ? ext_put(f, was.addr, addr) : 0;
        if (rc == 0 && end < was.end)
            rc = ext_put(f, end, was.end);
        return rc;
    }
    const mt__seg_t *g = mt__segmap_get(mt__segmap_lower(&c->segs, addr));
    const ext_t *before = ext_at(mt__bt_floor(&f->out, addr));
    const ext_t *after = ext_at(mt__bt_lower(&f->out, addr));
    if ((g != NULL && g->addr < end) || (before != NULL && before->end > addr) ||
        (after != NULL && after->addr < end))
        return MT_EPROTO; /* into a segment, or over another block outside */
    return mt__bt_insert(&f->out, &(ext_t){addr, end}, NULL);
}

/* The block [addr, end) went. 0, or MT_EPROTO when the extents cannot follow it. */
static int block_out(const mt__mclass_t *c, mfree_t *f, uint64_t addr, uint64_t end)
{
    mt__bt_cur_t o = mt__bt_lower(&f->out, addr);
    const ext_t *x = ext_at(o);
    if (x != NULL && x->addr == addr) {
        if (x->end != end)
            return MT_EPROTO;
        (void)mt__bt_erase(&f->out, o);
        return 0;
    }
    const mt__seg_t *g = mt__segmap_get(mt__segmap_find(&c->segs, addr));
    if (g == NULL || end <= addr || end > end_of(g->addr, g->size))
        return MT_EPROTO;
    /* the extents that touch it in its segment join it */
    const ext_t *l = ext_at(mt__bt_floor(&f->ext, addr));
    const ext_t *r = ext_at(mt__bt_lower(&f->ext, addr));
    if ((l != NULL && l->end > addr) || (r != NULL && r->addr < end))
        return MT_EPROTO; /* free bytes under a live block */
    bool join_l = l != NULL && l->end == addr && addr != g->addr;
    bool join_r = r != NULL && r->addr == end && end != end_of(g->addr, g->size);
    uint64_t lo = join_l ? l->addr : addr, hi = join_r ? r->end : end;
    if (join_l)
        (void)ext_del(f, mt__bt_floor(&f->ext, addr));
    if (join_r)
        (void)ext_del(f, mt__bt_lower(&f->ext, end));
    return ext_put(f, lo, hi);
}

/* Applies the journal (drops the extents when one change cannot be followed). */
static void flush(const mt__mclass_t *c, mfree_t *f)
{
    for (size_t i = 0; i < f->jn && f->valid; i++) {
        const jop_t *op = &f->j[i];
        uint64_t end = end_of(op->addr, op->size);
        int rc = op->d > 0   ? block_in(c, f, op->addr, end)
                 : op->d < 0 ? block_out(c, f, op->addr, end)
                             : 0;
        if (rc != 0)
            drop(f);
    }
    f->jn = 0; /* the slots now name nothing: their entries are >= jn or differ */
}

static size_t home(const mfree_t *f, uint64_t addr)
{
    return (size_t)((addr * UINT64_C(0x9e3779b97f4a7c15)) >> f->shift);
}

/* Doubles the journal (from 64). 0 or MT_ENOMEM (then drop). */
static int journal_grow(mfree_t *f)
{
    size_t cap = f->jcap ? 2 * f->jcap : 64;
    jop_t *v = realloc(f->j, cap * sizeof *v);
    if (v == NULL)
        return MT_ENOMEM;
    f->j = v;
    uint32_t *sl = realloc(f->slot, cap * sizeof *sl);
    if (sl == NULL)
        return MT_ENOMEM;
    f->slot = sl;
    memset(sl, 0xff, cap * sizeof *sl); /* the pending changes can no longer be cancelled */
    f->jcap = cap;
    f->shift = 64 - (unsigned)__builtin_ctzll(cap);
    return 0;
}

void mt__model_free_block(mt__mclass_t *c, uint64_t addr, uint64_t size, int d)
{
    mfree_t *f = c->fr;
    if (!f->valid)
        return;
    if (f->jcap > 0) {
        uint32_t i = f->slot[home(f, addr)];
        jop_t *op = i < f->jn ? &f->j[i] : NULL;
        if (op != NULL && op->addr == addr && op->d == -d && op->size == size) {
            op->d = 0; /* the block as it was: the two cancel */
            return;
        }
    }
    if (f->jn == f->jcap && f->jcap < JOURNAL_MAX) {
        if (journal_grow(f) != 0) {
            drop(f);
            return;
        }
    } else if (f->jn == f->jcap) {
        flush(c, f);
        if (!f->valid)
            return;
    }
    f->slot[home(f, addr)] = (uint32_t)f->jn;
    f->j[f->jn++] = (jop_t){addr, size, d};
}

/* ---- segment changes ---- */

void mt__model_free_cut(mt__mclass_t *c, uint64_t addr, uint64_t size)
{
    mfree_t *f = c->fr;
    if (!f->valid)
        return;
    flush(c, f);
    uint64_t end = end_of(addr, size);
    if (end == addr) { /* a cut of nothing still splits the segment around it */
        const mt__seg_t *g = mt__segmap_get(mt__segmap_find(&c->segs, addr));
        if (g != NULL && g->addr < addr)
            drop(f);
        return;
    }
    /* No block may lie in what the map loses: its bytes there are the extents'. */
    mt__u128 segs = 0, free = 0;
    mt__segmap_it_t it = mt__segmap_find(&c->segs, addr); /* the one reaching into it */
    if (mt__segmap_end(it))
        it = mt__segmap_lower(&c->segs, addr);
    for (const mt__seg_t *g; (g = mt__segmap_get(it)) != NULL && g->addr < end;
         mt__segmap_next(&it)) {
        uint64_t ge = end_of(g->addr, g->size);
        if (ge > addr)
            segs += (ge < end ? ge : end) - (g->addr > addr ? g->addr : addr);
    }
    mt__bt_cur_t x = mt__bt_floor(&f->ext, addr);
    if (mt__bt_end(x))
        x = mt__bt_first(&f->ext);
    uint64_t keep_lo = 0, keep_hi = 0; /* what stays of the first and last extents it meets */
    bool left = false, right = false;
    for (ext_t *e; (e = ext_at(x)) != NULL && e->addr < end;) {
        if (e->end <= addr) {
            mt__bt_next(&x);
            continue;
        }
        free += (e->end < end ? e->end : end) - (e->addr > addr ? e->addr : addr);
        if (e->addr < addr) {
            left = true;
            keep_lo = e->addr;
        }
        if (e->end > end) {
            right = true;
            keep_hi = e->end;
        }
        x = ext_del(f, x);
    }
    int rc = free == segs ? 0 : MT_EPROTO;
    if (rc == 0 && left)
        rc = ext_put(f, keep_lo, addr);
    if (rc == 0 && right)
        rc = ext_put(f, end, keep_hi);
    if (rc != 0)
        drop(f);
}

void mt__model_free_added(mt__mclass_t *c, uint64_t addr, uint64_t size, int rc)
{
    mfree_t *f = c->fr;
    if (!f->valid)
        return;
    if (rc != 0) {
        drop(f); /* the map holds less than the events say */
        return;
    }
    uint64_t end = end_of(addr, size);
    if (end == addr)
        return;
    const ext_t *before = ext_at(mt__bt_floor(&f->out, addr));
    const ext_t *after = ext_at(mt__bt_lower(&f->out, addr));
    const mt__seg_t *g = mt__segmap_get(mt__segmap_find(&c->segs, addr));
    if ((before != NULL && before->end > addr) || (after != NULL && after->addr < end) ||
        g == NULL) {
        drop(f); /* a block that was outside is in it now */
        return;
    }
    /* Joined with the run before (after): the extent ending (starting) there joins too. */
    const ext_t *l = g->addr < addr ? ext_at(mt__bt_floor(&f->ext, addr)) : NULL;
    const ext_t *r = end_of(g->addr, g->size) > end ? ext_at(mt__bt_lower(&f->ext, end)) : NULL;
    bool join_l = l != NULL && l->end == addr, join_r = r != NULL && r->addr == end;
    uint64_t lo = join_l ? l->addr : addr, hi = join_r ? r->end : end;
    if (join_l)
        (void)ext_del(f, mt__bt_floor(&f->ext, addr));
    if (join_r)
        (void)ext_del(f, mt__bt_lower(&f->ext, end));
    if (ext_put(f, lo, hi) != 0)
        drop(f);
}

/* ---- building them, reading them ---- */

/* Whether the sorted blocks are in the shape the extents can follow: none empty, apart,
 * each within one segment or outside every one. */
static bool followable(const mt__mclass_t *c, const mt__range_t *blk, size_t nb)
{
    mt__segmap_it_t it = mt__segmap_first(&c->segs);
    for (size_t k = 0; k < nb; k++) {
        uint64_t a = blk[k].addr, e = end_of(a, blk[k].size);
        if (e <= a || (k + 1 < nb && blk[k + 1].addr < e))
            return false;
        const mt__seg_t *g;
        while ((g = mt__segmap_get(it)) != NULL && end_of(g->addr, g->size) <= a)
            mt__segmap_next(&it);
        if (g != NULL && g->addr < e && (g->addr > a || end_of(g->addr, g->size) < e))
            return false; /* across a segment's start or end */
    }
    return true;
}

/* Keeps the extents of the followable sorted blocks. 0 or MT_ENOMEM. */
static int build(const mt__mclass_t *c, mfree_t *f, const mt__range_t *blk, size_t nb)
{
    mt__bt_init(&f->ext, sizeof(ext_t));
    mt__bt_init(&f->sizes, sizeof(size_count_t));
    mt__bt_init(&f->out, sizeof(ext_t));
    size_t k = 0;
    int rc = 0;
    for (mt__segmap_it_t it = mt__segmap_first(&c->segs); rc == 0 && !mt__segmap_end(it);
         mt__segmap_next(&it)) {
        const mt__seg_t *g = mt__segmap_get(it);
        uint64_t a = g->addr, e = end_of(a, g->size), cur = a;
        for (; rc == 0 && k < nb && blk[k].addr < a; k++)
            rc = mt__bt_insert(&f->out, &(ext_t){blk[k].addr, end_of(blk[k].addr, blk[k].size)},
                               NULL);
        for (; rc == 0 && k < nb && blk[k].addr < e; k++) {
            if (blk[k].addr > cur)
                rc = ext_put(f, cur, blk[k].addr);
            cur = end_of(blk[k].addr, blk[k].size);
        }
        if (rc == 0 && e > cur)
            rc = ext_put(f, cur, e);
    }
    for (; rc == 0 && k < nb; k++)
        rc = mt__bt_insert(&f->out, &(ext_t){blk[k].addr, end_of(blk[k].addr, blk[k].size)}, NULL);
    return rc;
}

static void read_kept(const mfree_t *f, uint64_t *total, uint64_t *largest)
{
    const size_count_t *top = mt__bt_get(mt__bt_last(&f->sizes));
    *total = mt__model_sat(f->sum);
    *largest = top != NULL ? top->size : 0;
}

int mt__model_free_kept(mt__mclass_t *c, uint64_t *total, uint64_t *largest)
{
    if (c->fr == NULL && (c->fr = calloc(1, sizeof(*c->fr))) == NULL)
        return mt__model_free_extents(c, total, largest, NULL);
    mfree_t *f = c->fr;
    if (f->valid)
        flush(c, f);
    if (f->valid) {
        read_kept(f, total, largest);
        return 0;
    }
    /* The sweep of every block, as mt__model_free_extents; then the extents kept again
     * when the blocks are in their shape. */
    size_t nb = 0;
    mt__range_t *blk = mt__model_sorted_blocks(c, &nb);
    if (blk == NULL)
        return MT_ENOMEM;
    mt__model_sweep(c, blk, nb, total, largest, NULL);
    if (followable(c, blk, nb)) {
        f->valid = true;
        if (build(c, f, blk, nb) != 0)
            drop(f);
    }
#if MT_ASSERT_LEVEL >= 1
    uint64_t t2, l2;
    if (f->valid) {
        read_kept(f, &t2, &l2);
        mt_assert(t2 == *total && l2 == *largest);
    }
#endif
    free(blk);
    return 0;
}

bool mt__model_free_following(const mt__mclass_t *c)
{
    return c->fr != NULL && c->fr->valid;
}

void mt__model_free_destroy(mt__mclass_t *c)
{
    if (c->fr == NULL)
        return;
    drop(c->fr);
    free(c->fr);
    c->fr = NULL;
}

/* ---- checker ---- */

static int u64_cmp(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* ext's extents lie apart, sum and sizes count them; out's blocks lie apart. */
static int check_kept(const mfree_t *f, char *why, size_t whylen)
{
    int rc = mt__bt_check(&f->ext, why, whylen);
    rc = rc ? rc : mt__bt_check(&f->sizes, why, whylen);
    rc = rc ? rc : mt__bt_check(&f->out, why, whylen);
    if (rc != 0)
        return rc;
    uint64_t *len = malloc((f->ext.n + 1) * sizeof *len);
    if (len == NULL)
        return 0; /* no memory to look: nothing seen wrong */
    mt__u128 sum = 0;
    size_t n = 0;
    uint64_t prev_end = 0;
    for (mt__bt_cur_t k = mt__bt_first(&f->ext); !mt__bt_end(k); mt__bt_next(&k)) {
        const ext_t *x = ext_at(k);
        if (x->end <= x->addr || (n > 0 && x->addr < prev_end))
            break;
        prev_end = x->end;
        len[n++] = x->end - x->addr;
        sum += x->end - x->addr;
    }
    qsort(len, n, sizeof *len, u64_cmp);
    size_t i = 0;
    bool same = n == f->ext.n && sum == f->sum;
    for (mt__bt_cur_t k = mt__bt_first(&f->sizes); same && !mt__bt_end(k); mt__bt_next(&k)) {
        const size_count_t *s = mt__bt_get(k);
        for (uint64_t q = 0; same && q < s->n; q++)
            same = i < n && len[i++] == s->size;
    }
    free(len);
    MT__MCHECK(same && i == n, "free extents: empty, overlapping, or their sum or sizes differ");
    prev_end = 0;
    for (mt__bt_cur_t k = mt__bt_first(&f->out); !mt__bt_end(k); mt__bt_next(&k)) {
        const ext_t *x = ext_at(k);
        MT__MCHECK(x->end > x->addr && x->addr >= prev_end,
                   "blocks outside the segments: empty or overlapping at %#llx",
                   (unsigned long long)x->addr);
        prev_end = x->end;
    }
    return 0;
}

/* Two trees of ext_t hold the same records. */
static bool same_exts(const mt__bt_t *a, const mt__bt_t *b)
{
    if (a->n != b->n)
        return false;
    mt__bt_cur_t x = mt__bt_first(a), y = mt__bt_first(b);
    for (; !mt__bt_end(x); mt__bt_next(&x), mt__bt_next(&y))
        if (memcmp(mt__bt_get(x), mt__bt_get(y), sizeof(ext_t)) != 0)
            return false;
    return true;
}

int mt__model_free_check(const mt__mclass_t *c, char *why, size_t whylen)
{
    const mfree_t *f = c->fr;
    if (f == NULL)
        return 0;
    if (!f->valid) {
        MT__MCHECK(f->ext.n == 0 && f->sizes.n == 0 && f->out.n == 0 && f->slot == NULL &&
                       f->sum == 0 && f->jn == 0,
                   "free extents dropped, yet some kept");
        return 0;
    }
    MT__MCHECK(f->jn <= f->jcap && f->jcap <= JOURNAL_MAX, "free extents: journal %zu of %zu",
               f->jn, f->jcap);
    MT__MCHECK(f->jcap == 0 || (f->jcap >= 64 && (f->jcap & (f->jcap - 1)) == 0 &&
                                f->shift == 64 - (unsigned)__builtin_ctzll(f->jcap)),
               "free extents: journal of %zu entries", f->jcap);
    size_t pending = 0;
    for (size_t i = 0; i < f->jn; i++)
        pending += f->j[i].d != 0;
    for (size_t s = 0; s < f->jcap; s++) {
        uint32_t i = f->slot[s];
        if (i >= f->jn || f->j[i].d == 0 || home(f, f->j[i].addr) != s)
            continue; /* names nothing (a lookup compares the address) */
        bool latest = true;
        for (size_t k = i + 1; latest && k < f->jn; k++)
            latest = f->j[k].d == 0 || f->j[k].addr != f->j[i].addr;
        MT__MCHECK(latest, "free extents: slot %zu names a change of %#llx not its latest", s,
                   (unsigned long long)f->j[i].addr);
    }
    int rc;
    if ((rc = check_kept(f, why, whylen)) != 0 || pending > 0)
        return rc; /* changes pending: the blocks are ahead of the extents */
    /* Nothing pending: the extents are the blocks' and segments', made anew. */
    size_t nb = 0;
    mt__range_t *blk = mt__model_sorted_blocks(c, &nb);
    if (blk == NULL)
        return 0;
    mfree_t fresh = {.valid = true};
    bool shape = followable(c, blk, nb);
    bool built = shape && build(c, &fresh, blk, nb) == 0;
    bool same = !built || (same_exts(&fresh.ext, &f->ext) && same_exts(&fresh.out, &f->out) &&
                           fresh.sum == f->sum);
    drop(&fresh);
    free(blk);
    MT__MCHECK(shape, "free extents kept, but the blocks overlap or cross a segment's end");
    MT__MCHECK(same, "free extents differ from the blocks' and segments'");
    return 0;
}
