#!/usr/bin/env python3
"""`memtrace report`'s temporary allocations (docs/analysis.md, "Temporary allocations").

A log written here, with stacks and known lifetimes per site, gives exact counts, bytes and
(lower) medians, by site, with --temporary-window, and by tag; a shipped PyTorch snapshot
gives a non-empty section named by its frames. The JSON keeps to the schema when ajv is
installed (npm ci --prefix tests/prof).

usage: test_temporary.py MEMTRACE SNAPSHOT_DATA_DIR SOURCE_ROOT
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

MT, DATA, ROOT = sys.argv[1], sys.argv[2], sys.argv[3]
PID = 4242
MiB = 1 << 20


def frames(*fs):
    return [{"py": f, "file": path, "line": line} for f, path, line in fs]


STACKS = {
    # two stacks of one user frame: forward (model.py:12), their rows add up
    1: frames(("_conv_forward", "/usr/lib/python3/dist-packages/torch/nn/modules/conv.py", 456),
              ("forward", "/home/me/proj/model.py", 12), ("main", "/home/me/proj/train.py", 40)),
    2: frames(("_call_impl", "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", 1527),
              ("forward", "/home/me/proj/model.py", 12), ("main", "/home/me/proj/train.py", 40)),
    3: frames(("loss", "/home/me/proj/model.py", 30), ("main", "/home/me/proj/train.py", 41)),
}

# (stack or 0, tag, size, lifetime in us or None for never freed)
ALLOCS = [
    (1, "activations", 1 * MiB, 5), (1, "activations", 1 * MiB, 7), (1, "activations", 1 * MiB, 100),
    (2, "activations", 2 * MiB, 3), (2, "activations", 2 * MiB, 40),
    (1, "activations", 4 * MiB, 5000),   # lives past the window
    (1, "activations", 4 * MiB, None),   # never freed
    (3, "workspace", 512 << 10, 1000),   # exactly the window: temporary
    (3, "workspace", 512 << 10, 20), (3, "workspace", 512 << 10, 30),
    (3, "workspace", 512 << 10, 1001),   # just past it
    (0, "other", 8 << 10, 2),            # no stack recorded
]


def write_log(path):
    """Allocations one after another, 10 ms apart, each freed after its lifetime."""
    evs = []  # (t_ns, order, record)
    base = 0x7F0000000000
    for i, (stack, tag, size, life) in enumerate(ALLOCS):
        t = 1_000_000 + i * 10_000_000
        addr = base + i * 16 * MiB
        a = {"kind": "alloc", "addr": hex(addr), "size": size, "requested": size, "tag": tag}
        if stack:  # the log's form: a stack_ref right before its alloc
            evs.append((t, -1, {"kind": "stack_ref", "addr": hex(addr), "stack": stack, "tag": tag}))
            a["stack"] = stack
        evs.append((t, 0, a))
        if life is not None:
            tf = t + life * 1000
            evs.append((tf, 1, {"kind": "free_requested", "addr": hex(addr), "size": size, "tag": tag}))
            evs.append((tf + 500, 2, {"kind": "free_completed", "addr": hex(addr), "size": size, "tag": tag}))
    evs.sort(key=lambda e: (e[0], e[1]))
    tags = ["other", "weights", "grads", "optimizer", "activations", "workspace"]
    with open(path, "w") as f:
        f.write(json.dumps({"v": 1, "type": "hello", "pid": PID, "name": "train",
                            "start_realtime_ns": 1748329299514852000, "start_mono_ns": 1000}) + "\n")
        for sid, fr in STACKS.items():
            f.write(json.dumps({"v": 1, "kind": "stack", "pid": PID, "id": sid, "frames": fr}) + "\n")
        f.write(json.dumps({"v": 1, "type": "event", "seq": 0, "t_ns": 500_000, "pid": PID, "dev": 0,
                            "kind": "segment_alloc", "addr": hex(base), "size": 256 * MiB, "requested": 0,
                            "pool": "large", "tag": "other", "tag_id": 0, "stream": 0, "allocated": 0,
                            "reserved": 256 * MiB}) + "\n")
        allocated = 0
        for seq, (t, _, e) in enumerate(evs, start=1):
            if e["kind"] == "alloc":
                allocated += e["size"]
            elif e["kind"] == "free_requested":
                allocated -= e["size"]
            rec = {"v": 1, "type": "event", "seq": seq, "t_ns": t, "pid": PID, "dev": 0,
                   "pool": "large", "tag_id": tags.index(e["tag"]), "stream": 0, "requested": 0,
                   "allocated": allocated, "reserved": 256 * MiB}
            rec.update(e)
            f.write(json.dumps(rec) + "\n")


def report(*args):
    out = subprocess.run([MT, "report", *args], check=True, capture_output=True, text=True)
    return out.stdout


def rows(doc):
    (p,) = doc["processes"]
    return [(r["site"], r["count"], r["bytes"], r["median_lifetime_us"]) for r in p["temporary"]]


fails = 0


def expect(what, got, want):
    global fails
    if got != want:
        print("FAIL: %s:\n  got  %s\n  want %s" % (what, got, want))
        fails += 1
    else:
        print("ok: %s" % what)


tmp = tempfile.mkdtemp()
try:
    log = os.path.join(tmp, "temp.ndjson")
    write_log(log)
    docs = []

    doc = json.loads(report("--json", "--by", "site", log))
    docs.append(doc)
    expect("default window 1 ms, by site", rows(doc), [
        ("forward (model.py:12)", 5, 7 * MiB, 7),
        ("loss (model.py:30)", 3, 3 * (512 << 10), 30),
        ("no stack recorded", 1, 8 << 10, 2),
    ])
    expect("window and grouping named", (doc["processes"][0]["temporary_window_us"],
                                         doc["processes"][0]["temporary_by"]), (1000, "site"))

    doc = json.loads(report("--json", "--by", "site", "--temporary-window", "50us", log))
    docs.append(doc)
    # forward: {3, 5, 7, 40}: the lower median is the 2nd, 5
    expect("--temporary-window 50us", rows(doc), [
        ("forward (model.py:12)", 4, 6 * MiB, 5),
        ("loss (model.py:30)", 2, 2 * (512 << 10), 20),
        ("no stack recorded", 1, 8 << 10, 2),
    ])

    doc = json.loads(report("--json", "--temporary-window", "10ms", log))
    docs.append(doc)
    # 5000 us is in (a 4 MiB block); 1001 too; bucket of 5000 us is [4992, 5120)
    # tagged input without --by: by tag, as the report's other sections
    expect("--temporary-window 10ms, tagged input without --by", rows(doc), [
        ("activations", 6, 11 * MiB, 7),
        ("workspace", 4, 4 * (512 << 10), 30),
        ("other", 1, 8 << 10, 2),
    ])
    expect("tagged input without --by: by tag", doc["processes"][0]["temporary_by"], "tag")

    doc = json.loads(report("--json", "--by", "tag", log))
    docs.append(doc)
    expect("--by tag", rows(doc), [
        ("activations", 5, 7 * MiB, 7),
        ("workspace", 3, 3 * (512 << 10), 30),
        ("other", 1, 8 << 10, 2),
    ])
    expect("--by tag named", doc["processes"][0]["temporary_by"], "tag")

    doc = json.loads(report("--json", "--temporary-window", "0", log))
    docs.append(doc)
    expect("--temporary-window 0: none", rows(doc), [])

    text = report("--by", "site", log)
    expect("text section", [l for l in text.splitlines() if "temporary" in l or "model.py:12)" in l
                            and "us" in l], [
        "  temporary allocations (freed within 1.0 ms of their allocation), by call site:",
        "           5    7.0 MiB         7 us  forward (model.py:12)",
    ])
    bad = subprocess.run([MT, "report", "--temporary-window", "5min", log], capture_output=True)
    expect("--temporary-window 5min refused", bad.returncode, 2)

    # A PyTorch snapshot: its trace's alloc/free_requested with time_us and frames.
    snap = os.path.join(DATA, "v2_all_actions_p4.pickle")
    doc = json.loads(report("--json", snap))
    docs.append(doc)
    expect("snapshot: temporary by its frames", rows(doc), [
        ("model.py:41 forward", 3, 11 * MiB + 512 * 1024, 8),
        ("model.py:77 loss", 1, 1024, 2),
    ])
    text = report(snap)
    expect("snapshot: text section", "    3   11.5 MiB         8 us  model.py:41 forward" in text, True)

    node = shutil.which("node")
    if node:
        nd = os.path.join(tmp, "docs.ndjson")
        with open(nd, "w") as f:
            for d in docs:
                f.write(json.dumps(d) + "\n")
        st = subprocess.run([node, os.path.join(ROOT, "tests", "prof", "validate.mjs"),
                             os.path.join(ROOT, "docs", "telemetry.schema.json"), nd]).returncode
        if st == 77:
            print("skip: schema check (npm ci --prefix tests/prof)")
        else:
            expect("reports keep to the schema", st, 0)
finally:
    shutil.rmtree(tmp)
sys.exit(1 if fails else 0)
