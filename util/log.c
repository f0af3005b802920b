/* See log.h. */
#include <stdio.h>

#include "util/log.h"

void mt__vlogf(mt_log_cb cb, void *ud, mt_log_level_e level, const char *fmt, va_list ap)
{
    if (cb == NULL)
        return;
    /* Long enough for the allocator's out-of-memory report, the longest message we make. */
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    cb(ud, level, msg);
}

void mt__logf(mt_log_cb cb, void *ud, mt_log_level_e level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mt__vlogf(cb, ud, level, fmt, ap);
    va_end(ap);
}
