"""Check 3 (finding N3): record_stream on the default stream must keep a freed block from
being reused by its allocating stream until the default stream's work is done. With
GPU_CHECK_MEMTRACE=1 the pluggable allocator (memtrace.enable_for_torch) serves torch."""
import os
import sys

import torch

if not torch.cuda.is_available():
    print("skip: PyTorch has no CUDA device")
    sys.exit(77)
if os.environ.get("GPU_CHECK_MEMTRACE"):
    import memtrace

    memtrace.enable_for_torch()
N = 64 << 20


def reused(consumer_is_default):
    s = torch.cuda.Stream()
    consumer = torch.cuda.current_stream() if consumer_is_default else torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.empty(N, dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(consumer):
        torch.cuda._sleep(2_000_000_000)
        y = x.float().sum()
        x.record_stream(consumer)
    p = x.data_ptr()
    del x
    with torch.cuda.stream(s):
        z = torch.empty(N, dtype=torch.uint8, device="cuda")
    same = z.data_ptr() == p
    torch.cuda.synchronize()
    del y, z
    return same


a = reused(True)
b = reused(False)
print("default-stream consumer: block", "reused too early" if a else "kept")
print("side-stream consumer: block", "reused too early" if b else "kept")
sys.exit(1 if a or b else 0)
