/* memtrace daemon: runs memtraced (the same code as the memtraced executable). */
#include "daemon/daemon.h"
#include "tools/commands.h"

int mt_cmd_daemon(int argc, char **argv)
{
    return mt_d_cli_main(argc, argv, "memtrace daemon");
}
