"""Check 2, ctypes (finding N1): libcudart opened by ctypes (RTLD_LOCAL), torch not
imported. A copy with an invalid kind must answer 21 (cudaErrorInvalidMemcpyDirection)
and cudaGetLastError must report it."""
import ctypes
import sys

rt = ctypes.CDLL(sys.argv[1])
p = ctypes.c_void_p()
m = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20))
c = rt.cudaMemcpy(None, None, ctypes.c_size_t(1), 99)
last = rt.cudaGetLastError()
f = rt.cudaFree(p)
print(f"cudaMalloc={m} cudaMemcpy(kind 99)={c} cudaGetLastError={last} cudaFree={f}")
ok = m == 0 and c == 21 and last == 21 and f == 0
print("ok" if ok else "FAIL")
sys.exit(0 if ok else 1)
