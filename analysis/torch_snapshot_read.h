/* The snapshot model's internals (torch_snapshot.h), shared by its building
 * (torch_snapshot.c) and its reading (torch_snapshot_read.c: the pickle whole;
 * torch_snapshot_stream.c: device_traces as the file is parsed). */
#ifndef MT_ANALYSIS_TORCH_SNAPSHOT_READ_H
#define MT_ANALYSIS_TORCH_SNAPSHOT_READ_H

#include "analysis/torch_snapshot.h"
#include "util/addrmap.h"

/* What the model owns besides its arrays: capacities, copied strings, the pickle whose
 * strings it points into, and the tag each stack carries. */
typedef struct mt_ts_mem_s {
    size_t cap_segments, cap_blocks, cap_history, cap_events, cap_frames, cap_stacks,
        cap_annotations, cap_dev;
    char **strs;
    size_t nstrs, cap_strs;
    mt_pk_doc_t *doc;
    uint8_t *stack_tag; /* per stack: memtrace tag, 0xff none */
    size_t cap_stack_tag;
} mt_ts_mem_t;

/* ---- torch_snapshot.c ---- */
/* Grows *arr (of elem-byte entries) to hold need; MT_ENOMEM. */
int mt__ts_reserve(void **arr, size_t *cap, size_t need, size_t elem);
/* Appends a stack of n frames (strings borrowed: the caller keeps them alive); *id: its
 * index. 0 or MT_ENOMEM. */
int mt__ts_push_stack(mt_ts_t *ts, const mt_ts_frame_t *frames, size_t n, uint32_t *id);

/* ---- torch_snapshot_read.c ---- */
/* The reader's work budget: values visited (list items, dict pairs, frames lookups) per
 * byte of the file, plus a floor for small files. A pickle can refer to one list or dict
 * from many places through the memo (BINGET: 2 bytes), so a file of a few hundred KB can
 * describe 10^12 trace entries as lists of lists of one shared dict. The reader charges
 * each visit once per reference it follows; in a file pickle.dump made from a snapshot,
 * every value followed is a distinct object of at least a byte of the file, except the
 * shared frames lists, read once each (by identity) and charged 1 per reference, and the
 * shared frame dicts (a few pairs, 2 bytes per reference). 16 per byte leaves such files
 * far below the budget and bounds the model at a few hundred times the file's size. */
#define VISITS_PER_BYTE 16u
#define VISITS_FLOOR    ((uint64_t)1 << 20)

/* Where in the file a value is, for messages: "device_traces[0][17]".
 * Invariant: visits <= budget while the read goes on. */
typedef struct rd_s {
    mt_ts_t *ts;
    const char *name;
    char *err;
    size_t errlen;
    mt__amap_t seen;     /* frames lists read, by their pickle value's address: their stack */
    uint64_t visits;     /* values visited so far, shared ones once per reference */
    uint64_t budget;     /* VISITS_PER_BYTE * file bytes + VISITS_FLOOR */
    struct strm_s *strm; /* device_traces read as the pickle streams them, or NULL */
} rd_t;

/* d's value under key (an integer; a size: not negative; a string; a list or tuple), or 0 /
 * NULL when it is absent or None and not required; else the error, named by where
 * (mt__ts_get_str and mt__ts_get_seq: in *rc, with NULL). */
int mt__ts_get_int(rd_t *r, const mt_pk_value_t *d, const char *key, bool required, int64_t *out,
                   const char *where);
const char *mt__ts_get_str(rd_t *r, const mt_pk_value_t *d, const char *key, bool required,
                           const char *where, int *rc);
const mt_pk_value_t *mt__ts_get_seq(rd_t *r, const mt_pk_value_t *d, const char *key, bool required,
                                    const char *where, int *rc);
/* Charges n visits to the budget; past it, the file is refused by name. */
int mt__ts_visit(rd_t *r, size_t n, const char *where);
/* v is a dict, charged its pairs. */
int mt__ts_want_dict(rd_t *r, const mt_pk_value_t *v, const char *where);
/* One trace entry of device d as an event (streamed: its frames interned by content). */
int mt__ts_read_entry(rd_t *r, const mt_pk_value_t *e, size_t d, const char *where, bool streamed);
/* The snapshot's top level: segments, then device_traces, annotations and settings. */
int mt__ts_read_root(rd_t *r, const mt_pk_value_t *root);

/* ---- torch_snapshot_stream.c ---- */
/* The stack of e's frames, interned by content. */
int mt__ts_stream_frames(rd_t *r, const mt_pk_value_t *e, const char *where, uint32_t *id);
/* After streaming: events grouped by device, dev_first set; MT_EAGAIN when the streamed
 * lists are not the final device_traces. */
int mt__ts_sort_streamed(rd_t *r, size_t ndev, size_t streamed);
/* Reads path with device_traces streamed: MT_EAGAIN when the file is not laid out as
 * pickle.dump writes a snapshot (the caller reads it whole instead). */
int mt__ts_read_streamed(mt_ts_t **out, const char *path, char *err, size_t errlen);

#endif
