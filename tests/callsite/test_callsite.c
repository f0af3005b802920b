/* Call-site views (analysis/callsite.c): rows ranked, native frames of this very binary and
 * Python frames labelled, unknown ids and id 0 named, the JSON form, flame input
 * root-first, and names that are not UTF-8. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analysis/callsite.h"
#include "tests/callsite/dwarf.h"
#include "tests/common/test_main.h"

static volatile uintptr_t sink;

static __attribute__((noinline)) uintptr_t return_address(void)
{
    return (uintptr_t)__builtin_return_address(0);
}

static __attribute__((noinline)) uintptr_t site_alloc_weights(void)
{
    uintptr_t ra = return_address();
    sink += ra;
    return ra;
}

static int add_exe(struct dl_phdr_info *info, size_t size, void *data)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    assert_true(n > 0);
    exe[n] = '\0';
    uint64_t end = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && ph->p_vaddr + ph->p_memsz > end)
            end = ph->p_vaddr + ph->p_memsz;
    }
    assert_int_equal(mt__sym_add_module(data, 7, exe, info->dlpi_addr, end, NULL), 0);
    return 1; /* the executable only */
}

static void test_rows(void **state)
{
    mt_sym_t *s;
    assert_int_equal(mt__sym_create(&s), 0);
    dl_iterate_phdr(add_exe, s);
    mt_cs_frame_t fr_w[2] = {{.ip = site_alloc_weights()},
                             {.py_func = "Model.load", .py_file = "/x/train.py", .py_line = 42}};
    mt_cs_row_t rows[3] = {
        {.stack = 3, .bytes = 100, .blocks = 1, .frames = NULL},
        {.stack = 1, .bytes = 8 << 20, .blocks = 2, .frames = fr_w, .n_frames = 2},
        {.stack = 0, .bytes = 100, .blocks = 5},
    };
    mt__cs_rows_sort(rows, 3);
    assert_int_equal(rows[0].stack, 1);
    assert_int_equal(rows[1].stack, 0);
    assert_int_equal(rows[2].stack, 3);

    /* The native frame's label: file:line from DWARF (this test is built with -g in every
     * build type), else the symbol table's name at module+offset. */
    char exe[4096], site[128];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    assert_true(n > 0);
    exe[n] = '\0';
    if (mt_test_has_line_info(exe))
        snprintf(site, sizeof(site), "site_alloc_weights (test_callsite.c:");
    else
        snprintf(site, sizeof(site), "site_alloc_weights (test_callsite+0x");

    json_t *a = mt__cs_rows_json(s, 7, rows, 3, 2, false);
    assert_non_null(a);
    assert_int_equal(json_array_size(a), 2);
    json_t *r0 = json_array_get(a, 0);
    assert_non_null(strstr(json_string_value(json_object_get(r0, "site")), site));
    json_t *frames = json_object_get(r0, "frames");
    assert_int_equal(json_array_size(frames), 2);
    json_t *py = json_array_get(frames, 1);
    assert_string_equal(json_string_value(json_object_get(py, "function")), "Model.load");
    assert_int_equal(json_integer_value(json_object_get(py, "line")), 42);
    assert_true(json_is_true(json_object_get(py, "python")));
    assert_string_equal(json_string_value(json_object_get(py, "label")),
                        "Model.load (train.py:42)");
    assert_string_equal(json_string_value(json_object_get(json_array_get(a, 1), "site")),
                        "no stack recorded");
    assert_null(json_object_get(r0, "slope"));
    json_decref(a);

    a = mt__cs_rows_json(s, 7, rows, 3, 10, true);
    json_t *r2 = json_array_get(a, 2);
    assert_string_equal(json_string_value(json_object_get(r2, "site")), "unknown stack 3");
    assert_true(json_is_true(json_object_get(r2, "unknown")));
    assert_non_null(json_object_get(r2, "slope"));
    json_decref(a);

    char *buf = NULL;
    size_t len = 0;
    FILE *out;
    mt_flame_t *f;
    assert_int_equal(mt__flame_create(&f), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(mt__cs_flame_add(f, s, 7, &rows[i]), 0);
    assert_int_equal(mt__flame_total(f), (8 << 20) + 200);
    buf = NULL;
    out = open_memstream(&buf, &len);
    assert_int_equal(mt__flame_write_svg(f, NULL, out), 0);
    fclose(out);
    /* root-first: the Python caller sits below the native frame */
    char *caller = strstr(buf, "<title>Model.load (train.py:42)");
    char title[160];
    snprintf(title, sizeof(title), "<title>%s", site);
    char *callee = strstr(buf, title);
    assert_non_null(caller);
    assert_non_null(callee);
    assert_true(caller < callee);
    free(buf);
    mt__flame_destroy(&f);
    mt__sym_destroy(&s);
}

/* Names from a producer that are not UTF-8 still make a JSON row (bytes read '?'). */
static void test_not_utf8(void **state)
{
    mt_sym_t *s;
    assert_int_equal(mt__sym_create(&s), 0);
    mt_cs_frame_t fr = {.py_func = "bad\xff\xfename", .py_file = "/x/\xc3.py", .py_line = 3};
    mt_cs_row_t row = {.stack = 9, .bytes = 10, .blocks = 1, .frames = &fr, .n_frames = 1};
    json_t *a = mt__cs_rows_json(s, 1, &row, 1, 5, false);
    assert_non_null(a);
    json_t *f0 = json_array_get(json_object_get(json_array_get(a, 0), "frames"), 0);
    assert_string_equal(json_string_value(json_object_get(f0, "function")), "bad??name");
    assert_string_equal(json_string_value(json_object_get(f0, "label")), "bad??name (?.py:3)");
    json_decref(a);
    mt__sym_destroy(&s);
}

/* Stacks that read the same merge (bytes and blocks add); others and frameless rows stay. */
static void test_merge(void **state)
{
    mt_sym_t *s;
    assert_int_equal(mt__sym_create(&s), 0);
    mt_cs_frame_t a[2] = {{.py_func = "f", .py_file = "/x.py", .py_line = 1},
                          {.py_func = "main", .py_file = "/x.py", .py_line = 9}};
    mt_cs_frame_t b[2] = {{.py_func = "f", .py_file = "/x.py", .py_line = 1},
                          {.py_func = "main", .py_file = "/x.py", .py_line = 9}};
    mt_cs_frame_t c[1] = {{.py_func = "f", .py_file = "/x.py", .py_line = 1}};
    mt_cs_row_t rows[5] = {
        {.stack = 1, .bytes = 10, .blocks = 1, .frames = a, .n_frames = 2},
        {.stack = 2, .bytes = 30, .blocks = 2, .frames = b, .n_frames = 2},
        {.stack = 3, .bytes = 25, .blocks = 1, .frames = c, .n_frames = 1},
        {.stack = 4, .bytes = 5, .blocks = 1},
        {.stack = 5, .bytes = 5, .blocks = 1},
    };
    size_t n = 5;
    assert_int_equal(mt__cs_rows_merge(s, 1, rows, &n), 0);
    assert_int_equal(n, 4);
    assert_true(rows[0].bytes == 40 && rows[0].blocks == 3);
    assert_true(rows[0].stack == 1 || rows[0].stack == 2);
    assert_int_equal(rows[1].stack, 3);
    assert_int_equal(rows[2].stack, 4);
    assert_int_equal(rows[3].stack, 5);
    mt__sym_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rows), cmocka_unit_test(test_not_utf8),
                                       cmocka_unit_test(test_merge)};
    return MT_TEST_RUN(tests, NULL, NULL);
}
