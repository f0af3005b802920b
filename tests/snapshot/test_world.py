#!/usr/bin/env python3
"""Snapshots recorded by other people on real GPUs (data/world/README.md), read by memtrace and
checked against what Python computes from the same pickle, without memtrace's code:

- per device: allocated and reserved bytes at the end, the peak of allocated bytes;
- the report's live bytes at that peak by site: their total, and for each site with a
  Python frame the bytes of the live blocks whose stacks hold that frame, at the same moment
  (a block the trace frees without having allocated it: by the stack of its free);
- `view --get /state` and `/callsites`, and `plot --flamegraph`: every stack named from the
  file's own frames (never "unknown stack N"), the same site for the same stack.
- 2.x's torch.cuda.memory_snapshot() (the dict's segments, a list): its layout and end;
- tests/snapshot/check_snapshot.py (the layout checker the export is held to) takes them all.

The peak is found as memtrace's model counts allocated bytes: a block's bytes are its
request rounded up to 512, or its block's size where it is still allocated at the end, and
they leave at free_requested; what the trace frees without having allocated it was live from
its start. Usage: test_world.py MEMTRACE DATA_DIR
"""
import json
import lzma
import os
import pickle
import re
import subprocess
import sys
import tempfile

MEMTRACE, DATA = sys.argv[1], sys.argv[2]
CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_snapshot.py")
failed = []


def check(ok, what):
    if not ok:
        failed.append(what)
        print("FAIL:", what)


def run(*args):
    p = subprocess.run([MEMTRACE, *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"memtrace {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def r512(n):
    return 512 if n <= 512 else (n + 511) // 512 * 512


def at_peak(d, dev):
    """(peak allocated, end allocated, end reserved, live blocks at the peak as
    (requested, frames)) of device dev."""
    segs = [s for s in (d["segments"] if isinstance(d, dict) else d) if s["device"] == dev]
    end = {}
    for s in segs:
        a = s["address"]
        for b in s["blocks"]:
            if b["state"] != "inactive":
                # PyTorch 2.0 gives no address, but a history of the block's allocations
                hist = b.get("history") or [{}]
                end[b.get("address", a)] = dict(b, frames=b.get("frames", hist[-1].get("frames", [])))
            a += b["size"]
    end_alloc = sum(b["size"] for s in segs for b in s["blocks"] if b["state"] != "inactive")
    end_reserved = sum(s["total_size"] for s in segs)
    tr = d["device_traces"][dev] if isinstance(d, dict) and dev < len(d.get("device_traces", [])) else []
    last = {}  # the trace's allocs still allocated at the end: address -> index
    made = set()
    for i, e in enumerate(tr):
        if e["action"] == "alloc":
            last[e["addr"]] = i
            made.add(e["addr"])
        elif e["action"] == "free_requested":
            last.pop(e["addr"], None)
    at_end = set(last.values())
    cur, size, delta = {}, {}, []
    for i, e in enumerate(tr):
        a, x = e["action"], 0
        if a == "alloc":
            size[e["addr"]] = end[e["addr"]]["size"] if i in at_end else r512(e["size"])
            cur[e["addr"]] = e
            x = size[e["addr"]]
        elif a == "free_requested":
            x = -(size.pop(e["addr"]) if e["addr"] in cur else r512(e["size"]))
            cur.pop(e["addr"], None)
        delta.append(x)
    alloc = end_alloc - sum(delta)  # at the trace's start
    peak, at = alloc, -1
    for i, x in enumerate(delta):
        alloc += x
        if alloc > peak:
            peak, at = alloc, i
    # live then, as (requested, frames, frames are a free's): the survivors the trace never
    # allocated, its orphans not yet freed (known by the stack of their free, when PyTorch
    # took one there), and its own allocs not yet freed
    live = [(b.get("requested_size", b["size"]), b.get("frames", []), False)
            for a, b in end.items() if a not in made]
    nostack = sum(q for (q, fr, _), b in zip(live, (b for a, b in end.items() if a not in made))
                  if not fr and b["state"] == "active_allocated")
    seen, cur = set(), {}
    for i, e in enumerate(tr):
        if e["action"] == "alloc":
            seen.add(e["addr"])
        elif e["action"] == "free_requested" and e["addr"] not in seen and e["addr"] > 1:
            seen.add(e["addr"])
            if i > at:
                fr = e.get("frames", [])
                live.append((e["size"], fr, any("CachingAllocator::free(" in f["name"]
                                                for f in fr)))
    for e in tr[: at + 1]:
        if e["action"] == "alloc":
            cur[e["addr"]] = e
        elif e["action"] == "free_requested":
            cur.pop(e["addr"], None)
    live += [(e["size"], e.get("frames", []), False) for e in cur.values()]
    return peak, end_alloc, end_reserved, live, nostack


FREED = "before the trace, freed at "
BEFORE = "before the trace, no stack recorded"
SITE = re.compile(r"^(?:%s)?(.+\.py):(\d+) (.+)$" % FREED)


def holds(frames, freed, site):
    """A live block's frames hold the site's frame, a free's only for a site so named."""
    m = SITE.match(site)
    return freed == site.startswith(FREED) and any(
        re.split(r"[\\/]", f["filename"])[-1] == m[1] and f["line"] == int(m[2]) and
        f["name"] == m[3] for f in frames)


files = sorted(f for f in os.listdir(DATA) if f.endswith(".pickle.xz"))
check(len(files) >= 5, f"data/world holds {len(files)} snapshots")
for name in files:
    path = os.path.join(DATA, name)
    with lzma.open(path) as f:
        d = pickle.load(f)
    rep = json.loads(run("report", "--json", "--top", "1000", path))
    proc = rep["processes"][0]
    devs = {x["device"]: x for x in proc["devices"]}
    sites = {x["device"]: x for x in rep["snapshots"][0]["devices"]}
    framed, before = False, len(failed)
    for dev in sorted(devs):
        peak, end_alloc, end_reserved, live, nostack = at_peak(d, dev)
        has_trace = isinstance(d, dict) and any(d.get("device_traces", []))
        m = devs[dev]
        check((m["peak_allocated"], m["final_allocated"], m["final_reserved"]) ==
              (peak, end_alloc, end_reserved),
              f"{name} device {dev}: memtrace peak/end allocated, end reserved "
              f"{m['peak_allocated']}/{m['final_allocated']}, {m['final_reserved']}; "
              f"Python {peak}/{end_alloc}, {end_reserved}")
        s = sites[dev]
        want = sum(q for q, _, _ in live)
        check(s["peak_allocated_bytes"] == want,
              f"{name} device {dev}: live requested bytes at the peak {s['peak_allocated_bytes']}, "
              f"Python {want}")
        # Each site's bytes are at most those of the stacks holding its frame (a frame outer
        # to another stack's user frame counts there too); for the three largest sites and
        # the blocks named by their free, exactly those (true of all 16 files read so far).
        named = [g for g in s["call_sites_at_peak"] if SITE.match(g["site"])]
        if any(freed and any(f["filename"].endswith(".py") for f in fr) for _, fr, freed in live):
            check(any(g["site"].startswith(FREED) for g in named),
                  f"{name} device {dev}: blocks known by their free, but no site says so")
        # Blocks live throughout the trace that it never allocated, the file giving no frames
        # for them (history recorded after the model was built): named as made before it.
        ghost = [g for g in s["call_sites_at_peak"] if g["site"] == BEFORE]
        check(bool(ghost) == (nostack > 0 and has_trace) and
              (not ghost or ghost[0]["bytes"] == nostack),
              f"{name} device {dev}: '{BEFORE}' holds {ghost[0]['bytes'] if ghost else 0} bytes "
              f"at the peak, Python {nostack} in blocks from before the trace without frames")
        for k, g in enumerate(named):
            framed |= g["bytes"] * 100 >= s["peak_allocated_bytes"]  # (a box the graph draws)
            mine = sum(q for q, fr, freed in live if holds(fr, freed, g["site"]))
            exact = k < 3 or g["site"].startswith(FREED)
            check(g["bytes"] <= mine and (g["stacks"] > 1 or not exact or g["bytes"] == mine),
                  f"{name} device {dev}: '{g['site']}' holds {g['bytes']} bytes at the peak, "
                  f"Python {mine} in stacks with that frame")
    # /block of a block live at the end: one the trace made has its time, one from before
    # the trace began has none (not the trace's start)
    tr = d.get("device_traces", [[]])[0] if isinstance(d, dict) else []
    made = {e["addr"] for e in tr if e["action"] == "alloc"}
    ends = [b["address"] for s in d["segments"] if s["device"] == 0 for b in s["blocks"]
            if b["state"] == "active_allocated" and "address" in b]
    old = [a for a in ends if a not in made][:1]
    new = [a for a in ends if a in made][:1]
    if made and old + new:
        gets = sum((["--get", f"/block?pid=1&addr={hex(a)}"] for a in old + new), [])
        got = [json.loads(x) for x in run("view", *gets, path).split("\n") if x]
        for a, g in zip(old + new, got):
            before = a in old
            check(g.get("before_trace", False) == before and
                  (g.get("allocated_t") is None) == before and "size" in g,
                  f"{name}: /block {hex(a)} ({'before' if before else 'in'} the trace): {g}")
    # the layout checker (written from docs/torch-snapshot.md) takes what PyTorch wrote
    with tempfile.TemporaryDirectory() as tmp:
        plain = os.path.join(tmp, "s.pickle")
        with open(plain, "wb") as f:
            f.write(lzma.open(path).read())
        p = subprocess.run([sys.executable, CHECKER, "--viz", plain], capture_output=True,
                           text=True)
        check(p.returncode == 0, f"{name}: check_snapshot.py --viz: {p.stdout.strip()[-300:]}")
    # the page's data and the flame graph name every stack from the file's frames
    state = json.loads(run("view", "--get", "/state", path))
    cs = state["processes"][0].get("callsites", [])
    named = json.loads(run("view", "--get", "/callsites?pid=1", path))["callsites"]
    check(all(not c["site"].startswith("unknown stack") for c in cs + named),
          f"{name}: /state or /callsites has 'unknown stack': {[c['site'] for c in cs + named][:5]}")
    by_stack = {c["stack"]: c["site"] for c in named}
    check(all(by_stack.get(c["stack"], c["site"]) == c["site"] for c in cs),
          f"{name}: /state and /callsites name one stack differently")
    with tempfile.TemporaryDirectory() as tmp:
        svg = os.path.join(tmp, "f.svg")
        run("plot", "--flamegraph", "-o", svg, path)
        titles = re.findall(r"<title>([^<]*)</title>", open(svg).read())
    check(titles and not any(t.startswith("unknown stack") for t in titles),
          f"{name}: the flame graph has 'unknown stack': {titles[:5]}")
    if framed:
        check(any(SITE.match(re.sub(r" \([^)]*\)$", "", t)) for t in titles),
              f"{name}: no frame of the file in the flame graph: {titles[:5]}")
    if len(failed) == before:
        print(f"ok: {name}: {len(devs)} device(s), {len(cs)} sites in /state, "
              f"{len(titles)} flame boxes")

# torch.cuda.memory_snapshot() of 2.x is the dict's "segments" alone: a list, as 1.13's was
with lzma.open(os.path.join(DATA, "bcrafton.pickle.xz")) as f:
    segs = pickle.load(f)["segments"]
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "list.pickle")
    with open(path, "wb") as f:
        pickle.dump(segs, f)
    rep = json.loads(run("report", "--json", path))
    _, end_alloc, end_reserved, _, _ = at_peak(segs, 0)
    m = rep["processes"][0]["devices"][0]
    check(rep["snapshots"][0]["layout"] == "2.x list" and
          (m["final_allocated"], m["final_reserved"]) == (end_alloc, end_reserved),
          f"2.x's list of segments: layout {rep['snapshots'][0]['layout']}, end "
          f"{m['final_allocated']}, {m['final_reserved']}; Python {end_alloc}, {end_reserved}")
    text = run("report", path)
    check("PyTorch 2.x list layout" in text, "the report's text names the list's layout")
    p = subprocess.run([sys.executable, CHECKER, path], capture_output=True, text=True)
    check(p.returncode == 0 and "2.x list" in p.stdout, f"check_snapshot.py on the list: {p.stdout}")

if failed:
    sys.exit(f"{len(failed)} check(s) failed")
