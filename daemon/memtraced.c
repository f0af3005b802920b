/* memtraced: the profiler daemon as its own executable (same code as `memtrace daemon`). */
#include "daemon/daemon.h"

int main(int argc, char **argv)
{
    return mt__d_cli_main(argc, argv, "memtraced");
}
