#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# An inetd-style server under the shim: socat accepts, forks and execs sha256sum on the
# connection; a shimmed socat client sends 1 MiB, half-closes and reads the hash back, three
# times, and the statistics show that the fabric carried the data both ways.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
need socat sha256sum
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

# Each client: one connection, on the fabric, the 1 MiB out and the hash line (68 bytes) in.
for i in $(seq "$connections"); do
	expect_fabric "client$i" 1
	v=$(stat_sum "client$i" fabric_bytes_sent)
	[ "$v" -ge "$size" ] || fail "client $i sent only $v bytes over the fabric"
	v=$(stat_sum "client$i" fabric_bytes_received)
	[ "$v" -ge 68 ] || fail "client $i received only $v bytes over the fabric"
done
# The server's processes together (the socat that accepts, the sha256sum that reads and
# answers): every connection on the fabric, and each byte whole: sha256sum reads to the end of
# its input and the client to the end of the answer.
expect_fabric server "$connections"
sent=0 received=0
for i in $(seq "$connections"); do
	sent=$((sent + $(stat_sum "client$i" fabric_bytes_sent)))
	received=$((received + $(stat_sum "client$i" fabric_bytes_received)))
done
v=$(stat_sum server fabric_bytes_received)
[ "$v" -eq "$sent" ] || fail "server: received $v bytes over the fabric, the clients sent $sent"
v=$(stat_sum server fabric_bytes_sent)
[ "$v" -eq "$received" ] ||
	fail "server: sent $v bytes over the fabric, the clients received $received"
echo PASS
