"""The memtrace Python package's costs (issue 19): a tag enter/exit pair from Python
(goal <= 1 us), and an allocation inside a tag against one outside (goal: no dearer,
within noise). Allocations go through the library's own cudaMalloc/cudaFree (sim backend,
profiler off: the allocator alone), loaded by path in this process.
Environment: MEMTRACE_PRELOAD (the library), MT_PYTHONPATH (python/). Prints the verdicts
(as bench_prof does); exits non-zero only when it cannot run. Timings are noisy on a shared
machine: read the ratios to the anchor taken in the same run.
"""
import ctypes
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.environ.get("MT_PYTHONPATH", os.path.join(os.path.dirname(
    os.path.abspath(__file__)), "..", "python")))
os.environ.setdefault("MEMTRACE_PROF", "off")
os.environ.setdefault("MEMTRACE_BACKEND", "sim")
os.environ.setdefault("MEMTRACE_LOG_LEVEL", "error")
import memtrace  # noqa: E402
from machine_py import cpu_model  # noqa: E402  (this directory)


def per_op(fn, n, reps=7):
    """Seconds per operation of fn(n) (which does n operations): every repeat's figure."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(n)
        out.append((time.perf_counter() - t0) / n)
    return out


class Null:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main():
    L = memtrace._lib.lib()
    L.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    L.cudaFree.argtypes = [ctypes.c_void_p]
    print("memtrace python bench: CPU %s, %d threads online, kernel %s, Python %s (%s)"
          % (cpu_model(), os.cpu_count(), platform.release(), platform.python_version(),
             sys.executable))
    print("library %s, backend sim, profiler off" % memtrace.library_path())

    t, null = memtrace.tag("bench"), Null()

    def pairs_hoisted(n):
        for _ in range(n):
            with t:
                pass

    def pairs_inline(n):
        for _ in range(n):
            with memtrace.tag("bench"):
                pass

    def pairs_null(n):
        for _ in range(n):
            with null:
                pass

    n = 200000
    hoisted = min(per_op(pairs_hoisted, n)) * 1e9
    inline = min(per_op(pairs_inline, n)) * 1e9
    anchor = min(per_op(pairs_null, n)) * 1e9
    print("%-46s %8s %10s" % ("operation", "ns", "x anchor"))
    print("%-46s %8.0f %10.2f" % ("anchor: empty with-block, Python class", anchor, 1.0))
    print("%-46s %8.0f %10.2f" % ("tag enter/exit pair, tag object reused", hoisted,
                                   hoisted / anchor))
    print("%-46s %8.0f %10.2f" % ("tag enter/exit pair, memtrace.tag(name) inline", inline,
                                   inline / anchor))

    p = ctypes.c_void_p()
    malloc, free, byref = L.cudaMalloc, L.cudaFree, ctypes.byref

    def allocs(n):
        for _ in range(n):
            malloc(byref(p), 4096)
            free(p)

    def allocs_tagged(n):
        with t:
            allocs(n)

    allocs(10000)  # warm the cache
    outside, inside = [], []
    for _ in range(5):  # interleaved, so drift hits both alike
        outside += per_op(allocs, 20000, reps=3)
        inside += per_op(allocs_tagged, 20000, reps=3)
    o_min, i_min = min(outside) * 1e9, min(inside) * 1e9
    noise = (statistics.median(outside) - min(outside)) / min(outside)
    print("%-46s %8.0f %10.2f" % ("cudaMalloc+cudaFree 4 KiB via ctypes, no tag", o_min,
                                   o_min / anchor))
    print("%-46s %8.0f %10.2f" % ("cudaMalloc+cudaFree 4 KiB via ctypes, in a tag", i_min,
                                   i_min / anchor))
    ratio = i_min / o_min
    allowed = max(0.03, 2 * noise)
    print("inside/outside %.3f (noise: median %.1f %% above min; allowed +%.1f %%)"
          % (ratio, noise * 100, allowed * 100))
    ok_pair = inline <= 1000 and hoisted <= 1000
    ok_alloc = ratio <= 1 + allowed
    print("verdict: tag pair <= 1 us: %s; allocation in a tag no dearer (within noise): %s"
          % ("met" if ok_pair else "NOT met", "met" if ok_alloc else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
