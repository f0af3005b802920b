/* mt__grow (util/grow.h): the room it makes, and the sizes it refuses without touching the
 * array. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "util/grow.h"
#include "tests/common/test_main.h"

static void test_doubles_from_first(void **state)
{
    (void)state;
    size_t cap = 0;
    int *a = mt__grow(NULL, &cap, 1, sizeof *a, 16);
    assert_non_null(a);
    assert_int_equal(cap, 16);
    for (int i = 0; i < 16; i++)
        a[i] = i;
    int *b = mt__grow(a, &cap, 17, sizeof *b, 16);
    assert_non_null(b);
    assert_int_equal(cap, 32);
    for (int i = 0; i < 16; i++) /* the entries move with the array */
        assert_int_equal(b[i], i);
    int *c = mt__grow(b, &cap, 200, sizeof *c, 16);
    assert_non_null(c);
    assert_int_equal(cap, 256);
    free(c);
}

static void test_room_enough_is_untouched(void **state)
{
    (void)state;
    size_t cap = 8;
    char *a = malloc(8);
    assert_non_null(a);
    assert_ptr_equal(mt__grow(a, &cap, 8, 1, 4), a);
    assert_ptr_equal(mt__grow(a, &cap, 0, 1, 4), a);
    assert_int_equal(cap, 8);
    free(a);
}

static void test_overflow_refused(void **state)
{
    (void)state;
    size_t cap = 4;
    char *a = malloc(4 * 8);
    assert_non_null(a);
    /* entries * elem beyond size_t, and a count whose doubling would wrap */
    assert_null(mt__grow(a, &cap, 5, SIZE_MAX / 8 + 2, 4)); /* 8 x that wraps to 8 */
    assert_int_equal(cap, 4);
    assert_null(mt__grow(a, &cap, SIZE_MAX, 1, 4));
    assert_int_equal(cap, 4);
    free(a); /* still the caller's, unmoved */
}

static void test_zero_first_still_grows(void **state)
{
    (void)state;
    size_t cap = 0;
    long *a = mt__grow(NULL, &cap, 3, sizeof *a, 0);
    assert_non_null(a);
    assert_true(cap >= 3);
    free(a);
}

/* An empty array asked for no room is still allocated: NULL means only failure (a real
 * snapshot with an empty trace list read as "out of memory" when it did not). */
static void test_need_zero_allocates(void **state)
{
    (void)state;
    size_t cap = 0;
    int *a = mt__grow(NULL, &cap, 0, sizeof *a, 16);
    assert_non_null(a);
    assert_int_equal(cap, 16);
    assert_ptr_equal(mt__grow(a, &cap, 0, sizeof *a, 16), a);
    free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doubles_from_first),  cmocka_unit_test(test_room_enough_is_untouched),
        cmocka_unit_test(test_overflow_refused),    cmocka_unit_test(test_zero_first_still_grows),
        cmocka_unit_test(test_need_zero_allocates),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
