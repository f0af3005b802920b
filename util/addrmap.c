/* The address table (util/addrmap.h): what is not inline. */
#include "util/addrmap.h"

#include <stdio.h>
#include <stdlib.h>

#include "util/assert.h"

#define AMAP_FIRST 16 /* slots of a table's first allocation */
/* Past this many slots (16 MiB of keys and values) a table's room is at most a quarter's:
 * the sparser bounds buy fewer probes, not memory without end. */
#define AMAP_ROOMY_CAP ((size_t)1 << 20)

void mt__amap_fini(mt__amap_t *m)
{
    free(m->keys);
    free(m->vals);
    *m = (mt__amap_t){.room = m->room};
}

int mt__amap_grow(mt__amap_t *m)
{
    size_t cap = m->cap ? m->cap * 2 : AMAP_FIRST;
    mt__amap_t t = {calloc(cap, sizeof *t.keys),
                    calloc(cap, sizeof *t.vals),
                    cap,
                    m->n,
                    (unsigned)__builtin_clzll((unsigned long long)cap) + 1,
                    cap > AMAP_ROOMY_CAP && m->room > 1 ? 1u : m->room};
    if (t.keys == NULL || t.vals == NULL || cap < m->cap) {
        free(t.keys);
        free(t.vals);
        return MT_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i] != 0) {
            size_t j = mt__amap_slot(&t, m->keys[i]);
            t.keys[j] = m->keys[i];
            t.vals[j] = m->vals[i];
        }
    free(m->keys);
    free(m->vals);
    *m = t;
    mt_assert_expensive(mt__amap_check(m, NULL, 0) == 0);
    return 0;
}

int mt__amap_check(const mt__amap_t *m, char *why, size_t whylen)
{
    size_t n = 0;
    const char *bad = NULL;
    if (m->cap == 0 && (m->n != 0 || m->keys != NULL || m->vals != NULL || m->shift != 0))
        bad = "empty but not zeroed";
    else if (m->cap != 0 && (m->cap < AMAP_FIRST || (m->cap & (m->cap - 1)) != 0 ||
                             m->shift != (unsigned)__builtin_clzll((unsigned long long)m->cap) + 1))
        bad = "capacity not a power of two >= 16, or shift not its log";
    for (size_t i = 0; bad == NULL && i < m->cap; i++) {
        if (m->keys[i] == 0)
            continue;
        n++;
        /* The probe from its home reaches slot i before any empty slot or another copy. */
        if (mt__amap_slot(m, m->keys[i]) != i)
            bad = "a key its probe does not reach, or held twice";
    }
    if (bad == NULL && n != m->n)
        bad = "n differs from the keys held";
    if (bad == NULL && m->room > 3)
        bad = "room beyond a sixteenth";
    if (bad == NULL && (m->n << (1 + m->room)) > m->cap && m->cap != 0)
        bad = "fuller than its room allows";
    if (bad == NULL)
        return 0;
    if (why)
        snprintf(why, whylen, "address table: %s", bad);
    return MT_EPROTO;
}
