/* An address table: non-zero 64-bit addresses to 64-bit values (an index, a pointer), open
 * addressing with linear probing and backward-shift deletion (no tombstones). The one
 * address-to-block table below the layers that follow blocks by address. */
#ifndef MT_UTIL_ADDRMAP_H
#define MT_UTIL_ADDRMAP_H

#include <stddef.h>
#include <stdint.h>

/* Invariants (mt__amap_check): cap = 0 or a power of two >= 16; n = #slots with key != 0;
 * n * 2 <= cap (an empty slot ends every probe); each key appears once, and no empty slot
 * lies between its home slot and its slot (cyclically). A zeroed table is empty. */
typedef struct mt__amap_s {
    uint64_t *keys; /* cap slots; 0 = empty */
    uint64_t *vals; /* cap slots; vals[i] belongs to keys[i] */
    size_t cap, n;  /* slots; keys held */
} mt__amap_t;

void mt__amap_fini(mt__amap_t *m);
/* Maps key (!= 0) to val, replacing what key had. 0, MT_EINVAL (key 0) or MT_ENOMEM (the
 * table unchanged). */
int mt__amap_put(mt__amap_t *m, uint64_t key, uint64_t val);
/* *val = key's value: 0, or MT_ENOENT (*val untouched). */
int mt__amap_get(const mt__amap_t *m, uint64_t key, uint64_t *val);
/* Removes key: 0, or MT_ENOENT. */
int mt__amap_del(mt__amap_t *m, uint64_t key);
/* Walks the invariants: 0, or MT_EPROTO with the first violation in why (may be NULL). */
int mt__amap_check(const mt__amap_t *m, char *why, size_t whylen);

#endif
