/* The flat weight buffer and its named views against cuDNN's canonical layout (written out
 * independently in ref.h), for every mode, 1-3 layers, uni/bi, with and without biases;
 * tags of the buffers; seeded initialisation; activation accounting. */
#include <math.h>

#include "tests/rnn/fixture.h"
#include "tests/rnn/ref.h"
#include "rnn/internal.h"
#include "tests/common/test_main.h"

static void check_layout(rnn_fx_t *fx, int mode, int L, bool bi, bool bias)
{
    mt_rnn_cfg_t c = fx_cfg(fx, mode, 5, 3, L, bi);
    c.bias = bias;
    mt_rnn_t *m;
    assert_int_equal(mt_rnn_create(&m, &c), 0);
    ref_shape_t rs = {mode, 5, 3, L, bi ? 2 : 1, bias};
    int g = ref_gates(&rs), H = 3, D = bi ? 2 : 1;
    size_t nw;
    float *w = mt_rnn_weights(m, &nw);
    float *dw = mt_rnn_grads(m, NULL);
    assert_int_equal(nw, ref_total(&rs));
    assert_int_equal(mt_rnn_param_count(m), (size_t)L * D * (bias ? 4 : 2));

    static const char *const kinds[] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    size_t i = 0, covered = 0;
    for (int l = 0; l < L; l++) {
        for (int d = 0; d < D; d++) {
            for (int k = 0; k < (bias ? 4 : 2); k++, i++) {
                mt_rnn_param_t p;
                assert_int_equal(mt_rnn_param_get(m, i, &p), 0);
                char name[64];
                snprintf(name, sizeof name, "%s_l%d%s", kinds[k], l, d ? "_reverse" : "");
                assert_string_equal(p.name, name);
                assert_int_equal(p.kind, k);
                assert_int_equal(p.layer, l);
                assert_int_equal(p.dir, d);
                size_t want;
                int cols;
                switch (k) {
                case 0:
                    want = ref_w_at(&rs, l, d, 0, 0, 0);
                    cols = ref_in(&rs, l);
                    break;
                case 1:
                    want = ref_r_at(&rs, l, d, 0, 0, 0);
                    cols = H;
                    break;
                case 2:
                    want = ref_bw_at(&rs, l, d, 0, 0);
                    cols = 1;
                    break;
                default:
                    want = ref_br_at(&rs, l, d, 0, 0);
                    cols = 1;
                    break;
                }
                assert_int_equal(p.offset, want);
                assert_int_equal(p.rows, g * H);
                assert_int_equal(p.cols, cols);
                assert_int_equal(p.numel, (size_t)g * H * cols);
                assert_ptr_equal(p.data, w + want);
                assert_ptr_equal(p.grad, dw + want);
                covered += p.numel;
                mt_rnn_param_t q;
                assert_int_equal(mt_rnn_param_find(m, name, &q), 0);
                assert_int_equal(q.offset, p.offset);
            }
        }
    }
    /* The views tile the buffer exactly (offsets are distinct and sizes sum to it). */
    assert_int_equal(covered, nw);
    mt_rnn_param_t p;
    assert_int_equal(mt_rnn_param_get(m, i, &p), MT_ENOENT);
    assert_int_equal(mt_rnn_param_find(m, "weight_ih_l9", &p), MT_ENOENT);

    /* One buffer each, tagged weights and grads; gradients start at zero. */
    void *base;
    size_t size;
    int tag;
    assert_int_equal(mt_alloc_block_info(fx->a, w, &base, &size, &tag), 0);
    assert_ptr_equal(base, w);
    assert_true(size >= nw * sizeof(float));
    assert_int_equal(tag, MT_TAG_WEIGHTS);
    assert_int_equal(mt_alloc_block_info(fx->a, dw, &base, &size, &tag), 0);
    assert_int_equal(tag, MT_TAG_GRADS);
    for (size_t j = 0; j < nw; j++)
        assert_true(dw[j] == 0.0f);
    mt_rnn_destroy(&m);
    assert_null(m);
}

static void layout_matches_canonical(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new((size_t)256 << 20);
    for (int mode = 0; mode < 4; mode++)
        for (int L = 1; L <= 3; L++)
            for (int bi = 0; bi < 2; bi++)
                for (int bias = 0; bias < 2; bias++)
                    check_layout(fx, mode, L, bi, bias);
    fx_free(&fx);
}

/* uniform(-1/sqrt(H), 1/sqrt(H)), reproducible from the seed, different across seeds. */
static void init_is_seeded_uniform(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new((size_t)256 << 20);
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_LSTM, 7, 16, 2, true);
    mt_rnn_t *a, *b, *d;
    assert_int_equal(mt_rnn_create(&a, &c), 0);
    assert_int_equal(mt_rnn_create(&b, &c), 0);
    c.seed = 2;
    assert_int_equal(mt_rnn_create(&d, &c), 0);
    size_t n;
    float *wa = mt_rnn_weights(a, &n), *wb = mt_rnn_weights(b, NULL), *wd = mt_rnn_weights(d, NULL);
    double k = 1.0 / sqrt(16.0), sum = 0, lo = 1, hi = -1;
    size_t same = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(fabs(wa[i]) <= k);
        assert_true(wa[i] == wb[i]);
        same += wa[i] == wd[i];
        sum += wa[i];
        lo = wa[i] < lo ? wa[i] : lo;
        hi = wa[i] > hi ? wa[i] : hi;
    }
    assert_true(same < n / 100);
    assert_true(fabs(sum / (double)n) < 0.02);
    assert_true(lo < -0.9 * k && hi > 0.9 * k);
    mt_rnn_destroy(&a);
    mt_rnn_destroy(&b);
    mt_rnn_destroy(&d);
    fx_free(&fx);
}

static void bad_configs_are_rejected(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new((size_t)64 << 20);
    mt_rnn_t *m = (mt_rnn_t *)1;
    mt_rnn_cfg_t c = fx_cfg(fx, MT_RNN_GRU, 4, 4, 1, false);
    c.hidden_size = 0;
    assert_int_equal(mt_rnn_create(&m, &c), MT_EINVAL);
    assert_null(m);
    c = fx_cfg(fx, 9, 4, 4, 1, false);
    assert_int_equal(mt_rnn_create(&m, &c), MT_EINVAL);
    c = fx_cfg(fx, MT_RNN_GRU, 4, 4, 0, false);
    assert_int_equal(mt_rnn_create(&m, &c), MT_EINVAL);
    c = fx_cfg(fx, MT_RNN_GRU, 4, 4, 1, false);
    c.alloc = NULL;
    assert_int_equal(mt_rnn_create(&m, &c), MT_EINVAL);
    assert_string_equal(mt_rnn_mode_name(MT_RNN_GRU), "gru");
    assert_string_equal(mt_rnn_mode_name(42), "unknown");
    fx_free(&fx);
}

/* Activation accounting: LSTM keeps 6 H-vectors per (step, batch, layer-direction), of
 * which the top layer's h is y; the reserve is exactly the rest. */
static void activation_accounting(void **state)
{
    (void)state;
    rnn_fx_t *fx = fx_new((size_t)64 << 20);
    struct {
        int mode;
        double eng, op;
    } want[] = {{MT_RNN_LSTM, 6, 21}, {MT_RNN_GRU, 5, 17}, {MT_RNN_TANH, 1, 4}};
    for (int i = 0; i < 3; i++) {
        mt_rnn_cfg_t c = fx_cfg(fx, want[i].mode, 10, 8, 2, true);
        mt_rnn_t *m;
        assert_int_equal(mt_rnn_create(&m, &c), 0);
        mt_rnn_act_t act;
        int T = 11, B = 3;
        assert_int_equal(mt_rnn_activation_bytes(m, T, B, &act), 0);
        assert_true(act.engine_hvec == want[i].eng);
        assert_true(act.opbyop_hvec == want[i].op);
        size_t per = (size_t)B * 8 * 2 * 2 * sizeof(float); /* B*H*L*D floats */
        assert_int_equal(act.engine_bytes_per_step, (size_t)want[i].eng * per);
        assert_int_equal(act.opbyop_bytes_per_step, (size_t)want[i].op * per);
        size_t y_bytes = (size_t)T * B * 2 * 8 * sizeof(float);
        assert_int_equal(act.reserve_bytes + y_bytes, act.engine_bytes_per_step * (size_t)T);
        assert_int_equal(mt_rnn_activation_bytes(m, 0, B, &act), MT_EINVAL);
        mt_rnn_destroy(&m);
    }
    fx_free(&fx);
}

/* The workspace layouts' checker (docs/rnn-cpu.md, Workspace layouts): regions placed one
 * after another pass; an overlap, a misaligned offset or a region past the total fails. */
static void workspace_regions_checked(void **state)
{
    (void)state;
    size_t end = 0;
    mt__rnn_region_t r[4];
    r[0] = mt__rnn_place(&end, 100, 256);
    r[1] = mt__rnn_place(&end, 0, 256);
    r[2] = mt__rnn_place(&end, 40, 256);
    r[3] = mt__rnn_place(&end, 8, 256);
    assert_int_equal(r[0].off, 0);
    assert_int_equal(r[2].off, 256);
    assert_int_equal(r[3].off, 512);
    assert_int_equal(end, 520);
    assert_true(mt__rnn_regions_valid(r, 4, end, 256));
    assert_false(mt__rnn_regions_valid(r, 4, end - 1, 256)); /* the last one sticks out */
    mt__rnn_region_t bad = r[2];
    r[2].off = 64; /* inside r[0] */
    assert_false(mt__rnn_regions_valid(r, 4, end, 64));
    r[2] = bad;
    r[3].off = 288; /* overlaps r[2] ([256, 296)) */
    assert_false(mt__rnn_regions_valid(r, 4, end, 4));
    r[3].off = 300; /* clear of r[2], but not a multiple of 256 */
    assert_true(mt__rnn_regions_valid(r, 4, end, 4));
    assert_false(mt__rnn_regions_valid(r, 4, end, 256));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(layout_matches_canonical),  cmocka_unit_test(init_is_seeded_uniform),
        cmocka_unit_test(bad_configs_are_rejected),  cmocka_unit_test(activation_accounting),
        cmocka_unit_test(workspace_regions_checked),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
