#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Short connections between two shimmed processes cost no segment more than kernel TCP: the
# client's HELLO goes in one segment with its first write (a nonblocking connect, as ab and wrk
# make), and the server's ACCEPT in one with its first reply. The kernel's own count of data
# segments (TCP_INFO) on the client's socket says so; the bytes arrive intact. A plain client whose
# first bytes look like the head of an upgrade message has them echoed intact.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3

echo_server=$(dirname "$0")/echo_server.py

# client.py PORT N: N connections that connect without blocking, wait for POLLOUT, send a
# request and read its echo; prints per connection the data segments out and in.
cat >"$work/client.py" <<'EOF'
import os, select, socket, struct, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    s = socket.socket()
    s.setblocking(False)
    if s.connect_ex(("127.0.0.1", port)) != 0:
        _, w, _ = select.select([], [s], [], 10)
        assert w, "connect: no POLLOUT within 10 s"
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    s.setblocking(True)
    req = os.urandom(100)
    s.sendall(req)
    got = b""
    while len(got) < len(req):
        chunk = s.recv(len(req) - len(got))
        assert chunk, "EOF before the echo"
        got += chunk
    assert got == req, "the echo differs"
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    segs_in, segs_out = struct.unpack_from("II", info, 152)  # tcpi_data_segs_in, _out
    print("segments out %d in %d" % (segs_out, segs_in))
    s.close()
EOF

# Without the shim: what the kernel counts for one request and its answer.
start_server plain 0 plain 60 python3 "$echo_server" 127.0.0.1 @PORT@
out=$(plain 30 python3 "$work/client.py" "$port" 5) || fail "the plain client failed: $out"
kernel=$(sort -u <<<"$out")
[ "$kernel" = "segments out 1 in 1" ] || fail "kernel TCP counted: $kernel"
stop_pid "$server_pid" || true

start_server server 1 shim server 60 python3 "$echo_server" 127.0.0.1 @PORT@
out=$(shim client 30 python3 "$work/client.py" "$port" 20) || fail "the client failed: $out"
counts=$(sort <<<"$out" | uniq -c | sed 's/^ *//')
log "under the shim, per connection: ${counts//$'\n'/, }"
[ "$(sort -u <<<"$out")" = "segments out 1 in 1" ] ||
	fail "an upgrade message went in a segment of its own: $counts"
# They offered the upgrade (the server answered) and ended before their switch.
[ "$(stat_sum client before_switch)" -eq 20 ] || {
	show_stats client
	fail "client: not 20 connections offered and ended before their switch"
}

# A plain client whose first bytes begin like an upgrade message other than a HELLO (here the
# head of an ACCEPT, then its own data): its bytes come back intact, at once. (The server
# peeked 16 bytes, too few to tell, and waited for the rest of that message for good.)
cat >"$work/lookalike.py" <<'EOF'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.settimeout(5)
msg = b"\xffRSTUPG\x01\x02" + bytes(7) + b"hello, plain"
s.sendall(msg)
got = b""
while len(got) < len(msg):
    chunk = s.recv(len(msg) - len(got))
    assert chunk, "EOF before the echo"
    got += chunk
assert got == msg, got
print("echoed intact")
EOF
out=$(plain 30 python3 "$work/lookalike.py" "$port") || fail "a look-alike first message: $out"
log "a plain client's look-alike first bytes: $out"
stop_pid "$server_pid" || true
echo PASS
