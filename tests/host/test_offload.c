/* Activation offload: the chunked training pass with a window of chunks on the device gives
 * bit-identical results to the same pass without offload, agrees with the whole-sequence
 * engine to float rounding, and keeps the peak of device activation bytes near the window. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "host_fixture.h"

typedef struct run_s {
    float *y, *hy, *cy, *dx, *dhx, *dcx, *dw;
    size_t act_peak; /* allocator's peak of activations-tagged bytes during the pass */
    mt_rnn_offload_stats_t st;
} run_t;

typedef struct prob_s {
    fx_t f;
    mt_rnn_t *m;
    int T, B, I, H, L;
    bool lstm;
    float *x, *hx, *cx, *dy, *dhy, *dcy; /* device inputs */
    size_t nw, ny, ns, nx;
} prob_t;

static float *dev(prob_t *p, size_t n, int tag)
{
    float *d = NULL;
    assert_int_equal(mt_alloc_malloc(p->f.a, n * sizeof(float), NULL, tag, (void **)&d), 0);
    memset(d, 0, n * sizeof(float));
    return d;
}

static void fill(float *d, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        d[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
    }
}

static void prob_init(prob_t *p, mt_rnn_mode_e mode, int T, int B, int I, int H, int L, bool bidir)
{
    memset(p, 0, sizeof *p);
    fx_init(&p->f, 256 * MIB, 256 * MIB);
    p->T = T, p->B = B, p->I = I, p->H = H, p->L = L;
    p->lstm = mode == MT_RNN_LSTM;
    mt_rnn_cfg_t rc = mt_rnn_cfg_default();
    rc.mode = mode;
    rc.input_size = I;
    rc.hidden_size = H;
    rc.num_layers = L;
    rc.bidirectional = bidir;
    rc.seed = 7;
    rc.alloc = p->f.a;
    assert_int_equal(mt_rnn_create(&p->m, &rc), 0);
    mt_rnn_weights(p->m, &p->nw);
    p->nx = (size_t)T * B * I;
    p->ny = (size_t)T * B * H * (bidir ? 2 : 1);
    p->ns = (size_t)L * B * H * (bidir ? 2 : 1);
    p->x = dev(p, p->nx, MT_TAG_BATCH);
    p->dy = dev(p, p->ny, MT_TAG_BATCH);
    p->hx = dev(p, p->ns, MT_TAG_BATCH);
    p->dhy = dev(p, p->ns, MT_TAG_BATCH);
    fill(p->x, p->nx, 1);
    fill(p->dy, p->ny, 2);
    fill(p->hx, p->ns, 3);
    fill(p->dhy, p->ns, 4);
    if (p->lstm) {
        p->cx = dev(p, p->ns, MT_TAG_BATCH);
        p->dcy = dev(p, p->ns, MT_TAG_BATCH);
        fill(p->cx, p->ns, 5);
        fill(p->dcy, p->ns, 6);
    }
}

static void prob_fini(prob_t *p)
{
    float *bufs[] = {p->x, p->hx, p->cx, p->dy, p->dhy, p->dcy};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        assert_int_equal(mt_alloc_free(p->f.a, bufs[i]), 0);
    mt_rnn_destroy(&p->m);
    fx_fini(&p->f);
}

/* window < 0: the whole-sequence engine (no chunks); otherwise chunked with offload. */
static void run(prob_t *p, int chunk, int window, run_t *r)
{
    memset(r, 0, sizeof *r);
    r->y = dev(p, p->ny, MT_TAG_OTHER);
    r->hy = dev(p, p->ns, MT_TAG_OTHER);
    r->dx = dev(p, p->nx, MT_TAG_OTHER);
    r->dhx = dev(p, p->ns, MT_TAG_OTHER);
    if (p->lstm) {
        r->cy = dev(p, p->ns, MT_TAG_OTHER);
        r->dcx = dev(p, p->ns, MT_TAG_OTHER);
    }
    assert_int_equal(mt_rnn_zero_grads(p->m), 0);
    mt_rnn_io_t io = {p->T, p->B, p->x, r->y, p->hx, p->cx, r->hy, r->cy};
    mt_rnn_grad_io_t g = {p->dy, p->dhy, p->dcy, r->dx, r->dhx, r->dcx};
    mt_alloc_reset_peak(p->f.a);
    if (window < 0) {
        mt_rnn_reserve_t *res = NULL;
        assert_int_equal(mt_rnn_forward(p->m, &io, &res), 0);
        assert_int_equal(mt_rnn_backward(p->m, &res, &g), 0);
    } else {
        mt_rnn_offload_cfg_t oc = mt_rnn_offload_cfg_default();
        oc.host = p->f.h;
        oc.chunk_steps = chunk;
        oc.window_chunks = window;
        mt_rnn_offload_t *pass = NULL;
        assert_int_equal(mt_rnn_offload_forward(p->m, &oc, &io, &pass), 0);
        assert_non_null(pass);
        assert_int_equal(mt_rnn_offload_backward(p->m, &pass, &g, &r->st), 0);
        assert_null(pass);
    }
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(p->f.a, &st), 0);
    r->act_peak = (size_t)st.tag_allocated_bytes[MT_TAG_ACTIVATIONS].peak;
    assert_int_equal(st.tag_allocated_bytes[MT_TAG_ACTIVATIONS].current, 0);
    r->dw = malloc(p->nw * sizeof(float));
    assert_non_null(r->dw);
    memcpy(r->dw, mt_rnn_grads(p->m, NULL), p->nw * sizeof(float));
}

static void run_free(prob_t *p, run_t *r)
{
    float *bufs[] = {r->y, r->hy, r->cy, r->dx, r->dhx, r->dcx};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        assert_int_equal(mt_alloc_free(p->f.a, bufs[i]), 0);
    free(r->dw);
}

static void same_bits(const prob_t *p, const run_t *a, const run_t *b)
{
    assert_memory_equal(a->y, b->y, p->ny * sizeof(float));
    assert_memory_equal(a->hy, b->hy, p->ns * sizeof(float));
    assert_memory_equal(a->dx, b->dx, p->nx * sizeof(float));
    assert_memory_equal(a->dhx, b->dhx, p->ns * sizeof(float));
    assert_memory_equal(a->dw, b->dw, p->nw * sizeof(float));
    if (p->lstm) {
        assert_memory_equal(a->cy, b->cy, p->ns * sizeof(float));
        assert_memory_equal(a->dcx, b->dcx, p->ns * sizeof(float));
    }
}

static void close_to(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float tol = 1e-4f * (1.0f + fabsf(b[i]));
        if (fabsf(a[i] - b[i]) > tol)
            fail_msg("element %zu: %.9g vs %.9g", i, (double)a[i], (double)b[i]);
    }
}

static void check_case(mt_rnn_mode_e mode, int T, int chunk, int window)
{
    prob_t p;
    prob_init(&p, mode, T, 4, 8, 32, 2, false);
    int nchunks = (T + chunk - 1) / chunk;
    run_t whole, kept, off;
    run(&p, 0, -1, &whole);
    run(&p, chunk, nchunks, &kept); /* same chunks, every one stays on the device */
    run(&p, chunk, window, &off);

    assert_int_equal(kept.st.offloads, 0);
    assert_int_equal(off.st.chunks, (unsigned)nchunks);
    assert_int_equal(off.st.offloads, (unsigned)(nchunks - window));
    assert_int_equal(off.st.restores, off.st.offloads);
    assert_int_equal(off.st.bytes_in, off.st.bytes_out);
    assert_true(off.st.bytes_out > 0);
    /* Offloading moves bytes only. */
    same_bits(&p, &kept, &off);
    /* Chunking changes the summation order of the merged weight-gradient GEMMs only. */
    close_to(off.y, whole.y, p.ny);
    close_to(off.dx, whole.dx, p.nx);
    close_to(off.dhx, whole.dhx, p.ns);
    close_to(off.dw, whole.dw, p.nw);

    /* Peak: the window's reserves plus the carried states, far below the whole reserve. */
    size_t chunk_res = off.st.full_reserve_bytes / (size_t)T * (size_t)chunk;
    size_t states = (size_t)(nchunks - 1) * (p.lstm ? 2 : 1) * p.ns * sizeof(float);
    assert_true(off.st.full_reserve_bytes == whole.act_peak);
    assert_true(off.st.peak_device_bytes <= (size_t)window * chunk_res + states);
    assert_true(off.st.peak_device_bytes >= chunk_res);
    assert_true(kept.st.peak_device_bytes >= off.st.full_reserve_bytes);
    /* The allocator saw the same: activations-tagged bytes peaked near the window. */
    assert_true(off.act_peak < whole.act_peak / 2);
    assert_true(off.act_peak <= (size_t)window * (chunk_res + 512) + states + 16 * 512);
    assert_int_equal(mt_alloc_check(mt_host_cache_alloc(p.f.h)), 0);

    run_free(&p, &whole);
    run_free(&p, &kept);
    run_free(&p, &off);
    prob_fini(&p);
}

static void test_lstm_window2(void **state)
{
    (void)state;
    check_case(MT_RNN_LSTM, 64, 8, 2);
}

static void test_gru_window1_ragged(void **state)
{
    (void)state;
    check_case(MT_RNN_GRU, 30, 4, 1); /* last chunk of 2 steps */
}

static void test_lstm_window3(void **state)
{
    (void)state;
    check_case(MT_RNN_LSTM, 48, 4, 3);
}

static void test_refusals(void **state)
{
    (void)state;
    prob_t p;
    prob_init(&p, MT_RNN_LSTM, 8, 2, 4, 8, 1, true);
    float *y = dev(&p, p.ny, MT_TAG_OTHER);
    mt_rnn_io_t io = {p.T, p.B, p.x, y, NULL, NULL, NULL, NULL};
    mt_rnn_offload_cfg_t oc = mt_rnn_offload_cfg_default();
    oc.host = p.f.h;
    mt_rnn_offload_t *pass = NULL;
    assert_int_equal(mt_rnn_offload_forward(p.m, &oc, &io, &pass), MT_ENOTSUP);
    assert_null(pass);
    oc.chunk_steps = 0;
    assert_int_equal(mt_rnn_offload_forward(p.m, &oc, &io, &pass), MT_EINVAL);
    oc.chunk_steps = 4;
    oc.window_chunks = 0;
    assert_int_equal(mt_rnn_offload_forward(p.m, &oc, &io, &pass), MT_EINVAL);
    assert_int_equal(mt_alloc_free(p.f.a, y), 0);
    prob_fini(&p);
}

/* A pass released without backward gives every byte back. */
static void test_release_without_backward(void **state)
{
    (void)state;
    prob_t p;
    prob_init(&p, MT_RNN_LSTM, 32, 2, 4, 16, 1, false);
    float *y = dev(&p, p.ny, MT_TAG_OTHER);
    mt_rnn_io_t io = {p.T, p.B, p.x, y, NULL, NULL, NULL, NULL};
    mt_rnn_offload_cfg_t oc = mt_rnn_offload_cfg_default();
    oc.host = p.f.h;
    oc.chunk_steps = 4;
    oc.window_chunks = 2;
    mt_rnn_offload_t *pass = NULL;
    assert_int_equal(mt_rnn_offload_forward(p.m, &oc, &io, &pass), 0);
    mt_rnn_offload_release(p.m, &pass);
    assert_null(pass);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(p.f.a, &st), 0);
    assert_int_equal(st.tag_allocated_bytes[MT_TAG_ACTIVATIONS].current, 0);
    assert_int_equal(mt_alloc_stats(mt_host_cache_alloc(p.f.h), &st), 0);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(mt_alloc_free(p.f.a, y), 0);
    prob_fini(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lstm_window2),
        cmocka_unit_test(test_gru_window1_ragged),
        cmocka_unit_test(test_lstm_window3),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_release_without_backward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
