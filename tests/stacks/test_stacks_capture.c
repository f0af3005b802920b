/* Capture and interning: the caller's function comes first, sampling takes every
 * allocation >= the interval, ids are stable and interned once, the table's cap counts
 * what does not fit, the local log round-trips stack and module lines, and a library
 * loaded late resolves to its module. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "analysis/report.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/host.h"
#include "memtrace/prof.h"
#include "profiler/stack.h"
#include "tests/common/test_main.h"

static const char *late_lib_path;

typedef struct rig_s {
    char log[256];
    mt_prof_t *p;
    mt_backend_t *b;
    mt_alloc_t *a;
} rig_t;

static rig_t rig;

static void rig_up(int stacks)
{
    snprintf(rig.log, sizeof rig.log, "/tmp/mt_stacks_test_%d.ndjson", (int)getpid());
    unlink(rig.log);
    mt_prof_cfg_t cfg = mt_prof_cfg_default();
    cfg.mode = MT_PROF_LOG;
    cfg.log_path = rig.log;
    cfg.stacks = stacks;
    assert_int_equal(mt_prof_create(&rig.p, &cfg), 0);
    assert_int_equal(mt_prof_stacks(rig.p), stacks);
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    assert_int_equal(mt_backend_create(&rig.b, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = rig.b;
    ac.sink = mt_prof_sink(rig.p);
    assert_int_equal(mt_alloc_create(&rig.a, &ac), 0);
}

static void rig_down(void)
{
    mt_alloc_destroy(&rig.a);
    mt_backend_destroy(&rig.b);
    mt_prof_destroy(&rig.p);
}

/* The log's lines, parsed. */
static json_t *read_log(void)
{
    FILE *f = fopen(rig.log, "r");
    assert_non_null(f);
    json_t *all = json_array();
    char line[65536];
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        assert_non_null(j);
        json_array_append_new(all, j);
    }
    fclose(f);
    return all;
}

static const char *kind_of(const json_t *j)
{
    const char *k = json_string_value(json_object_get(j, "kind"));
    return k ? k : "";
}

static uint64_t hexv(const json_t *v)
{
    return strtoull(json_string_value(v), NULL, 16);
}

/* The stack ids of the alloc lines, in order (0: none), checking each one's stack line
 * came before it and its stack_ref line right before it. */
static size_t alloc_stacks(const json_t *all, uint32_t *ids, size_t cap)
{
    size_t n = 0, i;
    json_t *j;
    json_array_foreach(all, i, j)
    {
        if (strcmp(kind_of(j), "alloc") != 0 || n >= cap)
            continue;
        json_int_t id = json_integer_value(json_object_get(j, "stack"));
        ids[n++] = (uint32_t)id;
        if (id == 0)
            continue;
        json_t *ref = json_array_get(all, i - 1);
        assert_string_equal(kind_of(ref), "stack_ref");
        assert_int_equal(json_integer_value(json_object_get(ref, "stack")), id);
        bool defined = false;
        for (size_t k = 0; k < i && !defined; k++) {
            json_t *s = json_array_get(all, k);
            defined = strcmp(kind_of(s), "stack") == 0 &&
                      json_integer_value(json_object_get(s, "id")) == id;
        }
        assert_true(id == (json_int_t)MT_STACK_ID_OVERFLOW || defined);
    }
    return n;
}

static json_t *stack_line(const json_t *all, uint32_t id)
{
    size_t i;
    json_t *j;
    json_array_foreach(all, i, j) if (strcmp(kind_of(j), "stack") == 0 &&
                                      json_integer_value(json_object_get(j, "id")) == id) return j;
    return NULL;
}

static const char *module_of(const json_t *all, uint64_t ip)
{
    const char *path = NULL;
    size_t i;
    json_t *j;
    json_array_foreach(all, i, j)
    {
        if (strcmp(kind_of(j), "module") != 0)
            continue;
        uint64_t base = hexv(json_object_get(j, "base"));
        uint64_t size = (uint64_t)json_integer_value(json_object_get(j, "size"));
        if (ip >= base && ip - base < size)
            path = json_string_value(json_object_get(j, "path"));
    }
    return path;
}

static const char *fn_name(uint64_t ip)
{
    Dl_info di;
    return dladdr((void *)(uintptr_t)(ip - 1), &di) && di.dli_sname ? di.dli_sname : "?";
}

__attribute__((noinline)) int alloc_in_caller(size_t bytes, void **out);
__attribute__((noinline)) int alloc_in_caller(size_t bytes, void **out)
{
    int rc = mt_alloc_malloc(rig.a, bytes, NULL, MT_TAG_OTHER, out);
    __asm__ volatile("" ::: "memory");
    return rc;
}

__attribute__((noinline)) int stacks_test_site_a(void **out);
__attribute__((noinline)) int stacks_test_site_a(void **out)
{
    int rc = alloc_in_caller(4096, out);
    __asm__ volatile("" ::: "memory");
    return rc;
}

__attribute__((noinline)) int stacks_test_site_b(void **out);
__attribute__((noinline)) int stacks_test_site_b(void **out)
{
    int rc = alloc_in_caller(4096, out);
    __asm__ volatile("" ::: "memory");
    return rc;
}

__attribute__((noinline)) int stacks_test_direct(void **out);
__attribute__((noinline)) int stacks_test_direct(void **out)
{
    int rc = mt_alloc_malloc(rig.a, 8192, NULL, MT_TAG_OTHER, out);
    __asm__ volatile("" ::: "memory");
    return rc;
}

/* The first frame is the caller of mt_alloc_malloc (the program's), the next its caller;
 * the ids of one call site are one id, interned once; another site gets another. */
static void test_caller_first_and_interned(void **state)
{
    (void)state;
    rig_up(MT_STACKS_ALL);
    void *x[8];
    assert_int_equal(stacks_test_direct(&x[0]), 0);
    for (int i = 1; i < 4; i++)
        assert_int_equal(stacks_test_site_a(&x[i]), 0);
    for (int i = 4; i < 8; i++)
        assert_int_equal(stacks_test_site_b(&x[i]), 0);
    mt_prof_stack_stats_t st;
    mt_prof_stack_stats(rig.p, &st);
    assert_int_equal(st.captures, 8);
    assert_int_equal(st.stacks, 3);
    assert_true(st.modules >= 2);
    assert_int_equal(mt_prof_flush(rig.p), 0);
    json_t *all = read_log();
    uint32_t ids[8];
    assert_int_equal(alloc_stacks(all, ids, 8), 8);
    assert_true(ids[0] != 0 && ids[1] != 0 && ids[4] != 0);
    assert_int_equal(ids[1], ids[2]);
    assert_int_equal(ids[2], ids[3]);
    assert_int_equal(ids[4], ids[7]);
    assert_true(ids[1] != ids[4] && ids[0] != ids[1]);
    /* one stack line per id */
    size_t i, nstack = 0;
    json_t *j;
    json_array_foreach(all, i, j) nstack += strcmp(kind_of(j), "stack") == 0;
    assert_int_equal(nstack, 3);

    json_t *fr = json_object_get(stack_line(all, ids[0]), "frames");
    assert_string_equal(fn_name(hexv(json_object_get(json_array_get(fr, 0), "ip"))),
                        "stacks_test_direct");
    fr = json_object_get(stack_line(all, ids[1]), "frames");
    uint64_t ip0 = hexv(json_object_get(json_array_get(fr, 0), "ip"));
    assert_string_equal(fn_name(ip0), "alloc_in_caller");
    assert_string_equal(fn_name(hexv(json_object_get(json_array_get(fr, 1), "ip"))),
                        "stacks_test_site_a");
    fr = json_object_get(stack_line(all, ids[4]), "frames");
    assert_string_equal(fn_name(hexv(json_object_get(json_array_get(fr, 1), "ip"))),
                        "stacks_test_site_b");
    /* the ip lies in this executable's module */
    const char *mod = module_of(all, ip0);
    assert_non_null(mod);
    assert_non_null(strstr(mod, "test_stacks_capture"));
    json_decref(all);
    for (int k = 0; k < 8; k++)
        mt_alloc_free(rig.a, x[k]);
    rig_down();
    unlink(rig.log);
}

/* Sampled: every allocation of at least the interval is taken; small ones in proportion
 * to their bytes. */
static void test_sampled(void **state)
{
    (void)state;
    rig_up(MT_STACKS_SAMPLED);
    void *x;
    for (int i = 0; i < 50; i++) {
        assert_int_equal(
            mt_alloc_malloc(rig.a, MT_STACK_SAMPLE_MEAN + (size_t)i * 1000, NULL, MT_TAG_OTHER, &x),
            0);
        mt_alloc_free(rig.a, x);
    }
    for (int i = 0; i < 4096; i++) { /* 4 MiB in 1 KiB allocations: about 8 samples */
        assert_int_equal(mt_alloc_malloc(rig.a, 1024, NULL, MT_TAG_OTHER, &x), 0);
        mt_alloc_free(rig.a, x);
    }
    assert_int_equal(mt_prof_flush(rig.p), 0);
    json_t *all = read_log();
    uint32_t ids[8192];
    size_t n = alloc_stacks(all, ids, 8192);
    assert_int_equal(n, 50 + 4096);
    size_t small = 0;
    for (size_t i = 0; i < 50; i++)
        assert_true(ids[i] != 0);
    for (size_t i = 50; i < n; i++)
        small += ids[i] != 0;
    assert_true(small >= 1 && small <= 40);
    json_decref(all);
    /* off at run time: none */
    assert_int_equal(mt_prof_set_stacks(rig.p, MT_STACKS_OFF), 0);
    mt_prof_stack_stats_t before, after;
    mt_prof_stack_stats(rig.p, &before);
    assert_int_equal(mt_alloc_malloc(rig.a, 64u << 20, NULL, MT_TAG_OTHER, &x), 0);
    mt_alloc_free(rig.a, x);
    mt_prof_stack_stats(rig.p, &after);
    assert_int_equal(after.captures, before.captures);
    assert_int_equal(mt_prof_set_stacks(rig.p, 7), MT_EINVAL);
    rig_down();
    unlink(rig.log);
}

/* The table's cap: past MT_STACK_ID_MAX distinct stacks, new ones are counted, not
 * stored; known ones keep their ids. */
static void test_cap(void **state)
{
    (void)state;
    size_t sz = mt__stab_area_size();
    void *area = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(area != MAP_FAILED);
    mt__stab_t *t;
    assert_int_equal(mt__stab_create(&t, area, sz), 0);
    uint64_t w[4] = {0x401000, 0x402000, 0, 0x403000};
    for (uint32_t i = 1; i <= MT_STACK_ID_MAX; i++) {
        w[2] = 0x500000 + i;
        assert_int_equal(mt__stab_intern(t, w, 4, false), i);
    }
    w[2] = 0x500000 + 7;
    assert_int_equal(mt__stab_intern(t, w, 4, false), 7); /* still found */
    w[2] = 0x900000;
    assert_int_equal(mt__stab_intern(t, w, 4, false), MT_STACK_ID_OVERFLOW);
    assert_int_equal(mt__stab_intern(t, w, 3, true), MT_STACK_ID_OVERFLOW);
    mt__stab_stats_t st;
    mt__stab_stats(t, &st);
    assert_int_equal(st.stacks, MT_STACK_ID_MAX);
    assert_int_equal(st.overflow, 2);
    assert_true(st.table_bytes <= st.bound_bytes);
    /* a reader sees the same table; a corrupt header is refused */
    mt__stab_view_t v;
    assert_int_equal(mt__stab_view(&v, area, sz), 0);
    char line[4096];
    size_t n = mt__stab_stack_line(&v, 7, 1, line, sizeof line);
    assert_true(n > 0 && n < sizeof line);
    assert_non_null(strstr(line, "\"0x500007\""));
    assert_int_equal(mt__stab_stack_line(&v, MT_STACK_ID_MAX + 1, 1, line, sizeof line), 0);
    mt__stab_hdr_t *h = area, keep = *h;
    h->frames_off = sz;
    assert_int_equal(mt__stab_view(&v, area, sz), MT_EPROTO);
    assert_int_equal(mt__stab_view(&v, area, 16), MT_EPROTO);
    /* Forged offsets whose sums with their tables' sizes wrap to small numbers. */
    h->frames_off = keep.frames_off;
    h->str_off = (uint64_t)0 - keep.str_bytes;
    assert_int_equal(mt__stab_view(&v, area, sz), MT_EPROTO);
    h->str_off = keep.str_off;
    h->py_off = (uint64_t)0 - (uint64_t)keep.max_py * sizeof(mt__stab_py_t);
    assert_int_equal(mt__stab_view(&v, area, sz), MT_EPROTO);
    h->py_off = keep.py_off;
    h->frames_off = (uint64_t)0 - (uint64_t)keep.max_frames * 8u;
    assert_int_equal(mt__stab_view(&v, area, sz), MT_EPROTO);
    h->frames_off = keep.frames_off;
    assert_int_equal(mt__stab_view(&v, area, sz), 0);
    mt__stab_destroy(&t);
    munmap(area, sz);
}

/* The local log read back by the report: the same frames, the block's stack id. */
static void test_log_round_trip(void **state)
{
    (void)state;
    rig_up(MT_STACKS_ALL);
    void *x;
    assert_int_equal(stacks_test_site_a(&x), 0);
    rig_down();
    json_t *all = read_log();
    uint32_t id;
    assert_int_equal(alloc_stacks(all, &id, 1), 1);
    json_t *fr = json_object_get(stack_line(all, id), "frames");
    mt__report_t *r;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    FILE *f = fopen(rig.log, "r");
    char line[65536], err[256];
    while (fgets(line, sizeof line, f))
        if (mt__report_add_line(r, line, strlen(line), err, sizeof err) != 0)
            fail_msg("report: %s", err);
    fclose(f);
    mt_model_t *m;
    assert_int_equal(mt__report_model(r, 0, &m), 0);
    const mt_model_frame_t *mf;
    int n;
    assert_int_equal(mt__model_stack_frames(m, id, &mf, &n, NULL), 0);
    assert_int_equal(n, (int)json_array_size(fr));
    for (int k = 0; k < n; k++)
        assert_int_equal(mf[k].ip, hexv(json_object_get(json_array_get(fr, (size_t)k), "ip")));
    const mt_model_module_t *mod = mt__model_module_of(m, mf[0].ip);
    assert_non_null(mod);
    assert_non_null(strstr(mod->path, "test_stacks_capture"));
    mt_model_stack_t *rows;
    size_t nr;
    assert_int_equal(mt__model_stacks(m, MT_MODEL_DEVICE, NULL, &rows, &nr), 0);
    bool found = false;
    for (size_t k = 0; k < nr; k++)
        found = found || (rows[k].stack == id && rows[k].allocs == 1 && rows[k].blocks == 1 &&
                          rows[k].bytes == 4096);
    assert_true(found); /* never freed: live at the end */
    free(rows);
    mt__model_destroy(&m);
    mt__report_destroy(&r);
    json_decref(all);
    unlink(rig.log);
}

static void *late_out;
static int late_cb(void)
{
    return alloc_in_caller(4096, &late_out);
}

/* A library dlopen'ed after recording began: its frame's ip lies in a module line that
 * names it, written before the stack line. */
static void test_late_dlopen(void **state)
{
    (void)state;
    rig_up(MT_STACKS_ALL);
    void *h = dlopen(late_lib_path, RTLD_NOW);
    if (!h)
        fail_msg("dlopen %s: %s", late_lib_path, dlerror());
    int (*call)(int (*)(void)) = (int (*)(int (*)(void)))dlsym(h, "stk_late_call");
    assert_non_null(call);
    assert_int_equal(call(late_cb), 0);
    assert_int_equal(mt_prof_flush(rig.p), 0);
    json_t *all = read_log();
    uint32_t id;
    assert_int_equal(alloc_stacks(all, &id, 1), 1);
    json_t *fr = json_object_get(stack_line(all, id), "frames");
    bool in_late = false;
    for (size_t k = 0; k < json_array_size(fr); k++) {
        const char *mod = module_of(all, hexv(json_object_get(json_array_get(fr, k), "ip")));
        in_late = in_late || (mod && strstr(mod, "stk_late"));
    }
    assert_true(in_late);
    json_decref(all);
    mt_alloc_free(rig.a, late_out);
    rig_down();
    dlclose(h);
    unlink(rig.log);
}

__attribute__((noinline)) int stacks_test_pinned(mt_host_cache_t *h, void **out);
__attribute__((noinline)) int stacks_test_pinned(mt_host_cache_t *h, void **out)
{
    int rc = mt_host_malloc(h, 1u << 20, MT_TAG_BATCH, out);
    __asm__ volatile("" ::: "memory");
    return rc;
}

/* Pinned host allocations get stacks too: pool host, the caller first. */
static void test_pinned_host(void **state)
{
    (void)state;
    rig_up(MT_STACKS_ALL);
    mt_host_cfg_t hc = mt_host_cfg_default();
    hc.backend = rig.b;
    hc.capacity = 64u << 20;
    hc.sink = mt_prof_sink(rig.p);
    mt_host_cache_t *h;
    assert_int_equal(mt_host_cache_create(&h, &hc), 0);
    void *x;
    assert_int_equal(stacks_test_pinned(h, &x), 0);
    assert_int_equal(mt_prof_flush(rig.p), 0);
    json_t *all = read_log();
    uint32_t id;
    assert_int_equal(alloc_stacks(all, &id, 1), 1);
    assert_true(id != 0);
    size_t i;
    json_t *j;
    json_array_foreach(all, i, j) if (strcmp(kind_of(j), "alloc") == 0)
        assert_string_equal(json_string_value(json_object_get(j, "pool")), "host");
    json_t *fr = json_object_get(stack_line(all, id), "frames");
    assert_string_equal(fn_name(hexv(json_object_get(json_array_get(fr, 0), "ip"))),
                        "stacks_test_pinned");
    json_decref(all);
    assert_int_equal(mt_host_free(h, x), 0);
    mt_host_cache_destroy(&h);
    rig_down();
    unlink(rig.log);
}

/* MEMTRACE_STACKS is parsed strictly and named in the error. */
static void test_env(void **state)
{
    (void)state;
    mt_prof_cfg_t c = mt_prof_cfg_default();
    assert_int_equal(c.stacks, MT_STACKS_SAMPLED);
    char err[128] = "";
    setenv("MEMTRACE_STACKS", "all", 1);
    assert_int_equal(mt_prof_stacks_from_env(&c, err, sizeof err), 0);
    assert_int_equal(c.stacks, MT_STACKS_ALL);
    setenv("MEMTRACE_STACKS", "All ", 1);
    assert_int_equal(mt_prof_stacks_from_env(&c, err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "MEMTRACE_STACKS"));
    assert_int_equal(c.stacks, MT_STACKS_ALL);
    unsetenv("MEMTRACE_STACKS");
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    assert_int_equal(ac.stacks, MT_STACKS_DEFAULT);
    assert_int_equal(mt_alloc_cfg_parse(&ac, "stacks:off", err, sizeof err), 0);
    assert_int_equal(ac.stacks, MT_STACKS_OFF);
    assert_int_equal(mt_alloc_cfg_parse(&ac, "stacks:most", err, sizeof err), MT_EINVAL);
    assert_non_null(strstr(err, "stacks"));
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    late_lib_path = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_caller_first_and_interned),
        cmocka_unit_test(test_sampled),
        cmocka_unit_test(test_cap),
        cmocka_unit_test(test_log_round_trip),
        cmocka_unit_test(test_late_dlopen),
        cmocka_unit_test(test_pinned_host),
        cmocka_unit_test(test_env),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
