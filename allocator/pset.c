/* An ordered set for the warm-up planner (plan.h, mt__pset_t): a treap whose nodes live in
 * one growable array and link by index, so that a plan of a million items costs a few
 * reallocations rather than a million mallocs. Keys are pairs (k1, k2), compared k1
 * first; each node carries a value and the largest value of its subtree, which finds the
 * first node in key order whose value reaches a bound in O(log n).
 * Expected O(log n) per operation (random priorities; the recursion depth is the tree's). */
#include <stdlib.h>

#include "allocator/internal.h"

#define NIL 0u /* node 0 is never used: index 0 means "no node" */

static bool key_lt(const mt__pset_node_t *x, uint64_t k1, uint64_t k2)
{
    return x->k1 != k1 ? x->k1 < k1 : x->k2 < k2;
}

static void pull(mt__pset_t *t, uint32_t x)
{
    mt__pset_node_t *n = &t->v[x];
    uint64_t m = n->val;
    if (n->l != NIL && t->v[n->l].max > m)
        m = t->v[n->l].max;
    if (n->r != NIL && t->v[n->r].max > m)
        m = t->v[n->r].max;
    n->max = m;
}

/* Splits subtree x into keys < (k1, k2) (*lo) and keys >= it (*hi). */
static void split(mt__pset_t *t, uint32_t x, uint64_t k1, uint64_t k2, uint32_t *lo, uint32_t *hi)
{
    if (x == NIL) {
        *lo = *hi = NIL;
        return;
    }
    if (key_lt(&t->v[x], k1, k2)) {
        split(t, t->v[x].r, k1, k2, &t->v[x].r, hi);
        *lo = x;
    } else {
        split(t, t->v[x].l, k1, k2, lo, &t->v[x].l);
        *hi = x;
    }
    pull(t, x);
}

/* Joins a and b, every key of a below every key of b. */
static uint32_t join(mt__pset_t *t, uint32_t a, uint32_t b)
{
    if (a == NIL)
        return b;
    if (b == NIL)
        return a;
    if (t->v[a].pri > t->v[b].pri) {
        t->v[a].r = join(t, t->v[a].r, b);
        pull(t, a);
        return a;
    }
    t->v[b].l = join(t, a, t->v[b].l);
    pull(t, b);
    return b;
}

int mt__pset_init(mt__pset_t *t, size_t hint)
{
    *t = (mt__pset_t){.rng = 0x9E3779B9u};
    t->cap = hint < 16 ? 16 : hint + 1;
    t->v = malloc(t->cap * sizeof *t->v);
    return t->v != NULL ? 0 : MT_ENOMEM;
}

void mt__pset_fini(mt__pset_t *t)
{
    free(t->v);
    *t = (mt__pset_t){0};
}

int mt__pset_insert(mt__pset_t *t, uint64_t k1, uint64_t k2, uint64_t val)
{
    uint32_t x = t->free;
    if (x != NIL) {
        t->free = t->v[x].l;
    } else {
        if (t->used + 1 >= t->cap) {
            size_t cap = t->cap * 2;
            mt__pset_node_t *v = cap < UINT32_MAX ? realloc(t->v, cap * sizeof *v) : NULL;
            if (v == NULL)
                return MT_ENOMEM;
            t->v = v;
            t->cap = cap;
        }
        x = ++t->used; /* index 0 stays unused */
    }
    t->rng ^= t->rng << 13; /* xorshift32: priorities need no more */
    t->rng ^= t->rng >> 17;
    t->rng ^= t->rng << 5;
    t->v[x] = (mt__pset_node_t){.k1 = k1, .k2 = k2, .val = val, .max = val, .pri = t->rng};
    uint32_t lo, hi;
    split(t, t->root, k1, k2, &lo, &hi);
    t->root = join(t, join(t, lo, x), hi);
    t->n++;
    return 0;
}

/* Removes the lowest node of subtree x into *out; returns the subtree. */
static uint32_t pop_min(mt__pset_t *t, uint32_t x, uint32_t *out)
{
    if (t->v[x].l == NIL) {
        *out = x;
        return t->v[x].r;
    }
    t->v[x].l = pop_min(t, t->v[x].l, out);
    pull(t, x);
    return x;
}

bool mt__pset_erase(mt__pset_t *t, uint64_t k1, uint64_t k2)
{
    uint32_t lo, hi, x = NIL;
    split(t, t->root, k1, k2, &lo, &hi);
    if (hi != NIL) {
        hi = pop_min(t, hi, &x);
        if (t->v[x].k1 != k1 || t->v[x].k2 != k2) { /* not there: put it back */
            uint32_t l2, h2;
            split(t, hi, t->v[x].k1, t->v[x].k2, &l2, &h2);
            t->v[x].l = t->v[x].r = NIL;
            pull(t, x);
            hi = join(t, join(t, l2, x), h2);
            x = NIL;
        }
    }
    t->root = join(t, lo, hi);
    if (x == NIL)
        return false;
    t->v[x].l = t->free;
    t->free = x;
    t->n--;
    return true;
}

const mt__pset_node_t *mt__pset_ceil(const mt__pset_t *t, uint64_t k1, uint64_t k2)
{
    uint32_t x = t->root, best = NIL;
    while (x != NIL) {
        if (key_lt(&t->v[x], k1, k2)) {
            x = t->v[x].r;
        } else {
            best = x;
            x = t->v[x].l;
        }
    }
    return best != NIL ? &t->v[best] : NULL;
}

const mt__pset_node_t *mt__pset_below(const mt__pset_t *t, uint64_t k1, uint64_t k2)
{
    uint32_t x = t->root, best = NIL;
    while (x != NIL) {
        if (key_lt(&t->v[x], k1, k2)) {
            best = x;
            x = t->v[x].r;
        } else {
            x = t->v[x].l;
        }
    }
    return best != NIL ? &t->v[best] : NULL;
}

const mt__pset_node_t *mt__pset_first_val(const mt__pset_t *t, uint64_t bound)
{
    uint32_t x = t->root;
    if (x == NIL || t->v[x].max < bound)
        return NULL;
    for (;;) {
        const mt__pset_node_t *n = &t->v[x];
        if (n->l != NIL && t->v[n->l].max >= bound)
            x = n->l;
        else if (n->val >= bound)
            return n;
        else
            x = n->r; /* the subtree's max reaches bound, and not on the left nor here */
    }
}
