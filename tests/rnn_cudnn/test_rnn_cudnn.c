/* The cuDNN compute path through its fake (fake_cudnn.c) on the cuda backend over the fake
 * driver: the call sequence and its arguments, workspace and reserve from our allocator with
 * their tags and cuDNN's exact sizes, pointers into the module's flat buffers, gradients
 * zeroed before they accumulate, the clear error when cuDNN cannot start, warm-up, and
 * compaction. Layouts other than ours, devices and chunked inference: test_rnn_cudnn_layout.c. */
#include "tests/rnn_cudnn/fixture.h"
#include "tests/common/test_main.h"

/* Descriptors with the design's settings, weight space = our flat buffer, one
 * cudnnGetRNNWeightParams per matrix on our buffer whose answers are the views' places. */
static void test_init_sequence(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    assert_string_equal(mt_rnn_path_name(f.m), "cudnn");
    size_t nw = 0;
    float *w = mt_rnn_weights(f.m, &nw);

    size_t i_create = fake_dnn_find("cudnnCreate", 0);
    size_t i_stream = fake_dnn_find("cudnnSetStream", 0);
    size_t i_desc = fake_dnn_find("cudnnSetRNNDescriptor_v8", 0);
    size_t i_size = fake_dnn_find("cudnnGetRNNWeightSpaceSize", 0);
    size_t i_par = fake_dnn_find("cudnnGetRNNWeightParams", 0);
    assert_true(i_create < i_stream && i_stream < i_desc && i_desc < i_size && i_size < i_par);
    assert_ptr_equal(fake_dnn_call(i_stream)->p[1], (void *)mt__cuda_stream_handle(f.s));
    assert_non_null(fake_dnn_call(i_stream)->p[1]);

    const fake_dnn_call_t *d = fake_dnn_call(i_desc);
    assert_int_equal(d->i[0], CUDNN_RNN_ALGO_STANDARD);
    assert_int_equal(d->i[1], CUDNN_LSTM);
    assert_int_equal(d->i[2], CUDNN_RNN_DOUBLE_BIAS);
    assert_int_equal(d->i[3], CUDNN_BIDIRECTIONAL);
    assert_int_equal(d->i[4], CUDNN_LINEAR_INPUT);
    assert_int_equal(d->i[5], CUDNN_DATA_FLOAT);
    assert_int_equal(d->i[6], CUDNN_DATA_FLOAT);
    assert_int_equal(d->i[7], CUDNN_FMA_MATH);
    assert_int_equal(d->i[8], 5);
    assert_int_equal(d->i[9], 8);
    assert_int_equal(d->i[10], 8); /* no projection */
    assert_int_equal(d->i[11], 2);
    assert_int_equal(d->i[12], CUDNN_RNN_PADDED_IO_DISABLED);
    assert_null(d->p[1]); /* no dropout */

    assert_int_equal(fake_dnn_call(i_size)->n[0], nw * sizeof(float));

    /* 2 layers x 2 directions x 8 linear layers, each on our buffer, each answer equal to
     * the place of that gate's rows in the named view */
    assert_int_equal(fake_dnn_count("cudnnGetRNNWeightParams"), 2 * 2 * 8);
    size_t H = 8;
    for (size_t i = i_par; i != SIZE_MAX; i = fake_dnn_find("cudnnGetRNNWeightParams", i + 1)) {
        const fake_dnn_call_t *c = fake_dnn_call(i);
        assert_ptr_equal(c->p[0], w);
        assert_int_equal(c->n[0], nw * sizeof(float));
        int p = c->i[0], id = c->i[1];
        int layer = p / 2, dir = p % 2, gate = id % 4;
        bool rec = id >= 4;
        char name[64];
        snprintf(name, sizeof name, "weight_%s_l%d%s", rec ? "hh" : "ih", layer,
                 dir ? "_reverse" : "");
        mt_rnn_param_t prm;
        assert_int_equal(mt_rnn_param_find(f.m, name, &prm), 0);
        assert_ptr_equal(c->p[1], prm.data + (size_t)gate * H * (size_t)prm.cols);
        snprintf(name, sizeof name, "bias_%s_l%d%s", rec ? "hh" : "ih", layer,
                 dir ? "_reverse" : "");
        assert_int_equal(mt_rnn_param_find(f.m, name, &prm), 0);
        assert_ptr_equal(c->p[2], prm.data + (size_t)gate * H);
    }
    assert_int_equal(f.errors, 0);
    fx_down(&f);
}

/* What the hook saw of the buffers cuDNN was handed, while they were live. */
typedef struct seen_s {
    fx_t *f;
    int calls;
    size_t work_req[3], res_req[3]; /* requested bytes of the blocks, per call */
    int work_tag[3], res_tag[3];
    bool work_is_block[3], res_is_block[3];
} seen_t;

static void block_of(fx_t *f, const void *p, size_t *req, int *tag, bool *is_block)
{
    *req = 0;
    *tag = -1;
    *is_block = false;
    void *base;
    size_t size;
    if (mt_alloc_block_info(f->a, p, &base, &size, tag) != 0)
        return;
    *is_block = base == p;
    mt_alloc_snapshot_t *snap = NULL;
    assert_int_equal(mt_alloc_snapshot(f->a, &snap), 0);
    for (size_t s = 0; s < snap->nsegments; s++)
        for (size_t b = 0; b < snap->segments[s].nblocks; b++)
            if (snap->segments[s].blocks[b].addr == (uint64_t)(uintptr_t)p)
                *req = snap->segments[s].blocks[b].requested;
    mt_alloc_snapshot_free(&snap);
}

static void hook(const fake_dnn_call_t *c, void *ud)
{
    seen_t *s = ud;
    if (s->calls >= 3)
        return;
    bool fwd = strcmp(c->name, "cudnnRNNForward") == 0;
    const void *work = fwd ? c->p[5] : c->p[4];
    const void *res = fwd ? c->p[6] : c->p[5];
    int k = s->calls++;
    block_of(s->f, work, &s->work_req[k], &s->work_tag[k], &s->work_is_block[k]);
    block_of(s->f, res, &s->res_req[k], &s->res_tag[k], &s->res_is_block[k]);
}

/* A training forward and backward: data descriptors and temp sizes before forward, the
 * flat buffers handed over, workspace and reserve our own blocks with cuDNN's sizes and
 * our tags, backward data before backward weights, gradients added to a zeroed buffer. */
static void test_train_step(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    size_t nw = 0;
    float *w = mt_rnn_weights(f.m, &nw);
    float *dw = mt_rnn_grads(f.m, NULL);
    const int T = 7, B = 3, I = 5, H = 8, L = 2, D = 2, G = 4;
    float *x = dbuf(&f, (size_t)T * B * I, 0.25f);
    float *y = dbuf(&f, (size_t)T * B * D * H, 0.0f);
    float *hx = dbuf(&f, (size_t)L * D * B * H, 0.5f);
    float *hy = dbuf(&f, (size_t)L * D * B * H, 0.0f);
    float *dy = dbuf(&f, (size_t)T * B * D * H, 1.5f);
    float *dx = dbuf(&f, (size_t)T * B * I, 0.0f);
    seen_t seen = {.f = &f};
    fake_dnn_set_hook(hook, &seen);
    size_t from = fake_dnn_ncalls();

    mt_rnn_io_t io = {.seq_len = T, .batch = B, .x = x, .y = y, .hx = hx, .hy = hy};
    mt_rnn_reserve_t *res = NULL;
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
    assert_non_null(res);

    size_t i_xd = fake_dnn_find("cudnnSetRNNDataDescriptor", from);
    size_t i_yd = fake_dnn_find("cudnnSetRNNDataDescriptor", i_xd + 1);
    size_t i_tmp = fake_dnn_find("cudnnGetRNNTempSpaceSizes", from);
    size_t i_fwd = fake_dnn_find("cudnnRNNForward", from);
    assert_true(i_xd < i_yd && i_yd < i_tmp && i_tmp < i_fwd && i_fwd != SIZE_MAX);
    const fake_dnn_call_t *xd = fake_dnn_call(i_xd);
    assert_int_equal(xd->i[1], CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED);
    assert_int_equal(xd->i[2], T);
    assert_int_equal(xd->i[3], B);
    assert_int_equal(xd->i[4], I);
    assert_int_equal(xd->i[5], 1); /* every sequence T long */
    assert_int_equal(fake_dnn_call(i_yd)->i[4], D * H);

    const fake_dnn_call_t *c = fake_dnn_call(i_fwd);
    size_t work = fake_dnn_work_bytes(1, G, H, T, B);
    size_t rbytes = fake_dnn_reserve_bytes(G, H, L, D, T, B);
    assert_int_equal(c->i[0], CUDNN_FWD_MODE_TRAINING);
    assert_ptr_equal(c->p[0], x);
    assert_ptr_equal(c->p[1], y);
    assert_ptr_equal(c->p[2], hx);
    assert_ptr_equal(c->p[3], hy);
    assert_ptr_equal(c->p[4], w); /* the module's flat buffer itself */
    assert_int_equal(c->n[0], nw * sizeof(float));
    assert_int_equal(c->n[1], work);
    assert_int_equal(c->n[2], rbytes);
    assert_int_equal(c->i[1], 0); /* cx NULL: zeros */
    /* the workspace and reserve were our blocks with cuDNN's sizes, as requested */
    assert_int_equal(seen.calls, 1);
    assert_true(seen.work_is_block[0] && seen.res_is_block[0]);
    assert_int_equal(seen.work_tag[0], MT_TAG_WORKSPACE);
    assert_int_equal(seen.work_req[0], work);
    assert_int_equal(seen.res_tag[0], MT_TAG_ACTIVATIONS);
    assert_int_equal(seen.res_req[0], rbytes);
    /* devSeqLengths lie in device memory of our allocator (the fake checked they hold T) */
    void *base;
    size_t size;
    int tag;
    assert_int_equal(mt_alloc_block_info(f.a, c->p[7], &base, &size, &tag), 0);
    assert_int_equal(tag, MT_TAG_WORKSPACE);
    assert_true((const char *)c->p[7] + B * sizeof(int32_t) <= (const char *)base + size);
    /* the reserve lives until backward (activations), the workspace is back */
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(f.a, &st), 0);
    assert_int_equal(st.tag_requested_bytes[MT_TAG_ACTIVATIONS].current, (int64_t)rbytes);
    mt_rnn_act_t act;
    assert_int_equal(mt_rnn_activation_bytes(f.m, T, B, &act), 0);
    assert_int_equal(act.reserve_bytes, rbytes);

    /* y came out of cuDNN: the fake writes the last float of the weight space */
    float yh[7 * 3 * 16], wl;
    dget(&f, yh, y, (size_t)T * B * D * H);
    dget(&f, &wl, w + nw - 1, 1);
    for (size_t k = 0; k < (size_t)T * B * D * H; k++)
        assert_true(yh[k] == wl);

    mt_rnn_grad_io_t g = {.dy = dy, .dx = dx};
    from = fake_dnn_ncalls();
    assert_int_equal(mt_rnn_backward(f.m, &res, &g), 0);
    assert_null(res);
    size_t i_bd = fake_dnn_find("cudnnRNNBackwardData_v8", from);
    size_t i_bw = fake_dnn_find("cudnnRNNBackwardWeights_v8", from);
    assert_true(i_bd < i_bw && i_bw != SIZE_MAX);
    const fake_dnn_call_t *bd = fake_dnn_call(i_bd), *bw = fake_dnn_call(i_bw);
    assert_ptr_equal(bd->p[0], y);
    assert_ptr_equal(bd->p[1], dy);
    assert_ptr_equal(bd->p[2], dx);
    assert_ptr_equal(bd->p[3], w);
    assert_ptr_equal(bd->p[5], fake_dnn_call(i_fwd)->p[6]); /* forward's reserve */
    assert_int_equal(bw->i[0], CUDNN_WGRAD_MODE_ADD);
    assert_ptr_equal(bw->p[0], x);
    assert_ptr_equal(bw->p[1], hx);
    assert_ptr_equal(bw->p[2], y);
    assert_ptr_equal(bw->p[3], dw); /* the module's grad buffer itself */
    assert_ptr_equal(bw->p[5], bd->p[5]);
    assert_int_equal(bw->n[0], nw * sizeof(float));
    /* backward's workspace: cuDNN's training size plus room for an unwanted dx */
    size_t bwork = (work + 511) / 512 * 512 + (size_t)T * B * I * sizeof(float);
    assert_int_equal(seen.calls, 3);
    for (int k = 1; k < 3; k++) {
        assert_int_equal(seen.work_tag[k], MT_TAG_WORKSPACE);
        assert_int_equal(seen.work_req[k], bwork);
        assert_int_equal(seen.res_tag[k], MT_TAG_ACTIVATIONS);
    }
    /* the grad buffer was zeroed on the module's stream before the first accumulation */
    uint64_t a = 0, n = 0;
    size_t i_zero = SIZE_MAX;
    for (size_t i = find_call("cuMemsetD8Async", 0, &a, &n); i != SIZE_MAX;
         i = find_call("cuMemsetD8Async", i + 1, &a, &n))
        if (a == (uintptr_t)dw && n == nw * sizeof(float)) {
            i_zero = i;
            break;
        }
    assert_true(i_zero < bw->clock);
    float *gh = malloc(nw * sizeof *gh);
    assert_non_null(gh);
    dget(&f, gh, dw, nw);
    for (size_t k = 0; k < nw; k++) /* the fake adds k + 1 to element k */
        assert_true(gh[k] == (float)(k + 1));
    free(gh);
    /* dx is what cuDNN wrote; the reserve is released after backward */
    float dxh[7 * 3 * 5];
    dget(&f, dxh, dx, (size_t)T * B * I);
    assert_true(dxh[0] == 3.0f);
    assert_int_equal(mt_alloc_stats(f.a, &st), 0);
    assert_int_equal(st.tag_requested_bytes[MT_TAG_ACTIVATIONS].current, 0);
    assert_string_equal(fake_dnn_last_error(), "");

    float *bufs[] = {x, y, hx, hy, dy, dx};
    for (int k = 0; k < 6; k++)
        assert_int_equal(mt_alloc_free(f.a, bufs[k]), 0);
    fx_down(&f);
}

/* Gradients accumulate across backwards (ADD into the module's buffer) and start again from
 * zero after mt_rnn_zero_grads, whose memset is queued before the next accumulation. */
static void test_grads_accumulate(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    f.cfg.mode = MT_RNN_GRU;
    f.cfg.num_layers = 1;
    f.cfg.bidirectional = false;
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    size_t nw;
    float *dw = mt_rnn_grads(f.m, &nw);
    const int T = 4, B = 2;
    float *x = dbuf(&f, (size_t)T * B * 5, 1.0f);
    float *y = dbuf(&f, (size_t)T * B * 8, 0.0f);
    float *dy = dbuf(&f, (size_t)T * B * 8, 1.0f);
    float expect[] = {1.0f, 2.0f, 1.0f};
    for (int round = 0; round < 3; round++) {
        if (round == 2)
            assert_int_equal(mt_rnn_zero_grads(f.m), 0);
        mt_rnn_io_t io = {.seq_len = T, .batch = B, .x = x, .y = y};
        mt_rnn_reserve_t *res;
        assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
        mt_rnn_grad_io_t g = {.dy = dy}; /* dx not wanted: cuDNN writes it to scratch */
        size_t from = fake_dnn_ncalls();
        assert_int_equal(mt_rnn_backward(f.m, &res, &g), 0);
        const fake_dnn_call_t *bd = fake_dnn_call(fake_dnn_find("cudnnRNNBackwardData_v8", from));
        assert_non_null(bd);
        assert_non_null(bd->p[2]);
        /* the scratch dx lies inside backward's workspace block */
        assert_true((const char *)bd->p[2] > (const char *)bd->p[4]);
        float gh[512];
        assert_true(nw <= 512);
        dget(&f, gh, dw, nw);
        for (size_t k = 0; k < nw; k++)
            assert_true(gh[k] == expect[round] * (float)(k + 1));
    }
    float *bufs[] = {x, y, dy};
    for (int k = 0; k < 3; k++)
        assert_int_equal(mt_alloc_free(f.a, bufs[k]), 0);
    fx_down(&f);
}

/* Every mode x bias x direction: the cell mode and bias mode cuDNN is told, one weight-params
 * query per matrix, no bias addresses without biases, inference with no reserve and no cell
 * state outside LSTM. */
static void test_modes_inference(void **state)
{
    (void)state;
    static const int cudnn_mode[] = {CUDNN_RNN_TANH, CUDNN_RNN_RELU, CUDNN_LSTM, CUDNN_GRU};
    for (int mode = 0; mode < 4; mode++)
        for (int bias = 0; bias < 2; bias++)
            for (int bi = 0; bi < 2; bi++) {
                fx_t f;
                fx_up(&f);
                f.cfg.mode = mode;
                f.cfg.bias = bias;
                f.cfg.bidirectional = bi;
                f.cfg.hidden_size = 6;
                assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
                const fake_dnn_call_t *d =
                    fake_dnn_call(fake_dnn_find("cudnnSetRNNDescriptor_v8", 0));
                assert_int_equal(d->i[1], cudnn_mode[mode]);
                assert_int_equal(d->i[2], bias ? CUDNN_RNN_DOUBLE_BIAS : CUDNN_RNN_NO_BIAS);
                assert_int_equal(d->i[3], bi ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL);
                int G = gates_of(mode), D = bi ? 2 : 1;
                assert_int_equal(fake_dnn_count("cudnnGetRNNWeightParams"), 2 * D * 2 * G);
                for (size_t i = fake_dnn_find("cudnnGetRNNWeightParams", 0); i != SIZE_MAX;
                     i = fake_dnn_find("cudnnGetRNNWeightParams", i + 1))
                    assert_true((fake_dnn_call(i)->p[2] != NULL) == bias);

                const int T = 5, B = 2;
                float *x = dbuf(&f, (size_t)T * B * 5, 1.0f);
                float *y = dbuf(&f, (size_t)T * B * D * 6, 0.0f);
                float *cs = dbuf(&f, (size_t)2 * D * B * 6, 0.0f);
                mt_rnn_io_t io = {.seq_len = T,
                                  .batch = B,
                                  .x = x,
                                  .y = y,
                                  .cx = mode == MT_RNN_LSTM ? cs : NULL};
                size_t from = fake_dnn_ncalls();
                assert_int_equal(mt_rnn_forward(f.m, &io, NULL), 0);
                const fake_dnn_call_t *c = fake_dnn_call(fake_dnn_find("cudnnRNNForward", from));
                assert_non_null(c);
                assert_int_equal(c->i[0], CUDNN_FWD_MODE_INFERENCE);
                assert_null(c->p[6]);
                assert_int_equal(c->n[2], 0);
                assert_int_equal(c->n[1], fake_dnn_work_bytes(0, G, 6, T, B));
                assert_int_equal(c->i[1], mode == MT_RNN_LSTM);
                assert_int_equal(mt_alloc_free(f.a, x), 0);
                assert_int_equal(mt_alloc_free(f.a, y), 0);
                assert_int_equal(mt_alloc_free(f.a, cs), 0);
                fx_down(&f);
            }
}

/* Where cuDNN cannot start (no driver: NOT_INITIALIZED), creation fails with MT_ENODEV and
 * says why; a failing compute call maps to an error and leaks nothing. */
static void test_errors(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    fake_dnn_fail("cudnnCreate", CUDNN_STATUS_NOT_INITIALIZED);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), MT_ENODEV);
    assert_int_equal(f.warnings, 1);
    assert_non_null(strstr(f.last_log, "cudnnCreate"));
    assert_int_equal(fake_dnn_live(), f.live0);

    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    float *x = dbuf(&f, 3 * 2 * 5, 1.0f);
    float *y = dbuf(&f, 3 * 2 * 16, 0.0f);
    mt_rnn_io_t io = {.seq_len = 3, .batch = 2, .x = x, .y = y};
    mt_rnn_reserve_t *res = NULL;
    fake_dnn_fail("cudnnRNNForward", CUDNN_STATUS_EXECUTION_FAILED);
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), MT_EIO);
    assert_null(res);
    assert_non_null(strstr(f.last_log, "cudnnRNNForward"));
    fake_dnn_fail("cudnnGetRNNTempSpaceSizes", CUDNN_STATUS_BAD_PARAM);
    io.seq_len = 4; /* a new shape: its size query fails, the call returns that error */
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), MT_EINVAL);
    assert_null(res);
    io.seq_len = 3;
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
    mt_rnn_reserve_release(f.m, &res);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(f.a, &st), 0);
    assert_int_equal(st.tag_requested_bytes[MT_TAG_ACTIVATIONS].current, 0);
    assert_int_equal(mt_alloc_free(f.a, x), 0);
    assert_int_equal(mt_alloc_free(f.a, y), 0);
    fx_down(&f);
}

/* U2 on this path: after a warm-up at the largest shape, 30 batches of other shapes within
 * it make no device malloc (workspace, reserve and devSeqLengths included) and no stream
 * wait, while each shape change re-describes the data to cuDNN. */
static void test_warmup_and_shapes(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    f.cfg.num_layers = 1;
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    const int maxT = 12, maxB = 6, D = 2, H = 8;
    float *x = dbuf(&f, (size_t)maxT * maxB * 5, 0.5f);
    float *y = dbuf(&f, (size_t)maxT * maxB * D * H, 0.0f);
    float *dy = dbuf(&f, (size_t)maxT * maxB * D * H, 0.5f);
    assert_int_equal(mt_rnn_warmup(f.m, maxT, maxB), 0);
    mt_alloc_stats_t st0, st1;
    assert_int_equal(mt_alloc_stats(f.a, &st0), 0);
    size_t syncs = fk.count("cuStreamSynchronize") + fk.count("cuCtxSynchronize");
    size_t descs = fake_dnn_count("cudnnSetRNNDataDescriptor");
    uint64_t seed = 7;
    for (int it = 0; it < 30; it++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int T = 1 + (int)((seed >> 33) % maxT), B = 1 + (int)((seed >> 45) % maxB);
        mt_rnn_io_t io = {.seq_len = T, .batch = B, .x = x, .y = y};
        mt_rnn_reserve_t *res;
        size_t from = fake_dnn_ncalls();
        assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
        const fake_dnn_call_t *c = fake_dnn_call(fake_dnn_find("cudnnRNNForward", from));
        assert_int_equal(c->n[2], fake_dnn_reserve_bytes(4, H, 1, D, T, B));
        mt_rnn_grad_io_t g = {.dy = dy};
        assert_int_equal(mt_rnn_backward(f.m, &res, &g), 0);
    }
    assert_int_equal(mt_alloc_stats(f.a, &st1), 0);
    assert_int_equal(st1.num_device_alloc, st0.num_device_alloc);
    /* the lengths table from the warm-up covers every shape, and the saved-inputs check is
     * off: no copy, no wait */
    assert_int_equal(fk.count("cuStreamSynchronize") + fk.count("cuCtxSynchronize"), syncs);
    assert_true(fake_dnn_count("cudnnSetRNNDataDescriptor") > descs);
    assert_string_equal(fake_dnn_last_error(), "");
    assert_int_equal(mt_alloc_free(f.a, x), 0);
    assert_int_equal(mt_alloc_free(f.a, y), 0);
    assert_int_equal(mt_alloc_free(f.a, dy), 0);
    fx_down(&f);
}

/* Rebound parameters (U1): cuDNN gets a compacted copy (a weights block of our allocator,
 * not the flat buffer) assembled with device copies on the module's stream; after
 * mt_rnn_flatten it gets the flat buffer again. Inference steps reuse one workspace. */
static void test_compaction_and_step(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    f.cfg.bidirectional = false;
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    size_t nw;
    float *w = mt_rnn_weights(f.m, &nw);
    mt_rnn_param_t prm;
    assert_int_equal(mt_rnn_param_find(f.m, "bias_hh_l1", &prm), 0);
    float *elsewhere = dbuf(&f, prm.numel, 9.0f);
    assert_int_equal(mt_rnn_bind_param(f.m, "bias_hh_l1", elsewhere), 0);
    float *x = dbuf(&f, 2 * 3 * 5, 1.0f);
    float *y = dbuf(&f, 2 * 3 * 8, 0.0f);
    mt_rnn_io_t io = {.seq_len = 2, .batch = 3, .x = x, .y = y};
    size_t from = fake_dnn_ncalls();
    size_t copies = fk.count("cuMemcpyAsync");
    mt_rnn_reserve_t *res;
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0); /* training: the copy stays */
    const fake_dnn_call_t *c = fake_dnn_call(fake_dnn_find("cudnnRNNForward", from));
    assert_ptr_not_equal(c->p[4], w);
    void *base;
    size_t size;
    int tag;
    assert_int_equal(mt_alloc_block_info(f.a, c->p[4], &base, &size, &tag), 0);
    assert_ptr_equal(base, c->p[4]);
    assert_int_equal(tag, MT_TAG_WEIGHTS);
    mt_rnn_reserve_release(f.m, &res);
    assert_true(fk.count("cuMemcpyAsync") >= copies + mt_rnn_param_count(f.m));
    float yh[2 * 3 * 8];
    dget(&f, yh, y, 2 * 3 * 8);
    assert_true(yh[0] == 9.0f); /* the rebound bias is the last float cuDNN saw */
    mt_rnn_stats_t rs;
    assert_int_equal(mt_rnn_stats(f.m, &rs), 0);
    assert_int_equal(rs.compactions, 1);
    assert_int_equal(mt_rnn_flatten(f.m), 0);
    from = fake_dnn_ncalls();
    assert_int_equal(mt_rnn_forward(f.m, &io, NULL), 0);
    assert_ptr_equal(fake_dnn_call(fake_dnn_find("cudnnRNNForward", from))->p[4], w);

    /* 20 generation steps: one step workspace, no allocator growth */
    float *h0 = dbuf(&f, 2 * 3 * 8, 0.0f), *h1 = dbuf(&f, 2 * 3 * 8, 0.0f);
    float *c0 = dbuf(&f, 2 * 3 * 8, 0.0f), *c1 = dbuf(&f, 2 * 3 * 8, 0.0f);
    mt_alloc_stats_t st0, st1;
    assert_int_equal(mt_rnn_step(f.m, 3, x, NULL, NULL, NULL, h0, c0), 0);
    assert_int_equal(mt_alloc_stats(f.a, &st0), 0);
    for (int k = 0; k < 20; k++) {
        float *hin = k % 2 ? h1 : h0, *hout = k % 2 ? h0 : h1;
        float *cin = k % 2 ? c1 : c0, *cout = k % 2 ? c0 : c1;
        assert_int_equal(mt_rnn_step(f.m, 3, x, hin, cin, NULL, hout, cout), 0);
    }
    assert_int_equal(mt_alloc_stats(f.a, &st1), 0);
    assert_int_equal(st1.allocation[MT_STAT_ALL].allocated, st0.allocation[MT_STAT_ALL].allocated);
    float hh[2 * 3 * 8];
    dget(&f, hh, h0, 2 * 3 * 8);
    assert_true(hh[0] == 21.0f); /* the fake's hy = hx + 1, 21 steps chained through states */
    assert_int_equal(mt_rnn_step_release(f.m), 0);
    float *bufs[] = {elsewhere, x, y, h0, h1, c0, c1};
    for (int k = 0; k < 7; k++)
        assert_int_equal(mt_alloc_free(f.a, bufs[k]), 0);
    fx_down(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_sequence),
        cmocka_unit_test(test_train_step),
        cmocka_unit_test(test_grads_accumulate),
        cmocka_unit_test(test_modes_inference),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_warmup_and_shapes),
        cmocka_unit_test(test_compaction_and_step),
    };
    return MT_TEST_RUN(tests, fake_ctl_open, fake_ctl_close);
}
