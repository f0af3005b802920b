/* The pickle reader's data (pickle_internal.h): the opcode names, the arena the document's
 * values live in, and the values with the stack operations that build containers. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/pickle_internal.h"
#include "memtrace/common.h"

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

const char *mt__pk_opcode_name(unsigned op)
{
    for (size_t i = 0; i < sizeof opnames / sizeof opnames[0]; i++)
        if (opnames[i].op == op)
            return opnames[i].name;
    return "unknown";
}

const char *mt__pk_type_name(int type)
{
    static const char *names[] = {"None",  "bool",  "int",  "float", "str",
                                  "bytes", "tuple", "list", "dict"};
    return type >= 0 && type <= MT_PK_DICT ? names[type] : "unknown";
}

/* ---- the arena ---- */

enum { CHUNK = MT__PK_CHUNK };

static size_t memory_used(const mt__pk_reader_t *r)
{
    return r->doc->memory + (r->stack_cap + r->memo_cap) * sizeof(void *) +
           r->marks_cap * sizeof(size_t);
}

__attribute__((format(printf, 3, 4))) int mt__pk_fail(mt__pk_reader_t *r, int rc, const char *fmt,
                                                      ...)
{
    if (r->rc != 0)
        return r->rc;
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(r->err, r->errlen, "offset %zu: %s (0x%02x): %s", r->op_offset,
             mt__pk_opcode_name(r->op), r->op, msg);
    r->rc = rc;
    return rc;
}

void *mt__pk_alloc(mt__pk_reader_t *r, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    mt__pk_chunk_t *c = r->doc->chunks;
    if (c == NULL || c->size - c->used < n) {
        size_t size = n > CHUNK / 4 ? n : CHUNK;
        if (memory_used(r) + size > r->cfg->max_memory) {
            mt__pk_fail(r, MT_ENOMEM, "the document would need more than the reader's %zu bytes",
                        r->cfg->max_memory);
            return NULL;
        }
        mt__pk_chunk_t *nc;
        if (size == CHUNK && r->spare != NULL) {
            nc = r->spare;
            r->spare = nc->next;
            r->nspare--;
        } else
            nc = malloc(sizeof *nc + size);
        if (nc == NULL) {
            mt__pk_fail(r, MT_ENOMEM, "out of memory");
            return NULL;
        }
        nc->used = 0;
        nc->size = size;
        r->doc->memory += sizeof *nc + size;
        if (r->in_batch)
            r->batch_memory += sizeof *nc + size;
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
int mt__pk_grow(mt__pk_reader_t *r, void **arr, size_t *cap, size_t need, size_t elem, size_t limit,
                const char *what)
{
    if (need <= *cap)
        return 0;
    if (need > limit)
        return mt__pk_fail(r, MT_ENOMEM, "more than %zu %s (limit of this reader)", limit, what);
    size_t ncap = *cap ? *cap * 2 : 64;
    while (ncap < need)
        ncap *= 2;
    if (ncap > limit)
        ncap = limit;
    if (memory_used(r) + (ncap - *cap) * elem > r->cfg->max_memory)
        return mt__pk_fail(r, MT_ENOMEM, "the document would need more than the reader's %zu bytes",
                           r->cfg->max_memory);
    void *n = realloc(*arr, ncap * elem);
    if (n == NULL)
        return mt__pk_fail(r, MT_ENOMEM, "out of memory");
    *arr = n;
    *cap = ncap;
    return 0;
}

/* ---- values ---- */

mt_pk_value_t *mt__pk_new_value(mt__pk_reader_t *r, int type)
{
    mt_pk_value_t *v = mt__pk_alloc(r, sizeof *v);
    if (v == NULL)
        return NULL;
    memset(v, 0, sizeof *v);
    v->type = (uint8_t)type;
    v->depth = 1;
    return v;
}

int mt__pk_push(mt__pk_reader_t *r, mt_pk_value_t *v)
{
    if (v == NULL)
        return r->rc;
    if (r->sp == r->stack_cap &&
        mt__pk_grow(r, (void **)&r->stack, &r->stack_cap, r->sp + 1, sizeof *r->stack,
                    r->cfg->max_stack, "values on the stack") < 0)
        return r->rc;
    r->stack[r->sp++] = v;
    return 0;
}

int mt__pk_need_stack(mt__pk_reader_t *r, size_t n)
{
    size_t base = r->nmarks ? r->marks[r->nmarks - 1] : 0;
    if (r->sp - base < n)
        return mt__pk_fail(r, MT_EPROTO, "needs %zu value%s on the stack, %zu there", n,
                           n == 1 ? "" : "s", r->sp - base);
    return 0;
}

/* Puts item inside container c: seals it, and raises c's depth. */
static int adopt(mt__pk_reader_t *r, mt_pk_value_t *c, mt_pk_value_t *item)
{
    if (item == c)
        return mt__pk_fail(r, MT_EPROTO, "a %s put inside itself (a self-referential object)",
                           mt__pk_type_name(c->type));
    item->sealed = 1;
    if (item->depth + 1u > c->depth) {
        if (item->depth + 1u > r->cfg->max_depth)
            return mt__pk_fail(r, MT_EPROTO, "nesting deeper than %u levels (limit of this reader)",
                               r->cfg->max_depth);
        c->depth = (uint16_t)(item->depth + 1);
    }
    return 0;
}

/* Appends n values (pairs: 2n for a dict) to the list or dict c. */
int mt__pk_extend(mt__pk_reader_t *r, mt_pk_value_t *c, mt_pk_value_t **items, size_t n)
{
    int type = r->op == 'a' || r->op == 'e' ? MT_PK_LIST : MT_PK_DICT;
    if (c->type != type)
        return mt__pk_fail(r, MT_EPROTO, "applied to a %s, not a %s", mt__pk_type_name(c->type),
                           mt__pk_type_name(type));
    if (r->in_batch && mt__pk_stream_check_change(r, c) < 0)
        return r->rc;
    if (c->sealed)
        return mt__pk_fail(r, MT_EPROTO,
                           "changes a %s already inside another object (pickle.dump "
                           "never does; a cycle or a rewritten file)",
                           mt__pk_type_name(c->type));
    size_t per = type == MT_PK_DICT ? 2 : 1;
    size_t npairs = n / per;
    if (c->n + npairs > c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 4;
        while (ncap < c->n + npairs)
            ncap *= 2;
        mt_pk_value_t **a = mt__pk_alloc(r, ncap * per * sizeof *a);
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
    if (n > 0) /* APPENDS/SETITEMS of an empty mark: the list may have no array yet */
        memcpy(c->u.items + c->n * per, items, n * sizeof *items);
    c->n += npairs;
    return 0;
}

int mt__pk_make_tuple(mt__pk_reader_t *r, size_t n)
{
    if (mt__pk_need_stack(r, n) < 0)
        return r->rc;
    mt_pk_value_t *t = mt__pk_new_value(r, MT_PK_TUPLE);
    mt_pk_value_t **a = n ? mt__pk_alloc(r, n * sizeof *a) : NULL;
    if (t == NULL || (n && a == NULL))
        return r->rc;
    if (n > 0) { /* an empty tuple on an empty stack: the stack may have no array yet */
        mt_pk_value_t **items = r->stack + r->sp - n;
        for (size_t i = 0; i < n; i++)
            if (adopt(r, t, items[i]) < 0)
                return r->rc;
        memcpy(a, items, n * sizeof *a);
    }
    t->u.items = a;
    t->n = t->cap = n;
    r->sp -= n;
    return mt__pk_push(r, t);
}

/* Values above the last mark, which is popped. */
int mt__pk_pop_mark(mt__pk_reader_t *r, size_t *base)
{
    if (r->nmarks == 0)
        return mt__pk_fail(r, MT_EPROTO, "no MARK before it");
    if (r->in_batch && r->nmarks - 1 == r->batch_mark && r->op != 'e')
        return mt__pk_fail(r, MT_EAGAIN, "a streamed list's MARK closed by another opcode");
    *base = r->marks[--r->nmarks];
    return 0;
}

/* ---- the document ---- */

void mt__pk_doc_free(mt_pk_doc_t *d)
{
    for (mt__pk_chunk_t *c = d->chunks, *next; c != NULL; c = next) {
        next = c->next;
        free(c);
    }
    free(d);
}

void mt__pk_doc_destroy(mt_pk_doc_t **p)
{
    if (p == NULL || *p == NULL)
        return;
    mt__pk_doc_free(*p);
    *p = NULL;
}

const mt_pk_value_t *mt__pk_root(const mt_pk_doc_t *doc)
{
    return doc->root;
}

size_t mt__pk_memory(const mt_pk_doc_t *doc)
{
    return doc->memory;
}

size_t mt__pk_input_size(const mt_pk_doc_t *doc)
{
    return doc->input_size;
}

const mt_pk_value_t *mt__pk_get(const mt_pk_value_t *dict, const char *key)
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
