/* The restricted pickle reader (pickle.h): one pass over the bytes, a stack machine for
 * the plain-data opcodes only, values in an arena. Opcodes and their operands follow
 * Python's Lib/pickletools.py, the format's own description. */
#include <stdlib.h>
#include <string.h>

#include "analysis/pickle.h"
#include "memtrace/common.h"

mt_pk_cfg_t mt_pk_cfg_default(void)
{
    return (mt_pk_cfg_t){
        .max_depth = 64,
        .max_stack = (size_t)1 << 20,
        .max_memo = (size_t)1 << 26,
        .max_memory = (size_t)4 << 30,
    };
}

/* ---- opcode names ---- */

static const struct {
    unsigned char op;
    const char *name;
} opnames[] = {
    {'I', "INT"},
    {'J', "BININT"},
    {'K', "BININT1"},
    {'M', "BININT2"},
    {'L', "LONG"},
    {0x8a, "LONG1"},
    {0x8b, "LONG4"},
    {'S', "STRING"},
    {'T', "BINSTRING"},
    {'U', "SHORT_BINSTRING"},
    {'B', "BINBYTES"},
    {'C', "SHORT_BINBYTES"},
    {0x8e, "BINBYTES8"},
    {0x96, "BYTEARRAY8"},
    {0x97, "NEXT_BUFFER"},
    {0x98, "READONLY_BUFFER"},
    {'N', "NONE"},
    {0x88, "NEWTRUE"},
    {0x89, "NEWFALSE"},
    {'V', "UNICODE"},
    {0x8c, "SHORT_BINUNICODE"},
    {'X', "BINUNICODE"},
    {0x8d, "BINUNICODE8"},
    {'F', "FLOAT"},
    {'G', "BINFLOAT"},
    {']', "EMPTY_LIST"},
    {'a', "APPEND"},
    {'e', "APPENDS"},
    {'l', "LIST"},
    {')', "EMPTY_TUPLE"},
    {'t', "TUPLE"},
    {0x85, "TUPLE1"},
    {0x86, "TUPLE2"},
    {0x87, "TUPLE3"},
    {'}', "EMPTY_DICT"},
    {'d', "DICT"},
    {'s', "SETITEM"},
    {'u', "SETITEMS"},
    {0x8f, "EMPTY_SET"},
    {0x90, "ADDITEMS"},
    {0x91, "FROZENSET"},
    {'0', "POP"},
    {'2', "DUP"},
    {'(', "MARK"},
    {'1', "POP_MARK"},
    {'g', "GET"},
    {'h', "BINGET"},
    {'j', "LONG_BINGET"},
    {'p', "PUT"},
    {'q', "BINPUT"},
    {'r', "LONG_BINPUT"},
    {0x94, "MEMOIZE"},
    {0x82, "EXT1"},
    {0x83, "EXT2"},
    {0x84, "EXT4"},
    {'c', "GLOBAL"},
    {0x93, "STACK_GLOBAL"},
    {'R', "REDUCE"},
    {'b', "BUILD"},
    {'i', "INST"},
    {'o', "OBJ"},
    {0x81, "NEWOBJ"},
    {0x92, "NEWOBJ_EX"},
    {0x80, "PROTO"},
    {'.', "STOP"},
    {0x95, "FRAME"},
    {'P', "PERSID"},
    {'Q', "BINPERSID"},
};

const char *mt_pk_opcode_name(unsigned op)
{
    for (size_t i = 0; i < sizeof opnames / sizeof opnames[0]; i++)
        if (opnames[i].op == op)
            return opnames[i].name;
    return "unknown";
}

const char *mt_pk_type_name(int type)
{
    static const char *names[] = {"None",  "bool",  "int",  "float", "str",
                                  "bytes", "tuple", "list", "dict"};
    return type >= 0 && type <= MT_PK_DICT ? names[type] : "unknown";
}

/* ---- the arena ---- */

typedef struct chunk_s {
    struct chunk_s *next;
    size_t used, size;
    _Alignas(16) unsigned char mem[];
} chunk_t;

enum { CHUNK = 1 << 20 };

struct mt_pk_doc_s {
    chunk_t *chunks; /* newest first; the head is the one being filled */
    size_t memory;   /* bytes of all chunks */
    const mt_pk_value_t *root;
};

/* The reader's state. Invariants: marks[i] <= marks[i+1] <= sp <= stack_cap;
 * memory = doc->memory + (stack_cap + memo_cap + marks_cap) * sizeof(pointer). */
typedef struct reader_s {
    const mt_pk_cfg_t *cfg;
    mt_pk_doc_t *doc;
    const unsigned char *p, *end, *start;
    mt_pk_value_t **stack;
    size_t sp, stack_cap;
    mt_pk_value_t **memo;
    size_t nmemo, memo_cap;
    size_t *marks;
    size_t nmarks, marks_cap;
    unsigned op;      /* the opcode being run */
    size_t op_offset; /* its offset */
    char *err;
    size_t errlen;
    int rc;
} reader_t;

static size_t memory_used(const reader_t *r)
{
    return r->doc->memory + (r->stack_cap + r->memo_cap) * sizeof(void *) +
           r->marks_cap * sizeof(size_t);
}

#include <stdarg.h>
__attribute__((format(printf, 3, 4))) static int fail(reader_t *r, int rc, const char *fmt, ...)
{
    if (r->rc != 0)
        return r->rc;
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(r->err, r->errlen, "offset %zu: %s (0x%02x): %s", r->op_offset,
             mt_pk_opcode_name(r->op), r->op, msg);
    r->rc = rc;
    return rc;
}

static void *arena_alloc(reader_t *r, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    chunk_t *c = r->doc->chunks;
    if (c == NULL || c->size - c->used < n) {
        size_t size = n > CHUNK / 4 ? n : CHUNK;
        if (memory_used(r) + size > r->cfg->max_memory) {
            fail(r, MT_ENOMEM, "the document would need more than the reader's %zu bytes",
                 r->cfg->max_memory);
            return NULL;
        }
        chunk_t *nc = malloc(sizeof *nc + size);
        if (nc == NULL) {
            fail(r, MT_ENOMEM, "out of memory");
            return NULL;
        }
        nc->used = 0;
        nc->size = size;
        r->doc->memory += sizeof *nc + size;
        if (c != NULL && size != CHUNK) {
            /* A big block of its own goes behind the head, which keeps its free room. */
            nc->next = c->next;
            c->next = nc;
        } else {
            nc->next = c;
            r->doc->chunks = nc;
        }
        c = nc;
    }
    void *m = c->mem + c->used;
    c->used += n;
    return m;
}

/* Grows an array of pointers to at least need entries, within the memory limit. */
static int grow(reader_t *r, void **arr, size_t *cap, size_t need, size_t elem, size_t limit,
                const char *what)
{
    if (need <= *cap)
        return 0;
    if (need > limit)
        return fail(r, MT_ENOMEM, "more than %zu %s (limit of this reader)", limit, what);
    size_t ncap = *cap ? *cap * 2 : 64;
    while (ncap < need)
        ncap *= 2;
    if (ncap > limit)
        ncap = limit;
    if (memory_used(r) + (ncap - *cap) * elem > r->cfg->max_memory)
        return fail(r, MT_ENOMEM, "the document would need more than the reader's %zu bytes",
                    r->cfg->max_memory);
    void *n = realloc(*arr, ncap * elem);
    if (n == NULL)
        return fail(r, MT_ENOMEM, "out of memory");
    *arr = n;
    *cap = ncap;
    return 0;
}

/* ---- values ---- */

static mt_pk_value_t *new_value(reader_t *r, int type)
{
    mt_pk_value_t *v = arena_alloc(r, sizeof *v);
    if (v == NULL)
        return NULL;
    memset(v, 0, sizeof *v);
    v->type = (uint8_t)type;
    v->depth = 1;
    return v;
}

static int push(reader_t *r, mt_pk_value_t *v)
{
    if (v == NULL)
        return r->rc;
    if (r->sp == r->stack_cap &&
        grow(r, (void **)&r->stack, &r->stack_cap, r->sp + 1, sizeof *r->stack, r->cfg->max_stack,
             "values on the stack") < 0)
        return r->rc;
    r->stack[r->sp++] = v;
    return 0;
}

static int need_stack(reader_t *r, size_t n)
{
    size_t base = r->nmarks ? r->marks[r->nmarks - 1] : 0;
    if (r->sp - base < n)
        return fail(r, MT_EPROTO, "needs %zu value%s on the stack, %zu there", n, n == 1 ? "" : "s",
                    r->sp - base);
    return 0;
}

/* Puts item inside container c: seals it, and raises c's depth. */
static int adopt(reader_t *r, mt_pk_value_t *c, mt_pk_value_t *item)
{
    if (item == c)
        return fail(r, MT_EPROTO, "a %s put inside itself (a self-referential object)",
                    mt_pk_type_name(c->type));
    item->sealed = 1;
    if (item->depth + 1u > c->depth) {
        if (item->depth + 1u > r->cfg->max_depth)
            return fail(r, MT_EPROTO, "nesting deeper than %u levels (limit of this reader)",
                        r->cfg->max_depth);
        c->depth = (uint16_t)(item->depth + 1);
    }
    return 0;
}

/* Appends n values (pairs: 2n for a dict) to the list or dict c. */
static int extend(reader_t *r, mt_pk_value_t *c, mt_pk_value_t **items, size_t n)
{
    int type = r->op == 'a' || r->op == 'e' ? MT_PK_LIST : MT_PK_DICT;
    if (c->type != type)
        return fail(r, MT_EPROTO, "applied to a %s, not a %s", mt_pk_type_name(c->type),
                    mt_pk_type_name(type));
    if (c->sealed)
        return fail(r, MT_EPROTO,
                    "changes a %s already inside another object (pickle.dump "
                    "never does; a cycle or a rewritten file)",
                    mt_pk_type_name(c->type));
    size_t per = type == MT_PK_DICT ? 2 : 1;
    size_t npairs = n / per;
    if (c->n + npairs > c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 4;
        while (ncap < c->n + npairs)
            ncap *= 2;
        mt_pk_value_t **a = arena_alloc(r, ncap * per * sizeof *a);
        if (a == NULL)
            return r->rc;
        if (c->n)
            memcpy(a, c->u.items, c->n * per * sizeof *a);
        c->u.items = a;
        c->cap = ncap;
    }
    for (size_t i = 0; i < n; i++)
        if (adopt(r, c, items[i]) < 0)
            return r->rc;
    memcpy(c->u.items + c->n * per, items, n * sizeof *items);
    c->n += npairs;
    return 0;
}

static int make_tuple(reader_t *r, size_t n)
{
    if (need_stack(r, n) < 0)
        return r->rc;
    mt_pk_value_t *t = new_value(r, MT_PK_TUPLE);
    mt_pk_value_t **a = n ? arena_alloc(r, n * sizeof *a) : NULL;
    if (t == NULL || (n && a == NULL))
        return r->rc;
    mt_pk_value_t **items = r->stack + r->sp - n;
    for (size_t i = 0; i < n; i++)
        if (adopt(r, t, items[i]) < 0)
            return r->rc;
    if (n)
        memcpy(a, items, n * sizeof *a);
    t->u.items = a;
    t->n = t->cap = n;
    r->sp -= n;
    return push(r, t);
}

/* Values above the last mark, which is popped. */
static int pop_mark(reader_t *r, size_t *base)
{
    if (r->nmarks == 0)
        return fail(r, MT_EPROTO, "no MARK before it");
    *base = r->marks[--r->nmarks];
    return 0;
}

/* ---- operands ---- */

static int take(reader_t *r, size_t n, const unsigned char **out)
{
    if ((size_t)(r->end - r->p) < n)
        return fail(r, MT_EPROTO, "needs %zu bytes of operand, the file has %zu left (truncated)",
                    n, (size_t)(r->end - r->p));
    *out = r->p;
    r->p += n;
    return 0;
}

static uint64_t le(const unsigned char *b, size_t n)
{
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;)
        v = v << 8 | b[i];
    return v;
}

/* A length operand of n bytes, checked against the bytes left. */
static int take_len(reader_t *r, size_t n, size_t *len)
{
    const unsigned char *b = NULL;
    if (take(r, n, &b) < 0)
        return r->rc;
    uint64_t v = le(b, n);
    if (v > (uint64_t)(r->end - r->p))
        return fail(r, MT_EPROTO,
                    "a length of %llu bytes, the file has %zu left (truncated, or a length "
                    "that lies)",
                    (unsigned long long)v, (size_t)(r->end - r->p));
    *len = (size_t)v;
    return 0;
}

/* UTF-8 as Python's decoder with 'surrogatepass' accepts it (pickle writes surrogates
 * that way). */
static bool utf8_ok(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        unsigned lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf)
            k = 1;
        else if (c >= 0xe0 && c <= 0xef) {
            k = 2;
            if (c == 0xe0)
                lo = 0xa0;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3;
            if (c == 0xf0)
                lo = 0x90;
            if (c == 0xf4)
                hi = 0x8f;
        } else
            return false;
        if (n - i <= k || s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
        i += k + 1;
    }
    return true;
}

static int string(reader_t *r, int type, size_t lenbytes)
{
    size_t n;
    if (take_len(r, lenbytes, &n) < 0)
        return r->rc;
    const unsigned char *b = r->p;
    r->p += n;
    if (type == MT_PK_STR && !utf8_ok(b, n))
        return fail(r, MT_EPROTO, "a str of %zu bytes that is not UTF-8", n);
    mt_pk_value_t *v = new_value(r, type);
    char *s = v ? arena_alloc(r, n + 1) : NULL;
    if (s == NULL)
        return r->rc;
    memcpy(s, b, n);
    s[n] = '\0';
    v->u.s = s;
    v->n = n;
    return push(r, v);
}

static int integer(reader_t *r, int64_t i)
{
    mt_pk_value_t *v = new_value(r, MT_PK_INT);
    if (v == NULL)
        return r->rc;
    v->u.i = i;
    return push(r, v);
}

/* LONG1/LONG4: little-endian two's complement of n bytes. */
static int long_n(reader_t *r, size_t lenbytes)
{
    size_t n;
    const unsigned char *b = NULL;
    if (take_len(r, lenbytes, &n) < 0 || take(r, n, &b) < 0)
        return r->rc;
    /* Redundant sign bytes beyond 8 are allowed, as long as the value fits. */
    while (n > 8 &&
           ((b[n - 1] == 0 && !(b[n - 2] & 0x80)) || (b[n - 1] == 0xff && (b[n - 2] & 0x80))))
        n--;
    if (n > 8)
        return fail(r, MT_EPROTO, "an integer of %zu bytes does not fit in 64 bits", n);
    if (n == 0)
        return integer(r, 0);
    uint64_t u = le(b, n);
    if (n < 8 && (b[n - 1] & 0x80))
        u |= ~(uint64_t)0 << (8 * n);
    return integer(r, (int64_t)u);
}

static int memo_put(reader_t *r, size_t idx)
{
    if (r->sp == 0 || (r->nmarks && r->marks[r->nmarks - 1] == r->sp))
        return fail(r, MT_EPROTO, "nothing on the stack to memoize");
    if (idx > r->nmemo)
        return fail(r, MT_EPROTO, "memo index %zu skips past the memo's %zu entries", idx,
                    r->nmemo);
    if (idx == r->nmemo) {
        if (grow(r, (void **)&r->memo, &r->memo_cap, idx + 1, sizeof *r->memo, r->cfg->max_memo,
                 "memo entries") < 0)
            return r->rc;
        r->nmemo++;
    }
    r->memo[idx] = r->stack[r->sp - 1];
    return 0;
}

static int memo_get(reader_t *r, size_t idx)
{
    if (idx >= r->nmemo)
        return fail(r, MT_EPROTO, "memo index %zu not set (the memo has %zu entries)", idx,
                    r->nmemo);
    return push(r, r->memo[idx]);
}

/* GLOBAL's operands, for the message only: "module.name" cut short and made printable. */
static void global_name(reader_t *r, char *out, size_t len)
{
    size_t o = 0;
    int lines = 0;
    for (const unsigned char *q = r->p; q < r->end && lines < 2 && o + 1 < len; q++) {
        if (*q == '\n') {
            if (++lines < 2 && o + 1 < len)
                out[o++] = '.';
            continue;
        }
        out[o++] = *q >= 0x20 && *q < 0x7f ? (char)*q : '?';
    }
    out[o] = '\0';
}

/* ---- the machine ---- */

static int refuse(reader_t *r)
{
    switch (r->op) {
    case 'c':
    case 'i': {
        char name[96];
        global_name(r, name, sizeof name);
        return fail(r, MT_EPROTO,
                    "refused: it would import %s (a snapshot holds only plain "
                    "data; nothing is imported or called)",
                    name[0] ? name : "a name");
    }
    case 0x93:
    case 'R':
    case 'b':
    case 'o':
    case 0x81:
    case 0x92:
    case 0x82:
    case 0x83:
    case 0x84:
    case 'P':
    case 'Q':
        return fail(r, MT_EPROTO,
                    "refused: it imports, builds or calls objects (a snapshot "
                    "holds only plain data; nothing is imported or called)");
    default:
        if (strcmp(mt_pk_opcode_name(r->op), "unknown") == 0)
            return fail(r, MT_EPROTO, "not a pickle opcode");
        return fail(r, MT_EPROTO,
                    "refused: not one of the opcodes pickle.dump writes for "
                    "a snapshot (protocols 2 to 5, plain data)");
    }
}

static int step(reader_t *r, bool *stop)
{
    const unsigned char *b = NULL;
    size_t n = 0, base = 0;
    mt_pk_value_t *v;
    switch (r->op) {
    case 0x80: /* PROTO */
        if (take(r, 1, &b) < 0)
            return r->rc;
        if (*b < 2 || *b > 5)
            return fail(r, MT_EPROTO, "protocol %u; this reader takes protocols 2 to 5", *b);
        return 0;
    case 0x95: /* FRAME: a hint for buffered readers; the length must hold */
        return take_len(r, 8, &n);
    case '.':
        if (r->nmarks)
            return fail(r, MT_EPROTO, "%zu MARK%s left open", r->nmarks, r->nmarks == 1 ? "" : "s");
        if (r->sp != 1)
            return fail(r, MT_EPROTO, "%zu values on the stack instead of one", r->sp);
        *stop = true;
        return 0;
    case 'N':
        return push(r, new_value(r, MT_PK_NONE));
    case 0x88:
    case 0x89:
        if ((v = new_value(r, MT_PK_BOOL)) != NULL)
            v->u.i = r->op == 0x88;
        return push(r, v);
    case 'J':
        if (take(r, 4, &b) < 0)
            return r->rc;
        return integer(r, (int32_t)(uint32_t)le(b, 4));
    case 'K':
        if (take(r, 1, &b) < 0)
            return r->rc;
        return integer(r, b[0]);
    case 'M':
        if (take(r, 2, &b) < 0)
            return r->rc;
        return integer(r, (int64_t)le(b, 2));
    case 0x8a:
        return long_n(r, 1);
    case 0x8b:
        return long_n(r, 4);
    case 'G': {
        if (take(r, 8, &b) < 0)
            return r->rc;
        uint64_t u = 0;
        for (int i = 0; i < 8; i++)
            u = u << 8 | b[i];
        if ((v = new_value(r, MT_PK_FLOAT)) != NULL)
            memcpy(&v->u.f, &u, 8);
        return push(r, v);
    }
    case 0x8c:
        return string(r, MT_PK_STR, 1);
    case 'X':
        return string(r, MT_PK_STR, 4);
    case 0x8d:
        return string(r, MT_PK_STR, 8);
    case 'C':
        return string(r, MT_PK_BYTES, 1);
    case 'B':
        return string(r, MT_PK_BYTES, 4);
    case 0x8e:
    case 0x96:
        return string(r, MT_PK_BYTES, 8);
    case ']':
        return push(r, new_value(r, MT_PK_LIST));
    case '}':
        return push(r, new_value(r, MT_PK_DICT));
    case ')':
        return push(r, new_value(r, MT_PK_TUPLE));
    case 0x85:
    case 0x86:
    case 0x87:
        return make_tuple(r, r->op - 0x84u);
    case 't':
        if (pop_mark(r, &base) < 0)
            return r->rc;
        return make_tuple(r, r->sp - base);
    case '(':
        if (r->nmarks >= r->cfg->max_depth * 2u)
            return fail(r, MT_EPROTO, "more than %u MARKs open (limit of this reader)",
                        r->cfg->max_depth * 2u);
        if (r->nmarks == r->marks_cap &&
            grow(r, (void **)&r->marks, &r->marks_cap, r->nmarks + 1, sizeof *r->marks,
                 r->cfg->max_depth * 2u, "MARKs") < 0)
            return r->rc;
        r->marks[r->nmarks++] = r->sp;
        return 0;
    case 'a':
    case 's':
        n = r->op == 'a' ? 1 : 2;
        if (need_stack(r, n + 1) < 0)
            return r->rc;
        if (extend(r, r->stack[r->sp - n - 1], r->stack + r->sp - n, n) < 0)
            return r->rc;
        r->sp -= n;
        return 0;
    case 'e':
    case 'u':
        if (pop_mark(r, &base) < 0)
            return r->rc;
        n = r->sp - base;
        if (base == 0 || (r->nmarks && r->marks[r->nmarks - 1] == base))
            return fail(r, MT_EPROTO, "no %s below its MARK", r->op == 'e' ? "list" : "dict");
        if (r->op == 'u' && n % 2)
            return fail(r, MT_EPROTO, "an odd number of values (%zu) for key, value pairs", n);
        if (extend(r, r->stack[base - 1], r->stack + base, n) < 0)
            return r->rc;
        r->sp = base;
        return 0;
    case 0x94:
        return memo_put(r, r->nmemo);
    case 'q':
        if (take(r, 1, &b) < 0)
            return r->rc;
        return memo_put(r, b[0]);
    case 'r':
        if (take(r, 4, &b) < 0)
            return r->rc;
        return memo_put(r, (size_t)le(b, 4));
    case 'h':
        if (take(r, 1, &b) < 0)
            return r->rc;
        return memo_get(r, b[0]);
    case 'j':
        if (take(r, 4, &b) < 0)
            return r->rc;
        return memo_get(r, (size_t)le(b, 4));
    default:
        return refuse(r);
    }
}

static void doc_free(mt_pk_doc_t *d)
{
    for (chunk_t *c = d->chunks, *next; c != NULL; c = next) {
        next = c->next;
        free(c);
    }
    free(d);
}

int mt_pk_parse(mt_pk_doc_t **out, const void *buf, size_t len, const mt_pk_cfg_t *cfg, char *err,
                size_t errlen)
{
    mt_pk_cfg_t def = mt_pk_cfg_default();
    char dummy[1];
    reader_t r = {
        .cfg = cfg ? cfg : &def,
        .start = buf,
        .p = buf,
        .end = (const unsigned char *)buf + len,
        .err = err ? err : dummy,
        .errlen = err ? errlen : sizeof dummy,
    };
    *out = NULL;
    if ((r.doc = calloc(1, sizeof *r.doc)) == NULL) {
        snprintf(r.err, r.errlen, "out of memory");
        return MT_ENOMEM;
    }
    bool stop = false;
    if (len < 2 || r.p[0] != 0x80) {
        snprintf(r.err, r.errlen,
                 "offset 0: not a pickle of protocol 2 to 5 (it does not start with PROTO)");
        r.rc = MT_EPROTO;
    }
    while (r.rc == 0 && !stop) {
        if (r.p == r.end) {
            snprintf(r.err, r.errlen, "offset %zu: the file ends before STOP (truncated)", len);
            r.rc = MT_EPROTO;
            break;
        }
        r.op_offset = (size_t)(r.p - r.start);
        r.op = *r.p++;
        step(&r, &stop);
    }
    if (r.rc == 0 && r.p != r.end) {
        snprintf(r.err, r.errlen, "offset %zu: %zu bytes after STOP", (size_t)(r.p - r.start),
                 (size_t)(r.end - r.p));
        r.rc = MT_EPROTO;
    }
    if (r.rc == 0)
        r.doc->root = r.stack[0];
    free(r.stack);
    free(r.memo);
    free(r.marks);
    if (r.rc != 0) {
        doc_free(r.doc);
        return r.rc;
    }
    *out = r.doc;
    return 0;
}

int mt_pk_parse_file(mt_pk_doc_t **out, const char *path, const mt_pk_cfg_t *cfg, char *err,
                     size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(e));
        return e == ENOENT ? MT_ENOENT : MT_EIO;
    }
    int rc = MT_EIO;
    char *buf = NULL;
    long size;
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        snprintf(err, errlen, "%s: cannot read (not a regular file?)", path);
        goto done;
    }
    if ((buf = malloc(size ? (size_t)size : 1)) == NULL) {
        snprintf(err, errlen, "%s: out of memory for %ld bytes", path, size);
        rc = MT_ENOMEM;
        goto done;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        snprintf(err, errlen, "%s: read error", path);
        goto done;
    }
    char msg[512];
    rc = mt_pk_parse(out, buf, (size_t)size, cfg, msg, sizeof msg);
    if (rc < 0)
        snprintf(err, errlen, "%s: %s", path, msg);
done:
    free(buf);
    fclose(f);
    return rc;
}

void mt_pk_doc_destroy(mt_pk_doc_t **p)
{
    if (p == NULL || *p == NULL)
        return;
    doc_free(*p);
    *p = NULL;
}

const mt_pk_value_t *mt_pk_root(const mt_pk_doc_t *doc)
{
    return doc->root;
}

size_t mt_pk_memory(const mt_pk_doc_t *doc)
{
    return doc->memory;
}

const mt_pk_value_t *mt_pk_get(const mt_pk_value_t *dict, const char *key)
{
    if (dict == NULL || dict->type != MT_PK_DICT)
        return NULL;
    size_t klen = strlen(key);
    for (size_t i = dict->n; i-- > 0;) {
        const mt_pk_value_t *k = dict->u.items[2 * i];
        if (k->type == MT_PK_STR && k->n == klen && memcmp(k->u.s, key, klen) == 0)
            return dict->u.items[2 * i + 1];
    }
    return NULL;
}
