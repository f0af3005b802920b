#!/usr/bin/env bash
# The core of memtrace built for aarch64 (Debian's cross gcc, Debian's arm64 libraries by
# multiarch) and its suites run under qemu-user. Idempotent; as root it installs what is
# missing (apt's output shown whenever a step fails).
#
#   tests/cross/aarch64.sh            install if needed, configure, build, test
#   BUILD_AARCH64=dir tests/cross/aarch64.sh    another build dir (default build-aarch64)
#
# Core suites: util, sim (backend), alloc, host, prof, analysis, plus headers and cross
# (tests/cross: the ISA of the objects, the thread caches' exclusion, the ring's order),
# trace_csv (analysis) and stacks_capture (the profiler's call stacks: aarch64's unwinders
# give return addresses minus 1); the RNN engine's suite (its cell loops and GEMMs on
# arm64's OpenBLAS, against PyTorch's golden outputs); the snapshot reader's and the
# model's stack table's C tests. What is left out of the build or of the run is printed,
# with why. Not run here at all: the daemon's suite (its tests fork producers from a
# threaded process, which qemu-user 7.2 aborts on) and the tools' (shell scripts that exec
# the aarch64 memtrace, which needs a binfmt entry).
# The last line is CI's plain summary: "aarch64: N passed, N failed, N skipped".
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD_AARCH64:-build-aarch64}
CROSS=tests/cross/aarch64-linux-gnu.ini
ARM_PC=/usr/lib/aarch64-linux-gnu/pkgconfig
SUITES=(util sim alloc host prof analysis headers cross rnn)
EXTRA_TESTS=(trace_csv stacks_capture stacks_model snapshot snapshot_dag snapshot_timeline
             snapshot_write snapshot_frames_unit snapshot_roundtrip)
# Tests of those suites left out, each with why (printed).
LEFT_OUT=("rnn_process: qemu-user 7.2 aborts in a fork of a threaded process (its TCG asserts);
nothing CPU-dependent in it (tests/cross/avx2_qemu.sh leaves it out too)")
# C tests that run an aarch64 program they are handed (fork and exec): like the scripts
# below, they need the kernel's binfmt entry, which only meson's own command gets without it.
EXEC_TESTS=(prof_report_outside readers_same)
# Build machine tools and arm64 libraries of the core. libunwind is optional (backtrace()
# otherwise); libxsmm has no arm64 package, its option is turned off below.
PACKAGES=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user pkg-config meson ninja-build
          python3 binutils libc6:arm64 libjansson-dev:arm64 libuv1-dev:arm64
          libcmocka-dev:arm64 libopenblas-dev:arm64 libdw-dev:arm64 libunwind-dev:arm64
          liblzma-dev:arm64 zlib1g-dev:arm64 libzstd-dev:arm64)

t_start=$(date +%s)
say() { printf 'aarch64.sh: %s\n' "$*"; }

# Runs "$@" quietly; on failure shows everything it printed and fails.
run_shown() {
    local out rc=0
    out=$(mktemp)
    "$@" >"$out" 2>&1 || rc=$?
    if [ $rc -ne 0 ]; then
        cat "$out" >&2
        say "'$*' failed (exit $rc, output above)" >&2
    fi
    rm -f "$out"
    return $rc
}

install_missing() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        say "missing packages (run as root to install them): ${missing[*]}" >&2
        return 1
    fi
    say "installing: ${missing[*]}"
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        run_shown dpkg --add-architecture arm64
    fi
    run_shown apt-get -o DPkg::Lock::Timeout=900 update
    DEBIAN_FRONTEND=noninteractive run_shown apt-get -o DPkg::Lock::Timeout=900 install -y \
        --no-install-recommends "${missing[@]}"
}

# ---- configure: the non-core parts whose arm64 libraries or toolkits are missing, off ----
configure() {
    local opts=(--buildtype=debugoptimized -Dtests=true)
    say "left out of the aarch64 build:"
    # CUDA: the toolkit meson would find (cudatoolkit_dir) is the build machine's, and Debian
    # has no arm64 CUDA; the backend and its fake-driver tests stay on the x86 build.
    opts+=(-Dcuda=disabled -Dcudnn=disabled)
    say "  cuda, cudnn: no arm64 CUDA toolkit here (the CUDA backend is tested on the native build)"
    if [ -f "$ARM_PC/libxsmmnoblas.pc" ]; then
        opts+=(-Dxsmm=enabled)
    else
        opts+=(-Dxsmm=disabled)
        say "  xsmm: no arm64 libxsmm (Debian builds it for x86 only); the RNN engine uses BLAS"
    fi
    if [ -f "$ARM_PC/libunwind.pc" ]; then
        opts+=(-Dlibunwind=enabled)
    else
        opts+=(-Dlibunwind=disabled)
        say "  libunwind: no libunwind-dev:arm64; call stacks use glibc's backtrace()"
    fi
    if [ -f "$BUILD/build.ninja" ]; then
        # --reconfigure reads the meson.build files again: tests added since the last
        # setup are then in the introspection below.
        run_shown meson setup --reconfigure "$BUILD" --cross-file "$CROSS" "${opts[@]}"
    else
        run_shown meson setup "$BUILD" --cross-file "$CROSS" "${opts[@]}"
    fi
}

# ---- which tests, and the targets they need ----
# A test run by a build-machine program (sh, node) that is handed an aarch64 program to
# execute cannot run here: the kernel has no binfmt entry for aarch64, and meson wraps only
# the test's own command in qemu. Such tests are listed and left out, unless binfmt_misc
# has an enabled aarch64 entry (then the kernel runs them through qemu itself).
select_tests() {
    local binfmt=0
    [ "$(cat /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null | head -1)" = enabled ] && binfmt=1
    meson introspect "$BUILD" --tests --targets >"$BUILD/aarch64-introspect.json"
    local left=() l
    for l in "${LEFT_OUT[@]}"; do
        left+=("${l%%:*}")
        say "  test ${l//$'\n'/ }"
    done
    python3 - "$BUILD" "$binfmt" "${SUITES[*]}" "${EXTRA_TESTS[*]}" "${EXEC_TESTS[*]}" \
        "${left[*]}" <<'EOF'
import json, os, sys
build, binfmt, suites, extra = sys.argv[1], sys.argv[2] == '1', sys.argv[3].split(), sys.argv[4].split()
execs, left = sys.argv[5].split(), sys.argv[6].split()
info = json.load(open(os.path.join(build, 'aarch64-introspect.json')))
build = os.path.abspath(build)
files = {t['id']: t['filename'] for t in info['targets']}
exes = {f for t in info['targets'] if t['type'] == 'executable' for f in t['filename']}
names, targets, skipped = [], set(), []
for t in info['tests']:
    tsuites = {s.split(':')[-1] for s in t['suite']}
    if (not (tsuites & set(suites)) and t['name'] not in extra) or t['name'] in left:
        continue
    outs = [f for d in t['depends'] for f in files.get(d, [])]
    prog = t['cmd'][0]
    wrapped = prog.startswith(build + '/')
    # an aarch64 program handed over by path, absolute or relative to the build directory
    handed = [a for a in t['cmd'][1:] if a in exes or os.path.join(build, a) in exes]
    interp = os.path.basename(prog) in ('sh', 'bash') or os.path.basename(prog).startswith('python')
    if (interp or t['name'] in execs) and handed and not binfmt:
        skipped.append((t['name'], os.path.basename(prog), os.path.basename(handed[0])))
        continue
    names.append(t['name'])
    targets.update(os.path.relpath(f, build) for f in outs + ([prog] if wrapped else []))
with open(os.path.join(build, 'aarch64-tests.txt'), 'w') as f:
    f.write('\n'.join(names) + '\n')
with open(os.path.join(build, 'aarch64-targets.txt'), 'w') as f:
    f.write('\n'.join(sorted(targets)) + '\n')
for n, prog, arg in skipped:
    print(f'aarch64.sh:   test {n}: {prog} would exec the aarch64 {arg} (no binfmt entry)')
EOF
}

summarise() {
    local log=$BUILD/meson-logs/testlog.json pass=0 fail=0 skip=0
    if [ -f "$log" ]; then
        pass=$(grep -c '"result": "OK"' "$log" || true)
        fail=$(grep -cE '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)
        skip=$(grep -c '"result": "SKIP"' "$log" || true)
    else
        fail=1
    fi
    say "wall time $(($(date +%s) - t_start)) s (install, configure, build, tests)"
    echo "aarch64: $pass passed, $fail failed, $skip skipped"
}

install_missing
command -v qemu-aarch64 >/dev/null || { say "qemu-aarch64 not found (package qemu-user)" >&2; exit 1; }
configure
say "left out of the run:"
select_tests
mapfile -t tests <"$BUILD/aarch64-tests.txt"
mapfile -t targets <"$BUILD/aarch64-targets.txt"
say "building ${#targets[@]} targets for ${#tests[@]} tests"
t_build=$(date +%s)
run_shown ninja -C "$BUILD" "${targets[@]}"
say "built in $(($(date +%s) - t_build)) s; testing under $(qemu-aarch64 --version | head -1)"
rc=0
# qemu's emulation is several times slower than the hardware; the suites' timeouts were set
# for native runs.
# A fork of a threaded process is slow under qemu-user (5 s each): alloc_fork takes 4 forks,
# not 50, as under avx2_qemu.sh (the native suites run all 50; TCG on an x86 host does not
# reorder memory as an arm64 core does, so more forks here would find no more). Each FMA is
# a soft-float call under TCG: rnn_module's warm-up test trains 4 random batches of a
# smaller module, as under avx2_qemu.sh.
MT_TEST_FORKS=4 MT_TEST_BATCHES=4 meson test -C "$BUILD" --no-rebuild --print-errorlogs --num-processes 2 \
    --timeout-multiplier 4 "${tests[@]}" || rc=1
summarise
exit $rc
