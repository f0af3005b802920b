/* Helpers of the security tests: a second uid to play the attacker (root only), temp
 * directories, log callbacks that keep what they were told. */
#ifndef MT_TESTS_SECURITY_COMMON_H
#define MT_TESTS_SECURITY_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "memtrace/common.h"

#define SEC_OTHER_UID 65534 /* nobody: the attacker in fork + setresuid tests */

/* A log callback that appends every message (and a '\n') to a buffer. */
typedef struct sec_log_s {
    char text[8192];
} sec_log_t;

static inline void sec_log_cb(void *ud, mt_log_level_e level, const char *msg)
{
    sec_log_t *l = ud;
    (void)level;
    size_t n = strlen(l->text);
    if (n + strlen(msg) + 2 < sizeof l->text) {
        strcat(l->text, msg);
        strcat(l->text, "\n");
    }
}

/* Whether this process can become SEC_OTHER_UID in a child (it runs as root). */
bool sec_can_switch_uid(void);
/* A new directory under /tmp, mode 0755 (an attacker's child may enter it), into buf. */
void sec_tmpdir(char *buf, size_t len);
/* Runs `sh -c cmd` with stdout+stderr into *out (new, at most 64 KiB kept); returns the
 * exit status, or 128 + signal. */
int sec_run(const char *cmd, char **out);

#endif
