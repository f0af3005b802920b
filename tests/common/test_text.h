/* Counting in the text a test received. memmem with explicit lengths: a loop of strstr
 * calls is quadratic under AddressSanitizer, whose strstr measures the whole rest of the
 * haystack at every call (minutes on a log of a few MB). */
#ifndef MT_TESTS_COMMON_TEST_TEXT_H
#define MT_TESTS_COMMON_TEST_TEXT_H

#include <stddef.h>
#include <string.h>

/* The occurrences of needle (non-empty) in hay[0..len), overlapping ones included. */
static inline size_t mt_test_count_n(const char *hay, size_t len, const char *needle)
{
    size_t n = 0, k = strlen(needle);
    const char *end = hay + len;
    for (const char *p = hay; (p = memmem(p, (size_t)(end - p), needle, k)) != NULL; p++)
        n++;
    return n;
}

/* The same in the string hay. */
static inline size_t mt_test_count(const char *hay, const char *needle)
{
    return mt_test_count_n(hay, strlen(hay), needle);
}

#endif
