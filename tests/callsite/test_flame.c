/* Flame graphs (analysis/flame.c): common prefixes merge and widths follow bytes, every
 * frame has a <title>, text is escaped, an empty graph says so, and bad arguments are
 * refused without changing the sums. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/flame.h"
#include "tests/common/test_main.h"
#include "tests/common/test_text.h"

/* Not inlined: GCC 12 then takes the memstream buffer for a dangling local. */
__attribute__((noinline)) static char *render(mt_flame_t *f)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    assert_non_null(out);
    mt_flame_cfg_t cfg = mt__flame_cfg_default();
    cfg.title = "live <bytes> & peak";
    assert_int_equal(mt__flame_write_svg(f, &cfg, out), 0);
    fclose(out);
    return buf;
}

/* The width of the rect drawn right after the <title> that starts with label. */
static double width_of(const char *svg, const char *label)
{
    char key[256];
    snprintf(key, sizeof(key), "<title>%s (", label);
    const char *p = strstr(svg, key);
    assert_non_null(p);
    p = strstr(p, "width=\"");
    assert_non_null(p);
    return atof(p + 7);
}

static void test_merge_and_widths(void **state)
{
    mt_flame_t *f;
    assert_int_equal(mt__flame_create(&f), 0);
    const char *a[] = {"main", "train", "forward"};
    const char *b[] = {"main", "train", "backward"};
    const char *c[] = {"main", "load"};
    assert_int_equal(mt__flame_add(f, a, 3, 600), 0);
    assert_int_equal(mt__flame_add(f, b, 3, 200), 0);
    assert_int_equal(mt__flame_add(f, c, 2, 200), 0);
    assert_int_equal(mt__flame_add(f, a, 3, 0), 0);
    assert_int_equal(mt__flame_total(f), 1000);
    char *svg = render(f);
    /* all, main, train, forward, backward, load: one frame each, merged prefixes. */
    assert_int_equal(mt_test_count(svg, "<title>"), 6);
    assert_int_equal(mt_test_count(svg, "<title>main ("), 1);
    assert_int_equal(mt_test_count(svg, "<title>train ("), 1);
    assert_non_null(strstr(svg, "<title>train (800 B, 800 bytes, 80.00%)</title>"));
    double all = width_of(svg, "all"), main_w = width_of(svg, "main");
    double fwd = width_of(svg, "forward"), bwd = width_of(svg, "backward");
    assert_true(all > 1000.0);
    assert_true(main_w == all);
    assert_true(fwd > 2.9 * bwd && fwd < 3.1 * bwd);
    /* The title is escaped too. */
    assert_non_null(strstr(svg, "live &lt;bytes&gt; &amp; peak"));
    free(svg);
    mt__flame_destroy(&f);
    assert_null(f);
}

static void test_escaping(void **state)
{
    mt_flame_t *f;
    assert_int_equal(mt__flame_create(&f), 0);
    const char *s[] = {"std::vector<int>::push_back", "a&b \"q\" 'x'\x01"};
    assert_int_equal(mt__flame_add(f, s, 2, 4096), 0);
    char *svg = render(f);
    assert_non_null(strstr(svg, "<title>std::vector&lt;int&gt;::push_back ("));
    assert_non_null(strstr(svg, "a&amp;b &quot;q&quot; &apos;x&apos;?"));
    assert_null(strstr(svg, "<int>"));
    assert_null(strstr(svg, "\x01"));
    free(svg);
    mt__flame_destroy(&f);
}

static void test_empty_and_bad(void **state)
{
    mt_flame_t *f;
    assert_int_equal(mt__flame_create(&f), 0);
    char *svg = render(f);
    assert_non_null(strstr(svg, "no bytes to show"));
    assert_non_null(strstr(svg, "</svg>"));
    free(svg);
    const char *bad[] = {"main", NULL};
    assert_int_equal(mt__flame_add(f, bad, 2, 10), MT_EINVAL);
    assert_int_equal(mt__flame_add(f, bad, -1, 10), MT_EINVAL);
    assert_int_equal(mt__flame_add(f, bad, MT_FLAME_DEPTH_MAX + 1, 10), MT_EINVAL);
    assert_int_equal(mt__flame_total(f), 0);
    /* Saturation instead of wrap-around. */
    const char *s[] = {"x"};
    assert_int_equal(mt__flame_add(f, s, 1, UINT64_MAX - 1), 0);
    assert_int_equal(mt__flame_add(f, s, 1, 5), 0);
    assert_true(mt__flame_total(f) == UINT64_MAX);
    mt__flame_destroy(&f);
}

static void test_deep_stack(void **state)
{
    mt_flame_t *f;
    assert_int_equal(mt__flame_create(&f), 0);
    const char *frames[MT_FLAME_DEPTH_MAX];
    char names[MT_FLAME_DEPTH_MAX][16];
    for (int i = 0; i < MT_FLAME_DEPTH_MAX; i++) {
        snprintf(names[i], sizeof(names[i]), "f%d", i);
        frames[i] = names[i];
    }
    assert_int_equal(mt__flame_add(f, frames, MT_FLAME_DEPTH_MAX, 1 << 20), 0);
    char *svg = render(f);
    assert_int_equal(mt_test_count(svg, "<title>"), MT_FLAME_DEPTH_MAX + 1);
    free(svg);
    mt__flame_destroy(&f);
}

static void test_write_error(void **state)
{
    mt_flame_t *f;
    assert_int_equal(mt__flame_create(&f), 0);
    const char *s[] = {"x"};
    assert_int_equal(mt__flame_add(f, s, 1, 5), 0);
    FILE *full = fopen("/dev/full", "w");
    if (full == NULL)
        skip();
    assert_int_equal(mt__flame_write_svg(f, NULL, full), MT_EIO);
    fclose(full);
    mt__flame_destroy(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_and_widths), cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_empty_and_bad),    cmocka_unit_test(test_deep_stack),
        cmocka_unit_test(test_write_error),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
