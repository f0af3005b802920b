"""A training loop's memory pattern, as a plain Python program under `memtrace run`.

Allocates through ctypes calls to libcudart (cudaMalloc/cudaFree; the sim backend under
`memtrace run`) inside memtrace.tag blocks, marks each iteration, and leaks a little of
one tag ("kvcache") every step. Writes memtrace.stats() and a snapshot at the end.
usage: prog_train.py LIBCUDART STATS.json SNAPSHOT.ndjson [STEPS]
"""
import ctypes
import json
import sys

import memtrace

MiB = 1 << 20


def main():
    cudart = ctypes.CDLL(sys.argv[1])
    cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    cudart.cudaFree.argtypes = [ctypes.c_void_p]
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 12

    def malloc(n):
        p = ctypes.c_void_p()
        rc = cudart.cudaMalloc(ctypes.byref(p), n)
        if rc != 0:
            raise RuntimeError("cudaMalloc(%d) failed: %d" % (n, rc))
        return p.value

    def free(p):
        rc = cudart.cudaFree(ctypes.c_void_p(p))
        if rc != 0:
            raise RuntimeError("cudaFree failed: %d" % rc)

    with memtrace.tag("weights"):
        weights = [malloc(4 * MiB) for _ in range(4)]
    kept = []

    @memtrace.tag("optimizer")
    def step_optimizer():
        tmp = malloc(2 * MiB)
        free(tmp)

    for it in range(steps):
        memtrace.mark_iteration(it)
        with memtrace.tag("activations"):
            acts = [malloc(3 * MiB) for _ in range(3)]
            with memtrace.tag("attn_scratch"):  # nested, then back to activations
                scratch = malloc(1 * MiB)
                free(scratch)
            acts.append(malloc(512 * 1024))
        with memtrace.tag("kvcache"):
            kept.append(malloc(768 * 1024))  # the leak: never freed
            tmp = malloc(256 * 1024)
            free(tmp)
        for p in acts:
            free(p)
        step_optimizer()
        memtrace.mark("step_done")
    memtrace.mark_iteration(steps)
    with open(sys.argv[2], "w") as f:
        json.dump({"stats": memtrace.stats(), "summary": memtrace.summary(),
                   "tag_after": memtrace.current_tag()}, f)
    memtrace.snapshot(sys.argv[3])
    for p in weights:
        free(p)


if __name__ == "__main__":
    main()
