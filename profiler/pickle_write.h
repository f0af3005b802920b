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
 * pickle.dump does. Errors are sticky: check mt__pkw_finish. The stream is written without
 * its lock: no other thread may use it until mt__pkw_finish. */
typedef struct mt__pkw_s {
    FILE *f;            /* borrowed */
    int err;            /* first error, 0 or negative */
    unsigned depth;     /* open containers */
    uint32_t memo;      /* next memo index */
    bool put;           /* memoize the next value written */
    uint8_t kind[32];   /* per open container: 'l' list, 'd' dict, 't' tuple */
    uint32_t count[32]; /* items (dict: keys and values) since the last MARK */
} mt__pkw_t;

void mt__pkw_init(mt__pkw_t *w, FILE *f);
void mt__pkw_none(mt__pkw_t *w);
void mt__pkw_bool(mt__pkw_t *w, bool v);
void mt__pkw_int(mt__pkw_t *w, int64_t v);
void mt__pkw_float(mt__pkw_t *w, double v);
void mt__pkw_str(mt__pkw_t *w, const char *s); /* UTF-8; NULL writes None */
void mt__pkw_list_begin(mt__pkw_t *w);
void mt__pkw_list_end(mt__pkw_t *w);
void mt__pkw_dict_begin(mt__pkw_t *w); /* then key, value, key, value, ... */
void mt__pkw_dict_end(mt__pkw_t *w);
void mt__pkw_tuple_begin(mt__pkw_t *w);
void mt__pkw_tuple_end(mt__pkw_t *w);
/* Memoizes the next value written (a scalar, list or dict; not a tuple) and returns its
 * index, for mt__pkw_get. */
uint32_t mt__pkw_put_next(mt__pkw_t *w);
void mt__pkw_get(mt__pkw_t *w, uint32_t index);
/* Writes STOP and returns the first error (MT_EIO, MT_EINVAL for unbalanced use) or 0. */
int mt__pkw_finish(mt__pkw_t *w);

#endif
