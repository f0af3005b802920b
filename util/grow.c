/* Growing arrays (util/grow.h). */
#include "util/grow.h"

#include <stdint.h>
#include <stdlib.h>

void *mt__grow(void *arr, size_t *cap, size_t need, size_t elem, size_t first)
{
    if (need == 0)
        need = 1; /* so that NULL always means failure, even for an array still empty */
    if (need <= *cap)
        return arr;
    size_t n = *cap ? *cap : first ? first : 1;
    while (n < need) {
        if (n > SIZE_MAX / 2)
            return NULL;
        n *= 2;
    }
    if (elem != 0 && n > SIZE_MAX / elem)
        return NULL;
    void *p = realloc(arr, n * elem);
    if (p == NULL)
        return NULL;
    *cap = n;
    return p;
}
