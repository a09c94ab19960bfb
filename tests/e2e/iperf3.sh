#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# iperf3 server and client both under the shim on 127.0.0.1 (one stream, then -P 4): the
# statistics must show that every test connection went over the fabric.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need iperf3
secs=${E2E_IPERF_SECONDS:-3}
limit=$((secs + 30))

# iperf3 opens a control connection and then one per stream.
run() {
	local name=$1 streams=$2 rc=0 sum
	start_server "$name-server" 1 shim "$name-server" "$limit" iperf3 -s -1 -p @PORT@
	shim "$name-client" "$limit" iperf3 -c 127.0.0.1 -p "$port" -t "$secs" -P "$streams" \
		-f m >"$work/$name-client.log" 2>&1 || rc=$?
	[ "$rc" -eq 0 ] || fail "$name: iperf3 client exited with $rc"
	finish "$server_pid" || rc=$?
	[ "$rc" -eq 0 ] || fail "$name: iperf3 server exited with $rc"
	sum=$(grep -E 'receiver$' "$work/$name-client.log" | tail -n 1)
	[ -n "$sum" ] || fail "$name: no receiver summary"
	log "$name: $sum"
	expect_fabric "$name-client" $((streams + 1))
	expect_fabric "$name-server" $((streams + 1))
}

run single 1
run parallel 4
echo PASS
