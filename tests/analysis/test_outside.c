/* Device memory outside the allocator, end to end on sim: a modelled context, a library
 * that reports what it takes (mt_alloc_note_outside), one that does not, and the model's
 * split of the device's used bytes after the events went through the log's JSON lines. */
#include <jansson.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/prof.h"
#include "analysis/model.h"

#define MIB ((uint64_t)1 << 20)

typedef struct lines_sink_s {
    mt_event_sink_t sink;
    mt_model_t *model;
    size_t n;
    size_t kinds[MT_EV_KIND_COUNT];
} lines_sink_t;

/* Each event as the log writes it, read back as report reads it, into the model. */
static void through_json(void *ud, const mt_event_rec_t *ev)
{
    lines_sink_t *s = ud;
    mt_event_rec_t e = *ev;
    e.seq = s->n++;
    char buf[1024];
    size_t len = mt_prof_event_write(buf, sizeof buf, &e, 77, NULL, NULL);
    assert_true(len > 0 && len < sizeof buf);
    json_error_t jerr;
    json_t *o = json_loads(buf, 0, &jerr);
    assert_non_null(o);
    mt_event_rec_t back;
    char err[128] = "";
    if (mt_prof_event_from_json(o, &back, NULL, err, sizeof err) != 0)
        fail_msg("%s: %s", buf, err);
    json_decref(o);
    s->kinds[back.kind]++;
    assert_int_equal(mt__model_apply(s->model, &back), 0);
}

typedef struct log_s {
    char last[2048];
} log_t;

static void keep_error(void *ud, mt_log_level_e level, const char *msg)
{
    if (level == MT_LOG_ERROR)
        snprintf(((log_t *)ud)->last, sizeof((log_t *)ud)->last, "%s", msg);
}

static void split_of(mt_model_t *m, mt_model_outside_t *o)
{
    assert_int_equal(mt__model_outside(m, o, 1), 1);
    /* the parts always add up to the device's used bytes */
    uint64_t r = o->reserved < o->used ? o->reserved : o->used;
    assert_int_equal(r + o->libraries + o->context + o->other_processes + o->not_seen, o->used);
    char why[160];
    if (mt__model_check(m, why, sizeof why) != 0)
        fail_msg("model: %s", why);
}

static void test_split_adds_up(void **state)
{
    (void)state;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 1024 * MIB;
    bc.sim_context = 96 * MIB;
    bc.sim_malloc_cost_ns = bc.sim_free_cost_ns = 0;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    size_t fr = 0, tot = 0;
    assert_int_equal(mt_backend_mem_get_info(b, &fr, &tot), 0);
    assert_int_equal(tot - fr, 96 * MIB); /* the context is used from the start */

    lines_sink_t ls = {.sink = {.emit = through_json, .ud = &ls}};
    assert_int_equal(mt__model_create(&ls.model, NULL), 0);
    log_t lg = {0};
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.sink = &ls.sink;
    ac.log = keep_error;
    ac.log_ud = &lg;
    ac.expandable_segments = false;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &ac), 0);

    void *blk = NULL;
    assert_int_equal(mt_alloc_malloc(a, 40 * MIB, NULL, 0, &blk), 0);
    /* A library that says what it takes (the drop-in does this for what it forwards)... */
    void *lib = NULL, *quiet = NULL;
    assert_int_equal(mt_backend_malloc(b, 32 * MIB, &lib), 0);
    assert_int_equal(mt_alloc_note_outside(a, false, (uintptr_t)lib, 32 * MIB, "libfakenccl.so.2"),
                     0);
    /* ...and one that does not. */
    assert_int_equal(mt_backend_malloc(b, 16 * MIB, &quiet), 0);
    mt_alloc_emit(a, MT_EV_STATS, 0, 0, 0); /* the periodic figure sees it */

    mt_model_outside_t o;
    split_of(ls.model, &o);
    mt_alloc_stats_t st;
    assert_int_equal(mt_alloc_stats(a, &st), 0);
    uint64_t reserved = (uint64_t)st.reserved_bytes[MT_STAT_ALL].current;
    assert_int_equal(o.device, 0);
    assert_int_equal(o.total, 1024 * MIB);
    assert_int_equal(o.reserved, reserved);
    assert_int_equal(o.used, 96 * MIB + reserved + 32 * MIB + 16 * MIB);
    assert_int_equal(o.context, 96 * MIB);
    assert_int_equal(o.libraries, 32 * MIB);
    assert_int_equal(o.not_seen, 16 * MIB);
    assert_int_equal(o.outside, 144 * MIB);
    mt_model_library_t rows[4];
    assert_int_equal(mt__model_outside_libraries(ls.model, 0, rows, 4), 1);
    assert_string_equal(rows[0].name, "libfakenccl.so.2");
    assert_int_equal(rows[0].bytes, 32 * MIB);
    assert_int_equal(mt_alloc_outside_bytes(a, "libfakenccl.so.2"), 32 * MIB);
    assert_int_equal(ls.kinds[MT_EV_LIBRARY_LABEL], 1);

    /* An OOM names what holds the device outside the allocator. */
    void *big = NULL;
    assert_int_equal(mt_alloc_malloc(a, 900 * MIB, NULL, 0, &big), MT_ENOMEM);
    const char *msg = mt_alloc_last_error(a);
    if (strstr(msg, "Outside memtrace's allocator the device holds") == NULL ||
        strstr(msg, "libfakenccl.so.2 32.00 MiB") == NULL || strstr(msg, "not seen") == NULL)
        fail_msg("OOM message without the outside split: %s", msg);
    assert_non_null(strstr(lg.last, "libfakenccl.so.2"));

    /* The library gives its memory back: its row keeps the peak, the rest follows. */
    assert_int_equal(mt_alloc_note_outside(a, true, (uintptr_t)lib, 32 * MIB, "libfakenccl.so.2"),
                     0);
    assert_int_equal(mt_backend_free(b, lib), 0);
    mt_alloc_emit(a, MT_EV_STATS, 0, 0, 0);
    split_of(ls.model, &o);
    assert_int_equal(o.libraries, 0);
    assert_int_equal(o.not_seen, 16 * MIB);
    assert_int_equal(mt__model_outside_libraries(ls.model, 0, rows, 4), 1);
    assert_int_equal(rows[0].bytes, 0);
    assert_int_equal(rows[0].peak, 32 * MIB);
    assert_int_equal(mt_alloc_outside_bytes(a, NULL), 0);

    mt_alloc_free(a, blk);
    assert_int_equal(mt_backend_free(b, quiet), 0);
    mt_alloc_destroy(&a);
    split_of(ls.model, &o);
    assert_int_equal(o.used, 96 * MIB); /* the context only */
    assert_int_equal(o.context, 96 * MIB);
    mt__model_destroy(&ls.model);
    mt_backend_destroy(&b);
}

/* Where the driver tells this process's own bytes (NVML; the sim model), what other
 * processes hold is its own part, and neither the context nor "not seen" carries it. */
static void test_other_processes(void **state)
{
    (void)state;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 1024 * MIB;
    bc.sim_context = 96 * MIB;
    bc.sim_other_processes = 128 * MIB;
    bc.sim_malloc_cost_ns = bc.sim_free_cost_ns = 0;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), 0);
    uint64_t self = 0;
    assert_int_equal(mt_backend_process_used(b, &self), 0);
    assert_int_equal(self, 96 * MIB);
    lines_sink_t ls = {.sink = {.emit = through_json, .ud = &ls}};
    assert_int_equal(mt__model_create(&ls.model, NULL), 0);
    log_t lg = {0};
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.sink = &ls.sink;
    ac.log = keep_error;
    ac.log_ud = &lg;
    ac.expandable_segments = false;
    mt_alloc_t *a = NULL;
    assert_int_equal(mt_alloc_create(&a, &ac), 0);
    void *blk = NULL, *quiet = NULL;
    assert_int_equal(mt_alloc_malloc(a, 40 * MIB, NULL, 0, &blk), 0);
    assert_int_equal(mt_backend_malloc(b, 16 * MIB, &quiet), 0);
    mt_alloc_emit(a, MT_EV_STATS, 0, 0, 0);
    mt_model_outside_t o;
    split_of(ls.model, &o);
    assert_true(o.self_known);
    assert_int_equal(o.used, 96 * MIB + 128 * MIB + o.reserved + 16 * MIB);
    assert_int_equal(o.context, 96 * MIB);
    assert_int_equal(o.other_processes, 128 * MIB);
    assert_int_equal(o.not_seen, 16 * MIB);
    void *big = NULL;
    assert_int_equal(mt_alloc_malloc(a, 900 * MIB, NULL, 0, &big), MT_ENOMEM);
    const char *msg = mt_alloc_last_error(a);
    if (strstr(msg, ": other processes 128.00 MiB, and 112.00 MiB not seen") == NULL)
        fail_msg("OOM message without other processes: %s", msg);
    mt_alloc_free(a, blk);
    assert_int_equal(mt_backend_free(b, quiet), 0);
    mt_alloc_destroy(&a);
    mt__model_destroy(&ls.model);
    mt_backend_destroy(&b);
}

static void test_context_too_large(void **state)
{
    (void)state;
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_capacity = 64 * MIB;
    bc.sim_context = 64 * MIB;
    mt_backend_t *b = NULL;
    assert_int_equal(mt_backend_create(&b, &bc), MT_EINVAL);
    assert_null(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_adds_up),
        cmocka_unit_test(test_other_processes),
        cmocka_unit_test(test_context_too_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
