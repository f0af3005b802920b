#!/bin/sh
# The memtrace commands on the shipped snapshots: every malformed file exits with the
# status and message its .expected names, from each reader; the good ones replay and report.
# usage: test_cli.sh MEMTRACE DATA_DIR
set -u
mt=$1
data=$2
fail=0
for f in "$data"/invalid/*.pickle; do
    exp=$(head -n 1 "$f.expected")
    want_rc=${exp%% *}
    want_msg=${exp#* }
    for cmd in replay report "plot -o /dev/null" "view --get /state" "diff $f"; do
        out=$("$mt" $cmd "$f" 2>&1 >/dev/null)
        rc=$?
        case "$out" in
        *"$want_msg"*) ;;
        *) echo "FAIL: memtrace $cmd $f: message '$out', expected '$want_msg'"; fail=1 ;;
        esac
        if [ "$rc" != "$want_rc" ]; then
            echo "FAIL: memtrace $cmd $f: exit $rc, expected $want_rc"
            fail=1
        fi
    done
done
for f in "$data"/v2_all_actions_p*.pickle; do
    out=$("$mt" replay --json "$f") || { echo "FAIL: replay $f"; fail=1; }
    case "$out" in
    *'"peak_reserved_bytes": 23068672'*) ;;
    *) echo "FAIL: replay --json $f: PyTorch's peak reserved (22 MiB) not printed: $out"; fail=1 ;;
    esac
done
out=$("$mt" replay "$data/v2_all_actions_p4.pickle") || fail=1
case "$out" in
*"PyTorch"*"memtrace"*"peak reserved"*) ;;
*) echo "FAIL: replay table: $out"; fail=1 ;;
esac
# Each device's trace is replayed on its own (issue 15: per device, for traces that carry one).
case "$out" in
*"device 0: 5 allocs"*"device 1: 2 allocs"*) ;;
*) echo "FAIL: replay per device: $out"; fail=1 ;;
esac
# External annotations mark the plot's timeline: memtrace's own stages as markers, any
# other stage by its name.
svg=$(mktemp -d)/a.svg
"$mt" plot "$data/v2_all_actions_p4.pickle" -o "$svg" || { echo "FAIL: plot of a snapshot"; fail=1; }
grep -q 'class="mark"><title>optimizer at ' "$svg" ||
    { echo "FAIL: the 'optimizer' annotation is not on the plot's timeline"; fail=1; }
# A trace with no clock (PyTorch wrote no time_us before): the report and the plot count
# events where they would show seconds, and tell no lifetimes (every block would read as
# freed within 1 ms); a timed trace keeps seconds and its temporary allocations.
u="$data/v2_untimed.pickle"
out=$("$mt" report "$u") || { echo "FAIL: report of a trace without times"; fail=1; }
case "$out" in
*"timeline (the input has no clock: by event"*"event    allocated"*) ;;
*) echo "FAIL: the untimed report's timeline is not by event: $out"; fail=1 ;;
esac
case "$out" in
*"temporary allocations (freed within"*) echo "FAIL: the untimed report tells lifetimes: $out"; fail=1 ;;
esac
out=$("$mt" report --json "$u") || fail=1
case "$out" in
*'"clock": "event_order"'*) ;;
*) echo "FAIL: report --json of the untimed trace does not say its clock"; fail=1 ;;
esac
case "$out" in
*'"temporary"'*) echo "FAIL: report --json of the untimed trace has temporaries"; fail=1 ;;
esac
out=$("$mt" report "$data/v2_all_actions_p4.pickle") || fail=1
case "$out" in
*"t (s)"*"temporary allocations (freed within"*) ;;
*) echo "FAIL: the timed report lost its seconds or temporaries: $out"; fail=1 ;;
esac
# A trace entry of an action memtrace does not model (a newer PyTorch's) is skipped, and the
# report says so, as replay does: a reader is not left to think the file had no such entry.
case "$out" in
*"1 trace entries of actions memtrace does not model were skipped"*) ;;
*) echo "FAIL: the report does not tell the skipped entry: $out"; fail=1 ;;
esac
"$mt" report --json "$data/v2_all_actions_p4.pickle" | grep -q '"skipped_entries": 1' ||
    { echo "FAIL: report --json has no skipped_entries of 1"; fail=1; }
"$mt" plot "$u" -o "$svg" || { echo "FAIL: plot of the untimed trace"; fail=1; }
grep -q '>event (the input has no clock)</text>' "$svg" && ! grep -q 'time (s)' "$svg" ||
    { echo "FAIL: the untimed plot's axis is not by event"; fail=1; }
"$mt" plot "$data/v2_all_actions_p4.pickle" -o "$svg" || fail=1
grep -q '>time (s)</text>' "$svg" || { echo "FAIL: the timed plot's axis is not time"; fail=1; }
# A state snapshot (segments only, an empty trace per device: torch.cuda.memory._snapshot()
# with no history recorded) is read, not refused as "out of memory" (an empty trace list
# reserved no room); it is reported as its one moment: no timeline or growth, its live
# blocks live when it was taken (not leaks), its call sites those blocks' and only on the
# device that has segments; the block autograd's engine thread allocated is named by its node.
st="$data/v2_state_only.pickle"
out=$("$mt" report "$st") || { echo "FAIL: report of a state snapshot: $out"; fail=1; }
case "$out" in
*"a state snapshot (no allocation history)"*"live when the snapshot was taken: 2 allocations, 8.0 MiB"*) ;;
*) echo "FAIL: the state snapshot's report does not say what it is: $out"; fail=1 ;;
esac
case "$out" in
*"timeline:"* | *"timeline (the"* | *"growth across"* | *"never freed"* | *"device 1:"* | \
    *"not in the segment map"*)
    echo "FAIL: the state snapshot's report reads its state as a history: $out"; fail=1 ;;
esac
case "$out" in
*"peak allocated 8.0 MiB, peak reserved 22.0 MiB; at the end 8.0 MiB allocated, 22.0 MiB reserved"*) ;;
*) echo "FAIL: the state snapshot peaks before its one moment: $out"; fail=1 ;;
esac
case "$out" in
*"device 0: live bytes when the snapshot was taken (8.00 MiB"*"512 B      1  AddmmBackward0 (autograd)"*) ;;
*) echo "FAIL: the state snapshot's call sites are not its live blocks': $out"; fail=1 ;;
esac
out=$("$mt" report --json "$st") || fail=1
case "$out" in
*'"source": "torch_snapshot"'*'"state_only": true'*) ;;
*) echo "FAIL: report --json of the state snapshot does not say it is one"; fail=1 ;;
esac
"$mt" plot "$st" -o "$svg" || { echo "FAIL: plot of a state snapshot"; fail=1; }
grep -q '>block, in address order (a state snapshot: no history)</text>' "$svg" &&
    grep -q 'a state snapshot of 6 segments and blocks (no history)' "$svg" ||
    { echo "FAIL: the state snapshot's plot reads as a history"; fail=1; }
# 1.13's list is a state too: its call sites come from its blocks (none were printed), and
# a block's frames from its newest history entry, as PyTorch 1.13 and 2.0 keep them (public
# 2.0 snapshots read "<no frames>" for every block before): the 1.13 list, and the 2.0 dict
# with 1.13's blocks.
for f in v113_segments v20_history; do
    out=$("$mt" report "$data/$f.pickle") || fail=1
    case "$out" in
    *"live bytes "*"(12.00 MiB, requested), by site"*"8.00 MiB      1  model.py:77 loss"*"4.00 MiB      1  model.py:41 forward"*) ;;
    *) echo "FAIL: the $f snapshot's live bytes by site from its blocks' history: $out"; fail=1 ;;
    esac
    case "$out" in
    *"<no frames>"*) echo "FAIL: $f: a block with history frames reads <no frames>"; fail=1 ;;
    esac
done
# A snapshot the streamed read gives up on is read whole, also through a pipe (which cannot
# be read twice); a compressed one whose writer stalls 6 s after its first byte (longer than
# a look used to wait) is still a snapshot.
tw="$data/v2_trace_twice.pickle"
want=$("$mt" report "$tw" 2>&1 | sed "s|$tw|-|g; s|\"v2_trace_twice\.pickle\"|\"-\"|g") ||
    { echo "FAIL: report of $tw"; fail=1; }
got=$(cat "$tw" | "$mt" report - 2>&1) || { echo "FAIL: report - of $tw: $got"; fail=1; }
[ "$got" = "$want" ] || { echo "FAIL: report - of $tw differs: $got"; fail=1; }
gz="$data/compressed/v2_torch_frames.pickle.gz"
got=$( { head -c 1 "$gz"; sleep 6; tail -c +2 "$gz"; } | "$mt" report - 2>&1) ||
    { echo "FAIL: report of a gzip'ed snapshot stalled 6 s: $got"; fail=1; }
case "$got" in
*"1 snapshot, 10 events"*) ;;
*) echo "FAIL: a gzip'ed snapshot stalled 6 s is not read as one: $got"; fail=1 ;;
esac
# Names that are not UTF-8 keep --json and the SVG well-formed (they were dropped from the
# JSON, and made the SVG invalid XML).
odd="$data/v2_odd_names.pickle"
"$mt" report --json "$odd" | python3 -c 'import json, sys; d = json.load(sys.stdin); assert len(d["snapshots"][0]["annotations"]) == 3, d["snapshots"]' ||
    { echo "FAIL: report --json of odd annotation names"; fail=1; }
"$mt" plot "$odd" -o "$svg" >/dev/null 2>&1 &&
    python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' "$svg" ||
    { echo "FAIL: plot of odd annotation names is not XML"; fail=1; }
# Standard input named /dev/stdin, and standard input a socket (a socketpair, as some
# launchers give), are looked into as a pipe is.
got=$(cat "$gz" | "$mt" report /dev/stdin 2>&1)
case "$got" in *"1 snapshot, 10 events"*) ;; *) echo "FAIL: report /dev/stdin: $got"; fail=1 ;; esac
got=$(python3 -c '
import socket, subprocess, sys, threading
a, b = socket.socketpair()
def w():
    a.sendall(open(sys.argv[2], "rb").read()); a.shutdown(socket.SHUT_WR)
threading.Thread(target=w).start()
sys.stdout.write(subprocess.run([sys.argv[1], "report", "-"], stdin=b, capture_output=True, text=True).stdout)
' "$mt" "$gz" 2>&1)
case "$got" in *"1 snapshot, 10 events"*) ;; *) echo "FAIL: report - from a socket: $got"; fail=1 ;; esac
# A compiled model's annotations (hundreds of one name) are listed by name, --top of them,
# and plotted as ticks with no dashed line or label each.
many="$data/v2_many_annotations.pickle"
out=$("$mt" report --top 1 "$many") || fail=1
case "$out" in
*"annotations: 84, 3 names"*"    starts   ends      first       last     inside  name"*"_compile.compile_inner (dynamo_timed)"*"... 2 more (--top)"*) ;;
*) echo "FAIL: the annotations are not listed by name, --top of them: $out"; fail=1 ;;
esac
out=$("$mt" report "$many") || fail=1
printf '%s\n' "$out" | grep -q '^ *40 *40 .* pad_mm_benchmark (dynamo_timed)$' ||
    { echo "FAIL: the 40 pad_mm_benchmark pairs are not one row: $out"; fail=1; }
"$mt" plot "$many" -o "$svg" >/dev/null 2>&1 || fail=1
ticks=$(grep -o 'stroke-dasharray="none"' "$svg" | wc -l)
labels=$(grep -o '<text[^>]*>pad_mm[^<]*</text>' "$svg" | wc -l)
[ "$ticks" = 40 ] && [ "$labels" -le 1 ] ||
    { echo "FAIL: plot of 40 marks of one name: $ticks ticks, $labels labels"; fail=1; }
# A traced snapshot is a moment too: what is live at its end is not called a leak.
out=$("$mt" report "$data/v2_all_actions_p4.pickle") || fail=1
case "$out" in
*"live when the snapshot was taken: "*) ;;
*) echo "FAIL: the traced snapshot's live blocks are called never freed: $out"; fail=1 ;;
esac
# A trace begun in the middle of a run (PyTorch keeps the last max_entries events): what was
# there before it is read from the segments at the end and the trace's frees of blocks it
# never allocated, as memory_viz reads them. The figures at the end are the segments', the
# gap has nothing unexplained, the weights from before count at the peak, a block the trace
# allocated has its bytes at the end (2 MiB for 1.5 MiB), and a block from before it has no
# lifetime (freed 1 us into the trace, it is no temporary) and is named by its free's stack
# (context='all'), as such: "before the trace, freed at" its user frame, never bare.
mr="$data/v2_midrun.pickle"
out=$("$mt" report "$mr") || { echo "FAIL: report of a trace begun mid-run"; fail=1; }
case "$out" in
*"peak allocated 12.0 MiB, peak reserved 22.0 MiB; at the end 10.0 MiB allocated, 22.0 MiB reserved"*) ;;
*) echo "FAIL: the mid-run trace's figures are not its segments': $out"; fail=1 ;;
esac
case "$out" in
*"not in the segment map"* | *"4.0 MiB         "*) echo "FAIL: the mid-run trace's gap or temporaries: $out"; fail=1 ;;
esac
case "$out" in
*"rounding of requests               0 B      512.0 KiB"*"12.00 MiB, requested), by site"*"8.00 MiB      1  model.py:10 __init__"*"4.00 MiB      1  before the trace, freed at model.py:101 forward"*) ;;
*) echo "FAIL: the mid-run trace's blocks from before it or its end sizes: $out"; fail=1 ;;
esac
case "$out" in
*"temporary allocations"*"1.0 MiB         1 us  adam.py:150 step"*) ;;
*) echo "FAIL: the mid-run trace's own temporary is missing: $out"; fail=1 ;;
esac
case "$out" in
*[0-9]"  model.py:101"* | *"THPVariable"*) echo "FAIL: a block from before the trace is named by its free as if made there: $out"; fail=1 ;;
esac
# The same with expandable segments (PyTorch 2.1+): the trace unmaps pages mapped before it
# and maps others. The pages before it are read from its first touch of each, so the segment
# map holds the weights' block at the peak: one run of 6 MiB, as the file's segments say
# (before, the run was left out whole and the map showed only the 2 MiB the trace mapped).
xm="$data/v2_expandable_midrun.pickle"
"$mt" plot "$xm" -o "${svg%/a.svg}/xm.svg" >/dev/null 2>&1 ||
    { echo "FAIL: plot of an expandable trace begun mid-run"; fail=1; }
grep -q 'segment map at 0.000 s (peak reserved): 1 segment, 6.0 MiB' "${svg%/a.svg}/xm.svg" ||
    { echo "FAIL: the expandable mid-run trace's segment map: $(grep -o 'segment map at[^<]*' "${svg%/a.svg}/xm.svg")"; fail=1; }
# replay starts from the same state: the blocks from before the trace are allocated first, so
# memtrace's peak allocated is PyTorch's (before, the replay lacked them and read as a saving).
out=$("$mt" replay "$mr") || { echo "FAIL: replay of a trace begun mid-run"; fail=1; }
case "$out" in
*"2 blocks live before the trace began, allocated first (1 of them freed in it)"*"peak allocated              12.00 MiB      12.00 MiB   (+0.0%)"*"OOMs 0"*) ;;
*) echo "FAIL: the mid-run replay does not start from the trace's start: $out"; fail=1 ;;
esac
# A snapshot given to export (which writes logs as snapshots) is named as such, once, with
# status 2: not read as a log of malformed lines.
out=$("$mt" export --format torch-snapshot "$u" -o "${svg%/a.svg}/x.pickle" 2>&1)
rc=$?
case "$out" in
*"is a PyTorch snapshot already, not a telemetry log"*) ;;
*) echo "FAIL: export of a snapshot: $out"; fail=1 ;;
esac
[ "$rc" = 2 ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] ||
    { echo "FAIL: export of a snapshot: status $rc, $(printf '%s\n' "$out" | wc -l) lines"; fail=1; }
# An RMM log given to the commands that read memtrace's logs: named once, not read as
# lines of malformed JSON; replay reads it (with and without 0x: RMM's releases differ).
rmm="${svg%/a.svg}/rmm.csv"
printf 'Thread,Time,Action,Pointer,Size,Stream\n7,23:59:59.999990,allocate,7f0000000000,64,7f01\n7,00:00:00.000010,free,0x7f0000000000,64,0x7f01\n' >"$rmm"
for cmd in "report" "plot -o ${svg%/a.svg}/x.svg"; do
    out=$("$mt" $cmd "$rmm" 2>&1 >/dev/null)
    case "$out" in
    *"is an RMM log (CSV), not a memtrace log: 'memtrace replay' reads it") ;;
    *) echo "FAIL: memtrace $cmd of an RMM log: $out"; fail=1 ;;
    esac
done
"$mt" replay "$rmm" >/dev/null || { echo "FAIL: replay of an RMM log with both hex forms"; fail=1; }
# A compressed snapshot under a name that does not end in .pickle (snap.pickle.gz) is known
# by its decompressed first byte and read as the plain one: the same report, status 0, not
# a compressed log of malformed lines.
dir=${svg%/a.svg}
for z in "$data"/compressed/*.pickle.*; do
    base=$(basename "$z")
    plain="$data/${base%.pickle.*}.pickle"
    cp "$z" "$dir/snap.pickle.${base##*.}"
    cp "$plain" "$dir/snap.pickle"
    for cmd in report replay; do
        want=$("$mt" $cmd "$dir/snap.pickle" 2>&1) || { echo "FAIL: $cmd $plain"; fail=1; }
        got=$("$mt" $cmd "$dir/snap.pickle.${base##*.}" 2>&1)
        rc=$?
        [ "$rc" = 0 ] || { echo "FAIL: memtrace $cmd of $base: status $rc: $got"; fail=1; }
        got=$(printf '%s' "$got" | sed "s|snap\.pickle\.${base##*.}|snap.pickle|g")
        [ "$got" = "$want" ] || { echo "FAIL: memtrace $cmd of $base differs from the plain file's:"; printf '%s\n---\n%s\n' "$got" "$want"; fail=1; }
        # Through a pipe, on standard input and as a shell's <(...), the same again; the
        # compressed one also from a writer that stops after its first 10 bytes, so that
        # its first byte is not there yet when memtrace looks.
        want=$(printf '%s' "$want" | sed "s|$dir/snap\.pickle|-|g; s|\"snap\.pickle\"|\"-\"|g")
        for how in stdin slow procsub; do
            case $how in
            stdin) got=$(cat "$z" | "$mt" $cmd - 2>&1) ;;
            slow) got=$( (head -c 10 "$z"; sleep 0.3; tail -c +11 "$z") | "$mt" $cmd - 2>&1) ;;
            procsub) got=$(bash -c '"$1" "$2" <(cat "$3") 2>&1' _ "$mt" $cmd "$z" |
                sed 's|/dev/fd/[0-9]*|-|g; s|"[0-9][0-9]*"|"-"|g') ;;
            esac
            rc=$?
            [ "$rc" = 0 ] || { echo "FAIL: memtrace $cmd of $base ($how): status $rc: $got"; fail=1; }
            [ "$got" = "$want" ] || { echo "FAIL: memtrace $cmd of $base ($how) differs from the plain file's:"; printf '%s\n---\n%s\n' "$got" "$want"; fail=1; }
        done
    done
done
rm -rf "${svg%/a.svg}"
exit $fail
