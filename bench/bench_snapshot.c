/* bench_snapshot: reading a PyTorch memory snapshot of about 100 MB (<= 2x the
 * time of Python's pickle.load of the same file), with peak RSS.
 *
 * The file is made at bench time by Python's pickle.dump (what _dump_snapshot runs), in
 * PyTorch 2.x's layout: a trace of alloc/free events whose frames lists are shared per
 * call site, as PyTorch shares one traceback object between entries. Then, in one run on
 * one machine: memtrace's reader (the restricted unpickler, then the snapshot model) and
 * python3's pickle.load, each best of 3; each side's peak RSS is reported.
 * usage: bench_snapshot [MB] (default 100); MEMTRACE_BENCH_PYTHON picks the interpreter. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "analysis/pickle.h"
#include "analysis/torch_snapshot.h"
#include "bench/machine.h"

static const char *gen_py =
    "import pickle, random, sys\n"
    "target = int(sys.argv[2]) << 20\n"
    "random.seed(1)\n"
    "sites = [[{'name': 'fn%d_%d' % (s, k), 'filename': '/work/model/layer%d.py' % s,\n"
    "           'line': 10 + k} for k in range(12)] for s in range(2000)]\n"
    "trace, live, addr, t = [], [], 0x7f0000000000, 0\n"
    "approx = 0\n"
    "while approx < target:\n"
    "    t += 3\n"
    "    if live and random.random() < 0.48:\n"
    "        a, size, fr = live.pop(random.randrange(len(live)))\n"
    "        for act in ('free_requested', 'free_completed'):\n"
    "            trace.append({'action': act, 'addr': a, 'size': size, 'stream': 0,\n"
    "                          'time_us': t, 'frames': fr})\n"
    "    else:\n"
    "        size = random.randrange(1, 1 << 22)\n"
    "        fr = random.choice(sites)\n"
    "        addr += 1 << 23\n"
    "        live.append((addr, size, fr))\n"
    "        trace.append({'action': 'alloc', 'addr': addr, 'size': size, 'stream': 0,\n"
    "                      'time_us': t, 'frames': fr})\n"
    "    approx += 75\n"
    "snap = {'segments': [], 'device_traces': [trace],\n"
    "        'allocator_settings': {'PYTORCH_CUDA_ALLOC_CONF': ''}, 'external_annotations': []}\n"
    "with open(sys.argv[1], 'wb') as f:\n"
    "    pickle.dump(snap, f)\n";

static const char *load_py =
    "import pickle, resource, sys, time\n"
    "best = 1e9\n"
    "for _ in range(3):\n"
    "    t0 = time.perf_counter()\n"
    "    with open(sys.argv[1], 'rb') as f:\n"
    "        s = pickle.load(f)\n"
    "    best = min(best, time.perf_counter() - t0)\n"
    "    del s\n"
    "print(best, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, sys.version.split()[0])\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int run_py(const char *python, const char *code, const char *a1, const char *a2, char *out,
                  size_t outlen)
{
    char script[] = "/tmp/mt-bench-snapshot-XXXXXX";
    int fd = mkstemp(script); /* private: mode 0600, a name nobody else can take */
    if (fd < 0)
        return -1;
    FILE *f = fdopen(fd, "w");
    fputs(code, f);
    fclose(f);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' '%s'", python, script, a1, a2 ? a2 : "");
    FILE *p = popen(cmd, "r");
    int rc = -1;
    if (p != NULL) {
        size_t n = fread(out, 1, outlen - 1, p);
        out[n] = '\0';
        rc = pclose(p);
    }
    unlink(script);
    return rc;
}

int main(int argc, char **argv)
{
    int mb = argc > 1 ? atoi(argv[1]) : 100;
    const char *python = getenv("MEMTRACE_BENCH_PYTHON");
    if (python == NULL)
        python = "python3";
    mt_bench_print_machine(stdout);
    char dir[] = "/tmp/mt-bench-snapshot-dir-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    char path[256], out[512], mbs[16];
    snprintf(path, sizeof path, "%s/snapshot.pickle", dir);
    snprintf(mbs, sizeof mbs, "%d", mb);
    double t0 = now_s();
    if (run_py(python, gen_py, path, mbs, out, sizeof out) != 0) {
        fprintf(stderr, "bench_snapshot: %s could not write the snapshot: %s\n", python, out);
        rmdir(dir);
        return 1;
    }
    struct stat st;
    stat(path, &st);
    printf("snapshot: %.1f MB written by %s pickle.dump in %.1f s\n", (double)st.st_size / 1e6,
           python, now_s() - t0);

    double best = 1e9, best_pk = 1e9;
    size_t events = 0, memory = 0;
    for (int round = 0; round < 3; round++) {
        char err[768];
        double a = now_s();
        mt_pk_doc_t *doc = NULL;
        if (mt__pk_parse_file(&doc, path, NULL, err, sizeof err) != 0) {
            fprintf(stderr, "bench_snapshot: %s\n", err);
            return 1;
        }
        double b = now_s();
        memory = mt__pk_memory(doc);
        mt_ts_t *ts = NULL;
        if (mt__ts_from_pickle(&ts, doc, path, err, sizeof err) != 0) {
            fprintf(stderr, "bench_snapshot: %s\n", err);
            return 1;
        }
        double c = now_s();
        events = ts->nevents;
        mt__ts_destroy(&ts);
        best = c - a < best ? c - a : best;
        best_pk = b - a < best_pk ? b - a : best_pk;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (run_py(python, load_py, path, NULL, out, sizeof out) != 0) {
        fprintf(stderr, "bench_snapshot: pickle.load failed: %s\n", out);
        return 1;
    }
    double py = 0;
    long py_rss = 0;
    char ver[32] = "";
    sscanf(out, "%lf %ld %31s", &py, &py_rss, ver);
    unlink(path);
    rmdir(dir);
    printf("\n%-44s %10s %14s\n", "reading the snapshot (best of 3)", "seconds", "peak RSS");
    printf("%-44s %10.3f %11.0f MB\n", "memtrace: unpickle + snapshot model", best,
           (double)ru.ru_maxrss / 1024);
    printf("%-44s %10.3f %14s\n", "  of which the restricted unpickler", best_pk, "");
    printf("%-44s %10.3f %11.0f MB\n", "python pickle.load (anchor)", py, (double)py_rss / 1024);
    printf("\n%zu trace entries, document %.0f MB; ratio memtrace / pickle.load = %.2f "
           "(goal <= 2.00; python %s)\n",
           events, (double)memory / 1e6, best / py, ver);
    return best / py <= 2.0 ? 0 : 1;
}
