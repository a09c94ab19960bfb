#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Connections handed to another process before any I/O, both ends shimmed: across fork and
# across exec (socket-activation style, descriptor 3) each is upgraded by the process that
# serves it and switches to the fabric mid-stream, and the statistics show the fabric carried
# the data both ways after the switch, byte for byte on both ends; an inetd-style
# server (socat EXEC:sha256sum, the connection on standard input and output, read by stdio
# past the shim) keeps it on kernel TCP and every byte intact.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need socat sha256sum python3
handoff=$(dirname "$0")/handoff_server.py
size=1048576
connections=3

# fork: a child per connection; nofork: the child execs sha256sum with the accepted socket as
# its standard input and output. sha256sum inherits socat's environment, shim included, so its
# statistics are the server's too (server.<pid>.json).
start_server server 1 shim server 50 socat TCP-LISTEN:@PORT@,bind=127.0.0.1,reuseaddr,fork \
	EXEC:sha256sum,nofork

for i in $(seq "$connections"); do
	head -c "$size" /dev/urandom >"$work/data$i"
	want=$(sha256sum <"$work/data$i")
	t0=$(date +%s%N)
	# At the end of the data, shut-down half-closes (so that sha256sum sees its end of input)
	# and -t keeps reading up to 10 s for the answer, where the default is 0.5 s.
	shim "client$i" 30 socat -t 10 - "TCP:127.0.0.1:$port,shut-down" <"$work/data$i" \
		>"$work/answer$i" 2>"$work/client$i.log" || fail "client $i: socat failed"
	ms=$((($(date +%s%N) - t0) / 1000000))
	got=$(cat "$work/answer$i")
	[ "$got" = "$want" ] || fail "client $i: the answer is '$got', expected '$want'"
	log "client $i: 1 MiB hashed by the server in $ms ms"
done

# socat exits on TERM (status 143); its children ended with their connections.
kill -0 "$server_pid" 2>/dev/null || fail "the server exited"
stop_pid "$server_pid" || true

# Each client: one connection, on kernel TCP: sha256sum's stdio reads would not see the
# fabric, so its start declined the client's offer (not_upgraded).
for i in $(seq "$connections"); do
	expect_kernel "client$i" 1
	grep -q '"not_upgraded": 1' "$work/stats/client$i".*.json ||
		fail "client $i: not declined as an offer"
done

# fork and exec: an echo served by a child, or by the program the child execs.
for mode in fork exec; do
	start_server "h$mode" 1 shim "h$mode" 50 python3 "$handoff" "$mode" @PORT@
	# The clients at once, each served by its own child: 1 MiB over 2.5 s, so that the
	# connection switches to the fabric on the way (its process loads libfabric meanwhile).
	t0=$(date +%s%N)
	pids=()
	for i in $(seq "$connections"); do
		start "c$mode$i-out" shim "c$mode$i" 30 python3 "$(dirname "$0")/paced_echo.py" \
			127.0.0.1 "$port" 2.5
		pids+=("$last_pid")
	done
	for i in $(seq "$connections"); do
		finish "${pids[$((i - 1))]}" || fail "$mode client $i failed: $(tail -n 3 "$work/c$mode$i-out.log")"
		grep -qx "echo intact" "$work/c$mode$i-out.log" || fail "$mode client $i: the echo differs"
	done
	log "$mode: $connections clients, 1 MiB each echoed, in $((($(date +%s%N) - t0) / 1000000)) ms"
	# The children write their statistics as they exit, just after their client saw the end
	# (stopping the server first would stop them too).
	for _ in $(seq 50); do
		[ "$(stat_sum "h$mode" fabric_connections)" -ge "$connections" ] && break
		sleep 0.1
	done
	stop_pid "$server_pid" || true
	sent=0 received=0
	for i in $(seq "$connections"); do
		expect_fabric "c$mode$i" 1
		v=$(stat_sum "c$mode$i" fabric_bytes_received)
		# A good part of it after the switch (the first pieces go before it, more of them on
		# a loaded machine, where libfabric takes longer to load).
		[ "$v" -ge $((size / 4)) ] || fail "$mode client $i received $v bytes over the fabric"
		sent=$((sent + $(stat_sum "c$mode$i" fabric_bytes_sent)))
		received=$((received + v))
	done
	# The processes that served them (the children, or the programs they exec'd): every byte
	# the clients sent, and echoed, on the fabric.
	expect_fabric "h$mode" "$connections"
	v=$(stat_sum "h$mode" fabric_bytes_received)
	[ "$v" -eq "$sent" ] || fail "$mode server: received $v bytes over the fabric, the clients sent $sent"
	v=$(stat_sum "h$mode" fabric_bytes_sent)
	[ "$v" -eq "$received" ] || fail "$mode server: sent $v bytes over the fabric, the clients received $received"
done
echo PASS
