#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A shimmed server polls an accepted connection (the look leaves the client's HELLO, with the
# request after it, at the head of the kernel stream for the read), then forks: the child serves
# the first request, and the parent, which had not read, then reads the client's next bytes.
# What the parent's look learnt is not known after the fork (the child read the stream): the
# parent must get the client's bytes whole, not lose 16 of them to a HELLO that is gone.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3

cat >"$work/server.py" <<'EOF'
import os, select, socket, sys
srv = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("listening", flush=True)
conn, _ = srv.accept()
conn.setblocking(False)
p = select.poll()
p.register(conn.fileno(), select.POLLIN)
assert p.poll(10000), "the request never came"
pid = os.fork()
if pid == 0:
    conn.setblocking(True)
    req = conn.recv(100)
    conn.sendall(b"child:" + req)
    os._exit(0)
os.waitpid(pid, 0)
assert p.poll(10000), "the next bytes never came"
got = b""
while len(got) < 32:
    try:
        chunk = conn.recv(100)
    except BlockingIOError:
        p.poll(10000)
        continue
    if not chunk:
        break
    got += chunk
conn.setblocking(True)
conn.sendall(b"parent:" + got)
conn.close()
EOF
cat >"$work/client.py" <<'EOF'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"one")
assert s.recv(100) == b"child:one"
msg = b"two-" + b"x" * 28
s.sendall(msg)
got = b""
while True:
    chunk = s.recv(100)
    if not chunk:
        break
    got += chunk
print(got.decode(), flush=True)
assert got == b"parent:" + msg, got
EOF

start_server server 0 shim server 60 python3 "$work/server.py" @PORT@
out=$(shim client 30 python3 "$work/client.py" "$port" 2>&1) || fail "the client failed: $out"
log "client: $out"
wait "$server_pid" || fail "the server failed: $(tail -n 5 "$work/server.log")"
echo PASS
