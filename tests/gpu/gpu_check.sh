#!/usr/bin/env bash
# The ten checks of a first real-GPU run (docs/gpu-findings-status.md), each a small program of this
# directory run bare and under `memtrace run --backend cuda`, compared by exit status,
# output and summary JSON. Prints one table and writes it as JSON.
#
#   gpu_check.sh [--build DIR] [--out FILE]     on a machine with an NVIDIA GPU and the CUDA
#                                              toolkit: builds DIR (default build-gpu) against
#                                              the real headers, runs the cuda and cudnn
#                                              suites, then the checks. Exit 77 (naming why)
#                                              without a GPU.
#   --no-suites: build only what the checks run, and skip the suites.
#   gpu_check.sh --fake BUILD_DIR [--out FILE]  the same checks over the fake driver and
#                                              runtime of an existing build (tests/cuda,
#                                              tests/preload), to test this script.
#
# Installs nothing, needs no network. Exit status: 0 if no check FAILs or ERRORs, 1 if one
# does, 2 on a usage or build problem, 77 without a GPU.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
MODE=real
BUILD=
OUT=
SUITES=1
while [ $# -gt 0 ]; do
    case $1 in
    --fake) MODE=fake; BUILD=${2:?--fake needs a build dir}; shift 2 ;;
    --build) BUILD=${2:?--build needs a dir}; shift 2 ;;
    --out) OUT=${2:?--out needs a file}; shift 2 ;;
    --no-suites) SUITES=0; shift ;;
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
PY=${PYTHON:-python3}
CC=${CC:-cc}
CHECK_TIMEOUT=${GPU_CHECK_TIMEOUT:-120}

# --- Is there a GPU? (real mode) -------------------------------------------------------
# nvidia-smi or /dev/nvidia0, then libcuda.so.1 answering cuInit and cuDeviceGetCount.
no_gpu() {
    echo "gpu_check: skipped: $*" >&2
    exit 77
}
detect_gpu() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || no_gpu "nvidia-smi lists no GPU"
    elif [ ! -e /dev/nvidia0 ]; then
        no_gpu "no NVIDIA GPU: nvidia-smi not found and no /dev/nvidia0"
    fi
    local why
    why=$("$PY" - 2>&1 <<'EOF'
import ctypes, sys
try:
    cu = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    sys.exit("libcuda.so.1 cannot be loaded (%s)" % e)
r = cu.cuInit(0)
if r != 0:
    sys.exit("cuInit returned %d" % r)
n = ctypes.c_int(0)
r = cu.cuDeviceGetCount(ctypes.byref(n))
if r != 0 or n.value < 1:
    sys.exit("cuDeviceGetCount returned %d with %d devices" % (r, n.value))
EOF
    ) || no_gpu "no usable NVIDIA driver: $why"
}

# --- Toolkit, build and the libraries the programs link ----------------------------------
if [ "$MODE" = fake ]; then
    [ -d "$BUILD" ] || { echo "gpu_check: no build dir $BUILD" >&2; exit 2; }
    BUILD=$(cd "$BUILD" && pwd)
    CUDA=$("$PY" -c 'import json,sys
for o in json.load(open(sys.argv[1])):
    if o["name"] == "cudatoolkit_dir": print(o["value"])' "$BUILD/meson-info/intro-buildoptions.json")
else
    detect_gpu
    CUDA=${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}
    [ -f "$CUDA/include/cuda.h" ] && [ -e "$CUDA/lib64/libcudart.so" ] ||
        no_gpu "a GPU, but no CUDA toolkit under $CUDA (set CUDA_HOME)"
    BUILD=${BUILD:-$SRC/build-gpu}
    if [ ! -d "$BUILD" ]; then
        meson setup "$BUILD" "$SRC" --buildtype=debugoptimized -Dcuda=enabled \
            -Dcudatoolkit_dir="$CUDA" >"$SRC/gpu-check-setup.log" 2>&1 ||
            { echo "gpu_check: meson setup failed: $SRC/gpu-check-setup.log" >&2; exit 2; }
    fi
    TARGETS=()
    [ $SUITES = 1 ] || TARGETS=(tools/memtrace memtrace-preload)
    meson compile -C "$BUILD" "${TARGETS[@]}" >"$BUILD/gpu-check-compile.log" 2>&1 ||
        { echo "gpu_check: build failed: $BUILD/gpu-check-compile.log" >&2; exit 2; }
    BUILD=$(cd "$BUILD" && pwd)
fi
MEMTRACE=$BUILD/tools/memtrace
PRELOAD=$BUILD/preload/libmemtrace-preload.so
for f in "$MEMTRACE" "$PRELOAD"; do
    [ -e "$f" ] || { echo "gpu_check: $f missing: meson compile -C $BUILD tools/memtrace memtrace-preload" >&2; exit 2; }
done
W=$BUILD/gpu-check
rm -rf "$W"
mkdir -p "$W"
OUT=${OUT:-$W/gpu-check.json}
CFLAGS="-O1 -g -Wall -pthread -I$CUDA/include"

if [ "$MODE" = fake ]; then
    FAKECUDA=$BUILD/tests/cuda/libfakecuda.so
    [ -e "$FAKECUDA" ] || { echo "gpu_check: $FAKECUDA missing: meson compile -C $BUILD fakecuda" >&2; exit 2; }
    FD=$(dirname "$FAKECUDA")
    # The driver: the build's fake plus fake_extra_drv.c, which depends on it, so
    # MEMTRACE_LIBCUDA names the extra. The runtime: the fake runtime's source with
    # fake_extra_rt.c, one object (see there why).
    $CC $CFLAGS -shared -fPIC -fvisibility=hidden "$HERE/fake_extra_drv.c" -o "$W/libgpucheck_cuda.so" \
        -Wl,--no-as-needed -L"$FD" -lfakecuda -Wl,-rpath,"$FD" >"$W/fake.log" 2>&1 &&
        $CC $CFLAGS -D_GNU_SOURCE -shared -fPIC -fvisibility=hidden "$HERE/fake_extra_rt.c" -o "$W/libgpucheck_cudart.so" \
            -Wl,--version-script="$SRC/tests/preload/fake_libcudart.map" -ldl >>"$W/fake.log" 2>&1 ||
        { cat "$W/fake.log" >&2; exit 2; }
    RTLIBS="-Wl,--no-as-needed -L$W -lgpucheck_cudart -Wl,-rpath,$W"
    DRVLIBS="-Wl,--no-as-needed -L$W -lgpucheck_cuda -L$FD -lfakecuda -Wl,-rpath,$W:$FD"
    CUDART_SO=$W/libgpucheck_cudart.so
    export MEMTRACE_LIBCUDA=$W/libgpucheck_cuda.so
else
    RTLIBS="-L$CUDA/lib64 -lcudart -Wl,-rpath,$CUDA/lib64"
    DRVLIBS="-L$CUDA/lib64/stubs -lcuda"
    CUDART_SO=$(ls "$CUDA"/lib64/libcudart.so.[0-9]* 2>/dev/null | head -1)
fi
export MEMTRACE_PRELOAD=$PRELOAD
export MEMTRACE_SOCKET=/nonexistent/memtrace-gpu-check.sock
export MEMTRACE_OOM_DIR=off

# --- Building the programs ----------------------------------------------------------------
build() { # name sources... -- link flags...
    local name=$1
    shift
    local srcs=()
    while [ "$1" != -- ]; do srcs+=("$1"); shift; done
    shift
    # shellcheck disable=SC2068
    $CC $CFLAGS "${srcs[@]}" -o "$W/$name" $@ >>"$W/build.log" 2>&1
}
BUILT_OK=1
build check1_ctx "$HERE/check1_ctx.c" -- $RTLIBS $DRVLIBS || BUILT_OK=0
build check2_plugin.so -shared -fPIC "$HERE/check2_plugin.c" -- $RTLIBS || BUILT_OK=0
build check2_main "$HERE/check2_main.c" -- -ldl || BUILT_OK=0
build check6_shared "$HERE/check6_runtime.c" -- $RTLIBS || BUILT_OK=0
STATIC_WHY=
if [ "$MODE" = fake ]; then
    STATIC_WHY="the fake runtime has no static archive (libfakecudart.so only)"
elif [ ! -f "$CUDA/lib64/libcudart_static.a" ]; then
    STATIC_WHY="no $CUDA/lib64/libcudart_static.a"
else
    build check6_static "$HERE/check6_runtime.c" -- "$CUDA/lib64/libcudart_static.a" -ldl -lrt -lpthread ||
        BUILT_OK=0
fi
build check6_proc "$HERE/check6_proc.c" -- $DRVLIBS -ldl || BUILT_OK=0
build check7_doublefree "$HERE/check7_doublefree.c" -- $RTLIBS || BUILT_OK=0
build check9_asyncfree "$HERE/check9_asyncfree.c" -- $RTLIBS $DRVLIBS || BUILT_OK=0
build check10_ctx "$HERE/check10_ctx.c" -- $DRVLIBS || BUILT_OK=0
if [ $BUILT_OK = 0 ]; then
    echo "gpu_check: a check program did not build:" >&2
    cat "$W/build.log" >&2
    exit 2
fi

# --- Running one check ----------------------------------------------------------------------
ROWS=$W/rows.tsv
: >"$ROWS"
row() { # id verdict bare memtrace reason
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$ROWS"
}
skip() { # id reason
    row "$1" skip - - "$2"
}
jget() { # file key
    "$PY" -c 'import json,sys
try: print(int(json.load(open(sys.argv[1])).get(sys.argv[2], 0)))
except Exception: print(-1)' "$1" "$2"
}

# check ID REQ UNKNOWN_OK MT_MODE -- command...
#   REQ: "" no summary test, N at least N requests, =N exactly N.
#   UNKNOWN_OK: 1 if the check frees memtrace never handed out (unknown_frees may be > 0).
#   MT_MODE: run (memtrace run --backend cuda), env:VAR=VAL (the command with VAR set,
#   for the pluggable allocator, which the program enables itself) or runenv:VAR=VAL
#   (both: the pluggable allocator with the drop-in preloaded, which sees captures).
check() {
    local id=$1 req=$2 unknown_ok=$3 mtmode=$4
    shift 5
    local d=$W/$id
    mkdir -p "$d"
    (cd "$d" && timeout "$CHECK_TIMEOUT" "$@" >bare.out 2>bare.err)
    local rb=$?
    if [ "$mtmode" = run ] || [ "${mtmode#runenv:}" != "$mtmode" ]; then
        local extra=()
        [ "$mtmode" = run ] || extra=("${mtmode#runenv:}")
        (cd "$d" && MEMTRACE_LOG_LEVEL=debug timeout "$CHECK_TIMEOUT" env "${extra[@]}" \
            "$MEMTRACE" run --backend cuda --telemetry off --summary-json s.json -- "$@" \
            >mt.out 2>mt.err)
    else
        (cd "$d" && timeout "$CHECK_TIMEOUT" env "${mtmode#env:}" "$@" >mt.out 2>mt.err)
    fi
    local rm=$?
    local requests=- unknown=- bm=-
    if [ -f "$d/s.json" ]; then
        requests=$(jget "$d/s.json" requests)
        bm=$(jget "$d/s.json" backend_mallocs)
        unknown=$(jget "$d/s.json" unknown_frees)
    fi
    local bare="rc=$rb" mt="rc=$rm"
    [ "$requests" = - ] || mt="$mt req=$requests bm=$bm unk=$unknown"
    local why
    if [ $rb = 77 ] && [ $rm = 77 ] && cmp -s "$d/bare.out" "$d/mt.out"; then
        row "$id" skip "$bare" "$mt" "$(grep -m1 '^skip:' "$d/bare.out" | sed 's/^skip: *//')"
        return
    fi
    if [ $rb != 0 ] && [ $rb != 77 ]; then
        row "$id" ERROR "$bare" "$mt" "the bare run failed: $(cat "$d/bare.out" "$d/bare.err" | grep -v -x -e ok -e FAIL | tail -1 | head -c 200 | tr '\t' ' ')"
        return
    fi
    if [ $rb != $rm ] || ! cmp -s "$d/bare.out" "$d/mt.out"; then
        why=$(diff "$d/bare.out" "$d/mt.out" | grep -m1 '^>' | sed 's/^> //')
        [ -n "$why" ] || why=$(tail -1 "$d/mt.err")
        row "$id" FAIL "$bare" "$mt" "under memtrace: ${why:-exit $rm}"
        return
    fi
    if [ -n "$req" ] && [ "$mtmode" = run ]; then
        if [ "$requests" = - ] || [ "$requests" -lt 0 ]; then
            row "$id" FAIL "$bare" "$mt" "no summary JSON"
            return
        fi
        case $req in
        =*) [ "$requests" = "${req#=}" ] || { row "$id" FAIL "$bare" "$mt" "requests $requests, expected ${req#=}"; return; } ;;
        *) [ "$requests" -ge "$req" ] || { row "$id" FAIL "$bare" "$mt" "requests $requests, expected at least $req (memtrace saw nothing)"; return; } ;;
        esac
        if [ "$unknown_ok" = 0 ] && [ "$unknown" != 0 ]; then
            row "$id" FAIL "$bare" "$mt" "unknown_frees $unknown"
            return
        fi
    fi
    if [ $rb = 77 ]; then
        row "$id" skip "$bare" "$mt" "$(grep -m1 '^skip:' "$d/bare.out" | sed 's/^skip: *//') (the rest agrees)"
        return
    fi
    row "$id" pass "$bare" "$mt" ""
}

# --- The suites (real mode) ------------------------------------------------------------------
if [ "$MODE" = real ] && [ $SUITES = 0 ]; then
    skip suites "--no-suites"
elif [ "$MODE" = real ]; then
    if meson test -C "$BUILD" --suite cuda --suite cudnn --suite preload --num-processes 2 \
        >"$W/suites.log" 2>&1; then
        row suites pass - - "cuda, cudnn, preload: $(grep -m1 '^Ok:' "$W/suites.log")"
    else
        row suites FAIL - - "see $W/suites.log / $BUILD/meson-logs/testlog.txt"
    fi
fi

# --- Python prerequisites ------------------------------------------------------------------
TORCH_WHY=
if [ "$MODE" = fake ]; then
    TORCH_WHY="fake mode: PyTorch needs a real CUDA device"
elif ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    TORCH_WHY="PyTorch not installed for $PY"
elif ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    TORCH_WHY="PyTorch has no CUDA ($("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null))"
fi
CUPY_WHY=
if [ "$MODE" = fake ]; then
    CUPY_WHY="fake mode: CuPy needs a real CUDA device"
elif ! "$PY" -c 'import cupy' >/dev/null 2>&1; then
    CUPY_WHY="CuPy not installed for $PY"
fi
export PYTHONPATH=$SRC/python${PYTHONPATH:+:$PYTHONPATH}

# --- The checks ------------------------------------------------------------------------------------
check 1 1 0 run -- "$W/check1_ctx"
if [ -n "$TORCH_WHY" ]; then skip 1-py "$TORCH_WHY"; else
    check 1-py "" 0 run -- "$PY" "$HERE/check1_torch.py"
fi
check 2-plugin 1 0 run -- "$W/check2_main" "$W/check2_plugin.so"
if [ -z "$CUDART_SO" ]; then skip 2-ctypes "no libcudart.so.N under $CUDA/lib64"; else
    check 2-ctypes "" 0 run -- "$PY" "$HERE/check2_ctypes.py" "$CUDART_SO"
fi
if [ -n "$CUPY_WHY" ]; then skip 2-cupy "$CUPY_WHY"; else
    check 2-cupy 1 0 run -- "$PY" "$HERE/check2_cupy.py"
fi
for n in 3 4 5; do
    f=$(ls "$HERE"/check${n}_*.py)
    if [ -n "$TORCH_WHY" ]; then skip $n "$TORCH_WHY"; else
        check $n "" 0 env:GPU_CHECK_MEMTRACE=1 -- "$PY" "$f"
    fi
done
# Check 5 again under memtrace run: the drop-in's capture hooks see torch's captures
# (private pools, relaxed mode for a new segment during torch's global-mode capture).
if [ -n "$TORCH_WHY" ]; then skip 5-run "$TORCH_WHY"; else
    check 5-run 1 0 runenv:GPU_CHECK_MEMTRACE=1 -- "$PY" "$HERE/check5_graph.py"
fi
check 6-shared =17 0 run -- "$W/check6_shared"
if [ -n "$STATIC_WHY" ]; then skip 6-static "$STATIC_WHY"; else
    check 6-static =17 0 run -- "$W/check6_static"
fi
check 6-proc 1 0 run -- "$W/check6_proc"
check 7 2 1 run -- "$W/check7_doublefree"
check 7-reference 2 1 run -- env MEMTRACE_ALLOC_CONF=rules:reference "$W/check7_doublefree"
# 8: cuDNN 9 for real. The build's test_rnn_cudnn_real runs the shipped library over the
# real libcudnn; the log must name the loaded cuDNN.
CUDNN=${MEMTRACE_LIBCUDNN:-}
[ -n "$CUDNN" ] || CUDNN=$(ls "$CUDA"/lib64/libcudnn.so.9 2>/dev/null || ldconfig -p 2>/dev/null | awk '/libcudnn.so.9 /{print $NF; exit}')
if [ "$MODE" = fake ]; then
    skip 8 "fake mode: cuDNN needs a real CUDA device"
elif [ -z "$CUDNN" ]; then
    skip 8 "no libcudnn.so.9 (set MEMTRACE_LIBCUDNN)"
elif [ ! -x "$BUILD/tests/rnn_cudnn/test_rnn_cudnn_real" ]; then
    skip 8 "no test_rnn_cudnn_real in the build (no cudnn.h >= 9 under $CUDA/include, or --no-suites)"
else
    mkdir -p "$W/8"
    if (cd "$W/8" && env -u MEMTRACE_LIBCUDA MEMTRACE_LIBCUDNN="$CUDNN" MEMTRACE_LOG_LEVEL=debug \
        timeout "$CHECK_TIMEOUT" "$BUILD/tests/rnn_cudnn/test_rnn_cudnn_real" >out 2>&1) &&
        grep -q 'rnn: cudnn: libcudnn 9' "$W/8/out"; then
        row 8 pass "cudnn=$CUDNN" - "loaded; numerics matrix not scripted (docs/gpu-findings-status.md)"
    else
        row 8 FAIL "cudnn=$CUDNN" - "no 'rnn: cudnn: libcudnn 9' in $W/8/out or the test failed"
    fi
fi
check 9 1 0 run -- "$W/check9_asyncfree"
check 10 1 0 run -- "$W/check10_ctx"

# --- The table ------------------------------------------------------------------------------------
"$PY" - "$ROWS" "$OUT" "$MODE" <<'EOF'
import json, sys
rows, out, mode = sys.argv[1:4]
checks = []
for line in open(rows):
    cid, verdict, bare, mt, reason = line.rstrip("\n").split("\t")
    checks.append({"check": cid, "bare": bare, "memtrace": mt, "verdict": verdict, "reason": reason})
w = [max(len(c[k]) for c in checks + [{"check": "check", "bare": "bare", "memtrace": "memtrace", "verdict": "verdict"}])
     for k in ("check", "bare", "memtrace", "verdict")]
def line(c):
    cells = [c["check"], c["bare"], c["memtrace"], c["verdict"]]
    s = "  ".join(x.ljust(n) for x, n in zip(cells, w))
    return (s + ("  " + c["reason"] if c.get("reason") else "")).rstrip()
print(line({"check": "check", "bare": "bare", "memtrace": "memtrace", "verdict": "verdict"}))
for c in checks:
    print(line(c))
json.dump({"mode": mode, "checks": checks}, open(out, "w"), indent=2)
print("written to", out)
bad = [c["check"] for c in checks if c["verdict"] in ("FAIL", "ERROR")]
sys.exit(1 if bad else 0)
EOF
