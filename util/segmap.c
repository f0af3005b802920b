/* The segment map (util/segmap.h): sorted, disjoint ranges, cut and joined as the
 * allocator's events say. */
#include "util/segmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "util/assert.h"
#include "util/grow.h"

static uint64_t end_of(uint64_t addr, uint64_t size)
{
    return size > UINT64_MAX - addr ? UINT64_MAX : addr + size;
}

void mt__segmap_fini(mt__segmap_t *m)
{
    free(m->v);
    *m = (mt__segmap_t){0};
}

size_t mt__segmap_lower(const mt__segmap_t *m, uint64_t addr)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->v[mid].addr < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

ptrdiff_t mt__segmap_find(const mt__segmap_t *m, uint64_t addr)
{
    size_t i = mt__segmap_lower(m, addr);
    if (i < m->n && m->v[i].addr == addr)
        return (ptrdiff_t)i;
    if (i == 0 || addr - m->v[i - 1].addr >= m->v[i - 1].size)
        return -1;
    return (ptrdiff_t)i - 1;
}

static int insert_at(mt__segmap_t *m, size_t i, const mt__seg_t *s)
{
    mt__seg_t *v = mt__grow(m->v, &m->cap, m->n + 1, sizeof *v, 16);
    if (v == NULL)
        return MT_ENOMEM;
    m->v = v;
    /* Callers cut what overlapped first. */
    mt_assert(i == 0 || end_of(v[i - 1].addr, v[i - 1].size) <= s->addr);
    mt_assert(i == m->n || end_of(s->addr, s->size) <= v[i].addr);
    memmove(&v[i + 1], &v[i], (m->n - i) * sizeof *v);
    v[i] = *s;
    m->n++;
    m->bytes += s->size;
    if (s->uncertain)
        m->unc += s->size;
    return 0;
}

void mt__segmap_remove_at(mt__segmap_t *m, size_t i)
{
    mt_assert(i < m->n);
    const mt__seg_t *s = &m->v[i];
    m->bytes -= s->size;
    if (s->uncertain)
        m->unc -= s->size;
    memmove(&m->v[i], &m->v[i + 1], (m->n - i - 1) * sizeof *s);
    m->n--;
}

void mt__segmap_set_uncertain(mt__segmap_t *m, size_t i, bool uncertain)
{
    mt__seg_t *s = &m->v[i];
    if (s->uncertain == uncertain)
        return;
    if (uncertain)
        m->unc += s->size;
    else
        m->unc -= s->size;
    s->uncertain = uncertain;
}

int mt__segmap_cut(mt__segmap_t *m, uint64_t addr, uint64_t size)
{
    uint64_t end = end_of(addr, size);
    size_t i = mt__segmap_lower(m, addr);
    i = i > 0 ? i - 1 : 0; /* the one before may reach into the range */
    int rc = 0;
    while (rc == 0 && i < m->n && m->v[i].addr < end) {
        mt__seg_t s = m->v[i];
        uint64_t send = end_of(s.addr, s.size);
        if (send <= addr) {
            i++;
            continue;
        }
        mt__segmap_remove_at(m, i);
        if (s.addr < addr) { /* its start stays */
            mt__seg_t left = s;
            left.size = addr - s.addr;
            rc = insert_at(m, i++, &left);
        }
        if (rc == 0 && send > end) { /* its end stays: pages cut from the middle */
            mt__seg_t right = s;
            right.addr = end;
            right.size = send - end;
            rc = insert_at(m, i++, &right);
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

int mt__segmap_add(mt__segmap_t *m, const mt__seg_t *s)
{
    if (s->size == 0)
        return 0;
    int rc = mt__segmap_cut(m, s->addr, s->size);
    if (rc != 0)
        return rc;
    size_t i = mt__segmap_lower(m, s->addr);
    mt__seg_t *prev = i > 0 ? &m->v[i - 1] : NULL;
    mt__seg_t *next = i < m->n ? &m->v[i] : NULL;
    bool with_prev = prev != NULL && joins(prev, s) && end_of(prev->addr, prev->size) == s->addr &&
                     s->size <= UINT64_MAX - prev->size;
    bool with_next = next != NULL && joins(next, s) && end_of(s->addr, s->size) == next->addr &&
                     s->size <= UINT64_MAX - next->size;
    if (with_prev && with_next && next->size <= UINT64_MAX - prev->size - s->size) {
        uint64_t more = next->size;
        mt__segmap_remove_at(m, i); /* takes its bytes off; they come back in prev */
        prev = &m->v[i - 1];
        prev->size += s->size + more;
        m->bytes += s->size + more;
        return 0;
    }
    if (with_prev) {
        prev->size += s->size;
        m->bytes += s->size;
        return 0;
    }
    if (with_next) {
        next->addr = s->addr;
        next->size += s->size;
        m->bytes += s->size;
        return 0;
    }
    return insert_at(m, i, s);
}

int mt__segmap_check(const mt__segmap_t *m, char *why, size_t whylen)
{
    unsigned __int128 bytes = 0, unc = 0;
    if (m->n > m->cap || (m->n > 0 && m->v == NULL)) {
        if (why)
            snprintf(why, whylen, "segment map: %zu entries in %zu slots", m->n, m->cap);
        return MT_EPROTO;
    }
    for (size_t i = 0; i < m->n; i++) {
        const mt__seg_t *s = &m->v[i];
        bool ok = s->size > 0 && (i == 0 || end_of(m->v[i - 1].addr, m->v[i - 1].size) <= s->addr);
        if (!ok) {
            if (why)
                snprintf(why, whylen, "segment %zu at %#llx: empty, unsorted or overlapping", i,
                         (unsigned long long)s->addr);
            return MT_EPROTO;
        }
        bytes += s->size;
        unc += s->uncertain ? s->size : 0;
    }
    if (bytes != m->bytes || unc != m->unc) {
        if (why)
            snprintf(why, whylen, "segment byte sums differ from the segments");
        return MT_EPROTO;
    }
    return 0;
}
