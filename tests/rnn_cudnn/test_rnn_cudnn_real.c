/* The library as shipped, linked against the real libcudnn: on a machine without a driver
 * (this one), the module on the cuda backend (over the fake driver of tests/cuda) reaches
 * the real CUDA runtime and cuDNN, which cannot start (the runtime finds no libcuda.so.1);
 * creation returns MT_ENODEV and logs why, and the sim backend keeps the cpu path. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/alloc.h"
#include "memtrace/rnn.h"

#include <cudnn_version.h>
#include "tests/common/test_main.h"

typedef struct logs_s {
    int warnings;
    char last[512];
} logs_t;

static void on_log(void *ud, mt_log_level_e level, const char *msg)
{
    logs_t *l = ud;
    if (level == MT_LOG_WARN) {
        l->warnings++;
        snprintf(l->last, sizeof l->last, "%s", msg);
    }
}

static void make(mt_backend_kind_e kind, mt_backend_t **b, mt_alloc_t **a)
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = kind;
    bc.sim_capacity = (size_t)64 << 20;
    assert_int_equal(mt_backend_create(b, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = *b;
    assert_int_equal(mt_alloc_create(a, &ac), 0);
}

/* A 4 x 4 LSTM over a, logging into logs. */
static mt_rnn_cfg_t small_cfg(mt_alloc_t *a, logs_t *logs)
{
    mt_rnn_cfg_t cfg = mt_rnn_cfg_default();
    cfg.input_size = 4;
    cfg.hidden_size = 4;
    cfg.alloc = a;
    cfg.log = on_log;
    cfg.log_ud = logs;
    return cfg;
}

/* libmemtrace does not need libcudnn to load: nothing has loaded it before a cudnn module
 * is made (it was a NEEDED entry of libmemtrace.so before). */
static void test_library_loads_without_cudnn(void **state)
{
    (void)state;
    char name[32];
    snprintf(name, sizeof name, "libcudnn.so.%d", CUDNN_MAJOR);
    void *h = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
    assert_null(h);
    assert_string_equal(mt_rnn_mode_name(MT_RNN_LSTM), "lstm"); /* libmemtrace is loaded */
}

/* A libcudnn that cannot be loaded: the module is not made, the log names the path. */
static void test_missing_cudnn_is_named(void **state)
{
    (void)state;
    setenv("MEMTRACE_LIBCUDNN", "/nonexistent/libcudnn.so.9", 1);
    mt_backend_t *b;
    mt_alloc_t *a;
    make(MT_BACKEND_CUDA, &b, &a);
    logs_t logs = {0};
    mt_rnn_cfg_t cfg = small_cfg(a, &logs);
    mt_rnn_t *m = NULL;
    assert_int_equal(mt_rnn_create(&m, &cfg), MT_ENODEV);
    assert_null(m);
    assert_non_null(strstr(logs.last, "cudnn unavailable: cannot load /nonexistent/libcudnn.so.9"));
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
    unsetenv("MEMTRACE_LIBCUDNN");
}

static void test_real_cudnn_without_driver(void **state)
{
    (void)state;
    /* With a real driver, the real cuDNN would start and compute on the fake driver's host
     * memory: this test is about machines without one. */
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (drv) {
        dlclose(drv);
        skip();
    }
    mt_backend_t *b;
    mt_alloc_t *a;
    make(MT_BACKEND_CUDA, &b, &a);
    logs_t logs = {0};
    mt_rnn_cfg_t cfg = small_cfg(a, &logs);
    mt_rnn_t *m = NULL;
    assert_int_equal(mt_rnn_create(&m, &cfg), MT_ENODEV);
    assert_null(m);
    assert_int_equal(logs.warnings, 1);
    assert_non_null(strstr(logs.last, "cudnn unavailable"));
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(a, &st), 0);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 0);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);

    make(MT_BACKEND_SIM, &b, &a);
    cfg.alloc = a;
    assert_int_equal(mt_rnn_create(&m, &cfg), 0);
    assert_string_equal(mt_rnn_path_name(m), "cpu");
    mt_rnn_destroy(&m);
    mt_alloc_destroy(&a);
    mt_backend_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_library_loads_without_cudnn),
        cmocka_unit_test(test_missing_cudnn_is_named),
        cmocka_unit_test(test_real_cudnn_without_driver),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
