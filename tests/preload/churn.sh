#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# churn: many clients under one epoll loop, closed and replaced the way redis-benchmark does
# between its tests, get every reply right and never stall: each connection offers the in-band
# upgrade and is over (a few requests) before its switch to the fabric, so this churns the
# upgrade's offer, answer and counting on every connection.
# signals: SIGINT and SIGTERM do to a program under the shim, or using librstream.so, what they
# do without it, also in the middle of fabric traffic. libinfinipath (loaded with libfabric)
# installs handlers that exit() from the signal handler: the program then exited with status 1,
# or hung in libfabric's destructor waiting for a lock the interrupted code held.
# Usage: churn.sh churn|signals CHURN_PROG PRELOAD_LIB LIBRSTREAM RSTREAM_RUN
set -euo pipefail
mode=$1
prog=$2
lib=$3
librstream=$4
run=$5
export RSTREAM_PROVIDER=${RSTREAM_PROVIDER:-tcp}
unset RSTREAM_PORT_OFFSET RSTREAM_PORTS RSTREAM_EXCLUDE RSTREAM_ENABLE RSTREAM_STATS LD_PRELOAD \
	IPATH_NO_BACKTRACE
offset=20000 # the shim's default fabric port offset on tcp

work=$(mktemp -d)
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source-path=SCRIPTDIR source=../lib/fail.sh
. "$(dirname "$0")/../lib/fail.sh"

# port_listening and pick_port.
# shellcheck source-path=SCRIPTDIR source=../lib/ports.sh
. "$(dirname "$0")/../lib/ports.sh"

# The churn server under the shim, on a port whose fabric port is free too; sets port, server.
start_server() {
	for _ in 1 2 3 4 5; do
		# Up to 200 random ports a try: one, as before, was in use (or its fabric port, among
		# earlier tests' TIME-WAIT client ports) in five tries of a clean-clone run.
		port=$(pick_port "$offset" 20001) || continue
		"$run" --lib "$lib" --stats "$work/server.%p.json" -- "$prog" server "$port" \
			"$work/port" >"$work/server.log" 2>&1 &
		server=$!
		pids+=("$server")
		for _ in $(seq 200); do
			kill -0 "$server" 2>/dev/null || break
			if port_listening "$port" && port_listening $((port + offset)); then
				return 0
			fi
			sleep 0.05
		done
		kill -KILL "$server" 2>/dev/null || true
		wait "$server" 2>/dev/null || true
	done
	fail "the server did not listen"
}

# ends PID SECONDS: waits that long at most for PID to end; sets rc to its exit status.
ends() {
	local i
	for i in $(seq $(($2 * 20))); do
		if ! kill -0 "$1" 2>/dev/null; then
			rc=0
			wait "$1" || rc=$?
			return 0
		fi
		sleep 0.05
	done
	return 1
}

# ready LOG PID: waits until the program printed "ready" (its libraries are loaded, their
# constructors and ours have run).
ready() {
	for _ in $(seq 400); do
		grep -q ready "$1" 2>/dev/null && return 0
		kill -0 "$2" 2>/dev/null || fail "$1: the program ended early"
		sleep 0.05
	done
	fail "$1: not ready after 20 s"
}

# expect_signal NAME SIG PID: PID, sent SIG, dies of it within 5 s.
expect_signal() {
	local name=$1 sig=$2 pid=$3 want
	want=$((128 + $(kill -l "$sig")))
	kill -s "$sig" "$pid"
	ends "$pid" 5 || fail "$name: still running 5 s after SIG$sig (hung)"
	[ "$rc" -eq "$want" ] || fail "$name: exit status $rc after SIG$sig, expected $want"
	echo "$name: died of SIG$sig"
}

case $mode in
churn)
	start_server
	echo "server on port $port (fabric port $((port + offset)))"
	timeout 90 "$run" --lib "$lib" --stats "$work/client.%p.json" -- "$prog" client "$port" 6 \
		>"$work/client.log" 2>&1 || fail "the client failed"
	cat "$work/client.log"
	stats=$(cat "$work"/client.*.json)
	echo "client: $stats"
	n=$(sed -n 's/.*"fallback_connections": *\([0-9]*\).*/\1/p' <<<"$stats")
	b=$(sed -n 's/.*"before_switch": *\([0-9]*\).*/\1/p' <<<"$stats")
	[ "${n:-0}" -ge 200 ] || fail "only ${n:-0} connections"
	[ "$n" = "$b" ] || fail "connections fell back to TCP ($n, $b of them before their switch)"
	expect_signal server TERM "$server"
	;;
signals)
	# Straight from the environment (no rstream-run): the default actions.
	# A log per program: the redirection truncates its file in the child, after the shell went
	# on, so a shared one still said "ready" from the program before, and the signal could come
	# while the new one still ignored SIGINT (as the shell's background children do until
	# env's --default-signal).
	for preload in "$lib" "$librstream"; do
		for sig in INT TERM; do
			name="$(basename "$preload") SIG$sig"
			plog="$work/pause-$(basename "$preload")-$sig.log"
			env --default-signal=INT LD_PRELOAD="$preload" "$prog" pause >"$plog" 2>&1 &
			pid=$!
			pids+=("$pid")
			ready "$plog" "$pid"
			expect_signal "$name" "$sig" "$pid"
		done
	done
	# An ignored SIGINT stays ignored, through rstream-run and straight from the environment,
	# once libfabric is loaded too (the program listens under the shim).
	for how in rstream-run LD_PRELOAD; do
		# A port whose fabric port is free too (an ephemeral one's may be taken: then the
		# listener is kernel TCP only and libfabric is never loaded).
		pport=$(pick_port "$offset") || fail "no free port"
		if [ "$how" = rstream-run ]; then
			env --ignore-signal=INT "$run" --lib "$lib" -- "$prog" pause "$pport" \
				>"$work/ignored-$how.log" 2>&1 &
		else
			env --ignore-signal=INT LD_PRELOAD="$lib" "$prog" pause "$pport" \
				>"$work/ignored-$how.log" 2>&1 &
		fi
		pid=$!
		pids+=("$pid")
		ready "$work/ignored-$how.log" "$pid"
		grep -q libfabric "/proc/$pid/maps" || fail "$how: libfabric is not loaded after listen()"
		kill -INT "$pid"
		sleep 0.5
		kill -0 "$pid" 2>/dev/null || fail "$how: an ignored SIGINT ended the program"
		echo "$how, ignored SIGINT: still running"
		expect_signal "$how, ignored SIGINT, then" TERM "$pid"
	done
	# A program that makes no socket does not load libfabric (nor wait for its libraries).
	maps=$(LD_PRELOAD="$lib" cat /proc/self/maps)
	grep -q librstream_preload <<<"$maps" || fail "the shim is not loaded into cat"
	! grep -q libfabric <<<"$maps" || fail "libfabric is loaded into a program without sockets"
	echo "no sockets: libfabric not loaded"
	# In the middle of connection churn over the fabric.
	start_server
	for i in 1 2 3 4; do
		"$run" --lib "$lib" -- "$prog" client "$port" 60 >"$work/client.log" 2>&1 &
		pid=$!
		pids+=("$pid")
		sleep "1.$((RANDOM % 10))"
		kill -0 "$pid" 2>/dev/null || fail "client $i ended early"
		expect_signal "client $i during churn" TERM "$pid"
	done
	expect_signal server TERM "$server"
	;;
*)
	echo "usage: $0 churn|signals CHURN_PROG PRELOAD_LIB LIBRSTREAM RSTREAM_RUN" >&2
	exit 2
	;;
esac
echo PASS
