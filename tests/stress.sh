#!/usr/bin/env bash
# The whole suite, RUNS times in a row, each under `stress-ng --cpu CPUS` (a host that is
# busy with something else, as CI machines and developers' laptops are). Prints each run's
# verdict, then every test that failed in any run with its count, and exits non-zero if
# any run failed. The build is made once: every run tests the same binaries.
#   tests/stress.sh BUILD_DIR [RUNS=10] [CPUS=2]
set -uo pipefail
dir=${1:?usage: tests/stress.sh BUILD_DIR [RUNS] [CPUS]}
runs=${2:-10}
cpus=${3:-2}
command -v stress-ng >/dev/null || { echo "stress.sh: stress-ng is not installed" >&2; exit 2; }
[ -f "$dir/build.ninja" ] || { echo "stress.sh: $dir is not a configured build" >&2; exit 2; }
meson compile -C "$dir" >/dev/null || { echo "stress.sh: the build of $dir failed" >&2; exit 2; }

stress-ng --cpu "$cpus" --timeout 0 --quiet &
load=$!
trap 'kill $load 2>/dev/null; wait $load 2>/dev/null' EXIT
failed_runs=0
declare -A fails=()
for r in $(seq 1 "$runs"); do
    t0=$(date +%s)
    meson test -C "$dir" --no-rebuild --num-processes 2 --logbase "stress-$r" >/dev/null 2>&1
    log=$dir/meson-logs/stress-$r.json
    bad=$(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    t = json.loads(line)
    if t["result"] not in ("OK", "SKIP", "EXPECTEDFAIL"):
        print(t["name"] + ":" + t["result"])' "$log")
    n=$(wc -l <"$log")
    if [ -z "$bad" ]; then
        echo "run $r/$runs: $n tests, all passed ($(($(date +%s) - t0)) s, load $(cut -d' ' -f1 /proc/loadavg))"
    else
        failed_runs=$((failed_runs + 1))
        echo "run $r/$runs: FAILED: $(echo "$bad" | tr '\n' ' ')($(($(date +%s) - t0)) s)"
        for b in $bad; do fails[$b]=$((${fails[$b]:-0} + 1)); done
    fi
done
echo "stress (--cpu $cpus): $((runs - failed_runs)) of $runs runs passed"
for k in "${!fails[@]}"; do echo "  $k: failed in ${fails[$k]} of $runs runs"; done
[ "$failed_runs" -eq 0 ]
