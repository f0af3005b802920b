/* The time structure of a batch (mt__rnn_seq_t) and the CPU path's chunk geometry and
 * reserve layout (internal.h): the arithmetic the forward and backward kernels
 * (cpu_forward.c, cpu_backward.c) and the reserve store (offload.c) share. */
#include <stdlib.h>
#include <string.h>

#include "rnn/internal.h"
#include "util/log.h"

/* ---- the time structure of a batch ---- */

int mt__rnn_seq_init(mt__rnn_seq_t *q, const mt_rnn_io_t *io)
{
    int T = io->seq_len;
    q->T = T;
    q->B = io->batch;
    q->bs = malloc(((size_t)T + 1) * sizeof *q->bs);
    q->off = malloc(((size_t)T + 1) * sizeof *q->off);
    if (!q->bs || !q->off) {
        mt__rnn_seq_fini(q);
        return MT_ENOMEM;
    }
    q->off[0] = 0;
    for (int t = 0; t < T; t++) {
        q->bs[t] = io->batch_sizes ? io->batch_sizes[t] : io->batch;
        q->off[t + 1] = q->off[t] + (size_t)q->bs[t];
    }
    q->bs[T] = 0;
    q->rows = q->off[T];
    return 0;
}

void mt__rnn_seq_fini(mt__rnn_seq_t *q)
{
    free(q->bs);
    free(q->off);
    q->bs = NULL;
    q->off = NULL;
}

int mt__rnn_seq_check(const mt_rnn_io_t *io, mt_log_cb log, void *ud)
{
    const int *bs = io->batch_sizes;
    if (!bs)
        return 0;
    if (bs[0] != io->batch) {
        mt__logf(log, ud, MT_LOG_ERROR,
                 "rnn: packed input: batch_sizes[0] = %d is not the batch %d (the number of "
                 "sequences, all running at step 0)",
                 bs[0], io->batch);
        return MT_EINVAL;
    }
    size_t sum = 0;
    for (int t = 0; t < io->seq_len; t++) {
        if (bs[t] < 1) {
            mt__logf(log, ud, MT_LOG_ERROR,
                     "rnn: packed input: batch_sizes[%d] = %d: a step no sequence reaches "
                     "(seq_len %d is above the longest length, or a length is zero)",
                     t, bs[t], io->seq_len);
            return MT_EINVAL;
        }
        if (t > 0 && bs[t] > bs[t - 1]) {
            mt__logf(log, ud, MT_LOG_ERROR,
                     "rnn: packed input: batch_sizes is not non-increasing: batch_sizes[%d] "
                     "= %d > batch_sizes[%d] = %d (sequences not sorted by decreasing length)",
                     t, bs[t], t - 1, bs[t - 1]);
            return MT_EINVAL;
        }
        sum += (size_t)bs[t];
    }
    if (sum != io->tokens) {
        mt__logf(log, ud, MT_LOG_ERROR,
                 "rnn: packed input: batch_sizes sum to %zu rows but io.tokens is %zu (the "
                 "rows of x and y)",
                 sum, io->tokens);
        return MT_EINVAL;
    }
    return 0;
}

/* ---- chunks and reserve layout ---- */

int mt__rnn_cpu_chunk_len(const mt__rnn_shape_t *s)
{
    return s->chunk > 0 ? s->chunk : MT__RNN_CHUNK;
}

int mt__rnn_cpu_nchunks(const mt__rnn_shape_t *s, int T)
{
    int c = mt__rnn_cpu_chunk_len(s);
    return (T + c - 1) / c;
}

int mt__rnn_cpu_chunk_steps(const mt__rnn_shape_t *s, int T, int k)
{
    int c = mt__rnn_cpu_chunk_len(s);
    return T - k * c < c ? T - k * c : c;
}

size_t mt__rnn_cpu_chunk_row0(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q, int k)
{
    return q->off[k * mt__rnn_cpu_chunk_len(s)];
}

size_t mt__rnn_cpu_chunk_rows(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q, int k)
{
    int t0 = k * mt__rnn_cpu_chunk_len(s);
    return q->off[t0 + mt__rnn_cpu_chunk_steps(s, q->T, k)] - q->off[t0];
}

size_t mt__rnn_cpu_max_chunk_rows(const mt__rnn_shape_t *s, const mt__rnn_seq_t *q)
{
    /* Batch sizes do not increase: the first chunk has the most rows. */
    return mt__rnn_cpu_chunk_rows(s, q, 0);
}

int mt__rnn_cpu_ld(int n)
{
    return n % 256 == 0 ? n + 16 : n;
}

int mt__rnn_cpu_gld(const mt__rnn_shape_t *s)
{
    return mt__rnn_cpu_ld(s->gates * s->hidden);
}

static size_t pseudo_reserve(const mt__rnn_shape_t *s, size_t nb)
{
    if (!mt__rnn_cpu_keeps_gates(s))
        return 0;
    return nb * (size_t)(mt__rnn_cpu_gld(s) + s->hidden);
}

size_t mt__rnn_cpu_chunk_floats(const mt__rnn_shape_t *s, size_t nb)
{
    size_t dh = (size_t)s->dirs * (size_t)s->hidden;
    return (size_t)s->layers * (size_t)s->dirs * pseudo_reserve(s, nb) +
           (size_t)(s->layers - 1) * nb * dh;
}

size_t mt__rnn_cpu_reserve_floats(const mt__rnn_shape_t *s, size_t rows)
{
    return mt__rnn_cpu_chunk_floats(s, rows);
}

float *mt__rnn_cpu_gates(const mt__rnn_shape_t *s, float *chunk, size_t nb, int p)
{
    if (!mt__rnn_cpu_keeps_gates(s))
        return NULL;
    return chunk + (size_t)p * pseudo_reserve(s, nb);
}

float *mt__rnn_cpu_aux(const mt__rnn_shape_t *s, float *chunk, size_t nb, int p)
{
    if (!mt__rnn_cpu_keeps_gates(s))
        return NULL;
    return mt__rnn_cpu_gates(s, chunk, nb, p) + nb * (size_t)mt__rnn_cpu_gld(s);
}

float *mt__rnn_cpu_layer_out(const mt__rnn_shape_t *s, float *chunk, size_t nb, int l)
{
    size_t dh = (size_t)s->dirs * (size_t)s->hidden;
    return chunk + (size_t)s->layers * (size_t)s->dirs * pseudo_reserve(s, nb) +
           (size_t)l * nb * dh;
}
