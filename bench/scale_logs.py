#!/usr/bin/env python3
"""Writes an NDJSON event log (docs/telemetry.md) of one shape at size N, deterministic, for
the scaling sweeps of docs/readers.md: a reader whose time grows faster than N shows as a
time that more than doubles when N doubles.

  scale_logs.py --shape SHAPE --n N [-o PATH]      (stdout without -o, or with -o -)

Shapes (the totals every event carries are the true ones, so nothing is pruned by them):
  gaps    N steps of: map a 2 MiB segment, allocate 1 MiB in it, then lose an event (a gap
          record and a jump in seq, or with --gap seq the jump alone): N gaps over N live
          blocks and N segments.
  segs    N segments of 2 MiB mapped one by one, each then allocated (1 MiB).
  live    N live blocks of 32 KiB, 64 to a 2 MiB segment, none freed.
  pids    N processes of ~52 events each (a hello, 2 segments, 21 blocks allocated, 14 of them freed,
          an iteration mark), in turn.
  ranks   as pids, each process a rank of one job of N ranks (hello's rank, world_size, job).
  stacks  N distinct call stacks (a stack table line each), each named by one allocation
          (a stack_ref then the alloc), half of them freed.
  prune   N blocks (sizes 4 KiB .. N * 4 KiB) whose frees are lost in one gap, beside N blocks
          of 4 KiB freed one by one after it: each free lowers the room the totals leave for
          the uncertain blocks, and proves one more of the lost ones gone.
  segprune  N segments (sizes 2 MiB .. N * 2 MiB) whose frees are lost in one gap, beside N
          segments of 2 MiB freed one by one after it: each free lowers the room the reserved
          total leaves for the uncertain segments, and proves one more of the lost ones gone.
  sites   N functions of two stacks each, one allocation a stack, none freed; grouped by
          function (report --by function) the sums rise with the function's number while
          the larger stack's bytes fall, so the merged rows come out in reverse order.
  pins    N segments of 2 MiB, each pinned by one live 64 KiB block of its own stack; the
          stacks come in pairs that differ only below the user's frame, so the gap's pins
          (one row a stack) join into N / 2 rows of one site each.
"""
import argparse
import functools
import sys

MIB = 1 << 20
KIB = 1 << 10
SEG_BASE = 0x7F0000000000


class Log:
    """Events of one process: seq and t_ns advance by one per event, totals kept."""

    def __init__(self, out, pid):
        self.out, self.pid = out, pid
        self.seq = 0
        self.t = 1000
        self.allocated = 0
        self.reserved = 0

    def hello(self, name, extra=""):
        self.out.write('{"v":1,"type":"hello","pid":%d,"name":"%s","start_realtime_ns":0,'
                       '"start_mono_ns":0%s}\n' % (self.pid, name, extra))

    def event(self, kind, addr, size, requested=0, pool="large", tag="other", tag_id=0,
              stack=None):
        self.out.write('{"v":1,"type":"event","seq":%d,"t_ns":%d,"pid":%d,"dev":0,"kind":"%s",'
                       '"addr":"0x%x","size":%d,"requested":%d,"pool":"%s","tag":"%s",'
                       '"tag_id":%d,"stream":0,"allocated":%d,"reserved":%d%s}\n' %
                       (self.seq, self.t, self.pid, kind, addr, size, requested, pool, tag,
                        tag_id, self.allocated, self.reserved,
                        "" if stack is None else ',"stack":%d' % stack))
        self.seq += 1
        self.t += 1000

    def mark(self, iteration):
        self.out.write('{"v":1,"type":"event","seq":%d,"t_ns":%d,"pid":%d,"dev":0,"kind":"mark",'
                       '"mark":"iteration","size":%d,"requested":0,"pool":"none","tag":"other",'
                       '"tag_id":0,"stream":0,"allocated":%d,"reserved":%d}\n' %
                       (self.seq, self.t, self.pid, iteration, self.allocated, self.reserved))
        self.seq += 1
        self.t += 1000

    def stack(self, sid, frames):
        """A stack table line: id sid, frames innermost first, each ("ip", address) or
        (python function, file, line)."""
        fs = ",".join('{"ip":"0x%x"}' % f[1] if f[0] == "ip" else
                      '{"py":"%s","file":"%s","line":%d}' % f for f in frames)
        self.out.write('{"v":1,"kind":"stack","pid":%d,"id":%d,"frames":[%s]}\n' %
                       (self.pid, sid, fs))

    def stack_ref(self, addr, stack):
        """The call stack of the allocation that follows at addr."""
        self.out.write('{"v":1,"type":"event","seq":%d,"t_ns":%d,"pid":%d,"dev":0,'
                       '"kind":"stack_ref","addr":"0x%x","pool":"large","stack":%d}\n' %
                       (self.seq, self.t, self.pid, addr, stack))
        self.seq += 1
        self.t += 1000

    def seg_map(self, addr, size, kind="segment_map"):
        self.reserved += size
        self.event(kind, addr, size, size)

    def seg_unmap(self, addr, size, kind="segment_unmap"):
        self.reserved -= size
        self.event(kind, addr, size, size)

    def alloc(self, addr, size, tag="activations", tag_id=4, stack=None):
        self.allocated += size
        self.event("alloc", addr, size, size, tag=tag, tag_id=tag_id, stack=stack)

    def free(self, addr, size, tag="activations", tag_id=4):
        self.allocated -= size
        self.event("free_requested", addr, size, size, tag=tag, tag_id=tag_id)
        self.event("free_completed", addr, size, 0, tag=tag, tag_id=tag_id)

    def gap(self, lost, record):
        """The next event's seq jumps over the lost ones (what the report's model reads);
        a ring also writes a gap record naming the first missing seq."""
        if record:
            self.out.write('{"v":1,"type":"gap","seq":%d,"t_ns":%d,"pid":%d,"lost":%d}\n' %
                           (self.seq, self.t, self.pid, lost))
        self.seq += lost

    def exit(self):
        self.out.write('{"v":1,"type":"exit","pid":%d,"t_ns":%d,"clean":true,"emitted":%d,'
                       '"dropped":0,"lost":0}\n' % (self.pid, self.t, self.seq))


def gaps(out, n, record):
    g = Log(out, 100)
    g.hello("gaps")
    for i in range(n):
        seg = SEG_BASE + i * 2 * MIB
        g.seg_map(seg, 2 * MIB)
        g.alloc(seg, MIB)
        g.gap(1, record)
    g.exit()


def segs(out, n):
    g = Log(out, 100)
    g.hello("segs")
    for i in range(n):
        seg = SEG_BASE + i * 2 * MIB
        g.seg_map(seg, 2 * MIB)
        g.alloc(seg, MIB)
    g.exit()


def live(out, n):
    g = Log(out, 100)
    g.hello("live")
    for i in range(n):
        seg = SEG_BASE + (i // 64) * 2 * MIB
        if i % 64 == 0:
            g.seg_map(seg, 2 * MIB)
        g.alloc(seg + (i % 64) * 32 * KIB, 32 * KIB)
    g.exit()


def processes(out, n, ranks):
    """One process after the other, each ~52 events."""
    for p in range(n):
        g = Log(out, 1000 + p)
        extra = ',"rank":%d,"local_rank":%d,"world_size":%d,"job":"scale"' % (p, p % 8, n) \
            if ranks else ""
        g.hello("rank%d" % p if ranks else "proc%d" % p, extra)
        for s in range(2):
            g.seg_map(SEG_BASE + s * 2 * MIB, 2 * MIB)
        g.mark(1)
        for b in range(21):  # blocks of 64 KiB, one more per rank every 8 ranks
            addr = SEG_BASE + (b % 2) * 2 * MIB + (b // 2) * 64 * KIB
            g.alloc(addr, 64 * KIB + (p % 8) * KIB)
        for b in range(21):
            if b % 3 != 0:  # a third stays live
                addr = SEG_BASE + (b % 2) * 2 * MIB + (b // 2) * 64 * KIB
                g.free(addr, 64 * KIB + (p % 8) * KIB)
        g.exit()


def stacks(out, n):
    g = Log(out, 100)
    g.hello("stacks")
    for i in range(n):
        g.stack(i + 1, [("ip", 0x555555550000 + 16 * i), ("ip", 0x555555560000 + 16 * (i % 97)),
                        ("Model.layer%d" % (i % 31), "/src/model.py", 10 + i % 500)])
    for i in range(n):
        seg = SEG_BASE + (i // 32) * 2 * MIB
        if i % 32 == 0:
            g.seg_map(seg, 2 * MIB)
        addr = seg + (i % 32) * 64 * KIB
        g.stack_ref(addr, i + 1)
        g.alloc(addr, 64 * KIB, stack=i + 1)
        if i % 2 == 1:
            g.free(addr, 64 * KIB)
    g.exit()


def prune(out, n, segments):
    """N blocks (segprune: plain segments, which never join) whose frees are lost in one gap,
    then N others of one unit freed one at a time."""
    g = Log(out, 100)
    g.hello("segprune" if segments else "prune")
    if segments:
        unit = 2 * MIB
        add = functools.partial(g.seg_map, kind="segment_alloc")
        free = functools.partial(g.seg_unmap, kind="segment_free")
    else:
        unit, add, free = 4 * KIB, g.alloc, g.free
        g.seg_map(SEG_BASE, 1 << 44)
    addr, gone, kept = SEG_BASE, [], []
    for i in range(1, n + 1):
        add(addr, i * unit)
        gone.append((addr, i * unit))
        addr += i * unit
    for i in range(n):
        add(addr, unit)
        kept.append(addr)
        addr += unit
    for _, size in gone:  # their frees are lost: the totals drop
        if segments:
            g.reserved -= size
        else:
            g.allocated -= size
    g.gap(len(gone), True)
    for a in kept:
        free(a, unit)
    g.exit()


def sites(out, n):
    g = Log(out, 100)
    g.hello("sites")
    for i in range(n):
        for j in (1, 2):
            g.stack(2 * i + j, [("f%d" % i, "/src/m.py", j)])
    addr = SEG_BASE
    g.seg_map(SEG_BASE, 1 << 40)
    for i in range(n):
        for j, size in ((1, (3 * n - i) * 512), (2, (2 * i + 1) * 512)):
            g.stack_ref(addr, 2 * i + j)
            g.alloc(addr, size, stack=2 * i + j)
            addr += size
    g.exit()


def pins(out, n):
    g = Log(out, 100)
    g.hello("pins")
    for i in range(n):
        g.stack(i + 1, [("ip", 0x555555550000 + 16 * i),
                        ("layer%d" % (i // 2), "/src/model.py", 10 + i // 2)])
    for i in range(n):
        seg = SEG_BASE + i * 2 * MIB
        g.seg_map(seg, 2 * MIB, kind="segment_alloc")
        g.stack_ref(seg, i + 1)
        g.alloc(seg, 64 * KIB, stack=i + 1)
    g.exit()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", required=True,
                    choices=["gaps", "segs", "live", "ranks", "pids", "stacks", "sites", "prune",
                             "pins", "segprune"])
    ap.add_argument("--n", type=int, required=True, help="the size (see the shapes above)")
    ap.add_argument("--gap", choices=["record", "seq"], default="record",
                    help="gaps shape: a gap record and a jump in seq (default), or the jump alone")
    ap.add_argument("-o", "--output", default="-", help="the log's path (- : stdout)")
    a = ap.parse_args()
    if a.n < 0:
        ap.error("--n must be >= 0")
    out = sys.stdout if a.output == "-" else open(a.output, "w")
    try:
        if a.shape == "gaps":
            gaps(out, a.n, a.gap == "record")
        elif a.shape == "segs":
            segs(out, a.n)
        elif a.shape == "live":
            live(out, a.n)
        elif a.shape in ("pids", "ranks"):
            processes(out, a.n, a.shape == "ranks")
        elif a.shape in ("prune", "segprune"):
            prune(out, a.n, a.shape == "segprune")
        elif a.shape == "sites":
            sites(out, a.n)
        elif a.shape == "pins":
            pins(out, a.n)
        else:
            stacks(out, a.n)
    finally:
        if out is not sys.stdout:
            out.close()


if __name__ == "__main__":
    main()
