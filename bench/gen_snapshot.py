#!/usr/bin/env python3
"""Writes a large PyTorch 2.x memory snapshot (the pickle of torch.cuda.memory._dump_snapshot),
deterministic from a seed, for the large-snapshot benchmark and the bounded-memory test.

The layout is PyTorch's: {'segments': [...], 'device_traces': [[entry, ...], ...],
'allocator_settings': {...}, 'external_annotations': [...]}, every trace entry a dict of
action, addr, size, stream, time_us (epoch microseconds) and frames: ~20 C++ frames with '??'
files (torch::unwind::unwind(), the c10 caching allocator, ATen) then the user's Python
frames. Frames are separate dicts in every entry, as PyTorch 2.0 builds them (2.1 and later
share frame dicts through the pickle memo: --share-frames writes that layout); strings are
shared through the memo as pickle.dump shares equal str objects.

The file is written opcode by opcode as pickle.dump (protocol 4, framed) writes that object,
without building it in memory: --check compares pickle.load of a small file with the object
built the ordinary way.

  gen_snapshot.py OUT [--entries N | --size-mb M] [--seed S] [--devices D] [--share-frames]
"""
import argparse
import io
import pickle
import random
import struct
import sys

CPP_TOP = [
    ("torch::unwind::unwind()", "??"),
    ("torch::CapturedTraceback::gather(bool, bool, bool)", "??"),
    ("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, "
     "unsigned long, CUstream_st*)", "CUDACachingAllocator.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed "
     "char, unsigned long, CUstream_st*)", ""),
    ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
     ""),
    ("at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, c10::Allocator*, "
     "c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)", ""),
    ("at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, "
     "c10::ScalarType, std::optional<c10::MemoryFormat>)", "??"),
    ("at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)", "??"),
]
OPS = ["mm", "addmm", "bmm", "softmax", "gelu", "layer_norm", "add", "mul", "div", "index",
       "cat", "dropout", "embedding", "matmul", "linear", "conv2d", "sum", "mean", "exp", "sqrt"]
PY_TAIL = [
    ("_PyEval_EvalFrameDefault", "??"), ("PyEval_EvalCode", "??"), ("run_eval_code_obj", "??"),
    ("pyrun_file", "??"), ("Py_RunMain", "??"), ("Py_BytesMain", "??"),
    ("__libc_start_main", "??"), ("_start", "??"),
]
USER_FILES = ["/home/user/project/model/transformer.py", "/home/user/project/model/attention.py",
              "/home/user/project/train.py", "/usr/lib/python3/site-packages/torch/nn/modules/"
              "module.py", "/usr/lib/python3/site-packages/torch/optim/adamw.py"]
USER_FUNCS = ["forward", "_call_impl", "_wrapped_call_impl", "step", "train_step", "main",
              "attention", "mlp", "backward", "<module>"]


def make_stacks(rng, n):
    """n distinct call stacks of frames (name, filename, line), innermost first."""
    stacks = []
    for i in range(n):
        op = OPS[i % len(OPS)]
        fr = [(n_, f, 0) for n_, f in CPP_TOP]
        fr += [(f"at::native::{op}_out_cuda(at::Tensor const&, at::Tensor&)", "??", 0),
               (f"at::(anonymous namespace)::wrapper_CUDA_{op}(at::Tensor const&)",
                "RegisterCUDA.cpp", 0),
               (f"at::_ops::{op}::redispatch(c10::DispatchKeySet, at::Tensor const&)", "??", 0),
               (f"torch::autograd::VariableType::(anonymous namespace)::{op}(c10::DispatchKeySet, "
                "at::Tensor const&)", "VariableType_1.cpp", 0),
               (f"at::_ops::{op}::call(at::Tensor const&)", "??", 0),
               (f"torch::autograd::THPVariable_{op}(_object*, _object*, _object*)",
                "python_variable_methods.cpp", 0),
               ("_PyObject_Call_Prepend", "??", 0), ("slot_tp_call", "??", 0)]
        depth = 10 + rng.randrange(9)
        for d in range(depth):
            fr.append((USER_FUNCS[rng.randrange(len(USER_FUNCS))],
                       USER_FILES[rng.randrange(len(USER_FILES))], 10 + rng.randrange(500)))
            fr.append(("_PyEval_EvalFrameDefault", "??", 0))
        fr += [(a, b, 0) for a, b in PY_TAIL]
        stacks.append(fr)
    return stacks


class Plan:
    """The snapshot's content, produced lazily: trace entries device by device."""

    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.stacks = make_stacks(self.rng, args.stacks)
        self.shared = {}
        self.frames_lists = {}  # stack -> its list when frames are shared
        rng = self.rng
        self.streams = [0, 94_000_000_000_000 + rng.randrange(1 << 20) * 16,
                        94_100_000_000_000 + rng.randrange(1 << 20) * 16]
        self.base = 0x7F00_0000_0000 + (args.seed % 64) * (1 << 36)
        self.seg_size = 20 << 20
        self.t0 = 1_748_730_219_596_671 + args.seed * 1000
        self.t = self.t0

    def frames(self, i):
        if self.args.share_frames:
            return [self.shared.setdefault(f, {"name": f[0], "filename": f[1], "line": f[2]})
                    for f in self.stacks[i]]
        return [{"name": n, "filename": f, "line": ln} for n, f, ln in self.stacks[i]]

    def count(self, d):
        a = self.args
        return a.entries // a.devices + (1 if d < a.entries % a.devices else 0)

    def trace(self, d):
        """Device d's entries, as (entry dict without frames, stack index)."""
        rng, seg_size, streams = self.rng, self.seg_size, self.streams
        n = self.count(d)
        made = 0
        live = []
        nseg = 0
        dbase = self.dbase(d)
        cursor = 0
        while made < n:
            self.t += 1 + rng.randrange(40)
            t = self.t
            r = rng.random()
            st = rng.randrange(len(self.stacks))
            if r < 0.002 or nseg == 0:
                addr = dbase + nseg * seg_size
                action = "segment_map" if rng.random() < 0.1 else "segment_alloc"
                made += 1
                yield {"action": action, "addr": addr, "size": seg_size,
                       "stream": streams[nseg % 3], "time_us": t}, st
                cursor = nseg * seg_size
                nseg += 1
                continue
            if (r < 0.5 or not live) and len(live) < 4000:
                size = 512 * (1 + rng.randrange(2048))
                if cursor + size > nseg * seg_size:
                    cursor = nseg * seg_size
                    addr = dbase + nseg * seg_size
                    made += 1
                    yield {"action": "segment_alloc", "addr": addr, "size": seg_size,
                           "stream": streams[nseg % 3], "time_us": t}, st
                    nseg += 1
                    continue
                addr = dbase + cursor
                cursor += size
                s = streams[rng.randrange(3)]
                live.append((addr, size, s, st))
                made += 1
                yield {"action": "alloc", "addr": addr, "size": size, "stream": s,
                       "time_us": t}, st
            else:
                addr, size, s, st2 = live.pop(rng.randrange(len(live)))
                made += 1
                yield {"action": "free_requested", "addr": addr, "size": size, "stream": s,
                       "time_us": t}, st2
                if made < n:
                    self.t += 1
                    made += 1
                    yield {"action": "free_completed", "addr": addr, "size": size, "stream": s,
                           "time_us": self.t}, st2
            if nseg > 4 and rng.random() < 0.0005 and made < n:
                made += 1
                yield {"action": "segment_unmap", "addr": dbase + (nseg - 1) * seg_size,
                       "size": seg_size, "stream": 0, "time_us": t}, st

    def dbase(self, d):
        return self.base + d * (1 << 40)

    def segments(self):
        seg_size, segments = self.seg_size, []
        for d in range(self.args.devices):
            dbase = self.dbase(d) + (1 << 39)
            blocks, off = [], 0
            for k in range(40):
                sz = seg_size // 40
                state = "active_allocated" if k % 3 else "inactive"
                blocks.append({"address": dbase + off, "size": sz, "requested_size": sz - 16,
                               "state": state,
                               "frames": self.frames(k % len(self.stacks)) if k % 3 else []})
                off += sz
            alloc = sum(b["size"] for b in blocks if b["state"] != "inactive")
            segments.append({"device": d, "address": dbase, "total_size": seg_size,
                             "allocated_size": alloc, "active_size": alloc,
                             "requested_size": 0, "stream": 0, "segment_type": "large",
                             "segment_pool_id": (0, 0), "is_expandable": False,
                             "frames": self.frames(0), "blocks": blocks})
        return segments

    def settings(self):
        return {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                "garbage_collection_threshold": 0.0, "expandable_segments": False}

    def annotations(self):
        return [{"stage": "START", "name": "step", "device": 0, "time_us": self.t0},
                {"stage": "END", "name": "step", "device": 0, "time_us": self.t}]


def model(args):
    """The snapshot as Python objects (small sizes only: --check)."""
    p = Plan(args)
    segs = p.segments()
    traces = []
    for d in range(args.devices):
        tr = []
        for e, st in p.trace(d):
            e["frames"] = p.frames(st)
            tr.append(e)
        traces.append(tr)
    return {"segments": segs, "device_traces": traces, "allocator_settings": p.settings(),
            "external_annotations": p.annotations()}


class Writer:
    """pickle.dump's protocol 4 output for plain data, written as it goes: the memo shares
    objects by identity as pickle does (the caller passes the same objects), frames of
    about 64 KiB."""

    def __init__(self, out, track_dicts=False):
        self.out = out
        self.track_dicts = track_dicts
        self.buf = io.BytesIO()
        self.memo = {}  # id(obj) -> index, for the objects pickle would meet again
        self.n = 0  # memo entries so far
        self.keep = []  # keeps memoized objects alive so ids stay unique
        self.out.write(b"\x80\x04")

    def commit(self, force=False):
        n = self.buf.tell()
        if n >= 65536 or (force and n):
            data = self.buf.getvalue()
            self.out.write(b"\x95" + struct.pack("<Q", len(data)))
            self.out.write(data)
            self.buf.seek(0)
            self.buf.truncate()

    def memoize(self, obj, track=False):
        """The next memo index goes to obj; only objects pickle would meet again (strings,
        tuples, shared frame dicts: all kept alive by the plan) are looked up later."""
        if track:
            self.memo[id(obj)] = self.n
            self.keep.append(obj)
        self.n += 1
        self.buf.write(b"\x94")

    def get(self, obj):
        i = self.memo.get(id(obj))
        if i is None:
            return False
        self.buf.write(b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i))
        return True

    def entry(self, e, st, p, cache):
        w = self.buf.write
        w(b"}")
        self.memoize(e)
        w(b"(")
        for k, v in e.items():
            self.save(k)
            self.save(v)
        self.save("frames")
        c = cache.get(st)
        if c is not None:
            w(c[0])
            self.n += c[1]
        else:
            pos, n0, t0 = self.buf.tell(), self.n, len(self.memo)
            self.save(p.frames(st))
            if len(self.memo) == t0:
                cache[st] = (self.buf.getvalue()[pos:], self.n - n0)
        w(b"u")

    def save(self, obj):
        w = self.buf.write
        if obj is None:
            w(b"N")
        elif obj is True or obj is False:
            w(b"\x88" if obj else b"\x89")
        elif isinstance(obj, int):
            if 0 <= obj < 256:
                w(b"K" + bytes([obj]))
            elif 0 <= obj < 65536:
                w(b"M" + struct.pack("<H", obj))
            elif -(1 << 31) <= obj < (1 << 31):
                w(b"J" + struct.pack("<i", obj))
            else:
                b = obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True)
                w(b"\x8a" + bytes([len(b)]) + b)
        elif isinstance(obj, float):
            w(b"G" + struct.pack(">d", obj))
        elif isinstance(obj, str):
            if self.get(obj):
                return
            b = obj.encode("utf-8", "surrogatepass")
            w((b"\x8c" + bytes([len(b)]) if len(b) < 256 else b"X" + struct.pack("<I", len(b)))
              + b)
            self.memoize(obj, True)
        elif isinstance(obj, tuple):
            if self.get(obj):
                return
            for x in obj:
                self.save(x)
            if len(obj) == 2:
                w(b"\x86")
            else:
                raise ValueError("tuples of 2 only")
            self.memoize(obj, True)
        elif isinstance(obj, list):
            if self.get(obj):
                return
            w(b"]")
            self.memoize(obj)
            self.items(obj, b"e", b"a", lambda x: self.save(x))
        elif isinstance(obj, dict):
            if self.get(obj):
                return
            w(b"}")
            self.memoize(obj, self.track_dicts)
            self.items(list(obj.items()), b"u", b"s", lambda kv: (self.save(kv[0]),
                                                                  self.save(kv[1])))
        else:
            raise TypeError(type(obj))

    def items(self, seq, many, one, save1):
        for i in range(0, len(seq), 1000):
            batch = seq[i:i + 1000]
            if len(batch) > 1:
                self.buf.write(b"(")
                for x in batch:
                    save1(x)
                self.buf.write(many)
            else:
                save1(batch[0])
                self.buf.write(one)

    def finish(self):
        self.buf.write(b".")
        self.commit(force=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--entries", type=int, default=None)
    ap.add_argument("--size-mb", type=float, default=None,
                    help="about this many MB (entries estimated from the bytes per entry; default 1000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--stacks", type=int, default=600, help="distinct call stacks")
    ap.add_argument("--share-frames", action="store_true")
    ap.add_argument("--check", action="store_true",
                    help="also build the object and compare pickle.load of OUT with it")
    args = ap.parse_args()
    if args.entries is None:
        per = 222 if args.share_frames else 930  # bytes per entry, measured
        args.entries = int((args.size_mb or 1000) * 1e6 / per)
    with open(args.out, "wb") as f:
        write_stream(args, f)
    if args.check:
        with open(args.out, "rb") as f:
            got = pickle.load(f)
        want = model(args)
        if got != want:
            sys.exit("gen_snapshot: the file does not load as the snapshot it should be")
        print("gen_snapshot: pickle.load matches", file=sys.stderr)


def write_stream(args, out):
    """The snapshot written with its trace lists produced entry by entry, so a 1 GB file
    takes no more memory than its strings and stacks. Equal, as loaded data, to
    pickle.dump(model(args))."""
    p = Plan(args)
    w = Writer(out, track_dicts=args.share_frames)
    w.buf.write(b"}")
    w.memoize(None)
    w.buf.write(b"(")
    w.save("segments")
    w.save(p.segments())
    w.save("device_traces")
    w.buf.write(b"]")
    w.memoize(None)
    if args.devices > 1:
        w.buf.write(b"(")
    cache = {}
    for d in range(args.devices):
        n = p.count(d)
        w.buf.write(b"]")
        w.memoize(None)
        k = 0
        batch_open = False
        for e, st in p.trace(d):
            if k % 1000 == 0 and n - k > 1:
                w.buf.write(b"(")
                batch_open = True
            w.entry(e, st, p, cache)
            w.commit()
            k += 1
            if k % 1000 == 0 or k == n:
                w.buf.write(b"e" if batch_open else b"a")
                batch_open = False
                w.commit()
    if args.devices > 1:
        w.buf.write(b"e")
    else:
        w.buf.write(b"a")
    w.save("allocator_settings")
    w.save(p.settings())
    w.save("external_annotations")
    w.save(p.annotations())
    w.buf.write(b"u")
    w.finish()


if __name__ == "__main__":
    main()
