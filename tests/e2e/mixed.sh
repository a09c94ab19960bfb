#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Peers with and without the shim: a shimmed iperf3 client to a plain server and a plain client
# to a shimmed server both work, over kernel TCP, and the shimmed side counts fallbacks only.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need iperf3
secs=${E2E_MIXED_SECONDS:-1}
limit=$((secs + 30))

# run NAME SERVER_KIND CLIENT_KIND: iperf3 with each side "shim" or "plain".
run() {
	local name=$1 skind=$2 ckind=$3 rc=0 fabric=0 t0 sum
	local -a server=(plain "$limit") client=(plain "$limit")
	if [ "$skind" = shim ]; then
		server=(shim "$name-server" "$limit")
		fabric=1
	fi
	[ "$ckind" = shim ] && client=(shim "$name-client" "$limit")
	start_server "$name-server" "$fabric" "${server[@]}" iperf3 -s -1 -p @PORT@
	t0=$(date +%s%N)
	"${client[@]}" iperf3 -c 127.0.0.1 -p "$port" -t "$secs" -f m \
		>"$work/$name-client.log" 2>&1 || rc=$?
	[ "$rc" -eq 0 ] || fail "$name: iperf3 client exited with $rc"
	finish "$server_pid" || rc=$?
	[ "$rc" -eq 0 ] || fail "$name: iperf3 server exited with $rc"
	sum=$(grep -E 'receiver$' "$work/$name-client.log" | tail -n 1)
	[ -n "$sum" ] || fail "$name: no receiver summary"
	log "$name: client ran $(( ($(date +%s%N) - t0) / 1000000 )) ms: $sum"
}

# The fabric connect is refused at once (nothing listens on the fabric port): the client falls
# back for the control connection, and the negative cache sends the data connection straight to
# the kernel.
run shim-to-plain plain shim
expect_kernel shim-to-plain-client 2
[ "$(stat_sum shim-to-plain-client fabric_listeners)" -eq 0 ] || fail "the client listened"

run plain-to-shim shim plain
expect_kernel plain-to-shim-server 2
[ "$(stat_sum plain-to-shim-server fabric_listeners)" -eq 1 ] ||
	fail "the shimmed server had no fabric listener"
echo PASS
