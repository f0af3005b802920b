#!/usr/bin/env python3
"""Writes a PyTorch 2.x snapshot (standard pickle, no torch) in which every cause of
reserved - allocated has one known size (analysis/gap.h), for test_gap.sh:

    make_gap_snapshot.py OUT.pickle

Stacks have the shape of real ones (PyTorch's unwinder and allocator with '??' files, then
the user's Python frames); two streams; an expandable segment grown by two segment_map and
shrunk by a segment_unmap. Requests are not multiples of 512, so blocks are rounded.
Device 0, at the end (bytes):
  segment A, 20 MiB, stream 0: live 4 MiB - 100 (forward, rounds to 4 MiB) and
      2 MiB + 1000 (scale, rounds to 2 MiB + 1024): pinned_free = 14 MiB - 1024
  segment B, 2 MiB: one block allocated and freed: cached_segments = 2 MiB
  segment C, 2 MiB, stream 7: 1 MiB freed, its stream event pending: stream_pending = 2 MiB
  expandable X, 4 MiB mapped then 2 MiB unmapped, stream 7: live 1 MiB + 3 (rounds to
      1 MiB + 512): expandable_slack = 1 MiB - 512
  reserved 26 MiB, allocated 7 MiB + 1536, rounding 100 + 24 + 509 = 633.
The peak of allocated is right after the last alloc (C's block still live)."""
import pickle
import sys

MiB = 1 << 20
T0 = 1748329299514852
REC = [{"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
       {"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc("
                "signed char, unsigned long, CUstream_st*)",
        "filename": "CUDACachingAllocator.cpp", "line": 0}]


def py(name, file, line):
    return {"name": name, "filename": "/home/me/proj/" + file, "line": line}


FWD = REC + [py("forward", "transformer.py", 54), py("main", "train.py", 30)]
SCALE = REC + [py("scale", "my_utils.py", 7), py("forward", "transformer.py", 60)]
LOSS = REC + [py("loss", "train.py", 41)]
OPT = REC + [py("step", "train.py", 44)]
t = 0


def ev(action, addr, size, stream=0, frames=()):
    global t
    t += 10
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": T0 + t, "frames": list(frames)}


A, B, C, X = 0x7F4000000000, 0x7F4002000000, 0x7F4004000000, 0x7F5000000000
trace = [
    ev("segment_alloc", A, 20 * MiB, 0, FWD),
    ev("alloc", A, 4 * MiB - 100, 0, FWD),
    ev("alloc", A + 4 * MiB, 2 * MiB + 1000, 0, SCALE),
    ev("segment_alloc", B, 2 * MiB, 0, LOSS),
    ev("alloc", B, 1000, 0, LOSS),
    ev("free_requested", B, 1000, 0, LOSS),
    ev("free_completed", B, 1000, 0, LOSS),
    ev("segment_map", X, 2 * MiB, 7, OPT),
    ev("segment_map", X + 2 * MiB, 2 * MiB, 7, OPT),
    ev("alloc", X, 1 * MiB + 3, 7, OPT),
    ev("segment_alloc", C, 2 * MiB, 7, LOSS),
    ev("alloc", C, 1 * MiB, 7, LOSS),
    ev("free_requested", C, 1 * MiB, 7, LOSS),  # its stream's event never completes
    ev("segment_unmap", X + 2 * MiB, 2 * MiB, 7),
]
with open(sys.argv[1], "wb") as out:
    pickle.dump({"segments": [], "device_traces": [trace]}, out, protocol=4)
