/* Activation offload (U4): a training pass in chunks of time steps that keeps only a window
 * of chunks' reserves on the device and parks the others in pinned host memory.
 *
 * Built on the engine's own entry points: each chunk is one mt_rnn_forward(training) over
 * its steps, with the states carried from the previous chunk (kept, they are that chunk's
 * hx/cx for backward), and backward runs the chunks last to first with dhy/dcy carried from
 * the later chunk's dhx/dcx. Only the reserve's device block changes hands: it is copied out
 * and freed, later reallocated (tag activations) and copied back, so the engine's backward
 * sees the same bytes at a new address; offloading therefore never changes a result.
 *
 * Ordering: copies run on a side stream. Out: the side stream waits for the module
 * stream's point after the chunk's forward, copies, records out_done; the device block is
 * freed only after out_done (a host wait on that one event, issued a whole chunk of compute
 * after the copy was queued). In: the block is reallocated, the side stream waits for the
 * module stream's current point (a GPU path may still use the memory's previous owner),
 * copies, records in_done; before that chunk's backward the module stream waits on in_done,
 * and the host does too because the CPU path computes on the calling thread. */
#include <stdlib.h>
#include <string.h>

#include "memtrace/host.h"
#include "rnn/internal.h"

typedef enum where_e {
    ON_DEVICE = 0,   /* reserve->space valid, no copy pending */
    COPYING_OUT = 1, /* space valid, copy to host queued (out_done) */
    ON_HOST = 2,     /* only host valid */
    COPYING_IN = 3,  /* space reallocated, copy from host queued (in_done) */
    GONE = 4,        /* backward ran (or nothing to keep) */
} where_e;

/* One chunk of the sequence.
 * Invariants: where = ON_HOST => res->space = NULL and host holds res->bytes bytes;
 * where in {ON_DEVICE, COPYING_OUT, COPYING_IN} => res->space is a device block of
 * res->bytes counted in the pass's dev_bytes. */
typedef struct chunk_s {
    int t0, steps;
    mt_rnn_reserve_t *res;
    float *hy, *cy; /* device states after this chunk (not for the last chunk) */
    void *host;     /* pinned copy, or NULL */
    mt_event_t *ev; /* out_done or in_done, by where */
    int where;
} chunk_t;

struct mt_rnn_offload_s {
    mt_rnn_t *m;
    mt_rnn_offload_cfg_t cfg;
    mt_rnn_io_t io;
    mt_stream_t *side; /* owned */
    mt_event_t *mark;  /* scratch: a point of the module stream */
    chunk_t *ch;
    int n;
    size_t state_bytes; /* one chunk's carried states */
    size_t dev_bytes;   /* activation bytes on the device now */
    mt_rnn_offload_stats_t st;
};

mt_rnn_offload_cfg_t mt_rnn_offload_cfg_default(void)
{
    mt_rnn_offload_cfg_t c;
    memset(&c, 0, sizeof c);
    c.chunk_steps = 16;
    c.window_chunks = 2;
    return c;
}

static void dev_add(mt_rnn_offload_t *p, size_t bytes)
{
    p->dev_bytes += bytes;
    if (p->dev_bytes > p->st.peak_device_bytes)
        p->st.peak_device_bytes = p->dev_bytes;
}

static size_t res_bytes(const chunk_t *c)
{
    return (c->res != NULL && c->res->space != NULL) ? c->res->bytes : 0;
}

/* Queues the copy of chunk c's reserve to pinned host memory. */
static int queue_out(mt_rnn_offload_t *p, chunk_t *c)
{
    if (c->where != ON_DEVICE || res_bytes(c) == 0)
        return 0;
    mt_backend_t *b = p->m->backend;
    size_t n = c->res->bytes;
    int rc = mt_host_malloc(p->cfg.host, n, MT_TAG_ACTIVATIONS, &c->host);
    if (rc == 0)
        rc = mt_host_record_stream(p->cfg.host, c->host, p->side);
    /* If the pass is released with the copy in flight, the block must not be reused before
     * the side stream has read it. */
    if (rc == 0)
        rc = mt_alloc_record_stream(p->m->alloc, c->res->space, p->side);
    if (rc == 0)
        rc = mt_event_record(b, p->mark, p->m->cfg.stream);
    if (rc == 0)
        rc = mt_stream_wait_event(b, p->side, p->mark);
    if (rc == 0)
        rc = mt_memcpy_async(b, c->host, c->res->space, n, MT_MEMCPY_DEVICE_TO_HOST, p->side);
    if (rc == 0)
        rc = mt_event_record(b, c->ev, p->side);
    if (rc != 0) {
        /* Nothing was handed to the side stream that matters: keep the chunk on device. */
        (void)mt_stream_synchronize(b, p->side);
        (void)mt_host_free(p->cfg.host, c->host);
        c->host = NULL;
        return rc;
    }
    c->where = COPYING_OUT;
    p->st.offloads++;
    p->st.bytes_out += n;
    return 0;
}

/* Frees chunk c's device reserve once its copy to the host has completed. */
static int drop_device(mt_rnn_offload_t *p, chunk_t *c)
{
    if (c->where == ON_DEVICE) {
        int rc = queue_out(p, c);
        if (rc != 0)
            return rc;
    }
    if (c->where != COPYING_OUT)
        return 0;
    int rc = mt_event_synchronize(p->m->backend, c->ev);
    if (rc != 0)
        return rc;
    p->dev_bytes -= c->res->bytes;
    (void)mt_alloc_free(p->m->alloc, c->res->space);
    c->res->space = NULL;
    c->where = ON_HOST;
    return 0;
}

/* Reallocates chunk c's reserve and queues its copy back from the host. */
static int queue_in(mt_rnn_offload_t *p, chunk_t *c)
{
    if (c->where != ON_HOST)
        return 0;
    mt_backend_t *b = p->m->backend;
    size_t n = c->res->bytes;
    void *d = NULL;
    int rc = mt_alloc_malloc(p->m->alloc, n, p->m->cfg.stream, MT_TAG_ACTIVATIONS, &d);
    if (rc == 0)
        rc = mt_alloc_record_stream(p->m->alloc, d, p->side);
    if (rc == 0)
        rc = mt_event_record(b, p->mark, p->m->cfg.stream);
    if (rc == 0)
        rc = mt_stream_wait_event(b, p->side, p->mark);
    if (rc == 0)
        rc = mt_memcpy_async(b, d, c->host, n, MT_MEMCPY_HOST_TO_DEVICE, p->side);
    if (rc == 0)
        rc = mt_event_record(b, c->ev, p->side);
    if (rc != 0) {
        (void)mt_stream_synchronize(b, p->side);
        (void)mt_alloc_free(p->m->alloc, d);
        return rc;
    }
    /* The host cache reuses the pinned block only after the copy has read it. */
    (void)mt_host_free(p->cfg.host, c->host);
    c->host = NULL;
    c->res->space = d;
    c->where = COPYING_IN;
    dev_add(p, n);
    p->st.restores++;
    p->st.bytes_in += n;
    return 0;
}

/* Makes chunk c's reserve usable by its backward. */
static int ensure_device(mt_rnn_offload_t *p, chunk_t *c)
{
    int rc = 0;
    if (c->where == ON_HOST)
        rc = queue_in(p, c);
    if (rc == 0 && c->where == COPYING_IN) {
        rc = mt_stream_wait_event(p->m->backend, p->m->cfg.stream, c->ev);
        if (rc == 0)
            rc = mt_event_synchronize(p->m->backend, c->ev);
        if (rc == 0)
            c->where = ON_DEVICE;
    }
    if (rc == 0 && c->where == COPYING_OUT)
        c->where = ON_DEVICE; /* the host copy is simply not used */
    return rc;
}

static void pass_free(mt_rnn_offload_t *p)
{
    mt_backend_t *b = p->m->backend;
    for (int i = 0; i < p->n; i++) {
        chunk_t *c = &p->ch[i];
        if (c->res != NULL) {
            if (c->res->space != NULL && c->where != GONE)
                p->dev_bytes -= c->res->bytes;
            mt_rnn_reserve_release(p->m, &c->res);
        }
        if (c->host != NULL)
            (void)mt_host_free(p->cfg.host, c->host);
        if (c->hy != NULL)
            (void)mt_alloc_free(p->m->alloc, c->hy);
        if (c->cy != NULL)
            (void)mt_alloc_free(p->m->alloc, c->cy);
        mt_event_destroy(b, &c->ev);
    }
    free(p->ch);
    /* Destroying the side stream drains the copies still queued on it. */
    mt_stream_destroy(b, &p->side);
    mt_event_destroy(b, &p->mark);
    free(p);
}

void mt_rnn_offload_release(mt_rnn_t *m, mt_rnn_offload_t **pass)
{
    if (m == NULL || pass == NULL || *pass == NULL)
        return;
    pass_free(*pass);
    *pass = NULL;
}

static int pass_new(mt_rnn_t *m, const mt_rnn_offload_cfg_t *cfg, const mt_rnn_io_t *io,
                    mt_rnn_offload_t **out)
{
    mt_rnn_offload_t *p = calloc(1, sizeof *p);
    if (p == NULL)
        return MT_ENOMEM;
    p->m = m;
    p->cfg = *cfg;
    p->io = *io;
    p->n = (io->seq_len + cfg->chunk_steps - 1) / cfg->chunk_steps;
    p->st.chunks = (unsigned)p->n;
    const mt__rnn_shape_t *s = &m->shape;
    size_t st = (size_t)s->layers * (size_t)io->batch * (size_t)s->hidden * sizeof(float);
    p->state_bytes = s->mode == MT_RNN_LSTM ? 2 * st : st;
    mt_rnn_act_t act;
    if (mt_rnn_activation_bytes(m, io->seq_len, io->batch, &act) == 0)
        p->st.full_reserve_bytes = act.reserve_bytes;
    int rc = MT_ENOMEM;
    p->ch = calloc((size_t)p->n, sizeof *p->ch);
    if (p->ch == NULL)
        goto fail;
    rc = mt_stream_create(m->backend, &p->side);
    if (rc == 0)
        rc = mt_event_create(m->backend, &p->mark);
    for (int i = 0; rc == 0 && i < p->n; i++) {
        chunk_t *c = &p->ch[i];
        c->t0 = i * cfg->chunk_steps;
        c->steps = io->seq_len - c->t0 < cfg->chunk_steps ? io->seq_len - c->t0 : cfg->chunk_steps;
        c->where = GONE;
        rc = mt_event_create(m->backend, &c->ev);
    }
    if (rc != 0)
        goto fail;
    *out = p;
    return 0;
fail:
    if (p->ch == NULL) {
        free(p);
        return rc;
    }
    pass_free(p);
    return rc;
}

/* The engine's forward of chunk i, carrying the states of chunk i-1. */
static int chunk_forward(mt_rnn_offload_t *p, int i)
{
    mt_rnn_t *m = p->m;
    const mt__rnn_shape_t *s = &m->shape;
    chunk_t *c = &p->ch[i];
    bool last = i == p->n - 1;
    bool lstm = s->mode == MT_RNN_LSTM;
    size_t B = (size_t)p->io.batch, t0 = (size_t)c->t0;
    if (!last) {
        size_t one = lstm ? p->state_bytes / 2 : p->state_bytes;
        int rc = mt_alloc_malloc(m->alloc, one, m->cfg.stream, MT_TAG_ACTIVATIONS, (void **)&c->hy);
        if (rc == 0 && lstm)
            rc = mt_alloc_malloc(m->alloc, one, m->cfg.stream, MT_TAG_ACTIVATIONS, (void **)&c->cy);
        if (rc != 0)
            return rc;
        dev_add(p, p->state_bytes);
    }
    mt_rnn_io_t io = {
        .seq_len = c->steps,
        .batch = p->io.batch,
        .x = p->io.x + t0 * B * (size_t)s->input,
        .y = p->io.y + t0 * B * (size_t)s->hidden,
        .hx = i == 0 ? p->io.hx : p->ch[i - 1].hy,
        .cx = !lstm    ? NULL
              : i == 0 ? p->io.cx
                       : p->ch[i - 1].cy,
        .hy = last ? p->io.hy : c->hy,
        .cy = !lstm  ? NULL
              : last ? p->io.cy
                     : c->cy,
    };
    int rc = mt_rnn_forward(m, &io, &c->res);
    if (rc != 0)
        return rc;
    c->where = ON_DEVICE;
    dev_add(p, res_bytes(c));
    return 0;
}

int mt_rnn_offload_forward(mt_rnn_t *m, const mt_rnn_offload_cfg_t *cfg, const mt_rnn_io_t *io,
                           mt_rnn_offload_t **pass)
{
    if (pass != NULL)
        *pass = NULL;
    if (m == NULL || cfg == NULL || io == NULL || pass == NULL || cfg->host == NULL ||
        cfg->chunk_steps < 1 || cfg->window_chunks < 1 || io->seq_len < 1 || io->batch < 1 ||
        io->x == NULL || io->y == NULL)
        return MT_EINVAL;
    if (m->shape.dirs != 1)
        return MT_ENOTSUP; /* the reverse direction needs the whole sequence at once */
    if (mt_host_cache_device(cfg->host) != m->backend)
        return MT_EINVAL;
    mt_rnn_offload_t *p = NULL;
    int rc = pass_new(m, cfg, io, &p);
    if (rc != 0)
        return rc;
    int w = cfg->window_chunks;
    for (int i = 0; i < p->n && rc == 0; i++) {
        /* Room for chunk i: the chunk leaving the window goes (its copy was queued while
         * chunk i-1 computed). */
        if (i - w >= 0)
            rc = drop_device(p, &p->ch[i - w]);
        /* The next one to leave starts its copy now, overlapping this chunk's compute. */
        if (rc == 0 && i + 1 < p->n && i + 1 - w >= 0 && i + 1 - w < i)
            rc = queue_out(p, &p->ch[i + 1 - w]);
        if (rc == 0)
            rc = chunk_forward(p, i);
    }
    if (rc != 0) {
        pass_free(p);
        return rc;
    }
    *pass = p;
    return 0;
}

/* The highest chunk below i whose reserve is only on the host (the next one backward will
 * need that is not on the device), or -1. */
static int next_needed(const mt_rnn_offload_t *p, int i)
{
    for (int j = i - 1; j >= 0; j--)
        if (p->ch[j].where == ON_HOST)
            return j;
    return -1;
}

static int resident_chunks(const mt_rnn_offload_t *p)
{
    int r = 0;
    for (int j = 0; j < p->n; j++)
        r += p->ch[j].where == ON_DEVICE || p->ch[j].where == COPYING_IN ||
             p->ch[j].where == COPYING_OUT;
    return r;
}

int mt_rnn_offload_backward(mt_rnn_t *m, mt_rnn_offload_t **pass, const mt_rnn_grad_io_t *g,
                            mt_rnn_offload_stats_t *stats)
{
    if (m == NULL || pass == NULL || *pass == NULL)
        return MT_EINVAL;
    mt_rnn_offload_t *p = *pass;
    *pass = NULL;
    if (p->m != m || g == NULL || g->dy == NULL) {
        pass_free(p);
        return MT_EINVAL;
    }
    const mt__rnn_shape_t *s = &m->shape;
    bool lstm = s->mode == MT_RNN_LSTM;
    size_t B = (size_t)p->io.batch;
    /* dhx/dcx of chunk i become dhy/dcy of chunk i-1: two buffers each, alternating. */
    float *dh[2] = {NULL, NULL}, *dc[2] = {NULL, NULL};
    size_t one = lstm ? p->state_bytes / 2 : p->state_bytes;
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0 && p->n > 1; k++) {
        rc = mt_alloc_malloc(m->alloc, one, m->cfg.stream, MT_TAG_WORKSPACE, (void **)&dh[k]);
        if (rc == 0 && lstm)
            rc = mt_alloc_malloc(m->alloc, one, m->cfg.stream, MT_TAG_WORKSPACE, (void **)&dc[k]);
    }
    for (int i = p->n - 1; i >= 0 && rc == 0; i--) {
        chunk_t *c = &p->ch[i];
        rc = ensure_device(p, c);
        /* Bring the next chunk needed back while this one computes, within the window. */
        int q = next_needed(p, i);
        if (rc == 0 && q >= 0 && resident_chunks(p) < p->cfg.window_chunks)
            rc = queue_in(p, &p->ch[q]);
        if (rc != 0)
            break;
        size_t t0 = (size_t)c->t0;
        int cur = i & 1, nxt = (i + 1) & 1;
        mt_rnn_grad_io_t gi = {
            .dy = g->dy + t0 * B * (size_t)s->hidden,
            .dhy = i == p->n - 1 ? g->dhy : dh[nxt],
            .dcy = !lstm           ? NULL
                   : i == p->n - 1 ? g->dcy
                                   : dc[nxt],
            .dx = g->dx ? g->dx + t0 * B * (size_t)s->input : NULL,
            .dhx = i == 0 ? g->dhx : dh[cur],
            .dcx = !lstm    ? NULL
                   : i == 0 ? g->dcx
                            : dc[cur],
        };
        size_t held = res_bytes(c);
        rc = mt_rnn_backward(m, &c->res, &gi); /* frees the reserve */
        c->where = GONE;
        p->dev_bytes -= held;
    }
    for (int k = 0; k < 2; k++) {
        (void)mt_alloc_free(m->alloc, dh[k]);
        (void)mt_alloc_free(m->alloc, dc[k]);
    }
    if (stats != NULL)
        *stats = p->st;
    pass_free(p);
    return rc;
}
