#!/usr/bin/env bash
# The suites whose results can depend on the CPU, run on an emulated AVX2-only CPU
# (qemu-user with -cpu Haswell-v4: AVX2 and FMA, no AVX-512) when this host has AVX-512.
# Every choice made from CPUID then takes its AVX2 branch: libxsmm's JIT (hsw), oneDNN's
# (avx2), OpenBLAS's kernel, and the engine's own function clones. This is the whole
# process seeing an AVX2 CPU, where tests/rnn/isa_matrix.sh lowers each library by its
# own switch.
#
#   tests/cross/avx2_qemu.sh [BUILD]      default build-test, already built
#
# Run: the tests of the suites named below whose command is a program of the build (a script
# run by sh or python would itself run under the emulator and is left out; the native run
# covers it). The RNN suites must report AVX2 kernels, or the run fails: an emulator that
# passed AVX-512 through would otherwise prove nothing.
# The last line is CI's plain summary: "avx2-qemu: N passed, N failed, N skipped".
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${1:-build-test}
CPU_MODEL=Haswell-v4
# The suites whose code takes a CPUID branch: the RNN engine on its CPU path (its own
# function clones, libxsmm, oneDNN, OpenBLAS, BLIS), the cuDNN path's CPU reference, the
# cuda backend's host side, and the cross checks of the thread caches' and the ring's
# ordering. The other layers have no branch on the CPU and run natively in every build.
SUITES=(rnn cudnn cuda cross)
# Left out, with why: what they test does not depend on the CPU, and the emulator cannot
# run it. rnn_process forks a process whose GEMM worker threads run, and qemu-user 7.2
# then fails its own RCU assertion in the child.
LEFT_OUT=(rnn_process)
say() { printf 'avx2_qemu.sh: %s\n' "$*"; }

if [ "$(uname -m)" != x86_64 ]; then
    say "not an x86-64 host: nothing to emulate"
    echo "avx2-qemu: 0 passed, 0 failed, 0 skipped"
    exit 0
fi
if ! grep -qw avx512f /proc/cpuinfo; then
    say "this host has no AVX-512: the native suites already ran on an AVX2 (or lower) CPU"
    echo "avx2-qemu: 0 passed, 0 failed, 0 skipped"
    exit 0
fi
command -v qemu-x86_64 >/dev/null || { say "qemu-x86_64 not found (package qemu-user)" >&2; exit 1; }
[ -f "$BUILD/build.ninja" ] || { say "no build in $BUILD" >&2; exit 1; }

wrap="qemu-x86_64 -cpu $CPU_MODEL"
# What the emulated CPU reports, checked by a program compiled here.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
cat >"$probe/cpu.c" <<'EOF'
#include <stdio.h>
int main(void)
{
    __builtin_cpu_init();
    printf("avx2=%d fma=%d avx512f=%d\n", !!__builtin_cpu_supports("avx2"),
           !!__builtin_cpu_supports("fma"), !!__builtin_cpu_supports("avx512f"));
    return 0;
}
EOF
cc -O2 "$probe/cpu.c" -o "$probe/cpu"
flags=$($wrap "$probe/cpu" 2>/dev/null)
say "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), avx512f present"
say "emulated: $(qemu-x86_64 --version | head -1), -cpu $CPU_MODEL: $flags"
[ "$flags" = "avx2=1 fma=1 avx512f=0" ] || { say "the emulated CPU is not AVX2-only" >&2; exit 1; }

meson introspect "$BUILD" --tests >"$BUILD/avx2-introspect.json"
mapfile -t tests < <(python3 - "$BUILD" "${SUITES[*]}" "${LEFT_OUT[*]}" <<'EOF'
import json, os, sys
build, suites, left = os.path.abspath(sys.argv[1]), set(sys.argv[2].split()), set(sys.argv[3].split())
for t in json.load(open(os.path.join(build, 'avx2-introspect.json'))):
    suite = {s.split(':')[-1] for p in t['suite'] for s in p.split('+')}
    if suite & suites and t['cmd'][0].startswith(build + '/') and t['name'] not in left:
        print(t['name'])
EOF
)
say "left out: ${LEFT_OUT[*]} (forks under the emulator; nothing CPU-dependent in it)"
say "running ${#tests[@]} tests of the suites: ${SUITES[*]}"
# meson names the log of a wrapped run after the wrapper's program.
log=$BUILD/meson-logs/testlog-qemu-x86_64.json
rm -f "$log"
rc=0
# The emulator is several times slower than the CPU; a fork of a threaded process more so,
# so alloc_fork takes 4 forks (the native suites run 50; its logic has no CPU-dependent branch),
# and rnn_module's warm-up test trains 4 random batches of a smaller module instead of 50
# (the native runs keep 50): each FMA is a soft-float call here, and on a Sapphire Rapids
# host 10 batches at the native size did not finish in the 480 s timeout (10 of the smaller
# module: 303 s). Timeouts from the native runs.
MT_TEST_FORKS=4 MT_TEST_BATCHES=4 LIBXSMM_VERBOSE=1 meson test -C "$BUILD" --no-rebuild --print-errorlogs \
    --num-processes 2 --timeout-multiplier 4 --wrapper "$wrap" "${tests[@]}" || rc=1
# The RNN suites name the kernels they ran; on this CPU they must be the AVX2 ones.
if ! grep -q 'JIT for hsw' "$log" || grep -qE 'JIT for (skx|clx|cpx|spr)' "$log"; then
    say "the RNN tests did not report AVX2 kernels (libxsmm 'JIT for hsw'): see $log" >&2
    rc=1
fi
pass=$(grep -c '"result": "OK"' "$log" || true)
fail=$(grep -cE '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)
skip=$(grep -c '"result": "SKIP"' "$log" || true)
[ "$fail" -eq 0 ] || rc=1
echo "avx2-qemu: $pass passed, $fail failed, $skip skipped"
exit $rc
