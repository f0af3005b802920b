#!/usr/bin/env python3
"""Writes tests/snapshot/data/v2_torch_frames.pickle (and frames_log.ndjson) with Python's standard pickle (no
torch): a PyTorch 2.x snapshot whose stacks look like real ones (torch::unwind::unwind()
and the other C++ frames with '??' files, the c10 allocator, ATen and the dispatcher,
CPython's eval loop, torch/nn/modules/module.py), about twenty frames before the user's,
and time_us in microseconds since the Unix epoch; and a memtrace log without tags whose
stack table has the same shape (torch's Python frames before the user's). test_frames.sh
reads both. Run it from
anywhere:

    python3 tests/snapshot/make_frames_snapshot.py
"""
import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "v2_torch_frames.pickle")
MiB = 1 << 20
T0 = 1748329299514852  # 2025-05-27, microseconds since the epoch
PY = "/usr/local/src/conda/python-3.11.9"
TORCH = "/opt/env/lib/python3.11/site-packages/torch"
USER = "/home/me/proj"


def f(name, filename="??", line=0):
    return {"name": name, "filename": filename, "line": line}


# The recorder and the allocator: never the site.
RECORDER = [
    f("torch::unwind::unwind()"),
    f("torch::CapturedTraceback::gather(bool, bool, bool)"),
    f("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
    f("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, "
      "unsigned long, CUstream_st*)", "CUDACachingAllocator.cpp"),
    f("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, "
      "signed char, unsigned long, CUstream_st*)", ""),
]


def aten(op):
    """ATen, the dispatcher and autograd's kernels for one operator."""
    return [
        f("at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, "
          "c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, "
          "std::optional<c10::MemoryFormat>)", ""),
        f("at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, "
          "std::optional<c10::Device>, std::optional<c10::MemoryFormat>)"),
        f("at::native::%s_cuda(at::Tensor const&, at::Tensor const&)" % op),
        f("at::(anonymous namespace)::(anonymous namespace)::wrapper_CUDA_%s(at::Tensor "
          "const&, at::Tensor const&)" % op, "RegisterCUDA.cpp"),
        f("c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::"
          "WrapFunctionIntoFunctor_<...>>::call(c10::OperatorKernel*, c10::DispatchKeySet)",
          "RegisterCUDA.cpp"),
        f("at::_ops::%s::redispatch(c10::DispatchKeySet, at::Tensor const&, at::Tensor "
          "const&)" % op),
        f("torch::autograd::VariableType::(anonymous namespace)::%s(c10::DispatchKeySet, "
          "at::Tensor const&, at::Tensor const&)" % op, "VariableType_3.cpp"),
        f("c10::impl::BoxedKernelWrapper<...>::call(c10::BoxedKernel const&)",
          "BoxedKernel_impl.h"),
        f("at::_ops::%s::call(at::Tensor const&, at::Tensor const&)" % op),
        f("torch::autograd::THPVariable_%s(_object*, _object*, _object*)" % op,
          "python_variable_methods.cpp"),
        f("cfunction_call", PY + "/Objects/methodobject.c", 537),
        f("_PyObject_MakeTpCall", PY + "/Objects/call.c", 214),
        f("_PyEval_EvalFrameDefault"),
    ]


def module_call():
    """nn.Module.__call__ between a model's forward and its caller."""
    return [
        f("_PyFunction_Vectorcall", PY + "/Objects/call.c", 419),
        f("_call_impl", TORCH + "/nn/modules/module.py", 1527),
        f("_PyEval_EvalFrameDefault"),
        f("_wrapped_call_impl", TORCH + "/nn/modules/module.py", 1518),
        f("_PyEval_EvalFrameDefault"),
        f("PyObject_Call"),
    ]


MAIN = [
    f("train_step", USER + "/train.py", 30),
    f("_PyEval_EvalFrameDefault"),
    f("<module>", USER + "/train.py", 80),
    f("PyEval_EvalCode", PY + "/Python/ceval.c", 1148),
    f("run_eval_code_obj", PY + "/Python/pythonrun.c", 1710),
    f("__libc_start_main"),
    f("_start"),
]

# forward (transformer.py:54) through three operators: three stacks, one site.
FWD = [RECORDER + aten(op) + [f("forward", USER + "/transformer.py", 54)] + module_call() + MAIN
       for op in ("mm", "addmm", "bmm")]
# A helper of the user's, called from forward (transformer.py:60): --skip-frames moves the
# site from it to its caller. Its file's line is PyTorch's SIZE_MAX ("unknown") below it.
HELPER = (RECORDER + aten("mul") + [f("scale", USER + "/my_utils.py", 7),
                                    f("_PyEval_EvalFrameDefault", "??", (1 << 64) - 1),
                                    f("forward", USER + "/transformer.py", 60)]
          + module_call() + MAIN)
# The loss: train.py:30 itself.
LOSS = RECORDER + aten("nll_loss") + MAIN
# Autograd's engine thread: no Python frame, every frame skipped.
BACKWARD = RECORDER + aten("mm_backward")[:9] + [
    f("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> "
      "const&)"),
    f("execute_native_thread_routine",
      "/opt/conda/gcc/libstdc++-v3/src/c++11/thread.cc", 82),
    f("start_thread"),
]


def ev(action, addr, size, t, frames=()):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": T0 + t,
            "frames": list(frames)}


def snapshot():
    base = 0x7F4000000000
    trace = [ev("segment_alloc", base, 1024 * MiB, 0, FWD[0])]
    addr, t = base, 10
    live = []
    for frames, size in ((FWD[0], 40 * MiB), (FWD[1], 30 * MiB), (FWD[2], 30 * MiB),
                         (HELPER, 24 * MiB), (LOSS, 20 * MiB), (BACKWARD, 8 * MiB)):
        trace.append(ev("alloc", addr, size, t, frames))
        live.append((addr, size))
        addr += size
        t += 1000
    # Back down after the peak: the loss is freed.
    trace.append(ev("free_requested", live[4][0], live[4][1], t))
    trace.append(ev("free_completed", live[4][0], live[4][1], t + 5))
    return {"segments": [], "device_traces": [trace],
            "external_annotations": [
                {"stage": "START", "name": "forward", "device": 0, "time_us": T0 + 5}]}


def log_lines():
    """memtrace's own capture of such a program: Python frames, no tags."""
    pid, lines, seq = 4242, [], 0
    conv = "/usr/lib/python3/dist-packages/torch/nn/modules/conv.py"
    mod = "/usr/lib/python3/dist-packages/torch/nn/modules/module.py"
    stacks = {
        1: [("_conv_forward", conv, 456), ("forward", conv, 460), ("_call_impl", mod, 1527),
            ("forward", USER + "/model.py", 12), ("main", USER + "/train.py", 40)],
        2: [("_call_impl", mod, 1527), ("forward", USER + "/model.py", 12),
            ("main", USER + "/train.py", 40)],
        3: [("loss", USER + "/model.py", 30), ("main", USER + "/train.py", 41)],
    }
    lines.append({"v": 1, "type": "hello", "pid": pid, "name": "train",
                  "start_realtime_ns": T0 * 1000, "start_mono_ns": 1000})
    for sid, frames in stacks.items():
        lines.append({"v": 1, "kind": "stack", "pid": pid, "id": sid,
                      "frames": [{"py": fn, "file": fl, "line": ln} for fn, fl, ln in frames]})
    base, allocated = 0x7F0000000000, 0

    def event(kind, addr, size, **extra):
        nonlocal seq
        e = {"v": 1, "type": "event", "seq": seq, "t_ns": 2000 + seq, "pid": pid, "dev": 0,
             "kind": kind, "addr": "0x%x" % addr, "size": size, "requested": size,
             "pool": "large", "tag": "other", "tag_id": 0, "stream": 0,
             "allocated": allocated, "reserved": 64 * MiB}
        e.update(extra)
        seq += 1
        return e

    lines.append(event("segment_alloc", base, 64 * MiB, requested=0))
    for sid, size in ((1, 8 * MiB), (2, 4 * MiB), (3, 2 * MiB)):
        addr = base + allocated
        lines.append({k: v for k, v in event("stack_ref", addr, 0).items()
                      if k not in ("size", "requested", "tag", "tag_id", "stream",
                                   "allocated", "reserved")} | {"stack": sid})
        allocated += size
        lines.append(event("alloc", addr, size, stack=sid))
    return lines


if __name__ == "__main__":
    with open(OUT, "wb") as out:
        pickle.dump(snapshot(), out, protocol=4)
    import json
    with open(os.path.join(HERE, "data", "frames_log.ndjson"), "w") as out:
        for line in log_lines():
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
