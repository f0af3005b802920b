/* mt__rnn_rows_par: the step loops' two halves run on two threads with oneDNN (its count is
 * per thread) and BLIS (for the process); with OpenBLAS on the caller (docs/blas.md). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>

#include "rnn/internal.h"

typedef struct seen_s {
    pthread_t who[2];
    int lo[2], hi[2];
    int calls;
    pthread_mutex_t lock;
} seen_t;

static void record(void *arg, int b0, int b1)
{
    seen_t *s = arg;
    pthread_mutex_lock(&s->lock);
    int i = b0 == 0 ? 0 : 1;
    s->who[i] = pthread_self();
    s->lo[i] = b0;
    s->hi[i] = b1;
    s->calls++;
    pthread_mutex_unlock(&s->lock);
}

/* Rows [0, 5) on the caller and [5, 12) on another thread, for library name (two = false:
 * all rows in one call on the caller). */
static void halves_on(const char *name, bool two)
{
    const mt__rnn_gemm_t *g;
    int rc = mt__rnn_gemm_get(name, &g);
    if (rc == MT_ENOTSUP) {
        printf("# %s is not installed here: not checked\n", name);
        return;
    }
    assert_int_equal(rc, 0);
    mt__rnn_shape_t sh = {.mode = MT_RNN_LSTM,
                          .gates = 4,
                          .input = 3,
                          .hidden = 4,
                          .layers = 1,
                          .dirs = 1,
                          .gemm = g,
                          .threads = 2};
    seen_t s = {.calls = 0, .lock = PTHREAD_MUTEX_INITIALIZER};
    mt__rnn_rows_par(&sh, 5, 12, record, &s);
    if (!two) {
        assert_int_equal(s.calls, 1);
        assert_int_equal(s.hi[0], 12);
        assert_true(pthread_equal(s.who[0], pthread_self()));
        return;
    }
    assert_int_equal(s.calls, 2);
    assert_int_equal(s.lo[0], 0);
    assert_int_equal(s.hi[0], 5);
    assert_int_equal(s.lo[1], 5);
    assert_int_equal(s.hi[1], 12);
    assert_true(pthread_equal(s.who[0], pthread_self()));
    assert_false(pthread_equal(s.who[1], pthread_self()));
    /* At one thread: one call over all rows, on the caller. */
    sh.threads = 1;
    s.calls = 0;
    mt__rnn_rows_par(&sh, 5, 12, record, &s);
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.lo[0], 0);
    assert_int_equal(s.hi[0], 12);
    assert_true(pthread_equal(s.who[0], pthread_self()));
}

static void cblas_halves(void **state)
{
    (void)state;
    halves_on("cblas", false);
}

static void blis_halves(void **state)
{
    (void)state;
    halves_on("blis", true);
}

static void dnnl_halves(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    skip(); /* oneDNN's OpenMP threads and LeakSanitizer: see test_rnn_golden.c */
#endif
    halves_on("dnnl", true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cblas_halves),
        cmocka_unit_test(blis_halves),
        cmocka_unit_test(dnnl_halves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
