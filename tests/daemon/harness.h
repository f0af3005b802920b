/* Shared helpers of the daemon tests: an in-process daemon on its own loop and thread,
 * producer processes (fork + the profiler's registration), consumers and HTTP requests
 * over plain blocking sockets. Every helper asserts (CMocka) on failure. */
#ifndef MT_TESTS_DAEMON_HARNESS_H
#define MT_TESTS_DAEMON_HARNESS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/daemon.h"
#include "memtrace/prof.h"

typedef struct th_daemon_s {
    uv_loop_t loop;
    mt_d_t *d;
    pthread_t thread;
    char dir[64];   /* temp directory holding the socket */
    char sock[128]; /* socket path */
    int port;       /* HTTP port (ephemeral) */
} th_daemon_t;

/* The HTTP token of th_cfg()'s daemons, and the request headers that pass its checks. */
#define TH_TOKEN "0123456789abcdef0123456789abcdef"
#define TH_HDRS  "Host: 127.0.0.1\r\nAuthorization: Bearer " TH_TOKEN "\r\n"

/* A test configuration: temp socket, ephemeral port, short idle timeout, token TH_TOKEN. */
mt_d_cfg_t th_cfg(void);
/* Creates the daemon with cfg (socket_path, http_port and loop are filled in) and runs it
 * on a new thread. */
void th_daemon_start(th_daemon_t *t, mt_d_cfg_t cfg);
/* th_daemon_start in two steps: the daemon created (to load logs into, say), then run. */
void th_daemon_create(th_daemon_t *t, mt_d_cfg_t cfg);
void th_daemon_run(th_daemon_t *t);
/* Stops it, joins the thread, destroys it, asserts uv_loop_close() == 0 and that the
 * socket file is gone. */
void th_daemon_stop(th_daemon_t *t);

/* The daemon in a child process of its own, with its signal handling on (SIGTERM stops it
 * cleanly) and, if log is not NULL, an NDJSON log; HTTP off. Returns once its socket is
 * bound. The child exits 0 only if mt__d_run returned 0 and uv_loop_close succeeded. */
pid_t th_daemon_child(const char *sock, const char *log);

/* Forks a producer: registers with the daemon at sock through mt_prof_create (daemon
 * mode, a ring of `slots` events), records n events (alloc/free_completed pairs cycling
 * over the tags), in bursts of `burst` with a short pause between, then:
 * if stop_fd < 0, exits cleanly (mt_prof_destroy); otherwise writes one byte to stop_fd
 * and waits to be killed. Returns the child's pid. */
pid_t th_producer(const char *sock, unsigned n, unsigned slots, unsigned burst, int stop_fd);
/* th_producer runs the producer in a fresh exec of the test binary: every test main using
 * th_producer calls this first, with its own arguments; it does not return in a producer. */
void th_producer_dispatch(int argc, char **argv);
/* Forks a child that execs this test binary again as `--th-role ROLE ARGS...` (up to 5
 * args, NULL-terminated if fewer): a fresh process, not a fork of one running threads.
 * Returns its pid. */
pid_t th_spawn(const char *role, const char *const args[5]);
/* A profiler that records through the daemon at sock under name (mode MT_PROF_DAEMON);
 * mt_prof_create's return. */
int th_prof_open(const char *sock, const char *name, mt_prof_t **out);
/* In main: the role this process was spawned with (its args in *args), or NULL. */
const char *th_role(int argc, char **argv, char ***args);
/* Waits for pid to exit; returns its wait status. */
int th_wait(pid_t pid);
/* th_wait with a deadline: a child still running after timeout_ms is killed and the test
 * fails, naming what it was waiting for. */
int th_wait_within(pid_t pid, int timeout_ms, const char *what);

/* Connects a consumer and subscribes with the given filter members (a JSON fragment like
 * "\"pid\":[12]" or ""); asserts the {"ok":true} answer. Returns the fd. */
int th_consumer(const char *sock, const char *filter);

typedef struct th_count_s {
    uint64_t events; /* "type":"event" lines */
    uint64_t lost;   /* sum of "lost" over "type":"gap" lines */
    unsigned gaps;   /* gap lines */
    int pids[16];
    uint64_t per_pid[16];
    unsigned npids;
    bool bad_line; /* a line that is not a JSON object */
} th_count_t;

/* Reads lines from fd until events + lost >= want or timeout_ms passes. */
void th_consume(int fd, uint64_t want, int timeout_ms, th_count_t *c);
uint64_t th_count_of(const th_count_t *c, int pid);

/* Sends raw bytes to 127.0.0.1:port and reads the answer until EOF (the daemon closes
 * every HTTP connection). Returns the status code (0 if none) and the whole answer in
 * *out (new). */
int th_http_raw(int port, const char *request, size_t len, char **out);
int th_http_get(int port, const char *path, char **out);
/* Body of an HTTP answer (borrowed, inside resp). */
const char *th_http_body(const char *resp);

/* The daemon's /state as parsed JSON (json_t *, new), via the Unix socket. */
void *th_state(const char *sock);
/* Polls the state until process pid has exited (or timeout); returns its JSON object
 * (new) or NULL. */
void *th_wait_exited(const char *sock, int pid, int timeout_ms);

uint64_t th_now_ms(void);

#endif
