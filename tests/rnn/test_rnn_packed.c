/* Packed batches through the public API (sim backend): pack/unpack and state permutation,
 * equal lengths bit-identical to the padded path, the errors of bad packed input (with the
 * log line naming the problem), backward refusing a y (or x, hx, cx) changed since forward,
 * activation bytes in tokens, warm-up by tokens and batch (0 backend mallocs after), and
 * activation offload on packed input bit-identical to the plain run. */
#include "memtrace/host.h"
#include "rnn/internal.h"
#include "tests/rnn/fixture.h"
#include "tests/common/test_main.h"

typedef struct logcap_s {
    int errors;
    char last[512];
} logcap_t;

static void cap_log(void *ud, mt_log_level_e level, const char *msg)
{
    logcap_t *c = ud;
    if (level == MT_LOG_ERROR) {
        c->errors++;
        snprintf(c->last, sizeof c->last, "%s", msg);
    }
}

static void expect_error(logcap_t *c, int rc, const char *needle)
{
    assert_int_equal(rc, MT_EINVAL);
    assert_true(c->errors > 0);
    if (!strstr(c->last, needle)) {
        print_error("log line \"%s\" lacks \"%s\"\n", c->last, needle);
        fail();
    }
    c->errors = 0;
    c->last[0] = '\0';
}

/* ---- pack / unpack ---- */

static void pack_round_trip(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    logcap_t cap = {0};
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 3, 4, 1, false);
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    const int lens[5] = {2, 6, 1, 6, 3}, cap_T = 7, B = 5, W = 3;
    mt_rnn_pack_t p;
    assert_int_equal(mt_rnn_pack_init(&p, lens, B, cap_T, false, cap_log, &cap), 0);
    assert_int_equal(p.max_len, 6);
    assert_int_equal(p.tokens, 18);
    /* Stable: the two 6s keep their order. */
    const int sorted[5] = {1, 3, 4, 0, 2}, bs[6] = {5, 4, 3, 2, 2, 2};
    for (int i = 0; i < B; i++) {
        assert_int_equal(p.sorted_indices[i], sorted[i]);
        assert_int_equal(p.unsorted_indices[sorted[i]], i);
        assert_int_equal(p.lengths[i], lens[sorted[i]]);
    }
    for (int t = 0; t < 6; t++)
        assert_int_equal(p.batch_sizes[t], bs[t]);
    float *pad = fx_buf(fx, (size_t)cap_T * B * W, MT_TAG_BATCH, 11);
    float *pk = fx_buf(fx, p.tokens * W, MT_TAG_BATCH, 0);
    float *back = fx_buf(fx, (size_t)cap_T * B * W, MT_TAG_BATCH, 12);
    assert_int_equal(mt_rnn_pack(m, &p, W, pad, pk), 0);
    /* Packed row (t, i) is padded (t, sorted[i]). */
    size_t row = 0;
    for (int t = 0; t < 6; t++)
        for (int i = 0; i < bs[t]; i++, row++)
            for (int k = 0; k < W; k++)
                assert_true(pk[row * W + k] == pad[((size_t)t * B + sorted[i]) * W + k]);
    assert_int_equal(mt_rnn_unpack(m, &p, W, pk, back), 0);
    for (int t = 0; t < cap_T; t++)
        for (int b = 0; b < B; b++)
            for (int k = 0; k < W; k++) {
                size_t i = ((size_t)t * B + b) * W + k;
                assert_true(back[i] == (t < lens[b] ? pad[i] : 0.0f));
            }
    /* States: [2, B, W] to packed order and back. */
    float *st = fx_buf(fx, 2 * B * W, MT_TAG_BATCH, 13), *sp = fx_buf(fx, 2 * B * W, 0, 0);
    float *su = fx_buf(fx, 2 * B * W, 0, 0);
    assert_int_equal(mt_rnn_pack_states(m, &p, 2, W, st, sp), 0);
    assert_true(sp[(size_t)(B + 0) * W] == st[(size_t)(B + 1) * W]);
    assert_int_equal(mt_rnn_unpack_states(m, &p, 2, W, sp, su), 0);
    assert_memory_equal(st, su, 2 * B * W * sizeof(float));
    assert_int_equal(mt_rnn_pack_states(m, &p, 2, W, st, st), MT_EINVAL);
    mt_rnn_pack_fini(&p);
    assert_null(p.batch_sizes);

    /* Sorted input keeps its order. */
    const int sl[3] = {4, 4, 2};
    assert_int_equal(mt_rnn_pack_init(&p, sl, 3, 4, true, cap_log, &cap), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(p.sorted_indices[i], i);
    mt_rnn_io_t io = {0};
    mt_rnn_pack_io(&p, &io);
    assert_int_equal(io.seq_len, 4);
    assert_int_equal(io.batch, 3);
    assert_int_equal(io.tokens, 10);
    assert_ptr_equal(io.batch_sizes, p.batch_sizes);
    mt_rnn_pack_fini(&p);

    /* Bad lengths. */
    const int unsorted[3] = {2, 4, 1}, zero[3] = {4, 0, 1}, big[3] = {9, 4, 1};
    expect_error(&cap, mt_rnn_pack_init(&p, unsorted, 3, 4, true, cap_log, &cap), "not sorted");
    expect_error(&cap, mt_rnn_pack_init(&p, zero, 3, 4, false, cap_log, &cap), "zero length");
    expect_error(&cap, mt_rnn_pack_init(&p, big, 3, 8, false, cap_log, &cap), "above the capacity");
    expect_error(&cap, mt_rnn_pack_init(&p, sl, 0, 8, false, cap_log, &cap), "batch");
    mt_rnn_pack_fini(&p); /* harmless after a failed init */

    void *bufs[] = {pad, pk, back, st, sp, su};
    for (int i = 0; i < 6; i++)
        fx_put(fx, bufs[i]);
    mt_rnn_destroy(&m);
    fx_free(&fx);
}

/* ---- one training step through the public API ---- */

typedef struct step_s {
    float *x, *y, *hx, *cx, *hy, *cy, *dy, *dhy, *dcy, *dx, *dhx, *dcx;
} step_t;

static void step_alloc(rnn_fx_t *fx, step_t *s, const mt_rnn_cfg_t *c, size_t rows, int B,
                       uint64_t seed)
{
    size_t D = c->bidirectional ? 2 : 1, H = (size_t)c->hidden_size;
    size_t ny = rows * D * H, nst = (size_t)c->num_layers * D * (size_t)B * H;
    s->x = fx_buf(fx, rows * (size_t)c->input_size, MT_TAG_BATCH, seed);
    s->y = fx_buf(fx, ny, MT_TAG_ACTIVATIONS, 0);
    s->hx = fx_buf(fx, nst, MT_TAG_ACTIVATIONS, seed + 1);
    s->cx = fx_buf(fx, nst, MT_TAG_ACTIVATIONS, seed + 2);
    s->hy = fx_buf(fx, nst, MT_TAG_ACTIVATIONS, 0);
    s->cy = fx_buf(fx, nst, MT_TAG_ACTIVATIONS, 0);
    s->dy = fx_buf(fx, ny, MT_TAG_ACTIVATIONS, seed + 3);
    s->dhy = fx_buf(fx, nst, MT_TAG_ACTIVATIONS, seed + 4);
    s->dcy = fx_buf(fx, nst, MT_TAG_ACTIVATIONS, seed + 5);
    s->dx = fx_buf(fx, rows * (size_t)c->input_size, MT_TAG_ACTIVATIONS, 0);
    s->dhx = fx_buf(fx, nst, MT_TAG_ACTIVATIONS, 0);
    s->dcx = fx_buf(fx, nst, MT_TAG_ACTIVATIONS, 0);
}

static void step_free(rnn_fx_t *fx, step_t *s)
{
    float **p = &s->x;
    for (int i = 0; i < 12; i++)
        fx_put(fx, p[i]);
}

static mt_rnn_io_t step_io(const step_t *s, int T, int B, const int *bs, size_t rows)
{
    mt_rnn_io_t io = {.seq_len = T,
                      .batch = B,
                      .x = s->x,
                      .y = s->y,
                      .hx = s->hx,
                      .cx = s->cx,
                      .hy = s->hy,
                      .cy = s->cy,
                      .batch_sizes = bs,
                      .tokens = bs ? rows : 0};
    return io;
}

static mt_rnn_grad_io_t step_grad(const step_t *s)
{
    mt_rnn_grad_io_t g = {s->dy, s->dhy, s->dcy, s->dx, s->dhx, s->dcx};
    return g;
}

static int step_run(mt_rnn_t *m, const step_t *s, int T, int B, const int *bs, size_t rows)
{
    mt_rnn_io_t io = step_io(s, T, B, bs, rows);
    mt_rnn_grad_io_t g = step_grad(s);
    mt_rnn_reserve_t *r;
    int rc = mt_rnn_forward(m, &io, &r);
    if (rc == 0)
        rc = mt_rnn_backward(m, &r, &g);
    return rc;
}

/* Equal lengths given as batch_sizes: the same bits as the padded call, every output and
 * gradient, for every mode, 2 layers, uni and bi, with dropout and chunks of 3 steps; on
 * GEMM library lib (NULL: the default) with its step loops on threads threads. */
static void equal_lengths_on(const char *lib, int threads)
{
    rnn_fx_t *fx = fx_new(256u << 20);
    const int T = 7, B = 3;
    int bs[7];
    for (int t = 0; t < T; t++)
        bs[t] = B;
    for (int mode = 0; mode < 4; mode++)
        for (int bi = 0; bi < 2; bi++) {
            mt_rnn_cfg_t c = fx_cfg(fx, mode, 5, 6, 2, bi);
            c.dropout = 0.25f;
            c.dropout_seed = 9;
            c.chunk_steps = 3;
            c.gemm = lib;
            mt_rnn_t *a, *b;
            assert_int_equal(mt_rnn_create(&a, &c), 0);
            assert_int_equal(mt_rnn_create(&b, &c), 0);
            assert_int_equal(mt_rnn_set_gemm_threads(a, threads), 0);
            assert_int_equal(mt_rnn_set_gemm_threads(b, threads), 0);
            step_t sa, sb;
            step_alloc(fx, &sa, &c, (size_t)T * B, B, 21);
            step_alloc(fx, &sb, &c, (size_t)T * B, B, 21);
            assert_int_equal(step_run(a, &sa, T, B, NULL, 0), 0);
            assert_int_equal(step_run(b, &sb, T, B, bs, (size_t)T * B), 0);
            size_t ny = (size_t)T * B * (bi ? 2 : 1) * 6, nst = 2 * (bi ? 2 : 1) * B * 6;
            assert_memory_equal(sa.y, sb.y, ny * sizeof(float));
            assert_memory_equal(sa.hy, sb.hy, nst * sizeof(float));
            assert_memory_equal(sa.dx, sb.dx, (size_t)T * B * 5 * sizeof(float));
            assert_memory_equal(sa.dhx, sb.dhx, nst * sizeof(float));
            if (mode == MT_RNN_LSTM) {
                assert_memory_equal(sa.cy, sb.cy, nst * sizeof(float));
                assert_memory_equal(sa.dcx, sb.dcx, nst * sizeof(float));
            }
            size_t nw;
            float *ga = mt_rnn_grads(a, &nw), *gb = mt_rnn_grads(b, NULL);
            assert_memory_equal(ga, gb, nw * sizeof(float));
            step_free(fx, &sa);
            step_free(fx, &sb);
            mt_rnn_destroy(&a);
            mt_rnn_destroy(&b);
        }
    fx_free(&fx);
}

static void equal_lengths_bit_identical(void **state)
{
    (void)state;
    equal_lengths_on(NULL, 1);
}

/* GEMM library lib can be loaded here (a module on it is created). */
static bool gemm_here(const char *lib)
{
    rnn_fx_t *fx = fx_new(16u << 20);
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 2, 2, 1, false);
    c.gemm = lib;
    mt_rnn_t *m;
    int rc = mt_rnn_create(&m, &c);
    if (rc == 0)
        mt_rnn_destroy(&m);
    fx_free(&fx);
    return rc != MT_ENOTSUP;
}

/* The same with oneDNN at 2 threads: the step loops run the batch in two halves on two
 * threads (mt__rnn_rows_par), split alike for both forms. */
static void equal_lengths_bit_identical_2threads(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    skip(); /* oneDNN's OpenMP threads and LeakSanitizer: see test_rnn_golden.c */
#endif
    if (!gemm_here("dnnl"))
        skip();
    equal_lengths_on("dnnl", 2);
}

/* The same with OpenBLAS (step loops on one thread) and BLIS (in two halves) at 2 threads. */
static void equal_lengths_bit_identical_2threads_global(void **state)
{
    (void)state;
    equal_lengths_on("cblas", 2);
#if !defined(__SANITIZE_ADDRESS__)
    /* Debian's BLIS runs on OpenMP too: LeakSanitizer's exit-time tracer crashes with its
     * threads alive, as with oneDNN (test_rnn_golden.c); the plain build tests it. */
    if (gemm_here("blis")) /* else BLIS is not installed here */
        equal_lengths_on("blis", 2);
#endif
}

/* At two threads the step loops split the batch where the threads' measured speeds say
 * (mt__rnn_par_share) when their products are libxsmm's, and in fixed halves when a library
 * runs them: either way every output and gradient must be the same bits wherever the share
 * stands. Packed lengths, every mode, 2 layers, uni and bi, on every library here; hidden 40
 * in chunks of 3 steps (R's panels do not fit in the backward's xh: its dh products are the
 * library's, in halves) and hidden 4 (they fit, and the sums per sequence beside them).
 * Returns the number of arrays that differ, each printed, so that one library's failure
 * does not hide another's. */
static int split_same_bits_on(rnn_fx_t *fx, const char *lib, int H, int chunk)
{
    enum { T = 7, B = 6, IN = 5 };
    const int bs[T] = {6, 6, 5, 4, 3, 2, 1};
    size_t rows = 27;
    int bad = 0;
    for (int mode = 0; mode < 4; mode++)
        for (int bi = 0; bi < 2; bi++) {
            mt_rnn_cfg_t c = fx_cfg(fx, mode, IN, H, 2, bi);
            c.chunk_steps = chunk;
            c.gemm = lib;
            mt_rnn_t *m;
            assert_int_equal(mt_rnn_create(&m, &c), 0);
            assert_int_equal(mt_rnn_set_gemm_threads(m, 2), 0);
            if (m->shape.xsmm) {
                /* The shares tried put the split at different rows (else this tests nothing). */
                mt_rnn_io_t io = {.seq_len = T, .batch = B, .batch_sizes = bs, .tokens = rows};
                mt__rnn_seq_t q;
                double w[2];
                assert_int_equal(mt__rnn_seq_init(&q, &io), 0);
                int n = mt__rnn_cpu_chunk_steps(&m->shape, T, 0);
                assert_int_not_equal(mt__rnn_cpu_split(&m->shape, &q, 0, n, 0.2, w),
                                     mt__rnn_cpu_split(&m->shape, &q, 0, n, 0.8, w));
                mt__rnn_seq_fini(&q);
            }
            size_t D = bi ? 2 : 1, ny = rows * D * (size_t)H, nst = 2 * D * B * (size_t)H, nw;
            step_t s[2];
            float *g[2];
            for (int k = 0; k < 2; k++) {
                step_alloc(fx, &s[k], &c, rows, B, 21);
                mt__rnn_par_set_share(k ? 0.8 : 0.2, true);
                assert_int_equal(mt_rnn_zero_grads(m), 0);
                assert_int_equal(step_run(m, &s[k], T, B, bs, rows), 0);
                float *gm = mt_rnn_grads(m, &nw);
                g[k] = malloc(nw * sizeof(float));
                assert_non_null(g[k]);
                memcpy(g[k], gm, nw * sizeof(float));
            }
            mt__rnn_par_set_share(0.5, false);
            bool lstm = mode == MT_RNN_LSTM;
            const struct {
                const char *name;
                const float *a, *b;
                size_t n;
            } arr[] = {{"y", s[0].y, s[1].y, ny},
                       {"h_n", s[0].hy, s[1].hy, nst},
                       {"dx", s[0].dx, s[1].dx, rows * IN},
                       {"dh_0", s[0].dhx, s[1].dhx, nst},
                       {"c_n", s[0].cy, s[1].cy, lstm ? nst : 0},
                       {"dc_0", s[0].dcx, s[1].dcx, lstm ? nst : 0},
                       {"weight gradients", g[0], g[1], nw}};
            for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) {
                size_t j = 0;
                while (j < arr[i].n && memcmp(&arr[i].a[j], &arr[i].b[j], sizeof(float)) == 0)
                    j++;
                if (j == arr[i].n)
                    continue;
                bad++;
                print_error("%s, %s H %d %s chunk %d: %s[%zu] = %a at share 0.2, %a at 0.8\n", lib,
                            mt_rnn_mode_name(mode), H, bi ? "bi" : "uni", chunk, arr[i].name, j,
                            (double)arr[i].a[j], (double)arr[i].b[j]);
            }
            for (int k = 0; k < 2; k++) {
                free(g[k]);
                step_free(fx, &s[k]);
            }
            mt_rnn_destroy(&m);
        }
    return bad;
}

static void any_split_same_bits(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(256u << 20);
    const char *libs[3] = {"cblas", "blis", "dnnl"};
    int bad = 0;
    for (int i = 0; i < 3; i++) {
#if defined(__SANITIZE_ADDRESS__)
        if (i > 0) /* their OpenMP threads and LeakSanitizer (see above) */
            break;
#endif
        if (!gemm_here(libs[i])) {
            print_message("any_split_same_bits: %s not installed here\n", libs[i]);
            continue;
        }
        int b = split_same_bits_on(fx, libs[i], 40, 3) + split_same_bits_on(fx, libs[i], 4, 0);
        print_message("any_split_same_bits: %s: %s (%s)\n", libs[i],
                      b ? "arrays differ (above)" : "the same bits at shares 0.2 and 0.8",
                      fx_gemm_info(fx, libs[i]));
        bad += b;
    }
    fx_free(&fx);
    assert_int_equal(bad, 0);
}

/* ---- bad input ---- */

static void bad_batch_sizes(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    logcap_t cap = {0};
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_GRU, 3, 4, 1, false);
    c.log = cap_log;
    c.log_ud = &cap;
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    step_t s;
    step_alloc(fx, &s, &c, 12, 4, 5);
    const int inc[3] = {4, 2, 3}, zero[3] = {4, 0, 0}, first[3] = {3, 2, 1}, ok[3] = {4, 3, 2};
    mt_rnn_reserve_t *r = (mt_rnn_reserve_t *)&cap;
    mt_rnn_io_t io = step_io(&s, 3, 4, inc, 9);
    expect_error(&cap, mt_rnn_forward(m, &io, &r), "not non-increasing");
    assert_null(r);
    io = step_io(&s, 3, 4, zero, 4);
    expect_error(&cap, mt_rnn_forward(m, &io, NULL), "a step no sequence reaches");
    io = step_io(&s, 3, 4, first, 6);
    expect_error(&cap, mt_rnn_forward(m, &io, NULL), "is not the batch");
    io = step_io(&s, 3, 4, ok, 10);
    expect_error(&cap, mt_rnn_forward(m, &io, NULL), "sum to 9 rows but io.tokens is 10");
    mt_rnn_act_t act;
    expect_error(&cap, mt_rnn_activation_bytes_packed(m, 3, inc, &act), "not non-increasing");
    expect_error(&cap, mt_rnn_warmup_packed(m, 3, 4), "cannot fill");
    /* Nothing was lost: a good batch still runs. */
    assert_int_equal(step_run(m, &s, 3, 4, ok, 9), 0);
    assert_int_equal(mt__rnn_check(m), 0);
    step_free(fx, &s);
    mt_rnn_destroy(&m);
    fx_free(&fx);
}

/* Backward reads y (and x, hx, cx) back: changing one between forward and backward is an
 * error naming it, in every cell type; the reserve is released all the same. */
static void changed_y_is_refused(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    logcap_t cap = {0};
    const int bs[4] = {3, 3, 2, 1};
    const char *names[4] = {"y changed", "x changed", "hx changed", "cx changed"};
    for (int mode = 0; mode < 4; mode++) {
        mt_rnn_cfg_t c = fx_cfg(fx, mode, 3, 4, 2, false);
        c.log = cap_log;
        c.log_ud = &cap;
        mt_rnn_t *m;
        assert_int_equal(mt_rnn_create(&m, &c), 0);
        step_t s;
        step_alloc(fx, &s, &c, 9, 3, 7);
        for (int which = 0; which < (mode == MT_RNN_LSTM ? 4 : 3); which++) {
            mt_rnn_io_t io = step_io(&s, 4, 3, bs, 9);
            mt_rnn_grad_io_t g = step_grad(&s);
            mt_rnn_reserve_t *r;
            assert_int_equal(mt_rnn_forward(m, &io, &r), 0);
            float *victim[4] = {s.y, s.x, s.hx, s.cx};
            victim[which][4] += 0.5f;
            expect_error(&cap, mt_rnn_backward(m, &r, &g), names[which]);
            assert_null(r);
            victim[which][4] -= 0.5f;
        }
        /* Unchanged: fine. */
        assert_int_equal(step_run(m, &s, 4, 3, bs, 9), 0);
        assert_int_equal(cap.errors, 0);
        step_free(fx, &s);
        mt_rnn_destroy(&m);
        /* The refused passes' reserves and workspaces went back. */
        mt_alloc_stats_t as = fx_stats(fx);
        assert_int_equal(as.tag_allocated_bytes[MT_TAG_ACTIVATIONS].current, 0);
        assert_int_equal(as.tag_allocated_bytes[MT_TAG_WORKSPACE].current, 0);
    }
    fx_free(&fx);
}

/* The cpu path's checksum, summed in one sequence (what its pieces must compose to). */
static uint64_t fletcher_ref(const float *p, size_t n)
{
    uint64_t a[8] = {0}, b[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            uint32_t w;
            memcpy(&w, p + i + j, sizeof w);
            a[j] += w;
            b[j] += a[j];
        }
    for (; i < n; i++) {
        uint32_t w;
        memcpy(&w, p + i, sizeof w);
        a[0] += w;
        b[0] += a[0];
    }
    uint64_t r = n;
    for (int j = 0; j < 8; j++)
        r = (r ^ a[j] ^ (b[j] << 1)) * 0x9e3779b97f4a7c15ull + (r >> 29);
    return r;
}

/* A y of several of the checksum's pieces, summed by two threads: one float changed in any
 * piece, or two floats of different pieces swapped, is refused; unchanged passes. */
static void changed_large_y_is_refused_at_two_threads(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(256u << 20);
    logcap_t cap = {0};
    enum { T = 50, B = 40, H = 96 }; /* y: 192000 floats, 3 pieces */
    int bs[T];
    for (int t = 0; t < T; t++)
        bs[t] = B;
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 8, H, 1, false);
    c.log = cap_log;
    c.log_ud = &cap;
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    assert_int_equal(mt_rnn_set_gemm_threads(m, 2), 0);
    step_t s;
    size_t rows = (size_t)T * B, ny = rows * H;
    step_alloc(fx, &s, &c, rows, B, 11);
    const size_t at[4] = {5, ny / 2 + 3, ny - 70000, ny - 1};
    for (int k = 0; k < 5; k++) {
        mt_rnn_io_t io = step_io(&s, T, B, bs, rows);
        mt_rnn_grad_io_t g = step_grad(&s);
        mt_rnn_reserve_t *r;
        assert_int_equal(mt_rnn_forward(m, &io, &r), 0);
        /* The pieces compose to the sequential sum, for lengths with and without a tail. */
        for (size_t n = ny - 13; k == 0 && n <= ny; n += 13)
            assert_true(mt__rnn_cpu_path.checksum(m, s.y, n) == fletcher_ref(s.y, n));
        size_t i = k < 4 ? at[k] : 17, j = ny - 19; /* k = 4: y[i] and y[j] swapped */
        float keep = s.y[i], other = s.y[j];
        if (k < 4) {
            s.y[i] += 0.25f;
        } else {
            assert_true(keep != other);
            s.y[i] = other;
            s.y[j] = keep;
        }
        expect_error(&cap, mt_rnn_backward(m, &r, &g), "y changed");
        s.y[i] = keep;
        s.y[j] = other;
    }
    assert_int_equal(step_run(m, &s, T, B, bs, rows), 0);
    assert_int_equal(cap.errors, 0);
    step_free(fx, &s);
    mt_rnn_destroy(&m);
    fx_free(&fx);
}

/* ---- memory ---- */

static void activation_bytes_follow_tokens(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(64u << 20);
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 8, 16, 2, false);
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    const int bs[6] = {4, 4, 2, 1, 1, 1}; /* 13 tokens of 24 padded */
    mt_rnn_act_t pk, pad;
    assert_int_equal(mt_rnn_activation_bytes_packed(m, 6, bs, &pk), 0);
    assert_int_equal(mt_rnn_activation_bytes(m, 6, 4, &pad), 0);
    assert_int_equal(pk.reserve_bytes * 24, pad.reserve_bytes * 13);
    assert_int_equal(pk.engine_bytes_per_step, pad.engine_bytes_per_step);
    /* A training pass keeps exactly that. */
    step_t s;
    step_alloc(fx, &s, &c, 13, 4, 3);
    assert_int_equal(step_run(m, &s, 6, 4, bs, 13), 0);
    mt_rnn_stats_t st;
    assert_int_equal(mt_rnn_stats(m, &st), 0);
    assert_int_equal(st.pass_reserve_bytes, pk.reserve_bytes);
    step_free(fx, &s);
    mt_rnn_destroy(&m);
    fx_free(&fx);
}

static uint64_t rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Warm-up at (tokens, batch): then batches of any lengths within those bounds make no
 * backend malloc (uni and bi, chunks of 8 steps). */
static void warmup_packed_zero_mallocs(void **state)
{
    (void)state;
    for (int bi = 0; bi < 2; bi++) {
        rnn_fx_t *fx = fx_new(512u << 20);
        mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 8, 16, 2, bi);
        c.chunk_steps = 8;
        mt_rnn_t *m;
        assert_int_equal(mt_rnn_create(&m, &c), 0);
        const size_t maxN = 400;
        const int maxB = 8;
        step_t s;
        step_alloc(fx, &s, &c, maxN, maxB, 1);
        assert_int_equal(mt_rnn_warmup_packed(m, maxN, maxB), 0);
        uint64_t before = fx_backend_mallocs(fx), seed = 99 + (uint64_t)bi;
        for (int it = 0; it < 40; it++) {
            int B = 1 + (int)(rng(&seed) % maxB), lens[8];
            size_t N = 0;
            for (int b = 0; b < B; b++) {
                lens[b] = 1 + (int)(rng(&seed) % (maxN / (size_t)B));
                N += (size_t)lens[b];
            }
            mt_rnn_pack_t p;
            assert_int_equal(mt_rnn_pack_init(&p, lens, B, 400, false, NULL, NULL), 0);
            assert_true(p.tokens <= maxN);
            assert_int_equal(step_run(m, &s, p.max_len, B, p.batch_sizes, p.tokens), 0);
            mt_rnn_pack_fini(&p);
        }
        assert_int_equal(fx_backend_mallocs(fx), before);
        step_free(fx, &s);
        mt_rnn_destroy(&m);
        fx_free(&fx);
    }
}

/* Offload on packed input: the same bits as the plain run, chunks parked in host memory. */
static void offload_packed(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new(256u << 20);
    mt_host_cfg_t hc = mt_host_cfg_default();
    hc.backend = fx->b;
    mt_host_cache_t *host;
    assert_int_equal(mt_host_cache_create(&host, &hc), 0);
    const int lens[5] = {11, 9, 9, 4, 1};
    mt_rnn_pack_t p;
    assert_int_equal(mt_rnn_pack_init(&p, lens, 5, 11, true, NULL, NULL), 0);
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 4, 5, 2, false);
    c.chunk_steps = 2;
    mt_rnn_t *a, *b;
    assert_int_equal(mt_rnn_create(&a, &c), 0);
    c.offload_window = 1;
    c.offload_host = host;
    assert_int_equal(mt_rnn_create(&b, &c), 0);
    step_t sa, sb;
    step_alloc(fx, &sa, &c, p.tokens, 5, 4);
    step_alloc(fx, &sb, &c, p.tokens, 5, 4);
    assert_int_equal(step_run(a, &sa, p.max_len, 5, p.batch_sizes, p.tokens), 0);
    assert_int_equal(step_run(b, &sb, p.max_len, 5, p.batch_sizes, p.tokens), 0);
    assert_memory_equal(sa.y, sb.y, p.tokens * 5 * sizeof(float));
    assert_memory_equal(sa.dx, sb.dx, p.tokens * 4 * sizeof(float));
    assert_memory_equal(sa.hy, sb.hy, 2 * 5 * 5 * sizeof(float));
    size_t nw;
    float *ga = mt_rnn_grads(a, &nw);
    assert_memory_equal(ga, mt_rnn_grads(b, NULL), nw * sizeof(float));
    mt_rnn_stats_t st;
    assert_int_equal(mt_rnn_stats(b, &st), 0);
    assert_int_equal(st.offloads, 5); /* 6 chunks, a window of 1 */
    assert_true(st.pass_reserve_peak_bytes < st.pass_reserve_bytes);
    step_free(fx, &sa);
    step_free(fx, &sb);
    mt_rnn_destroy(&a);
    mt_rnn_destroy(&b);
    mt_rnn_pack_fini(&p);
    mt_host_cache_destroy(&host);
    fx_free(&fx);
}

/* Infinity-norm relative error of got against want (as test_rnn_golden's rel_err). */
static double rel_err_inf(const float *got, const float *want, size_t n)
{
    double scale = 0.0, worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs(want[i]));
        worst = fmax(worst, fabs((double)got[i] - want[i]));
    }
    return scale > 0.0 ? worst / scale : worst;
}

/* More threads than the two the step loops split into (docs/rnn-cpu.md, Threads): at 3 and
 * 4 threads, on a host of any core count, every output and gradient of a packed batch is
 * within the goldens' relative error (1e-5) of the same module's at one thread. Every mode,
 * 2 layers, uni and bi, dropout, chunks of 3 steps, on the default library and libxsmm
 * where it is wanted. */
static void more_threads_match_one(void **state)
{
    (void)state;
    enum { T = 7, B = 6, IN = 5, H = 6 };
    const int bs[T] = {6, 6, 5, 4, 3, 2, 1};
    const size_t rows = 27;
    rnn_fx_t *fx = fx_new(256u << 20);
    for (int mode = 0; mode < 4; mode++)
        for (int bi = 0; bi < 2; bi++)
            for (int threads = 3; threads <= 4; threads++) {
                mt_rnn_cfg_t c = fx_cfg(fx, mode, IN, H, 2, bi);
                c.dropout = 0.25f;
                c.dropout_seed = 9;
                c.chunk_steps = 3;
                mt_rnn_t *m[2];
                step_t st[2];
                for (int k = 0; k < 2; k++) {
                    assert_int_equal(mt_rnn_create(&m[k], &c), 0);
                    assert_int_equal(mt_rnn_set_gemm_threads(m[k], k ? threads : 1), 0);
                    step_alloc(fx, &st[k], &c, rows, B, 21);
                    assert_int_equal(step_run(m[k], &st[k], T, B, bs, rows), 0);
                }
                size_t D = bi ? 2 : 1, ny = rows * D * H, nst = 2 * D * B * H, nw;
                bool lstm = mode == MT_RNN_LSTM;
                const float *g0 = mt_rnn_grads(m[0], &nw), *g1 = mt_rnn_grads(m[1], NULL);
                const struct {
                    const char *name;
                    const float *one, *more;
                    size_t n;
                } arr[] = {{"y", st[0].y, st[1].y, ny},
                           {"h_n", st[0].hy, st[1].hy, nst},
                           {"dx", st[0].dx, st[1].dx, rows * IN},
                           {"dh_0", st[0].dhx, st[1].dhx, nst},
                           {"c_n", st[0].cy, st[1].cy, lstm ? nst : 0},
                           {"dc_0", st[0].dcx, st[1].dcx, lstm ? nst : 0},
                           {"weight gradients", g0, g1, nw}};
                for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) {
                    double e = rel_err_inf(arr[i].more, arr[i].one, arr[i].n);
                    if (e > 1e-5) {
                        print_error("mode %d bi %d, %d threads: %s: relative error %.3g > 1e-5\n",
                                    mode, bi, threads, arr[i].name, e);
                        fail();
                    }
                }
                for (int k = 0; k < 2; k++) {
                    step_free(fx, &st[k]);
                    mt_rnn_destroy(&m[k]);
                }
            }
    fx_free(&fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pack_round_trip),
        cmocka_unit_test(equal_lengths_bit_identical),
        cmocka_unit_test(equal_lengths_bit_identical_2threads),
        cmocka_unit_test(equal_lengths_bit_identical_2threads_global),
        cmocka_unit_test(any_split_same_bits),
        cmocka_unit_test(more_threads_match_one),
        cmocka_unit_test(bad_batch_sizes),
        cmocka_unit_test(changed_y_is_refused),
        cmocka_unit_test(changed_large_y_is_refused_at_two_threads),
        cmocka_unit_test(activation_bytes_follow_tokens),
        cmocka_unit_test(warmup_packed_zero_mallocs),
        cmocka_unit_test(offload_packed),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
