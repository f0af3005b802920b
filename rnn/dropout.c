/* Dropout between layers (PyTorch's nn.LSTM(dropout=p), cuDNN's RNN dropout): in a training
 * forward, the output of every layer but the last is multiplied by a mask before the next
 * layer reads it, 0 with probability p and 1 / (1 - p) otherwise (inverted dropout).
 *
 * The masks come from a counter-based generator: element i of layer l's output in the pass
 * with key k is kept iff the top 24 bits of mix(mix(k ^ c1 (l + 1)) + c2 i) are >= p 2^24
 * (mix = splitmix64's finaliser). A pass's key mixes the module's dropout seed and the
 * number of training forwards it has run since that seed, so masks are reproducible (set
 * the seed and counter again) and differ from pass to pass.
 *
 * Memory (why the masks are regenerated, not kept): the cpu path's reserve already keeps
 * each lower layer's output h (its own backward needs it, unmasked); the next layer's input
 * is that h times the mask, so forward and backward rebuild it, one chunk of steps at a time,
 * in a scratch of [C, B, D*H] floats of their workspace (tagged workspace, freed with the
 * call). The reserve gains no byte: activations per step stay those of the run without
 * dropout (mt_rnn_activation_bytes is unchanged), and activation offload moves the same
 * chunks; the cost is the generator run twice per masked element (forward and backward),
 * a few multiplies each against the sgemms that read the same element. Keeping the dropped
 * input instead would add one H-vector per lower layer and direction to every step, and a
 * byte mask a quarter of one. */
#include "rnn/internal.h"

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

bool mt__rnn_drop_on(const mt__rnn_shape_t *s)
{
    return s->dropout > 0.0f && s->layers > 1;
}

uint64_t mt__rnn_drop_key(uint64_t seed, uint64_t counter)
{
    return mix64(mix64(seed) ^ (counter * 0xd1b54a32d192ed03ull + 0x9e3779b97f4a7c15ull));
}

void mt__rnn_drop_apply(const mt__rnn_shape_t *s, uint64_t key, int layer, size_t first,
                        size_t count, const float *src, float *dst)
{
    uint64_t lk = mix64(key ^ (0x632be59bd9b4e019ull * (uint64_t)(layer + 1)));
    /* Dropped iff the top 24 bits are below thr: probability thr / 2^24, within 3e-8 of p. */
    uint64_t thr = (uint64_t)((double)s->dropout * 16777216.0 + 0.5);
    float scale = 1.0f / (1.0f - s->dropout);
    for (size_t i = 0; i < count; i++) {
        uint64_t h = mix64(lk + (first + i) * 0x9e3779b97f4a7c15ull);
        dst[i] = (h >> 40) < thr ? 0.0f : src[i] * scale;
    }
}

/* ---- public ---- */

int mt_rnn_set_dropout_state(mt_rnn_t *m, uint64_t seed, uint64_t counter)
{
    if (!m)
        return MT_EINVAL;
    uint64_t old_seed = m->drop_seed, old_counter = m->drop_counter;
    m->drop_seed = seed;
    m->drop_counter = counter;
    int rc = m->path->drop_reseed ? m->path->drop_reseed(m) : 0;
    if (rc) {
        m->drop_seed = old_seed;
        m->drop_counter = old_counter;
    }
    return rc;
}

int mt_rnn_dropout_state(const mt_rnn_t *m, uint64_t *seed, uint64_t *counter)
{
    if (!m || !seed || !counter)
        return MT_EINVAL;
    *seed = m->drop_seed;
    *counter = m->drop_counter;
    return 0;
}

int mt_rnn_dropout_mask(const mt_rnn_t *m, uint64_t seed, uint64_t counter, int layer, int seq_len,
                        int batch, float *out)
{
    if (!m || !out || seq_len < 1 || batch < 1 || layer < 0 || layer >= m->shape.layers - 1)
        return MT_EINVAL;
    if (m->path != &mt__rnn_cpu_path)
        return MT_ENOTSUP; /* cuDNN draws its masks from its own generator */
    size_t n = (size_t)seq_len * (size_t)batch * (size_t)m->shape.dirs * (size_t)m->shape.hidden;
    /* The mask applied to ones: exactly the factors the kernels multiply by. */
    for (size_t i = 0; i < n; i++)
        out[i] = 1.0f;
    if (mt__rnn_drop_on(&m->shape))
        mt__rnn_drop_apply(&m->shape, mt__rnn_drop_key(seed, counter), layer, 0, n, out, out);
    return 0;
}
