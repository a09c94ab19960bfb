#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# sockperf ping-pong and throughput over TCP, server and clients under the shim on 127.0.0.1:
# both runs must complete and the statistics must show fabric connections only.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need sockperf
secs=${E2E_SOCKPERF_SECONDS:-3}
limit=$((secs + 30))

start_server server 1 shim server $((3 * limit)) sockperf sr --tcp -p @PORT@
rc=0
shim pp "$limit" sockperf pp --tcp -i 127.0.0.1 -p "$port" -t "$secs" >"$work/pp.log" 2>&1 ||
	rc=$?
[ "$rc" -eq 0 ] || fail "sockperf pp exited with $rc"
grep -q 'Summary: Latency is' "$work/pp.log" || fail "sockperf pp printed no latency summary"
log "pp: $(grep -m1 'Summary: Latency is' "$work/pp.log" | sed 's/.*Summary: //')"
log "pp: $(grep -m1 -E 'percentile 50\.000' "$work/pp.log" | sed 's/^sockperf: *//')"
shim tp "$limit" sockperf tp --tcp -i 127.0.0.1 -p "$port" -t "$secs" >"$work/tp.log" 2>&1 ||
	rc=$?
[ "$rc" -eq 0 ] || fail "sockperf tp exited with $rc"
grep -q 'Summary: BandWidth is' "$work/tp.log" || fail "sockperf tp printed no bandwidth summary"
log "tp: $(grep -m1 'Summary: Message Rate is' "$work/tp.log" | sed 's/.*Summary: //')"
log "tp: $(grep -m1 'Summary: BandWidth is' "$work/tp.log" | sed 's/.*Summary: //')"
sleep 0.5
# sockperf stops on SIGINT, and exits through exit() (which writes the statistics); SIGTERM
# kills it.
stop_pid "$server_pid" INT || true
grep -qi 'error' "$work/server.log" && fail "the sockperf server reported an error"
expect_fabric pp 1
# tp only sends: the server answers nothing unless asked.
expect_fabric tp 1 0 sent
expect_fabric server 2
echo PASS
