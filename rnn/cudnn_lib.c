/* Run-time loading of libcudnn and of the CUDA runtime calls the cudnn path makes (see
 * cudnn_lib.h). */
#include <dlfcn.h>
#include <glob.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/common.h"
#include "rnn/cudnn_internal.h"

typedef struct sym_s {
    const char *name;
    size_t off;
    int lib; /* 0 libcudnn, 1 the runtime */
} sym_t;

static const sym_t syms[] = {
#define MT__DNN_SYM(f) {#f, offsetof(mt__dnn_t, f), 0},
#define MT__RT_SYM(f)  {#f, offsetof(mt__dnn_t, f), 1},
    MT__DNN_FNS(MT__DNN_SYM) MT__CUDART_FNS(MT__RT_SYM)
#undef MT__DNN_SYM
#undef MT__RT_SYM
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static mt__dnn_t table;
static void *libs[2];
static char lib_paths[2][PATH_MAX]; /* the file each of libs was loaded from */
static int loaded;                  /* table holds every symbol (under mu; read after it was set) */

/* Where Python installs keep their packages, as glob patterns: pip wheels of cuDNN and the
 * CUDA runtime (nvidia-cudnn-cu13, nvidia-cuda-runtime-cu13) put their libraries in
 * nvidia/<package>/lib, outside the loader's search path. "~" is $HOME, "$V" $VIRTUAL_ENV,
 * "$C" $CONDA_PREFIX (each skipped when unset). */
static const char *const default_roots[] = {
    "$V/lib/python3*/site-packages",         "$C/lib/python3*/site-packages",
    "~/.local/lib/python3*/site-packages",   "/usr/local/lib/python3*/dist-packages",
    "/usr/local/lib/python3*/site-packages", "/usr/lib/python3/dist-packages",
    "/usr/lib/python3*/site-packages",       "~/.pyenv/versions/*/lib/python3*/site-packages",
};

enum { MAX_ROOTS = 32, MAX_HITS = 64 }; /* bounds on the folders and files looked at */

/* What the loader reads from the environment, in one place: which file or name each library
 * is loaded from, and where Python installs are. Process-wide loader settings, like
 * LD_LIBRARY_PATH: no module configuration reaches the lazy loader. */
typedef struct load_env_s {
    const char *file[2]; /* $MEMTRACE_LIBCUDNN, $MEMTRACE_LIBCUDART, or NULL */
    const char *roots; /* $MEMTRACE_CUDNN_ROOTS: colon-separated patterns replacing the defaults */
    const char *home, *venv, *conda;
} load_env_t;

static const char *env_or_null(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static void load_env_read(load_env_t *e)
{
    e->file[0] = env_or_null("MEMTRACE_LIBCUDNN");
    e->file[1] = env_or_null("MEMTRACE_LIBCUDART");
    e->roots = env_or_null("MEMTRACE_CUDNN_ROOTS");
    e->home = env_or_null("HOME");
    e->venv = env_or_null("VIRTUAL_ENV");
    e->conda = env_or_null("CONDA_PREFIX");
}

/* Appends to err (always terminated, truncated when full). */
static void say(char *err, size_t errlen, const char *fmt, ...)
{
    size_t n = strlen(err);
    if (n + 1 >= errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - n, fmt, ap);
    va_end(ap);
}

/* One root pattern with its prefix expanded into out; false when its variable is unset. */
static bool expand_root(const load_env_t *e, const char *pat, char *out, size_t outlen)
{
    const char *pre = NULL;
    if (strncmp(pat, "$V", 2) == 0)
        pre = e->venv;
    else if (strncmp(pat, "$C", 2) == 0)
        pre = e->conda;
    else if (pat[0] == '~')
        pre = e->home;
    else
        return snprintf(out, outlen, "%s", pat) < (int)outlen;
    if (!pre)
        return false;
    return snprintf(out, outlen, "%s%s", pre, pat + (pat[0] == '~' ? 1 : 2)) < (int)outlen;
}

/* dlopen of path; on success the file it came from in lib_paths[k]. */
static void *try_open(int k, const char *path)
{
    /* RTLD_LOCAL: cuDNN's symbols must not become candidates for the program's lookups. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return NULL;
    const char *file = path;
    struct link_map *lm = NULL;
    /* A bare name was resolved by the loader: its link map names the file. */
    if (!strchr(path, '/') && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name[0])
        file = lm->l_name;
    snprintf(lib_paths[k], sizeof lib_paths[k], "%s", file);
    return h;
}

/* nvidia/<package>/lib/name under each root (at most MAX_ROOTS roots and MAX_HITS files):
 * the first that loads. */
static void *search_roots(int k, const load_env_t *e, const char *name, char *err, size_t errlen)
{
    char list[4096];
    const char *pats[MAX_ROOTS];
    size_t npats = 0;
    if (e->roots) {
        snprintf(list, sizeof list, "%s", e->roots);
        for (char *save = NULL, *t = strtok_r(list, ":", &save); t && npats < MAX_ROOTS;
             t = strtok_r(NULL, ":", &save))
            pats[npats++] = t;
    } else {
        for (size_t i = 0; i < sizeof default_roots / sizeof *default_roots; i++)
            pats[npats++] = default_roots[i];
    }
    say(err, errlen, "; nvidia/*/lib/%s under", name);
    size_t hits = 0, looked = 0;
    void *h = NULL;
    for (size_t i = 0; i < npats && !h; i++) {
        char root[PATH_MAX], pattern[PATH_MAX + 64];
        if (!expand_root(e, pats[i], root, sizeof root))
            continue;
        say(err, errlen, "%s %s", looked++ ? "," : "", root);
        if (snprintf(pattern, sizeof pattern, "%s/nvidia/*/lib/%s", root, name) >=
            (int)sizeof pattern)
            continue;
        glob_t g;
        if (glob(pattern, GLOB_NOSORT, NULL, &g) != 0)
            continue;
        for (size_t j = 0; j < g.gl_pathc && hits < MAX_HITS && !h; j++, hits++) {
            h = try_open(k, g.gl_pathv[j]);
            if (!h)
                say(err, errlen, " (%s: %s)", g.gl_pathv[j], dlerror());
        }
        globfree(&g);
    }
    if (!h)
        say(err, errlen, "%s: not found", looked ? "" : " no folder (every root's variable unset)");
    return h;
}

/* Library k (0 libcudnn, 1 the runtime): an explicit file ($MEMTRACE_LIB... with a '/'),
 * else a name (that variable, or the soname) through the loader's search path, then through
 * the Python installs' nvidia/<package>/lib folders. err says everything tried. */
static void *open_lib(int k, const load_env_t *e, const char *var, const char *soname, char *err,
                      size_t errlen)
{
    const char *name = e->file[k] ? e->file[k] : soname;
    void *h = try_open(k, name);
    if (h)
        return h;
    if (e->file[k])
        say(err, errlen, "cannot load %s (%s): %s", name, var, dlerror());
    else
        say(err, errlen, "cannot load %s (%s unset): %s", name, var, dlerror());
    if (strchr(name, '/'))
        return NULL; /* a file the user named: no other is taken in its place */
    return search_roots(k, e, name, err, errlen);
}

int mt__dnn_open(const mt__dnn_t **out, char *err, size_t errlen)
{
    pthread_mutex_lock(&mu);
    int rc = 0;
    if (errlen)
        err[0] = '\0';
    if (!loaded) {
        load_env_t e;
        load_env_read(&e);
        char dnn[32], rt[32];
        snprintf(dnn, sizeof dnn, "libcudnn.so.%d", CUDNN_MAJOR);
        snprintf(rt, sizeof rt, "libcudart.so.%d", CUDART_VERSION / 1000);
        libs[0] = open_lib(0, &e, "MEMTRACE_LIBCUDNN", dnn, err, errlen);
        libs[1] = libs[0] ? open_lib(1, &e, "MEMTRACE_LIBCUDART", rt, err, errlen) : NULL;
        rc = libs[0] && libs[1] ? 0 : MT_ENODEV;
        for (size_t i = 0; rc == 0 && i < sizeof syms / sizeof syms[0]; i++) {
            void *fn = dlsym(libs[syms[i].lib], syms[i].name);
            if (fn == NULL) {
                snprintf(err, errlen, "%s (%s) lacks %s",
                         syms[i].lib ? "the CUDA runtime" : "libcudnn", lib_paths[syms[i].lib],
                         syms[i].name);
                rc = MT_ENODEV;
            }
            memcpy((char *)&table + syms[i].off, &fn, sizeof fn);
        }
        if (rc != 0) {
            for (int k = 0; k < 2; k++)
                if (libs[k])
                    dlclose(libs[k]);
            memset(libs, 0, sizeof libs);
            memset(lib_paths, 0, sizeof lib_paths);
            memset(&table, 0, sizeof table);
        } else if (errlen) {
            err[0] = '\0'; /* what failed before the library that loaded is no error */
        }
        loaded = rc == 0;
    }
    pthread_mutex_unlock(&mu);
    *out = rc == 0 ? &table : NULL;
    return rc;
}

const char *mt__dnn_path(int k)
{
    return loaded ? lib_paths[k] : "";
}

/* ---- status codes and the device guard ---- */

/* cuDNN 9 groups its status codes by thousands (cudnn_graph.h): 2xxx bad parameters, 3xxx
 * not supported, 4xxx internal errors, 5xxx execution failures. The 1xxx codes share no
 * meaning, so each gets its own. */
static int uncategorized(cudnnStatus_t s)
{
    switch (s) {
    case CUDNN_STATUS_NOT_INITIALIZED:             /* cudnnCreate failed: no driver or device */
    case CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH: /* a cuDNN install of mixed versions */
    case CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED:   /* an engine library did not load */
        return MT_ENODEV;
    case CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH: /* a serialised plan of another cuDNN */
        return MT_EPROTO;
    case CUDNN_STATUS_DEPRECATED: /* the call is deprecated and was refused */
    case CUDNN_STATUS_LICENSE_ERROR:
        return MT_ENOTSUP;
    case CUDNN_STATUS_RUNTIME_IN_PROGRESS: /* queued work not finished yet: ask again */
        return MT_EAGAIN;
    case CUDNN_STATUS_RUNTIME_FP_OVERFLOW: /* a kernel's numbers overflowed */
        return MT_EOVERFLOW;
    default:
        return MT_EIO;
    }
}

int mt__dnn_status(cudnnStatus_t s)
{
    if (s == CUDNN_STATUS_SUCCESS)
        return 0;
    switch ((int)s / 1000) {
    case 1:
        return uncategorized(s);
    case 2:
        return MT_EINVAL;
    case 3:
        return MT_ENOTSUP;
    default:
        if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
            s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
            return MT_ENOMEM;
        return MT_EIO;
    }
}

/* Maps s, logging the failing call once when it failed. */
int mt__dnn_check(const mt_rnn_t *m, cudnnStatus_t s, const char *what)
{
    int rc = mt__dnn_status(s);
    if (rc) {
        /* cuDNN 9 says why in its per-thread last-error text: the status alone rarely does. */
        char why[512] = "";
        mt__dnn->cudnnGetLastErrorString(why, sizeof why);
        plog(m, MT_LOG_ERROR, "rnn: cudnn: %s failed: %s (%d)%s%s", what,
             mt__dnn->cudnnGetErrorString(s), (int)s, why[0] ? ": " : "", why);
    }
    return rc;
}

int mt__dnn_dev_enter(const mt_rnn_t *m, dev_guard_t *g)
{
    g->switched = false;
    int dev = mt_backend_device(m->backend);
    cudaError_t e = mt__dnn->cudaGetDevice(&g->prev);
    if (e == cudaSuccess && g->prev != dev) {
        e = mt__dnn->cudaSetDevice(dev);
        g->switched = e == cudaSuccess;
    }
    if (e != cudaSuccess) {
        plog(m, MT_LOG_WARN, "rnn: cudnn unavailable: selecting device %d: %s (%d)", dev,
             mt__dnn->cudaGetErrorString(e), (int)e);
        return MT_ENODEV;
    }
    return 0;
}

void mt__dnn_dev_leave(const dev_guard_t *g)
{
    if (g->switched)
        mt__dnn->cudaSetDevice(g->prev);
}
