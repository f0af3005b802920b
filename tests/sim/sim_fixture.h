/* Shared set-up of the sim backend tests: a small sim device with zero modelled cost. */
#ifndef MT_TESTS_SIM_FIXTURE_H
#define MT_TESTS_SIM_FIXTURE_H

#include "backend/backend_sim.h"
#include "memtrace/backend.h"

#define MIB ((size_t)1 << 20)

static inline mt_backend_t *sim_new(size_t capacity)
{
    mt_backend_cfg_t cfg = mt_backend_cfg_default();
    cfg.kind = MT_BACKEND_SIM;
    cfg.sim_capacity = capacity;
    cfg.sim_malloc_cost_ns = 0;
    cfg.sim_free_cost_ns = 0;
    mt_backend_t *b = NULL;
    int rc = mt_backend_create(&b, &cfg);
    assert_int_equal(rc, 0);
    assert_non_null(b);
    assert_true(mt__sim_is_sim(b));
    return b;
}

static inline mt_backend_counters_t counters_of(const mt_backend_t *b)
{
    mt_backend_counters_t c;
    mt_backend_counters(b, &c);
    return c;
}

#endif
