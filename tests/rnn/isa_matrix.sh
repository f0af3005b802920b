#!/usr/bin/env bash
# The RNN engine's tests at every instruction set level this host runs.
#
#   tests/rnn/isa_matrix.sh BUILD_DIR
#
# For each level (x86-64: auto, then avx512 when /proc/cpuinfo has the x86-64-v4 flags, avx2
# when it has the x86-64-v3 ones, always baseline; other machines: native only) it runs the
# rnn suite (goldens, bit identity, splits) with the engine's cell loops capped by
# MEMTRACE_CPU_ISA and each library lowered through its own switch:
#
#   level     MEMTRACE_CPU_ISA  LIBXSMM_TARGET        ONEDNN_MAX_CPU_ISA  OPENBLAS_CORETYPE
#   auto      (unset)           (unset: native)       (unset: all)        (unset: detected)
#   avx512    avx512            (unset: native)       (unset: all)        SkylakeX
#   avx2      avx2              hsw                   AVX2                Zen (AMD) / Haswell
#   baseline  baseline          generic (engine off)  SSE41               Nehalem
#
# BLIS has no usable switch here: Debian's BLIS 0.9.0 reads BLIS_ARCH_TYPE but aborts for
# every id ("Accessed uninitialized context in gks"), its one registered configuration being
# generic; it runs that at every level. OPENBLAS_L2_SIZE is left as the host has it.
# "auto" is what a user who sets nothing gets: each library's own choice for this CPU
# (OpenBLAS 0.3.21 takes Zen 5 for a Cooper Lake, say), whatever the caller's environment
# sets (a CI host may pin OPENBLAS_CORETYPE).
#
# Then it runs test_rnn_golden --matrix at the level (the goldens on each library at 1 and 2
# threads, each naming the kernels actually used) and prints a table: level x library x
# threads with the kernels and each verdict. Exits non-zero if any level fails. Logs go to
# BUILD_DIR/meson-logs/isa-<level>*.txt (meson's own testlog is left alone).
set -uo pipefail

if [ $# -ne 1 ] || [ ! -f "$1/build.ninja" ]; then
    echo "usage: $0 BUILD_DIR (a configured meson build directory)" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
logs=$build/meson-logs
mkdir -p "$logs"
t_start=$(date +%s)

# ---- the host's levels ----
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2)
vendor=$(grep -m1 '^vendor_id' /proc/cpuinfo 2>/dev/null | awk '{print $3}')
has() { # has FLAG...: every flag is in /proc/cpuinfo
    local f
    for f in "$@"; do
        [[ " $flags " == *" $f "* ]] || return 1
    done
}
levels=()
if [ "$(uname -m)" = x86_64 ]; then
    levels+=(auto)
    has avx512f avx512bw avx512vl avx512dq avx512cd && levels+=(avx512)
    has avx2 fma bmi1 bmi2 f16c movbe && levels+=(avx2)
    levels+=(baseline)
else
    levels+=(native)
fi

# The environment of a level: the switches set or unset, as `env` arguments.
level_env() {
    local zen=Haswell
    [ "$vendor" = AuthenticAMD ] && zen=Zen
    # Whatever the caller set, each level names every switch itself.
    local base=(-u MEMTRACE_RNN_XSMM -u LIBXSMM_TARGET -u ONEDNN_MAX_CPU_ISA -u DNNL_MAX_CPU_ISA
                -u MEMTRACE_CPU_ISA)
    case $1 in
    avx512) echo "${base[*]} MEMTRACE_CPU_ISA=avx512 OPENBLAS_CORETYPE=SkylakeX" ;;
    avx2) echo "${base[*]} MEMTRACE_CPU_ISA=avx2 LIBXSMM_TARGET=hsw ONEDNN_MAX_CPU_ISA=AVX2" \
        "OPENBLAS_CORETYPE=$zen" ;;
    baseline) echo "${base[*]} MEMTRACE_CPU_ISA=baseline LIBXSMM_TARGET=generic" \
        "ONEDNN_MAX_CPU_ISA=SSE41 OPENBLAS_CORETYPE=Nehalem" ;;
    native) echo "${base[*]}" ;;
    auto) echo "${base[*]} -u OPENBLAS_CORETYPE" ;;
    esac
}

# ---- build the suite's executables (only those) ----
targets=$(meson introspect "$build" --tests | python3 -c '
import json, os, sys
build = sys.argv[1]
for t in json.load(sys.stdin):
    if any(s.split(":")[-1] == "rnn" for s in t["suite"]):
        print(os.path.relpath(t["cmd"][0], build))
' "$build") || { echo "isa_matrix: meson introspect failed" >&2; exit 2; }
[ -n "$targets" ] || { echo "isa_matrix: no test of suite rnn in $build" >&2; exit 2; }
# shellcheck disable=SC2086
meson compile -C "$build" $targets >"$logs/isa-build.txt" 2>&1 ||
    { cat "$logs/isa-build.txt" >&2; echo "isa_matrix: build failed" >&2; exit 2; }
golden=$build/tests/rnn/test_rnn_golden

# ---- each level ----
failed=0
rows=()
summary=()
for lv in "${levels[@]}"; do
    read -r -a envs <<<"$(level_env "$lv")"
    t0=$(date +%s)
    env "${envs[@]}" meson test -C "$build" --suite rnn --no-rebuild --print-errorlogs \
        --logbase "isa-$lv" >"$logs/isa-$lv-suite.txt" 2>&1
    suite_rc=$?
    ok=$(grep -cE '^ *[0-9]+/[0-9]+ .* OK ' "$logs/isa-$lv-suite.txt")
    total=$(grep -cE '^ *[0-9]+/[0-9]+ ' "$logs/isa-$lv-suite.txt")
    env "${envs[@]}" "$golden" "$src/tests/rnn/data" --matrix >"$logs/isa-$lv-matrix.txt" 2>&1
    matrix_rc=$?
    verdict=PASS
    if [ $suite_rc -ne 0 ] || [ $matrix_rc -ne 0 ]; then
        verdict=FAIL
        failed=1
    fi
    summary+=("$(printf '%-8s  rnn suite %s/%s OK, goldens matrix rc %d: %s (%ds)' "$lv" "$ok" \
        "$total" "$matrix_rc" "$verdict" $(($(date +%s) - t0)))")
    for lib in cblas blis dnnl; do
        for thr in 1 2; do
            name="golden_${lib}_${thr}thr"
            res=$(grep -oE "^\[ *(OK|FAILED|SKIPPED|ERROR) *\] $name\$" "$logs/isa-$lv-matrix.txt" |
                head -1 | sed -E 's/^\[ *([A-Z]+) *\].*/\1/')
            info=$(grep -m1 "^matrix-info $lib $thr: " "$logs/isa-$lv-matrix.txt" |
                sed "s/^matrix-info $lib $thr: //")
            # The library's kernel, libxsmm's target (or off) and the cell loops' level.
            kern=$(sed -E 's/;.*//; s/^OpenBLAS .*kernel /OpenBLAS /; s/^BLIS [^,]*, kernel /BLIS /;
                s/^oneDNN [^,]*, JIT for cpu isa /oneDNN isa /' <<<"$info")
            xsmm=$(grep -oE 'libxsmm [^;]*' <<<"$info" | sed -E 's/^libxsmm [0-9.]+, JIT for //')
            cells=$(grep -oE 'cell loops [a-z0-9]+' <<<"$info" | sed 's/cell loops //')
            [ -n "$info" ] && xsmm=${xsmm:-off}
            rows+=("$(printf '%-8s  %-5s %3s  %-22s %-8s %-8s %s' "$lv" "$lib" "$thr" \
                "${kern:--}" "${xsmm:--}" "${cells:--}" "${res:-MISSING}")")
            [ "${res:-MISSING}" = MISSING ] && failed=1
        done
    done
done

echo "ISA matrix of the RNN engine ($build), host levels: ${levels[*]}"
printf '%-8s  %-5s %3s  %-22s %-8s %-8s %s\n' level lib thr "library kernel" libxsmm cells goldens
for r in "${rows[@]}"; do
    echo "$r"
done
for s in "${summary[@]}"; do
    echo "$s"
done
echo "isa_matrix: $(($(date +%s) - t_start)) s; logs in $logs/isa-*.txt"
if [ $failed -ne 0 ]; then
    echo "isa_matrix: FAILED (see the logs of the failing level)"
    exit 1
fi
echo "isa_matrix: every level passed"
