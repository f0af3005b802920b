/* mt__ts_write's trace events, which it writes from one buffer each, against the pickle
 * writer's calls for them (the reference below, as torch_snapshot_write.c wrote every event
 * before): the same bytes for every action, integers at each opcode's edges (BININT1, 2, 4,
 * LONG1 of every length, negative, clamped above INT64_MAX), events with no stack, with a
 * stack written first (memoized) and with one memoized already, and lists longer than the
 * writer's batch of 1000 on two devices. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/common/test_main.h"

#include "analysis/torch_snapshot.h"
#include "memtrace/common.h"

/* ---- the reference: every event through the writer's calls ---- */

typedef struct ref_s {
    mt__pkw_t w;
    const mt_ts_t *ts;
    uint32_t *memo;
} ref_t;

static void ref_int(ref_t *o, const char *k, int64_t v)
{
    mt__pkw_str(&o->w, k);
    mt__pkw_int(&o->w, v);
}

static void ref_u64(ref_t *o, const char *k, uint64_t v)
{
    ref_int(o, k, v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v);
}

static void ref_frames(ref_t *o, uint32_t stack)
{
    mt__pkw_str(&o->w, "frames");
    if (stack == 0) {
        mt__pkw_list_begin(&o->w);
        mt__pkw_list_end(&o->w);
        return;
    }
    if (o->memo[stack] != 0) {
        mt__pkw_get(&o->w, o->memo[stack] - 1);
        return;
    }
    o->memo[stack] = mt__pkw_put_next(&o->w) + 1;
    const mt_ts_stack_t *s = &o->ts->stacks[stack];
    mt__pkw_list_begin(&o->w);
    for (uint32_t i = 0; i < s->n; i++) {
        const mt_ts_frame_t *f = &o->ts->frames[s->first + i];
        mt__pkw_dict_begin(&o->w);
        mt__pkw_str(&o->w, "name");
        mt__pkw_str(&o->w, f->name);
        mt__pkw_str(&o->w, "filename");
        mt__pkw_str(&o->w, f->filename);
        ref_int(o, "line", f->line);
        mt__pkw_dict_end(&o->w);
    }
    mt__pkw_list_end(&o->w);
}

static void ref_event(ref_t *o, const mt_ts_event_t *e)
{
    mt__pkw_dict_begin(&o->w);
    mt__pkw_str(&o->w, "action");
    mt__pkw_str(&o->w, mt__ts_action_name(e->action));
    ref_u64(o, e->action == MT_TS_OOM ? "device_free" : "addr", e->addr);
    ref_u64(o, "size", e->size);
    ref_int(o, "stream", e->stream);
    ref_int(o, "time_us", e->time_us);
    if (e->action == MT_TS_ALLOC && e->block_size != 0)
        ref_u64(o, "memtrace_size", e->block_size);
    ref_frames(o, e->stack);
    mt__pkw_dict_end(&o->w);
}

/* era 2 of a snapshot without segments or annotations, as mt__ts_write lays it out. */
static void ref_write(const mt_ts_t *ts, FILE *f)
{
    ref_t o = {.ts = ts, .memo = calloc(ts->nstacks, sizeof(uint32_t))};
    assert_non_null(o.memo);
    mt__pkw_init(&o.w, f);
    mt__pkw_dict_begin(&o.w);
    mt__pkw_str(&o.w, "segments");
    mt__pkw_list_begin(&o.w);
    mt__pkw_list_end(&o.w);
    mt__pkw_str(&o.w, "device_traces");
    mt__pkw_list_begin(&o.w);
    for (unsigned d = 0; d < ts->ndevices; d++) {
        mt__pkw_list_begin(&o.w);
        for (uint32_t i = ts->dev_first[d]; i < ts->dev_first[d + 1]; i++)
            ref_event(&o, &ts->events[i]);
        mt__pkw_list_end(&o.w);
    }
    mt__pkw_list_end(&o.w);
    mt__pkw_str(&o.w, "allocator_settings");
    mt__pkw_dict_begin(&o.w);
    mt__pkw_str(&o.w, "PYTORCH_CUDA_ALLOC_CONF");
    mt__pkw_str(&o.w, "");
    mt__pkw_dict_end(&o.w);
    mt__pkw_str(&o.w, "external_annotations");
    mt__pkw_list_begin(&o.w);
    mt__pkw_list_end(&o.w);
    mt__pkw_dict_end(&o.w);
    assert_int_equal(mt__pkw_finish(&o.w), 0);
    free(o.memo);
}

/* ---- the events ---- */

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Values at the edges of each integer opcode, and around them. */
static int64_t edge(uint64_t *s)
{
    static const int64_t v[] = {0,
                                1,
                                255,
                                256,
                                65535,
                                65536,
                                INT32_MAX,
                                (int64_t)INT32_MAX + 1,
                                -1,
                                -128,
                                -129,
                                -32768,
                                -32769,
                                INT32_MIN,
                                (int64_t)INT32_MIN - 1,
                                (int64_t)1 << 39,
                                -((int64_t)1 << 39) - 1,
                                (int64_t)1 << 47,
                                ((int64_t)1 << 55) - 1,
                                (int64_t)1 << 55,
                                INT64_MAX,
                                INT64_MIN,
                                INT64_MIN + 1};
    uint64_t r = rnd(s);
    if (r % 4 == 0) /* any length of LONG1 */
        return (int64_t)(rnd(s) >> (rnd(s) % 64)) * (r % 8 == 0 ? -1 : 1);
    return v[(r >> 8) % (sizeof v / sizeof v[0])];
}

static void write_same(void **state)
{
    (void)state;
    mt_ts_t *ts = NULL;
    assert_int_equal(mt__ts_create(&ts), 0);
    uint32_t stacks[4] = {0};
    for (int i = 1; i < 4; i++) {
        mt_ts_frame_t f[2] = {{"train_step", "train.py", 40 + i}, {"forward", "model.py", -i}};
        assert_int_equal(mt__ts_add_stack(ts, f, (size_t)i % 2 + 1, &stacks[i]), 0);
    }
    uint64_t s = 0x9e3779b97f4a7c15u;
    const unsigned per_dev[] = {2500, 1300}; /* over the batch of 1000, and not a multiple */
    for (unsigned d = 0; d < 2; d++)
        for (unsigned i = 0; i < per_dev[d]; i++) {
            uint64_t r = rnd(&s);
            mt_ts_event_t e = {
                .addr = (uint64_t)edge(&s),
                .size = (uint64_t)edge(&s),
                .block_size = r % 3 == 0 ? 0 : (uint64_t)edge(&s),
                .stream = edge(&s),
                .time_us = edge(&s),
                .stack = stacks[(r >> 8) % 4],
                .action = (uint8_t)((r >> 16) % (MT_TS_ACTION_COUNT + 1)), /* and "unknown" */
                .device = (uint8_t)d,
            };
            assert_int_equal(mt__ts_add_event(ts, &e), 0);
        }
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    FILE *fa = open_memstream(&a, &na), *fb = open_memstream(&b, &nb);
    assert_int_equal(mt__ts_write(ts, fa, 2), 0);
    ref_write(ts, fb);
    fclose(fa);
    fclose(fb);
    assert_int_equal(na, nb);
    size_t i = 0;
    while (i < na && a[i] == b[i])
        i++;
    if (i < na)
        fail_msg("the written snapshot differs from the writer's calls at byte %zu of %zu", i, na);
    free(a);
    free(b);
    mt__ts_destroy(&ts);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(write_same)};
    return MT_TEST_RUN(tests, NULL, NULL);
}
