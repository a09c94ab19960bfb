#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A process's first socket is a nonblocking connect: connect() returns at once although
# libfabric is not loaded yet, and the short exchange that follows never waits for it: over
# kernel TCP, ended before its switch to the fabric (the server is under the shim, reason
# before_switch), or fallen back after the light probe (it is not, reason refused).
# Usage: nbconnect.sh PROGRAM PRELOAD_LIB
set -euo pipefail
prog=$1
lib=$2
export RSTREAM_PROVIDER=${RSTREAM_PROVIDER:-tcp}
unset RSTREAM_PORT_OFFSET RSTREAM_PORTS RSTREAM_EXCLUDE RSTREAM_ENABLE RSTREAM_STATS LD_PRELOAD
offset=20000 # the shim's default fabric port offset on tcp

work=$(mktemp -d)
server=
cleanup() {
	[ -z "$server" ] || kill -KILL "$server" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source-path=SCRIPTDIR source=../lib/fail.sh
. "$(dirname "$0")/../lib/fail.sh"

# shellcheck source-path=SCRIPTDIR source=../lib/ports.sh
. "$(dirname "$0")/../lib/ports.sh"

# run_case NAME SHIMMED_SERVER(0|1) WAIT(poll|epoll|spin|blocking) REASON
run_case() {
	local name=$1 shimmed=$2 how=$3 reason=$4 port stats
	port=$(pick_port "$offset" 20001) || fail "no free port"
	if [ "$shimmed" = 1 ]; then
		env LD_PRELOAD="$lib" "$prog" server "$port" >"$work/server.log" 2>&1 &
	else
		"$prog" server "$port" >"$work/server.log" 2>&1 &
	fi
	server=$!
	for _ in $(seq 400); do
		grep -q ready "$work/server.log" 2>/dev/null && break
		kill -0 "$server" 2>/dev/null || fail "$name: the server ended early"
		sleep 0.05
	done
	if [ "$shimmed" = 1 ]; then
		for _ in $(seq 200); do
			port_listening $((port + offset)) && break
			sleep 0.05
		done
	fi
	timeout 60 env RSTREAM_STATS="$work/client.json" LD_PRELOAD="$lib" "$prog" client "$port" \
		"$how" >"$work/client.log" 2>&1 || fail "$name: the client failed"
	wait "$server" || fail "$name: the server failed"
	server=
	echo "$name:"
	sed 's/^/  /' "$work/client.log"
	stats=$(cat "$work/client.json")
	echo "  stats: $stats"
	grep -q '"fabric_connections": 0,' <<<"$stats" || fail "$name: expected no fabric connection"
	grep -q '"fallback_connections": 1,' <<<"$stats" || fail "$name: expected 1 fallback"
	grep -q "\"$reason\": 1" <<<"$stats" || fail "$name: expected reason $reason"
	rm -f "$work"/*.log "$work/client.json"
}

run_case "shimmed server, poll" 1 poll before_switch
run_case "shimmed server, epoll" 1 epoll before_switch
run_case "shimmed server, poll(0) until writable" 1 spin before_switch
run_case "shimmed server, blocking send and recv" 1 blocking before_switch
run_case "kernel TCP fallback, poll" 0 poll refused
run_case "kernel TCP fallback, epoll" 0 epoll refused
run_case "kernel TCP fallback, poll(0) until writable" 0 spin refused
run_case "kernel TCP fallback, blocking send and recv" 0 blocking refused
