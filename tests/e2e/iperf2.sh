#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# iperf (version 2) server and client both under the shim on 127.0.0.1 with four parallel
# streams: the statistics must show that every stream went over the fabric.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need iperf
secs=${E2E_IPERF_SECONDS:-3}
limit=$((secs + 30))
streams=4

start_server server 1 shim server "$limit" iperf -s -p @PORT@
rc=0
shim client "$limit" iperf -c 127.0.0.1 -p "$port" -P "$streams" -t "$secs" -f m \
	>"$work/client.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "iperf client exited with $rc"
sum=$(grep -E '\[SUM\]' "$work/client.log" | tail -n 1)
[ -n "$sum" ] || fail "no [SUM] line in the client output"
log "client: $sum"
# The server runs until it is told to stop; it writes its statistics when it exits.
sleep 0.5
stop_pid "$server_pid" || true
# iperf's streams only go one way (its small header back to the client goes before the switch).
expect_fabric client "$streams" 0 sent
expect_fabric server "$streams" 0 received
echo PASS
