/* An instrumented program for the web tests and the web benchmark: a caching allocator on
 * the sim backend, with a pinned host cache, recording to the daemon at SOCKET.
 *
 *   web_producer SOCKET SECONDS [EVENTS_PER_S [HOLD_S [OOMS]]]
 *
 * It registers a user tag ("activations_user"), keeps some long-lived blocks, and churns
 * tagged allocations (about EVENTS_PER_S events a second, default 2000) for SECONDS,
 * asks OOMS times (default 0) for more than the device has (each an OOM it survives),
 * waits until the daemon has read every event it recorded and then says "holding" on
 * stdout (after "scope web_step peak BYTES": a named scope and a setting changed at run
 * time, for the page's analysis panels), holds its blocks still for HOLD_S seconds (default 0:
 * figures that stop moving, for exact comparisons: a test waits for that line, never for a time),
 * then frees everything and exits 0. Any failure exits 1 with a message.
 * It takes its rank and job from the environment as a launched rank does (RANK, MEMTRACE_JOB,
 * ...: mt_prof_cfg_from_env), and WEB_PRODUCER_EXTRA_MB=N holds N MiB more (tag weights)
 * from the start: the rank of a job that needs more than the others.
 * Outside the allocator (docs/outside.md): the sim device's context comes from
 * MEMTRACE_SIM_CONTEXT (mt_backend_cfg_from_env); WEB_PRODUCER_OUTSIDE_MB=N takes N MiB from
 * the backend as a library would, reported as "libfakenccl.so" (mt_alloc_note_outside), and
 * WEB_PRODUCER_UNSEEN_MB=N takes N MiB that nobody reports (the "not seen" part); both from
 * the start until the end. */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>

#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "memtrace/host.h"
#include "memtrace/prof.h"

#define KEEP 24

static void die(const char *what, int rc)
{
    fprintf(stderr, "web_producer: %s: %s\n", what, mt_strerror(rc));
    exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Returns once the consumer (the daemon) has read every event recorded so far: from then
 * on its figures for us are final until we record again. Polls, asking for a drain each
 * time; gives up (exit 1) after 60 s, which no load of a test machine comes near. */
static void wait_delivered(mt_prof_t *prof)
{
    double t0 = now_s();
    for (;;) {
        mt_prof_stats_t st;
        mt_prof_stats(prof, &st);
        if (st.delivered + st.lost >= st.emitted - st.dropped)
            return;
        if (now_s() - t0 > 60)
            die("the daemon did not read our events in 60 s", MT_EAGAIN);
        mt_prof_flush(prof);
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* N MiB from the environment variable name, in bytes; 0 when unset or not positive. */
static size_t env_mb(const char *name)
{
    const char *v = getenv(name);
    return v && atoi(v) > 0 ? (size_t)atoi(v) << 20 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: web_producer SOCKET SECONDS [EVENTS_PER_S [HOLD_S [OOMS]]]\n");
        return 2;
    }
    double seconds = atof(argv[2]);
    double rate = argc > 3 ? atof(argv[3]) : 2000;
    double hold = argc > 4 ? atof(argv[4]) : 0;
    int ooms = argc > 5 ? atoi(argv[5]) : 0;
    int rc;
    mt_backend_cfg_t bcfg = mt_backend_cfg_default();
    char berr[256];
    if ((rc = mt_backend_cfg_from_env(&bcfg, berr, sizeof berr)) != 0)
        die(berr, rc);
    bcfg.kind = MT_BACKEND_SIM;
    mt_backend_t *b = NULL;
    if ((rc = mt_backend_create(&b, &bcfg)) != 0)
        die("backend", rc);
    mt_prof_cfg_t pcfg = mt_prof_cfg_default();
    if ((rc = mt_prof_cfg_from_env(&pcfg)) != 0)
        die("profiler settings from the environment", rc);
    pcfg.mode = MT_PROF_DAEMON;
    pcfg.socket = argv[1];
    pcfg.name = "web_producer";
    mt_prof_t *prof = NULL;
    if ((rc = mt_prof_create(&prof, &pcfg)) != 0)
        die("profiler (is the daemon running?)", rc);
    mt_alloc_cfg_t acfg = mt_alloc_cfg_default();
    acfg.backend = b;
    acfg.sink = mt_prof_sink(prof);
    mt_alloc_t *a = NULL;
    if ((rc = mt_alloc_create(&a, &acfg)) != 0)
        die("allocator", rc);
    mt_host_cfg_t hcfg = mt_host_cfg_default();
    hcfg.backend = b;
    hcfg.capacity = 64u << 20;
    hcfg.sink = mt_prof_sink(prof);
    mt_host_cache_t *h = NULL;
    if ((rc = mt_host_cache_create(&h, &hcfg)) != 0)
        die("host cache", rc);
    int user = 0;
    if ((rc = mt_alloc_tag_register(a, "activations_user", &user)) != 0)
        die("tag", rc);
    void *w = NULL, *hp = NULL;
    if ((rc = mt_alloc_malloc(a, 6u << 20, NULL, MT_TAG_WEIGHTS, &w)) != 0)
        die("malloc weights", rc);
    if ((rc = mt_host_malloc(h, 3u << 20, MT_TAG_BATCH, &hp)) != 0)
        die("host malloc", rc);
    const char *extra_mb = getenv("WEB_PRODUCER_EXTRA_MB");
    void *extra = NULL;
    if (extra_mb && atoi(extra_mb) > 0 &&
        (rc = mt_alloc_malloc(a, (size_t)atoi(extra_mb) << 20, NULL, MT_TAG_WEIGHTS, &extra)) != 0)
        die("malloc extra", rc);
    size_t outside = env_mb("WEB_PRODUCER_OUTSIDE_MB"), unseen = env_mb("WEB_PRODUCER_UNSEEN_MB");
    void *lib = NULL, *quiet = NULL;
    if (outside &&
        ((rc = mt_backend_malloc(b, outside, &lib)) != 0 ||
         (rc = mt_alloc_note_outside(a, false, (uintptr_t)lib, outside, "libfakenccl.so")) != 0))
        die("outside allocation", rc);
    if (unseen && (rc = mt_backend_malloc(b, unseen, &quiet)) != 0)
        die("unreported allocation", rc);
    void *keep[KEEP] = {0};
    const int tags[] = {MT_TAG_ACTIVATIONS, MT_TAG_GRADS, MT_TAG_WORKSPACE, user};
    unsigned long i = 0;
    double t0 = now_s(), events = 0;
    while (now_s() - t0 < seconds) {
        unsigned k = (unsigned)(i % KEEP);
        if (keep[k]) {
            if ((rc = mt_alloc_free(a, keep[k])) != 0)
                die("free", rc);
            events += 2; /* free_requested, free_completed */
        }
        size_t size = (size_t)(1 + (i * 7919) % 61) << 14; /* 16 KiB .. ~1 MiB */
        if (i % 5 == 0)
            size <<= 3; /* some large-pool blocks */
        if ((rc = mt_alloc_malloc(a, size, NULL, tags[i % 4], &keep[k])) != 0)
            die("malloc", rc);
        events += 1;
        i++;
        /* Pace: sleep when ahead of the rate. */
        double ahead = events / rate - (now_s() - t0);
        if (ahead > 0.002) {
            struct timespec ts = {0, (long)(ahead * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
    for (int k = 0; k < ooms; k++) {
        void *big = NULL;
        if ((rc = mt_alloc_malloc(a, (size_t)1 << 44, NULL, MT_TAG_ACTIVATIONS, &big)) != MT_ENOMEM)
            die("an allocation past the device's capacity did not fail", rc);
    }
    /* A named scope (2 MiB allocated and freed inside it: a temporary block too) and a
     * setting changed at run time, for the page's panels; the scope's peak as the
     * allocator counts it is said for the test to compare. */
    void *s1 = NULL;
    mt_alloc_scope_stats_t ss;
    char err[160];
    if ((rc = mt_alloc_stats_push(a, "web_step")) != 0)
        die("stats push", rc);
    if ((rc = mt_alloc_malloc(a, 2u << 20, NULL, MT_TAG_WORKSPACE, &s1)) != 0)
        die("malloc in the scope", rc);
    if ((rc = mt_alloc_free(a, s1)) != 0)
        die("free in the scope", rc);
    if ((rc = mt_alloc_stats_pop(a, &ss)) != 0)
        die("stats pop", rc);
    if ((rc = mt_alloc_set_settings(a, "max_split_size_mb:64", err, sizeof err)) != 0)
        die(err, rc);
    printf("scope web_step peak %lld\n", (long long)ss.peak_bytes);
    wait_delivered(prof);
    printf("holding\n");
    fflush(stdout);
    if (hold > 0) {
        struct timespec ts = {(time_t)hold, (long)((hold - (double)(time_t)hold) * 1e9)};
        nanosleep(&ts, NULL);
    }
    for (unsigned k = 0; k < KEEP; k++)
        if (keep[k])
            mt_alloc_free(a, keep[k]);
    mt_host_free(h, hp);
    mt_alloc_free(a, w);
    if (extra)
        mt_alloc_free(a, extra);
    if (lib && (mt_alloc_note_outside(a, true, (uintptr_t)lib, outside, "libfakenccl.so") != 0 ||
                mt_backend_free(b, lib) != 0))
        die("outside free", MT_EINVAL);
    if (quiet)
        mt_backend_free(b, quiet);
    mt_host_cache_destroy(&h);
    mt_alloc_destroy(&a);
    mt_prof_destroy(&prof);
    mt_backend_destroy(&b);
    return 0;
}
