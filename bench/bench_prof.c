/* bench_prof: what recording costs the program (issue 3's goal: on an allocation-heavy
 * loop of cached alloc+free pairs, recording on costs <= 5 % over recording off and
 * <= 50 ns per event).
 *
 * Configurations, each on a fresh sim backend + caching allocator, same loop:
 *   off         no sink: the allocator neither stamps nor emits events
 *   ring        the profiler's ring, read by a consumer thread that only drains, as the
 *               daemon does from its own process (the production path)
 *   local log   the profiler in log mode: its drainer thread encodes JSON to /dev/null
 *               (the no-daemon fallback; drops are counted when the encoder falls behind)
 * plus the ring's push alone (no allocator), with a draining consumer.
 * Rounds alternate the configurations and the best (lowest) time of each is kept, which
 * filters out the noise of a shared machine; the drops shown are those of that round. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "memtrace/alloc.h"
#include "memtrace/prof.h"
#include "allocator/internal.h"
#include "profiler/ring.h"

#define PAIRS  400000
#define ROUNDS 5
#define PUSHES 2000000

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- a consumer thread draining a ring, as the daemon does ---- */

typedef struct reader_s {
    mt__ring_t *ring;
    _Atomic int stop;
    uint64_t seen;
    pthread_t th;
} reader_t;

static void count_cb(void *ud, const mt_event_rec_t *ev)
{
    if (ev->kind != MT_EV_GAP)
        ((reader_t *)ud)->seen++;
}

static void *reader_main(void *arg)
{
    reader_t *r = arg;
    /* Like the daemon: on each timer tick (1 ms), read everything published. */
    while (!atomic_load(&r->stop)) {
        while (mt__ring_drain(r->ring, count_cb, r, 65536) > 0) {
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    while (mt__ring_drain(r->ring, count_cb, r, SIZE_MAX) > 0) {
    }
    return NULL;
}

static void null_emit(void *ud, const mt_event_rec_t *ev)
{
    (*(uint64_t *)ud)++;
    (void)ev;
}

static void ring_sink(void *ud, const mt_event_rec_t *ev)
{
    mt__ring_push(ud, ev);
}

static void ring_sink_n(void *ud, const mt_event_rec_t *ev, size_t n)
{
    mt__ring_push_n(ud, ev, n);
}

/* ---- the allocation loop ---- */

enum { CFG_OFF, CFG_NULL, CFG_RING, CFG_LOG, NCFG };
static const char *const cfg_names[NCFG] = {"recording off", "empty sink (allocator side)",
                                            "ring + reader (daemon path)",
                                            "local log (JSON drainer)"};

typedef struct result_s {
    double best_ns_per_pair;
    uint64_t events, dropped;
} result_t;

static int run_loop(int cfgi, result_t *res)
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    mt_backend_t *b = NULL;
    if (mt_backend_create(&b, &bc) != 0)
        return -1;
    mt__ring_t *ring = NULL;
    reader_t rd = {0};
    mt_prof_t *prof = NULL;
    mt_event_sink_t sink = {.emit = ring_sink, .emit_n = ring_sink_n};
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    uint64_t null_count = 0;
    mt_event_sink_t nsink = {.emit = null_emit, .ud = &null_count};
    if (cfgi == CFG_NULL) {
        ac.sink = &nsink;
    } else if (cfgi == CFG_RING) {
        if (mt__ring_create(&ring, 1 << 16, "bench") != 0)
            return -1;
        mt__ring_unlink(ring);
        rd.ring = ring;
        pthread_create(&rd.th, NULL, reader_main, &rd);
        sink.ud = ring;
        ac.sink = &sink;
    } else if (cfgi == CFG_LOG) {
        mt_prof_cfg_t pc = mt_prof_cfg_default();
        pc.mode = MT_PROF_LOG;
        pc.log_path = "/dev/null";
        if (mt_prof_create(&prof, &pc) != 0)
            return -1;
        ac.sink = mt_prof_sink(prof);
    }
    mt_alloc_t *a = NULL;
    if (mt_alloc_create(&a, &ac) != 0)
        return -1;
    /* Warm the cache: every size of the loop has a cached block afterwards. */
    static const size_t sizes[8] = {512, 4096, 65536, 1 << 20, 3 << 20, 8 << 20, 1000, 200000};
    void *p[8];
    for (int i = 0; i < 8; i++)
        mt_alloc_malloc(a, sizes[i], NULL, MT_TAG_ACTIVATIONS, &p[i]);
    for (int i = 0; i < 8; i++)
        mt_alloc_free(a, p[i]);
    uint64_t t0 = now_ns();
    for (int i = 0; i < PAIRS; i++) {
        void *q;
        mt_alloc_malloc(a, sizes[i & 7], NULL, MT_TAG_ACTIVATIONS, &q);
        mt_alloc_free(a, q);
    }
    uint64_t dt = now_ns() - t0;
    double ns = (double)dt / PAIRS;
    bool best = ns < res->best_ns_per_pair || res->best_ns_per_pair == 0;
    if (best)
        res->best_ns_per_pair = ns;
    mt_alloc_destroy(&a);
    if (cfgi == CFG_NULL) {
        res->events = null_count;
    } else if (cfgi == CFG_RING) {
        atomic_store(&rd.stop, 1);
        pthread_join(rd.th, NULL);
        mt__ring_stats_t st;
        mt__ring_stats(ring, &st);
        res->events = st.emitted;
        if (best) /* the drops of the round whose time is shown */
            res->dropped = st.dropped;
        mt__ring_close(&ring);
    } else if (cfgi == CFG_LOG) {
        mt_prof_stats_t st;
        mt_prof_stats(prof, &st);
        res->events = st.emitted;
        if (best) /* the drops of the round whose time is shown */
            res->dropped = st.dropped;
        mt_prof_destroy(&prof);
    }
    mt_backend_destroy(&b);
    return 0;
}

/* ---- the event clock alone ---- */

/* ns per read of the allocator's event clock (the TSC where invariant): every recorded
 * operation reads it once, so two reads per pair are a floor under any recording that
 * stamps each operation. */
static double clock_alone(void)
{
    mt__clock_t c;
    mt__clock_init(&c, true);
    volatile uint64_t sink = 0;
    uint64_t t0 = now_ns();
    for (int i = 0; i < PUSHES; i++)
        sink += mt__clock_now(&c);
    (void)sink;
    return (double)(now_ns() - t0) / PUSHES;
}

/* ---- the ring alone ---- */

/* One thread pushes half a ring at a time (timed), then drains it (not timed): the
 * intrinsic cost of a push, without an allocator or a second core in the way. */
static double push_alone(uint64_t *dropped)
{
    mt__ring_t *ring = NULL;
    const uint32_t slots = 1 << 16;
    if (mt__ring_create(&ring, slots, "bench") != 0)
        return -1;
    mt__ring_unlink(ring);
    reader_t rd = {.ring = ring};
    mt_event_rec_t ev;
    memset(&ev, 0, sizeof(ev));
    ev.kind = MT_EV_ALLOC;
    ev.time_ns = 1;
    uint64_t spent = 0;
    for (int done = 0; done < PUSHES; done += slots / 2) {
        uint64_t t0 = now_ns();
        for (uint32_t i = 0; i < slots / 2; i++) {
            ev.addr = i;
            mt__ring_push(ring, &ev);
        }
        spent += now_ns() - t0;
        while (mt__ring_drain(ring, count_cb, &rd, SIZE_MAX) > 0) {
        }
    }
    mt__ring_stats_t st;
    mt__ring_stats(ring, &st);
    *dropped = st.dropped;
    double ns = (double)spent / (double)st.emitted;
    mt__ring_close(&ring);
    return ns;
}

int main(void)
{
    result_t res[NCFG];
    memset(res, 0, sizeof(res));
    for (int round = 0; round < ROUNDS; round++)
        for (int c = 0; c < NCFG; c++)
            if (run_loop(c, &res[c]) != 0) {
                fprintf(stderr, "bench_prof: setup failed (%s)\n", cfg_names[c]);
                return 1;
            }
    double best_push = 0;
    uint64_t push_drops = 0;
    for (int round = 0; round < ROUNDS; round++) {
        uint64_t d = 0;
        double ns = push_alone(&d);
        if (best_push == 0 || ns < best_push) {
            best_push = ns;
            push_drops = d;
        }
    }

    double best_clock = 0;
    for (int round = 0; round < ROUNDS; round++) {
        double ns = clock_alone();
        if (best_clock == 0 || ns < best_clock)
            best_clock = ns;
    }

    double off = res[CFG_OFF].best_ns_per_pair;
    printf("recording overhead: %d cached alloc+free pairs (8 sizes, sim backend), best of %d "
           "rounds\n\n",
           PAIRS, ROUNDS);
    printf("%-30s %10s %11s %10s %10s %9s   %s\n", "configuration", "ns/pair", "events/pair",
           "overhead", "ns/event", "dropped", "goal");
    printf("%-30s %10.1f %11s %10s %10s %9s   %s\n", cfg_names[CFG_OFF], off, "-", "-", "-", "-",
           "(baseline)");
    for (int c = CFG_NULL; c < NCFG; c++) {
        /* Events of the timed loop only: the round's total minus set-up events. */
        double per_pair = res[c].events ? (double)res[c].events / (PAIRS + 16) : 0;
        double extra = res[c].best_ns_per_pair - off;
        double per_event = per_pair > 0 ? extra / per_pair : 0;
        printf("%-30s %10.1f %11.1f %9.1f%% %10.1f %9llu   %s\n", cfg_names[c],
               res[c].best_ns_per_pair, per_pair, 100 * extra / off, per_event,
               (unsigned long long)res[c].dropped,
               c == CFG_RING   ? "<= 5 %, <= 50 ns/event"
               : c == CFG_NULL ? "(time stamps + event build, no recording)"
                               : "(fallback, informative)");
    }
    printf("%-30s %10s %11s %10s %10.1f %9llu   %s\n", "ring push alone (1 thread)", "-", "1", "-",
           best_push, (unsigned long long)push_drops, "<= 50 ns/event");
    printf("%-30s %10.1f %11s %9.1f%% %10s %9s   %s\n", "event clock, 2 reads alone",
           2 * best_clock, "-", 100 * 2 * best_clock / off, "-", "-",
           "(floor of stamping each operation; 5 % of off is the goal)");
    double extra = res[CFG_RING].best_ns_per_pair - off;
    double per_pair = (double)res[CFG_RING].events / (PAIRS + 16);
    printf(
        "\nverdict (ring): overhead %.1f %% (goal <= 5 %%): %s; %.1f ns/event (goal <= 50): %s\n",
        100 * extra / off, 100 * extra / off <= 5.0 ? "met" : "NOT met",
        per_pair > 0 ? extra / per_pair : 0.0,
        per_pair > 0 && extra / per_pair <= 50.0 ? "met" : "NOT met");
    if (res[CFG_RING].dropped > 0)
        printf("(the ring round shown dropped %llu events: its reader was starved of CPU, a "
               "drop costs less than a record, so that figure is too low; run again)\n",
               (unsigned long long)res[CFG_RING].dropped);
    return 0;
}
