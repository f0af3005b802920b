/* memtraced: the optional log of everything received, for `memtrace report`: NDJSON, or
 * the binary log (profiler/binlog.h) when its name ends in ".mtlog".
 *
 * Lines are the same JSON as the event stream (one event per line, with its pid), plus
 * {"type":"process_event"} lines when a producer registers or exits. The file is opened
 * for appending, written through stdio's buffer (the event lines by the encoder thread,
 * lines.c, the others here on the loop thread once the encoder has handed back every batch)
 * and flushed at the end of every drain tick (by the encoder, after the tick's last batch,
 * when another tick follows at once). The rings are acknowledged only after that flush, so
 * what a crash of the daemon loses from the file, a producer that takes over still has.
 * The encoder reserves the file's blocks ahead of its writes (util/fileahead.h). */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "util/safefile.h"
#include "profiler/binlog.h"

#include "daemon/internal.h"

int mt__d_logfile_open(mt_d_t *d)
{
    if (!d->log_path)
        return 0;
    size_t n = strlen(d->log_path);
    d->log_bin = n >= 6 && strcmp(d->log_path + n - 6, ".mtlog") == 0;
    /* Created 0600: the log holds every process's events, which only we may read. */
    int fd;
    int rc = mt__sf_open_append(d->log_path, &fd);
    if (rc == 0 && (d->logf = fdopen(fd, "a")) == NULL) {
        rc = MT_ENOMEM;
        close(fd);
    }
    if (rc) {
        mt__d_log(d, MT_LOG_ERROR, "cannot open log %s: %s%s", d->log_path, mt_strerror(rc),
                  rc == -EPERM ? " (a symlink, or a file of another user)" : "");
        return rc;
    }
    return 0;
}

void mt__d_logfile_record(mt_d_t *d, const char *line, size_t len)
{
    mt__d_lines_sync(d); /* the lines drained before it first */
    if (!d->logf)
        return;
    /* In the binary log, a block of its own of the one line (its newline left out). */
    char hdr[MT__BLOG_HDR + MT__BLOG_TEXT_EXTRA];
    size_t h = 0;
    if (d->log_bin) {
        len -= len > 0 && line[len - 1] == '\n';
        h = MT__BLOG_HDR + mt__blog_put_line_head(hdr + MT__BLOG_HDR, (uint32_t)len);
        mt__blog_header(hdr, (uint32_t)(h - MT__BLOG_HDR + len), 0, 1);
    }
    if (fwrite(hdr, 1, h, d->logf) != h || fwrite(line, 1, len, d->logf) != len) {
        mt__d_log(d, MT_LOG_ERROR, "writing %s failed; the log is closed", d->log_path);
        mt__d_logfile_end(d);
        return;
    }
    d->log_dirty = true;
}

void mt__d_logfile_flush(mt_d_t *d)
{
    mt__d_lines_sync(d);
    if (d->logf && d->log_dirty) {
        fflush(d->logf);
        d->log_dirty = false;
    }
}

void mt__d_logfile_close(mt_d_t *d)
{
    mt__d_lines_sync(d);
    mt__d_logfile_end(d);
}

void mt__d_logfile_end(mt_d_t *d)
{
    if (!d->logf)
        return;
    fclose(d->logf);
    d->logf = NULL;
}
