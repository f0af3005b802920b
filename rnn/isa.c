/* The ISA level of the cell loops: the highest this CPU runs, capped by $MEMTRACE_CPU_ISA.
 *
 * The cell loops are built once per level (MT__RNN_ISA_DISPATCH in internal.h) and the level
 * is chosen once, on first use, like dav1d's CPU mask: a host with AVX-512 can then run and
 * test the AVX2 and baseline builds too (MEMTRACE_CPU_ISA=avx2, =baseline), which GCC's
 * target_clones, picking by the CPU alone, never let it do. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rnn/internal.h"
#include "util/log.h"

static const char *const names[] = {"baseline", "avx2", "avx512"};
_Static_assert(sizeof names / sizeof names[0] == MT__RNN_ISA_AVX512 + 1, "a name per level");

const char *mt__rnn_isa_name(int level)
{
    return level >= MT__RNN_ISA_BASELINE && level <= MT__RNN_ISA_AVX512 ? names[level] : "unknown";
}

int mt__rnn_isa_cpu(void)
{
#if MT__RNN_ISA_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4"))
        return MT__RNN_ISA_AVX512;
    if (__builtin_cpu_supports("x86-64-v3"))
        return MT__RNN_ISA_AVX2;
#endif
    return MT__RNN_ISA_BASELINE;
}

int mt__rnn_isa_from_env(int *cap)
{
    const char *v = getenv("MEMTRACE_CPU_ISA");
    *cap = MT__RNN_ISA_AVX512;
    if (!v || !*v)
        return 0;
    for (int l = MT__RNN_ISA_BASELINE; l <= MT__RNN_ISA_AVX512; l++)
        if (strcmp(v, names[l]) == 0) {
            *cap = l;
            return 0;
        }
    return MT_EINVAL;
}

/* The level in use (-1 until chosen) and how $MEMTRACE_CPU_ISA read at the choice. */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static atomic_int level = -1;
static int env_rc;
static char env_value[64];

static void choose(void)
{
    int cap, cpu = mt__rnn_isa_cpu();
    env_rc = mt__rnn_isa_from_env(&cap);
    if (env_rc)
        snprintf(env_value, sizeof env_value, "%s", getenv("MEMTRACE_CPU_ISA"));
    atomic_store(&level, cpu < cap ? cpu : cap);
}

int mt__rnn_isa(void)
{
    int l = atomic_load_explicit(&level, memory_order_relaxed);
    if (l >= 0)
        return l;
    pthread_once(&once, choose);
    return atomic_load(&level);
}

int mt__rnn_isa_check(mt_log_cb log, void *ud)
{
    pthread_once(&once, choose);
    if (env_rc)
        mt__logf(log, ud, MT_LOG_ERROR,
                 "rnn: MEMTRACE_CPU_ISA=\"%s\" is unknown: expected avx512, avx2 or baseline (the "
                 "highest instruction set the cell loops may use), or unset",
                 env_value);
    return env_rc;
}

int mt__rnn_isa_set(int l)
{
    pthread_once(&once, choose);
    int cpu = mt__rnn_isa_cpu();
    l = l < MT__RNN_ISA_BASELINE ? MT__RNN_ISA_BASELINE : l > cpu ? cpu : l;
    atomic_store(&level, l);
    return l;
}
