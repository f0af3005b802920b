#!/bin/sh
# bench_alloc's replay table reads compressed traces and runs each allocator in a child
# process: one child on the smallest torch trace must print "ok 2 <pass ns> <pass ns> ..."
# with the TLSF pool's high-water after the cold pass (field 6) at least the trace's peak live
# bytes (field 8).
# usage: check_bench_child.sh BENCH_ALLOC TRACE.csv.xz
set -eu
line=$("$1" --replay-child tlsf 2 cpu "$2")
echo "$line"
echo "$line" | awk '$1 == "ok" && $2 == 2 && $3 > 0 && $4 > 0 && $6 >= $8 && $8 > 0 { ok = 1 }
    END { exit ok ? 0 : 1 }'
