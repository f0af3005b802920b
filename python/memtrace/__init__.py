"""memtrace from Python: tags, iteration marks, statistics and snapshots.

Pure Python over ctypes. The library is the one already in the process (the preload
that ``memtrace run`` puts there), else libmemtrace-preload.so found by path
($MEMTRACE_PRELOAD or a build directory of the checkout). See docs/python.md.

    import memtrace
    with memtrace.tag("activations"):
        ...                                  # allocations here carry the tag
    memtrace.mark_iteration(step)            # growth detector, plots, the page
    print(memtrace.summary())
"""
import ctypes
import functools
import json
import os
import re
import sys
import threading
import traceback

from . import _lib
from ._errors import MemtraceError, MemtraceUnavailable
from ._logs import read_log

__all__ = [
    "MemtraceError", "MemtraceUnavailable", "available", "tag", "register_tag", "tag_id",
    "current_tag", "mark_iteration", "mark", "stats", "memory_stats", "reset_peak",
    "reset_accumulated_memory_stats", "set_allocator_settings", "empty_cache", "attach_out_of_memory_observer",
    "detach_out_of_memory_observer", "statistics", "push_statistics", "pop_statistics",
    "summary", "snapshot", "enable_for_torch", "library_path", "reinitialize", "prefetch",
    "advise", "read_log",
]

BUILTIN_TAGS = ("other", "weights", "grads", "optimizer", "activations", "workspace", "batch")
USER_TAGS = 25  # ids 7..31
LABEL_MAX = 24  # bytes of a tag name that reach consumers (docs/telemetry.md)
MARK_NAME_MAX = 16
_BUILTIN_MARKS = {"iteration": 1, "forward_begin": 2, "forward_end": 3, "backward_begin": 4,
                  "backward_end": 5, "warmup_begin": 6, "warmup_end": 7}
_EOVERFLOW = -75
_ENOMEM = -12


def available():
    """True when memtrace's library is in this process or can be loaded."""
    return _lib.loaded()


def library_path():
    """Path of the memtrace library in use (what enable_for_torch() hands PyTorch)."""
    p = _lib.lib().memtrace_library_path()
    if not p:
        raise MemtraceError("memtrace library path unknown (dladdr failed)")
    return p.decode()


# ---- tags ----

_TAGNAME = re.compile(r"tag[0-9]+\Z")


def _check_name(name):
    if not isinstance(name, str):
        raise TypeError("memtrace tag name must be a str, not %s" % type(name).__name__)
    b = name.encode("utf-8")
    if not b:
        raise ValueError("memtrace tag name is empty")
    if len(b) > LABEL_MAX:
        raise ValueError("memtrace tag name %r is %d bytes; at most %d reach consumers"
                         % (name, len(b), LABEL_MAX))
    if any(ord(c) < 0x20 or ord(c) == 0x7f for c in name):
        raise ValueError("memtrace tag name %r has a control character" % name)
    if _TAGNAME.match(name):
        raise ValueError("memtrace tag name %r is reserved (tag<N> names unlabelled ids)" % name)
    return b


def register_tag(name):
    """Registers a user tag (or finds a built-in one) and returns its id."""
    b = _check_name(name)
    rc = _lib.lib().memtrace_tag_register(b)
    if rc == _ENOMEM:
        raise MemtraceError("no tag id left for %r: all %d user tags are taken (%s)"
                            % (name, USER_TAGS, ", ".join(_user_tags())))
    return _lib.check(rc, "registering tag %r" % name)


def tag_id(name):
    """Id of a known tag; KeyError naming the unknown tag otherwise."""
    rc = _lib.lib().memtrace_tag_lookup(_check_name(name))
    if rc < 0:
        known = list(BUILTIN_TAGS) + _user_tags()
        raise KeyError("unknown memtrace tag name %r (known: %s); register it with "
                       "memtrace.tag(%r) or memtrace.register_tag(%r)"
                       % (name, ", ".join(known), name, name))
    return rc


def _user_tags():
    L = _lib.lib()
    out = []
    for i in range(7, 7 + USER_TAGS):
        n = L.memtrace_tag_name(i)
        if n is None:
            break
        out.append(n.decode("utf-8", "replace"))
    return out


def current_tag():
    """Name of the calling thread's current tag."""
    L = _lib.lib()
    return L.memtrace_tag_name(L.memtrace_tag_current()).decode("utf-8", "replace")


def tag(name, create=True):
    """Tags the calling thread's allocations while active; a context manager and a
    decorator. Per thread, nests (the enclosing tag is restored on exit). A new name is
    registered as a user tag; create=False makes an unknown name a KeyError instead.
    The object is cached per name and holds no state, so it may be kept and reused, by
    any number of threads.

        with memtrace.tag("activations"): ...
        @memtrace.tag("optimizer")
        def step(): ...
    """
    t = _Tag.cache.get(name)
    return t if t is not None else _Tag(name, create)


class _Tag:
    __slots__ = ("name", "id", "_push", "_pop")
    cache = {}

    def __init__(self, name, create):
        self.id = register_tag(name) if create else tag_id(name)
        self.name = name
        L = _lib.lib()
        self._push, self._pop = L.memtrace_tag_push, L.memtrace_tag_pop
        _Tag.cache[name] = self

    def __enter__(self):
        rc = self._push(self.id)
        if rc:
            _raise_push(rc, self.name)
        return self

    def __exit__(self, *exc):
        if self._pop():
            raise MemtraceError("memtrace.tag(%r) exit without a matching enter on this "
                                "thread" % self.name)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def tagged(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        return tagged

    def __repr__(self):
        return "memtrace.tag(%r)" % self.name


def _raise_push(rc, name):
    if rc == _EOVERFLOW:
        raise MemtraceError("memtrace.tag(%r): tags nested deeper than 256 on this thread" % name)
    _lib.check(rc, "entering memtrace.tag(%r)" % name)


# ---- marks ----

def mark_iteration(i):
    """Marks the start of iteration i (an int >= 0): what the growth detector reads."""
    if not isinstance(i, int) or isinstance(i, bool) or i < 0 or i >= 1 << 64:
        raise ValueError("memtrace.mark_iteration(i) takes an int >= 0, got %r" % (i,))
    _lib.check(_lib.lib().memtrace_mark(1, i), "memtrace.mark_iteration(%d)" % i)


def mark(name):
    """Puts a named marker into the timeline. Built-in names (forward_begin, forward_end,
    backward_begin, backward_end, warmup_begin, warmup_end) are the engine's markers;
    any other name (at most 16 bytes) is a named mark."""
    if not isinstance(name, str) or not name:
        raise ValueError("memtrace.mark(name) takes a non-empty str, got %r" % (name,))
    if name == "iteration":
        raise ValueError("memtrace.mark('iteration'): use memtrace.mark_iteration(i), which "
                         "carries the iteration number")
    L = _lib.lib()
    if name in _BUILTIN_MARKS:
        _lib.check(L.memtrace_mark(_BUILTIN_MARKS[name], 0), "memtrace.mark(%r)" % name)
        return
    b = name.encode("utf-8")
    if len(b) > MARK_NAME_MAX:
        raise ValueError("memtrace.mark(%r): a mark name holds at most %d bytes, this one %d"
                         % (name, MARK_NAME_MAX, len(b)))
    _lib.check(L.memtrace_mark_named(b), "memtrace.mark(%r)" % name)


# ---- statistics ----

_POOLS = (("all", "all"), ("small", "small_pool"), ("large", "large_pool"))
_STATS = ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
          "requested_bytes", "allocation", "segment", "active", "inactive_split")
_COUNTS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
           "num_sync_all_streams")


def _raw_stats():
    L = _lib.lib()
    return json.loads(_lib.json_call(L.memtrace_stats_json, "memtrace.stats()"))


def stats():
    """Memory statistics in PyTorch's memory_stats() vocabulary, summed over devices:
    "allocated_bytes.all.current", "reserved_bytes.large_pool.peak", "num_ooms", ...
    plus per tag "allocated_bytes.tag.<name>.{current,peak,allocated,freed}" and
    "requested_bytes.tag.<name>.*". Peaks are summed per device (as torch's are kept)."""
    raw = _raw_stats()
    out = {}
    for st in _STATS:
        for src, dst in _POOLS:
            for f in ("current", "peak", "allocated", "freed"):
                out["%s.%s.%s" % (st, dst, f)] = sum(d[st][src][f] for d in raw["devices"])
    for c in _COUNTS:
        out[c] = sum(d[c] for d in raw["devices"])
    out["max_split_size"] = max([d["max_split_size"] for d in raw["devices"]] or [-1])
    for st in ("oversize_allocations", "oversize_segments"):
        for f in ("current", "peak", "allocated", "freed"):
            out["%s.%s" % (st, f)] = sum(d[st][f] for d in raw["devices"])
    out["largest_free_block"] = max([d["largest_free_block"] for d in raw["devices"]] or [0])
    out["total_free"] = sum(d["total_free"] for d in raw["devices"])
    out["capacity"] = sum(d["capacity"] for d in raw["devices"])
    out["devices"] = len(raw["devices"])
    for d in raw["devices"]:
        for name, t in d["tags"].items():
            for st in ("allocated_bytes", "requested_bytes"):
                for f in ("current", "peak", "allocated", "freed"):
                    k = "%s.tag.%s.%s" % (st, name, f)
                    out[k] = out.get(k, 0) + t[st][f]
    return dict(sorted(out.items()))


def memory_stats():
    """torch.cuda.memory_stats()'s keys and only those, from memtrace's allocator: what code
    written for torch's dict reads unchanged. stats() has these and memtrace's own."""
    s = stats()
    keys = ["%s.%s.%s" % (st, pool, f) for st in _STATS for _, pool in _POOLS
            for f in ("current", "peak", "allocated", "freed")]
    keys += list(_COUNTS) + ["max_split_size"]
    keys += ["%s.%s" % (st, f) for st in ("oversize_allocations", "oversize_segments")
             for f in ("current", "peak", "allocated", "freed")]
    return dict(sorted((k, s[k]) for k in keys))


def set_allocator_settings(settings):
    """Changes allocator settings at run time, as torch.cuda.memory._set_allocator_settings:
    "max_split_size_mb:64,garbage_collection_threshold:0.6". Keys that shape the existing
    segments (expandable_segments, ...) raise MemtraceError naming the key; each change is
    recorded, so the report shows when it happened."""
    if not isinstance(settings, str):
        raise ValueError("memtrace.set_allocator_settings(s) takes a str, got %r" % (settings,))
    err = ctypes.create_string_buffer(512)
    rc = _lib.lib().memtrace_set_allocator_settings(settings.encode("utf-8"), err, len(err))
    if rc < 0:
        why = err.value.decode("utf-8", "replace") or _lib.lib().memtrace_strerror(rc).decode()
        raise MemtraceError("memtrace.set_allocator_settings(%r): %s" % (settings, why))


def reinitialize(managed_memory=False, **rest):
    """rmm.reinitialize(managed_memory=...) in memtrace's words: the allocator config
    (MEMTRACE_ALLOC_CONF) gets managed_memory:True or :False, the pools' segments then being
    managed (unified) memory, cudaMallocManaged's, that migrates between host and device and
    may oversubscribe the device. The drop-in reads the config when it is loaded and makes
    its allocator: this takes effect in the processes started afterwards (`memtrace run` and
    their children). When the drop-in is in this process already, its allocator keeps its
    segments: a change raises MemtraceError, as set_allocator_settings("managed_memory:...")
    does. Returns the new config string.
    RMM's other arguments (pool_allocator, initial_pool_size, devices, logging, ...) have no
    counterpart here and raise ValueError by name."""
    if rest:
        raise ValueError("memtrace.reinitialize: no counterpart of %s in memtrace; only "
                         "managed_memory" % ", ".join(sorted(rest)))
    if not isinstance(managed_memory, bool):
        raise ValueError("memtrace.reinitialize(managed_memory=%r): a bool" % (managed_memory,))
    conf = os.environ.get("MEMTRACE_ALLOC_CONF", "")
    items = [i for i in conf.split(",") if i.strip() and
             i.split(":", 1)[0].strip() != "managed_memory"]
    items.append("managed_memory:%s" % managed_memory)
    new = ",".join(items)
    if _drop_in_here():
        set_allocator_settings("managed_memory:%s" % managed_memory)  # a change raises
    os.environ["MEMTRACE_ALLOC_CONF"] = new
    return new


# cudaMemoryAdvise's numbers (CUmem_advise), by cupy's and CUDA's lower-case names.
_ADVICE = {"set_read_mostly": 1, "unset_read_mostly": 2, "set_preferred_location": 3,
           "unset_preferred_location": 4, "set_accessed_by": 5, "unset_accessed_by": 6}


def _ptr_size(tensor_or_ptr, size, what):
    """(address, bytes) of a tensor (torch's data_ptr, cupy's data.ptr, numba's
    __cuda_array_interface__) or of an int address with size."""
    if isinstance(tensor_or_ptr, int):
        if size is None:
            raise ValueError("%s: an int address needs a size" % what)
        return tensor_or_ptr, int(size)
    t = tensor_or_ptr
    if hasattr(t, "data_ptr") and hasattr(t, "element_size"):  # torch.Tensor
        n = t.numel() * t.element_size()
        return t.data_ptr(), n if size is None else int(size)
    cai = getattr(t, "__cuda_array_interface__", None)
    if cai is not None:
        n = getattr(t, "nbytes", None)
        if size is None and n is None:
            raise ValueError("%s: give the size of %r" % (what, t))
        return cai["data"][0], int(n if size is None else size)
    raise ValueError("%s: a tensor or an int address, got %r" % (what, type(t).__name__))


def _location(where, what):
    """A device ordinal, or -1 for the host: "cpu", None, an int, "cuda:N", or a
    torch.device."""
    if where is None or where == "cpu":
        return -1
    if isinstance(where, int):
        return where
    s = str(where)
    if s == "cpu":
        return -1
    if s == "cuda":
        return 0
    if s.startswith("cuda:") and s[5:].isdigit():
        return int(s[5:])
    raise ValueError("%s: location %r is not a device or 'cpu'" % (what, where))


def _stream(stream):
    """The CUDA stream handle of stream: None (the default stream), an int handle, a
    torch.cuda.Stream (cuda_stream) or a cupy stream (ptr)."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream or None
    for attr in ("cuda_stream", "ptr"):
        h = getattr(stream, attr, None)
        if isinstance(h, int):
            return h or None
    raise ValueError("memtrace.prefetch: stream %r has no handle" % (stream,))


def prefetch(tensor_or_ptr, size=None, device="cpu", stream=None):
    """Prefetches managed memory memtrace handed out (cudaMallocManaged under the drop-in,
    or a pool made managed by reinitialize(managed_memory=True)) to device (an ordinal,
    "cuda:N") or to the host ("cpu"), on stream, as cudaMemPrefetchAsync; recorded as a
    managed event. tensor_or_ptr is a tensor (its bytes unless size says fewer) or an int
    address with size. MemtraceError when the range is not in a managed block of memtrace's."""
    what = "memtrace.prefetch"
    ptr, n = _ptr_size(tensor_or_ptr, size, what)
    return _lib.check(_lib.lib().memtrace_prefetch(ptr, n, _location(device, what),
                                                   _stream(stream)),
                      "%s(0x%x, %d bytes, %r)" % (what, ptr, n, device))


def advise(tensor_or_ptr, size=None, advice="set_read_mostly", device="cpu"):
    """cudaMemAdvise on managed memory memtrace handed out: advice by name
    ("set_read_mostly", "set_preferred_location", "set_accessed_by" and their "unset_"
    forms) or cudaMemoryAdvise's number, with device (an ordinal, "cuda:N" or "cpu") as its
    location. Recorded as a managed event; MemtraceError as prefetch's."""
    what = "memtrace.advise"
    ptr, n = _ptr_size(tensor_or_ptr, size, what)
    a = _ADVICE.get(advice, advice) if isinstance(advice, str) else advice
    if not isinstance(a, int):
        raise ValueError("%s: unknown advice %r (one of %s)" % (what, advice,
                                                             ", ".join(sorted(_ADVICE))))
    return _lib.check(_lib.lib().memtrace_advise(ptr, n, a, _location(device, what)),
                      "%s(0x%x, %d bytes, %r)" % (what, ptr, n, advice))


def _drop_in_here():
    """True when the drop-in is in this process already (LD_PRELOAD, or loaded by a call of
    this package): it made its allocator when it was loaded."""
    if _lib._lib is not None:
        return True
    try:
        return hasattr(ctypes.CDLL(None), _lib._PROBE)
    except OSError:
        return False


def reset_accumulated_memory_stats():
    """Zeroes every cumulative figure ("allocated", "freed", num_*), as
    torch.cuda.reset_accumulated_memory_stats(); current values and peaks stay."""
    _lib.check(_lib.lib().memtrace_reset_accumulated(), "memtrace.reset_accumulated_memory_stats()")


def tags_in(s):
    """Tag names present in a stats() dict."""
    return sorted({k.split(".tag.", 1)[1].rsplit(".", 1)[0] for k in s
                   if k.startswith("allocated_bytes.tag.")})


def reset_peak():
    """Resets every peak to the current value (torch.cuda.reset_peak_memory_stats)."""
    _lib.check(_lib.lib().memtrace_reset_peak(), "memtrace.reset_peak()")


def empty_cache():
    """Returns every unused cached segment to the device (torch.cuda.empty_cache)."""
    _lib.check(_lib.lib().memtrace_empty_cache(), "memtrace.empty_cache()")


# ---- OOM observers (torch._C._cuda_attach_out_of_memory_observer) ----

_observers = {}  # fn -> its C callback (kept alive while attached)
_observers_lock = threading.Lock()


def attach_out_of_memory_observer(fn):
    """Calls fn(device, alloc, device_allocated, device_free) when a request fails for lack
    of memory (torch._C._cuda_attach_out_of_memory_observer's arguments: the device, the
    bytes asked for, the bytes allocated on the device and the device's free bytes), on the
    failing thread, after the allocator has given up and before the request fails. fn may
    call stats(). An exception in fn is printed to stderr, not raised through the
    allocator."""
    def call(ud, device, requested, allocated, reserved, limit, free, message):
        try:
            fn(device, requested, allocated, free)
        except BaseException:  # noqa: B036 (nothing may unwind through C)
            traceback.print_exc(file=sys.stderr)
    with _observers_lock:
        if fn in _observers:
            return
        cb = _lib.OOM_CB(call)
        _lib.check(_lib.lib().memtrace_add_oom_observer(cb, None),
                   "memtrace.attach_out_of_memory_observer()")
        _observers[fn] = cb


def detach_out_of_memory_observer(fn):
    """Stops calling fn (attached by attach_out_of_memory_observer)."""
    with _observers_lock:
        cb = _observers.pop(fn, None)
        if cb is not None:
            _lib.check(_lib.lib().memtrace_remove_oom_observer(cb, None),
                       "memtrace.detach_out_of_memory_observer()")


# ---- scoped statistics (rmm.statistics) ----

_SCOPE_FIELDS = ("start_bytes", "peak_bytes", "current_bytes", "allocated_bytes",
                 "freed_bytes", "allocations", "frees")


def push_statistics(name=None, device=0):
    """Opens a statistics scope on device (rmm.statistics.push_statistics); scopes nest, at
    most 64 deep. name (optional, <= 16 bytes reach the stream) marks the event stream."""
    n = name.encode("utf-8") if name is not None else None
    _lib.check(_lib.lib().memtrace_stats_push(device, n), "memtrace.push_statistics()")


def pop_statistics(device=0):
    """Closes device's innermost scope (rmm.statistics.pop_statistics) and returns its
    figures: peak_bytes (highest allocated bytes while open, above those at its start),
    current_bytes (net change), allocated_bytes, freed_bytes, allocations, frees,
    start_bytes, and RMM's total_bytes / total_count (= allocated_bytes / allocations)."""
    s = _lib.ScopeStats()
    _lib.check(_lib.lib().memtrace_stats_pop(device, ctypes.byref(s)),
               "memtrace.pop_statistics()")
    d = {f: getattr(s, f) for f in _SCOPE_FIELDS}
    d["total_bytes"], d["total_count"] = d["allocated_bytes"], d["allocations"]
    return d


class statistics:
    """with memtrace.statistics("name") as s: ...  -- s.peak_bytes, s.allocated_bytes,
    s.freed_bytes, s.allocations (and the other pop_statistics() fields) are filled at the
    block's exit (rmm.statistics.statistics). Peaks are exact, every thread's allocations
    on device counted."""

    def __init__(self, name=None, device=0):
        self.name, self.device = name, device
        for f in _SCOPE_FIELDS:
            setattr(self, f, None)

    def __enter__(self):
        push_statistics(self.name, self.device)
        return self

    def __exit__(self, *exc):
        for k, v in pop_statistics(self.device).items():
            setattr(self, k, v)
        return False

    def __repr__(self):
        return "memtrace.statistics(%r, peak_bytes=%r, allocated_bytes=%r, freed_bytes=%r, " \
               "allocations=%r)" % (self.name, self.peak_bytes, self.allocated_bytes,
                                    self.freed_bytes, self.allocations)


def _fmt(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.2f %s" % (n, unit))
        n /= 1024.0


def summary():
    """A text table like torch.cuda.memory_summary(), with a row per tag."""
    s = stats()
    w = 75
    rows = ["|" + "=" * w + "|",
            "|" + ("memtrace memory summary, %d device(s)" % s["devices"]).center(w) + "|",
            "|" + "-" * w + "|",
            "| %-26s| %10s | %10s | %10s | %10s |" % ("Metric", "Cur Usage", "Peak Usage",
                                                    "Tot Alloc", "Tot Freed"),
            "|" + "-" * w + "|"]

    def line(label, key, size=True):
        f = _fmt if size else str
        rows.append("| %-26s| %10s | %10s | %10s | %10s |" % (
            label, f(s[key + ".current"]), f(s[key + ".peak"]), f(s[key + ".allocated"]),
            f(s[key + ".freed"])))

    for title, st, size in (("Allocated memory", "allocated_bytes", True),
                            ("Active memory", "active_bytes", True),
                            ("Requested memory", "requested_bytes", True),
                            ("GPU reserved memory", "reserved_bytes", True),
                            ("Non-releasable memory", "inactive_split_bytes", True),
                            ("Allocations", "allocation", False),
                            ("Active allocs", "active", False),
                            ("GPU reserved segments", "segment", False)):
        line(title, st + ".all", size)
        line("      from large pool", st + ".large_pool", size)
        line("      from small pool", st + ".small_pool", size)
        rows.append("|" + "-" * w + "|")
    tags = tags_in(s)
    if tags:
        rows.append("| %-73s |" % "Allocated memory by tag")
        for t in tags:
            line("      " + t, "allocated_bytes.tag." + t)
        rows.append("|" + "-" * w + "|")
    rows.append("| %-73s |" % ("Allocation retries: %d    OOMs: %d    device mallocs: %d    "
                                 "device frees: %d" % (s["num_alloc_retries"], s["num_ooms"],
                                                       s["num_device_alloc"],
                                                       s["num_device_free"])))
    rows.append("|" + "=" * w + "|")
    return "\n".join(rows) + "\n"


# ---- snapshots ----

def snapshot(path, format="memtrace"):
    """Writes the segment map of every device in use to path. format "memtrace": one
    `snapshot` record per line (docs/telemetry.md), what `memtrace report/plot` read;
    "torch": PyTorch's snapshot pickle (pytorch.org/memory_viz) of the state at the call,
    tags as frames, converted by `memtrace export` (found on PATH, in the checkout's build
    directory, or at $MEMTRACE_EXE)."""
    L = _lib.lib()
    text = _lib.json_call(L.memtrace_snapshot_json, "memtrace.snapshot()")
    recs = json.loads(text)
    if format == "memtrace":
        with open(path, "w") as f:
            for r in recs:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
        return path
    if format == "torch":
        from ._torch_snapshot import write

        def tid(name):
            try:
                return tag_id(name)
            except (KeyError, ValueError):
                return 0
        return write(recs, path, tid)
    raise ValueError("memtrace.snapshot(format=%r): use 'memtrace' or 'torch'" % (format,))


# ---- PyTorch ----

def enable_for_torch():
    """Makes memtrace PyTorch's CUDA allocator (change_current_allocator with
    memtrace_alloc/memtrace_free, plus init/reset/base_alloc/record_stream where this
    torch takes them). Call it before any CUDA allocation. Returns the allocator."""
    from .torch import enable
    return enable()
