"""Check 4 (finding N5): an allocation larger than the device must raise
torch.OutOfMemoryError, not hand torch a NULL pointer."""
import os
import sys

import torch

if not torch.cuda.is_available():
    print("skip: PyTorch has no CUDA device")
    sys.exit(77)
if os.environ.get("GPU_CHECK_MEMTRACE"):
    import memtrace

    memtrace.enable_for_torch()
try:
    t = torch.empty(200 << 30, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError:
    print("torch.OutOfMemoryError")
    sys.exit(0)
print("no error; data_ptr", "NULL" if t.data_ptr() == 0 else "non-NULL")
try:
    t.fill_(1)
    torch.cuda.synchronize()
    print("fill_: ok")
except Exception as e:
    print("fill_:", str(e).splitlines()[0])
sys.exit(1)
