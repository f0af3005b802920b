/* Dropout on the cuDNN path, through the fake: the dropout descriptor's calls in order with
 * their arguments, its states a block of our allocator tagged workspace of exactly
 * cudnnDropoutGetStatesSize bytes, the descriptor handed to cudnnSetRNNDescriptor_v8, the
 * reserve (and mt_rnn_activation_bytes) following cuDNN's size with dropout, dropout in
 * training forwards only, re-seeding through mt_rnn_set_dropout_state, teardown order, and
 * p = 0 (or one layer) still passing a NULL descriptor with no dropout call at all. */
#include "tests/rnn_cudnn/fixture.h"
#include "tests/common/test_main.h"

static void block(fx_t *f, const void *p, void **base, size_t *size, int *tag)
{
    assert_int_equal(mt_alloc_block_info(f->a, p, base, size, tag), 0);
}

static void test_descriptor_sequence(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    f.cfg.dropout = 0.3f;
    f.cfg.dropout_seed = 0xabcdef12345ull;
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);

    size_t i_create = fake_dnn_find("cudnnCreate", 0);
    size_t i_stream = fake_dnn_find("cudnnSetStream", 0);
    size_t i_dd = fake_dnn_find("cudnnCreateDropoutDescriptor", 0);
    size_t i_size = fake_dnn_find("cudnnDropoutGetStatesSize", 0);
    size_t i_set = fake_dnn_find("cudnnSetDropoutDescriptor", 0);
    size_t i_rnn = fake_dnn_find("cudnnSetRNNDescriptor_v8", 0);
    assert_true(i_create < i_stream && i_stream < i_dd && i_dd < i_size && i_size < i_set &&
                i_set < i_rnn && i_rnn != SIZE_MAX);
    assert_int_equal(fake_dnn_count("cudnnSetDropoutDescriptor"), 1);
    const fake_dnn_call_t *set = fake_dnn_call(i_set);
    const void *dd = fake_dnn_call(i_dd)->p[0];
    assert_non_null(dd);
    assert_ptr_equal(set->p[0], dd);
    assert_ptr_equal(set->p[1], fake_dnn_call(i_create)->p[0]); /* the module's handle */
    assert_ptr_equal(fake_dnn_call(i_size)->p[0], fake_dnn_call(i_create)->p[0]);
    assert_true(set->f == (double)0.3f);
    assert_true(set->u == 0xabcdef12345ull);
    assert_int_equal(set->n[0], fake_dnn_dropout_states_bytes());
    assert_ptr_equal(fake_dnn_call(i_rnn)->p[1], dd);

    /* The states: our allocator's block, exactly the size cuDNN asked for, tagged
     * workspace (the library's scratch for the module's life, not a pass's activations). */
    void *base;
    size_t size;
    int tag;
    block(&f, set->p[2], &base, &size, &tag);
    assert_ptr_equal(base, set->p[2]);
    assert_true(size >= fake_dnn_dropout_states_bytes());
    assert_int_equal(tag, MT_TAG_WORKSPACE);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(f.a, &st), 0);
    assert_int_equal(st.tag_requested_bytes[MT_TAG_WORKSPACE].current,
                     (int64_t)fake_dnn_dropout_states_bytes());
    assert_int_equal(st.tag_requested_bytes[MT_TAG_ACTIVATIONS].current, 0);

    /* Teardown: the RNN descriptor first, then the dropout descriptor it refers to; the
     * states go back to the allocator (fx_down checks no byte and no object is left). */
    size_t from = fake_dnn_ncalls();
    mt_rnn_destroy(&f.m);
    size_t i_drnn = fake_dnn_find("cudnnDestroyRNNDescriptor", from);
    size_t i_ddd = fake_dnn_find("cudnnDestroyDropoutDescriptor", from);
    assert_true(i_drnn < i_ddd && i_ddd != SIZE_MAX);
    assert_ptr_equal(fake_dnn_call(i_ddd)->p[0], dd);
    assert_int_equal(f.errors, 0);
    fx_down(&f);
}

/* A training step with dropout: the reserve is cuDNN's size with the dropout descriptor
 * attached (so are mt_rnn_activation_bytes and the activations the allocator sees), the
 * forward finds the states cudnnSetDropoutDescriptor initialised; inference applies none. */
static void test_train_and_inference(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    f.cfg.dropout = 0.5f;
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    const int T = 6, B = 2, I = 5, H = 8, L = 2, D = 2, G = 4;
    size_t want_res =
        fake_dnn_reserve_bytes(G, H, L, D, T, B) + fake_dnn_dropout_reserve_bytes(H, L, D, T, B);
    mt_rnn_act_t act;
    assert_int_equal(mt_rnn_activation_bytes(f.m, T, B, &act), 0);
    assert_int_equal(act.reserve_bytes, want_res);

    float *x = dbuf(&f, (size_t)T * B * I, 0.25f);
    float *y = dbuf(&f, (size_t)T * B * D * H, 0.0f);
    float *dy = dbuf(&f, (size_t)T * B * D * H, 1.0f);
    mt_rnn_io_t io = {.seq_len = T, .batch = B, .x = x, .y = y};
    size_t from = fake_dnn_ncalls();
    mt_rnn_reserve_t *res = NULL;
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), 0);
    const fake_dnn_call_t *fw = fake_dnn_call(fake_dnn_find("cudnnRNNForward", from));
    assert_int_equal(fw->i[0], CUDNN_FWD_MODE_TRAINING);
    assert_int_equal(fw->i[5], 1); /* dropout applied, states intact */
    assert_int_equal(fw->n[2], want_res);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(f.a, &st), 0);
    assert_int_equal(st.tag_requested_bytes[MT_TAG_ACTIVATIONS].current, (int64_t)want_res);
    mt_rnn_grad_io_t g = {.dy = dy};
    assert_int_equal(mt_rnn_backward(f.m, &res, &g), 0);
    assert_int_equal(fake_dnn_dropout_forwards(), 1);

    from = fake_dnn_ncalls();
    assert_int_equal(mt_rnn_forward(f.m, &io, NULL), 0);
    fw = fake_dnn_call(fake_dnn_find("cudnnRNNForward", from));
    assert_int_equal(fw->i[0], CUDNN_FWD_MODE_INFERENCE);
    assert_int_equal(fw->i[5], 0);
    assert_int_equal(fake_dnn_dropout_forwards(), 1);
    assert_int_equal(f.errors, 0);
    float *bufs[] = {x, y, dy};
    for (int k = 0; k < 3; k++)
        assert_int_equal(mt_alloc_free(f.a, bufs[k]), 0);
    fx_down(&f);
}

/* mt_rnn_set_dropout_state re-initialises cuDNN's states: the seed itself at counter 0, a
 * mix otherwise, the same for the same state; a failure leaves the state as it was. The
 * cpu path's mask reader is not cuDNN's: MT_ENOTSUP. */
static void test_reseed(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f);
    f.cfg.dropout = 0.2f;
    f.cfg.dropout_seed = 5;
    assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
    const void *states = fake_dnn_call(fake_dnn_find("cudnnSetDropoutDescriptor", 0))->p[2];
    uint64_t seen[3];
    const uint64_t ctr[3] = {0, 9, 9};
    for (int k = 0; k < 3; k++) {
        size_t from = fake_dnn_ncalls();
        assert_int_equal(mt_rnn_set_dropout_state(f.m, 77, ctr[k]), 0);
        size_t i = fake_dnn_find("cudnnSetDropoutDescriptor", from);
        assert_true(i != SIZE_MAX);
        const fake_dnn_call_t *c = fake_dnn_call(i);
        assert_ptr_equal(c->p[2], states); /* the same states, re-initialised */
        assert_true(c->f == (double)0.2f);
        seen[k] = c->u;
    }
    assert_true(seen[0] == 77);
    assert_true(seen[1] != 77 && seen[1] == seen[2]);

    fake_dnn_fail("cudnnSetDropoutDescriptor", CUDNN_STATUS_BAD_PARAM);
    assert_int_equal(mt_rnn_set_dropout_state(f.m, 1, 1), MT_EINVAL);
    uint64_t s, c;
    assert_int_equal(mt_rnn_dropout_state(f.m, &s, &c), 0);
    assert_true(s == 77 && c == 9);
    assert_int_equal(f.errors, 1);

    float mask[2 * 2 * 16];
    assert_int_equal(mt_rnn_dropout_mask(f.m, 77, 9, 0, 2, 2, mask), MT_ENOTSUP);
    fx_down(&f);
}

/* p = 0, or p > 0 with one layer (nothing to drop): no dropout call, a NULL descriptor, no
 * states, the plain reserve. */
static void test_no_dropout(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        fx_t f;
        fx_up(&f);
        f.cfg.dropout = k == 0 ? 0.0f : 0.4f;
        f.cfg.num_layers = k == 0 ? 2 : 1;
        assert_int_equal(mt_rnn_create(&f.m, &f.cfg), 0);
        assert_int_equal(fake_dnn_count("cudnnCreateDropoutDescriptor"), 0);
        assert_int_equal(fake_dnn_count("cudnnDropoutGetStatesSize"), 0);
        assert_int_equal(fake_dnn_count("cudnnSetDropoutDescriptor"), 0);
        assert_null(fake_dnn_call(fake_dnn_find("cudnnSetRNNDescriptor_v8", 0))->p[1]);
        mt_rnn_act_t act;
        assert_int_equal(mt_rnn_activation_bytes(f.m, 4, 3, &act), 0);
        assert_int_equal(act.reserve_bytes,
                         fake_dnn_reserve_bytes(4, 8, f.cfg.num_layers, 2, 4, 3));
        assert_int_equal(mt_rnn_set_dropout_state(f.m, 3, 4), 0); /* nothing to re-seed */
        assert_int_equal(fake_dnn_count("cudnnSetDropoutDescriptor"), 0);
        assert_int_equal(f.warnings, k); /* one layer: the dropout does nothing, said once */
        fx_down(&f);
    }
}

/* A failing dropout call fails creation cleanly: the error, the call named in the log, no
 * object or byte left behind (fx_down). */
static void test_dropout_failures(void **state)
{
    (void)state;
    const char *calls[] = {"cudnnCreateDropoutDescriptor", "cudnnDropoutGetStatesSize",
                           "cudnnSetDropoutDescriptor"};
    for (int k = 0; k < 3; k++) {
        fx_t f;
        fx_up(&f);
        f.cfg.dropout = 0.1f;
        fake_dnn_fail(calls[k], CUDNN_STATUS_BAD_PARAM);
        assert_int_equal(mt_rnn_create(&f.m, &f.cfg), MT_EINVAL);
        assert_null(f.m);
        assert_non_null(strstr(f.last_log, calls[k]));
        fx_down(&f);
    }
}

/* Computed numbers in cuDNN's layout: the masks show in y. */
static void up_numeric(fx_t *f, uint64_t seed)
{
    fx_up(f);
    fake_dnn_markers(false);
    fake_dnn_interleaved_layout(false);
    f->cfg.dropout = 0.5f;
    f->cfg.dropout_seed = seed;
    assert_int_equal(mt_rnn_create(&f->m, &f->cfg), 0);
}

enum { WT = 3, WB = 2, WN = WT * WB * 16 };

/* One training forward (reserve released at once): y to out, and the generator counter the
 * fake's cudnnRNNForward found in the states. */
static uint64_t train_once(fx_t *f, const mt_rnn_io_t *io, float *out)
{
    size_t from = fake_dnn_ncalls();
    mt_rnn_reserve_t *res = NULL;
    assert_int_equal(mt_rnn_forward(f->m, io, &res), 0);
    size_t i = fake_dnn_find("cudnnRNNForward", from);
    assert_true(i != SIZE_MAX);
    assert_int_equal(fake_dnn_call(i)->i[5], 1); /* dropout applied */
    dget(f, out, io->y, WN);
    mt_rnn_reserve_release(f->m, &res);
    return fake_dnn_call(i)->u;
}

/* A warm-up runs a training forward, which advances cuDNN's dropout states: the path keeps
 * a copy of the states and puts it back, so the masks after a warm-up are those without
 * it, whether it comes first or after forwards, and the state reads back unchanged. */
static void test_warmup_keeps_masks(void **state)
{
    (void)state;
    fx_t f;
    up_numeric(&f, 42);
    float *x = dbuf(&f, (size_t)WT * WB * 5, 0.5f), *y = dbuf(&f, WN, 0.0f);
    mt_rnn_io_t io = {.seq_len = WT, .batch = WB, .x = x, .y = y};
    static float ref[2][WN], got[WN];
    for (int k = 0; k < 2; k++)
        assert_int_equal(train_once(&f, &io, ref[k]), (uint64_t)k);
    assert_true(memcmp(ref[0], ref[1], sizeof ref[0]) != 0);

    assert_int_equal(mt_rnn_set_dropout_state(f.m, 42, 0), 0);
    for (int k = 0; k < 2; k++) {
        size_t drawn = fake_dnn_dropout_forwards();
        assert_int_equal(mt_rnn_warmup(f.m, 2 * WT, WB), 0);
        assert_int_equal(fake_dnn_dropout_forwards(), drawn + 1); /* the warm-up drew */
        uint64_t seed, counter;
        assert_int_equal(mt_rnn_dropout_state(f.m, &seed, &counter), 0);
        assert_true(seed == 42 && counter == (uint64_t)k);
        assert_int_equal(train_once(&f, &io, got), (uint64_t)k);
        assert_true(memcmp(got, ref[k], sizeof got) == 0);
    }
    assert_int_equal(f.errors, 0);
    assert_int_equal(mt_alloc_free(f.a, x), 0);
    assert_int_equal(mt_alloc_free(f.a, y), 0);
    fx_down(&f);
}

/* A re-seed that fails may leave cuDNN's states half written (the fake writes half of them
 * before failing). The state reads back as it was, and the next training forward
 * re-initialises the states from it first: its masks are those of
 * mt_rnn_set_dropout_state(seed, counter) of that state. If that fails too, the forward
 * fails, saying why, and the next one tries again. */
static void test_failed_reseed_reinitialises(void **state)
{
    (void)state;
    fx_t f;
    up_numeric(&f, 7);
    float *x = dbuf(&f, (size_t)WT * WB * 5, 0.5f), *y = dbuf(&f, WN, 0.0f);
    mt_rnn_io_t io = {.seq_len = WT, .batch = WB, .x = x, .y = y};
    static float ref[WN], got[WN];
    assert_int_equal(train_once(&f, &io, ref), 0);
    assert_int_equal(mt_rnn_set_dropout_state(f.m, 7, 0), 0);

    fake_dnn_fail("cudnnSetDropoutDescriptor", CUDNN_STATUS_EXECUTION_FAILED);
    assert_int_equal(mt_rnn_set_dropout_state(f.m, 99, 5), MT_EIO);
    uint64_t seed, counter;
    assert_int_equal(mt_rnn_dropout_state(f.m, &seed, &counter), 0);
    assert_true(seed == 7 && counter == 0);
    /* inference draws nothing: the states are left alone */
    size_t from = fake_dnn_ncalls();
    assert_int_equal(mt_rnn_forward(f.m, &io, NULL), 0);
    assert_true(fake_dnn_find("cudnnSetDropoutDescriptor", from) == SIZE_MAX);

    /* the re-initialisation fails too: so does the forward, naming the states */
    fake_dnn_fail("cudnnSetDropoutDescriptor", CUDNN_STATUS_EXECUTION_FAILED);
    mt_rnn_reserve_t *res = NULL;
    assert_int_equal(mt_rnn_forward(f.m, &io, &res), MT_EIO);
    assert_null(res);
    assert_non_null(strstr(f.last_log, "dropout states"));

    from = fake_dnn_ncalls();
    f.warnings = 0;
    assert_int_equal(train_once(&f, &io, got), 0);
    size_t i_set = fake_dnn_find("cudnnSetDropoutDescriptor", from);
    assert_true(i_set < fake_dnn_find("cudnnRNNForward", from));
    assert_true(fake_dnn_call(i_set)->u == 7);
    assert_int_equal(f.warnings, 1);
    assert_true(memcmp(got, ref, sizeof got) == 0);
    /* once re-initialised, the states are not re-initialised again */
    from = fake_dnn_ncalls();
    assert_int_equal(train_once(&f, &io, got), 1);
    assert_true(fake_dnn_find("cudnnSetDropoutDescriptor", from) == SIZE_MAX);
    assert_int_equal(mt_alloc_free(f.a, x), 0);
    assert_int_equal(mt_alloc_free(f.a, y), 0);
    fx_down(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_descriptor_sequence),
        cmocka_unit_test(test_train_and_inference),
        cmocka_unit_test(test_reseed),
        cmocka_unit_test(test_no_dropout),
        cmocka_unit_test(test_dropout_failures),
        cmocka_unit_test(test_warmup_keeps_masks),
        cmocka_unit_test(test_failed_reseed_reinitialises),
    };
    return MT_TEST_RUN(tests, fake_ctl_open, fake_ctl_close);
}
