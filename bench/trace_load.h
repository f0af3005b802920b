/* Loading the benchmarks' traces: RMM CSV, plain or compressed (data/traces). */
#ifndef MT_BENCH_TRACE_LOAD_H
#define MT_BENCH_TRACE_LOAD_H

#include <stddef.h>

#include "analysis/trace_csv.h"

/* Loads the trace at path; a .xz or .gz file is read through `xz -dc` or `gzip -dc`, so
 * nothing is written to disk. *t is new. Returns as mt__trace_load. */
int mt_bench_load_trace(const char *path, mt_trace_t **t, char *err, size_t errlen);
/* The file name of path, without its directories. */
const char *mt_bench_base_name(const char *path);

#endif
