#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rdmacm-utils' rstream (linked against librdmacm's rsocket functions) over librstream.so through
# LD_PRELOAD on 127.0.0.1: server and client must both succeed, with their rsocket calls bound
# to librstream.so. Usage: rstream_e2e.sh /usr/bin/rstream path/to/librstream.so
set -euo pipefail

prog=${1:?usage: $0 RSTREAM_PROGRAM LIBRSTREAM_SO}
lib=$(realpath "${2:?usage: $0 RSTREAM_PROGRAM LIBRSTREAM_SO}")
size=65536
count=1000

work=$(mktemp -d)
server_pid=
cleanup() {
	if [ -n "$server_pid" ]; then
		kill "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source-path=SCRIPTDIR source=../lib/fail.sh
. "$(dirname "$0")/../lib/fail.sh"

# port_listening and pick_port.
# shellcheck source-path=SCRIPTDIR source=../lib/ports.sh
. "$(dirname "$0")/../lib/ports.sh"

# Without the preload the program uses librdmacm, which needs an RDMA device; this machine has
# none, so it must fail. That is what proves the successful runs below went through rstream.
if [ -z "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
	port=$(pick_port 0 12000 100)
	rc=0
	timeout 10 "$prog" -b 127.0.0.1 -f ip -p "$port" -S "$size" -C 1 >"$work/plain.log" 2>&1 || rc=$?
	[ "$rc" -ne 0 ] || fail "rstream without the preload succeeded although there is no RDMA device"
	grep -q "No RDMA devices were detected" "$work/plain.log" ||
		fail "rstream without the preload failed for another reason (rc $rc)"
	echo "without the preload: fails as expected (rc $rc, no RDMA devices)"
else
	echo "RDMA devices present: skipping the check that the program fails without the preload"
fi

# One run of server and client with extra rstream options "$@".
run_pair() {
	local name=$1
	shift
	local attempt rc
	for attempt in 1 2 3 4 5; do
		port=$(pick_port 0 12000 100) || fail "no free port"
		rm -f "$work"/ld.*
		LD_PRELOAD="$lib" timeout 60 "$prog" -b 127.0.0.1 -f ip -p "$port" -S "$size" \
			-C "$count" "$@" >"$work/$name-server.log" 2>&1 &
		server_pid=$!
		for _ in $(seq 200); do
			port_listening "$port" && break
			kill -0 "$server_pid" 2>/dev/null || break
			sleep 0.05
		done
		if port_listening "$port"; then
			break
		fi
		kill "$server_pid" 2>/dev/null || true
		rc=0
		wait "$server_pid" || rc=$?
		server_pid=
		grep -q "Address already in use" "$work/$name-server.log" ||
			fail "$name: the server did not listen on port $port (rc $rc)"
	done
	[ -n "$server_pid" ] || fail "$name: no port could be bound"

	rc=0
	LD_DEBUG=bindings LD_DEBUG_OUTPUT="$work/ld" LD_PRELOAD="$lib" timeout 60 "$prog" \
		-s 127.0.0.1 -f ip -p "$port" -S "$size" -C "$count" "$@" \
		>"$work/$name-client.log" 2>&1 || rc=$?
	[ "$rc" -eq 0 ] || fail "$name: client exited with $rc"
	rc=0
	wait "$server_pid" || rc=$?
	server_pid=
	[ "$rc" -eq 0 ] || fail "$name: server exited with $rc"

	# The result line: name, transfer size, count, iterations, total bytes, time, Gb/s, us/xfer.
	grep -qE '^custom +64k +1k +1 +125m ' "$work/$name-client.log" ||
		fail "$name: no result line in the client output"
	grep -qE '^custom +64k +1k +1 +125m ' "$work/$name-server.log" ||
		fail "$name: no result line in the server output"
	# The client's rsocket calls were bound to librstream.so, not to librdmacm.
	local sym
	for sym in rsocket rconnect rsend rrecv rpoll rclose; do
		grep -hqE "to ${lib//./\\.} \[[0-9]+\]: normal symbol \`$sym'" "$work"/ld.* ||
			fail "$name: $sym was not bound to librstream.so"
	done
	echo "$name: $(grep -E '^custom' "$work/$name-client.log")"
}

run_pair nonblocking -T v
run_pair blocking -T b -T v
run_pair async -T a -T v
echo "PASS"
