/* The data descriptors, cuDNN's sizes for a shape, and the device sequence lengths (the
 * "data layout" paragraph of cudnn_path.c). */
#include <stdlib.h>
#include <string.h>

#include "rnn/cudnn_internal.h"

/* Length of each sequence of io's shape: T each, or from the batch sizes (sequence b runs
 * while b < batch_sizes[t]). */
static void shape_lengths(const mt_rnn_io_t *io, int *lens)
{
    int T = io->seq_len, B = io->batch;
    if (!io->batch_sizes) {
        for (int i = 0; i < B; i++)
            lens[i] = T;
        return;
    }
    for (int t = 0; t < T; t++) {
        int lo = t + 1 < T ? io->batch_sizes[t + 1] : 0;
        for (int b = lo; b < io->batch_sizes[t] && b < B; b++)
            lens[b] = t + 1;
    }
}

/* True when io's shape is the one described (no lengths array to compare when padded). */
static bool same_shape(const cudnn_state_t *st, const mt_rnn_io_t *io)
{
    if (st->T != io->seq_len || st->B != io->batch || st->packed != (io->batch_sizes != NULL))
        return false;
    if (!st->packed)
        return true;
    int T = io->seq_len;
    for (int t = 0; t < T; t++) {
        int lo = t + 1 < T ? io->batch_sizes[t + 1] : 0;
        for (int b = lo; b < io->batch_sizes[t]; b++)
            if (st->host_lens[b] != t + 1)
                return false;
    }
    return true;
}

/* Points the data descriptors and the size cache at io's shape. */
static int describe_shape(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    cudnn_state_t *st = S(m);
    const mt__rnn_shape_t *s = &m->shape;
    int T = io->seq_len, B = io->batch;
    st->T = st->B = 0;
    if (B > st->host_cap) {
        int *n = realloc(st->host_lens, (size_t)B * sizeof *n);
        if (!n)
            return MT_ENOMEM;
        st->host_lens = n;
        st->host_cap = B;
    }
    shape_lengths(io, st->host_lens);
    st->packed = io->batch_sizes != NULL;
    CK(m, mt__dnn->cudnnSetRNNDataDescriptor(st->xd, CUDNN_DATA_FLOAT,
                                             CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, T, B, s->input,
                                             st->host_lens, NULL));
    CK(m, mt__dnn->cudnnSetRNNDataDescriptor(st->yd, CUDNN_DATA_FLOAT,
                                             CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, T, B,
                                             s->dirs * s->hidden, st->host_lens, NULL));
    int dims[3] = {s->layers * s->dirs, B, s->hidden};
    int strides[3] = {B * s->hidden, s->hidden, 1};
    CK(m, mt__dnn->cudnnSetTensorNdDescriptor(st->hd, CUDNN_DATA_FLOAT, 3, dims, strides));
    size_t unused;
    CK(m, mt__dnn->cudnnGetRNNTempSpaceSizes(st->h, st->rnn, CUDNN_FWD_MODE_INFERENCE, st->xd,
                                             &st->work_inf, &unused));
    CK(m, mt__dnn->cudnnGetRNNTempSpaceSizes(st->h, st->rnn, CUDNN_FWD_MODE_TRAINING, st->xd,
                                             &st->work_train, &st->reserve));
    st->T = T;
    st->B = B;
    return 0;
}

/* describe_shape on the backend's device; nothing to do when the shape is already
 * described. */
static int set_shape(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    cudnn_state_t *st = S(m);
    if (same_shape(st, io))
        return 0;
    dev_guard_t g;
    int rc = mt__dnn_dev_enter(m, &g);
    if (rc == 0)
        rc = describe_shape(m, io);
    mt__dnn_dev_leave(&g);
    return rc;
}

/* A size function cannot return an error: keep it for the call that follows. */
void mt__dnn_shape_for_size(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    int rc = set_shape(m, io);
    if (rc)
        S(m)->size_err = rc;
}

/* The same for a padded shape (T, B). */
void mt__dnn_padded_for_size(const mt_rnn_t *m, int T, int B)
{
    mt_rnn_io_t io = {.seq_len = T, .batch = B};
    mt__dnn_shape_for_size(m, &io);
}

/* devSeqLengths: cuDNN reads the lengths from device memory, asynchronously, possibly
 * after the call returns. They are kept as a table (row t - 1 = B copies of t) that only
 * grows: a shape within it needs no copy and no wait, so variable-length batches after a
 * warm-up at the largest shape cost nothing here. Growing makes a new table, filled on
 * the module's stream and waited for (the host staging must outlive the copy); the old one
 * goes back to the allocator stream-ordered, after the work that may still read it. */
static int packed_lengths(mt_rnn_t *m, cudnn_state_t *st);

static int device_lengths(mt_rnn_t *m, cudnn_state_t *st)
{
    if (st->packed)
        return packed_lengths(m, st);
    if (st->lens && st->T <= st->lens_T && st->B <= st->lens_B)
        return 0;
    int nT = st->T > st->lens_T ? st->T : st->lens_T;
    int nB = st->B > st->lens_B ? st->B : st->lens_B;
    size_t n = (size_t)nT * (size_t)nB;
    int32_t *host = malloc(n * sizeof *host);
    if (!host)
        return MT_ENOMEM;
    for (int t = 0; t < nT; t++)
        for (int b = 0; b < nB; b++)
            host[(size_t)t * (size_t)nB + (size_t)b] = t + 1;
    int32_t *dev = NULL;
    int rc =
        mt_alloc_malloc(m->alloc, n * sizeof *host, m->cfg.stream, MT_TAG_WORKSPACE, (void **)&dev);
    if (rc == 0)
        rc = mt_memcpy_async(m->backend, dev, host, n * sizeof *host, MT_MEMCPY_HOST_TO_DEVICE,
                             m->cfg.stream);
    if (rc == 0)
        rc = mt_stream_synchronize(m->backend, m->cfg.stream);
    free(host);
    if (rc) {
        if (dev)
            mt_alloc_free(m->alloc, dev);
        return rc;
    }
    if (st->lens)
        mt_alloc_free(m->alloc, st->lens);
    st->lens = dev;
    st->lens_T = nT;
    st->lens_B = nB;
    return 0;
}

/* Packed shapes: their lengths in a device array that only grows (a warm-up at the largest
 * batch makes it large enough), keyed by a host copy of what it holds. The same lengths
 * again (backward after its forward, or a repeated batch shape) need no copy and no wait.
 * New lengths are staged in the key and copied on the module's stream; the host waits for
 * that copy because the key is overwritten by the next new shape (pageable memory: the copy
 * may read it after cuMemcpyAsync returns). The stream orders the copy after the work that
 * read the old lengths. */
static int packed_lengths(mt_rnn_t *m, cudnn_state_t *st)
{
    if (st->B > st->plens_cap) {
        int *key = malloc((size_t)st->B * sizeof *key);
        if (!key)
            return MT_ENOMEM;
        int32_t *dev = NULL;
        int rc = mt_alloc_malloc(m->alloc, (size_t)st->B * sizeof *dev, m->cfg.stream,
                                 MT_TAG_WORKSPACE, (void **)&dev);
        if (rc) {
            free(key);
            return rc;
        }
        if (st->plens)
            mt_alloc_free(m->alloc, st->plens);
        free(st->plens_key);
        st->plens = dev;
        st->plens_key = key;
        st->plens_cap = st->B;
        st->plens_n = 0;
    }
    size_t bytes = (size_t)st->B * sizeof(int);
    if (st->plens_n == st->B && memcmp(st->plens_key, st->host_lens, bytes) == 0)
        return 0;
    _Static_assert(sizeof(int) == sizeof(int32_t), "seqLengthArray is int, devSeqLengths int32");
    st->plens_n = 0;
    memcpy(st->plens_key, st->host_lens, bytes);
    int rc = mt_memcpy_async(m->backend, st->plens, st->plens_key, bytes, MT_MEMCPY_HOST_TO_DEVICE,
                             m->cfg.stream);
    if (rc == 0)
        rc = mt_stream_synchronize(m->backend, m->cfg.stream);
    if (rc == 0)
        st->plens_n = st->B;
    return rc;
}

/* The lengths of the described shape on the device. */
const int32_t *mt__dnn_lengths(const cudnn_state_t *st)
{
    if (st->packed)
        return st->plens;
    return st->lens + (size_t)(st->T - 1) * (size_t)st->lens_B;
}

/* Everything a compute call needs for io's shape. A size query that failed earlier is not
 * returned here: the shape is described afresh, and mt__dnn_covers() catches the pass whose
 * buffers were sized by the failed query. */
int mt__dnn_prepare(mt_rnn_t *m, const mt_rnn_io_t *io)
{
    int rc = set_shape(m, io);
    if (rc == 0)
        rc = device_lengths(m, S(m));
    return rc;
}

/* The buffer at p (an allocator block, or a place inside one) has at least need bytes from
 * p on. A pointer the allocator does not know cannot be measured and passes. Short: the
 * error of the failed size query that sized it (logged then), else MT_EINVAL. */
int mt__dnn_covers(const mt_rnn_t *m, const void *p, size_t need, const char *what)
{
    cudnn_state_t *st = S(m);
    void *base = NULL;
    size_t size = 0;
    int tag;
    if (need == 0 || (p && mt_alloc_block_info(m->alloc, p, &base, &size, &tag) != 0))
        return 0;
    size_t have = p ? size - (size_t)((const char *)p - (const char *)base) : 0;
    if (have >= need)
        return 0;
    plog(m, MT_LOG_ERROR, "rnn: cudnn: the %s has %zu bytes, cuDNN needs %zu for this shape%s",
         what, have, need, st->size_err ? " (its size query failed)" : "");
    return st->size_err ? st->size_err : MT_EINVAL;
}
