#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A shimmed client that retries its connect until its server is up, started before that
# server, gets the fabric once the server listens: the server's port accepts only once its
# fabric side is ready (made after, libfabric's load took about 0.3 s, in which the client's
# fabric attempt was refused), and a refusal by both the fabric and kernel TCP (nothing
# listened at all) is not remembered by the negative cache (it kept the client on kernel TCP
# for RSTREAM_NEGATIVE_CACHE_MS). Blocking and nonblocking connects. A listen() that the kernel
# refuses leaves neither a fabric listener nor a beacon behind: a plain server that holds the
# port then gets its clients' bytes unaltered.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3

echo_server=$(dirname "$0")/echo_server.py

# retry.py PORT MODE: connects (MODE blocking or nonblocking) every 10 ms until the server
# answers (20 s at most), then echoes 16 KiB 50 times, 20 ms apart (a connection switches to
# the fabric once it has lasted 50 ms and its process has loaded libfabric).
cat >"$work/retry.py" <<'EOF'
import errno, os, select, socket, sys, time
port, mode = int(sys.argv[1]), sys.argv[2]
refused, end = 0, time.time() + 20
while True:
    s = socket.socket()
    if mode == "nonblocking":
        s.setblocking(False)
    err = s.connect_ex(("127.0.0.1", port))
    if err == errno.EINPROGRESS:
        select.select([], [s], [], 10)
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err == 0:
        break
    assert err == errno.ECONNREFUSED, "connect: " + os.strerror(err)
    s.close()
    refused += 1
    assert time.time() < end, "no server within 20 s"
    time.sleep(0.01)
s.setblocking(True)
s.settimeout(20)
for _ in range(50):
    time.sleep(0.02)
    out = os.urandom(16384)
    s.sendall(out)
    got = b""
    while len(got) < len(out):
        chunk = s.recv(len(out) - len(got))
        assert chunk, "EOF before the echo"
        got += chunk
    assert got == out, "the echo differs"
s.close()
print("connected after %d refusals, echoed 800 KiB" % refused)
EOF

for mode in blocking nonblocking; do
	port=$(pick_port "$E2E_OFFSET") || fail "no free port"
	start client-$mode shim client-$mode 40 python3 "$work/retry.py" "$port" "$mode"
	client_pid=$last_pid
	sleep 0.3
	start server-$mode shim server-$mode 60 python3 "$echo_server" 127.0.0.1 "$port"
	server_pid=$last_pid
	finish "$client_pid" || fail "$mode client: $(tail -n 3 "$work/client-$mode.log")"
	stop_pid "$server_pid" || true
	log "$mode client: $(cat "$work/client-$mode.log")"
	grep -q "after [1-9][0-9]* refusals" "$work/client-$mode.log" ||
		fail "$mode client: its server was up before it connected"
	expect_fabric client-$mode 1
done

# ---- a listen() the kernel refuses leaves nothing behind ---------------------------------------
# A shimmed socket and a plain process's socket bind one port (SO_REUSEADDR); the plain one
# listens first, so the shimmed one's listen() fails with EADDRINUSE after its fabric side was
# made. A shimmed client of the port must then find no beacon: its bytes reach the plain server
# as it sent them, with no upgrade offer ahead of them.
cat >"$work/loser.py" <<'EOF'
import errno, os, socket, sys, time
port, d = int(sys.argv[1]), sys.argv[2]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
open(d + "/bound", "w").close()
while not os.path.exists(d + "/plain-listens"):
    time.sleep(0.01)
try:
    s.listen()
    print("listen: ok")
except OSError as e:
    print("listen: " + errno.errorcode[e.errno])
sys.stdout.flush()
open(d + "/listened", "w").close()
while not os.path.exists(d + "/done"):
    time.sleep(0.01)
EOF
cat >"$work/holder.py" <<'EOF'
import os, socket, sys, time
port, d = int(sys.argv[1]), sys.argv[2]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
while not os.path.exists(d + "/bound"):
    time.sleep(0.01)
s.bind(("127.0.0.1", port))
s.listen()
open(d + "/plain-listens", "w").close()
c, _ = s.accept()
c.settimeout(10)
got = b""
while True:
    chunk = c.recv(4096)
    if not chunk:
        break
    got += chunk
print("received %r" % got)
EOF
cat >"$work/hello.py" <<'EOF'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"hello, plain server")
s.shutdown(socket.SHUT_WR)
s.settimeout(10)
assert s.recv(1) == b"", "the plain server answered"
s.close()
EOF
d="$work/refused-listen"
mkdir -p "$d"
port=$(pick_port "$E2E_OFFSET") || fail "no free port"
start loser shim loser 30 python3 "$work/loser.py" "$port" "$d"
loser_pid=$last_pid
start holder plain 30 python3 "$work/holder.py" "$port" "$d"
holder_pid=$last_pid
for _ in $(seq 300); do
	[ -e "$d/listened" ] && break
	sleep 0.05
done
grep -qx "listen: EADDRINUSE" "$work/loser.log" ||
	fail "the shimmed listen(): $(cat "$work/loser.log") (EADDRINUSE expected)"
port_listening $((port + E2E_OFFSET)) && fail "a fabric listener stayed after the failed listen()"
shim hello 20 python3 "$work/hello.py" "$port" || fail "the client of the plain server failed"
finish "$holder_pid" || fail "the plain server failed: $(cat "$work/holder.log")"
grep -qx "received b'hello, plain server'" "$work/holder.log" ||
	fail "the plain server got $(cat "$work/holder.log")"
touch "$d/done"
finish "$loser_pid" || fail "the shimmed process failed: $(cat "$work/loser.log")"
log "a refused listen(): no fabric listener left, the plain server got the bytes as sent"
echo PASS
