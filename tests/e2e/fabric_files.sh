#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Loading libfabric under the shim skips its verbs provider's two reads of /proc/kallsyms (70-90
# ms of CPU for features the engine never uses, fiload.cpp), while the program's own fopen() of
# that file, before and after the load, opens it as ever, and the fabric listener is made.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3 strace

cat >"$work/files.py" <<'EOF'
import ctypes, socket, sys
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fclose.argtypes = [ctypes.c_void_p]
libc.fgetc.argtypes = [ctypes.c_void_p]

def own_look(when):
    f = libc.fopen(b"/proc/kallsyms", b"r")
    ok = bool(f) and libc.fgetc(f) >= 0
    if f:
        libc.fclose(f)
    print("own fopen %s: %s" % (when, "read" if ok else "failed"))

own_look("before")
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()  # the shim's listener: libfabric loads, and its fabric listener is made
own_look("after")
s.close()
EOF

# A free port whose fabric port is free too (an ephemeral port's fabric port may be a port that
# a test running beside this one uses); another when a process took it meanwhile. The shim logs
# why a listener got no fabric side (info level).
for attempt in 1 2 3; do
	rm -f "$work"/stats/files.*.json "$work"/files.*.log
	port=$(pick_port "$E2E_OFFSET") || fail "no free port"
	out=$(RSTREAM_LOG=info RSTREAM_LOG_FILE="$work/files.%p.log" \
		shim files 60 strace -f -qq -e trace=openat -o "$work/files.strace" \
		python3 "$work/files.py" "$port") || fail "the program failed: $out"
	why=$(cat "$work"/files.*.log 2>/dev/null | grep 'kernel TCP only' || true)
	grep -q 'Address already in use' <<<"$why" || break
	log "port $port or its fabric port was taken meanwhile (attempt $attempt)"
done
printf "    %s\n" "${out//$'\n'/$'\n    '}"
grep -qx "own fopen before: read" <<<"$out" || fail "the program's fopen before the load failed"
grep -qx "own fopen after: read" <<<"$out" || fail "the program's fopen after the load failed"
[ "$(stat_sum files fabric_listeners)" -eq 1 ] || fail "no fabric listener: ${why:-no reason logged}"
grep -q 'libfabric\.so' "$work/files.strace" || fail "libfabric was not loaded"
opens=$(grep -c 'openat(AT_FDCWD, "/proc/kallsyms"' "$work/files.strace" || true)
log "/proc/kallsyms opened $opens times (the program's own 2; libfabric's would be 2 more)"
[ "$opens" -eq 2 ] || fail "/proc/kallsyms opened $opens times, not the program's 2"
echo PASS
