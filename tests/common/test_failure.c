/* A failed CMocka test is reported once, as the assertion that failed (test_main.h).
 *
 * Run with --fail, this program is a group whose only test allocates buffers and then fails
 * an assertion, leaving them unreachable; meson runs it so (should_fail). With --fail-plain,
 * the same group ends the way test mains used to, returning cmocka_run_group_tests' result
 * from main. Without arguments, the tests below run both as child processes and read their
 * output: the first must show the failed assertion and no LeakSanitizer report; under
 * AddressSanitizer the second must show the report, so the first is known to prove
 * something. */
#include "tests/common/test_main.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "mt_config.h"

#define FAIL_MARK "expected failure of test_failure --fail"

static void leaky_failure(void **state)
{
    /* Each buffer holds the previous one's address: after the longjmp, no root reaches
     * them, as with any test that fails between its malloc and its free. */
    void *chain = NULL;
    for (int i = 0; i < 4; i++) {
        void **b = malloc(4096);
        assert_non_null(b);
        b[0] = chain;
        chain = b;
    }
    fail_msg("%s", FAIL_MARK);
}

static int run_failing(bool wrapped)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(leaky_failure),
    };
    if (wrapped)
        return MT_TEST_RUN(tests, NULL, NULL);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Runs this program with arg; returns its output (stdout and stderr), status in *status. */
static char *run_child(const char *arg, int *status)
{
    char exe[4096], cmd[4200];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(n > 0);
    exe[n] = '\0';
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", exe, arg);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    while ((n = (ssize_t)fread(out + len, 1, cap - 1 - len, p)) > 0) {
        len += (size_t)n;
        if (len + 1 == cap) {
            cap *= 2;
            out = realloc(out, cap);
            assert_non_null(out);
        }
    }
    out[len] = '\0';
    *status = pclose(p);
    return out;
}

static void test_failure_is_not_a_leak(void **state)
{
    int st;
    char *out = run_child("--fail", &st);
    print_message("---- output of --fail ----\n%s---- end ----\n", out);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 1);
    assert_non_null(strstr(out, FAIL_MARK));
    assert_non_null(strstr(out, "[  FAILED  ] leaky_failure"));
    assert_null(strstr(out, "LeakSanitizer"));
    assert_null(strstr(out, "AddressSanitizer"));
    free(out);
}

static void test_plain_return_reports_the_leak(void **state)
{
    if (!MT_SANITIZED)
        skip(); /* no LeakSanitizer to report anything */
    int st;
    char *out = run_child("--fail-plain", &st);
    assert_false(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_non_null(strstr(out, FAIL_MARK));
    assert_non_null(strstr(out, "LeakSanitizer: detected memory leaks"));
    free(out);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--fail") == 0)
        return run_failing(true);
    if (argc > 1 && strcmp(argv[1], "--fail-plain") == 0)
        return run_failing(false);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failure_is_not_a_leak),
        cmocka_unit_test(test_plain_return_reports_the_leak),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
