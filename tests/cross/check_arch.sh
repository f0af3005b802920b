#!/bin/sh
# The built objects are of the ISA meson was asked for (suite 'cross'): a cross build that
# silently fell back to the build machine's compiler would run its tests natively and prove
# nothing about the target.
#   check_arch.sh CPU_FAMILY FILE...
# Exit 0 when every FILE is an ELF object of CPU_FAMILY's machine, 77 (skipped) for a family
# this script does not know, 1 otherwise.
set -u
family=$1
shift
case $family in
aarch64) want='AArch64' ;;
x86_64) want='Advanced Micro Devices X86-64' ;;
*) echo "check_arch: no ELF machine name known for $family"; exit 77 ;;
esac
command -v readelf >/dev/null || { echo "check_arch: no readelf"; exit 77; }
rc=0
for f in "$@"; do
    got=$(readelf -h "$f" | sed -n 's/^ *Machine: *//p')
    if [ "$got" = "$want" ]; then
        echo "ok: $f: $got"
    else
        echo "FAIL: $f: machine '$got', want '$want' ($family)"
        rc=1
    fi
done
exit $rc
