/* The parameter pager: two-and-more tasks trained alternately on a tiny linear model give
 * exactly the results of the all-on-device run, gradients land on the right host copy, and
 * the device never holds more task sets than configured. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "host_fixture.h"
#include "tests/common/test_main.h"

#define M      32
#define N      64
#define NP     (M * N)
#define NTASKS 3
#define STEPS  60
#define EPOCH  10
#define LR     0.01f

/* Deterministic inputs and targets of (task, step). */
static float val(unsigned a, unsigned b, unsigned c)
{
    uint32_t h = a * 2654435761u ^ (b + 0x9e3779b9u) * 40503u ^ c * 2246822519u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)(h % 2001u) / 1000.0f - 1.0f;
}

/* One training step of y = S x + W_t x, loss 0.5 |y - target|^2, on "device" memory:
 * gW += r x^T (gW arrives zeroed), S -= LR r x^T (shared parameters are updated at once). */
typedef struct step_s {
    float *S;
    const float *W;
    float *gW;
    unsigned task, step;
} step_t;

static void step_fn(void *ud)
{
    step_t *s = ud;
    float x[N], r[M];
    for (unsigned j = 0; j < N; j++)
        x[j] = val(s->task, s->step, j);
    for (unsigned i = 0; i < M; i++) {
        float ys = 0.0f, yw = 0.0f;
        for (unsigned j = 0; j < N; j++) {
            ys += s->S[i * N + j] * x[j];
            yw += s->W[i * N + j] * x[j];
        }
        r[i] = ys + yw - val(s->task + 100, s->step, i);
    }
    for (unsigned i = 0; i < M; i++) {
        for (unsigned j = 0; j < N; j++) {
            float g = r[i] * x[j];
            s->gW[i * N + j] += g;
            s->S[i * N + j] -= LR * g;
        }
    }
}

typedef struct acc_s {
    float *dst;
    const float *src;
} acc_t;

/* The reference's gradient accumulation, the same arithmetic as the pager's write-back. */
static void acc_fn(void *ud)
{
    acc_t *a = ud;
    for (size_t i = 0; i < NP; i++)
        a->dst[i] += a->src[i];
}

static void sgd(float *W, float *G)
{
    for (size_t i = 0; i < NP; i++) {
        W[i] -= LR * G[i];
        G[i] = 0.0f;
    }
}

static void schedule(unsigned *sched)
{
    uint32_t x = 12345;
    for (unsigned s = 0; s < STEPS; s++) {
        x = x * 1103515245u + 12345u;
        /* Mostly tasks 0 and 1 alternating, task 2 now and then: hits and evictions. */
        sched[s] = ((x >> 16) % 5 == 0) ? 2 : s % 2;
    }
}

static void init_params(float *W, unsigned task)
{
    for (size_t i = 0; i < NP; i++)
        W[i] = val(task + 200, 0, (unsigned)i) * 0.1f;
}

/* All on the device: every task's W and G resident. Results into W_out/G_hist/S_out. */
static void run_reference(float W_out[NTASKS][NP], float G_hist[STEPS / EPOCH][NTASKS][NP],
                          float *S_out)
{
    fx_t f;
    fx_init(&f, 64 * MIB, 64 * MIB);
    unsigned sched[STEPS];
    schedule(sched);
    float *S, *W[NTASKS], *G[NTASKS], *tmp[STEPS];
    assert_int_equal(mt_alloc_malloc(f.a, NP * 4, f.compute, MT_TAG_OTHER, (void **)&S), 0);
    memset(S, 0, NP * 4);
    for (unsigned t = 0; t < NTASKS; t++) {
        assert_int_equal(mt_alloc_malloc(f.a, NP * 4, f.compute, MT_TAG_WEIGHTS, (void **)&W[t]),
                         0);
        assert_int_equal(mt_alloc_malloc(f.a, NP * 4, f.compute, MT_TAG_GRADS, (void **)&G[t]), 0);
        init_params(W[t], t);
        memset(G[t], 0, NP * 4);
    }
    step_t steps[STEPS];
    acc_t accs[STEPS];
    for (unsigned s = 0; s < STEPS; s++) {
        unsigned t = sched[s];
        assert_int_equal(mt_alloc_malloc(f.a, NP * 4, f.compute, MT_TAG_GRADS, (void **)&tmp[s]),
                         0);
        assert_int_equal(mt_memset_async(f.b, tmp[s], 0, NP * 4, f.compute), 0);
        steps[s] = (step_t){S, W[t], tmp[s], t, s};
        accs[s] = (acc_t){G[t], tmp[s]};
        assert_int_equal(mt_stream_launch_host_func(f.b, f.compute, step_fn, &steps[s]), 0);
        assert_int_equal(mt_stream_launch_host_func(f.b, f.compute, acc_fn, &accs[s]), 0);
        if ((s + 1) % EPOCH == 0) {
            assert_int_equal(mt_stream_synchronize(f.b, f.compute), 0);
            for (unsigned u = 0; u < NTASKS; u++) {
                memcpy(G_hist[s / EPOCH][u], G[u], NP * 4);
                sgd(W[u], G[u]);
            }
        }
    }
    assert_int_equal(mt_stream_synchronize(f.b, f.compute), 0);
    memcpy(S_out, S, NP * 4);
    for (unsigned t = 0; t < NTASKS; t++) {
        memcpy(W_out[t], W[t], NP * 4);
        assert_int_equal(mt_alloc_free(f.a, W[t]), 0);
        assert_int_equal(mt_alloc_free(f.a, G[t]), 0);
    }
    for (unsigned s = 0; s < STEPS; s++)
        assert_int_equal(mt_alloc_free(f.a, tmp[s]), 0);
    assert_int_equal(mt_alloc_free(f.a, S), 0);
    fx_fini(&f);
}

static float ref_W[NTASKS][NP], ref_G[STEPS / EPOCH][NTASKS][NP], ref_S[NP];

static void test_paged_training_equals_all_on_device(void **state)
{
    (void)state;
    run_reference(ref_W, ref_G, ref_S);

    fx_t f;
    fx_init(&f, 64 * MIB, 64 * MIB);
    mt_param_pager_cfg_t pc = mt_param_pager_cfg_default();
    pc.alloc = f.a;
    pc.host = f.h;
    pc.compute = f.compute;
    pc.ntasks = NTASKS;
    pc.nparams = NP;
    pc.cache_sets = 2;
    mt_param_pager_t *p = NULL;
    assert_int_equal(mt_param_pager_create(&p, &pc), 0);
    for (unsigned t = 0; t < NTASKS; t++) {
        float *hw = NULL, *hg = NULL;
        assert_int_equal(mt_param_pager_host(p, t, &hw, &hg), 0);
        assert_false(mt_backend_is_device_ptr(f.b, hw));
        init_params(hw, t);
        assert_int_equal(hg[0], 0.0f);
    }
    float *S = NULL;
    assert_int_equal(mt_alloc_malloc(f.a, NP * 4, f.compute, MT_TAG_OTHER, (void **)&S), 0);
    memset(S, 0, NP * 4);
    mt_alloc_reset_peak(f.a);

    unsigned sched[STEPS];
    schedule(sched);
    step_t steps[STEPS];
    for (unsigned s = 0; s < STEPS; s++) {
        unsigned t = sched[s];
        float *dp = NULL, *dg = NULL;
        assert_int_equal(mt_param_pager_activate(p, t, &dp, &dg), 0);
        assert_true(mt_backend_is_device_ptr(f.b, dp));
        /* The next task's set comes while this one computes. */
        if (s + 1 < STEPS && sched[s + 1] != t)
            assert_int_equal(mt_param_pager_prefetch(p, sched[s + 1]), 0);
        steps[s] = (step_t){S, dp, dg, t, s};
        assert_int_equal(mt_stream_launch_host_func(f.b, f.compute, step_fn, &steps[s]), 0);
        assert_int_equal(mt_param_pager_deactivate(p, t), 0);
        mt_param_pager_stats_t st;
        mt_param_pager_stats(p, &st);
        assert_true(st.resident <= pc.cache_sets);
        if ((s + 1) % EPOCH == 0) {
            for (unsigned u = 0; u < NTASKS; u++) {
                float *hw = NULL, *hg = NULL;
                assert_int_equal(mt_param_pager_host_wait(p, u), 0);
                assert_int_equal(mt_param_pager_host(p, u, &hw, &hg), 0);
                /* Each task's gradients landed on its own host copy, bit for bit. */
                assert_memory_equal(hg, ref_G[s / EPOCH][u], NP * 4);
                sgd(hw, hg);
                assert_int_equal(mt_param_pager_host_modified(p, u), 0);
            }
        }
    }
    assert_int_equal(mt_stream_synchronize(f.b, f.compute), 0);
    assert_memory_equal(S, ref_S, NP * 4);
    for (unsigned t = 0; t < NTASKS; t++) {
        float *hw = NULL;
        assert_int_equal(mt_param_pager_host_wait(p, t), 0);
        assert_int_equal(mt_param_pager_host(p, t, &hw, NULL), 0);
        assert_memory_equal(hw, ref_W[t], NP * 4);
    }
    mt_param_pager_stats_t st;
    mt_param_pager_stats(p, &st);
    assert_int_equal(st.activations, STEPS);
    assert_int_equal(st.writebacks, STEPS);
    assert_true(st.max_resident <= 2);
    assert_true(st.evictions > 0);
    assert_true(st.hits > 0);
    /* Every activation that missed uploaded; prefetches uploaded the rest. */
    assert_true(st.uploads >= st.activations - st.hits);
    assert_true(st.uploads < st.activations);
    /* The device allocator agrees: never more than two task sets of weights at once. */
    mt_alloc_stats_t as;
    assert_int_equal(mt_alloc_stats(f.a, &as), 0);
    assert_true(as.tag_allocated_bytes[MT_TAG_WEIGHTS].peak <= 2 * NP * 4);
    assert_true(as.tag_allocated_bytes[MT_TAG_WEIGHTS].peak >= NP * 4);
    /* Gradients: one device set at a time (the active task's). */
    assert_int_equal(as.tag_allocated_bytes[MT_TAG_GRADS].peak, NP * 4);
    mt_param_pager_destroy(&p);
    assert_null(p);
    assert_int_equal(mt_alloc_free(f.a, S), 0);
    fx_fini(&f);
}

typedef struct set_s {
    float *g;
} set_t;

static void write_ramp(void *ud)
{
    set_t *s = ud;
    for (unsigned i = 0; i < 16; i++)
        s->g[i] += (float)(i + 1);
}

static void test_lru_and_errors(void **state)
{
    (void)state;
    fx_t f;
    fx_init(&f, 64 * MIB, 64 * MIB);
    mt_param_pager_cfg_t pc = mt_param_pager_cfg_default();
    pc.alloc = f.a;
    pc.host = f.h;
    pc.compute = f.compute;
    pc.ntasks = 2;
    pc.nparams = 16;
    pc.cache_sets = 1;
    mt_param_pager_t *p = NULL;
    assert_int_equal(mt_param_pager_create(&p, &pc), 0);
    float *dp = NULL, *dg = NULL;
    mt_param_pager_stats_t st;

    assert_int_equal(mt_param_pager_activate(p, 1, &dp, &dg), 0);
    set_t s1 = {dg};
    assert_int_equal(mt_stream_launch_host_func(f.b, f.compute, write_ramp, &s1), 0);
    assert_int_equal(mt_param_pager_activate(p, 0, &dp, &dg), MT_EBUSY); /* one at a time */
    assert_int_equal(mt_param_pager_prefetch(p, 0), MT_EBUSY); /* the only slot is active */
    assert_int_equal(mt_param_pager_host_modified(p, 1), MT_EBUSY);
    assert_int_equal(mt_param_pager_deactivate(p, 0), MT_ENOENT);
    assert_int_equal(mt_param_pager_deactivate(p, 1), 0);
    assert_int_equal(mt_param_pager_activate(p, 1, &dp, &dg), 0); /* resident: a hit */
    set_t s2 = {dg};
    assert_int_equal(mt_stream_launch_host_func(f.b, f.compute, write_ramp, &s2), 0);
    assert_int_equal(mt_param_pager_deactivate(p, 1), 0);
    mt_param_pager_stats(p, &st);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.uploads, 1);
    assert_int_equal(st.resident, 1);

    /* Gradients of two activations of task 1 were added into task 1's copy only. */
    float *h0 = NULL, *g0 = NULL, *h1 = NULL, *g1 = NULL;
    assert_int_equal(mt_param_pager_host_wait(p, 1), 0);
    assert_int_equal(mt_param_pager_host(p, 0, &h0, &g0), 0);
    assert_int_equal(mt_param_pager_host(p, 1, &h1, &g1), 0);
    for (unsigned i = 0; i < 16; i++) {
        assert_true(g1[i] == 2.0f * (float)(i + 1));
        assert_true(g0[i] == 0.0f);
    }
    /* Prefetching task 0 evicts task 1 (cache of one set). */
    h0[3] = 42.0f;
    assert_int_equal(mt_param_pager_prefetch(p, 0), 0);
    mt_param_pager_stats(p, &st);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.max_resident, 1);
    assert_int_equal(mt_param_pager_activate(p, 0, &dp, &dg), 0);
    assert_int_equal(mt_stream_synchronize(f.b, f.compute), 0);
    assert_true(dp[3] == 42.0f); /* the upload carried the host params */
    assert_true(dg[5] == 0.0f);
    assert_int_equal(mt_param_pager_deactivate(p, 0), 0);
    /* A changed host copy drops the stale device set. */
    assert_int_equal(mt_param_pager_host_wait(p, 0), 0);
    h0[3] = 7.0f;
    assert_int_equal(mt_param_pager_host_modified(p, 0), 0);
    mt_param_pager_stats(p, &st);
    assert_int_equal(st.resident, 0);
    assert_int_equal(mt_param_pager_activate(p, 0, &dp, &dg), 0);
    assert_int_equal(mt_stream_synchronize(f.b, f.compute), 0);
    assert_true(dp[3] == 7.0f);
    assert_int_equal(mt_param_pager_deactivate(p, 0), 0);
    assert_int_equal(mt_param_pager_activate(p, 2, &dp, &dg), MT_EINVAL);
    mt_param_pager_destroy(&p);

    pc.cache_sets = 0;
    assert_int_equal(mt_param_pager_create(&p, &pc), MT_EINVAL);
    assert_null(p);
    fx_fini(&f);
}

/* Memory pressure: with release_under_pressure, a request of the program that the device
 * cannot fit takes back a resident set that is not in use (the active one stays); without
 * it, the same request fails. A cache miss with room to spare gives nothing up. */
static void pressure_case(bool release)
{
    fx_t f;
    fx_init(&f, 64 * MIB, 160 * MIB); /* pinned: 3 x (params + grads) + staging */
    mt_param_pager_cfg_t pc = mt_param_pager_cfg_default();
    pc.alloc = f.a;
    pc.host = f.h;
    pc.compute = f.compute;
    pc.ntasks = 3;
    pc.nparams = 4 * MIB; /* floats: 16 MiB sets */
    pc.cache_sets = 2;
    pc.release_under_pressure = release;
    mt_param_pager_t *p = NULL;
    assert_int_equal(mt_param_pager_create(&p, &pc), 0);
    float *dp = NULL, *dg = NULL;
    assert_int_equal(mt_param_pager_prefetch(p, 0), 0);
    assert_int_equal(mt_param_pager_activate(p, 1, &dp, &dg), 0); /* set + grads: 32 MiB */
    assert_int_equal(mt_stream_synchronize(f.b, f.compute), 0);
    mt_param_pager_stats_t st;
    mt_param_pager_stats(p, &st);
    assert_int_equal(st.resident, 2);

    void *small = NULL, *big = NULL;
    assert_int_equal(mt_alloc_malloc(f.a, 1 * MIB, f.compute, MT_TAG_ACTIVATIONS, &small), 0);
    mt_param_pager_stats(p, &st);
    assert_int_equal(st.resident, 2); /* a miss, but the device had room */
    int rc = mt_alloc_malloc(f.a, 24 * MIB, f.compute, MT_TAG_ACTIVATIONS, &big); /* 14 free */
    mt_param_pager_stats(p, &st);
    if (release) {
        assert_int_equal(rc, 0);
        assert_int_equal(st.pressure_evictions, 1);
        assert_int_equal(st.resident, 1);
        /* The active task kept its set: it still trains, and deactivates normally. */
        set_t s1 = {dg};
        assert_int_equal(mt_stream_launch_host_func(f.b, f.compute, write_ramp, &s1), 0);
        assert_int_equal(mt_param_pager_deactivate(p, 1), 0);
        assert_int_equal(mt_param_pager_host_wait(p, 1), 0);
        float *h1 = NULL, *g1 = NULL;
        assert_int_equal(mt_param_pager_host(p, 1, &h1, &g1), 0);
        assert_true(g1[9] == 10.0f);
        assert_int_equal(mt_alloc_free(f.a, big), 0);
    } else {
        assert_int_equal(rc, MT_ENOMEM);
        assert_int_equal(st.pressure_evictions, 0);
        assert_int_equal(st.resident, 2);
        assert_int_equal(mt_param_pager_deactivate(p, 1), 0);
    }
    assert_int_equal(mt_alloc_free(f.a, small), 0);
    mt_param_pager_destroy(&p);
    fx_fini(&f);
}

static void test_release_under_pressure(void **state)
{
    (void)state;
    pressure_case(true);
}

static void test_no_release_without_it(void **state)
{
    (void)state;
    pressure_case(false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paged_training_equals_all_on_device),
        cmocka_unit_test(test_lru_and_errors),
        cmocka_unit_test(test_release_under_pressure),
        cmocka_unit_test(test_no_release_without_it),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}
