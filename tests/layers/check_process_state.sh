#!/bin/sh
# The library leaves the process alone (suite 'layers'; docs/process-state.md).
#   check_process_state.sh BUILDROOT LIBMEMTRACE ALLOWLIST
# Every layer's archive is read with nm: an object that references a function changing the
# process's environment, signal dispositions or fork handlers, reading the environment, or
# starting a thread (its own, or one of libuv's process-wide pool, which nobody joins), must
# be named for that symbol in ALLOWLIST with a reason: for a thread, the object that owns
# it, where it is created and where joined. The shared library as linked (with its static
# third-party archives) may reference only symbols some allowed line names.
set -u
build=$1 lib=$2 allow=$3
syms='setenv|unsetenv|putenv|clearenv|signal|sigaction|pthread_atfork|__register_atfork|getenv|secure_getenv|pthread_create|uv_queue_work|uv_thread_create'
fail=0
for layer in util backend allocator host profiler rnn analysis daemon; do
    for a in "$build/$layer"/*.a; do
        [ -f "$a" ] || continue
        # "archive:archive.p/SOURCE.c.o:  U symbol"
        nm -A "$a" 2>/dev/null | awk -v re="^($syms)\$" '$(NF-1) == "U" && $NF ~ re {
                obj = $1; sub(/:$/, "", obj); n = split(obj, parts, "/"); obj = parts[n];
                sub(/\.o$/, "", obj); print obj, $NF }' | sort -u |
        while read -r src sym; do
            [ "$sym" = __register_atfork ] && sym=pthread_atfork
            if ! grep -q "^$layer/$src $sym " "$allow"; then
                echo "FAIL: $layer/$src references $sym: not in $(basename "$allow") (the library changes or reads process state only where a program asks; see docs/process-state.md)"
                echo x >> "$build/process_state.fail"
            fi
        done
    done
done
if [ -f "$build/process_state.fail" ]; then
    rm -f "$build/process_state.fail"
    fail=1
fi
for sym in $(nm -D --undefined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' |
             grep -E "^($syms)\$" | sort -u); do
    [ "$sym" = __register_atfork ] && sym=pthread_atfork
    if ! grep -Eq "^[^#][^ ]* $sym " "$allow"; then
        echo "FAIL: $(basename "$lib") references $sym, which no line of $(basename "$allow") allows"
        fail=1
    fi
done
# Every allowed line still names a reference (a stale line would hide a future one).
grep -v '^#' "$allow" | while read -r what sym _; do
    [ -n "$what" ] || continue
    if [ "$what" = libmemtrace.so ]; then
        nm -D --undefined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | grep -qx "$sym" && continue
    else
        layer=${what%%/*} src=${what#*/}
        nm -A "$build/$layer"/*.a 2>/dev/null | grep "/$src.o:" | awk '{print $NF}' |
            grep -Eqx "$sym|__register_atfork" && continue
    fi
    echo "FAIL: $(basename "$allow"): '$what $sym' no longer references it: remove the line"
    echo x >> "$build/process_state.stale"
done
if [ -f "$build/process_state.stale" ]; then
    rm -f "$build/process_state.stale"
    fail=1
fi
[ $fail -eq 0 ] && echo "process state: every reference is allowed, with its reason"
exit $fail
