#!/bin/sh
# The malloc interposer (bench/malloc_trace.c) under four threads: the trace it writes must
# load (memtrace replay checks that every free names a live pointer of the same size and no
# pointer is live twice) and hold the program's requests: all of them by default, and with
# MALLOC_TRACE_ONLY=aligned only the aligned ones (fewer, still at least a thousand), with
# no free recorded out of order.
# usage: check_malloc_trace.sh PROG MALLOC_TRACE_SO MEMTRACE
set -eu
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
MALLOC_TRACE_OUT="$dir/all.csv" LD_PRELOAD="$2" "$1" >/dev/null 2>"$dir/all.err"
MALLOC_TRACE_OUT="$dir/aligned.csv" MALLOC_TRACE_ONLY=aligned LD_PRELOAD="$2" "$1" >/dev/null \
    2>"$dir/aligned.err"
cat "$dir/all.err" "$dir/aligned.err"
# The writer repairs and reports an allocate of an address it still holds live: a free
# recorded after another thread got the address back. A correct recording has none.
if grep -q "out of order\|dropped" "$dir/all.err" "$dir/aligned.err"; then exit 1; fi
"$3" replay "$dir/all.csv" --json >"$dir/all.json"
"$3" replay "$dir/aligned.csv" --json >"$dir/aligned.json"
all=$(($(wc -l <"$dir/all.csv") - 1))
aligned=$(($(wc -l <"$dir/aligned.csv") - 1))
echo "all: $all rows, aligned: $aligned rows"
# 4 threads x 5000 steps: about one allocate and one free per step.
[ "$all" -ge 25000 ] && [ "$aligned" -ge 1000 ] && [ "$aligned" -lt "$all" ]
