/* Packed sequences (PyTorch's PackedSequence): the shape of a batch of sequences of their
 * own lengths, and the copies between padded [capacity, B, width] tensors and the packed
 * form [tokens, width] (time-major, the rows of step t contiguous, sequences in decreasing
 * length). The shape lives in host memory; the copies go through the module's compute path
 * (device-to-device), one per run of consecutive rows. */
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "rnn/internal.h"

#define plog(log, ud, ...) mt__logf(log, ud, MT_LOG_ERROR, __VA_ARGS__)

void mt_rnn_pack_fini(mt_rnn_pack_t *p)
{
    if (!p)
        return;
    free(p->lengths);
    free(p->batch_sizes);
    free(p->sorted_indices);
    free(p->unsorted_indices);
    memset(p, 0, sizeof *p);
}

typedef struct key_s {
    int len, idx;
} len_key_t;

/* Decreasing length, then increasing index: a stable order. */
static int by_length(const void *a, const void *b)
{
    const len_key_t *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static int check_lengths(const int *lengths, int batch, int capacity, bool enforce_sorted,
                         mt_log_cb log, void *ud)
{
    for (int i = 0; i < batch; i++) {
        if (lengths[i] < 1) {
            plog(log, ud,
                 "rnn: pack: lengths[%d] = %d: every sequence needs at least one step (zero "
                 "lengths are not packable)",
                 i, lengths[i]);
            return MT_EINVAL;
        }
        if (lengths[i] > capacity) {
            plog(log, ud,
                 "rnn: pack: lengths[%d] = %d is above the capacity %d (the padded length)", i,
                 lengths[i], capacity);
            return MT_EINVAL;
        }
        if (enforce_sorted && i > 0 && lengths[i] > lengths[i - 1]) {
            plog(log, ud,
                 "rnn: pack: lengths are not sorted by decreasing length although sorted "
                 "input was promised: lengths[%d] = %d > lengths[%d] = %d (pass "
                 "enforce_sorted = false to have them sorted)",
                 i, lengths[i], i - 1, lengths[i - 1]);
            return MT_EINVAL;
        }
    }
    return 0;
}

int mt_rnn_pack_init(mt_rnn_pack_t *p, const int *lengths, int batch, int capacity,
                     bool enforce_sorted, mt_log_cb log, void *log_ud)
{
    if (!p)
        return MT_EINVAL;
    memset(p, 0, sizeof *p);
    if (!lengths || batch < 1 || capacity < 1) {
        plog(log, log_ud, "rnn: pack: %s",
             !lengths    ? "no lengths"
             : batch < 1 ? "batch < 1"
                         : "capacity < 1");
        return MT_EINVAL;
    }
    int rc = check_lengths(lengths, batch, capacity, enforce_sorted, log, log_ud);
    if (rc)
        return rc;
    size_t b = (size_t)batch;
    len_key_t *keys = malloc(b * sizeof *keys);
    p->lengths = malloc(b * sizeof(int));
    p->sorted_indices = malloc(b * sizeof(int));
    p->unsorted_indices = malloc(b * sizeof(int));
    if (!keys || !p->lengths || !p->sorted_indices || !p->unsorted_indices)
        goto fail_mem;
    for (int i = 0; i < batch; i++)
        keys[i] = (len_key_t){lengths[i], i};
    if (!enforce_sorted)
        qsort(keys, b, sizeof *keys, by_length);
    for (int i = 0; i < batch; i++) {
        p->lengths[i] = keys[i].len;
        p->sorted_indices[i] = keys[i].idx;
        p->unsorted_indices[keys[i].idx] = i;
        p->tokens += (size_t)keys[i].len;
    }
    p->batch = batch;
    p->capacity = capacity;
    p->max_len = p->lengths[0];
    p->batch_sizes = malloc((size_t)p->max_len * sizeof(int));
    if (!p->batch_sizes)
        goto fail_mem;
    /* batch_sizes[t] = #{i : lengths[i] > t}: lengths decrease, so walk them once. */
    int running = batch;
    for (int t = 0; t < p->max_len; t++) {
        while (running > 0 && p->lengths[running - 1] <= t)
            running--;
        p->batch_sizes[t] = running;
    }
    free(keys);
    return 0;

fail_mem:
    free(keys);
    mt_rnn_pack_fini(p);
    return MT_ENOMEM;
}

void mt_rnn_pack_io(const mt_rnn_pack_t *p, mt_rnn_io_t *io)
{
    io->seq_len = p->max_len;
    io->batch = p->batch;
    io->batch_sizes = p->batch_sizes;
    io->tokens = p->tokens;
}

/* Copies rows between a [capacity, B, width] tensor and the packed [tokens, width] one: for
 * each step, packed row i of the step <-> padded row sorted_indices[i], as few copies as
 * there are runs of consecutive indices. */
static int move_rows(mt_rnn_t *m, const mt_rnn_pack_t *p, int width, float *padded, float *packed,
                     bool to_packed)
{
    size_t w = (size_t)width * sizeof(float), off = 0;
    for (int t = 0; t < p->max_len; t++) {
        int n = p->batch_sizes[t];
        for (int i = 0; i < n;) {
            int j = i + 1;
            while (j < n && p->sorted_indices[j] == p->sorted_indices[j - 1] + 1)
                j++;
            float *pad = padded + ((size_t)t * (size_t)p->batch + (size_t)p->sorted_indices[i]) *
                                      (size_t)width;
            float *pk = packed + (off + (size_t)i) * (size_t)width;
            int rc = to_packed ? m->path->copy(m, pk, pad, (size_t)(j - i) * w)
                               : m->path->copy(m, pad, pk, (size_t)(j - i) * w);
            if (rc)
                return rc;
            i = j;
        }
        off += (size_t)n;
    }
    return 0;
}

static int check_copy(const mt_rnn_t *m, const mt_rnn_pack_t *p, int width, const void *a,
                      const void *b)
{
    if (!m || !p || !p->batch_sizes || width < 1 || !a || !b)
        return MT_EINVAL;
    return 0;
}

int mt_rnn_pack(mt_rnn_t *m, const mt_rnn_pack_t *p, int width, const float *padded, float *packed)
{
    int rc = check_copy(m, p, width, padded, packed);
    return rc ? rc : move_rows(m, p, width, (float *)padded, packed, true);
}

int mt_rnn_unpack(mt_rnn_t *m, const mt_rnn_pack_t *p, int width, const float *packed,
                  float *padded)
{
    int rc = check_copy(m, p, width, packed, padded);
    if (rc)
        return rc;
    /* Steps past a sequence's end read 0, as pad_packed_sequence's default. */
    size_t n = (size_t)p->capacity * (size_t)p->batch * (size_t)width * sizeof(float);
    rc = m->path->zero(m, padded, n);
    return rc ? rc : move_rows(m, p, width, padded, (float *)packed, false);
}

/* Permutes the rows of [groups, B, width]: dst row i of each group <- src row idx[i]. */
static int permute(mt_rnn_t *m, const mt_rnn_pack_t *p, const int *idx, int groups, int width,
                   const float *src, float *dst)
{
    if (!m || !p || !p->sorted_indices || groups < 1 || width < 1 || !src || !dst || src == dst)
        return MT_EINVAL;
    size_t w = (size_t)width, b = (size_t)p->batch;
    for (size_t g = 0; g < (size_t)groups; g++)
        for (size_t i = 0; i < b; i++) {
            int rc = m->path->copy(m, dst + (g * b + i) * w, src + (g * b + (size_t)idx[i]) * w,
                                   w * sizeof(float));
            if (rc)
                return rc;
        }
    return 0;
}

int mt_rnn_pack_states(mt_rnn_t *m, const mt_rnn_pack_t *p, int groups, int width, const float *src,
                       float *dst)
{
    return permute(m, p, p ? p->sorted_indices : NULL, groups, width, src, dst);
}

int mt_rnn_unpack_states(mt_rnn_t *m, const mt_rnn_pack_t *p, int groups, int width,
                         const float *src, float *dst)
{
    return permute(m, p, p ? p->unsorted_indices : NULL, groups, width, src, dst);
}
