#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rstream-perf's rr modes run end to end on kernel sockets and plain libfabric (a CQ per
# connection and one shared CQ): each client run reports a positive rate and the fields it was
# given, a paced run (--rate) the rate it was given, SIGINT ends either server, and a bad
# argument is a usage error.
# Usage: perf_rr.sh RSTREAM_PERF
set -euo pipefail
perf=${1:?usage: $0 RSTREAM_PERF}
# shellcheck source-path=SCRIPTDIR source=../lib/fail.sh
. "$(dirname "$0")/../lib/fail.sh"
# shellcheck source-path=SCRIPTDIR source=../lib/ports.sh
. "$(dirname "$0")/../lib/ports.sh"
work=$(mktemp -d)
server=
stop_server() {
	if [ -n "$server" ]; then
		kill "$server" 2>/dev/null || true
		wait "$server" 2>/dev/null || true
		server=
	fi
}
cleanup() {
	stop_server
	rm -rf "$work"
}
trap cleanup EXIT
export RSTREAM_PROVIDER=${RSTREAM_PROVIDER:-tcp}

# run TRANSPORT CQ [RATE]: an rr-server and one rr-client run against it; CQ is none for
# kernel. With RATE the client paces its requests (--rate), and its rate must be that rate.
run() {
	local transport=$1 cq=$2 rate=${3:-} port cqarg=() ratearg=()
	[ "$cq" = none ] || cqarg=(--cq "$cq")
	[ -z "$rate" ] || ratearg=(--rate "$rate")
	port=$(pick_port 0) || fail "no free port"
	"$perf" rr-server --port "$port" --bind 127.0.0.1 --transport "$transport" "${cqarg[@]}" \
		>"$work/server.$transport.$cq.log" 2>&1 &
	server=$!
	for _ in $(seq 200); do
		port_listening "$port" && break
		kill -0 "$server" 2>/dev/null || fail "the $transport server exited"
		sleep 0.05
	done
	port_listening "$port" || fail "the $transport server did not listen on $port"
	timeout 30 "$perf" rr-client 127.0.0.1 --port "$port" --transport "$transport" \
		"${cqarg[@]}" --conns 8 --size 64 --seconds 1 "${ratearg[@]}" \
		>"$work/client.$transport.$cq.log" 2>&1 || fail "the $transport client failed (cq $cq)"
	# SIGINT ends either server, as a background job of a script, which starts with SIGINT
	# ignored: the kernel server's own handler ends it with a normal exit (under the shim: its
	# statistics), the raw server takes the signal's default action.
	kill -INT "$server"
	for _ in $(seq 100); do
		kill -0 "$server" 2>/dev/null || break
		sleep 0.05
	done
	kill -0 "$server" 2>/dev/null && fail "the $transport server did not end on SIGINT"
	local status=0
	wait "$server" || status=$?
	server=
	if [ "$transport" = kernel ]; then
		[ "$status" -eq 0 ] || fail "the kernel server exited with $status on SIGINT"
	fi
	local json
	json=$(tail -n 1 "$work/client.$transport.$cq.log")
	echo "$json"
	local want="{\"transport\":\"$transport\",\"test\":\"rr\",\"cq\":\"$cq\",\"conns\":8,\"size\":64,"
	[ "${json#"$want"}" != "$json" ] || fail "unexpected fields: $json"
	[[ $json =~ \"rps\":([0-9]+(\.[0-9]+)?), ]] || fail "no rps: $json"
	awk -v r="${BASH_REMATCH[1]}" 'BEGIN { exit !(r > 0) }' || fail "rps not positive: $json"
	[[ $json =~ \"p50_us\":[0-9.]+,\"p99_us\":[0-9.]+,\"requests\":([0-9]+)\}$ ]] ||
		fail "no percentiles or requests: $json"
	[ "${BASH_REMATCH[1]}" -gt 0 ] || fail "no requests: $json"
	if [ -n "$rate" ]; then
		# A closed loop makes thousands a second here: only the pace holds it near RATE.
		[[ $json =~ \"rps\":([0-9.]+), ]]
		awk -v r="${BASH_REMATCH[1]}" -v want="$rate" 'BEGIN { exit !(r > want * 0.8 && r < want * 1.05) }' ||
			fail "paced at $rate a second, it made $json"
	fi
}
run kernel none
run raw own
run raw shared
run kernel none 400
run raw own 400

# A bad argument is refused before anything starts: exit status 2 and a usage message.
status=0
"$perf" rr-client 127.0.0.1 --transport kernel --conns 0 --size 64 --seconds 1 \
	>"$work/usage.log" 2>&1 || status=$?
[ "$status" -eq 2 ] || fail "--conns 0 exited with $status, not 2"
grep -q "bad conns '0'" "$work/usage.log" || fail "--conns 0: no usage message"
status=0
"$perf" rr-client 127.0.0.1 --transport kernel --conns 1 --size 64 --seconds 1 --rate 0 \
	>"$work/usage.log" 2>&1 || status=$?
[ "$status" -eq 2 ] || fail "--rate 0 exited with $status, not 2"
grep -q "bad rate '0'" "$work/usage.log" || fail "--rate 0: no usage message"
echo PASS
