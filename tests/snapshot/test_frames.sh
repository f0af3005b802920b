#!/bin/sh
# The user's frame and the groupings of `memtrace report` (analysis/frames.c,
# docs/frames.md) on a snapshot shaped like PyTorch 2.x's (v2_torch_frames.pickle) and on
# an untagged memtrace log with Python stacks (frames_log.ndjson); both are written by
# make_frames_snapshot.py.
# usage: test_frames.sh MEMTRACE DATA_DIR PYTHON [SOURCE_ROOT]
# With SOURCE_ROOT, node and tests/prof's ajv (npm ci --prefix tests/prof), the reports'
# JSON is validated against docs/telemetry.schema.json too.
set -u
mt=$1
snap=$2/v2_torch_frames.pickle
log=$2/frames_log.ndjson
py=$3
root=${4:-}
fail=0
no() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The top sites are the user's lines, as PyTorch users read them, the three stacks of
# forward (one per operator) together.
"$mt" report "$snap" > "$tmp/r.txt" 2>&1 || no "report of the snapshot: $(cat "$tmp/r.txt")"
sed -n '/^snapshot/,$p' "$tmp/r.txt" > "$tmp/sites.txt"
grep -Eq '^ +100\.00 MiB +3  transformer\.py:54 forward$' "$tmp/sites.txt" ||
    no "top site is not 'transformer.py:54 forward' (100 MiB, 3 blocks): $(cat "$tmp/sites.txt")"
grep -Eq '^ +24\.00 MiB +1  my_utils\.py:7 scale$' "$tmp/sites.txt" || no "my_utils.py:7 scale"
grep -Eq '^ +20\.00 MiB +1  train\.py:30 train_step$' "$tmp/sites.txt" || no "train.py:30"
grep -Eq 'unwind|_PyEval|module\.py' "$tmp/sites.txt" && no "skipped frames shown: $(cat "$tmp/sites.txt")"
# A stack with no frame of the user's (autograd's thread, no node in it): the ATen
# operator that allocated, as PyTorch's profiler names it (docs/frames.md, "Fallback").
grep -Eq '^ +8\.00 MiB +1  aten::mm_backward$' "$tmp/sites.txt" ||
    no "fallback to the ATen operator (aten::mm_backward): $(cat "$tmp/sites.txt")"
# Untagged input: no section by tag.
grep -q 'peak by tag' "$tmp/r.txt" && no "'peak by tag' printed for a snapshot without tags"

# --frames all: the innermost frame is the site and every frame is printed under it.
"$mt" report --frames all --top 1 "$snap" > "$tmp/all.txt" || no "--frames all"
grep -q 'torch::unwind::unwind()$' "$tmp/all.txt" || no "--frames all: site is not the unwinder"
n=$(grep -c '^ *<- ' "$tmp/all.txt")
[ "$n" -ge 30 ] || no "--frames all printed $n frames under the site, not the whole stack"
grep -q '<- module.py:1527 _call_impl' "$tmp/all.txt" || no "--frames all: module.py frame missing"

# --frames rules prints the default table; docs/frames.md lists each of its patterns.
"$mt" report --frames rules > "$tmp/rules.txt" || no "--frames rules"
n=$(($(wc -l < "$tmp/rules.txt") - 1))
[ "$n" -ge 40 ] || no "--frames rules printed $n rules"
if [ -n "$root" ]; then
    tail -n +2 "$tmp/rules.txt" | while IFS= read -r line; do
        pat=$(echo "$line" | cut -c18-61 | sed 's/ *$//')
        [ "$pat" = "-" ] && continue
        # (trailing blanks of a pattern are cut by the column: match its start)
        grep -qF -- "| \`$pat" "$root/docs/frames.md" || echo "docs/frames.md lacks rule '$pat'"
    done > "$tmp/docs.txt"
    [ -s "$tmp/docs.txt" ] && no "$(cat "$tmp/docs.txt")"
fi

# --skip-frames adds a rule: the helper's caller becomes the site.
"$mt" report --skip-frames file:my_utils.py "$snap" > "$tmp/skip.txt" || no "--skip-frames"
grep -Eq '24\.00 MiB +1  transformer\.py:60 forward$' "$tmp/skip.txt" ||
    no "--skip-frames file:my_utils.py: $(sed -n '/^snapshot/,$p' "$tmp/skip.txt")"
grep -q 'my_utils.py:7' "$tmp/skip.txt" && no "--skip-frames: my_utils.py still named"
"$mt" report --skip-frames '' "$snap" > /dev/null 2>&1
[ $? = 2 ] || no "--skip-frames '' must exit 2"
"$mt" report --by nothing "$snap" > /dev/null 2>&1
[ $? = 2 ] || no "--by nothing must exit 2"

# --stacks: the kept frames under every site.
"$mt" report --stacks "$snap" > "$tmp/st.txt" || no "--stacks"
grep -A3 'transformer.py:54 forward$' "$tmp/st.txt" | grep -q '<- train.py:30 train_step' ||
    no "--stacks: no stack under transformer.py:54 forward"

# --by each value, text and JSON, on the snapshot and on the log.
for by in site callsite function file module stack tag; do
    for f in "$snap" "$log"; do
        "$mt" report --by $by "$f" > "$tmp/by.txt" 2>&1 || no "--by $by $f: $(cat "$tmp/by.txt")"
        "$mt" report --json --by $by "$f" > "$tmp/by.json" 2>&1 || no "--by $by --json $f"
        "$py" - "$tmp/by.json" "$by" "$f" <<'PY' || no "--by $by --json $f: see above"
import json, sys
doc = json.load(open(sys.argv[1]))
by, path = sys.argv[2], sys.argv[3]
want = "site" if by == "callsite" else by
p = doc["processes"][0]
assert p["tagged"] is False, p
if by == "tag":
    assert "peak_by_tag" in p and "callsites" not in p, sorted(p)
else:
    assert "peak_by_tag" not in p and "groups" not in p["never_freed"], sorted(p)
expect = {
    "site": ("transformer.py:54 forward", "forward (model.py:12)"),
    "function": ("forward (transformer.py)", "forward (model.py)"),
    "file": ("transformer.py", "model.py"),
    "module": ("transformer", "model"),
    "tag": ("other", None),
}
if path.endswith(".pickle"):
    d = doc["snapshots"][0]["devices"][0]
    assert d["by"] == want, d["by"]
    top = d["call_sites_at_peak"][0]
    if want in expect:
        assert top["site"] == expect[want][0], top["site"]
    else:  # stack: the user's frames from the site out
        assert top["site"] == "transformer.py:54 forward <- train.py:30 train_step <- " \
            "train.py:80 <module>", top["site"]
    assert top["frames"][top["user_frame"]]["name"] == ("forward" if want != "tag" else
                                                        "torch::unwind::unwind()") \
        or want == "tag"
    assert top["frames"][0]["skipped"] == "PyTorch's stack unwinder", top["frames"][0]
elif by != "tag":
    cs = p["callsites"]
    assert cs["by"] == want, cs
    top = cs["at_peak"][0]
    # stacks 1 and 2 differ only in frames the rules skip; file and module take stack 3 too
    site = "forward (model.py:12)" if want == "stack" else expect[want][1]
    n = 3 if want in ("file", "module") else 2
    assert top["site"] == site, top
    assert top["bytes"] == (12 << 20 if n == 2 else 14 << 20) and top["stacks"] == n, top
    assert top["frames"][0]["skipped"] == "an installed package", top["frames"][0]
PY
    done
done

# The log: its call sites by default (no tags), none of the sections by tag.
"$mt" report "$log" > "$tmp/log.txt" || no "report of the log"
grep -q 'peak by tag' "$tmp/log.txt" && no "'peak by tag' printed for a log without tags"
grep -Eq '12\.0 MiB +2 blocks +forward \(model\.py:12\)' "$tmp/log.txt" ||
    no "the log's call sites by default: $(cat "$tmp/log.txt")"
"$mt" report --by tag "$log" > "$tmp/tag.txt" || no "--by tag"
grep -q 'peak by tag' "$tmp/tag.txt" || no "--by tag: no 'peak by tag'"
grep -q 'call sites' "$tmp/tag.txt" && no "--by tag: call sites printed"
# Several inputs at once: two snapshots (their processes have no call-site section) and
# the log (which has one).
"$mt" report --json "$snap" "$snap" "$log" > "$tmp/many.json" || no "report of three inputs"
"$py" - "$tmp/many.json" <<'PY' || no "three inputs: see above"
import json, sys
doc = json.load(open(sys.argv[1]))
ps = {p["pid"]: p for p in doc["processes"]}
assert "callsites" not in ps[1] and "callsites" not in ps[2], sorted(ps[1])
assert ps[4242]["callsites"]["at_peak"][0]["site"] == "forward (model.py:12)", ps[4242]
assert len(doc["snapshots"]) == 2, doc["snapshots"]
PY

# The JSON of each grouping validates against the schema (an untagged report has no
# peak_by_tag; rows carry user_frame, stacks, skipped).
if [ -n "$root" ] && command -v node >/dev/null && [ -d "$root/tests/prof/node_modules/ajv" ]; then
    : > "$tmp/all.ndjson"
    for a in "" "--by stack" "--by file" "--frames all" "--by tag" "--skip-frames forw"; do
        for f in "$snap" "$log"; do
            "$mt" report --json $a "$f" |
                "$py" -c "import json, sys; print(json.dumps(json.load(sys.stdin)))" >> "$tmp/all.ndjson"
        done
    done
    node "$root/tests/prof/validate.mjs" "$root/docs/telemetry.schema.json" "$tmp/all.ndjson" ||
        no "a report's JSON breaks docs/telemetry.schema.json"
else
    echo "note: no node or ajv (npm ci --prefix tests/prof): the schema check is skipped"
fi
exit $fail
