/* Growing arrays: the one doubling policy of the project's append-only arrays. */
#ifndef MT_UTIL_GROW_H
#define MT_UTIL_GROW_H

#include <stddef.h>

/* Makes room in arr (entries of elem bytes, *cap of them allocated) for need entries: the
 * capacity doubles from first (> 0) until it holds need. Returns the array, moved or not,
 * and sets *cap; or NULL, with arr and *cap unchanged, when realloc fails or the size
 * would overflow size_t. need <= *cap returns arr at once; need 0 counts as 1, so that an
 * array still NULL is allocated and NULL is only ever a failure. */
void *mt__grow(void *arr, size_t *cap, size_t need, size_t elem, size_t first);

#endif
