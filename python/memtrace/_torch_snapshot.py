"""memtrace.snapshot(path, format="torch"): PyTorch's CUDA memory snapshot (the pickle
pytorch.org/memory_viz loads), written by memtrace's own converter, `memtrace export`.

The segment map of the call is turned into the events that build it (a segment_alloc per
segment, an alloc per live block, plus free_requested for blocks awaiting their streams)
and exported; the pickle therefore holds the state at the call, each block's tag as a
'tag <name>' frame, and no earlier history (export the run's log for that).
"""
import json
import os
import subprocess
import tempfile

from . import _lib
from ._errors import MemtraceError


def _events(recs, tag_id):
    """Telemetry lines (docs/telemetry.md) that rebuild the snapshot records' state."""
    seq, t = 0, 1
    labels = {}
    out = []
    for r in recs:
        pid, dev = r["pid"], r["dev"]
        allocated = reserved = 0

        def ev(kind, addr, size, requested, pool, tag, stream):
            nonlocal seq, t
            seq += 1
            t += 1000
            tid = tag_id(tag)
            if tid >= 7 and (pid, tid) not in labels:
                labels[(pid, tid)] = tag
                out.append({"v": 1, "type": "event", "seq": seq, "t_ns": t, "pid": pid,
                            "dev": dev, "kind": "tag_label", "tag_id": tid, "label": tag})
                seq += 1
            out.append({"v": 1, "type": "event", "seq": seq, "t_ns": t, "pid": pid,
                        "dev": dev, "kind": kind, "addr": addr, "size": size,
                        "requested": requested, "pool": pool, "tag": tag, "tag_id": tid,
                        "stream": stream, "allocated": allocated, "reserved": reserved})

        for seg in r["segments"]:
            reserved += seg["size"]
            ev("segment_alloc", seg["addr"], seg["size"], 0, seg["pool"], "other",
               seg["stream"])
            for b in seg["blocks"]:
                if b["state"] == "inactive":
                    continue
                allocated += b["size"]
                ev("alloc", b["addr"], b["size"], b["requested"], seg["pool"], b["tag"],
                   seg["stream"])
                if b["state"] != "allocated":
                    ev("free_requested", b["addr"], b["size"], b["requested"], seg["pool"],
                       b["tag"], seg["stream"])
    return out


def write(recs, path, tag_id):
    exe = _lib.memtrace_cli()
    if exe is None:
        raise MemtraceError("memtrace.snapshot(format='torch'): the memtrace command was not "
                            "found (set MEMTRACE_EXE to build/tools/memtrace)")
    if not any(r["segments"] for r in recs):
        raise MemtraceError("memtrace.snapshot(format='torch'): no memory is reserved yet, "
                            "so there is nothing to write")
    fd, tmp = tempfile.mkstemp(prefix="memtrace-snapshot-", suffix=".ndjson")
    try:
        with os.fdopen(fd, "w") as f:
            for e in _events(recs, tag_id):
                f.write(json.dumps(e, separators=(",", ":")) + "\n")
        p = subprocess.run([exe, "export", "--format", "torch-snapshot", tmp, "-o", path],
                           capture_output=True, text=True)
    finally:
        os.unlink(tmp)
    if p.returncode != 0:
        raise MemtraceError("memtrace.snapshot(format='torch'): `memtrace export` failed: %s"
                            % (p.stderr.strip() or "exit status %d" % p.returncode))
    return path
