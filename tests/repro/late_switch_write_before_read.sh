#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Reproduction (not in the meson test list: it fails): a shimmed client that writes 256 KiB to
# a shimmed echo server in paced pieces, and reads the echo only afterwards, hangs for good
# once its connection switches to the fabric mid-stream; over kernel TCP (no shim) the same
# client finishes in about a second, the echo fitting in the kernel's buffers.
# Usage: tests/repro/late_switch_write_before_read.sh build/preload/librstream_preload.so scripts/rstream-run
# Exit 0: no hang (fixed); 1: the shimmed client hung (killed after 20 s).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../e2e/lib.sh
. "$(dirname "$0")/../e2e/lib.sh"
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
start_server server 1 shim server 60 python3 "$(dirname "$0")/../e2e/echo_server.py" 127.0.0.1 @PORT@
log "kernel TCP (client without the shim):"
plain 20 python3 "$work/client.py" "$port" | tail -n 1
log "both ends under the shim:"
rc=0
shim client 20 python3 "$work/client.py" "$port" >"$work/client.log" 2>&1 || rc=$?
tail -n 2 "$work/client.log"
if [ "$rc" -eq 124 ]; then
	echo "HANG: the shimmed client was killed after 20 s ($(grep -c '^sent' "$work/client.log") of 32 pieces sent)"
	exit 1
fi
[ "$rc" -eq 0 ] || { echo "the shimmed client failed: exit $rc"; exit 1; }
echo "no hang"
