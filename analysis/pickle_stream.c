/* Streaming for the pickle reader (pickle.h's mt_pk_stream_t): a first pass that finds the
 * memo entries the file reads back, batches of a streamed list's items built in chunks of
 * their own and freed once the stream has taken them, and the mapped file's pages given
 * back as the reader passes them. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "analysis/pickle_internal.h"
#include "memtrace/common.h"
#include "util/addrmap.h"

/* ---- the first pass ---- */

static uint64_t le(const unsigned char *b, size_t n)
{
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;)
        v = v << 8 | b[i];
    return v;
}

static int mark_refd(mt__pk_reader_t *r, uint64_t idx)
{
    if (idx >= r->cfg->max_memo)
        return 0; /* the read itself refuses it */
    size_t w = (size_t)(idx / 64);
    if (w >= r->refd_words) {
        size_t n = r->refd_words ? r->refd_words : 1024;
        while (n <= w)
            n *= 2;
        uint64_t *b = realloc(r->refd, n * sizeof *b);
        if (b == NULL)
            return mt__pk_fail(r, MT_ENOMEM, "out of memory");
        memset(b + r->refd_words, 0, (n - r->refd_words) * sizeof *b);
        r->refd = b;
        r->refd_words = n;
    }
    r->refd[w] |= (uint64_t)1 << (idx % 64);
    return 0;
}

/* Walks the opcodes as the reader will (operand sizes only) and notes every memo index a
 * GET reads. Stops quietly at anything the reader refuses: the read fails there too. */
int mt__pk_prescan(mt__pk_reader_t *r)
{
    const unsigned char *p = r->start, *end = r->end;
    while (p < end) {
        unsigned op = *p++;
        size_t fixed = 0, lenbytes = 0;
        switch (op) {
        case '.':
            goto done;
        case 'N':
        case 0x88:
        case 0x89:
        case ']':
        case '}':
        case ')':
        case 0x85:
        case 0x86:
        case 0x87:
        case 't':
        case '(':
        case 'a':
        case 's':
        case 'e':
        case 'u':
        case 0x94:
            break;
        case 0x80:
        case 'K':
        case 'q':
            fixed = 1;
            break;
        case 'M':
            fixed = 2;
            break;
        case 'J':
        case 'r':
            fixed = 4;
            break;
        case 'G':
        case 0x95:
            fixed = 8;
            break;
        case 'h':
        case 'j': {
            size_t k = op == 'h' ? 1 : 4;
            if ((size_t)(end - p) < k)
                goto done;
            if (mark_refd(r, le(p, k)) < 0)
                return r->rc;
            p += k;
            break;
        }
        case 0x8a:
        case 0x8c:
        case 'C':
            lenbytes = 1;
            break;
        case 0x8b:
        case 'X':
        case 'B':
            lenbytes = 4;
            break;
        case 0x8d:
        case 0x8e:
        case 0x96:
            lenbytes = 8;
            break;
        default:
            goto done;
        }
        if (lenbytes) {
            if ((size_t)(end - p) < lenbytes)
                goto done;
            uint64_t n = le(p, lenbytes);
            p += lenbytes;
            if (n > (uint64_t)(end - p))
                goto done;
            fixed = (size_t)n;
        }
        if ((size_t)(end - p) < fixed)
            goto done;
        p += fixed;
        if (r->mapped && (size_t)(p - r->start) - r->dropped >= ((size_t)16 << 20))
            mt__pk_drop_pages(r, p);
    }
done:
    if (r->mapped) {
        mt__pk_drop_pages(r, r->end);
        r->dropped = 0;
    }
    if ((r->rank = malloc((r->refd_words ? r->refd_words : 1) * sizeof *r->rank)) == NULL)
        return mt__pk_fail(r, MT_ENOMEM, "out of memory");
    size_t n = 0;
    for (size_t w = 0; w < r->refd_words; w++) {
        r->rank[w] = n;
        n += (size_t)__builtin_popcountll(r->refd[w]);
    }
    return 0;
}

size_t mt__pk_memo_slot(const mt__pk_reader_t *r, size_t idx)
{
    if (r->rank == NULL)
        return idx;
    size_t w = idx / 64;
    if (w >= r->refd_words || !(r->refd[w] >> (idx % 64) & 1))
        return SIZE_MAX;
    return r->rank[w] + (size_t)__builtin_popcountll(r->refd[w] & ((1ull << (idx % 64)) - 1));
}

size_t mt__pk_memo_slots_below(const mt__pk_reader_t *r, size_t idx)
{
    if (r->rank == NULL)
        return idx;
    size_t w = idx / 64;
    if (w >= r->refd_words)
        return r->refd_words ? r->rank[r->refd_words - 1] +
                                   (size_t)__builtin_popcountll(r->refd[r->refd_words - 1])
                             : 0;
    return r->rank[w] + (size_t)__builtin_popcountll(r->refd[w] & ((1ull << (idx % 64)) - 1));
}

/* ---- mapped pages ---- */

void mt__pk_drop_pages(mt__pk_reader_t *r, const unsigned char *upto)
{
    static size_t page;
    if (page == 0)
        page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t base = (uintptr_t)r->start;
    uintptr_t from = (base + r->dropped + page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t to = (uintptr_t)upto & ~(uintptr_t)(page - 1);
    /* Nothing the reader keeps points into the file (strings are copied), so the pages
     * behind it are only re-read if the file is read again. */
    if (to > from)
        madvise((void *)from, to - from, MADV_DONTNEED);
    r->dropped = (size_t)((uintptr_t)upto - base);
    /* and the next stretch read ahead in one go rather than page fault by page fault */
    uintptr_t end = (uintptr_t)r->end, ahead = to + ((uintptr_t)32 << 20);
    if (to < end)
        madvise((void *)to, (ahead < end ? ahead : end) - to, MADV_WILLNEED);
}

/* ---- batches ---- */

int mt__pk_stream_mark(mt__pk_reader_t *r)
{
    if (r->in_batch || r->sp == 0)
        return 0;
    mt_pk_value_t *c = r->stack[r->sp - 1];
    if (c->type != MT_PK_LIST || c->sealed || (c->n != 0 && !c->streamed))
        return 0;
    if (!c->streamed) {
        int m = r->stream->match(r->stream->ud, (const mt_pk_value_t *const *)r->stack, r->sp,
                                 r->sp - 1, r->marks, r->nmarks);
        if (m < 0) {
            mt__pk_fail(r, m, "refused by the stream");
            return m;
        }
        if (m == 0)
            return 0;
        c->streamed = (uint32_t)m;
    }
    r->in_batch = true;
    r->batch_mark = r->nmarks;
    r->batch_memo_low = r->nmemo;
    r->batch_memory = 0;
    r->kept = r->doc->chunks;
    r->doc->chunks = NULL;
    return 0;
}

static bool in_chunks(const mt__pk_chunk_t *c, const void *p)
{
    for (; c != NULL; c = c->next)
        if ((const unsigned char *)p >= c->mem && (const unsigned char *)p < c->mem + c->used)
            return true;
    return false;
}

int mt__pk_stream_check_change(mt__pk_reader_t *r, const mt_pk_value_t *c)
{
    if (!r->in_batch || in_chunks(r->doc->chunks, c))
        return 0;
    return mt__pk_fail(r, MT_EAGAIN,
                       "changes a container made before the streamed batch it is read in");
}

/* Copies of the batch's values the memo keeps are made in the document's chunks, with a
 * table f of old -> new (util/addrmap.h), so values shared among them stay shared. */
static mt_pk_value_t *copy_value(mt__pk_reader_t *r, const mt__pk_chunk_t *batch, mt__amap_t *f,
                                 const mt_pk_value_t *v)
{
    if (!in_chunks(batch, v))
        return (mt_pk_value_t *)v; /* older: already the document's */
    uint64_t done;
    if (mt__amap_get(f, (uintptr_t)v, &done) == 0)
        return (mt_pk_value_t *)(uintptr_t)done;
    mt_pk_value_t *c;
    if ((c = mt__pk_alloc(r, sizeof *c)) == NULL)
        return NULL;
    *c = *v;
    if (v->type == MT_PK_STR || v->type == MT_PK_BYTES) {
        char *s = mt__pk_alloc(r, v->n + 1);
        if (s == NULL)
            return NULL;
        memcpy(s, v->u.s, v->n + 1);
        c->u.s = s;
    } else if (v->type == MT_PK_TUPLE || v->type == MT_PK_LIST || v->type == MT_PK_DICT) {
        size_t k = v->type == MT_PK_DICT ? 2 * v->n : v->n;
        c->cap = v->n;
        c->u.items = NULL;
        if (k) {
            mt_pk_value_t **a = mt__pk_alloc(r, k * sizeof *a);
            if (a == NULL)
                return NULL;
            for (size_t i = 0; i < k; i++)
                if ((a[i] = copy_value(r, batch, f, v->u.items[i])) == NULL)
                    return NULL;
            c->u.items = a;
        }
    }
    if (mt__amap_put(f, (uintptr_t)v, (uintptr_t)c) < 0) {
        mt__pk_fail(r, MT_ENOMEM, "out of memory");
        return NULL;
    }
    return c;
}

/* Frees c's list, keeping up to 64 chunks of the usual size for the next batches. */
static void free_chunks(mt__pk_reader_t *r, mt__pk_chunk_t *c)
{
    for (mt__pk_chunk_t *next; c != NULL; c = next) {
        next = c->next;
        if (c->size == MT__PK_CHUNK && r->nspare < 64) {
            c->next = r->spare;
            r->spare = c;
            r->nspare++;
        } else
            free(c);
    }
}

/* Ends the batch: the memo entries the file reads back are copied into the document,
 * the others forgotten, the batch's chunks freed. */
static int end_batch(mt__pk_reader_t *r)
{
    mt__pk_chunk_t *batch = r->doc->chunks;
    r->doc->chunks = r->kept;
    r->kept = NULL;
    r->in_batch = false;
    mt__amap_t f = {0};
    /* The memo keeps only indices some GET reads (mt__pk_memo_slot): all are copied. */
    size_t from = mt__pk_memo_slots_below(r, r->batch_memo_low);
    size_t to = mt__pk_memo_slots_below(r, r->nmemo);
    for (size_t i = from; i < to && r->rc == 0; i++) {
        mt_pk_value_t *v = r->memo[i];
        if (v != NULL && in_chunks(batch, v))
            r->memo[i] = copy_value(r, batch, &f, v);
    }
    mt__amap_fini(&f);
    free_chunks(r, batch);
    r->doc->memory -= r->batch_memory;
    r->batch_memory = 0;
    return r->rc;
}

int mt__pk_stream_items(mt__pk_reader_t *r, mt_pk_value_t *c, mt_pk_value_t **items, size_t n,
                        size_t popped_mark)
{
    if (c->type != MT_PK_LIST || c->sealed)
        return 0;
    if (!c->streamed && popped_mark == SIZE_MAX && c->n == 0) {
        int m = r->stream->match(r->stream->ud, (const mt_pk_value_t *const *)r->stack, r->sp,
                                 r->sp - 2, r->marks, r->nmarks);
        if (m < 0)
            return mt__pk_fail(r, m, "refused by the stream");
        c->streamed = m > 0 ? (uint32_t)m : 0;
    }
    if (!c->streamed)
        return 0;
    int rc = r->stream->items(r->stream->ud, c, (const mt_pk_value_t *const *)items, n);
    if (rc < 0)
        return mt__pk_fail(r, rc, "the stream stopped");
    if (r->in_batch && popped_mark == r->batch_mark && end_batch(r) < 0)
        return r->rc;
    return 1;
}

void mt__pk_stream_abort(mt__pk_reader_t *r)
{
    if (r->in_batch) {
        mt__pk_chunk_t *batch = r->doc->chunks;
        r->doc->chunks = r->kept;
        r->doc->memory -= r->batch_memory;
        r->kept = NULL;
        r->in_batch = false;
        r->nspare = SIZE_MAX; /* no more keeping */
        free_chunks(r, batch);
    }
    r->nspare = SIZE_MAX;
    free_chunks(r, r->spare);
    r->spare = NULL;
    r->nspare = 0;
}
