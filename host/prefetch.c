/* The batch prefetcher (U3): `depth` device batch buffers fed host -> device on a side
 * stream while the compute stream works on an earlier batch.
 *
 * Ordering, with events only (nothing waits for the whole device or a whole stream):
 *   submit k:  [copy stream] wait released(slot)  -- the consumer is done with batch k-depth
 *              record copy_start; copy staging -> slot buffer; record copy_done
 *   next k:    [compute stream] wait copy_done(slot) -- batch k is never read early
 *   release k: [compute stream] record released(slot)
 * Staging: each submit takes a fresh pinned block from the host cache, fills it on the CPU,
 * records the copy stream as its user and frees it at once; the host cache hands it out
 * again only after the copy has read it. So the host never waits for a copy either, and
 * the cache holds as many staging blocks as copies are in flight. */
#include <stdlib.h>
#include <string.h>

#include "memtrace/host.h"

typedef enum slot_state_e {
    SLOT_FREE = 0,   /* may take the next submission */
    SLOT_QUEUED = 1, /* copy queued, not yet handed out */
    SLOT_HELD = 2,   /* handed out by next, not yet released */
} slot_state_e;

/* One device batch buffer.
 * Invariants: state = FREE => the compute stream's last use of buf (if any) is captured
 * by `released` (was_released); index is the last batch submitted into it. */
typedef struct slot_s {
    void *buf;              /* device, batch_bytes, tag MT_TAG_BATCH */
    mt_event_t *copy_start; /* copy stream reached the copy of `index` */
    mt_event_t *copy_done;  /* ... and finished it */
    mt_event_t *released;   /* compute stream finished with the previous batch in buf */
    uint64_t index;
    size_t bytes;
    int state;         /* slot_state_e */
    bool was_released; /* released has been recorded at least once */
} slot_t;

/* Invariants: next_out <= next_submit <= next_out + depth; batch k lives in slot
 * k % depth; slots of batches in [next_out, next_submit) are QUEUED. */
struct mt_prefetch_s {
    mt_prefetch_cfg_t cfg;
    mt_backend_t *b;   /* the device allocator's backend, borrowed */
    mt_stream_t *copy; /* owned side stream; = cfg.compute without overlap */
    bool own_copy;
    slot_t *slots; /* depth */
    uint64_t next_submit;
    uint64_t next_out;
    mt_prefetch_stats_t st;
};

mt_prefetch_cfg_t mt_prefetch_cfg_default(void)
{
    mt_prefetch_cfg_t c;
    memset(&c, 0, sizeof c);
    c.depth = 2;
    c.overlap = true;
    return c;
}

static void slots_free(mt_prefetch_t *p)
{
    for (unsigned i = 0; i < p->cfg.depth; i++) {
        slot_t *s = &p->slots[i];
        if (s->buf != NULL)
            (void)mt_alloc_free(p->cfg.alloc, s->buf);
        mt_event_destroy(p->b, &s->copy_start);
        mt_event_destroy(p->b, &s->copy_done);
        mt_event_destroy(p->b, &s->released);
    }
    free(p->slots);
}

int mt_prefetch_create(mt_prefetch_t **out, const mt_prefetch_cfg_t *cfg)
{
    if (out == NULL || cfg == NULL || cfg->alloc == NULL || cfg->host == NULL ||
        cfg->batch_bytes == 0 || cfg->depth < 2)
        return MT_EINVAL;
    *out = NULL;
    mt_prefetch_t *p = calloc(1, sizeof *p);
    if (p == NULL)
        return MT_ENOMEM;
    p->cfg = *cfg;
    p->b = mt_alloc_backend(cfg->alloc);
    if (mt_host_cache_device(cfg->host) != p->b) {
        free(p);
        return MT_EINVAL; /* staging must be pinned for the device that copies */
    }
    int rc = 0;
    p->copy = cfg->compute;
    if (cfg->overlap) {
        rc = mt_stream_create(p->b, &p->copy);
        if (rc != 0)
            goto fail;
        p->own_copy = true;
    }
    p->slots = calloc(cfg->depth, sizeof *p->slots);
    if (p->slots == NULL) {
        rc = MT_ENOMEM;
        goto fail;
    }
    for (unsigned i = 0; i < cfg->depth; i++) {
        slot_t *s = &p->slots[i];
        rc = mt_alloc_malloc(cfg->alloc, cfg->batch_bytes, cfg->compute, MT_TAG_BATCH, &s->buf);
        if (rc == 0 && p->copy != cfg->compute)
            rc = mt_alloc_record_stream(cfg->alloc, s->buf, p->copy);
        if (rc == 0)
            rc = mt_event_create(p->b, &s->copy_start);
        if (rc == 0)
            rc = mt_event_create(p->b, &s->copy_done);
        if (rc == 0)
            rc = mt_event_create(p->b, &s->released);
        if (rc != 0)
            goto fail;
    }
    *out = p;
    return 0;
fail:
    if (p->slots != NULL)
        slots_free(p);
    if (p->own_copy)
        mt_stream_destroy(p->b, &p->copy);
    free(p);
    return rc;
}

void mt_prefetch_destroy(mt_prefetch_t **pp)
{
    if (pp == NULL || *pp == NULL)
        return;
    mt_prefetch_t *p = *pp;
    /* The buffers' frees record events on the copy stream (record_stream), so the device
     * allocator reuses them only after the queued copies; only the side stream we own is
     * drained, to destroy it. */
    slots_free(p);
    if (p->own_copy)
        mt_stream_destroy(p->b, &p->copy);
    free(p);
    *pp = NULL;
}

/* Queues the copy of staging (pinned, bytes) into the next slot; takes the staging block
 * (it is freed here, reused by the host cache only once the copy has read it). */
static int enqueue_copy(mt_prefetch_t *p, slot_t *s, void *staging, size_t bytes)
{
    int rc = mt_host_record_stream(p->cfg.host, staging, p->copy);
    if (rc == 0 && s->was_released && p->copy != p->cfg.compute)
        rc = mt_stream_wait_event(p->b, p->copy, s->released);
    if (rc == 0)
        rc = mt_event_record(p->b, s->copy_start, p->copy);
    if (rc == 0)
        rc = mt_memcpy_async(p->b, s->buf, staging, bytes, MT_MEMCPY_HOST_TO_DEVICE, p->copy);
    if (rc == 0)
        rc = mt_event_record(p->b, s->copy_done, p->copy);
    (void)mt_host_free(p->cfg.host, staging);
    if (rc != 0)
        return rc;
    s->index = p->next_submit++;
    s->bytes = bytes;
    s->state = SLOT_QUEUED;
    p->st.submitted++;
    p->st.bytes_copied += bytes;
    return 0;
}

static int next_free_slot(mt_prefetch_t *p, size_t bytes, slot_t **out)
{
    if (bytes == 0 || bytes > p->cfg.batch_bytes)
        return MT_EINVAL;
    slot_t *s = &p->slots[p->next_submit % p->cfg.depth];
    if (s->state != SLOT_FREE)
        return MT_EBUSY;
    *out = s;
    return 0;
}

int mt_prefetch_submit_fill(mt_prefetch_t *p, size_t bytes, mt_prefetch_fill_fn fill, void *ud)
{
    if (p == NULL || fill == NULL)
        return MT_EINVAL;
    slot_t *s = NULL;
    int rc = next_free_slot(p, bytes, &s);
    if (rc != 0)
        return rc;
    void *staging = NULL;
    rc = mt_host_malloc(p->cfg.host, bytes, MT_TAG_BATCH, &staging);
    if (rc != 0)
        return rc;
    rc = fill(ud, p->next_submit, staging, bytes);
    if (rc != 0) {
        (void)mt_host_free(p->cfg.host, staging);
        return rc;
    }
    return enqueue_copy(p, s, staging, bytes);
}

static int fill_from(void *ud, uint64_t index, void *dst, size_t bytes)
{
    (void)index;
    memcpy(dst, ud, bytes);
    return 0;
}

int mt_prefetch_submit(mt_prefetch_t *p, const void *src, size_t bytes)
{
    if (p == NULL || src == NULL)
        return MT_EINVAL;
    return mt_prefetch_submit_fill(p, bytes, fill_from, (void *)src);
}

int mt_prefetch_next(mt_prefetch_t *p, mt_prefetch_batch_t *out)
{
    if (p == NULL || out == NULL)
        return MT_EINVAL;
    if (p->next_out == p->next_submit)
        return MT_ENOENT;
    unsigned i = (unsigned)(p->next_out % p->cfg.depth);
    slot_t *s = &p->slots[i];
    if (p->copy != p->cfg.compute) {
        int rc = mt_stream_wait_event(p->b, p->cfg.compute, s->copy_done);
        if (rc != 0)
            return rc;
    }
    s->state = SLOT_HELD;
    p->next_out++;
    *out = (mt_prefetch_batch_t){.index = s->index, .data = s->buf, .bytes = s->bytes, .slot = i};
    return 0;
}

int mt_prefetch_wait(mt_prefetch_t *p, const mt_prefetch_batch_t *b)
{
    if (p == NULL || b == NULL || b->slot >= p->cfg.depth)
        return MT_EINVAL;
    slot_t *s = &p->slots[b->slot];
    if (s->state != SLOT_HELD || s->index != b->index)
        return MT_ENOENT;
    return mt_event_synchronize(p->b, s->copy_done);
}

int mt_prefetch_release(mt_prefetch_t *p, const mt_prefetch_batch_t *b)
{
    if (p == NULL || b == NULL || b->slot >= p->cfg.depth)
        return MT_EINVAL;
    slot_t *s = &p->slots[b->slot];
    if (s->state != SLOT_HELD || s->index != b->index)
        return MT_ENOENT;
    int rc = mt_event_record(p->b, s->released, p->cfg.compute);
    if (rc != 0)
        return rc;
    s->was_released = true;
    s->state = SLOT_FREE;
    p->st.consumed++;
    return 0;
}

int mt_prefetch_slice(const mt_prefetch_batch_t *b, size_t offset, size_t bytes, void **out)
{
    if (b == NULL || out == NULL || offset > b->bytes || bytes > b->bytes - offset)
        return MT_EINVAL;
    *out = (char *)b->data + offset;
    return 0;
}

int mt_prefetch_copy_times(mt_prefetch_t *p, uint64_t index, uint64_t *start_ns, uint64_t *end_ns)
{
    if (p == NULL || start_ns == NULL || end_ns == NULL)
        return MT_EINVAL;
    if (index >= p->next_submit)
        return MT_ENOENT;
    slot_t *s = &p->slots[index % p->cfg.depth];
    if (s->index != index)
        return MT_ENOENT;
    if (mt_event_query(p->b, s->copy_done) != 0)
        return MT_EAGAIN;
    *start_ns = mt_event_time_ns(p->b, s->copy_start);
    *end_ns = mt_event_time_ns(p->b, s->copy_done);
    return 0;
}

mt_stream_t *mt_prefetch_copy_stream(const mt_prefetch_t *p)
{
    return p ? p->copy : NULL;
}

void mt_prefetch_stats(const mt_prefetch_t *p, mt_prefetch_stats_t *out)
{
    if (p != NULL && out != NULL)
        *out = p->st;
}
