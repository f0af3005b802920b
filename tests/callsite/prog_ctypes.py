"""A Python program that allocates device memory through the preload's PyTorch entry point
memtrace_alloc, called with ctypes (the GIL released during the call), on the sim backend.
Run by test_callsite_e2e.py with MEMTRACE_STACKS=all: the call sites recorded must hold
this file's function names and line numbers. argv: PRELOAD STEPS"""
import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
lib.memtrace_alloc.restype = ctypes.c_void_p
lib.memtrace_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.memtrace_free.restype = None
lib.memtrace_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.memtrace_mark.argtypes = [ctypes.c_int, ctypes.c_uint64]
MIB = 1 << 20
history = []


def alloc(n):
    p = lib.memtrace_alloc(n, 0, None)  # SITE-alloc
    if not p:
        raise SystemExit("memtrace_alloc(%d) failed" % n)
    return p


class Encoder:
    def weights(self):
        return alloc(6 * MIB)  # SITE-weights

    def forward(self):
        act = alloc(3 * MIB)  # SITE-forward
        history.append(alloc(512 * 1024))  # SITE-history
        return act


def main(steps):
    enc = Encoder()
    w = enc.weights()  # SITE-main-weights
    for i in range(steps):
        act = enc.forward()  # SITE-main-forward
        lib.memtrace_free(act, 3 * MIB, 0, None)
        lib.memtrace_mark(1, i)
    print("ok", w is not None)


if __name__ == "__main__":
    main(int(sys.argv[2]))
