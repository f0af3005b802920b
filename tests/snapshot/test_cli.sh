#!/bin/sh
# The memtrace commands on the shipped snapshots: every malformed file exits with the
# status and message its .expected names; the good ones replay and report.
# usage: test_cli.sh MEMTRACE DATA_DIR
set -u
mt=$1
data=$2
fail=0
for f in "$data"/invalid/*.pickle; do
    exp=$(head -n 1 "$f.expected")
    want_rc=${exp%% *}
    want_msg=${exp#* }
    for cmd in replay report; do
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
rm -rf "${svg%/a.svg}"
exit $fail
