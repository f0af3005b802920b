/* A test library for tests/callsite/test_pyframes.py: captures the calling thread's Python
 * frames (profiler/pyframes.c) and its native stack (glibc backtrace), interleaves them and
 * prints one frame a line into the caller's buffer: "py FUNC FILE LINE ENTRY" or
 * "native NAME" (dladdr's symbol, "?" when none). */
#include <dlfcn.h>
#include <execinfo.h>
#include <stdio.h>
#include <string.h>
#include "profiler/pyframes.h"

#define PROBE_API __attribute__((visibility("default")))

PROBE_API int mt_test_pyprobe(char *buf, int len);
PROBE_API int mt_test_pyprobe_cb(int (*cb)(void));
PROBE_API int mt_test_pyprobe_is_eval_known(void);
PROBE_API long long mt_test_pyprobe_str_bytes(void);
PROBE_API long long mt_test_pyprobe_str_dropped(void);
PROBE_API int mt_test_pyprobe_count(void);

PROBE_API int mt_test_pyprobe(char *buf, int len)
{
    mt_pyframe_t py[64];
    void *ips[128];
    int32_t order[192];
    bool trunc = false;
    int n_py = mt__pyframes_capture(py, 64, &trunc);
    int n_ips = backtrace(ips, 128);
    int n = mt__pyframes_merge((const uintptr_t *)ips, n_ips, py, n_py, order, 192);
    int used = 0;
    buf[0] = '\0';
    for (int k = 0; k < n && used < len; k++) {
        int w;
        if (order[k] < 0) {
            const mt_pyframe_t *f = &py[-order[k] - 1];
            w = snprintf(buf + used, (size_t)(len - used), "py %s %s %d %d\n", f->func, f->file,
                         f->line, f->entry);
        } else {
            Dl_info info;
            const char *name = "?";
            if (dladdr(ips[order[k]], &info) != 0 && info.dli_sname != NULL)
                name = info.dli_sname;
            w = snprintf(buf + used, (size_t)(len - used), "native %s\n", name);
        }
        if (w < 0 || w >= len - used)
            return -1;
        used += w;
    }
    return n_py;
}

PROBE_API int mt_test_pyprobe_cb(int (*cb)(void))
{
    return cb() + 1;
}

PROBE_API int mt_test_pyprobe_is_eval_known(void)
{
    void *fn = dlsym(RTLD_DEFAULT, "_PyEval_EvalFrameDefault");
    return fn != NULL && mt__pyframes_ip_is_eval((uintptr_t)fn + 1);
}

PROBE_API long long mt_test_pyprobe_str_bytes(void)
{
    mt__pyframes_stats_t st;
    mt__pyframes_stats(&st);
    return (long long)st.str_bytes;
}

PROBE_API long long mt_test_pyprobe_str_dropped(void)
{
    mt__pyframes_stats_t st;
    mt__pyframes_stats(&st);
    return (long long)st.str_dropped;
}

/* Captures only (no formatting): the frame count. */
PROBE_API int mt_test_pyprobe_count(void)
{
    mt_pyframe_t py[64];
    return mt__pyframes_capture(py, 64, NULL);
}
