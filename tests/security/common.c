/* See common.h. */
#include "tests/security/common.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

bool sec_can_switch_uid(void)
{
    return geteuid() == 0;
}

void sec_tmpdir(char *buf, size_t len)
{
    snprintf(buf, len, "/tmp/mt-sec-XXXXXX");
    assert_non_null(mkdtemp(buf));
    assert_int_equal(chmod(buf, 0755), 0);
}

int sec_run(const char *cmd, char **out)
{
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t cap = 64 << 10, len = 0;
    char *buf = malloc(cap + 1);
    assert_non_null(buf);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        size_t take = len + n > cap ? cap - len : n;
        memcpy(buf + len, chunk, take);
        len += take;
    }
    buf[len] = '\0';
    int st = pclose(f);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
