/* The sim backend: host memory posing as a device of fixed capacity.
 *
 * This file makes and frees the devices, holds the ops table and the test hooks; device
 * memory (segments, virtual memory, pinned host memory) is in sim_mem.c, streams and
 * events in sim_stream.c. With MEMTRACE_SIM_DEVICES=N one create makes a group of N such
 * devices, each with its own range, capacity and streams; they share the event lock
 * (cross-device waits) and the peer copy cost model. */
#include <stdlib.h>

#include "backend/backend_sim.h"
#include "backend/sim_internal.h"
#include "util/log.h"

#define GIB                  ((size_t)1 << 30)
#define SIM_DEFAULT_CAPACITY (8 * GIB)

static const mt_backend_ops_t sim_ops;

static sim_t *to_sim(const mt_backend_t *b)
{
    return (sim_t *)b;
}

/* The test hook of mt__sim_set_call_hook, if any, for one blocking call. */
void mt__sim_call_hook(sim_t *s, const char *call)
{
    pthread_mutex_lock(&s->mu);
    void (*cb)(void *, const char *) = s->call_cb;
    void *ud = s->call_ud;
    pthread_mutex_unlock(&s->mu);
    if (cb != NULL)
        cb(ud, call);
}

/* ---- lifecycle ---- */

/* Frees one device: its streams, events and memory. Every device of the group was
 * synchronised first. */
static void device_free(sim_t *s)
{
    mt__sim_streams_fini(s);
    mt__sim_pool_fini(s);
    mt__sim_mem_fini(s);
    pthread_mutex_destroy(&s->cost_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Frees the group and its devices dev[0, made). */
static void group_free(sim_group_t *g, int made)
{
    /* A stream of one device may wait on a mark another device records. */
    for (int i = 0; i < made; i++)
        mt__sim_device_synchronize(&g->dev[i]->base);
    for (int i = 0; i < made; i++)
        device_free(g->dev[i]);
    pthread_cond_destroy(&g->ev_cv);
    pthread_mutex_destroy(&g->ev_mu);
    free(g->dev);
    free(g);
}

/* Only the handle mt_backend_create returned destroys; the others are borrowed. */
static void sim_destroy(mt_backend_t *b)
{
    sim_t *s = to_sim(b);
    if (s->owner)
        group_free(s->group, s->group->n);
}

static int sim_device_count(const mt_backend_t *b)
{
    return to_sim(b)->group->n;
}

static mt_backend_t *sim_get_device(mt_backend_t *b, int ordinal)
{
    return &to_sim(b)->group->dev[ordinal]->base;
}

/* Makes device `ordinal` of group g. */
static int device_new(sim_group_t *g, int ordinal, const mt_backend_cfg_t *cfg, size_t capacity,
                      uint64_t mcost, uint64_t fcost, sim_t **out)
{
    sim_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return MT_ENOMEM;
    s->base.ops = &sim_ops;
    s->base.device = ordinal;
    s->base.log = cfg->log;
    s->base.log_ud = cfg->log_ud;
    s->group = g;
    s->capacity = capacity;
    s->context = cfg->sim_context;
    s->others = cfg->sim_other_processes;
    s->va_space = cfg->sim_va_space;
    s->fail_rc = MT_ENOMEM;
    atomic_init(&s->malloc_cost_ns, mcost);
    atomic_init(&s->free_cost_ns, fcost);
    int rc = MT_ENOMEM;
    if (pthread_mutex_init(&s->mu, NULL) != 0)
        goto fail_mutex;
    if (pthread_mutex_init(&s->cost_mu, NULL) != 0)
        goto fail_cost_mutex;
    rc = mt__sim_mem_init(s);
    if (rc != 0)
        goto fail_mem;
    rc = mt__sim_streams_init(s);
    if (rc != 0)
        goto fail_streams;
    rc = mt__sim_pool_init(s);
    if (rc != 0)
        goto fail_pool;
    *out = s;
    return 0;

fail_pool:
    mt__sim_streams_fini(s);
fail_streams:
    mt__sim_mem_fini(s);
fail_mem:
    pthread_mutex_destroy(&s->cost_mu);
fail_cost_mutex:
    pthread_mutex_destroy(&s->mu);
fail_mutex:
    free(s);
    return rc;
}

int mt__backend_sim_create(mt_backend_t **out, const mt_backend_cfg_t *cfg)
{
    *out = NULL;
    mt_backend_cfg_t def = mt_backend_cfg_default();
    size_t capacity = cfg->sim_capacity ? cfg->sim_capacity : def.sim_capacity;
    if (capacity == 0)
        capacity = SIM_DEFAULT_CAPACITY;
    if (capacity < SIM_MIN_ALIGN)
        return MT_EINVAL;
    /* UINT64_MAX asks for the default (see mt_backend_cfg_t). */
    uint64_t mcost =
        cfg->sim_malloc_cost_ns == UINT64_MAX ? def.sim_malloc_cost_ns : cfg->sim_malloc_cost_ns;
    uint64_t fcost =
        cfg->sim_free_cost_ns == UINT64_MAX ? def.sim_free_cost_ns : cfg->sim_free_cost_ns;
    uint64_t pcost =
        cfg->sim_peer_cost_ns == UINT64_MAX ? def.sim_peer_cost_ns : cfg->sim_peer_cost_ns;
    uint64_t bw = cfg->sim_peer_bandwidth ? cfg->sim_peer_bandwidth : def.sim_peer_bandwidth;
    int n = cfg->sim_devices ? cfg->sim_devices : def.sim_devices;
    if (n < 1 || n > MT_SIM_MAX_DEVICES || bw == 0) {
        mt__logf(cfg->log, cfg->log_ud, MT_LOG_ERROR,
                 "memtrace: sim backend: %d devices asked for, the sim models 1..%d", n,
                 MT_SIM_MAX_DEVICES);
        return MT_EINVAL;
    }
    if (cfg->sim_context >= capacity || cfg->sim_other_processes >= capacity - cfg->sim_context) {
        mt__logf(cfg->log, cfg->log_ud, MT_LOG_ERROR,
                 "memtrace: sim backend: a context of %zu bytes and %zu bytes of other "
                 "processes leave nothing of a %zu-byte device (MEMTRACE_SIM_CONTEXT + "
                 "MEMTRACE_SIM_OTHER_PROCESSES below MEMTRACE_SIM_CAPACITY)",
                 cfg->sim_context, cfg->sim_other_processes, capacity);
        return MT_EINVAL;
    }
    if (cfg->device >= n) {
        mt__logf(cfg->log, cfg->log_ud, MT_LOG_ERROR,
                 "memtrace: device ordinal %d out of range: the sim backend has %d device%s",
                 cfg->device, n, n == 1 ? "" : "s");
        return MT_EINVAL;
    }

    sim_group_t *g = calloc(1, sizeof *g);
    if (g == NULL)
        return MT_ENOMEM;
    g->n = n;
    atomic_init(&g->peer_cost_ns, pcost);
    atomic_init(&g->peer_bandwidth, bw);
    g->dev = calloc((size_t)n, sizeof *g->dev);
    if (g->dev == NULL)
        goto fail_dev;
    if (pthread_mutex_init(&g->ev_mu, NULL) != 0)
        goto fail_ev_mu;
    if (pthread_cond_init(&g->ev_cv, NULL) != 0)
        goto fail_ev_cv;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        rc = device_new(g, i, cfg, capacity, mcost, fcost, &g->dev[i]);
        if (rc != 0) {
            group_free(g, i); /* frees the group's mutex and cv too */
            return rc;
        }
    }
    g->dev[cfg->device]->owner = true;
    *out = &g->dev[cfg->device]->base;
    return 0;

fail_ev_cv:
    pthread_mutex_destroy(&g->ev_mu);
fail_ev_mu:
    free(g->dev);
fail_dev:
    free(g);
    return MT_ENOMEM;
}

/* The synchronisations as the backend's user calls them, through the test hook. */
static int sim_stream_synchronize(mt_backend_t *b, mt_stream_t *st)
{
    mt__sim_call_hook(to_sim(b), "stream_synchronize");
    int rc = mt__sim_stream_synchronize(b, st);
    mt__sim_pool_on_sync(to_sim(b));
    return rc;
}

static int sim_device_synchronize(mt_backend_t *b)
{
    mt__sim_call_hook(to_sim(b), "device_synchronize");
    int rc = mt__sim_device_synchronize(b);
    mt__sim_pool_on_sync(to_sim(b));
    return rc;
}

static int sim_event_synchronize(mt_backend_t *b, mt_event_t *ev)
{
    mt__sim_call_hook(to_sim(b), "event_synchronize");
    int rc = mt__sim_event_synchronize(b, ev);
    mt__sim_pool_on_sync(to_sim(b));
    return rc;
}

static int sim_event_create(mt_backend_t *b, mt_event_t **out)
{
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    bool fail = s->ev_fail_next > 0;
    if (fail)
        s->ev_fail_next--;
    pthread_mutex_unlock(&s->mu);
    return fail ? MT_ENOMEM : mt__sim_event_create(b, out);
}

/* A fork locks the whole group once, however many of its devices' allocators ask:
 * every device's streams (non-leaf locks first), then every device's mu and cost_mu, then
 * the group's ev_mu. The leaves are taken last, so no thread holding one waits for a lock
 * the forking thread holds. */
static void sim_fork(mt_backend_t *b, int phase)
{
    sim_group_t *g = to_sim(b)->group;
    if (phase == MT__FORK_PREPARE) {
        if (g->fork_held++ > 0)
            return;
        for (int i = 0; i < g->n; i++)
            mt__sim_pool_fork(g->dev[i], phase);
        for (int i = 0; i < g->n; i++)
            mt__sim_streams_fork(g->dev[i], phase);
        for (int i = 0; i < g->n; i++) {
            pthread_mutex_lock(&g->dev[i]->mu);
            pthread_mutex_lock(&g->dev[i]->cost_mu);
        }
        pthread_mutex_lock(&g->ev_mu);
        return;
    }
    if (g->fork_held == 0 || --g->fork_held > 0)
        return;
    if (phase == MT__FORK_PARENT) {
        pthread_mutex_unlock(&g->ev_mu);
        for (int i = 0; i < g->n; i++) {
            pthread_mutex_unlock(&g->dev[i]->cost_mu);
            pthread_mutex_unlock(&g->dev[i]->mu);
        }
    } else {
        pthread_mutex_init(&g->ev_mu, NULL);
        pthread_cond_init(&g->ev_cv, NULL);
        for (int i = 0; i < g->n; i++) {
            pthread_mutex_init(&g->dev[i]->cost_mu, NULL);
            pthread_mutex_init(&g->dev[i]->mu, NULL);
        }
    }
    for (int i = 0; i < g->n; i++)
        mt__sim_streams_fork(g->dev[i], phase);
    for (int i = 0; i < g->n; i++)
        mt__sim_pool_fork(g->dev[i], phase);
}

static const mt_backend_ops_t sim_ops = {
    .name = "sim",
    .kind = MT_BACKEND_SIM,
    .destroy = sim_destroy,
    .malloc = mt__sim_malloc,
    .free = mt__sim_free,
    .mem_get_info = mt__sim_mem_get_info,
    .process_used = mt__sim_process_used,
    .is_device_ptr = mt__sim_is_device_ptr,
    .vm_granularity = mt__sim_vm_granularity,
    .vm_reserve = mt__sim_vm_reserve,
    .vm_release = mt__sim_vm_release,
    .vm_map = mt__sim_vm_map,
    .vm_unmap = mt__sim_vm_unmap,
    .stream_create = mt__sim_stream_create,
    .stream_destroy = mt__sim_stream_destroy,
    .stream_synchronize = sim_stream_synchronize,
    .stream_wait_event = mt__sim_stream_wait_event,
    .launch_host_func = mt__sim_launch_host_func,
    .memcpy_async = mt__sim_memcpy_async,
    .memset_async = mt__sim_memset_async,
    .device_synchronize = sim_device_synchronize,
    .event_create = sim_event_create,
    .event_destroy = mt__sim_event_destroy,
    .event_record = mt__sim_event_record,
    .event_query = mt__sim_event_query,
    .event_synchronize = sim_event_synchronize,
    .event_time_ns = mt__sim_event_time_ns,
    .host_malloc = mt__sim_host_malloc,
    .host_free = mt__sim_host_free,
    .device_count = sim_device_count,
    .get_device = sim_get_device,
    .memcpy_peer_async = mt__sim_memcpy_peer_async,
    .fork = sim_fork,
    .malloc_async = mt__sim_malloc_async,
    .free_async = mt__sim_free_async,
    .pool_set_release_threshold = mt__sim_pool_set_release_threshold,
    .pool_trim_to = mt__sim_pool_trim_to,
    .pool_usage = mt__sim_pool_usage,
    .pool_reset_high = mt__sim_pool_reset_high,
    .managed_malloc = mt__sim_managed_malloc,
    .managed_free = mt__sim_managed_free,
    .managed_prefetch = mt__sim_managed_prefetch,
    .managed_advise = mt__sim_managed_advise,
    .managed_stats = mt__sim_managed_stats,
    .is_managed = mt__sim_is_managed,
};

/* ---- test hooks (backend_sim.h) ---- */

bool mt__sim_is_sim(const mt_backend_t *b)
{
    return b != NULL && b->ops == &sim_ops;
}

int mt__sim_inject_malloc_failures(mt_backend_t *b, unsigned n)
{
    return mt__sim_inject_malloc_errors(b, n, MT_ENOMEM);
}

int mt__sim_inject_malloc_errors(mt_backend_t *b, unsigned n, int rc)
{
    if (!mt__sim_is_sim(b) || rc >= 0)
        return MT_EINVAL;
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    s->fail_next = n;
    s->fail_rc = rc;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int mt__sim_set_call_hook(mt_backend_t *b, void (*cb)(void *ud, const char *call), void *ud)
{
    if (!mt__sim_is_sim(b))
        return MT_EINVAL;
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    s->call_cb = cb;
    s->call_ud = ud;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int mt__sim_inject_event_failures(mt_backend_t *b, unsigned n)
{
    if (!mt__sim_is_sim(b))
        return MT_EINVAL;
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    s->ev_fail_next = n;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void mt__sim_set_costs(mt_backend_t *b, uint64_t malloc_ns, uint64_t free_ns)
{
    if (!mt__sim_is_sim(b))
        return;
    sim_t *s = to_sim(b);
    atomic_store_explicit(&s->malloc_cost_ns, malloc_ns, memory_order_relaxed);
    atomic_store_explicit(&s->free_cost_ns, free_ns, memory_order_relaxed);
}

size_t mt__sim_used_bytes(const mt_backend_t *b)
{
    if (!mt__sim_is_sim(b))
        return 0;
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    size_t r = s->seg_bytes + s->mapped_bytes;
    pthread_mutex_unlock(&s->mu);
    return r;
}

size_t mt__sim_segment_count(const mt_backend_t *b)
{
    if (!mt__sim_is_sim(b))
        return 0;
    sim_t *s = to_sim(b);
    pthread_mutex_lock(&s->mu);
    size_t r = s->used_r.n;
    pthread_mutex_unlock(&s->mu);
    return r;
}
