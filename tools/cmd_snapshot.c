/* `memtrace snapshot PID -o out.pickle`: the live state of a process, through the daemon,
 * as a PyTorch memory snapshot: its device segment map now and its recent events (the
 * daemon keeps the last MT_D_RECENT) as device_traces. daemon/snapshot.c answers. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "analysis/torch_snapshot.h"
#include "daemon/daemon.h"
#include "memtrace/prof.h"
#include "tools/commands.h"
#include "tools/logs.h"

static void help(FILE *f)
{
    fprintf(f, "usage: memtrace snapshot PID -o OUT.pickle [--torch-format 2|1] [--json FILE]\n"
               "                         [--socket PATH]\n"
               "\n"
               "Asks the daemon for the live state of process PID and writes it as a PyTorch\n"
               "CUDA memory snapshot (docs/torch-snapshot.md): its device segments and blocks\n"
               "now, its recent events as device_traces, tags as frames. Open it in\n"
               "pytorch.org/memory_viz, or read it with 'memtrace report OUT.pickle'.\n"
               "\n"
               "options:\n"
               "  -o, --output FILE     the snapshot ('-': standard output)\n"
               "  --torch-format 2|1    2 (default): PyTorch 2.x's dict; 1: 1.13's list of\n"
               "                        segments (no trace)\n"
               "  --json FILE           also write the daemon's answer (memtrace JSON)\n"
               "  --socket PATH         the daemon's socket (default: as the recorder finds it)\n"
               "  -h, --help            this text\n"
               "\n"
               "When a process runs out of memory, the daemon writes such a snapshot by itself\n"
               "into its OOM directory ($MEMTRACE_OOM_DIR, else\n"
               "$XDG_STATE_HOME/memtrace/oom, else ~/.local/state/memtrace/oom).\n"
               "\n"
               "exit status: 0 written; 1 no daemon, or a write failed; 2 bad usage or no such\n"
               "process.\n"
               "\n"
               "example:\n"
               "  memtrace snapshot 4242 -o now.pickle && memtrace report now.pickle\n");
}

typedef struct labels_s {
    char names[MT_TAG_MAX][MT_EVENT_LABEL_MAX + 1];
} labels_t;

static const char *label_of(void *ud, int tag)
{
    labels_t *l = ud;
    return tag >= 0 && tag < MT_TAG_MAX && l->names[tag][0] ? l->names[tag] : NULL;
}

static uint64_t num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    if (json_is_string(v))
        return strtoull(json_string_value(v), NULL, 0);
    return json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
}

static int pool_of(const char *s)
{
    return s && strcmp(s, "small") == 0 ? MT_POOL_SMALL : MT_POOL_LARGE;
}

/* The daemon's answer as the source of a snapshot. Arrays malloc'ed into src/map. */
static int parse_answer(json_t *ans, mt_ts_source_t *src, mt_model_map_t *map, labels_t *lab,
                        char *err, size_t errlen)
{
    json_t *evs = json_object_get(ans, "events"), *segs = json_object_get(ans, "segments");
    json_t *blocks = json_object_get(ans, "blocks"), *tags = json_object_get(ans, "tags");
    if (!json_is_array(evs) || !json_is_array(segs) || !json_is_array(blocks)) {
        snprintf(err, errlen, "the daemon's answer lacks events, segments or blocks");
        return MT_EPROTO;
    }
    mt_event_rec_t *ev = calloc(json_array_size(evs) + 1, sizeof *ev);
    map->segs = calloc(json_array_size(segs) + 1, sizeof *map->segs);
    map->blocks = calloc(json_array_size(blocks) + 1, sizeof *map->blocks);
    if (ev == NULL || map->segs == NULL || map->blocks == NULL) {
        free(ev);
        snprintf(err, errlen, "out of memory");
        return MT_ENOMEM;
    }
    size_t i, n = 0;
    json_t *v;
    json_array_foreach(evs, i, v)
    {
        char e[128];
        if (mt_prof_event_from_json(v, &ev[n], NULL, e, sizeof e) == 0)
            n++;
    }
    json_array_foreach(segs, i, v)
    {
        map->segs[i] = (mt_model_seg_t){
            .addr = num(v, "addr"),
            .size = num(v, "size"),
            .stream = (uint32_t)num(v, "stream"),
            .pool = (uint8_t)pool_of(json_string_value(json_object_get(v, "pool"))),
            .mapped = json_is_true(json_object_get(v, "expandable")),
        };
    }
    map->nsegs = json_array_size(segs);
    json_array_foreach(blocks, i, v)
    {
        map->blocks[i] = (mt_model_block_t){
            .addr = num(v, "addr"),
            .size = num(v, "size"),
            .tag = (uint8_t)num(v, "tag_id"),
            .pending = json_is_true(json_object_get(v, "pending")),
        };
    }
    map->nblocks = json_array_size(blocks);
    const char *k;
    json_object_foreach(tags, k, v)
    {
        int t = atoi(k);
        if (t >= 0 && t < MT_TAG_MAX && json_is_string(v))
            snprintf(lab->names[t], sizeof lab->names[t], "%s", json_string_value(v));
    }
    *src = (mt_ts_source_t){.evs = ev, .nevs = n, .map = map, .tag_name = label_of, .ud = lab};
    return 0;
}

typedef struct snap_opts_s {
    const char *output;   /* -o: the pickle, "-" for stdout */
    const char *json_out; /* --json: the daemon's answer as it came, or NULL */
    const char *sock;     /* NULL: the default socket */
    int era;              /* --torch-format: 1 or 2 */
    long pid;             /* the process, > 0 */
} snap_opts_t;

static int parse_args(int argc, char **argv, snap_opts_t *o)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'}, {"torch-format", required_argument, NULL, 't'},
        {"json", required_argument, NULL, 'j'},   {"socket", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    *o = (snap_opts_t){.era = 2};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            o->output = optarg;
            break;
        case 't':
            if (strcmp(optarg, "1") != 0 && strcmp(optarg, "2") != 0) {
                fprintf(stderr, "memtrace snapshot: --torch-format wants 1 or 2\n");
                return 2;
            }
            o->era = optarg[0] - '0';
            break;
        case 'j':
            o->json_out = optarg;
            break;
        case 's':
            o->sock = optarg;
            break;
        case 'h':
            help(stdout);
            return 0;
        default:
            fprintf(stderr,
                    "memtrace snapshot: unknown or incomplete option '%s' (see "
                    "'memtrace snapshot --help')\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    char *end = NULL;
    o->pid = optind < argc ? strtol(argv[optind], &end, 10) : -1;
    if (optind + 1 != argc || *end != '\0' || o->pid <= 0 || o->output == NULL) {
        fprintf(stderr, "memtrace snapshot: %s (see 'memtrace snapshot --help')\n",
                o->output == NULL ? "no output given (-o FILE)" : "give one process id");
        return 2;
    }
    return MT_TOOL_RUN;
}

/* Asks the daemon for the process's snapshot and writes it: 0, 1 when the daemon cannot
 * be reached or a file not written, 2 when the daemon refuses (no such process). */
static int run(const snap_opts_t *o)
{
    const char *sock = o->sock, *output = o->output, *json_out = o->json_out;
    long pid = o->pid;
    char path[256];
    if (sock == NULL) {
        if (mt_prof_socket_path(path, sizeof path) != 0) {
            fprintf(stderr, "memtrace snapshot: cannot name the daemon's socket\n");
            return 1;
        }
        sock = path;
    }
    int fd, status = 0;
    if (mt__d_client_connect(sock, &fd) != 0) {
        fprintf(stderr, "memtrace snapshot: no daemon at %s (start one: memtrace daemon)\n", sock);
        return 1;
    }
    char req[64], *text = NULL;
    int n = snprintf(req, sizeof req, "{\"type\":\"snapshot\",\"pid\":%ld}\n", pid);
    int rc = mt__d_client_send(fd, req, (size_t)n);
    if (rc == 0)
        rc = mt__d_client_read_all(fd, 256u << 20, 10000, &text, NULL);
    close(fd);
    json_t *ans = rc == 0 ? json_loads(text, 0, NULL) : NULL;
    if (ans == NULL || json_object_get(ans, "error") != NULL) {
        const char *e = json_string_value(json_object_get(ans, "error"));
        fprintf(stderr, "memtrace snapshot: %s\n",
                e    ? e
                : rc ? mt_strerror(rc)
                     : "the daemon's answer is not JSON");
        free(text);
        json_decref(ans);
        return e ? 2 : 1;
    }
    if (json_out != NULL) {
        FILE *f = fopen(json_out, "w");
        if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
            fprintf(stderr, "memtrace snapshot: cannot write %s\n", json_out);
            status = 1;
        }
    }
    free(text);
    mt_ts_source_t src;
    mt_model_map_t map = {0};
    labels_t lab = {0};
    mt_ts_t *ts = NULL;
    char err[256];
    rc = parse_answer(ans, &src, &map, &lab, err, sizeof err);
    if (rc == 0) {
        rc = mt__ts_from_events(&ts, &src, err, sizeof err);
        free((void *)src.evs);
    }
    free(map.segs);
    free(map.blocks);
    json_decref(ans);
    if (rc == 0) {
        FILE *f = strcmp(output, "-") == 0 ? stdout : fopen(output, "wb");
        rc = f ? mt__ts_write(ts, f, o->era) : MT_EIO;
        if (f != NULL && f != stdout && fclose(f) != 0 && rc == 0)
            rc = MT_EIO;
        snprintf(err, sizeof err, "%s: %s", output, mt_strerror(rc));
    }
    if (rc < 0) {
        fprintf(stderr, "memtrace snapshot: %s\n", err);
        status = 1;
    } else {
        if (strcmp(output, "-") != 0)
            fprintf(stderr, "memtrace snapshot: wrote %s (process %ld: %zu segments, %zu events)\n",
                    output, pid, ts->nsegments, ts->nevents);
        mt_tool_viz_dropped("memtrace snapshot", ts->viz_dropped); /* (stderr, with -o - too) */
    }
    mt__ts_destroy(&ts);
    return status;
}

int mt_cmd_snapshot(int argc, char **argv)
{
    snap_opts_t o;
    int status = parse_args(argc, argv, &o);
    return status == MT_TOOL_RUN ? run(&o) : status;
}
