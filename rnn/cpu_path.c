/* The "cpu" compute path: the CBLAS kernels behind the path interface, in bytes. It runs on
 * the sim backend, whose device memory is host-addressable, so the kernels compute directly
 * in the module's "device" buffers. A GPU path enqueues its kernels on the module's stream;
 * this one runs on the calling thread instead, after waiting for the work already queued on
 * that stream (a copy into x, say), so the order a program sees is the same. Its training
 * reserve is a store of per-chunk blocks (offload.c), which activation offload can park in
 * pinned host memory; dropout masks are not in it (regenerated from the pass's key,
 * dropout.c), so offload works unchanged with dropout. */
#include <stdint.h>
#include <string.h>

#include "memtrace/backend.h"

#include "rnn/internal.h"
#include "util/assert.h"

static size_t cpu_reserve_bytes(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    return mt__rnn_cpu_io_reserve(&m->shape, io) * sizeof(float);
}

static size_t cpu_fwd_work_bytes(const mt_rnn_t *m, const mt_rnn_io_t *io, bool training)
{
    return mt__rnn_cpu_io_fwd_work(&m->shape, io, training) * sizeof(float);
}

static size_t cpu_bwd_work_bytes(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    return mt__rnn_cpu_io_bwd_work(&m->shape, io) * sizeof(float);
}

/* The reserve: one allocator block per chunk of time steps (offload.c). */
static int cpu_reserve_new(mt_rnn_t *m, const mt_rnn_io_t *io, void **out)
{
    return mt__rnn_store_new(m, io, (mt__rnn_store_t **)out);
}

static void cpu_reserve_free(mt_rnn_t *m, void *reserve)
{
    mt__rnn_store_free(m, reserve);
}

static int cpu_forward(mt_rnn_t *m, const float *w, const mt_rnn_io_t *io, bool training,
                       uint64_t drop_key, void *reserve, void *work)
{
    int rc = mt_stream_synchronize(m->backend, m->cfg.stream);
    if (rc)
        return rc;
    mt__rnn_chunks_t chunks;
    if (training)
        mt__rnn_store_chunks(reserve, &chunks);
    return mt__rnn_cpu_forward_chunks(&m->shape, w, io, training, drop_key,
                                      training ? &chunks : NULL, work);
}

static int cpu_backward(mt_rnn_t *m, const float *w, float *dw, const mt_rnn_io_t *io,
                        uint64_t drop_key, void *reserve, const mt_rnn_grad_io_t *g, void *work)
{
    int rc = mt_stream_synchronize(m->backend, m->cfg.stream);
    if (rc)
        return rc;
    mt__rnn_chunks_t chunks;
    mt__rnn_store_chunks(reserve, &chunks);
    return mt__rnn_cpu_backward_chunks(&m->shape, w, dw, io, drop_key, &chunks, g, work);
}

/* A Fletcher-style sum over the bit patterns in 8 independent lanes (a_j += w, b_j += a_j,
 * 64-bit, so the compiler vectorizes it): any change of one float, and any reordering,
 * changes it. It guards against a caller's mistake, not an adversary, and costs about a
 * memory read of y per pass.
 *
 * The sums compose: lanes that went through (a1, b1) and then n2 more words each, which
 * alone give (a2, b2), hold (a1 + a2, b1 + b2 + n2 a1). So the floats are summed in pieces,
 * by the threads of mt__rnn_tiles_par, and the pieces combined in order give the
 * sequential sum exactly. */
enum { SUM_LANES = 8, SUM_PIECES = 64, SUM_MIN_PIECE = 1 << 16 };

typedef struct sum_piece_s {
    uint64_t a[SUM_LANES], b[SUM_LANES], n[SUM_LANES];
} sum_piece_t;

typedef struct sum_job_s {
    const float *p;
    size_t n, piece; /* floats; piece: a multiple of SUM_LANES */
    sum_piece_t *out;
} sum_job_t;

static void sum_piece(void *arg, int k)
{
    const sum_job_t *j = arg;
    size_t i0 = (size_t)k * j->piece, e = i0 + j->piece < j->n ? i0 + j->piece : j->n;
    uint64_t a[SUM_LANES] = {0}, b[SUM_LANES] = {0};
    const float *p = j->p;
    size_t i = i0;
    for (; i + SUM_LANES <= e; i += SUM_LANES) {
        uint32_t w[SUM_LANES];
        memcpy(w, p + i, sizeof w);
        for (int l = 0; l < SUM_LANES; l++) {
            a[l] += w[l];
            b[l] += a[l];
        }
    }
    sum_piece_t *o = &j->out[k];
    for (int l = 0; l < SUM_LANES; l++)
        o->n[l] = (i - i0) / SUM_LANES;
    for (; i < e; i++) { /* the tail, in the last piece: lane 0 */
        uint32_t w;
        memcpy(&w, p + i, sizeof w);
        a[0] += w;
        b[0] += a[0];
        o->n[0]++;
    }
    memcpy(o->a, a, sizeof a);
    memcpy(o->b, b, sizeof b);
}

static uint64_t cpu_checksum(mt_rnn_t *m, const float *p, size_t n)
{
    /* The pieces depend on n alone, not on the thread count. */
    size_t piece = (n + SUM_PIECES - 1) / SUM_PIECES;
    piece = piece < SUM_MIN_PIECE ? SUM_MIN_PIECE : (piece + SUM_LANES - 1) / SUM_LANES * SUM_LANES;
    int np = n ? (int)((n + piece - 1) / piece) : 0;
    sum_piece_t out[SUM_PIECES];
    sum_job_t j = {p, n, piece, out};
    mt_assert(np <= SUM_PIECES);
    mt__rnn_tiles_par(&m->shape, np, sum_piece, &j);
    uint64_t a[SUM_LANES] = {0}, b[SUM_LANES] = {0};
    for (int k = 0; k < np; k++)
        for (int l = 0; l < SUM_LANES; l++) {
            b[l] += out[k].b[l] + out[k].n[l] * a[l];
            a[l] += out[k].a[l];
        }
    uint64_t r = n;
    for (int l = 0; l < SUM_LANES; l++)
        r = (r ^ a[l] ^ (b[l] << 1)) * 0x9e3779b97f4a7c15ull + (r >> 29);
    return r;
}

static int cpu_copy(mt_rnn_t *m, void *dst, const void *src, size_t n)
{
    (void)m;
    if (n)
        memmove(dst, src, n);
    return 0;
}

static int cpu_zero(mt_rnn_t *m, void *dst, size_t n)
{
    (void)m;
    if (n)
        memset(dst, 0, n);
    return 0;
}

const mt__rnn_path_t mt__rnn_cpu_path = {
    .name = "cpu",
    .init = NULL,
    .fini = NULL,
    .reserve_bytes = cpu_reserve_bytes,
    .reserve_new = cpu_reserve_new,
    .reserve_free = cpu_reserve_free,
    .fwd_work_bytes = cpu_fwd_work_bytes,
    .bwd_work_bytes = cpu_bwd_work_bytes,
    .checksum = cpu_checksum,
    .forward = cpu_forward,
    .backward = cpu_backward,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .drop_reseed = NULL, /* its masks are a function of the seed and counter (dropout.c) */
};
