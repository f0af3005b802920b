/* The user's frame of a call stack (frames.h): the default rules, matching, names and keys.
 * docs/frames.md explains the table; keep the two in step. */
#include "analysis/frames.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace/alloc.h"
#include "util/text.h"

/* ---- the default table ----
 * Recorder rules come first: a frame they match is never the site, even when every frame
 * of its stack is skipped (mt__fr_pick's fallback). Function rules of the defaults apply to
 * native frames only: a Python function named like a C++ namespace is still the user's. */
#define R(kind, cls, pat, why)                                                                     \
    {                                                                                              \
        kind, cls, pat, why                                                                        \
    }
static const mt_fr_rule_t defaults[] = {
    /* the recorders and the allocators */
    R(MT_FR_FUNC, MT_FR_RECORDER, "torch::unwind::", "PyTorch's stack unwinder"),
    R(MT_FR_FUNC, MT_FR_RECORDER, "torch::CapturedTraceback::", "PyTorch's traceback capture"),
    R(MT_FR_FUNC, MT_FR_RECORDER, "torch::cuda::(anonymous namespace)::gather",
      "PyTorch's memory-history recorder"),
    R(MT_FR_FILE, MT_FR_RECORDER, "memory_snapshot.cpp", "PyTorch's memory-history recorder"),
    R(MT_FR_FUNC, MT_FR_RECORDER, "gather_traceback", "the profiler's traceback capture"),
    R(MT_FR_FUNC, MT_FR_RECORDER, "c10::cuda::CUDACachingAllocator::", "PyTorch's CUDA allocator"),
    R(MT_FR_FILE, MT_FR_RECORDER, "CUDACachingAllocator", "PyTorch's CUDA allocator"),
    R(MT_FR_FUNC, MT_FR_RECORDER, "mt_", "memtrace's recorder"),
    R(MT_FR_MODULE, MT_FR_RECORDER, "libmemtrace", "memtrace's recorder"),
    R(MT_FR_FILE_IS, MT_FR_RECORDER, "memtrace", "memtrace's tag frame"),
    /* the framework's C++ */
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "c10::", "PyTorch's core (c10)"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "at::", "ATen operators and the dispatcher"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "torch::", "PyTorch's C++ (autograd, Python bindings)"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "caffe2::", "PyTorch's C++"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "pybind11::", "Python bindings"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "THP", "PyTorch's Python bindings (THPVariable_clear, ...)"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "std::", "the C++ standard library"),
    R(MT_FR_FILE, MT_FR_FRAMEWORK, "Dispatcher.h", "the dispatcher"),
    R(MT_FR_FILE, MT_FR_FRAMEWORK, "BoxedKernel", "the dispatcher's boxing"),
    R(MT_FR_FILE, MT_FR_FRAMEWORK, "core/boxing", "the dispatcher's boxing"),
    R(MT_FR_FILE, MT_FR_FRAMEWORK, "VariableType", "autograd's generated kernels"),
    R(MT_FR_FILE, MT_FR_FRAMEWORK, "ADInplaceOrView", "autograd's generated kernels"),
    R(MT_FR_MODULE, MT_FR_FRAMEWORK, "libtorch", "PyTorch's libraries"),
    R(MT_FR_MODULE, MT_FR_FRAMEWORK, "libc10", "PyTorch's libraries"),
    /* the interpreter (CPython's eval loop and calls) */
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "_Py", "CPython's internals"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "Py", "CPython's C API"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "cfunction_", "CPython's calls"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "method_vectorcall", "CPython's calls"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "slot_tp_", "CPython's calls"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "type_call", "CPython's calls"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "do_call_core", "CPython's eval loop"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "__libc_start", "the C library's start-up"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "_start", "the C library's start-up"),
    R(MT_FR_NATIVE_FILE, MT_FR_FRAMEWORK, "Objects/", "CPython's objects and calls"),
    R(MT_FR_NATIVE_FILE, MT_FR_FRAMEWORK, "Python/", "CPython's eval loop and built-ins"),
    R(MT_FR_NATIVE_FILE, MT_FR_FRAMEWORK, "Modules/", "CPython's C modules"),
    R(MT_FR_NATIVE_FILE, MT_FR_FRAMEWORK, "Include/", "CPython's inline calls"),
    R(MT_FR_NATIVE_FILE, MT_FR_FRAMEWORK, "Programs/", "CPython's start-up"),
    R(MT_FR_FILE, MT_FR_FRAMEWORK, "eval_frame.c", "TorchDynamo's frame hook"),
    R(MT_FR_MODULE, MT_FR_FRAMEWORK, "libpython", "CPython"),
    R(MT_FR_NATIVE_FILE, MT_FR_FRAMEWORK, "libstdc++", "the C++ standard library"),
    R(MT_FR_NATIVE_FILE, MT_FR_FRAMEWORK, "/glibc-", "the C library (its build tree's sources)"),
    R(MT_FR_NATIVE_FILE, MT_FR_FRAMEWORK, "/nptl/", "the C library's threads (./nptl/...)"),
    R(MT_FR_NATIVE_FILE, MT_FR_FRAMEWORK, "/sysdeps/",
      "the C library's system calls (./misc/../sysdeps/...)"),
    R(MT_FR_FUNC, MT_FR_FRAMEWORK, "execute_native_thread_routine",
      "the C++ standard library's thread start (autograd's engine threads)"),
    R(MT_FR_NATIVE_FILE, MT_FR_FRAMEWORK, ".cudafe1.",
      "a CUDA library's kernels (nvcc's "
      "intermediate file)"),
    R(MT_FR_NATIVE_NO_FILE, MT_FR_FRAMEWORK, "",
      "a native frame with no source file: a "
      "library or the interpreter, not code being developed"),
    /* installed Python packages and the standard library */
    R(MT_FR_FILE, MT_FR_FRAMEWORK, "site-packages/", "an installed package"),
    R(MT_FR_FILE, MT_FR_FRAMEWORK, "dist-packages/", "an installed package"),
    R(MT_FR_FILE, MT_FR_FRAMEWORK, "/torch/", "PyTorch's Python (torch/nn/modules/module.py, ...)"),
    R(MT_FR_FILE, MT_FR_FRAMEWORK, "/lib/python3", "Python's standard library"),
    R(MT_FR_FILE, MT_FR_FRAMEWORK, "/Lib/", "Python's standard library (a Windows install)"),
    R(MT_FR_FILE, MT_FR_FRAMEWORK, "<frozen ", "Python's frozen start-up modules"),
    R(MT_FR_FILE, MT_FR_FRAMEWORK, "torchinductor_", "TorchInductor's generated code"),
};
#undef R

const mt_fr_rule_t *mt__fr_default_rules(size_t *n)
{
    *n = sizeof defaults / sizeof defaults[0];
    return defaults;
}

/* ---- a set of rules ---- */

struct mt_fr_rules_s {
    bool all;           /* no rule applies */
    mt_fr_rule_t *user; /* [nuser], patterns owned */
    size_t nuser;
};

int mt__fr_rules_create(mt_fr_rules_t **out, bool all)
{
    *out = calloc(1, sizeof **out);
    if (*out == NULL)
        return MT_ENOMEM;
    (*out)->all = all;
    return 0;
}

void mt__fr_rules_destroy(mt_fr_rules_t **p)
{
    if (*p == NULL)
        return;
    for (size_t i = 0; i < (*p)->nuser; i++)
        free((char *)(*p)->user[i].pattern);
    free((*p)->user);
    free(*p);
    *p = NULL;
}

bool mt__fr_rules_all(const mt_fr_rules_t *r)
{
    return r != NULL && r->all;
}

/* A rule of text alone matches either way: kept as two rules with one pattern string. */
static int add_rule(mt_fr_rules_t *r, int kind, const char *pat, size_t len)
{
    mt_fr_rule_t *u = realloc(r->user, (r->nuser + 1) * sizeof *u);
    if (u == NULL)
        return MT_ENOMEM;
    r->user = u;
    char *p = strndup(pat, len);
    if (p == NULL)
        return MT_ENOMEM;
    u[r->nuser++] = (mt_fr_rule_t){(uint8_t)kind, MT_FR_USER_RULE, p, "--skip-frames"};
    return 0;
}

int mt__fr_rules_add(mt_fr_rules_t *r, const char *spec)
{
    static const struct {
        const char *prefix;
        int kind;
    } kinds[] = {{"func:", MT_FR_FUNC}, {"file:", MT_FR_FILE}, {"module:", MT_FR_MODULE}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        size_t pl = strlen(kinds[i].prefix);
        if (strncmp(spec, kinds[i].prefix, pl) == 0) {
            if (spec[pl] == '\0')
                return MT_EINVAL;
            return add_rule(r, kinds[i].kind, spec + pl, strlen(spec + pl));
        }
    }
    if (spec[0] == '\0')
        return MT_EINVAL;
    int rc = add_rule(r, MT_FR_FUNC, spec, strlen(spec));
    return rc ? rc : add_rule(r, MT_FR_FILE, spec, strlen(spec));
}

/* ---- matching ---- */

static bool no_file(const char *file)
{
    return file == NULL || file[0] == '\0' || strcmp(file, "??") == 0;
}

/* A path's characters as the rules see them: a Windows path's '\\' is a '/' (snapshots
 * recorded on Windows name files "D:\\proj\\.venv\\Lib\\site-packages\\...). */
static inline char path_char(char c)
{
    return c == '\\' ? '/' : c;
}

/* The position of pat in file, or NULL, with '\\' read as '/' (path_char). */
static const char *path_find(const char *file, const char *pat)
{
    if (strchr(file, '\\') == NULL)
        return strstr(file, pat); /* (the usual path: the C library's search) */
    size_t pl = strlen(pat);
    for (const char *s = file; *s != '\0'; s++) {
        size_t i = 0;
        while (i < pl && s[i] != '\0' && path_char(s[i]) == pat[i])
            i++;
        if (i == pl)
            return s;
    }
    return pl == 0 ? file : NULL;
}

#define ANON_NS "(anonymous namespace)::"

/* The function starts with pat, or one of its words does: a C++ name may begin with its
 * return type ("void at::native::f<float>()"), and a function of a file's own may begin
 * with its unnamed namespace ("(anonymous namespace)::THPFunction_apply(...)"). */
static bool func_match(const char *func, const char *pat)
{
    size_t pl = strlen(pat);
    for (const char *s = func; s != NULL; s = strchr(s, ' ')) {
        while (*s == ' ')
            s++;
        if (strncmp(s, ANON_NS, strlen(ANON_NS)) == 0 && strncmp(pat, ANON_NS, strlen(ANON_NS)))
            s += strlen(ANON_NS);
        if (strncmp(s, pat, pl) == 0)
            return true;
    }
    return false;
}

static bool rule_match(const mt_fr_rule_t *r, const mt_fr_frame_t *f, bool builtin)
{
    switch (r->kind) {
    case MT_FR_FUNC:
        return f->func != NULL && !(builtin && f->python) && func_match(f->func, r->pattern);
    case MT_FR_FILE:
        /* "/torch/" also matches a relative "torch/..." */
        return f->file != NULL &&
               (path_find(f->file, r->pattern) != NULL ||
                (r->pattern[0] == '/' && path_find(f->file, r->pattern + 1) == f->file));
    case MT_FR_NATIVE_FILE:
        return !f->python && f->file != NULL && path_find(f->file, r->pattern) != NULL;
    case MT_FR_FILE_IS:
        return f->file != NULL && strcmp(f->file, r->pattern) == 0;
    case MT_FR_MODULE:
        return f->module != NULL && strstr(f->module, r->pattern) != NULL;
    case MT_FR_NATIVE_NO_FILE:
        return !f->python && no_file(f->file);
    default:
        return false;
    }
}

const mt_fr_rule_t *mt__fr_match(const mt_fr_rules_t *r, const mt_fr_frame_t *f)
{
    if (r != NULL && r->all)
        return NULL;
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (rule_match(&defaults[i], f, true))
            return &defaults[i];
    for (size_t i = 0; r != NULL && i < r->nuser; i++)
        if (rule_match(&r->user[i], f, false))
            return &r->user[i];
    return NULL;
}

#define AUTOGRAD "torch::autograd::"
#define ATEN_OP  "at::_ops::"

/* The name of the autograd node whose apply fn is ("DivBackward0" of
 * torch::autograd::generated::DivBackward0::apply(...), "AccumulateGrad", "CopySlices"),
 * *len its length; NULL when fn is no node's apply. */
static const char *node_name(const char *fn, int *len)
{
    const char *ap = strstr(fn, "::apply(");
    if (strncmp(fn, AUTOGRAD, strlen(AUTOGRAD)) != 0 || ap == NULL ||
        ap < fn + strlen(AUTOGRAD) + 1)
        return NULL;
    for (const char *c = fn + strlen(AUTOGRAD); c < ap; c++)
        if (!isalnum((unsigned char)*c) && *c != '_' && *c != ':')
            return NULL; /* ("::apply(" inside a template's or a parameter's text) */
    const char *s = ap;
    while (s > fn + strlen(AUTOGRAD) && !(s[-1] == ':' && s[-2] == ':'))
        s--;
    *len = (int)(ap - s);
    return s;
}

/* How well a framework frame says what ran, for a stack with no frame of the user's:
 * autograd's node (the backward function whose step allocated, or the accumulation of a
 * gradient) 2, an ATen operator's entry 1, any other 0. */
static int fallback_rank(const mt_fr_frame_t *f)
{
    const char *fn = f->func;
    int len;
    if (fn == NULL || f->python)
        return 0;
    if (node_name(fn, &len) != NULL)
        return 2;
    if (strncmp(fn, ATEN_OP, strlen(ATEN_OP)) == 0 &&
        (strstr(fn, "::call(") != NULL || strstr(fn, "::redispatch(") != NULL))
        return 1;
    return 0;
}

int mt__fr_pick(const mt_fr_rules_t *r, const mt_fr_frame_t *frames, size_t n)
{
    if (n == 0)
        return -1;
    int fallback = -1, best = -1, rank = 0;
    for (size_t i = 0; i < n; i++) {
        const mt_fr_rule_t *m = mt__fr_match(r, &frames[i]);
        if (m == NULL)
            return (int)i;
        if (m->cls == MT_FR_RECORDER)
            continue;
        int k = fallback_rank(&frames[i]);
        if (fallback < 0)
            fallback = (int)i;
        if (k > rank) {
            rank = k;
            best = (int)i;
        }
    }
    return best >= 0 ? best : fallback >= 0 ? fallback : 0;
}

/* ---- names and keys ---- */

static const char *const by_names[MT_FR_BY_COUNT] = {"site",  "function", "file",   "module",
                                                     "stack", "tag",      "modules"};

const char *mt__fr_by_name(int by)
{
    return by >= 0 && by < MT_FR_BY_COUNT ? by_names[by] : NULL;
}

int mt__fr_by_parse(const char *name)
{
    if (strcmp(name, "callsite") == 0)
        return MT_FR_BY_SITE;
    for (int i = 0; i < MT_FR_BY_COUNT; i++)
        if (strcmp(name, by_names[i]) == 0)
            return i;
    return -1;
}

static const char *base_name(const char *path)
{
    const char *b = strrchr(path, '/'), *w = strrchr(path, '\\');
    b = w > b ? w : b; /* (a Windows path's last separator) */
    return b ? b + 1 : path;
}

/* buf as snprintf cut it may end inside a character (names are UTF-8): the part goes.
 * Returns buf. */
static char *whole_chars(char *buf)
{
    size_t i = strlen(buf), n = i;
    while (i > 0 && n - i < 3 && ((unsigned char)buf[i - 1] & 0xc0) == 0x80)
        i--;
    if (i > 0 && (unsigned char)buf[i - 1] >= 0x80 &&
        mt__text_utf8_len((const unsigned char *)buf + i - 1) == 0)
        buf[i - 1] = '\0';
    return buf;
}

/* "..." at the end of buf[len] (len > 4), over whole characters. */
static void cut_dots(char *buf, size_t len)
{
    size_t at = len - 4;
    while (at > 0 && ((unsigned char)buf[at] & 0xc0) == 0x80)
        at--;
    memcpy(buf + at, "...", 4);
}

/* The name of an autograd node or ATen operator that fallback_rank ranks, as PyTorch's
 * profiler writes it ("NllLossBackward0", "aten::nll_loss_backward"), into buf; NULL for
 * any other frame. */
static const char *op_name(const mt_fr_frame_t *f, char *buf, size_t len)
{
    int k = fallback_rank(f), n;
    if (k == 0)
        return NULL;
    if (k == 2) {
        const char *name = node_name(f->func, &n);
        snprintf(buf, len, "%.*s (autograd)", n, name);
        return buf;
    }
    const char *name = f->func + strlen(ATEN_OP);
    const char *end = strstr(name, "::");
    snprintf(buf, len, "aten::%.*s", (int)(end ? end - name : 0), name);
    return buf;
}

const char *mt__fr_site(const mt_fr_frame_t *f, char *buf, size_t len)
{
    const char *func = f->func != NULL && f->func[0] ? f->func : NULL;
    if (op_name(f, buf, len) != NULL)
        return buf;
    if (!no_file(f->file)) {
        const char *b = base_name(f->file);
        if (f->line > 0)
            snprintf(buf, len, "%s:%lld%s%s", b, (long long)f->line, func ? " " : "",
                     func ? func : "");
        else
            snprintf(buf, len, "%s%s%s", b, func ? " " : "", func ? func : "");
    } else if (func != NULL) {
        snprintf(buf, len, "%s", func);
    } else if (f->module != NULL) {
        snprintf(buf, len, "%s", base_name(f->module));
    } else {
        snprintf(buf, len, "??");
    }
    return whole_chars(buf);
}

const char *mt__fr_key(const mt_fr_frame_t *f, int by, char *buf, size_t len)
{
    const char *func = f->func != NULL && f->func[0] ? f->func : "??";
    const char *file = no_file(f->file) ? NULL : base_name(f->file);
    switch (by) {
    case MT_FR_BY_FUNCTION:
        if (file != NULL)
            snprintf(buf, len, "%s (%s)", func, file);
        else
            snprintf(buf, len, "%s", func);
        return whole_chars(buf);
    case MT_FR_BY_FILE:
        snprintf(buf, len, "%s", file ? file : f->module ? base_name(f->module) : "??");
        return whole_chars(buf);
    case MT_FR_BY_MODULE:
        if (f->module != NULL) {
            snprintf(buf, len, "%s", base_name(f->module));
        } else if (file != NULL) {
            const char *dot = strrchr(file, '.');
            int n = dot && strcmp(dot, ".py") == 0 ? (int)(dot - file) : (int)strlen(file);
            snprintf(buf, len, "%.*s", n, file);
        } else {
            /* PyTorch's C++ without a file or library: the part that ran, when known */
            int k = fallback_rank(f);
            snprintf(buf, len, "%s", k == 2 ? "autograd" : k == 1 ? "aten" : "??");
        }
        return whole_chars(buf);
    default:
        return mt__fr_site(f, buf, len);
    }
}

bool mt__fr_module_call(const mt_fr_frame_t *f)
{
    return f->func != NULL && f->file != NULL &&
           (strcmp(f->func, "_call_impl") == 0 || strcmp(f->func, "_wrapped_call_impl") == 0) &&
           strstr(f->file, "torch/nn/modules/module.py") != NULL;
}

/* Whether frames[i] is a module's forward: the nearest Python frame outwards of it is a
 * module call frame. */
static bool module_forward(const mt_fr_frame_t *frames, size_t n, size_t i)
{
    for (size_t j = i + 1; j < n; j++)
        if (frames[j].python)
            return mt__fr_module_call(&frames[j]);
    return false;
}

/* The nn.Module chain (MT_FR_BY_MODULES) from the user's frame u, outermost first. */
static const char *modules_key(const mt_fr_rules_t *r, const mt_fr_frame_t *frames, size_t n,
                               size_t u, char *buf, size_t len)
{
    size_t keep[64], nk = 0;
    bool in_model = false;
    keep[nk++] = u;
    for (size_t i = u + 1; i < n && nk < sizeof keep / sizeof keep[0]; i++) {
        if (mt__fr_match(r, &frames[i]) != NULL)
            continue;
        if (module_forward(frames, n, i)) {
            keep[nk++] = i;
            in_model = true;
        } else if (in_model) {
            break; /* past the outermost module: the loop that called the model */
        }
    }
    /* The user's frame alone counts as a module only when it is one's forward. */
    if (nk == 1 && !module_forward(frames, n, u)) {
        mt__fr_site(&frames[u], buf, len);
        return buf;
    }
    size_t used = 0;
    for (size_t k = nk; k-- > 0;) {
        char one[512];
        mt__fr_site(&frames[keep[k]], one, sizeof one);
        int w = snprintf(buf + used, len - used, "%s%s", used ? " > " : "", one);
        if (w < 0 || (size_t)w >= len - used) {
            if (len > 4)
                cut_dots(buf, len);
            return buf;
        }
        used += (size_t)w;
    }
    return buf;
}

const char *mt__fr_stack_key(const mt_fr_rules_t *r, const mt_fr_frame_t *frames, size_t n, int by,
                             char *buf, size_t len)
{
    if (len == 0)
        return buf;
    buf[0] = '\0';
    int u = mt__fr_pick(r, frames, n);
    if (u < 0) {
        snprintf(buf, len, MT_FR_NO_STACK);
        return buf;
    }
    if (by == MT_FR_BY_MODULES)
        return modules_key(r, frames, n, (size_t)u, buf, len);
    if (by != MT_FR_BY_STACK)
        return mt__fr_key(&frames[u], by, buf, len);
    size_t used = 0;
    for (size_t i = (size_t)u; i < n; i++) {
        if (i > (size_t)u && mt__fr_match(r, &frames[i]) != NULL)
            continue;
        char one[512];
        mt__fr_site(&frames[i], one, sizeof one);
        int w = snprintf(buf + used, len - used, "%s%s", used ? " <- " : "", one);
        if (w < 0 || (size_t)w >= len - used) {
            if (len > 4)
                cut_dots(buf, len);
            return buf;
        }
        used += (size_t)w;
    }
    return buf;
}
