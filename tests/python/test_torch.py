"""memtrace.torch with Debian's CPU python3-torch (suite 'python'; skipped, exit 77, where
torch is absent). On CPU no allocation reaches memtrace, so the hooks are checked through
the library's current-tag query: what tag each module's forward and backward run under.
"""
import os
import sys
import unittest

sys.path.insert(0, os.environ["MT_PYTHONPATH"])
os.environ.setdefault("MEMTRACE_PROF", "off")
os.environ.setdefault("MEMTRACE_BACKEND", "sim")
os.environ.setdefault("MEMTRACE_LOG_LEVEL", "error")

try:
    import torch
    from torch import nn
except ImportError as e:  # pragma: no cover - depends on the machine
    print("SKIP: torch is not importable here (%s); install python3-torch" % e)
    sys.exit(77)

import memtrace  # noqa: E402
import memtrace.torch  # noqa: E402

SEEN = []  # (phase, probe name, tag) in the order they ran


class _Record(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, name):
        ctx.name = name
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        SEEN.append(("backward", ctx.name, memtrace.current_tag()))
        return g.clone(), None


class Probe(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.name = name
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        SEEN.append(("forward", self.name, memtrace.current_tag()))
        return _Record.apply(self.lin(x), self.name)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 4, batch_first=True)
        self.probe = Probe("encoder.probe")

    def forward(self, x):
        y, _ = self.lstm(x)
        SEEN.append(("forward", "encoder", memtrace.current_tag()))
        return self.probe(y)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = Probe("head")

    def forward(self, x, fail=False):
        if fail:
            self.encoder(x)
            raise RuntimeError("deliberate")
        return self.head(self.encoder(x))


class TagModules(unittest.TestCase):
    def setUp(self):
        SEEN.clear()
        torch.manual_seed(0)

    def step(self, model):
        x = torch.randn(2, 3, 4)
        with memtrace.tag("batch"):
            loss = model(x).sum()
            loss.backward()
            self.assertEqual(memtrace.current_tag(), "batch")

    def test_forward_by_module_backward_as_grads(self):
        model = Model()
        h = memtrace.torch.tag_modules(model)
        self.assertEqual(h.tags["encoder.lstm"], "encoder.lstm")
        self.step(model)
        fwd = [(n, t) for p, n, t in SEEN if p == "forward"]
        self.assertEqual(fwd, [("encoder", "encoder"), ("encoder.probe", "encoder.probe"),
                               ("head", "head")])
        bwd = [(n, t) for p, n, t in SEEN if p == "backward"]
        self.assertEqual(bwd, [("head", "grads"), ("encoder.probe", "grads")])
        self.assertEqual(memtrace.current_tag(), "other")
        h.remove()
        SEEN.clear()
        self.step(model)
        self.assertTrue(all(t == "batch" for _, _, t in SEEN), SEEN)

    def test_backward_by_module(self):
        model = Model()
        h = memtrace.torch.tag_modules(model, grad_tag=None)
        self.step(model)
        bwd = [(n, t) for p, n, t in SEEN if p == "backward"]
        self.assertEqual(bwd, [("head", "head"), ("encoder.probe", "encoder.probe")])
        h.remove()

    def test_exception_in_forward_leaves_no_stale_tag(self):
        model = Model()
        h = memtrace.torch.tag_modules(model)
        depth = memtrace._lib.lib().memtrace_tag_depth()
        with self.assertRaisesRegex(RuntimeError, "deliberate"):
            with memtrace.tag("batch"):
                model(torch.randn(2, 3, 4), fail=True)
        self.assertEqual(memtrace.current_tag(), "other")
        self.assertEqual(memtrace._lib.lib().memtrace_tag_depth(), depth)
        SEEN.clear()
        self.step(model)  # the root's pre hook unwinds what the exception left
        fwd = [(n, t) for p, n, t in SEEN if p == "forward"]
        self.assertEqual(fwd[0], ("encoder", "encoder"))
        with torch.no_grad():
            model(torch.randn(2, 3, 4))
        self.assertEqual(memtrace._lib.lib().memtrace_tag_depth(), depth)
        self.assertEqual(memtrace.current_tag(), "other")
        h.remove()

    def test_long_names_and_depth_limit(self):
        outer = nn.Sequential()
        outer.add_module("a_rather_long_module_name", Model())
        h = memtrace.torch.tag_modules(outer, root="seq", max_depth=2)
        self.assertEqual(h.tags[""], "seq")
        self.assertEqual(h.tags["a_rather_long_module_name.encoder"],
                         "...g_module_name.encoder")
        self.assertIn("a_rather_long_module_name.encoder.lstm", h.untagged)
        outer(torch.randn(2, 3, 4))
        fwd = [(n, t) for p, n, t in SEEN if p == "forward"]
        self.assertEqual(fwd[1], ("encoder.probe", "...g_module_name.encoder"))
        h.remove()


class EnableForTorch(unittest.TestCase):
    def test_no_cuda_is_a_clear_error(self):
        if torch.cuda.is_available():
            self.skipTest("this torch has CUDA")
        with self.assertRaisesRegex(memtrace.MemtraceError, "has no CUDA"):
            memtrace.enable_for_torch()

    def patched(self, extra):
        """Stands in for a torch with CUDA (this machine has none) through torch's own
        calls; returns the undo list."""
        cuda = torch.cuda
        patches = [(cuda, "is_available", lambda: True),
                   (torch.backends.cuda, "is_built", lambda: True)] + extra
        saved = []
        for obj, name, val in patches:
            saved.append((obj, name, getattr(obj, name, None)))
            setattr(obj, name, val)
        return saved

    def undo(self, saved):
        for obj, name, val in reversed(saved):
            if val is None:
                delattr(obj, name)
            else:
                setattr(obj, name, val)

    def test_wiring_of_the_entry_points(self):
        calls = []

        class Native:
            def __getattr__(self, setter):
                if not setter.startswith("set_"):
                    raise AttributeError(setter)
                return lambda ptr: calls.append((setter, ptr))

        class Pluggable:
            def __init__(self, path, alloc_fn, free_fn):
                calls.append(("new", path, alloc_fn, free_fn))

            def allocator(self):
                return Native()

        mem = torch.cuda.memory
        saved = self.patched([(torch.cuda, "is_initialized", lambda: False),
                              (mem, "CUDAPluggableAllocator", Pluggable),
                              (mem, "change_current_allocator",
                               lambda a: calls.append(("change", type(a).__name__)))])
        try:
            memtrace.enable_for_torch()
        finally:
            self.undo(saved)
        import ctypes
        L = memtrace._lib.lib()
        addr = {s: ctypes.cast(getattr(L, s), ctypes.c_void_p).value
                for s in ("memtrace_init", "memtrace_reset", "memtrace_memory_fraction",
                          "memtrace_base_alloc", "memtrace_record_stream",
                          "memtrace_begin_allocate_to_pool", "memtrace_end_allocate_to_pool",
                          "memtrace_release_pool")}
        self.assertEqual(calls, [
            ("new", memtrace.library_path(), "memtrace_alloc", "memtrace_free"),
            ("set_init_fn", addr["memtrace_init"]), ("set_reset_fn", addr["memtrace_reset"]),
            ("set_memory_fraction_fn", addr["memtrace_memory_fraction"]),
            ("set_base_alloc_fn", addr["memtrace_base_alloc"]),
            ("set_record_stream_fn", addr["memtrace_record_stream"]),
            ("set_begin_allocate_to_pool", addr["memtrace_begin_allocate_to_pool"]),
            ("set_end_allocate_to_pool_fn", addr["memtrace_end_allocate_to_pool"]),
            ("set_release_pool", addr["memtrace_release_pool"]),
            ("change", "Pluggable")])

    def test_torch_refusing_the_swap_is_a_clear_error(self):
        class Pluggable:
            def __init__(self, *a):
                pass

        def refuse(a):
            raise RuntimeError("Can't swap an already initialized allocator")
        mem = torch.cuda.memory
        saved = self.patched([(torch.cuda, "is_initialized", lambda: False),
                              (mem, "CUDAPluggableAllocator", Pluggable),
                              (mem, "change_current_allocator", refuse)])
        try:
            with self.assertRaisesRegex(memtrace.MemtraceError,
                                        "after CUDA allocations: torch refused .*initialized"):
                memtrace.enable_for_torch()
        finally:
            self.undo(saved)

    def test_after_cuda_allocations_is_a_clear_error(self):
        # torch with CUDA whose allocator already holds memory, as far as enable() can see
        # (this machine has no GPU: the state is stood in for through torch's own calls).
        saved = {}
        cuda, mem = torch.cuda, torch.cuda.memory
        patches = [(cuda, "is_available", lambda: True), (cuda, "is_initialized", lambda: True),
                   (cuda, "memory_reserved", lambda *a: 2 << 20),
                   (torch.backends.cuda, "is_built", lambda: True),
                   (mem, "CUDAPluggableAllocator", object)]
        for obj, name, val in patches:
            saved[(obj, name)] = getattr(obj, name, None)
            setattr(obj, name, val)
        try:
            with self.assertRaisesRegex(memtrace.MemtraceError,
                                        "after CUDA allocations: .* holds 2097152 bytes"):
                memtrace.enable_for_torch()
        finally:
            for (obj, name), val in saved.items():
                if val is None:
                    delattr(obj, name)
                else:
                    setattr(obj, name, val)


if __name__ == "__main__":
    unittest.main(verbosity=2)
