#!/usr/bin/env python3
"""memtrace view --get: the answer the server gives, without serving.

  test_view_get.py MEMTRACE LOG SNAPSHOT

LOG is prof_samples' log (its first process is pid 100); SNAPSHOT a PyTorch snapshot with
Python frames (tests/snapshot/data/v2_torch_frames.pickle, one process, pid 1). Checks that
--get answers in order and fails with a clear message and status; that each answer is
byte for byte what `memtrace view --port 0` serves for the same path (a snapshot's: its
times are its own, not this machine's clock at load); and that a snapshot's /callsites
names its stacks by their frames, as /block and the report do, not "unknown stack N".
"""
import json
import re
import subprocess
import sys
import time
import urllib.request

MT, LOG, SNAP = sys.argv[1:4]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def view(*args):
    return subprocess.run([MT, "view", *args], capture_output=True, text=True, timeout=120)


# Answers in order, one a line; the page's file too.
r = view("--get", "/healthz", "--get", "/map?pid=100", LOG)
lines = r.stdout.splitlines()
if r.returncode != 0 or len(lines) != 2 or lines[0] != "ok":
    fail(f"two answers: status {r.returncode}, stdout {r.stdout[:300]!r}, stderr {r.stderr!r}")
if json.loads(lines[1]).get("pid") != 100:
    fail("/map?pid=100: " + lines[1][:300])
r = view("--get", "/", LOG)
if r.returncode != 0 or "<html" not in r.stdout:
    fail(f"/: status {r.returncode}, {r.stdout[:200]!r}")

# A program's own log carries its clocks (its hello): its times are those, not this
# machine's clock at load (prof_samples' pid 100 "started" at 1700000000 s, monotonic 5 ns).
hello, newest = None, None
for line in open(LOG):
    j = json.loads(line)
    if j.get("pid") == 100 and j.get("type") == "hello":
        hello = j
    if j.get("pid") == 100 and j.get("type") == "event" and (newest is None or j["seq"] > newest["seq"]):
        newest = j
want = (newest["t_ns"] + hello["start_realtime_ns"] - hello["start_mono_ns"]) / 1e9
r = view("--get", "/tail?pid=100&n=1", LOG)
got = json.loads(r.stdout)["events"][0]["t"]
if abs(got - want) > 2e-6:
    fail(f"pid 100's newest event at {got:.6f} s, not at {want:.6f} (its hello's clocks)")

# Failures: the status the server would give, named; a path that is no target; bad usage.
for target, want, say in [
    ("/nosuch", 1, "HTTP 404: not found"),
    ("/map", 1, "HTTP 400: pid=N is required"),
    ("/map?pid=abc", 1, "HTTP 400: pid: not a valid number"),
    ("/map?pid=999999", 1, "HTTP 404"),
    ("/events", 1, "the event stream is memtrace tail's"),
    ("/map?pid=1 2", 1, "not a target to answer once"),
    ("state", 2, "not a path such as /state"),
]:
    r = view("--get", target, LOG)
    if r.returncode != want or say not in r.stderr or (want == 1 and target not in r.stderr):
        fail(f"--get {target!r}: status {r.returncode} (want {want}), stderr {r.stderr!r}")
# A failed answer stops the rest: nothing after it is printed.
r = view("--get", "/nosuch", "--get", "/healthz", LOG)
if r.returncode != 1 or r.stdout != "":
    fail(f"after a failure: status {r.returncode}, stdout {r.stdout!r}")

# A snapshot's call sites, named by their frames.
r = view("--get", "/callsites?pid=1", SNAP)
if r.returncode != 0:
    fail("snapshot /callsites: " + r.stderr)
cs = json.loads(r.stdout)["callsites"]
if not cs or any(c.get("unknown") or c["site"].startswith("unknown") for c in cs):
    fail("snapshot /callsites has unnamed stacks: " + r.stdout[:400])
top = cs[0]
if top["site"] != "transformer.py:54 forward" or top["frames"][1]["label"] != "train.py:30 train_step":
    fail("snapshot /callsites' largest: " + json.dumps(top))
if sum(c["bytes"] for c in cs) != 132 << 20:  # live at the end, as `memtrace report` says
    fail("snapshot /callsites' bytes: " + json.dumps(cs))

# The same answers as served.
paths = ["/state?pid=1", "/map?pid=1", "/callsites?pid=1", "/tail?pid=1&n=5", "/gap?pid=1",
         "/sites?pid=1", "/analysis?pid=1", "/history?pid=1&buckets=7", "/metrics"]
srv = subprocess.Popen([MT, "view", "--port", "0", SNAP], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
try:
    url = None
    deadline = time.time() + 30
    while url is None and time.time() < deadline:
        line = srv.stderr.readline()
        if not line:
            break
        m = re.search(r"(http://\S+?)/#token=(\S+)|(http://\S+?)/(\s|$)", line)
        if m:
            url, tok = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), None)
    if url is None:
        fail("memtrace view did not say where it serves")
    for p in paths:
        req = urllib.request.Request(url + p)
        if tok:
            req.add_header("Authorization", "Bearer " + tok)
        served = urllib.request.urlopen(req, timeout=30).read().decode()
        if not served.endswith("\n"):
            served += "\n"  # --get ends each answer with one
        mine = view("--get", p, SNAP)
        if mine.returncode != 0:
            fail(f"--get {p}: {mine.stderr}")
        if p == "/state?pid=1" or p == "/metrics":
            # the daemon's own pid, start and uptime differ: the processes' part must not
            key = "processes" if p.startswith("/state") else None
            if key:
                served, got = json.loads(served)[key], json.loads(mine.stdout)[key]
            else:
                strip = lambda s: [l for l in s.splitlines() if "memtrace_daemon" not in l]
                served, got = strip(served), strip(mine.stdout)
        else:
            got = mine.stdout
        if served != got:
            fail(f"{p}: --get answers\n{str(got)[:600]}\nbut the server\n{str(served)[:600]}")
finally:
    srv.terminate()
    srv.wait(timeout=30)
print(f"ok: --get answers {len(paths)} paths as served; failures named; a snapshot's call sites "
      f"named by frames ({top['site']} <- {top['frames'][1]['label']})")
