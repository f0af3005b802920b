/* The failure path of mt_assert (util/assert.h). */
#include <stdio.h>
#include <stdlib.h>

#include "util/assert.h"

_Noreturn void mt__assert_fail(const char *file, int line, const char *func, const char *expr,
                               const char *detail)
{
    fprintf(stderr, "%s:%d: %s: memtrace assertion failed: %s%s%s\n", file, line, func, expr,
            detail != NULL ? ": " : "", detail != NULL ? detail : "");
    fflush(stderr);
    abort();
}
