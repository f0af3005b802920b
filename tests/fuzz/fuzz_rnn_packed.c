/* libFuzzer harness: the shapes of packed batches, as a caller passes them.
 *
 * Byte 0 even: the rest are sequence lengths (signed bytes) for mt_rnn_pack_init, byte 1
 * choosing the capacity and whether sorted input is promised; an accepted shape must hold
 * its invariants (batch_sizes non-increasing from B, summing to tokens, inverse
 * permutations) and is then run forward and backward. Byte 0 odd: byte 1 is the batch,
 * bytes 2-3 the tokens claimed, the rest batch_sizes (signed bytes) handed straight to
 * mt_rnn_forward. A refused input must be MT_EINVAL with an error logged; an accepted one
 * runs forward and backward over x, y, dy, dx of exactly the claimed rows, each its own
 * malloc, so ASan sees any read or write past them. */
#include <string.h>

#include "memtrace/rnn.h"
#include "tests/fuzz/fuzz.h"

enum { IN = 2, HID = 3, MAX_STEPS = 512 };

static int errors;

static void on_log(void *ud, mt_log_level_e level, const char *msg)
{
    (void)ud;
    (void)msg;
    errors += level == MT_LOG_ERROR;
}

/* One small bidirectional LSTM in chunks of 2 steps, made once (a sequence ends and starts
 * inside chunks and at their borders, in both directions). */
static mt_rnn_t *module(void)
{
    static mt_backend_t *b;
    static mt_alloc_t *a;
    static mt_rnn_t *m;
    if (m)
        return m;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 256u << 20;
    FUZZ_CHECK(mt_backend_create(&b, &bc) == 0, "sim backend");
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    FUZZ_CHECK(mt_alloc_create(&a, &ac) == 0, "allocator");
    mt_rnn_cfg_t c = mt_rnn_cfg_default();
    c.mode = MT_RNN_LSTM;
    c.input_size = IN;
    c.hidden_size = HID;
    c.bidirectional = true;
    c.chunk_steps = 2;
    c.alloc = a;
    c.log = on_log;
    FUZZ_CHECK(mt_rnn_create(&m, &c) == 0, "module");
    return m;
}

static float *fresh(size_t n)
{
    float *p = malloc(n ? n * sizeof(float) : 1);
    FUZZ_CHECK(p != NULL, "out of memory");
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 7) % 11) * 0.1f - 0.5f;
    return p;
}

/* Forward and backward over exactly `tokens` rows; returns forward's code. */
static int run(int T, int B, const int *bs, size_t tokens)
{
    mt_rnn_t *m = module();
    float *x = fresh(tokens * IN), *y = fresh(tokens * 2 * HID), *dy = fresh(tokens * 2 * HID);
    float *dx = fresh(tokens * IN), *hy = fresh((size_t)2 * (size_t)(B > 0 ? B : 0) * HID);
    mt_rnn_io_t io = {
        .seq_len = T, .batch = B, .x = x, .y = y, .hy = hy, .batch_sizes = bs, .tokens = tokens};
    mt_rnn_reserve_t *r = NULL;
    int rc = mt_rnn_forward(m, &io, &r);
    if (rc == 0) {
        mt_rnn_grad_io_t g = {.dy = dy, .dx = dx};
        FUZZ_CHECK(mt_rnn_backward(m, &r, &g) == 0, "an accepted batch runs backward");
    }
    FUZZ_CHECK(r == NULL, "no reserve left behind");
    free(x);
    free(y);
    free(dy);
    free(dx);
    free(hy);
    return rc;
}

static void from_lengths(const uint8_t *data, size_t size)
{
    if (size < 2)
        return;
    int capacity = 1 + (data[1] >> 1) % 64, n = (int)(size - 2) > 64 ? 64 : (int)(size - 2);
    bool sorted = data[1] & 1;
    int lens[64];
    for (int i = 0; i < n; i++)
        lens[i] = (int8_t)data[2 + i];
    errors = 0;
    mt_rnn_pack_t p;
    int rc = mt_rnn_pack_init(&p, lens, n, capacity, sorted, on_log, NULL);
    if (rc != 0) {
        FUZZ_CHECK(rc == MT_EINVAL, "bad lengths are MT_EINVAL");
        FUZZ_CHECK(errors > 0, "bad lengths are named in the log");
        return;
    }
    size_t sum = 0;
    FUZZ_CHECK(p.batch_sizes[0] == n, "every sequence runs at step 0");
    for (int t = 0; t < p.max_len; t++) {
        FUZZ_CHECK(p.batch_sizes[t] >= 1 && (t == 0 || p.batch_sizes[t] <= p.batch_sizes[t - 1]),
                   "batch_sizes non-increasing");
        sum += (size_t)p.batch_sizes[t];
    }
    FUZZ_CHECK(sum == p.tokens, "batch_sizes sum to the tokens");
    for (int i = 0; i < n; i++) {
        FUZZ_CHECK(p.unsorted_indices[p.sorted_indices[i]] == i, "inverse permutations");
        FUZZ_CHECK(p.lengths[i] == lens[p.sorted_indices[i]], "lengths follow the order");
    }
    FUZZ_CHECK(run(p.max_len, n, p.batch_sizes, p.tokens) == 0, "a packed shape runs");
    mt_rnn_pack_fini(&p);
}

static void from_batch_sizes(const uint8_t *data, size_t size)
{
    if (size < 4)
        return;
    int B = (int8_t)data[1];
    size_t tokens = (size_t)data[2] | (size_t)data[3] << 8;
    int T = (int)(size - 4) > MAX_STEPS ? MAX_STEPS : (int)(size - 4);
    if (T < 1 || tokens > 8192)
        return;
    /* Exactly T ints: ASan sees a read of batch_sizes[T]. */
    int *bs = malloc((size_t)T * sizeof *bs);
    FUZZ_CHECK(bs != NULL, "out of memory");
    for (int t = 0; t < T; t++)
        bs[t] = (int8_t)data[4 + t];
    errors = 0;
    int rc = run(T, B, bs, tokens);
    if (rc != 0) {
        FUZZ_CHECK(rc == MT_EINVAL, "bad batch_sizes are MT_EINVAL");
        FUZZ_CHECK(errors > 0 || B < 1, "bad batch_sizes are named in the log");
    }
    free(bs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (data[0] % 2 == 0)
        from_lengths(data, size);
    else
        from_batch_sizes(data, size);
    return 0;
}
