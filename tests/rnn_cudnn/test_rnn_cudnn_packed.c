/* Packed batches on the cuDNN path, through the fake cuDNN: the data descriptors get the
 * packed layout with each sequence's own length as seqLengthArray, devSeqLengths holds the
 * same lengths, cuDNN's workspace and reserve for that descriptor (sized by the sum of the
 * lengths, not max_len x B) are what the module allocates and hands over, a new batch
 * re-describes the shape, and after a packed warm-up batches within its bounds make no
 * device malloc. */
#include "tests/rnn_cudnn/fixture.h"
#include "tests/common/test_main.h"

static void check_lengths(size_t i_desc, const int *want, int B)
{
    int got[16];
    const fake_dnn_call_t *c = fake_dnn_call(i_desc);
    assert_int_equal(c->i[1], CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED);
    assert_int_equal(c->i[2], want[0]); /* maxSeqLength: the longest */
    assert_int_equal(c->i[3], B);
    assert_int_equal(fake_dnn_data_lengths(c->p[0], got, 16), (size_t)B);
    size_t sum = 0;
    for (int b = 0; b < B; b++) {
        assert_int_equal(got[b], want[b]);
        sum += (size_t)want[b];
    }
    assert_int_equal(c->n[0], sum);
    assert_int_equal(c->i[5], sum == (size_t)want[0] * (size_t)B);
}

/* A training step on lengths {5, 3, 3, 1}: descriptors, device lengths, sizes. */
static void test_packed_step(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    f.cfg.bidirectional = false;
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    const int lens[4] = {5, 3, 3, 1}, I = 5, H = 8, L = 2, G = 4;
    mt_rnn_pack_t p;
    assert_int_equal(mt_rnn_pack_init(&p, lens, 4, 5, true, NULL, NULL), 0);
    size_t N = p.tokens;
    float *x = dbuf(&f, N * I, 0.5f), *y = dbuf(&f, N * H, 0.0f), *dy = dbuf(&f, N * H, 1.0f);
    float *dx = dbuf(&f, N * I, 0.0f);
    mt_rnn_io_t io = {.x = x, .y = y};
    mt_rnn_pack_io(&p, &io);
    size_t from = fake_dnn_ncalls();
    mt_rnn_reserve_t *res = NULL;
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
    size_t i_xd = fake_dnn_find("cudnnSetRNNDataDescriptor", from);
    size_t i_yd = fake_dnn_find("cudnnSetRNNDataDescriptor", i_xd + 1);
    size_t i_fwd = fake_dnn_find("cudnnRNNForward", from);
    assert_true(i_xd < i_yd && i_yd < i_fwd && i_fwd != SIZE_MAX);
    check_lengths(i_xd, lens, 4);
    check_lengths(i_yd, lens, 4);
    assert_int_equal(fake_dnn_call(i_yd)->i[4], H);

    /* devSeqLengths (device memory: read back through the driver) holds the lengths. */
    const fake_dnn_call_t *c = fake_dnn_call(i_fwd);
    int32_t dl[4];
    assert_int_equal(mt_memcpy(f.b, dl, c->p[7], sizeof dl, MT_MEMCPY_DEVICE_TO_HOST), 0);
    for (int b = 0; b < 4; b++)
        assert_int_equal(dl[b], lens[b]);
    /* cuDNN's sizes for this descriptor: 12 tokens, not 5 x 4. */
    assert_int_equal(c->n[1], fake_dnn_work_bytes(1, G, H, (int)N, 1));
    assert_int_equal(c->n[2], fake_dnn_reserve_bytes(G, H, L, 1, (int)N, 1));
    assert_true(c->n[2] < fake_dnn_reserve_bytes(G, H, L, 1, 5, 4));
    mt_rnn_act_t act;
    assert_int_equal(mt_rnn_activation_bytes_packed(f.m, p.max_len, p.batch_sizes, &act), 0);
    assert_int_equal(act.reserve_bytes, c->n[2]);

    mt_rnn_grad_io_t g = {.dy = dy, .dx = dx};
    from = fake_dnn_ncalls();
    assert_int_equal(mt_rnn_backward(f.m, &res, &g), 0);
    const fake_dnn_call_t *bd = fake_dnn_call(fake_dnn_find("cudnnRNNBackwardData_v8", from));
    const fake_dnn_call_t *bw = fake_dnn_call(fake_dnn_find("cudnnRNNBackwardWeights_v8", from));
    assert_non_null(bd);
    assert_non_null(bw);
    assert_ptr_equal(bd->p[6], c->p[7]);
    assert_ptr_equal(bw->p[6], c->p[7]);
    /* The fake's dx = 2 dy over exactly the packed rows. */
    float hdx[12 * 5];
    dget(&f, hdx, dx, N * I);
    for (size_t k = 0; k < N * I; k++)
        assert_true(hdx[k] == 2.0f);

    /* Another batch: described again with its own lengths. */
    const int lens2[3] = {4, 4, 2};
    mt_rnn_pack_t p2;
    assert_int_equal(mt_rnn_pack_init(&p2, lens2, 3, 5, true, NULL, NULL), 0);
    mt_rnn_pack_io(&p2, &io);
    from = fake_dnn_ncalls();
    assert_int_equal(mt_rnn_forward(f.m, &io, NULL), 0);
    i_xd = fake_dnn_find("cudnnSetRNNDataDescriptor", from);
    assert_true(i_xd != SIZE_MAX);
    check_lengths(i_xd, lens2, 3);
    const fake_dnn_call_t *inf = fake_dnn_call(fake_dnn_find("cudnnRNNForward", from));
    int32_t dl2[3];
    assert_int_equal(mt_memcpy(f.b, dl2, inf->p[7], sizeof dl2, MT_MEMCPY_DEVICE_TO_HOST), 0);
    for (int b = 0; b < 3; b++)
        assert_int_equal(dl2[b], lens2[b]);
    assert_int_equal(f.errors, 0);

    float *bufs[] = {x, y, dy, dx};
    for (int k = 0; k < 4; k++)
        assert_int_equal(mt_alloc_free(f.a, bufs[k]), 0);
    mt_rnn_pack_fini(&p);
    mt_rnn_pack_fini(&p2);
    fx_down(&f);
}

/* Warm-up at (40 tokens, 6 sequences): then packed batches within those bounds make no
 * device malloc. */
static void test_packed_warmup(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    const size_t maxN = 40;
    const int maxB = 6, I = 5, DH = 16;
    float *x = dbuf(&f, maxN * I, 0.25f), *y = dbuf(&f, maxN * DH, 0.0f);
    float *dy = dbuf(&f, maxN * DH, 1.0f);
    assert_int_equal(mt_rnn_warmup_packed(f.m, maxN, maxB), 0);
    mt_backend_counters_t c0, c1;
    mt_backend_counters(f.b, &c0);
    const int shapes[4][6] = {{6, 6, 6, 6, 6, 6}, {20, 9, 5, 1}, {40}, {7, 7, 3, 3, 2, 1}};
    const int bsz[4] = {6, 4, 1, 6};
    for (int i = 0; i < 4; i++) {
        mt_rnn_pack_t p;
        assert_int_equal(mt_rnn_pack_init(&p, shapes[i], bsz[i], 40, true, NULL, NULL), 0);
        mt_rnn_io_t io = {.x = x, .y = y};
        mt_rnn_pack_io(&p, &io);
        mt_rnn_reserve_t *res;
        assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
        mt_rnn_grad_io_t g = {.dy = dy};
        assert_int_equal(mt_rnn_backward(f.m, &res, &g), 0);
        mt_rnn_pack_fini(&p);
    }
    mt_backend_counters(f.b, &c1);
    assert_int_equal(c1.malloc_calls + c1.vm_map_calls, c0.malloc_calls + c0.vm_map_calls);
    assert_int_equal(f.errors, 0);
    float *bufs[] = {x, y, dy};
    for (int k = 0; k < 3; k++)
        assert_int_equal(mt_alloc_free(f.a, bufs[k]), 0);
    fx_down(&f);
}

/* The device lengths of a packed shape are copied once: a second inference forward on the
 * same lengths makes no host-to-device copy and no stream synchronize, and a new shape's
 * lengths reach the device before cuDNN reads them. */
static void test_packed_same_shape_no_sync(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    const int lens[4] = {5, 3, 3, 1}, lens2[4] = {5, 4, 2, 2}, I = 5, DH = 16;
    float *x = dbuf(&f, 20 * I, 0.5f), *y = dbuf(&f, 20 * DH, 0.0f);
    mt_rnn_pack_t p, p2;
    assert_int_equal(mt_rnn_pack_init(&p, lens, 4, 5, true, NULL, NULL), 0);
    assert_int_equal(mt_rnn_pack_init(&p2, lens2, 4, 5, true, NULL, NULL), 0);
    mt_rnn_io_t io = {.x = x, .y = y};
    mt_rnn_pack_io(&p, &io);
    assert_int_equal(mt_rnn_forward(f.m, &io, NULL), 0);

    size_t syncs = fk.count("cuStreamSynchronize") + fk.count("cuCtxSynchronize");
    size_t copies = fk.count("cuMemcpyAsync");
    for (int k = 0; k < 3; k++)
        assert_int_equal(mt_rnn_forward(f.m, &io, NULL), 0);
    assert_int_equal(fk.count("cuStreamSynchronize") + fk.count("cuCtxSynchronize"), syncs);
    assert_int_equal(fk.count("cuMemcpyAsync"), copies);

    /* Same batch and T, other lengths: copied again, and cuDNN sees the new ones. */
    mt_rnn_pack_io(&p2, &io);
    size_t from = fake_dnn_ncalls();
    assert_int_equal(mt_rnn_forward(f.m, &io, NULL), 0);
    assert_true(fk.count("cuMemcpyAsync") > copies);
    const fake_dnn_call_t *c = fake_dnn_call(fake_dnn_find("cudnnRNNForward", from));
    int32_t dl[4];
    assert_int_equal(mt_memcpy(f.b, dl, c->p[7], sizeof dl, MT_MEMCPY_DEVICE_TO_HOST), 0);
    for (int b = 0; b < 4; b++)
        assert_int_equal(dl[b], lens2[b]);
    /* And back: the first lengths again, on the device. */
    mt_rnn_pack_io(&p, &io);
    from = fake_dnn_ncalls();
    assert_int_equal(mt_rnn_forward(f.m, &io, NULL), 0);
    c = fake_dnn_call(fake_dnn_find("cudnnRNNForward", from));
    assert_int_equal(mt_memcpy(f.b, dl, c->p[7], sizeof dl, MT_MEMCPY_DEVICE_TO_HOST), 0);
    for (int b = 0; b < 4; b++)
        assert_int_equal(dl[b], lens[b]);
    assert_int_equal(f.errors, 0);

    assert_int_equal(mt_alloc_free(f.a, x), 0);
    assert_int_equal(mt_alloc_free(f.a, y), 0);
    mt_rnn_pack_fini(&p);
    mt_rnn_pack_fini(&p2);
    fx_down(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_step),
        cmocka_unit_test(test_packed_warmup),
        cmocka_unit_test(test_packed_same_shape_no_sync),
    };
    return MT_TEST_RUN(tests, fake_ctl_open, fake_ctl_close);
}
