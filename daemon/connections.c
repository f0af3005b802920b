/* memtraced's connections (internal.h): accept and admission (peer credentials, HTTP's
 * caps), reads and their dispatch by kind, the Unix socket's request line, writes and close.
 * A connection is counted in d->open_handles from its init to its close callback, which
 * unlinks it from d->conns and frees it. */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/internal.h"
#include "util/json.h"

static void on_conn_closed(uv_handle_t *h)
{
    mt_d_conn_t *c = (mt_d_conn_t *)h;
    mt_d_t *d = c->d;
    /* a batch the encoder has may name it as a consumer: those come back first */
    if (d->lines.taken != d->lines.handed)
        mt__d_lines_sync(d);
    if (c->prev)
        c->prev->next = c->next;
    else
        d->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->proc && c->proc->conn == c)
        c->proc->conn = NULL;
    mt__d_consumer_release(c);
    mt__d_sub_free(&c->sub);
    mt__d_buf_free(&c->in);
    free(c);
    d->open_handles--;
}

void mt__d_conn_close(mt_d_conn_t *c)
{
    if (c->closing)
        return;
    c->closing = true;
    if (c->capture)
        return; /* no handle: the caller frees what it made */
    uv_read_stop(&c->u.stream);
    uv_close(&c->u.handle, on_conn_closed);
}

typedef struct write_req_s {
    uv_write_t req;
    mt_d_conn_t *conn;
    bool close_after;
    char data[];
} write_req_t;

static void on_shutdown(uv_shutdown_t *req, int status)
{
    mt_d_conn_t *c = req->data;
    if (status < 0)
        mt__d_conn_close(c);
}

/* The answer is written: tell the peer (EOF) and read what it still sends until it hangs
 * up; the sweep closes it after MT_D_LINGER_MS. */
static void linger(mt_d_conn_t *c)
{
    if (c->closing || c->lingering)
        return;
    c->kind = MT_D_CONN_DONE;
    c->lingering = true;
    c->linger_ms = uv_now(c->d->loop);
    c->shut.data = c;
    if (uv_shutdown(&c->shut, &c->u.stream, on_shutdown) != 0)
        mt__d_conn_close(c);
}

static void on_write_done(uv_write_t *req, int status)
{
    write_req_t *w = (write_req_t *)req;
    mt_d_conn_t *c = w->conn;
    bool close_after = w->close_after;
    free(w);
    if (status < 0)
        mt__d_conn_close(c);
    else if (close_after)
        linger(c);
}

int mt__d_conn_write(mt_d_conn_t *c, const char *data, size_t len, bool close_after)
{
    if (c->closing || c->lingering)
        return MT_EIO;
    if (c->capture) {
        c->closing = true; /* one answer, as on a socket (close_after or not) */
        return mt__d_buf_append(c->capture, data, len);
    }
    write_req_t *w = malloc(sizeof *w + len);
    if (!w) {
        mt__d_conn_close(c);
        return MT_ENOMEM;
    }
    w->conn = c;
    w->close_after = close_after;
    memcpy(w->data, data, len);
    uv_buf_t buf = uv_buf_init(w->data, (unsigned)len);
    int rc = uv_write(&w->req, &c->u.stream, &buf, 1, on_write_done);
    if (rc) {
        free(w);
        mt__d_conn_close(c);
        return MT_EIO;
    }
    return 0;
}

bool mt__d_peer_allowed(mt_d_conn_t *c)
{
    uv_os_fd_t fd;
    if (uv_fileno(&c->u.handle, &fd))
        return false;
    struct ucred cr;
    socklen_t len = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || len != sizeof cr)
        return false;
    c->peer_uid = cr.uid;
    c->peer_uid_known = true;
    c->peer_pid = cr.pid;
    return cr.uid == geteuid() || cr.uid == 0;
}

static void reply_error(mt_d_conn_t *c, const char *msg)
{
    c->kind = MT_D_CONN_DONE; /* one answer: what it sends after this is discarded */
    json_t *o = json_pack("{s:b,s:s}", "ok", 0, "error", msg);
    char *s = NULL;
    size_t n = 0;
    if (o != NULL && mt__json_dumps(o, JSON_COMPACT, &s, &n) == 0) {
        s[n] = '\n'; /* room is left only for the NUL, which we overwrite */
        mt__d_conn_write(c, s, n + 1, true);
    } else {
        mt__d_conn_close(c);
    }
    free(s);
    json_decref(o);
    c->d->ctr.rejected++;
}

/* One request line on the Unix socket: hello (producer), subscribe (consumer) or state. */
static void handle_unix_line(mt_d_conn_t *c, const char *line, size_t len)
{
    json_error_t jerr;
    json_t *msg = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!msg || !json_is_object(msg)) {
        json_decref(msg);
        reply_error(c, "malformed request: expected one JSON object per line");
        return;
    }
    const char *type = json_string_value(json_object_get(msg, "type"));
    const char *role = json_string_value(json_object_get(msg, "role"));
    if (type && strcmp(type, "hello") == 0 && role && strcmp(role, "producer") == 0) {
        char err[160] = "";
        int rc = mt__d_producer_hello(c, msg, err, sizeof err);
        if (rc < 0 && !c->closing)
            reply_error(c, err[0] ? err : mt_strerror(rc));
    } else if (type && strcmp(type, "subscribe") == 0 && role && strcmp(role, "consumer") == 0) {
        char err[128];
        if (mt__d_sub_parse_json(&c->sub, msg, err, sizeof err) != 0) {
            reply_error(c, err);
        } else if (mt__d_consumer_admit(c) != 0) {
            reply_error(c, "too many consumers, or their memory budget is spent: try later");
        } else {
            c->kind = MT_D_CONN_CONSUMER;
            c->d->ctr.consumers++;
            static const char ok[] = "{\"ok\":true}\n";
            if (mt__d_conn_write(c, ok, sizeof ok - 1, false) == 0)
                mt__d_consumer_start(c);
        }
    } else if (type && strcmp(type, "snapshot") == 0) {
        mt__d_snapshot_request(c, msg); /* snapshot.c */
    } else if (type && strcmp(type, "state") == 0) {
        json_t *st = mt__d_state_json(c->d);
        char *s = NULL;
        size_t n = 0;
        if (st != NULL && mt__json_dumps(st, JSON_COMPACT, &s, &n) == 0) {
            s[n] = '\n';
            c->kind = MT_D_CONN_DONE;
            mt__d_conn_write(c, s, n + 1, true);
        } else {
            reply_error(c, "out of memory");
        }
        free(s);
        json_decref(st);
    } else {
        reply_error(c, "unknown request: expected type hello/producer, subscribe/consumer, "
                       "state or snapshot");
    }
    json_decref(msg);
}

static void unix_input(mt_d_conn_t *c, const char *data, size_t n)
{
    const char *nl = memchr(data, '\n', n);
    size_t take = nl ? (size_t)(nl - data) : n;
    if (c->in.len + take > c->d->cfg.max_line_bytes) {
        reply_error(c, "request line too long");
        return;
    }
    if (mt__d_buf_append(&c->in, data, take)) {
        mt__d_conn_close(c);
        return;
    }
    if (nl)
        handle_unix_line(c, c->in.p, c->in.len);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    mt_d_conn_t *c = (mt_d_conn_t *)h;
    *buf = uv_buf_init(c->d->readbuf, MT_D_READ_BUF_SIZE);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    mt_d_conn_t *c = (mt_d_conn_t *)s;
    if (c->closing)
        return;
    if (n < 0) {
        if (c->kind == MT_D_CONN_PRODUCER)
            mt__d_producer_eof(c);
        mt__d_conn_close(c);
        return;
    }
    if (n == 0)
        return;
    c->last_active_ms = uv_now(c->d->loop);
    switch (c->kind) {
    case MT_D_CONN_UNIX_NEW:
        unix_input(c, buf->base, (size_t)n);
        break;
    case MT_D_CONN_HTTP_NEW:
        if (c->in.len + (size_t)n > c->d->cfg.max_request_bytes) {
            static const char r[] = "HTTP/1.1 431 Request Header Fields Too Large\r\n"
                                    "Content-Length: 0\r\nConnection: close\r\n\r\n";
            c->kind = MT_D_CONN_DONE;
            c->d->ctr.rejected++;
            mt__d_conn_write(c, r, sizeof r - 1, true);
            break;
        }
        if (mt__d_buf_append(&c->in, buf->base, (size_t)n)) {
            mt__d_conn_close(c);
            break;
        }
        mt__d_http_input(c);
        break;
    case MT_D_CONN_PRODUCER:
        mt__d_producer_input(c, buf->base, (size_t)n);
        break;
    default:
        /* Consumers have nothing more to say once subscribed; whatever they send is read
         * and discarded so that it cannot pile up. */
        break;
    }
}

/* Open fds of this process (/proc/self/fd), or 0 if unknown. */
static unsigned open_fds(void)
{
    unsigned n = 0;
    uv_fs_t req;
    if (uv_fs_scandir(NULL, &req, "/proc/self/fd", 0, NULL) >= 0) {
        uv_dirent_t ent;
        while (uv_fs_scandir_next(&req, &ent) != UV_EOF)
            n++;
    }
    uv_fs_req_cleanup(&req);
    return n;
}

/* Who c's peer is: its address, and its uid when its socket is on this host. */
static void tcp_peer(mt_d_conn_t *c)
{
    struct sockaddr_storage peer, self;
    int plen = sizeof peer, slen = sizeof self;
    c->peer_addr[0] = '\0';
    c->peer_uid_known = false;
    if (uv_tcp_getpeername(&c->u.tcp, (struct sockaddr *)&peer, &plen) != 0)
        return;
    if (peer.ss_family == AF_INET6)
        uv_ip6_name((struct sockaddr_in6 *)&peer, c->peer_addr, sizeof c->peer_addr);
    else
        uv_ip4_name((struct sockaddr_in *)&peer, c->peer_addr, sizeof c->peer_addr);
    uint32_t uid;
    if (uv_tcp_getsockname(&c->u.tcp, (struct sockaddr *)&self, &slen) == 0 &&
        mt__d_tcp_peer_uid((struct sockaddr *)&self, (struct sockaddr *)&peer, &uid) == 0) {
        c->peer_uid = uid;
        c->peer_uid_known = true;
    }
}

/* The per-peer cap's key: the same user, else (neither user known) the same address. */
static bool same_peer(const mt_d_conn_t *a, const mt_d_conn_t *b)
{
    if (a->peer_uid_known || b->peer_uid_known)
        return a->peer_uid_known && b->peer_uid_known && a->peer_uid == b->peer_uid;
    return strcmp(a->peer_addr, b->peer_addr) == 0;
}

/* The daemon's own user and root: whoever may read the events anyway. */
static bool peer_trusted(const mt_d_conn_t *c)
{
    return c->peer_uid_known && (c->peer_uid == geteuid() || c->peer_uid == 0);
}

/* HTTP is a guest: it may use neither the last cfg.fd_reserve fds (producers and Unix
 * consumers always get in) nor more than its share of connections. The share is counted
 * per peer (its uid: every local user connects from 127.0.0.1, and by address one user's
 * idle connections would lock another out), and in all for the guests (other users and
 * peers whose user is unknown): the owner's and root's connections are not counted
 * there, so no other user can spend them. */
static bool http_admit(mt_d_conn_t *c)
{
    mt_d_t *d = c->d;
    tcp_peer(c);
    unsigned same = 0, guests = 0;
    for (mt_d_conn_t *o = d->conns; o; o = o->next) {
        if (o == c || !o->is_tcp || o->closing)
            continue;
        same += same_peer(o, c);
        guests += !peer_trusted(o);
    }
    const char *why = NULL;
    if (!peer_trusted(c) && guests >= d->cfg.max_http_conns)
        why = "too many HTTP connections";
    else if (same >= d->cfg.max_http_per_peer)
        why = c->peer_uid_known ? "too many HTTP connections from one user"
                                : "too many HTTP connections from one address";
    else if (d->fd_limit && open_fds() + d->cfg.fd_reserve > d->fd_limit)
        why = "file descriptors kept for producers";
    if (!why)
        return true;
    if (c->peer_uid_known)
        mt__d_warn(d, &d->warn_http, "refused an HTTP connection from uid %u (%s): %s",
                   (unsigned)c->peer_uid, c->peer_addr, why);
    else
        mt__d_warn(d, &d->warn_http, "refused an HTTP connection from %s: %s", c->peer_addr, why);
    return false;
}

void mt__d_on_connection(uv_stream_t *server, int status)
{
    mt_d_t *d = server->data;
    if (status < 0 || d->stopping)
        return;
    bool tcp = server == (uv_stream_t *)&d->http_listener;
    mt_d_conn_t *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->d = d;
    c->is_tcp = tcp;
    c->kind = tcp ? MT_D_CONN_HTTP_NEW : MT_D_CONN_UNIX_NEW;
    int rc = tcp ? uv_tcp_init(d->loop, &c->u.tcp) : uv_pipe_init(d->loop, &c->u.pipe, 0);
    if (rc) {
        free(c);
        return;
    }
    d->open_handles++;
    c->u.handle.data = d;
    c->next = d->conns;
    if (d->conns)
        d->conns->prev = c;
    d->conns = c;
    c->last_active_ms = uv_now(d->loop);
    c->accepted_ms = c->last_active_ms;
    if (uv_accept(server, &c->u.stream) != 0) {
        mt__d_conn_close(c);
        return;
    }
    if (tcp && !http_admit(c)) {
        d->ctr.rejected++;
        mt__d_conn_close(c);
        return;
    }
    if (!tcp && !mt__d_peer_allowed(c)) {
        /* Another user's process: it may neither read our events nor feed us a ring. */
        d->ctr.rejected++;
        if (c->peer_uid_known)
            mt__d_warn(d, &d->warn_unix, "refused a connection from another uid (%u)",
                       (unsigned)c->peer_uid);
        else
            mt__d_warn(d, &d->warn_unix,
                       "refused a connection from another uid (its credentials are unknown)");
        mt__d_conn_close(c);
        return;
    }
    if (tcp)
        uv_tcp_nodelay(&c->u.tcp, 1);
    if (uv_read_start(&c->u.stream, on_alloc, on_read) != 0)
        mt__d_conn_close(c);
}
