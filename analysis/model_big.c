/* The uncertain items of one kind as a max-heap by size (mt__mbig_t): after a gap, the
 * blocks (model_stale.c) and the segments (model_segs.c) larger than the room the totals
 * leave for them are gone, and the model finds those from the largest down. One heap serves
 * both; what tells the kinds apart (which record is still current, where the items are) is
 * the kind's mt__mbig_kind_t.
 *
 * Records are added when an item becomes uncertain (or takes a new extent while uncertain)
 * and never looked for: those of items since gone, settled or cut stay in, and are dropped
 * when they reach the top, or all at once when they outnumber the rest (the heap made anew
 * from the items, also after a record could not be added). */
#include "analysis/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "util/assert.h"
#include "util/grow.h"

static bool below(mt__range_t a, mt__range_t b)
{
    return a.size < b.size || (a.size == b.size && a.addr < b.addr);
}

static void down(mt__range_t *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < n && below(h[m], h[l]))
            m = l;
        if (l + 1 < n && below(h[m], h[l + 1]))
            m = l + 1;
        if (m == i)
            return;
        mt__range_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static mt__range_t pop(mt__mbig_t *b)
{
    mt__range_t top = b->h[0];
    b->h[0] = b->h[--b->n];
    down(b->h, b->n, 0);
    return top;
}

/* Whether the records no longer current may outnumber the rest: a rebuild then costs no
 * more than the records added or the items gone since the one before. */
static bool mostly_garbage(const mt__mclass_t *c, const mt__mbig_t *b, const mt__mbig_kind_t *k)
{
    return b->n > 2 * k->bound(c) + 64;
}

/* b made anew from the items (lost set when there is no memory for it). */
static void rebuild(mt__mclass_t *c, mt__mbig_t *b, const mt__mbig_kind_t *k)
{
    size_t cap = k->bound(c) + 16;
    mt__range_t *h = b->cap >= cap ? b->h : malloc(cap * sizeof(*h));
    if (h == NULL) {
        b->lost = true;
        return;
    }
    size_t n = k->fill(c, h);
    mt_assert(n <= cap);
    if (h != b->h) {
        free(b->h);
        b->h = h;
        b->cap = cap;
    }
    b->n = n;
    for (size_t i = n / 2; i-- > 0;)
        down(h, n, i);
    b->lost = false;
}

void mt__model_big_push(mt__mclass_t *c, mt__mbig_t *b, const mt__mbig_kind_t *k, mt__range_t r)
{
    if (b->lost)
        return;
    if (b->n == b->cap) {
        if (mostly_garbage(c, b, k)) {
            rebuild(c, b, k);
            if (b->lost || k->current(c, r))
                return; /* (the rebuild took it in) */
        }
        mt__range_t *h = b->n == b->cap ? mt__grow(b->h, &b->cap, b->n + 1, sizeof(*h), 64) : b->h;
        if (h == NULL) {
            b->lost = true;
            return;
        }
        b->h = h;
    }
    size_t i = b->n++;
    for (; i > 0 && below(b->h[(i - 1) / 2], r); i = (i - 1) / 2)
        b->h[i] = b->h[(i - 1) / 2];
    b->h[i] = r;
}

int mt__model_big_take(mt__mclass_t *c, mt__mbig_t *b, const mt__mbig_kind_t *k, mt__u128 room,
                       mt__range_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (b->lost || mostly_garbage(c, b, k))
        rebuild(c, b, k);
    if (b->lost)
        return MT_ENOMEM;
    mt__range_t *v = NULL;
    size_t nv = 0, cap = 0;
    while (b->n > 0) {
        mt__range_t top = b->h[0];
        if (!k->current(c, top)) {
            pop(b);
            continue;
        }
        if ((mt__u128)top.size <= room)
            break;
        mt__range_t *nvv = nv == cap ? mt__grow(v, &cap, nv + 1, sizeof(*v), 16) : v;
        if (nvv == NULL)
            goto fail;
        v = nvv;
        v[nv++] = pop(b);
    }
    /* By address, as the walks this replaced took them (two records of one item: side by
     * side). */
    if (nv > 1) {
        mt__range_t *tmp = malloc(nv * sizeof(*tmp));
        if (tmp == NULL)
            goto fail;
        mt__model_sort_ranges(v, nv, tmp);
        free(tmp);
    }
    *out = v;
    *n = nv;
    return 0;
fail:
    free(v);
    return MT_ENOMEM;
}

/* Whether the sorted v[0..n) holds r. */
static bool holds(const mt__range_t *v, size_t n, mt__range_t r)
{
    size_t lo = 0, hi = n; /* the first record at r.addr or above */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v[mid].addr < r.addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (; lo < n && v[lo].addr == r.addr; lo++)
        if (v[lo].size == r.size)
            return true;
    return false;
}

int mt__model_big_check(const mt__mclass_t *c, const mt__mbig_t *b, const mt__mbig_kind_t *k,
                        char *why, size_t whylen)
{
    MT__MCHECK(b->n <= b->cap, "a heap of the largest: %zu records in room for %zu", b->n, b->cap);
    if (b->lost)
        return 0;
    for (size_t i = 1; i < b->n; i++)
        MT__MCHECK(!below(b->h[(i - 1) / 2], b->h[i]),
                   "a heap of the largest is not a heap by size at %zu", i);
    /* every current item held: against a sorted copy (skipped without memory for it) */
    mt__range_t *v = malloc((2 * b->n + 1) * sizeof(*v));
    mt__range_t *cur = malloc((k->bound(c) + 1) * sizeof(*cur));
    const mt__range_t *bad = NULL;
    if (v == NULL || cur == NULL)
        goto done;
    if (b->n > 0) /* (h may be NULL) */
        memcpy(v, b->h, b->n * sizeof(*v));
    mt__model_sort_ranges(v, b->n, v + b->n);
    size_t nc = k->fill(c, cur);
    for (size_t i = 0; i < nc && bad == NULL; i++)
        if (!k->current(c, cur[i]) || !holds(v, b->n, cur[i]))
            bad = &cur[i];
    if (bad != NULL && why != NULL && whylen > 0)
        snprintf(why, whylen, "the uncertain item %#llx+%llu has no record in its heap",
                 (unsigned long long)bad->addr, (unsigned long long)bad->size);
done:
    free(cur);
    free(v);
    return bad != NULL ? MT_EPROTO : 0;
}

void mt__model_big_fini(mt__mbig_t *b)
{
    free(b->h);
    *b = (mt__mbig_t){0};
}
