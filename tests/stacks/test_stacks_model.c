/* The model's call stacks: each block keeps its stack id, per-stack figures (live now,
 * live at the peak, growth), the table and module map from "stack"/"module" lines, and
 * bad input (unknown ids, corrupt lines) giving errors or "unknown", never a crash. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <string.h>

#include "analysis/report.h"
#include "../analysis/model_gen.h"
#include "tests/common/test_main.h"

#define MIB  (UINT64_C(1) << 20)
#define BASE UINT64_C(0x7f0000000000)

static void check(const mt_model_t *m)
{
    char why[256] = "";
    if (mt__model_check(m, why, sizeof why) != 0)
        fail_msg("mt__model_check: %s", why);
}

/* An alloc with a stack: the ref record, then the alloc. */
static void alloc_at(mgen_t *g, uint64_t addr, uint64_t size, uint32_t stack)
{
    if (stack) {
        mt_event_rec_t ref = mgen_rec(g, MT_EV_STACK_REF, addr, stack, 0);
        ref.addr = addr;
        ref.size = stack;
        assert_int_equal(mt__model_apply(g->m, &ref), 0);
    }
    mt_event_rec_t ev = mgen_rec(g, MT_EV_ALLOC, addr, size, 0);
    assert_int_equal(mt__model_apply(g->m, &ev), 0);
    check(g->m);
}

static void free_at(mgen_t *g, uint64_t addr, uint64_t size)
{
    mt_event_rec_t ev = mgen_rec(g, MT_EV_FREE_REQUESTED, addr, size, 0);
    assert_int_equal(mt__model_apply(g->m, &ev), 0);
    ev = mgen_rec(g, MT_EV_FREE_COMPLETED, addr, size, 0);
    assert_int_equal(mt__model_apply(g->m, &ev), 0);
    check(g->m);
}

static const mt_model_stack_t *row(const mt_model_stack_t *v, size_t n, uint32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (v[i].stack == id)
            return &v[i];
    return NULL;
}

static void test_figures(void **state)
{
    (void)state;
    mgen_t g = {0};
    mt_model_cfg_t mc = {.keep_iterations = true};
    assert_int_equal(mt__model_create(&g.m, &mc), 0);
    mt_event_rec_t seg = mgen_rec(&g, MT_EV_SEGMENT_ALLOC, BASE, 64 * MIB, 0);
    assert_int_equal(mt__model_apply(g.m, &seg), 0);
    alloc_at(&g, BASE, 8 * MIB, 1);
    alloc_at(&g, BASE + 8 * MIB, 4 * MIB, 2);
    alloc_at(&g, BASE + 12 * MIB, 2 * MIB, 0);
    /* peak: 14 MiB with stack 1 at 8, stack 2 at 4; then stack 1's block goes */
    free_at(&g, BASE, 8 * MIB);
    alloc_at(&g, BASE + 16 * MIB, 1 * MIB, 2);

    mt_model_stack_t *v;
    size_t n;
    assert_int_equal(mt__model_stacks(g.m, MT_MODEL_DEVICE, NULL, &v, &n), 0);
    assert_int_equal(n, 3);
    const mt_model_stack_t *s1 = row(v, n, 1), *s2 = row(v, n, 2), *s0 = row(v, n, 0);
    assert_non_null(s1);
    assert_non_null(s2);
    assert_non_null(s0);
    assert_int_equal(s1->bytes, 0);
    assert_int_equal(s1->peak_bytes, 8 * MIB);
    assert_int_equal(s1->allocs, 1);
    assert_int_equal(s2->bytes, 5 * MIB);
    assert_int_equal(s2->blocks, 2);
    assert_int_equal(s2->peak_bytes, 4 * MIB);
    assert_int_equal(s0->bytes, 2 * MIB);
    free(v);

    /* the blocks carry their ids */
    mt_model_map_t map;
    assert_int_equal(mt__model_map(g.m, MT_MODEL_DEVICE, &map), 0);
    assert_int_equal(map.nblocks, 3);
    assert_int_equal(map.blocks[0].stack, 2);
    assert_int_equal(map.blocks[1].stack, 0);
    assert_int_equal(map.blocks[2].stack, 2);
    mt__model_map_free(&map);
    mt__model_destroy(&g.m);
}

/* test_many_stacks' id i of N: distinct ids spread over 1..MT_STACK_ID_MAX, the last one
 * MT_STACK_ID_OVERFLOW. */
static uint32_t many_id(uint32_t i, uint32_t n)
{
    return i == n - 1 ? UINT32_MAX : i * 2654435761u % (MT_STACK_ID_MAX - 1) + 1;
}

/* Thousands of stack ids spread over 1..MT_STACK_ID_MAX, and MT_STACK_ID_OVERFLOW (the
 * table grows many times): each keeps its own block's bytes, and the model's checker finds
 * every id at its index. */
static void test_many_stacks(void **state)
{
    (void)state;
    enum { N = 3000 };
    mgen_t g = {0};
    mt_model_cfg_t mc = {0};
    assert_int_equal(mt__model_create(&g.m, &mc), 0);
    mt_event_rec_t seg = mgen_rec(&g, MT_EV_SEGMENT_ALLOC, BASE, N * MIB, 0);
    assert_int_equal(mt__model_apply(g.m, &seg), 0);
    for (uint32_t i = 0; i < N; i++) {
        uint32_t id = many_id(i, N);
        mt_event_rec_t ref = mgen_rec(&g, MT_EV_STACK_REF, BASE + i * MIB, id, 0);
        assert_int_equal(mt__model_apply(g.m, &ref), 0);
        mt_event_rec_t ev = mgen_rec(&g, MT_EV_ALLOC, BASE + i * MIB, (i % 7 + 1) * 4096, 0);
        assert_int_equal(mt__model_apply(g.m, &ev), 0);
    }
    check(g.m);
    mt_model_stack_t *v;
    size_t n;
    assert_int_equal(mt__model_stacks(g.m, MT_MODEL_DEVICE, NULL, &v, &n), 0);
    size_t seen = 0;
    for (uint32_t i = 0; i < N; i++) {
        uint32_t id = many_id(i, N);
        const mt_model_stack_t *r = row(v, n, id);
        assert_non_null(r);
        assert_int_equal(r->bytes, (i % 7 + 1) * 4096); /* the ids are distinct */
        assert_int_equal(r->blocks, 1);
        seen++;
    }
    assert_int_equal(seen, N);
    assert_int_equal(n, N);
    free(v);
    mt__model_destroy(&g.m);
}

static void test_growth(void **state)
{
    (void)state;
    mgen_t g = {0};
    mt_model_cfg_t mc = {.keep_iterations = true};
    assert_int_equal(mt__model_create(&g.m, &mc), 0);
    mt_event_rec_t seg = mgen_rec(&g, MT_EV_SEGMENT_ALLOC, BASE, 1024 * MIB, 0);
    assert_int_equal(mt__model_apply(g.m, &seg), 0);
    for (int it = 0; it < 10; it++) {
        /* stack 7 leaks 2 MiB an iteration; stack 8 allocates and frees */
        alloc_at(&g, BASE + (uint64_t)it * 2 * MIB, 2 * MIB, 7);
        alloc_at(&g, BASE + 512 * MIB, 16 * MIB, 8);
        free_at(&g, BASE + 512 * MIB, 16 * MIB);
        mt_event_rec_t mk = mgen_rec(&g, MT_EV_MARK, MT_MARK_ITERATION, (uint64_t)it, 0);
        mk.addr = MT_MARK_ITERATION;
        mk.size = (uint64_t)it;
        assert_int_equal(mt__model_apply(g.m, &mk), 0);
    }
    mt_model_stack_t *v;
    size_t n;
    assert_int_equal(mt__model_stacks(g.m, MT_MODEL_DEVICE, NULL, &v, &n), 0);
    const mt_model_stack_t *a = row(v, n, 7), *b = row(v, n, 8);
    assert_non_null(a);
    assert_non_null(b);
    assert_true(a->growth.detected);
    assert_true(a->growth.slope > 1.99 * MIB && a->growth.slope < 2.01 * MIB);
    assert_true(a->growth.r2 > 0.999);
    assert_false(b->growth.detected);
    assert_int_equal(b->peak_bytes, 16 * MIB);
    free(v);
    mt__model_destroy(&g.m);
}

static void test_table_lines(void **state)
{
    (void)state;
    mt_model_t *m;
    assert_int_equal(mt__model_create(&m, NULL), 0);
    char err[200];
    static const struct {
        const char *line;
        int rc;
    } cases[] = {
        {"{\"v\":1,\"kind\":\"module\",\"pid\":5,\"path\":\"/bin/x\",\"base\":\"0x400000\","
         "\"size\":4096,\"build_id\":\"ab12\"}",
         1},
        {"{\"v\":1,\"kind\":\"stack\",\"pid\":5,\"id\":3,\"frames\":[{\"ip\":\"0x400010\"},"
         "{\"py\":\"train\",\"file\":\"/t.py\",\"line\":12}],\"truncated\":true}",
         1},
        {"{\"v\":1,\"kind\":\"stack\",\"pid\":5,\"id\":0,\"frames\":[]}", MT_EPROTO},
        {"{\"v\":1,\"kind\":\"stack\",\"pid\":5,\"id\":4,\"frames\":[{\"ip\":\"zz\"}]}", MT_EPROTO},
        {"{\"v\":1,\"kind\":\"stack\",\"pid\":5,\"id\":4,\"frames\":[{}]}", MT_EPROTO},
        {"{\"v\":1,\"kind\":\"stack\",\"pid\":5,\"id\":4,\"frames\":7}", MT_EPROTO},
        {"{\"v\":1,\"kind\":\"stack\",\"pid\":5,\"id\":99999999,\"frames\":[]}", MT_EPROTO},
        {"{\"v\":1,\"kind\":\"module\",\"pid\":5,\"path\":\"\",\"base\":\"0x0\",\"size\":1}",
         MT_EPROTO},
        {"{\"v\":1,\"kind\":\"module\",\"pid\":5,\"path\":\"/a\",\"base\":\"0xffffffffffffffff\","
         "\"size\":2}",
         MT_EPROTO},
        {"{\"v\":1,\"type\":\"event\",\"kind\":\"alloc\"}", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = json_loads(cases[i].line, 0, NULL);
        assert_non_null(j);
        err[0] = '\0';
        int rc = mt__model_table_line(m, j, err, sizeof err);
        if (rc != cases[i].rc)
            fail_msg("line %zu: rc %d, want %d (%s)", i, rc, cases[i].rc, err);
        if (rc == MT_EPROTO)
            assert_true(strlen(err) > 0);
        json_decref(j);
    }
    const mt_model_frame_t *f;
    int n;
    bool tr;
    assert_int_equal(mt__model_stack_frames(m, 3, &f, &n, &tr), 0);
    assert_int_equal(n, 2);
    assert_true(tr);
    assert_int_equal(f[0].ip, 0x400010);
    assert_null(f[0].py_func);
    assert_string_equal(f[1].py_func, "train");
    assert_string_equal(f[1].py_file, "/t.py");
    assert_int_equal(f[1].py_line, 12);
    const mt_model_module_t *mod = mt__model_module_of(m, 0x400010);
    assert_non_null(mod);
    assert_string_equal(mod->path, "/bin/x");
    assert_string_equal(mod->build_id, "ab12");
    assert_null(mt__model_module_of(m, 0x500000));
    /* unknown ids: no frames, no crash */
    assert_int_equal(mt__model_stack_frames(m, 4, &f, &n, &tr), MT_ENOENT);
    assert_null(f);
    assert_int_equal(mt__model_stack_frames(m, MT_STACK_ID_OVERFLOW, &f, &n, &tr), MT_ENOENT);
    assert_int_equal(mt__model_stack_frames(m, 0, &f, &n, &tr), MT_ENOENT);
    /* a dlclose + dlopen at the same place replaces the module */
    assert_int_equal(mt__model_module_add(m, "/lib/y.so", 0x400000, 8192, ""), 0);
    assert_string_equal(mt__model_module_of(m, 0x400010)->path, "/lib/y.so");
    check(m);
    mt__model_destroy(&m);
}

/* Refs with ids out of range, refs not followed by their alloc: counted, no stack. */
static void test_bad_refs(void **state)
{
    (void)state;
    mgen_t g = {0};
    assert_int_equal(mt__model_create(&g.m, NULL), 0);
    mt_event_rec_t ref = mgen_rec(&g, MT_EV_STACK_REF, BASE, 0, 0);
    ref.addr = BASE;
    ref.size = (uint64_t)MT_STACK_ID_MAX + 5;
    assert_int_equal(mt__model_apply(g.m, &ref), 0);
    alloc_at(&g, BASE, MIB, 0);
    alloc_at(&g, BASE + MIB, MIB, 9); /* a ref for another address: orphan */
    ref = mgen_rec(&g, MT_EV_STACK_REF, BASE + 4 * MIB, 0, 0);
    ref.addr = BASE + 4 * MIB;
    ref.size = 3;
    assert_int_equal(mt__model_apply(g.m, &ref), 0);
    alloc_at(&g, BASE + 8 * MIB, MIB, 0);
    mt_model_stack_stats_t st;
    mt__model_stack_stats(g.m, &st);
    assert_int_equal(st.bad_ids, 1);
    assert_int_equal(st.orphan_refs, 1);
    assert_int_equal(st.matched, 2);
    mt_model_stack_t *v;
    size_t n;
    assert_int_equal(mt__model_stacks(g.m, MT_MODEL_DEVICE, NULL, &v, &n), 0);
    assert_int_equal(row(v, n, 0)->bytes, 2 * MIB);
    assert_int_equal(row(v, n, 9)->bytes, MIB);
    assert_null(row(v, n, 3));
    free(v);
    assert_int_equal(mt__model_lost(g.m), 0); /* the refs have seqs: no gap */
    mt__model_destroy(&g.m);
}

/* The report reads stack and module lines and an alloc's stack_ref line. */
static void test_report_lines(void **state)
{
    (void)state;
    mt__report_t *r;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    const char *lines[] = {
        "{\"v\":1,\"type\":\"hello\",\"pid\":9,\"name\":\"x\",\"start_realtime_ns\":1,"
        "\"start_mono_ns\":1}",
        "{\"v\":1,\"kind\":\"module\",\"pid\":9,\"path\":\"/bin/x\",\"base\":\"0x0\","
        "\"size\":65536}",
        "{\"v\":1,\"kind\":\"stack\",\"pid\":9,\"id\":1,\"frames\":[{\"ip\":\"0x1234\"}]}",
        "{\"v\":1,\"type\":\"event\",\"seq\":0,\"t_ns\":5,\"pid\":9,\"dev\":0,\"kind\":"
        "\"stack_ref\",\"addr\":\"0x7f0000000000\",\"pool\":\"large\",\"stack\":1}",
        "{\"v\":1,\"type\":\"event\",\"seq\":1,\"t_ns\":5,\"pid\":9,\"dev\":0,\"kind\":\"alloc\","
        "\"addr\":\"0x7f0000000000\",\"size\":2097152,\"requested\":2097152,\"pool\":\"large\","
        "\"tag\":\"other\",\"tag_id\":0,\"stream\":0,\"allocated\":2097152,\"reserved\":2097152,"
        "\"stack\":1}",
    };
    char err[200];
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        if (mt__report_add_line(r, lines[i], strlen(lines[i]), err, sizeof err) != 0)
            fail_msg("line %zu: %s", i, err);
    const char *bad = "{\"v\":1,\"kind\":\"stack\",\"pid\":9,\"id\":2,\"frames\":[{\"ip\":";
    assert_int_equal(mt__report_add_line(r, bad, strlen(bad), err, sizeof err), MT_EPROTO);
    mt_model_t *m;
    assert_int_equal(mt__report_model(r, 0, &m), 0);
    mt_model_stack_t *v;
    size_t n;
    assert_int_equal(mt__model_stacks(m, MT_MODEL_DEVICE, NULL, &v, &n), 0);
    assert_non_null(row(v, n, 1));
    assert_int_equal(row(v, n, 1)->bytes, 2 * MIB);
    free(v);
    const mt_model_frame_t *f;
    int nf;
    assert_int_equal(mt__model_stack_frames(m, 1, &f, &nf, NULL), 0);
    assert_int_equal(f[0].ip, 0x1234);
    assert_int_equal(mt__model_lost(m), 0);
    mt__model_destroy(&m);
    mt__report_destroy(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_figures),  cmocka_unit_test(test_many_stacks),
        cmocka_unit_test(test_growth),   cmocka_unit_test(test_table_lines),
        cmocka_unit_test(test_bad_refs), cmocka_unit_test(test_report_lines),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
