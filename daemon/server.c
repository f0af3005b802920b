/* memtraced: the loop, the listeners, timers, signals and shutdown (connections.c: each
 * connection from accept to close).
 *
 * Every handle the daemon initialises is counted in d->open_handles and uncounted in its
 * close callback, which is also the only place its memory is freed; shutdown closes them
 * all and runs the loop until the count is zero, so uv_loop_close() then succeeds. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "util/log.h"
#include "util/safefile.h"
#include "daemon/internal.h"
#include "memtrace/prof.h"
#include "profiler/internal.h"

/* ---- small utilities ---- */

int mt__d_buf_fail(mt_d_buf_t *b, int rc)
{
    if (!b->err)
        b->err = rc;
    return b->err;
}

void mt__d_buf_clear(mt_d_buf_t *b)
{
    b->len = 0;
    b->err = 0;
}

int mt__d_buf_reserve(mt_d_buf_t *b, size_t extra)
{
    if (b->err)
        return b->err;
    if (extra > SIZE_MAX - 1 - b->len)
        return b->err = MT_EOVERFLOW;
    if (b->len + extra + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2)
            return b->err = MT_EOVERFLOW;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p)
        return b->err = MT_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int mt__d_buf_append(mt_d_buf_t *b, const void *s, size_t n)
{
    int rc = mt__d_buf_reserve(b, n);
    if (rc)
        return rc;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

int mt__d_buf_printf(mt_d_buf_t *b, const char *fmt, ...)
{
    if (b->err)
        return b->err;
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return b->err = MT_EINVAL;
    if ((size_t)n < sizeof tmp)
        return mt__d_buf_append(b, tmp, (size_t)n);
    int rc = mt__d_buf_reserve(b, (size_t)n);
    if (rc)
        return rc;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void mt__d_buf_free(mt_d_buf_t *b)
{
    free(b->p);
    *b = (mt_d_buf_t){0};
}

void mt__d_log(mt_d_t *d, mt_log_level_e level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mt__vlogf(d->cfg.log, d->cfg.log_ud, level, fmt, ap);
    va_end(ap);
}

void mt__d_warn_flush(mt_d_t *d, mt_d_warn_t *w, bool force)
{
    uint64_t since = uv_now(d->loop) - w->last_ms;
    if (w->suppressed == 0 || (!force && since < MT_D_WARN_INTERVAL_MS))
        return;
    mt__d_log(d, MT_LOG_WARN, "%llu more %s in the last %.1f s (logged once per %u s)",
              (unsigned long long)w->suppressed, w->what, (double)since / 1000.0,
              MT_D_WARN_INTERVAL_MS / 1000);
    w->suppressed = 0;
    w->last_ms = uv_now(d->loop);
}

void mt__d_warn(mt_d_t *d, mt_d_warn_t *w, const char *fmt, ...)
{
    uint64_t now = uv_now(d->loop);
    if (w->logged && now - w->last_ms < MT_D_WARN_INTERVAL_MS) {
        w->suppressed++;
        return;
    }
    mt__d_warn_flush(d, w, true);
    va_list ap;
    va_start(ap, fmt);
    mt__vlogf(d->cfg.log, d->cfg.log_ud, MT_LOG_WARN, fmt, ap);
    va_end(ap);
    w->logged = true;
    w->last_ms = now;
}

static uint64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

mt_d_cfg_t mt__d_cfg_default(void)
{
    return (mt_d_cfg_t){
        .socket_path = NULL,
        .http_host = "127.0.0.1",
        .http_port = MT_D_DEFAULT_PORT,
        .log_path = NULL,
        .max_exited = 16,
        .consumer_queue_bytes = 4u << 20,
        .write_high_water = 256u << 10,
        .max_line_bytes = 64u << 10,
        .max_request_bytes = 8u << 10,
        .drain_interval_ms = 5,
        .drain_budget = 4096,
        .keepalive_ms = 15000,
        .idle_timeout_ms = 10000,
        .head_timeout_ms = 5000,
        .max_http_conns = 64,
        .max_http_per_peer = 16,
        .fd_reserve = 64,
        .max_consumers = 64,
        .max_rings_per_proc = 16,
        .max_rings_per_uid = 256,
        .consumer_budget_bytes = 64u << 20,
        .http_auth = true,
        .handle_signals = false,
        .oom_max_snapshots = 8,
        .oom_interval_ms = -1,
    };
}

int mt__d_cfg_from_env(mt_d_cfg_t *cfg)
{
    if (!cfg)
        return MT_EINVAL;
    int rc = mt_prof_socket_path(cfg->default_socket, sizeof cfg->default_socket);
    if (rc != 0)
        cfg->default_socket[0] = '\0';
    if (mt__d_oom_dir(cfg->default_oom_dir, sizeof cfg->default_oom_dir) != 0)
        cfg->default_oom_dir[0] = '\0'; /* no home (or "off"): no OOM snapshots */
    if (cfg->oom_interval_ms < 0) {
        unsigned ms;
        if (mt_prof_oom_interval_ms(&ms) != 0)
            mt__logf(cfg->log, cfg->log_ud, MT_LOG_WARN,
                     "MEMTRACE_OOM_INTERVAL_MS is not a number of ms: using %u", ms);
        cfg->oom_interval_ms = (int)ms;
    }
    return rc;
}

/* The socket when the cfg names none: what mt__d_cfg_from_env resolved, else the default of
 * a process without environment. New string, or NULL. */
static char *default_socket_path(const mt_d_cfg_t *cfg)
{
    char buf[sizeof(((struct sockaddr_un *)0)->sun_path)];
    if (cfg->default_socket[0] != '\0')
        return strndup(cfg->default_socket, sizeof cfg->default_socket);
    return mt__prof_socket_default(buf, sizeof buf) == 0 ? strdup(buf) : NULL;
}

/* Without MEMTRACE_SOCKET and XDG_RUNTIME_DIR the default socket (mt_prof_socket_path)
 * lives in a directory of ours under /tmp: made 0700 here, and refused if another user made
 * it first or opened it up. Told by the path itself, whichever way it was chosen. */
static int default_dir_check(mt_d_t *d)
{
    char dir[64];
    int n = snprintf(dir, sizeof dir, "/tmp/memtrace-%u", (unsigned)geteuid());
    if (strncmp(d->socket_path, dir, (size_t)n) != 0 ||
        strcmp(d->socket_path + n, "/memtrace.sock") != 0)
        return 0;
    int rc = mt__sf_private_dir(dir, true);
    if (rc)
        mt__d_log(d, MT_LOG_ERROR,
                  "%s is not a private directory of uid %u (mode 0700): %s; remove it or set "
                  "XDG_RUNTIME_DIR or --socket",
                  dir, (unsigned)geteuid(), mt_strerror(rc));
    return rc;
}

/* ---- timers ---- */

void mt__d_on_drain_timer(uv_timer_t *t)
{
    mt_d_t *d = t->data;
    mt__d_drain_all(d);
}

void mt__d_on_drain_idle(uv_idle_t *h)
{
    mt_d_t *d = h->data;
    mt__d_drain_all(d);
}

/* Whether c's socket holds bytes we have not read yet. last_active_ms moves only when we
 * read, so after a long turn of the loop (a big drain, a starved CPU) a client that spoke
 * in time looks idle; its unread request says otherwise. */
static bool has_unread(mt_d_conn_t *c)
{
    uv_os_fd_t fd;
    char b;
    return uv_fileno(&c->u.handle, &fd) == 0 && recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

static void on_sweep_timer(uv_timer_t *t)
{
    mt_d_t *d = t->data;
    uint64_t now = uv_now(d->loop);
    for (mt_d_conn_t *c = d->conns, *next; c; c = next) {
        next = c->next;
        if (c->lingering && !c->closing && now - c->linger_ms >= MT_D_LINGER_MS) {
            mt__d_conn_close(c);
            continue;
        }
        bool pending = c->kind == MT_D_CONN_UNIX_NEW || c->kind == MT_D_CONN_HTTP_NEW;
        if (!pending || c->closing)
            continue;
        /* A head trickling in a byte at a time restarts the idle clock, not this one. */
        bool late = c->kind == MT_D_CONN_HTTP_NEW && now - c->accepted_ms >= d->cfg.head_timeout_ms;
        if (late || (now - c->last_active_ms >= d->cfg.idle_timeout_ms && !has_unread(c))) {
            d->ctr.rejected++;
            mt__d_conn_close(c); /* a half request: it had its chance */
        }
    }
    mt__d_warn_flush(d, &d->warn_http, false);
    mt__d_warn_flush(d, &d->warn_unix, false);
    mt__d_warn_flush(d, &d->warn_rings, false);
    if (now - d->last_keepalive_ms >= d->cfg.keepalive_ms) {
        d->last_keepalive_ms = now;
        mt__d_consumers_keepalive(d);
    }
}

/* ---- shutdown ---- */

static void on_handle_closed(uv_handle_t *h)
{
    mt_d_t *d = h->data;
    d->open_handles--;
}

static void close_walk_cb(uv_handle_t *h, void *arg)
{
    mt_d_t *d = arg;
    if (h == (uv_handle_t *)&d->oom_async)
        return; /* closed by mt__d_snapshot_shutdown once the snapshots are written */
    if (!uv_is_closing(h))
        uv_close(h, NULL); /* not ours: only possible on a loop we own, never allocated */
}

static void close_static(mt_d_t *d, uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, on_handle_closed);
}

static void begin_shutdown(mt_d_t *d)
{
    if (d->stopping)
        return;
    /* Whatever is already in the rings is delivered before the consumers go. */
    mt__d_drain_all(d);
    d->stopping = true;
    close_static(d, (uv_handle_t *)&d->unix_listener);
    if (d->http_on)
        close_static(d, (uv_handle_t *)&d->http_listener);
    close_static(d, (uv_handle_t *)&d->drain_timer);
    close_static(d, (uv_handle_t *)&d->drain_idle);
    close_static(d, (uv_handle_t *)&d->sweep_timer);
    close_static(d, (uv_handle_t *)&d->stop_async);
    if (d->cfg.handle_signals) {
        close_static(d, (uv_handle_t *)&d->sigint);
        close_static(d, (uv_handle_t *)&d->sigterm);
    }
    for (mt_d_conn_t *c = d->conns; c; c = c->next)
        mt__d_conn_close(c);
    if (d->socket_bound) {
        unlink(d->socket_path);
        d->socket_bound = false;
    }
    mt__d_logfile_flush(d);
    mt__d_warn_flush(d, &d->warn_http, true);
    mt__d_warn_flush(d, &d->warn_unix, true);
    mt__d_warn_flush(d, &d->warn_rings, true);
    mt__d_snapshot_shutdown(d);
    if (d->owns_loop)
        uv_walk(d->loop, close_walk_cb, d);
}

static void on_stop_async(uv_async_t *a)
{
    begin_shutdown(a->data);
}

static void on_signal(uv_signal_t *s, int signum)
{
    mt_d_t *d = s->data;
    mt__d_log(d, MT_LOG_INFO, "signal %d: shutting down", signum);
    begin_shutdown(d);
}

/* ---- lifecycle ---- */

/* 1 if a daemon answers on path, 0 if not, negative if path is something else. */
static int socket_in_use(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return 0;
    if (!S_ISSOCK(st.st_mode))
        return MT_EINVAL;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return MT_EIO;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    close(fd);
    return rc == 0 ? 1 : 0;
}

static int init_static(mt_d_t *d, uv_handle_t *h)
{
    h->data = d;
    d->open_handles++;
    return 0;
}

static int bind_unix(mt_d_t *d)
{
    if (strlen(d->socket_path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
        return MT_EINVAL;
    int busy = socket_in_use(d->socket_path);
    if (busy < 0) {
        mt__d_log(d, MT_LOG_ERROR, "%s exists and is not a socket", d->socket_path);
        return MT_EBUSY;
    }
    if (busy) {
        mt__d_log(d, MT_LOG_ERROR, "another daemon answers on %s", d->socket_path);
        return MT_EBUSY;
    }
    unlink(d->socket_path); /* stale: its daemon died without removing it */
    int uvrc = uv_pipe_bind(&d->unix_listener, d->socket_path);
    if (uvrc != 0) /* (libuv keeps its own copy of the path) */
        return uvrc == UV_ENOMEM ? MT_ENOMEM : MT_EIO;
    d->socket_bound = true;
    /* Before listen(): nobody can connect until the mode is right. */
    if (chmod(d->socket_path, 0600) != 0)
        return MT_EIO;
    if (uv_listen((uv_stream_t *)&d->unix_listener, 128, mt__d_on_connection) != 0)
        return MT_EIO;
    return 0;
}

static int bind_http(mt_d_t *d)
{
    struct sockaddr_storage ss;
    if (uv_ip4_addr(d->host, d->cfg.http_port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(d->host, d->cfg.http_port, (struct sockaddr_in6 *)&ss) != 0)
        return MT_EINVAL;
    int uvrc = uv_tcp_bind(&d->http_listener, (struct sockaddr *)&ss, 0);
    if (!uvrc)
        uvrc = uv_listen((uv_stream_t *)&d->http_listener, 128, mt__d_on_connection);
    if (uvrc) {
        mt__d_log(d, MT_LOG_ERROR, "cannot listen on HTTP port %s:%d: %s%s", d->host,
                  d->cfg.http_port, uv_strerror(uvrc),
                  uvrc == UV_EADDRINUSE ? " (choose another with --port N, or --port off)" : "");
        return uvrc == UV_EADDRINUSE ? -EADDRINUSE : uvrc == UV_ENOMEM ? MT_ENOMEM : MT_EIO;
    }
    struct sockaddr_storage got;
    int len = sizeof got;
    if (uv_tcp_getsockname(&d->http_listener, (struct sockaddr *)&got, &len) != 0)
        return MT_EIO;
    d->http_port = got.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&got)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&got)->sin_port);
    return 0;
}

/* The HTTP token: the configured one, else the token file beside the socket (kept if it is
 * ours and valid, else made anew). */
static int load_token(mt_d_t *d)
{
    if (!d->cfg.http_auth)
        return 0;
    if (d->cfg.http_token) {
        if (strlen(d->cfg.http_token) < 16 || strlen(d->cfg.http_token) >= sizeof d->token)
            return MT_EINVAL;
        snprintf(d->token, sizeof d->token, "%s", d->cfg.http_token);
        return 0;
    }
    char path[4200];
    int rc = mt__d_token_path(d->socket_path, path, sizeof path);
    if (!rc)
        rc = mt__sf_token_ensure(path, d->token, sizeof d->token);
    if (rc)
        mt__d_log(d, MT_LOG_ERROR, "cannot make the HTTP token file %s: %s", path, mt_strerror(rc));
    return rc;
}

static bool cfg_valid(const mt_d_cfg_t *cfg)
{
    return cfg->http_port >= -1 && cfg->http_port <= 65535 && cfg->consumer_queue_bytes > 0 &&
           cfg->write_high_water > 0 && cfg->max_line_bytes >= 256 &&
           cfg->max_request_bytes >= 256 && cfg->drain_interval_ms > 0 && cfg->drain_budget > 0 &&
           cfg->keepalive_ms > 0 && cfg->idle_timeout_ms > 0 && cfg->head_timeout_ms > 0 &&
           cfg->max_http_conns > 0 && cfg->max_http_per_peer > 0 && cfg->max_consumers > 0 &&
           cfg->max_rings_per_proc > 0 && cfg->max_rings_per_uid > 0 &&
           cfg->consumer_budget_bytes > cfg->write_high_water &&
           (cfg->http_port < 0 || cfg->http_host);
}

int mt__d_create(mt_d_t **out, const mt_d_cfg_t *cfg)
{
    if (!out || !cfg || !cfg_valid(cfg))
        return MT_EINVAL;
    *out = NULL;
    int rc = MT_ENOMEM;
    mt_d_t *d = calloc(1, sizeof *d);
    if (!d)
        return MT_ENOMEM;
    d->cfg = *cfg;
    d->socket_path = cfg->socket_path ? strdup(cfg->socket_path) : default_socket_path(cfg);
    d->host = cfg->http_host ? strdup(cfg->http_host) : NULL;
    d->log_path = cfg->log_path ? strdup(cfg->log_path) : NULL;
    d->readbuf = malloc(MT_D_READ_BUF_SIZE);
    if (!d->socket_path || (cfg->http_host && !d->host) || (cfg->log_path && !d->log_path) ||
        !d->readbuf || mt__d_lines_init(d) != 0)
        goto fail_alloc;
    d->cfg.socket_path = d->socket_path;
    d->cfg.http_host = d->host;
    d->cfg.log_path = d->log_path;
    d->http_port = -1;
    d->start_realtime = realtime_ns();
    d->warn_http.what = "HTTP connections refused";
    d->warn_unix.what = "Unix connections of other users refused";
    d->warn_rings.what = "ring registrations refused";
    mt__d_snapshot_init(d);

    if (cfg->loop) {
        d->loop = cfg->loop;
    } else {
        int uvrc = uv_loop_init(&d->own_loop);
        if (uvrc != 0) {
            rc = uvrc == UV_ENOMEM ? MT_ENOMEM : MT_EIO;
            goto fail_alloc;
        }
        d->loop = &d->own_loop;
        d->owns_loop = true;
    }
    uv_pipe_init(d->loop, &d->unix_listener, 0);
    init_static(d, (uv_handle_t *)&d->unix_listener);
    uv_timer_init(d->loop, &d->drain_timer);
    init_static(d, (uv_handle_t *)&d->drain_timer);
    uv_idle_init(d->loop, &d->drain_idle);
    init_static(d, (uv_handle_t *)&d->drain_idle);
    uv_timer_init(d->loop, &d->sweep_timer);
    init_static(d, (uv_handle_t *)&d->sweep_timer);
    uv_async_init(d->loop, &d->stop_async, on_stop_async);
    init_static(d, (uv_handle_t *)&d->stop_async);
    if (cfg->http_port >= 0) {
        uv_tcp_init(d->loop, &d->http_listener);
        init_static(d, (uv_handle_t *)&d->http_listener);
        d->http_on = true;
    }
    if (cfg->handle_signals) {
        uv_signal_init(d->loop, &d->sigint);
        init_static(d, (uv_handle_t *)&d->sigint);
        uv_signal_init(d->loop, &d->sigterm);
        init_static(d, (uv_handle_t *)&d->sigterm);
        uv_signal_start(&d->sigint, on_signal, SIGINT);
        uv_signal_start(&d->sigterm, on_signal, SIGTERM);
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        d->fd_limit = rl.rlim_cur > UINT32_MAX ? UINT32_MAX : (unsigned)rl.rlim_cur;
    if (!cfg->socket_path && (rc = default_dir_check(d)) != 0)
        goto fail_handles;
    /* The token file before the socket: whoever sees the socket finds the token. */
    if (d->http_on && (rc = load_token(d)) != 0)
        goto fail_handles;
    if ((rc = bind_unix(d)) != 0)
        goto fail_handles;
    if (d->http_on && (rc = bind_http(d)) != 0)
        goto fail_handles;
    if ((rc = mt__d_logfile_open(d)) != 0)
        goto fail_handles;
    uv_timer_start(&d->drain_timer, mt__d_on_drain_timer, cfg->drain_interval_ms,
                   cfg->drain_interval_ms);
    unsigned sweep = cfg->idle_timeout_ms < 1000 ? cfg->idle_timeout_ms : 1000;
    if (cfg->keepalive_ms < sweep)
        sweep = cfg->keepalive_ms;
    uv_timer_start(&d->sweep_timer, on_sweep_timer, sweep, sweep);
    d->last_keepalive_ms = uv_now(d->loop);
    *out = d;
    return 0;

fail_handles:
    mt__d_destroy(&d);
    return rc;
fail_alloc:
    free(d->socket_path);
    free(d->host);
    free(d->log_path);
    free(d->readbuf);
    mt__d_lines_close(d);
    free(d);
    return rc;
}

/* ---- SIGPIPE, per thread ----
 *
 * libuv writes to sockets with write(2), so a consumer that vanishes mid-write raises
 * SIGPIPE in the writing thread. The process's disposition is the program's, not ours:
 * while the loop runs, SIGPIPE is blocked in this thread only, and the ones our writes
 * left pending are taken with sigtimedwait before the thread's mask is put back (the write
 * itself already failed with EPIPE). A SIGPIPE pending before we blocked is left alone. */

typedef struct sigpipe_guard_s {
    sigset_t old;     /* the thread's mask before */
    bool was_pending; /* SIGPIPE was pending (so blocked by the caller) before */
    bool on;          /* pthread_sigmask succeeded: restore must undo it */
} sigpipe_guard_t;

static void sigpipe_block(sigpipe_guard_t *g)
{
    sigset_t pipe_set, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigemptyset(&pending);
    g->was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    g->on = pthread_sigmask(SIG_BLOCK, &pipe_set, &g->old) == 0;
}

static void sigpipe_restore(const sigpipe_guard_t *g)
{
    if (!g->on)
        return;
    if (!g->was_pending) {
        sigset_t pipe_set;
        sigemptyset(&pipe_set);
        sigaddset(&pipe_set, SIGPIPE);
        const struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &zero) == SIGPIPE) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* uv_run with SIGPIPE blocked in this thread (above). */
static void run_loop(uv_loop_t *loop, uv_run_mode mode)
{
    sigpipe_guard_t g;
    sigpipe_block(&g);
    uv_run(loop, mode);
    sigpipe_restore(&g);
}

int mt__d_run(mt_d_t *d)
{
    if (!d || d->stopping)
        return MT_EINVAL;
    run_loop(d->loop, UV_RUN_DEFAULT);
    /* On a borrowed loop other handles may keep uv_run going; ours are closed by now or
     * closing, and finishing them is enough. The OOM snapshots queued are written too. */
    while (d->open_handles > 0 || d->oom_jobs > 0)
        run_loop(d->loop, UV_RUN_ONCE);
    return 0;
}

void mt__d_stop(mt_d_t *d)
{
    if (d)
        uv_async_send(&d->stop_async);
}

void mt__d_destroy(mt_d_t **p)
{
    if (!p || !*p)
        return;
    mt_d_t *d = *p;
    *p = NULL;
    begin_shutdown(d);
    while (d->open_handles > 0 || d->oom_jobs > 0)
        run_loop(d->loop, UV_RUN_ONCE);
    mt__d_lines_close(d);
    mt__d_snapshot_close(d);
    mt__d_logfile_close(d);
    mt__d_procs_free(d);
    if (d->owns_loop) {
        int rc = uv_loop_close(d->loop);
        if (rc != 0)
            mt__d_log(d, MT_LOG_ERROR, "uv_loop_close: %s", uv_strerror(rc));
    }
    mt__d_buf_free(&d->scratch);
    free(d->readbuf);
    free(d->socket_path);
    free(d->host);
    free(d->log_path);
    free(d->diff);
    free(d->jobs);
    free(d);
}

int mt__d_http_port(const mt_d_t *d)
{
    return d->http_on ? d->http_port : -1;
}

const char *mt__d_http_token(const mt_d_t *d)
{
    return d->token;
}

const char *mt__d_socket_path(const mt_d_t *d)
{
    return d->socket_path;
}

void mt__d_counters(const mt_d_t *d, mt_d_counters_t *out)
{
    *out = d->ctr;
    out->live_processes = mt__d_live_count(d);
    out->encoder_cpu_ns = mt__d_lines_cpu_ns(d);
    unsigned n = 0;
    for (const mt_d_proc_t *p = d->procs; p; p = p->next)
        n++;
    out->known_processes = n;
}
