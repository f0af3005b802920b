"""Managed memory through the drop-in, from Python: cudaMallocManaged (libcudart through
ctypes, as cupy calls it), memtrace.prefetch to the device and back, memtrace.advise,
cudaFree. Run under `memtrace run` (sim) by test_python.py. argv: libcudart, out.json."""
import ctypes
import json
import sys

import memtrace
from memtrace import _lib

rt = ctypes.CDLL(sys.argv[1])
rt.cudaMallocManaged.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
rt.cudaFree.argtypes = [ctypes.c_void_p]
rt.cudaDeviceSynchronize.argtypes = []

N = 4 << 20
p = ctypes.c_void_p()
assert rt.cudaMallocManaged(ctypes.byref(p), N, 1) == 0  # cudaMemAttachGlobal
ctypes.memset(p.value, 7, N)  # host-addressable
memtrace.prefetch(p.value, N, 0)
memtrace.prefetch(p.value, N // 2, "cpu", stream=None)
memtrace.advise(p.value, N, "set_read_mostly", "cuda:0")
assert rt.cudaDeviceSynchronize() == 0
refused = ""
try:
    memtrace.prefetch(p.value, 2 * N, 0)  # beyond the block
except memtrace.MemtraceError as e:
    refused = str(e)
s = json.loads(_lib.json_call(_lib.lib().memtrace_stats_json, "stats"))
assert rt.cudaFree(p) == 0
with open(sys.argv[2], "w") as f:
    json.dump({"managed_devices": s["managed_devices"], "refused": refused}, f)
