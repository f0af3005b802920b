/* bench_preload_tag: what the calling thread's tag costs an allocation through the preload
 * (an allocation inside a tag costs no more than one outside, within noise).
 * memtrace_alloc+memtrace_free pairs (the entry points PyTorch calls; cudaMalloc reads the
 * tag the same way but cudaFree also synchronises the device) of the preload library
 * (dlopen'ed from $MEMTRACE_PRELOAD, sim backend, profiler off), outside any tag and inside one, in
 * alternating rounds so that drift on a shared machine hits both alike; medians and spreads of the
 * rounds printed. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef void *(*malloc_fn)(long size, int device, void *stream);
typedef void (*free_fn)(void *ptr, long size, int device, void *stream);
typedef int (*push_fn)(int);
typedef int (*pop_fn)(void);
typedef int (*reg_fn)(const char *);

#define ROUNDS 21
#define PAIRS  20000

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ns per alloc+free pair of 4 KiB, or a negative value if a call failed. */
static double pairs(malloc_fn m, free_fn f)
{
    double t0 = now_ns();
    for (int i = 0; i < PAIRS; i++) {
        void *p = m(4096, 0, NULL);
        if (p == NULL)
            return -1;
        f(p, 4096, 0, NULL);
    }
    return (now_ns() - t0) / PAIRS;
}

static void cpu_model(char *out, size_t n)
{
    snprintf(out, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[200];
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            snprintf(out, n, "%s", c ? c + 2 : line);
            out[strcspn(out, "\n")] = '\0';
            break;
        }
    if (f)
        fclose(f);
}

int main(void)
{
    const char *path = getenv("MEMTRACE_PRELOAD");
    setenv("MEMTRACE_PROF", "off", 0);
    setenv("MEMTRACE_BACKEND", "sim", 0);
    setenv("MEMTRACE_LOG_LEVEL", "error", 0);
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (h == NULL) {
        fprintf(stderr, "bench_preload_tag: set MEMTRACE_PRELOAD to libmemtrace-preload.so (%s)\n",
                path ? dlerror() : "unset");
        return 1;
    }
    malloc_fn m = (malloc_fn)dlsym(h, "memtrace_alloc");
    free_fn f = (free_fn)dlsym(h, "memtrace_free");
    push_fn push = (push_fn)dlsym(h, "memtrace_tag_push");
    pop_fn pop = (pop_fn)dlsym(h, "memtrace_tag_pop");
    reg_fn reg = (reg_fn)dlsym(h, "memtrace_tag_register");
    if (!m || !f || !push || !pop || !reg) {
        fprintf(stderr, "bench_preload_tag: %s lacks the entry points\n", path);
        return 1;
    }
    int tag = reg("bench");
    if (tag < 0 || pairs(m, f) < 0) { /* the warm-up fills the cache */
        fprintf(stderr, "bench_preload_tag: the preload cannot allocate (%d)\n", tag);
        return 1;
    }
    double out[ROUNDS], in[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        out[r] = pairs(m, f);
        push(tag);
        in[r] = pairs(m, f);
        pop();
        if (out[r] < 0 || in[r] < 0)
            return 1;
    }
    qsort(out, ROUNDS, sizeof out[0], cmp_double);
    qsort(in, ROUNDS, sizeof in[0], cmp_double);
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    printf("bench_preload_tag: CPU %s, %ld threads online; sim backend, profiler off; %d rounds "
           "of %d pairs, alternating\n",
           cpu, sysconf(_SC_NPROCESSORS_ONLN), ROUNDS, PAIRS);
    printf("%-44s %8s %8s %8s\n", "memtrace_alloc+memtrace_free 4 KiB, ns/pair", "min", "median",
           "max");
    printf("%-44s %8.1f %8.1f %8.1f\n", "outside any tag (anchor)", out[0], out[ROUNDS / 2],
           out[ROUNDS - 1]);
    printf("%-44s %8.1f %8.1f %8.1f\n", "inside a tag", in[0], in[ROUNDS / 2], in[ROUNDS - 1]);
    double ratio = in[ROUNDS / 2] / out[ROUNDS / 2];
    double noise = (out[ROUNDS * 3 / 4] - out[ROUNDS / 4]) / out[ROUNDS / 2];
    printf("verdict: inside/outside medians %.3f (minima %.3f), anchor's interquartile spread "
           "%.1f %%: %s\n",
           ratio, in[0] / out[0], 100 * noise,
           ratio <= 1 + (noise > 0.03 ? noise : 0.03) ? "met" : "NOT met");
    dlclose(h);
    return 0;
}
