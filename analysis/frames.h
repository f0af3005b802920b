/* The user's frame of a call stack: which frames are the recorder's, the framework's or the
 * interpreter's, and which is the first one that belongs to the program being measured.
 * The rules are data (a table of patterns, each with its reason; docs/frames.md lists the
 * default one), extended by the user (`memtrace report --skip-frames`) or turned off
 * (`--frames all`). Used for PyTorch snapshots and memtrace's own stacks alike. */
#ifndef MT_ANALYSIS_FRAMES_H
#define MT_ANALYSIS_FRAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One frame as the rules see it; every string may be NULL (unknown). */
typedef struct mt_fr_frame_s {
    const char *func;   /* function as recorded (C++ demangled, Python qualified) */
    const char *file;   /* source file, "??" or "" when unknown */
    int64_t line;       /* >= 0; 0 unknown */
    const char *module; /* shared object of a native frame, or NULL */
    bool python;        /* a Python frame (its file is a .py) */
} mt_fr_frame_t;

typedef enum mt_fr_kind_e {
    MT_FR_FUNC = 0,       /* the function starts with pattern, or a word of it does (after ' ') */
    MT_FR_FILE,           /* the file contains pattern */
    MT_FR_FILE_IS,        /* the file is pattern */
    MT_FR_NATIVE_FILE,    /* a native frame whose file contains pattern (CPython's sources) */
    MT_FR_MODULE,         /* the module contains pattern */
    MT_FR_NATIVE_NO_FILE, /* a native frame without a source file (pattern unused) */
} mt_fr_kind_e;

typedef enum mt_fr_class_e {
    MT_FR_RECORDER = 0, /* the recorder and the allocator: never the answer */
    MT_FR_FRAMEWORK,    /* the framework, the interpreter, installed packages */
    MT_FR_USER_RULE,    /* added by the user */
} mt_fr_class_e;

typedef struct mt_fr_rule_s {
    uint8_t kind;        /* mt_fr_kind_e */
    uint8_t cls;         /* mt_fr_class_e */
    const char *pattern; /* borrowed (static for the defaults) */
    const char *reason;  /* why such frames are not the user's */
} mt_fr_rule_t;

/* The name of a stack with no frames, wherever a site is named. */
#define MT_FR_NO_STACK "no stack recorded"

/* The default table (static), *n its length. */
const mt_fr_rule_t *mt__fr_default_rules(size_t *n);

/* A set of rules: the defaults (unless all), then the user's. */
typedef struct mt_fr_rules_s mt_fr_rules_t;

/* new; all: no rule applies (every frame is the user's; site = innermost frame). */
int mt__fr_rules_create(mt_fr_rules_t **out, bool all);
void mt__fr_rules_destroy(mt_fr_rules_t **p);
/* Adds a user rule from text: "func:PREFIX", "file:TEXT", "module:TEXT", or TEXT alone
 * (a function prefix or a file's text). spec is copied. 0, MT_EINVAL (empty pattern),
 * MT_ENOMEM. */
int mt__fr_rules_add(mt_fr_rules_t *r, const char *spec);
bool mt__fr_rules_all(const mt_fr_rules_t *r);

/* The rule that skips f, or NULL when f may be the user's. r NULL: the defaults. */
const mt_fr_rule_t *mt__fr_match(const mt_fr_rules_t *r, const mt_fr_frame_t *f);

/* Index of the user's frame among frames[0, n) (innermost first): the first no rule skips;
 * when every frame is skipped, the first that is not the recorder's; when all are, 0.
 * -1 when n == 0. */
int mt__fr_pick(const mt_fr_rules_t *r, const mt_fr_frame_t *frames, size_t n);

/* ---- names and grouping keys ---- */

typedef enum mt_fr_by_e {
    MT_FR_BY_SITE = 0, /* "transformer.py:54 forward" */
    MT_FR_BY_FUNCTION, /* "forward (transformer.py)" */
    MT_FR_BY_FILE,     /* "transformer.py" (the file's last component) */
    MT_FR_BY_MODULE,   /* a native frame's shared object, a Python file without ".py";
                        * without either, "autograd" or "aten" for a node's or op's frame */
    MT_FR_BY_STACK,    /* the kept frames' sites from the user's frame out, " <- " between */
    MT_FR_BY_TAG,      /* memtrace's tag (not a frame key: the report's tag sections) */
    MT_FR_BY_MODULES,  /* the nn.Module chain: each module's forward frame, outermost first,
                        * " > " between, ending at the user's frame */
    MT_FR_BY_COUNT,
} mt_fr_by_e;

/* "site", "function", ... ; NULL out of range. */
const char *mt__fr_by_name(int by);
/* The mt_fr_by_e of a name ("callsite" is "site"), or -1. */
int mt__fr_by_parse(const char *name);

/* The site of f as PyTorch users read it: "file.py:54 forward" (the file's last component),
 * "forward" without a file, "libx.so" with only a module, "??" with nothing. */
const char *mt__fr_site(const mt_fr_frame_t *f, char *buf, size_t len);
/* f's key for by (not MT_FR_BY_STACK, MT_FR_BY_TAG) into buf. */
const char *mt__fr_key(const mt_fr_frame_t *f, int by, char *buf, size_t len);
/* True for torch's module call frame (nn.Module._call_impl / _wrapped_call_impl). */
bool mt__fr_module_call(const mt_fr_frame_t *f);
/* The key of a whole stack for by: for MT_FR_BY_STACK the sites of user frame and the frames
 * after it that no rule skips (every frame with an "all" set); for MT_FR_BY_MODULES the
 * user's frame and, outwards, the frames that a module call frame calls (a module's
 * forward), up to the first kept frame past them that is none (the training loop); else
 * mt__fr_key of the user's frame. Truncated to len with "..." at the end. */
const char *mt__fr_stack_key(const mt_fr_rules_t *r, const mt_fr_frame_t *frames, size_t n, int by,
                             char *buf, size_t len);

#endif
