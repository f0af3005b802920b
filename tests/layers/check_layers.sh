#!/bin/sh
# Layering, as the build enforces it (suite 'layers').
#   check_layers.sh SRCROOT BUILDROOT LIBMEMTRACE CC [LAYER:LOWER,LOWER ...]
# For every layer: each lower layer's header (and its own) is reachable through the
# layer's include folder, and every other layer's is not (an upward or sideways include
# fails to build). Reachability is what the preprocessor alone decides, so the probe runs
# `cc -E`: a tenth of a syntax check's time, and a header that is reachable but not
# self-contained is not mistaken for an unreachable one (the 'headers' suite checks that). Every quoted include in the layer's sources names a layer it may
# see. libmemtrace.so exports no symbol of the offline analysis.
set -u
src=$1 build=$2 lib=$3 cc=$4
shift 4
fail=0
layers=""
for spec in "$@"; do layers="$layers ${spec%%:*}"; done
for spec in "$@"; do
    name=${spec%%:*}
    below=$(echo "${spec#*:}" | tr ',' ' ')
    for other in $layers; do
        hdr=$(cd "$src/$other" && ls *.h 2>/dev/null | head -1)
        [ -n "$hdr" ] || continue
        allowed=no
        for b in $below $name; do [ "$b" = "$other" ] && allowed=yes; done
        if printf '#include "%s/%s"\n' "$other" "$hdr" |
            $cc -E -I"$src/include" -I"$build/layers/$name" -I"$build" \
                -x c - -o /dev/null 2>/dev/null; then
            got=yes
        else
            got=no
        fi
        if [ "$got" != "$allowed" ]; then
            echo "FAIL: $name/ including $other/$hdr: compiles=$got, allowed=$allowed"
            fail=1
        fi
    done
    # The sources themselves: "x/..." includes name only layers below (or the layer).
    for f in "$src/$name"/*.c "$src/$name"/*.h; do
        [ -f "$f" ] || continue
        for inc in $(sed -n 's/^#include "\([a-z_]*\)\/.*/\1/p' "$f" | sort -u); do
            ok=no
            for b in $below $name memtrace; do [ "$b" = "$inc" ] && ok=yes; done
            if [ $ok = no ]; then
                echo "FAIL: $f includes from $inc/, not below $name/"
                fail=1
            fi
        done
        if grep -n '#include "\.\./' "$f"; then
            echo "FAIL: $f reaches out of its folder with ../"
            fail=1
        fi
    done
done
bad=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -Ei 'report|plot|trace_csv|replay')
if [ -n "$bad" ]; then
    echo "FAIL: libmemtrace.so exports offline-analysis symbols:"
    echo "$bad"
    fail=1
fi
# It exports the public API and nothing else: every exported name is declared in
# include/memtrace/ (no internal mt_ name, no symbol of a library linked in statically).
declared="$build/layers-declared.txt"
cat "$src"/include/memtrace/*.h | tr -c 'A-Za-z0-9_' '\n' | grep '^mt_' | sort -u > "$declared"
extra=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort -u | comm -23 - "$declared")
if [ -n "$extra" ]; then
    echo "FAIL: libmemtrace.so exports names include/memtrace/ does not declare:"
    echo "$extra" | head -20
    fail=1
fi
# Inside, the same names: a layer's library defines an mt_ name only if include/memtrace/
# declares it; what files share is mt__, the rest static.
for a in "$build"/*/libmt_*.a "$build"/daemon/libmemtrace_daemon.a; do
    [ -f "$a" ] || continue
    own=$(nm -g --defined-only "$a" 2>/dev/null | awk 'NF == 3 && $2 ~ /^[TDBRVW]$/ {print $3}' |
          grep '^mt_[^_]' | sort -u | comm -23 - "$declared")
    if [ -n "$own" ]; then
        echo "FAIL: $(basename "$a") defines mt_ names include/memtrace/ does not declare (mt__ or static):"
        echo "$own" | head -20
        fail=1
    fi
done
[ $fail -eq 0 ] && echo "layers: every upward include fails, every downward one builds; libmemtrace.so exports no analysis symbol and only the public API"
exit $fail
