#!/usr/bin/env python3
"""Checks that a file has the layout of a PyTorch CUDA memory snapshot, written from
docs/torch-snapshot.md alone (standard library only; never imports torch).

    check_snapshot.py FILE [--era 1|2] [--complete] [--viz]

Era 2 (PyTorch 2.x) is a dict of segments, device_traces, allocator_settings and
external_annotations; era 1 (1.13) is the list of segments with history on blocks (2.x's
torch.cuda.memory_snapshot() still gives a list, with 2.x's segments and blocks). Fields
that PyTorch added over 2.x (time_us, allocator_settings, external_annotations, the
segments' requested_size, segment_pool_id, is_expandable) are checked when present, and
required with --complete, as a current release writes them (what memtrace's export is held
to). Prints one line per problem and exits 1 if there is any, else prints a summary and
exits 0.
The file is read with a restricted unpickler that refuses every global, like memtrace's.
"""
import argparse
import io
import pickle
import sys

ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot",
           "annotate"}  # annotate: newer releases (metadata on a live allocation)
STATES = {"active_allocated", "active_pending_free", "active_awaiting_free", "inactive"}


class NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("global %s.%s refused" % (module, name))


class Checker:
    def __init__(self, complete=False):
        self.problems = []
        self.complete = complete  # the fields a current release writes are required

    def bad(self, where, what):
        self.problems.append("%s: %s" % (where, what))

    def field(self, d, key, types, where, required=True):
        if key not in d:
            if required:
                self.bad(where, "'%s' missing" % key)
            return None
        v = d[key]
        if not isinstance(v, types) or (types is int and isinstance(v, bool)):
            self.bad(where, "'%s' is %r, not %s" % (key, type(v).__name__, types))
            return None
        return v

    def frames(self, d, where, required=True):
        fl = self.field(d, "frames", list, where, required)
        for i, f in enumerate(fl or []):
            w = "%s.frames[%d]" % (where, i)
            if not isinstance(f, dict):
                self.bad(w, "not a dict")
                continue
            self.field(f, "name", str, w)
            self.field(f, "filename", str, w)
            self.field(f, "line", int, w)

    def segment(self, s, where, era):
        if not isinstance(s, dict):
            return self.bad(where, "not a dict")
        for k in ("device", "address", "total_size", "allocated_size", "active_size", "stream"):
            self.field(s, k, int, where)
        st = self.field(s, "segment_type", str, where)
        if st is not None and st not in ("large", "small"):
            self.bad(where, "segment_type %r" % st)
        # a 2.x segment (in the dict, or in 2.x's list: it has 2.x's fields)
        two = era == 2 or "requested_size" in s or "is_expandable" in s
        if two:
            self.field(s, "requested_size", int, where, self.complete)
            pool = self.field(s, "segment_pool_id", tuple, where, self.complete)
            if pool is not None and (len(pool) != 2 or not all(isinstance(x, int) for x in pool)):
                self.bad(where, "segment_pool_id is not a pair of ints")
            self.field(s, "is_expandable", bool, where, self.complete)
            self.frames(s, where, self.complete)
        blocks = self.field(s, "blocks", list, where) or []
        total = 0
        addr = s.get("address")
        for j, b in enumerate(blocks):
            w = "%s.blocks[%d]" % (where, j)
            if not isinstance(b, dict):
                self.bad(w, "not a dict")
                continue
            size = self.field(b, "size", int, w) or 0
            state = self.field(b, "state", str, w)
            if state is not None and state not in STATES:
                self.bad(w, "state %r" % state)
            # 2.x's blocks have an address and frames, 1.13's and 2.0's a history (or, when
            # inactive, nothing more)
            if "address" in b or "frames" in b or (self.complete and era == 2):
                self.field(b, "requested_size", int, w)
                a = self.field(b, "address", int, w)
                if a is not None and addr is not None and a != addr:
                    self.bad(w, "address 0x%x, the previous block ends at 0x%x" % (a, addr))
                self.frames(b, w)
            else:  # 1.13's, and PyTorch 2.0's in its dict
                if "address" in b:
                    self.bad(w, "blocks with a history have no address")
                for k, h in enumerate(self.field(b, "history", list, w, required=False) or []):
                    hw = "%s.history[%d]" % (w, k)
                    self.field(h, "addr", int, hw)
                    self.field(h, "real_size", int, hw)
                    self.frames(h, hw)
            total += size
            if addr is not None:
                addr += size
        if isinstance(s.get("total_size"), int) and blocks and total != s["total_size"]:
            self.bad(where, "blocks sum to %d, total_size is %d" % (total, s["total_size"]))

    def trace(self, e, where):
        if not isinstance(e, dict):
            return self.bad(where, "not a dict")
        action = self.field(e, "action", str, where)
        if action is not None and action not in ACTIONS:
            self.bad(where, "action %r" % action)
        if action == "oom":
            self.field(e, "device_free", int, where)
        elif action != "snapshot":
            self.field(e, "addr", int, where)
        for k in ("size", "stream"):
            self.field(e, k, int, where)
        self.field(e, "time_us", int, where, self.complete)
        self.frames(e, where, required=False)

    def snapshot(self, snap, era):
        if era == 1:
            if not isinstance(snap, list):
                return self.bad("top level", "%s, not the 1.13 list of segments" % type(snap).__name__)
            for i, s in enumerate(snap):
                self.segment(s, "segments[%d]" % i, 1)
            return
        if not isinstance(snap, dict):
            return self.bad("top level", "%s, not the 2.x dict" % type(snap).__name__)
        for i, s in enumerate(self.field(snap, "segments", list, "top level") or []):
            self.segment(s, "segments[%d]" % i, 2)
        for d, tl in enumerate(self.field(snap, "device_traces", list, "top level") or []):
            if not isinstance(tl, list):
                self.bad("device_traces[%d]" % d, "not a list")
                continue
            for i, e in enumerate(tl):
                self.trace(e, "device_traces[%d][%d]" % (d, i))
        settings = self.field(snap, "allocator_settings", dict, "top level", self.complete)
        if settings is not None:
            self.field(settings, "PYTORCH_CUDA_ALLOC_CONF", str, "allocator_settings")
        for i, a in enumerate(self.field(snap, "external_annotations", list, "top level",
                                         self.complete) or []):
            w = "external_annotations[%d]" % i
            st = self.field(a, "stage", str, w)
            if st is not None and st not in ("START", "END"):
                self.bad(w, "stage %r" % st)
            self.field(a, "name", str, w)
            self.field(a, "device", int, w)
            self.field(a, "time_us", int, w)


def viz_walk(snap, c):
    """The state view of PyTorch's memory_viz (docs/torch-snapshot.md, "What memory_viz
    needs of a trace") walks each device's trace backward from the segments and blocks at
    the end. Every state on the way must be one it can draw: a free undone names a block
    inside a segment, a free_requested undone names a live block, a segment_alloc undone
    names a segment, a segment_map undone lies inside one, and neither leaves a live block
    outside every segment."""
    ndev = len(snap["device_traces"])
    for d in range(ndev):
        segs = sorted([g["address"], g["address"] + g["total_size"], g["stream"]]
                      for g in snap["segments"] if g["device"] == d)
        for x, y in zip(segs, segs[1:]):
            if y[0] < x[1]:
                c.bad("segments", "device %d: 0x%x overlaps 0x%x" % (d, y[0], x[0]))
        blocks = {}
        for g in snap["segments"]:
            if g["device"] != d:
                continue
            a = g["address"]
            for b in g["blocks"]:  # (2.0's blocks tile the segment without an address)
                if b["state"] in ("active_allocated", "active_pending_free"):
                    blocks[b.get("address", a)] = b["state"] == "active_pending_free"
                a += b["size"]

        def holding(a):
            for g in segs:
                if g[0] <= a < g[1]:
                    return g
            return None

        def live_in(a, e):
            return any(a <= x < e for x in blocks)

        tr = snap["device_traces"][d]
        i = len(tr) - 1
        while i >= 0:
            e, w = tr[i], "device_traces[%d][%d]" % (d, i)
            act, a, n = e["action"], e.get("addr"), e.get("size", 0)
            merged = (act == "free_completed" and i > 0 and tr[i - 1]["action"] == "free_requested"
                      and tr[i - 1].get("addr") == a)
            if act == "free_completed":
                if holding(a) is None:
                    c.bad(w, "a free of 0x%x outside every segment when undone" % a)
                blocks[a] = not merged
                i -= 2 if merged else 1
                continue
            if act == "free_requested":
                if a not in blocks:
                    c.bad(w, "free_requested of 0x%x, no live block when undone" % a)
                else:
                    blocks[a] = False
            elif act == "alloc":
                blocks.pop(a, None)
            elif act in ("segment_free", "segment_unmap"):
                if any(g[0] < a + n and a < g[1] for g in segs):
                    c.bad(w, "%s of 0x%x undone over a segment still there" % (act, a))
                segs.append([a, a + n, e["stream"]])
                segs.sort()
                if act == "segment_unmap":  # joined with its neighbours on the same stream
                    k = segs.index([a, a + n, e["stream"]])
                    if k + 1 < len(segs) and segs[k + 1][0] == a + n and segs[k + 1][2] == e["stream"]:
                        segs[k][1] = segs.pop(k + 1)[1]
                    if k > 0 and segs[k - 1][1] == a and segs[k - 1][2] == e["stream"]:
                        segs[k - 1][1] = segs.pop(k)[1]
            elif act == "segment_alloc":
                k = next((k for k, g in enumerate(segs) if g[0] == a), None)
                if k is None:
                    c.bad(w, "segment_alloc of 0x%x, no such segment when undone" % a)
                else:
                    if live_in(segs[k][0], segs[k][1]):
                        c.bad(w, "segment_alloc of 0x%x undone with live blocks in it" % a)
                    segs.pop(k)
            elif act == "segment_map":
                g = next((g for g in segs if g[0] <= a and a + n <= g[1]), None)
                if g is None:
                    c.bad(w, "segment_map of 0x%x, in no segment when undone" % a)
                else:
                    if live_in(a, a + n):
                        c.bad(w, "segment_map of 0x%x undone with live blocks in it" % a)
                    if g[0] == a:
                        g[0] += n
                    elif g[1] == a + n:
                        g[1] -= n
                    else:
                        segs.append([a + n, g[1], g[2]])
                        g[1] = a
                        segs.sort()
                    segs[:] = [g for g in segs if g[1] > g[0]]
            i -= 1
            if len(c.problems) >= 20:
                return


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--era", type=int, choices=(1, 2), help="expected layout (default: either)")
    ap.add_argument("--complete", action="store_true",
                    help="require every field a current PyTorch 2.x writes")
    ap.add_argument("--viz", action="store_true",
                    help="also walk each trace backward as memory_viz's state view does")
    args = ap.parse_args()
    with open(args.file, "rb") as f:
        snap = NoGlobals(io.BytesIO(f.read())).load()
    era = args.era or (1 if isinstance(snap, list) else 2)
    c = Checker(args.complete)
    c.snapshot(snap, era)
    if args.viz and era == 2 and not c.problems:
        viz_walk(snap, c)
    for p in c.problems:
        print("%s: %s" % (args.file, p))
    if c.problems:
        return 1
    segs = snap if era == 1 else snap["segments"]
    events = 0 if era == 1 else sum(len(t) for t in snap["device_traces"])
    two = any("requested_size" in g or "is_expandable" in g for g in segs)
    print("%s: a PyTorch %s snapshot: %d segments, %d trace entries" %
          (args.file, "2.x" if era == 2 else "2.x list" if two else "1.13", len(segs), events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
