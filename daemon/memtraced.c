/* memtraced: the profiler daemon as its own executable (same code as `memtrace daemon`). */
#include <stdlib.h>
#include <string.h>

#include "analysis/symbolize.h"
#include "daemon/daemon.h"

int main(int argc, char **argv)
{
    /* debug information from elsewhere only when asked (docs/settings.md), as memtrace's */
    const char *v = getenv("MEMTRACE_DEBUGINFOD");
    mt__sym_debuginfod(v != NULL && strcmp(v, "1") == 0);
    return mt__d_cli_main(argc, argv, "memtraced");
}
