#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Readiness stays exact through the upgrade and the mid-stream switch: a shimmed event-loop
# client (epoll level-triggered, then poll) against a shimmed event-loop server, 60 connections
# opened over the run, request and reply of random sizes; a read after readiness or after
# FIONREAD > 0 must never say EAGAIN (wrk counts that as an error), and every reply must match.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need python3
prog="$(dirname "$0")/strict_readiness.py"

for mode in epoll poll; do
	start_server "server-$mode" 1 shim "server-$mode" 60 python3 "$prog" server 127.0.0.1 @PORT@ "$mode"
	out=$(shim "client-$mode" 90 python3 "$prog" client 127.0.0.1 "$port" "$mode" 60 2.5) ||
		fail "the $mode client failed: $out"
	printf "    %s: %s\n" "$mode" "${out//$'\n'/; }"
	grep -qx "errors 0" <<<"$out" || fail "$mode: the client saw errors"
	stop_pid "$server_pid" || true
	! grep -q "server:" "$work/server-$mode.log" || fail "$mode: the server saw errors: $(grep server: "$work/server-$mode.log" | head -5)"
	expect_fabric "client-$mode" 1
	expect_no_fallback "client-$mode"
	log "$mode: $(stat_sum "client-$mode" fabric_connections) connections switched, $(stat_sum "client-$mode" before_switch) over before their switch"
done
echo PASS
