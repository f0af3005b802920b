/* Activation offload, an option of the RNN engine: a training pass with a window of reserve
 * chunks on the device gives bit-identical outputs and gradients to the plain pass of the same
 * module, and keeps the peak of device activation bytes near the window. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "host_fixture.h"
#include "tests/common/test_main.h"

typedef struct run_s {
    float *y, *hy, *cy, *dx, *dhx, *dcx, *dw;
    size_t act_peak;   /* allocator's peak of activations-tagged bytes during the pass */
    mt_rnn_stats_t st; /* the module's counters after the pass */
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

static void prob_init(prob_t *p, mt_rnn_mode_e mode, int T, int B, int I, int H, int L, bool bidir,
                      int chunk)
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
    rc.chunk_steps = chunk;
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

/* One training pass; window 0 = plain (no offload). Its stats are the counters it added. */
static void run(prob_t *p, int window, run_t *r)
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
    assert_int_equal(mt_rnn_set_offload(p->m, window > 0 ? p->f.h : NULL, window), 0);
    mt_rnn_stats_t before;
    assert_int_equal(mt_rnn_stats(p->m, &before), 0);
    mt_rnn_io_t io = {.seq_len = p->T,
                      .batch = p->B,
                      .x = p->x,
                      .y = r->y,
                      .hx = p->hx,
                      .cx = p->cx,
                      .hy = r->hy,
                      .cy = r->cy};
    mt_rnn_grad_io_t g = {p->dy, p->dhy, p->dcy, r->dx, r->dhx, r->dcx};
    mt_alloc_reset_peak(p->f.a);
    mt_rnn_reserve_t *res = NULL;
    assert_int_equal(mt_rnn_forward(p->m, &io, &res), 0);
    assert_int_equal(mt_rnn_backward(p->m, &res, &g), 0);
    assert_null(res);
    assert_int_equal(mt_rnn_stats(p->m, &r->st), 0);
    r->st.offloads -= before.offloads;
    r->st.restores -= before.restores;
    r->st.offload_bytes -= before.offload_bytes;
    r->st.restore_bytes -= before.restore_bytes;
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

static void check_case(mt_rnn_mode_e mode, int L, int T, int chunk, int window)
{
    prob_t p;
    prob_init(&p, mode, T, 4, 8, 32, L, false, chunk);
    int nchunks = (T + chunk - 1) / chunk;
    run_t plain, off, again;
    run(&p, 0, &plain);
    run(&p, window, &off);
    run(&p, 0, &again); /* switching offload off again gives the plain run back */

    /* Offloading moves bytes only: the same code rounds the same way. */
    same_bits(&p, &plain, &off);
    same_bits(&p, &plain, &again);

    assert_int_equal(plain.st.offloads, 0);
    assert_int_equal(plain.st.restores, 0);
    assert_int_equal(off.st.offloads, (uint64_t)(nchunks - window));
    assert_int_equal(off.st.restores, off.st.offloads);
    assert_int_equal(off.st.restore_bytes, off.st.offload_bytes);
    assert_true(off.st.offload_bytes > 0);

    /* Peak: the window's chunks in forward, one more in backward (the chunk differentiated
     * reads its predecessor's last step); without offload, the whole reserve. */
    size_t full = plain.st.pass_reserve_bytes;
    size_t chunk_bytes = full / (size_t)T * (size_t)chunk;
    assert_int_equal(off.st.pass_reserve_bytes, full);
    assert_int_equal(plain.st.pass_reserve_peak_bytes, full);
    assert_true(off.st.pass_reserve_peak_bytes <= (size_t)(window + 1) * chunk_bytes);
    assert_true(off.st.pass_reserve_peak_bytes >= (size_t)window * chunk_bytes);
    /* The allocator saw the same: activations-tagged bytes (rounded blocks) peaked there. */
    assert_true(plain.act_peak >= full);
    assert_true(off.act_peak <= (size_t)(window + 1) * (chunk_bytes + 512));
    assert_true(off.act_peak < plain.act_peak);
    assert_int_equal(mt_alloc_check(mt_host_cache_alloc(p.f.h)), 0);
    assert_int_equal(mt_alloc_check(p.f.a), 0);

    run_free(&p, &plain);
    run_free(&p, &off);
    run_free(&p, &again);
    prob_fini(&p);
}

static void test_lstm_1layer_window2(void **state)
{
    (void)state;
    check_case(MT_RNN_LSTM, 1, 64, 8, 2);
}

static void test_lstm_2layers_window1_ragged(void **state)
{
    (void)state;
    check_case(MT_RNN_LSTM, 2, 30, 4, 1); /* last chunk of 2 steps */
}

static void test_gru_1layer_window1_ragged(void **state)
{
    (void)state;
    check_case(MT_RNN_GRU, 1, 30, 4, 1);
}

static void test_gru_2layers_window3_ragged(void **state)
{
    (void)state;
    check_case(MT_RNN_GRU, 2, 50, 8, 3); /* last chunk of 2 steps */
}

static void test_rnn_tanh_2layers_window2(void **state)
{
    (void)state;
    check_case(MT_RNN_TANH, 2, 40, 6, 2); /* the reserve is the lower layer's output only */
}

static void test_refusals(void **state)
{
    (void)state;
    prob_t p;
    prob_init(&p, MT_RNN_LSTM, 8, 2, 4, 8, 1, true, 0);
    /* Bidirectional: the reverse direction needs the whole layer below at once. */
    assert_int_equal(mt_rnn_set_offload(p.m, p.f.h, 2), MT_ENOTSUP);
    assert_int_equal(mt_rnn_cfg(p.m)->offload_window, 0);
    mt_rnn_cfg_t c = *mt_rnn_cfg(p.m);
    c.offload_window = 1;
    c.offload_host = p.f.h;
    mt_rnn_t *m2 = NULL;
    assert_int_equal(mt_rnn_create(&m2, &c), MT_ENOTSUP);
    assert_null(m2);
    /* Unidirectional: a window needs a host cache over the module's backend. */
    c.bidirectional = false;
    c.offload_host = NULL;
    assert_int_equal(mt_rnn_create(&m2, &c), MT_EINVAL);
    c.offload_host = p.f.h;
    c.offload_window = -1;
    assert_int_equal(mt_rnn_create(&m2, &c), MT_EINVAL);
    c.offload_window = 0;
    c.chunk_steps = -1;
    assert_int_equal(mt_rnn_create(&m2, &c), MT_EINVAL);
    c.chunk_steps = 4;
    assert_int_equal(mt_rnn_create(&m2, &c), 0);
    assert_int_equal(mt_rnn_set_offload(m2, NULL, 1), MT_EINVAL);
    assert_int_equal(mt_rnn_set_offload(m2, p.f.h, -1), MT_EINVAL);
    assert_int_equal(mt_rnn_set_offload(m2, p.f.h, 1), 0);
    assert_int_equal(mt_rnn_cfg(m2)->offload_window, 1);
    assert_int_equal(mt_rnn_set_offload(m2, NULL, 0), 0);
    mt_rnn_destroy(&m2);
    prob_fini(&p);
}

/* A pass released without backward gives every byte back. */
static void test_release_without_backward(void **state)
{
    (void)state;
    prob_t p;
    prob_init(&p, MT_RNN_LSTM, 32, 2, 4, 16, 2, false, 4);
    assert_int_equal(mt_rnn_set_offload(p.m, p.f.h, 2), 0);
    float *y = dev(&p, p.ny, MT_TAG_OTHER);
    mt_rnn_io_t io = {.seq_len = p.T,
                      .batch = p.B,
                      .x = p.x,
                      .y = y,
                      .hx = NULL,
                      .cx = NULL,
                      .hy = NULL,
                      .cy = NULL};
    mt_rnn_reserve_t *res = NULL;
    assert_int_equal(mt_rnn_forward(p.m, &io, &res), 0);
    mt_rnn_stats_t ms;
    assert_int_equal(mt_rnn_stats(p.m, &ms), 0);
    assert_int_equal(ms.offloads, 6); /* 8 chunks, 2 kept */
    mt_rnn_reserve_release(p.m, &res);
    assert_null(res);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(p.f.a, &st), 0);
    assert_int_equal(st.tag_allocated_bytes[MT_TAG_ACTIVATIONS].current, 0);
    assert_int_equal(mt_alloc_stats(mt_host_cache_alloc(p.f.h), &st), 0);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 0);
    assert_int_equal(mt_alloc_free(p.f.a, y), 0);
    prob_fini(&p);
}

/* A pinned cache too small for one chunk: the training forward fails cleanly (nothing is
 * left allocated on either side) and the module keeps working. */
static void test_host_cache_exhausted(void **state)
{
    (void)state;
    prob_t p;
    prob_init(&p, MT_RNN_LSTM, 32, 2, 4, 16, 2, false, 4);
    mt_host_cfg_t hc = mt_host_cfg_default();
    hc.backend = p.f.b;
    hc.capacity = 4096; /* a chunk's reserve is 5.5 KiB */
    mt_host_cache_t *tiny = NULL;
    assert_int_equal(mt_host_cache_create(&tiny, &hc), 0);
    assert_int_equal(mt_rnn_set_offload(p.m, tiny, 1), 0);
    float *y = dev(&p, p.ny, MT_TAG_OTHER);
    mt_rnn_io_t io = {.seq_len = p.T,
                      .batch = p.B,
                      .x = p.x,
                      .y = y,
                      .hx = NULL,
                      .cx = NULL,
                      .hy = NULL,
                      .cy = NULL};
    mt_rnn_reserve_t *res = NULL;
    assert_int_equal(mt_rnn_forward(p.m, &io, &res), MT_ENOMEM);
    assert_null(res);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(p.f.a, &st), 0);
    assert_int_equal(st.tag_allocated_bytes[MT_TAG_ACTIVATIONS].current, 0);
    assert_int_equal(mt_alloc_stats(mt_host_cache_alloc(tiny), &st), 0);
    assert_int_equal(st.allocated_bytes[MT_STAT_ALL].current, 0);

    assert_int_equal(mt_rnn_set_offload(p.m, p.f.h, 1), 0);
    assert_int_equal(mt_rnn_forward(p.m, &io, &res), 0);
    mt_rnn_grad_io_t g = {.dy = p.dy};
    assert_int_equal(mt_rnn_backward(p.m, &res, &g), 0);
    assert_int_equal(mt_alloc_free(p.f.a, y), 0);
    mt_rnn_destroy(&p.m); /* its side stream goes before the tiny cache */
    mt_host_cache_destroy(&tiny);
    prob_fini(&p);
}

/* A replica on the same allocator keeps the offload setting; one on another device starts
 * without it (the pinned cache belongs to its backend). */
static void test_replicate(void **state)
{
    (void)state;
    prob_t p;
    prob_init(&p, MT_RNN_GRU, 8, 2, 4, 8, 1, false, 2);
    assert_int_equal(mt_rnn_set_offload(p.m, p.f.h, 1), 0);
    mt_rnn_t *same = NULL, *other = NULL;
    assert_int_equal(mt_rnn_replicate(p.m, p.f.a, &same), 0);
    assert_int_equal(mt_rnn_cfg(same)->offload_window, 1);
    assert_ptr_equal(mt_rnn_cfg(same)->offload_host, p.f.h);
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 64 * MIB;
    mt_backend_t *b2 = NULL;
    assert_int_equal(mt_backend_create(&b2, &bc), 0);
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b2;
    mt_alloc_t *a2 = NULL;
    assert_int_equal(mt_alloc_create(&a2, &ac), 0);
    assert_int_equal(mt_rnn_replicate(p.m, a2, &other), 0);
    assert_int_equal(mt_rnn_cfg(other)->offload_window, 0);
    assert_null(mt_rnn_cfg(other)->offload_host);
    /* And the cache cannot be set there either. */
    assert_int_equal(mt_rnn_set_offload(other, p.f.h, 1), MT_EINVAL);
    mt_rnn_destroy(&other);
    mt_rnn_destroy(&same);
    mt_alloc_destroy(&a2);
    mt_backend_destroy(&b2);
    prob_fini(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lstm_1layer_window2),
        cmocka_unit_test(test_lstm_2layers_window1_ragged),
        cmocka_unit_test(test_gru_1layer_window1_ragged),
        cmocka_unit_test(test_gru_2layers_window3_ragged),
        cmocka_unit_test(test_rnn_tanh_2layers_window2),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_release_without_backward),
        cmocka_unit_test(test_host_cache_exhausted),
        cmocka_unit_test(test_replicate),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
