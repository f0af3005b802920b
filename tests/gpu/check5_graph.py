"""Check 5 (finding N6): torch.cuda.graph with the allocator serving torch. A block freed
inside the capture must not be handed to eager code (the replay would overwrite it), and
a capture that allocates a size never seen before must work."""
import os
import sys

import torch

if not torch.cuda.is_available():
    print("skip: PyTorch has no CUDA device")
    sys.exit(77)
if os.environ.get("GPU_CHECK_MEMTRACE"):
    import memtrace

    memtrace.enable_for_torch()
a = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        tmp = a * 2
        out = tmp + 1
        del tmp
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    tmp = a * 2
    out = tmp + 1
    del tmp
e = torch.full_like(a, 7.0)
for _ in range(3):
    g.replay()
torch.cuda.synchronize()
ok1 = bool((e == 7).all()) and torch.equal(out, a * 2 + 1)
print("eager block after capture:", "intact" if ok1 else "overwritten by the replay")
g2 = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g2):
        big = torch.empty((3 << 20) + 12345, device="cuda")
        big.fill_(3.0)
    g2.replay()
    torch.cuda.synchronize()
    ok2 = bool((big == 3).all())
    print("capture of a new size:", "ok" if ok2 else "wrong values")
except Exception as ex:
    ok2 = False
    print("capture of a new size:", str(ex).splitlines()[0])
sys.exit(0 if ok1 and ok2 else 1)
