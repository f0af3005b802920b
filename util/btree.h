/* An ordered map of fixed-size records by a 64-bit key, the first 8 bytes of each record: a
 * B+ tree whose leaves are sorted arrays linked in key order. Insert, erase and search are
 * O(log n), a step of a cursor O(1); memory is about 1.5 times the records'. The ordered
 * tables of the readers that change in the middle (the segment map, memory_viz's segments in
 * the snapshot export, the model's free extents) are these: a sorted array with a memmove
 * per change was quadratic on logs of many segments.
 *
 * A cursor names one record, or the end. Any insert or erase invalidates every cursor but
 * the one it returns; a record may be changed through mt__bt_get, its key only through
 * mt__bt_rekey. */
#ifndef MT_UTIL_BTREE_H
#define MT_UTIL_BTREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MT__BT_LEAF_BYTES 512 /* a leaf's records: LEAF_BYTES / rsize of them */
#define MT__BT_FANOUT     32  /* children of an inner node, at most */

/* A leaf: its records in ascending keys. Here for the inline steps below (a walk of every
 * segment at each gap is on the model's path); change it through the calls only. */
typedef struct mt__bt_leaf_s mt__bt_leaf_t;
struct mt__bt_leaf_s {
    mt__bt_leaf_t *prev, *next; /* neighbours in key order; NULL at the ends */
    uint32_t n;                 /* records, 1..lcap (0 only while being removed) */
    uint32_t rsize;             /* bytes per record, the tree's */
    uint64_t rec[];             /* lcap records of rsize bytes */
};

/* Invariants (mt__bt_check): every leaf is height inner levels below root, holds 1..lcap
 * records in strictly ascending keys, and the leaves linked from head by next (back by prev
 * from tail) are the tree's in key order; an inner node has 1..MT__BT_FANOUT children, and
 * its key[i] (i >= 1) is above every key under child[i - 1] and at most every key under
 * child[i]; n = records; root = NULL iff n = 0. A tree whose rsize is 0 (zeroed) is empty
 * and takes its record size at mt__bt_init. */
typedef struct mt__bt_s {
    void *root;                 /* a leaf when height = 0, else an inner node; NULL: empty */
    mt__bt_leaf_t *head, *tail; /* first and last leaf */
    size_t n;                   /* records */
    uint32_t height;            /* inner levels above the leaves */
    uint32_t rsize;             /* bytes per record, a multiple of 8, 8..MT__BT_LEAF_BYTES / 4 */
    uint32_t lcap;              /* records per leaf, MT__BT_LEAF_BYTES / rsize */
} mt__bt_t;

/* A position: record i of leaf, or the end (leaf NULL). */
typedef struct mt__bt_cur_s {
    mt__bt_leaf_t *leaf;
    uint32_t i;
} mt__bt_cur_t;

/* An empty tree of records of rsize bytes (a multiple of 8, at most MT__BT_LEAF_BYTES / 4). */
void mt__bt_init(mt__bt_t *t, size_t rsize);
/* Frees every node; the tree is then empty, with its record size. */
void mt__bt_fini(mt__bt_t *t);
/* Adds a copy of rec, whose key none holds. 0 (*at, if not NULL, names it), MT_EINVAL (the
 * key is held) or MT_ENOMEM; on failure the tree is unchanged. */
int mt__bt_insert(mt__bt_t *t, const void *rec, mt__bt_cur_t *at);
/* Sets the key of the record c names to key, which lies strictly between the keys of the
 * records before and after it (the order stays): no allocation, no cursor invalidated. */
void mt__bt_rekey(mt__bt_t *t, mt__bt_cur_t c, uint64_t key);
/* Removes the record c names (not the end); returns the position of the one after it. */
mt__bt_cur_t mt__bt_erase(mt__bt_t *t, mt__bt_cur_t c);
/* The first record whose key is >= key, or the end. */
mt__bt_cur_t mt__bt_lower(const mt__bt_t *t, uint64_t key);
/* The last record whose key is <= key, or the end. */
mt__bt_cur_t mt__bt_floor(const mt__bt_t *t, uint64_t key);
/* The first (last) record, or the end when empty. */
mt__bt_cur_t mt__bt_first(const mt__bt_t *t);
mt__bt_cur_t mt__bt_last(const mt__bt_t *t);
/* Steps to the previous record; from the first one to the end, from the end to the last. */
void mt__bt_prev(const mt__bt_t *t, mt__bt_cur_t *c);
/* Walks the invariants: 0, or MT_EPROTO with the first violation in why (may be NULL). */
int mt__bt_check(const mt__bt_t *t, char *why, size_t whylen);

static inline bool mt__bt_end(mt__bt_cur_t c)
{
    return c.leaf == NULL;
}

/* Steps to the next record; from the last one to the end (which stays there). */
static inline void mt__bt_next(mt__bt_cur_t *c)
{
    if (c->leaf != NULL && ++c->i == c->leaf->n)
        *c = (mt__bt_cur_t){c->leaf->next, 0};
}

/* The record c names (borrowed until the next insert or erase), or NULL at the end. */
static inline void *mt__bt_get(mt__bt_cur_t c)
{
    return c.leaf != NULL ? (char *)c.leaf->rec + (size_t)c.i * c.leaf->rsize : NULL;
}

/* A record's key. */
static inline uint64_t mt__bt_key(const void *rec)
{
    return *(const uint64_t *)rec;
}

#endif
