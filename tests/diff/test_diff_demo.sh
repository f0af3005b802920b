#!/bin/sh
# `memtrace diff` on two runs of the demo (examples/train_charlm, one epoch, sim backend)
# with different settings, as the README's demo records them (MEMTRACE_PROF=log): the
# bigger model's sites grew, the peak gate is crossed (exit 4) or not (exit 0), and each
# run's report explains its whole gap (the causes add up, nothing untracked).
#   test_diff_demo.sh MEMTRACE TRAIN_CHARLM CORPUS PYTHON3
set -u
MT=$1
TRAIN=$2
TEXT=$3
PY=$4
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
demo() {
    out=$1
    shift
    MEMTRACE_PROF=log MEMTRACE_LOG="$T/$out.ndjson" "$TRAIN" --epochs 1 --sample 0 \
        --text "$TEXT" "$@" >"$T/$out.txt" 2>&1 || { cat "$T/$out.txt"; exit 1; }
}
demo small --hidden 128 --batch 8
demo big --hidden 256 --batch 16

"$MT" diff --max-peak-growth 10 "$T/small.ndjson" "$T/big.ndjson" >"$T/d.out" 2>&1
st=$?
[ "$st" -eq 4 ] || fail "diff with a crossed peak gate: exit $st, want 4"
grep -q "gate --max-peak-growth 10.0%: peak allocated grew +[0-9.]*%: CROSSED" "$T/d.out" ||
    fail "the crossed gate is not named"
# A build with line info names sites by file; one without (release) by module+offset.
if readelf -S "$TRAIN" 2>/dev/null | grep -q '\.debug_info'; then
    grep -q "^  grew: .*train_charlm.c" "$T/d.out" || fail "no site of train_charlm.c grew"
else
    grep -q "^  grew: .*(train_charlm+0x[0-9a-f]*)" "$T/d.out" ||
        fail "no site of train_charlm (module+offset, no line info in this build) grew"
fi
grep -q "grew .*activations" "$T/d.out" || fail "the activations tag did not grow"

"$MT" diff --max-peak-growth 1000 "$T/small.ndjson" "$T/big.ndjson" >"$T/ok.out" 2>&1
st=$?
[ "$st" -eq 0 ] || fail "diff under the gate: exit $st, want 0"
"$MT" diff --max-peak-growth 0 --max-site-growth 0 "$T/big.ndjson" "$T/big.ndjson" >"$T/same.out" 2>&1
st=$?
[ "$st" -eq 0 ] || fail "a run against itself: exit $st, want 0"
grep -q "(no change)" "$T/same.out" || fail "a run against itself shows a change"

for run in small big; do
    "$MT" report --json "$T/$run.ndjson" >"$T/$run.json" || fail "report $run"
    "$PY" - "$T/$run.json" <<'PYEOF' || fails=$((fails + 1))
import json, sys
for p in json.load(open(sys.argv[1]))["processes"]:
    for k in ("peak_gap", "end_gap"):
        g = p[k]
        parts = {c["cause"]: c["bytes"] for c in g["causes"]}
        gap = g["reserved_bytes"] - g["allocated_bytes"]
        if sum(parts.values()) != gap or parts["untracked"] != 0:
            sys.exit("FAIL: %s %s: %s for a gap of %d" % (sys.argv[1], k, parts, gap))
PYEOF
done
[ "$fails" -eq 0 ] || { cat "$T/d.out"; exit 1; }
cat "$T/d.out"
echo "ok"
