#!/usr/bin/env python3
"""Large PyTorch snapshots: wall time and peak RSS of memtrace report, report --json, diff
and view (until /state answers) on one generated snapshot of ~10^6 trace entries and ~1 GB,
beside PyTorch's own torch.cuda._memory_viz and a plain pickle.load on the same file, in
one run (docs/benchmarks.md, "Large PyTorch snapshots").

  bench/bench_snapshot_large.py MEMTRACE [--dir DIR] [--entries N] [--keep]

The snapshots (two seeds, for diff) are written by bench/gen_snapshot.py into DIR (default
a temporary directory, removed unless --keep; existing files of the right name are reused).
Every command runs as a child of this script; its peak RSS is the child's ru_maxrss
(os.wait4), its time the wall clock around it. Exits 1 when a memtrace command's peak RSS
passes 2x its input (the sum of both files for diff).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from machine_py import cpu_model  # this directory

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_PY = "/usr/bin/python3"  # Debian's python3-torch (1.13); a python3 on PATH may lack it


def run(argv, stdout=subprocess.DEVNULL):
    """(seconds, peak RSS bytes, exit status) of argv run to its end."""
    t = time.monotonic()
    p = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.monotonic() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace")
    if p.returncode != 0:
        print(f"  ! {' '.join(argv[:3])}... exit {p.returncode}: {err.strip()[:300]}",
              file=sys.stderr)
    return dt, ru.ru_maxrss * 1024, p.returncode


def run_view(memtrace, path):
    """memtrace view: seconds until /state answers, its peak RSS then, /state's bytes."""
    t = time.monotonic()
    p = subprocess.Popen([memtrace, "view", "--port", "0", path], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    url = None
    for line in p.stderr:
        m = re.search(rb"open (http://127\.0\.0\.1:\d+/)(?:#token=(\S+))?", line)
        if m:
            url = m.group(1).decode()
            tok = m.group(2).decode() if m.group(2) else ""
            break
    if url is None:
        p.wait()
        return None
    size = 0
    while True:
        try:
            req = urllib.request.Request(url + "state")
            if tok:
                req.add_header("Authorization", "Bearer " + tok)
            with urllib.request.urlopen(req, timeout=600) as r:
                size = len(r.read())
            break
        except OSError:
            if p.poll() is not None:
                return None
            time.sleep(0.05)
    dt = time.monotonic() - t
    # The page's own data routes: their size and time (the page never asks for the trace).
    routes = []
    for path in ("history?pid=1&buckets=600", "map?pid=1", "sites?pid=1", "gap?pid=1"):
        t1 = time.monotonic()
        try:
            req = urllib.request.Request(url + path)
            if tok:
                req.add_header("Authorization", "Bearer " + tok)
            with urllib.request.urlopen(req, timeout=600) as r:
                n = len(r.read())
            routes.append(f"/{path.split('?')[0]} {n / 1e3:.0f} kB in {time.monotonic() - t1:.2f} s")
        except OSError as e:
            routes.append(f"/{path.split('?')[0]} failed: {e}")
    page = None
    node = shutil.which("node")
    if node:
        r = subprocess.run([node, os.path.join(HERE, "view_page.mjs"),
                            url + (f"#token={tok}" if tok else ""), "1"],
                           capture_output=True, text=True)
        page = (r.stdout.strip() or r.stderr.strip())[-400:]
    with open(f"/proc/{p.pid}/status") as f:
        hwm = [l for l in f if l.startswith("VmHWM")]
    p.send_signal(signal.SIGINT)
    _, status, ru = os.wait4(p.pid, 0)
    return dt, ru.ru_maxrss * 1024, size, routes, page, hwm


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("memtrace")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--entries", type=int, default=1_075_000)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    memtrace = os.path.abspath(a.memtrace)
    d = a.dir or tempfile.mkdtemp(prefix="mt-bigsnap-")
    os.makedirs(d, exist_ok=True)
    files = []
    for seed in (1, 2):
        f = os.path.join(d, f"snap-{a.entries}-s{seed}.pickle")
        if not os.path.exists(f):
            t = time.monotonic()
            subprocess.run([sys.executable, os.path.join(HERE, "gen_snapshot.py"), f,
                            "--entries", str(a.entries), "--seed", str(seed)], check=True)
            print(f"generated {f} in {time.monotonic() - t:.0f} s", file=sys.stderr)
        files.append(f)
    A, B = files
    size_a, size_b = os.path.getsize(A), os.path.getsize(B)
    print(f"host: {cpu_model()}, {os.cpu_count()} threads, "
          f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"file A: {size_a / 1e6:.0f} MB, {a.entries} trace entries, 2 devices "
          f"(gen_snapshot.py --seed 1); file B: {size_b / 1e6:.0f} MB (--seed 2)")

    rows = []
    fail = False

    def row(name, dt, rss, base, bound=None):
        nonlocal fail
        ratio = rss / base
        flag = ""
        if bound is not None and ratio > bound:
            flag = "  > 2x"
            fail = True
        rows.append((name, dt, rss, ratio, flag))

    floor = (f"import pickle,sys; pickle.load(open(sys.argv[1],'rb'))")
    dt, rss, _ = run([TORCH_PY, "-c", floor, A])
    row("python3 pickle.load (the floor)", dt, rss, size_a)
    viz = ("import pickle,sys; import torch.cuda._memory_viz as m\n"
           "s = pickle.load(open(sys.argv[1],'rb'))\n"
           "segs = s['segments'] if isinstance(s, dict) else s\n"
           "m.stats(segs); m.memory(segs, format_flamegraph=lambda t: t)\n"
           "m.segments(segs, format_flamegraph=lambda t: t)\n")
    dt, rss, rc = run([TORCH_PY, "-c", viz, A])
    row("torch.cuda._memory_viz 1.13 stats+memory+segments" + (" (failed)" if rc else ""),
        dt, rss, size_a)
    dt, rss, _ = run([memtrace, "report", A])
    row("memtrace report", dt, rss, size_a, 2.0)
    dt, rss, _ = run([memtrace, "report", "--json", A])
    row("memtrace report --json", dt, rss, size_a, 2.0)
    dt, rss, _ = run([memtrace, "diff", A, B])
    row("memtrace diff A B (RSS / (A+B))", dt, rss, size_a + size_b, 2.0)
    v = run_view(memtrace, A)
    if v is None:
        print("memtrace view did not serve", file=sys.stderr)
        fail = True
    else:
        row(f"memtrace view until /state answers ({v[2] / 1e6:.1f} MB)", v[0], v[1], size_a, 2.0)
        print("view's data routes: " + "; ".join(v[3]))
        print(f"view page in headless chromium: {v[4]}")

    w = max(len(r[0]) for r in rows)
    print(f"\n{'command':<{w}}  {'wall s':>7}  {'peak RSS':>9}  {'RSS/file':>8}")
    for name, dt, rss, ratio, flag in rows:
        print(f"{name:<{w}}  {dt:7.1f}  {rss / 2**20:7.0f} MiB  {ratio:8.2f}{flag}")
    if not a.keep and a.dir is None:
        shutil.rmtree(d, ignore_errors=True)
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
