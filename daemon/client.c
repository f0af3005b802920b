/* Client side of the daemon's Unix socket, for the CLI (tail, top) and the tests:
 * plain blocking sockets, no libuv, so that any program can use it. */
#include <errno.h>
#include <stdio.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "memtrace/prof.h"
#include "util/safefile.h"

int mt__d_client_connect(const char *socket_path, int *out_fd)
{
    *out_fd = -1;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (socket_path) {
        if (strlen(socket_path) >= sizeof sa.sun_path)
            return MT_EOVERFLOW;
        memcpy(sa.sun_path, socket_path, strlen(socket_path) + 1);
    } else {
        int rc = mt_prof_socket_path(sa.sun_path, sizeof sa.sun_path);
        if (rc)
            return rc;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    /* A daemon of another user (it bound the path first) gets no request of ours. */
    unsigned uid;
    int rc = mt__sf_peer_trusted(fd, &uid);
    if (rc) {
        close(fd);
        return rc;
    }
    *out_fd = fd;
    return 0;
}

int mt__d_token_path(const char *socket_path, char *buf, size_t len)
{
    char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
    if (!socket_path) {
        int rc = mt_prof_socket_path(sock, sizeof sock);
        if (rc)
            return rc;
        socket_path = sock;
    }
    int n = snprintf(buf, len, "%s.token", socket_path);
    return n < 0 || (size_t)n >= len ? MT_EOVERFLOW : 0;
}

int mt__d_client_token(const char *socket_path, char *buf, size_t len)
{
    char path[4200];
    int rc = mt__d_token_path(socket_path, path, sizeof path);
    return rc ? rc : mt__sf_token_read(path, buf, len);
}

int mt__d_client_send(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return MT_EIO;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int mt__d_client_read_all(int fd, size_t max, int timeout_ms, char **out, size_t *out_len)
{
    *out = NULL;
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    if (!buf)
        return MT_ENOMEM;
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        uint64_t now = now_ms();
        if (now >= deadline) {
            free(buf);
            return MT_EAGAIN;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, (int)(deadline - now));
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue;
        if (len + 1 == cap) {
            if (cap >= max + 1) {
                free(buf);
                return MT_EOVERFLOW;
            }
            cap = cap * 2 > max + 1 ? max + 1 : cap * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                return MT_ENOMEM;
            }
            buf = nb;
        }
        ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            free(buf);
            return MT_EIO;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    buf[len] = '\0';
    *out = buf;
    if (out_len)
        *out_len = len;
    return 0;
}

int mt__d_client_state(const char *socket_path, int timeout_ms, char **out)
{
    *out = NULL;
    int fd;
    int rc = mt__d_client_connect(socket_path, &fd);
    if (rc)
        return rc;
    static const char req[] = "{\"type\":\"state\"}\n";
    rc = mt__d_client_send(fd, req, sizeof req - 1);
    if (!rc)
        rc = mt__d_client_read_all(fd, 256u << 20, timeout_ms, out, NULL);
    close(fd);
    return rc;
}
