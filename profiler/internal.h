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

#endif
