/* The pickle writer (pickle_write.h): protocol 4 opcodes for plain data, in the batches
 * pickle.dump uses, so Python's unpickler and our reader both take the output. */
#include <string.h>

#include "profiler/pickle_write.h"
#include "memtrace/common.h"

enum { BATCH = 1000 };

/* Every opcode is a write of a few bytes: fwrite's lock per call was a fifth of `memtrace
 * export`'s time. The stream is the writer's alone while it writes (pickle_write.h). */
static void out(mt__pkw_t *w, const void *b, size_t n)
{
    if (w->err == 0 && fwrite_unlocked(b, 1, n, w->f) != n)
        w->err = MT_EIO;
}

static void op(mt__pkw_t *w, unsigned char c)
{
    out(w, &c, 1);
}

static void op_le(mt__pkw_t *w, unsigned char c, uint64_t v, size_t n)
{
    unsigned char b[9];
    b[0] = c;
    for (size_t i = 0; i < n; i++)
        b[1 + i] = (unsigned char)(v >> (8 * i));
    out(w, b, 1 + n);
}

void mt__pkw_init(mt__pkw_t *w, FILE *f)
{
    memset(w, 0, sizeof *w);
    w->f = f;
    op_le(w, 0x80, 4, 1); /* PROTO 4 */
}

/* Before a value: a list or dict starting a batch opens it with MARK. */
static void before(mt__pkw_t *w)
{
    if (w->depth == 0)
        return;
    unsigned k = w->kind[w->depth - 1];
    if ((k == 'l' || k == 'd') && w->count[w->depth - 1] == 0)
        op(w, '(');
}

/* After a value: memoize it if asked, then close a full batch. */
static void after(mt__pkw_t *w)
{
    if (w->put) {
        op_le(w, 'r', w->memo++, 4); /* LONG_BINPUT */
        w->put = false;
    }
    if (w->depth == 0)
        return;
    unsigned d = w->depth - 1;
    uint32_t c = ++w->count[d];
    if (w->kind[d] == 'l' && c == BATCH) {
        op(w, 'e');
        w->count[d] = 0;
    } else if (w->kind[d] == 'd' && c == 2 * BATCH) {
        op(w, 'u');
        w->count[d] = 0;
    }
}

void mt__pkw_none(mt__pkw_t *w)
{
    before(w);
    op(w, 'N');
    after(w);
}

void mt__pkw_bool(mt__pkw_t *w, bool v)
{
    before(w);
    op(w, v ? 0x88 : 0x89);
    after(w);
}

void mt__pkw_int(mt__pkw_t *w, int64_t v)
{
    before(w);
    if (v >= 0 && v < 256)
        op_le(w, 'K', (uint64_t)v, 1);
    else if (v >= 0 && v < 65536)
        op_le(w, 'M', (uint64_t)v, 2);
    else if (v >= INT32_MIN && v <= INT32_MAX)
        op_le(w, 'J', (uint64_t)(uint32_t)(int32_t)v, 4);
    else {
        /* LONG1: the fewest bytes of two's complement that keep the sign. */
        unsigned char b[10] = {0x8a, 0};
        uint64_t u = (uint64_t)v;
        size_t n = 8;
        while (n > 1 && ((v >= 0 && ((u >> (8 * (n - 1) - 1)) & 0x1ff) == 0) ||
                         (v < 0 && ((u >> (8 * (n - 1) - 1)) & 0x1ff) == 0x1ff)))
            n--;
        b[1] = (unsigned char)n;
        for (size_t i = 0; i < n; i++)
            b[2 + i] = (unsigned char)(u >> (8 * i));
        out(w, b, 2 + n);
    }
    after(w);
}

void mt__pkw_float(mt__pkw_t *w, double v)
{
    before(w);
    uint64_t u;
    memcpy(&u, &v, 8);
    unsigned char b[9] = {'G'};
    for (int i = 0; i < 8; i++)
        b[1 + i] = (unsigned char)(u >> (56 - 8 * i));
    out(w, b, 9);
    after(w);
}

void mt__pkw_str(mt__pkw_t *w, const char *s)
{
    if (s == NULL) {
        mt__pkw_none(w);
        return;
    }
    before(w);
    size_t n = strlen(s);
    if (n < 256)
        op_le(w, 0x8c, n, 1); /* SHORT_BINUNICODE */
    else if (n <= UINT32_MAX)
        op_le(w, 'X', n, 4); /* BINUNICODE */
    else
        op_le(w, 0x8d, n, 8);
    out(w, s, n);
    after(w);
}

static void open_c(mt__pkw_t *w, unsigned char kind, unsigned char opcode)
{
    before(w);
    if (w->depth == sizeof w->kind || (w->put && kind == 't')) {
        w->err = w->err ? w->err : MT_EINVAL; /* too deep, or a memoized tuple */
        return;
    }
    op(w, opcode);
    w->kind[w->depth] = kind;
    w->count[w->depth] = 0;
    w->depth++;
    if (w->put) {
        /* pickle.dump memoizes a list or dict right after creating it; so do we. */
        op_le(w, 'r', w->memo++, 4);
        w->put = false;
    }
}

static void close_c(mt__pkw_t *w, unsigned char kind)
{
    if (w->depth == 0 || w->kind[w->depth - 1] != kind) {
        w->err = w->err ? w->err : MT_EINVAL;
        return;
    }
    unsigned d = w->depth - 1;
    if (kind == 'l' && w->count[d] > 0)
        op(w, 'e');
    else if (kind == 'd' && w->count[d] > 0)
        op(w, 'u');
    else if (kind == 't')
        op(w, 't');
    w->depth--;
    after(w);
}

void mt__pkw_list_begin(mt__pkw_t *w)
{
    open_c(w, 'l', ']');
}

void mt__pkw_list_end(mt__pkw_t *w)
{
    close_c(w, 'l');
}

void mt__pkw_dict_begin(mt__pkw_t *w)
{
    open_c(w, 'd', '}');
}

void mt__pkw_dict_end(mt__pkw_t *w)
{
    if (w->depth > 0 && w->count[w->depth - 1] % 2)
        w->err = w->err ? w->err : MT_EINVAL; /* a key without its value */
    close_c(w, 'd');
}

void mt__pkw_tuple_begin(mt__pkw_t *w)
{
    open_c(w, 't', '(');
}

void mt__pkw_tuple_end(mt__pkw_t *w)
{
    close_c(w, 't');
}

uint32_t mt__pkw_put_next(mt__pkw_t *w)
{
    w->put = true;
    return w->memo;
}

void mt__pkw_get(mt__pkw_t *w, uint32_t index)
{
    before(w);
    op_le(w, 'j', index, 4); /* LONG_BINGET */
    if (index >= w->memo)
        w->err = w->err ? w->err : MT_EINVAL;
    after(w);
}

int mt__pkw_finish(mt__pkw_t *w)
{
    if (w->depth != 0 && w->err == 0)
        w->err = MT_EINVAL;
    op(w, '.');
    if (w->err == 0 && fflush(w->f) != 0)
        w->err = MT_EIO;
    return w->err;
}
