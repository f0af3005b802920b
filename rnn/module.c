/* The RNN module's passes: forward, backward and step, which take the weights from
 * compaction (params.c), allocate reserve and workspace from the caching allocator with
 * their tags and dispatch to a compute path; the checksums of what backward reads back from
 * the caller; and the module's statistics and activation sizes. */
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "rnn/internal.h"
#include "util/assert.h"

#define rlog(m, level, ...) mt__logf((m)->cfg.log, (m)->cfg.log_ud, level, __VA_ARGS__)

/* ---- compute ---- */

static int check_io(const mt_rnn_t *m, const mt_rnn_io_t *io)
{
    if (!io || io->seq_len < 1 || io->batch < 1 || !io->x || !io->y)
        return MT_EINVAL;
    return mt__rnn_seq_check(io, m->cfg.log, m->cfg.log_ud);
}

/* Rows of x and y. */
static size_t io_rows(const mt_rnn_io_t *io)
{
    return io->batch_sizes ? io->tokens : (size_t)io->seq_len * (size_t)io->batch;
}

/* What backward reads back from the caller, in the order of mt_rnn_reserve_s.sums. */
static const char *const summed_name[4] = {"y", "x", "hx", "cx"};

static void io_summed(const mt_rnn_t *m, const mt_rnn_io_t *io, const float *p[4], size_t n[4])
{
    const mt__rnn_shape_t *s = &m->shape;
    size_t st = (size_t)s->layers * (size_t)s->dirs * (size_t)io->batch * (size_t)s->hidden;
    p[0] = io->y;
    n[0] = io_rows(io) * (size_t)s->dirs * (size_t)s->hidden;
    p[1] = io->x;
    n[1] = io_rows(io) * (size_t)s->input;
    p[2] = io->hx;
    n[2] = io->hx ? st : 0;
    p[3] = s->mode == MT_RNN_LSTM ? io->cx : NULL;
    n[3] = p[3] ? st : 0;
}

static void io_sums(mt_rnn_t *m, const mt_rnn_io_t *io, uint64_t sums[4])
{
    const float *p[4];
    size_t n[4];
    io_summed(m, io, p, n);
    for (int i = 0; i < 4; i++)
        sums[i] = p[i] ? m->path->checksum(m, p[i], n[i]) : 0;
}

/* MT_EINVAL, logged, if something backward reads back changed since forward. */
static int check_sums(mt_rnn_t *m, const mt_rnn_reserve_t *r)
{
    if (!r->summed)
        return 0;
    uint64_t now[4];
    io_sums(m, &r->io, now);
    for (int i = 0; i < 4; i++) {
        if (now[i] != r->sums[i]) {
            rlog(m, MT_LOG_ERROR,
                 "rnn: backward: %s changed since the training forward (its checksum in the "
                 "reserve differs); backward reads the forward's %s back, so its gradients "
                 "would be wrong. Keep it unchanged until backward, or run forward again",
                 summed_name[i], summed_name[i]);
            return MT_EINVAL;
        }
    }
    return 0;
}

/* The path's reserve: its own handle (reserve_new) or one block tagged activations. */
static int reserve_new(mt_rnn_t *m, mt_rnn_reserve_t *r)
{
    r->bytes = m->path->reserve_bytes(m, &r->io);
    if (m->path->reserve_new)
        return m->path->reserve_new(m, &r->io, &r->space);
    return mt__rnn_dmalloc(m, r->bytes, MT_TAG_ACTIVATIONS, &r->space);
}

static void reserve_free(mt_rnn_t *m, mt_rnn_reserve_t *r)
{
    if (m->path->reserve_free)
        m->path->reserve_free(m, r->space);
    else
        mt__rnn_dfree(m, r->space);
    r->space = NULL;
}

static void release(mt_rnn_t *m, mt_rnn_reserve_t *r)
{
    reserve_free(m, r);
    mt__rnn_dfree(m, r->wcopy);
    free(r->batch_sizes);
    free(r);
}

void mt_rnn_reserve_release(mt_rnn_t *m, mt_rnn_reserve_t **reserve)
{
    if (!m || !reserve || !*reserve)
        return;
    release(m, *reserve);
    *reserve = NULL;
}

/* Forward without marks or argument checks; shared by mt_rnn_forward and mt_rnn_step.
 * step_work: a workspace the caller keeps (mt_rnn_step), or NULL to allocate one. */
static int forward(mt_rnn_t *m, const mt_rnn_io_t *io, mt_rnn_reserve_t **reserve, void *step_work)
{
    bool training = reserve != NULL;
    mt_rnn_reserve_t *res = NULL;
    const float *w;
    float *copy;
    void *work = step_work;
    int rc = mt__rnn_weights_for_call(m, &w, &copy);
    if (rc)
        return rc;
    if (training) {
        rc = MT_ENOMEM;
        res = calloc(1, sizeof *res);
        if (!res)
            goto fail_res;
        res->m = m;
        res->io = *io;
        if (io->batch_sizes) {
            /* Backward needs the batch's shape; the caller's array may be gone by then. */
            size_t n = (size_t)io->seq_len * sizeof(int);
            res->batch_sizes = malloc(n);
            if (!res->batch_sizes)
                goto fail_space;
            memcpy(res->batch_sizes, io->batch_sizes, n);
            res->io.batch_sizes = res->batch_sizes;
        }
        rc = reserve_new(m, res);
        if (rc)
            goto fail_space;
    }
    if (!step_work) {
        rc = mt__rnn_dmalloc(m, m->path->fwd_work_bytes(m, io, training), MT_TAG_WORKSPACE, &work);
        if (rc)
            goto fail_work;
    }
    /* A training pass's masks: the key of the module's seed and training-forward count. */
    uint64_t key = training ? mt__rnn_drop_key(m->drop_seed, m->drop_counter) : 0;
    rc = m->path->forward(m, w, io, training, key, res ? res->space : NULL, work);
    if (!step_work)
        mt__rnn_dfree(m, work);
    if (rc)
        goto fail_work;
    m->stats.forwards++;
    if (training) {
        m->drop_counter++;
        res->drop_key = key;
        if (m->path->checksum && (!m->path->checksum_opt_in || m->cfg.check_saved)) {
            io_sums(m, io, res->sums);
            res->summed = true;
        }
        /* The compacted copy lives until backward, which needs the same weights. */
        res->wcopy = copy;
        *reserve = res;
    } else {
        mt__rnn_dfree(m, copy);
    }
    return 0;

fail_work:
    if (res)
        reserve_free(m, res);
fail_space:
    if (res)
        free(res->batch_sizes);
    free(res);
fail_res:
    mt__rnn_dfree(m, copy);
    return rc;
}

int mt_rnn_forward(mt_rnn_t *m, const mt_rnn_io_t *io, mt_rnn_reserve_t **reserve)
{
    if (!m)
        return MT_EINVAL;
    if (reserve)
        *reserve = NULL;
    int rc = check_io(m, io);
    if (rc)
        return rc;
    mt__rnn_mark(m, MT_MARK_FORWARD_BEGIN, (uint64_t)io->seq_len);
    rc = forward(m, io, reserve, NULL);
    mt__rnn_mark(m, MT_MARK_FORWARD_END, (uint64_t)io->seq_len);
    return rc;
}

int mt_rnn_backward(mt_rnn_t *m, mt_rnn_reserve_t **reserve, const mt_rnn_grad_io_t *g)
{
    if (!m || !reserve || !*reserve)
        return MT_EINVAL;
    mt_rnn_reserve_t *res = *reserve;
    *reserve = NULL;
    if (res->m != m || !g || !g->dy) {
        release(res->m, res);
        return MT_EINVAL;
    }
    mt__rnn_mark(m, MT_MARK_BACKWARD_BEGIN, (uint64_t)res->io.seq_len);
    const float *w = res->wcopy;
    float *copy = NULL;
    void *work = NULL;
    int rc = 0;
    if (!w)
        rc = mt__rnn_weights_for_call(m, &w, &copy);
    if (rc == 0)
        rc = check_sums(m, res);
    if (rc == 0)
        rc = mt__rnn_dmalloc(m, m->path->bwd_work_bytes(m, &res->io), MT_TAG_WORKSPACE, &work);
    if (rc == 0) {
        rc = m->path->backward(m, w, m->dw, &res->io, res->drop_key, res->space, g, work);
        m->stats.backwards++;
    }
    mt__rnn_dfree(m, work);
    mt__rnn_dfree(m, copy);
    release(m, res);
    mt__rnn_mark(m, MT_MARK_BACKWARD_END, (uint64_t)0);
    return rc;
}

/* The step workspace, in bytes (docs/rnn-cpu.md, Workspace layouts): the path's forward
 * workspace for one step of batch rows (STEP_WORK), then y [batch, H] (STEP_Y), used when
 * the caller passes none. The path's size may be any byte count (cuDNN's is): y starts on a
 * 256-byte boundary, aligned for floats and vector loads. */
enum { STEP_WORK, STEP_Y, STEP_NREG };

typedef struct step_layout_s {
    mt__rnn_region_t reg[STEP_NREG];
    size_t total; /* bytes */
} step_layout_t;

static step_layout_t step_layout(const mt_rnn_t *m, int batch)
{
    mt_rnn_io_t shape = {.seq_len = 1, .batch = batch};
    step_layout_t y = {.total = 0};
    y.reg[STEP_WORK] = mt__rnn_place(&y.total, m->path->fwd_work_bytes(m, &shape, false), 256);
    y.reg[STEP_Y] =
        mt__rnn_place(&y.total, (size_t)batch * (size_t)m->shape.hidden * sizeof(float), 256);
    mt_assert(mt__rnn_regions_valid(y.reg, STEP_NREG, y.total, 256));
    return y;
}

int mt_rnn_step(mt_rnn_t *m, int batch, const float *x, const float *hx, const float *cx, float *y,
                float *hy, float *cy)
{
    if (!m || batch < 1 || !x || !hy || m->shape.dirs != 1)
        return MT_EINVAL;
    if (hx && hx == hy)
        return MT_EINVAL;
    if (m->shape.mode == MT_RNN_LSTM && (!cy || (cx && cx == cy)))
        return MT_EINVAL;
    /* The step workspace (and y, if the caller passes none) stays with the module between
     * steps: generation makes no allocator call per step, and its memory is that of one
     * step whatever the number of steps. */
    step_layout_t lay = step_layout(m, batch);
    if (lay.total > m->step_ws_bytes) {
        mt__rnn_dfree(m, m->step_ws);
        m->step_ws = NULL;
        m->step_ws_bytes = 0;
        int rc = mt__rnn_dmalloc(m, lay.total, MT_TAG_WORKSPACE, &m->step_ws);
        if (rc)
            return rc;
        m->step_ws_bytes = lay.total;
    }
    if (!y)
        y = (float *)((char *)m->step_ws + lay.reg[STEP_Y].off);
    mt_rnn_io_t io = {
        .seq_len = 1, .batch = batch, .x = x, .y = y, .hx = hx, .cx = cx, .hy = hy, .cy = cy};
    return forward(m, &io, NULL, m->step_ws);
}

/* Frees the step workspace (it is re-made by the next mt_rnn_step). */
int mt_rnn_step_release(mt_rnn_t *m)
{
    if (!m)
        return MT_EINVAL;
    mt__rnn_dfree(m, m->step_ws);
    m->step_ws = NULL;
    m->step_ws_bytes = 0;
    return 0;
}

/* ---- reporting ---- */

int mt_rnn_stats(const mt_rnn_t *m, mt_rnn_stats_t *out)
{
    if (!m || !out)
        return MT_EINVAL;
    *out = m->stats;
    out->flat = m->rebound == 0;
    return 0;
}

int mt_rnn_activation_bytes(const mt_rnn_t *m, int seq_len, int batch, mt_rnn_act_t *out)
{
    if (!m || !out || seq_len < 1 || batch < 1)
        return MT_EINVAL;
    mt__rnn_activation(&m->shape, seq_len, batch, out);
    mt_rnn_io_t io = {.seq_len = seq_len, .batch = batch};
    out->reserve_bytes = m->path->reserve_bytes(m, &io);
    return 0;
}

int mt_rnn_activation_bytes_packed(const mt_rnn_t *m, int seq_len, const int *batch_sizes,
                                   mt_rnn_act_t *out)
{
    if (!m || !out || seq_len < 1 || !batch_sizes)
        return MT_EINVAL;
    mt_rnn_io_t io = {.seq_len = seq_len, .batch = batch_sizes[0], .batch_sizes = batch_sizes};
    for (int t = 0; t < seq_len; t++)
        io.tokens += batch_sizes[t] > 0 ? (size_t)batch_sizes[t] : 0;
    int rc = mt__rnn_seq_check(&io, m->cfg.log, m->cfg.log_ud);
    if (rc)
        return rc;
    mt__rnn_activation(&m->shape, seq_len, io.batch, out);
    out->reserve_bytes = m->path->reserve_bytes(m, &io);
    return 0;
}
