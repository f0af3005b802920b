/* The preload drop-in end to end: unmodified programs (prog_*.c, linked against the
 * shared libcudart or dlopen'ing the driver) run under `memtrace run` on this GPU-less
 * machine; their exit status, their data checks, the summary and the profiler's local
 * event log are asserted. Paths come from the environment (tests/preload/meson.build). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include "tests/common/test_main.h"
#include "tests/common/test_text.h"
#if __has_include(<cuda.h>)
#include <cuda.h>
#endif
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

static char dir[256];

static const char *env(const char *name)
{
    const char *v = getenv(name);
    assert_non_null(v);
    return v;
}

static int group_setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/mt-preload-test-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Runs `sh -c cmd` with stdout+stderr into dir/name.out; returns the exit status. */
static int sh(const char *name, const char *cmd)
{
    char full[4096];
    snprintf(full, sizeof full, "cd '%s' && { %s ; } >'%s/%s.out' 2>&1", dir, cmd, dir, name);
    int st = system(full);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static char *slurp(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static json_t *summary(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_error_t e;
    json_t *s = json_load_file(path, 0, &e);
    assert_non_null(s);
    return s;
}

static long long jint(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    assert_non_null(v);
    return (long long)json_number_value(v);
}

static void run_prog(const char *tag, const char *prog, const char *extra, int want_rc)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s' run --backend sim --telemetry log --log %s.ndjson --summary-json %s.json %s "
             "-- '%s'",
             env("MT_MEMTRACE"), tag, tag, extra, prog);
    int rc = sh(tag, cmd);
    if (rc != want_rc) {
        char name[64];
        snprintf(name, sizeof name, "%s.out", tag);
        fprintf(stderr, "%s", slurp(name));
    }
    assert_int_equal(rc, want_rc);
}

/* Without the preload the runtime program cannot even count devices here: proof that
 * what passes below is memtrace serving it. */
static void test_runtime_fails_without_memtrace(void **state)
{
    (void)state;
    void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (drv != NULL) { /* a real driver: the bare program may well succeed */
        dlclose(drv);
        skip();
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s'", env("MT_PROG_RUNTIME"));
    assert_int_not_equal(sh("bare", cmd), 0);
}

static void test_runtime_program(void **state)
{
    (void)state;
    run_prog("rt", env("MT_PROG_RUNTIME"), "", 0);
    char *out = slurp("rt.out");
    assert_non_null(strstr(out, "ok: 17 device allocations"));
    /* everything freed: the cache counts as free memory, so free == total on sim */
    size_t fr = 0, tot = 0;
    const char *mi = strstr(out, "meminfo: ");
    assert_non_null(mi);
    assert_int_equal(sscanf(mi, "meminfo: free=%zu total=%zu", &fr, &tot), 2);
    assert_true(tot > 0);
    assert_int_equal(fr, tot);
    assert_non_null(strstr(out, "exited with status 0"));
    assert_non_null(strstr(out, "backend calls saved"));
    json_t *s = summary("rt.json");
    assert_string_equal(json_string_value(json_object_get(s, "backend")), "sim");
    assert_int_equal(jint(s, "requests"), 17);
    assert_int_equal(jint(s, "frees"), 17);
    assert_true(jint(s, "backend_mallocs") < 17); /* the cache served the rest */
    assert_int_equal(jint(s, "ooms"), 0);
    assert_int_equal(jint(s, "host_allocs"), 1);
    assert_int_equal(jint(json_object_get(s, "events"), "alloc"), 17);
    /* the recorder's count: what it was offered, and none dropped, in the default mode */
    assert_true(jint(s, "events_emitted") >= 17 * 3);
    assert_int_equal(jint(s, "events_dropped"), 0);
    assert_true(json_is_false(json_object_get(s, "lossless")));
    char line[96];
    snprintf(line, sizeof line, "events dropped    none of %lld\n", jint(s, "events_emitted"));
    assert_non_null(strstr(out, line));
    json_decref(s);
    /* the profiler's log saw every allocation and every free */
    char *log = slurp("rt.ndjson");
    assert_int_equal(mt_test_count(log, "\"kind\":\"alloc\""), 17);
    assert_int_equal(mt_test_count(log, "\"kind\":\"free_requested\""), 17);
    assert_int_equal(mt_test_count(log, "\"kind\":\"stats\""), 1); /* final totals at exit */
}

/* --lossless reaches the recorder (MEMTRACE_PROF_LOSSLESS) and the summary says so. */
static void test_lossless_run(void **state)
{
    (void)state;
    run_prog("rtl", env("MT_PROG_RUNTIME"), "--lossless", 0);
    char *out = slurp("rtl.out");
    json_t *s = summary("rtl.json");
    assert_true(json_is_true(json_object_get(s, "lossless")));
    assert_int_equal(jint(s, "events_dropped"), 0);
    assert_int_equal(jint(s, "lossless_stalls"), 0);
    assert_non_null(strstr(out, "(lossless)\n"));
    json_decref(s);
}

/* Issue 15 item 2: an unmodified runtime program on 2 sim devices. Each thread's current
 * device picks that device's allocator, cudaMemGetInfo answers for the current device,
 * and the log carries each allocation's device. */
static void test_two_devices(void **state)
{
    (void)state;
    run_prog("devs", env("MT_PROG_DEVICES"), "--devices 2 --capacity 1G", 0);
    char *out = slurp("devs.out");
    assert_non_null(strstr(out, "devices: 2"));
    assert_non_null(strstr(out, "ok\n"));
    size_t fr[2], tot[2];
    for (int d = 0; d < 2; d++) {
        char key[16];
        snprintf(key, sizeof key, "dev%d: ", d);
        const char *p = strstr(out, key);
        assert_non_null(p);
        assert_int_equal(sscanf(p + strlen(key), "free=%zu total=%zu", &fr[d], &tot[d]), 2);
        assert_int_equal(tot[d], (size_t)1 << 30);
    }
    assert_int_equal(tot[0] - fr[0], (size_t)3 << 20); /* device 0 holds 3 MiB */
    assert_int_equal(tot[1] - fr[1], (size_t)5 << 20); /* device 1 holds 5 MiB */
    char *log = slurp("devs.ndjson");
    size_t on[2] = {0, 0};
    for (const char *p = strstr(log, "\"kind\":\"alloc\""); p;
         p = strstr(p + 1, "\"kind\":\"alloc\"")) {
        const char *line = p;
        while (line > log && line[-1] != '\n')
            line--;
        const char *dv = strstr(line, "\"dev\":");
        assert_non_null(dv);
        on[atoi(dv + 6) == 1]++;
    }
    assert_int_equal(on[0], 1);
    assert_int_equal(on[1], 1);
    /* report and plot: per device from the one model; the process's figures are sums */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' report --json devs.ndjson > devs.report.json",
             env("MT_MEMTRACE"));
    assert_int_equal(sh("devs_report", cmd), 0);
    json_t *rep = summary("devs.report.json");
    json_t *proc = json_array_get(json_object_get(rep, "processes"), 0);
    json_t *dv = json_object_get(proc, "devices");
    assert_int_equal(json_array_size(dv), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *d = json_array_get(dv, i);
        assert_int_equal(jint(d, "device"), (long long)i);
        assert_int_equal(jint(d, "peak_allocated"), (long long)((i ? 5 : 3) << 20));
        assert_int_equal(jint(d, "final_allocated"), 0);
    }
    assert_int_equal(jint(proc, "peak_allocated"), 8 << 20); /* both live at once */
    json_decref(rep);
    snprintf(cmd, sizeof cmd, "'%s' report devs.ndjson", env("MT_MEMTRACE"));
    assert_int_equal(sh("devs_text", cmd), 0);
    char *text = slurp("devs_text.out");
    assert_non_null(strstr(text, "by device"));
    assert_non_null(strstr(text, "device 1   peak allocated 5.0 MiB"));
    snprintf(cmd, sizeof cmd, "'%s' plot -o devs.svg devs.ndjson", env("MT_MEMTRACE"));
    assert_int_equal(sh("devs_plot", cmd), 0);
    char *svg = slurp("devs.svg");
    assert_int_equal(mt_test_count(svg, "class=\"lane\""), 2);
    assert_non_null(strstr(svg, "device 1: peak allocated 5.0 MiB"));
    /* the driver's context stack: a pushed primary context picks its device's allocator */
    char prog[1024];
    snprintf(prog, sizeof prog, "%s' 'devices", env("MT_PROG_DRIVER"));
    run_prog("devs_drv", prog, "--devices 2 --capacity 1G", 0);
    out = slurp("devs_drv.out");
    assert_non_null(strstr(out, "ok: pushed and popped"));
    for (int d = 0; d < 2; d++) {
        char key[16];
        snprintf(key, sizeof key, "dev%d: ", d);
        const char *p = strstr(out, key);
        assert_non_null(p);
        assert_int_equal(sscanf(p + strlen(key), "free=%zu total=%zu", &fr[d], &tot[d]), 2);
    }
    assert_int_equal(tot[0] - fr[0], (size_t)1 << 20);
    assert_int_equal(tot[1] - fr[1], (size_t)2 << 20);
    /* a device count the sim does not model is refused before the program runs */
    snprintf(cmd, sizeof cmd, "'%s' run --backend sim --devices 2x -- /bin/true",
             env("MT_MEMTRACE"));
    assert_int_equal(sh("devs_bad", cmd), 2);
    assert_non_null(strstr(slurp("devs_bad.out"), "MEMTRACE_SIM_DEVICES"));
}

/* With a daemon running, the daemon receives every allocation of the program. */
static void test_daemon_sees_every_allocation(void **state)
{
    (void)state;
    char sock[300], log[300];
    snprintf(sock, sizeof sock, "%s/mt.sock", dir);
    snprintf(log, sizeof log, "%s/daemon.ndjson", dir);
    pid_t d = fork();
    assert_true(d >= 0);
    if (d == 0) {
        execl(env("MT_MEMTRACE"), "memtrace", "daemon", "--socket", sock, "--port", "off", "--log",
              log, "--foreground", "--quiet", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100 && access(sock, F_OK) != 0; i++)
        usleep(50 * 1000);
    assert_int_equal(access(sock, F_OK), 0);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "MEMTRACE_SOCKET='%s' '%s' run --backend sim --telemetry daemon -- '%s'", sock,
             env("MT_MEMTRACE"), env("MT_PROG_RUNTIME"));
    assert_int_equal(sh("dmn", cmd), 0);
    assert_non_null(strstr(slurp("dmn.out"), "-> daemon"));
    /* The daemon drains the ring of the exited process; wait for it (bounded). */
    size_t n = 0;
    for (int i = 0; i < 100 && n < 17; i++) {
        FILE *f = fopen(log, "r");
        if (f != NULL) {
            fclose(f);
            n = mt_test_count(slurp("daemon.ndjson"), "\"kind\":\"alloc\"");
        }
        if (n < 17)
            usleep(50 * 1000);
    }
    kill(d, SIGTERM);
    int st = 0;
    waitpid(d, &st, 0);
    assert_int_equal(n, 17);
    char *all = slurp("daemon.ndjson");
    assert_int_equal(mt_test_count(all, "\"kind\":\"alloc\""), 17);
    assert_int_equal(mt_test_count(all, "\"kind\":\"free_requested\""), 17);
}

static void test_driver_program_via_get_proc_address(void **state)
{
    (void)state;
    const char *vers[] = {"", "v1"};
    for (int k = 0; k < 2; k++) {
        char prog[1024], tag[16];
        snprintf(prog, sizeof prog, "%s' '%s", env("MT_PROG_DRIVER"), vers[k]);
        snprintf(tag, sizeof tag, "drv%d", k);
        run_prog(tag, prog, "", 0);
        char name[32];
        snprintf(name, sizeof name, "%s.out", tag);
        char *out = slurp(name);
        assert_non_null(
            strstr(out, k == 0 ? "through cuGetProcAddress_v2" : "through cuGetProcAddress\n"));
        snprintf(name, sizeof name, "%s.json", tag);
        json_t *s = summary(name);
        assert_int_equal(jint(s, "requests"), 5);
        assert_int_equal(jint(s, "frees"), 5);
        assert_int_equal(jint(s, "unknown_frees"), 1);
        json_decref(s);
        snprintf(name, sizeof name, "%s.ndjson", tag);
        assert_int_equal(mt_test_count(slurp(name), "\"kind\":\"alloc\""), 5);
    }
}

static void test_oom_is_reported(void **state)
{
    (void)state;
    run_prog("oom", env("MT_PROG_OOM"), "--capacity 256M", 3);
    char *out = slurp("oom.out");
    assert_non_null(strstr(out, "cudaMalloc #4: out of memory (cudaErrorMemoryAllocation)"));
    assert_non_null(strstr(out, "tried to allocate 64.00 MiB"));
    assert_non_null(strstr(out, "out of memory     YES"));
    assert_non_null(strstr(out, "exited with status 3"));
    json_t *s = summary("oom.json");
    assert_int_equal(jint(s, "ooms"), 1);
    assert_int_equal(jint(s, "capacity"), 256ll << 20);
    assert_non_null(strstr(json_string_value(json_object_get(s, "oom_message")), "64.00 MiB"));
    json_decref(s);
    assert_int_equal(mt_test_count(slurp("oom.ndjson"), "\"kind\":\"oom\""), 1);
}

static void test_unknown_free(void **state)
{
    (void)state;
    run_prog("bad", env("MT_PROG_BADFREE"), "", 0);
    assert_non_null(strstr(slurp("bad.out"), "rejected with cudaErrorInvalidValue"));
    json_t *s = summary("bad.json");
    assert_int_equal(jint(s, "unknown_frees"), 2);
    json_decref(s);
}

/* Exit status passthrough, and 128 + N for a signal. */
static void test_exit_status(void **state)
{
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' run --quiet -- sh -c 'exit 7'", env("MT_MEMTRACE"));
    assert_int_equal(sh("st", cmd), 7);
    snprintf(cmd, sizeof cmd, "'%s' run --quiet -- sh -c 'kill -TERM $$'", env("MT_MEMTRACE"));
    assert_int_equal(sh("sig", cmd), 128 + 15);
    snprintf(cmd, sizeof cmd, "'%s' run --backend gpu -- true", env("MT_MEMTRACE"));
    assert_int_equal(sh("usage", cmd), 2);
    /* Values the preload could only warn about are refused before the program runs. */
    snprintf(cmd, sizeof cmd, "'%s' run --capacity 2X -- touch ran1", env("MT_MEMTRACE"));
    assert_int_equal(sh("badcap", cmd), 2);
    assert_non_null(strstr(slurp("badcap.out"), "'2X' (--capacity)"));
    snprintf(cmd, sizeof cmd, "'%s' run --alloc-conf nosuch:1 -- touch ran2", env("MT_MEMTRACE"));
    assert_int_equal(sh("badconf", cmd), 2);
    assert_non_null(strstr(slurp("badconf.out"), "'nosuch'"));
    snprintf(cmd, sizeof cmd, "'%s' run --telemetry loud -- touch ran3", env("MT_MEMTRACE"));
    assert_int_equal(sh("badtel", cmd), 2);
    assert_non_null(strstr(slurp("badtel.out"), "'loud'"));
    snprintf(cmd, sizeof cmd, "test ! -e ran1 && test ! -e ran2 && test ! -e ran3");
    assert_int_equal(sh("notrun", cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' run --help", env("MT_MEMTRACE"));
    assert_int_equal(sh("help", cmd), 0);
    assert_non_null(strstr(slurp("help.out"), "examples:"));
}

/* cuda mode through LD_PRELOAD, on the fake driver (the only driver here): the
 * program's cudaMalloc lands in the allocator over the cuda backend, and the fake's
 * out-of-memory answer reaches the program as cudaErrorMemoryAllocation. */
static void test_cuda_mode_on_fake_driver(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "MEMTRACE_LIBCUDA='%s' '%s' run --backend cuda --telemetry off "
             "--summary-json cu.json -- '%s'",
             env("MT_FAKE_CUDA"), env("MT_MEMTRACE"), env("MT_PROG_OOM"));
    assert_int_equal(sh("cu", cmd), 3);
    char *out = slurp("cu.out");
    assert_non_null(strstr(out, "cudaMalloc #1: out of memory (cudaErrorMemoryAllocation)"));
    json_t *s = summary("cu.json");
    assert_string_equal(json_string_value(json_object_get(s, "backend")), "cuda");
    assert_int_equal(jint(s, "capacity"), 64ll << 20); /* the fake's default device */
    assert_int_equal(jint(s, "requests"), 1);
    assert_int_equal(jint(s, "ooms"), 1);
    json_decref(s);
}

/* PyTorch's entry points in cuda mode, against the fake driver: the preload's
 * allocator sits on the cuda backend and the fake sees one segment for many requests. */
static void test_torch_entry_points_on_fake_driver(void **state)
{
    (void)state;
    setenv("MEMTRACE_LIBCUDA", env("MT_FAKE_CUDA"), 1);
    setenv("MEMTRACE_BACKEND", "cuda", 1);
    setenv("MEMTRACE_PROF", "off", 1);
    setenv("MEMTRACE_LOG_LEVEL", "quiet", 1);
    setenv("MEMTRACE_ALLOC_CONF", "rules:reference", 1); /* one plain segment, counted below */
    void *fake = dlopen(env("MT_FAKE_CUDA"), RTLD_NOW | RTLD_LOCAL);
    assert_non_null(fake);
    void (*reset)(size_t, int) = (void (*)(size_t, int))dlsym(fake, "fake_cuda_reset");
    assert_non_null(reset);
    reset((size_t)64 << 20, 20); /* more devices than the drop-in once served (16) */
    void *pre = dlopen(env("MT_PRELOAD"), RTLD_NOW | RTLD_LOCAL);
    assert_non_null(pre);
    void *(*alloc)(ssize_t, int, void *) =
        (void *(*)(ssize_t, int, void *))dlsym(pre, "memtrace_alloc");
    void (*dfree)(void *, ssize_t, int, void *) =
        (void (*)(void *, ssize_t, int, void *))dlsym(pre, "memtrace_free");
    size_t (*calls)(const char *) = (size_t(*)(const char *))dlsym(fake, "fake_cuda_count");
    void *(*shadow)(const void *) = (void *(*)(const void *))dlsym(fake, "fake_cuda_shadow");
    assert_non_null(shadow);
    assert_non_null(alloc);
    assert_non_null(dfree);
    assert_non_null(calls);
    void *p[10];
    for (int i = 0; i < 10; i++) {
        p[i] = alloc(1000 + i * 100, 0, NULL);
        assert_non_null(p[i]);
        memset(shadow(p[i]), i, 1000); /* device memory: only through the fake's backdoor */
    }
    for (int i = 0; i < 10; i++)
        dfree(p[i], 1000 + i * 100, 0, NULL);
    void *again = alloc(5000, 0, NULL);
    assert_non_null(again);
    dfree(again, 5000, 0, NULL);
    assert_int_equal(calls("cuMemAlloc_v2"), 1); /* 11 requests, one device malloc */
    assert_null(alloc(-1, 0, NULL));
    void *p17 = alloc(100, 17, NULL); /* device 17 of 20 works */
    assert_non_null(p17);
    dfree(p17, 100, 17, NULL);
    assert_null(alloc(100, 20, NULL)); /* the fake has 20 devices */

#ifdef CUDA_VERSION
    /* The driver entry points, as the runtime would call them. Without a current context
     * the driver refuses, and so must the drop-in: no device 0. */
    CUresult (*cu_alloc)(CUdeviceptr *, size_t) =
        (CUresult(*)(CUdeviceptr *, size_t))dlsym(pre, "cuMemAlloc_v2");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))dlsym(fake, "cuDevicePrimaryCtxRetain");
    CUresult (*push)(CUcontext) = (CUresult(*)(CUcontext))dlsym(fake, "cuCtxPushCurrent_v2");
    CUresult (*pop)(CUcontext *) = (CUresult(*)(CUcontext *))dlsym(fake, "cuCtxPopCurrent_v2");
    void (*inject)(const char *, unsigned, CUresult) =
        (void (*)(const char *, unsigned, CUresult))dlsym(fake, "fake_cuda_fail");
    assert_true(cu_alloc && retain && push && pop && inject);
    CUdeviceptr d = 0;
    assert_int_equal(cu_alloc(&d, 4096), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext ctx;
    assert_int_equal(retain(&ctx, 0), CUDA_SUCCESS);
    assert_int_equal(push(ctx), CUDA_SUCCESS);
    assert_int_equal(cu_alloc(&d, 4096), CUDA_SUCCESS);
    /* the driver's own failure comes back as it is, not as CUDA_ERROR_UNKNOWN (item 8) */
    inject("cuMemAlloc_v2", 1000, CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(cu_alloc(&d, (size_t)48 << 20), CUDA_ERROR_ILLEGAL_ADDRESS);
    inject("cuMemAlloc_v2", 0, CUDA_SUCCESS);
    /* cuMemFreeAsync(p, NULL) is ordered after the legacy stream's work (item 4): while
     * that work is held, the block is not handed to another stream's allocation. */
    CUresult (*mk)(CUstream *, unsigned) =
        (CUresult(*)(CUstream *, unsigned))dlsym(pre, "cuStreamCreate");
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) =
        (CUresult(*)(CUdeviceptr *, size_t, CUstream))dlsym(pre, "cuMemAllocAsync");
    CUresult (*free_async)(CUdeviceptr, CUstream) =
        (CUresult(*)(CUdeviceptr, CUstream))dlsym(pre, "cuMemFreeAsync");
    CUresult (*sync_stream)(CUstream) = (CUresult(*)(CUstream))dlsym(pre, "cuStreamSynchronize");
    void (*hold)(bool) = (void (*)(bool))dlsym(fake, "fake_cuda_hold");
    assert_true(mk && alloc_async && free_async && sync_stream && hold);
    CUstream sa;
    assert_int_equal(mk(&sa, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr pa = 0, pb = 0;
    assert_int_equal(alloc_async(&pa, 1 << 20, sa), CUDA_SUCCESS);
    hold(true); /* the legacy stream's work (a kernel using pa, say) stays pending */
    assert_int_equal(free_async(pa, NULL), CUDA_SUCCESS);
    assert_int_equal(alloc_async(&pb, 1 << 20, sa), CUDA_SUCCESS);
    assert_true(pb != pa);
    hold(false);
    assert_int_equal(free_async(pb, sa), CUDA_SUCCESS);
    assert_int_equal(sync_stream(sa), CUDA_SUCCESS);
    assert_int_equal(pop(&ctx), CUDA_SUCCESS);
#endif
}

/* The program's own managed memory: cudaMallocManaged attached globally is served by a
 * managed allocator of the device, its prefetches and advice are recorded (managed
 * events, the summary's and the report's figures), cudaFree finds the block; attached to
 * the host it goes to the driver, which sim has not. */
static void test_managed_program(void **state)
{
    (void)state;
    run_prog("man", env("MT_PROG_MANAGED"), "", 0);
    char *out = slurp("man.out");
    assert_non_null(strstr(out, "ok: managed 6291456 bytes"));
    assert_non_null(strstr(out, "attach-host: cudaErrorNotSupported"));
    json_t *s = summary("man.json");
    json_t *m = json_object_get(s, "managed");
    assert_non_null(m);
    assert_int_equal(jint(m, "requests"), 1);
    assert_int_equal(jint(m, "peak_allocated"), 6 << 20);
    assert_int_equal(jint(m, "allocated"), 0);  /* cudaFree found it */
    assert_int_equal(jint(m, "prefetches"), 2); /* the one beyond the block was refused */
    assert_int_equal(jint(m, "advises"), 1);
    assert_int_equal(jint(s, "unknown_frees"), 0);
    assert_true(jint(json_object_get(s, "events"), "managed") >= 3);
    json_decref(s);
    char *log = slurp("man.ndjson");
    assert_non_null(strstr(log, "\"kind\":\"alloc\""));
    assert_non_null(strstr(log, "\"size\":6291456,\"requested\":6291456"));
    assert_int_equal(mt_test_count(log, "\"kind\":\"free_requested\""), 1);
    assert_true(mt_test_count(log, "\"kind\":\"managed\"") >= 3);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' report --json man.ndjson > man.report.json",
             env("MT_MEMTRACE"));
    assert_int_equal(sh("man_report", cmd), 0);
    json_t *rep = summary("man.report.json");
    json_t *proc = json_array_get(json_object_get(rep, "processes"), 0);
    json_t *rm = json_object_get(proc, "managed");
    assert_non_null(rm);
    assert_int_equal(jint(rm, "prefetches"), 2);
    assert_int_equal(jint(rm, "prefetch_bytes"), (6 << 20) + (3 << 20));
    assert_int_equal(jint(rm, "advises"), 1);
    assert_int_equal(jint(rm, "device_peak_bytes"), 6 << 20);
    json_decref(rep);
}

/* Device memory outside the allocator, named by library: libfakenccl.so takes 48 MiB from
 * the driver (cuMemAllocPitch through cuGetProcAddress, as NCCL does), which sim serves
 * from the backend directly as the driver would; the program takes 2 MiB of pitched
 * memory itself. The log names both, the device's used bytes are the context, the
 * allocator's reserved bytes and the libraries', and every free is matched, the last one
 * by a device reset. */
#define MIB (1ll << 20)
static void test_outside_by_library(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "MEMTRACE_SIM_CONTEXT=300M '%s' run --backend sim --capacity 2G --telemetry log "
             "--log out.ndjson --summary-json out.json -- '%s'",
             env("MT_MEMTRACE"), env("MT_PROG_OUTSIDE"));
    int rc = sh("out", cmd);
    if (rc != 0)
        fprintf(stderr, "%s", slurp("out.out"));
    assert_int_equal(rc, 0);
    assert_non_null(strstr(slurp("out.out"), "ok: outside 48 MiB"));
    json_t *s = summary("out.json");
    assert_int_equal(jint(s, "unknown_frees"), 1); /* the second cudaFree of the library's */
    json_decref(s);

    char *log = slurp("out.ndjson");
    long long lib = -1, prog = -1, nccl_allocs = 0, nccl_bytes = 0, nccl_freed = 0;
    long long prog_bytes = 0, prog_freed = 0, labels = 0, checked = 0, last_used = -1;
    long long last_reserved = -1;
    uint64_t addr[3] = {0, 0, 0};
    bool after_second = false;
    for (char *line = strtok(log, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        json_error_t e;
        json_t *ev = json_loads(line, 0, &e);
        assert_non_null(ev);
        const char *kind = json_string_value(json_object_get(ev, "kind"));
        long long id = (long long)json_integer_value(json_object_get(ev, "library_id"));
        long long size = (long long)json_integer_value(json_object_get(ev, "size"));
        const char *a = json_string_value(json_object_get(ev, "addr"));
        uint64_t at = a != NULL ? strtoull(a, NULL, 16) : 0;
        if (kind != NULL && strcmp(kind, "library_label") == 0) {
            const char *label = json_string_value(json_object_get(ev, "label"));
            labels++;
            if (strcmp(label, "libfakenccl.so") == 0)
                lib = id;
            else if (strcmp(label, "prog_outside") == 0)
                prog = id;
        } else if (kind != NULL && strcmp(kind, "outside_alloc") == 0) {
            assert_true(id == lib || id == prog); /* named before it is used */
            if (id == lib) {
                static const long long want[3] = {32 * MIB, 16 * MIB, 4 * MIB};
                assert_true(nccl_allocs < 3);
                assert_int_equal(size, want[nccl_allocs]);
                addr[nccl_allocs++] = at;
                nccl_bytes += size;
                after_second = nccl_allocs == 2;
            } else {
                assert_int_equal(size, 2 * MIB); /* 2048 rows of a 1024-byte pitch */
                prog_bytes += size;
            }
        } else if (kind != NULL && strcmp(kind, "outside_free") == 0) {
            assert_true(id == lib || id == prog); /* tagged as at its allocation */
            if (id == lib) { /* the library's part, the program's cudaFree, the reset */
                static const long long want[3] = {16 * MIB, 32 * MIB, 4 * MIB};
                static const int which[3] = {1, 0, 2};
                assert_true(nccl_freed < 3);
                assert_int_equal(size, want[nccl_freed]);
                assert_true(at == addr[which[nccl_freed]]);
                nccl_freed++;
            } else {
                assert_int_equal(size, 2 * MIB);
                prog_freed += size;
            }
        } else if (kind != NULL && strcmp(kind, "device") == 0) {
            last_used = size;
            last_reserved = (long long)json_integer_value(json_object_get(ev, "reserved"));
            assert_int_equal(json_integer_value(json_object_get(ev, "requested")), 2048 * MIB);
            if (after_second) { /* the device right after the library's 48 MiB */
                assert_int_equal(size, 300 * MIB + last_reserved + 48 * MIB);
                assert_true(last_reserved >= 8 * MIB); /* the program's cudaMalloc */
                checked++;
                after_second = false;
            }
        }
        json_decref(ev);
    }
    assert_int_equal(labels, 2);
    assert_true(lib > 0 && prog > 0 && lib != prog);
    assert_int_equal(nccl_bytes, 52 * MIB);
    assert_int_equal(nccl_freed, 3); /* all, in that order */
    assert_int_equal(prog_bytes, 2 * MIB);
    assert_int_equal(prog_freed, 2 * MIB);
    assert_int_equal(checked, 1);
    /* all given back: the device holds the context and the allocator's cache only */
    assert_int_equal(last_used, 300 * MIB + last_reserved);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtime_fails_without_memtrace),
        cmocka_unit_test(test_runtime_program),
        cmocka_unit_test(test_lossless_run),
        cmocka_unit_test(test_two_devices),
        cmocka_unit_test(test_managed_program),
        cmocka_unit_test(test_outside_by_library),
        cmocka_unit_test(test_daemon_sees_every_allocation),
        cmocka_unit_test(test_driver_program_via_get_proc_address),
        cmocka_unit_test(test_oom_is_reported),
        cmocka_unit_test(test_unknown_free),
        cmocka_unit_test(test_exit_status),
        cmocka_unit_test(test_cuda_mode_on_fake_driver),
        cmocka_unit_test(test_torch_entry_points_on_fake_driver),
    };
    return MT_TEST_RUN(tests, group_setup, group_teardown);
}
