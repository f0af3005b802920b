/* The address table (util/addrmap.h). */
#include "util/addrmap.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "memtrace/common.h"
#include "util/assert.h"

#define AMAP_FIRST 16 /* slots of a table's first allocation */

static size_t home(uint64_t k, size_t cap)
{
    k ^= k >> 33;
    k *= UINT64_C(0xff51afd7ed558ccd);
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

void mt__amap_fini(mt__amap_t *m)
{
    free(m->keys);
    free(m->vals);
    *m = (mt__amap_t){0};
}

/* The slot holding k, or the empty slot where its probe ends. */
static size_t probe(const mt__amap_t *m, uint64_t k)
{
    size_t i = home(k, m->cap);
    while (m->keys[i] != 0 && m->keys[i] != k)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static int grow(mt__amap_t *m)
{
    size_t cap = m->cap ? m->cap * 2 : AMAP_FIRST;
    mt__amap_t t = {calloc(cap, sizeof *t.keys), calloc(cap, sizeof *t.vals), cap, m->n};
    if (t.keys == NULL || t.vals == NULL || cap < m->cap) {
        free(t.keys);
        free(t.vals);
        return MT_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i] != 0) {
            size_t j = probe(&t, m->keys[i]);
            t.keys[j] = m->keys[i];
            t.vals[j] = m->vals[i];
        }
    free(m->keys);
    free(m->vals);
    *m = t;
    mt_assert_expensive(mt__amap_check(m, NULL, 0) == 0);
    return 0;
}

int mt__amap_put(mt__amap_t *m, uint64_t key, uint64_t val)
{
    if (key == 0)
        return MT_EINVAL;
    if ((m->n + 1) * 2 > m->cap) {
        int rc = grow(m);
        if (rc != 0)
            return rc;
    }
    size_t i = probe(m, key);
    m->n += m->keys[i] == 0;
    m->keys[i] = key;
    m->vals[i] = val;
    mt_assert(m->n * 2 <= m->cap);
    return 0;
}

int mt__amap_get(const mt__amap_t *m, uint64_t key, uint64_t *val)
{
    if (key == 0 || m->cap == 0)
        return MT_ENOENT;
    size_t i = probe(m, key);
    if (m->keys[i] == 0)
        return MT_ENOENT;
    *val = m->vals[i];
    return 0;
}

int mt__amap_del(mt__amap_t *m, uint64_t key)
{
    if (key == 0 || m->cap == 0)
        return MT_ENOENT;
    size_t mask = m->cap - 1, i = probe(m, key);
    if (m->keys[i] == 0)
        return MT_ENOENT;
    /* Backward shift: a later key of the probe moves into the hole unless its home lies
     * cyclically in (hole, its slot], so every probe still reaches its key. */
    for (size_t j = i;;) {
        j = (j + 1) & mask;
        if (m->keys[j] == 0)
            break;
        size_t h = home(m->keys[j], m->cap);
        bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (!stays) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->keys[i] = 0;
    m->vals[i] = 0;
    m->n--;
    return 0;
}

int mt__amap_check(const mt__amap_t *m, char *why, size_t whylen)
{
    size_t n = 0;
    const char *bad = NULL;
    if (m->cap != 0 && (m->cap < AMAP_FIRST || (m->cap & (m->cap - 1)) != 0))
        bad = "capacity not a power of two >= 16";
    for (size_t i = 0; bad == NULL && i < m->cap; i++) {
        if (m->keys[i] == 0)
            continue;
        n++;
        /* The probe from its home reaches slot i before any empty slot or another copy. */
        if (probe(m, m->keys[i]) != i)
            bad = "a key its probe does not reach, or held twice";
    }
    if (bad == NULL && n != m->n)
        bad = "n differs from the keys held";
    if (bad == NULL && m->n * 2 > m->cap && m->cap != 0)
        bad = "more than half full";
    if (bad == NULL)
        return 0;
    if (why)
        snprintf(why, whylen, "address table: %s", bad);
    return MT_EPROTO;
}
