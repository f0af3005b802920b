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
 * memory read of y per pass. */
static uint64_t cpu_checksum(mt_rnn_t *m, const float *p, size_t n)
{
    (void)m;
    uint64_t a[8] = {0}, b[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint32_t w[8];
        memcpy(w, p + i, sizeof w);
        for (int j = 0; j < 8; j++) {
            a[j] += w[j];
            b[j] += a[j];
        }
    }
    for (; i < n; i++) {
        uint32_t w;
        memcpy(&w, p + i, sizeof w);
        a[0] += w;
        b[0] += a[0];
    }
    uint64_t r = n;
    for (int j = 0; j < 8; j++)
        r = (r ^ a[j] ^ (b[j] << 1)) * 0x9e3779b97f4a7c15ull + (r >> 29);
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
