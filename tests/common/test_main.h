/* The end of every CMocka test program: main returns MT_TEST_RUN(tests, setup, teardown)
 * instead of cmocka_run_group_tests(...) itself.
 *
 * A CMocka test that fails is left by longjmp, so what it had allocated and not yet freed
 * is unreachable. Under AddressSanitizer, LeakSanitizer's check at exit (an atexit handler)
 * would then report those buffers as leaks: a second failure, whose long report buries the
 * assertion that matters. A failed run therefore ends at once with _exit, after flushing
 * stdio, which skips that check; a run that passed returns from main and is still checked
 * for leaks. */
#ifndef MT_TESTS_COMMON_TEST_MAIN_H
#define MT_TESTS_COMMON_TEST_MAIN_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* failed: what cmocka_run_group_tests returned (the number of failed tests). Returns 0 when
 * it is 0; else does not return. The status is kept within 1..76: meson reads 77 as a
 * skipped test, and a count above 255 would wrap to 0. */
static inline int mt_test_end(int failed)
{
    if (failed == 0)
        return 0;
    fflush(NULL);
    _exit(failed > 0 && failed < 77 ? failed : 1);
}

/* MT_TEST_FILTER=PATTERN runs only the tests whose name matches it ('*' and '?'), and
 * MT_TEST_SKIP=PATTERN all but those, so that one long program can be given to meson as
 * parts that run side by side. */
static inline void mt_test_filter(void)
{
    const char *f = getenv("MT_TEST_FILTER");
    if (f != NULL && *f != '\0')
        cmocka_set_test_filter(f);
    const char *s = getenv("MT_TEST_SKIP");
    if (s != NULL && *s != '\0')
        cmocka_set_skip_filter(s);
}

#define MT_TEST_RUN(tests, setup, teardown)                                                        \
    (mt_test_filter(), mt_test_end(cmocka_run_group_tests(tests, setup, teardown)))

#endif
