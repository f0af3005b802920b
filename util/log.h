/* Formatting for the log callbacks every module takes (mt_log_cb): the library never
 * prints, it formats one line and hands it to the program's callback, if any. */
#ifndef MT_UTIL_LOG_H
#define MT_UTIL_LOG_H

#include <stdarg.h>

#include "memtrace/common.h"

/* Formats into a bounded buffer (longer messages are cut) and calls cb(ud, level, msg).
 * No-op when cb is NULL. */
void mt__vlogf(mt_log_cb cb, void *ud, mt_log_level_e level, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
void mt__logf(mt_log_cb cb, void *ud, mt_log_level_e level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
