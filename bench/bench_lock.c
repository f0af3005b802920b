/* The allocator's lock and its bias (docs/allocator-locking.md): a loop of mallocs and frees
 * that the thread caches do not serve (sizes drawn from 0.5-64 KiB, 16 live, each thread on
 * a stream of its own), so that every operation takes the global path and its lock, with
 * lock_bias on and off in alternation (best of the rounds each):
 *   - one thread (CPU ns/op);
 *   - one thread while another reads the statistics every millisecond, taking the lock
 *     (the bias is revoked and won back again);
 *   - two threads at once (wall ns/op of both together: one op of either).
 * The same loop through glibc's and mimalloc's malloc/free on one thread is the anchor.
 * `bench_lock [rounds]`. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "analysis/replay.h"
#include "bench/machine.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"

enum { OPS = 2000000, LIVE = 16, ROUNDS = 5 };

static size_t sizes[OPS];

typedef struct run_s {
    mt_alloc_t *a;
    mt_backend_t *b;
    const mt_host_alloc_t *h; /* the anchor's, when a == NULL */
    atomic_int *stop;         /* the reader's */
    uint64_t cpu;             /* the loop's thread CPU time */
    int rc;
} run_t;

/* One pass of the loop: 2 x OPS operations (a free, if the slot is taken, then a malloc). */
static void *loop(void *arg)
{
    run_t *r = arg;
    mt_stream_t *s = NULL;
    if (r->a != NULL && (r->rc = mt_stream_create(r->b, &s)) != 0)
        return NULL;
    void *live[LIVE] = {0};
    uint64_t t0 = mt_bench_thread_cpu_ns();
    for (size_t i = 0; i < OPS; i++) {
        void **p = &live[i % LIVE];
        if (r->a == NULL) {
            if (*p != NULL)
                r->h->free(*p);
            *p = r->h->alloc(sizes[i]);
        } else {
            if (*p != NULL)
                mt_alloc_free(r->a, *p);
            if ((r->rc = mt_alloc_malloc(r->a, sizes[i], s, 0, p)) != 0)
                return NULL;
        }
    }
    r->cpu = mt_bench_thread_cpu_ns() - t0;
    for (int k = 0; k < LIVE; k++) {
        if (r->a == NULL && live[k] != NULL)
            r->h->free(live[k]);
        else if (live[k] != NULL)
            mt_alloc_free(r->a, live[k]);
    }
    if (s != NULL)
        mt_stream_destroy(r->b, &s);
    return NULL;
}

static void *reader(void *arg)
{
    run_t *r = arg;
    while (!atomic_load(r->stop)) {
        mt_alloc_stats_t st;
        (void)mt_alloc_stats(r->a, &st);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

enum { M_ONE, M_READER, M_TWO, M_N };

/* One measurement: mode m with lock_bias on or off; ns per operation (CPU of the loop's
 * thread for M_ONE and M_READER, wall for M_TWO), or a negative on failure. */
static double measure(int m, bool bias)
{
    mt_backend_cfg_t bc = mt_backend_cfg_default();
    bc.kind = MT_BACKEND_SIM;
    bc.sim_malloc_cost_ns = bc.sim_free_cost_ns = 0;
    mt_backend_t *b = NULL;
    mt_alloc_t *a = NULL;
    if (mt_backend_create(&b, &bc) != 0)
        return -1;
    mt_alloc_cfg_t ac = mt_alloc_cfg_default();
    ac.backend = b;
    ac.lock_bias = bias;
    double ns = -1;
    if (mt_alloc_create(&a, &ac) != 0)
        goto fail_alloc;
    atomic_int stop = 0;
    run_t r[2] = {{.a = a, .b = b, .stop = &stop}, {.a = a, .b = b, .stop = &stop}};
    pthread_t th[2];
    if (m == M_ONE) {
        loop(&r[0]);
        ns = r[0].rc ? -1 : (double)r[0].cpu / (2.0 * OPS);
    } else if (m == M_READER) {
        if (pthread_create(&th[1], NULL, reader, &r[1]) != 0)
            goto fail_run;
        loop(&r[0]);
        atomic_store(&stop, 1);
        pthread_join(th[1], NULL);
        ns = r[0].rc ? -1 : (double)r[0].cpu / (2.0 * OPS);
    } else {
        uint64_t t0 = mt_bench_now_ns();
        int n = 0;
        for (; n < 2 && pthread_create(&th[n], NULL, loop, &r[n]) == 0; n++)
            ;
        for (int i = 0; i < n; i++)
            pthread_join(th[i], NULL);
        if (n == 2 && r[0].rc == 0 && r[1].rc == 0)
            ns = (double)(mt_bench_now_ns() - t0) / (4.0 * OPS);
    }
fail_run:
    mt_alloc_destroy(&a);
fail_alloc:
    mt_backend_destroy(&b);
    return ns;
}

static double anchor(int which, const char **name)
{
    mt_host_alloc_t h;
    mt__host_alloc_load(&h, which);
    *name = h.name;
    if (h.alloc == NULL)
        return -1;
    run_t r = {.h = &h};
    loop(&r);
    return (double)r.cpu / (2.0 * OPS);
}

static const char *const mode_name[M_N] = {"1 thread", "1 thread, stats read every 1 ms",
                                           "2 threads (wall, per op of either)"};

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : ROUNDS;
    if (rounds < 1)
        rounds = ROUNDS;
    uint32_t seed = 12345;
    for (size_t i = 0; i < OPS; i++) {
        seed = seed * 1103515245u + 12345u;
        sizes[i] = 512 + (seed >> 8) % (64 * 1024);
    }
    mt_bench_print_machine(stdout);
    printf("the allocator's lock: %d malloc+free pairs that take the global path (sizes "
           "0.5-64 KiB, 16 live), lock_bias on and off alternated, best of %d rounds\n\n",
           OPS, rounds);
    double best[M_N][2];
    for (int m = 0; m < M_N; m++)
        best[m][0] = best[m][1] = -1;
    for (int round = 0; round < rounds; round++)
        for (int m = 0; m < M_N; m++)
            for (int on = 1; on >= 0; on--) {
                double ns = measure(m, on);
                if (ns < 0) {
                    fprintf(stderr, "bench_lock: %s, lock_bias %d: the run failed\n", mode_name[m],
                            on);
                    return 1;
                }
                if (best[m][on] < 0 || ns < best[m][on])
                    best[m][on] = ns;
            }
    printf("%-36s %14s %14s %8s\n", "configuration", "lock_bias:1", "lock_bias:0", "1 / 0");
    for (int m = 0; m < M_N; m++)
        printf("%-36s %11.1f ns %11.1f ns %7.2fx\n", mode_name[m], best[m][1], best[m][0],
               best[m][1] / best[m][0]);
    printf("\nanchor, the same loop on 1 thread (best of %d):\n", rounds);
    for (int which = 0; which < MT_HOST_N; which++) {
        const char *name = NULL;
        double b = -1;
        for (int round = 0; round < rounds; round++) {
            double ns = anchor(which, &name);
            if (ns >= 0 && (b < 0 || ns < b))
                b = ns;
        }
        if (b < 0)
            printf("%-36s %14s\n", name ? name : "?", "not loaded");
        else
            printf("%-36s %11.1f ns\n", name, b);
    }
    return 0;
}
