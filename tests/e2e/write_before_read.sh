#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A client that writes 256 KiB to an echo server in paced pieces and reads the echo only
# afterwards, both ends under the shim: the connection switches to the fabric mid-stream and must
# buffer what kernel TCP would. It hung for good (each end had read a few bytes too few to owe
# credit back, so neither ring counted as full and none grew); without the shim it takes 1 s.
# Usage: write_before_read.sh LIBRSTREAM_PRELOAD RSTREAM_RUN
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../e2e/lib.sh
. "$(dirname "$0")/lib.sh"
need python3
cat >"$work/client.py" <<'PY'
import os, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
t0 = time.monotonic()
sent = 0
for i in range(32):  # 8 KiB every 31 ms: the connection switches to the fabric meanwhile
    s.sendall(os.urandom(8192))
    sent += 8192
    print("sent %d" % sent, flush=True)
    time.sleep(1 / 32)
got = 0
while got < sent:
    b = s.recv(65536)
    if not b:
        break
    got += len(b)
print("echo %d of %d bytes in %.2f s" % (got, sent, time.monotonic() - t0), flush=True)
sys.exit(0 if got == sent else 1)
PY
start_server server 1 shim server 60 python3 "$(dirname "$0")/echo_server.py" 127.0.0.1 @PORT@
log "kernel TCP (client without the shim):"
plain 20 python3 "$work/client.py" "$port" | tail -n 1
log "both ends under the shim:"
rc=0
shim client 20 python3 "$work/client.py" "$port" >"$work/client.log" 2>&1 || rc=$?
tail -n 2 "$work/client.log"
if [ "$rc" -eq 124 ]; then
	fail "HANG: the shimmed client was killed after 20 s ($(grep -c '^sent' "$work/client.log") of 32 pieces sent)"
fi
[ "$rc" -eq 0 ] || fail "the shimmed client failed: exit $rc"
# The bytes after the switch crossed the fabric, both ways (the client's statistics: the server
# writes its own only when it exits).
expect_fabric client 1
