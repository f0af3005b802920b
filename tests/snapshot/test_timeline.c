/* A snapshot's live bytes by site over time (analysis/torch_snapshot_timeline.h) against a
 * direct count: a randomized trace of 20 000 allocations and frees over 16 sites (two
 * stacks each, behind PyTorch's C++ frames), the top 4 kept and the rest in "other". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/common/test_main.h"

#include "analysis/torch_snapshot_timeline.h"
#include "memtrace/alloc.h"

#define SITES   16
#define SLOTS   3000
#define OPS     20000
#define TOP     4
#define BUCKETS 50

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_timeline_counts(void **state)
{
    (void)state;
    mt_ts_t *ts = NULL;
    assert_int_equal(mt__ts_create(&ts), 0);
    uint32_t stack[SITES][2];
    char names[SITES][32];
    for (int s = 0; s < SITES; s++) {
        snprintf(names[s], sizeof names[s], "site%02d.py:%d f%d", s, 10 + s, s);
        for (int v = 0; v < 2; v++) {
            char file[32], fn[8];
            snprintf(file, sizeof file, "/home/me/site%02d.py", s);
            snprintf(fn, sizeof fn, "f%d", s);
            mt_ts_frame_t fr[3] = {
                {.name = "torch::unwind::unwind()", .filename = "??"},
                {.name = fn, .filename = file, .line = 10 + s},
                {.name = v ? "main" : "step", .filename = "/home/me/train.py", .line = 5 + v},
            };
            assert_int_equal(mt__ts_add_stack(ts, fr, 3, &stack[s][v]), 0);
        }
    }
    /* The direct count: each slot's site and bytes, each site's bytes, event by event. */
    static int slot_site[SLOTS];
    static uint64_t slot_size[SLOTS];
    static uint64_t total_at[OPS];
    static int64_t time_at[OPS];
    uint64_t cur[SITES] = {0}, peak[SITES] = {0}, total = 0, seed = 0x9e3779b97f4a7c15ull;
    memset(slot_site, -1, sizeof slot_site);
    int64_t t_us = 1748329299000000;
    for (int i = 0; i < OPS; i++) {
        size_t k = rnd(&seed) % SLOTS;
        mt_ts_event_t ev = {.addr = 0x7f0000000000ull + (uint64_t)k * 1024 * 1024,
                            .time_us = t_us += 1 + (int64_t)(rnd(&seed) % 3)};
        if (slot_site[k] < 0) {
            /* Skewed sites so that peaks differ: site s allocates s + 1 units. */
            int s = (int)(rnd(&seed) % SITES);
            ev.action = MT_TS_ALLOC;
            ev.size = (uint64_t)(s + 1) * 512 * (1 + rnd(&seed) % 8);
            ev.stack = stack[s][rnd(&seed) % 2];
            slot_site[k] = s;
            slot_size[k] = ev.size;
            cur[s] += ev.size;
            total += ev.size;
            peak[s] = cur[s] > peak[s] ? cur[s] : peak[s];
        } else {
            ev.action = rnd(&seed) % 2 ? MT_TS_FREE_REQUESTED : MT_TS_FREE_COMPLETED;
            ev.size = slot_size[k];
            cur[slot_site[k]] -= slot_size[k];
            total -= slot_size[k];
            slot_site[k] = -1;
        }
        total_at[i] = total;
        time_at[i] = t_us * 1000;
        assert_int_equal(mt__ts_add_event(ts, &ev), 0);
    }

    mt_ts_timeline_t *tl = NULL;
    assert_int_equal(mt__ts_timeline_create(&tl, ts, NULL, TOP, BUCKETS), 0);
    assert_true(tl->by_time);
    assert_int_equal(tl->nsites, TOP + 1);
    assert_true(tl->other);
    assert_string_equal(tl->names[TOP], "other");
    assert_int_equal(tl->nbuckets, BUCKETS);
    /* The kept sites are the TOP largest peaks, largest first, with their exact peaks. */
    uint64_t least_kept = UINT64_MAX;
    for (int i = 0; i < TOP; i++) {
        int s = -1;
        for (int j = 0; j < SITES; j++)
            if (strcmp(tl->names[i], names[j]) == 0)
                s = j;
        assert_true(s >= 0);
        assert_int_equal(tl->peak[i], peak[s]);
        if (i > 0)
            assert_true(tl->peak[i] <= tl->peak[i - 1]);
        least_kept = peak[s] < least_kept ? peak[s] : least_kept;
        for (int v = 0; v < 2; v++)
            assert_int_equal(tl->site_of[stack[s][v]], i);
    }
    int others = 0;
    for (int j = 0; j < SITES; j++) {
        if (tl->site_of[stack[j][0]] == TOP) {
            assert_true(peak[j] <= least_kept);
            others++;
        }
    }
    assert_int_equal(others, SITES - TOP);
    /* Each bucket: the sites add up to the largest total at its start or within it. */
    int64_t t0 = time_at[0], t1 = time_at[OPS - 1];
    uint64_t before = 0;
    size_t i = 0;
    for (size_t b = 0; b < BUCKETS; b++) {
        uint64_t want = before;
        for (; i < OPS; i++) {
            double f = (double)(time_at[i] - t0) / (double)(t1 - t0);
            size_t bi = f <= 0 ? 0 : (size_t)(f * BUCKETS);
            bi = bi >= BUCKETS ? BUCKETS - 1 : bi;
            if (bi != b)
                break;
            want = total_at[i] > want ? total_at[i] : want;
            before = total_at[i];
        }
        uint64_t got = 0;
        for (size_t s = 0; s < tl->nsites; s++)
            got += tl->bytes[b * tl->nsites + s];
        assert_int_equal(got, want);
    }
    mt__ts_timeline_destroy(&tl);
    assert_null(tl);
    assert_int_equal(mt__ts_timeline_create(&tl, ts, NULL, 0, BUCKETS), MT_EINVAL);
    mt__ts_destroy(&ts);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_timeline_counts)};
    return MT_TEST_RUN(tests, NULL, NULL);
}
