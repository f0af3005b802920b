/* PyTorch's CUDAPluggableAllocator entry points of the preload library, called from C as
 * torch calls them (function pointers from dlsym), in-process on the sim backend:
 * alloc/free, init, memory fraction (torch.cuda.set_per_process_memory_fraction), base
 * allocation (IPC), reset (torch.cuda.empty_cache). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>
#include "tests/common/test_main.h"

#define MiB ((size_t)1 << 20)

static char oomdir[64];

static struct {
    void *lib;
    void *(*alloc)(ssize_t size, int device, void *stream);
    void (*free)(void *ptr, ssize_t size, int device, void *stream);
    void (*init)(int device_count);
    void (*reset)(void);
    void (*fraction)(double fraction, int device);
    void *(*base)(void *ptr, size_t *size);
    long (*stats)(char *buf, size_t cap);
} P;

static int setup(void **state)
{
    (void)state;
    setenv("MEMTRACE_BACKEND", "sim", 1);
    setenv("MEMTRACE_SIM_CAPACITY", "67108864", 1);
    setenv("MEMTRACE_LOG_LEVEL", getenv("MT_DEBUG") ? "debug" : "quiet", 1);
    setenv("MEMTRACE_SOCKET", "/nonexistent/memtrace-test.sock", 1);
    setenv("MEMTRACE_PROF", "off", 1);
    /* the refused requests below write OOM snapshots: into a directory of this test's */
    snprintf(oomdir, sizeof oomdir, "/tmp/mt-pluggable-XXXXXX");
    if (!mkdtemp(oomdir))
        return -1;
    setenv("MEMTRACE_OOM_DIR", oomdir, 1);
    /* these tests look at the refused requests themselves (NULL); torch would not */
    setenv("MEMTRACE_PLUGGABLE_OOM", "null", 1);
    const char *path = getenv("MT_PRELOAD");
    P.lib = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!P.lib)
        return -1;
    *(void **)&P.alloc = dlsym(P.lib, "memtrace_alloc");
    *(void **)&P.free = dlsym(P.lib, "memtrace_free");
    *(void **)&P.init = dlsym(P.lib, "memtrace_init");
    *(void **)&P.reset = dlsym(P.lib, "memtrace_reset");
    *(void **)&P.fraction = dlsym(P.lib, "memtrace_memory_fraction");
    *(void **)&P.base = dlsym(P.lib, "memtrace_base_alloc");
    *(void **)&P.stats = dlsym(P.lib, "memtrace_stats_json");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", oomdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Device 0's reserved bytes now, from memtrace_stats_json. */
static long long reserved(void)
{
    static char buf[1 << 16];
    assert_true(P.stats(buf, sizeof buf) < (long)sizeof buf);
    json_error_t e;
    json_t *j = json_loads(buf, 0, &e);
    assert_non_null(j);
    json_t *d = json_array_get(json_object_get(j, "devices"), 0);
    json_t *s = json_object_get(d, "stats");
    json_t *r = json_object_get(json_object_get(s ? s : d, "reserved_bytes"), "all");
    r = json_object_get(r, "current");
    assert_true(json_is_integer(r));
    long long v = json_integer_value(r);
    json_decref(j);
    return v;
}

static void test_entry_points_exported(void **state)
{
    (void)state;
    assert_non_null(P.alloc);
    assert_non_null(P.free);
    assert_non_null(P.init);
    assert_non_null(P.reset);
    assert_non_null(P.fraction);
    assert_non_null(P.base);
}

/* set_per_process_memory_fraction(0.25) on a 64 MiB device: 32 MiB no longer fits, 512 KiB
 * (in a 2 MiB segment) does; back to 1.0, 32 MiB fits again. */
static void test_memory_fraction(void **state)
{
    (void)state;
    P.init(1);
    P.fraction(0.25, 0);
    void *big = P.alloc((ssize_t)(32 * MiB), 0, NULL);
    assert_null(big);
    void *small = P.alloc((ssize_t)(MiB / 2), 0, NULL);
    assert_non_null(small);
    P.fraction(1.0, 0);
    big = P.alloc((ssize_t)(32 * MiB), 0, NULL);
    assert_non_null(big);
    P.free(big, (ssize_t)(32 * MiB), 0, NULL);
    P.free(small, (ssize_t)(MiB / 2), 0, NULL);
    P.fraction(0.0, 0); /* out of range: ignored, as torch checks it first */
    big = P.alloc((ssize_t)(32 * MiB), 0, NULL);
    assert_non_null(big);
    P.free(big, (ssize_t)(32 * MiB), 0, NULL);
}

/* getBaseAllocation: a pointer inside a block gives the block's start and size; a pointer
 * memtrace did not hand out gives NULL. */
static void test_base_alloc(void **state)
{
    (void)state;
    char *p = P.alloc((ssize_t)MiB, 0, NULL);
    assert_non_null(p);
    size_t size = 0;
    assert_ptr_equal(P.base(p + 4096, &size), p);
    assert_true(size >= MiB);
    int local;
    size = 7;
    assert_null(P.base(&local, &size));
    assert_int_equal(size, 0);
    P.free(p, (ssize_t)MiB, 0, NULL);
}

/* emptyCache: the reserved bytes of freed blocks go back. */
static void test_reset_empties_cache(void **state)
{
    (void)state;
    void *p = P.alloc((ssize_t)(4 * MiB), 0, NULL);
    assert_non_null(p);
    P.free(p, (ssize_t)(4 * MiB), 0, NULL);
    assert_true(reserved() >= (long long)(4 * MiB));
    P.reset();
    assert_int_equal(reserved(), 0);
}

/* torch's CUDAPluggableAllocator never checks the pointer memtrace_alloc returns: an
 * out-of-memory stops the process with memtrace's report rather than hand torch NULL. */
static void test_oom_stops_before_null(void **state)
{
    (void)state;
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        unsetenv("MEMTRACE_PLUGGABLE_OOM"); /* the default, as under torch */
        setenv("MEMTRACE_LOG_LEVEL", "quiet", 1);
        P.init(1);
        void *p = P.alloc((ssize_t)(128 * MiB), 0, NULL); /* more than the 64 MiB device */
        _exit(p == NULL ? 3 : 4);
    }
    close(fd[1]);
    char out[8192];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof out - 1 && (r = read(fd[0], out + n, sizeof out - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(fd[0]);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFSIGNALED(st))
        fprintf(stderr, "child exit %d, stderr:\n%s\n", WEXITSTATUS(st), out);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    assert_non_null(strstr(out, "memtrace_alloc"));
    assert_non_null(strstr(out, "out of memory"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entry_points_exported),
        cmocka_unit_test(test_memory_fraction),
        cmocka_unit_test(test_base_alloc),
        cmocka_unit_test(test_reset_empties_cache),
        cmocka_unit_test(test_oom_stops_before_null),
    };
    return MT_TEST_RUN(tests, setup, teardown);
}
