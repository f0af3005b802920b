/* Producer side of the registration protocol with memtraced (docs/telemetry.md):
 * connect to the Unix socket, send one hello line naming the ring, read one reply
 * line, then keep the connection open for the life of the process so the daemon
 * learns of its end by EOF. */
#include "profiler/internal.h"
#include "util/safefile.h"
#include "util/json.h"

#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

int mt__prof_socket_default(char *buf, size_t len)
{
    struct sockaddr_un sa;
    int n = snprintf(buf, len, "/tmp/memtrace-%u/memtrace.sock", (unsigned)geteuid());
    if (n < 0 || (size_t)n >= len || (size_t)n >= sizeof(sa.sun_path))
        return MT_EOVERFLOW;
    return 0;
}

static int write_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads one '\n'-terminated line within timeout_ms (total). */
static int read_line(int fd, char *buf, size_t len, int timeout_ms)
{
    size_t used = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (used + 1 < len) {
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long spent = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
        if (spent >= timeout_ms)
            return MT_EAGAIN;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, (int)(timeout_ms - spent));
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return pr == 0 ? MT_EAGAIN : -errno;
        /* One byte at a time: the reply is one short line and nothing may be read past
         * it (the connection stays open). */
        ssize_t r = recv(fd, buf + used, 1, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r == 0 ? MT_EPROTO : -errno;
        if (buf[used] == '\n') {
            buf[used] = '\0';
            return 0;
        }
        used++;
    }
    return MT_EPROTO;
}

int mt__prof_client_register(const char *sock_path, const mt__ring_t *ring,
                             const mt_prof_job_t *job, int timeout_ms, int *out_fd, char *err,
                             size_t errlen)
{
    *out_fd = -1;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (strlen(sock_path) >= sizeof(sa.sun_path)) {
        snprintf(err, errlen, "socket path too long: %s", sock_path);
        return MT_EOVERFLOW;
    }
    memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -errno;
    }
    int rc;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        rc = -errno;
        snprintf(err, errlen, "no daemon at %s: %s", sock_path, strerror(errno));
        goto fail;
    }
    /* Another user may have bound the path first: nothing (pid, name, ring) goes to a
     * daemon that is neither us nor root. */
    unsigned uid;
    if ((rc = mt__sf_peer_trusted(fd, &uid)) != 0) {
        snprintf(err, errlen, "the daemon at %s runs as uid %d, not uid %u or root: not trusted",
                 sock_path, (int)uid, (unsigned)geteuid());
        goto fail;
    }
    const mt__ring_hdr_t *h = mt__ring_header(ring);
    json_t *hello = json_pack("{s:s, s:s, s:i, s:i, s:s, s:s, s:I}", "type", "hello", "role",
                              "producer", "version", 1, "pid", (int)h->pid, "name", h->comm, "shm",
                              mt__ring_name(ring), "slots", (json_int_t)h->slots);
    /* A hello short of its rank would register the process as no job's. */
    rc = hello == NULL ? MT_ENOMEM : job != NULL ? mt_prof_job_to_json(hello, job) : 0;
    char *line = NULL;
    size_t len = 0;
    if (rc == 0)
        rc = mt__json_dumps(hello, JSON_COMPACT, &line, &len);
    json_decref(hello);
    if (rc) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    rc = write_all(fd, line, len);
    free(line);
    if (rc == 0)
        rc = write_all(fd, "\n", 1);
    if (rc) {
        snprintf(err, errlen, "sending hello to %s: %s", sock_path, strerror(-rc));
        goto fail;
    }
    char reply[512];
    rc = read_line(fd, reply, sizeof(reply), timeout_ms);
    if (rc) {
        snprintf(err, errlen, "no reply from daemon at %s: %s", sock_path,
                 rc == MT_EAGAIN ? "timed out" : mt_strerror(rc));
        goto fail;
    }
    json_error_t jerr;
    json_t *rep = json_loads(reply, 0, &jerr);
    json_t *ok = rep ? json_object_get(rep, "ok") : NULL;
    if (!json_is_true(ok)) {
        const char *why = rep ? json_string_value(json_object_get(rep, "error")) : NULL;
        snprintf(err, errlen, "daemon refused registration: %s", why ? why : reply);
        json_decref(rep);
        rc = MT_EPROTO;
        goto fail;
    }
    json_decref(rep);
    *out_fd = fd;
    return 0;

fail:
    close(fd);
    return rc;
}

int mt__prof_client_poke(int fd)
{
    static const char poke[] = "{\"type\":\"poke\"}\n";
    return write_all(fd, poke, sizeof(poke) - 1);
}
