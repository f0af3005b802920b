/* Shared set-up of the host tests: a small sim device with zero modelled cost, a device
 * caching allocator and a pinned host cache over it, plus a gate (a host function that
 * holds a stream until the test opens it). */
#ifndef MT_TESTS_HOST_FIXTURE_H
#define MT_TESTS_HOST_FIXTURE_H

#include <stdatomic.h>
#include <time.h>

#include "backend/backend_sim.h"
#include "memtrace/host.h"

#define MIB ((size_t)1 << 20)

typedef struct fx_s {
    mt_backend_t *b;
    mt_alloc_t *a;
    mt_host_cache_t *h;
    mt_stream_t *compute;
} fx_t;

static inline void fx_init(fx_t *f, size_t capacity, size_t host_capacity)
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = capacity;
    bc.sim_malloc_cost_ns = 0;
    bc.sim_free_cost_ns = 0;
    assert_int_equal(mt_backend_create(&f->b, &bc), 0);
    assert_true(mt__sim_is_sim(f->b));
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = f->b;
    assert_int_equal(mt_alloc_create(&f->a, &ac), 0);
    mt_host_cfg_t hc = mt_host_cfg_default();
    hc.backend = f->b;
    hc.capacity = host_capacity;
    assert_int_equal(mt_host_cache_create(&f->h, &hc), 0);
    assert_int_equal(mt_stream_create(f->b, &f->compute), 0);
}

static inline void fx_fini(fx_t *f)
{
    assert_int_equal(mt_device_synchronize(f->b), 0);
    mt_stream_destroy(f->b, &f->compute);
    assert_int_equal(mt_alloc_check(mt_host_cache_alloc(f->h)), 0);
    mt_host_cache_destroy(&f->h);
    assert_int_equal(mt_alloc_check(f->a), 0);
    mt_alloc_destroy(&f->a);
    mt_backend_destroy(&f->b);
}

static inline uint64_t fx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void fx_sleep_us(unsigned us)
{
    struct timespec ts = {.tv_sec = us / 1000000u, .tv_nsec = (long)(us % 1000000u) * 1000};
    nanosleep(&ts, NULL);
}

/* A gate: a host function queued on a stream spins until the test opens it (or 10 s pass,
 * so that a broken ordering fails the test instead of hanging it; timed_out says so). */
typedef struct gate_s {
    atomic_bool open;
    atomic_bool timed_out;
} gate_t;

static inline void gate_fn(void *ud)
{
    gate_t *g = ud;
    uint64_t end = fx_now_ns() + 10000000000ull;
    while (!atomic_load(&g->open)) {
        if (fx_now_ns() > end) {
            atomic_store(&g->timed_out, true);
            return;
        }
        fx_sleep_us(100);
    }
}

static inline void gate_open_fn(void *ud)
{
    atomic_store(&((gate_t *)ud)->open, true);
}

#endif
