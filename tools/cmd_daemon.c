/* memtrace daemon: the same command line as the memtraced executable (daemon/cli.c);
 * memtrace token: the daemon's HTTP token, for curl and the browser. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "daemon/daemon.h"
#include "tools/commands.h"

int mt_cmd_daemon(int argc, char **argv)
{
    return mt__d_cli_main(argc, argv, "memtrace daemon");
}

/* The one option: --socket PATH (NULL: the default socket). */
static int parse_args(int argc, char **argv, const char **sock)
{
    *sock = NULL;
    if (argc == 3 && strcmp(argv[1], "--socket") == 0) {
        *sock = argv[2];
    } else if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: memtrace token [--socket PATH]\n\n"
               "Prints the HTTP token of the daemon at PATH (default: the default socket), read\n"
               "from PATH.token (0600, ours). Every HTTP route but /healthz needs it:\n"
               "  curl -s -H \"Authorization: Bearer $(memtrace token)\" localhost:9477/state\n"
               "  a browser: http://localhost:9477/#token=TOKEN (the fragment is never sent;\n"
               "  the page keeps the token for that tab and port only, and sets no cookie)\n");
        return 0;
    } else if (argc != 1) {
        fprintf(stderr, "usage: memtrace token [--socket PATH]\n");
        return 2;
    }
    return MT_TOOL_RUN;
}

/* Prints the token: 0, or 1 when it cannot be read or printed. */
static int run(const char *sock)
{
    char path[4200], tok[40];
    int rc = mt__d_token_path(sock, path, sizeof path);
    if (!rc)
        rc = mt__d_client_token(sock, tok, sizeof tok);
    if (rc) {
        fprintf(stderr, "memtrace token: cannot read %s: %s%s\n", path, mt_strerror(rc),
                rc == -EPERM ? " (not ours, or readable by others)" : "");
        return 1;
    }
    printf("%s\n", tok);
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}

int mt_cmd_token(int argc, char **argv)
{
    const char *sock;
    int status = parse_args(argc, argv, &sock);
    return status == MT_TOOL_RUN ? run(sock) : status;
}
