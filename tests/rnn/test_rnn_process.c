/* The RNN engine leaves the process alone: the environment is byte for byte the same after
 * modules on every GEMM library (and libxsmm) were created, ran and were destroyed, and a
 * module's worker thread is gone once the module is. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/rnn/fixture.h"
#include "tests/common/test_main.h"

extern char **environ;

/* The whole environment as one string (new). */
static char *env_bytes(void)
{
    size_t n = 1;
    for (char **e = environ; *e; e++)
        n += strlen(*e) + 1;
    char *s = calloc(1, n), *p = s;
    assert_non_null(s);
    for (char **e = environ; *e; e++)
        p += sprintf(p, "%s\n", *e);
    return s;
}

static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The thread count once it is at most want, waiting up to 5 s: a joined thread's entry
 * can stay in /proc/self/task for a moment after pthread_join returns (the kernel wakes
 * the joiner before the task is reaped; under qemu-user, the emulator's host thread ends
 * after the guest's). A worker left running stays, and the count is returned above want. */
static int thread_count_settled(int want)
{
    int n = thread_count();
    for (int i = 0; i < 500 && n > want; i++) {
        usleep(10000);
        n = thread_count();
    }
    return n;
}

/* A module on lib at `threads` GEMM threads (NULL if lib is not installed here). */
static mt_rnn_t *open_module(rnn_fx_t *fx, const char *lib, int threads)
{
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 8, 16, 1, false);
    c.gemm = lib;
    mt_rnn_t *m = NULL;
    int rc = mt_rnn_create(&m, &c);
    if (rc == MT_ENOTSUP)
        return NULL;
    assert_int_equal(rc, 0);
    if (threads > 1)
        assert_int_equal(mt_rnn_set_gemm_threads(m, threads), 0);
    return m;
}

/* One forward of a small batch: 0 or the forward's code. */
static int forward(rnn_fx_t *fx, mt_rnn_t *m)
{
    const int T = 4, B = 64;
    float *x = fx_buf(fx, (size_t)T * B * 8, 0, 7), *y = fx_buf(fx, (size_t)T * B * 16, 0, 0);
    mt_rnn_io_t io = {.seq_len = T, .batch = B, .x = x, .y = y};
    int rc = mt_rnn_forward(m, &io, NULL);
    fx_put(fx, x);
    fx_put(fx, y);
    return rc;
}

/* open_module, forward, destroy; false if lib is not installed here. */
static bool run_module(rnn_fx_t *fx, const char *lib, int threads)
{
    mt_rnn_t *m = open_module(fx, lib, threads);
    if (!m)
        return false;
    assert_int_equal(forward(fx, m), 0);
    mt_rnn_destroy(&m);
    return true;
}

static void environment_unchanged(void **state)
{
    (void)state;
    /* The variables the GEMM libraries and libxsmm read, unset as a program may leave them. */
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("OMP_PROC_BIND");
    char *before = env_bytes();
    rnn_fx_t *fx = fx_new(64u << 20);
    const char *libs[] = {
#if !defined(__SANITIZE_ADDRESS__) /* oneDNN's OpenMP threads and LeakSanitizer */
        "dnnl",
#endif
        "blis",
        "cblas"
    };
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        if (!run_module(fx, libs[i], 1) || !run_module(fx, libs[i], 2))
            printf("# %s is not installed here: not checked\n", libs[i]);
        char *after = env_bytes();
        if (strcmp(before, after) != 0) {
            size_t k = 0;
            while (before[k] == after[k])
                k++;
            while (k > 0 && after[k - 1] != '\n')
                k--;
            fail_msg("after %s: the environment changed at \"%.60s\"", libs[i], after + k);
        }
        free(after);
    }
    fx_free(&fx);
    free(before);
}

/* A module at two threads starts its worker and joins it at destroy. */
static void worker_joined_at_destroy(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    /* The linked CBLAS must take a thread count for the halves to run on two threads. */
    if (!run_module(fx, "cblas", 1)) {
        fx_free(&fx);
        skip();
    }
    int t0 = thread_count();
    for (int i = 0; i < 3; i++) {
        assert_true(run_module(fx, "cblas", 2));
        assert_int_equal(thread_count_settled(t0), t0);
    }
    /* A forked child of a process with such a module runs its passes and destroys it
     * without the worker, which is not in the child. */
    mt_rnn_t *m = open_module(fx, "cblas", 2);
    assert_int_equal(forward(fx, m), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int rc = forward(fx, m);
        mt_rnn_destroy(&m);
        _exit(rc == 0 ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    mt_rnn_destroy(&m);
    /* OpenBLAS stops its own pool at a fork and starts it again on demand: at most t0. */
    assert_true(thread_count_settled(t0) <= t0);
    fx_free(&fx);
}

/* mt_rnn_create follows its configuration: MEMTRACE_RNN_GEMM is read only by
 * mt_rnn_cfg_from_env, which the program calls at its edge. */
static void cfg_over_environment(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    setenv("MEMTRACE_RNN_GEMM", "no-such-library", 1);
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 8, 16, 1, false);
    mt_rnn_t *m = NULL;
    assert_int_equal(mt_rnn_create(&m, &c), 0); /* the default library */
    mt_rnn_destroy(&m);
    assert_int_equal(mt_rnn_cfg_from_env(&c), 0);
    assert_string_equal(c.gemm, "no-such-library");
    assert_int_equal(mt_rnn_create(&m, &c), MT_EINVAL);
    setenv("MEMTRACE_RNN_GEMM", "cblas", 1);
    c.gemm = NULL;
    assert_int_equal(mt_rnn_cfg_from_env(&c), 0);
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    assert_string_equal(mt_rnn_gemm_name(m), "cblas");
    mt_rnn_destroy(&m);
    unsetenv("MEMTRACE_RNN_GEMM");
    fx_free(&fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        /* First: the other test's modules would have started a process-wide worker before
         * the count (the library before modules owned theirs). */
        cmocka_unit_test(worker_joined_at_destroy),
        cmocka_unit_test(environment_unchanged),
        cmocka_unit_test(cfg_over_environment),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
