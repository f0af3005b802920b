/* The memtrace CLI's subcommands. Each lives in its own tools/cmd_*.c file and returns
 * the process exit status: 0 success, 1 runtime failure, 2 bad usage or bad input. */
#ifndef MT_TOOLS_COMMANDS_H
#define MT_TOOLS_COMMANDS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct mt_cmd_s {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name */
    const char *summary;               /* one line for `memtrace --help` */
} mt_cmd_t;

int mt_cmd_replay(int argc, char **argv);
int mt_cmd_run(int argc, char **argv);
int mt_cmd_daemon(int argc, char **argv);
int mt_cmd_token(int argc, char **argv);
int mt_cmd_tail(int argc, char **argv);
int mt_cmd_top(int argc, char **argv);
int mt_cmd_report(int argc, char **argv);
int mt_cmd_diff(int argc, char **argv);
int mt_cmd_plot(int argc, char **argv);
int mt_cmd_export(int argc, char **argv);
int mt_cmd_view(int argc, char **argv);
int mt_cmd_snapshot(int argc, char **argv);
int mt_cmd_convert(int argc, char **argv);

/* Each command is parse_args (argv -> its options struct, messages for bad usage) then
 * run (the work, from the options alone). parse_args returns MT_TOOL_RUN when the
 * command is to run, else the exit status to end with at once (0 after --help, 2 for bad
 * usage). */
#define MT_TOOL_RUN (-1)

/* "64", "512K", "4M", "8G" (no sign, no space) → bytes. 0, or -1 naming nothing. */
int mt_tool_parse_bytes(const char *s, uint64_t *out);

/* `memtrace diff`'s comparison of two inputs (logs or snapshots, each read as `memtrace
 * report` reads it; analysis/diff.h), grouped by (mt_fr_by_e) with every frame or the
 * default rules: the document `diff --json` prints, new in *out, and the gates crossed in
 * *crossed. Returns the exit status (0, 1 unreadable, 2 malformed), said on stderr with
 * prog. Shared with `memtrace view --compare BEFORE AFTER`, whose compare view serves it. */
struct json_t;
struct mt_diff_cfg_s;
int mt_tool_diff(const char *prog, const char *before, const char *after, int by, bool all_frames,
                 const struct mt_diff_cfg_s *dc, struct json_t **out, int *crossed);

#endif
