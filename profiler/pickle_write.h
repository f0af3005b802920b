/* A pickle writer for plain data (protocol 4, no frames), the inverse of the restricted
 * reader in analysis/pickle.h. In the profiler so that the recorder can write a PyTorch
 * snapshot at an OOM with no daemon; analysis/torch_snapshot_write.c uses it too. */
#ifndef MT_PROFILER_PICKLE_WRITE_H
#define MT_PROFILER_PICKLE_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Protocol 4 without frames, for plain data; containers are written in batches of 1000 as
 * pickle.dump does. Errors are sticky: check mt_pkw_finish. The stream is written without
 * its lock: no other thread may use it until mt_pkw_finish. */
typedef struct mt_pkw_s {
    FILE *f;            /* borrowed */
    int err;            /* first error, 0 or negative */
    unsigned depth;     /* open containers */
    uint32_t memo;      /* next memo index */
    bool put;           /* memoize the next value written */
    uint8_t kind[32];   /* per open container: 'l' list, 'd' dict, 't' tuple */
    uint32_t count[32]; /* items (dict: keys and values) since the last MARK */
} mt_pkw_t;

void mt_pkw_init(mt_pkw_t *w, FILE *f);
void mt_pkw_none(mt_pkw_t *w);
void mt_pkw_bool(mt_pkw_t *w, bool v);
void mt_pkw_int(mt_pkw_t *w, int64_t v);
void mt_pkw_float(mt_pkw_t *w, double v);
void mt_pkw_str(mt_pkw_t *w, const char *s); /* UTF-8; NULL writes None */
void mt_pkw_list_begin(mt_pkw_t *w);
void mt_pkw_list_end(mt_pkw_t *w);
void mt_pkw_dict_begin(mt_pkw_t *w); /* then key, value, key, value, ... */
void mt_pkw_dict_end(mt_pkw_t *w);
void mt_pkw_tuple_begin(mt_pkw_t *w);
void mt_pkw_tuple_end(mt_pkw_t *w);
/* Memoizes the next value written (a scalar, list or dict; not a tuple) and returns its
 * index, for mt_pkw_get. */
uint32_t mt_pkw_put_next(mt_pkw_t *w);
void mt_pkw_get(mt_pkw_t *w, uint32_t index);
/* Writes STOP and returns the first error (MT_EIO, MT_EINVAL for unbalanced use) or 0. */
int mt_pkw_finish(mt_pkw_t *w);

#endif
