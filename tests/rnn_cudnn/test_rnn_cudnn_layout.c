/* The cuDNN compute path through its fake: weight layouts other than ours (gathered into a
 * cuDNN-layout copy, or refused when they cannot be translated), the device a module lives
 * on, and unidirectional inference in chunks whose memory does not grow with T. */
#include "tests/rnn_cudnn/fixture.h"
#include "tests/common/test_main.h"

/* A region cuDNN places outside its weight space cannot be translated: the module is
 * refused with a message naming it, after every earlier answer was taken. Nothing leaks. */
static void test_layout_untranslatable(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    fake_dnn_shift_param(1, 6, (ptrdiff_t)1 << 20);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), MT_ENOTSUP);
    assert_null(f.m);
    assert_int_equal(f.errors, 1);
    assert_non_null(strstr(f.last_log, "pseudo-layer 1, linear layer 6"));
    assert_int_equal(fake_dnn_count("cudnnGetRNNWeightParams"), 8 + 6 + 1);
    assert_int_equal(fake_dnn_live(), f.live0);
    fx_down(&f);
}

/* Another layout than ours (padded, or a larger space): the path takes cuDNN's answers,
 * gathers every matrix into a cuDNN-layout weight space before each call (the fake checks
 * each weight is where it said), zeroes a cuDNN-layout grad space before backward weights
 * and adds it into our grad buffer region by region, so grads land where the views are. */
static void gather_round_trip(size_t pad, size_t extra)
{
    fx_t f;
    fx_up(&f);
    fake_dnn_pad_layout(pad);
    fake_dnn_weight_space_extra(extra);
    fake_dnn_expect_weights(true);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    size_t nw;
    float *w = mt_rnn_weights(f.m, &nw);
    float *dw = mt_rnn_grads(f.m, NULL);
    size_t space = fake_dnn_call(fake_dnn_find("cudnnGetRNNWeightSpaceSize", 0))->n[0];
    assert_true(space > nw * sizeof(float));
    float *host = malloc(nw * sizeof *host);
    assert_non_null(host);
    /* our buffers plus a cuDNN-layout copy of each */
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(f.a, &st), 0);
    assert_int_equal(st.tag_requested_bytes[MT_TAG_WEIGHTS].current,
                     (int64_t)(nw * sizeof(float) + space));
    assert_int_equal(st.tag_requested_bytes[MT_TAG_GRADS].current,
                     (int64_t)(nw * sizeof(float) + space));

    const int T = 3, B = 2;
    float *x = dbuf(&f, (size_t)T * B * 5, 1.0f);
    float *y = dbuf(&f, (size_t)T * B * 16, 0.0f);
    float *dy = dbuf(&f, (size_t)T * B * 16, 1.0f);
    for (int round = 1; round <= 2; round++) {
        /* round 1: forward on zero weights, backward on weights k (the CPU path's backward
         * also uses the weights as they are then): backward must gather again */
        for (size_t k = 0; k < nw; k++)
            host[k] = round == 1 ? 0.0f : (float)k;
        assert_int_equal(mt_memcpy(f.b, w, host, nw * sizeof(float), MT_MEMCPY_HOST_TO_DEVICE), 0);
        fake_dnn_expect_weights(round == 2);
        mt_rnn_io_t io = {.seq_len = T, .batch = B, .x = x, .y = y};
        mt_rnn_reserve_t *res;
        size_t from = fake_dnn_ncalls();
        assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
        const fake_dnn_call_t *c = fake_dnn_call(fake_dnn_find("cudnnRNNForward", from));
        assert_ptr_not_equal(c->p[4], w);
        assert_int_equal(c->n[0], space);
        void *base;
        size_t size;
        int tag;
        assert_int_equal(mt_alloc_block_info(f.a, c->p[4], &base, &size, &tag), 0);
        assert_int_equal(tag, MT_TAG_WEIGHTS);
        float yh;
        dget(&f, &yh, y, 1);
        assert_true(yh == (round == 1 ? 0.0f : (float)(nw - 1))); /* the last canonical weight */
        if (round == 1) {
            for (size_t k = 0; k < nw; k++)
                host[k] = (float)k;
            assert_int_equal(mt_memcpy(f.b, w, host, nw * sizeof(float), MT_MEMCPY_HOST_TO_DEVICE),
                             0);
            fake_dnn_expect_weights(true);
        }
        mt_rnn_grad_io_t g = {.dy = dy};
        from = fake_dnn_ncalls();
        assert_int_equal(mt_rnn_backward(f.m, &res, &g), 0);
        const fake_dnn_call_t *bw =
            fake_dnn_call(fake_dnn_find("cudnnRNNBackwardWeights_v8", from));
        assert_non_null(bw);
        assert_ptr_not_equal(bw->p[3], dw);
        assert_int_equal(mt_alloc_block_info(f.a, bw->p[3], &base, &size, &tag), 0);
        assert_int_equal(tag, MT_TAG_GRADS);
        /* its grad space was zeroed once, at creation (padding stays zero), ... */
        uint64_t a = 0, n = 0;
        size_t zeroed = 0, in = 0, out = 0;
        for (size_t i = find_call("cuMemsetD8Async", 0, &a, &n); i != SIZE_MAX;
             i = find_call("cuMemsetD8Async", i + 1, &a, &n))
            zeroed += a == (uintptr_t)bw->p[3] && n == space;
        assert_int_equal(zeroed, 1);
        /* ... got the module's gradients by copies before backward weights added to them,
         * and gave them back by copies after: no cudnnAddTensor (deprecated in cuDNN 9) */
        uintptr_t sdw = (uintptr_t)bw->p[3], gdw = (uintptr_t)dw;
        size_t i_fwd = c->clock;
        for (size_t i = find_call("cuMemcpyAsync", i_fwd, &a, &n); i != SIZE_MAX;
             i = find_call("cuMemcpyAsync", i + 1, &a, &n)) {
            in += a >= sdw && a < sdw + space && i < bw->clock;
            out += a >= gdw && a < gdw + nw * sizeof(float) && i >= bw->clock;
        }
        assert_true(in > 0 && out == in);
        assert_int_equal(fake_dnn_count("cudnnAddTensor"), 0);
        dget(&f, host, dw, nw);
        for (size_t k = 0; k < nw; k++)
            assert_true(host[k] == (float)round * (float)(k + 1));
    }
    assert_string_equal(fake_dnn_last_error(), "");
    free(host);
    assert_int_equal(mt_alloc_free(f.a, x), 0);
    assert_int_equal(mt_alloc_free(f.a, y), 0);
    assert_int_equal(mt_alloc_free(f.a, dy), 0);
    fx_down(&f);
}

static void test_gather_padded_layout(void **state)
{
    (void)state;
    gather_round_trip(256, 0);
}

static void test_gather_larger_space(void **state)
{
    (void)state;
    gather_round_trip(0, 64);
}

/* Inference of a unidirectional module runs in chunks of MT__RNN_CHUNK steps chained
 * through their final states, so its memory does not grow with T (U2): T = 200 and
 * T = 2000 peak at the same workspace. */
static void test_inference_chunks(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    f.cfg.bidirectional = false;
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    const int B = 2, I = 5, H = 8, L = 2, C = MT__RNN_CHUNK;
    int64_t peak[2];
    int lens[2] = {200, 2000};
    for (int r = 0; r < 2; r++) {
        int T = lens[r], nchunks = (T + C - 1) / C;
        float *x = dbuf(&f, (size_t)T * B * I, 1.0f);
        float *y = dbuf(&f, (size_t)T * B * H, 0.0f);
        float *hy = dbuf(&f, (size_t)L * B * H, 0.0f);
        float *cy = dbuf(&f, (size_t)L * B * H, 0.0f);
        mt_rnn_io_t io = {.seq_len = T, .batch = B, .x = x, .y = y, .hy = hy, .cy = cy};
        mt_alloc_reset_peak(f.a);
        size_t from = fake_dnn_ncalls();
        assert_int_equal(mt_rnn_forward(f.m, &io, NULL), 0);
        mt_alloc_stats_t st;
        assert_int_equal(mt_alloc_stats(f.a, &st), 0);
        peak[r] = st.tag_requested_bytes[MT_TAG_WORKSPACE].peak;
        const fake_dnn_call_t *prev = NULL;
        int k = 0;
        for (size_t i = fake_dnn_find("cudnnRNNForward", from); i != SIZE_MAX;
             i = fake_dnn_find("cudnnRNNForward", i + 1), k++) {
            const fake_dnn_call_t *c = fake_dnn_call(i);
            int t0 = k * C, n = T - t0 < C ? T - t0 : C;
            assert_int_equal(c->i[0], CUDNN_FWD_MODE_INFERENCE);
            assert_int_equal(c->i[3], n);
            assert_ptr_equal(c->p[0], x + (size_t)t0 * B * I);
            assert_ptr_equal(c->p[1], y + (size_t)t0 * B * H);
            if (prev)
                assert_ptr_equal(c->p[2], prev->p[3]); /* this chunk starts from the last */
            else
                assert_null(c->p[2]);
            assert_true(c->i[1] == (prev != NULL) && c->i[2] == 1);
            prev = c;
        }
        assert_int_equal(k, nchunks);
        assert_ptr_equal(prev->p[3], hy);
        float hh[2 * 2 * 8], yl;
        dget(&f, hh, hy, (size_t)L * B * H);
        assert_true(hh[0] == (float)nchunks); /* the fake's hy = hx + 1, chunk after chunk */
        dget(&f, &yl, y + (size_t)T * B * H - 1, 1);
        float wl;
        size_t nw;
        float *w = mt_rnn_weights(f.m, &nw);
        dget(&f, &wl, w + nw - 1, 1);
        assert_true(yl == wl); /* the last step was written */
        float *bufs[] = {x, y, hy, cy};
        for (int b = 0; b < 4; b++)
            assert_int_equal(mt_alloc_free(f.a, bufs[b]), 0);
    }
    assert_int_equal(peak[0], peak[1]);
    assert_string_equal(fake_dnn_last_error(), "");
    fx_down(&f);
}

/* cuDNN works on the current device: on device 1, from a thread whose current device is 0,
 * the handle is made, used and destroyed on device 1 (the fake refuses a call on another
 * device than its handle's), and the thread is back on device 0 after every entry. */
static void test_device_guard(void **state)
{
    (void)state;
    fx_t f;
    fx_up_on(&f, 1);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    assert_int_equal(fake_dnn_current_device(), 0);
    assert_int_equal(fake_dnn_call(fake_dnn_find("cudnnCreate", 0))->device, 1);
    for (size_t i = fake_dnn_find("cudnnGetRNNWeightParams", 0); i != SIZE_MAX;
         i = fake_dnn_find("cudnnGetRNNWeightParams", i + 1))
        assert_int_equal(fake_dnn_call(i)->device, 1);
    float *x = dbuf(&f, 4 * 2 * 5, 1.0f);
    float *y = dbuf(&f, 4 * 2 * 16, 0.0f);
    float *dy = dbuf(&f, 4 * 2 * 16, 1.0f);
    mt_rnn_io_t io = {.seq_len = 4, .batch = 2, .x = x, .y = y};
    mt_rnn_act_t act; /* a size query for a new shape is a cuDNN call too */
    assert_int_equal(mt_rnn_activation_bytes(f.m, 9, 3, &act), 0);
    assert_int_equal(fake_dnn_current_device(), 0);
    mt_rnn_reserve_t *res;
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
    assert_int_equal(fake_dnn_current_device(), 0);
    mt_rnn_grad_io_t g = {.dy = dy};
    assert_int_equal(mt_rnn_backward(f.m, &res, &g), 0);
    assert_int_equal(fake_dnn_current_device(), 0);
    assert_string_equal(fake_dnn_last_error(), "");
    for (size_t i = 0; i < fake_dnn_ncalls(); i++)
        if (strncmp(fake_dnn_call(i)->name, "cudnn", 5) == 0)
            assert_int_equal(fake_dnn_call(i)->device, 1);
    size_t from = fake_dnn_ncalls();
    assert_int_equal(mt_alloc_free(f.a, x), 0);
    assert_int_equal(mt_alloc_free(f.a, y), 0);
    assert_int_equal(mt_alloc_free(f.a, dy), 0);
    mt_rnn_destroy(&f.m);
    assert_int_equal(fake_dnn_call(fake_dnn_find("cudnnDestroy", from))->device, 1);
    assert_int_equal(fake_dnn_current_device(), 0);
    /* a thread already on the device is left alone: no switch at all */
    fake_dnn_set_current_device(1);
    from = fake_dnn_ncalls();
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    assert_int_equal(fake_dnn_current_device(), 1);
    assert_int_equal(fake_dnn_find("cudaSetDevice", from), SIZE_MAX);
    fx_down(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_untranslatable), cmocka_unit_test(test_gather_padded_layout),
        cmocka_unit_test(test_gather_larger_space),   cmocka_unit_test(test_inference_chunks),
        cmocka_unit_test(test_device_guard),
    };
    return MT_TEST_RUN(tests, fake_ctl_open, fake_ctl_close);
}
