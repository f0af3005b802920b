/* The machine a benchmark ran on, printed above its table: the CPU model, the cores online,
 * the load average, and the BLAS library in the process with its kernel (core type) and
 * thread count. Figures are only comparable within one run on one machine. */
#ifndef MT_BENCH_MACHINE_H
#define MT_BENCH_MACHINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Writes "machine: ..." and "blas: ..." lines to f. */
void mt_bench_print_machine(FILE *f);
/* CLOCK_MONOTONIC in ns. */
uint64_t mt_bench_now_ns(void);
/* The calling thread's CPU time, ns (CLOCK_THREAD_CPUTIME_ID). */
uint64_t mt_bench_thread_cpu_ns(void);
/* The median of v[0..n), n > 0 (sorts v in place). */
uint64_t mt_bench_median(uint64_t *v, size_t n);

#endif
