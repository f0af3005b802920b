/* The segment map (util/segmap.h): sorted, disjoint ranges, cut and joined as the
 * allocator's events say, in an ordered map (util/btree.h). A cut shortens, moves or removes
 * each segment it meets in place; only a cut out of a segment's middle inserts (its right
 * part), and only an add that joins nothing. */
#include "util/segmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "util/assert.h"
#include "util/grow.h"

_Static_assert(sizeof(mt__seg_t) % 8 == 0 && offsetof(mt__seg_t, addr) == 0,
               "a segment is a btree record keyed by its address");

static uint64_t end_of(uint64_t addr, uint64_t size)
{
    return size > UINT64_MAX - addr ? UINT64_MAX : addr + size;
}

static mt__seg_t *at(mt__segmap_it_t it)
{
    return (mt__seg_t *)mt__segmap_get(it);
}

static mt__segmap_it_t pos(const mt__segmap_t *m, mt__bt_cur_t c)
{
    return (mt__segmap_it_t){.c = c, .i = 0, .m = m};
}

/* The position before it (the end when it is the first). */
static mt__segmap_it_t before(const mt__segmap_t *m, mt__segmap_it_t it)
{
    if (!mt__bt_end(it.c)) {
        mt__bt_prev(&m->t, &it.c);
        return mt__bt_end(it.c) ? (mt__segmap_it_t){.i = m->ntop, .m = m} : it;
    }
    if (it.i > 0) {
        it.i--;
        return it;
    }
    mt__bt_cur_t last = mt__bt_last(&m->t);
    return mt__bt_end(last) ? (mt__segmap_it_t){.i = m->ntop, .m = m} : pos(m, last);
}

void mt__segmap_fini(mt__segmap_t *m)
{
    mt__bt_fini(&m->t);
    free(m->top);
    *m = (mt__segmap_t){0};
}

mt__segmap_it_t mt__segmap_first(const mt__segmap_t *m)
{
    return pos(m, mt__bt_first(&m->t));
}

mt__segmap_it_t mt__segmap_lower(const mt__segmap_t *m, uint64_t addr)
{
    return pos(m, mt__bt_lower(&m->t, addr)); /* past t's: top's, at 2^64 - 1 */
}

mt__segmap_it_t mt__segmap_find(const mt__segmap_t *m, uint64_t addr)
{
    mt__segmap_it_t it = mt__segmap_lower(m, addr);
    const mt__seg_t *s = at(it);
    if (s != NULL && s->addr == addr)
        return it;
    it = before(m, it);
    s = at(it);
    return s != NULL && addr - s->addr < s->size ? it : (mt__segmap_it_t){.i = m->ntop, .m = m};
}

mt__segmap_it_t mt__segmap_remove(mt__segmap_t *m, mt__segmap_it_t it)
{
    const mt__seg_t *s = at(it);
    mt_assert(s != NULL);
    m->bytes -= s->size;
    if (s->uncertain)
        m->unc -= s->size;
    if (!mt__bt_end(it.c))
        return pos(m, mt__bt_erase(&m->t, it.c));
    memmove(&m->top[it.i], &m->top[it.i + 1], (m->ntop - it.i - 1) * sizeof(*m->top));
    m->ntop--;
    return it;
}

/* Inserts s, which overlaps none (at 2^64 - 1: before those there). 0 or MT_ENOMEM (the
 * map unchanged). */
static int insert(mt__segmap_t *m, const mt__seg_t *s, mt__bt_cur_t *c)
{
    int rc = 0;
    if (s->addr == UINT64_MAX) {
        mt__seg_t *v = mt__grow(m->top, &m->captop, m->ntop + 1, sizeof(*v), 4);
        if (v == NULL)
            return MT_ENOMEM;
        m->top = v;
        memmove(&v[1], &v[0], m->ntop * sizeof(*v));
        v[0] = *s;
        m->ntop++;
    } else {
        if (m->t.rsize == 0)
            mt__bt_init(&m->t, sizeof(*s));
        rc = mt__bt_insert(&m->t, s, c);
        mt_assert(rc != MT_EINVAL); /* callers cut what overlapped first */
    }
    if (rc != 0)
        return rc;
    m->bytes += s->size;
    if (s->uncertain)
        m->unc += s->size;
    return 0;
}

int mt__segmap_cut(mt__segmap_t *m, uint64_t addr, uint64_t size)
{
    /* Those at 2^64 - 1 hold no byte: end <= 2^64 - 1 leaves them. */
    uint64_t end = end_of(addr, size);
    mt__bt_cur_t it = mt__bt_lower(&m->t, addr), prev = it;
    mt__bt_prev(&m->t, &prev);
    if (!mt__bt_end(prev))
        it = prev; /* the one before may reach into the range */
    int rc = 0;
    mt__seg_t *g;
    while (rc == 0 && (g = mt__bt_get(it)) != NULL && g->addr < end) {
        uint64_t gend = end_of(g->addr, g->size);
        if (gend <= addr) {
            mt__bt_next(&it);
            continue;
        }
        bool left = g->addr<addr, right = gend> end; /* what stays of it */
        /* The sums count sizes, which may run past 2^64: what goes is the size less what
         * stays. */
        uint64_t lsize = left ? addr - g->addr : 0, rsize = right ? gend - end : 0;
        uint64_t gone = g->size - lsize - rsize;
        m->bytes -= gone;
        if (g->uncertain)
            m->unc -= gone;
        if (!left && !right) {
            it = mt__bt_erase(&m->t, it);
        } else if (left && right) { /* pages cut from the middle: its end is a new entry */
            mt__seg_t r = *g;
            r.addr = end;
            r.size = rsize;
            g->size = lsize;
            m->bytes -= rsize; /* insert counts it again */
            if (r.uncertain)
                m->unc -= rsize;
            rc = insert(m, &r, &it);
            mt__bt_next(&it);
        } else if (left) { /* its start stays */
            g->size = lsize;
            mt__bt_next(&it);
        } else { /* its end stays */
            mt__bt_rekey(&m->t, it, end);
            g->size = rsize;
            mt__bt_next(&it);
        }
    }
    mt_assert(m->unc <= m->bytes);
    return rc;
}

static bool joins(const mt__seg_t *run, const mt__seg_t *s)
{
    return s->mapped && run->mapped && !run->uncertain && !s->uncertain &&
           run->device == s->device && run->pool == s->pool && run->stream == s->stream;
}

/* next, the first of those at 2^64 - 1, takes s in (s ends where it starts). 0 or
 * MT_ENOMEM (the map unchanged). */
static int join_top(mt__segmap_t *m, const mt__seg_t *s)
{
    if (s->addr != UINT64_MAX) { /* it moves down, into the tree */
        mt__seg_t run = m->top[0];
        run.addr = s->addr;
        run.size += s->size;
        if (m->t.rsize == 0)
            mt__bt_init(&m->t, sizeof(run));
        int rc = mt__bt_insert(&m->t, &run, NULL);
        if (rc != 0)
            return rc;
        memmove(&m->top[0], &m->top[1], (m->ntop - 1) * sizeof(*m->top));
        m->ntop--;
    } else {
        m->top[0].size += s->size;
    }
    m->bytes += s->size;
    return 0;
}

int mt__segmap_add(mt__segmap_t *m, const mt__seg_t *s)
{
    if (s->size == 0)
        return 0;
    int rc = mt__segmap_cut(m, s->addr, s->size);
    if (rc != 0)
        return rc;
    mt__segmap_it_t nit = mt__segmap_lower(m, s->addr);
    mt__seg_t *prev = at(before(m, nit)), *next = at(nit);
    bool with_prev = prev != NULL && joins(prev, s) && end_of(prev->addr, prev->size) == s->addr &&
                     s->size <= UINT64_MAX - prev->size;
    bool with_next = next != NULL && joins(next, s) && end_of(s->addr, s->size) == next->addr &&
                     s->size <= UINT64_MAX - next->size;
    if (with_prev && with_next && next->size <= UINT64_MAX - prev->size - s->size) {
        uint64_t more = next->size;
        (void)mt__segmap_remove(m, nit); /* takes its bytes off; they come back in prev */
        prev = mt__bt_get(mt__bt_floor(&m->t, s->addr)); /* prev is in t: next follows it */
        prev->size += s->size + more;
        m->bytes += s->size + more;
        return 0;
    }
    if (with_prev) {
        prev->size += s->size;
        m->bytes += s->size;
        return 0;
    }
    if (with_next && mt__bt_end(nit.c))
        return join_top(m, s);
    if (with_next) {
        mt__bt_rekey(&m->t, nit.c, s->addr);
        next->size += s->size;
        m->bytes += s->size;
        return 0;
    }
    return insert(m, s, NULL);
}

int mt__segmap_check(const mt__segmap_t *m, char *why, size_t whylen)
{
    unsigned __int128 bytes = 0, unc = 0;
    if ((m->t.root != NULL && m->t.rsize != sizeof(mt__seg_t)) || m->ntop > m->captop ||
        (m->ntop > 0 && m->top == NULL)) {
        if (why)
            snprintf(why, whylen, "segment map: records of %u bytes, %zu of %zu at the top",
                     m->t.rsize, m->ntop, m->captop);
        return MT_EPROTO;
    }
    int rc = mt__bt_check(&m->t, why, whylen);
    if (rc != 0)
        return rc;
    size_t i = 0;
    const mt__seg_t *prev = NULL;
    for (mt__segmap_it_t it = mt__segmap_first(m); !mt__segmap_end(it); mt__segmap_next(&it), i++) {
        const mt__seg_t *s = at(it);
        bool ok = s->size > 0 && (mt__bt_end(it.c) == (s->addr == UINT64_MAX)) &&
                  (prev == NULL || end_of(prev->addr, prev->size) <= s->addr);
        if (!ok) {
            if (why)
                snprintf(why, whylen, "segment %zu at %#llx: empty, unsorted or overlapping", i,
                         (unsigned long long)s->addr);
            return MT_EPROTO;
        }
        bytes += s->size;
        unc += s->uncertain ? s->size : 0;
        prev = s;
    }
    if (bytes != m->bytes || unc != m->unc || unc > bytes) {
        if (why)
            snprintf(why, whylen, "segment byte sums differ from the segments");
        return MT_EPROTO;
    }
    return 0;
}
