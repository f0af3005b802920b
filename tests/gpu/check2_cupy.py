"""Check 2, CuPy (finding N1): CuPy loads libcudart from an extension module, in a local
scope. The sum must be right and memtrace must see the allocations."""
import sys

try:
    import cupy as cp
except Exception as e:
    print(f"skip: CuPy cannot be imported ({type(e).__name__})")
    sys.exit(77)
n = 1 << 20
v = int(cp.arange(n).sum())
print("sum", v)
sys.exit(0 if v == n * (n - 1) // 2 else 1)
