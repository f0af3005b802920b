"""Python frames of the allocating thread (profiler/pyframes.c) with the system python3.

Loads tests/callsite's probe library through ctypes, which captures the calling thread's
Python frames and its native stack and interleaves them. Checks function names, files and
line numbers, with the GIL released (ctypes.CDLL), held (ctypes.PyDLL), from a second
thread, and through a callback that re-enters the interpreter (two eval loops on the
native stack). Exits non-zero with a message on the first mismatch."""
import ctypes
import os
import sys
import threading

HERE = os.path.realpath(__file__)
LIB = os.environ["MT_PYPROBE"]
cdll = ctypes.CDLL(LIB)
pydll = ctypes.PyDLL(LIB)
for lib in (cdll, pydll):
    lib.mt_test_pyprobe.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.mt_test_pyprobe.restype = ctypes.c_int
CB = ctypes.CFUNCTYPE(ctypes.c_int)
cdll.mt_test_pyprobe_cb.argtypes = [CB]


def fail(msg, frames):
    sys.stderr.write("FAIL: %s\nstack:\n%s\n" % (msg, "\n".join(frames)))
    sys.exit(1)


def probe(lib):
    buf = ctypes.create_string_buffer(1 << 16)
    n = lib.mt_test_pyprobe(buf, len(buf))  # MARK-probe
    lines = buf.value.decode().splitlines()
    if n <= 0:
        fail("no Python frames captured (returned %d)" % n, lines)
    return lines


def py_frames(lines):
    out = []
    for l in lines:
        if l.startswith("py "):
            _, func, path, line, entry = l.split(" ")
            out.append((func, path, int(line), int(entry)))
    return out


def line_of(marker):
    with open(HERE) as f:
        for i, text in enumerate(f, 1):
            if marker in text and "line_of(" not in text:
                return i
    raise AssertionError(marker)


def expect_prefix(lines, want):
    """want: [(func, line)] innermost first, all in this file."""
    got = py_frames(lines)
    if len(got) < len(want):
        fail("expected at least %d Python frames" % len(want), lines)
    for (func, line), (gfunc, gpath, gline, _) in zip(want, got):
        if gfunc != func or os.path.realpath(gpath) != HERE or gline != line:
            fail("expected %s at %s:%d, got %s at %s:%d" % (func, HERE, line, gfunc, gpath,
                                                            gline), lines)


PROBE = ("probe", line_of("MARK-probe"))


def inner(lib):
    return probe(lib)  # MARK-inner


def outer(lib):
    return inner(lib)  # MARK-outer


class Model:
    def forward(self, lib):
        return outer(lib)  # MARK-forward


def check_gil_released():
    lines = Model().forward(cdll)  # MARK-released
    expect_prefix(lines, [PROBE, ("inner", line_of("MARK-inner")), ("outer", line_of("MARK-outer")),
                          ("Model.forward", line_of("MARK-forward")),
                          ("check_gil_released", line_of("MARK-released"))])
    # All these frames run in one native call of the eval loop: the Python frames stand
    # where it sits, after the probe and ctypes' native frames, before the interpreter's
    # outer native frames.
    first_py = next(i for i, l in enumerate(lines) if l.startswith("py "))
    if not any("mt_test_pyprobe" in l for l in lines[:first_py]):
        fail("the probe's native frame should be inside the Python frames", lines)
    if not lines[-1].startswith("native"):
        fail("the outermost frames should be the interpreter's native ones", lines)
    return lines


def check_gil_held():
    lines = outer(pydll)  # MARK-held
    expect_prefix(lines, [PROBE, ("inner", line_of("MARK-inner")), ("outer", line_of("MARK-outer")),
                          ("check_gil_held", line_of("MARK-held"))])


def check_thread():
    box = []

    def run():
        box.append(inner(cdll))  # MARK-thread

    t = threading.Thread(target=run)
    t.start()
    t.join()
    expect_prefix(box[0], [PROBE, ("inner", line_of("MARK-inner")),
                           ("check_thread.<locals>.run", line_of("MARK-thread"))])


def check_reentry():
    box = []

    def callback():
        box.append(inner(cdll))  # MARK-callback
        return 0

    cdll.mt_test_pyprobe_cb(CB(callback))  # MARK-reentry
    lines = box[0]
    expect_prefix(lines, [PROBE, ("inner", line_of("MARK-inner")),
                          ("check_reentry.<locals>.callback", line_of("MARK-callback")),
                          ("check_reentry", line_of("MARK-reentry"))])
    # Two eval loops: the callback's frames, then the native trampoline into it, then the
    # caller's frames.
    names = [l.split(" ")[1] for l in lines]
    cb_at = names.index("check_reentry.<locals>.callback")
    tramp_at = names.index("mt_test_pyprobe_cb")
    outer_at = names.index("check_reentry")
    if not (cb_at < tramp_at < outer_at):
        fail("frames not interleaved where the interpreter sits (%d %d %d)" %
             (cb_at, tramp_at, outer_at), lines)


def check_names_bounded():
    """More code objects than the capture caches (4096 functions): their names are
    interned once, so capturing them all again stores nothing more."""
    cdll.mt_test_pyprobe_str_bytes.restype = ctypes.c_longlong
    cdll.mt_test_pyprobe_str_dropped.restype = ctypes.c_longlong
    ns = {"probe_count": cdll.mt_test_pyprobe_count}
    src = "".join("def site_%d():\n    return probe_count()\n" % i for i in range(4096))
    exec(compile(src, "/generated/sites.py", "exec"), ns)
    fns = [ns["site_%d" % i] for i in range(4096)]
    for f in fns:
        if f() < 2:
            fail("a generated function's frames were not captured", [])
    first = cdll.mt_test_pyprobe_str_bytes()
    for f in fns:
        f()
    again = cdll.mt_test_pyprobe_str_bytes()
    if again != first or cdll.mt_test_pyprobe_str_dropped() != 0:
        fail("names stored again: %d then %d bytes, %d dropped"
             % (first, again, cdll.mt_test_pyprobe_str_dropped()), [])


if __name__ == "__main__":
    lines = check_gil_released()
    if cdll.mt_test_pyprobe_is_eval_known() != 1:
        fail("the eval loop's address range was not found", lines)
    check_gil_held()
    check_thread()
    check_reentry()
    check_names_bounded()
    print("ok: %d frames, e.g.\n%s" % (len(lines), "\n".join(lines)))
