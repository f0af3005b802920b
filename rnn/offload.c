/* The cpu path's training reserve as one allocator block per chunk of time steps, and
 * activation offload: with the module's window W > 0, chunks older than the window go to
 * pinned host memory during forward and come back ahead of need during backward.
 *
 * The kernels compute the same way whatever holds a chunk (internal.h: they always work in
 * chunks), and a chunk brought back holds the same bytes at a new address, so an offloaded
 * pass is bit-identical to a plain one.
 *
 * Ordering: copies run on the module's side stream. Out: the side stream waits for the
 * module stream's point after the chunk's forward, copies, records the chunk's event; the
 * device block is freed only after that event (a host wait on that one event, queued a whole
 * chunk of compute earlier when W >= 2), and it is recorded on the side stream so a pass
 * released mid-copy cannot have its block reused early. In: the block is reallocated, the
 * side stream waits for the module stream's current point (a GPU path may still use the
 * memory's previous owner), copies, records the event; before the chunk is read the module
 * stream waits on it, and the host does too because the CPU path computes on the calling
 * thread. Pinned blocks are recorded on the side stream, so the host cache reuses one only
 * after the copies that read or wrote it. */
#include <stdlib.h>
#include <string.h>

#include "memtrace/host.h"
#include "rnn/internal.h"

typedef enum where_e {
    EMPTY = 0,       /* not written yet, or done with */
    ON_DEVICE = 1,   /* dev valid, no copy pending */
    COPYING_OUT = 2, /* dev valid, copy to host queued (ev) */
    ON_HOST = 3,     /* only host valid */
    COPYING_IN = 4,  /* dev reallocated, copy from host queued (ev) */
} where_e;

/* One chunk's reserve.
 * Invariants: where = ON_HOST => dev = NULL and host holds bytes bytes; where in
 * {ON_DEVICE, COPYING_OUT, COPYING_IN} => dev is a device block of bytes (NULL iff
 * bytes = 0) counted in the store's dev_bytes; where = EMPTY => dev = NULL, host = NULL. */
typedef struct chunk_s {
    size_t bytes;
    float *dev;
    void *host;     /* pinned copy, or NULL */
    mt_event_t *ev; /* the pending copy's completion (offloading stores only) */
    int where;
} chunk_t;

struct mt__rnn_store_s {
    mt_rnn_t *m;
    int n;                 /* chunks */
    int window;            /* chunks kept on the device in forward; 0 = all */
    mt_host_cache_t *host; /* borrowed when window > 0 */
    chunk_t *ch;
    size_t dev_bytes; /* reserve bytes on the device now */
};

int mt__rnn_offload_check(const mt_rnn_t *m, mt_host_cache_t *host, int window)
{
    if (window < 0)
        return MT_EINVAL;
    if (window == 0)
        return 0;
    if (m->shape.dirs != 1 || !m->path->reserve_new)
        return MT_ENOTSUP; /* the reverse direction needs the whole layer below at once */
    if (!host || mt_host_cache_device(host) != m->backend)
        return MT_EINVAL;
    return 0;
}

void mt__rnn_offload_fini(mt_rnn_t *m)
{
    /* Destroying the side stream drains the copies still queued on it. */
    mt_stream_destroy(m->backend, &m->off_side);
    mt_event_destroy(m->backend, &m->off_mark);
}

static void dev_add(mt__rnn_store_t *st, size_t bytes)
{
    st->dev_bytes += bytes;
    if (st->dev_bytes > st->m->stats.pass_reserve_peak_bytes)
        st->m->stats.pass_reserve_peak_bytes = st->dev_bytes;
}

void mt__rnn_store_free(mt_rnn_t *m, mt__rnn_store_t *st)
{
    if (!st)
        return;
    for (int i = 0; i < st->n; i++) {
        chunk_t *c = &st->ch[i];
        /* Blocks with copies in flight were recorded on the side stream: the allocators
         * hold them back until those copies have run. */
        if (c->dev)
            (void)mt_alloc_free(m->alloc, c->dev);
        if (c->host)
            (void)mt_host_free(st->host, c->host);
        if (c->ev) {
            (void)mt_event_synchronize(m->backend, c->ev);
            mt_event_destroy(m->backend, &c->ev);
        }
    }
    free(st->ch);
    free(st);
}

int mt__rnn_store_new(mt_rnn_t *m, const mt_rnn_io_t *io, mt__rnn_store_t **out)
{
    *out = NULL;
    int window = m->cfg.offload_window;
    int rc = mt__rnn_offload_check(m, m->cfg.offload_host, window);
    if (rc)
        return rc;
    mt__rnn_seq_t q;
    rc = mt__rnn_seq_init(&q, io);
    if (rc)
        return rc;
    mt__rnn_store_t *st = calloc(1, sizeof *st);
    if (!st) {
        mt__rnn_seq_fini(&q);
        return MT_ENOMEM;
    }
    st->m = m;
    st->n = mt__rnn_cpu_nchunks(&m->shape, q.T);
    st->window = window >= st->n ? 0 : window; /* a window holding every chunk moves nothing */
    st->host = m->cfg.offload_host;
    st->ch = calloc((size_t)st->n, sizeof *st->ch);
    if (!st->ch) {
        free(st);
        mt__rnn_seq_fini(&q);
        return MT_ENOMEM;
    }
    if (st->window > 0 && !m->off_side) {
        rc = mt_stream_create(m->backend, &m->off_side);
        if (rc == 0)
            rc = mt_event_create(m->backend, &m->off_mark);
        if (rc)
            mt__rnn_offload_fini(m);
    }
    for (int i = 0; i < st->n && rc == 0; i++) {
        size_t rows = mt__rnn_cpu_chunk_rows(&m->shape, &q, i);
        st->ch[i].bytes = mt__rnn_cpu_chunk_floats(&m->shape, rows) * sizeof(float);
        if (st->window > 0)
            rc = mt_event_create(m->backend, &st->ch[i].ev);
    }
    size_t rows = q.rows;
    mt__rnn_seq_fini(&q);
    if (rc) {
        mt__rnn_store_free(m, st);
        return rc;
    }
    m->stats.pass_reserve_bytes = mt__rnn_cpu_reserve_floats(&m->shape, rows) * sizeof(float);
    m->stats.pass_reserve_peak_bytes = 0;
    *out = st;
    return 0;
}

/* ---- copies ---- */

/* Makes the side stream wait for everything queued on the module's stream so far. */
static int side_after_module(mt__rnn_store_t *st)
{
    mt_rnn_t *m = st->m;
    int rc = mt_event_record(m->backend, m->off_mark, m->cfg.stream);
    if (rc == 0)
        rc = mt_stream_wait_event(m->backend, m->off_side, m->off_mark);
    return rc;
}

/* Queues the copy of chunk c's reserve to pinned host memory. */
static int queue_out(mt__rnn_store_t *st, chunk_t *c)
{
    if (c->where != ON_DEVICE || c->bytes == 0)
        return 0;
    mt_rnn_t *m = st->m;
    int rc = mt_host_malloc(st->host, c->bytes, MT_TAG_ACTIVATIONS, &c->host);
    if (rc == 0)
        rc = mt_host_record_stream(st->host, c->host, m->off_side);
    if (rc == 0)
        rc = mt_alloc_record_stream(m->alloc, c->dev, m->off_side);
    if (rc == 0)
        rc = side_after_module(st);
    if (rc == 0)
        rc = mt_memcpy_async(m->backend, c->host, c->dev, c->bytes, MT_MEMCPY_DEVICE_TO_HOST,
                             m->off_side);
    if (rc == 0)
        rc = mt_event_record(m->backend, c->ev, m->off_side);
    if (rc) {
        /* Keep the chunk on the device; nothing queued reads the host block any more. */
        (void)mt_stream_synchronize(m->backend, m->off_side);
        if (c->host)
            (void)mt_host_free(st->host, c->host);
        c->host = NULL;
        return rc;
    }
    c->where = COPYING_OUT;
    m->stats.offloads++;
    m->stats.offload_bytes += c->bytes;
    return 0;
}

/* Frees chunk c's device block once its copy to the host has completed. */
static int drop_device(mt__rnn_store_t *st, chunk_t *c)
{
    int rc = queue_out(st, c);
    if (rc || c->where != COPYING_OUT)
        return rc;
    rc = mt_event_synchronize(st->m->backend, c->ev);
    if (rc)
        return rc;
    st->dev_bytes -= c->bytes;
    (void)mt_alloc_free(st->m->alloc, c->dev);
    c->dev = NULL;
    c->where = ON_HOST;
    return 0;
}

/* Reallocates chunk c's block and queues its copy back from the host. */
static int queue_in(mt__rnn_store_t *st, chunk_t *c)
{
    if (c->where != ON_HOST)
        return 0;
    mt_rnn_t *m = st->m;
    void *d = NULL;
    int rc = mt_alloc_malloc(m->alloc, c->bytes, m->cfg.stream, MT_TAG_ACTIVATIONS, &d);
    if (rc == 0)
        rc = mt_alloc_record_stream(m->alloc, d, m->off_side);
    if (rc == 0)
        rc = side_after_module(st);
    if (rc == 0)
        rc = mt_memcpy_async(m->backend, d, c->host, c->bytes, MT_MEMCPY_HOST_TO_DEVICE,
                             m->off_side);
    if (rc == 0)
        rc = mt_event_record(m->backend, c->ev, m->off_side);
    if (rc) {
        (void)mt_stream_synchronize(m->backend, m->off_side);
        if (d)
            (void)mt_alloc_free(m->alloc, d);
        return rc;
    }
    /* The host cache hands the pinned block out again only after the copy has read it. */
    (void)mt_host_free(st->host, c->host);
    c->host = NULL;
    c->dev = d;
    c->where = COPYING_IN;
    dev_add(st, c->bytes);
    m->stats.restores++;
    m->stats.restore_bytes += c->bytes;
    return 0;
}

/* Makes chunk c's block readable by the kernels on the calling thread. */
static int ensure_device(mt__rnn_store_t *st, chunk_t *c)
{
    mt_rnn_t *m = st->m;
    int rc = queue_in(st, c);
    if (rc == 0 && c->where == COPYING_IN) {
        rc = mt_stream_wait_event(m->backend, m->cfg.stream, c->ev);
        if (rc == 0)
            rc = mt_event_synchronize(m->backend, c->ev);
        if (rc == 0)
            c->where = ON_DEVICE;
    }
    if (rc == 0 && c->where == COPYING_OUT) {
        /* Still on the device and its host copy is not used, but backward writes the chunk
         * in place: the copy reading it finishes first. */
        rc = mt_event_synchronize(m->backend, c->ev);
        if (rc == 0)
            c->where = ON_DEVICE;
    }
    return rc;
}

static int resident(const mt__rnn_store_t *st)
{
    int r = 0;
    for (int i = 0; i < st->n; i++)
        r += st->ch[i].where == ON_DEVICE || st->ch[i].where == COPYING_OUT ||
             st->ch[i].where == COPYING_IN;
    return r;
}

/* ---- the kernels' callbacks ---- */

static int fwd_get(void *ud, int k, float **out)
{
    mt__rnn_store_t *st = ud;
    chunk_t *c = &st->ch[k];
    int w = st->window, rc = 0;
    *out = NULL;
    if (w > 0) {
        /* Room for chunk k: the chunk leaving the window goes (its copy was queued while
         * chunk k-1 computed); the next one to leave starts its copy now, overlapping this
         * chunk's compute. */
        if (k - w >= 0)
            rc = drop_device(st, &st->ch[k - w]);
        if (rc == 0 && k + 1 < st->n && k + 1 - w >= 0 && k + 1 - w < k)
            rc = queue_out(st, &st->ch[k + 1 - w]);
        if (rc)
            return rc;
    }
    if (c->bytes) {
        rc = mt_alloc_malloc(st->m->alloc, c->bytes, st->m->cfg.stream, MT_TAG_ACTIVATIONS,
                             (void **)&c->dev);
        if (rc)
            return rc;
    }
    c->where = ON_DEVICE;
    dev_add(st, c->bytes);
    *out = c->dev;
    return 0;
}

static int fwd_done(void *ud, int k)
{
    (void)ud;
    (void)k;
    return 0;
}

static int bwd_get(void *ud, int k, float **out)
{
    mt__rnn_store_t *st = ud;
    chunk_t *c = &st->ch[k];
    *out = NULL;
    if (c->where == EMPTY)
        return MT_EINVAL; /* backward of a chunk forward never wrote, or twice */
    int rc = ensure_device(st, c);
    if (rc)
        return rc;
    /* Bring the next chunk backward will need back while this one computes: backward holds
     * the chunk it differentiates and its predecessor, so the window grows by one. */
    if (st->window > 0 && resident(st) < st->window + 1) {
        for (int j = k - 1; j >= 0; j--) {
            if (st->ch[j].where == ON_HOST) {
                rc = queue_in(st, &st->ch[j]);
                break;
            }
        }
    }
    *out = c->dev;
    return rc;
}

static int bwd_done(void *ud, int k)
{
    mt__rnn_store_t *st = ud;
    chunk_t *c = &st->ch[k];
    if (c->where == ON_DEVICE || c->where == COPYING_OUT || c->where == COPYING_IN)
        st->dev_bytes -= c->bytes;
    if (c->dev)
        (void)mt_alloc_free(st->m->alloc, c->dev);
    if (c->host)
        (void)mt_host_free(st->host, c->host);
    c->dev = NULL;
    c->host = NULL;
    c->where = EMPTY;
    return 0;
}

void mt__rnn_store_chunks(mt__rnn_store_t *st, mt__rnn_chunks_t *out)
{
    out->fwd_get = fwd_get;
    out->fwd_done = fwd_done;
    out->bwd_get = bwd_get;
    out->bwd_done = bwd_done;
    out->ud = st;
}
