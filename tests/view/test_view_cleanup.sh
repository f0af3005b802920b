#!/bin/sh
# memtrace view leaves nothing behind: its private directory under /tmp, the socket and the
# token file in it go when it stops (Ctrl-C), as they do when it fails to start.
#   test_view_cleanup.sh MEMTRACE LOG
set -u
mt=$1 log=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ls -d /tmp/memtrace-view-* 2>/dev/null | sort >"$work/before"
"$mt" view --port 0 "$log" 2>"$work/err" &
pid=$!
i=0
while ! grep -q "open http" "$work/err" && [ $i -lt 300 ]; do
    sleep 0.1
    i=$((i + 1))
done
if ! grep -q "open http" "$work/err"; then
    echo "FAIL: memtrace view did not say where to open within 30 s: $(cat "$work/err")"
    kill "$pid" 2>/dev/null
    exit 1
fi
ls -d /tmp/memtrace-view-* 2>/dev/null | sort >"$work/during"
mine=$(comm -13 "$work/before" "$work/during")
if [ -z "$mine" ] || [ ! -e "$mine/sock" ]; then
    echo "FAIL: no new /tmp/memtrace-view-*/sock while view runs (found '$mine')"
    kill "$pid" 2>/dev/null
    exit 1
fi
kill -INT "$pid"
wait "$pid"
status=$?
[ "$status" -eq 0 ] || { echo "FAIL: view exited $status on Ctrl-C: $(cat "$work/err")"; exit 1; }
if [ -e "$mine" ]; then
    echo "FAIL: $mine is left behind, holding: $(ls -A "$mine" | tr '\n' ' ')"
    exit 1
fi
# A view that stops on a log it cannot read removes it too.
"$mt" view --port 0 /nonexistent.ndjson 2>"$work/err2"
ls -d /tmp/memtrace-view-* 2>/dev/null | sort >"$work/after"
left=$(comm -13 "$work/before" "$work/after")
[ -z "$left" ] || { echo "FAIL: a failed view left $left"; exit 1; }
echo "view: its directory, socket and token are gone after Ctrl-C and after a failed start"
