#!/bin/sh
# `memtrace diff` (docs/diff.md) on two runs of the demo-like loop of make_run.py with
# different settings, and on two PyTorch snapshots of tests/snapshot/data: it names what
# changed, exits 4 when a gate is crossed (and says which), 0 otherwise.
#   test_diff.sh MEMTRACE SNAPSHOT_DATA PYTHON3
set -u
MT=$1
DATA=$2
PY=$3
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
# run NAME WANT_STATUS ARGS...: runs memtrace diff, output in $T/NAME.out
run() {
    name=$1
    want=$2
    shift 2
    "$MT" diff "$@" >"$T/$name.out" 2>"$T/$name.err"
    st=$?
    [ "$st" -eq "$want" ] || fail "$name: exit $st, want $want: $(cat "$T/$name.err")"
}
has() {
    grep -qF -- "$2" "$T/$1.out" || fail "$1: no '$2' in: $(cat "$T/$1.out")"
}
hasnt() {
    ! grep -qF -- "$2" "$T/$1.out" || fail "$1: '$2' should not be in the output"
}

"$PY" "$HERE/make_run.py" "$T/before.ndjson" --batch 8 || exit 1
"$PY" "$HERE/make_run.py" "$T/after.ndjson" --batch 16 --cache || exit 1

# ---- logs ----
run same 0 --max-peak-growth 0 --max-site-growth 0 "$T/before.ndjson" "$T/before.ndjson"
has same "(no change)"
has same "gate --max-peak-growth 0.0%: peak allocated grew +0.0%: ok"
has same "gate --max-site-growth 0 B: largest growth 0 B"

run logs 0 "$T/before.ndjson" "$T/after.ndjson"
has logs "peak allocated       25.0 MiB -> 37.0 MiB     +12.0 MiB (+48.0%)"
has logs "grew        8.0 MiB -> 16.0 MiB      forward (model.py:12)"
has logs "new             0 B -> 4.0 MiB"
has logs "new sites: remember (cache.py:9)"
has logs "grew        8.0 MiB -> 16.0 MiB      activations"
hasnt logs "CROSSED"

run peak_gate 4 --max-peak-growth 10 "$T/before.ndjson" "$T/after.ndjson"
has peak_gate "gate --max-peak-growth 10.0%: peak allocated grew +48.0%: CROSSED"
run peak_ok 0 --max-peak-growth 50 "$T/before.ndjson" "$T/after.ndjson"
has peak_ok "grew +48.0%: ok"

run site_gate 4 --max-site-growth 4M "$T/before.ndjson" "$T/after.ndjson"
has site_gate "gate --max-site-growth 4.0 MiB: largest growth 8.0 MiB at forward (model.py:12): CROSSED"
run site_ok 0 --max-site-growth 8M "$T/before.ndjson" "$T/after.ndjson"
has site_ok ": ok"

# The reverse: the cache is gone, activations shrank.
run reverse 0 "$T/after.ndjson" "$T/before.ndjson"
has reverse "gone        4.0 MiB -> 0 B"
has reverse "shrank     16.0 MiB -> 8.0 MiB       forward (model.py:12)"

run json 4 --json --max-peak-growth 10 "$T/before.ndjson" "$T/after.ndjson"
"$PY" - "$T/json.out" <<'PYEOF' || fail "json: see above"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["type"] == "diff", d["type"]
assert d["peak_allocated"] == {"before": 25 << 20, "after": 37 << 20, "delta": 12 << 20,
                               "growth_pct": 48.0}, d["peak_allocated"]
assert d["new"] == ["remember (cache.py:9)"], d["new"]
assert d["grew"] == ["forward (model.py:12)"], d["grew"]
assert d["crossed"] is True
g = d["gates"][0]
assert g["gate"] == "max_peak_growth_pct" and g["crossed"] is True and g["value"] == 48.0, g
site = {r["key"]: r for r in d["sites"]}
assert site["remember (cache.py:9)"]["status"] == "new"
assert site["remember (cache.py:9)"]["never_freed_after"] == 4 << 20
tag = {r["key"]: r for r in d["tags"]}
assert tag["activations"]["before"] == 8 << 20 and tag["activations"]["after"] == 16 << 20
PYEOF

# The JSON keeps to docs/telemetry.schema.json ("diff"), when ajv is installed
# (npm ci --prefix tests/prof; validate.mjs exits 77 without it).
if command -v node >/dev/null 2>&1; then
    "$PY" -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$T/json.out" >"$T/json.ndjson"
    node "$HERE/../prof/validate.mjs" "$HERE/../../docs/telemetry.schema.json" "$T/json.ndjson"
    st=$?
    [ "$st" -eq 0 ] || [ "$st" -eq 77 ] || fail "the diff's JSON breaks docs/telemetry.schema.json"
fi

# ---- snapshots ----
A=$DATA/v2_all_actions_p4.pickle
B=$DATA/v2_torch_frames.pickle
run snap_same 0 --max-peak-growth 0 --max-site-growth 0 "$B" "$B"
has snap_same "(no change)"
run snap 4 --max-peak-growth 100 "$A" "$B"
has snap "new             0 B -> 100.0 MiB     transformer.py:54 forward"
has snap "gone        8.0 MiB -> 0 B           adam.py:150 step"
has snap "peak allocated       14.0 MiB -> 152.0 MiB"
has snap "CROSSED"
hasnt snap "by tag"
run snap_site 4 --max-site-growth 64M "$A" "$B"
has snap_site "largest growth 100.0 MiB at transformer.py:54 forward: CROSSED"
# A log against a snapshot: any input report reads.
run mixed 0 "$T/before.ndjson" "$B"
has mixed "transformer.py:54 forward"

# ---- usage ----
run usage 2 "$T/before.ndjson"
run bad_pct 2 --max-peak-growth -5 "$T/before.ndjson" "$T/after.ndjson"
run bad_bytes 2 --max-site-growth 12Q "$T/before.ndjson" "$T/after.ndjson"
run missing 1 "$T/before.ndjson" "$T/nothing.ndjson"

[ "$fails" -eq 0 ] || exit 1
echo "ok"
