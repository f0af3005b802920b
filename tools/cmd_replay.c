/* `memtrace replay`: replays an RMM logging CSV through the caching allocator on the sim
 * backend and reports what a user of the reference allocator would ask about it: peaks,
 * utilization, fragmentation, backend calls, cost per operation.
 *
 * The trace is loaded and checked completely first (trace_csv.c), so malformed input is
 * reported before anything runs and the timed loop does no parsing or hashing: pointers
 * became slot numbers and each slot holds our pointer. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "analysis/replay.h"
#include "analysis/trace_csv.h"
#include "memtrace/alloc.h"
#include "memtrace/backend.h"
#include "tools/commands.h"
#include "tools/replay_host.h"
#include "tools/snapshot_in.h"

/* ---- the command ---- */

static void usage(FILE *f)
{
    fprintf(f, "usage: memtrace replay FILE [--alloc-conf STR] [--warmup] [--second-pass]\n"
               "                            [--capacity BYTES] [--json] [--help]\n"
               "\n"
               "Replays an allocation trace through the memtrace caching allocator on the sim\n"
               "backend (host memory posing as a device) and reports peak allocated and\n"
               "reserved bytes, utilization and fragmentation at the peak, backend calls,\n"
               "retries/OOMs and the cost per operation.\n"
               "\n"
               "FILE is RMM's logging CSV, or a PyTorch memory snapshot (the pickle of\n"
               "torch.cuda.memory._dump_snapshot; each device's trace is replayed and\n"
               "PyTorch's own reserved and peak figures are printed beside memtrace's).\n"
               "A CSV compressed with xz, gzip or zstd is read as it is (data/traces/*.xz);\n"
               "'-' reads the CSV from standard input.\n"
               "RMM's CSV: the header Thread,Time,Action,Pointer,Size,Stream,\n"
               "then rows like  2342727,15:47:02.841961,allocate,0x10012400000,1048576,0\n"
               "(Action allocate, free or 'allocate failure'; Pointer and Stream hex, with\n"
               "or without 0x, as RMM's releases write them, stream 0 = the default stream;\n"
               "Size decimal; Time as seconds and Action deallocate, as RMM's documentation\n"
               "shows them, are read too). Rows are replayed in file\n"
               "order on one thread; each trace stream becomes a stream of its own (a block is\n"
               "reused on the stream it was allocated on); 'allocate failure' rows are counted\n"
               "and skipped. The whole file is checked before anything runs.\n"
               "\n"
               "options:\n"
               "  --alloc-conf STR   allocator settings, as MEMTRACE_ALLOC_CONF (applied after\n"
               "                     it), e.g. expandable_segments:True,max_split_size_mb:64\n"
               "  --warmup           replay once to measure the peak (warm-up reservation),\n"
               "                     then replay again and report that second run\n"
               "  --second-pass      replay once unmeasured on the same allocator, then replay\n"
               "                     again and report that second run (a training loop's\n"
               "                     later iterations; ignored with --warmup)\n"
               "  --capacity BYTES   size of the simulated device (suffixes K, M, G, T, binary;\n"
               "                     default MEMTRACE_SIM_CAPACITY or 8G; for a PyTorch\n"
               "                     snapshot, twice the peak it reserved when that is more)\n"
               "  --json             print one JSON object instead of the table\n"
               "  --help             this text\n"
               "\n"
               "ns per op is wall time per allocate or free and includes the sim backend's\n"
               "modelled cost of each segment malloc/free (MEMTRACE_SIM_MALLOC_COST_NS),\n"
               "which is also shown on its own. The table then times the same allocates and\n"
               "frees through glibc malloc, mimalloc and jemalloc on this machine. jemalloc\n"
               "runs in a second process of this program that preloads it (LD_PRELOAD of\n"
               "$MEMTRACE_JEMALLOC, default " MT_TOOL_JEMALLOC_DEFAULT "), so that it is that\n"
               "process's malloc; an allocator that is not installed is left out, and the\n"
               "table says so.\n"
               "\n"
               "exit status: 0 replayed; 1 the allocator or backend failed; 2 bad usage or a\n"
               "malformed trace (the message names the line and the field).\n"
               "\n"
               "example:\n"
               "  memtrace replay data/traces/rnn_varlen.csv --warmup\n"
               "  memtrace replay data/traces/torch_lstm.csv.xz --second-pass\n"
               "  memtrace replay snapshot.pickle --alloc-conf expandable_segments:True\n"
               "  memtrace replay data/traces/somas_resnet50.csv \\\n"
               "      --alloc-conf expandable_segments:True --json\n");
}

/* "12", "512K", "8G", "1.5GiB" → bytes. */
static int parse_bytes(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0 || v < 0)
        return MT_EINVAL;
    double mul = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mul = 1024.0 * 1024;
        end++;
        break;
    case 'g':
    case 'G':
        mul = 1024.0 * 1024 * 1024;
        end++;
        break;
    case 't':
    case 'T':
        mul = 1024.0 * 1024 * 1024 * 1024;
        end++;
        break;
    default:
        break;
    }
    if (mul > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
        end += strlen(end);
    else if (mul == 1 && strcmp(end, "B") == 0)
        end++;
    if (*end != '\0' || v * mul >= 18446744073709551615.0 || v * mul < 1)
        return MT_EINVAL;
    *out = (size_t)(v * mul);
    return 0;
}

static void human(char *buf, size_t n, uint64_t bytes)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, n, "%.2f %s (%llu B)", v, unit[u], (unsigned long long)bytes);
}

static void print_text(const char *path, const mt_trace_t *t, const mt_replay_cfg_t *cfg,
                       const mt_replay_result_t *r)
{
    char b1[64], b2[64];
    double ops = r->ops ? (double)r->ops : 1;
    printf("memtrace replay: %s%s\n", path,
           cfg->warmup        ? " (after a warm-up pass)"
           : cfg->second_pass ? " (second pass on the same allocator)"
                              : "");
    human(b1, sizeof b1, r->capacity);
    printf("  %-24s %s, capacity %s, modelled segment malloc %llu ns\n", "backend", r->backend, b1,
           (unsigned long long)r->malloc_cost_ns);
    if (cfg->alloc_conf != NULL)
        printf("  %-24s %s\n", "alloc conf", cfg->alloc_conf);
    printf("  %-24s %zu (%zu allocate, %zu free, %zu allocate failure; %zu stream%s)\n", "events",
           t->nrows, t->nallocs, t->nfrees, t->nfailures, t->nstreams, t->nstreams == 1 ? "" : "s");
    human(b1, sizeof b1, t->peak_live_bytes);
    printf("  %-24s %s, %zu allocations\n", "trace peak live", b1, t->peak_live_count);
    if (t->leaked)
        printf("  %-24s %zu allocation%s never freed\n", "trace leaks", t->leaked,
               t->leaked == 1 ? "" : "s");
    human(b1, sizeof b1, r->peak_allocated);
    printf("  %-24s %s\n", "peak allocated", b1);
    human(b1, sizeof b1, r->peak_reserved);
    printf("  %-24s %s\n", "peak reserved", b1);
    printf("  %-24s %.4f (peak allocated / peak reserved)\n", "utilization at peak",
           r->utilization_at_peak);
    if (r->sampled) {
        human(b1, sizeof b1, r->largest_free_at_peak);
        human(b2, sizeof b2, r->total_free_at_peak);
        printf("  %-24s %.4f (largest free block %s of %s free)\n", "fragmentation at peak",
               r->fragmentation_at_peak, b1, b2);
    }
    if (cfg->warmup) {
        human(b1, sizeof b1, r->warmup_reserved);
        printf("  %-24s %llu backend calls, reserved %s\n", "warm-up",
               (unsigned long long)r->warmup_backend_calls, b1);
    }
    if (cfg->second_pass && !cfg->warmup)
        printf("  %-24s %llu backend calls\n", "first pass",
               (unsigned long long)r->first_pass_backend_calls);
    printf("  %-24s malloc %llu, free %llu, vm map %llu, vm unmap %llu\n", "backend calls",
           (unsigned long long)r->backend_malloc, (unsigned long long)r->backend_free,
           (unsigned long long)r->backend_map, (unsigned long long)r->backend_unmap);
    printf("  %-24s %llu / %llu\n", "retries / OOMs", (unsigned long long)r->num_alloc_retries,
           (unsigned long long)r->num_ooms);
    printf("  %-24s %.1f (wall; %.1f of it modelled backend cost, %.1f without)\n", "ns per op",
           (double)r->elapsed_ns / ops, (double)r->modelled_ns / ops,
           (double)(r->elapsed_ns -
                    (r->modelled_ns < r->elapsed_ns ? r->modelled_ns : r->elapsed_ns)) /
               ops);
}

/* The same sequence through the host allocators, in this run: the per-op cost to compare
 * with memtrace's own (its wall time less the modelled backend cost). */
static void print_hosts(const char *path, const mt_trace_t *t, const mt_replay_cfg_t *cfg,
                        const mt_replay_result_t *r)
{
    char machine[192];
    mt__replay_machine(machine, sizeof machine);
    printf("  %-24s %s\n", "machine", machine);
    double ops = r->ops ? (double)r->ops : 1;
    double own = (double)(r->elapsed_ns -
                          (r->modelled_ns < r->elapsed_ns ? r->modelled_ns : r->elapsed_ns)) /
                 ops;
    for (int i = 0; i < MT_HOST_N; i++) {
        char name[64];
        double ns;
        if (i == MT_HOST_JEMALLOC) {
            /* Not dlopen'ed here: measured by a child that preloads it (replay_host.h). */
            mt_tool_jemalloc_t je;
            mt_tool_jemalloc_measure(path, cfg->rounds, &je);
            if (!je.measured) {
                printf("  %-24s %s\n", "", je.note);
                continue;
            }
            snprintf(name, sizeof name, "jemalloc %s", je.version);
            ns = (double)je.ns / ops;
        } else {
            mt_host_alloc_t h;
            mt__host_alloc_load(&h, i);
            if (h.alloc == NULL) {
                printf("  %-24s %s\n", "", h.note);
                continue;
            }
            snprintf(name, sizeof name, "%s", h.name);
            ns = (double)mt__replay_host(&h, t, cfg->rounds) / ops;
        }
        printf("  %-24s %.1f ns per op (memtrace without modelled cost: %.2fx)\n", name, ns,
               ns > 0 ? own / ns : 0.0);
    }
}

/* Byte counts are uint64; JSON integers (jansson's json_int_t) are signed 64-bit. A count
 * beyond INT64_MAX (only a nonsense trace gets there) is written as a real, not wrapped. */
static json_t *jbytes(uint64_t v)
{
    return v <= (uint64_t)INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v);
}

static int print_json(const char *path, const mt_trace_t *t, const mt_replay_cfg_t *cfg,
                      const mt_replay_result_t *r)
{
    double ops = r->ops ? (double)r->ops : 1;
    json_t *o = json_object();
    if (o == NULL)
        return MT_ENOMEM;
    int bad = 0; /* a field that could not be made (out of memory): print nothing */
    bad |= json_object_set_new(o, "file", json_string(path));
    bad |= json_object_set_new(o, "backend", json_string(r->backend));
    bad |= json_object_set_new(o, "capacity_bytes", json_integer((json_int_t)r->capacity));
    bad |= json_object_set_new(o, "modelled_segment_malloc_ns",
                               json_integer((json_int_t)r->malloc_cost_ns));
    bad |= json_object_set_new(o, "alloc_conf",
                               cfg->alloc_conf ? json_string(cfg->alloc_conf) : json_null());
    bad |= json_object_set_new(o, "warmup", json_boolean(cfg->warmup));
    bad |= json_object_set_new(o, "second_pass", json_boolean(cfg->second_pass && !cfg->warmup));
    bad |= json_object_set_new(o, "events", json_integer((json_int_t)t->nrows));
    bad |= json_object_set_new(o, "allocates", json_integer((json_int_t)t->nallocs));
    bad |= json_object_set_new(o, "frees", json_integer((json_int_t)t->nfrees));
    bad |= json_object_set_new(o, "allocate_failures", json_integer((json_int_t)t->nfailures));
    bad |= json_object_set_new(o, "streams", json_integer((json_int_t)t->nstreams));
    bad |= json_object_set_new(o, "trace_leaks", json_integer((json_int_t)t->leaked));
    bad |= json_object_set_new(o, "trace_peak_live_bytes", jbytes(t->peak_live_bytes));
    bad |=
        json_object_set_new(o, "peak_allocated_bytes", json_integer((json_int_t)r->peak_allocated));
    bad |=
        json_object_set_new(o, "peak_reserved_bytes", json_integer((json_int_t)r->peak_reserved));
    bad |= json_object_set_new(o, "utilization_at_peak", json_real(r->utilization_at_peak));
    bad |= json_object_set_new(o, "fragmentation_at_peak",
                               r->sampled ? json_real(r->fragmentation_at_peak) : json_null());
    bad |= json_object_set_new(o, "largest_free_block_at_peak_bytes",
                               json_integer((json_int_t)r->largest_free_at_peak));
    bad |= json_object_set_new(o, "total_free_at_peak_bytes",
                               json_integer((json_int_t)r->total_free_at_peak));
    bad |=
        json_object_set_new(o, "backend_malloc_calls", json_integer((json_int_t)r->backend_malloc));
    bad |= json_object_set_new(o, "backend_free_calls", json_integer((json_int_t)r->backend_free));
    bad |= json_object_set_new(o, "backend_vm_map_calls", json_integer((json_int_t)r->backend_map));
    bad |= json_object_set_new(o, "backend_vm_unmap_calls",
                               json_integer((json_int_t)r->backend_unmap));
    bad |= json_object_set_new(o, "warmup_backend_calls",
                               json_integer((json_int_t)r->warmup_backend_calls));
    bad |= json_object_set_new(o, "first_pass_backend_calls",
                               json_integer((json_int_t)r->first_pass_backend_calls));
    bad |= json_object_set_new(o, "warmup_reserved_bytes",
                               json_integer((json_int_t)r->warmup_reserved));
    bad |=
        json_object_set_new(o, "num_alloc_retries", json_integer((json_int_t)r->num_alloc_retries));
    bad |= json_object_set_new(o, "num_ooms", json_integer((json_int_t)r->num_ooms));
    bad |= json_object_set_new(o, "ns_per_op", json_real((double)r->elapsed_ns / ops));
    bad |= json_object_set_new(o, "modelled_ns_per_op", json_real((double)r->modelled_ns / ops));
    if (bad) {
        json_decref(o);
        return MT_ENOMEM;
    }
    errno = 0; /* jansson reports a failure without a reason: errno tells */
    int rc = json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(o);
    if (rc == 0)
        putchar('\n');
    return rc == 0 ? 0 : errno == ENOMEM ? MT_ENOMEM : MT_EIO;
}

typedef struct replay_opts_s {
    mt_replay_cfg_t cfg; /* allocator settings, passes, capacity */
    bool json;           /* --json */
    long host_rounds;    /* > 0: the child that times jemalloc (replay_host.h) */
    const char *path;    /* the trace, borrowed from argv */
} replay_opts_t;

static int parse_args(int argc, char **argv, replay_opts_t *o)
{
    static const struct option opts[] = {
        {"alloc-conf", required_argument, NULL, 'c'},
        {"json", no_argument, NULL, 'j'},
        {"warmup", no_argument, NULL, 'w'},
        {"second-pass", no_argument, NULL, 's'},
        {"capacity", required_argument, NULL, 'C'},
        {"help", no_argument, NULL, 'h'},
        {MT_TOOL_HOST_OPTION, required_argument, NULL, 'H'},
        {NULL, 0, NULL, 0},
    };
    *o = (replay_opts_t){.cfg = mt__replay_cfg_default()};
    mt_replay_cfg_t *cfg = &o->cfg;
    cfg->sample_peak = true;
    cfg->rounds = 3; /* the fastest of three passes: one pass of a short trace is noisy */
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            cfg->alloc_conf = optarg;
            break;
        case 'j':
            o->json = true;
            break;
        case 'w':
            cfg->warmup = true;
            break;
        case 's':
            cfg->second_pass = true;
            break;
        case 'C':
            if (parse_bytes(optarg, &cfg->capacity) < 0) {
                fprintf(stderr, "memtrace replay: --capacity: not a size in bytes: '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'H':
            o->host_rounds = strtol(optarg, NULL, 10);
            if (o->host_rounds < 1 || o->host_rounds > 1000)
                return 2;
            break;
        default:
            fprintf(stderr,
                    "memtrace replay: unknown or incomplete option '%s' "
                    "(see 'memtrace replay --help')\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (argc - optind != 1) {
        fprintf(stderr, "memtrace replay: %s (see 'memtrace replay --help')\n",
                argc - optind == 0 ? "missing the trace FILE" : "more than one FILE given");
        return 2;
    }
    o->path = argv[optind];
    return MT_TOOL_RUN;
}

/* Replays the trace and prints the result: 0, 1 (I/O, memory), 2 (a malformed trace or
 * settings). */
static int run(const replay_opts_t *o)
{
    const char *path = o->path;
    const bool json = o->json;
    mt_replay_cfg_t cfg = o->cfg;
    if (o->host_rounds > 0)
        return mt_tool_jemalloc_child(path, (unsigned)o->host_rounds);
    if (mt__ts_is_pickle(path)) /* a PyTorch memory snapshot (docs/torch-snapshot.md) */
        return mt_tool_replay_snapshot(path, &cfg, json);
    char err[MT_TRACE_ERR_LEN + 256] = "";
    mt_backend_cfg_t env_bc = mt_backend_cfg_default();
    if (mt_backend_cfg_from_env(&env_bc, err, sizeof err) != 0) {
        fprintf(stderr, "memtrace replay: %s\n", err);
        return 2;
    }
    mt_trace_t *t = NULL;
    int rc = mt__trace_load(&t, path, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "memtrace replay: %s\n", err);
        return rc == MT_ENOMEM || rc == MT_EIO ? 1 : 2;
    }
    mt_replay_result_t res;
    rc = mt__replay_run(t, &cfg, &res, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "memtrace replay: %s\n", err);
        mt__trace_free(&t);
        return rc == MT_EINVAL ? 2 : 1;
    }
    if (json && (rc = print_json(path, t, &cfg, &res)) < 0)
        fprintf(stderr, "memtrace replay: cannot print the result: %s\n", mt_strerror(rc));
    else if (!json) {
        print_text(path, t, &cfg, &res);
        print_hosts(path, t, &cfg, &res);
    }
    mt__trace_free(&t);
    return rc < 0 ? 1 : 0;
}

int mt_cmd_replay(int argc, char **argv)
{
    replay_opts_t o;
    int status = parse_args(argc, argv, &o);
    return status == MT_TOOL_RUN ? run(&o) : status;
}
