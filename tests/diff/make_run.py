#!/usr/bin/env python3
"""Writes a memtrace log (NDJSON, schema v1) of a small training loop, as the demo's run would
record it with MEMTRACE_STACKS=all: weights allocated once, activations per iteration whose
size is the batch times the hidden width, a loss, and optionally a cache that keeps one
tensor of every iteration (a site that is new and never freed). test_diff.sh diffs two of
them made with different settings:

    make_run.py OUT --batch 8 [--hidden 1024] [--iterations 4] [--cache]
"""
import argparse
import json

MiB = 1 << 20
BASE = 0x7F0000000000
PY = "/usr/lib/python3/dist-packages/torch/nn/modules/"
STACKS = {
    1: [("_conv_forward", PY + "conv.py", 456), ("forward", PY + "conv.py", 460),
        ("_call_impl", PY + "module.py", 1527), ("forward", "/home/me/demo/model.py", 12),
        ("main", "/home/me/demo/train.py", 40)],
    2: [("__init__", "/home/me/demo/model.py", 5), ("main", "/home/me/demo/train.py", 30)],
    3: [("loss", "/home/me/demo/model.py", 30), ("main", "/home/me/demo/train.py", 41)],
    4: [("remember", "/home/me/demo/cache.py", 9), ("main", "/home/me/demo/train.py", 43)],
}
TAGS = {"weights": 1, "activations": 4, "other": 0}


class Log:
    def __init__(self, pid):
        self.pid, self.seq, self.t = pid, 0, 1000
        self.allocated = self.reserved = 0
        self.lines = []

    def put(self, kind, addr, size, tag="other", stack=0, requested=None):
        if kind == "alloc":
            self.allocated += size
        elif kind == "free_requested":
            self.allocated -= size
        elif kind == "segment_alloc":
            self.reserved += size
        elif kind == "segment_free":
            self.reserved -= size
        if stack:
            self.event("stack_ref", addr, None, stack=stack)
        self.event(kind, addr, size, tag=tag, stack=stack,
                   requested=size if requested is None else requested)

    def event(self, kind, addr, size, tag="other", stack=0, requested=0):
        e = {"v": 1, "type": "event", "seq": self.seq, "t_ns": self.t, "pid": self.pid,
             "dev": 0, "kind": kind, "addr": "0x%x" % addr, "pool": "large"}
        if kind == "stack_ref":
            e["stack"] = stack
        else:
            e.update({"size": size, "requested": requested, "tag": tag, "tag_id": TAGS[tag],
                      "stream": 0, "allocated": self.allocated, "reserved": self.reserved})
            if stack:
                e["stack"] = stack
        self.seq += 1
        self.t += 1000
        self.lines.append(json.dumps(e, separators=(",", ":")))

    def mark_iteration(self, n):
        self.lines.append(json.dumps({
            "v": 1, "type": "event", "seq": self.seq, "t_ns": self.t, "pid": self.pid,
            "dev": 0, "kind": "mark", "mark": "iteration", "size": n, "requested": 0,
            "pool": "none", "tag": "other", "tag_id": 0, "stream": 0,
            "allocated": self.allocated, "reserved": self.reserved}, separators=(",", ":")))
        self.seq += 1
        self.t += 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--cache", action="store_true")
    a = ap.parse_args()
    log = Log(4242)
    head = [json.dumps({"v": 1, "type": "hello", "pid": 4242, "name": "demo",
                        "start_realtime_ns": 1748329299514852000, "start_mono_ns": 1000})]
    for sid, frames in STACKS.items():
        head.append(json.dumps({"v": 1, "kind": "stack", "pid": 4242, "id": sid, "frames": [
            {"py": f, "file": fl, "line": ln} for f, fl, ln in frames]}))
    seg = 256 * MiB
    log.put("segment_alloc", BASE, seg)
    log.put("alloc", BASE, 16 * MiB, tag="weights", stack=2)
    act = a.batch * a.hidden * 1024  # bytes of one iteration's activations
    cache_at = BASE + 128 * MiB
    for it in range(a.iterations):
        log.mark_iteration(it)
        log.put("alloc", BASE + 16 * MiB, act, tag="activations", stack=1,
                requested=act - 100)
        log.put("alloc", BASE + 16 * MiB + act, 1 * MiB, stack=3)
        if a.cache:
            log.put("alloc", cache_at + it * MiB, 1 * MiB, stack=4)
        log.put("free_requested", BASE + 16 * MiB + act, 1 * MiB, stack=0)
        log.put("free_completed", BASE + 16 * MiB + act, 1 * MiB, stack=0)
        log.put("free_requested", BASE + 16 * MiB, act, tag="activations")
        log.put("free_completed", BASE + 16 * MiB, act, tag="activations")
    with open(a.out, "w") as f:
        f.write("\n".join(head + log.lines) + "\n")


if __name__ == "__main__":
    main()
