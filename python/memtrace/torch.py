"""memtrace for PyTorch: memtrace as torch's CUDA allocator, and allocations tagged by
module (forward) and as gradients (backward).

    import memtrace, memtrace.torch
    memtrace.enable_for_torch()            # before any CUDA allocation
    handle = memtrace.torch.tag_modules(model)
"""
import ctypes
import threading
import warnings

import torch as _torch

import memtrace as _mt
from . import _lib
from ._errors import MemtraceError

__all__ = ["enable", "tag_modules", "ModuleTags"]

# Optional entry points of torch's CUDAPluggableAllocator (torch >= 2.1 has setters for
# them on allocator.allocator()), and ours that serve them. The pool ones give each
# torch.cuda.graph capture its private pool (memtrace also finds captures by asking the
# driver, for a torch without them: docs/allocator-pools.md).
_OPTIONAL = (("set_init_fn", "memtrace_init"), ("set_reset_fn", "memtrace_reset"),
             ("set_memory_fraction_fn", "memtrace_memory_fraction"),
             ("set_base_alloc_fn", "memtrace_base_alloc"),
             ("set_record_stream_fn", "memtrace_record_stream"),
             ("set_begin_allocate_to_pool", "memtrace_begin_allocate_to_pool"),
             ("set_end_allocate_to_pool_fn", "memtrace_end_allocate_to_pool"),
             ("set_release_pool", "memtrace_release_pool"))


def enable():
    """See memtrace.enable_for_torch()."""
    cuda = _torch.cuda
    if not (_torch.backends.cuda.is_built() if hasattr(_torch.backends, "cuda") else False) \
            or not cuda.is_available():
        raise MemtraceError(
            "memtrace.enable_for_torch(): this torch (%s) has no CUDA (%s); memtrace serves "
            "torch's CUDA allocations only. Tags and marks still work for programs that "
            "allocate through libcudart under `memtrace run`."
            % (_torch.__version__, "built without CUDA" if not _torch.version.cuda
               else "no CUDA device visible"))
    mem = cuda.memory
    if not hasattr(mem, "CUDAPluggableAllocator"):
        raise MemtraceError("memtrace.enable_for_torch(): torch %s has no "
                            "CUDAPluggableAllocator (torch >= 2.0 needed)" % _torch.__version__)
    held = cuda.memory_reserved() if cuda.is_initialized() else 0
    if held > 0:
        raise MemtraceError(
            "memtrace.enable_for_torch() after CUDA allocations: torch's allocator already "
            "holds %d bytes; call it at the start of the program, before the first tensor "
            "is put on the GPU" % held)
    L = _lib.lib()
    path = _mt.library_path()
    alloc = mem.CUDAPluggableAllocator(path, "memtrace_alloc", "memtrace_free")
    native = alloc.allocator() if callable(getattr(alloc, "allocator", None)) \
        else getattr(alloc, "_allocator", None)
    for setter, sym in _OPTIONAL:
        fn = getattr(native, setter, None)
        if callable(fn):
            fn(ctypes.cast(getattr(L, sym), ctypes.c_void_p).value)
    try:
        mem.change_current_allocator(alloc)
    except RuntimeError as e:
        raise MemtraceError("memtrace.enable_for_torch() after CUDA allocations: torch "
                            "refused to swap its allocator (%s); call it before the first "
                            "tensor is put on the GPU" % e) from e
    return alloc


# ---- tagging by module ----

def _label(qualname):
    """A module's tag name: its qualified name, or its tail when longer than consumers
    keep (24 bytes): "...layers.3.self_attn" stays telling where a cut head would not."""
    b = qualname.encode("utf-8")
    if len(b) <= _mt.LABEL_MAX:
        return qualname
    tail = b[-(_mt.LABEL_MAX - 3):].decode("utf-8", "ignore")
    return "..." + tail.lstrip(".")


class ModuleTags:
    """What tag_modules() installed: .tags maps qualified module names to tag names;
    .untagged lists modules that share an ancestor's tag; remove() takes the hooks out."""

    def __init__(self):
        self.tags = {}
        self.untagged = []
        self._handles = []

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles.clear()


def tag_modules(model, root="model", grad_tag="grads", max_depth=None):
    """Tags each module's forward allocations with its qualified name ("encoder.lstm";
    the root module's with `root`) and the backward pass's with grad_tag (a tag name;
    None: the module whose backward began last). Hooks: forward pre/post on each module,
    a hook on its outputs' gradients for the backward. Modules deeper than max_depth,
    or past the 25 user tags (registered breadth first), share their parent's tag.
    The root's forward is wrapped in try/finally (an instance attribute), so that an
    exception leaves the thread's tag as it was; remove() takes everything out."""
    L = _lib.lib()
    push, pop, depth = L.memtrace_tag_push, L.memtrace_tag_pop, L.memtrace_tag_depth
    out = ModuleTags()
    mods = sorted(model.named_modules(), key=lambda nm: (nm[0].count(".") if nm[0] else -1))
    ids = {}
    for name, mod in mods:
        d = name.count(".") + 1 if name else 0
        if max_depth is not None and d > max_depth:
            out.untagged.append(name)
            continue
        try:
            ids[mod] = _mt.register_tag(_label(name) if name else root)
            out.tags[name] = _label(name) if name else root
        except MemtraceError:
            out.untagged.append(name)
    if out.untagged and max_depth is None:
        warnings.warn("memtrace.torch.tag_modules: %d modules share an ancestor's tag (the "
                      "25 user tags are taken): %s" % (len(out.untagged),
                                                       ", ".join(out.untagged[:5])))
    gid = _mt.register_tag(grad_tag) if grad_tag is not None else None
    local = threading.local()
    bwd = {}  # thread ident -> tag to restore when its backward ends

    def stack():
        st = getattr(local, "stack", None)
        if st is None:
            st = local.stack = []
        return st

    def unwind(d):
        while depth() > d:
            pop()

    def pre(mod, args):
        stack().append(depth())
        rc = push(ids[mod])
        if rc:
            stack().pop()
            _mt._raise_push(rc, out.tags.get(name_of[mod], "?"))

    def post(mod, args, output):
        if mod is not model:
            st = stack()
            unwind(st.pop() if st else depth())
        if _torch.is_grad_enabled():
            hook = _backward_hook(gid if gid is not None else ids.get(mod, 0))
            for t in _tensors(output):
                # A tensor a submodule returned already says whose backward begins.
                if t.requires_grad and not getattr(t, "_memtrace_hooked", False):
                    t.register_hook(hook)
                    t._memtrace_hooked = True

    # The root's forward runs inside try/finally, so that an exception raised in any
    # module (whose post hooks then never run) leaves the thread's tags as they were.
    root_forward = model.forward
    root_id = ids.get(model)

    def forward(*args, **kwargs):
        st, d = stack(), depth()
        n = len(st)
        if root_id is not None:
            rc = push(root_id)
            if rc:
                _mt._raise_push(rc, root)
        try:
            return root_forward(*args, **kwargs)
        finally:
            unwind(d)
            del st[n:]

    def _backward_hook(tid):
        def on_grad(grad):
            me = threading.get_ident()
            if me not in bwd:
                bwd[me] = L.memtrace_tag_current()
                _torch.autograd.Variable._execution_engine.queue_callback(
                    lambda: _restore(me))
            L.memtrace_tag_set(tid)
            return None
        return on_grad

    def _restore(me):
        prev = bwd.pop(me, None)
        if prev is not None and threading.get_ident() == me:
            L.memtrace_tag_set(prev)

    name_of = {mod: name for name, mod in mods}
    for mod in ids:
        if mod is not model:
            out._handles.append(mod.register_forward_pre_hook(pre))
    for mod in ids.keys() | {model}:
        out._handles.append(mod.register_forward_hook(post))
    model.forward = forward
    out._handles.append(_Restore(model))
    return out


class _Restore:
    """Takes the try/finally wrapper off the root's forward."""

    def __init__(self, model):
        self.model = model

    def remove(self):
        self.model.__dict__.pop("forward", None)


def _tensors(x):
    if isinstance(x, _torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)
