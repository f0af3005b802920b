/* Warm-up: one training step at the largest shape a caller will run, inside the
 * allocator's warm-up, so that later steps within those bounds allocate nothing from the
 * device: the module's blocks and the caller's, when the caller's are among the twelve
 * buffers below at the step's sizes (docs/rnn-cpu.md, Warm-up, says what else holds). */
#include <stdint.h>
#include <stdlib.h>

#include "util/log.h"
#include "rnn/internal.h"

#define rlog(m, level, ...) mt__logf((m)->cfg.log, (m)->cfg.log_ud, level, __VA_ARGS__)

/* ---- warm-up ---- */

/* The warm-up of one training step of shape (max_T, max_B, batch_sizes, tb rows). */
static int warmup(mt_rnn_t *m, int max_T, int max_B, const int *batch_sizes, size_t tb)
{
    const mt__rnn_shape_t *s = &m->shape;
    size_t xin = tb * (size_t)s->input * sizeof(float);
    size_t yout = tb * (size_t)s->dirs * (size_t)s->hidden * sizeof(float);
    size_t st =
        (size_t)s->layers * (size_t)s->dirs * (size_t)max_B * (size_t)s->hidden * sizeof(float);
    /* The buffers a training step at the largest shape holds; states are allocated even
     * if a caller does not use them, so the reservation covers every combination. */
    struct {
        size_t bytes;
        int tag;
        void *p;
    } buf[] = {
        {xin, MT_TAG_BATCH, NULL},        {yout, MT_TAG_ACTIVATIONS, NULL},
        {st, MT_TAG_ACTIVATIONS, NULL},   {st, MT_TAG_ACTIVATIONS, NULL},
        {st, MT_TAG_ACTIVATIONS, NULL},   {st, MT_TAG_ACTIVATIONS, NULL},
        {yout, MT_TAG_ACTIVATIONS, NULL}, {xin, MT_TAG_BATCH, NULL},
        {st, MT_TAG_ACTIVATIONS, NULL},   {st, MT_TAG_ACTIVATIONS, NULL},
        {st, MT_TAG_ACTIVATIONS, NULL},   {st, MT_TAG_ACTIVATIONS, NULL},
    };
    enum { X, Y, HX, CX, HY, CY, DY, DX, DHY, DCY, DHX, DCX, NBUF };
    _Static_assert(sizeof buf / sizeof buf[0] == NBUF, "one buffer per role");

    /* Its training forward does not count: the masks of later passes are those the module
     * would have drawn without the warm-up. The cpu path's masks are a function of the
     * seed and counter, so the counter is put back; cuDNN's generator lives in its states
     * on the device, which its training forward advances: the path keeps a copy of them
     * (outside the allocator's warm-up, whose peak is the step's) and puts it back. */
    uint64_t drop_counter = m->drop_counter;
    int rc = m->path->drop_keep ? m->path->drop_keep(m) : 0;
    if (rc == 0)
        rc = mt_alloc_warmup_begin(m->alloc);
    if (rc) {
        if (m->path->drop_restore)
            m->path->drop_restore(m);
        return rc;
    }
    mt__rnn_mark(m, MT_MARK_WARMUP_BEGIN, tb);
    int i = 0;
    for (; i < NBUF; i++) {
        rc = mt__rnn_dmalloc(m, buf[i].bytes, buf[i].tag, &buf[i].p);
        if (rc)
            break;
        /* Zero inputs make every gradient exactly zero: the grad buffer is unchanged. */
        rc = m->path->zero(m, buf[i].p, buf[i].bytes);
        if (rc) {
            i++;
            break;
        }
    }
    if (rc == 0) {
        mt_rnn_io_t io = {.seq_len = max_T,
                          .batch = max_B,
                          .batch_sizes = batch_sizes,
                          .tokens = batch_sizes ? tb : 0,
                          .x = buf[X].p,
                          .y = buf[Y].p,
                          .hx = buf[HX].p,
                          .cx = buf[CX].p,
                          .hy = buf[HY].p,
                          .cy = buf[CY].p};
        mt_rnn_grad_io_t g = {.dy = buf[DY].p,
                              .dhy = buf[DHY].p,
                              .dcy = buf[DCY].p,
                              .dx = buf[DX].p,
                              .dhx = buf[DHX].p,
                              .dcx = buf[DCX].p};
        mt_rnn_reserve_t *res;
        rc = mt_rnn_forward(m, &io, &res);
        if (rc == 0)
            rc = mt_rnn_backward(m, &res, &g);
    }
    while (i-- > 0)
        mt__rnn_dfree(m, buf[i].p);
    m->drop_counter = drop_counter;
    int rc2 = mt_alloc_warmup_end(m->alloc, m->cfg.stream);
    mt__rnn_mark(m, MT_MARK_WARMUP_END, tb);
    int rc3 = m->path->drop_restore ? m->path->drop_restore(m) : 0;
    if (rc2 == 0)
        rc2 = rc3;
    rlog(m, MT_LOG_INFO, "rnn: warm-up at T=%d, B=%d, %zu tokens done (%s)", max_T, max_B, tb,
         rc ? mt_strerror(rc) : "ok");
    return rc ? rc : rc2;
}

int mt_rnn_warmup(mt_rnn_t *m, int max_T, int max_B)
{
    if (!m || max_T < 1 || max_B < 1)
        return MT_EINVAL;
    return warmup(m, max_T, max_B, NULL, (size_t)max_T * (size_t)max_B);
}

int mt_rnn_warmup_packed(mt_rnn_t *m, size_t max_tokens, int max_batch)
{
    if (!m || max_batch < 1 || max_tokens < (size_t)max_batch) {
        if (m)
            rlog(m, MT_LOG_ERROR,
                 "rnn: packed warm-up: %zu tokens cannot fill a batch of %d sequences of at "
                 "least one step each",
                 max_tokens, max_batch);
        return MT_EINVAL;
    }
    /* Every sequence as long as possible: the first chunks hold the most rows any batch
     * within the bounds can have (C * max_batch, or every token), and the reserve and the
     * whole-batch buffers the most tokens. */
    size_t full = max_tokens / (size_t)max_batch, rest = max_tokens % (size_t)max_batch;
    if (full + (rest > 0) > (size_t)INT32_MAX)
        return MT_EOVERFLOW;
    int T = (int)(full + (rest > 0));
    int *bs = malloc((size_t)T * sizeof *bs);
    if (!bs)
        return MT_ENOMEM;
    for (int t = 0; t < T; t++)
        bs[t] = (size_t)t < full ? max_batch : (int)rest;
    int rc = warmup(m, T, max_batch, bs, max_tokens);
    free(bs);
    return rc;
}
