/* cuDNN and the CUDA runtime as pip wheels put them (site-packages/nvidia/<package>/lib),
 * outside the loader's search path. This executable runs with MEMTRACE_LIBCUDNN and
 * MEMTRACE_LIBCUDART set to bare names that the loader cannot find (the real libcudnn.so.9
 * may be installed on this machine, so the tests cannot use its soname), and points
 * MEMTRACE_CUDNN_ROOTS at a site-packages tree made in a temporary folder, whose libraries
 * are links to the fake cuDNN. Loading is once per process, so the failure comes first. */
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/rnn_cudnn/fixture.h"
#include "tests/common/test_main.h"

#define WHEEL_DNN "libmt_wheel_cudnn.so.9"
#define WHEEL_RT  "libmt_wheel_cudart.so.13"

static char tmp[256];

static void mkdirs(const char *path)
{
    char p[512];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            mkdir(p, 0755);
            *s = '/';
        }
    assert_true(mkdir(p, 0755) == 0 || errno == EEXIST);
}

/* site/nvidia/<pkg>/lib/<name> -> the fake cuDNN (which also plays the runtime). */
static void wheel_file(const char *site, const char *pkg, const char *name, char *out, size_t n)
{
    Dl_info di;
    assert_true(dladdr((void *)fake_dnn_reset, &di) != 0 && di.dli_fname);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/nvidia/%s/lib", site, pkg);
    mkdirs(dir);
    snprintf(out, n, "%s/%s", dir, name);
    assert_int_equal(symlink(di.dli_fname, out), 0);
}

/* Nothing found: creation fails, one warning names the names tried, the folders searched
 * and why; a second module says it again, not at warning level. */
static void test_not_found_warns_once(void **state)
{
    (void)state;
    char empty[300], roots[700];
    snprintf(empty, sizeof empty, "%s/empty/site-packages", tmp);
    mkdirs(empty);
    snprintf(roots, sizeof roots, "%s/absent/lib/python3*/site-packages:%s", tmp, empty);
    setenv("MEMTRACE_CUDNN_ROOTS", roots, 1);
    fx_t f;
    fx_up(&f);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), MT_ENODEV);
    assert_null(f.m);
    assert_int_equal(f.warnings, 1);
    assert_non_null(strstr(f.last_log, "rnn: cudnn unavailable: cannot load " WHEEL_DNN));
    assert_non_null(strstr(f.last_log, "nvidia/*/lib/" WHEEL_DNN " under"));
    assert_non_null(strstr(f.last_log, empty));
    assert_non_null(strstr(f.last_log, "not found"));
    assert_non_null(strstr(f.last_log, "cannot use the GPU"));
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), MT_ENODEV);
    assert_int_equal(f.warnings, 1);
    fx_down(&f);
}

/* A wheel tree under a root pattern: both libraries load from it, and the info line names
 * the files and versions. */
static void test_wheel_tree_loads(void **state)
{
    (void)state;
    char site[300], dnn[600], rt[600], roots[700];
    snprintf(site, sizeof site, "%s/venv/lib/python3.13/site-packages", tmp);
    wheel_file(site, "cudnn", WHEEL_DNN, dnn, sizeof dnn);
    wheel_file(site, "cuda_runtime", WHEEL_RT, rt, sizeof rt);
    snprintf(roots, sizeof roots, "%s/empty/site-packages:%s/venv/lib/python3*/site-packages", tmp,
             tmp);
    setenv("MEMTRACE_CUDNN_ROOTS", roots, 1);
    fx_t f;
    fx_up(&f);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    assert_string_equal(mt_rnn_path_name(f.m), "cudnn");
    assert_int_equal(f.warnings, 0);
    char want[700];
    snprintf(want, sizeof want, "from %s;", dnn);
    assert_non_null(strstr(f.version_log, want));
    snprintf(want, sizeof want, "from %s", rt);
    assert_non_null(strstr(f.version_log, want));
    assert_non_null(strstr(f.version_log, "libcudnn 9.19.0"));
    assert_non_null(strstr(f.version_log, "CUDA runtime 13.0"));
    fx_down(&f);
}

static int setup(void **state)
{
    snprintf(tmp, sizeof tmp, "/tmp/mt_wheel_XXXXXX");
    if (!mkdtemp(tmp))
        return -1;
    return fake_ctl_open(state);
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    int rc = system(cmd);
    (void)rc;
    return fake_ctl_close(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_not_found_warns_once),
        cmocka_unit_test(test_wheel_tree_loads),
    };
    return MT_TEST_RUN(tests, setup, teardown);
}
