"""Holds tagged device memory until told to stop, for the live views (`memtrace top`).
A forward pass's pattern by module, allocated through libcudart under `memtrace run`.
usage: prog_hold.py LIBCUDART READY_FILE STOP_FILE
"""
import ctypes
import os
import sys
import time

import memtrace

cudart = ctypes.CDLL(sys.argv[1])
cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
held = []


def malloc(n):
    p = ctypes.c_void_p()
    if cudart.cudaMalloc(ctypes.byref(p), n) != 0:
        raise RuntimeError("cudaMalloc failed")
    held.append(p)


memtrace.mark_iteration(0)
with memtrace.tag("encoder.lstm"):
    malloc(6 << 20)
with memtrace.tag("decoder.proj"):
    malloc(2 << 20)
open(sys.argv[2], "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[3]) and time.monotonic() < deadline:
    time.sleep(0.05)
