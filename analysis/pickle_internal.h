/* Shared by the pickle reader's files: pickle.c (the operands and the machine) and
 * pickle_values.c (the opcode names, the arena and the values). */
#ifndef MT_ANALYSIS_PICKLE_INTERNAL_H
#define MT_ANALYSIS_PICKLE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "analysis/pickle.h"

/* The arena's usual chunk size (bigger blocks get chunks of their own). */
#define MT__PK_CHUNK ((size_t)1 << 20)

typedef struct mt__pk_chunk_s {
    struct mt__pk_chunk_s *next;
    size_t used, size;
    _Alignas(16) unsigned char mem[];
} mt__pk_chunk_t;

struct mt_pk_doc_s {
    mt__pk_chunk_t *chunks; /* newest first; the head is the one being filled */
    size_t memory;          /* bytes of all chunks */
    size_t input_size;      /* bytes of the pickle it was read from */
    const mt_pk_value_t *root;
};

/* The reader's state. Invariants: marks[i] <= marks[i+1] <= sp <= stack_cap;
 * memory = doc->memory + (stack_cap + memo_cap + marks_cap) * sizeof(pointer). */
typedef struct mt__pk_reader_s {
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
    /* streaming (pickle_stream.c): refd has bit i set when some GET reads memo index i.
     * During a batch (the items between a streamed list's MARK and its APPENDS) new
     * values go to chunks of their own, doc->chunks, while kept holds the document's;
     * memo entries from batch_memo_low on may point into the batch. */
    const mt_pk_stream_t *stream;
    uint64_t *refd;
    size_t refd_words;
    size_t *rank; /* per word of refd: the bits set before it. With streaming the memo keeps
                   * only those indices, index i in memo[rank of i]: pickle.dump memoizes
                   * every dict, list and str, and reads few of them back */
    bool in_batch;
    size_t batch_mark; /* index in marks of the batch's MARK */
    size_t batch_memo_low;
    size_t batch_memory; /* bytes of the batch's chunks */
    mt__pk_chunk_t *kept;
    mt__pk_chunk_t *spare; /* freed batches' chunks of the usual size, for the next ones:
                            * fresh memory would be faulted in again batch after batch */
    size_t nspare;
    /* a mapped file: pages before drop_end are given back as the reader passes them */
    bool mapped;
    size_t dropped;
} mt__pk_reader_t;

/* Records the first failure: rc and "offset N: OPNAME (0xNN): message" in r->err. Later
 * failures keep the first. Returns r->rc. */
__attribute__((format(printf, 3, 4))) int mt__pk_fail(mt__pk_reader_t *r, int rc, const char *fmt,
                                                      ...);
/* n bytes from the document's arena, 16-byte aligned, within the memory limit; NULL (and
 * r->rc set) if not. */
void *mt__pk_alloc(mt__pk_reader_t *r, size_t n);
/* Grows an array of pointers to at least need entries, within the memory limit. */
int mt__pk_grow(mt__pk_reader_t *r, void **arr, size_t *cap, size_t need, size_t elem, size_t limit,
                const char *what);
/* A new value of type (depth 1, empty), or NULL with r->rc set. */
mt_pk_value_t *mt__pk_new_value(mt__pk_reader_t *r, int type);
/* Pushes v (NULL: returns r->rc, the failure that made it NULL). */
int mt__pk_push(mt__pk_reader_t *r, mt_pk_value_t *v);
/* Fails unless n values lie above the last mark. */
int mt__pk_need_stack(mt__pk_reader_t *r, size_t n);
/* Appends n values (pairs: 2n for a dict) to the list or dict c. */
int mt__pk_extend(mt__pk_reader_t *r, mt_pk_value_t *c, mt_pk_value_t **items, size_t n);
/* Replaces the top n values with a tuple of them. */
int mt__pk_make_tuple(mt__pk_reader_t *r, size_t n);
/* Values above the last mark, which is popped. */
int mt__pk_pop_mark(mt__pk_reader_t *r, size_t *base);
/* Streaming (pickle_stream.c). The first pass: r->refd from the GET opcodes. */
int mt__pk_prescan(mt__pk_reader_t *r);
/* Where memo index idx is kept in r->memo: idx itself, or with streaming its rank among the
 * indices some GET reads (SIZE_MAX: none reads it, it is not kept). */
size_t mt__pk_memo_slot(const mt__pk_reader_t *r, size_t idx);
/* Memo slots of the indices below idx. */
size_t mt__pk_memo_slots_below(const mt__pk_reader_t *r, size_t idx);
/* Before MARK: starts a batch when the list on top of the stack is streamed or the stream
 * makes it so. */
int mt__pk_stream_mark(mt__pk_reader_t *r);
/* APPENDS/APPEND of n items to the list c: 1 when the stream took them (the caller pops
 * them), 0 when c is not streamed, < 0 on failure. popped_mark: the index in marks of the
 * MARK APPENDS popped (SIZE_MAX for APPEND). Ends the batch (frees its values but those
 * the memo must keep) when that MARK was the batch's. */
int mt__pk_stream_items(mt__pk_reader_t *r, mt_pk_value_t *c, mt_pk_value_t **items, size_t n,
                        size_t popped_mark);
/* Fails with MT_EAGAIN when c, about to change during a batch, was made before it. */
int mt__pk_stream_check_change(mt__pk_reader_t *r, const mt_pk_value_t *c);
/* Frees the chunks of an unfinished batch (a failed read). */
void mt__pk_stream_abort(mt__pk_reader_t *r);
/* Gives back the mapped pages the reader has passed (every few MB). */
void mt__pk_drop_pages(mt__pk_reader_t *r, const unsigned char *upto);

/* Frees d's chunks and d. */
void mt__pk_doc_free(mt_pk_doc_t *d);

#endif
