/* `memtrace replay` as a user runs it: the memtrace binary (argv[1]) is executed on valid
 * traces (exit 0, the figures printed, JSON that parses and adds up) and on every malformed
 * case in data/invalid (exit 2, one message on stderr naming the file, line and field); the
 * host allocators' rows hold figures or one line saying why an allocator is left out, never
 * a message of the dynamic loader. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>
#include "mt_config.h"
#include "tests/common/test_main.h"

#ifndef REPLAY_DATA_DIR
#error "REPLAY_DATA_DIR must name tests/replay/data"
#endif

/* Set once by main from argv; the tests only read them. */
static const char *memtrace_path;
static const char *gen_path; /* bench/gen_rnn_trace */

typedef struct run_s {
    int status; /* exit status, or 128 + signal */
    char *out;  /* stdout, NUL-terminated, new */
    char *err;  /* stderr, NUL-terminated, new */
} run_t;

static char *read_all(FILE *f)
{
    rewind(f);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
    }
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The file the next run's standard input reads (NULL: the test's own). */
static const char *stdin_path;

/* Runs memtrace with args (NULL-terminated, after the program name). Output goes to
 * temporary files rather than pipes so a chatty child can never block. */
static run_t run_prog(const char *prog, const char *arg, va_list ap)
{
    const char *argv[16] = {prog};
    int argc = 1;
    for (const char *a = arg; a != NULL && argc < 15; a = va_arg(ap, const char *))
        argv[argc++] = a;
    argv[argc] = NULL;
    FILE *out = tmpfile(), *err = tmpfile();
    assert_true(out != NULL && err != NULL);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fileno(out), 1);
        dup2(fileno(err), 2);
        if (stdin_path != NULL && freopen(stdin_path, "rb", stdin) == NULL)
            _exit(126);
        execv(prog, (char *const *)argv);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    run_t r = {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), read_all(out), read_all(err)};
    return r;
}

/* Runs memtrace with args (NULL-terminated). */
static run_t run(const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    run_t r = run_prog(memtrace_path, arg, ap);
    va_end(ap);
    return r;
}

static run_t run_gen(const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    run_t r = run_prog(gen_path, arg, ap);
    va_end(ap);
    return r;
}

static void run_free(run_t *r)
{
    free(r->out);
    free(r->err);
}

static void data_path(char *buf, size_t n, const char *rel)
{
    snprintf(buf, n, "%s/%s", REPLAY_DATA_DIR, rel);
}

static void test_help(void **state)
{
    run_t r = run("replay", "--help", NULL);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "usage: memtrace replay FILE"));
    assert_non_null(strstr(r.out, "example:"));
    assert_non_null(strstr(r.out, "Thread,Time,Action,Pointer,Size,Stream"));
    run_free(&r);
}

static void test_usage_errors(void **state)
{
    run_t r = run("replay", NULL);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "memtrace replay: missing the trace FILE"));
    run_free(&r);
    r = run("replay", "--bogus", "x.csv", NULL);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--bogus"));
    run_free(&r);
    r = run("replay", "--capacity", "lots", "x.csv", NULL);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--capacity"));
    run_free(&r);
    r = run("replay", REPLAY_DATA_DIR "/does-not-exist.csv", NULL);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "does-not-exist.csv: cannot open"));
    run_free(&r);
}

/* An unknown allocator setting is refused, naming the key. */
static void test_bad_alloc_conf(void **state)
{
    char path[1024];
    data_path(path, sizeof path, "valid/streams.csv");
    run_t r = run("replay", path, "--alloc-conf", "no_such_key:1", NULL);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "memtrace replay: --alloc-conf"));
    assert_non_null(strstr(r.err, "no_such_key"));
    assert_string_equal(r.out, "");
    run_free(&r);
}

/* A malformed MEMTRACE_SIM_* variable is refused, naming it, not silently replaced. */
static void test_bad_env(void **state)
{
    char path[1024];
    data_path(path, sizeof path, "valid/streams.csv");
    setenv("MEMTRACE_SIM_FREE_COST_NS", "fast", 1);
    run_t r = run("replay", path, NULL);
    unsetenv("MEMTRACE_SIM_FREE_COST_NS");
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "memtrace replay: MEMTRACE_SIM_FREE_COST_NS"));
    assert_non_null(strstr(r.err, "'fast'"));
    assert_string_equal(r.out, "");
    run_free(&r);
}

static void test_text_report(void **state)
{
    char path[1024];
    data_path(path, sizeof path, "valid/streams.csv");
    run_t r = run("replay", path, NULL);
    if (r.status != 0)
        fail_msg("exit %d: %s", r.status, r.err);
    static const char *const want[] = {
        "backend                  sim",
        "events                   10 (5 allocate, 4 free, 1 allocate failure; 2 streams)",
        "peak allocated",
        "peak reserved",
        "utilization at peak",
        "fragmentation at peak",
        "backend calls",
        "retries / OOMs",
        "ns per op",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (strstr(r.out, want[i]) == NULL)
            fail_msg("missing \"%s\" in:\n%s", want[i], r.out);
    assert_string_equal(r.err, "");
    run_free(&r);
}

/* A trace compressed by zstd (in two frames), and one compressed by gzip (two members)
 * read from standard input, replay as the plain file does; jemalloc, measured by a process
 * that reads the trace again, is left out for standard input with a note. */
static void test_compressed_and_stdin(void **state)
{
    char path[1024];
    data_path(path, sizeof path, "valid/streams_2frames.csv.zst");
    run_t r = run("replay", path, NULL);
    if (r.status != 0)
        fail_msg("exit %d: %s", r.status, r.err);
    const char *events =
        "events                   10 (5 allocate, 4 free, 1 allocate failure; 2 streams)";
    assert_non_null(strstr(r.out, events));
    run_free(&r);
    data_path(path, sizeof path, "valid/streams_2members.csv.gz");
    stdin_path = path;
    r = run("replay", "-", NULL);
    stdin_path = NULL;
    if (r.status != 0)
        fail_msg("exit %d: %s", r.status, r.err);
    assert_non_null(strstr(r.out, "memtrace replay: -\n"));
    assert_non_null(strstr(r.out, events));
    if (strstr(r.out, "jemalloc") != NULL) /* (a sanitizer build leaves it out for its reason) */
        assert_true(strstr(r.out, "jemalloc left out: the trace came from standard input") ||
                    strstr(r.out, "a sanitizer build"));
    assert_string_equal(r.err, "");
    run_free(&r);
}

/* ---- the host allocators' rows ---- */

/* Words of the dynamic loader's and dlerror's messages, which a table must never show. */
static void assert_no_loader_text(const char *text)
{
    static const char *const bad[] = {
        "static TLS", "cannot open shared object", "cannot be preloaded", "ld.so", "ERROR",
        "skipped:",   "cannot allocate memory",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (strstr(text, bad[i]) != NULL)
            fail_msg("\"%s\" in:\n%s", bad[i], text);
}

/* The lines of text that contain word (at most 8, each copied into lines[i], new). */
static int lines_with(const char *text, const char *word, char *lines[8])
{
    int n = 0;
    for (const char *l = text; *l != '\0' && n < 8;) {
        const char *end = strchr(l, '\n');
        size_t len = end != NULL ? (size_t)(end - l) : strlen(l);
        char *line = strndup(l, len);
        assert_non_null(line);
        if (strstr(line, word) != NULL)
            lines[n++] = line;
        else
            free(line);
        l += len + (end != NULL);
    }
    return n;
}

/* Whether the dynamic loader can find libjemalloc.so.2 here, asked apart from memtrace. */
static bool jemalloc_installed(void)
{
    FILE *p = popen("/sbin/ldconfig -p 2>/dev/null", "r");
    char line[1024];
    bool found = false;
    while (p != NULL && fgets(line, sizeof line, p) != NULL)
        found = found || strstr(line, "libjemalloc.so.2 ") != NULL;
    if (p != NULL)
        pclose(p);
    return found;
}

/* The demo's own command (./dev.sh demo, step 3): a row with figures for jemalloc when it is
 * installed, else one line that says it is not; nothing from the loader either way. */
static void test_host_rows_demo(void **state)
{
    unsetenv("MEMTRACE_JEMALLOC");
    /* meson sets MALLOC_PERTURB_, with which glibc malloc fills every block it hands out
     * and takes back: minutes for this trace's 700 MiB. The demo runs without it. */
    char *perturb = getenv("MALLOC_PERTURB_") ? strdup(getenv("MALLOC_PERTURB_")) : NULL;
    unsetenv("MALLOC_PERTURB_");
    /* Under AddressSanitizer each of its 700 MiB costs shadow writes: minutes again. There
     * the jemalloc row is a note whatever the trace, so a small one says as much. */
    char small[1024];
    data_path(small, sizeof small, "valid/streams.csv");
    run_t r = run("replay", MT_SANITIZED ? small : TRACES_DIR "/rnn_varlen.csv", "--warmup", NULL);
    if (perturb != NULL)
        setenv("MALLOC_PERTURB_", perturb, 1);
    free(perturb);
    if (r.status != 0)
        fail_msg("exit %d: %s", r.status, r.err);
    const char *rows_from = strstr(r.out, "  machine");
    print_message("%s", rows_from != NULL ? rows_from : r.out);
    assert_no_loader_text(r.out);
    assert_string_equal(r.err, "");
    char *rows[8];
    int n = lines_with(r.out, "glibc malloc", rows);
    assert_int_equal(n, 1);
    assert_non_null(strstr(rows[0], " ns per op"));
    free(rows[0]);
    n = lines_with(r.out, "jemalloc", rows);
    assert_int_equal(n, 1);
    if (MT_SANITIZED) {
        assert_non_null(strstr(rows[0], "jemalloc left out: a sanitizer build"));
    } else if (jemalloc_installed()) {
        unsigned a, b, c;
        double ns = 0;
        if (sscanf(rows[0], " jemalloc %u.%u.%u %lf ns per op", &a, &b, &c, &ns) != 4 || ns <= 0)
            fail_msg("no figures in the jemalloc row: \"%s\"", rows[0]);
    } else {
        assert_non_null(
            strstr(rows[0], "jemalloc left out: not installed (libjemalloc.so.2 not found)"));
    }
    free(rows[0]);
    run_free(&r);
}

/* A jemalloc that is not there (MEMTRACE_JEMALLOC names a missing file): one line says so,
 * and the loader's complaint is not passed on. */
static void test_host_rows_jemalloc_absent(void **state)
{
    char path[1024];
    data_path(path, sizeof path, "valid/streams.csv");
    setenv("MEMTRACE_JEMALLOC", "/nonexistent/libjemalloc.so.2", 1);
    run_t r = run("replay", path, NULL);
    unsetenv("MEMTRACE_JEMALLOC");
    if (r.status != 0)
        fail_msg("exit %d: %s", r.status, r.err);
    assert_no_loader_text(r.out);
    assert_string_equal(r.err, "");
    char *rows[8];
    int n = lines_with(r.out, "jemalloc", rows);
    assert_int_equal(n, 1);
    if (MT_SANITIZED)
        assert_non_null(strstr(rows[0], "jemalloc left out: a sanitizer build"));
    else
        assert_non_null(strstr(rows[0], "jemalloc left out: not installed "
                                        "(/nonexistent/libjemalloc.so.2 not found)"));
    free(rows[0]);
    run_free(&r);
}

static json_t *run_json(const char *path, const char *extra)
{
    run_t r =
        extra ? run("replay", path, "--json", extra, NULL) : run("replay", path, "--json", NULL);
    if (r.status != 0)
        fail_msg("exit %d: %s", r.status, r.err);
    json_error_t je;
    json_t *o = json_loads(r.out, 0, &je);
    if (o == NULL)
        fail_msg("not JSON (%s): %s", je.text, r.out);
    run_free(&r);
    return o;
}

static int64_t jint(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        fail_msg("no integer \"%s\"", key);
    return json_integer_value(v);
}

static double jreal(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v))
        fail_msg("no number \"%s\"", key);
    return json_number_value(v);
}

/* The figures of a real trace are consistent with each other and with the trace. */
static void test_json_resnet50(void **state)
{
    json_t *o = run_json(TRACES_DIR "/somas_resnet50.csv", NULL);
    assert_string_equal(json_string_value(json_object_get(o, "backend")), "sim");
    assert_int_equal(jint(o, "events"), 2084);
    assert_int_equal(jint(o, "allocates"), 1042);
    assert_int_equal(jint(o, "frees"), 1042);
    int64_t live = jint(o, "trace_peak_live_bytes");
    int64_t alloc = jint(o, "peak_allocated_bytes");
    int64_t resv = jint(o, "peak_reserved_bytes");
    /* Rounding only adds (512 B, or a power-of-two step) and reserved covers allocated. */
    assert_true(live > 0 && alloc >= live && resv >= alloc);
    double util = jreal(o, "utilization_at_peak");
    assert_true(util > 0 && util <= 1.0);
    assert_true(fabs(util - (double)alloc / (double)resv) < 1e-4);
    double frag = jreal(o, "fragmentation_at_peak");
    assert_true(frag >= 0 && frag <= 1.0);
    assert_true(jint(o, "backend_malloc_calls") + jint(o, "backend_vm_map_calls") >= 1);
    assert_int_equal(jint(o, "num_ooms"), 0);
    assert_true(jreal(o, "ns_per_op") > 0);
    json_decref(o);
}

/* Two streams, pointer reuse, a failure row and a zero-byte allocate: the peak is exact
 * (every size here is already a multiple of 512: 2048 + 20 MiB live together). */
static void test_json_streams_exact_peak(void **state)
{
    char path[1024];
    data_path(path, sizeof path, "valid/streams.csv");
    json_t *o = run_json(path, NULL);
    assert_int_equal(jint(o, "streams"), 2);
    assert_int_equal(jint(o, "allocate_failures"), 1);
    assert_int_equal(jint(o, "trace_peak_live_bytes"), 2048 + 20971520);
    assert_int_equal(jint(o, "peak_allocated_bytes"), 2048 + 20971520);
    assert_int_equal(jint(o, "num_ooms"), 0);
    json_decref(o);
}

/* After a warm-up pass the measured replay makes no backend malloc,
 * and reports the peak it was warmed to. */
static void test_warmup_makes_no_backend_calls(void **state)
{
    json_t *o = run_json(TRACES_DIR "/rnn_varlen.csv", "--warmup");
    assert_true(json_is_true(json_object_get(o, "warmup")));
    assert_int_equal(jint(o, "backend_malloc_calls"), 0);
    assert_int_equal(jint(o, "backend_vm_map_calls"), 0);
    assert_true(jint(o, "warmup_backend_calls") >= 1);
    assert_true(jint(o, "peak_reserved_bytes") >= jint(o, "peak_allocated_bytes"));
    assert_int_equal(jint(o, "num_ooms"), 0);
    json_decref(o);
}

/* --second-pass measures a second replay on the same allocator: the first pass's calls are
 * reported apart, and a trace whose shapes repeat (the RNN one, reference rules) is served
 * from the cache the first pass left. */
static void test_second_pass(void **state)
{
    run_t r = run("replay", TRACES_DIR "/rnn_varlen.csv", "--second-pass", "--alloc-conf",
                  "rules:reference", "--json", NULL);
    if (r.status != 0)
        fail_msg("exit %d: %s", r.status, r.err);
    json_t *o = json_loads(r.out, 0, NULL);
    assert_non_null(o);
    assert_true(json_is_true(json_object_get(o, "second_pass")));
    assert_true(jint(o, "first_pass_backend_calls") >= 1);
    assert_int_equal(jint(o, "backend_malloc_calls") + jint(o, "backend_free_calls"), 0);
    assert_true(jint(o, "peak_reserved_bytes") >= jint(o, "peak_allocated_bytes"));
    json_decref(o);
    run_free(&r);
}

/* A device smaller than the trace's peak: allocations fail, are counted, nothing crashes. */
static void test_small_device_counts_ooms(void **state)
{
    run_t r = run("replay", TRACES_DIR "/somas_resnet50.csv", "--capacity", "256M", "--json", NULL);
    if (r.status != 0)
        fail_msg("exit %d: %s", r.status, r.err);
    json_t *o = json_loads(r.out, 0, NULL);
    assert_non_null(o);
    assert_true(jint(o, "num_ooms") > 0);
    assert_true(jint(o, "peak_reserved_bytes") <= 256ll << 20);
    json_decref(o);
    run_free(&r);
}

/* Sizes no device holds (up to 2^64 - 1) fail as OOMs; the sums saturate, nothing wraps. */
static void test_huge_sizes_are_ooms(void **state)
{
    char path[1024];
    data_path(path, sizeof path, "valid/huge_sizes.csv");
    json_t *o = run_json(path, NULL);
    assert_int_equal(jint(o, "num_ooms"), 2);
    assert_int_equal(jint(o, "peak_allocated_bytes"), 0);
    assert_int_equal(jint(o, "trace_leaks"), 1);
    /* 2^64 - 1 does not fit a JSON integer of jansson: it is written as a real. */
    assert_true(jreal(o, "trace_peak_live_bytes") > 1.8e19);
    json_decref(o);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *buf = calloc(1, 4096);
    assert_non_null(buf);
    size_t n = fread(buf, 1, 4095, f);
    fclose(f);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    return buf;
}

/* The committed RNN-like trace is what its generator writes: data and code cannot drift. */
static void test_rnn_trace_reproducible(void **state)
{
    char tmp[] = "/tmp/rnn_varlen_XXXXXX";
    int fd = mkstemp(tmp);
    assert_true(fd >= 0);
    close(fd);
    run_t r = run_gen(tmp, NULL);
    assert_int_equal(r.status, 0);
    run_free(&r);
    FILE *a = fopen(tmp, "rb"), *b = fopen(TRACES_DIR "/rnn_varlen.csv", "rb");
    assert_true(a != NULL && b != NULL);
    long n = 0;
    int ca, cb;
    do {
        ca = fgetc(a);
        cb = fgetc(b);
        if (ca != cb)
            fail_msg("%s differs from data/traces/rnn_varlen.csv at byte %ld", tmp, n);
        n++;
    } while (ca != EOF);
    assert_true(n > 100000);
    fclose(a);
    fclose(b);
    unlink(tmp);
}

static void test_invalid_files(void **state)
{
    char dir[1024];
    data_path(dir, sizeof dir, "invalid");
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int cases = 0;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".csv") != 0)
            continue;
        char csv[2048], errf[2048], want[2048 + 4096];
        snprintf(csv, sizeof csv, "%s/%s", dir, e->d_name);
        snprintf(errf, sizeof errf, "%s/%.*s.err", dir, (int)(len - 4), e->d_name);
        char *expected = slurp(errf);
        snprintf(want, sizeof want, "memtrace replay: %s%s", csv, expected);
        run_t r = run("replay", csv, NULL);
        if (r.status != 2 || strncmp(r.err, want, strlen(want)) != 0)
            fail_msg("%s: exit %d, stderr\n  %s\nexpected exit 2 and a line starting\n  %s",
                     e->d_name, r.status, r.err, want);
        /* One line of error, nothing on stdout. */
        assert_non_null(strchr(r.err, '\n'));
        assert_int_equal(strchr(r.err, '\n')[1], '\0');
        assert_string_equal(r.out, "");
        run_free(&r);
        free(expected);
        cases++;
    }
    closedir(d);
    assert_true(cases >= 10);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: test_replay_cli PATH-TO-memtrace PATH-TO-gen_rnn_trace\n");
        return 2;
    }
    memtrace_path = argv[1];
    gen_path = argv[2];
    /* The replay reads the allocator settings from the environment; the tests must not. */
    unsetenv("MEMTRACE_ALLOC_CONF");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_bad_alloc_conf),
        cmocka_unit_test(test_bad_env),
        cmocka_unit_test(test_text_report),
        cmocka_unit_test(test_host_rows_demo),
        cmocka_unit_test(test_host_rows_jemalloc_absent),
        cmocka_unit_test(test_json_resnet50),
        cmocka_unit_test(test_json_streams_exact_peak),
        cmocka_unit_test(test_warmup_makes_no_backend_calls),
        cmocka_unit_test(test_second_pass),
        cmocka_unit_test(test_small_device_counts_ooms),
        cmocka_unit_test(test_huge_sizes_are_ooms),
        cmocka_unit_test(test_rnn_trace_reproducible),
        cmocka_unit_test(test_invalid_files),
        cmocka_unit_test(test_compressed_and_stdin),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
