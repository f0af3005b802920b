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

/* {"v":1,"type":"exit",...}: the last line of a local log. New json_t * or NULL. */
void *mt__prof_exit_to_json(int pid, bool clean, uint64_t emitted, uint64_t dropped, uint64_t lost,
                            uint64_t t_ns);

#endif
