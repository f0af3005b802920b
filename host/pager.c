/* The parameter pager (U5): per-task float32 parameter sets in pinned host memory, a small
 * device-resident LRU cache of them, gradients accumulated back into host copies.
 *
 * Streams and ownership (who may reuse what, and when):
 *   - device parameter sets are written by the side stream (upload) and read by the compute
 *     stream: allocated on the side stream with the compute stream recorded as a user, so
 *     an evicted set's memory is reused only after the compute stream is done reading it;
 *   - device gradients are written by the compute stream and read by the side stream
 *     (write-back): allocated on the compute stream, side stream recorded;
 *   - pinned staging for a write-back is freed as soon as it is queued; the host cache
 *     reuses it once the side stream has added it into the host gradients.
 * Order: activate makes the compute stream wait on the set's upload event; deactivate makes
 * the side stream wait on a point of the compute stream, copies the gradients back and
 * queues a host function that adds them into the task's host gradient copy. The host only
 * ever waits on one task's event (mt_param_pager_host_wait), never on a stream or device. */
#include <stdlib.h>
#include <string.h>

#include "memtrace/host.h"

/* One task's parameter set.
 * Invariants: dparams != NULL <=> resident; a resident set's upload is captured by ready;
 * host_busy captures the last side-stream operation that reads hparams or writes hgrads. */
typedef struct task_s {
    float *hparams;        /* pinned, nparams */
    float *hgrads;         /* pinned, nparams, accumulated write-backs */
    float *dparams;        /* device copy or NULL */
    mt_event_t *ready;     /* side stream finished uploading dparams */
    mt_event_t *host_busy; /* side stream's last use of hparams/hgrads */
    uint64_t last_used;    /* LRU clock at the last activation or prefetch */
} task_t;

/* Invariants: resident = number of tasks with dparams; resident <= cache_sets;
 * active >= 0 <=> dgrads != NULL, and tasks[active] is resident; the pressure callback
 * never evicts tasks[active] nor tasks[pinned]. */
struct mt_param_pager_s {
    mt_param_pager_cfg_t cfg;
    mt_backend_t *b;
    mt_stream_t *side; /* owned */
    mt_event_t *mark;  /* scratch: a point of the compute stream the side stream waits */
    task_t *tasks;
    float *dgrads; /* device gradients of the active task */
    int active;    /* task index or -1 */
    int pinned;    /* task being activated (resident, not yet active) or -1 */
    bool hooked;   /* the pressure callback is registered with cfg.alloc */
    unsigned resident;
    uint64_t clock;
    mt_param_pager_stats_t st;
};

/* A queued accumulation of staging into a host gradient copy; freed by the host function. */
typedef struct acc_job_s {
    float *dst;
    const float *src;
    size_t n;
} acc_job_t;

static void accumulate_fn(void *ud)
{
    acc_job_t *j = ud;
    for (size_t i = 0; i < j->n; i++)
        j->dst[i] += j->src[i];
    free(j);
}

static size_t set_bytes(const mt_param_pager_t *p)
{
    return p->cfg.nparams * sizeof(float);
}

mt_param_pager_cfg_t mt_param_pager_cfg_default(void)
{
    mt_param_pager_cfg_t c;
    memset(&c, 0, sizeof c);
    c.ntasks = 1;
    c.cache_sets = 2;
    return c;
}

static void evict(mt_param_pager_t *p, task_t *t)
{
    (void)mt_alloc_free(p->cfg.alloc, t->dparams);
    t->dparams = NULL;
    p->resident--;
    p->st.evictions++;
}

/* The least recently used resident set that may be evicted (not active, not being
 * activated), or NULL. */
static task_t *lru_evictable(mt_param_pager_t *p)
{
    task_t *lru = NULL;
    for (unsigned i = 0; i < p->cfg.ntasks; i++) {
        task_t *t = &p->tasks[i];
        if (t->dparams == NULL || (int)i == p->active || (int)i == p->pinned)
            continue;
        if (lru == NULL || t->last_used < lru->last_used)
            lru = t;
    }
    return lru;
}

/* Makes room for one more set by evicting the least recently used one that is not active. */
static int make_room(mt_param_pager_t *p)
{
    while (p->resident >= p->cfg.cache_sets) {
        task_t *lru = lru_evictable(p);
        if (lru == NULL)
            return MT_EBUSY;
        evict(p, lru);
    }
    return 0;
}

/* The allocator's free-memory callback (cfg.release_under_pressure): when a request finds
 * no cached block and the device has less free memory than it asks for, device copies of
 * sets that are not in use go back, least recently used first, until the request would
 * fit. Their blocks return to the allocator's cache, from which its out-of-memory path
 * hands whole segments back to the device. A mere cache miss gives nothing up. */
static bool release_under_pressure(void *ud, mt_alloc_t *a, size_t size, mt_stream_t *stream)
{
    (void)a;
    (void)stream;
    mt_param_pager_t *p = ud;
    size_t free_b = 0, total = 0;
    if (mt_backend_mem_get_info(p->b, &free_b, &total) != 0 || free_b >= size)
        return false;
    bool freed = false;
    for (size_t got = 0; free_b + got < size;) {
        task_t *lru = lru_evictable(p);
        if (lru == NULL)
            break;
        evict(p, lru);
        p->st.pressure_evictions++;
        got += set_bytes(p);
        freed = true;
    }
    return freed;
}

static int upload(mt_param_pager_t *p, task_t *t)
{
    int rc = make_room(p);
    if (rc != 0)
        return rc;
    float *d = NULL;
    rc = mt_alloc_malloc(p->cfg.alloc, set_bytes(p), p->side, MT_TAG_WEIGHTS, (void **)&d);
    if (rc != 0)
        return rc;
    rc = mt_alloc_record_stream(p->cfg.alloc, d, p->cfg.compute);
    if (rc == 0)
        rc = mt_memcpy_async(p->b, d, t->hparams, set_bytes(p), MT_MEMCPY_HOST_TO_DEVICE, p->side);
    if (rc == 0)
        rc = mt_event_record(p->b, t->ready, p->side);
    if (rc == 0)
        rc = mt_event_record(p->b, t->host_busy, p->side);
    if (rc != 0) {
        (void)mt_alloc_free(p->cfg.alloc, d);
        return rc;
    }
    t->dparams = d;
    p->resident++;
    if (p->resident > p->st.max_resident)
        p->st.max_resident = p->resident;
    p->st.uploads++;
    return 0;
}

static void tasks_free(mt_param_pager_t *p)
{
    for (unsigned i = 0; i < p->cfg.ntasks; i++) {
        task_t *t = &p->tasks[i];
        if (t->dparams != NULL)
            (void)mt_alloc_free(p->cfg.alloc, t->dparams);
        (void)mt_host_free(p->cfg.host, t->hparams);
        (void)mt_host_free(p->cfg.host, t->hgrads);
        mt_event_destroy(p->b, &t->ready);
        mt_event_destroy(p->b, &t->host_busy);
    }
    free(p->tasks);
}

int mt_param_pager_create(mt_param_pager_t **out, const mt_param_pager_cfg_t *cfg)
{
    if (out == NULL || cfg == NULL || cfg->alloc == NULL || cfg->host == NULL || cfg->ntasks == 0 ||
        cfg->nparams == 0 || cfg->cache_sets == 0 || cfg->nparams > SIZE_MAX / sizeof(float))
        return MT_EINVAL;
    *out = NULL;
    mt_param_pager_t *p = calloc(1, sizeof *p);
    if (p == NULL)
        return MT_ENOMEM;
    p->cfg = *cfg;
    p->active = -1;
    p->pinned = -1;
    p->b = mt_alloc_backend(cfg->alloc);
    if (mt_host_cache_device(cfg->host) != p->b) {
        free(p);
        return MT_EINVAL;
    }
    int rc = mt_stream_create(p->b, &p->side);
    if (rc == 0)
        rc = mt_event_create(p->b, &p->mark);
    if (rc != 0)
        goto fail;
    p->tasks = calloc(cfg->ntasks, sizeof *p->tasks);
    if (p->tasks == NULL) {
        rc = MT_ENOMEM;
        goto fail;
    }
    for (unsigned i = 0; i < cfg->ntasks; i++) {
        task_t *t = &p->tasks[i];
        rc = mt_host_malloc(cfg->host, set_bytes(p), MT_TAG_WEIGHTS, (void **)&t->hparams);
        if (rc == 0)
            rc = mt_host_malloc(cfg->host, set_bytes(p), MT_TAG_GRADS, (void **)&t->hgrads);
        /* The side stream reads hparams and writes hgrads for the pager's whole life. */
        if (rc == 0)
            rc = mt_host_record_stream(cfg->host, t->hparams, p->side);
        if (rc == 0)
            rc = mt_host_record_stream(cfg->host, t->hgrads, p->side);
        if (rc == 0)
            rc = mt_event_create(p->b, &t->ready);
        if (rc == 0)
            rc = mt_event_create(p->b, &t->host_busy);
        if (rc != 0)
            goto fail;
        memset(t->hparams, 0, set_bytes(p));
        memset(t->hgrads, 0, set_bytes(p));
    }
    if (cfg->release_under_pressure) {
        rc = mt_alloc_add_free_callback(cfg->alloc, release_under_pressure, p);
        if (rc != 0)
            goto fail;
        p->hooked = true;
    }
    *out = p;
    return 0;
fail:
    if (p->tasks != NULL)
        tasks_free(p);
    mt_event_destroy(p->b, &p->mark);
    mt_stream_destroy(p->b, &p->side);
    free(p);
    return rc;
}

void mt_param_pager_destroy(mt_param_pager_t **pp)
{
    if (pp == NULL || *pp == NULL)
        return;
    mt_param_pager_t *p = *pp;
    if (p->hooked)
        (void)mt_alloc_remove_free_callback(p->cfg.alloc, release_under_pressure, p);
    if (p->dgrads != NULL)
        (void)mt_alloc_free(p->cfg.alloc, p->dgrads);
    /* Frees record events on the streams that still use the memory; destroying the side
     * stream then drains the pager's queued copies and write-backs. */
    tasks_free(p);
    mt_event_destroy(p->b, &p->mark);
    mt_stream_destroy(p->b, &p->side);
    free(p);
    *pp = NULL;
}

static task_t *task_of(mt_param_pager_t *p, unsigned task)
{
    return (p != NULL && task < p->cfg.ntasks) ? &p->tasks[task] : NULL;
}

int mt_param_pager_host(mt_param_pager_t *p, unsigned task, float **params, float **grads)
{
    task_t *t = task_of(p, task);
    if (t == NULL)
        return MT_EINVAL;
    if (params != NULL)
        *params = t->hparams;
    if (grads != NULL)
        *grads = t->hgrads;
    return 0;
}

int mt_param_pager_host_wait(mt_param_pager_t *p, unsigned task)
{
    task_t *t = task_of(p, task);
    if (t == NULL)
        return MT_EINVAL;
    return mt_event_synchronize(p->b, t->host_busy);
}

int mt_param_pager_host_modified(mt_param_pager_t *p, unsigned task)
{
    task_t *t = task_of(p, task);
    if (t == NULL)
        return MT_EINVAL;
    if ((int)task == p->active)
        return MT_EBUSY;
    if (t->dparams != NULL)
        evict(p, t);
    return 0;
}

int mt_param_pager_prefetch(mt_param_pager_t *p, unsigned task)
{
    task_t *t = task_of(p, task);
    if (t == NULL)
        return MT_EINVAL;
    t->last_used = ++p->clock;
    if (t->dparams != NULL)
        return 0;
    return upload(p, t);
}

int mt_param_pager_activate(mt_param_pager_t *p, unsigned task, float **params, float **grads)
{
    task_t *t = task_of(p, task);
    if (t == NULL || params == NULL || grads == NULL)
        return MT_EINVAL;
    if (p->active >= 0)
        return MT_EBUSY;
    int rc = 0;
    bool hit = t->dparams != NULL;
    if (!hit && (rc = upload(p, t)) != 0)
        return rc;
    float *g = NULL;
    p->pinned = (int)task; /* its set stays while the gradients are allocated */
    rc = mt_alloc_malloc(p->cfg.alloc, set_bytes(p), p->cfg.compute, MT_TAG_GRADS, (void **)&g);
    p->pinned = -1;
    if (rc == 0)
        rc = mt_alloc_record_stream(p->cfg.alloc, g, p->side);
    if (rc == 0)
        rc = mt_memset_async(p->b, g, 0, set_bytes(p), p->cfg.compute);
    if (rc == 0)
        rc = mt_stream_wait_event(p->b, p->cfg.compute, t->ready);
    if (rc != 0) {
        (void)mt_alloc_free(p->cfg.alloc, g);
        return rc;
    }
    t->last_used = ++p->clock;
    p->dgrads = g;
    p->active = (int)task;
    p->st.activations++;
    p->st.hits += hit;
    *params = t->dparams;
    *grads = g;
    return 0;
}

int mt_param_pager_deactivate(mt_param_pager_t *p, unsigned task)
{
    task_t *t = task_of(p, task);
    if (t == NULL)
        return MT_EINVAL;
    if (p->active != (int)task)
        return MT_ENOENT;
    float *staging = NULL;
    acc_job_t *job = malloc(sizeof *job);
    if (job == NULL)
        return MT_ENOMEM;
    int rc = mt_host_malloc(p->cfg.host, set_bytes(p), MT_TAG_GRADS, (void **)&staging);
    if (rc != 0) {
        free(job);
        return rc;
    }
    *job = (acc_job_t){.dst = t->hgrads, .src = staging, .n = p->cfg.nparams};
    rc = mt_host_record_stream(p->cfg.host, staging, p->side);
    if (rc == 0)
        rc = mt_event_record(p->b, p->mark, p->cfg.compute);
    if (rc == 0)
        rc = mt_stream_wait_event(p->b, p->side, p->mark);
    if (rc == 0)
        rc = mt_memcpy_async(p->b, staging, p->dgrads, set_bytes(p), MT_MEMCPY_DEVICE_TO_HOST,
                             p->side);
    if (rc == 0)
        rc = mt_stream_launch_host_func(p->b, p->side, accumulate_fn, job);
    if (rc != 0) {
        free(job);
        (void)mt_host_free(p->cfg.host, staging);
        return rc;
    }
    /* From here the job belongs to the side stream. Without the event, host_wait could
     * return before the write-back landed: wait for the side stream now instead. */
    if (mt_event_record(p->b, t->host_busy, p->side) != 0)
        (void)mt_stream_synchronize(p->b, p->side);
    (void)mt_host_free(p->cfg.host, staging);
    (void)mt_alloc_free(p->cfg.alloc, p->dgrads);
    p->dgrads = NULL;
    p->active = -1;
    p->st.writebacks++;
    return 0;
}

void mt_param_pager_stats(const mt_param_pager_t *p, mt_param_pager_stats_t *out)
{
    if (p == NULL || out == NULL)
        return;
    *out = p->st;
    out->resident = p->resident;
}
