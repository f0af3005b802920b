/* The machine a benchmark ran on, printed above its table: the CPU model, the cores online,
 * the load average, and the BLAS library in the process with its kernel (core type) and
 * thread count. Figures are only comparable within one run on one machine. */
#ifndef MT_BENCH_MACHINE_H
#define MT_BENCH_MACHINE_H

#include <stdio.h>

/* Writes "machine: ..." and "blas: ..." lines to f. */
void mt_bench_print_machine(FILE *f);

#endif
