/* A restricted pickle reader and writer for plain data (PyTorch memory snapshots).
 *
 * The reader accepts protocols 2 to 5 as Python's pickle.dump writes them for None, bool,
 * int (64-bit), float, str, bytes, tuple, list and dict, with the memo and framing. Every
 * other opcode (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, PERSID, sets,
 * out-of-band buffers, protocol 0/1 text opcodes, ...) is refused by name: nothing is ever
 * imported or called. Limits on nesting depth, stack, memo and memory bound what a hostile
 * file can make the reader do; lengths are checked against the bytes left. A container is
 * sealed once it is put inside another one (pickle.dump never changes it after that), so
 * the result is a tree with shared leaves, never a cycle, and every depth is exact.
 * docs/torch-snapshot.md describes the format and the limits. Not thread-safe per doc. */
#ifndef MT_ANALYSIS_PICKLE_H
#define MT_ANALYSIS_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "profiler/pickle_write.h"

typedef enum mt_pk_type_e {
    MT_PK_NONE = 0,
    MT_PK_BOOL,
    MT_PK_INT,
    MT_PK_FLOAT,
    MT_PK_STR,
    MT_PK_BYTES,
    MT_PK_TUPLE,
    MT_PK_LIST,
    MT_PK_DICT,
} mt_pk_type_e;

/* One value. Invariants: depth = 1 for scalars, 1 + max(depth of items) for containers
 * (0 items: 1); a sealed container never changes again; n <= cap. */
typedef struct mt_pk_value_s mt_pk_value_t;
struct mt_pk_value_s {
    uint8_t type;      /* mt_pk_type_e */
    uint8_t sealed;    /* 1 once inside a container or used as a key */
    uint16_t depth;    /* nesting, <= cfg max_depth */
    uint32_t streamed; /* list: 0, or what mt_pk_stream_t's match gave it: its items went to
                        * the stream's items callback instead (it stays empty) */
    size_t n;          /* str/bytes: bytes (NUL not counted); tuple/list: items; dict: pairs */
    size_t cap;        /* list/dict: room in items (pairs for a dict) */
    union {
        int64_t i;             /* int; bool: 0 or 1 */
        double f;              /* float */
        const char *s;         /* str (UTF-8) / bytes: n bytes then a NUL */
        mt_pk_value_t **items; /* tuple/list: n; dict: 2n as key, value, key, value */
    } u;
};

#define MT__PK_INFLATE_MAX ((size_t)4 << 30)

typedef struct mt_pk_cfg_s {
    unsigned max_depth; /* nesting levels; 64 */
    size_t max_stack;   /* values on the unpickler's stack; 1 << 20 */
    size_t max_memo;    /* memo entries; 1 << 26 */
    size_t max_memory;  /* bytes of values, strings, stack and memo; 4 GiB */
    size_t max_inflate; /* bytes a compressed file may decompress to; MT__PK_INFLATE_MAX */
} mt_pk_cfg_t;

mt_pk_cfg_t mt__pk_cfg_default(void);

typedef struct mt_pk_doc_s mt_pk_doc_t;

/* Reads the pickle in buf[0, len) (borrowed; nothing points into it afterwards). *out is
 * new (mt__pk_doc_destroy). Returns 0, MT_EPROTO for a malformed or refused file, MT_ENOMEM
 * when a limit or the host ran out; err gets "offset N: what was wrong". */
int mt__pk_parse(mt_pk_doc_t **out, const void *buf, size_t len, const mt_pk_cfg_t *cfg, char *err,
                 size_t errlen);
/* The same on a whole file; err then starts with path. MT_ENOENT/MT_EIO for the file. */
int mt__pk_parse_file(mt_pk_doc_t **out, const char *path, const mt_pk_cfg_t *cfg, char *err,
                      size_t errlen);
void mt__pk_doc_destroy(mt_pk_doc_t **p);

/* Streaming: lists whose items the caller takes as they are read, so a file of 10^6 trace
 * entries never holds them all as values. match is asked about a list at stack[pos] (an
 * empty, unsealed list about to receive items; stack[0, sp) and marks[0, nmarks), the
 * positions MARKs were pushed at, as the reader has them): > 0 makes it streamed (its
 * streamed field gets that value), 0 leaves it alone, < 0 stops the read with that code.
 * items gets a streamed list's items in order as APPENDS/APPEND add them; the values are
 * borrowed: those of an APPENDS batch are freed when it returns, except the ones a later
 * BINGET of the file reads (a first pass over the opcodes finds them), which are copied
 * and kept. A file that changes a container made before the batch it is read in
 * (pickle.dump never does) gives MT_EAGAIN: read it again without streaming. */
typedef struct mt_pk_stream_s {
    int (*match)(void *ud, const mt_pk_value_t *const *stack, size_t sp, size_t pos,
                 const size_t *marks, size_t nmarks);
    int (*items)(void *ud, const mt_pk_value_t *list, const mt_pk_value_t *const *items, size_t n);
    /* Optional: told the bytes of the pickle (decompressed) before the read starts, by
     * mt__pk_parse_file_stream only. */
    void (*begin)(void *ud, size_t len);
    void *ud;
} mt_pk_stream_t;

/* mt__pk_parse with a stream (NULL: none). */
int mt__pk_parse_stream(mt_pk_doc_t **out, const void *buf, size_t len, const mt_pk_cfg_t *cfg,
                        const mt_pk_stream_t *stream, char *err, size_t errlen);
/* mt__pk_parse_file with a stream (NULL: none). The file is mapped and the pages read are
 * given back as the reader passes them, so the file does not stay resident either. A file
 * compressed with xz, gzip or zstd (zsource.h) is decompressed into memory first, up to
 * cfg->max_inflate bytes (past it: MT_EPROTO, err saying to decompress it first). */
int mt__pk_parse_file_stream(mt_pk_doc_t **out, const char *path, const mt_pk_cfg_t *cfg,
                             const mt_pk_stream_t *stream, char *err, size_t errlen);
/* The value STOP returned. Borrowed from doc. */
const mt_pk_value_t *mt__pk_root(const mt_pk_doc_t *doc);
/* Bytes the document holds (values, strings, arrays). */
size_t mt__pk_memory(const mt_pk_doc_t *doc);
/* Bytes of the pickle the document was read from. A document is a tree whose leaves and
 * subtrees may be shared through the memo, so a walk that follows every reference can
 * visit far more values than the file holds; walkers bound their work by this size. */
size_t mt__pk_input_size(const mt_pk_doc_t *doc);

/* The value under the str key in dict (the last one when repeated), or NULL (also when
 * dict is NULL or not a dict). */
const mt_pk_value_t *mt__pk_get(const mt_pk_value_t *dict, const char *key);
/* Static names: "dict", "list", ...; "GLOBAL", "BINUNICODE", ... ("unknown" if none). */
const char *mt__pk_type_name(int type);
const char *mt__pk_opcode_name(unsigned op);

/* The writer (mt__pkw_*) is profiler/pickle_write.h: the recorder writes snapshots too. */

#endif
