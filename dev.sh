#!/usr/bin/env bash
# memtrace developer entry point: installs what is missing (Debian 12), configures,
# builds, then runs the demo or the test suite. Idempotent; safe to run again.
#
#   ./dev.sh demo     the main job: the demo on the sim backend (or a GPU, if present)
#   ./dev.sh test     the whole test suite, then again under ASan+UBSan
#   ./dev.sh build    configure and build only (release, in build/)
#   ./dev.sh bench    the benchmarks (release), each printing a table
#   ./dev.sh fuzz     every libFuzzer harness (or those in FUZZ_ONLY) for FUZZ_SECONDS (300) each
#   ./dev.sh stress [RUNS]  the debugoptimized suite RUNS (10) times under stress-ng --cpu 2
#   ./dev.sh check SUITE... one or more meson suites (or test names) in the debugoptimized build
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(build-essential meson ninja-build pkg-config libuv1-dev libjansson-dev
          libcmocka-dev libopenblas-dev prometheus libjemalloc-dev libmimalloc-dev
          libxml2-utils libdw-dev libunwind-dev liblzma-dev zlib1g-dev libzstd-dev
          libblis-dev libdnnl-dev libxsmm-dev python3-torch chromium clang-14 libclang-rt-14-dev)

install_missing() {
    local missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "dev.sh: installing missing packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    # Quiet on success; on failure the whole output is shown, naming what failed.
    local out
    out=$(mktemp)
    if ! $sudo apt-get update >"$out" 2>&1; then
        cat "$out" >&2
        echo "dev.sh: 'apt-get update' failed (output above)" >&2
        rm -f "$out"
        return 1
    fi
    if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends \
        "${missing[@]}" >"$out" 2>&1; then
        cat "$out" >&2
        echo "dev.sh: 'apt-get install ${missing[*]}' failed (output above)" >&2
        rm -f "$out"
        return 1
    fi
    rm -f "$out"
}

# The telemetry schema test validates JSON with ajv (npm registry), pinned by the lock file.
install_test_tools() {
    # npm for the tests below; qemu-user runs the suites on an emulated AVX2-only CPU
    # (tests/cross/avx2_qemu.sh) and for aarch64.
    # Ask apt only for the commands that are missing: a Node.js from elsewhere (NodeSource's
    # nodejs ships its own npm) conflicts with Debian's npm package.
    PACKAGES=()
    command -v npm >/dev/null 2>&1 || PACKAGES+=(nodejs npm)
    command -v qemu-x86_64 >/dev/null 2>&1 || PACKAGES+=(qemu-user)
    [ ${#PACKAGES[@]} -eq 0 ] || install_missing
    if [ ! -d tests/prof/node_modules/ajv ]; then
        npm ci --prefix tests/prof --no-audit --no-fund --loglevel=error ||
            { echo "dev.sh: 'npm ci --prefix tests/prof' failed" >&2; return 1; }
    fi
    # The web page test drives headless Chromium with playwright-core (no browser download).
    if [ ! -d tests/web/node_modules/playwright-core ]; then
        PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix tests/web --no-audit --no-fund \
            --loglevel=error ||
            { echo "dev.sh: 'npm ci --prefix tests/web' failed" >&2; return 1; }
    fi
    # The Grafana dashboard is type-checked against Grafana's published schema (@grafana/schema).
    if [ ! -d tests/grafana/node_modules/@grafana/schema ]; then
        npm ci --prefix tests/grafana --no-audit --no-fund --loglevel=error ||
            { echo "dev.sh: 'npm ci --prefix tests/grafana' failed" >&2; return 1; }
    fi
}

build() { # build DIR [meson setup options...]
    local dir=$1; shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$@" >/dev/null || meson setup "$dir" "$@"
    fi
    meson compile -C "$dir"
}

# Prints the plain closing line CI reads, from meson's JSON test log.
# Several build dirs: the last line is their total, alone on the line.
summarise() { # summarise LABEL DIR...
    local label=$1 pass=0 fail=0 skip=0 d log
    shift
    for d in "$@"; do
        log=$d/meson-logs/testlog.json
        [ -f "$log" ] || { fail=$((fail + 1)); continue; }
        pass=$((pass + $(grep -c '"result": "OK"' "$log" || true)))
        fail=$((fail + $(grep -cE '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)))
        skip=$((skip + $(grep -c '"result": "SKIP"' "$log" || true)))
    done
    echo "$label: $pass passed, $fail failed, $skip skipped"
}

# A stage's start, with the seconds since dev.sh started: where CI's time goes.
stage() { echo "== +${SECONDS}s: $*"; }

# One harness ($1, named $2) for $3 seconds from seed $4, in work dir $5: every crasher
# fixed so far first, then the campaign from a copy of its seed corpus. What it printed goes
# to $5/$2.out, its verdict (0 or 1) to $5/$2.rc; run in the background by fuzz_run.
fuzz_one() {
    local t=$1 name=$2 secs=$3 seed=$4 work=$5 rc=0
    mkdir -p "$work/$name"
    [ -d "tests/fuzz/corpus/$name" ] && cp -r "tests/fuzz/corpus/$name/." "$work/$name/"
    {
        # Under clang's sanitizers (the fuzz-regress suite runs them under gcc's, which miss
        # some undefined behaviour, e.g. NULL + 0).
        if [ -d "tests/fuzz/regress/$name" ] &&
            ! "$t" -runs=1 tests/fuzz/regress/"$name"/* >"$work/$name.regress.log" 2>&1; then
            rc=1
            tail -40 "$work/$name.regress.log"
            echo "fuzz_$name FAILED on a regression input of tests/fuzz/regress/$name"
        fi
        echo "== fuzz_$name: ${secs}s"
        "$t" -seed="$seed" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=4096 \
            -artifact_prefix="$work/$name-" "$work/$name" >"$work/$name.log" 2>&1 || {
            rc=1
            tail -40 "$work/$name.log"
            echo "fuzz_$name FAILED: crashers in $work/$name-*"
        }
    } >"$work/$name.out" 2>&1
    echo $rc >"$work/$name.rc"
}

# The libFuzzer harnesses (tests/fuzz), each run for $1 seconds; a crash fails. The whole
# build is coverage-instrumented (tests/fuzz/README.md). A campaign uses one core: as many
# run at once as the host has cores, and each one's output is shown in the harnesses' order.
fuzz_run() { # fuzz_run SECONDS [SEED]
    local secs=$1 seed=${2:-0} rc=0 t name work names=()
    local cores
    cores=$(nproc 2>/dev/null || echo 1)
    local opts=(--buildtype=debug -Dfuzz=true -Db_lundef=false -Db_sanitize=address,undefined
        -Dc_args=-fsanitize=fuzzer-no-link)
    if [ ! -f build-fuzz/build.ninja ]; then
        CC=clang-14 meson setup build-fuzz "${opts[@]}" >/dev/null ||
            CC=clang-14 meson setup build-fuzz "${opts[@]}"
    fi
    # The harnesses alone: the rest of the tree's tests run in the other builds.
    meson compile -C build-fuzz $(cd tests/fuzz && ls fuzz_*.c | sed 's/\.c$//') || return 1
    work=$(mktemp -d)
    # Undefined behaviour stops a run, as a crash does.
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    for t in build-fuzz/tests/fuzz/fuzz_*; do
        [ -x "$t" ] && [ -f "$t" ] || continue
        name=${t##*/fuzz_}
        case $name in regress_*) continue ;; esac
        # FUZZ_ONLY="pickle daemon": only those harnesses.
        if [ -n "${FUZZ_ONLY:-}" ] && [[ " $FUZZ_ONLY " != *" $name "* ]]; then continue; fi
        while [ "$(jobs -rp | wc -l)" -ge "$cores" ]; do
            wait -n || true
        done
        names+=("$name")
        fuzz_one "$t" "$name" "$secs" "$seed" "$work" &
    done
    wait
    for name in "${names[@]}"; do
        cat "$work/$name.out"
        [ "$(cat "$work/$name.rc" 2>/dev/null)" = 0 ] || rc=1
    done
    [ $rc -eq 0 ] && rm -rf "$work"
    return $rc
}

cmd=${1:-}
case "$cmd" in
build)
    install_missing
    build build --buildtype=release
    ;;
demo)
    install_missing
    build build --buildtype=release
    shift
    log=build/demo.ndjson
    rm -f "$log"
    echo "== 1/3 train a character-level LSTM on the caching allocator (events -> $log)"
    MEMTRACE_PROF=log MEMTRACE_LOG="$log" ./build/examples/train_charlm "$@"
    echo
    echo "== 2/3 where the memory went: memtrace report $log"
    ./build/tools/memtrace report --steps 12 --top 5 "$log"
    ./build/tools/memtrace plot "$log" -o build/demo.svg
    echo "(the same run drawn: build/demo.svg — memory by tag over time, segment map at the peak)"
    echo
    echo "== 3/3 the same allocator on a variable-length RNN trace, with warm-up"
    ./build/tools/memtrace replay data/traces/rnn_varlen.csv --warmup
    ;;
test)
    install_missing
    install_test_tools
    # The release build users make (./dev.sh build, the demo's tree): no assertions, no debug
    # info, -O3. The assertions (cheap and expensive) run in the ASan+UBSan build below. A
    # third whole pass in a debugoptimized build (assertions at -O2) cost 6 minutes of CI's 30
    # and is left to ./dev.sh check and stress, whose tree it is. Suite 'slow' (fault
    # injection through every tool, every allocation site) runs here whole and under the
    # sanitizers at every 8th site.
    stage "release build and suite"
    build build --buildtype=release
    rc=0
    meson test -C build --print-errorlogs --num-processes 2 || rc=1
    summarise release build
    # The RNN suites again at each instruction-set level this host has, lowered through the
    # libraries' own switches and MEMTRACE_CPU_ISA: an AVX-512 host also checks the AVX2 and
    # baseline paths. It prints the matrix it ran (level x library x threads).
    stage "ISA matrix"
    tests/rnn/isa_matrix.sh build || rc=1
    # Then the whole process on an emulated AVX2-only CPU (qemu-user, -cpu Haswell-v4), where
    # every CPUID choice takes its AVX2 branch: the suites that can depend on the CPU.
    # On a host without AVX-512 it says so and does nothing.
    stage "emulated AVX2"
    tests/cross/avx2_qemu.sh build || rc=1
    # The same suite under AddressSanitizer + UndefinedBehaviorSanitizer, with the
    # expensive assertions (whole-structure checks) on; a tree set up before that option
    # existed gets it too.
    # -O1, as the sanitizers' documentation advises: the suite's test time falls by a fifth
    # against -O0 (887 s -> 705 s of test time, 2-core Zen 5), what they catch does not.
    asan_conf=(-Doptimization=1 -Db_sanitize=address,undefined -Db_lundef=false
               -Dassert_level=expensive)
    asan_opts=(--buildtype=debug "${asan_conf[@]}")
    if [ -f build-asan/build.ninja ]; then
        meson configure build-asan "${asan_conf[@]}" # a tree set up with older options
    fi
    stage "ASan + UBSan build and suite"
    build build-asan "${asan_opts[@]}"
    # The fault loops of the tools fail every 8th allocation site here (each run costs 10x
    # under ASan: every 4th would be about 180 s of this stage's test time); the release
    # stage above fails every one. Suite 'layers' reads the
    # objects' symbols and includes, which the sanitizers' instrumentation does not change:
    # it ran in release.
    MT_FAULT_STRIDE=8 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        meson test -C build-asan --print-errorlogs --num-processes 2 --timeout-multiplier 3 \
        --no-suite layers || rc=1
    summarise sanitizers build-asan
    # ThreadSanitizer on the tests whose threads share one allocator with thread caches:
    # recording in compact batches (the model property test), and an owner's hints against
    # claims of its cache (alloc_tc_race); and on the daemon's loop with its line encoder
    # thread, batches in flight across ticks (daemon_ack, daemon_e2e, daemon_binlog): a
    # data race fails them. The other suites are left out: TSan does not see the order the
    # caches' membarrier gate makes (docs/allocator-tcache.md), and these tests do not cross
    # it unordered.
    stage "TSan"
    tsan_opts=(--buildtype=debugoptimized -Db_sanitize=thread -Db_lundef=false)
    [ -f build-tsan/build.ninja ] || CC=clang-14 meson setup build-tsan "${tsan_opts[@]}" ||
        rc=1
    if ninja -C build-tsan tests/analysis/test_analysis_model_property \
        tests/alloc/test_alloc_tc_race tests/daemon/test_daemon_ack tests/daemon/test_daemon_e2e \
        tests/daemon/test_daemon_binlog; then
        TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 MT_TC_RACE_PAIRS=200000 \
            meson test -C build-tsan --no-rebuild --print-errorlogs analysis_model_property \
            alloc_tc_race daemon_ack daemon_e2e daemon_binlog || rc=1
    else
        rc=1
    fi
    summarise tsan build-tsan
    # The core layers built for aarch64 (Grace) and their suites run under qemu-user.
    stage "aarch64 under qemu"
    tests/cross/aarch64.sh || rc=1
    # Each fuzzer a short fixed budget, so that CI stays inside its time, from a fixed seed:
    # the test explores the same inputs every run (new ground is for `./dev.sh fuzz`, whose
    # seed is random); a crasher found there goes into tests/fuzz/regress.
    stage "fuzz"
    fuzz_run "${FUZZ_CI_SECONDS:-5}" "${FUZZ_CI_SEED:-1}" || rc=1
    stage "done"
    [ $rc -eq 0 ] || echo "some tests FAILED (see above)"
    summarise total build build-asan build-tsan build-aarch64
    exit $rc
    ;;
bench)
    install_missing
    build build --buildtype=release
    meson test -C build --benchmark --verbose
    ;;
fuzz)
    install_missing
    fuzz_run "${FUZZ_SECONDS:-300}"
    ;;
check)
    [ $# -ge 2 ] || { echo "usage: ./dev.sh check SUITE|TEST..." >&2; exit 2; }
    shift
    install_missing
    install_test_tools
    build build-test --buildtype=debugoptimized
    # A suite name runs the suite; anything else is taken as a test's name.
    suites=$(meson test -C build-test --list 2>/dev/null | sed -n 's/^\([^:]*\):\([^ ]*\) \/ .*/\2/p' | sort -u)
    args=()
    for s in "$@"; do
        if grep -qx -- "$s" <<<"$suites"; then args+=(--suite "$s"); else args+=("$s"); fi
    done
    meson test -C build-test --print-errorlogs --num-processes 2 "${args[@]}"
    ;;
gpu-check)
    # On a machine with an NVIDIA GPU: build against the real CUDA, then the ten checks of
    # a first real-GPU run, each bare and under memtrace (docs/gpu-findings-status.md).
    # Installs nothing; exits 77 naming why when there is no GPU.
    shift
    exec tests/gpu/gpu_check.sh "$@"
    ;;
stress)
    PACKAGES+=(stress-ng)
    install_missing
    install_test_tools
    build build-test --buildtype=debugoptimized
    tests/stress.sh build-test "${2:-10}" 2
    ;;
*)
    echo "usage: ./dev.sh demo|test|build|check SUITE|bench|fuzz|stress|gpu-check" >&2
    exit 2
    ;;
esac
