/* The ordered map of fixed-size records (util/btree.h): a B+ tree. Inserts split a full
 * node in two halves; an erase that leaves a node under a quarter full merges it with a
 * sibling when the two fit in three quarters of one (so a merge is not undone by the next
 * insert), and an empty node goes. The path from the root is found again by the key on
 * each change, so nodes keep no parent pointers. */
#include "util/btree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "util/assert.h"

/* key[0] is not used: child[0] holds the keys below key[1]. */
typedef struct inner_s {
    uint32_t n; /* children, 1..MT__BT_FANOUT */
    uint64_t key[MT__BT_FANOUT];
    void *child[MT__BT_FANOUT];
} inner_t;

/* 32^16 leaves: more than any address space holds. */
#define MAX_HEIGHT 16

/* The inner nodes from the root down to a leaf, and the child taken at each. */
typedef struct path_s {
    inner_t *node[MAX_HEIGHT];
    uint32_t idx[MAX_HEIGHT];
} path_t;

static inline char *rec_at(const mt__bt_leaf_t *l, uint32_t i)
{
    return (char *)l->rec + (size_t)i * l->rsize;
}

static inline uint64_t key_at(const mt__bt_leaf_t *l, uint32_t i)
{
    return mt__bt_key(rec_at(l, i));
}

void mt__bt_init(mt__bt_t *t, size_t rsize)
{
    mt_assert(rsize >= 8 && rsize % 8 == 0 && rsize <= MT__BT_LEAF_BYTES / 4);
    *t = (mt__bt_t){.rsize = (uint32_t)rsize, .lcap = (uint32_t)(MT__BT_LEAF_BYTES / rsize)};
}

static void free_node(void *x, uint32_t height)
{
    if (height > 0) {
        inner_t *in = x;
        for (uint32_t i = 0; i < in->n; i++)
            free_node(in->child[i], height - 1);
    }
    free(x);
}

void mt__bt_fini(mt__bt_t *t)
{
    if (t->root != NULL)
        free_node(t->root, t->height);
    *t = (mt__bt_t){.rsize = t->rsize, .lcap = t->lcap};
}

static mt__bt_leaf_t *leaf_new(const mt__bt_t *t)
{
    mt__bt_leaf_t *l = malloc(sizeof(*l) + (size_t)t->lcap * t->rsize);
    if (l != NULL)
        *l = (mt__bt_leaf_t){.rsize = t->rsize};
    return l;
}

/* ---- search ---- */

/* The child of x under which key lies: the last i with key[i] <= key, else 0. */
static uint32_t child_for(const inner_t *x, uint64_t key)
{
    uint32_t lo = 1, hi = x->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (x->key[mid] <= key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo - 1;
}

/* The first index of l whose key is >= key (l->n when none). */
static uint32_t leaf_lower(const mt__bt_leaf_t *l, uint64_t key)
{
    uint32_t lo = 0, hi = l->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (key_at(l, mid) < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The leaf key belongs in (root not NULL), the way down in p when p is not NULL. */
static mt__bt_leaf_t *descend(const mt__bt_t *t, uint64_t key, path_t *p)
{
    void *x = t->root;
    for (uint32_t h = 0; h < t->height; h++) {
        inner_t *in = x;
        uint32_t i = child_for(in, key);
        if (p != NULL) {
            p->node[h] = in;
            p->idx[h] = i;
        }
        x = in->child[i];
    }
    return x;
}

mt__bt_cur_t mt__bt_lower(const mt__bt_t *t, uint64_t key)
{
    if (t->root == NULL)
        return (mt__bt_cur_t){0};
    mt__bt_leaf_t *l = descend(t, key, NULL);
    uint32_t i = leaf_lower(l, key);
    /* Every key of the leaves before l is below key: the answer is here or next. */
    if (i == l->n)
        return (mt__bt_cur_t){l->next, 0};
    return (mt__bt_cur_t){l, i};
}

mt__bt_cur_t mt__bt_floor(const mt__bt_t *t, uint64_t key)
{
    mt__bt_cur_t c = mt__bt_lower(t, key);
    if (c.leaf != NULL && key_at(c.leaf, c.i) == key)
        return c;
    mt__bt_prev(t, &c);
    return c;
}

mt__bt_cur_t mt__bt_first(const mt__bt_t *t)
{
    return (mt__bt_cur_t){t->head, 0};
}

mt__bt_cur_t mt__bt_last(const mt__bt_t *t)
{
    return t->tail != NULL ? (mt__bt_cur_t){t->tail, t->tail->n - 1} : (mt__bt_cur_t){0};
}

void mt__bt_prev(const mt__bt_t *t, mt__bt_cur_t *c)
{
    if (c->leaf == NULL)
        *c = mt__bt_last(t);
    else if (c->i > 0)
        c->i--;
    else if (c->leaf->prev != NULL)
        *c = (mt__bt_cur_t){c->leaf->prev, c->leaf->prev->n - 1};
    else
        *c = (mt__bt_cur_t){0};
}

/* ---- insert ---- */

/* Puts (key, child) at position pos of x, which has room. */
static void inner_put(inner_t *x, uint32_t pos, uint64_t key, void *child)
{
    memmove(&x->key[pos + 1], &x->key[pos], (x->n - pos) * sizeof(x->key[0]));
    memmove(&x->child[pos + 1], &x->child[pos], (x->n - pos) * sizeof(x->child[0]));
    x->key[pos] = key;
    x->child[pos] = child;
    x->n++;
}

/* Splits the full x with (key, child) added at pos: x keeps the first half, r (new, empty)
 * takes the rest; returns the key that separates them. */
static uint64_t inner_split(inner_t *x, inner_t *r, uint32_t pos, uint64_t key, void *child)
{
    uint64_t k[MT__BT_FANOUT + 1];
    void *c[MT__BT_FANOUT + 1];
    memcpy(k, x->key, pos * sizeof(k[0]));
    memcpy(c, x->child, pos * sizeof(c[0]));
    k[pos] = key;
    c[pos] = child;
    memcpy(&k[pos + 1], &x->key[pos], (x->n - pos) * sizeof(k[0]));
    memcpy(&c[pos + 1], &x->child[pos], (x->n - pos) * sizeof(c[0]));
    /* new children at one end, as in order keys add them, leave full nodes behind */
    uint32_t all = x->n + 1, keep = pos == x->n ? x->n : pos == 1 ? 2 : all / 2;
    x->n = keep;
    memcpy(x->key, k, keep * sizeof(k[0]));
    memcpy(x->child, c, keep * sizeof(c[0]));
    r->n = all - keep;
    memcpy(r->key, &k[keep], r->n * sizeof(k[0]));
    memcpy(r->child, &c[keep], r->n * sizeof(c[0]));
    return k[keep];
}

/* Inserts rec at i of the full leaf l (reached by p): splits l and the full nodes above it.
 * Every node the split needs is allocated first, so that a failure changes nothing. */
static int insert_split(mt__bt_t *t, path_t *p, mt__bt_leaf_t *l, uint32_t i, const void *rec,
                        mt__bt_cur_t *at)
{
    uint32_t splits = 0; /* inner nodes that split: the full ones right above the leaf */
    while (splits < t->height && p->node[t->height - 1 - splits]->n == MT__BT_FANOUT)
        splits++;
    bool new_root = splits == t->height;
    if (new_root && t->height + 1 >= MAX_HEIGHT)
        return MT_ENOMEM;
    mt__bt_leaf_t *r = leaf_new(t);
    inner_t *fresh[MAX_HEIGHT + 1] = {0};
    bool ok = r != NULL;
    for (uint32_t s = 0; ok && s < splits + new_root; s++)
        ok = (fresh[s] = calloc(1, sizeof(inner_t))) != NULL;
    if (!ok) {
        free(r);
        for (uint32_t s = 0; s < splits + new_root; s++)
            free(fresh[s]);
        return MT_ENOMEM;
    }
    /* The leaf: its upper half to r, then rec into the half it belongs to. Keys that come
     * in order (a run mapped page by page, upwards or downwards) split off the new record
     * alone at the tree's end, so that the leaves they fill stay full. */
    uint32_t half = t->lcap / 2, rs = t->rsize;
    if (i == l->n && l->next == NULL)
        half = l->n;
    else if (i == 0 && l->prev == NULL)
        half = 0;
    r->n = l->n - half;
    memcpy(rec_at(r, 0), rec_at(l, half), (size_t)r->n * rs);
    l->n = half;
    bool left = i < half || half == 0;
    mt__bt_leaf_t *into = left ? l : r;
    uint32_t j = left ? i : i - half;
    memmove(rec_at(into, j + 1), rec_at(into, j), (size_t)(into->n - j) * rs);
    memcpy(rec_at(into, j), rec, rs);
    into->n++;
    r->prev = l;
    r->next = l->next;
    if (l->next != NULL)
        l->next->prev = r;
    else
        t->tail = r;
    l->next = r;
    t->n++;
    if (at != NULL)
        *at = (mt__bt_cur_t){into, j};
    /* the separators up the path */
    uint64_t key = key_at(r, 0);
    void *child = r;
    uint32_t used = 0;
    for (uint32_t h = t->height; h-- > 0;) {
        inner_t *x = p->node[h];
        uint32_t pos = p->idx[h] + 1;
        if (x->n < MT__BT_FANOUT) {
            inner_put(x, pos, key, child);
            return 0;
        }
        inner_t *right = fresh[used++];
        key = inner_split(x, right, pos, key, child);
        child = right;
    }
    inner_t *root = fresh[used];
    root->n = 2;
    root->child[0] = t->root;
    root->key[1] = key;
    root->child[1] = child;
    t->root = root;
    t->height++;
    return 0;
}

int mt__bt_insert(mt__bt_t *t, const void *rec, mt__bt_cur_t *at)
{
    mt_assert(t->rsize != 0);
    uint64_t key = mt__bt_key(rec);
    if (t->root == NULL) {
        mt__bt_leaf_t *l = leaf_new(t);
        if (l == NULL)
            return MT_ENOMEM;
        memcpy(rec_at(l, 0), rec, t->rsize);
        l->n = 1;
        t->root = t->head = t->tail = l;
        t->height = 0;
        t->n = 1;
        if (at != NULL)
            *at = (mt__bt_cur_t){l, 0};
        return 0;
    }
    path_t p;
    mt__bt_leaf_t *l = descend(t, key, &p);
    uint32_t i = leaf_lower(l, key);
    if (i < l->n && key_at(l, i) == key)
        return MT_EINVAL;
    if (l->n == t->lcap)
        return insert_split(t, &p, l, i, rec, at);
    memmove(rec_at(l, i + 1), rec_at(l, i), (size_t)(l->n - i) * t->rsize);
    memcpy(rec_at(l, i), rec, t->rsize);
    l->n++;
    t->n++;
    if (at != NULL)
        *at = (mt__bt_cur_t){l, i};
    return 0;
}

void mt__bt_rekey(mt__bt_t *t, mt__bt_cur_t c, uint64_t key)
{
    uint64_t old = key_at(c.leaf, c.i);
    path_t p;
    mt__bt_leaf_t *l = descend(t, old, &p);
    mt_assert(l == c.leaf);
    mt_assert(c.i + 1 == l->n || key < key_at(l, c.i + 1));
    mt_assert(c.i == 0 || key > key_at(l, c.i - 1));
    memcpy(rec_at(l, c.i), &key, sizeof key);
    /* The nearest separator on the way down that bounds l from below (a first record
     * lowered) or from above (a last record raised): the record's neighbour across it is
     * on its other side, so the new key still fits between the two. */
    for (uint32_t h = t->height; h-- > 0;) {
        inner_t *x = p.node[h];
        uint32_t j = p.idx[h];
        if (key < old && c.i == 0 && j > 0) {
            if (key < x->key[j])
                x->key[j] = key;
            break;
        }
        if (key > old && c.i + 1 == l->n && j + 1 < x->n) {
            if (key >= x->key[j + 1])
                x->key[j + 1] = key + 1; /* <= the next record's key, which is above key */
            break;
        }
    }
}

/* ---- erase ---- */

static void leaf_unlink(mt__bt_t *t, mt__bt_leaf_t *l)
{
    if (l->prev != NULL)
        l->prev->next = l->next;
    else
        t->head = l->next;
    if (l->next != NULL)
        l->next->prev = l->prev;
    else
        t->tail = l->prev;
    free(l);
}

static void inner_merge_or_drop(mt__bt_t *t, path_t *p, uint32_t h);

/* Removes child p->idx[h] (already freed) of p->node[h] with its key, then mends the node. */
static void remove_child(mt__bt_t *t, path_t *p, uint32_t h)
{
    inner_t *x = p->node[h];
    uint32_t j = p->idx[h];
    memmove(&x->key[j], &x->key[j + 1], (x->n - j - 1) * sizeof(x->key[0]));
    memmove(&x->child[j], &x->child[j + 1], (x->n - j - 1) * sizeof(x->child[0]));
    x->n--;
    inner_merge_or_drop(t, p, h);
}

/* x = p->node[h] lost a child: an empty x goes, a root of one child gives way to it, an x
 * under a quarter full merges with a sibling when the two fit in three quarters of one. */
static void inner_merge_or_drop(mt__bt_t *t, path_t *p, uint32_t h)
{
    inner_t *x = p->node[h];
    if (h == 0) {
        while (t->height > 0 && ((inner_t *)t->root)->n <= 1) {
            inner_t *root = t->root;
            t->root = root->n == 1 ? root->child[0] : NULL;
            t->height = root->n == 1 ? t->height - 1 : 0;
            free(root);
        }
        return;
    }
    if (x->n == 0) {
        free(x);
        remove_child(t, p, h - 1);
        return;
    }
    if (x->n >= MT__BT_FANOUT / 4)
        return;
    inner_t *y = p->node[h - 1];
    uint32_t j = p->idx[h - 1];
    /* left takes right's children: right's separator in y separates them in left */
    inner_t *left = NULL, *right = NULL;
    if (j + 1 < y->n && x->n + ((inner_t *)y->child[j + 1])->n <= MT__BT_FANOUT * 3 / 4) {
        left = x;
        right = y->child[j + 1];
        p->idx[h - 1] = j + 1;
    } else if (j > 0 && ((inner_t *)y->child[j - 1])->n + x->n <= MT__BT_FANOUT * 3 / 4) {
        left = y->child[j - 1];
        right = x;
    } else {
        return;
    }
    left->key[left->n] = y->key[p->idx[h - 1]];
    memcpy(&left->key[left->n + 1], &right->key[1], (right->n - 1) * sizeof(right->key[0]));
    memcpy(&left->child[left->n], right->child, right->n * sizeof(right->child[0]));
    left->n += right->n;
    free(right);
    remove_child(t, p, h - 1);
}

mt__bt_cur_t mt__bt_erase(mt__bt_t *t, mt__bt_cur_t c)
{
    mt_assert(c.leaf != NULL && c.i < c.leaf->n);
    uint64_t key = key_at(c.leaf, c.i);
    path_t p;
    mt__bt_leaf_t *l = descend(t, key, &p);
    mt_assert(l == c.leaf);
    memmove(rec_at(l, c.i), rec_at(l, c.i + 1), (size_t)(l->n - c.i - 1) * t->rsize);
    l->n--;
    t->n--;
    uint32_t h = t->height;
    if (l->n == 0) {
        leaf_unlink(t, l);
        if (h == 0)
            t->root = NULL;
        else
            remove_child(t, &p, h - 1);
    } else if (l->n < t->lcap / 4 && h > 0) {
        inner_t *y = p.node[h - 1];
        uint32_t j = p.idx[h - 1];
        mt__bt_leaf_t *left = NULL, *right = NULL;
        if (j + 1 < y->n && l->n + ((mt__bt_leaf_t *)y->child[j + 1])->n <= t->lcap * 3 / 4) {
            left = l;
            right = y->child[j + 1];
            p.idx[h - 1] = j + 1;
        } else if (j > 0 && ((mt__bt_leaf_t *)y->child[j - 1])->n + l->n <= t->lcap * 3 / 4) {
            left = y->child[j - 1];
            right = l;
        }
        if (left != NULL) {
            memcpy(rec_at(left, left->n), rec_at(right, 0), (size_t)right->n * t->rsize);
            left->n += right->n;
            leaf_unlink(t, right);
            remove_child(t, &p, h - 1);
        }
    }
    return mt__bt_lower(t, key); /* the first key above the one erased */
}

/* ---- checker ---- */

typedef struct walk_s {
    const mt__bt_t *t;
    const mt__bt_leaf_t *last; /* the leaf before, in key order */
    size_t n;                  /* records seen */
    bool any;                  /* a key was seen; then prev is the last */
    uint64_t prev;
    char *why;
    size_t whylen;
} walk_t;

#define FAIL(w, ...)                                                                               \
    do {                                                                                           \
        if ((w)->why)                                                                              \
            snprintf((w)->why, (w)->whylen, __VA_ARGS__);                                          \
        return MT_EPROTO;                                                                          \
    } while (0)

/* Keys under x lie in [lo, hi) (has_hi: hi holds; else no upper bound). */
static int walk_node(walk_t *w, const void *x, uint32_t height, uint64_t lo, uint64_t hi,
                     bool has_hi)
{
    if (height == 0) {
        const mt__bt_leaf_t *l = x;
        if (l->n == 0 || l->n > w->t->lcap || l->rsize != w->t->rsize)
            FAIL(w, "btree: a leaf of %u records (at most %u)", l->n, w->t->lcap);
        if (l->prev != w->last || (w->last != NULL ? w->last->next != l : w->t->head != l))
            FAIL(w, "btree: the leaves' links differ from the tree's order");
        for (uint32_t i = 0; i < l->n; i++) {
            uint64_t k = key_at(l, i);
            if ((w->any && k <= w->prev) || k < lo || (has_hi && k >= hi))
                FAIL(w, "btree: key %#llx out of order or outside its node's range",
                     (unsigned long long)k);
            w->any = true;
            w->prev = k;
        }
        w->n += l->n;
        w->last = l;
        return 0;
    }
    const inner_t *in = x;
    if (in->n == 0 || in->n > MT__BT_FANOUT)
        FAIL(w, "btree: an inner node of %u children", in->n);
    for (uint32_t i = 0; i < in->n; i++) {
        uint64_t clo = i > 0 ? in->key[i] : lo;
        bool chas = i + 1 < in->n || has_hi;
        uint64_t chi = i + 1 < in->n ? in->key[i + 1] : hi;
        if (i > 0 && (in->key[i] < lo || (has_hi && in->key[i] >= hi) ||
                      (i + 1 < in->n && in->key[i] >= in->key[i + 1])))
            FAIL(w, "btree: separator %#llx out of order", (unsigned long long)in->key[i]);
        int rc = walk_node(w, in->child[i], height - 1, clo, chi, chas);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int mt__bt_check(const mt__bt_t *t, char *why, size_t whylen)
{
    walk_t w = {.t = t, .why = why, .whylen = whylen};
    if (t->root == NULL) {
        if (t->n != 0 || t->head != NULL || t->tail != NULL || t->height != 0)
            FAIL(&w, "btree: no root, %zu records", t->n);
        return 0;
    }
    if (t->height >= MAX_HEIGHT || t->rsize == 0 || t->lcap != MT__BT_LEAF_BYTES / t->rsize)
        FAIL(&w, "btree: height %u, record size %u, leaf capacity %u", t->height, t->rsize,
             t->lcap);
    int rc = walk_node(&w, t->root, t->height, 0, 0, false);
    if (rc != 0)
        return rc;
    if (w.last != t->tail || w.n != t->n)
        FAIL(&w, "btree: %zu records counted, %zu held, or the last leaf differs", w.n, t->n);
    return 0;
}
