#!/bin/sh
# memtrace export --format torch-snapshot on a log recorded from memtrace's allocator:
# both layouts pass the layout checker (check_snapshot.py, written from the docs), and
# memtrace reads its output back with the log's figures. With "torch" as the 5th argument,
# PyTorch 1.13's own tools (Debian's python3-torch, /usr/bin/python3) must read the 1.13
# layout; exit 77 (skipped) only when torch cannot be imported.
# usage: test_export.sh MEMTRACE TEST_ROUNDTRIP CHECKER PYTHON [torch]
set -u
mt=$1 roundtrip=$2 checker=$3 python=$4 mode=${5:-}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$roundtrip" --write-log "$tmp/run.ndjson" || fail "recording a log"
"$mt" export --format torch-snapshot "$tmp/run.ndjson" -o "$tmp/v2.pickle" || fail "export"
"$mt" export --format torch-snapshot --torch-format 1 "$tmp/run.ndjson" -o "$tmp/v1.pickle" ||
    fail "export --torch-format 1"

if [ "$mode" != torch ]; then
    # A failed write removes a half-written file, never what -o names when it is not one:
    # a link to /dev/full stays a link (export run as root once deleted the device node).
    if [ -c /dev/full ]; then
        ln -s /dev/full "$tmp/full" || fail "ln -s"
        "$mt" export --format torch-snapshot "$tmp/run.ndjson" -o "$tmp/full" 2>"$tmp/full.err" &&
            fail "export to /dev/full must fail"
        grep -q "cannot write" "$tmp/full.err" || fail "no error named: $(cat "$tmp/full.err")"
        [ -L "$tmp/full" ] && [ -c /dev/full ] || fail "export removed what -o named"
        "$mt" plot "$tmp/run.ndjson" -o "$tmp/full" 2>/dev/null && fail "plot to /dev/full must fail"
        [ -L "$tmp/full" ] || fail "plot removed what -o named"
    fi
    "$python" "$checker" --era 2 --complete --viz "$tmp/v2.pickle" || fail "the 2.x output breaks the layout"
    # A log that lost events (every 9th line gone, as a full ring drops them): the segments
    # and blocks at the end still tile, and the trace keeps only what memory_viz's state view
    # can undo from them, at every entry (before, the viewer threw on an undone free_requested
    # of a block it did not have, and drew blocks outside every segment); the rest is counted.
    awk 'NR <= 2 || NR % 9 != 0' "$tmp/run.ndjson" > "$tmp/lossy.ndjson"
    "$mt" export --format torch-snapshot "$tmp/lossy.ndjson" -o "$tmp/lossy.pickle" \
        2>"$tmp/lossy.err" || fail "export of a log that lost events"
    grep -q "trace entries left out: they do not fit the segments and blocks at the end" "$tmp/lossy.err" ||
        fail "the entries left out are not told: $(cat "$tmp/lossy.err")"
    "$python" "$checker" --era 2 --complete --viz "$tmp/lossy.pickle" ||
        fail "memory_viz's state view cannot walk the export of a log that lost events"
    "$python" "$checker" --era 1 "$tmp/v1.pickle" || fail "the 1.13 output breaks the layout"
    # The report of the snapshot gives the log's peaks and per-tag peaks.
    "$mt" report --json "$tmp/run.ndjson" > "$tmp/a.json" || fail "report of the log"
    "$mt" report --json "$tmp/v2.pickle" > "$tmp/b.json" || fail "report of the snapshot"
    "$python" - "$tmp/a.json" "$tmp/b.json" <<'PY' || fail "the report differs"
import json, sys
a = json.load(open(sys.argv[1]))["processes"][0]
b = json.load(open(sys.argv[2]))["processes"][0]
for k in ("peak_allocated", "peak_reserved", "final_allocated", "final_reserved", "peak_by_tag"):
    if a[k] != b[k]:
        sys.exit("%s: log %s, snapshot %s" % (k, a[k], b[k]))
PY
    "$mt" replay "$tmp/v2.pickle" > "$tmp/replay.txt" || fail "replay of the snapshot"
    # Bad usage is said and exits 2.
    "$mt" export "$tmp/run.ndjson" -o "$tmp/x.pickle" 2>/dev/null
    [ $? = 2 ] || fail "export without --format must exit 2"
    "$mt" export --format torch-snapshot --torch-format 3 "$tmp/run.ndjson" -o "$tmp/x" 2>/dev/null
    [ $? = 2 ] || fail "--torch-format 3 must exit 2"
    exit 0
fi

if ! "$python" -c "import torch.cuda._memory_viz" 2>"$tmp/err"; then
    echo "SKIP: PyTorch cannot be imported by $python ($(tail -n 1 "$tmp/err")); install python3-torch"
    exit 77
fi
cd "$tmp" || exit 1
"$python" -m torch.cuda._memory_viz stats v1.pickle > stats.txt 2>&1 ||
    fail "torch.cuda._memory_viz stats rejects the 1.13 output: $(cat stats.txt)"
grep -q "'segments'" stats.txt && grep -q "active_allocated" stats.txt ||
    fail "stats printed no segments: $(cat stats.txt)"
# segments and memory would download flamegraph.pl (no network here): run the same
# functions with the folded lines returned as they are, and check them.
"$python" - v1.pickle <<'PY' || fail "torch.cuda._memory_viz segments/memory reject the output"
import pickle, sys
from torch.cuda import _memory_viz as viz
snap = pickle.load(open(sys.argv[1], "rb"))
for fn in (viz.segments, viz.memory):
    lines = fn(snap, format_flamegraph=lambda s: s).splitlines()
    assert lines, fn.__name__ + ": no lines"
    for line in lines:
        stack, size = line.rsplit(" ", 1)
        assert int(size) > 0 and stack.startswith("stream_"), line
    assert any("memtrace:" in l and ":tag " in l for l in lines), "tags are not shown as frames"
print("segments/memory: %d lines" % len(lines))
PY
# The reason for --torch-format 1: 1.13's tools cannot read the 2.x dict.
if "$python" -m torch.cuda._memory_viz stats v2.pickle > v2.txt 2>&1; then
    echo "note: this torch's _memory_viz also reads the 2.x layout"
fi
exit 0
