#!/usr/bin/env python3
"""Writes a memtrace log (NDJSON, schema v1) whose scopes, temporary allocations and settings
changes are known, for the page's analysis panels (tests/web/analysis.mjs):

- scope "forward" twice: 6 MiB above its start at its peak the first time, 2 MiB the
  second (highest 6 MiB, mean 4 MiB); scope "backward" once, 1 MiB, nested in the second
  "forward";
- temporary allocations (freed within 1 ms): 3 at model.py:12 forward (1 MiB each, lifetimes
  5, 7 and 100 us: median 7 us) and 2 at model.py:30 loss (512 KiB each, 20 and 40 us:
  median 20 us); one block at model.py:12 lives 5 ms (not temporary);
- settings changed at run time: max_split_size_mb 128 MiB -> 64 MiB, then
  garbage_collection_threshold 0 -> 800000 ppm.

usage: make_analysis_log.py OUT [PID]
"""
import json
import sys

MiB = 1 << 20
BASE = 0x7F0000000000
STACKS = {
    1: [("forward", "/home/me/proj/model.py", 12), ("main", "/home/me/proj/train.py", 40)],
    2: [("loss", "/home/me/proj/model.py", 30), ("main", "/home/me/proj/train.py", 41)],
}


class Log:
    def __init__(self, pid):
        self.pid, self.seq, self.t = pid, 0, 1_000_000
        self.allocated, self.reserved = 0, 0
        self.lines = []

    def rec(self, kind, **kw):
        e = {"v": 1, "type": "event", "seq": self.seq, "t_ns": self.t, "pid": self.pid,
             "dev": 0, "kind": kind}
        e.update(kw)
        self.seq += 1
        self.lines.append(json.dumps(e, separators=(",", ":")))

    def full(self, kind, addr, size, requested=None, stack=0):
        if kind == "alloc":
            self.allocated += size
        elif kind == "free_requested":
            self.allocated -= size
        elif kind == "segment_alloc":
            self.reserved += size
        if stack:
            self.rec("stack_ref", addr="0x%x" % addr, pool="large", stack=stack)
        e = dict(addr="0x%x" % addr, size=size, requested=size if requested is None else requested,
                 pool="large", tag="other", tag_id=0, stream=0, allocated=self.allocated,
                 reserved=self.reserved)
        if stack and kind == "alloc":
            e["stack"] = stack
        self.rec(kind, **e)

    def mark(self, name):
        self.rec("mark_named", name=name, allocated=self.allocated, reserved=self.reserved)

    def setting(self, key_id, value, before):
        self.rec("setting", addr="0x%x" % key_id, size=value, requested=before, pool="none",
                 tag="other", tag_id=0, stream=0, allocated=self.allocated, reserved=self.reserved)

    def at(self, us):
        """Moves the clock to us microseconds after the start."""
        self.t = 1_000_000 + us * 1000


def main():
    out, pid = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4343
    g = Log(pid)
    g.full("segment_alloc", BASE, 256 * MiB)
    addr = [BASE]

    def block(size, stack, life_us, start_us):
        a = addr[0]
        addr[0] += 16 * MiB
        g.at(start_us)
        g.full("alloc", a, size, stack=stack)
        if life_us is not None:
            g.at(start_us + life_us)
            g.full("free_requested", a, size)
            g.t += 500
            g.full("free_completed", a, size)
        return a

    g.at(1000)
    g.full("alloc", BASE + 200 * MiB, 8 * MiB)  # held throughout: scopes start above 0
    g.at(10_000)
    g.setting(1, 64 * MiB, 128 * MiB)  # max_split_size_mb
    g.at(20_000)
    g.mark("forward")
    a = block(4 * MiB, 1, None, 21_000)
    b = block(2 * MiB, 1, None, 21_500)  # 6 MiB above the start
    g.at(23_000)
    g.full("free_requested", a, 4 * MiB)
    g.full("free_completed", a, 4 * MiB)
    g.full("free_requested", b, 2 * MiB)
    g.full("free_completed", b, 2 * MiB)
    g.at(24_000)
    g.mark("/forward")
    # temporaries
    block(1 * MiB, 1, 5, 30_000)
    block(1 * MiB, 1, 7, 31_000)
    block(1 * MiB, 1, 100, 32_000)
    block(1 * MiB, 1, 5000, 33_000)  # past the window
    block(512 << 10, 2, 20, 40_000)
    block(512 << 10, 2, 40, 41_000)
    g.at(50_000)
    g.setting(3, 800000, 0)  # garbage_collection_threshold
    g.at(60_000)
    g.mark("forward")
    c = block(1 * MiB, 1, None, 61_000)
    g.at(62_000)
    g.mark("backward")
    d = block(1 * MiB, 2, None, 62_500)  # 2 MiB above forward's start, 1 above backward's
    g.at(64_000)
    g.full("free_requested", d, 1 * MiB)
    g.full("free_completed", d, 1 * MiB)
    g.mark("/backward")
    g.full("free_requested", c, 1 * MiB)
    g.full("free_completed", c, 1 * MiB)
    g.at(70_000)
    g.mark("/forward")
    with open(out, "w") as f:
        f.write(json.dumps({"v": 1, "type": "hello", "pid": pid, "name": "train"}) + "\n")
        for sid, fr in STACKS.items():
            f.write(json.dumps({"v": 1, "kind": "stack", "pid": pid, "id": sid,
                                "frames": [{"py": fn, "file": p, "line": ln} for fn, p, ln in fr]}) + "\n")
        f.write("\n".join(g.lines) + "\n")


if __name__ == "__main__":
    main()
