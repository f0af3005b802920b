/* Daemon throughput: events per second from 4 producer processes through the daemon to 2
 * consumers, end to end (ring -> drain -> JSON -> both sockets -> read). Goal: >= 1 M/s.
 *
 * Producers write their rings directly (the profiler's ring and registration client) and
 * wait when their ring is nearly full, so the figure is the daemon's rate without drops;
 * drops, if any, are printed. Consumers count lines.
 *
 * `bench_daemon --drain [rounds [events [set-ups]]]`: the drain alone, one producer's full
 * ring; set-ups a string of indices (0 no log file, 1 log file, 2 log file + 1 consumer, 3
 * binary log file, 4 binary log file + 1 consumer, 5 binary log file + 1 consumer of binary
 * blocks). */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/machine.h"
#include "daemon/daemon.h"
#include "profiler/binlog.h"
#include "profiler/internal.h"

enum { NPROD = 4, NCONS = 2, SLOTS = 1 << 16 };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* `memtrace tail`, when its path is given: consumer 1 is that tool, its stdout a pipe
 * counted as a socket is (it prints no answer line; a gap line counts as one). */
static const char *tail_tool;
static pid_t tail_pid;

typedef struct consumer_s {
    pthread_t th;
    int fd;
    uint64_t want, lines;
    double last;
    bool binary; /* after its answer line, binary blocks: lines counts their event records */
} consumer_t;

/* A binary consumer's stream: the answer line, then blocks; every whole block's events
 * counted in c->lines (the answer counts as one, as a line consumer's does). */
static void *binary_consumer_main(consumer_t *c)
{
    size_t cap = 256u << 20, have = 0, at = 0;
    unsigned char *buf = malloc(cap);
    bool answered = false;
    while (buf != NULL && c->lines < c->want && have < cap) {
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        if (poll(&pfd, 1, 3000) <= 0)
            break;
        ssize_t r = read(c->fd, buf + have, cap - have);
        if (r <= 0)
            break;
        have += (size_t)r;
        c->last = now_s();
        if (!answered) {
            unsigned char *nl = memchr(buf, '\n', have);
            if (nl == NULL)
                continue;
            answered = true;
            at = (size_t)(nl - buf) + 1;
            c->lines++;
        }
        for (;;) { /* whole blocks */
            uint32_t payload, records;
            int32_t pid;
            const char *err;
            if (have - at < MT__BLOG_HDR ||
                mt__blog_header_read(buf + at, &payload, &pid, &records, &err) != 0 ||
                have - at - MT__BLOG_HDR < payload)
                break;
            const unsigned char *p = buf + at + MT__BLOG_HDR, *end = p + payload;
            mt__blog_state_t st = {0};
            mt__blog_rec_t rec;
            while (p < end && mt__blog_next(&st, &p, end, &rec, &err) == 0)
                c->lines += rec.type == MT__BLOG_EVENT;
            at += MT__BLOG_HDR + payload;
        }
    }
    free(buf);
    return NULL;
}

static void *consumer_main(void *arg)
{
    consumer_t *c = arg;
    if (c->binary)
        return binary_consumer_main(c);
    static __thread char buf[1 << 18];
    while (c->lines < c->want) {
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        if (poll(&pfd, 1, 3000) <= 0)
            break; /* nothing for 3 s: whatever was dropped will not come */
        ssize_t r = read(c->fd, buf, sizeof buf);
        if (r <= 0)
            break;
        for (const char *p = buf; (p = memchr(p, '\n', (size_t)(buf + r - p))) != NULL; p++)
            c->lines++;
        c->last = now_s();
    }
    return NULL;
}

static void producer(const char *sock, uint64_t n, double rate, int go_fd)
{
    mt__ring_t *r = NULL;
    int fd = -1;
    char err[256];
    if (mt__ring_create(&r, SLOTS, "bench") != 0 ||
        mt__prof_client_register(sock, r, NULL, 5000, &fd, err, sizeof err) != 0)
        _exit(10);
    mt__ring_unlink(r);
    char c;
    if (read(go_fd, &c, 1) != 1)
        _exit(11);
    const mt__ring_hdr_t *h = mt__ring_header(r);
    double start = now_s();
    mt_event_rec_t ev = {.kind = MT_EV_ALLOC, .size = 4096, .requested = 4000, .pool = 1};
    for (uint64_t i = 0; i < n; i++) {
        /* Offered load: every 256 events, sleep until this producer's schedule. */
        if (rate > 0 && i % 256 == 0) {
            double due = start + (double)i / rate, ahead = due - now_s();
            if (ahead > 0)
                usleep((useconds_t)(ahead * 1e6));
        }
        /* Wait for room rather than drop: the benchmark measures the daemon. */
        while (atomic_load_explicit(&h->claim, memory_order_relaxed) -
                   atomic_load_explicit(&h->read_idx, memory_order_acquire) >=
               SLOTS - 64)
            usleep(100); /* two cores: leave them to the daemon and consumers */
        ev.kind = (uint8_t)(i % 2 ? MT_EV_FREE_COMPLETED : MT_EV_ALLOC);
        ev.addr = 0x7f0000000000u + (i / 2 % 4096) * 4096;
        ev.tag = (uint8_t)(i % 7);
        ev.allocated = i % 2 ? 0 : 4096;
        ev.reserved = 1 << 21;
        if (mt__ring_push(r, &ev) != 0)
            _exit(12);
    }
    mt__ring_set_flags(r, MT_RING_F_EXITED);
    close(fd);
    mt__ring_close(&r);
    _exit(0);
}

static void *run_daemon(void *arg)
{
    (void)pthread_setname_np(pthread_self(), "memtraced-loop"); /* (perf --comm) */
    mt__d_run(arg);
    return NULL;
}

/* ---- the drain alone: one full ring, one producer ---- */

/* events in the full ring, a power of two (the third argument of --drain changes it) */
static uint32_t drain_slots = 1u << 20;

/* The producer of a drain-alone run: fills a ring of drain_slots records (alloc,
 * free_requested, free_completed), registers, and times the daemon until it has taken
 * (and acknowledged, i.e. logged) them all; writes the events per second to out_fd. */
static void drain_producer(const char *sock, int out_fd)
{
    mt__ring_t *r = NULL;
    int fd = -1;
    char err[256];
    if (mt__ring_create(&r, drain_slots, "bench") != 0)
        _exit(10);
    mt_event_rec_t ev = {.pool = 2, .tag = 4, .reserved = 64u << 20};
    static const uint8_t kinds[3] = {MT_EV_ALLOC, MT_EV_FREE_REQUESTED, MT_EV_FREE_COMPLETED};
    for (uint32_t i = 0; i < drain_slots; i++) {
        ev.kind = kinds[i % 3];
        ev.time_ns = 1000000000u + (uint64_t)i * 70;
        ev.addr = 0x7f0000000000u + (uint64_t)(i / 3 % 8) * (2u << 20);
        ev.size = ev.requested = 65536u << (i % 5);
        ev.allocated = ev.kind == MT_EV_FREE_COMPLETED ? 0 : ev.size;
        if (mt__ring_push(r, &ev) != 0)
            _exit(12);
    }
    const mt__ring_hdr_t *h = mt__ring_header(r);
    double t0 = now_s();
    if (mt__prof_client_register(sock, r, NULL, 5000, &fd, err, sizeof err) != 0)
        _exit(11);
    while (atomic_load_explicit(&h->read_idx, memory_order_acquire) < drain_slots)
        usleep(50);
    double rate = drain_slots / (now_s() - t0);
    mt__ring_set_flags(r, MT_RING_F_EXITED);
    if (write(out_fd, &rate, sizeof rate) != sizeof rate)
        _exit(13);
    close(fd);
    mt__ring_close(&r);
    _exit(0);
}

static double thread_cpu_s(pthread_t th)
{
    clockid_t cid;
    struct timespec ts;
    if (pthread_getcpuclockid(th, &cid) != 0 || clock_gettime(cid, &ts) != 0)
        return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The daemon draining one full ring (drain -> model -> JSON -> log file and consumers), with
 * a log file or not and ncons consumers: events per second, or -1; *cpu_ns the daemon
 * thread's CPU time per event (what a loaded machine's other programs do not inflate),
 * *enc_ns its line encoder thread's;
 * *lost the lines the consumers did not get (dropped for reading too slowly). */
static double drain_alone(bool with_log, bool binary, int ncons, bool cons_binary, double *cpu_ns,
                          double *enc_ns, uint64_t *lost)
{
    char dir[] = "/tmp/mt-dbench-XXXXXX";
    char sock[128], logp[128];
    if (!mkdtemp(dir))
        return -1;
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(logp, sizeof logp, "%s/d.%s", dir, binary ? "mtlog" : "ndjson");
    uv_loop_t loop;
    uv_loop_init(&loop);
    mt_d_cfg_t cfg = mt__d_cfg_default();
    cfg.socket_path = sock;
    cfg.http_port = -1;
    cfg.loop = &loop;
    cfg.log_path = with_log ? logp : NULL;
    mt_d_t *d = NULL;
    if (mt__d_create(&d, &cfg) != 0)
        return -1;
    pthread_t dth;
    pthread_create(&dth, NULL, run_daemon, d);
    consumer_t cons[NCONS];
    for (int i = 0; i < ncons && i < NCONS; i++) {
        static const char sub[] = "{\"type\":\"subscribe\",\"role\":\"consumer\"}\n";
        static const char sub_bin[] =
            "{\"type\":\"subscribe\",\"role\":\"consumer\",\"format\":\"binary\"}\n";
        memset(&cons[i], 0, sizeof cons[i]);
        cons[i].want = drain_slots + 1;
        cons[i].binary = cons_binary;
        if (mt__d_client_connect(sock, &cons[i].fd) != 0 ||
            mt__d_client_send(cons[i].fd, cons_binary ? sub_bin : sub,
                              cons_binary ? sizeof sub_bin - 1 : sizeof sub - 1) != 0)
            return -1;
        pthread_create(&cons[i].th, NULL, consumer_main, &cons[i]);
    }
    int out[2];
    double rate = -1;
    if (pipe(out) != 0)
        return -1;
    fflush(NULL);
    usleep(20000); /* the daemon thread has started and settled */
    double c0 = thread_cpu_s(dth);
    pid_t pid = fork();
    if (pid == 0)
        drain_producer(sock, out[1]);
    if (read(out[0], &rate, sizeof rate) != sizeof rate)
        rate = -1;
    *cpu_ns = (thread_cpu_s(dth) - c0) * 1e9 / drain_slots;
    *lost = 0;
    int st;
    waitpid(pid, &st, 0);
    for (int i = 0; i < ncons && i < NCONS; i++) {
        pthread_join(cons[i].th, NULL);
        close(cons[i].fd);
        if (cons[i].lines < drain_slots + 1)
            *lost += drain_slots + 1 - cons[i].lines;
    }
    mt__d_stop(d);
    pthread_join(dth, NULL);
    mt_d_counters_t ctr;
    mt__d_counters(d, &ctr);
    *enc_ns = (double)ctr.encoder_cpu_ns / drain_slots;
    mt__d_destroy(&d);
    if (uv_loop_close(&loop) != 0)
        rate = -1;
    close(out[0]);
    close(out[1]);
    unlink(logp);
    rmdir(dir);
    return !WIFEXITED(st) || WEXITSTATUS(st) != 0 ? -1 : rate;
}

typedef struct result_s {
    double offered;   /* events/s asked of the producers, 0 = as fast as they can */
    double drained;   /* events/s taken from the rings */
    double delivered; /* events/s received by the slower consumer */
    uint64_t lines;   /* events received by the slower consumer */
    uint64_t events, producer_drops, consumer_drops;
    int failed;
} result_t;

static void run(uint64_t per, double offered, result_t *res)
{
    memset(res, 0, sizeof *res);
    res->offered = offered;
    char dir[] = "/tmp/mt-dbench-XXXXXX";
    char sock[128];
    if (!mkdtemp(dir)) {
        res->failed = 1;
        return;
    }
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    uv_loop_t loop;
    uv_loop_init(&loop);
    mt_d_cfg_t cfg = mt__d_cfg_default();
    cfg.socket_path = sock;
    cfg.http_port = -1;
    cfg.loop = &loop;
    mt_d_t *d = NULL;
    if (mt__d_create(&d, &cfg) != 0) {
        res->failed = 1;
        return;
    }
    pthread_t dth;
    pthread_create(&dth, NULL, run_daemon, d);

    consumer_t cons[NCONS];
    for (int i = 0; i < NCONS; i++) {
        memset(&cons[i], 0, sizeof cons[i]);
        cons[i].want = NPROD * per + 1; /* + the {"ok":true} line */
        if (i == 1 && tail_tool != NULL) {
            int p[2];
            if (pipe(p) != 0) {
                res->failed = 1;
                continue;
            }
            fflush(NULL);
            tail_pid = fork();
            if (tail_pid == 0) {
                dup2(p[1], 1);
                close(p[0]);
                close(p[1]);
                execl(tail_tool, tail_tool, "tail", "--socket", sock, (char *)NULL);
                _exit(127);
            }
            close(p[1]);
            cons[i].fd = p[0];
            cons[i].lines = 1; /* as if it had printed the answer line */
            continue;
        }
        static const char sub[] = "{\"type\":\"subscribe\",\"role\":\"consumer\"}\n";
        if (mt__d_client_connect(sock, &cons[i].fd) != 0 ||
            mt__d_client_send(cons[i].fd, sub, sizeof sub - 1) != 0)
            res->failed = 1;
    }
    int go[2];
    if (pipe(go) != 0)
        res->failed = 1;
    pid_t pids[NPROD];
    for (int i = 0; i < NPROD; i++) {
        fflush(NULL);
        pids[i] = fork();
        if (pids[i] == 0)
            producer(sock, per, offered / NPROD, go[0]);
    }
    usleep(200000); /* let every producer register */
    for (int i = 0; i < NCONS; i++)
        pthread_create(&cons[i].th, NULL, consumer_main, &cons[i]);
    double t0 = now_s();
    char gobuf[NPROD] = {0};
    if (write(go[1], gobuf, NPROD) != NPROD)
        res->failed = 1;
    for (int i = 0; i < NPROD; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        res->failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    double t_prod = now_s();
    double t1 = t0;
    res->lines = UINT64_MAX;
    for (int i = 0; i < NCONS; i++) {
        pthread_join(cons[i].th, NULL);
        close(cons[i].fd);
        if (cons[i].last > t1)
            t1 = cons[i].last;
        if (cons[i].lines - 1 < res->lines)
            res->lines = cons[i].lines - 1;
    }
    if (tail_tool != NULL && tail_pid > 0) {
        kill(tail_pid, SIGTERM);
        waitpid(tail_pid, NULL, 0);
    }
    mt__d_stop(d);
    pthread_join(dth, NULL);
    mt_d_counters_t ctr;
    mt__d_counters(d, &ctr);
    mt__d_destroy(&d);
    res->failed |= uv_loop_close(&loop) != 0;
    close(go[0]);
    close(go[1]);
    rmdir(dir);
    res->events = ctr.events;
    res->producer_drops = ctr.producer_drops;
    res->consumer_drops = ctr.consumer_drops;
    /* The producers end when their last event is in a ring; the daemon drains it at once
     * or on their EOF, so the producers' end bounds the drain time closely. */
    res->drained = (double)ctr.events / (t_prod - t0);
    res->delivered = (double)res->lines / (t1 - t0);
    res->failed |= ctr.events != (uint64_t)NPROD * per;
}

int main(int argc, char **argv)
{
    uint64_t per = argc > 1 ? strtoull(argv[1], NULL, 10) : 250000;
    double paced = argc > 2 ? strtod(argv[2], NULL) : 1.2e6;
    tail_tool = argc > 3 ? argv[3] : NULL; /* the memtrace tool: consumer 1 is its `tail` */
    result_t r[2];
    mt_bench_print_machine(stdout);
    if (argc > 1 && strcmp(argv[1], "--drain") == 0) {
        /* the drain alone, rounds alternating the set-ups, best of each */
        int rounds = argc > 2 ? atoi(argv[2]) : 3;
        if (argc > 3)
            drain_slots = (uint32_t)strtoul(argv[3], NULL, 10);
        /* the set-ups to run, by index ("1": the log file alone, for a profile) */
        const char *only = argc > 4 ? argv[4] : "012345";
        static const struct {
            const char *name;
            bool log, bin;
            int ncons;
            bool cons_bin;
        } setups[] = {{"no log file, no consumer", false, false, 0, false},
                      {"log file", true, false, 0, false},
                      {"log file + 1 consumer", true, false, 1, false},
                      {"binary log file", true, true, 0, false},
                      {"binary log + 1 consumer", true, true, 1, false},
                      {"binary log + binary cons.", true, true, 1, true}};
        enum { NSET = 6 };
        double best[NSET] = {0}, cpu[NSET] = {0}, enc[NSET] = {0};
        uint64_t lost[NSET] = {0};
        for (int round = 0; round < rounds; round++)
            for (int k = 0; k < NSET; k++) {
                if (!strchr(only, '0' + k))
                    continue;
                double c = 0, e = 0;
                uint64_t l = 0;
                double v = drain_alone(setups[k].log, setups[k].bin, setups[k].ncons,
                                       setups[k].cons_bin, &c, &e, &l);
                if (v > best[k]) {
                    best[k] = v;
                    lost[k] = l;
                }
                if (v > 0 && (cpu[k] == 0 || c < cpu[k]))
                    cpu[k] = c;
                if (v > 0 && (enc[k] == 0 || e < enc[k]))
                    enc[k] = e;
                /* every run, for A/B alternation across builds */
                printf("run %d set-up %d: %.0f ev/s, daemon %.1f ns/ev, encoder %.1f ns/ev\n",
                       round, k, v, c, e);
            }
        printf("daemon drain alone: one producer's full ring of %d events (alloc, "
               "free_requested, free_completed), best of %d rounds\n\n",
               drain_slots, rounds);
        printf("| %-26s | %13s | %16s | %19s | %11s | %12s | %22s |\n", "set-up", "drained ev/s",
               "daemon CPU ns/ev", "ev/s per CPU second", "encoder ns", "consumer lost", "goal");
        printf("|----------------------------|---------------|------------------|-----------------"
               "----|-------------|--------------|------------------------|\n");
        for (int k = 0; k < NSET; k++)
            if (strchr(only, '0' + k))
                printf("| %-26s | %13.0f | %16.1f | %19.0f | %11.1f | %12" PRIu64 " | %22s |\n",
                       setups[k].name, best[k], cpu[k], cpu[k] > 0 ? 1e9 / cpu[k] : 0, enc[k],
                       lost[k], ">= 10 M/s per producer");
        for (int k = 0; k < NSET; k++)
            if (strchr(only, '0' + k) && best[k] <= 0)
                return 1;
        return 0;
    }
    run(per, 0, &r[0]);
    run(per, paced, &r[1]);
    printf("daemon throughput: %d producer processes -> memtraced -> %d Unix consumers%s, "
           "%" PRIu64 " events per producer (machine: %ld cores)\n\n",
           NPROD, NCONS, tail_tool != NULL ? " (the slower may be `memtrace tail`)" : "", per,
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("| %-22s | %14s | %16s | %13s | %14s |\n", "offered load (ev/s)", "drained ev/s",
           "delivered ev/s", "dropped", "goal");
    printf("|------------------------|----------------|------------------|---------------|"
           "----------------|\n");
    for (int i = 0; i < 2; i++) {
        char off[32];
        if (r[i].offered > 0)
            snprintf(off, sizeof off, "%.0f", r[i].offered);
        else
            snprintf(off, sizeof off, "unpaced");
        printf("| %-22s | %14.0f | %16.0f | %13" PRIu64 " | %14s |\n", off, r[i].drained,
               r[i].delivered, r[i].consumer_drops + r[i].producer_drops,
               i == 0 ? ">= 1000000" : ">=1M, 0 drops");
    }
    printf("\n(delivered = events received by the slower consumer per second; dropped = "
           "events a consumer's queue lost because it read too slowly, plus ring drops)\n");
    bool met = r[0].drained >= 1e6 && r[1].delivered >= 1e6 && r[1].consumer_drops == 0 &&
               r[1].producer_drops == 0;
    printf("goal %s\n", met ? "met" : "NOT met");
    return r[0].failed || r[1].failed ? 1 : 0;
}
