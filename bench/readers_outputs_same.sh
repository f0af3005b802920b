#!/bin/sh
# Usage: bench/readers_outputs_same.sh BEFORE_EXE AFTER_EXE LOG...
# plot (timeline, flame graph of the peak and of the leaked bytes) and export (both layouts)
# of each log by two builds of memtrace, compared byte for byte with their stderr and exit
# status: a change to the readers that must not change their outputs (docs/readers.md), e.g.
#   bench/readers_outputs_same.sh ../base/build-rel/tools/memtrace build-rel/tools/memtrace \
#       $(git ls-files '*.ndjson*')
base=$1; new=$2; shift 2
t=$(mktemp -d); fail=0; n=0
for log in "$@"; do
  for cmd in "plot -o -" "plot --flamegraph -o -" "plot --flamegraph --leaked -o -" "export --format torch-snapshot -o -" "export --format torch-snapshot --torch-format 1 -o -"; do
    for w in base new; do
      eval exe=\$$w
      $exe $cmd "$log" > $t/$w.out 2> $t/$w.err; echo $? > $t/$w.rc
    done
    n=$((n+1))
    if ! cmp -s $t/base.out $t/new.out || ! cmp -s $t/base.err $t/new.err || ! cmp -s $t/base.rc $t/new.rc; then
      echo "DIFFER: $cmd $log"; fail=1
    fi
  done
done
echo "$n runs compared, fail=$fail"; rm -rf $t; exit $fail
