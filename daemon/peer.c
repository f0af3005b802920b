/* memtraced: which user is at the other end of a TCP connection.
 *
 * TCP has no SO_PEERCRED, but when the peer is on this host its socket is in the kernel's
 * table, with the uid of the user that made it: the socket whose local end is the peer's
 * address and port and whose remote end is ours. The kernel answers that exact question
 * through NETLINK_SOCK_DIAG (inet_diag, what `ss -e` reads), without privileges and at
 * once: the answer is queued before sendto() returns, so the loop never waits on it.
 *
 * Only a socket that still belongs to a process says who made it: a peer that already
 * closed its end leaves an orphan or a TIME_WAIT entry, whose uid the kernel reports as 0
 * (root). Those are "unknown", as are peers on other hosts. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>

#include "daemon/internal.h"

typedef struct diag_req_s {
    struct nlmsghdr nlh;
    struct inet_diag_req_v2 r;
} diag_req_t;

/* Fills the request's socket id with the peer's socket: local end = peer, remote = self. */
static int fill_id(struct inet_diag_sockid *id, const struct sockaddr *self,
                   const struct sockaddr *peer)
{
    if (self->sa_family == AF_INET) {
        const struct sockaddr_in *s = (const void *)self, *p = (const void *)peer;
        id->idiag_sport = p->sin_port;
        id->idiag_dport = s->sin_port;
        memcpy(id->idiag_src, &p->sin_addr, sizeof p->sin_addr);
        memcpy(id->idiag_dst, &s->sin_addr, sizeof s->sin_addr);
        return 0;
    }
    if (self->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const void *)self, *p = (const void *)peer;
        id->idiag_sport = p->sin6_port;
        id->idiag_dport = s->sin6_port;
        memcpy(id->idiag_src, &p->sin6_addr, sizeof p->sin6_addr);
        memcpy(id->idiag_dst, &s->sin6_addr, sizeof s->sin6_addr);
        return 0;
    }
    return MT_EINVAL;
}

/* The uid in the kernel's answer, if it names a socket a process still holds. */
static int parse_answer(const char *buf, size_t n, uint32_t *uid)
{
    int rc = MT_ENOENT;
    for (const struct nlmsghdr *h = (const void *)buf; NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
        if (h->nlmsg_type == NLMSG_ERROR) {
            const struct nlmsgerr *e = NLMSG_DATA(h);
            return e->error < 0 ? e->error : MT_ENOENT;
        }
        if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
            h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
            continue;
        const struct inet_diag_msg *m = NLMSG_DATA(h);
        if (m->idiag_state == TCP_TIME_WAIT || m->idiag_state == TCP_SYN_RECV ||
            m->idiag_inode == 0)
            return MT_ENOENT; /* closed by its process: no owner to name */
        *uid = m->idiag_uid;
        rc = 0;
    }
    return rc;
}

int mt__d_tcp_peer_uid(const struct sockaddr *self, const struct sockaddr *peer, uint32_t *uid)
{
    if (self->sa_family != peer->sa_family)
        return MT_EINVAL;
    diag_req_t req;
    memset(&req, 0, sizeof req);
    req.nlh.nlmsg_len = sizeof req;
    req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.nlh.nlmsg_flags = NLM_F_REQUEST; /* one socket, not a dump */
    req.nlh.nlmsg_seq = 1;
    req.r.sdiag_family = (uint8_t)self->sa_family;
    req.r.sdiag_protocol = IPPROTO_TCP;
    req.r.idiag_states = ~0u;
    req.r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    int rc = fill_id(&req.r.id, self, peer);
    if (rc)
        return rc;
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0)
        return -errno;
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    union {
        struct nlmsghdr align;
        char buf[1024];
    } ans;
    ssize_t n = -1;
    rc = MT_EIO;
    if (sendto(fd, &req, sizeof req, 0, (struct sockaddr *)&kernel, sizeof kernel) !=
        (ssize_t)sizeof req)
        rc = errno ? -errno : MT_EIO;
    else if ((n = recv(fd, ans.buf, sizeof ans.buf, MSG_DONTWAIT)) < 0)
        rc = -errno;
    if (n > 0)
        rc = parse_answer(ans.buf, (size_t)n, uid);
    close(fd);
    return rc;
}
