/* OOM snapshot files, shared by the recorder (local mode) and the daemon: the directory,
 * written files, pruning. The directory is opened once per snapshot, component by
 * component, and every write and removal is relative to that descriptor: a symbolic link
 * another user plants anywhere on the path cannot redirect them (docs/telemetry.md,
 * "Security model"). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "profiler/internal.h"

/* ---- the directory ---- */

/* A link named in the directory of st_parent, with link st_link: was it put there by
 * ourselves or root, where nobody else could have put or replaced it? A directory
 * writable by others is safe only when sticky (nobody else may rename or remove our
 * entries) and the link is ours. */
static bool trusted_link(const struct stat *parent, const struct stat *link)
{
    uid_t me = geteuid();
    bool link_ok = link->st_uid == me || link->st_uid == 0;
    bool parent_ok = parent->st_uid == me || parent->st_uid == 0;
    bool closed = (parent->st_mode & 022) == 0;
    bool sticky = (parent->st_mode & S_ISVTX) != 0 && link->st_uid == me;
    return link_ok && parent_ok && (closed || sticky);
}

/* The next component name in dfd: made 0700 when missing (make), opened as a directory
 * without following a link, unless the link is trusted (trusted_link). New fd or -errno. */
static int open_component(int dfd, const char *name, bool make)
{
    /* A failed mkdir is not an answer: the directory may exist where we may not write (a
     * read-only file system may say EROFS first); the open says whether it is there. */
    if (make)
        (void)mkdirat(dfd, name, 0700);
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0 || (errno != ELOOP && errno != ENOTDIR))
        return fd >= 0 ? fd : -errno;
    struct stat parent, link;
    if (fstat(dfd, &parent) != 0 || fstatat(dfd, name, &link, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISLNK(link.st_mode) || !trusted_link(&parent, &link))
        return -ELOOP;
    fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return fd >= 0 ? fd : -errno;
}

int mt__oomsnap_dir_open(const char *dir, int *out_fd)
{
    *out_fd = -1;
    size_t len = strlen(dir);
    if (len == 0 || len >= 512)
        return MT_EINVAL;
    char path[512];
    memcpy(path, dir, len + 1);
    int fd = open(path[0] == '/' ? "/" : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return MT_EIO;
    char *save = NULL;
    for (char *c = strtok_r(path, "/", &save); c != NULL; c = strtok_r(NULL, "/", &save)) {
        if (strcmp(c, ".") == 0)
            continue;
        int next = open_component(fd, c, true);
        close(fd);
        if (next < 0)
            return MT_EIO;
        fd = next;
    }
    /* The last one: ours, closed to others, so nobody else can swap or read the files. */
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077) != 0) {
        close(fd);
        return MT_EIO;
    }
    *out_fd = fd;
    return 0;
}

/* ---- one file ---- */

static bool no_room(int rc)
{
    return rc == -ENOSPC || rc == -EDQUOT || rc == -EFBIG;
}

/* Written under a hidden temporary name in the same (private) directory and linked to name
 * only once complete and closed: a reader watching the directory never opens a half-written
 * snapshot, and link keeps O_EXCL's rule that an existing name is never replaced. A failed
 * write leaves nothing behind. */
int mt__oomsnap_write_at(int dfd, const char *name, const void *data, size_t n)
{
    char tmp[320];
    if (snprintf(tmp, sizeof tmp, ".%s.%d.tmp", name, (int)getpid()) >= (int)sizeof tmp)
        return MT_EINVAL;
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno == EEXIST ? MT_EBUSY : no_room(-errno) ? -errno : MT_EIO;
    const char *p = data;
    int rc = 0;
    while (n > 0 && rc == 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rc = w < 0 && no_room(-errno) ? -errno : w == 0 ? -ENOSPC : MT_EIO;
            break;
        }
        p += w;
        n -= (size_t)w;
    }
    if (close(fd) != 0 && rc == 0)
        rc = no_room(-errno) ? -errno : MT_EIO;
    if (rc == 0 && linkat(dfd, tmp, dfd, name, 0) != 0)
        rc = errno == EEXIST ? MT_EBUSY : no_room(-errno) ? -errno : MT_EIO;
    unlinkat(dfd, tmp, 0);
    return rc;
}

/* ---- pruning ---- */

/* Counts the oom-*.json in dfd and finds the oldest (mtime, then name) that is not spare's
 * ("" when there is none). */
static unsigned survey(int dfd, const char *spare, char oldest[256])
{
    oldest[0] = '\0';
    int dup_fd = dup(dfd);
    DIR *dh = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (dh == NULL) {
        if (dup_fd >= 0)
            close(dup_fd);
        return 0;
    }
    rewinddir(dh); /* the descriptor's offset is shared with dfd's other users */
    unsigned count = 0;
    struct timespec oldest_t = {0};
    for (struct dirent *e; (e = readdir(dh)) != NULL;) {
        size_t l = strlen(e->d_name);
        struct stat st;
        if (strncmp(e->d_name, "oom-", 4) != 0 || l < 6 || l >= 256 ||
            strcmp(e->d_name + l - 5, ".json") != 0 ||
            fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        count++;
        if (spare != NULL && strncmp(e->d_name, spare, l - 5) == 0 && spare[l - 5] == '\0')
            continue;
        bool older = oldest[0] == '\0' || st.st_mtim.tv_sec < oldest_t.tv_sec ||
                     (st.st_mtim.tv_sec == oldest_t.tv_sec &&
                      (st.st_mtim.tv_nsec < oldest_t.tv_nsec ||
                       (st.st_mtim.tv_nsec == oldest_t.tv_nsec && strcmp(e->d_name, oldest) < 0)));
        if (older) {
            oldest_t = st.st_mtim;
            memcpy(oldest, e->d_name, l + 1);
        }
    }
    closedir(dh);
    return count;
}

/* Removes the pair of json (an oom-*.json name). */
static void remove_pair(int dfd, char json[256])
{
    unlinkat(dfd, json, 0);
    size_t l = strlen(json);
    snprintf(json + l - 5, 256 - (l - 5), ".pickle");
    unlinkat(dfd, json, 0);
}

void mt__oomsnap_prune_at(int dfd, unsigned keep, const char *spare)
{
    char oldest[256];
    unsigned count;
    while ((count = survey(dfd, spare, oldest)) > keep && oldest[0] != '\0')
        remove_pair(dfd, oldest);
}

/* Writes one file of the pair; on a full disk, removes the oldest other pair and tries
 * once more. */
static int write_retry(int dfd, const char *base, const char *name, const void *data, size_t n)
{
    int rc = mt__oomsnap_write_at(dfd, name, data, n);
    char oldest[256];
    if (no_room(rc) && (survey(dfd, base, oldest), oldest[0] != '\0')) {
        remove_pair(dfd, oldest);
        rc = mt__oomsnap_write_at(dfd, name, data, n);
    }
    return rc;
}

int mt__oomsnap_write_pair(const char *dir, unsigned keep, const char *base, const void *json,
                           size_t json_len, const void *pickle, size_t pickle_len)
{
    int dfd;
    int rc = mt__oomsnap_dir_open(dir, &dfd);
    if (rc != 0)
        return rc;
    /* Room first: the new pair is the one that must not be lost. */
    mt__oomsnap_prune_at(dfd, keep > 0 ? keep - 1 : 0, NULL);
    char name[300];
    if (snprintf(name, sizeof name, "%s.json", base) >= (int)sizeof name)
        rc = MT_EINVAL;
    if (rc == 0)
        rc = write_retry(dfd, base, name, json, json_len);
    if (rc == 0) {
        snprintf(name, sizeof name, "%s.pickle", base);
        rc = write_retry(dfd, base, name, pickle, pickle_len);
    }
    close(dfd);
    return rc;
}
