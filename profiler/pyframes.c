/* Python frames of the allocating thread, read through CPython's public C API found at
 * run time. See pyframes.h for the contract and docs/telemetry.md for where they go. */
#include "profiler/pyframes.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- the interpreter's entry points (resolved with dlsym) ---- */

typedef void pyobj; /* PyObject, PyFrameObject, PyCodeObject, PyThreadState */

typedef struct py_api_s {
    int (*is_initialized)(void);
    int (*is_finalizing)(void);
    pyobj *(*this_tstate)(void); /* PyGILState_GetThisThreadState */
    int (*gil_check)(void);
    int (*gil_ensure)(void);
    void (*gil_release)(int);
    pyobj *(*get_frame)(void);     /* borrowed */
    pyobj *(*frame_code)(pyobj *); /* new */
    pyobj *(*frame_back)(pyobj *); /* new */
    int (*frame_line)(pyobj *);
    pyobj *(*getattr)(pyobj *, const char *); /* new */
    const char *(*utf8)(pyobj *);
    void (*incref)(pyobj *);
    void (*decref)(pyobj *);
    void (*err_fetch)(pyobj **, pyobj **, pyobj **);
    void (*err_restore)(pyobj *, pyobj *, pyobj *);
    bool layout_311; /* the 3.11 frame layout may be read for the entry flags */
} py_api_t;

/* The resolved API is published once, complete, through an atomic pointer; an older one is
 * never freed (a capture may still read it), and at most a few exist (one per refresh that
 * found an interpreter anew), so they are kept in a small static array. */
#define API_SLOTS 4
static py_api_t api_slots[API_SLOTS];
static int api_used;                            /* slots filled, under state_lock */
static _Atomic(py_api_t *) api_cur;             /* NULL: no interpreter known */
static _Atomic unsigned long loaded_gen = ~0ul; /* dlpi_adds when last resolved */
static _Atomic uintptr_t eval_lo, eval_hi;      /* [lo, hi) of the eval loop, 0 when unknown */
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;

static _Thread_local int in_capture; /* reentrancy guard */

static _Atomic uint64_t st_captures, st_frames, st_gil, st_str_bytes, st_str_dropped;

static int first_adds(struct dl_phdr_info *info, size_t size, void *data)
{
    /* dlpi_adds exists since glibc 2.4; size tells whether the field is there. */
    if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
        *(unsigned long *)data = (unsigned long)info->dlpi_adds;
    return 1;
}

static unsigned long loader_generation(void)
{
    unsigned long adds = 0;
    dl_iterate_phdr(first_adds, &adds);
    return adds;
}

#define SYM(field, name) (*(void **)&a.field = dlsym(RTLD_DEFAULT, name))

static bool version_is_311(void)
{
    const char *(*ver)(void);
    *(void **)&ver = dlsym(RTLD_DEFAULT, "Py_GetVersion");
    if (ver == NULL)
        return false;
    const char *v = ver();
    return v != NULL && strncmp(v, "3.11.", 5) == 0;
}

static void eval_range_find(void)
{
    void *fn = dlsym(RTLD_DEFAULT, "_PyEval_EvalFrameDefault");
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (fn == NULL || dladdr1(fn, &info, (void **)&sym, RTLD_DL_SYMENT) == 0 || sym == NULL ||
        sym->st_size == 0)
        return;
    uintptr_t lo = (uintptr_t)info.dli_saddr;
    atomic_store_explicit(&eval_hi, lo + sym->st_size, memory_order_relaxed);
    atomic_store_explicit(&eval_lo, lo, memory_order_release);
}

/* Resolves the API under state_lock. Leaves api_cur NULL when a needed symbol is missing. */
static void resolve_locked(void)
{
    py_api_t a = {0};
    SYM(is_initialized, "Py_IsInitialized");
    if (SYM(is_finalizing, "Py_IsFinalizing") == NULL)
        SYM(is_finalizing, "_Py_IsFinalizing");
    SYM(this_tstate, "PyGILState_GetThisThreadState");
    SYM(gil_check, "PyGILState_Check");
    SYM(gil_ensure, "PyGILState_Ensure");
    SYM(gil_release, "PyGILState_Release");
    SYM(get_frame, "PyEval_GetFrame");
    SYM(frame_code, "PyFrame_GetCode");
    SYM(frame_back, "PyFrame_GetBack");
    SYM(frame_line, "PyFrame_GetLineNumber");
    SYM(getattr, "PyObject_GetAttrString");
    SYM(utf8, "PyUnicode_AsUTF8");
    SYM(incref, "Py_IncRef");
    SYM(decref, "Py_DecRef");
    SYM(err_fetch, "PyErr_Fetch");
    SYM(err_restore, "PyErr_Restore");
    void **p = (void **)&a;
    for (size_t i = 0; i < offsetof(py_api_t, layout_311) / sizeof(void *); i++) {
        if (p[i] == NULL) {
            atomic_store(&api_cur, NULL);
            return;
        }
    }
    a.layout_311 = version_is_311();
    py_api_t *cur = atomic_load(&api_cur);
    if (cur != NULL && memcmp(cur, &a, sizeof(a)) == 0)
        return;
    if (api_used == API_SLOTS)
        return; /* keep the last one: interpreters do not come and go in one process */
    api_slots[api_used] = a;
    atomic_store(&api_cur, &api_slots[api_used++]);
    eval_range_find();
}

void mt__pyframes_refresh(void)
{
    pthread_mutex_lock(&state_lock);
    atomic_store(&loaded_gen, loader_generation());
    resolve_locked();
    pthread_mutex_unlock(&state_lock);
}

/* The loader's count is read on a thread's first capture and then every GEN_EVERY
 * captures: an interpreter loaded later (dlopen) is found within that many allocations,
 * and a process without one pays dl_iterate_phdr rarely. */
#define GEN_EVERY 64
static _Thread_local unsigned gen_countdown;

static py_api_t *api_get(void)
{
    if (gen_countdown-- != 0)
        return atomic_load_explicit(&api_cur, memory_order_acquire);
    gen_countdown = GEN_EVERY - 1;
    unsigned long gen = loader_generation();
    if (gen != atomic_load_explicit(&loaded_gen, memory_order_acquire)) {
        pthread_mutex_lock(&state_lock);
        if (gen != atomic_load(&loaded_gen)) {
            resolve_locked();
            atomic_store(&loaded_gen, gen);
        }
        pthread_mutex_unlock(&state_lock);
    }
    return atomic_load_explicit(&api_cur, memory_order_acquire);
}

bool mt__pyframes_ip_is_eval(uintptr_t ip)
{
    uintptr_t lo = atomic_load_explicit(&eval_lo, memory_order_acquire);
    return lo != 0 && ip >= lo && ip < atomic_load_explicit(&eval_hi, memory_order_relaxed);
}

/* ---- interned names ----
 * Code objects map to their (qualified name, file) pair through a small open-addressed
 * table keyed by the code object's address. The table holds a reference on each code
 * object, so an address is never reused for another while it is cached. Strings live in
 * chunks that are never freed; their total is capped. Everything here runs holding the GIL
 * and state_lock. */

#define CODE_SLOTS 4096 /* power of two; past 3/4 full, new code objects are not cached */
#define CHUNK_SIZE 65536

typedef struct code_ent_s {
    pyobj *code;      /* referenced, or NULL */
    const char *func; /* interned */
    const char *file; /* interned */
} code_ent_t;

static code_ent_t code_tab[CODE_SLOTS];
static int code_used;
static char *chunk;
static size_t chunk_left;

/* Interned strings are also found by text (a code object that is not cached, past the
 * table's fill, still names the same string): STR_SLOTS pointers, open addressing. */
#define STR_SLOTS 32768 /* power of two; past 3/4 full, strings are still stored, not indexed */
static const char *str_tab[STR_SLOTS];
static size_t str_used;

static size_t str_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (size_t)(h >> 17) & (STR_SLOTS - 1);
}

static const char *intern(const char *s)
{
    size_t n = strlen(s) + 1, j = str_hash(s);
    while (str_tab[j] != NULL) {
        if (strcmp(str_tab[j], s) == 0)
            return str_tab[j];
        j = (j + 1) & (STR_SLOTS - 1);
    }
    if (n > 4096 || atomic_load(&st_str_bytes) + n > MT_PYFRAMES_STR_CAP)
        goto dropped;
    if (n > chunk_left) {
        chunk = malloc(CHUNK_SIZE);
        if (chunk == NULL) {
            chunk_left = 0;
            goto dropped;
        }
        chunk_left = CHUNK_SIZE;
    }
    char *out = chunk;
    memcpy(out, s, n);
    chunk += n;
    chunk_left -= n;
    atomic_fetch_add(&st_str_bytes, n);
    if (str_used < STR_SLOTS / 4 * 3) {
        str_tab[j] = out;
        str_used++;
    }
    return out;
dropped:
    atomic_fetch_add(&st_str_dropped, 1);
    return NULL;
}

static const char *attr_utf8(const py_api_t *a, pyobj *o, const char *name, pyobj **hold)
{
    *hold = a->getattr(o, name);
    return *hold == NULL ? NULL : a->utf8(*hold);
}

/* Fills ent's names from code (interned) without caching. */
static void names_of(const py_api_t *a, pyobj *code, code_ent_t *ent)
{
    pyobj *qn = NULL, *fn = NULL;
    const char *q = attr_utf8(a, code, "co_qualname", &qn);
    if (q == NULL) {
        if (qn != NULL)
            a->decref(qn);
        q = attr_utf8(a, code, "co_name", &qn);
    }
    const char *f = attr_utf8(a, code, "co_filename", &fn);
    ent->func = q != NULL ? intern(q) : NULL;
    ent->file = f != NULL ? intern(f) : NULL;
    if (ent->func == NULL)
        ent->func = "<python>";
    if (ent->file == NULL)
        ent->file = "?";
    if (qn != NULL)
        a->decref(qn);
    if (fn != NULL)
        a->decref(fn);
}

static void code_names(const py_api_t *a, pyobj *code, const char **func, const char **file)
{
    size_t h = ((uintptr_t)code >> 4) * 0x9E3779B97F4A7C15ull >> 52; /* 12 bits */
    for (size_t i = 0; i < CODE_SLOTS; i++) {
        code_ent_t *e = &code_tab[(h + i) & (CODE_SLOTS - 1)];
        if (e->code == code) {
            *func = e->func;
            *file = e->file;
            return;
        }
        if (e->code == NULL) {
            code_ent_t tmp;
            names_of(a, code, &tmp);
            if (code_used < CODE_SLOTS / 4 * 3) {
                a->incref(code);
                tmp.code = code;
                *e = tmp;
                code_used++;
            }
            *func = tmp.func;
            *file = tmp.file;
            return;
        }
    }
}

/* ---- capture ---- */

/* The 3.11 layouts (CPython Include/internal/pycore_frame.h, Include/cpython/frameobject.h):
 * PyFrameObject { PyObject_HEAD; f_back; _PyInterpreterFrame *f_frame; ... } and
 * _PyInterpreterFrame { f_func, f_globals, f_builtins, f_locals, f_code, frame_obj, previous,
 * prev_instr; int stacktop; bool is_entry; ... }. Read only after checking that f_code and
 * frame_obj agree with the public API's answers. */
#define F311_FRAME_OFF    (2 * sizeof(void *) + sizeof(void *))
#define IF311_CODE_OFF    (4 * sizeof(void *))
#define IF311_FRAMEOBJ    (5 * sizeof(void *))
#define IF311_ISENTRY_OFF (8 * sizeof(void *) + sizeof(int))

static int entry_311(pyobj *frame, pyobj *code)
{
    const char *iframe = *(char *const *)((const char *)frame + F311_FRAME_OFF);
    if (iframe == NULL || *(pyobj *const *)(iframe + IF311_CODE_OFF) != code ||
        *(pyobj *const *)(iframe + IF311_FRAMEOBJ) != frame)
        return -1;
    return *(const unsigned char *)(iframe + IF311_ISENTRY_OFF) != 0;
}

static int walk(const py_api_t *a, mt_pyframe_t *out, int cap, bool *truncated)
{
    pyobj *et, *ev, *tb;
    a->err_fetch(&et, &ev, &tb);
    int n = 0;
    bool entries_known = a->layout_311;
    pyobj *f = a->get_frame();
    if (f != NULL)
        a->incref(f);
    pthread_mutex_lock(&state_lock);
    while (f != NULL && n < cap && n < MT_PYFRAMES_DEPTH) {
        pyobj *code = a->frame_code(f);
        mt_pyframe_t *o = &out[n++];
        code_names(a, code, &o->func, &o->file);
        int line = a->frame_line(f);
        o->line = line > 0 ? line : 0;
        o->entry = 0;
        if (entries_known) {
            int e = entry_311(f, code);
            if (e < 0)
                entries_known = false;
            else
                o->entry = (uint8_t)e;
        }
        a->decref(code);
        pyobj *back = a->frame_back(f);
        a->decref(f);
        f = back;
    }
    pthread_mutex_unlock(&state_lock);
    if (truncated != NULL)
        *truncated = f != NULL;
    if (f != NULL)
        a->decref(f);
    if (!entries_known) {
        for (int i = 0; i < n; i++)
            out[i].entry = 0;
    }
    if (n > 0 && !(f != NULL && entries_known))
        out[n - 1].entry = 1; /* the outermost frame ends the last group */
    a->err_restore(et, ev, tb);
    return n;
}

int mt__pyframes_capture(mt_pyframe_t *out, int cap, bool *truncated)
{
    if (truncated != NULL)
        *truncated = false;
    if (cap <= 0 || in_capture)
        return 0;
    py_api_t *a = api_get();
    if (a == NULL || !a->is_initialized() || a->is_finalizing())
        return 0;
    /* A thread the interpreter does not know gets no thread state made for it. */
    if (a->this_tstate() == NULL)
        return 0;
    in_capture = 1;
    int held = a->gil_check();
    int gstate = 0;
    if (!held) {
        gstate = a->gil_ensure();
        atomic_fetch_add_explicit(&st_gil, 1, memory_order_relaxed);
    }
    int n = walk(a, out, cap, truncated);
    if (!held)
        a->gil_release(gstate);
    in_capture = 0;
    atomic_fetch_add_explicit(&st_captures, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&st_frames, (uint64_t)n, memory_order_relaxed);
    return n;
}

/* ---- interleaving ---- */

int mt__pyframes_merge(const uintptr_t *ips, int n_ips, const mt_pyframe_t *py, int n_py,
                       int32_t *out, int cap)
{
    int k = 0, j = 0, last_eval = -1;
    for (int i = 0; i < n_ips; i++) {
        if (j >= n_py || !mt__pyframes_ip_is_eval(ips[i])) {
            if (k < cap)
                out[k++] = i;
            continue;
        }
        while (j < n_py && k < cap) {
            out[k++] = -(j + 1);
            if (py[j++].entry)
                break;
        }
        last_eval = k;
    }
    if (j < n_py) {
        /* Frames with no eval frame left: after the last group, or after the innermost
         * native frame when the unwinder saw no eval frame at all. */
        int at = last_eval >= 0 ? last_eval : (k > 0 ? 1 : 0);
        int rest = n_py - j;
        if (k + rest > cap)
            rest = cap - k;
        memmove(out + at + rest, out + at, (size_t)(k - at) * sizeof(*out));
        for (int r = 0; r < rest; r++)
            out[at + r] = -(j + r + 1);
        k += rest;
    }
    return k;
}

void mt__pyframes_stats(mt__pyframes_stats_t *out)
{
    out->captures = atomic_load(&st_captures);
    out->frames = atomic_load(&st_frames);
    out->gil_ensured = atomic_load(&st_gil);
    out->str_bytes = atomic_load(&st_str_bytes);
    out->str_dropped = atomic_load(&st_str_dropped);
}
