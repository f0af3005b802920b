/* The backend's environment, read in this file only (docs/process-state.md): a program
 * that honours MEMTRACE_BACKEND and MEMTRACE_SIM_* calls mt_backend_cfg_from_env at its
 * edge; mt_backend_cfg_default and mt_backend_create read none. */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/backend.h"

/* Decimal digits only (no sign, no space, no 0x/octal), then an optional K/M/G/T (binary
 * units, "i"/"B"/"iB" after it allowed); MT_EOVERFLOW past 2^64 - 1. */
static int parse_u64_env(const char *name, uint64_t *out)
{
    const char *s = getenv(name);
    if (s == NULL || *s == '\0')
        return MT_ENOENT;
    if (*s < '0' || *s > '9')
        return MT_EINVAL;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return MT_EOVERFLOW;
    unsigned shift = 0;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        break;
    case 'm':
    case 'M':
        shift = 20;
        break;
    case 'g':
    case 'G':
        shift = 30;
        break;
    case 't':
    case 'T':
        shift = 40;
        break;
    default:
        break;
    }
    if (shift) {
        if (v > (UINT64_MAX >> shift))
            return MT_EOVERFLOW;
        v <<= shift;
        end++;
    }
    if (*end == 'i' || *end == 'B')
        end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end != '\0')
        return MT_EINVAL;
    *out = v;
    return 0;
}

/* The first problem found is the one reported: err is written only while still empty. */
static void first_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void first_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0 || err[0] != '\0')
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Applies one size/count variable; MT_EINVAL (and err) if it is malformed. */
static int env_u64(const char *name, uint64_t *dst, bool nonzero, char *err, size_t errlen)
{
    uint64_t v;
    int rc = parse_u64_env(name, &v);
    if (rc == MT_ENOENT)
        return 0;
    if (rc == 0 && (!nonzero || v != 0)) {
        *dst = v;
        return 0;
    }
    if (rc == MT_EOVERFLOW)
        first_err(err, errlen, "%s: too large (over 2^64 - 1): '%s'", name, getenv(name));
    else
        first_err(err, errlen, "%s: not a %sdecimal number (K/M/G/T suffixes allowed): '%s'", name,
                  nonzero ? "positive " : "", getenv(name));
    return MT_EINVAL;
}

/* MEMTRACE_SIM_DEVICES: plain decimal digits only (no sign, base prefix, suffix or
 * blanks), 1..MT_SIM_MAX_DEVICES; the digits are bounded before they can overflow. */
static int env_devices(int *dst, char *err, size_t errlen)
{
    const char *s = getenv("MEMTRACE_SIM_DEVICES");
    if (s == NULL || *s == '\0')
        return 0;
    long v = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9' && v <= MT_SIM_MAX_DEVICES; p++)
        v = v * 10 + (*p - '0');
    if (*p != '\0' || v < 1 || v > MT_SIM_MAX_DEVICES) {
        first_err(err, errlen, "MEMTRACE_SIM_DEVICES: not a device count (1..%d): '%s'",
                  MT_SIM_MAX_DEVICES, s);
        return MT_EINVAL;
    }
    *dst = (int)v;
    return 0;
}

int mt_backend_cfg_from_env(mt_backend_cfg_t *cfg, char *err, size_t errlen)
{
    if (cfg == NULL)
        return MT_EINVAL;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    int rc = 0;
    const char *k = getenv("MEMTRACE_BACKEND");
    if (k != NULL && *k != '\0') {
        if (strcmp(k, "auto") == 0) {
            cfg->kind = MT_BACKEND_AUTO;
        } else if (strcmp(k, "sim") == 0) {
            cfg->kind = MT_BACKEND_SIM;
        } else if (strcmp(k, "cuda") == 0) {
            cfg->kind = MT_BACKEND_CUDA;
        } else {
            first_err(err, errlen, "MEMTRACE_BACKEND: must be auto, sim or cuda, not '%s'", k);
            rc = MT_EINVAL;
        }
    }
    uint64_t cap = cfg->sim_capacity;
    if (env_u64("MEMTRACE_SIM_CAPACITY", &cap, true, err, errlen) != 0)
        rc = MT_EINVAL;
    cfg->sim_capacity = (size_t)cap;
    if (env_u64("MEMTRACE_SIM_MALLOC_COST_NS", &cfg->sim_malloc_cost_ns, false, err, errlen) != 0)
        rc = MT_EINVAL;
    if (env_u64("MEMTRACE_SIM_FREE_COST_NS", &cfg->sim_free_cost_ns, false, err, errlen) != 0)
        rc = MT_EINVAL;
    if (env_devices(&cfg->sim_devices, err, errlen) != 0)
        rc = MT_EINVAL;
    if (env_u64("MEMTRACE_SIM_PEER_COST_NS", &cfg->sim_peer_cost_ns, false, err, errlen) != 0)
        rc = MT_EINVAL;
    if (env_u64("MEMTRACE_SIM_PEER_BANDWIDTH", &cfg->sim_peer_bandwidth, true, err, errlen) != 0)
        rc = MT_EINVAL;
    const char *ht = getenv("MEMTRACE_CUDA_HANDLE_TYPE");
    if (ht != NULL && *ht != '\0') {
        static const char *const names[] = {"none", "posix_fd", "fabric"};
        int v = -1;
        for (int i = 0; i < 3 && v < 0; i++)
            if (strcmp(ht, names[i]) == 0)
                v = i;
        if (v < 0) {
            first_err(err, errlen,
                      "MEMTRACE_CUDA_HANDLE_TYPE: must be none, posix_fd or fabric, not '%s'", ht);
            rc = MT_EINVAL;
        } else {
            cfg->cuda_handle_type = v;
        }
    }
    const char *pa = getenv("MEMTRACE_CUDA_PEER_ACCESS");
    if (pa != NULL && *pa != '\0') {
        if (strcmp(pa, "enabled") == 0) {
            cfg->cuda_peer_access = MT_CUDA_PEER_ENABLED;
        } else if (strcmp(pa, "capable") == 0) {
            cfg->cuda_peer_access = MT_CUDA_PEER_CAPABLE;
        } else {
            first_err(err, errlen,
                      "MEMTRACE_CUDA_PEER_ACCESS: must be enabled or capable, not '%s'", pa);
            rc = MT_EINVAL;
        }
    }
    uint64_t ctx = cfg->sim_context, other = cfg->sim_other_processes;
    if (env_u64("MEMTRACE_SIM_CONTEXT", &ctx, false, err, errlen) != 0)
        rc = MT_EINVAL;
    if (env_u64("MEMTRACE_SIM_OTHER_PROCESSES", &other, false, err, errlen) != 0)
        rc = MT_EINVAL;
    cfg->sim_context = (size_t)ctx;
    cfg->sim_other_processes = (size_t)other;
    return rc;
}
