#!/usr/bin/env python3
"""Writes the snapshot test files of tests/snapshot/data with Python's standard pickle
(no torch): PyTorch's layouts written out by hand from docs/torch-snapshot.md, and
malformed files, each beside a .expected file holding the exit status and a piece of the
message `memtrace replay` must print. Run it from anywhere; it rewrites the data folder:

    python3 tests/snapshot/make_snapshots.py
"""
import os
import pickle
import pickletools
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
MiB = 1 << 20


def frame(name, filename, line):
    return {"name": name, "filename": filename, "line": line}


# Shared frame lists: pickle memoizes them, as in a real snapshot where one traceback
# object is referenced by every event it produced.
TRAIN = [frame("forward", "/work/model.py", 41), frame("train_step", "/work/train.py", 12)]
LOSS = [frame("loss", "/work/model.py", 77), frame("train_step", "/work/train.py", 14)]
OPT = [frame("step", "/usr/lib/torch/optim/adam.py", 150)]


def ev(action, addr, size, stream=0, t=0, frames=None, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t}
    if action == "oom":
        del e["addr"]
        e["device_free"] = addr
    e["frames"] = frames if frames is not None else []
    e.update(extra)
    return e


def v2_snapshot():
    """Two devices; every action; a large, a small and an expandable segment."""
    L = 0x7F0000000000  # large segment, 20 MiB
    S = 0x7F0001400000  # small segment, 2 MiB
    X = 0x7F1000000000  # device 1, expandable
    d0 = [
        ev("segment_alloc", L, 20 * MiB, t=100, frames=TRAIN),
        ev("alloc", L, 4 * MiB, t=101, frames=TRAIN),
        ev("alloc", L + 4 * MiB, 6 * MiB - 100, t=102, frames=TRAIN),
        ev("segment_alloc", S, 2 * MiB, t=103, frames=LOSS),
        ev("alloc", S, 1000, t=104, frames=LOSS),
        ev("alloc", S + 1024, 512, t=105, frames=LOSS),
        ev("free_requested", S, 1000, t=106, frames=LOSS),
        ev("free_completed", S, 1000, t=107, frames=LOSS),
        ev("oom", 1 * MiB, 40 * MiB, t=108, frames=OPT),
        ev("free_requested", L, 4 * MiB, t=109),
        ev("free_completed", L, 4 * MiB, t=110),
        ev("snapshot", 0, 0, t=111),
        ev("alloc", L, 8 * MiB, t=112, frames=OPT),
        ev("free_requested", L + 4 * MiB, 6 * MiB - 100, t=113),  # never completed
        ev("free_requested", 0x7E0000000000, 4096, t=114),  # allocated before the trace
        ev("free_completed", 0x7E0000000000, 4096, t=115),
        ev("annotate", L, 0, t=116, user_metadata="step 3"),  # newer action: skipped
    ]
    d1 = [
        ev("segment_map", X, 2 * MiB, stream=7, t=200, frames=TRAIN),
        ev("alloc", X, 1536 * 1024, stream=7, t=201, frames=TRAIN),
        ev("segment_map", X + 2 * MiB, 2 * MiB, stream=7, t=202),
        ev("alloc", X + 1536 * 1024, 2 * MiB, stream=7, t=203, frames=LOSS),
        ev("free_requested", X, 1536 * 1024, stream=7, t=204),
        ev("free_completed", X, 1536 * 1024, stream=7, t=205),
        ev("segment_unmap", X, 1 * MiB, stream=7, t=206),
        ev("segment_alloc", X + 64 * MiB, 2 * MiB, stream=7, t=207),
        ev("segment_free", X + 64 * MiB, 2 * MiB, stream=7, t=208),
    ]
    segments = [
        {
            "device": 0, "address": L, "total_size": 20 * MiB,
            "allocated_size": 8 * MiB, "active_size": 14 * MiB - 100 + 100,
            "requested_size": 8 * MiB, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": TRAIN,
            "blocks": [
                {"address": L, "size": 8 * MiB, "requested_size": 8 * MiB,
                 "state": "active_allocated", "frames": OPT},
                {"address": L + 8 * MiB, "size": 6 * MiB, "requested_size": 6 * MiB - 100,
                 "state": "active_pending_free", "frames": TRAIN},
                {"address": L + 14 * MiB, "size": 6 * MiB, "requested_size": 0,
                 "state": "inactive", "frames": []},
            ],
        },
        {
            "device": 0, "address": S, "total_size": 2 * MiB, "allocated_size": 512,
            "active_size": 512, "requested_size": 512, "stream": 0,
            "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": LOSS,
            "blocks": [
                {"address": S, "size": 1024, "requested_size": 0, "state": "inactive",
                 "frames": []},
                {"address": S + 1024, "size": 512, "requested_size": 512,
                 "state": "active_allocated", "frames": LOSS},
                {"address": S + 1536, "size": 2 * MiB - 1536, "requested_size": 0,
                 "state": "inactive", "frames": []},
            ],
        },
        {
            "device": 1, "address": X + 1 * MiB, "total_size": 3 * MiB,
            "allocated_size": 2 * MiB, "active_size": 2 * MiB, "requested_size": 2 * MiB,
            "stream": 7, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": True, "frames": [],
            "blocks": [
                {"address": X + 1 * MiB, "size": 512 * 1024, "requested_size": 0,
                 "state": "inactive", "frames": []},
                {"address": X + 1536 * 1024, "size": 2 * MiB, "requested_size": 2 * MiB,
                 "state": "active_allocated", "frames": LOSS},
                {"address": X + 3584 * 1024, "size": 512 * 1024, "requested_size": 0,
                 "state": "inactive", "frames": []},
            ],
        },
    ]
    return {
        "segments": segments,
        "device_traces": [d0, d1],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            "max_split_size": -1, "garbage_collection_threshold": 0.0,
            "expandable_segments": True, "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False, "pinned_num_register_threads": 1,
            "roundup_power2_divisions": {"1": 0, "2": 0},
        },
        "external_annotations": [
            {"stage": "START", "name": "forward", "device": 0, "time_us": 100},
            {"stage": "END", "name": "forward", "device": 0, "time_us": 105},
            {"stage": "START", "name": "optimizer", "device": 0, "time_us": 108},
        ],
    }


def midrun_snapshot():
    """A trace that begins in the middle of a run, as PyTorch's max_entries ring leaves most
    (8 of 11 public snapshots fetched had no segment_alloc for most of their segments): the
    weights and a 20 MiB segment from before it, a block allocated before it and freed in it
    (its free's stack names where it was dropped, not made), a block it allocated that is
    2 MiB at the end for a 1.5 MiB request."""
    A = 0x7F3000000000  # large, made before the trace
    S = A + 32 * MiB  # small, made and emptied in the trace
    INIT = [frame("__init__", "/work/model.py", 10)]
    # With context='all', PyTorch records a free's own stack: where the tensor was dropped.
    FREED = [
        frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free("
              "c10::cuda::CUDACachingAllocator::Native::Block*)", "CUDACachingAllocator.cpp", 0),
        frame("c10::TensorImpl::~TensorImpl()", "TensorImpl.cpp", 0),
        frame("THPVariable_clear(THPVariable*)", "python_variable.cpp", 0),
        frame("forward", "/work/model.py", 101),
    ]
    trace = [
        ev("free_requested", A + 12 * MiB, 4 * MiB, t=1000, frames=FREED),
        ev("free_completed", A + 12 * MiB, 4 * MiB, t=1001, frames=FREED),
        ev("alloc", A + 8 * MiB, 1536 * 1024, t=1002, frames=LOSS),
        ev("alloc", A + 12 * MiB, 1 * MiB, t=1003, frames=OPT),
        ev("free_requested", A + 12 * MiB, 1 * MiB, t=1004, frames=OPT),
        ev("free_completed", A + 12 * MiB, 1 * MiB, t=1005, frames=OPT),
        ev("segment_alloc", S, 2 * MiB, t=1006),
        ev("alloc", S, 512, t=1007, frames=LOSS),
        ev("free_requested", S, 512, t=1008, frames=LOSS),
        ev("free_completed", S, 512, t=1009, frames=LOSS),
    ]
    segments = [
        {"device": 0, "address": A, "total_size": 20 * MiB, "allocated_size": 10 * MiB,
         "active_size": 10 * MiB, "requested_size": 8 * MiB + 1536 * 1024, "stream": 0,
         "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
         "frames": INIT,
         "blocks": [
             {"address": A, "size": 8 * MiB, "requested_size": 8 * MiB,
              "state": "active_allocated", "frames": INIT},
             {"address": A + 8 * MiB, "size": 2 * MiB, "requested_size": 1536 * 1024,
              "state": "active_allocated", "frames": LOSS},
             {"address": A + 10 * MiB, "size": 10 * MiB, "requested_size": 0,
              "state": "inactive", "frames": []},
         ]},
        {"device": 0, "address": S, "total_size": 2 * MiB, "allocated_size": 0,
         "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "small",
         "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
         "blocks": [{"address": S, "size": 2 * MiB, "requested_size": 0, "state": "inactive",
                     "frames": []}]},
    ]
    return {"segments": segments, "device_traces": [trace]}


def expandable_midrun_snapshot():
    """A trace begun in the middle of a run with expandable segments (PyTorch 2.1+): the
    trace unmaps pages that were mapped before it and maps pages that were not. PyTorch lists
    each mapped run as a segment. Before the trace: [X, X + 4 MiB) with the weights' 4 MiB
    block, and [X + 6, X + 8 MiB), unmapped at its first event; at the end one run
    [X, X + 6 MiB), its last 2 MiB mapped by the trace."""
    X = 0x7F4000000000
    INIT = [frame("__init__", "/work/model.py", 10)]
    trace = [
        ev("segment_unmap", X + 6 * MiB, 2 * MiB, t=2000),
        ev("segment_map", X + 4 * MiB, 2 * MiB, t=2001),
        ev("alloc", X + 4 * MiB, 1 * MiB, t=2002, frames=LOSS),
    ]
    segments = [
        {"device": 0, "address": X, "total_size": 6 * MiB, "allocated_size": 5 * MiB,
         "active_size": 5 * MiB, "requested_size": 5 * MiB, "stream": 0,
         "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": True,
         "frames": [],
         "blocks": [
             {"address": X, "size": 4 * MiB, "requested_size": 4 * MiB,
              "state": "active_allocated", "frames": INIT},
             {"address": X + 4 * MiB, "size": 1 * MiB, "requested_size": 1 * MiB,
              "state": "active_allocated", "frames": LOSS},
             {"address": X + 5 * MiB, "size": 1 * MiB, "requested_size": 0,
              "state": "inactive", "frames": []},
         ]},
    ]
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"expandable_segments": True}}


def v113_snapshot():
    """1.13: the list of segments; blocks have size, state and history, no address."""
    A = 0x7F2000000000
    return [
        {
            "device": 0, "address": A, "total_size": 20 * MiB, "allocated_size": 12 * MiB,
            "active_size": 12 * MiB, "stream": 0, "segment_type": "large",
            "blocks": [
                {"size": 4 * MiB, "state": "active_allocated",
                 "history": [{"addr": A, "real_size": 4 * MiB - 24, "frames": TRAIN}]},
                {"size": 8 * MiB, "state": "active_allocated",
                 "history": [{"addr": A + 4 * MiB, "real_size": 8 * MiB, "frames": LOSS},
                             {"addr": A + 4 * MiB, "real_size": 1 * MiB, "frames": OPT}]},
                {"size": 8 * MiB, "state": "inactive"},
            ],
        },
        {
            "device": 0, "address": A + 32 * MiB, "total_size": 2 * MiB,
            "allocated_size": 0, "active_size": 0, "stream": 0, "segment_type": "small",
            "blocks": [{"size": 2 * MiB, "state": "inactive"}],
        },
    ]


def v20_history_snapshot():
    """2.0: the dict, but blocks as in 1.13 (size, requested_size, state, history; no address
    and no frames of their own), and a trace whose one entry has no frames (a public
    snapshot taken at an OOM is such)."""
    A = 0x7F6000000000
    return {
        "segments": [
            {
                "device": 0, "address": A, "total_size": 20 * MiB, "allocated_size": 12 * MiB,
                "active_size": 12 * MiB, "requested_size": 12 * MiB - 24, "stream": 0,
                "segment_type": "large",
                "blocks": [
                    {"size": 4 * MiB, "requested_size": 4 * MiB - 24, "state": "active_allocated",
                     "history": [{"addr": A, "real_size": 4 * MiB - 24, "frames": TRAIN}]},
                    {"size": 8 * MiB, "requested_size": 8 * MiB, "state": "active_allocated",
                     "history": [{"addr": A + 4 * MiB, "real_size": 8 * MiB, "frames": LOSS}]},
                    {"size": 8 * MiB, "requested_size": 0, "state": "inactive",
                     "history": [{"addr": A + 12 * MiB, "real_size": 8 * MiB, "frames": OPT}]},
                ],
            },
        ],
        "device_traces": [[{"action": "snapshot", "addr": 0, "size": 12 * MiB - 24,
                            "stream": 0}]],
    }


def write(name, data, expected=None):
    path = os.path.join(DATA, name)
    with open(path, "wb") as f:
        f.write(data)
    if expected is not None:
        with open(path + ".expected", "w") as f:
            f.write(expected + "\n")


def main():
    os.makedirs(os.path.join(DATA, "invalid"), exist_ok=True)
    snap = v2_snapshot()
    for proto in (2, 3, 4, 5):
        write("v2_all_actions_p%d.pickle" % proto, pickle.dumps(snap, protocol=proto))
    write("v113_segments.pickle", pickle.dumps(v113_snapshot(), protocol=2))
    write("v113_segments_p4.pickle", pickle.dumps(v113_snapshot(), protocol=4))
    write("v20_history.pickle", pickle.dumps(v20_history_snapshot(), protocol=4))
    # A trace with no clock, as PyTorch wrote before its trace entries had time_us (a
    # public snapshot of a PEFT fine-tuning run is one): no time_us, no annotations.
    untimed = v2_snapshot()
    for trace in untimed["device_traces"]:
        for e in trace:
            del e["time_us"]
    del untimed["external_annotations"]
    write("v2_untimed.pickle", pickle.dumps(untimed, protocol=4))
    # Segments alone, as torch.cuda.memory._snapshot() gives them when no history was being
    # recorded (public snapshots of a diffusion pipeline are such): an empty trace per
    # device, device 1 with no segment; one block allocated on autograd's engine thread
    # (a cuBLAS workspace of AddmmBackward0), its stack ending in a conda build's libstdc++
    # and an Ubuntu glibc's relative paths.
    state = v2_snapshot()
    state["segments"] = [g for g in state["segments"] if g["device"] == 0]
    state["device_traces"] = [[], []]
    del state["external_annotations"]
    state["segments"][1]["blocks"][1]["frames"] = [
        frame("torch::unwind::unwind()", "??", 0),
        frame("at::cuda::getNewWorkspace()", "", 0),
        frame("torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor, "
              "std::allocator<at::Tensor> >&&)", "??", 0),
        frame("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::"
              "GraphTask> const&)", "??", 0),
        frame("execute_native_thread_routine", "/home/conda/feedstock_root/build_artifacts/"
              "gcc_compilers_1654084175708/work/gcc/libstdc++-v3/src/c++11/thread.cc", 82),
        frame("start_thread", "./nptl/pthread_create.c", 442),
        frame("__clone3", "./misc/../sysdeps/unix/sysv/linux/x86_64/clone3.S", 81),
    ]
    write("v2_state_only.pickle", pickle.dumps(state, protocol=4))
    # A compiled model's annotations (a public torch.compile snapshot has 1794, 1734 of them
    # pad_mm_benchmark): 40 pairs of one name inside a long compile stage, one forward.
    many = v2_snapshot()
    ann = [{"stage": "START", "name": "_compile.compile_inner (dynamo_timed)", "device": 0,
            "time_us": 100}]
    for k in range(40):
        for stage, t in (("START", 101 + k), ("END", 101 + k)):
            ann.append({"stage": stage, "name": "pad_mm_benchmark (dynamo_timed)", "device": 0,
                        "time_us": t})
    ann.append({"stage": "END", "name": "_compile.compile_inner (dynamo_timed)", "device": 0,
                "time_us": 150})
    ann += [{"stage": "START", "name": "forward", "device": 0, "time_us": 151},
            {"stage": "END", "name": "forward", "device": 0, "time_us": 155}]
    many["external_annotations"] = ann
    write("v2_many_annotations.pickle", pickle.dumps(many, protocol=4))
    # One device's trace list given twice (the same object: a memo reference): the streamed
    # read gives up on it and the whole read takes over, which a pipe must allow too.
    twice = v2_snapshot()
    twice["device_traces"] = [twice["device_traces"][0], twice["device_traces"][0]]
    write("v2_trace_twice.pickle", pickle.dumps(twice, protocol=4))
    # Annotation names that are not UTF-8 (a lone surrogate, as Python pickles one) or hold
    # a newline: --json and the plot's SVG stay well-formed.
    odd = v2_snapshot()
    odd["external_annotations"] = [
        {"stage": "START", "name": "a\ud800b", "device": 0, "time_us": 101},
        {"stage": "END", "name": "a\ud800b", "device": 0, "time_us": 102},
        {"stage": "START", "name": "two\nlines <&>", "device": 0, "time_us": 103}]
    write("v2_odd_names.pickle", pickle.dumps(odd, protocol=4))
    write("v2_midrun.pickle", pickle.dumps(midrun_snapshot(), protocol=4))
    write("v2_expandable_midrun.pickle", pickle.dumps(expandable_midrun_snapshot(), protocol=4))

    good = pickle.dumps(snap, protocol=4)
    # Each malformed file: the exit status, then a piece of the message, on one line.
    write("invalid/truncated.pickle", good[: len(good) // 2],
          "2 FRAME (0x95): a length of 2472 bytes, the file has 1230 left (truncated")
    p2 = pickle.dumps(snap, protocol=2)
    cut = [pos for _, _, pos in pickletools.genops(p2)][200]  # at an opcode boundary
    write("invalid/truncated_p2.pickle", p2[:cut], "2 the file ends before STOP (truncated)")
    inside = [pos for op, _, pos in pickletools.genops(p2) if op.name == "BINUNICODE"][-1] + 3
    write("invalid/truncated_operand.pickle", p2[:inside],
          "2 bytes of operand, the file has")
    write("invalid/global_os_system.pickle",
          b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03.",
          "2 GLOBAL (0x63): refused: it would import os.system")
    write("invalid/stack_global.pickle",
          b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94\x8c\x02id\x94\x85\x94R\x94.",
          "2 STACK_GLOBAL (0x93): refused")
    write("invalid/build.pickle", b"\x80\x02}q\x00}q\x01b.", "2 BUILD (0x62): refused")
    write("invalid/persid.pickle", b"\x80\x02Q.", "2 BINPERSID (0x51): refused")
    write("invalid/deep_nesting.pickle", b"\x80\x04N" + b"\x85" * 10**6 + b".",
          "2 nesting deeper than 64 levels")
    write("invalid/deep_lists.pickle", b"\x80\x04" + b"]" * 1000 + b"a" * 999 + b".",
          "2 nesting deeper than 64 levels")
    write("invalid/lying_length.pickle",
          b"\x80\x04X\xff\xff\xff\x7fsegments" + b"." ,
          "2 a length of 2147483647 bytes, the file has 9 left")
    write("invalid/lying_length8.pickle",
          b"\x80\x04\x8d" + struct.pack("<Q", 1 << 62) + b"ab.",
          "2 a length of 4611686018427387904 bytes")
    write("invalid/lying_frame.pickle",
          b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + b"}.",
          "2 FRAME (0x95): a length of 1099511627776 bytes")
    write("invalid/memo_skip.pickle", b"\x80\x04Nr\xff\xff\xff\x00.",
          "2 memo index 16777215 skips past")
    write("invalid/memo_unset.pickle", b"\x80\x04h\x05.", "2 memo index 5 not set")
    write("invalid/self_reference.pickle", b"\x80\x04]\x94(h\x00e.",
          "2 a list put inside itself")
    write("invalid/protocol0.pickle", b"(lp0\nI1\na.", "2 not a pickle of protocol 2 to 5")
    write("invalid/bad_utf8.pickle", b"\x80\x04\x8c\x02\xff\xfe.", "2 not UTF-8")
    write("invalid/huge_int.pickle", b"\x80\x04\x8a\x09" + b"\x01" * 9 + b".",
          "2 an integer of 9 bytes does not fit in 64 bits")
    write("invalid/set.pickle", b"\x80\x04\x8f.", "2 EMPTY_SET (0x8f): refused")
    write("invalid/trailing.pickle", b"\x80\x04N.N", "2 1 bytes after STOP")
    write("invalid/not_snapshot.pickle", pickle.dumps(42, protocol=4),
          "2 top level: a int; a snapshot is a dict")
    bad_blocks = v113_snapshot()
    bad_blocks[0]["blocks"][2]["size"] = 7 * MiB
    write("invalid/blocks_do_not_tile.pickle", pickle.dumps(bad_blocks, protocol=4),
          "2 segments[0]: blocks sum to 19922944 bytes")
    bad_action = v2_snapshot()
    bad_action["device_traces"][0][1]["size"] = "4 MiB"
    write("invalid/size_not_int.pickle", pickle.dumps(bad_action, protocol=4),
          "2 device_traces[0][1]: 'size' is a str, not an int")
    # One event dict, one trace list of it 2000 times, 255 devices of that list: 5 KB
    # that pickle writes with memo references (BINGET), 510 000 events when followed.
    shared = [{"action": "alloc", "addr": 0, "size": 512}] * 2000
    write("invalid/shared_traces.pickle",
          pickle.dumps({"segments": [], "device_traces": [shared] * 255}, protocol=4),
          "2 refused: the file's shared values (pickle memo references) expand")


if __name__ == "__main__":
    main()
