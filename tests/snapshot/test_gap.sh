#!/bin/sh
# Why reserved exceeds allocated (analysis/gap.h) through `memtrace report`: on a snapshot
# made by make_gap_snapshot.py each cause has its known size at the peak and at the end; on
# it and on the shipped fixtures the causes add up to reserved - allocated, the untracked
# part within 0.1 % of the gap; the text names the causes and the pinning sites.
#   test_gap.sh MEMTRACE SNAPSHOT_DATA PYTHON3
set -u
MT=$1
DATA=$2
PY=$3
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
"$PY" "$HERE/make_gap_snapshot.py" "$T/gap.pickle" || exit 1

# v2_all_actions_p4.pickle is left out: its trace allocates over a block still live (a
# reader test), so its blocks overlap and the untracked part is that overlap.
for f in "$T/gap.pickle" "$DATA/v2_torch_frames.pickle" "$DATA/frames_log.ndjson"; do
    "$MT" report --json "$f" >"$T/r.json" || { echo "FAIL: report --json $f"; fails=$((fails + 1)); continue; }
    "$PY" - "$T/r.json" "$f" <<'PYEOF' || fails=$((fails + 1))
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["processes"]:
    for k in ("peak_gap", "end_gap"):
        g = p[k]
        gap = g["reserved_bytes"] - g["allocated_bytes"]
        parts = {c["cause"]: c["bytes"] for c in g["causes"]}
        if g["gap_bytes"] != gap or sum(parts.values()) != gap:
            sys.exit("FAIL: %s %s: causes %s do not add up to %d" % (sys.argv[2], k, parts, gap))
        if abs(parts["untracked"]) > 0.001 * gap:
            sys.exit("FAIL: %s %s: untracked %d above 0.1%% of %d" % (sys.argv[2], k,
                                                                     parts["untracked"], gap))
    if p["end_gap"]["reserved_bytes"] != p["final_reserved"]:
        sys.exit("FAIL: %s: end_gap reserved is not the report's final reserved" % sys.argv[2])
    if p["end_gap"]["allocated_bytes"] != p["final_allocated"]:
        sys.exit("FAIL: %s: end_gap allocated is not the report's final allocated" % sys.argv[2])
    if p["peak_gap"]["allocated_bytes"] != p["peak_allocated"]:
        sys.exit("FAIL: %s: peak_gap allocated is not the report's peak" % sys.argv[2])
print("ok: %s: the causes add up to the gap" % sys.argv[2])
PYEOF
done

"$MT" report --json "$T/gap.pickle" >"$T/gap.json" || exit 1
"$PY" - "$T/gap.json" <<'PYEOF' || fails=$((fails + 1))
import json, sys
MiB = 1 << 20
p = json.load(open(sys.argv[1]))["processes"][0]
want = {
    "end_gap": dict(reserved=26 * MiB, allocated=7 * MiB + 1536, pinned_free=14 * MiB - 1024,
                    cached_segments=2 * MiB, stream_pending=2 * MiB,
                    expandable_slack=1 * MiB - 512, untracked=0),
    # At the peak C's block is live (C's free is pinned by it) and X is 4 MiB mapped.
    "peak_gap": dict(reserved=28 * MiB, allocated=8 * MiB + 1536,
                     pinned_free=14 * MiB - 1024 + 1 * MiB, cached_segments=2 * MiB,
                     stream_pending=0, expandable_slack=3 * MiB - 512, untracked=0),
}
for k, w in want.items():
    g = p[k]
    got = {c["cause"]: c["bytes"] for c in g["causes"]}
    got.update(reserved=g["reserved_bytes"], allocated=g["allocated_bytes"])
    for name, v in w.items():
        if got[name] != v:
            sys.exit("FAIL: %s %s = %d, want %d" % (k, name, got[name], v))
    if g["rounding_bytes"] != 633:
        sys.exit("FAIL: %s rounding %d, want 633" % (k, g["rounding_bytes"]))
pins = p["peak_gap"]["pins"]
if [(x["site"], x["bytes"]) for x in pins] != [("transformer.py:54 forward", 14 * MiB - 1024),
                                               ("train.py:41 loss", 1 * MiB)]:
    sys.exit("FAIL: pins at the peak: %s" % [(x["site"], x["bytes"]) for x in pins])
print("ok: every cause has its size")
PYEOF

"$MT" report "$T/gap.pickle" >"$T/gap.txt" || exit 1
for want in "why reserved exceeds allocated:" \
    "free in segments that hold live blocks         15.0 MiB       14.0 MiB" \
    "whole free segments kept in the cache           2.0 MiB        2.0 MiB" \
    "freed, waiting on stream events                     0 B        2.0 MiB" \
    "(inside allocated) rounding of requests             633 B          633 B" \
    "14.0 MiB free in 1 segment  transformer.py:54 forward"; do
    grep -qF -- "$want" "$T/gap.txt" || { echo "FAIL: text: no '$want' in:"; cat "$T/gap.txt"; fails=$((fails + 1)); }
done
# --replay: memtrace's allocator on the same sequence, the figure `memtrace replay` prints.
"$MT" report --replay --json "$T/gap.pickle" >"$T/rep.json" || exit 1
"$MT" replay --json "$T/gap.pickle" >"$T/replay.json" || exit 1
"$PY" - "$T/rep.json" "$T/replay.json" <<'PYEOF' || fails=$((fails + 1))
import json, sys
p = json.load(open(sys.argv[1]))["processes"][0]
r = json.load(open(sys.argv[2]))["devices"][0]["memtrace"]
if p.get("replay_reserved_bytes") != r["peak_reserved_bytes"] or p["replay_reserved_bytes"] <= 0:
    sys.exit("FAIL: report --replay %s, memtrace replay %s" % (p.get("replay_reserved_bytes"),
                                                                r["peak_reserved_bytes"]))
print("ok: report --replay says what memtrace replay says")
PYEOF
out=$("$MT" report --replay "$T/gap.pickle")
case "$out" in
*"memtrace's allocator would reserve (peak)        12.0 MiB"*"and allocate (peak), rounding its own way"*) ;;
*) echo "FAIL: report --replay text: $out"; fails=$((fails + 1)) ;;
esac
# The report's JSON, gaps and replay included, keeps to docs/telemetry.schema.json (when ajv
# is installed: npm ci --prefix tests/prof; validate.mjs exits 77 without it).
if command -v node >/dev/null 2>&1; then
    "$PY" -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$T/rep.json" >"$T/rep.ndjson"
    node "$HERE/../prof/validate.mjs" "$HERE/../../docs/telemetry.schema.json" "$T/rep.ndjson"
    st=$?
    [ "$st" -eq 0 ] || [ "$st" -eq 77 ] || { echo "FAIL: the report's JSON breaks the schema"; fails=$((fails + 1)); }
fi
[ "$fails" -eq 0 ] || exit 1
echo "ok"
