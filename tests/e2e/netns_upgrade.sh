#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Two hosts (network namespaces joined by veth), both ends under the shim: a client of the
# other host's shimmed echo server finds its fabric listener with the light probe, learns from
# its defer answer that it runs the shim, offers the upgrade and switches to the fabric
# mid-stream, every byte intact; a client of a plain server there is refused by the light
# probe and never loads libfabric.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source-path=SCRIPTDIR source=../lib/netns.sh
. "$(dirname "$0")/../lib/netns.sh"
need python3 ip
trap 'netns_teardown; e2e_cleanup' EXIT
netns_setup
log "hosts $ADDR_A ($NS_A) and $ADDR_B ($NS_B)"

echo_server=$(dirname "$0")/echo_server.py
paced=$(dirname "$0")/paced_echo.py

port=5501
start server shim server 60 ip netns exec "$NS_A" python3 "$echo_server" "$ADDR_A" "$port"
server_pid=$last_pid
for _ in $(seq 100); do
	ip netns exec "$NS_A" ss -Hltn "sport = :$((port + E2E_OFFSET))" 2>/dev/null | grep -q . &&
		break
	sleep 0.1
done
ip netns exec "$NS_A" ss -Hltn "sport = :$((port + E2E_OFFSET))" | grep -q . ||
	fail "the server's fabric listener is not up"
out=$(shim client 60 ip netns exec "$NS_B" python3 "$paced" "$ADDR_A" "$port" 2.5) ||
	fail "the client failed: $out"
printf "    %s\n" "${out//$'\n'/$'\n    '}"
grep -qx "echo intact" <<<"$out" || fail "the echo differs"
expect_fabric client 1
[ "$(stat_sum client fabric_bytes_received)" -ge 262144 ] ||
	fail "client: less than a quarter of the echo came over the fabric"
stop_pid "$server_pid" || true
expect_fabric server 1
log "shimmed server on the other host: offered after its defer answer, switched, intact"

start plain plain 60 ip netns exec "$NS_A" python3 "$echo_server" "$ADDR_A" "$port"
plain_pid=$last_pid
sleep 0.5
out=$(shim client2 60 ip netns exec "$NS_B" python3 "$paced" "$ADDR_A" "$port" 0.1) ||
	fail "the client of the plain server failed: $out"
printf "    %s\n" "${out//$'\n'/$'\n    '}"
grep -qx "echo intact" <<<"$out" || fail "the plain server's echo differs"
grep -qx "libfabric absent" <<<"$out" || fail "the client of a plain server loaded libfabric"
grep -q '"refused": 1' "$work"/stats/client2.*.json || fail "client2: not refused"
stop_pid "$plain_pid" || true
log "plain server on the other host: refused by the light probe, no libfabric"
echo PASS
