/* Python frames of the allocating thread, for call stacks (docs/telemetry.md, stacks).
 *
 * The interpreter is found at run time (dlsym(RTLD_DEFAULT, ...)); libpython is never
 * linked. With no interpreter loaded, one not yet initialized or one finalizing, or a
 * thread that has no Python thread state, capture is a no-op returning 0.
 *
 * Capture takes the GIL (PyGILState_Ensure) when the thread released it (ctypes.CDLL
 * calls do), so it must run before any memtrace lock is taken: a thread that holds the
 * GIL may be waiting for that lock. It never creates a thread state, so a native thread
 * the interpreter does not know never waits for the GIL. It is reentrancy-safe (a
 * capture that the interpreter re-enters memtrace from returns 0).
 *
 * Strings are interned for the life of the process; their memory is bounded by
 * MT_PYFRAMES_STR_CAP bytes, past which frames read "<python>" / "?" and are counted. */
#ifndef MT_PROFILER_PYFRAMES_H
#define MT_PROFILER_PYFRAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MT_PYFRAMES_STR_CAP (4u << 20) /* bytes of interned function and file names */
#define MT_PYFRAMES_DEPTH   128        /* frames a capture reads at most */

/* One Python frame. func and file are interned (borrowed, valid until process exit).
 * entry = 1 on the outermost Python frame run by one native call of the eval loop (the
 * frames from the previous entry, exclusive, to this one inclusive belong to one native
 * eval frame). When the interpreter does not expose this (versions other than 3.11),
 * only the outermost captured frame has entry = 1. */
typedef struct mt_pyframe_s {
    const char *func; /* qualified name, e.g. "Model.forward" */
    const char *file; /* co_filename as the interpreter has it */
    int32_t line;     /* current line, >= 0 (0 when unknown) */
    uint8_t entry;    /* 0 or 1, see above */
} mt_pyframe_t;

/* Captures the calling thread's Python frames, innermost first, into out[0, cap).
 * Returns how many were written (0 when there is no usable interpreter or thread state),
 * never negative. *truncated (may be NULL) is set when frames remained past cap. */
int mt__pyframes_capture(mt_pyframe_t *out, int cap, bool *truncated);

/* True when ip lies in the interpreter's eval loop (_PyEval_EvalFrameDefault's symbol
 * range). Async-signal-safe and lock-free: two loads. False before the first capture
 * found an interpreter (call mt__pyframes_capture or mt__pyframes_refresh first). */
bool mt__pyframes_ip_is_eval(uintptr_t ip);

/* Looks the interpreter up again (after a dlopen); capture also does this by itself when
 * the loader's count of loaded objects changed (checked every 64 captures per thread). */
void mt__pyframes_refresh(void);

/* Interleaves a native stack and Python frames (both innermost first) into out[0, cap):
 * out[k] >= 0 names native ips[out[k]], out[k] < 0 names py[-out[k] - 1]. Each native
 * frame in the eval loop is replaced by the Python frames it runs (up to the next entry);
 * Python frames left when no eval frame remains go where the last eval frame was or, with
 * none, after the innermost native frame. Returns the count written (<= cap). */
int mt__pyframes_merge(const uintptr_t *ips, int n_ips, const mt_pyframe_t *py, int n_py,
                       int32_t *out, int cap);

/* Counters since process start (for bench rows and tests). */
typedef struct mt__pyframes_stats_s {
    uint64_t captures;    /* calls that found an interpreter and a thread state */
    uint64_t frames;      /* frames written */
    uint64_t gil_ensured; /* captures that had to take the GIL */
    uint64_t str_bytes;   /* bytes interned, <= MT_PYFRAMES_STR_CAP */
    uint64_t str_dropped; /* names not interned because of the cap */
} mt__pyframes_stats_t;
void mt__pyframes_stats(mt__pyframes_stats_t *out);

#endif
