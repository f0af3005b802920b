/* Python frames in a process with no interpreter (profiler/pyframes.c): capture is a no-op
 * returning 0, no ip is in an eval loop, and interleaving leaves the native stack as is. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "profiler/pyframes.h"
#include "tests/common/test_main.h"

static void test_no_interpreter(void **state)
{
    mt_pyframe_t py[8];
    bool trunc = true;
    assert_int_equal(mt__pyframes_capture(py, 8, &trunc), 0);
    assert_false(trunc);
    assert_int_equal(mt__pyframes_capture(py, 0, NULL), 0);
    mt__pyframes_refresh();
    assert_false(mt__pyframes_ip_is_eval((uintptr_t)&test_no_interpreter));
    uintptr_t ips[3] = {0x1000, 0x2000, 0x3000};
    int32_t order[8];
    assert_int_equal(mt__pyframes_merge(ips, 3, py, 0, order, 8), 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(order[i], i);
    /* Python frames with no eval frame on the native stack go after the innermost frame,
     * and the output is cut at cap. */
    mt_pyframe_t two[2] = {{"f", "x.py", 3, 0}, {"<module>", "x.py", 9, 1}};
    assert_int_equal(mt__pyframes_merge(ips, 3, two, 2, order, 8), 5);
    int32_t want[5] = {0, -1, -2, 1, 2};
    for (int i = 0; i < 5; i++)
        assert_int_equal(order[i], want[i]);
    assert_int_equal(mt__pyframes_merge(ips, 3, two, 2, order, 2), 2);
    assert_int_equal(order[0], 0);
    assert_int_equal(order[1], 1);
    mt__pyframes_stats_t st;
    mt__pyframes_stats(&st);
    assert_true(st.captures == 0 && st.str_bytes == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_no_interpreter)};
    return MT_TEST_RUN(tests, NULL, NULL);
}
