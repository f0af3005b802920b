/* libFuzzer harness: the daemon's network input, run in-process. One daemon (its own
 * loop, a socket in a temp directory, an ephemeral HTTP port) lives for the whole run;
 * each input is sent by a client on the daemon's own loop, which then closes its
 * writing side and reads the answer until the daemon closes the connection. The loop
 * runs in this thread, so a run is deterministic and a daemon that never answers, or
 * keeps a connection after the client left, is a reported hang, not a timeout.
 *
 * Input: byte 0 picks the door. Even: an HTTP request head on the TCP port
 * (daemon/http.c). Odd: a request line on the Unix socket: hello, subscribe or state
 * (daemon/server.c, connections.c, producers.c, consumers.c). The rest is sent as it is. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/internal.h"
#include "tests/fuzz/fuzz.h"

typedef struct fz_s {
    uv_loop_t loop;
    mt_d_t *d;
    char dir[64];
    char sock[128];
    int port;
} fz_t;

/* The one daemon of the run: libFuzzer's entry point takes no context. */
static fz_t *fuzz_daemon;

typedef struct client_s {
    union {
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } u;
    uv_connect_t conn;
    uv_write_t wr;
    uv_shutdown_t sd;
    char rbuf[4096];
    size_t got;
    bool closed;
    bool connected;
} client_t;

static void fz_stop(void)
{
    fz_t *f = fuzz_daemon;
    if (!f)
        return;
    mt__d_stop(f->d);
    FUZZ_CHECK(mt__d_run(f->d) == 0, "the daemon stops");
    mt__d_destroy(&f->d);
    FUZZ_CHECK(uv_loop_close(&f->loop) == 0, "the daemon closed every handle");
    rmdir(f->dir);
    free(f);
    fuzz_daemon = NULL;
}

static fz_t *fz_start(void)
{
    fz_t *f = calloc(1, sizeof *f);
    FUZZ_CHECK(f != NULL, "out of memory");
    snprintf(f->dir, sizeof f->dir, "/tmp/mt-fuzz-XXXXXX");
    FUZZ_CHECK(mkdtemp(f->dir) != NULL, "temp directory");
    snprintf(f->sock, sizeof f->sock, "%s/d.sock", f->dir);
    FUZZ_CHECK(uv_loop_init(&f->loop) == 0, "loop");
    mt_d_cfg_t cfg = mt__d_cfg_default();
    cfg.socket_path = f->sock;
    cfg.http_port = 0;
    cfg.loop = &f->loop;
    cfg.max_line_bytes = 4096; /* so that the fuzzer reaches the limit */
    cfg.max_request_bytes = 2048;
    cfg.http_token = "fuzz0123456789abcdef0123456789ab"; /* the corpus's requests carry it */
    FUZZ_CHECK(mt__d_create(&f->d, &cfg) == 0, "daemon created");
    f->port = mt__d_http_port(f->d);
    FUZZ_CHECK(f->port > 0, "HTTP port");
    fuzz_daemon = f;
    atexit(fz_stop);
    return f;
}

static void on_closed(uv_handle_t *h)
{
    ((client_t *)h->data)->closed = true;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    client_t *c = h->data;
    *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    client_t *c = s->data;
    if (n > 0)
        c->got += (size_t)n;
    else if (n < 0 && !uv_is_closing((uv_handle_t *)s))
        uv_close((uv_handle_t *)s, on_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status) {}

static void on_written(uv_write_t *req, int status)
{
    client_t *c = req->data;
    /* The daemon may have answered and closed already: then the write fails. */
    if (status == 0 && !uv_is_closing((uv_handle_t *)&c->u.stream))
        uv_shutdown(&c->sd, &c->u.stream, on_shutdown);
}

static void on_connect(uv_connect_t *req, int status)
{
    client_t *c = req->data;
    FUZZ_CHECK(status == 0, "the daemon accepts connections");
    c->connected = true;
}

/* Runs the loop until pred holds or the daemon is clearly stuck. */
static void run_until(fz_t *f, bool *flag)
{
    for (unsigned i = 0; i < 100000 && !*flag; i++)
        uv_run(&f->loop, UV_RUN_ONCE);
    FUZZ_CHECK(*flag, "the daemon answers and closes");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    fz_t *f = fuzz_daemon ? fuzz_daemon : fz_start();
    bool http = (data[0] & 1) == 0;
    data++;
    size--;
    client_t *c = calloc(1, sizeof *c);
    FUZZ_CHECK(c != NULL, "out of memory");
    c->conn.data = c->wr.data = c->sd.data = c;
    if (http) {
        struct sockaddr_in a;
        uv_ip4_addr("127.0.0.1", f->port, &a);
        FUZZ_CHECK(uv_tcp_init(&f->loop, &c->u.tcp) == 0, "tcp");
        c->u.stream.data = c;
        FUZZ_CHECK(uv_tcp_connect(&c->conn, &c->u.tcp, (struct sockaddr *)&a, on_connect) == 0,
                   "connect");
    } else {
        FUZZ_CHECK(uv_pipe_init(&f->loop, &c->u.pipe, 0) == 0, "pipe");
        c->u.stream.data = c;
        uv_pipe_connect(&c->conn, &c->u.pipe, f->sock, on_connect);
    }
    run_until(f, &c->connected);
    FUZZ_CHECK(uv_read_start(&c->u.stream, on_alloc, on_read) == 0, "read");
    uv_buf_t buf = uv_buf_init((char *)data, (unsigned)size);
    if (size > 0)
        FUZZ_CHECK(uv_write(&c->wr, &c->u.stream, &buf, 1, on_written) == 0, "write");
    else
        FUZZ_CHECK(uv_shutdown(&c->sd, &c->u.stream, on_shutdown) == 0, "shutdown");
    run_until(f, &c->closed);
    /* The daemon's end closes in its own callbacks: wait until it has let go of it. */
    bool gone = false;
    for (unsigned i = 0; i < 1000 && !gone; i++) {
        gone = f->d->conns == NULL;
        if (!gone)
            uv_run(&f->loop, UV_RUN_NOWAIT);
    }
    FUZZ_CHECK(gone, "the daemon drops a connection whose client left");
    /* A complete request, good or bad, always gets an answer (an error names what was
     * wrong); only a request cut short by the client's leaving may get none. */
    bool complete = http ? memmem(data, size, "\r\n\r\n", 4) || memchr(data, '\0', size)
                         : memchr(data, '\n', size) != NULL;
    if (complete && c->got == 0)
        fprintf(stderr, "no answer to %zu bytes on the %s door\n", size, http ? "HTTP" : "Unix");
    FUZZ_CHECK(!complete || c->got > 0, "the daemon answers every complete request");
    free(c);
    mt_d_counters_t ctr;
    mt__d_counters(f->d, &ctr);
    FUZZ_CHECK(ctr.live_processes == 0, "no producer registered from fuzz input");
    return 0;
}
