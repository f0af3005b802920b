/* Regression driver of a fuzz harness, for the ordinary (gcc) suite: feeds every file of
 * the directories named on the command line through the harness's
 * LLVMFuzzerTestOneInput, so the seeds and every crasher once fixed are re-checked under
 * ASan/UBSan without clang. A harness check that fails aborts; a harness that returns
 * non-zero fails the test. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "tests/fuzz/fuzz.h"
#include "tests/common/test_main.h"

typedef struct regress_s {
    int ndirs;
    char **dirs;
} regress_t;

static size_t run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    /* Its own allocation of exactly n bytes: ASan then sees a read past the input. */
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    int rc = LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    if (rc != 0)
        fail_msg("%s: harness returned %d", path, rc);
    return 1;
}

static void test_inputs(void **state)
{
    regress_t *r = *state;
    size_t files = 0;
    for (int i = 0; i < r->ndirs; i++) {
        DIR *d = opendir(r->dirs[i]);
        if (!d)
            continue; /* a harness with no fixed crashers has no regress/ directory */
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", r->dirs[i], e->d_name);
            struct stat st;
            if (e->d_name[0] == '.' || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
                continue;
            files += run_file(path);
        }
        closedir(d);
    }
    /* Every harness has seeds: none found means the test is looking in the wrong place. */
    assert_true(files > 0);
    print_message("%zu inputs\n", files);
}

int main(int argc, char **argv)
{
    regress_t r = {.ndirs = argc - 1, .dirs = argv + 1};
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_inputs, &r),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
