#!/bin/sh
# Records data/traces/torch_{lstm,gru,transformer}.csv.xz: each workload of
# bench/torch_workloads.py (Debian's python3-torch, CPU) runs under the malloc interposer
# bench/malloc_trace.c, which keeps the tensor storages (PyTorch's CPU allocator takes every
# one from posix_memalign) and writes them as an RMM CSV at exit; xz -9e compresses it.
#
# usage: bench/record_torch_trace.sh [BUILD_DIR [OUT_DIR [ITERS]]]
#        (defaults: build-test, data/traces, 30)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build-test}
out=${2:-$root/data/traces}
iters=${3:-30}
python=/usr/bin/python3 # Debian's, where python3-torch lives

meson compile -C "$build" malloc_trace >/dev/null
so=$(cd "$build/bench" && pwd)/malloc_trace.so
"$python" -c 'import torch' || { echo "record_torch_trace: python3-torch is not installed" >&2; exit 1; }
mkdir -p "$out"
for w in lstm gru transformer; do
    csv="$out/torch_$w.csv"
    MALLOC_TRACE_OUT="$csv" MALLOC_TRACE_ONLY=aligned LD_PRELOAD="$so" \
        OMP_NUM_THREADS=1 "$python" "$here/torch_workloads.py" "$w" "$iters"
    xz -9e -T1 -f "$csv"
    echo "record_torch_trace: $csv.xz ($(wc -c <"$csv.xz") bytes)"
done
