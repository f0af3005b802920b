/* Private declarations shared by the profiler's files. */
#ifndef MT_PROFILER_INTERNAL_H
#define MT_PROFILER_INTERNAL_H

#include "memtrace/prof.h"
#include "profiler/ring.h"

/* Registers ring with the daemon at sock_path: connects, sends the hello line, waits
 * up to timeout_ms for the reply. On success *out_fd is the open connection, to keep
 * for the process lifetime (closing it tells the daemon the producer ended). On
 * failure, a message goes to err. */
int mt__prof_client_register(const char *sock_path, const mt__ring_t *ring, int timeout_ms,
                             int *out_fd, char *err, size_t errlen);
/* Sends the optional {"type":"poke"} line (asks the daemon to drain now). */
int mt__prof_client_poke(int fd);

#define MT__PROF_SCHEMA_VERSION 1 /* "v" of every record */

/* The name of a tag in telemetry: tag_name's (when it gives a non-empty one), else the
 * built-in name, else "tag<n>" written into buf. tag_name may be NULL. Borrowed:
 * tag_name's string, a static one, or buf. */
#define MT__PROF_TAG_LABEL_MAX 16 /* "tag" + any int + NUL */
const char *mt__prof_tag_label(int tag, const char *(*tag_name)(void *ud, int tag), void *ud,
                               char buf[MT__PROF_TAG_LABEL_MAX]);

/* {"v":1,"type":"exit",...}: the last line of a local log. New json_t * or NULL. */
void *mt__prof_exit_to_json(int pid, bool clean, uint64_t emitted, uint64_t dropped, uint64_t lost,
                            uint64_t t_ns);

/* ---- OOM snapshots (oomsnap.c; docs/torch-snapshot.md) ---- */

/* mkdir -p dir (0700 for what it makes); it must end up a directory of ours closed to
 * others. 0 or MT_EIO/MT_EINVAL. */
int mt__oomsnap_dir_prepare(const char *dir);
/* Creates path (0600, never over a file or through a link) holding data, all at once: it
 * appears complete or not at all (MT_EBUSY if it exists). */
int mt__oomsnap_write_file(const char *path, const void *data, size_t n);
/* Keeps the max newest oom-*.json in dir, with their .pickle. */
void mt__oomsnap_prune(const char *dir, unsigned max);

/* The recorder's follower (local mode): segments, live blocks, recent events. */
typedef struct mt__oomsnap_s mt__oomsnap_t;
int mt__oomsnap_create(mt__oomsnap_t **out, int pid, const char *dir);
void mt__oomsnap_destroy(mt__oomsnap_t **p);
/* Follows ev; at an OOM writes oom-<pid>-dev<d>-<n>.{json,pickle} (the last path in path)
 * and returns 1; 0 otherwise; negative when the files could not be written. */
int mt__oomsnap_record(mt__oomsnap_t *s, const mt_event_rec_t *ev,
                       const char (*labels)[MT_EVENT_LABEL_MAX + 1],
                       const char *(*tag_name)(void *, int), void *ud, char *path, size_t pathlen);

#endif
