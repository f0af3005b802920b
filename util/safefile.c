/* See safefile.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "util/safefile.h"

int mt__sf_random(void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

int mt__sf_random_hex(char *buf, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[64];
    if (n > 2 * sizeof raw)
        return MT_EINVAL;
    int rc = mt__sf_random(raw, (n + 1) / 2);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++)
        buf[i] = hex[(raw[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    buf[n] = '\0';
    return 0;
}

int mt__sf_private_dir(const char *dir, bool create)
{
    if (create && mkdir(dir, 0700) != 0 && errno != EEXIST)
        return -errno;
    struct stat st;
    if (lstat(dir, &st) != 0)
        return -errno;
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0)
        return -EPERM;
    return 0;
}

int mt__sf_open_append(const char *path, int *out_fd)
{
    *out_fd = -1;
    const int common = O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC;
    int fd = open(path, common | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
        *out_fd = fd;
        return 0;
    }
    if (errno != EEXIST)
        return -errno;
    /* O_NONBLOCK: a FIFO planted there must not hang the open; it fails the check below. */
    fd = open(path, common | O_NONBLOCK);
    if (fd < 0)
        return errno == ELOOP ? -EPERM : -errno;
    struct stat st;
    /* The null device is the one non-file a log may go to (MEMTRACE_LOG=/dev/null). */
    bool null_dev = fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3);
    if (!null_dev && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
                      st.st_nlink != 1)) {
        close(fd);
        return -EPERM;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    *out_fd = fd;
    return 0;
}

static bool all_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

int mt__sf_token_read(const char *path, char *buf, size_t len)
{
    if (len < MT_TOKEN_HEX + 1)
        return MT_EINVAL;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return errno == ELOOP ? -EPERM : -errno;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_uid != geteuid() && st.st_uid != 0) ||
        (st.st_mode & 077) != 0) {
        rc = -EPERM;
        goto out;
    }
    char tmp[MT_TOKEN_HEX + 2];
    ssize_t n = read(fd, tmp, sizeof tmp);
    if (n < MT_TOKEN_HEX || (n > MT_TOKEN_HEX && tmp[MT_TOKEN_HEX] != '\n') ||
        !all_hex(tmp, MT_TOKEN_HEX)) {
        rc = MT_EPROTO;
        goto out;
    }
    memcpy(buf, tmp, MT_TOKEN_HEX);
    buf[MT_TOKEN_HEX] = '\0';
out:
    close(fd);
    return rc;
}

int mt__sf_token_ensure(const char *path, char *buf, size_t len)
{
    if (len < MT_TOKEN_HEX + 1)
        return MT_EINVAL;
    if (mt__sf_token_read(path, buf, len) == 0) {
        struct stat st;
        if (lstat(path, &st) == 0 && st.st_uid == geteuid())
            return 0;
    }
    if (unlink(path) != 0 && errno != ENOENT)
        return -errno;
    int rc = mt__sf_random_hex(buf, MT_TOKEN_HEX);
    if (rc)
        return rc;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    char line[MT_TOKEN_HEX + 1];
    memcpy(line, buf, MT_TOKEN_HEX);
    line[MT_TOKEN_HEX] = '\n';
    rc = write(fd, line, sizeof line) == (ssize_t)sizeof line ? 0 : MT_EIO;
    if (close(fd) != 0 && !rc)
        rc = MT_EIO;
    if (rc)
        unlink(path);
    return rc;
}

int mt__sf_peer_trusted(int fd, unsigned *out_uid)
{
    struct ucred cr;
    socklen_t len = sizeof cr;
    *out_uid = (unsigned)-1;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0)
        return -errno;
    if (len != sizeof cr)
        return MT_EIO;
    *out_uid = cr.uid;
    return cr.uid == geteuid() || cr.uid == 0 ? 0 : -EPERM;
}
