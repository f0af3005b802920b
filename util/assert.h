/* Debug assertions of the library's own invariants.
 *
 *   mt_assert(cond)           cheap (a compare or two); on in debug and debugoptimized builds
 *   mt_assert_expensive(cond) a walk (e.g. a whole-structure checker); on only with
 *                             -Dassert_level=expensive (the ASan test build)
 *
 * Both are compiled out of release builds (MT_ASSERT_LEVEL 0, set by meson from b_ndebug
 * and the assert_level option, see mt_config.h); the condition is then not evaluated.
 *
 * A failed assertion is a bug in memtrace, never bad input: it prints
 * "file:line: function: assertion failed: expr" (and a detail, if given) to stderr and
 * aborts. This is the one place the library writes to a terminal: continuing past a broken
 * invariant would corrupt the caller's memory accounting or device memory. Input from
 * outside the process (rings, files, sockets) is validated and refused, never asserted. */
#ifndef MT_UTIL_ASSERT_H
#define MT_UTIL_ASSERT_H

#include <pthread.h>
#include <stdint.h>

#include "mt_config.h"

#ifndef MT_ASSERT_LEVEL
#error "mt_config.h defines MT_ASSERT_LEVEL"
#endif

/* Prints the failure (detail may be NULL) and aborts. */
_Noreturn void mt__assert_fail(const char *file, int line, const char *func, const char *expr,
                               const char *detail);

/* A non-zero number naming the calling thread (for lock-owner assertions). pthread_self
 * reads the thread pointer; a _Thread_local in this position-independent library would
 * cost a __tls_get_addr call per lock and per assertion. */
static inline uintptr_t mt__thread_id(void)
{
    return (uintptr_t)pthread_self();
}

#define MT__ASSERT_ON(cond)                                                                        \
    (__builtin_expect(!!(cond), 1) ? (void)0                                                       \
                                   : mt__assert_fail(__FILE__, __LINE__, __func__, #cond, NULL))
/* Not evaluated, but still type-checked, so that a variable used only in assertions
 * stays "used" in release builds. */
#define MT__ASSERT_OFF(cond) ((void)sizeof(!(cond)))

#if MT_ASSERT_LEVEL >= 1
#define mt_assert(cond) MT__ASSERT_ON(cond)
#else
#define mt_assert(cond) MT__ASSERT_OFF(cond)
#endif

#if MT_ASSERT_LEVEL >= 2
#define mt_assert_expensive(cond) MT__ASSERT_ON(cond)
/* why: a checker's description of the first violation, NULL when there is none. */
#define mt_assert_valid(why)                                                                       \
    do {                                                                                           \
        const char *mt__why = (why);                                                               \
        if (mt__why != NULL)                                                                       \
            mt__assert_fail(__FILE__, __LINE__, __func__, #why, mt__why);                          \
    } while (0)
#else
#define mt_assert_expensive(cond) MT__ASSERT_OFF(cond)
#define mt_assert_valid(why)      MT__ASSERT_OFF(why)
#endif

#endif
