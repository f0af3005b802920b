/* The caching allocator's steps on blocks that its hot paths take inline: the bins' list
 * steps (bins.c has the rest), the block-struct pool, the block table over util's address
 * table (util/addrmap.h; meta.c has its check), and segments.c's take of a block for a
 * malloc and merge of a freed one. internal.h includes this header at its end; the
 * invariants are those written at mt_binset_s and mt_addrmap_t there. */
#ifndef MT_ALLOCATOR_BLOCKS_H
#define MT_ALLOCATOR_BLOCKS_H

/* ---- bins.c (the list steps inline: the hot paths take them) ---- */
static inline unsigned mt__bin_class(size_t size)
{
    size_t u = size / MT__ALIGN;
    if (u < MT__SL_N)
        return (unsigned)u;
    unsigned fl = 63u - (unsigned)__builtin_clzll((unsigned long long)u);
    unsigned sl = (unsigned)(u >> (fl - MT__SL_BITS)) & (MT__SL_N - 1);
    unsigned row = fl - (MT__SL_BITS - 1);
    if (row >= MT__ROWS)
        return MT__NCLASS - 1;
    return row * MT__SL_N + sl;
}
size_t mt__bin_class_min(unsigned cls);
mt_binset_t *mt__bins_create(int bp, mt_stream_t *s);
/* The bitmap bits of class c agree with its list (the binset invariant, for one class). */
static inline bool mt__bins_bits_agree(const mt_binset_t *bs, unsigned c)
{
    unsigned r = c / MT__SL_N;
    bool cls_bit = (bs->cls_map[r] >> (c % MT__SL_N)) & 1;
    bool row_bit = (bs->row_map >> r) & 1;
    return cls_bit == (bs->heads[c] != NULL) && row_bit == (bs->cls_map[r] != 0);
}
/* Its free space changes (blocks into or out of its bins): sr->free_ver counts it, for
 * readers without mu (a thread cache's block handed out before is then no longer what best
 * fit would give again). Once per operation under mu that changes the lists, before the
 * first change: mt__bins_link, unlink and keep leave it to their callers. */
static inline void mt__bins_changed(mt_streamrec_t *sr)
{
    if (sr != NULL)
        __atomic_store_n(&sr->free_ver, __atomic_load_n(&sr->free_ver, __ATOMIC_RELAXED) + 1,
                         __ATOMIC_RELAXED);
}
/* Puts b (inactive, of bs) at the head of the list of its class c = mt__bin_class(b->size). */
static inline void mt__bins_link(mt_binset_t *bs, mt_block_t *b, unsigned c)
{
    mt_assert(b->state == MT_BLOCK_INACTIVE && b->seg != NULL && b->seg->bins == bs);
    mt_assert(b->size > 0 && b->size % MT__ALIGN == 0 && b->addr % MT__ALIGN == 0);
    mt_assert(c == mt__bin_class(b->size));
    b->cls = (uint16_t)c;
    b->bin_prev = NULL;
    b->bin_next = bs->heads[c];
    if (b->bin_next != NULL)
        b->bin_next->bin_prev = b;
    bs->heads[c] = b;
    bs->cls_map[c / MT__SL_N] |= 1u << (c % MT__SL_N);
    bs->row_map |= 1ull << (c / MT__SL_N);
    bs->nblocks++;
    bs->bytes += b->size;
    mt_assert(mt__bins_bits_agree(bs, c));
}
/* Takes b off its class's list (b is on it). */
static inline void mt__bins_unlink(mt_binset_t *bs, mt_block_t *b)
{
    unsigned c = b->cls;
    mt_assert(b->state == MT_BLOCK_INACTIVE && c == mt__bin_class(b->size));
    mt_assert(b->bin_prev != NULL ? b->bin_prev->bin_next == b : bs->heads[c] == b);
    mt_assert(b->bin_next == NULL || b->bin_next->bin_prev == b);
    mt_assert(bs->nblocks > 0 && bs->bytes >= b->size);
    if (b->bin_prev != NULL)
        b->bin_prev->bin_next = b->bin_next;
    else
        bs->heads[c] = b->bin_next;
    if (b->bin_next != NULL)
        b->bin_next->bin_prev = b->bin_prev;
    b->bin_prev = b->bin_next = NULL;
    if (bs->heads[c] == NULL) {
        unsigned r = c / MT__SL_N;
        bs->cls_map[r] &= ~(1u << (c % MT__SL_N));
        if (bs->cls_map[r] == 0)
            bs->row_map &= ~(1ull << r);
    }
    bs->nblocks--;
    bs->bytes -= b->size;
    mt_assert(mt__bins_bits_agree(bs, c));
    mt_assert(bs->nblocks > 0 || (bs->row_map == 0 && bs->bytes == 0));
}
/* mt__bins_link and mt__bins_unlink out of line, free_ver counted (the checks of a double
 * remove name it). */
void mt__bins_insert(mt_binset_t *bs, mt_block_t *b);
void mt__bins_remove(mt_binset_t *bs, mt_block_t *b);
/* b heads the list of its class, and that class is c: taking b out and putting a block of
 * class c in leaves the lists as they were, with that block in b's place. */
static inline bool mt__bins_heads(const mt_binset_t *bs, const mt_block_t *b, unsigned c)
{
    return b->bin_prev == NULL && b->cls == c && bs->heads[c] == b;
}
/* nb (inactive, nb->size set; nb may be old) takes the place of old, which heads its list
 * and had old_size bytes, where mt__bins_heads(bs, old, nb->size): the lists, bitmaps
 * and counts that mt__bins_unlink(old) and then mt__bins_link(nb) would leave. */
static inline void mt__bins_keep(mt_binset_t *bs, mt_block_t *old, size_t old_size, mt_block_t *nb)
{
    unsigned c = old->cls;
    mt_assert(bs->heads[c] == old && old->bin_prev == NULL && old->state == MT_BLOCK_INACTIVE);
    mt_assert(nb->state == MT_BLOCK_INACTIVE && nb->seg != NULL && nb->seg->bins == bs);
    mt_assert(mt__bin_class(nb->size) == c && nb->size % MT__ALIGN == 0 && bs->bytes >= old_size);
    if (nb != old) {
        nb->cls = (uint16_t)c;
        nb->bin_prev = NULL;
        nb->bin_next = old->bin_next;
        if (nb->bin_next != NULL)
            nb->bin_next->bin_prev = nb;
        bs->heads[c] = nb;
        old->bin_next = NULL;
    }
    bs->bytes = bs->bytes - old_size + nb->size;
    mt_assert(mt__bins_bits_agree(bs, c));
}
/* Best fit of size bytes among blocks of size < upper (exclusive); NULL if none. Does not
 * remove the block. */
mt_block_t *mt__bins_find(const mt_binset_t *bs, size_t size, size_t upper);
/* Largest block in the bins (0 if empty). */
size_t mt__bins_largest(const mt_binset_t *bs);
/* Verifies the binset's invariants; returns a static description of the first violation. */
const char *mt__bins_check(const mt_binset_t *bs, size_t *nblocks);

/* ---- meta.c ---- */
/* Adds a chunk of block structs to the pool: 0 or MT_ENOMEM. */
int mt__blocks_grow(mt_alloc_t *a);
void mt__blocks_fini(mt_alloc_t *a);
/* The block of slot i of m's table, or NULL for an empty slot (walks over m). */
static inline mt_block_t *mt__addrmap_at(const mt_addrmap_t *m, size_t i)
{
    return m->keys[i] != 0 ? (mt_block_t *)(uintptr_t)m->vals[i] : NULL;
}
static inline int mt__addrmap_init(mt_addrmap_t *m)
{
    *m = (mt_addrmap_t){.room = 3}; /* a sixteenth full at most (util/addrmap.h) */
    return 0;
}
static inline void mt__addrmap_fini(mt_addrmap_t *m)
{
    mt__amap_fini(m);
}
/* The invariants of mt_addrmap_t; the first violation (text of the calling thread's,
 * valid until its next call), or NULL. */
const char *mt__addrmap_check(const mt_addrmap_t *m);
/* The block at addr, or NULL; *slot = its slot (for mt__addrmap_del_at). */
static inline mt_block_t *mt__addrmap_find(const mt_addrmap_t *m, uintptr_t addr, size_t *slot)
{
    return mt__amap_find(m, addr, slot) ? (mt_block_t *)(uintptr_t)m->vals[*slot] : NULL;
}
static inline mt_block_t *mt__addrmap_get(const mt_addrmap_t *m, uintptr_t addr)
{
    size_t slot;
    return mt__addrmap_find(m, addr, &slot);
}
/* b (active, its addr non-zero) under its address: 0 or MT_ENOMEM (m unchanged). */
static inline int mt__addrmap_put(mt_addrmap_t *m, mt_block_t *b)
{
    mt_assert(b->addr != 0 && b->addr % MT__ALIGN == 0 && b->state != MT_BLOCK_INACTIVE);
#if MT_ASSERT_LEVEL >= 1
    /* two live blocks never share an address: only b may be put again */
    mt_block_t *had = mt__addrmap_get(m, b->addr);
    mt_assert(had == NULL || had == b);
#endif
    return mt__amap_put(m, b->addr, (uint64_t)(uintptr_t)b);
}
/* Removes addr, which is in m, from its slot (hint: the slot mt__addrmap_find gave for it in
 * the same operation, or any value when m may have changed since). */
static inline void mt__addrmap_del_at(mt_addrmap_t *m, uintptr_t addr, size_t hint)
{
    mt_assert(m->cap > 0 && addr != 0);
    mt__amap_del_at(m, addr, hint);
}
/* Removes addr, which is in m. */
static inline void mt__addrmap_del(mt_addrmap_t *m, uintptr_t addr)
{
    mt__addrmap_del_at(m, addr, SIZE_MAX);
}

/* A zeroed block struct from the pool, or NULL without host memory. */
static inline mt_block_t *mt__block_new(mt_alloc_t *a)
{
    mt__alloc_assert_owner(a);
    if (a->blk_free == NULL && mt__blocks_grow(a) != 0)
        return NULL;
    static const mt_block_t zero;
    mt_block_t *b = a->blk_free;
    a->blk_free = b->bin_next;
    *b = zero; /* a copy, not `(mt_block_t){0}`: gcc zeroes 112 bytes with `rep stos`, whose
                * start-up costs a split more than the rest of the take */
    return b;
}
/* Returns b's struct to the pool. */
static inline void mt__block_release(mt_alloc_t *a, mt_block_t *b)
{
    mt__alloc_assert_owner(a);
    /* A struct going back to the pool is in no free list and no address map. */
    mt_assert(mt__addrmap_get(&a->map, b->addr) != b);
    if (b->uses != NULL) { /* most blocks never had another stream */
        free(b->uses);
        b->uses = NULL;
    }
    b->bin_next = a->blk_free;
    a->blk_free = b;
}

/* ---- segments.c: a malloc's take and a free's merge ---- */
/* The blocks tile the segment's mapped bytes: linked both ways, contiguous, first at addr,
 * last ending at addr + size (a walk: for mt_assert_expensive). */
static inline bool mt__seg_tiles(const mt_segment_t *seg)
{
    uintptr_t at = seg->addr;
    const mt_block_t *prev = NULL;
    for (const mt_block_t *b = seg->first; b != NULL; prev = b, b = b->next) {
        if (b->prev != prev || b->seg != seg || b->addr != at)
            return false;
        at += b->size;
    }
    return prev == seg->last && at == seg->addr + seg->size;
}

/* b (of at least size bytes) is split to hand out size bytes (the reference's rules). */
static inline bool mt__seg_should_split(const mt_alloc_t *a, const mt_block_t *b, size_t size)
{
    mt_assert(size <= b->size);
    size_t remaining = b->size - size;
    const mt_segment_t *seg = b->seg;
    /* Small blocks, warm-up reservations and expandable segments split down to the
     * minimum block: none of them strands a large remainder in a separate segment. */
    if (seg->pool != MT__BP_LARGE || seg->expandable)
        return remaining >= MT__MIN_BLOCK;
    if (size >= a->cfg.max_split_size)
        return false;
    return a->cfg.split_large_tails ? remaining >= MT__MIN_BLOCK : remaining > MT__SMALL_SIZE;
}

/* b keeps its first size bytes; r (a fresh struct) becomes the rest, inactive, right after
 * b in its segment's list (no bin, no counter: the caller's). */
static inline void mt__seg_link_rest(mt_block_t *b, mt_block_t *r, size_t size)
{
    mt_segment_t *seg = b->seg;
    r->addr = b->addr + size;
    r->size = b->size - size;
    r->seg = seg;
    r->state = MT_BLOCK_INACTIVE;
    r->prev = b;
    r->next = b->next;
    if (b->next != NULL)
        b->next->prev = r;
    else
        seg->last = r;
    b->next = r;
    b->size = size;
    mt_assert(r->addr % MT__ALIGN == 0 && r->size % MT__ALIGN == 0);
    mt_assert(r->next == NULL ? seg->last == r : r->next->addr == r->addr + r->size);
}

/* m takes in x, the block after it in its segment: the list loses x (whose struct is the
 * caller's to release). */
static inline void mt__seg_absorb_next(mt_block_t *m, mt_block_t *x)
{
    mt_assert(m->next == x && m->addr + m->size == x->addr);
    m->size += x->size;
    m->next = x->next;
    if (x->next != NULL)
        x->next->prev = m;
    else
        m->seg->last = m;
}

/* Takes b (inactive, in the bins) out to hand it out as size bytes: split when
 * mt__seg_should_split says so, the remainder going back to the bins. The lists, bitmaps
 * and inactive_split counters that mt__seg_bin_out, mt__seg_split and mt__seg_bin_in
 * would leave, in one pass. */
static inline void mt__seg_take(mt_alloc_t *a, mt_block_t *b, size_t size)
{
    mt__alloc_assert_owner(a);
    mt_assert(b->state == MT_BLOCK_INACTIVE && b->size >= size);
    mt_assert(b->split_counted == (b->prev != NULL || b->next != NULL));
    mt_block_t *r = mt__seg_should_split(a, b, size) ? mt__block_new(a) : NULL;
    if (r == NULL) { /* whole (or no host memory for metadata: whole too) */
        mt__seg_bin_out(a, b);
        return;
    }
    mt_assert(size % MT__ALIGN == 0 && size > 0 && size < b->size);
    mt_segment_t *seg = b->seg;
    mt_binset_t *bs = seg->bins;
    size_t bsize = b->size;
    bool counted = b->split_counted;
    /* The remainder takes b's place on b's list when that is where the insert would put
     * it (b heads the list of the remainder's class). */
    unsigned rc = mt__bin_class(bsize - size);
    bool keep = mt__bins_heads(bs, b, rc);
    mt__bins_changed(bs->sr);
    if (!keep)
        mt__bins_unlink(bs, b);
    mt__seg_link_rest(b, r, size);
    b->split_counted = false;
    mt_assert(r->next == NULL || r->next->state != MT_BLOCK_INACTIVE);
    mt_assert_expensive(mt__seg_tiles(seg));
    if (keep)
        mt__bins_keep(bs, b, bsize, r);
    else
        mt__bins_link(bs, r, rc);
    /* b leaves inactive_split if it was in it; r, whose prev is b, comes in. */
    r->split_counted = true;
    int sl = seg->slot;
    mt__stat_move(a->st.inactive_split_bytes, sl, (int64_t)r->size, counted ? (int64_t)bsize : 0);
    mt__stat_move(a->st.inactive_split, sl, 1, counted);
}

/* Merges inactive b (in no bin) with its inactive neighbours and puts the merged block
 * into the bins, as taking the neighbours out (mt__seg_bin_out), joining the three and
 * putting the result in (mt__seg_bin_in) would, in one pass. Returns the merged block (b
 * or prev). */
static inline __attribute__((always_inline)) mt_block_t *mt__seg_merge_in(mt_alloc_t *a,
                                                                          mt_block_t *b)
{
    mt__alloc_assert_owner(a);
    mt_assert(b->state == MT_BLOCK_INACTIVE && !b->split_counted && b->npending == 0);
    mt_segment_t *seg = b->seg;
    mt_binset_t *bs = seg->bins;
    mt_block_t *p = b->prev, *n = b->next;
    if (p != NULL && p->state != MT_BLOCK_INACTIVE)
        p = NULL;
    if (n != NULL && n->state != MT_BLOCK_INACTIVE)
        n = NULL;
    /* The free neighbours leave the bins and inactive_split (they had b as a neighbour). */
    mt_assert((p == NULL || p->split_counted) && (n == NULL || n->split_counted));
    int64_t gone = (p ? (int64_t)p->size : 0) + (n ? (int64_t)n->size : 0);
    int64_t ngone = (p != NULL) + (n != NULL);
    mt_block_t *m = p != NULL ? p : b; /* the merged block */
    size_t msize = b->size + (size_t)gone;
    /* m takes the list place of the neighbour that heads the merged size's class, where
     * the insert would put it: p (m itself), or n when there is no p. */
    mt_block_t *head = p != NULL ? p : n;
    size_t head_size = head != NULL ? head->size : 0;
    unsigned mc = mt__bin_class(msize);
    bool keep = head != NULL && mt__bins_heads(bs, head, mc);
    mt__bins_changed(bs->sr);
    if (n != NULL && !(keep && head == n))
        mt__bins_unlink(bs, n);
    if (p != NULL && !keep)
        mt__bins_unlink(bs, p);
    if (p != NULL) {
        p->split_counted = false;
        mt__seg_absorb_next(p, b);
    }
    if (n != NULL) {
        n->split_counted = false;
        mt__seg_absorb_next(m, n);
    }
    mt_assert(m->size == msize);
    /* Contiguous with its neighbours, and none of them free. */
    mt_assert(m->prev == NULL ? seg->first == m
                              : m->prev->state != MT_BLOCK_INACTIVE &&
                                    m->prev->addr + m->prev->size == m->addr);
    mt_assert(m->next == NULL
                  ? seg->last == m && m->addr + m->size == seg->addr + seg->size
                  : m->next->state != MT_BLOCK_INACTIVE && m->next->addr == m->addr + m->size);
    if (keep)
        mt__bins_keep(bs, head, head_size, m);
    else
        mt__bins_link(bs, m, mc);
    if (p != NULL)
        mt__block_release(a, b);
    if (n != NULL)
        mt__block_release(a, n);
    mt_assert_expensive(mt__seg_tiles(seg));
    bool counted = m->prev != NULL || m->next != NULL;
    m->split_counted = counted;
    int sl = seg->slot;
    mt__stat_move(a->st.inactive_split_bytes, sl, counted ? (int64_t)msize : 0, gone);
    mt__stat_move(a->st.inactive_split, sl, counted, ngone);
    return m;
}

#endif
