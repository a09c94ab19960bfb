#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A writer that waits in select for room to write, on a connection whose reader is slow, sleeps
# rather than spins, through the shim on the fabric and on the same-host transport: its wait
# for room spins only when the peer reads what is queued within a wake-up's time (RoomRate,
# which the shim's socket asks of its fabric or same-host socket). With a 1 s spin allowed
# (RSTREAM_POLL_US), a writer that spun would use most of a CPU; iperf3 -l 64 did (88 %).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3

cat >"$work/reader.py" <<'EOF'
import socket, sys, time
srv = socket.create_server(("127.0.0.1", int(sys.argv[1])))
c, _ = srv.accept()
# A few exchanges first: the connection switches during the calls of both ends.
for _ in range(20):
    c.sendall(c.recv(16))
# Then slowly: 16 KiB every 20 ms (800 KB/s), to the end.
total = 0
while True:
    d = c.recv(16384)
    if not d:
        break
    if d.strip(b"x"):
        print("reader: unexpected bytes")
    total += len(d)
    time.sleep(0.02)
print("received %d" % total, flush=True)
EOF

cat >"$work/writer.py" <<'EOF'
import select, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
for _ in range(20):
    s.sendall(b"p" * 16)
    got = b""
    while len(got) < 16:
        got += s.recv(16 - len(got))
    time.sleep(0.05)
s.setblocking(False)
chunk, sent, waits = b"x" * 65536, 0, 0
c0, t0 = time.process_time(), time.monotonic()
while time.monotonic() - t0 < 2.0:
    try:
        sent += s.send(chunk)
    except BlockingIOError:
        waits += 1
        select.select([], [s], [], 5)
cpu = (time.process_time() - c0) / (time.monotonic() - t0)
s.setblocking(True)
s.shutdown(socket.SHUT_WR)
s.recv(1)
print("sent %d waits %d cpu_percent %d" % (sent, waits, cpu * 100), flush=True)
EOF

for same in 0 1; do
	start_server "reader-$same" 1 shim "reader-$same" 60 env RSTREAM_SAME_HOST=$same python3 \
		"$work/reader.py" @PORT@
	out=$(shim "writer-$same" 60 env RSTREAM_SAME_HOST=$same RSTREAM_POLL_US=1000000 python3 \
		"$work/writer.py" "$port") || fail "the writer failed: $out"
	finish "$server_pid" || fail "the reader failed: $(tail -n 3 "$work/reader-$same.log")"
	sent=$(sed -n 's/^sent \([0-9]*\).*/\1/p' <<<"$out")
	cpu=$(sed -n 's/.*cpu_percent \([0-9]*\).*/\1/p' <<<"$out")
	received=$(sed -n 's/^received \([0-9]*\)/\1/p' "$work/reader-$same.log")
	log "same-host $same: $out; $(grep received "$work/reader-$same.log")"
	[ -n "$sent" ] && [ "$sent" = "$received" ] || fail "sent $sent bytes, the reader got $received"
	! grep -q "unexpected" "$work/reader-$same.log" || fail "the reader got other bytes"
	have_stats "writer-$same"
	[ "$(stat_sum "writer-$same" fabric_connections)" -eq 1 ] ||
		fail "the writer's connection did not switch"
	[ "$same" = 0 ] || [ "$(stat_sum "writer-$same" same_host_connections)" -eq 1 ] ||
		fail "the writer's connection is not on the same-host transport"
	[ "${cpu:-100}" -lt 30 ] || fail "the writer used $cpu % of a CPU waiting for room"
done
echo PASS
