/* See machine.h. The BLAS is found by the symbols it exports (OpenBLAS, BLIS), looked up in
 * the running process, so the line names what was actually linked, not what was asked. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <unistd.h>

#include "bench/machine.h"

static void cpu_model(char *out, size_t n)
{
    snprintf(out, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *v = strchr(line, ':');
        if (!v)
            break;
        v++;
        while (*v == ' ' || *v == '\t')
            v++;
        snprintf(out, n, "%.*s", (int)strcspn(v, "\n"), v);
        break;
    }
    fclose(f);
}

static void blas_line(FILE *f)
{
    typedef char *(*str_fn)(void);
    typedef int (*int_fn)(void);
    str_fn core = (str_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "openblas_get_corename");
    str_fn config = (str_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "openblas_get_config");
    int_fn threads = (int_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "openblas_get_num_threads");
    if (core) {
        const char *ct = getenv("OPENBLAS_CORETYPE");
        fprintf(f, "blas: OpenBLAS (%s), kernel %s, %d threads%s%s\n", config ? config() : "?",
                core(), threads ? threads() : -1, ct ? ", OPENBLAS_CORETYPE=" : "", ct ? ct : "");
        return;
    }
    str_fn blis = (str_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "bli_info_get_version_str");
    if (blis) {
        typedef long (*long_fn)(void);
        long_fn nt = (long_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "bli_thread_get_num_threads");
        fprintf(f, "blas: BLIS %s, %ld threads\n", blis(), nt ? nt() : -1L);
        return;
    }
    fprintf(f, "blas: not linked into this benchmark\n");
}

void mt_bench_print_machine(FILE *f)
{
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    double load[1] = {0};
    int nl = getloadavg(load, 1);
    fprintf(f, "machine: %s, %ld cores online, load average %.2f%s\n", cpu,
            sysconf(_SC_NPROCESSORS_ONLN), nl == 1 ? load[0] : -1.0,
            " (shared: compare only ratios taken in one run)");
    blas_line(f);
}

uint64_t mt_bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t mt_bench_thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t mt_bench_median(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_u64);
    return v[n / 2];
}
