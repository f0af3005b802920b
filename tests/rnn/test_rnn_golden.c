/* The engine against PyTorch: golden files made by tests/rnn/gen_packed_golden.py (PyTorch's
 * nn.LSTM/GRU/RNN on pack_padded_sequence input, computed in float64 from float32 inputs)
 * for every mode, one-way and bidirectional, 2 layers, input 7, hidden 13, lengths
 * {4, 1, 6, 6, 2} (unsorted: packed with enforce_sorted = false, states permuted) and an
 * all-equal batch. The padded input goes through mt_rnn_pack, the states through
 * mt_rnn_pack_states, the outputs back through mt_rnn_unpack(_states); y, h_n, c_n and
 * every gradient must be within a relative error of 1e-5 (see rel_err; the worst seen is
 * printed, about 5e-7 on the machine it was written on). The same at every instruction set
 * level of the cell loops this CPU runs, and $MEMTRACE_CPU_ISA capping the level (in a child
 * process: the level is chosen once per process). The test needs no torch: argv[1] is the
 * data directory. */
#include <dirent.h>
#include <math.h>
#include <unistd.h>

#include "rnn/internal.h"
#include "tests/rnn/fixture.h"
#include "tests/common/test_main.h"

static const char *data_dir;

typedef struct arr_s {
    char name[16];
    size_t n;
    float *v;
} arr_t;

typedef struct golden_s {
    int mode, input, hidden, layers, bi, batch, T, sorted;
    arr_t a[16];
    int na;
} golden_t;

static const arr_t *get(const golden_t *g, const char *name)
{
    for (int i = 0; i < g->na; i++)
        if (strcmp(g->a[i].name, name) == 0)
            return &g->a[i];
    print_error("golden file lacks array %s\n", name);
    fail();
    return NULL;
}

static void load(const char *path, golden_t *g)
{
    memset(g, 0, sizeof *g);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char line[512];
    assert_non_null(fgets(line, sizeof line, f));
    assert_string_equal(line, "memtrace-packed-golden 1\n");
    assert_non_null(fgets(line, sizeof line, f));
    assert_int_equal(
        sscanf(line, "mode=%d input=%d hidden=%d layers=%d bi=%d batch=%d T=%d sorted=%d", &g->mode,
               &g->input, &g->hidden, &g->layers, &g->bi, &g->batch, &g->T, &g->sorted),
        8);
    while (fgets(line, sizeof line, f)) {
        assert_true(g->na < 16);
        arr_t *a = &g->a[g->na++];
        assert_int_equal(sscanf(line, "%15s %zu", a->name, &a->n), 2);
        a->v = malloc(a->n * sizeof(float) + 1);
        assert_non_null(a->v);
        assert_int_equal(fread(a->v, sizeof(float), a->n, f), a->n);
    }
    fclose(f);
}

static void unload(golden_t *g)
{
    for (int i = 0; i < g->na; i++)
        free(g->a[i].v);
}

/* Relative error of an array: max |got - want| / max |want| (the infinity-norm relative
 * error; the 2-norm one is never larger here). Element by element, a relative figure means
 * nothing where want is near zero (float32's rounding of a sum that cancels); against the
 * array's scale it is what the float32 arithmetic is accurate to. */
static double rel_err(const float *got, const float *want, size_t n)
{
    double scale = 0.0, worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs(want[i]));
        worst = fmax(worst, fabs((double)got[i] - want[i]));
    }
    return scale > 0.0 ? worst / scale : worst;
}

static double worst_seen;

static void compare(const char *file, const char *what, const float *got, const arr_t *want)
{
    double e = rel_err(got, want->v, want->n);
    worst_seen = fmax(worst_seen, e);
    if (e > 1e-5) {
        print_error("%s: %s: relative error %.3g > 1e-5\n", file, what, e);
        fail();
    }
}

static float *dev(rnn_fx_t *fx, size_t n)
{
    return fx_buf(fx, n ? n : 1, MT_TAG_BATCH, 0);
}

static const char *gemm_lib; /* the cpu path's GEMM library under test */
static int gemm_threads = 1; /* and its thread count (2: the step loops run on two threads) */

static void run_file(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", data_dir, name);
    golden_t g;
    load(path, &g);
    rnn_fx_t *fx = fx_new(256u << 20);
    mt_rnn_cfg_t c = fx_cfg(fx, g.mode, g.input, g.hidden, g.layers, g.bi);
    c.gemm = gemm_lib;
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    assert_int_equal(mt_rnn_set_gemm_threads(m, gemm_threads), 0);
    size_t nw;
    float *w = mt_rnn_weights(m, &nw);
    assert_int_equal(nw, get(&g, "w")->n);
    memcpy(w, get(&g, "w")->v, nw * sizeof(float));

    int B = g.batch, T = g.T, D = g.bi ? 2 : 1, DH = D * g.hidden, LD = g.layers * D;
    int lens[64];
    assert_true(B <= 64);
    for (int b = 0; b < B; b++)
        lens[b] = (int)get(&g, "lengths")->v[b];
    mt_rnn_pack_t p;
    assert_int_equal(mt_rnn_pack_init(&p, lens, B, T, g.sorted, NULL, NULL), 0);
    size_t N = p.tokens, nst = (size_t)LD * B * g.hidden;
    size_t npx = (size_t)T * B * g.input, npy = (size_t)T * B * DH;
    /* Device buffers: padded inputs, packed forms, states in both orders. */
    float *px = dev(fx, npx), *x = dev(fx, N * g.input), *y = dev(fx, N * DH);
    float *hx = dev(fx, nst), *cx = dev(fx, nst), *hy = dev(fx, nst), *cy = dev(fx, nst);
    float *pdy = dev(fx, npy), *dy = dev(fx, N * DH), *dx = dev(fx, N * g.input);
    float *dhy = dev(fx, nst), *dcy = dev(fx, nst), *dhx = dev(fx, nst), *dcx = dev(fx, nst);
    float *st = dev(fx, nst), *outp = dev(fx, npy > npx ? npy : npx);
    memcpy(px, get(&g, "x")->v, npx * sizeof(float));
    memcpy(pdy, get(&g, "dy")->v, npy * sizeof(float));
    assert_int_equal(mt_rnn_pack(m, &p, g.input, px, x), 0);
    assert_int_equal(mt_rnn_pack(m, &p, DH, pdy, dy), 0);
    const char *sin[4] = {"hx", "cx", "dhy", "dcy"};
    float *sdst[4] = {hx, cx, dhy, dcy};
    for (int i = 0; i < 4; i++) {
        memcpy(st, get(&g, sin[i])->v, nst * sizeof(float));
        assert_int_equal(mt_rnn_pack_states(m, &p, LD, g.hidden, st, sdst[i]), 0);
    }
    bool lstm = g.mode == MT_RNN_LSTM;
    mt_rnn_io_t io = {
        .x = x, .y = y, .hx = hx, .cx = lstm ? cx : NULL, .hy = hy, .cy = lstm ? cy : NULL};
    mt_rnn_pack_io(&p, &io);
    mt_rnn_reserve_t *r;
    assert_int_equal(mt_rnn_forward(m, &io, &r), 0);

    assert_int_equal(mt_rnn_unpack(m, &p, DH, y, outp), 0);
    compare(name, "y", outp, get(&g, "y"));
    assert_int_equal(mt_rnn_unpack_states(m, &p, LD, g.hidden, hy, st), 0);
    compare(name, "h_n", st, get(&g, "hy"));
    if (lstm) {
        assert_int_equal(mt_rnn_unpack_states(m, &p, LD, g.hidden, cy, st), 0);
        compare(name, "c_n", st, get(&g, "cy"));
    }

    mt_rnn_grad_io_t gr = {dy, dhy, lstm ? dcy : NULL, dx, dhx, lstm ? dcx : NULL};
    assert_int_equal(mt_rnn_backward(m, &r, &gr), 0);
    /* Every gradient, parameter by parameter (so a failure names it), then dx, dhx, dcx. */
    const arr_t *dw = get(&g, "dw");
    for (size_t i = 0; i < mt_rnn_param_count(m); i++) {
        mt_rnn_param_t prm;
        assert_int_equal(mt_rnn_param_get(m, i, &prm), 0);
        arr_t part = {"", prm.numel, dw->v + prm.offset};
        compare(name, prm.name, prm.grad, &part);
    }
    assert_int_equal(mt_rnn_unpack(m, &p, g.input, dx, outp), 0);
    compare(name, "dx", outp, get(&g, "dx"));
    assert_int_equal(mt_rnn_unpack_states(m, &p, LD, g.hidden, dhx, st), 0);
    compare(name, "dhx", st, get(&g, "dhx"));
    if (lstm) {
        assert_int_equal(mt_rnn_unpack_states(m, &p, LD, g.hidden, dcx, st), 0);
        compare(name, "dcx", st, get(&g, "dcx"));
    }

    float *bufs[] = {px, x, y, hx, cx, hy, cy, pdy, dy, dx, dhy, dcy, dhx, dcx, st, outp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        fx_put(fx, bufs[i]);
    mt_rnn_pack_fini(&p);
    mt_rnn_destroy(&m);
    fx_free(&fx);
    unload(&g);
}

static void golden_on(const char *lib)
{
    gemm_lib = lib;
    worst_seen = 0.0;
    DIR *d = opendir(data_dir);
    assert_non_null(d);
    int files = 0, modes[4] = {0}, bi = 0, equal = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "packed_", 7) != 0 || !strstr(e->d_name, ".bin"))
            continue;
        run_file(e->d_name);
        files++;
        for (int mo = 0; mo < 4; mo++)
            modes[mo] += strstr(e->d_name, mt_rnn_mode_name(mo)) != NULL;
        bi += strstr(e->d_name, "_bi_") != NULL;
        equal += strstr(e->d_name, "_equal") != NULL;
    }
    closedir(d);
    /* The coverage the issue asks for is there. */
    assert_true(files >= 12);
    for (int mo = 0; mo < 4; mo++)
        assert_true(modes[mo] >= 3);
    assert_true(bi >= 4 && equal >= 4);
    print_message("golden (%s, %d thread%s): %d files, worst relative error %.3g\n", lib,
                  gemm_threads, gemm_threads > 1 ? "s" : "", files, worst_seen);
}

/* True if this machine has the library (the module says MT_ENOTSUP otherwise). */
static bool have(const char *lib)
{
    rnn_fx_t *fx = fx_new(16u << 20);
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 2, 2, 1, false);
    c.gemm = lib;
    mt_rnn_t *m;
    int rc = mt_rnn_create(&m, &c);
    if (rc == 0) {
        assert_string_equal(mt_rnn_gemm_name(m), lib);
        mt_rnn_destroy(&m);
    } else {
        assert_int_equal(rc, MT_ENOTSUP);
    }
    fx_free(&fx);
    return rc == 0;
}

/* The linked CBLAS, then BLIS and oneDNN where they are installed (dev.sh installs both). */
static void golden_cblas(void **state)
{
    (void)state;
    golden_on("cblas");
}

static void golden_blis(void **state)
{
    (void)state;
    if (!have("blis"))
        skip();
    golden_on("blis");
}

static void golden_dnnl(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    /* LeakSanitizer's exit-time tracer crashes with oneDNN's OpenMP threads alive (see
     * MT__RNN_GEMM_DEFAULT in rnn/lifecycle.c): the plain build tests oneDNN. */
    skip();
#endif
    if (!have("dnnl"))
        skip();
    golden_on("dnnl");
    /* The step loops in two halves on two threads (packed lengths: halves of equal work). */
    gemm_threads = 2;
    golden_on("dnnl");
    gemm_threads = 1;
}

/* An unknown library is refused at creation. */
static void gemm_unknown(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(16u << 20);
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 2, 2, 1, false);
    c.gemm = "mkl";
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), MT_EINVAL);
    fx_free(&fx);
}

/* ---- instruction set levels of the cell loops ---- */

/* What the info line of a module on lib says (a static copy). */
static const char *info_of(const char *lib)
{
    rnn_fx_t *fx = fx_new(16u << 20);
    const char *info = fx_gemm_info(fx, lib);
    fx_free(&fx);
    return info;
}

/* y of an LSTM forward (1 layer, T 5, B 3, hidden 37) at the level in use: a new copy. */
static float *lstm_y(size_t *n)
{
    enum { T = 5, B = 3, IN = 4, H = 37 };
    rnn_fx_t *fx = fx_new(16u << 20);
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, IN, H, 1, false);
    c.gemm = "cblas";
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    float *x = fx_buf(fx, T * B * IN, MT_TAG_BATCH, 3), *y = fx_buf(fx, T * B * H, MT_TAG_BATCH, 0);
    mt_rnn_io_t io = {.seq_len = T, .batch = B, .x = x, .y = y};
    assert_int_equal(mt_rnn_forward(m, &io, NULL), 0);
    *n = T * B * H;
    float *out = malloc(*n * sizeof(float));
    assert_non_null(out);
    memcpy(out, y, *n * sizeof(float));
    fx_put(fx, x);
    fx_put(fx, y);
    mt_rnn_destroy(&m);
    fx_free(&fx);
    return out;
}

/* Every level this CPU runs, from its highest down: the level in use is that one, the info
 * line names it, and the goldens hold at it (the cell loops are the level's own code). */
static void golden_every_isa(void **state)
{
    (void)state;
    int top = mt__rnn_isa_cpu(), was = mt__rnn_isa();
    for (int l = top; l >= MT__RNN_ISA_BASELINE; l--) {
        assert_int_equal(mt__rnn_isa_set(l), l);
        assert_int_equal(mt__rnn_isa(), l);
        char want[64];
        snprintf(want, sizeof want, "cell loops %s", mt__rnn_isa_name(l));
        const char *info = info_of("cblas");
        if (!strstr(info, want))
            fail_msg("level %s: info \"%s\" lacks \"%s\"", mt__rnn_isa_name(l), info, want);
        print_message("cell loops %s:\n", mt__rnn_isa_name(l));
        golden_on("cblas");
    }
    /* The levels run code of their own: the baseline's polynomials round without fused
     * multiply-adds, so some of its outputs differ from the AVX2 build's in the last bits.
     * Below -O2 (the sanitizers' build is -O1) gcc contracts and vectorizes nothing here:
     * every level is the same code (meson.build defines MT_TEST_LEVELS_DIFFER). */
    if (top >= MT__RNN_ISA_AVX2) {
        size_t n;
        mt__rnn_isa_set(MT__RNN_ISA_AVX2);
        float *y2 = lstm_y(&n);
        mt__rnn_isa_set(MT__RNN_ISA_BASELINE);
        float *y0 = lstm_y(&n);
        size_t differ = 0;
        for (size_t i = 0; i < n; i++)
            differ += memcmp(&y0[i], &y2[i], sizeof(float)) != 0;
        print_message("baseline vs avx2 cell loops: %zu of %zu outputs differ in their bits\n",
                      differ, n);
        free(y0);
        free(y2);
#if defined(MT_TEST_LEVELS_DIFFER)
        assert_true(differ > 0);
#endif
    }
    assert_int_equal(mt__rnn_isa_set(was), was);
}

/* A child of this test with MEMTRACE_CPU_ISA=value (NULL: unset) prints "level NAME create
 * RC" and its error log line; its first line here. */
/* Runs the probe with MEMTRACE_CPU_ISA = value (NULL: unset); out gets what it printed
 * after its CPU's level, which is *top. The child's CPU is its own: under an emulator
 * (tests/cross/avx2_qemu.sh) the child runs on the host's CPU, not the emulated one. In a
 * cross build's run (tests/cross/aarch64.sh) the child is a program of the other
 * architecture: it runs through the wrapper meson ran this test with. */
static void isa_child(const char *value, char *out, size_t n, int *top)
{
    char exe[1024], cmd[1400];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(k > 0);
    exe[k] = '\0';
    const char *wrap = getenv("MESON_EXE_WRAPPER");
    snprintf(cmd, sizeof cmd, "%s '%s' --isa-probe", wrap ? wrap : "", exe);
    if (value)
        assert_int_equal(setenv("MEMTRACE_CPU_ISA", value, 1), 0);
    else
        assert_int_equal(unsetenv("MEMTRACE_CPU_ISA"), 0);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t got = fread(out, 1, n - 1, f);
    out[got] = '\0';
    assert_int_equal(pclose(f), 0);
    assert_int_equal(unsetenv("MEMTRACE_CPU_ISA"), 0);
    int skip = 0;
    if (sscanf(out, "cpu %d %n", top, &skip) != 1 || skip == 0)
        fail_msg("the probe did not name its CPU's level: \"%s\"", out);
    memmove(out, out + skip, strlen(out + skip) + 1);
}

typedef struct errlog_s {
    char last[512];
} errlog_t;

static void err_log(void *ud, mt_log_level_e level, const char *msg)
{
    errlog_t *e = ud;
    if (level == MT_LOG_ERROR)
        snprintf(e->last, sizeof e->last, "%s", msg);
}

/* The child's side: the level chosen from its environment, and whether a module is made. */
static int isa_probe(void)
{
    errlog_t e = {""};
    rnn_fx_t *fx = fx_new(16u << 20);
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 2, 2, 1, false);
    c.gemm = "cblas";
    c.log = err_log;
    c.log_ud = &e;
    mt_rnn_t *m = NULL;
    int rc = mt_rnn_create(&m, &c);
    printf("cpu %d level %s create %d\n%s\n", mt__rnn_isa_cpu(), mt__rnn_isa_name(mt__rnn_isa()),
           rc, e.last);
    if (m)
        mt_rnn_destroy(&m);
    fx_free(&fx);
    return 0;
}

/* MEMTRACE_CPU_ISA caps the level (never above the CPU's); an unknown value is refused at
 * module creation with a log line naming it. */
static void isa_env_caps(void **state)
{
    (void)state;
    int top;
    const char *values[] = {NULL, "avx512", "avx2", "baseline"};
    const int caps[] = {MT__RNN_ISA_AVX512, MT__RNN_ISA_AVX512, MT__RNN_ISA_AVX2,
                        MT__RNN_ISA_BASELINE};
    char out[1024], want[128];
    for (int i = 0; i < 4; i++) {
        isa_child(values[i], out, sizeof out, &top);
        snprintf(want, sizeof want, "level %s create 0\n",
                 mt__rnn_isa_name(caps[i] < top ? caps[i] : top));
        if (strncmp(out, want, strlen(want)) != 0)
            fail_msg("MEMTRACE_CPU_ISA=%s: child said \"%s\", want \"%s\"",
                     values[i] ? values[i] : "(unset)", out, want);
    }
    isa_child("avx3", out, sizeof out, &top);
    snprintf(want, sizeof want, "level %s create %d\n", mt__rnn_isa_name(top), MT_EINVAL);
    assert_true(strncmp(out, want, strlen(want)) == 0);
    if (!strstr(out, "MEMTRACE_CPU_ISA=\"avx3\" is unknown"))
        fail_msg("no log line naming the bad value: \"%s\"", out);
    /* The parser itself, read now. */
    int cap;
    assert_int_equal(setenv("MEMTRACE_CPU_ISA", "AVX2", 1), 0);
    assert_int_equal(mt__rnn_isa_from_env(&cap), MT_EINVAL);
    assert_int_equal(setenv("MEMTRACE_CPU_ISA", "avx2", 1), 0);
    assert_int_equal(mt__rnn_isa_from_env(&cap), 0);
    assert_int_equal(cap, MT__RNN_ISA_AVX2);
    assert_int_equal(setenv("MEMTRACE_CPU_ISA", "", 1), 0);
    assert_int_equal(mt__rnn_isa_from_env(&cap), 0);
    assert_int_equal(cap, MT__RNN_ISA_AVX512);
    assert_int_equal(unsetenv("MEMTRACE_CPU_ISA"), 0);
}

/* ---- the ISA matrix's cells (tests/rnn/isa_matrix.sh) ----
 *
 * With --matrix, the goldens on each library at 1 and 2 threads, one test each, each naming
 * what the library and libxsmm run here (the script lowers them through their own switches
 * and reads these lines). */
typedef struct cell_s {
    const char *lib;
    int threads;
} cell_t;

static void golden_cell(void **state)
{
    const cell_t *c = *state;
#if defined(__SANITIZE_ADDRESS__)
    if (strcmp(c->lib, "cblas") != 0)
        skip(); /* their OpenMP threads and LeakSanitizer (golden_dnnl) */
#endif
    if (!have(c->lib))
        skip();
    print_message("matrix-info %s %d: %s\n", c->lib, c->threads, info_of(c->lib));
    gemm_threads = c->threads;
    golden_on(c->lib);
    gemm_threads = 1;
}

static int run_matrix(void)
{
    static cell_t cells[6];
    static char names[6][32];
    struct CMUnitTest tests[6];
    const char *libs[3] = {"cblas", "blis", "dnnl"};
    for (int i = 0; i < 6; i++) {
        cells[i] = (cell_t){libs[i / 2], 1 + i % 2};
        snprintf(names[i], sizeof names[i], "golden_%s_%dthr", cells[i].lib, cells[i].threads);
        tests[i] = (struct CMUnitTest){names[i], golden_cell, NULL, NULL, &cells[i]};
    }
    return mt_test_end(cmocka_run_group_tests_name("isa matrix", tests, NULL, NULL));
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--isa-probe") == 0)
        return isa_probe();
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATA_DIR\n", argv[0]);
        return 2;
    }
    data_dir = argv[1];
    if (argc == 3 && strcmp(argv[2], "--matrix") == 0)
        return run_matrix();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(golden_cblas),     cmocka_unit_test(golden_blis),
        cmocka_unit_test(golden_dnnl),      cmocka_unit_test(gemm_unknown),
        cmocka_unit_test(golden_every_isa), cmocka_unit_test(isa_env_caps),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
