#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rstream-stat on a running iperf3 under the shim (both ends): it lists the client's and the
# server's fabric connections, established, with their queues and credits, and the bytes of the
# data connection grow between two samples; the exports go when the processes exit, and stale
# ones of dead processes are removed.
# Usage: stat.sh LIBRSTREAM_PRELOAD_SO RSTREAM_RUN RSTREAM_STAT
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need iperf3 pgrep
rstat=$(realpath "${3:?usage: $0 LIB RUN RSTREAM_STAT}")
secs=6

# The program's pid under its timeout (rstream-run execs it).
child_of() {
	local c
	for _ in $(seq 100); do
		c=$(pgrep -P "$1" | head -n 1)
		[ -n "$c" ] && { echo "$c"; return 0; }
		sleep 0.05
	done
	return 1
}

# biggest FILE FIELD: the largest value of FIELD among the connections in FILE.
biggest() {
	grep -o "\"$2\": [0-9]*" "$1" | awk '{ print $2 }' | sort -n | tail -1
}

# A stale export of a process that is gone: removed by the first look.
sleep 0.1 &
dead=$!
wait "$dead"
echo stale >"/dev/shm/rstream-$dead"

start_server server 1 shim server 30 iperf3 -s -1 -p @PORT@
spid=$(child_of "$server_pid") || fail "no iperf3 server process"
start client shim client 30 iperf3 -c 127.0.0.1 -p "$port" -t "$secs" -f m
client_pid=$last_pid
cpid=$(child_of "$client_pid") || fail "no iperf3 client process"

# Both have exported their connections once the test runs.
for _ in $(seq 100); do
	"$rstat" -j "$cpid" >"$work/s1.json" 2>/dev/null && [ "$(grep -o '"path": "fabric"' "$work/s1.json" | wc -l)" -ge 2 ] && break
	sleep 0.1
done
sleep 1
"$rstat" -j "$cpid" >"$work/s1.json" || fail "rstream-stat $cpid failed"
"$rstat" -j "$spid" >"$work/v1.json" || fail "rstream-stat $spid failed"
# The second sample once the bulk connection's rings have grown (they grow with the traffic
# after its switch to the fabric), 3 s at most.
for _ in $(seq 30); do
	sleep 0.1
	"$rstat" -j "$cpid" >"$work/s2.json" || fail "rstream-stat $cpid failed (second sample)"
	"$rstat" -j "$spid" >"$work/v2.json" || fail "rstream-stat $spid failed (second sample)"
	[ "$(biggest "$work/s2.json" send_ring)" -gt 32768 ] &&
		[ "$(biggest "$work/v2.json" recv_ring)" -gt 32768 ] && break
done
"$rstat" >"$work/all.txt" || fail "rstream-stat failed"
cat "$work/s1.json" "$work/v2.json" "$work/all.txt"

# Client: the control and the data connection, connected over the fabric to the server's port.
n=$(grep -Eo "\"path\": \"fabric\", \"direction\": \"connected\", \"state\": \"established\", \"local\": \"127.0.0.1:[0-9]+\", \"peer\": \"127.0.0.1:$port\"" "$work/s2.json" | wc -l)
[ "$n" -eq 2 ] || fail "client: $n established fabric connections to port $port, expected 2"
grep -q "\"pid\": $cpid, \"program\": \"iperf3\", \"provider\": \"tcp\", \"fabric_connections\": 2, \"fallback_connections\": 0" \
	"$work/s2.json" || fail "client: wrong totals"
grep -q '"refreshed": true' "$work/s2.json" || fail "client: queues and credits were not refreshed"
grep -Eq '"send_queued": [0-9]+, "recv_queued": [0-9]+, "peer_credit_bytes": [0-9]+, "peer_credit_slots": [1-9][0-9]*' \
	"$work/s2.json" || fail "client: no queues or credits"
# The bulk connection's rings grew past their initial 32 KiB (as socket buffers autotune).
ring=$(biggest "$work/s2.json" send_ring)
[ -n "$ring" ] && [ "$ring" -gt 32768 ] || fail "client: the data connection's send ring did not grow ($ring)"
ring=$(biggest "$work/v2.json" recv_ring)
[ -n "$ring" ] && [ "$ring" -gt 32768 ] || fail "server: the data connection's receive ring did not grow ($ring)"
# The rings' resident memory: the busy receive ring is backed (the bytes pass through it).
res=$(biggest "$work/v2.json" ring_resident)
[ -n "$res" ] && [ "$res" -gt 0 ] || fail "server: no resident ring memory reported ($res)"
# Server: the same two, accepted on its port.
n=$(grep -Eo "\"path\": \"fabric\", \"direction\": \"accepted\", \"state\": \"established\", \"local\": \"(127.0.0.1|\[::ffff:127.0.0.1\]):$port\"" "$work/v2.json" | wc -l)
[ "$n" -eq 2 ] || fail "server: $n established fabric connections on port $port, expected 2"

# The bytes grow while the test runs.
s1=$(biggest "$work/s1.json" sent)
s2=$(biggest "$work/s2.json" sent)
r1=$(biggest "$work/v1.json" received)
r2=$(biggest "$work/v2.json" received)
log "client sent $s1 then $s2 bytes; server received $r1 then $r2"
{ [ "$s1" -gt 0 ] && [ "$s2" -gt "$s1" ]; } || fail "the client's bytes sent did not grow"
{ [ "$r1" -gt 0 ] && [ "$r2" -gt "$r1" ]; } || fail "the server's bytes received did not grow"

# Without a pid: both, in the table.
grep -q "^pid $cpid (iperf3), provider tcp: 2 open connections (2 fabric, 0 kernel)" "$work/all.txt" ||
	fail "rstream-stat does not list the client"
grep -q "^pid $spid (iperf3)" "$work/all.txt" || fail "rstream-stat does not list the server"
grep -Eq "^[0-9]+ +fabric +established +127.0.0.1:[0-9]+ +127.0.0.1:$port " "$work/all.txt" ||
	fail "rstream-stat shows no connection row"
[ -e "/dev/shm/rstream-$dead" ] && fail "the stale export of pid $dead is still there"

finish "$client_pid" || fail "the iperf3 client failed"
finish "$server_pid" || fail "the iperf3 server failed"
expect_fabric client 2
expect_fabric server 2
[ -e "/dev/shm/rstream-$cpid" ] && fail "the client's export outlived it"
[ -e "/dev/shm/rstream-$spid" ] && fail "the server's export outlived it"
if "$rstat" "$cpid" 2>"$work/gone.txt"; then
	fail "rstream-stat succeeded for a process that is gone"
fi
grep -q "pid $cpid has no rstream connections" "$work/gone.txt" || fail "no message for a gone pid"
echo PASS
