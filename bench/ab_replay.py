#!/usr/bin/env python3
"""A/B of two builds of bench_alloc on the torch traces: memtrace's warm ns/op, alternated.

Each round runs, for each trace, build A then build B as `bench_alloc --replay-child
memtrace PASSES cpu TRACE.csv` (a fresh process: the cold pass, then PASSES - 1 warm ones,
each timed by the thread's CPU clock) and keeps the warm passes; the medians of all rounds
are printed with B/A. Alternating the builds in one run is what makes a few percent
readable on a shared 2-core machine: run it with A = B first to see the noise (a ratio of
1.00 +- 0.015 here).

  ab_replay.py BENCH_ALLOC_A BENCH_ALLOC_B [--rounds N] [--passes P] [TRACE.csv[.xz] ...]

Traces default to data/traces/torch_{lstm,gru,transformer}.csv.xz (decompressed once into a
temporary directory). One thread per process; no BLAS is called.
"""
import argparse
import lzma
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from machine_py import cpu_model  # this directory

HERE = os.path.dirname(os.path.abspath(__file__))


def plain_csv(path, tmp):
    if not path.endswith(".xz"):
        return path
    out = os.path.join(tmp, os.path.basename(path)[:-3])
    with lzma.open(path, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def events(path):
    with open(path) as f:
        return sum(1 for line in f) - 1  # the header


def warm(exe, passes, csv, n):
    r = subprocess.run([exe, "--replay-child", "memtrace", str(passes), "cpu", csv],
                       capture_output=True, text=True)
    out = r.stdout.split()
    if r.returncode != 0 or len(out) < 2 + passes or out[0] != "ok":
        sys.exit(f"ab_replay: {exe} on {csv} failed: {r.stdout.strip()} {r.stderr.strip()}")
    return [int(x) / n for x in out[3:2 + passes]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("traces", nargs="*")
    args = ap.parse_intermixed_args()
    if args.passes < 2 or args.passes > 16:
        sys.exit("ab_replay: --passes must be 2..16 (the cold pass and at least one warm)")
    traces = args.traces or [os.path.join(HERE, "..", "data", "traces", f"torch_{t}.csv.xz")
                             for t in ("lstm", "gru", "transformer")]
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores online, load average "
          f"{os.getloadavg()[0]:.2f}; 1 thread per replay; no BLAS called")
    with tempfile.TemporaryDirectory() as tmp:
        csvs = [plain_csv(t, tmp) for t in traces]
        counts = [events(c) for c in csvs]
        got = {(w, c): [] for w in "ab" for c in csvs}
        for _ in range(args.rounds):
            for c, n in zip(csvs, counts):
                got[("a", c)] += warm(args.a, args.passes, c, n)
                got[("b", c)] += warm(args.b, args.passes, c, n)
        print(f"{'trace':28s} {'A ns/op':>8s} {'B ns/op':>8s} {'B/A':>6s}   "
              f"(medians of {args.rounds} x {args.passes - 1} warm passes)")
        for t, c in zip(traces, csvs):
            a = statistics.median(got[("a", c)])
            b = statistics.median(got[("b", c)])
            print(f"{os.path.basename(t):28s} {a:8.2f} {b:8.2f} {b / a:6.3f}")


if __name__ == "__main__":
    main()
