"""Check 1, Python (finding N2): the first CUDA op of a fresh thread is a jiterator kernel
(torch.special.airy_ai), which calls the driver right after cudaFree(0)."""
import sys
import threading

import torch

if not torch.cuda.is_available():
    print("skip: PyTorch has no CUDA device")
    sys.exit(77)
t = torch.linspace(-2, 2, 4096, device="cuda")
torch.cuda.synchronize()
res = {}


def worker():
    try:
        y = torch.special.airy_ai(t)
        torch.cuda.synchronize()
        res["ok"] = bool(torch.isfinite(y).all())
    except Exception as e:  # the error text is the finding
        res["err"] = str(e).splitlines()[0]


th = threading.Thread(target=worker)
th.start()
th.join()
print("thread airy_ai:", "ok" if res.get("ok") else res.get("err", "non-finite values"))
sys.exit(0 if res.get("ok") else 1)
