/* The drop-in in cuda mode under an unmodified program (prog_gpurt.c) linked against a
 * CUDA runtime and driver: the fakes, which behave as the real ones where the findings say
 * a GPU would break the drop-in. One test per item; each runs one scenario of prog_gpurt
 * under LD_PRELOAD and asserts it exits 0 (its stderr says which check failed). */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tests/common/test_main.h"

static const char *env(const char *name)
{
    const char *v = getenv(name);
    assert_non_null(v);
    return v;
}

/* Runs prog_gpurt SCENARIO with extra environment assignments; returns its exit status
 * and prints its output when it is not expect. */
static int run_expect(const char *scenario, const char *extra, int expect)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "env MEMTRACE_LIBCUDA='%s' MEMTRACE_BACKEND=cuda MEMTRACE_PROF=off "
             "MEMTRACE_LOG_LEVEL=error %s LD_PRELOAD='%s' '%s' %s 2>&1",
             env("MT_FAKE_CUDA"), extra ? extra : "", env("MT_PRELOAD"), env("MT_PROG_GPURT"),
             scenario);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) != expect)
        fprintf(stderr, "prog_gpurt %s (exit %d):\n%s", scenario, WEXITSTATUS(st), out);
    return WEXITSTATUS(st);
}

/* Runs prog_local MODE LIB, under the drop-in when preload; returns its exit status and
 * prints its output when it is not 0. */
static int run_local(const char *mode, const char *lib, bool preload)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "env MEMTRACE_LIBCUDA='%s' MEMTRACE_BACKEND=cuda MEMTRACE_PROF=off "
             "MEMTRACE_LOG_LEVEL=error LD_PRELOAD='%s' '%s' %s '%s' 2>&1",
             env("MT_FAKE_CUDA"), preload ? env("MT_PRELOAD") : "", env("MT_PROG_LOCAL"), mode,
             lib);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) != 0)
        fprintf(stderr, "prog_local %s%s (exit %d):\n%s", mode, preload ? " (preload)" : "",
                WEXITSTATUS(st), out);
    return WEXITSTATUS(st);
}

static int run(const char *scenario, const char *extra)
{
    return run_expect(scenario, extra, 0);
}

/* Item 11: looking up a symbol (dlsym, cuGetProcAddress) makes no context anywhere. */
static void test_lookup_makes_no_context(void **state)
{
    (void)state;
    assert_int_equal(run("lookup", NULL), 0);
}

/* Item 3 and the fake's cuGetProcAddress: flags pick legacy or _ptsz entry points; the
 * per-thread default stream is one stream per thread. */
static void test_per_thread_stream_and_proc_flags(void **state)
{
    (void)state;
    assert_int_equal(run("procaddr", NULL), 0);
}

/* Item 1 and the fake's sticky errors. */
static void test_reset_drops_cache(void **state)
{
    (void)state;
    /* plain segments: the scenario counts cuMemAlloc */
    assert_int_equal(run("reset", "MEMTRACE_ALLOC_CONF=rules:reference"), 0);
}

/* Section-1 #10: a cache hit after a sticky error fails with it, as the runtime's
 * cudaMalloc does, on every thread, until a reset. */
static void test_sticky_error_on_cache_hit(void **state)
{
    (void)state;
    assert_int_equal(run("stickyhit", NULL), 0);
}

/* The same through the driver's entry points (cuMemAlloc_v2, cuMemAllocAsync). */
static void test_sticky_error_on_cache_hit_driver(void **state)
{
    (void)state;
    assert_int_equal(run("stickyhit_drv", NULL), 0);
}

/* Item 2. */
static void test_foreign_frees_forwarded(void **state)
{
    (void)state;
    assert_int_equal(run("foreign", NULL), 0);
}

/* Item 4, runtime side. */
static void test_free_async_stream0_runtime(void **state)
{
    (void)state;
    assert_int_equal(run("freeasync0", NULL), 0);
}

/* Item 7; N6 (c): a cudaFreeAsync/cuMemFreeAsync of a non-graph pointer during capture
 * fails and invalidates the capture. */
static void test_capture_no_malloc_and_refused_frees(void **state)
{
    (void)state;
    assert_int_equal(run("capture", NULL), 0);
}

/* Item 8. */
static void test_last_error_as_runtime(void **state)
{
    (void)state;
    assert_int_equal(run("lasterror", NULL), 0);
}

/* Item 9. */
static void test_fork_child_starts_clean(void **state)
{
    (void)state;
    assert_int_equal(run("fork", NULL), 0);
    assert_int_equal(run("fork_sim", "MEMTRACE_BACKEND=sim"), 0);
}

/* Item 12. */
static void test_foreign_oom_releases_cache(void **state)
{
    (void)state;
    assert_int_equal(run("oom", NULL), 0);
}

/* Managed memory attached globally is memtrace's, its prefetch and advice reach the
 * driver through memtrace; attached to the host it is forwarded to the driver. */
static void test_managed_served_and_attach_host_forwarded(void **state)
{
    (void)state;
    assert_int_equal(run("managed", NULL), 0);
    assert_int_equal(run("managed_old", "FAKERT_VERSION=12080"), 0);
}

/* Item 6: address ranges and IPC of sub-allocated blocks; shareable handles. */
static void test_block_queries_and_ipc(void **state)
{
    (void)state;
    /* IPC of a block at a plain segment's start; expandable segments export handles only
     * with MEMTRACE_CUDA_HANDLE_TYPE (below) */
    assert_int_equal(run("range", "MEMTRACE_ALLOC_CONF=rules:reference"), 0);
    assert_int_equal(run("handles", "MEMTRACE_ALLOC_CONF=expandable_segments:True "
                                    "MEMTRACE_CUDA_HANDLE_TYPE=posix_fd"),
                     0);
    assert_int_equal(run_expect("handles", "MEMTRACE_ALLOC_CONF=expandable_segments:True", 1), 1);
}

/* Item 16: a static runtime's allocations reach memtrace through the driver. */
static void test_static_runtime_path(void **state)
{
    (void)state;
    assert_int_equal(run("static", NULL), 0);
}

/* A double free is refused and counted, never forwarded to the real free. */
static void test_double_free_not_forwarded(void **state)
{
    (void)state;
    assert_int_equal(run("doublefree", NULL), 0);
}

/* cudaFree(0) binds a context on the calling thread, as the runtime's does. */
static void test_free_null_binds_context(void **state)
{
    (void)state;
    assert_int_equal(run("free0", NULL), 0);
}

/* memtrace_record_stream with the default stream orders the block's reuse after it. */
static void test_record_stream_default(void **state)
{
    (void)state;
    assert_int_equal(run("recstream0", NULL), 0);
}

/* cudaMallocAsync/cuMemAllocAsync serve the stream's device, not the current one. */
static void test_async_alloc_on_stream_device(void **state)
{
    (void)state;
    assert_int_equal(run("streamdev", "FAKE_CUDA_DEVICES=2"), 0);
}

/* A pool the program set keeps the device's stream-ordered allocations with the driver. */
static void test_own_pool_goes_to_driver(void **state)
{
    (void)state;
    assert_int_equal(run("ownpool", "FAKE_CUDA_DEVICES=2"), 0);
}

/* Peer access enabled unseen: an AlreadyEnabled answer still opens memtrace's segments. */
static void test_peer_already_enabled_grants(void **state)
{
    (void)state;
    assert_int_equal(run("peerseen", "FAKE_CUDA_DEVICES=2"), 0);
}

/* record_stream on the per-thread stream orders a free on another thread after the
 * recording thread's stream. */
static void test_record_stream_per_thread(void **state)
{
    (void)state;
    assert_int_equal(run("recstreampt", NULL), 0);
}

/* cudaFree/cuMemFree of stream-ordered memory does not synchronise the device. */
static void test_ordered_free_no_device_sync(void **state)
{
    (void)state;
    assert_int_equal(run("orderedfree", NULL), 0);
}

/* The drop-in looks the real runtime's error and device calls up once, not per call. */
static void test_runtime_lookups_cached(void **state)
{
    (void)state;
    assert_int_equal(run("dlsymcache", NULL), 0);
}

/* memtrace_mark before any allocation makes no context on device 0. */
static void test_early_mark_makes_no_context(void **state)
{
    (void)state;
    assert_int_equal(run("earlymark", NULL), 0);
}

/* The runtime in a plugin's local scope (dlopen RTLD_LOCAL of a library linked to it):
 * the drop-in's forwarded calls must still reach it, with the runtime's own codes. The
 * same run without the drop-in shows the sequence holds on the runtime alone. */
static void test_runtime_in_plugin_scope(void **state)
{
    (void)state;
    assert_int_equal(run_local("plugin", env("MT_PLUGIN_LOCAL"), false), 0);
    assert_int_equal(run_local("plugin", env("MT_PLUGIN_LOCAL"), true), 0);
}

/* The runtime itself opened RTLD_LOCAL, its entry points found by dlsym (ctypes): a bad
 * copy's cudaErrorInvalidMemcpyDirection must reach cudaGetLastError. */
static void test_runtime_opened_local(void **state)
{
    (void)state;
    assert_int_equal(run_local("direct", env("MT_FAKE_CUDART"), false), 0);
    assert_int_equal(run_local("direct", env("MT_FAKE_CUDART"), true), 0);
}

/* After cudaFree(0) on the main thread, a new thread's first cudaMalloc leaves a current
 * context there, as the runtime does: a driver memset on the block works. */
static void test_thread_malloc_binds_context(void **state)
{
    (void)state;
    assert_int_equal(run("threadctx", NULL), 0);
}

/* A context made with cuCtxCreate gets memory its own kernels may use: with plain
 * segments (cuMemAlloc memory, owned by the primary context) and with the default
 * expandable ones (VMM mappings, open to every context of the device). */
static void test_created_context_memory_is_its_own(void **state)
{
    (void)state;
    assert_int_equal(run("ctxcreate", "MEMTRACE_ALLOC_CONF=rules:reference"), 0);
    assert_int_equal(run("ctxcreate", NULL), 0);
}

/* A refused cuCtxDestroy of the primary context leaves memtrace's blocks in place. */
static void test_refused_destroy_keeps_blocks(void **state)
{
    (void)state;
    assert_int_equal(run("destroyrefused", NULL), 0);
}

/* The value of "key": in an NDJSON line (a number, or a string without quotes in buf). */
static long long num_field(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    return p != NULL ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

static const char *str_field(const char *line, const char *key, char *buf, size_t len)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *p = strstr(line, pat);
    buf[0] = '\0';
    if (p != NULL) {
        p += strlen(pat);
        size_t n = strcspn(p, "\"");
        snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), p);
    }
    return buf;
}

/* Device memory the drop-in forwards to the driver is reported by the library that asked
 * (the module its hook returns to): libfakenccl.so's cuMemAllocPitch and cuMemCreate
 * (counted from create to release), its pitched memory through a runtime entry point
 * memtrace does not hook (the runtime is looked through, up to the library), and the
 * program's own cudaMallocPitch and its cuMemAlloc/cudaMalloc under a context it made.
 * Each free carries its allocation's size and library. */
static void test_outside_named_by_library(void **state)
{
    (void)state;
    char path[] = "/tmp/mt-outside-cuda-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    char extra[256];
    snprintf(extra, sizeof extra, "MEMTRACE_PROF=log MEMTRACE_LOG='%s'", path);
    assert_int_equal(run("outside", extra), 0);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096], names[32][64] = {{0}};
    long long nccl = 0, prog = 0, nccl_freed = 0, prog_freed = 0, after_create = 0;
    bool want_device = false;
    while (fgets(line, sizeof line, f) != NULL) {
        char kind[32], label[64];
        str_field(line, "kind", kind, sizeof kind);
        long long id = num_field(line, "library_id"), size = num_field(line, "size");
        if (strcmp(kind, "library_label") == 0) {
            assert_true(id > 0 && id < 32);
            snprintf(names[id], sizeof names[id], "%s", str_field(line, "label", label, 64));
            continue;
        }
        if (strcmp(kind, "device") == 0 && want_device) {
            /* the fake driver has no context: used = memtrace's segments + outside */
            assert_int_equal(size, num_field(line, "reserved") + (8 << 20) + (2 << 20));
            after_create++;
            want_device = false;
        }
        bool alloc = strcmp(kind, "outside_alloc") == 0;
        if (!alloc && strcmp(kind, "outside_free") != 0)
            continue;
        assert_true(id > 0 && id < 32);
        const char *who = names[id];
        if (strcmp(who, "libfakenccl.so") == 0) {
            assert_true(size == 8 << 20 || size == 2 << 20 || size == 1 << 20);
            if (alloc)
                nccl += size;
            else
                nccl_freed += size;
            want_device = alloc && size == 2 << 20 && nccl == (8 << 20) + (2 << 20);
        } else if (strcmp(who, "prog_gpurt") == 0) {
            /* 512 rows of a 1024-byte pitch; cuMemAlloc and cudaMalloc under a context
             * the program made */
            assert_true(size == 512 << 10 || size == 3 << 20 || size == 4 << 20);
            if (alloc)
                prog += size;
            else
                prog_freed += size;
        } else {
            fprintf(stderr, "outside memory named %s (id %lld)\n", who, id);
            fail();
        }
    }
    fclose(f);
    unlink(path);
    assert_int_equal(nccl, 11 << 20);
    assert_int_equal(nccl_freed, 11 << 20);
    assert_int_equal(prog, (512 << 10) + (7 << 20));
    assert_int_equal(prog_freed, (512 << 10) + (7 << 20));
    assert_int_equal(after_create, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_makes_no_context),
        cmocka_unit_test(test_async_alloc_on_stream_device),
        cmocka_unit_test(test_own_pool_goes_to_driver),
        cmocka_unit_test(test_peer_already_enabled_grants),
        cmocka_unit_test(test_record_stream_per_thread),
        cmocka_unit_test(test_per_thread_stream_and_proc_flags),
        cmocka_unit_test(test_reset_drops_cache),
        cmocka_unit_test(test_sticky_error_on_cache_hit),
        cmocka_unit_test(test_sticky_error_on_cache_hit_driver),
        cmocka_unit_test(test_foreign_frees_forwarded),
        cmocka_unit_test(test_free_async_stream0_runtime),
        cmocka_unit_test(test_capture_no_malloc_and_refused_frees),
        cmocka_unit_test(test_last_error_as_runtime),
        cmocka_unit_test(test_fork_child_starts_clean),
        cmocka_unit_test(test_foreign_oom_releases_cache),
        cmocka_unit_test(test_managed_served_and_attach_host_forwarded),
        cmocka_unit_test(test_block_queries_and_ipc),
        cmocka_unit_test(test_static_runtime_path),
        cmocka_unit_test(test_double_free_not_forwarded),
        cmocka_unit_test(test_free_null_binds_context),
        cmocka_unit_test(test_record_stream_default),
        cmocka_unit_test(test_ordered_free_no_device_sync),
        cmocka_unit_test(test_runtime_lookups_cached),
        cmocka_unit_test(test_early_mark_makes_no_context),
        cmocka_unit_test(test_runtime_in_plugin_scope),
        cmocka_unit_test(test_runtime_opened_local),
        cmocka_unit_test(test_thread_malloc_binds_context),
        cmocka_unit_test(test_created_context_memory_is_its_own),
        cmocka_unit_test(test_refused_destroy_keeps_blocks),
        cmocka_unit_test(test_outside_named_by_library),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
