/* The SVG of `memtrace plot`, from crafted logs fed through the report's parser: one area
 * per tag present (and none for absent tags), legend names including a user label, the
 * reserved line and cache, OOM and iteration marks, pinned host memory in its own panel,
 * the segment map's figures, a bounded size for a long log with its peak kept, and the
 * errors (no such process). Well-formedness is checked on the CLI's output (meson.build). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/prof.h"
#include "analysis/plot.h"
#include "analysis/report.h"
#include "tests/common/test_main.h"

#define MiB (UINT64_C(1) << 20)

typedef struct gen_s {
    mt__report_t *r;
    int pid;
    uint64_t seq, t, allocated, reserved, host_allocated, host_reserved;
} gen_t;

static void emit(gen_t *g, int kind, int pool, uint64_t addr, uint64_t size, int tag)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof(ev));
    ev.seq = g->seq++;
    ev.time_ns = (g->t += 1000);
    ev.kind = (uint8_t)kind;
    ev.addr = addr;
    ev.size = size;
    ev.requested = size;
    ev.tag = (uint8_t)tag;
    ev.pool = (uint8_t)pool;
    ev.allocated = pool == MT_POOL_HOST ? g->host_allocated : g->allocated;
    ev.reserved = pool == MT_POOL_HOST ? g->host_reserved : g->reserved;
    char line[1024];
    size_t n = mt_prof_event_write(line, sizeof(line), &ev, g->pid, NULL, NULL);
    assert_true(n > 0 && n < sizeof(line));
    char err[128];
    assert_int_equal(mt__report_add_line(g->r, line, n, err, sizeof(err)), 0);
}

static void seg(gen_t *g, uint64_t addr, uint64_t size)
{
    g->reserved += size;
    emit(g, MT_EV_SEGMENT_ALLOC, MT_POOL_LARGE, addr, size, 0);
}

static void galloc(gen_t *g, uint64_t addr, uint64_t size, int tag)
{
    g->allocated += size;
    emit(g, MT_EV_ALLOC, MT_POOL_LARGE, addr, size, tag);
}

static void gfree(gen_t *g, uint64_t addr, uint64_t size, int tag)
{
    g->allocated -= size;
    emit(g, MT_EV_FREE_REQUESTED, MT_POOL_LARGE, addr, size, tag);
    emit(g, MT_EV_FREE_COMPLETED, MT_POOL_LARGE, addr, size, tag);
}

static void label(gen_t *g, int tag, const char *name)
{
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof(ev));
    ev.seq = g->seq++;
    ev.time_ns = (g->t += 1000);
    ev.kind = MT_EV_TAG_LABEL;
    ev.tag = (uint8_t)tag;
    mt_event_label_pack(&ev, name);
    char line[1024];
    size_t n = mt_prof_event_write(line, sizeof(line), &ev, g->pid, NULL, NULL);
    char err[128];
    assert_int_equal(mt__report_add_line(g->r, line, n, err, sizeof(err)), 0);
}

/* Writes the plot of pid into a new string (caller frees); returns the status. */
static int plot(mt__report_t *r, int pid, char **svg, size_t *len)
{
    FILE *f = open_memstream(svg, len);
    assert_non_null(f);
    mt__plot_cfg_t cfg = mt__plot_cfg_default();
    cfg.pid = pid;
    char err[256];
    int rc = mt__plot_svg(r, &cfg, f, err, sizeof err);
    fclose(f);
    return rc;
}

static size_t count(const char *s, const char *what)
{
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, what)) != NULL; p += strlen(what))
        n++;
    return n;
}

static void test_training_picture(void **state)
{
    (void)state;
    mt__report_t *r;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    gen_t g = {.r = r, .pid = 77};
    const uint64_t base = 0x100000000, base2 = 0x200000000;
    label(&g, MT_TAG_USER_FIRST, "kv<cache>");
    seg(&g, base, 64 * MiB);
    seg(&g, base2, 16 * MiB);
    galloc(&g, base, 8 * MiB, MT_TAG_WEIGHTS);
    galloc(&g, base2, 4 * MiB, MT_TAG_USER_FIRST);
    g.host_reserved = 2 * MiB;
    g.host_allocated = MiB;
    emit(&g, MT_EV_ALLOC, MT_POOL_HOST, 0x7000000, MiB, MT_TAG_BATCH);
    for (int it = 0; it < 10; it++) {
        emit(&g, MT_EV_MARK, MT_POOL_NONE, MT_MARK_ITERATION, (uint64_t)it, 0);
        galloc(&g, base + 16 * MiB, 32 * MiB, MT_TAG_ACTIVATIONS);
        gfree(&g, base + 16 * MiB, 32 * MiB, MT_TAG_ACTIVATIONS);
    }
    emit(&g, MT_EV_OOM, MT_POOL_LARGE, 0, 0, 0);
    char *svg;
    size_t len;
    assert_int_equal(plot(r, 77, &svg, &len), 0);
    assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_non_null(strstr(svg, "</svg>\n"));
    assert_null(strstr(svg, "<script"));
    /* One area per tag present: weights, activations, the user tag; batch is host only. */
    assert_int_equal(count(svg, "class=\"area "), 3);
    assert_int_equal(count(svg, "class=\"area tag-1\""), 1);
    assert_int_equal(count(svg, "class=\"area tag-4\""), 1);
    assert_int_equal(count(svg, "class=\"area tag-7\""), 1);
    assert_int_equal(count(svg, "class=\"area tag-6\""), 0);
    /* Legend: names (the user label escaped) and peaks. */
    assert_non_null(strstr(svg, ">weights</text>"));
    assert_non_null(strstr(svg, ">activations</text>"));
    assert_non_null(strstr(svg, ">kv&lt;cache&gt;</text>"));
    assert_non_null(strstr(svg, ">32.0 MiB</text>"));
    assert_non_null(strstr(svg, "peak allocated 44.0 MiB, peak reserved 80.0 MiB"));
    assert_non_null(strstr(svg, "peak in use 44.0 MiB"));
    assert_int_equal(count(svg, "class=\"oom\""), 1);
    assert_non_null(strstr(svg, ">iterations</text>"));
    /* Pinned host memory apart: its own panel, not in the device peaks. */
    assert_non_null(strstr(svg, "pinned host memory"));
    assert_int_equal(count(svg, "class=\"host\""), 1);
    /* The map at peak reserved, the fullest moment: activations live, 2 segments. */
    assert_non_null(strstr(svg, "2 segments, 80.0 MiB"));
    assert_non_null(strstr(svg, "in use 44.0 MiB (utilization 55.0%)"));
    /* free: 8 and 16 MiB in segment 1 (around the activations), 12 MiB in segment 2. */
    assert_non_null(
        strstr(svg, "free 36.0 MiB in 3 extents, largest 16.0 MiB: fragmentation 55.6%"));
    free(svg);
    assert_int_equal(plot(r, 78, &svg, &len), MT_ENOENT);
    free(svg);
    mt__report_destroy(&r);
}

/* 200 000 events, one spike among them: the SVG stays small and the spike is drawn. */
static void test_bounded_and_peak_kept(void **state)
{
    (void)state;
    mt__report_t *r;
    assert_int_equal(mt__report_create(&r, NULL), 0);
    gen_t g = {.r = r, .pid = 5};
    const uint64_t base = 0x100000000;
    seg(&g, base, 512 * MiB);
    for (int i = 0; i < 50000; i++) {
        uint64_t size = i == 31337 ? 300 * MiB : (uint64_t)(1 + i % 7) * MiB;
        galloc(&g, base, size, i % 2 ? MT_TAG_ACTIVATIONS : MT_TAG_WORKSPACE);
        gfree(&g, base, size, i % 2 ? MT_TAG_ACTIVATIONS : MT_TAG_WORKSPACE);
    }
    char *svg;
    size_t len;
    assert_int_equal(plot(r, -1, &svg, &len), 0);
    assert_true(len < 200 * 1024);
    assert_non_null(strstr(svg, "peak in use 300.0 MiB"));
    assert_non_null(strstr(svg, ">300.0 MiB</text>")); /* the legend's peak of activations */
    assert_int_equal(count(svg, "class=\"area "), 2);
    free(svg);
    mt__report_destroy(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_training_picture),
        cmocka_unit_test(test_bounded_and_peak_kept),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
