#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# An end that closes in the middle of the switch to the fabric (late_close.py). The client
# closes after its token, before the server's ack: the server counted that connection as not
# upgraded, the client as over before its switch. The server acks, writes and closes before
# the client's count: the client's count found the fabric connection closed, and the client
# stayed on kernel TCP, losing the server's last bytes, which were on the fabric.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3
prog="$(dirname "$0")/late_close.py"

for mode in client-closes server-closes; do
	rm -f "$work/token-sent" "$work/server-closed"
	start_server "server-$mode" 1 shim "server-$mode" 60 python3 "$prog" server @PORT@ "$work" \
		"$mode"
	out=$(shim "client-$mode" 60 env RSTREAM_LOG=debug RSTREAM_LOG_FILE="$work/client-$mode.rs" \
		python3 "$prog" client "$port" "$work" "$mode" "$work/client-$mode.rs" 2>&1) ||
		fail "$mode: the client failed: $(tail -n 3 <<<"$out")"
	log "$mode: $out"
	finish "$server_pid" || fail "$mode: the server failed: $(tail -n 3 "$work/server-$mode.log")"
	log "$mode: $(tail -n 1 "$work/server-$mode.log")"
	have_stats "server-$mode"
	have_stats "client-$mode"
	for role in server client; do
		nu=$(stat_sum "$role-$mode" not_upgraded)
		bs=$(stat_sum "$role-$mode" before_switch)
		fc=$(stat_sum "$role-$mode" fabric_connections)
		log "$mode: $role: $fc switched, $bs over before the switch, $nu not upgraded"
		[ "$nu" -eq 0 ] || fail "$mode: $role: counted as not upgraded"
		if [ "$mode" = client-closes ]; then
			[ "$bs" -eq 1 ] || fail "$mode: $role: not counted as over before its switch"
		else
			[ "$fc" -eq 1 ] || fail "$mode: $role: not counted as switched"
		fi
	done
done
echo PASS
