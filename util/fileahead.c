/* Disk blocks reserved ahead of an appending log writer (fileahead.h). */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "util/fileahead.h"

void mt__fa_ahead(mt__fa_t *fa, int fd, size_t len)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return;
    if (fa->dev != (uint64_t)st.st_dev || fa->ino != (uint64_t)st.st_ino)
        *fa = (mt__fa_t){.dev = (uint64_t)st.st_dev, .ino = (uint64_t)st.st_ino};
    uint64_t size = (uint64_t)st.st_size, need = size + len;
    if (fa->off || need < MT__FA_MIN || need <= fa->end)
        return;
    uint64_t ahead = need / 8 < MT__FA_STEP ? need / 8 : MT__FA_STEP;
    uint64_t from = fa->end > size ? fa->end : size, to = need + ahead;
    int rc;
    do
        rc = fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)from, (off_t)(to - from));
    while (rc != 0 && errno == EINTR);
    if (rc != 0)
        fa->off = true;
    else
        fa->end = to;
}
