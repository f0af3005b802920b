/* What the cuDNN path checks and keeps straight: the y
 * (and x) backward reads back changed since forward; a matrix cuDNN describes with another
 * shape than the engine's; the gathered weight space's padding zeroed; a failed size query
 * that does not poison later calls; cuDNN's last-error text in the log; the dropout states
 * advanced by each training forward; a libcudnn older than 9. Against the computing fake in cuDNN's
 * layout. */
#include "rnn/cudnn_internal.h"
#include "tests/rnn_cudnn/fixture.h"
#include "tests/common/test_main.h"

static void up(fx_t *f)
{
    fx_up(f);
    fake_dnn_markers(false);
    fake_dnn_interleaved_layout(false);
    f->cfg.input_size = 5;
    f->cfg.hidden_size = 8;
}

/* With check_saved, a training step whose y (then x) the caller changes before backward:
 * MT_EINVAL naming it, in every cell type; unchanged, the same step passes. */
static void test_changed_y_is_refused(void **state)
{
    (void)state;
    mt_rnn_mode_e modes[] = {MT_RNN_LSTM, MT_RNN_GRU, MT_RNN_TANH, MT_RNN_RELU};
    for (int mi = 0; mi < 4; mi++) {
        fx_t f;
        up(&f);
        f.cfg.mode = modes[mi];
        f.cfg.check_saved = true;
        assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
        const int T = 3, B = 2, DH = 16;
        float *x = dbuf(&f, (size_t)T * B * 5, 0.5f), *y = dbuf(&f, (size_t)T * B * DH, 0.0f);
        float *dy = dbuf(&f, (size_t)T * B * DH, 1.0f);
        const char *names[] = {"y", "x", NULL};
        for (int k = 0; k < 3; k++) {
            mt_rnn_io_t io = {.seq_len = T, .batch = B, .x = x, .y = y};
            mt_rnn_reserve_t *res = NULL;
            assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
            float *victim = k == 0 ? y : x;
            if (names[k]) {
                float v = 0.25f;
                assert_int_equal(mt_memcpy(f.b, victim + 3, &v, sizeof v, MT_MEMCPY_HOST_TO_DEVICE),
                                 0);
            }
            mt_rnn_grad_io_t g = {.dy = dy};
            int rc = mt_rnn_backward(f.m, &res, &g);
            if (names[k]) {
                assert_int_equal(rc, MT_EINVAL);
                char want[32];
                snprintf(want, sizeof want, "%s changed", names[k]);
                assert_non_null(strstr(f.last_log, want));
                mt_rnn_reserve_release(f.m, &res);
                f.errors = 0;
            } else {
                assert_int_equal(rc, 0);
            }
        }
        assert_int_equal(f.errors, 0);
        float *bufs[] = {x, y, dy};
        for (int k = 0; k < 3; k++)
            assert_int_equal(mt_alloc_free(f.a, bufs[k]), 0);
        fx_down(&f);
    }
}

/* Copies and stream waits of a training step at an unchanged padded shape (after one step
 * that set everything up), with or without the saved-inputs check. */
static void step_costs(bool check, size_t *syncs, size_t *copies)
{
    fx_t f;
    up(&f);
    f.cfg.check_saved = check;
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    const int T = 3, B = 2, DH = 16;
    float *x = dbuf(&f, (size_t)T * B * 5, 0.5f), *y = dbuf(&f, (size_t)T * B * DH, 0.0f);
    float *dy = dbuf(&f, (size_t)T * B * DH, 1.0f);
    size_t s0 = 0, c0 = 0;
    for (int k = 0; k < 2; k++) {
        s0 = fk.count("cuStreamSynchronize") + fk.count("cuCtxSynchronize");
        c0 = fk.count("cuMemcpyAsync");
        mt_rnn_io_t io = {.seq_len = T, .batch = B, .x = x, .y = y};
        mt_rnn_reserve_t *res = NULL;
        assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
        mt_rnn_grad_io_t g = {.dy = dy};
        assert_int_equal(mt_rnn_backward(f.m, &res, &g), 0);
    }
    *syncs = fk.count("cuStreamSynchronize") + fk.count("cuCtxSynchronize") - s0;
    *copies = fk.count("cuMemcpyAsync") - c0;
    assert_int_equal(f.errors, 0);
    float *bufs[] = {x, y, dy};
    for (int k = 0; k < 3; k++)
        assert_int_equal(mt_alloc_free(f.a, bufs[k]), 0);
    fx_down(&f);
}

/* By default a training step waits for the stream nowhere and copies nothing to the host;
 * with the check, forward and backward each copy y and x (no hx, cx here) to the host. */
static void test_saved_check_is_opt_in(void **state)
{
    (void)state;
    size_t syncs, copies;
    step_costs(false, &syncs, &copies);
    assert_int_equal(syncs, 0);
    size_t syncs_on, copies_on;
    step_costs(true, &syncs_on, &copies_on);
    assert_true(syncs_on > 0);
    assert_int_equal(copies_on, copies + 4);
}

/* cuDNN describes one matrix transposed ([in x H]: as many elements, another order): the
 * path refuses to translate it and says what it got. */
static void test_transposed_matrix_is_refused(void **state)
{
    (void)state;
    fx_t f;
    up(&f);
    fake_dnn_transpose_param(2, 1);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), MT_ENOTSUP);
    assert_null(f.m);
    assert_non_null(strstr(f.last_log, "pseudo-layer 2, linear layer 1"));
    assert_non_null(strstr(f.last_log, "dims {1, 16, 8}"));
    fx_down(&f);
}

/* A padded cuDNN layout: the bytes between regions of the gathered weight space are zero,
 * even where the allocator hands back a block that held something else. */
static void test_gathered_space_zeroed(void **state)
{
    (void)state;
    fx_t f;
    up(&f);
    fake_dnn_pad_layout(256);
    fake_dnn_check_padding(true);
    /* the cache emptied, then 8 blocks of the weight space's size dirtied and freed: they
     * merge into one free block at a segment's start, from which the module's blocks
     * (weights, grads, then the gathered spaces) are cut in order */
    mt_rnn_t *probe = NULL;
    assert_int_equal(mt_rnn_create(&probe, &f.cfg), 0);
    size_t space = fake_dnn_call(fake_dnn_find("cudnnGetRNNWeightSpaceSize", 0))->n[0];
    mt_rnn_destroy(&probe);
    assert_int_equal(mt_alloc_empty_cache(f.a), 0);
    void *dirty[8];
    for (int k = 0; k < 8; k++) {
        assert_int_equal(mt_alloc_malloc(f.a, space, f.s, MT_TAG_BATCH, &dirty[k]), 0);
        assert_int_equal(mt_memset_async(f.b, dirty[k], 0xff, space, f.s), 0);
    }
    for (int k = 0; k < 8; k++)
        assert_int_equal(mt_alloc_free(f.a, dirty[k]), 0);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    float *x = dbuf(&f, 2 * 2 * 5, 0.5f), *y = dbuf(&f, 2 * 2 * 16, 0.0f);
    mt_rnn_io_t io = {.seq_len = 2, .batch = 2, .x = x, .y = y};
    assert_int_equal(mt_rnn_forward(f.m, &io, NULL), 0);
    assert_string_equal(fake_dnn_last_error(), "");
    assert_int_equal(mt_alloc_free(f.a, x), 0);
    assert_int_equal(mt_alloc_free(f.a, y), 0);
    fx_down(&f);
}

/* A size query that fails (here under mt_rnn_activation_bytes) does not make a later
 * forward of another shape fail; a pass whose buffers it sized still does. */
static void test_failed_size_query_does_not_poison(void **state)
{
    (void)state;
    fx_t f;
    up(&f);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    fake_dnn_fail("cudnnGetRNNTempSpaceSizes", CUDNN_STATUS_BAD_PARAM);
    mt_rnn_act_t act;
    mt_rnn_activation_bytes(f.m, 7, 2, &act);
    assert_int_equal(act.reserve_bytes, 0);
    float *x = dbuf(&f, 3 * 2 * 5, 0.5f), *y = dbuf(&f, 3 * 2 * 16, 0.0f);
    mt_rnn_io_t io = {.seq_len = 3, .batch = 2, .x = x, .y = y};
    mt_rnn_reserve_t *res = NULL;
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
    mt_rnn_reserve_release(f.m, &res);
    assert_int_equal(mt_rnn_forward(f.m, &io, NULL), 0);
    /* the reserve of this pass is sized by a failing query: the pass fails, with its code */
    io.seq_len = 2;
    fake_dnn_fail("cudnnGetRNNTempSpaceSizes", CUDNN_STATUS_BAD_PARAM);
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), MT_EINVAL);
    assert_null(res);
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
    mt_rnn_reserve_release(f.m, &res);
    assert_int_equal(mt_alloc_free(f.a, x), 0);
    assert_int_equal(mt_alloc_free(f.a, y), 0);
    fx_down(&f);
}

/* A refused call's log line carries cuDNN's own reason (cudnnGetLastErrorString). */
static void test_last_error_string_logged(void **state)
{
    (void)state;
    fx_t f;
    up(&f);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    float *x = dbuf(&f, 3 * 2 * 5, 0.5f);
    mt_rnn_io_t io = {.seq_len = 3, .batch = 2, .x = x, .y = NULL};
    float *y = dbuf(&f, 3 * 2 * 16, 0.0f);
    io.y = y;
    /* an injected status without a reason: the status is logged */
    fake_dnn_fail("cudnnRNNForward", CUDNN_STATUS_BAD_PARAM);
    assert_int_equal(mt_rnn_forward(f.m, &io, NULL), MT_EINVAL);
    assert_non_null(strstr(f.last_log, "cudnnRNNForward"));
    /* a refusal with a reason: weights not where the layout has them */
    fake_dnn_expect_weights(true);
    assert_int_equal(mt_rnn_forward(f.m, &io, NULL), MT_EINVAL);
    assert_non_null(strstr(f.last_log, "a weight is not where this layout has it"));
    fake_dnn_expect_weights(false);
    assert_int_equal(mt_alloc_free(f.a, x), 0);
    assert_int_equal(mt_alloc_free(f.a, y), 0);
    fx_down(&f);
}

/* Each training forward with dropout advances cuDNN's generator states: two forwards of
 * the same input differ; inference ones do not draw. */
static void test_dropout_states_advance(void **state)
{
    (void)state;
    fx_t f;
    up(&f);
    f.cfg.dropout = 0.5f;
    f.cfg.dropout_seed = 99;
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    const int T = 3, B = 2, N = T * B * 16;
    float *x = dbuf(&f, (size_t)T * B * 5, 0.5f), *y = dbuf(&f, (size_t)N, 0.0f);
    float a[96], b[96], c[96];
    mt_rnn_io_t io = {.seq_len = T, .batch = B, .x = x, .y = y};
    mt_rnn_reserve_t *res = NULL;
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
    size_t i1 = fake_dnn_find("cudnnRNNForward", 0);
    dget(&f, a, y, (size_t)N);
    mt_rnn_reserve_release(f.m, &res);
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
    size_t i2 = fake_dnn_find("cudnnRNNForward", i1 + 1);
    dget(&f, b, y, (size_t)N);
    mt_rnn_reserve_release(f.m, &res);
    assert_int_equal(fake_dnn_call(i1)->u, 0);
    assert_int_equal(fake_dnn_call(i2)->u, 1);
    assert_true(memcmp(a, b, sizeof a) != 0);
    /* reseeding to the start reproduces the first pass */
    assert_int_equal(mt_rnn_set_dropout_state(f.m, 99, 0), 0);
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
    dget(&f, c, y, (size_t)N);
    mt_rnn_reserve_release(f.m, &res);
    assert_true(memcmp(a, c, sizeof a) == 0);
    assert_int_equal(mt_alloc_free(f.a, x), 0);
    assert_int_equal(mt_alloc_free(f.a, y), 0);
    fx_down(&f);
}

/* Copies from `from` on whose destination lies in [lo, lo + n): their count and bytes. */
static size_t copies_into(size_t from, const void *lo, size_t n, size_t *bytes)
{
    uint64_t a = 0, len = 0;
    size_t k = 0;
    *bytes = 0;
    for (size_t i = find_call("cuMemcpyAsync", from, &a, &len); i != SIZE_MAX;
         i = find_call("cuMemcpyAsync", i + 1, &a, &len)) {
        if (a >= (uintptr_t)lo && a < (uintptr_t)lo + n) {
            k++;
            *bytes += len;
        }
    }
    return k;
}

/* The copy the engine's layout costs against cuDNN's (matrices first), measured on the fake
 * driver for the 2-layer bidirectional LSTM with bias: two cuDNN-layout spaces held, and
 * 2 copies per pseudo-layer of all the weight bytes into the weight space per forward; per
 * backward the weights and gradients in and the gradients back. */
static void test_gather_copies_measured(void **state)
{
    (void)state;
    fx_t f;
    up(&f);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    size_t nw = 0;
    float *w = mt_rnn_weights(f.m, &nw);
    float *dw = mt_rnn_grads(f.m, NULL);
    size_t wbytes = nw * sizeof(float);
    size_t space = fake_dnn_call(fake_dnn_find("cudnnGetRNNWeightSpaceSize", 0))->n[0];
    assert_int_equal(space, wbytes); /* same size, another order */
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(f.a, &st), 0);
    assert_int_equal(st.tag_requested_bytes[MT_TAG_WEIGHTS].current, (int64_t)(wbytes + space));
    assert_int_equal(st.tag_requested_bytes[MT_TAG_GRADS].current, (int64_t)(wbytes + space));

    float *x = dbuf(&f, 3 * 2 * 5, 0.5f), *y = dbuf(&f, 3 * 2 * 16, 0.0f);
    float *dy = dbuf(&f, 3 * 2 * 16, 1.0f);
    mt_rnn_io_t io = {.seq_len = 3, .batch = 2, .x = x, .y = y};
    mt_rnn_reserve_t *res = NULL;
    size_t from = fk.ncalls(), i0 = fake_dnn_ncalls();
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
    const fake_dnn_call_t *fw = fake_dnn_call(fake_dnn_find("cudnnRNNForward", i0));
    void *sw = (void *)fw->p[4];
    assert_ptr_not_equal(sw, w);
    size_t b_fwd, n_fwd = copies_into(from, sw, space, &b_fwd);
    assert_int_equal(n_fwd, 2 * 4); /* 2 layers x 2 directions, matrices and biases */
    assert_int_equal(b_fwd, wbytes);

    from = fk.ncalls();
    i0 = fake_dnn_ncalls();
    mt_rnn_grad_io_t g = {.dy = dy};
    assert_int_equal(mt_rnn_backward(f.m, &res, &g), 0);
    const fake_dnn_call_t *bw = fake_dnn_call(fake_dnn_find("cudnnRNNBackwardWeights_v8", i0));
    void *sdw = (void *)bw->p[3];
    size_t b_w, b_g, b_back;
    size_t n_w = copies_into(from, sw, space, &b_w), n_g = copies_into(from, sdw, space, &b_g);
    size_t n_back = copies_into(from, dw, wbytes, &b_back);
    assert_int_equal(n_w, 8);
    assert_int_equal(n_g, 8);
    assert_int_equal(n_back, 8);
    assert_true(b_w == wbytes && b_g == wbytes && b_back == wbytes);
    print_message("gather, %zu weight bytes: forward %zu copies (%zu bytes), backward %zu "
                  "copies (%zu bytes); held %zu bytes more\n",
                  wbytes, n_fwd, b_fwd, n_w + n_g + n_back, b_w + b_g + b_back, 2 * space);
    float *bufs[] = {x, y, dy};
    for (int k = 0; k < 3; k++)
        assert_int_equal(mt_alloc_free(f.a, bufs[k]), 0);
    fx_down(&f);
}

/* A libcudnn older than 9 at run time (headers are checked at build time): the path does not
 * start and says which version it found. */
static void test_old_cudnn_refused(void **state)
{
    (void)state;
    fx_t f;
    up(&f);
    fake_dnn_set_version(8907);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), MT_ENODEV);
    assert_null(f.m);
    assert_non_null(strstr(f.last_log, "version 8907 (8.9)"));
    assert_int_equal(fake_dnn_count("cudnnCreate"), 0);
    /* a cuDNN 9 starts, and the loaded version is logged beside the built-against one */
    fake_dnn_set_version(91203);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    assert_non_null(strstr(f.version_log, "libcudnn 9.12.3 (built against 9."));
    fake_dnn_set_version(91900);
    fx_down(&f);
}

/* Every cuDNN 9 status (cudnn_graph.h) and the MT_E* code it becomes. The uncategorised
 * 1xxx codes each by their meaning: only a cuDNN that cannot start is MT_ENODEV. */
static void test_status_codes_mapped(void **state)
{
    (void)state;
    static const struct {
        cudnnStatus_t s;
        int want;
    } map[] = {
        {CUDNN_STATUS_SUCCESS, 0},
        {CUDNN_STATUS_NOT_INITIALIZED, MT_ENODEV},
        {CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH, MT_ENODEV},
        {CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH, MT_EPROTO},
        {CUDNN_STATUS_DEPRECATED, MT_ENOTSUP},
        {CUDNN_STATUS_LICENSE_ERROR, MT_ENOTSUP},
        {CUDNN_STATUS_RUNTIME_IN_PROGRESS, MT_EAGAIN},
        {CUDNN_STATUS_RUNTIME_FP_OVERFLOW, MT_EOVERFLOW},
        {CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, MT_ENODEV},
        {(cudnnStatus_t)1009, MT_EIO}, /* a 1xxx code this build does not know */
        {CUDNN_STATUS_BAD_PARAM, MT_EINVAL},
        {(cudnnStatus_t)2001, MT_EINVAL}, /* CUDNN_STATUS_INVALID_VALUE, deprecated */
        {CUDNN_STATUS_BAD_PARAM_NULL_POINTER, MT_EINVAL},
        {CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, MT_EINVAL},
        {CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, MT_EINVAL},
        {CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND, MT_EINVAL},
        {CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT, MT_EINVAL},
        {CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH, MT_EINVAL},
        {CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, MT_EINVAL},
        {CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES, MT_EINVAL},
        {CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, MT_EINVAL},
        {CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH, MT_EINVAL},
        {CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, MT_EINVAL},
        {CUDNN_STATUS_NOT_SUPPORTED, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_SHAPE, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_PADDING, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API, MT_ENOTSUP},
        {CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE, MT_ENOTSUP},
        {CUDNN_STATUS_INTERNAL_ERROR, MT_EIO},
        {CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED, MT_EIO},
        {CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE, MT_EIO},
        {CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, MT_ENOMEM},
        {CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, MT_ENOMEM},
        {CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM, MT_EIO},
        {CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED, MT_EIO},
        {CUDNN_STATUS_EXECUTION_FAILED, MT_EIO},
        {CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER, MT_EIO},
        {CUDNN_STATUS_EXECUTION_FAILED_CUBLAS, MT_EIO},
        {CUDNN_STATUS_EXECUTION_FAILED_CUDART, MT_EIO},
        {CUDNN_STATUS_EXECUTION_FAILED_CURAND, MT_EIO},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        int got = mt__dnn_status(map[i].s);
        if (got != map[i].want) {
            print_error("cuDNN status %d: %s (%d), want %s (%d)\n", (int)map[i].s, mt_strerror(got),
                        got, mt_strerror(map[i].want), map[i].want);
            bad++;
        }
    }
    assert_int_equal(bad, 0);

    /* Through a call: an overflow in cuDNN's forward reaches the caller as such. */
    fx_t f;
    up(&f);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    float *x = dbuf(&f, 3 * 2 * 5, 0.5f), *y = dbuf(&f, 3 * 2 * 16, 0.0f);
    mt_rnn_io_t io = {.seq_len = 3, .batch = 2, .x = x, .y = y};
    fake_dnn_fail("cudnnRNNForward", CUDNN_STATUS_RUNTIME_FP_OVERFLOW);
    assert_int_equal(mt_rnn_forward(f.m, &io, NULL), MT_EOVERFLOW);
    assert_non_null(strstr(f.last_log, "cudnnRNNForward"));
    f.errors = 0;
    assert_int_equal(mt_alloc_free(f.a, x), 0);
    assert_int_equal(mt_alloc_free(f.a, y), 0);
    fx_down(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_changed_y_is_refused),
        cmocka_unit_test(test_saved_check_is_opt_in),
        cmocka_unit_test(test_transposed_matrix_is_refused),
        cmocka_unit_test(test_gathered_space_zeroed),
        cmocka_unit_test(test_failed_size_query_does_not_poison),
        cmocka_unit_test(test_last_error_string_logged),
        cmocka_unit_test(test_dropout_states_advance),
        cmocka_unit_test(test_old_cudnn_refused),
        cmocka_unit_test(test_gather_copies_measured),
        cmocka_unit_test(test_status_codes_mapped),
    };
    return MT_TEST_RUN(tests, fake_ctl_open, fake_ctl_close);
}
