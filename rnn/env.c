/* The RNN module's environment, read in this file only (docs/process-state.md): a program
 * that honours MEMTRACE_RNN_GEMM and MEMTRACE_RNN_CHECK_SAVED calls mt_rnn_cfg_from_env at
 * its edge; mt_rnn_create reads none. (MEMTRACE_CPU_ISA and MEMTRACE_RNN_XSMM are
 * process-wide kernel switches read once by isa.c and xsmm.c, and the cuDNN loader's paths
 * by cudnn_lib.c: no module's cfg reaches them.) */
#include <stdlib.h>
#include <string.h>

#include "memtrace/rnn.h"

int mt_rnn_cfg_from_env(mt_rnn_cfg_t *cfg)
{
    if (!cfg)
        return MT_EINVAL;
    const char *env = getenv("MEMTRACE_RNN_GEMM");
    if (env && *env)
        cfg->gemm = env;
    env = getenv("MEMTRACE_RNN_CHECK_SAVED");
    if (env && *env)
        cfg->check_saved = strcmp(env, "0") != 0;
    return 0;
}
