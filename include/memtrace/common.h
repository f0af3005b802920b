/* memtrace: definitions shared by every module (errors, logging, export macro).
 *
 * Conventions used across the whole public API:
 * - Fallible functions return int: 0 on success or a negative MT_E* code, which are
 *   negated errno values so they print with strerror() too. Out-parameters come last.
 * - Constructors: int mt_x_create(mt_x_t **out, const mt_x_cfg_t *cfg);
 *   destructors: void mt_x_destroy(mt_x_t **p), which sets *p = NULL.
 * - Ownership is stated in each doc comment: *new* (caller frees), *borrowed*
 *   (must outlive the call or the object), *takes ownership*.
 * - The library never prints: diagnostics go to an mt_log_cb the program registers. */
#ifndef MEMTRACE_COMMON_H
#define MEMTRACE_COMMON_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MT_BUILDING_LIBRARY) && defined(__GNUC__)
#define MT_API __attribute__((visibility("default")))
#else
#define MT_API
#endif

#define MT_VERSION_MAJOR 0
#define MT_VERSION_MINOR 1
#define MT_VERSION_PATCH 0

/* Error codes: negated errno values. */
#define MT_EINVAL    (-EINVAL)    /* bad argument or configuration value */
#define MT_ENOMEM    (-ENOMEM)    /* device (or host) memory exhausted */
#define MT_EAGAIN    (-EAGAIN)    /* not ready yet (event query, full queue) */
#define MT_ENOENT    (-ENOENT)    /* unknown pointer, key, stream or file */
#define MT_EIO       (-EIO)       /* backend or system call failed */
#define MT_ENOTSUP   (-ENOTSUP)   /* operation not supported by this backend or build */
#define MT_EBUSY     (-EBUSY)     /* resource still in use */
#define MT_ENODEV    (-ENODEV)    /* no usable device for the requested backend */
#define MT_EPROTO    (-EPROTO)    /* malformed input (trace file, socket message) */
#define MT_EOVERFLOW (-EOVERFLOW) /* size arithmetic would overflow */
#define MT_EFBIG     (-EFBIG)     /* a file would pass the file size limit (ulimit -f) */

/* A short, static, human-readable description of an MT_E* code (or any -errno). */
MT_API const char *mt_strerror(int code);

typedef enum mt_log_level_e {
    MT_LOG_ERROR = 0,
    MT_LOG_WARN = 1,
    MT_LOG_INFO = 2,
    MT_LOG_DEBUG = 3,
} mt_log_level_e;

/* Diagnostics sink. msg is borrowed for the duration of the call, has no trailing
 * newline, and may be called from any thread that uses the object it was given to. */
typedef void (*mt_log_cb)(void *ud, mt_log_level_e level, const char *msg);

#ifdef __cplusplus
}
#endif
#endif
