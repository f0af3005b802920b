"""Finding and binding libmemtrace-preload.so (ctypes; no compiled extension).

Order: the library already in the process (LD_PRELOAD under ``memtrace run``), then
$MEMTRACE_PRELOAD, then a build directory of this checkout, then the system's library
path. Loading is lazy: ``import memtrace`` never fails for want of the library.
"""
import ctypes
import glob
import os
import shutil
import threading

from ._errors import MemtraceError, MemtraceUnavailable

_LIBNAME = "libmemtrace-preload.so"
_PROBE = "memtrace_tag_push"

_lock = threading.Lock()
_lib = None
_tried = []  # where we looked, for the error message


def _candidates():
    env = os.environ.get("MEMTRACE_PRELOAD")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))  # python/memtrace -> checkout
    for d in ("build", "build-test", "build-release"):
        yield os.path.join(root, d, "preload", _LIBNAME)
    for p in sorted(glob.glob(os.path.join(root, "build*", "preload", _LIBNAME))):
        yield p
    yield _LIBNAME  # the dynamic loader's search path (installed builds)


# memtrace_oom_cb (preload/api.h): ud, device, requested, allocated, reserved, limit, free,
# message.
OOM_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                          ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_char_p)


class ScopeStats(ctypes.Structure):
    """struct memtrace_scope_stats (preload/api.h)."""
    _fields_ = [("start_bytes", ctypes.c_int64), ("peak_bytes", ctypes.c_int64),
                ("current_bytes", ctypes.c_int64), ("allocated_bytes", ctypes.c_uint64),
                ("freed_bytes", ctypes.c_uint64), ("allocations", ctypes.c_uint64),
                ("frees", ctypes.c_uint64)]


def _bind(lib):
    c_int, c_char_p, c_long = ctypes.c_int, ctypes.c_char_p, ctypes.c_long
    sig = {
        "memtrace_tag_lookup": ([c_char_p], c_int),
        "memtrace_tag_register": ([c_char_p], c_int),
        "memtrace_tag_name": ([c_int], c_char_p),
        "memtrace_mark": ([c_int, ctypes.c_uint64], c_int),
        "memtrace_mark_named": ([c_char_p], c_int),
        "memtrace_stats_json": ([ctypes.c_char_p, ctypes.c_size_t], c_long),
        "memtrace_snapshot_json": ([ctypes.c_char_p, ctypes.c_size_t], c_long),
        "memtrace_reset_peak": ([], c_int),
        "memtrace_reset_accumulated": ([], c_int),
        "memtrace_set_allocator_settings": ([ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t], c_int),
        "memtrace_empty_cache": ([], c_int),
        "memtrace_library_path": ([], c_char_p),
        "memtrace_strerror": ([c_int], c_char_p),
        "memtrace_add_oom_observer": ([OOM_CB, ctypes.c_void_p], c_int),
        "memtrace_remove_oom_observer": ([OOM_CB, ctypes.c_void_p], c_int),
        "memtrace_stats_push": ([c_int, c_char_p], c_int),
        "memtrace_stats_pop": ([c_int, ctypes.POINTER(ScopeStats)], c_int),
        "memtrace_prefetch": ([ctypes.c_void_p, ctypes.c_size_t, c_int, ctypes.c_void_p], c_int),
        "memtrace_advise": ([ctypes.c_void_p, ctypes.c_size_t, c_int, c_int], c_int),
    }
    for name, (args, res) in sig.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    # The per-thread tag calls are a thread-local load or store: called with the GIL held
    # (PYFUNCTYPE), they skip ctypes' release and retake of it, ~40 % of a call's cost.
    fast = {"memtrace_tag_push": (c_int,), "memtrace_tag_pop": (), "memtrace_tag_set": (c_int,),
            "memtrace_tag_current": (), "memtrace_tag_depth": ()}
    for name, args in fast.items():
        setattr(lib, name, ctypes.PYFUNCTYPE(c_int, *args)((name, lib)))
    return lib


def lib():
    """The bound library; raises MemtraceUnavailable when there is none."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        _tried.clear()
        try:
            me = ctypes.CDLL(None)
            if hasattr(me, _PROBE):
                _lib = _bind(me)
                return _lib
        except OSError:
            pass
        _tried.append("this process (not started by `memtrace run`)")
        for path in _candidates():
            if os.sep in path and not os.path.exists(path):
                continue
            try:
                cand = ctypes.CDLL(path)
            except OSError as e:
                _tried.append("%s (%s)" % (path, e))
                continue
            if not hasattr(cand, _PROBE):
                _tried.append("%s (too old: no %s)" % (path, _PROBE))
                continue
            _lib = _bind(cand)
            return _lib
        raise MemtraceUnavailable(
            "memtrace library not found: looked in " + "; ".join(_tried) +
            ". Run the program under `memtrace run -- python3 ...`, or set MEMTRACE_PRELOAD "
            "to the path of " + _LIBNAME)


def loaded():
    """True when the library is (or can be) loaded."""
    try:
        lib()
        return True
    except MemtraceUnavailable:
        return False


def check(rc, what):
    """rc if it is not negative, else MemtraceError naming what failed and why."""
    if rc < 0:
        why = lib().memtrace_strerror(rc).decode("utf-8", "replace")
        raise MemtraceError("%s: %s (%d)" % (what, why, rc))
    return rc


def json_call(fn, what):
    """Calls a memtrace_*_json(buf, cap) entry point with enough room; returns the text."""
    cap = 1 << 16
    for _ in range(8):
        buf = ctypes.create_string_buffer(cap)
        need = check(fn(buf, cap), what)
        if need < cap:
            return buf.value.decode("utf-8", "replace")
        cap = need + (need >> 2) + 1
    raise MemtraceError("%s: the answer kept growing" % what)


def memtrace_cli():
    """Path of the `memtrace` CLI ($MEMTRACE_EXE, PATH, or the checkout's build directory),
    or None: the package's converters (snapshots, binary logs) run it."""
    exe = os.environ.get("MEMTRACE_EXE") or shutil.which("memtrace")
    if exe:
        return exe
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    for d in ("build", "build-test", "build-release"):
        p = os.path.join(root, d, "tools", "memtrace")
        if os.path.exists(p):
            return p
    return None
