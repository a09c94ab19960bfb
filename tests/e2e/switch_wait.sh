#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A server's socket waits for its client's switch a bounded time (RSTREAM_SWITCH_WAIT_MS, here
# 0.3 s beyond a 0.2 s connect timeout), then stays on kernel TCP: it used to wait forever, and
# every poll of a server with many clients that never switched looked at each of them. The
# client here makes one exchange, then no call for 2.5 s (its switch moves on only during its
# calls), then exchanges again: its late token finds nobody waiting, and both ends carry on
# over kernel TCP with every byte intact.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3

cat >"$work/client.py" <<'EOF'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
def echo(i):
    m = b"m%04d" % i
    s.sendall(m)
    got = b""
    while len(got) < len(m):
        d = s.recv(len(m) - len(got))
        if not d:
            raise RuntimeError("the server closed the connection")
        got += d
    if got != m:
        raise RuntimeError("sent %r, got %r" % (m, got))
echo(0)
time.sleep(2.5)
for i in range(1, 31):
    echo(i)
    time.sleep(0.05)
s.close()
print("31 echoes")
EOF

start_server server 1 shim server 60 env RSTREAM_SWITCH_WAIT_MS=300 \
	RSTREAM_CONNECT_TIMEOUT_MS=200 RSTREAM_LOG=info python3 "$(dirname "$0")/echo_server.py" \
	127.0.0.1 @PORT@
out=$(shim client 60 env RSTREAM_LOG=info python3 "$work/client.py" "$port" 2>&1) ||
	fail "the client failed: $(tail -n 5 <<<"$out")"
log "$(grep -v '^rstream' <<<"$out")"
stop_pid "$server_pid" || true
have_stats server
have_stats client
grep -q "the client's fabric connection did not come in time" "$work/server.log" ||
	fail "the server did not give up waiting: $(grep -m3 rstream "$work/server.log" || true)"
[ "$(stat_sum server fabric_connections)" -eq 0 ] || fail "server: the connection switched"
[ "$(stat_sum server not_upgraded)" -eq 1 ] || fail "server: not counted as not upgraded"
[ "$(stat_sum client fabric_connections)" -eq 0 ] || fail "client: the connection switched"
# The client's token went to a server that no longer waits for it: the client stays in its
# switch, on kernel TCP, to the end (it cannot tell a slow server from one that gave up).
[ "$(stat_sum client before_switch)" -eq 1 ] || fail "client: not one connection before its switch"
log "server: $(grep -m1 'did not come in time' "$work/server.log" | sed 's/.*info: //')"
echo PASS
